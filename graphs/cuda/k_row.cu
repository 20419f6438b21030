/* SPDX-License-Identifier: MIT */
/*
 * k_row.cu -- the eager CUDA kernels of the row family: softmax and
 * log_softmax along any dim, layer_norm and rms_norm over the last dim and
 * their gradient (the row statistics, then the input's gradient), and
 * cross_entropy over the rows of (N, C) logits and its gradient (host side
 * in cuda_row.c).
 *
 * A team works one row: one thread (softmax whose rows lie side by side in
 * memory, so that neighbouring threads read neighbours), one warp (rows up
 * to ~1k elements) or one block of 256 threads (longer rows, any length).
 * Each thread folds its share of the row (lane, lane + team, ...), the team
 * combines the shares in a fixed order, and a second pass writes the row.
 *
 * Semantics follow graphs/cpu/cpu_row.c: softmax subtracts the row's max
 * (an online max and sum of exps, rescaled as the max grows), -inf adds
 * exactly 0, NaN and +inf make the row NaN; the statistics of the norms are
 * in double about the row's first element. cross_entropy writes each row's
 * loss, then one block takes their mean in a fixed order; a target outside
 * [0, C) gives a NaN loss here (the host checks targets when it may wait).
 *
 * NVRTC compiles this file with no include path, so it includes nothing;
 * the build puts k_prelude.cuh (types, dtypes, pdl_begin) in front of it.
 */

#define MAXD 6
#define BLOCK 256

/* Ops and flags, as cuda_row.c numbers them. */
enum { OP_SOFTMAX, OP_LOG_SOFTMAX, OP_LAYER_NORM, OP_RMS_NORM };
enum { HAS_W = 1, HAS_B = 2, NB_VECS = 4 };

/* The rows of one op; the same layout as struct wgeom in cuda_row.c. Row r
 * is an index over the other dims (osize, row-major); its elements lie
 * along the op's dim (len elements, strides xs and ys). */
struct wgeom {
    i64 osize[MAXD], oxs[MAXD], oys[MAXD];
    i64 nrows, len, xs, ys;
    i64 ws, bs, ts; /* strides of weight, bias, targets */
    double eps;
    int nd, team, op, dt, tdt, flags;
};

/* ------------------------------------------------------------ conversions */

/* The same bit conversions as graphs/cpu/cpu.h. */
__device__ __forceinline__ float ldf(const void *p, int dt, i64 i) {
    switch (dt) {
    case DT_F32: return ((const float *)p)[i];
    case DT_F16: return h2f(((const u16 *)p)[i]);
    case DT_BF16: return bf2f(((const u16 *)p)[i]);
    }
    return 0.0f;
}

__device__ __forceinline__ void stf(void *p, int dt, i64 i, float v) {
    switch (dt) {
    case DT_F32: ((float *)p)[i] = v; break;
    case DT_F16: ((u16 *)p)[i] = f2h(v); break;
    case DT_BF16: ((u16 *)p)[i] = f2bf(v); break;
    }
}

__device__ __forceinline__ double nan_d() { return __longlong_as_double(0x7ff8000000000000ll); }
__device__ __forceinline__ float inf_f() { return __uint_as_float(0x7f800000u); }

/* ------------------------------------------------------------ teams */

/* Two sums of a team, combined; every thread of the team gets them. A
 * butterfly gives both lanes of a pair the same bits, and a block adds its
 * warps in a fixed order, so results repeat exactly. */
__device__ void team_sum2(double *a, double *b, int team) {
    if (team == 1) return;
    for (int m = 16; m >= 1; m >>= 1) {
        *a += __shfl_xor_sync(0xffffffffu, *a, m);
        *b += __shfl_xor_sync(0xffffffffu, *b, m);
    }
    if (team == 32) return;
    __shared__ double sa[BLOCK / 32], sb[BLOCK / 32];
    if ((threadIdx.x & 31) == 0) sa[threadIdx.x / 32] = *a, sb[threadIdx.x / 32] = *b;
    __syncthreads();
    *a = sa[0], *b = sb[0];
    for (int k = 1; k < BLOCK / 32; k++) *a += sa[k], *b += sb[k];
    __syncthreads(); /* the arrays are reused by the next call */
}

/* Online max m and sum s of exp(x - m): fold one value. */
__device__ __forceinline__ void lse_add(float v, float *m, double *s) {
    if (v > *m) {
        *s = *s * (double)expf(*m - v) + (v == inf_f() ? nan_d() : 1.0);
        *m = v;
    } else if (v != -inf_f()) {
        *s += (double)expf(v - *m);
    }
}

/* Merge (m2, s2) into (m, s). A share that saw only -inf (s2 == 0) adds
 * nothing, even when m is -inf too (exp(-inf - -inf) would be NaN). */
__device__ __forceinline__ void lse_merge(float *m, double *s, float m2, double s2) {
    float mm = m2 > *m ? m2 : *m;
    double a = *s == 0.0 ? 0.0 : *s * (double)expf(*m - mm);
    double b = s2 == 0.0 ? 0.0 : s2 * (double)expf(m2 - mm);
    *m = mm;
    *s = a + b;
}

__device__ void team_lse(float *m, double *s, int team) {
    if (team == 1) return;
    for (int k = 16; k >= 1; k >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, *m, k);
        double s2 = __shfl_xor_sync(0xffffffffu, *s, k);
        /* Both lanes of a pair merge the same two values in one order. */
        bool low = (threadIdx.x & k) == 0;
        float ma = low ? *m : m2, mb = low ? m2 : *m;
        double sa = low ? *s : s2, sb = low ? s2 : *s;
        lse_merge(&ma, &sa, mb, sb);
        *m = ma, *s = sa;
    }
    if (team == 32) return;
    __shared__ float sm[BLOCK / 32];
    __shared__ double ss[BLOCK / 32];
    if ((threadIdx.x & 31) == 0) sm[threadIdx.x / 32] = *m, ss[threadIdx.x / 32] = *s;
    __syncthreads();
    *m = sm[0], *s = ss[0];
    for (int k = 1; k < BLOCK / 32; k++) lse_merge(m, s, sm[k], ss[k]);
    __syncthreads();
}

/* Row r's index i along an inner dim of size n, r becoming the index over
 * the dims outside it: in 32 bits where both fit (a 64-bit division is a
 * long subroutine, and a row's offsets are on every row's path). */
__device__ __forceinline__ i64 row_digit(i64 *r, i64 n) {
    i64 i;
    if (((u64)*r | (u64)n) >> 32 == 0) {
        u32 q = (u32)*r / (u32)n;
        i = (i64)((u32)*r - q * (u32)n), *r = q;
    } else {
        i = *r % n, *r /= n;
    }
    return i;
}

/* The x and y offsets of row r; with one dim (cuda_row.c merges them where
 * it can) no division: r < nrows. */
__device__ __forceinline__ void row_offsets(const wgeom &g, i64 r, i64 *xo, i64 *yo) {
    if (g.nd <= 1) {
        *xo = r * g.oxs[0], *yo = r * g.oys[0];
        return;
    }
    i64 a = 0, b = 0;
    for (int d = g.nd - 1; d >= 0; d--) {
        i64 i = row_digit(&r, g.osize[d]);
        a += i * g.oxs[d];
        b += i * g.oys[d];
    }
    *xo = a;
    *yo = b;
}

/* This thread's row and lane; false when the team has no row. */
__device__ __forceinline__ bool my_row(const wgeom &g, i64 *row, int *lane) {
    *lane = threadIdx.x % g.team;
    *row = (i64)blockIdx.x * (BLOCK / g.team) + threadIdx.x / g.team;
    return *row < g.nrows;
}

/* ------------------------------------------------------------ kernels */

/* softmax / log_softmax: y = exp(x - m) / s, or (x - m) - log(s). */
extern "C" __global__ void sg_row_softmax(const void *x, void *y, wgeom g) {
    pdl_begin();
    i64 row, xo, yo;
    int lane, team = g.team;
    if (!my_row(g, &row, &lane)) return; /* the whole team leaves together */
    row_offsets(g, row, &xo, &yo);
    float m = -inf_f();
    double s = 0.0;
    for (i64 j = lane; j < g.len; j += team) lse_add(ldf(x, g.dt, xo + j * g.xs), &m, &s);
    team_lse(&m, &s, team);
    double inv = 1.0 / s, ls = log(s);
    for (i64 j = lane; j < g.len; j += team) {
        float v = ldf(x, g.dt, xo + j * g.xs);
        double r =
            g.op == OP_LOG_SOFTMAX ? ((double)v - (double)m) - ls : (double)expf(v - m) * inv;
        stf(y, g.dt, yo + j * g.ys, (float)r);
    }
}

/* The mean (0 for rms_norm) and 1 / sqrt(var + eps) of the row at xo, the
 * whole team's: the norms' statistics, shared with their gradient's. Sums
 * about the row's first element (layer_norm), so that a large mean does not
 * cancel the variance. */
__device__ __forceinline__ void norm_stats(const void *x, int dt, i64 xo, i64 xs, i64 len,
                                           bool layer, double eps, int lane, int team, double *mean,
                                           double *r) {
    double shift = layer ? (double)ldf(x, dt, xo) : 0.0, s1 = 0.0, s2 = 0.0;
    for (i64 j = lane; j < len; j += team) {
        double d = (double)ldf(x, dt, xo + j * xs) - shift;
        s1 += d;
        s2 += d * d;
    }
    team_sum2(&s1, &s2, team);
    double n = (double)len;
    double var = layer ? (s2 - s1 * s1 / n) / n : s2 / n;
    *mean = layer ? shift + s1 / n : 0.0;
    *r = 1.0 / sqrt((var > 0 ? var : 0) + eps);
}

/*
 * layer_norm: (x - mean) / sqrt(var + eps) * w + b, population variance;
 * rms_norm: x / sqrt(mean(x^2) + eps) * w.
 */
extern "C" __global__ void sg_row_norm(const void *x, const void *w, const void *b, void *y,
                                       wgeom g) {
    pdl_begin();
    i64 row, xo, yo;
    int lane, team = g.team;
    if (!my_row(g, &row, &lane)) return;
    row_offsets(g, row, &xo, &yo);
    double mean, r;
    norm_stats(x, g.dt, xo, g.xs, g.len, g.op == OP_LAYER_NORM, g.eps, lane, team, &mean, &r);
    for (i64 j = lane; j < g.len; j += team) {
        double v = ((double)ldf(x, g.dt, xo + j * g.xs) - mean) * r;
        if (g.flags & HAS_W) v *= (double)ldf(w, g.dt, j * g.ws);
        if (g.flags & HAS_B) v += (double)ldf(b, g.dt, j * g.bs);
        stf(y, g.dt, yo + j * g.ys, (float)v);
    }
}

/* ------------------------------------------------------------ rows as 16-byte vectors */

/* The floats of one 16-byte vector of dtype DT (8 halves or 4 floats):
 * exact widenings, as h2f and bf2f. */
template <int DT> __device__ __forceinline__ void unpack16(uint4 u, float *f) {
    u32 w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        if (DT == DT_F32) {
            f[k] = __uint_as_float(w[k]);
        } else if (DT == DT_BF16) {
            f[2 * k] = __uint_as_float(w[k] << 16);
            f[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
        } else {
            u16 lo = (u16)(w[k] & 0xffffu), hi = (u16)(w[k] >> 16);
#if defined(__CUDA_ARCH__)
            asm("cvt.f32.f16 %0, %1;" : "=f"(f[2 * k]) : "h"(lo));
            asm("cvt.f32.f16 %0, %1;" : "=f"(f[2 * k + 1]) : "h"(hi));
#else /* hiprtc (HIP): no PTX */
            f[2 * k] = h2f(lo);
            f[2 * k + 1] = h2f(hi);
#endif
        }
    }
}

/* The first element of a vector's first word (its x). */
template <int DT> __device__ __forceinline__ float unpack_first(u32 w) {
    if (DT == DT_F32) return __uint_as_float(w);
    if (DT == DT_BF16) return __uint_as_float(w << 16);
    float f[8];
    unpack16<DT>(uint4{w, 0u, 0u, 0u}, f);
    return f[0];
}

/* Round 8 halves or 4 floats to one vector of DT: round to nearest even,
 * as f2h and f2bf (one cvt per pair; a NaN stays NaN, its payload the
 * device's). */
template <int DT> __device__ __forceinline__ uint4 pack16(const float *f) {
    u32 w[4];
#pragma unroll
    for (int k = 0; k < 4; k++) {
        if (DT == DT_F32)
            w[k] = __float_as_uint(f[k]);
        else
            w[k] = pack2h(f[2 * k], f[2 * k + 1], DT);
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

/* exp(a) for a <= 0: the full-precision expf for f32 rows, the hardware's
 * approximation (a few ulp of f32) for rows that end in f16 or bf16. */
template <int DT> __device__ __forceinline__ float ex(float a) {
    return DT == DT_F32 ? expf(a) : __expf(a);
}

/* Fold the PER values of f into the online (m, s): the chunk's max first,
 * so the sum is rescaled at most once per chunk; lse_add's rules. */
template <int DT> __device__ __forceinline__ void lse_chunk(const float *f, float *m, double *s) {
    const int PER = DT == DT_F32 ? 4 : 8;
    float cm = -inf_f();
#pragma unroll
    for (int k = 0; k < PER; k++) cm = f[k] > cm ? f[k] : cm;
    if (cm > *m) {
        *s = cm == inf_f() ? nan_d() : *s * (double)expf(*m - cm);
        *m = cm;
    }
    float cs = 0.0f;
    if (*m == -inf_f()) { /* only -inf and NaN so far: exp(-inf - -inf) would be NaN */
#pragma unroll
        for (int k = 0; k < PER; k++) cs += f[k] == -inf_f() ? 0.0f : ex<DT>(f[k] - *m);
    } else { /* exp(-inf - m) is 0: no test an element */
#pragma unroll
        for (int k = 0; k < PER; k++) cs += ex<DT>(f[k] - *m);
    }
    *s += (double)cs;
}

/* Vectors in flight per thread: a long row streams from DRAM (at 4, W6's
 * cross-entropy gradient read it at 59 % of the bandwidth). */
#define XENT_UNROLL 8

/* A row of len elements cut into a head, nv 16-byte vectors and a tail:
 * the head reaches x's first 16-byte boundary; with no vectors (strided
 * rows, or x and y placed differently within 16 bytes) the head is the
 * whole row. rest counts the head and the tail. */
struct vrow {
    i64 head, nv, tail, rest;
};

template <int DT>
__device__ __forceinline__ vrow vrow_of(const char *xr, const char *yr, i64 len, i64 xs, i64 ys) {
    const int ES = DT == DT_F32 ? 4 : 2, PER = 16 / ES;
    vrow v;
    v.head = len;
    if (xs == 1 && ys == 1 && ((((unsigned long long)xr ^ (unsigned long long)yr) & 15) == 0)) {
        i64 h = (i64)((16 - ((unsigned long long)xr & 15)) & 15) / ES;
        v.head = h < len ? h : len;
    }
    v.nv = (len - v.head) / PER;
    v.tail = v.head + v.nv * PER;
    v.rest = v.head + len - v.tail;
    return v;
}

/* The row's online max m and sum s of exps, the whole block's (every
 * thread gets them): the vectors from the row's end, XENT_UNROLL loads
 * then their math, and the head and tail element by element. With ST,
 * each vector is also kept at stage[v] (shared memory) for a second pass
 * that then reads no DRAM; the sums are the same either way. ST 2 (CUDA;
 * HIP takes 1): each thread first copies all its vectors into the stage
 * by cp.async, the whole row in flight at once rather than XENT_UNROLL
 * vectors a thread, then folds them from there in the same order. */
template <int DT, int ST = 0>
__device__ __forceinline__ void block_lse(const char *xr, const vrow &r, i64 xs, float *mo,
                                          double *so, uint4 *stage = 0) {
    const int ES = DT == DT_F32 ? 4 : 2;
    const uint4 *xv = (const uint4 *)(xr + r.head * ES);
    int tid = threadIdx.x;
    float m = -inf_f(), f[8];
    double s = 0.0;
    i64 v = r.nv - 1 - tid;
#if defined(__CUDA_ARCH__)
    if (ST == 2) {
        for (i64 w = v; w >= 0; w -= BLOCK)
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(stage + w)),
                         "l"(xv + w)
                         : "memory");
        asm volatile("cp.async.wait_all;" ::: "memory"); /* this thread's copies, seen by it */
        for (; v >= 0; v -= BLOCK) {
            unpack16<DT>(stage[v], f);
            lse_chunk<DT>(f, &m, &s);
        }
    }
#endif
    for (; v >= (XENT_UNROLL - 1) * BLOCK; v -= XENT_UNROLL * BLOCK) {
        uint4 a[XENT_UNROLL];
#pragma unroll
        for (int u = 0; u < XENT_UNROLL; u++) a[u] = __ldg(xv + v - u * BLOCK);
#pragma unroll
        for (int u = 0; u < XENT_UNROLL; u++) {
            if (ST) stage[v - u * BLOCK] = a[u];
            unpack16<DT>(a[u], f);
            lse_chunk<DT>(f, &m, &s);
        }
    }
    for (; v >= 0; v -= BLOCK) {
        uint4 a = __ldg(xv + v);
        if (ST) stage[v] = a;
        unpack16<DT>(a, f);
        lse_chunk<DT>(f, &m, &s);
    }
    for (i64 u = tid; u < r.rest; u += BLOCK) {
        i64 j = u < r.head ? u : r.tail + (u - r.head);
        lse_add(ldf(xr, DT, j * xs), &m, &s);
    }
    team_lse(&m, &s, BLOCK);
    *mo = m, *so = s;
}

/* A block's row of the loss: its statistics, as vectors where it can. */
template <int DT>
__device__ __forceinline__ void xent_block_lse(const char *xr, i64 len, i64 xs, float *m,
                                               double *s) {
    block_lse<DT>(xr, vrow_of<DT>(xr, xr, len, xs, 1), xs, m, s);
}

/* Row `row`'s loss from its statistics and its target's logit xc:
 * log(s) + m - x[c], NaN for a target outside [0, len). */
__device__ __forceinline__ double xent_loss(float m, double s, float xc, i64 c, i64 len) {
    return c >= 0 && c < len ? ((double)m - (double)xc) + log(s) : nan_d();
}

/* Row `row`'s target. */
__device__ __forceinline__ i64 xent_target(const void *t, const wgeom &g, i64 row) {
    return g.tdt == DT_I32 ? (i64)((const int *)t)[row * g.ts] : ((const i64 *)t)[row * g.ts];
}

/* Row `row` of cross_entropy's first pass, its team of g.team lanes (this
 * thread is `lane`): loss[row] = log(sum(exp(x - m))) + m - x[t[row]]. */
__device__ __forceinline__ void xent_row(const void *x, const void *t, double *loss,
                                         const wgeom &g, i64 row, int lane) {
    int team = g.team;
    i64 xo = row * g.oxs[0];
    float m = -inf_f();
    double s = 0.0;
    if (team == BLOCK) { /* a long row: as 16-byte vectors where it can */
        const char *xr = (const char *)x + xo * (g.dt == DT_F32 ? 4 : 2);
        if (g.dt == DT_F32)
            xent_block_lse<DT_F32>(xr, g.len, g.xs, &m, &s);
        else if (g.dt == DT_BF16)
            xent_block_lse<DT_BF16>(xr, g.len, g.xs, &m, &s);
        else
            xent_block_lse<DT_F16>(xr, g.len, g.xs, &m, &s);
    } else {
        for (i64 j = lane; j < g.len; j += team) lse_add(ldf(x, g.dt, xo + j * g.xs), &m, &s);
        team_lse(&m, &s, team);
    }
    if (lane != 0) return;
    i64 c = xent_target(t, g, row);
    float xc = c >= 0 && c < g.len ? ldf(x, g.dt, xo + c * g.xs) : 0.0f;
    loss[row] = xent_loss(m, s, xc, c, g.len);
}

/* The mean of the nrows losses by one block, in a fixed order. */
__device__ __forceinline__ void xent_mean(const double *loss, float *out, const wgeom &g) {
    double a = 0.0, unused = 0.0;
    const volatile double *lv = loss; /* not through L1: other blocks wrote them */
    for (i64 r = threadIdx.x; r < g.nrows; r += BLOCK) a += lv[r];
    team_sum2(&a, &unused, BLOCK);
    if (threadIdx.x == 0) out[0] = g.nrows ? (float)(a / (double)g.nrows) : (float)nan_d();
}

/* The blocks of a launch in flight that have finished, one counter per
 * kernel that takes the mean itself: the context's launches run in order
 * on its stream, so one counter serves each (zeroed when the module loads,
 * put back to 0 by each launch's last block). */
static __device__ u32 xent_done, xent_bwd_done;

/* Every thread of the block, after its rows' losses: the last block to
 * finish (a fence, then the counter) takes the mean into out as
 * sg_row_xent_mean does, the same bits whichever block is last. */
__device__ __forceinline__ void xent_finish(const double *loss, float *out, const wgeom &g,
                                            u32 *done) {
    __shared__ bool last;
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        last = atomicAdd(done, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    xent_mean(loss, out, g);
    if (threadIdx.x == 0) *done = 0;
}

/* cross_entropy, first pass: loss[r] = log(sum(exp(x - m))) + m - x[t[r]],
 * NaN for a target outside [0, len) (never read out of bounds). Row r's
 * logits start at r * oxs[0]; a block's row (over 1k elements) is read as
 * 16-byte vectors (block_lse). The last block takes the mean (xent_finish):
 * one launch. */
extern "C" __global__ void sg_row_xent(const void *x, const void *t, double *loss, float *out,
                                       wgeom g) {
    pdl_begin();
    i64 row;
    int lane;
    if (my_row(g, &row, &lane)) xent_row(x, t, loss, g, row, lane);
    xent_finish(loss, out, g, &xent_done);
}

/* cross_entropy, second pass (one block): the mean of the nrows losses, as
 * an f32 scalar; NaN over no rows, as in PyTorch. For no rows only:
 * sg_row_xent takes the mean itself. */
extern "C" __global__ void sg_row_xent_mean(const double *loss, float *out, wgeom g) {
    pdl_begin();
    xent_mean(loss, out, g);
}

/* ------------------------------------------------------------ cross_entropy's gradient */

/* One element of the gradient from e = exp(x - m): e * ks (ks = inv *
 * scale), at the target (hot) (e * inv - 1) * scale. */
__device__ __forceinline__ float xent_grad(float e, bool hot, float inv, float scale, float ks) {
    return hot ? (e * inv - 1.0f) * scale : e * ks;
}

/* Row j0.. of the gradient, the target c tested once a vector. */
template <int DT>
__device__ __forceinline__ uint4 xent_bwd_vec(uint4 u, i64 j0, i64 c, float m, float inv,
                                              float scale, float ks) {
    const int PER = DT == DT_F32 ? 4 : 8;
    float f[8];
    unpack16<DT>(u, f);
    if ((unsigned long long)(c - j0) < (unsigned long long)PER) {
#pragma unroll
        for (int k = 0; k < PER; k++)
            f[k] = xent_grad(ex<DT>(f[k] - m), k == c - j0, inv, scale, ks);
    } else {
#pragma unroll
        for (int k = 0; k < PER; k++) f[k] = ex<DT>(f[k] - m) * ks;
    }
    return pack16<DT>(f);
}

/* One row of sg_row_xent_bwd by the block, its dtype known; with ST its
 * vectors kept in shared memory (stage) by the statistics pass, so that the
 * write pass reads no DRAM. With loss, also the row's loss, its sums those
 * of sg_row_xent's block (the same vectors: a second statistics pass when
 * y's placement cut the row otherwise); the target's logit is read before
 * any thread writes (y may be x). */
template <int DT, int ST>
__device__ __forceinline__ void xent_bwd_row(const char *xr, char *yr, i64 c, float gv,
                                             const wgeom &g, double inv_n, double *loss,
                                             uint4 *stage) {
    const int ES = DT == DT_F32 ? 4 : 2, PER = 16 / ES;
    vrow r = vrow_of<DT>(xr, yr, g.len, g.xs, g.ys);
    const uint4 *xv = (const uint4 *)(xr + r.head * ES);
    uint4 *yv = (uint4 *)(yr + r.head * ES);
    bool in = c >= 0 && c < g.len;
    float xc = loss && threadIdx.x == 0 && in ? ldf(xr, DT, c * g.xs) : 0.0f;
    float m;
    double s;
    block_lse<DT, ST>(xr, r, g.xs, &m, &s, stage);
    if (loss) {
        vrow rf = vrow_of<DT>(xr, xr, g.len, g.xs, 1);
        float fm = m;
        double fs = s;
        if (rf.head != r.head) block_lse<DT>(xr, rf, g.xs, &fm, &fs);
        if (threadIdx.x == 0) *loss = xent_loss(fm, fs, xc, c, g.len);
    }
    float inv = (float)(1.0 / s), scale = (float)((double)gv * inv_n);
    if (!in) scale = __int_as_float(0x7fc00000); /* NaN */
    const float ks = inv * scale;
    /* The write pass, from the row's start. */
    i64 v = threadIdx.x;
    for (; v + (XENT_UNROLL - 1) * BLOCK < r.nv; v += XENT_UNROLL * BLOCK) {
        uint4 a[XENT_UNROLL];
#pragma unroll
        for (int u = 0; u < XENT_UNROLL; u++)
            a[u] = ST ? stage[v + u * BLOCK] : __ldg(xv + v + u * BLOCK);
#pragma unroll
        for (int u = 0; u < XENT_UNROLL; u++) {
            i64 w = v + u * BLOCK;
            yv[w] = xent_bwd_vec<DT>(a[u], r.head + w * PER, c, m, inv, scale, ks);
        }
    }
    for (; v < r.nv; v += BLOCK)
        yv[v] =
            xent_bwd_vec<DT>(ST ? stage[v] : __ldg(xv + v), r.head + v * PER, c, m, inv, scale, ks);
    for (i64 u = threadIdx.x; u < r.rest; u += BLOCK) {
        i64 j = u < r.head ? u : r.tail + (u - r.head);
        float e = ex<DT>(ldf(xr, DT, j * g.xs) - m);
        stf(yr, DT, j * g.ys, xent_grad(e, j == c, inv, scale, ks));
    }
}

/* A short row of sg_row_xent_bwd by a warp (g.team == 32, lane `lane`):
 * its statistics element by element, then the write pass. With loss, also
 * the row's loss as sg_row_xent's team of fteam lanes sums it (a warp, or
 * lane 0 alone when fteam is 1), read whole before any lane writes. */
template <int DT>
__device__ __forceinline__ void xent_bwd_team(const char *xr, char *yr, i64 c, float gv,
                                              const wgeom &g, double inv_n, int lane, double *loss,
                                              int fteam) {
    bool in = c >= 0 && c < g.len;
    float fm = -inf_f(), xc = 0.0f;
    double fs = 0.0;
    if (loss && lane == 0) {
        if (in) xc = ldf(xr, DT, c * g.xs);
        for (i64 j = 0; fteam == 1 && j < g.len; j++) lse_add(ldf(xr, DT, j * g.xs), &fm, &fs);
    }
    float m = -inf_f();
    double s = 0.0;
    for (i64 j = lane; j < g.len; j += 32) lse_add(ldf(xr, DT, j * g.xs), &m, &s);
    team_lse(&m, &s, 32);
    __syncwarp(); /* every lane's reads of the row before any lane's writes */
    if (loss && lane == 0)
        *loss = fteam == 1 ? xent_loss(fm, fs, xc, c, g.len) : xent_loss(m, s, xc, c, g.len);
    float inv = (float)(1.0 / s), scale = (float)((double)gv * inv_n);
    if (!in) scale = __int_as_float(0x7fc00000); /* NaN */
    const float ks = inv * scale;
    for (i64 j = lane; j < g.len; j += 32) {
        float e = ex<DT>(ldf(xr, DT, j * g.xs) - m);
        stf(yr, DT, j * g.ys, xent_grad(e, j == c, inv, scale, ks));
    }
}

/* Row `row` of sg_row_xent_bwd by its team, its dtype known: a warp's
 * (WARP), else a block's. */
template <int DT, bool WARP>
__device__ __forceinline__ void xent_bwd_dt(const char *xr, char *yr, i64 c, float gv,
                                            const wgeom &g, double inv_n, int lane, double *loss,
                                            int fteam, int staged, uint4 *stage) {
    if (WARP)
        xent_bwd_team<DT>(xr, yr, c, gv, g, inv_n, lane, loss, fteam);
    else if (staged == 2)
        xent_bwd_row<DT, 2>(xr, yr, c, gv, g, inv_n, loss, stage);
    else if (staged)
        xent_bwd_row<DT, 1>(xr, yr, c, gv, g, inv_n, loss, stage);
    else
        xent_bwd_row<DT, 0>(xr, yr, c, gv, g, inv_n, loss, stage);
}

/*
 * cross_entropy's gradient, one block per row: y = (exp(x - m) / s -
 * (j == t[r])) * g / N, g (a 0-d float of dtype gdt) read here, so that a
 * replay reads its current value. The statistics pass walks the row from
 * its end and the write pass from its start; with staged (a row's vectors
 * fit the dynamic shared memory the launch gave) the statistics pass keeps
 * the row on chip and the write pass reads it there (DRAM: one read, one
 * write), else the write pass first reads what the statistics pass left in
 * L2 last. Rows whose x and y are contiguous and equally placed within 16
 * bytes move as 16-byte vectors (a head and a tail element by element),
 * others element by element; rows of up to 1024 elements take a warp each
 * (g.team 32: sg_row_xent_bwd_warp, below). A target outside [0, len)
 * makes its row NaN.
 *
 * With loss (a cross_entropy fused with its gradient, sg__group.xent): also
 * the forward's loss[r], the same bits as sg_row_xent's with a team of
 * fteam, and the last block takes their mean into out (xent_finish).
 */
template <bool WARP>
__device__ __forceinline__ void xent_bwd_kernel(const void *x, const void *t, const void *gp,
                                                void *y, double *loss, float *out, const wgeom &g,
                                                double inv_n, int gdt, int staged, int fteam) {
    extern __shared__ uint4 stage[];
    i64 row = blockIdx.x;
    int lane = 0;
    bool mine = WARP ? my_row(g, &row, &lane) : row < g.nrows;
    if (mine) {
        int es = g.dt == DT_F32 ? 4 : 2;
        const char *xr = (const char *)x + row * g.oxs[0] * es;
        char *yr = (char *)y + row * g.oys[0] * es;
        i64 c = xent_target(t, g, row);
        float gv = ldf(gp, gdt, 0);
        double *lr = loss ? loss + row : 0;
        switch (g.dt) {
        case DT_F32:
            xent_bwd_dt<DT_F32, WARP>(xr, yr, c, gv, g, inv_n, lane, lr, fteam, staged, stage);
            break;
        case DT_BF16:
            xent_bwd_dt<DT_BF16, WARP>(xr, yr, c, gv, g, inv_n, lane, lr, fteam, staged, stage);
            break;
        default:
            xent_bwd_dt<DT_F16, WARP>(xr, yr, c, gv, g, inv_n, lane, lr, fteam, staged, stage);
            break;
        }
    }
    if (loss) xent_finish(loss, out, g, &xent_bwd_done);
}

extern "C" __global__ void __launch_bounds__(BLOCK)
    sg_row_xent_bwd(const void *x, const void *t, const void *gp, void *y, double *loss, float *out,
                    wgeom g, double inv_n, int gdt, int staged, int fteam) {
    pdl_begin();
    xent_bwd_kernel<false>(x, t, gp, y, loss, out, g, inv_n, gdt, staged, fteam);
}

/* The same for rows of at most 1024 elements (g.team 32): only the warp's
 * path, so that the kernel's code is small (W4's 128 x 10 logits: a long
 * dependent path a warp, which in the whole kernel's body stalled on
 * instruction fetch). */
extern "C" __global__ void __launch_bounds__(BLOCK)
    sg_row_xent_bwd_warp(const void *x, const void *t, const void *gp, void *y, double *loss,
                         float *out, wgeom g, double inv_n, int gdt, int staged, int fteam) {
    pdl_begin();
    xent_bwd_kernel<true>(x, t, gp, y, loss, out, g, inv_n, gdt, staged, fteam);
}

/* ------------------------------------------------------------ the norms' gradient */

/* NORM_STATS: row r's mean (0 for rms_norm) and 1 / sqrt(var + eps), as f32
 * at y[yo] and y[yo + ys] (g.op: OP_LAYER_NORM or OP_RMS_NORM). */
#define NB_VEC 4 /* 16-byte vectors per lane of a row in vectors: 1024 halves, 512 floats */

/* A warp's sum of v in a fixed order: the butterfly gives both lanes of a
 * pair the same bits (a + b == b + a). */
__device__ __forceinline__ float warp_sum(float v) {
    for (int m = 16; m >= 1; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
    return v;
}

/* The norms' statistics of a row of nv 16-byte vectors (nv <= 32 * NB_VEC)
 * at xr by a warp, in f32: every load in flight first, then the mean and
 * the squares about it from the registers. */
template <int DT>
__device__ __forceinline__ void norm_stats_vec(const char *xr, i64 nv, i64 len, bool layer,
                                               double eps, int lane, float *mean, float *r) {
    const int PER = DT == DT_F32 ? 4 : 8;
    uint4 xa[NB_VEC];
#pragma unroll
    for (int q = 0; q < NB_VEC; q++)
        if (lane + q * 32 < nv) xa[q] = __ldg((const uint4 *)xr + lane + q * 32);
    float f[8], s = 0.0f, m = 0.0f, v = 0.0f;
#pragma unroll
    for (int q = 0; q < NB_VEC; q++) {
        if (!layer || lane + q * 32 >= nv) continue;
        unpack16<DT>(xa[q], f);
#pragma unroll
        for (int k = 0; k < PER; k++) s += f[k];
    }
    if (layer) m = warp_sum(s) / (float)len;
#pragma unroll
    for (int q = 0; q < NB_VEC; q++) {
        if (lane + q * 32 >= nv) continue;
        unpack16<DT>(xa[q], f);
#pragma unroll
        for (int k = 0; k < PER; k++) v += (f[k] - m) * (f[k] - m);
    }
    v = warp_sum(v) / (float)len;
    *mean = m;
    *r = 1.0f / sqrtf(v + (float)eps);
}

extern "C" __global__ void sg_row_norm_stats(const void *x, float *y, wgeom g) {
    pdl_begin();
    i64 row, xo, yo;
    int lane;
    if (!my_row(g, &row, &lane)) return;
    row_offsets(g, row, &xo, &yo);
    if (g.flags & NB_VECS) { /* contiguous rows on 16 bytes (cuda_row.c) */
        float m, rf;
        const char *xr = (const char *)x + xo * (g.dt == DT_F32 ? 4 : 2);
        i64 nv = g.len / (g.dt == DT_F32 ? 4 : 8);
        bool layer = g.op == OP_LAYER_NORM;
        if (g.dt == DT_F32)
            norm_stats_vec<DT_F32>(xr, nv, g.len, layer, g.eps, lane, &m, &rf);
        else if (g.dt == DT_BF16)
            norm_stats_vec<DT_BF16>(xr, nv, g.len, layer, g.eps, lane, &m, &rf);
        else
            norm_stats_vec<DT_F16>(xr, nv, g.len, layer, g.eps, lane, &m, &rf);
        if (lane == 0) y[yo] = m, y[yo + g.ys] = rf;
        return;
    }
    double mean, r;
    norm_stats(x, g.dt, xo, g.xs, g.len, g.op == OP_LAYER_NORM, g.eps, lane, g.team, &mean, &r);
    if (lane == 0) y[yo] = (float)mean, y[yo + g.ys] = (float)r;
}

/* NORM_BWD's rows (struct ngeom in cuda_row.c): row r's offsets in x, g, y
 * and r over the leading dims (osize), then strides along the row. */
struct ngeom {
    i64 osize[MAXD], oxs[MAXD], ogs[MAXD], oys[MAXD], ors[MAXD];
    i64 nrows, len, xs, gs, ys, ws, rs;
    int nd, team, layer, dt, flags, sdt; /* sdt: the dtype of dx's column sum (NB_DXSUM) */
    double eps;
};

/* Flags beside HAS_W and NB_VECS: r is added; the column sums of g * xh and
 * g; the column sum of dx as stored (sg_row_norm_bwd_vec only); r loaded
 * with x and g, before the row's sums (else after them). */
enum { NB_R = 8, NB_SUMS = 16, NB_DXSUM = 32, NB_R_EARLY = 64 };

#define NB_KEEP 32 /* elements per lane kept in registers between the passes */

__device__ __forceinline__ void nrow_offsets(const ngeom &g, i64 row, i64 *xo, i64 *go, i64 *yo,
                                             i64 *ro) {
    i64 r = row;
    *xo = *go = *yo = *ro = 0;
    if (g.nd <= 1) { /* one dim (cuda_row.c merges them where it can): r < nrows */
        *xo = r * g.oxs[0], *go = r * g.ogs[0], *yo = r * g.oys[0], *ro = r * g.ors[0];
        return;
    }
    for (int d = g.nd - 1; d >= 0; d--) {
        i64 i = row_digit(&r, g.osize[d]);
        *xo += i * g.oxs[d], *go += i * g.ogs[d], *yo += i * g.oys[d], *ro += i * g.ors[d];
    }
}

/* One row of NORM_BWD by its team: the row's statistics (norm_stats, kept
 * at st[2 row] for the column sums when st is given), the sums of gw and gw *
 * xh (f64, each lane in column order, the team's butterfly), then dx =
 * rstd * (gw - mean(gw) - xh * mean(gw * xh)) (+ r). A row of at most
 * NB_KEEP elements a lane is read once more; a longer one twice. */
template <int DT>
__device__ __forceinline__ void norm_bwd_row(const void *x, const void *gp, const void *w,
                                             const void *rp, void *y, float *st, const ngeom &g,
                                             i64 row, int lane) {
    i64 xo, go, yo, ro;
    nrow_offsets(g, row, &xo, &go, &yo, &ro);
    const int team = g.team;
    const i64 len = g.len;
    const bool hw = (g.flags & HAS_W) != 0, hr = (g.flags & NB_R) != 0;
    double dm, dr;
    norm_stats(x, DT, xo, g.xs, len, g.layer != 0, g.eps, lane, team, &dm, &dr);
    const float mean = (float)dm, rs = (float)dr;
    if (st && lane == 0) st[2 * row] = mean, st[2 * row + 1] = rs;
    double s1 = 0.0, s2 = 0.0;
    float kg[NB_KEEP], kx[NB_KEEP];
    const bool keep = len <= (i64)team * NB_KEEP;
    if (keep) {
#pragma unroll
        for (int t = 0; t < NB_KEEP; t++) {
            i64 j = lane + (i64)t * team;
            kg[t] = 0.0f, kx[t] = 0.0f;
            if (j < len) {
                float gw = ldf(gp, DT, go + j * g.gs);
                if (hw) gw *= ldf(w, DT, j * g.ws);
                kg[t] = gw;
                kx[t] = (ldf(x, DT, xo + j * g.xs) - mean) * rs;
            }
        }
#pragma unroll
        for (int t = 0; t < NB_KEEP; t++) s1 += (double)kg[t], s2 += (double)kg[t] * kx[t];
    } else {
        for (i64 j = lane; j < len; j += team) {
            float gw = ldf(gp, DT, go + j * g.gs);
            if (hw) gw *= ldf(w, DT, j * g.ws);
            s1 += (double)gw;
            s2 += (double)gw * ((ldf(x, DT, xo + j * g.xs) - mean) * rs);
        }
    }
    team_sum2(&s1, &s2, team);
    const float m1 = g.layer ? (float)(s1 / (double)len) : 0.0f, m2 = (float)(s2 / (double)len);
    if (keep) {
#pragma unroll
        for (int t = 0; t < NB_KEEP; t++) {
            i64 j = lane + (i64)t * team;
            if (j >= len) continue;
            float d = rs * ((kg[t] - m1) - kx[t] * m2);
            if (hr) d += ldf(rp, DT, ro + j * g.rs);
            stf(y, DT, yo + j * g.ys, d);
        }
        return;
    }
    for (i64 j = lane; j < len; j += team) {
        float gw = ldf(gp, DT, go + j * g.gs);
        if (hw) gw *= ldf(w, DT, j * g.ws);
        float xh = (ldf(x, DT, xo + j * g.xs) - mean) * rs;
        float d = rs * ((gw - m1) - xh * m2);
        if (hr) d += ldf(rp, DT, ro + j * g.rs);
        stf(y, DT, yo + j * g.ys, d);
    }
}

/* NORM_BWD: the input gradient of layer_norm (g.layer) or rms_norm from x,
 * the output's gradient g and the weight w (HAS_W), plus r (NB_R), a team
 * per row; with st, each row's statistics for sg_row_norm_bwd_cols. */
extern "C" __global__ void __launch_bounds__(BLOCK)
    sg_row_norm_bwd(const void *x, const void *gp, const void *w, const void *rp, void *y,
                    float *st, ngeom g) {
    pdl_begin();
    int lane = threadIdx.x % g.team;
    i64 row = (i64)blockIdx.x * (BLOCK / g.team) + threadIdx.x / g.team;
    if (row >= g.nrows) return; /* the whole team leaves together */
    switch (g.dt) {
    case DT_F32: norm_bwd_row<DT_F32>(x, gp, w, rp, y, st, g, row, lane); break;
    case DT_BF16: norm_bwd_row<DT_BF16>(x, gp, w, rp, y, st, g, row, lane); break;
    default: norm_bwd_row<DT_F16>(x, gp, w, rp, y, st, g, row, lane); break;
    }
}

/* NORM_BWD's column sums after sg_row_norm_bwd: a thread per column j sums
 * g * xh and g over the rows in order (f64), from the rows' statistics st,
 * and stores them at o[j] and o[len + j]. */
extern "C" __global__ void __launch_bounds__(BLOCK)
    sg_row_norm_bwd_cols(const void *x, const void *gp, const float *st, void *o, ngeom g) {
    pdl_begin();
    i64 j = (i64)blockIdx.x * BLOCK + threadIdx.x;
    if (j >= g.len) return;
    double aw = 0.0, ab = 0.0;
    for (i64 row = 0; row < g.nrows; row++) {
        i64 xo, go, yo, ro;
        nrow_offsets(g, row, &xo, &go, &yo, &ro);
        float gv = ldf(gp, g.dt, go + j * g.gs);
        float xh = (ldf(x, g.dt, xo + j * g.xs) - (g.layer ? st[2 * row] : 0.0f)) * st[2 * row + 1];
        aw += (double)gv * xh, ab += (double)gv;
    }
    stf(o, g.dt, j, (float)aw);
    stf(o, g.dt, g.len + j, (float)ab);
}

/* Rows of NORM_BWD in 16-byte vectors by a warp each (NB_VECS: x, g, y, w
 * and r contiguous on 16 bytes, at most 32 * NB_VEC vectors), the warps of
 * the grid taking rows in turn: per row every vector in flight at once
 * (r's too with NB_R_EARLY), then two passes over the registers. The first
 * takes the row's four sums in f32 (each lane in column order, then one
 * butterfly of the four): of d = x - c, of d * d, of gw = g * w and of
 * gw * d, about c, the row's first element (0 for RMS), so that the
 * variance, sum(d * d) / len - mean(d)^2, loses nothing to a mean far from
 * 0. The second makes xh, dx (+ r), packed and stored, and the columns'
 * sums. With NB_SUMS each lane
 * also sums g * xh and g of its columns over its warp's rows, and with
 * NB_DXSUM dx as stored (packed to the dtype), in the warp's own set of
 * len floats each in shared memory (16-byte accesses); then the block adds
 * its warps' sets in warp order into part[blockIdx.x] (nsets * len f32),
 * which sg_row_norm_bwd_fin adds in block order: the same bits every
 * launch of the same grid. Two blocks fit an SM.
 *
 * REG (sg_row_norm_bwd_reg, rows of at most 768 halves or 512 floats): the
 * lane's column sums stay in registers over its warp's rows (a lane owns
 * the same columns in every row) and reach the warp's shared set once, at
 * the end, so a row costs no shared-memory traffic; the sums and their
 * order are the same as without REG. The squares, the sum of g * xh and dx
 * are explicit fmaf (every image is compiled with --fmad=false, which would
 * split them): one rounding fewer each, and a row's path of dependent
 * instructions, which bounds this kernel (two warps a scheduler), shorter. */
template <int DT, bool REG>
__device__ __forceinline__ void norm_bwd_vec(const void *x, const void *gp, const void *w,
                                             const void *rp, void *y, float *part, const ngeom &g) {
    constexpr int PER = DT == DT_F32 ? 4 : 8, es = DT == DT_F32 ? 4 : 2;
    /* vectors a lane; the register sums' rows fit NQ (cuda_row.c checks) */
    constexpr int NQ = REG ? (DT == DT_F32 ? 4 : 3) : NB_VEC, NA = REG ? NQ : 1;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
    const i64 len = g.len, nv = len / PER;
    const bool layer = g.layer != 0, hw = (g.flags & HAS_W) != 0, hr = (g.flags & NB_R) != 0;
    const bool sums = (g.flags & NB_SUMS) != 0, dxs = (g.flags & NB_DXSUM) != 0;
    const bool early = hr && (REG || (g.flags & NB_R_EARLY) != 0);
    const int nsets = (sums ? 2 : 0) + (dxs ? 1 : 0);
    extern __shared__ float sh[];
    float *acc = sh + (i64)warp * nsets * len, *accd = acc + (sums ? 2 * len : 0);
    float rw[NA][PER], rb[NA][PER], rd[NA][PER]; /* REG: the lane's column sums */
    float wr[NA][PER];                           /* REG: w of the lane's columns, once */
#pragma unroll
    for (int q = 0; q < NA; q++) {
#pragma unroll
        for (int k = 0; k < PER; k++) rw[q][k] = rb[q][k] = rd[q][k] = wr[q][k] = 0.0f;
        if (REG && hw && lane + q * 32 < nv)
            unpack16<DT>(__ldg((const uint4 *)w + lane + q * 32), wr[q]);
    }
    if (!REG)
        for (i64 v = lane; v < nv; v += 32) /* the lane's own columns */
            for (int t = 0; t < nsets; t++)
                for (int k = 0; k < PER; k++) acc[t * len + v * PER + k] = 0.0f;
    /* REG: the warp's next row of x and g is in flight while it works on
     * this one (one block an SM, so the registers are there). */
    const i64 step = (i64)gridDim.x * nw;
    uint4 xn[NA], gn[NA], rn[NA];
    /* The row at offsets xo, go, ro: x and g (and r with `with_r`) into xd, gd and rd. */
    auto fetch = [&](i64 xo, i64 go, i64 ro, bool with_r, uint4 *xd, uint4 *gd, uint4 *rd) {
        const uint4 *xr = (const uint4 *)((const char *)x + xo * es) + lane;
        const uint4 *gr = (const uint4 *)((const char *)gp + go * es) + lane;
        const uint4 *rr = (const uint4 *)((const char *)rp + ro * es) + lane;
#pragma unroll
        for (int q = 0; q < NQ; q++)
            if (lane + q * 32 < nv) {
                xd[q] = __ldg(xr + q * 32), gd[q] = __ldg(gr + q * 32);
                if (with_r) rd[q] = __ldg(rr + q * 32);
            }
    };
    const i64 first = (i64)blockIdx.x * nw + warp;
    i64 xo, go, yo, ro;
    if (REG && first < g.nrows) {
        nrow_offsets(g, first, &xo, &go, &yo, &ro);
        fetch(xo, go, ro, hr, xn, gn, rn);
    }
    for (i64 row = first; row < g.nrows; row += step) {
        uint4 xa[NQ], ga[NQ], ra[NQ];
        if (REG) { /* this row's vectors, the next row's in flight */
#pragma unroll
            for (int q = 0; q < NQ; q++) xa[q] = xn[q % NA], ga[q] = gn[q % NA], ra[q] = rn[q % NA];
            if (row + step < g.nrows) {
                nrow_offsets(g, row + step, &xo, &go, &yo, &ro);
                fetch(xo, go, ro, hr, xn, gn, rn);
            }
            nrow_offsets(g, row, &xo, &go, &yo, &ro);
        } else {
            nrow_offsets(g, row, &xo, &go, &yo, &ro);
        }
        const uint4 *rr = (const uint4 *)((const char *)rp + ro * es);
        if (!REG) {
            const uint4 *xr = (const uint4 *)((const char *)x + xo * es);
            const uint4 *gr = (const uint4 *)((const char *)gp + go * es);
#pragma unroll
            for (int q = 0; q < NQ; q++) {
                i64 v = lane + q * 32;
                if (v >= nv) continue;
                xa[q] = __ldg(xr + v);
                ga[q] = __ldg(gr + v);
                if (early) ra[q] = __ldg(rr + v);
            }
        }
        /* One pass for the row's four sums, about c (the row's first
         * element for a layer norm, 0 for RMS): d = x - c, sum(d), sum(d * d),
         * sum(gw) and sum(gw * d); then one butterfly of the four. */
        float f[8], gg[8], ww[8], sd = 0.0f, sq = 0.0f, s1 = 0.0f, t = 0.0f;
        const float c = layer ? unpack_first<DT>(__shfl_sync(0xffffffffu, xa[0].x, 0)) : 0.0f;
#pragma unroll
        for (int q = 0; q < NQ; q++) {
            i64 v = lane + q * 32;
            if (v >= nv) continue;
            unpack16<DT>(xa[q], f);
            unpack16<DT>(ga[q], gg);
            if (hw && REG) {
#pragma unroll
                for (int k = 0; k < PER; k++) ww[k] = wr[q % NA][k];
            } else if (hw) {
                unpack16<DT>(__ldg((const uint4 *)w + v), ww);
            }
#pragma unroll
            for (int k = 0; k < PER; k++) {
                const float d = f[k] - c, gw = hw ? gg[k] * ww[k] : gg[k];
                sd += d;
                sq = fmaf(d, d, sq);
                s1 += gw;
                t = fmaf(gw, d, t);
            }
        }
#pragma unroll
        for (int o = 16; o >= 1; o >>= 1) {
            sd += __shfl_xor_sync(0xffffffffu, sd, o);
            sq += __shfl_xor_sync(0xffffffffu, sq, o);
            s1 += __shfl_xor_sync(0xffffffffu, s1, o);
            t += __shfl_xor_sync(0xffffffffu, t, o);
        }
        const float inv = 1.0f / (float)len, dm = layer ? sd * inv : 0.0f, m = c + dm;
        const float var = fmaxf(fmaf(-dm, dm, sq * inv), 0.0f);
        const float rs = 1.0f / sqrtf(var + (float)g.eps);
        /* sum(gw * xh) = rs * sum(gw * (x - m)) = rs * (sum(gw * d) - (m - c) sum(gw)) */
        const float m1 = layer ? s1 * inv : 0.0f, m2 = rs * fmaf(-dm, s1, t) * inv;
        uint4 *yr = (uint4 *)((char *)y + yo * es);
#pragma unroll
        for (int q = 0; q < NQ; q++) {
            i64 v = lane + q * 32;
            if (v >= nv) continue;
            float rv[8], xs[8];
            unpack16<DT>(xa[q], f);
            unpack16<DT>(ga[q], gg);
            if (hw && REG) {
#pragma unroll
                for (int k = 0; k < PER; k++) ww[k] = wr[q % NA][k];
            } else if (hw) {
                unpack16<DT>(__ldg((const uint4 *)w + v), ww);
            }
            if (hr) unpack16<DT>(early ? ra[q] : __ldg(rr + v), rv);
#pragma unroll
            for (int k = 0; k < PER; k++) {
                const float xh = (f[k] - m) * rs;
                const float e = fmaf(-xh, m2, (hw ? gg[k] * ww[k] : gg[k]) - m1);
                f[k] = hr ? fmaf(rs, e, rv[k]) : rs * e;
                if (REG && sums)
                    rw[q % NA][k] += gg[k] * xh, rb[q % NA][k] += gg[k];
                else if (sums)
                    xs[k] = gg[k] * xh;
            }
            if (sums && !REG) {
                float4 *aw = (float4 *)(acc + v * PER), *ab = (float4 *)(acc + len + v * PER);
#pragma unroll
                for (int h = 0; h < PER / 4; h++) {
                    float4 a = aw[h], b = ab[h];
                    a.x += xs[4 * h], a.y += xs[4 * h + 1], a.z += xs[4 * h + 2],
                        a.w += xs[4 * h + 3];
                    b.x += gg[4 * h], b.y += gg[4 * h + 1], b.z += gg[4 * h + 2],
                        b.w += gg[4 * h + 3];
                    aw[h] = a, ab[h] = b;
                }
            }
            const uint4 packed = pack16<DT>(f);
            yr[v] = packed;
            if (!dxs) continue;
            unpack16<DT>(packed, f); /* the values as stored */
            if (REG) {
#pragma unroll
                for (int k = 0; k < PER; k++) rd[q][k] += f[k];
                continue;
            }
            float4 *ad = (float4 *)(accd + v * PER);
#pragma unroll
            for (int h = 0; h < PER / 4; h++) {
                float4 a = ad[h];
                a.x += f[4 * h], a.y += f[4 * h + 1], a.z += f[4 * h + 2], a.w += f[4 * h + 3];
                ad[h] = a;
            }
        }
    }
    if (!nsets) return;
    if (REG) /* the warp's sums into its sets, once */
#pragma unroll
        for (int q = 0; q < NQ; q++) {
            i64 v = lane + q * 32;
            if (v >= nv) continue;
#pragma unroll
            for (int h = 0; h < PER / 4; h++) {
                if (sums) {
                    ((float4 *)(acc + v * PER))[h] =
                        float4{rw[q][4 * h], rw[q][4 * h + 1], rw[q][4 * h + 2], rw[q][4 * h + 3]};
                    ((float4 *)(acc + len + v * PER))[h] =
                        float4{rb[q][4 * h], rb[q][4 * h + 1], rb[q][4 * h + 2], rb[q][4 * h + 3]};
                }
                if (dxs)
                    ((float4 *)(accd + v * PER))[h] =
                        float4{rd[q][4 * h], rd[q][4 * h + 1], rd[q][4 * h + 2], rd[q][4 * h + 3]};
            }
        }
    __syncthreads();
    const i64 n2 = nsets * len;
    float *pb = part + (i64)blockIdx.x * n2;
    for (i64 t = threadIdx.x; t < n2; t += blockDim.x) {
        float a = 0.0f;
        for (int wv = 0; wv < nw; wv++) a += sh[(i64)wv * n2 + t];
        pb[t] = a;
    }
}

extern "C" __global__ void __launch_bounds__(BLOCK, 2)
    sg_row_norm_bwd_vec(const void *x, const void *gp, const void *w, const void *rp, void *y,
                        float *part, ngeom g) {
    pdl_begin();
    if (g.dt == DT_F32)
        norm_bwd_vec<DT_F32, false>(x, gp, w, rp, y, part, g);
    else if (g.dt == DT_BF16)
        norm_bwd_vec<DT_BF16, false>(x, gp, w, rp, y, part, g);
    else
        norm_bwd_vec<DT_F16, false>(x, gp, w, rp, y, part, g);
}

extern "C" __global__ void __launch_bounds__(BLOCK, 1)
    sg_row_norm_bwd_reg(const void *x, const void *gp, const void *w, const void *rp, void *y,
                        float *part, ngeom g) {
    pdl_begin();
    if (g.dt == DT_F32)
        norm_bwd_vec<DT_F32, true>(x, gp, w, rp, y, part, g);
    else if (g.dt == DT_BF16)
        norm_bwd_vec<DT_BF16, true>(x, gp, w, rp, y, part, g);
    else
        norm_bwd_vec<DT_F16, true>(x, gp, w, rp, y, part, g);
}

/* NORM_BWD's column sums from sg_row_norm_bwd_vec's nparts block partials
 * (nsets * len f32 each): a block of 32 columns by 8 warps, warp s adding
 * partials s, s + 8, ... in order, then the 8 in warp order; rounded once
 * into o[c] (NB_SUMS, c < len: sum(g * xh), c < 2 len: sum(g)) or, for the
 * set of dx (NB_DXSUM), into dxo[c - 2 len] (without NB_SUMS: dxo[c]) in
 * dtype g.sdt. */
extern "C" __global__ void __launch_bounds__(BLOCK)
    sg_row_norm_bwd_fin(const float *part, int nparts, void *o, void *dxo, ngeom g) {
    pdl_begin();
    __shared__ float sh[BLOCK / 32][32];
    const int lane = threadIdx.x % 32, s = threadIdx.x / 32;
    const bool sums = (g.flags & NB_SUMS) != 0, dxs = (g.flags & NB_DXSUM) != 0;
    const i64 c = (i64)blockIdx.x * 32 + lane, n2 = ((sums ? 2 : 0) + (dxs ? 1 : 0)) * g.len;
    float a = 0.0f;
    if (c < n2)
#pragma unroll 8
        for (int p = s; p < nparts; p += BLOCK / 32) a += part[(i64)p * n2 + c];
    sh[s][lane] = a;
    __syncthreads();
    if (s != 0 || c >= n2) return;
    for (int k = 1; k < BLOCK / 32; k++) a += sh[k][lane];
    if (sums && c < 2 * g.len)
        stf(o, g.dt, c, a);
    else
        stf(dxo, g.sdt, c - (sums ? 2 * g.len : 0), a);
}
