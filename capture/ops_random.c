/* SPDX-License-Identifier: MIT */
/*
 * ops_random.c -- random numbers and sampling: the generator state tensor
 * (sg_rng_create), the draws (sg_rand, sg_randn: one RAND node each, whose
 * kernels are graphs/cpu/cpu_random.c and k_data.cu's sg_data_rand), and
 * what is composed from them with ordinary ops (sg_dropout).
 *
 * The state is an i64 tensor [2] = (seed, offset) on the device. A draw
 * reads it in its kernel and then advances offset in place by the Philox
 * blocks it used (an add and a copy_ into rng[1], recorded like any
 * mutation), so a replayed capture draws fresh numbers and no host value is
 * baked in. Node layout (ops.def): RAND in = {rng}, i[0] = 0 uniform,
 * 1 normal; the output is fresh and contiguous.
 */
#include "capture.h"

#include <math.h>
#include <stdio.h>

enum { DIST_UNIFORM = 0, DIST_NORMAL = 1 };

sg_tensor *sg_rng_create(sg_ctx *ctx, uint64_t seed) {
    if (!ctx) return NULL;
    int64_t shape[1] = {2}, v[2] = {(int64_t)seed, 0};
    if (ctx->rec) {
        sg__fail(ctx, SG_ERR_INVALID_ARG,
                 "sg_rng_create: called inside a step that is being "
                 "captured; make the generator once, outside the step, and pass it in");
        return NULL;
    }
    return sg_from_host(ctx, SG_I64, 1, shape, v);
}

/* rng must be the i64 [2] state tensor; returns the context or NULL. */
static sg_ctx *check_rng(const char *fn, sg_tensor *rng) {
    sg_ctx *ctx = sg__check_inputs(fn, 1, &rng, NULL);
    if (!ctx) return NULL;
    if (rng->dtype != SG_I64 || rng->ndim != 1 || rng->shape[0] != 2 || rng->stride[0] == 0) {
        char d[SG__DESC];
        sg__fail(ctx, SG_ERR_INVALID_ARG,
                 "%s: rng is %s; it must be the i64[2] (seed, offset) "
                 "tensor that sg_rng_create makes",
                 fn, sg__describe(rng, d, sizeof d));
        return NULL;
    }
    return ctx;
}

/* Advance rng's offset by `blocks` in place: rng[1] += blocks. */
static sg_status advance(sg_tensor *rng, int64_t blocks) {
    sg_tensor *off = sg_narrow(rng, 0, 1, 1);
    sg_tensor *next = sg_add_scalar(off, (double)blocks);
    sg_status s = next ? sg_copy_(off, next) : sg_ctx_status(rng->ctx);
    sg__tensor_drop(next);
    sg__tensor_drop(off);
    return s;
}

/* The Philox blocks a draw of numel values takes: 4 uniforms or 2 normals a block. */
static int64_t blocks_of(int64_t numel, int dist) {
    int64_t per = dist == DIST_NORMAL ? 2 : 4;
    return (numel + per - 1) / per;
}

static sg_tensor *draw(const char *fn, sg_tensor *rng, sg_dtype dt, int ndim, const int64_t *shape,
                       int dist) {
    sg_ctx *ctx = check_rng(fn, rng);
    if (!ctx) return NULL;
    if (!sg__dtype_is_float(dt)) {
        sg__fail(ctx, SG_ERR_DTYPE,
                 "%s: dtype %s (%d); draws are f32, f16 or bf16 (cast the "
                 "result for other dtypes)",
                 fn, sg_dtype_name(dt), (int)dt);
        return NULL;
    }
    if (ndim < 0 || ndim > SG_MAX_DIMS || (ndim > 0 && !shape)) {
        sg__fail(ctx, SG_ERR_SHAPE, "%s: ndim %d%s; pass 0 to %d sizes", fn, ndim,
                 ndim > 0 && !shape ? " with a NULL shape" : "", SG_MAX_DIMS);
        return NULL;
    }
    sg_tensor *in[1] = {rng};
    sg__node n = {.op = SG__OP_RAND, .nin = 1, .in = in, .i = {dist}};
    sg_tensor *out = sg__run_new(ctx, &n, dt, ndim, shape);
    if (!out) return NULL;
    int64_t numel = sg__numel(ndim, shape);
    if (numel > 0 && advance(rng, blocks_of(numel, dist)) != SG_OK) {
        sg__tensor_drop(out);
        return NULL;
    }
    return out;
}

sg_tensor *sg_rand(sg_tensor *rng, sg_dtype dt, int ndim, const int64_t *shape) {
    return draw("sg_rand", rng, dt, ndim, shape, DIST_UNIFORM);
}

sg_tensor *sg_randn(sg_tensor *rng, sg_dtype dt, int ndim, const int64_t *shape) {
    return draw("sg_randn", rng, dt, ndim, shape, DIST_NORMAL);
}

/* x * (u >= p) / (1 - p), u ~ U[0, 1) of x's shape and dtype. */
sg_tensor *sg_dropout(sg_tensor *x, double p, sg_tensor *rng) {
    sg_tensor *in[2] = {x, rng};
    sg_ctx *ctx = sg__check_inputs("sg_dropout", 2, in, NULL);
    if (!ctx || !check_rng("sg_dropout", rng)) return NULL;
    char d[SG__DESC];
    if (!sg__dtype_is_float(x->dtype)) {
        sg__fail(ctx, SG_ERR_DTYPE, "sg_dropout: x is %s; it takes f32, f16 or bf16",
                 sg__describe(x, d, sizeof d));
        return NULL;
    }
    if (!(p >= 0 && p <= 1)) {
        sg__fail(ctx, SG_ERR_INVALID_ARG, "sg_dropout: p %g; it must be in [0, 1]", p);
        return NULL;
    }
    if (p == 0) return sg_mul_scalar(x, 1.0);
    sg_tensor *u = sg_rand(rng, x->dtype, x->ndim, x->shape);
    sg_tensor *thr = sg_full(ctx, x->dtype, 0, NULL, p);
    sg_tensor *keep = sg_ge(u, thr), *out;
    if (p == 1) { /* drops everything: zeros, not 0 * inf (keep is all false) */
        sg_tensor *zero = sg_full(ctx, x->dtype, 0, NULL, 0.0);
        out = sg_where(keep, x, zero);
        sg__tensor_drop(zero);
    } else {
        sg_tensor *keepf = sg_cast(keep, x->dtype), *kept = sg_mul(x, keepf);
        out = sg_mul_scalar(kept, 1.0 / (1.0 - p));
        sg__tensor_drop(keepf), sg__tensor_drop(kept);
    }
    sg__tensor_drop(u), sg__tensor_drop(thr), sg__tensor_drop(keep);
    int64_t numel = sg__numel(x->ndim, x->shape);
    if (!out && u && numel > 0) { /* failed after the draw: the offset goes back */
        sg_status st = ctx->status;
        char msg[SG__MSG_SIZE];
        snprintf(msg, sizeof msg, "%s", ctx->msg);
        advance(rng, -blocks_of(numel, DIST_UNIFORM));
        ctx->status = st; /* the failure's own message, not the rollback's */
        snprintf(ctx->msg, sizeof ctx->msg, "%s", msg);
    }
    return out;
}

/* ------------------------------------------------------------ sampling */

/* x is a float tensor of at least one dim with a nonempty last dim
 * (unless empty_ok); returns false with a message naming fn. */
static bool rows_ok(sg_ctx *ctx, const char *fn, const sg_tensor *x, bool empty_ok) {
    char d[SG__DESC];
    if (!sg__dtype_is_float(x->dtype)) {
        sg__fail(ctx, SG_ERR_DTYPE, "%s: x is %s; it takes f32, f16 or bf16 (cast first)", fn,
                 sg__describe(x, d, sizeof d));
        return false;
    }
    if (x->ndim < 1 || (!empty_ok && x->shape[x->ndim - 1] < 1)) {
        sg__fail(ctx, SG_ERR_SHAPE,
                 "%s: x is %s; it needs at least one dim and entries along "
                 "the last one",
                 fn, sg__describe(x, d, sizeof d));
        return false;
    }
    return true;
}

/* Run a per-row node over a contiguous copy of x (or x itself). */
static sg_tensor *run_rows(sg_ctx *ctx, sg__node *n, sg_tensor *x, sg_tensor *rng, int ndim,
                           const int64_t *shape) {
    sg_tensor *xc = sg_contiguous(x);
    if (!xc) return NULL;
    sg_tensor *in[2] = {xc, rng};
    n->in = in;
    sg_tensor *out = sg__run_new(ctx, n, SG_I64, ndim, shape);
    sg__tensor_drop(xc);
    return out;
}

sg_tensor *sg_topk_indices(sg_tensor *x, int64_t k) {
    sg_ctx *ctx = sg__check_inputs("sg_topk_indices", 1, &x, NULL);
    if (!ctx || !rows_ok(ctx, "sg_topk_indices", x, true)) return NULL;
    int64_t V = x->shape[x->ndim - 1], shape[SG_MAX_DIMS];
    if (k < 0 || k > V) {
        char d[SG__DESC];
        sg__fail(ctx, SG_ERR_INVALID_ARG,
                 "sg_topk_indices: k %lld for x %s; k must be in [0, "
                 "%lld] (the last dim's size)",
                 (long long)k, sg__describe(x, d, sizeof d), (long long)V);
        return NULL;
    }
    memcpy(shape, x->shape, sizeof shape);
    shape[x->ndim - 1] = k;
    sg__node n = {.op = SG__OP_TOPK, .nin = 1, .i = {k}};
    return run_rows(ctx, &n, x, NULL, x->ndim, shape);
}

sg_tensor *sg_gather(sg_tensor *x, int dim, sg_tensor *idx) {
    sg_tensor *in[2] = {x, idx};
    sg_ctx *ctx = sg__check_inputs("sg_gather", 2, in, NULL);
    if (!ctx) return NULL;
    char a[SG__DESC], b[SG__DESC];
    if (idx->dtype != SG_I32 && idx->dtype != SG_I64) {
        sg__fail(ctx, SG_ERR_DTYPE, "sg_gather: idx is %s; indices must be i32 or i64",
                 sg__describe(idx, a, sizeof a));
        return NULL;
    }
    int d = x->ndim ? sg__norm_dim(dim, x->ndim) : -1;
    bool ok = d >= 0 && idx->ndim == x->ndim;
    for (int k = 0; ok && k < x->ndim; k++) ok = k == d || idx->shape[k] <= x->shape[k];
    if (!ok) {
        sg__fail(ctx, d < 0 ? SG_ERR_INDEX : SG_ERR_SHAPE,
                 "sg_gather: x %s, idx %s, dim %d: x "
                 "needs a dim %d, idx x's number of dims, and sizes no larger than x's except "
                 "at dim",
                 sg__describe(x, a, sizeof a), sg__describe(idx, b, sizeof b), dim, dim);
        return NULL;
    }
    sg__node n = {.op = SG__OP_GATHER, .nin = 2, .in = in, .i = {d}};
    return sg__run_new(ctx, &n, x->dtype, idx->ndim, idx->shape);
}

/* One SAMPLE node per row of x, then rng advanced by the rows. */
static sg_tensor *sample_rows(sg_ctx *ctx, sg_tensor *x, sg_tensor *rng, int kind, double temp,
                              int64_t top_k, double top_p) {
    int64_t rows = sg__numel(x->ndim - 1, x->shape);
    sg__node n = {.op = SG__OP_SAMPLE, .nin = 2, .i = {top_k, kind}, .f = {temp, top_p}};
    sg_tensor *out = run_rows(ctx, &n, x, rng, x->ndim - 1, x->shape);
    if (out && rows > 0 && advance(rng, rows) != SG_OK) {
        sg__tensor_drop(out);
        return NULL;
    }
    return out;
}

sg_tensor *sg_multinomial(sg_tensor *probs, sg_tensor *rng) {
    sg_tensor *in[2] = {probs, rng};
    sg_ctx *ctx = sg__check_inputs("sg_multinomial", 2, in, NULL);
    if (!ctx || !check_rng("sg_multinomial", rng) || !rows_ok(ctx, "sg_multinomial", probs, false))
        return NULL;
    return sample_rows(ctx, probs, rng, 0, 1.0, 0, 1.0);
}

sg_tensor *sg_sample(sg_tensor *logits, double temperature, int64_t top_k, double top_p,
                     sg_tensor *rng) {
    sg_tensor *in[2] = {logits, rng};
    sg_ctx *ctx = sg__check_inputs("sg_sample", 2, in, NULL);
    if (!ctx || !check_rng("sg_sample", rng) || !rows_ok(ctx, "sg_sample", logits, false))
        return NULL;
    if (!(temperature >= 0) || !isfinite(temperature) || top_k < 0 || !(top_p > 0 && top_p <= 1)) {
        sg__fail(ctx, SG_ERR_INVALID_ARG,
                 "sg_sample: temperature %g, top_k %lld, top_p %g; need "
                 "temperature >= 0 (0: argmax), top_k >= 0 (0: off) and top_p in (0, 1] (1: off)",
                 temperature, (long long)top_k, top_p);
        return NULL;
    }
    if (temperature == 0) return sg_argmax(logits, -1, false);
    return sample_rows(ctx, logits, rng, 1, temperature, top_k, top_p);
}
