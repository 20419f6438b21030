/* SPDX-License-Identifier: MIT */
/*
 * ops_pointwise.c -- front-ends of the elementwise ops: unary math, cast,
 * scalar forms, binary arithmetic with broadcasting, comparisons, logical
 * ops, where, and the in-place copy_, fill_ and add_. Each checks dtypes and
 * shapes, names the fix when they are wrong, and dispatches one node.
 */
#include "capture.h"

#include <stdio.h>

static const char *kind_float = "f32, f16 or bf16";

/* The public name of an op ("sg_exp"), for messages. */
static const char *fn_name(sg__op op, char *buf, size_t size) {
    snprintf(buf, size, "sg_%s", sg__op_name(op));
    return buf;
}

/*
 * The broadcast of n inputs (named by names[] in messages). Like
 * sg__broadcast, but a clash names the two inputs that clash, which for
 * where need not include the first.
 */
static bool broadcast(sg_ctx *ctx, const char *fn, int n, sg_tensor *const *ts,
                      const char *const *names, int *ndim, int64_t *shape) {
    int nd = 0, who[SG_MAX_DIMS];
    for (int i = 0; i < n; i++)
        if (ts[i]->ndim > nd) nd = ts[i]->ndim;
    for (int d = 0; d < nd; d++) shape[d] = 1, who[d] = 0;
    for (int i = 0; i < n; i++)
        for (int d = 0; d < ts[i]->ndim; d++) {
            int o = nd - ts[i]->ndim + d;
            int64_t s = ts[i]->shape[d];
            if (s == shape[o] || s == 1) continue;
            if (shape[o] == 1) {
                shape[o] = s, who[o] = i;
                continue;
            }
            char a[SG__DESC], b[SG__DESC];
            sg__fail(ctx, SG_ERR_SHAPE, "%s: %s %s and %s %s do not broadcast (dim %d: %lld vs "
                     "%lld); sizes must match or be 1", fn, names[who[o]],
                     sg__describe(ts[who[o]], a, sizeof a), names[i],
                     sg__describe(ts[i], b, sizeof b), o - nd, (long long)shape[o], (long long)s);
            return false;
        }
    *ndim = nd;
    return true;
}

static sg_tensor *unary(sg__op op, sg_tensor *x, bool ints_ok) {
    char name[32];
    fn_name(op, name, sizeof name);
    sg_ctx *ctx = sg__check_inputs(name, 1, &x, NULL);
    if (!ctx) return NULL;
    bool ok = sg__dtype_is_float(x->dtype) ||
              (ints_ok && (x->dtype == SG_I32 || x->dtype == SG_I64));
    if (!ok) {
        char d[SG__DESC];
        sg__fail(ctx, SG_ERR_DTYPE, "%s: got %s; it takes %s%s; convert with sg_cast first",
                 name, sg__describe(x, d, sizeof d), kind_float, ints_ok ? ", i32 or i64" : "");
        return NULL;
    }
    sg_tensor *in[1] = {x};
    sg__node n = {.op = op, .nin = 1, .in = in};
    return sg__run_new(ctx, &n, x->dtype, x->ndim, x->shape);
}

sg_tensor *sg_neg(sg_tensor *x) { return unary(SG__OP_NEG, x, true); }
sg_tensor *sg_abs(sg_tensor *x) { return unary(SG__OP_ABS, x, true); }
sg_tensor *sg_relu(sg_tensor *x) { return unary(SG__OP_RELU, x, true); }
sg_tensor *sg_exp(sg_tensor *x) { return unary(SG__OP_EXP, x, false); }
sg_tensor *sg_log(sg_tensor *x) { return unary(SG__OP_LOG, x, false); }
sg_tensor *sg_sqrt(sg_tensor *x) { return unary(SG__OP_SQRT, x, false); }
sg_tensor *sg_rsqrt(sg_tensor *x) { return unary(SG__OP_RSQRT, x, false); }
sg_tensor *sg_sin(sg_tensor *x) { return unary(SG__OP_SIN, x, false); }
sg_tensor *sg_cos(sg_tensor *x) { return unary(SG__OP_COS, x, false); }
sg_tensor *sg_tanh(sg_tensor *x) { return unary(SG__OP_TANH, x, false); }
sg_tensor *sg_sigmoid(sg_tensor *x) { return unary(SG__OP_SIGMOID, x, false); }
sg_tensor *sg_gelu(sg_tensor *x) { return unary(SG__OP_GELU, x, false); }
sg_tensor *sg_gelu_tanh(sg_tensor *x) { return unary(SG__OP_GELU_TANH, x, false); }
sg_tensor *sg_silu(sg_tensor *x) { return unary(SG__OP_SILU, x, false); }

sg_tensor *sg_logical_not(sg_tensor *x) {
    sg_ctx *ctx = sg__check_inputs("sg_logical_not", 1, &x, NULL);
    if (!ctx) return NULL;
    sg_tensor *in[1] = {x};
    sg__node n = {.op = SG__OP_LOGICAL_NOT, .nin = 1, .in = in};
    return sg__run_new(ctx, &n, SG_BOOL, x->ndim, x->shape);
}

sg_tensor *sg_cast(sg_tensor *x, sg_dtype dt) {
    sg_ctx *ctx = sg__check_inputs("sg_cast", 1, &x, NULL);
    if (!ctx) return NULL;
    if (!sg__dtype_valid(dt)) {
        sg__fail(ctx, SG_ERR_DTYPE, "sg_cast: %d is not a dtype; use one of SG_F32 .. SG_BOOL",
                 (int)dt);
        return NULL;
    }
    sg_tensor *in[1] = {x};
    sg__node n = {.op = SG__OP_CAST, .nin = 1, .in = in};
    return sg__run_new(ctx, &n, dt, x->ndim, x->shape);
}

static sg_tensor *scalar_op(sg__op op, sg_tensor *x, double s0, double s1, bool float_only) {
    char name[32];
    fn_name(op, name, sizeof name);
    sg_ctx *ctx = sg__check_inputs(name, 1, &x, NULL);
    if (!ctx) return NULL;
    char d[SG__DESC];
    bool ok = float_only ? sg__dtype_is_float(x->dtype) : x->dtype != SG_BOOL;
    if (!ok) {
        sg__fail(ctx, SG_ERR_DTYPE, "%s: got %s; it takes %s; convert with sg_cast first", name,
                 sg__describe(x, d, sizeof d), float_only ? kind_float : "a numeric dtype");
        return NULL;
    }
    sg_tensor *in[1] = {x};
    sg__node n = {.op = op, .nin = 1, .in = in, .f = {s0, s1}};
    return sg__run_new(ctx, &n, x->dtype, x->ndim, x->shape);
}

sg_tensor *sg_add_scalar(sg_tensor *x, double s) { return scalar_op(SG__OP_ADD_SCALAR, x, s, 0, false); }
sg_tensor *sg_mul_scalar(sg_tensor *x, double s) { return scalar_op(SG__OP_MUL_SCALAR, x, s, 0, false); }
sg_tensor *sg_pow_scalar(sg_tensor *x, double s) { return scalar_op(SG__OP_POW_SCALAR, x, s, 0, true); }

sg_tensor *sg_clamp(sg_tensor *x, double lo, double hi) {
    if (x && x->magic == SG__TENSOR_LIVE && !(lo <= hi)) {
        sg__fail(x->ctx, SG_ERR_INVALID_ARG, "sg_clamp: lo %g is %s hi %g; it needs lo <= hi", lo,
                 lo > hi ? "above" : "NaN or beside a NaN", hi);
        return NULL;
    }
    return scalar_op(SG__OP_CLAMP, x, lo, hi, false);
}

/* What a binary op accepts. */
enum { NUMERIC, FLOATS, ANY };

static sg_tensor *binary(sg__op op, sg_tensor *a, sg_tensor *b, int accepts, bool same_dtype,
                         bool to_bool) {
    char name[32];
    fn_name(op, name, sizeof name);
    sg_tensor *in[2] = {a, b};
    sg_ctx *ctx = sg__check_inputs(name, 2, in, NULL);
    if (!ctx) return NULL;
    char da[SG__DESC], db[SG__DESC];
    if (same_dtype && a->dtype != b->dtype) {
        sg__fail(ctx, SG_ERR_DTYPE, "%s: dtypes differ (%s and %s); convert one with sg_cast",
                 name, sg__describe(a, da, sizeof da), sg__describe(b, db, sizeof db));
        return NULL;
    }
    bool ok = accepts == ANY || (accepts == FLOATS ? sg__dtype_is_float(a->dtype)
                                                   : a->dtype != SG_BOOL);
    if (!ok) {
        sg__fail(ctx, SG_ERR_DTYPE, "%s: got %s; it takes %s; convert with sg_cast first", name,
                 sg__describe(a, da, sizeof da),
                 accepts == FLOATS ? kind_float : "a numeric dtype (not bool)");
        return NULL;
    }
    int nd;
    int64_t shape[SG_MAX_DIMS];
    static const char *const names[2] = {"a", "b"};
    if (!broadcast(ctx, name, 2, in, names, &nd, shape)) return NULL;
    sg__node n = {.op = op, .nin = 2, .in = in};
    return sg__run_new(ctx, &n, to_bool ? SG_BOOL : a->dtype, nd, shape);
}

sg_tensor *sg_add(sg_tensor *a, sg_tensor *b) { return binary(SG__OP_ADD, a, b, NUMERIC, true, false); }
sg_tensor *sg_sub(sg_tensor *a, sg_tensor *b) { return binary(SG__OP_SUB, a, b, NUMERIC, true, false); }
sg_tensor *sg_mul(sg_tensor *a, sg_tensor *b) { return binary(SG__OP_MUL, a, b, NUMERIC, true, false); }
sg_tensor *sg_div(sg_tensor *a, sg_tensor *b) { return binary(SG__OP_DIV, a, b, FLOATS, true, false); }
sg_tensor *sg_pow(sg_tensor *a, sg_tensor *b) { return binary(SG__OP_POW, a, b, FLOATS, true, false); }
sg_tensor *sg_maximum(sg_tensor *a, sg_tensor *b) { return binary(SG__OP_MAXIMUM, a, b, NUMERIC, true, false); }
sg_tensor *sg_minimum(sg_tensor *a, sg_tensor *b) { return binary(SG__OP_MINIMUM, a, b, NUMERIC, true, false); }
sg_tensor *sg_eq(sg_tensor *a, sg_tensor *b) { return binary(SG__OP_EQ, a, b, ANY, true, true); }
sg_tensor *sg_ne(sg_tensor *a, sg_tensor *b) { return binary(SG__OP_NE, a, b, ANY, true, true); }
sg_tensor *sg_lt(sg_tensor *a, sg_tensor *b) { return binary(SG__OP_LT, a, b, ANY, true, true); }
sg_tensor *sg_le(sg_tensor *a, sg_tensor *b) { return binary(SG__OP_LE, a, b, ANY, true, true); }
sg_tensor *sg_gt(sg_tensor *a, sg_tensor *b) { return binary(SG__OP_GT, a, b, ANY, true, true); }
sg_tensor *sg_ge(sg_tensor *a, sg_tensor *b) { return binary(SG__OP_GE, a, b, ANY, true, true); }
sg_tensor *sg_logical_and(sg_tensor *a, sg_tensor *b) { return binary(SG__OP_LOGICAL_AND, a, b, ANY, false, true); }
sg_tensor *sg_logical_or(sg_tensor *a, sg_tensor *b) { return binary(SG__OP_LOGICAL_OR, a, b, ANY, false, true); }

sg_tensor *sg__gelu_tanh_grad(sg_tensor *x, sg_tensor *g) {
    return binary(SG__OP_GELU_TANH_BWD, x, g, FLOATS, true, false);
}

sg_tensor *sg_where(sg_tensor *cond, sg_tensor *a, sg_tensor *b) {
    sg_tensor *in[3] = {cond, a, b};
    sg_ctx *ctx = sg__check_inputs("sg_where", 3, in, NULL);
    if (!ctx) return NULL;
    char d0[SG__DESC], d1[SG__DESC];
    if (cond->dtype != SG_BOOL) {
        sg__fail(ctx, SG_ERR_DTYPE, "sg_where: cond is %s; it must be bool (make one with a "
                 "comparison or sg_cast(x, SG_BOOL))", sg__describe(cond, d0, sizeof d0));
        return NULL;
    }
    if (a->dtype != b->dtype) {
        sg__fail(ctx, SG_ERR_DTYPE, "sg_where: a and b differ in dtype (%s and %s); convert one "
                 "with sg_cast", sg__describe(a, d0, sizeof d0), sg__describe(b, d1, sizeof d1));
        return NULL;
    }
    int nd;
    int64_t shape[SG_MAX_DIMS];
    static const char *const names[3] = {"cond", "a", "b"};
    if (!broadcast(ctx, "sg_where", 3, in, names, &nd, shape)) return NULL;
    sg__node n = {.op = SG__OP_WHERE, .nin = 3, .in = in};
    return sg__run_new(ctx, &n, a->dtype, nd, shape);
}

/* ------------------------------------------------------------ in place */

/* An in-place destination may not repeat elements (an expanded view). */
static sg_status check_dst(sg_ctx *ctx, const char *name, const sg_tensor *dst) {
    for (int d = 0; d < dst->ndim; d++)
        if (dst->stride[d] == 0 && dst->shape[d] > 1) {
            char b[SG__DESC];
            return sg__fail(ctx, SG_ERR_INVALID_ARG, "%s: the destination %s is an expanded view "
                            "whose elements repeat; write to a sg_contiguous copy instead", name,
                            sg__describe(dst, b, sizeof b));
        }
    return SG_OK;
}

/* True when a's and b's element ranges in one storage may overlap. */
static bool may_overlap(const sg_tensor *a, const sg_tensor *b) {
    if (a->st != b->st) return false;
    int64_t alo = a->offset, ahi = a->offset, blo = b->offset, bhi = b->offset;
    for (int d = 0; d < a->ndim; d++) ahi += (a->shape[d] - 1) * a->stride[d];
    for (int d = 0; d < b->ndim; d++) bhi += (b->shape[d] - 1) * b->stride[d];
    return !(ahi < blo || bhi < alo);
}

/* Check src broadcasts to dst's shape exactly (dst does not grow). */
static sg_status check_into(sg_ctx *ctx, const char *name, sg_tensor *dst, sg_tensor *src) {
    sg_tensor *pair[2] = {dst, src};
    static const char *const names[2] = {"dst", "src"};
    int nd;
    int64_t shape[SG_MAX_DIMS];
    if (!broadcast(ctx, name, 2, pair, names, &nd, shape)) return SG_ERR_SHAPE;
    if (nd != dst->ndim || memcmp(shape, dst->shape, sizeof(int64_t) * (size_t)nd) != 0) {
        char a[SG__DESC], b[SG__DESC];
        return sg__fail(ctx, SG_ERR_SHAPE, "%s: src %s does not broadcast to dst %s (dst's "
                        "shape cannot change in place)", name, sg__describe(src, a, sizeof a),
                        sg__describe(dst, b, sizeof b));
    }
    return check_dst(ctx, name, dst);
}

/* Run an in-place elementwise node whose reads may overlap its writes:
 * overlapping inputs other than dst itself are cloned first. */
#define SG__MAX_IN_PLACE 3

static sg_status run_into(sg_ctx *ctx, sg__node *n, sg_tensor *dst, sg_tensor **in, int first) {
    sg_tensor *tmp[SG__MAX_IN_PLACE] = {NULL};
    sg_status s = SG_OK;
    for (int i = first; i < n->nin; i++)
        if (may_overlap(in[i], dst)) {
            tmp[i] = sg_clone(in[i]);
            if (!tmp[i]) { /* inputs are checked: only memory can fail here */
                s = SG_ERR_OOM;
                goto done;
            }
            in[i] = tmp[i];
        }
    n->out = dst;
    s = sg__dispatch(ctx, n);
done:
    for (int i = 0; i < SG__MAX_IN_PLACE; i++) sg__tensor_drop(tmp[i]);
    return s;
}

sg_status sg_copy_(sg_tensor *dst, sg_tensor *src) {
    sg_tensor *in[2] = {dst, src};
    sg_ctx *ctx = sg__check_inputs("sg_copy_", 2, in, NULL);
    if (!ctx) return sg__inputs_status(2, in);
    sg_status s = check_into(ctx, "sg_copy_", dst, src);
    if (s != SG_OK) return s;
    sg_tensor *args[1] = {src};
    sg__node n = {.op = SG__OP_COPY, .nin = 1, .in = args};
    return run_into(ctx, &n, dst, args, 0);
}

sg_status sg_add_(sg_tensor *dst, sg_tensor *src) {
    sg_tensor *in[2] = {dst, src};
    sg_ctx *ctx = sg__check_inputs("sg_add_", 2, in, NULL);
    if (!ctx) return sg__inputs_status(2, in);
    char a[SG__DESC], b[SG__DESC];
    if (dst->dtype != src->dtype || dst->dtype == SG_BOOL)
        return sg__fail(ctx, SG_ERR_DTYPE, "sg_add_: dst %s and src %s must share a numeric dtype; "
                        "convert src with sg_cast", sg__describe(dst, a, sizeof a),
                        sg__describe(src, b, sizeof b));
    sg_status s = check_into(ctx, "sg_add_", dst, src);
    if (s != SG_OK) return s;
    sg_tensor *args[2] = {dst, src};
    sg__node n = {.op = SG__OP_ADD, .nin = 2, .in = args};
    return run_into(ctx, &n, dst, args, 1);
}

sg_status sg_fill_(sg_tensor *dst, double value) {
    sg_ctx *ctx = sg__check_inputs("sg_fill_", 1, &dst, NULL);
    if (!ctx) return sg__inputs_status(1, &dst);
    sg_status s = check_dst(ctx, "sg_fill_", dst);
    if (s != SG_OK) return s;
    sg__node n = {.op = SG__OP_FILL, .nin = 0, .in = NULL, .out = dst, .f = {value}};
    return sg__dispatch(ctx, &n);
}
