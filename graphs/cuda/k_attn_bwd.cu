/* SPDX-License-Identifier: MIT */
/*
 * k_attn_bwd.cu -- the CUDA kernels of ATTENTION_BWD, the gradient of
 * attention (host side in cuda_attn_bwd.c; the node in capture/ops.def).
 * Every kernel writes into the node's one packed output: dq (B,Hq,Lq,D), dk
 * and dv (B,Hkv,S,D) in its first nq + 2 nkv elements, each row where
 * bgeom.part puts it (capture.h's sg__attn_bwd_parts: contiguous parts, or
 * laid out as q, k and v are), and the row workspace (f32 logsumexp of each
 * row's scaled scores, then D = rowsum(dO * O)) at ws.
 * Nothing is accumulated with atomics: every result is one sum in a fixed
 * order, so replays give identical bits.
 *
 * Two passes, in this order on the stream:
 *   rows: per query row (block), the logsumexp (the forward's when the node
 *         has them, lse, and they are not NaN; else recomputed from Q K^T), D, and
 *         dq = scale * sum_j dS_j k_j, dS_j = P_j (dO . v_j - D), P_j =
 *         exp(s_j - lse); writes dq and the workspace.
 *   keys: per key (block), dv_j = sum_i P_ij dO_i and dk_j = scale * sum_i
 *         dS_ij q_i over the query heads that share its K/V head (in head
 *         order) and the queries that see it.
 *
 * sg_attn_bwd_rows / sg_attn_bwd_keys: f32 FMA, any float dtype, D <= 256,
 * masks and kv_len; a block per row or key, scores of 128 keys (queries)
 * at a time through shared memory.
 *
 * sg_attn_bwd_dq<D>_<dtype> / sg_attn_bwd_dkv<D>_<dtype> (D = 64 or 128;
 * bf16 and f16, one kernel each, no mask): the same two passes on tensor
 * cores, mma.sync m16n8k16 with f32
 * accumulators, flash-attention-2 style. dq: a block of 4 warps per 64
 * query rows (a warp 16), Q and dO fragments in registers; a first loop
 * over key tiles finds each row's logsumexp (none when the forward kept
 * every row's), a second recomputes P and dP =
 * dO V^T per tile and adds dS K into dq. dkv: a block per 64 keys (a warp
 * 16), K and V fragments in registers; for each query head of the group and
 * each query tile that can see the block (causal: from the first such
 * tile), S^T = K Q^T, P^T from the workspace's lse, dV += P^T dO, dP^T = V
 * dO^T, dS^T = P^T (dP^T - D), dK += dS^T Q. A tile's accumulator layout
 * is the next mma's A-operand layout, so P and dS (16 keys or queries at a
 * time) never leave registers. The streamed tiles (K and V for dq; Q, dO
 * and their lse and D for dkv) come by cp.async into two buffers, tile t +
 * 1 in flight while tile t computes, stored once, row-major, rows padded
 * by 8 halves (the 8 rows of an ldmatrix hit distinct banks); B operands
 * come out by ldmatrix, .trans where the tile is the k side (dq += dS K,
 * dV += P^T dO, dK += dS^T Q). Tiles: 64 keys (dq) or 64 queries (dkv) at
 * D = 64, 32 at D = 128, within 48 KiB of static shared memory. Operands
 * without 16-byte rows are staged element by element instead. Shared
 * memory is addressed by 32-bit shared-window addresses; exponents are in
 * log2 units (one FFMA before each ex2); only the tiles that cut a row's or
 * key's visible range (the causal diagonal, the ends) test visibility per
 * element. Grids are (heads, tiles), the longest tiles first.
 *
 * Visibility is ATTENTION's (capture.h, SG__ATTN_CAUSAL): key j of batch b
 * is seen by query i when j < L (kv_len[b] clamped to [0, S], or S) and,
 * causal, j <= L - Lq + i. A row that sees no key gets lse = +inf, so its P
 * is 0: it contributes nothing and its dq is 0.
 *
 * NVRTC compiles this file with no include path, so it includes nothing;
 * the build puts k_prelude.cuh (types, dtypes, pdl_begin) in front of it
 * (hiprtc too: see k_prelude.cuh's SG_PTX).
 */

#define NT 128 /* threads per block */
#define NW (NT / 32)

/* CAUSAL is SG__ATTN_CAUSAL; VQ, VK, VV, VG, VO: q, k, v, dO, o take 16-byte
 * loads (contiguous rows of 8-element vectors, aligned), set by the host. */
enum { CAUSAL = 1, VQ = 2, VK = 4, VV = 8, VG = 16, VO = 32 };

/* The same layout as struct bgeom in cuda_attn_bwd.c. */
struct bgeom {
    i64 qs[4], ks[4], vs[4], ms[4], gs[4], os[4]; /* strides of q, k, v, mask, dO, o */
    i64 B, Hq, Hkv, Lq, S, D;
    i64 ls;          /* kv_len's stride over b (0: one length for all) */
    i64 nq, nkv, ws; /* the packed output's parts, in elements */
    i64 part[3][4];  /* dq, dk, dv: element (b, h, i, e) at [0] + b [1] + h [2] + i [3] + e */
    float scale;
    int dt, mdt, ldt, flags; /* q/k/v dtype; mask's and kv_len's (-1: none) */
};

/* ------------------------------------------------------------ elements */

__device__ __forceinline__ float ld(const void *p, int dt, i64 i) {
    if (dt == DT_F32) return ((const float *)p)[i];
    u16 h = ((const u16 *)p)[i];
    return dt == DT_F16 ? h2f_cvt(h) : __uint_as_float((u32)h << 16);
}

__device__ __forceinline__ void st(void *p, int dt, i64 i, float v) {
    if (dt == DT_F32)
        ((float *)p)[i] = v;
    else
        ((u16 *)p)[i] = dt == DT_F16 ? f2h_cvt(v) : f2bf(v);
}

__device__ __forceinline__ float inf_f() { return __uint_as_float(0x7f800000u); }

/* Element 0 of row i of head h, batch b of part k (0 dq, 1 dk, 2 dv) in out. */
__device__ __forceinline__ i64 part_at(const bgeom &g, int k, i64 b, i64 h, i64 i) {
    return g.part[k][0] + b * g.part[k][1] + h * g.part[k][2] + i * g.part[k][3];
}

/* The row workspace: lse at ws[r], D at ws[rows + r]. */
__device__ __forceinline__ float *workspace(void *out, const bgeom &g) {
    return (float *)((char *)out + g.ws * (g.dt == DT_F32 ? 4 : 2));
}

/* ------------------------------------------------------------ visibility */

__device__ __forceinline__ i64 valid_len(const void *len, const bgeom &g, i64 b) {
    if (g.ldt < 0) return g.S;
    i64 L = g.ldt == DT_I32 ? (i64)((const int *)len)[b * g.ls] : ((const i64 *)len)[b * g.ls];
    return L < 0 ? 0 : L > g.S ? g.S : L;
}

/* Keys 0 .. n-1 are seen by query i. */
__device__ __forceinline__ i64 visible(const bgeom &g, i64 L, i64 i) {
    i64 n = L;
    if (g.flags & CAUSAL) {
        i64 last = L - g.Lq + i + 1;
        n = last < n ? last : n;
    }
    return n < 0 ? 0 : n;
}

/* The first query that sees key j (Lq when none does). */
__device__ __forceinline__ i64 first_query(const bgeom &g, i64 L, i64 j) {
    if (j >= L) return g.Lq;
    if (!(g.flags & CAUSAL)) return 0;
    i64 i = j - L + g.Lq;
    return i < 0 ? 0 : i;
}

/* ------------------------------------------------------------ FMA kernels */

/* A block-wide sum or max of one value per thread, in a fixed order. */
__device__ float block_reduce(float x, bool max, float *red) {
    for (int o = 16; o > 0; o >>= 1) {
        float y = __shfl_xor_sync(0xffffffffu, x, o);
        x = max ? fmaxf(x, y) : x + y;
    }
    __syncthreads();
    if ((threadIdx.x & 31) == 0) red[threadIdx.x / 32] = x;
    __syncthreads();
    float r = red[0];
    for (int w = 1; w < NW; w++) r = max ? fmaxf(r, red[w]) : r + red[w];
    return r;
}

/* The scaled, masked score of query row (b, h, i), q in qf, against key j. */
__device__ float score(const void *k, const void *m, const bgeom &g, const float *qf, i64 b, i64 h,
                       i64 hk, i64 i, i64 j) {
    i64 kb = b * g.ks[0] + hk * g.ks[1] + j * g.ks[2];
    float s = 0.0f;
    for (int e = 0; e < (int)g.D; e++) s += qf[e] * ld(k, g.dt, kb + e * g.ks[3]);
    s *= g.scale;
    if (g.mdt >= 0) {
        i64 at = b * g.ms[0] + h * g.ms[1] + i * g.ms[2] + j * g.ms[3];
        if (g.mdt == DT_BOOL) return ((const unsigned char *)m)[at] ? s : -inf_f();
        s += ld(m, g.mdt, at);
    }
    return s;
}

/* Block r = (b, h, i): lse, D and dq of one query row. */
extern "C" __global__ void __launch_bounds__(NT)
    sg_attn_bwd_rows(const void *q, const void *k, const void *v, const void *m, const void *len,
                     const void *o, const void *dout, void *out, bgeom g, const float *lse) {
    pdl_begin();
    __shared__ float qf[256], df[256], sds[NT], red[NW];
    const int tid = threadIdx.x, D = (int)g.D;
    const i64 r = blockIdx.x, i = r % g.Lq, h = (r / g.Lq) % g.Hq, b = r / (g.Lq * g.Hq);
    const i64 hk = h / (g.Hq / g.Hkv), rows = g.B * g.Hq * g.Lq;
    const i64 n = visible(g, valid_len(len, g, b), i);
    float dpart = 0.0f;
    for (int e = tid; e < D; e += NT) {
        qf[e] = ld(q, g.dt, b * g.qs[0] + h * g.qs[1] + i * g.qs[2] + e * g.qs[3]);
        df[e] = ld(dout, g.dt, b * g.gs[0] + h * g.gs[1] + i * g.gs[2] + e * g.gs[3]);
        dpart += df[e] * ld(o, g.dt, b * g.os[0] + h * g.os[1] + i * g.os[2] + e * g.os[3]);
    }
    __syncthreads();
    const float Di = block_reduce(dpart, false, red);
    float rl = lse ? lse[r] : __uint_as_float(0x7fc00000u), sum = rl < inf_f() ? 1.0f : 0.0f;
    if (rl != rl) { /* not kept by the forward: recompute */
        float mx = -inf_f();
        for (i64 j = tid; j < n; j += NT) mx = fmaxf(mx, score(k, m, g, qf, b, h, hk, i, j));
        mx = block_reduce(mx, true, red);
        sum = 0.0f;
        for (i64 j = tid; mx > -inf_f() && j < n; j += NT)
            sum += expf(score(k, m, g, qf, b, h, hk, i, j) - mx);
        sum = block_reduce(sum, false, red);
        rl = sum > 0.0f ? mx + logf(sum) : inf_f();
    }
    const float lse_r = rl;
    float acc[2] = {0.0f, 0.0f}; /* dq at e = tid and tid + NT */
    const i64 vb = b * g.vs[0] + hk * g.vs[1], kb = b * g.ks[0] + hk * g.ks[1];
    for (i64 j0 = 0; sum > 0.0f && j0 < n; j0 += NT) {
        i64 j = j0 + tid;
        float ds = 0.0f;
        if (j < n) {
            float p = expf(score(k, m, g, qf, b, h, hk, i, j) - lse_r), dp = 0.0f;
            for (int e = 0; p > 0.0f && e < D; e++)
                dp += df[e] * ld(v, g.dt, vb + j * g.vs[2] + e * g.vs[3]);
            ds = p * (dp - Di);
        }
        sds[tid] = ds;
        __syncthreads();
        int nt = n - j0 < NT ? (int)(n - j0) : NT;
        for (int c = 0; c < 2; c++) {
            int e = tid + c * NT;
            if (e >= D) break;
            for (int t = 0; t < nt; t++)
                acc[c] += sds[t] * ld(k, g.dt, kb + (j0 + t) * g.ks[2] + e * g.ks[3]);
        }
        __syncthreads();
    }
    const i64 qa = part_at(g, 0, b, h, i);
    for (int c = 0; c < 2; c++)
        if (tid + c * NT < D) st(out, g.dt, qa + tid + c * NT, acc[c] * g.scale);
    if (tid == 0) {
        float *ws = workspace(out, g);
        ws[r] = lse_r, ws[rows + r] = Di;
    }
}

/* Block x = (b, hk, j): dk and dv of one key over its group's query rows. */
extern "C" __global__ void __launch_bounds__(NT)
    sg_attn_bwd_keys(const void *q, const void *k, const void *v, const void *m, const void *len,
                     const void *dout, void *out, bgeom g) {
    pdl_begin();
    __shared__ float kf[256], vf[256], sp[NT], sds[NT];
    const int tid = threadIdx.x, D = (int)g.D;
    const i64 x = blockIdx.x, j = x % g.S, hk = (x / g.S) % g.Hkv, b = x / (g.S * g.Hkv);
    const i64 G = g.Hq / g.Hkv, rows = g.B * g.Hq * g.Lq, L = valid_len(len, g, b);
    const float *ws = workspace(out, g);
    for (int e = tid; e < D; e += NT) {
        kf[e] = ld(k, g.dt, b * g.ks[0] + hk * g.ks[1] + j * g.ks[2] + e * g.ks[3]);
        vf[e] = ld(v, g.dt, b * g.vs[0] + hk * g.vs[1] + j * g.vs[2] + e * g.vs[3]);
    }
    __syncthreads();
    float dk[2] = {0.0f, 0.0f}, dv[2] = {0.0f, 0.0f};
    const i64 i1 = first_query(g, L, j); /* every query from i1 on sees j */
    for (i64 h = hk * G; h < (hk + 1) * G; h++)
        for (i64 i0 = i1; i0 < g.Lq; i0 += NT) {
            i64 i = i0 + tid, r = (b * g.Hq + h) * g.Lq + i;
            float p = 0.0f, ds = 0.0f;
            if (i < g.Lq && ws[r] != inf_f()) {
                const i64 qb = b * g.qs[0] + h * g.qs[1] + i * g.qs[2];
                const i64 db = b * g.gs[0] + h * g.gs[1] + i * g.gs[2];
                float s = 0.0f, dp = 0.0f;
                for (int e = 0; e < D; e++) s += ld(q, g.dt, qb + e * g.qs[3]) * kf[e];
                s *= g.scale;
                if (g.mdt >= 0) {
                    i64 at = b * g.ms[0] + h * g.ms[1] + i * g.ms[2] + j * g.ms[3];
                    if (g.mdt == DT_BOOL)
                        s = ((const unsigned char *)m)[at] ? s : -inf_f();
                    else
                        s += ld(m, g.mdt, at);
                }
                p = expf(s - ws[r]);
                for (int e = 0; p > 0.0f && e < D; e++)
                    dp += ld(dout, g.dt, db + e * g.gs[3]) * vf[e];
                ds = p * (dp - ws[rows + r]);
            }
            sp[tid] = p, sds[tid] = ds;
            __syncthreads();
            int nt = g.Lq - i0 < NT ? (int)(g.Lq - i0) : NT;
            for (int c = 0; c < 2; c++) {
                int e = tid + c * NT;
                if (e >= D) break;
                for (int t = 0; t < nt; t++) {
                    i64 it = i0 + t;
                    if (sp[t] == 0.0f) continue;
                    dv[c] += sp[t] *
                             ld(dout, g.dt, b * g.gs[0] + h * g.gs[1] + it * g.gs[2] + e * g.gs[3]);
                    dk[c] += sds[t] *
                             ld(q, g.dt, b * g.qs[0] + h * g.qs[1] + it * g.qs[2] + e * g.qs[3]);
                }
            }
            __syncthreads();
        }
    const i64 ka = part_at(g, 1, b, hk, j), va = part_at(g, 2, b, hk, j);
    for (int c = 0; c < 2; c++) {
        int e = tid + c * NT;
        if (e >= D) break;
        st(out, g.dt, ka + e, dk[c] * g.scale);
        st(out, g.dt, va + e, dv[c]);
    }
}

/* ------------------------------------------------------------ tensor cores */
#if SG_PTX /* the rest of the file */

#define LOG2E 1.4426950408889634f

/* e^x likewise. */
__device__ __forceinline__ float fexp(float x) { return ex2(x * LOG2E); }

__device__ __forceinline__ float f16v(u16 h, int dt) {
    return dt == DT_F16 ? h2f_cvt(h) : __uint_as_float((u32)h << 16);
}

/* 4 bytes likewise (through L1). */
__device__ __forceinline__ void cp4(float *dst, const float *src, bool in) {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(smem_addr(dst)), "l"(src),
                 "r"(in ? 4 : 0));
#endif
}

/* The B fragments of n tiles (n, n + 1) x k slice kk of S = A X^T, X a
 * row-major (n, k) tile of pitch P at shared address x: r[0..1] for n,
 * r[2..3] for n + 1. The lane's part of the address is kept apart from the
 * constant part, which the compiler folds into the instruction. */
__device__ __forceinline__ void frag_bt(u32 *r, u32 x, int n, int kk, int P, int lane) {
    const u32 l = 2 * (((lane & 7) + ((lane >> 4) << 3)) * P + ((lane >> 3) & 1) * 8);
    ldsm4(r, (x + l) + 2 * (n * 8 * P + kk * 16));
}

/* The B fragments of k slice kk x n tiles (d, d + 1) of A X, X a row-major
 * (k, n) tile of pitch P at shared address x. */
__device__ __forceinline__ void frag_b(u32 *r, u32 x, int kk, int d, int P, int lane) {
    const u32 l = 2 * (((lane & 7) + ((lane >> 3) & 1) * 8) * P + (lane >> 4) * 8);
    ldsm4t(r, (x + l) + 2 * (kk * 16 * P + d * 8));
}

/* The A fragments of a warp's 16 rows (from w16) of a row-major tile at
 * shared address x. */
template <int NS>
__device__ __forceinline__ void frag_a(u32 (*a)[4], u32 x, int w16, int P, int lane) {
    const u32 l = 2 * ((w16 + (lane & 15)) * P + (lane >> 4) * 8);
#pragma unroll
    for (int s = 0; s < NS; s++) ldsm4(a[s], (x + l) + 2 * s * 16);
}

/* Rows r0 .. r0 + ROWS - 1 (0 at or past end) of a strided (rows, D)
 * 16-bit operand into a row-major tile of pitch D + 8. With vec (rows of
 * 16-byte vectors, aligned: the host checked) through cp.async, which the
 * caller commits and waits for; otherwise element by element, at once. */
template <int D, int ROWS>
__device__ __forceinline__ void fetch(u16 *dst, const void *p, i64 base, i64 rs, i64 es, i64 r0,
                                      i64 end, bool vec) {
    constexpr int P = D + 8, CH = D / 8;
    static_assert(ROWS * CH % NT == 0, "a tile is a whole number of vectors per thread");
    const u16 *src = (const u16 *)p + base;
    if (vec) { /* thread x copies vector x % CH of rows x / CH + c * NT / CH */
        constexpr int RP = NT / CH;
        static_assert(NT % CH == 0, "a pass is whole rows");
        const int r = threadIdx.x / CH, e = (threadIdx.x % CH) * 8;
        const u32 d = smem_addr(dst) + 2 * (r * P + e);
        const u16 *s = src + (r0 + r) * rs + e;
        const i64 step = RP * rs;
#pragma unroll
        for (int c = 0; c < ROWS / RP; c++) {
            const bool in = r0 + r + c * RP < end;
            cp16(d + 2 * c * RP * P, in ? s + c * step : src, in);
        }
        return;
    }
    for (int x = threadIdx.x; x < ROWS * D; x += NT) {
        const int r = x / D, e = x % D;
        dst[r * P + e] = ld16(src, (r0 + r) * rs + e * es, r0 + r < end);
    }
}

/* C tiles (n, n+1) of P-like values as the A fragment of one 16-column slice. */
__device__ __forceinline__ void to_a(u32 *a, const float *c0, const float *c1, int dt) {
    a[0] = pack2h(c0[0], c0[1], dt);
    a[1] = pack2h(c0[2], c0[3], dt);
    a[2] = pack2h(c1[0], c1[1], dt);
    a[3] = pack2h(c1[2], c1[3], dt);
}

/* The two 16-bit values of w (lo in the low half) as floats. */
__device__ __forceinline__ float lo16(u32 w, int dt) {
    return dt == DT_F16 ? h2f_cvt((u16)(w & 0xffffu)) : __uint_as_float(w << 16);
}
__device__ __forceinline__ float hi16(u32 w, int dt) {
    return dt == DT_F16 ? h2f_cvt((u16)(w >> 16)) : __uint_as_float(w & 0xffff0000u);
}

/* (lo, hi) into the 16-bit pair at element at (even) of out. */
__device__ __forceinline__ void st2(void *out, i64 at, float lo, float hi, int dt) {
    ((u32 *)out)[at >> 1] = pack2h(lo, hi, dt);
}

#define LN2 0.6931471805599453f

/* Block (head b * Hq + h, query tile): lse, D and dq of 64 query rows; DT
 * (DT_BF16 or DT_F16) is a constant, so no mma sits behind a branch. Blocks
 * go out heads first, the last query tiles (causal: the most keys) first of
 * all, so the longest blocks do not start last. */
template <int D, int DT>
__device__ __forceinline__ void bwd_dq(const void *q, const void *k, const void *v, const void *len,
                                       const void *o, const void *dout, void *out, const bgeom &g,
                                       const float *lse) {
    constexpr int MQ = 64, MK = D == 128 ? 32 : 64, P = D + 8, NK = D / 16, T = MK * P;
    /* K and V tiles, two of each (tile t in buffer t & 1); first Q and dO. */
    __shared__ __align__(16) u16 sm[4 * T];
    __shared__ float sD[MQ];
    static_assert(2 * MQ * P <= 4 * T, "Q and dO fit the tile buffers");
    const int tid = threadIdx.x, warp = tid / 32, lane = tid & 31, gr = lane >> 2, tq = lane & 3;
    constexpr int dt = DT;
    const u32 sb = smem_addr(sm); /* tile x at sb + 2 * x * T */
    const i64 b = blockIdx.x / g.Hq, h = blockIdx.x % g.Hq, hk = h / (g.Hq / g.Hkv);
    const i64 q0 = (i64)(gridDim.y - 1 - blockIdx.y) * MQ, L = valid_len(len, g, b);
    const i64 rows = g.B * g.Hq * g.Lq;
    const i64 kb = b * g.ks[0] + hk * g.ks[1], vb = b * g.vs[0] + hk * g.vs[1];
    const bool vk = g.flags & VK, vv = g.flags & VV;
    const int r0 = warp * 16 + gr;
    u32 qa[NK][4], da[NK][4];
    const i64 last = q0 + MQ - 1 < g.Lq - 1 ? q0 + MQ - 1 : g.Lq - 1;
    const i64 nmax = visible(g, L, last);
    const int nt = (int)((nmax + MK - 1) / MK);
    /* The forward's logsumexps of this thread's rows (NaN where it kept
     * none): with every row's, pass 1 is skipped. */
    float fa = 0.0f, fb = 0.0f;
    if (lse) {
        const i64 i = q0 + r0, r = (b * g.Hq + h) * g.Lq + i;
        if (i < g.Lq) fa = lse[r];
        if (i + 8 < g.Lq) fb = lse[r + 8];
    }
    const bool have = lse && !__syncthreads_or(fa != fa || fb != fb);
    fetch<D, MQ>(sm, q, b * g.qs[0] + h * g.qs[1], g.qs[2], g.qs[3], q0, g.Lq, g.flags & VQ);
    fetch<D, MQ>(sm + MQ * P, dout, b * g.gs[0] + h * g.gs[1], g.gs[2], g.gs[3], q0, g.Lq,
                 g.flags & VG);
    cp_commit();
    /* With Q and dO in buffers 0-1 (D = 64), pass 1 streams K through
     * buffers 2-3, and K(0) loads beside Q and dO. */
    constexpr int E = 2 * MQ * P <= 2 * T, KB = E ? 2 : 0;
    if (E) {
        if (nt > 0 && !have) fetch<D, MK>(sm + KB * T, k, kb, g.ks[2], g.ks[3], 0, nmax, vk);
        cp_commit();
    }
    /* D = rowsum(dO * O): CH lanes a row, 16-byte loads of O, issued before
     * the wait for dO. */
    constexpr int CH = D / 8, OV = MQ * CH / NT;
    const i64 ob = b * g.os[0] + h * g.os[1];
    const bool vo = g.flags & VO;
    uint4 ov[OV];
#pragma unroll
    for (int c = 0; c < OV; c++) {
        const int x = tid + c * NT, r = x / CH, e = (x % CH) * 8;
        ov[c] = vo && q0 + r < g.Lq ? *(const uint4 *)((const u16 *)o + ob + (q0 + r) * g.os[2] + e)
                                    : make_uint4(0, 0, 0, 0);
    }
    cp_wait<E ? 1 : 0>();
    __syncthreads();
    frag_a<NK>(qa, sb, warp * 16, P, lane);
    frag_a<NK>(da, sb + 2 * MQ * P, warp * 16, P, lane);
    if (vo) {
#pragma unroll
        for (int c = 0; c < OV; c++) {
            const int x = tid + c * NT, r = x / CH, e = (x % CH) * 8;
            const uint4 dv = *(const uint4 *)(sm + MQ * P + r * P + e);
            const u32 ow[4] = {ov[c].x, ov[c].y, ov[c].z, ov[c].w},
                      dw[4] = {dv.x, dv.y, dv.z, dv.w};
            float s = 0.0f;
#pragma unroll
            for (int w = 0; w < 4; w++)
                s += lo16(ow[w], dt) * lo16(dw[w], dt) + hi16(ow[w], dt) * hi16(dw[w], dt);
#pragma unroll
            for (int off = 1; off < CH; off <<= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
            if (x % CH == 0) sD[r] = s;
        }
    } else if (tid < MQ) {
        float s = 0.0f;
        const i64 i = q0 + tid;
        for (int e = 0; i < g.Lq && e < D; e++)
            s += f16v(sm[MQ * P + tid * P + e], dt) * ld(o, dt, ob + i * g.os[2] + e * g.os[3]);
        sD[tid] = s;
    }
    __syncthreads();
    const float Da = sD[r0], Db = sD[r0 + 8];
    const i64 ia = q0 + r0, ib = ia + 8;
    const int na = ia < g.Lq ? (int)visible(g, L, ia) : 0,
              nb = ib < g.Lq ? (int)visible(g, L, ib) : 0;
    /* Keys every row of the block sees: tiles below it need no mask. */
    const int nall = (int)visible(g, L, q0);
    /* Scores in log2 units: s scale log2(e), one FMUL (or FFMA) before each ex2. */
    const float sl2 = g.scale * LOG2E;
    /* Pass 1: each row's max and sum of 2^x over its visible keys; K(t+1)
     * is in flight while tile t is scored. */
    float ma = -inf_f(), mb = -inf_f(), la = 0.0f, lb = 0.0f;
    auto stats = [&](int t, bool masked) {
        const int j0 = t * MK;
        const u32 ks = sb + 2 * (KB + (t & 1)) * T;
        float s[MK / 8][4];
#pragma unroll
        for (int n = 0; n < MK / 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < NK; kk++)
#pragma unroll
            for (int n = 0; n < MK / 8; n += 2) {
                u32 r[4];
                frag_bt(r, ks, n, kk, P, lane);
                mma(s[n], qa[kk], r[0], r[1], dt);
                mma(s[n + 1], qa[kk], r[2], r[3], dt);
            }
        float tma = -inf_f(), tmb = -inf_f();
#pragma unroll
        for (int n = 0; n < MK / 8; n++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                float x = s[n][c] * sl2;
                if (masked && j0 + n * 8 + 2 * tq + (c & 1) >= (c >= 2 ? nb : na)) x = -inf_f();
                s[n][c] = x;
                if (c >= 2)
                    tmb = fmaxf(tmb, x);
                else
                    tma = fmaxf(tma, x);
            }
        for (int off = 1; off < 4; off <<= 1) {
            tma = fmaxf(tma, __shfl_xor_sync(0xffffffffu, tma, off));
            tmb = fmaxf(tmb, __shfl_xor_sync(0xffffffffu, tmb, off));
        }
        const float mna = fmaxf(ma, tma), mnb = fmaxf(mb, tmb);
        la *= mna == -inf_f() ? 1.0f : ex2(ma - mna);
        lb *= mnb == -inf_f() ? 1.0f : ex2(mb - mnb);
#pragma unroll
        for (int n = 0; n < MK / 8; n++) {
            if (mna != -inf_f()) la += ex2(s[n][0] - mna) + ex2(s[n][1] - mna);
            if (mnb != -inf_f()) lb += ex2(s[n][2] - mnb) + ex2(s[n][3] - mnb);
        }
        ma = mna, mb = mnb;
    };
    if (!E) {
        if (nt > 0 && !have) fetch<D, MK>(sm, k, kb, g.ks[2], g.ks[3], 0, nmax, vk);
        cp_commit();
    }
    for (int t = 0; t < (have ? 0 : nt); t++) {
        if (t + 1 < nt)
            fetch<D, MK>(sm + (KB + ((t + 1) & 1)) * T, k, kb, g.ks[2], g.ks[3], (i64)(t + 1) * MK,
                         nmax, vk);
        cp_commit();
        cp_wait<1>();
        __syncthreads();
        if ((t + 1) * MK <= nall)
            stats(t, false);
        else
            stats(t, true);
        __syncthreads();
    }
    /* K(0) and V(0) of pass 2 load during the reductions. */
    if (nt > 0) {
        fetch<D, MK>(sm, k, kb, g.ks[2], g.ks[3], 0, nmax, vk);
        fetch<D, MK>(sm + 2 * T, v, vb, g.vs[2], g.vs[3], 0, nmax, vv);
    }
    cp_commit();
    for (int off = 1; off < 4; off <<= 1) {
        la += __shfl_xor_sync(0xffffffffu, la, off);
        lb += __shfl_xor_sync(0xffffffffu, lb, off);
    }
    /* lse in log2 units (+inf for a row that sees nothing: its P is 0). */
    const float l2a = have        ? fa * LOG2E
                      : la > 0.0f ? ma + log2f(la)
                                  : inf_f(),
                l2b = have        ? fb * LOG2E
                      : lb > 0.0f ? mb + log2f(lb)
                                  : inf_f();
    if (tq == 0) {
        float *ws = workspace(out, g);
        const i64 ra = (b * g.Hq + h) * g.Lq + ia;
        if (ia < g.Lq) ws[ra] = have ? fa : l2a * LN2, ws[rows + ra] = Da;
        if (ib < g.Lq) ws[ra + 8] = have ? fb : l2b * LN2, ws[rows + ra + 8] = Db;
    }
    /* Pass 2: dq += dS K, dS = P (dP - D), P = 2^(s scale log2(e) - lse
     * log2(e)), dP = dO V^T; K(t+1) and V(t+1) are in flight while tile t
     * computes. */
    float acc[D / 8][4];
#pragma unroll
    for (int d = 0; d < D / 8; d++) acc[d][0] = acc[d][1] = acc[d][2] = acc[d][3] = 0.0f;
    auto grads = [&](int t, bool masked) {
        const int j0 = t * MK;
        const u32 ks = sb + 2 * (t & 1) * T, vs = sb + 2 * (2 + (t & 1)) * T;
#pragma unroll
        for (int n2 = 0; n2 < MK / 16; n2++) {
            float s[2][4], dp[2][4];
#pragma unroll
            for (int u = 0; u < 2; u++)
#pragma unroll
                for (int c = 0; c < 4; c++) s[u][c] = dp[u][c] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < NK; kk++) {
                u32 rk[4], rv[4];
                frag_bt(rk, ks, n2 * 2, kk, P, lane);
                frag_bt(rv, vs, n2 * 2, kk, P, lane);
                mma(s[0], qa[kk], rk[0], rk[1], dt);
                mma(s[1], qa[kk], rk[2], rk[3], dt);
                mma(dp[0], da[kk], rv[0], rv[1], dt);
                mma(dp[1], da[kk], rv[2], rv[3], dt);
            }
#pragma unroll
            for (int u = 0; u < 2; u++) {
                const int n = n2 * 2 + u;
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    const bool rb = c >= 2;
                    float p = ex2(__fmaf_rn(s[u][c], sl2, -(rb ? l2b : l2a)));
                    if (masked && j0 + n * 8 + 2 * tq + (c & 1) >= (rb ? nb : na)) p = 0.0f;
                    s[u][c] = p * (dp[u][c] - (rb ? Db : Da));
                }
            }
            u32 dsa[4]; /* dS of these 16 keys, as an A fragment: dq += dS K */
            to_a(dsa, s[0], s[1], dt);
#pragma unroll
            for (int d = 0; d < D / 8; d += 2) {
                u32 r[4];
                frag_b(r, ks, n2, d, P, lane);
                mma(acc[d], dsa, r[0], r[1], dt);
                mma(acc[d + 1], dsa, r[2], r[3], dt);
            }
        }
    };
    for (int t = 0; t < nt; t++) {
        if (t + 1 < nt) {
            const int nb2 = (t + 1) & 1;
            const i64 j1 = (i64)(t + 1) * MK;
            fetch<D, MK>(sm + nb2 * T, k, kb, g.ks[2], g.ks[3], j1, nmax, vk);
            fetch<D, MK>(sm + (2 + nb2) * T, v, vb, g.vs[2], g.vs[3], j1, nmax, vv);
        }
        cp_commit();
        cp_wait<1>();
        __syncthreads();
        if ((t + 1) * MK <= nall)
            grads(t, false);
        else
            grads(t, true);
        __syncthreads();
    }
    const i64 oa = part_at(g, 0, b, h, ia), oe = oa + 8 * g.part[0][3];
#pragma unroll
    for (int d = 0; d < D / 8; d++) {
        const int e = d * 8 + 2 * tq;
        if (ia < g.Lq) st2(out, oa + e, acc[d][0] * g.scale, acc[d][1] * g.scale, dt);
        if (ib < g.Lq) st2(out, oe + e, acc[d][2] * g.scale, acc[d][3] * g.scale, dt);
    }
}

/* Block (head b * Hkv + hk, key tile): dk and dv of 64 keys over the group's
 * queries. Blocks go out heads first, the first key tiles (causal: the most
 * queries) first of all. */
template <int D, int DT>
__device__ __forceinline__ void bwd_dkv(const void *q, const void *k, const void *v,
                                        const void *len, const void *dout, void *out,
                                        const bgeom &g) {
    constexpr int MKB = 64, MQ = D == 128 ? 32 : 64, P = D + 8, NK = D / 16, T = MQ * P;
    /* Q and dO tiles, two of each (tile t at t & 1: Q, then dO); first K and V. */
    __shared__ __align__(16) u16 sm[4 * T];
    __shared__ __align__(8) float slse[2][MQ], sD[2][MQ]; /* lse and D of each tile's queries */
    static_assert(2 * MKB * P <= 4 * T, "K and V fit the tile buffers");
    const int tid = threadIdx.x, warp = tid / 32, lane = tid & 31, gr = lane >> 2, tq = lane & 3;
    constexpr int dt = DT;
    const u32 sb = smem_addr(sm); /* tile x at sb + 2 * x * T */
    const i64 b = blockIdx.x / g.Hkv, hk = blockIdx.x % g.Hkv, G = g.Hq / g.Hkv;
    const i64 j0 = (i64)blockIdx.y * MKB, L = valid_len(len, g, b), rows = g.B * g.Hq * g.Lq;
    const bool vq = g.flags & VQ, vg = g.flags & VG;
    const float sl2 = g.scale * LOG2E;
    const int r0 = warp * 16 + gr;
    const i64 ja = j0 + r0, jb = ja + 8; /* this thread's two keys */
    /* The first query that sees each (Lq: none): query i sees key ja when i >= fa. */
    const int fa = (int)first_query(g, L, ja), fb = (int)first_query(g, L, jb);
    /* Query tiles from fall on, within Lq, are seen by every key of the block. */
    const int fall = (int)first_query(g, L, j0 + MKB - 1);
    u32 ka[NK][4], va[NK][4];
    fetch<D, MKB>(sm, k, b * g.ks[0] + hk * g.ks[1], g.ks[2], g.ks[3], j0, L, g.flags & VK);
    fetch<D, MKB>(sm + MKB * P, v, b * g.vs[0] + hk * g.vs[1], g.vs[2], g.vs[3], j0, L,
                  g.flags & VV);
    cp_commit();
    float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
    for (int d = 0; d < D / 8; d++)
#pragma unroll
        for (int c = 0; c < 4; c++) dk[d][c] = dv[d][c] = 0.0f;
    const float *ws = workspace(out, g);
    /* One query tile from i0 (buffer u): S^T, P^T, dV, dP^T, dS^T, dK. */
    auto tile = [&](int i0, int u, bool masked) {
        const u32 qs = sb + 2 * (2 * u) * T, dos = sb + 2 * (2 * u + 1) * T;
        const float *tl = slse[u], *tD = sD[u];
        /* Query i0 + 2 tq + x is visible to key ja when xa <= x < xe (jb: xb). */
        const int xa = fa - i0 - 2 * tq, xb = fb - i0 - 2 * tq, xe = (int)g.Lq - i0 - 2 * tq;
#pragma unroll
        for (int n2 = 0; n2 < MQ / 16; n2++) {
            float s[2][4], dp[2][4];
#pragma unroll
            for (int w = 0; w < 2; w++)
#pragma unroll
                for (int c = 0; c < 4; c++) s[w][c] = dp[w][c] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < NK; kk++) {
                u32 rq[4], rd[4];
                frag_bt(rq, qs, n2 * 2, kk, P, lane);
                frag_bt(rd, dos, n2 * 2, kk, P, lane);
                mma(s[0], ka[kk], rq[0], rq[1], dt);
                mma(s[1], ka[kk], rq[2], rq[3], dt);
                mma(dp[0], va[kk], rd[0], rd[1], dt);
                mma(dp[1], va[kk], rd[2], rd[3], dt);
            }
#pragma unroll
            for (int w = 0; w < 2; w++) {
                const int n = n2 * 2 + w;
                /* The lse (log2 units) and D of queries n * 8 + 2 tq, + 1. */
                const float2 lq = *(const float2 *)(tl + n * 8 + 2 * tq);
                const float2 Dq = *(const float2 *)(tD + n * 8 + 2 * tq);
                const float l2[2] = {lq.x * LOG2E, lq.y * LOG2E}, dd[2] = {Dq.x, Dq.y};
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    const int x = n * 8 + (c & 1);
                    float p = ex2(__fmaf_rn(s[w][c], sl2, -l2[c & 1]));
                    if (masked && !(x < xe && x >= (c >= 2 ? xb : xa))) p = 0.0f;
                    s[w][c] = p;
                    dp[w][c] = p * (dp[w][c] - dd[c & 1]);
                }
            }
            u32 pa[4], dsa[4]; /* P^T, dS^T of these 16 queries as A fragments */
            to_a(pa, s[0], s[1], dt);
            to_a(dsa, dp[0], dp[1], dt);
#pragma unroll
            for (int d = 0; d < D / 8; d += 2) {
                u32 rd[4], rq[4];
                frag_b(rd, dos, n2, d, P, lane);
                frag_b(rq, qs, n2, d, P, lane);
                mma(dv[d], pa, rd[0], rd[1], dt);
                mma(dv[d + 1], pa, rd[2], rd[3], dt);
                mma(dk[d], dsa, rq[0], rq[1], dt);
                mma(dk[d + 1], dsa, rq[2], rq[3], dt);
            }
        }
    };
    /* Tiles (h, i0) in head order, each head's from the first query that
     * sees the block; tile t + 1 is in flight while tile t computes, in
     * buffer (t + E) & 1. With K and V in buffer 0 (D = 64), tile 0 loads
     * beside them into buffer 1. */
    constexpr int E = 2 * MKB * P <= 2 * T;
    const int i1 = (int)first_query(g, L, j0), nth = ((int)g.Lq - i1 + MQ - 1) / MQ;
    const int nt = (int)G * nth;
    /* The next tile to fetch: queries from in of the head whose q, dO and
     * workspace rows start at qo, go and wr. */
    i64 qo = b * g.qs[0] + hk * G * g.qs[1], go = b * g.gs[0] + hk * G * g.gs[1];
    i64 wr = (b * g.Hq + hk * G) * g.Lq;
    int in = i1, pend = i1; /* pend: the first query of the tile fetched last */
    auto prefetch = [&](int t) {
        if (t < nt) {
            const int u = (t + E) & 1;
            fetch<D, MQ>(sm + 2 * u * T, q, qo, g.qs[2], g.qs[3], in, g.Lq, vq);
            fetch<D, MQ>(sm + (2 * u + 1) * T, dout, go, g.gs[2], g.gs[3], in, g.Lq, vg);
            if (tid < MQ) { /* rows past Lq: 0, masked below */
                const int i = in + tid;
                const i64 r = wr + (i < (int)g.Lq ? i : 0);
                cp4(&slse[u][tid], ws + r, i < (int)g.Lq);
                cp4(&sD[u][tid], ws + rows + r, i < (int)g.Lq);
            }
            pend = in;
            in += MQ;
            if (in >= (int)g.Lq) in = i1, qo += g.qs[1], go += g.gs[1], wr += g.Lq;
        }
        cp_commit();
    };
    if (E) prefetch(0);
    cp_wait<E ? 1 : 0>(); /* K and V */
    __syncthreads();
    frag_a<NK>(ka, sb, warp * 16, P, lane);
    frag_a<NK>(va, sb + 2 * MKB * P, warp * 16, P, lane);
    __syncthreads();
    if (!E) prefetch(0);
    for (int t = 0; t < nt; t++) {
        const int i0 = pend; /* tile t's first query */
        prefetch(t + 1);
        cp_wait<1>();
        __syncthreads();
        if (i0 >= fall && i0 + MQ <= (int)g.Lq)
            tile(i0, (t + E) & 1, false);
        else
            tile(i0, (t + E) & 1, true);
        __syncthreads();
    }
    const i64 dka = part_at(g, 1, b, hk, ja), dva = part_at(g, 2, b, hk, ja);
    const i64 kb8 = 8 * g.part[1][3], vb8 = 8 * g.part[2][3]; /* row jb = ja + 8 */
#pragma unroll
    for (int d = 0; d < D / 8; d++) {
        const int e = d * 8 + 2 * tq;
        if (ja < g.S) {
            st2(out, dka + e, dk[d][0] * g.scale, dk[d][1] * g.scale, dt);
            st2(out, dva + e, dv[d][0], dv[d][1], dt);
        }
        if (jb < g.S) {
            st2(out, dka + kb8 + e, dk[d][2] * g.scale, dk[d][3] * g.scale, dt);
            st2(out, dva + vb8 + e, dv[d][2], dv[d][3], dt);
        }
    }
}

/* At D = 64, four dq blocks per SM (at most 128 registers a thread; a few
 * bytes spill outside the tile loops) and three dkv blocks (168: at 128 dkv
 * spills inside them). One kernel per dtype: sg_attn_bwd_dq64_bf16,
 * sg_attn_bwd_dq64_f16, ... */
#define DQ(D, MINB, T, DT)                                                                         \
    extern "C" __global__ void __launch_bounds__(NT, MINB) sg_attn_bwd_dq##D##_##T(                \
        const void *q, const void *k, const void *v, const void *len, const void *o,               \
        const void *dout, void *out, bgeom g, const float *lse) {                                  \
        pdl_begin();                                                                               \
        bwd_dq<D, DT>(q, k, v, len, o, dout, out, g, lse);                                         \
    }
#define DKV(D, MINB, T, DT)                                                                        \
    extern "C" __global__ void __launch_bounds__(NT, MINB)                                         \
        sg_attn_bwd_dkv##D##_##T(const void *q, const void *k, const void *v, const void *len,     \
                                 const void *dout, void *out, bgeom g) {                           \
        pdl_begin();                                                                               \
        bwd_dkv<D, DT>(q, k, v, len, dout, out, g);                                                \
    }
DQ(64, 4, bf16, DT_BF16)
DQ(64, 4, f16, DT_F16)
DQ(128, 1, bf16, DT_BF16)
DQ(128, 1, f16, DT_F16)
DKV(64, 3, bf16, DT_BF16)
DKV(64, 3, f16, DT_F16)
DKV(128, 1, bf16, DT_BF16)
DKV(128, 1, f16, DT_F16)

#endif /* SG_PTX */
