/* SPDX-License-Identifier: MIT */
/*
 * backend.h -- the one place that names devices. Each backend provides an
 * init function that checks its driver and device and fills the context's
 * executor (capture.h: sg__exec); sg_ctx_create tries them in order.
 * Later layers add graph build/instantiate/replay/patch slots here.
 */
#ifndef SG_BACKEND_H
#define SG_BACKEND_H

#include "../capture/capture.h"

struct sg_fn;
struct sg__graph;
struct sg__fuse_opts;

/*
 * Compiled captures, per backend (ctx->gops). After fusion, compile turns
 * the groups into runnable code (a non-OK status makes the capture replay op
 * by op instead); run replays it into output set `set` once the slot bases
 * (g->slotp) hold this call's addresses; release frees what compile made.
 * fuse_opts, when set, gives the fusion options the backend's code expects
 * (NULL: the defaults).
 */
typedef struct sg__graph_ops {
    sg_status (*compile)(struct sg_fn *fn, struct sg__graph *g);
    sg_status (*run)(struct sg_fn *fn, struct sg__graph *g, int set);
    void (*release)(sg_ctx *ctx, struct sg__graph *g);
    void (*fuse_opts)(struct sg__fuse_opts *o, bool disable);
    /* Optional: one replay with every kernel timed on the device, each
     * reported through sg__trace_kernel (sg_fn_trace); NULL where the
     * generic path times the kernels on the host. */
    sg_status (*timed_run)(struct sg_fn *fn, struct sg__graph *g, int set);
    /* The backend's kernel for cross_entropy's gradient works element by
     * element (every work-item reads its row and writes its element at
     * once), so the gradient may not take its logits' bytes (graph.c
     * inplace_hosts). */
    bool xent_by_element;
} sg__graph_ops;

SG__HIDDEN extern const sg__graph_ops sg__cpu_graph_ops;

/*
 * A reduction of x into y over the dims in mask, as index spaces: M outputs
 * over the kept dims (size, x stride, y stride each) and L elements each
 * over the reduced dims (size, x stride each). Size-1 dims are dropped and
 * reduced dims that walk as one are merged; with nothing left to reduce,
 * one reduced dim of size 1. Every backend's reduce kernels walk these.
 */
typedef struct sg__rdims {
    int64_t ksize[SG_MAX_DIMS], kxs[SG_MAX_DIMS], kys[SG_MAX_DIMS];
    int64_t rsize[SG_MAX_DIMS], rxs[SG_MAX_DIMS];
    int64_t M, L;
    int nk, nr;
} sg__rdims;
SG__HIDDEN void sg__reduce_dims(const sg_tensor *x, const sg_tensor *y, uint32_t mask,
                                sg__rdims *r);

/*
 * The index space of a pointwise op over nops operands sharing shape, each
 * with its strides: size-1 dims dropped, and each dim merged into its outer
 * neighbour when every operand steps over the pair as one (outer stride =
 * inner stride * inner size). A same-shape op on contiguous tensors becomes
 * one long row; a [N,4] op no longer pays per-row costs every 4 elements.
 * Rewrites shape and stride in place; returns the new ndim.
 */
SG__HIDDEN int sg__coalesce_dims(int ndim, int64_t *shape, int nops,
                                 int64_t (*stride)[SG_MAX_DIMS]);

/*
 * A product's (MATMUL, LINEAR) sizes: M x K by K x N over nb batch dims of
 * the result's shape bshape, and where each operand's matrix lies in its
 * tensor: the row dim and column dim (-1: absent, a size of 1) and how many
 * leading dims are batch dims. LINEAR's weight (N, K) is read as its
 * transpose. Every backend's product kernels read their operands so.
 */
typedef struct sg__mm_role {
    int rdim, cdim, tb;
} sg__mm_role;
typedef struct sg__mm_dims {
    int64_t M, N, K;
    int nb;
    int64_t bshape[SG_MAX_DIMS];
    sg__mm_role a, b, c;
} sg__mm_dims;
SG__HIDDEN void sg__mm_dims_of(const sg__node *n, sg__mm_dims *d);

/* Fill ctx->exec for the CPU. Never unavailable; fails only on OOM. */
SG__HIDDEN sg_status sg__cpu_init(sg_ctx *ctx);

/* Index checks for a device's data kernels (data_check.c): idx (any shape
 * and strides, i32/i64) read back with ctx->exec.download and every entry
 * checked to be in [0, limit), failing with SG_ERR_INDEX and the CPU's
 * message (op, the entry's row-major position, what it indexes). */
SG__HIDDEN sg_status sg__check_indices(sg_ctx *ctx, const char *op, const sg_tensor *idx,
                                       int64_t limit, const char *what);
/* The check of node n when it is embedding, index_select, index_copy_,
 * gather or index_add (its indices), or cross_entropy (its targets, in [0, C)); SG_OK for any
 * other op: before its generated kernel writes anything. */
SG__HIDDEN sg_status sg__data_check(sg_ctx *ctx, const sg__node *n);

#endif /* SG_BACKEND_H */
