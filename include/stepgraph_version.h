/* SPDX-License-Identifier: MIT */
/*
 * stepgraph_version.h -- the version of stepgraph, in one place: the build
 * (CMakeLists.txt reads it for the project version, the shared library's
 * version and the package files) and the library (sg_version) take it from
 * here. Compare SG_VERSION_NUMBER at compile time and sg_version() at run
 * time to notice a header that does not match the library.
 */
#ifndef STEPGRAPH_VERSION_H
#define STEPGRAPH_VERSION_H

#define SG_VERSION_MAJOR 0
#define SG_VERSION_MINOR 2
#define SG_VERSION_PATCH 0
#define SG_VERSION_STRING "0.2.0"
/* MAJOR * 10000 + MINOR * 100 + PATCH */
#define SG_VERSION_NUMBER (SG_VERSION_MAJOR * 10000 + SG_VERSION_MINOR * 100 + SG_VERSION_PATCH)

#endif /* STEPGRAPH_VERSION_H */
