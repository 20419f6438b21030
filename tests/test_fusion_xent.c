/* SPDX-License-Identifier: MIT */
/*
 * test_fusion_xent.c -- which cross_entropy the CUDA backend's fusion
 * computes in its gradient's kernel (sg__group.xent), without a GPU: steps
 * are captured on the CPU backend, their IR fused with the CUDA backend's
 * options, and the decision read back from sg_fn_explain's lines (the
 * fused groups put in the compiled graph's place) and from the perf hint.
 * A loss and its gradient merge (also through a linear head, and with the
 * loss returned); they stay two kernels when a kernel between them reads
 * the loss (loss * 2 returned, or a scaled loss: loss * 0.75, its own
 * kernel); the CPU backend's own fusion never merges. The numbers of the merged pair are checked by
 * test_capture_xent (XENT_PAIR) on every backend.
 */
#include "graphs/cuda/exec.h"
#include "graphs/graphs.h"
#include "testutil.h"

#include "cuda_unit.h"

#include <string.h>

static sg_ctx *ctx;

enum { P_PLAIN, P_HEAD, P_READ_BETWEEN, P_SCALED, NP };
static const char *const names[NP] = {"loss and its gradient", "linear head", "loss * 2 between",
                                      "loss * 0.75"};

/* The last perf hint about a cross_entropy pair. */
static char hint[512];

static void log_hook(void *user, const char *topic, const char *line) {
    (void)user;
    if (strcmp(topic, "perf_hints") == 0 && strstr(line, "cross_entropy"))
        snprintf(hint, sizeof hint, "%s", line);
}

/* in: logits (N, C) or x (N, K) and w (C, K), targets (N); out: the loss, the
 * gradient of the leaf, and for P_READ_BETWEEN loss * 2. */
static sg_status step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    int kind = *(const int *)user;
    sg_tensor *leaf = in[0];
    sg_tensor *logits = kind == P_HEAD ? sg_linear(in[0], in[2], NULL) : in[0];
    sg_tensor *loss = sg_cross_entropy(logits, in[1]);
    if (kind == P_SCALED) loss = sg_mul_scalar(loss, 0.75);
    out[2] = kind == P_READ_BETWEEN ? sg_mul_scalar(loss, 2.0) : sg_add_scalar(in[0], 0.0);
    out[1] = NULL;
    sg_status s = loss ? sg_grad(loss, 1, &leaf, &out[1]) : sg_ctx_status(c);
    out[0] = loss;
    return s;
}

/* The CUDA backend's fusion options (graphs/cuda/cuda_graph.c); false when
 * built without the CUDA headers. */
/* Merged pairs, checking each merged group's shape. */
static int merged(const sg__ir *ir, const sg__fused *f, bool *sane) {
    int n = 0;
    for (int k = 0; k < f->ngroups; k++) {
        const sg__group *g = &f->groups[k];
        if (!g->xent) continue;
        *sane = *sane && g->n == 2 && g->xent == 1 &&
                ir->nodes[g->g[0].node].op == SG__OP_CROSS_ENTROPY_BWD &&
                ir->nodes[g->g[1].node].op == SG__OP_CROSS_ENTROPY;
        n++;
    }
    return n;
}

/* sg_fn_explain's text for graph g with fused groups f in its place. */
static bool explain_with(sg_fn *fn, sg__graph *g, sg__fused *f, char *buf, size_t size) {
    sg__fused keep = g->fused;
    bool had = g->has_fused;
    g->fused = *f, g->has_fused = true;
    const char *e = sg_fn_explain(fn);
    snprintf(buf, size, "%s", e ? e : "");
    g->fused = keep, g->has_fused = had;
    return e != NULL;
}

static void run(int kind, int want, const char *why) {
    const int64_t N = 6, C = 37, K = 8;
    int64_t ls[2] = {N, kind == P_HEAD ? K : C}, ws[2] = {C, K}, tv[6];
    for (int i = 0; i < N; i++) tv[i] = tu_randint(0, C - 1);
    sg_tensor *in[3] = {tu_rand(ctx, SG_F32, 2, ls, -1, 1, NULL),
                        sg_from_host(ctx, SG_I64, 1, &N, tv),
                        kind == P_HEAD ? tu_rand(ctx, SG_F32, 2, ws, -1, 1, NULL) : NULL};
    int nin = kind == P_HEAD ? 3 : 2;
    sg_fn *fn = NULL;
    sg_tensor *out[3] = {NULL};
    bool ok =
        TU_EXPECT(sg_requires_grad_(in[0], true) == SG_OK) &&
        TU_EXPECT(sg_compile(ctx, step, &kind, nin, 3,
                             &(sg_compile_opts){.mode = SG_MODE_REDUCE_OVERHEAD}, &fn) == SG_OK) &&
        TU_EXPECT(sg_call(fn, in, nin, out, 3) == SG_OK) && TU_EXPECT(fn->ngraphs == 1);
    if (!ok) fprintf(stderr, "  %s\n", sg_last_error(ctx));
    int got = -1, cpu = -1;
    bool sane = true;
    sg__fuse_opts fo;
    sg__fused f;
    static char text[16384];
    text[0] = '\0';
    hint[0] = '\0';
    if (ok && cu_fuse_opts(&fo)) {
        sg__graph *g = fn->graphs[0];
        ok = TU_EXPECT(fo.xent_pairs) && TU_EXPECT(sg__fuse(ctx, &g->ir, &fo, &f) == SG_OK);
        if (ok) {
            got = merged(&g->ir, &f, &sane);
            ok = TU_EXPECT(explain_with(fn, g, &f, text, sizeof text));
            sg__fused_free(ctx, &f, &g->ir);
        }
        bool said = strstr(text, "cross_entropy pair: IR line") != NULL &&
                    strstr(text, "also computes IR line") != NULL;
        const char *two = strstr(text, "run as two kernels: ");
        ok = ok && TU_EXPECT(said == (want > 0));
        ok = ok && (why ? TU_EXPECT(two && strstr(two, why) && strstr(hint, why))
                        : TU_EXPECT(!two && !hint[0]));
        sg__fuse_opts co = {.horizontal = true};
        const sg__graph_ops *ops = ctx->gops;
        if (ops && ops->fuse_opts) ops->fuse_opts(&co, false);
        ok = ok && TU_EXPECT(!co.xent_pairs) && TU_EXPECT(sg__fuse(ctx, &g->ir, &co, &f) == SG_OK);
        if (ok) cpu = merged(&g->ir, &f, &sane), sg__fused_free(ctx, &f, &g->ir);
        ok = ok && TU_EXPECT(sane) && TU_EXPECT(got == want) && TU_EXPECT(cpu == 0);
        if (!ok) fprintf(stderr, "%s\n  hint: %s\n", text, hint);
    } else if (ok) {
        got = want; /* no CUDA headers: the CUDA options do not exist here */
    }
    tu_case(ok, "XENT_FUSION(%s): %d pairs merged (want %d%s%s), CPU fusion %d", names[kind], got,
            want, why ? "; why: " : "", why ? why : "", cpu);
    sg_clear_error(ctx);
    for (int i = 0; i < 3; i++) sg_release(out[i]), sg_release(in[i]);
    sg_fn_destroy(fn);
}

int main(void) {
    if (sg_ctx_create(&(sg_ctx_opts){.backend = SG_BACKEND_CPU, .log = log_hook}, &ctx) != SG_OK)
        return 1;
    tu_seed(7);
    run(P_PLAIN, 1, NULL);
    run(P_HEAD, 1, NULL);
    run(P_READ_BETWEEN, 0, "reads or writes the loss");
    run(P_SCALED, 0, "reads or writes the loss");
    sg_ctx_destroy(ctx);
    return tu_finish();
}
