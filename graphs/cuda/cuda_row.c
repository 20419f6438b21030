/* SPDX-License-Identifier: MIT */
/*
 * cuda_row.c -- the host side of the CUDA row family (softmax, log_softmax,
 * layer_norm, rms_norm and their gradient, cross_entropy and its gradient;
 * kernels in k_row.cu). It describes the rows of a node (the other dims, any strides)
 * and picks the team per row: a thread when the rows lie side by side in
 * memory (softmax over dim 0 of a matrix), a warp for rows up to ~1k
 * elements, a block beyond.
 *
 * cross_entropy's targets must lie in [0, C). The CPU checks them before
 * computing; here the targets live on the device, so they are read back and
 * checked the same way (the same message) unless a CUDA graph is being
 * recorded, when the host may not wait: the kernel then writes NaN for a bad
 * target and never reads outside the row. The gradient's kernel keeps a
 * block's row in shared memory between its two passes where it fits, and
 * also computes the loss when fusion merged the pair (sg__cuda_xent_pair);
 * SG_CUDA_XENT turns either off. The norms' gradient kernel also writes the
 * column sum of the input gradient it stores when fusion merged that sum
 * into its group (sg__cuda_norm_bwd_sum); SG_CUDA_NORM_BWD turns that off,
 * the early load of the gradient it adds, and the column sums in registers.
 */
#include "cuda.h"
#include "exec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef SG_HAVE_CUDA_HEADERS

#define BLOCK 256

/* The kernels' op numbers and flags (k_row.cu). */
enum { OP_SOFTMAX, OP_LOG_SOFTMAX, OP_LAYER_NORM, OP_RMS_NORM };
enum { HAS_W = 1, HAS_B = 2, NB_VECS = 4 };
#define NB_VEC 4 /* k_row.cu's 16-byte vectors per lane of a row in vectors */

/* The same layout as struct wgeom in k_row.cu. */
typedef struct wgeom {
    int64_t osize[SG_MAX_DIMS], oxs[SG_MAX_DIMS], oys[SG_MAX_DIMS];
    int64_t nrows, len, xs, ys;
    int64_t ws, bs, ts;
    double eps;
    int32_t nd, team, op, dt, tdt, flags;
} wgeom;

static int64_t iabs(int64_t v) { return v < 0 ? -v : v; }

/* The row dims (size, and each of the nst tensors' strides st[k]), outermost
 * first, with each dim that continues the one outside it in every tensor
 * merged into it; returns the count left. A step's contiguous rows become
 * one dim, so the kernels find a row's offsets with no division. */
static int merge_row_dims(int nd, int64_t *size, int64_t *const *st, int nst) {
    int o = 0;
    for (int d = 0; d < nd; d++) {
        bool join = o > 0;
        for (int k = 0; join && k < nst; k++) join = st[k][o - 1] == st[k][d] * size[d];
        if (join) {
            size[o - 1] *= size[d];
            for (int k = 0; k < nst; k++) st[k][o - 1] = st[k][d];
            continue;
        }
        size[o] = size[d];
        for (int k = 0; k < nst; k++) st[k][o] = st[k][d];
        o++;
    }
    return o;
}

/*
 * Rows of x along dim: the other dims index the rows. When another dim of
 * at least 8 has a smaller stride than dim (the CPU's "lanes"), it goes
 * last, so that rows r and r + 1 are neighbours in memory.
 */
static void rows_along(wgeom *g, const sg_tensor *x, const sg_tensor *y, int dim, int *lane) {
    memset(g, 0, sizeof *g);
    g->dt = (int32_t)x->dtype;
    g->nrows = 1;
    *lane = -1;
    for (int d = 0; d < x->ndim; d++) {
        if (d == dim || x->shape[d] < 2) continue;
        if (*lane < 0 || iabs(x->stride[d]) <= iabs(x->stride[*lane])) *lane = d;
    }
    if (*lane >= 0 && !(x->shape[*lane] >= 8 && iabs(x->stride[*lane]) < iabs(x->stride[dim])))
        *lane = -1;
    for (int d = 0; d < x->ndim; d++) {
        if (d == dim || d == *lane || x->shape[d] == 1) continue;
        g->osize[g->nd] = x->shape[d], g->oxs[g->nd] = x->stride[d], g->oys[g->nd] = y->stride[d];
        g->nd++;
    }
    if (*lane >= 0) {
        int d = *lane;
        g->osize[g->nd] = x->shape[d], g->oxs[g->nd] = x->stride[d], g->oys[g->nd] = y->stride[d];
        g->nd++;
    }
    for (int d = 0; d < g->nd; d++) g->nrows *= g->osize[d];
    int64_t *st[2] = {g->oxs, g->oys};
    g->nd = merge_row_dims(g->nd, g->osize, st, 2);
    if (x->ndim == 0) { /* a 0-d tensor is one row of one element */
        g->len = 1;
    } else {
        g->len = x->shape[dim], g->xs = x->stride[dim], g->ys = y->stride[dim];
    }
}

/* A warp per row up to 1k elements, a block beyond; a thread per row when
 * rows are too short to share out and there are many of them. */
static int32_t team_for(int64_t len, int64_t nrows) {
    return len <= 8 && nrows >= 1024 ? 1 : len <= 1024 ? 32 : BLOCK;
}

/* Launch kernel f (`name`) over g.nrows rows, one team each, with smem
 * bytes of dynamic shared memory. */
static sg_status launch_rows_of(sg_ctx *ctx, const char *name, void *f, const wgeom *g, size_t smem,
                                void **args) {
    int64_t per = BLOCK / g->team, blocks = (g->nrows + per - 1) / per;
    if (blocks > 0x7fffffff)
        return sg__fail(ctx, SG_ERR_UNSUPPORTED,
                        "cuda %s: %lld rows need more blocks than one "
                        "launch holds; split the tensor",
                        name, (long long)g->nrows);
    unsigned grid[3] = {(unsigned)blocks, 1, 1}, block[3] = {BLOCK, 1, 1};
    return sg__cuda_launch(ctx, f, grid, block, smem, args);
}

/* Launch kernel `name` over g.nrows rows, one team each. */
static sg_status launch_rows(sg_ctx *ctx, const char *name, const wgeom *g, void **args) {
    void *f;
    sg_status st = sg__cuda_kernel(ctx, SG__CU_ROW, name, &f);
    if (st != SG_OK) return st;
    return launch_rows_of(ctx, name, f, g, 0, args);
}

static sg_status softmax(sg_ctx *ctx, const sg__node *n) {
    wgeom g;
    int lane;
    rows_along(&g, n->in[0], n->out, (int)n->i[0], &lane);
    if (g.nrows * g.len == 0) return SG_OK;
    g.op = n->op == SG__OP_LOG_SOFTMAX ? OP_LOG_SOFTMAX : OP_SOFTMAX;
    /* Side-by-side rows read coalesced one per thread, when there are enough. */
    g.team = lane >= 0 && g.nrows >= 1024 ? 1 : team_for(g.len, g.nrows);
    const void *x = sg__data(n->in[0]);
    void *y = sg__data(n->out);
    void *args[] = {&x, &y, &g};
    return launch_rows(ctx, "sg_row_softmax", &g, args);
}

static sg_status norm(sg_ctx *ctx, const sg__node *n) {
    const sg_tensor *x = n->in[0], *w = n->nin > 1 ? n->in[1] : NULL;
    const sg_tensor *b = n->nin > 2 ? n->in[2] : NULL;
    wgeom g;
    int lane;
    rows_along(&g, x, n->out, x->ndim - 1, &lane);
    if (g.nrows * g.len == 0) return SG_OK;
    g.op = n->op == SG__OP_LAYER_NORM ? OP_LAYER_NORM : OP_RMS_NORM;
    g.team = team_for(g.len, g.nrows);
    g.eps = n->f[0];
    const void *wp = NULL, *bp = NULL;
    if (w) wp = sg__data(w), g.ws = w->stride[0], g.flags |= HAS_W;
    if (b) bp = sg__data(b), g.bs = b->stride[0], g.flags |= HAS_B;
    const void *xp = sg__data(x);
    void *y = sg__data(n->out);
    void *args[] = {&xp, &wp, &bp, &y, &g};
    return launch_rows(ctx, "sg_row_norm", &g, args);
}

/* Read the targets back and check them as the CPU does (same message). */
static sg_status check_targets(sg_ctx *ctx, const sg_tensor *lg, const sg_tensor *tg) {
    int64_t N = tg->shape[0], C = lg->shape[1], ts = tg->stride[0];
    size_t es = sg_dtype_size(tg->dtype);
    /* The span the targets cover, from the first to the last (ts may be 0 or negative). */
    int64_t lo = ts < 0 ? (N - 1) * ts : 0, hi = ts < 0 ? 0 : (N - 1) * ts;
    size_t nbytes = (size_t)(hi - lo + 1) * es;
    void *buf = sg__alloc(ctx, nbytes);
    if (!buf)
        return sg__fail(ctx, SG_ERR_OOM,
                        "sg_cross_entropy: out of host memory to check %lld "
                        "targets (%zu bytes)",
                        (long long)N, nbytes);
    sg_status st =
        sg__cuda_download(ctx, buf, (const char *)sg__data(tg) + lo * (int64_t)es, nbytes);
    for (int64_t r = 0; st == SG_OK && r < N; r++) {
        int64_t at = r * ts - lo, c;
        if (tg->dtype == SG_I32)
            c = ((const int32_t *)buf)[at];
        else
            c = ((const int64_t *)buf)[at];
        if (c < 0 || c >= C) {
            char a[SG__DESC];
            st = sg__fail(ctx, SG_ERR_INDEX,
                          "sg_cross_entropy: targets[%lld] is %lld, outside "
                          "[0, %lld) for logits %s; targets are class indices (there is no "
                          "ignore_index)",
                          (long long)r, (long long)c, (long long)C, sg__describe(lg, a, sizeof a));
        }
    }
    sg__free(ctx, buf, nbytes);
    return st;
}

static sg_status cross_entropy(sg_ctx *ctx, const sg__node *n) {
    const sg_tensor *lg = n->in[0], *tg = n->in[1];
    int64_t N = lg->shape[0];
    sg_status st;
    if (N > 0 && !sg__cuda_capturing(ctx) && (st = check_targets(ctx, lg, tg)) != SG_OK) return st;
    wgeom g;
    memset(&g, 0, sizeof g);
    g.dt = (int32_t)lg->dtype;
    g.tdt = (int32_t)tg->dtype;
    g.nrows = N;
    g.nd = 1;
    g.osize[0] = N, g.oxs[0] = lg->stride[0];
    g.len = lg->shape[1], g.xs = lg->stride[1];
    g.ts = tg->stride[0];
    g.team = team_for(g.len, g.nrows);
    void *loss = NULL;
    if (N > 0 && (st = sg__cuda_scratch(ctx, (size_t)N * sizeof(double), &loss)) != SG_OK)
        return st;
    const void *x = sg__data(lg), *t = sg__data(tg);
    void *y = sg__data(n->out);
    /* With C == 0 every target is out of range: the check above failed, or
     * (while recording) each row's loss is NaN and so is their mean. */
    if (N > 0) { /* its last block takes the mean */
        void *args[] = {&x, &t, &loss, &y, &g};
        return launch_rows(ctx, "sg_row_xent", &g, args);
    }
    void *f;
    if ((st = sg__cuda_kernel(ctx, SG__CU_ROW, "sg_row_xent_mean", &f)) != SG_OK) return st;
    void *margs[] = {&loss, &y, &g};
    unsigned grid[3] = {1, 1, 1}, block[3] = {BLOCK, 1, 1};
    return sg__cuda_launch(ctx, f, grid, block, 0, margs);
}

/* The most dynamic shared memory sg_row_xent_bwd stages a row in: two
 * blocks per multiprocessor still fit (228 KB on sm_90), a 50k-class bf16
 * row (100 KB) does. Longer rows rely on L2 for their second read. */
#define XENT_STAGE_MAX (112 * 1024)

/* Whether environment variable var (a comma list; unset or empty: all)
 * names what. */
static bool env_names(const char *var, const char *what) {
    const char *e = getenv(var);
    if (!e || !*e) return true;
    size_t n = strlen(what);
    for (const char *p = strstr(e, what); p; p = strstr(p + 1, what))
        if ((p == e || p[-1] == ',') && (p[n] == '\0' || p[n] == ',')) return true;
    return false;
}

bool sg__cuda_xent_on(const char *what) { return env_names("SG_CUDA_XENT", what); }

bool sg__cuda_norm_bwd_on(const char *what) { return env_names("SG_CUDA_NORM_BWD", what); }

/* Shared memory for sg_row_xent_bwd to stage a block's row of len elements
 * of es bytes as 16-byte vectors: the bytes, or 0 where it cannot
 * (warp rows, strided rows, rows over XENT_STAGE_MAX, a refused attribute). */
static size_t xent_stage_bytes(sg_ctx *ctx, void *f, const wgeom *g, size_t es) {
    size_t bytes = (size_t)g->len * es / 16 * 16;
    if (g->team != BLOCK || g->xs != 1 || g->ys != 1 || bytes == 0 || bytes > XENT_STAGE_MAX ||
        !sg__cuda_xent_on("stage"))
        return 0;
    if (bytes <= 48 * 1024) return bytes;
    CUresult r = sg__cuda_api(ctx)->cuFuncSetAttribute(
        (CUfunction)f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)bytes);
    return r == CUDA_SUCCESS ? bytes : 0;
}

/* cross_entropy's gradient n: one block per row, a warp per row of up to 1k
 * (k_row.cu, sg_row_xent_bwd). With fwd (a CROSS_ENTROPY of the same logits
 * and targets, fused with it: sg__group.xent) the same kernel also writes
 * fwd's loss, the mean of its rows' losses as sg_row_xent computes it. */
static sg_status xent_bwd(sg_ctx *ctx, const sg__node *n, const sg__node *fwd) {
    const sg_tensor *lg = n->in[0], *tg = n->in[1], *gt = n->in[2], *out = n->out;
    int64_t N = lg->shape[0];
    sg_status st;
    if (fwd && (N == 0 || lg->shape[1] == 0)) { /* no rows to fuse over: each alone */
        if ((st = cross_entropy(ctx, fwd)) != SG_OK) return st;
        fwd = NULL;
    }
    if (fwd && !sg__cuda_capturing(ctx) && (st = check_targets(ctx, lg, tg)) != SG_OK) return st;
    if (N * lg->shape[1] == 0) return SG_OK;
    wgeom g;
    memset(&g, 0, sizeof g);
    g.dt = (int32_t)lg->dtype;
    g.tdt = (int32_t)tg->dtype;
    g.nrows = N;
    g.nd = 1;
    g.osize[0] = N, g.oxs[0] = lg->stride[0], g.oys[0] = out->stride[0];
    g.len = lg->shape[1], g.xs = lg->stride[1], g.ys = out->stride[1];
    g.ts = tg->stride[0];
    g.team = g.len <= 1024 ? 32 : BLOCK; /* short rows (W4's 10 classes): a warp each */
    int32_t fteam = team_for(g.len, g.nrows); /* sg_row_xent's team, for its sums */
    double inv_n = 1.0 / (double)N;
    int32_t gdt = (int32_t)gt->dtype;
    const void *x = sg__data(lg), *t = sg__data(tg), *gp = sg__data(gt);
    void *y = sg__data(out), *loss = NULL, *mean = fwd ? sg__data(fwd->out) : NULL;
    if (fwd && (st = sg__cuda_scratch(ctx, (size_t)N * sizeof(double), &loss)) != SG_OK) return st;
    void *f;
    const char *kn = g.team == 32 ? "sg_row_xent_bwd_warp" : "sg_row_xent_bwd";
    if ((st = sg__cuda_kernel(ctx, SG__CU_ROW, kn, &f)) != SG_OK) return st;
    size_t smem = g.team == 32 ? 0 : xent_stage_bytes(ctx, f, &g, sg_dtype_size(lg->dtype));
    /* 2: the statistics pass copies the row in by cp.async (k_row.cu block_lse) */
    int32_t staged = smem > 0 ? 1 + sg__cuda_xent_on("async") : 0;
    void *args[] = {&x, &t, &gp, &y, &loss, &mean, &g, &inv_n, &gdt, &staged, &fteam};
    return launch_rows_of(ctx, kn, f, &g, smem, args);
}

sg_status sg__cuda_xent_pair(sg_ctx *ctx, const sg__node *bwd, const sg__node *fwd) {
    return xent_bwd(ctx, bwd, fwd);
}

/* Whether rows of len elements of dtype dt, at p and n row strides rs
 * apart, read contiguously (unit stride xs), lie on 16 bytes and fit a
 * warp's registers as k_row.cu's rows in vectors (NB_VECS). */
static bool vec_rows(sg_dtype dt, const void *p, int64_t xs, int64_t len, int n,
                     const int64_t *rs) {
    int64_t per = dt == SG_F32 ? 4 : 8;
    if (((uintptr_t)p & 15) || (xs != 1 && len > 1) || len % per || len / per > 32 * NB_VEC)
        return false;
    for (int d = 0; d < n; d++)
        if (rs[d] % per) return false;
    return true;
}

/* NORM_STATS: a team per row (k_row.cu, sg_row_norm_stats); y's last dim
 * holds the mean and the reciprocal standard deviation. A warp reads a row
 * of 16-byte vectors (NB_VECS) when vec_rows holds. */
static sg_status norm_stats(sg_ctx *ctx, const sg__node *n) {
    const sg_tensor *x = n->in[0];
    wgeom g;
    int lane;
    rows_along(&g, x, n->out, x->ndim - 1, &lane);
    if (g.nrows * g.len == 0) return SG_OK;
    g.op = n->i[0] ? OP_LAYER_NORM : OP_RMS_NORM;
    g.team = team_for(g.len, g.nrows);
    g.eps = n->f[0];
    const void *xp = sg__data(x);
    if (vec_rows(x->dtype, xp, g.xs, g.len, g.nd, g.oxs)) g.flags |= NB_VECS, g.team = 32;
    void *y = sg__data(n->out);
    void *args[] = {&xp, &y, &g};
    return launch_rows(ctx, "sg_row_norm_stats", &g, args);
}

/* The same layout as struct ngeom in k_row.cu. */
typedef struct ngeom {
    int64_t osize[SG_MAX_DIMS], oxs[SG_MAX_DIMS], ogs[SG_MAX_DIMS], oys[SG_MAX_DIMS],
        ors[SG_MAX_DIMS];
    int64_t nrows, len, xs, gs, ys, ws, rs;
    int32_t nd, team, layer, dt, flags, sdt;
    double eps;
} ngeom;

/* k_row.cu's: r is added; the column sums; dx's column sum; r loaded early */
enum { NB_R = 8, NB_SUMS = 16, NB_DXSUM = 32, NB_R_EARLY = 64 };

/* The most shared memory a block of sg_row_norm_bwd_vec keeps its warps'
 * column sums in: two blocks of 8 warps still fit an SM on sm_80 and
 * sm_90 with three sets of 1024 floats. */
#define NB_SMEM_MAX (96 * 1024)

#define NB_SCRATCH ((size_t)64 << 20) /* the most op scratch the column sums take */

/* NORM_BWD's rows over x's leading dims (dx row-major at the output's
 * start), r's strides when it is given. */
static void norm_bwd_geom(ngeom *g, const sg__node *n) {
    const sg_tensor *x = n->in[0], *gt = n->in[1], *w = n->in[2], *r = n->in[3];
    int last = x->ndim - 1;
    int64_t cs[SG_MAX_DIMS];
    cs[last] = 1;
    for (int d = last - 1; d >= 0; d--) cs[d] = cs[d + 1] * x->shape[d + 1];
    memset(g, 0, sizeof *g);
    g->nrows = 1;
    for (int d = 0; d < last; d++) {
        if (x->shape[d] == 1) continue;
        g->osize[g->nd] = x->shape[d], g->oxs[g->nd] = x->stride[d];
        g->ogs[g->nd] = gt->stride[d], g->oys[g->nd] = cs[d];
        g->ors[g->nd] = r ? r->stride[d] : 0;
        g->nrows *= x->shape[d];
        g->nd++;
    }
    int64_t *st[4] = {g->oxs, g->ogs, g->oys, g->ors};
    g->nd = merge_row_dims(g->nd, g->osize, st, 4);
    g->len = x->shape[last], g->xs = x->stride[last], g->gs = gt->stride[last], g->ys = 1;
    g->team = g->len <= 1024 ? 32 : BLOCK;
    g->layer = n->i[0] != 0;
    g->dt = (int32_t)x->dtype;
    g->eps = n->f[0];
    if (w) g->ws = w->stride[0], g->flags |= HAS_W;
    if (r) g->rs = r->stride[last], g->flags |= NB_R;
    if (r && sg__cuda_norm_bwd_on("early")) g->flags |= NB_R_EARLY;
    if (n->i[1]) g->flags |= NB_SUMS;
}

/* Whether sg_row_norm_bwd_vec takes the node (x, g, r and dx in contiguous
 * 16-byte rows of at most 32 * NB_VEC vectors, w on 16 bytes), else why not. */
static const char *norm_bwd_why(const ngeom *g, const sg__node *n) {
    const sg_tensor *x = n->in[0], *gt = n->in[1], *w = n->in[2], *r = n->in[3];
    sg_dtype dt = x->dtype;
    int64_t zero = 0;
    if (!vec_rows(dt, sg__data(x), g->xs, g->len, g->nd, g->oxs) ||
        !vec_rows(dt, sg__data(gt), g->gs, g->len, g->nd, g->ogs) ||
        !vec_rows(dt, sg__data(n->out), g->ys, g->len, g->nd, g->oys) ||
        (w && !vec_rows(dt, sg__data(w), g->ws, g->len, 0, &zero)) ||
        (r && !vec_rows(dt, sg__data(r), g->rs, g->len, g->nd, g->ors)))
        return "its rows are not contiguous runs of whole 16-byte vectors of at most 1024 "
               "halves or 512 floats";
    return NULL;
}

/* NORM_BWD's column sums by sg_row_norm_bwd_cols from the rows'
 * statistics st (a thread per column, the rows in order). */
static sg_status norm_bwd_cols(sg_ctx *ctx, const sg__node *n, const ngeom *g, float *st) {
    void *f, *o = (char *)sg__data(n->out) + (size_t)(g->nrows * g->len) *
                                                 sg_dtype_size(n->in[0]->dtype);
    sg_status s = sg__cuda_kernel(ctx, SG__CU_ROW, "sg_row_norm_bwd_cols", &f);
    if (s != SG_OK) return s;
    const void *xp = sg__data(n->in[0]), *gp = sg__data(n->in[1]);
    ngeom gg = *g;
    void *args[] = {&xp, &gp, &st, &o, &gg};
    unsigned grid[3] = {(unsigned)((g->len + BLOCK - 1) / BLOCK), 1, 1}, block[3] = {BLOCK, 1, 1};
    return sg__cuda_launch(ctx, f, grid, block, 0, args);
}

/* The warps of a block of sg_row_norm_bwd_vec (at most 8) whose column
 * sums (nsets of len floats each a warp) fit its shared memory: 48 KiB, or
 * with wide (dx's sum: a third set) up to NB_SMEM_MAX where the function
 * takes more, so that the sum costs no warps; *shmem gets the bytes. */
static int64_t nb_warps(sg_ctx *ctx, void *f, int nsets, int64_t len, bool wide,
                        unsigned *shmem) {
    int64_t per = (int64_t)nsets * len * (int64_t)sizeof(float), warps = BLOCK / 32;
    if (per == 0) return *shmem = 0, warps;
    int bytes = (int)(warps * per);
    if (warps * per > 49152 &&
        (!wide || warps * per > NB_SMEM_MAX ||
         sg__cuda_api(ctx)->cuFuncSetAttribute(
             (CUfunction)f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes) != CUDA_SUCCESS))
        warps = 49152 / per;
    if (warps < 1) warps = 1;
    *shmem = (unsigned)(warps * per);
    return warps;
}

/* NORM_BWD: dx (+ r) and, with i[1], the column sums; with sum (a SUM of
 * dx over every dim but the last that fusion merged: sg__group.nbsum),
 * also that sum, of dx as stored, into sum's result (*took), where rows
 * of whole 16-byte vectors let sg_row_norm_bwd_vec run: a warp per row,
 * two blocks per SM at most with column sums, each block's column partials
 * in op scratch, then sg_row_norm_bwd_fin adds them in block order. Other
 * rows: a team per row (sg_row_norm_bwd, any strides, the rows' statistics
 * in scratch), then sg_row_norm_bwd_cols; the sum is then not taken. */
static sg_status norm_bwd(sg_ctx *ctx, const sg__node *n, const sg__node *sum, bool *took) {
    ngeom g;
    norm_bwd_geom(&g, n);
    bool sums = n->i[1] != 0;
    const void *xp = sg__data(n->in[0]), *gp = sg__data(n->in[1]);
    const void *wp = n->in[2] ? sg__data(n->in[2]) : NULL;
    const void *rp = n->in[3] ? sg__data(n->in[3]) : NULL;
    void *yp = sg__data(n->out), *f, *dxo = NULL;
    float *st = NULL;
    if (took) *took = false;
    if (g.len == 0) return SG_OK;
    bool vec = !norm_bwd_why(&g, n) && g.nrows * g.len > 0;
    if (sum && (vec || g.nrows * g.len == 0)) {
        g.flags |= NB_DXSUM, g.sdt = (int32_t)sum->out->dtype;
        dxo = sg__data(sum->out);
        *took = true;
    }
    int nsets = (sums ? 2 : 0) + (dxo ? 1 : 0);
    /* Column sums kept in registers over a warp's rows (sg_row_norm_bwd_reg,
     * one block an SM) where the row fits them: 768 halves, 512 floats. */
    bool reg = vec && nsets && g.len <= (n->in[0]->dtype == SG_F32 ? 512 : 768) &&
               sg__cuda_norm_bwd_on("regs");
    const char *kname = reg   ? "sg_row_norm_bwd_reg"
                        : vec ? "sg_row_norm_bwd_vec"
                              : "sg_row_norm_bwd";
    sg_status s = sg__cuda_kernel(ctx, SG__CU_ROW, kname, &f);
    if (s != SG_OK) return s;
    /* Column sums: each warp's in nsets * len floats of shared memory, and
     * two blocks an SM (one with reg; few partials to add). */
    unsigned shmem = 0;
    int64_t warps = vec ? nb_warps(ctx, f, nsets, g.len, dxo != NULL || reg, &shmem) : BLOCK / 32;
    int64_t parts = (g.nrows + warps - 1) / warps, sm = sg__cuda_sm_count(ctx);
    if (nsets && parts > (reg ? 1 : 2) * sm && sm > 0) parts = (reg ? 1 : 2) * sm;
    if (parts > (1 << 24)) parts = 1 << 24; /* the warps take rows in turn */
    size_t pbytes = (size_t)parts * (size_t)nsets * (size_t)g.len * sizeof(float);
    if (g.nrows * g.len == 0) {
        if (!nsets) return SG_OK;
        parts = 0, pbytes = 0; /* the sums of no rows: 0 */
    } else if (vec && (!nsets || pbytes <= NB_SCRATCH)) {
        g.flags |= NB_VECS, g.team = 32;
        s = nsets ? sg__cuda_scratch(ctx, pbytes, (void **)&st) : SG_OK;
        if (s != SG_OK) return s;
        void *args[] = {&xp, &gp, &wp, &rp, &yp, &st, &g};
        unsigned grid[3] = {(unsigned)parts, 1, 1}, block[3] = {(unsigned)warps * 32, 1, 1};
        s = sg__cuda_launch(ctx, f, grid, block, nsets ? shmem : 0, args);
        if (s != SG_OK || !nsets) return s;
    } else {
        if (dxo) g.flags &= ~NB_DXSUM, dxo = NULL, *took = false; /* the sum runs alone */
        if (vec && (s = sg__cuda_kernel(ctx, SG__CU_ROW, "sg_row_norm_bwd", &f)) != SG_OK)
            return s; /* more partials than NB_SCRATCH holds */
        int64_t blocks = (g.nrows + BLOCK / g.team - 1) / (BLOCK / g.team);
        if (blocks > 0x7fffffff)
            return sg__fail(ctx, SG_ERR_UNSUPPORTED,
                            "cuda norm_bwd: %lld rows need more blocks than "
                            "one launch holds; split the tensor",
                            (long long)g.nrows);
        s = sums ? sg__cuda_scratch(ctx, (size_t)g.nrows * 2 * sizeof(float), (void **)&st) : SG_OK;
        if (s != SG_OK) return s;
        void *args[] = {&xp, &gp, &wp, &rp, &yp, &st, &g};
        unsigned grid[3] = {(unsigned)blocks, 1, 1}, block[3] = {BLOCK, 1, 1};
        s = sg__cuda_launch(ctx, f, grid, block, 0, args);
        return s == SG_OK && sums ? norm_bwd_cols(ctx, n, &g, st) : s;
    }
    /* The column sums of the block partials (none: zeros). */
    void *o = (char *)yp + (size_t)(g.nrows * g.len) * sg_dtype_size(n->in[0]->dtype);
    int np = (int)parts;
    s = sg__cuda_kernel(ctx, SG__CU_ROW, "sg_row_norm_bwd_fin", &f);
    if (s != SG_OK) return s;
    void *args[] = {&st, &np, &o, &dxo, &g};
    unsigned grid[3] = {(unsigned)((nsets * g.len + 31) / 32), 1, 1}, block[3] = {BLOCK, 1, 1};
    return sg__cuda_launch(ctx, f, grid, block, 0, args);
}

sg_status sg__cuda_norm_bwd_sum(sg_ctx *ctx, const sg__node *n, const sg__node *sum, bool *took) {
    return norm_bwd(ctx, n, sum, took);
}

bool sg__cuda_norm_bwd_note(const sg__node *n, char *buf, size_t size) {
    if (size) buf[0] = '\0';
    if (n->op != SG__OP_NORM_BWD || !n->out) return false;
    ngeom g;
    norm_bwd_geom(&g, n);
    const char *why = norm_bwd_why(&g, n);
    if (!why) return false;
    snprintf(buf, size, "a team per row%s, not the one-pass kernel (a warp per row): %s",
             n->i[1] ? ", then a thread per column for the column sums" : "", why);
    return true;
}

sg_status sg__cuda_row(sg_ctx *ctx, const sg__node *n) {
    switch (n->op) {
    case SG__OP_SOFTMAX:
    case SG__OP_LOG_SOFTMAX: return softmax(ctx, n);
    case SG__OP_LAYER_NORM:
    case SG__OP_RMS_NORM: return norm(ctx, n);
    case SG__OP_CROSS_ENTROPY: return cross_entropy(ctx, n);
    case SG__OP_CROSS_ENTROPY_BWD: return xent_bwd(ctx, n, NULL);
    case SG__OP_NORM_STATS: return norm_stats(ctx, n);
    case SG__OP_NORM_BWD: return norm_bwd(ctx, n, NULL, NULL);
    default: break;
    }
    return sg__fail(ctx, SG_ERR_INTERNAL, "cuda: %s is not a row op", sg__op_name(n->op));
}

#else

bool sg__cuda_norm_bwd_note(const sg__node *n, char *buf, size_t size) {
    (void)n;
    if (size) buf[0] = '\0';
    return false;
}

#endif /* SG_HAVE_CUDA_HEADERS */
