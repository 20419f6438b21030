/* SPDX-License-Identifier: MIT */
/*
 * infer_loop.c -- the shape of a compiled inference loop: a two-layer MLP
 * compiled once in reduce-overhead mode and called in a plain loop, with the
 * input written in place each iteration (a new request in the same buffer)
 * and the output read back. The first call captures, fuses and compiles; the
 * rest replay. Each answer is checked against the same ops run eagerly.
 *
 * usage: infer_loop [calls]        (default 200)
 * Exit status: 0 when every compiled answer matched, 1 otherwise.
 */
#define _POSIX_C_SOURCE 199309L /* clock_gettime */

#include <stepgraph.h>

#include "args.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { BATCH = 4, IN = 64, HIDDEN = 256, OUT = 16 };

typedef struct mlp { sg_tensor *w1, *b1, *w2, *b2; } mlp;

/* out[0] is (BATCH, OUT) = linear(gelu_tanh(linear(x))) */
static sg_status forward(sg_ctx *ctx, sg_tensor *const *in, sg_tensor **out, void *user) {
    mlp *m = user;
    out[0] = sg_linear(sg_gelu_tanh(sg_linear(in[0], m->w1, m->b1)), m->w2, m->b2);
    return out[0] ? SG_OK : sg_ctx_status(ctx);
}

static float frand(unsigned *s) {
    *s = *s * 1664525u + 1013904223u;
    return (float)(*s >> 8) / 16777216.0f - 0.5f;
}

static sg_tensor *random_tensor(sg_ctx *ctx, int ndim, const int64_t *shape, unsigned *seed) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    float *v = malloc(sizeof *v * (size_t)n);
    if (!v) return NULL;
    for (int64_t i = 0; i < n; i++) v[i] = frand(seed) * 0.2f;
    sg_tensor *t = sg_from_host(ctx, SG_F32, ndim, shape, v);
    free(v);
    return t;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    long long calls = 200;
    if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")))
        return printf("usage: infer_loop [calls >= 1]\n"), 0;
    if ((argc > 1 && !arg_int(argv[1], 1, 1 << 30, &calls)) || argc > 2) {
        fprintf(stderr, "usage: infer_loop [calls >= 1]\n");
        return 2;
    }
    sg_ctx *ctx;
    if (sg_ctx_create(NULL, &ctx) != SG_OK) { /* AUTO: a GPU when there is one */
        fprintf(stderr, "infer_loop: %s\n", sg_last_error(NULL));
        return 1;
    }
    unsigned seed = 7;
    mlp m = {random_tensor(ctx, 2, (int64_t[]){HIDDEN, IN}, &seed),
             random_tensor(ctx, 1, (int64_t[]){HIDDEN}, &seed),
             random_tensor(ctx, 2, (int64_t[]){OUT, HIDDEN}, &seed),
             random_tensor(ctx, 1, (int64_t[]){OUT}, &seed)};
    sg_tensor *x = sg_zeros(ctx, SG_F32, 2, (int64_t[]){BATCH, IN});
    sg_fn *fn = NULL;
    sg_status st = sg_ctx_status(ctx);
    if (st == SG_OK)
        st = sg_compile(ctx, forward, &m, 1, 1,
                        &(sg_compile_opts){.mode = SG_MODE_REDUCE_OVERHEAD, .name = "mlp"}, &fn);
    double worst = 0, t0 = 0;
    float req[BATCH * IN], got[BATCH * OUT], want[BATCH * OUT];
    for (int i = 0; st == SG_OK && i < calls; i++) {
        if (i == 1) t0 = now(); /* the first call captures and compiles */
        for (int j = 0; j < BATCH * IN; j++) req[j] = frand(&seed);
        st = sg_write(x, req, sizeof req); /* the new request, in place */
        sg_tensor *y, *ref = NULL;
        if (st == SG_OK) st = sg_call(fn, &x, 1, &y, 1); /* y: owned by fn, valid until the next call */
        if (st == SG_OK) st = sg_read(y, got, sizeof got);
        if (st == SG_OK && (i < 3 || i == calls - 1)) { /* spot checks against eager */
            st = forward(ctx, &x, &ref, &m);
            if (st == SG_OK) st = sg_read(ref, want, sizeof want);
            sg_release(ref);
            for (int j = 0; st == SG_OK && j < BATCH * OUT; j++) {
                double e = fabs((double)got[j] - want[j]) / (1e-3 + fabs((double)want[j]));
                if (!(e <= worst)) worst = e;
            }
        }
    }
    double per = calls > 1 ? (now() - t0) / (calls - 1) : 0;
    if (st != SG_OK) fprintf(stderr, "infer_loop: %s\n", sg_last_error(ctx));
    else
        printf(
            "infer_loop: %d calls on %s, %.1f us per call after the first, worst rel. error %.2g\n",
            (int)calls, sg_backend_name(sg_ctx_backend(ctx)), per * 1e6, worst);
    sg_fn_destroy(fn);
    sg_ctx_destroy(ctx);
    return st == SG_OK && worst < 1e-3 ? 0 : 1;
}
