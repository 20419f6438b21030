/* SPDX-License-Identifier: MIT */
/*
 * cpu_reduce.c -- the eager CPU kernels of the reduce family: sum, mean,
 * max, min, var and argmax over any set of dims of a tensor of any strides.
 *
 * The node convention (capture/ops_reduce.c): node.mask holds the reduced
 * input dims; node.out has the *keepdim* shape (the input's ndim, reduced
 * dims of size 1); VAR's correction is node.i[0]; ARGMAX writes the
 * row-major position of the maximum within the reduced dims.
 *
 * The reduced dims form a sub-space of L elements, always walked in
 * row-major order, so "the first maximum wins" is simply the order of the
 * walk; the kept dims index the M outputs. Two loop orders:
 *  - rows: for each output, walk its L elements in tiles along the last
 *    reduced dim. Best when that dim has the smallest stride (a sum over the
 *    last dim of a contiguous tensor).
 *  - lanes: for a tile of up to SG__TILE outputs along one kept dim (the
 *    one of smallest stride), walk the reduced positions and fold a whole
 *    tile at each, so that a sum over dim 0 of a contiguous matrix reads
 *    memory in order.
 * With fewer outputs (or tiles) than threads, the reduced range is also cut
 * into P chunks; each folds into a partial, and the partials merge in chunk
 * order (sums add, var merges by Chan's formula, max keeps the earlier on
 * ties), so a few outputs over many elements still use every thread.
 *
 * Floats fold in double and integers in int64 (integer sums wrap, as in
 * PyTorch). NaN propagates through max and min, and argmax takes NaN as the
 * maximum (the first NaN wins), as PyTorch does. f16/bf16 results round
 * once, at the store.
 */
#include "cpu.h"

/* What one pass folds: var runs FOLD_SUM, then FOLD_SQDEV about the mean. */
enum fold { FOLD_SUM, FOLD_SQDEV, FOLD_MAX, FOLD_MIN };

/* A partial result over part of one output's reduced range. */
typedef struct part {
    double f;    /* float domain: the sum, or the best value so far */
    double m2;   /* var: sum of squared deviations from `mean` */
    double mean; /* var: the mean of the elements folded (set between passes) */
    int64_t i;   /* int domain: the sum, or the best value so far */
    int64_t at;  /* position of the best value in the reduced range */
    int64_t n;   /* elements folded */
} part;

/* The geometry of one reduction, with size-1 dims dropped. */
typedef struct geom {
    sg__op op;
    enum fold fold; /* the (first) pass */
    bool ints;      /* fold in int64 */
    int64_t corr;   /* var's correction */
    const void *x;
    void *y;
    sg_dtype xdt, ydt;
    int64_t xbase, ybase; /* element offsets of x and out */
    int nk, nr;           /* kept and reduced dims */
    int64_t ksize[SG_MAX_DIMS], kxs[SG_MAX_DIMS], kys[SG_MAX_DIMS];
    int64_t rsize[SG_MAX_DIMS], rxs[SG_MAX_DIMS];
    int64_t M, L;
    int lane;       /* the kept dim of the lanes order, or -1 for rows */
    int64_t nlane;  /* outputs along the lane dim (1 for rows) */
    int64_t ntiles; /* tiles per lane run (1 for rows) */
    int64_t nouter; /* M / nlane */
    int64_t P;      /* chunks of the reduced range */
} geom;

/* ------------------------------------------------------------ folds */

/* Fold n values at positions pos, pos+1, ... of one output's range into p. */
static void fold_row_f(enum fold how, const float *v, int n, int64_t pos, part *p) {
    int k = 0;
    if (how == FOLD_SUM || how == FOLD_SQDEV) {
        /* Four sums side by side: the adds no longer wait on each other. */
        double m = how == FOLD_SQDEV ? p->mean : 0.0, s[4] = {0, 0, 0, 0};
        if (how == FOLD_SUM) {
            for (; k + 4 <= n; k += 4)
                for (int u = 0; u < 4; u++) s[u] += v[k + u];
            for (; k < n; k++) s[0] += v[k];
            p->f += (s[0] + s[1]) + (s[2] + s[3]);
            p->n += n;
        } else {
            for (; k + 4 <= n; k += 4)
                for (int u = 0; u < 4; u++) s[u] += (v[k + u] - m) * (v[k + u] - m);
            for (; k < n; k++) s[0] += (v[k] - m) * (v[k] - m);
            p->m2 += (s[0] + s[1]) + (s[2] + s[3]);
        }
        return;
    }
    if (p->n == 0) {
        p->f = v[0];
        p->at = pos;
        k = 1;
    }
    double b = p->f;
    int64_t at = p->at;
    /* Once b is NaN it stays: NaN is the maximum (and minimum), first one wins. */
    if (how == FOLD_MAX) {
        for (; k < n; k++)
            if (b == b && (v[k] > b || v[k] != v[k])) b = v[k], at = pos + k;
    } else {
        for (; k < n; k++)
            if (b == b && (v[k] < b || v[k] != v[k])) b = v[k], at = pos + k;
    }
    p->f = b;
    p->at = at;
    p->n += n;
}

static void fold_row_i(enum fold how, const int64_t *v, int n, int64_t pos, part *p) {
    int k = 0;
    if (how == FOLD_SUM) {
        uint64_t s = (uint64_t)p->i; /* wraps instead of overflowing */
        for (; k < n; k++) s += (uint64_t)v[k];
        p->i = (int64_t)s;
        p->n += n;
        return;
    }
    if (p->n == 0) {
        p->i = v[0];
        p->at = pos;
        k = 1;
    }
    int64_t b = p->i, at = p->at;
    if (how == FOLD_MAX) {
        for (; k < n; k++)
            if (v[k] > b) b = v[k], at = pos + k;
    } else {
        for (; k < n; k++)
            if (v[k] < b) b = v[k], at = pos + k;
    }
    p->i = b;
    p->at = at;
    p->n += n;
}

/*
 * The partials of a tile of lanes, as arrays so that the folds vectorize.
 * Every lane folds at every position, so they share one count.
 */
typedef struct lanes {
    double f[SG__TILE], m2[SG__TILE], mean[SG__TILE];
    int64_t i[SG__TILE], at[SG__TILE];
    int64_t n;
} lanes;

/* Fold one value per lane (v[k] into lane k), all at position pos. */
static void fold_lanes_f(enum fold how, const float *v, int n, int64_t pos, lanes *p) {
    if (how == FOLD_SQDEV) {
        for (int k = 0; k < n; k++) p->m2[k] += (v[k] - p->mean[k]) * (v[k] - p->mean[k]);
        return;
    }
    if (how == FOLD_SUM) {
        for (int k = 0; k < n; k++) p->f[k] += v[k];
    } else if (p->n == 0) {
        for (int k = 0; k < n; k++) p->f[k] = v[k], p->at[k] = pos;
    } else if (how == FOLD_MAX) {
        for (int k = 0; k < n; k++) {
            double b = p->f[k];
            if (b == b && (v[k] > b || v[k] != v[k])) p->f[k] = v[k], p->at[k] = pos;
        }
    } else {
        for (int k = 0; k < n; k++) {
            double b = p->f[k];
            if (b == b && (v[k] < b || v[k] != v[k])) p->f[k] = v[k], p->at[k] = pos;
        }
    }
    p->n++;
}

static void fold_lanes_i(enum fold how, const int64_t *v, int n, int64_t pos, lanes *p) {
    SG_ASSERT(how != FOLD_SQDEV); /* var is float only */
    if (how == FOLD_SUM) {
        for (int k = 0; k < n; k++) p->i[k] = (int64_t)((uint64_t)p->i[k] + (uint64_t)v[k]);
    } else if (p->n == 0) {
        for (int k = 0; k < n; k++) p->i[k] = v[k], p->at[k] = pos;
    } else if (how == FOLD_MAX) {
        for (int k = 0; k < n; k++)
            if (v[k] > p->i[k]) p->i[k] = v[k], p->at[k] = pos;
    } else {
        for (int k = 0; k < n; k++)
            if (v[k] < p->i[k]) p->i[k] = v[k], p->at[k] = pos;
    }
    p->n++;
}

/* Merge b, the partial of a later chunk, into a. */
static void merge(const geom *g, part *a, const part *b) {
    if (b->n == 0) return;
    if (a->n == 0) {
        *a = *b;
        return;
    }
    if (g->op == SG__OP_VAR) { /* Chan et al.: combine two (n, mean, M2) */
        double na = (double)a->n, nb = (double)b->n, d = b->f / nb - a->f / na;
        a->m2 += b->m2 + d * d * (na * nb / (na + nb));
        a->f += b->f;
    } else if (g->fold == FOLD_SUM) {
        a->f += b->f;
        a->i = (int64_t)((uint64_t)a->i + (uint64_t)b->i);
    } else if (g->ints) {
        bool better = g->fold == FOLD_MAX ? b->i > a->i : b->i < a->i;
        if (better) a->i = b->i, a->at = b->at;
    } else {
        double x = a->f, y = b->f;
        bool better = x == x && (y != y || (g->fold == FOLD_MAX ? y > x : y < x));
        if (better) a->f = y, a->at = b->at;
    }
    a->n += b->n;
}

/* Write the final value of one output from its merged partial. */
static void store(const geom *g, const part *p, int64_t yoff) {
    double v;
    switch (g->op) {
    case SG__OP_ARGMAX: sg__sti(g->y, g->ydt, yoff, p->at); return;
    case SG__OP_MEAN: v = g->L ? p->f / (double)g->L : NAN; break;
    case SG__OP_VAR: {
        /* PyTorch's divisor: max(0, N - correction); 0 gives inf, or NaN for 0/0. */
        double den = (double)(g->L - g->corr);
        v = den > 0 ? p->m2 / den : p->m2 > 0 ? INFINITY : NAN;
        break;
    }
    default:
        if (g->ints) {
            sg__sti(g->y, g->ydt, yoff, p->i);
            return;
        }
        v = p->f;
        break;
    }
    sg__stf(g->y, g->ydt, yoff, (float)v);
}

/* ------------------------------------------------------------ walks */

/* Fold positions [lo, hi) of the reduced range of the output whose first
 * element is at x offset base, in tiles along the last reduced dim. */
static void walk_row(const geom *g, int64_t base, int64_t lo, int64_t hi, enum fold how,
                     part *p) {
    float tf[SG__TILE];
    int64_t ti[SG__TILE];
    int nr = g->nr;
    int64_t last = g->rsize[nr - 1], ls = g->rxs[nr - 1];
    for (int64_t pos = lo; pos < hi;) {
        int64_t q = pos / last, c = pos % last, off = base + c * ls;
        for (int d = nr - 2; d >= 0; d--) {
            off += (q % g->rsize[d]) * g->rxs[d];
            q /= g->rsize[d];
        }
        int64_t end = pos - c + last < hi ? pos - c + last : hi;
        while (pos < end) {
            int len = (int)(end - pos < SG__TILE ? end - pos : SG__TILE);
            const void *src = sg__at((void *)g->x, g->xdt, off);
            if (g->ints) {
                sg__gather_i(src, g->xdt, ls, len, ti);
                fold_row_i(how, ti, len, pos, p);
            } else {
                sg__gather_f(src, g->xdt, ls, len, tf);
                fold_row_f(how, tf, len, pos, p);
            }
            pos += len;
            off += len * ls;
        }
    }
}

/* Fold positions [lo, hi) of the reduced range into the `len` lanes whose
 * first element is at x offset base: one tile gather per position. */
static void walk_lanes(const geom *g, int64_t base, int64_t lo, int64_t hi, enum fold how,
                       int len, lanes *p) {
    if (lo >= hi) return;
    float tf[SG__TILE];
    int64_t ti[SG__TILE], idx[SG_MAX_DIMS], off = base, q = lo;
    int nr = g->nr;
    int64_t ls = g->kxs[g->lane];
    for (int d = nr - 1; d >= 0; d--) {
        idx[d] = q % g->rsize[d];
        q /= g->rsize[d];
        off += idx[d] * g->rxs[d];
    }
    for (int64_t pos = lo; pos < hi; pos++) {
        const void *src = sg__at((void *)g->x, g->xdt, off);
        if (g->ints) {
            sg__gather_i(src, g->xdt, ls, len, ti);
            fold_lanes_i(how, ti, len, pos, p);
        } else {
            sg__gather_f(src, g->xdt, ls, len, tf);
            fold_lanes_f(how, tf, len, pos, p);
        }
        for (int d = nr - 1; d >= 0; d--) { /* odometer step */
            off += g->rxs[d];
            if (++idx[d] < g->rsize[d]) break;
            off -= g->rsize[d] * g->rxs[d];
            idx[d] = 0;
        }
    }
}

/* x and out offsets of outer index o over the kept dims other than `skip`. */
static void kept_offsets(const geom *g, int64_t o, int skip, int64_t *xo, int64_t *yo) {
    int64_t x = g->xbase, y = g->ybase;
    for (int j = g->nk - 1; j >= 0; j--) {
        if (j == skip) continue;
        int64_t i = o % g->ksize[j];
        o /= g->ksize[j];
        x += i * g->kxs[j];
        y += i * g->kys[j];
    }
    *xo = x;
    *yo = y;
}

/* One work item of the rows order: one output, one chunk. */
static part item_row(const geom *g, int64_t xo, int64_t lo, int64_t hi) {
    part p = {0};
    walk_row(g, xo, lo, hi, g->fold, &p);
    if (g->op == SG__OP_VAR) { /* second pass, about this chunk's own mean */
        p.mean = p.n ? p.f / (double)p.n : 0.0;
        walk_row(g, xo, lo, hi, FOLD_SQDEV, &p);
    }
    return p;
}

/* One work item of the lanes order: len outputs, one chunk, into p. */
static void item_lanes(const geom *g, int64_t xo, int64_t lo, int64_t hi, int len, lanes *p) {
    memset(p->f, 0, (size_t)len * sizeof(double));
    memset(p->m2, 0, (size_t)len * sizeof(double));
    memset(p->i, 0, (size_t)len * sizeof(int64_t));
    memset(p->at, 0, (size_t)len * sizeof(int64_t));
    p->n = 0;
    walk_lanes(g, xo, lo, hi, g->fold, len, p);
    if (g->op == SG__OP_VAR) {
        for (int k = 0; k < len; k++) p->mean[k] = p->n ? p->f[k] / (double)p->n : 0.0;
        walk_lanes(g, xo, lo, hi, FOLD_SQDEV, len, p);
    }
}

/* A work item: an output (rows) or a tile of outputs (lanes), and one chunk
 * of the reduced range. With one chunk the result is stored; else the
 * partials go to scratch, laid out [outer][lane][chunk]. */
static void run_item(const geom *g, int64_t item, part *scratch) {
    int64_t w = item / g->P, c = item % g->P;
    int64_t outer = w / g->ntiles, t0 = (w % g->ntiles) * SG__TILE;
    int64_t lo = g->L * c / g->P, hi = g->L * (c + 1) / g->P;
    int64_t xo, yo;
    kept_offsets(g, outer, g->lane, &xo, &yo);
    if (g->lane < 0) {
        part p = item_row(g, xo, lo, hi);
        if (g->P == 1)
            store(g, &p, yo);
        else
            scratch[outer * g->P + c] = p;
        return;
    }
    lanes p;
    int64_t lxs = g->kxs[g->lane], lys = g->kys[g->lane];
    int len = (int)(g->nlane - t0 < SG__TILE ? g->nlane - t0 : SG__TILE);
    item_lanes(g, xo + t0 * lxs, lo, hi, len, &p);
    for (int k = 0; k < len; k++) {
        part q = {p.f[k], p.m2[k], p.mean[k], p.i[k], p.at[k], p.n};
        if (g->P == 1)
            store(g, &q, yo + (t0 + k) * lys);
        else
            scratch[(outer * g->nlane + t0 + k) * g->P + c] = q;
    }
}

/* ------------------------------------------------------------ setup */

static void build(geom *g, const sg__node *n) {
    const sg_tensor *x = n->in[0], *y = n->out;
    memset(g, 0, sizeof *g);
    g->op = n->op;
    g->ints = !sg__dtype_is_float(x->dtype);
    g->fold = n->op == SG__OP_MAX || n->op == SG__OP_ARGMAX ? FOLD_MAX
            : n->op == SG__OP_MIN                           ? FOLD_MIN
                                                            : FOLD_SUM;
    g->corr = n->i[0];
    g->x = x->st->data, g->xdt = x->dtype, g->xbase = x->offset;
    g->y = y->st->data, g->ydt = y->dtype, g->ybase = y->offset;
    sg__rdims rd;
    sg__reduce_dims(x, y, n->mask, &rd);
    memcpy(g->ksize, rd.ksize, sizeof rd.ksize);
    memcpy(g->kxs, rd.kxs, sizeof rd.kxs);
    memcpy(g->kys, rd.kys, sizeof rd.kys);
    memcpy(g->rsize, rd.rsize, sizeof rd.rsize);
    memcpy(g->rxs, rd.rxs, sizeof rd.rxs);
    g->M = rd.M, g->L = rd.L, g->nk = rd.nk, g->nr = rd.nr;
}

static int64_t iabs(int64_t v) { return v < 0 ? -v : v; }

/* Choose the loop order and the number of chunks. */
static void plan(geom *g, int nth) {
    g->lane = -1;
    if (g->nk > 0 && g->L > 0) {
        int best = 0;
        for (int j = 1; j < g->nk; j++)
            if (iabs(g->kxs[j]) <= iabs(g->kxs[best])) best = j;
        bool lanes_win = g->L == 1 || iabs(g->kxs[best]) < iabs(g->rxs[g->nr - 1]);
        if (g->ksize[best] >= 8 && lanes_win) g->lane = best;
    }
    g->nlane = g->lane >= 0 ? g->ksize[g->lane] : 1;
    g->ntiles = (g->nlane + SG__TILE - 1) / SG__TILE;
    g->nouter = g->M / g->nlane;
    int64_t items = g->nouter * g->ntiles;
    g->P = 1;
    if (nth > 1 && items < nth) {
        /* Enough chunks for every thread, none shorter than ~4k elements. */
        int64_t p = (nth + items - 1) / items, cap = g->L / 4096;
        g->P = p < cap ? p : cap < 1 ? 1 : cap;
    }
}

static sg_status check_node(sg_ctx *ctx, const sg__node *n, const geom *g) {
    const sg_tensor *x = n->in[0], *y = n->out;
    char a[SG__DESC], b[SG__DESC];
    bool ok = y->ndim == x->ndim;
    for (int d = 0; ok && d < x->ndim; d++)
        ok = y->shape[d] == ((n->mask & (1u << d)) ? 1 : x->shape[d]);
    if (!ok)
        return sg__fail(ctx, SG_ERR_INTERNAL, "cpu %s: out %s is not the keepdim shape of %s for "
                        "mask 0x%x", sg__op_name(n->op), sg__describe(y, a, sizeof a),
                        sg__describe(x, b, sizeof b), (unsigned)n->mask);
    if (g->L == 0 && g->fold != FOLD_SUM && g->M > 0)
        return sg__fail(ctx, SG_ERR_SHAPE, "sg_%s: the reduced range of %s is empty; its %s is "
                        "undefined", sg__op_name(n->op), sg__describe(x, a, sizeof a),
                        sg__op_name(n->op));
    if (g->ints && n->op != SG__OP_SUM && g->fold == FOLD_SUM)
        return sg__fail(ctx, SG_ERR_DTYPE, "sg_%s: %s is not a float tensor", sg__op_name(n->op),
                        sg__describe(x, a, sizeof a));
    return SG_OK;
}

sg_status sg__cpu_reduce(sg_ctx *ctx, const sg__node *n) {
    geom g;
    build(&g, n);
    sg_status s = check_node(ctx, n, &g);
    if (s != SG_OK || g.M == 0) return s;
    int nth = sg__cpu_threads(ctx, g.M * (g.L > 0 ? g.L : 1));
    plan(&g, nth);
    part *scratch = NULL;
    size_t nbytes = (size_t)(g.M * g.P) * sizeof(part);
    if (g.P > 1 && !(scratch = sg__alloc(ctx, nbytes)))
        return sg__fail(ctx, SG_ERR_OOM, "sg_%s: out of host memory for %lld partial results "
                        "(%zu bytes)", sg__op_name(n->op), (long long)(g.M * g.P), nbytes);
    int64_t total = g.nouter * g.ntiles * g.P;
#pragma omp parallel for num_threads(nth) if (nth > 1) schedule(static)
    for (int64_t it = 0; it < total; it++) run_item(&g, it, scratch);
    if (!scratch) return SG_OK;
    /* Few outputs (that is why there are chunks): merge them serially, in order. */
    for (int64_t o = 0; o < g.M; o++) {
        part acc = scratch[o * g.P];
        for (int64_t c = 1; c < g.P; c++) merge(&g, &acc, &scratch[o * g.P + c]);
        int64_t xo, yo, li = o % g.nlane;
        kept_offsets(&g, o / g.nlane, g.lane, &xo, &yo);
        store(&g, &acc, yo + (g.lane >= 0 ? li * g.kys[g.lane] : 0));
    }
    sg__free(ctx, scratch, nbytes);
    return SG_OK;
}
