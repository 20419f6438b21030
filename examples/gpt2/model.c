/* SPDX-License-Identifier: MIT */
/*
 * model.c -- GPT-2 over the public stepgraph API (see model.h): the
 * parameter table shared by init, load and save; the forward pass as two
 * steps (prefill, decode) compiled with sg_compile; attention over the KV
 * cache in one function, attend(); and the cache-less forward over whole
 * sequences that training differentiates (gpt2_forward).
 */
#include "model.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GPT2_MAGIC 20240326
#define GPT2_EPS 1e-5

/* ------------------------------------------------------------ parameters */

/* The 16 kinds of parameter in checkpoint order; kinds 2..13 are per layer. */
enum { K_WTE, K_WPE, K_LAYER0, K_LNFW = K_LAYER0 + 12, K_LNFB, K_COUNT };

static const size_t layer_field[12] = {
    offsetof(gpt2_layer, ln1w), offsetof(gpt2_layer, ln1b),     offsetof(gpt2_layer, qkvw),
    offsetof(gpt2_layer, qkvb), offsetof(gpt2_layer, attprojw), offsetof(gpt2_layer, attprojb),
    offsetof(gpt2_layer, ln2w), offsetof(gpt2_layer, ln2b),     offsetof(gpt2_layer, fcw),
    offsetof(gpt2_layer, fcb),  offsetof(gpt2_layer, fcprojw),  offsetof(gpt2_layer, fcprojb)};

/* Where parameter (kind, layer) lives in g. */
static sg_tensor **param_slot(gpt2 *g, int kind, int64_t l) {
    switch (kind) {
    case K_WTE: return &g->wte;
    case K_WPE: return &g->wpe;
    case K_LNFW: return &g->lnfw;
    case K_LNFB: return &g->lnfb;
    default: return (sg_tensor **)((char *)&g->layers[l] + layer_field[kind - K_LAYER0]);
    }
}

/* The shape of one parameter of the kind; returns its ndim. */
static int param_shape(const gpt2_config *c, int kind, int64_t *shape) {
    int64_t C = c->channels;
    static const int64_t rows[12] = {1, 1, 3, 3, 1, 1, 1, 1, 4, 4, 1, 1}; /* in units of C */
    switch (kind) {
    case K_WTE: shape[0] = c->padded_vocab, shape[1] = C; return 2;
    case K_WPE: shape[0] = c->max_t, shape[1] = C; return 2;
    case K_LNFW:
    case K_LNFB: shape[0] = C; return 1;
    default: break;
    }
    int k = kind - K_LAYER0;
    shape[0] = rows[k] * C;
    if (k == 2 || k == 4 || k == 8 || k == 10) { /* the four weight matrices */
        shape[1] = k == 10 ? 4 * C : C;
        return 2;
    }
    return 1;
}

static int64_t layers_of(const gpt2_config *c, int kind) {
    return kind >= K_LAYER0 && kind < K_LNFW ? c->n_layer : 1;
}

static int64_t numel_of(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    return n;
}

/* The reason of this thread's last failure (gpt2_error). */
static _Thread_local char why[512];

/* Set why (printf-style) and return st. */
static sg_status failed(sg_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    return st;
}

const char *gpt2_error(sg_ctx *ctx) {
    const char *m = ctx ? sg_last_error(ctx) : "";
    return why[0] || !m ? why : m;
}

static sg_status check_config(const gpt2_config *c) {
    if (c->max_t < 1 || c->vocab < 1 || c->n_layer < 1 || c->n_head < 1 || c->channels < 1 ||
        c->channels % c->n_head != 0 || c->padded_vocab < c->vocab)
        return failed(SG_ERR_INVALID_ARG,
                      "the configuration (max_t %lld, vocab %lld, layers %lld, heads %lld, "
                      "channels %lld, padded vocab %lld) is not a GPT-2: each must be >= 1, "
                      "the channels a multiple of the heads, the padded vocab >= the vocab",
                      (long long)c->max_t, (long long)c->vocab, (long long)c->n_layer,
                      (long long)c->n_head, (long long)c->channels, (long long)c->padded_vocab);
    return SG_OK;
}

static gpt2 *model_new(sg_ctx *ctx, const gpt2_config *cfg, sg_dtype dtype) {
    gpt2 *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    g->layers = calloc((size_t)cfg->n_layer, sizeof *g->layers);
    if (!g->layers) {
        free(g);
        return NULL;
    }
    g->ctx = ctx;
    g->cfg = *cfg;
    g->dtype = dtype;
    return g;
}

/* Store host values of file dtype fdt as parameter (kind, l) in g's dtype. */
static sg_status put_param(gpt2 *g, int kind, int64_t l, sg_dtype fdt, const void *data) {
    int64_t shape[2];
    int nd = param_shape(&g->cfg, kind, shape);
    sg_tensor *t = sg_from_host(g->ctx, fdt, nd, shape, data);
    if (t && fdt != g->dtype) {
        sg_tensor *c = sg_cast(t, g->dtype);
        sg_release(t);
        t = c;
    }
    if (!t) return sg_ctx_status(g->ctx);
    *param_slot(g, kind, l) = t;
    return SG_OK;
}

/* xorshift64* and Box-Muller: N(0, 1). */
static double randn(uint64_t *s) {
    double u[2];
    for (int i = 0; i < 2; i++) {
        *s ^= *s >> 12, *s ^= *s << 25, *s ^= *s >> 27;
        u[i] = ((double)((*s * 2685821657736338717ull) >> 11) + 0.5) / 9007199254740992.0;
    }
    return sqrt(-2.0 * log(u[0])) * cos(6.283185307179586 * u[1]);
}

sg_status gpt2_init(sg_ctx *ctx, const gpt2_config *cfg_in, sg_dtype dtype, uint64_t seed,
                    gpt2 **out) {
    gpt2_config cfg = *cfg_in;
    if (cfg.padded_vocab == 0) cfg.padded_vocab = (cfg.vocab + 127) / 128 * 128;
    why[0] = '\0';
    if (check_config(&cfg) != SG_OK) return SG_ERR_INVALID_ARG;
    gpt2 *g = model_new(ctx, &cfg, dtype);
    if (!g) return failed(SG_ERR_OOM, "out of host memory for the model's tables");
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    double proj_std = 0.02 / sqrt(2.0 * (double)cfg.n_layer);
    sg_status st = SG_OK;
    for (int kind = 0; kind < K_COUNT && st == SG_OK; kind++) {
        int64_t shape[2];
        int64_t n = numel_of(param_shape(&cfg, kind, shape), shape);
        float *buf = malloc(sizeof(float) * (size_t)n);
        if (!buf) {
            st = failed(SG_ERR_OOM, "out of host memory for %lld initial values", (long long)n);
            break;
        }
        int k = kind - K_LAYER0; /* per-layer index, or out of 0..11 */
        bool matrix = kind == K_WTE || kind == K_WPE || k == 2 || k == 4 || k == 8 || k == 10;
        bool ln_weight = kind == K_LNFW || k == 0 || k == 6;
        double sd = k == 4 || k == 10 ? proj_std : 0.02;
        for (int64_t l = 0; l < layers_of(&cfg, kind) && st == SG_OK; l++) {
            for (int64_t i = 0; i < n; i++)
                buf[i] = matrix ? (float)(sd * randn(&s)) : ln_weight ? 1.0f : 0.0f;
            if (kind == K_WTE) /* the padding rows */
                memset(buf + cfg.vocab * cfg.channels, 0,
                       sizeof(float) * (size_t)((cfg.padded_vocab - cfg.vocab) * cfg.channels));
            st = put_param(g, kind, l, SG_F32, buf);
        }
        free(buf);
    }
    if (st != SG_OK) {
        gpt2_destroy(g);
        return st;
    }
    *out = g;
    return SG_OK;
}

sg_status gpt2_load(sg_ctx *ctx, const char *path, sg_dtype dtype, gpt2 **out) {
    why[0] = '\0';
    FILE *f = fopen(path, "rb");
    if (!f) return failed(SG_ERR_INVALID_ARG, "cannot open it: %s", strerror(errno));
    int32_t h[256];
    sg_status st = SG_OK;
    gpt2 *g = NULL;
    void *buf = NULL;
    if (fread(h, sizeof h, 1, f) != 1) {
        st = failed(SG_ERR_INVALID_ARG, "shorter than an llm.c header (256 int32)");
        goto done;
    }
    if (h[0] != GPT2_MAGIC || (h[1] != 3 && h[1] != 5)) {
        st = failed(SG_ERR_INVALID_ARG,
                    "not an llm.c GPT-2 checkpoint: magic %d, version %d (expected %d, and 3 "
                    "for f32 or 5 for bf16)",
                    (int)h[0], (int)h[1], GPT2_MAGIC);
        goto done;
    }
    gpt2_config cfg = {h[2], h[3], h[4], h[5], h[6], h[7]};
    sg_dtype fdt = h[1] == 3 ? SG_F32 : SG_BF16;
    st = check_config(&cfg);
    if (st == SG_OK && !(g = model_new(ctx, &cfg, dtype)))
        st = failed(SG_ERR_OOM, "out of host memory for the model's tables");
    if (st != SG_OK) goto done;
    for (int kind = 0; kind < K_COUNT && st == SG_OK; kind++) {
        int64_t shape[2];
        size_t bytes = (size_t)numel_of(param_shape(&cfg, kind, shape), shape) * sg_dtype_size(fdt);
        free(buf);
        if (!(buf = malloc(bytes)))
            st = failed(SG_ERR_OOM, "out of host memory for %zu bytes of a parameter", bytes);
        for (int64_t l = 0; l < layers_of(&cfg, kind) && st == SG_OK; l++) {
            if (fread(buf, 1, bytes, f) != bytes)
                st = failed(SG_ERR_INVALID_ARG,
                            "truncated: it ends inside parameter tensor %d (layer %lld) of the "
                            "configuration its header gives",
                            kind, (long long)l);
            if (st == SG_OK) st = put_param(g, kind, l, fdt, buf);
        }
    }
done:
    free(buf);
    fclose(f);
    if (st != SG_OK) {
        gpt2_destroy(g);
        return st;
    }
    *out = g;
    return SG_OK;
}

sg_status gpt2_save(gpt2 *g, const char *path, sg_dtype fdt) {
    why[0] = '\0';
    if (!g || (fdt != SG_F32 && fdt != SG_BF16))
        return failed(SG_ERR_INVALID_ARG, "no model, or a file dtype other than f32 or bf16");
    FILE *f = fopen(path, "wb");
    if (!f) return failed(SG_ERR_INVALID_ARG, "cannot create it: %s", strerror(errno));
    const gpt2_config *c = &g->cfg;
    int32_t h[256] = {GPT2_MAGIC,           fdt == SG_F32 ? 3 : 5,   (int32_t)c->max_t,
                      (int32_t)c->vocab,    (int32_t)c->n_layer,     (int32_t)c->n_head,
                      (int32_t)c->channels, (int32_t)c->padded_vocab};
    sg_status st = fwrite(h, sizeof h, 1, f) == 1
                       ? SG_OK
                       : failed(SG_ERR_INVALID_ARG, "cannot write it: %s", strerror(errno));
    for (int kind = 0; kind < K_COUNT && st == SG_OK; kind++)
        for (int64_t l = 0; l < layers_of(c, kind) && st == SG_OK; l++) {
            sg_tensor *t = *param_slot(g, kind, l);
            sg_tensor *v = sg_tensor_dtype(t) == fdt ? sg_clone(t) : sg_cast(t, fdt);
            size_t bytes = (size_t)sg_tensor_numel(t) * sg_dtype_size(fdt);
            void *buf = v ? malloc(bytes) : NULL;
            st = !v ? sg_ctx_status(g->ctx) : !buf ? SG_ERR_OOM : sg_read(v, buf, bytes);
            if (st == SG_OK && fwrite(buf, 1, bytes, f) != bytes)
                st = failed(SG_ERR_INVALID_ARG, "cannot write it: %s", strerror(errno));
            free(buf);
            sg_release(v);
        }
    if (fclose(f) != 0 && st == SG_OK)
        st = failed(SG_ERR_INVALID_ARG, "cannot finish writing it: %s", strerror(errno));
    return st;
}

void gpt2_cache_destroy(gpt2 *g) {
    if (!g) return;
    for (int i = 0; i < 2; i++) sg_fn_destroy(g->prefill_fn[i]);
    sg_fn_destroy(g->decode_fn);
    g->prefill_fn[0] = g->prefill_fn[1] = g->decode_fn = NULL;
    for (int64_t l = 0; g->kcache && l < g->cfg.n_layer; l++) {
        sg_release(g->kcache[l]);
        sg_release(g->vcache[l]);
    }
    free(g->kcache);
    free(g->vcache);
    g->kcache = g->vcache = NULL;
    sg_release(g->slots);
    sg_release(g->one);
    g->slots = g->one = NULL;
}

void gpt2_destroy(gpt2 *g) {
    if (!g) return;
    gpt2_cache_destroy(g);
    for (int kind = 0; kind < K_COUNT; kind++)
        for (int64_t l = 0; l < layers_of(&g->cfg, kind); l++) sg_release(*param_slot(g, kind, l));
    free(g->layers);
    free(g);
}

/* ------------------------------------------------------------ forward */

/* x (B, T, C) -> q, k, v, each (B, NH, T, hs): views of one QKV matmul. */
static void qkv_heads(gpt2 *g, const gpt2_layer *w, sg_tensor *x, sg_tensor **qkv_out) {
    int64_t B = sg_tensor_size(x, 0), T = sg_tensor_size(x, 1), C = g->cfg.channels;
    int64_t NH = g->cfg.n_head, heads[4] = {B, T, NH, C / NH};
    sg_tensor *qkv = sg_linear(sg_layer_norm(x, w->ln1w, w->ln1b, GPT2_EPS), w->qkvw, w->qkvb);
    for (int i = 0; i < 3; i++)
        qkv_out[i] = sg_transpose(sg_reshape(sg_narrow(qkv, 2, i * C, C), 4, heads), 1, 2);
}

/* The rest of a block: attention output y (B, NH, T, hs), residual x
 * (B, T, C) -> x + proj(y), then the MLP with its residual. */
static sg_tensor *block_rest(const gpt2_layer *w, sg_tensor *x, sg_tensor *y) {
    int64_t shape[3] = {sg_tensor_size(x, 0), sg_tensor_size(x, 1), sg_tensor_size(x, 2)};
    y = sg_reshape(sg_transpose(y, 1, 2), 3, shape);
    x = sg_add(x, sg_linear(y, w->attprojw, w->attprojb));
    sg_tensor *h =
        sg_gelu_tanh(sg_linear(sg_layer_norm(x, w->ln2w, w->ln2b, GPT2_EPS), w->fcw, w->fcb));
    return sg_add(x, sg_linear(h, w->fcprojw, w->fcprojb));
}

/* Final LayerNorm and the tied LM head over the first V rows of wte:
 * x (..., C) -> logits (..., V). */
static sg_tensor *head(gpt2 *g, sg_tensor *x) {
    sg_tensor *w = sg_narrow(g->wte, 0, 0, g->cfg.vocab);
    return sg_linear(sg_layer_norm(x, g->lnfw, g->lnfb, GPT2_EPS), w, NULL);
}

/* The valid cache slots for the token at position pos ((1) i64): pos + 1,
 * a scalar on the device, made once per step before the layers (so that
 * it runs with the step's first small kernels). */
static sg_tensor *kv_len_of(sg_tensor *pos) { return sg_add_scalar(sg_reshape(pos, 0, NULL), 1); }

/*
 * Attention of q (B, NH, 1, hs) over the cache kc, vc (B, NH, S, hs) with
 * slots 0 .. kv_len - 1 visible (kv_len_of). The one place that knows how
 * cached attention is computed.
 */
static sg_tensor *attend(gpt2 *g, sg_tensor *q, sg_tensor *kc, sg_tensor *vc, sg_tensor *kv_len) {
    (void)g;
    /* kv_len read on the device: one fused kernel that reads only the valid
     * slots (flash-decoding on CUDA). */
    return sg_sdpa_cached(q, kc, vc, kv_len, 0.0);
}

/* tokens (B, T) -> logits (B, V) or (B, T, V); K, V into slots 0 .. T-1. */
static sg_status prefill(gpt2 *g, sg_tensor *const *in, sg_tensor **out, bool all) {
    sg_ctx *ctx = g->ctx;
    sg_tensor *tokens = in[0];
    int64_t B = sg_tensor_size(tokens, 0), T = sg_tensor_size(tokens, 1);
    if (sg_tensor_ndim(tokens) != 2 || B != g->cache_batch || T < 1 || T > g->cache_slots)
        return SG_ERR_SHAPE;
    sg_tensor *x = sg_add(sg_embedding(g->wte, tokens), sg_narrow(g->wpe, 0, 0, T));
    for (int64_t l = 0; l < g->cfg.n_layer; l++) {
        const gpt2_layer *w = &g->layers[l];
        sg_tensor *qkv[3];
        qkv_heads(g, w, x, qkv);
        sg_status st = sg_copy_(sg_narrow(g->kcache[l], 2, 0, T), qkv[1]);
        if (st == SG_OK) st = sg_copy_(sg_narrow(g->vcache[l], 2, 0, T), qkv[2]);
        if (st != SG_OK) return st;
        x = block_rest(w, x, sg_sdpa(qkv[0], qkv[1], qkv[2], NULL, true, 0.0));
    }
    if (!all) x = sg_squeeze(sg_narrow(x, 1, T - 1, 1), 1);
    out[0] = head(g, x);
    return out[0] ? SG_OK : sg_ctx_status(ctx);
}

static sg_status prefill_last(sg_ctx *ctx, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)ctx;
    return prefill(user, in, out, false);
}

static sg_status prefill_all(sg_ctx *ctx, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)ctx;
    return prefill(user, in, out, true);
}

/* token (B), pos (1) -> logits (B, V); then token = argmax, pos += 1. */
static sg_status decode(sg_ctx *ctx, sg_tensor *const *in, sg_tensor **out, void *user) {
    gpt2 *g = user;
    sg_tensor *token = in[0], *pos = in[1];
    int64_t B = sg_tensor_size(token, 0), C = g->cfg.channels, bt[3] = {B, 1, C};
    if (sg_tensor_ndim(token) != 1 || B != g->cache_batch || sg_tensor_numel(pos) != 1)
        return SG_ERR_SHAPE;
    sg_tensor *x = sg_add(sg_embedding(g->wte, token), sg_embedding(g->wpe, pos));
    x = sg_reshape(x, 3, bt);
    sg_tensor *kv_len = kv_len_of(pos);
    for (int64_t l = 0; l < g->cfg.n_layer; l++) {
        const gpt2_layer *w = &g->layers[l];
        sg_tensor *qkv[3];
        qkv_heads(g, w, x, qkv);
        sg_status st = sg_index_copy_(g->kcache[l], 2, pos, qkv[1]);
        if (st == SG_OK) st = sg_index_copy_(g->vcache[l], 2, pos, qkv[2]);
        if (st != SG_OK) return st;
        x = block_rest(w, x, attend(g, qkv[0], g->kcache[l], g->vcache[l], kv_len));
    }
    sg_tensor *logits = sg_squeeze(head(g, x), 1);
    if (!logits) return sg_ctx_status(ctx);
    sg_status st = sg_copy_(token, sg_argmax(logits, -1, false));
    if (st == SG_OK) st = sg_add_(pos, g->one);
    out[0] = logits;
    return st;
}

sg_status gpt2_cache_create(gpt2 *g, int64_t batch, int64_t slots, const sg_compile_opts *opts) {
    if (!g || batch < 1 || slots < 1 || slots > g->cfg.max_t) return SG_ERR_INVALID_ARG;
    gpt2_cache_destroy(g);
    int64_t NH = g->cfg.n_head, shape[4] = {batch, NH, slots, g->cfg.channels / NH}, one = 1;
    g->kcache = calloc((size_t)g->cfg.n_layer, sizeof *g->kcache);
    g->vcache = calloc((size_t)g->cfg.n_layer, sizeof *g->vcache);
    if (!g->kcache || !g->vcache) {
        gpt2_cache_destroy(g);
        return SG_ERR_OOM;
    }
    for (int64_t l = 0; l < g->cfg.n_layer; l++) {
        g->kcache[l] = sg_zeros(g->ctx, g->dtype, 4, shape);
        g->vcache[l] = sg_zeros(g->ctx, g->dtype, 4, shape);
    }
    g->slots = sg_arange(g->ctx, SG_I64, 0, (double)slots, 1);
    g->one = sg_full(g->ctx, SG_I64, 1, &one, 1);
    g->cache_batch = batch;
    g->cache_slots = slots;
    g->opts = opts ? *opts : (sg_compile_opts){.mode = SG_MODE_EAGER};
    g->opts.fullgraph = g->opts.mode != SG_MODE_EAGER;
    sg_compile_opts o = g->opts;
    sg_status st = sg_ctx_status(g->ctx);
    o.name = "gpt2_prefill";
    if (st == SG_OK) st = sg_compile(g->ctx, prefill_last, g, 1, 1, &o, &g->prefill_fn[0]);
    o.name = "gpt2_prefill_all";
    if (st == SG_OK) st = sg_compile(g->ctx, prefill_all, g, 1, 1, &o, &g->prefill_fn[1]);
    o.name = "gpt2_decode";
    if (st == SG_OK) st = sg_compile(g->ctx, decode, g, 2, 1, &o, &g->decode_fn);
    if (st != SG_OK) gpt2_cache_destroy(g);
    return st;
}

sg_status gpt2_prefill(gpt2 *g, sg_tensor *tokens, bool all, sg_tensor **logits) {
    if (!g || !g->decode_fn) return SG_ERR_INVALID_ARG;
    sg_status st = sg_mark_step_begin(g->ctx);
    return st != SG_OK ? st : sg_call(g->prefill_fn[all], &tokens, 1, logits, 1);
}

sg_status gpt2_decode(gpt2 *g, sg_tensor *token, sg_tensor *pos, sg_tensor **logits) {
    if (!g || !g->decode_fn) return SG_ERR_INVALID_ARG;
    sg_tensor *in[2] = {token, pos};
    sg_status st = sg_mark_step_begin(g->ctx);
    return st != SG_OK ? st : sg_call(g->decode_fn, in, 2, logits, 1);
}

/* ------------------------------------------------------------ training */

int64_t gpt2_num_params(const gpt2 *g) { return 4 + 12 * g->cfg.n_layer; }

void gpt2_params(gpt2 *g, sg_tensor **out) {
    for (int kind = 0; kind < K_COUNT; kind++)
        for (int64_t l = 0; l < layers_of(&g->cfg, kind); l++) *out++ = *param_slot(g, kind, l);
}

sg_tensor *gpt2_forward(gpt2 *g, sg_tensor *tokens) {
    /* A wrong shape or T > maxT fails in the ops below, with their message. */
    int64_t T = sg_tensor_size(tokens, 1);
    sg_tensor *x = sg_add(sg_embedding(g->wte, tokens), sg_narrow(g->wpe, 0, 0, T));
    for (int64_t l = 0; l < g->cfg.n_layer; l++) {
        sg_tensor *qkv[3];
        qkv_heads(g, &g->layers[l], x, qkv);
        x = block_rest(&g->layers[l], x, sg_sdpa(qkv[0], qkv[1], qkv[2], NULL, true, 0.0));
    }
    return head(g, x);
}
