/*
 * graph.c -- from a capture's IR to something that replays: the memory plan
 * (intermediates share scratch by liveness; outputs get their own sets so
 * they survive the next replay), storages pointed into the static pool,
 * executable nodes over fixed tensor records, and the replay itself, which
 * patches input addresses and runs the nodes without allocating anything.
 */
#include "graphs.h"

#include <stdio.h>

static size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

static bool is_output_slot(const sg__slot *sl) {
    return sl->kind == SG__SLOT_INTERNAL && sl->output >= 0;
}

/* Scratch offsets by liveness, output offsets one after another. */
static sg_status plan(sg_ctx *ctx, sg__graph *g) {
    sg__ir *ir = &g->ir;
    sg__buf *bufs = sg__alloc(ctx, sizeof *bufs * (size_t)(ir->nslots ? ir->nslots : 1));
    int *which = sg__alloc(ctx, sizeof(int) * (size_t)(ir->nslots ? ir->nslots : 1));
    sg_status s = SG_OK;
    if (!bufs || !which) {
        s = sg__fail(ctx, SG_ERR_OOM, "compile: out of host memory planning buffers");
        goto done;
    }
    int n = 0;
    g->out_bytes = g->unshared = 0;
    for (int i = 0; i < ir->nslots; i++) {
        sg__slot *sl = &ir->slots[i];
        if (sl->kind != SG__SLOT_INTERNAL) continue;
        g->unshared += sl->nbytes;
        if (is_output_slot(sl)) {
            g->slot_off[i] = g->out_bytes;
            g->out_bytes += round_up(sl->nbytes ? sl->nbytes : 1, SG__POOL_ALIGN);
        } else {
            /* A buffer no node touched still gets bytes, live at node 0. */
            int first = sl->first < 0 ? 0 : sl->first;
            bufs[n] = (sg__buf){.size = sl->nbytes, .first = first,
                                .last = sl->last < first ? first : sl->last};
            which[n++] = i;
        }
    }
    s = sg__plan(ctx, bufs, n, SG__POOL_ALIGN, &g->scratch);
    if (s != SG_OK) goto done;
    for (int k = 0; k < n; k++) g->slot_off[which[k]] = bufs[k].offset;
    g->peak = sg__plan_peak(bufs, n);
done:
    sg__free(ctx, bufs, sizeof *bufs * (size_t)(ir->nslots ? ir->nslots : 1));
    sg__free(ctx, which, sizeof(int) * (size_t)(ir->nslots ? ir->nslots : 1));
    return s;
}

#define ALLOC_ARRAY(ctx, ptr, count)                                                               \
    ((ptr) = sg__calloc(ctx, sizeof *(ptr) * (size_t)((count) ? (count) : 1)))

sg_status sg__graph_build(sg_fn *fn, sg__graph *g) {
    sg_ctx *ctx = fn->ctx;
    sg__ir *ir = &g->ir;
    if (!ALLOC_ARRAY(ctx, g->slot_off, ir->nslots) || !ALLOC_ARRAY(ctx, g->slot_st, ir->nslots) ||
        !ALLOC_ARRAY(ctx, g->slot_ptr, ir->nslots) || !ALLOC_ARRAY(ctx, g->ref_t, ir->nrefs) ||
        !ALLOC_ARRAY(ctx, g->args, ir->nargs) || !ALLOC_ARRAY(ctx, g->nodes, ir->nnodes))
        return sg__fail(ctx, SG_ERR_OOM, "compile: out of host memory building the plan");
    sg_status s = plan(ctx, g);
    if (s != SG_OK) return s;
    s = sg__pool_reserve(ctx, g->scratch, 0, NULL);
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
    for (int a = 0; a < ir->nargs; a++) g->args[a] = ir->args[a] < 0 ? NULL : &g->ref_t[ir->args[a]];
    for (int i = 0; i < ir->nnodes; i++) {
        const sg__irnode *in = &ir->nodes[i];
        sg__node *n = &g->nodes[i];
        n->op = in->op;
        memcpy(n->f, in->f, sizeof n->f);
        memcpy(n->i, in->i, sizeof n->i);
        n->mask = in->mask;
        n->nin = in->nin;
        n->in = &g->args[in->args];
        n->out = &g->ref_t[in->out];
    }
    sg__fns_repoint(ctx);
    sg__graph_repoint(ctx, g);
    return SG_OK;
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
            g->slot_st[i].data = sg__pool_addr(ctx, -1, g->slot_off[i]);
    for (int k = 0; k < g->noutbufs; k++) {
        sg__outbuf *ob = &g->outbufs[k];
        if (!ob->st) continue;
        for (int i = 0; i < ir->nslots; i++)
            if (ob->st[i]) ob->st[i]->data = ob->block < 0 ? NULL
                                           : sg__pool_addr(ctx, ob->block, g->slot_off[i]);
    }
    g->pool_gen = ctx->pool->generation;
}

sg_status sg__graph_replay(sg_fn *fn, sg__graph *g, sg_tensor *const *in, int set) {
    sg_ctx *ctx = fn->ctx;
    sg__ir *ir = &g->ir;
    if (ctx->pool && g->pool_gen != ctx->pool->generation) sg__graph_repoint(ctx, g);
    for (int i = 0; i < ir->nslots; i++) {
        sg__slot *sl = &ir->slots[i];
        if (sl->kind == SG__SLOT_INPUT) {
            const sg_tensor *t = in[sl->input];
            g->slot_st[i].data = (char *)t->st->data + t->offset * (int64_t)sg_dtype_size(t->dtype);
        } else if (is_output_slot(sl)) {
            g->slot_st[i].data = g->outbufs[set].st[i]->data;
        }
    }
    for (int i = 0; i < ir->nnodes; i++) {
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
            ob->st[i]->overwritten_in = ctx->step;
            ob->st[i]->data = NULL;
            sg__storage_unref(ctx, ob->st[i]);
        }
        sg__free(ctx, ob->st, sizeof *ob->st * (size_t)nslots);
    }
    sg__free(ctx, g->outbufs, sizeof *g->outbufs * (size_t)(g->noutbufs ? g->noutbufs : 1));
    sg__free(ctx, g->slot_off, sizeof *g->slot_off * (size_t)nslots);
    sg__free(ctx, g->slot_st, sizeof *g->slot_st * (size_t)nslots);
    sg__free(ctx, g->slot_ptr, sizeof *g->slot_ptr * (size_t)nslots);
    sg__free(ctx, g->ref_t, sizeof *g->ref_t * (size_t)(ir->nrefs ? ir->nrefs : 1));
    sg__free(ctx, g->args, sizeof *g->args * (size_t)(ir->nargs ? ir->nargs : 1));
    sg__free(ctx, g->nodes, sizeof *g->nodes * (size_t)(ir->nnodes ? ir->nnodes : 1));
    sg__free(ctx, g->key, sizeof *g->key * (size_t)(ir->nin ? ir->nin : 1));
    sg__ir_free(ctx, ir);
    sg__free(ctx, g, sizeof *g);
}
