/* SPDX-License-Identifier: MIT */
/*
 * cpu_data.c -- the eager CPU kernels of the data family: embedding,
 * index_select, index_copy (in place), concat and arange. They move
 * elements without converting them, so they work on raw element bytes of
 * any dtype: rows of the output (its last dim) are copied with memcpy where
 * both sides are contiguous and with a typed strided loop elsewhere.
 *
 * Index tensors are read whole into an int64 array and checked before
 * anything is written, so a bad index fails the call with SG_ERR_INDEX and
 * leaves every tensor as it was. (A device backend cannot check on the host
 * without a sync; it will check in the kernel and report afterwards, so
 * there a bad index may leave a partial write.)
 */
#include "cpu.h"

#include <stdio.h>

/* ------------------------------------------------------------ element rows */

/* Copy n elements of es bytes from s (stride ss) to d (stride ds). */
static void copy_row(char *d, int64_t ds, const char *s, int64_t ss, int64_t n, size_t es) {
    if ((ds == 1 && ss == 1) || n == 1) {
        memcpy(d, s, (size_t)n * es);
        return;
    }
#define COPY(T)                                                                                   \
    for (int64_t i = 0; i < n; i++) ((T *)d)[i * ds] = ((const T *)s)[i * ss];                    \
    break
    switch (es) {
    case 1: COPY(uint8_t);
    case 2: COPY(uint16_t);
    case 4: COPY(uint32_t);
    default: COPY(uint64_t);
    }
#undef COPY
}

/* d[j] = s[idx[j]] for j < n (strides ds, ss). */
static void gather_row(char *d, int64_t ds, const char *s, int64_t ss, const int64_t *idx,
                       int64_t n, size_t es) {
#define GATHER(T)                                                                                 \
    for (int64_t j = 0; j < n; j++) ((T *)d)[j * ds] = ((const T *)s)[idx[j] * ss];               \
    break
    switch (es) {
    case 1: GATHER(uint8_t);
    case 2: GATHER(uint16_t);
    case 4: GATHER(uint32_t);
    default: GATHER(uint64_t);
    }
#undef GATHER
}

/* d[idx[i]] = s[i] for the i < n with keep[i] (strides ds, ss). */
static void scatter_row(char *d, int64_t ds, const char *s, int64_t ss, const int64_t *idx,
                        const uint8_t *keep, int64_t n, size_t es) {
#define SCATTER(T)                                                                                \
    for (int64_t i = 0; i < n; i++)                                                               \
        if (keep[i]) ((T *)d)[idx[i] * ds] = ((const T *)s)[i * ss];                              \
    break
    switch (es) {
    case 1: SCATTER(uint8_t);
    case 2: SCATTER(uint16_t);
    case 4: SCATTER(uint32_t);
    default: SCATTER(uint64_t);
    }
#undef SCATTER
}

/* The coordinates of row `row` over dims 0..nd-2 of shape, row-major. */
static void row_coords(int nd, const int64_t *shape, int64_t row, int64_t *coord) {
    for (int d = nd - 2; d >= 0; d--) {
        coord[d] = row % shape[d];
        row /= shape[d];
    }
}

static char *bytes_at(const sg_tensor *t, int64_t off) {
    return (char *)sg__data(t) + off * (int64_t)sg_dtype_size(t->dtype);
}

/* ------------------------------------------------------------ indices */

/*
 * Read idx (any shape, i32/i64) into *out as int64 in row-major order and
 * check every entry is in [0, limit). On failure *out is NULL and the
 * message names the op, the entry, and what it indexes (`what`).
 */
static sg_status read_indices(sg_ctx *ctx, const char *op, const sg_tensor *idx, int64_t limit,
                              const char *what, int64_t **out) {
    *out = NULL;
    int64_t n = sg__numel(idx->ndim, idx->shape);
    int64_t *v = sg__alloc(ctx, (size_t)n * sizeof(int64_t));
    if (!v)
        return sg__fail(ctx, SG_ERR_OOM, "%s: out of host memory for %lld indices", op,
                        (long long)n);
    sg__rows r;
    sg__rows_init(&r, idx->ndim, idx->shape, 1);
    for (int d = 0; d < idx->ndim; d++) r.stride[0][d] = idx->stride[d];
    int64_t inner = idx->ndim ? idx->stride[idx->ndim - 1] : 0;
    for (int64_t row = 0; n > 0 && row < r.nrows; row++) {
        int64_t off[SG__MAX_OPS];
        sg__rows_offsets(&r, row, off);
        const char *p = bytes_at(idx, off[0]);
        int64_t *dst = v + row * r.rowlen;
        for (int64_t c = 0; c < r.rowlen; c++)
            dst[c] = idx->dtype == SG_I32 ? ((const int32_t *)p)[c * inner]
                                          : ((const int64_t *)p)[c * inner];
    }
    for (int64_t i = 0; i < n; i++)
        if (v[i] < 0 || v[i] >= limit) {
            char d[SG__DESC];
            sg__fail(ctx, SG_ERR_INDEX, "%s: idx %s holds %lld at position %lld, out of range for "
                     "%s of size %lld; indices must be in [0, %lld)", op,
                     sg__describe(idx, d, sizeof d), (long long)v[i], (long long)i, what,
                     (long long)limit, (long long)limit);
            sg__free(ctx, v, (size_t)n * sizeof(int64_t));
            return SG_ERR_INDEX;
        }
    *out = v;
    return SG_OK;
}

static void free_indices(sg_ctx *ctx, const sg_tensor *idx, int64_t *v) {
    if (v) sg__free(ctx, v, (size_t)sg__numel(idx->ndim, idx->shape) * sizeof(int64_t));
}

/* ------------------------------------------------------------ kernels */

/* out (idx..., D): row i of out is row idx[i] of weight (V, D). */
static sg_status embedding(sg_ctx *ctx, const sg__node *n) {
    const sg_tensor *w = n->in[0], *idx = n->in[1], *out = n->out;
    int64_t *iv;
    sg_status s = read_indices(ctx, "sg_embedding", idx, w->shape[0], "dim 0 of weight", &iv);
    if (s != SG_OK) return s;
    int nd = out->ndim;
    int64_t D = out->shape[nd - 1], rows = sg__numel(idx->ndim, idx->shape);
    size_t es = sg_dtype_size(out->dtype);
    int nth = sg__cpu_threads(ctx, rows * D);
#pragma omp parallel for num_threads(nth) if (nth > 1) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        int64_t coord[SG_MAX_DIMS] = {0}, off = 0;
        row_coords(nd, out->shape, r, coord);
        for (int k = 0; k + 1 < nd; k++) off += coord[k] * out->stride[k];
        copy_row(bytes_at(out, off), out->stride[nd - 1], bytes_at(w, iv[r] * w->stride[0]),
                 w->stride[1], D, es);
    }
    free_indices(ctx, idx, iv);
    return SG_OK;
}

/* out = x with dim's entries picked by idx: out[.., j, ..] = x[.., idx[j], ..]. */
static sg_status index_select(sg_ctx *ctx, const sg__node *n) {
    const sg_tensor *x = n->in[0], *idx = n->in[1], *out = n->out;
    int dim = (int)n->i[0], nd = out->ndim;
    char what[64];
    snprintf(what, sizeof what, "dim %d of x", dim);
    int64_t *iv;
    sg_status s = read_indices(ctx, "sg_index_select", idx, x->shape[dim], what, &iv);
    if (s != SG_OK) return s;
    int64_t rows = 1, len = out->shape[nd - 1];
    for (int k = 0; k + 1 < nd; k++) rows *= out->shape[k];
    size_t es = sg_dtype_size(out->dtype);
    int nth = sg__cpu_threads(ctx, sg__numel(nd, out->shape));
#pragma omp parallel for num_threads(nth) if (nth > 1) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        int64_t coord[SG_MAX_DIMS] = {0}, xo = 0, oo = 0;
        row_coords(nd, out->shape, r, coord);
        for (int k = 0; k + 1 < nd; k++) {
            oo += coord[k] * out->stride[k];
            xo += (k == dim ? iv[coord[k]] : coord[k]) * x->stride[k];
        }
        if (dim == nd - 1)
            gather_row(bytes_at(out, oo), out->stride[nd - 1], bytes_at(x, xo), x->stride[nd - 1],
                       iv, len, es);
        else
            copy_row(bytes_at(out, oo), out->stride[nd - 1], bytes_at(x, xo), x->stride[nd - 1],
                     len, es);
    }
    free_indices(ctx, idx, iv);
    return SG_OK;
}

/*
 * dst[.., idx[i], ..] = src[.., i, ..]. Of entries that repeat an index only
 * the last is copied (last write wins, as a sequential loop would have it),
 * which also keeps the parallel rows from writing one element twice.
 */
static sg_status index_copy(sg_ctx *ctx, const sg__node *n) {
    const sg_tensor *dst = n->out, *idx = n->in[1], *src = n->in[2];
    int dim = (int)n->i[0], nd = dst->ndim;
    char what[64];
    snprintf(what, sizeof what, "dim %d of dst", dim);
    int64_t *iv, L = src->shape[dim], size = dst->shape[dim];
    sg_status s = read_indices(ctx, "sg_index_copy_", idx, size, what, &iv);
    if (s != SG_OK) return s;
    size_t lbytes = (size_t)size * sizeof(int64_t), kbytes = (size_t)L;
    int64_t *last = sg__alloc(ctx, lbytes);
    uint8_t *keep = sg__alloc(ctx, kbytes);
    if (!last || !keep) {
        s = sg__fail(ctx, SG_ERR_OOM, "sg_index_copy_: out of host memory for %lld index marks",
                     (long long)size);
        goto done;
    }
    for (int64_t i = 0; i < L; i++) last[iv[i]] = i;
    for (int64_t i = 0; i < L; i++) keep[i] = last[iv[i]] == i;
    int64_t rows = 1, len = src->shape[nd - 1];
    for (int k = 0; k + 1 < nd; k++) rows *= src->shape[k];
    size_t es = sg_dtype_size(dst->dtype);
    int nth = sg__cpu_threads(ctx, sg__numel(nd, src->shape));
#pragma omp parallel for num_threads(nth) if (nth > 1) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        int64_t coord[SG_MAX_DIMS] = {0}, so = 0, dof = 0;
        row_coords(nd, src->shape, r, coord);
        if (dim < nd - 1 && !keep[coord[dim]]) continue;
        for (int k = 0; k + 1 < nd; k++) {
            so += coord[k] * src->stride[k];
            dof += (k == dim ? iv[coord[k]] : coord[k]) * dst->stride[k];
        }
        if (dim == nd - 1)
            scatter_row(bytes_at(dst, dof), dst->stride[nd - 1], bytes_at(src, so),
                        src->stride[nd - 1], iv, keep, len, es);
        else
            copy_row(bytes_at(dst, dof), dst->stride[nd - 1], bytes_at(src, so),
                     src->stride[nd - 1], len, es);
    }
done:
    sg__free(ctx, last, last ? lbytes : 0);
    sg__free(ctx, keep, keep ? kbytes : 0);
    free_indices(ctx, idx, iv);
    return s;
}

/*
 * dst[.., idx[j], ..] += src[.., j, ..]. The positions are put in (index, j)
 * order first (a counting sort over dim); each lane (a position of src off
 * dim) then adds every run of one index to dst's element in f32, in
 * position order, and stores it once, as CUDA's runs do (k_data.cu): f32
 * gives the sequential loop's bits, and an f16 or bf16 table (an
 * embedding's gradient, a token repeated thousands of times) rounds once,
 * not after each row. The result does not depend on the thread count.
 */
static sg_status index_add(sg_ctx *ctx, const sg__node *n) {
    const sg_tensor *dst = n->out, *idx = n->in[1], *src = n->in[2];
    int dim = (int)n->i[0], nd = dst->ndim;
    char what[64];
    snprintf(what, sizeof what, "dim %d of dst", dim);
    int64_t *iv, L = src->shape[dim], V = dst->shape[dim];
    sg_status s = read_indices(ctx, "index_add", idx, V, what, &iv);
    if (s != SG_OK) return s;
    int64_t *start = NULL, *pos = NULL, *runs = NULL, nruns = 0;
    if (L > 0) { /* runs[r]: the index of run r, start[v] .. start[v + 1] its positions */
        start = sg__alloc(ctx, sizeof(int64_t) * (size_t)(V + 1));
        pos = sg__alloc(ctx, sizeof(int64_t) * (size_t)L);
        runs = sg__alloc(ctx, sizeof(int64_t) * (size_t)L);
        if (!start || !pos || !runs) {
            s = sg__fail(ctx, SG_ERR_OOM,
                         "index_add: out of host memory for the order of %lld "
                         "positions; free memory or add fewer rows at once",
                         (long long)L);
            goto done;
        }
        memset(start, 0, sizeof(int64_t) * (size_t)(V + 1));
        for (int64_t j = 0; j < L; j++) start[iv[j] + 1]++;
        for (int64_t v = 0; v < V; v++) {
            if (start[v + 1]) runs[nruns++] = v;
            start[v + 1] += start[v];
        }
        for (int64_t j = 0; j < L; j++) pos[start[iv[j]]++] = j; /* start[v] ends at v + 1's */
        for (int64_t v = V; v > 0; v--) start[v] = start[v - 1];
        start[0] = 0;
    }
    int64_t lanes = L ? sg__numel(nd, src->shape) / L : 0;
    int64_t sh[SG_MAX_DIMS], sst[SG_MAX_DIMS], dst_st[SG_MAX_DIMS];
    int m = 0;
    for (int k = 0; k < nd; k++)
        if (k != dim) {
            sh[m] = src->shape[k];
            sst[m] = src->stride[k];
            dst_st[m] = dst->stride[k];
            m++;
        }
    void *dp = sg__data(dst);
    const void *sp = sg__data(src);
    int64_t ds = dst->stride[dim], ss = src->stride[dim];
    int nth = sg__cpu_threads(ctx, sg__numel(nd, src->shape));
#pragma omp parallel for num_threads(nth) if (nth > 1) schedule(static)
    for (int64_t r = 0; r < lanes; r++) {
        int64_t rem = r, so = 0, dof = 0;
        for (int k = m - 1; k >= 0; k--) {
            int64_t c = rem % sh[k];
            rem /= sh[k];
            so += c * sst[k];
            dof += c * dst_st[k];
        }
        for (int64_t u = 0; u < nruns; u++) {
            int64_t v = runs[u], at = dof + v * ds;
            float acc = sg__ldf(dp, dst->dtype, at);
            for (int64_t k = start[v]; k < start[v + 1]; k++)
                acc += sg__ldf(sp, src->dtype, so + pos[k] * ss);
            sg__stf(dp, dst->dtype, at, acc);
        }
    }
done:
    if (start) sg__free(ctx, start, sizeof(int64_t) * (size_t)(V + 1));
    if (pos) sg__free(ctx, pos, sizeof(int64_t) * (size_t)L);
    if (runs) sg__free(ctx, runs, sizeof(int64_t) * (size_t)L);
    free_indices(ctx, idx, iv);
    return s;
}

/* Each input lands in out at its running offset along dim. */
static sg_status concat(sg_ctx *ctx, const sg__node *n) {
    const sg_tensor *out = n->out;
    int dim = (int)n->i[0], nd = out->ndim;
    size_t es = sg_dtype_size(out->dtype);
    int64_t start = 0;
    for (int t = 0; t < n->nin; t++) {
        const sg_tensor *in = n->in[t];
        int64_t numel = sg__numel(nd, in->shape), len = in->shape[nd - 1];
        int64_t base = start * out->stride[dim];
        start += in->shape[dim];
        if (numel == 0) continue;
        int64_t rows = numel / len;
        int nth = sg__cpu_threads(ctx, numel);
#pragma omp parallel for num_threads(nth) if (nth > 1) schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            int64_t coord[SG_MAX_DIMS] = {0}, io = 0, oo = base;
            row_coords(nd, in->shape, r, coord);
            for (int k = 0; k + 1 < nd; k++) {
                io += coord[k] * in->stride[k];
                oo += coord[k] * out->stride[k];
            }
            copy_row(bytes_at(out, oo), out->stride[nd - 1], bytes_at(in, io), in->stride[nd - 1],
                     len, es);
        }
    }
    return SG_OK;
}

/* out[i] = start + i * step, in double, then stored in out's dtype (ints:
 * truncated toward zero; the front-end checked the range fits). */
static sg_status arange(sg_ctx *ctx, const sg__node *n) {
    (void)ctx;
    const sg_tensor *out = n->out;
    double start = n->f[0], step = n->f[1];
    int64_t len = out->shape[0], st = out->stride[0];
    void *p = sg__data(out);
#define AT(i) (start + (double)(i) * step)
    switch (out->dtype) {
    case SG_F32:
        for (int64_t i = 0; i < len; i++) ((float *)p)[i * st] = (float)AT(i);
        break;
    case SG_F16:
    case SG_BF16:
        for (int64_t i = 0; i < len; i++) sg__stf(p, out->dtype, i * st, (float)AT(i));
        break;
    case SG_I32:
        for (int64_t i = 0; i < len; i++) ((int32_t *)p)[i * st] = (int32_t)AT(i);
        break;
    case SG_I64:
        for (int64_t i = 0; i < len; i++) ((int64_t *)p)[i * st] = (int64_t)AT(i);
        break;
    case SG_BOOL: SG_ASSERT(!"arange of bool"); break;
    }
#undef AT
    return SG_OK;
}

/* out[c] = x[c with coordinate idx[c] at dim] (torch.gather); idx and out
 * share a shape. */
static sg_status gather(sg_ctx *ctx, const sg__node *n) {
    const sg_tensor *x = n->in[0], *idx = n->in[1], *out = n->out;
    int dim = (int)n->i[0], nd = out->ndim;
    char what[64];
    snprintf(what, sizeof what, "dim %d of x", dim);
    int64_t *iv;
    sg_status s = read_indices(ctx, "sg_gather", idx, x->shape[dim], what, &iv);
    if (s != SG_OK) return s;
    int64_t total = sg__numel(nd, out->shape), len = nd ? out->shape[nd - 1] : 1;
    int64_t rows = len ? total / len : 0;
    size_t es = sg_dtype_size(out->dtype);
    int nth = sg__cpu_threads(ctx, total);
#pragma omp parallel for num_threads(nth) if (nth > 1) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        int64_t coord[SG_MAX_DIMS] = {0}, xo = 0, oo = 0;
        if (nd) row_coords(nd, out->shape, r, coord);
        for (int k = 0; k + 1 < nd; k++) {
            oo += coord[k] * out->stride[k];
            if (k != dim) xo += coord[k] * x->stride[k];
        }
        for (int64_t c = 0; c < len; c++) {
            int64_t xi = xo + iv[r * len + c] * (nd ? x->stride[dim] : 0);
            if (nd && dim != nd - 1) xi += c * x->stride[nd - 1];
            copy_row(bytes_at(out, oo + c * (nd ? out->stride[nd - 1] : 0)), 1, bytes_at(x, xi),
                     1, 1, es);
        }
    }
    free_indices(ctx, idx, iv);
    return SG_OK;
}

sg_status sg__cpu_data(sg_ctx *ctx, const sg__node *n) {
    switch (n->op) {
    case SG__OP_EMBEDDING: return embedding(ctx, n);
    case SG__OP_INDEX_SELECT: return index_select(ctx, n);
    case SG__OP_INDEX_COPY: return index_copy(ctx, n);
    case SG__OP_INDEX_ADD: return index_add(ctx, n);
    case SG__OP_CONCAT: return concat(ctx, n);
    case SG__OP_ARANGE: return arange(ctx, n);
    case SG__OP_RAND: return sg__cpu_rand(ctx, n);
    case SG__OP_TOPK: return sg__cpu_topk(ctx, n);
    case SG__OP_GATHER: return gather(ctx, n);
    case SG__OP_SAMPLE: return sg__cpu_sample(ctx, n);
    default: break;
    }
    return sg__fail(ctx, SG_ERR_INTERNAL, "cpu: %s is not a data-family op", sg__op_name(n->op));
}
