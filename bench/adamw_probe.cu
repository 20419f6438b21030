/* SPDX-License-Identifier: MIT */
/*
 * adamw_probe.cu -- W6's AdamW update outside stepgraph, to find what the
 * update's bytes can run at and which kernel shape gets there: per
 * parameter a bf16 gradient (times the clip's scale), f32 master weight and
 * moments read and written, the bf16 weight written: 14 bytes read and 14
 * written. The arithmetic is the step's (two IEEE divisions, one sqrtf), so
 * every variant gives the same bits; the probe checks that against the
 * first. Variants: the shape of the generated MULTI kernel (2 elements a
 * thread, a grid-stride loop over 1024 blocks of 512), flat grids of 2, 4
 * and 8 elements a thread, streaming cache hints, a grid-stride loop that
 * loads its next vectors before it stores, and a device-to-device copy of
 * the same bytes as the reference. Median of 15 timed calls each, the
 * variants alternated. bench/NOTES.md quotes it. Not built by CMake:
 *   nvcc -O3 -arch=sm_90 bench/adamw_probe.cu -o adamw_probe && ./adamw_probe [M params]
 */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_) {                                                                                  \
            printf("cuda %s line %d\n", cudaGetErrorString(e_), __LINE__);                         \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

struct scal {
    float clip, bc1_lr, bc2, wd; /* gradient scale, lr / (1 - b1^t), sqrt(1 - b2^t), 1 - lr wd */
};

struct bufs {
    const __nv_bfloat16 *g;
    float *p, *m, *v;
    __nv_bfloat16 *w;
    const scal *s;
    long n;
};

__device__ __forceinline__ void upd(float g, float &p, float &m, float &v, __nv_bfloat16 &w,
                                    const scal &s) {
    g = g * s.clip;
    m = m * 0.9f + g * 0.1f;
    v = v * 0.95f + (g * g) * 0.05f;
    float d = sqrtf(v) / s.bc2 + 1e-8f;
    p = p * s.wd - s.bc1_lr * (m / d);
    w = __float2bfloat16(p);
}

/* E elements a thread, consecutive; grid-stride when loop. */
template <int E, bool CS>
__device__ __forceinline__ void one(const bufs &b, const scal &s, long i) {
    float g[E], p[E], m[E], v[E];
    __nv_bfloat16 gb[E], w[E];
    if (CS) {
#pragma unroll
        for (int k = 0; k < E; k += 4) {
            *(float4 *)(p + k) = __ldcs((const float4 *)(b.p + i + k));
            *(float4 *)(m + k) = __ldcs((const float4 *)(b.m + i + k));
            *(float4 *)(v + k) = __ldcs((const float4 *)(b.v + i + k));
            *(float2 *)(gb + k) = __ldcs((const float2 *)(b.g + i + k));
        }
    } else {
        memcpy(p, b.p + i, sizeof p);
        memcpy(m, b.m + i, sizeof m);
        memcpy(v, b.v + i, sizeof v);
        memcpy(gb, b.g + i, sizeof gb);
    }
#pragma unroll
    for (int k = 0; k < E; k++)
        g[k] = __bfloat162float(gb[k]), upd(g[k], p[k], m[k], v[k], w[k], s);
    if (CS) {
#pragma unroll
        for (int k = 0; k < E; k += 4) {
            __stcs((float4 *)(b.p + i + k), *(float4 *)(p + k));
            __stcs((float4 *)(b.m + i + k), *(float4 *)(m + k));
            __stcs((float4 *)(b.v + i + k), *(float4 *)(v + k));
            __stcs((float2 *)(b.w + i + k), *(float2 *)(w + k));
        }
    } else {
        memcpy(b.p + i, p, sizeof p);
        memcpy(b.m + i, m, sizeof m);
        memcpy(b.v + i, v, sizeof v);
        memcpy(b.w + i, w, sizeof w);
    }
}

/* The generated MULTI's shape: 2 a thread, 1024 blocks of 512 looping. */
__global__ void __launch_bounds__(512, 3) k_loop2(bufs b) {
    scal s = *b.s;
    for (long q = (long)blockIdx.x * blockDim.x + threadIdx.x; q < b.n / 2;
         q += (long)gridDim.x * blockDim.x)
        one<2, false>(b, s, q * 2);
}

template <int E, bool CS> __global__ void __launch_bounds__(256) k_flat(bufs b) {
    scal s = *b.s;
    long q = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (q < b.n / E) one<E, CS>(b, s, q * E);
}

/* Grid-stride, 4 a thread, the next vectors loaded before this one's stores
 * (restrict: the buffers do not alias). */
__global__ void __launch_bounds__(256)
    k_pipe4(const __nv_bfloat16 *__restrict__ G, float *__restrict__ P, float *__restrict__ M,
            float *__restrict__ V, __nv_bfloat16 *__restrict__ W, const scal *__restrict__ S,
            long n) {
    scal s = *S;
    long step = (long)gridDim.x * blockDim.x, q = (long)blockIdx.x * blockDim.x + threadIdx.x;
    long nq = n / 4;
    if (q >= nq) return;
    float4 p = ((const float4 *)P)[q], m = ((const float4 *)M)[q], v = ((const float4 *)V)[q];
    float2 g = ((const float2 *)G)[q];
    for (; q < nq; q += step) {
        float4 p2, m2, v2;
        float2 g2;
        long q2 = q + step;
        if (q2 < nq)
            p2 = ((const float4 *)P)[q2], m2 = ((const float4 *)M)[q2],
            v2 = ((const float4 *)V)[q2], g2 = ((const float2 *)G)[q2];
        float pe[4], me[4], ve[4];
        __nv_bfloat16 ge[4], we[4];
        memcpy(pe, &p, 16), memcpy(me, &m, 16), memcpy(ve, &v, 16), memcpy(ge, &g, 8);
#pragma unroll
        for (int k = 0; k < 4; k++) upd(__bfloat162float(ge[k]), pe[k], me[k], ve[k], we[k], s);
        memcpy(&p, pe, 16), memcpy(&m, me, 16), memcpy(&v, ve, 16);
        ((float4 *)P)[q] = p, ((float4 *)M)[q] = m, ((float4 *)V)[q] = v;
        float2 w;
        memcpy(&w, we, 8);
        ((float2 *)W)[q] = w;
        p = p2, m = m2, v = v2, g = g2;
    }
}

static float timeit(int which, bufs b, void *cpy_dst, void *cpy_src, size_t cpy_bytes, int sms) {
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaEventRecord(e0));
    switch (which) {
    case 0: k_loop2<<<1024, 512>>>(b); break;
    case 1: k_flat<2, false><<<(unsigned)((b.n / 2 + 255) / 256), 256>>>(b); break;
    case 2: k_flat<4, false><<<(unsigned)((b.n / 4 + 255) / 256), 256>>>(b); break;
    case 3: k_flat<8, false><<<(unsigned)((b.n / 8 + 255) / 256), 256>>>(b); break;
    case 4: k_flat<4, true><<<(unsigned)((b.n / 4 + 255) / 256), 256>>>(b); break;
    case 5: k_flat<8, true><<<(unsigned)((b.n / 8 + 255) / 256), 256>>>(b); break;
    case 6: k_pipe4<<<sms * 8, 256>>>(b.g, b.p, b.m, b.v, b.w, b.s, b.n); break;
    case 7: CK(cudaMemcpyAsync(cpy_dst, cpy_src, cpy_bytes, cudaMemcpyDeviceToDevice)); break;
    }
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    CK(cudaGetLastError());
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    return ms * 1000.f;
}

static int fcmp(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    long n = (long)((argc > 1 ? atof(argv[1]) : 85.0) * 1e6) / 1024 * 1024;
    const char *name[] = {
        "loop2 (generated shape)", "flat2", "flat4", "flat8", "flat4 cs", "flat8 cs", "pipe4",
        "D2D copy, same bytes"};
    enum { NV = 8, R = 15 };
    int sms;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    bufs b;
    __nv_bfloat16 *g, *w;
    float *p, *m, *v;
    scal *s;
    CK(cudaMalloc(&g, n * 2));
    CK(cudaMalloc(&w, n * 2));
    CK(cudaMalloc(&p, n * 4));
    CK(cudaMalloc(&m, n * 4));
    CK(cudaMalloc(&v, n * 4));
    CK(cudaMalloc(&s, sizeof *s));
    size_t cb = (size_t)n * 14;
    void *cd, *cs;
    CK(cudaMalloc(&cd, cb));
    CK(cudaMalloc(&cs, cb));
    CK(cudaMemset(cs, 0, cb));
    /* Inputs: a pattern every variant starts from (the moments grow slowly,
     * so repeated calls stay finite). */
    float *hp = (float *)malloc(n * 4);
    __nv_bfloat16 *hg = (__nv_bfloat16 *)malloc(n * 2);
    for (long i = 0; i < n; i++)
        hp[i] = (float)((i * 2654435761u) % 1000) * 1e-3f - 0.5f,
        hg[i] = __float2bfloat16((float)((i * 40503u) % 997) * 1e-4f - 0.05f);
    scal hs = {0.8f, 3e-4f / 0.1f, sqrtf(0.05f), 1.f - 3e-4f * 0.1f};
    CK(cudaMemcpy(g, hg, n * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(s, &hs, sizeof hs, cudaMemcpyHostToDevice));
    b = (bufs){g, p, m, v, w, s, n};
    /* The same bits from every variant: one call each from the same state. */
    unsigned short *ref = (unsigned short *)malloc(n * 2), *got = (unsigned short *)malloc(n * 2);
    for (int k = 0; k < NV - 1; k++) {
        CK(cudaMemcpy(p, hp, n * 4, cudaMemcpyHostToDevice));
        CK(cudaMemset(m, 0, n * 4));
        CK(cudaMemset(v, 0, n * 4));
        timeit(k, b, cd, cs, cb, sms);
        CK(cudaMemcpy(k ? got : ref, w, n * 2, cudaMemcpyDeviceToHost));
        if (k && memcmp(ref, got, n * 2)) printf("%s: bits differ from loop2\n", name[k]);
    }
    float t[NV][R];
    for (int r = 0; r < R; r++)
        for (int k = 0; k < NV; k++) t[k][r] = timeit(k, b, cd, cs, cb, sms);
    printf("AdamW over %.1f M parameters, %.2f GB a call (bf16 g, w; f32 p, m, v)\n", n / 1e6,
           n * 28e-9);
    for (int k = 0; k < NV; k++) {
        qsort(t[k], R, sizeof(float), fcmp);
        printf("  %-24s %8.1f us  %5.2f TB/s (min %.1f)\n", name[k], t[k][R / 2],
               n * 28e-6 / t[k][R / 2], t[k][0]);
    }
    return 0;
}
