/* SPDX-License-Identifier: MIT */
/*
 * cuda_graph.c -- compiled captures on CUDA. The capture is fused again
 * with the CUDA options (no prologues before library anchors), and the
 * groups become one CUDA unit (codegen/cgen_cuda.c) compiled by NVRTC for
 * the device's arch through the disk cache. The generator returns a launch
 * table: per group, its kernel, grid and block, and whether the kernel
 * computes the anchor itself (the GEMV of a small matmul). Anchors it does
 * not compute (reductions, rows, large matmuls) and opaque nodes run the
 * eager kernel families, then the group's kernel runs its epilogue; the data
 * ops the generator emits (embedding, index_select, concat, index_copy_) run
 * as its kernels, their indices checked on the host first when no graph is
 * being recorded, as the eager kernels do. Every
 * generated kernel reads its tensors through a table of base addresses in
 * device memory: its own (the addresses of the slots it uses, in its local
 * numbering, so that one kernel serves every layer), or the capture-wide
 * one (slot s at entry s) for kernels with too many slots. One device array
 * per output set holds the capture-wide table followed by every launch's
 * own, so a replay needs no per-kernel argument beyond a pointer into it.
 *
 * REDUCE_OVERHEAD and MAX_AUTOTUNE replay a CUDA graph per output set: the
 * first replay of a set runs the kernels directly (it sizes scratch
 * buffers), the second records them by stream capture and instantiates
 * the graph, and later ones are one cuGraphLaunch. When the slot addresses
 * change (an input at a new address), the table is rewritten and the graph
 * re-recorded and patched in place with cuGraphExecUpdate. Stream capture is
 * used rather than building nodes one by one because the matmul anchors run
 * inside cuBLASLt, whose kernels only a capture can see. DEFAULT and
 * MAX_AUTOTUNE_NO_GRAPHS launch the kernels one by one. Any failure to
 * record, instantiate or update falls back to launching (logged once).
 * A recording puts the groups on up to SG_CUDA_LANES streams (exec.h:
 * lanes), each group waiting only for the groups whose bytes it shares at
 * the set's addresses (graphs/lanes.c), so the graph has branches where the
 * step has independent work; what a group's library part did at its last
 * run decides whether it shares the library's scratch (LIB_*).
 * The MAX_AUTOTUNE modes time 128, 256 and 512 threads per block for each
 * generated kernel at the first replay, with events on the real buffers;
 * what the step writes in its inputs and parameters is copied aside before
 * and put back after, so tuning changes no value the caller sees. The same
 * run picks each cuBLASLt call's algorithm, and GEMV or cuBLASLt for
 * products of few rows, by timing (cublaslt.c); the picks of both kinds are
 * remembered in one tune file per unit and device. MAX_AUTOTUNE then
 * replays the recorded step with the picks and with the defaults and keeps
 * the faster graph (check_step): picks timed alone can lose in the replay.
 *
 * On HIP the unit is generated in the HIP dialect, whose MATMUL groups are
 * generated GEMM kernels (codegen/cgen_gemm.c: HIP has no BLAS library
 * path, see sg__hip_blaslt_note, logged once per process); so are CUDA's
 * small f32 products (at most 4M multiply-adds) and, with
 * SG_CUDA_GEMM=generated, all of them, where cuBLASLt runs them otherwise.
 */
#include "../comm.h"
#include "../graphs.h"
#include "cublaslt.h"

#include <stdio.h>

/* ------------------------------------------------------------ the tune file (no device) */

bool sg__tune_parse(const char *body, sg__tune_block *b, int maxb, int *nb, sg__lt_pick *p,
                    int maxp, int *np) {
    *nb = *np = 0;
    for (const char *q = body;;) {
        while (*q == ' ' || *q == '\n') q++;
        if (!*q) return true;
        int used = 0, k, t;
        bool ok;
        if (*q == 'l') {
            ok = *np < maxp && sg__lt_pick_parse(q, &p[*np], &used);
            *np += ok;
        } else {
            ok = *nb < maxb && sscanf(q, "%d %d%n", &k, &t, &used) == 2;
            if (ok) b[(*nb)++] = (sg__tune_block){k, t};
        }
        q += used;
        if (!ok || (*q != '\n' && *q != '\0')) {
            *nb = *np = 0;
            return false;
        }
    }
}

#ifdef SG_HAVE_CUDA_HEADERS
#include "cuda.h"

#include <limits.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

typedef struct set_state {
    CUdeviceptr table; /* ntable device pointers */
    char **addrs;      /* the addresses the table and graph hold */
    CUgraphExec exec;
    int runs; /* replays into this set so far */
} set_state;

enum { STAMP_F = 8, STAMP_WARM = 5 }; /* SG_CUDA_STAMPS (stamped_launch) */

typedef struct cu_graph {
    CUmodule *mods; /* the unit's parts (unit_parts), loaded */
    int nmods;
    CUfunction *kfn;       /* per group, NULL without a generated kernel */
    sg__cuda_kinfo *kinfo; /* per group: kernel name, launch, whether it replaces the call */
    int ngroups, nslots;
    int ntable;  /* entries of a set's table: nslots, then the launches' own */
    int *argoff; /* per group: the entry its kernel's table starts at */
    bool *took;  /* per group: its last run's cuBLASLt call computed the epilogue,
                    so its kernel did not run (sg__group.lib_epi) */
    set_state *sets;
    int nsets;
    bool use_graph, said;
    bool tune;            /* MAX_AUTOTUNE*: time block sizes at the first replay */
    bool lt;              /* MAX_AUTOTUNE* with products: cuBLASLt's picks apply */
    bool check;           /* MAX_AUTOTUNE: replay the tuned and the default graph once */
    unsigned *dgrid, *dblock; /* per group: the generator's launch, before any tuning */
    char tune_path[1024]; /* where the picks are remembered ("" when nowhere) */
    int stamp_want;       /* SG_CUDA_STAMPS when the unit was generated (0: none) */
    int stamp_runs;       /* SG_CUDA_STAMPS: replays read back so far */
    double *stamp_acc;    /* per group: STAMP_F sums over the counted replays */
    /* Branches (record_exec): SG_CUDA_LANES when the unit was built (1:
     * one stream), what each group's library part did at its last run
     * (LIB_*), whether a recording saw one do more than its plan assumed,
     * and the events the branches wait on (per group; the fork and the
     * lanes' joins). */
    int lanes_want;
    int said_lanes, said_waits; /* the last recording's streams (0: none yet) and waits */
    int said_high;              /* its kernels on the streams of greatest priority (-1: no
                                   priorities) */
    unsigned char *lib;         /* per group */
    bool lib_grew, lanes_off;
    bool prio; /* the last recording's lanes by priority: instantiate with node priorities */
    CUevent *ev;
    CUevent lane_ev[SG__CUDA_LANES];
} cu_graph;

/* What a group's library part did at its last run: nothing (none, or the
 * generated kernel computes it), only cuBLASLt (a lane's own workspace
 * serves), or kernels, copies or scratch of the library's families (one
 * such group at a time: they share the op scratch and their kernels'
 * counters). */
enum { LIB_NONE = 0, LIB_BLAS = 1, LIB_FAMILY = 2 };

static const sg__cu_api *api(const sg_ctx *ctx) { return sg__cuda_api(ctx); }

static void release(sg_ctx *ctx, sg__graph *g) {
    cu_graph *cg = g->dev;
    if (!cg) return;
    const sg__cu_api *cu = api(ctx);
    for (int s = 0; s < cg->nsets; s++) {
        if (cg->sets[s].exec) cu->cuGraphExecDestroy(cg->sets[s].exec);
        if (cg->sets[s].table) cu->cuMemFree_v2(cg->sets[s].table);
        sg__free(ctx, cg->sets[s].addrs, sizeof(char *) * (size_t)(cg->ntable ? cg->ntable : 1));
    }
    sg__free(ctx, cg->sets, sizeof *cg->sets * (size_t)(cg->nsets ? cg->nsets : 1));
    for (int m = 0; m < cg->nmods; m++)
        if (cg->mods[m]) cu->cuModuleUnload(cg->mods[m]);
    sg__free(ctx, cg->mods, sizeof *cg->mods * (size_t)(cg->nmods ? cg->nmods : 1));
    sg__free(ctx, cg->kfn, sizeof *cg->kfn * (size_t)(cg->ngroups ? cg->ngroups : 1));
    sg__free(ctx, cg->kinfo, sizeof *cg->kinfo * (size_t)(cg->ngroups ? cg->ngroups : 1));
    sg__free(ctx, cg->argoff, sizeof *cg->argoff * (size_t)(cg->ngroups ? cg->ngroups : 1));
    sg__free(ctx, cg->took, sizeof *cg->took * (size_t)(cg->ngroups ? cg->ngroups : 1));
    sg__free(ctx, cg->dgrid, sizeof *cg->dgrid * (size_t)(cg->ngroups ? cg->ngroups : 1));
    sg__free(ctx, cg->dblock, sizeof *cg->dblock * (size_t)(cg->ngroups ? cg->ngroups : 1));
    if (cg->stamp_acc)
        sg__free(ctx, cg->stamp_acc,
                 sizeof(double) * STAMP_F * (size_t)(cg->ngroups ? cg->ngroups : 1));
    sg__free(ctx, cg->lib, sizeof *cg->lib * (size_t)(cg->ngroups ? cg->ngroups : 1));
    for (int k = 0; cg->ev && k < cg->ngroups; k++)
        if (cg->ev[k]) cu->cuEventDestroy_v2(cg->ev[k]);
    if (cg->ev) sg__free(ctx, cg->ev, sizeof *cg->ev * (size_t)cg->ngroups);
    for (int l = 0; l < SG__CUDA_LANES; l++)
        if (cg->lane_ev[l]) cu->cuEventDestroy_v2(cg->lane_ev[l]);
    sg__free(ctx, cg, sizeof *cg);
    g->dev = NULL;
}

/* The file beside the kernel cache that remembers max-autotune's picks for
 * this unit on this device: cu-tune-<sha256 of the source, the device and
 * the file's version>. Version 2 added cuBLASLt's picks: a file of version
 * 1 (block sizes only) is not read, so that those calls get timed. A
 * cache that cannot be used leaves the picks unremembered, no failure; host
 * memory running out on the way is the call's SG_ERR_OOM. */
static sg_status tune_path(sg_ctx *ctx, const char *name, const char *src, cu_graph *cg) {
    char root[PATH_MAX], hex[65];
    sg__cuda_device dev = *sg__cuda_device_of(ctx);
    cg->tune_path[0] = '\0';
    sg_status before = ctx->status;
    char msg[SG__MSG_SIZE];
    snprintf(msg, sizeof msg, "%s", ctx->msg);
    sg_status rs = sg__cache_root(ctx, name, root, sizeof root);
    if (rs == SG_ERR_OOM) return rs;
    ctx->status = before; /* no remembered picks is no failure */
    snprintf(ctx->msg, sizeof ctx->msg, "%s", msg);
    if (rs != SG_OK) return SG_OK;
    sg__sha256_ctx sh;
    uint8_t d[32];
    sg__sha256_init(&sh);
    sg__sha256_update(&sh, src, strlen(src));
    sg__sha256_update(&sh, dev.name, strlen(dev.name));
    sg__sha256_update(&sh, &dev.sms, sizeof dev.sms);
    sg__sha256_update(&sh, "tune-v2", 7);
    sg__sha256_final(&sh, d);
    sg__sha256_hex(d, hex);
    if (snprintf(cg->tune_path, sizeof cg->tune_path, "%s/cu-tune-%s.txt", root, hex) >=
        (int)sizeof cg->tune_path)
        cg->tune_path[0] = '\0';
    return SG_OK;
}

/* The most picks of each kind a tune file holds (a note is at most 4 KiB). */
#define TUNE_MAX 128

/* The block line that says how check_step ended: group -1, then 0 (the
 * defaults stay) or 1 (the picks stay). */
#define TUNE_CHECKED (-1)

/* Apply remembered picks (a checksummed note of block-size lines and
 * cuBLASLt pick lines, see sg__tune_parse): 1 when all applied, 0 when
 * there are none to apply (tuning runs), -1 when memory ran out (the
 * context's status set). A remembered whole-step check is not made again;
 * where the defaults won it, they are what is applied. */
static int tune_load(sg_ctx *ctx, cu_graph *cg) {
    char body[4096];
    if (!cg->tune_path[0] || !sg__note_read(cg->tune_path, body, sizeof body)) return 0;
    sg__tune_block b[TUNE_MAX];
    sg__lt_pick p[TUNE_MAX];
    int nb = 0, np = 0, checked = -1;
    bool ok = sg__tune_parse(body, b, TUNE_MAX, &nb, p, TUNE_MAX, &np);
    for (int i = 0; ok && i < nb; i++)
        if (b[i].group == TUNE_CHECKED) checked = b[i].threads != 0;
    if (ok && checked == 0) { /* the defaults: nothing to apply */
        cg->check = cg->lt = false;
        return 1;
    }
    for (int i = 0; ok && i < nb; i++) {
        int k = b[i].group, threads = b[i].threads;
        if (k == TUNE_CHECKED) continue;
        int t = threads == 128 ? 0 : threads == 256 ? 1 : threads == 512 ? 2 : -1;
        ok = k >= 0 && k < cg->ngroups && t >= 0 && cg->kinfo[k].tune_grid[t];
        if (ok) {
            cg->kinfo[k].block = (unsigned)threads;
            cg->kinfo[k].grid = cg->kinfo[k].tune_grid[t];
        }
    }
    int set = ok && np > 0 ? sg__lt_picks_set(ctx, p, np) : 1;
    if (set < 0) return -1;
    ok = ok && set > 0;
    if (ok && checked == 1) cg->check = false;
    return ok && nb + np > 0;
}

/* Add how check_step ended to the remembered picks. */
static void tune_checked(const cu_graph *cg, bool picks) {
    char body[4096];
    if (!cg->tune_path[0] || !sg__note_read(cg->tune_path, body, sizeof body)) return;
    size_t n = strlen(body);
    if (n + 16 >= sizeof body) return;
    snprintf(body + n, sizeof body - n, "%d %d\n", TUNE_CHECKED, picks ? 1 : 0);
    sg__note_write(cg->tune_path, body);
}

/* Remember the picks, block sizes then cuBLASLt's (replaced atomically);
 * picks past what a note holds are left out (their calls keep defaults). */
static void tune_save(const cu_graph *cg, const sg__lt_pick *picks, int npicks) {
    char body[4096];
    size_t n = 0;
    if (!cg->tune_path[0]) return;
    for (int k = 0; k < cg->ngroups && n < sizeof body - 32; k++)
        if (cg->kfn[k] && cg->kinfo[k].tune_grid[0])
            n += (size_t)snprintf(body + n, sizeof body - n, "%d %u\n", k, cg->kinfo[k].block);
    for (int i = 0; i < npicks; i++) {
        int w = sg__lt_pick_format(&picks[i], body + n, sizeof body - n);
        if (w < 0) break;
        n += (size_t)w;
    }
    body[n] = '\0';
    if (n) sg__note_write(cg->tune_path, body);
}

/* SG_CUDA_LANES: how many streams a recording may put groups on (1 to
 * SG__CUDA_LANES; 1: one chain in capture order). */
static int lanes_env(void) {
    const char *e = getenv("SG_CUDA_LANES");
    int n = e && *e ? atoi(e) : SG__CUDA_LANES;
    return n < 1 ? 1 : n > SG__CUDA_LANES ? SG__CUDA_LANES : n;
}

/* SG_CUDA_REUSE_GAP=N: groups after a buffer's last use before the pool
 * lends its bytes to another (sg__graph.reuse_gap). */
static int reuse_gap_env(void) {
    const char *e = getenv("SG_CUDA_REUSE_GAP");
    int n = e && *e ? atoi(e) : 0;
    return n < 0 ? 0 : n > 64 ? 64 : n;
}

/* Whether the step has products (cuBLASLt's algorithms to pick). */
static bool has_matmul(const sg__graph *g) {
    for (int i = 0; i < g->ir.nnodes; i++)
        if (sg__op_family(g->ir.nodes[i].op) == SG__FAM_MATMUL) return true;
    return false;
}

/* On HIP, once per process: a MATMUL group ran as the generated GEMM, and why. */
static void hip_gemm_note(sg_ctx *ctx, const sg__graph *g, const sg__cuda_kinfo *ki) {
    static atomic_flag said = ATOMIC_FLAG_INIT;
    bool gemm = false;
    for (int k = 0; k < g->fused.ngroups; k++)
        gemm = gemm || (g->fused.groups[k].kind == SG__G_MATMUL && ki[k].replaces_call);
    if (!gemm || atomic_flag_test_and_set(&said)) return;
    char line[400];
    sg__hip_blaslt_note(line, sizeof line);
    sg__log(ctx, "fallbacks", "%s", line);
}

/* Compile the unit in src and load it: as one program named after the
 * graph's module, or, when it is large, in parts (sg__unit_split) compiled
 * on threads as <module>_<part>. (*part)[k] is the module of group k's
 * kernel. */
static sg_status build_parts(sg_ctx *ctx, sg__graph *g, cu_graph *cg, const char *src, int **part) {
    const sg__cu_api *cu = api(ctx);
    sg__unit_parts u;
    sg_status s = sg__unit_split(ctx, src, cg->kinfo, cg->ngroups, sg__unit_max_parts(), &u);
    if (s != SG_OK) return s;
    int np = u.n;
    char names[SG__MAX_PARTS][sizeof g->module + 16];
    const char *nm[SG__MAX_PARTS];
    void *imgs[SG__MAX_PARTS] = {NULL};
    size_t sizes[SG__MAX_PARTS] = {0};
    cg->mods = sg__calloc(ctx, sizeof *cg->mods * (size_t)np);
    if (!cg->mods) s = sg__fail(ctx, SG_ERR_OOM, "cuda: out of host memory");
    if (s == SG_OK) {
        cg->nmods = np;
        for (int p = 0; p < np; p++) {
            snprintf(names[p], sizeof names[p], np == 1 ? "%s" : "%s_%d", g->module, p);
            nm[p] = names[p];
        }
        s = sg__cuda_rtc_build_many(ctx, np, nm, (const char *const *)u.src, np, imgs, sizes);
    }
    for (int p = 0; s == SG_OK && p < np; p++) {
        CUresult r = cu->cuModuleLoadData(&cg->mods[p], imgs[p]);
        if (r != CUDA_SUCCESS) s = sg__cu_fail(ctx, r, "cuModuleLoadData", names[p]);
    }
    if (s == SG_OK && np > 1)
        sg__log(ctx, "perf_hints", "%s: %d kernels (%zu KB of source) compiled as %d programs",
                g->module, u.kernels, u.text >> 10, np);
    for (int p = 0; p < np; p++)
        if (imgs[p]) sg__free(ctx, imgs[p], sizes[p]);
    *part = u.part, u.part = NULL; /* the caller's, ngroups entries */
    sg__unit_parts_free(ctx, &u);
    return s;
}

static sg_status compile(sg_fn *fn, sg__graph *g) {
    sg_ctx *ctx = fn->ctx;
    const sg__cu_api *cu = api(ctx);
    cu_graph *cg = sg__calloc(ctx, sizeof *cg);
    if (!cg) return sg__fail(ctx, SG_ERR_OOM, "cuda: out of host memory");
    g->dev = cg;
    cg->ngroups = g->fused.ngroups;
    cg->nslots = g->ir.nslots;
    cg->kfn = sg__calloc(ctx, sizeof *cg->kfn * (size_t)(cg->ngroups ? cg->ngroups : 1));
    cg->kinfo = sg__calloc(ctx, sizeof *cg->kinfo * (size_t)(cg->ngroups ? cg->ngroups : 1));
    cg->argoff = sg__calloc(ctx, sizeof *cg->argoff * (size_t)(cg->ngroups ? cg->ngroups : 1));
    cg->took = sg__calloc(ctx, sizeof *cg->took * (size_t)(cg->ngroups ? cg->ngroups : 1));
    cg->dgrid = sg__calloc(ctx, sizeof *cg->dgrid * (size_t)(cg->ngroups ? cg->ngroups : 1));
    cg->dblock = sg__calloc(ctx, sizeof *cg->dblock * (size_t)(cg->ngroups ? cg->ngroups : 1));
    cg->lib = sg__calloc(ctx, sizeof *cg->lib * (size_t)(cg->ngroups ? cg->ngroups : 1));
    if (!cg->kfn || !cg->kinfo || !cg->argoff || !cg->took || !cg->dgrid || !cg->dblock || !cg->lib)
        return sg__fail(ctx, SG_ERR_OOM, "cuda: out of host memory");
    sg__emit e = {.ctx = ctx};
    int nk = 0;
    bool hip = sg__cuda_is_hip(ctx);
    double t0 = sg__graph_clock(), t1 = t0;
    sg_status s = sg__cgen_gpu(ctx, &g->ir, &g->fused, g->module,
                               hip ? SG__DIALECT_HIP : SG__DIALECT_CUDA, &e, cg->kinfo, &nk);
    if (s == SG_OK && hip) hip_gemm_note(ctx, g, cg->kinfo);
    for (int k = 0; k < cg->ngroups; k++)
        cg->dgrid[k] = cg->kinfo[k].grid, cg->dblock[k] = cg->kinfo[k].block;
    int *part = NULL; /* per group with a kernel: the part whose module holds it */
    t1 = sg__graph_clock();
    /* cuBLASLt's load, on a thread while NVRTC works, when the step calls it. */
    for (int k = 0; s == SG_OK && !hip && k < cg->ngroups; k++)
        if (g->fused.groups[k].kind == SG__G_MATMUL && !cg->kinfo[k].replaces_call) {
            sg__cublaslt_prewarm(ctx, true);
            break;
        }
    if (s == SG_OK && nk > 0) s = build_parts(ctx, g, cg, e.buf, &part);
    if (s == SG_OK && nk > 0)
        sg__log(ctx, "perf_hints",
                "%s: %d kernels generated in %.1f ms; built (%s, or the disk cache) and "
                "loaded in %.1f ms",
                g->module, nk, (t1 - t0) * 1e3, hip ? "hiprtc" : "NVRTC",
                (sg__graph_clock() - t1) * 1e3);
    if (s == SG_OK && nk > 0) s = tune_path(ctx, g->module, e.buf, cg);
    if (s == SG_OK) sg__graph_log_source(fn, g, e.buf);
    sg__emit_free(&e);
    /* Each launch's own table follows the capture-wide one. */
    cg->ntable = cg->nslots;
    for (int k = 0; k < cg->ngroups; k++) {
        bool own = cg->kinfo[k].name[0] && cg->kinfo[k].nlocal >= 0;
        cg->argoff[k] = own ? cg->ntable : 0;
        cg->ntable += own ? cg->kinfo[k].nlocal : 0;
    }
    for (int k = 0; s == SG_OK && k < cg->ngroups; k++) {
        if (!cg->kinfo[k].name[0]) continue;
        CUresult r = cu->cuModuleGetFunction(&cg->kfn[k], cg->mods[part[k]], cg->kinfo[k].name);
        if (r != CUDA_SUCCESS) s = sg__cu_fail(ctx, r, "cuModuleGetFunction", cg->kinfo[k].name);
    }
    if (part) sg__free(ctx, part, sizeof *part * (size_t)cg->ngroups);
    cg->use_graph =
        fn->opts.mode == SG_MODE_REDUCE_OVERHEAD || fn->opts.mode == SG_MODE_MAX_AUTOTUNE;
    cg->stamp_want = hip ? 0 : sg__cuda_stamps(); /* read once: not on every replay */
    cg->lanes_want = hip ? 1 : lanes_env();
    /* Bytes a group frees are not the next few groups' to write: such a
     * write would wait for the last reader, however unhurried (a weight
     * gradient's product reads x, and the input gradient after it gets x's
     * bytes), and make it urgent in the lanes' plan (lanes.c). */
    g->reuse_gap = cg->use_graph && cg->lanes_want > 1 ? reuse_gap_env() : 0;
    cg->tune =
        fn->opts.mode == SG_MODE_MAX_AUTOTUNE || fn->opts.mode == SG_MODE_MAX_AUTOTUNE_NO_GRAPHS;
    cg->lt = cg->tune && has_matmul(g);
    cg->check = cg->tune && cg->use_graph && !sg__comm_in_ir(&g->ir);
    int loaded = s == SG_OK && cg->tune && !fn->opts.force_disable_caches ? tune_load(ctx, cg) : 0;
    if (loaded < 0) s = SG_ERR_OOM; /* said by sg__lt_picks_set */
    if (loaded > 0) {
        cg->tune = false;
        sg__log(ctx, "perf_hints", "fn '%s': max-autotune: the picks remembered in %s", fn->name,
                cg->tune_path);
    }
    /* Tuning runs the step once more: with collectives, the ranks would disagree. */
    if (cg->tune && sg__comm_in_ir(&g->ir)) {
        cg->tune = false;
        sg__log(ctx, "perf_hints", "fn '%s': max-autotune skipped: the step runs collectives, "
                "which every rank must run the same number of times", fn->name);
    }
    return s;
}

/* The library's part of group k: its anchor or opaque node, or -1. */
static int call_node(const sg__group *grp) {
    if (grp->kind == SG__G_OPAQUE) return grp->g[0].node;
    if (grp->anchor >= 0) return grp->g[grp->anchor].node;
    return -1;
}

/* The pointer kernel k receives: its own table in the set's array, or the
 * capture-wide one at the start of it. */
static CUdeviceptr table_of(const cu_graph *cg, const set_state *st, int k) {
    return st->table + sizeof(char *) * (size_t)cg->argoff[k];
}

/* Every group in order on the context's stream: the library's part (an
 * anchor or opaque node, unless the generated kernel computes it), then
 * the generated kernel. */
static sg_status launch_range(sg_ctx *ctx, sg__graph *g, set_state *st, int from, int to) {
    cu_graph *cg = g->dev;
    for (int k = from; k < to; k++) {
        const sg__group *grp = &g->fused.groups[k];
        const sg__cuda_kinfo *ki = &cg->kinfo[k];
        int node = call_node(grp);
        bool took = false; /* cuBLASLt computed the epilogue too (sg__group.lib_epi) */
        uint64_t ops0, scr0, ops1, scr1;
        sg__cuda_counts(ctx, &ops0, &scr0);
        if (node >= 0 && !ki->replaces_call && grp->kind == SG__G_MATMUL && grp->lib_epi) {
            sg_status s = sg__cuda_matmul_epi(ctx, &g->nodes[node], &g->nodes[grp->g[1].node],
                                              grp->lib_epi, grp->lib_res, grp->lib_aux, &took);
            if (s != SG_OK) return s;
        }
        if (node >= 0 && !ki->replaces_call && !took && grp->xent) {
            /* a cross_entropy's gradient and its loss (sg__group.xent) */
            sg_status s =
                sg__cuda_xent_pair(ctx, &g->nodes[node], &g->nodes[grp->g[grp->xent].node]);
            if (s != SG_OK) return s;
        } else if (node >= 0 && !ki->replaces_call && !took && grp->nbsum) {
            /* a norm's gradient and the column sum of it (sg__group.nbsum) */
            const sg__node *sum = &g->nodes[grp->g[grp->nbsum].node];
            bool done = false;
            sg_status s = sg__cuda_norm_bwd_sum(ctx, &g->nodes[node], sum, &done);
            if (s == SG_OK && !done) s = ctx->exec.run(ctx, sum);
            if (s != SG_OK) return s;
        } else if (node >= 0 && !ki->replaces_call && !took && grp->kind == SG__G_OPAQUE &&
                   grp->ncopies) {
            /* an attention and the copies of its K and V (sg__group.ncopies) */
            const sg__node *cps[2];
            int nc = grp->ncopies < 2 ? grp->ncopies : 2;
            for (int m = 0; m < nc; m++) cps[m] = &g->nodes[grp->g[grp->n - nc + m].node];
            sg_status s = sg__cuda_attn_copies(ctx, &g->nodes[node], cps, nc);
            if (s != SG_OK) return s;
        } else if (node >= 0 && !ki->replaces_call && !took) {
            sg_status s = ctx->exec.run(ctx, &g->nodes[node]);
            if (s != SG_OK) return s;
        }
        cg->took[k] = took;
        /* A data op run by a generated kernel: bad indices fail the call
         * before anything is written, as in the eager kernel. */
        if (grp->kind == SG__G_OPAQUE && ki->replaces_call) {
            sg_status s = sg__cuda_data_check(ctx, &g->nodes[node]);
            if (s != SG_OK) return s;
        }
        /* So do the K/V cache writes a GEMV kernel makes (sg__group.ncopies). */
        for (int m = grp->n - grp->ncopies; grp->kind == SG__G_MATMUL && m < grp->n; m++) {
            sg_status s = sg__cuda_data_check(ctx, &g->nodes[grp->g[m].node]);
            if (s != SG_OK) return s;
        }
        for (int m = 0; grp->kind == SG__G_MULTI && m < grp->nmembers; m++) {
            const sg__group *part = &g->fused.parts[grp->members[m]];
            sg_status s = part->kind == SG__G_OPAQUE
                              ? sg__cuda_data_check(ctx, &g->nodes[part->g[0].node])
                              : SG_OK;
            if (s != SG_OK) return s;
        }
        sg__cuda_counts(ctx, &ops1, &scr1);
        unsigned char lib = node < 0 || ki->replaces_call ? LIB_NONE
                            : ops1 > ops0 || scr1 > scr0  ? LIB_FAMILY
                                                          : LIB_BLAS;
        cg->lib_grew = cg->lib_grew || lib > cg->lib[k];
        cg->lib[k] = lib;
        if (!cg->kfn[k] || took) continue;
        unsigned grid[3] = {ki->grid, 1, 1}, block[3] = {ki->block, 1, 1};
        CUdeviceptr tab = table_of(cg, st, k);
        void *args[1] = {&tab};
        /* Generated kernels wait (griddepcontrol.wait) before they read
         * what earlier kernels wrote, so each may start early. */
        sg_status s = sg__cuda_launch(ctx, cg->kfn[k], grid, block, 0, args);
        if (s != SG_OK) return s;
    }
    return SG_OK;
}

static sg_status launch_all(sg_ctx *ctx, sg__graph *g, set_state *st) {
    return launch_range(ctx, g, st, 0, g->fused.ngroups);
}

/* Every entry of a set's table from the slot addresses: the capture-wide
 * part, then each launch's own entries. */
static void fill_table(const cu_graph *cg, char *const *slotp, char **addrs) {
    memcpy(addrs, slotp, sizeof(char *) * (size_t)cg->nslots);
    for (int k = 0; k < cg->ngroups; k++)
        if (cg->kinfo[k].name[0] && cg->kinfo[k].nlocal >= 0)
            for (int i = 0; i < cg->kinfo[k].nlocal; i++)
                addrs[cg->argoff[k] + i] = slotp[cg->kinfo[k].local[i]];
}

/* The set's slot table holds this call's addresses (rewritten if any moved). */
static sg_status table_for(sg_ctx *ctx, sg__graph *g, int set, set_state **out, bool *moved) {
    cu_graph *cg = g->dev;
    const sg__cu_api *cu = api(ctx);
    if (set >= cg->nsets) {
        set_state *ns = sg__calloc(ctx, sizeof *ns * (size_t)(set + 1));
        if (!ns) return sg__fail(ctx, SG_ERR_OOM, "cuda: out of host memory");
        if (cg->sets) {
            memcpy(ns, cg->sets, sizeof *ns * (size_t)cg->nsets);
            sg__free(ctx, cg->sets, sizeof *ns * (size_t)cg->nsets);
        }
        cg->sets = ns;
        cg->nsets = set + 1;
    }
    set_state *st = &cg->sets[set];
    size_t bytes = sizeof(char *) * (size_t)(cg->ntable ? cg->ntable : 1);
    *moved = false;
    if (!st->addrs) {
        st->addrs = sg__calloc(ctx, bytes);
        if (!st->addrs) return sg__fail(ctx, SG_ERR_OOM, "cuda: out of host memory");
        CUresult r = cu->cuMemAlloc_v2(&st->table, bytes);
        if (r != CUDA_SUCCESS) return sg__cu_fail(ctx, r, "cuMemAlloc", "a slot table");
        *moved = true;
    }
    if (memcmp(st->addrs, g->slotp, sizeof(char *) * (size_t)cg->nslots) != 0) *moved = true;
    if (*moved) {
        /* The host copy must outlive the async copy: st->addrs does. */
        fill_table(cg, g->slotp, st->addrs);
        CUresult r = cu->cuMemcpyHtoDAsync_v2(st->table, st->addrs, bytes, sg__cuda_stream(ctx));
        if (r != CUDA_SUCCESS) return sg__cu_fail(ctx, r, "cuMemcpyHtoDAsync", "a slot table");
    }
    *out = st;
    return SG_OK;
}

/* Bytes a ref reaches at this replay's addresses; false when none. */
static bool ref_span(const sg__graph *g, int ref, sg__span *out) {
    const sg__ref *f = &g->ir.refs[ref];
    const char *base = g->slotp[f->slot];
    if (!base) return false;
    int64_t lo = f->offset, hi = f->offset;
    for (int d = 0; d < f->ndim; d++) {
        if (f->shape[d] == 0) return false;
        int64_t span = (f->shape[d] - 1) * f->stride[d];
        if (span < 0)
            lo += span;
        else
            hi += span;
    }
    int64_t es = (int64_t)sg_dtype_size(f->dtype);
    out->lo = (uintptr_t)(base + lo * es);
    out->hi = (uintptr_t)(base + (hi + 1) * es);
    return true;
}

/* The spans of what group k reads and writes, appended to sp (cap of
 * them; false when they do not fit): each member's inputs (as written and
 * as cse forwards them) and output, a library family's scratch and a
 * kernel's own counters as resources (lanes.c). */
static bool group_spans(const sg__graph *g, const cu_graph *cg, int k, sg__span *sp, int cap,
                        int *nrd, int *nwr) {
    const sg__group *grp = &g->fused.groups[k];
    const int *alias = g->fused.alias;
    int nr = 0, nw = 0; /* reads from the front, writes from the back */
    int nparts = grp->kind == SG__G_MULTI ? grp->nmembers : 1;
    for (int p = 0; p < nparts; p++) {
        const sg__group *part = grp->kind == SG__G_MULTI ? &g->fused.parts[grp->members[p]] : grp;
        for (int m = 0; m < part->n; m++) {
            const sg__irnode *n = &g->ir.nodes[part->g[m].node];
            for (int i = 0; n->args >= 0 && i < n->nin; i++) {
                int r = g->ir.args[n->args + i];
                if (r < 0) continue;
                for (int a = 0; a < 2; a++) {
                    if (nr + nw + 1 > cap) return false;
                    nr += ref_span(g, a && alias ? alias[r] : r, &sp[nr]);
                }
            }
            if (nr + nw + 1 > cap) return false;
            nw += ref_span(g, n->out, &sp[cap - 1 - nw]);
        }
    }
    if (nr + nw + 2 > cap) return false;
    if (cg->lib[k] == LIB_FAMILY) sp[cap - 1 - nw++] = (sg__span){1, 2};
    for (int j = 0; cg->kfn[k] && j <= k; j++)
        if (cg->kfn[j] == cg->kfn[k]) { /* the first group of this kernel names it */
            uintptr_t r = 2 + (uintptr_t)j % (SG__LANE_RESOURCES - 2); /* shared: only more waits */
            sp[cap - 1 - nw++] = (sg__span){r, r + 1};
            break;
        }
    memmove(sp + nr, sp + cap - nw, sizeof *sp * (size_t)nw);
    *nrd = nr, *nwr = nw;
    return true;
}

/* The plan of this set's recording on lanes (lanes.c), with its streams,
 * events and the lanes' cuBLASLt workspaces made. */
static sg_status plan_lanes(sg_ctx *ctx, sg__graph *g, cu_graph *cg, sg__lanes *plan) {
    int n = cg->ngroups, cap = 0;
    for (int k = 0; k < n; k++) {
        const sg__group *grp = &g->fused.groups[k];
        int nparts = grp->kind == SG__G_MULTI ? grp->nmembers : 1;
        for (int p = 0; p < nparts; p++) {
            const sg__group *part =
                grp->kind == SG__G_MULTI ? &g->fused.parts[grp->members[p]] : grp;
            for (int m = 0; m < part->n; m++) cap += 1 + 2 * g->ir.nodes[part->g[m].node].nin;
        }
        cap += 2;
    }
    size_t bytes = sizeof(sg__span) * (size_t)(cap ? cap : 1);
    sg__span *sp = sg__alloc(ctx, bytes);
    sg__lane_use *use = sg__calloc(ctx, sizeof *use * (size_t)(n ? n : 1));
    sg_status s = sp && use ? SG_OK : sg__fail(ctx, SG_ERR_OOM, "cuda: out of host memory");
    for (int k = 0, at = 0; s == SG_OK && k < n; k++) {
        int nr = 0, nw = 0;
        if (!group_spans(g, cg, k, sp + at, cap - at, &nr, &nw))
            s = sg__fail(ctx, SG_ERR_INTERNAL, "cuda: group %d's spans outgrew their count", k);
        use[k] = (sg__lane_use){sp + at, sp + at + nr, nr, nw, false};
        at += nr + nw;
    }
    int nhigh = sg__cuda_lane_priority(ctx) && cg->lanes_want > SG__CUDA_LANES_HIGH
                    ? SG__CUDA_LANES_HIGH
                    : 0;
    if (s == SG_OK) s = sg__lanes_plan(ctx, n, use, cg->lanes_want, nhigh, plan);
    if (sp) sg__free(ctx, sp, bytes);
    if (use) sg__free(ctx, use, sizeof *use * (size_t)(n ? n : 1));
    if (s != SG_OK || plan->nlanes <= 1) return s;
    const sg__cu_api *cu = api(ctx);
    s = sg__cuda_lanes_make(ctx, plan->nlanes);
    if (s == SG_OK && !cg->ev && !(cg->ev = sg__calloc(ctx, sizeof *cg->ev * (size_t)n)))
        s = sg__fail(ctx, SG_ERR_OOM, "cuda: out of host memory");
    for (int k = 0; s == SG_OK && k < n; k++) {
        if (cg->lib[k] == LIB_BLAS) s = sg__cublaslt_lane_ready(ctx, plan->lane[k]);
        if (s == SG_OK && plan->post[k] && !cg->ev[k]) {
            CUresult r = cu->cuEventCreate(&cg->ev[k], CU_EVENT_DISABLE_TIMING);
            if (r != CUDA_SUCCESS)
                cg->ev[k] = NULL, s = sg__cu_fail(ctx, r, "cuEventCreate", "a branch");
        }
    }
    for (int l = 0; s == SG_OK && l < plan->nlanes; l++)
        if (!cg->lane_ev[l]) {
            CUresult r = cu->cuEventCreate(&cg->lane_ev[l], CU_EVENT_DISABLE_TIMING);
            if (r != CUDA_SUCCESS)
                cg->lane_ev[l] = NULL, s = sg__cu_fail(ctx, r, "cuEventCreate", "a branch");
        }
    return s;
}

/* Every group on its lane, inside a recording that began on lane 0: the
 * lanes fork from lane 0, each group first waits for the ends its plan
 * names, and every lane joins lane 0 at the end (also after a failure, so
 * that the recording can end). */
static sg_status launch_lanes(sg_ctx *ctx, sg__graph *g, set_state *st, const sg__lanes *plan) {
    cu_graph *cg = g->dev;
    const sg__cu_api *cu = api(ctx);
    CUstream l0 = sg__cuda_lane_stream(ctx, 0);
    CUresult r = cu->cuEventRecord(cg->lane_ev[0], l0);
    for (int l = 1; l < plan->nlanes && r == CUDA_SUCCESS; l++)
        r = cu->cuStreamWaitEvent(sg__cuda_lane_stream(ctx, l), cg->lane_ev[0], 0);
    sg_status s = SG_OK;
    for (int k = 0; k < cg->ngroups && r == CUDA_SUCCESS && s == SG_OK; k++) {
        int L = plan->lane[k];
        CUstream ls = sg__cuda_lane_stream(ctx, L);
        for (int m = 0; m < plan->nlanes && r == CUDA_SUCCESS; m++) {
            int w = plan->wait[(size_t)k * SG__LANES_MAX + m];
            if (w >= 0) r = cu->cuStreamWaitEvent(ls, cg->ev[w], 0);
        }
        sg__cuda_set_lane(ctx, L);
        if (r == CUDA_SUCCESS) s = launch_range(ctx, g, st, k, k + 1);
        sg__cuda_set_lane(ctx, 0);
        if (r == CUDA_SUCCESS && s == SG_OK && plan->post[k]) r = cu->cuEventRecord(cg->ev[k], ls);
    }
    CUresult rj = CUDA_SUCCESS;
    for (int l = 1; l < plan->nlanes; l++) {
        CUresult a = cu->cuEventRecord(cg->lane_ev[l], sg__cuda_lane_stream(ctx, l));
        if (a == CUDA_SUCCESS) a = cu->cuStreamWaitEvent(l0, cg->lane_ev[l], 0);
        if (rj == CUDA_SUCCESS) rj = a;
    }
    if (r == CUDA_SUCCESS) r = rj;
    if (s == SG_OK && r != CUDA_SUCCESS)
        s = sg__cu_fail(ctx, r, "cuEventRecord/cuStreamWaitEvent", "recording a graph's branches");
    return s;
}

/*
 * The small memset nodes of a recording as kernel nodes. cuBLASLt clears a
 * 4-byte word before some of its kernels (those with GELU epilogues, for
 * one), which stream capture records as a memset node; in a replay the GPU
 * idles ~3 us before such a node and ~4-5 us after it (W6's timeline,
 * bench/ktrace.c), where a kernel node between kernels costs ~1 us. Each
 * memset node of at most MEMSET_KERNEL_MAX bytes becomes sg_data_memset
 * (k_data.cu) with the same edges, their data kept; the kernel node is
 * wired in before the memset node goes, so a failure leaves a correct
 * graph. SG_CUDA_MEMSET_NODES=keep leaves them (for comparison). Not on
 * HIP: its table has no graph editing, and no library there records one.
 */
#define MEMSET_KERNEL_MAX ((size_t)1 << 20)

static bool memset_nodes_kept(void) {
    const char *e = getenv("SG_CUDA_MEMSET_NODES");
    return e && !strcmp(e, "keep");
}

/* The edges into (in) or out of node m: nodes and their data, calloc'ed
 * (*oom set when host memory ran out). */
static CUresult node_edges(sg_ctx *ctx, CUgraphNode m, bool in, CUgraphNode **nodes,
                           CUgraphEdgeData **data, size_t *n, bool *oom) {
    const sg__cu_api *cu = api(ctx);
    *nodes = NULL, *data = NULL, *n = 0;
    CUresult r = in ? cu->cuGraphNodeGetDependencies(m, NULL, NULL, n)
                    : cu->cuGraphNodeGetDependentNodes(m, NULL, NULL, n);
    if (r != CUDA_SUCCESS || *n == 0) return r;
    *nodes = sg__calloc(ctx, *n * sizeof **nodes);
    *data = sg__calloc(ctx, *n * sizeof **data);
    if (!*nodes || !*data) {
        *oom = true;
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return in ? cu->cuGraphNodeGetDependencies(m, *nodes, *data, n)
              : cu->cuGraphNodeGetDependentNodes(m, *nodes, *data, n);
}

/* Memset node m as a kernel node of func f (*did counts it; *oom as in
 * node_edges). */
static CUresult memset_as_kernel(sg_ctx *ctx, CUgraph graph, CUgraphNode m, void *f, int *did,
                                 bool *oom) {
    const sg__cu_api *cu = api(ctx);
    CUDA_MEMSET_NODE_PARAMS p;
    CUresult r = cu->cuGraphMemsetNodeGetParams(m, &p);
    if (r != CUDA_SUCCESS) return r;
    size_t bytes = p.width * p.height * p.elementSize;
    if (bytes == 0 || bytes > MEMSET_KERNEL_MAX ||
        (p.elementSize != 1 && p.elementSize != 2 && p.elementSize != 4))
        return CUDA_SUCCESS;
    CUgraphNode *in = NULL, *out = NULL, k = NULL;
    CUgraphEdgeData *ind = NULL, *outd = NULL;
    size_t nin = 0, nout = 0;
    r = node_edges(ctx, m, true, &in, &ind, &nin, oom);
    if (r == CUDA_SUCCESS) r = node_edges(ctx, m, false, &out, &outd, &nout, oom);
    unsigned long long dst = (unsigned long long)p.dst, pitch = p.pitch, w = p.width, h = p.height;
    unsigned value = p.value, esize = p.elementSize;
    void *args[6] = {&dst, &pitch, &value, &esize, &w, &h};
    size_t count = p.width * p.height, blocks = (count + 255) / 256;
    CUDA_KERNEL_NODE_PARAMS kp;
    memset(&kp, 0, sizeof kp);
    kp.func = (CUfunction)f;
    kp.gridDimX = (unsigned)(blocks < 1024 ? blocks : 1024);
    kp.gridDimY = kp.gridDimZ = 1;
    kp.blockDimX = 256;
    kp.blockDimY = kp.blockDimZ = 1;
    kp.kernelParams = args;
    if (r == CUDA_SUCCESS) r = cu->cuGraphAddKernelNode(&k, graph, NULL, 0, &kp);
    for (size_t j = 0; j < nin && r == CUDA_SUCCESS; j++)
        r = cu->cuGraphAddDependencies(graph, &in[j], &k, &ind[j], 1);
    for (size_t j = 0; j < nout && r == CUDA_SUCCESS; j++)
        r = cu->cuGraphAddDependencies(graph, &k, &out[j], &outd[j], 1);
    if (r == CUDA_SUCCESS)
        r = cu->cuGraphDestroyNode(m);
    else if (k)
        cu->cuGraphDestroyNode(k); /* its edges go with it: m stays as it was */
    *did += r == CUDA_SUCCESS;
    sg__free(ctx, in, nin * sizeof *in);
    sg__free(ctx, ind, nin * sizeof *ind);
    sg__free(ctx, out, nout * sizeof *out);
    sg__free(ctx, outd, nout * sizeof *outd);
    return r;
}

static sg_status memsets_as_kernels(sg_ctx *ctx, CUgraph graph, int *changed) {
    const sg__cu_api *cu = api(ctx);
    *changed = 0;
    if (!cu->cuGraphGetNodes || memset_nodes_kept()) return SG_OK;
    size_t n = 0;
    CUresult r = cu->cuGraphGetNodes(graph, NULL, &n);
    CUgraphNode *nodes = r == CUDA_SUCCESS && n ? sg__calloc(ctx, n * sizeof *nodes) : NULL;
    bool oom = r == CUDA_SUCCESS && n && !nodes;
    if (oom) r = CUDA_ERROR_OUT_OF_MEMORY;
    if (r == CUDA_SUCCESS && n) r = cu->cuGraphGetNodes(graph, nodes, &n);
    void *f = NULL;
    sg_status s = SG_OK;
    for (size_t i = 0; i < n && r == CUDA_SUCCESS && s == SG_OK; i++) {
        CUgraphNodeType t;
        r = cu->cuGraphNodeGetType(nodes[i], &t);
        if (r != CUDA_SUCCESS || t != CU_GRAPH_NODE_TYPE_MEMSET) continue;
        if (!f) s = sg__cuda_kernel(ctx, SG__CU_DATA, "sg_data_memset", &f);
        if (s == SG_OK) r = memset_as_kernel(ctx, graph, nodes[i], f, changed, &oom);
    }
    if (nodes) sg__free(ctx, nodes, n * sizeof *nodes);
    if (s == SG_OK && oom)
        s = sg__fail(ctx, SG_ERR_OOM,
                     "cuda: out of host memory for a recorded graph's nodes (running its memset "
                     "nodes as kernels); free host memory, or SG_CUDA_MEMSET_NODES=keep");
    else if (s == SG_OK && r != CUDA_SUCCESS)
        s = sg__cu_fail(ctx, r, "cuGraph* (a memset node as a kernel)", "editing a recorded graph");
    return s;
}

/* Record the set's replay as a graph (or patch the one it has). With
 * lanes, the groups go on several streams by what they share (lanes.c);
 * a library part that did more in the recording than at its last run (a
 * product that now needs scratch at new addresses) spoils the plan: the
 * recording is made again on the plan of what it saw, and once more on
 * one lane if that happens twice. Branches that cannot be set up (a
 * stream, an event or a lane's cuBLASLt workspace not made, host memory)
 * leave the recording on one stream: a fallback (sg__fn_fallback: said
 * under "fallbacks", or under strict the call's error). */
static sg_status record_exec(sg_fn *fn, sg__graph *g, set_state *st, CUgraphExec *exec) {
    sg_ctx *ctx = fn->ctx;
    cu_graph *cg = g->dev;
    const sg__cu_api *cu = api(ctx);
    CUstream stream = sg__cuda_stream(ctx);
    CUgraph graph = NULL;
    CUresult r = CUDA_SUCCESS;
    sg__lanes plan = {0};
    for (int attempt = 0;; attempt++) {
        bool lanes = cg->lanes_want > 1 && !cg->lanes_off && !sg__comm_in_ir(&g->ir);
        double t0 = sg__graph_clock();
        sg_status before = ctx->status;
        char msg[SG__MSG_SIZE];
        snprintf(msg, sizeof msg, "%s", ctx->msg);
        sg_status s = lanes ? plan_lanes(ctx, g, cg, &plan) : SG_OK;
        double plan_ms = (sg__graph_clock() - t0) * 1e3;
        if (s != SG_OK) { /* no streams, events or workspace for branches: one stream */
            sg__lanes_free(ctx, &plan);
            char why[SG__MSG_SIZE];
            snprintf(why, sizeof why, "%s", ctx->msg);
            ctx->status = before;
            snprintf(ctx->msg, sizeof ctx->msg, "%s", msg);
            /* A fallback: under strict, this call's error (branches are tried again next call). */
            s = sg__fn_fallback(fn, s, "the graph is recorded on one stream: %.600s", why);
            if (s != SG_OK) return s;
            cg->lanes_off = true;
            continue;
        }
        lanes = lanes && plan.nlanes > 1;
        cg->prio = lanes && plan.nhigh > 0 && plan.nlanes > plan.nhigh;
        r = cu->cuStreamBeginCapture_v2(stream, CU_STREAM_CAPTURE_MODE_RELAXED);
        if (r != CUDA_SUCCESS) {
            sg__lanes_free(ctx, &plan);
            return sg__cu_fail(ctx, r, "cuStreamBeginCapture", "recording a graph");
        }
        sg__cuda_set_capturing(ctx, true);
        cg->lib_grew = false;
        s = lanes ? launch_lanes(ctx, g, st, &plan) : launch_all(ctx, g, st);
        sg__cuda_set_capturing(ctx, false);
        graph = NULL;
        r = cu->cuStreamEndCapture(stream, &graph);
        bool again = s == SG_OK && r == CUDA_SUCCESS && lanes && cg->lib_grew;
        if (s != SG_OK || again) {
            if (graph) cu->cuGraphDestroy(graph);
            graph = NULL;
        }
        if (again) {
            sg__lanes_free(ctx, &plan);
            cg->lanes_off = attempt > 0;
            continue;
        }
        cg->said_lanes = s == SG_OK && r == CUDA_SUCCESS ? (lanes ? plan.nlanes : 1) : 0;
        cg->said_waits = 0;
        cg->said_high = -1;
        if (s == SG_OK && r == CUDA_SUCCESS && lanes) {
            int waits = 0;
            for (int k = 0; k < cg->ngroups * SG__LANES_MAX; k++) waits += plan.wait[k] >= 0;
            cg->said_waits = waits;
            if (cg->prio) {
                cg->said_high = 0;
                for (int k = 0; k < cg->ngroups; k++) cg->said_high += plan.lane[k] < plan.nhigh;
            }
            char ls[512];
            int n = cg->ngroups < (int)sizeof ls - 1 ? cg->ngroups : (int)sizeof ls - 1;
            for (int k = 0; k < n; k++) ls[k] = (char)('0' + plan.lane[k]);
            ls[n] = '\0';
            sg__log(ctx, "perf_hints",
                    "fn '%s': %d groups recorded on %d streams, %d waits "
                    "between them (lanes %s; planned in %.2f ms)",
                    fn->name, cg->ngroups, plan.nlanes, waits, ls, plan_ms);
        }
        sg__lanes_free(ctx, &plan);
        if (s != SG_OK) return s;
        break;
    }
    if (r != CUDA_SUCCESS) return sg__cu_fail(ctx, r, "cuStreamEndCapture", "recording a graph");
    int kernels = 0;
    sg_status sm = memsets_as_kernels(ctx, graph, &kernels);
    if (sm != SG_OK) {
        cu->cuGraphDestroy(graph);
        return sm;
    }
    if (kernels)
        sg__log(ctx, "perf_hints", "fn '%s': %d memset nodes of the recording run as kernels",
                fn->name, kernels);
    if (*exec) {
        CUgraphExecUpdateResultInfo info;
        r = cu->cuGraphExecUpdate_v2(*exec, graph, &info);
        if (r != CUDA_SUCCESS) { /* the topology changed: build it anew */
            cu->cuGraphExecDestroy(*exec);
            *exec = NULL;
        }
        fn->stats.exec_updates += r == CUDA_SUCCESS;
    }
    if (!*exec) {
        double t0 = sg__graph_clock();
        r = cu->cuGraphInstantiateWithFlags(
            exec, graph, cg->prio ? CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY : 0);
        if (r == CUDA_ERROR_INVALID_VALUE && cg->prio) {
            /* A driver before CUDA 11.7 has no node priorities: the
             * streams' order stands without them. */
            sg__log(ctx, "perf_hints",
                    "fn '%s': the driver refused node priorities (a driver before CUDA 11.7?); "
                    "the graph is instantiated without them",
                    fn->name);
            r = cu->cuGraphInstantiateWithFlags(exec, graph, 0);
        }
        fn->stats.graph_instantiations += r == CUDA_SUCCESS;
        if (r == CUDA_SUCCESS)
            sg__log(ctx, "perf_hints", "fn '%s': a graph of %d groups instantiated in %.1f ms",
                    fn->name, g->fused.ngroups, (sg__graph_clock() - t0) * 1e3);
    }
    cu->cuGraphDestroy(graph);
    if (r != CUDA_SUCCESS) {
        *exec = NULL;
        return sg__cu_fail(ctx, r, "cuGraphInstantiateWithFlags", "instantiating a graph");
    }
    return SG_OK;
}

static sg_status record(sg_fn *fn, sg__graph *g, set_state *st) {
    return record_exec(fn, g, st, &st->exec);
}

/* ------------------------------------------------------------ max-autotune */

/* Milliseconds of 5 launches of kernel k in blocks of 128 << t threads
 * (after one warm-up launch), between two events on the stream. */
static sg_status time_kernel(sg_ctx *ctx, cu_graph *cg, int k, int t, set_state *st, float *ms) {
    const sg__cu_api *cu = api(ctx);
    CUstream stream = sg__cuda_stream(ctx);
    CUevent e0 = NULL, e1 = NULL;
    unsigned grid[3] = {cg->kinfo[k].tune_grid[t], 1, 1}, block[3] = {128u << t, 1, 1};
    CUdeviceptr tab = table_of(cg, st, k);
    void *args[1] = {&tab};
    sg_status s = SG_OK;
    CUresult r = cu->cuEventCreate(&e0, CU_EVENT_DEFAULT);
    if (r == CUDA_SUCCESS) r = cu->cuEventCreate(&e1, CU_EVENT_DEFAULT);
    if (r == CUDA_SUCCESS) s = sg__cuda_launch(ctx, cg->kfn[k], grid, block, 0, args);
    if (r == CUDA_SUCCESS && s == SG_OK) r = cu->cuEventRecord(e0, stream);
    for (int i = 0; i < 5 && r == CUDA_SUCCESS && s == SG_OK; i++)
        s = sg__cuda_launch(ctx, cg->kfn[k], grid, block, 0, args);
    if (r == CUDA_SUCCESS && s == SG_OK) r = cu->cuEventRecord(e1, stream);
    if (r == CUDA_SUCCESS && s == SG_OK) r = cu->cuEventSynchronize(e1);
    if (r == CUDA_SUCCESS && s == SG_OK) r = cu->cuEventElapsedTime_v2(ms, e0, e1);
    if (e0) cu->cuEventDestroy_v2(e0);
    if (e1) cu->cuEventDestroy_v2(e1);
    if (s == SG_OK && r != CUDA_SUCCESS)
        s = sg__cu_fail(ctx, r, "cuEventRecord/cuEventElapsedTime",
                        "timing a kernel for max-autotune");
    return s;
}

/* A host copy of the bytes a step writes in one input or parameter. */
typedef struct saved {
    CUdeviceptr at;
    void *copy;
    size_t bytes;
} saved;

/* The bytes of slot s that the step's refs reach, from its base: [lo, hi). */
static void slot_extent(const sg__ir *ir, int s, int64_t *lo, int64_t *hi) {
    *lo = INT64_MAX, *hi = INT64_MIN;
    for (int r = 0; r < ir->nrefs; r++) {
        const sg__ref *f = &ir->refs[r];
        if (f->slot != s) continue;
        int64_t a = f->offset, b = f->offset;
        bool empty = false;
        for (int d = 0; d < f->ndim; d++) {
            int64_t span = (f->shape[d] - 1) * f->stride[d];
            empty = empty || f->shape[d] == 0;
            if (span < 0)
                a += span;
            else
                b += span;
        }
        if (empty) continue;
        int64_t es = (int64_t)sg_dtype_size(f->dtype);
        if (a * es < *lo) *lo = a * es;
        if ((b + 1) * es > *hi) *hi = (b + 1) * es;
    }
}

/* Host copies of everything the step writes in its inputs and parameters
 * (*n of them into *out). They live in host memory so that tuning adds
 * nothing to the device's peak (a training step's parameters and optimizer
 * state are most of it: GPT-2 124M's are 1.7 GB); the copies are made once,
 * when no tuning is cached. */
static sg_status save_mutated(sg_ctx *ctx, sg__graph *g, saved **out, int *n) {
    const sg__cu_api *cu = api(ctx);
    int nslots = g->ir.nslots ? g->ir.nslots : 1;
    saved *sv = sg__calloc(ctx, sizeof *sv * (size_t)nslots);
    *out = sv, *n = 0;
    if (!sv) return sg__fail(ctx, SG_ERR_OOM, "cuda: out of host memory");
    for (int s = 0; s < g->ir.nslots; s++) {
        int64_t lo, hi;
        if (g->ir.slots[s].mutated_by < 0) continue;
        slot_extent(&g->ir, s, &lo, &hi);
        if (hi <= lo) continue;
        saved *v = &sv[*n];
        v->at = (CUdeviceptr)(uintptr_t)(g->slotp[s] + lo);
        v->bytes = (size_t)(hi - lo);
        v->copy = sg__alloc(ctx, v->bytes);
        if (!v->copy)
            return sg__fail(ctx, SG_ERR_OOM,
                            "cuda: out of host memory for a %zu-byte copy of a buffer the "
                            "step writes in place (max-autotune keeps one to put it back); "
                            "use reduce-overhead or free host memory",
                            v->bytes);
        (*n)++;
        CUresult r = cu->cuMemcpyDtoHAsync_v2(v->copy, v->at, v->bytes, sg__cuda_stream(ctx));
        if (r != CUDA_SUCCESS)
            return sg__cu_fail(ctx, r, "cuMemcpyDtoHAsync",
                               "saving a buffer the step writes in place, for max-autotune");
    }
    CUresult r = cu->cuStreamSynchronize(sg__cuda_stream(ctx));
    return r == CUDA_SUCCESS ? SG_OK
                             : sg__cu_fail(ctx, r, "cuStreamSynchronize",
                                           "saving the buffers the step writes in place");
}

/* Put the saved bytes back and wait for the stream. */
static sg_status put_back(sg_ctx *ctx, const saved *sv, int n) {
    const sg__cu_api *cu = api(ctx);
    CUresult r = cu->cuStreamSynchronize(sg__cuda_stream(ctx));
    for (int i = 0; i < n && r == CUDA_SUCCESS; i++)
        r = cu->cuMemcpyHtoDAsync_v2(sv[i].at, sv[i].copy, sv[i].bytes, sg__cuda_stream(ctx));
    CUresult rs = cu->cuStreamSynchronize(sg__cuda_stream(ctx));
    if (r == CUDA_SUCCESS) r = rs;
    return r == CUDA_SUCCESS
               ? SG_OK
               : sg__cu_fail(ctx, r, "cuMemcpyHtoDAsync/cuStreamSynchronize",
                             "restoring what the step writes in place after max-autotune");
}

/* Put the saved bytes back, wait for the stream, free the copies. */
static sg_status restore_mutated(sg_ctx *ctx, sg__graph *g, saved *sv, int n) {
    sg_status s = put_back(ctx, sv, n);
    for (int i = 0; i < n; i++) sg__free(ctx, sv[i].copy, sv[i].bytes);
    sg__free(ctx, sv, sizeof *sv * (size_t)(g->ir.nslots ? g->ir.nslots : 1));
    return s;
}

/* Block sizes for every generated kernel that takes any (see autotune). */
static sg_status tune_kernels(sg_fn *fn, sg__graph *g, set_state *st) {
    sg_ctx *ctx = fn->ctx;
    cu_graph *cg = g->dev;
    sg_status s = SG_OK;
    for (int k = 0; s == SG_OK && k < cg->ngroups; k++) {
        sg__cuda_kinfo *ki = &cg->kinfo[k];
        if (!cg->kfn[k] || !ki->tune_grid[0] || cg->took[k]) continue;
        /* Timed alone, a kernel can look faster with a launch that is slower
         * in the step (where the next kernel overlaps its tail): the default
         * (256 threads) stays unless another is clearly faster. */
        float ms_of[SG__CUDA_NTUNE] = {0};
        for (int t = 0; t < SG__CUDA_NTUNE && s == SG_OK; t++)
            s = time_kernel(ctx, cg, k, t, st, &ms_of[t]);
        int best = 1;
        float best_ms = ms_of[1];
        for (int t = 0; s == SG_OK && t < SG__CUDA_NTUNE; t++)
            if (ms_of[t] < 0.9f * best_ms) best = t, best_ms = ms_of[t];
        if (s != SG_OK) break;
        ki->block = 128u << best;
        ki->grid = ki->tune_grid[best];
        sg__log(ctx, "perf_hints",
                "fn '%s': max-autotune: %s takes %u blocks of %u threads "
                "(%.2f us)",
                fn->name, ki->name, ki->grid, ki->block, best_ms / 5 * 1e3);
    }
    return s;
}

/* After tuning's work on the real buffers: put back what the step writes in
 * place (even after a failure: the caller's values must not move); then a
 * failure s of that work is a fallback (what: why), said under
 * "fallbacks", under strict the call's error. */
static sg_status restore_then(sg_fn *fn, sg__graph *g, saved *sv, int nsv, sg_status s,
                              const char *what, const char *why) {
    sg_status r = sv ? restore_mutated(fn->ctx, g, sv, nsv) : SG_OK;
    if (r != SG_OK || s == SG_OK) return r;
    return sg__fn_fallback(fn, s, "%s: %.700s", what, why);
}

/*
 * Time each generated kernel that takes any block size with 128, 256 and
 * 512 threads on the real buffers and keep the fastest. The whole step runs
 * first so that every kernel reads the values it would read in a replay;
 * in it, each cuBLASLt call not yet picked times its candidates (and GEMV
 * against them for few rows) and keeps the fastest (cublaslt.c).
 * What the step writes in its inputs and parameters is copied aside first
 * and put back after, so the replay that follows starts from the caller's
 * values (intermediates are recomputed by it). A failure to time keeps the
 * default launches for the kernels left, a fallback (under strict the
 * call's error); a failure to put the values back is the call's failure.
 */
static sg_status autotune(sg_fn *fn, sg__graph *g, set_state *st) {
    sg_ctx *ctx = fn->ctx;
    cu_graph *cg = g->dev;
    cg->tune = false;
    sg_status before = ctx->status;
    char msg[SG__MSG_SIZE];
    snprintf(msg, sizeof msg, "%s", ctx->msg);
    saved *sv = NULL;
    int nsv = 0;
    sg_status s = save_mutated(ctx, g, &sv, &nsv);
    if (s == SG_OK && cg->lt) s = sg__lt_tune_begin(ctx);
    if (s == SG_OK) s = launch_all(ctx, g, st);
    sg__lt_pick picks[TUNE_MAX];
    sg_status lost = SG_OK;
    int npicks = cg->lt ? sg__lt_tune_end(ctx, picks, TUNE_MAX, &lost) : 0;
    if (npicks < 0 && s == SG_OK) s = lost;
    if (s == SG_OK) s = tune_kernels(fn, g, st);
    if (s == SG_OK) tune_save(cg, picks, npicks);
    char why[SG__MSG_SIZE] = "";
    if (s != SG_OK) {
        snprintf(why, sizeof why, "%s", ctx->msg);
        ctx->status = before;
        snprintf(ctx->msg, sizeof ctx->msg, "%s", msg);
    }
    return restore_then(fn, g, sv, nsv, s,
                        "max-autotune stopped, the kernels left keep their default launches", why);
}

/* Milliseconds of 20 launches of exec, after one. */
static sg_status time_exec(sg_ctx *ctx, CUgraphExec exec, float *ms) {
    const sg__cu_api *cu = api(ctx);
    CUstream stream = sg__cuda_stream(ctx);
    CUevent e0 = NULL, e1 = NULL;
    CUresult r = cu->cuEventCreate(&e0, CU_EVENT_DEFAULT);
    if (r == CUDA_SUCCESS) r = cu->cuEventCreate(&e1, CU_EVENT_DEFAULT);
    if (r == CUDA_SUCCESS) r = cu->cuGraphLaunch(exec, stream);
    if (r == CUDA_SUCCESS) r = cu->cuEventRecord(e0, stream);
    for (int i = 0; i < 20 && r == CUDA_SUCCESS; i++) r = cu->cuGraphLaunch(exec, stream);
    if (r == CUDA_SUCCESS) r = cu->cuEventRecord(e1, stream);
    if (r == CUDA_SUCCESS) r = cu->cuEventSynchronize(e1);
    if (r == CUDA_SUCCESS) r = cu->cuEventElapsedTime_v2(ms, e0, e1);
    if (e0) cu->cuEventDestroy_v2(e0);
    if (e1) cu->cuEventDestroy_v2(e1);
    return r == CUDA_SUCCESS ? SG_OK
                             : sg__cu_fail(ctx, r, "cuGraphLaunch/cuEventElapsedTime",
                                           "timing a step's graph for max-autotune");
}

/*
 * MAX_AUTOTUNE, once per step, after the first graph is recorded: the picks
 * were timed one kernel or one call at a time, and in the replay, where a
 * kernel overlaps the next one's start and they share the L2, the
 * generator's launches and cuBLASLt's heuristic can be faster. So the step
 * is also recorded with those, both graphs replay (what the step writes in
 * place copied aside first and put back before each timing), and the tuned
 * one stays only when it is at least 1% faster: the defaults are what
 * reduce-overhead runs, and the picks must beat them where it counts. A
 * failure to record or time keeps the tuned graph, a fallback (under strict
 * the call's error); a failure to put the values back is the call's failure. The outcome joins
 * the tune file (tune_checked), so a later process neither checks again
 * nor applies picks that lost.
 */
static sg_status check_step(sg_fn *fn, sg__graph *g, set_state *st) {
    sg_ctx *ctx = fn->ctx;
    cu_graph *cg = g->dev;
    const sg__cu_api *cu = api(ctx);
    cg->check = false;
    bool differs = cg->lt;
    for (int k = 0; k < cg->ngroups; k++)
        differs =
            differs || cg->kinfo[k].grid != cg->dgrid[k] || cg->kinfo[k].block != cg->dblock[k];
    if (!differs || !st->exec) return SG_OK;
    size_t bytes = sizeof(unsigned) * (size_t)cg->ngroups;
    unsigned *tuned = sg__alloc(ctx, 2 * bytes + 1);
    if (!tuned)
        return sg__fn_fallback(fn, SG_ERR_OOM,
                               "max-autotune: out of host memory to compare the "
                               "tuned step with the default one; the picks stay");
    sg_status before = ctx->status;
    char msg[SG__MSG_SIZE];
    snprintf(msg, sizeof msg, "%s", ctx->msg);
    for (int k = 0; k < cg->ngroups; k++) {
        tuned[k] = cg->kinfo[k].grid, tuned[cg->ngroups + k] = cg->kinfo[k].block;
        cg->kinfo[k].grid = cg->dgrid[k], cg->kinfo[k].block = cg->dblock[k];
    }
    CUgraphExec dexec = NULL;
    if (cg->lt) sg__lt_scope(ctx, false);
    sg_status s = record_exec(fn, g, st, &dexec);
    if (cg->lt) sg__lt_scope(ctx, true);
    for (int k = 0; k < cg->ngroups; k++)
        cg->kinfo[k].grid = tuned[k], cg->kinfo[k].block = tuned[cg->ngroups + k];
    saved *sv = NULL;
    int nsv = 0;
    float ms[2] = {0.0f, 0.0f};
    if (s == SG_OK) s = save_mutated(ctx, g, &sv, &nsv);
    /* tuned, default, default, tuned: each from the saved values (a step
     * that moves a position or grows a cache replays the same work) */
    for (int i = 0; i < 4 && s == SG_OK; i++) {
        int v = i == 1 || i == 2;
        float t = 0.0f;
        s = put_back(ctx, sv, nsv);
        if (s == SG_OK) s = time_exec(ctx, v ? dexec : st->exec, &t);
        if (i < 2 || t < ms[v]) ms[v] = t;
    }
    bool dflt = s == SG_OK && !(ms[0] < 0.99f * ms[1]);
    if (s == SG_OK)
        sg__log(ctx, "perf_hints",
                "fn '%s': max-autotune: the step replays in %.2f us with the tuned picks, "
                "%.2f us with the defaults; %s",
                fn->name, ms[0] * 1e3f / 20, ms[1] * 1e3f / 20,
                dflt ? "the defaults stay" : "the picks stay");
    char why[SG__MSG_SIZE] = "";
    if (s != SG_OK) snprintf(why, sizeof why, "%s", ctx->msg);
    if (s == SG_OK) tune_checked(cg, !dflt);
    if (dflt) {
        cu->cuGraphExecDestroy(st->exec);
        st->exec = dexec, dexec = NULL;
        for (int k = 0; k < cg->ngroups; k++)
            cg->kinfo[k].grid = cg->dgrid[k], cg->kinfo[k].block = cg->dblock[k];
        cg->lt = false; /* later recordings (new addresses) take the defaults too */
    }
    if (dexec) cu->cuGraphExecDestroy(dexec);
    sg__free(ctx, tuned, 2 * bytes + 1);
    ctx->status = before;
    snprintf(ctx->msg, sizeof ctx->msg, "%s", msg);
    return restore_then(fn, g, sv, nsv, s,
                        "max-autotune: the tuned step was not compared with the default one, "
                        "the picks stay",
                        why);
}

/* SG_CUDA_STAMPS=N: the first STAMP_WARM replays of a set run as usual, the
 * next N are each launched alone, waited for and their stamps read back
 * (codegen.h, sg__cuda_stamps), and after them one line per generated
 * launch goes to stderr: its blocks' first and last begin, their waits'
 * first and last return, the last warp's end (µs from the replay's first
 * stamped begin, means over the N) and its blocks. Launches of the library
 * (cuBLASLt, the kernel families) have no stamps; their time is the gap
 * between the generated ones around them. */
static sg_status stamped_launch(sg_fn *fn, sg__graph *g, set_state *st, int want) {
    sg_ctx *ctx = fn->ctx;
    cu_graph *cg = g->dev;
    const sg__cu_api *cu = api(ctx);
    CUstream stream = sg__cuda_stream(ctx);
    size_t nb = sizeof(uint64_t) * 8 * SG__STAMP_N;
    CUdeviceptr at[SG__MAX_PARTS] = {0};
    CUresult r = CUDA_SUCCESS;
    for (int m = 0; m < cg->nmods && m < SG__MAX_PARTS && r == CUDA_SUCCESS; m++) {
        size_t bytes = 0;
        if (cu->cuModuleGetGlobal_v2(&at[m], &bytes, cg->mods[m], "sg_stamp_buf") != CUDA_SUCCESS ||
            bytes != nb)
            at[m] = 0;
        else
            r = cu->cuMemsetD8Async(at[m], 0, nb, stream);
    }
    if (r == CUDA_SUCCESS) r = cu->cuGraphLaunch(st->exec, stream);
    if (r == CUDA_SUCCESS) r = cu->cuStreamSynchronize(stream);
    if (r != CUDA_SUCCESS) return sg__cu_fail(ctx, r, "cuGraphLaunch (SG_CUDA_STAMPS)", g->module);
    uint64_t *all = sg__calloc(ctx, nb), *one = sg__calloc(ctx, nb);
    if (!all || !one) {
        if (all) sg__free(ctx, all, nb);
        if (one) sg__free(ctx, one, nb);
        return sg__fail(ctx, SG_ERR_OOM, "SG_CUDA_STAMPS: out of host memory");
    }
    for (int m = 0; m < cg->nmods && m < SG__MAX_PARTS && r == CUDA_SUCCESS; m++) {
        if (!at[m]) continue;
        r = cu->cuMemcpyDtoHAsync_v2(one, at[m], nb, stream);
        if (r == CUDA_SUCCESS) r = cu->cuStreamSynchronize(stream);
        for (int i = 0; r == CUDA_SUCCESS && i < 8 * SG__STAMP_N; i++)
            if (one[i] > all[i]) all[i] = one[i];
    }
    sg__free(ctx, one, nb);
    if (r != CUDA_SUCCESS) {
        sg__free(ctx, all, nb);
        return sg__cu_fail(ctx, r, "cuMemcpyDtoHAsync (SG_CUDA_STAMPS)", g->module);
    }
    uint64_t t0 = UINT64_MAX;
    for (int k = 0; k < cg->ngroups; k++) {
        if (!cg->kfn[k] || cg->took[k]) continue;
        const uint64_t *e = all + 8 * ((table_of(cg, st, k) >> 3) & (SG__STAMP_N - 1));
        if (e[5] && ~e[0] < t0) t0 = ~e[0];
    }
    if (++cg->stamp_runs > STAMP_WARM && t0 != UINT64_MAX)
        for (int k = 0; k < cg->ngroups; k++) {
            const uint64_t *e = all + 8 * ((table_of(cg, st, k) >> 3) & (SG__STAMP_N - 1));
            if (!cg->kfn[k] || cg->took[k] || !e[5]) continue;
            double *a = cg->stamp_acc + STAMP_F * k;
            a[0] += 1e-3 * (double)(~e[0] - t0), a[1] += 1e-3 * (double)(e[1] - t0);
            a[2] += e[3] ? 1e-3 * (double)(~e[2] - t0) : 0.0;
            a[3] += e[3] ? 1e-3 * (double)(e[3] - t0) : 0.0;
            a[4] += 1e-3 * (double)(e[4] - t0), a[5] += (double)e[5];
            a[6] += e[6] ? 1e-3 * (double)(e[6] - t0) : 0.0;
            a[7] += e[7] ? 1e-3 * (double)(e[7] - t0) : 0.0;
        }
    sg__free(ctx, all, nb);
    if (cg->stamp_runs == STAMP_WARM + want) {
        fprintf(stderr,
                "stamps of %s (%d replays; us from the first begin): begin first..last, "
                "wait first..last, end, blocks, a GEMV's last norm row and sums ready (0: none)\n",
                g->module, want);
        for (int k = 0; k < cg->ngroups; k++) {
            const double *a = cg->stamp_acc + STAMP_F * k;
            if (!cg->kfn[k] || a[5] == 0.0) continue;
            fprintf(stderr,
                    "  %3d %-40.40s %7.2f..%7.2f  %7.2f..%7.2f  %7.2f  %5.0f  %7.2f %7.2f\n", k,
                    cg->kinfo[k].name, a[0] / want, a[1] / want, a[2] / want, a[3] / want,
                    a[4] / want, a[5] / want, a[6] / want, a[7] / want);
        }
    }
    return SG_OK;
}

static sg_status run_set(sg_fn *fn, sg__graph *g, int set) {
    sg_ctx *ctx = fn->ctx;
    cu_graph *cg = g->dev;
    set_state *st = NULL;
    bool moved = false;
    sg_status s = table_for(ctx, g, set, &st, &moved);
    if (s != SG_OK) return s;
    if (cg->tune && (s = autotune(fn, g, st)) != SG_OK) return s;
    st->runs++;
    if (!cg->use_graph || st->runs == 1) return launch_all(ctx, g, st);
    if (!st->exec || moved) {
        sg_status before = ctx->status;
        char msg[SG__MSG_SIZE];
        snprintf(msg, sizeof msg, "%s", ctx->msg);
        s = record(fn, g, st);
        if (s != SG_OK) {
            char why[SG__MSG_SIZE];
            snprintf(why, sizeof why, "%s", ctx->msg);
            /* Reported as a fallback, not as this call's failure (but under strict). */
            ctx->status = before;
            snprintf(ctx->msg, sizeof ctx->msg, "%s", msg);
            s = cg->said && !fn->opts.strict
                    ? SG_OK
                    : sg__fn_fallback(fn, s, "no CUDA graph for %s, launching kernels one by "
                                      "one: %.700s", g->module, why);
            if (s != SG_OK) return s;
            cg->said = true;
            cg->use_graph = false;
            return launch_all(ctx, g, st);
        }
        if (cg->check && (s = check_step(fn, g, st)) != SG_OK) return s;
    }
    int want = cg->stamp_want;
    if (want > 0 && api(ctx)->cuModuleGetGlobal_v2 && cg->stamp_runs < STAMP_WARM + want) {
        if (!cg->stamp_acc &&
            !(cg->stamp_acc = sg__calloc(ctx, sizeof(double) * STAMP_F *
                                                  (size_t)(cg->ngroups ? cg->ngroups : 1))))
            return sg__fail(ctx, SG_ERR_OOM, "SG_CUDA_STAMPS: out of host memory");
        return stamped_launch(fn, g, st, want);
    }
    CUresult r = api(ctx)->cuGraphLaunch(st->exec, sg__cuda_stream(ctx));
    return r == CUDA_SUCCESS ? SG_OK : sg__cu_fail(ctx, r, "cuGraphLaunch", g->module);
}

bool sg__cuda_lanes_note(const sg__graph *g, char *buf, size_t size) {
    const cu_graph *cg = g->compiled ? g->dev : NULL;
    if (!cg || !cg->said_lanes) return false;
    int n = snprintf(buf, size,
                     "the last recording put %d kernels on %d stream%s with %d waits between "
                     "them (SG_CUDA_LANES=%d: kernels that share no bytes run side by side)",
                     cg->ngroups, cg->said_lanes, cg->said_lanes > 1 ? "s" : "", cg->said_waits,
                     cg->lanes_want);
    if (cg->said_high >= 0 && n > 0 && (size_t)n < size)
        snprintf(buf + n, size - (size_t)n,
                 "; %d of them on the streams of the device's greatest priority (a kernel soon "
                 "after waits for them), the rest on its least (SG_CUDA_LANE_PRIORITY=0: one "
                 "priority)",
                 cg->said_high);
    return true;
}

/* A replay; in the MAX_AUTOTUNE modes, with cuBLASLt's picks in scope. */
static sg_status run(sg_fn *fn, sg__graph *g, int set) {
    cu_graph *cg = g->dev;
    bool lt = cg->lt; /* check_step may turn the picks off */
    sg_status s = lt ? sg__lt_scope(fn->ctx, true) : SG_OK;
    if (s != SG_OK) return s;
    s = run_set(fn, g, set);
    if (lt) sg__lt_scope(fn->ctx, false);
    return s;
}

/*
 * sg_fn_trace on CUDA: one replay launched kernel by kernel (no graph), an
 * event recorded before the first and after each, so that every kernel --
 * its library call, its generated kernel -- gets its own device time. The
 * times are placed on the host clock read when the first event is queued.
 */
static sg_status timed_run_set(sg_fn *fn, sg__graph *g, int set) {
    sg_ctx *ctx = fn->ctx;
    const sg__cu_api *cu = api(ctx);
    set_state *st = NULL;
    bool moved = false;
    sg_status s = table_for(ctx, g, set, &st, &moved);
    if (s != SG_OK) return s;
    int n = g->fused.ngroups;
    size_t bytes = sizeof(CUevent) * (size_t)(n + 1);
    CUevent *ev = sg__calloc(ctx, bytes);
    if (!ev) return sg__fail(ctx, SG_ERR_OOM, "sg_fn_trace: out of host memory for events");
    CUstream stream = sg__cuda_stream(ctx);
    CUresult r = CUDA_SUCCESS;
    for (int k = 0; k <= n && r == CUDA_SUCCESS; k++)
        r = cu->cuEventCreate(&ev[k], CU_EVENT_DEFAULT);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double base = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
    if (r == CUDA_SUCCESS) r = cu->cuEventRecord(ev[0], stream);
    for (int k = 0; k < n && r == CUDA_SUCCESS && s == SG_OK; k++) {
        s = launch_range(ctx, g, st, k, k + 1);
        if (s == SG_OK) r = cu->cuEventRecord(ev[k + 1], stream);
    }
    if (r == CUDA_SUCCESS && s == SG_OK) r = cu->cuEventSynchronize(ev[n]);
    for (int k = 0; k < n && r == CUDA_SUCCESS && s == SG_OK; k++) {
        float a = 0, b = 0;
        r = cu->cuEventElapsedTime_v2(&a, ev[0], ev[k]);
        if (r == CUDA_SUCCESS) r = cu->cuEventElapsedTime_v2(&b, ev[0], ev[k + 1]);
        if (r == CUDA_SUCCESS) sg__trace_kernel(fn, g, k, base + 1e-3 * a, base + 1e-3 * b);
    }
    for (int k = 0; k <= n; k++)
        if (ev[k]) cu->cuEventDestroy_v2(ev[k]);
    sg__free(ctx, ev, bytes);
    if (s == SG_OK && r != CUDA_SUCCESS)
        s = sg__cu_fail(ctx, r, "cuEventRecord/cuEventElapsedTime", "timing kernels for sg_fn_trace");
    if (s == SG_OK) sg__trace_next(fn);
    return s;
}

static sg_status timed_run(sg_fn *fn, sg__graph *g, int set) {
    cu_graph *cg = g->dev;
    sg_status s = cg->lt ? sg__lt_scope(fn->ctx, true) : SG_OK;
    if (s != SG_OK) return s;
    s = timed_run_set(fn, g, set);
    if (cg->lt) sg__lt_scope(fn->ctx, false);
    return s;
}

/* The CUDA dialect's fusion: no prologues before library anchors, which
 * read their input from memory; epilogues that cuBLASLt can compute are
 * marked for it (the group's kernel stays, for when it cannot). */
static void fuse_opts(sg__fuse_opts *o, bool disable) {
    sg__cgen_cuda_fuse_opts(o, disable);
    o->lib_epilogue = true;
    o->attn_copies = true;
    o->xent_pairs = sg__cuda_xent_on("pair");
    o->norm_sums = sg__cuda_norm_bwd_on("sum");
}

const sg__graph_ops sg__cuda_graph_ops = {compile, run, release, fuse_opts, timed_run, false};

#else
/* Built without CUDA: no context ever gets these. */
const sg__graph_ops sg__cuda_graph_ops = {NULL, NULL, NULL, NULL, NULL, false};

bool sg__cuda_lanes_note(const sg__graph *g, char *buf, size_t size) {
    (void)g;
    if (size) buf[0] = '\0';
    return false;
}
#endif
