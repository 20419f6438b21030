/* SPDX-License-Identifier: MIT */
/*
 * k_prelude.cuh -- what every kernel family (graphs/cuda/k_*.cu) begins
 * with: the build puts it in front of each family's text
 * (tools/embed_cu.cmake for NVRTC and hiprtc at run time, tools/sg_cubins.c
 * for the prebuilt images), so that the families, compiled with no include
 * path, still share one copy of it.
 */
typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef long long i64;

/* sg_dtype's values (include/stepgraph.h). */
enum { DT_F32, DT_F16, DT_BF16, DT_I32, DT_I64, DT_BOOL };

/* Programmatic dependent launch (sm_90+; nothing before it, nor on HIP):
 * the executor launches every kernel of a family so that it may start
 * while the kernel before it runs (sg__cuda_launch). pdl_wait waits for the
 * kernel before to finish and its writes to show; pdl_launch lets the next
 * kernel start once all blocks here have passed it. Most kernels begin with
 * both (pdl_begin), before they touch memory; the decode kernels first
 * prefetch what no kernel before them writes. */
__device__ __forceinline__ void pdl_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_launch() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_begin() {
    pdl_launch();
    pdl_wait();
}

/* The block's dynamic shared memory (the launch's shmem bytes) as name, an
 * array of T. A host emulation of the kernels (tests/cuda_emu.h) defines
 * its own. */
#ifndef SG_DYN_SMEM
#define SG_DYN_SMEM(T, name) extern __shared__ T name[]
#endif

/* The 32-bit shared-window address of p, a pointer into shared memory
 * (what ldmatrix, cp.async and mbarrier take). */
#if defined(__CUDA_ARCH__)
__device__ __forceinline__ u32 smem_addr(const void *p) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}
#endif

/* SG_PTX: NVRTC (CUDA) compiles the families with PTX. hiprtc compiles them
 * too, for AMD GPUs, after the HIP prelude (codegen/nvrtc.c), and a host
 * test (tests/cuda_emu.h) compiles k_data.cu as C++: there what is written
 * in PTX takes its portable form or is not built. */
#if defined(__CUDA_ARCH__)
#define SG_PTX 1
#else
#define SG_PTX 0
#endif

/* ------------------------------------------------------------ conversions */

/* f16 and bf16 bits (the low 16 of h) to float and back, as
 * capture/capture.h's sg__h2f, sg__f2h and sg__f2bf (the host's): bit for bit, NaN
 * payloads included, rounding to nearest even, f16 overflow to inf. */
__device__ __forceinline__ float h2f(u32 h) {
    u32 sign = (h & 0x8000u) << 16, e = (h >> 10) & 31u, m = h & 1023u;
    if (e == 0) { /* zero or subnormal: m * 2^-24, exact */
        float v = (float)m * __uint_as_float(0x33800000u);
        return sign ? -v : v;
    }
    if (e == 31) return __uint_as_float(sign | 0x7f800000u | (m << 13));
    return __uint_as_float(sign | ((e + 112) << 23) | (m << 13));
}

__device__ __forceinline__ u32 f2h(float f) {
    u32 u = __float_as_uint(f);
    u32 sign = (u >> 16) & 0x8000u;
    u32 a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00u;
    if (a >= 0x477ff000u) return sign | 0x7c00u;
    if (a < 0x38800000u) { /* subnormal or zero: 0.5 lines the steps up */
        float r = __fadd_rn(__uint_as_float(a), 0.5f);
        return sign | (__float_as_uint(r) - 0x3f000000u);
    }
    u32 mant_odd = (a >> 13) & 1;
    a += 0xc8000fffu + mant_odd;
    return (sign | (a >> 13)) & 0xffffu;
}

__device__ __forceinline__ float bf2f(u32 b) { return __uint_as_float(b << 16); }

__device__ __forceinline__ u32 f2bf(float f) {
    u32 u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return ((u >> 16) | 0x40u) & 0xffffu;
    u += 0x7fffu + ((u >> 16) & 1);
    return u >> 16;
}

/* The same f16 values by the conversion instruction (NaNs may come out
 * canonical): for the attention kernels' inner loops, where the bit
 * arithmetic above would show. */
__device__ __forceinline__ float h2f_cvt(u16 h) {
#if SG_PTX
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
#else
    return (float)__builtin_bit_cast(_Float16, h);
#endif
}

__device__ __forceinline__ u16 f2h_cvt(float f) {
#if SG_PTX
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
#else
    return __builtin_bit_cast(u16, (_Float16)f); /* round to nearest even */
#endif
}

/* A 16-bit element of a strided operand, 0 where !in. */
__device__ __forceinline__ u16 ld16(const void *p, i64 at, bool in) {
    return in ? ((const u16 *)p)[at] : (u16)0;
}

/* (lo, hi) rounded to nearest even as two 16-bit values of dt (DT_F16 or
 * DT_BF16), lo in the low half: one cvt on CUDA (a NaN's payload the
 * device's), the conversions above on HIP. */
__device__ __forceinline__ u32 pack2h(float lo, float hi, int dt) {
#if SG_PTX
    u32 r;
    if (dt == DT_F16)
        asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    else
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
#else
    return dt == DT_F16 ? f2h(lo) | f2h(hi) << 16 : f2bf(lo) | f2bf(hi) << 16;
#endif
}

/* ------------------------------------------------------------ tensor cores, async copies */
#if SG_PTX

/* 16 bytes global -> shared (at shared address dst), zero-filled when !in
 * (nothing read then). Shared addresses are 32-bit window offsets, the
 * lane's part apart from the constant part, which ptxas folds into the
 * instruction (no generic-to-shared conversion per access). */
__device__ __forceinline__ void cp16(u32 dst, const u16 *src, bool in) {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src),
                 "r"(in ? 16 : 0));
#endif
}

__device__ __forceinline__ void cp_commit() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}

/* Wait until at most N of this thread's copy groups are pending. */
template <int N> __device__ __forceinline__ void cp_wait() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}

/* Four 8x8 16-bit matrices from shared memory, as stored or transposed.
 * Shared memory is addressed by 32-bit shared-window addresses (bytes), so
 * a fragment's address is a per-thread base plus a constant. */
__device__ __forceinline__ void ldsm4(u32 *r, u32 a) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

__device__ __forceinline__ void ldsm4t(u32 *r, u32 a) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

/* c += a b: m16n8k16, A row-major 16 x 16, B column-major 16 x 8 (b0, b1),
 * f32 C, A and B of dt. Not volatile: the compiler interleaves independent
 * accumulators' mmas. */
__device__ __forceinline__ void mma(float *c, const u32 *a, u32 b0, u32 b1, int dt) {
    if (dt == DT_F16)
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
            "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
            "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* 2^x through one ex2.approx (relative error ~2^-22; 2^-inf = 0). */
__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

#endif /* SG_PTX */
