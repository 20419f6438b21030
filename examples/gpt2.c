/* SPDX-License-Identifier: MIT */
/*
 * gpt2.c -- GPT-2 text generation with stepgraph: loads an llm.c checkpoint
 * (or makes seeded random weights), prefills the prompt tokens, then decodes
 * greedily one token per compiled step (argmax on the device), printing each
 * token and the tokens per second. It encodes nothing: the prompt is token
 * ids; with llm.c's gpt2_tokenizer.bin the ids are printed as text.
 *
 *   gpt2 [--model gpt2_124M.bin] [--tokenizer gpt2_tokenizer.bin]
 *        [--backend auto|cpu|cuda] [--mode eager|default|reduce-overhead|...]
 *        [--dtype f32|bf16] [--steps N] [--seed N] [--tiny] [token ...]
 */
#define _POSIX_C_SOURCE 200809L
#include "args.h"
#include "gpt2/model.h"
#include "gpt2/tokenizer.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void usage(FILE *f) {
    fprintf(f, "usage: gpt2 [--model FILE] [--tokenizer FILE] [--backend auto|cpu|cuda]\n"
               "            [--mode eager|default|reduce-overhead|max-autotune|"
               "max-autotune-no-cudagraphs]\n"
               "            [--dtype f32|bf16] [--steps N] [--seed N] [--tiny] [token ...]\n"
               "Without --model: seeded random GPT-2 124M weights (--tiny: 2 layers, 64 "
               "channels).\n"
               "Tokens are GPT-2 ids (default: 50256 464 2068 7586 21831, "
               "\"<|endoftext|>The quick brown fox\").\n"
               "Defaults: reduce-overhead, bf16 on CUDA and f32 on the CPU, 32 steps.\n");
}

typedef struct args {
    const char *model, *tokenizer;
    sg_backend backend;
    sg_mode mode;
    int dtype; /* -1: by backend */
    int steps, tiny;
    uint64_t seed;
    int64_t prompt[256];
    int n_prompt;
} args;

static int parse(int argc, char **argv, args *a) {
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int takes = strcmp(s, "--model") == 0 || strcmp(s, "--tokenizer") == 0 ||
                    strcmp(s, "--backend") == 0 || strcmp(s, "--mode") == 0 ||
                    strcmp(s, "--dtype") == 0 || strcmp(s, "--steps") == 0 ||
                    strcmp(s, "--seed") == 0;
        if (takes && !v) return fprintf(stderr, "gpt2: %s needs a value\n", s), 2;
        if (strcmp(s, "--help") == 0 || strcmp(s, "-h") == 0) return usage(stdout), 1;
        if (strcmp(s, "--tiny") == 0) {
            a->tiny = 1;
            continue;
        }
        if (!takes) {
            long long t = 0;
            if (!arg_int(s, 0, LLONG_MAX, &t))
                return fprintf(stderr, "gpt2: unknown argument '%s'\n", s), 2;
            if (a->n_prompt == 256)
                return fprintf(stderr, "gpt2: at most 256 prompt tokens ('%s' is the 257th)\n", s),
                       2;
            a->prompt[a->n_prompt++] = t;
            continue;
        }
        i++;
        if (strcmp(s, "--model") == 0) a->model = v;
        if (strcmp(s, "--tokenizer") == 0) a->tokenizer = v;
        long long n = 0;
        if (strcmp(s, "--steps") == 0) {
            if (!arg_int(v, 0, 1 << 20, &n))
                return fprintf(stderr, "gpt2: --steps takes a whole number in [0, %d], not '%s'\n",
                               1 << 20, v),
                       2;
            a->steps = (int)n;
        }
        if (strcmp(s, "--seed") == 0) {
            if (!arg_int(v, 0, LLONG_MAX, &n))
                return fprintf(stderr, "gpt2: --seed takes a whole number >= 0, not '%s'\n", v), 2;
            a->seed = (uint64_t)n;
        }
        if (strcmp(s, "--dtype") == 0) {
            if (strcmp(v, "bf16") != 0 && strcmp(v, "f32") != 0)
                return fprintf(stderr, "gpt2: --dtype takes f32 or bf16, not '%s'\n", v), 2;
            a->dtype = strcmp(v, "bf16") == 0 ? SG_BF16 : SG_F32;
        }
        if (strcmp(s, "--backend") == 0) {
            if (strcmp(v, "cuda") != 0 && strcmp(v, "cpu") != 0 && strcmp(v, "auto") != 0)
                return fprintf(stderr, "gpt2: --backend takes auto, cpu or cuda, not '%s'\n", v), 2;
            a->backend = strcmp(v, "cuda") == 0  ? SG_BACKEND_CUDA
                         : strcmp(v, "cpu") == 0 ? SG_BACKEND_CPU
                                                 : SG_BACKEND_AUTO;
        }
        if (strcmp(s, "--mode") == 0) {
            int found = 0;
            for (sg_mode m = SG_MODE_DEFAULT; m <= SG_MODE_MAX_AUTOTUNE_NO_GRAPHS; m++)
                if (strcmp(v, sg_mode_name(m)) == 0) a->mode = m, found = 1;
            if (!found) return fprintf(stderr, "gpt2: unknown mode '%s'\n", v), 2;
        }
    }
    return 0;
}

static void print_token(const gpt2_tokenizer *tok, int64_t id) {
    const char *s = gpt2_tokenizer_decode(tok, id);
    if (s)
        fwrite(s, 1, tok->length[id], stdout);
    else
        printf(" %lld", (long long)id);
    fflush(stdout);
}

/* Prefill, then steps greedy decode steps; prints as it goes. */
static int generate(gpt2 *g, const args *a, const gpt2_tokenizer *tok) {
    sg_ctx *ctx = g->ctx;
    int64_t T = a->n_prompt, shape[2] = {1, T}, one = 1, next;
    for (int64_t i = 0; i < T; i++) print_token(tok, a->prompt[i]);
    sg_tensor *tokens = sg_from_host(ctx, SG_I64, 2, shape, a->prompt), *logits;
    double t0 = now();
    if (gpt2_prefill(g, tokens, false, &logits) != SG_OK) return 1;
    sg_tensor *token = sg_argmax(logits, -1, false);
    sg_tensor *pos = sg_full(ctx, SG_I64, 1, &one, (double)T);
    if (!token || !pos || sg_read(token, &next, sizeof next) != SG_OK) return 1;
    double t_prefill = now() - t0;
    print_token(tok, next);
    /* the first decode call captures and compiles: timed apart */
    double t_first = 0, t_rest = 0;
    for (int s = 0; s < a->steps; s++) {
        t0 = now();
        if (gpt2_decode(g, token, pos, &logits) != SG_OK) return 1;
        if (sg_read(token, &next, sizeof next) != SG_OK) return 1; /* the greedy next token */
        *(s ? &t_rest : &t_first) += now() - t0;
        print_token(tok, next);
    }
    printf("\nprefill: %lld tokens in %.3f s (first call: capture and compile included)",
           (long long)T, t_prefill);
    if (a->steps == 0)
        printf("; no decode steps (--steps 0)\n");
    else if (a->steps == 1)
        printf("; decode: one step, %.3f s (first call)\n", t_first);
    else
        printf("; decode: first step %.3f s (first call), then %d tokens at %.1f tokens/s\n",
               t_first, a->steps - 1, (a->steps - 1) / (t_rest > 0 ? t_rest : 1e-9));
    return 0;
}

int main(int argc, char **argv) {
    args a = {NULL, NULL, SG_BACKEND_AUTO, SG_MODE_REDUCE_OVERHEAD, -1, 32, 0, 1337, {0}, 0};
    int rc = parse(argc, argv, &a);
    if (rc) return rc == 1 ? 0 : rc;
    bool fox_prompt = a.n_prompt == 0; /* GPT-2's ids: taken modulo a smaller vocabulary */
    if (fox_prompt) {
        static const int64_t fox[5] = {50256, 464, 2068, 7586, 21831};
        memcpy(a.prompt, fox, sizeof fox);
        a.n_prompt = 5;
    }
    sg_ctx *ctx;
    if (sg_ctx_create(&(sg_ctx_opts){.backend = a.backend}, &ctx) != SG_OK) {
        fprintf(stderr, "gpt2: %s\n", sg_last_error(NULL));
        return 1;
    }
    sg_dtype dt = a.dtype >= 0                             ? (sg_dtype)a.dtype
                  : sg_ctx_backend(ctx) == SG_BACKEND_CUDA ? SG_BF16
                                                           : SG_F32;
    gpt2 *g = NULL;
    gpt2_config cfg = a.tiny ? (gpt2_config){32, 100, 2, 4, 64, 0}
                             : (gpt2_config){1024, 50257, 12, 12, 768, 50304};
    sg_status st = a.model ? gpt2_load(ctx, a.model, dt, &g) : gpt2_init(ctx, &cfg, dt, a.seed, &g);
    if (st != SG_OK) {
        fprintf(stderr, "gpt2: %s %s: %s: %s\n", a.model ? "cannot load" : "cannot make weights",
                a.model ? a.model : "", sg_status_str(st), gpt2_error(ctx));
        sg_ctx_destroy(ctx);
        return 1;
    }
    int64_t slots = a.n_prompt + a.steps + 1;
    if (slots > g->cfg.max_t) slots = g->cfg.max_t;
    int bad = -1;
    for (int i = 0; i < a.n_prompt && bad < 0; i++)
        if (fox_prompt)
            a.prompt[i] %= g->cfg.vocab;
        else if (a.prompt[i] >= g->cfg.vocab)
            bad = i;
    gpt2_tokenizer tok = {0, -1, NULL, NULL};
    if (a.tokenizer && gpt2_tokenizer_load(&tok, a.tokenizer) != 0)
        fprintf(stderr, "gpt2: cannot read tokenizer %s; printing token ids\n", a.tokenizer);
    printf("GPT-2 L=%lld C=%lld V=%lld, %s %s, mode %s\n", (long long)g->cfg.n_layer,
           (long long)g->cfg.channels, (long long)g->cfg.vocab,
           sg_backend_name(sg_ctx_backend(ctx)), sg_dtype_name(dt), sg_mode_name(a.mode));
    if (bad >= 0) {
        fprintf(stderr, "gpt2: prompt token %lld is not below the vocabulary's %lld\n",
                (long long)a.prompt[bad], (long long)g->cfg.vocab);
        rc = 2;
    } else if (a.n_prompt + a.steps > g->cfg.max_t) {
        fprintf(stderr, "gpt2: %d prompt tokens + %d steps exceed the %lld positions\n", a.n_prompt,
                a.steps, (long long)g->cfg.max_t);
        rc = 2;
    } else if (gpt2_cache_create(g, 1, slots, &(sg_compile_opts){.mode = a.mode}) != SG_OK ||
               generate(g, &a, &tok) != 0) {
        fprintf(stderr, "gpt2: %s\n", sg_last_error(ctx));
        rc = 1;
    }
    gpt2_tokenizer_free(&tok);
    gpt2_destroy(g);
    sg_ctx_destroy(ctx);
    return rc;
}
