/*
 * bench.c -- the reference workloads through stepgraph, eager against
 * every compiled mode, timed as WORKLOADS.md times PyTorch: a host loop of
 * `steps` steps (sg_mark_step_begin + sg_call each) synchronized at the end,
 * median of `loops` loops, after 3 warm-up calls and 20 untimed steps.
 * first_s is the wall time of the first three calls (capture, fusion,
 * compile or cache load, planning, graph recording).
 *
 *   bench [--backend auto|cpu|cuda] [--modes m1,m2] [workload ...]   workloads: w1s w1l w2
 *
 * W1: 6 x (y = tanh(sin(y) * 1.01 + 0.1)), 24 ops, f32, 4096 (w1s) or 16M
 * (w1l) elements. W2: 8 x (linear 1024 -> 1024 + gelu_tanh), batch 1, bf16 on
 * a GPU (as WORKLOADS.md), f32 on the CPU. Besides the table, one line per
 * figure starts with "RESULT" for bench/run.sh to merge with PyTorch's.
 */
#define _POSIX_C_SOURCE 200809L
#include <stepgraph.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static sg_status w1_step(sg_ctx *ctx, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)user;
    sg_tensor *y = in[0];
    for (int i = 0; i < 6; i++) y = sg_tanh(sg_add_scalar(sg_mul_scalar(sg_sin(y), 1.01), 0.1));
    out[0] = y;
    return y ? SG_OK : sg_ctx_status(ctx);
}

typedef struct mlp {
    sg_tensor *w[8], *b[8];
} mlp;

static sg_status w2_step(sg_ctx *ctx, sg_tensor *const *in, sg_tensor **out, void *user) {
    mlp *m = user;
    sg_tensor *h = in[0];
    for (int l = 0; l < 8; l++) h = sg_gelu_tanh(sg_linear(h, m->w[l], m->b[l]));
    out[0] = h;
    return h ? SG_OK : sg_ctx_status(ctx);
}

static sg_tensor *randn(sg_ctx *ctx, sg_dtype dt, int ndim, const int64_t *shape, float scale,
                        unsigned *seed) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    float *buf = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) {
        *seed = *seed * 1664525u + 1013904223u;
        buf[i] = scale * ((float)(*seed >> 8) / 16777216.0f * 2.0f - 1.0f);
    }
    sg_tensor *t = sg_from_host(ctx, SG_F32, ndim, shape, buf), *c = t;
    free(buf);
    if (t && dt != SG_F32) {
        c = sg_cast(t, dt);
        sg_release(t);
    }
    return c;
}

typedef struct result {
    double us, first_s, peak_mib;
    int ok;
} result;

static result time_mode(sg_ctx *ctx, sg_step_fn step, void *user, sg_tensor *x, sg_mode mode,
                        int steps, int loops) {
    result r = {0, 0, 0, 0};
    sg_fn *fn;
    sg_tensor *y;
    sg_ctx_reset_peak_memory(ctx);
    if (sg_compile(ctx, step, user, 1, 1, &(sg_compile_opts){.mode = mode}, &fn) != SG_OK) return r;
    double t0 = now();
    for (int i = 0; i < 3; i++) {
        sg_mark_step_begin(ctx);
        if (sg_call(fn, &x, 1, &y, 1) != SG_OK) goto done;
    }
    if (sg_ctx_synchronize(ctx) != SG_OK) goto done;
    r.first_s = now() - t0;
    for (int i = 0; i < 20 && i < steps; i++) {
        sg_mark_step_begin(ctx);
        sg_call(fn, &x, 1, &y, 1);
    }
    double per[16];
    for (int l = 0; l < loops; l++) {
        t0 = now();
        for (int i = 0; i < steps; i++) {
            sg_mark_step_begin(ctx);
            if (sg_call(fn, &x, 1, &y, 1) != SG_OK) goto done;
        }
        if (sg_ctx_synchronize(ctx) != SG_OK) goto done;
        per[l] = (now() - t0) / steps * 1e6;
    }
    qsort(per, (size_t)loops, sizeof per[0], cmp_double);
    r.us = per[loops / 2];
    r.ok = 1;
    sg_memory_stats ms;
    if (sg_ctx_memory_stats(ctx, &ms) == SG_OK)
        r.peak_mib = (double)ms.device_peak_bytes / (1 << 20);
done:
    if (!r.ok) fprintf(stderr, "  %s: %s\n", sg_mode_name(mode), sg_last_error(ctx));
    sg_fn_destroy(fn);
    return r;
}

/* "stepgraph", or "stepgraph-warm" when SG_BENCH_TAG=warm (a second run
 * over the same disk cache: first_s is then the warm-cache first call). */
static const char *tag = "stepgraph";
/* --modes: a comma list of mode names (default: every mode). */
static const char *modes_arg;

static bool mode_wanted(sg_mode m) {
    if (!modes_arg) return true;
    const char *name = sg_mode_name(m), *p = modes_arg;
    size_t n = strlen(name);
    while (*p) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && strncmp(p, name, n) == 0) return true;
        p += len + (e != NULL);
    }
    return false;
}

static void run(sg_ctx *ctx, const char *name, sg_step_fn step, void *user, sg_tensor *x, int steps,
                int loops) {
    /* Eager first: the others are compared with it. */
    static const sg_mode order[5] = {SG_MODE_EAGER, SG_MODE_DEFAULT, SG_MODE_REDUCE_OVERHEAD,
                                     SG_MODE_MAX_AUTOTUNE, SG_MODE_MAX_AUTOTUNE_NO_GRAPHS};
    result res[5];
    for (int k = 0; k < 5; k++) {
        sg_mode m = order[k];
        res[m] = mode_wanted(m) ? time_mode(ctx, step, user, x, m, steps, loops) : (result){0};
    }
    for (int k = 0; k < 5; k++) {
        sg_mode m = order[k];
        if (!mode_wanted(m)) continue;
        if (!res[m].ok) {
            printf("| %-4s | %-26s | failed |\n", name, sg_mode_name(m));
            continue;
        }
        char vs[16] = "    -";
        if (res[SG_MODE_EAGER].ok)
            snprintf(vs, sizeof vs, "%5.2fx", res[SG_MODE_EAGER].us / res[m].us);
        printf("| %-4s | %-26s | %12.1f | %8.3f | %8s | %9.1f |\n", name, sg_mode_name(m),
               res[m].us, res[m].first_s, vs, res[m].peak_mib);
    }
    for (int k = 0; k < 5; k++)
        if (res[order[k]].ok)
            fprintf(stderr, "RESULT %s %s %s %.2f %.4f %.0f\n", tag, name,
                    sg_mode_name(order[k]), res[order[k]].us, res[order[k]].first_s,
                    res[order[k]].peak_mib * (1 << 20));
}

static int wanted(int argc, char **argv, const char *w) {
    int named = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--backend") == 0 || strcmp(argv[i], "--modes") == 0) {
            i++;
            continue;
        }
        named = 1;
        if (strcmp(argv[i], w) == 0) return 1;
    }
    return !named;
}

/* One context per workload, so that its peak memory is its own. */
static sg_ctx *new_ctx(sg_backend want) {
    sg_ctx *ctx;
    sg_status st = sg_ctx_create(&(sg_ctx_opts){.backend = want}, &ctx);
    if (st != SG_OK && want == SG_BACKEND_AUTO)
        st = sg_ctx_create(&(sg_ctx_opts){.backend = SG_BACKEND_CPU}, &ctx);
    if (st != SG_OK) {
        fprintf(stderr, "bench: %s\n", sg_last_error(NULL));
        exit(1);
    }
    return ctx;
}

int main(int argc, char **argv) {
    sg_backend want = SG_BACKEND_AUTO;
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], "--modes") == 0) modes_arg = argv[i + 1];
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], "--backend") == 0)
            want = strcmp(argv[i + 1], "cuda") == 0  ? SG_BACKEND_CUDA
                   : strcmp(argv[i + 1], "cpu") == 0 ? SG_BACKEND_CPU
                                                     : SG_BACKEND_AUTO;
    sg_ctx *ctx = new_ctx(want);
    bool gpu = sg_ctx_backend(ctx) == SG_BACKEND_CUDA;
    unsigned seed = 1234;
    printf("stepgraph %s, %s backend\n\n", sg_version(), sg_backend_name(sg_ctx_backend(ctx)));
    const char *t = getenv("SG_BENCH_TAG");
    if (t && *t) {
        static char buf[64];
        snprintf(buf, sizeof buf, "stepgraph-%s", t);
        tag = buf;
    }
    printf(
        "| work | mode                       | us per step  | first_s  | vs eager | peak MiB  |\n");
    printf(
        "|------|----------------------------|--------------|----------|----------|-----------|\n");
    if (wanted(argc, argv, "w1s")) {
        int64_t s[1] = {4096};
        sg_tensor *x = randn(ctx, SG_F32, 1, s, 1.0f, &seed);
        run(ctx, "W1s", w1_step, NULL, x, 200, 5);
        sg_release(x);
    }
    if (wanted(argc, argv, "w1l")) {
        sg_ctx_destroy(ctx);
        ctx = new_ctx(want);
        int64_t s[1] = {16 << 20};
        sg_tensor *x = randn(ctx, SG_F32, 1, s, 1.0f, &seed);
        /* 16M elements: fewer steps on a CPU */
        run(ctx, "W1l", w1_step, NULL, x, gpu ? 200 : 5, gpu ? 5 : 3);
        sg_release(x);
    }
    if (wanted(argc, argv, "w2")) {
        sg_ctx_destroy(ctx);
        ctx = new_ctx(want);
        mlp m;
        int64_t ws[2] = {1024, 1024}, bs[1] = {1024}, xs[2] = {1, 1024};
        sg_dtype dt = gpu ? SG_BF16 : SG_F32;
        for (int l = 0; l < 8; l++) {
            m.w[l] = randn(ctx, dt, 2, ws, 0.03125f, &seed);
            m.b[l] = randn(ctx, dt, 1, bs, 0.01f, &seed);
        }
        sg_tensor *x = randn(ctx, dt, 2, xs, 1.0f, &seed);
        run(ctx, "W2", w2_step, &m, x, 200, 5);
    }
    sg_ctx_destroy(ctx);
    return 0;
}
