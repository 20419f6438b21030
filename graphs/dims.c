/* SPDX-License-Identifier: MIT */
/*
 * dims.c -- index spaces that every backend's kernels walk the same way.
 */
#include "backend.h"

void sg__reduce_dims(const sg_tensor *x, const sg_tensor *y, uint32_t mask, sg__rdims *r) {
    memset(r, 0, sizeof *r);
    r->M = r->L = 1;
    for (int d = 0; d < x->ndim; d++) {
        int64_t s = x->shape[d];
        if (mask & (1u << d)) {
            r->L *= s;
            if (s == 1) continue;
            /* Merge into the previous reduced dim when the two walk as one:
             * row-major positions stay the same, so argmax is unchanged. */
            if (r->nr && r->rxs[r->nr - 1] == s * x->stride[d]) {
                r->rsize[r->nr - 1] *= s;
                r->rxs[r->nr - 1] = x->stride[d];
            } else {
                r->rsize[r->nr] = s, r->rxs[r->nr] = x->stride[d], r->nr++;
            }
        } else {
            r->M *= s;
            if (s == 1) continue;
            r->ksize[r->nk] = s, r->kxs[r->nk] = x->stride[d], r->kys[r->nk] = y->stride[d];
            r->nk++;
        }
    }
    if (r->nr == 0) r->rsize[0] = 1, r->rxs[0] = 0, r->nr = 1;
}

void sg__mm_dims_of(const sg__node *n, sg__mm_dims *d) {
    const sg_tensor *a = n->in[0], *b = n->in[1], *out = n->out;
    int an = a->ndim, bn = b->ndim;
    d->a = an >= 2 ? (sg__mm_role){an - 2, an - 1, an - 2} : (sg__mm_role){-1, 0, 0};
    d->M = an >= 2 ? a->shape[an - 2] : 1;
    d->K = a->shape[an - 1];
    if (n->op == SG__OP_LINEAR) { /* b is w (N, K), read as its transpose */
        d->b = (sg__mm_role){1, 0, 0};
        d->N = b->shape[0];
        d->nb = an >= 2 ? an - 2 : 0;
        d->c =
            an >= 2 ? (sg__mm_role){out->ndim - 2, out->ndim - 1, d->nb} : (sg__mm_role){-1, 0, 0};
    } else {
        d->b = bn >= 2 ? (sg__mm_role){bn - 2, bn - 1, bn - 2} : (sg__mm_role){0, -1, 0};
        d->N = bn >= 2 ? b->shape[bn - 1] : 1;
        d->nb = out->ndim - (an >= 2) - (bn >= 2);
        d->c = (sg__mm_role){an >= 2 ? d->nb : -1, bn >= 2 ? out->ndim - 1 : -1, d->nb};
    }
    for (int i = 0; i < d->nb; i++) d->bshape[i] = out->shape[i];
}

int sg__coalesce_dims(int ndim, int64_t *shape, int nops, int64_t (*stride)[SG_MAX_DIMS]) {
    int nd = 0;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] == 1) continue;
        bool merge = nd > 0;
        for (int k = 0; merge && k < nops; k++)
            merge = stride[k][nd - 1] == stride[k][d] * shape[d];
        if (merge) {
            shape[nd - 1] *= shape[d];
            for (int k = 0; k < nops; k++) stride[k][nd - 1] = stride[k][d];
            continue;
        }
        shape[nd] = shape[d];
        for (int k = 0; k < nops; k++) stride[k][nd] = stride[k][d];
        nd++;
    }
    return nd;
}
