/* SPDX-License-Identifier: MIT */
/*
 * cuda_unit.h -- for the tests that generate CUDA units or plans without a
 * GPU (test_codegen_cuda_*.c, test_fusion_*.c): compile a unit's text with
 * NVRTC for sm_90 and say whether it built; the CUDA backend's fusion
 * options. Include after graphs/graphs.h.
 */
#ifndef SG_TESTS_CUDA_UNIT_H
#define SG_TESTS_CUDA_UNIT_H

#include "graphs/cuda/exec.h"

/*
 * true when src compiles (or when NVRTC is missing: *missing is then set,
 * said once, and later calls compile nothing); false, with the compiler's
 * message on stderr, when it does not. Leaves ctx's error cleared.
 */
static inline bool cu_unit_compiles(sg_ctx *ctx, const char *name, const char *src,
                                    bool *missing) {
    if (*missing) return true;
    void *cubin = NULL;
    size_t size = 0;
    bool ok = true;
    sg_status s = sg__nvrtc_build(ctx, name, src, 90, &cubin, &size);
    if (s == SG_ERR_BACKEND_UNAVAILABLE) {
        *missing = true;
        fprintf(stderr, "  NVRTC unavailable: units are generated but not compiled\n");
    } else {
        ok = TU_EXPECT(s == SG_OK && cubin && size > 0);
        if (!ok) fprintf(stderr, "  %s\n", sg_last_error(ctx));
    }
    sg__free(ctx, cubin, size);
    sg_clear_error(ctx);
    return ok;
}

/* The options the CUDA backend's compiled steps fuse with (its graph ops'
 * fuse_opts), or false in a build without the CUDA backend. */
static inline bool cu_fuse_opts(sg__fuse_opts *o) {
    if (!sg__cuda_graph_ops.fuse_opts) return false;
    sg__cuda_graph_ops.fuse_opts(o, false);
    return true;
}

#endif
