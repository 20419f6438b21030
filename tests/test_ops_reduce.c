/* SPDX-License-Identifier: MIT */
/*
 * test_ops_reduce.c -- sum, mean, max, min, var and argmax against f64
 * references computed here from the inputs' values: every dtype each op
 * takes, contiguous / permuted / sliced inputs, size-1 dims, 0-d and empty
 * tensors, several dims at once, negative dims, keepdim on and off, shapes
 * large enough for the threaded and chunked paths; then NaN and tie rules,
 * exact i64 arithmetic, output dtypes, bad input, and failed allocations.
 */
#include "testutil.h"

#include <math.h>
#include <string.h>

static sg_ctx *ctx, *ctx_mt; /* ctx_mt asks for 5 threads: more chunks */

typedef enum { R_SUM, R_MEAN, R_MAX, R_MIN, R_VAR, R_ARGMAX, R_NUM } rop;
static const char *const rop_names[R_NUM] = {"SUM", "MEAN", "MAX", "MIN", "VAR", "ARGMAX"};

static int64_t numel_of(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    return n;
}

/* The reduced dims as a mask, normalized here (ndims 0: every dim). */
static uint32_t mask_of(int ndim, int ndims, const int *dims) {
    if (ndims == 0) return (1u << ndim) - 1;
    uint32_t m = 0;
    for (int k = 0; k < ndims && ndim > 0; k++) m |= 1u << (dims[k] < 0 ? dims[k] + ndim : dims[k]);
    return m;
}

/*
 * The f64 reference: the keepdim-shaped result (row-major) of op over the
 * dims in mask of row-major values v. Walking x in row-major order visits
 * each output's reduced elements in row-major order of the reduced dims, so
 * the count seen so far is the argmax position.
 */
static void reference(rop op, int ndim, const int64_t *shape, uint32_t mask, const double *v,
                      int corr, double *out, double *spread) {
    int64_t oshape[SG_MAX_DIMS], ostride[SG_MAX_DIMS], L = 1, s = 1;
    for (int d = 0; d < ndim; d++) {
        oshape[d] = (mask & (1u << d)) ? 1 : shape[d];
        if (mask & (1u << d)) L *= shape[d];
    }
    for (int d = ndim - 1; d >= 0; d--) ostride[d] = s, s *= oshape[d];
    int64_t M = numel_of(ndim, oshape), n = numel_of(ndim, shape);
    double *acc = calloc((size_t)M + 1, sizeof(double)),
           *best = calloc((size_t)M + 1, sizeof(double));
    int64_t *cnt = calloc((size_t)M + 1, sizeof(int64_t)),
            *at = calloc((size_t)M + 1, sizeof(int64_t));
    for (int pass = 0; pass < (op == R_VAR ? 2 : 1); pass++)
        for (int64_t i = 0; i < n; i++) {
            int64_t r = i, o = 0;
            for (int d = ndim - 1; d >= 0; d--) {
                if (!(mask & (1u << d))) o += (r % shape[d]) * ostride[d];
                r /= shape[d];
            }
            double x = v[i];
            if (pass == 1) {
                double dev = x - acc[o] / (double)L;
                best[o] += dev * dev; /* var: best holds the squared deviations */
                continue;
            }
            bool take = op == R_MIN ? x < best[o] : x > best[o];
            if (op == R_SUM || op == R_MEAN || op == R_VAR)
                acc[o] += x, best[o] += op == R_VAR ? 0 : x * x;
            else if (cnt[o] == 0 || (best[o] == best[o] && (x != x || take)))
                best[o] = x, at[o] = cnt[o];
            cnt[o]++;
        }
    for (int64_t o = 0; o < M; o++) {
        double den = (double)(L - corr);
        switch (op) {
        case R_SUM: out[o] = acc[o]; break;
        case R_MEAN: out[o] = L ? acc[o] / (double)L : NAN; break;
        case R_MAX:
        case R_MIN: out[o] = best[o]; break;
        case R_ARGMAX: out[o] = (double)at[o]; break;
        default: out[o] = den > 0 ? best[o] / den : best[o] > 0 ? INFINITY : NAN; break;
        }
        spread[o] = op == R_SUM ? sqrt(best[o]) : op == R_MEAN && L ? sqrt(best[o]) / (double)L : 0;
    }
    free(acc), free(best), free(cnt), free(at);
}

/*
 * got against ref within atol + rtol * (|ref| + spread): a float sum's
 * rounding follows the size of its partial sums, not of the result (a sum
 * that cancels to near 0 is only as exact as the sum of its terms'
 * magnitudes allows), so the terms' root sum of squares (spread) counts too.
 */
static bool close_sums(const double *got, const double *ref, const double *spread, int64_t m,
                       double rtol, double atol) {
    int64_t worst = -1;
    double excess = 0;
    for (int64_t o = 0; o < m; o++) {
        if (isnan(ref[o]) ? isnan(got[o]) : got[o] == ref[o]) continue;
        double e = fabs(got[o] - ref[o]) - (atol + rtol * (fabs(ref[o]) + spread[o]));
        if (!(e <= 0) && (worst < 0 || !(e <= excess))) worst = o, excess = e;
    }
    if (worst >= 0)
        printf("  values: element %lld is %.9g, expected %.9g (rtol %g of |ref| + %.3g, atol %g)\n",
               (long long)worst, got[worst], ref[worst], rtol, spread[worst], atol);
    return worst < 0;
}

static sg_tensor *call(rop op, sg_tensor *x, int ndims, const int *dims, bool keepdim, int corr) {
    switch (op) {
    case R_SUM: return sg_sum(x, ndims, dims, keepdim);
    case R_MEAN: return sg_mean(x, ndims, dims, keepdim);
    case R_MAX: return sg_max(x, ndims, dims, keepdim);
    case R_MIN: return sg_min(x, ndims, dims, keepdim);
    case R_VAR: return sg_var(x, ndims, dims, corr, keepdim);
    default: return sg_argmax(x, ndims ? dims[0] : SG_ALL_DIMS, keepdim);
    }
}

static sg_dtype out_dtype(rop op, sg_dtype dt) {
    if (op == R_ARGMAX || (op == R_SUM && (dt == SG_I32 || dt == SG_I64))) return SG_I64;
    return dt;
}

static bool takes(rop op, sg_dtype dt) {
    if (dt == SG_BOOL) return false;
    return (op != R_MEAN && op != R_VAR) || dt == SG_F32 || dt == SG_F16 || dt == SG_BF16;
}

/* The result's shape: x's with reduced dims of size 1 (keepdim) or gone. */
static int expect_shape(int ndim, const int64_t *shape, uint32_t mask, bool keepdim, int64_t *out) {
    int nd = 0;
    for (int d = 0; d < ndim; d++) {
        if (!(mask & (1u << d)))
            out[nd++] = shape[d];
        else if (keepdim)
            out[nd++] = 1;
    }
    return nd;
}

static void run_case(sg_ctx *c, rop op, sg_dtype dt, int ndim, const int64_t *shape, int ndims,
                     const int *dims, bool keepdim, tu_layout layout, int corr) {
    if (!tu_sampled()) return;
    char sh[64], dl[64] = "[";
    for (int k = 0; k < ndims; k++)
        snprintf(dl + strlen(dl), sizeof dl - strlen(dl), k ? ",%d" : "%d", dims[k]);
    strcat(dl, "]");
    double *v = NULL;
    double lo = dt == SG_I32 || dt == SG_I64 ? -50 : -4, hi = -lo;
    sg_tensor *x = tu_rand_layout(c, dt, ndim, shape, lo, hi, layout, &v);
    uint32_t mask = mask_of(ndim, ndims, dims);
    bool empty_range = false;
    for (int d = 0; d < ndim; d++)
        if ((mask & (1u << d)) && shape[d] == 0) empty_range = true;
    sg_tensor *y = call(op, x, ndims, dims, keepdim, corr);
    bool ok;
    if (empty_range && (op == R_MAX || op == R_MIN || op == R_ARGMAX)) {
        /* max of nothing is an error that names the op. */
        ok = TU_EXPECT(y == NULL && sg_ctx_status(c) == SG_ERR_SHAPE) &&
             TU_EXPECT(strstr(sg_last_error(c), "empty") != NULL);
        sg_clear_error(c);
    } else {
        int64_t es[SG_MAX_DIMS], ks[SG_MAX_DIMS], gs[SG_MAX_DIMS];
        int end = expect_shape(ndim, shape, mask, keepdim, es);
        expect_shape(ndim, shape, mask, true, ks);
        int64_t m = numel_of(ndim, ks);
        double *ref = malloc((size_t)(m + 1) * sizeof(double)),
               *spread = malloc((size_t)(m + 1) * sizeof(double));
        reference(op, ndim, shape, mask, v, corr, ref, spread);
        ok = TU_EXPECT(y != NULL) && TU_EXPECT(sg_tensor_ndim(y) == end) &&
             TU_EXPECT(sg_tensor_dtype(y) == out_dtype(op, dt)) &&
             TU_EXPECT(sg_tensor_shape(y, gs) == SG_OK &&
                       !memcmp(gs, es, sizeof(int64_t) * (size_t)end));
        double *got = ok ? tu_read(y) : NULL;
        sg_dtype odt = out_dtype(op, dt);
        ok = ok && TU_EXPECT(got != NULL) &&
             TU_EXPECT(close_sums(got, ref, spread, m, tu_rtol(odt), tu_atol(odt)));
        free(got), free(ref), free(spread);
        if (!y) sg_clear_error(c);
    }
    char extra[32] = "";
    if (op == R_VAR) snprintf(extra, sizeof extra, ",correction=%d", corr);
    tu_case(ok, "%s(type=%s,x=%s,dims=%s%s,keepdim=%d,view=%s)", rop_names[op], sg_dtype_name(dt),
            tu_shape(ndim, shape, sh, sizeof sh), ndims || op != R_ARGMAX ? dl : "all", extra,
            (int)keepdim, tu_layout_name(layout));
    sg_release(x), sg_release(y);
    free(v);
}

/* A shape and the dims lists to reduce it over (ndims -1 ends the list). */
typedef struct shape_case {
    int ndim;
    int64_t shape[SG_MAX_DIMS];
    struct {
        int ndims;
        int dims[SG_MAX_DIMS];
    } d[7];
} shape_case;

static const shape_case small_cases[] = {
    {0, {0}, {{0, {0}}, {1, {0}}, {1, {-1}}, {-1, {0}}}},
    {1, {7}, {{0, {0}}, {1, {0}}, {1, {-1}}, {-1, {0}}}},
    {2, {4, 5}, {{1, {1}}, {1, {0}}, {1, {-1}}, {0, {0}}, {2, {0, 1}}, {-1, {0}}}},
    {3, {3, 1, 5}, {{2, {0, 2}}, {1, {1}}, {2, {-1, 0}}, {0, {0}}, {-1, {0}}}},
    {3, {2, 3, 4}, {{1, {1}}, {2, {0, 2}}, {2, {2, 1}}, {1, {-3}}, {-1, {0}}}},
    {4, {2, 3, 4, 5}, {{2, {0, 2}}, {2, {1, 3}}, {1, {3}}, {3, {0, 1, 2}}, {-1, {0}}}},
    {2, {0, 3}, {{1, {0}}, {1, {1}}, {0, {0}}, {-1, {0}}}},
    {3, {2, 0, 3}, {{1, {1}}, {2, {0, 2}}, {-1, {0}}}},
    {2, {1, 1}, {{0, {0}}, {1, {0}}, {-1, {0}}}},
    {2, {33, 300}, {{1, {1}}, {1, {0}}, {0, {0}}, {-1, {0}}}},
};

/* Big enough for several threads: rows, lanes, and chunked ranges. */
static const shape_case big_cases[] = {
    {2, {3, 20000}, {{1, {1}}, {1, {0}}, {0, {0}}, {-1, {0}}}},
    {2, {20000, 3}, {{1, {0}}, {1, {1}}, {-1, {0}}}},
    {2, {40000, 16}, {{1, {0}}, {-1, {0}}}},
    {3, {16, 50, 80}, {{2, {0, 2}}, {1, {1}}, {-1, {0}}}},
};

static void run_shapes(sg_ctx *c, const shape_case *cases, int ncases, const sg_dtype *dts,
                       int ndts, bool both_keepdims) {
    for (int ci = 0; ci < ncases; ci++)
        for (int di = 0; cases[ci].d[di].ndims >= 0; di++)
            for (int op = 0; op < R_NUM; op++)
                for (int t = 0; t < ndts; t++)
                    for (int l = 0; l < TU_NUM_LAYOUTS; l++)
                        for (int kd = both_keepdims ? 0 : 1; kd < 2; kd++) {
                            const shape_case *s = &cases[ci];
                            int nd = s->d[di].ndims;
                            if (!takes((rop)op, dts[t]) || (op == R_ARGMAX && nd > 1)) continue;
                            int corr = op == R_VAR ? (int)((ci + di + l) % 3) : 0;
                            run_case(c, (rop)op, dts[t], s->ndim, s->shape, nd, s->d[di].dims,
                                     kd == 0, (tu_layout)l, corr);
                        }
}

/* An expanded input (stride 0 along a broadcast dim) reduces like its copy;
 * along the repeats every element ties, so argmax gives 0 (the first). */
static void test_expanded(sg_dtype dt) {
    int64_t bshape[3] = {3, 1, 4}, shape[3] = {3, 5, 4};
    double *bv, v[60], ref[60], spread[60], *got;
    sg_tensor *b = tu_rand(ctx, dt, 3, bshape, -4, 4, &bv);
    sg_tensor *x = sg_expand(b, 3, shape);
    for (int i = 0; i < 60; i++) v[i] = bv[(i / 20) * 4 + i % 4];
    static const struct {
        rop op;
        int ndims, dims[2];
    } cases[] = {{R_SUM, 1, {1}},  {R_SUM, 2, {0, 1}}, {R_MAX, 2, {1, 2}},
                 {R_VAR, 1, {1}},  {R_ARGMAX, 1, {1}}, {R_MEAN, 0, {0}}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        rop op = cases[c].op;
        if (!takes(op, dt)) continue;
        uint32_t mask = mask_of(3, cases[c].ndims, cases[c].dims);
        reference(op, 3, shape, mask, v, 1, ref, spread);
        int64_t ks[SG_MAX_DIMS];
        expect_shape(3, shape, mask, true, ks);
        sg_tensor *y = call(op, x, cases[c].ndims, cases[c].dims, true, 1);
        sg_dtype odt = out_dtype(op, dt);
        bool ok = TU_EXPECT(y != NULL) && TU_EXPECT((got = tu_read(y)) != NULL) &&
                  TU_EXPECT(tu_close("values", got, ref, numel_of(3, ks), tu_rtol(odt),
                                     tu_atol(odt)));
        if (y) free(got);
        char dl[16] = "all";
        if (cases[c].ndims == 1) snprintf(dl, sizeof dl, "[%d]", cases[c].dims[0]);
        if (cases[c].ndims == 2)
            snprintf(dl, sizeof dl, "[%d,%d]", cases[c].dims[0], cases[c].dims[1]);
        tu_case(ok, "%s(type=%s,x=expand([3,1,4] to [3,5,4]),dims=%s,keepdim=1%s)", rop_names[op],
                sg_dtype_name(dt), dl, op == R_VAR ? ",correction=1" : "");
        sg_release(y);
    }
    sg_release(b), sg_release(x);
    free(bv);
}

/* ------------------------------------------------------------ exact rules */

static sg_tensor *from(sg_dtype dt, int ndim, const int64_t *shape, const double *v) {
    unsigned char buf[256];
    for (int64_t i = 0; i < numel_of(ndim, shape); i++) tu_store(buf, dt, i, v[i]);
    return sg_from_host(ctx, dt, ndim, shape, buf);
}

/* NaN is the max and the min (it propagates); argmax takes the first NaN. */
static void test_nan_and_ties(sg_dtype dt) {
    int64_t shape[2] = {2, 5};
    double v[10] = {1, NAN, 3, NAN, 2, 1, 5, 5, 2, -INFINITY};
    sg_tensor *x = from(dt, 2, shape, v);
    int d1 = 1;
    sg_tensor *mx = sg_max(x, 1, &d1, false), *mn = sg_min(x, 1, &d1, false);
    sg_tensor *am = sg_argmax(x, 1, false), *aa = sg_argmax(x, SG_ALL_DIMS, true);
    sg_tensor *sm = sg_sum(x, 1, &d1, false);
    double *a = tu_read(mx), *b = tu_read(mn), *c = tu_read(am), *e = tu_read(aa), *f = tu_read(sm);
    bool ok = TU_EXPECT(a && b && c && e && f) && TU_EXPECT(isnan(a[0]) && a[1] == 5) &&
              TU_EXPECT(isnan(b[0]) && b[1] == -INFINITY) && TU_EXPECT(c[0] == 1 && c[1] == 1) &&
              TU_EXPECT(sg_tensor_ndim(aa) == 2 && e[0] == 1) &&
              TU_EXPECT(isnan(f[0]) && f[1] == -INFINITY);
    tu_case(ok,
            "NAN_TIES(type=%s,x=[2,5]): max/min propagate NaN, argmax takes the first NaN "
            "and the first of equal maxima",
            sg_dtype_name(dt));
    free(a), free(b), free(c), free(e), free(f);
    sg_release(x), sg_release(mx), sg_release(mn), sg_release(am), sg_release(aa), sg_release(sm);
}

/* i64 sums and maxima are exact beyond 2^53; i32 sums widen to i64. */
static void test_exact_ints(void) {
    int64_t n3[1] = {3}, n4[1] = {4};
    int64_t big[3] = {(1ll << 53) + 1, 2, (1ll << 62) + 1};
    int32_t small[4] = {INT32_MAX, INT32_MAX, INT32_MAX, INT32_MAX};
    sg_tensor *x = sg_from_host(ctx, SG_I64, 1, n3, big),
              *y = sg_from_host(ctx, SG_I32, 1, n4, small);
    int d0 = 0, two[1] = {0};
    int64_t a = 0, b = 0, s = 0, at = -1;
    sg_tensor *sx = sg_slice(x, 0, 0, 2, 1), *ssum = sg_sum(sx, 1, two, false);
    sg_tensor *mx = sg_max(x, 1, &d0, false), *am = sg_argmax(x, 0, false),
              *sy = sg_sum(y, 0, NULL, false);
    bool ok = TU_EXPECT(ssum && sg_read(ssum, &a, 8) == SG_OK && a == (1ll << 53) + 3) &&
              TU_EXPECT(mx && sg_read(mx, &b, 8) == SG_OK && b == (1ll << 62) + 1) &&
              TU_EXPECT(am && sg_read(am, &at, 8) == SG_OK && at == 2) &&
              TU_EXPECT(sy && sg_tensor_dtype(sy) == SG_I64 && sg_read(sy, &s, 8) == SG_OK &&
                        s == 4ll * INT32_MAX);
    tu_case(ok, "EXACT_INTS(i64 sum 2^53+3, i64 max 2^62+1, i32 sum widened to i64)");
    sg_release(x), sg_release(y), sg_release(sx), sg_release(ssum), sg_release(mx), sg_release(am),
        sg_release(sy);
}

/* var with a divisor of 0 or below: inf, or NaN for 0/0; mean of none is NaN. */
static void test_var_edges(void) {
    int64_t s1[1] = {1}, s2[1] = {2}, s0[1] = {0};
    double one[1] = {3}, two[2] = {1, 2};
    sg_tensor *a = from(SG_F32, 1, s1, one), *b = from(SG_F32, 1, s2, two);
    sg_tensor *e = sg_zeros(ctx, SG_F32, 1, s0);
    sg_tensor *va = sg_var(a, 0, NULL, 1, false), *vb = sg_var(b, 0, NULL, 2, false);
    sg_tensor *vc = sg_var(b, 0, NULL, 0, false), *me = sg_mean(e, 0, NULL, false);
    sg_tensor *se = sg_sum(e, 0, NULL, true);
    double ra, rb, rc, rm, rs;
    bool ok = TU_EXPECT(va && sg_item(va, &ra) == SG_OK && isnan(ra)) &&
              TU_EXPECT(vb && sg_item(vb, &rb) == SG_OK && rb == INFINITY) &&
              TU_EXPECT(vc && sg_item(vc, &rc) == SG_OK && rc == 0.25) &&
              TU_EXPECT(me && sg_item(me, &rm) == SG_OK && isnan(rm)) &&
              TU_EXPECT(se && sg_tensor_ndim(se) == 1 && sg_item(se, &rs) == SG_OK && rs == 0);
    tu_case(ok, "VAR_EDGES(var of 1 with correction 1 is NaN, of 2 with correction 2 inf; "
                "mean of none NaN, sum of none 0)");
    sg_release(a), sg_release(b), sg_release(e), sg_release(va), sg_release(vb), sg_release(vc),
        sg_release(me), sg_release(se);
}

/* ------------------------------------------------------------ bad input */

/* After a failure the context must still run a valid op. */
static bool still_works(void) {
    sg_clear_error(ctx);
    int64_t shape[2] = {2, 3};
    sg_tensor *x = sg_full(ctx, SG_F32, 2, shape, 1.5);
    sg_tensor *s = sg_sum(x, 0, NULL, false);
    double v = 0;
    bool ok = TU_EXPECT(s && sg_item(s, &v) == SG_OK && v == 9.0) &&
              TU_EXPECT(sg_ctx_status(ctx) == SG_OK);
    sg_release(x), sg_release(s);
    return ok;
}

static bool expect_fail(sg_tensor *y, sg_status want, const char *op, const char *what) {
    const char *msg = sg_last_error(ctx);
    bool ok = TU_EXPECT(y == NULL) && TU_EXPECT(sg_ctx_status(ctx) == want) &&
              TU_EXPECT(strstr(msg, op) != NULL) && TU_EXPECT(strstr(msg, what) != NULL);
    if (!ok) fprintf(stderr, "  message: %s\n", msg);
    return ok;
}

static void test_bad_input(void) {
    int64_t s2[2] = {2, 3}, se[2] = {0, 3}, se2[2] = {2, 0};
    sg_tensor *f = sg_zeros(ctx, SG_F32, 2, s2), *i = sg_zeros(ctx, SG_I32, 2, s2);
    sg_tensor *bl = sg_zeros(ctx, SG_BOOL, 2, s2), *e = sg_zeros(ctx, SG_F32, 2, se);
    sg_tensor *e2 = sg_zeros(ctx, SG_F32, 2, se2), *z = sg_zeros(ctx, SG_F32, 0, NULL);
    int d2 = 2, dm3 = -3, dup[2] = {1, -1}, d0 = 0, d1 = 1;
#define BAD(call, st, op, what, label)                                                             \
    do {                                                                                           \
        bool ok_ = expect_fail(call, st, op, what);                                                \
        tu_case(still_works() && ok_, "BAD(%s)", label);                                           \
    } while (0)
    BAD(sg_mean(i, 0, NULL, false), SG_ERR_DTYPE, "sg_mean", "f32, f16 or bf16", "mean of i32");
    BAD(sg_var(i, 0, NULL, 1, false), SG_ERR_DTYPE, "sg_var", "i32", "var of i32");
    BAD(sg_sum(bl, 0, NULL, false), SG_ERR_DTYPE, "sg_sum", "bool", "sum of bool");
    BAD(sg_max(bl, 1, &d0, false), SG_ERR_DTYPE, "sg_max", "bool", "max of bool");
    BAD(sg_argmax(bl, 0, false), SG_ERR_DTYPE, "sg_argmax", "bool", "argmax of bool");
    BAD(sg_sum(f, 1, &d2, false), SG_ERR_INDEX, "sg_sum", "out of range", "sum dim 2 of 2-d");
    BAD(sg_min(f, 1, &dm3, false), SG_ERR_INDEX, "sg_min", "out of range", "min dim -3 of 2-d");
    BAD(sg_sum(z, 1, &d1, false), SG_ERR_INDEX, "sg_sum", "out of range", "sum dim 1 of 0-d");
    BAD(sg_argmax(f, 2, false), SG_ERR_INDEX, "sg_argmax", "out of range", "argmax dim 2 of 2-d");
    BAD(sg_sum(f, 2, dup, false), SG_ERR_INVALID_ARG, "sg_sum", "more than once", "dims [1,-1]");
    BAD(sg_mean(f, -1, NULL, false), SG_ERR_INVALID_ARG, "sg_mean", "ndims", "ndims -1");
    BAD(sg_sum(f, 1, NULL, false), SG_ERR_NULL, "sg_sum", "dims is NULL", "dims NULL, ndims 1");
    BAD(sg_max(e, 1, &d0, false), SG_ERR_SHAPE, "sg_max", "empty", "max over an empty dim");
    BAD(sg_min(e, 0, NULL, true), SG_ERR_SHAPE, "sg_min", "empty", "min of an empty tensor");
    BAD(sg_argmax(e2, 1, false), SG_ERR_SHAPE, "sg_argmax", "empty", "argmax over an empty dim");
    BAD(sg_argmax(e, SG_ALL_DIMS, false), SG_ERR_SHAPE, "sg_argmax", "empty", "argmax of empty");
#undef BAD
    /* A NULL input (an earlier failure) returns NULL without a new error. */
    bool ok = TU_EXPECT(sg_sum(NULL, 0, NULL, false) == NULL && sg_argmax(NULL, 0, true) == NULL) &&
              TU_EXPECT(sg_ctx_status(ctx) == SG_OK && sg_last_error(ctx)[0] == '\0');
    tu_case(still_works() && ok, "BAD(NULL input returns NULL, no new error)");
    sg_tensor *r = sg_zeros(ctx, SG_F32, 2, s2);
    sg_release(r);
    ok = expect_fail(sg_var(r, 0, NULL, 1, false), SG_ERR_RELEASED, "var", "released");
    tu_case(still_works() && ok, "BAD(released input)");
    sg_release(f), sg_release(i), sg_release(bl), sg_release(e), sg_release(e2), sg_release(z);
}

/* Every allocation a reduction makes may fail: the op returns NULL with
 * SG_ERR_OOM and holds on to nothing; once allocations succeed, so does the
 * op. Four threads make sum-of-all take the chunked path (its scratch). */
static bool oom_loop(sg_ctx *c, tu_alloc *a, sg_tensor *x, bool max_dim1, double want) {
    int d1 = 1;
    for (long k = 1; k < 40; k++) {
        long live = a->live;
        size_t bytes = a->bytes;
        a->fail_at = a->count + k;
        sg_tensor *y = max_dim1 ? sg_max(x, 1, &d1, false) : sg_sum(x, 0, NULL, false);
        a->fail_at = 0;
        if (y) {
            double *v = tu_read(y);
            bool ok = TU_EXPECT(v != NULL) && TU_EXPECT(sg_tensor_numel(y) == (max_dim1 ? 64 : 1));
            for (int64_t i = 0; ok && i < sg_tensor_numel(y); i++) ok = TU_EXPECT(v[i] == want);
            free(v);
            sg_release(y);
            return ok;
        }
        bool ok = TU_EXPECT(sg_ctx_status(c) == SG_ERR_OOM) &&
                  TU_EXPECT(strstr(sg_last_error(c), "memory") != NULL) &&
                  TU_EXPECT(a->live == live && a->bytes == bytes);
        sg_clear_error(c);
        if (!ok) return false;
    }
    return TU_EXPECT(!"the op never succeeded");
}

static void test_oom(void) {
    tu_alloc a = {0};
    sg_ctx *c;
    sg_ctx_opts o = {
        .backend = SG_BACKEND_CPU, .num_threads = 4, .alloc = tu_alloc_hook, .alloc_user = &a};
    if (sg_ctx_create(&o, &c) != SG_OK) {
        tu_case(false, "OOM(context)");
        return;
    }
    int64_t shape[2] = {64, 1024};
    sg_tensor *x = sg_full(c, SG_F32, 2, shape, 0.5);
    bool ok =
        TU_EXPECT(x != NULL) && oom_loop(c, &a, x, false, 32768.0) && oom_loop(c, &a, x, true, 0.5);
    sg_release(x);
    sg_ctx_destroy(c);
    ok = ok && TU_EXPECT(a.live == 0 && a.bytes == 0);
    tu_case(ok, "OOM(sum all and max dim 1 of f32[64,1024], failing each allocation in turn)");
}

int main(void) {
    ctx = tu_ctx((sg_ctx_opts){0});
    ctx_mt = tu_ctx((sg_ctx_opts){.num_threads = 5});
    tu_seed(7);
    const sg_dtype all[5] = {SG_F32, SG_F16, SG_BF16, SG_I32, SG_I64};
    const sg_dtype some[3] = {SG_F32, SG_BF16, SG_I64};
    run_shapes(ctx, small_cases, (int)(sizeof small_cases / sizeof *small_cases), all, 5, true);
    run_shapes(ctx_mt, big_cases, (int)(sizeof big_cases / sizeof *big_cases), some, 3, false);
    for (sg_dtype dt = SG_F32; dt <= SG_BF16; dt++) test_nan_and_ties(dt);
    for (sg_dtype dt = SG_F32; dt <= SG_I64; dt++) test_expanded(dt);
    test_exact_ints();
    test_var_edges();
    test_bad_input();
    test_oom();
    sg_ctx_destroy(ctx_mt);
    sg_ctx_destroy(ctx);
    return tu_finish();
}
