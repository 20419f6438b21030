/* SPDX-License-Identifier: MIT */
/*
 * ops_data.c -- front-ends of the data-movement ops (embedding, index_select,
 * concat, arange and the in-place index_copy_) and of attention: sg_sdpa and
 * sg_sdpa_cached dispatch one ATTENTION node over 4-d strided views of
 * their operands (no copy; grouped-query K/V read in place), and
 * sg__sdpa_decomposed builds the same attention from public ops for what
 * the node does not take. With gradients wanted, the 4-d views carry their
 * operands' backward (as expands) and ATTENTION's rule (grad_rules.c) runs
 * one ATTENTION_BWD node (sg__sdpa_grad): dq, dk and dv come back as views
 * of its one packed output, so the IR keeps one output per node and the
 * backends run the backward as one unit with its row workspace (the
 * recomputed logsumexp and rowsum(dO * O)) planned into the pool like any
 * buffer. Only shapes the fused kernels do not take (D > 256, Dv != D, more
 * than 4 dims) and a float mask that itself needs a gradient still go
 * through the decomposed ops (materialized scores), with a perf_hints line.
 * The data ops check index dtypes, dims and the
 * sizes that must agree, and dispatch one node each; index *values* are
 * checked by the backend, which reads them anyway (a front-end read would be
 * a host sync, and a graph break under capture).
 *
 * Node layout (ops.def): EMBEDDING in = {weight, idx}; INDEX_SELECT in =
 * {x, idx}, i[0] = dim; CONCAT in = the n tensors, nin = n, i[0] = dim;
 * ARANGE no inputs, f[0] = start, f[1] = step; INDEX_COPY out = dst and
 * in = {dst, idx, src} (dst repeated as in[0] so that a recorder sees it
 * read as well as written), i[0] = dim. ATTENTION in = {q, k, v, mask?,
 * kv_len?} as described in ops.def. Dims in nodes are normalized (>= 0).
 */
#include "capture.h"

#include <math.h>
#include <stdio.h>

/* ------------------------------------------------------------ shared checks */

static sg_status check_index(sg_ctx *ctx, const char *op, const sg_tensor *idx, bool one_d) {
    char d[SG__DESC];
    if (idx->dtype != SG_I32 && idx->dtype != SG_I64)
        return sg__fail(ctx, SG_ERR_DTYPE, "%s: idx is %s; indices must be i32 or i64; convert "
                        "with sg_cast(idx, SG_I64)", op, sg__describe(idx, d, sizeof d));
    if (one_d && idx->ndim != 1)
        return sg__fail(ctx, SG_ERR_SHAPE, "%s: idx is %s; it must be 1-d (flatten it with "
                        "sg_reshape)", op, sg__describe(idx, d, sizeof d));
    return SG_OK;
}

/* dim normalized against t, or -1 with a message naming op. */
static int check_dim(sg_ctx *ctx, const char *op, int dim, const sg_tensor *t, const char *name) {
    int d = sg__norm_dim(dim, t->ndim);
    if (d < 0) {
        char b[SG__DESC];
        if (t->ndim == 0)
            sg__fail(ctx, SG_ERR_INDEX, "%s: %s is %s (0-d) and has no dim %d; give it a dim "
                     "with sg_unsqueeze", op, name, sg__describe(t, b, sizeof b), dim);
        else
            sg__fail(ctx, SG_ERR_INDEX, "%s: dim %d is out of range for %s %s (valid dims: %d "
                     "to %d)", op, dim, name, sg__describe(t, b, sizeof b), -t->ndim,
                     t->ndim - 1);
    }
    return d;
}

/* ------------------------------------------------------------ gathers */

sg_tensor *sg_embedding(sg_tensor *weight, sg_tensor *idx) {
    sg_tensor *in[2] = {weight, idx};
    sg_ctx *ctx = sg__check_inputs("sg_embedding", 2, in, NULL);
    if (!ctx) return NULL;
    if (check_index(ctx, "sg_embedding", idx, false) != SG_OK) return NULL;
    char dw[SG__DESC], di[SG__DESC];
    if (weight->ndim != 2) {
        sg__fail(ctx, SG_ERR_SHAPE, "sg_embedding: weight is %s; it must be 2-d (V, D): V rows "
                 "of D values", sg__describe(weight, dw, sizeof dw));
        return NULL;
    }
    if (idx->ndim + 1 > SG_MAX_DIMS) {
        sg__fail(ctx, SG_ERR_SHAPE, "sg_embedding: idx %s has %d dims; the result adds one and "
                 "may have at most %d", sg__describe(idx, di, sizeof di), idx->ndim, SG_MAX_DIMS);
        return NULL;
    }
    int64_t shape[SG_MAX_DIMS];
    for (int d = 0; d < idx->ndim; d++) shape[d] = idx->shape[d];
    shape[idx->ndim] = weight->shape[1];
    sg__node n = {.op = SG__OP_EMBEDDING, .nin = 2, .in = in};
    return sg__run_new(ctx, &n, weight->dtype, idx->ndim + 1, shape);
}

sg_tensor *sg_index_select(sg_tensor *x, int dim, sg_tensor *idx) {
    sg_tensor *in[2] = {x, idx};
    sg_ctx *ctx = sg__check_inputs("sg_index_select", 2, in, NULL);
    if (!ctx) return NULL;
    if (check_index(ctx, "sg_index_select", idx, true) != SG_OK) return NULL;
    int d = check_dim(ctx, "sg_index_select", dim, x, "x");
    if (d < 0) return NULL;
    int64_t shape[SG_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    shape[d] = idx->shape[0];
    sg__node n = {.op = SG__OP_INDEX_SELECT, .nin = 2, .in = in, .i = {d}};
    return sg__run_new(ctx, &n, x->dtype, x->ndim, shape);
}

/* ------------------------------------------------------------ concat and arange */

static bool concat_fits(sg_ctx *ctx, int n, sg_tensor *const *ts, int d) {
    char a[SG__DESC], b[SG__DESC];
    const sg_tensor *t0 = ts[0];
    for (int i = 1; i < n; i++) {
        const sg_tensor *t = ts[i];
        if (t->dtype != t0->dtype) {
            sg__fail(ctx, SG_ERR_DTYPE, "sg_concat: input %d is %s but input 0 is %s; all inputs "
                     "need one dtype (convert with sg_cast)", i, sg__describe(t, a, sizeof a),
                     sg__describe(t0, b, sizeof b));
            return false;
        }
        if (t->ndim != t0->ndim) {
            sg__fail(ctx, SG_ERR_SHAPE, "sg_concat: input %d is %s but input 0 is %s; all inputs "
                     "need the same number of dims", i, sg__describe(t, a, sizeof a),
                     sg__describe(t0, b, sizeof b));
            return false;
        }
        for (int k = 0; k < t0->ndim; k++)
            if (k != d && t->shape[k] != t0->shape[k]) {
                sg__fail(ctx, SG_ERR_SHAPE, "sg_concat: input %d %s does not match input 0 %s "
                         "at dim %d (%lld vs %lld); only the concat dim %d may differ", i,
                         sg__describe(t, a, sizeof a), sg__describe(t0, b, sizeof b), k,
                         (long long)t->shape[k], (long long)t0->shape[k], d);
                return false;
            }
    }
    return true;
}

sg_tensor *sg_concat(int n, sg_tensor *const *ts, int dim) {
    if (n < 1 || !ts) {
        /* No tensor names a context to hold the message: it goes where a
         * failed sg_ctx_create's does, sg_last_error(NULL). */
        sg__set_create_error("sg_concat: %s; pass an array of n >= 1 tensors",
                             !ts ? "ts is NULL" : "n is below 1 (an empty list)");
        return NULL;
    }
    sg_ctx *ctx = sg__check_inputs("sg_concat", n, ts, NULL);
    if (!ctx) return NULL;
    int d = check_dim(ctx, "sg_concat", dim, ts[0], "input 0");
    if (d < 0 || !concat_fits(ctx, n, ts, d)) return NULL;
    int64_t shape[SG_MAX_DIMS];
    memcpy(shape, ts[0]->shape, sizeof shape);
    for (int i = 1; i < n; i++)
        if (__builtin_add_overflow(shape[d], ts[i]->shape[d], &shape[d])) {
            sg__fail(ctx, SG_ERR_SHAPE, "sg_concat: the sizes along dim %d add up past 64 bits",
                     dim);
            return NULL;
        }
    sg__node node = {.op = SG__OP_CONCAT, .nin = n, .in = ts, .i = {d}};
    return sg__run_new(ctx, &node, ts[0]->dtype, ts[0]->ndim, shape);
}

/* Integer arange values must fit the dtype (the kernel truncates doubles). */
static bool arange_fits(sg_dtype dt, double first, double last) {
    double lo = dt == SG_I32 ? -2147483648.0 : -9223372036854775808.0;
    double hi = dt == SG_I32 ? 2147483647.0 : 9223372036854774784.0; /* largest double < 2^63 */
    if (dt != SG_I32 && dt != SG_I64) return true;
    return trunc(first) >= lo && trunc(first) <= hi && trunc(last) >= lo && trunc(last) <= hi;
}

sg_tensor *sg_arange(sg_ctx *ctx, sg_dtype dt, double start, double end, double step) {
    if (!ctx) return NULL;
    if (!sg__dtype_valid(dt) || dt == SG_BOOL) {
        sg__fail(ctx, SG_ERR_DTYPE, "sg_arange: dtype %s (%d); it takes f32, f16, bf16, i32 or "
                 "i64", sg_dtype_name(dt), (int)dt);
        return NULL;
    }
    if (!isfinite(start) || !isfinite(end) || !isfinite(step) || step == 0) {
        sg__fail(ctx, SG_ERR_INVALID_ARG, "sg_arange: start %g, end %g, step %g; all must be "
                 "finite and step nonzero", start, end, step);
        return NULL;
    }
    double len = ceil((end - start) / step);
    if (!(len > 0)) len = 0;
    /* 2^48 elements is past any memory; it also keeps start + i*step exact in i. */
    if (len > 281474976710656.0 || (len > 0 && !arange_fits(dt, start, start + (len - 1) * step))) {
        sg__fail(ctx, SG_ERR_INVALID_ARG, "sg_arange: start %g, end %g, step %g gives %.0f values "
                 "that do not fit %s; narrow the range or widen the dtype", start, end, step, len,
                 sg_dtype_name(dt));
        return NULL;
    }
    int64_t shape[1] = {(int64_t)len};
    sg__node n = {.op = SG__OP_ARANGE, .nin = 0, .in = NULL, .f = {start, step}};
    return sg__run_new(ctx, &n, dt, 1, shape);
}

/* ------------------------------------------------------------ index_copy_ */

/* True when a's and b's element ranges in one storage may overlap. */
static bool may_overlap(const sg_tensor *a, const sg_tensor *b) {
    if (a->st != b->st) return false;
    int64_t alo = a->offset, ahi = a->offset, blo = b->offset, bhi = b->offset;
    for (int d = 0; d < a->ndim; d++) ahi += (a->shape[d] - 1) * a->stride[d];
    for (int d = 0; d < b->ndim; d++) bhi += (b->shape[d] - 1) * b->stride[d];
    return !(ahi < blo || bhi < alo);
}

static sg_status index_copy_check(sg_ctx *ctx, sg_tensor *dst, int d, sg_tensor *idx,
                                  sg_tensor *src) {
    char a[SG__DESC], b[SG__DESC], c[SG__DESC];
    if (dst->dtype != src->dtype)
        return sg__fail(ctx, SG_ERR_DTYPE, "sg_index_copy_: dst %s and src %s differ in dtype; "
                        "convert src with sg_cast", sg__describe(dst, a, sizeof a),
                        sg__describe(src, b, sizeof b));
    bool ok = src->ndim == dst->ndim && src->shape[d] == idx->shape[0];
    for (int k = 0; ok && k < dst->ndim; k++) ok = k == d || src->shape[k] == dst->shape[k];
    if (!ok)
        return sg__fail(ctx, SG_ERR_SHAPE, "sg_index_copy_: src %s does not fit dst %s with idx "
                        "%s along dim %d: src needs dst's sizes except at dim %d, where it needs "
                        "idx's length", sg__describe(src, a, sizeof a),
                        sg__describe(dst, b, sizeof b), sg__describe(idx, c, sizeof c), d, d);
    for (int k = 0; k < dst->ndim; k++)
        if (dst->stride[k] == 0 && dst->shape[k] > 1)
            return sg__fail(ctx, SG_ERR_INVALID_ARG, "sg_index_copy_: dst %s is an expanded view "
                            "whose elements repeat; write to a sg_contiguous copy instead",
                            sg__describe(dst, a, sizeof a));
    return SG_OK;
}

sg_status sg_index_copy_(sg_tensor *dst, int dim, sg_tensor *idx, sg_tensor *src) {
    sg_tensor *in[3] = {dst, idx, src};
    sg_ctx *ctx = sg__check_inputs("sg_index_copy_", 3, in, NULL);
    if (!ctx) return sg__inputs_status(3, in);
    sg_status s = check_index(ctx, "sg_index_copy_", idx, true);
    if (s != SG_OK) return s;
    int d = check_dim(ctx, "sg_index_copy_", dim, dst, "dst");
    if (d < 0) return SG_ERR_INDEX;
    s = index_copy_check(ctx, dst, d, idx, src);
    if (s != SG_OK) return s;
    /* A src that shares bytes with dst is copied first, so that no write
     * lands before its read. idx may alias dst too: the kernel reads all of
     * idx before it writes. */
    sg_tensor *tmp = NULL;
    if (may_overlap(src, dst)) {
        tmp = sg_clone(src);
        if (!tmp) return SG_ERR_OOM; /* the only way a clone of a live tensor fails */
        src = tmp;
    }
    sg_tensor *args[3] = {dst, idx, src};
    sg__node n = {.op = SG__OP_INDEX_COPY, .nin = 3, .in = args, .out = dst, .i = {d}};
    s = sg__dispatch(ctx, &n);
    sg__tensor_drop(tmp);
    return s;
}

/* ------------------------------------------------------------ index_add (autograd) */

sg_status sg__index_add_(sg_tensor *dst, int dim, sg_tensor *idx, sg_tensor *src) {
    sg_tensor *in[3] = {dst, idx, src};
    sg_ctx *ctx = sg__check_inputs("index_add", 3, in, NULL);
    if (!ctx) return sg__inputs_status(3, in);
    sg_status s = check_index(ctx, "index_add", idx, true);
    if (s != SG_OK) return s;
    int d = check_dim(ctx, "index_add", dim, dst, "dst");
    if (d < 0) return SG_ERR_INDEX;
    s = index_copy_check(ctx, dst, d, idx, src);
    if (s != SG_OK) return s;
    if (!sg__dtype_is_float(dst->dtype)) {
        char a[SG__DESC];
        return sg__fail(ctx, SG_ERR_DTYPE, "index_add: dst %s must be float",
                        sg__describe(dst, a, sizeof a));
    }
    sg_tensor *tmp = NULL;
    if (may_overlap(src, dst)) {
        tmp = sg_clone(src);
        if (!tmp) return SG_ERR_OOM;
        src = tmp;
    }
    sg_tensor *args[3] = {dst, idx, src};
    sg__node n = {.op = SG__OP_INDEX_ADD, .nin = 3, .in = args, .out = dst, .i = {d}};
    s = sg__dispatch(ctx, &n);
    sg__tensor_drop(tmp);
    return s;
}

/* ------------------------------------------------------------ sdpa */

/*
 * Grouped-query K/V: k and v share a head count (dim -3) that divides q's
 * and is neither q's nor 1. Query head h then reads K/V head h / (Hq / Hkv).
 */
static bool sdpa_gqa(const sg_tensor *q, const sg_tensor *k, const sg_tensor *v) {
    if (q->ndim < 3 || k->ndim < 3 || v->ndim < 3) return false;
    int64_t hq = q->shape[q->ndim - 3], hk = k->shape[k->ndim - 3], hv = v->shape[v->ndim - 3];
    return hk == hv && hk > 1 && hk != hq && hq % hk == 0;
}

/*
 * The scores' shape (batch..., Lq, Lk) into shape, its rank in *nd: the
 * broadcast batch dims of q, k and v (dim -3 is q's under grouped-query
 * K/V); false with a message when they clash.
 */
static bool sdpa_scores(sg_ctx *ctx, sg_tensor *const *in, bool gqa, int *nd, int64_t *shape) {
    sg_tensor *q = in[0], *k = in[1], *v = in[2];
    char a[SG__DESC], b[SG__DESC], c[SG__DESC];
    int n = 0;
    for (int i = 0; i < 3; i++) n = in[i]->ndim > n ? in[i]->ndim : n;
    for (int d = 0; d < n - 2; d++) {
        shape[d] = 1;
        if (gqa && d == n - 3) {
            shape[d] = q->shape[q->ndim - 3];
            continue;
        }
        for (int i = 0; i < 3; i++) {
            int s = d - (n - in[i]->ndim);
            int64_t size = s < 0 ? 1 : in[i]->shape[s];
            if (size != 1 && shape[d] != 1 && size != shape[d]) {
                sg__fail(ctx, SG_ERR_SHAPE, "sg_sdpa: the batch dims of q %s, k %s and v %s do "
                         "not broadcast; batch sizes must match or be 1 (or k's and v's heads, "
                         "dim -3, divide q's)", sg__describe(q, a, sizeof a),
                         sg__describe(k, b, sizeof b), sg__describe(v, c, sizeof c));
                return false;
            }
            if (size != 1) shape[d] = size;
        }
    }
    shape[n - 2] = q->shape[q->ndim - 2];
    shape[n - 1] = k->shape[k->ndim - 2];
    *nd = n;
    return true;
}

/*
 * Check q (..., Lq, D), k (..., Lk, D), v (..., Lk, Dv) and the mask, and
 * resolve the scale. The batch dims of q, k and v must broadcast; the mask
 * must broadcast to the scores (batch..., Lq, Lk) without growing them.
 */
static bool sdpa_check(sg_ctx *ctx, sg_tensor *const *in, sg_tensor *mask, double *scale) {
    sg_tensor *q = in[0], *k = in[1], *v = in[2];
    char a[SG__DESC], b[SG__DESC], c[SG__DESC];
    for (int i = 0; i < 3; i++)
        if (!sg__dtype_is_float(in[i]->dtype) || in[i]->dtype != q->dtype || in[i]->ndim < 2) {
            sg__fail(ctx, in[i]->ndim < 2 ? SG_ERR_SHAPE : SG_ERR_DTYPE, "sg_sdpa: q %s, k %s, "
                     "v %s: all must be at least 2-d and of one float dtype (f32, f16 or bf16)",
                     sg__describe(q, a, sizeof a), sg__describe(k, b, sizeof b),
                     sg__describe(v, c, sizeof c));
            return false;
        }
    int qn = q->ndim, kn = k->ndim, vn = v->ndim;
    if (k->shape[kn - 1] != q->shape[qn - 1] || v->shape[vn - 2] != k->shape[kn - 2]) {
        sg__fail(ctx, SG_ERR_SHAPE, "sg_sdpa: q %s, k %s, v %s do not fit: k's last dim must be "
                 "q's D and v's second-to-last dim k's Lk", sg__describe(q, a, sizeof a),
                 sg__describe(k, b, sizeof b), sg__describe(v, c, sizeof c));
        return false;
    }
    int nd;
    int64_t shape[SG_MAX_DIMS];
    if (!sdpa_scores(ctx, in, sdpa_gqa(q, k, v), &nd, shape)) return false;
    if (mask) {
        if (mask->dtype != SG_BOOL && mask->dtype != q->dtype) {
            sg__fail(ctx, SG_ERR_DTYPE, "sg_sdpa: mask is %s; it must be bool (true keeps) or "
                     "q's dtype %s (added to the scores)", sg__describe(mask, a, sizeof a),
                     sg_dtype_name(q->dtype));
            return false;
        }
        bool ok = mask->ndim <= nd;
        for (int d = 0; ok && d < mask->ndim; d++) {
            int64_t ms = mask->shape[d], ss = shape[d + nd - mask->ndim];
            ok = ms == 1 || ms == ss;
        }
        if (!ok) {
            sg__fail(ctx, SG_ERR_SHAPE, "sg_sdpa: mask %s does not broadcast to the scores %s "
                     "(batch..., Lq, Lk)", sg__describe(mask, a, sizeof a),
                     sg__shape_str(nd, shape, b, sizeof b));
            return false;
        }
    }
    if (!isfinite(*scale)) {
        sg__fail(ctx, SG_ERR_INVALID_ARG, "sg_sdpa: scale %g is not finite; pass a positive "
                 "scale, or 0 for 1/sqrt(D)", *scale);
        return false;
    }
    int64_t D = q->shape[qn - 1];
    if (*scale <= 0) *scale = D > 0 ? 1.0 / sqrt((double)D) : 1.0;
    return true;
}

/* keep[i][j] = j <= i + (Lk - Lq): bool (Lq, Lk), the causal mask. */
static sg_tensor *causal_keep(sg_ctx *ctx, int64_t Lq, int64_t Lk) {
    sg_tensor *rows = sg_arange(ctx, SG_I64, (double)(Lk - Lq), (double)Lk, 1);
    int64_t col[2] = {Lq, 1};
    sg_tensor *last = sg_reshape(rows, 2, col); /* (Lq, 1): the last key each query sees */
    sg_tensor *keys = sg_arange(ctx, SG_I64, 0, (double)Lk, 1);
    sg_tensor *keep = sg_le(keys, last);
    sg__tensor_drop(rows);
    sg__tensor_drop(last);
    sg__tensor_drop(keys);
    return keep;
}

/*
 * Swap s for next (an op applied to s), dropping s. Intermediates are dropped
 * with sg__tensor_drop, not sg_release: the user never saw them, so there is
 * no use after release to catch, and they would only crowd user handles out
 * of the quarantine.
 */
static sg_tensor *then(sg_tensor *s, sg_tensor *next) {
    sg__tensor_drop(s);
    return next;
}

/* Make a failure inside the composite name op, keeping the inner text. */
static void name_failure(sg_ctx *ctx, const char *op) {
    if (strncmp(ctx->msg, op, strlen(op)) == 0) return;
    char inner[SG__MSG_SIZE];
    snprintf(inner, sizeof inner, "%s", ctx->msg[0] ? ctx->msg : "an inner op failed silently");
    sg__fail(ctx, ctx->status != SG_OK ? ctx->status : SG_ERR_INTERNAL, "%s: %.900s", op, inner);
}

/*
 * Grouped-query K/V as broadcasting: q (..., Hkv*g, Lq, D) viewed as (...,
 * Hkv, g, Lq, D) against k and v with a size-1 dim inserted at -3, so that
 * nothing is repeated; the result folds back to (..., Hq, Lq, Dv).
 */
static sg_tensor *gqa_decomposed(sg_tensor *q, sg_tensor *k, sg_tensor *v, sg_tensor *mask,
                                 bool causal, double scale) {
    sg_ctx *ctx = q->ctx;
    if (q->ndim + 1 > SG_MAX_DIMS || k->ndim + 1 > SG_MAX_DIMS || v->ndim + 1 > SG_MAX_DIMS) {
        sg__fail(ctx, SG_ERR_SHAPE, "sg_sdpa: grouped-query K/V with %d-d q needs one more dim "
                 "(at most %d); fold batch dims together with sg_reshape", q->ndim, SG_MAX_DIMS);
        return NULL;
    }
    int64_t hk = k->shape[k->ndim - 3], sh[SG_MAX_DIMS];
    memcpy(sh, q->shape, sizeof sh);
    sh[q->ndim - 3] = hk;
    sh[q->ndim - 2] = q->shape[q->ndim - 3] / hk;
    sh[q->ndim - 1] = q->shape[q->ndim - 2];
    sh[q->ndim] = q->shape[q->ndim - 1];
    sg_tensor *q5 = sg_reshape(q, q->ndim + 1, sh);
    sg_tensor *k5 = sg_unsqueeze(k, -3), *v5 = sg_unsqueeze(v, -3), *m5 = NULL;
    if (mask && mask->ndim >= 3 && mask->shape[mask->ndim - 3] != 1) {
        memcpy(sh, mask->shape, sizeof sh);
        sh[mask->ndim - 3] = hk;
        sh[mask->ndim - 2] = mask->shape[mask->ndim - 3] / hk;
        sh[mask->ndim - 1] = mask->shape[mask->ndim - 2];
        sh[mask->ndim] = mask->shape[mask->ndim - 1];
        m5 = sg_reshape(mask, mask->ndim + 1, sh);
    } else if (mask) {
        m5 = mask->ndim >= 3 ? sg_unsqueeze(mask, -3) : sg_reshape(mask, mask->ndim, mask->shape);
    }
    sg_tensor *o5 = q5 && k5 && v5 && (m5 || !mask)
                        ? sg__sdpa_decomposed(q5, k5, v5, m5, causal, scale)
                        : NULL;
    sg_tensor *out = NULL;
    if (o5) {
        int n = o5->ndim;
        memcpy(sh, o5->shape, sizeof sh);
        sh[n - 4] *= sh[n - 3];
        sh[n - 3] = sh[n - 2];
        sh[n - 2] = sh[n - 1];
        out = sg_reshape(o5, n - 1, sh);
    }
    sg__tensor_drop(q5), sg__tensor_drop(k5), sg__tensor_drop(v5), sg__tensor_drop(m5);
    sg__tensor_drop(o5);
    return out;
}

sg_tensor *sg__sdpa_decomposed(sg_tensor *q, sg_tensor *k, sg_tensor *v, sg_tensor *mask,
                               bool causal, double scale) {
    if (!q || !k || !v) return NULL;
    sg_ctx *ctx = q->ctx;
    if (scale <= 0) scale = 1.0 / sqrt((double)(q->shape[q->ndim - 1] > 0 ? q->shape[q->ndim - 1] : 1));
    if (sdpa_gqa(q, k, v)) return gqa_decomposed(q, k, v, mask, causal, scale);
    /* Each step NULL-propagates; everything made here is released below. */
    sg_tensor *kt = sg_transpose(k, -1, -2);
    sg_tensor *s = sg_matmul(q, kt);
    s = then(s, sg_mul_scalar(s, scale));
    sg_tensor *ninf = NULL;
    if ((mask && mask->dtype == SG_BOOL) || causal)
        ninf = sg_full(ctx, q->dtype, 0, NULL, -INFINITY);
    if (mask) s = then(s, mask->dtype == SG_BOOL ? sg_where(mask, s, ninf) : sg_add(s, mask));
    if (causal) {
        sg_tensor *keep = causal_keep(ctx, q->shape[q->ndim - 2], k->shape[k->ndim - 2]);
        s = then(s, sg_where(keep, s, ninf));
        sg__tensor_drop(keep);
    }
    sg_tensor *p = sg_softmax(s, -1);
    sg_tensor *out = sg_matmul(p, v);
    sg__tensor_drop(kt);
    sg__tensor_drop(s);
    sg__tensor_drop(ninf);
    sg__tensor_drop(p);
    return out;
}

/* ------------------------------------------------------------ the ATTENTION node */

#define ATTN_MAX_D 256

/* t read as 4-d (B, H, L, D) of shape, dims padded in front, stride 0 where
 * t has size 1 (or lacks the dim) and shape does not. */
static sg_tensor *view4(sg_tensor *t, const char *op, const int64_t *shape) {
    int64_t st[4];
    sg__broadcast_strides(t, 4, shape, st);
    return sg__tensor_view(t, op, 4, shape, st, t->offset);
}

sg_tensor *sg__attn_heads(sg_tensor *t, const char *op) {
    if (!t) return NULL;
    int64_t sh[4] = {t->shape[0], t->shape[2], t->shape[1], t->shape[3]};
    int64_t st[4] = {t->stride[0], t->stride[2], t->stride[1], t->stride[3]};
    return sg__tensor_view(t, op, 4, sh, st, t->offset);
}

/*
 * ATTENTION whose result will have a backward (SG__ATTN_LSE in n's i[0]):
 * the node writes a packed output, the result ts = (B, Lq, Hq, D) and then
 * its rows' logsumexps (sg__attn_lse_at); gives the result, a view of it at
 * 0 that carries the node's backward (which saves it, and so the
 * logsumexps' storage), or NULL.
 */
static sg_tensor *attn_packed(sg_ctx *ctx, sg__node *n, const char *op, sg_dtype dt,
                              const int64_t *ts) {
    int64_t no = ts[0] * ts[1] * ts[2] * ts[3], rows = ts[0] * ts[1] * ts[2];
    int64_t total = sg__attn_numel(no, rows, sg_dtype_size(dt));
    sg_tensor *pk = sg__tensor_new(ctx, op, dt, 1, &total), *t = NULL;
    if (!pk) return NULL;
    n->out = pk;
    if (sg__dispatch(ctx, n) == SG_OK) {
        int64_t st[4] = {ts[1] * ts[2] * ts[3], ts[2] * ts[3], ts[3], 1};
        t = sg__tensor_view(pk, op, 4, ts, st, pk->offset);
        if (t) t = sg__grad_record(ctx, n, t);
    }
    sg__tensor_drop(pk);
    return t;
}

/*
 * Dispatch ATTENTION over the 4-d views of q (B, Hq, Lq, D), k and v (B, Hkv,
 * S, D), the mask broadcast to (B, Hq, Lq, S), and kv_len: the result
 * (B, Hq, Lq, D), or NULL. The views of q, k and v are expands for autograd,
 * so that their gradients sum back to the operands' shapes. The node stores
 * the result (B, Lq, Hq, D), the heads side by side, as the attention's
 * output projection reads them: the result is a permuted view of it (with
 * the contiguous strides where Lq or Hq is 1, the same bytes either way).
 */
static sg_tensor *attn_run(sg_ctx *ctx, const char *op, sg_tensor *q, sg_tensor *k, sg_tensor *v,
                           sg_tensor *mask, sg_tensor *kv_len, const int64_t *bh, int64_t hkv,
                           double scale, int flags) {
    int64_t Lq = q->shape[q->ndim - 2], D = q->shape[q->ndim - 1], S = k->shape[k->ndim - 2];
    int64_t qs[4] = {bh[0], bh[1], Lq, D}, ks[4] = {bh[0], hkv, S, D}, ms[4] = {bh[0], bh[1], Lq, S};
    sg_tensor *in[5] = {sg__grad_view(q, view4(q, op, qs), SG__VIEW_EXPAND, NULL),
                        sg__grad_view(k, view4(k, op, ks), SG__VIEW_EXPAND, NULL),
                        sg__grad_view(v, view4(v, op, ks), SG__VIEW_EXPAND, NULL),
                        mask ? view4(mask, op, ms) : NULL, kv_len};
    sg_tensor *t = NULL, *out = NULL;
    if (in[0] && in[1] && in[2] && (in[3] || !mask)) {
        /* A backward will follow: the node also keeps its rows' logsumexps. */
        bool lse = !ctx->grad_off && (in[0]->grad_fn || in[1]->grad_fn || in[2]->grad_fn);
        sg__node n = {.op = SG__OP_ATTENTION,
                      .nin = 5,
                      .in = in,
                      .f = {scale},
                      .i = {flags | (lse ? SG__ATTN_LSE : 0)}};
        int64_t ts[4] = {bh[0], Lq, bh[1], D};
        t = lse ? attn_packed(ctx, &n, op, q->dtype, ts) : sg__run_new(ctx, &n, q->dtype, 4, ts);
    }
    for (int i = 0; i < 4; i++) sg__tensor_drop(in[i]);
    if (!t) return NULL;
    static const int64_t perm[4] = {0, 2, 1, 3};
    if (Lq == 1 || bh[1] == 1) {
        int64_t st[4] = {bh[1] * Lq * D, Lq * D, D, 1};
        out = sg__tensor_view(t, op, 4, qs, st, t->offset);
    } else {
        out = sg__attn_heads(t, op);
    }
    out = sg__grad_view(t, out, SG__VIEW_PERMUTE, perm);
    sg__tensor_drop(t);
    return out;
}

/*
 * ATTENTION_BWD's layout code (sg__attn_bwd_parts): bit 0 mirrored, bit 1
 * one region; part k's dim order at bits 2 + 8k (four 2-bit dims, outer
 * first: 0 b, 1 h, 2 i, 3 x, the dim of the three parts in one region) and
 * its place along x at bits 26 + 2k. The last dim is always innermost.
 */
#define LAYOUT_MIRROR 1
#define LAYOUT_JOINT 2

void sg__attn_bwd_parts(int64_t layout, const int64_t *qs, const int64_t *ks, sg__attn_part *part) {
    int64_t nq = qs[0] * qs[1] * qs[2] * qs[3], nkv = ks[0] * ks[1] * ks[2] * ks[3];
    int64_t base[3] = {0, nq, nq + nkv};
    bool joint = (layout & LAYOUT_JOINT) != 0;
    for (int k = 0; k < 3; k++) {
        const int64_t *s = k ? ks : qs;
        int64_t size[4] = {s[0], s[1], s[2], joint ? 3 : 1}, st[4], m = s[3];
        for (int p = 3; p >= 0; p--) {
            int d = layout & LAYOUT_MIRROR ? (int)(layout >> (2 + 8 * k + 2 * p)) & 3 : p;
            st[d] = m;
            m *= size[d];
        }
        int64_t slot = joint ? (layout >> (26 + 2 * k)) & 3 : 0;
        part[k] = (sg__attn_part){(joint ? 0 : base[k]) + slot * st[3], st[0], st[1], st[2]};
    }
}

/* The order (outer first) of t's dims b, h, i and x (nx of stride xs)
 * when they lay its elements out densely over a unit-stride last dim. */
static bool dense_order(const sg_tensor *t, int64_t nx, int64_t xs, int *ord) {
    int64_t size[4] = {t->shape[0], t->shape[1], t->shape[2], nx};
    int64_t st[4] = {t->stride[0], t->stride[1], t->stride[2], xs};
    if (t->shape[3] > 1 && t->stride[3] != 1) return false;
    int n = 0;
    for (int d = 0; d < 4; d++) /* size-1 dims outermost: their strides never count */
        if (size[d] == 1) ord[n++] = d;
    int first = n;
    for (int d = 0; d < 4; d++) {
        if (size[d] == 1) continue;
        int j = n++;
        for (; j > first && st[ord[j - 1]] < st[d]; j--) ord[j] = ord[j - 1];
        ord[j] = d;
    }
    int64_t want = t->shape[3];
    for (int p = 3; p >= first; p--) {
        if (st[ord[p]] != want) return false;
        want *= size[ord[p]];
    }
    return true;
}

static int64_t layout_order(const int *ord, int k) {
    int64_t code = 0;
    for (int p = 0; p < 4; p++) code |= (int64_t)ord[p] << (2 + 8 * k + 2 * p);
    return code;
}

/* q, k and v views of one tensor, of one geometry, at equally spaced
 * offsets that make one dense region: its layout code, else 0. */
static int64_t joint_layout(sg_tensor *const *in) {
    const sg_tensor *q = in[0];
    for (int k = 1; k < 3; k++)
        if (in[k]->st != q->st || memcmp(in[k]->shape, q->shape, sizeof(int64_t) * 4) != 0 ||
            memcmp(in[k]->stride, q->stride, sizeof(int64_t) * 4) != 0)
            return 0;
    int64_t o[3] = {in[0]->offset, in[1]->offset, in[2]->offset}, lo = o[0], hi = o[0];
    for (int k = 1; k < 3; k++) lo = o[k] < lo ? o[k] : lo, hi = o[k] > hi ? o[k] : hi;
    int64_t xs = (hi - lo) / 2, slot[3];
    int ord[4];
    for (int k = 0; k < 3; k++) {
        if (xs <= 0 || (o[k] - lo) % xs != 0) return 0;
        slot[k] = (o[k] - lo) / xs;
    }
    if (slot[0] == slot[1] || slot[0] == slot[2] || slot[1] == slot[2] ||
        !dense_order(q, 3, xs, ord))
        return 0;
    int64_t code = LAYOUT_MIRROR | LAYOUT_JOINT;
    for (int k = 0; k < 3; k++) code |= layout_order(ord, k) | slot[k] << (26 + 2 * k);
    return code;
}

/*
 * Where ATTENTION_BWD puts dq, dk and dv (sg__attn_bwd_parts): as q, k and
 * v lie, so that the views that made them from their tensors take the
 * gradients back to those tensors' layouts without a copy -- all three in
 * one region when they are views of one base (a fused projection narrowed
 * three ways), else each where its own strides are dense; a part whose
 * operand is broadcast or otherwise not dense is contiguous.
 */
static int64_t bwd_layout(sg_ctx *ctx, sg_tensor *const *in) {
    for (int k = 0; k < 3; k++)
        if (sg__numel(4, in[k]->shape) == 0) return 0;
    int64_t code = joint_layout(in);
    if (code) return code;
    code = LAYOUT_MIRROR;
    int ord[4];
    for (int k = 0; k < 3; k++) {
        if (!dense_order(in[k], 1, 0, ord))
            for (int p = 0; p < 4; p++) ord[p] = p;
        code |= layout_order(ord, k);
    }
    if (in[1]->st == in[0]->st && in[2]->st == in[0]->st) {
        char a[SG__DESC];
        sg__log(ctx, "perf_hints",
                "sg_sdpa backward: q %s, k and v view one tensor but not as three equal, "
                "disjoint parts of one dense region (grouped K/V heads, padding or odd "
                "strides): their gradients are written apart and copied into its gradient",
                sg__describe(in[0], a, sizeof a));
    }
    return code;
}

sg_status sg__sdpa_grad(sg_tensor *const *in, sg_tensor *o, sg_tensor *lse, sg_tensor *dout,
                        double scale, int flags, sg_tensor **dq, sg_tensor **dk, sg_tensor **dv) {
    sg_tensor *q = in[0], *k = in[1];
    sg_ctx *ctx = q->ctx;
    if (!dout) return ctx->status != SG_OK ? ctx->status : SG_ERR_NULL;
    int64_t B = q->shape[0], Hq = q->shape[1], Lq = q->shape[2], D = q->shape[3];
    int64_t Hkv = k->shape[1], S = k->shape[2];
    int64_t nq = B * Hq * Lq * D, nkv = B * Hkv * S * D;
    int64_t total = sg__attn_bwd_numel(nq, nkv, B * Hq * Lq, sg_dtype_size(q->dtype));
    sg_tensor *g = dout->dtype == q->dtype ? dout : sg_cast(dout, q->dtype);
    sg_tensor *args[8] = {q, k, in[2], in[3], in[4], o, g, lse};
    int64_t layout = bwd_layout(ctx, in);
    sg__node n = {.op = SG__OP_ATTENTION_BWD,
                  .nin = lse ? 8 : 7,
                  .in = args,
                  .f = {scale},
                  .i = {flags & ~SG__ATTN_LSE, layout}};
    sg_tensor *pk = g ? sg__run_new(ctx, &n, q->dtype, 1, &total) : NULL;
    if (g != dout) sg__tensor_drop(g);
    if (!pk) return ctx->status != SG_OK ? ctx->status : SG_ERR_INTERNAL;
    int64_t qs[4] = {B, Hq, Lq, D}, ks[4] = {B, Hkv, S, D};
    sg__attn_part p[3];
    sg__attn_bwd_parts(layout, qs, ks, p);
    sg_tensor **d[3] = {dq, dk, dv};
    for (int k = 0; k < 3; k++) {
        int64_t st[4] = {p[k].sb, p[k].sh, p[k].si, 1};
        *d[k] = sg__tensor_view(pk, "sg_sdpa", 4, k ? ks : qs, st, p[k].off);
    }
    sg__tensor_drop(pk);
    if (*dq && *dk && *dv) return SG_OK;
    sg__tensor_drop(*dq), sg__tensor_drop(*dk), sg__tensor_drop(*dv);
    *dq = *dk = *dv = NULL;
    return ctx->status != SG_OK ? ctx->status : SG_ERR_OOM;
}

/* A float mask that needs a gradient (while grad is on): ATTENTION_BWD
 * gives none, so such a call runs as the decomposed ops. */
static bool mask_wants_grad(const sg_ctx *ctx, const sg_tensor *mask) {
    return !ctx->grad_off && mask && mask->grad_fn;
}

/* Attention with a gradient wanted that runs as the decomposed ops: said
 * once per call under perf_hints (SG_LOGS=perf_hints). */
static void hint_decomposed(sg_ctx *ctx, sg_tensor *const *in, const char *why) {
    if (ctx->grad_off || !(in[0]->grad_fn || in[1]->grad_fn || in[2]->grad_fn)) return;
    char a[SG__DESC];
    sg__log(ctx, "perf_hints",
            "sg_sdpa: q %s with gradients runs as matmul, softmax, matmul "
            "(scores in memory): %s",
            sg__describe(in[0], a, sizeof a), why);
}

/* Whether the context's backend has attention kernels: Level Zero has none
 * in OpenCL C, so attention there runs as the decomposed ops. */
static bool attn_kernels(const sg_ctx *ctx) { return ctx->backend != SG_BACKEND_ZE; }

/* sg_sdpa through ATTENTION when the kernels take it: at most 4 dims, Dv = D
 * <= 256, and q's heads a multiple of k's and v's (or broadcast). Sets *took. */
static sg_tensor *sdpa_fused(sg_ctx *ctx, sg_tensor *const *in, sg_tensor *mask, bool causal,
                             double scale, bool *took) {
    sg_tensor *q = in[0], *k = in[1], *v = in[2];
    int nd;
    int64_t sc[SG_MAX_DIMS];
    bool gqa = sdpa_gqa(q, k, v);
    *took = false;
    if (!attn_kernels(ctx)) return NULL;
    if (!sdpa_scores(ctx, in, gqa, &nd, sc) || nd > 4) {
        hint_decomposed(ctx, in, "more than 4 dims");
        return NULL;
    }
    int64_t D = q->shape[q->ndim - 1];
    if (D > ATTN_MAX_D || v->shape[v->ndim - 1] != D) {
        hint_decomposed(ctx, in, D > ATTN_MAX_D ? "D > 256" : "v's last dim is not q's");
        return NULL;
    }
    if (mask_wants_grad(ctx, mask)) {
        hint_decomposed(ctx, in, "the mask needs a gradient");
        return NULL;
    }
    int64_t bh[2] = {nd >= 4 ? sc[nd - 4] : 1, nd >= 3 ? sc[nd - 3] : 1};
    /* K/V heads: their own count when they share one (grouped, or 1), else the output's. */
    int64_t hk = k->ndim >= 3 ? k->shape[k->ndim - 3] : 1;
    int64_t hv = v->ndim >= 3 ? v->shape[v->ndim - 3] : 1;
    int64_t hkv = hk == hv ? hk : bh[1];
    *took = true;
    sg_tensor *o4 = attn_run(ctx, "sg_sdpa", q, k, v, mask, NULL, bh, hkv, scale,
                             causal ? SG__ATTN_CAUSAL : 0);
    if (!o4 || nd == 4) return o4;
    /* Fewer dims: o4's last nd, the ones before them of size 1. */
    int64_t os[SG_MAX_DIMS], st[SG_MAX_DIMS];
    memcpy(os, sc, sizeof os);
    os[nd - 1] = D;
    for (int d = 0; d < nd; d++) st[d] = o4->stride[4 - nd + d];
    sg_tensor *out = sg__tensor_view(o4, "sg_sdpa", nd, os, st, o4->offset);
    out = sg__grad_view(o4, out, SG__VIEW_RESHAPE, NULL);
    sg__tensor_drop(o4);
    return out;
}

sg_tensor *sg_sdpa(sg_tensor *q, sg_tensor *k, sg_tensor *v, sg_tensor *mask, bool causal,
                   double scale) {
    sg_tensor *in[4] = {q, k, v, mask};
    static const bool optional[4] = {false, false, false, true};
    sg_ctx *ctx = sg__check_inputs("sg_sdpa", 4, in, optional);
    if (!ctx || !sdpa_check(ctx, in, mask, &scale)) return NULL;
    bool took = false;
    sg_tensor *out = sdpa_fused(ctx, in, mask, causal, scale, &took);
    if (!took) out = sg__sdpa_decomposed(q, k, v, mask, causal, scale);
    if (!out) name_failure(ctx, "sg_sdpa");
    return out;
}

/* ------------------------------------------------------------ sdpa over a cache */

static bool cached_check(sg_ctx *ctx, sg_tensor *const *in, double *scale) {
    sg_tensor *q = in[0], *k = in[1], *v = in[2], *len = in[3];
    char a[SG__DESC], b[SG__DESC], c[SG__DESC];
    const char *op = "sg_sdpa_cached";
    if (!sg__dtype_is_float(q->dtype) || k->dtype != q->dtype || v->dtype != q->dtype) {
        sg__fail(ctx, SG_ERR_DTYPE, "%s: q %s, k_cache %s, v_cache %s must be of one float "
                 "dtype (f32, f16 or bf16)", op, sg__describe(q, a, sizeof a),
                 sg__describe(k, b, sizeof b), sg__describe(v, c, sizeof c));
        return false;
    }
    bool ok = q->ndim == 4 && k->ndim == 4 && v->ndim == 4;
    for (int d = 0; ok && d < 4; d++) ok = k->shape[d] == v->shape[d];
    ok = ok && k->shape[0] == q->shape[0] && k->shape[3] == q->shape[3] && k->shape[1] > 0 &&
         q->shape[1] % k->shape[1] == 0;
    if (!ok) {
        sg__fail(ctx, SG_ERR_SHAPE, "%s: q %s, k_cache %s, v_cache %s do not fit: q is (B, Hq, "
                 "Lq, D), both caches (B, Hkv, S, D) with Hq a multiple of Hkv", op,
                 sg__describe(q, a, sizeof a), sg__describe(k, b, sizeof b),
                 sg__describe(v, c, sizeof c));
        return false;
    }
    if ((len->dtype != SG_I32 && len->dtype != SG_I64) || len->ndim > 1 ||
        (len->ndim == 1 && len->shape[0] != q->shape[0] && len->shape[0] != 1)) {
        sg__fail(ctx, len->ndim > 1 || len->dtype == SG_I32 || len->dtype == SG_I64
                          ? SG_ERR_SHAPE : SG_ERR_DTYPE,
                 "%s: kv_len is %s; it must be i32 or i64 of shape () or (B) = (%lld)", op,
                 sg__describe(len, a, sizeof a), (long long)q->shape[0]);
        return false;
    }
    if (!isfinite(*scale)) {
        sg__fail(ctx, SG_ERR_INVALID_ARG, "%s: scale %g is not finite; pass a positive scale, "
                 "or 0 for 1/sqrt(D)", op, *scale);
        return false;
    }
    if (*scale <= 0) *scale = q->shape[3] > 0 ? 1.0 / sqrt((double)q->shape[3]) : 1.0;
    return true;
}

/*
 * keep[b][0][i][j] = j <= clamp(kv_len[b], 0, S) - Lq + i: bool (B or 1, 1,
 * Lq, S), sg_sdpa_cached's visibility as a mask for the decomposed ops,
 * computed on the device from kv_len.
 */
static sg_tensor *cached_keep(sg_ctx *ctx, sg_tensor *kv_len, int64_t Lq, int64_t S) {
    int64_t ls[4] = {kv_len->ndim ? kv_len->shape[0] : 1, 1, 1, 1}, col[2] = {Lq, 1};
    sg_tensor *l = sg_cast(kv_len, SG_I64);
    l = then(l, sg_clamp(l, 0, (double)S));
    l = then(l, sg_reshape(l, 4, ls));
    sg_tensor *rows = sg_arange(ctx, SG_I64, (double)-Lq, 0, 1); /* i - Lq */
    rows = then(rows, sg_reshape(rows, 2, col));
    sg_tensor *last = sg_add(l, rows); /* (B, 1, Lq, 1): the last key query i sees */
    sg_tensor *keys = sg_arange(ctx, SG_I64, 0, (double)S, 1);
    sg_tensor *keep = sg_le(keys, last);
    sg__tensor_drop(l), sg__tensor_drop(rows), sg__tensor_drop(last), sg__tensor_drop(keys);
    return keep;
}

sg_tensor *sg_sdpa_cached(sg_tensor *q, sg_tensor *k_cache, sg_tensor *v_cache,
                          sg_tensor *kv_len, double scale) {
    sg_tensor *in[4] = {q, k_cache, v_cache, kv_len};
    sg_ctx *ctx = sg__check_inputs("sg_sdpa_cached", 4, in, NULL);
    if (!ctx || !cached_check(ctx, in, &scale)) return NULL;
    /* Past the kernels: the ops, with kv_len as a mask. */
    if (q->shape[3] > ATTN_MAX_D || !attn_kernels(ctx)) {
        if (attn_kernels(ctx)) hint_decomposed(ctx, in, "D > 256");
        sg_tensor *keep = cached_keep(ctx, kv_len, q->shape[2], k_cache->shape[2]);
        sg_tensor *out = keep ? sg__sdpa_decomposed(q, k_cache, v_cache, keep, false, scale) : NULL;
        sg__tensor_drop(keep);
        if (!out) name_failure(ctx, "sg_sdpa_cached");
        return out;
    }
    int64_t bh[2] = {q->shape[0], q->shape[1]};
    sg_tensor *out = attn_run(ctx, "sg_sdpa_cached", q, k_cache, v_cache, NULL, kv_len, bh,
                              k_cache->shape[1], scale, SG__ATTN_CAUSAL);
    return out;
}
