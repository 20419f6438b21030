/* SPDX-License-Identifier: MIT */
/*
 * test_codegen_cuda_decode.c -- decode steps at batch 1 on the CUDA backend's
 * plan: launches per decoder layer, and the results.
 *
 * Two models, each built with 1 and with 2 layers; the launches of a decode
 * step on CUDA (generated kernels plus library calls, from its capture fused
 * with the CUDA options and generated in the CUDA dialect, without a GPU)
 * differ by one layer's:
 *  - GPT-2 (examples/gpt2/, bf16, 768 channels, 12 heads): at most 5 per
 *    layer (each layer_norm folded into the GEMV that reads it, the K/V
 *    cache writes into the QKV GEMV's epilogue); its
 *    compiled decode logits equal an eager run's within bf16 tolerance for
 *    two steps (the same seeded weights), and its greedy tokens match.
 *  - A Llama-style block written here against the public header (bf16:
 *    RMSNorm, one QKV projection, rotary embeddings with narrow, mul, sub,
 *    add and concat on the position's row of cos/sin tables, grouped-query
 *    attention through sg_sdpa_cached over per-layer caches, SwiGLU): at
 *    most 6 per layer (SwiGLU's two GEMVs as one pair kernel, the rotation,
 *    concat and cache writes as one chain kernel); its logits against an
 *    f64 reference written here for three positions.
 *    The same block as a user first writes it (q and k rotated apart, sg_sdpa
 *    over the whole cache with a mask of the slots <= pos), and with its
 *    RMSNorms written out of primitives too (a REDUCE group folded into the
 *    GEMV): at most 6 a layer, logits against the same f64 reference.
 *  - GPT-2 written by hand (layer_norm and GELU's tanh form spelled out,
 *    sg_sdpa with a slot mask, 256 channels): at most 5 a layer (each
 *    written-out layer_norm run as the op and folded into its GEMV), logits
 *    against an f64 reference written here for three positions.
 *  - h += linear(rms_norm(h)) in place: the norm is not folded into the GEMV
 *    whose epilogue writes h (2 launches), and h is right.
 *  - Two linears on one x of 2 rows meeting in sigmoid(b) * a - b, with a
 *    an output too: one pair kernel, both results right.
 *  - linear(x, w, b) + r with a long K (3072, 3001 bf16; 1500, 1501 f32)
 *    over few columns (odd N), 1 to 3 rows: one GEMV whose K is split over
 *    a group of warps per column, against an f64 reference; also with x
 *    first through layer_norm (the rows normalized in the GEMV).
 *    With SG_GEMV_ARGMAX=1 the step takes 2 launches fewer (the argmax
 *    and the token and position updates in the LM head's GEMV), and the
 *    same checks hold.
 *  - argmax(linear(x, w), -1) with the logits an output (bf16 over 50257
 *    columns at 1 and 3 rows, f32 at an odd K): one GEMV kernel that also
 *    finishes the argmax; the indices are torch's argmax of the returned
 *    logits, with two equal columns in different blocks and a NaN column.
 *  - qkv = linear(x, w, b) with its K and V heads index_copy_'d into two
 *    caches at a position: one GEMV kernel that also writes the caches;
 *    after two calls (positions 1 and 6) the caches hold those rows and
 *    zeros elsewhere.
 * SG_TEST_PRINT_PLAN=1 lists each step's kernels (its groups) on stderr.
 * Each unit is compiled by NVRTC for sm_90 when NVRTC can be loaded. The
 * results run on the test's backend (SG_TEST_BACKEND: the CPU by default,
 * the CUDA kernels under the gpu label).
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include "gpt2/model.h"
#include "testutil.h"

#include "graphs/graphs.h"
#include "cuda_unit.h"

#include <math.h>
#include <string.h>

#define BF16_TOL 3e-2

static sg_ctx *ctx;
static bool nvrtc_missing;
static bool last_split; /* cuda_launches' unit splits a GEMV's K over warps */
static int last_kernels, last_stamped; /* its kernels, and those that stamp (SG_CUDA_STAMPS) */
static int last_epre;                  /* its GEMV epilogue operands loaded right after the wait */

/* Launches per step of fn's last capture on CUDA; the unit through NVRTC. */
static bool cuda_launches(sg_fn *fn, const char *name, int *launches) {
    *launches = 0;
    if (!TU_EXPECT(fn && fn->ngraphs > 0)) return false;
    sg__graph *g = fn->graphs[fn->ngraphs - 1];
    sg__fuse_opts fo;
    sg__cgen_cuda_fuse_opts(&fo, false);
    sg__fused f;
    if (!TU_EXPECT(sg__fuse(ctx, &g->ir, &fo, &f) == SG_OK)) return false;
    sg__cuda_kinfo *ki = calloc((size_t)(f.ngroups ? f.ngroups : 1), sizeof *ki);
    sg__emit e = {.ctx = ctx};
    int nk = 0, calls = 0;
    bool ok = TU_EXPECT(ki && sg__cgen_cuda(ctx, &g->ir, &f, name, &e, ki, &nk) == SG_OK);
    for (int k = 0; ok && k < f.ngroups; k++) {
        const sg__group *grp = &f.groups[k];
        /* The post members read the argmax's result from memory. */
        if (grp->post) ok = ok && TU_EXPECT(grp->g[grp->argmax].store);
        calls += (grp->kind == SG__G_OPAQUE || grp->anchor >= 0) && !ki[k].replaces_call;
        if (getenv("SG_TEST_PRINT_PLAN")) {
            char nm[512];
            fprintf(stderr, "  %s[%d] kind %d: %s%s\n", name, k, grp->kind,
                    sg__group_name(&g->ir, grp, nm, sizeof nm),
                    ki[k].replaces_call ? " (gen)" : "");
        }
    }
    *launches = nk + calls;
    last_split = ok && e.buf && strstr(e.buf, "sg_kred");
    last_kernels = last_stamped = last_epre = 0;
    for (const char *t = ok ? e.buf : NULL; t && (t = strstr(t, "float ep")); t++) last_epre++;
    for (const char *t = ok ? e.buf : NULL; t && (t = strstr(t, "__global__")); t++) last_kernels++;
    for (const char *t = ok ? e.buf : NULL; t && (t = strstr(t, "sg_stamper sg_stamp_(slot);"));
         t++)
        last_stamped++;
    if (ok && getenv("SG_TEST_PRINT_CUDA")) fprintf(stderr, "%s\n", e.buf);
    ok = ok && cu_unit_compiles(ctx, name, e.buf, &nvrtc_missing);
    sg__emit_free(&e);
    free(ki);
    sg__fused_free(ctx, &f, &g->ir);
    return ok;
}

/* ------------------------------------------------------------ GPT-2 */

enum { G_C = 768, G_NH = 12, G_V = 256, G_T = 16, G_STEPS = 2 };

/* Two decode steps of a seeded GPT-2 with `layers` layers in `mode` from
 * token 3 at position 0: the logits of each (G_STEPS x G_V) and the
 * launches of its capture on CUDA (compiled modes). */
static bool gpt2_run(int64_t layers, sg_mode mode, double *logits, int *launches) {
    gpt2_config cfg = {
        .max_t = G_T, .vocab = G_V, .n_layer = layers, .n_head = G_NH, .channels = G_C};
    gpt2 *g = NULL;
    bool ok = TU_EXPECT(gpt2_init(ctx, &cfg, SG_BF16, 7, &g) == SG_OK) &&
              TU_EXPECT(gpt2_cache_create(g, 1, G_T, &(sg_compile_opts){.mode = mode}) == SG_OK);
    int64_t one = 1, tok = 3, p0 = 0;
    sg_tensor *token = sg_from_host(ctx, SG_I64, 1, &one, &tok);
    sg_tensor *pos = sg_from_host(ctx, SG_I64, 1, &one, &p0);
    for (int s = 0; ok && s < G_STEPS; s++) {
        sg_tensor *out = NULL;
        ok = TU_EXPECT(gpt2_decode(g, token, pos, &out) == SG_OK);
        double *v = ok ? tu_read(out) : NULL;
        ok = ok && TU_EXPECT(v != NULL && sg_tensor_numel(out) == G_V);
        if (ok) memcpy(logits + s * G_V, v, sizeof(double) * G_V);
        free(v);
        if (mode == SG_MODE_EAGER) sg_release(out);
    }
    if (!ok) fprintf(stderr, "  %s\n", sg_last_error(ctx));
    char name[64];
    snprintf(name, sizeof name, "cu_gpt2_decode_l%lld", (long long)layers);
    if (ok && mode != SG_MODE_EAGER) ok = cuda_launches(g->decode_fn, name, launches);
    sg_release(token);
    sg_release(pos);
    gpt2_destroy(g);
    return ok;
}

static int argmax_of(const double *v, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b]) b = i;
    return b;
}

/* fold: SG_GEMV_ARGMAX=1, the greedy token's argmax and the token and
 * position updates inside the LM head's GEMV (2 launches fewer). */
static void test_gpt2(bool fold) {
    static double eager[G_STEPS * G_V], comp[G_STEPS * G_V], tmp[G_STEPS * G_V];
    int one = 0, two = 0;
    setenv("SG_GEMV_ARGMAX", fold ? "1" : "0", 1);
    bool ok = gpt2_run(2, SG_MODE_EAGER, eager, &two) &&
              gpt2_run(2, SG_MODE_REDUCE_OVERHEAD, comp, &two) &&
              gpt2_run(1, SG_MODE_REDUCE_OVERHEAD, tmp, &one);
    int per_layer = two - one;
    /* layer_norm + QKV GEMV + the K/V cache writes, attention, proj GEMV +
     * residual, layer_norm + fc GEMV + gelu, fcproj GEMV + residual; the two
     * residuals loaded with x, right after the wait. */
    ok = ok && TU_EXPECT(per_layer <= 5) && TU_EXPECT(!fold || one == per_layer + 2) &&
         TU_EXPECT(last_epre >= 2) &&
         tu_close("gpt2 decode logits", comp, eager, G_STEPS * G_V, BF16_TOL, BF16_TOL);
    for (int s = 0; ok && s < G_STEPS; s++)
        ok = TU_EXPECT(argmax_of(comp + s * G_V, G_V) == argmax_of(eager + s * G_V, G_V));
    tu_case(ok,
            "GPT2_DECODE_LAUNCHES(bf16,C=%d,NH=%d,V=%d,batch=1,%d steps%s) -> %d per layer "
            "(1 layer: %d, 2 layers: %d), logits as eager's",
            G_C, G_NH, G_V, G_STEPS, fold ? ",argmax in the LM head" : "", per_layer, one, two);
    unsetenv("SG_GEMV_ARGMAX");
}

/* SG_CUDA_STAMPS: the same GPT-2 step's unit has a stamp recorder in every
 * kernel and still compiles (NVRTC, sm_90); its logits are eager's. */
static void test_stamps(void) {
    static double eager[G_STEPS * G_V], comp[G_STEPS * G_V];
    int n = 0;
    setenv("SG_CUDA_STAMPS", "2", 1);
    bool ok =
        gpt2_run(1, SG_MODE_EAGER, eager, &n) && gpt2_run(1, SG_MODE_REDUCE_OVERHEAD, comp, &n);
    unsetenv("SG_CUDA_STAMPS");
    ok = ok && TU_EXPECT(last_kernels > 0) && TU_EXPECT(last_stamped == last_kernels) &&
         tu_close("stamped gpt2 decode logits", comp, eager, G_STEPS * G_V, BF16_TOL, BF16_TOL);
    tu_case(ok, "GPT2_DECODE_STAMPED(SG_CUDA_STAMPS=2: %d of %d kernels stamp%s)", last_stamped,
            last_kernels, nvrtc_missing ? "; NVRTC missing, not compiled" : ", compiled for sm_90");
}

/* ------------------------------------------------------------ Llama-style */

enum { D = 512, HQ = 8, HKV = 2, HD = 64, F = 1024, V = 128, S = 16, NQKV = (HQ + 2 * HKV) * HD };
#define LL_MAX 2
#define EPS 1e-5

typedef struct llama {
    int layers;
    int style; /* 0: the fused forms; 1: as a user first writes it (below); 2: 1 with the norms
                  written out of primitives; 3: as a port of Hugging Face's eager Llama */
    sg_tensor *g1[LL_MAX], *wqkv[LL_MAX], *wo[LL_MAX], *g2[LL_MAX], *w1[LL_MAX], *w3[LL_MAX],
        *w2[LL_MAX], *kc[LL_MAX], *vc[LL_MAX], *gf, *wout, *cos, *sin, *slots;
    sg_tensor *wq[LL_MAX], *wk[LL_MAX], *wv[LL_MAX]; /* style 3: wqkv's rows as tensors apart */
    double *g1v[LL_MAX], *wqkvv[LL_MAX], *wov[LL_MAX], *g2v[LL_MAX], *w1v[LL_MAX], *w3v[LL_MAX],
        *w2v[LL_MAX], *gfv, *woutv, *cosv, *sinv;
} llama;

/* t (1, H, 1, HD) rotated by the position's angles c, s (1, 1, 1, HD/2). */
static sg_tensor *rotate(sg_tensor *t, sg_tensor *c, sg_tensor *s) {
    sg_tensor *a = sg_narrow(t, 3, 0, HD / 2), *b = sg_narrow(t, 3, HD / 2, HD / 2);
    sg_tensor *h[2] = {sg_sub(sg_mul(a, c), sg_mul(b, s)), sg_add(sg_mul(b, c), sg_mul(a, s))};
    return sg_concat(2, h, 3);
}

/* (1, 1, H * HD) -> (1, H, 1, HD) */
static sg_tensor *heads(sg_tensor *t, int64_t h) {
    int64_t sh[4] = {1, 1, h, HD};
    return sg_transpose(sg_reshape(t, 4, sh), 1, 2);
}

/* An rms_norm, or the same written out: x * rsqrt(mean(x * x) + eps) * g. */
static sg_tensor *llama_norm(const llama *m, sg_tensor *x, sg_tensor *g) {
    if (m->style < 2) return sg_rms_norm(x, g, EPS);
    int last = -1;
    sg_tensor *ms = sg_mean(sg_mul(x, x), 1, &last, true);
    return sg_mul(sg_mul(x, sg_rsqrt(sg_add_scalar(ms, EPS))), g);
}

/* The block as a user first writes it: q, k and v sliced from the QKV
 * projection, q and k rotated apart, the cache written at pos and attention
 * through sg_sdpa over the whole cache with a mask of the slots <= pos (as
 * examples/kv_decode.c), K/V with fewer heads than Q. */
static sg_status llama_step_plain(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    const llama *m = user;
    sg_tensor *x = in[0], *pos = in[1];
    int64_t rs[4] = {1, 1, 1, HD / 2}, flat[3] = {1, 1, HQ * HD};
    sg_tensor *cs = sg_reshape(sg_index_select(m->cos, 0, pos), 4, rs);
    sg_tensor *sn = sg_reshape(sg_index_select(m->sin, 0, pos), 4, rs);
    sg_tensor *mask = sg_le(m->slots, pos); /* (S): the slots written so far */
    for (int l = 0; l < m->layers; l++) {
        sg_tensor *qkv = sg_linear(llama_norm(m, x, m->g1[l]), m->wqkv[l], NULL);
        sg_tensor *q = rotate(heads(sg_narrow(qkv, 2, 0, HQ * HD), HQ), cs, sn);
        sg_tensor *k = rotate(heads(sg_narrow(qkv, 2, HQ * HD, HKV * HD), HKV), cs, sn);
        sg_tensor *v = heads(sg_narrow(qkv, 2, (HQ + HKV) * HD, HKV * HD), HKV);
        sg_status st = sg_index_copy_(m->kc[l], 2, pos, k);
        if (st == SG_OK) st = sg_index_copy_(m->vc[l], 2, pos, v);
        if (st != SG_OK) return st;
        sg_tensor *a = sg_sdpa(q, m->kc[l], m->vc[l], mask, false, 0.0);
        x = sg_add(x, sg_linear(sg_reshape(sg_transpose(a, 1, 2), 3, flat), m->wo[l], NULL));
        sg_tensor *h = llama_norm(m, x, m->g2[l]);
        sg_tensor *u = sg_mul(sg_silu(sg_linear(h, m->w1[l], NULL)), sg_linear(h, m->w3[l], NULL));
        x = sg_add(x, sg_linear(u, m->w2[l], NULL));
    }
    out[0] = sg_linear(llama_norm(m, x, m->gf), m->wout, NULL);
    return out[0] ? SG_OK : sg_ctx_status(c);
}

/* Hugging Face's LlamaRMSNorm: in f32, the weight times the result cast back. */
static sg_tensor *hf_norm(sg_tensor *x, sg_tensor *g) {
    sg_tensor *h = sg_cast(x, SG_F32);
    int last = -1;
    sg_tensor *var = sg_mean(sg_pow_scalar(h, 2), 1, &last, true);
    h = sg_mul(h, sg_rsqrt(sg_add_scalar(var, EPS)));
    return sg_mul(g, sg_cast(h, SG_BF16));
}

/* rotate_half: cat(-x2, x1) over the head dim. */
static sg_tensor *rotate_half(sg_tensor *t) {
    sg_tensor *h[2] = {sg_neg(sg_narrow(t, 3, HD / 2, HD / 2)), sg_narrow(t, 3, 0, HD / 2)};
    return sg_concat(2, h, 3);
}

/* The block as a port of Hugging Face's eager Llama (or llama2.c) writes it:
 * q, k and v from three projections of their own, rotary embeddings as
 * q * cos + rotate_half(q) * sin over full-width tables, K/V repeated for
 * the query heads, attention written out (q @ k^T / sqrt(d), masked_fill of
 * the slots > pos with -inf, softmax in f32, @ v), the norms in f32. */
static sg_status llama_step_hf(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    const llama *m = user;
    sg_tensor *x = in[0], *pos = in[1];
    int64_t rs[4] = {1, 1, 1, HD / 2}, flat[3] = {1, 1, HQ * HD};
    sg_tensor *cs = sg_reshape(sg_index_select(m->cos, 0, pos), 4, rs);
    sg_tensor *sn = sg_reshape(sg_index_select(m->sin, 0, pos), 4, rs);
    sg_tensor *cc[2] = {cs, cs}, *ss[2] = {sn, sn};
    sg_tensor *cf = sg_concat(2, cc, 3), *sf = sg_concat(2, ss, 3);
    sg_tensor *drop = sg_gt(m->slots, pos); /* (S): the slots not written yet */
    for (int l = 0; l < m->layers; l++) {
        sg_tensor *h = hf_norm(x, m->g1[l]);
        sg_tensor *q = heads(sg_linear(h, m->wq[l], NULL), HQ);
        sg_tensor *k = heads(sg_linear(h, m->wk[l], NULL), HKV);
        q = sg_add(sg_mul(q, cf), sg_mul(rotate_half(q), sf));
        k = sg_add(sg_mul(k, cf), sg_mul(rotate_half(k), sf));
        /* v's projection after the rotary (it runs with q's and k's all the same) */
        sg_tensor *v = heads(sg_linear(h, m->wv[l], NULL), HKV);
        sg_status st = sg_index_copy_(m->kc[l], 2, pos, k);
        if (st == SG_OK) st = sg_index_copy_(m->vc[l], 2, pos, v);
        if (st != SG_OK) return st;
        sg_tensor *kr = sg_repeat_interleave(m->kc[l], HQ / HKV, 1);
        sg_tensor *vr = sg_repeat_interleave(m->vc[l], HQ / HKV, 1);
        sg_tensor *sc = sg_div_scalar(sg_matmul(q, sg_transpose(kr, 2, 3)), sqrt((double)HD));
        sc = sg_masked_fill(sc, drop, -INFINITY);
        sg_tensor *a = sg_matmul(sg_cast(sg_softmax(sg_cast(sc, SG_F32), -1), SG_BF16), vr);
        x = sg_add(x, sg_linear(sg_reshape(sg_transpose(a, 1, 2), 3, flat), m->wo[l], NULL));
        h = hf_norm(x, m->g2[l]);
        sg_tensor *u = sg_mul(sg_silu(sg_linear(h, m->w1[l], NULL)), sg_linear(h, m->w3[l], NULL));
        x = sg_add(x, sg_linear(u, m->w2[l], NULL));
    }
    out[0] = sg_linear(hf_norm(x, m->gf), m->wout, NULL);
    return out[0] ? SG_OK : sg_ctx_status(c);
}

/* in: x (1, 1, D), pos (1) i64 -> logits (1, 1, V); K and V at pos. */
static sg_status llama_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    const llama *m = user;
    sg_tensor *x = in[0], *pos = in[1];
    int64_t rs[4] = {1, 1, 1, HD / 2}, flat[3] = {1, 1, HQ * HD};
    sg_tensor *cs = sg_reshape(sg_index_select(m->cos, 0, pos), 4, rs);
    sg_tensor *sn = sg_reshape(sg_index_select(m->sin, 0, pos), 4, rs);
    sg_tensor *kv_len = sg_add_scalar(sg_reshape(pos, 0, NULL), 1);
    for (int l = 0; l < m->layers; l++) {
        sg_tensor *qkv = sg_linear(sg_rms_norm(x, m->g1[l], EPS), m->wqkv[l], NULL);
        /* The query and key heads rotate together (one rotation, one concat). */
        sg_tensor *qk = rotate(heads(sg_narrow(qkv, 2, 0, (HQ + HKV) * HD), HQ + HKV), cs, sn);
        sg_tensor *q = sg_narrow(qk, 1, 0, HQ), *k = sg_narrow(qk, 1, HQ, HKV);
        sg_tensor *v = heads(sg_narrow(qkv, 2, (HQ + HKV) * HD, HKV * HD), HKV);
        sg_status st = sg_index_copy_(m->kc[l], 2, pos, k);
        if (st == SG_OK) st = sg_index_copy_(m->vc[l], 2, pos, v);
        if (st != SG_OK) return st;
        sg_tensor *a = sg_sdpa_cached(q, m->kc[l], m->vc[l], kv_len, 0.0);
        x = sg_add(x, sg_linear(sg_reshape(sg_transpose(a, 1, 2), 3, flat), m->wo[l], NULL));
        sg_tensor *h = sg_rms_norm(x, m->g2[l], EPS);
        sg_tensor *u = sg_mul(sg_silu(sg_linear(h, m->w1[l], NULL)), sg_linear(h, m->w3[l], NULL));
        x = sg_add(x, sg_linear(u, m->w2[l], NULL));
    }
    out[0] = sg_linear(sg_rms_norm(x, m->gf, EPS), m->wout, NULL);
    return out[0] ? SG_OK : sg_ctx_status(c);
}

/* ---- the f64 reference */

static void ref_norm(const double *x, const double *g, double *y) {
    double ss = 0;
    for (int i = 0; i < D; i++) ss += x[i] * x[i];
    double r = 1 / sqrt(ss / D + EPS);
    for (int i = 0; i < D; i++) y[i] = x[i] * r * g[i];
}

/* y (n) = w (n, k) x (k) */
static void ref_linear(const double *x, const double *w, int n, int k, double *y) {
    for (int i = 0; i < n; i++) {
        double s = 0;
        for (int j = 0; j < k; j++) s += w[(int64_t)i * k + j] * x[j];
        y[i] = s;
    }
}

static void ref_rotate(double *t, const double *c, const double *s) {
    for (int i = 0; i < HD / 2; i++) {
        double a = t[i], b = t[i + HD / 2];
        t[i] = a * c[i] - b * s[i];
        t[i + HD / 2] = b * c[i] + a * s[i];
    }
}

/* One step at position p: kc, vc (layers, HKV, S, HD) updated, logits out. */
static void ref_step(const llama *m, const double *x0, int p, double *kc, double *vc,
                     double *logits) {
    static double x[D], h[D], qkv[NQKV], att[HQ * HD], o[D], a[F], b[F];
    memcpy(x, x0, sizeof x);
    const double *c = m->cosv + p * HD / 2, *s = m->sinv + p * HD / 2;
    for (int l = 0; l < m->layers; l++) {
        ref_norm(x, m->g1v[l], h);
        ref_linear(h, m->wqkvv[l], NQKV, D, qkv);
        for (int hh = 0; hh < HQ + HKV; hh++) ref_rotate(qkv + hh * HD, c, s);
        double *K = kc + (int64_t)l * HKV * S * HD, *Vc = vc + (int64_t)l * HKV * S * HD;
        for (int hh = 0; hh < HKV; hh++)
            for (int d = 0; d < HD; d++) {
                K[(hh * S + p) * HD + d] = qkv[(HQ + hh) * HD + d];
                Vc[(hh * S + p) * HD + d] = qkv[(HQ + HKV + hh) * HD + d];
            }
        for (int hq = 0; hq < HQ; hq++) {
            const double *q = qkv + hq * HD;
            int hk = hq / (HQ / HKV);
            double sc[S], mx = -INFINITY, sum = 0;
            for (int j = 0; j <= p; j++) {
                double d = 0;
                for (int e = 0; e < HD; e++) d += q[e] * K[(hk * S + j) * HD + e];
                sc[j] = d / sqrt((double)HD);
                mx = fmax(mx, sc[j]);
            }
            for (int j = 0; j <= p; j++) sum += sc[j] = exp(sc[j] - mx);
            for (int e = 0; e < HD; e++) {
                double acc = 0;
                for (int j = 0; j <= p; j++) acc += sc[j] / sum * Vc[(hk * S + j) * HD + e];
                att[hq * HD + e] = acc;
            }
        }
        ref_linear(att, m->wov[l], D, HQ * HD, o);
        for (int i = 0; i < D; i++) x[i] += o[i];
        ref_norm(x, m->g2v[l], h);
        ref_linear(h, m->w1v[l], F, D, a);
        ref_linear(h, m->w3v[l], F, D, b);
        for (int i = 0; i < F; i++) a[i] = a[i] / (1 + exp(-a[i])) * b[i];
        ref_linear(a, m->w2v[l], D, F, o);
        for (int i = 0; i < D; i++) x[i] += o[i];
    }
    ref_norm(x, m->gfv, h);
    ref_linear(h, m->woutv, V, D, logits);
}

static void llama_init(llama *m, int layers, int style) {
    memset(m, 0, sizeof *m);
    m->layers = layers;
    m->style = style;
    m->slots = sg_arange(ctx, SG_I64, 0, S, 1);
    int64_t d = D, qs[2] = {NQKV, D}, os[2] = {D, HQ * HD}, us[2] = {F, D}, ds[2] = {D, F},
            vs[2] = {V, D}, cs[4] = {1, HKV, S, HD}, ts[2] = {S, HD / 2};
    for (int l = 0; l < layers; l++) {
        m->g1[l] = tu_rand(ctx, SG_BF16, 1, &d, 0.8, 1.2, &m->g1v[l]);
        m->wqkv[l] = tu_rand(ctx, SG_BF16, 2, qs, -0.08, 0.08, &m->wqkvv[l]);
        m->wo[l] = tu_rand(ctx, SG_BF16, 2, os, -0.05, 0.05, &m->wov[l]);
        m->g2[l] = tu_rand(ctx, SG_BF16, 1, &d, 0.8, 1.2, &m->g2v[l]);
        m->w1[l] = tu_rand(ctx, SG_BF16, 2, us, -0.05, 0.05, &m->w1v[l]);
        m->w3[l] = tu_rand(ctx, SG_BF16, 2, us, -0.05, 0.05, &m->w3v[l]);
        m->w2[l] = tu_rand(ctx, SG_BF16, 2, ds, -0.05, 0.05, &m->w2v[l]);
        if (style == 3) {
            sg_tensor *n[3] = {sg_narrow(m->wqkv[l], 0, 0, HQ * HD),
                               sg_narrow(m->wqkv[l], 0, HQ * HD, HKV * HD),
                               sg_narrow(m->wqkv[l], 0, (HQ + HKV) * HD, HKV * HD)};
            m->wq[l] = sg_contiguous(n[0]), m->wk[l] = sg_contiguous(n[1]);
            m->wv[l] = sg_contiguous(n[2]);
            for (int i = 0; i < 3; i++) sg_release(n[i]);
        }
        m->kc[l] = sg_zeros(ctx, SG_BF16, 4, cs);
        m->vc[l] = sg_zeros(ctx, SG_BF16, 4, cs);
    }
    m->gf = tu_rand(ctx, SG_BF16, 1, &d, 0.8, 1.2, &m->gfv);
    m->wout = tu_rand(ctx, SG_BF16, 2, vs, -0.1, 0.1, &m->woutv);
    /* The angles of positions 0 .. S-1 (rounded to bf16 as the tables hold them). */
    uint16_t c[S * HD / 2], s[S * HD / 2];
    m->cosv = malloc(sizeof(double) * S * HD / 2);
    m->sinv = malloc(sizeof(double) * S * HD / 2);
    for (int p = 0; p < S; p++)
        for (int i = 0; i < HD / 2; i++) {
            double ang = p * pow(10000.0, -2.0 * i / HD);
            tu_store(c, SG_BF16, p * HD / 2 + i, cos(ang));
            tu_store(s, SG_BF16, p * HD / 2 + i, sin(ang));
            m->cosv[p * HD / 2 + i] = tu_load(c, SG_BF16, p * HD / 2 + i);
            m->sinv[p * HD / 2 + i] = tu_load(s, SG_BF16, p * HD / 2 + i);
        }
    m->cos = sg_from_host(ctx, SG_BF16, 2, ts, c);
    m->sin = sg_from_host(ctx, SG_BF16, 2, ts, s);
}

static void llama_free(llama *m) {
    for (int l = 0; l < m->layers; l++) {
        sg_tensor *t[9] = {m->g1[l], m->wqkv[l], m->wo[l], m->g2[l], m->w1[l],
                           m->w3[l], m->w2[l],   m->kc[l], m->vc[l]};
        double *v[7] = {m->g1v[l], m->wqkvv[l], m->wov[l], m->g2v[l],
                        m->w1v[l], m->w3v[l],   m->w2v[l]};
        for (int i = 0; i < 9; i++) sg_release(t[i]);
        sg_release(m->wq[l]), sg_release(m->wk[l]), sg_release(m->wv[l]);
        for (int i = 0; i < 7; i++) free(v[i]);
    }
    sg_release(m->gf), sg_release(m->wout), sg_release(m->cos), sg_release(m->sin);
    sg_release(m->slots);
    free(m->gfv), free(m->woutv), free(m->cosv), free(m->sinv);
}

/*
 * A decode model for decode_run: its step (in: x (1, 1, width) bf16, pos (1)
 * i64 -> logits (1, 1, vocab)) and its f64 reference, which takes the
 * caches (cache_len doubles each) and updates them at position p.
 */
typedef struct decode_model {
    sg_step_fn step;
    void *m;
    int64_t width, vocab, cache_len;
    void (*ref)(const void *m, const double *x0, int p, double *kc, double *vc, double *logits);
} decode_model;

/* Three steps (positions 0, 1, 2) of d compiled against its reference; the
 * launches of its capture on CUDA (name: the unit's). */
static bool decode_run(const decode_model *d, const char *name, int *launches) {
    sg_fn *fn = NULL;
    bool ok = TU_EXPECT(sg_compile(ctx, d->step, d->m, 2, 1,
                                   &(sg_compile_opts){.mode = SG_MODE_REDUCE_OVERHEAD}, &fn) == SG_OK);
    double *kc = calloc((size_t)d->cache_len, sizeof(double));
    double *vc = calloc((size_t)d->cache_len, sizeof(double));
    double *ref = calloc((size_t)d->vocab, sizeof(double));
    int64_t xs[3] = {1, 1, d->width}, one = 1;
    for (int p = 0; ok && p < 3; p++) {
        double *xv = NULL;
        int64_t pp = p;
        sg_tensor *in[2] = {tu_rand(ctx, SG_BF16, 3, xs, -1, 1, &xv),
                            sg_from_host(ctx, SG_I64, 1, &one, &pp)};
        sg_tensor *out[1] = {NULL};
        sg_mark_step_begin(ctx);
        ok = TU_EXPECT(sg_call(fn, in, 2, out, 1) == SG_OK);
        if (!ok) fprintf(stderr, "  %s\n", sg_last_error(ctx));
        d->ref(d->m, xv, p, kc, vc, ref);
        double *got = ok ? tu_read(out[0]) : NULL;
        ok = ok && TU_EXPECT(got != NULL) &&
             tu_close(name, got, ref, d->vocab, BF16_TOL, BF16_TOL);
        free(got);
        free(xv);
        sg_release(in[0]);
        sg_release(in[1]);
    }
    ok = ok && cuda_launches(fn, name, launches);
    sg_fn_destroy(fn);
    free(kc), free(vc), free(ref);
    return ok;
}

static void llama_ref(const void *m, const double *x0, int p, double *kc, double *vc,
                      double *logits) {
    ref_step(m, x0, p, kc, vc, logits);
}

static bool llama_run(int layers, int style, int *launches) {
    static llama m;
    tu_seed(100 + (uint64_t)layers);
    llama_init(&m, layers, style);
    decode_model d = {style == 3 ? llama_step_hf
                      : style    ? llama_step_plain
                                 : llama_step,
                      &m,
                      D,
                      V,
                      (int64_t)layers * HKV * S * HD,
                      llama_ref};
    char name[64];
    snprintf(name, sizeof name, "cu_llama%d_decode_l%d", style, layers);
    bool ok = decode_run(&d, name, launches);
    llama_free(&m);
    return ok;
}

static void test_llama(int style) {
    int one = 0, two = 0;
    bool ok = llama_run(1, style, &one) && llama_run(2, style, &two);
    int per_layer = two - one;
    /* rms_norm + QKV GEMV, the rotated halves + their concat + the K/V
     * cache writes (one chain kernel in one block), attention, o-proj GEMV
     * + residual, rms_norm + w1 and w3 GEMVs + silu * mul (one kernel, two
     * products per column), w2 GEMV + residual. */
    ok = ok && TU_EXPECT(per_layer <= 6);
    static const char *const how[] = {
        "", ",q and k rotated apart,sdpa with a slot mask",
        ",q and k rotated apart,sdpa with a slot mask,rms written out",
        ",as Hugging Face's eager Llama: q/k/v projections apart,"
        "rotate_half,repeat_kv,attention written out with "
        "masked_fill,norms in f32"};
    tu_case(ok,
            "LLAMA_DECODE_LAUNCHES(bf16,D=%d,HQ=%d,HKV=%d,HD=%d,F=%d,S=%d,batch=1,3 positions%s) "
            "-> %d per layer (1 layer: %d, 2 layers: %d), logits as f64's",
            D, HQ, HKV, HD, F, S, how[style], per_layer, one, two);
}

/* ------------------------------------------------------------ GPT-2 as written by hand */

/* A GPT-2 block written from primitives as a user ports it: layer_norm as
 * (x - mean) * rsqrt(mean((x - mean)^2) + eps) * w + b, GELU's tanh form
 * spelled out, attention through sg_sdpa over the whole cache with a slot
 * mask; decode at batch 1. */
enum { P_C = 256, P_NH = 4, P_HD = P_C / P_NH, P_V = 96, P_S = 16, P_LMAX = 2 };

typedef struct plain2 {
    int layers;
    sg_tensor *lw[P_LMAX][2], *lb[P_LMAX][2], *wqkv[P_LMAX], *bqkv[P_LMAX], *wo[P_LMAX],
        *bo[P_LMAX], *wfc[P_LMAX], *bfc[P_LMAX], *wpr[P_LMAX], *bpr[P_LMAX], *kc[P_LMAX],
        *vc[P_LMAX], *fw, *fb, *wte, *slots;
    double *lwv[P_LMAX][2], *lbv[P_LMAX][2], *wqkvv[P_LMAX], *bqkvv[P_LMAX], *wov[P_LMAX],
        *bov[P_LMAX], *wfcv[P_LMAX], *bfcv[P_LMAX], *wprv[P_LMAX], *bprv[P_LMAX], *fwv, *fbv, *wtev;
} plain2;

static sg_tensor *ln_written(sg_tensor *x, sg_tensor *w, sg_tensor *b) {
    int last = -1;
    sg_tensor *xc = sg_sub(x, sg_mean(x, 1, &last, true));
    sg_tensor *v = sg_mean(sg_mul(xc, xc), 1, &last, true);
    return sg_add(sg_mul(sg_mul(xc, sg_rsqrt(sg_add_scalar(v, EPS))), w), b);
}

static sg_tensor *gelu_written(sg_tensor *x) { /* 0.5 x (1 + tanh(0.79788 (x + 0.044715 x^3))) */
    sg_tensor *in = sg_add(x, sg_mul_scalar(sg_mul(sg_mul(x, x), x), 0.044715));
    sg_tensor *t = sg_tanh(sg_mul_scalar(in, 0.7978845608028654));
    return sg_mul(sg_mul_scalar(x, 0.5), sg_add_scalar(t, 1.0));
}

/* in: x (1, 1, C), pos (1) i64 -> logits (1, 1, V); K and V at pos. */
static sg_status plain2_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    const plain2 *m = user;
    sg_tensor *x = in[0], *pos = in[1], *mask = sg_le(m->slots, pos);
    int64_t flat[3] = {1, 1, P_C}, hs[4] = {1, 1, P_NH, P_HD};
    for (int l = 0; l < m->layers; l++) {
        sg_tensor *qkv = sg_linear(ln_written(x, m->lw[l][0], m->lb[l][0]), m->wqkv[l], m->bqkv[l]);
        sg_tensor *hd[3];
        for (int i = 0; i < 3; i++)
            hd[i] = sg_transpose(sg_reshape(sg_narrow(qkv, 2, i * P_C, P_C), 4, hs), 1, 2);
        sg_status st = sg_index_copy_(m->kc[l], 2, pos, hd[1]);
        if (st == SG_OK) st = sg_index_copy_(m->vc[l], 2, pos, hd[2]);
        if (st != SG_OK) return st;
        sg_tensor *a = sg_sdpa(hd[0], m->kc[l], m->vc[l], mask, false, 0.0);
        x = sg_add(x, sg_linear(sg_reshape(sg_transpose(a, 1, 2), 3, flat), m->wo[l], m->bo[l]));
        sg_tensor *h = gelu_written(sg_linear(ln_written(x, m->lw[l][1], m->lb[l][1]), m->wfc[l],
                                              m->bfc[l]));
        x = sg_add(x, sg_linear(h, m->wpr[l], m->bpr[l]));
    }
    out[0] = sg_linear(ln_written(x, m->fw, m->fb), m->wte, NULL);
    return out[0] ? SG_OK : sg_ctx_status(c);
}

static void ref_ln(const double *x, const double *w, const double *b, double *y) {
    double m = 0, q = 0;
    for (int i = 0; i < P_C; i++) m += x[i];
    m /= P_C;
    for (int i = 0; i < P_C; i++) q += (x[i] - m) * (x[i] - m);
    double r = 1 / sqrt(q / P_C + EPS);
    for (int i = 0; i < P_C; i++) y[i] = (x[i] - m) * r * w[i] + b[i];
}

static void ref_affine(const double *x, const double *w, const double *b, int n, int k,
                       double *y) {
    ref_linear(x, w, n, k, y);
    for (int i = 0; b && i < n; i++) y[i] += b[i];
}

/* One step at position p: the caches (layers, NH, S, HD) updated, logits out. */
static void ref_plain2(const plain2 *m, const double *x0, int p, double *kc, double *vc,
                       double *logits) {
    static double x[P_C], h[P_C], qkv[3 * P_C], att[P_C], o[P_C], f[4 * P_C];
    memcpy(x, x0, sizeof x);
    for (int l = 0; l < m->layers; l++) {
        ref_ln(x, m->lwv[l][0], m->lbv[l][0], h);
        ref_affine(h, m->wqkvv[l], m->bqkvv[l], 3 * P_C, P_C, qkv);
        double *K = kc + (int64_t)l * P_NH * P_S * P_HD, *Vc = vc + (int64_t)l * P_NH * P_S * P_HD;
        for (int hh = 0; hh < P_NH; hh++)
            for (int d = 0; d < P_HD; d++) {
                K[(hh * P_S + p) * P_HD + d] = qkv[P_C + hh * P_HD + d];
                Vc[(hh * P_S + p) * P_HD + d] = qkv[2 * P_C + hh * P_HD + d];
            }
        for (int hh = 0; hh < P_NH; hh++) {
            double sc[P_S], mx = -INFINITY, sum = 0;
            for (int j = 0; j <= p; j++) {
                double d = 0;
                for (int e = 0; e < P_HD; e++) d += qkv[hh * P_HD + e] * K[(hh * P_S + j) * P_HD + e];
                sc[j] = d / sqrt((double)P_HD);
                mx = fmax(mx, sc[j]);
            }
            for (int j = 0; j <= p; j++) sum += sc[j] = exp(sc[j] - mx);
            for (int e = 0; e < P_HD; e++) {
                double acc = 0;
                for (int j = 0; j <= p; j++) acc += sc[j] / sum * Vc[(hh * P_S + j) * P_HD + e];
                att[hh * P_HD + e] = acc;
            }
        }
        ref_affine(att, m->wov[l], m->bov[l], P_C, P_C, o);
        for (int i = 0; i < P_C; i++) x[i] += o[i];
        ref_ln(x, m->lwv[l][1], m->lbv[l][1], h);
        ref_affine(h, m->wfcv[l], m->bfcv[l], 4 * P_C, P_C, f);
        for (int i = 0; i < 4 * P_C; i++)
            f[i] = 0.5 * f[i] * (1 + tanh(0.7978845608028654 * (f[i] + 0.044715 * pow(f[i], 3))));
        ref_affine(f, m->wprv[l], m->bprv[l], P_C, 4 * P_C, o);
        for (int i = 0; i < P_C; i++) x[i] += o[i];
    }
    ref_ln(x, m->fwv, m->fbv, h);
    ref_linear(h, m->wtev, P_V, P_C, logits);
}

static void plain2_init(plain2 *m, int layers) {
    memset(m, 0, sizeof *m);
    m->layers = layers;
    int64_t c = P_C, c3 = 3 * P_C, c4 = 4 * P_C, qs[2] = {3 * P_C, P_C}, os[2] = {P_C, P_C},
            fs[2] = {4 * P_C, P_C}, ps[2] = {P_C, 4 * P_C}, vs[2] = {P_V, P_C},
            cs[4] = {1, P_NH, P_S, P_HD};
    for (int l = 0; l < layers; l++) {
        for (int k = 0; k < 2; k++) {
            m->lw[l][k] = tu_rand(ctx, SG_BF16, 1, &c, 0.8, 1.2, &m->lwv[l][k]);
            m->lb[l][k] = tu_rand(ctx, SG_BF16, 1, &c, -0.1, 0.1, &m->lbv[l][k]);
        }
        m->wqkv[l] = tu_rand(ctx, SG_BF16, 2, qs, -0.08, 0.08, &m->wqkvv[l]);
        m->bqkv[l] = tu_rand(ctx, SG_BF16, 1, &c3, -0.1, 0.1, &m->bqkvv[l]);
        m->wo[l] = tu_rand(ctx, SG_BF16, 2, os, -0.06, 0.06, &m->wov[l]);
        m->bo[l] = tu_rand(ctx, SG_BF16, 1, &c, -0.1, 0.1, &m->bov[l]);
        m->wfc[l] = tu_rand(ctx, SG_BF16, 2, fs, -0.06, 0.06, &m->wfcv[l]);
        m->bfc[l] = tu_rand(ctx, SG_BF16, 1, &c4, -0.1, 0.1, &m->bfcv[l]);
        m->wpr[l] = tu_rand(ctx, SG_BF16, 2, ps, -0.03, 0.03, &m->wprv[l]);
        m->bpr[l] = tu_rand(ctx, SG_BF16, 1, &c, -0.1, 0.1, &m->bprv[l]);
        m->kc[l] = sg_zeros(ctx, SG_BF16, 4, cs);
        m->vc[l] = sg_zeros(ctx, SG_BF16, 4, cs);
    }
    m->fw = tu_rand(ctx, SG_BF16, 1, &c, 0.8, 1.2, &m->fwv);
    m->fb = tu_rand(ctx, SG_BF16, 1, &c, -0.1, 0.1, &m->fbv);
    m->wte = tu_rand(ctx, SG_BF16, 2, vs, -0.1, 0.1, &m->wtev);
    m->slots = sg_arange(ctx, SG_I64, 0, P_S, 1);
}

static void plain2_free(plain2 *m) {
    for (int l = 0; l < m->layers; l++) {
        sg_tensor *t[14] = {m->lw[l][0], m->lw[l][1], m->lb[l][0], m->lb[l][1], m->wqkv[l],
                            m->bqkv[l],  m->wo[l],    m->bo[l],    m->wfc[l],   m->bfc[l],
                            m->wpr[l],   m->bpr[l],   m->kc[l],    m->vc[l]};
        double *v[12] = {m->lwv[l][0], m->lwv[l][1], m->lbv[l][0], m->lbv[l][1],
                         m->wqkvv[l],  m->bqkvv[l],  m->wov[l],    m->bov[l],
                         m->wfcv[l],   m->bfcv[l],   m->wprv[l],   m->bprv[l]};
        for (int i = 0; i < 14; i++) sg_release(t[i]);
        for (int i = 0; i < 12; i++) free(v[i]);
    }
    sg_release(m->fw), sg_release(m->fb), sg_release(m->wte), sg_release(m->slots);
    free(m->fwv), free(m->fbv), free(m->wtev);
}

static void plain2_ref(const void *m, const double *x0, int p, double *kc, double *vc,
                       double *logits) {
    ref_plain2(m, x0, p, kc, vc, logits);
}

static bool plain2_run(int layers, int *launches) {
    static plain2 m;
    tu_seed(300 + (uint64_t)layers);
    plain2_init(&m, layers);
    decode_model d = {plain2_step, &m, P_C, P_V, (int64_t)layers * P_NH * P_S * P_HD, plain2_ref};
    char name[64];
    snprintf(name, sizeof name, "cu_gpt2_plain_decode_l%d", layers);
    bool ok = decode_run(&d, name, launches);
    plain2_free(&m);
    return ok;
}

static void test_gpt2_written(void) {
    int one = 0, two = 0;
    bool ok = plain2_run(1, &one) && plain2_run(2, &two);
    int per_layer = two - one;
    /* layer_norm + QKV GEMV + the K/V cache writes, attention, proj GEMV +
     * residual, layer_norm + fc GEMV + gelu, fcproj GEMV + residual. */
    ok = ok && TU_EXPECT(per_layer <= 5);
    tu_case(ok,
            "GPT2_WRITTEN_OUT_DECODE_LAUNCHES(bf16,C=%d,NH=%d,V=%d,S=%d,layer_norm and gelu "
            "written out,sdpa with a slot mask,3 positions) -> %d per layer (1 layer: %d, 2 "
            "layers: %d), logits as f64's",
            P_C, P_NH, P_V, P_S, per_layer, one, two);
}

/* ------------------------------------------------------------ in place */

enum { IP_D = 384, IP_N = 384 };

/* h += linear(rms_norm(h)) in place: the GEMV's epilogue writes what the
 * norm reads, so the two stay separate kernels (a merged kernel's blocks
 * would read h while others store it). */
static sg_status inplace_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)user;
    sg_status st = sg_add_(in[0], sg_linear(sg_rms_norm(in[0], in[1], EPS), in[2], NULL));
    out[0] = in[0];
    return st != SG_OK ? st : sg_ctx_status(c);
}

static void test_inplace(void) {
    tu_seed(5);
    int64_t hs[2] = {1, IP_D}, d = IP_D, ws[2] = {IP_N, IP_D};
    double *hv, *gv, *wv, ref[IP_D], x[IP_D], y[IP_N];
    sg_tensor *in[3] = {tu_rand(ctx, SG_BF16, 2, hs, -1, 1, &hv),
                        tu_rand(ctx, SG_BF16, 1, &d, 0.8, 1.2, &gv),
                        tu_rand(ctx, SG_BF16, 2, ws, -0.05, 0.05, &wv)};
    sg_fn *fn = NULL;
    bool ok =
        TU_EXPECT(sg_compile(ctx, inplace_step, NULL, 3, 1,
                             &(sg_compile_opts){.mode = SG_MODE_REDUCE_OVERHEAD}, &fn) == SG_OK);
    sg_tensor *out[1] = {NULL};
    sg_mark_step_begin(ctx);
    ok = ok && TU_EXPECT(sg_call(fn, in, 3, out, 1) == SG_OK);
    double ss = 0;
    for (int i = 0; i < IP_D; i++) ss += hv[i] * hv[i];
    for (int i = 0; i < IP_D; i++) x[i] = hv[i] / sqrt(ss / IP_D + EPS) * gv[i];
    ref_linear(x, wv, IP_N, IP_D, y);
    for (int i = 0; i < IP_D; i++) ref[i] = hv[i] + y[i];
    double *got = ok ? tu_read(in[0]) : NULL;
    ok = ok && TU_EXPECT(got != NULL) && tu_close("in place", got, ref, IP_D, BF16_TOL, BF16_TOL);
    int launches = 0;
    ok = ok && cuda_launches(fn, "cu_norm_gemv_inplace", &launches) && TU_EXPECT(launches == 2);
    tu_case(ok, "NORM_GEMV_INPLACE(bf16,h=[1,%d],w=[%d,%d]) -> %d launches (norm, GEMV)", IP_D,
            IP_N, IP_D, launches);
    free(got);
    free(hv), free(gv), free(wv);
    sg_fn_destroy(fn);
    for (int i = 0; i < 3; i++) sg_release(in[i]);
}

/* ------------------------------------------------------------ GEMV pair */

enum { PR_K = 256, PR_N = 320 };

/* Two linears on one x (no norm) meeting in an epilogue that is not
 * SwiGLU's, the first product also an output: one pair kernel. */
static sg_status pair_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)user;
    sg_tensor *a = sg_linear(in[0], in[1], NULL), *b = sg_linear(in[0], in[2], NULL);
    out[0] = sg_sub(sg_mul(sg_sigmoid(b), a), b);
    out[1] = a;
    return out[0] && out[1] ? SG_OK : sg_ctx_status(c);
}

static void test_pair(void) {
    tu_seed(9);
    int64_t xs[2] = {2, PR_K}, ws[2] = {PR_N, PR_K};
    double *xv, *w1v, *w3v, a[2 * PR_N], b[2 * PR_N], ref[2 * PR_N];
    sg_tensor *in[3] = {tu_rand(ctx, SG_BF16, 2, xs, -1, 1, &xv),
                        tu_rand(ctx, SG_BF16, 2, ws, -0.1, 0.1, &w1v),
                        tu_rand(ctx, SG_BF16, 2, ws, -0.1, 0.1, &w3v)};
    sg_fn *fn = NULL;
    bool ok =
        TU_EXPECT(sg_compile(ctx, pair_step, NULL, 3, 2,
                             &(sg_compile_opts){.mode = SG_MODE_REDUCE_OVERHEAD}, &fn) == SG_OK);
    sg_tensor *out[2] = {NULL, NULL};
    sg_mark_step_begin(ctx);
    ok = ok && TU_EXPECT(sg_call(fn, in, 3, out, 2) == SG_OK);
    for (int r = 0; r < 2; r++) {
        ref_linear(xv + r * PR_K, w1v, PR_N, PR_K, a + r * PR_N);
        ref_linear(xv + r * PR_K, w3v, PR_N, PR_K, b + r * PR_N);
    }
    for (int i = 0; i < 2 * PR_N; i++) ref[i] = a[i] / (1 + exp(-b[i])) - b[i];
    double *got = ok ? tu_read(out[0]) : NULL, *got_a = ok ? tu_read(out[1]) : NULL;
    ok = ok && TU_EXPECT(got && got_a) &&
         tu_close("pair epilogue", got, ref, 2 * PR_N, BF16_TOL, BF16_TOL) &&
         tu_close("pair first product", got_a, a, 2 * PR_N, BF16_TOL, BF16_TOL);
    int launches = 0;
    ok = ok && cuda_launches(fn, "cu_gemv_pair", &launches) && TU_EXPECT(launches == 1);
    tu_case(ok, "GEMV_PAIR(bf16,x=[2,%d],w1=w3=[%d,%d],sigmoid(b)*a-b, a an output) -> %d launches",
            PR_K, PR_N, PR_K, launches);
    free(got), free(got_a);
    free(xv), free(w1v), free(w3v);
    sg_fn_destroy(fn);
    for (int i = 0; i < 3; i++) sg_release(in[i]);
}

/* ------------------------------------------------------------ cache writes */

enum { CW_K = 256, CW_H = 2, CW_C = CW_H * HD, CW_S = 8 };

/* qkv = linear(x, w, b); its K and V heads into the caches at pos: one GEMV
 * kernel whose threads also write the caches. */
static sg_status copies_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)user;
    sg_tensor *qkv = sg_linear(in[0], in[1], in[2]);
    sg_tensor *k = heads(sg_narrow(qkv, 2, CW_C, CW_C), CW_H);
    sg_tensor *v = heads(sg_narrow(qkv, 2, 2 * CW_C, CW_C), CW_H);
    sg_status st = sg_index_copy_(in[3], 2, in[5], k);
    if (st == SG_OK) st = sg_index_copy_(in[4], 2, in[5], v);
    out[0] = qkv;
    return st != SG_OK ? st : sg_ctx_status(c);
}

static void test_copies(void) {
    tu_seed(11);
    int64_t xs[3] = {1, 1, CW_K}, ws[2] = {3 * CW_C, CW_K}, bs = 3 * CW_C,
            cs[4] = {1, CW_H, CW_S, HD}, one = 1, at[2] = {1, 6};
    double *xv, *wv, *bv, y[3 * CW_C], *kc = calloc(CW_H * CW_S * HD, sizeof(double)),
                                       *vc = calloc(CW_H * CW_S * HD, sizeof(double));
    sg_tensor *in[6] = {tu_rand(ctx, SG_BF16, 3, xs, -1, 1, &xv),
                        tu_rand(ctx, SG_BF16, 2, ws, -0.1, 0.1, &wv),
                        tu_rand(ctx, SG_BF16, 1, &bs, -0.5, 0.5, &bv),
                        sg_zeros(ctx, SG_BF16, 4, cs),
                        sg_zeros(ctx, SG_BF16, 4, cs),
                        NULL};
    sg_fn *fn = NULL;
    bool ok =
        TU_EXPECT(kc && vc) &&
        TU_EXPECT(sg_compile(ctx, copies_step, NULL, 6, 1,
                             &(sg_compile_opts){.mode = SG_MODE_REDUCE_OVERHEAD}, &fn) == SG_OK);
    ref_linear(xv, wv, 3 * CW_C, CW_K, y);
    for (int i = 0; i < 3 * CW_C; i++) y[i] += bv[i];
    for (int c = 0; ok && c < 2; c++) {
        in[5] = sg_from_host(ctx, SG_I64, 1, &one, &at[c]);
        sg_tensor *out[1] = {NULL};
        sg_mark_step_begin(ctx);
        ok = TU_EXPECT(sg_call(fn, in, 6, out, 1) == SG_OK);
        sg_release(in[5]);
        for (int h = 0; h < CW_H; h++)
            for (int d = 0; d < HD; d++) {
                kc[(h * CW_S + at[c]) * HD + d] = y[CW_C + h * HD + d];
                vc[(h * CW_S + at[c]) * HD + d] = y[2 * CW_C + h * HD + d];
            }
    }
    double *gk = ok ? tu_read(in[3]) : NULL, *gv = ok ? tu_read(in[4]) : NULL;
    ok = ok && TU_EXPECT(gk && gv) &&
         tu_close("K cache", gk, kc, CW_H * CW_S * HD, BF16_TOL, BF16_TOL) &&
         tu_close("V cache", gv, vc, CW_H * CW_S * HD, BF16_TOL, BF16_TOL);
    int launches = 0;
    ok = ok && cuda_launches(fn, "cu_gemv_copies", &launches) && TU_EXPECT(launches == 1);
    tu_case(ok,
            "GEMV_CACHE_WRITES(bf16,x=[1,1,%d],w=[%d,%d],caches=[1,%d,%d,%d],pos 1 then 6) -> %d "
            "launches",
            CW_K, 3 * CW_C, CW_K, CW_H, CW_S, HD, launches);
    free(gk), free(gv), free(kc), free(vc);
    free(xv), free(wv), free(bv);
    sg_fn_destroy(fn);
    for (int i = 0; i < 5; i++) sg_release(in[i]);
}

/* ------------------------------------------------------------ split K */

/* y = linear(x, w, b) + r, x first normalized by layer_norm(x, in[4],
 * in[5]) when user is not NULL: a long K over few columns, so that the
 * GEMV splits K over a group of warps per column. */
static sg_status split_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    sg_tensor *x = user ? sg_layer_norm(in[0], in[4], in[5], EPS) : in[0];
    out[0] = sg_add(sg_linear(x, in[1], in[2]), in[3]);
    return out[0] ? SG_OK : sg_ctx_status(c);
}

/* Row x of k elements through layer_norm(x, g, b), rounded to dt as the
 * GEMV's rows in shared memory are. */
static void ref_layer_norm(sg_dtype dt, double *x, int64_t k, const double *g, const double *b) {
    double m = 0, v = 0;
    for (int64_t j = 0; j < k; j++) m += x[j] / (double)k;
    for (int64_t j = 0; j < k; j++) v += (x[j] - m) * (x[j] - m) / (double)k;
    for (int64_t j = 0; j < k; j++) x[j] = tu_round(dt, (x[j] - m) / sqrt(v + EPS) * g[j] + b[j]);
}

/* One case: x (rows, k) of dt against w (n, k), N odd so that the last
 * block holds a column group past N; K a multiple of the 16-byte vector's
 * elements or not (the vector path or the element loop). */
/* mode: max-autotune too, whose block-size tuning must leave the split's
 * shared words (sized for 256 threads) alone. */
static void test_split(sg_dtype dt, int64_t rows, int64_t k, int64_t n, bool norm, sg_mode mode) {
    tu_seed(13);
    int64_t xs[2] = {rows, k}, ws[2] = {n, k}, ys[2] = {rows, n};
    double *xv, *wv, *bv, *rv, *gv = NULL, *nbv = NULL,
                               *ref = malloc(sizeof(double) * (size_t)(rows * n));
    sg_tensor *in[6] = {tu_rand(ctx, dt, 2, xs, -1, 1, &xv),
                        tu_rand(ctx, dt, 2, ws, -0.1, 0.1, &wv),
                        tu_rand(ctx, dt, 1, &n, -0.5, 0.5, &bv),
                        tu_rand(ctx, dt, 2, ys, -1, 1, &rv),
                        norm ? tu_rand(ctx, dt, 1, &k, 0.5, 1.5, &gv) : NULL,
                        norm ? tu_rand(ctx, dt, 1, &k, -0.5, 0.5, &nbv) : NULL};
    int nin = norm ? 6 : 4;
    sg_fn *fn = NULL;
    bool ok =
        TU_EXPECT(ref != NULL) &&
        TU_EXPECT(sg_compile(ctx, split_step, norm ? (void *)ctx : NULL, nin, 1,
                             &(sg_compile_opts){.mode = mode}, &fn) == SG_OK);
    sg_tensor *out[1] = {NULL};
    sg_mark_step_begin(ctx);
    ok = ok && TU_EXPECT(sg_call(fn, in, nin, out, 1) == SG_OK);
    for (int64_t r = 0; ok && norm && r < rows; r++) ref_layer_norm(dt, xv + r * k, k, gv, nbv);
    for (int64_t r = 0; ok && r < rows; r++) {
        ref_linear(xv + r * k, wv, (int)n, (int)k, ref + r * n);
        for (int64_t i = 0; i < n; i++) ref[r * n + i] += bv[i] + rv[r * n + i];
    }
    double tol = dt == SG_F32 ? 1e-5 : BF16_TOL, *got = ok ? tu_read(out[0]) : NULL;
    ok = ok && TU_EXPECT(got) && tu_close("split-K GEMV", got, ref, rows * n, tol, tol);
    int launches = 0;
    ok = ok && cuda_launches(fn, "cu_gemv_split", &launches) && TU_EXPECT(launches == 1) &&
         TU_EXPECT(last_split);
    tu_case(ok, "GEMV_SPLIT_K(%s,%s,x=[%lld,%lld]%s,w=[%lld,%lld],+b+r) -> %d launches, K split",
            mode == SG_MODE_MAX_AUTOTUNE ? "max-autotune" : "reduce-overhead", sg_dtype_name(dt), (long long)rows, (long long)k, norm ? ",layer_norm(x)" : "",
            (long long)n, (long long)k, launches);
    free(got), free(ref);
    free(xv), free(wv), free(bv), free(rv), free(gv), free(nbv);
    sg_fn_destroy(fn);
    for (int i = 0; i < nin; i++) sg_release(in[i]);
}

/* ------------------------------------------------------------ argmax in the GEMV */

/* logits = linear(x, w), token = argmax(logits, -1): one GEMV kernel whose
 * last block finishes the argmax over the blocks' bests. */
static sg_status argmax_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)user;
    out[1] = sg_linear(in[0], in[1], NULL);
    out[0] = sg_argmax(out[1], -1, false);
    return out[0] && out[1] ? SG_OK : sg_ctx_status(c);
}

/* One case: w's columns n/5 and n-3 equal and 4x the others (ties across
 * blocks: the first wins), with `nan`, one weight of column n/2 NaN (a NaN
 * logit in every row wins over every number). The indices must be argmax's
 * of the returned logits (torch's order), and those within tolerance of
 * an f64 reference. */
static void test_argmax(sg_dtype dt, int64_t rows, int64_t k, int64_t n, bool nan) {
    tu_seed(17);
    setenv("SG_GEMV_ARGMAX", "1", 1);
    int64_t xs[2] = {rows, k}, ws[2] = {n, k}, j1 = n / 5, j2 = n - 3;
    double *xv, *wv = malloc(sizeof(double) * (size_t)(n * k)),
                *ref = malloc(sizeof(double) * (size_t)(rows * n));
    void *wb = malloc((size_t)(n * k) * sg_dtype_size(dt));
    bool ok = TU_EXPECT(wv && ref && wb);
    for (int64_t i = 0; ok && i < n * k; i++) wv[i] = tu_uniform(-0.1, 0.1);
    for (int64_t j = 0; ok && j < k; j++) wv[j2 * k + j] = wv[j1 * k + j] = 4 * wv[j1 * k + j];
    if (ok && nan) wv[n / 2 * k + k / 2] = NAN;
    for (int64_t i = 0; ok && i < n * k; i++) {
        tu_store(wb, dt, i, wv[i]);
        wv[i] = tu_load(wb, dt, i);
    }
    sg_tensor *in[2] = {tu_rand(ctx, dt, 2, xs, -1, 1, &xv),
                        ok ? sg_from_host(ctx, dt, 2, ws, wb) : NULL};
    sg_fn *fn = NULL;
    ok = ok &&
         TU_EXPECT(sg_compile(ctx, argmax_step, NULL, 2, 2,
                              &(sg_compile_opts){.mode = SG_MODE_REDUCE_OVERHEAD}, &fn) == SG_OK);
    sg_tensor *out[2] = {NULL, NULL};
    sg_mark_step_begin(ctx);
    ok = ok && TU_EXPECT(sg_call(fn, in, 2, out, 2) == SG_OK);
    for (int64_t r = 0; ok && r < rows; r++)
        ref_linear(xv + r * k, wv, (int)n, (int)k, ref + r * n);
    double tol = dt == SG_F32 ? 1e-5 : BF16_TOL;
    double *at = ok ? tu_read(out[0]) : NULL, *lg = ok ? tu_read(out[1]) : NULL;
    ok = ok && TU_EXPECT(at && lg) && tu_close("logits", lg, ref, rows * n, tol, tol);
    for (int64_t r = 0; ok && r < rows; r++) {
        const double *l = lg + r * n;
        int64_t b = 0;
        for (int64_t i = 1; i < n; i++)
            if (l[i] != l[i] ? l[b] == l[b] : l[b] == l[b] && l[i] > l[b]) b = i;
        ok = TU_EXPECT(at[r] == (double)b) && TU_EXPECT(!nan || b == n / 2);
    }
    int launches = 0;
    ok = ok && cuda_launches(fn, "cu_gemv_argmax", &launches) && TU_EXPECT(launches == 1);
    tu_case(ok,
            "GEMV_ARGMAX(%s,x=[%lld,%lld],w=[%lld,%lld],columns %lld and %lld tied%s) -> %d "
            "launches",
            sg_dtype_name(dt), (long long)rows, (long long)k, (long long)n, (long long)k,
            (long long)j1, (long long)j2, nan ? ", a NaN column" : "", launches);
    unsetenv("SG_GEMV_ARGMAX");
    free(at), free(lg), free(ref), free(wv), free(wb), free(xv);
    sg_fn_destroy(fn);
    for (int i = 0; i < 2; i++) sg_release(in[i]);
}

int main(void) {
    ctx = tu_ctx((sg_ctx_opts){0});
    test_argmax(SG_BF16, 1, 64, 50257, false);
    test_argmax(SG_BF16, 3, 64, 50257, true);
    test_argmax(SG_F32, 2, 101, 4099, false);
    test_split(SG_BF16, 1, 3072, 201, false, SG_MODE_REDUCE_OVERHEAD);
    test_split(SG_BF16, 3, 3001, 201, false, SG_MODE_REDUCE_OVERHEAD);
    test_split(SG_F32, 2, 1500, 97, false, SG_MODE_REDUCE_OVERHEAD);
    test_split(SG_F32, 1, 1501, 97, false, SG_MODE_REDUCE_OVERHEAD);
    test_split(SG_BF16, 2, 3072, 201, true, SG_MODE_REDUCE_OVERHEAD);
    test_split(SG_F32, 1, 1501, 97, true, SG_MODE_REDUCE_OVERHEAD);
    test_split(SG_BF16, 1, 3072, 201, false, SG_MODE_MAX_AUTOTUNE);
    test_split(SG_BF16, 3, 3001, 201, false, SG_MODE_MAX_AUTOTUNE);
    test_gpt2(false);
    test_gpt2(true);
    test_stamps();
    for (int style = 0; style < 4; style++) test_llama(style);
    test_gpt2_written();
    test_inplace();
    test_pair();
    test_copies();
    sg_ctx_destroy(ctx);
    return tu_finish();
}
