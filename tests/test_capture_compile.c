/* SPDX-License-Identifier: MIT */
/*
 * test_capture_compile.c -- compiled steps against eager runs and against
 * f64 references: replay results, zero allocations while replaying, output
 * sets and stale outputs, guards and recompiles, the cache limit, graph
 * breaks, and in-place updates of parameters and inputs over many steps.
 */
#include "testutil.h"

#include <math.h>
#include <string.h>

static sg_ctx *ctx;
static char logbuf[1 << 16];

static void log_hook(void *user, const char *topic, const char *line) {
    (void)user;
    size_t n = strlen(logbuf);
    snprintf(logbuf + n, sizeof logbuf - n, "[%s] %s\n", topic, line);
}

/* W1: 6 x (y = tanh(sin(y) * 1.01 + 0.1)), 24 ops. */
static sg_status chain_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)c, (void)user;
    sg_tensor *y = in[0];
    for (int i = 0; i < 6; i++) y = sg_tanh(sg_add_scalar(sg_mul_scalar(sg_sin(y), 1.01), 0.1));
    out[0] = y;
    return y ? SG_OK : sg_ctx_status(c);
}

static double chain_ref(double y) {
    for (int i = 0; i < 6; i++) y = tanh(sin(y) * 1.01 + 0.1);
    return y;
}

static bool check_chain(sg_tensor *x, const double *xv, sg_tensor *y, int64_t n) {
    double *got = tu_read(y), *ref = malloc(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++) ref[i] = chain_ref(xv[i]);
    bool ok = got && tu_close("chain", got, ref, n, tu_rtol(sg_tensor_dtype(x)),
                              tu_atol(sg_tensor_dtype(x)));
    free(got), free(ref);
    return ok;
}

static void test_chain_modes(void) {
    for (sg_mode mode = SG_MODE_DEFAULT; mode <= SG_MODE_MAX_AUTOTUNE_NO_GRAPHS; mode++)
        for (sg_dtype dt = SG_F32; dt <= SG_BF16; dt++) {
            sg_fn *fn;
            bool ok = TU_EXPECT(sg_compile(ctx, chain_step, NULL, 1, 1,
                                           &(sg_compile_opts){.mode = mode}, &fn) == SG_OK);
            int64_t shape[2] = {3, 129};
            for (int call = 0; ok && call < 4; call++) {
                sg_mark_step_begin(ctx);
                double *xv;
                sg_tensor *x = tu_rand(ctx, dt, 2, shape, -3, 3, &xv), *y = NULL;
                ok = TU_EXPECT(sg_call(fn, &x, 1, &y, 1) == SG_OK) && TU_EXPECT(check_chain(x, xv, y, 387));
                sg_release(x);
                free(xv);
            }
            tu_case(ok, "CHAIN24(mode=%s,type=%s,x=[3,129],calls=4)", sg_mode_name(mode),
                    sg_dtype_name(dt));
            sg_fn_destroy(fn);
        }
}

/* Replays allocate nothing: count the hook's allocations over 100 steps. */
static void test_zero_alloc(void) {
    tu_alloc a = {0};
    sg_ctx *c;
    c = tu_ctx((sg_ctx_opts){.alloc = tu_alloc_hook, .alloc_user = &a});
    sg_fn *fn;
    sg_compile(c, chain_step, NULL, 1, 1, &(sg_compile_opts){.mode = SG_MODE_REDUCE_OVERHEAD}, &fn);
    int64_t shape[1] = {4096};
    double *xv;
    sg_tensor *x = tu_rand(c, SG_F32, 1, shape, -2, 2, &xv), *y = NULL;
    bool ok = true;
    for (int i = 0; i < 3; i++) {
        sg_mark_step_begin(c);
        ok = ok && TU_EXPECT(sg_call(fn, &x, 1, &y, 1) == SG_OK);
    }
    long before = a.count;
    for (int i = 0; ok && i < 100; i++) {
        sg_mark_step_begin(c);
        ok = TU_EXPECT(sg_call(fn, &x, 1, &y, 1) == SG_OK);
    }
    long during = a.count - before;
    ok = ok && TU_EXPECT(during == 0) && TU_EXPECT(check_chain(x, xv, y, 4096));
    tu_case(ok, "ZERO_ALLOC(chain24,x=[4096],replays=100,allocations=%ld)", during);
    sg_ctx_destroy(c);
    ok = TU_EXPECT(a.live == 0 && a.bytes == 0);
    tu_case(ok, "NO_LEAK(after sg_ctx_destroy: %ld blocks, %zu bytes)", a.live, a.bytes);
    free(xv);
}

/* Stale outputs: exactly when overwritten, never otherwise. */
static void test_stale(void) {
    sg_fn *fn;
    sg_compile(ctx, chain_step, NULL, 1, 1, &(sg_compile_opts){.mode = SG_MODE_REDUCE_OVERHEAD}, &fn);
    int64_t shape[1] = {64};
    double *av, *bv;
    sg_tensor *a = tu_rand(ctx, SG_F32, 1, shape, -2, 2, &av), *b = tu_rand(ctx, SG_F32, 1, shape, -2, 2, &bv);
    sg_tensor *y1, *y2, *y3, *y4;
    bool ok = true;
    for (int round = 0; round < 3; round++) { /* capture, then replays */
        sg_mark_step_begin(ctx);
        ok = ok && TU_EXPECT(sg_call(fn, &a, 1, &y1, 1) == SG_OK) && TU_EXPECT(sg_call(fn, &b, 1, &y2, 1) == SG_OK);
        /* Two calls in one step: both valid, each its own. */
        ok = ok && TU_EXPECT(check_chain(a, av, y1, 64)) && TU_EXPECT(check_chain(b, bv, y2, 64));
        sg_tensor *v1 = sg_slice(y1, 0, 0, 8, 1); /* a view of an output */
        sg_tensor *keep = sg_clone(y2);
        sg_mark_step_begin(ctx);
        ok = ok && TU_EXPECT(sg_call(fn, &b, 1, &y3, 1) == SG_OK); /* overwrites y1's set */
        float buf[64];
        ok = ok && TU_EXPECT(sg_read(y1, buf, sizeof buf) == SG_ERR_STALE_OUTPUT) &&
             TU_EXPECT(strstr(sg_last_error(ctx), "sg_clone") != NULL);
        sg_clear_error(ctx);
        ok = ok && TU_EXPECT(sg_neg(v1) == NULL && sg_ctx_status(ctx) == SG_ERR_STALE_OUTPUT);
        sg_clear_error(ctx);
        /* y2 was not overwritten (set 1 untouched this step), nor was the clone. */
        ok = ok && TU_EXPECT(check_chain(b, bv, y2, 64)) && TU_EXPECT(check_chain(b, bv, keep, 64));
        ok = ok && TU_EXPECT(check_chain(b, bv, y3, 64));
        /* Releasing y3 frees its set at once: the next call reuses it, y2 stays. */
        sg_release(y3);
        ok = ok && TU_EXPECT(sg_call(fn, &a, 1, &y4, 1) == SG_OK) && TU_EXPECT(check_chain(a, av, y4, 64)) &&
             TU_EXPECT(check_chain(b, bv, y2, 64));
        sg_release(v1), sg_release(keep);
    }
    ok = ok && TU_EXPECT(sg_ctx_status(ctx) == SG_OK);
    tu_case(ok, "STALE(two calls per step, views, clone, release; 3 rounds)");
    sg_release(a), sg_release(b);
    free(av), free(bv);
    sg_fn_destroy(fn);
}

/* Feeding an output back as the next step's input never overwrites it mid-read. */
static void test_feedback(void) {
    sg_fn *fn;
    sg_compile(ctx, chain_step, NULL, 1, 1, &(sg_compile_opts){.mode = SG_MODE_REDUCE_OVERHEAD}, &fn);
    int64_t shape[1] = {100};
    double *v;
    sg_tensor *x = tu_rand(ctx, SG_F32, 1, shape, -2, 2, &v), *y = x;
    double ref[100];
    memcpy(ref, v, sizeof ref);
    bool ok = true;
    for (int step = 0; ok && step < 20; step++) {
        sg_mark_step_begin(ctx);
        sg_tensor *in = y;
        ok = TU_EXPECT(sg_call(fn, &in, 1, &y, 1) == SG_OK);
        for (int i = 0; i < 100; i++) ref[i] = chain_ref((double)(float)ref[i]);
    }
    double *got = ok ? tu_read(y) : NULL;
    ok = ok && TU_EXPECT(got && tu_close("feedback", got, ref, 100, 1e-4, 1e-5));
    tu_case(ok, "FEEDBACK(output fed back as input, 20 steps)");
    free(got), free(v);
    sg_release(x);
    sg_fn_destroy(fn);
}

/* Guards: dtype, shape and stride changes capture anew; past the limit, eager. */
static void test_guards(void) {
    logbuf[0] = '\0';
    sg_fn *fn;
    sg_compile(ctx, chain_step, NULL, 1, 1,
               &(sg_compile_opts){.mode = SG_MODE_REDUCE_OVERHEAD, .cache_size_limit = 3}, &fn);
    int64_t s1[2] = {4, 8}, s2[2] = {8, 4};
    double *v1, *v2, *v3, *v4;
    sg_tensor *a = tu_rand(ctx, SG_F32, 2, s1, -1, 1, &v1);
    sg_tensor *b = tu_rand(ctx, SG_F32, 2, s2, -1, 1, &v2);
    sg_tensor *c = tu_rand_layout(ctx, SG_F32, 2, s1, -1, 1, TU_PERMUTED, &v3);
    sg_tensor *d = tu_rand(ctx, SG_BF16, 2, s1, -1, 1, &v4);
    sg_tensor *y;
    bool ok = true;
    sg_tensor *xs[5] = {a, b, c, d, a};
    const double *vs[5] = {v1, v2, v3, v4, v1};
    for (int i = 0; i < 5; i++) {
        sg_mark_step_begin(ctx);
        ok = ok && TU_EXPECT(sg_call(fn, &xs[i], 1, &y, 1) == SG_OK) && TU_EXPECT(check_chain(xs[i], vs[i], y, 32));
    }
    ok = ok && TU_EXPECT(strstr(logbuf, "[recompiles]") && strstr(logbuf, "input 0 shape [8,4], captured as [4,8]")) &&
         TU_EXPECT(strstr(logbuf, "strides [1,4], captured as [8,1]") != NULL) &&
         TU_EXPECT(strstr(logbuf, "[fallbacks]") && strstr(logbuf, "cache_size_limit (3)")) &&
         TU_EXPECT(strstr(sg_fn_explain(fn), "capture 3") != NULL);
    /* Every call past the limit is a fallback, and each is logged. */
    int64_t s3[2] = {2, 16};
    double *v5;
    sg_tensor *e = tu_rand(ctx, SG_F32, 2, s3, -1, 1, &v5);
    sg_mark_step_begin(ctx);
    ok =
        ok && TU_EXPECT(sg_call(fn, &e, 1, &y, 1) == SG_OK) && TU_EXPECT(check_chain(e, v5, y, 32));
    int said = 0;
    for (const char *p = strstr(logbuf, "cache_size_limit (3)"); p;
         p = strstr(p + 1, "cache_size_limit (3)"))
        said++;
    ok = ok && TU_EXPECT(said == 2);
    sg_release(e), free(v5);
    /* A new address is not a miss. */
    sg_tensor *a2 = sg_clone(a);
    size_t before = strlen(logbuf);
    sg_mark_step_begin(ctx);
    ok = ok && TU_EXPECT(sg_call(fn, &a2, 1, &y, 1) == SG_OK) && TU_EXPECT(check_chain(a2, v1, y, 32)) &&
         TU_EXPECT(strstr(logbuf + before, "recompil") == NULL);
    tu_case(ok, "GUARDS(shape, strides, dtype recapture; limit 3 falls back, each logged; new "
                "address replays)");
    if (!ok) fprintf(stderr, "%s\n%s\n", logbuf, sg_fn_explain(fn));
    sg_release(a), sg_release(b), sg_release(c), sg_release(d), sg_release(a2);
    free(v1), free(v2), free(v3), free(v4);
    sg_fn_destroy(fn);
}

/* Parameters updated in place (an SGD-like step) and an input updated in place. */
typedef struct model {
    sg_tensor *w;
} model;

static sg_status sgd_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    model *m = user;
    /* loss-free toy: w -= 0.1 * tanh(w * x); out = w * x; x += 1 (in place). */
    sg_tensor *wx = sg_mul(m->w, in[0]);
    sg_status s = sg_add_(m->w, sg_mul_scalar(sg_tanh(wx), -0.1));
    if (s == SG_OK) s = sg_add_(in[0], sg_full(c, SG_F32, 0, NULL, 1.0));
    out[0] = wx;
    return s;
}

static void test_mutation(sg_mode mode) {
    model m;
    int64_t shape[1] = {33};
    double *wv, *xv;
    m.w = tu_rand(ctx, SG_F32, 1, shape, -1, 1, &wv);
    sg_tensor *x = tu_rand(ctx, SG_F32, 1, shape, -1, 1, &xv);
    sg_fn *fn;
    sg_compile(ctx, sgd_step, &m, 1, 1, &(sg_compile_opts){.mode = mode}, &fn);
    bool ok = true;
    double ref_out[33];
    for (int step = 0; ok && step < 100; step++) {
        /* Each step's reference starts from the w the device holds: the map
         * multiplies a difference in w by up to 1 - 0.1 x sech^2(w x), ~-9
         * at x ~ 100, so trajectories that start an ulp of tanh apart (a
         * device's tanh against the host's tanhf) part within a few steps. */
        double *w0 = tu_read(m.w);
        ok = TU_EXPECT(w0 != NULL);
        for (int i = 0; ok && i < 33; i++) wv[i] = w0[i];
        free(w0);
        sg_mark_step_begin(ctx);
        sg_tensor *y;
        ok = ok && TU_EXPECT(sg_call(fn, &x, 1, &y, 1) == SG_OK);
        for (int i = 0; i < 33; i++) {
            float wx = (float)wv[i] * (float)xv[i];
            ref_out[i] = wx;
            wv[i] = (float)((float)wv[i] + (float)(tanhf(wx) * -0.1f));
            xv[i] = (float)xv[i] + 1.0f;
        }
        double *got = ok ? tu_read(y) : NULL;
        ok = ok && TU_EXPECT(got && tu_close("out", got, ref_out, 33, 1e-4, 1e-5));
        free(got);
    }
    double *gw = tu_read(m.w), *gx = tu_read(x);
    ok = ok && TU_EXPECT(tu_close("w", gw, wv, 33, 1e-4, 1e-5)) && TU_EXPECT(tu_close("x", gx, xv, 33, 1e-5, 0));
    const char *ex = sg_fn_explain(fn);
    if (mode != SG_MODE_EAGER)
        ok = ok && TU_EXPECT(strstr(ex, "input 0 is written in place") != NULL) &&
             TU_EXPECT(strstr(ex, "written in place") != NULL) && TU_EXPECT(strstr(ex, "capture 2") == NULL);
    tu_case(ok, "MUTATION(mode=%s,param and input updated in place,100 steps,one capture)", sg_mode_name(mode));
    if (!ok) fprintf(stderr, "%s", ex);
    free(gw), free(gx), free(wv), free(xv);
    sg_release(m.w), sg_release(x);
    sg_fn_destroy(fn);
}

static sg_status break_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)user;
    double v;
    sg_status s = sg_item(in[0], &v);
    (void)c;
    if (s != SG_OK) return s;
    out[0] = sg_mul_scalar(in[0], v);
    return out[0] ? SG_OK : sg_ctx_status(c);
}

static void test_graph_break(void) {
    logbuf[0] = '\0';
    int64_t shape[1] = {1};
    sg_tensor *x = sg_full(ctx, SG_F32, 1, shape, 3.0), *y;
    sg_fn *full, *loose;
    sg_compile(ctx, break_step, NULL, 1, 1,
               &(sg_compile_opts){.mode = SG_MODE_REDUCE_OVERHEAD, .fullgraph = true, .name = "full"}, &full);
    sg_compile(ctx, break_step, NULL, 1, 1,
               &(sg_compile_opts){.mode = SG_MODE_REDUCE_OVERHEAD, .name = "loose"}, &loose);
    sg_status s = sg_call(full, &x, 1, &y, 1);
    bool ok = TU_EXPECT(s == SG_ERR_GRAPH_BREAK) && TU_EXPECT(strstr(sg_last_error(ctx), "sg_item") != NULL);
    sg_clear_error(ctx);
    double v = 0;
    for (int i = 0; ok && i < 3; i++) {
        sg_mark_step_begin(ctx);
        ok = TU_EXPECT(sg_call(loose, &x, 1, &y, 1) == SG_OK) && TU_EXPECT(sg_item(y, &v) == SG_OK && v == 9.0);
    }
    ok = ok && TU_EXPECT(strstr(logbuf, "[graph_breaks]") && strstr(logbuf, "[fallbacks]")) &&
         TU_EXPECT(strstr(sg_fn_explain(loose), "runs eagerly") != NULL);
    tu_case(ok, "GRAPH_BREAK(sg_item: fullgraph fails, otherwise eager with logs)");
    sg_release(x);
    sg_fn_destroy(full), sg_fn_destroy(loose);
}

int main(void) {
    ctx = tu_ctx((sg_ctx_opts){.log = log_hook});
    tu_seed(3);
    test_chain_modes();
    test_zero_alloc();
    test_stale();
    test_feedback();
    test_guards();
    test_mutation(SG_MODE_EAGER);
    test_mutation(SG_MODE_REDUCE_OVERHEAD);
    test_graph_break();
    sg_ctx_destroy(ctx);
    return tu_finish();
}
