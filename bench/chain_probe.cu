// SPDX-License-Identifier: MIT
/*
 * chain_probe.cu -- what a chain of dependent steps costs on the GPU, apart from
 * their work: 64 stages, each block reading the 768-float row the stage before
 * wrote, reducing it and writing a value a warp. As a CUDA graph of 64 kernels
 * with and without programmatic dependent launch, and as one persistent kernel
 * with the stages apart by three kinds of grid barrier. bench/NOTES.md, "Chains
 * of dependent kernels".
 *
 *     nvcc -arch=sm_90 -O3 -o chain_probe bench/chain_probe.cu && ./chain_probe
 */
#include <cstdio>
#include <cuda_runtime.h>
#define N 768
#define STAGES 64
__device__ __forceinline__ void pdl_launch() {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

__device__ __forceinline__ void stage_body(const float *in, float *out, int blk, int nblk) {
    __shared__ float red[8];
    float s = 0.f;
    for (int i = threadIdx.x; i < N; i += blockDim.x) s += in[i];
    for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(~0u, s, o);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = s;
    __syncthreads();
    float t = 0.f;
    for (int w = 0; w < 8; w++) t += red[w];
    __syncthreads();
    int col = blk * 8 + (threadIdx.x >> 5);
    if ((threadIdx.x & 31) == 0 && col < N) out[col] = t * 1e-3f + (float)col;
}
template <bool PDL> __global__ void __launch_bounds__(256) k_stage(const float *in, float *out) {
    if (PDL) pdl_launch();
    if (PDL) pdl_wait();
    stage_body(in, out, blockIdx.x, gridDim.x);
}
__device__ unsigned bar_count, bar_gen;
__device__ __forceinline__ void grid_barrier(unsigned nblk) {
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned g;
        asm volatile("ld.relaxed.gpu.u32 %0, [%1];" : "=r"(g) : "l"(&bar_gen));
        __threadfence();
        unsigned a = atomicAdd(&bar_count, 1u);
        if (a == nblk - 1) {
            bar_count = 0;
            __threadfence();
            atomicAdd(&bar_gen, 1u);
        } else {
            unsigned h;
            do {
                asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(h) : "l"(&bar_gen));
            } while (h == g);
        }
    }
    __syncthreads();
}
__global__ void __launch_bounds__(256) k_persist(float *bufs) {
    for (int s = 0; s < STAGES; s++) {
        const float *in = bufs + (s & 1) * N;
        float *out = bufs + ((s + 1) & 1) * N;
        for (int b = blockIdx.x; b < N / 8; b += gridDim.x) stage_body(in, out, b, N / 8);
        grid_barrier(gridDim.x);
    }
}

// (a) flags: block b of stage s stores epoch into flag[s][b] (release); each
// consumer block's threads poll one flag each (acquire).
__global__ void __launch_bounds__(256) k_flags(float *bufs, unsigned *flags, unsigned epoch) {
    const int nb = N / 8;
    for (int s = 0; s < STAGES; s++) {
        const float *in = bufs + (s & 1) * N;
        float *out = bufs + ((s + 1) & 1) * N;
        if (s > 0) {
            for (int t = threadIdx.x; t < nb; t += blockDim.x) {
                unsigned h;
                const unsigned *f = flags + (s - 1) * nb + t;
                do {
                    asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(h) : "l"(f));
                } while (h != epoch);
            }
            __syncthreads();
        }
        for (int b = blockIdx.x; b < nb; b += gridDim.x) {
            stage_body(in, out, b, nb);
            __syncthreads();
            if (threadIdx.x == 0) {
                __threadfence();
                asm volatile("st.release.gpu.u32 [%0], %1;" ::"l"(flags + s * nb + b), "r"(epoch));
            }
        }
    }
}
// (b) one counter per stage: red.release.gpu.add by each block, polled by thread 0.
__global__ void __launch_bounds__(256) k_count(float *bufs, unsigned *cnt, unsigned epoch) {
    const int nb = N / 8;
    for (int s = 0; s < STAGES; s++) {
        const float *in = bufs + (s & 1) * N;
        float *out = bufs + ((s + 1) & 1) * N;
        if (s > 0) {
            if (threadIdx.x == 0) {
                unsigned h;
                do {
                    asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(h) : "l"(cnt + s - 1));
                } while (h < epoch * nb);
            }
            __syncthreads();
        }
        for (int b = blockIdx.x; b < nb; b += gridDim.x) {
            stage_body(in, out, b, nb);
            __syncthreads();
            if (threadIdx.x == 0) {
                __threadfence();
                asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(cnt + s), "r"(1u));
            }
        }
    }
}
int main() {
    float *bufs;
    cudaMalloc(&bufs, 2 * N * sizeof(float));
    cudaMemset(bufs, 0, 2 * N * 4);
    cudaStream_t st;
    cudaStreamCreate(&st);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    for (int variant = 0; variant < 2; variant++) {
        for (int grid : {96, 288}) {
            cudaGraph_t g;
            cudaGraphExec_t ge;
            cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal);
            for (int s = 0; s < STAGES; s++) {
                const float *in = bufs + (s & 1) * N;
                float *out = bufs + ((s + 1) & 1) * N;
                cudaLaunchConfig_t cfg = {};
                cfg.gridDim = grid;
                cfg.blockDim = 256;
                cfg.stream = st;
                cudaLaunchAttribute at[1];
                at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
                at[0].val.programmaticStreamSerializationAllowed = 1;
                cfg.attrs = at;
                cfg.numAttrs = variant;
                if (variant)
                    cudaLaunchKernelEx(&cfg, k_stage<true>, in, out);
                else
                    cudaLaunchKernelEx(&cfg, k_stage<false>, in, out);
            }
            cudaStreamEndCapture(st, &g);
            if (cudaGraphInstantiate(&ge, g, 0) != cudaSuccess) {
                printf("inst fail\n");
                return 1;
            }
            for (int w = 0; w < 20; w++) cudaGraphLaunch(ge, st);
            float best = 1e9;
            for (int rep = 0; rep < 5; rep++) {
                cudaEventRecord(e0, st);
                for (int it = 0; it < 100; it++) cudaGraphLaunch(ge, st);
                cudaEventRecord(e1, st);
                cudaEventSynchronize(e1);
                float ms;
                cudaEventElapsedTime(&ms, e0, e1);
                if (ms < best) best = ms;
            }
            printf("graph %s grid %d: %.2f us per graph, %.3f us per stage\n",
                   variant ? "PDL" : "plain", grid, best * 10.0f, best * 10.0f / STAGES);
        }
    }
    for (int grid : {66, 132, 264}) {
        for (int w = 0; w < 20; w++) k_persist<<<grid, 256, 0, st>>>(bufs);
        float best = 1e9;
        for (int rep = 0; rep < 5; rep++) {
            cudaEventRecord(e0, st);
            for (int it = 0; it < 100; it++) k_persist<<<grid, 256, 0, st>>>(bufs);
            cudaEventRecord(e1, st);
            cudaEventSynchronize(e1);
            float ms;
            cudaEventElapsedTime(&ms, e0, e1);
            if (ms < best) best = ms;
        }
        printf("persistent grid %d: %.2f us per call, %.3f us per stage\n", grid, best * 10.0f,
               best * 10.0f / STAGES);
    }

    unsigned *flags;
    cudaMalloc(&flags, STAGES * (N / 8) * 4);
    cudaMemset(flags, 0, STAGES * (N / 8) * 4);
    unsigned epoch = 0;
    for (int kind = 0; kind < 2; kind++)
        for (int grid : {48, 96}) {
            cudaMemset(flags, 0, STAGES * (N / 8) * 4);
            epoch = 0;
            for (int w = 0; w < 20; w++) {
                ++epoch;
                if (kind)
                    k_count<<<grid, 256, 0, st>>>(bufs, flags, epoch);
                else
                    k_flags<<<grid, 256, 0, st>>>(bufs, flags, epoch);
            }
            float best = 1e9;
            for (int rep = 0; rep < 5; rep++) {
                cudaEventRecord(e0, st);
                for (int it = 0; it < 100; it++) {
                    ++epoch;
                    if (kind)
                        k_count<<<grid, 256, 0, st>>>(bufs, flags, epoch);
                    else
                        k_flags<<<grid, 256, 0, st>>>(bufs, flags, epoch);
                }
                cudaEventRecord(e1, st);
                cudaEventSynchronize(e1);
                float ms;
                cudaEventElapsedTime(&ms, e0, e1);
                if (ms < best) best = ms;
            }
            printf("%s grid %d: %.2f us per call, %.3f us per stage\n", kind ? "counter" : "flags",
                   grid, best * 10.0f, best * 10.0f / STAGES);
        }
    printf("err %s\n", cudaGetErrorString(cudaGetLastError()));
}
