/* SPDX-License-Identifier: MIT */
/*
 * test_fusion_attn_copies.c -- which copies the CUDA backend's fusion gives
 * to the attention after them (sg__group.ncopies), without a GPU: steps are
 * captured on the CPU backend and their IR fused with the CUDA backend's
 * options. A prefill's K and V copied into caches right before sg_sdpa over
 * the same views join the attention's group (2 copies; K alone: 1); nothing
 * joins when the copy's source is another view (K's first half of the keys),
 * when the copy group also computes (K * 2), when the copy writes a tensor
 * the attention reads (V's rows into K's projection), or when another kernel
 * runs between them; the CPU backend's own fusion never merges. The values
 * of these steps are checked by test_ops_attn (SDPA_PREFILL_CACHE_COPIES) on
 * every backend.
 */
#include "graphs/cuda/cublaslt.h"
#include "graphs/graphs.h"
#include "testutil.h"

#include "cuda_unit.h"

#include <string.h>

static sg_ctx *ctx;

enum { C_KV, C_K, C_OTHER_VIEW, C_COMPUTES, C_INTO_INPUT, C_BETWEEN, NC };
static const char *const names[NC] = {"k+v into caches",       "k into its cache",
                                      "a narrower view of k",  "k * 2 into the cache",
                                      "v into the projection", "a kernel in between"};

/* in: proj (B, L, 3H, D), kc, vc (B, H, S, D), x; out: the attention, x * 3. */
static sg_status step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    int kind = *(const int *)user;
    static const int perm[4] = {0, 2, 1, 3};
    int64_t H = sg_tensor_size(in[1], 1), L = sg_tensor_size(in[0], 1);
    sg_tensor *q = sg_permute(sg_narrow(in[0], 2, 0, H), perm);
    sg_tensor *k = sg_permute(sg_narrow(in[0], 2, H, H), perm);
    sg_tensor *v = sg_permute(sg_narrow(in[0], 2, 2 * H, H), perm);
    sg_tensor *kn = sg_narrow(in[1], 2, 0, L), *vn = sg_narrow(in[2], 2, 0, L);
    sg_status s = SG_OK;
    switch (kind) {
    case C_KV:
    case C_BETWEEN:
        s = sg_copy_(kn, k);
        if (s == SG_OK) s = sg_copy_(vn, v);
        break;
    case C_K: s = sg_copy_(kn, k); break;
    case C_OTHER_VIEW:
        s = sg_copy_(sg_narrow(in[1], 2, 0, L / 2), sg_narrow(k, 2, 0, L / 2));
        break;
    case C_COMPUTES: s = sg_copy_(kn, sg_mul_scalar(k, 2.0)); break;
    case C_INTO_INPUT: s = sg_copy_(sg_permute(sg_narrow(in[0], 2, H, H), perm), v); break;
    }
    if (kind == C_BETWEEN && s == SG_OK) s = sg_add_(in[3], in[3]);
    out[0] = s == SG_OK ? sg_sdpa(q, k, v, NULL, true, 0) : NULL;
    out[1] = sg_mul_scalar(in[3], 3.0);
    return out[0] && out[1] ? SG_OK : sg_ctx_status(c);
}

/* The CUDA backend's fusion options (graphs/cuda/cuda_graph.c); NULL when
 * built without the CUDA headers. */
/* Copies merged into attention groups, checking each merged group's shape. */
static int merged(const sg__ir *ir, const sg__fused *f, bool *sane) {
    int n = 0;
    for (int k = 0; k < f->ngroups; k++) {
        const sg__group *g = &f->groups[k];
        if (!g->ncopies || g->kind != SG__G_OPAQUE) continue;
        *sane = *sane && ir->nodes[g->g[0].node].op == SG__OP_ATTENTION && g->n == 1 + g->ncopies;
        for (int m = 1; m < g->n; m++) *sane = *sane && ir->nodes[g->g[m].node].op == SG__OP_COPY;
        n += g->ncopies;
    }
    return n;
}

static void run(int kind, int want) {
    const int64_t B = 2, L = 12, H = 2, D = 16, S = 20;
    int64_t ps[4] = {B, L, 3 * H, D}, cs[4] = {B, H, S, D}, xs[1] = {5};
    sg_tensor *in[4] = {
        tu_rand(ctx, SG_BF16, 4, ps, -1, 1, NULL), tu_rand(ctx, SG_BF16, 4, cs, -1, 1, NULL),
        tu_rand(ctx, SG_BF16, 4, cs, -1, 1, NULL), tu_rand(ctx, SG_F32, 1, xs, -1, 1, NULL)};
    sg_fn *fn = NULL;
    sg_tensor *out[2] = {NULL};
    bool ok =
        TU_EXPECT(sg_compile(ctx, step, &kind, 4, 2,
                             &(sg_compile_opts){.mode = SG_MODE_REDUCE_OVERHEAD}, &fn) == SG_OK) &&
        TU_EXPECT(sg_call(fn, in, 4, out, 2) == SG_OK) && TU_EXPECT(fn->ngraphs == 1);
    if (!ok) fprintf(stderr, "  %s\n", sg_last_error(ctx));
    int got = -1, cpu = -1;
    bool sane = true;
    sg__fuse_opts fo;
    sg__fused f;
    if (ok && cu_fuse_opts(&fo)) {
        sg__graph *g = fn->graphs[0];
        ok = TU_EXPECT(fo.attn_copies) && TU_EXPECT(sg__fuse(ctx, &g->ir, &fo, &f) == SG_OK);
        if (ok) got = merged(&g->ir, &f, &sane), sg__fused_free(ctx, &f, &g->ir);
        sg__fuse_opts co = {.horizontal = true};
        const sg__graph_ops *ops = ctx->gops;
        if (ops && ops->fuse_opts) ops->fuse_opts(&co, false);
        ok = ok && TU_EXPECT(!co.attn_copies) && TU_EXPECT(sg__fuse(ctx, &g->ir, &co, &f) == SG_OK);
        if (ok) cpu = merged(&g->ir, &f, &sane), sg__fused_free(ctx, &f, &g->ir);
        ok = ok && TU_EXPECT(sane) && TU_EXPECT(got == want) && TU_EXPECT(cpu == 0);
    } else if (ok) {
        got = want; /* no CUDA headers: the CUDA options do not exist here */
    }
    tu_case(ok, "ATTN_COPIES(%s): %d copies merged (want %d), CPU fusion %d", names[kind], got,
            want, cpu);
    sg_clear_error(ctx);
    sg_release(out[0]), sg_release(out[1]);
    sg_fn_destroy(fn);
    for (int i = 0; i < 4; i++) sg_release(in[i]);
}

int main(void) {
    if (sg_ctx_create(&(sg_ctx_opts){.backend = SG_BACKEND_CPU}, &ctx) != SG_OK) return 1;
    tu_seed(5);
    static const int want[NC] = {2, 1, 0, 0, 0, 0};
    for (int k = 0; k < NC; k++) run(k, want[k]);
    sg_ctx_destroy(ctx);
    return tu_finish();
}
