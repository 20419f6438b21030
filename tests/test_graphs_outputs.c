/* SPDX-License-Identifier: MIT */
/*
 * test_graphs_outputs.c -- the output rule of compiled fns: without
 * sg_mark_step_begin each call is a step for its fn (10,000 calls at flat
 * time and flat host memory; the last output_sets calls' outputs valid,
 * older ones stale with the overwriting call named), an output fed back as
 * the next input, micro-batches kept alive by output_sets inside user steps,
 * and views of an overwritten output stale like the output, in every mode.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include "testutil.h"

#include <string.h>
#include <time.h>

static char logbuf[1 << 14];

static void log_hook(void *user, const char *topic, const char *line) {
    (void)user;
    size_t n = strlen(logbuf);
    snprintf(logbuf + n, sizeof logbuf - n, "[%s] %s\n", topic, line);
}

/* y = x * 2 + 1 */
static sg_status affine_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)user;
    out[0] = sg_add_scalar(sg_mul_scalar(in[0], 2.0), 1.0);
    return out[0] ? SG_OK : sg_ctx_status(c);
}

/* out[0..n) equals 2 * xv + 1 (f64 reference, f32 tolerance). */
static bool check_affine(sg_tensor *y, const double *xv, int64_t n) {
    double *got = tu_read(y), ref[64];
    for (int64_t i = 0; i < n; i++) ref[i] = 2.0 * (double)(float)xv[i] + 1.0;
    bool ok = got && tu_close("affine", got, ref, n, tu_rtol(SG_F32), tu_atol(SG_F32));
    free(got);
    return ok;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static const sg_mode modes[] = {SG_MODE_EAGER, SG_MODE_DEFAULT, SG_MODE_REDUCE_OVERHEAD};

/* The natural loop: no sg_mark_step_begin, outputs never released. */
static void test_plain_loop(sg_mode mode) {
    sg_ctx *ctx = tu_ctx((sg_ctx_opts){0});
    sg_fn *fn;
    sg_compile(ctx, affine_step, NULL, 1, 1, &(sg_compile_opts){.mode = mode}, &fn);
    int64_t shape[1] = {16};
    double *xv;
    sg_tensor *x = tu_rand(ctx, SG_F32, 1, shape, -2, 2, &xv), *y = NULL;
    bool ok = true;
    /* The fastest of the first and of the last three blocks: a block slowed
     * by other processes on the machine says nothing about growth. */
    double t_first = 1e30, t_last = 1e30, t0 = now_s();
    size_t bytes_1k = 0, bytes_end = 0;
    int calls = 1;
    ok = TU_EXPECT(sg_call(fn, &x, 1, &y, 1) == SG_OK); /* the capture, not timed */
    for (int block = 0; ok && block < 10; block++) {
        double tb = now_s();
        for (int i = 0; ok && i < 1000; i++, calls++)
            ok = TU_EXPECT(sg_call(fn, &x, 1, &y, 1) == SG_OK);
        double dt = now_s() - tb;
        if (block == 0) sg_ctx_host_bytes(ctx, &bytes_1k, NULL);
        if (block < 3 && dt < t_first) t_first = dt;
        if (block >= 7 && dt < t_last) t_last = dt;
        /* Growing cost: stop rather than run for minutes. */
        if (block > 2 && dt > 50 * t_first + 0.5) ok = TU_EXPECT(!"time per 1000 calls grew");
        if (now_s() - t0 > 120) ok = TU_EXPECT(!"10,000 calls took over 2 minutes");
    }
    sg_ctx_host_bytes(ctx, &bytes_end, NULL);
    sg_fn_stats st = {0};
    sg_fn_get_stats(fn, &st);
    ok = ok && TU_EXPECT(check_affine(y, xv, 16)) && TU_EXPECT(bytes_end == bytes_1k) &&
         TU_EXPECT(t_last < 5 * t_first + 0.05) && TU_EXPECT(st.calls == 10001) &&
         TU_EXPECT(st.recycled_sets == 10001 - 2);
    tu_case(ok, "PLAIN_LOOP(mode=%s,calls=%d,first 1k %.4fs,last 1k %.4fs,host bytes %zu -> %zu)",
            sg_mode_name(mode), calls, t_first, t_last, bytes_1k, bytes_end);
    free(xv);
    sg_ctx_destroy(ctx);
}

/* Each call a step: the last two calls' outputs valid, older ones stale
 * (naming the call that overwrote them), views included. */
static void test_plain_rule(sg_mode mode) {
    sg_ctx *ctx = tu_ctx((sg_ctx_opts){0});
    sg_fn *fn;
    sg_compile(ctx, affine_step, NULL, 1, 1, &(sg_compile_opts){.mode = mode}, &fn);
    int64_t shape[1] = {8};
    double *av, *bv, *cv;
    sg_tensor *a = tu_rand(ctx, SG_F32, 1, shape, -2, 2, &av);
    sg_tensor *b = tu_rand(ctx, SG_F32, 1, shape, -2, 2, &bv);
    sg_tensor *c = tu_rand(ctx, SG_F32, 1, shape, -2, 2, &cv);
    sg_tensor *y1, *y2, *y3;
    bool ok = TU_EXPECT(sg_call(fn, &a, 1, &y1, 1) == SG_OK);
    sg_tensor *v1 = sg_slice(y1, 0, 0, 4, 1);
    sg_release(y1); /* only the view is left: it must not see later data */
    ok = ok && TU_EXPECT(sg_call(fn, &b, 1, &y2, 1) == SG_OK) &&
         TU_EXPECT(check_affine(v1, av, 4)) && TU_EXPECT(check_affine(y2, bv, 8));
    ok = ok && TU_EXPECT(sg_call(fn, &c, 1, &y3, 1) == SG_OK) &&
         TU_EXPECT(check_affine(y2, bv, 8)) && TU_EXPECT(check_affine(y3, cv, 8));
    float buf[8];
    ok = ok && TU_EXPECT(sg_read(v1, buf, 4 * sizeof(float)) == SG_ERR_STALE_OUTPUT) &&
         TU_EXPECT(strstr(sg_last_error(ctx), "call 3 of that fn") != NULL);
    sg_clear_error(ctx);
    sg_tensor *y4;
    ok = ok && TU_EXPECT(sg_call(fn, &a, 1, &y4, 1) == SG_OK) &&
         TU_EXPECT(sg_read(y2, buf, sizeof buf) == SG_ERR_STALE_OUTPUT) &&
         TU_EXPECT(strstr(sg_last_error(ctx), "call 4 of that fn") != NULL) &&
         TU_EXPECT(check_affine(y3, cv, 8)) && TU_EXPECT(check_affine(y4, av, 8));
    sg_clear_error(ctx);
    tu_case(ok, "PLAIN_RULE(mode=%s,each call a step,2 sets,released output's view stale)",
            sg_mode_name(mode));
    sg_release(v1);
    free(av), free(bv), free(cv);
    sg_ctx_destroy(ctx);
}

/* y = f(y) without steps: the set holding the input is never the one written. */
static void test_feedback(sg_mode mode) {
    sg_ctx *ctx = tu_ctx((sg_ctx_opts){0});
    sg_fn *fn, *one;
    sg_compile(ctx, affine_step, NULL, 1, 1, &(sg_compile_opts){.mode = mode}, &fn);
    sg_compile(ctx, affine_step, NULL, 1, 1, &(sg_compile_opts){.mode = mode, .output_sets = 1},
               &one);
    int64_t shape[1] = {8};
    double *xv, ref[8];
    sg_tensor *x = tu_rand(ctx, SG_F32, 1, shape, -1, 1, &xv), *y = x;
    for (int i = 0; i < 8; i++) ref[i] = (float)xv[i];
    bool ok = true;
    for (int step = 0; ok && step < 10; step++) {
        sg_tensor *in = y;
        ok = TU_EXPECT(sg_call(fn, &in, 1, &y, 1) == SG_OK);
        for (int i = 0; i < 8; i++) ref[i] = (float)(2.0 * ref[i] + 1.0);
    }
    double *got = ok ? tu_read(y) : NULL;
    ok = ok && TU_EXPECT(got && tu_close("feedback", got, ref, 8, 1e-5, 1e-5));
    free(got);
    /* One set cannot take its own input: an error that says what to do. */
    sg_tensor *z, *z2;
    ok = ok && TU_EXPECT(sg_call(one, &x, 1, &z, 1) == SG_OK) &&
         TU_EXPECT(sg_call(one, &z, 1, &z2, 1) == SG_ERR_INVALID_ARG) &&
         TU_EXPECT(strstr(sg_last_error(ctx), "output_sets") != NULL) &&
         TU_EXPECT(check_affine(z, xv, 8));
    sg_clear_error(ctx);
    tu_case(ok, "FEEDBACK(mode=%s,y=f(y) x10 without steps; output_sets=1 refuses its own input)",
            sg_mode_name(mode));
    free(xv);
    sg_ctx_destroy(ctx);
}

/* User steps: output_sets calls per step stay valid; one more recycles the
 * step's oldest (with a perf hint); a set with a live view is not reused. */
static void test_micro_batches(sg_mode mode) {
    logbuf[0] = '\0';
    sg_ctx *ctx = tu_ctx((sg_ctx_opts){.log = log_hook});
    sg_fn *fn, *one;
    sg_compile(ctx, affine_step, NULL, 1, 1, &(sg_compile_opts){.mode = mode, .output_sets = 4},
               &fn);
    sg_compile(ctx, affine_step, NULL, 1, 1, &(sg_compile_opts){.mode = mode, .output_sets = 1},
               &one);
    int64_t shape[1] = {8};
    double *xv[5];
    sg_tensor *x[5], *y[5];
    for (int k = 0; k < 5; k++) x[k] = tu_rand(ctx, SG_F32, 1, shape, -2, 2, &xv[k]);
    bool ok = true;
    for (int step = 0; ok && step < 3; step++) {
        sg_mark_step_begin(ctx);
        for (int k = 0; ok && k < 4; k++) ok = TU_EXPECT(sg_call(fn, &x[k], 1, &y[k], 1) == SG_OK);
        for (int k = 0; ok && k < 4; k++) ok = TU_EXPECT(check_affine(y[k], xv[k], 8));
    }
    float buf[8];
    ok = ok && TU_EXPECT(sg_call(fn, &x[4], 1, &y[4], 1) == SG_OK) &&
         TU_EXPECT(sg_read(y[0], buf, sizeof buf) == SG_ERR_STALE_OUTPUT) &&
         TU_EXPECT(check_affine(y[1], xv[1], 8)) && TU_EXPECT(check_affine(y[4], xv[4], 8)) &&
         TU_EXPECT(strstr(logbuf, "[perf_hints]") && strstr(logbuf, "output_sets"));
    sg_clear_error(ctx);
    /* A released output whose view is alive: its set is not free. */
    sg_mark_step_begin(ctx);
    sg_tensor *a, *b;
    ok = ok && TU_EXPECT(sg_call(fn, &x[0], 1, &a, 1) == SG_OK);
    sg_tensor *va = sg_slice(a, 0, 2, 8, 1);
    sg_release(a);
    ok = ok && TU_EXPECT(sg_call(fn, &x[1], 1, &b, 1) == SG_OK) &&
         TU_EXPECT(check_affine(b, xv[1], 8));
    double *got = tu_read(va), ref[6];
    for (int i = 0; i < 6; i++) ref[i] = 2.0 * xv[0][i + 2] + 1.0;
    ok = ok && TU_EXPECT(got && tu_close("view", got, ref, 6, 1e-5, 1e-5));
    free(got);
    /* With one set, that view is overwritten: stale, never the new data. */
    sg_tensor *c, *d;
    ok = ok && TU_EXPECT(sg_call(one, &x[2], 1, &c, 1) == SG_OK);
    sg_tensor *vc = sg_slice(c, 0, 0, 4, 1);
    sg_release(c);
    ok = ok && TU_EXPECT(sg_call(one, &x[3], 1, &d, 1) == SG_OK) &&
         TU_EXPECT(sg_read(vc, buf, 4 * sizeof(float)) == SG_ERR_STALE_OUTPUT) &&
         TU_EXPECT(sg_neg(vc) == NULL && sg_ctx_status(ctx) == SG_ERR_STALE_OUTPUT) &&
         TU_EXPECT(check_affine(d, xv[3], 8));
    sg_clear_error(ctx);
    tu_case(ok,
            "MICRO_BATCHES(mode=%s,output_sets=4,3 steps of 4 calls, a 5th recycles; views "
            "keep a set or go stale)",
            sg_mode_name(mode));
    sg_release(va), sg_release(vc);
    for (int k = 0; k < 5; k++) free(xv[k]);
    sg_ctx_destroy(ctx);
}

/* A plain loop that releases its outputs needs one output set; one that
 * keeps them uses both. */
static void test_release_loop(void) {
    sg_ctx *ctx = tu_ctx((sg_ctx_opts){0});
    sg_fn *rel, *keep;
    sg_compile(ctx, affine_step, NULL, 1, 1, &(sg_compile_opts){.mode = SG_MODE_REDUCE_OVERHEAD},
               &rel);
    sg_compile(ctx, affine_step, NULL, 1, 1, &(sg_compile_opts){.mode = SG_MODE_REDUCE_OVERHEAD},
               &keep);
    int64_t shape[1] = {16};
    double *xv;
    sg_tensor *x = tu_rand(ctx, SG_F32, 1, shape, -2, 2, &xv), *y = NULL, *z = NULL;
    bool ok = true;
    for (int i = 0; ok && i < 10; i++) {
        ok = TU_EXPECT(sg_call(rel, &x, 1, &y, 1) == SG_OK) && TU_EXPECT(check_affine(y, xv, 16)) &&
             TU_EXPECT(sg_call(keep, &x, 1, &z, 1) == SG_OK);
        sg_release(y);
    }
    sg_memory_stats mr = {0}, mk = {0};
    sg_fn_memory_stats(rel, &mr);
    sg_fn_memory_stats(keep, &mk);
    ok = ok && TU_EXPECT(mr.output_bytes > 0) && TU_EXPECT(mk.output_bytes == 2 * mr.output_bytes);
    tu_case(ok, "RELEASE_LOOP(released outputs: one set, %zu bytes; kept: %zu bytes)",
            mr.output_bytes, mk.output_bytes);
    free(xv);
    sg_ctx_destroy(ctx);
}

static void test_bad_sets(void) {
    sg_ctx *ctx = tu_ctx((sg_ctx_opts){0});
    sg_fn *fn = NULL;
    bool ok =
        TU_EXPECT(sg_compile(ctx, affine_step, NULL, 1, 1, &(sg_compile_opts){.output_sets = 65},
                             &fn) == SG_ERR_INVALID_ARG) &&
        TU_EXPECT(strstr(sg_last_error(ctx), "output_sets 65") != NULL) && TU_EXPECT(!fn);
    tu_case(ok, "BAD_OUTPUT_SETS(65 is out of [0, 64])");
    sg_ctx_destroy(ctx);
}

int main(void) {
    tu_seed(11);
    for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
        test_plain_loop(modes[m]);
        test_plain_rule(modes[m]);
        test_feedback(modes[m]);
        test_micro_batches(modes[m]);
    }
    test_release_loop();
    test_bad_sets();
    return tu_finish();
}
