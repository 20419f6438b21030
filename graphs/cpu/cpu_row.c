/* SPDX-License-Identifier: MIT */
/*
 * cpu_row.c -- the eager CPU kernels of the row family: softmax and
 * log_softmax along any dim, layer_norm and rms_norm over the last dim, and
 * cross_entropy over the rows of (N, C) logits (node layouts in
 * capture/ops_rows.c), cross_entropy's gradient, and the norms' (their
 * row statistics, then the input's gradient).
 *
 * A row is every element along the op's dim for one index of the other
 * dims; rows run in parallel and may have any strides. Each row is read in
 * tiles twice: once for its statistics (max and sum of exps, rescaled as the
 * max grows, or mean and variance), once to write. The math is in double
 * (inputs are widened exactly), so the only rounding of an f16/bf16 result is
 * at its store.
 */
#include "cpu.h"

/*
 * The rows of one op, in one of two orders:
 *  - rows: sg__rows over the other dims, the row dim last; a work item is a
 *    row, read along the op's dim.
 *  - lanes (softmax only): when another dim (the lane dim) has a smaller
 *    stride than the op's dim, a work item is a tile of up to SG__TILE rows
 *    side by side along it, so that softmax over dim 0 of a contiguous
 *    matrix reads memory in order; sg__rows then runs over the other dims
 *    but the lane dim, the lane dim last.
 * Operand 0 of sg__rows is x, operand 1 the output.
 */
typedef struct rowg {
    sg__rows r;
    const void *x;
    void *y;
    sg_dtype xdt, ydt;
    int64_t xs, ys, len;  /* strides along the op's dim, and its length */
    bool lanes;           /* the lanes order */
    int64_t lxs, lys;     /* lanes: strides along the lane dim */
    int64_t nlane, ntiles; /* lanes: rows per lane run, tiles per run */
} rowg;

static int64_t iabs(int64_t v) { return v < 0 ? -v : v; }

/* The other dim to run lanes along, or -1 to read rows one by one. */
static int lane_dim(const sg_tensor *x, int dim) {
    int best = -1;
    for (int d = 0; d < x->ndim; d++) {
        if (d == dim || x->shape[d] < 2) continue;
        if (best < 0 || iabs(x->stride[d]) <= iabs(x->stride[best])) best = d;
    }
    bool wins = best >= 0 && x->shape[best] >= 8 && iabs(x->stride[best]) < iabs(x->stride[dim]);
    return wins && x->shape[dim] > 1 ? best : -1;
}

static void rows_along(rowg *g, const sg_tensor *x, const sg_tensor *y, int dim, bool lanes_ok) {
    int64_t shape[SG_MAX_DIMS], xst[SG_MAX_DIMS], yst[SG_MAX_DIMS];
    int nd = 0, lane = lanes_ok && x->ndim ? lane_dim(x, dim) : -1;
    for (int d = 0; d < x->ndim; d++)
        if (d != dim && d != lane)
            shape[nd] = x->shape[d], xst[nd] = x->stride[d], yst[nd] = y->stride[d], nd++;
    int last = lane >= 0 ? lane : dim;
    if (x->ndim == 0) /* a 0-d tensor is one row of one element */
        shape[nd] = 1, xst[nd] = yst[nd] = 0;
    else
        shape[nd] = x->shape[last], xst[nd] = x->stride[last], yst[nd] = y->stride[last];
    nd++;
    sg__rows_init(&g->r, nd, shape, 2);
    for (int d = 0; d < nd; d++) g->r.stride[0][d] = xst[d], g->r.stride[1][d] = yst[d];
    g->x = sg__data(x), g->xdt = x->dtype;
    g->y = sg__data(y), g->ydt = y->dtype;
    g->lanes = lane >= 0;
    if (g->lanes) {
        g->xs = x->stride[dim], g->ys = y->stride[dim], g->len = x->shape[dim];
        g->lxs = xst[nd - 1], g->lys = yst[nd - 1], g->nlane = shape[nd - 1];
        g->ntiles = (g->nlane + SG__TILE - 1) / SG__TILE;
    } else {
        g->xs = xst[nd - 1], g->ys = yst[nd - 1], g->len = shape[nd - 1];
        g->nlane = g->ntiles = 1;
    }
}

static int tile_len(int64_t len, int64_t j) {
    return (int)(len - j < SG__TILE ? len - j : SG__TILE);
}

/* ------------------------------------------------------------ softmax */

/*
 * The max m of a row and s = sum(exp(x - m)), in one pass of tiles: when a
 * tile raises the max, the sum so far is rescaled (the "online softmax").
 * Subtracting the max keeps exp from overflowing. -inf adds exactly 0 (a
 * masked position), even before any finite value is seen; a NaN makes s NaN,
 * and a row of only -inf gives NaN, as in PyTorch.
 */
static void row_lse(const void *x, sg_dtype dt, int64_t xs, int64_t len, double *max,
                    double *sum) {
    float t[SG__TILE];
    double m = -INFINITY, s = 0;
    for (int64_t j = 0; j < len; j += SG__TILE) {
        int n = tile_len(len, j);
        sg__gather_f(sg__at((void *)x, dt, j * xs), dt, xs, n, t);
        double tm = m;
        for (int k = 0; k < n; k++)
            if (t[k] > tm) tm = t[k];
        if (tm > m) {
            s *= exp(m - tm);
            m = tm;
        }
        for (int k = 0; k < n; k++) s += t[k] == -INFINITY ? 0.0 : exp(t[k] - m);
    }
    *max = m;
    *sum = s;
}

/* Write one tile: y = exp(x - m) / s, or (x - m) - log(s), per element k
 * with its row's m[k * ms] and s (as inv[k * ms] = 1/s, ls[k * ms] = log s). */
static void softmax_tile(float *t, int n, bool log_out, const double *m, const double *inv,
                         const double *ls, int ms) {
    if (log_out)
        for (int k = 0; k < n; k++) t[k] = (float)((t[k] - m[k * ms]) - ls[k * ms]);
    else
        for (int k = 0; k < n; k++) t[k] = (float)(exp(t[k] - m[k * ms]) * inv[k * ms]);
}

static void softmax_row(const rowg *g, bool log_out, int64_t row) {
    int64_t off[2];
    sg__rows_offsets(&g->r, row, off);
    const void *x = sg__at((void *)g->x, g->xdt, off[0]);
    void *y = sg__at(g->y, g->ydt, off[1]);
    double m, s;
    row_lse(x, g->xdt, g->xs, g->len, &m, &s);
    double inv = 1.0 / s, ls = log(s);
    float t[SG__TILE];
    for (int64_t j = 0; j < g->len; j += SG__TILE) {
        int n = tile_len(g->len, j);
        sg__gather_f(sg__at((void *)x, g->xdt, j * g->xs), g->xdt, g->xs, n, t);
        softmax_tile(t, n, log_out, &m, &inv, &ls, 0);
        sg__scatter_f(sg__at(y, g->ydt, j * g->ys), g->ydt, g->ys, n, t);
    }
}

/* A tile of rows side by side (lanes order). Each lane keeps its own online
 * max and sum, updated per element, with row_lse's rules for -inf and NaN
 * (+inf makes the sum NaN, as exp(inf - inf) does there). */
static void softmax_lanes(const rowg *g, bool log_out, int64_t item) {
    int64_t off[2], t0 = (item % g->ntiles) * SG__TILE;
    sg__rows_offsets(&g->r, item / g->ntiles, off);
    const void *x = sg__at((void *)g->x, g->xdt, off[0] + t0 * g->lxs);
    void *y = sg__at(g->y, g->ydt, off[1] + t0 * g->lys);
    int n = tile_len(g->nlane, t0);
    double m[SG__TILE], s[SG__TILE], inv[SG__TILE], ls[SG__TILE];
    float t[SG__TILE];
    for (int k = 0; k < n; k++) m[k] = -INFINITY, s[k] = 0;
    for (int64_t j = 0; j < g->len; j++) {
        sg__gather_f(sg__at((void *)x, g->xdt, j * g->xs), g->xdt, g->lxs, n, t);
        for (int k = 0; k < n; k++) {
            double v = t[k];
            if (v > m[k]) {
                s[k] = s[k] * exp(m[k] - v) + (v == INFINITY ? NAN : 1.0);
                m[k] = v;
            } else if (v != -INFINITY) {
                s[k] += exp(v - m[k]);
            }
        }
    }
    for (int k = 0; k < n; k++) inv[k] = 1.0 / s[k], ls[k] = log(s[k]);
    for (int64_t j = 0; j < g->len; j++) {
        sg__gather_f(sg__at((void *)x, g->xdt, j * g->xs), g->xdt, g->lxs, n, t);
        softmax_tile(t, n, log_out, m, inv, ls, 1);
        sg__scatter_f(sg__at(y, g->ydt, j * g->ys), g->ydt, g->lys, n, t);
    }
}

static sg_status softmax(sg_ctx *ctx, const sg__node *n) {
    rowg g;
    rows_along(&g, n->in[0], n->out, (int)n->i[0], true);
    int64_t items = g.r.nrows * g.ntiles, numel = g.r.nrows * g.nlane * g.len;
    if (numel == 0) return SG_OK;
    bool log_out = n->op == SG__OP_LOG_SOFTMAX;
    int nth = sg__cpu_threads(ctx, numel);
#pragma omp parallel for num_threads(nth) if (nth > 1) schedule(static)
    for (int64_t it = 0; it < items; it++) {
        if (g.lanes)
            softmax_lanes(&g, log_out, it);
        else
            softmax_row(&g, log_out, it);
    }
    return SG_OK;
}

/* ------------------------------------------------------------ norms */

typedef struct affine {
    const void *w, *b; /* NULL when left out */
    sg_dtype wdt, bdt;
    int64_t ws, bs;
} affine;

/*
 * layer_norm: (x - mean) / sqrt(var + eps) * w + b, population variance;
 * rms_norm: x / sqrt(mean(x^2) + eps) * w. The sums are taken about the
 * row's first element (layer_norm), so a large mean does not cancel the
 * variance away.
 */
/* The mean (0 for rms_norm) and 1 / sqrt(var + eps) of the row of len
 * elements at x, xs apart: the norms' statistics, shared with their
 * gradient's (norm_stats, norm_bwd). */
static void row_stats(const void *x, sg_dtype dt, int64_t xs, int64_t len, bool layer, double eps,
                      double *mean, double *rstd) {
    float t[SG__TILE];
    double shift = layer ? sg__ldf(x, dt, 0) : 0.0, s1 = 0, s2 = 0;
    for (int64_t j = 0; j < len; j += SG__TILE) {
        int n = tile_len(len, j);
        sg__gather_f(sg__at((void *)x, dt, j * xs), dt, xs, n, t);
        for (int k = 0; k < n; k++) {
            double d = t[k] - shift;
            s1 += d;
            s2 += d * d;
        }
    }
    double var = layer ? (s2 - s1 * s1 / (double)len) / (double)len : s2 / (double)len;
    *mean = layer ? shift + s1 / (double)len : 0.0;
    *rstd = 1.0 / sqrt((var > 0 ? var : 0) + eps);
}

static void norm_row(const rowg *g, const affine *a, bool layer, double eps, int64_t row) {
    int64_t off[2], len = g->len;
    sg__rows_offsets(&g->r, row, off);
    const void *x = sg__at((void *)g->x, g->xdt, off[0]);
    void *y = sg__at(g->y, g->ydt, off[1]);
    float t[SG__TILE], w[SG__TILE], b[SG__TILE];
    double mean, r;
    row_stats(x, g->xdt, g->xs, len, layer, eps, &mean, &r);
    for (int64_t j = 0; j < len; j += SG__TILE) {
        int n = tile_len(len, j);
        sg__gather_f(sg__at((void *)x, g->xdt, j * g->xs), g->xdt, g->xs, n, t);
        if (a->w) sg__gather_f(sg__at((void *)a->w, a->wdt, j * a->ws), a->wdt, a->ws, n, w);
        if (a->b) sg__gather_f(sg__at((void *)a->b, a->bdt, j * a->bs), a->bdt, a->bs, n, b);
        for (int k = 0; k < n; k++) {
            double v = (t[k] - mean) * r;
            if (a->w) v *= w[k];
            if (a->b) v += b[k];
            t[k] = (float)v;
        }
        sg__scatter_f(sg__at(y, g->ydt, j * g->ys), g->ydt, g->ys, n, t);
    }
}

static sg_status norm(sg_ctx *ctx, const sg__node *n) {
    const sg_tensor *x = n->in[0], *w = n->nin > 1 ? n->in[1] : NULL;
    const sg_tensor *b = n->nin > 2 ? n->in[2] : NULL;
    rowg g;
    rows_along(&g, x, n->out, x->ndim - 1, false);
    if (g.r.nrows * g.len == 0) return SG_OK;
    affine a = {0};
    if (w) a.w = sg__data(w), a.wdt = w->dtype, a.ws = w->stride[0];
    if (b) a.b = sg__data(b), a.bdt = b->dtype, a.bs = b->stride[0];
    bool layer = n->op == SG__OP_LAYER_NORM;
    double eps = n->f[0];
    int nth = sg__cpu_threads(ctx, g.r.nrows * g.len);
#pragma omp parallel for num_threads(nth) if (nth > 1) schedule(static)
    for (int64_t row = 0; row < g.r.nrows; row++) norm_row(&g, &a, layer, eps, row);
    return SG_OK;
}

/*
 * The norms' gradient (NORM_STATS, NORM_BWD; layouts in capture/ops_rows.c
 * and ops.def). NORM_STATS: a row's stats are two f32 at its offset, the
 * stats' last stride apart. NORM_BWD recomputes them per row.
 */
static sg_status norm_stats(sg_ctx *ctx, const sg__node *n) {
    const sg_tensor *x = n->in[0], *o = n->out;
    rowg g;
    rows_along(&g, x, o, x->ndim - 1, false);
    if (g.r.nrows * g.len == 0) return SG_OK;
    int64_t os = o->stride[o->ndim - 1];
    int nth = sg__cpu_threads(ctx, g.r.nrows * g.len);
#pragma omp parallel for num_threads(nth) if (nth > 1) schedule(static)
    for (int64_t row = 0; row < g.r.nrows; row++) {
        int64_t off[2];
        double mean, r;
        sg__rows_offsets(&g.r, row, off);
        row_stats(sg__at((void *)g.x, g.xdt, off[0]), g.xdt, g.xs, g.len, n->i[0] != 0, n->f[0],
                  &mean, &r);
        float *so = (float *)g.y + off[1];
        so[0] = (float)mean;
        so[os] = (float)r;
    }
    return SG_OK;
}

/* One row of NORM_BWD (operands of rw: x, the input's gradient dx, g, r):
 * its statistics (row_stats, kept in st for the column sums), the sums of
 * gw and gw * xh in double, then dx = rstd * (gw - mean(gw) - xh *
 * mean(gw * xh)) (+ r), one rounding at the store. */
static void norm_bwd_row(const sg__rows *rw, const sg__node *n, void *dx, int64_t row,
                         double *st) {
    const sg_tensor *x = n->in[0], *gt = n->in[1], *w = n->in[2], *rt = n->in[3];
    int last = x->ndim - 1;
    int64_t off[4], len = x->shape[last], xs = x->stride[last], gs = gt->stride[last];
    int64_t ws = w ? w->stride[0] : 0, rs = rt ? rt->stride[last] : 0;
    sg__rows_offsets(rw, row, off);
    const void *xr = sg__at(sg__data(x), x->dtype, off[0]);
    const void *gr = sg__at(sg__data(gt), gt->dtype, off[2]);
    const void *rr = rt ? sg__at(sg__data(rt), rt->dtype, off[3]) : NULL;
    void *yr = sg__at(dx, x->dtype, off[1]);
    bool layer = n->i[0] != 0;
    double mean, r, s1 = 0, s2 = 0;
    row_stats(xr, x->dtype, xs, len, layer, n->f[0], &mean, &r);
    st[0] = mean, st[1] = r;
    float t[SG__TILE], u[SG__TILE], v[SG__TILE], q[SG__TILE];
    for (int pass = 0; pass < 2; pass++) {
        double m1 = s1 / (double)len, m2 = s2 / (double)len;
        for (int64_t j = 0; j < len; j += SG__TILE) {
            int k = tile_len(len, j);
            sg__gather_f(sg__at((void *)xr, x->dtype, j * xs), x->dtype, xs, k, t);
            sg__gather_f(sg__at((void *)gr, gt->dtype, j * gs), gt->dtype, gs, k, u);
            if (w) sg__gather_f(sg__at(sg__data(w), w->dtype, j * ws), w->dtype, ws, k, v);
            if (rr && pass == 1)
                sg__gather_f(sg__at((void *)rr, x->dtype, j * rs), x->dtype, rs, k, q);
            for (int e = 0; e < k; e++) {
                double gw = w ? (double)u[e] * v[e] : u[e], xh = (t[e] - mean) * r;
                if (pass == 0) {
                    s1 += gw;
                    s2 += gw * xh;
                } else {
                    double d = r * (gw - (layer ? m1 : 0.0) - xh * m2);
                    t[e] = (float)(rr ? d + q[e] : d);
                }
            }
            if (pass == 1) sg__scatter_f(sg__at(yr, x->dtype, j), x->dtype, 1, k, t);
        }
    }
}

/* NORM_BWD's column sums into out at elements m (sum(g * xh)) and m + len
 * (sum(g)): a tile of columns per work item, the rows in order (the same
 * bits for any thread count), from each row's statistics in st. */
static void norm_bwd_cols(const sg__rows *rw, const sg__node *n, int64_t j0, const double *st) {
    const sg_tensor *x = n->in[0], *gt = n->in[1], *o = n->out;
    int last = x->ndim - 1;
    int64_t off[4], len = x->shape[last], xs = x->stride[last], gs = gt->stride[last];
    int64_t m = sg__numel(x->ndim, x->shape);
    int k = tile_len(len, j0);
    double aw[SG__TILE] = {0}, ab[SG__TILE] = {0};
    float t[SG__TILE], u[SG__TILE];
    for (int64_t row = 0; row < rw->nrows; row++) {
        sg__rows_offsets(rw, row, off);
        const void *xr = sg__at(sg__data(x), x->dtype, off[0] + j0 * xs);
        const void *gr = sg__at(sg__data(gt), gt->dtype, off[2] + j0 * gs);
        sg__gather_f(xr, x->dtype, xs, k, t);
        sg__gather_f(gr, gt->dtype, gs, k, u);
        double mean = n->i[0] ? st[2 * row] : 0.0, r = st[2 * row + 1];
        for (int e = 0; e < k; e++) aw[e] += (double)u[e] * ((t[e] - mean) * r), ab[e] += u[e];
    }
    float fw[SG__TILE], fb[SG__TILE];
    for (int e = 0; e < k; e++) fw[e] = (float)aw[e], fb[e] = (float)ab[e];
    sg__scatter_f(sg__at(sg__data(o), o->dtype, m + j0), o->dtype, 1, k, fw);
    sg__scatter_f(sg__at(sg__data(o), o->dtype, m + len + j0), o->dtype, 1, k, fb);
}

static sg_status norm_bwd(sg_ctx *ctx, const sg__node *n) {
    const sg_tensor *x = n->in[0], *ts[4] = {x, NULL, n->in[1], n->in[3]};
    int last = x->ndim - 1;
    int64_t len = x->shape[last], cs = 1;
    sg__rows rw; /* the rows over x's leading dims; dx row-major at the output's start */
    sg__rows_init(&rw, x->ndim, x->shape, 4);
    for (int d = last - 1; d >= 0; d--) {
        cs *= x->shape[d + 1];
        for (int k = 0; k < 4; k++) rw.stride[k][d] = k == 1 ? cs : ts[k] ? ts[k]->stride[d] : 0;
    }
    int64_t nrows = rw.nrows;
    if (nrows * len == 0) { /* empty rows: column sums of nothing are 0 */
        for (int64_t j = 0; n->i[1] && j < 2 * len; j++)
            sg__scatter_f(sg__at(sg__data(n->out), x->dtype, nrows * len + j), x->dtype, 1, 1,
                          &(float){0.0f});
        return SG_OK;
    }
    size_t bytes = sizeof(double) * 2 * (size_t)nrows;
    double *st = sg__alloc(ctx, bytes);
    if (!st)
        return sg__fail(ctx, SG_ERR_OOM, "%s backward: cannot allocate %zu bytes for the row "
                        "statistics", n->i[0] ? "layer_norm" : "rms_norm", bytes);
    void *dx = sg__data(n->out);
    int nth = sg__cpu_threads(ctx, nrows * len);
#pragma omp parallel for num_threads(nth) if (nth > 1) schedule(static)
    for (int64_t row = 0; row < nrows; row++) norm_bwd_row(&rw, n, dx, row, st + 2 * row);
    int64_t tiles = n->i[1] ? (len + SG__TILE - 1) / SG__TILE : 0;
#pragma omp parallel for num_threads(nth) if (nth > 1) schedule(static)
    for (int64_t t = 0; t < tiles; t++) norm_bwd_cols(&rw, n, t * SG__TILE, st);
    sg__free(ctx, st, bytes);
    return SG_OK;
}

/* ------------------------------------------------------------ cross entropy */

/* Rows are summed in this many fixed blocks, then the blocks in order, so
 * the loss does not depend on the thread count. */
#define CE_BLOCKS 64

static sg_status cross_entropy(sg_ctx *ctx, const sg__node *n) {
    const sg_tensor *lg = n->in[0], *tg = n->in[1];
    int64_t N = lg->shape[0], C = lg->shape[1], xs0 = lg->stride[0], xs1 = lg->stride[1];
    const void *x = sg__data(lg), *t = sg__data(tg);
    sg_dtype dt = lg->dtype, tdt = tg->dtype;
    int64_t ts = tg->stride[0];
    /*
     * Targets are checked here, on the host, before anything is computed:
     * the eager CPU path can read them, so a bad one is reported exactly
     * (which row, which value) and no output is written. A device backend
     * cannot read them without a sync; it will check inside its kernel and
     * report through an error flag read back when the step ends.
     */
    for (int64_t r = 0; r < N; r++) {
        int64_t c = sg__ldi(t, tdt, r * ts);
        if (c < 0 || c >= C) {
            char a[SG__DESC];
            return sg__fail(ctx, SG_ERR_INDEX, "sg_cross_entropy: targets[%lld] is %lld, outside "
                            "[0, %lld) for logits %s; targets are class indices (there is no "
                            "ignore_index)", (long long)r, (long long)c, (long long)C,
                            sg__describe(lg, a, sizeof a));
        }
    }
    double part[CE_BLOCKS] = {0};
    int64_t nb = N < CE_BLOCKS ? N : CE_BLOCKS;
    int nth = sg__cpu_threads(ctx, N * C);
#pragma omp parallel for num_threads(nth) if (nth > 1) schedule(static)
    for (int64_t blk = 0; blk < nb; blk++) {
        double s = 0;
        for (int64_t r = N * blk / nb; r < N * (blk + 1) / nb; r++) {
            const void *row = sg__at((void *)x, dt, r * xs0);
            double m, sum;
            row_lse(row, dt, xs1, C, &m, &sum);
            int64_t c = sg__ldi(t, tdt, r * ts);
            /* -log_softmax(row)[c] = log(sum) + m - row[c] */
            s += (m - sg__ldf(row, dt, c * xs1)) + log(sum);
        }
        part[blk] = s;
    }
    double total = 0;
    for (int64_t blk = 0; blk < nb; blk++) total += part[blk];
    /* The mean over no rows is NaN, as in PyTorch. */
    sg__stf(sg__data(n->out), SG_F32, 0, N ? (float)(total / (double)N) : NAN);
    return SG_OK;
}

/*
 * cross_entropy's gradient: row r of the output is (softmax(x_r) - onehot(
 * t_r)) * g / N, from row_lse's max and sum, the math in double and one
 * rounding at the store. A target outside [0, C) makes its row NaN (the
 * forward reported it).
 */
static sg_status cross_entropy_bwd(sg_ctx *ctx, const sg__node *n) {
    const sg_tensor *lg = n->in[0], *tg = n->in[1], *out = n->out;
    int64_t N = lg->shape[0], C = lg->shape[1], xs0 = lg->stride[0], xs1 = lg->stride[1];
    int64_t ys0 = out->stride[0], ys1 = out->stride[1], ts = tg->stride[0];
    const void *x = sg__data(lg), *t = sg__data(tg);
    void *y = sg__data(out);
    sg_dtype dt = lg->dtype, ydt = out->dtype, tdt = tg->dtype;
    double scale = N ? (double)sg__ldf(sg__data(n->in[2]), n->in[2]->dtype, 0) / (double)N : 0.0;
    int nth = sg__cpu_threads(ctx, N * C);
#pragma omp parallel for num_threads(nth) if (nth > 1) schedule(static)
    for (int64_t r = 0; r < N; r++) {
        const void *row = sg__at((void *)x, dt, r * xs0);
        void *yrow = sg__at(y, ydt, r * ys0);
        int64_t c = sg__ldi(t, tdt, r * ts);
        bool bad = c < 0 || c >= C;
        double m, sum;
        row_lse(row, dt, xs1, C, &m, &sum);
        double inv = 1.0 / sum;
        float tile[SG__TILE];
        for (int64_t j = 0; j < C; j += SG__TILE) {
            int k = tile_len(C, j);
            sg__gather_f(sg__at((void *)row, dt, j * xs1), dt, xs1, k, tile);
            for (int e = 0; e < k; e++) {
                double p = exp(tile[e] - m) * inv - (j + e == c ? 1.0 : 0.0);
                tile[e] = bad ? NAN : (float)(p * scale);
            }
            sg__scatter_f(sg__at(yrow, ydt, j * ys1), ydt, ys1, k, tile);
        }
    }
    return SG_OK;
}

sg_status sg__cpu_row(sg_ctx *ctx, const sg__node *n) {
    switch (n->op) {
    case SG__OP_SOFTMAX:
    case SG__OP_LOG_SOFTMAX: return softmax(ctx, n);
    case SG__OP_LAYER_NORM:
    case SG__OP_RMS_NORM: return norm(ctx, n);
    case SG__OP_CROSS_ENTROPY: return cross_entropy(ctx, n);
    case SG__OP_CROSS_ENTROPY_BWD: return cross_entropy_bwd(ctx, n);
    case SG__OP_NORM_STATS: return norm_stats(ctx, n);
    case SG__OP_NORM_BWD: return norm_bwd(ctx, n);
    default: break;
    }
    return sg__fail(ctx, SG_ERR_INTERNAL, "cpu: %s is not a row op", sg__op_name(n->op));
}
