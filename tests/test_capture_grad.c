/* SPDX-License-Identifier: MIT */
/*
 * test_capture_grad.c -- the gradient of every differentiable op and view
 * against central finite differences of an f64 forward written here, on
 * random shapes with broadcasting, size-1 dims and non-contiguous inputs:
 * the loss is sum(op(x...) * r) for a random r, so every output element
 * weighs in. Then the same gradients through the compiled modes (DEFAULT,
 * REDUCE_OVERHEAD, MAX_AUTOTUNE) equal the eager ones, gradient
 * accumulation over 4 micro-batches equals one batch 4x as large, and
 * in-place writes to saved tensors, no_grad and lifetimes behave.
 */
#include "testutil.h"

#include <math.h>
#include <string.h>

static sg_ctx *ctx;

/* ------------------------------------------------------------ cases */

enum kind {
    K_UN,
    K_BIN,
    K_WHERE,
    K_RED,
    K_SOFTMAX,
    K_LOGSOFTMAX,
    K_LN,
    K_RMS,
    K_CE,
    K_MATMUL,
    K_LINEAR,
    K_EMB,
    K_ISEL,
    K_CONCAT,
    K_VIEW,
    K_SDPA
};

enum view {
    V_RESHAPE,
    V_PERMUTE,
    V_TRANSPOSE,
    V_SLICE,
    V_NARROW,
    V_EXPAND,
    V_UNSQUEEZE,
    V_SQUEEZE,
    V_CONTIGUOUS,
    V_CLONE
};

typedef struct tcase {
    const char *name;
    enum kind kind;
    int op;    /* unary / binary table index, reduction, view */
    int dim;   /* dim, or the reduced dims' mask */
    bool keep; /* keepdim; for layer_norm / rms_norm / linear: with weight / bias */
    int nin;
    int nd[3];
    int64_t sh[3][SG_MAX_DIMS];
    double lo, hi;
    int64_t naux, auxmax; /* an index input of naux entries in [0, auxmax) */
    sg_dtype dt;          /* of the float inputs (f32 when zero) */
} tcase;

typedef struct unop {
    const char *name;
    sg_tensor *(*sg)(sg_tensor *);
    double (*ref)(double);
    double lo, hi;
} unop;

static sg_tensor *add1(sg_tensor *x) { return sg_add_scalar(x, 1.5); }
static sg_tensor *mul3(sg_tensor *x) { return sg_mul_scalar(x, -3.0); }
static sg_tensor *pow25(sg_tensor *x) { return sg_pow_scalar(x, 2.5); }
static sg_tensor *clampx(sg_tensor *x) { return sg_clamp(x, -0.5, 0.7); }
static sg_tensor *castf(sg_tensor *x) { return sg_cast(x, SG_F32); }
static double r_neg(double x) { return -x; }
static double r_sigmoid(double x) { return 1 / (1 + exp(-x)); }
static double r_relu(double x) { return x > 0 ? x : 0; }
static double r_gelu(double x) { return 0.5 * x * (1 + erf(x / sqrt(2.0))); }
static double r_gelu_tanh(double x) {
    return 0.5 * x * (1 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}
static double r_silu(double x) { return x / (1 + exp(-x)); }
static double r_rsqrt(double x) { return 1 / sqrt(x); }
static double r_add1(double x) { return x + 1.5; }
static double r_mul3(double x) { return x * -3.0; }
static double r_pow25(double x) { return pow(x, 2.5); }
static double r_clamp(double x) { return x < -0.5 ? -0.5 : x > 0.7 ? 0.7 : x; }
static double r_id(double x) { return x; }

static const unop unops[] = {
    {"neg", sg_neg, r_neg, -2, 2},
    {"abs", sg_abs, fabs, -2, 2},
    {"exp", sg_exp, exp, -2, 2},
    {"log", sg_log, log, 0.2, 3},
    {"sqrt", sg_sqrt, sqrt, 0.2, 3},
    {"rsqrt", sg_rsqrt, r_rsqrt, 0.2, 3},
    {"sin", sg_sin, sin, -3, 3},
    {"cos", sg_cos, cos, -3, 3},
    {"tanh", sg_tanh, tanh, -2, 2},
    {"sigmoid", sg_sigmoid, r_sigmoid, -3, 3},
    {"relu", sg_relu, r_relu, -2, 2},
    {"gelu", sg_gelu, r_gelu, -3, 3},
    {"gelu_tanh", sg_gelu_tanh, r_gelu_tanh, -3, 3},
    {"silu", sg_silu, r_silu, -3, 3},
    {"add_scalar", add1, r_add1, -2, 2},
    {"mul_scalar", mul3, r_mul3, -2, 2},
    {"pow_scalar", pow25, r_pow25, 0.2, 2},
    {"clamp", clampx, r_clamp, -1, 1},
    {"cast", castf, r_id, -2, 2},
};
#define NUNOPS ((int)(sizeof unops / sizeof unops[0]))

typedef struct binop {
    const char *name;
    sg_tensor *(*sg)(sg_tensor *, sg_tensor *);
    double (*ref)(double, double);
    double lo, hi;
} binop;

static double b_add(double a, double b) { return a + b; }
static double b_sub(double a, double b) { return a - b; }
static double b_mul(double a, double b) { return a * b; }
static double b_div(double a, double b) { return a / b; }
static double b_max(double a, double b) { return a > b ? a : b; }
static double b_min(double a, double b) { return a < b ? a : b; }

static const binop binops[] = {
    {"add", sg_add, b_add, -2, 2},         {"sub", sg_sub, b_sub, -2, 2},
    {"mul", sg_mul, b_mul, -2, 2},         {"div", sg_div, b_div, 0.5, 2},
    {"pow", sg_pow, pow, 0.3, 2},          {"maximum", sg_maximum, b_max, -2, 2},
    {"minimum", sg_minimum, b_min, -2, 2},
};
#define NBINOPS ((int)(sizeof binops / sizeof binops[0]))

/* ------------------------------------------------------------ f64 references */

static int64_t numel(int nd, const int64_t *sh) {
    int64_t n = 1;
    for (int d = 0; d < nd; d++) n *= sh[d];
    return n;
}

static void coords(int nd, const int64_t *sh, int64_t i, int64_t *c) {
    for (int d = nd - 1; d >= 0; d--) {
        c[d] = sh[d] ? i % sh[d] : 0;
        i = sh[d] ? i / sh[d] : 0;
    }
}

/* The flat index into (ind, insh) of out coordinate c (broadcast). */
static int64_t bidx(int ond, const int64_t *c, int ind, const int64_t *insh) {
    int64_t k = 0;
    for (int d = 0; d < ind; d++) {
        int64_t v = c[d + ond - ind];
        k = k * insh[d] + (insh[d] == 1 ? 0 : v);
    }
    return k;
}

static void ref_pointwise(const tcase *t, double *const *x, const int64_t *aux, int ond,
                          const int64_t *osh, double *out) {
    int64_t n = numel(ond, osh), c[SG_MAX_DIMS];
    const int *nd = t->nd;
    (void)x, (void)aux, (void)n, (void)c, (void)nd;
    switch (t->kind) {
    case K_UN:
        for (int64_t i = 0; i < n; i++) out[i] = unops[t->op].ref(x[0][i]);
        break;
    case K_BIN:
    case K_WHERE:
        for (int64_t i = 0; i < n; i++) {
            coords(ond, osh, i, c);
            double a = x[0][bidx(ond, c, nd[0], t->sh[0])], b = x[1][bidx(ond, c, nd[1], t->sh[1])];
            if (t->kind == K_BIN)
                out[i] = binops[t->op].ref(a, b);
            else
                out[i] = x[2][bidx(ond, c, nd[2], t->sh[2])] > 0 ? a : b;
        }
        break;
    default: break;
    }
}

static void ref_reduce(const tcase *t, double *const *x, const int64_t *aux, int ond,
                       const int64_t *osh, double *out) {
    int64_t n = numel(ond, osh), c[SG_MAX_DIMS];
    const int *nd = t->nd;
    (void)x, (void)aux, (void)n, (void)c, (void)nd;
    switch (t->kind) {
    case K_RED: {
        const int64_t *sh = t->sh[0];
        int64_t m = numel(nd[0], sh);
        double *acc = calloc((size_t)n + 1, sizeof *acc), *acc2 = calloc((size_t)n + 1, 8);
        int64_t *cnt = calloc((size_t)n + 1, sizeof *cnt);
        for (int64_t i = 0; i < n; i++) acc[i] = t->op == 2 ? -INFINITY : t->op == 3 ? INFINITY : 0;
        for (int64_t i = 0; i < m; i++) {
            coords(nd[0], sh, i, c);
            int64_t o = 0;
            for (int d = 0; d < nd[0]; d++)
                if (!(t->dim & (1 << d))) o = o * sh[d] + c[d];
            double v = x[0][i];
            if (t->op == 2)
                acc[o] = v > acc[o] ? v : acc[o];
            else if (t->op == 3)
                acc[o] = v < acc[o] ? v : acc[o];
            else
                acc[o] += v, acc2[o] += v * v;
            cnt[o]++;
        }
        for (int64_t i = 0; i < n; i++) {
            if (t->op == 1) acc[i] /= (double)cnt[i];
            if (t->op == 4) {
                double mu = acc[i] / (double)cnt[i];
                acc[i] = (acc2[i] - cnt[i] * mu * mu) / (double)(cnt[i] - 1);
            }
            out[i] = acc[i];
        }
        free(acc), free(acc2), free(cnt);
        break;
    }
    default: break;
    }
}

static void ref_rows(const tcase *t, double *const *x, const int64_t *aux, int ond,
                     const int64_t *osh, double *out) {
    int64_t n = numel(ond, osh), c[SG_MAX_DIMS];
    const int *nd = t->nd;
    (void)x, (void)aux, (void)n, (void)c, (void)nd;
    switch (t->kind) {
    case K_SOFTMAX:
    case K_LOGSOFTMAX: {
        int dim = t->dim;
        int64_t len = t->sh[0][dim], inner = 1, outer = 1;
        for (int d = dim + 1; d < nd[0]; d++) inner *= t->sh[0][d];
        for (int d = 0; d < dim; d++) outer *= t->sh[0][d];
        for (int64_t o = 0; o < outer; o++)
            for (int64_t i = 0; i < inner; i++) {
                const double *v = x[0] + o * len * inner + i;
                double *y = out + o * len * inner + i, s = 0;
                for (int64_t j = 0; j < len; j++) s += exp(v[j * inner]);
                for (int64_t j = 0; j < len; j++)
                    y[j * inner] =
                        t->kind == K_SOFTMAX ? exp(v[j * inner]) / s : v[j * inner] - log(s);
            }
        break;
    }
    case K_LN:
    case K_RMS: {
        int64_t C = t->sh[0][nd[0] - 1], rows = n / C;
        for (int64_t r = 0; r < rows; r++) {
            const double *v = x[0] + r * C;
            double mu = 0, ss = 0;
            for (int64_t j = 0; j < C; j++) mu += v[j] / (double)C;
            for (int64_t j = 0; j < C; j++)
                ss += (t->kind == K_LN ? (v[j] - mu) * (v[j] - mu) : v[j] * v[j]) / (double)C;
            double rs = 1 / sqrt(ss + 1e-5);
            for (int64_t j = 0; j < C; j++) {
                double y = (t->kind == K_LN ? v[j] - mu : v[j]) * rs;
                if (t->keep) y = y * x[1][j] + (t->kind == K_LN ? x[2][j] : 0);
                out[r * C + j] = y;
            }
        }
        break;
    }
    case K_CE: {
        int64_t N = t->sh[0][0], C = t->sh[0][1];
        double l = 0;
        for (int64_t r = 0; r < N; r++) {
            double s = 0;
            for (int64_t j = 0; j < C; j++) s += exp(x[0][r * C + j]);
            l += log(s) - x[0][r * C + aux[r]];
        }
        out[0] = l / (double)N;
        break;
    }
    default: break;
    }
}

static void ref_matmul(const tcase *t, double *const *x, const int64_t *aux, int ond,
                       const int64_t *osh, double *out) {
    int64_t n = numel(ond, osh), c[SG_MAX_DIMS];
    const int *nd = t->nd;
    (void)x, (void)aux, (void)n, (void)c, (void)nd;
    switch (t->kind) {
    case K_MATMUL: {
        /* a (.., M, K) @ b (.., K, N); a 1-d a is (1, K), a 1-d b (K, 1). */
        int an = nd[0], bn = nd[1];
        int64_t K = t->sh[0][an - 1], M = an == 1 ? 1 : t->sh[0][an - 2];
        int64_t N = bn == 1 ? 1 : t->sh[1][bn - 1];
        int64_t ash[SG_MAX_DIMS], bsh[SG_MAX_DIMS], obs[SG_MAX_DIMS];
        int ab = an > 2 ? an - 2 : 0, bb = bn > 2 ? bn - 2 : 0, ob = ab > bb ? ab : bb;
        memcpy(ash, t->sh[0], sizeof ash), memcpy(bsh, t->sh[1], sizeof bsh);
        for (int d = 0; d < ob; d++) {
            int64_t sa = d < ob - ab ? 1 : ash[d - (ob - ab)],
                    sb = d < ob - bb ? 1 : bsh[d - (ob - bb)];
            obs[d] = sa > sb ? sa : sb;
        }
        int64_t batches = numel(ob, obs);
        for (int64_t bt = 0; bt < batches; bt++) {
            coords(ob, obs, bt, c);
            int64_t ao = bidx(ob, c, ab, ash) * M * K, bo = bidx(ob, c, bb, bsh) * K * N;
            for (int64_t i = 0; i < M; i++)
                for (int64_t j = 0; j < N; j++) {
                    double s = 0;
                    for (int64_t k = 0; k < K; k++)
                        s += x[0][ao + i * K + k] * x[1][bo + k * N + j];
                    out[(bt * M + i) * N + j] = s;
                }
        }
        break;
    }
    case K_LINEAR: {
        int64_t K = t->sh[1][1], N = t->sh[1][0], rows = n / N;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t j = 0; j < N; j++) {
                double s = t->keep ? x[2][j] : 0;
                for (int64_t k = 0; k < K; k++) s += x[0][r * K + k] * x[1][j * K + k];
                out[r * N + j] = s;
            }
        break;
    }
    default: break;
    }
}

static void ref_data(const tcase *t, double *const *x, const int64_t *aux, int ond,
                     const int64_t *osh, double *out) {
    int64_t n = numel(ond, osh), c[SG_MAX_DIMS];
    const int *nd = t->nd;
    (void)x, (void)aux, (void)n, (void)c, (void)nd;
    switch (t->kind) {
    case K_EMB: {
        int64_t D = t->sh[0][1];
        for (int64_t r = 0; r < t->naux; r++)
            for (int64_t j = 0; j < D; j++) out[r * D + j] = x[0][aux[r] * D + j];
        break;
    }
    case K_ISEL:
        for (int64_t i = 0; i < n; i++) {
            coords(ond, osh, i, c);
            c[t->dim] = aux[c[t->dim]];
            out[i] = x[0][bidx(ond, c, nd[0], t->sh[0])];
        }
        break;
    case K_CONCAT:
        for (int64_t i = 0; i < n; i++) {
            coords(ond, osh, i, c);
            int k = 0;
            while (c[t->dim] >= t->sh[k][t->dim]) c[t->dim] -= t->sh[k++][t->dim];
            out[i] = x[k][bidx(ond, c, nd[k], t->sh[k])];
        }
        break;
    default: break;
    }
}

static void ref_sdpa(const tcase *t, double *const *x, const int64_t *aux, int ond,
                     const int64_t *osh, double *out) {
    int64_t n = numel(ond, osh), c[SG_MAX_DIMS];
    const int *nd = t->nd;
    (void)x, (void)aux, (void)n, (void)c, (void)nd;
    switch (t->kind) {
    case K_SDPA: { /* q (B, Lq, E), k (B, Lk, E), v (B, Lk, F); causal when keep */
        int64_t B = t->sh[0][0], Lq = t->sh[0][1], E = t->sh[0][2], Lk = t->sh[1][1];
        int64_t F = t->sh[2][2];
        double sc[64];
        for (int64_t b = 0; b < B; b++)
            for (int64_t i = 0; i < Lq; i++) {
                double m = -INFINITY, z = 0;
                for (int64_t j = 0; j < Lk; j++) {
                    double d = 0;
                    for (int64_t e = 0; e < E; e++)
                        d += x[0][(b * Lq + i) * E + e] * x[1][(b * Lk + j) * E + e];
                    sc[j] = t->keep && j > i + (Lk - Lq) ? -INFINITY : d / sqrt((double)E);
                    m = sc[j] > m ? sc[j] : m;
                }
                for (int64_t j = 0; j < Lk; j++) z += exp(sc[j] - m);
                for (int64_t f = 0; f < F; f++) {
                    double o = 0;
                    for (int64_t j = 0; j < Lk; j++)
                        o += exp(sc[j] - m) / z * x[2][(b * Lk + j) * F + f];
                    out[(b * Lq + i) * F + f] = o;
                }
            }
        break;
    }
    default: break;
    }
}

static void ref_view(const tcase *t, double *const *x, const int64_t *aux, int ond,
                     const int64_t *osh, double *out) {
    int64_t n = numel(ond, osh), c[SG_MAX_DIMS];
    const int *nd = t->nd;
    (void)x, (void)aux, (void)n, (void)c, (void)nd;
    switch (t->kind) {
    case K_VIEW:
        for (int64_t i = 0; i < n; i++) {
            int64_t xc[SG_MAX_DIMS];
            coords(ond, osh, i, c);
            switch (t->op) {
            case V_PERMUTE: /* perm (2, 0, 1) */
                xc[2] = c[0], xc[0] = c[1], xc[1] = c[2];
                out[i] = x[0][bidx(3, xc, 3, t->sh[0])];
                break;
            case V_TRANSPOSE: /* dims 0 and 2 */
                xc[0] = c[2], xc[1] = c[1], xc[2] = c[0];
                out[i] = x[0][bidx(3, xc, 3, t->sh[0])];
                break;
            case V_SLICE: /* dim 1, from 1, step 2 */
                memcpy(xc, c, sizeof xc);
                xc[1] = 1 + 2 * c[1];
                out[i] = x[0][bidx(3, xc, 3, t->sh[0])];
                break;
            case V_NARROW: /* dim 2, from 1 */
                memcpy(xc, c, sizeof xc);
                xc[2] = 1 + c[2];
                out[i] = x[0][bidx(3, xc, 3, t->sh[0])];
                break;
            case V_EXPAND: out[i] = x[0][bidx(ond, c, nd[0], t->sh[0])]; break;
            default: out[i] = x[0][i]; break; /* the same elements in order */
            }
        }
        break;
    default: break;
    }
}

/* out (ond, osh) of the case from the inputs' f64 values. */
static void ref_forward(const tcase *t, double *const *x, const int64_t *aux, int ond,
                        const int64_t *osh, double *out) {
    static void (*const by_kind[])(const tcase *, double *const *, const int64_t *, int,
                                   const int64_t *, double *) = {
        [K_UN] = ref_pointwise,  [K_BIN] = ref_pointwise, [K_WHERE] = ref_pointwise,
        [K_RED] = ref_reduce,    [K_SOFTMAX] = ref_rows,  [K_LOGSOFTMAX] = ref_rows,
        [K_LN] = ref_rows,       [K_RMS] = ref_rows,      [K_CE] = ref_rows,
        [K_MATMUL] = ref_matmul, [K_LINEAR] = ref_matmul, [K_EMB] = ref_data,
        [K_ISEL] = ref_data,     [K_CONCAT] = ref_data,   [K_VIEW] = ref_view,
        [K_SDPA] = ref_sdpa,
    };
    by_kind[t->kind](t, x, aux, ond, osh, out);
}

/* ------------------------------------------------------------ stepgraph forwards */

static sg_tensor *sg_forward(const tcase *t, sg_tensor *const *x, sg_tensor *aux) {
    switch (t->kind) {
    case K_UN: return unops[t->op].sg(x[0]);
    case K_BIN: return binops[t->op].sg(x[0], x[1]);
    case K_WHERE: {
        sg_tensor *zero = sg_zeros(ctx, SG_F32, 0, NULL);
        sg_tensor *cond = sg_gt(x[2], zero), *y = sg_where(cond, x[0], x[1]);
        sg_release(zero), sg_release(cond);
        return y;
    }
    case K_RED: {
        int dims[SG_MAX_DIMS], n = 0;
        for (int d = 0; d < t->nd[0]; d++)
            if (t->dim & (1 << d)) dims[n++] = d;
        switch (t->op) {
        case 0: return sg_sum(x[0], n, dims, t->keep);
        case 1: return sg_mean(x[0], n, dims, t->keep);
        case 2: return sg_max(x[0], n, dims, t->keep);
        case 3: return sg_min(x[0], n, dims, t->keep);
        default: return sg_var(x[0], n, dims, 1, t->keep);
        }
    }
    case K_SOFTMAX: return sg_softmax(x[0], t->dim);
    case K_LOGSOFTMAX: return sg_log_softmax(x[0], t->dim);
    case K_LN: return sg_layer_norm(x[0], t->keep ? x[1] : NULL, t->keep ? x[2] : NULL, 1e-5);
    case K_RMS: return sg_rms_norm(x[0], t->keep ? x[1] : NULL, 1e-5);
    case K_CE: return sg_cross_entropy(x[0], aux);
    case K_MATMUL: return sg_matmul(x[0], x[1]);
    case K_LINEAR: return sg_linear(x[0], x[1], t->keep ? x[2] : NULL);
    case K_EMB: return sg_embedding(x[0], aux);
    case K_ISEL: return sg_index_select(x[0], t->dim, aux);
    case K_CONCAT: return sg_concat(t->nin, x, t->dim);
    case K_SDPA: return sg_sdpa(x[0], x[1], x[2], NULL, t->keep, 0);
    case K_VIEW:
        switch (t->op) {
        case V_RESHAPE: return sg_reshape(x[0], 2, (int64_t[]){-1, 2});
        case V_PERMUTE: return sg_permute(x[0], (int[]){2, 0, 1});
        case V_TRANSPOSE: return sg_transpose(x[0], 0, 2);
        case V_SLICE: return sg_slice(x[0], 1, 1, 100, 2);
        case V_NARROW: return sg_narrow(x[0], 2, 1, 2);
        case V_EXPAND: return sg_expand(x[0], 4, (int64_t[]){2, 3, 4, 5});
        case V_UNSQUEEZE: return sg_unsqueeze(x[0], 1);
        case V_SQUEEZE: return sg_squeeze(x[0], 1);
        case V_CONTIGUOUS: return sg_contiguous(x[0]);
        default: return sg_clone(x[0]);
        }
    }
    return NULL;
}

/* ------------------------------------------------------------ the check */

static bool same(const char *what, sg_tensor *got, sg_tensor *want, double rtol);

#define MAXN 1024

/* sum(out * r) in f64. */
static double ref_loss(const tcase *t, double *const *x, const int64_t *aux, int ond,
                       const int64_t *osh, const double *r, double *buf) {
    ref_forward(t, x, aux, ond, osh, buf);
    double l = 0;
    for (int64_t i = 0; i < numel(ond, osh); i++) l += buf[i] * r[i];
    return l;
}

/* Every case's inputs and eager gradients, kept for the compiled run. */
typedef struct kept {
    tcase t;
    sg_tensor *x[3], *aux, *r, *g[3];
    int nwrt;
} kept;

#define MAXKEPT 160
static kept keep[MAXKEPT];
static int nkeep;

static void grad_case(const tcase *t, uint64_t seed) {
    tu_seed(seed);
    sg_tensor *x[3] = {NULL}, *aux = NULL;
    double *xv[3] = {NULL};
    int64_t auxv[64];
    bool ok = true;
    for (int k = 0; k < t->nin; k++) {
        /* The first input is a non-contiguous view in every other case. */
        tu_layout lay = k == 0 && t->nd[0] >= 1 ? (tu_layout)(seed % TU_NUM_LAYOUTS) : TU_CONTIG;
        x[k] = tu_rand_layout(ctx, t->dt, t->nd[k], t->sh[k], t->lo, t->hi, lay, &xv[k]);
        ok = ok && TU_EXPECT(sg_requires_grad_(x[k], true) == SG_OK);
    }
    if (t->kind == K_WHERE) sg_requires_grad_(x[2], false); /* the condition's source */
    if (t->naux) {
        for (int64_t i = 0; i < t->naux; i++) auxv[i] = tu_randint(0, t->auxmax - 1);
        aux = sg_from_host(ctx, SG_I64, 1, &t->naux, auxv);
    }
    sg_tensor *y = sg_forward(t, x, aux);
    ok = ok && TU_EXPECT(y != NULL) && TU_EXPECT(sg_tensor_requires_grad(y));
    int ond = sg_tensor_ndim(y);
    int64_t osh[SG_MAX_DIMS] = {0};
    if (y) sg_tensor_shape(y, osh);
    double *rv = NULL;
    sg_tensor *r = tu_rand(ctx, t->kind == K_CE ? SG_F32 : t->dt, ond, osh, -1, 1, &rv);
    sg_tensor *yr = sg_mul(y, r);
    sg_tensor *loss = sg_sum(yr, 0, NULL, false);
    sg_tensor *g[3] = {NULL};
    int nwrt = t->kind == K_WHERE ? 2 : t->nin;
    ok = ok && TU_EXPECT(sg_grad(loss, nwrt, x, g) == SG_OK);
    double buf[MAXN];
    for (int k = 0; ok && k < nwrt; k++) {
        int64_t n = numel(t->nd[k], t->sh[k]);
        double *got = tu_read(g[k]), *fd = malloc(sizeof(double) * (size_t)(n + 1));
        for (int64_t i = 0; i < n; i++) {
            double v = xv[k][i], h = 1e-6 * (fabs(v) > 1 ? fabs(v) : 1);
            xv[k][i] = v + h;
            double lp = ref_loss(t, xv, auxv, ond, osh, rv, buf);
            xv[k][i] = v - h;
            double lm = ref_loss(t, xv, auxv, ond, osh, rv, buf);
            xv[k][i] = v;
            fd[i] = (lp - lm) / (2 * h);
        }
        /* f32: against the f64 differences; bf16 / f16: relative to the largest. */
        double rtol = t->dt == SG_F32 ? 2e-3 : 3e-2, atol = t->dt == SG_F32 ? 2e-4 : 3e-2, big = 1;
        for (int64_t i = 0; t->dt != SG_F32 && i < n; i++)
            big = fabs(fd[i]) > big ? fabs(fd[i]) : big;
        int64_t gsh[SG_MAX_DIMS];
        ok = TU_EXPECT(sg_tensor_ndim(g[k]) == t->nd[k]) &&
             TU_EXPECT(sg_tensor_shape(g[k], gsh) == SG_OK) &&
             TU_EXPECT(!memcmp(gsh, t->sh[k], sizeof(int64_t) * (size_t)t->nd[k])) &&
             TU_EXPECT(sg_tensor_is_contiguous(g[k])) && TU_EXPECT(got != NULL) &&
             TU_EXPECT(tu_close("grad", got, fd, n, rtol, atol * big));
        free(got), free(fd);
    }
    char sh[3][64];
    tu_case(ok, "GRAD(%s,type=%s,x=%s,y=%s,z=%s) seed=%llu", t->name, sg_dtype_name(t->dt),
            tu_shape(t->nd[0], t->sh[0], sh[0], 64),
            t->nin > 1 ? tu_shape(t->nd[1], t->sh[1], sh[1], 64) : "-",
            t->nin > 2 ? tu_shape(t->nd[2], t->sh[2], sh[2], 64) : "-", (unsigned long long)seed);
    if (ok && nkeep < MAXKEPT) { /* its inputs and gradients stay for compiled_all */
        kept *kp = &keep[nkeep++];
        kp->t = *t;
        kp->aux = aux, kp->r = r, kp->nwrt = nwrt;
        for (int k = 0; k < 3; k++) kp->x[k] = x[k], kp->g[k] = g[k], x[k] = g[k] = NULL;
        aux = r = NULL;
    }
    for (int k = 0; k < 3; k++) sg_release(x[k]), sg_release(g[k]), free(xv[k]);
    sg_release(aux), sg_release(y), sg_release(r), sg_release(yr), sg_release(loss);
    free(rv);
}

/* Every op case in one step: forward, loss and sg_grad, all captured. */
static sg_status all_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)c, (void)in, (void)user;
    sg_status s = SG_OK;
    for (int i = 0; i < nkeep && s == SG_OK; i++) {
        kept *kp = &keep[i];
        sg_tensor *loss = sg_sum(sg_mul(sg_forward(&kp->t, kp->x, kp->aux), kp->r), 0, NULL, false);
        s = sg_grad(loss, kp->nwrt, kp->x, out);
        out += kp->nwrt;
    }
    return s;
}

static void compiled_all(void) {
    static const sg_mode modes[3] = {SG_MODE_DEFAULT, SG_MODE_REDUCE_OVERHEAD,
                                     SG_MODE_MAX_AUTOTUNE};
    int nout = 0;
    for (int i = 0; i < nkeep; i++) nout += keep[i].nwrt;
    sg_tensor **out = calloc((size_t)nout, sizeof *out);
    for (int m = 0; m < 3; m++) {
        sg_fn *fn = NULL;
        bool ok = TU_EXPECT(sg_compile(ctx, all_step, NULL, 0, nout,
                                       &(sg_compile_opts){.mode = modes[m], .fullgraph = true},
                                       &fn) == SG_OK);
        for (int call = 0; ok && call < 2; call++) {
            sg_mark_step_begin(ctx);
            ok = TU_EXPECT(sg_call(fn, NULL, 0, out, nout) == SG_OK);
            int j = 0;
            for (int i = 0; ok && i < nkeep; i++)
                for (int k = 0; ok && k < keep[i].nwrt; k++, j++) {
                    bool half = keep[i].t.dt != SG_F32;
                    ok = same(keep[i].t.name, out[j], keep[i].g[k], half ? 2e-2 : 1e-4);
                    if (!ok) fprintf(stderr, "  case %d (%s), input %d\n", i, keep[i].t.name, k);
                }
        }
        if (!ok) fprintf(stderr, "  %s\n", sg_last_error(ctx));
        tu_case(ok, "GRAD_COMPILED(every op case, %d gradients, mode=%s)", nout,
                sg_mode_name(modes[m]));
        sg_fn_destroy(fn);
    }
    free(out);
    for (int i = 0; i < nkeep; i++) {
        for (int k = 0; k < 3; k++) sg_release(keep[i].x[k]), sg_release(keep[i].g[k]);
        sg_release(keep[i].aux), sg_release(keep[i].r);
    }
}

#define S(...)                                                                                     \
    { __VA_ARGS__ }

static uint64_t next_seed = 1; /* each case its own seed, in order */

static void pointwise_cases(void) {
    for (int u = 0; u < NUNOPS; u++) {
        tcase t = {.name = unops[u].name,
                   .kind = K_UN,
                   .op = u,
                   .nin = 1,
                   .nd = {3},
                   .sh = {S(2, 1, 5)},
                   .lo = unops[u].lo,
                   .hi = unops[u].hi};
        grad_case(&t, next_seed++);
    }
    /* Broadcasting both ways, size-1 dims and a lower-rank operand. */
    static const int bnd[3][2] = {{3, 1}, {2, 3}, {3, 3}};
    static const int64_t bsh[3][2][3] = {
        {{2, 3, 4}, {4}}, {{3, 1}, {2, 1, 4}}, {{2, 1, 4}, {1, 3, 1}}};
    for (int b = 0; b < NBINOPS; b++)
        for (int s = 0; s < 3; s++) {
            tcase t = {.name = binops[b].name,
                       .kind = K_BIN,
                       .op = b,
                       .nin = 2,
                       .nd = {bnd[s][0], bnd[s][1]},
                       .lo = binops[b].lo,
                       .hi = binops[b].hi};
            memcpy(t.sh[0], bsh[s][0], sizeof bsh[s][0]);
            memcpy(t.sh[1], bsh[s][1], sizeof bsh[s][1]);
            grad_case(&t, next_seed++);
        }
    tcase wh = {.name = "where",
                .kind = K_WHERE,
                .nin = 3,
                .nd = {2, 1, 2},
                .sh = {S(3, 4), S(4), S(3, 1)},
                .lo = -1,
                .hi = 1};
    grad_case(&wh, next_seed++);
}

static void reduce_row_cases(void) {
    static const char *rn[5] = {"sum", "mean", "max", "min", "var"};
    for (int op = 0; op < 5; op++)
        for (int m = 0; m < 3; m++) {
            static const int masks[3] = {2, 5, 7};
            tcase t = {.name = rn[op],
                       .kind = K_RED,
                       .op = op,
                       .dim = masks[m],
                       .keep = m == 1,
                       .nin = 1,
                       .nd = {3},
                       .sh = {S(3, 4, 2)},
                       .lo = -2,
                       .hi = 2};
            grad_case(&t, next_seed++);
        }
    for (int d = 0; d < 3; d++) {
        tcase t = {.name = "softmax",
                   .kind = K_SOFTMAX,
                   .dim = d,
                   .nin = 1,
                   .nd = {3},
                   .sh = {S(2, 3, 4)},
                   .lo = -2,
                   .hi = 2};
        grad_case(&t, next_seed++);
        t.name = "log_softmax", t.kind = K_LOGSOFTMAX;
        grad_case(&t, next_seed++);
    }
    for (int w = 0; w < 2; w++) {
        tcase ln = {.name = "layer_norm",
                    .kind = K_LN,
                    .keep = w,
                    .nin = w ? 3 : 1,
                    .nd = {3, 1, 1},
                    .sh = {S(2, 3, 6), S(6), S(6)},
                    .lo = -2,
                    .hi = 2};
        grad_case(&ln, next_seed++);
        tcase rms = {.name = "rms_norm",
                     .kind = K_RMS,
                     .keep = w,
                     .nin = w ? 2 : 1,
                     .nd = {2, 1},
                     .sh = {S(4, 5), S(5)},
                     .lo = -2,
                     .hi = 2};
        grad_case(&rms, next_seed++);
    }
    tcase ce = {.name = "cross_entropy",
                .kind = K_CE,
                .nin = 1,
                .nd = {2},
                .sh = {S(6, 5)},
                .lo = -3,
                .hi = 3,
                .naux = 6,
                .auxmax = 5};
    grad_case(&ce, next_seed++);
}

static void matmul_data_cases(void) {
    static const int mnd[5][2] = {{2, 2}, {3, 2}, {4, 3}, {1, 3}, {1, 1}};
    static const int64_t msh[5][2][4] = {{{3, 4}, {4, 5}},
                                         {{2, 3, 4}, {4, 2}},
                                         {{2, 1, 3, 4}, {3, 4, 2}},
                                         {{4}, {2, 4, 3}},
                                         {{5}, {5}}};
    for (int s = 0; s < 5; s++) {
        tcase t = {.name = "matmul",
                   .kind = K_MATMUL,
                   .nin = 2,
                   .nd = {mnd[s][0], mnd[s][1]},
                   .lo = -1,
                   .hi = 1};
        memcpy(t.sh[0], msh[s][0], sizeof msh[s][0]);
        memcpy(t.sh[1], msh[s][1], sizeof msh[s][1]);
        grad_case(&t, next_seed++);
    }
    tcase mv = {.name = "matmul",
                .kind = K_MATMUL,
                .nin = 2,
                .nd = {3, 1},
                .sh = {S(2, 3, 4), S(4)},
                .lo = -1,
                .hi = 1};
    grad_case(&mv, next_seed++);
    for (int bias = 0; bias < 2; bias++) {
        tcase t = {.name = "linear",
                   .kind = K_LINEAR,
                   .keep = bias,
                   .nin = bias ? 3 : 2,
                   .nd = {3, 2, 1},
                   .sh = {S(2, 3, 4), S(5, 4), S(5)},
                   .lo = -1,
                   .hi = 1};
        grad_case(&t, next_seed++);
    }
    tcase emb = {.name = "embedding",
                 .kind = K_EMB,
                 .nin = 1,
                 .nd = {2},
                 .sh = {S(5, 3)},
                 .lo = -1,
                 .hi = 1,
                 .naux = 9,
                 .auxmax = 5};
    grad_case(&emb, next_seed++);
    for (int d = 0; d < 2; d++) {
        tcase t = {.name = "index_select",
                   .kind = K_ISEL,
                   .dim = d,
                   .nin = 1,
                   .nd = {2},
                   .sh = {S(4, 3)},
                   .lo = -1,
                   .hi = 1,
                   .naux = 7,
                   .auxmax = d ? 3 : 4};
        grad_case(&t, next_seed++);
    }
    tcase cat = {.name = "concat",
                 .kind = K_CONCAT,
                 .dim = 1,
                 .nin = 3,
                 .nd = {2, 2, 2},
                 .sh = {S(3, 2), S(3, 1), S(3, 4)},
                 .lo = -1,
                 .hi = 1};
    grad_case(&cat, next_seed++);
    for (int causal = 0; causal < 2; causal++) {
        tcase t = {.name = causal ? "sdpa_causal" : "sdpa",
                   .kind = K_SDPA,
                   .keep = causal,
                   .nin = 3,
                   .nd = {3, 3, 3},
                   .sh = {S(2, 3, 4), S(2, 5, 4), S(2, 5, 3)},
                   .lo = -1,
                   .hi = 1};
        grad_case(&t, next_seed++);
    }
}

static void half_cases(void) {
    /* Half precision: the gradients come out in the leaves' dtype. */
    for (int h = 0; h < 2; h++) {
        sg_dtype dt = h ? SG_F16 : SG_BF16;
        tcase lin = {.name = "linear",
                     .kind = K_LINEAR,
                     .keep = true,
                     .nin = 3,
                     .nd = {2, 2, 1},
                     .sh = {S(3, 4), S(5, 4), S(5)},
                     .lo = -1,
                     .hi = 1,
                     .dt = dt};
        grad_case(&lin, next_seed++);
        tcase ln = {.name = "layer_norm",
                    .kind = K_LN,
                    .keep = true,
                    .nin = 3,
                    .nd = {2, 1, 1},
                    .sh = {S(3, 6), S(6), S(6)},
                    .lo = -2,
                    .hi = 2,
                    .dt = dt};
        grad_case(&ln, next_seed++);
        tcase sm = {.name = "softmax",
                    .kind = K_SOFTMAX,
                    .dim = 1,
                    .nin = 1,
                    .nd = {2},
                    .sh = {S(3, 5)},
                    .lo = -2,
                    .hi = 2,
                    .dt = dt};
        grad_case(&sm, next_seed++);
        tcase gt = {.name = "gelu_tanh",
                    .kind = K_UN,
                    .op = 12,
                    .nin = 1,
                    .nd = {2},
                    .sh = {S(3, 5)},
                    .lo = -3,
                    .hi = 3,
                    .dt = dt};
        grad_case(&gt, next_seed++);
        tcase ce = {.name = "cross_entropy",
                    .kind = K_CE,
                    .nin = 1,
                    .nd = {2},
                    .sh = {S(6, 5)},
                    .lo = -3,
                    .hi = 3,
                    .naux = 6,
                    .auxmax = 5,
                    .dt = dt};
        grad_case(&ce, next_seed++);
        tcase emb = {.name = "embedding",
                     .kind = K_EMB,
                     .nin = 1,
                     .nd = {2},
                     .sh = {S(5, 3)},
                     .lo = -1,
                     .hi = 1,
                     .naux = 9,
                     .auxmax = 5,
                     .dt = dt};
        grad_case(&emb, next_seed++);
    }
}

static void view_cases(void) {
    static const char *vn[] = {"reshape", "permute",   "transpose", "slice",      "narrow",
                               "expand",  "unsqueeze", "squeeze",   "contiguous", "clone"};
    for (int v = 0; v <= V_CLONE; v++) {
        tcase t = {.name = vn[v],
                   .kind = K_VIEW,
                   .op = v,
                   .nin = 1,
                   .nd = {3},
                   .sh = {S(2, 3, 4)},
                   .lo = -1,
                   .hi = 1};
        if (v == V_EXPAND) t.nd[0] = 2, t.sh[0][0] = 4, t.sh[0][1] = 1, t.sh[0][2] = 0;
        if (v == V_SQUEEZE) t.sh[0][1] = 1;
        grad_case(&t, next_seed++);
    }
}

/* ------------------------------------------------------------ slices of one tensor */

/*
 * Gradients of several slices of one x (4, 10, 6) taken apart: loss =
 * sum_k sum(slice_k(x) * r_k) (+ sum(x * r) when x is also used whole),
 * so d loss / dx = the sum of each r_k placed where its slice lies (and
 * r). Slices that cover dim 1, that leave gaps, that overlap, of step 2,
 * in any order, and the parts of a concat of narrows (whose gradients are
 * views of the concat's gradient, placed with no copy), each against that
 * f64 sum, eagerly and compiled.
 */
typedef struct scase {
    const char *name;
    int n; /* slices */
    int64_t start[3], len[3], step[3];
    bool whole, concat;
} scase;

#define SLICES 3

static const scase *slice_case;
static sg_tensor *slice_x, *slice_r[SLICES + 1];

static sg_tensor *slice_loss(void) {
    const scase *c = slice_case;
    sg_tensor *part[SLICES], *loss = NULL;
    for (int k = 0; k < c->n; k++) {
        int64_t st = c->step[k] ? c->step[k] : 1;
        part[k] = sg_slice(slice_x, 1, c->start[k], c->start[k] + (c->len[k] - 1) * st + 1, st);
    }
    if (c->concat) { /* one product of the concat: its gradient, narrowed, is each part's */
        sg_tensor *cat = sg_concat(c->n, part, 1);
        loss = sg_sum(sg_mul(cat, slice_r[0]), 0, NULL, false);
    } else {
        for (int k = 0; k < c->n; k++) {
            sg_tensor *l = sg_sum(sg_mul(part[k], slice_r[k]), 0, NULL, false);
            loss = loss ? sg_add(loss, l) : l;
        }
    }
    if (c->whole) loss = sg_add(loss, sg_sum(sg_mul(slice_x, slice_r[SLICES]), 0, NULL, false));
    return loss;
}

static sg_status slice_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)c, (void)in, (void)user;
    return sg_grad(slice_loss(), 1, &slice_x, out);
}

static void slice_group_case(const scase *c, sg_dtype dt, uint64_t seed) {
    tu_seed(seed);
    const int64_t B = 4, W = 10, E = 6, xs[3] = {B, W, E};
    double *xv, *rv[SLICES + 1] = {NULL}, *want = calloc((size_t)(B * W * E), sizeof(double));
    slice_case = c;
    slice_x = tu_rand(ctx, dt, 3, xs, -1, 1, &xv);
    sg_requires_grad_(slice_x, true);
    int64_t at = 0; /* concat: the part's first column in the concat */
    for (int k = 0; k <= SLICES; k++) {
        bool used = k == SLICES ? c->whole : k < c->n && (!c->concat || k == 0);
        int64_t cols = k == SLICES ? W : c->concat ? 0 : c->len[k];
        for (int j = 0; c->concat && k == 0 && j < c->n; j++) cols += c->len[j];
        int64_t rs[3] = {B, cols, E};
        slice_r[k] = used ? tu_rand(ctx, dt, 3, rs, -1, 1, &rv[k]) : NULL;
    }
    for (int k = 0; k < c->n; k++) {
        int64_t st = c->step[k] ? c->step[k] : 1;
        for (int64_t b = 0; b < B; b++)
            for (int64_t j = 0; j < c->len[k]; j++)
                for (int64_t e = 0; e < E; e++) {
                    int64_t col = c->concat ? at + j : j, cols = c->concat ? 0 : c->len[k];
                    for (int i = 0; c->concat && i < c->n; i++) cols += c->len[i];
                    want[(b * W + c->start[k] + j * st) * E + e] +=
                        rv[c->concat ? 0 : k][(b * cols + col) * E + e];
                }
        at += c->len[k];
    }
    for (int64_t i = 0; c->whole && i < B * W * E; i++) want[i] += rv[SLICES][i];
    sg_tensor *g = NULL, *out = NULL;
    bool ok = TU_EXPECT(sg_grad(slice_loss(), 1, &slice_x, &g) == SG_OK);
    double *got = ok ? tu_read(g) : NULL, tol = dt == SG_F32 ? 1e-6 : 1e-2;
    ok = ok && TU_EXPECT(got != NULL) &&
         TU_EXPECT(tu_close("eager", got, want, B * W * E, tol, tol));
    sg_fn *fn = NULL;
    ok = ok &&
         TU_EXPECT(sg_compile(ctx, slice_step, NULL, 0, 1,
                              &(sg_compile_opts){.mode = SG_MODE_REDUCE_OVERHEAD}, &fn) == SG_OK);
    for (int call = 0; ok && call < 2; call++) {
        sg_mark_step_begin(ctx);
        double *cv = NULL;
        ok = TU_EXPECT(sg_call(fn, NULL, 0, &out, 1) == SG_OK) && TU_EXPECT(cv = tu_read(out)) &&
             TU_EXPECT(tu_close("compiled", cv, want, B * W * E, tol, tol));
        free(cv);
    }
    if (ok && c->concat &&
        c->start[0] == 0) { /* covered: no zeros, no add, one copy (the result) */
        const char *ex = sg_fn_explain(fn), *p = ex;
        int copies = 0;
        while ((p = strstr(p, "= copy(")) != NULL) copies++, p++;
        ok = TU_EXPECT(copies == 1) && TU_EXPECT(strstr(ex, "= fill(0") == NULL) &&
             TU_EXPECT(strstr(ex, "= add(") == NULL);
        if (!ok) fprintf(stderr, "%s\n", ex);
    }
    tu_case(ok, "SLICE_GRAD(%s,type=%s) seed=%llu", c->name, sg_dtype_name(dt),
            (unsigned long long)seed);
    sg_fn_destroy(fn);
    sg_release(g), sg_release(slice_x);
    for (int k = 0; k <= SLICES; k++) sg_release(slice_r[k]), free(rv[k]);
    free(xv), free(want), free(got);
}

static void slice_group_cases(void) {
    static const scase cases[] = {
        {"cover", 3, {0, 3, 7}, {3, 4, 3}, {0}, false, false},
        {"cover_unordered", 3, {7, 0, 3}, {3, 3, 4}, {0}, false, false},
        {"gaps", 2, {1, 5}, {2, 4}, {0}, false, false},
        {"overlap", 2, {0, 4}, {6, 6}, {0}, false, false},
        {"step2", 2, {0, 1}, {5, 5}, {2, 2}, false, false},
        {"cover_and_whole", 3, {0, 3, 7}, {3, 4, 3}, {0}, true, false},
        {"concat_cover", 3, {0, 3, 7}, {3, 4, 3}, {0}, false, true},
        {"concat_gaps", 2, {1, 5}, {2, 4}, {0}, false, true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        slice_group_case(&cases[i], SG_F32, next_seed++);
        slice_group_case(&cases[i], SG_BF16, next_seed++);
    }
}

static void op_cases(void) {
    pointwise_cases();
    reduce_row_cases();
    matmul_data_cases();
    half_cases();
    view_cases();
    slice_group_cases();
}

/* ------------------------------------------------------------ a model, eager and compiled */

enum { V = 11, D = 8, H = 12, C = 5, NP = 7 };

typedef struct model {
    sg_tensor *p[NP]; /* emb (V, D), ln w, ln b (D), w1 (H, D), b1 (H), w2 (C, H), b2 (C) */
} model;

static void model_init(model *m, uint64_t seed) {
    static const int nd[NP] = {2, 1, 1, 2, 1, 2, 1};
    static const int64_t sh[NP][2] = {{V, D}, {D}, {D}, {H, D}, {H}, {C, H}, {C}};
    tu_seed(seed);
    for (int k = 0; k < NP; k++) {
        double *v;
        m->p[k] = tu_rand(ctx, SG_F32, nd[k], sh[k], -0.5, 0.5, &v);
        free(v);
        sg_requires_grad_(m->p[k], true);
    }
}

static void model_free(model *m) {
    for (int k = 0; k < NP; k++) sg_release(m->p[k]);
}

/* Embedding, layer_norm, linear + gelu_tanh, a broadcast residual through a
 * transposed view, linear, cross_entropy: the loss of ids against targets. */
static sg_tensor *model_loss(const model *m, sg_tensor *ids, sg_tensor *targets) {
    sg_tensor *const *p = m->p;
    sg_tensor *e = sg_embedding(p[0], ids);
    sg_tensor *h = sg_layer_norm(e, p[1], p[2], 1e-5);
    sg_tensor *a = sg_gelu_tanh(sg_linear(h, p[3], p[4]));
    sg_tensor *at = sg_transpose(a, 0, 1);
    sg_tensor *s = sg_mean(at, 1, (int[]){0}, true); /* (1, n): per sample */
    sg_tensor *r = sg_add(a, sg_mul_scalar(sg_transpose(s, 0, 1), 0.5));
    sg_tensor *logits = sg_linear(sg_sigmoid(r), p[5], p[6]);
    return sg_cross_entropy(logits, targets); /* the rest goes with the context or the step */
}

static sg_status model_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)c;
    const model *m = user;
    out[0] = model_loss(m, in[0], in[1]);
    return sg_grad(out[0], NP, m->p, out + 1);
}

static void batch(int64_t n, uint64_t seed, sg_tensor **ids, sg_tensor **targets) {
    int64_t iv[64], tv[64];
    tu_seed(seed);
    for (int64_t i = 0; i < n; i++) iv[i] = tu_randint(0, V - 1), tv[i] = tu_randint(0, C - 1);
    *ids = sg_from_host(ctx, SG_I64, 1, &n, iv);
    *targets = sg_from_host(ctx, SG_I64, 1, &n, tv);
}

static bool same(const char *what, sg_tensor *got, sg_tensor *want, double rtol) {
    double *g = tu_read(got), *w = tu_read(want);
    bool ok = TU_EXPECT(g && w) && TU_EXPECT(sg_tensor_numel(got) == sg_tensor_numel(want)) &&
              TU_EXPECT(tu_close(what, g, w, sg_tensor_numel(want), rtol, 1e-6));
    free(g), free(w);
    return ok;
}

static void compiled_cases(void) {
    static const sg_mode modes[3] = {SG_MODE_DEFAULT, SG_MODE_REDUCE_OVERHEAD,
                                     SG_MODE_MAX_AUTOTUNE};
    model m;
    model_init(&m, 11);
    sg_tensor *ids, *targets, *want[1 + NP];
    batch(12, 12, &ids, &targets);
    sg_tensor *in[2] = {ids, targets};
    bool ok = TU_EXPECT(model_step(ctx, in, want, &m) == SG_OK);
    tu_case(ok, "GRAD_EAGER(model,n=12) seed=11");
    for (int k = 0; ok && k < 3; k++) {
        sg_fn *fn = NULL;
        ok = TU_EXPECT(sg_compile(ctx, model_step, &m, 2, 1 + NP,
                                  &(sg_compile_opts){.mode = modes[k], .fullgraph = true},
                                  &fn) == SG_OK);
        for (int call = 0; ok && call < 2; call++) {
            sg_tensor *out[1 + NP];
            sg_mark_step_begin(ctx);
            ok = TU_EXPECT(sg_call(fn, in, 2, out, 1 + NP) == SG_OK);
            for (int j = 0; ok && j <= NP; j++) ok = same("compiled", out[j], want[j], 1e-4);
        }
        if (!ok) fprintf(stderr, "  %s\n", sg_last_error(ctx));
        tu_case(ok, "GRAD_COMPILED(model,mode=%s,n=12) seed=11", sg_mode_name(modes[k]));
        sg_fn_destroy(fn);
    }
    for (int j = 0; j <= NP; j++) sg_release(want[j]);
    sg_release(ids), sg_release(targets);

    /* 4 micro-batches of 6, each loss / 4, add up to one batch of 24. */
    sg_tensor *big[2], *full[1 + NP], *acc[NP] = {NULL};
    batch(24, 13, &big[0], &big[1]);
    ok = TU_EXPECT(model_step(ctx, big, full, &m) == SG_OK);
    for (int mb = 0; ok && mb < 4; mb++) {
        sg_tensor *part[2] = {sg_narrow(big[0], 0, 6 * mb, 6), sg_narrow(big[1], 0, 6 * mb, 6)};
        sg_tensor *loss = sg_mul_scalar(model_loss(&m, part[0], part[1]), 0.25), *g[NP];
        ok = TU_EXPECT(sg_grad(loss, NP, m.p, g) == SG_OK);
        for (int j = 0; ok && j < NP; j++) {
            sg_tensor *sum = acc[j] ? sg_add(acc[j], g[j]) : sg_clone(g[j]);
            sg_release(acc[j]), sg_release(g[j]);
            acc[j] = sum;
        }
        sg_release(part[0]), sg_release(part[1]), sg_release(loss);
    }
    for (int j = 0; ok && j < NP; j++) ok = same("accumulated", acc[j], full[j + 1], 1e-4);
    tu_case(ok, "GRAD_ACCUMULATE(model,4x6 vs 24) seed=13");
    for (int j = 0; j < NP; j++) sg_release(acc[j]);
    for (int j = 0; j <= NP; j++) sg_release(full[j]);
    sg_release(big[0]), sg_release(big[1]);
    model_free(&m);
}

/* ------------------------------------------------------------ training across modes */

typedef struct mlp {
    sg_tensor *p[4]; /* w1 (16, 8), b1 (16), w2 (4, 16), b2 (4) */
} mlp;

static sg_status sgd_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    mlp *m = user;
    sg_tensor *h = sg_relu(sg_linear(in[0], m->p[0], m->p[1]));
    sg_tensor *loss = sg_cross_entropy(sg_linear(h, m->p[2], m->p[3]), in[1]), *g[4];
    sg_status s = sg_grad(loss, 4, m->p, g);
    if (s != SG_OK) return s;
    sg_set_grad_enabled(c, false);
    for (int k = 0; k < 4 && s == SG_OK; k++) /* an optimizer call goes here */
        s = sg_copy_(m->p[k], sg_sub(m->p[k], sg_mul_scalar(g[k], 0.5)));
    sg_set_grad_enabled(c, true);
    out[0] = loss;
    return s;
}

static double train(sg_mode mode, double *first) {
    static const int nd[4] = {2, 1, 2, 1};
    static const int64_t sh[4][2] = {{16, 8}, {16}, {4, 16}, {4}}, xs[2] = {16, 8};
    mlp m;
    double *v, last = NAN;
    tu_seed(21);
    for (int k = 0; k < 4; k++) {
        m.p[k] = tu_rand(ctx, SG_F32, nd[k], sh[k], -0.4, 0.4, &v);
        free(v);
        sg_requires_grad_(m.p[k], true);
    }
    sg_tensor *x = tu_rand(ctx, SG_F32, 2, xs, -1, 1, &v), *t;
    free(v);
    int64_t tv[16], n = 16;
    for (int i = 0; i < 16; i++) tv[i] = tu_randint(0, 3);
    t = sg_from_host(ctx, SG_I64, 1, &n, tv);
    sg_fn *fn;
    sg_tensor *in[2] = {x, t}, *out[1];
    sg_status s = sg_compile(ctx, sgd_step, &m, 2, 1, &(sg_compile_opts){.mode = mode}, &fn);
    for (int step = 0; s == SG_OK && step < 50; step++) {
        sg_mark_step_begin(ctx);
        s = sg_call(fn, in, 2, out, 1);
        if (s == SG_OK) s = sg_item(out[0], &last);
        if (step == 0) *first = last;
    }
    if (s != SG_OK) fprintf(stderr, "  train %s: %s\n", sg_mode_name(mode), sg_last_error(ctx));
    sg_fn_destroy(fn);
    for (int k = 0; k < 4; k++) sg_release(m.p[k]);
    sg_release(x), sg_release(t);
    return s == SG_OK ? last : NAN;
}

static void training_cases(void) {
    static const sg_mode modes[4] = {SG_MODE_EAGER, SG_MODE_DEFAULT, SG_MODE_REDUCE_OVERHEAD,
                                     SG_MODE_MAX_AUTOTUNE};
    double first, ref = train(SG_MODE_EAGER, &first);
    tu_case(TU_EXPECT(ref < 0.5 * first), "TRAIN_MLP(mode=eager,steps=50,loss %g -> %g) seed=21",
            first, ref);
    for (int k = 1; k < 4; k++) {
        double f, l = train(modes[k], &f);
        tu_case(TU_EXPECT(fabs(l - ref) <= 1e-4 * fabs(ref) + 1e-6),
                "TRAIN_MLP(mode=%s,steps=50,loss %.7g vs eager %.7g) seed=21",
                sg_mode_name(modes[k]), l, ref);
    }
}

/* ------------------------------------------------------------ rules of use */

/* pow's gradients where the base is 0: d/da a^b = b a^(b-1) is 0 where b
 * is 0 (as torch; a^-1 is inf there), d/db = a^b log a is 0 where a is 0. */
static void pow_zero_case(void) {
    double av[4] = {0, 0, 0, 2}, bv[4] = {0, 2, 1, 0}, da[4] = {0, 0, 1, 0};
    double db[4] = {0, 0, 0, log(2.0)};
    int64_t sh[1] = {4};
    float af[4], bf[4];
    for (int i = 0; i < 4; i++) af[i] = (float)av[i], bf[i] = (float)bv[i];
    sg_tensor *a = sg_from_host(ctx, SG_F32, 1, sh, af), *b = sg_from_host(ctx, SG_F32, 1, sh, bf);
    sg_requires_grad_(a, true), sg_requires_grad_(b, true);
    sg_tensor *wrt[2] = {a, b}, *g[2] = {NULL, NULL};
    sg_tensor *loss = sg_sum(sg_pow(a, b), 0, NULL, false);
    bool ok = TU_EXPECT(sg_grad(loss, 2, wrt, g) == SG_OK);
    double *ga = ok ? tu_read(g[0]) : NULL, *gb = ok ? tu_read(g[1]) : NULL;
    ok = ok && tu_close("d/da", ga, da, 4, 1e-6, 1e-6) && tu_close("d/db", gb, db, 4, 1e-6, 1e-6);
    tu_case(ok, "GRAD_POW_AT_ZERO(a = 0 with b = 0, 2, 1; a = 2 with b = 0) -> finite, as torch");
    free(ga), free(gb);
    sg_release(g[0]), sg_release(g[1]), sg_release(loss), sg_release(a), sg_release(b);
}

/* A compiled step's gradient of its input: the capture holds while the
 * input requires grad; turning that off (or grad mode off) captures anew,
 * and the step then sees no gradient, as eagerly (zeros). */
static sg_tensor *rg_w;
static sg_status rg_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)c, (void)user;
    sg_tensor *loss = sg_sum(sg_mul(sg_mul(in[0], in[0]), rg_w), 0, NULL, false), *g = NULL;
    sg_status s = sg_grad(loss, 1, &in[0], &g);
    out[0] = g;
    return s;
}

static sg_status rg_param_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)c, (void)user;
    sg_tensor *loss = sg_sum(sg_mul(sg_mul(in[0], in[0]), rg_w), 0, NULL, false), *g = NULL;
    sg_status s = sg_grad(loss, 1, &rg_w, &g);
    out[0] = g;
    return s;
}

/* A loss returned by a fn: its outputs carry no recorded backward in any
 * mode, so sg_grad outside the step is refused with the fix named, and
 * the context goes on (the same gradient inside the step works). */
static sg_status loss_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)c, (void)user;
    out[0] = sg_sum(sg_mul(sg_mul(in[0], in[0]), rg_w), 0, NULL, false);
    return out[0] ? SG_OK : sg_ctx_status(c);
}

static void fn_output_loss_case(void) {
    int64_t sh[1] = {3};
    double *xv, *wv;
    sg_tensor *x = tu_rand(ctx, SG_F32, 1, sh, -1, 1, &xv);
    rg_w = tu_rand(ctx, SG_F32, 1, sh, -1, 1, &wv);
    sg_requires_grad_(rg_w, true);
    sg_mode modes[3] = {SG_MODE_EAGER, SG_MODE_DEFAULT, SG_MODE_REDUCE_OVERHEAD};
    for (int mi = 0; mi < 3; mi++) {
        sg_fn *fn, *gfn;
        sg_compile_opts o = {.mode = modes[mi]};
        bool ok = TU_EXPECT(sg_compile(ctx, loss_step, NULL, 1, 1, &o, &fn) == SG_OK) &&
                  TU_EXPECT(sg_compile(ctx, rg_param_step, NULL, 1, 1, &o, &gfn) == SG_OK);
        sg_tensor *loss = NULL, *g = NULL, *dw = NULL;
        ok = ok && TU_EXPECT(sg_call(fn, &x, 1, &loss, 1) == SG_OK) &&
             TU_EXPECT(sg_grad(loss, 1, &rg_w, &g) == SG_ERR_INVALID_ARG) && TU_EXPECT(!g) &&
             TU_EXPECT(strstr(sg_last_error(ctx), "output of a compiled fn") != NULL) &&
             TU_EXPECT(strstr(sg_last_error(ctx), "inside the step") != NULL);
        sg_clear_error(ctx);
        double ref[3];
        for (int i = 0; i < 3; i++) ref[i] = xv[i] * xv[i];
        ok = ok && TU_EXPECT(sg_call(gfn, &x, 1, &dw, 1) == SG_OK);
        double *got = ok ? tu_read(dw) : NULL;
        ok = ok && tu_close("dw", got, ref, 3, tu_rtol(SG_F32), tu_atol(SG_F32));
        free(got);
        tu_case(ok,
                "GRAD_FN_OUTPUT(mode=%s: sg_grad of a fn's output refused, inside the step works)",
                sg_mode_name(modes[mi]));
        sg_fn_destroy(fn);
        sg_fn_destroy(gfn);
    }
    sg_requires_grad_(rg_w, false);
    sg_release(x), sg_release(rg_w);
    free(xv), free(wv);
}

static void requires_grad_guard_case(void) {
    int64_t sh[1] = {3};
    double *xv, *wv;
    sg_tensor *x = tu_rand(ctx, SG_F32, 1, sh, -1, 1, &xv);
    rg_w = tu_rand(ctx, SG_F32, 1, sh, -1, 1, &wv);
    sg_mode modes[2] = {SG_MODE_DEFAULT, SG_MODE_REDUCE_OVERHEAD};
    for (int mi = 0; mi < 2; mi++) {
        sg_fn *fn;
        sg_compile_opts o = {.mode = modes[mi]};
        bool ok = TU_EXPECT(sg_compile(ctx, rg_step, NULL, 1, 1, &o, &fn) == SG_OK);
        double ref[3];
        for (int i = 0; i < 3; i++) ref[i] = 2 * xv[i] * wv[i];
        for (int phase = 0; ok && phase < 4; phase++) {
            /* 0: x requires grad; 1: not; 2: again; 3: it does, grad mode off */
            sg_requires_grad_(x, phase != 1);
            sg_set_grad_enabled(ctx, phase != 3);
            sg_tensor *y = NULL;
            if (phase == 1 || phase == 3) { /* nothing recorded: refused, not zeros */
                ok = TU_EXPECT(sg_call(fn, &x, 1, &y, 1) == SG_ERR_INVALID_ARG) &&
                     TU_EXPECT(strstr(sg_last_error(ctx), "does not require grad") != NULL);
                sg_clear_error(ctx);
                continue;
            }
            ok = TU_EXPECT(sg_call(fn, &x, 1, &y, 1) == SG_OK);
            double *got = ok ? tu_read(y) : NULL;
            ok = ok && tu_close("dx", got, ref, 3, tu_rtol(SG_F32), tu_atol(SG_F32));
            free(got);
            sg_release(y);
        }
        sg_set_grad_enabled(ctx, true);
        sg_fn_stats st = {0};
        sg_fn_get_stats(fn, &st);
        ok = ok && TU_EXPECT(st.captures == 3);
        tu_case(ok,
                "GRAD_GUARD(mode=%s: requires grad on, off (refused), on; grad mode off "
                "(refused)) -> %d captures",
                sg_mode_name(modes[mi]), (int)st.captures);
        sg_fn_destroy(fn);
    }
    /* A parameter's requires grad (x requires grad here, so the loss is
     * always recorded): d sum(x x w) / dw = x x while w requires grad, zeros
     * once it stops (a new capture), x x again after. */
    for (int mi = 0; mi < 2; mi++) {
        sg_fn *fn;
        sg_compile_opts o = {.mode = modes[mi]};
        bool ok = TU_EXPECT(sg_compile(ctx, rg_param_step, NULL, 1, 1, &o, &fn) == SG_OK);
        double ref[3], zero[3] = {0, 0, 0};
        for (int i = 0; i < 3; i++) ref[i] = xv[i] * xv[i];
        for (int phase = 0; ok && phase < 4; phase++) {
            sg_requires_grad_(rg_w, phase != 2); /* on, on (no change), off, on */
            sg_tensor *y = NULL;
            ok = TU_EXPECT(sg_call(fn, &x, 1, &y, 1) == SG_OK);
            double *got = ok ? tu_read(y) : NULL;
            ok = ok &&
                 tu_close("dw", got, phase == 2 ? zero : ref, 3, tu_rtol(SG_F32), tu_atol(SG_F32));
            free(got);
            sg_release(y);
        }
        sg_fn_stats st = {0};
        sg_fn_get_stats(fn, &st);
        ok = ok && TU_EXPECT(st.captures == 3);
        tu_case(ok,
                "GRAD_GUARD(mode=%s: a parameter requires grad, still, not (the loss still "
                "does, through x: zeros), again) -> %d captures",
                sg_mode_name(modes[mi]), (int)st.captures);
        sg_fn_destroy(fn);
    }
    sg_release(x), sg_release(rg_w);
    free(xv), free(wv);
}

static void usage_cases(void) {
    pow_zero_case();
    requires_grad_guard_case();
    fn_output_loss_case();
    int64_t sh[2] = {3, 4};
    double *v;
    sg_tensor *w = tu_rand(ctx, SG_F32, 2, sh, -1, 1, &v);
    free(v);
    sg_tensor *x = tu_rand(ctx, SG_F32, 2, sh, -1, 1, &v);
    free(v);
    sg_tensor *other = sg_zeros(ctx, SG_F32, 2, sh);
    sg_requires_grad_(w, true);
    sg_requires_grad_(other, true);

    /* An in-place write to a tensor the backward reads is reported. */
    sg_tensor *y = sg_mul(w, x), *loss = sg_sum(y, 0, NULL, false), *g[2] = {NULL};
    sg_add_(x, x);
    sg_status s = sg_grad(loss, 1, &w, g);
    bool ok = TU_EXPECT(s == SG_ERR_INVALID_ARG) &&
              TU_EXPECT(strstr(sg_last_error(ctx), "in-place")) && TU_EXPECT(g[0] == NULL);
    tu_case(ok, "GRAD_INPLACE_DETECTED(mul, x written by sg_add_)");
    sg_clear_error(ctx);
    sg_release(y), sg_release(loss);

    /* add reads no input bytes: writing one afterwards is fine. Zeros for
     * a tensor the loss does not depend on; the graph stays for a second call. */
    y = sg_add(w, x);
    loss = sg_sum(y, 0, NULL, false);
    sg_add_(x, x);
    sg_tensor *wrt[2] = {w, other};
    ok = TU_EXPECT(sg_grad(loss, 2, wrt, g) == SG_OK);
    double *g0 = ok ? tu_read(g[0]) : NULL, *g1 = ok ? tu_read(g[1]) : NULL;
    for (int i = 0; ok && i < 12; i++) ok = TU_EXPECT(g0[i] == 1.0) && TU_EXPECT(g1[i] == 0.0);
    free(g0), free(g1), sg_release(g[0]), sg_release(g[1]);
    ok = ok && TU_EXPECT(sg_grad(loss, 2, wrt, g) == SG_OK);
    tu_case(ok, "GRAD_UNUSED_IS_ZERO(add, twice)");
    sg_release(g[0]), sg_release(g[1]), sg_release(y), sg_release(loss);

    /* With respect to an intermediate: d sum(tanh(y)) / dy = 1 - tanh(y)^2. */
    y = sg_mul(w, x);
    sg_tensor *ty = sg_tanh(y);
    loss = sg_sum(ty, 0, NULL, false);
    ok = TU_EXPECT(sg_grad(loss, 1, &y, g) == SG_OK);
    double *yv = ok ? tu_read(y) : NULL, *gv = ok ? tu_read(g[0]) : NULL, ref[12];
    for (int i = 0; ok && i < 12; i++) ref[i] = 1 - tanh(yv[i]) * tanh(yv[i]);
    ok = ok && TU_EXPECT(tu_close("grad", gv, ref, 12, 1e-5, 1e-6));
    tu_case(ok, "GRAD_WRT_INTERMEDIATE(sum(tanh(y)), y = w * x)");
    free(gv);
    sg_release(g[0]), sg_release(ty), sg_release(loss);

    /* Intermediates released before sg_grad: the graph keeps what it needs.
     * d sum(tanh(y)) / dw = (1 - tanh(y)^2) * x. */
    sg_tensor *wx = sg_mul(w, x);
    ty = sg_tanh(wx);
    sg_release(wx);
    loss = sg_sum(ty, 0, NULL, false);
    sg_release(ty);
    double *xv = tu_read(x);
    ok = TU_EXPECT(sg_grad(loss, 1, &w, g) == SG_OK);
    gv = ok ? tu_read(g[0]) : NULL;
    for (int i = 0; ok && i < 12; i++) ref[i] = (1 - tanh(yv[i]) * tanh(yv[i])) * xv[i];
    ok = ok && TU_EXPECT(tu_close("grad", gv, ref, 12, 1e-5, 1e-6));
    tu_case(ok, "GRAD_AFTER_RELEASE(intermediates released before sg_grad)");
    free(yv), free(gv), free(xv);
    sg_release(g[0]), sg_release(y), sg_release(loss);

    /* no_grad records nothing; ints and non-leaves are refused. */
    sg_set_grad_enabled(ctx, false);
    y = sg_mul(w, w);
    ok = TU_EXPECT(!sg_tensor_requires_grad(y));
    sg_release(y);
    sg_set_grad_enabled(ctx, true);
    y = sg_mul(w, w);
    sg_tensor *ix = sg_zeros(ctx, SG_I64, 2, sh);
    ok = ok && TU_EXPECT(sg_tensor_requires_grad(y)) &&
         TU_EXPECT(sg_requires_grad_(ix, true) == SG_ERR_DTYPE) &&
         TU_EXPECT(sg_requires_grad_(y, false) == SG_ERR_INVALID_ARG) &&
         TU_EXPECT(sg_grad(y, 1, &w, g) == SG_ERR_SHAPE) &&
         TU_EXPECT(sg_grad(NULL, 1, &w, g) == SG_ERR_NULL);
    tu_case(ok, "GRAD_FLAGS(no_grad, int leaf, non-leaf, loss not scalar)");
    sg_clear_error(ctx);
    sg_release(y), sg_release(ix);

    /* A loss that nothing was recorded for (its forward under no_grad, or
     * from a tensor marked only afterwards) is refused, not given zeros;
     * the context stays usable. */
    ok = true;
    for (int how = 0; how < 2; how++) {
        double *vd;
        sg_tensor *v = tu_rand(ctx, SG_F32, 2, sh, -1, 1, &vd);
        free(vd);
        if (how == 0) sg_set_grad_enabled(ctx, false);
        sg_tensor *sq = sg_mul(v, v), *l = sg_sum(sq, 0, NULL, false);
        sg_set_grad_enabled(ctx, true);
        if (how == 1) sg_requires_grad_(v, true);
        g[0] = NULL;
        sg_status st = sg_grad(l, 1, &v, g);
        ok = ok && TU_EXPECT(st == SG_ERR_INVALID_ARG) && TU_EXPECT(g[0] == NULL) &&
             TU_EXPECT(strstr(sg_last_error(ctx), "does not require grad") != NULL) &&
             TU_EXPECT(strstr(sg_last_error(ctx), "sg_requires_grad_") != NULL);
        sg_clear_error(ctx);
        sg_tensor *sq2 = sg_mul(v, v), *l2 = sg_sum(sq2, 0, NULL, false);
        ok = ok && TU_EXPECT(how == 0 || sg_grad(l2, 1, &v, g) == SG_OK);
        if (how == 1 && ok) { /* marked now: 2 v */
            float gv2[12], vv[12];
            ok = TU_EXPECT(sg_read(g[0], gv2, sizeof gv2) == SG_OK) &&
                 TU_EXPECT(sg_read(v, vv, sizeof vv) == SG_OK);
            for (int i = 0; ok && i < 12; i++) ok = TU_EXPECT(fabsf(gv2[i] - 2 * vv[i]) < 1e-5f);
            sg_release(g[0]);
        }
        sg_release(sq), sg_release(l), sg_release(sq2), sg_release(l2), sg_release(v);
    }
    tu_case(ok, "GRAD_LOSS_NOT_RECORDED(forward under no_grad; marked after the forward)");

    /* Eager forward + backward in a loop whose results are released: no
     * growth (the quarantine of released handles is filled first). */
    size_t live0 = 0, live, peak;
    for (int i = 0; i < 4200; i++) sg_release(sg_zeros(ctx, SG_F32, 0, NULL));
    ok = true;
    for (int it = 0; ok && it < 50; it++) {
        sg_tensor *z = sg_linear(x, w, NULL), *h = sg_tanh(z), *p = sg_softmax(h, -1);
        sg_tensor *l = sg_mean(p, 0, NULL, false);
        ok = TU_EXPECT(sg_grad(l, 1, &w, g) == SG_OK);
        sg_release(z), sg_release(h), sg_release(p), sg_release(l), sg_release(g[0]);
        sg_ctx_host_bytes(ctx, &live, &peak);
        if (it == 1) live0 = live;
        if (it > 1) ok = ok && TU_EXPECT(live <= live0);
    }
    tu_case(ok, "GRAD_EAGER_LOOP_NO_GROWTH(50 iterations, host bytes %zu)", live0);
    sg_release(w), sg_release(x), sg_release(other);
}

/* ------------------------------------------------------------ out of memory */

/* Forward and sg_grad with the Nth allocation failing, for every N that
 * fails one: the failure is reported (or the run succeeds with the right
 * gradient), and destroying the context frees every block. */
static bool oom_run(long fail_after, const double *want, bool *failed) {
    tu_alloc a = {0};
    sg_ctx *c = tu_ctx((sg_ctx_opts){.alloc = tu_alloc_hook, .alloc_user = &a});
    int64_t ws[2] = {3, 4}, xs[2] = {2, 4};
    sg_tensor *w = sg_arange(c, SG_F32, -0.5, 0.7, 0.1), *x = sg_full(c, SG_F32, 2, xs, 0.3);
    sg_tensor *w2 = sg_reshape(w, 2, ws), *g = NULL;
    sg_requires_grad_(w2, true);
    a.fail_at = a.count + fail_after;
    sg_tensor *h = sg_gelu_tanh(sg_linear(x, sg_transpose(sg_transpose(w2, 0, 1), 0, 1), NULL));
    sg_tensor *loss = sg_mean(sg_softmax(h, -1), 0, NULL, false);
    sg_status s = sg_grad(loss, 1, &w2, &g);
    *failed = a.count >= a.fail_at;
    a.fail_at = 0;
    bool ok = s == SG_OK || (TU_EXPECT(*failed) && TU_EXPECT(sg_last_error(c)[0] != 0));
    double *got = s == SG_OK ? tu_read(g) : NULL;
    if (s == SG_OK) ok = TU_EXPECT(got && tu_close("grad", got, want, 12, 1e-6, 1e-9));
    free(got);
    sg_ctx_destroy(c);
    return ok && TU_EXPECT(a.live == 0);
}

static void oom_cases(void) {
    double want[12];
    bool failed = true, ok = true;
    /* The clean run's gradient is the reference. */
    tu_alloc a = {0};
    sg_ctx *c = tu_ctx((sg_ctx_opts){.alloc = tu_alloc_hook, .alloc_user = &a});
    int64_t ws[2] = {3, 4}, xs[2] = {2, 4};
    sg_tensor *w = sg_reshape(sg_arange(c, SG_F32, -0.5, 0.7, 0.1), 2, ws), *g = NULL;
    sg_requires_grad_(w, true);
    sg_tensor *h = sg_gelu_tanh(sg_linear(sg_full(c, SG_F32, 2, xs, 0.3), w, NULL));
    ok = TU_EXPECT(sg_grad(sg_mean(sg_softmax(h, -1), 0, NULL, false), 1, &w, &g) == SG_OK);
    double *v = ok ? tu_read(g) : NULL;
    if (v) memcpy(want, v, sizeof want);
    free(v);
    sg_ctx_destroy(c);
    long n = 1;
    for (; ok && failed && n < 5000; n++) ok = oom_run(n, want, &failed);
    tu_case(ok && !failed, "GRAD_OOM(the Nth allocation fails, N = 1..%ld)", n - 1);
}

/* ------------------------------------------------------------ tied embeddings */

/*
 * A tied embedding: W (Vp, C) is the embedding table and, over its first V
 * rows, the LM head: loss = sum(linear(embedding(W, ids), W[:V]) * R). The
 * embedding's rows are added straight into the LM head's gradient (the
 * scatter-add takes the gathered gradient in place). Mode 1 adds
 * sum((W + U) * S); mode 2 has no head: sum(embedding(W, ids) * Re) +
 * sum((W + U) * S), so that W's gradient when the embedding's backward runs
 * is the pass-through tensor U's also is, which must not be written in
 * place. Against an f64 reference, eager and compiled; mode 0 compiled has
 * no add.
 */
enum { TV = 33, TVP = 37, TC = 24, TN = 13 };

static sg_tensor *tied_w, *tied_u, *tied_r, *tied_s, *tied_ids;
static int tied_mode;

static sg_status tied_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)c, (void)in, (void)user;
    sg_tensor *e = sg_embedding(tied_w, tied_ids);
    sg_tensor *y = tied_mode == 2 ? e : sg_linear(e, sg_narrow(tied_w, 0, 0, TV), NULL);
    sg_tensor *loss = sg_sum(sg_mul(y, tied_r), 0, NULL, false);
    if (tied_mode)
        loss = sg_add(loss, sg_sum(sg_mul(sg_add(tied_w, tied_u), tied_s), 0, NULL, false));
    sg_tensor *wrt[2] = {tied_w, tied_u};
    return sg_grad(loss, tied_mode ? 2 : 1, wrt, out);
}

static void tied_case(sg_dtype dt, int mode, uint64_t seed) {
    tu_seed(seed);
    double *w, *u, *r, *sv;
    int64_t ws[2] = {TVP, TC}, rs[2] = {TN, mode == 2 ? TC : TV}, n = TN;
    tied_w = tu_rand(ctx, dt, 2, ws, -1, 1, &w);
    tied_u = tu_rand(ctx, dt, 2, ws, -1, 1, &u);
    tied_s = tu_rand(ctx, dt, 2, ws, -1, 1, &sv);
    tied_r = tu_rand(ctx, dt, 2, rs, -1, 1, &r);
    int64_t iv[TN];
    for (int i = 0; i < TN; i++) iv[i] = tu_randint(0, TVP - 1);
    iv[1] = iv[4]; /* a repeated token */
    tied_ids = sg_from_host(ctx, SG_I64, 1, &n, iv);
    sg_requires_grad_(tied_w, true), sg_requires_grad_(tied_u, mode != 0);
    tied_mode = mode;
    /* f64 reference: the head's rows, the embedding's scatter, the alias term */
    double *dw = calloc(TVP * TC, sizeof(double)), *du = calloc(TVP * TC, sizeof(double));
    for (int i = 0; i < TN && mode == 2; i++)
        for (int c = 0; c < TC; c++) dw[iv[i] * TC + c] += r[i * TC + c];
    for (int i = 0; i < TN && mode != 2; i++)
        for (int v = 0; v < TV; v++)
            for (int c = 0; c < TC; c++) {
                dw[v * TC + c] += r[i * TV + v] * w[iv[i] * TC + c];
                dw[iv[i] * TC + c] += r[i * TV + v] * w[v * TC + c];
            }
    for (int k = 0; mode && k < TVP * TC; k++) dw[k] += sv[k], du[k] = sv[k];
    double tol = dt == SG_F32 ? 1e-5 : 3e-2;
    int ng = mode ? 2 : 1;
    sg_tensor *g[2] = {NULL, NULL};
    bool ok = TU_EXPECT(tied_step(ctx, NULL, g, NULL) == SG_OK);
    for (int k = 0; ok && k < ng; k++) {
        double *got = tu_read(g[k]);
        ok = TU_EXPECT(got != NULL) && tu_close("eager", got, k ? du : dw, TVP * TC, tol, tol);
        free(got);
    }
    for (int k = 0; k < ng; k++) sg_release(g[k]);
    sg_fn *fn = NULL;
    ok = ok && TU_EXPECT(sg_compile(ctx, tied_step, NULL, 0, ng,
                                    &(sg_compile_opts){.mode = SG_MODE_REDUCE_OVERHEAD},
                                    &fn) == SG_OK);
    for (int call = 0; ok && call < 3; call++) {
        sg_tensor *out[2] = {NULL, NULL};
        sg_mark_step_begin(ctx);
        ok = TU_EXPECT(sg_call(fn, NULL, 0, out, ng) == SG_OK);
        for (int k = 0; ok && k < ng; k++) {
            double *got = tu_read(out[k]);
            ok = TU_EXPECT(got != NULL) &&
                 tu_close("compiled", got, k ? du : dw, TVP * TC, tol, tol);
            free(got);
        }
        for (int k = 0; k < ng; k++) sg_release(out[k]);
    }
    const char *ex = ok ? sg_fn_explain(fn) : NULL;
    if (ok && mode == 0) ok = TU_EXPECT(ex && strstr(ex, "= add(") == NULL);
    if (!ok) fprintf(stderr, "  %s\n%s\n", sg_last_error(ctx), ex ? ex : "");
    tu_case(ok, "GRAD_TIED_EMBEDDING(W=[%d,%d], %s, n=%d, %s) seed=%llu", TVP, TC,
            mode == 0   ? "head over 33 rows"
            : mode == 1 ? "head over 33 rows, W + U"
                        : "no head, W + U",
            TN, sg_dtype_name(dt), (unsigned long long)seed);
    sg_fn_destroy(fn);
    sg_release(tied_w), sg_release(tied_u), sg_release(tied_s), sg_release(tied_r);
    sg_release(tied_ids);
    free(w), free(u), free(r), free(sv), free(dw), free(du);
    sg_clear_error(ctx);
}

static void tied_cases(void) {
    for (int mode = 0; mode < 3; mode++) {
        tied_case(SG_F32, mode, 91 + (uint64_t)mode);
        tied_case(SG_BF16, mode, 95 + (uint64_t)mode);
    }
}

int main(void) {
    ctx = tu_ctx((sg_ctx_opts){0});
    op_cases();
    compiled_all();
    usage_cases();
    oom_cases();
    compiled_cases();
    training_cases();
    tied_cases();
    sg_ctx_destroy(ctx);
    return tu_finish();
}
