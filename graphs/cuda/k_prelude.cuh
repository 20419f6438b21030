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
    u32 sign = (h & 0x8000u) << 16, e = (h >> 10) & 31, m = h & 1023, u;
    if (e == 0) {
        if (m == 0) {
            u = sign;
        } else { /* subnormal: normalize */
            e = 113;
            while (!(m & 1024)) {
                m <<= 1;
                e--;
            }
            u = sign | (e << 23) | ((m & 1023) << 13);
        }
    } else if (e == 31) {
        u = sign | 0x7f800000u | (m << 13);
    } else {
        u = sign | ((e + 112) << 23) | (m << 13);
    }
    return __uint_as_float(u);
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
