/* SPDX-License-Identifier: MIT */
/*
 * mlp_eager.c -- two of the reference workloads (bench/README.md), run eagerly
 * on the CPU through stepgraph's public API, checked against plain C and
 * timed:
 *
 *   W2   an MLP of 8 x (linear 1024 -> 1024 + gelu_tanh), batch 1, with
 *        seeded random weights (PyTorch's nn.Linear init), f32 or bf16;
 *   W1s  a pointwise chain, 6 x (y = tanh(sin(y) * 1.01 + 0.1)) on 4096 f32:
 *        24 ops of 16 KiB each, so it measures the cost of one eager op.
 *
 * For each it prints the first outputs, a checksum, the largest error
 * against a plain C reference in double (relative to the largest output),
 * and the median time of one step over `steps` timed steps (after 3 warm-up
 * steps), measured with clock_gettime around the host loop.
 *
 * usage: mlp_eager [f32|bf16] [steps]      (defaults: f32 50)
 *
 * Exit status: 0 when both workloads ran and matched their reference, 1 on
 * any stepgraph failure (its message is printed) or mismatch, 2 on bad usage.
 */
#define _POSIX_C_SOURCE 199309L /* clock_gettime */

#include <stepgraph.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define LAYERS 8
#define DIM 1024
#define CHAIN_N 4096
#define CHAIN_ITERS 6
#define WARMUP 3

/* ------------------------------------------------------------ helpers */

/* Print what failed and why, free everything, and leave. */
static void die(sg_ctx *ctx, const char *what) {
    fprintf(stderr, "mlp_eager: %s failed: %s\n", what, sg_last_error(ctx));
    sg_ctx_destroy(ctx);
    exit(1);
}

static void *xmalloc(size_t n) {
    void *p = malloc(n);
    if (!p) {
        fprintf(stderr, "mlp_eager: out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

/* A seeded xorshift64* generator, so every run uses the same weights. */
static uint64_t rng = 0x9e3779b97f4a7c15ull;

static float uniform(float lo, float hi) {
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    double u = (double)((rng * 2685821657736338717ull) >> 11) / 9007199254740992.0;
    return lo + (hi - lo) * (float)u;
}

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Sorts v. */
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Read a float tensor of n elements into out as f32, whatever its dtype. */
static void read_f32(sg_ctx *ctx, sg_tensor *t, float *out, int64_t n) {
    sg_tensor *f = sg_cast(t, SG_F32);
    if (!f || sg_read(f, out, (size_t)n * sizeof(float)) != SG_OK) die(ctx, "reading the output");
    sg_release(f);
}

/* Print first outputs, checksum and the error against ref; false on a mismatch. */
static bool report(const float *y, const double *ref, int64_t n, double tol) {
    double sum = 0, asum = 0, err = 0, scale = 0;
    for (int64_t i = 0; i < n; i++) {
        sum += y[i];
        asum += fabs(y[i]);
        scale = fmax(scale, fabs(ref[i]));
        err = fmax(err, fabs(y[i] - ref[i]));
    }
    double rel = scale > 0 ? err / scale : err;
    printf("  y[0:6]    ");
    for (int i = 0; i < 6; i++) printf(" %+.6f", y[i]);
    printf("\n  checksum   sum(y) = %+.6f, sum|y| = %.6f\n", sum, asum);
    printf("  error      max|y - ref| / max|ref| = %.2e (tolerance %.0e): %s\n", rel, tol,
           rel <= tol ? "ok" : "MISMATCH");
    return rel <= tol;
}

static void report_time(double *us, int steps, const char *unit_of_work, int units) {
    double med = median(us, steps);
    printf("  time       %.1f us per step, median of %d (min %.1f, max %.1f); %.2f us per %s\n",
           med, steps, us[0], us[steps - 1], med / units, unit_of_work);
}

/* ------------------------------------------------------------ W2: the MLP */

typedef struct mlp {
    sg_tensor *w[LAYERS];           /* (DIM out, DIM in), as nn.Linear stores it */
    sg_tensor *b[LAYERS];           /* (DIM) */
    float *hw[LAYERS], *hb[LAYERS]; /* the same values on the host, for the reference */
} mlp;

/*
 * One step: h = gelu_tanh(linear(h, w, b)), eight times. Each intermediate
 * is released once the next layer has read it; the result is the caller's.
 * A failure anywhere makes every later op return NULL, so one check at the
 * end is enough (the context keeps the first failure's message).
 */
static sg_tensor *mlp_step(const mlp *m, sg_tensor *x) {
    sg_tensor *h = x;
    for (int l = 0; l < LAYERS; l++) {
        sg_tensor *z = sg_linear(h, m->w[l], m->b[l]);
        sg_tensor *y = sg_gelu_tanh(z);
        sg_release(z);
        if (h != x) sg_release(h);
        h = y;
    }
    return h;
}

/* Weights drawn like nn.Linear's default init: U(-1/sqrt(in), 1/sqrt(in)). */
static void mlp_init(sg_ctx *ctx, mlp *m, sg_dtype dt) {
    const float k = 1.0f / sqrtf((float)DIM);
    int64_t wshape[2] = {DIM, DIM}, bshape[1] = {DIM};
    for (int l = 0; l < LAYERS; l++) {
        m->hw[l] = xmalloc(sizeof(float) * DIM * DIM);
        m->hb[l] = xmalloc(sizeof(float) * DIM);
        for (int i = 0; i < DIM * DIM; i++) m->hw[l][i] = uniform(-k, k);
        for (int i = 0; i < DIM; i++) m->hb[l][i] = uniform(-k, k);
        sg_tensor *w = sg_from_host(ctx, SG_F32, 2, wshape, m->hw[l]);
        sg_tensor *b = sg_from_host(ctx, SG_F32, 1, bshape, m->hb[l]);
        m->w[l] = sg_cast(w, dt); /* a copy, also for f32: one code path */
        m->b[l] = sg_cast(b, dt);
        sg_release(w);
        sg_release(b);
        if (!m->w[l] || !m->b[l]) die(ctx, "making the weights");
    }
}

/* The reference in double: x (DIM) -> out (DIM). */
static void mlp_reference(const mlp *m, const float *x, double *out) {
    double *h = xmalloc(sizeof(double) * DIM), *z = xmalloc(sizeof(double) * DIM);
    for (int i = 0; i < DIM; i++) h[i] = x[i];
    for (int l = 0; l < LAYERS; l++) {
        for (int o = 0; o < DIM; o++) {
            const float *row = m->hw[l] + (size_t)o * DIM;
            double acc = m->hb[l][o];
            for (int i = 0; i < DIM; i++) acc += row[i] * h[i];
            z[o] = acc;
        }
        for (int o = 0; o < DIM; o++) {
            double v = z[o];
            h[o] = 0.5 * v * (1.0 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
        }
    }
    memcpy(out, h, sizeof(double) * DIM);
    free(h);
    free(z);
}

static bool run_w2(sg_ctx *ctx, sg_dtype dt, int steps) {
    printf("W2  MLP %d x (linear %d->%d + gelu_tanh), batch 1, %s, eager\n", LAYERS, DIM, DIM,
           sg_dtype_name(dt));
    mlp m;
    mlp_init(ctx, &m, dt);
    float *hx = xmalloc(sizeof(float) * DIM), *y = xmalloc(sizeof(float) * DIM);
    double *ref = xmalloc(sizeof(double) * DIM), *us = xmalloc(sizeof(double) * (size_t)steps);
    for (int i = 0; i < DIM; i++) hx[i] = uniform(-1.0f, 1.0f);
    int64_t xshape[2] = {1, DIM};
    sg_tensor *x32 = sg_from_host(ctx, SG_F32, 2, xshape, hx);
    sg_tensor *x = sg_cast(x32, dt);
    sg_release(x32);
    if (!x) die(ctx, "making the input");

    for (int s = 0; s < WARMUP + steps; s++) {
        double t0 = now_us();
        sg_tensor *out = mlp_step(&m, x);
        double t1 = now_us();
        if (!out) die(ctx, "the W2 step");
        if (s >= WARMUP) us[s - WARMUP] = t1 - t0;
        if (s + 1 == WARMUP + steps) read_f32(ctx, out, y, DIM);
        sg_release(out);
    }
    mlp_reference(&m, hx, ref);
    bool ok = report(y, ref, DIM, dt == SG_F32 ? 1e-4 : 2e-2);
    report_time(us, steps, "layer", LAYERS);

    sg_release(x);
    for (int l = 0; l < LAYERS; l++) {
        sg_release(m.w[l]);
        sg_release(m.b[l]);
        free(m.hw[l]);
        free(m.hb[l]);
    }
    free(hx), free(y), free(ref), free(us);
    return ok;
}

/* ------------------------------------------------------------ W1s: the chain */

/* One step: y = tanh(sin(y) * 1.01 + 0.1), six times (24 ops). */
static sg_tensor *chain_step(sg_tensor *x) {
    sg_tensor *y = x;
    for (int k = 0; k < CHAIN_ITERS; k++) {
        sg_tensor *s = sg_sin(y);
        sg_tensor *m = sg_mul_scalar(s, 1.01);
        sg_tensor *a = sg_add_scalar(m, 0.1);
        sg_tensor *t = sg_tanh(a);
        sg_release(s), sg_release(m), sg_release(a);
        if (y != x) sg_release(y);
        y = t;
    }
    return y;
}

static bool run_w1s(sg_ctx *ctx, int steps) {
    printf("W1s pointwise chain %d x (y = tanh(sin(y)*1.01 + 0.1)), %d f32, eager (%d ops)\n",
           CHAIN_ITERS, CHAIN_N, 4 * CHAIN_ITERS);
    float *hx = xmalloc(sizeof(float) * CHAIN_N), *y = xmalloc(sizeof(float) * CHAIN_N);
    double *ref = xmalloc(sizeof(double) * CHAIN_N), *us = xmalloc(sizeof(double) * (size_t)steps);
    for (int i = 0; i < CHAIN_N; i++) hx[i] = uniform(-3.0f, 3.0f);
    int64_t shape[1] = {CHAIN_N};
    sg_tensor *x = sg_from_host(ctx, SG_F32, 1, shape, hx);
    if (!x) die(ctx, "making the input");

    for (int s = 0; s < WARMUP + steps; s++) {
        double t0 = now_us();
        sg_tensor *out = chain_step(x);
        double t1 = now_us();
        if (!out) die(ctx, "the W1s step");
        if (s >= WARMUP) us[s - WARMUP] = t1 - t0;
        if (s + 1 == WARMUP + steps && sg_read(out, y, sizeof(float) * CHAIN_N) != SG_OK)
            die(ctx, "reading the output");
        sg_release(out);
    }
    for (int i = 0; i < CHAIN_N; i++) {
        double v = hx[i];
        for (int k = 0; k < CHAIN_ITERS; k++) v = tanh(sin(v) * 1.01 + 0.1);
        ref[i] = v;
    }
    bool ok = report(y, ref, CHAIN_N, 1e-4);
    report_time(us, steps, "op", 4 * CHAIN_ITERS);
    sg_release(x);
    free(hx), free(y), free(ref), free(us);
    return ok;
}

/* ------------------------------------------------------------ main */

int main(int argc, char **argv) {
    sg_dtype dt = SG_F32;
    int steps = 50;
    if (argc > 1 && strcmp(argv[1], "bf16") == 0)
        dt = SG_BF16;
    else if (argc > 1 && strcmp(argv[1], "f32") != 0)
        goto usage;
    if (argc > 2) {
        char *end;
        long n = strtol(argv[2], &end, 10);
        if (*end || n < 1 || n > 100000) goto usage;
        steps = (int)n;
    }
    if (argc > 3) goto usage;

    sg_ctx *ctx;
    if (sg_ctx_create(&(sg_ctx_opts){.backend = SG_BACKEND_CPU}, &ctx) != SG_OK) {
        fprintf(stderr, "mlp_eager: sg_ctx_create failed: %s\n", sg_last_error(NULL));
        return 1;
    }
    printf("stepgraph %s, backend %s\n", sg_version(), sg_backend_name(sg_ctx_backend(ctx)));
    bool ok = run_w2(ctx, dt, steps);
    ok = run_w1s(ctx, steps) && ok;
    sg_ctx_destroy(ctx); /* frees whatever tensors are left */
    return ok ? 0 : 1;

usage:
    fprintf(stderr, "usage: %s [f32|bf16] [steps]   (defaults: f32 50)\n", argv[0]);
    return 2;
}
