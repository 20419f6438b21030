/* SPDX-License-Identifier: MIT */
/*
 * nvrtc_opts.h -- the options every NVRTC compile of this library takes
 * besides the architecture: the run-time compiles (nvrtc.c) and the build's
 * prebuilt kernel families (tools/sg_cubins.c) give the same images.
 */
#ifndef SG_NVRTC_OPTS_H
#define SG_NVRTC_OPTS_H

#define SG_NVRTC_OPTS "--std=c++17", "--fmad=false", "-default-device"

#endif
