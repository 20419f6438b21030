/* SPDX-License-Identifier: MIT */
/*
 * ops_reduce.c -- front-ends of the reductions: sum, mean, max, min, var and
 * argmax. Each checks the dtype and the dims, works out the output's dtype
 * and shape, and dispatches one node.
 *
 * The node convention, shared with the kernels (graphs/cpu/cpu_reduce.c):
 *  - node.mask holds the reduced dims, bit d for input dim d.
 *  - node.out always has the *keepdim* shape: the input's ndim, with every
 *    reduced dim of size 1 (as ops.def says). With keepdim false the op
 *    returns a view of that output without the reduced dims; dropping size-1
 *    dims keeps it contiguous, and kernels (and later the recorder) see one
 *    shape convention.
 *  - VAR's correction is node.i[0]; the divisor is max(0, N - correction).
 *  - ARGMAX writes the row-major position of the maximum within the reduced
 *    dims: the index along the dim when one dim is reduced, the flattened
 *    index when all are.
 *
 * Dims: ndims 0 reduces every dim; negative dims count from the end; a dim
 * listed twice is an error (as in PyTorch). A 0-d input behaves as PyTorch's
 * scalars do: dim 0 or -1 names it and reduces its one element.
 * Empty ranges: the sum of none is 0, mean and var of none are NaN, and
 * max/min/argmax of none are SG_ERR_SHAPE (PyTorch raises too).
 */
#include "capture.h"

#include <stdio.h>

/* "[0,-1]" for a message. */
static const char *dims_str(int ndims, const int *dims, char *buf, size_t size) {
    size_t k = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < ndims && k < size; i++)
        k += (size_t)snprintf(buf + k, size - k, i ? ",%d" : "%d", dims[i]);
    if (k < size) snprintf(buf + k, size - k, "]");
    return buf;
}

static bool check_dtype(sg_ctx *ctx, const char *name, const sg_tensor *x, bool float_only) {
    bool ok = float_only ? sg__dtype_is_float(x->dtype) : x->dtype != SG_BOOL;
    if (ok) return true;
    char d[SG__DESC];
    sg__fail(ctx, SG_ERR_DTYPE, "sg_%s: got %s; it takes %s; convert with sg_cast first%s", name,
             sg__describe(x, d, sizeof d),
             float_only ? "f32, f16 or bf16" : "a numeric dtype (not bool)",
             x->dtype == SG_BOOL ? " (sg_cast(x, SG_I64) counts trues with sg_sum)" : "");
    return false;
}

/* The dims list as a mask of input dims; false (and a message) when it is bad. */
static bool dims_mask(sg_ctx *ctx, const char *name, const sg_tensor *x, int ndims,
                      const int *dims, uint32_t *mask) {
    char d[SG__DESC], l[96];
    if (ndims < 0 || ndims > SG_MAX_DIMS) {
        sg__fail(ctx, SG_ERR_INVALID_ARG, "sg_%s: ndims %d is out of range; pass 0 to %d dims "
                 "(0 reduces every dim)", name, ndims, SG_MAX_DIMS);
        return false;
    }
    if (ndims > 0 && !dims) {
        sg__fail(ctx, SG_ERR_NULL, "sg_%s: dims is NULL but ndims is %d; pass NULL with ndims 0 "
                 "to reduce every dim", name, ndims);
        return false;
    }
    if (ndims == 0) {
        *mask = (1u << x->ndim) - 1;
        return true;
    }
    /* A 0-d tensor has one nameable dim (0 or -1), as in PyTorch. */
    int span = x->ndim ? x->ndim : 1;
    uint32_t seen = 0;
    for (int k = 0; k < ndims; k++) {
        int nd = sg__norm_dim(dims[k], span);
        if (nd < 0) {
            sg__fail(ctx, SG_ERR_INDEX, "sg_%s: dim %d is out of range for %s; dims run from %d "
                     "to %d", name, dims[k], sg__describe(x, d, sizeof d), -span, span - 1);
            return false;
        }
        if (seen & (1u << nd)) {
            sg__fail(ctx, SG_ERR_INVALID_ARG, "sg_%s: dim %d appears more than once in dims %s "
                     "for %s; list each dim once", name, nd, dims_str(ndims, dims, l, sizeof l),
                     sg__describe(x, d, sizeof d));
            return false;
        }
        seen |= 1u << nd;
    }
    *mask = x->ndim ? seen : 0;
    return true;
}

/* max, min and argmax have no value on an empty range. */
static bool check_nonempty(sg_ctx *ctx, const char *name, const sg_tensor *x, uint32_t mask) {
    for (int d = 0; d < x->ndim; d++)
        if ((mask & (1u << d)) && x->shape[d] == 0) {
            char b[SG__DESC];
            sg__fail(ctx, SG_ERR_SHAPE, "sg_%s: dim %d of %s has size 0, so the reduced range is "
                     "empty and its %s is undefined; reduce only over non-empty dims (sg_sum of "
                     "an empty range is 0)", name, d, sg__describe(x, b, sizeof b), name);
            return false;
        }
    return true;
}

/* out without its reduced (size-1) dims, as a view; out's handle goes. */
static sg_tensor *drop_reduced(sg_tensor *out, uint32_t mask, const char *name) {
    int64_t sh[SG_MAX_DIMS], st[SG_MAX_DIMS];
    int nd = 0;
    for (int d = 0; d < out->ndim; d++)
        if (!(mask & (1u << d))) {
            sh[nd] = out->shape[d];
            st[nd] = out->stride[d];
            nd++;
        }
    char op[32];
    snprintf(op, sizeof op, "sg_%s", name);
    sg_tensor *v = sg__grad_view(out, sg__tensor_view(out, op, nd, sh, st, out->offset),
                                 SG__VIEW_RESHAPE, NULL);
    sg__tensor_drop(out); /* the view, if made, keeps the storage */
    return v;
}

static sg_tensor *run_reduce(sg_ctx *ctx, sg__op op, sg_tensor *x, uint32_t mask, bool keepdim,
                             int64_t correction, sg_dtype out_dt) {
    int64_t kshape[SG_MAX_DIMS];
    for (int d = 0; d < x->ndim; d++) kshape[d] = (mask & (1u << d)) ? 1 : x->shape[d];
    sg_tensor *in[1] = {x};
    sg__node n = {.op = op, .nin = 1, .in = in, .mask = mask, .i = {correction}};
    sg_tensor *out = sg__run_new(ctx, &n, out_dt, x->ndim, kshape);
    if (!out || keepdim) return out;
    return drop_reduced(out, mask, sg__op_name(op));
}

static sg_tensor *reduce(sg__op op, sg_tensor *x, int ndims, const int *dims, bool keepdim,
                         int correction) {
    const char *name = sg__op_name(op);
    sg_ctx *ctx = sg__check_inputs(name, 1, &x, NULL);
    if (!ctx) return NULL;
    bool float_only = op == SG__OP_MEAN || op == SG__OP_VAR;
    uint32_t mask;
    if (!check_dtype(ctx, name, x, float_only) || !dims_mask(ctx, name, x, ndims, dims, &mask))
        return NULL;
    if ((op == SG__OP_MAX || op == SG__OP_MIN) && !check_nonempty(ctx, name, x, mask)) return NULL;
    /* Integer sums widen to i64, as in PyTorch, so that they rarely wrap. */
    sg_dtype dt = op == SG__OP_SUM && !sg__dtype_is_float(x->dtype) ? SG_I64 : x->dtype;
    return run_reduce(ctx, op, x, mask, keepdim, correction, dt);
}

sg_tensor *sg_sum(sg_tensor *x, int ndims, const int *dims, bool keepdim) {
    return reduce(SG__OP_SUM, x, ndims, dims, keepdim, 0);
}

sg_tensor *sg_mean(sg_tensor *x, int ndims, const int *dims, bool keepdim) {
    return reduce(SG__OP_MEAN, x, ndims, dims, keepdim, 0);
}

sg_tensor *sg_max(sg_tensor *x, int ndims, const int *dims, bool keepdim) {
    return reduce(SG__OP_MAX, x, ndims, dims, keepdim, 0);
}

sg_tensor *sg_min(sg_tensor *x, int ndims, const int *dims, bool keepdim) {
    return reduce(SG__OP_MIN, x, ndims, dims, keepdim, 0);
}

sg_tensor *sg_var(sg_tensor *x, int ndims, const int *dims, int correction, bool keepdim) {
    return reduce(SG__OP_VAR, x, ndims, dims, keepdim, correction);
}

sg_tensor *sg_argmax(sg_tensor *x, int dim, bool keepdim) {
    sg_ctx *ctx = sg__check_inputs("argmax", 1, &x, NULL);
    if (!ctx) return NULL;
    uint32_t mask = (1u << x->ndim) - 1;
    if (!check_dtype(ctx, "argmax", x, false)) return NULL;
    if (dim != SG_ALL_DIMS && !dims_mask(ctx, "argmax", x, 1, &dim, &mask)) return NULL;
    if (!check_nonempty(ctx, "argmax", x, mask)) return NULL;
    return run_reduce(ctx, SG__OP_ARGMAX, x, mask, keepdim, 0, SG_I64);
}
