/* SPDX-License-Identifier: MIT */
/*
 * cpu_attn.c -- the eager CPU kernel of ATTENTION (sg_sdpa, sg_sdpa_cached):
 * one pass over the visible keys per (batch, head, query) row with an
 * online softmax in f32 (running max, running sum, rescaled accumulator),
 * keys taken in tiles of KT so that the rescale happens once per tile.
 * Rows are spread over OpenMP threads; q, k, v and the mask are read
 * through their strides (stride 0 where broadcast), grouped-query heads
 * read their shared K/V head. The node's layout is in capture/ops.def.
 */
#include "cpu.h"

#define KT 64

typedef struct attn_geom {
    int64_t B, Hq, Hkv, Lq, S, D;
    const sg_tensor *q, *k, *v, *m, *len, *out;
    float scale;
    bool causal;
} attn_geom;

/* The number of keys row i of batch b sees: keys 0 .. n-1. */
static int64_t visible(const attn_geom *g, int64_t b, int64_t i) {
    int64_t L = g->S;
    if (g->len) {
        const sg_tensor *t = g->len;
        int64_t s = t->ndim == 1 && t->shape[0] > 1 ? t->stride[0] : 0;
        L = sg__ldi(sg__data(t), t->dtype, b * s);
        L = L < 0 ? 0 : L > g->S ? g->S : L;
    }
    if (g->causal) {
        int64_t last = L - g->Lq + i + 1;
        L = last < L ? last : L;
    }
    return L < 0 ? 0 : L;
}

/* One row: out[0..D) = softmax(q k^T * scale + mask) v over n keys. */
static void attn_row(const attn_geom *g, int64_t b, int64_t h, int64_t i, float *qf, float *acc) {
    const sg_tensor *q = g->q, *k = g->k, *v = g->v, *m = g->m;
    int64_t D = g->D, hk = h / (g->Hq / g->Hkv), n = visible(g, b, i);
    const void *qp = sg__data(q), *kp = sg__data(k), *vp = sg__data(v);
    int64_t qo = b * q->stride[0] + h * q->stride[1] + i * q->stride[2];
    int64_t ko = b * k->stride[0] + hk * k->stride[1], vo = b * v->stride[0] + hk * v->stride[1];
    int64_t mo = m ? b * m->stride[0] + h * m->stride[1] + i * m->stride[2] : 0;
    for (int64_t e = 0; e < D; e++) qf[e] = sg__ldf(qp, q->dtype, qo + e * q->stride[3]) * g->scale;
    for (int64_t e = 0; e < D; e++) acc[e] = 0;
    float mx = -INFINITY, sum = 0, s[KT];
    for (int64_t j0 = 0; j0 < n; j0 += KT) {
        int nt = (int)(n - j0 < KT ? n - j0 : KT);
        float tmx = -INFINITY;
        for (int t = 0; t < nt; t++) {
            int64_t kr = ko + (j0 + t) * k->stride[2];
            float dot = 0;
            for (int64_t e = 0; e < D; e++)
                dot += qf[e] * sg__ldf(kp, k->dtype, kr + e * k->stride[3]);
            if (m) {
                int64_t at = mo + (j0 + t) * m->stride[3];
                if (m->dtype == SG_BOOL)
                    dot = ((const uint8_t *)sg__data(m))[at] ? dot : -INFINITY;
                else
                    dot += sg__ldf(sg__data(m), m->dtype, at);
            }
            s[t] = dot;
            tmx = dot > tmx ? dot : tmx;
        }
        if (tmx == -INFINITY) continue; /* every key of the tile masked */
        float nmx = tmx > mx ? tmx : mx, alpha = expf(mx - nmx);
        sum *= alpha;
        for (int64_t e = 0; e < D; e++) acc[e] *= alpha;
        for (int t = 0; t < nt; t++) {
            float p = expf(s[t] - nmx);
            int64_t vr = vo + (j0 + t) * v->stride[2];
            sum += p;
            for (int64_t e = 0; e < D; e++)
                acc[e] += p * sg__ldf(vp, v->dtype, vr + e * v->stride[3]);
        }
        mx = nmx;
    }
    /* No visible key, or every one masked: NaN, as softmax over -inf gives. */
    float inv = sum > 0 ? 1.0f / sum : NAN;
    const sg_tensor *o = g->out;
    int64_t oo = ((b * g->Hq + h) * g->Lq + i) * D;
    for (int64_t e = 0; e < D; e++) sg__stf(sg__data(o), o->dtype, oo + e, acc[e] * inv);
}

sg_status sg__cpu_attn(sg_ctx *ctx, const sg__node *n) {
    const sg_tensor *q = n->in[0], *k = n->in[1];
    attn_geom g = {.B = q->shape[0],
                   .Hq = q->shape[1],
                   .Hkv = k->shape[1],
                   .Lq = q->shape[2],
                   .S = k->shape[2],
                   .D = q->shape[3],
                   .q = q,
                   .k = k,
                   .v = n->in[2],
                   .m = n->nin > 3 ? n->in[3] : NULL,
                   .len = n->nin > 4 ? n->in[4] : NULL,
                   .out = n->out,
                   .scale = (float)n->f[0],
                   .causal = (n->i[0] & SG__ATTN_CAUSAL) != 0};
    if (g.D > 256 || g.Hkv < 1 || g.Hq % g.Hkv != 0)
        return sg__fail(ctx, SG_ERR_INTERNAL,
                        "attention: D %lld, Hq %lld, Hkv %lld: the kernel "
                        "takes D <= 256 and Hq a multiple of Hkv",
                        (long long)g.D, (long long)g.Hq, (long long)g.Hkv);
    int64_t rows = g.B * g.Hq * g.Lq;
    int nth = sg__cpu_threads(ctx, rows * g.S * g.D / 4);
#pragma omp parallel for num_threads(nth) if (nth > 1) schedule(dynamic, 4)
    for (int64_t r = 0; r < rows; r++) {
        float qf[256], acc[256];
        int64_t i = r % g.Lq, h = (r / g.Lq) % g.Hq, b = r / (g.Lq * g.Hq);
        attn_row(&g, b, h, i, qf, acc);
    }
    return SG_OK;
}
