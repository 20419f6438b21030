/* SPDX-License-Identifier: MIT */
/*
 * pad.c -- padded rows for a capture's wide matrices whose rows are not 16
 * bytes long: a language model's logits (rows of 50257 bf16) and their
 * gradient. cuBLASLt reads and writes only 16-byte aligned rows at full
 * speed, so such a product went through aligned scratch and copies
 * (graphs/cuda/cuda_matmul.c); with the buffer itself laid out with a
 * padded row stride (a strided view of a padded allocation), the product
 * reads and writes it in place.
 *
 * A buffer is padded only when every op that touches it takes any strides
 * (the matmuls, cross_entropy and its gradient, all library kernels), it
 * is no output of the step (what the user gets back keeps its contiguous
 * layout), and every view of it keeps rows whole (a view's strides are
 * rewritten: steps of whole rows become steps of padded rows). The pad
 * elements are never read or written.
 */
#include "memory.h"

#include <stdlib.h>
#include <string.h>

/* Rows shorter than this are not padded (the pad would be a large share). */
#define PAD_MIN_ROW 64
/* Nor matrices of fewer rows (batch-1 products run other kernels). */
#define PAD_MIN_ROWS 64

static bool takes_strides(sg__op op) {
    return op == SG__OP_MATMUL || op == SG__OP_LINEAR || op == SG__OP_CROSS_ENTROPY ||
           op == SG__OP_CROSS_ENTROPY_BWD;
}

static bool makes_rows(sg__op op) {
    return op == SG__OP_MATMUL || op == SG__OP_LINEAR || op == SG__OP_CROSS_ENTROPY_BWD;
}

/* The row length (elements) ref r of slot s has when it is the whole slot
 * written contiguously; 0 when it is not. */
static int64_t row_of(const sg__ref *r, const sg__slot *s) {
    if (r->ndim < 2 || r->offset != 0) return 0;
    int64_t n = 1;
    for (int d = r->ndim - 1; d >= 0; d--) {
        if (r->shape[d] > 1 && r->stride[d] != n) return 0;
        n *= r->shape[d];
    }
    return (size_t)n * sg_dtype_size(r->dtype) == s->nbytes ? r->shape[r->ndim - 1] : 0;
}

/* Whether ref r (of a slot whose rows are n long) keeps rows whole: every
 * stride steps whole rows, or stays within one row. */
static bool keeps_rows(const sg__ref *r, int64_t n) {
    if (r->offset < 0) return false;
    int64_t span = r->offset % n;
    for (int d = 0; d < r->ndim; d++) {
        if (r->shape[d] <= 1 || r->stride[d] % n == 0) continue;
        if (r->stride[d] < 0) return false;
        span += (r->shape[d] - 1) * r->stride[d];
    }
    return span < n;
}

static void repad(sg__ref *r, int64_t n, int64_t np) {
    for (int d = 0; d < r->ndim; d++)
        if (r->shape[d] > 1 && r->stride[d] % n == 0) r->stride[d] = r->stride[d] / n * np;
    r->offset = r->offset / n * np + r->offset % n;
}

/* Row length of slot s if it can be padded, else 0: one writer that makes
 * rows, only readers that take strides, every ref keeping rows whole. */
static int64_t pad_row(const sg__ir *ir, int s, const int *writer) {
    const sg__slot *sl = &ir->slots[s];
    if (sl->kind != SG__SLOT_INTERNAL || sl->output >= 0 || writer[s] < 0) return 0;
    const sg__irnode *w = &ir->nodes[writer[s]];
    const sg__ref *o = &ir->refs[w->out];
    int64_t n = makes_rows(w->op) ? row_of(o, sl) : 0;
    size_t es = sg_dtype_size(o->dtype);
    if (n < PAD_MIN_ROW || (size_t)n * es % 16 == 0 || sl->nbytes / es / (size_t)n < PAD_MIN_ROWS)
        return 0;
    for (int i = 0; i < ir->nnodes; i++) {
        const sg__irnode *nd = &ir->nodes[i];
        bool touches = ir->refs[nd->out].slot == s && i != writer[s];
        for (int j = 0; j < nd->nin; j++) {
            int a = ir->args[nd->args + j];
            touches = touches || (a >= 0 && ir->refs[a].slot == s);
        }
        if (touches && !takes_strides(nd->op)) return 0;
    }
    for (int r = 0; r < ir->nrefs; r++)
        if (ir->refs[r].slot == s && !keeps_rows(&ir->refs[r], n)) return 0;
    return n;
}

sg_status sg__pad_rows(sg_ctx *ctx, sg__ir *ir, int *npadded) {
    *npadded = 0;
    const char *e = getenv("SG_PAD_ROWS");
    if ((e && strcmp(e, "0") == 0) || ir->nslots == 0) return SG_OK;
    int *writer = sg__alloc(ctx, sizeof(int) * (size_t)ir->nslots);
    if (!writer) return sg__fail(ctx, SG_ERR_OOM, "compile: out of host memory padding rows");
    for (int s = 0; s < ir->nslots; s++) writer[s] = -1;
    for (int i = 0; i < ir->nnodes; i++) {
        int s = ir->refs[ir->nodes[i].out].slot;
        writer[s] = writer[s] == -1 ? i : -2; /* -2: more than one */
    }
    int padded = 0;
    for (int s = 0; s < ir->nslots; s++) {
        int64_t n = pad_row(ir, s, writer);
        if (n == 0) continue;
        sg__slot *sl = &ir->slots[s];
        size_t es = sg_dtype_size(ir->refs[ir->nodes[writer[s]].out].dtype);
        int64_t np = sg__pad_row_len(n, es), rows = (int64_t)(sl->nbytes / es / (size_t)n);
        for (int r = 0; r < ir->nrefs; r++)
            if (ir->refs[r].slot == s) repad(&ir->refs[r], n, np);
        sl->nbytes = (size_t)(rows * np) * es;
        padded++;
    }
    sg__free(ctx, writer, sizeof(int) * (size_t)ir->nslots);
    *npadded = padded;
    return SG_OK;
}
