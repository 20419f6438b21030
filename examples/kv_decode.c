/* SPDX-License-Identifier: MIT */
/*
 * kv_decode.c -- the shape of a KV-cache decode loop: one attention layer
 * whose keys and values are written in place into a cache of S slots at the
 * position held in a device tensor, so the compiled step never changes and
 * every token is one graph replay. The same loop runs in EAGER mode over a
 * second cache, and every token's output is compared.
 *
 * usage: kv_decode [tokens]        (default 24, at most 64)
 * Exit status: 0 when compiled and eager agree at every token, 1 otherwise.
 */
#include <stepgraph.h>

#include "args.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { C = 64, H = 4, D = C / H, S = 64 };

typedef struct layer {
    sg_tensor *wqkv, *wo;       /* (3C, C), (C, C) */
    sg_tensor *kcache, *vcache; /* (H, S, D) each, updated in place */
    sg_tensor *slots;           /* arange(S) as i64, for the mask */
} layer;

/* in[0]: x (1, C); in[1]: pos, an i64 tensor of shape (1). out[0]: (1, C). */
static sg_status decode(sg_ctx *ctx, sg_tensor *const *in, sg_tensor **out, void *user) {
    layer *l = user;
    sg_tensor *qkv = sg_linear(in[0], l->wqkv, NULL); /* (1, 3C) */
    sg_tensor *heads[3];
    for (int i = 0; i < 3; i++) /* (1, C) -> (H, 1, D) */
        heads[i] = sg_transpose(sg_reshape(sg_narrow(qkv, 1, i * C, C), 3, (int64_t[]){1, H, D}), 0, 1);
    /* K and V of this token go into slot pos of the caches. */
    sg_status st = sg_index_copy_(l->kcache, 1, in[1], heads[1]);
    if (st == SG_OK) st = sg_index_copy_(l->vcache, 1, in[1], heads[2]);
    if (st != SG_OK) return st;
    sg_tensor *mask = sg_le(l->slots, in[1]); /* (S): slots 0..pos are valid */
    sg_tensor *att = sg_sdpa(heads[0], l->kcache, l->vcache, mask, false, 0); /* (H, 1, D) */
    out[0] = sg_linear(sg_reshape(sg_transpose(att, 0, 1), 2, (int64_t[]){1, C}), l->wo, NULL);
    return out[0] ? SG_OK : sg_ctx_status(ctx);
}

static float frand(unsigned *s) {
    *s = *s * 1664525u + 1013904223u;
    return (float)(*s >> 8) / 16777216.0f - 0.5f;
}

static sg_tensor *random_tensor(sg_ctx *ctx, int64_t rows, int64_t cols, unsigned *seed) {
    float *v = malloc(sizeof *v * (size_t)(rows * cols));
    if (!v) return NULL;
    for (int64_t i = 0; i < rows * cols; i++) v[i] = frand(seed) * 0.3f;
    sg_tensor *t = sg_from_host(ctx, SG_F32, 2, (int64_t[]){rows, cols}, v);
    free(v);
    return t;
}

int main(int argc, char **argv) {
    long long tokens = 24;
    if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")))
        return printf("usage: kv_decode [tokens in 1..%d]\n", S), 0;
    if ((argc > 1 && !arg_int(argv[1], 1, S, &tokens)) || argc > 2) {
        fprintf(stderr, "usage: kv_decode [tokens in 1..%d]\n", S);
        return 2;
    }
    sg_ctx *ctx;
    if (sg_ctx_create(NULL, &ctx) != SG_OK) {
        fprintf(stderr, "kv_decode: %s\n", sg_last_error(NULL));
        return 1;
    }
    unsigned seed = 11;
    layer l[2]; /* [0] compiled, [1] eager: same weights, own caches */
    l[0].wqkv = random_tensor(ctx, 3 * C, C, &seed);
    l[0].wo = random_tensor(ctx, C, C, &seed);
    l[1].wqkv = l[0].wqkv;
    l[1].wo = l[0].wo;
    for (int i = 0; i < 2; i++) {
        l[i].kcache = sg_zeros(ctx, SG_F32, 3, (int64_t[]){H, S, D});
        l[i].vcache = sg_zeros(ctx, SG_F32, 3, (int64_t[]){H, S, D});
        l[i].slots = sg_arange(ctx, SG_I64, 0, S, 1);
    }
    sg_tensor *x = sg_zeros(ctx, SG_F32, 2, (int64_t[]){1, C});
    sg_tensor *pos = sg_zeros(ctx, SG_I64, 1, (int64_t[]){1});
    sg_fn *fn[2] = {NULL, NULL};
    sg_status st = sg_ctx_status(ctx);
    sg_mode modes[2] = {SG_MODE_REDUCE_OVERHEAD, SG_MODE_EAGER};
    for (int i = 0; i < 2 && st == SG_OK; i++)
        st = sg_compile(ctx, decode, &l[i], 2, 1,
                        &(sg_compile_opts){.mode = modes[i], .name = "decode"}, &fn[i]);
    double worst = 0;
    float xs[C], y[2][C];
    for (int t = 0; st == SG_OK && t < tokens; t++) {
        for (int j = 0; j < C; j++) xs[j] = frand(&seed);
        int64_t p = t;
        st = sg_write(x, xs, sizeof xs);
        if (st == SG_OK) st = sg_write(pos, &p, sizeof p); /* the position, in place */
        for (int i = 0; i < 2 && st == SG_OK; i++) {
            sg_tensor *out;
            st = sg_call(fn[i], (sg_tensor *[]){x, pos}, 2, &out, 1);
            if (st == SG_OK) st = sg_read(out, y[i], sizeof y[i]);
        }
        for (int j = 0; st == SG_OK && j < C; j++) {
            double e = fabs((double)y[0][j] - y[1][j]) / (1e-3 + fabs((double)y[1][j]));
            if (!(e <= worst)) worst = e;
        }
    }
    if (st != SG_OK) fprintf(stderr, "kv_decode: %s\n", sg_last_error(ctx));
    else
        printf("kv_decode: %d tokens on %s, compiled against eager: worst rel. error %.2g\n",
               (int)tokens, sg_backend_name(sg_ctx_backend(ctx)), worst);
    for (int i = 0; i < 2; i++) sg_fn_destroy(fn[i]);
    sg_ctx_destroy(ctx);
    return st == SG_OK && worst < 1e-4 ? 0 : 1;
}
