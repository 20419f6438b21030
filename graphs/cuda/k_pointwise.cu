/* SPDX-License-Identifier: MIT */
/*
 * k_pointwise.cu -- the CUDA kernels of every elementwise op (the NVRTC unit
 * SG__CU_POINTWISE; cuda_pointwise.c launches them). Self-contained: NVRTC
 * runs with no include path, so the f16/bf16 conversions are written out
 * here, bit for bit those of graphs/cpu/cpu.h.
 *
 * One element function (pw_compute) holds the semantics of all ops: it
 * takes each input element as raw bits, widens it to the op's domain (float
 * for f32/f16/bf16, int64 for i32/i64/bool, as the CPU kernel does), applies
 * the op and returns the output element's bits. It is compiled once and
 * called by the three layouts:
 *   sg_pw_vec    one flat dim, every operand contiguous or a broadcast
 *                scalar, contiguous operands 16-byte aligned: 8 elements a
 *                thread through 16-byte loads and stores (the commonest
 *                f32 ops inline there, without the call);
 *   sg_pw_flat   one flat dim with any strides;
 *   sg_pw_nd32 / sg_pw_nd64   up to 6 dims with broadcast strides; the 32-bit
 *                variant when every index and offset fits (64-bit division
 *                costs several times the 32-bit one).
 * The host coalesces dims first, so most ops over contiguous or sliced
 * tensors land in the flat kernels. All loops are grid-stride.
 */

/* The pointwise ops in ops.def's order from NEG (the host passes op - NEG),
 * then GELU_TANH_BWD (appended to ops.def after the other families). */
enum {
    OP_NEG, OP_ABS, OP_EXP, OP_LOG, OP_SQRT, OP_RSQRT, OP_SIN, OP_COS, OP_TANH, OP_SIGMOID,
    OP_RELU, OP_GELU, OP_GELU_TANH, OP_SILU, OP_LOGICAL_NOT, OP_CAST, OP_COPY, OP_ADD_SCALAR,
    OP_MUL_SCALAR, OP_POW_SCALAR, OP_CLAMP, OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_POW, OP_MAXIMUM,
    OP_MINIMUM, OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE, OP_LOGICAL_AND, OP_LOGICAL_OR,
    OP_WHERE, OP_FILL, OP_GELU_TANH_BWD
};

#define MAXD 6
#define MAXOPS 4
#define VEC 8 /* elements a thread in sg_pw_vec */

/* The kernel parameter; cuda_pointwise.c has the same struct. Operand 0 is
 * the output, 1..3 the inputs. */
struct pw_args {
    void *ptr[MAXOPS];          /* element 0 of each operand */
    i64 shape[MAXD];            /* the coalesced index space */
    i64 stride[MAXOPS][MAXD];   /* in elements; 0 on broadcast dims */
    i64 n;                      /* elements of the output */
    i64 i0, i1;                 /* integer scalars (integer-domain ops) */
    u64 fill;                   /* FILL: the output element's bits */
    float s0, s1;               /* float scalars */
    int op, nin, ndim;
    int dt[MAXOPS];
};

/* The host fills this struct by its own definition: both must agree. */
static_assert(sizeof(pw_args) == 344, "pw_args changed: update cuda_pointwise.c too");

/* What pw_compute needs, small enough to live in registers. */
struct pw_op {
    int op, dy, d0, d1;
    float s0, s1;
    i64 i0, i1;
    u64 fill;
};

/* ------------------------------------------------------------ conversions */

/* An int64 as a float rounded to odd: truncate, then set the last bit when
 * inexact. Rounding that to f16/bf16 rounds once, as the CPU's cast does. */
__device__ __forceinline__ float i2f_odd(i64 v) {
    float f = __ll2float_rz(v);
    if (__float2ll_rz(f) != v) f = __uint_as_float(__float_as_uint(f) | 1u);
    return f;
}

__device__ __forceinline__ bool is_float(int dt) { return dt <= DT_BF16; }

/* An element's bits as a float (sg__ldf). */
__device__ __forceinline__ float bits_f(u64 b, int dt) {
    switch (dt) {
    case DT_F32: return __uint_as_float((u32)b);
    case DT_F16: return h2f((u32)b);
    case DT_BF16: return bf2f((u32)b);
    case DT_I32: return (float)(int)(u32)b;
    case DT_I64: return (float)(i64)b;
    default: return b ? 1.0f : 0.0f;
    }
}

/* An element's bits as an int64 (sg__ldi). */
__device__ __forceinline__ i64 bits_i(u64 b, int dt) {
    switch (dt) {
    case DT_I32: return (i64)(int)(u32)b;
    case DT_I64: return (i64)b;
    case DT_BOOL: return b != 0;
    default: return __float2ll_rz(bits_f(b, dt));
    }
}

/* A float stored as dt (sg__stf): ints saturate, NaN gives 0. */
__device__ __forceinline__ u64 f_bits(float v, int dt) {
    switch (dt) {
    case DT_F32: return __float_as_uint(v);
    case DT_F16: return f2h(v);
    case DT_BF16: return f2bf(v);
    case DT_I32:
        return (u32)(v != v ? 0 : v >= 2147483647.0f ? 2147483647
                               : v <= -2147483648.0f ? (int)0x80000000u : (int)v);
    case DT_I64:
        return (u64)(v != v ? 0 : v >= 9.2233720e18f ? 0x7fffffffffffffffll
                               : v <= -9.2233720e18f ? (i64)0x8000000000000000ull : (i64)v);
    default: return v != 0.0f;
    }
}

/* An int64 stored as dt: ints wrap, floats round once. */
__device__ __forceinline__ u64 i_bits(i64 v, int dt) {
    switch (dt) {
    case DT_F32: return __float_as_uint(__ll2float_rn(v));
    case DT_F16: return f2h(i2f_odd(v));
    case DT_BF16: return f2bf(i2f_odd(v));
    case DT_I32: return (u32)v;
    case DT_I64: return (u64)v;
    default: return v != 0;
    }
}

/* ------------------------------------------------------------ the ops */

__device__ __forceinline__ float apply_f(const pw_op &o, float a, float b) {
    const float k = 0.7978845608028654f; /* sqrt(2/pi) */
    switch (o.op) {
    case OP_NEG: return -a;
    case OP_ABS: return fabsf(a);
    case OP_EXP: return expf(a);
    case OP_LOG: return logf(a);
    case OP_SQRT: return sqrtf(a);
    case OP_RSQRT: return 1.0f / sqrtf(a);
    case OP_SIN: return sinf(a);
    case OP_COS: return cosf(a);
    case OP_TANH: return tanhf(a);
    case OP_SIGMOID: return 1.0f / (1.0f + expf(-a));
    case OP_RELU: return a > 0.0f || a != a ? a : 0.0f; /* NaN passes, as in PyTorch */
    /* erfc keeps its accuracy where 1 + erf(x) would cancel (x << 0). */
    case OP_GELU: return 0.5f * a * erfcf(a * -0.70710678118654752f);
    case OP_GELU_TANH: return 0.5f * a * (1.0f + tanhf(k * (a + 0.044715f * a * a * a)));
    case OP_SILU: return a / (1.0f + expf(-a));
    case OP_ADD_SCALAR: return a + o.s0;
    case OP_MUL_SCALAR: return a * o.s0;
    case OP_POW_SCALAR: return powf(a, o.s0);
    case OP_CLAMP: return a < o.s0 ? o.s0 : a > o.s1 ? o.s1 : a; /* NaN passes */
    case OP_ADD: return a + b;
    case OP_SUB: return a - b;
    case OP_MUL: return a * b;
    case OP_DIV: return a / b;
    case OP_POW: return powf(a, b);
    case OP_MAXIMUM: return a != a || a > b ? a : b; /* NaN from either side */
    case OP_MINIMUM: return a != a || a < b ? a : b;
    case OP_GELU_TANH_BWD: { /* gelu_tanh'(a) * b */
        float a2 = a * a, t = tanhf(k * (a + 0.044715f * a2 * a));
        float du = k * (1.0f + 3.0f * 0.044715f * a2);
        return (0.5f * (1.0f + t) + 0.5f * a * (1.0f - t * t) * du) * b;
    }
    default: return 0.0f;
    }
}

/* Integer ops wrap: the arithmetic is done unsigned. */
__device__ __forceinline__ i64 apply_i(const pw_op &o, i64 a, i64 b) {
    switch (o.op) {
    case OP_NEG: return (i64)(0ull - (u64)a);
    case OP_ABS: return a < 0 ? (i64)(0ull - (u64)a) : a;
    case OP_RELU: return a > 0 ? a : 0;
    case OP_ADD_SCALAR: return (i64)((u64)a + (u64)o.i0);
    case OP_MUL_SCALAR: return (i64)((u64)a * (u64)o.i0);
    case OP_CLAMP: return a < o.i0 ? o.i0 : a > o.i1 ? o.i1 : a;
    case OP_ADD: return (i64)((u64)a + (u64)b);
    case OP_SUB: return (i64)((u64)a - (u64)b);
    case OP_MUL: return (i64)((u64)a * (u64)b);
    case OP_MAXIMUM: return a > b ? a : b;
    case OP_MINIMUM: return a < b ? a : b;
    default: return 0;
    }
}

template <typename T> __device__ __forceinline__ bool compare(int op, T a, T b) {
    switch (op) {
    case OP_EQ: return a == b;
    case OP_NE: return a != b;
    case OP_LT: return a < b;
    case OP_LE: return a <= b;
    case OP_GT: return a > b;
    default: return a >= b;
    }
}

/* Nonzero is true; NaN is nonzero. */
__device__ __forceinline__ bool truth(u64 b, int dt) {
    return is_float(dt) ? bits_f(b, dt) != 0.0f : b != 0;
}

/*
 * One output element from its inputs' bits. Not inlined: the three layouts
 * share one copy, which keeps the unit's compile time down; the op switch
 * is uniform across a warp, so its branches do not diverge.
 */
__device__ __noinline__ u64 pw_compute(pw_op o, u64 x, u64 y, u64 z) {
    switch (o.op) {
    case OP_FILL: return o.fill;
    case OP_CAST:
    case OP_COPY:
        return is_float(o.d0) ? f_bits(bits_f(x, o.d0), o.dy) : i_bits(bits_i(x, o.d0), o.dy);
    case OP_WHERE: { /* x is the bool condition; y, z share the output's dtype */
        u64 v = x ? y : z;
        return is_float(o.dy) ? f_bits(bits_f(v, o.d1), o.dy) : i_bits(bits_i(v, o.d1), o.dy);
    }
    case OP_LOGICAL_NOT: return !truth(x, o.d0);
    case OP_LOGICAL_AND: return truth(x, o.d0) && truth(y, o.d1);
    case OP_LOGICAL_OR: return truth(x, o.d0) || truth(y, o.d1);
    case OP_EQ:
    case OP_NE:
    case OP_LT:
    case OP_LE:
    case OP_GT:
    case OP_GE:
        return is_float(o.d0) ? compare(o.op, bits_f(x, o.d0), bits_f(y, o.d0))
                              : compare(o.op, bits_i(x, o.d0), bits_i(y, o.d0));
    default:
        if (is_float(o.d0)) return f_bits(apply_f(o, bits_f(x, o.d0), bits_f(y, o.d0)), o.dy);
        return i_bits(apply_i(o, bits_i(x, o.d0), bits_i(y, o.d0)), o.dy);
    }
}

/* ------------------------------------------------------------ element access */

__device__ __forceinline__ int dt_size(int dt) {
    return dt == DT_I64 ? 8 : dt == DT_F32 || dt == DT_I32 ? 4 : dt == DT_BOOL ? 1 : 2;
}

__device__ __forceinline__ u64 ld(const void *p, int dt, i64 i) {
    switch (dt_size(dt)) {
    case 8: return ((const u64 *)p)[i];
    case 4: return ((const u32 *)p)[i];
    case 2: return ((const u16 *)p)[i];
    default: return ((const u8 *)p)[i];
    }
}

__device__ __forceinline__ void st(void *p, int dt, i64 i, u64 v) {
    switch (dt_size(dt)) {
    case 8: ((u64 *)p)[i] = v; break;
    case 4: ((u32 *)p)[i] = (u32)v; break;
    case 2: ((u16 *)p)[i] = (u16)v; break;
    default: ((u8 *)p)[i] = (u8)v; break;
    }
}

__device__ __forceinline__ pw_op make_op(const pw_args &a) {
    pw_op o;
    o.op = a.op;
    o.dy = a.dt[0];
    o.d0 = a.dt[1];
    o.d1 = a.dt[2];
    o.s0 = a.s0;
    o.s1 = a.s1;
    o.i0 = a.i0;
    o.i1 = a.i1;
    o.fill = a.fill;
    return o;
}

/* Element `off` of input k (1..3), or 0 when the op has no such input. */
__device__ __forceinline__ u64 ld_in(const pw_args &a, int k, i64 off) {
    return k <= a.nin ? ld(a.ptr[k], a.dt[k], off) : 0;
}

/* ------------------------------------------------------------ layouts */

/* Any layout: the index is split into coordinates of the coalesced shape. */
template <typename I> __device__ __forceinline__ void pw_nd(const pw_args &a) {
    pw_op o = make_op(a);
    I n = (I)a.n, step = (I)blockDim.x * (I)gridDim.x;
    for (I i = (I)blockIdx.x * (I)blockDim.x + (I)threadIdx.x; i < n; i += step) {
        I rem = i, off[MAXOPS] = {0, 0, 0, 0};
        for (int d = a.ndim - 1; d >= 0; d--) {
            I size = (I)a.shape[d], c = rem % size;
            rem /= size;
#pragma unroll
            for (int k = 0; k < MAXOPS; k++) off[k] += c * (I)a.stride[k][d];
        }
        u64 x = ld_in(a, 1, off[1]), y = ld_in(a, 2, off[2]), z = ld_in(a, 3, off[3]);
        st(a.ptr[0], a.dt[0], off[0], pw_compute(o, x, y, z));
    }
}

extern "C" __global__ void sg_pw_nd32(const pw_args a) {
    pdl_begin();
    pw_nd<int>(a);
}
extern "C" __global__ void sg_pw_nd64(const pw_args a) {
    pdl_begin();
    pw_nd<i64>(a);
}

/* One dim, any strides. */
extern "C" __global__ void sg_pw_flat(const pw_args a) {
    pdl_begin();
    pw_op o = make_op(a);
    i64 step = (i64)blockDim.x * gridDim.x;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < a.n; i += step) {
        u64 x = ld_in(a, 1, i * a.stride[1][0]), y = ld_in(a, 2, i * a.stride[2][0]),
            z = ld_in(a, 3, i * a.stride[3][0]);
        st(a.ptr[0], a.dt[0], i * a.stride[0][0], pw_compute(o, x, y, z));
    }
}

/* VEC elements of one operand from chunk c: 16-byte loads where the chunk
 * has 16 bytes or more, one 8-byte load for bools. A broadcast operand
 * (stride 0) repeats its one element. */
__device__ __forceinline__ void load_vec(const void *p, int dt, bool bcast, i64 c, u64 *v) {
    if (bcast) {
        u64 e = ld(p, dt, 0);
#pragma unroll
        for (int k = 0; k < VEC; k++) v[k] = e;
        return;
    }
    switch (dt_size(dt)) {
    case 8: {
        const uint4 *q = (const uint4 *)p + 4 * c;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            uint4 w = q[j];
            v[2 * j] = (u64)w.x | (u64)w.y << 32;
            v[2 * j + 1] = (u64)w.z | (u64)w.w << 32;
        }
        break;
    }
    case 4: {
        const uint4 *q = (const uint4 *)p + 2 * c;
#pragma unroll
        for (int j = 0; j < 2; j++) {
            uint4 w = q[j];
            v[4 * j] = w.x, v[4 * j + 1] = w.y, v[4 * j + 2] = w.z, v[4 * j + 3] = w.w;
        }
        break;
    }
    case 2: {
        uint4 w = ((const uint4 *)p)[c];
        u32 h[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int j = 0; j < 4; j++) v[2 * j] = h[j] & 0xffffu, v[2 * j + 1] = h[j] >> 16;
        break;
    }
    default: {
        uint2 w = ((const uint2 *)p)[c];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            v[j] = (w.x >> (8 * j)) & 0xffu;
            v[4 + j] = (w.y >> (8 * j)) & 0xffu;
        }
        break;
    }
    }
}

__device__ __forceinline__ void store_vec(void *p, int dt, i64 c, const u64 *v) {
    switch (dt_size(dt)) {
    case 8: {
        uint4 *q = (uint4 *)p + 4 * c;
#pragma unroll
        for (int j = 0; j < 4; j++)
            q[j] = make_uint4((u32)v[2 * j], (u32)(v[2 * j] >> 32), (u32)v[2 * j + 1],
                              (u32)(v[2 * j + 1] >> 32));
        break;
    }
    case 4: {
        uint4 *q = (uint4 *)p + 2 * c;
#pragma unroll
        for (int j = 0; j < 2; j++)
            q[j] = make_uint4((u32)v[4 * j], (u32)v[4 * j + 1], (u32)v[4 * j + 2],
                              (u32)v[4 * j + 3]);
        break;
    }
    case 2: {
        u32 h[4];
#pragma unroll
        for (int j = 0; j < 4; j++) h[j] = (u32)v[2 * j] | (u32)v[2 * j + 1] << 16;
        ((uint4 *)p)[c] = make_uint4(h[0], h[1], h[2], h[3]);
        break;
    }
    default: {
        u32 lo = 0, hi = 0;
#pragma unroll
        for (int j = 0; j < 4; j++) lo |= (u32)v[j] << (8 * j), hi |= (u32)v[4 + j] << (8 * j);
        ((uint2 *)p)[c] = make_uint2(lo, hi);
        break;
    }
    }
}

/* Element k of a chunk of f32 bits, as a float (y is read only by binary ops:
 * a unary op's y was never loaded). */
__device__ __forceinline__ float fv(const u64 *p, int k) { return __uint_as_float((u32)p[k]); }

/* The commonest f32 arithmetic over one chunk, inline: these ops are
 * memory-bound, and the call into pw_compute would cost more than the op.
 * The same expressions as apply_f. False for the other ops. */
__device__ __forceinline__ bool f32_fast(const pw_op &o, const u64 *x, const u64 *y, u64 *r) {
    float a[VEC], v[VEC];
#pragma unroll
    for (int k = 0; k < VEC; k++) a[k] = __uint_as_float((u32)x[k]);
    switch (o.op) {
#define FAST(OP, expr)                                                                             \
    case OP:                                                                                       \
        _Pragma("unroll") for (int k = 0; k < VEC; k++) v[k] = (expr);                             \
        break
        FAST(OP_ADD, a[k] + fv(y, k));
        FAST(OP_SUB, a[k] - fv(y, k));
        FAST(OP_MUL, a[k] * fv(y, k));
        FAST(OP_DIV, a[k] / fv(y, k));
        FAST(OP_NEG, -a[k]);
        FAST(OP_ADD_SCALAR, a[k] + o.s0);
        FAST(OP_MUL_SCALAR, a[k] * o.s0);
        FAST(OP_RELU, a[k] > 0.0f || a[k] != a[k] ? a[k] : 0.0f);
        FAST(OP_MAXIMUM, a[k] != a[k] || a[k] > fv(y, k) ? a[k] : fv(y, k));
        FAST(OP_MINIMUM, a[k] != a[k] || a[k] < fv(y, k) ? a[k] : fv(y, k));
        FAST(OP_COPY, a[k]);
        FAST(OP_CAST, a[k]);
#undef FAST
    default: return false;
    }
#pragma unroll
    for (int k = 0; k < VEC; k++) r[k] = __float_as_uint(v[k]);
    return true;
}

/* One dim, every operand contiguous (stride 1) or broadcast (stride 0), the
 * contiguous ones aligned to their chunk (16 bytes, 8 for bools). The last
 * n % VEC elements are done one by one. */
extern "C" __global__ void sg_pw_vec(const pw_args a) {
    pdl_begin();
    pw_op o = make_op(a);
    bool fast = a.nin >= 1 && a.dt[0] == DT_F32 && a.dt[1] == DT_F32 &&
                (a.nin < 2 || a.dt[2] == DT_F32);
    i64 chunks = a.n / VEC, step = (i64)blockDim.x * gridDim.x;
    i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    for (i64 c = t; c < chunks; c += step) {
        u64 x[VEC], y[VEC], z[VEC], r[VEC];
        if (a.nin >= 1) load_vec(a.ptr[1], a.dt[1], a.stride[1][0] == 0, c, x);
        if (a.nin >= 2) load_vec(a.ptr[2], a.dt[2], a.stride[2][0] == 0, c, y);
        if (a.nin >= 3) load_vec(a.ptr[3], a.dt[3], a.stride[3][0] == 0, c, z);
        if (!(fast && f32_fast(o, x, y, r)))
#pragma unroll
            for (int k = 0; k < VEC; k++)
                r[k] = pw_compute(o, a.nin >= 1 ? x[k] : 0, a.nin >= 2 ? y[k] : 0,
                                  a.nin >= 3 ? z[k] : 0);
        store_vec(a.ptr[0], a.dt[0], c, r);
    }
    for (i64 i = chunks * VEC + t; i < a.n; i += step) {
        u64 x = ld_in(a, 1, i * a.stride[1][0]), y = ld_in(a, 2, i * a.stride[2][0]),
            z = ld_in(a, 3, i * a.stride[3][0]);
        st(a.ptr[0], a.dt[0], i, pw_compute(o, x, y, z));
    }
}
