/* SPDX-License-Identifier: MIT */
/*
 * test_cuda_attn_bwd.c -- the CUDA kernels of ATTENTION_BWD (k_attn_bwd.cu)
 * at training sizes, through sg__sdpa_grad on eager tensors: the
 * tensor-core kernels (bf16 / f16, D = 64 and 128) against the CPU kernel
 * on the same bytes (causal and not, grouped-query heads, q/k/v narrowed
 * out of one fused QKV projection), the FMA kernels (SG_ATTN_MMA=0, and
 * f32) likewise, and at GPT-2's size (B=4, H=12, T=1024, D=64, causal,
 * bf16) the tensor-core result against the FMA one and two runs of each
 * bit-identical, and the backward that reads the forward's row logsumexps
 * (SG__ATTN_LSE) against the one that recomputes them. bf16 / f16 within 2e-2 of the largest |gradient|, f32
 * within 1e-4. Then, unless SG_ATTN_TIMING=0 (set it under
 * compute-sanitizer), the time of the backward at GPT-2's size (eager,
 * 20 calls between synchronizations, best of 3), with the forward's and
 * the backward's with the forward's logsumexps beside it. Without a CUDA device it exits 77.
 */
#define _POSIX_C_SOURCE 200809L
#include "capture/capture.h"
#include "testutil.h"

#include <math.h>
#include <string.h>
#include <time.h>

static sg_ctx *gpu, *cpu;

/* q, k, v (B, H*, T, D) narrowed out of one (B, T, Hq + 2 Hkv, D) projection
 * (fused) or contiguous, dout (B, Hq, T, D), the same bytes in both contexts. */
typedef struct inputs {
    sg_tensor *x[2][4]; /* [gpu, cpu][q, k, v, dout] */
} inputs;

static sg_tensor *upload(sg_ctx *c, sg_tensor *src) {
    int64_t sh[SG_MAX_DIMS], n = sg_tensor_numel(src);
    sg_tensor_shape(src, sh);
    size_t bytes = (size_t)n * sg_dtype_size(sg_tensor_dtype(src));
    void *buf = malloc(bytes ? bytes : 1);
    sg_read(src, buf, bytes);
    sg_tensor *t = sg_from_host(c, sg_tensor_dtype(src), sg_tensor_ndim(src), sh, buf);
    free(buf);
    return t;
}

static void make(inputs *in, sg_dtype dt, int64_t B, int64_t Hq, int64_t Hkv, int64_t T, int64_t D,
                 bool fused) {
    int64_t ps[4] = {B, T, Hq + 2 * Hkv, D}, ds[4] = {B, Hq, T, D};
    sg_tensor *p = tu_rand(cpu, dt, 4, ps, -2, 2, NULL), *d = tu_rand(cpu, dt, 4, ds, -1, 1, NULL);
    static const int perm[4] = {0, 2, 1, 3};
    for (int s = 0; s < 2; s++) {
        sg_tensor *base = s ? p : upload(gpu, p);
        int64_t at[3] = {0, Hq, Hq + Hkv}, len[3] = {Hq, Hkv, Hkv};
        for (int j = 0; j < 3; j++) {
            sg_tensor *n = sg_narrow(base, 2, at[j], len[j]), *t = sg_permute(n, perm);
            in->x[s][j] = fused ? t : sg_contiguous(t);
            if (!fused) sg_release(t);
            sg_release(n);
        }
        in->x[s][3] = s ? d : upload(gpu, d);
        if (!s) sg_release(base);
    }
    sg_release(p);
}

static void unmake(inputs *in) {
    for (int s = 0; s < 2; s++)
        for (int j = 0; j < 4; j++) sg_release(in->x[s][j]);
}

/* dq, dk, dv of the inputs of side s (0 gpu, 1 cpu) into g; false on failure. */
static bool backward(const inputs *in, int s, bool causal, sg_tensor **g) {
    sg_tensor *const *x = in->x[s];
    sg_ctx *c = s ? cpu : gpu;
    sg_tensor *o = sg_sdpa(x[0], x[1], x[2], NULL, causal, 0);
    sg_tensor *args[5] = {x[0], x[1], x[2], NULL, NULL};
    double scale = 1.0 / sqrt((double)sg_tensor_size(x[0], 3));
    sg_status st =
        o ? sg__sdpa_grad(args, o, NULL, x[3], scale, causal ? SG__ATTN_CAUSAL : 0, &g[0], &g[1],
                          &g[2])
          : SG_ERR_NULL;
    if (st != SG_OK) fprintf(stderr, "  %s\n", sg_last_error(c));
    sg_release(o);
    return st == SG_OK;
}

/* a against b: within tol times the largest |b|. */
static bool close_to(sg_tensor *a, sg_tensor *b, double tol) {
    double *x = tu_read(a), *y = tu_read(b);
    int64_t n = sg_tensor_numel(b);
    double big = 1e-3;
    for (int64_t i = 0; y && i < n; i++) big = fabs(y[i]) > big ? fabs(y[i]) : big;
    bool ok = TU_EXPECT(x && y) && TU_EXPECT(sg_tensor_numel(a) == n) &&
              TU_EXPECT(tu_close("attention gradient", x, y, n, tol, tol * big));
    free(x), free(y);
    return ok;
}

static bool bit_equal(sg_tensor *a, sg_tensor *b) {
    size_t n = (size_t)sg_tensor_numel(a) * sg_dtype_size(sg_tensor_dtype(a));
    char *x = malloc(n + 1), *y = malloc(n + 1);
    bool ok = TU_EXPECT(sg_read(a, x, n) == SG_OK) && TU_EXPECT(sg_read(b, y, n) == SG_OK) &&
              TU_EXPECT(memcmp(x, y, n) == 0);
    free(x), free(y);
    return ok;
}

static void release3(sg_tensor **g) {
    for (int k = 0; k < 3; k++) sg_release(g[k]), g[k] = NULL;
}

/* GPU (tensor cores, or FMA with mma false) against the CPU kernel. */
static void vs_cpu(sg_dtype dt, int64_t B, int64_t Hq, int64_t Hkv, int64_t T, int64_t D,
                   bool causal, bool fused, bool mma) {
    inputs in;
    make(&in, dt, B, Hq, Hkv, T, D, fused);
    setenv("SG_ATTN_MMA", mma ? "1" : "0", 1);
    sg_tensor *g[3] = {NULL}, *c[3] = {NULL};
    bool ok = TU_EXPECT(backward(&in, 0, causal, g)) && TU_EXPECT(backward(&in, 1, causal, c));
    for (int k = 0; ok && k < 3; k++) ok = close_to(g[k], c[k], dt == SG_F32 ? 1e-4 : 2e-2);
    tu_case(ok, "ATTN_BWD(kernel=%s,type=%s,B=%lld,Hq=%lld,Hkv=%lld,T=%lld,D=%lld%s%s) vs cpu",
            mma ? "mma" : "fma", sg_dtype_name(dt), (long long)B, (long long)Hq, (long long)Hkv,
            (long long)T, (long long)D, causal ? ",causal" : "", fused ? ",fused_qkv" : "");
    release3(g), release3(c);
    unmake(&in);
    unsetenv("SG_ATTN_MMA");
    sg_clear_error(gpu);
}

/* The forward of x as with gradients wanted: the result, and the rows'
 * logsumexps kept after it in its packed output (*lse, a view), or NULL. */
static sg_tensor *forward_kept(sg_tensor *const *x, bool causal, sg_tensor **lse) {
    for (int k = 0; k < 3; k++) sg_requires_grad_(x[k], true);
    sg_tensor *o = sg_sdpa(x[0], x[1], x[2], NULL, causal, 0);
    for (int k = 0; k < 3; k++) sg_requires_grad_(x[k], false);
    *lse = NULL;
    if (!o) return NULL;
    int64_t rows = sg_tensor_numel(o) / sg_tensor_size(o, 3), no = sg_tensor_numel(o), one = 1;
    size_t es = sg_dtype_size(sg_tensor_dtype(o));
    int64_t nl = sg__attn_numel(no, rows, es) - sg__attn_lse_at(no);
    *lse = sg__tensor_view(o, "test", 1, &nl, &one, o->offset + sg__attn_lse_at(no));
    return o;
}

/* The backward with the forward's logsumexps against the recomputing one
 * (tensor cores, GPT-2's size): within 2e-2, differing elements counted. */
static void kept_vs_recomputed(void) {
    inputs in;
    make(&in, SG_BF16, 4, 12, 12, 1024, 64, true);
    sg_tensor *const *x = in.x[0], *lse = NULL, *g[3] = {NULL}, *r[3] = {NULL};
    sg_tensor *o = forward_kept(x, true, &lse), *args[5] = {x[0], x[1], x[2], NULL, NULL};
    bool ok = TU_EXPECT(o && lse) && TU_EXPECT(backward(&in, 0, true, r)) &&
              TU_EXPECT(sg__sdpa_grad(args, o, lse, x[3], 0.125, SG__ATTN_CAUSAL, &g[0], &g[1],
                                      &g[2]) == SG_OK);
    int64_t diff = 0;
    for (int k = 0; ok && k < 3; k++) {
        double *a = tu_read(g[k]), *b = tu_read(r[k]);
        for (int64_t i = 0; a && b && i < sg_tensor_numel(g[k]); i++) diff += a[i] != b[i];
        free(a), free(b);
        ok = close_to(g[k], r[k], 2e-2);
    }
    tu_case(ok, "ATTN_BWD(type=bf16,B=4,H=12,T=1024,D=64,causal,fused_qkv) the forward's "
                "logsumexps vs recomputed: %lld elements differ", (long long)diff);
    release3(g), release3(r);
    sg_release(o), sg_release(lse);
    unmake(&in);
}

/* GPT-2's size: tensor cores against FMA, each twice bit-identical. */
static void gpt2_size(void) {
    inputs in;
    make(&in, SG_BF16, 4, 12, 12, 1024, 64, true);
    sg_tensor *g[2][2][3] = {{{NULL}}};
    bool ok = true;
    for (int m = 0; m < 2 && ok; m++) {
        setenv("SG_ATTN_MMA", m ? "0" : "1", 1);
        for (int r = 0; r < 2 && ok; r++) ok = TU_EXPECT(backward(&in, 0, true, g[m][r]));
    }
    unsetenv("SG_ATTN_MMA");
    for (int k = 0; ok && k < 3; k++)
        ok = bit_equal(g[0][0][k], g[0][1][k]) && bit_equal(g[1][0][k], g[1][1][k]) &&
             close_to(g[0][0][k], g[1][0][k], 2e-2);
    tu_case(ok, "ATTN_BWD(type=bf16,B=4,H=12,T=1024,D=64,causal,fused_qkv) mma vs fma, "
                "replays bit-identical");
    for (int m = 0; m < 2; m++)
        for (int r = 0; r < 2; r++) release3(g[m][r]);
    unmake(&in);
    sg_clear_error(gpu);
}

static void timing(int64_t T) {
    inputs in;
    make(&in, SG_BF16, 4, 12, 12, T, 64, true);
    sg_tensor *const *x = in.x[0];
    sg_tensor *o = sg_sdpa(x[0], x[1], x[2], NULL, true, 0);
    sg_tensor *args[5] = {x[0], x[1], x[2], NULL, NULL}, *lse = NULL;
    sg_tensor *ok = forward_kept(x, true, &lse);
    double best = 1e30, fbest = 1e30, kbest = 1e30;
    for (int r = 0; r < 3; r++) {
        sg_ctx_synchronize(gpu);
        double t0 = tu_now();
        for (int i = 0; i < 20; i++) {
            sg_tensor *g[3] = {NULL};
            sg__sdpa_grad(args, o, NULL, x[3], 0.125, SG__ATTN_CAUSAL, &g[0], &g[1], &g[2]);
            release3(g);
        }
        sg_ctx_synchronize(gpu);
        double t = (tu_now() - t0) / 20;
        best = t < best ? t : best;
        t0 = tu_now();
        for (int i = 0; i < 20; i++) {
            sg_tensor *g[3] = {NULL};
            sg__sdpa_grad(args, ok, lse, x[3], 0.125, SG__ATTN_CAUSAL, &g[0], &g[1], &g[2]);
            release3(g);
        }
        sg_ctx_synchronize(gpu);
        t = (tu_now() - t0) / 20;
        kbest = t < kbest ? t : kbest;
        t0 = tu_now();
        for (int i = 0; i < 20; i++) sg_release(sg_sdpa(x[0], x[1], x[2], NULL, true, 0));
        sg_ctx_synchronize(gpu);
        t = (tu_now() - t0) / 20;
        fbest = t < fbest ? t : fbest;
    }
    /* The backward's five matmuls of a causal attention (2.5x the forward's two). */
    double flop = 2.5 * 4.0 * 4 * 12 * (double)T * (double)T * 64 / 2;
    printf("time ATTN_BWD(bf16,B=4,H=12,T=%lld,D=64,causal): %8.1f us/call (%.1f TFLOP/s at "
           "2.5x the forward's FLOPs); forward %7.1f us/call; with the forward's logsumexps "
           "%8.1f us/call\n",
           (long long)T, best * 1e6, flop / best * 1e-12, fbest * 1e6, kbest * 1e6);
    sg_release(o), sg_release(ok), sg_release(lse);
    unmake(&in);
}

int main(void) {
    sg_ctx_opts o = {0};
    o.backend = SG_BACKEND_CUDA;
    if (sg_ctx_create(&o, &gpu) != SG_OK) {
        printf("no CUDA device: %s\n", sg_last_error(NULL));
        return 77;
    }
    o.backend = SG_BACKEND_CPU;
    if (sg_ctx_create(&o, &cpu) != SG_OK) {
        printf("no CPU context: %s\n", sg_last_error(NULL));
        return 1;
    }
    tu_seed(5);
    vs_cpu(SG_BF16, 2, 4, 4, 256, 64, true, true, true);
    vs_cpu(SG_BF16, 1, 8, 2, 200, 64, false, false, true);
    vs_cpu(SG_F16, 1, 4, 4, 130, 64, true, false, true);
    vs_cpu(SG_BF16, 1, 4, 2, 160, 128, true, true, true);
    vs_cpu(SG_F16, 1, 2, 2, 97, 128, false, false, true);
    vs_cpu(SG_BF16, 1, 4, 2, 100, 64, true, true, false);
    vs_cpu(SG_F32, 1, 4, 2, 100, 64, true, true, false);
    vs_cpu(SG_F32, 1, 2, 1, 70, 96, false, false, false);
    gpt2_size();
    kept_vs_recomputed();
    const char *e = getenv("SG_ATTN_TIMING");
    if (!(e && strcmp(e, "0") == 0)) timing(512), timing(1024);
    sg_ctx_destroy(gpu);
    sg_ctx_destroy(cpu);
    return tu_finish();
}
