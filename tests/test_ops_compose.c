/* SPDX-License-Identifier: MIT */
/*
 * test_ops_compose.c -- masked_fill, div_scalar and repeat_interleave
 * against references written here in f64, on random inputs over dtypes,
 * broadcast masks, strided views and 6-d inputs; div_scalar bit for bit
 * against a correctly rounded f32 division (so a multiplication by 1/s
 * fails); the three inside a compiled step against eager. Each case prints
 * its name, e.g.
 *   ok   MASKED_FILL(type=bf16,x=[4,5,6],mask=[5,1],value=-2.5,layout=permuted) seed=3
 */
#define _POSIX_C_SOURCE 200809L
#include "testutil.h"

#include <math.h>
#include <string.h>

static sg_ctx *ctx;

/* Row-major coordinates of element i of shape. */
static void coords(int nd, const int64_t *shape, int64_t i, int64_t *c) {
    for (int d = nd - 1; d >= 0; d--) {
        c[d] = shape[d] ? i % shape[d] : 0;
        i = shape[d] ? i / shape[d] : 0;
    }
}

static int64_t numel(int nd, const int64_t *s) {
    int64_t n = 1;
    for (int d = 0; d < nd; d++) n *= s[d];
    return n;
}

static void test_masked_fill(sg_dtype dt, int xnd, const int64_t *xs, int mnd, const int64_t *ms,
                             double value, tu_layout lay, uint64_t seed) {
    tu_seed(seed);
    double *xv, *mv;
    sg_tensor *x = tu_rand_layout(ctx, dt, xnd, xs, -5, 5, lay, &xv);
    sg_tensor *m = tu_rand(ctx, SG_BOOL, mnd, ms, 0, 1, &mv);
    sg_tensor *y = sg_masked_fill(x, m, value);
    int64_t n = numel(xnd, xs);
    double *ref = malloc(sizeof(double) * (size_t)(n ? n : 1)), *got = tu_read(y);
    for (int64_t i = 0; i < n; i++) {
        int64_t c[SG_MAX_DIMS], mi = 0;
        coords(xnd, xs, i, c);
        for (int d = 0; d < mnd; d++) mi = mi * ms[d] + (ms[d] == 1 ? 0 : c[d + xnd - mnd]);
        double v = dt == SG_I32 || dt == SG_I64 ? trunc(value) : value;
        ref[i] = mv[mi] != 0 ? tu_round(dt, v) : xv[i];
    }
    bool ok = TU_EXPECT(got) && TU_EXPECT(sg_tensor_ndim(y) == xnd) &&
              tu_close("masked_fill", got, ref, n, 0, 0);
    char a[64], b[64];
    tu_case(ok, "MASKED_FILL(type=%s,x=%s,mask=%s,value=%g,layout=%s) seed=%llu", sg_dtype_name(dt),
            tu_shape(xnd, xs, a, sizeof a), tu_shape(mnd, ms, b, sizeof b), value,
            tu_layout_name(lay), (unsigned long long)seed);
    free(xv), free(mv), free(ref), free(got);
    sg_release(x), sg_release(m), sg_release(y);
}

static void test_div_scalar(sg_dtype dt, double s, tu_layout lay, uint64_t seed) {
    tu_seed(seed);
    int64_t xs[2] = {7, 33}, n = 7 * 33;
    double *xv;
    sg_tensor *x = tu_rand_layout(ctx, dt, 2, xs, -50, 50, lay, &xv);
    sg_tensor *y = sg_div_scalar(x, s);
    sg_dtype odt = dt == SG_I32 || dt == SG_I64 ? SG_F32 : dt;
    double *got = tu_read(y), *ref = malloc(sizeof(double) * (size_t)n);
    /* f32 division of two floats is the f64 quotient rounded once to f32 */
    for (int64_t i = 0; i < n; i++)
        ref[i] = tu_round(odt, (double)(float)((double)(float)xv[i] / (double)(float)s));
    bool ok = TU_EXPECT(got) && TU_EXPECT(sg_tensor_dtype(y) == odt) &&
              tu_close("div_scalar", got, ref, n, 0, 0);
    tu_case(ok, "DIV_SCALAR(type=%s,x=[7,33],s=%g,layout=%s) -> %s, exact seed=%llu",
            sg_dtype_name(dt), s, tu_layout_name(lay), sg_dtype_name(odt),
            (unsigned long long)seed);
    free(xv), free(got), free(ref);
    sg_release(x), sg_release(y);
}

static void test_repeat(sg_dtype dt, int nd, const int64_t *xs, int64_t r, int dim, uint64_t seed) {
    tu_seed(seed);
    double *xv;
    sg_tensor *x = tu_rand(ctx, dt, nd, xs, -9, 9, &xv);
    sg_tensor *y = sg_repeat_interleave(x, r, dim);
    int nd1 = nd ? nd : 1, d = dim < 0 ? dim + nd1 : dim;
    int64_t xs1[SG_MAX_DIMS], ys[SG_MAX_DIMS];
    for (int k = 0; k < nd1; k++) xs1[k] = nd ? xs[k] : 1, ys[k] = xs1[k] * (k == d ? r : 1);
    int64_t n = numel(nd1, ys), gs[SG_MAX_DIMS] = {0};
    double *ref = malloc(sizeof(double) * (size_t)(n ? n : 1)), *got = tu_read(y);
    for (int64_t i = 0; i < n; i++) {
        int64_t c[SG_MAX_DIMS], xi = 0;
        coords(nd1, ys, i, c);
        c[d] /= r;
        for (int k = 0; k < nd1; k++) xi = xi * xs1[k] + c[k];
        ref[i] = xv[xi];
    }
    bool ok = TU_EXPECT(got || n == 0) && TU_EXPECT(sg_tensor_shape(y, gs) == SG_OK) &&
              TU_EXPECT(memcmp(gs, ys, sizeof(int64_t) * (size_t)nd1) == 0) &&
              TU_EXPECT(sg_tensor_ndim(y) == nd1) &&
              tu_close("repeat_interleave", got, ref, n, 0, 0);
    if (ok && r == 1) { /* a new tensor, even when a view would do */
        ok = TU_EXPECT(sg_fill_(y, 100) == SG_OK);
        double *again = tu_read(x);
        ok = ok && TU_EXPECT(again && (nd1 == 0 || xv[0] == again[0]));
        free(again);
    }
    char a[64];
    tu_case(ok, "REPEAT_INTERLEAVE(type=%s,x=%s,repeats=%lld,dim=%d) seed=%llu", sg_dtype_name(dt),
            tu_shape(nd, xs, a, sizeof a), (long long)r, dim, (unsigned long long)seed);
    free(xv), free(got), free(ref);
    sg_release(x), sg_release(y);
}

static sg_status all_three(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)user;
    sg_tensor *m = sg_gt(in[0], in[1]);
    out[0] = sg_masked_fill(in[0], m, -1.5);
    out[1] = sg_div_scalar(in[0], 3.0);
    out[2] = sg_repeat_interleave(in[1], 2, 0);
    sg_release(m);
    return sg_ctx_status(c);
}

static void test_compiled(uint64_t seed) {
    tu_seed(seed);
    int64_t s[2] = {5, 8};
    sg_tensor *in[2] = {tu_rand(ctx, SG_F32, 2, s, -1, 1, NULL),
                        tu_rand(ctx, SG_F32, 2, s, -1, 1, NULL)};
    sg_fn *fe = NULL, *fc = NULL;
    sg_tensor *oe[3], *oc[3];
    bool ok =
        TU_EXPECT(sg_compile(ctx, all_three, NULL, 2, 3, &(sg_compile_opts){.mode = SG_MODE_EAGER},
                             &fe) == SG_OK) &&
        TU_EXPECT(sg_compile(ctx, all_three, NULL, 2, 3,
                             &(sg_compile_opts){.mode = SG_MODE_REDUCE_OVERHEAD}, &fc) == SG_OK) &&
        TU_EXPECT(sg_call(fe, in, 2, oe, 3) == SG_OK) &&
        TU_EXPECT(sg_call(fc, in, 2, oc, 3) == SG_OK);
    for (int k = 0; ok && k < 3; k++) {
        double *a = tu_read(oe[k]), *b = tu_read(oc[k]);
        ok = TU_EXPECT(a && b) && tu_close("compiled vs eager", b, a, sg_tensor_numel(oe[k]), 0, 0);
        free(a), free(b);
    }
    if (!ok) fprintf(stderr, "%s\n", sg_last_error(ctx));
    tu_case(ok,
            "COMPOSE_COMPILED(masked_fill+div_scalar+repeat_interleave,type=f32,x=[5,8]) "
            "reduce-overhead == eager seed=%llu",
            (unsigned long long)seed);
    sg_fn_destroy(fe), sg_fn_destroy(fc);
    sg_release(in[0]), sg_release(in[1]);
}

static void test_errors(void) {
    int64_t s[2] = {3, 4}, s2[1] = {3};
    sg_tensor *x = sg_zeros(ctx, SG_F32, 2, s), *mf = sg_zeros(ctx, SG_F32, 2, s),
              *mb = sg_zeros(ctx, SG_BOOL, 1, s2), *b = sg_zeros(ctx, SG_BOOL, 2, s);
    bool ok = TU_EXPECT(!sg_masked_fill(x, mf, 1)) && TU_EXPECT(sg_ctx_status(ctx) == SG_ERR_DTYPE);
    sg_clear_error(ctx);
    ok =
        ok && TU_EXPECT(!sg_masked_fill(x, mb, 1)) && TU_EXPECT(sg_ctx_status(ctx) == SG_ERR_SHAPE);
    sg_clear_error(ctx);
    ok = ok && TU_EXPECT(!sg_div_scalar(b, 2)) && TU_EXPECT(sg_ctx_status(ctx) == SG_ERR_DTYPE);
    sg_clear_error(ctx);
    ok = ok && TU_EXPECT(!sg_repeat_interleave(x, -1, 0)) &&
         TU_EXPECT(sg_ctx_status(ctx) == SG_ERR_INVALID_ARG);
    sg_clear_error(ctx);
    ok = ok && TU_EXPECT(!sg_repeat_interleave(x, 2, 2)) &&
         TU_EXPECT(sg_ctx_status(ctx) == SG_ERR_INDEX) &&
         TU_EXPECT(strstr(sg_last_error(ctx), "sg_repeat_interleave") != NULL);
    sg_clear_error(ctx);
    ok = ok && TU_EXPECT(!sg_repeat_interleave(x, INT64_MAX / 2, 1)) &&
         TU_EXPECT(sg_ctx_status(ctx) == SG_ERR_SHAPE) &&
         TU_EXPECT(strstr(sg_last_error(ctx), "too large to address") != NULL);
    sg_clear_error(ctx);
    /* A result of more than 2^63 elements in all: said as this op's. */
    int64_t huge[2] = {1 << 20, 1 << 20};
    sg_tensor *one = sg_full(ctx, SG_F32, 0, NULL, 1), *wide = sg_expand(one, 2, huge);
    ok = ok && TU_EXPECT(wide != NULL) && TU_EXPECT(!sg_repeat_interleave(wide, 1 << 30, 1)) &&
         TU_EXPECT(sg_ctx_status(ctx) == SG_ERR_SHAPE) &&
         TU_EXPECT(strncmp(sg_last_error(ctx), "sg_repeat_interleave: ", 22) == 0) &&
         TU_EXPECT(strstr(sg_last_error(ctx), "2^63") != NULL);
    sg_clear_error(ctx);
    sg_release(wide), sg_release(one);
    tu_case(ok, "COMPOSE_ERRORS(float mask, mask that grows x, div of bool, negative repeats, bad "
                "dim, repeats past 64 bits, a result past 2^63 elements)");
    sg_release(x), sg_release(mf), sg_release(mb), sg_release(b);
}

int main(void) {
    ctx = tu_ctx((sg_ctx_opts){0});
    int64_t x3[3] = {4, 5, 6}, m2[2] = {5, 1}, x6[6] = {2, 1, 2, 1, 2, 2};
    const sg_dtype fdts[3] = {SG_F32, SG_BF16, SG_F16};
    uint64_t seed = 1;
    for (int l = 0; l < TU_NUM_LAYOUTS; l++) {
        test_masked_fill(SG_F32, 3, x3, 2, m2, -2.5, (tu_layout)l, seed++);
        test_masked_fill(SG_BF16, 3, x3, 3, x3, 1e30, (tu_layout)l, seed++);
        test_masked_fill(SG_I32, 3, x3, 0, NULL, 2.7, (tu_layout)l, seed++);
        test_masked_fill(SG_I64, 3, x3, 2, m2, -7.9, (tu_layout)l, seed++);
    }
    for (int k = 0; k < 3; k++)
        for (int l = 0; l < TU_NUM_LAYOUTS; l++) {
            test_div_scalar(fdts[k], 3.0, (tu_layout)l, seed++);
            test_div_scalar(fdts[k], -0.7, (tu_layout)l, seed++);
        }
    test_div_scalar(SG_F32, 1e-3, TU_CONTIG, seed++);
    test_div_scalar(SG_F32, 0.0, TU_CONTIG, seed++);
    test_div_scalar(SG_I32, 7.0, TU_CONTIG, seed++);
    test_div_scalar(SG_I64, -3.0, TU_PERMUTED, seed++);
    int64_t x2[2] = {3, 4};
    for (int dim = -2; dim < 2; dim++) {
        test_repeat(SG_F32, 2, x2, 3, dim, seed++);
        test_repeat(SG_I64, 2, x2, 1, dim, seed++);
    }
    test_repeat(SG_BF16, 2, x2, 0, 1, seed++);
    test_repeat(SG_F32, 0, NULL, 4, 0, seed++);
    test_repeat(SG_F32, 6, x6, 2, 2, seed++);
    test_repeat(SG_I32, 6, x6, 3, -1, seed++);
    test_compiled(seed++);
    test_errors();
    sg_ctx_destroy(ctx);
    return tu_finish();
}
