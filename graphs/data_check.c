/* SPDX-License-Identifier: MIT */
/*
 * data_check.c -- the index checks of the data ops a device backend runs as
 * kernels (embedding, index_select, index_copy_; CUDA's index_add; Level
 * Zero's gather and index_add): the index tensor is read back to the host
 * and checked before any launch, so that a bad index fails the call with
 * SG_ERR_INDEX, the CPU's message, and every tensor as it was, on every
 * backend (see backend.h). Level Zero's eager cross_entropy reads its
 * targets back the same way (CUDA's row family has its own check).
 */
#include "backend.h"

#include <stdio.h>

/* The furthest element offset of a view from its first. */
static int64_t extent(int nd, const int64_t *shape, const int64_t *stride) {
    int64_t hi = 0;
    for (int d = 0; d < nd; d++) hi += (shape[d] - 1) * stride[d];
    return hi;
}

sg_status sg__check_indices(sg_ctx *ctx, const char *op, const sg_tensor *idx, int64_t limit,
                            const char *what) {
    int64_t n = sg__numel(idx->ndim, idx->shape);
    if (n == 0) return SG_OK;
    size_t es = sg_dtype_size(idx->dtype);
    size_t nbytes = (size_t)(extent(idx->ndim, idx->shape, idx->stride) + 1) * es;
    char *buf = sg__alloc(ctx, nbytes);
    if (!buf)
        return sg__fail(ctx, SG_ERR_OOM, "%s: out of host memory for %lld indices", op,
                        (long long)n);
    sg_status s = ctx->exec.download(ctx, buf, sg__data(idx), nbytes);
    int64_t coord[SG_MAX_DIMS] = {0}, off = 0;
    for (int64_t i = 0; s == SG_OK && i < n; i++) {
        int64_t v =
            idx->dtype == SG_I64 ? ((const int64_t *)buf)[off] : ((const int32_t *)buf)[off];
        if (v < 0 || v >= limit) {
            char d[SG__DESC];
            s = sg__fail(ctx, SG_ERR_INDEX,
                         "%s: idx %s holds %lld at position %lld, out of range "
                         "for %s of size %lld; indices must be in [0, %lld)",
                         op, sg__describe(idx, d, sizeof d), (long long)v, (long long)i, what,
                         (long long)limit, (long long)limit);
            break;
        }
        for (int d = idx->ndim - 1; d >= 0; d--) { /* next row-major position */
            off += idx->stride[d];
            if (++coord[d] < idx->shape[d]) break;
            off -= coord[d] * idx->stride[d];
            coord[d] = 0;
        }
    }
    sg__free(ctx, buf, nbytes);
    return s;
}

/* cross_entropy's targets (N) in [0, C) for logits (N, C), the CPU's message. */
static sg_status check_targets(sg_ctx *ctx, const sg_tensor *lg, const sg_tensor *tg) {
    int64_t N = tg->shape[0], C = lg->shape[1], ts = tg->stride[0];
    if (N == 0) return SG_OK;
    size_t es = sg_dtype_size(tg->dtype);
    int64_t lo = ts < 0 ? (N - 1) * ts : 0, hi = ts < 0 ? 0 : (N - 1) * ts;
    size_t nbytes = (size_t)(hi - lo + 1) * es;
    char *buf = sg__alloc(ctx, nbytes);
    if (!buf)
        return sg__fail(ctx, SG_ERR_OOM,
                        "sg_cross_entropy: out of host memory to check %lld targets (%zu bytes)",
                        (long long)N, nbytes);
    sg_status s = ctx->exec.download(ctx, buf, (const char *)sg__data(tg) + lo * (int64_t)es, nbytes);
    for (int64_t r = 0; s == SG_OK && r < N; r++) {
        int64_t at = r * ts - lo;
        int64_t c = tg->dtype == SG_I32 ? ((const int32_t *)buf)[at] : ((const int64_t *)buf)[at];
        if (c < 0 || c >= C) {
            char a[SG__DESC];
            s = sg__fail(ctx, SG_ERR_INDEX,
                         "sg_cross_entropy: targets[%lld] is %lld, outside [0, %lld) for logits "
                         "%s; targets are class indices (there is no ignore_index)",
                         (long long)r, (long long)c, (long long)C, sg__describe(lg, a, sizeof a));
        }
    }
    sg__free(ctx, buf, nbytes);
    return s;
}

sg_status sg__data_check(sg_ctx *ctx, const sg__node *n) {
    char what[64];
    switch (n->op) {
    case SG__OP_EMBEDDING:
        return sg__check_indices(ctx, "sg_embedding", n->in[1], n->in[0]->shape[0],
                                 "dim 0 of weight");
    case SG__OP_INDEX_SELECT:
        snprintf(what, sizeof what, "dim %d of x", (int)n->i[0]);
        return sg__check_indices(ctx, "sg_index_select", n->in[1], n->in[0]->shape[n->i[0]], what);
    case SG__OP_INDEX_COPY:
        snprintf(what, sizeof what, "dim %d of dst", (int)n->i[0]);
        return sg__check_indices(ctx, "sg_index_copy_", n->in[1], n->out->shape[n->i[0]], what);
    case SG__OP_GATHER:
        snprintf(what, sizeof what, "dim %d of x", (int)n->i[0]);
        return sg__check_indices(ctx, "sg_gather", n->in[1], n->in[0]->shape[n->i[0]], what);
    case SG__OP_INDEX_ADD:
        snprintf(what, sizeof what, "dim %d of dst", (int)n->i[0]);
        return sg__check_indices(ctx, "index_add", n->in[1], n->out->shape[n->i[0]], what);
    case SG__OP_CROSS_ENTROPY: return check_targets(ctx, n->in[0], n->in[1]);
    default: return SG_OK;
    }
}
