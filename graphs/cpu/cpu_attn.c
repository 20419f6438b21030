/* SPDX-License-Identifier: MIT */
/*
 * cpu_attn.c -- the eager CPU kernel of ATTENTION (sg_sdpa, sg_sdpa_cached):
 * one pass over the visible keys per (batch, head, query) row with an
 * online softmax in f32 (running max, running sum, rescaled accumulator),
 * keys taken in tiles of KT so that the rescale happens once per tile.
 * Rows are spread over OpenMP threads; q, k, v and the mask are read
 * through their strides (stride 0 where broadcast), grouped-query heads
 * read their shared K/V head. The node's layout is in capture/ops.def;
 * with SG__ATTN_LSE each row's logsumexp, mx + log(sum), follows the result.
 *
 * ATTENTION_BWD (the gradient of ATTENTION, sg__sdpa_grad) in two passes,
 * f32 accumulation throughout. Rows: per (batch, head, query) row, the
 * logsumexp of its visible scaled scores (the forward's, when the node has
 * them and they are not NaN, else recomputed), D = rowsum(dO * O), and dq =
 * scale * sum_j dS_j k_j with P_j = exp(s_j - lse), dS_j = P_j (dO.v_j - D),
 * keys in order; lse and D go to the packed output's row workspace, dq,
 * dk and dv where sg__attn_bwd_parts puts them. Keys:
 * per (batch, K/V head, key) j, dv_j = sum P_ij dO_i and dk_j = scale * sum
 * dS_ij q_i over the query heads that share the K/V head and the queries
 * that see j, in order, so every result is one fixed sum (bit-identical
 * replays at any thread count). Both passes spread over OpenMP threads.
 */
#include "cpu.h"

#define KT 64

typedef struct attn_geom {
    int64_t B, Hq, Hkv, Lq, S, D;
    const sg_tensor *q, *k, *v, *m, *len, *out;
    const sg_tensor *o, *dout; /* ATTENTION_BWD: the forward's output and its gradient */
    sg__attn_part part[3];     /* ATTENTION_BWD: where dq, dk, dv go in out */
    float *lse;                /* ATTENTION: where its rows' logsumexps go, or NULL;
                                  ATTENTION_BWD: the forward's, or NULL */
    float scale;
    bool causal;
    bool drops; /* SG__ATTN_MASK_DROPS: a bool mask true where keys are dropped */
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
                    dot = (((const uint8_t *)sg__data(m))[at] != 0) != g->drops ? dot : -INFINITY;
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
    if (g->lse) g->lse[(b * g->Hq + h) * g->Lq + i] = sum > 0 ? mx + logf(sum) : INFINITY;
    const sg_tensor *o = g->out; /* stored (B, Lq, Hq, D): capture.h */
    int64_t oo = ((b * g->Lq + i) * g->Hq + h) * D;
    for (int64_t e = 0; e < D; e++) sg__stf(sg__data(o), o->dtype, oo + e, acc[e] * inv);
}

/* ------------------------------------------------------------ backward */

/* Element e of row i of head h, batch b of a 4-d strided view. */
static float at4(const sg_tensor *t, int64_t b, int64_t h, int64_t i, int64_t e) {
    int64_t o = b * t->stride[0] + h * t->stride[1] + i * t->stride[2] + e * t->stride[3];
    return sg__ldf(sg__data(t), t->dtype, o);
}

/* The scaled score of query row (b, h, i), q's values in qf, against key j:
 * the mask added, or -inf where a bool mask drops it. */
static float score(const attn_geom *g, int64_t b, int64_t h, int64_t i, int64_t j,
                   const float *qf) {
    int64_t hk = h / (g->Hq / g->Hkv);
    float dot = 0;
    for (int64_t e = 0; e < g->D; e++) dot += qf[e] * at4(g->k, b, hk, j, e);
    dot *= g->scale;
    if (g->m) {
        const sg_tensor *m = g->m;
        int64_t at = b * m->stride[0] + h * m->stride[1] + i * m->stride[2] + j * m->stride[3];
        if (m->dtype == SG_BOOL)
            return (((const uint8_t *)sg__data(m))[at] != 0) != g->drops ? dot : -INFINITY;
        dot += sg__ldf(sg__data(m), m->dtype, at);
    }
    return dot;
}

/* dO_r . v_j for row (b, h) and key j of K/V head hk. */
static float dot_v(const attn_geom *g, int64_t b, int64_t hk, int64_t j, const float *dof) {
    float dp = 0;
    for (int64_t e = 0; e < g->D; e++) dp += dof[e] * at4(g->v, b, hk, j, e);
    return dp;
}

/* One query row: its lse and D into ws, its dq into the packed output. */
static void bwd_row(const attn_geom *g, int64_t b, int64_t h, int64_t i, float *ws, float *qf,
                    float *dof, float *acc) {
    int64_t D = g->D, r = (b * g->Hq + h) * g->Lq + i, n = visible(g, b, i);
    int64_t hk = h / (g->Hq / g->Hkv), rows = g->B * g->Hq * g->Lq;
    float Di = 0, mx = -INFINITY, sum = 0;
    for (int64_t e = 0; e < D; e++) {
        qf[e] = at4(g->q, b, h, i, e), dof[e] = at4(g->dout, b, h, i, e), acc[e] = 0;
        Di += dof[e] * at4(g->o, b, h, i, e);
    }
    /* No key seen: lse = +inf makes every P 0, so the row contributes nothing. */
    float lse = g->lse ? g->lse[r] : NAN;
    if (lse != lse) { /* not kept by the forward: recompute */
        for (int64_t j = 0; j < n; j++) {
            float s = score(g, b, h, i, j, qf);
            mx = s > mx ? s : mx;
        }
        for (int64_t j = 0; mx > -INFINITY && j < n; j++)
            sum += expf(score(g, b, h, i, j, qf) - mx);
        lse = sum > 0 ? mx + logf(sum) : INFINITY;
    }
    sum = lse < INFINITY; /* from here: whether the row sees a key */
    for (int64_t j = 0; sum > 0 && j < n; j++) {
        float p = expf(score(g, b, h, i, j, qf) - lse);
        if (p == 0) continue;
        float ds = p * (dot_v(g, b, hk, j, dof) - Di);
        for (int64_t e = 0; e < D; e++) acc[e] += ds * at4(g->k, b, hk, j, e);
    }
    ws[r] = lse, ws[rows + r] = Di;
    const sg__attn_part *p = &g->part[0];
    int64_t at = p->off + b * p->sb + h * p->sh + i * p->si;
    for (int64_t e = 0; e < D; e++)
        sg__stf(sg__data(g->out), g->out->dtype, at + e, acc[e] * g->scale);
}

/* One key j of K/V head hk: dk_j and dv_j over every query that sees it. */
static void bwd_key(const attn_geom *g, int64_t b, int64_t hk, int64_t j, const float *ws,
                    float *qf, float *dof, float *acc) {
    int64_t D = g->D, G = g->Hq / g->Hkv, rows = g->B * g->Hq * g->Lq;
    float *dk = acc, *dv = acc + D;
    for (int64_t e = 0; e < 2 * D; e++) acc[e] = 0;
    for (int64_t h = hk * G; h < (hk + 1) * G; h++)
        for (int64_t i = 0; i < g->Lq; i++) {
            int64_t r = (b * g->Hq + h) * g->Lq + i;
            if (j >= visible(g, b, i) || ws[r] == INFINITY) continue;
            for (int64_t e = 0; e < D; e++) qf[e] = at4(g->q, b, h, i, e);
            float p = expf(score(g, b, h, i, j, qf) - ws[r]);
            if (p == 0) continue;
            for (int64_t e = 0; e < D; e++) dof[e] = at4(g->dout, b, h, i, e);
            float ds = p * (dot_v(g, b, hk, j, dof) - ws[rows + r]);
            for (int64_t e = 0; e < D; e++) dv[e] += p * dof[e], dk[e] += ds * qf[e];
        }
    const sg__attn_part *pk = &g->part[1], *pv = &g->part[2];
    int64_t ak = pk->off + b * pk->sb + hk * pk->sh + j * pk->si;
    int64_t av = pv->off + b * pv->sb + hk * pv->sh + j * pv->si;
    void *out = sg__data(g->out);
    for (int64_t e = 0; e < D; e++) {
        sg__stf(out, g->out->dtype, ak + e, dk[e] * g->scale);
        sg__stf(out, g->out->dtype, av + e, dv[e]);
    }
}

static sg_status attn_bwd(sg_ctx *ctx, const attn_geom *g) {
    int64_t rows = g->B * g->Hq * g->Lq, keys = g->B * g->Hkv * g->S;
    int64_t nq = rows * g->D, nkv = keys * g->D;
    float *ws = (float *)((char *)sg__data(g->out) +
                          (size_t)sg__attn_bwd_ws(nq, nkv) * sg_dtype_size(g->out->dtype));
    int nth = sg__cpu_threads(ctx, rows * g->S * g->D / 2);
#pragma omp parallel for num_threads(nth) if (nth > 1) schedule(dynamic, 4)
    for (int64_t r = 0; r < rows; r++) {
        float qf[256], dof[256], acc[256];
        int64_t i = r % g->Lq, h = (r / g->Lq) % g->Hq, b = r / (g->Lq * g->Hq);
        bwd_row(g, b, h, i, ws, qf, dof, acc);
    }
#pragma omp parallel for num_threads(nth) if (nth > 1) schedule(dynamic, 4)
    for (int64_t x = 0; x < keys; x++) {
        float qf[256], dof[256], acc[512];
        int64_t j = x % g->S, hk = (x / g->S) % g->Hkv, b = x / (g->S * g->Hkv);
        bwd_key(g, b, hk, j, ws, qf, dof, acc);
    }
    return SG_OK;
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
                   .o = n->nin > 6 ? n->in[5] : NULL,
                   .dout = n->nin > 6 ? n->in[6] : NULL,
                   .lse = n->nin > 7 && n->in[7] ? (float *)sg__data(n->in[7]) : NULL,
                   .scale = (float)n->f[0],
                   .causal = (n->i[0] & SG__ATTN_CAUSAL) != 0,
                   .drops = (n->i[0] & SG__ATTN_MASK_DROPS) != 0};
    if (g.D > 256 || g.Hkv < 1 || g.Hq % g.Hkv != 0)
        return sg__fail(ctx, SG_ERR_INTERNAL,
                        "attention: D %lld, Hq %lld, Hkv %lld: the kernel "
                        "takes D <= 256 and Hq a multiple of Hkv",
                        (long long)g.D, (long long)g.Hq, (long long)g.Hkv);
    if (n->op == SG__OP_ATTENTION_BWD) {
        int64_t qs[4] = {g.B, g.Hq, g.Lq, g.D}, ks[4] = {g.B, g.Hkv, g.S, g.D};
        sg__attn_bwd_parts(n->i[1], qs, ks, g.part);
        return attn_bwd(ctx, &g);
    }
    int64_t rows = g.B * g.Hq * g.Lq;
    if (n->i[0] & SG__ATTN_LSE) /* packed: the result, then its rows' logsumexps */
        g.lse = (float *)((char *)sg__data(n->out) +
                          (size_t)sg__attn_lse_at(rows * g.D) * sg_dtype_size(n->out->dtype));
    int nth = sg__cpu_threads(ctx, rows * g.S * g.D / 4);
#pragma omp parallel for num_threads(nth) if (nth > 1) schedule(dynamic, 4)
    for (int64_t r = 0; r < rows; r++) {
        float qf[256], acc[256];
        int64_t i = r % g.Lq, h = (r / g.Lq) % g.Hq, b = r / (g.Lq * g.Hq);
        attn_row(&g, b, h, i, qf, acc);
    }
    return SG_OK;
}
