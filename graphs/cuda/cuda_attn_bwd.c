/* SPDX-License-Identifier: MIT */
/*
 * cuda_attn_bwd.c -- the host side of ATTENTION_BWD on CUDA (kernels in
 * k_attn_bwd.cu): it describes the node's strided views and the packed
 * output's parts to the kernels and launches the two passes, query rows
 * first (they write each row's logsumexp -- the forward's, in[7], when it
 * kept them, else recomputed -- and rowsum(dO * O) into the output's
 * workspace), then keys; dq, dk and dv go where the node's
 * layout puts them (sg__attn_bwd_parts). bf16 / f16 with D = 64 or 128, no mask,
 * on sm_80+ run on tensor cores (sg_attn_bwd_dq<D>_<dtype>,
 * sg_attn_bwd_dkv<D>_<dtype>);
 * everything else -- f32, masks, other head dims up to 256 -- on the FMA
 * kernels (sg_attn_bwd_rows, sg_attn_bwd_keys), as does SG_ATTN_MMA=0.
 * No scratch: the workspace is part of the node's output, planned with it.
 */
#include "exec.h"

#ifdef SG_HAVE_CUDA_HEADERS

#include <stdio.h>
#include <stdlib.h>

#define NT 128

/* The same layout as struct bgeom in k_attn_bwd.cu. */
typedef struct bgeom {
    int64_t qs[4], ks[4], vs[4], ms[4], gs[4], os[4];
    int64_t B, Hq, Hkv, Lq, S, D;
    int64_t ls;
    int64_t nq, nkv, ws;
    int64_t part[3][4]; /* dq, dk, dv in the output: sg__attn_part's fields */
    float scale;
    int32_t dt, mdt, ldt, flags;
} bgeom;
_Static_assert(sizeof(bgeom) == 392, "bgeom changed: update k_attn_bwd.cu too");

enum { CAUSAL = 1, VQ = 2, VK = 4, VV = 8, VG = 16, VO = 32 }; /* k_attn_bwd.cu's flags */

/* 16-byte loads of a 16-bit operand's rows: unit last stride, every other
 * stride a multiple of 8 elements, element 0 aligned. */
static bool rows_vector(const sg_tensor *t) {
    if (sg_dtype_size(t->dtype) != 2 || t->stride[3] != 1) return false;
    for (int d = 0; d < 3; d++)
        if (t->stride[d] % 8 != 0) return false;
    return ((uintptr_t)sg__data(t) & 15) == 0;
}

/* in = {q, k, v, mask?, kv_len?, o, dout} (capture/ops.def). */
static void describe(bgeom *g, const sg__node *n) {
    const sg_tensor *q = n->in[0], *k = n->in[1], *v = n->in[2], *m = n->in[3], *len = n->in[4];
    const sg_tensor *o = n->in[5], *d = n->in[6];
    memset(g, 0, sizeof *g);
    for (int i = 0; i < 4; i++) {
        g->qs[i] = q->stride[i], g->ks[i] = k->stride[i], g->vs[i] = v->stride[i];
        g->ms[i] = m ? m->stride[i] : 0, g->gs[i] = d->stride[i], g->os[i] = o->stride[i];
    }
    g->B = q->shape[0], g->Hq = q->shape[1], g->Hkv = k->shape[1];
    g->Lq = q->shape[2], g->S = k->shape[2], g->D = q->shape[3];
    g->ls = len && len->ndim == 1 && len->shape[0] > 1 ? len->stride[0] : 0;
    g->nq = g->B * g->Hq * g->Lq * g->D, g->nkv = g->B * g->Hkv * g->S * g->D;
    g->ws = sg__attn_bwd_ws(g->nq, g->nkv);
    int64_t qs[4] = {g->B, g->Hq, g->Lq, g->D}, ks[4] = {g->B, g->Hkv, g->S, g->D};
    sg__attn_part p[3];
    sg__attn_bwd_parts(n->i[1], qs, ks, p);
    for (int k = 0; k < 3; k++)
        g->part[k][0] = p[k].off, g->part[k][1] = p[k].sb, g->part[k][2] = p[k].sh,
        g->part[k][3] = p[k].si;
    g->scale = (float)n->f[0];
    g->dt = (int32_t)q->dtype;
    g->mdt = m ? (int32_t)m->dtype : -1;
    g->ldt = len ? (int32_t)len->dtype : -1;
    g->flags = (n->i[0] & SG__ATTN_CAUSAL) ? CAUSAL : 0;
    g->flags |= (rows_vector(q) ? VQ : 0) | (rows_vector(k) ? VK : 0) | (rows_vector(v) ? VV : 0) |
                (rows_vector(d) ? VG : 0) | (rows_vector(o) ? VO : 0);
}

/* Tensor cores: 16-bit, D 64 or 128, no mask, sm_80+; the grids are (heads,
 * tiles of 64 rows), at most 65535 tiles. */
static bool use_mma(sg_ctx *ctx, const bgeom *g) {
    const char *e = getenv("SG_ATTN_MMA");
    if (e && strcmp(e, "0") == 0) return false;
    return (g->dt == SG_BF16 || g->dt == SG_F16) && g->mdt < 0 && (g->D == 64 || g->D == 128) &&
           g->B * g->Hq <= INT32_MAX && (g->Lq + 63) / 64 <= 65535 && (g->S + 63) / 64 <= 65535 &&
           sg__cuda_arch(ctx) >= 80;
}

/* The forward's row logsumexps (f32; NaN where it kept none), or NULL. */
static void *lse_of(const sg__node *n) {
    return n->nin > 7 && n->in[7] ? sg__data(n->in[7]) : NULL;
}

static sg_status launch_mma(sg_ctx *ctx, const sg__node *n, bgeom *g) {
    char dq_name[32], dkv_name[32];
    const char *t = g->dt == SG_F16 ? "f16" : "bf16";
    snprintf(dq_name, sizeof dq_name, "sg_attn_bwd_dq%d_%s", (int)g->D, t);
    snprintf(dkv_name, sizeof dkv_name, "sg_attn_bwd_dkv%d_%s", (int)g->D, t);
    void *fdq, *fdkv;
    sg_status st = sg__cuda_kernel(ctx, SG__CU_ATTN_BWD, dq_name, &fdq);
    if (st == SG_OK) st = sg__cuda_kernel(ctx, SG__CU_ATTN_BWD, dkv_name, &fdkv);
    if (st != SG_OK) return st;
    void *q = sg__data(n->in[0]), *k = sg__data(n->in[1]), *v = sg__data(n->in[2]);
    void *len = n->in[4] ? sg__data(n->in[4]) : NULL, *o = sg__data(n->in[5]);
    void *d = sg__data(n->in[6]), *out = sg__data(n->out), *lse = lse_of(n);
    unsigned block[3] = {NT, 1, 1};
    if (g->Lq > 0) {
        void *args[] = {&q, &k, &v, &len, &o, &d, &out, g, &lse};
        unsigned grid[3] = {(unsigned)(g->B * g->Hq), (unsigned)((g->Lq + 63) / 64), 1};
        st = sg__cuda_launch(ctx, fdq, grid, block, 0, args);
    }
    if (st != SG_OK || g->S == 0) return st;
    void *args[] = {&q, &k, &v, &len, &d, &out, g};
    unsigned grid[3] = {(unsigned)(g->B * g->Hkv), (unsigned)((g->S + 63) / 64), 1};
    return sg__cuda_launch(ctx, fdkv, grid, block, 0, args);
}

static sg_status launch_fma(sg_ctx *ctx, const sg__node *n, bgeom *g) {
    int64_t rows = g->B * g->Hq * g->Lq, keys = g->B * g->Hkv * g->S;
    if (rows > INT32_MAX || keys > INT32_MAX)
        return sg__fail(ctx, SG_ERR_UNSUPPORTED,
                        "cuda: attention backward over %lld query rows and %lld keys is past "
                        "the launch limits; split the batch",
                        (long long)rows, (long long)keys);
    void *frows, *fkeys;
    sg_status st = sg__cuda_kernel(ctx, SG__CU_ATTN_BWD, "sg_attn_bwd_rows", &frows);
    if (st == SG_OK) st = sg__cuda_kernel(ctx, SG__CU_ATTN_BWD, "sg_attn_bwd_keys", &fkeys);
    if (st != SG_OK) return st;
    void *q = sg__data(n->in[0]), *k = sg__data(n->in[1]), *v = sg__data(n->in[2]);
    void *m = n->in[3] ? sg__data(n->in[3]) : NULL, *len = n->in[4] ? sg__data(n->in[4]) : NULL;
    void *o = sg__data(n->in[5]), *d = sg__data(n->in[6]), *out = sg__data(n->out);
    void *lse = lse_of(n);
    unsigned block[3] = {NT, 1, 1};
    if (rows > 0) {
        void *args[] = {&q, &k, &v, &m, &len, &o, &d, &out, g, &lse};
        unsigned grid[3] = {(unsigned)rows, 1, 1};
        st = sg__cuda_launch(ctx, frows, grid, block, 0, args);
    }
    if (st != SG_OK || keys == 0) return st;
    void *args[] = {&q, &k, &v, &m, &len, &d, &out, g};
    unsigned grid[3] = {(unsigned)keys, 1, 1};
    return sg__cuda_launch(ctx, fkeys, grid, block, 0, args);
}

sg_status sg__cuda_attn_bwd(sg_ctx *ctx, const sg__node *n) {
    bgeom g;
    describe(&g, n);
    if (g.D > 256 || g.Hkv < 1 || g.Hq % g.Hkv != 0)
        return sg__fail(ctx, SG_ERR_INTERNAL,
                        "cuda: attention backward with D %lld, Hq %lld, Hkv %lld; "
                        "the kernels take D <= 256 and Hq a multiple of Hkv",
                        (long long)g.D, (long long)g.Hq, (long long)g.Hkv);
    if (g.D == 0) return SG_OK;
    return use_mma(ctx, &g) ? launch_mma(ctx, n, &g) : launch_fma(ctx, n, &g);
}

#endif /* SG_HAVE_CUDA_HEADERS */
