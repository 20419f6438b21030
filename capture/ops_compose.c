/* SPDX-License-Identifier: MIT */
/*
 * ops_compose.c -- ops torch users reach for that are compositions of
 * existing ops (so every backend, fusion and a gradient come with them):
 * masked_fill (where over a 0-d fill), div_scalar (a true division by a
 * 0-d f32 tensor, not a multiplication by 1/s) and repeat_interleave (an
 * expand of a new dim, merged back by reshape).
 */
#include "capture.h"

#include <stdio.h>

sg_tensor *sg_masked_fill(sg_tensor *x, sg_tensor *mask, double value) {
    sg_tensor *in[2] = {x, mask};
    sg_ctx *ctx = sg__check_inputs("sg_masked_fill", 2, in, NULL);
    if (!ctx) return NULL;
    char a[SG__DESC], b[SG__DESC];
    if (mask->dtype != SG_BOOL) {
        sg__fail(ctx, SG_ERR_DTYPE,
                 "sg_masked_fill: mask is %s; it must be bool (make one "
                 "with a comparison, or sg_cast(mask, SG_BOOL))",
                 sg__describe(mask, a, sizeof a));
        return NULL;
    }
    bool fits = mask->ndim <= x->ndim;
    for (int d = 0; fits && d < mask->ndim; d++) {
        int64_t m = mask->shape[d], s = x->shape[d + x->ndim - mask->ndim];
        fits = m == 1 || m == s;
    }
    if (!fits) {
        sg__fail(ctx, SG_ERR_SHAPE,
                 "sg_masked_fill: mask %s does not broadcast to x %s (it may "
                 "not grow x); sizes must match x's or be 1",
                 sg__describe(mask, a, sizeof a), sg__describe(x, b, sizeof b));
        return NULL;
    }
    sg_tensor *v = sg_full(ctx, x->dtype, 0, NULL, value);
    sg_tensor *out = sg_where(mask, v, x);
    sg__tensor_drop(v);
    return out;
}

sg_tensor *sg_div_scalar(sg_tensor *x, double s) {
    sg_ctx *ctx = sg__check_inputs("sg_div_scalar", 1, &x, NULL);
    if (!ctx) return NULL;
    if (x->dtype == SG_BOOL) {
        char d[SG__DESC];
        sg__fail(ctx, SG_ERR_DTYPE,
                 "sg_div_scalar: x is %s; it takes numeric dtypes (cast "
                 "bool first)",
                 sg__describe(x, d, sizeof d));
        return NULL;
    }
    /* Computed in f32 (f16/bf16 widened, ints true-divided as in torch) and
     * rounded once to x's float dtype. */
    sg_tensor *xf = x->dtype == SG_F32 ? x : sg_cast(x, SG_F32);
    sg_tensor *d = sg_full(ctx, SG_F32, 0, NULL, s);
    sg_tensor *q = sg_div(xf, d);
    sg_tensor *out = q;
    if (q && (x->dtype == SG_F16 || x->dtype == SG_BF16)) {
        out = sg_cast(q, x->dtype);
        sg__tensor_drop(q);
    }
    if (xf != x) sg__tensor_drop(xf);
    sg__tensor_drop(d);
    return out;
}

/* repeat_interleave over a 6-d x, where no dim can be added: an
 * index_select with idx = [0]*r ++ [1]*r ++ ... */
static sg_tensor *repeat_by_index(sg_ctx *ctx, sg_tensor *x, int64_t repeats, int d) {
    int64_t n = x->shape[d], two[2] = {n, repeats}, flat[1] = {n * repeats};
    sg_tensor *ar = sg_arange(ctx, SG_I64, 0, (double)n, 1);
    sg_tensor *col = sg_unsqueeze(ar, 1);
    sg_tensor *wide = sg_expand(col, 2, two);
    sg_tensor *idx = sg_reshape(wide, 1, flat);
    sg_tensor *out = sg_index_select(x, d, idx);
    sg__tensor_drop(ar), sg__tensor_drop(col), sg__tensor_drop(wide), sg__tensor_drop(idx);
    return out;
}

sg_tensor *sg_repeat_interleave(sg_tensor *x, int64_t repeats, int dim) {
    sg_ctx *ctx = sg__check_inputs("sg_repeat_interleave", 1, &x, NULL);
    if (!ctx) return NULL;
    char a[SG__DESC];
    if (repeats < 0) {
        sg__fail(ctx, SG_ERR_INVALID_ARG, "sg_repeat_interleave: repeats %lld; it must be >= 0",
                 (long long)repeats);
        return NULL;
    }
    /* A 0-d x repeats as a 1-d one, as in torch. */
    int64_t one[1] = {1};
    sg_tensor *x1 = x->ndim == 0 ? sg_reshape(x, 1, one) : x;
    if (!x1) return NULL;
    int d = sg__norm_dim(dim, x1->ndim);
    sg_tensor *out = NULL;
    int64_t grown;
    uint64_t fails = ctx->nfails;
    if (d >= 0 && __builtin_mul_overflow(x1->shape[d], repeats, &grown)) {
        sg__fail(ctx, SG_ERR_SHAPE,
                 "sg_repeat_interleave: %lld repeats of dim %d of x %s is too large to address",
                 (long long)repeats, dim, sg__describe(x, a, sizeof a));
    } else if (d < 0) {
        sg__fail(ctx, SG_ERR_INDEX,
                 "sg_repeat_interleave: dim %d is out of range for x %s "
                 "(valid dims: %d to %d)",
                 dim, sg__describe(x, a, sizeof a), -x1->ndim, x1->ndim - 1);
    } else if (x1->ndim == SG_MAX_DIMS) {
        out = repeat_by_index(ctx, x1, repeats, d);
    } else {
        /* (.., n, ..) -> (.., n, 1, ..) -> (.., n, r, ..) -> (.., n*r, ..) */
        int64_t wide[SG_MAX_DIMS], shape[SG_MAX_DIMS];
        for (int k = 0, j = 0; k < x1->ndim; k++) {
            wide[j++] = x1->shape[k];
            if (k == d) wide[j++] = repeats;
            shape[k] = x1->shape[k] * (k == d ? repeats : 1);
        }
        sg_tensor *u = sg_unsqueeze(x1, d + 1);
        sg_tensor *e = sg_expand(u, x1->ndim + 1, wide);
        out = sg_reshape(e, x1->ndim, shape);
        if (out && out->st == x->st) { /* a view (repeats 1, or n 1): give new storage */
            sg_tensor *c = sg_clone(out);
            sg__tensor_drop(out);
            out = c;
        }
        sg__tensor_drop(u), sg__tensor_drop(e);
        /* A failure of the ops it is made of (a result too large, out of
         * memory) is said as this op's. */
        if (!out && ctx->nfails != fails) {
            char inner[SG__MSG_SIZE];
            snprintf(inner, sizeof inner, "%s", ctx->msg);
            sg__fail(ctx, ctx->last, "sg_repeat_interleave: %lld repeats of dim %d of x %s: %s",
                     (long long)repeats, dim, sg__describe(x, a, sizeof a), inner);
        }
    }
    if (x1 != x) sg__tensor_drop(x1);
    return out;
}
