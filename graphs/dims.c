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
