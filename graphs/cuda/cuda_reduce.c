/* SPDX-License-Identifier: MIT */
/*
 * cuda_reduce.c -- the host side of the CUDA reduce family (sum, mean, max,
 * min, var, argmax; kernels in k_reduce.cu). It turns a node into the
 * geometry the kernels read: the kept dims (the outputs) and the reduced
 * dims (each output's range), size-1 dims dropped and reduced dims that walk
 * as one merged. Then it picks the team that folds one output (a thread, a
 * warp or a block) and how many chunks to cut each range into, so that even
 * one output over millions of elements keeps the whole GPU busy.
 *
 * The node convention is capture/ops_reduce.c's: node.mask holds the reduced
 * dims, node.out has the keepdim shape, VAR's correction is node.i[0].
 */
#include "exec.h"

#ifdef SG_HAVE_CUDA_HEADERS

#define BLOCK 256
#define MAX_CHUNKS 4096
/* The smallest scratch exec.c allocates (1 MiB). */
#define SCRATCH_FLOOR ((size_t)1 << 20)

/* The kernels' op numbers (k_reduce.cu). */
enum { OP_SUM, OP_MEAN, OP_MAX, OP_MIN, OP_VAR, OP_ARGMAX };

/* The same layout as struct rgeom in k_reduce.cu. */
typedef struct rgeom {
    int64_t ksize[SG_MAX_DIMS], kxs[SG_MAX_DIMS], kys[SG_MAX_DIMS];
    int64_t rsize[SG_MAX_DIMS], rxs[SG_MAX_DIMS];
    int64_t M, L, P, corr;
    int32_t nk, nr, team, op, xdt, ydt;
} rgeom;

/* The kernels' partial result (struct part in k_reduce.cu). */
typedef struct part {
    double f, m2;
    int64_t i, at, n;
} part;

static int64_t iabs(int64_t v) { return v < 0 ? -v : v; }

static int op_code(sg__op op) {
    switch (op) {
    case SG__OP_SUM: return OP_SUM;
    case SG__OP_MEAN: return OP_MEAN;
    case SG__OP_MAX: return OP_MAX;
    case SG__OP_MIN: return OP_MIN;
    case SG__OP_VAR: return OP_VAR;
    case SG__OP_ARGMAX: return OP_ARGMAX;
    default: return -1;
    }
}

static void build(rgeom *g, const sg__node *n) {
    const sg_tensor *x = n->in[0], *y = n->out;
    memset(g, 0, sizeof *g);
    g->op = op_code(n->op);
    g->corr = n->i[0];
    g->xdt = (int32_t)x->dtype;
    g->ydt = (int32_t)y->dtype;
    sg__rdims rd;
    sg__reduce_dims(x, y, n->mask, &rd);
    memcpy(g->ksize, rd.ksize, sizeof rd.ksize);
    memcpy(g->kxs, rd.kxs, sizeof rd.kxs);
    memcpy(g->kys, rd.kys, sizeof rd.kys);
    memcpy(g->rsize, rd.rsize, sizeof rd.rsize);
    memcpy(g->rxs, rd.rxs, sizeof rd.rxs);
    g->M = rd.M, g->L = rd.L, g->nk = rd.nk, g->nr = rd.nr;
    /* Outputs may be numbered in any order: put the kept dim of smallest x
     * stride last, so that neighbouring outputs are neighbours in memory. */
    if (g->nk > 1) {
        int best = g->nk - 1;
        for (int j = 0; j < g->nk; j++)
            if (iabs(g->kxs[j]) < iabs(g->kxs[best])) best = j;
        int last = g->nk - 1;
        int64_t t;
        t = g->ksize[best], g->ksize[best] = g->ksize[last], g->ksize[last] = t;
        t = g->kxs[best], g->kxs[best] = g->kxs[last], g->kxs[last] = t;
        t = g->kys[best], g->kys[best] = g->kys[last], g->kys[last] = t;
    }
}

/*
 * The team and the chunk count. One thread per output when outputs are
 * closer together in memory than a range's elements (a sum over dim 0 of a
 * matrix: a warp then reads 32 neighbouring outputs at each step) or when
 * ranges are too short to share out (16 elements or fewer); else a
 * warp per output for short ranges and a block for long ones. Ranges are cut
 * into chunks while there are fewer threads than the GPU holds, none shorter
 * than 16 elements per thread (8 for a thread team).
 */
static void plan(rgeom *g, int sms) {
    bool lanes = g->nk > 0 && g->M >= 32 &&
                 (g->L <= 16 || iabs(g->kxs[g->nk - 1]) < iabs(g->rxs[g->nr - 1]));
    g->team = lanes ? 1 : g->L <= 4096 ? 32 : BLOCK;
    int64_t target = (int64_t)(sms > 0 ? sms : 1) * 2048, have = g->M * g->team;
    g->P = 1;
    if (g->L > 0 && have < target) {
        /* A thread's partial (40 bytes) should cost little next to the
         * elements it folds, but a thread team's loads are serial: 8 per
         * chunk keeps enough of them in flight (a bias gradient, the sum
         * over dim 0 of a (128, 1024) matrix, took 38 us with 64). */
        int64_t want = (target + have - 1) / have;
        int64_t cap = g->L / (g->team == 1 ? 8 : (int64_t)g->team * 16);
        g->P = want < cap ? want : cap;
        if (g->P > MAX_CHUNKS) g->P = MAX_CHUNKS;
        if (g->P < 1) g->P = 1;
    }
}

static sg_status check_node(sg_ctx *ctx, const sg__node *n, const rgeom *g) {
    const sg_tensor *x = n->in[0], *y = n->out;
    char a[SG__DESC], b[SG__DESC];
    bool ok = y->ndim == x->ndim && g->op >= 0;
    for (int d = 0; ok && d < x->ndim; d++)
        ok = y->shape[d] == ((n->mask & (1u << d)) ? 1 : x->shape[d]);
    if (!ok)
        return sg__fail(ctx, SG_ERR_INTERNAL,
                        "cuda %s: out %s is not the keepdim shape of %s for "
                        "mask 0x%x",
                        sg__op_name(n->op), sg__describe(y, a, sizeof a),
                        sg__describe(x, b, sizeof b), (unsigned)n->mask);
    bool ordered = g->op == OP_MAX || g->op == OP_MIN || g->op == OP_ARGMAX;
    if (g->L == 0 && ordered && g->M > 0)
        return sg__fail(ctx, SG_ERR_SHAPE,
                        "sg_%s: the reduced range of %s is empty; its %s is "
                        "undefined",
                        sg__op_name(n->op), sg__describe(x, a, sizeof a), sg__op_name(n->op));
    bool ints = !sg__dtype_is_float(x->dtype);
    if (x->dtype == SG_BOOL || (ints && (g->op == OP_MEAN || g->op == OP_VAR)))
        return sg__fail(ctx, SG_ERR_DTYPE, "sg_%s: %s is not a %s tensor", sg__op_name(n->op),
                        sg__describe(x, a, sizeof a), ints ? "float" : "numeric");
    return SG_OK;
}

sg_status sg__cuda_reduce(sg_ctx *ctx, const sg__node *n) {
    rgeom g;
    build(&g, n);
    sg_status st = check_node(ctx, n, &g);
    if (st != SG_OK || g.M == 0) return st;
    plan(&g, sg__cuda_sm_count(ctx));
    /* While a graph is recorded scratch cannot grow (exec.c): keep the
     * partials within the least it ever holds, with fewer chunks if need be. */
    if (g.P > 1 && sg__cuda_capturing(ctx) && (size_t)(g.M * g.P) * sizeof(part) > SCRATCH_FLOOR) {
        int64_t p = (int64_t)(SCRATCH_FLOOR / sizeof(part)) / g.M;
        g.P = p > 1 ? p : 1;
    }
    int64_t items = g.M * g.P, per = BLOCK / g.team, blocks = (items + per - 1) / per;
    if (blocks > 0x7fffffff)
        return sg__fail(ctx, SG_ERR_UNSUPPORTED,
                        "sg_%s: %lld outputs need more blocks than one "
                        "launch holds; reduce a smaller tensor or split it",
                        sg__op_name(n->op), (long long)g.M);
    void *parts = NULL, *f;
    if (g.P > 1) {
        st = sg__cuda_scratch(ctx, (size_t)items * sizeof(part), &parts);
        if (st != SG_OK) return st;
    }
    st = sg__cuda_kernel(ctx, SG__CU_REDUCE, "sg_reduce_fold", &f);
    if (st != SG_OK) return st;
    const void *x = sg__data(n->in[0]);
    void *y = sg__data(n->out);
    void *args[] = {&x, &y, &parts, &g};
    unsigned grid[3] = {(unsigned)blocks, 1, 1}, block[3] = {BLOCK, 1, 1};
    st = sg__cuda_launch(ctx, f, grid, block, 0, args);
    if (st != SG_OK || g.P == 1) return st;
    st = sg__cuda_kernel(ctx, SG__CU_REDUCE, "sg_reduce_finish", &f);
    if (st != SG_OK) return st;
    /* The finish: a warp per output when each has many partials to merge
     * (one thread reading 352 of them one after another took 198 us for
     * the 768 outputs of a bias gradient), else a thread. */
    g.team = g.P >= 8 ? 32 : 1;
    void *fargs[] = {&parts, &y, &g};
    grid[0] = (unsigned)((g.M * g.team + BLOCK - 1) / BLOCK);
    return sg__cuda_launch(ctx, f, grid, block, 0, fargs);
}

#endif /* SG_HAVE_CUDA_HEADERS */
