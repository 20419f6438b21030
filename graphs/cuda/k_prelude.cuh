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
