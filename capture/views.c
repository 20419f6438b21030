/* SPDX-License-Identifier: MIT */
/*
 * views.c -- zero-copy views (reshape/view, permute, transpose, slice,
 * narrow, expand, squeeze, unsqueeze) and the copies that make a tensor
 * contiguous (contiguous, clone). A view is a new handle over the same
 * storage with its own shape, strides and offset.
 */
#include "capture.h"

/*
 * Strides that let (ndim, shape) read the elements of t in row-major order
 * without a copy, if any exist (PyTorch's computeStride): the old dims are
 * walked in chunks that are contiguous among themselves, and each chunk must
 * be covered exactly by a run of new dims.
 */
static bool view_strides(const sg_tensor *t, int ndim, const int64_t *shape, int64_t *stride) {
    if (sg__numel(t->ndim, t->shape) == 0 || t->ndim == 0) {
        int64_t s = 1;
        for (int d = ndim - 1; d >= 0; d--) {
            stride[d] = s;
            if (__builtin_mul_overflow(s, shape[d] > 0 ? shape[d] : 1, &s))
                return false; /* strides past 64 bits: no view (a copy says why) */
        }
        return true;
    }
    int view_d = ndim - 1;
    int64_t base = t->stride[t->ndim - 1], tensor_numel = 1, view_numel = 1;
    for (int td = t->ndim - 1; td >= 0; td--) {
        tensor_numel *= t->shape[td];
        bool chunk_ends = td == 0 || (t->shape[td - 1] != 1 &&
                                      t->stride[td - 1] != tensor_numel * base);
        if (!chunk_ends) continue;
        while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
            stride[view_d] = view_numel * base;
            view_numel *= shape[view_d];
            view_d--;
        }
        if (view_numel != tensor_numel) return false;
        if (td > 0) {
            base = t->stride[td - 1];
            tensor_numel = view_numel = 1;
        }
    }
    return view_d == -1;
}

/* The element count of sizes >= 0, or -1 when it would pass INT64_MAX
 * (requested shapes come from the user and may be anything). */
static int64_t checked_numel(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++)
        if (shape[d] == 0) return 0;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] > INT64_MAX / n) return -1;
        n *= shape[d];
    }
    return n;
}

/* Resolve a -1 in a requested shape and check the element count. */
static bool infer_shape(sg_ctx *ctx, const char *op, const sg_tensor *t, int ndim,
                        const int64_t *in, int64_t *out) {
    char a[SG__DESC], b[96];
    if (ndim < 0 || ndim > SG_MAX_DIMS) {
        sg__fail(ctx, SG_ERR_SHAPE, "%s: ndim %d is out of range; stepgraph tensors have 0 to %d "
                 "dims", op, ndim, SG_MAX_DIMS);
        return false;
    }
    if (ndim > 0 && !in) {
        sg__fail(ctx, SG_ERR_NULL, "%s: shape is NULL for ndim %d; pass ndim sizes", op, ndim);
        return false;
    }
    int infer = -1;
    int64_t numel = sg__numel(t->ndim, t->shape);
    for (int d = 0; d < ndim; d++) {
        out[d] = in[d];
        if (in[d] == -1 && infer < 0) {
            infer = d;
            out[d] = 1; /* for the count of the known sizes below */
        } else if (in[d] < 0) {
            sg__fail(ctx, SG_ERR_SHAPE, "%s: size %lld at dim %d; sizes are >= 0 and one may be "
                     "-1", op, (long long)in[d], d);
            return false;
        }
    }
    int64_t known = checked_numel(ndim, out); /* -1 (too many) can never match */
    if (infer >= 0 && known > 0 && numel % known == 0) {
        out[infer] = numel / known;
        return true;
    }
    if (infer < 0 && known == numel) return true;
    sg__fail(ctx, SG_ERR_SHAPE, "%s: %s (%lld elements) cannot take shape %s", op,
             sg__describe(t, a, sizeof a), (long long)numel, sg__shape_str(ndim, in, b, sizeof b));
    return false;
}

sg_tensor *sg_view(sg_tensor *t, int ndim, const int64_t *shape) {
    sg_ctx *ctx = sg__check_inputs("sg_view", 1, &t, NULL);
    if (!ctx) return NULL;
    int64_t sh[SG_MAX_DIMS], st[SG_MAX_DIMS];
    if (!infer_shape(ctx, "sg_view", t, ndim, shape, sh)) return NULL;
    if (!view_strides(t, ndim, sh, st)) {
        char a[SG__DESC], b[96];
        sg__fail(ctx, SG_ERR_SHAPE, "sg_view: %s has strides no view of shape %s can use; call "
                 "sg_reshape (which copies) or sg_contiguous first", sg__describe(t, a, sizeof a),
                 sg__shape_str(ndim, sh, b, sizeof b));
        return NULL;
    }
    return sg__grad_view(t, sg__tensor_view(t, "sg_view", ndim, sh, st, t->offset),
                         SG__VIEW_RESHAPE, NULL);
}

sg_tensor *sg_reshape(sg_tensor *t, int ndim, const int64_t *shape) {
    sg_ctx *ctx = sg__check_inputs("sg_reshape", 1, &t, NULL);
    if (!ctx) return NULL;
    int64_t sh[SG_MAX_DIMS], st[SG_MAX_DIMS];
    if (!infer_shape(ctx, "sg_reshape", t, ndim, shape, sh)) return NULL;
    if (view_strides(t, ndim, sh, st))
        return sg__grad_view(t, sg__tensor_view(t, "sg_reshape", ndim, sh, st, t->offset),
                             SG__VIEW_RESHAPE, NULL);
    sg_tensor *c = sg_clone(t);
    if (!c) return NULL;
    view_strides(c, ndim, sh, st);
    sg_tensor *v = sg__grad_view(c, sg__tensor_view(c, "sg_reshape", ndim, sh, st, 0),
                                 SG__VIEW_RESHAPE, NULL);
    sg__tensor_drop(c);
    return v;
}

sg_tensor *sg_permute(sg_tensor *t, const int *dims) {
    sg_ctx *ctx = sg__check_inputs("sg_permute", 1, &t, NULL);
    if (!ctx) return NULL;
    if (!dims && t->ndim > 0) {
        sg__fail(ctx, SG_ERR_NULL, "sg_permute: dims is NULL; pass a permutation of %d dims",
                 t->ndim);
        return NULL;
    }
    int64_t sh[SG_MAX_DIMS], st[SG_MAX_DIMS], perm[SG_MAX_DIMS];
    bool seen[SG_MAX_DIMS] = {false};
    for (int d = 0; d < t->ndim; d++) {
        int s = sg__norm_dim(dims[d], t->ndim);
        if (s < 0 || seen[s]) {
            sg__fail(ctx, SG_ERR_INDEX, "sg_permute: dims is not a permutation of the %d dims "
                     "(entry %d is %d)", t->ndim, d, dims[d]);
            return NULL;
        }
        seen[s] = true;
        perm[d] = s;
        sh[d] = t->shape[s];
        st[d] = t->stride[s];
    }
    return sg__grad_view(t, sg__tensor_view(t, "sg_permute", t->ndim, sh, st, t->offset),
                         SG__VIEW_PERMUTE, perm);
}

sg_tensor *sg_transpose(sg_tensor *t, int dim0, int dim1) {
    sg_ctx *ctx = sg__check_inputs("sg_transpose", 1, &t, NULL);
    if (!ctx) return NULL;
    int a = sg__norm_dim(dim0, t->ndim), b = sg__norm_dim(dim1, t->ndim);
    if (a < 0 || b < 0) {
        sg__fail(ctx, SG_ERR_INDEX, "sg_transpose: dims %d and %d are not both in range for a "
                 "%d-d tensor", dim0, dim1, t->ndim);
        return NULL;
    }
    int perm[SG_MAX_DIMS];
    for (int d = 0; d < t->ndim; d++) perm[d] = d;
    perm[a] = b;
    perm[b] = a;
    return sg_permute(t, perm);
}

sg_tensor *sg_slice(sg_tensor *t, int dim, int64_t start, int64_t end, int64_t step) {
    sg_ctx *ctx = sg__check_inputs("sg_slice", 1, &t, NULL);
    if (!ctx) return NULL;
    int d = sg__norm_dim(dim, t->ndim);
    if (d < 0) {
        sg__fail(ctx, SG_ERR_INDEX, "sg_slice: dim %d is out of range for a %d-d tensor", dim,
                 t->ndim);
        return NULL;
    }
    if (step < 1) {
        sg__fail(ctx, SG_ERR_INVALID_ARG, "sg_slice: step %lld must be >= 1", (long long)step);
        return NULL;
    }
    int64_t n = t->shape[d];
    if (start < 0) start += n;
    if (end < 0) end += n;
    start = start < 0 ? 0 : start > n ? n : start;
    end = end < start ? start : end > n ? n : end;
    int64_t sh[SG_MAX_DIMS], st[SG_MAX_DIMS];
    memcpy(sh, t->shape, sizeof sh);
    memcpy(st, t->stride, sizeof st);
    /* Written so that a huge step cannot overflow; a dim of size <= 1 keeps its
     * stride, and a larger one has step <= size, so the product stays in range. */
    sh[d] = end > start ? (end - start - 1) / step + 1 : 0;
    st[d] = sh[d] > 1 ? t->stride[d] * step : t->stride[d];
    int64_t info[3] = {d, start, step};
    return sg__grad_view(
        t, sg__tensor_view(t, "sg_slice", t->ndim, sh, st, t->offset + start * t->stride[d]),
        SG__VIEW_SLICE, info);
}

sg_tensor *sg_narrow(sg_tensor *t, int dim, int64_t start, int64_t length) {
    sg_ctx *ctx = sg__check_inputs("sg_narrow", 1, &t, NULL);
    if (!ctx) return NULL;
    int d = sg__norm_dim(dim, t->ndim);
    if (d < 0) {
        sg__fail(ctx, SG_ERR_INDEX,
                 "sg_narrow: dim %d is out of range for a %d-d tensor; dims run "
                 "from %d to %d",
                 dim, t->ndim, -t->ndim, t->ndim - 1);
        return NULL;
    }
    if (start < 0 || length < 0 || length > t->shape[d] - start) {
        sg__fail(ctx, SG_ERR_INDEX,
                 "sg_narrow: dim %d, start %lld, length %lld do not fit a "
                 "%d-d tensor whose dim has size %lld",
                 dim, (long long)start, (long long)length, t->ndim, (long long)t->shape[d]);
        return NULL;
    }
    return sg_slice(t, d, start, start + length, 1);
}

sg_tensor *sg_expand(sg_tensor *t, int ndim, const int64_t *shape) {
    sg_ctx *ctx = sg__check_inputs("sg_expand", 1, &t, NULL);
    if (!ctx) return NULL;
    char a[SG__DESC], b[96];
    if (ndim > 0 && !shape) {
        sg__fail(ctx, SG_ERR_NULL, "sg_expand: shape is NULL for ndim %d; pass ndim sizes", ndim);
        return NULL;
    }
    if (ndim < t->ndim || ndim > SG_MAX_DIMS) {
        sg__fail(ctx, SG_ERR_SHAPE, "sg_expand: cannot expand %s to %d dims; the target needs "
                 "at least as many dims (at most %d)", sg__describe(t, a, sizeof a), ndim,
                 SG_MAX_DIMS);
        return NULL;
    }
    int64_t sh[SG_MAX_DIMS], st[SG_MAX_DIMS];
    for (int d = 0; d < ndim; d++) {
        int s = d - (ndim - t->ndim);
        int64_t have = s < 0 ? 1 : t->shape[s];
        int64_t want = shape[d] == -1 && s >= 0 ? have : shape[d];
        if (want < 0 || (have != want && have != 1)) {
            sg__fail(ctx, SG_ERR_SHAPE, "sg_expand: %s cannot expand to %s (dim %d: %lld to "
                     "%lld); only size-1 dims stretch", sg__describe(t, a, sizeof a),
                     sg__shape_str(ndim, shape, b, sizeof b), d, (long long)have,
                     (long long)shape[d]);
            return NULL;
        }
        sh[d] = want;
        st[d] = s < 0 || (have == 1 && want != 1) ? 0 : t->stride[s];
    }
    if (checked_numel(ndim, sh) < 0) {
        sg__fail(ctx, SG_ERR_SHAPE, "sg_expand: %s would have more than 2^63 elements; "
                 "use smaller sizes", sg__shape_str(ndim, sh, b, sizeof b));
        return NULL;
    }
    return sg__grad_view(t, sg__tensor_view(t, "sg_expand", ndim, sh, st, t->offset),
                         SG__VIEW_EXPAND, NULL);
}

sg_tensor *sg_unsqueeze(sg_tensor *t, int dim) {
    sg_ctx *ctx = sg__check_inputs("sg_unsqueeze", 1, &t, NULL);
    if (!ctx) return NULL;
    int d = sg__norm_dim(dim, t->ndim + 1);
    if (t->ndim == SG_MAX_DIMS) {
        sg__fail(ctx, SG_ERR_INDEX, "sg_unsqueeze: a %d-d tensor has no room for another dim "
                 "(at most %d); reshape it first", t->ndim, SG_MAX_DIMS);
        return NULL;
    }
    if (d < 0) {
        sg__fail(ctx, SG_ERR_INDEX, "sg_unsqueeze: dim %d is out of range for a %d-d tensor "
                 "(-%d to %d)", dim, t->ndim, t->ndim + 1, t->ndim);
        return NULL;
    }
    int64_t sh[SG_MAX_DIMS], st[SG_MAX_DIMS];
    for (int i = 0, j = 0; i <= t->ndim; i++) {
        if (i == d) {
            sh[i] = 1;
            st[i] = j < t->ndim ? t->stride[j] * t->shape[j] : 1;
        } else {
            sh[i] = t->shape[j];
            st[i] = t->stride[j];
            j++;
        }
    }
    return sg__grad_view(t, sg__tensor_view(t, "sg_unsqueeze", t->ndim + 1, sh, st, t->offset),
                         SG__VIEW_RESHAPE, NULL);
}

sg_tensor *sg_squeeze(sg_tensor *t, int dim) {
    sg_ctx *ctx = sg__check_inputs("sg_squeeze", 1, &t, NULL);
    if (!ctx) return NULL;
    int d = sg__norm_dim(dim, t->ndim);
    if (d < 0 || t->shape[d] != 1) {
        sg__fail(ctx, d < 0 ? SG_ERR_INDEX : SG_ERR_SHAPE, "sg_squeeze: dim %d of a %d-d tensor "
                 "is out of range or not of size 1", dim, t->ndim);
        return NULL;
    }
    int64_t sh[SG_MAX_DIMS], st[SG_MAX_DIMS];
    for (int i = 0, j = 0; i < t->ndim; i++)
        if (i != d) {
            sh[j] = t->shape[i];
            st[j] = t->stride[i];
            j++;
        }
    return sg__grad_view(t, sg__tensor_view(t, "sg_squeeze", t->ndim - 1, sh, st, t->offset),
                         SG__VIEW_RESHAPE, NULL);
}

sg_tensor *sg_clone(sg_tensor *t) {
    sg_ctx *ctx = sg__check_inputs("sg_clone", 1, &t, NULL);
    if (!ctx) return NULL;
    sg_tensor *in[1] = {t};
    sg__node n = {.op = SG__OP_COPY, .nin = 1, .in = in};
    return sg__run_new(ctx, &n, t->dtype, t->ndim, t->shape);
}

sg_tensor *sg_contiguous(sg_tensor *t) {
    sg_ctx *ctx = sg__check_inputs("sg_contiguous", 1, &t, NULL);
    if (!ctx) return NULL;
    if (sg__is_contiguous(t))
        return sg__grad_view(
            t, sg__tensor_view(t, "sg_contiguous", t->ndim, t->shape, t->stride, t->offset),
            SG__VIEW_RESHAPE, NULL);
    return sg_clone(t);
}
