/* SPDX-License-Identifier: MIT */
/*
 * test_graphs_cuda_unavailable.c -- a machine without a CUDA driver (made
 * here by pointing the loader at a library that does not exist): asking
 * for CUDA is SG_ERR_BACKEND_UNAVAILABLE with a message that names the
 * driver and the fix, AUTO picks the CPU, and the CPU context works.
 */
#define _POSIX_C_SOURCE 200809L
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

int main(void) {
    setenv("SG_CUDA_DRIVER", "/nonexistent/libcuda.so.1", 1);
    sg_ctx *ctx = NULL;
    sg_status s = sg_ctx_create(&(sg_ctx_opts){.backend = SG_BACKEND_CUDA}, &ctx);
    const char *m = sg_last_error(NULL);
    bool ok = TU_EXPECT(s == SG_ERR_BACKEND_UNAVAILABLE) && TU_EXPECT(ctx == NULL) &&
              TU_EXPECT(strstr(m, "cuda") != NULL) &&
              TU_EXPECT(strstr(m, "libcuda") != NULL || strstr(m, "without the CUDA") != NULL) &&
              TU_EXPECT(strstr(m, "SG_BACKEND_") != NULL);
    tu_case(ok, "backend=cuda without a driver -> SG_ERR_BACKEND_UNAVAILABLE (\"%s\")", m);

    setenv("SG_BACKEND", "cuda", 1);
    s = sg_ctx_create(&(sg_ctx_opts){.backend = SG_BACKEND_AUTO}, &ctx);
    ok = TU_EXPECT(s == SG_OK) && TU_EXPECT(ctx && sg_ctx_backend(ctx) == SG_BACKEND_CPU);
    tu_case(ok, "backend=auto without a driver -> the CPU");
    if (ctx) {
        int64_t shape[1] = {5};
        double *xv;
        sg_tensor *x = tu_rand(ctx, SG_F32, 1, shape, -1, 1, &xv);
        sg_tensor *y = sg_add(x, x);
        double *got = y ? tu_read(y) : NULL, ref[5];
        for (int i = 0; i < 5; i++) ref[i] = tu_round(SG_F32, xv[i] + xv[i]);
        ok = TU_EXPECT(got != NULL) && tu_close("add", got, ref, 5, 0, 0);
        tu_case(ok, "the CPU context runs ops");
        free(got), free(xv);
        sg_release(x), sg_release(y);
        sg_ctx_destroy(ctx);
    }
    return tu_finish();
}
