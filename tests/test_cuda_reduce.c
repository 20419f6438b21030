/* SPDX-License-Identifier: MIT */
/*
 * test_cuda_reduce.c -- the paths of the CUDA reduce and row kernels that
 * the op tests do not reach, against f64 references computed here: one
 * output over 16M elements (the range cut into chunks across the GPU, then
 * merged), NaN and ties far apart in such a range, column sums (a thread per
 * output), bit-identical repeats, rows of 50k elements (a block per row),
 * softmax along a strided dim (a thread per row), and sliced / permuted rows
 * for the norms and cross_entropy, and a bad target while a graph is being
 * recorded (no host check then: the kernel writes NaN). test_codegen_nvrtc
 * compiles both units, with every kernel present, without a GPU; without a
 * CUDA device this test exits 77.
 */
#define _POSIX_C_SOURCE 200809L
#include "codegen/codegen.h"
#include "graphs/cuda/exec.h"
#include "testutil.h"

#include <math.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static sg_ctx *ctx;

static int64_t numel_of(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    return n;
}

static bool check(sg_tensor *y, int64_t n, const double *ref, sg_dtype dt) {
    double *got = y ? tu_read(y) : NULL;
    bool ok = TU_EXPECT(y != NULL) && TU_EXPECT(got != NULL) &&
              TU_EXPECT(sg_tensor_numel(y) == n) &&
              TU_EXPECT(tu_close("values", got, ref, n, tu_rtol(dt), tu_atol(dt)));
    free(got);
    if (!y) sg_clear_error(ctx);
    return ok;
}

/* ------------------------------------------------------------ reductions */

/* Every reduction of all 16M elements of [4096, 4096] to one scalar. */
static void test_huge(sg_dtype dt) {
    int64_t shape[2] = {4096, 4096}, n = numel_of(2, shape);
    double *v;
    sg_tensor *x = tu_rand(ctx, dt, 2, shape, 0, 1, &v);
    double s = 0, mx = -INFINITY, mn = INFINITY, sq = 0;
    int64_t at = 0;
    for (int64_t i = 0; i < n; i++) {
        s += v[i];
        if (v[i] > mx) mx = v[i], at = i;
        if (v[i] < mn) mn = v[i];
    }
    double mean = s / (double)n;
    for (int64_t i = 0; i < n; i++) sq += (v[i] - mean) * (v[i] - mean);
    double want[6] = {s, mean, mx, mn, sq / (double)(n - 1), (double)at};
    sg_tensor *y[6] = {sg_sum(x, 0, NULL, false),    sg_mean(x, 0, NULL, false),
                       sg_max(x, 0, NULL, false),    sg_min(x, 0, NULL, false),
                       sg_var(x, 0, NULL, 1, false), sg_argmax(x, SG_ALL_DIMS, false)};
    static const char *const names[6] = {"SUM", "MEAN", "MAX", "MIN", "VAR", "ARGMAX"};
    for (int k = 0; k < 6; k++) {
        tu_case(check(y[k], 1, &want[k], k == 5 ? SG_I64 : dt),
                "%s(type=%s,x=[4096,4096],dims=all)", names[k], sg_dtype_name(dt));
        sg_release(y[k]);
    }
    /* The same op twice gives the same bits: no atomics, a fixed merge order. */
    sg_tensor *a = sg_sum(x, 0, NULL, false), *b = sg_sum(x, 0, NULL, false);
    double ra = 0, rb = 1;
    bool ok = TU_EXPECT(a && b && sg_item(a, &ra) == SG_OK && sg_item(b, &rb) == SG_OK) &&
              TU_EXPECT(memcmp(&ra, &rb, sizeof ra) == 0);
    tu_case(ok, "SUM_REPEATS(type=%s,x=[4096,4096]): bit-identical", sg_dtype_name(dt));
    sg_release(a), sg_release(b), sg_release(x);
    free(v);
}

/* NaN and equal maxima 16M apart: max is NaN and argmax the first NaN, or
 * without the NaN the first of the two equal maxima. */
static void test_huge_nan_ties(void) {
    int64_t n = 1 << 24, shape[1] = {n};
    float *buf = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) buf[i] = (float)(i % 1000) / 1000.0f;
    buf[5000001] = buf[15000001] = 2.0f;
    sg_tensor *x = sg_from_host(ctx, SG_F32, 1, shape, buf);
    buf[9000001] = buf[12000001] = NAN;
    sg_tensor *xn = sg_from_host(ctx, SG_F32, 1, shape, buf);
    sg_tensor *am = sg_argmax(x, 0, false), *mx = sg_max(x, 0, NULL, false);
    sg_tensor *amn = sg_argmax(xn, 0, false), *mxn = sg_max(xn, 0, NULL, false);
    sg_tensor *mnn = sg_min(xn, 0, NULL, false), *sn = sg_sum(xn, 0, NULL, false);
    int64_t a = -1, b = -1;
    double m = 0, mn = 0, mm = 0, s = 0;
    bool ok = TU_EXPECT(am && sg_read(am, &a, 8) == SG_OK && a == 5000001) &&
              TU_EXPECT(mx && sg_item(mx, &m) == SG_OK && m == 2.0) &&
              TU_EXPECT(amn && sg_read(amn, &b, 8) == SG_OK && b == 9000001) &&
              TU_EXPECT(mxn && sg_item(mxn, &mn) == SG_OK && isnan(mn)) &&
              TU_EXPECT(mnn && sg_item(mnn, &mm) == SG_OK && isnan(mm)) &&
              TU_EXPECT(sn && sg_item(sn, &s) == SG_OK && isnan(s));
    tu_case(ok, "NAN_TIES(type=f32,x=[16777216]): the first of equal maxima, the first NaN");
    sg_release(x), sg_release(xn), sg_release(am), sg_release(mx), sg_release(amn);
    sg_release(mxn), sg_release(mnn), sg_release(sn);
    free(buf);
}

/* Sums over dim 0 of a row-major matrix (outputs side by side: a thread
 * each, the range cut into chunks) and over dim 1 of its transpose. */
static void test_columns(void) {
    int64_t shape[2] = {4096, 1024};
    double *v;
    sg_tensor *x = tu_rand(ctx, SG_F32, 2, shape, -1, 1, &v);
    double *ref = calloc(1024, sizeof(double));
    int64_t at[1024] = {0};
    for (int64_t i = 0; i < 4096; i++)
        for (int64_t j = 0; j < 1024; j++) {
            ref[j] += v[i * 1024 + j];
            if (v[i * 1024 + j] > v[at[j] * 1024 + j]) at[j] = i;
        }
    double atd[1024];
    for (int j = 0; j < 1024; j++) atd[j] = (double)at[j];
    int d0 = 0, d1 = 1;
    sg_tensor *s = sg_sum(x, 1, &d0, false), *t = sg_transpose(x, 0, 1);
    sg_tensor *st = t ? sg_sum(t, 1, &d1, true) : NULL, *am = sg_argmax(x, 0, false);
    tu_case(check(s, 1024, ref, SG_F32), "SUM(type=f32,x=[4096,1024],dims=[0])");
    tu_case(check(st, 1024, ref, SG_F32), "SUM(type=f32,x=transpose([4096,1024]),dims=[1])");
    tu_case(check(am, 1024, atd, SG_I64), "ARGMAX(type=f32,x=[4096,1024],dim=0)");
    sg_release(x), sg_release(s), sg_release(t), sg_release(st), sg_release(am);
    free(v), free(ref);
}

/* ------------------------------------------------------------ rows */

/* Softmax / log_softmax along dim of a row-major 2-d value array. */
static void ref_softmax(int64_t R, int64_t C, int dim, const double *v, bool lg, double *out) {
    int64_t len = dim ? C : R, nrows = dim ? R : C;
    int64_t es = dim ? 1 : C, rs = dim ? C : 1;
    for (int64_t r = 0; r < nrows; r++) {
        const double *x = v + r * rs;
        double m = -INFINITY, s = 0;
        for (int64_t j = 0; j < len; j++) m = x[j * es] > m ? x[j * es] : m;
        for (int64_t j = 0; j < len; j++) s += exp(x[j * es] - m);
        for (int64_t j = 0; j < len; j++)
            out[r * rs + j * es] = lg ? x[j * es] - m - log(s) : exp(x[j * es] - m) / s;
    }
}

static void softmax_case(sg_dtype dt, int64_t R, int64_t C, int dim, tu_layout layout) {
    int64_t shape[2] = {R, C};
    double *v, *ref = malloc((size_t)(R * C) * sizeof(double));
    sg_tensor *x = tu_rand_layout(ctx, dt, 2, shape, -8, 8, layout, &v);
    for (int lg = 0; lg < 2; lg++) {
        ref_softmax(R, C, dim, v, lg, ref);
        sg_tensor *y = lg ? sg_log_softmax(x, dim) : sg_softmax(x, dim);
        tu_case(check(y, R * C, ref, dt), "%s(type=%s,x=[%lld,%lld],dim=%d,view=%s)",
                lg ? "LOG_SOFTMAX" : "SOFTMAX", sg_dtype_name(dt), (long long)R, (long long)C, dim,
                tu_layout_name(layout));
        sg_release(y);
    }
    sg_release(x);
    free(v), free(ref);
}

static void norm_case(sg_dtype dt, int64_t R, int64_t C, tu_layout layout, bool layer) {
    int64_t shape[2] = {R, C}, wshape[1] = {C};
    double *v, *wv, *bv, *ref = malloc((size_t)(R * C) * sizeof(double));
    /* An offset mean: the statistics must not cancel it into the variance. */
    sg_tensor *x = tu_rand_layout(ctx, dt, 2, shape, 3, 5, layout, &v);
    sg_tensor *w = tu_rand(ctx, dt, 1, wshape, 0.5, 1.5, &wv);
    sg_tensor *b = tu_rand(ctx, dt, 1, wshape, -1, 1, &bv);
    for (int64_t r = 0; r < R; r++) {
        const double *xr = v + r * C;
        double m = 0, q = 0;
        for (int64_t j = 0; j < C; j++) m += xr[j];
        m = layer ? m / (double)C : 0;
        for (int64_t j = 0; j < C; j++) q += (xr[j] - m) * (xr[j] - m);
        double rs = 1.0 / sqrt(q / (double)C + 1e-5);
        for (int64_t j = 0; j < C; j++)
            ref[r * C + j] = (xr[j] - m) * rs * wv[j] + (layer ? bv[j] : 0);
    }
    sg_tensor *y = layer ? sg_layer_norm(x, w, b, 1e-5) : sg_rms_norm(x, w, 1e-5);
    tu_case(check(y, R * C, ref, dt), "%s(type=%s,x=[%lld,%lld],weight,%sview=%s)",
            layer ? "LAYER_NORM" : "RMS_NORM", sg_dtype_name(dt), (long long)R, (long long)C,
            layer ? "bias," : "", tu_layout_name(layout));
    sg_release(x), sg_release(w), sg_release(b), sg_release(y);
    free(v), free(wv), free(bv), free(ref);
}

static void ce_case(sg_dtype dt, int64_t N, int64_t C, tu_layout layout) {
    int64_t shape[2] = {N, C}, tshape[1] = {N};
    double *v;
    sg_tensor *x = tu_rand_layout(ctx, dt, 2, shape, -6, 6, layout, &v);
    int64_t *t = malloc((size_t)N * sizeof(int64_t));
    double total = 0;
    for (int64_t r = 0; r < N; r++) {
        t[r] = tu_randint(0, C - 1);
        const double *xr = v + r * C;
        double m = -INFINITY, s = 0;
        for (int64_t j = 0; j < C; j++) m = xr[j] > m ? xr[j] : m;
        for (int64_t j = 0; j < C; j++) s += exp(xr[j] - m);
        total += m + log(s) - xr[t[r]];
    }
    double want = total / (double)N;
    sg_tensor *tg = sg_from_host(ctx, SG_I64, 1, tshape, t);
    sg_tensor *y = sg_cross_entropy(x, tg);
    tu_case(check(y, 1, &want, SG_F32), "CROSS_ENTROPY(type=%s,logits=[%lld,%lld],view=%s)",
            sg_dtype_name(dt), (long long)N, (long long)C, tu_layout_name(layout));
    /* One target out of range: the same error as on the CPU, nothing written. */
    t[N / 2] = C;
    sg_tensor *bad = sg_from_host(ctx, SG_I64, 1, tshape, t);
    sg_tensor *yb = sg_cross_entropy(x, bad);
    char want_msg[64];
    snprintf(want_msg, sizeof want_msg, "targets[%lld] is %lld", (long long)(N / 2), (long long)C);
    bool ok = TU_EXPECT(yb == NULL && sg_ctx_status(ctx) == SG_ERR_INDEX) &&
              TU_EXPECT(strstr(sg_last_error(ctx), want_msg) != NULL);
    sg_clear_error(ctx);
    tu_case(ok, "CROSS_ENTROPY(logits=[%lld,%lld],targets[%lld]=%lld): SG_ERR_INDEX", (long long)N,
            (long long)C, (long long)(N / 2), (long long)C);
    sg_release(x), sg_release(tg), sg_release(y), sg_release(bad), sg_release(yb);
    free(v), free(t);
}

/* While a graph is recorded the host may not wait, so targets are not read
 * back: the op succeeds and a bad target makes the loss NaN. */
static void test_recording(void) {
    int64_t shape[2] = {4, 5}, tshape[1] = {4};
    int64_t t[4] = {0, 7, 1, 2};
    sg_tensor *x = sg_full(ctx, SG_F32, 2, shape, 1.0);
    sg_tensor *tg = sg_from_host(ctx, SG_I64, 1, tshape, t);
    sg__cuda_set_capturing(ctx, true);
    sg_tensor *y = x && tg ? sg_cross_entropy(x, tg) : NULL;
    sg__cuda_set_capturing(ctx, false);
    double v = 0;
    bool ok = TU_EXPECT(y != NULL) && TU_EXPECT(sg_item(y, &v) == SG_OK && isnan(v));
    if (!y) sg_clear_error(ctx);
    tu_case(ok, "CROSS_ENTROPY(logits=[4,5],targets[1]=7,recording): NaN, no host check");
    sg_release(x), sg_release(tg), sg_release(y);
    /* Column sums while recording: fewer chunks, so the partials fit the
     * scratch that exists (it cannot grow then); the same values. */
    int64_t cshape[2] = {4096, 1024};
    double *cv, *ref = calloc(1024, sizeof(double));
    sg_tensor *c = tu_rand(ctx, SG_F32, 2, cshape, -1, 1, &cv);
    for (int64_t i = 0; i < 4096 * 1024; i++) ref[i % 1024] += cv[i];
    int d0 = 0;
    sg__cuda_set_capturing(ctx, true);
    sg_tensor *s = c ? sg_sum(c, 1, &d0, false) : NULL;
    sg__cuda_set_capturing(ctx, false);
    tu_case(check(s, 1024, ref, SG_F32), "SUM(type=f32,x=[4096,1024],dims=[0],recording)");
    sg_release(c), sg_release(s);
    free(cv), free(ref);
}

int main(void) {
    sg_status s = sg_ctx_create(&(sg_ctx_opts){.backend = SG_BACKEND_CUDA}, &ctx);
    if (s == SG_ERR_BACKEND_UNAVAILABLE) {
        printf("skipped the device part: %s\n", sg_last_error(NULL));
        int rc = tu_finish();
        return rc == 0 ? 77 : 1;
    }
    if (s != SG_OK) {
        fprintf(stderr, "sg_ctx_create(cuda): %s: %s\n", sg_status_str(s), sg_last_error(NULL));
        return 1;
    }
    tu_seed(5);
    test_huge(SG_F32);
    test_huge(SG_BF16);
    test_huge_nan_ties();
    test_columns();
    /* Rows of 50k: a block per row. */
    softmax_case(SG_F32, 3, 50000, 1, TU_CONTIG);
    softmax_case(SG_BF16, 3, 50000, 1, TU_SLICED);
    norm_case(SG_F32, 4, 50000, TU_CONTIG, true);
    norm_case(SG_F16, 4, 50000, TU_SLICED, false);
    ce_case(SG_F32, 8, 50000, TU_CONTIG);
    /* Strided rows: along dim 0 (a thread per row), permuted and sliced views. */
    softmax_case(SG_F32, 64, 4096, 0, TU_CONTIG);
    softmax_case(SG_F32, 700, 300, 1, TU_PERMUTED);
    softmax_case(SG_F16, 300, 700, 0, TU_PERMUTED);
    norm_case(SG_F32, 64, 3000, TU_SLICED, true);
    norm_case(SG_BF16, 300, 700, TU_PERMUTED, true);
    ce_case(SG_F32, 512, 1000, TU_PERMUTED);
    ce_case(SG_BF16, 100, 2000, TU_SLICED);
    test_recording();
    sg_ctx_destroy(ctx);
    return tu_finish();
}
