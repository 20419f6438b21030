/* SPDX-License-Identifier: MIT */
/*
 * ze_graph.c -- compiled captures on Level Zero. The capture is fused with
 * the GPU options (codegen/cgen_cuda.c's) and its groups become one OpenCL
 * C unit (sg__cgen_gpu, SG__DIALECT_OPENCL), compiled to SPIR-V by libocloc
 * through the disk cache and loaded as one module. Each generated kernel
 * takes one argument, a table of base addresses in device memory: its own
 * (the slots it uses, in its local numbering) or the capture-wide one. One
 * device array per output set holds the capture-wide table followed by
 * every launch's own, as on CUDA.
 *
 * MATMUL groups are generated GEMM kernels (codegen/cgen_gemm.c), as Level
 * Zero has no BLAS library. Replays of a set whose groups are all generated
 * kernels run one recorded command list (sg__ze_rec), recorded at the
 * set's first replay; its only
 * argument per launch is a pointer into the set's array, which never
 * moves, so new slot addresses are one upload of the array and no
 * re-record. Groups whose anchor or opaque node is no generated kernel run
 * their op eagerly (ctx->exec.run), so such a capture launches its kernels
 * one by one on the immediate list, in order with those ops. A unit with a
 * group the dialect has no kernel for (rows, GEMV) is not compiled: the
 * capture replays op by op, and each op says what the ze backend lacks.
 */
#include "../graphs.h"
#include "ze.h"

#ifdef SG_HAVE_ZE_HEADERS

typedef struct ze_set {
    void *table;  /* device: ntable addresses */
    char **addrs; /* what it holds */
    size_t bytes;
    sg__ze_rec *rec; /* the recorded replay, NULL until the first */
} ze_set;

typedef struct ze_graph {
    sg__ze_kfn **kfn;      /* per group, NULL without a generated kernel */
    sg__cuda_kinfo *kinfo; /* per group: kernel name, launch, own table */
    int ngroups, nslots, ntable;
    int *argoff;    /* per group: the entry its kernel's table starts at */
    bool lib_calls; /* some group runs an eager op: launch one by one */
    ze_set *sets;
    int nsets;
} ze_graph;

#define N1(n) ((size_t)((n) ? (n) : 1))

static void release(sg_ctx *ctx, sg__graph *g) {
    ze_graph *zg = g->dev;
    if (!zg) return;
    for (int s = 0; s < zg->nsets; s++) {
        sg__ze_rec_free(ctx, zg->sets[s].rec);
        if (zg->sets[s].table) sg__dev_free(ctx, zg->sets[s].table, zg->sets[s].bytes);
        sg__free(ctx, zg->sets[s].addrs, zg->sets[s].addrs ? zg->sets[s].bytes : 0);
    }
    sg__free(ctx, zg->sets, sizeof *zg->sets * N1(zg->nsets));
    sg__free(ctx, zg->kfn, sizeof *zg->kfn * N1(zg->ngroups));
    sg__free(ctx, zg->kinfo, sizeof *zg->kinfo * N1(zg->ngroups));
    sg__free(ctx, zg->argoff, sizeof *zg->argoff * N1(zg->ngroups));
    sg__free(ctx, zg, sizeof *zg);
    g->dev = NULL;
}

/* The library's part of a group: its anchor or opaque node, or -1. */
static int call_node(const sg__group *grp) {
    if (grp->kind == SG__G_OPAQUE) return grp->g[0].node;
    if (grp->anchor >= 0) return grp->g[grp->anchor].node;
    return -1;
}

/* The unit's kernels from its SPIR-V (one module, loaded once). */
static sg_status load_kernels(sg_ctx *ctx, sg__graph *g, ze_graph *zg, const char *src) {
    void *spirv = NULL;
    size_t size = 0;
    sg_status s = sg__ocloc_build(ctx, g->module, src, &spirv, &size);
    for (int k = 0; s == SG_OK && k < zg->ngroups; k++)
        if (zg->kinfo[k].name[0])
            s = sg__ze_kernel_spirv(ctx, g->module, spirv, size, zg->kinfo[k].name, &zg->kfn[k]);
    sg__free(ctx, spirv, size);
    return s;
}

static sg_status compile(sg_fn *fn, sg__graph *g) {
    sg_ctx *ctx = fn->ctx;
    ze_graph *zg = sg__calloc(ctx, sizeof *zg);
    if (!zg) return sg__fail(ctx, SG_ERR_OOM, "ze: out of host memory");
    g->dev = zg;
    zg->ngroups = g->fused.ngroups;
    zg->nslots = g->ir.nslots;
    zg->kfn = sg__calloc(ctx, sizeof *zg->kfn * N1(zg->ngroups));
    zg->kinfo = sg__calloc(ctx, sizeof *zg->kinfo * N1(zg->ngroups));
    zg->argoff = sg__calloc(ctx, sizeof *zg->argoff * N1(zg->ngroups));
    if (!zg->kfn || !zg->kinfo || !zg->argoff)
        return sg__fail(ctx, SG_ERR_OOM, "ze: out of host memory");
    sg__emit e = {.ctx = ctx};
    int nk = 0;
    sg_status s =
        sg__cgen_gpu(ctx, &g->ir, &g->fused, g->module, SG__DIALECT_OPENCL, &e, zg->kinfo, &nk);
    if (s == SG_OK) sg__graph_log_source(fn, g, e.buf);
    if (s == SG_OK && nk > 0) s = load_kernels(ctx, g, zg, e.buf);
    sg__emit_free(&e);
    zg->ntable = zg->nslots;
    for (int k = 0; k < zg->ngroups; k++) {
        const sg__cuda_kinfo *ki = &zg->kinfo[k];
        bool own = ki->name[0] && ki->nlocal >= 0;
        zg->argoff[k] = own ? zg->ntable : 0;
        zg->ntable += own ? ki->nlocal : 0;
        if (call_node(&g->fused.groups[k]) >= 0 && !ki->replaces_call) zg->lib_calls = true;
        for (int m = 0; g->fused.groups[k].kind == SG__G_MULTI && m < g->fused.groups[k].nmembers;
             m++)
            if (g->fused.parts[g->fused.groups[k].members[m]].kind == SG__G_OPAQUE)
                zg->lib_calls = true;
    }
    return s;
}

/* Every entry of a set's table from the slot addresses. */
static void fill_table(const ze_graph *zg, char *const *slotp, char **addrs) {
    memcpy(addrs, slotp, sizeof(char *) * (size_t)zg->nslots);
    for (int k = 0; k < zg->ngroups; k++)
        if (zg->kinfo[k].name[0] && zg->kinfo[k].nlocal >= 0)
            for (int i = 0; i < zg->kinfo[k].nlocal; i++)
                addrs[zg->argoff[k] + i] = slotp[zg->kinfo[k].local[i]];
}

/* The set's table holds this call's addresses (uploaded again if any moved). */
static sg_status table_for(sg_ctx *ctx, sg__graph *g, int set, ze_set **out) {
    ze_graph *zg = g->dev;
    if (set >= zg->nsets) {
        ze_set *ns = sg__calloc(ctx, sizeof *ns * (size_t)(set + 1));
        if (!ns) return sg__fail(ctx, SG_ERR_OOM, "ze: out of host memory");
        if (zg->sets) {
            memcpy(ns, zg->sets, sizeof *ns * (size_t)zg->nsets);
            sg__free(ctx, zg->sets, sizeof *ns * (size_t)zg->nsets);
        }
        zg->sets = ns;
        zg->nsets = set + 1;
    }
    ze_set *st = &zg->sets[set];
    bool moved = false;
    if (!st->addrs) {
        st->bytes = sizeof(char *) * N1(zg->ntable);
        st->addrs = sg__calloc(ctx, st->bytes);
        if (!st->addrs) return sg__fail(ctx, SG_ERR_OOM, "ze: out of host memory");
        sg_status s = sg__dev_alloc(ctx, st->bytes, &st->table);
        if (s != SG_OK)
            return sg__fail(ctx, s, "ze: no device memory for a slot table (%zu bytes)", st->bytes);
        moved = true;
    }
    if (memcmp(st->addrs, g->slotp, sizeof(char *) * (size_t)zg->nslots) != 0) moved = true;
    if (moved) {
        fill_table(zg, g->slotp, st->addrs);
        sg_status s = ctx->exec.upload(ctx, st->table, st->addrs, st->bytes);
        if (s != SG_OK) return s;
    }
    *out = st;
    return SG_OK;
}

/* The pointer kernel k receives: its own table in the set's array, or the
 * capture-wide one at its start. */
static void *table_of(const ze_graph *zg, const ze_set *st, int k) {
    return (char *)st->table + sizeof(char *) * (size_t)zg->argoff[k];
}

/* Groups [from, to) in order: the op (unless the kernel computes it), then
 * the kernel, on the immediate list, or appended to rec when given. */
static sg_status launch_range(sg_ctx *ctx, sg__graph *g, ze_set *st, sg__ze_rec *rec, int from,
                              int to) {
    ze_graph *zg = g->dev;
    for (int k = from; k < to; k++) {
        const sg__cuda_kinfo *ki = &zg->kinfo[k];
        const sg__group *grp = &g->fused.groups[k];
        int node = call_node(grp);
        if (node >= 0 && !ki->replaces_call) {
            sg_status s = ctx->exec.run(ctx, &g->nodes[node]);
            if (s != SG_OK) return s;
        }
        /* A data op's kernel launched now: bad indices fail the call before
         * it writes, as eagerly (a recorded list relies on the kernels'
         * guards, as CUDA's graphs do). */
        if (!rec && grp->kind == SG__G_OPAQUE && ki->replaces_call) {
            sg_status s = sg__data_check(ctx, &g->nodes[grp->g[0].node]);
            if (s != SG_OK) return s;
        }
        if (!zg->kfn[k]) continue;
        uint32_t groups[3] = {ki->grid, 1, 1}, size[3] = {ki->block, 1, 1};
        void *tab = table_of(zg, st, k);
        sg__ze_arg arg = {sizeof tab, &tab};
        sg_status s = rec ? sg__ze_rec_launch(ctx, rec, zg->kfn[k], groups, size, 1, &arg, NULL)
                          : sg__ze_launch(ctx, zg->kfn[k], groups, size, 1, &arg);
        if (s != SG_OK) return s;
    }
    return SG_OK;
}

static sg_status run(sg_fn *fn, sg__graph *g, int set) {
    sg_ctx *ctx = fn->ctx;
    ze_graph *zg = g->dev;
    ze_set *st = NULL;
    sg_status s = table_for(ctx, g, set, &st);
    if (s != SG_OK) return s;
    if (zg->lib_calls || g->one_by_one) return launch_range(ctx, g, st, NULL, 0, zg->ngroups);
    if (!st->rec) {
        s = sg__ze_rec_create(ctx, &st->rec);
        if (s == SG_OK) s = launch_range(ctx, g, st, st->rec, 0, zg->ngroups);
        if (s != SG_OK) {
            sg__ze_rec_free(ctx, st->rec);
            st->rec = NULL;
            return s;
        }
        fn->stats.graph_instantiations++;
    }
    return sg__ze_rec_replay(ctx, st->rec);
}

/* Its cross_entropy gradient is the OpenCL C dialect's element-wise kernel
 * (codegen/cgen_serial.c). */
const sg__graph_ops sg__ze_graph_ops = {compile, run, release, sg__cgen_cuda_fuse_opts, NULL, true};

#elif !defined(SG_HAVE_ZE_HEADERS)
const sg__graph_ops sg__ze_graph_ops = {NULL, NULL, NULL, NULL, NULL, false};
#endif
