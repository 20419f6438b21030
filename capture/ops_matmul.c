/* SPDX-License-Identifier: MIT */
/*
 * ops_matmul.c -- front-ends of the matmul family: sg_matmul (batched, with
 * broadcast batch dims and PyTorch's rules for 1-d operands) and sg_linear
 * (x w^T + b). They check dtypes and the sizes that must agree, work out the
 * output shape, and dispatch one MATMUL or LINEAR node. Operands go to the
 * kernel as they are, views included: the kernel reads their strides, so a
 * transposed weight costs no copy here.
 *
 * Node layout (ops.def): MATMUL in = {a, b}; LINEAR in = {x, w, b?} with
 * in[2] NULL when there is no bias. The output of a MATMUL with a 1-d
 * operand has that operand's M or N dim squeezed away, so the kernel tells
 * which dims of out are M and N from the operands' ndim.
 */
#include "capture.h"

#include <stdio.h>

static const char *kind_float = "f32, f16 or bf16";

/* Floats only, one dtype for all of ts (NULL entries skipped). */
static bool check_dtypes(sg_ctx *ctx, const char *op, int n, sg_tensor *const *ts,
                         const char *const *names) {
    char d0[SG__DESC], d1[SG__DESC];
    if (!sg__dtype_is_float(ts[0]->dtype)) {
        sg__fail(ctx, SG_ERR_DTYPE, "%s: %s is %s; it takes %s; convert with sg_cast first", op,
                 names[0], sg__describe(ts[0], d0, sizeof d0), kind_float);
        return false;
    }
    for (int i = 1; i < n; i++)
        if (ts[i] && ts[i]->dtype != ts[0]->dtype) {
            sg__fail(ctx, SG_ERR_DTYPE, "%s: dtypes differ (%s %s and %s %s); convert one with "
                     "sg_cast", op, names[0], sg__describe(ts[0], d0, sizeof d0), names[i],
                     sg__describe(ts[i], d1, sizeof d1));
            return false;
        }
    return true;
}

/*
 * The broadcast of a's and b's batch dims (all but their last two; a 1-d
 * operand has none) into shape; false with a message when they clash.
 */
static bool batch_broadcast(sg_ctx *ctx, const sg_tensor *a, const sg_tensor *b, int *nb,
                            int64_t *shape) {
    int ab = a->ndim > 2 ? a->ndim - 2 : 0, bb = b->ndim > 2 ? b->ndim - 2 : 0;
    int n = ab > bb ? ab : bb;
    for (int d = 0; d < n; d++) {
        int64_t sa = d < n - ab ? 1 : a->shape[d - (n - ab)];
        int64_t sb = d < n - bb ? 1 : b->shape[d - (n - bb)];
        if (sa != sb && sa != 1 && sb != 1) {
            char da[SG__DESC], db[SG__DESC];
            sg__fail(ctx, SG_ERR_SHAPE, "sg_matmul: the batch dims of a %s and b %s do not "
                     "broadcast (batch dim %d: %lld vs %lld); batch sizes must match or be 1",
                     sg__describe(a, da, sizeof da), sg__describe(b, db, sizeof db), d - n,
                     (long long)sa, (long long)sb);
            return false;
        }
        shape[d] = sa == 1 ? sb : sa;
    }
    *nb = n;
    return true;
}

sg_tensor *sg_matmul(sg_tensor *a, sg_tensor *b) {
    sg_tensor *in[2] = {a, b};
    sg_ctx *ctx = sg__check_inputs("sg_matmul", 2, in, NULL);
    if (!ctx) return NULL;
    static const char *const names[2] = {"a", "b"};
    if (!check_dtypes(ctx, "sg_matmul", 2, in, names)) return NULL;
    char da[SG__DESC], db[SG__DESC];
    if (a->ndim == 0 || b->ndim == 0) {
        sg__fail(ctx, SG_ERR_SHAPE, "sg_matmul: %s is %s (0-d); matmul needs operands of at "
                 "least 1 dim; scale by a scalar with sg_mul or sg_mul_scalar", a->ndim ? "b" : "a",
                 sg__describe(a->ndim ? b : a, da, sizeof da));
        return NULL;
    }
    /* A 1-d a is a row (1, K) and a 1-d b a column (K, 1), squeezed afterwards. */
    int64_t ka = a->shape[a->ndim - 1];
    int64_t kb = b->ndim == 1 ? b->shape[0] : b->shape[b->ndim - 2];
    if (ka != kb) {
        sg__fail(ctx, SG_ERR_SHAPE, "sg_matmul: inner sizes differ: a %s has K=%lld (its last "
                 "dim) but b %s has K=%lld (its %s dim); a's last dim must equal b's "
                 "second-to-last (or only) dim", sg__describe(a, da, sizeof da), (long long)ka,
                 sg__describe(b, db, sizeof db), (long long)kb,
                 b->ndim == 1 ? "only" : "second-to-last");
        return NULL;
    }
    int nd;
    int64_t shape[SG_MAX_DIMS];
    if (!batch_broadcast(ctx, a, b, &nd, shape)) return NULL;
    /* nd + 2 <= max(a->ndim, b->ndim) <= SG_MAX_DIMS: no overflow of shape. */
    if (a->ndim >= 2) shape[nd++] = a->shape[a->ndim - 2];
    if (b->ndim >= 2) shape[nd++] = b->shape[b->ndim - 1];
    sg__node n = {.op = SG__OP_MATMUL, .nin = 2, .in = in};
    return sg__run_new(ctx, &n, a->dtype, nd, shape);
}

sg_tensor *sg_linear(sg_tensor *x, sg_tensor *w, sg_tensor *b) {
    sg_tensor *in[3] = {x, w, b};
    static const bool optional[3] = {false, false, true};
    sg_ctx *ctx = sg__check_inputs("sg_linear", 3, in, optional);
    if (!ctx) return NULL;
    static const char *const names[3] = {"x", "w", "b"};
    if (!check_dtypes(ctx, "sg_linear", 3, in, names)) return NULL;
    char dx[SG__DESC], dw[SG__DESC], dbias[SG__DESC];
    if (w->ndim != 2) {
        sg__fail(ctx, SG_ERR_SHAPE, "sg_linear: w is %s; it must be 2-d (N, K): N outputs of K "
                 "inputs each", sg__describe(w, dw, sizeof dw));
        return NULL;
    }
    if (x->ndim == 0 || x->shape[x->ndim - 1] != w->shape[1]) {
        sg__fail(ctx, SG_ERR_SHAPE, "sg_linear: x %s does not fit w %s: x's last dim must be w's "
                 "K = %lld (w is (N, K))", sg__describe(x, dx, sizeof dx),
                 sg__describe(w, dw, sizeof dw), (long long)w->shape[1]);
        return NULL;
    }
    if (b && (b->ndim != 1 || b->shape[0] != w->shape[0])) {
        sg__fail(ctx, SG_ERR_SHAPE, "sg_linear: bias %s must be 1-d of w's N = %lld (w is %s); "
                 "pass NULL for no bias", sg__describe(b, dbias, sizeof dbias),
                 (long long)w->shape[0], sg__describe(w, dw, sizeof dw));
        return NULL;
    }
    int64_t shape[SG_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    shape[x->ndim - 1] = w->shape[0];
    sg__node n = {.op = SG__OP_LINEAR, .nin = 3, .in = in};
    return sg__run_new(ctx, &n, x->dtype, x->ndim, shape);
}
