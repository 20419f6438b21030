/* SPDX-License-Identifier: MIT */
/*
 * cpu.c -- the CPU backend's executor: host memory for tensor storage
 * through the context's allocator hook, host transfer as memcpy, the row
 * iterator and tile gathers the kernels share, and the dispatch of a node to
 * its kernel family.
 */
#include "cpu.h"

#include "../comm.h"

#include <stdlib.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* ------------------------------------------------------------ tiles */

void sg__gather_f(const void *p, sg_dtype dt, int64_t s, int n, float *out) {
    if (dt == SG_F32 && s == 1) {
        memcpy(out, p, (size_t)n * sizeof(float));
        return;
    }
    if (dt == SG_BF16 && s == 1) { /* exact: the high half of the float's bits, in vectors */
        const uint16_t *h = p;
        for (int i = 0; i < n; i++) {
            uint32_t b = (uint32_t)h[i] << 16;
            memcpy(&out[i], &b, sizeof b);
        }
        return;
    }
    if (dt == SG_F16 && s == 1) {
        const uint16_t *h = p;
        for (int i = 0; i < n; i++) out[i] = sg__h2f_sel(h[i]);
        return;
    }
    for (int i = 0; i < n; i++) out[i] = sg__ldf(p, dt, i * s);
}

void sg__gather_i(const void *p, sg_dtype dt, int64_t s, int n, int64_t *out) {
    for (int i = 0; i < n; i++) out[i] = sg__ldi(p, dt, i * s);
}

void sg__scatter_f(void *p, sg_dtype dt, int64_t s, int n, const float *in) {
    if (dt == SG_F32 && s == 1) {
        memcpy(p, in, (size_t)n * sizeof(float));
        return;
    }
    for (int i = 0; i < n; i++) sg__stf(p, dt, i * s, in[i]);
}

void sg__scatter_i(void *p, sg_dtype dt, int64_t s, int n, const int64_t *in) {
    for (int i = 0; i < n; i++) sg__sti(p, dt, i * s, in[i]);
}

/* ------------------------------------------------------------ rows */

void sg__rows_init(sg__rows *r, int ndim, const int64_t *shape, int nops) {
    memset(r, 0, sizeof *r);
    r->ndim = ndim;
    r->nops = nops;
    for (int d = 0; d < ndim; d++) r->shape[d] = shape[d];
    r->rowlen = ndim ? shape[ndim - 1] : 1;
    r->nrows = 1;
    for (int d = 0; d + 1 < ndim; d++) r->nrows *= shape[d];
}

void sg__rows_offsets(const sg__rows *r, int64_t row, int64_t *off) {
    for (int k = 0; k < r->nops; k++) off[k] = 0;
    for (int d = r->ndim - 2; d >= 0; d--) {
        int64_t i = row % r->shape[d];
        row /= r->shape[d];
        for (int k = 0; k < r->nops; k++) off[k] += i * r->stride[k][d];
    }
}

int sg__cpu_threads(const sg_ctx *ctx, int64_t work) {
#ifdef _OPENMP
    /* Below ~32k elements the fork costs more than the work. */
    if (work < 32768) return 1;
    int max = ctx->num_threads > 0 ? ctx->num_threads : omp_get_max_threads();
    int64_t useful = work / 16384;
    return useful < max ? (int)(useful < 1 ? 1 : useful) : max;
#else
    (void)ctx, (void)work;
    return 1;
#endif
}

/* ------------------------------------------------------------ executor */

static sg_status cpu_run(sg_ctx *ctx, const sg__node *n) {
    switch (sg__op_family(n->op)) {
    case SG__FAM_POINTWISE: return sg__cpu_pointwise(ctx, n);
    case SG__FAM_REDUCE: return sg__cpu_reduce(ctx, n);
    case SG__FAM_ROW: return sg__cpu_row(ctx, n);
    case SG__FAM_MATMUL: return sg__cpu_matmul(ctx, n);
    case SG__FAM_DATA: return sg__cpu_data(ctx, n);
    case SG__FAM_ATTN: return sg__cpu_attn(ctx, n);
    case SG__FAM_COMM: return sg__comm_run(ctx, n);
    }
    return sg__fail(ctx, SG_ERR_INTERNAL, "cpu: op %s has no kernel family", sg__op_name(n->op));
}

/* Tensor bytes are 64-byte aligned for vector loads; the hook sees the padded size. */
#define ALIGN 64

static sg_status cpu_alloc(sg_ctx *ctx, size_t nbytes, void **data) {
    size_t total = nbytes + ALIGN + sizeof(size_t);
    char *raw = sg__alloc(ctx, total);
    if (!raw) return SG_ERR_OOM;
    uintptr_t p = ((uintptr_t)raw + sizeof(size_t) + ALIGN - 1) & ~(uintptr_t)(ALIGN - 1);
    ((size_t *)p)[-1] = (size_t)(p - (uintptr_t)raw);
    *data = (void *)p;
    return SG_OK;
}

static void cpu_free(sg_ctx *ctx, void *data, size_t nbytes) {
    if (!data) return;
    size_t shift = ((size_t *)data)[-1];
    sg__free(ctx, (char *)data - shift, nbytes + ALIGN + sizeof(size_t));
}

static sg_status cpu_copy(sg_ctx *ctx, void *dst, const void *src, size_t nbytes) {
    (void)ctx;
    memmove(dst, src, nbytes);
    return SG_OK;
}

sg_status sg__cpu_init(sg_ctx *ctx) {
    ctx->exec.name = "host";
    ctx->exec.run = cpu_run;
    ctx->exec.alloc = cpu_alloc;
    ctx->exec.free = cpu_free;
    ctx->exec.upload = cpu_copy;
    ctx->exec.copy = cpu_copy;
    ctx->exec.download = cpu_copy;
    ctx->exec.destroy = NULL;
    ctx->exec.state = NULL;
    ctx->gops = &sg__cpu_graph_ops;
    return SG_OK;
}
