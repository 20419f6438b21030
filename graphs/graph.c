/* SPDX-License-Identifier: MIT */
/*
 * graph.c -- from a capture's IR to something that replays: the memory plan
 * (intermediates share scratch by liveness; outputs get their own sets so
 * they survive the next replay), storages pointed into the static pool,
 * executable nodes over fixed tensor records, and the replay itself, which
 * patches input addresses and runs the nodes without allocating anything.
 */
#include "graphs.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

#define ALLOC_ARRAY(ctx, ptr, count)                                                               \
    ((ptr) = sg__calloc(ctx, sizeof *(ptr) * (size_t)((count) ? (count) : 1)))

static bool is_output_slot(const sg__slot *sl) {
    return sl->kind == SG__SLOT_INTERNAL && sl->output >= 0;
}

/* Note that kernel k touches slot s (in memory, not in registers). */
static void touch(int *first, int *last, int s, int k) {
    if (first[s] < 0) first[s] = k;
    if (k > last[s]) last[s] = k;
}

static void touch_group(const sg__ir *ir, const sg__fused *f, const sg__group *grp, int k,
                        int *first, int *last) {
    for (int i = 0; i < grp->n; i++) {
        const sg__irnode *n = &ir->nodes[grp->g[i].node];
        bool lib = grp->kind == SG__G_OPAQUE || i == grp->anchor;
        for (int j = 0; j < n->nin; j++) {
            int r = ir->args[n->args + j];
            if (r < 0) continue;
            int src = j < 4 ? grp->g[i].arg_src[j] : -1; /* concat may have more inputs */
            if (lib || src < 0 || src == grp->anchor)
                touch(first, last, ir->refs[f->alias[r]].slot, k);
        }
        if (lib || grp->g[i].store) touch(first, last, ir->refs[f->alias[n->out]].slot, k);
    }
}

/* Which kernels touch each slot: with fusion, values kept in registers need no bytes. */
static void kernel_intervals(const sg__graph *g, int *first, int *last) {
    const sg__ir *ir = &g->ir;
    for (int s = 0; s < ir->nslots; s++) first[s] = last[s] = -1;
    if (!g->has_fused) {
        for (int s = 0; s < ir->nslots; s++) {
            first[s] = ir->slots[s].first;
            last[s] = ir->slots[s].last;
        }
        return;
    }
    const sg__fused *f = &g->fused;
    for (int k = 0; k < f->ngroups; k++) {
        const sg__group *grp = &f->groups[k];
        if (grp->kind == SG__G_MULTI)
            for (int m = 0; m < grp->nmembers; m++)
                touch_group(ir, f, &f->parts[grp->members[m]], k, first, last);
        else
            touch_group(ir, f, grp, k, first, last);
    }
    for (int s = 0; s < ir->nslots; s++) /* outputs live to the end */
        if (ir->slots[s].kind == SG__SLOT_INTERNAL && ir->slots[s].output >= 0)
            last[s] = f->ngroups;
}

static bool same_geometry(const sg__ref *a, const sg__ref *b) {
    if (a->dtype != b->dtype || a->ndim != b->ndim || a->offset != b->offset) return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d] || a->stride[d] != b->stride[d]) return false;
    return true;
}

/* The kernel that runs IR node i alone (its group holds nothing else, or
 * only the cross_entropy whose loss the gradient's kernel computes from
 * each row before writing it: sg__group.xent), or -1. */
static int lone_kernel(const sg__graph *g, int i) {
    if (!g->has_fused) return i;
    for (int k = 0; k < g->fused.ngroups; k++) {
        const sg__group *grp = &g->fused.groups[k];
        if (grp->kind != SG__G_MULTI && (grp->n == 1 || (grp->n == 2 && grp->xent == 1)) &&
            grp->g[0].node == i)
            return k;
    }
    return -1;
}

/*
 * host[s]: the slot whose bytes slot s takes, or -1. cross_entropy's
 * gradient overwrites its logits when they die there (the training step's
 * largest buffer pair): every backend's kernel reads a row whole for its
 * statistics before writing any of it, then reads each element before
 * writing it, one row per thread or block. Only in a kernel of its own and
 * over the logits' exact geometry. The host's interval grows to the guest's.
 * Not where the backend's kernel works element by element
 * (sg__graph_ops.xent_by_element: Level Zero's): there a row's early
 * elements would be written while later work-items still read them.
 */
static void inplace_hosts(const sg_ctx *ctx, const sg__graph *g, int *first, int *last, int *host) {
    const sg__ir *ir = &g->ir;
    const int *alias = g->has_fused ? g->fused.alias : NULL;
    for (int s = 0; s < ir->nslots; s++) host[s] = -1;
    const sg__graph_ops *ops = ctx->gops;
    if (ops && ops->xent_by_element) return;
    for (int i = 0; i < ir->nnodes; i++) {
        const sg__irnode *n = &ir->nodes[i];
        if (n->op != SG__OP_CROSS_ENTROPY_BWD || ir->args[n->args] < 0) continue;
        if (g->has_fused && g->fused.dead[i]) continue;
        const sg__ref *x = &ir->refs[alias ? alias[ir->args[n->args]] : ir->args[n->args]];
        const sg__ref *y = &ir->refs[alias ? alias[n->out] : n->out];
        int a = x->slot, b = y->slot, k = lone_kernel(g, i);
        const sg__slot *sa = &ir->slots[a], *sb = &ir->slots[b];
        if (k < 0 || a == b || sa->kind != SG__SLOT_INTERNAL || sb->kind != SG__SLOT_INTERNAL ||
            is_output_slot(sa) || is_output_slot(sb) || host[a] >= 0 || sb->nbytes > sa->nbytes ||
            last[a] != k || first[b] != k || !same_geometry(x, y))
            continue;
        bool hosts = false; /* a takes one guest at most */
        for (int s = 0; s < ir->nslots && !hosts; s++) hosts = host[s] == a;
        if (hosts) continue;
        host[b] = a;
        last[a] = last[b];
    }
}

/* The slots that folded constants write (sg__fused.consts): g->slot_const. */
static sg_status mark_consts(sg_ctx *ctx, sg__graph *g) {
    const sg__ir *ir = &g->ir;
    g->const_bytes = 0;
    g->nfolded = 0;
    if (!g->has_fused || !g->fused.nconsts) return SG_OK;
    if (!g->slot_const && !ALLOC_ARRAY(ctx, g->slot_const, ir->nslots))
        return sg__fail(ctx, SG_ERR_OOM, "compile: out of host memory planning constants");
    for (int c = 0; c < g->fused.nconsts; c++) {
        const sg__group *grp = &g->fused.consts[c];
        for (int k = 0; k < grp->n; k++) {
            g->slot_const[ir->refs[ir->nodes[grp->g[k].node].out].slot] = true;
            g->nfolded++;
        }
    }
    return SG_OK;
}

/* Compute the folded constants once, by the backend's eager kernels, into
 * their block (the storages already point there). */
static sg_status eval_consts(sg_fn *fn, sg__graph *g) {
    sg_ctx *ctx = fn->ctx;
    for (int c = 0; g->has_fused && c < g->fused.nconsts; c++) {
        const sg__group *grp = &g->fused.consts[c];
        for (int k = 0; k < grp->n; k++) {
            int i = grp->g[k].node;
            sg_status s = ctx->exec.run(ctx, &g->nodes[i]);
            if (s != SG_OK) {
                char line[256], msg[700];
                snprintf(msg, sizeof msg, "%.600s", ctx->msg);
                return sg__fail(ctx, s, "%s (folding IR line %s of fn '%s' into a constant)", msg,
                                sg__ir_node_str(&g->ir, i, line, sizeof line), fn->name);
            }
        }
    }
    return SG_OK;
}

/* Scratch offsets by liveness, output offsets one after another, folded
 * constants in a block of their own (their bytes must outlive every replay
 * of every fn, so scratch, which other plans reuse, cannot hold them). */
static sg_status plan(sg_ctx *ctx, sg__graph *g) {
    sg__ir *ir = &g->ir;
    sg__buf *bufs = sg__alloc(ctx, sizeof *bufs * (size_t)(ir->nslots ? ir->nslots : 1));
    int *which = sg__alloc(ctx, sizeof(int) * (size_t)(ir->nslots ? ir->nslots : 1) * 4);
    sg_status s = SG_OK;
    if (!bufs || !which) {
        s = sg__fail(ctx, SG_ERR_OOM, "compile: out of host memory planning buffers");
        goto done;
    }
    int n = 0, *sfirst = which + ir->nslots, *slast = sfirst + ir->nslots, *host = slast + ir->nslots;
    kernel_intervals(g, sfirst, slast);
    inplace_hosts(ctx, g, sfirst, slast, host);
    g->out_bytes = g->unshared = 0;
    s = mark_consts(ctx, g);
    if (s != SG_OK) goto done;
    for (int i = 0; i < ir->nslots; i++) {
        sg__slot *sl = &ir->slots[i];
        if (sl->kind != SG__SLOT_INTERNAL) continue;
        g->unshared += sl->nbytes;
        g->slot_off[i] = SIZE_MAX; /* no bytes: lives in registers, or never touched */
        if (g->slot_const && g->slot_const[i]) { /* never shared, never reused */
            g->slot_off[i] = g->const_bytes;
            g->const_bytes += round_up(sl->nbytes ? sl->nbytes : 1, SG__POOL_ALIGN);
        } else if (is_output_slot(sl)) {
            g->slot_off[i] = g->out_bytes;
            g->out_bytes += round_up(sl->nbytes ? sl->nbytes : 1, SG__POOL_ALIGN);
        } else if (host[i] < 0 && (sfirst[i] >= 0 || !g->has_fused)) {
            /* Unfused, a buffer no node touched still gets bytes, live at node 0. */
            int first = sfirst[i] < 0 ? 0 : sfirst[i];
            bufs[n] = (sg__buf){
                .size = sl->nbytes, .first = first, .last = slast[i] < first ? first : slast[i]};
            which[n++] = i;
        }
    }
    s = sg__plan(ctx, bufs, n, SG__POOL_ALIGN, g->reuse_gap, &g->scratch);
    if (s != SG_OK) goto done;
    for (int k = 0; k < n; k++) g->slot_off[which[k]] = bufs[k].offset;
    for (int i = 0; i < ir->nslots; i++)
        if (host[i] >= 0) g->slot_off[i] = g->slot_off[host[i]];
    g->peak = sg__plan_peak(bufs, n);
done:
    sg__free(ctx, bufs, sizeof *bufs * (size_t)(ir->nslots ? ir->nslots : 1));
    sg__free(ctx, which, sizeof(int) * (size_t)(ir->nslots ? ir->nslots : 1) * 4);
    return s;
}

/* SG_CONST_FOLD=0: constant groups run in every replay (for comparison). */
static bool no_fold(void) {
    const char *e = getenv("SG_CONST_FOLD");
    return e && strcmp(e, "0") == 0;
}

/* Per dialect (CUDA, HIP, OpenCL) and sg__check_what: the checks' counts. */
static _Atomic uint64_t check_counts[SG__DIALECT_OPENCL + 1][SG__CHECK_NCOUNTS];

uint64_t sg__cuda_check_failures(void) {
    return check_counts[SG__DIALECT_CUDA][SG__CHECK_FAILED] +
           check_counts[SG__DIALECT_HIP][SG__CHECK_FAILED];
}

bool sg__hiprtc_check_skipped(void) {
    return check_counts[SG__DIALECT_HIP][SG__CHECK_UNAVAILABLE] > 0 &&
           check_counts[SG__DIALECT_HIP][SG__CHECK_BUILT] == 0;
}

uint64_t sg__dialect_check_count(sg__dialect d, sg__check_what w) {
    return d >= 0 && d <= SG__DIALECT_OPENCL && w >= 0 && w < SG__CHECK_NCOUNTS ? check_counts[d][w]
                                                                                : 0;
}

/* The unit of dialect d, compiled and thrown away: CUDA C by NVRTC for
 * sm_90, in parts on threads where the CUDA backend would cut it
 * (sg__unit_split), HIP by hiprtc for gfx90a, OpenCL C on the first OpenCL
 * CPU device. */
static sg_status build_dialect(sg_ctx *ctx, sg__dialect d, const char *name, const char *src,
                               const sg__cuda_kinfo *ki, int ngroups) {
    if (d == SG__DIALECT_OPENCL) return sg__opencl_build(ctx, name, src, NULL);
    bool hip = d == SG__DIALECT_HIP;
    sg__unit_parts u;
    sg_status s = sg__unit_split(ctx, src, ki, ngroups, hip ? 1 : sg__unit_max_parts(), &u);
    if (s != SG_OK) return s;
    void *image[SG__MAX_PARTS] = {NULL};
    size_t size[SG__MAX_PARTS] = {0};
    char names[SG__MAX_PARTS][sizeof((sg__graph *)0)->module + 16];
    const char *nm[SG__MAX_PARTS];
    for (int p = 0; p < u.n; p++) {
        snprintf(names[p], sizeof names[p], u.n == 1 ? "%s" : "%s_%d", name, p);
        nm[p] = names[p];
    }
    s = sg__rtc_build_many(ctx, hip ? SG__RTC_HIPRTC : SG__RTC_NVRTC, u.n, nm,
                           (const char *const *)u.src, hip ? "gfx90a" : "sm_90", u.n, image, size);
    for (int p = 0; p < u.n; p++)
        if (image[p]) sg__free(ctx, image[p], size[p]);
    sg__unit_parts_free(ctx, &u);
    return s;
}

static const char *check_var(sg__dialect d) {
    return d == SG__DIALECT_OPENCL ? "SG_OPENCL_CHECK"
           : d == SG__DIALECT_HIP  ? "SG_HIPRTC_CHECK"
                                   : "SG_NVRTC_CHECK";
}

/* What the environment turns off: SG_CONST_FOLD=0 (folding), SG_MULTI_READY=0
 * (updates moved by readiness). */
static void fuse_env(sg__fuse_opts *fo) {
    fo->no_fold = no_fold();
    const char *mr = getenv("SG_MULTI_READY");
    if (mr && strcmp(mr, "0") == 0) fo->multi_ready = false;
}

/* SG_NVRTC_CHECK / SG_HIPRTC_CHECK / SG_OPENCL_CHECK: this capture fused as
 * for a GPU, its unit in dialect d built (build_dialect) and thrown away.
 * A group the dialect has no kernel for is counted and fails the unit.
 * Nothing here changes the capture or the context's status. */
static void check_dialect(sg_fn *fn, sg__graph *g, bool disable, sg__dialect d) {
    sg_ctx *ctx = fn->ctx;
    sg_status before = ctx->status;
    const char *var = check_var(d);
    char msg[SG__MSG_SIZE], name[sizeof g->module + 8];
    snprintf(msg, sizeof msg, "%s", ctx->msg);
    snprintf(name, sizeof name, "%s_%s", g->module,
             d == SG__DIALECT_OPENCL ? "cl" : d == SG__DIALECT_HIP ? "hip" : "cu");
    sg__fuse_opts fo;
    sg__cgen_cuda_fuse_opts(&fo, disable);
    fuse_env(&fo);
    sg__fused f;
    memset(&f, 0, sizeof f);
    sg_status s = sg__fuse(ctx, &g->ir, &fo, &f);
    sg__cuda_kinfo *ki = NULL;
    int nk = 0;
    sg__emit e = {.ctx = ctx};
    if (s == SG_OK) {
        ki = sg__calloc(ctx, sizeof *ki * (size_t)(f.ngroups ? f.ngroups : 1));
        s = ki ? sg__cgen_gpu(ctx, &g->ir, &f, name, d, &e, ki, &nk)
               : sg__fail(ctx, SG_ERR_OOM, "out of host memory");
    }
    if (s == SG_ERR_UNSUPPORTED && ki)
        for (int k = 0; k < f.ngroups; k++)
            check_counts[d][SG__CHECK_UNSUPPORTED] += ki[k].unsupported;
    if (s == SG_OK && nk > 0) {
        s = build_dialect(ctx, d, name, e.buf, ki, f.ngroups);
        if (s == SG_OK) check_counts[d][SG__CHECK_BUILT]++;
    }
    if (s == SG_ERR_BACKEND_UNAVAILABLE) {
        if (check_counts[d][SG__CHECK_UNAVAILABLE]++ == 0)
            sg__log(ctx, "fallbacks", "%s: no compiler for the %s dialect, not checked: %.600s",
                    var, sg__spell_of(d)->name, ctx->msg);
    } else if (s != SG_OK) {
        check_counts[d][SG__CHECK_FAILED]++;
        sg__log(ctx, "error", "fn '%s': %s: the %s unit of capture %d failed: %.800s", fn->name,
                var, sg__spell_of(d)->name, fn->ngraphs, ctx->msg);
    }
    sg__emit_free(&e);
    if (ki) sg__free(ctx, ki, sizeof *ki * (size_t)(f.ngroups ? f.ngroups : 1));
    sg__fused_free(ctx, &f, &g->ir);
    ctx->status = before;
    snprintf(ctx->msg, sizeof ctx->msg, "%s", msg);
}

/* sg_compile_opts.backend_fn: may take the capture over (g->custom). */
static sg_status call_backend_fn(sg_fn *fn, sg__graph *g) {
    sg_graph_view v = {fn, g};
    sg_step_fn run = NULL;
    sg_status s = fn->opts.backend_fn(fn->opts.backend_user, &v, &run);
    if (s != SG_OK)
        return sg__fail(fn->ctx, s, "fn '%s': backend_fn returned %s for capture %d", fn->name,
                        sg_status_str(s), fn->ngraphs);
    g->custom = run;
    if (run)
        sg__log(fn->ctx, "output_code", "fn '%s': capture %d runs the step backend_fn gave",
                fn->name, fn->ngraphs);
    return SG_OK;
}

double sg__graph_clock(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* SG_DISABLE_FUSION=1: every node its own group, and no row op rewritten. */
static bool fusion_disabled_by_env(void) {
    const char *nf = getenv("SG_DISABLE_FUSION");
    return nf && strcmp(nf, "1") == 0;
}

/* Fuse and let the backend compile; on any failure the capture replays
 * op by op through the eager kernels (a fallback: an error under strict). */
static sg_status try_compile(sg_fn *fn, sg__graph *g) {
    sg_ctx *ctx = fn->ctx;
    const sg__graph_ops *ops = ctx->gops;
    const char *cg = getenv("SG_CODEGEN");
    bool no_code = !ops || !ops->compile || (cg && strcmp(cg, "0") == 0) ||
                   fn->backend_kind != SG__BACKEND_INDUCTOR;
    if (no_code && !fn->opts.backend_fn && fn->backend_kind != SG__BACKEND_AOT_EAGER) return SG_OK;
    sg__fuse_opts fo = {
        .disable = fusion_disabled_by_env(), .horizontal = true, .multi_ready = true};
    if (ops && ops->fuse_opts) ops->fuse_opts(&fo, fo.disable);
    fo.no_epilogue = fn->opts.epilogue_fusion == SG_FLAG_FALSE;
    fuse_env(&fo);
    fo.per_op = fn->backend_kind == SG__BACKEND_AOT_EAGER;
    fo.disable = fo.disable || fn->backend_kind == SG__BACKEND_EAGER;
    sg_status before = ctx->status;
    char msg[SG__MSG_SIZE];
    snprintf(msg, sizeof msg, "%s", ctx->msg);
    double t0 = sg__graph_clock();
    sg_status s = sg__fuse(ctx, &g->ir, &fo, &g->fused);
    double t1 = sg__graph_clock();
    if (s == SG_OK) g->has_fused = true;
    if (s == SG_OK && fn->opts.backend_fn) s = call_backend_fn(fn, g);
    if (s == SG_OK && (g->custom || no_code)) {
        /* aot_eager replays the groups it kept, one op each; eager, every IR op. */
        if (!g->custom && fn->backend_kind != SG__BACKEND_AOT_EAGER) {
            sg__fused_free(ctx, &g->fused, &g->ir);
            g->has_fused = false;
        }
        g->op_by_op = !g->custom && g->has_fused;
        return SG_OK;
    }
    size_t k = (size_t)snprintf(g->module, sizeof g->module, "sg_");
    for (const char *p = fn->name; *p && k + 12 < sizeof g->module; p++)
        g->module[k++] =
            (char)((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9')
                       ? *p
                       : '_');
    snprintf(g->module + k, sizeof g->module - k, "_c%d", fn->ngraphs);
    ctx->no_cache_reads = fn->opts.force_disable_caches;
    if (s == SG_OK) s = ops->compile(fn, g);
    ctx->no_cache_reads = false;
    if (s == SG_OK)
        sg__log(ctx, "perf_hints", "fn '%s': capture %d: fusion %.1f ms, backend compile %.1f ms",
                fn->name, fn->ngraphs, (t1 - t0) * 1e3, (sg__graph_clock() - t1) * 1e3);
    const char *chk = getenv("SG_NVRTC_CHECK");
    if (chk && strcmp(chk, "1") == 0 && ctx->backend == SG_BACKEND_CPU)
        check_dialect(fn, g, fo.disable, SG__DIALECT_CUDA);
    chk = getenv("SG_HIPRTC_CHECK");
    if (chk && strcmp(chk, "1") == 0 && ctx->backend == SG_BACKEND_CPU)
        check_dialect(fn, g, fo.disable, SG__DIALECT_HIP);
    chk = getenv("SG_OPENCL_CHECK");
    if (chk && strcmp(chk, "1") == 0 && ctx->backend == SG_BACKEND_CPU)
        check_dialect(fn, g, fo.disable, SG__DIALECT_OPENCL);
    if (s == SG_OK) {
        g->compiled = true;
        fn->stats.compiles++;
        sg__log(ctx, "output_code", "fn '%s': capture %d: %d IR ops -> %d kernels in %s", fn->name,
                fn->ngraphs, g->ir.nnodes, g->fused.ngroups, g->module);
        return SG_OK;
    }
    char why[SG__MSG_SIZE];
    snprintf(why, sizeof why, "%s", ctx->msg);
    ops->release(ctx, g);
    if (g->has_fused) sg__fused_free(ctx, &g->fused, &g->ir);
    g->has_fused = false;
    /* The failure is reported through the fallback, not to the caller. */
    ctx->status = before;
    snprintf(ctx->msg, sizeof ctx->msg, "%s", msg);
    return sg__fn_fallback(fn, s, "capture %d replays unfused, op by op: %.800s", fn->ngraphs, why);
}

/* Row ops and attention written out of primitives become the op itself (fusion/canon.c)
 * where the capture is fused for generated code: not eagerly, op by op, with
 * fusion disabled, or for a custom backend, which sees the capture as
 * recorded. Before anything is sized by the IR's inputs. */
static sg_status canon(sg_fn *fn, sg__graph *g) {
    if (fn->opts.mode == SG_MODE_EAGER || fn->opts.backend_fn ||
        fn->backend_kind != SG__BACKEND_INDUCTOR || fusion_disabled_by_env())
        return SG_OK;
    int n = 0;
    sg_status s = sg__canon(fn->ctx, &g->ir, &n);
    if (n)
        sg__log(fn->ctx, "perf_hints",
                "fn '%s': capture %d: %d softmax, log_softmax, "
                "layer_norm or attention written out of primitives (or attention over K/V "
                "repeated for grouped heads) run%s as the op itself",
                fn->name, fn->ngraphs, n, n > 1 ? "" : "s");
    return s;
}

sg_status sg__graph_build(sg_fn *fn, sg__graph *g) {
    sg_ctx *ctx = fn->ctx;
    sg__ir *ir = &g->ir;
    sg_status cs = canon(fn, g);
    if (cs != SG_OK) return cs;
    if (!ALLOC_ARRAY(ctx, g->slot_off, ir->nslots) || !ALLOC_ARRAY(ctx, g->slot_st, ir->nslots) ||
        !ALLOC_ARRAY(ctx, g->slot_ptr, ir->nslots) || !ALLOC_ARRAY(ctx, g->ref_t, ir->nrefs) ||
        !ALLOC_ARRAY(ctx, g->args, ir->nargs) || !ALLOC_ARRAY(ctx, g->nodes, ir->nnodes) ||
        !ALLOC_ARRAY(ctx, g->slotp, ir->nslots))
        return sg__fail(ctx, SG_ERR_OOM, "compile: out of host memory building the plan");
    g->ctx = ctx;
    /* Wide unaligned matrices get padded rows before anything reads the
     * refs' strides (a custom backend sees the capture as recorded). */
    sg_status s = SG_OK;
    if (fn->opts.mode != SG_MODE_EAGER && !fn->opts.backend_fn) {
        int np = 0;
        s = sg__pad_rows(ctx, ir, &np);
        if (s != SG_OK) return s;
        if (np)
            sg__log(ctx, "perf_hints", "fn '%s': capture %d: %d buffer%s of unaligned rows padded",
                    fn->name, fn->ngraphs, np, np > 1 ? "s" : "");
    }
    g->const_block = -1;
    if (fn->opts.mode != SG_MODE_EAGER) s = try_compile(fn, g);
    if (s == SG_OK) s = plan(ctx, g);
    if (s != SG_OK) return s;
    s = sg__pool_reserve(ctx, g->scratch, 0, NULL);
    if (s == SG_OK && g->const_bytes) s = sg__pool_reserve(ctx, 0, g->const_bytes, &g->const_block);
    if (s != SG_OK) return s;
    for (int i = 0; i < ir->nslots; i++) {
        sg__slot *sl = &ir->slots[i];
        g->slot_st[i].refs = 1;
        g->slot_st[i].cap_slot = -1;
        g->slot_st[i].nbytes = sl->nbytes;
        g->slot_ptr[i] = sl->kind == SG__SLOT_PARAM ? sl->param : &g->slot_st[i];
    }
    for (int r = 0; r < ir->nrefs; r++) {
        const sg__ref *ref = &ir->refs[r];
        sg_tensor *t = &g->ref_t[r];
        t->magic = SG__TENSOR_LIVE;
        t->fn_owned = true;
        t->ctx = ctx;
        t->dtype = ref->dtype;
        t->ndim = ref->ndim;
        memcpy(t->shape, ref->shape, sizeof t->shape);
        memcpy(t->stride, ref->stride, sizeof t->stride);
        t->offset = ref->offset;
        t->st = g->slot_ptr[ref->slot];
    }
    /* Common subexpressions removed by fusion read the ref they alias. */
    const int *alias = g->has_fused ? g->fused.alias : NULL;
    for (int a = 0; a < ir->nargs; a++)
        g->args[a] = ir->args[a] < 0 ? NULL : &g->ref_t[alias ? alias[ir->args[a]] : ir->args[a]];
    for (int i = 0; i < ir->nnodes; i++) {
        const sg__irnode *in = &ir->nodes[i];
        sg__node *n = &g->nodes[i];
        n->op = in->op;
        memcpy(n->f, in->f, sizeof n->f);
        memcpy(n->i, in->i, sizeof n->i);
        n->mask = in->mask;
        n->nin = in->nin;
        n->in = &g->args[in->args];
        n->out = &g->ref_t[alias ? alias[in->out] : in->out];
    }
    sg__fns_repoint(ctx);
    sg__graph_repoint(ctx, g);
    s = eval_consts(fn, g);
    if (s == SG_OK && g->nfolded)
        sg__log(ctx, "output_code",
                "fn '%s': capture %d: %d value%s folded into constants (%zu bytes)", fn->name,
                fn->ngraphs, g->nfolded, g->nfolded > 1 ? "s" : "", g->const_bytes);
    return s;
}

sg_status sg__graph_outbuf(sg_fn *fn, sg__graph *g, int set) {
    sg_ctx *ctx = fn->ctx;
    sg__ir *ir = &g->ir;
    if (set < g->noutbufs && g->outbufs[set].st) return SG_OK;
    if (set >= g->noutbufs) {
        int n = set + 1;
        sg__outbuf *nb = sg__calloc(ctx, sizeof *nb * (size_t)n);
        if (!nb) return sg__fail(ctx, SG_ERR_OOM, "call: out of host memory for an output set");
        if (g->outbufs) {
            memcpy(nb, g->outbufs, sizeof *nb * (size_t)g->noutbufs);
            sg__free(ctx, g->outbufs, sizeof *nb * (size_t)g->noutbufs);
        }
        for (int k = g->noutbufs; k < n; k++) nb[k].block = -1;
        g->outbufs = nb;
        g->noutbufs = n;
    }
    sg__outbuf *ob = &g->outbufs[set];
    sg__storage **st = sg__calloc(ctx, sizeof *st * (size_t)(ir->nslots ? ir->nslots : 1));
    if (!st) return sg__fail(ctx, SG_ERR_OOM, "call: out of host memory for an output set");
    for (int i = 0; i < ir->nslots; i++) {
        if (!is_output_slot(&ir->slots[i])) continue;
        st[i] = sg__calloc(ctx, sizeof *st[i]);
        if (!st[i]) {
            for (int k = 0; k < i; k++) sg__free(ctx, st[k], sizeof *st[k]);
            sg__free(ctx, st, sizeof *st * (size_t)(ir->nslots ? ir->nslots : 1));
            return sg__fail(ctx, SG_ERR_OOM, "call: out of host memory for an output set");
        }
        st[i]->refs = 1;
        st[i]->nbytes = ir->slots[i].nbytes;
        st[i]->cap_slot = -1;
    }
    int block = -1;
    sg_status s = g->out_bytes ? sg__pool_reserve(ctx, 0, g->out_bytes, &block) : SG_OK;
    if (s != SG_OK) {
        for (int i = 0; i < ir->nslots; i++) sg__free(ctx, st[i], sizeof *st[i]);
        sg__free(ctx, st, sizeof *st * (size_t)(ir->nslots ? ir->nslots : 1));
        return s;
    }
    ob->block = block;
    ob->st = st;
    sg__fns_repoint(ctx);
    return SG_OK;
}

void sg__graph_repoint(sg_ctx *ctx, sg__graph *g) {
    sg__ir *ir = &g->ir;
    if (!ctx->pool) return;
    for (int i = 0; i < ir->nslots; i++)
        if (ir->slots[i].kind == SG__SLOT_INTERNAL && !is_output_slot(&ir->slots[i]))
            g->slot_st[i].data = g->slot_off[i] == SIZE_MAX ? NULL
                                 : g->slot_const && g->slot_const[i]
                                     ? sg__pool_addr(ctx, g->const_block, g->slot_off[i])
                                     : sg__pool_addr(ctx, -1, g->slot_off[i]);
    for (int k = 0; k < g->noutbufs; k++) {
        sg__outbuf *ob = &g->outbufs[k];
        if (!ob->st) continue;
        for (int i = 0; i < ir->nslots; i++)
            if (ob->st[i])
                ob->st[i]->data =
                    ob->block < 0 ? NULL : sg__pool_addr(ctx, ob->block, g->slot_off[i]);
    }
    g->pool_gen = ctx->pool->generation;
}

sg_status sg__graph_replay(sg_fn *fn, sg__graph *g, sg_tensor *const *in, int set) {
    sg_ctx *ctx = fn->ctx;
    sg__ir *ir = &g->ir;
    /* Scratch is short only after growing it failed (it kept its old size). */
    if (g->scratch && ctx->pool->scratch < g->scratch) {
        sg_status s = sg__pool_reserve(ctx, g->scratch, 0, NULL);
        if (s != SG_OK) return s;
    }
    if (ctx->pool && g->pool_gen != ctx->pool->generation) sg__graph_repoint(ctx, g);
    bool moved = false;
    for (int i = 0; i < ir->nslots; i++) {
        sg__slot *sl = &ir->slots[i];
        if (sl->kind == SG__SLOT_INPUT) {
            const sg_tensor *t = in[sl->input];
            void *at = (char *)t->st->data + t->offset * (int64_t)sg_dtype_size(t->dtype);
            moved = moved || (g->replays > 0 && at != g->slot_st[i].data);
            g->slot_st[i].data = at;
        } else if (is_output_slot(sl)) {
            g->slot_st[i].data = g->outbufs[set].st[i]->data;
        }
    }
    fn->stats.patched_pointers += moved;
    if (g->compiled) {
        for (int i = 0; i < ir->nslots; i++) g->slotp[i] = g->slot_ptr[i]->data;
        const sg__graph_ops *ops = ctx->gops;
        sg_status s = fn->trace && ops->timed_run ? ops->timed_run(fn, g, set)
                      : fn->trace && g->kernel_fn ? sg__trace_replay(fn, g)
                                                  : ops->run(fn, g, set);
        if (s != SG_OK) {
            char msg[700];
            snprintf(msg, sizeof msg, "%.600s", ctx->msg);
            return sg__fail(ctx, s, "%s (replaying %s of fn '%s')", msg, g->module, fn->name);
        }
        g->replays++;
        return SG_OK;
    }
    if (fn->trace) { /* sg_fn_trace: the same nodes, each timed */
        sg_status s = sg__trace_replay(fn, g);
        if (s != SG_OK) return s;
        g->replays++;
        return SG_OK;
    }
    int nk = sg__graph_nkernels(g);
    for (int k = 0; k < nk; k++) {
        int i = sg__graph_kernel_node(g, k);
        sg_status s = ctx->exec.run(ctx, &g->nodes[i]);
        if (s != SG_OK) {
            char line[256], msg[700];
            snprintf(msg, sizeof msg, "%.600s", ctx->msg);
            return sg__fail(ctx, s, "%s (replaying IR line %s of fn '%s')", msg,
                            sg__ir_node_str(ir, i, line, sizeof line), fn->name);
        }
    }
    g->replays++;
    return SG_OK;
}

void sg__graph_keep_outputs(sg_ctx *ctx, sg__graph *g) {
    for (int k = 0; k < g->noutbufs; k++) {
        sg__outbuf *ob = &g->outbufs[k];
        for (int i = 0; ob->st && i < g->ir.nslots; i++) {
            sg__storage *st = ob->st[i];
            void *data = NULL;
            if (!st || st->refs <= 1 || !st->data) continue; /* g's reference alone */
            if (sg__dev_alloc(ctx, st->nbytes, &data) != SG_OK) continue;
            if (ctx->exec.copy(ctx, data, st->data, st->nbytes) != SG_OK) {
                sg__dev_free(ctx, data, st->nbytes);
                continue;
            }
            st->data = data;
            st->owned = true;
            ob->st[i] = NULL; /* no longer g's: freed with its last reference */
            sg__storage_unref(ctx, st);
        }
    }
}

void sg__graph_free(sg_ctx *ctx, sg__graph *g) {
    if (!g) return;
    sg__ir *ir = &g->ir;
    int nslots = ir->nslots ? ir->nslots : 1;
    for (int k = 0; k < g->noutbufs; k++) {
        sg__outbuf *ob = &g->outbufs[k];
        if (ob->block >= 0) sg__pool_release(ctx, ob->block);
        if (!ob->st) continue;
        for (int i = 0; i < ir->nslots; i++) {
            if (!ob->st[i]) continue;
            /* Handles and views that still see these bytes become stale. */
            ob->st[i]->gen++;
            ob->st[i]->overwritten_in = 0; /* dropped, not overwritten by a call */
            ob->st[i]->data = NULL;
            sg__storage_unref(ctx, ob->st[i]);
        }
        sg__free(ctx, ob->st, sizeof *ob->st * (size_t)nslots);
    }
    sg__free(ctx, g->outbufs, sizeof *g->outbufs * (size_t)(g->noutbufs ? g->noutbufs : 1));
    if (g->const_bytes && g->const_block >= 0) sg__pool_release(ctx, g->const_block);
    sg__free(ctx, g->slot_const, sizeof *g->slot_const * (size_t)nslots);
    sg__free(ctx, g->slot_off, sizeof *g->slot_off * (size_t)nslots);
    sg__free(ctx, g->slot_st, sizeof *g->slot_st * (size_t)nslots);
    sg__free(ctx, g->slot_ptr, sizeof *g->slot_ptr * (size_t)nslots);
    sg__free(ctx, g->ref_t, sizeof *g->ref_t * (size_t)(ir->nrefs ? ir->nrefs : 1));
    sg__free(ctx, g->args, sizeof *g->args * (size_t)(ir->nargs ? ir->nargs : 1));
    sg__free(ctx, g->nodes, sizeof *g->nodes * (size_t)(ir->nnodes ? ir->nnodes : 1));
    sg__free(ctx, g->key, sizeof *g->key * (size_t)(ir->nin ? ir->nin : 1));
    sg__free(ctx, g->slotp, sizeof *g->slotp * (size_t)nslots);
    if (g->compiled || g->dev) ((const sg__graph_ops *)ctx->gops)->release(ctx, g);
    if (g->has_fused) sg__fused_free(ctx, &g->fused, ir);
    sg__ir_free(ctx, ir);
    sg__free(ctx, g, sizeof *g);
}
