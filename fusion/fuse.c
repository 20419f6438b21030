/* SPDX-License-Identifier: MIT */
/*
 * fuse.c -- the fusion passes (see fusion.h): dead-code and common
 * subexpression removal, then grouping of contiguous runs of IR nodes into
 * kernels, then horizontal merging of independent pointwise kernels.
 *
 * Why contiguous runs: a group executes where its run stands in the IR, so
 * no node outside it can observe a reordering. Inside a run, fusing is safe
 * when every value flows element to element: a node may reuse an earlier
 * node's result only through identical geometry, and a storage may not be
 * written and read through different geometries in one group.
 */
#include "fusion.h"

#include <stdio.h>
#include <stdlib.h>

static bool same_shape(int nd, const int64_t *s, const sg__ref *r) {
    if (r->ndim != nd) return false;
    for (int d = 0; d < nd; d++)
        if (s[d] != r->shape[d]) return false;
    return true;
}

/* Where input j of a gnode comes from: arg_src holds 4; inputs past those
 * (concat) always load from memory. */
static int src_of(const sg__gnode *g, int j) { return j < 4 ? g->arg_src[j] : -1; }

static const sg__ref *arg_ref(const sg__ir *ir, const sg__irnode *n, int j, const int *alias) {
    int r = ir->args[n->args + j];
    return r < 0 ? NULL : &ir->refs[alias ? alias[r] : r];
}

/* ------------------------------------------------------------ dce and cse */

/* Collectives stay where they are, each one: every rank must make the same
 * calls in the same order, whatever this rank does with the results. */
static bool is_collective(sg__op op) { return sg__op_family(op) == SG__FAM_COMM; }

/* Mark nodes nothing needs: walk backwards keeping writers of what is read. */
static void dce(const sg__ir *ir, bool *dead, const int *alias, uint8_t *needed_slot) {
    for (int r = 0; r < ir->nout; r++) needed_slot[ir->refs[ir->out_refs[r]].slot] = 1;
    for (int s = 0; s < ir->nslots; s++)
        if (ir->slots[s].kind != SG__SLOT_INTERNAL) needed_slot[s] = 1; /* inputs, params */
    for (int i = ir->nnodes - 1; i >= 0; i--) {
        const sg__irnode *n = &ir->nodes[i];
        if (dead[i]) continue;
        int out_slot = ir->refs[alias[n->out]].slot; /* forward_into moves some */
        if (!needed_slot[out_slot] && !is_collective(n->op)) {
            dead[i] = true;
            continue;
        }
        for (int j = 0; j < n->nin; j++) {
            const sg__ref *a = arg_ref(ir, n, j, alias);
            if (a) needed_slot[a->slot] = 1;
        }
    }
}

static bool same_node(const sg__ir *ir, const sg__irnode *a, const sg__irnode *b, const int *alias) {
    if (a->op != b->op || a->nin != b->nin || a->mask != b->mask ||
        memcmp(a->f, b->f, sizeof a->f) || memcmp(a->i, b->i, sizeof a->i))
        return false;
    const sg__ref *oa = &ir->refs[a->out], *ob = &ir->refs[b->out];
    if (oa->dtype != ob->dtype || oa->ndim != ob->ndim ||
        memcmp(oa->shape, ob->shape, sizeof(int64_t) * (size_t)oa->ndim))
        return false;
    for (int j = 0; j < a->nin; j++) {
        const sg__ref *x = arg_ref(ir, a, j, alias), *y = arg_ref(ir, b, j, alias);
        if ((x == NULL) != (y == NULL) || (x && !sg__same_geom(x, y))) return false;
    }
    return true;
}

/* A cast to a wider dtype: recomputed where it is read, it loads the
 * narrower input; shared between two kernels, it would be stored wide. */
static bool widening_cast(const sg__ir *ir, const sg__irnode *n, const int *alias) {
    const sg__ref *a = n->op == SG__OP_CAST ? arg_ref(ir, n, 0, alias) : NULL;
    return a && sg_dtype_size(ir->refs[n->out].dtype) > sg_dtype_size(a->dtype);
}

/*
 * A node that recomputes an earlier node's value (same op, attributes and
 * inputs, nothing written to its inputs in between, a fresh internal output
 * written once) is dropped, and reads of its output read the earlier one's;
 * a widening cast is left to be recomputed (the clip's norm and the
 * optimizer's update, with sg_optim_step_scaled, both cast a bf16 gradient:
 * merged, the norm's kernel stored an f32 copy that the update read back).
 */
static void cse(const sg__ir *ir, bool *dead, int *alias, const int *writes) {
    for (int i = 0; i < ir->nnodes; i++) {
        const sg__irnode *n = &ir->nodes[i];
        const sg__ref *o = &ir->refs[n->out];
        const sg__slot *os = &ir->slots[o->slot];
        if (is_collective(n->op) || os->kind != SG__SLOT_INTERNAL || os->output >= 0 ||
            writes[o->slot] != 1 || widening_cast(ir, n, alias))
            continue;
        /* A view of the output with another geometry (a transpose, a slice)
         * would still name the removed node's slot: keep such nodes. */
        bool other_view = false;
        for (int r = 0; r < ir->nrefs && !other_view; r++)
            if (ir->refs[r].slot == o->slot && !sg__same_geom(&ir->refs[r], o)) other_view = true;
        if (other_view) continue;
        for (int k = i - 1; k >= 0; k--) {
            const sg__irnode *m = &ir->nodes[k];
            if (dead[k] || !same_node(ir, m, n, alias)) continue;
            bool clobbered = false; /* an input written between k and i */
            for (int q = k + 1; q < i && !clobbered; q++)
                for (int j = 0; j < n->nin; j++) {
                    const sg__ref *a = arg_ref(ir, n, j, alias);
                    if (a && ir->refs[ir->nodes[q].out].slot == a->slot) clobbered = true;
                }
            if (clobbered || writes[ir->refs[m->out].slot] != 1) break;
            dead[i] = true;
            /* Every ref of i's output slot with i's geometry now names m's. */
            for (int r = 0; r < ir->nrefs; r++)
                if (sg__same_geom(&ir->refs[r], o)) alias[r] = m->out;
            break;
        }
    }
}

/* Whether a view of slot `slot` with a geometry other than r's exists. */
static bool other_view(const sg__ir *ir, const sg__ref *r) {
    for (int q = 0; q < ir->nrefs; q++)
        if (ir->refs[q].slot == r->slot && !sg__same_geom(&ir->refs[q], r)) return true;
    return false;
}

/*
 * A copy of a value into a fresh internal slot (sg_clone, as sg_grad's
 * results are) is dropped when the source is an internal value that no
 * node writes after the copy (its producer, or a buffer filled in parts
 * and updated in place before it), of the same shape and strides at any
 * offset (a part of a packed result: a norm's weight gradient): neither
 * can change after the copy, so reads of the copy read the source (W4: the
 * six weight and bias gradients, 7.6 MB copied once more per step; W6: the
 * tied embedding's 77 MB gradient, made by a copy, a fill and index_add,
 * and the 50 norm parameters' gradients, copied in one kernel at the end
 * of the backward).
 */
static void forward_copies(const sg__ir *ir, bool *dead, int *alias, const int *writes) {
    for (int i = 0; i < ir->nnodes; i++) {
        const sg__irnode *n = &ir->nodes[i];
        if (dead[i] || n->op != SG__OP_COPY || n->nin != 1) continue;
        int xr = ir->args[n->args];
        if (xr < 0) continue;
        xr = alias[xr];
        const sg__ref *o = &ir->refs[n->out], *x = &ir->refs[xr];
        const sg__slot *os = &ir->slots[o->slot], *xs = &ir->slots[x->slot];
        bool same = x->dtype == o->dtype && x->ndim == o->ndim && x->slot != o->slot;
        for (int d = 0; same && d < o->ndim; d++)
            same = x->shape[d] == o->shape[d] && (o->shape[d] <= 1 || x->stride[d] == o->stride[d]);
        if (!same || os->kind != SG__SLOT_INTERNAL || os->output >= 0 || writes[o->slot] != 1 ||
            xs->kind != SG__SLOT_INTERNAL || xs->output >= 0 || other_view(ir, o))
            continue;
        bool later = false; /* a write of the source after the copy */
        for (int k = i + 1; k < ir->nnodes && !later; k++)
            later = !dead[k] && ir->refs[alias[ir->nodes[k].out]].slot == x->slot;
        if (later) continue;
        dead[i] = true;
        for (int r = 0; r < ir->nrefs; r++) /* cse's aliases of the copy too */
            if (alias[r] == n->out || sg__same_geom(&ir->refs[r], o)) alias[r] = xr;
    }
}

/* Whether node k reads or writes slot `slot` (through the aliases). */
static bool node_touches(const sg__ir *ir, const int *alias, int k, int slot, bool reads_only) {
    const sg__irnode *n = &ir->nodes[k];
    if (!reads_only && ir->refs[alias[n->out]].slot == slot) return true;
    for (int j = 0; j < n->nin; j++) {
        const sg__ref *a = arg_ref(ir, n, j, alias);
        if (a && a->slot == slot) return true;
    }
    return false;
}

/*
 * A copy of a value into part of a buffer that other nodes fill too (the
 * slices of one gradient placed in one tensor: a tied embedding's LM-head
 * rows, sg_grad's gather of slice parts) is dropped when the value's
 * producer can write it there itself: the source an internal value written
 * once, read only through its one geometry, of the destination's dtype,
 * shape and strides; nothing touches the destination's slot before the
 * copy, and nothing reads the source once a later node writes that slot.
 * The source's refs then alias the destination view, so its producer writes
 * into the buffer (W6: the LM head's 77 MB weight gradient was written,
 * then copied). forward_copies covers a copy into a fresh slot.
 */
static void forward_into(const sg__ir *ir, bool *dead, int *alias, int *writes) {
    for (int i = 0; i < ir->nnodes; i++) {
        const sg__irnode *n = &ir->nodes[i];
        if (dead[i] || n->op != SG__OP_COPY || n->nin != 1 || alias[n->out] != n->out) continue;
        int xr = ir->args[n->args];
        if (xr < 0) continue;
        xr = alias[xr];
        const sg__ref *o = &ir->refs[n->out], *x = &ir->refs[xr];
        const sg__slot *os = &ir->slots[o->slot], *xs = &ir->slots[x->slot];
        bool same = x->dtype == o->dtype && x->ndim == o->ndim && x->slot != o->slot;
        for (int d = 0; same && d < o->ndim; d++)
            same = x->shape[d] == o->shape[d] && (o->shape[d] <= 1 || x->stride[d] == o->stride[d]);
        if (!same || os->kind != SG__SLOT_INTERNAL || os->output >= 0 ||
            xs->kind != SG__SLOT_INTERNAL || xs->output >= 0 || writes[x->slot] != 1 ||
            other_view(ir, x))
            continue;
        bool ok = true;
        for (int k = 0; k < i && ok; k++)
            ok = dead[k] || !node_touches(ir, alias, k, o->slot, false);
        int firstw = ir->nnodes;
        for (int k = i + 1; k < ir->nnodes && firstw == ir->nnodes; k++)
            if (!dead[k] && ir->refs[alias[ir->nodes[k].out]].slot == o->slot) firstw = k;
        for (int k = firstw; k < ir->nnodes && ok; k++)
            ok = dead[k] || !node_touches(ir, alias, k, x->slot, true);
        if (!ok) continue;
        dead[i] = true;
        int xslot = x->slot;
        for (int r = 0; r < ir->nrefs; r++)
            if (ir->refs[alias[r]].slot == xslot) alias[r] = n->out;
        writes[xslot]--;
    }
}

/* ------------------------------------------------------------ grouping */

static bool is_pointwise(sg__op op) { return sg__op_family(op) == SG__FAM_POINTWISE; }

static bool is_row_anchor(sg__op op) {
    return op == SG__OP_SOFTMAX || op == SG__OP_LOG_SOFTMAX || op == SG__OP_LAYER_NORM ||
           op == SG__OP_RMS_NORM;
}

/*
 * Does node i work along rows of its input that a generated kernel can walk
 * as consecutive runs of a row-major order? Softmax and log_softmax over the
 * last dim, the norms, argmax and var of a float input whose reduced dims
 * (of size > 1) all follow its kept ones, and sum/mean of a float input whose dims
 * of size > 1 are kept ones, then reduced ones, then kept ones again (a
 * column sum: (A, R, C) -> (A, 1, C)). *rows, *len and *cols get A, R and
 * C (C is 1 for the others); empty inputs are left to the library.
 */
static bool row_like(const sg__ir *ir, const int *alias, int i, int64_t *rows, int64_t *len,
                     int64_t *cols, const char **why) {
    const sg__irnode *n = &ir->nodes[i];
    const sg__ref *x = arg_ref(ir, n, 0, alias), *o = &ir->refs[alias[n->out]];
    bool idx = n->op == SG__OP_ARGMAX; /* a float row, an i64 result */
    *why = "a 0-d input";
    if (!x || x->ndim < 1) return false;
    *why = "an integer or bool input or result (generated reductions fold floats)";
    if (!sg__dtype_is_float(x->dtype) || !(idx ? o->dtype == SG_I64 : sg__dtype_is_float(o->dtype)))
        return false;
    uint32_t last = 1u << (x->ndim - 1), mask;
    switch (n->op) {
    case SG__OP_SOFTMAX:
    case SG__OP_LOG_SOFTMAX:
        *why = "over a dim other than the last";
        if (n->i[0] != x->ndim - 1) return false;
        mask = last;
        break;
    case SG__OP_LAYER_NORM:
    case SG__OP_RMS_NORM: mask = last; break;
    case SG__OP_SUM:
    case SG__OP_MEAN:
    case SG__OP_VAR:
    case SG__OP_ARGMAX: mask = n->mask; break;
    default: *why = "no generated kernel computes this op"; return false;
    }
    bool columns = n->op == SG__OP_SUM || n->op == SG__OP_MEAN;
    int64_t r = 1, l = 1, c = 1;
    bool inner = false;
    *why = columns ? "its reduced dims are not one run between kept ones (kept, reduced, kept)"
                   : "it keeps dims after its reduced ones";
    for (int d = 0; d < x->ndim; d++) {
        if (x->shape[d] < 1) {
            *why = "an empty input";
            return false;
        }
        if (x->shape[d] == 1) continue;
        if (mask & (1u << d)) {
            if (c > 1) return false;
            inner = true;
            l *= x->shape[d];
        } else if (!inner) {
            r *= x->shape[d];
        } else if (columns) {
            c *= x->shape[d];
        } else {
            return false;
        }
    }
    *rows = r;
    *len = l;
    *cols = c;
    *why = NULL;
    return true;
}

typedef struct builder {
    sg_ctx *ctx;
    const sg__ir *ir;
    const bool *dead;
    const int *alias;
    sg__group *groups;
    int ngroups, cap;
    sg__gnode *scratch; /* the open group's nodes */
    int nscratch;
    bool no_prologue; /* sg__fuse_opts.no_prologue */
    bool rows_inline; /* sg__fuse_opts.rows_inline */
    bool no_epilogue; /* sg__fuse_opts.no_epilogue */
} builder;

/* The gnode of the open group that last wrote ref r's exact geometry, or -1;
 * *conflict when the open group wrote r's slot through another geometry. */
static int producer(const builder *b, const sg__ref *r, bool *conflict) {
    int found = -1;
    for (int k = 0; k < b->nscratch; k++) {
        const sg__ref *o = &b->ir->refs[b->alias[b->ir->nodes[b->scratch[k].node].out]];
        if (o->slot != r->slot) continue;
        if (sg__same_geom(o, r))
            found = k;
        else
            *conflict = true;
    }
    return found;
}

/* Does the open group read slot s from memory through a geometry other than g? */
static bool loads_other_geom(const builder *b, int slot, const sg__ref *g) {
    for (int k = 0; k < b->nscratch; k++) {
        const sg__irnode *n = &b->ir->nodes[b->scratch[k].node];
        for (int j = 0; j < n->nin; j++) {
            const sg__ref *a = arg_ref(b->ir, n, j, b->alias);
            if (a && a->slot == slot && src_of(&b->scratch[k], j) < 0 && !sg__same_geom(a, g))
                return true;
        }
    }
    return false;
}

/*
 * Can node i join the open group as an elementwise member over `shape`?
 * `from` is the first gnode whose values it may reuse (epilogues may not
 * reuse prologue values: those run in another loop).
 */
static bool can_join_pointwise(builder *b, int i, int nd, const int64_t *shape, int from,
                               sg__gnode *gn) {
    const sg__irnode *n = &b->ir->nodes[i];
    const sg__ref *o = &b->ir->refs[b->alias[n->out]];
    if (!same_shape(nd, shape, o)) return false;
    gn->node = i;
    gn->store = false;
    for (int j = 0; j < n->nin; j++) {
        const sg__ref *a = arg_ref(b->ir, n, j, b->alias);
        gn->arg_src[j] = -1;
        if (!a) continue;
        bool conflict = false;
        int p = producer(b, a, &conflict);
        if (conflict || (p >= 0 && p < from)) return false;
        gn->arg_src[j] = p;
    }
    bool conflict = false;
    producer(b, o, &conflict);
    return !conflict && !loads_other_geom(b, o->slot, o);
}

static sg_status push_group(builder *b, sg__gkind kind, int anchor, int nd, const int64_t *shape) {
    if (b->ngroups == b->cap) {
        int ncap = b->cap ? b->cap * 2 : 16;
        sg__group *ng = sg__calloc(b->ctx, sizeof *ng * (size_t)ncap);
        if (!ng) return sg__fail(b->ctx, SG_ERR_OOM, "fusion: out of host memory");
        if (b->groups) {
            memcpy(ng, b->groups, sizeof *ng * (size_t)b->ngroups);
            sg__free(b->ctx, b->groups, sizeof *ng * (size_t)b->cap);
        }
        b->groups = ng;
        b->cap = ncap;
    }
    sg__group *g = &b->groups[b->ngroups];
    memset(g, 0, sizeof *g);
    g->g = sg__alloc(b->ctx, sizeof *g->g * (size_t)(b->nscratch ? b->nscratch : 1));
    if (!g->g) return sg__fail(b->ctx, SG_ERR_OOM, "fusion: out of host memory");
    memcpy(g->g, b->scratch, sizeof *g->g * (size_t)b->nscratch);
    g->n = b->nscratch;
    g->kind = kind;
    g->anchor = anchor;
    g->first = b->nscratch ? b->scratch[0].node : 0;
    g->last = b->nscratch ? b->scratch[b->nscratch - 1].node : 0;
    g->ndim = nd;
    memcpy(g->shape, shape, sizeof(int64_t) * (size_t)nd);
    b->ngroups++;
    b->nscratch = 0;
    return SG_OK;
}

/* Open-group state while walking the IR. */
typedef struct open {
    sg__gkind kind;
    int anchor;   /* scratch index of the anchor, -1 none */
    int epi_from; /* scratch index where the epilogue starts */
    int nd;
    int64_t shape[SG_MAX_DIMS];
    bool rows_inline;   /* the anchor is row-like and computed in generated code */
    int64_t nrows, rowlen, ncols;
    const char *lib_why; /* sg__group.lib_why */
    int bcast;          /* scratch index of the first member over full_shape, 0 none */
    int full_nd;        /* REDUCE with rows_inline: the anchor's input shape, else -1 */
    int64_t full_shape[SG_MAX_DIMS];
} open_t;

static sg_status close_open(builder *b, open_t *og) {
    bool pushed = b->nscratch > 0;
    sg_status s = pushed ? push_group(b, og->kind, og->anchor, og->nd, og->shape) : SG_OK;
    if (s == SG_OK && pushed) b->groups[b->ngroups - 1].lib_why = og->lib_why;
    if (s == SG_OK && og->rows_inline) {
        sg__group *g = &b->groups[b->ngroups - 1];
        g->rows_inline = true;
        g->nrows = og->nrows;
        g->rowlen = og->rowlen;
        g->ncols = og->ncols;
        g->bcast = og->bcast;
    }
    og->kind = SG__G_POINTWISE;
    og->anchor = -1;
    og->epi_from = 0;
    og->nd = 0;
    og->rows_inline = false;
    og->lib_why = NULL;
    og->bcast = 0;
    og->full_nd = -1;
    return s;
}

static void add_node(builder *b, const sg__gnode *gn) { b->scratch[b->nscratch++] = *gn; }

static void set_shape(open_t *og, const sg__ref *r) {
    og->nd = r->ndim;
    memcpy(og->shape, r->shape, sizeof(int64_t) * (size_t)r->ndim);
}

/* Node i is an anchor (reduce, row or matmul): start its group, taking the
 * open pointwise group as prologue where the anchor's input comes from it. */
/*
 * A column sum (rows_inline, ncols > 1) walks its input 32 columns a block:
 * as fast as anything while launches bound it, slower than a pointwise
 * kernel's vector walk once large. So a prologue whose value is also
 * stored (a later node reads it: a relu backward's where that the
 * products read too) joins it only up to this many elements.
 */
#define COL_STORED_PROLOGUE_MAX (1 << 20)

/* Whether a node after i reads slot `slot`. */
static bool read_after(const builder *b, int i, int slot) {
    for (int k = i + 1; k < b->ir->nnodes; k++) {
        if (b->dead[k]) continue;
        const sg__irnode *n = &b->ir->nodes[k];
        for (int j = 0; j < n->nin; j++) {
            const sg__ref *a = arg_ref(b->ir, n, j, b->alias);
            if (a && a->slot == slot) return true;
        }
    }
    return false;
}

static sg_status start_anchor(builder *b, open_t *og, int i, sg__gkind kind) {
    const sg__irnode *n = &b->ir->nodes[i];
    const sg__ref *x = arg_ref(b->ir, n, 0, b->alias);
    int64_t nrows = 0, rowlen = 0, ncols = 1;
    const char *why = NULL;
    bool inl = b->rows_inline && kind != SG__G_MATMUL &&
               row_like(b->ir, b->alias, i, &nrows, &rowlen, &ncols, &why);
    bool prologue = kind != SG__G_MATMUL && (!b->no_prologue || inl) &&
                    og->kind == SG__G_POINTWISE && b->nscratch > 0 && same_shape(og->nd, og->shape, x);
    if (prologue && inl && ncols > 1 && sg__numel(og->nd, og->shape) > COL_STORED_PROLOGUE_MAX &&
        read_after(b, i, x->slot))
        prologue = false;
    sg__gnode gn = {.node = i, .store = true};
    for (int j = 0; j < 4; j++) gn.arg_src[j] = -1;
    if (prologue) {
        /* Every input of the anchor must be loadable: not written in the
         * prologue through another geometry. */
        for (int j = 0; j < n->nin && prologue; j++) {
            const sg__ref *a = arg_ref(b->ir, n, j, b->alias);
            if (!a) continue;
            bool conflict = false;
            int p = producer(b, a, &conflict);
            if (conflict || (j > 0 && p >= 0)) prologue = false;
            if (j == 0) gn.arg_src[0] = p;
        }
        if (prologue && gn.arg_src[0] < 0) prologue = false;
    }
    if (!prologue) {
        sg_status s = close_open(b, og);
        if (s != SG_OK) return s;
        gn.arg_src[0] = -1;
    }
    og->kind = kind;
    og->anchor = b->nscratch;
    add_node(b, &gn);
    og->epi_from = b->nscratch;
    set_shape(og, &b->ir->refs[b->alias[n->out]]);
    og->rows_inline = inl;
    og->nrows = nrows;
    og->rowlen = rowlen;
    og->ncols = ncols;
    og->lib_why = b->rows_inline && kind != SG__G_MATMUL && !inl ? why : NULL;
    /* A column sum's epilogue stays over the reduced shape. */
    if (inl && kind == SG__G_REDUCE && ncols == 1) {
        og->full_nd = x->ndim;
        memcpy(og->full_shape, x->shape, sizeof(int64_t) * (size_t)x->ndim);
    }
    return SG_OK;
}

/* Whether gn reads a value computed in the open group. */
static bool reads_group(const builder *b, const sg__gnode *gn) {
    int nin = b->ir->nodes[gn->node].nin;
    for (int j = 0; j < 4 && j < nin; j++)
        if (gn->arg_src[j] >= 0) return true;
    return false;
}

static sg_status group_nodes(builder *b, bool disable) {
    open_t og = {.kind = SG__G_POINTWISE, .anchor = -1, .full_nd = -1};
    sg_status s = SG_OK;
    for (int i = 0; i < b->ir->nnodes && s == SG_OK; i++) {
        if (b->dead[i]) continue;
        const sg__irnode *n = &b->ir->nodes[i];
        const sg__ref *o = &b->ir->refs[b->alias[n->out]];
        sg__gnode gn;
        if (disable) {
            s = close_open(b, &og);
            if (s != SG_OK) break;
            memset(&gn, 0, sizeof gn);
            gn.node = i;
            gn.store = true;
            for (int j = 0; j < 4; j++) gn.arg_src[j] = -1;
            add_node(b, &gn);
            og.kind = is_pointwise(n->op) ? SG__G_POINTWISE : SG__G_OPAQUE;
            set_shape(&og, o);
            s = close_open(b, &og);
            continue;
        }
        if (is_pointwise(n->op)) {
            bool open_pw = b->nscratch > 0;
            int from = og.kind == SG__G_POINTWISE ? 0 : og.anchor;
            bool pw_ok = open_pw && og.kind != SG__G_OPAQUE &&
                         !(b->no_epilogue && og.kind != SG__G_POINTWISE);
            if (pw_ok && !og.bcast && can_join_pointwise(b, i, og.nd, og.shape, from, &gn)) {
                add_node(b, &gn);
                continue;
            }
            /* After a row reduction, an epilogue over the reduced input's
             * shape (reading the reduced values broadcast along rows). After
             * a reduction of one row, one that reads no value of the group
             * starts a group of its own (the prologue of the next reduction:
             * clip_grad_norm_'s squared norms): joined, its elements would
             * walk that row in one block, where alone they take the GPU. */
            if (pw_ok && og.full_nd >= 0 &&
                can_join_pointwise(b, i, og.full_nd, og.full_shape, from, &gn) &&
                (og.bcast || og.nrows != 1 || reads_group(b, &gn))) {
                if (!og.bcast) og.bcast = b->nscratch;
                add_node(b, &gn);
                continue;
            }
            s = close_open(b, &og);
            if (s != SG_OK) break;
            set_shape(&og, o);
            can_join_pointwise(b, i, og.nd, og.shape, 0, &gn);
            add_node(b, &gn);
            continue;
        }
        sg__family fam = sg__op_family(n->op);
        if (fam == SG__FAM_REDUCE) {
            s = start_anchor(b, &og, i, SG__G_REDUCE);
            /* A generated argmax takes no epilogue (its result is an index). */
            if (s == SG_OK && og.rows_inline && n->op == SG__OP_ARGMAX) s = close_open(b, &og);
        } else if (is_row_anchor(n->op)) {
            s = start_anchor(b, &og, i, SG__G_ROW);
        } else if (fam == SG__FAM_MATMUL) {
            s = start_anchor(b, &og, i, SG__G_MATMUL);
        } else {
            s = close_open(b, &og);
            if (s != SG_OK) break;
            memset(&gn, 0, sizeof gn);
            gn.node = i;
            gn.store = true;
            for (int j = 0; j < 4; j++) gn.arg_src[j] = -1;
            add_node(b, &gn);
            og.kind = SG__G_OPAQUE;
            set_shape(&og, o);
            s = close_open(b, &og);
        }
    }
    if (s == SG_OK) s = close_open(b, &og);
    return s;
}

/* ------------------------------------------------------------ norm into GEMV */

/* Does member k of grp read slot `slot` from memory? */
static bool member_loads(const sg__ir *ir, const int *alias, const sg__gnode *gn, int slot) {
    const sg__irnode *n = &ir->nodes[gn->node];
    for (int j = 0; j < n->nin; j++) {
        const sg__ref *a = arg_ref(ir, n, j, alias);
        if (a && a->slot == slot && src_of(gn, j) < 0) return true;
    }
    return false;
}

/*
 * The member of ROW or REDUCE group r whose value matmul group m's anchor
 * reads as its x: the last writer of x's exact geometry, at or after the
 * norm (a prologue value is not the normalized row), or for a REDUCE group
 * in its epilogue over the input; -1 when there is none, or when r writes
 * x's slot through another geometry or m's other inputs at all.
 */
static int norm_feeds(const sg__ir *ir, const int *alias, const sg__group *r, const sg__group *m) {
    const sg__irnode *mm = &ir->nodes[m->g[m->anchor].node];
    const sg__ref *x = arg_ref(ir, mm, 0, alias);
    int p = -1;
    for (int k = 0; x && k < r->n; k++) {
        const sg__ref *o = &ir->refs[alias[ir->nodes[r->g[k].node].out]];
        for (int j = 1; j < mm->nin; j++) {
            const sg__ref *a = arg_ref(ir, mm, j, alias);
            if (a && a->slot == o->slot) return -1;
        }
        if (o->slot != x->slot) continue;
        if (!sg__same_geom(o, x)) return -1;
        p = k;
    }
    int from = r->kind == SG__G_REDUCE ? r->bcast : r->anchor;
    return p >= from ? p : -1;
}

/*
 * The merged group's kernel runs the norm in every block while other blocks
 * already store the epilogue: no slot that any member writes may be read
 * from memory by any member (an in-place residual, or a weight updated in
 * the step).
 */
static bool merged_safe(const sg__ir *ir, const int *alias, const sg__group *g) {
    for (int k = 0; k < g->n; k++) {
        int slot = ir->refs[alias[ir->nodes[g->g[k].node].out]].slot;
        for (int q = 0; q < g->n; q++)
            if (member_loads(ir, alias, &g->g[q], slot)) return false;
    }
    return true;
}

/* Groups k and j (k < j) replaced by merged at k: their members freed, j
 * taken out of the list. */
static void replace_pair(sg_ctx *ctx, sg__fused *f, int k, int j, const sg__group *merged) {
    sg__group *a = &f->groups[k], *b = &f->groups[j];
    sg__free(ctx, a->g, sizeof *a->g * (size_t)(a->n ? a->n : 1));
    sg__free(ctx, b->g, sizeof *b->g * (size_t)(b->n ? b->n : 1));
    *a = *merged;
    memmove(b, b + 1, sizeof *b * (size_t)(f->ngroups - j - 1));
    f->ngroups--;
}

/* merged, made of groups k and j (k < j), replaces them when it is safe and
 * the backend's gemv_rows takes it (true); otherwise it is freed. */
static bool adopt_merge(sg_ctx *ctx, const sg__ir *ir, const int *alias, sg__fused *f, int k, int j,
                        sg__group *merged,
                        bool (*takes)(const sg__ir *, const int *, const sg__group *)) {
    if (!merged_safe(ir, alias, merged) || !takes(ir, alias, merged)) {
        sg__free(ctx, merged->g, sizeof *merged->g * (size_t)merged->n);
        return false;
    }
    replace_pair(ctx, f, k, j, merged);
    return true;
}

/* a's members, then b's with their sources renumbered after them: a new
 * array of a->n + b->n members, or NULL when out of memory. */
static sg__gnode *joined_members(sg_ctx *ctx, const sg__group *a, const sg__group *b) {
    sg__gnode *g = sg__alloc(ctx, sizeof *g * (size_t)(a->n + b->n));
    if (!g) return NULL;
    memcpy(g, a->g, sizeof *g * (size_t)a->n);
    for (int k = 0; k < b->n; k++) {
        sg__gnode gn = b->g[k];
        for (int j = 0; j < 4; j++)
            if (gn.arg_src[j] >= 0) gn.arg_src[j] += a->n;
        g[a->n + k] = gn;
    }
    return g;
}

/* ROW or REDUCE group r and MATMUL group m as one group (r's members, then
 * m's, renumbered), or false when out of memory. */
static bool merge_norm(sg_ctx *ctx, const sg__group *r, const sg__group *m, int p, sg__group *out) {
    *out = *m;
    out->g = joined_members(ctx, r, m);
    if (!out->g) return false;
    out->n = r->n + m->n;
    out->anchor = r->n + m->anchor;
    out->g[out->anchor].arg_src[0] = p;
    out->first = r->first;
    out->norm_rows = true;
    out->row_anchor = r->anchor;
    out->row_bcast = r->kind == SG__G_REDUCE ? r->bcast : 0;
    out->row_ndim = r->ndim;
    memcpy(out->row_shape, r->shape, sizeof r->shape);
    out->rows_inline = false;
    out->nrows = r->nrows;
    out->rowlen = r->rowlen;
    return true;
}

/* A row group that normalizes: layer_norm or rms_norm, or a sum or mean
 * along rows (not columns) whose epilogue goes on over the input, as a
 * written-out norm's does. */
static bool normalizes(const sg__ir *ir, const sg__group *r) {
    if (!r->rows_inline) return false;
    sg__op op = ir->nodes[r->g[r->anchor].node].op;
    if (r->kind == SG__G_ROW) return op == SG__OP_LAYER_NORM || op == SG__OP_RMS_NORM;
    return r->kind == SG__G_REDUCE && (op == SG__OP_SUM || op == SG__OP_MEAN) && r->ncols == 1 &&
           r->bcast > r->anchor;
}

/* Each normalizing row group that only feeds the next matmul group's x
 * merges into it where the backend's gemv_rows takes the result. */
static sg_status norms_into_gemv(sg_ctx *ctx, const sg__ir *ir, const int *alias, sg__fused *f,
                                 bool (*takes)(const sg__ir *, const int *, const sg__group *)) {
    for (int k = 0; k + 1 < f->ngroups; k++) {
        sg__group *r = &f->groups[k], *m = &f->groups[k + 1];
        if (!normalizes(ir, r) || m->kind != SG__G_MATMUL || m->anchor != 0) continue;
        int p = norm_feeds(ir, alias, r, m);
        if (p < 0) continue;
        sg__group merged;
        if (!merge_norm(ctx, r, m, p, &merged))
            return sg__fail(ctx, SG_ERR_OOM, "fusion: out of host memory");
        adopt_merge(ctx, ir, alias, f, k, k + 1, &merged, takes);
    }
    return SG_OK;
}

/* ------------------------------------------------------------ GEMV pairs */

/*
 * MATMUL group b's epilogue rewired onto a merged group whose member ia is
 * a's anchor (a's result o): a member loading o's exact geometry reuses
 * ia's value; false when one loads o's slot through another geometry, or
 * b's anchor reads o's slot at all (a chain, not a pair).
 */
static bool rewire_pair(const sg__ir *ir, const int *alias, const sg__ref *o, sg__group *m,
                        int from, int ia) {
    for (int k = from; k < m->n; k++) {
        sg__gnode *gn = &m->g[k];
        const sg__irnode *n = &ir->nodes[gn->node];
        for (int j = 0; j < n->nin; j++) {
            const sg__ref *r = arg_ref(ir, n, j, alias);
            if (!r || r->slot != o->slot || src_of(gn, j) >= 0) continue;
            if (k == from || j >= 4 || !sg__same_geom(r, o)) return false;
            gn->arg_src[j] = ia;
        }
    }
    return true;
}

/* MATMUL groups a (no epilogue) and b (no norm) as one group with b's
 * anchor as anchor2, or false when they are no pair; *oom when out of memory. */
static bool merge_pair(sg_ctx *ctx, const sg__ir *ir, const int *alias, const sg__group *a,
                       const sg__group *b, sg__group *out, bool *oom) {
    *oom = false;
    if (a->kind != SG__G_MATMUL || b->kind != SG__G_MATMUL || a->anchor < 0 ||
        a->anchor != a->n - 1 || a->anchor2 || b->anchor != 0 || b->anchor2 || b->norm_rows)
        return false;
    const sg__irnode *na = &ir->nodes[a->g[a->anchor].node], *nb = &ir->nodes[b->g[0].node];
    const sg__ref *xa = arg_ref(ir, na, 0, alias), *xb = arg_ref(ir, nb, 0, alias);
    if (na->op != nb->op || !xa || !xb || !sg__same_geom(xa, xb)) return false;
    *out = *b;
    out->g = joined_members(ctx, a, b);
    if (!out->g) {
        *oom = true;
        return false;
    }
    out->g[a->n].arg_src[0] = a->g[a->anchor].arg_src[0]; /* a's x: the norm's value, or memory */
    out->n = a->n + b->n;
    out->first = a->first;
    out->anchor = a->anchor;
    out->anchor2 = a->n;
    out->norm_rows = a->norm_rows;
    out->row_anchor = a->row_anchor;
    out->row_bcast = a->row_bcast;
    out->row_ndim = a->row_ndim;
    memcpy(out->row_shape, a->row_shape, sizeof a->row_shape);
    out->nrows = a->nrows;
    out->rowlen = a->rowlen;
    out->rows_inline = false;
    if (!rewire_pair(ir, alias, &ir->refs[alias[na->out]], out, a->n, a->anchor)) {
        sg__free(ctx, out->g, sizeof *out->g * (size_t)out->n);
        return false;
    }
    return true;
}

/* Each MATMUL group without epilogue and the next one reading the same x
 * merge where the backend's gemv_rows takes the result. */
static sg_status gemv_pairs(sg_ctx *ctx, const sg__ir *ir, const int *alias, sg__fused *f,
                            bool (*takes)(const sg__ir *, const int *, const sg__group *)) {
    for (int k = 0; k + 1 < f->ngroups; k++) {
        sg__group *a = &f->groups[k], *b = &f->groups[k + 1];
        sg__group merged;
        bool oom;
        if (!merge_pair(ctx, ir, alias, a, b, &merged, &oom)) {
            if (oom) return sg__fail(ctx, SG_ERR_OOM, "fusion: out of host memory");
            continue;
        }
        adopt_merge(ctx, ir, alias, f, k, k + 1, &merged, takes);
    }
    return SG_OK;
}

/* ------------------------------------------------------------ independence */

/* Which groups load each slot from memory: a bit per slot, computed per group. */
static bool group_loads(const sg__ir *ir, const int *alias, const sg__group *g, int slot) {
    for (int k = 0; k < g->n; k++) {
        const sg__irnode *n = &ir->nodes[g->g[k].node];
        for (int j = 0; j < n->nin; j++) {
            const sg__ref *a = arg_ref(ir, n, j, alias);
            if (a && a->slot == slot && src_of(&g->g[k], j) < 0) return true;
        }
    }
    return false;
}

static bool group_touches(const sg__ir *ir, const int *alias, const sg__group *g, int slot,
                          bool *writes) {
    bool loads = group_loads(ir, alias, g, slot);
    *writes = false;
    for (int k = 0; k < g->n; k++)
        if (ir->refs[alias[ir->nodes[g->g[k].node].out]].slot == slot) *writes = true;
    return loads || *writes;
}

/* No slot that one writes is touched by the other. Reads a and b's own
 * nodes (g): a MULTI has none (its members are in sg__fused.parts), so it
 * must be given member by member. */
static bool independent(const sg__ir *ir, const int *alias, const sg__group *a,
                        const sg__group *b) {
    for (int k = 0; k < a->n; k++) {
        int slot = ir->refs[alias[ir->nodes[a->g[k].node].out]].slot;
        bool w;
        if (group_touches(ir, alias, b, slot, &w)) return false;
    }
    for (int k = 0; k < b->n; k++)
        if (group_loads(ir, alias, a, ir->refs[alias[ir->nodes[b->g[k].node].out]].slot))
            return false;
    return true;
}

/* ------------------------------------------------------------ GEMV segments */

/* The products of a bare MATMUL group (nothing but products after its
 * prologue and norm: one, a pair's two or its segments) into at, as member
 * indices; 0 when it is not bare. */
static int bare_products(const sg__group *g, int *at) {
    if (g->kind != SG__G_MATMUL || g->anchor < 0 || g->ncopies || g->argmax || g->post || g->xent ||
        g->lib_epi)
        return 0;
    if (g->nseg) {
        if (g->seg[g->nseg - 1] != g->n - 1) return 0;
        memcpy(at, g->seg, sizeof g->seg[0] * (size_t)g->nseg);
        return g->nseg;
    }
    int last = g->anchor2 ? g->anchor2 : g->anchor;
    if (last != g->n - 1 || (g->anchor2 && g->anchor2 != g->anchor + 1)) return 0;
    at[0] = g->anchor, at[1] = g->anchor2;
    return g->anchor2 ? 2 : 1;
}

/* Bare MATMUL groups a and b (b without a norm) as one group of segments,
 * or false when they are none; *oom when out of memory. */
static bool merge_segments(sg_ctx *ctx, const sg__ir *ir, const int *alias, const sg__group *a,
                           const sg__group *b, sg__group *out, bool *oom) {
    int sa[SG__GEMV_SEGS], sb[SG__GEMV_SEGS], na = bare_products(a, sa), nb = bare_products(b, sb);
    *oom = false;
    if (!na || !nb || na + nb > SG__GEMV_SEGS || b->norm_rows || b->anchor != 0) return false;
    const sg__irnode *xa = &ir->nodes[a->g[a->anchor].node];
    const sg__ref *ra = arg_ref(ir, xa, 0, alias);
    for (int j = 0; j < nb; j++) {
        const sg__irnode *n = &ir->nodes[b->g[sb[j]].node];
        const sg__ref *rb = arg_ref(ir, n, 0, alias);
        if (n->op != xa->op || !ra || !rb || !sg__same_geom(ra, rb)) return false;
    }
    *out = *a;
    out->g = joined_members(ctx, a, b);
    if (!out->g) {
        *oom = true;
        return false;
    }
    out->n = a->n + b->n;
    out->anchor2 = 0;
    out->nseg = na + nb;
    memcpy(out->seg, sa, sizeof sa[0] * (size_t)na);
    for (int j = 0; j < nb; j++) {
        out->seg[na + j] = a->n + sb[j];
        /* a's x: the norm's value, or memory */
        out->g[a->n + sb[j]].arg_src[0] = a->g[a->anchor].arg_src[0];
    }
    return true;
}

#define SEG_LOOK 8 /* groups after a bare one searched for another on its x */

/* Each bare MATMUL group and the bare ones on the same x a few groups after
 * it (every group between them independent of the later one, which then
 * runs earlier: a V projection written after the rotary of Q and K) merge
 * where the backend's gemv_rows takes the result. */
static sg_status gemv_segments(sg_ctx *ctx, const sg__ir *ir, const int *alias, sg__fused *f,
                               bool (*takes)(const sg__ir *, const int *, const sg__group *)) {
    for (int k = 0; k + 1 < f->ngroups; k++) {
        for (int j = k + 1; j < f->ngroups && j <= k + SEG_LOOK; j++) {
            sg__group *a = &f->groups[k], *b = &f->groups[j];
            sg__group merged;
            bool oom, free_path = true;
            for (int i = k + 1; i < j && free_path; i++)
                free_path = independent(ir, alias, b, &f->groups[i]);
            if (!free_path) continue;
            if (!merge_segments(ctx, ir, alias, a, b, &merged, &oom)) {
                if (oom) return sg__fail(ctx, SG_ERR_OOM, "fusion: out of host memory");
                continue;
            }
            if (adopt_merge(ctx, ir, alias, f, k, j, &merged, takes))
                j = k; /* a may take another after it */
        }
    }
    return SG_OK;
}

/* ------------------------------------------------------------ stores */

/*
 * A value is stored when anything outside its group can see it: outputs,
 * writes into inputs and parameters, loads by other groups or from memory
 * by a later member of its own; matmul and
 * opaque results always (the library writes memory); and of several writes
 * of one slot in a group only the last.
 */
static void mark_stores(const sg__ir *ir, const int *alias, sg__group *groups, int ngroups) {
    /* (a row-like anchor that generated code computes reads the prologue's
     * value from a register: rows_inline) */
    for (int gi = 0; gi < ngroups; gi++) {
        sg__group *g = &groups[gi];
        for (int k = 0; k < g->n; k++) {
            const sg__irnode *n = &ir->nodes[g->g[k].node];
            int slot = ir->refs[alias[n->out]].slot;
            const sg__slot *sl = &ir->slots[slot];
            bool store =
                sl->kind != SG__SLOT_INTERNAL || sl->output >= 0 || g->kind == SG__G_OPAQUE ||
                (g->kind == SG__G_MATMUL && (k == g->anchor || (g->anchor2 && k == g->anchor2)));
            for (int j = 0; j < g->nseg && g->kind == SG__G_MATMUL; j++)
                store = store || k == g->seg[j];
            /* The library call of a reduction or row reads its input from
             * memory: the prologue value it takes is stored. */
            if (g->anchor > 0 && !g->rows_inline && !g->norm_rows &&
                g->g[g->anchor].arg_src[0] == k)
                store = true;
            for (int o = 0; o < ngroups && !store; o++)
                if (o != gi && group_loads(ir, alias, &groups[o], slot)) store = true;
            /* A later member loading it from memory (an argmax's post members) */
            for (int q = k + 1; q < g->n && !store; q++)
                if (member_loads(ir, alias, &g->g[q], slot)) store = true;
            for (int q = k + 1; q < g->n && store; q++) /* a later write supersedes */
                if (ir->refs[alias[ir->nodes[g->g[q].node].out]].slot == slot) store = false;
            g->g[k].store = store;
        }
    }
}

/* ------------------------------------------------------------ constants */

/*
 * konst[i]: node i computes the same value in every replay. Its op is
 * pointwise (fill included) or arange, its result is an internal value that
 * is no output and that no other node writes (a constant written in place
 * later is no constant), and each input is such a value of an earlier
 * constant node. Reads of inputs, parameters and RNG states never are.
 */
static void find_consts(const sg__ir *ir, const bool *dead, const int *alias, const int *writes,
                        int *writer, bool *konst) {
    for (int s = 0; s < ir->nslots; s++) writer[s] = -1;
    for (int i = 0; i < ir->nnodes; i++) writer[ir->refs[ir->nodes[i].out].slot] = i;
    for (int i = 0; i < ir->nnodes; i++) {
        const sg__irnode *n = &ir->nodes[i];
        const sg__slot *os = &ir->slots[ir->refs[n->out].slot];
        konst[i] = !dead[i] && (is_pointwise(n->op) || n->op == SG__OP_ARANGE) &&
                   os->kind == SG__SLOT_INTERNAL && os->output < 0 &&
                   writes[ir->refs[n->out].slot] == 1 && alias[n->out] == n->out;
        for (int j = 0; j < n->nin && konst[i]; j++) {
            const sg__ref *a = arg_ref(ir, n, j, alias);
            if (!a) continue;
            int w = writer[a->slot];
            konst[i] = ir->slots[a->slot].kind == SG__SLOT_INTERNAL && writes[a->slot] == 1 &&
                       w >= 0 && w < i && konst[w];
        }
    }
}

/* Whether every value group g loads from memory is made in g or by a
 * group folded before it: a constant made in a group that replays (a fill
 * fused with work on inputs) is not there yet when the folded ones run. */
static bool loads_folded(const sg__ir *ir, const int *alias, const sg__group *g, const int *writer,
                         const bool *folded) {
    for (int k = 0; k < g->n; k++) {
        const sg__irnode *n = &ir->nodes[g->g[k].node];
        for (int j = 0; j < n->nin; j++) {
            const sg__ref *a = arg_ref(ir, n, j, alias);
            if (!a || src_of(&g->g[k], j) >= 0) continue;
            int w = writer[a->slot];
            bool ok = folded && w >= 0 && folded[w];
            for (int q = 0; q < g->n && !ok; q++) ok = g->g[q].node == w;
            if (!ok) return false;
        }
    }
    return true;
}

/* Room for one more group in f->consts (and f->folded, nn nodes). */
static bool consts_room(sg_ctx *ctx, sg__fused *f, int nn) {
    if (!f->folded && !(f->folded = sg__calloc(ctx, sizeof(bool) * (size_t)nn))) return false;
    if (f->nconsts < f->cap_consts) return true;
    int ncap = f->cap_consts ? f->cap_consts * 2 : 4;
    sg__group *nc = sg__alloc(ctx, sizeof *nc * (size_t)ncap);
    if (!nc) return false;
    if (f->consts) {
        memcpy(nc, f->consts, sizeof *nc * (size_t)f->nconsts);
        sg__free(ctx, f->consts, sizeof *nc * (size_t)f->cap_consts);
    }
    f->consts = nc;
    f->cap_consts = ncap;
    return true;
}

/*
 * Groups whose every member is constant (a POINTWISE group, or an OPAQUE
 * arange) and whose loads are their own or folded values leave f->groups
 * for f->consts, their members stored. Run after mark_stores: the groups
 * that read a constant load it from memory already.
 */
static sg_status fold_consts(sg_ctx *ctx, const sg__ir *ir, const int *alias, const int *writes,
                             sg__fused *f) {
    int nn = ir->nnodes ? ir->nnodes : 1, ns = ir->nslots ? ir->nslots : 1;
    bool *konst = sg__calloc(ctx, sizeof(bool) * (size_t)nn);
    int *writer = sg__alloc(ctx, sizeof(int) * (size_t)ns);
    sg_status s = SG_OK;
    if (!konst || !writer) {
        s = sg__fail(ctx, SG_ERR_OOM, "fusion: out of host memory folding constants");
        goto done;
    }
    find_consts(ir, f->dead, alias, writes, writer, konst);
    int kept = 0;
    for (int gi = 0; gi < f->ngroups; gi++) {
        sg__group *g = &f->groups[gi];
        bool all = g->n > 0 &&
                   (g->kind == SG__G_POINTWISE || (g->kind == SG__G_OPAQUE && g->n == 1 &&
                                                   ir->nodes[g->g[0].node].op == SG__OP_ARANGE));
        for (int k = 0; k < g->n && all; k++) all = konst[g->g[k].node];
        if (!all || !loads_folded(ir, alias, g, writer, f->folded)) {
            f->groups[kept++] = *g;
            continue;
        }
        if (!consts_room(ctx, f, nn)) { /* keep the rest as they are */
            for (int r = gi; r < f->ngroups; r++) f->groups[kept++] = f->groups[r];
            s = sg__fail(ctx, SG_ERR_OOM, "fusion: out of host memory folding constants");
            break;
        }
        for (int k = 0; k < g->n; k++) {
            g->g[k].store = true; /* computed by eager kernels, each result in memory */
            f->folded[g->g[k].node] = true;
        }
        f->consts[f->nconsts++] = *g;
    }
    f->ngroups = kept;
done:
    sg__free(ctx, konst, sizeof(bool) * (size_t)nn);
    sg__free(ctx, writer, sizeof(int) * (size_t)ns);
    return s;
}

/* ------------------------------------------------------------ epilogues into the BLAS */

/* Is slot s seen outside group gi: not internal, an output, or loaded by another group? */
static bool seen_outside(const sg__ir *ir, const int *alias, const sg__group *groups, int ngroups,
                         int gi, int slot) {
    const sg__slot *sl = &ir->slots[slot];
    if (sl->kind != SG__SLOT_INTERNAL || sl->output >= 0) return true;
    for (int o = 0; o < ngroups; o++)
        if (o != gi && group_loads(ir, alias, &groups[o], slot)) return true;
    return false;
}

/* Same dtype, shape and strides (offsets and slots may differ). */
static bool same_layout(const sg__ref *a, const sg__ref *b) {
    if (a->dtype != b->dtype || a->ndim != b->ndim) return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d] || (a->shape[d] > 1 && a->stride[d] != b->stride[d]))
            return false;
    return true;
}

/*
 * What the library call of MATMUL group gi can compute of its epilogue
 * (sg__lib_epi): the group must be the anchor and one stored member of its
 * dtype (f32, bf16, f16; GELU and its gradient bf16 and f16 only) and
 * strides, written to a slot that no input of the product is in (the call
 * writes it while it reads them); *res the
 * residual's input index (an add) or the GELU input's (gelu_tanh_bwd),
 * *aux whether the product is seen outside the group (only a GELU's call
 * writes it beside its result).
 */
/*
 * gelu_tanh_bwd(x, g) after the product, as the BLAS's GELU-gradient
 * epilogue: g the product, x loaded (the GELU's input, read as the call's
 * aux) with the result's layout, in a slot of its own, bf16 or f16 (as the
 * GELU epilogue), and a product without a bias (the epilogue adds none).
 */
static int dgelu_of(const sg__ir *ir, const int *alias, const sg__group *g, const sg__ref *a,
                    const sg__ref *o, int *res) {
    const sg__irnode *mm = &ir->nodes[g->g[0].node], *e = &ir->nodes[g->g[1].node];
    const sg__ref *x = arg_ref(ir, e, 0, alias);
    if (e->nin != 2 || g->g[1].arg_src[1] != 0 || g->g[1].arg_src[0] >= 0 || !x ||
        a->dtype == SG_F32 || !same_layout(x, o) || x->slot == o->slot || x->slot == a->slot ||
        (mm->op == SG__OP_LINEAR && mm->nin > 2 && arg_ref(ir, mm, 2, alias)))
        return SG__EPI_NONE;
    *res = 0;
    return SG__EPI_DGELU;
}

static int lib_epi_of(const sg__ir *ir, const int *alias, const sg__group *groups, int ngroups,
                      int gi, int *res, bool *aux) {
    const sg__group *g = &groups[gi];
    *res = -1;
    *aux = false;
    if (g->kind != SG__G_MATMUL || g->anchor != 0 || g->n != 2 || g->anchor2 || g->nseg ||
        g->norm_rows || g->ncopies || !g->g[1].store)
        return SG__EPI_NONE;
    const sg__irnode *mm = &ir->nodes[g->g[0].node], *e = &ir->nodes[g->g[1].node];
    const sg__ref *a = &ir->refs[alias[mm->out]], *o = &ir->refs[alias[e->out]];
    if ((a->dtype != SG_F32 && a->dtype != SG_BF16 && a->dtype != SG_F16) || !same_layout(a, o) ||
        o->slot == a->slot)
        return SG__EPI_NONE;
    for (int j = 0; j < mm->nin; j++) {
        const sg__ref *x = arg_ref(ir, mm, j, alias);
        if (x && x->slot == o->slot) return SG__EPI_NONE;
    }
    *aux = seen_outside(ir, alias, groups, ngroups, gi, a->slot);
    /* GELU in bf16/f16 only: cuBLASLt's tanh is an approximation whose error
     * shows at f32's tolerance (a 2-layer f32 GPT-2's gradients 4e-5 off). */
    if (e->op == SG__OP_GELU_TANH && e->nin == 1 && g->g[1].arg_src[0] == 0)
        return a->dtype == SG_F32 ? SG__EPI_NONE : SG__EPI_GELU;
    if (*aux) return SG__EPI_NONE; /* only GELU's call writes the product too */
    if (e->op == SG__OP_GELU_TANH_BWD) return dgelu_of(ir, alias, g, a, o, res);
    if (e->op == SG__OP_RELU && e->nin == 1 && g->g[1].arg_src[0] == 0) return SG__EPI_RELU;
    if (e->op != SG__OP_ADD || e->nin != 2) return SG__EPI_NONE;
    for (int j = 0; j < 2; j++) {
        const sg__ref *r = arg_ref(ir, e, j, alias);
        if (g->g[1].arg_src[1 - j] != 0 || g->g[1].arg_src[j] >= 0 || !r || !same_layout(r, o) ||
            r->slot == a->slot || (r->slot == o->slot && r->offset != o->offset))
            continue;
        *res = j;
        return SG__EPI_ADD;
    }
    return SG__EPI_NONE;
}

static void lib_epilogues(const sg__ir *ir, const int *alias, sg__group *groups, int ngroups) {
    for (int gi = 0; gi < ngroups; gi++) {
        sg__group *g = &groups[gi];
        g->lib_epi = lib_epi_of(ir, alias, groups, ngroups, gi, &g->lib_res, &g->lib_aux);
        if (!g->lib_epi) g->lib_res = -1, g->lib_aux = false;
    }
}

/* ------------------------------------------------------------ horizontal */

/* An index_copy_ group that a backend's generated kernel can run inside a
 * MULTI (codegen's data walk: idx and src are not dst's slot, src not empty). */
static bool data_member(const sg__ir *ir, const int *alias, const sg__group *g) {
    if (g->kind != SG__G_OPAQUE || g->n != 1) return false;
    const sg__irnode *n = &ir->nodes[g->g[0].node];
    if (n->op != SG__OP_INDEX_COPY || n->nin < 3) return false;
    const sg__ref *o = &ir->refs[alias[n->out]], *idx = arg_ref(ir, n, 1, alias),
                  *src = arg_ref(ir, n, 2, alias);
    if (!idx || !src || o->ndim == 0 || idx->slot == o->slot || src->slot == o->slot) return false;
    for (int d = 0; d < src->ndim; d++)
        if (src->shape[d] == 0) return false;
    return true;
}

/* Can group b join a run whose first group is a? Same kind of member. */
static bool same_member_kind(const sg__ir *ir, const int *alias, const sg__group *a,
                             const sg__group *b, bool data) {
    if (a->kind == SG__G_POINTWISE) return b->kind == SG__G_POINTWISE;
    return data && data_member(ir, alias, a) && data_member(ir, alias, b);
}

static sg_status horizontal(sg_ctx *ctx, const sg__ir *ir, const int *alias, sg__fused *f,
                            bool data) {
    sg__group *in = f->groups;
    int n = f->ngroups;
    sg__group *out = sg__calloc(ctx, sizeof *out * (size_t)(n ? n : 1));
    sg__group *parts = sg__calloc(ctx, sizeof *parts * (size_t)(n ? n : 1));
    int *members = sg__alloc(ctx, sizeof(int) * (size_t)(n ? n : 1));
    if (!out || !parts || !members) {
        sg__free(ctx, out, sizeof *out * (size_t)(n ? n : 1));
        sg__free(ctx, parts, sizeof *parts * (size_t)(n ? n : 1));
        sg__free(ctx, members, sizeof(int) * (size_t)(n ? n : 1));
        return sg__fail(ctx, SG_ERR_OOM, "fusion: out of host memory");
    }
    int nout = 0, nparts = 0;
    for (int i = 0; i < n;) {
        int j = i + 1;
        if (in[i].kind == SG__G_POINTWISE || (data && data_member(ir, alias, &in[i]))) {
            while (j < n && same_member_kind(ir, alias, &in[i], &in[j], data)) {
                bool ok = true;
                for (int k = i; k < j && ok; k++) ok = independent(ir, alias, &in[k], &in[j]);
                if (!ok) break;
                j++;
            }
        }
        if (j - i >= 2) {
            sg__group *m = &out[nout++];
            memset(m, 0, sizeof *m);
            m->kind = SG__G_MULTI;
            m->anchor = -1;
            m->first = in[i].first;
            m->last = in[j - 1].last;
            m->members = sg__alloc(ctx, sizeof(int) * (size_t)(j - i));
            if (!m->members) {
                /* Keep what was merged so far; the rest stays unmerged. */
                nout--;
                for (int k = i; k < n; k++) out[nout++] = in[k];
                break;
            }
            for (int k = i; k < j; k++) {
                m->members[m->nmembers++] = nparts;
                parts[nparts++] = in[k];
            }
        } else {
            out[nout++] = in[i];
        }
        i = j;
    }
    sg__free(ctx, members, sizeof(int) * (size_t)(n ? n : 1));
    sg__free(ctx, in, sizeof *in * (size_t)f->cap_groups);
    f->groups = out;
    f->ngroups = nout;
    f->cap_groups = n ? n : 1;
    f->parts = parts;
    f->nparts = nparts;
    f->cap_parts = n ? n : 1;
    return SG_OK;
}

/* ------------------------------------------------------------ chains */

/* Room for `more` parts in f (after horizontal: parts may be absent). */
/* Room for `more` groups in an array of n (capacity *cap, 1 when 0 and
 * allocated); false when out of memory (nothing changed). */
static bool room_for(sg_ctx *ctx, sg__group **arr, int n, int *cap, int more) {
    if (n + more <= *cap) return true;
    int ncap = n + more;
    sg__group *na = sg__calloc(ctx, sizeof *na * (size_t)ncap);
    if (!na) return false;
    if (*arr) memcpy(na, *arr, sizeof *na * (size_t)n);
    sg__free(ctx, *arr, sizeof *na * (size_t)(*cap ? *cap : 1));
    *arr = na;
    *cap = ncap;
    return true;
}

static bool parts_room(sg_ctx *ctx, sg__fused *f, int more) {
    return room_for(ctx, &f->parts, f->nparts, &f->cap_parts, more);
}

/* Groups [i, j) as one chain at *out (their parts, a MULTI's flattened), or
 * false when out of memory (nothing changed). */
static bool make_chain(sg_ctx *ctx, sg__fused *f, int i, int j, sg__group *out) {
    int nm = 0, nnew = 0;
    for (int k = i; k < j; k++) {
        bool multi = f->groups[k].kind == SG__G_MULTI;
        nm += multi ? f->groups[k].nmembers : 1;
        nnew += !multi;
    }
    int *members = sg__alloc(ctx, sizeof(int) * (size_t)nm);
    if (!members || !parts_room(ctx, f, nnew)) {
        sg__free(ctx, members, sizeof(int) * (size_t)nm);
        return false;
    }
    sg__group c = {.kind = SG__G_MULTI, .anchor = -1, .chain = true, .members = members};
    c.first = f->groups[i].first;
    c.last = f->groups[j - 1].last;
    for (int k = i; k < j; k++) {
        sg__group *g = &f->groups[k];
        if (g->kind != SG__G_MULTI) {
            f->parts[f->nparts] = *g;
            members[c.nmembers++] = f->nparts++;
            continue;
        }
        memcpy(members + c.nmembers, g->members, sizeof(int) * (size_t)g->nmembers);
        c.nmembers += g->nmembers;
        sg__free(ctx, g->members, sizeof(int) * (size_t)g->nmembers);
        sg__free(ctx, g->g, sizeof *g->g * (size_t)(g->n ? g->n : 1));
    }
    *out = c;
    return true;
}

/* Each run of two or more consecutive groups that the backend's chain takes
 * becomes one chain; out of memory leaves a run as it was. */
static void chains(sg_ctx *ctx, const sg__ir *ir, sg__fused *f,
                   bool (*takes)(const sg__ir *, const sg__fused *, const sg__group *)) {
    int nout = 0;
    for (int i = 0; i < f->ngroups;) {
        int j = i;
        while (j < f->ngroups && takes(ir, f, &f->groups[j])) j++;
        sg__group c;
        if (j - i >= 2 && make_chain(ctx, f, i, j, &c)) {
            f->groups[nout++] = c;
            i = j;
        } else {
            for (int k = i; k < (j > i ? j : i + 1); k++) f->groups[nout++] = f->groups[k];
            i = j > i ? j : i + 1;
        }
    }
    f->ngroups = nout;
}

/* ------------------------------------------------------------ horizontal reductions */

/* A full sum or mean (one value; no epilogue over the input's shape) that
 * the backend computes in generated code: a member of a multi-tensor sum. */
static bool sum_member(const sg__ir *ir, const sg__group *g) {
    if (g->kind != SG__G_REDUCE || !g->rows_inline || g->lib_why || g->bcast || g->anchor < 0 ||
        g->nrows != 1 || g->ncols > 1)
        return false;
    sg__op op = ir->nodes[g->g[g->anchor].node].op;
    return op == SG__OP_SUM || op == SG__OP_MEAN;
}

/* The run of sum_member groups from i that are independent of one another,
 * at most SUMS_MAX of them: its end. */
#define SUMS_MAX 1024
static int sums_run(const sg__ir *ir, const int *alias, const sg__group *in, int n, int i) {
    int j = i + 1;
    while (j < n && j - i < SUMS_MAX && sum_member(ir, &in[j])) {
        bool ok = true;
        for (int k = i; k < j && ok; k++) ok = independent(ir, alias, &in[k], &in[j]);
        if (!ok) break;
        j++;
    }
    return j;
}

/* Does group w write a slot that group r loads, or, with `any`, touches
 * at all? A MULTI (either) through its members. */
static bool writes_for(const sg__ir *ir, const int *alias, const sg__fused *f, const sg__group *w,
                       const sg__group *r, bool any) {
    const sg__group *multi = w->kind == SG__G_MULTI ? w : r->kind == SG__G_MULTI ? r : NULL;
    for (int m = 0; multi && m < multi->nmembers; m++) {
        const sg__group *p = &f->parts[multi->members[m]];
        if (multi == w ? writes_for(ir, alias, f, p, r, any) : writes_for(ir, alias, f, w, p, any))
            return true;
    }
    if (multi) return false;
    for (int k = 0; k < w->n; k++) {
        int slot = ir->refs[alias[ir->nodes[w->g[k].node].out]].slot;
        bool wr;
        if (any ? group_touches(ir, alias, r, slot, &wr) : group_loads(ir, alias, r, slot))
            return true;
    }
    return false;
}

/* Does one of groups a and b (a MULTI through its members) touch a slot
 * that the other writes? */
static bool conflict(const sg__ir *ir, const int *alias, const sg__fused *f, const sg__group *a,
                     const sg__group *b) {
    return writes_for(ir, alias, f, a, b, true) || writes_for(ir, alias, f, b, a, true);
}

/* The last of groups [0, n) that writes what g loads (any: that conflicts
 * with g), or -1. */
static int last_before(const sg__ir *ir, const int *alias, const sg__fused *f, int n,
                       const sg__group *g, bool any) {
    for (int p = n - 1; p >= 0; p--)
        if (any ? conflict(ir, alias, f, &f->groups[p], g)
                : writes_for(ir, alias, f, &f->groups[p], g, false))
            return p;
    return -1;
}

/* Does any of groups [from, to) touch a slot that g writes? (What g
 * loads, none of them writes: from is past its last writer.) */
static bool crosses(const sg__ir *ir, const int *alias, const sg__fused *f, int from, int to,
                    const sg__group *g) {
    for (int p = from; p < to; p++)
        if (writes_for(ir, alias, f, g, &f->groups[p], true)) return true;
    return false;
}

/*
 * Runs of two or more independent full reductions (a clip's squared norms)
 * become one MULTI group with `sums` set: one kernel whose blocks take
 * chunks of every member, the last finishing each member's sum and its
 * epilogue.
 *
 * A run comes after the last of the values it reduces (a clip after the
 * whole backward), and those values are ready at different times: the
 * embedding's gradient last, after the chain of its index_add, every
 * layer's before. So the members are cut in two: those whose values are
 * written before the last such write (one kernel, moved to just after its
 * own last producer, where it runs beside what follows), then the rest.
 * Out of memory leaves a run as it was.
 */
static void multi_sums(sg_ctx *ctx, const sg__ir *ir, const int *alias, sg__fused *f) {
    int nout = 0;
    for (int i = 0; i < f->ngroups;) {
        int j =
            sum_member(ir, &f->groups[i]) ? sums_run(ir, alias, f->groups, f->ngroups, i) : i + 1;
        int n = j - i, *ready = n >= 2 ? sg__alloc(ctx, sizeof(int) * (size_t)n) : NULL;
        /* Each member's last producer among the groups already placed. */
        int late = -1, rearly = -1, nearly = 0;
        for (int k = 0; ready && k < n; k++) {
            ready[k] = last_before(ir, alias, f, nout, &f->groups[i + k], false);
            if (ready[k] > late) late = ready[k];
        }
        for (int k = 0; ready && k < n; k++)
            if (ready[k] < late) nearly++, rearly = ready[k] > rearly ? ready[k] : rearly;
        bool split = nearly >= 2;
        int nlate = split ? n - nearly : n;
        int *members = ready && nlate >= 2 ? sg__alloc(ctx, sizeof(int) * (size_t)nlate) : NULL;
        int *early = ready && split ? sg__alloc(ctx, sizeof(int) * (size_t)nearly) : NULL;
        if (!ready || (nlate >= 2 && !members) || (split && !early) || !parts_room(ctx, f, n)) {
            sg__free(ctx, ready, sizeof(int) * (size_t)n);
            sg__free(ctx, members, sizeof(int) * (size_t)nlate);
            sg__free(ctx, early, sizeof(int) * (size_t)nearly);
            for (int k = i; k < j; k++) f->groups[nout++] = f->groups[k];
            i = j;
            continue;
        }
        sg__group m = {.kind = SG__G_MULTI, .anchor = -1, .sums = true, .members = members};
        sg__group e = {.kind = SG__G_MULTI, .anchor = -1, .sums = true, .members = early};
        sg__group lone = {0};
        for (int k = 0; k < n; k++) {
            sg__group *g = &f->groups[i + k], *into = split && ready[k] < late ? &e : &m;
            if (into == &m && nlate == 1) {
                lone = *g;
                continue;
            }
            if (!into->nmembers) into->first = g->first;
            into->last = g->last;
            f->parts[f->nparts] = *g;
            into->members[into->nmembers++] = f->nparts++;
        }
        sg__free(ctx, ready, sizeof(int) * (size_t)n);
        if (split) {
            /* Just after its last producer when nothing between says no. */
            int at = nout;
            if (rearly + 1 < nout && !crosses(ir, alias, f, rearly + 1, nout, &e)) at = rearly + 1;
            memmove(&f->groups[at + 1], &f->groups[at], sizeof *f->groups * (size_t)(nout - at));
            f->groups[at] = e;
            nout++;
        }
        f->groups[nout++] = nlate == 1 ? lone : m;
        i = j;
    }
    f->ngroups = nout;
}

/* ------------------------------------------------------------ updates by readiness */

/* A pointwise group of single values: an optimizer's bias corrections, a
 * schedule's learning rate. */
static bool scalar_group(const sg__ir *ir, const int *alias, const sg__group *g) {
    if (g->kind != SG__G_POINTWISE) return false;
    for (int k = 0; k < g->n; k++) {
        const sg__ref *o = &ir->refs[alias[ir->nodes[g->g[k].node].out]];
        for (int d = 0; d < o->ndim; d++)
            if (o->shape[d] != 1) return false;
    }
    return true;
}

/* Does group g write a parameter (persistent state: a weight, an
 * optimizer's moment, a gradient accumulator) in place? */
static bool writes_param(const sg__ir *ir, const int *alias, const sg__group *g) {
    for (int k = 0; k < g->n; k++)
        if (ir->slots[ir->refs[alias[ir->nodes[g->g[k].node].out]].slot].kind == SG__SLOT_PARAM)
            return true;
    return false;
}

/* Group `from` moved to `to` (to <= from), the groups between one later. */
static void move_group(sg__fused *f, int from, int to) {
    sg__group g = f->groups[from];
    memmove(&f->groups[to + 1], &f->groups[to], sizeof g * (size_t)(from - to));
    f->groups[to] = g;
}

/* A tier of an update's members (TIERS_MAX of them at most): the members
 * whose readiness lies within `span` groups of the first's. */
#define TIERS_MAX 8
#define TIER_SPAN 3
typedef struct tier {
    int from, to; /* members order[from..to) */
    int at;       /* where it goes: after its last member's last conflict */
} tier;

/* The tiers of the members order[0..n) (sorted by ready) with a span of
 * span groups; how many, at most max (then false). */
static bool cut_tiers(const int *ready, const int *order, int n, int span, tier *t, int max,
                      int *nt) {
    *nt = 0;
    for (int k = 0; k < n; k++) {
        int r = ready[order[k]];
        if (!*nt || r > ready[order[t[*nt - 1].from]] + span) {
            if (*nt == max) return false;
            t[(*nt)++] = (tier){.from = k};
        }
        t[*nt - 1].to = k + 1, t[*nt - 1].at = r + 1;
    }
    return true;
}

/*
 * A multi-tensor update (horizontal's MULTI of pointwise members that each
 * write a parameter in place: an optimizer's step over every parameter, a
 * gradient accumulation) comes after the whole backward,
 * but without a clip each parameter's update needs only its own gradient,
 * and the last layers' gradients are ready first. So the members ready
 * before the last (each member's last conflict -- a write of what it reads,
 * a read or write of what it writes -- comes before the latest one's) are
 * cut into tiers by readiness (members within TIER_SPAN groups of each
 * other, the span doubled until there are at most TIERS_MAX), each one
 * group moved to just after its last member's last conflict, where a
 * backend with streams runs it beside the rest of the backward: a deep
 * model's layer updates beside the layers below. The rest stays. The
 * single-value groups it reads (bias corrections computed from the step
 * count) move first, each to just after its own last conflict. Lifetimes
 * follow the group order (graphs/graph.c), so the pool sees the moves. Out
 * of memory leaves a group as it was.
 */
static void multi_ready(sg_ctx *ctx, const sg__ir *ir, const int *alias, sg__fused *f) {
    for (int i = 0; i < f->ngroups; i++) {
        sg__group *m = &f->groups[i];
        if (m->kind != SG__G_MULTI || m->sums || m->chain || m->nmembers < 2) continue;
        bool update = true; /* every member writes a parameter: an optimizer's step */
        for (int k = 0; k < m->nmembers && update; k++)
            update = writes_param(ir, alias, &f->parts[m->members[k]]);
        if (!update) continue;
        for (int p = 0; p < i; p++) {
            const sg__group *s = &f->groups[p];
            if (!scalar_group(ir, alias, s) || !conflict(ir, alias, f, s, &f->groups[i])) continue;
            int at = last_before(ir, alias, f, p, s, true) + 1;
            if (at < p) move_group(f, p, at);
        }
        m = &f->groups[i];
        int n = m->nmembers, *ready = sg__alloc(ctx, sizeof(int) * (size_t)n * 2);
        if (!ready) return;
        int *order = ready + n, late = -1, nearly = 0;
        for (int k = 0; k < n; k++) {
            ready[k] = last_before(ir, alias, f, i, &f->parts[m->members[k]], true);
            if (ready[k] > late) late = ready[k];
        }
        for (int k = 0; k < n; k++) /* a single value gains nothing from a kernel of its own */
            if (scalar_group(ir, alias, &f->parts[m->members[k]])) ready[k] = late;
        for (int k = 0; k < n; k++) /* the early members by readiness, then the rest */
            if (ready[k] < late) order[nearly++] = k;
        for (int a = 1; a < nearly; a++)
            for (int b = a; b > 0 && ready[order[b - 1]] > ready[order[b]]; b--) {
                int x = order[b];
                order[b] = order[b - 1], order[b - 1] = x;
            }
        for (int k = 0, r = nearly; k < n; k++)
            if (ready[k] == late) order[r++] = k;
        tier t[TIERS_MAX];
        int nt = 0;
        for (int span = TIER_SPAN; !cut_tiers(ready, order, nearly, span, t, TIERS_MAX, &nt);)
            span *= 2;
        /* Room for the tiers, and each side's member list. */
        bool room = room_for(ctx, &f->groups, f->ngroups, &f->cap_groups, nt);
        m = &f->groups[i];
        sg__group side[TIERS_MAX + 1]; /* the tiers, then the rest */
        int nside = nt + 1;
        bool ok = room && nt > 0;
        for (int q = 0; q < nside; q++) {
            int cnt = q < nt ? t[q].to - t[q].from : n - nearly;
            side[q] = (sg__group){.kind = SG__G_MULTI, .anchor = -1};
            if (ok && cnt >= 2 && !(side[q].members = sg__alloc(ctx, sizeof(int) * (size_t)cnt)))
                ok = false;
        }
        if (!ok) {
            for (int q = 0; q < nside; q++) {
                int cnt = q < nt ? t[q].to - t[q].from : n - nearly;
                sg__free(ctx, side[q].members, sizeof(int) * (size_t)cnt);
            }
            sg__free(ctx, ready, sizeof(int) * (size_t)n * 2);
            continue;
        }
        /* A side of one member is that member's own group (its part emptied). */
        for (int q = 0; q < nside; q++) {
            int from = q < nt ? t[q].from : nearly, to = q < nt ? t[q].to : n;
            sg__group *g = &side[q];
            for (int k = from; k < to; k++) {
                int part = m->members[order[k]];
                if (!g->members) {
                    *g = f->parts[part];
                    memset(&f->parts[part], 0, sizeof f->parts[part]);
                    continue;
                }
                if (!g->nmembers) g->first = f->parts[part].first;
                g->last = f->parts[part].last;
                g->members[g->nmembers++] = part;
            }
        }
        sg__free(ctx, m->members, sizeof(int) * (size_t)n);
        sg__free(ctx, m->g, sizeof *m->g * (size_t)(m->n ? m->n : 1));
        *m = side[nt];
        /* The latest tier first: each insertion only moves the later ones on. */
        for (int q = nt - 1; q >= 0; q--) {
            side[q].early = true;
            f->groups[f->ngroups++] = side[q];
            move_group(f, f->ngroups - 1, t[q].at);
        }
        sg__free(ctx, ready, sizeof(int) * (size_t)n * 2);
        i += nt; /* the rest moved on */
    }
}

/* ------------------------------------------------------------ cache writes into GEMV */

/*
 * Is group c an index_copy_ of part of group m's matmul result: its src in
 * the anchor's output slot, its dst a slot that no member of m touches and
 * its idx one that none writes (the merged kernel writes dst while its
 * other threads still read)?
 */
static bool copies_result(const sg__ir *ir, const int *alias, const sg__group *m,
                          const sg__group *c) {
    if (c->kind != SG__G_OPAQUE || c->n != 1) return false;
    const sg__irnode *n = &ir->nodes[c->g[0].node];
    if (n->op != SG__OP_INDEX_COPY || n->nin < 3) return false;
    const sg__ref *o = &ir->refs[alias[ir->nodes[m->g[m->anchor].node].out]];
    const sg__ref *d = &ir->refs[alias[n->out]], *idx = arg_ref(ir, n, 1, alias),
                  *src = arg_ref(ir, n, 2, alias);
    if (!idx || !src || src->slot != o->slot || d->slot == o->slot || idx->slot == d->slot)
        return false;
    bool w;
    if (group_touches(ir, alias, m, d->slot, &w)) return false;
    return !(group_touches(ir, alias, m, idx->slot, &w) && w);
}

/* Each MATMUL group and the index_copy_ groups right after it that copy
 * views of its result merge where the backend's gemv_rows takes the
 * result: the copies become the group's last members. */
static sg_status copies_into_gemv(sg_ctx *ctx, const sg__ir *ir, const int *alias, sg__fused *f,
                                  bool (*takes)(const sg__ir *, const int *, const sg__group *)) {
    for (int k = 0; k + 1 < f->ngroups; k++) {
        sg__group *m = &f->groups[k];
        if (m->kind != SG__G_MATMUL || m->anchor < 0 || m->ncopies || m->nseg) continue;
        sg__group merged = *m;
        merged.g = sg__alloc(ctx, sizeof *merged.g * (size_t)(m->n + 8));
        if (!merged.g) return sg__fail(ctx, SG_ERR_OOM, "fusion: out of host memory");
        memcpy(merged.g, m->g, sizeof *merged.g * (size_t)m->n);
        int j = k + 1;
        while (j < f->ngroups && merged.ncopies < 8 &&
               copies_result(ir, alias, &merged, &f->groups[j])) {
            sg__gnode gn = f->groups[j].g[0];
            for (int q = 0; q < 4; q++) gn.arg_src[q] = -1;
            merged.g[merged.n++] = gn;
            merged.ncopies++;
            merged.last = f->groups[j++].last;
        }
        if (!merged.ncopies || !takes(ir, alias, &merged)) {
            sg__free(ctx, merged.g, sizeof *merged.g * (size_t)(m->n + 8));
            continue;
        }
        sg__gnode *g = sg__alloc(ctx, sizeof *g * (size_t)merged.n);
        if (!g) {
            sg__free(ctx, merged.g, sizeof *merged.g * (size_t)(m->n + 8));
            return sg__fail(ctx, SG_ERR_OOM, "fusion: out of host memory");
        }
        memcpy(g, merged.g, sizeof *g * (size_t)merged.n);
        sg__free(ctx, merged.g, sizeof *merged.g * (size_t)(m->n + 8));
        merged.g = g;
        for (int q = k; q < j; q++)
            sg__free(ctx, f->groups[q].g,
                     sizeof *g * (size_t)(f->groups[q].n ? f->groups[q].n : 1));
        *m = merged;
        memmove(m + 1, &f->groups[j], sizeof *m * (size_t)(f->ngroups - j));
        f->ngroups -= j - k - 1;
    }
    return SG_OK;
}

/* ------------------------------------------------------------ copies into attention */

/* Same slot, offset, dtype, shape and strides. */
static bool same_view(const sg__ref *a, const sg__ref *b) {
    return a && b && a->slot == b->slot && a->offset == b->offset && same_layout(a, b);
}

/* Does POINTWISE group c only copy attention a's k or v views (inputs 1, 2)
 * into slots a does not touch, one copy per view? */
static bool copies_attn_inputs(const sg__ir *ir, const int *alias, const sg__group *a,
                               const sg__group *c) {
    const sg__irnode *at = &ir->nodes[a->g[0].node];
    if (c->kind != SG__G_POINTWISE || c->n < 1 || c->n > 2) return false;
    bool used[2] = {false, false};
    for (int i = 0; i < c->n; i++) {
        const sg__irnode *n = &ir->nodes[c->g[i].node];
        if (n->op != SG__OP_COPY || n->nin != 1 || c->g[i].arg_src[0] >= 0) return false;
        const sg__ref *src = arg_ref(ir, n, 0, alias), *dst = &ir->refs[alias[n->out]];
        int which = same_view(src, arg_ref(ir, at, 1, alias))   ? 0
                    : same_view(src, arg_ref(ir, at, 2, alias)) ? 1
                                                                : -1;
        if (which < 0 || used[which] || dst->dtype != src->dtype || dst->ndim != src->ndim)
            return false;
        for (int d = 0; d < src->ndim; d++)
            if (dst->shape[d] != src->shape[d]) return false;
        used[which] = true;
        if (dst->slot == ir->refs[alias[at->out]].slot) return false;
        for (int j = 0; j < at->nin; j++) {
            const sg__ref *x = arg_ref(ir, at, j, alias);
            if (x && x->slot == dst->slot) return false;
        }
    }
    return true;
}

/* Each OPAQUE attention group and the copy group right before it that
 * copies its k and v views elsewhere: the copies become the attention
 * group's last members (nothing between them, and neither reads what the
 * other writes, so the copies may happen while the attention runs). */
static sg_status copies_into_attn(sg_ctx *ctx, const sg__ir *ir, const int *alias, sg__fused *f) {
    for (int k = 1; k < f->ngroups; k++) {
        sg__group *a = &f->groups[k], *c = &f->groups[k - 1];
        if (a->kind != SG__G_OPAQUE || a->n != 1 || a->ncopies ||
            ir->nodes[a->g[0].node].op != SG__OP_ATTENTION || !copies_attn_inputs(ir, alias, a, c))
            continue;
        sg__gnode *g = sg__alloc(ctx, sizeof *g * (size_t)(1 + c->n));
        if (!g) return sg__fail(ctx, SG_ERR_OOM, "fusion: out of host memory");
        g[0] = a->g[0];
        memcpy(g + 1, c->g, sizeof *g * (size_t)c->n);
        sg__free(ctx, a->g, sizeof *g);
        a->g = g;
        a->ncopies = c->n;
        a->n = 1 + c->n;
        a->first = c->first;
        sg__free(ctx, c->g, sizeof *g * (size_t)c->n);
        memmove(c, a, sizeof *c * (size_t)(f->ngroups - k));
        f->ngroups--;
    }
    return SG_OK;
}

/* ------------------------------------------------------------ cross_entropy with its gradient */

/* Lone group `from` (one member) becomes the second member of lone group
 * `into`, its operands read from memory, and leaves the list (the groups
 * after it move down one). */
static sg_status take_lone(sg_ctx *ctx, sg__fused *f, int into, int from) {
    sg__gnode *g = sg__alloc(ctx, sizeof *g * 2);
    if (!g) return sg__fail(ctx, SG_ERR_OOM, "fusion: out of host memory");
    sg__group *a = &f->groups[into];
    g[0] = a->g[0];
    g[1] = f->groups[from].g[0];
    for (int j = 0; j < 4; j++) g[1].arg_src[j] = -1;
    sg__free(ctx, a->g, sizeof *g);
    a->g = g;
    a->n = 2;
    sg__free(ctx, f->groups[from].g, sizeof *g);
    memmove(&f->groups[from], &f->groups[from + 1],
            sizeof *f->groups * (size_t)(f->ngroups - from - 1));
    f->ngroups--;
    return SG_OK;
}

/* The group's node of op, when it is a lone one (nothing else in its kernel). */
static int lone_node(const sg__ir *ir, const sg__group *g, sg__op op) {
    if (g->kind == SG__G_MULTI || g->n != 1 || g->xent || g->nbsum ||
        ir->nodes[g->g[0].node].op != op)
        return -1;
    return g->g[0].node;
}

/* Why cross_entropy group a (the loss in slot ls) may not move to its
 * gradient's group b (logits x, targets t, the loss's gradient gr), or NULL. */
static const char *xent_blocker(const sg__ir *ir, const int *alias, const sg__fused *f, int ka,
                                int kb, const sg__ref *x, const sg__ref *t, const sg__ref *gr) {
    const sg__group *a = &f->groups[ka];
    if (a->kind == SG__G_MULTI || a->n != 1)
        return "the cross_entropy's kernel computes more than the loss (a prologue or epilogue "
               "on it)";
    int ls = ir->refs[alias[ir->nodes[a->g[0].node].out]].slot;
    if (gr && gr->slot == ls) return "the gradient's g is the loss itself";
    for (int k = ka + 1; k < kb; k++) {
        const sg__group *c = &f->groups[k];
        bool w;
        if (group_touches(ir, alias, c, ls, &w))
            return "a kernel between them reads or writes the loss";
        if ((group_touches(ir, alias, c, x->slot, &w) && w) ||
            (group_touches(ir, alias, c, t->slot, &w) && w))
            return "a kernel between them writes the logits or the targets";
    }
    return NULL;
}

/* Each lone CROSS_ENTROPY_BWD group and the nearest group before it holding
 * a CROSS_ENTROPY of the same logits and targets: the forward becomes the
 * gradient's group's second member (sg__group.xent) where xent_blocker
 * allows, else the first refusal is kept and hinted. */
static sg_status xent_pairs(sg_ctx *ctx, const sg__ir *ir, const int *alias, sg__fused *f) {
    for (int kb = 1; kb < f->ngroups; kb++) {
        sg__group *b = &f->groups[kb];
        int bn = lone_node(ir, b, SG__OP_CROSS_ENTROPY_BWD);
        if (bn < 0) continue;
        const sg__irnode *n = &ir->nodes[bn];
        const sg__ref *x = arg_ref(ir, n, 0, alias), *t = arg_ref(ir, n, 1, alias);
        int ka = -1, fwd = -1;
        for (int k = kb - 1; k >= 0 && ka < 0; k--) {
            const sg__group *c = &f->groups[k];
            for (int m = 0; m < c->n && c->kind != SG__G_MULTI; m++) {
                const sg__irnode *a = &ir->nodes[c->g[m].node];
                if (a->op == SG__OP_CROSS_ENTROPY && same_view(arg_ref(ir, a, 0, alias), x) &&
                    same_view(arg_ref(ir, a, 1, alias), t))
                    ka = k, fwd = c->g[m].node;
            }
        }
        if (ka < 0) continue;
        const char *why = xent_blocker(ir, alias, f, ka, kb, x, t, arg_ref(ir, n, 2, alias));
        if (why) {
            sg__log(ctx, "perf_hints",
                    "fusion: cross_entropy (IR line %d) and its gradient (IR line %d) run as two "
                    "kernels, each reading the logits: %s",
                    fwd, bn, why);
            if (!f->xent_why) f->xent_why = why, f->xent_fwd = fwd, f->xent_bwd = bn;
            continue;
        }
        sg_status s = take_lone(ctx, f, kb, ka);
        if (s != SG_OK) return s;
        f->groups[--kb].xent = 1;
    }
    return SG_OK;
}

/* ------------------------------------------------------------ argmax into GEMV */

/* Is r row-major contiguous (dims of one element aside)? */
static bool dense(const sg__ref *r) {
    int64_t st = 1;
    for (int d = r->ndim - 1; d >= 0; d--) {
        if (r->shape[d] == 1) continue;
        if (r->stride[d] != st) return false;
        st *= r->shape[d];
    }
    return true;
}

/* Do a and b hold the same elements in the same row-major order (one a
 * reshape of the other: a squeeze, a flattening)? */
static bool same_elems(const sg__ref *a, const sg__ref *b) {
    int64_t na = 1, nb = 1;
    for (int d = 0; d < a->ndim; d++) na *= a->shape[d];
    for (int d = 0; d < b->ndim; d++) nb *= b->shape[d];
    return a->slot == b->slot && a->dtype == b->dtype && a->offset == b->offset && na == nb &&
           dense(a) && dense(b);
}

/*
 * Is group r an argmax with neither prologue nor epilogue over the rows of
 * matmul group m's result (its elements, through any reshape), m having no
 * member after its anchor (the argmax then reads the anchor's value)?
 */
static bool argmax_of_result(const sg__ir *ir, const int *alias, const sg__group *m,
                             const sg__group *r) {
    if (m->kind != SG__G_MATMUL || m->anchor < 0 || m->anchor != m->n - 1 || m->anchor2 ||
        m->nseg || m->ncopies || m->argmax)
        return false;
    if (r->kind != SG__G_REDUCE || !r->rows_inline || r->anchor != 0 || r->n != 1 || r->bcast ||
        r->ncols > 1)
        return false;
    const sg__irnode *a = &ir->nodes[r->g[0].node];
    const sg__ref *o = &ir->refs[alias[ir->nodes[m->g[m->anchor].node].out]];
    const sg__ref *x = a->op == SG__OP_ARGMAX ? arg_ref(ir, a, 0, alias) : NULL;
    return x && same_elems(x, o);
}

/* Group p after merged group m (with its argmax): a POINTWISE group of at
 * most POST_MAX elements that writes no slot m touches and reads no slot m
 * writes besides the argmax's result. */
#define POST_MAX 64
static bool post_of_argmax(const sg__ir *ir, const int *alias, const sg__group *m,
                           const sg__group *p) {
    if (p->kind != SG__G_POINTWISE || p->n < 1) return false;
    int64_t numel = 1;
    for (int d = 0; d < p->ndim; d++) numel *= p->shape[d];
    if (numel > POST_MAX) return false;
    bool w;
    for (int k = 0; k < p->n; k++)
        if (group_touches(ir, alias, m, ir->refs[alias[ir->nodes[p->g[k].node].out]].slot, &w))
            return false;
    for (int k = 0; k + 1 < m->n; k++)
        if (group_loads(ir, alias, p, ir->refs[alias[ir->nodes[m->g[k].node].out]].slot))
            return false;
    return true;
}

/* merged with group p appended as its post members, or false when out of memory. */
static bool append_post(sg_ctx *ctx, sg__group *merged, const sg__group *p) {
    sg__gnode *g = joined_members(ctx, merged, p);
    if (!g) return false;
    sg__free(ctx, merged->g, sizeof *g * (size_t)merged->n);
    merged->g = g;
    merged->post = merged->n;
    merged->n += p->n;
    merged->post_ndim = p->ndim;
    memcpy(merged->post_shape, p->shape, sizeof p->shape);
    merged->last = p->last;
    return true;
}

/* Each MATMUL group and the argmax group right after it over its result
 * merge where the backend's gemv_rows takes the result, and so does a
 * small pointwise group after the argmax (post_of_argmax). */
static sg_status argmax_into_gemv(sg_ctx *ctx, const sg__ir *ir, const int *alias, sg__fused *f,
                                  bool (*takes)(const sg__ir *, const int *, const sg__group *)) {
    for (int k = 0; k + 1 < f->ngroups; k++) {
        sg__group *m = &f->groups[k], *r = &f->groups[k + 1];
        if (!argmax_of_result(ir, alias, m, r)) continue;
        sg__group merged = *m;
        merged.g = sg__alloc(ctx, sizeof *merged.g * (size_t)(m->n + 1));
        if (!merged.g) return sg__fail(ctx, SG_ERR_OOM, "fusion: out of host memory");
        memcpy(merged.g, m->g, sizeof *merged.g * (size_t)m->n);
        sg__gnode gn = r->g[0];
        for (int q = 0; q < 4; q++) gn.arg_src[q] = -1;
        gn.arg_src[0] = m->anchor;
        merged.g[merged.n] = gn;
        merged.argmax = merged.n++;
        merged.last = r->last;
        if (!takes(ir, alias, &merged)) {
            sg__free(ctx, merged.g, sizeof *merged.g * (size_t)merged.n);
            continue;
        }
        replace_pair(ctx, f, k, k + 1, &merged);
        if (k + 1 >= f->ngroups || !post_of_argmax(ir, alias, m, &f->groups[k + 1])) continue;
        sg__group *p = &f->groups[k + 1];
        merged = *m;
        merged.g = sg__alloc(ctx, sizeof *merged.g * (size_t)m->n);
        if (!merged.g) return sg__fail(ctx, SG_ERR_OOM, "fusion: out of host memory");
        memcpy(merged.g, m->g, sizeof *merged.g * (size_t)m->n);
        if (!append_post(ctx, &merged, p)) {
            sg__free(ctx, merged.g, sizeof *merged.g * (size_t)merged.n);
            return sg__fail(ctx, SG_ERR_OOM, "fusion: out of host memory");
        }
        if (!takes(ir, alias, &merged)) {
            sg__free(ctx, merged.g, sizeof *merged.g * (size_t)merged.n);
            continue;
        }
        replace_pair(ctx, f, k, k + 1, &merged);
    }
    return SG_OK;
}

/* ------------------------------------------------------------ norm gradients with their sums */

/* The group's anchor when it is a sum loading its input from memory, or -1. */
static int sum_anchor(const sg__ir *ir, const sg__group *g) {
    if (g->kind != SG__G_REDUCE || g->anchor < 0 || g->g[g->anchor].arg_src[0] >= 0 ||
        ir->nodes[g->g[g->anchor].node].op != SG__OP_SUM)
        return -1;
    return g->anchor;
}

/* Why sum group ks may not move into NORM_BWD group kn, the last before it
 * to write the result it reads, or NULL: it must sum exactly the norm's
 * input gradient (numel elements from the result's start, in order) over
 * every dim but the last, alone in its kernel, with nothing between them
 * touching the sum's result. */
static const char *nbsum_blocker(const sg__ir *ir, const int *alias, const sg__fused *f, int kn,
                                 int ks) {
    const sg__group *nbg = &f->groups[kn], *s = &f->groups[ks];
    const sg__irnode *nb = &ir->nodes[nbg->g[0].node], *sn = &ir->nodes[s->g[s->anchor].node];
    const sg__ref *o = &ir->refs[alias[nb->out]], *nx = arg_ref(ir, nb, 0, alias);
    const sg__ref *x = arg_ref(ir, sn, 0, alias), *so = &ir->refs[alias[sn->out]];
    int64_t len = nx->shape[nx->ndim - 1], numel = sg__numel(nx->ndim, nx->shape);
    if (s->n != 1) return "the sum's kernel computes more than the sum (an epilogue on it)";
    if (!s->rows_inline || s->ncols != len)
        return "the sum does not keep exactly the last dim (its columns are not the norm's)";
    if (s->nrows != 1) return "the sum keeps a leading dim too (it adds some rows only)";
    if (x->dtype != o->dtype || x->offset != o->offset || !dense(x) ||
        sg__numel(x->ndim, x->shape) != numel)
        return "the sum reads another part of the norm's result, or in another order";
    if (!dense(so) || so->slot == o->slot) return "the sum's result is strided";
    if (nbg->kind != SG__G_OPAQUE || nbg->n != 1)
        return "the norm's kernel already writes another column sum of its gradient";
    for (int k = kn + 1; k < ks; k++) {
        bool w;
        if (group_touches(ir, alias, &f->groups[k], so->slot, &w))
            return "a kernel between them reads or writes the sum's result";
    }
    return NULL;
}

/* Each sum group reading the result of the nearest group before it that
 * writes that result's slot, when that group is a NORM_BWD: the sum
 * becomes the norm's group's second member (sg__group.nbsum) where
 * nbsum_blocker allows, else the first refusal is kept and hinted. */
static sg_status norm_sums(sg_ctx *ctx, const sg__ir *ir, const int *alias, sg__fused *f) {
    for (int ks = 1; ks < f->ngroups; ks++) {
        sg__group *s = &f->groups[ks];
        int a = sum_anchor(ir, s);
        if (a < 0) continue;
        int sn = s->g[a].node, slot = arg_ref(ir, &ir->nodes[sn], 0, alias)->slot, kn = -1;
        for (int k = ks - 1; k >= 0 && kn < 0; k--) {
            bool w;
            if (group_touches(ir, alias, &f->groups[k], slot, &w) && w) kn = k;
        }
        if (kn < 0 || f->groups[kn].kind == SG__G_MULTI ||
            ir->nodes[f->groups[kn].g[0].node].op != SG__OP_NORM_BWD)
            continue;
        int nn = f->groups[kn].g[0].node;
        const char *why = nbsum_blocker(ir, alias, f, kn, ks);
        if (why) {
            sg__log(ctx, "perf_hints",
                    "fusion: the column sum (IR line %d) of a norm's gradient (IR line %d) runs "
                    "as a kernel of its own, reading the gradient again: %s",
                    sn, nn, why);
            if (!f->nbsum_why) f->nbsum_why = why, f->nbsum_norm = nn, f->nbsum_sum = sn;
            continue;
        }
        sg_status st = take_lone(ctx, f, kn, ks);
        if (st != SG_OK) return st;
        f->groups[kn].nbsum = 1;
        ks--;
    }
    return SG_OK;
}

/* ------------------------------------------------------------ entry */

sg_status sg__fuse(sg_ctx *ctx, const sg__ir *ir, const sg__fuse_opts *opts, sg__fused *f) {
    memset(f, 0, sizeof *f);
    int nn = ir->nnodes ? ir->nnodes : 1, nr = ir->nrefs ? ir->nrefs : 1,
        ns = ir->nslots ? ir->nslots : 1;
    f->dead = sg__calloc(ctx, sizeof(bool) * (size_t)nn);
    f->alias = sg__alloc(ctx, sizeof(int) * (size_t)nr);
    int *writes = sg__calloc(ctx, sizeof(int) * (size_t)ns);
    uint8_t *needed = sg__calloc(ctx, (size_t)ns);
    sg__gnode *scratch = sg__alloc(ctx, sizeof *scratch * (size_t)nn);
    sg_status s = SG_OK;
    if (!f->dead || !f->alias || !writes || !needed || !scratch) {
        s = sg__fail(ctx, SG_ERR_OOM, "fusion: out of host memory");
        goto done;
    }
    for (int r = 0; r < ir->nrefs; r++) f->alias[r] = r;
    for (int i = 0; i < ir->nnodes; i++) writes[ir->refs[ir->nodes[i].out].slot]++;
    bool disable = opts && opts->disable;
    if (!disable) {
        cse(ir, f->dead, f->alias, writes);
        forward_copies(ir, f->dead, f->alias, writes);
        forward_into(ir, f->dead, f->alias, writes);
        dce(ir, f->dead, f->alias, needed);
    }
    builder b = {.ctx = ctx, .ir = ir, .dead = f->dead, .alias = f->alias, .scratch = scratch,
                 .no_prologue = opts && opts->no_prologue,
                 .no_epilogue = opts && opts->no_epilogue,
                 .rows_inline = opts && opts->rows_inline};
    bool per_op = disable || (opts && opts->per_op);
    s = group_nodes(&b, per_op);
    f->groups = b.groups;
    f->ngroups = b.ngroups;
    f->cap_groups = b.cap;
    if (s == SG_OK && !per_op && opts && opts->gemv_rows)
        s = norms_into_gemv(ctx, ir, f->alias, f, opts->gemv_rows);
    if (s == SG_OK && !per_op && opts && opts->gemv_rows)
        s = gemv_pairs(ctx, ir, f->alias, f, opts->gemv_rows);
    if (s == SG_OK && !per_op && opts && opts->gemv_rows)
        s = gemv_segments(ctx, ir, f->alias, f, opts->gemv_rows);
    if (s == SG_OK && !per_op && opts && opts->gemv_rows)
        s = copies_into_gemv(ctx, ir, f->alias, f, opts->gemv_rows);
    if (s == SG_OK && !per_op && opts && opts->gemv_rows)
        s = argmax_into_gemv(ctx, ir, f->alias, f, opts->gemv_rows);
    if (s == SG_OK && !per_op && opts && opts->attn_copies)
        s = copies_into_attn(ctx, ir, f->alias, f);
    if (s == SG_OK && !per_op && opts && opts->xent_pairs) s = xent_pairs(ctx, ir, f->alias, f);
    if (s == SG_OK && !per_op && opts && opts->norm_sums) s = norm_sums(ctx, ir, f->alias, f);
    if (s != SG_OK) goto done;
    mark_stores(ir, f->alias, f->groups, f->ngroups);
    for (int k = 0; k < f->ngroups; k++) /* the gradient's kernel writes the loss (xent_pairs) */
        if (f->groups[k].xent) f->groups[k].g[f->groups[k].xent].store = true;
    if (!per_op && !(opts && opts->no_fold)) s = fold_consts(ctx, ir, f->alias, writes, f);
    if (s != SG_OK) goto done;
    if (!per_op && opts && opts->lib_epilogue) lib_epilogues(ir, f->alias, f->groups, f->ngroups);
    if (!per_op && (!opts || opts->horizontal))
        s = horizontal(ctx, ir, f->alias, f, opts && opts->horizontal_data);
    if (s == SG_OK && !per_op && opts && opts->multi_sums) multi_sums(ctx, ir, f->alias, f);
    if (s == SG_OK && !per_op && opts && opts->multi_ready) multi_ready(ctx, ir, f->alias, f);
    if (s == SG_OK && !per_op && opts && opts->chain) chains(ctx, ir, f, opts->chain);
done:
    sg__free(ctx, writes, sizeof(int) * (size_t)ns);
    sg__free(ctx, needed, (size_t)ns);
    sg__free(ctx, scratch, sizeof *scratch * (size_t)nn);
    if (s != SG_OK) sg__fused_free(ctx, f, ir);
    return s;
}

static void free_group(sg_ctx *ctx, sg__group *g) {
    sg__free(ctx, g->g, sizeof *g->g * (size_t)(g->n ? g->n : 1));
    sg__free(ctx, g->members, sizeof(int) * (size_t)(g->nmembers ? g->nmembers : 1));
}

void sg__fused_free(sg_ctx *ctx, sg__fused *f, const sg__ir *ir) {
    for (int i = 0; i < f->ngroups; i++) free_group(ctx, &f->groups[i]);
    for (int i = 0; i < f->nparts; i++) free_group(ctx, &f->parts[i]);
    for (int i = 0; i < f->nconsts; i++) free_group(ctx, &f->consts[i]);
    sg__free(ctx, f->consts, sizeof *f->consts * (size_t)(f->cap_consts ? f->cap_consts : 1));
    if (f->folded) sg__free(ctx, f->folded, sizeof(bool) * (size_t)(ir->nnodes ? ir->nnodes : 1));
    sg__free(ctx, f->groups, sizeof *f->groups * (size_t)(f->cap_groups ? f->cap_groups : 1));
    sg__free(ctx, f->parts, sizeof *f->parts * (size_t)(f->cap_parts ? f->cap_parts : 1));
    sg__free(ctx, f->dead, sizeof(bool) * (size_t)(ir->nnodes ? ir->nnodes : 1));
    sg__free(ctx, f->alias, sizeof(int) * (size_t)(ir->nrefs ? ir->nrefs : 1));
    memset(f, 0, sizeof *f);
}

const char *sg__group_name(const sg__ir *ir, const sg__group *g, char *buf, size_t size) {
    size_t k = 0;
    buf[0] = '\0';
    for (int i = 0; i < g->n && k + 1 < size; i++)
        k += (size_t)snprintf(buf + k, size - k, i ? "_%s" : "%s", sg__op_name(ir->nodes[g->g[i].node].op));
    if (g->kind == SG__G_MULTI)
        snprintf(buf, size, g->chain ? "chain%d" : g->sums ? "sums%d" : "multi%d", g->nmembers);
    return buf;
}
