/* SPDX-License-Identifier: MIT */
/*
 * cpu_pointwise.c -- the eager CPU kernel of every elementwise op. The
 * output's index space is first coalesced (size-1 dims dropped, neighbours
 * that are contiguous in every operand merged, so that rows are as long as
 * the layouts allow), then walked in rows and tiles (see cpu.h): inputs are
 * gathered with broadcast strides into float or int64 tiles, the op runs
 * over the whole tile, and the result is scattered in the output's dtype.
 * f32 operands with unit stride skip the gather and the scatter: the op
 * reads and writes their memory directly.
 *
 * Conversions follow sg_cast: float to int truncates toward zero and
 * saturates, NaN gives 0, nonzero is true, and a value reaches f16 or bf16
 * rounded once (an int or a double goes through a float rounded to odd,
 * which then rounds to the narrow type exactly as the value itself would).
 */
#include "cpu.h"

#ifdef _OPENMP
#define SIMD _Pragma("omp simd")
#else
#define SIMD
#endif

/*
 * Vector libm. glibc (2.35 on, x86-64) ships SIMD versions of expf, logf,
 * sinf, cosf, tanhf, erfcf and powf in libmvec (at most 4 ulp; -lm pulls it
 * in as needed), but math.h announces them only under -ffast-math, whose
 * other effects (no NaN, no inf) would break maximum, minimum and clamp.
 * Declaring them simd here, as math-vector.h would, lets the `omp simd`
 * loops below call 4 lanes at once: tanh over 16M floats ran about 10x
 * faster. Elsewhere the loops call the scalar functions.
 */
#if defined(_OPENMP) && defined(__x86_64__) && defined(__GLIBC__) && !defined(__FAST_MATH__) &&    \
    (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 35))
#pragma omp declare simd notinbranch
float expf(float);
#pragma omp declare simd notinbranch
float logf(float);
#pragma omp declare simd notinbranch
float sinf(float);
#pragma omp declare simd notinbranch
float cosf(float);
#pragma omp declare simd notinbranch
float tanhf(float);
#pragma omp declare simd notinbranch
float erfcf(float);
#pragma omp declare simd notinbranch
float powf(float, float);
#define VSIMD SIMD
#else
#define VSIMD
#endif

typedef struct tiles {
    float f[3][SG__TILE];
    int64_t i[3][SG__TILE];
} tiles;

static bool is_cmp(sg__op op) { return op >= SG__OP_EQ && op <= SG__OP_GE; }

/* ------------------------------------------------------------ conversions */

/* An integer as a float rounded to odd; beyond 2^53 the bits that a double
 * drops are kept as a sticky last bit. */
static float int_round_odd(int64_t v) {
    uint64_t u = v < 0 ? 0 - (uint64_t)v : (uint64_t)v, sticky = 0;
    int sh = 0;
    while (u >> 53) {
        sticky |= u & 1;
        u >>= 1;
        sh++;
    }
    double d = ldexp((double)(u | sticky), sh);
    return sg__round_odd(v < 0 ? -d : d);
}

/* Store an int64 tile into any dtype: ints wrap (as PyTorch's casts do),
 * floats round once. */
static void store_i(void *p, sg_dtype dt, int64_t s, int len, const int64_t *in, float *tmp) {
    if (!sg__dtype_is_float(dt)) {
        sg__scatter_i(p, dt, s, len, in);
        return;
    }
    if (dt == SG_F32)
        for (int k = 0; k < len; k++) tmp[k] = (float)in[k]; /* one rounding already */
    else
        for (int k = 0; k < len; k++) tmp[k] = int_round_odd(in[k]);
    sg__scatter_f(p, dt, s, len, tmp);
}

/* len floats of an operand: its own memory when it is f32 with unit stride,
 * else a tile gathered from it. */
static const float *load_f(const void *p, sg_dtype dt, int64_t s, int len, float *tile) {
    if (dt == SG_F32 && s == 1) return p;
    sg__gather_f(p, dt, s, len, tile);
    return tile;
}

/* ------------------------------------------------------------ float domain */

static inline float gelu_erf(float x) {
    /* erfc keeps its relative accuracy where 1 + erf(x) would cancel (x << 0). */
    return 0.5f * x * erfcf(x * -0.70710678118654752f);
}

static inline float gelu_tanh(float x) {
    const float k = 0.7978845608028654f; /* sqrt(2/pi) */
    return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}

/* gelu_tanh'(x) * g. */
static inline float gelu_tanh_bwd(float x, float g) {
    const float k = 0.7978845608028654f, x2 = x * x;
    float t = tanhf(k * (x + 0.044715f * x2 * x));
    float du = k * (1.0f + 3.0f * 0.044715f * x2);
    return (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du) * g;
}

/* One loop per op, so that the op's switch runs once per tile. */
#define LOOP(expr)                                                                                 \
    SIMD for (k = 0; k < len; k++) y[k] = (expr);                                                  \
    break
/* The same for loops that call libm: vectorized where libmvec is declared. */
#define CALLLOOP(expr)                                                                             \
    VSIMD for (k = 0; k < len; k++) y[k] = (expr);                                                 \
    break

/* Float-domain ops over one tile: a, b inputs, y output (y may be a: in place). */
static void apply_f(const sg__node *n, int len, const float *a, const float *b, float *y) {
    float s0 = (float)n->f[0], s1 = (float)n->f[1];
    int k;
    switch (n->op) {
    case SG__OP_NEG: LOOP(-a[k]);
    case SG__OP_ABS: LOOP(fabsf(a[k]));
    case SG__OP_EXP: CALLLOOP(expf(a[k]));
    case SG__OP_LOG: CALLLOOP(logf(a[k]));
    case SG__OP_SQRT: LOOP(sqrtf(a[k]));
    case SG__OP_RSQRT: LOOP(1.0f / sqrtf(a[k]));
    case SG__OP_SIN: CALLLOOP(sinf(a[k]));
    case SG__OP_COS: CALLLOOP(cosf(a[k]));
    case SG__OP_TANH: CALLLOOP(tanhf(a[k]));
    case SG__OP_SIGMOID: CALLLOOP(1.0f / (1.0f + expf(-a[k])));
    /* NaN passes through relu, as in PyTorch. */
    case SG__OP_RELU: LOOP(a[k] > 0.0f || a[k] != a[k] ? a[k] : 0.0f);
    case SG__OP_GELU: CALLLOOP(gelu_erf(a[k]));
    case SG__OP_GELU_TANH: CALLLOOP(gelu_tanh(a[k]));
    case SG__OP_SILU: CALLLOOP(a[k] / (1.0f + expf(-a[k])));
    case SG__OP_ADD_SCALAR: LOOP(a[k] + s0);
    case SG__OP_MUL_SCALAR: LOOP(a[k] * s0);
    case SG__OP_POW_SCALAR: CALLLOOP(powf(a[k], s0));
    /* NaN passes through clamp (neither comparison holds). */
    case SG__OP_CLAMP: LOOP(a[k] < s0 ? s0 : a[k] > s1 ? s1 : a[k]);
    case SG__OP_ADD: LOOP(a[k] + b[k]);
    case SG__OP_SUB: LOOP(a[k] - b[k]);
    case SG__OP_MUL: LOOP(a[k] * b[k]);
    case SG__OP_DIV: LOOP(a[k] / b[k]);
    case SG__OP_POW: CALLLOOP(powf(a[k], b[k]));
    /* NaN propagates through maximum/minimum from either side, as in PyTorch. */
    case SG__OP_MAXIMUM: LOOP(a[k] != a[k] || a[k] > b[k] ? a[k] : b[k]);
    case SG__OP_MINIMUM: LOOP(a[k] != a[k] || a[k] < b[k] ? a[k] : b[k]);
    case SG__OP_GELU_TANH_BWD: CALLLOOP(gelu_tanh_bwd(a[k], b[k]));
    default: SG_ASSERT(!"not a float-domain op"); break;
    }
}

/* ------------------------------------------------------------ integer domain */

/* Integer-domain ops; wrapping arithmetic is done unsigned to stay defined.
 * Scalars are truncated toward zero and saturated to dt's range. */
static void apply_i(const sg__node *n, sg_dtype dt, int len, const int64_t *a, const int64_t *b,
                    int64_t *y) {
    int64_t s0 = sg__double_to_int(n->f[0], dt), s1 = sg__double_to_int(n->f[1], dt);
    uint64_t u0 = (uint64_t)s0;
    int k;
#define WRAP(expr) ((int64_t)(uint64_t)(expr))
    switch (n->op) {
    case SG__OP_NEG: LOOP(WRAP(0u - (uint64_t)a[k]));
    case SG__OP_ABS: LOOP(a[k] < 0 ? WRAP(0u - (uint64_t)a[k]) : a[k]);
    case SG__OP_RELU: LOOP(a[k] > 0 ? a[k] : 0);
    case SG__OP_ADD_SCALAR: LOOP(WRAP((uint64_t)a[k] + u0));
    case SG__OP_MUL_SCALAR: LOOP(WRAP((uint64_t)a[k] * u0));
    case SG__OP_CLAMP: LOOP(a[k] < s0 ? s0 : a[k] > s1 ? s1 : a[k]);
    case SG__OP_ADD: LOOP(WRAP((uint64_t)a[k] + (uint64_t)b[k]));
    case SG__OP_SUB: LOOP(WRAP((uint64_t)a[k] - (uint64_t)b[k]));
    case SG__OP_MUL: LOOP(WRAP((uint64_t)a[k] * (uint64_t)b[k]));
    case SG__OP_MAXIMUM: LOOP(a[k] > b[k] ? a[k] : b[k]);
    case SG__OP_MINIMUM: LOOP(a[k] < b[k] ? a[k] : b[k]);
    default: SG_ASSERT(!"not an int-domain op"); break;
    }
#undef WRAP
}

/* ------------------------------------------------------------ comparisons, logic */

#define CMPS(a, b, y)                                                                              \
    switch (op) {                                                                                  \
    case SG__OP_EQ: LOOP(a[k] == b[k]);                                                            \
    case SG__OP_NE: LOOP(a[k] != b[k]);                                                            \
    case SG__OP_LT: LOOP(a[k] < b[k]);                                                             \
    case SG__OP_LE: LOOP(a[k] <= b[k]);                                                            \
    case SG__OP_GT: LOOP(a[k] > b[k]);                                                             \
    default: LOOP(a[k] >= b[k]);                                                                   \
    }

static void compare_f(sg__op op, int len, const float *a, const float *b, int64_t *y) {
    int k;
    CMPS(a, b, y)
}

static void compare_i(sg__op op, int len, const int64_t *a, const int64_t *b, int64_t *y) {
    int k;
    CMPS(a, b, y)
}

/* Gather input j's tile as truth values (nonzero; NaN is true), whatever its dtype. */
static void gather_truth(const void *p, sg_dtype dt, int64_t s, int len, tiles *t, int j) {
    if (sg__dtype_is_float(dt)) {
        const float *f = load_f(p, dt, s, len, t->f[j]);
        for (int k = 0; k < len; k++) t->i[j][k] = f[k] != 0.0f;
    } else {
        sg__gather_i(p, dt, s, len, t->i[j]);
        for (int k = 0; k < len; k++) t->i[j][k] = t->i[j][k] != 0;
    }
}

static void logical(sg__op op, int len, const int64_t *a, const int64_t *b, int64_t *y) {
    int k;
    switch (op) {
    case SG__OP_LOGICAL_NOT: LOOP(!a[k]);
    case SG__OP_LOGICAL_AND: LOOP(a[k] && b[k]);
    default: LOOP(a[k] || b[k]);
    }
}

/* ------------------------------------------------------------ tiles */

/* One tile's operands: out y and up to three inputs, each a typed pointer
 * to its first element with its stride along the row. */
typedef struct operands {
    void *y;
    const void *in[3];
    sg_dtype dy, din[3];
    int64_t sy, sin[3];
} operands;

static void fill_tile(const sg__node *n, const operands *o, int len, tiles *t) {
    double v = n->f[0];
    if (sg__dtype_is_float(o->dy)) {
        float f = o->dy == SG_F32 ? (float)v : sg__round_odd(v);
        for (int k = 0; k < len; k++) t->f[0][k] = f;
        sg__scatter_f(o->y, o->dy, o->sy, len, t->f[0]);
    } else {
        int64_t i = sg__double_to_int(v, o->dy);
        for (int k = 0; k < len; k++) t->i[0][k] = i;
        sg__scatter_i(o->y, o->dy, o->sy, len, t->i[0]);
    }
}

static void cast_tile(const operands *o, int len, tiles *t) {
    if (sg__dtype_is_float(o->din[0])) {
        const float *a = load_f(o->in[0], o->din[0], o->sin[0], len, t->f[0]);
        sg__scatter_f(o->y, o->dy, o->sy, len, a); /* saturating, see sg__stf */
    } else {
        sg__gather_i(o->in[0], o->din[0], o->sin[0], len, t->i[0]);
        store_i(o->y, o->dy, o->sy, len, t->i[0], t->f[0]);
    }
}

static void where_tile(const operands *o, int len, tiles *t) {
    sg__gather_i(o->in[0], o->din[0], o->sin[0], len, t->i[2]); /* cond */
    const int64_t *c = t->i[2];
    if (sg__dtype_is_float(o->dy)) {
        const float *a = load_f(o->in[1], o->din[1], o->sin[1], len, t->f[0]);
        const float *b = load_f(o->in[2], o->din[2], o->sin[2], len, t->f[1]);
        bool direct = o->dy == SG_F32 && o->sy == 1;
        float *y = direct ? (float *)o->y : t->f[2];
        SIMD for (int k = 0; k < len; k++) y[k] = c[k] ? a[k] : b[k];
        if (!direct) sg__scatter_f(o->y, o->dy, o->sy, len, y);
    } else {
        sg__gather_i(o->in[1], o->din[1], o->sin[1], len, t->i[0]);
        sg__gather_i(o->in[2], o->din[2], o->sin[2], len, t->i[1]);
        for (int k = 0; k < len; k++) t->i[2][k] = c[k] ? t->i[0][k] : t->i[1][k];
        sg__scatter_i(o->y, o->dy, o->sy, len, t->i[2]);
    }
}

/* Unary, scalar and binary arithmetic and comparisons. */
static void math_tile(const sg__node *n, const operands *o, int len, tiles *t) {
    sg__op op = n->op;
    bool two = n->nin > 1;
    if (sg__dtype_is_float(o->din[0])) {
        const float *a = load_f(o->in[0], o->din[0], o->sin[0], len, t->f[0]);
        const float *b = two ? load_f(o->in[1], o->din[1], o->sin[1], len, t->f[1]) : NULL;
        if (is_cmp(op)) {
            compare_f(op, len, a, b, t->i[2]);
            sg__scatter_i(o->y, o->dy, o->sy, len, t->i[2]);
            return;
        }
        bool direct = o->dy == SG_F32 && o->sy == 1;
        float *y = direct ? (float *)o->y : t->f[2];
        apply_f(n, len, a, b, y);
        if (!direct) sg__scatter_f(o->y, o->dy, o->sy, len, y);
        return;
    }
    sg__gather_i(o->in[0], o->din[0], o->sin[0], len, t->i[0]);
    if (two) sg__gather_i(o->in[1], o->din[1], o->sin[1], len, t->i[1]);
    if (is_cmp(op))
        compare_i(op, len, t->i[0], t->i[1], t->i[2]);
    else
        apply_i(n, o->din[0], len, t->i[0], t->i[1], t->i[2]);
    sg__scatter_i(o->y, o->dy, o->sy, len, t->i[2]);
}

static void run_tile(const sg__node *n, const operands *o, int len, tiles *t) {
    switch (n->op) {
    case SG__OP_FILL: fill_tile(n, o, len, t); return;
    case SG__OP_CAST:
    case SG__OP_COPY: cast_tile(o, len, t); return;
    case SG__OP_WHERE: where_tile(o, len, t); return;
    case SG__OP_LOGICAL_NOT:
    case SG__OP_LOGICAL_AND:
    case SG__OP_LOGICAL_OR:
        gather_truth(o->in[0], o->din[0], o->sin[0], len, t, 0);
        if (n->op != SG__OP_LOGICAL_NOT) gather_truth(o->in[1], o->din[1], o->sin[1], len, t, 1);
        logical(n->op, len, t->i[0], t->i[1], t->i[2]);
        sg__scatter_i(o->y, o->dy, o->sy, len, t->i[2]);
        return;
    default: math_tile(n, o, len, t); return;
    }
}

/* ------------------------------------------------------------ the kernel */

sg_status sg__cpu_pointwise(sg_ctx *ctx, const sg__node *n) {
    const sg_tensor *out = n->out;
    int nops = 1 + n->nin;
    SG_ASSERT(nops <= SG__MAX_OPS);
    int64_t numel = sg__numel(out->ndim, out->shape);
    if (numel == 0) return SG_OK;
    int64_t shape[SG_MAX_DIMS], stride[SG__MAX_OPS][SG_MAX_DIMS];
    void *data[SG__MAX_OPS];
    sg_dtype dt[SG__MAX_OPS];
    int64_t base[SG__MAX_OPS], inner[SG__MAX_OPS];
    for (int k = 0; k < nops; k++) {
        const sg_tensor *t = k == 0 ? out : n->in[k - 1];
        data[k] = t->st->data;
        dt[k] = t->dtype;
        base[k] = t->offset;
        sg__broadcast_strides(t, out->ndim, out->shape, stride[k]);
    }
    memcpy(shape, out->shape, sizeof(int64_t) * (size_t)out->ndim);
    int nd = sg__coalesce_dims(out->ndim, shape, nops, stride);
    sg__rows r;
    sg__rows_init(&r, nd, shape, nops);
    for (int k = 0; k < nops; k++) {
        memcpy(r.stride[k], stride[k], sizeof(int64_t) * (size_t)nd);
        inner[k] = nd ? stride[k][nd - 1] : 0;
    }
    int64_t per_row = (r.rowlen + SG__TILE - 1) / SG__TILE;
    int64_t ntiles = r.nrows * per_row;
    int nth = sg__cpu_threads(ctx, numel);
#pragma omp parallel num_threads(nth) if (nth > 1)
    {
        tiles t;
        operands o = {.dy = dt[0], .sy = inner[0]};
        for (int k = 1; k < nops; k++) o.din[k - 1] = dt[k], o.sin[k - 1] = inner[k];
        int64_t row_off[SG__MAX_OPS], cur_row = -1;
#pragma omp for schedule(static)
        for (int64_t tile = 0; tile < ntiles; tile++) {
            int64_t row = tile / per_row, col = (tile % per_row) * SG__TILE;
            if (row != cur_row) {
                sg__rows_offsets(&r, row, row_off);
                cur_row = row;
            }
            int len = (int)(r.rowlen - col < SG__TILE ? r.rowlen - col : SG__TILE);
            o.y = sg__at(data[0], dt[0], base[0] + row_off[0] + col * inner[0]);
            for (int k = 1; k < nops; k++)
                o.in[k - 1] = sg__at(data[k], dt[k], base[k] + row_off[k] + col * inner[k]);
            run_tile(n, &o, len, &t);
        }
    }
    return SG_OK;
}
