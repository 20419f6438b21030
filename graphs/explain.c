/* SPDX-License-Identifier: MIT */
/*
 * explain.c -- sg_fn_explain: a compiled fn in text, for people. Each
 * capture with its guards, IR, buffers and their pool offsets, parameters,
 * in-place mutations, and every fallback with its reason; then the fn's
 * output sets and its counters.
 */
#include "graphs.h"
#include "cuda/cublaslt.h"
#include "cuda/exec.h"

#include <stdio.h>

void sg__text_put(sg__text *t, const char *fmt, ...) {
    if (t->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(t->buf ? t->buf + t->len : NULL, t->buf ? t->cap - t->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) return;
        if (t->buf && t->len + (size_t)n < t->cap) {
            t->len += (size_t)n;
            return;
        }
        size_t ncap = t->cap ? t->cap * 2 : 4096;
        while (ncap < t->len + (size_t)n + 1) ncap *= 2;
        char *nb = sg__alloc(t->ctx, ncap);
        if (!nb) {
            t->oom = true;
            return;
        }
        if (t->buf) {
            memcpy(nb, t->buf, t->len + 1);
            sg__free(t->ctx, t->buf, t->cap);
        } else {
            nb[0] = '\0';
        }
        t->buf = nb;
        t->cap = ncap;
    }
}

static void explain_key(sg__text *t, const sg__graph *g, int nin) {
    for (int k = 0; k < nin; k++) {
        const sg__argkey *a = &g->key[k];
        char sh[96], st[96];
        sg__text_put(t, "    guard: input %d is %s%s strides %s", k, sg_dtype_name(a->dtype),
            sg__shape_str(a->ndim, a->shape, sh, sizeof sh),
            sg__shape_str(a->ndim, a->stride, st, sizeof st));
        if (a->alias >= 0)
            sg__text_put(t, ", shares storage with input %d at offset %lld", a->alias,
                (long long)a->alias_off);
        sg__text_put(t, "\n");
    }
}

/* The slot that fusion points internal slot s's producer at instead (its
 * output aliased to another slot), or -1. A live producer writes there
 * (forward_into: the value moved into the buffer it was copied to); a
 * dropped copy's readers read there (forward_copies). */
static int aliased_to(const sg__graph *g, int s) {
    const sg__ir *ir = &g->ir;
    int first = ir->slots[s].first;
    if (!g->has_fused || first < 0) return -1;
    int to = ir->refs[g->fused.alias[ir->nodes[first].out]].slot;
    return ir->refs[ir->nodes[first].out].slot == s && to != s ? to : -1;
}

static void explain_slots(sg__text *t, const sg__graph *g) {
    const sg__ir *ir = &g->ir;
    for (int s = 0; s < ir->nslots; s++) {
        const sg__slot *sl = &ir->slots[s];
        char line[512];
        switch (sl->kind) {
        case SG__SLOT_INPUT:
            if (sl->mutated_by >= 0)
                sg__text_put(t,
                    "    mutation: input %d is written in place by IR line %s (replays write "
                    "to the tensor passed to each call)\n",
                    sl->input, sg__ir_node_str(ir, sl->mutated_by, line, sizeof line));
            break;
        case SG__SLOT_PARAM:
            sg__text_put(t, "    parameter p%d: %zu bytes%s\n", s, sl->param->nbytes,
                sl->mutated_by >= 0 ? ", written in place" : "");
            if (sl->mutated_by >= 0)
                sg__text_put(t, "    mutation: parameter p%d is written in place by IR line %s\n", s,
                    sg__ir_node_str(ir, sl->mutated_by, line, sizeof line));
            break;
        case SG__SLOT_INTERNAL:
            if (g->eager) break;
            if (sl->output >= 0)
                sg__text_put(t, "    buffer b%d: %zu bytes, output %d, offset %zu in each output set\n", s,
                    sl->nbytes, sl->output, g->slot_off[s]);
            else if (g->slot_const && g->slot_const[s])
                sg__text_put(t,
                    "    buffer b%d: %zu bytes, a constant folded at compile, offset %zu in the "
                    "constants' block\n",
                    s, sl->nbytes, g->slot_off[s]);
            else if (g->slot_off[s] == SIZE_MAX) { /* no kernel reads or writes it in memory */
                int to = aliased_to(g, s);
                bool dead = to >= 0 && g->fused.dead[sl->first];
                if (dead && ir->nodes[sl->first].op == SG__OP_COPY)
                    sg__text_put(t,
                                 "    buffer b%d: %zu bytes, live over IR lines %d..%d, a copy of "
                                 "b%d read there instead (the copy removed by fusion; no pool "
                                 "bytes)\n",
                                 s, sl->nbytes, sl->first, sl->last, to);
                else if (to >= 0 && !dead)
                    sg__text_put(
                        t,
                        "    buffer b%d: %zu bytes, live over IR lines %d..%d, written straight "
                        "into b%d, where it was copied (the copy removed by fusion; no pool "
                        "bytes)\n",
                        s, sl->nbytes, sl->first, sl->last, to);
                else
                    sg__text_put(t,
                                 "    buffer b%d: %zu bytes, live over IR lines %d..%d, %s (no "
                                 "pool bytes)\n",
                                 s, sl->nbytes, sl->first, sl->last,
                                 g->has_fused && sl->first >= 0 && g->fused.dead[sl->first]
                                     ? "removed by fusion (unused or a duplicate)"
                                     : "in registers");
            } else
                sg__text_put(t,
                    "    buffer b%d: %zu bytes, live over IR lines %d..%d, scratch offset "
                    "%zu\n",
                    s, sl->nbytes, sl->first, sl->last, g->slot_off[s]);
            break;
        }
    }
}

/* Updates moved by readiness (fuse.c multi_ready): how many kernels, and
 * how many parameters' updates they hold. */
static void explain_updates(sg__text *t, const sg__graph *g) {
    int nk = 0, nupd = 0;
    for (int k = 0; k < g->fused.ngroups; k++) {
        const sg__group *grp = &g->fused.groups[k];
        if (!grp->early) continue;
        nk++;
        nupd += grp->kind == SG__G_MULTI ? grp->nmembers : 1;
    }
    if (nk)
        sg__text_put(
            t,
            "    updates by readiness: %d parameter update%s in %d kernel%s moved to just after "
            "their gradients, before the rest of the backward ends (SG_MULTI_READY=0: one "
            "kernel after it)\n",
            nupd, nupd > 1 ? "s" : "", nk, nk > 1 ? "s" : "");
}

/* The anchors a compiled graph leaves to the backend's library kernels
 * although generated code could run such ops, and why (fusion's reason);
 * then the epilogues the library call computes itself (sg__group.lib_epi). */
static void explain_library(sg__text *t, const sg__graph *g) {
    for (int k = 0; k < g->fused.ngroups; k++) {
        const sg__group *grp = &g->fused.groups[k];
        if (!grp->lib_why || grp->anchor < 0) continue;
        int node = grp->g[grp->anchor].node;
        sg__text_put(t, "    library kernel: IR line %d (%s), not generated: %s\n", node,
            sg__op_name(g->ir.nodes[node].op), grp->lib_why);
    }
    static const char *const epi[] = {"", "GELU", "RELU", "a residual as C, beta = 1",
                                      "GELU gradient (DGELU), the GELU's input read as aux"};
    for (int k = 0; k < g->fused.ngroups; k++) {
        const sg__group *grp = &g->fused.groups[k];
        if (grp->kind != SG__G_MATMUL || grp->lib_epi <= 0 || grp->lib_epi > SG__EPI_DGELU)
            continue;
        int node = grp->g[0].node, e = grp->g[1].node;
        sg__text_put(t,
                     "    library epilogue: IR line %d (%s) computes IR line %d (%s) in its "
                     "call: %s%s (else the group's kernel runs it)\n",
                     node, sg__op_name(g->ir.nodes[node].op), e, sg__op_name(g->ir.nodes[e].op),
                     epi[grp->lib_epi], grp->lib_aux ? ", its input written too (aux)" : "");
    }
    for (int k = 0; k < g->fused.ngroups; k++) {
        const sg__group *grp = &g->fused.groups[k];
        if (grp->kind != SG__G_OPAQUE || !grp->ncopies) continue;
        int node = grp->g[0].node;
        char lines[64] = "";
        for (int m = grp->n - grp->ncopies, at = 0; m < grp->n && at < (int)sizeof lines; m++)
            at += snprintf(lines + at, sizeof lines - (size_t)at,
                           m > grp->n - grp->ncopies ? ", %d" : "%d", grp->g[m].node);
        sg__text_put(t,
                     "    attention copies: IR line %d (%s) also writes the copies of IR line%s %s "
                     "(its K/V views) from the rows it reads (else each copy runs alone)\n",
                     node, sg__op_name(g->ir.nodes[node].op), grp->ncopies > 1 ? "s" : "", lines);
    }
    for (int k = 0; k < g->fused.ngroups; k++) { /* the pairs fusion made (take_lone) */
        const sg__group *grp = &g->fused.groups[k];
        if (grp->xent)
            sg__text_put(t,
                         "    cross_entropy pair: IR line %d (cross_entropy_bwd) also computes IR "
                         "line %d (cross_entropy), its loss and their mean, in one kernel at the "
                         "gradient's place (one read of the logits)\n",
                         grp->g[0].node, grp->g[grp->xent].node);
        if (grp->nbsum)
            sg__text_put(t,
                         "    norm gradient sum: IR line %d (norm_bwd) also computes IR line %d "
                         "(sum), the column sum of the gradient it writes, in its kernel (where "
                         "its rows take the one-pass kernel; else the sum runs alone)\n",
                         grp->g[0].node, grp->g[grp->nbsum].node);
    }
    if (g->fused.nbsum_why)
        sg__text_put(t,
                     "    norm gradient sum: IR lines %d (norm_bwd) and %d (sum of its "
                     "gradient) run as two kernels: %s\n",
                     g->fused.nbsum_norm, g->fused.nbsum_sum, g->fused.nbsum_why);
    if (g->fused.xent_why)
        sg__text_put(t,
                     "    cross_entropy pair: IR lines %d (cross_entropy) and %d "
                     "(cross_entropy_bwd) run as two kernels: %s\n",
                     g->fused.xent_fwd, g->fused.xent_bwd, g->fused.xent_why);
}

/* On HIP the library kernels differ from CUDA's: say which run. */
static void explain_hip(sg__text *t, const sg__graph *g) {
    for (int i = 0; i < g->ir.nnodes; i++) {
        int fam = sg__op_family(g->ir.nodes[i].op);
        if (fam == SG__FAM_ATTN)
            sg__text_put(t, "    library kernel: IR line %d (%s): the FMA kernel on HIP (the "
                            "tensor-core kernels are PTX, built for CUDA only)\n",
                i, sg__op_name(g->ir.nodes[i].op));
        else if (fam == SG__FAM_MATMUL && g->compiled)
            sg__text_put(t, "    matmul: IR line %d (%s): generated on HIP, a GEMM of 64 x 64 "
                            "tiles or a GEMV for few rows (no cuBLASLt there; hipBLASLt and "
                            "rocBLAS are not called)\n",
                i, sg__op_name(g->ir.nodes[i].op));
        else if (fam == SG__FAM_MATMUL)
            sg__text_put(t, "    library kernel: IR line %d (%s): the GEMV kernel on HIP, for "
                            "any shape (no cuBLASLt there; hipBLASLt and rocBLAS are not "
                            "called)\n",
                i, sg__op_name(g->ir.nodes[i].op));
    }
}

static void explain_graph(sg__text *t, const sg__graph *g, int gi, int nin) {
    const sg__ir *ir = &g->ir;
    sg__text_put(t, "  capture %d: %d ops, %d buffers, %s\n", gi + 1, ir->nnodes, ir->nslots,
        g->eager ? "runs eagerly" : "replays");
    if (g->eager) sg__text_put(t, "    fallback: %s\n", g->why);
    explain_key(t, g, nin);
    for (int i = 0; i < ir->nnodes; i++) {
        char line[512];
        sg__text_put(t, "    %s\n", sg__ir_node_str(ir, i, line, sizeof line));
    }
    explain_slots(t, g);
    for (int i = 0; g->nodes && t->ctx->backend == SG_BACKEND_CUDA && i < ir->nnodes; i++) {
        char note[256];
        if (sg__mm_pad_note(&g->nodes[i], note, sizeof note))
            sg__text_put(t, "    matmul padding: IR line %d: %s\n", i, note);
        if (sg__cuda_norm_bwd_note(&g->nodes[i], note, sizeof note))
            sg__text_put(t, "    library kernel: IR line %d (norm_bwd): %s\n", i, note);
    }
    if (g->compiled)
        sg__text_put(t, "    kernels: %d (fused from %d IR ops, unit %s%s%s)\n", g->fused.ngroups,
            ir->nnodes, g->module, g->mod ? " in " : "", g->mod ? sg__module_path(g->mod) : "");
    else if (g->custom)
        sg__text_put(t, "    kernels: none; calls run the step that backend_fn gave, eagerly\n");
    else if (g->op_by_op)
        sg__text_put(t, "    kernels: %d (aot_eager: the ops left after cse and dce; unfused, eager kernels "
               "op by op)\n", sg__graph_nkernels(g));
    else if (!g->eager)
        sg__text_put(t, "    kernels: %d (unfused, eager kernels op by op)\n", ir->nnodes);
    if (g->nfolded)
        sg__text_put(t,
            "    constants: %d values folded (%d kernel%s computed once at compile, not in "
            "replays; %zu bytes kept in the pool)\n",
            g->nfolded, g->fused.nconsts, g->fused.nconsts > 1 ? "s" : "", g->const_bytes);
    if (g->compiled) explain_library(t, g);
    if (g->compiled) explain_updates(t, g);
    char lanes[512];
    if (t->ctx->backend == SG_BACKEND_CUDA && sg__cuda_lanes_note(g, lanes, sizeof lanes))
        sg__text_put(t, "    CUDA graph: %s\n", lanes);
    if (t->ctx->backend == SG_BACKEND_HIP) explain_hip(t, g);
    if (!g->eager)
        sg__text_put(t,
            "    memory: scratch %zu bytes (peak live %zu, unshared %zu), output set %zu "
            "bytes x %d, replays %llu\n",
            g->scratch, g->peak, g->unshared, g->out_bytes, g->noutbufs,
            (unsigned long long)g->replays);
}

const char *sg_fn_explain(sg_fn *fn) {
    if (!fn || !sg__reg_fn_known(fn) || fn->magic != SG__FN_LIVE) return "";
    sg__text t = {.ctx = fn->ctx, .buf = fn->explain, .cap = fn->explain_size};
    if (t.buf) t.buf[0] = '\0';
    sg__text_put(&t, "fn '%s': mode %s%s%s, %d inputs, %d outputs, %llu calls (%llu eager)\n", fn->name,
        sg_mode_name(fn->opts.mode), fn->opts.fullgraph ? ", fullgraph" : "",
        fn->opts.disable ? ", disabled" : "", fn->nin, fn->nout,
        (unsigned long long)fn->stats.calls, (unsigned long long)fn->stats.fallbacks);
    if (fn->opts.disable || fn->opts.mode == SG_MODE_EAGER || fn->stance == SG_STANCE_FORCE_EAGER)
        sg__text_put(&t, "  fallback: every call runs eagerly (%s)\n",
            fn->opts.disable                 ? "disable is set"
            : fn->opts.mode == SG_MODE_EAGER ? "mode eager"
                                             : "stance force_eager");
    if (fn->said_limit)
        sg__text_put(&t, "  fallback: cache_size_limit %d reached; new input signatures run eagerly\n",
            fn->opts.cache_size_limit);
    for (int gi = 0; gi < fn->ngraphs; gi++) explain_graph(&t, fn->graphs[gi], gi, fn->nin);
    const sg_fn_stats *c = &fn->stats;
    sg__text_put(&t, "  output sets: %d%s\n", fn->nsets,
        fn->ctx->step ? " (steps marked with sg_mark_step_begin)" : " (each call is a step)");
    sg__text_put(&t,
        "  counters: captures %llu, compiles %llu, cache hits %llu, replays %llu, eager calls "
        "%llu, graph instantiations %llu, exec updates %llu, patched pointers %llu, recycled "
        "output sets %llu\n",
        (unsigned long long)c->captures, (unsigned long long)c->compiles,
        (unsigned long long)c->cache_hits, (unsigned long long)c->replays,
        (unsigned long long)c->fallbacks, (unsigned long long)c->graph_instantiations,
        (unsigned long long)c->exec_updates, (unsigned long long)c->patched_pointers,
        (unsigned long long)c->recycled_sets);
    fn->explain = t.buf;
    fn->explain_size = t.cap;
    return t.buf && !t.oom ? t.buf : "(out of host memory)";
}
