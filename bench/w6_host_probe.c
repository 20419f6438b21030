/* SPDX-License-Identifier: MIT */
/*
 * w6_host_probe.c -- W6's training step (GPT-2 124M, 4 x 1024 tokens, bf16
 * with f32 master weights, AdamW, clip 1.0; examples/gpt2's trainer) on
 * CUDA: the host time of each gpt2_trainer_step call against the step's
 * wall time, 20 steps back to back, then 20 waited for one by one. When the
 * call's host time nears the wall time, the host, not the GPU, sets the
 * pace. Argument: the sg_mode (default reduce-overhead). Build from the
 * root after the build (bench/NOTES.md):
 *   gcc -O2 -std=c11 -Iinclude -Iexamples bench/w6_host_probe.c \
 *       examples/gpt2/model.c examples/gpt2/train.c -Lbuild -lstepgraph -lm \
 *       -Wl,-rpath,$PWD/build -o w6_host_probe
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include "gpt2/model.h"
#include "gpt2/train.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int fail(sg_ctx *ctx, const char *what) {
    fprintf(stderr, "w6_host_probe: %s: %s\n", what, sg_last_error(ctx));
    return 1;
}

int main(int argc, char **argv) {
    enum { STEPS = 20 };
    sg_ctx *ctx;
    sg_ctx_opts o = {.backend = SG_BACKEND_CUDA};
    if (sg_ctx_create(&o, &ctx) != SG_OK) return fail(NULL, "no CUDA context");
    gpt2_config cfg = {1024, 50257, 12, 12, 768, 50304};
    gpt2 *g = NULL;
    gpt2_trainer *tr = NULL;
    gpt2_train_opts to = {.mode = argc > 1 ? (sg_mode)atoi(argv[1]) : SG_MODE_REDUCE_OVERHEAD,
                          .weight_decay = 0.1,
                          .grad_clip = 1.0,
                          .master_weights = true};
    int64_t n = 4 * 1024, shape[2] = {4, 1024}, *tok = malloc(sizeof(int64_t) * (size_t)(n + 1));
    if (!tok) return fail(ctx, "out of host memory");
    for (int64_t i = 0; i <= n; i++) tok[i] = (i * 7919) % 50257;
    sg_tensor *x = sg_from_host(ctx, SG_I64, 2, shape, tok);
    sg_tensor *y = sg_from_host(ctx, SG_I64, 2, shape, tok + 1);
    free(tok);
    int rc = 0;
    if (!x || !y || gpt2_init(ctx, &cfg, SG_BF16, 1337, &g) != SG_OK ||
        gpt2_trainer_create(g, &to, &tr) != SG_OK) {
        rc = fail(ctx, "setup");
        goto done;
    }
    for (int i = 0; i < 5 && rc == 0; i++)
        if (gpt2_trainer_step(tr, x, y, 3e-4, NULL, NULL) != SG_OK) rc = fail(ctx, "warm-up step");
    if (rc || sg_ctx_synchronize(ctx) != SG_OK) goto done;
    double host = 0, t0 = now();
    for (int i = 0; i < STEPS && rc == 0; i++) {
        double a = now();
        if (gpt2_trainer_step(tr, x, y, 3e-4, NULL, NULL) != SG_OK) rc = fail(ctx, "step");
        host += now() - a;
    }
    if (rc || sg_ctx_synchronize(ctx) != SG_OK) goto done;
    double wall = now() - t0, waited = 0;
    printf("w6_host_probe: %d steps back to back: %.1f us a step, %.1f us of it in the call\n",
           STEPS, 1e6 * wall / STEPS, 1e6 * host / STEPS);
    for (int i = 0; i < STEPS && rc == 0; i++) {
        double a = now();
        if (gpt2_trainer_step(tr, x, y, 3e-4, NULL, NULL) != SG_OK ||
            sg_ctx_synchronize(ctx) != SG_OK)
            rc = fail(ctx, "step");
        waited += now() - a;
    }
    if (rc == 0)
        printf("w6_host_probe: each step waited for: %.1f us a step\n", 1e6 * waited / STEPS);
done:
    gpt2_trainer_destroy(tr);
    gpt2_destroy(g);
    sg_release(x);
    sg_release(y);
    sg_ctx_destroy(ctx);
    return rc;
}
