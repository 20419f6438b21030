/* SPDX-License-Identifier: MIT */
/*
 * test_cuda_probe.c -- the CUDA backend comes up on a machine with a GPU:
 * a context on device 0, tensors round-trip through device memory bit for
 * bit in every dtype, device-to-device copies (clone) are exact, and
 * contexts can be made and destroyed repeatedly. Exits 77 without a device.
 */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(void) {
    sg_ctx *ctx = NULL;
    sg_status s = sg_ctx_create(&(sg_ctx_opts){.backend = SG_BACKEND_CUDA}, &ctx);
    if (s == SG_ERR_BACKEND_UNAVAILABLE) {
        printf("skipped: %s\n", sg_last_error(NULL));
        return 77;
    }
    bool ok = TU_EXPECT(s == SG_OK) && TU_EXPECT(sg_ctx_backend(ctx) == SG_BACKEND_CUDA);
    tu_case(ok, "a CUDA context (%s)", s == SG_OK ? "ok" : sg_last_error(NULL));
    if (!ok) return tu_finish();
    tu_seed(1);
    const sg_dtype dts[6] = {SG_F32, SG_F16, SG_BF16, SG_I32, SG_I64, SG_BOOL};
    for (int d = 0; d < 6; d++) {
        int64_t shape[2] = {37, 129};
        double *xv;
        sg_tensor *x = tu_rand(ctx, dts[d], 2, shape, -100, 100, &xv);
        double *got = x ? tu_read(x) : NULL;
        sg_tensor *c = x ? sg_clone(x) : NULL;
        double *got2 = c ? tu_read(c) : NULL;
        ok = TU_EXPECT(got && got2) && tu_close("upload", got, xv, 37 * 129, 0, 0) &&
             tu_close("clone", got2, xv, 37 * 129, 0, 0);
        tu_case(ok, "%s[37,129] round-trips and clones exactly%s%s", sg_dtype_name(dts[d]),
                ok ? "" : ": ", ok ? "" : sg_last_error(ctx));
        sg_clear_error(ctx);
        free(xv), free(got), free(got2);
        sg_release(x), sg_release(c);
    }
    sg_ctx_destroy(ctx);
    ok = true;
    for (int i = 0; i < 5 && ok; i++) {
        ok = TU_EXPECT(sg_ctx_create(&(sg_ctx_opts){.backend = SG_BACKEND_CUDA}, &ctx) == SG_OK);
        if (ok) sg_ctx_destroy(ctx);
    }
    tu_case(ok, "five contexts made and destroyed in turn");
    return tu_finish();
}
