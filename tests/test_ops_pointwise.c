/* SPDX-License-Identifier: MIT */
/*
 * test_ops_pointwise.c -- the elementwise ops against references computed
 * here in f64 (or exactly, in integers): every unary op, cast between every
 * pair of dtypes, the scalar forms, the binary ops with broadcasting,
 * comparisons, logical ops and where, and the in-place copy_, fill_ and add_
 * (broadcast sources, dtype conversion, strided destinations, sources that
 * overlap the destination). Shapes cover 0-d scalars, size-1 dims, empty
 * tensors, rows longer than a tile and outputs large enough to use threads;
 * inputs come in the three layouts of tu_rand_layout. Bad input: each op's
 * dtype and shape rules, the status and message, and a usable context after.
 */
#include "testutil.h"

#include <float.h>
#include <math.h>
#include <string.h>

static sg_ctx *ctx;

/* ------------------------------------------------------------ shapes and indexing */

typedef struct shp {
    int nd;
    int64_t s[SG_MAX_DIMS];
} shp;

static int64_t numel(const shp *s) {
    int64_t n = 1;
    for (int d = 0; d < s->nd; d++) n *= s->s[d];
    return n;
}

static const char *shs(const shp *s, char *buf) { return tu_shape(s->nd, s->s, buf, 64); }

/* The element of `in` (row-major, broadcast to out) that out's element i reads. */
static int64_t bidx(int64_t i, const shp *out, const shp *in) {
    int64_t idx = 0, mul = 1;
    for (int d = out->nd - 1; d >= 0; d--) {
        int64_t k = i % out->s[d];
        i /= out->s[d];
        int di = d - (out->nd - in->nd);
        if (di < 0) continue;
        if (in->s[di] != 1) idx += k * mul;
        mul *= in->s[di];
    }
    return idx;
}

/* The broadcast of shapes (assumed compatible). */
static shp bshape(int n, const shp *const *ss) {
    shp o = {0, {0}};
    for (int k = 0; k < n; k++)
        if (ss[k]->nd > o.nd) o.nd = ss[k]->nd;
    for (int d = 0; d < o.nd; d++) o.s[d] = 1;
    for (int k = 0; k < n; k++)
        for (int d = 0; d < ss[k]->nd; d++) {
            int od = o.nd - ss[k]->nd + d;
            if (ss[k]->s[d] != 1) o.s[od] = ss[k]->s[d];
        }
    return o;
}

static shp rand_shape(void) {
    shp s = {(int)tu_randint(1, 4), {0}};
    for (int d = 0; d < s.nd; d++) s.s[d] = tu_randint(1, 6);
    return s;
}

/* Two shapes that broadcast: a random output, each input dropping leading
 * dims (down to 0-d) and setting dims to 1 at random. */
static void rand_pair(shp *a, shp *b) {
    shp o = rand_shape();
    shp *ab[2] = {a, b};
    for (int k = 0; k < 2; k++) {
        ab[k]->nd = (int)tu_randint(0, o.nd);
        for (int d = 0; d < ab[k]->nd; d++)
            ab[k]->s[d] = tu_randint(0, 2) == 0 ? 1 : o.s[o.nd - ab[k]->nd + d];
    }
}

/* Shapes for one input: scalar, empty, size-1 dims, rows longer than a tile. */
static const shp shapes1[] = {
    {0, {0}},       {1, {1}},       {1, {7}},   {1, {0}},      {2, {1, 1}},       {3, {3, 1, 5}},
    {3, {2, 3, 4}}, {3, {4, 0, 3}}, {1, {300}}, {2, {3, 257}}, {4, {2, 1, 3, 2}},
};
#define NSHAPES1 (int)(sizeof shapes1 / sizeof shapes1[0])
/* Large enough that the kernel runs on several threads. */
static const shp big1 = {2, {70, 520}};

/* Pairs for binary ops: broadcasting both ways, 0-d with n-d, empty. */
static const shp pairs[][2] = {
    {{3, {3, 1, 5}}, {2, {4, 5}}},
    {{0, {0}}, {2, {2, 3}}},
    {{2, {2, 3}}, {0, {0}}},
    {{0, {0}}, {0, {0}}},
    {{2, {4, 1}}, {2, {1, 6}}},
    {{2, {0, 3}}, {2, {1, 3}}},
    {{1, {1}}, {1, {0}}},
    {{3, {2, 1, 3}}, {3, {2, 4, 1}}},
    {{1, {300}}, {1, {300}}},
    {{2, {5, 260}}, {1, {260}}},
    {{4, {1, 2, 1, 3}}, {3, {2, 4, 1}}},
    {{2, {70, 520}}, {1, {520}}},
};
#define NPAIRS (int)(sizeof pairs / sizeof pairs[0])

/* ------------------------------------------------------------ inputs and checks */

static bool is_float(sg_dtype dt) { return dt == SG_F32 || dt == SG_F16 || dt == SG_BF16; }
static bool is_int(sg_dtype dt) { return dt == SG_I32 || dt == SG_I64; }

static sg_tensor *rin(sg_dtype dt, const shp *s, double lo, double hi, tu_layout lay, double **v) {
    return tu_rand_layout(ctx, dt, s->nd, s->s, lo, hi, lay, v);
}

/* A generator of one input value for dt. */
typedef double (*gen_fn)(sg_dtype dt);

/* Like rin, but with values from gen, written through sg_write. */
static sg_tensor *gin(sg_dtype dt, const shp *s, tu_layout lay, gen_fn gen, double **v) {
    sg_tensor *t = tu_rand_layout(ctx, dt, s->nd, s->s, 0, 1, lay, NULL);
    int64_t n = numel(s);
    size_t es = sg_dtype_size(dt);
    unsigned char *buf = malloc((size_t)(n + 1) * es);
    double *vals = malloc((size_t)(n + 1) * sizeof(double));
    for (int64_t i = 0; i < n; i++) {
        tu_store(buf, dt, i, gen(dt));
        vals[i] = tu_load(buf, dt, i);
    }
    if (sg_write(t, buf, (size_t)n * es) != SG_OK) fprintf(stderr, "  sg_write failed\n");
    free(buf);
    *v = vals;
    return t;
}

/* Small discrete values, so that comparisons see equal elements; NaN and
 * -0.0 among the floats. */
static double gen_discrete(sg_dtype dt) {
    if (dt == SG_BOOL) return (double)tu_randint(0, 1);
    if (is_int(dt)) return (double)tu_randint(-2, 2);
    int64_t k = tu_randint(0, 11);
    return k == 10 ? NAN : k == 11 ? -0.0 : (double)(k - 5) * 0.5;
}

/* y has dtype dt and shape s, and its values are ref's within dt's tolerance
 * (integers and bools exactly). */
static bool check(sg_tensor *y, sg_dtype dt, const shp *s, const double *ref) {
    if (!y) {
        fprintf(stderr, "  the op failed: %s\n", sg_last_error(ctx));
        sg_clear_error(ctx);
        return false;
    }
    int64_t shape[SG_MAX_DIMS];
    bool ok = TU_EXPECT(sg_tensor_dtype(y) == dt) && TU_EXPECT(sg_tensor_ndim(y) == s->nd) &&
              TU_EXPECT(sg_tensor_shape(y, shape) == SG_OK) &&
              TU_EXPECT(memcmp(shape, s->s, sizeof(int64_t) * (size_t)s->nd) == 0);
    if (!ok) return false;
    double *got = tu_read(y);
    ok = TU_EXPECT(got != NULL) &&
         tu_close(sg_dtype_name(dt), got, ref, numel(s), tu_rtol(dt), tu_atol(dt));
    free(got);
    return ok;
}

static double *dalloc(int64_t n) { return malloc((size_t)(n + 1) * sizeof(double)); }

/* ------------------------------------------------------------ unary */

static double r_neg(double x) { return -x; }
static double r_abs(double x) { return fabs(x); }
static double r_rsqrt(double x) { return 1.0 / sqrt(x); }
static double r_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }
static double r_relu(double x) { return x != x ? x : x > 0 ? x : 0; } /* NaN stays */
static double r_gelu(double x) { return 0.5 * x * (1.0 + erf(x / sqrt(2.0))); }
static double r_gelu_tanh(double x) {
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / 3.14159265358979323846) * (x + 0.044715 * x * x * x)));
}
static double r_silu(double x) { return x / (1.0 + exp(-x)); }

typedef struct unop {
    const char *name;
    sg_tensor *(*fn)(sg_tensor *);
    double (*ref)(double);
    double lo, hi;
    bool ints; /* also takes i32/i64 */
} unop;

static const unop unops[] = {
    {"NEG", sg_neg, r_neg, -4, 4, true},
    {"ABS", sg_abs, r_abs, -4, 4, true},
    {"EXP", sg_exp, exp, -5, 5, false},
    {"LOG", sg_log, log, 0.05, 20, false},
    {"SQRT", sg_sqrt, sqrt, 0.01, 20, false},
    {"RSQRT", sg_rsqrt, r_rsqrt, 0.05, 20, false},
    {"SIN", sg_sin, sin, -6, 6, false},
    {"COS", sg_cos, cos, -6, 6, false},
    {"TANH", sg_tanh, tanh, -4, 4, false},
    {"SIGMOID", sg_sigmoid, r_sigmoid, -8, 8, false},
    {"RELU", sg_relu, r_relu, -4, 4, true},
    {"GELU", sg_gelu, r_gelu, -5, 5, false},
    {"GELU_TANH", sg_gelu_tanh, r_gelu_tanh, -5, 5, false},
    {"SILU", sg_silu, r_silu, -8, 8, false},
};
#define NUNOPS (int)(sizeof unops / sizeof unops[0])

static void unary_case(const unop *op, sg_dtype dt, const shp *s, tu_layout lay) {
    if (!tu_sampled()) return;
    double *v;
    bool ints = is_int(dt);
    sg_tensor *x = rin(dt, s, ints ? -1000 : op->lo, ints ? 1000 : op->hi, lay, &v);
    int64_t n = numel(s);
    double *ref = dalloc(n);
    for (int64_t i = 0; i < n; i++) ref[i] = op->ref(v[i]);
    sg_tensor *y = op->fn(x);
    char b[64];
    tu_case(check(y, dt, s, ref), "%s(type=%s,x=%s,view=%s)", op->name, sg_dtype_name(dt),
            shs(s, b), tu_layout_name(lay));
    sg_release(x), sg_release(y);
    free(v), free(ref);
}

static void test_unary(void) {
    static const sg_dtype dts[] = {SG_F32, SG_F16, SG_BF16, SG_I32, SG_I64};
    for (int o = 0; o < NUNOPS; o++)
        for (int k = 0; k < 5; k++) {
            if (is_int(dts[k]) && !unops[o].ints) continue;
            for (int si = 0; si < NSHAPES1 + 3; si++) {
                shp s = si < NSHAPES1 ? shapes1[si] : rand_shape();
                for (int l = 0; l < TU_NUM_LAYOUTS; l++) unary_case(&unops[o], dts[k], &s, l);
            }
            unary_case(&unops[o], dts[k], &big1, (tu_layout)(o % TU_NUM_LAYOUTS));
        }
}

/* NaN in, NaN out (relu, abs and the rest), infinities, signed zeros and
 * overflow, 16 of them so that vectorized loops see them too. The reference
 * is rounded to the dtype (exp(100) is inf in f32). */
static void test_unary_special(void) {
    static const sg_dtype dts[] = {SG_F32, SG_F16, SG_BF16};
    static const double in[16] = {NAN,  -NAN, 1.0,   INFINITY, -INFINITY, 0.0,  -0.0, 30.0,
                                  -30., 100., -100., 0.5,      2.0,       -2.0, 1e-3, NAN};
    for (int k = 0; k < 3; k++)
        for (int o = 0; o < NUNOPS; o++) {
            unsigned char buf[16 * 4];
            double ref[16];
            for (int i = 0; i < 16; i++) {
                tu_store(buf, dts[k], i, in[i]);
                ref[i] = tu_round(dts[k], unops[o].ref(tu_load(buf, dts[k], i)));
            }
            int64_t n = 16;
            sg_tensor *x = sg_from_host(ctx, dts[k], 1, &n, buf);
            sg_tensor *y = unops[o].fn(x);
            shp s = {1, {16}};
            tu_case(check(y, dts[k], &s, ref),
                    "%s_SPECIAL(type=%s,x=[nan,-nan,1,inf,-inf,0,-0,"
                    "30,-30,100,-100,0.5,2,-2,1e-3,nan])",
                    unops[o].name, sg_dtype_name(dts[k]));
            sg_release(x), sg_release(y);
        }
}

/* ------------------------------------------------------------ scalar forms */

/* What an int op does with its scalar: truncation toward zero. */
static double as_scalar(sg_dtype dt, double s) { return is_float(dt) ? s : trunc(s); }

typedef struct scop {
    const char *name;
    int kind; /* 0 add, 1 mul, 2 pow, 3 clamp */
    double s0, s1;
    double lo, hi; /* input range for floats */
} scop;

static const scop scops[] = {
    {"ADD_SCALAR", 0, 2.5, 0, -4, 4},  {"ADD_SCALAR", 0, -1.75, 0, -4, 4},
    {"MUL_SCALAR", 1, 2.5, 0, -4, 4},  {"MUL_SCALAR", 1, -1.75, 0, -4, 4},
    {"MUL_SCALAR", 1, 0.0, 0, -4, 4},  {"POW_SCALAR", 2, 2.0, 0, 0.5, 3},
    {"POW_SCALAR", 2, 0.5, 0, 0.5, 3}, {"POW_SCALAR", 2, -1.5, 0, 0.5, 3},
    {"POW_SCALAR", 2, 3.0, 0, 0.5, 3}, {"CLAMP", 3, -0.5, 0.75, -2, 2},
    {"CLAMP", 3, -3.7, 5.2, -8, 8},    {"CLAMP", 3, -INFINITY, 2.0, -4, 4},
    {"CLAMP", 3, -1e30, 1e30, -4, 4},  {"CLAMP", 3, 1.0, INFINITY, -4, 4},
    {"CLAMP", 3, 1.5, 1.5, -4, 4},
};
#define NSCOPS (int)(sizeof scops / sizeof scops[0])

static double scalar_ref(const scop *op, sg_dtype dt, double x) {
    double s0 = as_scalar(dt, op->s0), s1 = as_scalar(dt, op->s1);
    switch (op->kind) {
    case 0: return x + s0;
    case 1: return x * s0;
    case 2: return pow(x, s0);
    default: return x < s0 ? s0 : x > s1 ? s1 : x;
    }
}

static sg_tensor *scalar_run(const scop *op, sg_tensor *x) {
    switch (op->kind) {
    case 0: return sg_add_scalar(x, op->s0);
    case 1: return sg_mul_scalar(x, op->s0);
    case 2: return sg_pow_scalar(x, op->s0);
    default: return sg_clamp(x, op->s0, op->s1);
    }
}

static void test_scalar(void) {
    static const sg_dtype dts[] = {SG_F32, SG_F16, SG_BF16, SG_I32, SG_I64};
    for (int o = 0; o < NSCOPS; o++)
        for (int k = 0; k < 5; k++) {
            sg_dtype dt = dts[k];
            if (scops[o].kind == 2 && !is_float(dt)) continue;
            for (int si = 0; si < NSHAPES1 + 1; si++) {
                if (!tu_sampled()) continue;
                const shp *s = si < NSHAPES1 ? &shapes1[si] : &big1;
                tu_layout lay = (tu_layout)((si + o) % TU_NUM_LAYOUTS);
                double *v;
                sg_tensor *x = is_float(dt) ? rin(dt, s, scops[o].lo, scops[o].hi, lay, &v)
                                            : rin(dt, s, -100, 100, lay, &v);
                int64_t n = numel(s);
                double *ref = dalloc(n);
                for (int64_t i = 0; i < n; i++) ref[i] = scalar_ref(&scops[o], dt, v[i]);
                sg_tensor *y = scalar_run(&scops[o], x);
                char b[64];
                tu_case(check(y, dt, s, ref), "%s(type=%s,x=%s,s=%g,%g,view=%s)", scops[o].name,
                        sg_dtype_name(dt), shs(s, b), scops[o].s0, scops[o].s1,
                        tu_layout_name(lay));
                sg_release(x), sg_release(y);
                free(v), free(ref);
            }
        }
}

/* clamp lets NaN through, as PyTorch does. */
static void test_clamp_nan(void) {
    for (int k = 0; k < 3; k++) {
        sg_dtype dt = k == 0 ? SG_F32 : k == 1 ? SG_F16 : SG_BF16;
        int64_t n = 4;
        unsigned char buf[16];
        double in[4] = {NAN, -5, 0.25, 5};
        for (int i = 0; i < 4; i++) tu_store(buf, dt, i, in[i]);
        sg_tensor *x = sg_from_host(ctx, dt, 1, &n, buf);
        sg_tensor *y = sg_clamp(x, -1, 1);
        shp s = {1, {4}};
        double ref[4] = {NAN, -1, 0.25, 1};
        tu_case(check(y, dt, &s, ref), "CLAMP_NAN(type=%s,x=[nan,-5,0.25,5],lo=-1,hi=1)",
                sg_dtype_name(dt));
        sg_release(x), sg_release(y);
    }
}

/* ------------------------------------------------------------ binary */

static double r_add(double a, double b) { return a + b; }
static double r_sub(double a, double b) { return a - b; }
static double r_mul(double a, double b) { return a * b; }
static double r_div(double a, double b) { return a / b; }
/* maximum/minimum propagate NaN from either side. */
static double r_max(double a, double b) { return a != a || b != b ? NAN : a > b ? a : b; }
static double r_min(double a, double b) { return a != a || b != b ? NAN : a < b ? a : b; }

typedef struct binop {
    const char *name;
    sg_tensor *(*fn)(sg_tensor *, sg_tensor *);
    double (*ref)(double, double);
    double alo, ahi, blo, bhi;
    bool ints;
} binop;

static const binop binops[] = {
    {"ADD", sg_add, r_add, -4, 4, -4, 4, true},
    {"SUB", sg_sub, r_sub, -4, 4, -4, 4, true},
    {"MUL", sg_mul, r_mul, -4, 4, -4, 4, true},
    {"DIV", sg_div, r_div, -4, 4, 0.5, 4, false},
    {"POW", sg_pow, pow, 0.5, 3, -2, 2, false},
    {"MAXIMUM", sg_maximum, r_max, -4, 4, -4, 4, true},
    {"MINIMUM", sg_minimum, r_min, -4, 4, -4, 4, true},
};
#define NBINOPS (int)(sizeof binops / sizeof binops[0])

/* One binary case; gen (may be NULL) replaces the uniform inputs. */
static void binary_case(const char *name, sg_tensor *(*fn)(sg_tensor *, sg_tensor *),
                        double (*ref_fn)(double, double), const double *range, sg_dtype dt,
                        sg_dtype out_dt, const shp *sa, const shp *sb, tu_layout la, tu_layout lb,
                        gen_fn gen) {
    if (!tu_sampled()) return;
    double *va, *vb;
    bool ints = !is_float(dt);
    sg_tensor *a = gen ? gin(dt, sa, la, gen, &va)
                       : rin(dt, sa, ints ? -50 : range[0], ints ? 50 : range[1], la, &va);
    sg_tensor *b = gen ? gin(dt, sb, lb, gen, &vb)
                       : rin(dt, sb, ints ? -50 : range[2], ints ? 50 : range[3], lb, &vb);
    const shp *ab[2] = {sa, sb};
    shp so = bshape(2, ab);
    int64_t n = numel(&so);
    double *ref = dalloc(n);
    for (int64_t i = 0; i < n; i++) ref[i] = ref_fn(va[bidx(i, &so, sa)], vb[bidx(i, &so, sb)]);
    sg_tensor *y = fn(a, b);
    char b1[64], b2[64];
    tu_case(check(y, out_dt, &so, ref), "%s(type=%s,a=%s,b=%s,view=%s,%s)", name, sg_dtype_name(dt),
            shs(sa, b1), shs(sb, b2), tu_layout_name(la), tu_layout_name(lb));
    sg_release(a), sg_release(b), sg_release(y);
    free(va), free(vb), free(ref);
}

static double gen_with_nan(sg_dtype dt) {
    int64_t k = tu_randint(0, 5);
    return k == 0 ? NAN : k == 1 ? INFINITY : k == 2 ? -INFINITY : tu_uniform(-4, 4);
    (void)dt;
}

static void test_binary(void) {
    static const sg_dtype dts[] = {SG_F32, SG_F16, SG_BF16, SG_I32, SG_I64};
    for (int o = 0; o < NBINOPS; o++) {
        const binop *op = &binops[o];
        double range[4] = {op->alo, op->ahi, op->blo, op->bhi};
        for (int k = 0; k < 5; k++) {
            if (is_int(dts[k]) && !op->ints) continue;
            for (int p = 0; p < NPAIRS + 4; p++) {
                shp sa, sb;
                if (p < NPAIRS)
                    sa = pairs[p][0], sb = pairs[p][1];
                else
                    rand_pair(&sa, &sb);
                for (int la = 0; la < TU_NUM_LAYOUTS; la++) {
                    if (p == NPAIRS - 1 && la > 0) break; /* the threaded one once */
                    binary_case(op->name, op->fn, op->ref, range, dts[k], dts[k], &sa, &sb, la,
                                (tu_layout)((la + p) % TU_NUM_LAYOUTS), NULL);
                }
            }
            /* NaN and infinities through maximum/minimum and arithmetic. */
            if (is_float(dts[k]) && o != 4)
                for (int p = 0; p < 6; p++)
                    binary_case(o == 5   ? "MAXIMUM_NAN"
                                : o == 6 ? "MINIMUM_NAN"
                                         : "NAN_INF",
                                op->fn, op->ref, range, dts[k], dts[k], &pairs[p][0], &pairs[p][1],
                                p % 3, (p + 1) % 3, gen_with_nan);
        }
    }
}

/* Integer arithmetic wraps (two's complement), as in PyTorch. */
static void test_int_wrap(void) {
    int32_t a32[4] = {INT32_MAX, INT32_MIN, 65536, -7}, b32[4] = {1, -1, 65536, 3};
    int64_t a64[4] = {INT64_MAX, INT64_MIN, (int64_t)1 << 32, -7};
    int64_t b64[4] = {1, -1, (int64_t)1 << 32, 3}, n = 4;
    sg_tensor *x32 = sg_from_host(ctx, SG_I32, 1, &n, a32),
              *y32 = sg_from_host(ctx, SG_I32, 1, &n, b32);
    sg_tensor *x64 = sg_from_host(ctx, SG_I64, 1, &n, a64),
              *y64 = sg_from_host(ctx, SG_I64, 1, &n, b64);
    sg_tensor *s32 = sg_add(x32, y32), *m32 = sg_mul(x32, y32), *n32 = sg_neg(x32),
              *a32t = sg_abs(x32);
    sg_tensor *s64 = sg_add(x64, y64), *m64 = sg_mul(x64, y64), *n64 = sg_neg(x64);
    int32_t g[4][4];
    int64_t h[3][4];
    bool ok =
        TU_EXPECT(sg_read(s32, g[0], 16) == SG_OK) && TU_EXPECT(sg_read(m32, g[1], 16) == SG_OK) &&
        TU_EXPECT(sg_read(n32, g[2], 16) == SG_OK) && TU_EXPECT(sg_read(a32t, g[3], 16) == SG_OK) &&
        TU_EXPECT(sg_read(s64, h[0], 32) == SG_OK) && TU_EXPECT(sg_read(m64, h[1], 32) == SG_OK) &&
        TU_EXPECT(sg_read(n64, h[2], 32) == SG_OK);
    ok = ok && TU_EXPECT(g[0][0] == INT32_MIN && g[0][1] == INT32_MAX && g[0][2] == 131072);
    ok = ok && TU_EXPECT(g[1][2] == 0 && g[1][3] == -21 && g[1][1] == INT32_MIN);
    ok = ok && TU_EXPECT(g[2][1] == INT32_MIN && g[2][0] == -INT32_MAX && g[3][1] == INT32_MIN);
    ok = ok && TU_EXPECT(h[0][0] == INT64_MIN && h[0][1] == INT64_MAX && h[1][2] == 0);
    ok = ok && TU_EXPECT(h[1][3] == -21 && h[2][1] == INT64_MIN && h[2][0] == -INT64_MAX);
    tu_case(ok, "INT_WRAP(type=i32,i64,ops=add,mul,neg,abs,x=[max,min,2^16|2^32,-7])");
    sg_tensor *all[] = {x32, y32, x64, y64, s32, m32, n32, a32t, s64, m64, n64};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) sg_release(all[i]);
}

/* ------------------------------------------------------------ comparisons, logical, where */

static double r_eq(double a, double b) { return a == b; }
static double r_ne(double a, double b) { return a != b; }
static double r_lt(double a, double b) { return a < b; }
static double r_le(double a, double b) { return a <= b; }
static double r_gt(double a, double b) { return a > b; }
static double r_ge(double a, double b) { return a >= b; }
static double r_and(double a, double b) { return a != 0 && b != 0; }
static double r_or(double a, double b) { return a != 0 || b != 0; }

static void test_compare(void) {
    static const struct {
        const char *name;
        sg_tensor *(*fn)(sg_tensor *, sg_tensor *);
        double (*ref)(double, double);
    } cmps[] = {{"EQ", sg_eq, r_eq}, {"NE", sg_ne, r_ne}, {"LT", sg_lt, r_lt},
                {"LE", sg_le, r_le}, {"GT", sg_gt, r_gt}, {"GE", sg_ge, r_ge}};
    for (int o = 0; o < 6; o++)
        for (sg_dtype dt = SG_F32; dt <= SG_BOOL; dt++)
            for (int p = 0; p < NPAIRS; p++)
                for (int la = 0; la < TU_NUM_LAYOUTS; la++) {
                    if (p == NPAIRS - 1 && la > 0) break;
                    binary_case(cmps[o].name, cmps[o].fn, cmps[o].ref, NULL, dt, SG_BOOL,
                                &pairs[p][0], &pairs[p][1], la,
                                (tu_layout)((la + p) % TU_NUM_LAYOUTS), gen_discrete);
                }
}

/* A logical op on mixed dtypes: binary_case assumes one dtype, so this one
 * makes its own inputs. */
static void logical_case(int which, sg_dtype da, sg_dtype db, const shp *sa, const shp *sb,
                         tu_layout la, tu_layout lb) {
    if (!tu_sampled()) return;
    double *va, *vb = NULL;
    sg_tensor *a = gin(da, sa, la, gen_discrete, &va);
    sg_tensor *b = which < 2 ? gin(db, sb, lb, gen_discrete, &vb) : NULL;
    const shp *ab[2] = {sa, sb};
    shp so = which < 2 ? bshape(2, ab) : *sa;
    int64_t n = numel(&so);
    double *ref = dalloc(n);
    for (int64_t i = 0; i < n; i++)
        ref[i] = which == 2   ? va[i] == 0
                 : which == 0 ? r_and(va[bidx(i, &so, sa)], vb[bidx(i, &so, sb)])
                              : r_or(va[bidx(i, &so, sa)], vb[bidx(i, &so, sb)]);
    sg_tensor *y = which == 0   ? sg_logical_and(a, b)
                   : which == 1 ? sg_logical_or(a, b)
                                : sg_logical_not(a);
    char b1[64], b2[64];
    static const char *names[] = {"LOGICAL_AND", "LOGICAL_OR", "LOGICAL_NOT"};
    if (which < 2)
        tu_case(check(y, SG_BOOL, &so, ref), "%s(type=%s,%s,a=%s,b=%s,view=%s,%s)", names[which],
                sg_dtype_name(da), sg_dtype_name(db), shs(sa, b1), shs(sb, b2), tu_layout_name(la),
                tu_layout_name(lb));
    else
        tu_case(check(y, SG_BOOL, &so, ref), "%s(type=%s,x=%s,view=%s)", names[which],
                sg_dtype_name(da), shs(sa, b1), tu_layout_name(la));
    sg_release(a), sg_release(b), sg_release(y);
    free(va), free(vb), free(ref);
}

static void test_logical(void) {
    static const sg_dtype dps[][2] = {{SG_BOOL, SG_BOOL}, {SG_F32, SG_F32},  {SG_I32, SG_I64},
                                      {SG_F16, SG_BOOL},  {SG_BF16, SG_I32}, {SG_I64, SG_F32}};
    for (int w = 0; w < 2; w++)
        for (int k = 0; k < 6; k++)
            for (int p = 0; p < NPAIRS; p++)
                logical_case(w, dps[k][0], dps[k][1], &pairs[p][0], &pairs[p][1], p % 3,
                             (p + k) % 3);
    for (sg_dtype dt = SG_F32; dt <= SG_BOOL; dt++)
        for (int si = 0; si < NSHAPES1; si++)
            logical_case(2, dt, dt, &shapes1[si], &shapes1[si], si % 3, 0);
}

static const shp triples[][3] = {
    {{3, {3, 1, 5}}, {2, {4, 5}}, {1, {5}}},  {{0, {0}}, {2, {2, 3}}, {0, {0}}},
    {{2, {2, 3}}, {2, {2, 3}}, {2, {2, 3}}},  {{2, {4, 1}}, {1, {1}}, {2, {1, 6}}},
    {{2, {0, 2}}, {1, {2}}, {2, {1, 2}}},     {{1, {1}}, {2, {3, 1}}, {2, {1, 4}}},
    {{2, {2, 300}}, {1, {300}}, {2, {2, 1}}}, {{1, {520}}, {2, {70, 1}}, {2, {70, 520}}},
};
#define NTRIPLES (int)(sizeof triples / sizeof triples[0])

static void where_case(sg_dtype dt, const shp *const *ss, const tu_layout *lay) {
    if (!tu_sampled()) return;
    double *vc, *va, *vb;
    sg_tensor *c = rin(SG_BOOL, ss[0], 0, 1, lay[0], &vc);
    sg_tensor *a =
        is_float(dt) ? rin(dt, ss[1], -4, 4, lay[1], &va) : rin(dt, ss[1], -50, 50, lay[1], &va);
    sg_tensor *b =
        is_float(dt) ? rin(dt, ss[2], -4, 4, lay[2], &vb) : rin(dt, ss[2], -50, 50, lay[2], &vb);
    shp so = bshape(3, ss);
    int64_t n = numel(&so);
    double *ref = dalloc(n);
    for (int64_t i = 0; i < n; i++)
        ref[i] = vc[bidx(i, &so, ss[0])] != 0 ? va[bidx(i, &so, ss[1])] : vb[bidx(i, &so, ss[2])];
    sg_tensor *y = sg_where(c, a, b);
    char b0[64], b1[64], b2[64];
    tu_case(check(y, dt, &so, ref), "WHERE(type=%s,cond=%s,a=%s,b=%s,view=%s,%s,%s)",
            sg_dtype_name(dt), shs(ss[0], b0), shs(ss[1], b1), shs(ss[2], b2),
            tu_layout_name(lay[0]), tu_layout_name(lay[1]), tu_layout_name(lay[2]));
    sg_release(c), sg_release(a), sg_release(b), sg_release(y);
    free(vc), free(va), free(vb), free(ref);
}

static void test_where(void) {
    for (sg_dtype dt = SG_F32; dt <= SG_BOOL; dt++)
        for (int t = 0; t < NTRIPLES; t++)
            for (int l = 0; l < TU_NUM_LAYOUTS; l++) {
                const shp *ss[3] = {&triples[t][0], &triples[t][1], &triples[t][2]};
                tu_layout lay[3] = {l, (tu_layout)((l + 1) % 3), (tu_layout)((l + t) % 3)};
                where_case(dt, ss, lay);
            }
}

/* ------------------------------------------------------------ cast */

/* One element, exactly: a double for the float dtypes, an int64 for ints and
 * bool (i64 values beyond 2^53 do not survive a double). */
typedef struct elem {
    double f;
    int64_t i;
} elem;

static void put(void *buf, sg_dtype dt, int64_t k, elem e) {
    switch (dt) {
    case SG_I32: ((int32_t *)buf)[k] = (int32_t)(uint32_t)(uint64_t)e.i; break;
    case SG_I64: ((int64_t *)buf)[k] = e.i; break;
    case SG_BOOL: ((uint8_t *)buf)[k] = e.i != 0; break;
    default: tu_store(buf, dt, k, e.f); break;
    }
}

static elem get(const void *buf, sg_dtype dt, int64_t k) {
    elem e = {0, 0};
    switch (dt) {
    case SG_I32: e.i = ((const int32_t *)buf)[k]; break;
    case SG_I64: e.i = ((const int64_t *)buf)[k]; break;
    case SG_BOOL: e.i = ((const uint8_t *)buf)[k] != 0; break;
    default: e.f = tu_load(buf, dt, k); break;
    }
    return e;
}

static bool elem_eq(sg_dtype dt, elem got, elem ref) {
    if (!is_float(dt)) return got.i == ref.i;
    if (ref.f != ref.f) return got.f != got.f;
    return got.f == ref.f && signbit(got.f) == signbit(ref.f);
}

/* Float to int: toward zero, saturating at the range, NaN to 0. */
static int64_t sat_trunc(double v, int bits) {
    if (v != v) return 0;
    double lim = ldexp(1.0, bits - 1);
    if (v >= lim) return bits == 32 ? INT32_MAX : INT64_MAX;
    if (v <= -lim) return bits == 32 ? INT32_MIN : INT64_MIN;
    return (int64_t)trunc(v);
}

/* An integer rounded to dt (round to nearest even), by integer arithmetic. */
static double int_to_float(int64_t v, sg_dtype dt) {
    int p = dt == SG_F32 ? 24 : dt == SG_F16 ? 11 : 8;
    uint64_t u = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
    int len = 0;
    while (len < 64 && (u >> len)) len++;
    int s = len > p ? len - p : 0;
    uint64_t q = u >> s;
    if (s > 0) {
        uint64_t rem = u & ((1ull << s) - 1), half = 1ull << (s - 1);
        if (rem > half || (rem == half && (q & 1))) q++;
    }
    double r = ldexp((double)q, s);
    double maxv = dt == SG_F16 ? 65504.0 : dt == SG_BF16 ? 3.3895313892515355e38 : FLT_MAX;
    if (r > maxv) r = INFINITY;
    return v < 0 ? -r : r;
}

/* What converting x from `from` to `to` must give. */
static elem convert_ref(sg_dtype from, elem x, sg_dtype to) {
    elem r = {0, 0};
    if (is_float(from)) {
        double v = x.f;
        if (is_float(to))
            r.f = tu_round(to, v);
        else if (to == SG_BOOL)
            r.i = v != 0; /* NaN is nonzero */
        else
            r.i = sat_trunc(v, to == SG_I32 ? 32 : 64);
    } else {
        int64_t v = x.i;
        if (is_float(to))
            r.f = int_to_float(v, to);
        else if (to == SG_I32)
            r.i = (int32_t)(uint32_t)(uint64_t)v; /* wraps, as in PyTorch */
        else if (to == SG_BOOL)
            r.i = v != 0;
        else
            r.i = v;
    }
    return r;
}

static const double float_specials[] = {
    0.0,           -0.0,          0.5,           -0.5,         1.5,        -1.5,   2.5,
    -2.7,          0.999,         -0.999,        1e-6,         6e-8,       3e-5,   65504,
    65519,         65520,         -65520,        1e5,          1e10,       -1e10,  2147483520.0,
    2147483648.0,  -2147483648.0, -2147483904.0, 4294967296.0, 1e19,       -1e19,  9.2233715e18,
    1e30,          -1e30,         INFINITY,      -INFINITY,    NAN,        3.4e38, 1e-40,
    1.00048828125, 1.00146484375, 1.00390625,    1.01171875,   16842753.0, 255.5,  -128.5,
};
static const int64_t int_specials[] = {
    0,
    1,
    -1,
    2,
    INT32_MAX,
    INT32_MIN,
    2049,
    2051,
    -2049,
    65504,
    65519,
    65520,
    65535,
    16777217,
    16842753,
    -16842753,
    16908289,
    33554435,
    (int64_t)1 << 40,
    ((int64_t)1 << 40) + 1,
    ((int64_t)1 << 53) + 1,
    ((int64_t)1 << 62) + ((int64_t)1 << 38) + 1,
    INT64_MAX,
    INT64_MIN,
    -((int64_t)1 << 60) - ((int64_t)1 << 52) - 1,
    4294967296 + 7,
    -4294967296 - 7,
};
#define NFS (int)(sizeof float_specials / sizeof float_specials[0])
#define NIS (int)(sizeof int_specials / sizeof int_specials[0])

/* Source element k of dt: the specials first, then random values. */
static elem cast_source(sg_dtype dt, int64_t k) {
    elem e = {0, 0};
    if (dt == SG_BOOL) {
        e.i = k < 2 ? k : (int64_t)(tu_next() & 1);
    } else if (is_int(dt)) {
        e.i = k < NIS        ? int_specials[k]
              : dt == SG_I32 ? tu_randint(INT32_MIN, INT32_MAX)
                             : (int64_t)tu_next() >> tu_randint(0, 40);
    } else if (k < NFS) {
        e.f = float_specials[k];
    } else {
        int64_t kind = tu_randint(0, 2);
        double s = tu_uniform(-1, 1) < 0 ? -1 : 1;
        e.f = kind == 0   ? tu_uniform(-300, 300)
              : kind == 1 ? s * ldexp(tu_uniform(1, 2), (int)tu_randint(-30, 70))
                          : s * (double)tu_randint(0, 70000) * 0.25;
    }
    return e;
}

/* x (from) -> sg_cast(x, to), compared exactly with convert_ref. */
static void cast_case(sg_dtype from, sg_dtype to, const shp *s, tu_layout lay) {
    if (!tu_sampled()) return;
    int64_t n = numel(s);
    size_t fs = sg_dtype_size(from), ts = sg_dtype_size(to);
    unsigned char *src = malloc((size_t)(n + 1) * fs), *dst = malloc((size_t)(n + 1) * ts);
    for (int64_t k = 0; k < n; k++) put(src, from, k, cast_source(from, k));
    sg_tensor *x = tu_rand_layout(ctx, from, s->nd, s->s, 0, 1, lay, NULL);
    bool ok = TU_EXPECT(sg_write(x, src, (size_t)n * fs) == SG_OK);
    sg_tensor *y = sg_cast(x, to);
    ok = ok && TU_EXPECT(y != NULL) && TU_EXPECT(sg_tensor_dtype(y) == to) &&
         TU_EXPECT(sg_tensor_numel(y) == n) && TU_EXPECT(sg_read(y, dst, (size_t)n * ts) == SG_OK);
    int bad = 0;
    for (int64_t k = 0; ok && k < n; k++) {
        elem in = get(src, from, k), want = convert_ref(from, in, to), got = get(dst, to, k);
        if (!elem_eq(to, got, want) && bad++ < 3)
            fprintf(stderr,
                    "  element %lld: %.17g / %lld gives %.17g / %lld, expected %.17g / %lld\n",
                    (long long)k, in.f, (long long)in.i, got.f, (long long)got.i, want.f,
                    (long long)want.i);
    }
    char b[64];
    tu_case(ok && bad == 0, "CAST(from=%s,to=%s,x=%s,view=%s)", sg_dtype_name(from),
            sg_dtype_name(to), shs(s, b), tu_layout_name(lay));
    sg_release(x), sg_release(y);
    free(src), free(dst);
}

static void test_cast(void) {
    static const shp cs[] = {{2, {24, 11}}, {0, {0}}, {1, {0}}, {3, {2, 1, 40}}};
    for (sg_dtype from = SG_F32; from <= SG_BOOL; from++)
        for (sg_dtype to = SG_F32; to <= SG_BOOL; to++) {
            for (int l = 0; l < TU_NUM_LAYOUTS; l++) cast_case(from, to, &cs[0], l);
            for (int c = 1; c < 4; c++) cast_case(from, to, &cs[c], (tu_layout)(c % 3));
        }
}

/* ------------------------------------------------------------ in place */

/*
 * A destination of shape [R,C] over a base tensor: the base itself (contig),
 * every other column of a base [R,2C] (sliced), or the transpose of a base
 * [C,R] (permuted). pos[i] is the base index of the view's element i; the
 * base's other elements must not change.
 */
#define R_ 4
#define C_ 6
static sg_tensor *dst_view(sg_tensor *base, tu_layout lay, int64_t *pos) {
    for (int64_t r = 0; r < R_; r++)
        for (int64_t c = 0; c < C_; c++)
            pos[r * C_ + c] = lay == TU_CONTIG   ? r * C_ + c
                              : lay == TU_SLICED ? r * 2 * C_ + 2 * c
                                                 : c * R_ + r;
    return lay == TU_CONTIG   ? sg_narrow(base, 0, 0, R_)
           : lay == TU_SLICED ? sg_slice(base, 1, 0, 2 * C_, 2)
                              : sg_transpose(base, 0, 1);
}

static sg_tensor *make_base(sg_dtype dt, tu_layout lay, elem *vals, int64_t *nb) {
    int64_t shape[2] = {lay == TU_PERMUTED ? C_ : R_, lay == TU_PERMUTED ? R_
                                                      : lay == TU_SLICED ? 2 * C_
                                                                         : C_};
    *nb = shape[0] * shape[1];
    unsigned char buf[2 * R_ * C_ * 8];
    for (int64_t k = 0; k < *nb; k++) {
        put(buf, dt, k, cast_source(dt, 1000 + k));
        vals[k] = get(buf, dt, k);
    }
    return sg_from_host(ctx, dt, 2, shape, buf);
}

/* The base's elements equal want, exactly. */
static bool base_is(sg_tensor *base, sg_dtype dt, const elem *want, int64_t nb) {
    unsigned char buf[2 * R_ * C_ * 8];
    if (!TU_EXPECT(sg_read(base, buf, (size_t)nb * sg_dtype_size(dt)) == SG_OK)) return false;
    int bad = 0;
    for (int64_t k = 0; k < nb; k++) {
        elem g = get(buf, dt, k);
        if (!elem_eq(dt, g, want[k]) && bad++ < 3)
            fprintf(stderr, "  base element %lld is %.17g / %lld, expected %.17g / %lld\n",
                    (long long)k, g.f, (long long)g.i, want[k].f, (long long)want[k].i);
    }
    return bad == 0;
}

/* copy_ of a source (kind 0: [C] broadcast over rows; 1: 0-d; 2: [R,C] in
 * another layout) of dtype sd into a [R,C] destination of dtype dd. */
static void copy_case(sg_dtype sd, sg_dtype dd, tu_layout dl, int kind) {
    if (!tu_sampled()) return;
    elem base_v[2 * R_ * C_], want[2 * R_ * C_], src_v[R_ * C_];
    int64_t nb, pos[R_ * C_];
    sg_tensor *base = make_base(dd, dl, base_v, &nb);
    sg_tensor *dst = dst_view(base, dl, pos);
    shp ss = kind == 0 ? (shp){1, {C_}} : kind == 1 ? (shp){0, {0}} : (shp){2, {R_, C_}};
    shp sdst = {2, {R_, C_}};
    unsigned char buf[R_ * C_ * 8];
    for (int64_t k = 0; k < numel(&ss); k++) {
        put(buf, sd, k, cast_source(sd, k * 7 % (NFS > NIS ? NFS : NIS)));
        src_v[k] = get(buf, sd, k);
    }
    tu_layout sl = kind == 2 ? (tu_layout)((dl + 1) % 3) : TU_CONTIG;
    sg_tensor *src = tu_rand_layout(ctx, sd, ss.nd, ss.s, 0, 1, sl, NULL);
    bool ok = TU_EXPECT(sg_write(src, buf, (size_t)numel(&ss) * sg_dtype_size(sd)) == SG_OK);
    memcpy(want, base_v, sizeof(elem) * (size_t)nb);
    for (int64_t i = 0; i < R_ * C_; i++)
        want[pos[i]] = convert_ref(sd, src_v[bidx(i, &sdst, &ss)], dd);
    sg_status st = sg_copy_(dst, src);
    if (st != SG_OK) fprintf(stderr, "  sg_copy_: %s\n", sg_last_error(ctx));
    ok = ok && TU_EXPECT(st == SG_OK) && base_is(base, dd, want, nb);
    char b[64];
    tu_case(ok, "COPY_(dst=%s[4,6],view=%s,src=%s%s,view=%s)", sg_dtype_name(dd),
            tu_layout_name(dl), sg_dtype_name(sd), shs(&ss, b), tu_layout_name(sl));
    sg_release(base), sg_release(dst), sg_release(src);
}

/* fill_ converts its double exactly as a cast would (rounded once). */
static void fill_case(sg_dtype dd, tu_layout dl, double value) {
    if (!tu_sampled()) return;
    elem base_v[2 * R_ * C_], want[2 * R_ * C_];
    int64_t nb, pos[R_ * C_];
    sg_tensor *base = make_base(dd, dl, base_v, &nb);
    sg_tensor *dst = dst_view(base, dl, pos);
    memcpy(want, base_v, sizeof(elem) * (size_t)nb);
    elem v = {value, 0};
    for (int64_t i = 0; i < R_ * C_; i++) want[pos[i]] = convert_ref(SG_F32, v, dd);
    sg_status st = sg_fill_(dst, value);
    bool ok = TU_EXPECT(st == SG_OK) && base_is(base, dd, want, nb);
    tu_case(ok, "FILL_(dst=%s[4,6],view=%s,value=%.17g)", sg_dtype_name(dd), tu_layout_name(dl),
            value);
    sg_release(base), sg_release(dst);
}

/* add_ of a [C] or [R,C] source into each destination layout; tolerance by dtype. */
static void add_case(sg_dtype dt, tu_layout dl, int kind) {
    if (!tu_sampled()) return;
    elem base_v[2 * R_ * C_];
    int64_t nb, pos[R_ * C_];
    shp ss = kind == 0 ? (shp){1, {C_}} : kind == 1 ? (shp){0, {0}} : (shp){2, {R_, C_}};
    shp sdst = {2, {R_, C_}};
    sg_tensor *base = make_base(dt, dl, base_v, &nb);
    /* Small values, so that sums stay exact for ints and finite for floats. */
    double *bv = dalloc(nb);
    for (int64_t k = 0; k < nb; k++)
        bv[k] = tu_round(dt, is_float(dt) ? tu_uniform(-8, 8) : (double)tu_randint(-50, 50));
    unsigned char buf[2 * R_ * C_ * 8];
    for (int64_t k = 0; k < nb; k++) tu_store(buf, dt, k, bv[k]);
    sg_write(base, buf, (size_t)nb * sg_dtype_size(dt));
    sg_tensor *dst = dst_view(base, dl, pos);
    double *sv;
    tu_layout sl = kind == 2 ? (tu_layout)((dl + 2) % 3) : TU_CONTIG;
    sg_tensor *src = is_float(dt) ? rin(dt, &ss, -8, 8, sl, &sv) : rin(dt, &ss, -50, 50, sl, &sv);
    double *ref = dalloc(nb);
    memcpy(ref, bv, sizeof(double) * (size_t)nb);
    for (int64_t i = 0; i < R_ * C_; i++) ref[pos[i]] = bv[pos[i]] + sv[bidx(i, &sdst, &ss)];
    sg_status st = sg_add_(dst, src);
    shp sb = {1, {nb}};
    sg_tensor *flat = sg_reshape(base, 1, &nb);
    bool ok = TU_EXPECT(st == SG_OK) && check(flat, dt, &sb, ref);
    char b[64];
    tu_case(ok, "ADD_(dst=%s[4,6],view=%s,src=%s,view=%s)", sg_dtype_name(dt), tu_layout_name(dl),
            shs(&ss, b), tu_layout_name(sl));
    sg_release(base), sg_release(dst), sg_release(src), sg_release(flat);
    free(bv), free(sv), free(ref);
}

/* copy_(x, transpose(x)) must give the transpose; add_(x, transpose(x))
 * x + x^T; add_(x, x) 2x; and shifted copies within one vector. */
static void overlap_case(sg_dtype dt, int64_t n) {
    if (!tu_sampled()) return;
    int64_t shape[2] = {n, n};
    double *v;
    char what[96];
    for (int which = 0; which < 3; which++) {
        if (which > 0 && dt == SG_BOOL) break;
        sg_tensor *x = rin(dt, &(shp){2, {n, n}}, -8, 8, TU_CONTIG, &v);
        sg_tensor *xt = sg_transpose(x, 0, 1);
        sg_status st = which == 0 ? sg_copy_(x, xt) : which == 1 ? sg_add_(x, xt) : sg_add_(x, x);
        double *ref = dalloc(n * n);
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = 0; j < n; j++)
                ref[i * n + j] = which == 0   ? v[j * n + i]
                                 : which == 1 ? v[i * n + j] + v[j * n + i]
                                              : 2 * v[i * n + j];
        shp s = {2, {n, n}};
        bool ok = TU_EXPECT(st == SG_OK) && check(x, dt, &s, ref);
        snprintf(what, sizeof what,
                 which == 0   ? "COPY_(x,transpose(x))"
                 : which == 1 ? "ADD_(x,transpose(x))"
                              : "ADD_(x,x)");
        tu_case(ok, "%s(type=%s,x=[%lld,%lld])", what, sg_dtype_name(dt), (long long)shape[0],
                (long long)shape[1]);
        sg_release(x), sg_release(xt);
        free(v), free(ref);
    }
    /* x[1:] = x[:-1] and x[:-1] = x[1:] over a vector of n*n. */
    for (int dir = 0; dir < 2; dir++) {
        int64_t len = n * n;
        sg_tensor *x = rin(dt, &(shp){1, {len}}, -8, 8, TU_CONTIG, &v);
        sg_tensor *hi = sg_narrow(x, 0, 1, len - 1), *lo = sg_narrow(x, 0, 0, len - 1);
        sg_status st = dir == 0 ? sg_copy_(hi, lo) : sg_copy_(lo, hi);
        double *ref = dalloc(len);
        for (int64_t i = 0; i < len; i++)
            ref[i] = dir == 0 ? v[i == 0 ? 0 : i - 1] : v[i == len - 1 ? i : i + 1];
        shp s = {1, {len}};
        bool ok = TU_EXPECT(st == SG_OK) && check(x, dt, &s, ref);
        tu_case(ok, "COPY_(%s,type=%s,x=[%lld])", dir == 0 ? "x[1:]=x[:-1]" : "x[:-1]=x[1:]",
                sg_dtype_name(dt), (long long)len);
        sg_release(x), sg_release(hi), sg_release(lo);
        free(v), free(ref);
    }
}

static void test_in_place(void) {
    for (sg_dtype sd = SG_F32; sd <= SG_BOOL; sd++)
        for (sg_dtype dd = SG_F32; dd <= SG_BOOL; dd++)
            for (int l = 0; l < TU_NUM_LAYOUTS; l++)
                for (int kind = 0; kind < 3; kind++) copy_case(sd, dd, l, kind);
    static const double fills[] = {2.5,
                                   -0.0,
                                   0.5,
                                   -3.7,
                                   1e30,
                                   -1e30,
                                   1e300,
                                   NAN,
                                   INFINITY,
                                   70000,
                                   65519.9,
                                   3e9,
                                   -3e9,
                                   1e-7,
                                   1.00048828125 + 0x1p-40,
                                   1.00390625 + 0x1p-40,
                                   1.0 + 0x1p-24 + 0x1p-50};
    for (sg_dtype dd = SG_F32; dd <= SG_BOOL; dd++)
        for (int l = 0; l < TU_NUM_LAYOUTS; l++)
            for (size_t f = 0; f < sizeof fills / sizeof fills[0]; f++) fill_case(dd, l, fills[f]);
    for (sg_dtype dt = SG_F32; dt <= SG_I64; dt++)
        for (int l = 0; l < TU_NUM_LAYOUTS; l++)
            for (int kind = 0; kind < 3; kind++) add_case(dt, l, kind);
    for (sg_dtype dt = SG_F32; dt <= SG_BOOL; dt++) {
        overlap_case(dt, 5);
        overlap_case(dt, 300);
    }
}

/* ------------------------------------------------------------ bad input */

static size_t live_bytes(void) {
    size_t live = 0, peak = 0;
    sg_ctx_host_bytes(ctx, &live, &peak);
    return live;
}

/* After a failure: the context still runs ops (and the sticky status clears). */
static bool ctx_works(void) {
    int64_t two = 2;
    sg_tensor *x = sg_full(ctx, SG_F32, 1, &two, 1.5);
    sg_tensor *y = sg_add_scalar(x, 1.0);
    float out[2] = {0, 0};
    bool ok = TU_EXPECT(y && sg_read(y, out, sizeof out) == SG_OK) &&
              TU_EXPECT(out[0] == 2.5f && out[1] == 2.5f) && TU_EXPECT(sg_ctx_status(ctx) == SG_OK);
    sg_release(x), sg_release(y);
    return ok;
}

/* What ctx_works has kept since the last settled_bytes: released tensors
 * stay a while (quarantined, for use-after-release checks). */
static int64_t kept;

/* live_bytes once ctx_works' own ops have run: a backend that keeps a unit
 * per op signature (ze) keeps theirs from their first run on. */
static size_t settled_bytes(void) {
    ctx_works();
    kept = 0;
    return live_bytes();
}

/* The call failed with `want`, its message holds every needle (NULLs end the
 * list), no memory was kept, and the context works after sg_clear_error. */
static void bad_case(bool failed, sg_status want, size_t live0, const char *name, const char *n1,
                     const char *n2, const char *n3, const char *n4) {
    const char *needles[4] = {n1, n2, n3, n4};
    const char *msg = sg_last_error(ctx);
    bool ok = TU_EXPECT(failed) && TU_EXPECT(sg_ctx_status(ctx) == want);
    for (int k = 0; k < 4 && needles[k]; k++)
        if (!strstr(msg, needles[k])) {
            fprintf(stderr, "  message \"%s\" lacks \"%s\"\n", msg, needles[k]);
            ok = false;
        }
    ok = ok && TU_EXPECT((int64_t)live_bytes() == (int64_t)live0 + kept);
    sg_clear_error(ctx);
    int64_t before = (int64_t)live_bytes();
    ok = TU_EXPECT(ctx_works()) && ok;
    kept += (int64_t)live_bytes() - before;
    tu_case(ok, "BAD(%s) -> %s", name, sg_status_str(want));
}

static sg_tensor *mk(sg_dtype dt, int nd, const int64_t *shape) {
    return sg_zeros(ctx, dt, nd, shape);
}

static void test_bad_dtypes(void) {
    int64_t s23[2] = {2, 3};
    sg_tensor *f32 = mk(SG_F32, 2, s23), *f16 = mk(SG_F16, 2, s23), *i32 = mk(SG_I32, 2, s23);
    sg_tensor *i64 = mk(SG_I64, 2, s23), *bl = mk(SG_BOOL, 2, s23);
    sg_tensor *nonfloat[3] = {i32, i64, bl};
    char name[96], fn[32];
    size_t live0 = settled_bytes();
    for (int o = 0; o < NUNOPS; o++)
        for (int k = 0; k < 3; k++) {
            if (unops[o].ints && k < 2) continue;
            snprintf(fn, sizeof fn, "sg_%s", unops[o].name);
            for (char *c = fn; *c; c++) *c = (char)(*c >= 'A' && *c <= 'Z' ? *c - 'A' + 'a' : *c);
            snprintf(name, sizeof name, "%s on %s[2,3]", fn,
                     sg_dtype_name(sg_tensor_dtype(nonfloat[k])));
            bad_case(unops[o].fn(nonfloat[k]) == NULL, SG_ERR_DTYPE, live0, name, fn, "sg_cast",
                     sg_dtype_name(sg_tensor_dtype(nonfloat[k])), NULL);
        }
    bad_case(sg_add(f32, f16) == NULL, SG_ERR_DTYPE, live0, "sg_add f32+f16", "sg_add", "f32[2,3]",
             "f16[2,3]", "sg_cast");
    bad_case(sg_eq(f32, i32) == NULL, SG_ERR_DTYPE, live0, "sg_eq f32,i32", "sg_eq", "f32", "i32",
             NULL);
    bad_case(sg_div(i32, i32) == NULL, SG_ERR_DTYPE, live0, "sg_div i32", "sg_div", "i32",
             "sg_cast", NULL);
    bad_case(sg_pow(i64, i64) == NULL, SG_ERR_DTYPE, live0, "sg_pow i64", "sg_pow", "i64", NULL,
             NULL);
    bad_case(sg_add(bl, bl) == NULL, SG_ERR_DTYPE, live0, "sg_add bool", "sg_add", "bool", NULL,
             NULL);
    bad_case(sg_maximum(bl, bl) == NULL, SG_ERR_DTYPE, live0, "sg_maximum bool", "sg_maximum",
             "bool", NULL, NULL);
    bad_case(sg_add_scalar(bl, 1) == NULL, SG_ERR_DTYPE, live0, "sg_add_scalar bool",
             "sg_add_scalar", "bool", NULL, NULL);
    bad_case(sg_pow_scalar(i32, 2) == NULL, SG_ERR_DTYPE, live0, "sg_pow_scalar i32",
             "sg_pow_scalar", "i32", NULL, NULL);
    bad_case(sg_clamp(bl, 0, 1) == NULL, SG_ERR_DTYPE, live0, "sg_clamp bool", "sg_clamp", "bool",
             NULL, NULL);
    bad_case(sg_clamp(f32, 2, 1) == NULL, SG_ERR_INVALID_ARG, live0, "sg_clamp lo>hi", "sg_clamp",
             "lo 2", "hi 1", NULL);
    bad_case(sg_cast(f32, (sg_dtype)99) == NULL, SG_ERR_DTYPE, live0, "sg_cast to 99", "sg_cast",
             "99", NULL, NULL);
    bad_case(sg_where(f32, f32, f32) == NULL, SG_ERR_DTYPE, live0, "sg_where f32 cond", "sg_where",
             "cond", "bool", NULL);
    bad_case(sg_where(i32, f32, f32) == NULL, SG_ERR_DTYPE, live0, "sg_where i32 cond", "sg_where",
             "i32", "bool", NULL);
    bad_case(sg_where(bl, f32, i32) == NULL, SG_ERR_DTYPE, live0, "sg_where f32/i32", "sg_where",
             "f32", "i32", "sg_cast");
    bad_case(sg_add_(f32, f16) == SG_ERR_DTYPE, SG_ERR_DTYPE, live0, "sg_add_ f32+=f16", "sg_add_",
             "f16", "sg_cast", NULL);
    bad_case(sg_add_(bl, bl) == SG_ERR_DTYPE, SG_ERR_DTYPE, live0, "sg_add_ bool", "sg_add_",
             "bool", NULL, NULL);
    sg_release(f32), sg_release(f16), sg_release(i32), sg_release(i64), sg_release(bl);
}

static void test_bad_shapes(void) {
    int64_t s34[2] = {3, 4}, s5[1] = {5}, s3[1] = {3}, s24[2] = {2, 4}, s4[1] = {4};
    int64_t s41[2] = {4, 1};
    sg_tensor *a = mk(SG_F32, 2, s34), *b = mk(SG_F32, 1, s5), *c3 = mk(SG_BOOL, 1, s3);
    sg_tensor *d24 = mk(SG_F32, 2, s24), *v3 = mk(SG_F32, 1, s3), *v4 = mk(SG_F32, 1, s4);
    sg_tensor *col = mk(SG_F32, 2, s41);
    size_t live0 = settled_bytes();
    bad_case(sg_add(a, b) == NULL, SG_ERR_SHAPE, live0, "sg_add [3,4]+[5]", "sg_add", "[3,4]",
             "[5]", NULL);
    bad_case(sg_mul(b, a) == NULL, SG_ERR_SHAPE, live0, "sg_mul [5]*[3,4]", "sg_mul", "[3,4]",
             "[5]", NULL);
    bad_case(sg_lt(d24, v3) == NULL, SG_ERR_SHAPE, live0, "sg_lt [2,4]<[3]", "sg_lt", "[2,4]",
             "[3]", NULL);
    bad_case(sg_where(c3, v4, v4) == NULL, SG_ERR_SHAPE, live0, "sg_where cond [3], a [4]",
             "sg_where", "[3]", "[4]", NULL);
    /* The message must name the two shapes that clash, not only the first input. */
    sg_tensor *c1 = mk(SG_BOOL, 1, (int64_t[1]){1});
    live0 = settled_bytes();
    bad_case(sg_where(c1, v3, v4) == NULL, SG_ERR_SHAPE, live0, "sg_where a [3], b [4]", "sg_where",
             "[3]", "[4]", NULL);
    bad_case(sg_copy_(d24, v3) == SG_ERR_SHAPE, SG_ERR_SHAPE, live0, "sg_copy_ [3] into [2,4]",
             "sg_copy_", "[2,4]", "[3]", NULL);
    bad_case(sg_copy_(v4, d24) == SG_ERR_SHAPE, SG_ERR_SHAPE, live0, "sg_copy_ [2,4] into [4]",
             "sg_copy_", "[2,4]", "[4]", NULL);
    bad_case(sg_add_(col, v4) == SG_ERR_SHAPE, SG_ERR_SHAPE, live0, "sg_add_ [4] into [4,1]",
             "sg_add_", "[4,1]", "[4]", NULL);
    /* Expanded destinations repeat elements: refused, and left as they were. */
    sg_tensor *e = sg_expand(col, 2, (int64_t[2]){4, 3});
    float before[4], after[4];
    sg_read(col, before, sizeof before);
    sg_tensor *src = mk(SG_F32, 2, (int64_t[2]){4, 3});
    sg_fill_(src, 7);
    live0 = settled_bytes();
    bad_case(sg_copy_(e, src) == SG_ERR_INVALID_ARG, SG_ERR_INVALID_ARG, live0,
             "sg_copy_ into expand", "sg_copy_", "expanded", "[4,3]", NULL);
    bad_case(sg_add_(e, src) == SG_ERR_INVALID_ARG, SG_ERR_INVALID_ARG, live0,
             "sg_add_ into expand", "sg_add_", "expanded", NULL, NULL);
    bad_case(sg_fill_(e, 1) == SG_ERR_INVALID_ARG, SG_ERR_INVALID_ARG, live0,
             "sg_fill_ into expand", "sg_fill_", "expanded", NULL, NULL);
    sg_read(col, after, sizeof after);
    tu_case(memcmp(before, after, sizeof after) == 0,
            "BAD(in place into expand leaves dst as it was)");
    sg_tensor *all[] = {a, b, c3, d24, v3, v4, col, c1, e, src};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) sg_release(all[i]);
}

/* NULL inputs propagate silently; released ones are named. */
static void test_bad_handles(void) {
    int64_t s2[1] = {2};
    sg_tensor *x = mk(SG_F32, 1, s2), *r = mk(SG_F32, 1, s2);
    sg_release(r);
    bool ok = TU_EXPECT(sg_exp(NULL) == NULL) && TU_EXPECT(sg_add(x, NULL) == NULL) &&
              TU_EXPECT(sg_where(NULL, x, x) == NULL) && TU_EXPECT(sg_cast(NULL, SG_F16) == NULL) &&
              TU_EXPECT(sg_ctx_status(ctx) == SG_OK) &&
              TU_EXPECT(strcmp(sg_last_error(ctx), "") == 0);
    ok = ok && TU_EXPECT(sg_copy_(NULL, x) == SG_ERR_NULL) &&
         TU_EXPECT(sg_copy_(x, NULL) == SG_ERR_NULL) &&
         TU_EXPECT(sg_fill_(NULL, 1) == SG_ERR_NULL) && TU_EXPECT(sg_add_(x, NULL) == SG_ERR_NULL);
    tu_case(ok && ctx_works(), "BAD(NULL inputs return NULL / SG_ERR_NULL, no new error)");
    size_t live0 = settled_bytes();
    bad_case(sg_add(x, r) == NULL, SG_ERR_RELEASED, live0, "sg_add with a released b", "sg_add",
             "released", NULL, NULL);
    bad_case(sg_tanh(r) == NULL, SG_ERR_RELEASED, live0, "sg_tanh of released", "sg_tanh",
             "released", NULL, NULL);
    bad_case(sg_copy_(x, r) == SG_ERR_RELEASED, SG_ERR_RELEASED, live0, "sg_copy_ from released",
             "sg_copy_", "released", NULL, NULL);
    bad_case(sg_fill_(r, 1) == SG_ERR_RELEASED, SG_ERR_RELEASED, live0, "sg_fill_ of released",
             "sg_fill_", "released", NULL, NULL);
    sg_release(x);
}

/* Every allocation an op makes may fail: the op reports SG_ERR_OOM, keeps
 * nothing, leaves its destination as it was, and the context works after. */
static void test_oom(void) {
    tu_alloc al = {0};
    sg_ctx *c2;
    sg_ctx_opts opts = {.backend = SG_BACKEND_CPU, .alloc = tu_alloc_hook, .alloc_user = &al};
    if (!TU_EXPECT(sg_ctx_create(&opts, &c2) == SG_OK)) return;
    int64_t s44[2] = {4, 4};
    float vals[16], after[16];
    for (int i = 0; i < 16; i++) vals[i] = (float)i;
    sg_tensor *x = sg_from_host(c2, SG_F32, 2, s44, vals), *xt = sg_transpose(x, 0, 1);
    for (int which = 0; which < 3; which++) {
        static const char *names[] = {"sg_add", "sg_copy_(x,transpose(x))", "sg_cast"};
        bool ok = true;
        int failures = 0;
        for (long k = 1; k < 20; k++) {
            long live = al.live;
            al.fail_at = al.count + k;
            sg_tensor *y = NULL;
            sg_status st = which == 1 ? sg_copy_(x, xt) : SG_OK;
            if (which == 0) y = sg_add(x, xt);
            if (which == 2) y = sg_cast(xt, SG_BF16);
            al.fail_at = 0;
            bool failed = which == 1 ? st != SG_OK : y == NULL;
            if (!failed) {
                sg_release(y);
                if (which == 1) sg_copy_(x, xt); /* transpose back */
                break;
            }
            failures++;
            ok = ok && TU_EXPECT(sg_ctx_status(c2) == SG_ERR_OOM) && TU_EXPECT(al.live == live);
            ok = ok && TU_EXPECT(sg_read(x, after, sizeof after) == SG_OK) &&
                 TU_EXPECT(memcmp(after, vals, sizeof vals) == 0);
            sg_clear_error(c2);
        }
        tu_case(ok && failures > 0, "OOM(%s,x=f32[4,4],failing each of its %d allocations)",
                names[which], failures);
    }
    sg_release(x), sg_release(xt);
    sg_ctx_destroy(c2);
    tu_case(al.live == 0 && al.bytes == 0, "OOM(context destroyed, nothing left)");
}

int main(void) {
    ctx = tu_ctx((sg_ctx_opts){0});
    tu_seed(1);
    test_unary();
    test_unary_special();
    test_scalar();
    test_clamp_nan();
    test_binary();
    test_int_wrap();
    test_compare();
    test_logical();
    test_where();
    test_cast();
    test_in_place();
    test_bad_dtypes();
    test_bad_shapes();
    test_bad_handles();
    test_oom();
    sg_ctx_destroy(ctx);
    return tu_finish();
}
