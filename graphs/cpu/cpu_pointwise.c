/*
 * cpu_pointwise.c -- the eager CPU kernel of every elementwise op: tiles of
 * the output (see cpu.h), inputs gathered with broadcast strides, the op
 * applied to the whole tile, the result scattered in the output's dtype.
 */
#include "cpu.h"

typedef struct tiles {
    float f[3][SG__TILE];
    int64_t i[3][SG__TILE];
} tiles;

static bool is_cmp(sg__op op) { return op >= SG__OP_EQ && op <= SG__OP_GE; }

static float gelu_erf(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); }

static float gelu_tanh(float x) {
    const float k = 0.7978845608028654f; /* sqrt(2/pi) */
    return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}

/* Float-domain ops over one tile: a, b inputs, y output. */
static void apply_f(const sg__node *n, int len, const float *a, const float *b, float *y) {
    float s0 = (float)n->f[0], s1 = (float)n->f[1];
    int k;
    switch (n->op) {
    case SG__OP_NEG: for (k = 0; k < len; k++) y[k] = -a[k]; break;
    case SG__OP_ABS: for (k = 0; k < len; k++) y[k] = fabsf(a[k]); break;
    case SG__OP_EXP: for (k = 0; k < len; k++) y[k] = expf(a[k]); break;
    case SG__OP_LOG: for (k = 0; k < len; k++) y[k] = logf(a[k]); break;
    case SG__OP_SQRT: for (k = 0; k < len; k++) y[k] = sqrtf(a[k]); break;
    case SG__OP_RSQRT: for (k = 0; k < len; k++) y[k] = 1.0f / sqrtf(a[k]); break;
    case SG__OP_SIN: for (k = 0; k < len; k++) y[k] = sinf(a[k]); break;
    case SG__OP_COS: for (k = 0; k < len; k++) y[k] = cosf(a[k]); break;
    case SG__OP_TANH: for (k = 0; k < len; k++) y[k] = tanhf(a[k]); break;
    case SG__OP_SIGMOID: for (k = 0; k < len; k++) y[k] = 1.0f / (1.0f + expf(-a[k])); break;
    case SG__OP_RELU: for (k = 0; k < len; k++) y[k] = a[k] > 0.0f ? a[k] : 0.0f; break;
    case SG__OP_GELU: for (k = 0; k < len; k++) y[k] = gelu_erf(a[k]); break;
    case SG__OP_GELU_TANH: for (k = 0; k < len; k++) y[k] = gelu_tanh(a[k]); break;
    case SG__OP_SILU: for (k = 0; k < len; k++) y[k] = a[k] / (1.0f + expf(-a[k])); break;
    case SG__OP_ADD_SCALAR: for (k = 0; k < len; k++) y[k] = a[k] + s0; break;
    case SG__OP_MUL_SCALAR: for (k = 0; k < len; k++) y[k] = a[k] * s0; break;
    case SG__OP_POW_SCALAR: for (k = 0; k < len; k++) y[k] = powf(a[k], s0); break;
    case SG__OP_CLAMP:
        for (k = 0; k < len; k++) y[k] = a[k] < s0 ? s0 : a[k] > s1 ? s1 : a[k];
        break;
    case SG__OP_ADD: for (k = 0; k < len; k++) y[k] = a[k] + b[k]; break;
    case SG__OP_SUB: for (k = 0; k < len; k++) y[k] = a[k] - b[k]; break;
    case SG__OP_MUL: for (k = 0; k < len; k++) y[k] = a[k] * b[k]; break;
    case SG__OP_DIV: for (k = 0; k < len; k++) y[k] = a[k] / b[k]; break;
    case SG__OP_POW: for (k = 0; k < len; k++) y[k] = powf(a[k], b[k]); break;
    /* NaN propagates through maximum/minimum, as in PyTorch. */
    case SG__OP_MAXIMUM:
        for (k = 0; k < len; k++) y[k] = a[k] != a[k] || a[k] > b[k] ? a[k] : b[k];
        break;
    case SG__OP_MINIMUM:
        for (k = 0; k < len; k++) y[k] = a[k] != a[k] || a[k] < b[k] ? a[k] : b[k];
        break;
    default: SG_ASSERT(!"not a float-domain op"); break;
    }
}

/* Integer-domain ops; wrapping arithmetic is done unsigned to stay defined. */
static void apply_i(const sg__node *n, int len, const int64_t *a, const int64_t *b, int64_t *y) {
    int64_t s0 = (int64_t)n->f[0], s1 = (int64_t)n->f[1];
    int k;
#define WRAP(expr) ((int64_t)(uint64_t)(expr))
    switch (n->op) {
    case SG__OP_NEG: for (k = 0; k < len; k++) y[k] = WRAP(0u - (uint64_t)a[k]); break;
    case SG__OP_ABS: for (k = 0; k < len; k++) y[k] = a[k] < 0 ? WRAP(0u - (uint64_t)a[k]) : a[k]; break;
    case SG__OP_RELU: for (k = 0; k < len; k++) y[k] = a[k] > 0 ? a[k] : 0; break;
    case SG__OP_ADD_SCALAR: for (k = 0; k < len; k++) y[k] = WRAP((uint64_t)a[k] + (uint64_t)s0); break;
    case SG__OP_MUL_SCALAR: for (k = 0; k < len; k++) y[k] = WRAP((uint64_t)a[k] * (uint64_t)s0); break;
    case SG__OP_CLAMP: for (k = 0; k < len; k++) y[k] = a[k] < s0 ? s0 : a[k] > s1 ? s1 : a[k]; break;
    case SG__OP_ADD: for (k = 0; k < len; k++) y[k] = WRAP((uint64_t)a[k] + (uint64_t)b[k]); break;
    case SG__OP_SUB: for (k = 0; k < len; k++) y[k] = WRAP((uint64_t)a[k] - (uint64_t)b[k]); break;
    case SG__OP_MUL: for (k = 0; k < len; k++) y[k] = WRAP((uint64_t)a[k] * (uint64_t)b[k]); break;
    case SG__OP_MAXIMUM: for (k = 0; k < len; k++) y[k] = a[k] > b[k] ? a[k] : b[k]; break;
    case SG__OP_MINIMUM: for (k = 0; k < len; k++) y[k] = a[k] < b[k] ? a[k] : b[k]; break;
    default: SG_ASSERT(!"not an int-domain op"); break;
    }
#undef WRAP
}

static void compare_f(sg__op op, int len, const float *a, const float *b, int64_t *y) {
    for (int k = 0; k < len; k++) {
        switch (op) {
        case SG__OP_EQ: y[k] = a[k] == b[k]; break;
        case SG__OP_NE: y[k] = a[k] != b[k]; break;
        case SG__OP_LT: y[k] = a[k] < b[k]; break;
        case SG__OP_LE: y[k] = a[k] <= b[k]; break;
        case SG__OP_GT: y[k] = a[k] > b[k]; break;
        default: y[k] = a[k] >= b[k]; break;
        }
    }
}

static void compare_i(sg__op op, int len, const int64_t *a, const int64_t *b, int64_t *y) {
    for (int k = 0; k < len; k++) {
        switch (op) {
        case SG__OP_EQ: y[k] = a[k] == b[k]; break;
        case SG__OP_NE: y[k] = a[k] != b[k]; break;
        case SG__OP_LT: y[k] = a[k] < b[k]; break;
        case SG__OP_LE: y[k] = a[k] <= b[k]; break;
        case SG__OP_GT: y[k] = a[k] > b[k]; break;
        default: y[k] = a[k] >= b[k]; break;
        }
    }
}

/* Gather input j's tile as truth values (nonzero), whatever its dtype. */
static void gather_truth(const void *p, sg_dtype dt, int64_t s, int len, tiles *t, int j) {
    if (sg__dtype_is_float(dt)) {
        sg__gather_f(p, dt, s, len, t->f[j]);
        for (int k = 0; k < len; k++) t->i[j][k] = t->f[j][k] != 0.0f;
    } else {
        sg__gather_i(p, dt, s, len, t->i[j]);
        for (int k = 0; k < len; k++) t->i[j][k] = t->i[j][k] != 0;
    }
}

/* One tile: len elements at output offset off[0], input offsets off[1..]. */
static void run_tile(const sg__node *n, void *const *data, const sg_dtype *dt,
                     const int64_t *inner, const int64_t *off, int len, tiles *t) {
    sg__op op = n->op;
    void *y = sg__at(data[0], dt[0], off[0]);
    int64_t ys = inner[0];
    const void *a = n->nin > 0 ? sg__at(data[1], dt[1], off[1]) : NULL;
    const void *b = n->nin > 1 ? sg__at(data[2], dt[2], off[2]) : NULL;
    if (op == SG__OP_FILL) {
        if (sg__dtype_is_float(dt[0])) {
            for (int k = 0; k < len; k++) t->f[0][k] = (float)n->f[0];
            sg__scatter_f(y, dt[0], ys, len, t->f[0]);
        } else {
            for (int k = 0; k < len; k++) t->i[0][k] = (int64_t)n->f[0];
            sg__scatter_i(y, dt[0], ys, len, t->i[0]);
        }
        return;
    }
    if (op == SG__OP_CAST || op == SG__OP_COPY) {
        if (sg__dtype_is_float(dt[1])) {
            sg__gather_f(a, dt[1], inner[1], len, t->f[0]);
            sg__scatter_f(y, dt[0], ys, len, t->f[0]);
        } else {
            sg__gather_i(a, dt[1], inner[1], len, t->i[0]);
            sg__scatter_i(y, dt[0], ys, len, t->i[0]);
        }
        return;
    }
    if (op == SG__OP_LOGICAL_NOT || op == SG__OP_LOGICAL_AND || op == SG__OP_LOGICAL_OR) {
        gather_truth(a, dt[1], inner[1], len, t, 0);
        if (op != SG__OP_LOGICAL_NOT) gather_truth(b, dt[2], inner[2], len, t, 1);
        for (int k = 0; k < len; k++)
            t->i[2][k] = op == SG__OP_LOGICAL_NOT ? !t->i[0][k]
                       : op == SG__OP_LOGICAL_AND ? t->i[0][k] && t->i[1][k]
                                                  : t->i[0][k] || t->i[1][k];
        sg__scatter_i(y, dt[0], ys, len, t->i[2]);
        return;
    }
    if (op == SG__OP_WHERE) {
        const void *c = sg__at(data[3], dt[3], off[3]);
        sg__gather_i(a, dt[1], inner[1], len, t->i[2]); /* cond */
        if (sg__dtype_is_float(dt[0])) {
            sg__gather_f(b, dt[2], inner[2], len, t->f[0]);
            sg__gather_f(c, dt[3], inner[3], len, t->f[1]);
            for (int k = 0; k < len; k++) t->f[2][k] = t->i[2][k] ? t->f[0][k] : t->f[1][k];
            sg__scatter_f(y, dt[0], ys, len, t->f[2]);
        } else {
            sg__gather_i(b, dt[2], inner[2], len, t->i[0]);
            sg__gather_i(c, dt[3], inner[3], len, t->i[1]);
            for (int k = 0; k < len; k++) t->i[2][k] = t->i[2][k] ? t->i[0][k] : t->i[1][k];
            sg__scatter_i(y, dt[0], ys, len, t->i[2]);
        }
        return;
    }
    bool fl = sg__dtype_is_float(dt[1]);
    if (fl) {
        sg__gather_f(a, dt[1], inner[1], len, t->f[0]);
        if (b) sg__gather_f(b, dt[2], inner[2], len, t->f[1]);
    } else {
        sg__gather_i(a, dt[1], inner[1], len, t->i[0]);
        if (b) sg__gather_i(b, dt[2], inner[2], len, t->i[1]);
    }
    if (is_cmp(op)) {
        if (fl)
            compare_f(op, len, t->f[0], t->f[1], t->i[2]);
        else
            compare_i(op, len, t->i[0], t->i[1], t->i[2]);
        sg__scatter_i(y, dt[0], ys, len, t->i[2]);
    } else if (fl) {
        apply_f(n, len, t->f[0], t->f[1], t->f[2]);
        sg__scatter_f(y, dt[0], ys, len, t->f[2]);
    } else {
        apply_i(n, len, t->i[0], t->i[1], t->i[2]);
        sg__scatter_i(y, dt[0], ys, len, t->i[2]);
    }
}

sg_status sg__cpu_pointwise(sg_ctx *ctx, const sg__node *n) {
    const sg_tensor *out = n->out;
    int nops = 1 + n->nin;
    SG_ASSERT(nops <= SG__MAX_OPS);
    int64_t numel = sg__numel(out->ndim, out->shape);
    if (numel == 0) return SG_OK;
    sg__rows r;
    sg__rows_init(&r, out->ndim, out->shape, nops);
    void *data[SG__MAX_OPS];
    sg_dtype dt[SG__MAX_OPS];
    int64_t base[SG__MAX_OPS], inner[SG__MAX_OPS];
    for (int k = 0; k < nops; k++) {
        const sg_tensor *t = k == 0 ? out : n->in[k - 1];
        data[k] = t->st->data;
        dt[k] = t->dtype;
        base[k] = t->offset;
        sg__broadcast_strides(t, out->ndim, out->shape, r.stride[k]);
        inner[k] = out->ndim ? r.stride[k][out->ndim - 1] : 0;
    }
    int64_t per_row = (r.rowlen + SG__TILE - 1) / SG__TILE;
    int64_t ntiles = r.nrows * per_row;
    int nth = sg__cpu_threads(ctx, numel);
#pragma omp parallel num_threads(nth) if (nth > 1)
    {
        tiles t;
        int64_t off[SG__MAX_OPS], row_off[SG__MAX_OPS], cur_row = -1;
#pragma omp for schedule(static)
        for (int64_t tile = 0; tile < ntiles; tile++) {
            int64_t row = tile / per_row, col = (tile % per_row) * SG__TILE;
            if (row != cur_row) {
                sg__rows_offsets(&r, row, row_off);
                cur_row = row;
            }
            int len = (int)(r.rowlen - col < SG__TILE ? r.rowlen - col : SG__TILE);
            for (int k = 0; k < nops; k++) off[k] = base[k] + row_off[k] + col * inner[k];
            run_tile(n, data, dt, inner, off, len, &t);
        }
    }
    return SG_OK;
}
