/* SPDX-License-Identifier: MIT */
/*
 * k_attn.cu -- the CUDA kernels of ATTENTION (host side in cuda_attn.c):
 * one split kernel that serves decode (flash-decoding) and prefill (flash
 * attention with FFMA tiles), the combine of the splits, a lean decode
 * kernel, and prefill on tensor cores (FlashAttention-2's forward for D 64
 * and 128, sg_attn_mma for the other multiples of 16).
 *
 * sg_attn_split: block (b * Hkv + hk, split, z) takes R rows of the
 * (Hq / Hkv) * Lq queries that share K/V head hk of batch b (rows z*R ...),
 * and the keys [split * chunk, (split + 1) * chunk) of the ones those rows
 * see. Its Q rows (times scale) sit in shared memory as f32; each tile of
 * KT keys of K and V is loaded once (16-byte loads when the host says rows
 * are aligned and contiguous), then the block computes the R x KT scores,
 * a warp per row updates the row's running max and sum (online softmax),
 * and each thread rescales and accumulates its share of the R x D outputs,
 * held in registers. A grouped-query head's K/V is thus read once for all
 * of the queries that share it, and no score reaches memory.
 *
 * With one split the block writes the normalized result; with several it
 * writes its unnormalized accumulator and (max, sum) per row to scratch
 * and sg_attn_combine merges the splits of each row in split order.
 *
 * sg_attn_decode: the lean kernel of decode (a few query rows, 16-byte K/V
 * rows of at most 32 vectors; sg_attn_decode_m with a mask, which first
 * cuts the row's keys to the first through the last it lets through, so
 * that a mask of the slots <= pos reads no more of the cache than kv_len
 * would). Block (row, split) takes one query row; T = D / W lanes share a
 * key (W elements of 16 bytes each), so a warp reads 32 / T keys per load
 * and DU (2) such loads of K and of V per lane before it uses the first,
 * keeps an online softmax per lane group in registers, and the groups and
 * warps merge at the end through a few shuffles and 4 KiB of shared
 * memory. Its split count is chosen on the device from the valid length
 * (dchunk): at most nsplit blocks, each of at least CMIN keys; blocks past
 * the valid keys return at once, and a row whose keys fit one split is
 * written by that block, normalized, with no scratch (sg_attn_combine then
 * returns at once for it). sg_attn_decode8 is the same kernel with the DCL
 * = 8 splits of a row as one block cluster (sm_90): block 0 merges the
 * splits' states out of the others' shared memory and writes the row, so
 * no combine kernel follows. Like every kernel here, they wait for the
 * previous kernel (griddepcontrol.wait) before reading, so the host launches
 * them as programmatic dependents (pdl_begin).
 *
 * The result is stored (B, Lq, Hq, D) (capture.h, SG__ATTN_CAUSAL): row
 * (b, h, i) at ((b * Lq + i) * Hq + h) * D (out_row), so that the usual
 * consumer, the heads put back side by side, reads it as it is.
 *
 * Visibility (capture.h, SG__ATTN_CAUSAL): key j of batch b is seen by
 * query i when j < L (kv_len[b] read here, clamped to [0, S]) and, causal,
 * j <= L - Lq + i. A row that sees no key, or whose every score is -inf,
 * gives NaN. Every index is guarded; keys at or past L are never read.
 *
 * NVRTC compiles this file with no include path, so it includes nothing;
 * the build puts k_prelude.cuh (types, dtypes, pdl_begin) in front of it
 * (hiprtc too: see k_prelude.cuh's SG_PTX).
 */

#define NT 128    /* threads per block */
#define MAXR 16   /* rows per block, at most */
#define MAXACC 16 /* accumulators per thread: R * D <= NT * MAXACC */
#define CMIN 32   /* keys per split of sg_attn_decode, at least */
#define NW (NT / 32)

/* Flags, as cuda_attn.c sets them (CAUSAL is SG__ATTN_CAUSAL). */
enum { CAUSAL = 1, VEC = 2, DECODE = 4, MDROP = 8 /* a bool mask true where keys drop */ };

/* The same layout as struct ageom in cuda_attn.c. */
struct ageom {
    i64 qs[4], ks[4], vs[4], ms[4]; /* strides of the 4-d views (0 where broadcast) */
    i64 B, Hq, Hkv, Lq, S, D;
    i64 ls;    /* kv_len's stride over b (0: one length for all) */
    i64 chunk; /* keys per split */
    float scale;
    int dt, mdt, ldt, flags; /* q/k/v dtype; mask's and kv_len's (-1: none) */
    int nsplit, rows, kt;    /* splits, rows per block (R), keys per tile (KT) */
};

/* ------------------------------------------------------------ conversions */

__device__ __forceinline__ float ldf(const void *p, int dt, i64 i) {
    switch (dt) {
    case DT_F32: return ((const float *)p)[i];
    case DT_F16: return h2f_cvt(((const u16 *)p)[i]);
    case DT_BF16: return bf2f(((const u16 *)p)[i]);
    }
    return 0.0f;
}

__device__ __forceinline__ void stf(void *p, int dt, i64 i, float v) {
    switch (dt) {
    case DT_F32: ((float *)p)[i] = v; break;
    case DT_F16: ((u16 *)p)[i] = f2h_cvt(v); break;
    case DT_BF16: ((u16 *)p)[i] = f2bf(v); break;
    }
}

__device__ __forceinline__ float inf_f() { return __uint_as_float(0x7f800000u); }
__device__ __forceinline__ float nan_f() { return __uint_as_float(0x7fc00000u); }

/* ------------------------------------------------------------ geometry */

/* The valid length of batch b: kv_len[b] clamped to [0, S], or S. */
__device__ __forceinline__ i64 valid_len(const void *len, const ageom &g, i64 b) {
    if (g.ldt < 0) return g.S;
    i64 L = g.ldt == DT_I32 ? (i64)((const int *)len)[b * g.ls] : ((const i64 *)len)[b * g.ls];
    return L < 0 ? 0 : L > g.S ? g.S : L;
}

/* Keys 0 .. n-1 are seen by query i. */
__device__ __forceinline__ i64 visible(const ageom &g, i64 L, i64 i) {
    i64 n = L;
    if (g.flags & CAUSAL) {
        i64 last = L - g.Lq + i + 1;
        n = last < n ? last : n;
    }
    return n < 0 ? 0 : n;
}

/* Where row (b, h, i) of the result starts: it is stored (B, Lq, Hq, D). */
__device__ __forceinline__ i64 out_row(const ageom &g, i64 b, i64 h, i64 i) {
    return ((b * g.Lq + i) * g.Hq + h) * g.D;
}

/* The same for the flat row (b * Hq + h) * Lq + i of the scratch's order. */
__device__ __forceinline__ i64 out_at(const ageom &g, i64 row) {
    const i64 bh = row / g.Lq;
    return out_row(g, bh / g.Hq, bh % g.Hq, row % g.Lq);
}

/* Rows KT x D of a K or V tile, keys j0 .. j0+nt-1, into shared memory as
 * f32 (row pitch pitch): 16-byte loads when VEC, else one element each. */
__device__ void load_tile(float *dst, int pitch, const void *src, const i64 *st, i64 base, i64 j0,
                          int nt, const ageom &g) {
    int D = (int)g.D;
    if (g.flags & VEC) {
        int w = g.dt == DT_F32 ? 4 : 8, per = D / w;
        for (int x = threadIdx.x; x < nt * per; x += NT) {
            int j = x / per, e = (x % per) * w;
            i64 at = base + (j0 + j) * st[2] + e;
            uint4 u = *(const uint4 *)((const char *)src + at * (g.dt == DT_F32 ? 4 : 2));
            float *d = dst + j * pitch + e;
            if (g.dt == DT_F32) {
                d[0] = __uint_as_float(u.x), d[1] = __uint_as_float(u.y);
                d[2] = __uint_as_float(u.z), d[3] = __uint_as_float(u.w);
            } else {
                u32 p[4] = {u.x, u.y, u.z, u.w};
                for (int k = 0; k < 4; k++) {
                    u16 lo = (u16)(p[k] & 0xffff), hi = (u16)(p[k] >> 16);
                    d[2 * k] = g.dt == DT_F16 ? h2f_cvt(lo) : bf2f(lo);
                    d[2 * k + 1] = g.dt == DT_F16 ? h2f_cvt(hi) : bf2f(hi);
                }
            }
        }
        return;
    }
    for (int x = threadIdx.x; x < nt * D; x += NT) {
        int j = x / D, e = x % D;
        dst[j * pitch + e] = ldf(src, g.dt, base + (j0 + j) * st[2] + e * st[3]);
    }
}

/* ------------------------------------------------------------ kernels */

extern "C" __global__ void __launch_bounds__(NT)
    sg_attn_split(const void *q, const void *k, const void *v, const void *m, const void *len,
                  void *out, float *part, ageom g) {
    pdl_begin();
    extern __shared__ float sm[];
    __shared__ i64 vis[MAXR], orow[MAXR];
    __shared__ float rmax[MAXR], rsum[MAXR], ralpha[MAXR];
    const int R = g.rows, KT = g.kt, D = (int)g.D, DP = D + 1, tid = threadIdx.x;
    float *qsm = sm, *ksm = qsm + R * D, *vsm = ksm + KT * DP, *ssm = vsm + KT * D;
    const i64 grp = g.Hq / g.Hkv, G = grp * g.Lq;
    const i64 b = blockIdx.x / g.Hkv, hk = blockIdx.x % g.Hkv, split = blockIdx.y;
    const i64 r0 = (i64)blockIdx.z * R;
    const i64 L = valid_len(len, g, b);
    if (tid < R) {
        i64 r = r0 + tid, i = r % g.Lq, h = hk * grp + r / g.Lq;
        vis[tid] = r < G ? visible(g, L, i) : 0;
        orow[tid] = r < G ? (b * g.Hq + h) * g.Lq + i : -1;
        rmax[tid] = -inf_f(), rsum[tid] = 0.0f;
    }
    for (int x = tid; x < R * D; x += NT) {
        i64 r = r0 + x / D, e = x % D, i = r % g.Lq, h = hk * grp + r / g.Lq;
        qsm[x] = r < G
                     ? ldf(q, g.dt, b * g.qs[0] + h * g.qs[1] + i * g.qs[2] + e * g.qs[3]) * g.scale
                     : 0.0f;
    }
    __syncthreads();
    i64 nmax = 0;
    for (int r = 0; r < R; r++) nmax = vis[r] > nmax ? vis[r] : nmax;
    const i64 js = split * g.chunk, je = js + g.chunk < nmax ? js + g.chunk : nmax;
    const i64 kb = b * g.ks[0] + hk * g.ks[1], vb = b * g.vs[0] + hk * g.vs[1];
    float acc[MAXACC];
#pragma unroll
    for (int c = 0; c < MAXACC; c++) acc[c] = 0.0f;
    for (i64 j0 = js; j0 < je; j0 += KT) {
        int nt = (int)(je - j0 < KT ? je - j0 : KT);
        load_tile(ksm, DP, k, g.ks, kb, j0, nt, g);
        load_tile(vsm, D, v, g.vs, vb, j0, nt, g);
        __syncthreads();
        for (int x = tid; x < R * KT; x += NT) {
            int r = x / KT, j = x % KT;
            float s = -inf_f();
            if (j < nt && j0 + j < vis[r]) {
                const float *qr = qsm + r * D, *kr = ksm + j * DP;
                float d0 = 0.0f, d1 = 0.0f;
                int e = 0;
                for (; e + 1 < D; e += 2) d0 += qr[e] * kr[e], d1 += qr[e + 1] * kr[e + 1];
                if (e < D) d0 += qr[e] * kr[e];
                s = d0 + d1;
                if (g.mdt >= 0) {
                    i64 r_ = r0 + r, i = r_ % g.Lq, h = hk * grp + r_ / g.Lq;
                    i64 at = b * g.ms[0] + h * g.ms[1] + i * g.ms[2] + (j0 + j) * g.ms[3];
                    if (g.mdt == DT_BOOL)
                        s = (((const unsigned char *)m)[at] != 0) != ((g.flags & MDROP) != 0)
                                ? s
                                : -inf_f();
                    else
                        s += ldf(m, g.mdt, at);
                }
            }
            ssm[x] = s;
        }
        __syncthreads();
        for (int r = tid / 32; r < R; r += NT / 32) {
            int lane = tid & 31;
            float tmx = -inf_f();
            for (int j = lane; j < KT; j += 32) tmx = fmaxf(tmx, ssm[r * KT + j]);
            for (int o = 16; o; o >>= 1) tmx = fmaxf(tmx, __shfl_xor_sync(0xffffffffu, tmx, o));
            float mold = rmax[r], mnew = fmaxf(mold, tmx), sum = 0.0f;
            bool none = mnew == -inf_f(); /* nothing seen yet: keep zeros */
            for (int j = lane; j < KT; j += 32) {
                float p = none ? 0.0f : expf(ssm[r * KT + j] - mnew);
                ssm[r * KT + j] = p;
                sum += p;
            }
            for (int o = 16; o; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
            __syncwarp();
            if (lane == 0) {
                float alpha = none ? 1.0f : expf(mold - mnew);
                ralpha[r] = alpha;
                rsum[r] = rsum[r] * alpha + sum;
                rmax[r] = mnew;
            }
        }
        __syncthreads();
#pragma unroll
        for (int c = 0; c < MAXACC; c++) {
            int x = tid + NT * c;
            if (x < R * D) {
                int r = x / D, e = x % D;
                const float *p = ssm + r * KT;
                float a = acc[c] * ralpha[r];
                for (int j = 0; j < nt; j++) a += p[j] * vsm[j * D + e];
                acc[c] = a;
            }
        }
        __syncthreads();
    }
    const i64 rows = g.B * g.Hq * g.Lq;
#pragma unroll
    for (int c = 0; c < MAXACC; c++) {
        int x = tid + NT * c;
        if (x < R * D && orow[x / D] >= 0) {
            int r = x / D, e = x % D;
            i64 o = orow[r];
            if (g.nsplit == 1)
                stf(out, g.dt, out_at(g, o) + e, rsum[r] > 0.0f ? acc[c] / rsum[r] : nan_f());
            else
                part[(o * g.nsplit + split) * D + e] = acc[c];
        }
    }
    if (g.nsplit > 1 && tid < R && orow[tid] >= 0) {
        float *pm = part + rows * g.nsplit * D + (orow[tid] * g.nsplit + split) * 2;
        pm[0] = rmax[tid], pm[1] = rsum[tid];
    }
}

/* Keys per split of sg_attn_decode for a batch of valid length L: the
 * nsplit splits the host allowed, each of at least CMIN keys. */
__device__ __forceinline__ i64 dchunk(const ageom &g, i64 L) {
    i64 c = L < 0x7fffffff ? (i64)(((u32)L + (u32)g.nsplit - 1) / (u32)g.nsplit)
                           : (L + g.nsplit - 1) / g.nsplit;
    return c < CMIN ? CMIN : c;
}

/* Splits that hold row (b, h, i)'s visible keys: sg_attn_decode's count, or nsplit. */
__device__ __forceinline__ i64 row_splits(const void *len, const ageom &g, i64 row) {
    if (!(g.flags & DECODE) || g.mdt >= 0) return g.nsplit;
    i64 b = row / g.Lq / g.Hq, L = valid_len(len, g, b), n = visible(g, L, row % g.Lq);
    i64 c = dchunk(g, L);
    return (n + c - 1) / c;
}

/* Row blockIdx.x of the result from its splits, merged in split order. */
extern "C" __global__ void sg_attn_combine(const float *part, const void *len, void *out, ageom g) {
    pdl_begin();
    const i64 row = blockIdx.x, rows = g.B * g.Hq * g.Lq;
    const int n = (int)row_splits(len, g, row), ns = g.nsplit;
    if ((g.flags & DECODE) && n <= 1) return; /* written by its one split */
    const float *pm = part + rows * ns * g.D + row * ns * 2;
    const i64 at = out_at(g, row);
    float M = -inf_f();
    for (int s = 0; s < n; s++) M = fmaxf(M, pm[2 * s]);
    for (i64 e = threadIdx.x; e < g.D; e += blockDim.x) {
        float l = 0.0f, a = 0.0f;
        for (int s = 0; s < n; s++)
            if (pm[2 * s + 1] > 0.0f) {
                float w = expf(pm[2 * s] - M);
                l += pm[2 * s + 1] * w;
                a += part[(row * ns + s) * g.D + e] * w;
            }
        stf(out, g.dt, at + e, l > 0.0f ? a / l : nan_f());
    }
}

/* The W (8 or 4) values of a 16-byte vector of dtype dt, as f32. */
__device__ __forceinline__ void unpack(float *x, uint4 u, int dt) {
    u32 p[4] = {u.x, u.y, u.z, u.w};
    if (dt == DT_F32) {
#pragma unroll
        for (int c = 0; c < 4; c++) x[c] = __uint_as_float(p[c]);
        return;
    }
#pragma unroll
    for (int c = 0; c < 4; c++) {
        u16 lo = (u16)(p[c] & 0xffff), hi = (u16)(p[c] >> 16);
        x[2 * c] = dt == DT_F16 ? h2f_cvt(lo) : bf2f(lo);
        x[2 * c + 1] = dt == DT_F16 ? h2f_cvt(hi) : bf2f(hi);
    }
}

/* Merge softmax state (m2, l2, a2) into (m, l, a): W values. */
__device__ __forceinline__ void merge(float &m, float &l, float *a, float m2, float l2,
                                      const float *a2, int W) {
    float mn = fmaxf(m, m2);
    float x = mn == -inf_f() ? 0.0f : expf(m - mn), y = mn == -inf_f() ? 0.0f : expf(m2 - mn);
    l = l * x + l2 * y;
#pragma unroll
    for (int c = 0; c < 8; c++)
        if (c < W) a[c] = a[c] * x + a2[c] * y;
    m = mn;
}

/* All threads of the block cluster meet; shared-memory writes before show after. */
__device__ __forceinline__ void cluster_sync() {
#if __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}

/* *p as it stands in the shared memory of block `rank` of the cluster. */
__device__ __forceinline__ float ld_cluster(const float *p, u32 rank) {
    float v = 0.0f;
#if __CUDA_ARCH__ >= 900
    u32 r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(smem_addr(p)), "r"(rank));
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(r) : "memory");
#endif
    return v;
}

/* What the mask adds to key j's score: 0 or -inf for a bool mask, the value
 * for an additive one. VOL: read as it stands (a hint before the wait). */
template <bool VOL>
__device__ __forceinline__ float mask_term(const void *m, const ageom &g, i64 at) {
    if (g.mdt == DT_BOOL) {
        unsigned char c =
            VOL ? ((const volatile unsigned char *)m)[at] : ((const unsigned char *)m)[at];
        return (c != 0) != ((g.flags & MDROP) != 0) ? 0.0f : -inf_f();
    }
    if (VOL && g.mdt == DT_F32) return ((const volatile float *)m)[at];
    if (VOL) {
        u16 x = ((const volatile u16 *)m)[at];
        return g.mdt == DT_F16 ? h2f_cvt(x) : bf2f(x);
    }
    return ldf(m, g.mdt, at);
}

#define DU 2  /* key groups per lane that sg_attn_decode loads before it uses any */
#define DCL 8 /* blocks per cluster of sg_attn_decode8: the splits of one row */

/*
 * Before the wait: block (row, split)'s keys and values go to L2 (the
 * step's weights have pushed them out since the last step), so that its
 * loads after the wait hit L2. The valid length is read as it stands (at
 * worst the previous step's, one short) and clamped like valid_len: the
 * lines are a hint, and every one lies in the cache.
 */
template <bool MK>
__device__ __forceinline__ void decode_prefetch(const void *k, const void *v, const void *m,
                                                const void *len, const ageom &g) {
    const u32 row = blockIdx.x, lq = (u32)g.Lq, hq = (u32)g.Hq;
    const u32 i = row % lq, h = row / lq % hq, b = row / lq / hq, hk = h / (hq / (u32)g.Hkv);
    i64 L = g.S;
    if (g.ldt >= 0) {
        L = g.ldt == DT_I32 ? (i64)((const volatile int *)len)[b * g.ls]
                            : ((const volatile i64 *)len)[b * g.ls];
        L = L < 0 ? 0 : L > g.S ? g.S : L;
    }
    const i64 n = visible(g, L, i), chunk = dchunk(g, L), js = (i64)blockIdx.y * chunk;
    const i64 je = js + chunk < n ? js + chunk : n, es = g.dt == DT_F32 ? 4 : 2;
    const i64 lines = (g.D * es + 127) / 128;
    const char *kb = (const char *)k + (b * g.ks[0] + hk * g.ks[1]) * es;
    const char *vb = (const char *)v + (b * g.vs[0] + hk * g.vs[1]) * es;
    const i64 mrow = b * g.ms[0] + h * g.ms[1] + i * g.ms[2];
    for (i64 t = threadIdx.x; t < (je - js) * lines; t += blockDim.x) {
        const i64 j = js + t / lines, off = (t % lines) * 128;
        /* A mask's keys as the mask stands (the previous step's, at worst) */
        if (MK && mask_term<true>(m, g, mrow + j * g.ms[3]) == -inf_f()) continue;
#if SG_PTX
        asm volatile("prefetch.global.L2 [%0];" ::"l"(kb + j * g.ks[2] * es + off));
        asm volatile("prefetch.global.L2 [%0];" ::"l"(vb + j * g.vs[2] * es + off));
#else
        (void)kb, (void)vb, (void)j, (void)off;
#endif
    }
}

/* The body of sg_attn_decode (CL false) and sg_attn_decode8 (CL true); MK: with a
 * mask (the _m kernels), so that the kernels without one carry none of its code. */
template <bool CL, bool MK>
__device__ __forceinline__ void decode_body(const void *q, const void *k, const void *v,
                                            const void *mk, const void *len, void *out, float *part,
                                            const ageom &g) {
    __shared__ float wm[NW], wl[NW], wa[NW][256];
    __shared__ unsigned long long mfirst, mlast;
    decode_prefetch<MK>(k, v, mk, len, g);
    pdl_wait();
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int W = g.dt == DT_F32 ? 4 : 8, T = (int)g.D / W, kpw = 32 / T, es = 16 / W;
    const int e = (lane % T) * W;
    /* 32-bit index math: rows < 2^31 (the host checks), heads and Lq small. */
    const u32 row = blockIdx.x, split = blockIdx.y, lq = (u32)g.Lq, hq = (u32)g.Hq;
    const u32 i = row % lq, h = row / lq % hq, b = row / lq / hq, hk = h / (hq / (u32)g.Hkv);
    const i64 L = valid_len(len, g, b), n = visible(g, L, i), chunk = dchunk(g, L);
    /* Splits that hold keys; with a mask, all (they merge whatever they find). */
    const i64 nv = MK ? (i64)g.nsplit : (n + chunk - 1) / chunk;
    pdl_launch();
    /* q's loads go out with kv_len's, before the block knows if it has keys */
    float qv[8], acc[8], m = -inf_f(), l = 0.0f;
#pragma unroll
    for (int c = 0; c < 8; c++) {
        i64 at = b * g.qs[0] + h * g.qs[1] + i * g.qs[2] + (e + c) * g.qs[3];
        qv[c] = c < W ? ldf(q, g.dt, at) * g.scale : 0.0f;
        acc[c] = 0.0f;
    }
    /* Past the valid splits: nothing to do, unless the cluster merges (nv > 1). */
    if (split >= (nv > 1 ? nv : 1) && !(CL && nv > 1)) return;
    const char *kb = (const char *)k + (b * g.ks[0] + hk * g.ks[1] + e) * es;
    const char *vb = (const char *)v + (b * g.vs[0] + hk * g.vs[1] + e) * es;
    i64 js = split * chunk, je = js + chunk < n ? js + chunk : n;
    const i64 mrow = b * g.ms[0] + h * g.ms[1] + i * g.ms[2];
    if (MK) {
        /* A mask: the row's keys shrink to its first through last that the
         * mask lets through (a decode mask of the slots <= pos: as kv_len
         * would), cut evenly over the row's nsplit blocks; keys between them
         * are masked one by one below. Every block writes its state, so the
         * merge takes all nsplit (row_splits). */
        if (tid == 0) mfirst = ~0ull, mlast = 0;
        __syncthreads();
        unsigned long long f = ~0ull, la = 0;
        const unsigned char *mb = (const unsigned char *)mk + mrow;
        if (g.mdt == DT_BOOL && g.ms[3] == 1 && ((unsigned long long)mb & 15) == 0) {
            const bool drop = (g.flags & MDROP) != 0;
            for (i64 j0 = (i64)tid * 16; j0 < n; j0 += NT * 16) {
                uint4 u = *(const uint4 *)(mb + j0);
                u32 w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
                for (int c = 0; c < 16; c++) {
                    bool live = ((w[c / 4] >> (8 * (c % 4))) & 0xff) != 0;
                    if (live != drop && j0 + c < n) {
                        unsigned long long j = (unsigned long long)(j0 + c);
                        f = f < j ? f : j, la = j + 1;
                    }
                }
            }
        } else {
            for (i64 j = tid; j < n; j += NT)
                if (mask_term<false>(mk, g, mrow + j * g.ms[3]) != -inf_f()) {
                    f = f < (unsigned long long)j ? f : (unsigned long long)j;
                    la = (unsigned long long)j + 1;
                }
        }
        for (int o = 16; o; o >>= 1) {
            unsigned long long f2 = __shfl_xor_sync(0xffffffffu, f, o);
            unsigned long long l2 = __shfl_xor_sync(0xffffffffu, la, o);
            f = f2 < f ? f2 : f, la = l2 > la ? l2 : la;
        }
        if (lane == 0 && la > 0) atomicMin(&mfirst, f), atomicMax(&mlast, la);
        __syncthreads();
        const i64 lo = mlast ? (i64)mfirst : 0, hi = (i64)mlast;
        i64 c2 = (hi - lo + g.nsplit - 1) / g.nsplit;
        c2 = c2 < CMIN ? CMIN : c2;
        js = lo + split * c2, je = js + c2 < hi ? js + c2 : hi;
    }
    /* DU groups of kpw keys per warp and trip, all loads first. Every lane runs
     * the same trips: the score's shuffles need the whole warp. */
    for (i64 j0 = js + warp * kpw * DU; j0 < je; j0 += NW * kpw * DU) {
        uint4 ku[DU], vu[DU];
        float mt[DU];
#pragma unroll
        for (int u = 0; u < DU; u++) {
            i64 j = j0 + u * kpw + lane / T;
            mt[u] = 0.0f;
            if (j < je) {
                ku[u] = *(const uint4 *)(kb + j * g.ks[2] * es);
                vu[u] = *(const uint4 *)(vb + j * g.vs[2] * es);
                if (MK) mt[u] = mask_term<false>(mk, g, mrow + j * g.ms[3]);
            }
        }
        float s[DU], mx = m;
#pragma unroll
        for (int u = 0; u < DU; u++) {
            float kx[8];
            s[u] = 0.0f;
            if (j0 + u * kpw + lane / T < je) {
                unpack(kx, ku[u], g.dt);
#pragma unroll
                for (int c = 0; c < 8; c++)
                    if (c < W) s[u] += qv[c] * kx[c];
            }
        }
#pragma unroll
        for (int u = 0; u < DU; u++) {
            for (int o = 1; o < T; o <<= 1) s[u] += __shfl_xor_sync(0xffffffffu, s[u], o);
            if (MK) s[u] += mt[u];
            if (j0 + u * kpw + lane / T >= je) s[u] = -inf_f();
            mx = fmaxf(mx, s[u]);
        }
        if (mx == -inf_f()) continue; /* no key of this lane's group in this trip */
        float alpha = __expf(m - mx);
        l *= alpha;
#pragma unroll
        for (int c = 0; c < 8; c++) acc[c] *= alpha;
#pragma unroll
        for (int u = 0; u < DU; u++) {
            float p = __expf(s[u] - mx), vx[8];
            if (p > 0.0f) {
                unpack(vx, vu[u], g.dt);
                l += p;
#pragma unroll
                for (int c = 0; c < 8; c++)
                    if (c < W) acc[c] += p * vx[c];
            }
        }
        m = mx;
    }
    /* The warp's key groups, then the warps. */
    for (int o = T; o < 32; o <<= 1) {
        float a2[8];
#pragma unroll
        for (int c = 0; c < 8; c++) a2[c] = __shfl_xor_sync(0xffffffffu, acc[c], o);
        float m2 = __shfl_xor_sync(0xffffffffu, m, o), l2 = __shfl_xor_sync(0xffffffffu, l, o);
        merge(m, l, acc, m2, l2, a2, W);
    }
    if (lane < T) {
#pragma unroll
        for (int c = 0; c < W; c++) wa[warp][e + c] = acc[c];
        if (lane == 0) wm[warp] = m, wl[warp] = l;
    }
    __syncthreads();
    float M = -inf_f(), S = 0.0f, x[NW];
#pragma unroll
    for (int w = 0; w < NW; w++) M = fmaxf(M, wm[w]);
#pragma unroll
    for (int w = 0; w < NW; w++) x[w] = wl[w] > 0.0f ? expf(wm[w] - M) : 0.0f, S += wl[w] * x[w];
    if (CL && nv > 1) {
        /* The cluster's blocks are the row's splits: each leaves its (M, S, A) in
         * shared memory (wa[0], wm[0], wl[0]); block 0 merges them in split order. */
        float A[2];
#pragma unroll
        for (int c = 0; c < 2; c++) {
            int d = tid + c * NT;
            A[c] = 0.0f;
            if (d < (int)g.D)
#pragma unroll
                for (int w = 0; w < NW; w++) A[c] += x[w] > 0.0f ? wa[w][d] * x[w] : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int c = 0; c < 2; c++)
            if (tid + c * NT < (int)g.D) wa[0][tid + c * NT] = A[c];
        if (tid == 0) wm[0] = M, wl[0] = S;
        cluster_sync();
        if (split == 0) {
            float Mc = -inf_f(), Sc = 0.0f, y[DCL];
#pragma unroll
            for (int r = 0; r < DCL; r++) Mc = fmaxf(Mc, ld_cluster(&wm[0], r));
#pragma unroll
            for (int r = 0; r < DCL; r++) {
                float lr = ld_cluster(&wl[0], r), mr = ld_cluster(&wm[0], r);
                y[r] = lr > 0.0f ? expf(mr - Mc) : 0.0f, Sc += lr * y[r];
            }
            for (int d = tid; d < (int)g.D; d += NT) {
                float a = 0.0f;
#pragma unroll
                for (int r = 0; r < DCL; r++)
                    if (y[r] > 0.0f) a += ld_cluster(&wa[0][d], r) * y[r];
                stf(out, g.dt, out_row(g, b, h, i) + d, Sc > 0.0f ? a / Sc : nan_f());
            }
        }
        cluster_sync(); /* block 0 has read the others' shared memory */
        return;
    }
    for (int d = tid; d < (int)g.D; d += NT) { /* D may pass NT */
        float A = 0.0f;
#pragma unroll
        for (int w = 0; w < NW; w++) A += x[w] > 0.0f ? wa[w][d] * x[w] : 0.0f;
        if (nv <= 1)
            stf(out, g.dt, out_row(g, b, h, i) + d, S > 0.0f ? A / S : nan_f());
        else
            part[((i64)row * g.nsplit + split) * g.D + d] = A;
    }
    if (nv > 1 && tid == 0) {
        float *pm = part + g.B * g.Hq * g.Lq * g.nsplit * g.D + ((i64)row * g.nsplit + split) * 2;
        pm[0] = M, pm[1] = S;
    }
}

extern "C" __global__ void __launch_bounds__(NT)
    sg_attn_decode(const void *q, const void *k, const void *v, const void *m, const void *len,
                   void *out, float *part, ageom g) {
    decode_body<false, false>(q, k, v, m, len, out, part, g);
}

extern "C" __global__ void __launch_bounds__(NT)
    sg_attn_decode_m(const void *q, const void *k, const void *v, const void *m, const void *len,
                     void *out, float *part, ageom g) {
    decode_body<false, true>(q, k, v, m, len, out, part, g);
}

/* Grid (rows, DCL): a cluster per row, its splits merged in distributed shared memory
 * (sm_90+; not built before). */
#if __CUDA_ARCH__ >= 900
extern "C" __global__ void __cluster_dims__(1, DCL, 1) __launch_bounds__(NT)
    sg_attn_decode8(const void *q, const void *k, const void *v, const void *m, const void *len,
                    void *out, float *part, ageom g) {
    decode_body<true, false>(q, k, v, m, len, out, part, g);
}

extern "C" __global__ void __cluster_dims__(1, DCL, 1) __launch_bounds__(NT)
    sg_attn_decode8_m(const void *q, const void *k, const void *v, const void *m, const void *len,
                      void *out, float *part, ageom g) {
    decode_body<true, true>(q, k, v, m, len, out, part, g);
}
#endif

/* ------------------------------------------------------------ tensor cores */

#if SG_PTX /* the tensor-core kernels: the rest of the file */

/*
 * sg_attn_mma: prefill on tensor cores (bf16 / f16, D a multiple of 16, at
 * most 128, no mask). Block (query tile, b * Hq + h) of 4 warps takes 64
 * queries, a warp 16 of them; keys go in tiles of 64. Q's fragments stay in
 * registers; K (row-major, keys x D) and V (transposed, D x keys) sit in
 * shared memory as 16-bit with 8 halves of padding per row, so that the
 * fragment loads hit 32 banks. S = Q K^T and O += P V are mma.sync
 * m16n8k16 with f32 accumulators; the scores' accumulator layout is P's
 * operand layout, so P never leaves registers. Online softmax per row in
 * f32 as in sg_attn_split; each thread keeps its share of the row sum and
 * the quad adds them at the end.
 */
#define MQ 64    /* queries per block */
#define MK 64    /* keys per tile */
#define MAXD 128 /* head dim, at most */

__device__ __forceinline__ u32 pack2(float lo, float hi, int dt) {
    u16 a = dt == DT_F16 ? f2h_cvt(lo) : f2bf(lo), b = dt == DT_F16 ? f2h_cvt(hi) : f2bf(hi);
    return (u32)a | ((u32)b << 16);
}

__device__ __forceinline__ void mma16816(float *c, const u32 *a, u32 b0, u32 b1, int dt) {
    if (dt == DT_F16)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                     "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                     "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

extern "C" __global__ void __launch_bounds__(NT)
    sg_attn_mma(const void *q, const void *k, const void *v, const void *len, void *out, ageom g) {
    pdl_begin();
    __shared__ __align__(16) u16 ks[MK * (MAXD + 8)];
    __shared__ __align__(16) u16 vt[MAXD * (MK + 8)];
    const int D = (int)g.D, KP = D + 8, VP = MK + 8, nk = D / 16, tid = threadIdx.x;
    const int warp = tid / 32, lane = tid & 31, gr = lane >> 2, tq = lane & 3;
    const i64 b = blockIdx.y / g.Hq, h = blockIdx.y % g.Hq, hk = h / (g.Hq / g.Hkv);
    const i64 q0 = (i64)blockIdx.x * MQ;
    const i64 L = valid_len(len, g, b);
    const i64 qb = b * g.qs[0] + h * g.qs[1], kb = b * g.ks[0] + hk * g.ks[1];
    const i64 vb = b * g.vs[0] + hk * g.vs[1];
    /* Q's tile through shared memory (ks's space) into A fragments. */
    for (int x = tid; x < MQ * D; x += NT) {
        int r = x / D, e = x % D;
        ks[r * KP + e] = ld16(q, qb + (q0 + r) * g.qs[2] + e * g.qs[3], q0 + r < g.Lq);
    }
    __syncthreads();
    u32 qa[MAXD / 16][4];
    const int r0 = warp * 16 + gr;
#pragma unroll
    for (int s = 0; s < MAXD / 16; s++)
        if (s < nk) {
            const u16 *base = ks + s * 16 + 2 * tq;
            qa[s][0] = *(const u32 *)(base + r0 * KP);
            qa[s][1] = *(const u32 *)(base + (r0 + 8) * KP);
            qa[s][2] = *(const u32 *)(base + r0 * KP + 8);
            qa[s][3] = *(const u32 *)(base + (r0 + 8) * KP + 8);
        }
    __syncthreads();
    const i64 ia = q0 + r0, ib = ia + 8; /* this thread's two rows */
    const i64 na = ia < g.Lq ? visible(g, L, ia) : 0, nb = ib < g.Lq ? visible(g, L, ib) : 0;
    i64 last = q0 + MQ - 1 < g.Lq - 1 ? q0 + MQ - 1 : g.Lq - 1;
    const i64 nmax = visible(g, L, last) > L ? L : visible(g, L, last);
    float o[MAXD / 8][4], ma = -inf_f(), mb = -inf_f(), la = 0.0f, lb = 0.0f;
#pragma unroll
    for (int d = 0; d < MAXD / 8; d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
    for (i64 j0 = 0; j0 < nmax; j0 += MK) {
        for (int x = tid; x < MK * D; x += NT) {
            int j = x / D, e = x % D;
            bool in = j0 + j < nmax;
            ks[j * KP + e] = ld16(k, kb + (j0 + j) * g.ks[2] + e * g.ks[3], in);
            vt[e * VP + j] = ld16(v, vb + (j0 + j) * g.vs[2] + e * g.vs[3], in);
        }
        __syncthreads();
        float s[MK / 8][4];
#pragma unroll
        for (int n = 0; n < MK / 8; n++) {
            s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
            for (int t = 0; t < MAXD / 16; t++)
                if (t < nk) {
                    const u16 *kr = ks + (n * 8 + gr) * KP + t * 16 + 2 * tq;
                    mma16816(s[n], qa[t], *(const u32 *)kr, *(const u32 *)(kr + 8), g.dt);
                }
        }
        float tma = -inf_f(), tmb = -inf_f();
#pragma unroll
        for (int n = 0; n < MK / 8; n++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                i64 j = j0 + n * 8 + 2 * tq + (c & 1);
                bool rowb = c >= 2;
                float x = j < (rowb ? nb : na) ? s[n][c] * g.scale : -inf_f();
                s[n][c] = x;
                if (rowb)
                    tmb = fmaxf(tmb, x);
                else
                    tma = fmaxf(tma, x);
            }
        for (int off = 1; off < 4; off <<= 1) {
            tma = fmaxf(tma, __shfl_xor_sync(0xffffffffu, tma, off));
            tmb = fmaxf(tmb, __shfl_xor_sync(0xffffffffu, tmb, off));
        }
        float mna = fmaxf(ma, tma), mnb = fmaxf(mb, tmb);
        float aa = mna == -inf_f() ? 1.0f : expf(ma - mna),
              ab = mnb == -inf_f() ? 1.0f : expf(mb - mnb);
        ma = mna, mb = mnb, la *= aa, lb *= ab;
#pragma unroll
        for (int d = 0; d < MAXD / 8; d++)
            o[d][0] *= aa, o[d][1] *= aa, o[d][2] *= ab, o[d][3] *= ab;
        u32 pa[MK / 16][4];
#pragma unroll
        for (int n = 0; n < MK / 8; n++) {
            float p0 = mna == -inf_f() ? 0.0f : expf(s[n][0] - mna);
            float p1 = mna == -inf_f() ? 0.0f : expf(s[n][1] - mna);
            float p2 = mnb == -inf_f() ? 0.0f : expf(s[n][2] - mnb);
            float p3 = mnb == -inf_f() ? 0.0f : expf(s[n][3] - mnb);
            la += p0 + p1, lb += p2 + p3;
            pa[n / 2][(n & 1) * 2] = pack2(p0, p1, g.dt);
            pa[n / 2][(n & 1) * 2 + 1] = pack2(p2, p3, g.dt);
        }
#pragma unroll
        for (int d = 0; d < MAXD / 8; d++)
            if (d < D / 8)
#pragma unroll
                for (int t = 0; t < MK / 16; t++) {
                    const u16 *vr = vt + (d * 8 + gr) * VP + t * 16 + 2 * tq;
                    mma16816(o[d], pa[t], *(const u32 *)vr, *(const u32 *)(vr + 8), g.dt);
                }
        __syncthreads();
    }
    for (int off = 1; off < 4; off <<= 1) {
        la += __shfl_xor_sync(0xffffffffu, la, off);
        lb += __shfl_xor_sync(0xffffffffu, lb, off);
    }
    const i64 oa = out_row(g, b, h, ia), ob = out_row(g, b, h, ib);
#pragma unroll
    for (int d = 0; d < MAXD / 8; d++)
        if (d < D / 8) {
            int e = d * 8 + 2 * tq;
            if (ia < g.Lq) {
                stf(out, g.dt, oa + e, la > 0.0f ? o[d][0] / la : nan_f());
                stf(out, g.dt, oa + e + 1, la > 0.0f ? o[d][1] / la : nan_f());
            }
            if (ib < g.Lq) {
                stf(out, g.dt, ob + e, lb > 0.0f ? o[d][2] / lb : nan_f());
                stf(out, g.dt, ob + e + 1, lb > 0.0f ? o[d][3] / lb : nan_f());
            }
        }
}

/* ------------------------------------------------------------ flash attention */

/*
 * sg_attn_flash64 / sg_attn_flash128: prefill as FlashAttention-2's forward
 * (16-bit, D 64 or 128, no mask, 16-byte aligned rows; sm_80+). Block
 * (b * Hq + h, query tile) of 4 warps takes FQ = 64 queries, a warp 16 of
 * them; the grid's first blocks take the last query tiles, which see the
 * most keys under causal masking, so the heavy blocks start first. K and V tiles of
 * FK = 64 keys come through cp.async into shared memory rows padded by 16
 * bytes (a row pitch of 36 or 68 words: the 8 rows of an ldmatrix hit 32
 * banks); Q comes the same way, into V's buffer, once, and stays in
 * registers as A fragments. Each tile: V(t) is requested, S = Q K(t)^T
 * (ldmatrix, mma.sync m16n8k16, f32), K(t+1) is requested, the online
 * softmax runs in registers (maxima of the raw scores, then each exponent
 * one FMA, s * scale * log2(e) - max * scale * log2(e), and ex2), P is packed
 * to 16 bits in place as the A operand, and O += P V(t) (ldmatrix.trans).
 * So each load overlaps the other half's arithmetic. Tiles past the block's
 * last visible key are never loaded; only tiles that reach past a warp's
 * first row's visible keys are masked elementwise; keys at or past the
 * block's last visible key are zero-filled, not read. The result goes out
 * through shared memory as 16-byte rows of (B, Lq, Hq, D); with lse (not
 * NULL: the node's SG__ATTN_LSE) each row's logsumexp to lse[row].
 */
#define FQ 64 /* queries per block */

/* Where the flash kernel also copies its K and V views (the attention group's
 * copies, sg__group.ncopies): destinations of K's and V's 4-d shape with
 * 16-byte rows, NULL when that view is not copied. The same layout as
 * struct acopy in cuda_attn.c. */
struct acopy {
    u16 *kd, *vd;
    i64 kds[4], vds[4];
};

/* The copies go to the lighter half of the blocks (causal: the first query
 * tiles, which read the fewest keys), off the heavy blocks' path: block
 * (b, h, tile t < half) of a K/V head's first query head copies key tiles t,
 * t + half, ... of FQ rows of its K and V views; each thread issues all its
 * 16-byte loads of a tile before its stores. The rows are mostly in L2. */
template <int D>
__device__ __forceinline__ void flash_copies(const u16 *kp, const u16 *vp, const ageom &g,
                                             const acopy &c, i64 b, i64 h, i64 hk) {
    constexpr int PER = FQ * (D / 8) / NT; /* vectors of a tile per thread and view */
    const i64 half = ((i64)gridDim.y + 1) / 2, t = (i64)(gridDim.y - 1 - blockIdx.y);
    if ((!c.kd && !c.vd) || h % (g.Hq / g.Hkv) != 0 || t >= half) return;
    u16 *kd = c.kd ? c.kd + b * c.kds[0] + hk * c.kds[1] : nullptr;
    u16 *vd = c.vd ? c.vd + b * c.vds[0] + hk * c.vds[1] : nullptr;
    for (i64 j0 = t * FQ; j0 < g.S; j0 += half * FQ) {
        uint4 kv[PER], vv[PER];
#pragma unroll
        for (int u = 0; u < PER; u++) {
            const int x = threadIdx.x + u * NT, e = (x % (D / 8)) * 8;
            const i64 j = j0 + x / (D / 8);
            if (j < g.S && kd) kv[u] = *(const uint4 *)(kp + j * g.ks[2] + e);
            if (j < g.S && vd) vv[u] = *(const uint4 *)(vp + j * g.vs[2] + e);
        }
#pragma unroll
        for (int u = 0; u < PER; u++) {
            const int x = threadIdx.x + u * NT, e = (x % (D / 8)) * 8;
            const i64 j = j0 + x / (D / 8);
            if (j < g.S && kd) *(uint4 *)(kd + j * c.kds[2] + e) = kv[u];
            if (j < g.S && vd) *(uint4 *)(vd + j * c.vds[2] + e) = vv[u];
        }
    }
}

/* Rows r0 .. r0+R-1 of a (rows, D) operand with row stride st (elements)
 * into a tile of pitch D + 8; rows at or past n zero-filled. The thread
 * copies vector tid % CH of rows tid / CH + c * NT / CH: dst is the tile's
 * shared address plus the thread's part (tile_at), src the operand's row 0
 * plus the thread's part (rows tid / CH, elements (tid % CH) * 8). */
template <int D> __device__ __forceinline__ u32 tile_at(u32 tile) {
    return tile + 2 * ((threadIdx.x / (D / 8)) * (D + 8) + (threadIdx.x % (D / 8)) * 8);
}

template <int D, int R>
__device__ __forceinline__ void tile_in(u32 dst, const u16 *src, i64 st, i64 r0, i64 n) {
    constexpr int CH = D / 8, RP = NT / CH;
    const i64 lim = n - r0 - threadIdx.x / CH; /* chunk c is in when c * RP < lim */
    const u16 *p = src + r0 * st;
#pragma unroll
    for (int c = 0; c < R / RP; c++, p += RP * st) {
        const bool in = c * RP < lim;
        cp16(dst + 2 * c * RP * (D + 8), in ? p : src, in);
    }
}

/* The maxima of a tile's scores over this thread's two rows (columns 0-1
 * of each 8-key group: row a; 2-3: row b); with M, scores of keys at or
 * past ea (eb) of the thread's first column become -inf first. */
template <bool M, int NS>
__device__ __forceinline__ void row_max(float (&s)[NS][4], int ea, int eb, float &tma, float &tmb) {
#pragma unroll
    for (int n = 0; n < NS; n++)
#pragma unroll
        for (int c = 0; c < 4; c++) {
            if (M && n * 8 + (c & 1) >= (c < 2 ? ea : eb)) s[n][c] = -inf_f();
            if (c < 2)
                tma = fmaxf(tma, s[n][c]);
            else
                tmb = fmaxf(tmb, s[n][c]);
        }
}

template <int D, int FK, int DT, bool LSE>
__device__ __forceinline__ void flash_fwd(const u16 *q, const u16 *k, const u16 *v, const void *len,
                                          u16 *out, const ageom &g, const acopy &cp, float *lse,
                                          u16 *sm) {
    constexpr int P = D + 8, NKS = D / 16, ND = D / 8, NS = FK / 8;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gr = lane >> 2, tq = lane & 3;
    const i64 b = blockIdx.x / g.Hq, h = blockIdx.x % g.Hq, hk = h / (g.Hq / g.Hkv);
    const i64 q0 = (i64)(gridDim.y - 1 - blockIdx.y) * FQ;
    const i64 L = valid_len(len, g, b);
    const u16 *qp = q + b * g.qs[0] + h * g.qs[1], *kp = k + b * g.ks[0] + hk * g.ks[1];
    const u16 *vp = v + b * g.vs[0] + hk * g.vs[1];
    const i64 qlast = q0 + FQ < g.Lq ? q0 + FQ - 1 : g.Lq - 1;
    const i64 nmax = visible(g, L, qlast);
    const int ntiles = (int)((nmax + FK - 1) / FK);
    /* Shared addresses: K's tile at sk, V's at sv (Q's at sk first); the
     * thread's part of a tile copy (tk, tv), the lane's part of the ldmatrix
     * reads of K (lk) and V (lv). */
    const u32 sk = smem_addr(sm), sv = sk + 2 * FK * P, tk = tile_at<D>(sk), tv = tile_at<D>(sv);
    const u32 lk = sk + 2 * (((lane & 7) + ((lane >> 4) << 3)) * P + ((lane >> 3) & 1) * 8);
    const u32 lv = sv + 2 * (((lane & 7) + ((lane >> 3) & 1) * 8) * P + (lane >> 4) * 8);
    const u16 *qt = qp + (tid / (D / 8)) * g.qs[2] + (tid % (D / 8)) * 8;
    const u16 *kt = kp + (tid / (D / 8)) * g.ks[2] + (tid % (D / 8)) * 8;
    const u16 *vt = vp + (tid / (D / 8)) * g.vs[2] + (tid % (D / 8)) * 8;
    tile_in<D, FQ>(tk, qt, g.qs[2], q0, g.Lq);
    cp_commit();
    cp_wait<0>();
    __syncthreads();
    u32 qa[NKS][4];
#pragma unroll
    for (int t = 0; t < NKS; t++)
        ldsm4(qa[t], sk + 2 * ((warp * 16 + (lane & 15)) * P + t * 16 + (lane >> 4) * 8));
    __syncthreads();
    if (ntiles > 0) tile_in<D, FK>(tk, kt, g.ks[2], 0, nmax);
    cp_commit();
    /* This thread's rows ia and ia + 8; the warp's first row sees the fewest keys. */
    const i64 ia = q0 + warp * 16 + gr;
    const i64 na = visible(g, L, ia), nb = visible(g, L, ia + 8);
    const i64 wmin = visible(g, L, q0 + warp * 16);
    const float sl2 = g.scale * 1.4426950408889634f;
    float o[ND][4], ma = -inf_f(), mb = -inf_f(), la = 0.0f, lb = 0.0f;
#pragma unroll
    for (int d = 0; d < ND; d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
    for (int t = 0; t < ntiles; t++) {
        const i64 j0 = (i64)t * FK;
        tile_in<D, FK>(tv, vt, g.vs[2], j0, nmax);
        cp_commit();
        cp_wait<1>();
        __syncthreads();
        float s[NS][4];
#pragma unroll
        for (int n = 0; n < NS; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < NKS; kk++)
#pragma unroll
            for (int n = 0; n < NS; n += 2) {
                u32 r[4];
                ldsm4(r, lk + 2 * (n * 8 * P + kk * 16));
                mma(s[n], qa[kk], r[0], r[1], DT);
                mma(s[n + 1], qa[kk], r[2], r[3], DT);
            }
        __syncthreads();
        if (t + 1 < ntiles) tile_in<D, FK>(tk, kt, g.ks[2], j0 + FK, nmax);
        cp_commit();
        float tma = -inf_f(), tmb = -inf_f();
        if (j0 + FK > wmin) { /* the tile cuts a row's visible keys: mask */
            const int ea = (int)(na - j0 < FK ? na - j0 : FK) - 2 * tq;
            const int eb = (int)(nb - j0 < FK ? nb - j0 : FK) - 2 * tq;
            row_max<true, NS>(s, ea, eb, tma, tmb);
        } else {
            row_max<false, NS>(s, 0, 0, tma, tmb);
        }
#pragma unroll
        for (int off = 1; off < 4; off <<= 1) {
            tma = fmaxf(tma, __shfl_xor_sync(0xffffffffu, tma, off));
            tmb = fmaxf(tmb, __shfl_xor_sync(0xffffffffu, tmb, off));
        }
        /* Maxima of the raw scores (scale > 0); ua, ub in log2 units, each
         * exponent one FMA, s * scale * log2(e) - u. A row with nothing seen
         * yet keeps zeros: subtract 0, not -inf. */
        const float mna = fmaxf(ma, tma), mnb = fmaxf(mb, tmb);
        const float ua = mna == -inf_f() ? 0.0f : mna * sl2;
        const float ub = mnb == -inf_f() ? 0.0f : mnb * sl2;
        const float aa = ex2(__fmaf_rn(ma, sl2, -ua)), ab = ex2(__fmaf_rn(mb, sl2, -ub));
        ma = mna, mb = mnb;
        float sa = 0.0f, sb = 0.0f;
        u32 pa[FK / 16][4];
#pragma unroll
        for (int n = 0; n < NS; n++) {
            float p0 = ex2(__fmaf_rn(s[n][0], sl2, -ua)), p1 = ex2(__fmaf_rn(s[n][1], sl2, -ua));
            float p2 = ex2(__fmaf_rn(s[n][2], sl2, -ub)), p3 = ex2(__fmaf_rn(s[n][3], sl2, -ub));
            sa += p0 + p1, sb += p2 + p3;
            pa[n / 2][(n & 1) * 2] = pack2h(p0, p1, DT);
            pa[n / 2][(n & 1) * 2 + 1] = pack2h(p2, p3, DT);
        }
        la = la * aa + sa, lb = lb * ab + sb;
#pragma unroll
        for (int d = 0; d < ND; d++) o[d][0] *= aa, o[d][1] *= aa, o[d][2] *= ab, o[d][3] *= ab;
        cp_wait<1>();
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < FK / 16; kk++)
#pragma unroll
            for (int d = 0; d < ND; d += 2) {
                u32 r[4];
                ldsm4t(r, lv + 2 * (kk * 16 * P + d * 8));
                mma(o[d], pa[kk], r[0], r[1], DT);
                mma(o[d + 1], pa[kk], r[2], r[3], DT);
            }
        __syncthreads();
    }
#pragma unroll
    for (int off = 1; off < 4; off <<= 1) {
        la += __shfl_xor_sync(0xffffffffu, la, off);
        lb += __shfl_xor_sync(0xffffffffu, lb, off);
    }
    const float ra = la > 0.0f ? 1.0f / la : nan_f(), rb = lb > 0.0f ? 1.0f / lb : nan_f();
    if (LSE && tq == 0) { /* ln sum e^(s scale) = (max s scale log2(e) + log2 l) ln 2 */
        const i64 r = (b * g.Hq + h) * g.Lq + ia;
        if (ia < g.Lq) lse[r] = la > 0.0f ? (ma * sl2 + log2f(la)) * 0.6931471805599453f : inf_f();
        if (ia + 8 < g.Lq)
            lse[r + 8] = lb > 0.0f ? (mb * sl2 + log2f(lb)) * 0.6931471805599453f : inf_f();
    }
    u16 *so = sm + (warp * 16 + gr) * P + 2 * tq;
#pragma unroll
    for (int d = 0; d < ND; d++) {
        *(u32 *)(so + d * 8) = pack2h(o[d][0] * ra, o[d][1] * ra, DT);
        *(u32 *)(so + 8 * P + d * 8) = pack2h(o[d][2] * rb, o[d][3] * rb, DT);
    }
    __syncthreads();
    u16 *op = out + out_row(g, b, h, q0);
    const i64 ost = g.Hq * D; /* rows of (B, Lq, Hq, D) */
#pragma unroll
    for (int c = 0; c < FQ * (D / 8) / NT; c++) {
        int x = tid + c * NT, r = x / (D / 8), e = (x % (D / 8)) * 8;
        if (q0 + r < g.Lq) *(uint4 *)(op + r * ost + e) = *(const uint4 *)(sm + r * P + e);
    }
    flash_copies<D>(kp, vp, g, cp, b, h, hk);
}

/* Shared memory: a K and a V tile of FK rows, or Q's FQ rows, of pitch D + 8.
 * The _lse kernels (a forward whose backward follows) also write each row's
 * logsumexp; inference runs the kernels without that code. */
#define FLASH(D, FK, LSE)                                                                          \
    __shared__ __align__(16) u16 sm[(FQ > 2 * FK ? FQ : 2 * FK) * (D + 8)];                        \
    if (g.dt == DT_F16)                                                                            \
        flash_fwd<D, FK, DT_F16, LSE>(q, k, v, len, out, g, cp, lse, sm);                          \
    else                                                                                           \
        flash_fwd<D, FK, DT_BF16, LSE>(q, k, v, len, out, g, cp, lse, sm);

extern "C" __global__ void __launch_bounds__(NT)
    sg_attn_flash64(const u16 *q, const u16 *k, const u16 *v, const void *len, u16 *out, ageom g,
                    acopy cp) {
    pdl_begin();
    float *lse = nullptr;
    FLASH(64, 64, false)
}

extern "C" __global__ void __launch_bounds__(NT)
    sg_attn_flash128(const u16 *q, const u16 *k, const u16 *v, const void *len, u16 *out, ageom g,
                     acopy cp) {
    pdl_begin();
    float *lse = nullptr;
    FLASH(128, 32, false)
}

extern "C" __global__ void __launch_bounds__(NT)
    sg_attn_flash64_lse(const u16 *q, const u16 *k, const u16 *v, const void *len, u16 *out,
                        ageom g, acopy cp, float *lse) {
    pdl_begin();
    FLASH(64, 64, true)
}

extern "C" __global__ void __launch_bounds__(NT)
    sg_attn_flash128_lse(const u16 *q, const u16 *k, const u16 *v, const void *len, u16 *out,
                         ageom g, acopy cp, float *lse) {
    pdl_begin();
    FLASH(128, 32, true)
}

#endif /* SG_PTX */
