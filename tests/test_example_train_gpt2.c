/* SPDX-License-Identifier: MIT */
/*
 * test_example_train_gpt2.c -- the GPT-2 training step of examples/gpt2
 * (train.c, over model.c's gpt2_forward) against an f64 reference of the
 * same model's forward and backward written here in plain loops, llm.c's
 * train_gpt2.c layer by layer, on a tiny config (2 layers, 64 channels, 4
 * heads, vocabulary 128, 16 positions, B 2, T 8):
 *  - step 1 in EAGER, DEFAULT and REDUCE_OVERHEAD: the loss, every gradient
 *    after clipping the global norm to 1, and every parameter after AdamW
 *    (the reference's update from the reference's gradients, weight decay
 *    on the matrices only); the
 *    forward-only eval step's loss;
 *  - 10 steps under llm.c's lr schedule: the loss curves of the three modes
 *    agree and fall; bf16 with f32 master weights (CUDA's setting) follows
 *    them within bf16's precision;
 *  - a checkpoint saved after training (llm.c's format) loads into the
 *    inference model with the same parameters and the same logits;
 *  - the token-file reader and the loader's windows on files written here;
 *    a bad magic and a truncated file are refused.
 */
#define _POSIX_C_SOURCE 200809L
#include "gpt2/data.h"
#include "gpt2/model.h"
#include "gpt2/train.h"
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { MAXT = 16, V = 128, VP = 128, L = 2, NH = 4, C = 64, HS = C / NH, B = 2, T = 8 };
enum { N = B * T, STEPS = 10, NKIND = 16 };

#define LR 1e-3
#define WD 0.1
#define CLIP 1.0

/* Sizes of the 16 kinds of parameter (all layers of a kind together): the
 * checkpoint's order, which is also gpt2_params' order. */
static const int64_t kind_size[NKIND] = {VP * C,       MAXT *C, L *C, L *C, L * 3 * C *C, L * 3 * C,
                                         L *C *C,      L *C,    L *C, L *C, L * 4 * C *C, L * 4 * C,
                                         L *C * 4 * C, L *C,    C,    C};

/* The parameters (or their gradients), f64, carved from one allocation. */
typedef struct params {
    double *wte, *wpe, *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb, *ln2w, *ln2b, *fcw, *fcb,
        *fcprojw, *fcprojb, *lnfw, *lnfb;
} params;

static int64_t total_size(void) {
    int64_t n = 0;
    for (int i = 0; i < NKIND; i++) n += kind_size[i];
    return n;
}

static void carve(params *p, double *mem) {
    double **f = (double **)p;
    for (int i = 0; i < NKIND; mem += kind_size[i++]) f[i] = mem;
}

/* ------------------------------------------------------------ f64 reference */

/* The forward's saved activations (llm.c's ActivationTensors). */
typedef struct acts {
    double x[L + 1][N * C]; /* the residual stream into each layer, and out of the last */
    double ln1[L][N * C], mean1[L][N], rstd1[L][N], qkv[L][N * 3 * C];
    double att[L][B * NH * T * T], atty[L][N * C], res2[L][N * C];
    double ln2[L][N * C], mean2[L][N], rstd2[L][N], fch[L][N * 4 * C], gelu[L][N * 4 * C];
    double lnf[N * C], meanf[N], rstdf[N], probs[N * V];
} acts;

/* out (N, C) = layernorm(x (N, C)); mean and rstd (N) saved. */
static void layernorm_fwd(double *out, double *mean, double *rstd, const double *x, const double *w,
                          const double *b) {
    for (int n = 0; n < N; n++) {
        const double *xn = x + n * C;
        double m = 0, v = 0;
        for (int i = 0; i < C; i++) m += xn[i] / C;
        for (int i = 0; i < C; i++) v += (xn[i] - m) * (xn[i] - m) / C;
        mean[n] = m, rstd[n] = 1 / sqrt(v + 1e-5);
        for (int i = 0; i < C; i++) out[n * C + i] = (xn[i] - m) * rstd[n] * w[i] + b[i];
    }
}

/* dx, dw, db += the gradients of layernorm for dout (N, C). */
static void layernorm_bwd(double *dx, double *dw, double *db, const double *dout, const double *x,
                          const double *w, const double *mean, const double *rstd) {
    for (int n = 0; n < N; n++) {
        const double *xn = x + n * C, *dn = dout + n * C;
        double dmean = 0, dnorm_mean = 0;
        for (int i = 0; i < C; i++) {
            double norm = (xn[i] - mean[n]) * rstd[n];
            dmean += w[i] * dn[i] / C;
            dnorm_mean += w[i] * dn[i] * norm / C;
        }
        for (int i = 0; i < C; i++) {
            double norm = (xn[i] - mean[n]) * rstd[n];
            db[i] += dn[i];
            dw[i] += norm * dn[i];
            dx[n * C + i] += (w[i] * dn[i] - dmean - norm * dnorm_mean) * rstd[n];
        }
    }
}

/* out (N, OC) = x (N, IC) @ w (OC, IC)^T + b (b may be NULL). */
static void matmul_fwd(double *out, const double *x, const double *w, const double *b, int IC,
                       int OC) {
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double s = b ? b[o] : 0;
            for (int i = 0; i < IC; i++) s += x[n * IC + i] * w[o * IC + i];
            out[n * OC + o] = s;
        }
}

/* dx, dw, db (db may be NULL) += the gradients of matmul_fwd for dout (N, OC). */
static void matmul_bwd(double *dx, double *dw, double *db, const double *dout, const double *x,
                       const double *w, int IC, int OC) {
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double d = dout[n * OC + o];
            if (db) db[o] += d;
            for (int i = 0; i < IC; i++) {
                dx[n * IC + i] += d * w[o * IC + i];
                dw[o * IC + i] += d * x[n * IC + i];
            }
        }
}

/* out (N, C) = causal attention of qkv (N, 3C); att (B, NH, T, T) saved. */
static void attention_fwd(double *out, double *att, const double *qkv) {
    double scale = 1 / sqrt((double)HS);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const double *q = qkv + (b * T + t) * 3 * C + h * HS;
                double *a = att + ((b * NH + h) * T + t) * T, mx = -INFINITY, sum = 0;
                for (int u = 0; u <= t; u++) {
                    const double *k = qkv + (b * T + u) * 3 * C + C + h * HS;
                    double s = 0;
                    for (int i = 0; i < HS; i++) s += q[i] * k[i];
                    a[u] = s * scale;
                    mx = fmax(mx, a[u]);
                }
                for (int u = 0; u <= t; u++) sum += a[u] = exp(a[u] - mx);
                for (int u = 0; u < T; u++) a[u] = u <= t ? a[u] / sum : 0;
                double *o = out + (b * T + t) * C + h * HS;
                for (int i = 0; i < HS; i++) {
                    double s = 0;
                    for (int u = 0; u <= t; u++)
                        s += a[u] * qkv[(b * T + u) * 3 * C + 2 * C + h * HS + i];
                    o[i] = s;
                }
            }
}

/* dqkv += the gradient of attention_fwd for dout (N, C). */
static void attention_bwd(double *dqkv, const double *dout, const double *qkv, const double *att) {
    double scale = 1 / sqrt((double)HS), datt[T], dpre[T];
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const double *a = att + ((b * NH + h) * T + t) * T,
                             *d = dout + (b * T + t) * C + h * HS;
                const double *q = qkv + (b * T + t) * 3 * C + h * HS;
                double *dq = dqkv + (b * T + t) * 3 * C + h * HS;
                for (int u = 0; u <= t; u++) {
                    const double *v = qkv + (b * T + u) * 3 * C + 2 * C + h * HS;
                    double *dv = dqkv + (b * T + u) * 3 * C + 2 * C + h * HS;
                    datt[u] = 0;
                    for (int i = 0; i < HS; i++) datt[u] += v[i] * d[i], dv[i] += a[u] * d[i];
                }
                for (int u = 0; u <= t; u++) {
                    dpre[u] = 0;
                    for (int w = 0; w <= t; w++) dpre[u] += a[w] * ((w == u) - a[u]) * datt[w];
                }
                for (int u = 0; u <= t; u++) {
                    const double *k = qkv + (b * T + u) * 3 * C + C + h * HS;
                    double *dk = dqkv + (b * T + u) * 3 * C + C + h * HS;
                    for (int i = 0; i < HS; i++)
                        dq[i] += k[i] * dpre[u] * scale, dk[i] += q[i] * dpre[u] * scale;
                }
            }
}

#define GELU_S 0.7978845608028654 /* sqrt(2 / pi) */

static double gelu_fwd(double x) {
    return 0.5 * x * (1 + tanh(GELU_S * (x + 0.044715 * x * x * x)));
}

static double gelu_grad(double x) {
    double th = tanh(GELU_S * (x + 0.044715 * x * x * x));
    return 0.5 * (1 + th) + 0.5 * x * (1 - th * th) * GELU_S * (1 + 3 * 0.044715 * x * x);
}

/* The loss of tokens -> targets; the activations into a. */
static double ref_forward(const params *p, const int64_t *tok, const int64_t *tgt, acts *a) {
    for (int n = 0; n < N; n++)
        for (int i = 0; i < C; i++)
            a->x[0][n * C + i] = p->wte[tok[n] * C + i] + p->wpe[(n % T) * C + i];
    for (int l = 0; l < L; l++) {
        static double tmp[N * C];
        layernorm_fwd(a->ln1[l], a->mean1[l], a->rstd1[l], a->x[l], p->ln1w + l * C,
                      p->ln1b + l * C);
        matmul_fwd(a->qkv[l], a->ln1[l], p->qkvw + l * 3 * C * C, p->qkvb + l * 3 * C, C, 3 * C);
        attention_fwd(a->atty[l], a->att[l], a->qkv[l]);
        matmul_fwd(tmp, a->atty[l], p->attprojw + l * C * C, p->attprojb + l * C, C, C);
        for (int i = 0; i < N * C; i++) a->res2[l][i] = a->x[l][i] + tmp[i];
        layernorm_fwd(a->ln2[l], a->mean2[l], a->rstd2[l], a->res2[l], p->ln2w + l * C,
                      p->ln2b + l * C);
        matmul_fwd(a->fch[l], a->ln2[l], p->fcw + l * 4 * C * C, p->fcb + l * 4 * C, C, 4 * C);
        for (int i = 0; i < N * 4 * C; i++) a->gelu[l][i] = gelu_fwd(a->fch[l][i]);
        matmul_fwd(tmp, a->gelu[l], p->fcprojw + l * 4 * C * C, p->fcprojb + l * C, 4 * C, C);
        for (int i = 0; i < N * C; i++) a->x[l + 1][i] = a->res2[l][i] + tmp[i];
    }
    layernorm_fwd(a->lnf, a->meanf, a->rstdf, a->x[L], p->lnfw, p->lnfb);
    matmul_fwd(a->probs, a->lnf, p->wte, NULL, C, V);
    double loss = 0;
    for (int n = 0; n < N; n++) {
        double *r = a->probs + n * V, mx = -INFINITY, sum = 0;
        for (int v = 0; v < V; v++) mx = fmax(mx, r[v]);
        for (int v = 0; v < V; v++) sum += r[v] = exp(r[v] - mx);
        for (int v = 0; v < V; v++) r[v] /= sum;
        loss -= log(r[tgt[n]]) / N;
    }
    return loss;
}

/* The gradients of the loss into g (zeroed here). */
static void ref_backward(const params *p, const int64_t *tok, const int64_t *tgt, const acts *a,
                         params *g) {
    static double dx[N * C], dres2[N * C], dtmp[N * 4 * C], dtmp2[N * 4 * C], dqkv[N * 3 * C];
    static double dlogits[N * V];
    memset(g->wte, 0, sizeof(double) * (size_t)total_size());
    for (int n = 0; n < N; n++)
        for (int v = 0; v < V; v++) dlogits[n * V + v] = (a->probs[n * V + v] - (v == tgt[n])) / N;
    memset(dtmp, 0, sizeof dtmp);
    matmul_bwd(dtmp, g->wte, NULL, dlogits, a->lnf, p->wte, C, V);
    memset(dx, 0, sizeof dx);
    layernorm_bwd(dx, g->lnfw, g->lnfb, dtmp, a->x[L], p->lnfw, a->meanf, a->rstdf);
    for (int l = L - 1; l >= 0; l--) {
        /* x[l+1] = res2 + fcproj(gelu(fc(ln2(res2)))) */
        memcpy(dres2, dx, sizeof dx);
        memset(dtmp, 0, sizeof dtmp);
        matmul_bwd(dtmp, g->fcprojw + l * 4 * C * C, g->fcprojb + l * C, dx, a->gelu[l],
                   p->fcprojw + l * 4 * C * C, 4 * C, C);
        for (int i = 0; i < N * 4 * C; i++) dtmp[i] *= gelu_grad(a->fch[l][i]);
        memset(dtmp2, 0, sizeof dtmp2);
        matmul_bwd(dtmp2, g->fcw + l * 4 * C * C, g->fcb + l * 4 * C, dtmp, a->ln2[l],
                   p->fcw + l * 4 * C * C, C, 4 * C);
        layernorm_bwd(dres2, g->ln2w + l * C, g->ln2b + l * C, dtmp2, a->res2[l], p->ln2w + l * C,
                      a->mean2[l], a->rstd2[l]);
        /* res2 = x[l] + attproj(attention(qkv(ln1(x[l])))) */
        memcpy(dx, dres2, sizeof dx);
        memset(dtmp, 0, sizeof dtmp);
        matmul_bwd(dtmp, g->attprojw + l * C * C, g->attprojb + l * C, dres2, a->atty[l],
                   p->attprojw + l * C * C, C, C);
        memset(dqkv, 0, sizeof dqkv);
        attention_bwd(dqkv, dtmp, a->qkv[l], a->att[l]);
        memset(dtmp2, 0, sizeof dtmp2);
        matmul_bwd(dtmp2, g->qkvw + l * 3 * C * C, g->qkvb + l * 3 * C, dqkv, a->ln1[l],
                   p->qkvw + l * 3 * C * C, C, 3 * C);
        layernorm_bwd(dx, g->ln1w + l * C, g->ln1b + l * C, dtmp2, a->x[l], p->ln1w + l * C,
                      a->mean1[l], a->rstd1[l]);
    }
    for (int n = 0; n < N; n++)
        for (int i = 0; i < C; i++) {
            g->wte[tok[n] * C + i] += dx[n * C + i];
            g->wpe[(n % T) * C + i] += dx[n * C + i];
        }
}

/* Scale g so that its global norm is at most CLIP, as sg_clip_grad_norm_;
 * returns the norm before. */
static double ref_clip(double *g, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += g[i] * g[i];
    double coef = CLIP / (sqrt(s) + 1e-6);
    for (int64_t i = 0; coef < 1 && i < n; i++) g[i] *= coef;
    return sqrt(s);
}

/* ------------------------------------------------------------ the example's step */

static const char *const kind_name[NKIND] = {"wte",      "wpe",      "ln1w", "ln1b", "qkvw", "qkvb",
                                             "attprojw", "attprojb", "ln2w", "ln2b", "fcw",  "fcb",
                                             "fcprojw",  "fcprojb",  "lnfw", "lnfb"};

/* Random parameters that spread the logits (f32-rounded, llm.c's order):
 * LayerNorm weights near 1, small biases, larger embeddings. */
static void random_params(double *flat) {
    params p;
    carve(&p, flat);
    double **f = (double **)&p;
    for (int k = 0; k < NKIND; k++) {
        bool ln_weight = k == 2 || k == 8 || k == 14, bias = k % 2 && k > 2;
        for (int64_t j = 0; j < kind_size[k]; j++)
            f[k][j] = tu_round(SG_F32, ln_weight ? tu_uniform(0.8, 1.2)
                                       : bias    ? tu_uniform(-0.1, 0.1)
                                       : k < 2   ? tu_uniform(-0.3, 0.3)
                                                 : tu_uniform(-0.12, 0.12));
    }
}

/* Copy n tensors (gpt2_params order) from or to flat f64 values. */
static bool tensors_read(sg_tensor *const *ts, int n, double *flat) {
    for (int i = 0; i < n; i++) {
        double *v = tu_read(ts[i]);
        if (!v) return false;
        memcpy(flat, v, sizeof(double) * (size_t)sg_tensor_numel(ts[i]));
        flat += sg_tensor_numel(ts[i]);
        free(v);
    }
    return true;
}

/* (Through an f32 tensor and sg_copy_, which rounds to a bf16 parameter.) */
static bool tensors_write(sg_tensor *const *ts, int n, const double *flat) {
    for (int i = 0; i < n; i++) {
        int64_t m = sg_tensor_numel(ts[i]), shape[SG_MAX_DIMS];
        float *v = malloc(sizeof(float) * (size_t)m);
        for (int64_t j = 0; j < m; j++) v[j] = (float)*flat++;
        sg_tensor_shape(ts[i], shape);
        sg_tensor *f = sg_from_host(sg_tensor_ctx(ts[i]), SG_F32, sg_tensor_ndim(ts[i]), shape, v);
        bool ok = f && sg_copy_(ts[i], f) == SG_OK;
        sg_release(f);
        free(v);
        if (!ok) return false;
    }
    return true;
}

static double max_abs(const double *x, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) m = fmax(m, fabs(x[i]));
    return m;
}

/* Per kind of parameter: got against want within rtol and atol_frac of
 * want's largest magnitude. */
static bool close_by_kind(const char *what, const double *got, const double *want, double rtol,
                          double atol_frac) {
    bool ok = true;
    for (int k = 0; k < NKIND; got += kind_size[k], want += kind_size[k], k++) {
        char name[64];
        snprintf(name, sizeof name, "%s.%s", what, kind_name[k]);
        ok &= tu_close(name, got, want, kind_size[k], rtol,
                       atol_frac * max_abs(want, kind_size[k]) + 1e-12);
    }
    return ok;
}

typedef struct reference {
    double *p0, *g, *p1; /* parameters, clipped gradients, parameters after AdamW step 1 */
    double loss, norm;   /* the loss of step 1, its gradients' norm before clipping */
} reference;

static const gpt2_config tiny = {
    .max_t = MAXT, .vocab = V, .n_layer = L, .n_head = NH, .channels = C, .padded_vocab = VP};

/* The reference's step 1 on the loader's first batch. */
static void make_reference(reference *r, const gpt2_tokens *data) {
    static acts a;
    int64_t n = total_size(), tok[N], tgt[N];
    gpt2_loader ld;
    gpt2_loader_init(&ld, data, B, T);
    gpt2_loader_next(&ld, tok, tgt);
    r->p0 = malloc(sizeof(double) * (size_t)n);
    r->g = malloc(sizeof(double) * (size_t)n);
    r->p1 = malloc(sizeof(double) * (size_t)n);
    random_params(r->p0);
    params p, g;
    carve(&p, r->p0);
    carve(&g, r->g);
    r->loss = ref_forward(&p, tok, tgt, &a);
    ref_backward(&p, tok, tgt, &a, &g);
    r->norm = ref_clip(r->g, n);
    /* AdamW at t = 1: the bias-corrected moments are g and g^2. Weight
     * decay on the matrices only (kinds wte, wpe, qkvw, attprojw, fcw,
     * fcprojw), as llm.c. */
    double lr = gpt2_lr_at(LR, 0, 2, STEPS, 0.1);
    for (int k = 0, i = 0; k < NKIND; k++) {
        double wd = k < 2 || k == 4 || k == 6 || k == 10 || k == 12 ? WD : 0;
        for (int64_t j = 0; j < kind_size[k]; j++, i++)
            r->p1[i] = r->p0[i] * (1 - lr * wd) - lr * r->g[i] / (fabs(r->g[i]) + 1e-8);
    }
}

/* AdamW's step 1 divides by |g|: where a gradient is tiny (the key biases'
 * is zero in exact arithmetic: softmax ignores a shift shared by every key)
 * the f32 gradient is rounding noise that eps does not swamp, so those
 * entries are left out of the check. */
static bool check_update(const double *got, const reference *r) {
    int64_t n = total_size();
    double *got_k = malloc(sizeof(double) * (size_t)n),
           *want_k = malloc(sizeof(double) * (size_t)n);
    const double *g = r->g;
    int64_t off = 0;
    for (int k = 0; k < NKIND; off += kind_size[k++]) {
        double floor = 1e-4 * max_abs(g + off, kind_size[k]);
        for (int64_t i = off; i < off + kind_size[k]; i++) {
            bool skip = fabs(g[i]) < floor;
            got_k[i] = skip ? r->p1[i] : got[i];
            want_k[i] = r->p1[i];
        }
    }
    bool ok = close_by_kind("param", got_k, want_k, 1e-5, 1e-6);
    free(got_k), free(want_k);
    return ok;
}

/* Save g after training, load it into the inference model: the same
 * parameters, and prefill's logits equal to the training forward's. */
static void check_checkpoint(sg_ctx *ctx, gpt2 *g, sg_tensor *x, const char *dir) {
    char path[256];
    snprintf(path, sizeof path, "%s/trained.bin", dir);
    int64_t n = total_size(), np = gpt2_num_params(g);
    double *a = malloc(sizeof(double) * (size_t)n), *b = malloc(sizeof(double) * (size_t)n);
    sg_tensor **pa = malloc(sizeof *pa * (size_t)np), **pb = malloc(sizeof *pb * (size_t)np);
    gpt2 *back = NULL;
    sg_tensor *want = NULL, *got = NULL;
    gpt2_params(g, pa);
    bool ok = TU_EXPECT(gpt2_save(g, path, SG_F32) == SG_OK) &&
              TU_EXPECT(gpt2_load(ctx, path, SG_F32, &back) == SG_OK) &&
              TU_EXPECT(gpt2_num_params(back) == np);
    if (ok) {
        gpt2_params(back, pb);
        ok = TU_EXPECT(tensors_read(pa, (int)np, a)) && TU_EXPECT(tensors_read(pb, (int)np, b)) &&
             TU_EXPECT(memcmp(a, b, sizeof(double) * (size_t)n) == 0);
    }
    sg_set_grad_enabled(ctx, false);
    ok = ok && TU_EXPECT(gpt2_cache_create(back, B, T, NULL) == SG_OK) &&
         TU_EXPECT((want = gpt2_forward(g, x)) != NULL) &&
         TU_EXPECT(gpt2_prefill(back, x, true, &got) == SG_OK);
    sg_set_grad_enabled(ctx, true);
    double *w = ok ? tu_read(want) : NULL, *o = ok ? tu_read(got) : NULL;
    ok = ok && TU_EXPECT(w && o) && tu_close("logits", o, w, (int64_t)N * V, 1e-5, 1e-6);
    tu_case(ok, "CHECKPOINT(llm.c v3 f32,save->gpt2_load->prefill logits)");
    free(w), free(o), free(a), free(b), free(pa), free(pb);
    sg_release(want);
    gpt2_destroy(back);
    unlink(path);
}

/* Train the tiny model from r->p0 for STEPS steps in mode; checks step 1
 * against the reference and puts the loss curve into curve. */
static void run_mode(sg_mode mode, const reference *r, const gpt2_tokens *data, double *curve,
                     const char *ckpt_dir) {
    const char *mn = sg_mode_name(mode);
    sg_ctx *ctx = tu_ctx((sg_ctx_opts){0});
    gpt2 *g = NULL;
    gpt2_trainer *tr = NULL;
    int64_t n = total_size(), bt[2] = {B, T}, tok[N], tgt[N];
    double *got = malloc(sizeof(double) * (size_t)n), loss = NAN;
    gpt2_train_opts to = {
        .mode = mode, .weight_decay = WD, .grad_clip = CLIP, .output_grads = true};
    bool ok = TU_EXPECT(gpt2_init(ctx, &tiny, SG_F32, 1, &g) == SG_OK);
    sg_tensor **ps = malloc(sizeof *ps * (size_t)(ok ? gpt2_num_params(g) : 1));
    if (ok) gpt2_params(g, ps);
    ok = ok && TU_EXPECT(tensors_write(ps, (int)gpt2_num_params(g), r->p0)) &&
         TU_EXPECT(gpt2_trainer_create(g, &to, &tr) == SG_OK);
    sg_tensor *x = sg_empty(ctx, SG_I64, 2, bt), *y = sg_empty(ctx, SG_I64, 2, bt);
    gpt2_loader ld;
    ok = ok && TU_EXPECT(x && y) && TU_EXPECT(gpt2_loader_init(&ld, data, B, T) == SG_OK);
    for (int s = 0; ok && s < STEPS; s++) {
        gpt2_loader_next(&ld, tok, tgt);
        ok = TU_EXPECT(sg_write(x, tok, sizeof tok) == SG_OK) &&
             TU_EXPECT(sg_write(y, tgt, sizeof tgt) == SG_OK);
        if (ok && s == 0) { /* the eval step on the untrained model */
            ok = TU_EXPECT(gpt2_trainer_eval(tr, x, y, &loss) == SG_OK);
            tu_case(ok && fabs(loss - r->loss) <= 1e-5 * r->loss,
                    "EVAL_LOSS(mode=%s) got %.7f want %.7f", mn, loss, r->loss);
        }
        sg_tensor **grads = malloc(sizeof *grads * (size_t)tr->n);
        double lr = gpt2_lr_at(LR, s, 2, STEPS, 0.1);
        ok = ok && TU_EXPECT(gpt2_trainer_step(tr, x, y, lr, &curve[s], grads) == SG_OK);
        if (ok && s == 0) {
            tu_case(fabs(curve[0] - r->loss) <= 1e-5 * r->loss,
                    "LOSS(mode=%s,step=1) got %.7f want %.7f", mn, curve[0], r->loss);
            tu_case(tensors_read(grads, tr->n, got) && close_by_kind("grad", got, r->g, 1e-5, 1e-6),
                    "GRADS(mode=%s,step=1,clip=%g,norm=%.3f)", mn, CLIP, r->norm);
            tu_case(tensors_read(tr->params, tr->n, got) && check_update(got, r),
                    "ADAMW(mode=%s,step=1,lr=%g,wd=%g)", mn, lr, WD);
        }
        free(grads);
    }
    if (ok) { /* one capture serves every step: the lr changes through a tensor */
        sg_fn_stats st;
        bool compiled = mode != SG_MODE_EAGER;
        ok = TU_EXPECT(sg_fn_get_stats(tr->train_fn, &st) == SG_OK) &&
             TU_EXPECT(st.calls == STEPS) && TU_EXPECT(st.captures == compiled) &&
             TU_EXPECT(st.compiles == compiled) &&
             TU_EXPECT(st.replays == (compiled ? STEPS : 0)) &&
             TU_EXPECT(st.fallbacks == (compiled ? 0 : STEPS));
        tu_case(ok, "STATS(mode=%s,steps=%d) captures %llu replays %llu eager %llu", mn, STEPS,
                (unsigned long long)st.captures, (unsigned long long)st.replays,
                (unsigned long long)st.fallbacks);
    }
    if (!ok && sg_ctx_status(ctx) != SG_OK) fprintf(stderr, "  %s\n", sg_last_error(ctx));
    if (ok && mode == SG_MODE_REDUCE_OVERHEAD) check_checkpoint(ctx, g, x, ckpt_dir);
    if (!ok) tu_case(false, "TRAIN(mode=%s)", mn);
    free(got);
    free(ps);
    gpt2_trainer_destroy(tr);
    gpt2_destroy(g);
    sg_ctx_destroy(ctx);
}

/* The CUDA configuration on the CPU: bf16 weights and compute, f32 master
 * weights in AdamW, REDUCE_OVERHEAD; its loss curve follows f32's within
 * bf16's precision. */
static void run_bf16(const reference *r, const gpt2_tokens *data, const double *f32_curve) {
    sg_ctx *ctx = tu_ctx((sg_ctx_opts){0});
    gpt2 *g = NULL;
    gpt2_trainer *tr = NULL;
    int64_t bt[2] = {B, T}, tok[N], tgt[N];
    double curve[STEPS];
    gpt2_train_opts to = {.mode = SG_MODE_REDUCE_OVERHEAD,
                          .weight_decay = WD,
                          .grad_clip = CLIP,
                          .master_weights = true};
    bool ok = TU_EXPECT(gpt2_init(ctx, &tiny, SG_BF16, 1, &g) == SG_OK);
    sg_tensor **ps = malloc(sizeof *ps * (size_t)(ok ? gpt2_num_params(g) : 1));
    if (ok) gpt2_params(g, ps);
    ok = ok && TU_EXPECT(tensors_write(ps, (int)gpt2_num_params(g), r->p0)) &&
         TU_EXPECT(gpt2_trainer_create(g, &to, &tr) == SG_OK);
    sg_tensor *x = sg_empty(ctx, SG_I64, 2, bt), *y = sg_empty(ctx, SG_I64, 2, bt);
    gpt2_loader ld;
    ok = ok && TU_EXPECT(x && y) && TU_EXPECT(gpt2_loader_init(&ld, data, B, T) == SG_OK);
    for (int s = 0; ok && s < STEPS; s++) {
        gpt2_loader_next(&ld, tok, tgt);
        ok = TU_EXPECT(sg_write(x, tok, sizeof tok) == SG_OK) &&
             TU_EXPECT(sg_write(y, tgt, sizeof tgt) == SG_OK) &&
             TU_EXPECT(gpt2_trainer_step(tr, x, y, gpt2_lr_at(LR, s, 2, STEPS, 0.1), &curve[s],
                                         NULL) == SG_OK);
    }
    if (!ok && sg_ctx_status(ctx) != SG_OK) fprintf(stderr, "  %s\n", sg_last_error(ctx));
    ok = ok && tu_close("bf16 curve", curve, f32_curve, STEPS, 3e-2, 0);
    tu_case(
        ok,
        "CURVE(dtype=bf16,master_weights,mode=reduce-overhead vs f32,steps=%d) last %.4f vs %.4f",
        STEPS, ok ? curve[STEPS - 1] : NAN, f32_curve[STEPS - 1]);
    free(ps);
    gpt2_trainer_destroy(tr);
    gpt2_destroy(g);
    sg_ctx_destroy(ctx);
}

/* ------------------------------------------------------------ token files */

static void test_token_files(const char *dir) {
    char path[256];
    snprintf(path, sizeof path, "%s/tokens.bin", dir);
    enum { NT = 1000 };
    uint16_t tok[NT];
    for (int i = 0; i < NT; i++) tok[i] = (uint16_t)tu_randint(0, 65535);
    gpt2_tokens t = {0};
    bool ok = TU_EXPECT(gpt2_tokens_save(path, tok, NT) == SG_OK) &&
              TU_EXPECT(gpt2_tokens_load(path, &t) == SG_OK) && TU_EXPECT(t.n == NT) &&
              TU_EXPECT(memcmp(t.tok, tok, sizeof tok) == 0);
    /* Windows of B*T+1 tokens that advance by B*T and start over at the end. */
    gpt2_loader ld;
    int64_t x[N], y[N], nb = (NT - 1) / N;
    ok = ok && TU_EXPECT(gpt2_loader_init(&ld, &t, B, T) == SG_OK) &&
         TU_EXPECT(gpt2_loader_batches(&ld) == nb);
    for (int64_t w = 0; ok && w <= nb; w++) {
        gpt2_loader_next(&ld, x, y);
        int64_t start = w == nb ? 0 : w * N;
        for (int i = 0; i < N; i++) ok &= x[i] == tok[start + i] && y[i] == tok[start + i + 1];
        ok = TU_EXPECT(ok);
    }
    gpt2_tokens_free(&t);
    tu_case(ok, "TOKENS(n=%d,B=%d,T=%d,windows=%lld+wrap)", NT, B, T, (long long)nb);
    /* A bad magic (llm.c's checkpoint magic) and a truncated file. */
    FILE *f = fopen(path, "wb");
    int32_t h[256] = {20240326, 1, NT};
    ok = TU_EXPECT(f && fwrite(h, sizeof h, 1, f) == 1 && fwrite(tok, sizeof tok, 1, f) == 1);
    if (f) fclose(f);
    ok = ok && TU_EXPECT(gpt2_tokens_load(path, &t) == SG_ERR_INVALID_ARG);
    tu_case(ok, "TOKENS(bad magic 20240326) refused");
    h[0] = GPT2_TOKENS_MAGIC;
    f = fopen(path, "wb");
    ok = TU_EXPECT(f && fwrite(h, sizeof h, 1, f) == 1 && fwrite(tok, sizeof tok / 2, 1, f) == 1);
    if (f) fclose(f);
    ok = ok && TU_EXPECT(gpt2_tokens_load(path, &t) == SG_ERR_INVALID_ARG);
    tu_case(ok, "TOKENS(truncated: %d of %d) refused", NT / 2, NT);
    ok = TU_EXPECT(gpt2_tokens_load("/nonexistent/tokens.bin", &t) == SG_ERR_INVALID_ARG);
    tu_case(ok, "TOKENS(missing file) refused");
    unlink(path);
}

int main(void) {
    char dir[] = "/tmp/sg_train_gpt2_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    tu_seed(2024);
    test_token_files(dir);
    /* Three windows of data, so that the 10 steps revisit each batch. */
    enum { NT = 3 * N + 1 };
    uint16_t tok[NT];
    for (int i = 0; i < NT; i++) tok[i] = (uint16_t)tu_randint(0, V - 1);
    gpt2_tokens data = {tok, NT};
    reference r;
    make_reference(&r, &data);
    static const sg_mode modes[] = {SG_MODE_EAGER, SG_MODE_DEFAULT, SG_MODE_REDUCE_OVERHEAD};
    double curve[3][STEPS];
    for (int m = 0; m < 3; m++) run_mode(modes[m], &r, &data, curve[m], dir);
    for (int m = 1; m < 3; m++)
        tu_case(tu_close("curve", curve[m], curve[0], STEPS, 1e-4, 0),
                "CURVE(mode=%s vs eager,steps=%d) last %.6f vs %.6f", sg_mode_name(modes[m]), STEPS,
                curve[m][STEPS - 1], curve[0][STEPS - 1]);
    tu_case(curve[0][STEPS - 1] < curve[0][0] - 0.1, "CURVE(falls) %.4f -> %.4f", curve[0][0],
            curve[0][STEPS - 1]);
    run_bf16(&r, &data, curve[0]);
    free(r.p0), free(r.g), free(r.p1);
    rmdir(dir);
    return tu_finish();
}
