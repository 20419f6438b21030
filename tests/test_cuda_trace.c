/* SPDX-License-Identifier: MIT */
/*
 * test_cuda_trace.c -- sg_fn_trace on CUDA: a compiled step (a matmul, a
 * row softmax, a pointwise chain) traced over 3 replays writes one event per
 * kernel per replay, each with a name, a start that does not go back and a
 * duration of at least 0, and the outputs after tracing still match an f64
 * reference. With SG_CUDA_STAMPS set before its compile, a second fn's
 * replays print one line per generated launch (begin <= wait <= end, at
 * least one block) and still match the reference. Exits 77 without a GPU.
 */
#define _POSIX_C_SOURCE 200809L /* setenv, fileno */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { M = 8, K = 64, N = 96 };

static sg_status step(sg_ctx *ctx, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)user;
    sg_tensor *h = sg_softmax(sg_matmul(in[0], in[1]), -1);
    out[0] = sg_tanh(sg_add_scalar(sg_mul_scalar(h, 3.0), 0.25));
    return out[0] ? SG_OK : sg_ctx_status(ctx);
}

/* Count the events and check them: names present, ts not decreasing within
 * a replay, dur >= 0. */
static int check_events(const char *text, int *nev) {
    int n = 0, bad = 0;
    double last_ts = -1;
    for (const char *p = strstr(text, "\"ph\": \"X\""); p; p = strstr(p + 1, "\"ph\": \"X\"")) {
        const char *ts = strstr(p, "\"ts\": "), *dur = strstr(p, "\"dur\": ");
        if (!ts || !dur) return -1;
        double t = atof(ts + 6), d = atof(dur + 7);
        if (!(d >= 0) || !(t >= 0)) bad++;
        if (t + 1e-3 < last_ts) bad++; /* one stream: kernels run in order */
        last_ts = t;
        n++;
    }
    *nev = n;
    return bad;
}

static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    char *text = f ? calloc(1, 1 << 20) : NULL;
    *n = text ? fread(text, 1, (1 << 20) - 1, f) : 0;
    if (f) fclose(f);
    return text;
}

/* The worst relative error of fn's result on in against f64. */
static double worst_of(sg_fn *fn, sg_tensor *const *in, const double *av, const double *bv) {
    float out[M * N];
    sg_tensor *y = NULL;
    bool ok = sg_call(fn, in, 2, &y, 1) == SG_OK && sg_read(y, out, sizeof out) == SG_OK;
    double worst = ok ? 0 : INFINITY;
    for (int i = 0; ok && i < M; i++) {
        double row[N], mx = -INFINITY, sum = 0;
        for (int j = 0; j < N; j++) {
            double acc = 0;
            for (int k = 0; k < K; k++) acc += av[i * K + k] * bv[k * N + j];
            row[j] = acc;
            mx = acc > mx ? acc : mx;
        }
        for (int j = 0; j < N; j++) sum += exp(row[j] - mx);
        for (int j = 0; j < N; j++) {
            double ref = tanh(exp(row[j] - mx) / sum * 3.0 + 0.25);
            double e = fabs(out[i * N + j] - ref) / (1e-6 + fabs(ref));
            worst = e > worst ? e : worst;
        }
    }
    return worst;
}

int main(void) {
    sg_ctx *ctx;
    if (sg_ctx_create(&(sg_ctx_opts){.backend = SG_BACKEND_CUDA}, &ctx) != SG_OK) {
        printf("skipped: %s\n", sg_last_error(NULL));
        return 77;
    }
    tu_seed(7);
    int64_t as[2] = {M, K}, bs[2] = {K, N};
    double *av = NULL, *bv = NULL;
    sg_tensor *in[2] = {tu_rand(ctx, SG_F32, 2, as, -1, 1, &av),
                        tu_rand(ctx, SG_F32, 2, bs, -1, 1, &bv)};
    sg_fn *fn = NULL;
    sg_tensor *y = NULL;
    sg_status s = sg_compile(ctx, step, NULL, 2, 1,
                             &(sg_compile_opts){.mode = SG_MODE_REDUCE_OVERHEAD, .name = "traced"},
                             &fn);
    if (s == SG_OK) s = sg_call(fn, in, 2, &y, 1); /* capture */
    char path[64];
    snprintf(path, sizeof path, "/tmp/sg-cuda-trace-%d.json", (int)getpid());
    if (s == SG_OK) s = sg_fn_trace(fn, in, 2, path, 3);
    if (s != SG_OK) fprintf(stderr, "  %s\n", sg_last_error(ctx));
    size_t got = 0;
    char *text = s == SG_OK ? slurp(path, &got) : NULL;
    int nev = 0, bad = got ? check_events(text, &nev) : -1;
    tu_case(TU_EXPECT(s == SG_OK) && TU_EXPECT(got > 0) && TU_EXPECT(bad == 0) &&
                TU_EXPECT(nev > 0 && nev % 3 == 0) &&
                TU_EXPECT(strstr(text ? text : "", "\"traceEvents\"") != NULL),
            "CUDA_TRACE(3 replays of matmul + softmax + pointwise: %d events, %d per replay)", nev,
            nev / 3);
    free(text);
    remove(path);
    /* A normal call after tracing: the graph path, checked against f64. */
    double worst = worst_of(fn, in, av, bv);
    tu_case(TU_EXPECT(worst < 1e-4), "CUDA_TRACE_THEN_REPLAY(f32 [%d,%d] @ [%d,%d]: worst rel. %.2g)",
            M, K, K, N, worst);
    sg_fn_destroy(fn);

    /* SG_CUDA_STAMPS: 5 replays as usual, then 3 stamped, their lines on stderr. */
    setenv("SG_CUDA_STAMPS", "3", 1);
    char epath[64];
    snprintf(epath, sizeof epath, "/tmp/sg-cuda-stamps-%d.txt", (int)getpid());
    fflush(stderr);
    int saved = dup(fileno(stderr));
    bool redirected = saved >= 0 && freopen(epath, "w", stderr) != NULL;
    s = sg_compile(ctx, step, NULL, 2, 1,
                   &(sg_compile_opts){.mode = SG_MODE_REDUCE_OVERHEAD, .name = "stamped"}, &fn);
    for (int c = 0; s == SG_OK && c < 10; c++) s = sg_call(fn, in, 2, &y, 1);
    fflush(stderr);
    if (saved >= 0) dup2(saved, fileno(stderr)), close(saved);
    unsetenv("SG_CUDA_STAMPS");
    if (s != SG_OK) fprintf(stderr, "  %s\n", sg_last_error(ctx));
    char *etext = slurp(epath, &got);
    int lines = 0, badl = 0;
    for (char *l = etext ? strstr(etext, "stamps of") : NULL; l && (l = strchr(l, '\n'));) {
        char name[64];
        double b0, b1, w0, w1, end, blocks;
        int k;
        l++;
        if (sscanf(l, "%d %63s %lf..%lf %lf..%lf %lf %lf", &k, name, &b0, &b1, &w0, &w1, &end,
                   &blocks) != 8)
            break;
        lines++;
        badl += !(b0 >= 0 && b0 <= b1 && b0 <= w0 && w0 <= w1 && w1 <= end && blocks >= 1);
    }
    worst = s == SG_OK ? worst_of(fn, in, av, bv) : INFINITY;
    tu_case(TU_EXPECT(redirected) && TU_EXPECT(s == SG_OK) && TU_EXPECT(lines >= 1) &&
                TU_EXPECT(badl == 0) && TU_EXPECT(worst < 1e-4),
            "CUDA_STAMPS(3 stamped replays: %d launch lines, %d out of order; worst rel. %.2g)",
            lines, badl, worst);
    free(etext);
    remove(epath);
    free(av), free(bv);
    sg_fn_destroy(fn);
    sg_ctx_destroy(ctx);
    return tu_finish();
}