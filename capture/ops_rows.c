/* SPDX-License-Identifier: MIT */
/*
 * ops_rows.c -- front-ends of the row ops: softmax and log_softmax along one
 * dim, layer_norm and rms_norm over the last dim, and cross_entropy over the
 * rows of (N, C) logits. Each checks dtypes and shapes, names the fix when
 * they are wrong, and dispatches one node (layouts in ops.def).
 *
 * Node conventions, shared with graphs/cpu/cpu_row.c:
 *  - SOFTMAX, LOG_SOFTMAX: in[0] = x; i[0] = the dim, already normalized
 *    (0 for a 0-d x, which is one row of one element, as in PyTorch).
 *  - LAYER_NORM: in = {x, weight, bias} (nin 3), RMS_NORM: in = {x, weight}
 *    (nin 2); a NULL entry is an input left out; f[0] = eps.
 *  - CROSS_ENTROPY: in = {logits (N, C), targets (N)}; out is a 0-d f32.
 *    Whether targets lie in [0, C) depends on their values, so the backend
 *    checks it (the CPU one before it computes anything).
 *  - CROSS_ENTROPY_BWD: in = {logits (N, C), targets (N), g ()}; out (N, C)
 *    of logits' dtype, contiguous: the gradient of the mean loss, the
 *    softmax computed and the target compared in one pass per row.
 *  - NORM_STATS: in = {x}; out f32 (..., 2); f[0] = eps, i[0] = 1 for
 *    layer_norm, 0 for rms_norm. NORM_BWD: in = {x, g, w, r} (w and r may
 *    be NULL); f[0], i[0] as NORM_STATS'; i[1] = 0: out x's shape and
 *    dtype, contiguous, else the packed 1-d out with the column sums.
 */
#include "capture.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static bool check_float(sg_ctx *ctx, const char *name, const char *what, const sg_tensor *x) {
    if (sg__dtype_is_float(x->dtype)) return true;
    char d[SG__DESC];
    sg__fail(ctx, SG_ERR_DTYPE, "sg_%s: %s is %s; it takes f32, f16 or bf16; convert with "
             "sg_cast first", name, what, sg__describe(x, d, sizeof d));
    return false;
}

static sg_tensor *softmax_like(sg__op op, sg_tensor *x, int dim) {
    const char *name = sg__op_name(op);
    sg_ctx *ctx = sg__check_inputs(name, 1, &x, NULL);
    if (!ctx || !check_float(ctx, name, "x", x)) return NULL;
    /* A 0-d tensor has one nameable dim (0 or -1), as in PyTorch. */
    int span = x->ndim ? x->ndim : 1;
    int d = sg__norm_dim(dim, span);
    if (d < 0) {
        char b[SG__DESC];
        sg__fail(ctx, SG_ERR_INDEX, "sg_%s: dim %d is out of range for %s; dims run from %d to "
                 "%d", name, dim, sg__describe(x, b, sizeof b), -span, span - 1);
        return NULL;
    }
    sg_tensor *in[1] = {x};
    sg__node n = {.op = op, .nin = 1, .in = in, .i = {d}};
    return sg__run_new(ctx, &n, x->dtype, x->ndim, x->shape);
}

sg_tensor *sg_softmax(sg_tensor *x, int dim) { return softmax_like(SG__OP_SOFTMAX, x, dim); }

sg_tensor *sg_log_softmax(sg_tensor *x, int dim) {
    return softmax_like(SG__OP_LOG_SOFTMAX, x, dim);
}

/* weight or bias (t, may be NULL): 1-d of x's last dim, x's dtype. */
static bool check_affine(sg_ctx *ctx, const char *name, const char *what, const sg_tensor *x,
                         const sg_tensor *t) {
    if (!t) return true;
    char a[SG__DESC], b[SG__DESC];
    int64_t c = x->shape[x->ndim - 1];
    if (t->ndim != 1 || t->shape[0] != c) {
        sg__fail(ctx, SG_ERR_SHAPE, "sg_%s: %s is %s but x is %s; %s must be 1-d of x's last "
                 "dim (%lld)", name, what, sg__describe(t, a, sizeof a),
                 sg__describe(x, b, sizeof b), what, (long long)c);
        return false;
    }
    if (t->dtype != x->dtype) {
        sg__fail(ctx, SG_ERR_DTYPE, "sg_%s: %s is %s but x is %s; they must share a dtype "
                 "(convert %s with sg_cast)", name, what, sg__describe(t, a, sizeof a),
                 sg__describe(x, b, sizeof b), what);
        return false;
    }
    return true;
}

static sg_tensor *norm(sg__op op, sg_tensor *x, sg_tensor *weight, sg_tensor *bias, double eps) {
    const char *name = sg__op_name(op);
    int nin = op == SG__OP_LAYER_NORM ? 3 : 2;
    sg_tensor *in[3] = {x, weight, bias};
    const bool optional[3] = {false, true, true};
    sg_ctx *ctx = sg__check_inputs(name, nin, in, optional);
    if (!ctx || !check_float(ctx, name, "x", x)) return NULL;
    if (x->ndim == 0) {
        sg__fail(ctx, SG_ERR_SHAPE, "sg_%s: x is 0-d; it normalizes over the last dim, so x "
                 "needs at least one (sg_unsqueeze it)", name);
        return NULL;
    }
    if (!check_affine(ctx, name, "weight", x, weight)) return NULL;
    if (nin == 3 && !check_affine(ctx, name, "bias", x, bias)) return NULL;
    if (!(eps >= 0.0) || eps == INFINITY) {
        sg__fail(ctx, SG_ERR_INVALID_ARG, "sg_%s: eps is %g; it must be finite and >= 0 (1e-5 "
                 "is usual)", name, eps);
        return NULL;
    }
    sg__node n = {.op = op, .nin = nin, .in = in, .f = {eps}};
    return sg__run_new(ctx, &n, x->dtype, x->ndim, x->shape);
}

sg_tensor *sg_layer_norm(sg_tensor *x, sg_tensor *weight, sg_tensor *bias, double eps) {
    return norm(SG__OP_LAYER_NORM, x, weight, bias, eps);
}

sg_tensor *sg_rms_norm(sg_tensor *x, sg_tensor *weight, double eps) {
    return norm(SG__OP_RMS_NORM, x, weight, NULL, eps);
}

sg_tensor *sg_cross_entropy(sg_tensor *logits, sg_tensor *targets) {
    sg_tensor *in[2] = {logits, targets};
    sg_ctx *ctx = sg__check_inputs("cross_entropy", 2, in, NULL);
    if (!ctx || !check_float(ctx, "cross_entropy", "logits", logits)) return NULL;
    char a[SG__DESC], b[SG__DESC];
    if (logits->ndim != 2) {
        sg__fail(ctx, SG_ERR_SHAPE, "sg_cross_entropy: logits is %s; it must be 2-d (N, C) "
                 "(sg_reshape (B, T, C) logits to (B*T, C))", sg__describe(logits, a, sizeof a));
        return NULL;
    }
    if (targets->dtype != SG_I32 && targets->dtype != SG_I64) {
        sg__fail(ctx, SG_ERR_DTYPE, "sg_cross_entropy: targets is %s; it must be i32 or i64 "
                 "class indices", sg__describe(targets, a, sizeof a));
        return NULL;
    }
    if (targets->ndim != 1 || targets->shape[0] != logits->shape[0]) {
        sg__fail(ctx, SG_ERR_SHAPE, "sg_cross_entropy: targets is %s for logits %s; it must be "
                 "1-d with one class index per row (N = %lld)", sg__describe(targets, a, sizeof a),
                 sg__describe(logits, b, sizeof b), (long long)logits->shape[0]);
        return NULL;
    }
    sg__node n = {.op = SG__OP_CROSS_ENTROPY, .nin = 2, .in = in};
    int64_t none[1] = {0};
    return sg__run_new(ctx, &n, SG_F32, 0, none);
}

sg_tensor *sg__cross_entropy_grad(sg_tensor *logits, sg_tensor *targets, sg_tensor *g) {
    sg_tensor *in[3] = {logits, targets, g};
    sg_ctx *ctx = sg__check_inputs("cross_entropy", 3, in, NULL);
    if (!ctx) return NULL;
    if (!sg__dtype_is_float(g->dtype) || g->ndim != 0) {
        char a[SG__DESC];
        sg__fail(ctx, SG_ERR_SHAPE, "cross_entropy backward: the loss's gradient is %s; it must "
                 "be a 0-d float like the loss", sg__describe(g, a, sizeof a));
        return NULL;
    }
    sg__node n = {.op = SG__OP_CROSS_ENTROPY_BWD, .nin = 3, .in = in};
    return sg__run_new(ctx, &n, logits->dtype, 2, logits->shape);
}

sg_tensor *sg__norm_stats(sg_tensor *x, bool layer, double eps) {
    const char *name = layer ? "layer_norm" : "rms_norm";
    sg_ctx *ctx = sg__check_inputs(name, 1, &x, NULL);
    if (!ctx || !check_float(ctx, name, "x", x)) return NULL;
    if (x->ndim == 0 || x->ndim > SG_MAX_DIMS) {
        char a[SG__DESC];
        sg__fail(ctx, SG_ERR_SHAPE, "%s backward: x is %s; its statistics need a last dim", name,
                 sg__describe(x, a, sizeof a));
        return NULL;
    }
    int64_t shape[SG_MAX_DIMS];
    memcpy(shape, x->shape, sizeof(int64_t) * (size_t)x->ndim);
    shape[x->ndim - 1] = 2;
    sg_tensor *in[1] = {x};
    sg__node n = {.op = SG__OP_NORM_STATS, .nin = 1, .in = in, .f = {eps}, .i = {layer}};
    return sg__run_new(ctx, &n, SG_F32, x->ndim, shape);
}

sg_tensor *sg__norm_grad(sg_tensor *x, sg_tensor *g, sg_tensor *w, sg_tensor *r, bool layer,
                         double eps, int parts) {
    const char *name = layer ? "layer_norm" : "rms_norm";
    sg_tensor *in[4] = {x, g, w, r};
    const bool optional[4] = {false, false, true, true};
    sg_ctx *ctx = sg__check_inputs(name, 4, in, optional);
    if (!ctx || !check_float(ctx, name, "x", x)) return NULL;
    char a[SG__DESC], b[SG__DESC];
    bool ok = x->ndim >= 1 && x->ndim <= SG_MAX_DIMS;
    for (int k = 1; k < 4; k += 2)
        if (in[k]) {
            ok = ok && in[k]->dtype == x->dtype && in[k]->ndim == x->ndim;
            for (int d = 0; ok && d < x->ndim; d++) ok = in[k]->shape[d] == x->shape[d];
        }
    ok = ok && (!w || (w->dtype == x->dtype && w->ndim == 1 &&
                       w->shape[0] == x->shape[x->ndim - 1]));
    if (!ok) {
        sg__fail(ctx, SG_ERR_SHAPE,
                 "%s backward: the gradient %s does not match x %s (or the weight or the "
                 "gradient to add do not); they must share x's shape and dtype",
                 name, sg__describe(g, a, sizeof a), sg__describe(x, b, sizeof b));
        return NULL;
    }
    sg__node n = {.op = SG__OP_NORM_BWD, .nin = 4, .in = in, .f = {eps}, .i = {layer, parts}};
    if (!parts) return sg__run_new(ctx, &n, x->dtype, x->ndim, x->shape);
    int64_t len = x->shape[x->ndim - 1], packed = sg__numel(x->ndim, x->shape) + 2 * len;
    return sg__run_new(ctx, &n, x->dtype, 1, &packed);
}
