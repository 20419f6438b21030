/* SPDX-License-Identifier: MIT */
/*
 * main.c -- a user's program against an installed stepgraph: checks that the
 * header and the library agree on the version, then compiles a small step
 * (linear + gelu_tanh + linear) and compares its replays with the same ops
 * run eagerly. Exit 0 when they agree, 1 otherwise.
 */
#include <stepgraph.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

typedef struct model { sg_tensor *w1, *b1, *w2; } model;

static sg_status step(sg_ctx *ctx, sg_tensor *const *in, sg_tensor **out, void *user) {
    model *m = user;
    out[0] = sg_linear(sg_gelu_tanh(sg_linear(in[0], m->w1, m->b1)), m->w2, NULL);
    return out[0] ? SG_OK : sg_ctx_status(ctx);
}

int main(void) {
    if (strcmp(sg_version(), SG_VERSION_STRING) != 0) {
        fprintf(stderr, "consumer: header %s, library %s\n", SG_VERSION_STRING, sg_version());
        return 1;
    }
    sg_ctx *ctx;
    if (sg_ctx_create(&(sg_ctx_opts){.backend = SG_BACKEND_CPU}, &ctx) != SG_OK) {
        fprintf(stderr, "consumer: %s\n", sg_last_error(NULL));
        return 1;
    }
    float w1[16 * 8], b1[16], w2[4 * 16], x[2 * 8];
    unsigned s = 12345;
    float *all[] = {w1, b1, w2, x};
    size_t len[] = {16 * 8, 16, 4 * 16, 2 * 8};
    for (int a = 0; a < 4; a++)
        for (size_t i = 0; i < len[a]; i++) {
            s = s * 1103515245u + 12345u;
            all[a][i] = (float)((s >> 8) & 0xffff) / 65536.0f - 0.5f;
        }
    model m = {sg_from_host(ctx, SG_F32, 2, (int64_t[]){16, 8}, w1),
               sg_from_host(ctx, SG_F32, 1, (int64_t[]){16}, b1),
               sg_from_host(ctx, SG_F32, 2, (int64_t[]){4, 16}, w2)};
    sg_tensor *xt = sg_from_host(ctx, SG_F32, 2, (int64_t[]){2, 8}, x);
    sg_tensor *ref = NULL;
    if (step(ctx, &xt, &ref, &m) != SG_OK) {
        fprintf(stderr, "consumer: eager step: %s\n", sg_last_error(ctx));
        return 1;
    }
    float want[8], got[8];
    sg_read(ref, want, sizeof want);
    sg_fn *fn;
    sg_status st = sg_compile(ctx, step, &m, 1, 1,
                              &(sg_compile_opts){.mode = SG_MODE_REDUCE_OVERHEAD}, &fn);
    double worst = 0;
    for (int call = 0; st == SG_OK && call < 3; call++) {
        sg_tensor *y;
        st = sg_call(fn, &xt, 1, &y, 1);
        if (st == SG_OK) st = sg_read(y, got, sizeof got);
        for (int i = 0; st == SG_OK && i < 8; i++) {
            double e = fabs((double)got[i] - want[i]) / (1e-6 + fabs((double)want[i]));
            if (!(e <= worst)) worst = e;
        }
    }
    if (st != SG_OK) fprintf(stderr, "consumer: %s\n", sg_last_error(ctx));
    sg_fn_destroy(fn);
    sg_ctx_destroy(ctx);
    if (st != SG_OK || !(worst < 1e-4)) {
        fprintf(stderr, "consumer: FAILED (worst relative error %g)\n", worst);
        return 1;
    }
    printf("consumer: stepgraph %s, compiled step matches eager (worst rel. error %.2g)\n",
           sg_version(), worst);
    return 0;
}
