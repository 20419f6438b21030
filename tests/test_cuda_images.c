/* SPDX-License-Identifier: MIT */
/*
 * test_cuda_images.c -- a CUDA context whose GPU has a prebuilt image of a
 * kernel family (tools/sg_cubins.c) loads it instead of compiling: an eager
 * softmax (k_row.cu) on a fresh context, with SG_CACHE_DIR pointing at an
 * empty directory, runs with no NVRTC compile and matches an f64 softmax;
 * with SG_ALWAYS_COMPILE=1 the same op on another context compiles the
 * family and gives the same bits. Exits 77 without a CUDA device.
 */
#define _POSIX_C_SOURCE 200809L
#include "codegen/codegen.h"
#include "graphs/cuda/exec.h"
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static double *softmax_on(sg_ctx *ctx, const double *xv, int64_t r, int64_t c) {
    int64_t shape[2] = {r, c};
    float *h = malloc(sizeof(float) * (size_t)(r * c));
    for (int64_t i = 0; i < r * c; i++) h[i] = (float)xv[i];
    sg_tensor *xs = sg_from_host(ctx, SG_F32, 2, shape, h);
    free(h);
    sg_tensor *y = xs ? sg_softmax(xs, 1) : NULL;
    double *out = y ? tu_read(y) : NULL;
    sg_release(xs), sg_release(y);
    return out;
}

int main(void) {
    char dir[] = "/tmp/sg-images-XXXXXX";
    if (!mkdtemp(dir)) return 1;
    setenv("SG_CACHE_DIR", dir, 1);
    sg_ctx *ctx = NULL;
    sg_status s = sg_ctx_create(&(sg_ctx_opts){.backend = SG_BACKEND_CUDA}, &ctx);
    if (s == SG_ERR_BACKEND_UNAVAILABLE) {
        printf("skipped: %s\n", sg_last_error(NULL));
        rmdir(dir);
        return 77;
    }
    if (!TU_EXPECT(s == SG_OK)) return tu_finish();
    int arch = sg__cuda_arch(ctx);
    bool image = false;
    for (int i = 0; i < sg__cu_nimages; i++)
        image = image || (sg__cu_images[i].unit == SG__CU_ROW && sg__cu_images[i].arch == arch);
    const int64_t R = 37, C = 1000;
    double *xv = malloc(sizeof(double) * (size_t)(R * C)), *ref = malloc(sizeof(double) * (size_t)(R * C));
    tu_seed(5);
    for (int64_t i = 0; i < R * C; i++) xv[i] = tu_round(SG_F32, tu_uniform(-8, 8));
    for (int64_t r = 0; r < R; r++) {
        double m = -INFINITY, z = 0;
        for (int64_t c = 0; c < C; c++) m = fmax(m, xv[r * C + c]);
        for (int64_t c = 0; c < C; c++) z += exp(xv[r * C + c] - m);
        for (int64_t c = 0; c < C; c++) ref[r * C + c] = exp(xv[r * C + c] - m) / z;
    }
    uint64_t before = sg__nvrtc_compiles();
    double *got = softmax_on(ctx, xv, R, C);
    uint64_t compiled = sg__nvrtc_compiles() - before;
    bool ok = TU_EXPECT(got != NULL) && tu_close("softmax", got, ref, R * C, 1e-5, 1e-7) &&
              TU_EXPECT(!image || compiled == 0);
    tu_case(ok, "CU_IMAGE_LOADED(sm_%d, %s, eager softmax [37,1000] f32: %llu NVRTC compiles)",
            arch, image ? "prebuilt k_row" : "no prebuilt k_row: compiled", (unsigned long long)compiled);
    sg_ctx *ctx2 = NULL;
    setenv("SG_ALWAYS_COMPILE", "1", 1);
    ok = TU_EXPECT(sg_ctx_create(&(sg_ctx_opts){.backend = SG_BACKEND_CUDA}, &ctx2) == SG_OK);
    before = sg__nvrtc_compiles();
    double *got2 = ok ? softmax_on(ctx2, xv, R, C) : NULL;
    ok = ok && TU_EXPECT(got2 != NULL) && TU_EXPECT(sg__nvrtc_compiles() > before) &&
         TU_EXPECT(memcmp(got, got2, sizeof(double) * (size_t)(R * C)) == 0);
    tu_case(ok, "CU_IMAGE_SAME_BITS(sm_%d: the family compiled at run time gives the same softmax)",
            arch);
    unsetenv("SG_ALWAYS_COMPILE");
    sg_ctx_destroy(ctx2), sg_ctx_destroy(ctx);
    free(xv), free(ref), free(got), free(got2);
    return tu_finish();
}
