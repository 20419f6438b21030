/* SPDX-License-Identifier: MIT */
/*
 * k_data.cu -- the CUDA kernels of the data family (the NVRTC unit
 * SG__CU_DATA; cuda_data.c launches them): embedding, index_select and
 * concat as one strided gather, index_copy as a scatter after a pass that
 * reads the indices (or, inside a graph recording, one pass that scans for
 * duplicates), and arange. Elements move as raw bytes (1, 2, 4 or 8),
 * so every dtype is one kernel. Self-contained: no includes.
 *
 * Every kernel guards its indices: a gather whose index is out of range
 * writes zeros, a scatter skips the element. The host checks the indices
 * before launching where it may wait for the device (not while a CUDA graph
 * is recorded), so that a bad index fails the call as on the CPU.
 */

#define MAXD 6

/* The kernel parameter; cuda_data.c has the same struct. */
struct dt_args {
    void *dst;
    const void *src;
    const void *idx;     /* gathers: the index tensor's element 0, or NULL for a copy */
    i64 shape[MAXD];     /* the index space walked: dst's for gathers, src's for the scatter */
    i64 dstride[MAXD];   /* in elements, per walked dim */
    i64 sstride[MAXD];
    i64 istride[MAXD];   /* gathers: idx's stride per walked dim */
    i64 n;               /* elements walked */
    i64 sel_stride;      /* gather: src stride of one index step; scatter: dst's */
    i64 limit;           /* indices are valid in [0, limit) */
    u64 *last;           /* index_copy: per dst position, the last src position + 1 */
    i64 *idx64;          /* index_copy: the indices read as int64 */
    i64 count;           /* index_copy in a graph: idx's length */
    i64 jstride;         /* index_copy in a graph: src's stride along dim */
    int ndim, es, idx_is_i64, dim;
};
static_assert(sizeof(dt_args) == 288, "dt_args changed: update cuda_data.c too");

__device__ __forceinline__ void copy_elem(void *d, i64 di, const void *s, i64 si, int es) {
    switch (es) {
    case 8: ((u64 *)d)[di] = ((const u64 *)s)[si]; break;
    case 4: ((u32 *)d)[di] = ((const u32 *)s)[si]; break;
    case 2: ((u16 *)d)[di] = ((const u16 *)s)[si]; break;
    default: ((u8 *)d)[di] = ((const u8 *)s)[si]; break;
    }
}

__device__ __forceinline__ void zero_elem(void *d, i64 di, int es) {
    switch (es) {
    case 8: ((u64 *)d)[di] = 0; break;
    case 4: ((u32 *)d)[di] = 0; break;
    case 2: ((u16 *)d)[di] = 0; break;
    default: ((u8 *)d)[di] = 0; break;
    }
}

__device__ __forceinline__ i64 read_index(const void *p, bool is_i64, i64 off) {
    return is_i64 ? ((const i64 *)p)[off] : (i64)((const int *)p)[off];
}

/*
 * dst[c] = src[c with one dim's coordinate replaced by idx[c]]: walk dst's
 * coordinates c; src's offset is the sum over the walked dims (sstride 0 on
 * the indexed ones) plus idx's value times sel_stride. Without idx it is a
 * strided copy (concat's pieces).
 */
template <typename I> __device__ __forceinline__ void gather(const dt_args &a) {
    I n = (I)a.n, step = (I)blockDim.x * (I)gridDim.x;
    for (I i = (I)blockIdx.x * (I)blockDim.x + (I)threadIdx.x; i < n; i += step) {
        I rem = i, doff = 0, soff = 0, ioff = 0;
        for (int d = a.ndim - 1; d >= 0; d--) {
            I size = (I)a.shape[d], c = rem % size;
            rem /= size;
            doff += c * (I)a.dstride[d];
            soff += c * (I)a.sstride[d];
            ioff += c * (I)a.istride[d];
        }
        if (a.idx) {
            i64 v = read_index(a.idx, a.idx_is_i64, (i64)ioff);
            if (v < 0 || v >= a.limit) {
                zero_elem(a.dst, (i64)doff, a.es);
                continue;
            }
            soff += (I)v * (I)a.sel_stride;
        }
        copy_elem(a.dst, (i64)doff, a.src, (i64)soff, a.es);
    }
}

extern "C" __global__ void sg_data_gather32(const dt_args a) {
    pdl_begin();
    gather<int>(a);
}
extern "C" __global__ void sg_data_gather64(const dt_args a) {
    pdl_begin();
    gather<i64>(a);
}

/* index_copy, pass 1: clear the per-position marks. */
extern "C" __global__ void sg_data_zero(u64 *p, i64 n) {
    pdl_begin();
    i64 step = (i64)blockDim.x * gridDim.x;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) p[i] = 0;
}

/* A recorded graph's small memset node as a kernel node (cuda_graph.c
 * memsets_as_kernels): height rows of width elements of esize bytes (1, 2
 * or 4) at dst, pitch bytes apart, set to value. */
extern "C" __global__ void sg_data_memset(u64 dst, u64 pitch, unsigned value, unsigned esize,
                                          u64 width, u64 height) {
    pdl_begin();
    u64 n = width * height, step = (u64)blockDim.x * gridDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        u64 at = dst + (i / width) * pitch + (i % width) * esize;
        if (esize == 4)
            *(unsigned *)at = value;
        else if (esize == 2)
            *(unsigned short *)at = (unsigned short)value;
        else
            *(unsigned char *)at = (unsigned char)value;
    }
}

/* index_copy, pass 2: read the n indices into idx64 (before any write to
 * dst, which idx may alias) and mark, per dst position, the last src
 * position that names it: of repeated indices the last write wins, as in a
 * sequential loop (and as on the CPU). */
extern "C" __global__ void sg_data_index_prep(const dt_args a) {
    pdl_begin();
    i64 step = (i64)blockDim.x * gridDim.x;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < a.n; i += step) {
        i64 v = read_index(a.idx, a.idx_is_i64, i * a.istride[0]);
        a.idx64[i] = v;
        if (v >= 0 && v < a.limit) atomicMax(&a.last[v], (u64)i + 1);
    }
}

/* index_copy, pass 3: walk src; dst's offset has the coordinate along dim
 * replaced by idx64[it] (dstride[dim] is 0, sel_stride dst's stride there). */
template <typename I> __device__ __forceinline__ void scatter(const dt_args &a) {
    I n = (I)a.n, step = (I)blockDim.x * (I)gridDim.x;
    for (I i = (I)blockIdx.x * (I)blockDim.x + (I)threadIdx.x; i < n; i += step) {
        I rem = i, doff = 0, soff = 0, j = 0;
        for (int d = a.ndim - 1; d >= 0; d--) {
            I size = (I)a.shape[d], c = rem % size;
            rem /= size;
            if (d == a.dim) j = c;
            doff += c * (I)a.dstride[d];
            soff += c * (I)a.sstride[d];
        }
        i64 v = a.idx64[j];
        if (v < 0 || v >= a.limit || a.last[v] != (u64)j + 1) continue;
        doff += (I)v * (I)a.sel_stride;
        copy_elem(a.dst, (i64)doff, a.src, (i64)soff, a.es);
    }
}

extern "C" __global__ void sg_data_scatter32(const dt_args a) {
    pdl_begin();
    scatter<int>(a);
}
extern "C" __global__ void sg_data_scatter64(const dt_args a) {
    pdl_begin();
    scatter<i64>(a);
}

/*
 * index_copy while a CUDA graph is recorded, where no scratch may be
 * allocated: one pass. Work item b is (src position j along dim, chunk of
 * the other coordinates); its block first looks for a later position with
 * the same index (last write wins), together, then copies the chunk. The
 * walk (shape, strides) leaves dim out: shape[dim] is 1, jstride steps src
 * to position j. Scanning costs (count - j) loads a block, shared by its
 * threads: cheap for the short index lists of KV-cache updates.
 */
#define CHUNK 2048
extern "C" __global__ void sg_data_index_copy_scan(const dt_args a) {
    pdl_begin();
    i64 chunks = (a.n + CHUNK - 1) / CHUNK;
    for (i64 b = blockIdx.x; b < a.count * chunks; b += gridDim.x) {
        i64 j = b / chunks, first = (b % chunks) * CHUNK;
        i64 v = read_index(a.idx, a.idx_is_i64, j * a.istride[0]);
        int later = 0;
        for (i64 k = j + 1 + threadIdx.x; k < a.count && !later; k += blockDim.x)
            later = read_index(a.idx, a.idx_is_i64, k * a.istride[0]) == v;
        if (__syncthreads_or(later) || v < 0 || v >= a.limit) continue; /* uniform per block */
        i64 end = first + CHUNK < a.n ? first + CHUNK : a.n;
        for (i64 e = first + threadIdx.x; e < end; e += blockDim.x) {
            i64 rem = e, doff = v * a.sel_stride, soff = j * a.jstride;
            for (int d = a.ndim - 1; d >= 0; d--) {
                i64 size = a.shape[d], c = rem % size;
                rem /= size;
                doff += c * a.dstride[d];
                soff += c * a.sstride[d];
            }
            copy_elem(a.dst, doff, a.src, soff, a.es);
        }
    }
}

/* ------------------------------------------------------------ arange */

/* p[i * stride] = start + i * step, computed in double and stored as the
 * CPU does: floats through a float, ints truncated (the front-end checked
 * the range fits). */
extern "C" __global__ void sg_data_arange(void *p, i64 n, i64 stride, int dt, double start,
                                          double step_) {
    pdl_begin();
    i64 step = (i64)blockDim.x * gridDim.x;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        double v = start + (double)i * step_;
        i64 o = i * stride;
        switch (dt) {
        case DT_F32: ((float *)p)[o] = (float)v; break;
        case DT_F16: ((u16 *)p)[o] = (u16)f2h((float)v); break;
        case DT_BF16: ((u16 *)p)[o] = (u16)f2bf((float)v); break;
        case DT_I32: ((int *)p)[o] = (int)v; break;
        case DT_I64: ((i64 *)p)[o] = (i64)v; break;
        default: break;
        }
    }
}

/* ------------------------------------------------------------ rand */

/* Philox 4x32-10 (Random123's philox4x32_R(10, ...)) and the element mapping
 * of graphs/cpu/cpu_random.c, word for word, so that a seed gives the same
 * bits on both backends. */
__device__ __forceinline__ void philox(u32 c[4], u32 k0, u32 k1) {
    for (int r = 0; r < 10; r++) {
        if (r > 0) k0 += 0x9E3779B9u, k1 += 0xBB67AE85u;
        u32 hi0 = __umulhi(0xD2511F53u, c[0]), lo0 = 0xD2511F53u * c[0];
        u32 hi1 = __umulhi(0xCD9E8D57u, c[2]), lo1 = 0xCD9E8D57u * c[2];
        u32 n0 = hi1 ^ c[1] ^ k0, n2 = hi0 ^ c[3] ^ k1;
        c[0] = n0, c[1] = lo1, c[2] = n2, c[3] = lo0;
    }
}

/* v rounded to float to odd (graphs/cpu capture.h's sg__round_odd): a
 * second rounding to f16/bf16 then equals one rounding of v. */
__device__ __forceinline__ float round_odd(double v) {
    float f = __double2float_rz(v);
    if ((double)f != v && !(__float_as_uint(f) & 1u)) f = __uint_as_float(__float_as_uint(f) + 1u);
    return f;
}

/* out[e] for e < n from the state rng = (seed, offset) (rng[rs] is the
 * offset); dist 0 uniform, 1 normal. One thread per Philox block. */
extern "C" __global__ void sg_data_rand(void *out, i64 n, int dt, int dist, const i64 *rng,
                                        i64 rs) {
    pdl_begin();
    u64 seed = (u64)rng[0], offset = (u64)rng[rs];
    u32 k0 = (u32)seed, k1 = (u32)(seed >> 32);
    int per = dist == 1 ? 2 : 4, bits = dt == DT_F32 ? 24 : dt == DT_F16 ? 11 : 8;
    i64 nblocks = (n + per - 1) / per, step = (i64)blockDim.x * gridDim.x;
    for (i64 bi = (i64)blockIdx.x * blockDim.x + threadIdx.x; bi < nblocks; bi += step) {
        u64 b = offset + (u64)bi;
        u32 w[4] = {(u32)b, (u32)(b >> 32), 0u, 0u};
        philox(w, k0, k1);
        for (int k = 0; k < per && bi * per + k < n; k++) {
            i64 e = bi * per + k;
            float v;
            if (dist == 1) {
                double u1 = ((double)w[2 * k] + 1.0) * 2.3283064365386963e-10;
                double u2 = (double)w[2 * k + 1] * 2.3283064365386963e-10;
                double z = sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
                v = dt == DT_F32 ? (float)z : round_odd(z);
            } else {
                v = (float)(w[k] >> (32 - bits)) * __uint_as_float((u32)(127 - bits) << 23);
            }
            switch (dt) {
            case DT_F32: ((float *)out)[e] = v; break;
            case DT_F16: ((u16 *)out)[e] = (u16)f2h(v); break;
            default: ((u16 *)out)[e] = (u16)f2bf(v); break;
            }
        }
    }
}

/* ------------------------------------------------------------ topk and sample */

/* graphs/cpu/cpu_sample.c's selections (see there for the definitions): topk
 * a thread per row, sample a block per row (below); no scratch memory. Rows
 * are contiguous (rows, V). */
__device__ __forceinline__ float ld_float(const void *p, int dt, i64 i) {
    switch (dt) {
    case DT_F32: return ((const float *)p)[i];
    case DT_F16: return h2f(((const u16 *)p)[i]);
    default: return __uint_as_float((u32)((const u16 *)p)[i] << 16);
    }
}

__device__ __forceinline__ u32 order_key(float v) {
    if (v != v) return 0xffffffffu;
    if (v == 0.0f) v = 0.0f;
    u32 u = __float_as_uint(v);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

#define SB 512 /* threads a row of sg_data_sample */

struct srow {
    const void *p;
    int dt;
    i64 base, V;
};

struct sbound {
    u32 key;
    i64 idx;
};

__device__ __forceinline__ float row_at(const srow &r, i64 j) { return ld_float(r.p, r.dt, r.base + j); }

/* Row i of x (rows of V entries) as an srow: with staged, copied first into
 * the block's dynamic shared memory sm (V entries and 16 bytes more), at
 * the same offset from 16 bytes as where it lies, so that its middle moves
 * in 16-byte vectors, a thread's in flight together. The row's passes (up
 * to ~18 a draw) then read shared memory: from global memory each pass is
 * a thread's loads one after another, an L2 round trip each. */
__device__ srow row_of(const void *x, int dt, i64 i, i64 V, unsigned char *sm, bool staged) {
    srow r = {x, dt, i * V, V};
    if (!staged) return r;
    const i64 es = dt == DT_F32 ? 4 : 2, bytes = V * es;
    const unsigned char *src = (const unsigned char *)x + i * bytes;
    const int off = (int)((u64)src & 15);
    unsigned char *dst = sm + off;
    i64 head = off ? 16 - off : 0;
    head = head < bytes ? head : bytes;
    const i64 nv = (bytes - head) / 16, tail = head + nv * 16;
    for (i64 b = threadIdx.x; b < head; b += SB) dst[b] = src[b];
    const uint4 *sv = (const uint4 *)(src + head);
    uint4 *dv = (uint4 *)(dst + head);
#pragma unroll 4
    for (i64 v = threadIdx.x; v < nv; v += SB) dv[v] = sv[v];
    for (i64 b = tail + threadIdx.x; b < bytes; b += SB) dst[b] = src[b];
    __syncthreads();
    r.p = dst;
    r.base = 0;
    return r;
}

__device__ __forceinline__ bool kept(sbound b, u32 key, i64 j) {
    return key > b.key || (key == b.key && j <= b.idx);
}

/*
 * sg_data_sample: a block of SB threads a row (blocks step through the
 * rows), cpu_sample.c's selection with each pass over the row split among
 * the threads. Its masses are integers (the weights as the row's integers,
 * floor(w / W 2^S)), so the block's sums are exact and give the CPU's
 * picks in any order of adds. The k-th entry of the order and top-p's
 * boundary key come from a radix search of 8 bits a pass (4 passes: each
 * a histogram of the keys, or of their mass, under the prefix found so
 * far); ties at the boundary and the draw itself are settled in index
 * order, each thread owning one contiguous segment of the row: the
 * segments' sums, their exclusive scan, then the one segment that holds
 * the answer walks its entries. Shared memory and barriers only.
 */

struct wparams {
    int kind;
    double temp, max, wmax, scale;
};

/* +inf as 1e300: the infinite entries share the row (cpu_sample.c). */
__device__ __forceinline__ double weight(const wparams &w, float x) {
    if (w.kind == 0) return x > 0 ? ((double)x < 1e300 ? (double)x : 1e300) : 0.0;
    return exp(((double)x - w.max) / w.temp);
}

/* The weight as the row's integer: floor(w / W 2^S); 0 for NaN. */
__device__ __forceinline__ u64 qweight(const wparams &w, float x) {
    double v = weight(w, x);
    return v > 0 ? (u64)(v / w.wmax * w.scale) : 0ull;
}

/* The block's sum, max and exclusive scan of one value a thread (sh: SB
 * words; every thread gets the result; sh is free again on return). */
__device__ u64 blk_sum(u64 v, u64 *sh) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int h = SB / 2; h > 0; h >>= 1) {
        if (threadIdx.x < (unsigned)h) sh[threadIdx.x] += sh[threadIdx.x + h];
        __syncthreads();
    }
    v = sh[0];
    __syncthreads();
    return v;
}

__device__ u64 blk_max(u64 v, u64 *sh) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int h = SB / 2; h > 0; h >>= 1) {
        if (threadIdx.x < (unsigned)h && sh[threadIdx.x + h] > sh[threadIdx.x])
            sh[threadIdx.x] = sh[threadIdx.x + h];
        __syncthreads();
    }
    v = sh[0];
    __syncthreads();
    return v;
}

__device__ u64 blk_scan(u64 v, u64 *sh) {
    u64 x = v;
    sh[threadIdx.x] = x;
    __syncthreads();
    for (int off = 1; off < SB; off <<= 1) {
        u64 y = threadIdx.x >= (unsigned)off ? sh[threadIdx.x - off] : 0ull;
        __syncthreads();
        x += y;
        sh[threadIdx.x] = x;
        __syncthreads();
    }
    __syncthreads();
    return x - v;
}

/* The mass of the kept entries with key >= lo (strict: > lo). */
__device__ u64 blk_mass(const srow &r, const wparams &w, sbound kb, u32 lo, bool strict, u64 *sh) {
    u64 m = 0;
    for (i64 j = threadIdx.x; j < r.V; j += SB) {
        float x = row_at(r, j);
        u32 key = order_key(x);
        if (kept(kb, key, j) && (strict ? key > lo : key >= lo)) m += qweight(w, x);
    }
    return blk_sum(m, sh);
}

/* hist[d] += v for the radix search's shared histogram of 256 u64 held as
 * two u32 halves (lo at [d], hi at [256 + d]): 32-bit shared atomics are the
 * hardware's own, and a carry out of lo goes into hi, so the sum is exact. */
__device__ __forceinline__ void hist_add(u32 *hist, u32 d, u64 v) {
    u32 lo = (u32)v, hi = (u32)(v >> 32);
    if (lo) {
        u32 old = atomicAdd(&hist[d], lo);
        hi += old + lo < old;
    }
    if (hi) atomicAdd(&hist[256 + d], hi);
}

__device__ __forceinline__ u64 hist_at(const u32 *hist, int d) {
    return (u64)hist[256 + d] << 32 | hist[d];
}

/* The radix search: the largest key t whose entries (those kept by kb, a
 * key's count, or with mass its weight's) from the top reach target, 8
 * bits a pass; *above gets the count or mass of the keys above t. */
__device__ u32 blk_radix(const srow &r, const wparams *w, sbound kb, double target, u64 *above,
                         u32 *hist, u64 *sh) {
    u32 prefix = 0;
    u64 acc = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        u32 hi = shift == 24 ? 0u : 0xffffffffu << (shift + 8);
        if (threadIdx.x < 256) hist[threadIdx.x] = hist[256 + threadIdx.x] = 0;
        __syncthreads();
        /* A thread's last 4 digits and their sums in registers, added to the
         * histogram when they leave: a row's keys crowd into few digits in the
         * high passes, where one shared atomic an entry would serialize. */
        u32 d0 = 256, d1 = 256, d2 = 256, d3 = 256;
        u64 c0 = 0, c1 = 0, c2 = 0, c3 = 0;
        for (i64 j = threadIdx.x; j < r.V; j += SB) {
            float x = row_at(r, j);
            u32 key = order_key(x);
            if ((key & hi) != prefix || !kept(kb, key, j)) continue;
            u64 q = w ? qweight(*w, x) : 1ull;
            u32 d = (key >> shift) & 255u;
            if (!q) continue;
            if (d == d0)
                c0 += q;
            else if (d == d1)
                c1 += q;
            else if (d == d2)
                c2 += q;
            else if (d == d3)
                c3 += q;
            else {
                if (c3) hist_add(hist, d3, c3);
                d3 = d2, c3 = c2, d2 = d1, c2 = c1, d1 = d0, c1 = c0, d0 = d, c0 = q;
            }
        }
        if (c0) hist_add(hist, d0, c0);
        if (c1) hist_add(hist, d1, c1);
        if (c2) hist_add(hist, d2, c2);
        if (c3) hist_add(hist, d3, c3);
        __syncthreads();
        if (threadIdx.x == 0) {
            int d = 255;
            for (; d > 0 && !((double)(acc + hist_at(hist, d)) >= target); d--)
                acc += hist_at(hist, d);
            sh[0] = prefix | (u32)d << shift;
            sh[1] = acc;
        }
        __syncthreads();
        prefix = (u32)sh[0], acc = sh[1];
        __syncthreads();
    }
    *above = acc;
    return prefix;
}

/* Settles a boundary in index order: with c(j) the count or mass of entry j
 * among those that `on` (key == t kept by kb, or kept by kb), the first j
 * with c(j) > 0 whose running sum from base, as a double, reaches target
 * (ge) or exceeds it; else the last j with c(j) > 0, else -1. */
__device__ i64 blk_first(const srow &r, const wparams *w, sbound kb, u32 t, bool ties, u64 base,
                         double target, bool ge, u64 *sh) {
    i64 seg = (r.V + SB - 1) / SB, lo = threadIdx.x * seg, hi = lo + seg < r.V ? lo + seg : r.V;
    u64 c = 0;
    i64 last = -1;
    for (i64 j = lo; j < hi; j++) {
        float x = row_at(r, j);
        u32 key = order_key(x);
        u64 q = (ties ? key == t : true) && kept(kb, key, j) ? (w ? qweight(*w, x) : 1ull) : 0ull;
        c += q;
        if (q) last = j;
    }
    u64 run = base + blk_scan(c, sh);
    double end = (double)(run + c);
    bool here = c > 0 && (ge ? end >= target : end > target);
    u64 first = blk_max(here ? (u64)(SB - threadIdx.x) : 0ull, sh); /* the lowest such thread */
    i64 found = -1;
    if (first && threadIdx.x == SB - first) {
        for (i64 j = lo; j < hi; j++) {
            float x = row_at(r, j);
            u32 key = order_key(x);
            u64 q =
                (ties ? key == t : true) && kept(kb, key, j) ? (w ? qweight(*w, x) : 1ull) : 0ull;
            run += q;
            if (q && (ge ? (double)run >= target : (double)run > target)) {
                found = j;
                break;
            }
        }
        sh[0] = (u64)found;
    }
    __syncthreads();
    if (first) found = (i64)sh[0];
    __syncthreads();
    if (!first) found = (i64)blk_max((u64)(last + 1), sh) - 1;
    return found;
}

/* out[i] = the index drawn for row i of x (rows, V); rng = (seed, offset). */
extern "C" __global__ void __launch_bounds__(SB)
    sg_data_sample(i64 *out, const void *x, int dt, i64 rows, i64 V, const i64 *rng, i64 rs,
                   int kind, i64 top_k, double temp, double top_p, int staged) {
    pdl_begin();
    __shared__ u64 sh[SB];
    __shared__ u32 hist[512];
    SG_DYN_SMEM(uint4, stage);
    u64 seed = (u64)rng[0], offset = (u64)rng[rs];
    int bits = 0;
    while (bits < 62 && ((u64)V >> bits) != 0) bits++;
    for (i64 i = blockIdx.x; i < rows; i += gridDim.x) {
        const srow r = row_of(x, dt, i, V, (unsigned char *)stage, staged);
        u64 b = offset + (u64)i;
        u32 w4[4] = {(u32)b, (u32)(b >> 32), 0u, 0u};
        philox(w4, (u32)seed, (u32)(seed >> 32));
        double u = ((double)(w4[0] >> 5) * 67108864.0 + (double)(w4[1] >> 6)) *
                   1.1102230246251565e-16;
        u64 best = 0; /* the first largest: the largest key, then the lowest index */
        for (i64 j = threadIdx.x; j < V; j += SB) {
            u64 c = (u64)order_key(row_at(r, j)) << 32 | (u64)(0xffffffffu - (u32)j);
            best = c > best ? c : best;
        }
        best = blk_max(best, sh);
        i64 first_max = (i64)(0xffffffffu - (u32)best);
        wparams w = {kind, temp, (double)row_at(r, first_max), 0.0, ldexp(1.0, 62 - bits)};
        u64 wm = 0; /* the largest weight: as bits, which order non-negative doubles alike */
        for (i64 j = threadIdx.x; j < V; j += SB) {
            double v = weight(w, row_at(r, j));
            if (v > 0 && (u64)__double_as_longlong(v) > wm) wm = (u64)__double_as_longlong(v);
        }
        w.wmax = __longlong_as_double((long long)blk_max(wm, sh));
        sbound kb = {0u, V};
        if (kind == 1 && top_k > 0 && top_k < V) {
            u64 gt;
            kb.key = blk_radix(r, nullptr, kb, (double)top_k, &gt, hist, sh);
            kb.idx = blk_first(r, nullptr, kb, kb.key, true, gt, (double)top_k, true, sh);
        }
        if (kind == 1 && top_p < 1) {
            double target = top_p * (double)blk_mass(r, w, kb, 0u, false, sh);
            u64 above;
            sbound pb;
            pb.key = blk_radix(r, &w, kb, target, &above, hist, sh);
            pb.idx = blk_first(r, &w, kb, pb.key, true, above, target, true, sh);
            kb = pb;
        }
        u64 total = w.wmax > 0 ? blk_mass(r, w, kb, 0u, false, sh) : 0ull;
        i64 pick =
            total > 0 ? blk_first(r, &w, kb, 0u, false, 0ull, u * (double)total, false, sh) : -1;
        if (threadIdx.x == 0) out[i] = pick >= 0 ? pick : first_max;
        __syncthreads();
    }
}

/* out row i: the k first entries of row i of x (rows, V) in the order. */
extern "C" __global__ void sg_data_topk(i64 *out, const void *x, int dt, i64 rows, i64 V, i64 k) {
    pdl_begin();
    i64 step = (i64)blockDim.x * gridDim.x;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < rows; i += step) {
        srow r = {x, dt, i * V, V};
        sbound prev = {0xffffffffu, -1};
        bool first = true;
        for (i64 s = 0; s < k; s++) {
            i64 best = -1;
            u32 bk = 0;
            for (i64 j = 0; j < V; j++) {
                u32 key = order_key(row_at(r, j));
                bool after = first || key < prev.key || (key == prev.key && j > prev.idx);
                if (after && (best < 0 || key > bk)) best = j, bk = key;
            }
            out[i * k + s] = best;
            prev.key = bk, prev.idx = best;
            first = false;
        }
    }
}

/* The same for k <= TOPK_BLK, a block of SB threads a row: the boundary of
 * the first k entries as sg_data_sample finds it, the k entries it keeps
 * gathered in index order into shared memory (each thread's segment at its
 * scanned offset), a bitonic sort of them by the order (larger key first,
 * then lower index), written out. */
#define TOPK_BLK 2048

extern "C" __global__ void __launch_bounds__(SB)
    sg_data_topk_blk(i64 *out, const void *x, int dt, i64 rows, i64 V, i64 k, int staged) {
    pdl_begin();
    __shared__ u64 sh[SB];
    __shared__ u32 hist[512];
    __shared__ u32 skey[TOPK_BLK], sidx[TOPK_BLK];
    SG_DYN_SMEM(uint4, stage);
    int n = 1;
    while (n < k) n <<= 1;
    for (i64 i = blockIdx.x; i < rows && k > 0; i += gridDim.x) {
        const srow r = row_of(x, dt, i, V, (unsigned char *)stage, staged);
        sbound kb = {0u, V};
        if (k < V) {
            u64 gt;
            kb.key = blk_radix(r, nullptr, kb, (double)k, &gt, hist, sh);
            kb.idx = blk_first(r, nullptr, kb, kb.key, true, gt, (double)k, true, sh);
        }
        i64 seg = (V + SB - 1) / SB, lo = threadIdx.x * seg, hi = lo + seg < V ? lo + seg : V;
        u64 c = 0;
        for (i64 j = lo; j < hi; j++) c += kept(kb, order_key(row_at(r, j)), j);
        u64 at = blk_scan(c, sh);
        for (i64 j = lo; j < hi; j++) {
            u32 key = order_key(row_at(r, j));
            if (kept(kb, key, j)) skey[at] = key, sidx[at] = (u32)j, at++;
        }
        for (int e = (int)k + threadIdx.x; e < n; e += SB) skey[e] = 0u, sidx[e] = 0xffffffffu;
        __syncthreads();
        for (int size = 2; size <= n; size <<= 1)
            for (int stride = size >> 1; stride > 0; stride >>= 1) {
                for (int e = threadIdx.x; e < n; e += SB) {
                    int f = e ^ stride;
                    if (f <= e) continue;
                    /* e before f in the order, in a run sorted that way */
                    bool ahead = skey[e] > skey[f] || (skey[e] == skey[f] && sidx[e] < sidx[f]);
                    if (ahead != ((e & size) == 0)) {
                        u32 tk = skey[e], ti = sidx[e];
                        skey[e] = skey[f], sidx[e] = sidx[f];
                        skey[f] = tk, sidx[f] = ti;
                    }
                }
                __syncthreads();
            }
        for (int e = threadIdx.x; e < k; e += SB) out[i * k + e] = (i64)sidx[e];
        __syncthreads();
    }
}

/* ------------------------------------------------------------ index_add */

__device__ __forceinline__ void store_f(void *p, i64 i, int dt, float v) {
    if (dt == DT_F32) ((float *)p)[i] = v;
    else ((u16 *)p)[i] = (u16)(dt == DT_F16 ? f2h(v) : f2bf(v));
}

/* Lane e of an index_add's walk (a position off dim): its offsets in dst
 * and src. */
__device__ __forceinline__ void lane_offsets(const dt_args &a, i64 e, i64 *doff, i64 *soff) {
    i64 rem = e, d0 = 0, s0 = 0;
    for (int d = a.ndim - 1; d >= 0; d--) {
        i64 size = a.shape[d], c = rem % size;
        rem /= size;
        d0 += c * a.dstride[d];
        s0 += c * a.sstride[d];
    }
    *doff = d0, *soff = s0;
}

/*
 * dst[.., idx[j], ..] += src[.., j, ..] (the gradient of embedding and
 * index_select) where the sorts do not apply (cuda_data.c: index_add).
 * One thread per lane (a position off dim; the walk has shape[dim] 1)
 * walks j in order, so
 * repeated indices add up in one fixed order: deterministic, with no
 * atomics; f16 and bf16 round after each row here (the header says so).
 * count is idx's length, jstride src's stride along dim, sel_stride dst's.
 */
extern "C" __global__ void sg_data_index_add(const dt_args a, int dt) {
    pdl_begin();
    i64 step = (i64)blockDim.x * gridDim.x;
    for (i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x; e < a.n; e += step) {
        i64 doff, soff;
        lane_offsets(a, e, &doff, &soff);
        for (i64 j = 0; j < a.count; j++) {
            i64 v = read_index(a.idx, a.idx_is_i64, j * a.istride[0]);
            if (v < 0 || v >= a.limit) continue;
            i64 at = doff + v * a.sel_stride;
            store_f(a.dst, at, dt, ld_float(a.dst, dt, at) + ld_float(a.src, dt, soff + j * a.jstride));
        }
    }
}

/*
 * index_add in parallel, in four launches (cuda_data.c: index_add): zero
 * the ranks; sg_data_index_rank gives each position j its rank in the
 * order of (index, j) (out-of-range indices as -1, first), each block
 * counting one slice of the positions with integer atomics (exact);
 * sg_data_index_order puts j and its index at that rank (a stable sort);
 * sg_data_index_add_runs has one thread per (run of equal indices,
 * RUN_LANES lanes) add the run's rows of src in position order to each
 * lane's value of dst in f32 and
 * store once (f32 gives the sequential loop's result bit for bit; f16 and
 * bf16 round once, not per row). No two threads write one element and the
 * order of every sum is fixed: deterministic. Scratch: a.last = ranks (count), a.idx64 = the
 * sorted indices (count) then the positions (count).
 */
#define RANK_TILE 256
#define RUN_LANES 4    /* lanes a thread of sg_data_index_add_runs takes */
#define RANK_SLICE 512 /* positions one block compares against */

__device__ __forceinline__ i64 index_at(const dt_args &a, i64 j) {
    i64 v = read_index(a.idx, a.idx_is_i64, j * a.istride[0]);
    return v < 0 || v >= a.limit ? -1 : v;
}

extern "C" __global__ void __launch_bounds__(RANK_TILE) sg_data_index_rank(const dt_args a) {
    pdl_begin();
    __shared__ i64 tile[RANK_TILE];
    i64 j = (i64)blockIdx.x * RANK_TILE + threadIdx.x, L = a.count;
    i64 v = j < L ? index_at(a, j) : 0;
    i64 lo = (i64)blockIdx.y * RANK_SLICE, hi = lo + RANK_SLICE < L ? lo + RANK_SLICE : L;
    u64 rank = 0;
    for (i64 t0 = lo; t0 < hi; t0 += RANK_TILE) {
        i64 i = t0 + threadIdx.x;
        if (i < hi) tile[threadIdx.x] = index_at(a, i);
        __syncthreads();
        int n = hi - t0 < RANK_TILE ? (int)(hi - t0) : RANK_TILE;
        for (int u = 0; u < n; u++) {
            i64 w = tile[u];
            rank += w < v || (w == v && t0 + u < j);
        }
        __syncthreads();
    }
    if (j < L && rank) atomicAdd((unsigned long long *)&a.last[j], (unsigned long long)rank);
}

extern "C" __global__ void sg_data_index_order(const dt_args a) {
    pdl_begin();
    i64 step = (i64)blockDim.x * gridDim.x, L = a.count;
    for (i64 j = (i64)blockIdx.x * blockDim.x + threadIdx.x; j < L; j += step) {
        i64 r = (i64)a.last[j];
        a.idx64[r] = index_at(a, j);
        a.idx64[L + r] = j;
    }
}

/*
 * The same stable order for more positions than the rank pass takes
 * (cuda_data.c: RANK_MAX): a least-significant-digit radix sort of the keys
 * index + 1 (0 for an index out of range) with the positions as values,
 * 8 bits a pass, in three launches a pass over tiles of RADIX_TILE
 * positions: sg_data_radix_count counts each tile's digits, sg_data_radix_scan
 * (a block a digit) turns a digit's counts over the tiles into their
 * exclusive prefix and the digit's total, and sg_data_radix_place puts each
 * position at (the totals of the smaller digits) + (its digit's prefix at
 * its tile) + (the earlier positions of its tile with that digit). Each
 * pass keeps the order of equal digits (stable), so after the last one the
 * positions are in (index, position) order, the order the rank pass gives;
 * the last pass writes it where sg_data_index_add_runs reads it. Counts
 * are integers: no order of adds can change them. Shared memory and
 * barriers only, no warp intrinsics.
 */
#define RADIX_TILE 2048 /* positions a block counts and places: 8 rounds of 256 */

/* Position j's key: from the index in the first pass, else from kin. */
__device__ __forceinline__ u32 radix_key(const dt_args &a, const u32 *kin, i64 j) {
    return kin ? kin[j] : (u32)(index_at(a, j) + 1);
}

extern "C" __global__ void __launch_bounds__(256)
    sg_data_radix_count(const dt_args a, const u32 *kin, u32 *hist, int shift, i64 ntiles) {
    pdl_begin();
    __shared__ u32 cnt[256];
    cnt[threadIdx.x] = 0;
    __syncthreads();
    i64 j0 = (i64)blockIdx.x * RADIX_TILE, L = a.count;
    for (int r = 0; r < RADIX_TILE / 256; r++) {
        i64 j = j0 + r * 256 + threadIdx.x;
        if (j < L) atomicAdd(&cnt[(radix_key(a, kin, j) >> shift) & 255u], 1u);
    }
    __syncthreads();
    hist[(i64)threadIdx.x * ntiles + blockIdx.x] = cnt[threadIdx.x];
}

/* Block d: digit d's counts over the tiles, in place, into their exclusive
 * prefix; the sum into total[d]. */
extern "C" __global__ void __launch_bounds__(256)
    sg_data_radix_scan(u32 *hist, u32 *total, i64 ntiles) {
    pdl_begin();
    __shared__ u32 s[256];
    u32 *row = hist + (i64)blockIdx.x * ntiles, carry = 0;
    for (i64 b0 = 0; b0 < ntiles; b0 += 256) {
        i64 b = b0 + threadIdx.x;
        u32 v = b < ntiles ? row[b] : 0, x = v;
        s[threadIdx.x] = x;
        __syncthreads();
        for (int off = 1; off < 256; off <<= 1) { /* inclusive scan of the chunk */
            u32 y = threadIdx.x >= (unsigned)off ? s[threadIdx.x - off] : 0;
            __syncthreads();
            x += y;
            s[threadIdx.x] = x;
            __syncthreads();
        }
        if (b < ntiles) row[b] = carry + x - v;
        carry += s[255];
        __syncthreads();
    }
    if (threadIdx.x == 0) total[blockIdx.x] = carry;
}

/* kout/pout: the keys and positions in this pass's order; in the last pass
 * (kout NULL) the indices and positions as int64 into a.idx64, as
 * sg_data_index_order writes them. pin NULL: the positions are 0, 1, ... */
extern "C" __global__ void __launch_bounds__(256)
    sg_data_radix_place(const dt_args a, const u32 *kin, const u32 *pin, u32 *kout, u32 *pout,
                        const u32 *hist, const u32 *total, int shift, i64 ntiles) {
    pdl_begin();
    __shared__ u32 base[256], dg[256];
    unsigned t = threadIdx.x;
    u32 x = total[t];
    base[t] = x;
    __syncthreads();
    for (int off = 1; off < 256; off <<= 1) { /* the smaller digits' totals */
        u32 y = t >= (unsigned)off ? base[t - off] : 0;
        __syncthreads();
        x += y;
        base[t] = x;
        __syncthreads();
    }
    u32 below = x - total[t];
    __syncthreads();
    base[t] = below + hist[(i64)t * ntiles + blockIdx.x];
    i64 j0 = (i64)blockIdx.x * RADIX_TILE, L = a.count;
    for (int r = 0; r < RADIX_TILE / 256; r++) {
        i64 j = j0 + r * 256 + t;
        u32 key = j < L ? radix_key(a, kin, j) : 0, d = j < L ? (key >> shift) & 255u : 256u;
        dg[t] = d;
        __syncthreads();
        u32 before = 0, same = 0; /* this round's positions with digit d: before t, in all */
        for (unsigned u = 0; u < 256; u++) {
            bool eq = dg[u] == d;
            same += eq;
            before += eq && u < t;
        }
        u32 at = d < 256 ? base[d] + before : 0;
        __syncthreads();
        if (d < 256 && before == 0) base[d] += same; /* one thread a digit */
        if (d < 256) {
            u32 pos = pin ? pin[j] : (u32)j;
            if (kout) {
                kout[at] = key, pout[at] = pos;
            } else {
                a.idx64[at] = (i64)key - 1;
                a.idx64[L + at] = pos;
            }
        }
        __syncthreads();
    }
}

/* blockIdx.x * blockDim.x + threadIdx.x: the lane; blockIdx.y steps
 * through sorted positions, and the first of each run adds the run. */
extern "C" __global__ void sg_data_index_add_runs(const dt_args a, int dt) {
    pdl_begin();
    /* A thread takes RUN_LANES lanes, blockDim apart: a block covers 768
     * lanes once (GPT-2's rows), and each position's loads are in flight
     * together, four positions at a time (a long run of a narrow table).
     * Each lane adds its run in position order. */
    i64 base = (i64)blockIdx.x * blockDim.x * RUN_LANES + threadIdx.x, L = a.count;
    i64 doff[RUN_LANES], soff[RUN_LANES];
    int nl = 0;
    for (; nl < RUN_LANES; nl++) {
        i64 lane = base + (i64)nl * blockDim.x;
        if (lane >= a.n) break;
        lane_offsets(a, lane, &doff[nl], &soff[nl]);
    }
    if (nl == 0) return;
    const i64 *key = a.idx64, *pos = a.idx64 + L;
    for (i64 r = blockIdx.y; r < L; r += gridDim.y) {
        i64 v = key[r];
        if (v < 0 || (r > 0 && key[r - 1] == v)) continue;
        i64 end = r + 1;
        while (end < L && key[end] == v) end++;
        float acc[RUN_LANES];
        for (int q = 0; q < RUN_LANES; q++)
            if (q < nl) acc[q] = ld_float(a.dst, dt, doff[q] + v * a.sel_stride);
        i64 k = r;
        for (; k + 4 <= end; k += 4) { /* four positions' loads in flight, added in order */
            float x[4][RUN_LANES];
            for (int u = 0; u < 4; u++) {
                i64 row = pos[k + u] * a.jstride;
                for (int q = 0; q < RUN_LANES; q++)
                    if (q < nl) x[u][q] = ld_float(a.src, dt, soff[q] + row);
            }
            for (int q = 0; q < RUN_LANES; q++)
                if (q < nl) acc[q] = (((acc[q] + x[0][q]) + x[1][q]) + x[2][q]) + x[3][q];
        }
        for (; k < end; k++) {
            i64 row = pos[k] * a.jstride;
            for (int q = 0; q < RUN_LANES; q++)
                if (q < nl) acc[q] += ld_float(a.src, dt, soff[q] + row);
        }
        for (int q = 0; q < RUN_LANES; q++)
            if (q < nl) store_f(a.dst, doff[q] + v * a.sel_stride, dt, acc[q]);
    }
}
