/* SPDX-License-Identifier: MIT */
/*
 * autograd.c -- gradients recorded with the forward: the backward nodes
 * that ops and views attach to their outputs (see autograd.h), their
 * reference-counted lifetimes, sg_requires_grad_, sg_set_grad_enabled, and
 * sg_grad, which walks back from a loss in reverse topological order and
 * computes every backward with the ordinary op front-ends. Eagerly those
 * ops just run; inside a compiled step they are recorded into the same IR
 * as the forward, so the backward fuses with it and replays with it.
 * The gradients of slices of one tensor meet in one buffer of its shape
 * (settle), with no copy where their producer wrote them in place.
 */
#include "autograd.h"

#include <stdio.h>

/* ------------------------------------------------------------ nodes */

static sg__gnode *gnode_new(sg_ctx *ctx, int op, int nin) {
    size_t bytes = sizeof(sg__gnode) +
                   (size_t)nin * (sizeof(sg__gmeta) + 2 * sizeof(void *) + sizeof(uint32_t));
    sg__gnode *g = sg__calloc(ctx, bytes);
    if (!g) return NULL;
    g->refs = 1;
    g->op = op;
    g->nin = nin;
    g->bytes = bytes;
    char *p = (char *)(g + 1);
    g->in = (sg__gmeta *)p;
    p += (size_t)nin * sizeof(sg__gmeta);
    g->next = (sg__gnode **)p;
    p += (size_t)nin * sizeof(void *);
    g->saved = (sg_tensor **)p;
    p += (size_t)nin * sizeof(void *);
    g->ver = (uint32_t *)p;
    return g;
}

static void meta_of(const sg_tensor *t, sg__gmeta *m) {
    memset(m, 0, sizeof *m);
    if (!t) {
        m->ndim = -1;
        return;
    }
    m->dtype = t->dtype;
    m->ndim = t->ndim;
    memcpy(m->shape, t->shape, sizeof m->shape);
}

/* Free g's block and drop its edges; iterative, since chains of nodes run
 * as deep as the model. The freed node's link reuses its grad field. */
void sg__gnode_unref(sg_ctx *ctx, sg__gnode *g) {
    if (!g || --g->refs > 0) return;
    sg__gnode *todo = g;
    g->grad = NULL;
    while (todo) {
        sg__gnode *n = todo;
        todo = (sg__gnode *)n->grad;
        for (int k = 0; k < n->nin; k++) {
            sg__tensor_unhold(n->saved[k]);
            sg__gnode *e = n->next[k];
            if (e && --e->refs == 0) {
                if (e->grad) sg__tensor_drop(e->grad);
                e->grad = (sg_tensor *)todo;
                todo = e;
            }
        }
        sg__tensor_unhold(n->out);
        sg__free(ctx, n, n->bytes);
    }
}

static sg_tensor *oom(sg_ctx *ctx, sg_tensor *out, const char *what) {
    sg__fail(ctx, SG_ERR_OOM, "%s: out of host memory for its backward node", what);
    sg__tensor_drop(out);
    return NULL;
}

sg_tensor *sg__grad_record(sg_ctx *ctx, const sg__node *n, sg_tensor *out) {
    if (!sg__grad_differentiable(n->op) || !sg__dtype_is_float(out->dtype)) return out;
    bool any = false;
    for (int k = 0; k < n->nin && !any; k++) any = n->in[k] && n->in[k]->grad_fn;
    if (!any) return out;
    sg__gnode *g = gnode_new(ctx, n->op, n->nin);
    if (!g) return oom(ctx, out, sg__op_name(n->op));
    memcpy(g->f, n->f, sizeof g->f);
    memcpy(g->i, n->i, sizeof g->i);
    g->mask = n->mask;
    meta_of(out, &g->outm);
    out->grad_fn = g; /* from here on, dropping out frees g */
    for (int k = 0; k < n->nin; k++) {
        sg_tensor *x = n->in[k];
        meta_of(x, &g->in[k]);
        if (!x) continue;
        if ((g->next[k] = x->grad_fn)) g->next[k]->refs++;
        if (sg__grad_saves_input(n->op, k)) {
            if (!(g->saved[k] = sg__tensor_hold(x))) return oom(ctx, out, sg__op_name(n->op));
            g->ver[k] = x->st->version;
        }
    }
    if (sg__grad_saves_output(n->op)) {
        if (!(g->out = sg__tensor_hold(out))) return oom(ctx, out, sg__op_name(n->op));
        g->out_ver = out->st->version;
    }
    return out;
}

sg_tensor *sg__grad_view(sg_tensor *src, sg_tensor *v, sg__view_kind kind, const int64_t *info) {
    if (!v || !src->grad_fn || src->ctx->grad_off) return v;
    sg__gnode *g = gnode_new(v->ctx, SG__GK_VIEW, 1);
    if (!g) return oom(v->ctx, v, "view");
    g->view = kind;
    if (kind == SG__VIEW_PERMUTE) memcpy(g->info, info, sizeof(int64_t) * (size_t)src->ndim);
    if (kind == SG__VIEW_SLICE) memcpy(g->info, info, sizeof(int64_t) * 3);
    meta_of(v, &g->outm);
    meta_of(src, &g->in[0]);
    g->next[0] = src->grad_fn;
    g->next[0]->refs++;
    v->grad_fn = g;
    return v;
}

/* ------------------------------------------------------------ public flags */

sg_status sg_requires_grad_(sg_tensor *t, bool requires_grad) {
    sg_status s = sg__check_tensor("sg_requires_grad_", t);
    if (s != SG_OK) return s;
    sg_ctx *ctx = t->ctx;
    char d[SG__DESC];
    if (!requires_grad) {
        if (t->grad_fn && t->grad_fn->op != SG__GK_LEAF)
            return sg__fail(ctx, SG_ERR_INVALID_ARG,
                            "sg_requires_grad_: %s is the result of "
                            "an op, not a leaf; to cut it from the graph, sg_clone it with "
                            "sg_set_grad_enabled(ctx, false)",
                            sg__describe(t, d, sizeof d));
        if (t->grad_fn) t->st->grad_gen++; /* captures reading it as a parameter: a guard */
        sg__gnode_unref(ctx, t->grad_fn);
        t->grad_fn = NULL;
        return SG_OK;
    }
    if (!sg__dtype_is_float(t->dtype))
        return sg__fail(ctx, SG_ERR_DTYPE,
                        "sg_requires_grad_: %s; only f32, f16 and bf16 "
                        "tensors have gradients",
                        sg__describe(t, d, sizeof d));
    if (t->grad_fn) return SG_OK;
    sg__gnode *g = gnode_new(ctx, SG__GK_LEAF, 0);
    if (!g) return sg__fail(ctx, SG_ERR_OOM, "sg_requires_grad_: out of host memory for a node");
    meta_of(t, &g->outm);
    t->grad_fn = g;
    t->st->grad_gen++;
    return SG_OK;
}

bool sg_tensor_requires_grad(const sg_tensor *t) {
    return t && t->magic == SG__TENSOR_LIVE && t->grad_fn;
}

sg_status sg_set_grad_enabled(sg_ctx *ctx, bool enabled) {
    if (!ctx) return SG_ERR_NULL;
    ctx->grad_off = !enabled;
    return SG_OK;
}

/* ------------------------------------------------------------ the walk */

/* A growable array of node pointers on the context's allocator. */
typedef struct nodes {
    sg__gnode **v;
    int n, cap;
} nodes;

static bool push(sg_ctx *ctx, nodes *a, sg__gnode *g) {
    if (a->n == a->cap) {
        int cap = a->cap ? a->cap * 2 : 64;
        sg__gnode **v = sg__alloc(ctx, sizeof *v * (size_t)cap);
        if (!v) return false;
        if (a->v) memcpy(v, a->v, sizeof *v * (size_t)a->n);
        sg__free(ctx, a->v, sizeof *v * (size_t)a->cap);
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = g;
    return true;
}

/*
 * The nodes reachable from root in post-order (inputs before the nodes that
 * use them), each marked needed when it is a target or leads to one. An
 * explicit stack, since graphs are as deep as the model.
 */
static sg_status topo(sg_ctx *ctx, sg__gnode *root, uint32_t epoch, nodes *order) {
    nodes stack = {0};
    sg_status s = SG_OK;
    root->epoch = epoch;
    root->needed = false;
    root->grad = NULL;
    if (!push(ctx, &stack, root)) s = SG_ERR_OOM;
    /* The top pushes its first unvisited input node; when none is left, it
     * is emitted (its inputs all were). */
    while (s == SG_OK && stack.n) {
        sg__gnode *g = stack.v[stack.n - 1];
        bool pushed = false;
        for (int k = 0; k < g->nin && !pushed; k++) {
            sg__gnode *e = g->next[k];
            if (!e || e->epoch == epoch) continue;
            e->epoch = epoch;
            e->needed = false;
            e->grad = NULL;
            if (!push(ctx, &stack, e)) s = SG_ERR_OOM;
            pushed = true;
        }
        if (pushed) continue;
        stack.n--;
        g->needed = g->target_epoch == epoch;
        for (int k = 0; k < g->nin; k++)
            if (g->next[k] && g->next[k]->needed) g->needed = true;
        if (!push(ctx, order, g)) s = SG_ERR_OOM;
    }
    sg__free(ctx, stack.v, sizeof *stack.v * (size_t)stack.cap);
    if (s != SG_OK) return sg__fail(ctx, s, "sg_grad: out of host memory for the graph walk");
    return SG_OK;
}

static const char *node_name(const sg__gnode *g) {
    return g->op == SG__GK_VIEW ? "a view" : g->op == SG__GK_LEAF ? "leaf" : sg__op_name(g->op);
}

/* A tensor the backward reads was written in place after the forward read it. */
static sg_status check_versions(sg_ctx *ctx, const sg__gnode *g) {
    for (int k = 0; k <= g->nin; k++) {
        const sg_tensor *h = k < g->nin ? g->saved[k] : g->out;
        uint32_t v = k < g->nin ? g->ver[k] : g->out_ver;
        if (!h || h->st->version == v) continue;
        char d[SG__DESC], what[32];
        snprintf(what, sizeof what, k < g->nin ? "input %d" : "the output", k);
        return sg__fail(ctx, SG_ERR_INVALID_ARG,
                        "sg_grad: %s (%s) that the backward of %s needs "
                        "was modified by an in-place op (sg_copy_, sg_add_, sg_fill_ or "
                        "sg_index_copy_) after the forward used it; clone it before writing, or "
                        "take the gradient before the in-place write",
                        what, sg__describe(h, d, sizeof d), node_name(g));
    }
    return SG_OK;
}

/* Drop every handle made since mark (on the live list, newest last), but
 * the ones in keep: the intermediates of one backward rule. */
static void sweep(sg_ctx *ctx, uint32_t mark, sg_tensor *const *keep, int nkeep) {
    sg_tensor *t = ctx->live.prev;
    while (t != &ctx->live && t->id > mark) {
        sg_tensor *p = t->prev;
        bool kept = false;
        for (int k = 0; k < nkeep && !kept; k++) kept = keep[k] == t;
        if (!kept) sg__tensor_drop(t);
        t = p;
    }
}

/* t summed over the dims it broadcast from m's shape, reshaped to it, in m's dtype. */
static sg_tensor *sum_to(sg_tensor *t, const sg__gmeta *m) {
    if (!t) return NULL;
    int dims[SG_MAX_DIMS], nd = 0, lead = t->ndim - m->ndim;
    bool bcast = lead >= 0; /* else t is a reshape of m's shape */
    for (int d = lead > 0 ? lead : 0; bcast && d < t->ndim; d++)
        bcast = m->shape[d - lead] == t->shape[d] || m->shape[d - lead] == 1;
    for (int d = 0; bcast && d < t->ndim; d++)
        if (d < lead || (m->shape[d - lead] == 1 && t->shape[d] != 1)) dims[nd++] = d;
    sg_tensor *r = t;
    if (nd) r = sg_sum(r, nd, dims, true);
    if (r &&
        (r->ndim != m->ndim || memcmp(r->shape, m->shape, sizeof(int64_t) * (size_t)m->ndim) != 0))
        r = sg_reshape(r, m->ndim, m->shape);
    if (r && r->dtype != m->dtype) r = sg_cast(r, m->dtype);
    return r;
}

/* Add gi into e's gradient. */
static sg_status accumulate(sg_ctx *ctx, sg__gnode *e, sg_tensor *gi) {
    if (!e->grad) {
        e->grad = gi;
        return SG_OK;
    }
    sg_tensor *sum = sg_add(e->grad, gi);
    sg__tensor_drop(gi);
    if (!sum) return ctx->status != SG_OK ? ctx->status : SG_ERR_INTERNAL;
    sg__tensor_drop(e->grad);
    e->grad = sum;
    return SG_OK;
}

/* ------------------------------------------------------------ slices of one tensor */

/*
 * The gradients of slice views (narrow, slice) of one tensor are not each
 * padded with zeros to the tensor's shape and added: each is kept as a
 * part of the viewed node, and when that node's backward comes up (every
 * consumer has given its gradient by then) settle places them in one
 * tensor. Disjoint step-1 slices of one dim that cover it, whose gradients
 * are views of one storage placed where their slices lie in one view of
 * the base's shape (a producer that wrote them as the forward's views lay,
 * as ATTENTION_BWD does for q, k, v narrowed from one projection, or a
 * concat's backward), are that view: no copy at all. Other disjoint ones
 * are copied into their slices of one new tensor, zeros only where no
 * slice lies. Overlapping slices, or slices of several dims or steps, are
 * padded and added as a single slice's would be.
 */

/* Hand the gradient of slice view g to the node it views, as a part. */
static sg_status push_part(sg_ctx *ctx, sg__gnode *g) {
    sg__gnode *e = g->next[0];
    if (e->nparts == e->partcap) {
        int cap = e->partcap ? e->partcap * 2 : 4;
        sg__gpart *v = sg__alloc(ctx, sizeof *v * (size_t)cap);
        if (!v)
            return sg__fail(ctx, SG_ERR_OOM, "sg_grad: out of host memory for a slice's gradient");
        if (e->parts) memcpy(v, e->parts, sizeof *v * (size_t)e->nparts);
        sg__free(ctx, e->parts, sizeof *v * (size_t)e->partcap);
        e->parts = v;
        e->partcap = cap;
    }
    sg_tensor *t = g->grad;
    sg_tensor *h = sg_reshape(t, t->ndim, t->shape); /* a handle of its own */
    if (!h) return ctx->status != SG_OK ? ctx->status : SG_ERR_INTERNAL;
    e->parts[e->nparts++] = (sg__gpart){h, (int)g->info[0], g->info[1], g->info[2]};
    return SG_OK;
}

/* Whether g's gradient can go to its node as a part: a slice view whose
 * gradient has the view's shape and the base's dtype. */
static bool takes_part(const sg__gnode *g) {
    const sg_tensor *t = g->grad;
    return g->op == SG__GK_VIEW && g->view == SG__VIEW_SLICE && t && t->dtype == g->in[0].dtype &&
           t->ndim == g->outm.ndim &&
           memcmp(t->shape, g->outm.shape, sizeof(int64_t) * (size_t)t->ndim) == 0;
}

static void drop_parts(sg_ctx *ctx, sg__gnode *e) {
    for (int k = 0; k < e->nparts; k++) sg__tensor_drop(e->parts[k].g);
    sg__free(ctx, e->parts, sizeof *e->parts * (size_t)e->partcap);
    e->parts = NULL;
    e->nparts = e->partcap = 0;
}

/* Whether e's parts are step-1 slices of one dim that do not overlap;
 * sorts them by start when they are of one dim. */
static bool parts_disjoint(sg__gnode *e) {
    sg__gpart *p = e->parts;
    int dim = p[0].dim;
    for (int k = 0; k < e->nparts; k++)
        if (p[k].dim != dim || p[k].step != 1) return false;
    for (int k = 1; k < e->nparts; k++)
        for (int j = k; j > 0 && p[j].start < p[j - 1].start; j--) {
            sg__gpart t = p[j];
            p[j] = p[j - 1], p[j - 1] = t;
        }
    for (int k = 1; k < e->nparts; k++)
        if (p[k].start < p[k - 1].start + p[k - 1].g->shape[dim]) return false;
    return true;
}

/* Whether no two elements of (ndim, shape, stride) share an address. */
static bool no_overlap(int ndim, const int64_t *shape, const int64_t *stride) {
    int d[SG_MAX_DIMS], n = 0;
    for (int k = 0; k < ndim; k++)
        if (shape[k] > 1) d[n++] = k;
    for (int k = 1; k < n; k++) /* by stride, smallest first */
        for (int j = k; j > 0 && stride[d[j]] < stride[d[j - 1]]; j--) {
            int t = d[j];
            d[j] = d[j - 1], d[j - 1] = t;
        }
    int64_t extent = 1;
    for (int k = 0; k < n; k++) {
        if (stride[d[k]] < extent) return false;
        extent = stride[d[k]] * shape[d[k]];
    }
    return true;
}

/* When the disjoint parts cover e's output and lie, each where its slice
 * does, in one non-overlapping view of one storage: that view, else NULL. */
static sg_tensor *shared_base(sg__gnode *e) {
    const sg__gmeta *m = &e->outm;
    const sg__gpart *p = e->parts;
    int dim = p[0].dim;
    const sg_tensor *t0 = p[0].g;
    int64_t covered = 0, off = t0->offset - p[0].start * t0->stride[dim];
    for (int k = 0; k < e->nparts; k++) {
        const sg_tensor *t = p[k].g;
        if (t->st != t0->st || t->ndim != m->ndim || t->offset - p[k].start * t->stride[dim] != off)
            return NULL;
        for (int d = 0; d < m->ndim; d++)
            if (t->stride[d] != t0->stride[d]) return NULL;
        covered += t->shape[dim];
    }
    if (covered != m->shape[dim] || p[0].start != 0 || off < 0 ||
        !no_overlap(m->ndim, m->shape, t0->stride))
        return NULL;
    return sg__tensor_view(p[0].g, "sg_grad", m->ndim, m->shape, t0->stride, off);
}

/* The disjoint parts copied into their slices of one new tensor of e's
 * output's shape; the gaps between them (if any) zeroed. */
static sg_tensor *gather_parts(sg_ctx *ctx, const sg__gnode *e) {
    const sg__gmeta *m = &e->outm;
    const sg__gpart *p = e->parts;
    int dim = p[0].dim;
    sg_tensor *buf = sg_empty(ctx, m->dtype, m->ndim, m->shape);
    sg_status s = buf ? SG_OK : SG_ERR_OOM;
    int64_t at = 0;
    for (int k = 0; s == SG_OK && k <= e->nparts; k++) {
        int64_t start = k < e->nparts ? p[k].start : m->shape[dim];
        if (start > at) { /* a gap: zeros */
            sg_tensor *gap = sg_narrow(buf, dim, at, start - at);
            s = gap ? sg_fill_(gap, 0.0) : SG_ERR_INTERNAL;
            sg__tensor_drop(gap);
        }
        if (s != SG_OK || k == e->nparts) break;
        int64_t len = p[k].g->shape[dim];
        sg_tensor *part = sg_narrow(buf, dim, start, len);
        s = part ? sg_copy_(part, p[k].g) : SG_ERR_INTERNAL;
        sg__tensor_drop(part);
        at = start + len;
    }
    if (s == SG_OK) return buf;
    sg__tensor_drop(buf);
    return NULL;
}

/* One part padded with zeros to e's output's shape. */
static sg_tensor *pad_part(sg_ctx *ctx, const sg__gnode *e, const sg__gpart *p) {
    const sg__gmeta *m = &e->outm;
    int64_t len = p->g->shape[p->dim];
    sg_tensor *z = sg_zeros(ctx, m->dtype, m->ndim, m->shape);
    sg_tensor *part = z ? sg_slice(z, p->dim, p->start,
                                   len ? p->start + (len - 1) * p->step + 1 : p->start, p->step)
                        : NULL;
    sg_status s = part ? sg_copy_(part, p->g) : SG_ERR_INTERNAL;
    sg__tensor_drop(part);
    if (s == SG_OK) return z;
    sg__tensor_drop(z);
    return NULL;
}

static sg_status accumulate(sg_ctx *ctx, sg__gnode *e, sg_tensor *gi);

/* Place e's parts (see above) and add them to its gradient. */
static sg_status settle(sg_ctx *ctx, sg__gnode *e) {
    if (!e->nparts) return SG_OK;
    sg_status s = SG_OK;
    if (parts_disjoint(e)) {
        sg_tensor *t = shared_base(e);
        if (!t) {
            char d[SG__DESC];
            sg__log(ctx, "perf_hints",
                    "sg_grad: the gradients of %d slices of %s are copied into one tensor: "
                    "their producers did not write them in place",
                    e->nparts, sg__shape_str(e->outm.ndim, e->outm.shape, d, sizeof d));
            t = gather_parts(ctx, e);
        }
        s = t ? accumulate(ctx, e, t) : ctx->status != SG_OK ? ctx->status : SG_ERR_INTERNAL;
    } else {
        char d[SG__DESC];
        sg__log(ctx, "perf_hints",
                "sg_grad: %d slices of %s overlap, or differ in dim or step: each slice's "
                "gradient is padded with zeros and added",
                e->nparts, sg__shape_str(e->outm.ndim, e->outm.shape, d, sizeof d));
        for (int k = 0; s == SG_OK && k < e->nparts; k++) {
            sg_tensor *t = pad_part(ctx, e, &e->parts[k]);
            s = t ? accumulate(ctx, e, t) : ctx->status != SG_OK ? ctx->status : SG_ERR_INTERNAL;
        }
    }
    drop_parts(ctx, e);
    return s;
}

/* One node's backward: its rule, then each input's gradient reduced to the
 * input's shape and added to the input node's. */
static sg_status backward_one(sg_ctx *ctx, sg__gnode *g) {
    int nin = g->nin;
    bool want[nin > 0 ? nin : 1];
    sg_tensor *gi[nin > 0 ? nin : 1];
    bool any = false;
    for (int k = 0; k < nin; k++) {
        want[k] = g->next[k] && g->next[k]->needed;
        gi[k] = NULL;
        any = any || want[k];
    }
    if (!any) return SG_OK;
    if (takes_part(g)) return push_part(ctx, g);
    /* A rule that adds input 0's gathered gradient itself (grad_rules.c:
     * the norms, the scatter-adds) sees it whole: its slices' parts placed
     * first (a tied embedding's LM-head rows). */
    if (sg__grad_takes_acc(g->op) && want[0] && g->next[0]->nparts) {
        sg_status s0 = settle(ctx, g->next[0]);
        if (s0 != SG_OK) return s0;
    }
    sg_tensor *acc[nin > 0 ? nin : 1];
    bool took[nin > 0 ? nin : 1];
    for (int k = 0; k < nin; k++) {
        acc[k] = want[k] ? g->next[k]->grad : NULL, took[k] = false;
        for (int j = 0; j < k; j++) /* one node behind two inputs: added as before */
            if (acc[k] && g->next[j] == g->next[k]) acc[k] = acc[j] = NULL;
    }
    uint32_t mark = ctx->next_id;
    sg__bw b = {.ctx = ctx, .n = g, .g = g->grad, .out = g->out, .x = g->saved, .want = want,
                .gi = gi, .acc = acc, .took = took};
    sg_status s = sg__grad_rule(&b);
    for (int k = 0; s == SG_OK && k < nin; k++)
        if (want[k]) {
            gi[k] = sum_to(gi[k], &g->in[k]);
            if (!gi[k]) s = ctx->status != SG_OK ? ctx->status : SG_ERR_INTERNAL;
        }
    if (s != SG_OK) {
        sweep(ctx, mark, NULL, 0);
        return s;
    }
    sweep(ctx, mark, gi, nin);
    for (int k = 0; k < nin; k++) {
        if (!want[k]) continue;
        if (s == SG_OK && took[k]) { /* gi[k] already holds the gathered gradient */
            sg__tensor_drop(g->next[k]->grad);
            g->next[k]->grad = gi[k];
        } else if (s == SG_OK)
            s = accumulate(ctx, g->next[k], gi[k]);
        else
            sg__tensor_drop(gi[k]);
    }
    return s;
}

/* grads[i] from the gathered gradient of wrt[i]'s node (zeros when none). */
static sg_status results(sg_ctx *ctx, int n, sg_tensor *const *wrt, uint32_t epoch,
                         sg_tensor **res) {
    for (int i = 0; i < n; i++) {
        sg__gnode *g = wrt[i]->grad_fn;
        sg_tensor *src = g && g->epoch == epoch ? g->grad : NULL;
        if (src) {
            sg_tensor *r = sg_reshape(src, wrt[i]->ndim, wrt[i]->shape);
            res[i] = r ? sg_clone(r) : NULL;
            sg__tensor_drop(r);
        } else {
            res[i] = sg_zeros(ctx, wrt[i]->dtype, wrt[i]->ndim, wrt[i]->shape);
        }
        if (!res[i]) {
            for (int j = 0; j < i; j++) sg__tensor_drop(res[j]);
            return ctx->status != SG_OK ? ctx->status : SG_ERR_INTERNAL;
        }
    }
    return SG_OK;
}

static sg_status check_args(sg_tensor *loss, int n, sg_tensor *const *wrt, sg_tensor **grads) {
    sg_status s = sg__check_tensor("sg_grad", loss);
    if (s != SG_OK) return s;
    sg_ctx *ctx = loss->ctx;
    char d[SG__DESC];
    if (!sg__dtype_is_float(loss->dtype) || sg__numel(loss->ndim, loss->shape) != 1)
        return sg__fail(ctx, sg__dtype_is_float(loss->dtype) ? SG_ERR_SHAPE : SG_ERR_DTYPE,
                        "sg_grad: loss is %s; it must be a float tensor of one element (reduce "
                        "it with sg_sum or sg_mean first)",
                        sg__describe(loss, d, sizeof d));
    if (n < 0 || (n > 0 && (!wrt || !grads)))
        return sg__fail(ctx, n < 0 ? SG_ERR_INVALID_ARG : SG_ERR_NULL,
                        "sg_grad: n is %d, wrt "
                        "%s and grads %s; pass n >= 0 tensors and room for n gradients",
                        n, wrt ? "set" : "NULL", grads ? "set" : "NULL");
    for (int i = 0; i < n; i++) {
        char what[48];
        snprintf(what, sizeof what, "sg_grad: wrt[%d]", i);
        if ((s = sg__check_tensor(what, wrt[i])) != SG_OK) {
            if (s == SG_ERR_NULL)
                sg__fail(ctx, s, "sg_grad: wrt[%d] is NULL (an earlier op failed?)", i);
            return s;
        }
        if (wrt[i]->ctx != ctx)
            return sg__fail(ctx, SG_ERR_WRONG_CONTEXT,
                            "sg_grad: wrt[%d] belongs to another "
                            "context than loss",
                            i);
        if (!sg__dtype_is_float(wrt[i]->dtype))
            return sg__fail(ctx, SG_ERR_DTYPE,
                            "sg_grad: wrt[%d] is %s; only float tensors have "
                            "gradients",
                            i, sg__describe(wrt[i], d, sizeof d));
    }
    /* As torch's "does not require grad": nothing was recorded, so every
     * gradient would be a silent zero. */
    if (!loss->grad_fn && loss->fn_owned)
        return sg__fail(ctx, SG_ERR_INVALID_ARG,
                        "sg_grad: loss %s is an output of a compiled fn (sg_call), and a fn's "
                        "outputs carry no recorded backward in any mode; call sg_grad inside the "
                        "step function, where the backward is captured and fused with the forward",
                        sg__describe(loss, d, sizeof d));
    if (!loss->grad_fn)
        return sg__fail(ctx, SG_ERR_INVALID_ARG,
                        "sg_grad: loss %s does not require grad: no tensor it was computed from "
                        "required grad when it was computed; mark the parameters with "
                        "sg_requires_grad_ before the forward, and run the forward with "
                        "gradients on (sg_set_grad_enabled(ctx, true)); outputs of sg_call "
                        "carry none (take gradients inside the step)",
                        sg__describe(loss, d, sizeof d));
    return SG_OK;
}

/* Walk back from root, gathering gradients in the nodes of order. */
static sg_status walk(sg_ctx *ctx, sg_tensor *loss, const nodes *order) {
    sg_status s = SG_OK;
    for (int k = 0; k < order->n && s == SG_OK; k++)
        if (order->v[k]->needed) s = check_versions(ctx, order->v[k]);
    if (s != SG_OK) return s;
    sg__gnode *root = loss->grad_fn;
    root->grad = sg_full(ctx, loss->dtype, loss->ndim, loss->shape, 1.0);
    if (!root->grad) return ctx->status != SG_OK ? ctx->status : SG_ERR_OOM;
    for (int k = order->n - 1; k >= 0 && s == SG_OK; k--) {
        sg__gnode *g = order->v[k];
        if (g->needed) s = settle(ctx, g);
        if (s != SG_OK || !g->needed || !g->grad || g->op == SG__GK_LEAF) continue;
        s = backward_one(ctx, g);
        if (g->target_epoch != ctx->grad_epoch) { /* done with it: free it early */
            sg__tensor_drop(g->grad);
            g->grad = NULL;
        }
    }
    return s;
}

sg_status sg_grad(sg_tensor *loss, int n, sg_tensor *const *wrt, sg_tensor **grads) {
    sg_status s = check_args(loss, n, wrt, grads);
    if (s != SG_OK) return s;
    sg_ctx *ctx = loss->ctx;
    uint32_t epoch = ++ctx->grad_epoch;
    for (int i = 0; i < n; i++)
        if (wrt[i]->grad_fn) wrt[i]->grad_fn->target_epoch = epoch;
    nodes order = {0};
    bool was_off = ctx->grad_off;
    ctx->grad_off = true; /* the backward itself records no gradients */
    if (loss->grad_fn) {
        s = topo(ctx, loss->grad_fn, epoch, &order);
        if (s == SG_OK) s = walk(ctx, loss, &order);
    }
    sg_tensor *res[n > 0 ? n : 1];
    if (s == SG_OK) s = results(ctx, n, wrt, epoch, res);
    for (int k = 0; k < order.n; k++) {
        drop_parts(ctx, order.v[k]);
        sg__tensor_drop(order.v[k]->grad);
        order.v[k]->grad = NULL;
    }
    sg__free(ctx, order.v, sizeof *order.v * (size_t)order.cap);
    ctx->grad_off = was_off;
    if (s != SG_OK) return s;
    for (int i = 0; i < n; i++) grads[i] = res[i];
    return SG_OK;
}
