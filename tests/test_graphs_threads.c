/* SPDX-License-Identifier: MIT */
/*
 * test_graphs_threads.c -- contexts are independent: four threads each make
 * their own context, parameters and steps (eager, DEFAULT,
 * REDUCE_OVERHEAD and MAX_AUTOTUNE, whose picks are notes in the cache), call them on two input
 * shapes, check every output and the in-place parameter update against a reference computed in f64,
 * and destroy everything -- all at once, sharing one fresh SG_CACHE_DIR, so that they compile the
 * same kernels together and race to publish, then (second round) race to look them up, then (third
 * round, with SG_ALWAYS_COMPILE=1 and a tiny SG_CACHE_MAX_MB) each replace the entries and evict
 * the others' while those are being read. Built with STEPGRAPH_TSAN, this is the test
 * ThreadSanitizer runs in CI.
 *
 * The step: y = relu(x @ W + b) * 0.5 - 0.125, s = mean(y, dim 0),
 * p += s (in place); outputs y and s. Each case is one thread of one round:
 * `THREADS(round=1 cold cache,thread=2,seed=103): 3 fns x 2 shapes x 3 calls`.
 */
#define _POSIX_C_SOURCE 200809L /* setenv, mkdtemp */
#include "testutil.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { NTHREADS = 4, K = 16, M = 8, BA = 5, BB = 2, CALLS = 3, NFNS = 4 };

typedef struct worker {
    int id;
    uint64_t seed;
    bool ok;
    char why[512];
    /* The thread's own data (the test's RNG is not shared between threads). */
    float w[K * M], b[M], p[M], xa[BA * K], xb[BB * K];
    double pref[M];
    sg_tensor *W, *bias, *param;
} worker;

static pthread_barrier_t start;

/* A per-thread xorshift64* in [lo, hi). */
static double uniform(uint64_t *s, double lo, double hi) {
    *s ^= *s >> 12, *s ^= *s << 25, *s ^= *s >> 27;
    return lo + (hi - lo) * (double)((*s * 2685821657736338717ull) >> 11) / 9007199254740992.0;
}

static sg_status step(sg_ctx *ctx, sg_tensor *const *in, sg_tensor **out, void *user) {
    worker *w = user;
    int d0 = 0;
    sg_tensor *h = sg_add(sg_matmul(in[0], w->W), w->bias);
    sg_tensor *y = sg_add_scalar(sg_mul_scalar(sg_relu(h), 0.5), -0.125);
    sg_tensor *s = sg_mean(y, 1, &d0, false);
    if (!s) return sg_ctx_status(ctx) != SG_OK ? sg_ctx_status(ctx) : SG_ERR_NULL;
    sg_status st = sg_add_(w->param, s);
    if (st != SG_OK) return st;
    out[0] = y;
    out[1] = s;
    return SG_OK;
}

static bool fail(worker *w, const char *fmt, const char *a, const char *b) {
    if (w->ok) snprintf(w->why, sizeof w->why, fmt, a, b);
    w->ok = false;
    return false;
}

static bool close_to(worker *w, const char *what, const float *got, const double *ref, int n) {
    for (int i = 0; i < n; i++)
        if (!(fabs(got[i] - ref[i]) <= 1e-5 + 1e-5 * fabs(ref[i]))) {
            char at[128];
            snprintf(at, sizeof at, "[%d]: got %.8g, want %.8g", i, got[i], ref[i]);
            return fail(w, "%s%s", what, at);
        }
    return true;
}

/* One call on x (rows of K), checked against the reference. */
static void call(worker *w, sg_ctx *ctx, sg_fn *fn, sg_tensor *x, const float *xv, int rows) {
    double y[BA * M], s[M];
    for (int m = 0; m < M; m++) s[m] = 0;
    for (int r = 0; r < rows; r++)
        for (int m = 0; m < M; m++) {
            double h = w->b[m];
            for (int k = 0; k < K; k++) h += (double)xv[r * K + k] * w->w[k * M + m];
            y[r * M + m] = fmax(h, 0) * 0.5 - 0.125;
            s[m] += y[r * M + m] / rows;
        }
    for (int m = 0; m < M; m++) w->pref[m] += s[m];
    sg_tensor *in[1] = {x}, *out[2] = {NULL, NULL};
    float got[BA * M];
    if (sg_call(fn, in, 1, out, 2) != SG_OK) {
        fail(w, "sg_call: %s%s", sg_last_error(ctx), "");
        return;
    }
    if (sg_read(out[0], got, sizeof(float) * (size_t)(rows * M)) != SG_OK ||
        !close_to(w, "y", got, y, rows * M))
        return (void)fail(w, "y: %s%s", sg_last_error(ctx), "");
    if (sg_read(out[1], got, sizeof(float) * M) != SG_OK || !close_to(w, "s", got, s, M))
        return (void)fail(w, "s: %s%s", sg_last_error(ctx), "");
    if (sg_read(w->param, got, sizeof(float) * M) != SG_OK || !close_to(w, "p", got, w->pref, M))
        return (void)fail(w, "p: %s%s", sg_last_error(ctx), "");
}

static void *work(void *arg) {
    worker *w = arg;
    w->ok = true;
    uint64_t s = w->seed;
    for (int i = 0; i < K * M; i++) w->w[i] = (float)uniform(&s, -0.5, 0.5);
    for (int i = 0; i < M; i++) w->b[i] = (float)uniform(&s, -0.5, 0.5);
    for (int i = 0; i < M; i++) w->pref[i] = w->p[i] = (float)uniform(&s, -1, 1);
    for (int i = 0; i < BA * K; i++) w->xa[i] = (float)uniform(&s, -1, 1);
    for (int i = 0; i < BB * K; i++) w->xb[i] = (float)uniform(&s, -1, 1);
    sg_ctx_opts opts = {.backend = SG_BACKEND_CPU};
    sg_ctx *ctx = NULL;
    pthread_barrier_wait(&start); /* every context is made at once */
    if (sg_ctx_create(&opts, &ctx) != SG_OK) {
        fail(w, "sg_ctx_create: %s%s", sg_last_error(NULL), "");
        return NULL;
    }
    int64_t sw[2] = {K, M}, sm[1] = {M}, sa[2] = {BA, K}, sb[2] = {BB, K};
    w->W = sg_from_host(ctx, SG_F32, 2, sw, w->w);
    w->bias = sg_from_host(ctx, SG_F32, 1, sm, w->b);
    w->param = sg_from_host(ctx, SG_F32, 1, sm, w->p);
    sg_tensor *xa = sg_from_host(ctx, SG_F32, 2, sa, w->xa);
    sg_tensor *xb = sg_from_host(ctx, SG_F32, 2, sb, w->xb);
    sg_mode modes[NFNS] = {SG_MODE_EAGER, SG_MODE_DEFAULT, SG_MODE_REDUCE_OVERHEAD,
                           SG_MODE_MAX_AUTOTUNE};
    sg_fn *fns[NFNS] = {NULL};
    for (int f = 0; f < NFNS && w->ok; f++) {
        sg_compile_opts o = {.mode = modes[f], .strict = true, .name = "threads"};
        if (sg_compile(ctx, step, w, 1, 2, &o, &fns[f]) != SG_OK)
            fail(w, "sg_compile: %s%s", sg_last_error(ctx), "");
    }
    for (int c = 0; c < CALLS && w->ok; c++)
        for (int f = 0; f < NFNS && w->ok; f++) {
            call(w, ctx, fns[f], xa, w->xa, BA);
            if (w->ok) call(w, ctx, fns[f], xb, w->xb, BB);
        }
    for (int f = 1; f < NFNS && w->ok; f++) {
        sg_fn_stats st;
        sg_fn_get_stats(fns[f], &st);
        char n[32];
        snprintf(n, sizeof n, "%llu", (unsigned long long)st.compiles);
        if (st.compiles != 2)
            fail(w, "fn %s compiled %s captures, not 2", sg_mode_name(modes[f]), n);
    }
    for (int f = 0; f < NFNS; f++) sg_fn_destroy(fns[f]);
    sg_release(xa), sg_release(xb);
    sg_release(w->W), sg_release(w->bias), sg_release(w->param);
    sg_ctx_destroy(ctx);
    return NULL;
}

int main(void) {
    /* A fresh cache root of this run alone, inside the tests' cache. */
    const char *parent = getenv("SG_CACHE_DIR");
    char root[1024];
    snprintf(root, sizeof root, "%s/threads-XXXXXX", parent && *parent ? parent : "/tmp");
    if (!mkdtemp(root)) {
        perror(root);
        return 1;
    }
    setenv("SG_CACHE_DIR", root, 1);
    const char *rounds[3] = {"cold cache", "warm cache",
                             "every capture compiled and published, the rest evicted"};
    static worker ws[NTHREADS];
    for (int r = 0; r < 3; r++) {
        if (r == 2) { /* each publish evicts every other entry, some in use by other threads */
            setenv("SG_ALWAYS_COMPILE", "1", 1);
            setenv("SG_CACHE_MAX_MB", "0.001", 1);
        }
        pthread_t th[NTHREADS];
        pthread_barrier_init(&start, NULL, NTHREADS);
        for (int t = 0; t < NTHREADS; t++) {
            memset(&ws[t], 0, sizeof ws[t]);
            ws[t].id = t;
            ws[t].seed = 101 + (uint64_t)t + 10 * (uint64_t)r;
            if (pthread_create(&th[t], NULL, work, &ws[t]) != 0) {
                fprintf(stderr, "pthread_create failed\n");
                return 1;
            }
        }
        for (int t = 0; t < NTHREADS; t++) pthread_join(th[t], NULL);
        pthread_barrier_destroy(&start);
        for (int t = 0; t < NTHREADS; t++) {
            if (!ws[t].ok) fprintf(stderr, "  %s\n", ws[t].why);
            tu_case(ws[t].ok,
                    "THREADS(round=%d %s,thread=%d,seed=%llu): %d fns x 2 shapes x %d calls", r + 1,
                    rounds[r], t, (unsigned long long)ws[t].seed, NFNS, CALLS);
        }
    }
    unsetenv("SG_ALWAYS_COMPILE");
    unsetenv("SG_CACHE_MAX_MB");
    sg_ctx *ctx = NULL;
    sg_ctx_opts opts = {.backend = SG_BACKEND_CPU};
    if (sg_ctx_create(&opts, &ctx) == SG_OK) {
        sg_cache_clear(ctx);
        sg_ctx_destroy(ctx);
    }
    rmdir(root);
    return tu_finish();
}
