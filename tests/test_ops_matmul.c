/* SPDX-License-Identifier: MIT */
/*
 * test_ops_matmul.c -- sg_matmul and sg_linear against an f64 reference
 * written here: broadcast batch dims, 1-d operands, transposed, permuted,
 * sliced and expanded views of either operand, K = 0, empty results, every
 * float dtype, the many-small-batches path and the large single-GEMM path;
 * bad input (dtypes, shapes, NULL, released tensors) and failed allocations.
 *
 * Tolerances: f32 per element, rtol 1e-5 plus an atol of
 * 1e-6 * sqrt(K) * max|a| * max|b| (rounding in a K-term sum grows like
 * sqrt(K)); f16/bf16 by the norm of the error, ||out - ref|| <= 1e-2 ||ref||.
 */
#include "testutil.h"

#include <math.h>
#include <string.h>

static sg_ctx *ctx;

static const sg_dtype floats[3] = {SG_F32, SG_F16, SG_BF16};

/* ------------------------------------------------------------ operands */

/* How a test operand is laid out: testutil's three, plus a transpose of a
 * contiguous base (last two dims swapped), a batch dim expanded from 1, and
 * rows 1.. of a base with twice the rows (rows evenly spaced, but batches
 * not one matrix apart). */
enum { L_CONTIG, L_PERMUTED, L_SLICED, L_TRANSPOSED, L_EXPANDED, L_NARROWED };
static const char *lname(int l) {
    static const char *const n[] = {"contig",     "permuted", "sliced",
                                    "transposed", "expanded", "narrowed"};
    return n[l];
}

static sg_tensor *operand(sg_dtype dt, int nd, const int64_t *shape, int layout, double **vals) {
    if (layout <= L_SLICED || (layout != L_EXPANDED && nd < 2))
        return tu_rand_layout(ctx, dt, nd, shape, -1, 1,
                              layout <= L_SLICED ? (tu_layout)layout : TU_CONTIG, vals);
    int64_t bshape[SG_MAX_DIMS];
    memcpy(bshape, shape, sizeof(int64_t) * (size_t)nd);
    int64_t n = 1;
    for (int d = 0; d < nd; d++) n *= shape[d];
    double *v = malloc((size_t)(n ? n : 1) * sizeof(double)), *bv;
    sg_tensor *base, *view;
    if (layout == L_TRANSPOSED && nd >= 2) {
        bshape[nd - 2] = shape[nd - 1];
        bshape[nd - 1] = shape[nd - 2];
        base = tu_rand(ctx, dt, nd, bshape, -1, 1, &bv);
        view = sg_transpose(base, -1, -2);
        int64_t R = shape[nd - 2], C = shape[nd - 1];
        for (int64_t i = 0; i < n; i++) {
            int64_t b = i / (R * C), r = i / C % R, c = i % C;
            v[i] = bv[b * R * C + c * R + r];
        }
    } else if (layout == L_NARROWED) {
        int64_t R = shape[nd - 2], C = shape[nd - 1], BR = 2 * R + 1;
        bshape[nd - 2] = BR;
        base = tu_rand(ctx, dt, nd, bshape, -1, 1, &bv);
        view = sg_narrow(base, nd - 2, 1, R);
        for (int64_t i = 0; i < n; i++) {
            int64_t b = i / (R * C), r = i / C % R, c = i % C;
            v[i] = bv[(b * BR + 1 + r) * C + c];
        }
    } else { /* expanded: dim 0 is stored once and repeated */
        bshape[0] = 1;
        base = tu_rand(ctx, dt, nd, bshape, -1, 1, &bv);
        view = sg_expand(base, nd, shape);
        int64_t per = shape[0] ? n / shape[0] : 0;
        for (int64_t i = 0; i < n; i++) v[i] = bv[i % (per ? per : 1)];
    }
    sg_release(base);
    free(bv);
    *vals = v;
    return view;
}

/* ------------------------------------------------------------ reference */

static int64_t prod(int nd, const int64_t *s) {
    int64_t p = 1;
    for (int d = 0; d < nd; d++) p *= s[d];
    return p;
}

/*
 * PyTorch's matmul in f64: a 1-d a is (1, K) and a 1-d b is (K, 1), those
 * dims dropped from the result; batch dims broadcast. Returns the values
 * (row-major, malloc'd) and the result's shape.
 */
static double *ref_matmul(int an, const int64_t *as, const double *av, int bn, const int64_t *bs,
                          const double *bv, int *on, int64_t *os) {
    int64_t M = an >= 2 ? as[an - 2] : 1, K = as[an - 1], N = bn >= 2 ? bs[bn - 1] : 1;
    int ab = an > 2 ? an - 2 : 0, bb = bn > 2 ? bn - 2 : 0, nb = ab > bb ? ab : bb;
    int64_t bshape[SG_MAX_DIMS];
    for (int d = 0; d < nb; d++) {
        int64_t sa = d < nb - ab ? 1 : as[d - (nb - ab)], sb = d < nb - bb ? 1 : bs[d - (nb - bb)];
        bshape[d] = sa == 1 ? sb : sa;
    }
    int64_t nbatch = prod(nb, bshape);
    double *out = calloc((size_t)(nbatch * M * N + 1), sizeof(double));
    for (int64_t b = 0; b < nbatch; b++) {
        /* The batch of a and of b that batch b reads (size-1 dims repeat). */
        int64_t rem = b, ia = 0, ib = 0, stride_a = 1, stride_b = 1;
        for (int d = nb - 1; d >= 0; d--) {
            int64_t i = rem % bshape[d];
            rem /= bshape[d];
            int da = d - (nb - ab), db = d - (nb - bb);
            if (da >= 0) {
                ia += (as[da] == 1 ? 0 : i) * stride_a;
                stride_a *= as[da];
            }
            if (db >= 0) {
                ib += (bs[db] == 1 ? 0 : i) * stride_b;
                stride_b *= bs[db];
            }
        }
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < N; n++) {
                double s = 0;
                for (int64_t k = 0; k < K; k++)
                    s += av[(ia * M + m) * K + k] * bv[(ib * K + k) * N + n];
                out[(b * M + m) * N + n] = s;
            }
    }
    *on = 0;
    for (int d = 0; d < nb; d++) os[(*on)++] = bshape[d];
    if (an >= 2) os[(*on)++] = M;
    if (bn >= 2) os[(*on)++] = N;
    return out;
}

static double max_abs(const double *v, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) m = fabs(v[i]) > m ? fabs(v[i]) : m;
    return m;
}

static bool norm_close(const char *name, const double *got, const double *ref, int64_t n,
                       double tol) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = got[i] - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
    }
    bool ok = den == 0 ? num == 0 : sqrt(num) <= tol * sqrt(den);
    if (!ok)
        fprintf(stderr, "  %s: ||out-ref|| = %g, ||ref|| = %g (tol %g)\n", name, sqrt(num),
                sqrt(den), tol);
    return ok;
}

/* got against ref by dtype (see the top of the file). */
static bool check_values(sg_dtype dt, const double *got, const double *ref, int64_t n, int64_t K,
                         double scale) {
    if (!got) return TU_EXPECT(got != NULL);
    if (dt == SG_F32)
        return tu_close("out", got, ref, n, tu_rtol(dt),
                        tu_atol(dt) * sqrt((double)(K > 1 ? K : 1)) * scale);
    return norm_close("out", got, ref, n, tu_rtol(dt));
}

static bool same_shape(const sg_tensor *t, int nd, const int64_t *shape) {
    if (sg_tensor_ndim(t) != nd) return false;
    for (int d = 0; d < nd; d++)
        if (sg_tensor_size(t, d) != shape[d]) return false;
    return true;
}

/* ------------------------------------------------------------ matmul */

static void matmul_case(sg_dtype dt, int an, const int64_t *as, int la, int bn, const int64_t *bs,
                        int lb) {
    double *av, *bv;
    sg_tensor *a = operand(dt, an, as, la, &av), *b = operand(dt, bn, bs, lb, &bv);
    int on;
    int64_t os[SG_MAX_DIMS];
    double *ref = ref_matmul(an, as, av, bn, bs, bv, &on, os);
    sg_tensor *c = sg_matmul(a, b);
    int64_t n = prod(on, os), K = as[an - 1];
    double scale = max_abs(av, prod(an, as)) * max_abs(bv, prod(bn, bs));
    double *got = c ? tu_read(c) : NULL;
    bool ok = TU_EXPECT(c != NULL) && TU_EXPECT(sg_tensor_dtype(c) == dt) &&
              TU_EXPECT(same_shape(c, on, os)) && check_values(dt, got, ref, n, K, scale);
    if (!c) fprintf(stderr, "  error: %s\n", sg_last_error(ctx));
    char s1[64], s2[64];
    tu_case(ok, "MATMUL(type=%s,a=%s,b=%s,view_a=%s,view_b=%s)", sg_dtype_name(dt),
            tu_shape(an, as, s1, sizeof s1), tu_shape(bn, bs, s2, sizeof s2), lname(la), lname(lb));
    sg_clear_error(ctx);
    sg_release(a), sg_release(b), sg_release(c);
    free(av), free(bv), free(ref), free(got);
}

typedef struct shapes {
    int an, bn;
    int64_t a[4], b[4];
} shapes;

static void test_matmul(void) {
    static const shapes cases[] = {
        {2, 2, {3, 4}, {4, 5}},
        {4, 3, {2, 1, 3, 4}, {5, 4, 6}}, /* batch broadcast */
        {3, 2, {4, 5, 6}, {6, 7}},       /* batch folds into M */
        {2, 3, {5, 6}, {3, 6, 2}},       /* a broadcast against b's batch */
        {3, 3, {2, 1, 3}, {2, 3, 1}},    /* size-1 M and N */
        {1, 2, {4}, {4, 5}},             /* 1-d a */
        {2, 1, {3, 4}, {4}},             /* 1-d b */
        {1, 1, {7}, {7}},                /* dot */
        {3, 1, {2, 3, 4}, {4}},
        {1, 3, {4}, {2, 4, 3}},
        {2, 2, {3, 0}, {0, 5}}, /* K = 0: zeros */
        {3, 3, {2, 3, 0}, {2, 0, 4}},
        {2, 2, {0, 4}, {4, 5}},    /* M = 0 */
        {2, 2, {3, 4}, {4, 0}},    /* N = 0 */
        {3, 2, {0, 3, 4}, {4, 5}}, /* no batches */
        {2, 2, {33, 70}, {70, 41}},
        /* few rows: f16/bf16 b read in place (K and N past the 1024 converted at a time) */
        {2, 2, {3, 2500}, {2500, 1100}},
        {1, 2, {1300}, {1300, 3}},
        {3, 2, {2, 4, 300}, {300, 9}}, /* 8 rows after folding; 9 rows next go to BLAS */
        {2, 2, {9, 40}, {40, 20}},
    };
    static const int layouts[][2] = {{L_CONTIG, L_CONTIG},     {L_TRANSPOSED, L_CONTIG},
                                     {L_CONTIG, L_TRANSPOSED}, {L_TRANSPOSED, L_TRANSPOSED},
                                     {L_PERMUTED, L_SLICED},   {L_SLICED, L_PERMUTED},
                                     {L_NARROWED, L_NARROWED}};
    for (int t = 0; t < 3; t++)
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
            for (size_t l = 0; l < sizeof layouts / sizeof layouts[0]; l++) {
                const shapes *c = &cases[i];
                matmul_case(floats[t], c->an, c->a, layouts[l][0], c->bn, c->b, layouts[l][1]);
            }
    /* Expanded batch dims (stride 0), and the paths by size: a large single
     * sgemm (threaded by OpenBLAS) and many small ones (an OpenMP loop). */
    int64_t ea[3] = {5, 3, 4}, eb[3] = {5, 4, 2}, big_a[2] = {150, 130}, big_b[2] = {130, 170};
    int64_t sm[3] = {512, 16, 16};
    for (int t = 0; t < 3; t++) {
        matmul_case(floats[t], 3, ea, L_EXPANDED, 3, eb, L_CONTIG);
        matmul_case(floats[t], 3, ea, L_CONTIG, 3, eb, L_EXPANDED);
        matmul_case(floats[t], 2, big_a, L_CONTIG, 2, big_b, L_TRANSPOSED);
        matmul_case(floats[t], 3, sm, L_CONTIG, 3, sm, L_TRANSPOSED);
    }
}

/* ------------------------------------------------------------ linear */

static void linear_case(sg_dtype dt, int xn, const int64_t *xs, int lx, int64_t N, int lw,
                        int bias_layout) {
    int64_t K = xs[xn - 1], ws[2] = {N, K}, bs[1] = {N};
    double *xv, *wv, *bv = NULL;
    sg_tensor *x = operand(dt, xn, xs, lx, &xv), *w = operand(dt, 2, ws, lw, &wv);
    sg_tensor *b = bias_layout >= 0 ? operand(dt, 1, bs, bias_layout, &bv) : NULL;
    int64_t rows = prod(xn - 1, xs), os[SG_MAX_DIMS];
    memcpy(os, xs, sizeof(int64_t) * (size_t)xn);
    os[xn - 1] = N;
    double *ref = calloc((size_t)(rows * N + 1), sizeof(double));
    for (int64_t r = 0; r < rows; r++)
        for (int64_t n = 0; n < N; n++) {
            double s = bv ? bv[n] : 0;
            for (int64_t k = 0; k < K; k++) s += xv[r * K + k] * wv[n * K + k];
            ref[r * N + n] = s;
        }
    sg_tensor *y = sg_linear(x, w, b);
    double *got = y ? tu_read(y) : NULL;
    double scale = max_abs(xv, rows * K) * max_abs(wv, N * K) + (bv ? max_abs(bv, N) : 0);
    bool ok = TU_EXPECT(y != NULL) && TU_EXPECT(same_shape(y, xn, os)) &&
              check_values(dt, got, ref, rows * N, K + 1, scale);
    if (!y) fprintf(stderr, "  error: %s\n", sg_last_error(ctx));
    char s1[64];
    tu_case(ok, "LINEAR(type=%s,x=%s,N=%lld,view_x=%s,view_w=%s,bias=%s)", sg_dtype_name(dt),
            tu_shape(xn, xs, s1, sizeof s1), (long long)N, lname(lx), lname(lw),
            bias_layout < 0 ? "none" : lname(bias_layout));
    sg_clear_error(ctx);
    sg_release(x), sg_release(w), sg_release(b), sg_release(y);
    free(xv), free(wv), free(bv), free(ref), free(got);
}

static void test_linear(void) {
    int64_t x2[2] = {5, 4}, x3[3] = {2, 3, 4}, x1[1] = {4}, x0[2] = {3, 0}, xb[3] = {4, 16, 64},
            xk[2] = {2, 3000}, xd[3] = {1, 1, 2049};
    for (int t = 0; t < 3; t++) {
        sg_dtype dt = floats[t];
        linear_case(dt, 2, x2, L_CONTIG, 6, L_CONTIG, L_CONTIG);
        linear_case(dt, 2, x2, L_CONTIG, 6, L_CONTIG, -1);
        linear_case(dt, 3, x3, L_CONTIG, 5, L_TRANSPOSED, L_SLICED); /* w as a transposed view */
        linear_case(dt, 3, x3, L_PERMUTED, 5, L_CONTIG, L_CONTIG);   /* no folding: x permuted */
        linear_case(dt, 3, x3, L_TRANSPOSED, 5, L_SLICED, -1);
        linear_case(dt, 3, x3, L_NARROWED, 5, L_NARROWED, L_CONTIG); /* rows spaced, no fold */
        linear_case(dt, 1, x1, L_CONTIG, 3, L_CONTIG, L_CONTIG);     /* 1-d x */
        linear_case(dt, 1, x1, L_SLICED, 1, L_CONTIG, -1);           /* N = 1 */
        linear_case(dt, 2, x0, L_CONTIG, 4, L_CONTIG, L_CONTIG);     /* K = 0: out = bias */
        linear_case(dt, 3, xb, L_CONTIG, 48, L_CONTIG, L_CONTIG);    /* one (64 x 64) gemm */
        /* a decode step's few rows: f16/bf16 w read in place, K past 1024 */
        linear_case(dt, 2, xk, L_CONTIG, 70, L_CONTIG, L_CONTIG);
        linear_case(dt, 3, xd, L_CONTIG, 1500, L_CONTIG, -1);
        linear_case(dt, 3, xd, L_TRANSPOSED, 33, L_CONTIG, L_CONTIG);
    }
}

/* ------------------------------------------------------------ bad input */

/* The call failed with status s, the message names op and holds `what`,
 * and the context still works after sg_clear_error. */
static bool failed_with(sg_status s, const char *op, const char *what) {
    bool ok = TU_EXPECT(sg_ctx_status(ctx) == s) && TU_EXPECT(strstr(sg_last_error(ctx), op)) &&
              TU_EXPECT(!what || strstr(sg_last_error(ctx), what));
    if (!ok)
        fprintf(stderr, "  status %s, message: %s\n", sg_status_str(sg_ctx_status(ctx)),
                sg_last_error(ctx));
    sg_clear_error(ctx);
    int64_t s2[2] = {2, 2};
    sg_tensor *e = sg_full(ctx, SG_F32, 2, s2, 1.0), *m = sg_matmul(e, e);
    float buf[4] = {0};
    ok = ok && TU_EXPECT(m && sg_read(m, buf, sizeof buf) == SG_OK) && TU_EXPECT(buf[3] == 2.0f);
    sg_release(e), sg_release(m);
    return ok;
}

static void test_bad_input(void) {
    int64_t s23[2] = {2, 3}, s45[2] = {4, 5}, s34[2] = {3, 4}, s234[3] = {2, 3, 4},
            s345[3] = {3, 4, 5}, s3[1] = {3};
    sg_tensor *i1 = sg_zeros(ctx, SG_I32, 2, s23), *i2 = sg_zeros(ctx, SG_I32, 2, s34);
    sg_tensor *f23 = sg_zeros(ctx, SG_F32, 2, s23), *h34 = sg_zeros(ctx, SG_F16, 2, s34);
    sg_tensor *f45 = sg_zeros(ctx, SG_F32, 2, s45), *f34 = sg_zeros(ctx, SG_F32, 2, s34);
    sg_tensor *f234 = sg_zeros(ctx, SG_F32, 3, s234), *f345 = sg_zeros(ctx, SG_F32, 3, s345);
    sg_tensor *f3 = sg_zeros(ctx, SG_F32, 1, s3), *f0 = sg_zeros(ctx, SG_F32, 0, NULL);
    sg_tensor *h3 = sg_zeros(ctx, SG_F16, 1, s3);

    bool ok = TU_EXPECT(sg_matmul(i1, i2) == NULL) && failed_with(SG_ERR_DTYPE, "sg_matmul", "i32");
    tu_case(ok, "MATMUL_BAD(int dtype: i32[2,3] @ i32[3,4] is SG_ERR_DTYPE)");
    ok = TU_EXPECT(sg_matmul(f23, h34) == NULL) &&
         TU_EXPECT(strstr(sg_last_error(ctx), "f32[2,3]")) &&
         failed_with(SG_ERR_DTYPE, "sg_matmul", "f16[3,4]");
    tu_case(ok, "MATMUL_BAD(mixed dtypes: f32[2,3] @ f16[3,4] is SG_ERR_DTYPE naming both)");
    ok = TU_EXPECT(sg_matmul(f23, f45) == NULL) &&
         TU_EXPECT(strstr(sg_last_error(ctx), "f32[2,3]")) &&
         failed_with(SG_ERR_SHAPE, "sg_matmul", "f32[4,5]");
    tu_case(ok, "MATMUL_BAD(K mismatch: [2,3] @ [4,5] is SG_ERR_SHAPE naming both shapes)");
    ok =
        TU_EXPECT(sg_matmul(f234, f345) == NULL) && failed_with(SG_ERR_SHAPE, "sg_matmul", "batch");
    tu_case(ok, "MATMUL_BAD(batch mismatch: [2,3,4] @ [3,4,5] is SG_ERR_SHAPE)");
    ok = TU_EXPECT(sg_matmul(f0, f3) == NULL) && failed_with(SG_ERR_SHAPE, "sg_matmul", "0-d");
    tu_case(ok, "MATMUL_BAD(0-d operand is SG_ERR_SHAPE)");
    ok = TU_EXPECT(sg_matmul(f3, f45) == NULL) && failed_with(SG_ERR_SHAPE, "sg_matmul", "K=3");
    tu_case(ok, "MATMUL_BAD(1-d K mismatch: [3] @ [4,5] is SG_ERR_SHAPE)");
    /* A NULL input (an earlier op failed) gives NULL and no new message. */
    ok = TU_EXPECT(sg_matmul(NULL, f34) == NULL) && TU_EXPECT(sg_ctx_status(ctx) == SG_OK) &&
         TU_EXPECT(sg_last_error(ctx)[0] == '\0') &&
         TU_EXPECT(sg_linear(f23, NULL, NULL) == NULL) && TU_EXPECT(sg_ctx_status(ctx) == SG_OK);
    tu_case(ok, "MATMUL_BAD(NULL input gives NULL without a new message)");
    sg_tensor *gone = sg_zeros(ctx, SG_F32, 2, s34);
    sg_release(gone);
    ok = TU_EXPECT(sg_matmul(f23, gone) == NULL) &&
         failed_with(SG_ERR_RELEASED, "sg_matmul", "released");
    tu_case(ok, "MATMUL_BAD(released operand is SG_ERR_RELEASED)");

    ok = TU_EXPECT(sg_linear(f23, f3, NULL) == NULL) &&
         failed_with(SG_ERR_SHAPE, "sg_linear", "2-d");
    tu_case(ok, "LINEAR_BAD(w f32[3] is not 2-d: SG_ERR_SHAPE)");
    ok = TU_EXPECT(sg_linear(f23, f34, NULL) == NULL) &&
         failed_with(SG_ERR_SHAPE, "sg_linear", "f32[2,3]");
    tu_case(ok, "LINEAR_BAD(K mismatch: x [2,3], w [3,4] is SG_ERR_SHAPE)");
    ok = TU_EXPECT(sg_linear(f23, f23, f34) == NULL) &&
         failed_with(SG_ERR_SHAPE, "sg_linear", "bias");
    tu_case(ok, "LINEAR_BAD(bias f32[3,4] for N=2 is SG_ERR_SHAPE)");
    ok = TU_EXPECT(sg_linear(f34, f34, h3) == NULL) &&
         failed_with(SG_ERR_DTYPE, "sg_linear", "f16[3]");
    tu_case(ok, "LINEAR_BAD(bias f16 with f32 x is SG_ERR_DTYPE)");
    ok =
        TU_EXPECT(sg_linear(i2, i2, NULL) == NULL) && failed_with(SG_ERR_DTYPE, "sg_linear", "i32");
    tu_case(ok, "LINEAR_BAD(int dtype is SG_ERR_DTYPE)");
    ok =
        TU_EXPECT(sg_linear(f0, f34, NULL) == NULL) && failed_with(SG_ERR_SHAPE, "sg_linear", NULL);
    tu_case(ok, "LINEAR_BAD(0-d x is SG_ERR_SHAPE)");

    sg_release(i1), sg_release(i2), sg_release(f23), sg_release(h34), sg_release(f45);
    sg_release(f34), sg_release(f234), sg_release(f345), sg_release(f3), sg_release(f0);
    sg_release(h3);
}

/* ------------------------------------------------------------ failed allocations */

/*
 * Fail each allocation of a call in turn: every failure must return NULL
 * with SG_ERR_OOM naming the op, and leave no block behind.
 */
static void test_oom(void) {
    tu_alloc al = {0};
    sg_ctx *c;
    sg_backend be = tu_backend();
    if (sg_ctx_create(&(sg_ctx_opts){.backend = be, .alloc = tu_alloc_hook, .alloc_user = &al},
                      &c) != SG_OK)
        return;
    int64_t as[3] = {2, 3, 4}, ws[2] = {5, 4}, bs[1] = {5};
    sg_tensor *x = sg_zeros(c, SG_BF16, 3, as), *w = sg_zeros(c, SG_BF16, 2, ws);
    sg_tensor *b = sg_zeros(c, SG_BF16, 1, bs), *wt = sg_transpose(w, 0, 1);
    /* A device keeps state made by a context's first matmuls (library
     * handles, cached plans) for the context's life: make it before
     * counting blocks. The CPU stages bf16 through at least 3 host buffers;
     * a device computes in its own memory, so only the result's records
     * are host allocations there. */
    if (be != SG_BACKEND_CPU) {
        sg_release(sg_matmul(x, wt));
        sg_release(sg_linear(x, w, b));
    }
    int min_fails = be == SG_BACKEND_CPU ? 3 : 1;
    for (int op = 0; op < 2; op++) {
        bool ok = true;
        int fails = 0;
        for (long n = 1; n < 100; n++) {
            long live = al.live;
            al.fail_at = al.count + n;
            sg_tensor *y = op == 0 ? sg_matmul(x, wt) : sg_linear(x, w, b);
            al.fail_at = 0;
            if (y) {
                sg_release(y);
                break;
            }
            fails++;
            ok = ok && TU_EXPECT(sg_ctx_status(c) == SG_ERR_OOM) && TU_EXPECT(al.live == live);
            sg_clear_error(c);
        }
        tu_case(ok && fails >= min_fails,
                "%s_OOM(type=bf16,fail each of %d allocations: SG_ERR_OOM, no "
                "leak)",
                op == 0 ? "MATMUL" : "LINEAR", fails);
    }
    sg_ctx_destroy(c);
}

/* The compiled step of test_nan: a @ b. */
static sg_status mm_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)user;
    out[0] = sg_matmul(in[0], in[1]);
    return out[0] ? SG_OK : sg_ctx_status(c);
}

/*
 * NaN through an f32 product in a compiled step (on CUDA a small f32 product
 * runs on the tensor cores as 3xTF32, whose split of each operand must keep
 * a NaN): a row of a holding the device's NaN (0x7fffffff), a negative
 * NaN's bits and a quiet NaN gives NaN across its row of the result, as
 * f64 does; the other rows stay finite and match f64.
 */
static void test_nan(void) {
    int64_t as[2] = {6, 40}, bs[2] = {40, 33};
    double *av, *bv;
    sg_tensor *a0 = tu_rand(ctx, SG_F32, 2, as, -1, 1, &av),
              *b = tu_rand(ctx, SG_F32, 2, bs, -1, 1, &bv);
    float host[6 * 40];
    sg_read(a0, host, sizeof host);
    static const uint32_t nans[3] = {0x7fffffffu, 0xffffffffu, 0x7fc00000u};
    for (int r = 0; r < 3; r++) {
        memcpy(&host[(2 * r + 1) * 40 + 7 * r], &nans[r], sizeof(float));
        av[(2 * r + 1) * 40 + 7 * r] = NAN;
    }
    sg_tensor *a = sg_from_host(ctx, SG_F32, 2, as, host);
    int on;
    int64_t os[SG_MAX_DIMS];
    double *want = ref_matmul(2, as, av, 2, bs, bv, &on, os);
    sg_fn *fn = NULL;
    sg_tensor *in[2] = {a, b}, *y = NULL;
    bool ok =
        TU_EXPECT(sg_compile(ctx, mm_step, NULL, 2, 1,
                             &(sg_compile_opts){.mode = SG_MODE_REDUCE_OVERHEAD}, &fn) == SG_OK) &&
        TU_EXPECT(sg_call(fn, in, 2, &y, 1) == SG_OK);
    double *got = ok ? tu_read(y) : NULL;
    int nan_rows = 0;
    for (int64_t i = 0; got && i < 6 * 33; i++) nan_rows += isnan(got[i]) && i % 33 == 0;
    ok = ok && got && TU_EXPECT(nan_rows == 3) &&
         tu_close("a @ b with NaN rows", got, want, 6 * 33, 1e-5, 1e-5);
    if (!ok) fprintf(stderr, "  %s\n", sg_last_error(ctx));
    tu_case(ok, "MATMUL_NAN(f32,a=[6,40] with NaN 0x7fffffff/0xffffffff/0x7fc00000 in rows 1 3 5,"
                "b=[40,33],reduce-overhead) -> those rows NaN, the others as f64");
    sg_clear_error(ctx);
    sg_fn_destroy(fn);
    sg_release(a0), sg_release(a), sg_release(b);
    free(av), free(bv), free(want), free(got);
}

int main(void) {
    ctx = tu_ctx((sg_ctx_opts){0});
    tu_seed(11);
    test_matmul();
    test_linear();
    test_bad_input();
    test_oom();
    test_nan();
    sg_ctx_destroy(ctx);
    return tu_finish();
}
