/* SPDX-License-Identifier: MIT */
/*
 * ops_comm.c -- front-ends of the collectives (all_reduce, all_gather,
 * reduce_scatter, broadcast; see "distributed" in stepgraph.h): each checks
 * the communicator, the dtype and the shape, makes its input contiguous
 * (a copy node when it is not) and dispatches one COMM node naming the
 * communicator by its id. graphs/comm.c runs the node through MPI or NCCL.
 */
#include "capture.h"

#include <stdio.h>

/* The status of a collective's arguments; *ctx gets x's context when x is
 * a live tensor (a NULL x is SG_ERR_NULL without a message). */
static sg_status check_comm(const char *name, sg_comm *comm, sg_tensor *x, sg_ctx **ctx) {
    *ctx = sg__check_inputs(name, 1, &x, NULL);
    if (!*ctx) return sg__inputs_status(1, &x);
    if (!comm || comm->magic != SG__COMM_LIVE)
        return sg__fail(*ctx, SG_ERR_INVALID_ARG,
                        "%s: the communicator is %s; make one with "
                        "sg_comm_create",
                        name, comm ? "destroyed or not a communicator" : "NULL");
    if (comm->ctx != *ctx)
        return sg__fail(*ctx, SG_ERR_WRONG_CONTEXT,
                        "%s: the communicator belongs to another "
                        "context than x; make the communicator on x's context",
                        name);
    return SG_OK;
}

static bool check_dtype(sg_ctx *ctx, const char *name, const sg_tensor *x, bool reduces, int op) {
    char d[SG__DESC];
    if (reduces && op != SG_REDUCE_SUM && op != SG_REDUCE_MEAN) {
        sg__fail(ctx, SG_ERR_INVALID_ARG,
                 "%s: op %d is no sg_reduce_op; use SG_REDUCE_SUM or "
                 "SG_REDUCE_MEAN",
                 name, op);
        return false;
    }
    if (reduces && x->dtype == SG_BOOL) {
        sg__fail(ctx, SG_ERR_DTYPE, "%s: %s cannot be summed; convert it with sg_cast to i32", name,
                 sg__describe(x, d, sizeof d));
        return false;
    }
    if (reduces && op == SG_REDUCE_MEAN && !sg__dtype_is_float(x->dtype)) {
        sg__fail(ctx, SG_ERR_DTYPE,
                 "%s: SG_REDUCE_MEAN of %s; the mean takes f32, f16 or bf16 "
                 "(sum the integers with SG_REDUCE_SUM, or sg_cast to f32)",
                 name, sg__describe(x, d, sizeof d));
        return false;
    }
    return true;
}

/* Dispatch the collective: in[0] = x made contiguous, out a new tensor of
 * (ndim, shape). */
static sg_tensor *run_new(sg_ctx *ctx, sg_comm *comm, sg__op op, sg_tensor *x, int64_t arg,
                          int ndim, const int64_t *shape) {
    sg_tensor *c = sg__is_contiguous(x) ? x : sg_contiguous(x);
    if (!c) return NULL;
    sg_tensor *in[1] = {c};
    sg__node n = {.op = op, .nin = 1, .in = in, .i = {comm->id, arg}};
    sg_tensor *out = sg__run_new(ctx, &n, x->dtype, ndim, shape);
    if (c != x) sg__tensor_drop(c);
    return out;
}

sg_tensor *sg_all_reduce(sg_comm *comm, sg_tensor *x, sg_reduce_op op) {
    sg_ctx *ctx;
    if (check_comm("sg_all_reduce", comm, x, &ctx) != SG_OK ||
        !check_dtype(ctx, "sg_all_reduce", x, true, (int)op))
        return NULL;
    return run_new(ctx, comm, SG__OP_ALL_REDUCE, x, op, x->ndim, x->shape);
}

sg_status sg_all_reduce_(sg_comm *comm, sg_tensor *x, sg_reduce_op op) {
    sg_ctx *ctx;
    sg_status s = check_comm("sg_all_reduce_", comm, x, &ctx);
    if (s != SG_OK) return s;
    if (!check_dtype(ctx, "sg_all_reduce_", x, true, (int)op)) return sg_ctx_status(ctx);
    if (!sg__is_contiguous(x)) {
        char d[SG__DESC];
        return sg__fail(ctx, SG_ERR_INVALID_ARG,
                        "sg_all_reduce_: %s is not contiguous; reduce "
                        "a sg_contiguous copy (or use sg_all_reduce)",
                        sg__describe(x, d, sizeof d));
    }
    sg_tensor *in[1] = {x};
    sg__node n = {.op = SG__OP_ALL_REDUCE, .nin = 1, .in = in, .out = x, .i = {comm->id, op}};
    return sg__dispatch(ctx, &n);
}

sg_tensor *sg_all_gather(sg_comm *comm, sg_tensor *x) {
    sg_ctx *ctx;
    if (check_comm("sg_all_gather", comm, x, &ctx) != SG_OK) return NULL;
    if (x->ndim < 1) {
        sg__fail(ctx, SG_ERR_SHAPE,
                 "sg_all_gather: x is 0-d; gathering concatenates along dim "
                 "0, so view it as (1) with sg_reshape first");
        return NULL;
    }
    int64_t shape[SG_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    shape[0] *= comm->size;
    return run_new(ctx, comm, SG__OP_ALL_GATHER, x, 0, x->ndim, shape);
}

sg_tensor *sg_reduce_scatter(sg_comm *comm, sg_tensor *x, sg_reduce_op op) {
    sg_ctx *ctx;
    if (check_comm("sg_reduce_scatter", comm, x, &ctx) != SG_OK ||
        !check_dtype(ctx, "sg_reduce_scatter", x, true, (int)op))
        return NULL;
    char d[SG__DESC];
    if (x->ndim < 1 || x->shape[0] % comm->size) {
        sg__fail(ctx, SG_ERR_SHAPE,
                 "sg_reduce_scatter: %s: dim 0 must be a multiple of the %d "
                 "ranks; pad it",
                 sg__describe(x, d, sizeof d), comm->size);
        return NULL;
    }
    int64_t shape[SG_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    shape[0] /= comm->size;
    return run_new(ctx, comm, SG__OP_REDUCE_SCATTER, x, op, x->ndim, shape);
}

sg_tensor *sg_broadcast(sg_comm *comm, sg_tensor *x, int root) {
    sg_ctx *ctx;
    if (check_comm("sg_broadcast", comm, x, &ctx) != SG_OK) return NULL;
    if (root < 0 || root >= comm->size) {
        sg__fail(ctx, SG_ERR_INDEX, "sg_broadcast: root %d is out of range for %d ranks", root,
                 comm->size);
        return NULL;
    }
    return run_new(ctx, comm, SG__OP_BROADCAST, x, root, x->ndim, x->shape);
}
