/* SPDX-License-Identifier: MIT */
/*
 * k_reduce.cu -- the eager CUDA kernels of the reduce family: sum, mean,
 * max, min, var and argmax over any set of dims of a strided tensor (the
 * host side, and the geometry it passes, are in cuda_reduce.c).
 *
 * The M outputs (the kept dims, row-major) and the L reduced elements of
 * each (the reduced dims, row-major: that order is argmax's position) form
 * two index spaces. A team folds one work item, an output and one chunk of
 * its reduced range: the team is one thread (when consecutive outputs lie
 * next to each other in memory), one warp, or one block of 256 threads.
 * With few outputs and a long range the range is cut into P chunks; each
 * team writes a partial, and sg_reduce_finish merges them in a fixed order.
 *
 * Semantics follow the CPU kernels (graphs/cpu/cpu_reduce.c): floats fold
 * in double, integers in int64 with wrapping sums; var is two-pass within a
 * chunk and merges chunks by Chan's formula; NaN is the maximum and the
 * minimum, and among equal values (NaNs included) the smaller position
 * wins, so the result does not depend on the order of the merges. No float
 * atomics: every result is the same bits run after run.
 *
 * NVRTC compiles this file with no include path, so it includes nothing;
 * the build puts k_prelude.cuh (types, dtypes, pdl_begin) in front of it.
 */

#define MAXD 6
#define BLOCK 256

/* The ops, as cuda_reduce.c numbers them. */
enum { OP_SUM, OP_MEAN, OP_MAX, OP_MIN, OP_VAR, OP_ARGMAX };

/* The geometry of one reduction; the same layout as struct rgeom in
 * cuda_reduce.c (8-byte fields first, so no padding differs). */
struct rgeom {
    i64 ksize[MAXD], kxs[MAXD], kys[MAXD]; /* kept dims: sizes, x and y strides */
    i64 rsize[MAXD], rxs[MAXD];            /* reduced dims: sizes, x strides */
    i64 M, L, P, corr;
    int nk, nr, team, op, xdt, ydt;
};

/* A partial result over part of one output's reduced range. */
struct part {
    double f;  /* float domain: the sum, or the best value */
    double m2; /* var: squared deviations from the chunk's mean */
    i64 i;     /* int domain: the sum, or the best value */
    i64 at;    /* position of the best value */
    i64 n;     /* elements folded */
};

/* ------------------------------------------------------------ conversions */

__device__ __forceinline__ double ldf(const void *p, int dt, i64 i) {
    switch (dt) {
    case DT_F32: return ((const float *)p)[i];
    case DT_F16: return h2f(((const u16 *)p)[i]);
    case DT_BF16: return bf2f(((const u16 *)p)[i]);
    }
    return 0.0;
}

__device__ __forceinline__ i64 ldi(const void *p, int dt, i64 i) {
    switch (dt) {
    case DT_I32: return ((const int *)p)[i];
    case DT_I64: return ((const i64 *)p)[i];
    case DT_BOOL: return ((const unsigned char *)p)[i] != 0;
    }
    return 0;
}

/* Store as the CPU's sg__stf / sg__sti do (floats saturate into ints). */
__device__ void stf(void *p, int dt, i64 i, float v) {
    switch (dt) {
    case DT_F32: ((float *)p)[i] = v; break;
    case DT_F16: ((u16 *)p)[i] = f2h(v); break;
    case DT_BF16: ((u16 *)p)[i] = f2bf(v); break;
    case DT_I32:
        ((int *)p)[i] = v != v                ? 0
                        : v >= 2147483647.0f  ? 2147483647
                        : v <= -2147483648.0f ? (-2147483647 - 1)
                                              : (int)v;
        break;
    case DT_I64:
        ((i64 *)p)[i] = v != v                ? 0
                        : v >= 9.2233720e18f  ? 9223372036854775807ll
                        : v <= -9.2233720e18f ? (-9223372036854775807ll - 1)
                                              : (i64)v;
        break;
    case DT_BOOL: ((unsigned char *)p)[i] = v != 0.0f; break;
    }
}

__device__ void sti(void *p, int dt, i64 i, i64 v) {
    switch (dt) {
    case DT_F32: ((float *)p)[i] = (float)v; break;
    case DT_F16: ((u16 *)p)[i] = f2h((float)v); break;
    case DT_BF16: ((u16 *)p)[i] = f2bf((float)v); break;
    case DT_I32: ((int *)p)[i] = (int)v; break;
    case DT_I64: ((i64 *)p)[i] = v; break;
    case DT_BOOL: ((unsigned char *)p)[i] = v != 0; break;
    }
}

/* ------------------------------------------------------------ combining */

__device__ __forceinline__ bool is_int(int dt) { return dt >= DT_I32; }

/* Does (y at position yat) beat the best so far (x at xat)? NaN beats every
 * number; equal values (or two NaNs) go to the smaller position. */
__device__ __forceinline__ bool beats_f(double y, i64 yat, double x, i64 xat, bool mx) {
    bool xn = x != x, yn = y != y;
    if (xn || yn) return yn && (!xn || yat < xat);
    if (y == x) return yat < xat;
    return mx ? y > x : y < x;
}

__device__ __forceinline__ bool beats_i(i64 y, i64 yat, i64 x, i64 xat, bool mx) {
    if (y == x) return yat < xat;
    return mx ? y > x : y < x;
}

/* a and b fold disjoint elements: combine them. Sums add (var's sums and
 * squared deviations too: within a chunk they share the chunk's mean). */
__device__ __forceinline__ part comb(part a, part b, int op, bool ints) {
    if (op == OP_SUM || op == OP_MEAN || op == OP_VAR) {
        a.f += b.f;
        a.m2 += b.m2;
        a.i = (i64)((u64)a.i + (u64)b.i);
        a.n += b.n;
        return a;
    }
    if (b.n == 0) return a;
    if (a.n == 0) return b;
    bool mx = op != OP_MIN;
    bool take = ints ? beats_i(b.i, b.at, a.i, a.at, mx) : beats_f(b.f, b.at, a.f, a.at, mx);
    if (take) a.f = b.f, a.i = b.i, a.at = b.at;
    a.n += b.n;
    return a;
}

__device__ __forceinline__ part shfl(part p, int m) {
    part q;
    q.f = __shfl_xor_sync(0xffffffffu, p.f, m);
    q.m2 = __shfl_xor_sync(0xffffffffu, p.m2, m);
    q.i = __shfl_xor_sync(0xffffffffu, p.i, m);
    q.at = __shfl_xor_sync(0xffffffffu, p.at, m);
    q.n = __shfl_xor_sync(0xffffffffu, p.n, m);
    return q;
}

/*
 * Combine the partials of a team; every thread of the team gets the result.
 * The butterfly gives both lanes of a pair the same bits (comb is
 * commutative), and a block combines its warps in a fixed order.
 */
__device__ part team_reduce(part p, int op, bool ints, int team) {
    if (team == 1) return p;
    for (int m = 16; m >= 1; m >>= 1) p = comb(p, shfl(p, m), op, ints);
    if (team == 32) return p;
    __shared__ part sh[BLOCK / 32];
    int w = threadIdx.x / 32;
    if ((threadIdx.x & 31) == 0) sh[w] = p;
    __syncthreads();
    p = sh[0];
    for (int k = 1; k < BLOCK / 32; k++) p = comb(p, sh[k], op, ints);
    __syncthreads(); /* sh is reused by the next call */
    return p;
}

/* ------------------------------------------------------------ walks */

/* x offset of reduced position q. */
__device__ __forceinline__ i64 roff(const rgeom &g, i64 q) {
    if (g.nr == 1) return q * g.rxs[0];
    i64 off = 0;
    for (int d = g.nr - 1; d >= 0; d--) {
        off += (q % g.rsize[d]) * g.rxs[d];
        q /= g.rsize[d];
    }
    return off;
}

/* Fold this thread's share (lane, lane + team, ...) of positions [lo, hi). */
__device__ part fold(const void *x, const rgeom &g, i64 xo, i64 lo, i64 hi, int lane, int team) {
    part p = {0.0, 0.0, 0, 0, 0};
    bool ints = is_int(g.xdt);
    int op = g.op == OP_ARGMAX ? OP_MAX : g.op;
    for (i64 q = lo + lane; q < hi; q += team) {
        i64 off = xo + roff(g, q);
        if (op == OP_SUM || op == OP_MEAN || op == OP_VAR) {
            if (ints)
                p.i = (i64)((u64)p.i + (u64)ldi(x, g.xdt, off));
            else
                p.f += ldf(x, g.xdt, off);
            p.n++;
            continue;
        }
        part e;
        e.n = 1, e.at = q, e.m2 = 0.0;
        if (ints)
            e.i = ldi(x, g.xdt, off), e.f = 0.0;
        else
            e.f = ldf(x, g.xdt, off), e.i = 0;
        p = comb(p, e, op, ints);
    }
    return p;
}

/* var's second pass: squared deviations about mean. */
__device__ double sqdev(const void *x, const rgeom &g, i64 xo, i64 lo, i64 hi, int lane, int team,
                        double mean) {
    double s = 0.0;
    for (i64 q = lo + lane; q < hi; q += team) {
        double d = ldf(x, g.xdt, xo + roff(g, q)) - mean;
        s += d * d;
    }
    return s;
}

/* x and y offsets of output o (row-major over the kept dims). */
__device__ __forceinline__ void kept(const rgeom &g, i64 o, i64 *xo, i64 *yo) {
    i64 a = 0, b = 0;
    for (int j = g.nk - 1; j >= 0; j--) {
        i64 i = o % g.ksize[j];
        o /= g.ksize[j];
        a += i * g.kxs[j];
        b += i * g.kys[j];
    }
    *xo = a;
    *yo = b;
}

/* The final value of an output, as the CPU's store() writes it. */
__device__ void store(const rgeom &g, void *y, const part &p, i64 yo) {
    double v;
    switch (g.op) {
    case OP_ARGMAX: sti(y, g.ydt, yo, p.at); return;
    case OP_MEAN: v = g.L ? p.f / (double)g.L : __longlong_as_double(0x7ff8000000000000ll); break;
    case OP_VAR: {
        double den = (double)(g.L - g.corr);
        v = den > 0    ? p.m2 / den
            : p.m2 > 0 ? __longlong_as_double(0x7ff0000000000000ll)
                       : __longlong_as_double(0x7ff8000000000000ll);
        break;
    }
    default:
        if (is_int(g.xdt)) {
            sti(y, g.ydt, yo, p.i);
            return;
        }
        v = p.f;
        break;
    }
    stf(y, g.ydt, yo, (float)v);
}

/* ------------------------------------------------------------ kernels */

/*
 * One work item per team: item = c * M + o (output o, chunk c), so that
 * neighbouring threads of one-thread teams take neighbouring outputs.
 * blockDim.x is BLOCK; a block holds BLOCK / team teams. With P == 1 the
 * result is stored; else the partial goes to parts[item], so that both
 * this kernel's writes and the finishing reads are coalesced.
 */
extern "C" __global__ void sg_reduce_fold(const void *x, void *y, part *parts, rgeom g) {
    pdl_begin();
    int team = g.team, lane = threadIdx.x % team;
    i64 item = (i64)blockIdx.x * (BLOCK / team) + threadIdx.x / team;
    if (item >= g.M * g.P) return; /* the whole team leaves together */
    i64 o = item % g.M, c = item / g.M;
    i64 lo = g.L * c / g.P, hi = g.L * (c + 1) / g.P;
    i64 xo, yo;
    kept(g, o, &xo, &yo);
    bool ints = is_int(g.xdt);
    part p = team_reduce(fold(x, g, xo, lo, hi, lane, team), g.op, ints, team);
    if (g.op == OP_VAR) { /* second pass, about this chunk's own mean */
        double mean = p.n ? p.f / (double)p.n : 0.0;
        part d = {0.0, sqdev(x, g, xo, lo, hi, lane, team, mean), 0, 0, 0};
        p.m2 = team_reduce(d, OP_SUM, false, team).m2;
    }
    if (lane != 0) return;
    if (g.P == 1)
        store(g, y, p, yo);
    else
        parts[item] = p;
}

/* b merged into a (either may be empty): var by Chan et al.'s combination
 * of two (n, mean, M2), argmax as max, the rest by comb. */
__device__ __forceinline__ part merge(part a, const part &b, int op, bool ints) {
    if (b.n == 0) return a;
    if (a.n == 0) return b;
    if (op == OP_VAR) {
        double na = (double)a.n, nb = (double)b.n, d = b.f / nb - a.f / na;
        a.m2 += b.m2 + d * d * (na * nb / (na + nb));
        a.f += b.f;
        a.n += b.n;
        return a;
    }
    return comb(a, b, op == OP_ARGMAX ? OP_MAX : op, ints);
}

/*
 * Merge each output's P partials. A team of g.team threads (cuda_reduce.c:
 * a warp when there are many partials, else one thread) takes one output;
 * lane l merges chunks l, l + team, ... in order, then the lanes merge by
 * a butterfly: a fixed tree, the same bits every run.
 */
extern "C" __global__ void sg_reduce_finish(const part *parts, void *y, rgeom g) {
    pdl_begin();
    int team = g.team, lane = threadIdx.x % team;
    i64 o = ((i64)blockIdx.x * blockDim.x + threadIdx.x) / team;
    if (o >= g.M) return; /* the whole team leaves together */
    bool ints = is_int(g.xdt);
    part a = {0.0, 0.0, 0, 0, 0};
    for (i64 c = lane; c < g.P; c += team) a = merge(a, parts[c * g.M + o], g.op, ints);
    for (int m = team / 2; m >= 1; m >>= 1) a = merge(a, shfl(a, m), g.op, ints);
    if (lane != 0) return;
    i64 xo, yo;
    kept(g, o, &xo, &yo);
    store(g, y, a, yo);
}
