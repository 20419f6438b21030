/* SPDX-License-Identifier: MIT */
/*
 * test_example_gpt2.c -- the GPT-2 example's model (examples/gpt2/) against
 * an f64 reference forward written here in plain loops (llm.c's layer
 * functions): prefill logits of every and of the last position, and 8 greedy
 * decode steps over the KV cache (tokens equal, logits within f32
 * tolerance), eagerly and in each compiled mode, on a tiny config (2 layers,
 * 64 channels, 4 heads, vocabulary 100, 32 positions). Also: llm.c
 * checkpoints (f32 and bf16) written here, loaded and saved back, and the
 * tokenizer reader on a small file written here.
 */
#define _POSIX_C_SOURCE 200809L
#include "gpt2/model.h"
#include "gpt2/tokenizer.h"
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* bf16 activations through 2 blocks, against f64 */
#define BF16_RTOL 3e-2
#define BF16_ATOL 3e-2

enum { MAXT = 32, V = 100, VP = 128, L = 2, NH = 4, C = 64, HS = C / NH, B = 2, T0 = 5, STEPS = 8 };

/* The reference's parameters, f64, in the checkpoint's order and layout. */
typedef struct ref {
    double *wte, *wpe, *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb, *ln2w, *ln2b, *fcw, *fcb,
        *fcprojw, *fcprojb, *lnfw, *lnfb;
} ref;

static const int64_t ref_sizes[16] = {VP * C,       MAXT *C, L *C, L *C, L * 3 * C *C, L * 3 * C,
                                      L *C *C,      L *C,    L *C, L *C, L * 4 * C *C, L * 4 * C,
                                      L *C * 4 * C, L *C,    C,    C};

static int64_t ref_count(void) {
    int64_t n = 0;
    for (int i = 0; i < 16; i++) n += ref_sizes[i];
    return n;
}

static void ref_point(ref *r, double *p) {
    double **f = (double **)r;
    for (int i = 0; i < 16; i++, p += ref_sizes[i - 1]) f[i] = p;
}

/* Random parameters, scaled so that logits spread (clear argmax winners). */
static double *ref_params(ref *r) {
    double *p = malloc(sizeof(double) * (size_t)ref_count());
    ref_point(r, p);
    double **f = (double **)r;
    for (int i = 0; i < 16; i++) {
        int ln_weight = i == 2 || i == 8 || i == 14,
            bias = i == 3 || i == 5 || i == 7 || i == 9 || i == 11 || i == 13 || i == 15;
        for (int64_t j = 0; j < ref_sizes[i]; j++)
            f[i][j] = ln_weight ? tu_uniform(0.8, 1.2)
                      : bias    ? tu_uniform(-0.1, 0.1)
                      : i == 0  ? tu_uniform(-0.3, 0.3)
                                : tu_uniform(-0.12, 0.12);
    }
    for (int64_t j = V * C; j < VP * C; j++) r->wte[j] = 0; /* padding rows */
    return p;
}

/* out (T, C) = layernorm(x (T, C)) */
static void layernorm(double *out, const double *x, const double *w, const double *b, int T) {
    for (int t = 0; t < T; t++) {
        const double *xt = x + t * C;
        double m = 0, v = 0;
        for (int i = 0; i < C; i++) m += xt[i] / C;
        for (int i = 0; i < C; i++) v += (xt[i] - m) * (xt[i] - m) / C;
        for (int i = 0; i < C; i++) out[t * C + i] = (xt[i] - m) / sqrt(v + 1e-5) * w[i] + b[i];
    }
}

/* out (T, OC) = x (T, IC) @ w (OC, IC)^T + b */
static void matmul(double *out, const double *x, const double *w, const double *b, int T, int IC,
                   int OC) {
    for (int t = 0; t < T; t++)
        for (int o = 0; o < OC; o++) {
            double s = b ? b[o] : 0;
            for (int i = 0; i < IC; i++) s += x[t * IC + i] * w[o * IC + i];
            out[t * OC + o] = s;
        }
}

/* out (T, C) = causal attention of qkv (T, 3C) */
static void attention(double *out, const double *qkv, int T) {
    double att[MAXT];
    for (int t = 0; t < T; t++)
        for (int h = 0; h < NH; h++) {
            const double *q = qkv + t * 3 * C + h * HS;
            double mx = -INFINITY, sum = 0;
            for (int u = 0; u <= t; u++) {
                const double *k = qkv + u * 3 * C + C + h * HS;
                double s = 0;
                for (int i = 0; i < HS; i++) s += q[i] * k[i];
                att[u] = s / sqrt((double)HS);
                mx = fmax(mx, att[u]);
            }
            for (int u = 0; u <= t; u++) sum += (att[u] = exp(att[u] - mx));
            for (int i = 0; i < HS; i++) {
                double o = 0;
                for (int u = 0; u <= t; u++)
                    o += att[u] / sum * qkv[u * 3 * C + 2 * C + h * HS + i];
                out[t * C + h * HS + i] = o;
            }
        }
}

static double gelu_tanh(double x) {
    return 0.5 * x * (1 + tanh(sqrt(2 / 3.14159265358979323846) * (x + 0.044715 * x * x * x)));
}

/* logits (T, V) of one row of tokens (T) */
static void ref_forward(const ref *r, const int64_t *tok, int T, double *logits) {
    static double x[MAXT * C], h[MAXT * C], qkv[MAXT * 3 * C], y[MAXT * C], fc[MAXT * 4 * C];
    for (int t = 0; t < T; t++)
        for (int i = 0; i < C; i++) x[t * C + i] = r->wte[tok[t] * C + i] + r->wpe[t * C + i];
    for (int l = 0; l < L; l++) {
        layernorm(h, x, r->ln1w + l * C, r->ln1b + l * C, T);
        matmul(qkv, h, r->qkvw + l * 3 * C * C, r->qkvb + l * 3 * C, T, C, 3 * C);
        attention(y, qkv, T);
        matmul(h, y, r->attprojw + l * C * C, r->attprojb + l * C, T, C, C);
        for (int i = 0; i < T * C; i++) x[i] += h[i];
        layernorm(h, x, r->ln2w + l * C, r->ln2b + l * C, T);
        matmul(fc, h, r->fcw + l * 4 * C * C, r->fcb + l * 4 * C, T, C, 4 * C);
        for (int i = 0; i < T * 4 * C; i++) fc[i] = gelu_tanh(fc[i]);
        matmul(h, fc, r->fcprojw + l * C * 4 * C, r->fcprojb + l * C, T, 4 * C, C);
        for (int i = 0; i < T * C; i++) x[i] += h[i];
    }
    layernorm(h, x, r->lnfw, r->lnfb, T);
    matmul(logits, h, r->wte, NULL, T, C, V);
}

static int64_t argmax(const double *x, int n) {
    int64_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* An llm.c checkpoint of the reference's parameters in dt (f32: version 3,
 * bf16: version 5), stored with testutil's own conversions. */
static void write_checkpoint(const char *path, const double *p, sg_dtype dt) {
    int32_t h[256] = {20240326, dt == SG_F32 ? 3 : 5, MAXT, V, L, NH, C, VP};
    int64_t n = ref_count();
    void *buf = malloc((size_t)n * sg_dtype_size(dt));
    for (int64_t i = 0; i < n; i++) tu_store(buf, dt, i, p[i]);
    FILE *f = fopen(path, "wb");
    fwrite(h, sizeof h, 1, f);
    fwrite(buf, sg_dtype_size(dt), (size_t)n, f);
    fclose(f);
    free(buf);
}

/* A file's bytes (malloc'd) and size. */
static char *slurp(const char *path, long *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)*size + 1);
    if (fread(b, 1, (size_t)*size, f) != (size_t)*size) *size = -1;
    fclose(f);
    return b;
}

static bool same_file(const char *a, const char *b) {
    long na = -1, nb = -2;
    char *x = slurp(a, &na), *y = slurp(b, &nb);
    bool same = x && y && na == nb && memcmp(x, y, (size_t)na) == 0;
    free(x);
    free(y);
    return same;
}

/* Checkpoints: f32 loads and saves back byte for byte; saved as bf16 it is
 * the file testutil rounds independently; a bf16 file loads to the rounded
 * values (read back through an f32 save). */
static void test_checkpoints(const char *dir, const double *p) {
    char f32[512], bf16[512], out[512];
    snprintf(f32, sizeof f32, "%s/f32.bin", dir);
    snprintf(bf16, sizeof bf16, "%s/bf16.bin", dir);
    snprintf(out, sizeof out, "%s/out.bin", dir);
    write_checkpoint(f32, p, SG_F32);
    write_checkpoint(bf16, p, SG_BF16);
    sg_ctx *ctx = tu_ctx((sg_ctx_opts){0});
    gpt2 *g = NULL;
    bool ok = TU_EXPECT(gpt2_load(ctx, f32, SG_F32, &g) == SG_OK) &&
              TU_EXPECT(g->cfg.max_t == MAXT && g->cfg.vocab == V && g->cfg.n_layer == L &&
                        g->cfg.n_head == NH && g->cfg.channels == C && g->cfg.padded_vocab == VP) &&
              TU_EXPECT(gpt2_save(g, out, SG_F32) == SG_OK) && TU_EXPECT(same_file(f32, out));
    tu_case(ok, "GPT2_CHECKPOINT(file=f32,load=f32,save=f32) seed=1");
    ok = g && TU_EXPECT(gpt2_save(g, out, SG_BF16) == SG_OK) && TU_EXPECT(same_file(bf16, out));
    tu_case(ok, "GPT2_CHECKPOINT(file=f32,load=f32,save=bf16) seed=1");
    gpt2_destroy(g);
    g = NULL;
    ok = TU_EXPECT(gpt2_load(ctx, bf16, SG_BF16, &g) == SG_OK) && TU_EXPECT(g->dtype == SG_BF16) &&
         TU_EXPECT(gpt2_save(g, out, SG_BF16) == SG_OK) && TU_EXPECT(same_file(bf16, out));
    gpt2_destroy(g);
    g = NULL;
    if (ok)
        ok = TU_EXPECT(gpt2_load(ctx, bf16, SG_F32, &g) == SG_OK) &&
             TU_EXPECT(gpt2_save(g, out, SG_F32) == SG_OK);
    if (ok) {
        long n = 0;
        char *b = slurp(out, &n);
        int64_t np = ref_count(), bad = 0;
        ok = TU_EXPECT(n == 1024 + 4 * np);
        for (int64_t i = 0; ok && i < np; i++)
            bad += tu_load(b + 1024, SG_F32, i) != tu_round(SG_BF16, p[i]);
        ok = ok && TU_EXPECT(bad == 0);
        free(b);
    }
    tu_case(ok, "GPT2_CHECKPOINT(file=bf16,load=bf16|f32,save=bf16|f32) seed=1");
    gpt2_destroy(g);
    /* A truncated file and a wrong magic are errors, not crashes. */
    FILE *f = fopen(out, "wb");
    int32_t h[256] = {20240326, 3, MAXT, V, L, NH, C, VP};
    fwrite(h, sizeof h, 1, f);
    fclose(f);
    g = NULL;
    ok = TU_EXPECT(gpt2_load(ctx, out, SG_F32, &g) != SG_OK && g == NULL);
    h[0] = 1234;
    f = fopen(out, "wb");
    fwrite(h, sizeof h, 1, f);
    fclose(f);
    ok = ok && TU_EXPECT(gpt2_load(ctx, out, SG_F32, &g) == SG_ERR_INVALID_ARG && g == NULL);
    h[0] = 20240326, h[5] = 3; /* 64 channels do not split into 3 heads */
    f = fopen(out, "wb");
    fwrite(h, sizeof h, 1, f);
    fclose(f);
    ok = ok && TU_EXPECT(gpt2_load(ctx, out, SG_F32, &g) == SG_ERR_INVALID_ARG && g == NULL);
    tu_case(ok, "GPT2_CHECKPOINT(file=truncated|bad_magic|bad_heads) -> error");
    sg_ctx_destroy(ctx);
}

/* The gap between the largest and the second largest of x. */
static double margin(const double *x, int n) {
    int64_t best = argmax(x, n);
    double second = -INFINITY;
    for (int i = 0; i < n; i++)
        if (i != best && x[i] > second) second = x[i];
    return x[best] - second;
}

/* Prefill then 8 greedy decode steps in one mode and dtype, against the
 * reference (r holds the checkpoint's values). In f32 the tokens are the
 * reference's own greedy tokens; in bf16 the model's tokens drive both, and
 * must equal the reference's wherever its top two logits are apart by more
 * than bf16 can blur. */
static void test_generate(const char *ckpt, const ref *r, sg_mode mode, sg_dtype dt) {
    double rtol = dt == SG_F32 ? 1e-5 : BF16_RTOL, atol = dt == SG_F32 ? 1e-5 : BF16_ATOL;
    sg_ctx *ctx = tu_ctx((sg_ctx_opts){0});
    gpt2 *g = NULL;
    int64_t seq[B][T0 + STEPS + 1], shape[2] = {B, T0}, one = 1;
    static double want[B][(T0 + STEPS) * V];
    double *vals = NULL;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T0; t++) seq[b][t] = tu_randint(0, V - 1);
    bool ok = TU_EXPECT(gpt2_load(ctx, ckpt, dt, &g) == SG_OK) &&
              TU_EXPECT(gpt2_cache_create(g, B, MAXT, &(sg_compile_opts){.mode = mode}) == SG_OK);
    int64_t prompt[B * T0];
    for (int b = 0; b < B; b++) memcpy(prompt + b * T0, seq[b], sizeof(int64_t) * T0);
    sg_tensor *tokens = sg_from_host(ctx, SG_I64, 2, shape, prompt), *logits = NULL;
    /* prefill, every position, then the last position only */
    for (int b = 0; b < B; b++) ref_forward(r, seq[b], T0, want[b]);
    ok = ok && TU_EXPECT(gpt2_prefill(g, tokens, true, &logits) == SG_OK) &&
         TU_EXPECT(sg_tensor_numel(logits) == B * T0 * V);
    if (ok) {
        vals = tu_read(logits);
        for (int b = 0; b < B && ok; b++)
            ok = tu_close("prefill_all", vals + b * T0 * V, want[b], T0 * V, rtol, atol);
        free(vals);
    }
    if (!ok) fprintf(stderr, "  %s\n", sg_last_error(ctx));
    tu_case(ok, "GPT2_PREFILL(mode=%s,dtype=%s,B=%d,T=%d,all=1) seed=2", sg_mode_name(mode),
            sg_dtype_name(dt), B, T0);
    ok = ok && TU_EXPECT(gpt2_prefill(g, tokens, false, &logits) == SG_OK) &&
         TU_EXPECT(sg_tensor_numel(logits) == B * V);
    if (ok) {
        vals = tu_read(logits);
        for (int b = 0; b < B && ok; b++)
            ok = tu_close("prefill_last", vals + b * V, want[b] + (T0 - 1) * V, V, rtol, atol);
        free(vals);
    }
    tu_case(ok, "GPT2_PREFILL(mode=%s,dtype=%s,B=%d,T=%d,all=0) seed=2", sg_mode_name(mode),
            sg_dtype_name(dt), B, T0);
    /* decode: the step advances token and pos itself */
    int64_t next[B];
    for (int b = 0; b < B; b++) next[b] = seq[b][T0] = argmax(want[b] + (T0 - 1) * V, V);
    sg_tensor *token = sg_from_host(ctx, SG_I64, 1, &shape[0], next);
    sg_tensor *pos = sg_full(ctx, SG_I64, 1, &one, T0);
    bool dec = ok;
    for (int s = 0; s < STEPS && dec; s++) {
        int T = T0 + s + 1;
        int64_t p = -1;
        dec = TU_EXPECT(gpt2_decode(g, token, pos, &logits) == SG_OK) &&
              TU_EXPECT(sg_tensor_numel(logits) == B * V) &&
              TU_EXPECT(sg_read(token, next, sizeof next) == SG_OK) &&
              TU_EXPECT(sg_read(pos, &p, sizeof p) == SG_OK) && TU_EXPECT(p == T);
        vals = dec ? tu_read(logits) : NULL;
        for (int b = 0; b < B && dec; b++) {
            ref_forward(r, seq[b], T, want[b]);
            const double *w = want[b] + (T - 1) * V;
            seq[b][T] = dt == SG_F32 ? argmax(w, V) : next[b];
            dec = tu_close("decode", vals + b * V, w, V, rtol, atol) &&
                  TU_EXPECT(next[b] == argmax(w, V) || (dt != SG_F32 && margin(w, V) < 4 * atol));
        }
        free(vals);
    }
    tu_case(dec, "GPT2_DECODE(mode=%s,dtype=%s,B=%d,T0=%d,steps=%d,greedy) seed=2",
            sg_mode_name(mode), sg_dtype_name(dt), B, T0, STEPS);
    gpt2_destroy(g);
    sg_ctx_destroy(ctx);
}

/* A tokenizer file of version 2 (with eot) and one of version 1, and a
 * truncated one. */
static void test_tokenizer(const char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/tok.bin", dir);
    static const char *words[4] = {"!", " hello", "", "<|endoftext|>"};
    bool ok = true;
    for (uint32_t version = 1; version <= 3; version++) {
        uint32_t h[256] = {20240328, version == 3 ? 2 : version, 4, 3};
        FILE *f = fopen(path, "wb");
        fwrite(h, sizeof h, 1, f);
        for (int i = 0; i < (version == 3 ? 3 : 4); i++) { /* version 3 here: truncated */
            unsigned char n = (unsigned char)strlen(words[i]);
            fwrite(&n, 1, 1, f);
            fwrite(words[i], 1, n, f);
        }
        fclose(f);
        gpt2_tokenizer tok = {0, -1, NULL, NULL};
        int rc = gpt2_tokenizer_load(&tok, path);
        if (version == 3) {
            ok = TU_EXPECT(rc == -1 && tok.text == NULL);
            tu_case(ok, "GPT2_TOKENIZER(truncated) -> error");
            continue;
        }
        ok = TU_EXPECT(rc == 0) && TU_EXPECT(tok.vocab == 4) &&
             TU_EXPECT(tok.eot == (version == 2 ? 3 : -1));
        for (int i = 0; ok && i < 4; i++)
            ok = TU_EXPECT(strcmp(gpt2_tokenizer_decode(&tok, i), words[i]) == 0) &&
                 TU_EXPECT(tok.length[i] == strlen(words[i]));
        ok = ok && TU_EXPECT(gpt2_tokenizer_decode(&tok, 4) == NULL) &&
             TU_EXPECT(gpt2_tokenizer_decode(&tok, -1) == NULL);
        gpt2_tokenizer_free(&tok);
        tu_case(ok, "GPT2_TOKENIZER(version=%u,vocab=4)", version);
    }
}

int main(void) {
    char dir[] = "/tmp/sg_gpt2_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    tu_seed(1);
    ref r;
    double *p = ref_params(&r);
    test_checkpoints(dir, p);
    test_tokenizer(dir);
    char ckpt[600];
    snprintf(ckpt, sizeof ckpt, "%s/f32.bin", dir);
    for (sg_mode m = SG_MODE_DEFAULT; m <= SG_MODE_MAX_AUTOTUNE_NO_GRAPHS; m++) {
        tu_seed(2);
        test_generate(ckpt, &r, m, SG_F32);
    }
    /* bf16 weights and activations, as on a GPU: the reference runs the
     * checkpoint's bf16 values in f64 */
    snprintf(ckpt, sizeof ckpt, "%s/bf16.bin", dir);
    for (int64_t i = 0; i < ref_count(); i++) p[i] = tu_round(SG_BF16, p[i]);
    const sg_mode bf16_modes[2] = {SG_MODE_EAGER, SG_MODE_REDUCE_OVERHEAD};
    for (int k = 0; k < 2; k++) {
        tu_seed(2);
        test_generate(ckpt, &r, bf16_modes[k], SG_BF16);
    }
    free(p);
    const char *files[4] = {"f32.bin", "bf16.bin", "out.bin", "tok.bin"};
    for (int i = 0; i < 4; i++) {
        char path[600];
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        unlink(path);
    }
    rmdir(dir);
    return tu_finish();
}
