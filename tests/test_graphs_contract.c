/* SPDX-License-Identifier: MIT */
/*
 * test_graphs_contract.c -- what sg_compile promises beyond results:
 * zeroed or NULL opts capture (SG_MODE_DEFAULT); each fallback kind (a
 * compile failure, a graph break, the cache limit) is an error with its
 * reason under strict and otherwise SG_OK with one "fallbacks" line (on
 * stderr when no hook is installed); the per-fn counters; stances and
 * sg_reset; scalars in sg_fn_explain's IR lines; unknown SG_LOGS topics.
 */
#define _POSIX_C_SOURCE 200809L /* setenv, mkstemp, dup2 */
#include "testutil.h"

#include "capture/capture.h"

#include <fcntl.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

static char logbuf[1 << 15];

static void log_hook(void *user, const char *topic, const char *line) {
    (void)user;
    size_t n = strlen(logbuf);
    snprintf(logbuf + n, sizeof logbuf - n, "[%s] %s\n", topic, line);
}

static int count(const char *hay, const char *needle) {
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)) != NULL; p += strlen(needle)) n++;
    return n;
}

/* Run f with stderr sent to a buffer. */
static void capture_stderr(void (*f)(void *), void *arg, char *buf, size_t size) {
    char path[] = "/tmp/sg_test_stderr_XXXXXX";
    int fd = mkstemp(path), saved = dup(2);
    fflush(stderr);
    dup2(fd, 2);
    f(arg);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    lseek(fd, 0, SEEK_SET);
    ssize_t n = read(fd, buf, size - 1);
    buf[n > 0 ? n : 0] = '\0';
    close(fd);
    unlink(path);
}

static const double scale = 0.25;

/* y = x * scale + 0.5 */
static sg_status affine_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)user;
    out[0] = sg_add_scalar(sg_mul_scalar(in[0], scale), 0.5);
    return out[0] ? SG_OK : sg_ctx_status(c);
}

static bool check_affine(sg_tensor *y, const double *xv, int64_t n) {
    double *got = tu_read(y), ref[64];
    for (int64_t i = 0; i < n; i++) ref[i] = (double)(float)xv[i] * (double)(float)scale + 0.5;
    bool ok = got && tu_close("affine", got, ref, n, tu_rtol(SG_F32), tu_atol(SG_F32));
    free(got);
    return ok;
}

/* A host read inside the step: a graph break. */
static sg_status break_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)user;
    double v;
    sg_status s = sg_item(in[0], &v);
    if (s != SG_OK) return s;
    out[0] = sg_mul_scalar(in[0], v);
    return out[0] ? SG_OK : sg_ctx_status(c);
}

/* A host read whose status the step ignores: it carries on with v as it
 * stands (-1 where the read failed) and returns SG_OK. */
static sg_status carry_on_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)c, (void)user;
    sg_tensor *y = sg_add_scalar(in[0], 1.0);
    double v = -1.0;
    sg_item(sg_sum(y, 0, NULL, false), &v);
    out[0] = sg_mul_scalar(y, v);
    return SG_OK;
}

/*
 * A step that carries on past a graph break: without fullgraph every mode
 * gives y * sum(y) (the step runs again eagerly: nothing runs on the
 * capture's tensors, which have no bytes); with fullgraph the call fails
 * with SG_ERR_GRAPH_BREAK naming the read, whatever the step returned.
 */
static void test_carry_on(void) {
    sg_ctx *ctx = tu_ctx((sg_ctx_opts){0});
    int64_t shape[1] = {5};
    double *xv;
    sg_tensor *x = tu_rand(ctx, SG_F32, 1, shape, -2, 2, &xv), *y = NULL;
    double sum = 0, ref[5];
    for (int i = 0; i < 5; i++) sum += xv[i] + 1.0;
    for (int i = 0; i < 5; i++) ref[i] = (xv[i] + 1.0) * sum;
    sg_mode modes[3] = {SG_MODE_DEFAULT, SG_MODE_REDUCE_OVERHEAD, SG_MODE_MAX_AUTOTUNE};
    for (int mi = 0; mi < 3; mi++)
        for (int full = 0; full < 2; full++) {
            sg_fn *fn;
            sg_compile_opts o = {.mode = modes[mi], .fullgraph = full};
            bool ok = TU_EXPECT(sg_compile(ctx, carry_on_step, NULL, 1, 1, &o, &fn) == SG_OK);
            for (int call = 0; ok && call < 2; call++) {
                sg_status st = sg_call(fn, &x, 1, &y, 1);
                if (full) {
                    ok = TU_EXPECT(st == SG_ERR_GRAPH_BREAK) &&
                         TU_EXPECT(strstr(sg_last_error(ctx), "sg_item") != NULL &&
                                   strstr(sg_last_error(ctx), "fullgraph") != NULL);
                    sg_clear_error(ctx);
                    continue;
                }
                double *got = st == SG_OK ? tu_read(y) : NULL;
                ok = TU_EXPECT(st == SG_OK) && got &&
                     tu_close("y * sum(y)", got, ref, 5, tu_rtol(SG_F32), tu_atol(SG_F32));
                free(got);
            }
            tu_case(ok, "CARRY_ON(mode=%s,fullgraph=%d: the step ignores sg_item's break) -> %s",
                    sg_mode_name(modes[mi]), full, full ? "SG_ERR_GRAPH_BREAK" : "y * sum(y)");
            sg_fn_destroy(fn);
        }
    free(xv);
    sg_ctx_destroy(ctx);
}

/* An op that fails inside the step: its own message reaches sg_last_error,
 * on the first call and on a second one with the first's status still set. */
static sg_status bad_op_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)user;
    out[0] = sg_add(in[0], in[0]); /* bool: sg_add takes numbers */
    return *(int *)user ? sg_ctx_status(c) : SG_OK;
}

static void test_op_messages(void) {
    sg_ctx *ctx = tu_ctx((sg_ctx_opts){0});
    sg_tensor *b = sg_full(ctx, SG_BOOL, 1, (int64_t[1]){4}, 1.0), *y = NULL;
    sg_mode modes[2] = {SG_MODE_EAGER, SG_MODE_DEFAULT};
    for (int mi = 0; mi < 2; mi++)
        for (int ret = 0; ret < 2; ret++) {
            sg_fn *fn;
            sg_compile_opts o = {.mode = modes[mi]};
            bool ok = TU_EXPECT(sg_compile(ctx, bad_op_step, &ret, 1, 1, &o, &fn) == SG_OK);
            for (int call = 0; ok && call < 2; call++) { /* the second with the status still set */
                sg_status st = sg_call(fn, &b, 1, &y, 1);
                const char *m = sg_last_error(ctx);
                ok = TU_EXPECT(st == SG_ERR_DTYPE) && TU_EXPECT(strstr(m, "sg_add: got bool[4]")) &&
                     TU_EXPECT(strstr(m, "the step returned SG_ERR") == NULL);
                if (!ok) fprintf(stderr, "  call %d: \"%s\"\n", call, m);
            }
            sg_clear_error(ctx);
            tu_case(ok, "OP_MESSAGE(mode=%s,step returns %s) -> sg_add's own message",
                    sg_mode_name(modes[mi]), ret ? "the status" : "SG_OK with a NULL output");
            sg_fn_destroy(fn);
        }
    sg_ctx_destroy(ctx);
}

/* After sg_fn_destroy: its output handle names the fn's end, and the
 * inspection calls say the fn was destroyed, as sg_call does. */
static void test_after_destroy(void) {
    sg_ctx *ctx = tu_ctx((sg_ctx_opts){0});
    int64_t shape[1] = {4};
    double *xv;
    sg_tensor *x = tu_rand(ctx, SG_F32, 1, shape, -1, 1, &xv), *y = NULL;
    sg_fn *fn;
    bool ok = TU_EXPECT(sg_compile(ctx, affine_step, NULL, 1, 1, NULL, &fn) == SG_OK) &&
              TU_EXPECT(sg_call(fn, &x, 1, &y, 1) == SG_OK);
    sg_fn_destroy(fn);
    float got[4];
    ok = ok && TU_EXPECT(sg_read(y, got, sizeof got) == SG_ERR_RELEASED) &&
         TU_EXPECT(strstr(sg_last_error(ctx), "sg_fn_destroy") != NULL);
    sg_clear_error(ctx);
    sg_status sd = sg_fn_write_dot(fn, "/tmp/sg_contract_never.dot", NULL);
    ok = ok && TU_EXPECT(sd == SG_ERR_RELEASED) &&
         TU_EXPECT(strstr(sg_last_error(ctx), "sg_fn_write_dot: the fn was destroyed") != NULL);
    sg_clear_error(ctx);
    sg_status st = sg_fn_trace(fn, &x, 1, "/tmp/sg_contract_never.json", 1);
    ok = ok && TU_EXPECT(st == SG_ERR_RELEASED) &&
         TU_EXPECT(strstr(sg_last_error(ctx), "sg_fn_trace: the fn was destroyed") != NULL);
    sg_clear_error(ctx);
    tu_case(ok, "AFTER_DESTROY(an output handle, sg_fn_write_dot, sg_fn_trace) -> SG_ERR_RELEASED, "
                "naming sg_fn_destroy");
    free(xv);
    sg_ctx_destroy(ctx);
}

static void test_defaults(void) {
    sg_ctx *ctx = tu_ctx((sg_ctx_opts){0});
    int64_t shape[1] = {8};
    double *xv;
    sg_tensor *x = tu_rand(ctx, SG_F32, 1, shape, -2, 2, &xv), *y;
    for (int variant = 0; variant < 2; variant++) {
        sg_fn *fn;
        sg_compile_opts zero;
        memset(&zero, 0, sizeof zero);
        bool ok = TU_EXPECT(sg_compile(ctx, affine_step, NULL, 1, 1, variant ? NULL : &zero, &fn) ==
                            SG_OK) &&
                  TU_EXPECT(sg_call(fn, &x, 1, &y, 1) == SG_OK) &&
                  TU_EXPECT(check_affine(y, xv, 8)) &&
                  TU_EXPECT(sg_call(fn, &x, 1, &y, 1) == SG_OK);
        sg_fn_stats st = {0};
        sg_fn_get_stats(fn, &st);
        const char *ex = sg_fn_explain(fn);
        ok = ok && TU_EXPECT(st.captures == 1) && TU_EXPECT(st.replays == 2) &&
             TU_EXPECT(st.fallbacks == 0) && TU_EXPECT(strstr(ex, "mode default") != NULL) &&
             TU_EXPECT(strstr(ex, "capture 1") != NULL);
        tu_case(ok, "DEFAULTS(opts=%s: mode default, captured once, replayed)",
                variant ? "NULL" : "zeroed");
        sg_fn_destroy(fn);
    }
    sg_fn *full;
    sg_compile(ctx, break_step, NULL, 1, 1, &(sg_compile_opts){.fullgraph = true}, &full);
    sg_tensor *one = sg_full(ctx, SG_F32, 1, (int64_t[1]){1}, 3.0);
    bool ok = TU_EXPECT(sg_call(full, &one, 1, &y, 1) == SG_ERR_GRAPH_BREAK) &&
              TU_EXPECT(strstr(sg_last_error(ctx), "sg_item") != NULL);
    sg_clear_error(ctx);
    tu_case(ok, "DEFAULTS(opts={.fullgraph=true} alone: a graph break is an error)");
    sg_fn_destroy(full);
    free(xv);
    sg_ctx_destroy(ctx);
}

typedef enum { FB_COMPILE, FB_BREAK, FB_LIMIT } fallback_kind;
static const char *const fb_names[] = {"compile", "graph_break", "cache_limit"};

/* One fallback of a kind, strict or not: (status, message) and the log. */
static void test_fallback(fallback_kind kind, bool strict) {
    logbuf[0] = '\0';
    sg_ctx *ctx = tu_ctx((sg_ctx_opts){.log = log_hook});
    int64_t s1[1] = {8}, s2[1] = {4};
    double *xv, *zv;
    sg_tensor *x = tu_rand(ctx, SG_F32, 1, s1, -2, 2, &xv),
              *z = tu_rand(ctx, SG_F32, 1, s2, -2, 2, &zv);
    sg_tensor *y = NULL;
    if (kind == FB_BREAK) { /* sg_item needs one element */
        sg_release(x);
        x = sg_full(ctx, SG_F32, 1, (int64_t[1]){1}, 3.0);
    }
    sg_compile_opts o = {.strict = strict, .cache_size_limit = kind == FB_LIMIT ? 1 : 0};
    if (kind == FB_COMPILE) {
        setenv("SG_CC", "/nonexistent/cc", 1);
        setenv("SG_ALWAYS_COMPILE", "1", 1);
    }
    sg_fn *fn;
    sg_compile(ctx, kind == FB_BREAK ? break_step : affine_step, NULL, 1, 1, &o, &fn);
    sg_status s = sg_call(fn, &x, 1, &y, 1);
    if (kind == FB_LIMIT && s == SG_OK) s = sg_call(fn, &z, 1, &y, 1);
    unsetenv("SG_CC");
    unsetenv("SG_ALWAYS_COMPILE");
    const char *reason = kind == FB_COMPILE ? "/nonexistent/cc"
                         : kind == FB_BREAK ? "sg_item"
                                            : "cache_size_limit (1)";
    sg_status want = kind == FB_COMPILE ? SG_ERR_COMPILE
                     : kind == FB_BREAK ? SG_ERR_GRAPH_BREAK
                                        : SG_ERR_UNSUPPORTED;
    bool ok;
    if (strict) {
        ok = TU_EXPECT(s == want) && TU_EXPECT(strstr(sg_last_error(ctx), reason) != NULL) &&
             TU_EXPECT(strstr(sg_last_error(ctx), "strict") != NULL);
        sg_clear_error(ctx);
    } else {
        double v = 0;
        ok = TU_EXPECT(s == SG_OK) && TU_EXPECT(count(logbuf, "[fallbacks]") == 1) &&
             TU_EXPECT(strstr(logbuf, reason) != NULL);
        if (kind == FB_LIMIT) ok = ok && TU_EXPECT(check_affine(y, zv, 4));
        if (kind == FB_COMPILE) ok = ok && TU_EXPECT(check_affine(y, xv, 8));
        /* A graph break on a call that works is no error: logged under graph_breaks only. */
        if (kind == FB_BREAK)
            ok = ok && TU_EXPECT(sg_item(y, &v) == SG_OK && v == 9.0) &&
                 TU_EXPECT(strstr(logbuf, "[graph_breaks]") != NULL) &&
                 TU_EXPECT(strstr(logbuf, "[error]") == NULL);
        /* Later calls say nothing more. */
        ok = ok && TU_EXPECT(sg_call(fn, kind == FB_LIMIT ? &z : &x, 1, &y, 1) == SG_OK) &&
             TU_EXPECT(count(logbuf, "[fallbacks]") == 1);
    }
    tu_case(ok, "FALLBACK(kind=%s,strict=%d)", fb_names[kind], strict);
    if (!ok) fprintf(stderr, "%s\n%s\n", logbuf, sg_last_error(ctx));
    sg_fn_destroy(fn);
    free(xv), free(zv);
    sg_ctx_destroy(ctx);
}

static void limit_without_hook(void *arg) {
    (void)arg;
    unsetenv("SG_LOGS");
    sg_ctx *ctx = tu_ctx((sg_ctx_opts){0});
    int64_t s1[1] = {8}, s2[1] = {4};
    sg_tensor *x = sg_zeros(ctx, SG_F32, 1, s1), *z = sg_zeros(ctx, SG_F32, 1, s2), *y;
    sg_fn *fn;
    sg_compile(ctx, affine_step, NULL, 1, 1, &(sg_compile_opts){.cache_size_limit = 1}, &fn);
    for (int i = 0; i < 3; i++) sg_call(fn, &x, 1, &y, 1), sg_call(fn, &z, 1, &y, 1);
    sg_ctx_destroy(ctx);
}

static void test_fallback_stderr(void) {
    char out[4096];
    capture_stderr(limit_without_hook, NULL, out, sizeof out);
    bool ok = TU_EXPECT(count(out, "[stepgraph fallbacks]") == 1) &&
              TU_EXPECT(strstr(out, "cache_size_limit (1)") != NULL);
    tu_case(ok, "FALLBACK_STDERR(no hook, no SG_LOGS: said once on stderr)");
    if (!ok) fprintf(stderr, "stderr was: %s\n", out);
}

static void test_counters_and_stances(void) {
    sg_ctx *ctx = tu_ctx((sg_ctx_opts){0});
    int64_t s1[1] = {8}, s2[1] = {4};
    double *xv, *zv;
    sg_tensor *x = tu_rand(ctx, SG_F32, 1, s1, -2, 2, &xv),
              *z = tu_rand(ctx, SG_F32, 1, s2, -2, 2, &zv);
    sg_tensor *x2 = sg_clone(x), *y;
    sg_fn *fn;
    sg_compile(ctx, affine_step, NULL, 1, 1, &(sg_compile_opts){.mode = SG_MODE_REDUCE_OVERHEAD},
               &fn);
    bool ok = true;
    for (int i = 0; i < 3; i++) ok = ok && TU_EXPECT(sg_call(fn, &x, 1, &y, 1) == SG_OK);
    ok = ok && TU_EXPECT(sg_call(fn, &x2, 1, &y, 1) == SG_OK) && TU_EXPECT(check_affine(y, xv, 8));
    sg_fn_stats st = {0};
    sg_fn_get_stats(fn, &st);
    ok = ok && TU_EXPECT(st.calls == 4 && st.captures == 1 && st.compiles == 1) &&
         TU_EXPECT(st.cache_hits == 3 && st.replays == 4 && st.fallbacks == 0) &&
         TU_EXPECT(st.patched_pointers == 1) && TU_EXPECT(st.recycled_sets == 2);
    tu_case(ok, "COUNTERS(4 calls, one new address: captures 1, hits 3, replays 4, patched 1)");

    /* FAIL_ON_RECOMPILE: a known signature replays, a new one fails. */
    ok = TU_EXPECT(sg_fn_set_stance(fn, SG_STANCE_FAIL_ON_RECOMPILE) == SG_OK) &&
         TU_EXPECT(sg_call(fn, &x, 1, &y, 1) == SG_OK) &&
         TU_EXPECT(sg_call(fn, &z, 1, &y, 1) == SG_ERR_UNSUPPORTED) &&
         TU_EXPECT(strstr(sg_last_error(ctx), "input 0 shape [4]") != NULL);
    sg_clear_error(ctx);
    /* EAGER_ON_RECOMPILE: the new signature runs eagerly, right. */
    sg_fn_get_stats(fn, &st);
    ok = ok && TU_EXPECT(sg_fn_set_stance(fn, SG_STANCE_EAGER_ON_RECOMPILE) == SG_OK) &&
         TU_EXPECT(sg_call(fn, &z, 1, &y, 1) == SG_OK) && TU_EXPECT(check_affine(y, zv, 4));
    sg_fn_stats st2 = {0};
    sg_fn_get_stats(fn, &st2);
    ok = ok && TU_EXPECT(st2.captures == st.captures && st2.fallbacks == st.fallbacks + 1);
    /* FORCE_EAGER: even the known signature runs eagerly. */
    ok = ok && TU_EXPECT(sg_fn_set_stance(fn, SG_STANCE_FORCE_EAGER) == SG_OK) &&
         TU_EXPECT(sg_call(fn, &x, 1, &y, 1) == SG_OK) && TU_EXPECT(check_affine(y, xv, 8));
    sg_fn_get_stats(fn, &st);
    ok = ok && TU_EXPECT(st.fallbacks == st2.fallbacks + 1 && st.replays == st2.replays) &&
         TU_EXPECT(strstr(sg_fn_explain(fn), "stance force_eager") != NULL);
    ok = ok && TU_EXPECT(sg_fn_set_stance(fn, (sg_stance)9) == SG_ERR_INVALID_ARG);
    sg_clear_error(ctx);
    tu_case(ok, "STANCES(fail_on_recompile, eager_on_recompile, force_eager)");

    /* sg_reset: every fn captures again. */
    sg_fn *other;
    sg_compile(ctx, affine_step, NULL, 1, 1, NULL, &other);
    sg_fn_set_stance(fn, SG_STANCE_DEFAULT);
    ok = TU_EXPECT(sg_call(other, &x, 1, &y, 1) == SG_OK) && TU_EXPECT(sg_reset(ctx) == SG_OK) &&
         TU_EXPECT(sg_call(other, &x, 1, &y, 1) == SG_OK) && TU_EXPECT(check_affine(y, xv, 8)) &&
         TU_EXPECT(sg_call(fn, &x, 1, &y, 1) == SG_OK) && TU_EXPECT(check_affine(y, xv, 8));
    sg_fn_stats so = {0};
    sg_fn_get_stats(other, &so);
    sg_fn_get_stats(fn, &st2);
    ok = ok && TU_EXPECT(so.captures == 2) && TU_EXPECT(st2.captures == st.captures + 1);
    tu_case(ok, "RESET(sg_reset drops every capture of every fn)");
    sg_fn_destroy(fn), sg_fn_destroy(other);
    free(xv), free(zv);
    sg_ctx_destroy(ctx);
}

static void test_explain_scalars(void) {
    sg_ctx *ctx = tu_ctx((sg_ctx_opts){0});
    int64_t s1[1] = {8};
    sg_tensor *x = sg_zeros(ctx, SG_F32, 1, s1), *y;
    sg_fn *fn;
    sg_compile(ctx, affine_step, NULL, 1, 1, NULL, &fn);
    sg_call(fn, &x, 1, &y, 1);
    char want[64];
    snprintf(want, sizeof want, "mul_scalar(in0:f32[8], %.9g)", scale);
    const char *ex = sg_fn_explain(fn);
    bool ok = TU_EXPECT(strstr(ex, want) != NULL) &&
              TU_EXPECT(strstr(ex, "add_scalar(b1:f32[8], 0.5)") != NULL);
    tu_case(ok, "EXPLAIN_SCALARS(%s and add_scalar(b1:f32[8], 0.5) in the IR lines)", want);
    if (!ok) fprintf(stderr, "%s\n", ex);
    sg_fn_destroy(fn);
    sg_ctx_destroy(ctx);
}

static void ctx_with_bad_topic(void *arg) {
    (void)arg;
    setenv("SG_LOGS", "recompiles,bogus_topic", 1);
    sg_ctx *a = tu_ctx((sg_ctx_opts){0}), *b = tu_ctx((sg_ctx_opts){0});
    unsetenv("SG_LOGS");
    sg_ctx_destroy(a), sg_ctx_destroy(b);
}

static void test_unknown_topic(void) {
    char out[4096];
    capture_stderr(ctx_with_bad_topic, NULL, out, sizeof out);
    bool ok = TU_EXPECT(count(out, "unknown topic 'bogus_topic'") == 1) &&
              TU_EXPECT(strstr(out, "graph_breaks") != NULL);
    tu_case(ok, "SG_LOGS(an unknown topic is said once, naming the known ones)");
}

/* SG_LOGS's words apart by ',', '+' or ' ', "all" anywhere among them: the
 * topics a fresh context logs (capture.h's log_topics, bit per topic in
 * the order error, graph_breaks, recompiles, guards, perf_hints,
 * output_code, fallbacks). */
static void test_topic_lists(void) {
    const struct {
        const char *env;
        uint32_t bits;
    } c[] = {{"perf_hints+output_code", 0x30},
             {"output_code+perf_hints", 0x30},
             {"all,perf_hints", ~0u},
             {"all+error", ~0u},
             {"recompiles guards", 0xc},
             {",,error,", 0x1},
             {"", 0}};
    for (size_t k = 0; k < sizeof c / sizeof c[0]; k++) {
        setenv("SG_LOGS", c[k].env, 1);
        sg_ctx *a = tu_ctx((sg_ctx_opts){0});
        unsetenv("SG_LOGS");
        tu_case(TU_EXPECT(a->log_topics == c[k].bits), "SG_LOGS(\"%s\") -> topics 0x%x", c[k].env,
                a->log_topics);
        sg_ctx_destroy(a);
    }
}

/* A failed call changes nothing: a step that adds 1 to its input in place,
 * refused because its only output set holds that input (eager and
 * compiled), or failing at a graph break under fullgraph when captures run
 * as they record (SG_DRY_CAPTURE=0: fullgraph captures stay dry). */
static sg_status add_one_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    bool brk = *(const bool *)user;
    sg_tensor *one = sg_full(c, SG_F32, 0, NULL, 1.0);
    sg_status s = sg_add_(in[0], one);
    sg_release(one);
    if (s != SG_OK) return s;
    double v;
    if (brk && sg_item(sg_sum(in[0], 0, NULL, false), &v) != SG_OK) return sg_ctx_status(c);
    out[0] = sg_mul_scalar(in[0], 2.0);
    return out[0] ? SG_OK : sg_ctx_status(c);
}

static void test_failed_call_unchanged(void) {
    sg_ctx *ctx = tu_ctx((sg_ctx_opts){0});
    int64_t shape[1] = {3};
    sg_mode modes[3] = {SG_MODE_EAGER, SG_MODE_DEFAULT, SG_MODE_REDUCE_OVERHEAD};
    for (int mi = 0; mi < 3; mi++) {
        bool brk = false;
        sg_fn *fn;
        sg_compile_opts o = {.mode = modes[mi], .output_sets = 1};
        sg_tensor *x = sg_zeros(ctx, SG_F32, 1, shape), *y = NULL, *z = NULL;
        bool ok = TU_EXPECT(sg_compile(ctx, add_one_step, &brk, 1, 1, &o, &fn) == SG_OK) &&
                  TU_EXPECT(sg_call(fn, &x, 1, &y, 1) == SG_OK); /* x = 1, y = 2 */
        float before[3], after[3];
        ok = ok && TU_EXPECT(sg_read(y, before, sizeof before) == SG_OK);
        sg_status st = ok ? sg_call(fn, &y, 1, &z, 1) : SG_OK; /* y is the only set's */
        ok = ok && TU_EXPECT(st == SG_ERR_INVALID_ARG) &&
             TU_EXPECT(strstr(sg_last_error(ctx), "output sets holds an input") != NULL) &&
             TU_EXPECT(sg_read(y, after, sizeof after) == SG_OK) &&
             TU_EXPECT(memcmp(before, after, sizeof before) == 0 && after[0] == 2.0f);
        tu_case(ok,
                "FAILED_CALL_UNCHANGED(mode=%s,output_sets=1,y=f(y)) -> SG_ERR_INVALID_ARG, y "
                "as it was",
                sg_mode_name(modes[mi]));
        sg_clear_error(ctx);
        sg_fn_destroy(fn);
        sg_release(x);
    }
    setenv("SG_DRY_CAPTURE", "0", 1);
    for (int mi = 1; mi < 3; mi++) {
        bool brk = true;
        sg_fn *fn;
        sg_compile_opts o = {.mode = modes[mi], .fullgraph = true};
        sg_tensor *x = sg_zeros(ctx, SG_F32, 1, shape), *y = NULL;
        bool ok = TU_EXPECT(sg_compile(ctx, add_one_step, &brk, 1, 1, &o, &fn) == SG_OK);
        for (int call = 0; ok && call < 2; call++) {
            ok = TU_EXPECT(sg_call(fn, &x, 1, &y, 1) == SG_ERR_GRAPH_BREAK);
            sg_clear_error(ctx);
        }
        float got[3] = {-1, -1, -1};
        ok = ok && TU_EXPECT(sg_read(x, got, sizeof got) == SG_OK) &&
             TU_EXPECT(got[0] == 0.0f && got[1] == 0.0f && got[2] == 0.0f);
        tu_case(ok,
                "FAILED_CALL_UNCHANGED(mode=%s,fullgraph,SG_DRY_CAPTURE=0,graph break after "
                "an in-place add) -> x as it was",
                sg_mode_name(modes[mi]));
        sg_fn_destroy(fn);
        sg_release(x);
    }
    unsetenv("SG_DRY_CAPTURE");
    sg_ctx_destroy(ctx);
}

/* In-place ops on a stale output say SG_ERR_STALE_OUTPUT, as sg_read does. */
static void test_stale_inplace(void) {
    sg_ctx *ctx = tu_ctx((sg_ctx_opts){0});
    int64_t shape[1] = {4};
    double *xv;
    sg_tensor *x = tu_rand(ctx, SG_F32, 1, shape, -1, 1, &xv), *y[3] = {NULL};
    sg_fn *fn;
    sg_compile_opts o = {.mode = SG_MODE_REDUCE_OVERHEAD, .output_sets = 1};
    bool ok = TU_EXPECT(sg_compile(ctx, affine_step, NULL, 1, 1, &o, &fn) == SG_OK) &&
              TU_EXPECT(sg_call(fn, &x, 1, &y[0], 1) == SG_OK) &&
              TU_EXPECT(sg_call(fn, &x, 1, &y[1], 1) == SG_OK); /* y[0] is stale now */
    sg_tensor *v = ok ? sg_narrow(y[1], 0, 0, 2) : NULL;
    ok = ok && TU_EXPECT(v != NULL) && TU_EXPECT(sg_call(fn, &x, 1, &y[2], 1) == SG_OK);
    sg_status got[5] = {0};
    if (ok) {
        got[0] = sg_fill_(y[0], 1.0);
        got[1] = sg_copy_(y[0], x);
        got[2] = sg_add_(y[0], x);
        got[3] = sg_fill_(v, 2.0); /* a view of a stale output */
        got[4] = sg_index_copy_(y[0], 0, sg_zeros(ctx, SG_I64, 1, (int64_t[1]){1}),
                                sg_zeros(ctx, SG_F32, 1, (int64_t[1]){1}));
    }
    for (int k = 0; ok && k < 5; k++) ok = TU_EXPECT(got[k] == SG_ERR_STALE_OUTPUT);
    ok = ok && TU_EXPECT(strstr(sg_last_error(ctx), "is an output of a compiled step") != NULL);
    tu_case(ok, "STALE_INPLACE(sg_fill_, sg_copy_, sg_add_, a view, sg_index_copy_) -> "
                "SG_ERR_STALE_OUTPUT");
    sg_clear_error(ctx);
    sg_release(v);
    sg_fn_destroy(fn);
    free(xv);
    sg_ctx_destroy(ctx);
}

/* A parameter passed as an input too (a view of it): the capture made with
 * one kind of call does not replay for the other. Steps: out = P + in0
 * (read), and in0 = P^T then out = in0 (in place). */
static sg_tensor *alias_param;

static sg_status param_read_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)user;
    out[0] = sg_add(alias_param, in[0]);
    return out[0] ? SG_OK : sg_ctx_status(c);
}

static sg_status param_copy_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)user;
    sg_tensor *t = sg_transpose(alias_param, 0, 1);
    sg_status s = t ? sg_copy_(in[0], t) : sg_ctx_status(c);
    sg_release(t);
    out[0] = s == SG_OK ? sg_add_scalar(in[0], 0.0) : NULL;
    return out[0] ? SG_OK : sg_ctx_status(c);
}

static void test_param_as_input(void) {
    sg_ctx *ctx = tu_ctx((sg_ctx_opts){0});
    int64_t sh[2] = {4, 4};
    float pv[16], tv[16];
    for (int i = 0; i < 16; i++) pv[i] = (float)(i * i % 7) - 2.5f;
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) tv[i * 4 + j] = pv[j * 4 + i];
    sg_mode modes[2] = {SG_MODE_DEFAULT, SG_MODE_REDUCE_OVERHEAD};
    for (int mi = 0; mi < 2; mi++)
        for (int copy = 0; copy < 2; copy++)
            for (int first = 0; first < 2; first++) { /* 0: a distinct input first */
                alias_param = sg_from_host(ctx, SG_F32, 2, sh, pv);
                sg_tensor *other = sg_full(ctx, SG_F32, 2, sh, 1.0);
                sg_tensor *view = sg_reshape(alias_param, 2, sh), *y = NULL;
                sg_fn *fn;
                sg_compile_opts o = {.mode = modes[mi]};
                bool ok = TU_EXPECT(view && view != alias_param) &&
                          TU_EXPECT(sg_compile(ctx, copy ? param_copy_step : param_read_step, NULL,
                                               1, 1, &o, &fn) == SG_OK);
                sg_tensor *prev = NULL;
                for (int call = 0; ok && call < 3; call++) {
                    bool as_param = (call == 1) != (first == 1);
                    float before[16];
                    if (prev) ok = TU_EXPECT(sg_read(prev, before, sizeof before) == SG_OK);
                    float ones[16], got[16], want[16];
                    for (int i = 0; i < 16; i++) ones[i] = 1.0f;
                    ok = TU_EXPECT(sg_write(alias_param, pv, sizeof pv) == SG_OK) &&
                         TU_EXPECT(sg_write(other, ones, sizeof ones) == SG_OK) &&
                         TU_EXPECT(sg_call(fn, as_param ? &view : &other, 1, &y, 1) == SG_OK) &&
                         TU_EXPECT(sg_read(y, got, sizeof got) == SG_OK);
                    for (int i = 0; i < 16; i++)
                        want[i] = copy ? tv[i] : pv[i] + (as_param ? pv[i] : 1.0f);
                    for (int i = 0; ok && i < 16; i++) ok = TU_EXPECT(got[i] == want[i]);
                    /* the call before's outputs stay (2 sets), whichever capture ran */
                    float after[16];
                    if (ok && prev)
                        ok = TU_EXPECT(sg_read(prev, after, sizeof after) == SG_OK) &&
                             TU_EXPECT(memcmp(before, after, sizeof after) == 0);
                    sg_release(prev);
                    prev = y, y = NULL;
                }
                sg_release(prev);
                sg_fn_stats stats = {0};
                ok = ok && TU_EXPECT(sg_fn_get_stats(fn, &stats) == SG_OK) &&
                     TU_EXPECT(stats.captures == 2); /* the third call replays the first's */
                tu_case(ok, "PARAM_AS_INPUT(mode=%s,step=%s,calls=%s) -> as eagerly",
                        sg_mode_name(modes[mi]), copy ? "in0 = P^T" : "P + in0",
                        first ? "view of P, distinct, view of P" : "distinct, view of P, distinct");
                sg_fn_destroy(fn);
                sg_release(view), sg_release(other), sg_release(alias_param);
            }
    sg_ctx_destroy(ctx);
}

/* A capture dropped for good by a guard (its parameter stopped requiring
 * grad) leaves the outputs it handed out valid, with their values; the
 * call after sees the parameter's new state. */
static void test_keep_after_drop(void) {
    sg_ctx *ctx = tu_ctx((sg_ctx_opts){0});
    int64_t sh[1] = {4};
    float pv[4] = {1, -2, 3, 0.5f}, xv[4] = {2, 2, -1, 4};
    sg_mode modes[2] = {SG_MODE_DEFAULT, SG_MODE_REDUCE_OVERHEAD};
    for (int mi = 0; mi < 2; mi++) {
        alias_param = sg_from_host(ctx, SG_F32, 1, sh, pv);
        sg_tensor *x = sg_from_host(ctx, SG_F32, 1, sh, xv), *y0 = NULL, *y1 = NULL;
        sg_fn *fn;
        sg_compile_opts o = {.mode = modes[mi]};
        bool ok = TU_EXPECT(sg_requires_grad_(alias_param, true) == SG_OK) &&
                  TU_EXPECT(sg_compile(ctx, param_read_step, NULL, 1, 1, &o, &fn) == SG_OK) &&
                  TU_EXPECT(sg_call(fn, &x, 1, &y0, 1) == SG_OK) &&
                  TU_EXPECT(sg_requires_grad_(alias_param, false) == SG_OK) &&
                  TU_EXPECT(sg_call(fn, &x, 1, &y1, 1) == SG_OK);
        float a[4] = {0}, b[4] = {0};
        ok = ok && TU_EXPECT(sg_read(y0, a, sizeof a) == SG_OK) &&
             TU_EXPECT(sg_read(y1, b, sizeof b) == SG_OK);
        for (int i = 0; ok && i < 4; i++) ok = TU_EXPECT(a[i] == pv[i] + xv[i] && b[i] == a[i]);
        tu_case(ok,
                "KEEP_AFTER_DROP(mode=%s,a parameter stops requiring grad between calls) -> "
                "the first call's output still reads",
                sg_mode_name(modes[mi]));
        sg_clear_error(ctx);
        sg_fn_destroy(fn);
        sg_release(x), sg_release(alias_param);
    }
    sg_ctx_destroy(ctx);
}

/* Options and arguments out of their domain are refused by name. */
static void test_out_of_domain(void) {
    sg_ctx *c = NULL;
    sg_status st = sg_ctx_create(&(sg_ctx_opts){.backend = SG_BACKEND_CPU, .num_threads = -5}, &c);
    bool ok = TU_EXPECT(st == SG_ERR_INVALID_ARG) && TU_EXPECT(c == NULL) &&
              TU_EXPECT(strstr(sg_last_error(NULL), "num_threads -5") != NULL);
    sg_ctx *ctx = tu_ctx((sg_ctx_opts){0});
    sg_fn *fn = NULL;
    ok = ok &&
         TU_EXPECT(sg_compile(ctx, affine_step, NULL, 1, 1, &(sg_compile_opts){.dynamic = 7},
                              &fn) == SG_ERR_INVALID_ARG) &&
         TU_EXPECT(strstr(sg_last_error(ctx), "dynamic 7") != NULL) &&
         TU_EXPECT(sg_compile(ctx, affine_step, NULL, 1, 1,
                              &(sg_compile_opts){.cache_size_limit = 2147483647},
                              &fn) == SG_ERR_INVALID_ARG) &&
         TU_EXPECT(fn == NULL) &&
         TU_EXPECT(strstr(sg_last_error(ctx), "cache_size_limit 2147483647 is not in") != NULL);
    sg_clear_error(ctx);
    sg_tensor *x = sg_zeros(ctx, SG_F32, 1, (int64_t[1]){4});
    ok = ok && TU_EXPECT(!sg_clamp(x, NAN, 2.5)) && TU_EXPECT(!sg_clamp(x, 0, NAN)) &&
         TU_EXPECT(sg_ctx_status(ctx) == SG_ERR_INVALID_ARG) &&
         TU_EXPECT(strstr(sg_last_error(ctx), "NaN or beside a NaN") != NULL);
    sg_clear_error(ctx);
    /* sizes whose strides pass 64 bits, behind a 0 size */
    int64_t big = (int64_t)1 << 62;
    ok = ok && TU_EXPECT(!sg_zeros(ctx, SG_F32, 3, (int64_t[3]){0, big, big})) &&
         TU_EXPECT(sg_ctx_status(ctx) == SG_ERR_OOM) &&
         TU_EXPECT(strstr(sg_last_error(ctx), "too large to address") != NULL);
    sg_clear_error(ctx);
    tu_case(ok, "OUT_OF_DOMAIN(num_threads -5, dynamic 7, cache_size_limit INT_MAX, clamp with "
                "NaN, zeros [0,2^62,2^62]) -> refused, named");
    sg_release(x);
    sg_ctx_destroy(ctx);
}

int main(void) {
    tu_seed(5);
    test_out_of_domain();
    test_keep_after_drop();
    test_param_as_input();
    test_failed_call_unchanged();
    test_stale_inplace();
    test_defaults();
    test_carry_on();
    test_op_messages();
    test_after_destroy();
    for (int k = FB_COMPILE; k <= FB_LIMIT; k++) {
        test_fallback((fallback_kind)k, true);
        test_fallback((fallback_kind)k, false);
    }
    test_fallback_stderr();
    test_counters_and_stances();
    test_explain_scalars();
    test_unknown_topic();
    test_topic_lists();
    return tu_finish();
}
