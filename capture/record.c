/* SPDX-License-Identifier: MIT */
/*
 * record.c -- the recorder: while a step runs under capture, every op that
 * reaches sg__dispatch is appended to an IR (see capture.h) as well as
 * executed. Storages are classified the first time the capture sees them:
 * the step's inputs (known up front), buffers the step made (registered as
 * they are allocated), and everything else, which is a parameter: a tensor
 * that outlives the step and that replays read (and may write) in place.
 *
 * Host reads and writes of tensor data inside the step are graph breaks:
 * the replay could not repeat them.
 */
#include "capture.h"

#include <stdio.h>

/* Grow a typed array held by the context's allocator to hold `need` items. */
static bool grow(sg_ctx *ctx, void **arr, int *cap, int need, size_t elem) {
    if (need <= *cap) return true;
    int ncap = *cap ? *cap * 2 : 16;
    while (ncap < need) ncap *= 2;
    void *p = sg__alloc(ctx, (size_t)ncap * elem);
    if (!p) {
        sg__fail(ctx, SG_ERR_OOM, "capture: out of host memory for the IR (%zu bytes)",
                 (size_t)ncap * elem);
        return false;
    }
    if (*arr) {
        memcpy(p, *arr, (size_t)*cap * elem);
        sg__free(ctx, *arr, (size_t)*cap * elem);
    }
    *arr = p;
    *cap = ncap;
    return true;
}

#define GROW(ctx, ir, name, need)                                                                  \
    grow(ctx, (void **)&(ir)->name, &(ir)->cap_##name, need, sizeof *(ir)->name)

static int new_slot(sg_ctx *ctx, sg__ir *ir, sg__slot_kind kind) {
    if (!GROW(ctx, ir, slots, ir->nslots + 1)) return -1;
    sg__slot *s = &ir->slots[ir->nslots];
    memset(s, 0, sizeof *s);
    s->kind = kind;
    s->input = -1;
    s->first = s->last = -1;
    s->output = -1;
    s->mutated_by = -1;
    return ir->nslots++;
}

sg_status sg__rec_begin(sg_ctx *ctx, sg__rec *rec, sg__ir *ir, int nin, sg_tensor *const *in,
                        bool fullgraph) {
    memset(rec, 0, sizeof *rec);
    rec->ir = ir;
    rec->id = ++ctx->next_id;
    rec->fullgraph = fullgraph;
    rec->in = in;
    ir->nin = nin;
    for (int k = 0; k < nin; k++) {
        sg__storage *st = in[k]->st;
        if (st->cap_id == rec->id) continue; /* aliases an earlier input: same slot */
        int s = new_slot(ctx, ir, SG__SLOT_INPUT);
        if (s < 0) return SG_ERR_OOM;
        ir->slots[s].input = k;
        st->cap_id = rec->id;
        st->cap_slot = s;
    }
    ctx->rec = rec;
    return SG_OK;
}

void sg__rec_storage(sg_ctx *ctx, sg__storage *st) {
    sg__rec *rec = ctx->rec;
    if (rec->broken) return;
    int s = new_slot(ctx, rec->ir, SG__SLOT_INTERNAL);
    if (s < 0) { /* out of memory: the capture cannot be replayed */
        rec->broken = true;
        snprintf(rec->why, sizeof rec->why, "out of host memory while recording");
        return;
    }
    rec->ir->slots[s].nbytes = st->nbytes;
    st->cap_id = rec->id;
    st->cap_slot = s;
}

/* The slot of t's storage, classifying it as a parameter if it is new. */
static int slot_of(sg_ctx *ctx, sg__rec *rec, const sg_tensor *t) {
    sg__storage *st = t->st;
    if (st->cap_id == rec->id) {
        sg__slot *sl = &rec->ir->slots[st->cap_slot];
        /* An input's storage read through a tensor from before the call (or
         * a view made of one while recording) that is not an input handle:
         * a parameter passed as an input too. The same handle read both as
         * an input and as a parameter cannot be told apart (stepgraph.h). */
        uint32_t from = t->id < rec->id ? t->id : t->src;
        if (sl->kind == SG__SLOT_INPUT && !sl->alias && from < rec->id) {
            bool handle = false;
            for (int k = 0; k < rec->ir->nin && !handle; k++) handle = rec->in[k]->id == from;
            if (!handle) {
                sl->alias = st;
                st->refs++;
                st->pins++;
            }
        }
        return st->cap_slot;
    }
    int s = new_slot(ctx, rec->ir, SG__SLOT_PARAM);
    if (s < 0) return -1;
    rec->ir->slots[s].param = st;
    rec->ir->slots[s].grad_gen = st->grad_gen;
    st->refs++;
    st->pins++;
    st->cap_id = rec->id;
    st->cap_slot = s;
    return s;
}

/* The offset of a slot's base in its storage, in elements of dtype dt. */
static int64_t slot_base(const sg__slot *sl, sg_tensor *const *in) {
    return sl->kind == SG__SLOT_INPUT ? in[sl->input]->offset : 0;
}

static int new_ref(sg_ctx *ctx, sg__rec *rec, const sg_tensor *t, sg_tensor *const *in) {
    sg__ir *ir = rec->ir;
    int s = slot_of(ctx, rec, t);
    if (s < 0 || !GROW(ctx, ir, refs, ir->nrefs + 1)) return -1;
    sg__ref *r = &ir->refs[ir->nrefs];
    r->slot = s;
    r->dtype = t->dtype;
    r->ndim = t->ndim;
    memcpy(r->shape, t->shape, sizeof r->shape);
    memcpy(r->stride, t->stride, sizeof r->stride);
    r->offset = t->offset - slot_base(&ir->slots[s], in);
    return ir->nrefs++;
}

sg_status sg__rec_node(sg_ctx *ctx, const sg__node *n) {
    sg__rec *rec = ctx->rec;
    sg__ir *ir = rec->ir;
    int idx = ir->nnodes;
    if (!GROW(ctx, ir, nodes, idx + 1) || !GROW(ctx, ir, args, ir->nargs + n->nin))
        return SG_ERR_OOM;
    sg__irnode *node = &ir->nodes[idx];
    memset(node, 0, sizeof *node);
    node->op = n->op;
    memcpy(node->f, n->f, sizeof node->f);
    memcpy(node->i, n->i, sizeof node->i);
    node->mask = n->mask;
    node->nin = n->nin;
    node->args = ir->nargs;
    for (int j = 0; j < n->nin; j++) {
        int r = -1;
        if (n->in[j]) {
            r = new_ref(ctx, rec, n->in[j], rec->in);
            if (r < 0) return SG_ERR_OOM;
            sg__slot *sl = &ir->slots[ir->refs[r].slot];
            if (sl->first < 0) sl->first = idx;
            sl->last = idx;
        }
        ir->args[ir->nargs++] = r;
    }
    node->out = new_ref(ctx, rec, n->out, rec->in);
    if (node->out < 0) return SG_ERR_OOM;
    sg__slot *sl = &ir->slots[ir->refs[node->out].slot];
    if (sl->first < 0) sl->first = idx;
    sl->last = idx;
    if (sl->kind != SG__SLOT_INTERNAL && sl->mutated_by < 0) sl->mutated_by = idx;
    ir->nnodes++;
    return SG_OK;
}

sg_status sg__rec_end(sg_ctx *ctx, int nout, sg_tensor *const *out) {
    sg__rec *rec = ctx->rec;
    sg__ir *ir = rec->ir;
    sg_status s = SG_OK;
    if (!rec->broken) {
        ir->out_refs = sg__alloc(ctx, sizeof(int) * (size_t)(nout ? nout : 1));
        if (!ir->out_refs) s = sg__fail(ctx, SG_ERR_OOM, "capture: out of host memory");
        ir->nout = nout;
        for (int i = 0; s == SG_OK && i < nout; i++) {
            int r = new_ref(ctx, rec, out[i], rec->in);
            if (r < 0) {
                s = SG_ERR_OOM;
                break;
            }
            ir->out_refs[i] = r;
            sg__slot *sl = &ir->slots[ir->refs[r].slot];
            if (sl->kind == SG__SLOT_INTERNAL) {
                if (sl->output < 0) sl->output = i;
                if (sl->first < 0) sl->first = ir->nnodes;
                sl->last = ir->nnodes; /* outputs outlive every node */
            }
        }
    }
    ctx->rec = NULL;
    return s;
}

void sg__ir_free(sg_ctx *ctx, sg__ir *ir) {
    for (int s = 0; s < ir->nslots; s++) {
        sg__storage *held = ir->slots[s].kind == SG__SLOT_PARAM   ? ir->slots[s].param
                            : ir->slots[s].kind == SG__SLOT_INPUT ? ir->slots[s].alias
                                                                  : NULL;
        if (held) {
            held->pins--;
            sg__storage_unref(ctx, held);
        }
    }
    sg__free(ctx, ir->slots, sizeof *ir->slots * (size_t)ir->cap_slots);
    sg__free(ctx, ir->refs, sizeof *ir->refs * (size_t)ir->cap_refs);
    sg__free(ctx, ir->nodes, sizeof *ir->nodes * (size_t)ir->cap_nodes);
    sg__free(ctx, ir->args, sizeof *ir->args * (size_t)ir->cap_args);
    sg__free(ctx, ir->out_refs, sizeof(int) * (size_t)(ir->nout ? ir->nout : 1));
    memset(ir, 0, sizeof *ir);
}

static int ref_str(const sg__ir *ir, int r, char *buf, size_t size) {
    if (r < 0) return snprintf(buf, size, "none");
    const sg__ref *ref = &ir->refs[r];
    const sg__slot *sl = &ir->slots[ref->slot];
    char sh[96];
    sg__shape_str(ref->ndim, ref->shape, sh, sizeof sh);
    const char *kind = sl->kind == SG__SLOT_INPUT ? "in" : sl->kind == SG__SLOT_PARAM ? "p" : "b";
    int id = sl->kind == SG__SLOT_INPUT ? sl->input : ref->slot;
    return snprintf(buf, size, "%s%d:%s%s", kind, id, sg_dtype_name(ref->dtype), sh);
}

const char *sg__ir_node_str(const sg__ir *ir, int node, char *buf, size_t size) {
    const sg__irnode *n = &ir->nodes[node];
    char part[160];
    size_t k = 0;
    ref_str(ir, n->out, part, sizeof part);
    k += (size_t)snprintf(buf + k, size - k, "%3d: %s = %s(", node, part, sg__op_name(n->op));
    for (int j = 0; j < n->nin && k < size; j++) {
        ref_str(ir, ir->args[n->args + j], part, sizeof part);
        k += (size_t)snprintf(buf + k, size - k, j ? ", %s" : "%s", part);
    }
    /* Scalar and integer attributes: those that are set (0 reads as unset). */
    bool first = n->nin == 0;
    for (int j = 0; j < 3 && k < size; j++)
        if (n->f[j] != 0.0) {
            k += (size_t)snprintf(buf + k, size - k, first ? "%.9g" : ", %.9g", n->f[j]);
            first = false;
        }
    for (int j = 0; j < 3 && k < size; j++)
        if (n->i[j] != 0) {
            k += (size_t)snprintf(buf + k, size - k, first ? "i%d=%lld" : ", i%d=%lld", j,
                                  (long long)n->i[j]);
            first = false;
        }
    if (n->mask && k < size)
        k += (size_t)snprintf(buf + k, size - k, first ? "dims=0x%x" : ", dims=0x%x",
                              (unsigned)n->mask);
    if (k < size) snprintf(buf + k, size - k, ")");
    return buf;
}

sg_status sg__rec_break(sg_ctx *ctx, const char *what, const sg_tensor *t) {
    sg__rec *rec = ctx->rec;
    if (rec->broken) return rec->dry ? SG_ERR_GRAPH_BREAK : SG_OK;
    char d[SG__DESC], line[512] = "(before the first op)";
    if (rec->ir->nnodes) sg__ir_node_str(rec->ir, rec->ir->nnodes - 1, line, sizeof line);
    if (rec->fullgraph) {
        rec->refused = true;
        snprintf(rec->why, sizeof rec->why,
                 "%s of %s inside a fullgraph capture is a graph "
                 "break (after IR line %.300s); move host reads and writes out of the step, "
                 "pass host data in as an input tensor, or compile without fullgraph",
                 what, sg__describe(t, d, sizeof d), line);
        return sg__fail(ctx, SG_ERR_GRAPH_BREAK, "%s", rec->why);
    }
    rec->broken = true;
    snprintf(rec->why, sizeof rec->why, "graph break: %s of %s after IR line %s", what,
             sg__describe(t, d, sizeof d), line);
    if (rec->dry) { /* the ops before it never ran: stop the step; it is run again eagerly */
        /* Not an error of the call (logged under graph_breaks by the fn). */
        if (ctx->status == SG_OK) ctx->status = SG_ERR_GRAPH_BREAK;
        snprintf(ctx->msg, sizeof ctx->msg, "%s", rec->why);
        return SG_ERR_GRAPH_BREAK;
    }
    return SG_OK;
}
