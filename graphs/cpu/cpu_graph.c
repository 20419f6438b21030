/* SPDX-License-Identifier: MIT */
/*
 * cpu_graph.c -- compiled captures on the CPU: the fused groups become one
 * C + OpenMP translation unit (codegen/cgen_c.c), compiled by the system C
 * compiler through the disk cache and loaded with dlopen. A replay calls its
 * sg_step (REDUCE_OVERHEAD, MAX_AUTOTUNE: every kernel in one parallel
 * region) or its kernels one by one (DEFAULT, MAX_AUTOTUNE_NO_GRAPHS); the
 * MAX_AUTOTUNE modes pick the thread count on the real buffers.
 */
#include "../comm.h"
#include "../graphs.h"

#include <stdio.h>
#include <time.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

static int run_node_cb(void *p, int node) {
    sg__graph *g = p;
    return (int)g->ctx->exec.run(g->ctx, &g->nodes[node]);
}

static sg_status cpu_compile(sg_fn *fn, sg__graph *g) {
    sg_ctx *ctx = fn->ctx;
    sg__emit e = {.ctx = ctx};
    sg_status s = sg__cgen_c(ctx, &g->ir, &g->fused, g->module, &e);
    if (s == SG_OK) s = sg__cache_build_c(ctx, g->module, e.buf, &g->mod);
    if (s == SG_OK) sg__graph_log_source(fn, g, e.buf);
    sg__emit_free(&e);
    if (s != SG_OK) return s;
    g->step_fn = (sg__step_entry)(uintptr_t)sg__module_sym(g->mod, "sg_step");
    g->kernel_fn = (sg__kernel_entry)(uintptr_t)sg__module_sym(g->mod, "sg_kernel");
    if (!g->step_fn || !g->kernel_fn)
        return sg__fail(ctx, SG_ERR_COMPILE, "codegen: %s lacks sg_step or sg_kernel", g->module);
    g->one_by_one = fn->opts.mode == SG_MODE_DEFAULT || fn->opts.mode == SG_MODE_MAX_AUTOTUNE_NO_GRAPHS;
    g->tune = fn->opts.mode == SG_MODE_MAX_AUTOTUNE || fn->opts.mode == SG_MODE_MAX_AUTOTUNE_NO_GRAPHS;
    return SG_OK;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int run_compiled(sg__graph *g) {
    sg__rt rt = {.ctx = g, .run_node = run_node_cb};
#ifdef _OPENMP
    int saved = omp_get_max_threads();
    if (g->threads > 0) omp_set_num_threads(g->threads);
#endif
    int rc = 0;
    if (g->one_by_one)
        for (int k = 0; k < g->fused.ngroups && rc == 0; k++) rc = g->kernel_fn(k, g->slotp, &rt);
    else
        rc = g->step_fn(g->slotp, &rt);
#ifdef _OPENMP
    if (g->threads > 0) omp_set_num_threads(saved);
#endif
    return rc;
}

/* The tuning remembered beside the compiled unit in the disk cache (a
 * checksummed note at path: a damaged one reads as none and is written
 * again), or 0. */
static int tuned_threads(const char *path) {
    char body[64];
    int threads = 0;
    if (!sg__note_read(path, body, sizeof body) || sscanf(body, "threads=%d", &threads) != 1)
        threads = 0;
    return threads;
}

/*
 * Time the replay with a few thread counts on the real buffers and keep the
 * fastest. Only for captures that write no input or parameter: running
 * them again must not change anything the user can see.
 */
static void autotune(sg_fn *fn, sg__graph *g) {
    g->tune = false;
#ifdef _OPENMP
    /* force_disable_caches reads no pick; the one made is still written
     * beside the unit, as the unit itself is. */
    char path[4200];
    snprintf(path, sizeof path, "%s/tune.txt", sg__module_path(g->mod));
    int known = fn->opts.force_disable_caches ? 0 : tuned_threads(path);
    if (known > 0) {
        g->threads = known;
        return;
    }
    if (sg__comm_in_ir(&g->ir)) {
        sg__log(fn->ctx, "perf_hints", "fn '%s': max-autotune skipped: the step runs "
                "collectives, which every rank must run the same number of times", fn->name);
        return;
    }
    for (int s = 0; s < g->ir.nslots; s++)
        if (g->ir.slots[s].mutated_by >= 0) {
            sg__log(fn->ctx, "perf_hints", "fn '%s': max-autotune skipped: the step writes its "
                    "inputs or parameters in place, so it cannot be run again to time it", fn->name);
            return;
        }
    int max = omp_get_max_threads(), cand[3] = {1, max / 2, max}, best = 0;
    double best_t = 1e30;
    for (int c = 0; c < 3; c++) {
        if (cand[c] < 1 || (c > 0 && cand[c] == cand[c - 1])) continue;
        g->threads = cand[c];
        run_compiled(g); /* warm */
        double t0 = now_s();
        for (int r = 0; r < 3; r++) run_compiled(g);
        double t = now_s() - t0;
        if (t < best_t) best_t = t, best = cand[c];
    }
    g->threads = best;
    sg__log(fn->ctx, "perf_hints", "fn '%s': max-autotune picked %d threads (%.1f us per replay)",
            fn->name, best, best_t / 3 * 1e6);
    /* Remember it beside the unit. */
    char body[64];
    snprintf(body, sizeof body, "threads=%d\n", best);
    sg__note_write(path, body);
#else
    (void)fn;
#endif
}

static sg_status cpu_run(sg_fn *fn, sg__graph *g, int set) {
    (void)set;
    if (g->tune) autotune(fn, g);
    int rc = run_compiled(g);
    return rc == 0 ? SG_OK : (sg_status)rc;
}

static void cpu_release(sg_ctx *ctx, sg__graph *g) {
    sg__module_free(ctx, g->mod);
    g->mod = NULL;
    g->step_fn = NULL;
    g->kernel_fn = NULL;
}

const sg__graph_ops sg__cpu_graph_ops = {cpu_compile, cpu_run, cpu_release, NULL, NULL, false};
