/* SPDX-License-Identifier: MIT */
/*
 * cuda_data.c -- the host side of the CUDA data kernels (k_data.cu):
 * embedding and index_select as strided gathers, concat as one strided copy
 * per input, index_copy_ as three passes (clear marks, read indices and mark
 * the last writer of each position, scatter; one pass that scans for later
 * duplicates itself while a graph is recorded, since scratch cannot be
 * allocated then), index_add as a stable sort of the positions by index and
 * a thread per (run of equal indices, lane), and arange.
 *
 * Index values: outside a graph recording the index tensor is downloaded
 * and checked before any launch, so that a bad index fails the call with
 * SG_ERR_INDEX, the CPU's message, and every tensor as it was. While a graph
 * is recorded no host wait is allowed: the kernels' own guards then keep
 * every access in bounds (a bad gather index gives zeros, a bad scatter
 * index writes nothing).
 */
#include "cuda.h"
#include "exec.h"

#ifdef SG_HAVE_CUDA_HEADERS

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The kernel parameter: the same layout as dt_args in k_data.cu. */
typedef struct dt_args {
    void *dst;
    const void *src;
    const void *idx;
    int64_t shape[SG_MAX_DIMS];
    int64_t dstride[SG_MAX_DIMS];
    int64_t sstride[SG_MAX_DIMS];
    int64_t istride[SG_MAX_DIMS];
    int64_t n;
    int64_t sel_stride;
    int64_t limit;
    uint64_t *last;
    int64_t *idx64;
    int64_t count;
    int64_t jstride;
    int ndim, es, idx_is_i64, dim;
} dt_args;
_Static_assert(sizeof(dt_args) == 288, "dt_args changed: update k_data.cu too");

static void grid_for(sg_ctx *ctx, int64_t work, unsigned grid[3], unsigned block[3]) {
    int64_t blocks = (work + 255) / 256, cap = (int64_t)sg__cuda_sm_count(ctx) * 8;
    if (cap < 1) cap = 1;
    grid[0] = (unsigned)(blocks < cap ? blocks : cap);
    grid[1] = grid[2] = 1;
    block[0] = 256;
    block[1] = block[2] = 1;
}

static sg_status launch(sg_ctx *ctx, const char *name, int64_t work, void **args) {
    void *f;
    sg_status s = sg__cuda_kernel(ctx, SG__CU_DATA, name, &f);
    if (s != SG_OK) return s;
    unsigned grid[3], block[3];
    grid_for(ctx, work, grid, block);
    return sg__cuda_launch(ctx, f, grid, block, 0, args);
}

/* The largest element offset of a walk over shape with these strides. */
static int64_t extent(int nd, const int64_t *shape, const int64_t *stride) {
    int64_t hi = 0;
    for (int d = 0; d < nd; d++) hi += (shape[d] - 1) * stride[d];
    return hi;
}

/* True when every index and offset of a gather or scatter fits an int (the
 * grid-stride loop may step past n by one grid, hence the margin). */
static bool fits_32(const dt_args *a) {
    const int64_t lim = (int64_t)1 << 30;
    int64_t sel = a->limit > 0 ? (a->limit - 1) * a->sel_stride : 0;
    return a->n < lim && extent(a->ndim, a->shape, a->dstride) + (a->idx64 ? sel : 0) < lim &&
           extent(a->ndim, a->shape, a->sstride) + (a->idx64 ? 0 : sel) < lim &&
           extent(a->ndim, a->shape, a->istride) < lim;
}

/* ------------------------------------------------------------ index checks */

/* sg__check_indices (data_check.c), skipped while a graph is recorded. */
static sg_status check_indices(sg_ctx *ctx, const char *op, const sg_tensor *idx, int64_t limit,
                               const char *what) {
    return sg__cuda_capturing(ctx) ? SG_OK : sg__check_indices(ctx, op, idx, limit, what);
}

/* ------------------------------------------------------------ the ops */

static sg_status run_gather(sg_ctx *ctx, dt_args *a) {
    if (a->n == 0) return SG_OK;
    void *args[1] = {a};
    return launch(ctx, fits_32(a) ? "sg_data_gather32" : "sg_data_gather64", a->n, args);
}

/* out (idx..., D): row i of out is row idx[i] of weight (V, D). */
static sg_status embedding(sg_ctx *ctx, const sg__node *n) {
    const sg_tensor *w = n->in[0], *idx = n->in[1], *out = n->out;
    sg_status s = check_indices(ctx, "sg_embedding", idx, w->shape[0], "dim 0 of weight");
    if (s != SG_OK) return s;
    dt_args a;
    memset(&a, 0, sizeof a);
    int nd = out->ndim, k = idx->ndim;
    a.dst = sg__data(out);
    a.src = sg__data(w);
    a.idx = sg__data(idx);
    a.ndim = nd;
    for (int d = 0; d < nd; d++) {
        a.shape[d] = out->shape[d];
        a.dstride[d] = out->stride[d];
        a.istride[d] = d < k ? idx->stride[d] : 0;
    }
    a.sstride[nd - 1] = w->stride[1];
    a.sel_stride = w->stride[0];
    a.limit = w->shape[0];
    a.n = sg__numel(nd, out->shape);
    a.es = (int)sg_dtype_size(out->dtype);
    a.idx_is_i64 = idx->dtype == SG_I64;
    return run_gather(ctx, &a);
}

/*
 * A gather of x along dim into out through the strided gather kernel: for
 * index_select idx is 1-d and out[.., j, ..] = x[.., idx[j], ..]; for
 * torch.gather (each) idx has out's shape and out[c] = x[c with idx[c] at
 * dim]. The indices are checked on the host first (outside recordings).
 */
static sg_status gather_along(sg_ctx *ctx, const sg__node *n, const char *op, bool each) {
    const sg_tensor *x = n->in[0], *idx = n->in[1], *out = n->out;
    int dim = (int)n->i[0], nd = out->ndim;
    char what[64];
    snprintf(what, sizeof what, "dim %d of x", dim);
    sg_status s = check_indices(ctx, op, idx, x->shape[dim], what);
    if (s != SG_OK) return s;
    dt_args a;
    memset(&a, 0, sizeof a);
    a.dst = sg__data(out);
    a.src = sg__data(x);
    a.idx = sg__data(idx);
    a.ndim = nd;
    for (int d = 0; d < nd; d++) {
        a.shape[d] = out->shape[d];
        a.dstride[d] = out->stride[d];
        a.sstride[d] = d == dim ? 0 : x->stride[d];
        a.istride[d] = each ? idx->stride[d] : d == dim ? idx->stride[0] : 0;
    }
    a.sel_stride = x->stride[dim];
    a.limit = x->shape[dim];
    a.n = sg__numel(nd, out->shape);
    a.es = (int)sg_dtype_size(out->dtype);
    a.idx_is_i64 = idx->dtype == SG_I64;
    return run_gather(ctx, &a);
}

/* Each input is copied into out at its running offset along dim. */
static sg_status concat(sg_ctx *ctx, const sg__node *n) {
    const sg_tensor *out = n->out;
    int dim = (int)n->i[0], nd = out->ndim;
    size_t es = sg_dtype_size(out->dtype);
    int64_t start = 0;
    for (int t = 0; t < n->nin; t++) {
        const sg_tensor *in = n->in[t];
        dt_args a;
        memset(&a, 0, sizeof a);
        a.dst = (char *)sg__data(out) + start * out->stride[dim] * (int64_t)es;
        a.src = sg__data(in);
        a.ndim = nd;
        for (int d = 0; d < nd; d++) {
            a.shape[d] = in->shape[d];
            a.dstride[d] = out->stride[d];
            a.sstride[d] = in->stride[d];
        }
        a.n = sg__numel(nd, in->shape);
        a.es = (int)es;
        start += in->shape[dim];
        sg_status s = run_gather(ctx, &a);
        if (s != SG_OK) return s;
    }
    return SG_OK;
}

/*
 * The arguments of a walk over dst's lanes off dim (every position but
 * dim's), each lane stepping through src's count = src.shape[dim] entries
 * along dim and their indices in order: index_copy_'s recorded pass and
 * index_add share it.
 */
static void lane_walk(dt_args *a, const sg_tensor *dst, const sg_tensor *idx, const sg_tensor *src,
                      int dim, int64_t numel) {
    int nd = dst->ndim;
    memset(a, 0, sizeof *a);
    a->dst = sg__data(dst);
    a->src = sg__data(src);
    a->idx = sg__data(idx);
    a->idx_is_i64 = idx->dtype == SG_I64;
    a->istride[0] = idx->stride[0];
    a->count = src->shape[dim];
    a->jstride = src->stride[dim];
    a->sel_stride = dst->stride[dim];
    a->limit = dst->shape[dim];
    a->ndim = nd;
    for (int d = 0; d < nd; d++) { /* the walk leaves dim out */
        a->shape[d] = d == dim ? 1 : src->shape[d];
        a->dstride[d] = d == dim ? 0 : dst->stride[d];
        a->sstride[d] = d == dim ? 0 : src->stride[d];
    }
    a->n = numel / a->count;
}

/*
 * index_copy_ inside a graph recording, where scratch cannot be allocated:
 * sg_data_index_copy_scan, one pass in which each src position along dim
 * checks the later indices itself. It reads idx while other blocks write
 * dst, so an idx that shares dst's storage is refused.
 */
static sg_status index_copy_recorded(sg_ctx *ctx, const sg__node *n, int64_t numel) {
    const sg_tensor *dst = n->out, *idx = n->in[1], *src = n->in[2];
    int dim = (int)n->i[0];
    if (idx->st == dst->st) {
        char a[SG__DESC], b[SG__DESC];
        return sg__fail(ctx, SG_ERR_UNSUPPORTED, "sg_index_copy_: idx %s shares storage with dst "
                        "%s, which a CUDA graph cannot order; pass sg_clone(idx)",
                        sg__describe(idx, a, sizeof a), sg__describe(dst, b, sizeof b));
    }
    dt_args a;
    lane_walk(&a, dst, idx, src, dim, numel);
    a.es = (int)sg_dtype_size(dst->dtype);
    void *args[1] = {&a};
    int64_t chunks = (a.n + 2047) / 2048; /* CHUNK in k_data.cu */
    return launch(ctx, "sg_data_index_copy_scan", a.count * chunks * 256, args);
}

/*
 * dst[.., idx[i], ..] = src[.., i, ..]; of repeated indices the last wins.
 * Scratch holds the indices as int64 (read before any write: idx may alias
 * dst) and one mark per position of dst along dim.
 */
static sg_status index_copy(sg_ctx *ctx, const sg__node *n) {
    const sg_tensor *dst = n->out, *idx = n->in[1], *src = n->in[2];
    int dim = (int)n->i[0], nd = dst->ndim;
    int64_t L = src->shape[dim], size = dst->shape[dim];
    char what[64];
    snprintf(what, sizeof what, "dim %d of dst", dim);
    sg_status s = check_indices(ctx, "sg_index_copy_", idx, size, what);
    if (s != SG_OK) return s;
    int64_t numel = sg__numel(nd, src->shape);
    if (numel == 0) return SG_OK;
    if (sg__cuda_capturing(ctx)) return index_copy_recorded(ctx, n, numel);
    void *scratch;
    s = sg__cuda_scratch(ctx, (size_t)(L + size) * sizeof(uint64_t), &scratch);
    if (s != SG_OK) return s;
    dt_args a;
    memset(&a, 0, sizeof a);
    a.idx64 = scratch;
    a.last = (uint64_t *)scratch + L;
    a.limit = size;

    uint64_t *last = a.last;
    int64_t nmarks = size;
    void *zargs[2] = {&last, &nmarks};
    s = launch(ctx, "sg_data_zero", nmarks, zargs);
    if (s != SG_OK) return s;

    a.idx = sg__data(idx);
    a.idx_is_i64 = idx->dtype == SG_I64;
    a.istride[0] = idx->stride[0];
    a.n = L;
    void *args[1] = {&a};
    s = launch(ctx, "sg_data_index_prep", L, args);
    if (s != SG_OK) return s;

    a.dst = sg__data(dst);
    a.src = sg__data(src);
    a.idx = NULL;
    a.istride[0] = 0;
    a.ndim = nd;
    a.dim = dim;
    for (int d = 0; d < nd; d++) {
        a.shape[d] = src->shape[d];
        a.dstride[d] = d == dim ? 0 : dst->stride[d];
        a.sstride[d] = src->stride[d];
    }
    a.sel_stride = dst->stride[dim];
    a.n = numel;
    a.es = (int)sg_dtype_size(dst->dtype);
    return launch(ctx, fits_32(&a) ? "sg_data_scatter32" : "sg_data_scatter64", numel, args);
}

#define RANK_TILE 256  /* k_data.cu */
#define RANK_SLICE 512 /* k_data.cu */
#define RUN_LANES 4    /* k_data.cu */
/* More positions: the rank pass's count grows as their square. On an H100
 * (bf16 [50257, 768], random rows, eager) the rank pass took 168 us against
 * the sort's 191 at 8192 positions, 412 against 314 at 16384. */
#define RANK_MAX 8192

/* A thread per (run of equal indices, RUN_LANES lanes) over the sorted
 * positions in a->idx64 (k_data.cu: sg_data_index_add_runs). */
static sg_status add_runs(sg_ctx *ctx, dt_args *a, int dt) {
    void *f, *args[2] = {a, &dt};
    sg_status s = sg__cuda_kernel(ctx, SG__CU_DATA, "sg_data_index_add_runs", &f);
    if (s != SG_OK) return s;
    int64_t L = a->count;
    unsigned grid[3] = {(unsigned)((a->n + 256 * RUN_LANES - 1) / (256 * RUN_LANES)),
                        (unsigned)(L < 65535 ? L : 65535), 1};
    unsigned block[3] = {256, 1, 1};
    return sg__cuda_launch(ctx, f, grid, block, 0, args);
}

/* index_add's sort and runs (k_data.cu): positions ranked by (index,
 * position), then add_runs. */
static sg_status index_add_runs(sg_ctx *ctx, dt_args *a, int dt) {
    int64_t L = a->count;
    void *scratch, *f;
    sg_status s = sg__cuda_scratch(ctx, (size_t)L * 3 * sizeof(uint64_t), &scratch);
    if (s != SG_OK) return s;
    a->last = scratch;
    a->idx64 = (int64_t *)scratch + L;
    uint64_t *ranks = a->last;
    void *zargs[2] = {&ranks, &L}, *args[2] = {a, &dt};
    s = launch(ctx, "sg_data_zero", L, zargs);
    if (s == SG_OK) s = sg__cuda_kernel(ctx, SG__CU_DATA, "sg_data_index_rank", &f);
    if (s != SG_OK) return s;
    unsigned grid[3] = {(unsigned)((L + RANK_TILE - 1) / RANK_TILE),
                        (unsigned)((L + RANK_SLICE - 1) / RANK_SLICE), 1};
    unsigned block[3] = {RANK_TILE, 1, 1};
    s = sg__cuda_launch(ctx, f, grid, block, 0, args);
    if (s == SG_OK) s = launch(ctx, "sg_data_index_order", L, args);
    return s == SG_OK ? add_runs(ctx, a, dt) : s;
}

#define RADIX_TILE 2048 /* k_data.cu */

/* The runs after a radix sort (k_data.cu), for more positions than
 * RANK_MAX: keys index + 1 of bits(limit) + 1 bits, 8 a pass. Scratch: the
 * int64 indices and positions the runs read (2 L), two u32 key and
 * position buffers (4 L u32), the tiles' digit counts and the totals. */
static size_t radix_bytes(int64_t L) {
    int64_t ntiles = (L + RADIX_TILE - 1) / RADIX_TILE;
    return (size_t)L * (2 * sizeof(int64_t) + 4 * sizeof(uint32_t)) +
           (size_t)(ntiles + 1) * 256 * sizeof(uint32_t);
}

/* SG_CUDA_INDEX_ADD=radix: every count through the radix sort (tests). */
static bool radix_always(void) {
    const char *e = getenv("SG_CUDA_INDEX_ADD");
    return e && !strcmp(e, "radix");
}

static sg_status index_add_radix(sg_ctx *ctx, dt_args *a, int dt) {
    int64_t L = a->count, ntiles = (L + RADIX_TILE - 1) / RADIX_TILE;
    void *scratch, *fc, *fs, *fp;
    sg_status s = sg__cuda_scratch(ctx, radix_bytes(L), &scratch);
    if (s == SG_OK) s = sg__cuda_kernel(ctx, SG__CU_DATA, "sg_data_radix_count", &fc);
    if (s == SG_OK) s = sg__cuda_kernel(ctx, SG__CU_DATA, "sg_data_radix_scan", &fs);
    if (s == SG_OK) s = sg__cuda_kernel(ctx, SG__CU_DATA, "sg_data_radix_place", &fp);
    if (s != SG_OK) return s;
    a->idx64 = scratch;
    uint32_t *buf = (uint32_t *)(a->idx64 + 2 * L), *hist = buf + 4 * L,
             *total = hist + 256 * ntiles;
    int bits = 1;
    while (bits < 64 && ((uint64_t)a->limit >> bits) != 0) bits++; /* keys 0 .. limit */
    int passes = (bits + 7) / 8;
    unsigned tiles[3] = {(unsigned)ntiles, 1, 1}, digits[3] = {256, 1, 1}, block[3] = {256, 1, 1};
    const uint32_t *kin = NULL, *pin = NULL;
    for (int p = 0; p < passes && s == SG_OK; p++) {
        int shift = 8 * p;
        uint32_t *kout = p + 1 == passes ? NULL : buf + (p % 2) * 2 * L,
                 *pout = kout ? kout + L : NULL;
        void *cargs[5] = {a, &kin, &hist, &shift, &ntiles}, *sargs[3] = {&hist, &total, &ntiles};
        void *pargs[9] = {a, &kin, &pin, &kout, &pout, &hist, &total, &shift, &ntiles};
        s = sg__cuda_launch(ctx, fc, tiles, block, 0, cargs);
        if (s == SG_OK) s = sg__cuda_launch(ctx, fs, digits, block, 0, sargs);
        if (s == SG_OK) s = sg__cuda_launch(ctx, fp, tiles, block, 0, pargs);
        kin = kout, pin = pout;
    }
    return s == SG_OK ? add_runs(ctx, a, dt) : s;
}

/*
 * dst[.., idx[j], ..] += src[.., j, ..]: by runs of equal indices after a
 * stable sort (index_add_runs; index_add_radix past RANK_MAX positions),
 * or, past 2^31 blocks of lanes, 2^31 positions or rows, or more scratch
 * than a recording finds (the step's first run, not recorded, grew it for
 * the same path), one thread per lane off dim walking j in order. Either
 * is deterministic (see k_data.cu).
 */
static sg_status index_add(sg_ctx *ctx, const sg__node *n) {
    const sg_tensor *dst = n->out, *idx = n->in[1], *src = n->in[2];
    int dim = (int)n->i[0], nd = dst->ndim;
    char what[64];
    snprintf(what, sizeof what, "dim %d of dst", dim);
    sg_status s = check_indices(ctx, "index_add", idx, dst->shape[dim], what);
    int64_t numel = sg__numel(nd, src->shape);
    if (s != SG_OK || numel == 0) return s;
    dt_args a;
    lane_walk(&a, dst, idx, src, dim, numel);
    int dt = (int)dst->dtype;
    bool lanes = (a.n + 255) / 256 <= INT32_MAX;
    if (lanes && a.count < INT32_MAX && a.limit < INT32_MAX && radix_always() &&
        sg__cuda_scratch_fits(ctx, radix_bytes(a.count)))
        return index_add_radix(ctx, &a, dt);
    if (lanes && a.count <= RANK_MAX &&
        sg__cuda_scratch_fits(ctx, (size_t)a.count * 3 * sizeof(uint64_t)))
        return index_add_runs(ctx, &a, dt);
    if (lanes && a.count > RANK_MAX && a.count < INT32_MAX && a.limit < INT32_MAX &&
        sg__cuda_scratch_fits(ctx, radix_bytes(a.count)))
        return index_add_radix(ctx, &a, dt);
    void *args[2] = {&a, &dt};
    return launch(ctx, "sg_data_index_add", a.n, args);
}

/* out[i] = start + i * step. */
static sg_status arange(sg_ctx *ctx, const sg__node *n) {
    const sg_tensor *out = n->out;
    void *p = sg__data(out);
    int64_t len = out->shape[0], stride = out->stride[0];
    int dt = (int)out->dtype;
    double start = n->f[0], step = n->f[1];
    if (len == 0) return SG_OK;
    void *args[6] = {&p, &len, &stride, &dt, &start, &step};
    return launch(ctx, "sg_data_arange", len, args);
}

/* out = draws from the Philox state in[0] (graphs/cpu/cpu_random.c has the mapping). */
static sg_status rand_draw(sg_ctx *ctx, const sg__node *n) {
    const sg_tensor *out = n->out, *rng = n->in[0];
    void *p = sg__data(out);
    const void *r = sg__data(rng);
    int64_t len = sg__numel(out->ndim, out->shape), rs = rng->stride[0];
    int dt = (int)out->dtype, dist = (int)n->i[0];
    if (len == 0) return SG_OK;
    void *args[6] = {&p, &len, &dt, &dist, &r, &rs};
    return launch(ctx, "sg_data_rand", (len + 1) / 2, args);
}

#define ROW_THREADS 512 /* k_data.cu: SB */
#define TOPK_BLK 2048   /* k_data.cu */

/* The most shared memory a block of a row kernel stages its row in: what
 * an H100 gives a block beside the kernels' own arrays (sg_data_topk_blk's
 * 22 KB; HIP: 64 KB in all). */
#define ROW_STAGE_MAX (200 * 1024)
#define ROW_STAGE_MAX_HIP (40 * 1024)

/* A block of ROW_THREADS a row; the blocks step through the rows. The row
 * (V entries of es bytes) is staged in shared memory where it fits (k_data.cu
 * row_of; SG_CUDA_ROW_STAGE=0: never): *staged, an argument of the kernel,
 * says whether. */
static sg_status launch_rows(sg_ctx *ctx, const char *name, int64_t rows, int64_t V, size_t es,
                             int *staged, void **args) {
    void *f;
    sg_status s = sg__cuda_kernel(ctx, SG__CU_DATA, name, &f);
    if (s != SG_OK) return s;
    int64_t cap = (int64_t)sg__cuda_sm_count(ctx) * 4;
    unsigned grid[3] = {(unsigned)(rows < cap ? rows : cap > 0 ? cap : 1), 1, 1};
    unsigned block[3] = {ROW_THREADS, 1, 1};
    const char *e = getenv("SG_CUDA_ROW_STAGE");
    size_t bytes = (size_t)V * es + 16;
    size_t most = sg__cuda_is_hip(ctx) ? ROW_STAGE_MAX_HIP : ROW_STAGE_MAX;
    *staged = !(e && strcmp(e, "0") == 0) && bytes <= most;
    if (*staged && bytes > 48 * 1024 &&
        sg__cuda_api(ctx)->cuFuncSetAttribute((CUfunction)f,
                                              CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                              (int)bytes) != CUDA_SUCCESS)
        *staged = 0;
    return sg__cuda_launch(ctx, f, grid, block, *staged ? bytes : 0, args);
}

/* TOPK and SAMPLE over the contiguous (rows, V) x: a block per row (TOPK
 * past TOPK_BLK entries a row: a thread per row). */
static sg_status per_row(sg_ctx *ctx, const sg__node *n) {
    const sg_tensor *x = n->in[0], *out = n->out;
    void *o = sg__data(out);
    const void *xp = sg__data(x);
    int dt = (int)x->dtype;
    int64_t V = x->shape[x->ndim - 1], rows = V ? sg__numel(x->ndim, x->shape) / V : 0;
    if (rows == 0) return SG_OK;
    size_t es = x->dtype == SG_F32 ? 4 : 2;
    int staged = 0;
    if (n->op == SG__OP_TOPK) {
        int64_t k = n->i[0];
        void *args[7] = {&o, &xp, &dt, &rows, &V, &k, &staged};
        if (k > TOPK_BLK || V >= INT32_MAX) return launch(ctx, "sg_data_topk", rows, args);
        return launch_rows(ctx, "sg_data_topk_blk", rows, V, es, &staged, args);
    }
    const sg_tensor *rng = n->in[1];
    const void *r = sg__data(rng);
    int64_t rs = rng->stride[0], top_k = n->i[0];
    int kind = (int)n->i[1];
    double temp = n->f[0], top_p = n->f[1];
    void *args[12] = {&o, &xp, &dt, &rows, &V, &r, &rs, &kind, &top_k, &temp, &top_p, &staged};
    if (V >= INT32_MAX)
        return sg__fail(ctx, SG_ERR_UNSUPPORTED,
                        "cuda: %s over rows of %lld entries: the CUDA kernel takes rows of fewer "
                        "than 2^31; draw on the CPU backend",
                        sg__op_name(n->op), (long long)V);
    return launch_rows(ctx, "sg_data_sample", rows, V, es, &staged, args);
}

sg_status sg__cuda_data_check(sg_ctx *ctx, const sg__node *n) {
    return sg__cuda_capturing(ctx) ? SG_OK : sg__data_check(ctx, n);
}

sg_status sg__cuda_data(sg_ctx *ctx, const sg__node *n) {
    switch (n->op) {
    case SG__OP_EMBEDDING: return embedding(ctx, n);
    case SG__OP_INDEX_SELECT: return gather_along(ctx, n, "sg_index_select", false);
    case SG__OP_INDEX_COPY: return index_copy(ctx, n);
    case SG__OP_INDEX_ADD: return index_add(ctx, n);
    case SG__OP_CONCAT: return concat(ctx, n);
    case SG__OP_ARANGE: return arange(ctx, n);
    case SG__OP_RAND: return rand_draw(ctx, n);
    case SG__OP_GATHER: return gather_along(ctx, n, "sg_gather", true);
    case SG__OP_TOPK:
    case SG__OP_SAMPLE: return per_row(ctx, n);
    default: break;
    }
    return sg__fail(ctx, SG_ERR_INTERNAL, "cuda: %s is not a data-family op", sg__op_name(n->op));
}

#endif /* SG_HAVE_CUDA_HEADERS */
