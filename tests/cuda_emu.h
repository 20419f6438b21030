/* SPDX-License-Identifier: MIT */
/*
 * cuda_emu.h -- the part of CUDA that graphs/cuda/k_data.cu's kernels use,
 * emulated on the host (C++20), so that a test can run their logic where
 * there is no GPU: a block is blockDim.x std::threads of one pool, its
 * __shared__ arrays function statics (one block runs at a time, so they are
 * the block's), __syncthreads a std::barrier, atomics the compiler's. The
 * emulation checks the algorithm (barriers, races between them, indices),
 * not the device's memory model or speed; the kernels' CUDA build is
 * checked by NVRTC (test_codegen_nvrtc) and their runs on a GPU by the
 * _cuda variants of the op tests.
 */
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

struct emu_dim3 {
    unsigned x = 0, y = 0, z = 0;
};
struct uint4 {
    unsigned x, y, z, w;
};
inline thread_local emu_dim3 threadIdx, blockIdx;
inline emu_dim3 gridDim, blockDim;
inline std::barrier<> *emu_bar;
inline std::atomic<int> emu_any{0};

inline void __syncthreads() { emu_bar->arrive_and_wait(); }
inline int __syncthreads_or(int p) {
    emu_bar->arrive_and_wait();
    if (p) emu_any = 1;
    emu_bar->arrive_and_wait();
    int r = emu_any;
    emu_bar->arrive_and_wait();
    if (threadIdx.x == 0) emu_any = 0;
    emu_bar->arrive_and_wait();
    return r;
}

/* The block's dynamic shared memory: one buffer (one block runs at a
 * time), sized by emu_dyn_bytes before the launch. */
inline std::vector<unsigned char> emu_dyn;
#define SG_DYN_SMEM(T, name) T *name = (T *)emu_dyn.data()

#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)

inline float __uint_as_float(unsigned u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
inline unsigned __float_as_uint(float f) {
    unsigned u;
    memcpy(&u, &f, 4);
    return u;
}
inline long long __double_as_longlong(double d) {
    long long u;
    memcpy(&u, &d, 8);
    return u;
}
inline double __longlong_as_double(long long u) {
    double d;
    memcpy(&d, &u, 8);
    return d;
}
inline unsigned __umulhi(unsigned a, unsigned b) {
    return (unsigned)(((unsigned long long)a * b) >> 32);
}
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __double2float_rz(double v) {
    float f = (float)v;
    if ((double)f != v && std::fabs((double)f) > std::fabs(v)) f = std::nextafter(f, 0.0f);
    return f;
}
template <class T, class U> T atomicAdd(T *p, U v) {
    return __atomic_fetch_add(p, (T)v, __ATOMIC_SEQ_CST);
}
template <class T, class U> T atomicMax(T *p, U v) {
    T o = __atomic_load_n(p, __ATOMIC_SEQ_CST);
    while (o < (T)v &&
           !__atomic_compare_exchange_n(p, &o, (T)v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {}
    return o;
}
using std::exp;
using std::ldexp;

/* Run body as a launch of gx x gy blocks of bx threads: bx pool threads
 * take the blocks in turn, all of a block's threads finishing it before
 * the next begins. */
inline void emu_launch(unsigned gx, unsigned gy, unsigned bx, const std::function<void()> &body) {
    gridDim.x = gx, gridDim.y = gy, gridDim.z = 1;
    blockDim.x = bx, blockDim.y = blockDim.z = 1;
    std::barrier<> bar((std::ptrdiff_t)bx);
    emu_bar = &bar;
    std::vector<std::thread> pool;
    for (unsigned t = 0; t < bx; t++)
        pool.emplace_back([&, t] {
            threadIdx.x = t;
            for (unsigned by = 0; by < gy; by++)
                for (unsigned b = 0; b < gx; b++) {
                    blockIdx.x = b, blockIdx.y = by;
                    body();
                    bar.arrive_and_wait();
                }
        });
    for (auto &t : pool) t.join();
}
