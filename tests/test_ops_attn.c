/* SPDX-License-Identifier: MIT */
/*
 * test_ops_attn.c -- the ATTENTION op (sg_sdpa's fused path and
 * sg_sdpa_cached) against an f64 attention written here, on random inputs:
 * decode (one or a few queries over a cache of S slots) and prefill (causal)
 * shapes, odd lengths, grouped-query ratios 1, 4 and 8, kv_len 0 (every row
 * NaN), 1, in between and the cache end, per-batch lengths, bool and float
 * masks, q/k/v as strided views narrowed out of one fused QKV projection
 * with heads permuted, eagerly and through every compiled mode, where a
 * replay after a new kv_len is written must see it. Also sg_sdpa's
 * grouped-query path through the decomposed ops (Dv != D), sg_sdpa_cached
 * past the kernels' D (the decomposed ops with kv_len as a mask), the
 * result's heads side by side in memory (its transpose (1, 2) contiguous,
 * a 3-d q a 3-d result), and the errors of sg_sdpa_cached. Runs on SG_TEST_BACKEND (CPU by default; the gpu label
 * runs it on CUDA too).
 */
#include "testutil.h"

#include <math.h>
#include <string.h>

static sg_ctx *ctx;

typedef struct acase {
    int64_t B, Hq, Hkv, Lq, S, D;
    int64_t len[3]; /* kv_len per batch (cached); len[1] < 0: one scalar length */
    bool cached;    /* sg_sdpa_cached (causal by definition), else sg_sdpa */
    bool causal;    /* sg_sdpa's flag */
    int mask;       /* sg_sdpa: 0 none, 1 bool (B,1,Lq,S), 2 float (Lq,S), 3 bool (S) of
                       the slots < len[0] (decode's mask), 4 float (B,1,1,S): a window
                       [len[b]/3, len[b]) of random values, -inf outside */
    bool fused;     /* q, k, v narrowed out of one (B, L, Hq+2Hkv, D) projection */
    double scale;
} acase;

/* An operand as values in a host array and the 4-d geometry the test reads them by. */
typedef struct operand {
    sg_tensor *t;
    double *base; /* the base tensor's values, row-major */
    int64_t off, st[4];
} operand;

static double at(const operand *o, int64_t a, int64_t b, int64_t c, int64_t d) {
    return o->base[o->off + a * o->st[0] + b * o->st[1] + c * o->st[2] + d * o->st[3]];
}

/* Contiguous (n0, n1, n2, n3). */
static operand contig(sg_dtype dt, int64_t n0, int64_t n1, int64_t n2, int64_t n3) {
    int64_t sh[4] = {n0, n1, n2, n3};
    operand o = {.off = 0, .st = {n1 * n2 * n3, n2 * n3, n3, 1}};
    o.t = tu_rand(ctx, dt, 4, sh, -1, 1, &o.base);
    return o;
}

/* Heads [h0, h0 + H) of a (B, L, Hall, D) projection, permuted to (B, H, L, D): no copy. */
static operand narrowed(sg_tensor *proj, double *vals, int64_t h0, int64_t H) {
    int64_t B = sg_tensor_size(proj, 0), L = sg_tensor_size(proj, 1);
    int64_t Ha = sg_tensor_size(proj, 2), D = sg_tensor_size(proj, 3);
    sg_tensor *n = sg_narrow(proj, 2, h0, H);
    static const int perm[4] = {0, 2, 1, 3};
    operand o = {
        .t = sg_permute(n, perm), .base = vals, .off = h0 * D, .st = {L * Ha * D, D, Ha * D, 1}};
    sg_release(n);
    (void)B;
    return o;
}

/* f64 attention of the case; out (B, Hq, Lq, D) row-major. */
static double *reference(const acase *c, const operand *q, const operand *k, const operand *v,
                         const double *mv) {
    int64_t B = c->B, Hq = c->Hq, Lq = c->Lq, S = c->S, D = c->D, g = Hq / c->Hkv;
    double *out = malloc(sizeof(double) * (size_t)(B * Hq * Lq * D + 1));
    double *p = malloc(sizeof(double) * (size_t)(S + 1));
    double scale = c->scale > 0 ? c->scale : 1.0 / sqrt((double)D);
    for (int64_t b = 0; b < B; b++) {
        int64_t L = S;
        if (c->cached) {
            L = c->len[c->len[1] < 0 ? 0 : b];
            L = L < 0 ? 0 : L > S ? S : L;
        }
        for (int64_t h = 0; h < Hq; h++)
            for (int64_t i = 0; i < Lq; i++) {
                double mx = -INFINITY, sum = 0;
                bool causal = c->cached || c->causal;
                for (int64_t j = 0; j < S; j++) {
                    double s = -INFINITY;
                    if (j < L && (!causal || j <= L - Lq + i)) {
                        s = 0;
                        for (int64_t e = 0; e < D; e++)
                            s += at(q, b, h, i, e) * at(k, b, h / g, j, e);
                        s *= scale;
                        if (c->mask == 1 && mv[(b * Lq + i) * S + j] == 0) s = -INFINITY;
                        if (c->mask == 2) s += mv[i * S + j];
                        if (c->mask == 3 && mv[j] == 0) s = -INFINITY;
                        if (c->mask == 4) s += mv[b * S + j];
                    }
                    p[j] = s;
                    mx = s > mx ? s : mx;
                }
                for (int64_t j = 0; j < S; j++) sum += p[j] = mx == -INFINITY ? 0 : exp(p[j] - mx);
                for (int64_t e = 0; e < D; e++) {
                    double o = 0;
                    for (int64_t j = 0; j < S; j++)
                        if (p[j] != 0) o += p[j] * at(v, b, h / g, j, e);
                    out[((b * Hq + h) * Lq + i) * D + e] = sum > 0 ? o / sum : NAN;
                }
            }
    }
    free(p);
    return out;
}

typedef struct inputs {
    const acase *c;
    sg_tensor *mask;
} inputs;

/* The step: in = {q, k, v, kv_len?}. */
static sg_status attn_step(sg_ctx *cx, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)cx;
    const inputs *u = user;
    out[0] = u->c->cached ? sg_sdpa_cached(in[0], in[1], in[2], in[3], u->c->scale)
                          : sg_sdpa(in[0], in[1], in[2], u->mask, u->c->causal, u->c->scale);
    return out[0] ? SG_OK : sg_ctx_status(cx);
}

static bool check(sg_tensor *y, const acase *c, const double *ref, sg_dtype dt) {
    int64_t n = c->B * c->Hq * c->Lq * c->D;
    double *got = y ? tu_read(y) : NULL;
    bool ok = TU_EXPECT(y != NULL) && TU_EXPECT(got != NULL) &&
              TU_EXPECT(sg_tensor_ndim(y) == 4 && sg_tensor_numel(y) == n) &&
              TU_EXPECT(tu_close("out", got, ref, n, tu_rtol(dt), tu_atol(dt)));
    if (!y) fprintf(stderr, "  %s\n", sg_last_error(ctx));
    free(got);
    return ok;
}

/* Write the case's kv_len values (i32 or i64) into len. */
static void write_len(sg_tensor *len, const int64_t *vals, int n) {
    if (sg_tensor_dtype(len) == SG_I64) {
        sg_write(len, vals, sizeof(int64_t) * (size_t)n);
    } else {
        int32_t v32[3];
        for (int i = 0; i < n; i++) v32[i] = (int32_t)vals[i];
        sg_write(len, v32, sizeof(int32_t) * (size_t)n);
    }
}

static const char *case_name(const acase *c, sg_dtype dt, char *buf, size_t size) {
    snprintf(buf, size,
             "%s(type=%s,B=%lld,Hq=%lld,Hkv=%lld,Lq=%lld,S=%lld,D=%lld,len=%lld/%lld,"
             "causal=%d,mask=%d,layout=%s,scale=%g)",
             c->cached ? "SDPA_CACHED" : "SDPA_FUSED", sg_dtype_name(dt), (long long)c->B,
             (long long)c->Hq, (long long)c->Hkv, (long long)c->Lq, (long long)c->S,
             (long long)c->D, (long long)c->len[0], (long long)c->len[1], c->causal, c->mask,
             c->fused ? "fused_qkv" : "contig", c->scale);
    return buf;
}

static void run_case(const acase *c, sg_dtype dt, sg_mode mode) {
    operand q, k, v;
    sg_tensor *proj = NULL, *cproj = NULL;
    double *pv = NULL, *cv = NULL;
    if (c->fused) { /* q from a projection of Lq tokens; k, v: a cache laid out (B, S, H, D) */
        int64_t ps[4] = {c->B, c->Lq, c->Hq + 2 * c->Hkv, c->D};
        proj = tu_rand(ctx, dt, 4, ps, -1, 1, &pv);
        q = narrowed(proj, pv, 0, c->Hq);
        if (!c->cached) {
            k = narrowed(proj, pv, c->Hq, c->Hkv), v = narrowed(proj, pv, c->Hq + c->Hkv, c->Hkv);
        } else {
            int64_t cs[4] = {c->B, c->S, 2 * c->Hkv, c->D};
            cproj = tu_rand(ctx, dt, 4, cs, -1, 1, &cv);
            k = narrowed(cproj, cv, 0, c->Hkv), v = narrowed(cproj, cv, c->Hkv, c->Hkv);
        }
    } else {
        q = contig(dt, c->B, c->Hq, c->Lq, c->D);
        k = contig(dt, c->B, c->Hkv, c->S, c->D), v = contig(dt, c->B, c->Hkv, c->S, c->D);
    }
    double *mv = NULL;
    inputs u = {.c = c};
    if (c->mask == 1) {
        int64_t ms[4] = {c->B, 1, c->Lq, c->S};
        u.mask = tu_rand(ctx, SG_BOOL, 4, ms, 0, 1, &mv);
    } else if (c->mask == 2) {
        int64_t ms[2] = {c->Lq, c->S};
        u.mask = tu_rand(ctx, dt, 2, ms, -2, 1, &mv);
    } else if (c->mask >= 3) {
        /* decode's masks: whole stretches of the cache masked off */
        bool b8 = c->mask == 3;
        int64_t n = b8 ? c->S : c->B * c->S, ms[4] = {c->B, 1, 1, c->S};
        size_t es = sg_dtype_size(b8 ? SG_BOOL : dt);
        void *raw = malloc((size_t)n * es);
        mv = malloc(sizeof(double) * (size_t)n);
        for (int64_t x = 0; x < n; x++) {
            int64_t b = x / c->S, j = x % c->S, hi = c->len[b < 3 ? b : 0], lo = hi / 3;
            mv[x] = b8                  ? (j < c->len[0])
                    : j >= lo && j < hi ? tu_round(dt, tu_uniform(-2, 1))
                                        : -INFINITY;
            tu_store(raw, b8 ? SG_BOOL : dt, x, mv[x]);
        }
        u.mask = sg_from_host(ctx, b8 ? SG_BOOL : dt, b8 ? 1 : 4, b8 ? &c->S : ms, raw);
        free(raw);
    }
    int nl = c->len[1] < 0 ? 0 : (int)c->B;
    int64_t ls[1] = {c->B};
    sg_tensor *len = c->cached ? sg_zeros(ctx, c->B % 2 ? SG_I32 : SG_I64, nl ? 1 : 0, ls) : NULL;
    if (len) write_len(len, c->len, nl ? nl : 1);
    double *ref = reference(c, &q, &k, &v, mv);
    sg_fn *fn = NULL;
    sg_tensor *in[4] = {q.t, k.t, v.t, len}, *y = NULL;
    bool ok =
        TU_EXPECT(sg_compile(ctx, attn_step, &u, c->cached ? 4 : 3, 1,
                             &(sg_compile_opts){.mode = mode, .fullgraph = true}, &fn) == SG_OK);
    ok =
        ok && TU_EXPECT(sg_call(fn, in, c->cached ? 4 : 3, &y, 1) == SG_OK) && check(y, c, ref, dt);
    if (ok && c->cached && mode != SG_MODE_EAGER) {
        /* A replay reads kv_len on the device: a new length changes the result. */
        acase c2 = *c;
        for (int b = 0; b < 3; b++)
            c2.len[b] = c->len[b] < 0   ? c->len[b]
                        : c->len[b] > 1 ? (c->len[b] < c->S ? c->len[b] : c->S) / 2
                                        : c->S;
        write_len(len, c2.len, nl ? nl : 1);
        double *ref2 = reference(&c2, &q, &k, &v, mv);
        sg_mark_step_begin(ctx);
        ok = TU_EXPECT(sg_call(fn, in, 4, &y, 1) == SG_OK) && check(y, &c2, ref2, dt);
        free(ref2);
    }
    if (!ok) fprintf(stderr, "  %s\n", sg_last_error(ctx));
    char name[256];
    tu_case(ok, "%s mode=%s", case_name(c, dt, name, sizeof name), sg_mode_name(mode));
    sg_clear_error(ctx);
    sg_fn_destroy(fn);
    sg_release(q.t), sg_release(k.t), sg_release(v.t), sg_release(len), sg_release(u.mask);
    sg_release(proj), sg_release(cproj);
    if (!c->fused) free(q.base), free(k.base), free(v.base);
    free(pv), free(cv), free(mv), free(ref);
}

static const acase cases[] = {
    /* decode: one query over a cache, GQA 1 / 4 / 8, kv_len 1, odd, the end, 0 */
    {1, 4, 4, 1, 37, 16, {1, -1}, true, true, 0, false, 0},
    {1, 8, 2, 1, 300, 32, {213, -1}, true, true, 0, false, 0},
    {2, 8, 1, 1, 129, 64, {129, 77}, true, true, 0, true, 0},
    {1, 4, 1, 1, 20, 8, {0, -1}, true, true, 0, false, 0},
    /* a few new tokens over the cache (speculative / chunked decode), kv_len < Lq for batch 1 */
    {2, 8, 2, 5, 70, 24, {66, 3}, true, true, 0, true, 0.2},
    {3, 4, 4, 3, 600, 40, {599, 600, 1}, true, true, 0, false, 0},
    /* prefill through sg_sdpa: causal, GQA, masks, fused QKV views */
    {2, 4, 4, 33, 33, 16, {0}, false, true, 0, false, 0},
    {1, 8, 2, 70, 70, 64, {0}, false, true, 0, true, 0},
    {2, 4, 1, 9, 9, 8, {0}, false, false, 1, true, 0},
    {1, 2, 2, 5, 130, 20, {0}, false, false, 2, false, 0.5},
    {1, 4, 2, 17, 17, 256, {0}, false, true, 0, false, 0},
    /* decode through sg_sdpa with a mask over the whole cache: the slots < pos (one
     * split of the cluster or many through the combine, single-split rows), a window
     * of float values, random bools with causal rows, a float mask */
    {1, 16, 4, 1, 2048, 64, {650}, false, false, 3, false, 0},
    {1, 4, 4, 1, 20000, 16, {650}, false, false, 3, false, 0},
    {4, 32, 8, 3, 200, 64, {77}, false, false, 3, false, 0},
    {1, 4, 4, 1, 300, 32, {0}, false, false, 3, false, 0},
    {2, 8, 1, 2, 513, 64, {400, 9}, false, false, 4, false, 0},
    {1, 4, 2, 3, 64, 16, {0}, false, true, 1, false, 0},
    {1, 4, 4, 1, 37, 16, {0}, false, false, 2, false, 0.3},
    /* D past the kernels: sg_sdpa_cached through the decomposed ops, kv_len as a mask */
    {2, 4, 2, 3, 40, 272, {37, 2}, true, true, 0, false, 0},
    {1, 2, 2, 1, 9, 264, {20, -1}, true, true, 0, true, 0},
};
#define NCASES ((int)(sizeof cases / sizeof cases[0]))

/* sg_sdpa with grouped-query K/V where the fused kernels do not apply (Dv != D): the
 * decomposed ops, through a (.., Hkv, g, L, D) view, against the fused path's Dv = D
 * prefix computed with v narrowed. */
static void gqa_decomposed(sg_dtype dt) {
    int64_t qs[4] = {2, 6, 5, 8}, ks[4] = {2, 3, 7, 8}, vs[4] = {2, 3, 7, 12};
    double *qv, *kv, *vv;
    sg_tensor *q = tu_rand(ctx, dt, 4, qs, -1, 1, &qv), *k = tu_rand(ctx, dt, 4, ks, -1, 1, &kv);
    sg_tensor *v = tu_rand(ctx, dt, 4, vs, -1, 1, &vv);
    sg_tensor *y = sg_sdpa(q, k, v, NULL, true, 0);
    int64_t n = 2 * 6 * 5 * 12;
    double *ref = malloc(sizeof(double) * (size_t)n), p[7];
    for (int64_t b = 0; b < 2; b++)
        for (int64_t h = 0; h < 6; h++)
            for (int64_t i = 0; i < 5; i++) {
                double mx = -INFINITY, sum = 0;
                int64_t hk = h / 2;
                for (int64_t j = 0; j < 7; j++) {
                    double s = 0;
                    for (int64_t e = 0; e < 8; e++)
                        s += qv[((b * 6 + h) * 5 + i) * 8 + e] * kv[((b * 3 + hk) * 7 + j) * 8 + e];
                    p[j] = j <= i + 2 ? s / sqrt(8.0) : -INFINITY;
                    mx = p[j] > mx ? p[j] : mx;
                }
                for (int64_t j = 0; j < 7; j++) sum += p[j] = exp(p[j] - mx);
                for (int64_t e = 0; e < 12; e++) {
                    double o = 0;
                    for (int64_t j = 0; j < 7; j++) o += p[j] * vv[((b * 3 + hk) * 7 + j) * 12 + e];
                    ref[((b * 6 + h) * 5 + i) * 12 + e] = o / sum;
                }
            }
    double *got = y ? tu_read(y) : NULL;
    bool ok = TU_EXPECT(y && sg_tensor_size(y, 1) == 6 && sg_tensor_size(y, 3) == 12) &&
              TU_EXPECT(got && tu_close("out", got, ref, n, tu_rtol(dt), tu_atol(dt) * 10));
    if (!y) fprintf(stderr, "  %s\n", sg_last_error(ctx));
    tu_case(ok, "SDPA_GQA_DECOMPOSED(type=%s,q=[2,6,5,8],k=[2,3,7,8],v=[2,3,7,12],causal=1)",
            sg_dtype_name(dt));
    sg_clear_error(ctx);
    sg_release(q), sg_release(k), sg_release(v), sg_release(y);
    free(qv), free(kv), free(vv), free(ref), free(got);
}

/* The step of heads_side_by_side: GPT-2's attention result, the heads put back side by
 * side as the output projection reads them, (B, L, Hq * D). */
static sg_status side_step(sg_ctx *cx, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)user;
    int64_t sh[3] = {sg_tensor_size(in[0], 0), sg_tensor_size(in[0], 2), -1};
    sg_tensor *y = sg_sdpa(in[0], in[1], in[2], NULL, true, 0);
    sg_tensor *t = sg_transpose(y, 1, 2);
    out[0] = sg_reshape(t, 3, sh);
    sg_release(y), sg_release(t);
    return out[0] ? SG_OK : sg_ctx_status(cx);
}

/* Batch 0 of a 4-d tensor, a contiguous 3-d copy. */
static sg_tensor *batch0(sg_tensor *t) {
    sg_tensor *n = sg_narrow(t, 0, 0, 1), *s = sg_squeeze(n, 0), *c = sg_contiguous(s);
    sg_release(n), sg_release(s);
    return c;
}

/* ATTENTION stores its result with the heads side by side: the result's transpose (1, 2) is
 * contiguous (no copy before the output projection), eagerly and compiled, and its values
 * are the f64 reference's, transposed. Also a 3-d q, k, v (H, L, D), whose result is 3-d. */
static void heads_side_by_side(sg_dtype dt) {
    const acase c = {2, 4, 4, 40, 40, 16, {0}, false, true, 0, true, 0};
    int64_t ps[4] = {c.B, c.Lq, 3 * c.Hq, c.D}, n = c.B * c.Hq * c.Lq * c.D;
    double *pv = NULL;
    sg_tensor *proj = tu_rand(ctx, dt, 4, ps, -1, 1, &pv);
    operand q = narrowed(proj, pv, 0, c.Hq), k = narrowed(proj, pv, c.Hq, c.Hq);
    operand v = narrowed(proj, pv, 2 * c.Hq, c.Hq);
    double *ref = reference(&c, &q, &k, &v, NULL), *want = malloc(sizeof(double) * (size_t)n);
    for (int64_t b = 0; b < c.B; b++) /* (B, Hq, L, D) -> (B, L, Hq, D) */
        for (int64_t h = 0; h < c.Hq; h++)
            for (int64_t i = 0; i < c.Lq; i++)
                for (int64_t e = 0; e < c.D; e++)
                    want[((b * c.Lq + i) * c.Hq + h) * c.D + e] =
                        ref[((b * c.Hq + h) * c.Lq + i) * c.D + e];
    sg_tensor *in[3] = {q.t, k.t, v.t}, *y = sg_sdpa(q.t, k.t, v.t, NULL, true, 0), *z = NULL;
    sg_tensor *t = sg_transpose(y, 1, 2);
    double *got = t ? tu_read(t) : NULL;
    bool ok = TU_EXPECT(t && sg_tensor_is_contiguous(t)) &&
              TU_EXPECT(got && tu_close("eager", got, want, n, tu_rtol(dt), tu_atol(dt)));
    free(got), got = NULL;
    sg_fn *fn = NULL;
    ok = ok && TU_EXPECT(sg_compile(ctx, side_step, NULL, 3, 1,
                                    &(sg_compile_opts){.mode = SG_MODE_DEFAULT}, &fn) == SG_OK);
    ok = ok && TU_EXPECT(sg_call(fn, in, 3, &z, 1) == SG_OK) && TU_EXPECT((got = tu_read(z))) &&
         TU_EXPECT(tu_close("compiled", got, want, n, tu_rtol(dt), tu_atol(dt)));
    free(got), got = NULL;
    /* 3-d: batch 0's heads, contiguous (Hq, L, D). */
    int64_t s3[3] = {c.Hq, c.Lq, c.D};
    sg_tensor *q3 = batch0(q.t), *k3 = batch0(k.t), *v3 = batch0(v.t);
    sg_tensor *y3 = sg_sdpa(q3, k3, v3, NULL, true, 0);
    ok = ok && TU_EXPECT(y3 && sg_tensor_ndim(y3) == 3 && sg_tensor_size(y3, 0) == s3[0]) &&
         TU_EXPECT((got = tu_read(y3))) &&
         TU_EXPECT(tu_close("3-d", got, ref, c.Hq * c.Lq * c.D, tu_rtol(dt), tu_atol(dt)));
    if (!ok) fprintf(stderr, "  %s\n", sg_last_error(ctx));
    tu_case(ok, "SDPA_HEADS_SIDE_BY_SIDE(type=%s,B=2,H=4,L=40,D=16,causal=1,fused_qkv) eager, "
                "compiled and 3-d", sg_dtype_name(dt));
    sg_clear_error(ctx);
    sg_fn_destroy(fn);
    sg_release(y), sg_release(t), sg_release(z), sg_release(q3), sg_release(k3), sg_release(v3);
    sg_release(y3), sg_release(q.t), sg_release(k.t), sg_release(v.t), sg_release(proj);
    free(got), free(ref), free(want), free(pv);
}

/* A prefill's K and V into their caches, then causal attention over the fresh K and V
 * (in: q, k, v, kc, vc; out: the result). */
static sg_status cache_step(sg_ctx *cx, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)user;
    int64_t L = sg_tensor_size(in[1], 2);
    sg_tensor *kn = sg_narrow(in[3], 2, 0, L), *vn = sg_narrow(in[4], 2, 0, L);
    sg_status s = sg_copy_(kn, in[1]);
    if (s == SG_OK) s = sg_copy_(vn, in[2]);
    sg_release(kn), sg_release(vn);
    out[0] = s == SG_OK ? sg_sdpa(in[0], in[1], in[2], NULL, true, 0) : NULL;
    return out[0] ? SG_OK : sg_ctx_status(cx);
}

/* The K/V cache writes of a prefill next to its attention: compiled, the attention's group
 * takes the copies (on CUDA its flash kernel writes them as it reads the rows). The caches
 * hold exactly the K and V values in their first L slots and their old values after; the
 * result is the f64 reference's. Heads narrowed out of one fused projection; L not a
 * multiple of the 64-row tiles; one grouped-query case. */
static void prefill_cache_copies(sg_dtype dt, int64_t Hq, int64_t Hkv, int64_t L, int64_t D) {
    const int64_t B = 2, S = L + 9;
    const acase c = {B, Hq, Hkv, L, L, D, {0}, false, true, 0, true, 0};
    int64_t ps[4] = {B, L, Hq + 2 * Hkv, D}, cs[4] = {B, Hkv, S, D};
    int64_t n = B * Hq * L * D, nc = B * Hkv * S * D;
    double *pv = NULL, *kcv = NULL, *vcv = NULL, *got = NULL, *kg = NULL, *vg = NULL;
    sg_tensor *proj = tu_rand(ctx, dt, 4, ps, -1, 1, &pv);
    sg_tensor *kc = tu_rand(ctx, dt, 4, cs, -1, 1, &kcv),
              *vc = tu_rand(ctx, dt, 4, cs, -1, 1, &vcv);
    operand q = narrowed(proj, pv, 0, Hq), k = narrowed(proj, pv, Hq, Hkv);
    operand v = narrowed(proj, pv, Hq + Hkv, Hkv);
    double *ref = reference(&c, &q, &k, &v, NULL);
    sg_tensor *in[5] = {q.t, k.t, v.t, kc, vc}, *y = NULL;
    sg_fn *fn = NULL;
    bool ok =
        TU_EXPECT(sg_compile(ctx, cache_step, NULL, 5, 1,
                             &(sg_compile_opts){.mode = SG_MODE_REDUCE_OVERHEAD}, &fn) == SG_OK);
    for (int call = 0; ok && call < 2; call++) {
        sg_release(y), y = NULL;
        ok = TU_EXPECT(sg_call(fn, in, 5, &y, 1) == SG_OK) && TU_EXPECT((got = tu_read(y))) &&
             TU_EXPECT(tu_close("result", got, ref, n, tu_rtol(dt), tu_atol(dt))) &&
             TU_EXPECT((kg = tu_read(kc)) && (vg = tu_read(vc)));
        for (int64_t i = 0; ok && i < nc; i++) { /* (b, h, s, e) of the caches */
            int64_t e = i % D, sl = i / D % S, h = i / D / S % Hkv, b = i / D / S / Hkv;
            double kw = sl < L ? at(&k, b, h, sl, e) : kcv[i],
                   vw = sl < L ? at(&v, b, h, sl, e) : vcv[i];
            ok = TU_EXPECT(kg[i] == kw) && TU_EXPECT(vg[i] == vw);
            if (!ok)
                fprintf(stderr, "  cache (%lld,%lld,%lld,%lld): k %g want %g, v %g want %g\n",
                        (long long)b, (long long)h, (long long)sl, (long long)e, kg[i], kw, vg[i],
                        vw);
        }
        free(got), free(kg), free(vg), got = kg = vg = NULL;
    }
    const char *ex = fn ? sg_fn_explain(fn) : "";
    if (ok && tu_backend() == SG_BACKEND_CUDA)
        ok = TU_EXPECT(strstr(ex, "attention copies:") != NULL);
    if (!ok) fprintf(stderr, "  %s\n%s\n", sg_last_error(ctx), ex);
    tu_case(ok,
            "SDPA_PREFILL_CACHE_COPIES(type=%s,B=%lld,Hq=%lld,Hkv=%lld,L=%lld,S=%lld,D=%lld,"
            "causal=1,fused_qkv) reduce-overhead, two calls",
            sg_dtype_name(dt), (long long)B, (long long)Hq, (long long)Hkv, (long long)L,
            (long long)S, (long long)D);
    sg_clear_error(ctx);
    sg_fn_destroy(fn);
    sg_release(y), sg_release(q.t), sg_release(k.t), sg_release(v.t), sg_release(kc),
        sg_release(vc);
    sg_release(proj);
    free(ref), free(pv), free(kcv), free(vcv);
}

static bool failed_with(sg_status s, const char *text) {
    bool ok = TU_EXPECT(sg_ctx_status(ctx) == s) &&
              TU_EXPECT(strstr(sg_last_error(ctx), "sg_sdpa_cached") != NULL) &&
              TU_EXPECT(strstr(sg_last_error(ctx), text) != NULL);
    if (!ok) fprintf(stderr, "  got: %s\n", sg_last_error(ctx));
    sg_clear_error(ctx);
    return ok;
}

static void errors(void) {
    int64_t qs[4] = {1, 4, 1, 8}, ks[4] = {1, 2, 16, 8}, k3[4] = {1, 3, 16, 8};
    int64_t bigq[4] = {1, 1, 1, 512}, bigk[4] = {1, 1, 4, 512}, l2[2] = {1, 1};
    sg_tensor *q = sg_zeros(ctx, SG_F32, 4, qs), *k = sg_zeros(ctx, SG_F32, 4, ks);
    sg_tensor *kb = sg_zeros(ctx, SG_BF16, 4, ks), *kh = sg_zeros(ctx, SG_F32, 4, k3);
    sg_tensor *len = sg_zeros(ctx, SG_I32, 0, NULL), *lenf = sg_zeros(ctx, SG_F32, 0, NULL);
    sg_tensor *len2 = sg_zeros(ctx, SG_I64, 2, l2);
    sg_tensor *qb = sg_zeros(ctx, SG_F32, 4, bigq), *kbig = sg_zeros(ctx, SG_F32, 4, bigk);
    bool ok =
        TU_EXPECT(sg_sdpa_cached(q, kb, kb, len, 0) == NULL) && failed_with(SG_ERR_DTYPE, "bf16");
    tu_case(ok, "SDPA_CACHED_BAD(bf16 cache with f32 q is SG_ERR_DTYPE)");
    ok = TU_EXPECT(sg_sdpa_cached(q, kh, kh, len, 0) == NULL) &&
         failed_with(SG_ERR_SHAPE, "multiple");
    tu_case(ok, "SDPA_CACHED_BAD(3 K/V heads for 4 query heads is SG_ERR_SHAPE)");
    ok = TU_EXPECT(sg_sdpa_cached(q, k, k, lenf, 0) == NULL) && failed_with(SG_ERR_DTYPE, "kv_len");
    tu_case(ok, "SDPA_CACHED_BAD(f32 kv_len is SG_ERR_DTYPE)");
    ok = TU_EXPECT(sg_sdpa_cached(q, k, k, len2, 0) == NULL) && failed_with(SG_ERR_SHAPE, "kv_len");
    tu_case(ok, "SDPA_CACHED_BAD(2-d kv_len is SG_ERR_SHAPE)");
    ok = TU_EXPECT(sg_sdpa_cached(qb, kbig, kh, len, 0) == NULL) &&
         failed_with(SG_ERR_SHAPE, "v_cache");
    tu_case(ok, "SDPA_CACHED_BAD(v_cache of another shape than k_cache is SG_ERR_SHAPE)");
    ok = TU_EXPECT(sg_sdpa_cached(q, k, k, len, INFINITY) == NULL) &&
         failed_with(SG_ERR_INVALID_ARG, "scale");
    tu_case(ok, "SDPA_CACHED_BAD(inf scale is SG_ERR_INVALID_ARG)");
    ok = TU_EXPECT(sg_sdpa_cached(q, k, NULL, len, 0) == NULL) &&
         TU_EXPECT(sg_ctx_status(ctx) == SG_OK);
    tu_case(ok, "SDPA_CACHED_BAD(NULL v_cache gives NULL without a new message)");
    sg_release(q), sg_release(k), sg_release(kb), sg_release(kh), sg_release(len);
    sg_release(lenf), sg_release(len2), sg_release(qb), sg_release(kbig);
}

int main(void) {
    ctx = tu_ctx((sg_ctx_opts){0});
    static const sg_dtype dts[3] = {SG_F32, SG_BF16, SG_F16};
    for (int i = 0; i < NCASES; i++) {
        tu_seed(1000 + (uint64_t)i);
        for (int t = 0; t < 3; t++) run_case(&cases[i], dts[t], SG_MODE_EAGER);
        /* Every compiled mode on a third of the cases, rotating the dtype. */
        if (i % 3 == 0)
            for (sg_mode m = SG_MODE_DEFAULT; m <= SG_MODE_MAX_AUTOTUNE_NO_GRAPHS; m++)
                run_case(&cases[i], dts[(i / 3) % 2], m);
    }
    gqa_decomposed(SG_F32);
    gqa_decomposed(SG_BF16);
    heads_side_by_side(SG_F32);
    heads_side_by_side(SG_BF16);
    prefill_cache_copies(SG_BF16, 4, 4, 100, 64);
    prefill_cache_copies(SG_F16, 4, 2, 70, 128);
    prefill_cache_copies(SG_F32, 2, 2, 33, 16);
    errors();
    sg_ctx_destroy(ctx);
    return tu_finish();
}
