/* SPDX-License-Identifier: MIT */
/*
 * bench.c -- the reference workloads through stepgraph, eager against
 * every compiled mode, timed as bench/README.md says (and as torch_ref.py
 * times PyTorch): a host loop of `steps` steps synchronized at the end,
 * median of `loops` loops, after 3 warm-up calls and 20 untimed steps.
 * first_s is the wall time of the first three calls (capture, fusion,
 * compile or cache load, planning, graph recording).
 *
 *   bench --help
 *
 * W1s/W1l: a 24-op pointwise chain; W2: an 8-layer MLP at batch 1; W3: GPT-2
 * decode of one token over a KV cache; W4: an MLP training step; W5: GPT-2
 * prefill of 4 x 512 tokens; W6: a GPT-2 training step over 4 x 1024
 * tokens. W3, W5 and W6 use the model of examples/gpt2, W6 its trainer.
 * Besides the table (stdout), one line per figure starts with "RESULT"
 * (stderr) for bench/run.sh to merge with PyTorch's; --check writes what
 * run.sh compares with PyTorch's output.
 */
#define _POSIX_C_SOURCE 200809L
#include "gpt2/model.h"
#include "gpt2/train.h"

#include <stepgraph.h>

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* ------------------------------------------------------------ options */

static const char *modes_arg;         /* --modes: a comma list (NULL: every mode) */
/* Every mode, in the order the table shows them: eager first, the baseline. */
static const sg_mode mode_order[5] = {SG_MODE_EAGER, SG_MODE_DEFAULT, SG_MODE_REDUCE_OVERHEAD,
                                      SG_MODE_MAX_AUTOTUNE, SG_MODE_MAX_AUTOTUNE_NO_GRAPHS};
static const char *gpt2_path;         /* --gpt2: checkpoint to load, or to write if absent */
static const char *check_dir;         /* --check: where the W3/W5 outputs go */
static bool full_cpu;                 /* --full: 124M GPT-2 on the CPU too */
static bool first_only;               /* --first-only: time the first three calls only */
static const char *w6_dtype;          /* --w6-dtype: bf16 or f32 (NULL: the backend's) */
static int w6_warmup;                 /* --w6-warmup: the check's lr warm-up, in steps (0: none) */
static const char *tag = "stepgraph"; /* "stepgraph-<SG_BENCH_TAG>" when set */

static const char *const work_names[] = {"w1s", "w1l", "w2", "w3", "w4", "w5", "w6"};
#define NUM_WORKS 7
enum { W1S, W1L, W2, W3, W4, W5, W6 }; /* indices into work_names and work_on */
static bool work_on[NUM_WORKS];

static void usage(FILE *f) {
    fprintf(f, "usage: bench [--backend auto|cpu|cuda] [--modes m1,m2,...] [--gpt2 FILE]\n"
               "             [--check DIR] [--full] [--first-only] [--w6-dtype DT]\n"
               "             [--w6-warmup N] [workload ...]\n"
               "\n"
               "Runs each workload through stepgraph in every mode and prints a table\n"
               "(stdout); progress and RESULT lines for bench/run.sh go to stderr.\n"
               "  workloads   w1s w1l w2 w3 w4 w5 w6 (default: all); the spec of each is in\n"
               "              bench/README.md\n"
               "  --backend   auto (default: CUDA when a GPU is there, else the CPU), cpu, cuda\n"
               "  --modes     a comma list of eager, default, reduce-overhead, max-autotune,\n"
               "              max-autotune-no-cudagraphs (default: all)\n"
               "  --gpt2 FILE the llm.c checkpoint W3/W5/W6 load; when FILE does not exist it is\n"
               "              written from the seeded random init (default: no file, seeded init)\n"
               "  --check DIR write W3's 32 greedy tokens and logits, W5's last-position\n"
               "              logits, W4's losses after 1, 10, 50 steps and W6's after 1..20\n"
               "              steps per mode into DIR, for run.sh to compare with PyTorch\n"
               "  --full      W3/W5/W6 at GPT-2 124M and W4 at its full width on the CPU too\n"
               "              (default there: reduced sizes, so that the CPU run stays short)\n"
               "  --first-only time only the first three calls of each mode (first_s; the\n"
               "              us column is then 0): run.sh's cold- and warm-cache runs\n"
               "  --w6-dtype DT  W6's precision: bf16 (with f32 master weights) or f32\n"
               "              (default: bf16 on CUDA, f32 on the CPU)\n"
               "  --w6-warmup N  W6's --check steps warm the lr up linearly over N steps\n"
               "              (step s at 3e-4 min(1, s / N)), as torch_ref.py's does; the\n"
               "              timed steps are unchanged (default 0: 3e-4 throughout)\n"
               "Environment: SG_BENCH_TAG=x names the RESULT lines stepgraph-x.\n");
}

static bool mode_named(const char *list, sg_mode m) {
    const char *name = sg_mode_name(m), *p = list;
    size_t n = strlen(name);
    while (*p) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && strncmp(p, name, n) == 0) return true;
        p += len + (e != NULL);
    }
    return false;
}

static bool mode_wanted(sg_mode m) { return !modes_arg || mode_named(modes_arg, m); }

/* Every name in a --modes list is a mode. */
static const char *bad_mode(const char *list) {
    static char bad[64];
    const char *p = list;
    while (*p) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        bool ok = false;
        for (int k = 0; k < 5; k++)
            ok |= len == strlen(sg_mode_name(mode_order[k])) &&
                  strncmp(p, sg_mode_name(mode_order[k]), len) == 0;
        if (!ok) {
            snprintf(bad, sizeof bad, "%.*s", (int)(len < 60 ? len : 60), p);
            return bad;
        }
        p += len + (e != NULL);
    }
    return NULL;
}

/* 0: run; 1: --help done; 2: bad arguments (said on stderr). */
static int parse_args(int argc, char **argv, sg_backend *backend) {
    bool any = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool takes = !strcmp(a, "--backend") || !strcmp(a, "--modes") || !strcmp(a, "--gpt2") ||
                     !strcmp(a, "--check") || !strcmp(a, "--w6-dtype") || !strcmp(a, "--w6-warmup");
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return usage(stdout), 1;
        if (takes && i + 1 == argc) return fprintf(stderr, "bench: %s needs a value\n", a), 2;
        if (!strcmp(a, "--full")) {
            full_cpu = true;
        } else if (!strcmp(a, "--first-only")) {
            first_only = true;
        } else if (!strcmp(a, "--w6-dtype")) {
            w6_dtype = argv[++i];
            if (strcmp(w6_dtype, "bf16") && strcmp(w6_dtype, "f32"))
                return fprintf(stderr, "bench: unknown --w6-dtype '%s' (bf16, f32)\n", w6_dtype), 2;
        } else if (!strcmp(a, "--w6-warmup")) {
            char *end;
            long n = strtol(argv[++i], &end, 10);
            if (end == argv[i] || *end || n < 0 || n > 1000000)
                return fprintf(
                           stderr,
                           "bench: --w6-warmup '%s' is not a number of steps from 0 to 1000000\n",
                           argv[i]),
                       2;
            w6_warmup = (int)n;
        } else if (!strcmp(a, "--backend")) {
            const char *v = argv[++i];
            if (!strcmp(v, "auto"))
                *backend = SG_BACKEND_AUTO;
            else if (!strcmp(v, "cpu"))
                *backend = SG_BACKEND_CPU;
            else if (!strcmp(v, "cuda"))
                *backend = SG_BACKEND_CUDA;
            else
                return fprintf(stderr, "bench: unknown backend '%s' (auto, cpu, cuda)\n", v), 2;
        } else if (!strcmp(a, "--modes")) {
            const char *bad = bad_mode(modes_arg = argv[++i]);
            if (bad) return fprintf(stderr, "bench: unknown mode '%s' in --modes\n", bad), 2;
        } else if (!strcmp(a, "--gpt2")) {
            gpt2_path = argv[++i];
        } else if (!strcmp(a, "--check")) {
            check_dir = argv[++i];
        } else {
            int w = 0;
            while (w < NUM_WORKS && strcasecmp(a, work_names[w]) != 0) w++;
            if (w == NUM_WORKS)
                return fprintf(stderr, "bench: unknown argument '%s' (bench --help)\n", a), 2;
            work_on[w] = any = true;
        }
    }
    for (int w = 0; w < NUM_WORKS && !any; w++) work_on[w] = true;
    return 0;
}

/* ------------------------------------------------------------ timing */

/*
 * A workload as the timer sees it: begin compiles it in a mode, step runs
 * one timed step (sg_mark_step_begin included), rewind (untimed, may be
 * NULL) puts state back before each loop, check (may be NULL) writes the
 * outputs for --check, end frees what begin made.
 */
typedef struct workload {
    const char *name;
    int steps, loops;
    sg_ctx *ctx;
    sg_status (*begin)(struct workload *, sg_mode);
    sg_status (*step)(struct workload *);
    sg_status (*rewind)(struct workload *);
    sg_status (*check)(struct workload *, sg_mode);
    void (*end)(struct workload *);
    void *state;
    sg_fn *(*fn)(struct workload *); /* the timed fn, for its kernel count */
} workload;

typedef struct result {
    double us, first_s, peak_mib;
    int ok;
} result;

static sg_status run_steps(workload *w, int n) {
    sg_status st = w->rewind ? w->rewind(w) : SG_OK;
    for (int i = 0; i < n && st == SG_OK; i++) st = w->step(w);
    return st == SG_OK ? sg_ctx_synchronize(w->ctx) : st;
}

/* Kernels per step as sg_fn_explain counts them: the "kernels: N" of each
 * capture of fn (generated kernels and library calls; a step with graph
 * breaks has several captures); -1 when fn is NULL. */
static int explain_kernels(sg_fn *fn, int *captures) {
    *captures = 0;
    if (!fn) return -1;
    int total = 0;
    for (const char *t = sg_fn_explain(fn); (t = strstr(t, "    kernels: ")) != NULL;) {
        t += strlen("    kernels: ");
        total += atoi(t); /* "none" (a backend_fn's capture) reads 0 */
        (*captures)++;
    }
    return total;
}

static result time_mode(workload *w, sg_mode mode) {
    result r = {0, 0, 0, 0};
    double per[16];
    sg_ctx_reset_peak_memory(w->ctx);
    fprintf(stderr, "bench: %s %s\n", w->name, sg_mode_name(mode));
    if (w->begin(w, mode) != SG_OK) goto done;
    double t0 = now();
    if (run_steps(w, 3) != SG_OK) goto done;
    r.first_s = now() - t0;
    if (!first_only && run_steps(w, w->steps < 20 ? w->steps : 20) != SG_OK) goto done;
    for (int l = 0; l < (first_only ? 0 : w->loops); l++) {
        if (w->rewind && w->rewind(w) != SG_OK) goto done;
        t0 = now();
        for (int i = 0; i < w->steps; i++)
            if (w->step(w) != SG_OK) goto done;
        if (sg_ctx_synchronize(w->ctx) != SG_OK) goto done;
        per[l] = (now() - t0) / w->steps * 1e6;
    }
    if (!first_only) {
        qsort(per, (size_t)w->loops, sizeof per[0], cmp_double);
        r.us = per[w->loops / 2];
        int ncap, nk = explain_kernels(w->fn ? w->fn(w) : NULL, &ncap);
        if (nk >= 0 && ncap > 0)
            fprintf(stderr, "bench: %s %s: %d kernels per step (sg_fn_explain, %d capture%s)\n",
                    w->name, sg_mode_name(mode), nk, ncap, ncap == 1 ? "" : "s");
    }
    sg_memory_stats ms;
    if (sg_ctx_memory_stats(w->ctx, &ms) == SG_OK)
        r.peak_mib = (double)ms.device_peak_bytes / (1 << 20);
    r.ok = !check_dir || !w->check || first_only || w->check(w, mode) == SG_OK;
done:
    if (!r.ok) fprintf(stderr, "  %s %s: %s\n", w->name, sg_mode_name(mode), sg_last_error(w->ctx));
    w->end(w);
    return r;
}

/* Rows that said "failed": the exit status says so too. */
static int failures;

static void run(workload *w) {
    result res[5]; /* by sg_mode; eager runs first: the others are compared with it */
    for (int k = 0; k < 5; k++)
        res[mode_order[k]] = mode_wanted(mode_order[k]) ? time_mode(w, mode_order[k]) : (result){0};
    for (int k = 0; k < 5; k++) {
        sg_mode m = mode_order[k];
        if (!mode_wanted(m)) continue;
        if (!res[m].ok) {
            failures++, printf("| %-4s | %-26s | failed |\n", w->name, sg_mode_name(m));
            continue;
        }
        char vs[16] = "    -";
        if (res[SG_MODE_EAGER].ok && res[m].us > 0)
            snprintf(vs, sizeof vs, "%5.2fx", res[SG_MODE_EAGER].us / res[m].us);
        printf("| %-4s | %-26s | %12.1f | %8.3f | %8s | %9.1f |\n", w->name, sg_mode_name(m),
               res[m].us, res[m].first_s, vs, res[m].peak_mib);
        fflush(stdout);
    }
    for (int k = 0; k < 5; k++) {
        sg_mode m = mode_order[k];
        if (res[m].ok)
            fprintf(stderr, "RESULT %s %s %s %.2f %.4f %.0f\n", tag, w->name, sg_mode_name(m),
                    res[m].us, res[m].first_s, res[m].peak_mib * (1 << 20));
    }
}

/* ------------------------------------------------------------ W1, W2: one sg_fn */

static sg_status w1_step(sg_ctx *ctx, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)user;
    sg_tensor *y = in[0];
    for (int i = 0; i < 6; i++) y = sg_tanh(sg_add_scalar(sg_mul_scalar(sg_sin(y), 1.01), 0.1));
    out[0] = y;
    return y ? SG_OK : sg_ctx_status(ctx);
}

typedef struct mlp {
    sg_tensor *w[8], *b[8];
} mlp;

static sg_status w2_step(sg_ctx *ctx, sg_tensor *const *in, sg_tensor **out, void *user) {
    mlp *m = user;
    sg_tensor *h = in[0];
    for (int l = 0; l < 8; l++) h = sg_gelu_tanh(sg_linear(h, m->w[l], m->b[l]));
    out[0] = h;
    return h ? SG_OK : sg_ctx_status(ctx);
}

typedef struct fn_work {
    sg_step_fn body;
    void *user;
    sg_tensor *x, *y;
    sg_fn *fn;
} fn_work;

static sg_fn *fn_fn(workload *w) { return ((fn_work *)w->state)->fn; }

static sg_status fn_begin(workload *w, sg_mode mode) {
    fn_work *f = w->state;
    return sg_compile(w->ctx, f->body, f->user, 1, 1, &(sg_compile_opts){.mode = mode}, &f->fn);
}

static sg_status fn_step(workload *w) {
    fn_work *f = w->state;
    sg_status st = sg_mark_step_begin(w->ctx);
    return st == SG_OK ? sg_call(f->fn, &f->x, 1, &f->y, 1) : st;
}

static void fn_end(workload *w) {
    fn_work *f = w->state;
    sg_fn_destroy(f->fn);
    f->fn = NULL;
}

static sg_tensor *randn(sg_ctx *ctx, sg_dtype dt, int ndim, const int64_t *shape, float scale,
                        unsigned *seed) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    float *buf = malloc(sizeof(float) * (size_t)n);
    if (!buf) return NULL;
    for (int64_t i = 0; i < n; i++) {
        *seed = *seed * 1664525u + 1013904223u;
        buf[i] = scale * ((float)(*seed >> 8) / 16777216.0f * 2.0f - 1.0f);
    }
    sg_tensor *t = sg_from_host(ctx, SG_F32, ndim, shape, buf), *c = t;
    free(buf);
    if (t && dt != SG_F32) {
        c = sg_cast(t, dt);
        sg_release(t);
    }
    return c;
}

static void run_fn(const char *name, sg_ctx *ctx, sg_step_fn body, void *user, sg_tensor *x,
                   int steps, int loops) {
    fn_work f = {body, user, x, NULL, NULL};
    workload w = {name, steps, loops, ctx, fn_begin, fn_step, NULL, NULL, fn_end, &f, fn_fn};
    run(&w);
}

/* ------------------------------------------------------------ W3, W5: GPT-2 */

/*
 * W3 decodes from position 0, one token per step (the position advances on
 * the device); each timed loop starts again at position 0 with the start
 * token. W5 prefills B x T tokens, token (b, t) = (7919 b + 104729 t) mod V,
 * logits for every position. torch_ref.py makes the same inputs.
 */
typedef struct gpt_work {
    gpt2 *g;
    int64_t batch, slots, seq; /* seq: W5's T */
    bool decode;
    sg_tensor *tokens, *token, *pos, *logits;
} gpt_work;

#define W3_START_TOKEN 50256 /* <|endoftext|>, modulo V */
#define CHECK_STEPS 32

static sg_status gpt_rewind(workload *w) {
    gpt_work *p = w->state;
    int64_t start = W3_START_TOKEN % p->g->cfg.vocab, zero = 0;
    sg_status st = sg_write(p->token, &start, sizeof start);
    return st == SG_OK ? sg_write(p->pos, &zero, sizeof zero) : st;
}

/* The fn gpt_step calls: decode's, or prefill's for every position's logits. */
static sg_fn *gpt_fn(workload *w) {
    gpt_work *p = w->state;
    return p->decode ? p->g->decode_fn : p->g->prefill_fn[1];
}

static sg_status gpt_begin(workload *w, sg_mode mode) {
    gpt_work *p = w->state;
    return gpt2_cache_create(p->g, p->batch, p->slots, &(sg_compile_opts){.mode = mode});
}

static sg_status gpt_step(workload *w) {
    gpt_work *p = w->state;
    return p->decode ? gpt2_decode(p->g, p->token, p->pos, &p->logits)
                     : gpt2_prefill(p->g, p->tokens, true, &p->logits);
}

static void gpt_end(workload *w) {
    gpt_work *p = w->state;
    gpt2_cache_destroy(p->g); /* so that the next mode's peak memory is its own */
}

/* Append n f32 values of t (any float dtype) to f. */
static sg_status dump_f32(FILE *f, sg_tensor *t) {
    sg_tensor *c = sg_cast(t, SG_F32);
    int64_t n = sg_tensor_numel(c);
    float *buf = c ? malloc(sizeof(float) * (size_t)n) : NULL;
    sg_status st = !c     ? sg_ctx_status(sg_tensor_ctx(t))
                   : !buf ? SG_ERR_OOM
                          : sg_read(c, buf, sizeof(float) * (size_t)n);
    if (st == SG_OK && fwrite(buf, sizeof(float), (size_t)n, f) != (size_t)n)
        st = SG_ERR_INVALID_ARG;
    free(buf);
    sg_release(c);
    return st;
}

/* W3: the 32 greedy tokens from the start token (text, one line) and the
 * logits of each step (32 x V f32). W5: the logits of each row's last
 * position (B x V f32). Files <dir>/<W>_stepgraph_<mode>.{tokens,f32}. */
static sg_status gpt_check(workload *w, sg_mode mode) {
    gpt_work *p = w->state;
    char path[1024];
    snprintf(path, sizeof path, "%s/%s_stepgraph_%s.f32", check_dir, w->name, sg_mode_name(mode));
    FILE *f = fopen(path, "wb");
    if (!f) return SG_ERR_INVALID_ARG;
    sg_status st = SG_OK;
    if (!p->decode) {
        st = gpt_step(w);
        sg_tensor *last = st == SG_OK ? sg_narrow(p->logits, 1, p->seq - 1, 1) : NULL;
        if (st == SG_OK) st = last ? dump_f32(f, last) : sg_ctx_status(w->ctx);
        sg_release(last);
        fclose(f);
        return st;
    }
    snprintf(path, sizeof path, "%s/%s_stepgraph_%s.tokens", check_dir, w->name,
             sg_mode_name(mode));
    FILE *tf = fopen(path, "w");
    st = tf ? gpt_rewind(w) : SG_ERR_INVALID_ARG;
    for (int s = 0; s < CHECK_STEPS && st == SG_OK; s++) {
        int64_t next;
        st = gpt_step(w);
        if (st == SG_OK) st = dump_f32(f, p->logits);
        if (st == SG_OK) st = sg_read(p->token, &next, sizeof next);
        if (st == SG_OK) fprintf(tf, "%s%lld", s ? " " : "", (long long)next);
    }
    if (tf) fprintf(tf, "\n"), fclose(tf);
    fclose(f);
    return st;
}

/* The model: from --gpt2 when that file exists, else the seeded init in dt
 * (then written to --gpt2's path as f32, for torch_ref.py to load: the
 * values are dt's, so both sides run the same weights). */
static gpt2 *make_model(sg_ctx *ctx, const gpt2_config *cfg, sg_dtype dt) {
    gpt2 *g = NULL;
    FILE *f = gpt2_path ? fopen(gpt2_path, "rb") : NULL;
    if (f) {
        fclose(f);
        if (gpt2_load(ctx, gpt2_path, dt, &g) != SG_OK)
            fprintf(stderr, "bench: cannot load %s: %s\n", gpt2_path, gpt2_error(ctx));
        return g;
    }
    if (gpt2_init(ctx, cfg, dt, 1337, &g) != SG_OK) {
        fprintf(stderr, "bench: GPT-2 init: %s\n", gpt2_error(ctx));
        return NULL;
    }
    if (gpt2_path && gpt2_save(g, gpt2_path, SG_F32) != SG_OK)
        fprintf(stderr, "bench: cannot write %s\n", gpt2_path);
    return g;
}

static void run_gpt2(const char *name, sg_ctx *ctx, bool decode, bool small) {
    static const gpt2_config full = {1024, 50257, 12, 12, 768, 50304};
    static const gpt2_config reduced = {128, 512, 2, 4, 64, 512};
    sg_dtype dt = sg_ctx_backend(ctx) == SG_BACKEND_CUDA ? SG_BF16 : SG_F32;
    gpt_work p = {
        make_model(ctx, small ? &reduced : &full, dt), 0, 0, 0, decode, NULL, NULL, NULL, NULL};
    if (!p.g) {
        failures++, printf("| %-4s | %-26s | failed |\n", name, "(model)");
        return;
    }
    int64_t T = p.g->cfg.max_t >= 512 ? 512 : p.g->cfg.max_t / 4, one = 1, shape[2] = {4, T};
    p.batch = decode ? 1 : 4;
    p.slots = decode ? p.g->cfg.max_t : T;
    p.seq = T;
    fprintf(stderr, "bench: %s: GPT-2 L=%lld NH=%lld C=%lld V=%lld maxT=%lld, %s, %s\n", name,
            (long long)p.g->cfg.n_layer, (long long)p.g->cfg.n_head, (long long)p.g->cfg.channels,
            (long long)p.g->cfg.vocab, (long long)p.g->cfg.max_t, sg_dtype_name(dt),
            decode ? "decode from position 0" : "prefill");
    if (decode) {
        int64_t start = W3_START_TOKEN % p.g->cfg.vocab;
        p.token = sg_from_host(ctx, SG_I64, 1, &one, &start);
        p.pos = sg_zeros(ctx, SG_I64, 1, &one);
    } else {
        int64_t *tok = malloc(sizeof(int64_t) * 4 * (size_t)T);
        for (int64_t b = 0; tok && b < 4; b++)
            for (int64_t t = 0; t < T; t++)
                tok[b * T + t] = (7919 * b + 104729 * t) % p.g->cfg.vocab;
        p.tokens = tok ? sg_from_host(ctx, SG_I64, 2, shape, tok) : NULL;
        free(tok);
    }
    bool gpu = sg_ctx_backend(ctx) == SG_BACKEND_CUDA;
    workload w = {name,     gpu ? 200 : decode ? 20 : 3, gpu ? 5 : 3, ctx,     gpt_begin,
                  gpt_step, decode ? gpt_rewind : NULL,  gpt_check,   gpt_end, &p, gpt_fn};
    run(&w);
    gpt2_destroy(p.g);
}


/* ------------------------------------------------------------ W4: MLP training */

/*
 * W4: one training step of an MLP 784 -> H -> H -> 10 (H = 1024; 128 on the
 * CPU unless --full) with ReLU, cross-entropy over a batch of 128, the
 * gradients of all six parameters (sg_grad) and an AdamW update (torch's
 * defaults: lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay 1e-2), all in
 * one step, f32. The init and the data come from a 32-bit LCG that
 * torch_ref.py repeats: parameters U(-1/sqrt(fan_in), 1/sqrt(fan_in)) in the
 * order w1 b1 w2 b2 w3 b3, then x U(-1, 1); labels (7 i) mod 10.
 */
#define W4_BATCH 128
#define W4_CHECK_STEPS 50

typedef struct w4_work {
    int64_t hidden;
    sg_tensor *p[6], *x, *y, *loss;
    float *init[6]; /* the initial values, to start the loss check over */
    sg_optim *opt;
    sg_fn *fn;
} w4_work;

static sg_status w4_body(sg_ctx *ctx, sg_tensor *const *in, sg_tensor **out, void *user) {
    w4_work *m = user;
    sg_tensor *h = sg_relu(sg_linear(in[0], m->p[0], m->p[1]));
    h = sg_relu(sg_linear(h, m->p[2], m->p[3]));
    sg_tensor *loss = sg_cross_entropy(sg_linear(h, m->p[4], m->p[5]), in[1]), *g[6];
    if (!loss) return sg_ctx_status(ctx);
    sg_status st = sg_grad(loss, 6, m->p, g);
    if (st == SG_OK) st = sg_optim_step(m->opt, g);
    out[0] = loss;
    return st;
}

static sg_fn *w4_fn(workload *w) { return ((w4_work *)w->state)->fn; }

static sg_status w4_begin(workload *w, sg_mode mode) {
    w4_work *m = w->state;
    sg_status st = sg_adamw_create(w->ctx, 6, m->p, NULL, &m->opt);
    if (st == SG_OK)
        st = sg_compile(w->ctx, w4_body, m, 2, 1, &(sg_compile_opts){.mode = mode, .name = "w4"},
                        &m->fn);
    return st;
}

static sg_status w4_step(workload *w) {
    w4_work *m = w->state;
    sg_tensor *in[2] = {m->x, m->y};
    return sg_call(m->fn, in, 2, &m->loss, 1);
}

static void w4_end(workload *w) {
    w4_work *m = w->state;
    sg_fn_destroy(m->fn);
    sg_optim_destroy(m->opt);
    m->fn = NULL, m->opt = NULL;
}

/* The losses of steps 1, 10 and 50 from the initial parameters and a fresh
 * optimizer, into <dir>/W4_stepgraph_<mode>.loss (text, one line). */
static sg_status w4_check(workload *w, sg_mode mode) {
    w4_work *m = w->state;
    sg_status st = SG_OK;
    for (int i = 0; i < 6 && st == SG_OK; i++)
        st = sg_write(m->p[i], m->init[i], sizeof(float) * (size_t)sg_tensor_numel(m->p[i]));
    w4_end(w);
    if (st == SG_OK) st = w4_begin(w, mode);
    double loss[3] = {0, 0, 0};
    for (int s = 1, k = 0; s <= W4_CHECK_STEPS && st == SG_OK; s++) {
        st = w4_step(w);
        if (st == SG_OK && (s == 1 || s == 10 || s == W4_CHECK_STEPS))
            st = sg_item(m->loss, &loss[k++]);
    }
    char path[1024];
    snprintf(path, sizeof path, "%s/W4_stepgraph_%s.loss", check_dir, sg_mode_name(mode));
    FILE *f = st == SG_OK ? fopen(path, "w") : NULL;
    if (f) fprintf(f, "%.9g %.9g %.9g\n", loss[0], loss[1], loss[2]), fclose(f);
    return st != SG_OK ? st : f ? SG_OK : SG_ERR_INVALID_ARG;
}

/* n values of the LCG, each scale * U(-1, 1). */
static float *w4_values(int64_t n, float scale, uint32_t *seed) {
    float *v = malloc(sizeof(float) * (size_t)(n ? n : 1));
    for (int64_t i = 0; v && i < n; i++) {
        *seed = *seed * 1664525u + 1013904223u;
        v[i] = scale * ((float)(*seed >> 8) / 16777216.0f * 2.0f - 1.0f);
    }
    return v;
}

static void run_w4(sg_ctx *ctx, bool small) {
    w4_work m;
    memset(&m, 0, sizeof m);
    m.hidden = small ? 128 : 1024;
    int64_t dims[4] = {784, m.hidden, m.hidden, 10}, B = W4_BATCH;
    uint32_t seed = 4444;
    sg_status st = SG_OK;
    for (int l = 0; l < 3 && st == SG_OK; l++) {
        int64_t ws[2] = {dims[l + 1], dims[l]}, bs[1] = {dims[l + 1]};
        float bound = 1.0f / sqrtf((float)dims[l]);
        m.init[2 * l] = w4_values(ws[0] * ws[1], bound, &seed);
        m.init[2 * l + 1] = w4_values(bs[0], bound, &seed);
        m.p[2 * l] = m.init[2 * l] ? sg_from_host(ctx, SG_F32, 2, ws, m.init[2 * l]) : NULL;
        m.p[2 * l + 1] = m.init[2 * l + 1] ? sg_from_host(ctx, SG_F32, 1, bs, m.init[2 * l + 1]) : NULL;
        for (int k = 0; k < 2 && st == SG_OK; k++)
            st = m.p[2 * l + k] ? sg_requires_grad_(m.p[2 * l + k], true) : SG_ERR_OOM;
    }
    float *xv = w4_values(B * 784, 1.0f, &seed);
    int64_t yv[W4_BATCH], xs[2] = {B, 784};
    for (int64_t i = 0; i < B; i++) yv[i] = (7 * i) % 10;
    m.x = xv ? sg_from_host(ctx, SG_F32, 2, xs, xv) : NULL;
    m.y = sg_from_host(ctx, SG_I64, 1, &B, yv);
    free(xv);
    fprintf(stderr, "bench: W4: MLP 784 -> %lld -> %lld -> 10, batch 128, f32, AdamW\n",
            (long long)m.hidden, (long long)m.hidden);
    if (st != SG_OK || !m.x || !m.y) {
        fprintf(stderr, "bench: W4 setup: %s\n", sg_last_error(ctx));
        failures++, printf("| %-4s | %-26s | failed |\n", "W4", "(setup)");
    } else {
        bool gpu = sg_ctx_backend(ctx) == SG_BACKEND_CUDA;
        workload w = {"W4",    gpu ? 200 : 5, gpu ? 5 : 3, ctx,    w4_begin,
                      w4_step, NULL,          w4_check,    w4_end, &m, w4_fn};
        run(&w);
    }
    for (int i = 0; i < 6; i++) free(m.init[i]);
}

/* ------------------------------------------------------------ W6: GPT-2 training */

/*
 * W6: one GPT-2 training step through examples/gpt2's trainer (the step
 * examples/train_gpt2 runs): forward over B x T tokens, cross-entropy,
 * sg_grad over every parameter, clipping of their global norm to 1.0 and
 * AdamW (betas 0.9/0.95, eps 1e-8, lr 3e-4 constant, weight decay 0.1 on
 * the 2-d parameters and none on the rest, as the trainer splits them),
 * all in one compiled step. bf16 with f32 master weights on CUDA, f32 on
 * the CPU (--w6-dtype picks either on both). The model is the seeded init
 * of make_model (the --gpt2 checkpoint); B = 4, T = min(1024, maxT). The
 * batch is the same every step: a stream of B T + 1 tokens, inputs token
 * b T + t, targets the next one, from a noisy bigram that torch_ref.py
 * repeats: prev = (37 prev + 11 + (s >> 30)) mod min(V, 256), s the 32-bit
 * LCG from seed 6666, prev from 0. Each mode starts again from the init.
 */
#define W6_BATCH 4
#define W6_CHECK_STEPS 20
#define W6_LR 3e-4
#define W6_WEIGHT_DECAY 0.1
#define W6_GRAD_CLIP 1.0

typedef struct w6_work {
    gpt2_config cfg; /* for make_model when there is no checkpoint */
    sg_dtype dt;
    gpt2 *g;
    gpt2_trainer *tr;
    sg_tensor *x, *y;
} w6_work;

static sg_fn *w6_fn(workload *w) {
    w6_work *p = w->state;
    return p->tr ? p->tr->train_fn : NULL;
}

static sg_status w6_begin(workload *w, sg_mode mode) {
    w6_work *p = w->state;
    if (!p->g) p->g = make_model(w->ctx, &p->cfg, p->dt);
    if (!p->g) return sg_ctx_status(w->ctx) != SG_OK ? sg_ctx_status(w->ctx) : SG_ERR_INVALID_ARG;
    gpt2_train_opts o = {.mode = mode,
                         .weight_decay = W6_WEIGHT_DECAY,
                         .grad_clip = W6_GRAD_CLIP,
                         .master_weights = p->dt != SG_F32};
    return gpt2_trainer_create(p->g, &o, &p->tr);
}

/* No read of the loss: the timed loop synchronizes once at its end. */
static sg_status w6_step(workload *w) {
    w6_work *p = w->state;
    return gpt2_trainer_step(p->tr, p->x, p->y, W6_LR, NULL, NULL);
}

/* The check's step s (from 1): W6_LR, or its linear warm-up over
 * --w6-warmup steps (the lr is a device tensor: the same graph). */
static double w6_check_lr(int s) {
    return w6_warmup > 0 && s < w6_warmup ? W6_LR * (double)s / (double)w6_warmup : W6_LR;
}

static void w6_end(workload *w) {
    w6_work *p = w->state;
    gpt2_trainer_destroy(p->tr);
    gpt2_destroy(p->g); /* so that the next mode starts from the init, its peak its own */
    p->tr = NULL, p->g = NULL;
}

/* The losses of steps 1 .. 20 from the init and a fresh optimizer, into
 * <dir>/W6_stepgraph_<mode>.loss (text, one line). */
static sg_status w6_check(workload *w, sg_mode mode) {
    w6_work *p = w->state;
    w6_end(w);
    sg_status st = w6_begin(w, mode);
    double loss[W6_CHECK_STEPS];
    for (int s = 0; s < W6_CHECK_STEPS && st == SG_OK; s++)
        st = gpt2_trainer_step(p->tr, p->x, p->y, w6_check_lr(s + 1), &loss[s], NULL);
    char path[1024];
    snprintf(path, sizeof path, "%s/W6_stepgraph_%s.loss", check_dir, sg_mode_name(mode));
    FILE *f = st == SG_OK ? fopen(path, "w") : NULL;
    for (int s = 0; f && s < W6_CHECK_STEPS; s++)
        fprintf(f, "%.9g%s", loss[s], s + 1 < W6_CHECK_STEPS ? " " : "\n");
    if (f) fclose(f);
    return st != SG_OK ? st : f ? SG_OK : SG_ERR_INVALID_ARG;
}

/* The batch: inputs and targets (B, T) from the bigram stream. */
static sg_status w6_batch(w6_work *p, sg_ctx *ctx, int64_t T) {
    int64_t n = W6_BATCH * T, span = p->g->cfg.vocab < 256 ? p->g->cfg.vocab : 256, prev = 0;
    int64_t shape[2] = {W6_BATCH, T}, *tok = malloc(sizeof(int64_t) * (size_t)(n + 1));
    if (!tok) return SG_ERR_OOM;
    uint32_t s = 6666;
    for (int64_t i = 0; i <= n; i++) {
        s = s * 1664525u + 1013904223u;
        prev = (37 * prev + 11 + (s >> 30)) % span;
        tok[i] = prev;
    }
    p->x = sg_from_host(ctx, SG_I64, 2, shape, tok);
    p->y = sg_from_host(ctx, SG_I64, 2, shape, tok + 1);
    free(tok);
    return p->x && p->y ? SG_OK : sg_ctx_status(ctx);
}

static void run_w6(sg_ctx *ctx, bool small) {
    static const gpt2_config full = {1024, 50257, 12, 12, 768, 50304};
    static const gpt2_config reduced = {128, 512, 2, 4, 64, 512};
    bool gpu = sg_ctx_backend(ctx) == SG_BACKEND_CUDA;
    sg_dtype dt = w6_dtype ? (strcmp(w6_dtype, "f32") ? SG_BF16 : SG_F32) : gpu ? SG_BF16 : SG_F32;
    w6_work p = {small ? reduced : full, dt, NULL, NULL, NULL, NULL};
    p.g = make_model(ctx, &p.cfg, p.dt); /* the first mode's; its size sets T */
    int64_t T = p.g && p.g->cfg.max_t < 1024 ? p.g->cfg.max_t : 1024;
    if (!p.g || w6_batch(&p, ctx, T) != SG_OK) {
        fprintf(stderr, "bench: W6 setup: %s\n", sg_last_error(ctx));
        failures++, printf("| %-4s | %-26s | failed |\n", "W6", "(setup)");
        gpt2_destroy(p.g);
        return;
    }
    fprintf(stderr, "bench: W6: GPT-2 L=%lld NH=%lld C=%lld V=%lld, B %d x T %lld, %s%s, AdamW\n",
            (long long)p.g->cfg.n_layer, (long long)p.g->cfg.n_head, (long long)p.g->cfg.channels,
            (long long)p.g->cfg.vocab, W6_BATCH, (long long)T, sg_dtype_name(p.dt),
            dt == SG_BF16 ? " with f32 master weights" : "");
    /* A step is 10 ms or more: fewer steps than the other workloads. */
    workload w = {"W6", gpu ? 10 : 3, 3, ctx, w6_begin, w6_step, NULL, w6_check, w6_end, &p, w6_fn};
    run(&w);
    sg_release(p.x);
    sg_release(p.y);
}

/* ------------------------------------------------------------ main */

/* One context per workload, so that its peak memory is its own. */
static sg_ctx *new_ctx(sg_backend want) {
    sg_ctx *ctx;
    sg_status st = sg_ctx_create(&(sg_ctx_opts){.backend = want}, &ctx);
    if (st != SG_OK && want == SG_BACKEND_AUTO)
        st = sg_ctx_create(&(sg_ctx_opts){.backend = SG_BACKEND_CPU}, &ctx);
    if (st != SG_OK) {
        fprintf(stderr, "bench: %s\n", sg_last_error(NULL));
        exit(1);
    }
    return ctx;
}

static void print_header(bool gpu, bool small) {
    const char *dt = gpu ? "bf16" : "f32";
    printf("Workloads (bench/README.md has the full spec and the floors):\n");
    if (work_on[W1S]) printf("  W1s  6 x (y = tanh(sin(y) * 1.01 + 0.1)), 24 ops, 4096 f32\n");
    if (work_on[W1L]) printf("  W1l  the same chain over 16M f32\n");
    if (work_on[W2]) printf("  W2   8 x (linear 1024 -> 1024 + gelu_tanh), batch 1, %s\n", dt);
    if (work_on[W3])
        printf("  W3   GPT-2 %s decode, batch 1, %s, %s-slot KV cache: one step = one token\n",
               small ? "reduced (L=2, C=64, V=512)" : "124M", dt, small ? "128" : "1024");
    if (work_on[W5])
        printf("  W5   GPT-2 %s prefill %s tokens, %s, causal, logits for every position\n",
               small ? "reduced (L=2, C=64, V=512)" : "124M", small ? "4 x 32" : "4 x 512", dt);
    if (work_on[W4])
        printf("  W4   MLP training step 784 -> %s -> %s -> 10, ReLU, cross-entropy, backward, "
               "AdamW, batch 128, f32\n", small ? "128" : "1024", small ? "128" : "1024");
    if (work_on[W6])
        printf("  W6   GPT-2 %s training step over %s tokens: forward, cross-entropy, backward, "
               "clip 1.0, AdamW, %s\n",
               small ? "reduced (L=2, C=64, V=512)" : "124M", small ? "4 x 128" : "4 x 1024",
               gpu ? "bf16 with f32 master weights" : "f32");
    if (small && (work_on[W3] || work_on[W5] || work_on[W6]))
        printf("  (W3/W5/W6 run a reduced GPT-2 on the CPU to keep this run short, --full runs "
               "124M;\n   a --gpt2 checkpoint that exists sets the size, and W5 then prefills 4 x "
               "min(512, maxT/4), W6 trains on 4 x min(1024, maxT))\n");
    printf("Columns: work, mode (sg_compile's), us per step (median of the loops' host time per\n"
           "step, synchronized at each loop's end), first_s (wall time of the first three\n"
           "calls: capture, compile, graph recording), vs eager (eager's time / this mode's),\n"
           "peak MiB (the most tensor and pool bytes held while the mode ran).\n\n");
}

int main(int argc, char **argv) {
    sg_backend want = SG_BACKEND_AUTO;
    int rc = parse_args(argc, argv, &want);
    if (rc) return rc == 1 ? 0 : rc;
    const char *t = getenv("SG_BENCH_TAG");
    if (t && *t) {
        static char buf[64];
        snprintf(buf, sizeof buf, "stepgraph-%s", t);
        tag = buf;
    }
    sg_ctx *ctx = new_ctx(want);
    bool gpu = sg_ctx_backend(ctx) == SG_BACKEND_CUDA, small = !gpu && !full_cpu;
    unsigned seed = 1234;
    printf("stepgraph %s, %s backend\n\n", sg_version(), sg_backend_name(sg_ctx_backend(ctx)));
    print_header(gpu, small);
    printf(
        "| work | mode                       | us per step  | first_s  | vs eager | peak MiB  |\n");
    printf(
        "|------|----------------------------|--------------|----------|----------|-----------|\n");
    fflush(stdout);
    if (work_on[W1S]) {
        int64_t s[1] = {4096};
        sg_tensor *x = randn(ctx, SG_F32, 1, s, 1.0f, &seed);
        run_fn("W1s", ctx, w1_step, NULL, x, 200, 5);
        sg_release(x);
    }
    if (work_on[W1L]) {
        sg_ctx_destroy(ctx);
        ctx = new_ctx(want);
        int64_t s[1] = {16 << 20};
        sg_tensor *x = randn(ctx, SG_F32, 1, s, 1.0f, &seed);
        /* 16M elements: fewer steps on a CPU */
        run_fn("W1l", ctx, w1_step, NULL, x, gpu ? 200 : 5, gpu ? 5 : 3);
        sg_release(x);
    }
    if (work_on[W2]) {
        sg_ctx_destroy(ctx);
        ctx = new_ctx(want);
        mlp m;
        int64_t ws[2] = {1024, 1024}, bs[1] = {1024}, xs[2] = {1, 1024};
        sg_dtype dt = gpu ? SG_BF16 : SG_F32;
        for (int l = 0; l < 8; l++) {
            m.w[l] = randn(ctx, dt, 2, ws, 0.03125f, &seed);
            m.b[l] = randn(ctx, dt, 1, bs, 0.01f, &seed);
        }
        sg_tensor *x = randn(ctx, dt, 2, xs, 1.0f, &seed);
        run_fn("W2", ctx, w2_step, &m, x, 200, 5);
    }
    for (int k = 0; k < 4; k++) {
        int wk = k == 0 ? W3 : k == 1 ? W4 : k == 2 ? W5 : W6;
        if (!work_on[wk]) continue;
        sg_ctx_destroy(ctx);
        ctx = new_ctx(want);
        if (wk == W4)
            run_w4(ctx, small);
        else if (wk == W6)
            run_w6(ctx, small);
        else
            run_gpt2(wk == W3 ? "W3" : "W5", ctx, wk == W3, small);
    }
    sg_ctx_destroy(ctx);
    if (failures)
        fprintf(stderr, "bench: %d row%s failed (the reasons are above)\n", failures,
                failures > 1 ? "s" : "");
    return failures ? 1 : 0;
}
