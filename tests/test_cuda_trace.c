/* SPDX-License-Identifier: MIT */
/*
 * test_cuda_trace.c -- sg_fn_trace on CUDA: a compiled step (a matmul, a
 * row softmax, a pointwise chain) traced over 3 replays writes one event per
 * kernel per replay, each with a name, a start that does not go back and a
 * duration of at least 0, and the outputs after tracing still match an f64
 * reference. Exits 77 without a GPU.
 */
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
    float out[M * N];
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
    tu_case(TU_EXPECT(worst < 1e-4), "CUDA_TRACE_THEN_REPLAY(f32 [%d,%d] @ [%d,%d]: worst rel. %.2g)",
            M, K, K, N, worst);
    free(av), free(bv);
    sg_fn_destroy(fn);
    sg_ctx_destroy(ctx);
    return tu_finish();
}
