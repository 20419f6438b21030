/* SPDX-License-Identifier: MIT */
/*
 * train_gpt2.c -- GPT-2 training as one compiled step, after llm.c's
 * train_gpt2.cu: forward over (B, T) tokens, cross-entropy against the
 * tokens shifted by one, gradients of every parameter, clipping of their
 * global norm, and AdamW, all in one sg_call (one graph replay in
 * reduce-overhead mode); the learning rate follows llm.c's warmup + cosine
 * schedule through the optimizer's lr tensor, so no step recaptures. The
 * validation loss is a second, forward-only compiled step.
 *
 * Data: llm.c's token files (-i train, -j val; see gpt2/data.h), or, when
 * none is given, synthetic tokens that follow a noisy fixed bigram (so the
 * loss falls). The model: an llm.c checkpoint (-e file.bin) or a fresh one
 * of llm.c's dN configs (-e d12 is GPT-2 124M; d2 is a tiny 2-layer model,
 * 128 channels) initialized as llm.c does. On CUDA the weights are bf16 and
 * AdamW keeps f32 master weights; on the CPU everything is f32.
 *
 * usage: train_gpt2 [-i train.bin] [-j val.bin] [-e d2|d6|d12|d24|d36|d48|file.bin]
 *                   [-o out.bin] [-b B] [-t T] [-l lr] [-u warmup] [-q final_lr_frac]
 *                   [-c weight_decay] [-k grad_clip] [-x steps] [-v val_every]
 *                   [-m val_steps] [-M mode] [-E]
 *   defaults: -e d2 -b 4 -t 64 -l 3e-4 -u 0 -q 1.0 -c 0 -k 1.0 -x 10 -v 20 -m 20
 *   -M eager|default|reduce-overhead|max-autotune|max-autotune-no-cudagraphs
 *      (default reduce-overhead); -E prints sg_fn_explain of both steps;
 *   -k 0 turns clipping off; -x steps of training, -v validate every that
 *   many steps (0: never) and after the last, -m batches per validation.
 *
 * Per step it prints the loss, the step's milliseconds and tokens/s. Exit
 * status: 0 on success, 1 on a stepgraph or I/O failure, 2 on bad usage.
 *
 * Data parallel: launched by torchrun (RANK, WORLD_SIZE, ...) or mpirun, each
 * of the W processes trains on its B rows of a batch of W*B rows (the
 * window a single process with -b W*B would read), and the step all-reduces
 * the gradients and the loss (mean) before clipping and AdamW; the losses
 * are those of the whole batch. Only rank 0 prints and saves. On CUDA give
 * each process its own GPU (CUDA_VISIBLE_DEVICES; see bench/run-ddp.sh); on
 * the CPU launch with mpirun.
 */
#define _POSIX_C_SOURCE 200809L
#include "args.h"
#include "gpt2/data.h"
#include "gpt2/model.h"
#include "gpt2/train.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct options {
    const char *train, *val, *init, *out;
    int64_t B, T, steps, val_every, val_steps, warmup;
    double lr, final_frac, wd, clip;
    sg_mode mode;
    bool explain;
} options;

static void usage(FILE *f) {
    fprintf(f,
            "usage: train_gpt2 [-i train.bin] [-j val.bin] [-e d2|d6|d12|d24|d36|d48|file.bin]\n"
            "                  [-o out.bin] [-b B] [-t T] [-l lr] [-u warmup] [-q final_lr_frac]\n"
            "                  [-c weight_decay] [-k grad_clip] [-x steps] [-v val_every]\n"
            "                  [-m val_steps] [-M mode] [-E]\n");
}

static bool parse_mode(const char *s, sg_mode *m) {
    for (int i = SG_MODE_DEFAULT; i <= SG_MODE_MAX_AUTOTUNE_NO_GRAPHS; i++)
        if (!strcmp(s, sg_mode_name((sg_mode)i))) return *m = (sg_mode)i, true;
    return false;
}

/* Returns 0 to go on, else the exit status. */
static int parse(int argc, char **argv, options *o) {
    *o = (options){.init = "d2",
                   .B = 4,
                   .T = 64,
                   .steps = 10,
                   .val_every = 20,
                   .val_steps = 20,
                   .lr = 3e-4,
                   .final_frac = 1.0,
                   .clip = 1.0,
                   .mode = SG_MODE_REDUCE_OVERHEAD};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return -1;
        }
        if (!strcmp(a, "-E")) {
            o->explain = true;
            continue;
        }
        bool ok = v && a[0] == '-' && a[1] && !a[2];
        long long n = 0;
        double r = 0;
        if (ok) switch (a[1]) {
            case 'i': o->train = v; break;
            case 'j': o->val = v; break;
            case 'e': o->init = v; break;
            case 'o': o->out = v; break;
            /* B * T * 4 (bytes of the tokens) stays far inside 64 bits */
            case 'b': ok = arg_int(v, 1, 1 << 24, &n), o->B = ok ? n : o->B; break;
            case 't': ok = arg_int(v, 1, 1 << 24, &n), o->T = ok ? n : o->T; break;
            case 'l': ok = arg_real(v, 1e-30, 1e6, &r), o->lr = ok ? r : o->lr; break;
            case 'u': ok = arg_int(v, 0, LLONG_MAX, &n), o->warmup = ok ? n : o->warmup; break;
            case 'q': ok = arg_real(v, 0, 1, &r), o->final_frac = ok ? r : o->final_frac; break;
            case 'c': ok = arg_real(v, 0, 1e6, &r), o->wd = ok ? r : o->wd; break;
            case 'k': ok = arg_real(v, 0, 1e30, &r), o->clip = ok ? r : o->clip; break;
            case 'x': ok = arg_int(v, 0, LLONG_MAX, &n), o->steps = ok ? n : o->steps; break;
            case 'v':
                ok = arg_int(v, 0, LLONG_MAX, &n), o->val_every = ok ? n : o->val_every;
                break;
            case 'm':
                ok = arg_int(v, 1, LLONG_MAX, &n), o->val_steps = ok ? n : o->val_steps;
                break;
            case 'M': ok = parse_mode(v, &o->mode); break;
            default: ok = false;
            }
        if (!ok) {
            fprintf(stderr, "train_gpt2: bad argument '%s'%s%s%s\n", a, v ? " (value '" : "",
                    v ? v : "", v ? "': a number in range?)" : "");
            usage(stderr);
            return 2;
        }
        i++;
    }
    if (o->B < 1 || o->T < 1 || o->steps < 0 || o->val_every < 0 || o->val_steps < 1 ||
        o->warmup < 0 || o->lr <= 0 || o->clip < 0 || o->wd < 0) {
        fprintf(stderr, "train_gpt2: B, T, lr and val_steps must be positive, the rest >= 0\n");
        return 2;
    }
    return 0;
}

/* llm.c's -e dN: depth N, channels and heads from its table. */
static bool depth_config(const char *s, gpt2_config *c) {
    static const int64_t table[][3] = {{2, 128, 2},    {6, 384, 6},    {12, 768, 12},
                                       {24, 1024, 16}, {36, 1280, 20}, {48, 1600, 25}};
    if (s[0] != 'd') return false;
    char *end;
    long d = strtol(s + 1, &end, 10);
    for (size_t i = 0; !*end && i < sizeof table / sizeof *table; i++)
        if (table[i][0] == d) {
            *c = (gpt2_config){.max_t = 1024,
                               .vocab = 50257,
                               .n_layer = d,
                               .n_head = table[i][2],
                               .channels = table[i][1],
                               .padded_vocab = 50304};
            return true;
        }
    return false;
}

/* Tokens that follow a fixed bigram over the first 256 of vocab tokens, with
 * noise: tok[i] = (37 tok[i-1] + 11 + r) mod 256, r uniform in 0..3. */
static bool synthetic(gpt2_tokens *t, int64_t n, int64_t vocab, uint64_t seed) {
    int64_t span = vocab < 256 ? vocab : 256;
    t->tok = malloc(sizeof *t->tok * (size_t)n);
    if (!t->tok) return false;
    t->n = n;
    uint16_t prev = 0;
    for (int64_t i = 0; i < n; i++) {
        seed ^= seed >> 12, seed ^= seed << 25, seed ^= seed >> 27;
        prev = (uint16_t)((37 * prev + 11 + ((seed * 2685821657736338717ull) >> 62)) % span);
        t->tok[i] = prev;
    }
    return true;
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

typedef struct run {
    sg_ctx *ctx;
    sg_comm *comm; /* the launch's communicator (one rank when not launched) */
    int rank, world;
    gpt2 *g;
    gpt2_trainer *tr;
    gpt2_tokens data[2]; /* train, val */
    gpt2_loader load[2];
    sg_tensor *x, *y;
    int64_t *hx, *hy;
} run;

/* The next batch of loader k into the input tensors: this rank's rows. */
static sg_status next_batch(run *r, int k) {
    int64_t n = r->load[k].B / r->world * r->load[k].T;
    gpt2_loader_next(&r->load[k], r->hx, r->hy);
    sg_status st = sg_write(r->x, r->hx + r->rank * n, sizeof(int64_t) * (size_t)n);
    return st == SG_OK ? sg_write(r->y, r->hy + r->rank * n, sizeof(int64_t) * (size_t)n) : st;
}

static sg_status validate(run *r, int64_t batches, double *loss) {
    double sum = 0, l = 0;
    sg_status st = SG_OK;
    int64_t n = gpt2_loader_batches(&r->load[1]);
    if (batches > n) batches = n;
    gpt2_loader_reset(&r->load[1]);
    for (int64_t i = 0; i < batches && st == SG_OK; i++) {
        st = next_batch(r, 1);
        if (st == SG_OK) st = gpt2_trainer_eval(r->tr, r->x, r->y, &l);
        sum += l;
    }
    *loss = sum / (double)batches;
    return st;
}

static int fail(run *r, const char *what) {
    fprintf(stderr, "train_gpt2: %s failed: %s\n", what, r->ctx ? sg_last_error(r->ctx) : "");
    return 1;
}

static int load_data(run *r, const options *o) {
    const char *files[2] = {o->train, o->val};
    for (int k = 0; k < 2; k++) {
        int64_t n = 4 * (o->B * r->world * o->T + 1);
        if (files[k] && gpt2_tokens_load(files[k], &r->data[k]) != SG_OK) {
            fprintf(stderr, "train_gpt2: %s is not an llm.c token file (magic %d, version 1)\n",
                    files[k], GPT2_TOKENS_MAGIC);
            return 1;
        }
        if (!files[k] && !synthetic(&r->data[k], n < 65536 ? 65536 : n, r->g->cfg.vocab, 7 + k))
            return fail(r, "making synthetic tokens");
        if (gpt2_loader_init(&r->load[k], &r->data[k], o->B * r->world, o->T) != SG_OK) {
            fprintf(stderr, "train_gpt2: %s has %lld tokens, fewer than W*B*T+1 = %lld\n",
                    files[k] ? files[k] : "synthetic data", (long long)r->data[k].n,
                    (long long)(o->B * r->world * o->T + 1));
            return 1;
        }
    }
    return 0;
}

static int setup(run *r, const options *o) {
    if (sg_ctx_create(NULL, &r->ctx) != SG_OK) {
        fprintf(stderr, "train_gpt2: sg_ctx_create failed: %s\n", sg_last_error(NULL));
        return 1;
    }
    if (sg_comm_create(r->ctx, NULL, &r->comm) != SG_OK) return fail(r, "joining the launch");
    r->rank = sg_comm_rank(r->comm), r->world = sg_comm_size(r->comm);
    bool cuda = sg_ctx_backend(r->ctx) == SG_BACKEND_CUDA;
    sg_dtype dt = cuda ? SG_BF16 : SG_F32;
    gpt2_config cfg;
    sg_status st = depth_config(o->init, &cfg) ? gpt2_init(r->ctx, &cfg, dt, 42, &r->g)
                                               : gpt2_load(r->ctx, o->init, dt, &r->g);
    if (st != SG_OK) {
        fprintf(stderr,
                "train_gpt2: -e %s is neither dN nor a readable llm.c checkpoint (%s: %s)\n",
                o->init, sg_status_str(st), gpt2_error(r->ctx));
        return 1;
    }
    if (o->T > r->g->cfg.max_t) {
        fprintf(stderr, "train_gpt2: T %lld exceeds the model's %lld positions\n", (long long)o->T,
                (long long)r->g->cfg.max_t);
        return 2;
    }
    int rc = load_data(r, o);
    if (rc) return rc;
    gpt2_train_opts to = {.mode = o->mode,
                          .weight_decay = o->wd,
                          .grad_clip = o->clip,
                          .master_weights = dt != SG_F32,
                          .comm = r->world > 1 ? r->comm : NULL};
    if (gpt2_trainer_create(r->g, &to, &r->tr) != SG_OK) return fail(r, "making the steps");
    int64_t bt[2] = {o->B, o->T}, np = 0;
    r->x = sg_empty(r->ctx, SG_I64, 2, bt);
    r->y = sg_empty(r->ctx, SG_I64, 2, bt);
    r->hx = malloc(sizeof(int64_t) * (size_t)(o->B * r->world * o->T));
    r->hy = malloc(sizeof(int64_t) * (size_t)(o->B * r->world * o->T));
    if (!r->x || !r->y || !r->hx || !r->hy) return fail(r, "making the batch");
    for (int i = 0; i < r->tr->n; i++) np += sg_tensor_numel(r->tr->params[i]);
    const gpt2_config *c = &r->g->cfg;
    if (r->rank) return 0;
    if (r->world > 1)
        printf("data parallel: %d ranks of B %lld (a batch of %lld rows)\n", r->world,
               (long long)o->B, (long long)(o->B * r->world));
    printf("train_gpt2: L %lld, C %lld, NH %lld, V %lld (padded %lld), maxT %lld: %lld "
           "parameters, %s on %s, mode %s\n",
           (long long)c->n_layer, (long long)c->channels, (long long)c->n_head, (long long)c->vocab,
           (long long)c->padded_vocab, (long long)c->max_t, (long long)np, sg_dtype_name(dt),
           sg_backend_name(sg_ctx_backend(r->ctx)), sg_mode_name(o->mode));
    printf("train: %lld tokens (%s), %lld batches of B %lld x T %lld; val: %lld tokens (%s)\n",
           (long long)r->data[0].n, o->train ? o->train : "synthetic",
           (long long)gpt2_loader_batches(&r->load[0]), (long long)o->B, (long long)o->T,
           (long long)r->data[1].n, o->val ? o->val : "synthetic");
    return 0;
}

static int train(run *r, const options *o) {
    for (int64_t s = 0; s < o->steps; s++) {
        double lr = gpt2_lr_at(o->lr, s, o->warmup, o->steps, o->final_frac), loss, t0 = now_ms();
        if (next_batch(r, 0) != SG_OK ||
            gpt2_trainer_step(r->tr, r->x, r->y, lr, &loss, NULL) != SG_OK)
            return fail(r, "the train step");
        double ms = now_ms() - t0;
        if (r->rank == 0)
            printf("step %4lld/%lld: train loss %.6f lr %.3e (%.2f ms, %.0f tok/s)\n",
                   (long long)s + 1, (long long)o->steps, loss, lr, ms,
                   (double)(o->B * r->world * o->T) / (ms / 1e3));
        if (s == 0 && o->explain && r->rank == 0) printf("%s\n", sg_fn_explain(r->tr->train_fn));
        bool last = s + 1 == o->steps;
        if ((o->val_every && (s + 1) % o->val_every == 0) || last) {
            double vl;
            if (validate(r, o->val_steps, &vl) != SG_OK) return fail(r, "the val step");
            if (r->rank) continue;
            printf("val loss %.6f\n", vl);
            if (last && o->explain) printf("%s\n", sg_fn_explain(r->tr->eval_fn));
        }
    }
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0); /* one line per step, also into a pipe or a log */
    options o;
    int rc = parse(argc, argv, &o);
    if (rc) return rc < 0 ? 0 : rc;
    run r = {0};
    rc = setup(&r, &o);
    if (!rc) rc = train(&r, &o);
    if (!rc && o.out && r.rank == 0) {
        if (gpt2_save(r.g, o.out, SG_F32) != SG_OK) {
            fprintf(stderr, "train_gpt2: cannot write the checkpoint %s: %s\n", o.out,
                    gpt2_error(r.ctx));
            rc = 1;
        } else
            printf("saved %s\n", o.out);
    }
    gpt2_trainer_destroy(r.tr);
    gpt2_destroy(r.g);
    sg_ctx_destroy(r.ctx);
    for (int k = 0; k < 2; k++) gpt2_tokens_free(&r.data[k]);
    free(r.hx), free(r.hy);
    return rc;
}
