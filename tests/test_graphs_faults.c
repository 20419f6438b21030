/* SPDX-License-Identifier: MIT */
/*
 * test_graphs_faults.c -- a compiled step survives a failing host allocation
 * anywhere in its life: sg_compile, the first sg_call (capture, fusion, code
 * generation, the C compiler or the disk cache, the plan), replays, a
 * recompile for a second input shape, and sg_fn_destroy.
 *
 * The step: y = tanh(x @ W + b) * 0.5 + 0.25 (a matmul, pointwise ops with a
 * broadcast), s = sum(y, dim 0) (a reduction), p += s / 8 and q += b / 2
 * (in-place parameter updates), z = softmax(x @ W + b, dim 1) (a row op);
 * outputs y, s and z. Its life: compile; call with x of
 * shape A (capture), again (replay); call with shape B (recompile), again;
 * call with A (replay of the first capture); destroy. It runs once with no
 * failure to count the allocations of that life, then once for each N from
 * 1 with the N-th of them failing, until a run meets no failure. In each:
 *  - the action that met the failure returns a status other than SG_OK and
 *    sg_last_error says something; the action is then retried with no
 *    failure, and the rest of the life runs clean;
 *  - every output of a call that succeeded matches a reference computed here
 *    in f64, and so do the parameters p and q after every call (after a
 *    failed call: their values before the call, or after its updates);
 *  - after sg_fn_destroy the context holds the bytes it held before
 *    sg_compile, besides its executor's caches, and after sg_ctx_destroy
 *    the hook holds no block.
 * Modes DEFAULT, REDUCE_OVERHEAD and MAX_AUTOTUNE, strict (a
 * failure in code generation or in max-autotune's timing is the call's
 * error) and not (it is a fallback: the call succeeds op by op, or with
 * default launches).
 * Each run is one case: `FAULT(mode=default,strict=1,fail_at=17) -> call B
 * (recompile): "..."`.
 *
 * The disk cache: the same life with the N-th open, write or rename of a
 * cache file failing (an internal hook of codegen/cache_dir.c), with
 * and without SG_ALWAYS_COMPILE=1 (every capture writes an entry, or reads
 * one): under strict the call either succeeds (an entry that cannot be read
 * is rebuilt, one that cannot be published is used unkept) or fails with
 * SG_ERR_COMPILE and a message naming the file and SG_CACHE_DIR, and a clean
 * call after it gives the right numbers.
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include "testutil.h"

#include "capture/capture.h"
#include "codegen/codegen.h"

#include <math.h>
#include <string.h>

enum { K = 8, M = 6, BA = 4, BB = 3 };

static tu_alloc hook;
static sg_ctx *ctx;
static sg_tensor *W, *bias, *p, *q, *xa, *xb;
static float wv[K * M], bv[M], pv[2 * M], xav[BA * K], xbv[BB * K];
static double pref[2 * M]; /* p and q as the reference has them */

static sg_status step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)user;
    int d0 = 0;
    sg_tensor *h = sg_matmul(in[0], W);
    sg_tensor *hb = sg_add(h, bias);
    sg_tensor *t = sg_tanh(hb);
    sg_tensor *y = sg_add_scalar(sg_mul_scalar(t, 0.5), 0.25);
    sg_tensor *s = sg_sum(y, 1, &d0, false);
    sg_tensor *u = sg_mul_scalar(s, 0.125);
    if (!u) return sg_ctx_status(c) != SG_OK ? sg_ctx_status(c) : SG_ERR_NULL;
    sg_status st = sg_add_(p, u);
    if (st == SG_OK) st = sg_add_(q, sg_mul_scalar(bias, 0.5)); /* independent of p's */
    if (st != SG_OK) return st;
    sg_tensor *z = sg_softmax(hb, 1);
    if (!z) return sg_ctx_status(c);
    out[0] = y;
    out[1] = s;
    out[2] = z;
    return SG_OK;
}

static size_t ctx_live(void) {
    size_t live = 0;
    sg_ctx_host_bytes(ctx, &live, NULL);
    return live;
}

/* Host bytes less the static pool's (on the CPU the pool is host memory; it
 * only grows, to a size that depends on the order its blocks came in) and
 * the executor's caches (CUDA's loaded kernels, the records of its cached
 * device blocks, cuBLASLt's plans: what has run decides them, and a
 * fallback that ran ops one by one loaded more). */
static size_t ctx_held(void) {
    sg_memory_stats ms;
    sg_ctx_memory_stats(ctx, &ms);
    return ctx_live() - ms.pool_bytes - sg__exec_cache_bytes(ctx);
}

/* The reference outputs for x (rows of K) into y and z (rows of M) and s (M). */
static void reference(const float *x, int rows, double *y, double *s, double *z) {
    for (int m = 0; m < M; m++) s[m] = 0;
    for (int r = 0; r < rows; r++) {
        double h[M], top = -INFINITY, sum = 0;
        for (int m = 0; m < M; m++) {
            h[m] = bv[m];
            for (int k = 0; k < K; k++) h[m] += (double)x[r * K + k] * wv[k * M + m];
            y[r * M + m] = tanh(h[m]) * 0.5 + 0.25;
            s[m] += y[r * M + m];
            top = fmax(top, h[m]);
        }
        for (int m = 0; m < M; m++) sum += exp(h[m] - top);
        for (int m = 0; m < M; m++) z[r * M + m] = exp(h[m] - top) / sum;
    }
}

static bool read_close(const char *what, const sg_tensor *t, const double *ref, int64_t n) {
    float buf[BA * M];
    double got[BA * M];
    sg_status st = sg_read(t, buf, (size_t)n * sizeof(float));
    if (!TU_EXPECT(st == SG_OK)) {
        fprintf(stderr, "  reading %s: %s\n", what, sg_last_error(ctx));
        return false;
    }
    for (int64_t i = 0; i < n; i++) got[i] = buf[i];
    return tu_close(what, got, ref, n, 1e-5, 1e-5);
}

/* After a call: p and q match the reference with the call's updates, or --
 * when the call failed -- each without its update or with it (a capture that
 * executes as it records, SG_DRY_CAPTURE=0, ran p's update when q's failed,
 * as an eager step would have); pref follows what they hold. */
static bool check_p(bool ok, const double *s) {
    float buf[2 * M];
    if (!TU_EXPECT(sg_read(p, buf, sizeof buf / 2) == SG_OK) ||
        !TU_EXPECT(sg_read(q, buf + M, sizeof buf / 2) == SG_OK))
        return false;
    double with[2 * M], got[2 * M];
    bool same_with[2] = {true, true}, same_without[2] = {true, true};
    for (int m = 0; m < 2 * M; m++) {
        with[m] = pref[m] + (m < M ? s[m] * 0.125 : bv[m - M] * 0.5);
        got[m] = buf[m];
        same_with[m / M] &= fabs(got[m] - with[m]) <= 1e-5 + 1e-5 * fabs(with[m]);
        same_without[m / M] &= fabs(got[m] - pref[m]) <= 1e-5 + 1e-5 * fabs(pref[m]);
    }
    for (int v = 0; v < 2; v++)
        if (ok || (same_with[v] && !same_without[v]))
            memcpy(pref + v * M, with + v * M, sizeof pref / 2);
    return tu_close(ok ? "p, q" : "p, q (after a failed call)", got, pref, 2 * M, 1e-5, 1e-5);
}

/* What one run saw. */
static struct {
    bool ok;
    const char *hit; /* the action that failed */
    char msg[200];
    bool fired;   /* the armed allocation failed */
    bool said;    /* a fallback was said */
    size_t after; /* ctx_held() after sg_fn_destroy less before sg_compile */
} run;

/* What a clean life leaves in the context after sg_fn_destroy, besides the
 * static pool: the destroyed fn's record and its handles in quarantine. */
static size_t clean_after;

/* An action's status: a failure must come from the armed fault and say why;
 * it is noted, cleared, and the fault disarmed, so the caller retries. */
static bool failed(const char *what, sg_status st) {
    if (st == SG_OK) return false;
    const char *m = sg_last_error(ctx);
    bool ok = TU_EXPECT(hook.fail_at != 0 && hook.count >= hook.fail_at) &&
              TU_EXPECT(st == SG_ERR_OOM) && TU_EXPECT(m != NULL && strstr(m, "memory"));
    if (!ok) fprintf(stderr, "  %s returned %s: %s\n", what, sg_status_str(st), m ? m : "");
    run.ok = run.ok && ok;
    if (!run.hit) {
        run.hit = what;
        snprintf(run.msg, sizeof run.msg, "%s", m ? m : "");
    }
    sg_clear_error(ctx);
    hook.fail_at = 0;
    return true;
}

/* Call fn on x (rows of K); retried once clean if the fault hits it. */
static void call(sg_fn *fn, const char *what, sg_tensor *x, const float *xv, int rows) {
    double y[BA * M], s[M], z[BA * M];
    reference(xv, rows, y, s, z);
    for (int attempt = 0; attempt < 2; attempt++) {
        sg_tensor *in[1] = {x}, *out[3] = {NULL, NULL, NULL};
        sg_status st = sg_call(fn, in, 1, out, 3);
        bool bad = failed(what, st);
        if (!check_p(!bad, s)) run.ok = false;
        if (bad) continue;
        bool good = read_close("y", out[0], y, (int64_t)rows * M) &&
                    read_close("s", out[1], s, M) && read_close("z", out[2], z, (int64_t)rows * M);
        if (!good) fprintf(stderr, "  after %s (fail_at=%ld)\n", what, hook.fail_at);
        run.ok = run.ok && good;
        return;
    }
    run.ok = run.ok && TU_EXPECT(!"a clean retry failed");
}

/* Fallbacks are expected here (not strict): counted instead of printed. */
static long fallbacks;
static void log_hook(void *user, const char *topic, const char *line) {
    (void)user, (void)line;
    fallbacks += strcmp(topic, "fallbacks") == 0;
}

static void setup(void) {
    memset(&hook, 0, sizeof hook);
    sg_ctx_opts opts = {
        .backend = SG_BACKEND_CPU, .alloc = tu_alloc_hook, .alloc_user = &hook, .log = log_hook};
    ctx = tu_ctx(opts);
    int64_t sw[2] = {K, M}, sm[1] = {M}, sa[2] = {BA, K}, sb[2] = {BB, K};
    W = sg_from_host(ctx, SG_F32, 2, sw, wv);
    bias = sg_from_host(ctx, SG_F32, 1, sm, bv);
    p = sg_from_host(ctx, SG_F32, 1, sm, pv);
    q = sg_from_host(ctx, SG_F32, 1, sm, pv + M);
    xa = sg_from_host(ctx, SG_F32, 2, sa, xav);
    xb = sg_from_host(ctx, SG_F32, 2, sb, xbv);
    for (int m = 0; m < 2 * M; m++) pref[m] = pv[m];
    if (!W || !bias || !p || !q || !xa || !xb) {
        fprintf(stderr, "setup: %s\n", sg_last_error(ctx));
        exit(1);
    }
}

static void teardown(void) {
    sg_release(W), sg_release(bias), sg_release(p), sg_release(q), sg_release(xa), sg_release(xb);
    sg_ctx_destroy(ctx);
    ctx = NULL;
}

/* One life of the step with the fail_at-th allocation after setup failing
 * (0: none). Returns the allocations the life made. */
static long life(sg_mode mode, bool strict, long fail_at, uint64_t *compiles) {
    setup();
    run.ok = true;
    run.hit = NULL;
    run.msg[0] = '\0';
    size_t base = ctx_held();
    long start = hook.count, said_before = fallbacks;
    hook.fail_at = fail_at ? start + fail_at : 0;
    sg_compile_opts o = {.mode = mode, .strict = strict, .name = "faults"};
    sg_fn *fn = NULL;
    for (int attempt = 0; attempt < 2 && !fn; attempt++)
        if (failed("sg_compile", sg_compile(ctx, step, NULL, 1, 3, &o, &fn))) fn = NULL;
    if (!TU_EXPECT(fn != NULL)) {
        run.ok = false;
        teardown();
        return 0;
    }
    call(fn, "call A (capture)", xa, xav, BA);
    call(fn, "call A (replay)", xa, xav, BA);
    call(fn, "call B (recompile)", xb, xbv, BB);
    call(fn, "call B (replay)", xb, xbv, BB);
    call(fn, "call A (replay of the first capture)", xa, xav, BA);
    sg_fn_stats st;
    sg_fn_get_stats(fn, &st);
    *compiles = st.compiles;
    /* Strict: whatever failed was retried, so both captures run generated code. */
    if (strict && !TU_EXPECT(st.compiles >= 2)) run.ok = false;
    sg_fn_destroy(fn);
    long made = hook.count - start;
    run.fired = fail_at && hook.count >= start + fail_at;
    run.said = fallbacks > said_before;
    run.after = ctx_held() - base;
    hook.fail_at = 0;
    teardown();
    bool clean = TU_EXPECT(hook.live == 0 && hook.bytes == 0);
    if (!clean) fprintf(stderr, "  leak: %ld blocks, %zu bytes\n", hook.live, hook.bytes);
    run.ok = run.ok && clean;
    return made;
}

static void alloc_faults(sg_mode mode, bool strict) {
    uint64_t compiles = 0;
    long total = life(mode, strict, 0, &compiles);
    clean_after = run.after;
    /* strict or not, a clean life compiles both captures to C. */
    tu_case(run.ok && !run.hit && TU_EXPECT(compiles == 2) && total > 0,
            "FAULT(mode=%s,strict=%d,fail_at=0: %ld allocations, %d compiled captures)",
            sg_mode_name(mode), strict, total, (int)compiles);
    int hits = 0, absorbed = 0;
    fallbacks = 0;
    long n = 1;
    for (;; n++) {
        life(mode, strict, n, &compiles);
        if (!run.fired) break; /* the life met no failure: done */
        if (!TU_EXPECT(run.after == clean_after)) {
            fprintf(stderr,
                    "  after sg_fn_destroy the context holds %zu bytes more than before "
                    "sg_compile; a clean life leaves %zu\n",
                    run.after, clean_after);
            run.ok = false;
        }
        hits += run.hit != NULL;
        absorbed += run.hit == NULL;
        /* Met by nothing: only a fallback (not strict) may take a failure in. */
        if (!run.hit && !TU_EXPECT(!strict && run.said)) run.ok = false;
        if (!run.ok && hook.nwhere) tu_alloc_where(&hook);
        if (!run.ok || getenv("SG_TEST_VERBOSE"))
            tu_case(run.ok, "FAULT(mode=%s,strict=%d,fail_at=%ld) -> %s: \"%.120s\"",
                    sg_mode_name(mode), strict, n, run.hit ? run.hit : "absorbed (no call failed)",
                    run.msg);
        if (!TU_EXPECT(n <= 4 * total)) break; /* each life should end as the clean one did */
    }
    tu_case(hits > 0 && run.ok,
            "FAULT(mode=%s,strict=%d): every fail_at in 1..%ld: %d failed an "
            "action, %d absorbed (no action failed, all results right), %ld fallbacks said",
            sg_mode_name(mode), strict, n - 1, hits, absorbed, fallbacks);
}

/*
 * One call of a fresh fn (capture and compile) with the n-th cache file
 * operation failing: it succeeds (a damaged-looking entry is rebuilt, an
 * entry that cannot be kept is still used) or fails with a message; either
 * way the next calls, clean, give the right numbers. Returns the file
 * operations counted.
 */
static long file_life(bool always, long n) {
    setup();
    run.ok = true;
    run.hit = NULL;
    run.msg[0] = '\0';
    sg_compile_opts o = {.mode = SG_MODE_DEFAULT, .strict = true, .name = "faults_files"};
    sg_fn *fn = NULL;
    if (!TU_EXPECT(sg_compile(ctx, step, NULL, 1, 3, &o, &fn) == SG_OK)) exit(1);
    double y[BA * M], s[M], z[BA * M];
    reference(xav, BA, y, s, z);
    sg__file_fault_set(n ? n : 1L << 40);
    sg_tensor *in[1] = {xa}, *out[3] = {NULL, NULL, NULL};
    sg_status st = sg_call(fn, in, 1, out, 3);
    long ops = sg__file_fault_count();
    sg__file_fault_set(0);
    if (st != SG_OK) {
        const char *m = sg_last_error(ctx);
        run.ok = TU_EXPECT(n > 0 && ops >= n) && TU_EXPECT(st == SG_ERR_COMPILE) &&
                 TU_EXPECT(strstr(m, "codegen: ") && strstr(m, "SG_CACHE_DIR"));
        run.hit = "call A (capture)";
        snprintf(run.msg, sizeof run.msg, "%s", m);
        sg_clear_error(ctx);
    } else {
        run.ok = read_close("y", out[0], y, BA * M) && read_close("s", out[1], s, M) &&
                 read_close("z", out[2], z, BA * M);
    }
    run.ok = check_p(st == SG_OK, s) && run.ok;
    call(fn, "call A (clean, after the fault)", xa, xav, BA);
    sg_fn_stats fs;
    sg_fn_get_stats(fn, &fs);
    run.ok = run.ok && TU_EXPECT(fs.compiles == 1);
    sg_fn_destroy(fn);
    teardown();
    run.ok = run.ok && TU_EXPECT(hook.live == 0 && hook.bytes == 0);
    (void)always;
    return ops;
}

static void file_faults(bool always) {
    if (always) setenv("SG_ALWAYS_COMPILE", "1", 1);
    long total = file_life(always, 0);
    /* The CPU's C is a shared object on disk even when always compiled; a
     * GPU backend that always compiles keeps its images in memory and
     * touches no cache file. */
    bool none = always && tu_backend() != SG_BACKEND_CPU;
    tu_case(run.ok && (none ? total == 0 : total > 0),
            "FILE_FAULT(always_compile=%d,fail_at=0: %ld file operations)", always, total);
    for (long n = 1; n <= total; n++) {
        file_life(always, n);
        tu_case(run.ok, "FILE_FAULT(always_compile=%d,fail_at=%ld) -> %s: \"%.160s\"", always, n,
                run.hit ? run.hit : "the call succeeded", run.msg);
    }
    unsetenv("SG_ALWAYS_COMPILE");
}

int main(void) {
    tu_seed(11);
    for (int i = 0; i < K * M; i++) wv[i] = (float)tu_uniform(-0.5, 0.5);
    for (int i = 0; i < M; i++) bv[i] = (float)tu_uniform(-0.5, 0.5);
    for (int i = 0; i < 2 * M; i++) pv[i] = (float)tu_uniform(-1, 1);
    for (int i = 0; i < BA * K; i++) xav[i] = (float)tu_uniform(-1, 1);
    for (int i = 0; i < BB * K; i++) xbv[i] = (float)tu_uniform(-1, 1);
    sg_mode modes[3] = {SG_MODE_DEFAULT, SG_MODE_REDUCE_OVERHEAD, SG_MODE_MAX_AUTOTUNE};
    for (int mi = 0; mi < 3; mi++)
        for (int strict = 1; strict >= 0; strict--) alloc_faults(modes[mi], strict);
    file_faults(false);
    file_faults(true);
    return tu_finish();
}
