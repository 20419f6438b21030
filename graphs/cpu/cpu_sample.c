/* SPDX-License-Identifier: MIT */
/*
 * cpu_sample.c -- the CPU kernels of the sampling ops: TOPK (the indices of
 * the k largest entries of each row) and SAMPLE (one index per row drawn
 * from weights or from logits with temperature, top-k and top-p). k_data.cu
 * repeats both step for step (sg_data_topk, sg_data_sample), so that the
 * two backends pick the same indices for a seed.
 *
 * Rows are contiguous (the front-end makes them so): x is (rows, V). The
 * order of entries is by value, largest first, NaN above everything, and
 * ties by index, lowest first (torch's topk order); values compare through
 * an order-preserving u32 key of the f32 value. Nothing here needs scratch
 * memory: selections are found by a 32-pass radix search on the key, so a
 * row costs O(32 V) and a replay allocates nothing.
 *
 * SAMPLE, per row: weights w_j = x_j for kind 0 (multinomial: negative and
 * NaN weights count 0) or exp((x_j - max) / temperature) for kind 1, taken
 * as integers q_j = floor(w_j / W 2^S), W the row's largest weight and
 * S = 62 - bits(V) (so that a row's sum stays under 2^62; a weight under
 * 2^-S W counts 0): every mass below is an exact integer sum, which any
 * order of adds gives alike, so the CUDA kernel adds a row in parallel and
 * still picks what this loop picks. top_k (if > 0) first keeps the k first
 * entries in the order above and top_p (if < 1) then keeps the shortest
 * prefix of that order whose mass, as a double, reaches top_p times the
 * kept mass. The row's uniform u (53 bits of Philox block offset + row,
 * words 0 and 1) picks the first kept j, by index, whose running mass, as a
 * double, exceeds u times the kept mass. A row of no weight gives its first
 * largest entry.
 */
#include "cpu.h"

/* An order-preserving key: larger floats give larger keys; NaN the largest. */
static inline uint32_t order_key(float v) {
    if (v != v) return 0xffffffffu;
    if (v == 0) v = 0; /* -0 == +0 */
    uint32_t u;
    memcpy(&u, &v, 4);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* One row: its values as floats through the dtype. */
typedef struct row {
    const void *p;
    sg_dtype dt;
    int64_t base, V;
} row;

static inline float at(const row *r, int64_t j) { return sg__ldf(r->p, r->dt, r->base + j); }

/* Entries j kept by a boundary (key, idx): key_j > key, or key_j == key and j <= idx. */
typedef struct bound {
    uint32_t key;
    int64_t idx;
} bound;

static inline bool kept(bound b, uint32_t key, int64_t j) {
    return key > b.key || (key == b.key && j <= b.idx);
}

/* The boundary of the first k entries of the order (1 <= k <= V). */
static bound topk_bound(const row *r, int64_t k) {
    uint32_t t = 0;
    for (int bit = 31; bit >= 0; bit--) {
        uint32_t cand = t | (1u << bit);
        int64_t cnt = 0;
        for (int64_t j = 0; j < r->V; j++) cnt += order_key(at(r, j)) >= cand;
        if (cnt >= k) t = cand;
    }
    int64_t gt = 0, need, j;
    for (j = 0; j < r->V; j++) gt += order_key(at(r, j)) > t;
    need = k - gt;
    for (j = 0; j < r->V && need > 0; j++)
        if (order_key(at(r, j)) == t && --need == 0) break;
    return (bound){t, j};
}

/* What SAMPLE's weights need: kind, temperature, the row's max, its
 * largest weight W and the scale 2^S of its integers. */
typedef struct wparams {
    int kind;
    double temp, max, wmax, scale;
} wparams;

/* A multinomial weight (kind 0): x, 0 for negative and NaN, and +inf as
 * 1e300 so that the infinite entries share the row (the CUDA kernels and
 * the serial unit weigh alike). */
static inline double weight(const wparams *w, float x) {
    if (w->kind == 0) return x > 0 ? ((double)x < 1e300 ? (double)x : 1e300) : 0.0;
    return exp(((double)x - w->max) / w->temp);
}

/* The weight as the row's integer: floor(w / W 2^S); 0 for NaN. */
static inline uint64_t qweight(const wparams *w, float x) {
    double v = weight(w, x);
    return v > 0 ? (uint64_t)(v / w->wmax * w->scale) : 0;
}

/* 2^S, S = 62 - bits(V): V weights of at most 2^S sum below 2^62. */
static double mass_scale(int64_t V) {
    int bits = 0;
    while (bits < 62 && ((uint64_t)V >> bits) != 0) bits++;
    return ldexp(1.0, 62 - bits);
}

/* The mass of the kept entries with key >= lo (and the top-k bound). */
static uint64_t mass_from(const row *r, const wparams *w, bound kb, uint32_t lo, bool strict) {
    uint64_t m = 0;
    for (int64_t j = 0; j < r->V; j++) {
        float x = at(r, j);
        uint32_t key = order_key(x);
        if (kept(kb, key, j) && (strict ? key > lo : key >= lo)) m += qweight(w, x);
    }
    return m;
}

/* The boundary of the shortest prefix of the kept order with mass >= target. */
static bound topp_bound(const row *r, const wparams *w, bound kb, double target) {
    uint32_t t = 0;
    for (int bit = 31; bit >= 0; bit--) {
        uint32_t cand = t | (1u << bit);
        if ((double)mass_from(r, w, kb, cand, false) >= target) t = cand;
    }
    uint64_t acc = mass_from(r, w, kb, t, true);
    int64_t j, last = -1;
    for (j = 0; j < r->V; j++) {
        float x = at(r, j);
        if (order_key(x) != t || !kept(kb, t, j)) continue;
        last = j;
        acc += qweight(w, x);
        if ((double)acc >= target) break;
    }
    return (bound){t, j < r->V ? j : last};
}

/* The row's uniform in [0, 1) with 53 bits. */
static double row_uniform(uint64_t seed, uint64_t block) {
    uint32_t ctr[4] = {(uint32_t)block, (uint32_t)(block >> 32), 0, 0};
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)}, o[4];
    sg__philox4x32_10(ctr, key, o);
    return ((double)(o[0] >> 5) * 67108864.0 + (double)(o[1] >> 6)) * 0x1p-53;
}

static int64_t sample_row(const row *r, const sg__node *n, double u) {
    int64_t first_max = 0;
    uint32_t best = 0;
    for (int64_t j = 0; j < r->V; j++) {
        uint32_t key = order_key(at(r, j));
        if (key > best || j == 0) best = key, first_max = j;
    }
    wparams w = {.kind = (int)n->i[1], .temp = n->f[0], .max = at(r, first_max), .wmax = 0};
    for (int64_t j = 0; j < r->V; j++) {
        double v = weight(&w, at(r, j));
        if (v > w.wmax) w.wmax = v;
    }
    w.scale = mass_scale(r->V);
    int64_t top_k = n->i[0];
    bound kb = {0, r->V}; /* keeps everything */
    if (w.kind == 1 && top_k > 0 && top_k < r->V) kb = topk_bound(r, top_k);
    double top_p = n->f[1];
    if (w.kind == 1 && top_p < 1) {
        bound pb = topp_bound(r, &w, kb, top_p * (double)mass_from(r, &w, kb, 0, false));
        kb = pb; /* pb lies inside kb: its prefix is of kb's order */
    }
    uint64_t total = w.wmax > 0 ? mass_from(r, &w, kb, 0, false) : 0, cum = 0;
    double target = u * (double)total;
    int64_t pick = -1;
    for (int64_t j = 0; j < r->V && total > 0; j++) {
        float x = at(r, j);
        if (!kept(kb, order_key(x), j)) continue;
        uint64_t q = qweight(&w, x);
        if (q > 0) pick = j; /* the last with weight, should rounding leave cum <= target */
        cum += q;
        if ((double)cum > target && q > 0) break;
    }
    return pick >= 0 ? pick : first_max;
}

sg_status sg__cpu_sample(sg_ctx *ctx, const sg__node *n) {
    const sg_tensor *x = n->in[0], *rng = n->in[1], *out = n->out;
    int64_t V = x->ndim ? x->shape[x->ndim - 1] : 1,
            rows = V ? sg__numel(x->ndim, x->shape) / V : 0;
    const int64_t *rv = sg__data(rng);
    uint64_t seed = (uint64_t)rv[0], offset = (uint64_t)rv[rng->stride[0]];
    int64_t *o = sg__data(out);
    int nth = sg__cpu_threads(ctx, rows * V * 8);
#pragma omp parallel for num_threads(nth) if (nth > 1) schedule(static)
    for (int64_t i = 0; i < rows; i++) {
        row r = {sg__data(x), x->dtype, i * V, V};
        o[i] = sample_row(&r, n, row_uniform(seed, offset + (uint64_t)i));
    }
    return SG_OK;
}

/* out row i: the k first entries of x's row i in the order, in that order. */
sg_status sg__cpu_topk(sg_ctx *ctx, const sg__node *n) {
    const sg_tensor *x = n->in[0], *out = n->out;
    int64_t V = x->shape[x->ndim - 1], k = n->i[0], rows = V ? sg__numel(x->ndim, x->shape) / V : 0;
    int64_t *o = sg__data(out);
    int nth = sg__cpu_threads(ctx, rows * V * k);
#pragma omp parallel for num_threads(nth) if (nth > 1) schedule(static)
    for (int64_t i = 0; i < rows; i++) {
        row r = {sg__data(x), x->dtype, i * V, V};
        bound prev = {0xffffffffu, -1}; /* everything comes after it ... */
        bool first = true;              /* ... except that NaN at index 0 ties it */
        for (int64_t s = 0; s < k; s++) {
            int64_t best = -1;
            uint32_t bk = 0;
            for (int64_t j = 0; j < r.V; j++) {
                uint32_t key = order_key(at(&r, j));
                bool after = first || key < prev.key || (key == prev.key && j > prev.idx);
                if (after && (best < 0 || key > bk)) best = j, bk = key;
            }
            o[i * k + s] = best;
            prev = (bound){bk, best};
            first = false;
        }
    }
    return SG_OK;
}
