/* SPDX-License-Identifier: MIT */
/*
 * k_matmul.cu -- the matmul family's own kernels (NVRTC unit SG__CU_MATMUL):
 *
 *   sg_mm_gemv_<dt>   C[m][n] = sum_k A[m][k] W[n][k] (+ bias[n]) for at most
 *                     8 rows m: the small-M product (batch-1 inference) that
 *                     must stream W once at full memory bandwidth;
 *   sg_mm_copy_<dt>   a strided tensor to another geometry (operands that
 *                     cuBLASLt cannot read in place, results it cannot write);
 *   sg_mm_fill_<dt>   a matrix set to its bias row or to zeros (K = 0, and
 *                     the bias of a product whose epilogue cuBLASLt lacks);
 *   sg_mm_pitch_<dt>  a matrix to another leading dim (operands and results
 *                     padded to 16-byte rows for cuBLASLt's aligned kernels).
 *
 * <dt> is f32, f16 or bf16; f16/bf16 are stored as 16-bit patterns and
 * computed in f32, with the same conversions as graphs/cpu/cpu.h (round to
 * nearest even, NaN kept NaN). This file is compiled by NVRTC with no
 * include path: it includes nothing (the build puts k_prelude.cuh in front
 * of it).
 *
 * The argument structs mirror those in cuda_matmul.c field for field.
 */

/* ------------------------------------------------------------ conversions */

__device__ __forceinline__ float sg_h2f(unsigned short h) {
    unsigned sign = (unsigned)(h & 0x8000) << 16, e = (h >> 10) & 31, m = h & 1023;
    if (e == 0) {
        /* zero or subnormal: m * 2^-24 is exact in f32 */
        float f = (float)m * 5.9604644775390625e-8f;
        return sign ? -f : f;
    }
    if (e == 31) return __uint_as_float(sign | 0x7f800000u | (m << 13));
    return __uint_as_float(sign | ((e + 112) << 23) | (m << 13));
}

/* Round to nearest even, with overflow to inf and NaN kept NaN. */
__device__ __forceinline__ unsigned short sg_f2h(float f) {
    unsigned u = __float_as_uint(f);
    unsigned sign = (u >> 16) & 0x8000;
    unsigned a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (unsigned short)(sign | 0x7e00);
    if (a >= 0x477ff000u) return (unsigned short)(sign | 0x7c00);
    if (a < 0x38800000u) {
        /* Adding 0.5 lines the half's subnormal step up with the float's last bits. */
        float r = __fadd_rn(__uint_as_float(a), 0.5f);
        return (unsigned short)(sign | (__float_as_uint(r) - 0x3f000000u));
    }
    unsigned mant_odd = (a >> 13) & 1;
    a += 0xc8000fffu + mant_odd;
    return (unsigned short)(sign | (a >> 13));
}

__device__ __forceinline__ float sg_bf2f(unsigned short b) { return __uint_as_float((unsigned)b << 16); }

__device__ __forceinline__ unsigned short sg_f2bf(float f) {
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1);
    return (unsigned short)(u >> 16);
}

/* Element traits by dtype (0 f32, 1 f16, 2 bf16, as sg_dtype). */
template <int DT> struct elem;
template <> struct elem<0> {
    typedef float t;
    static __device__ __forceinline__ float ld(float v) { return v; }
    static __device__ __forceinline__ float st(float v) { return v; }
    /* The 4 floats of a 16-byte vector. */
    static __device__ __forceinline__ void unpack(uint4 v, float *f) {
        f[0] = __uint_as_float(v.x), f[1] = __uint_as_float(v.y);
        f[2] = __uint_as_float(v.z), f[3] = __uint_as_float(v.w);
    }
};
template <> struct elem<1> {
    typedef unsigned short t;
    static __device__ __forceinline__ float ld(unsigned short v) { return sg_h2f(v); }
    static __device__ __forceinline__ unsigned short st(float v) { return sg_f2h(v); }
    static __device__ __forceinline__ void unpack(uint4 v, float *f) {
        unsigned w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            f[2 * i] = sg_h2f((unsigned short)(w[i] & 0xffff));
            f[2 * i + 1] = sg_h2f((unsigned short)(w[i] >> 16));
        }
    }
};
template <> struct elem<2> {
    typedef unsigned short t;
    static __device__ __forceinline__ float ld(unsigned short v) { return sg_bf2f(v); }
    static __device__ __forceinline__ unsigned short st(float v) { return sg_f2bf(v); }
    static __device__ __forceinline__ void unpack(uint4 v, float *f) {
        unsigned w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            f[2 * i] = __uint_as_float(w[i] << 16);
            f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
        }
    }
};

/* ------------------------------------------------------------ gemv */

#define SG_GEMV_ROWS 8   /* rows of A (M) one launch covers */
#define SG_GEMV_UNROLL 4 /* 16-byte loads of W per lane per trip */

/* Strides in elements; batch strides step with blockIdx.y. */
struct sg_mm_gemv_args {
    i64 M, N, K;
    i64 a_rs, a_cs, w_ns, w_ks, c_rs, c_cs, bias_s;
    i64 a_bs, w_bs, c_bs;
    int vec;      /* 1: A rows and W rows are contiguous along K and 16-byte aligned */
    int has_bias;
};

/*
 * One warp per output column n, blockDim = (32, warps). Each lane walks K in
 * 16-byte vectors of W's row n (consecutive lanes on consecutive vectors, so
 * a warp reads 512 contiguous bytes per step), multiplies them with the same
 * columns of every row of A (small, shared by all warps: it stays in L1/L2),
 * and keeps one f32 sum per row; a butterfly of shuffles adds the 32 lanes'
 * sums. A warp whose n is out of range leaves as a whole, so the shuffles
 * always see full warps.
 */
template <int DT>
__device__ __forceinline__ void gemv(const typename elem<DT>::t *a, const typename elem<DT>::t *w,
                                     const typename elem<DT>::t *bias, typename elem<DT>::t *c,
                                     const sg_mm_gemv_args &p) {
    typedef typename elem<DT>::t T;
    const int lane = threadIdx.x;
    const i64 n = (i64)blockIdx.x * blockDim.y + threadIdx.y;
    if (n >= p.N) return;
    a += (i64)blockIdx.y * p.a_bs;
    w += (i64)blockIdx.y * p.w_bs + n * p.w_ns;
    c += (i64)blockIdx.y * p.c_bs;
    float acc[SG_GEMV_ROWS];
#pragma unroll
    for (int m = 0; m < SG_GEMV_ROWS; m++) acc[m] = 0.0f;
    i64 k0 = 0;
    if (p.vec) {
        const int E = 16 / (int)sizeof(T);
        const i64 nv = p.K / E;
        const uint4 *wv = (const uint4 *)w;
        /* SG_GEMV_UNROLL loads of W in flight per lane before any math:
         * a K of 1024 bf16 is one trip, all of its row requested at once. */
        for (i64 v0 = lane; v0 < nv; v0 += 32 * SG_GEMV_UNROLL) {
            uint4 wq[SG_GEMV_UNROLL];
#pragma unroll
            for (int u = 0; u < SG_GEMV_UNROLL; u++) {
                i64 v = v0 + 32 * u;
                wq[u] = v < nv ? __ldg(wv + v) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int u = 0; u < SG_GEMV_UNROLL; u++) {
                i64 v = v0 + 32 * u;
                if (v >= nv) break;
                float wf[E], xf[E];
                elem<DT>::unpack(wq[u], wf);
#pragma unroll
                for (int m = 0; m < SG_GEMV_ROWS; m++) {
                    if (m < p.M) {
                        elem<DT>::unpack(__ldg((const uint4 *)(a + m * p.a_rs) + v), xf);
#pragma unroll
                        for (int e = 0; e < E; e++) acc[m] = fmaf(xf[e], wf[e], acc[m]);
                    }
                }
            }
        }
        k0 = nv * E;
    }
    /* The scalar path: the tail after the vectors, or every k when not vec. */
    for (i64 k = k0 + lane; k < p.K; k += 32) {
        float wk = elem<DT>::ld(w[k * p.w_ks]);
#pragma unroll
        for (int m = 0; m < SG_GEMV_ROWS; m++)
            if (m < p.M) acc[m] = fmaf(elem<DT>::ld(a[m * p.a_rs + k * p.a_cs]), wk, acc[m]);
    }
#pragma unroll
    for (int m = 0; m < SG_GEMV_ROWS; m++) {
        if (m < p.M) {
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) acc[m] += __shfl_xor_sync(0xffffffffu, acc[m], o);
        }
    }
    if (lane == 0) {
        float b = p.has_bias ? elem<DT>::ld(bias[n * p.bias_s]) : 0.0f;
#pragma unroll
        for (int m = 0; m < SG_GEMV_ROWS; m++)
            if (m < p.M) c[m * p.c_rs + n * p.c_cs] = elem<DT>::st(acc[m] + b);
    }
}

/* ------------------------------------------------------------ copy and fill */

#define SG_MM_DIMS 6

/* A tensor's walk: n elements in row-major order of shape, read at src
 * strides and written at dst strides. */
struct sg_mm_geom {
    i64 n;
    i64 shape[SG_MM_DIMS], ss[SG_MM_DIMS], ds[SG_MM_DIMS];
    int nd;
    int pad;
};

template <int DT>
__device__ __forceinline__ void copy(const typename elem<DT>::t *src, typename elem<DT>::t *dst,
                                     const sg_mm_geom &g) {
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < g.n; i += (i64)gridDim.x * blockDim.x) {
        i64 rem = i, so = 0, dof = 0;
        for (int d = g.nd - 1; d >= 0; d--) {
            i64 q = rem % g.shape[d];
            rem /= g.shape[d];
            so += q * g.ss[d];
            dof += q * g.ds[d];
        }
        dst[dof] = src[so];
    }
}

/* Element (.., j) of dst gets bias[j * bias_s] (j its last index), or 0. */
template <int DT>
__device__ __forceinline__ void fill(typename elem<DT>::t *dst, const typename elem<DT>::t *bias,
                                     i64 bias_s, const sg_mm_geom &g) {
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < g.n; i += (i64)gridDim.x * blockDim.x) {
        i64 rem = i, dof = 0, last = 0;
        for (int d = g.nd - 1; d >= 0; d--) {
            i64 q = rem % g.shape[d];
            rem /= g.shape[d];
            if (d == g.nd - 1) last = q;
            dof += q * g.ds[d];
        }
        dst[dof] = bias ? bias[last * bias_s] : elem<DT>::st(0.0f);
    }
}

/* ------------------------------------------------------------ entry points */

#define SG_MM_KERNELS(DT, NAME)                                                                    \
    extern "C" __global__ void __launch_bounds__(256)                                              \
        sg_mm_gemv_##NAME(const elem<DT>::t *a, const elem<DT>::t *w, const elem<DT>::t *bias,     \
                          elem<DT>::t *c, sg_mm_gemv_args p) {                                     \
        pdl_begin();                                                                               \
        gemv<DT>(a, w, bias, c, p);                                                                \
    }                                                                                              \
    extern "C" __global__ void sg_mm_copy_##NAME(const elem<DT>::t *src, elem<DT>::t *dst,         \
                                                 sg_mm_geom g) {                                   \
        pdl_begin();                                                                               \
        copy<DT>(src, dst, g);                                                                     \
    }                                                                                              \
    extern "C" __global__ void sg_mm_fill_##NAME(elem<DT>::t *dst, const elem<DT>::t *bias,        \
                                                 i64 bias_s, sg_mm_geom g) {                       \
        pdl_begin();                                                                               \
        fill<DT>(dst, bias, bias_s, g);                                                            \
    }

SG_MM_KERNELS(0, f32)
SG_MM_KERNELS(1, f16)
SG_MM_KERNELS(2, bf16)

/* ------------------------------------------------------------ pitched copy */

#define PITCH_COLS 2048 /* columns per block: 8 per thread, 256 threads */

/* dst[r * dld + j] for rows x cols: src[r * sld + j] inside its srows x
 * scols, else 0 (zero padding). blockIdx.x picks 2048 columns, rows step
 * by gridDim.y; each thread has its eight loads in flight before its
 * stores, coalesced along the row. */
template <typename T>
__device__ __forceinline__ void pitch(const T *src, T *dst, i64 rows, i64 cols, i64 sld, i64 dld,
                                      i64 srows, i64 scols) {
    i64 j0 = (i64)blockIdx.x * PITCH_COLS + threadIdx.x;
    for (i64 r = blockIdx.y; r < rows; r += gridDim.y) {
        const T *s = src + r * sld;
        T *d = dst + r * dld;
        T v[8];
#pragma unroll
        for (int u = 0; u < 8; u++) {
            i64 j = j0 + u * 256;
            if (j < cols) v[u] = r < srows && j < scols ? s[j] : (T)0;
        }
#pragma unroll
        for (int u = 0; u < 8; u++)
            if (j0 + u * 256 < cols) d[j0 + u * 256] = v[u];
    }
}

#define SG_MM_PITCH(DT, NAME)                                                                      \
    extern "C" __global__ void __launch_bounds__(256)                                              \
        sg_mm_pitch_##NAME(const elem<DT>::t *src, elem<DT>::t *dst, i64 rows, i64 cols, i64 sld,  \
                           i64 dld, i64 srows, i64 scols) {                                        \
        pdl_begin();                                                                               \
        pitch<elem<DT>::t>(src, dst, rows, cols, sld, dld, srows, scols);                          \
    }

SG_MM_PITCH(0, f32)
SG_MM_PITCH(1, f16)
SG_MM_PITCH(2, bf16)
