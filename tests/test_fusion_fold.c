/* SPDX-License-Identifier: MIT */
/*
 * test_fusion_fold.c -- constant folding: the groups of a capture that read
 * no input, parameter or RNG state (fills, arange and their pointwise
 * functions) are computed once when the plan is built and kept in a pool
 * block of their own. Checked against f64 references on random inputs that
 * change every call: in every compiled mode, over several replays, with
 * SG_CONST_FOLD=0 (the same numbers, nothing folded), for a constant
 * written in place later (not folded), for a constant that is an output
 * (not folded), after the pool grows and moves (another fn with a larger
 * plan) and after a recapture for another shape. The folded values'
 * bytes never overlap the scratch that plans share. Beside it, W4's other
 * change of kernel count: linear's bias gradient is taken before its
 * products, so that for CUDA its column sum takes the relu backward's
 * where as its prologue -- up to 1M elements (checked both sides, with
 * the gradients against f64).
 * SG_TEST_BACKEND=cuda runs the same checks on the GPU.
 */
#define _POSIX_C_SOURCE 200809L
#include "graphs/graphs.h"
#include "testutil.h"

#include <math.h>
#include <string.h>

static sg_ctx *ctx;

#define STEP(name)                                                                                 \
    static sg_status name(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user)

/* y = (x + 0.5 exp(arange(C) / 4)) * 2.5 - 1.0, x (R, C): arange, its exp
 * chain over [C] and the 0-d fills are constants, the add over [R, C] is
 * not; the chain and the 0-d fill are groups of their own (other shapes
 * than x's). */
STEP(const_step) {
    (void)user;
    int64_t C = sg_tensor_size(in[0], 1);
    sg_tensor *k =
        sg_mul_scalar(sg_exp(sg_mul_scalar(sg_arange(c, SG_F32, 0, (double)C, 1), 0.25)), 0.5);
    sg_tensor *two5 = sg_full(c, SG_F32, 0, NULL, 2.5), *one = sg_full(c, SG_F32, 0, NULL, 1.0);
    out[0] = sg_sub(sg_mul(sg_add(in[0], k), two5), one);
    return out[0] ? SG_OK : sg_ctx_status(c);
}

static double const_ref(double x, int64_t j) { return (x + 0.5 * exp((double)j * 0.25)) * 2.5 - 1; }

/* Count "values folded" in explain's text: the sum over captures. */
static int folded_in(sg_fn *fn) {
    int n = 0;
    for (const char *t = sg_fn_explain(fn); (t = strstr(t, "constants: ")) != NULL;) {
        t += strlen("constants: ");
        n += atoi(t);
    }
    return n;
}

/* The folded slots of every capture of fn lie outside the scratch that the
 * context's plans share, in a pool block of their own. */
static bool consts_apart(sg_fn *fn) {
    const sg__pool *p = fn->ctx->pool;
    for (int gi = 0; gi < fn->ngraphs; gi++) {
        const sg__graph *g = fn->graphs[gi];
        for (int s = 0; g->slot_const && s < g->ir.nslots; s++) {
            if (!g->slot_const[s]) continue;
            const char *at = (const char *)sg__pool_addr(fn->ctx, g->const_block, g->slot_off[s]);
            const char *lo = (const char *)p->base, *hi = lo + p->scratch; /* scratch */
            if ((at >= lo && at < hi) || g->slot_st[s].data != at) return false;
        }
    }
    return true;
}

/* Call fn `calls` times on fresh random x (R, C) and check y against f64. */
static bool run_const(sg_fn *fn, int64_t R, int64_t C, int calls) {
    bool ok = true;
    for (int call = 0; ok && call < calls; call++) {
        double *xv = NULL;
        sg_tensor *x = tu_rand(ctx, SG_F32, 2, (int64_t[]){R, C}, -2, 2, &xv), *y = NULL;
        sg_mark_step_begin(ctx);
        ok = TU_EXPECT(x && sg_call(fn, &x, 1, &y, 1) == SG_OK);
        double *got = ok ? tu_read(y) : NULL, *ref = malloc(sizeof(double) * (size_t)(R * C));
        for (int64_t i = 0; ok && ref && i < R * C; i++) ref[i] = const_ref(xv[i], i % C);
        ok = ok && TU_EXPECT(got && ref) && tu_close("y", got, ref, R * C, 1e-5, 1e-5);
        free(got), free(ref), free(xv);
        sg_release(x);
    }
    if (!ok) fprintf(stderr, "%s\n%s\n", sg_last_error(ctx), sg_fn_explain(fn));
    sg_clear_error(ctx);
    return ok;
}

static void test_modes(void) {
    static const sg_mode modes[] = {SG_MODE_DEFAULT, SG_MODE_REDUCE_OVERHEAD, SG_MODE_MAX_AUTOTUNE,
                                    SG_MODE_MAX_AUTOTUNE_NO_GRAPHS, SG_MODE_EAGER};
    for (int fold = 1; fold >= 0; fold--) {
        if (!fold) setenv("SG_CONST_FOLD", "0", 1);
        for (size_t m = 0; m < sizeof modes / sizeof *modes; m++) {
            sg_fn *fn = NULL;
            bool ok = TU_EXPECT(sg_compile(ctx, const_step, NULL, 1, 1,
                                           &(sg_compile_opts){.mode = modes[m]}, &fn) == SG_OK) &&
                      run_const(fn, 6, 40, 4);
            /* arange, its two mul_scalars and exp, the two fills */
            int want = fold && modes[m] != SG_MODE_EAGER ? 6 : 0;
            ok = ok && TU_EXPECT(folded_in(fn) == want) && TU_EXPECT(consts_apart(fn));
            if (ok && want)
                ok = TU_EXPECT(fn->graphs[0]->compiled && fn->graphs[0]->fused.nconsts == 3);
            tu_case(ok, "FOLD(mode=%s,SG_CONST_FOLD=%d,x=[6,40],calls=4,folded=%d)",
                    sg_mode_name(modes[m]), fold, want);
            sg_fn_destroy(fn);
        }
    }
    unsetenv("SG_CONST_FOLD");
}

/* A constant written in place later is no constant: c = zeros; c += v;
 * y = x + c, with v an input that changes every call. */
STEP(inplace_step) {
    (void)user;
    sg_tensor *cz = sg_zeros(c, SG_F32, 1, (int64_t[]){sg_tensor_size(in[0], 1)});
    sg_status s = sg_add_(cz, in[1]);
    if (s != SG_OK) return s;
    out[0] = sg_add(in[0], cz);
    return out[0] ? SG_OK : sg_ctx_status(c);
}

static void test_inplace(void) {
    sg_fn *fn = NULL;
    int64_t R = 5, C = 24;
    bool ok =
        TU_EXPECT(sg_compile(ctx, inplace_step, NULL, 2, 1,
                             &(sg_compile_opts){.mode = SG_MODE_REDUCE_OVERHEAD}, &fn) == SG_OK);
    for (int call = 0; ok && call < 4; call++) {
        double *xv = NULL, *vv = NULL;
        sg_tensor *in[2] = {tu_rand(ctx, SG_F32, 2, (int64_t[]){R, C}, -2, 2, &xv),
                            tu_rand(ctx, SG_F32, 1, &C, -2, 2, &vv)},
                  *y = NULL;
        sg_mark_step_begin(ctx);
        ok = TU_EXPECT(in[0] && in[1] && sg_call(fn, in, 2, &y, 1) == SG_OK);
        double *got = ok ? tu_read(y) : NULL, *ref = malloc(sizeof(double) * (size_t)(R * C));
        for (int64_t i = 0; ok && ref && i < R * C; i++) ref[i] = xv[i] + vv[i % C];
        ok = ok && TU_EXPECT(got && ref) && tu_close("y", got, ref, R * C, 1e-5, 1e-5);
        free(got), free(ref), free(xv), free(vv);
        sg_release(in[0]), sg_release(in[1]);
    }
    ok = ok && TU_EXPECT(folded_in(fn) == 0) && TU_EXPECT(fn->graphs[0]->compiled);
    if (!ok) fprintf(stderr, "%s\n%s\n", sg_last_error(ctx), sg_fn_explain(fn));
    sg_clear_error(ctx);
    tu_case(ok, "FOLD_INPLACE(zeros[24] += v, x=[5,24], calls=4: not folded)");
    sg_fn_destroy(fn);
}

/* A constant that is the step's output is not folded (it lives in the
 * output sets); one read by another output beside it still is. */
STEP(output_step) {
    (void)user;
    out[0] = sg_full(c, SG_F32, 1, (int64_t[]){3}, 7.0);
    out[1] = sg_mul(in[0], sg_full(c, SG_F32, 0, NULL, -3.0));
    return out[0] && out[1] ? SG_OK : sg_ctx_status(c);
}

static void test_output(void) {
    sg_fn *fn = NULL;
    bool ok =
        TU_EXPECT(sg_compile(ctx, output_step, NULL, 1, 2,
                             &(sg_compile_opts){.mode = SG_MODE_REDUCE_OVERHEAD}, &fn) == SG_OK);
    for (int call = 0; ok && call < 3; call++) {
        double *xv = NULL;
        sg_tensor *x = tu_rand(ctx, SG_F32, 1, (int64_t[]){16}, -2, 2, &xv), *o[2] = {NULL};
        sg_mark_step_begin(ctx);
        ok = TU_EXPECT(x && sg_call(fn, &x, 1, o, 2) == SG_OK);
        double *a = ok ? tu_read(o[0]) : NULL, *b = ok ? tu_read(o[1]) : NULL, ra[3], rb[16];
        for (int i = 0; i < 3; i++) ra[i] = 7.0;
        for (int i = 0; xv && i < 16; i++) rb[i] = -3.0 * xv[i];
        ok = ok && TU_EXPECT(a && b) && tu_close("full", a, ra, 3, 0, 0) &&
             tu_close("x * -3", b, rb, 16, 1e-6, 1e-6);
        free(a), free(b), free(xv);
        sg_release(x);
    }
    ok = ok && TU_EXPECT(folded_in(fn) == 1);
    if (!ok) fprintf(stderr, "%s\n%s\n", sg_last_error(ctx), sg_fn_explain(fn));
    sg_clear_error(ctx);
    tu_case(ok, "FOLD_OUTPUT(out0 = full[3] not folded, out1 = x * full[] folded, calls=3)");
    sg_fn_destroy(fn);
}

/* A constant fused with work on an input replays with it; a constant
 * group reading it (through a view of another shape) must then replay too:
 * y = x * a + 3 a viewed as (C/2, 2), a = full([C], 2). */
STEP(mixed_step) {
    (void)user;
    int64_t C = sg_tensor_size(in[0], 0), h[2] = {C / 2, 2};
    sg_tensor *a = sg_full(c, SG_F32, 1, &C, 2.0), *xa = sg_mul(in[0], a);
    sg_tensor *k = sg_mul_scalar(sg_reshape(a, 2, h), 3.0);
    out[0] = sg_add(xa, sg_reshape(k, 1, &C));
    return out[0] ? SG_OK : sg_ctx_status(c);
}

static void test_mixed(void) {
    sg_fn *fn = NULL;
    int64_t C = 64;
    bool ok =
        TU_EXPECT(sg_compile(ctx, mixed_step, NULL, 1, 1,
                             &(sg_compile_opts){.mode = SG_MODE_REDUCE_OVERHEAD}, &fn) == SG_OK);
    for (int call = 0; ok && call < 3; call++) {
        double *xv = NULL, ref[64];
        sg_tensor *x = tu_rand(ctx, SG_F32, 1, &C, -2, 2, &xv), *y = NULL;
        sg_mark_step_begin(ctx);
        ok = TU_EXPECT(x && sg_call(fn, &x, 1, &y, 1) == SG_OK);
        for (int64_t i = 0; xv && i < C; i++) ref[i] = xv[i] * 2.0 + 6.0;
        double *got = ok ? tu_read(y) : NULL;
        ok = ok && TU_EXPECT(got) && tu_close("y", got, ref, C, 1e-6, 1e-6);
        free(got), free(xv);
        sg_release(x);
    }
    if (!ok) fprintf(stderr, "%s\n%s\n", sg_last_error(ctx), sg_fn_explain(fn));
    sg_clear_error(ctx);
    tu_case(ok, "FOLD_MIXED(a = full[64] fused with x * a, 3 a as [32,2] reads it, calls=3)");
    sg_fn_destroy(fn);
}

/* A step with a large intermediate: its plan needs more scratch than the
 * pool holds, so the pool grows and moves. */
STEP(big_step) {
    (void)user;
    out[0] = sg_sum(sg_exp(sg_mul_scalar(in[0], 0.5)), 0, NULL, false);
    return out[0] ? SG_OK : sg_ctx_status(c);
}

/* Folded constants survive the pool moving (another fn's larger plan) and
 * a recapture for another shape (each capture folds its own). */
static void test_replan(void) {
    sg_fn *fn = NULL, *big = NULL;
    bool ok =
        TU_EXPECT(sg_compile(ctx, const_step, NULL, 1, 1,
                             &(sg_compile_opts){.mode = SG_MODE_REDUCE_OVERHEAD}, &fn) == SG_OK) &&
        run_const(fn, 4, 32, 2);
    int gen = ok ? ctx->pool->generation : 0;
    sg_tensor *xb = tu_rand(ctx, SG_F32, 2, (int64_t[]){512, 1024}, -1, 1, NULL), *yb = NULL;
    ok =
        ok &&
        TU_EXPECT(sg_compile(ctx, big_step, NULL, 1, 1,
                             &(sg_compile_opts){.mode = SG_MODE_REDUCE_OVERHEAD}, &big) == SG_OK) &&
        TU_EXPECT(sg_call(big, &xb, 1, &yb, 1) == SG_OK) && TU_EXPECT(ctx->pool->generation != gen);
    ok = ok && run_const(fn, 4, 32, 2) && TU_EXPECT(consts_apart(fn));
    ok = ok && run_const(fn, 3, 48, 2) && run_const(fn, 4, 32, 1) && run_const(fn, 3, 48, 1);
    ok = ok && TU_EXPECT(fn->ngraphs == 2) && TU_EXPECT(folded_in(fn) == 12) &&
         TU_EXPECT(consts_apart(fn));
    tu_case(ok, "FOLD_REPLAN(x=[4,32], pool moved by a [512,1024] plan, recapture x=[3,48])");
    sg_release(xb);
    sg_fn_destroy(big);
    sg_fn_destroy(fn);
}

/* One layer's gradients: y = relu(x w^T + b), loss = sum(y * c); the
 * step returns dw and db. in = {x (R, K), c (R, N)}. */
typedef struct layer {
    sg_tensor *w, *b;
} layer;

STEP(layer_step) {
    layer *m = user;
    sg_tensor *y = sg_relu(sg_linear(in[0], m->w, m->b)), *p[2] = {m->w, m->b};
    sg_tensor *loss = sg_sum(sg_mul(y, in[1]), 0, NULL, false);
    if (!loss) return sg_ctx_status(c);
    return sg_grad(loss, 2, p, out);
}

/* Whether the capture's CUDA fusion has a group running the where and the
 * sum (the relu backward as the bias sum's prologue). */
static bool where_in_sum(sg_fn *fn) {
    sg__fuse_opts fo;
    sg__cgen_cuda_fuse_opts(&fo, false);
    sg__fused f;
    bool found = false;
    if (sg__fuse(fn->ctx, &fn->graphs[0]->ir, &fo, &f) != SG_OK) return false;
    for (int k = 0; k < f.ngroups && !found; k++) {
        const sg__group *g = &f.groups[k];
        bool w = false, sum = false;
        for (int i = 0; i < g->n; i++) {
            sg__op op = fn->graphs[0]->ir.nodes[g->g[i].node].op;
            w = w || op == SG__OP_WHERE;
            sum = sum || op == SG__OP_SUM;
        }
        found = w && sum;
    }
    sg__fused_free(fn->ctx, &f, &fn->graphs[0]->ir);
    return found;
}

static void layer_case(int64_t R, int64_t K, int64_t N, bool fused) {
    double *wv = NULL, *bv = NULL, *xv = NULL, *cv = NULL;
    layer m = {tu_rand(ctx, SG_F32, 2, (int64_t[]){N, K}, -1, 1, &wv),
               tu_rand(ctx, SG_F32, 1, &N, -1, 1, &bv)};
    sg_tensor *in[2] = {tu_rand(ctx, SG_F32, 2, (int64_t[]){R, K}, -1, 1, &xv),
                        tu_rand(ctx, SG_F32, 2, (int64_t[]){R, N}, -1, 1, &cv)},
              *out[2] = {NULL, NULL};
    sg_fn *fn = NULL;
    bool ok =
        TU_EXPECT(m.w && m.b && in[0] && in[1]) &&
        TU_EXPECT(sg_requires_grad_(m.w, true) == SG_OK) &&
        TU_EXPECT(sg_requires_grad_(m.b, true) == SG_OK) &&
        TU_EXPECT(sg_compile(ctx, layer_step, &m, 2, 2,
                             &(sg_compile_opts){.mode = SG_MODE_REDUCE_OVERHEAD}, &fn) == SG_OK);
    double *dw = calloc((size_t)(N * K), sizeof(double)), *db = calloc((size_t)N, sizeof(double));
    for (int64_t r = 0; ok && dw && db && r < R; r++)
        for (int64_t n = 0; n < N; n++) {
            double h = bv[n];
            for (int64_t k = 0; k < K; k++) h += xv[r * K + k] * wv[n * K + k];
            double g = h > 0 ? cv[r * N + n] : 0;
            db[n] += g;
            for (int64_t k = 0; k < K; k++) dw[n * K + k] += g * xv[r * K + k];
        }
    for (int call = 0; ok && call < 2; call++) {
        sg_mark_step_begin(ctx);
        ok = TU_EXPECT(sg_call(fn, in, 2, out, 2) == SG_OK);
        double *gw = ok ? tu_read(out[0]) : NULL, *gb = ok ? tu_read(out[1]) : NULL;
        ok = ok && TU_EXPECT(gw && gb && dw && db) && tu_close("dw", gw, dw, N * K, 1e-5, 1e-5) &&
             tu_close("db", gb, db, N, 1e-5, 1e-5);
        free(gw), free(gb);
    }
    ok = ok && TU_EXPECT(where_in_sum(fn) == fused);
    if (!ok) fprintf(stderr, "%s\n", sg_last_error(ctx));
    sg_clear_error(ctx);
    tu_case(ok, "BIAS_GRAD(x=[%lld,%lld],w=[%lld,%lld],relu,where in the CUDA bias sum=%d)",
            (long long)R, (long long)K, (long long)N, (long long)K, fused);
    sg_fn_destroy(fn);
    sg_release(m.w), sg_release(m.b), sg_release(in[0]), sg_release(in[1]);
    free(wv), free(bv), free(xv), free(cv), free(dw), free(db);
}

static void test_bias_grad(void) {
    layer_case(16, 12, 40, true);
    layer_case(128, 3, 8448, false); /* 1.08M elements: the sum alone */
}

int main(void) {
    unsetenv("SG_CONST_FOLD"); /* the test sets it where it means to */
    ctx = tu_ctx((sg_ctx_opts){0});
    tu_seed(11);
    test_modes();
    test_inplace();
    test_output();
    test_mixed();
    test_replan();
    test_bias_grad();
    sg_ctx_destroy(ctx);
    return tu_finish();
}
