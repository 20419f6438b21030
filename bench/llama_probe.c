/* SPDX-License-Identifier: MIT */
/*
 * llama_probe.c -- a Llama-style decode step (bf16, batch 1; 12 layers of
 * RMSNorm, one QKV projection, rotary embeddings, grouped-query attention
 * over a 2048-slot cache written in place at the position tensor, SwiGLU;
 * D 1024, 16 query and 4 K/V heads of 64, F 2816, vocabulary 32000: ~170M
 * parameters) written against the public header in three ways, each timed
 * as a compiled step replayed once per token:
 *   fused  - attention through sg_sdpa_cached (reads positions <= pos only),
 *            q and k rotated together, sg_rms_norm;
 *   plain  - as a user first writes it: q and k rotated apart, sg_sdpa over
 *            the whole cache with a mask of the slots <= pos;
 *   prims  - plain, with each norm written out: x * rsqrt(mean(x*x) + eps) * g;
 *   hf     - plain, with attention written out as Hugging Face's eager Llama
 *            does: K/V repeated for the query heads (sg_repeat_interleave),
 *            q @ k^T / sqrt(d), masked_fill of the slots > pos (one mask for
 *            all layers) with -inf, softmax in f32, @ v;
 *   repkv  - plain, sg_sdpa over K/V repeated for the query heads;
 *   port   - hf, and the rest as a port of Hugging Face's modeling_llama (or
 *            llama2.c) writes it: q, k and v projected apart (three weights),
 *            rotary embeddings as q * cos + rotate_half(q) * sin over
 *            full-width tables, RMSNorm in f32 (weight * cast back);
 *   meta   - port with llama2.c's (Meta's) rotary embeddings: each pair of
 *            adjacent elements (2i, 2i + 1) rotated, through a (.., HD/2, 2)
 *            view, its two narrowed halves and their concat.
 * Prints us per token (median of 5 loops of 100 tokens, positions 600..699)
 * and the kernels per step that sg_fn_explain counts. Not built by CMake;
 * on a GPU machine, after building the library in build-dev:
 *   gcc -O2 -std=c11 -Iinclude bench/llama_probe.c -Lbuild-dev -lstepgraph -lm \
 *       -Wl,-rpath,$PWD/build-dev -o llama_probe && ./llama_probe [cpu]
 */
#define _POSIX_C_SOURCE 200809L
#include <stepgraph.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { L = 12, D = 1024, HQ = 16, HKV = 4, HD = 64, F = 2816, V = 32000, S = 2048 };
#define EPS 1e-5

typedef struct model {
    int style; /* 0 fused, 1 plain, 2 prims, 3 hf, 4 repkv, 5 port, 6 meta */
    sg_tensor *g1[L], *wqkv[L], *wo[L], *g2[L], *w1[L], *w3[L], *w2[L], *kc[L], *vc[L];
    sg_tensor *gf, *wout, *cos, *sin, *slots;
    sg_tensor *wq[L], *wk[L], *wv[L]; /* port: wqkv's rows as tensors of their own */
} model;

static sg_tensor *norm(const model *m, sg_tensor *x, sg_tensor *g) {
    if (m->style >= 5) { /* LlamaRMSNorm */
        sg_tensor *h = sg_cast(x, SG_F32);
        int last = -1;
        sg_tensor *var = sg_mean(sg_pow_scalar(h, 2), 1, &last, true);
        return sg_mul(g, sg_cast(sg_mul(h, sg_rsqrt(sg_add_scalar(var, EPS))), SG_BF16));
    }
    if (m->style != 2) return sg_rms_norm(x, g, EPS);
    int last = -1;
    sg_tensor *ms = sg_mean(sg_mul(x, x), 1, &last, true);
    return sg_mul(sg_mul(x, sg_rsqrt(sg_add_scalar(ms, EPS))), g);
}

static sg_tensor *rotate(sg_tensor *t, sg_tensor *c, sg_tensor *s) {
    sg_tensor *a = sg_narrow(t, 3, 0, HD / 2), *b = sg_narrow(t, 3, HD / 2, HD / 2);
    sg_tensor *h[2] = {sg_sub(sg_mul(a, c), sg_mul(b, s)), sg_add(sg_mul(b, c), sg_mul(a, s))};
    return sg_concat(2, h, 3);
}

static sg_tensor *rotate_half(sg_tensor *t) { /* cat(-x2, x1) */
    sg_tensor *h[2] = {sg_neg(sg_narrow(t, 3, HD / 2, HD / 2)), sg_narrow(t, 3, 0, HD / 2)};
    return sg_concat(2, h, 3);
}

/* t (1, h, 1, HD): pairs (2i, 2i + 1) rotated by c, s (1, 1, 1, HD/2). */
static sg_tensor *rotate_pairs(sg_tensor *t, int64_t h, sg_tensor *c, sg_tensor *s) {
    int64_t ps[5] = {1, h, 1, HD / 2, 2}, cs5[5] = {1, 1, 1, HD / 2, 1}, back[4] = {1, h, 1, HD};
    sg_tensor *p = sg_reshape(t, 5, ps), *c5 = sg_reshape(c, 5, cs5), *s5 = sg_reshape(s, 5, cs5);
    sg_tensor *x0 = sg_narrow(p, 4, 0, 1), *x1 = sg_narrow(p, 4, 1, 1);
    sg_tensor *r[2] = {sg_sub(sg_mul(x0, c5), sg_mul(x1, s5)), sg_add(sg_mul(x0, s5), sg_mul(x1, c5))};
    return sg_reshape(sg_concat(2, r, 4), 4, back);
}

static sg_tensor *heads(sg_tensor *t, int64_t h) { /* (1, 1, h * HD) -> (1, h, 1, HD) */
    return sg_transpose(sg_reshape(t, 4, (int64_t[]){1, 1, h, HD}), 1, 2);
}

static sg_status step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    const model *m = user;
    sg_tensor *x = in[0], *pos = in[1];
    int64_t rs[4] = {1, 1, 1, HD / 2}, flat[3] = {1, 1, HQ * HD};
    sg_tensor *cs = sg_reshape(sg_index_select(m->cos, 0, pos), 4, rs);
    sg_tensor *sn = sg_reshape(sg_index_select(m->sin, 0, pos), 4, rs);
    sg_tensor *kv_len = sg_add_scalar(sg_reshape(pos, 0, NULL), 1);
    sg_tensor *mask = sg_le(m->slots, pos), *drop = sg_gt(m->slots, pos);
    for (int l = 0; l < L; l++) {
        sg_tensor *hn = norm(m, x, m->g1[l]), *q, *k, *v;
        sg_tensor *qkv = m->style >= 5 ? NULL : sg_linear(hn, m->wqkv[l], NULL);
        if (m->style == 6) {
            q = rotate_pairs(heads(sg_linear(hn, m->wq[l], NULL), HQ), HQ, cs, sn);
            k = rotate_pairs(heads(sg_linear(hn, m->wk[l], NULL), HKV), HKV, cs, sn);
        } else if (m->style == 5) {
            sg_tensor *cc[2] = {cs, cs}, *ss[2] = {sn, sn};
            sg_tensor *cf = sg_concat(2, cc, 3), *sf = sg_concat(2, ss, 3);
            q = heads(sg_linear(hn, m->wq[l], NULL), HQ);
            k = heads(sg_linear(hn, m->wk[l], NULL), HKV);
            q = sg_add(sg_mul(q, cf), sg_mul(rotate_half(q), sf));
            k = sg_add(sg_mul(k, cf), sg_mul(rotate_half(k), sf));
        } else if (m->style == 0) {
            sg_tensor *qk = rotate(heads(sg_narrow(qkv, 2, 0, (HQ + HKV) * HD), HQ + HKV), cs, sn);
            q = sg_narrow(qk, 1, 0, HQ), k = sg_narrow(qk, 1, HQ, HKV);
        } else {
            q = rotate(heads(sg_narrow(qkv, 2, 0, HQ * HD), HQ), cs, sn);
            k = rotate(heads(sg_narrow(qkv, 2, HQ * HD, HKV * HD), HKV), cs, sn);
        }
        v = m->style >= 5 ? heads(sg_linear(hn, m->wv[l], NULL), HKV)
                          : heads(sg_narrow(qkv, 2, (HQ + HKV) * HD, HKV * HD), HKV);
        sg_status st = sg_index_copy_(m->kc[l], 2, pos, k);
        if (st == SG_OK) st = sg_index_copy_(m->vc[l], 2, pos, v);
        if (st != SG_OK) return st;
        sg_tensor *a;
        if (m->style == 0) {
            a = sg_sdpa_cached(q, m->kc[l], m->vc[l], kv_len, 0.0);
        } else if (m->style >= 3) {
            sg_tensor *kr = sg_repeat_interleave(m->kc[l], HQ / HKV, 1);
            sg_tensor *vr = sg_repeat_interleave(m->vc[l], HQ / HKV, 1);
            if (m->style == 4) {
                a = sg_sdpa(q, kr, vr, mask, false, 0.0);
            } else { /* hf, port */
                sg_tensor *s = sg_div_scalar(sg_matmul(q, sg_transpose(kr, 2, 3)), sqrt(HD));
                s = sg_masked_fill(s, drop, -INFINITY);
                a = sg_matmul(sg_cast(sg_softmax(sg_cast(s, SG_F32), -1), SG_BF16), vr);
            }
        } else {
            a = sg_sdpa(q, m->kc[l], m->vc[l], mask, false, 0.0);
        }
        x = sg_add(x, sg_linear(sg_reshape(sg_transpose(a, 1, 2), 3, flat), m->wo[l], NULL));
        sg_tensor *h = norm(m, x, m->g2[l]);
        sg_tensor *u = sg_mul(sg_silu(sg_linear(h, m->w1[l], NULL)), sg_linear(h, m->w3[l], NULL));
        x = sg_add(x, sg_linear(u, m->w2[l], NULL));
    }
    out[0] = sg_linear(norm(m, x, m->gf), m->wout, NULL);
    return out[0] ? SG_OK : sg_ctx_status(c);
}

static uint64_t seed = 42;
static float frand(void) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((seed >> 40) * (1.0 / 16777216.0)) - 0.5f;
}

/* A bf16 tensor of uniform values in [lo, hi). */
static sg_tensor *rnd(sg_ctx *ctx, int nd, const int64_t *sh, float lo, float hi) {
    int64_t n = 1;
    for (int d = 0; d < nd; d++) n *= sh[d];
    float *v = malloc(sizeof *v * (size_t)n);
    if (!v) return NULL;
    for (int64_t i = 0; i < n; i++) v[i] = lo + (hi - lo) * (frand() + 0.5f);
    sg_tensor *f = sg_from_host(ctx, SG_F32, nd, sh, v);
    free(v);
    sg_tensor *t = sg_cast(f, SG_BF16);
    sg_release(f);
    return t;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    bool cpu = argc > 1 && !strcmp(argv[1], "cpu");
    sg_ctx *ctx;
    if (sg_ctx_create(&(sg_ctx_opts){.backend = cpu ? SG_BACKEND_CPU : SG_BACKEND_AUTO}, &ctx)) {
        fprintf(stderr, "no context\n");
        return 1;
    }
    static model m;
    int64_t d = D, qs[2] = {(HQ + 2 * HKV) * HD, D}, os[2] = {D, HQ * HD}, us[2] = {F, D},
            ds[2] = {D, F}, vs[2] = {V, D}, cs[4] = {1, HKV, S, HD}, ts[2] = {S, HD / 2};
    for (int l = 0; l < L; l++) {
        m.g1[l] = rnd(ctx, 1, &d, 0.8f, 1.2f), m.g2[l] = rnd(ctx, 1, &d, 0.8f, 1.2f);
        m.wqkv[l] = rnd(ctx, 2, qs, -0.05f, 0.05f), m.wo[l] = rnd(ctx, 2, os, -0.03f, 0.03f);
        m.w1[l] = rnd(ctx, 2, us, -0.03f, 0.03f), m.w3[l] = rnd(ctx, 2, us, -0.03f, 0.03f);
        m.w2[l] = rnd(ctx, 2, ds, -0.02f, 0.02f);
        m.kc[l] = rnd(ctx, 4, cs, -1, 1), m.vc[l] = rnd(ctx, 4, cs, -1, 1);
        sg_tensor *n[3] = {sg_narrow(m.wqkv[l], 0, 0, HQ * HD),
                           sg_narrow(m.wqkv[l], 0, HQ * HD, HKV * HD),
                           sg_narrow(m.wqkv[l], 0, (HQ + HKV) * HD, HKV * HD)};
        m.wq[l] = sg_contiguous(n[0]), m.wk[l] = sg_contiguous(n[1]), m.wv[l] = sg_contiguous(n[2]);
        for (int i = 0; i < 3; i++) sg_release(n[i]);
    }
    m.gf = rnd(ctx, 1, &d, 0.8f, 1.2f), m.wout = rnd(ctx, 2, vs, -0.05f, 0.05f);
    m.cos = rnd(ctx, 2, ts, -1, 1), m.sin = rnd(ctx, 2, ts, -1, 1);
    m.slots = sg_arange(ctx, SG_I64, 0, S, 1);
    int64_t xs[3] = {1, 1, D}, one = 1;
    sg_tensor *x = rnd(ctx, 3, xs, -1, 1);
    static const char *const names[7] = {"fused", "plain", "prims", "hf",
                                         "repkv", "port",  "meta"};
    float first[7][8];
    for (int style = 0; style < 7; style++) {
        m.style = style;
        sg_fn *fn = NULL;
        if (sg_compile(ctx, step, &m, 2, 1, &(sg_compile_opts){.mode = SG_MODE_REDUCE_OVERHEAD},
                       &fn)) {
            fprintf(stderr, "%s\n", sg_last_error(ctx));
            return 1;
        }
        int steps = cpu ? 3 : 100, loops = cpu ? 1 : 5;
        double t[5];
        for (int lp = -1; lp < loops; lp++) {
            double t0 = now();
            for (int s = 0; s < (lp < 0 ? 3 : steps); s++) {
                int64_t p = (lp < 0 ? 0 : 600) + s;
                sg_tensor *pos = sg_from_host(ctx, SG_I64, 1, &one, &p), *y = NULL;
                sg_mark_step_begin(ctx);
                sg_tensor *in[2] = {x, pos};
                if (sg_call(fn, in, 2, &y, 1)) {
                    fprintf(stderr, "%s: %s\n", names[style], sg_last_error(ctx));
                    return 1;
                }
                if (lp < 0 && s == 2) { /* the first logits, to compare the forms */
                    static float all[V];
                    sg_tensor *y32 = sg_cast(y, SG_F32);
                    if (sg_read(y32, all, sizeof all) == SG_OK)
                        memcpy(first[style], all, sizeof first[style]);
                    sg_release(y32);
                }
                sg_release(pos);
            }
            sg_ctx_synchronize(ctx);
            if (lp >= 0) t[lp] = (now() - t0) / steps * 1e6;
        }
        qsort(t, (size_t)loops, sizeof *t, cmp);
        const char *k = strstr(sg_fn_explain(fn), "kernels: ");
        printf("llama decode %-5s %9.1f us/token  %d kernels a step  logits[0..2] %.4f %.4f %.4f\n",
               names[style], t[loops / 2], k ? atoi(k + 9) : -1, first[style][0], first[style][1],
               first[style][2]);
        sg_fn_destroy(fn);
    }
    sg_ctx_destroy(ctx);
    return 0;
}
