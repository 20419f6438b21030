/* SPDX-License-Identifier: MIT */
/*
 * canon.c -- row ops written out of primitives become the IR's own op
 * before fusion, so that they run as one row kernel (and fold into a GEMV
 * where a norm would): as torch.compile's decompositions meet its fused
 * kernels from the other side.
 *
 *   softmax:     exp(x - max(x, d)) / sum(exp(x - max(x, d)), d)
 *   log_softmax: (x - max(x, d)) - log(sum(exp(x - max(x, d)), d))
 *   layer_norm:  (x - mean(x)) * rsqrt(var + eps) [* w] [+ b], or
 *                (x - mean(x)) / sqrt(var + eps) [* w] [+ b], over the last
 *                dim, var = mean((x - mean(x))^2) (a product or pow 2) or
 *                var(x) without correction, w and b 1-d (either operand)
 *
 * with the reductions over the one dim d, kept (keepdim), the exp shared
 * (or computed twice from the same difference), every value between x and
 * the result private to the form (read nowhere else, no output, written
 * once), one float dtype throughout, and x not written between its first
 * read and the result. The last node of the form becomes the op on x; the
 * others stay in the IR, unread, and fusion's dead-code pass drops them
 * (layer_norm's three inputs go to new entries at the end of ir->args).
 * The result differs from the written-out one by rounding only: the row op
 * keeps its intermediates in f32 where each written-out op rounds to the
 * dtype, and torch's fused kernels do the same. A norm written out
 * (x * rsqrt(mean(x * x) + eps) * w) is already one row kernel and folds
 * into a GEMV as it stands (fuse.c, norms_into_gemv), so it is left as
 * written.
 */
#include "fusion.h"

#include <string.h>

typedef struct canon {
    sg_ctx *ctx;
    sg__ir *ir;
    int *writer; /* per slot: the node that writes it, -1 none, -2 several */
    int *reads;  /* per slot: how many node inputs read it */
    bool oom;    /* an allocation failed */
} canon;

static const sg__ref *arg(const canon *c, const sg__irnode *n, int j) {
    int r = j < n->nin ? c->ir->args[n->args + j] : -1;
    return r < 0 ? NULL : &c->ir->refs[r];
}

/* The same elements of one slot in the same order (a size-1 dim's stride aside). */
static bool same_view(const sg__ref *a, const sg__ref *b) {
    if (!a || !b || a->slot != b->slot || a->dtype != b->dtype || a->ndim != b->ndim ||
        a->offset != b->offset)
        return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d] || (a->shape[d] > 1 && a->stride[d] != b->stride[d]))
            return false;
    return true;
}

/* The node writing r's slot, when it is op and writes r's exact view; else NULL. */
static const sg__irnode *made_by(const canon *c, const sg__ref *r, sg__op op) {
    if (!r) return NULL;
    int w = c->writer[r->slot];
    if (w < 0) return NULL;
    const sg__irnode *n = &c->ir->nodes[w];
    return n->op == op && same_view(&c->ir->refs[n->out], r) ? n : NULL;
}

/* r's slot is an intermediate read exactly `reads` times and nowhere else. */
static bool private_value(const canon *c, const sg__ref *r, int reads) {
    const sg__slot *sl = &c->ir->slots[r->slot];
    return sl->kind == SG__SLOT_INTERNAL && sl->output < 0 && c->writer[r->slot] >= 0 &&
           c->reads[r->slot] == reads;
}

/* The one dim a reduction n reduces, kept, over x's shape; -1 else. */
static int kept_dim(const canon *c, const sg__irnode *n, const sg__ref *x) {
    const sg__ref *o = &c->ir->refs[n->out];
    if (n->nin != 1 || o->ndim != x->ndim || x->ndim < 1) return -1;
    int d = -1;
    for (int k = 0; k < x->ndim; k++)
        if (n->mask & (1u << k)) {
            if (d >= 0) return -1;
            d = k;
        }
    if (d < 0) return -1;
    for (int k = 0; k < x->ndim; k++)
        if (o->shape[k] != (k == d ? 1 : x->shape[k])) return -1;
    return d;
}

static bool same_shape(const sg__ref *a, const sg__ref *b) {
    if (a->ndim != b->ndim || a->dtype != b->dtype) return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d]) return false;
    return true;
}

/*
 * t = x - max(x, d) (kept), private to the form with `reads` reads: x, with
 * *dim and *from (the max's node) set; else NULL.
 */
static const sg__ref *shifted(const canon *c, const sg__ref *t, int reads, int *dim, int *from) {
    const sg__irnode *sub = made_by(c, t, SG__OP_SUB);
    if (!sub || !private_value(c, t, reads)) return NULL;
    const sg__ref *x = arg(c, sub, 0), *m = arg(c, sub, 1);
    const sg__irnode *mx = made_by(c, m, SG__OP_MAX);
    if (!x || !mx || !private_value(c, m, 1) || !same_view(arg(c, mx, 0), x) || !same_shape(x, t) ||
        !sg__dtype_is_float(x->dtype))
        return NULL;
    *dim = kept_dim(c, mx, x);
    *from = (int)(mx - c->ir->nodes);
    return *dim >= 0 ? x : NULL;
}

/* s = sum(exp(t), d) (kept), its exp private with `ereads` reads: the exp's
 * input t (so a caller can match it), else NULL. */
static const sg__ref *sum_of_exp(const canon *c, const sg__ref *s, int d, int ereads) {
    const sg__irnode *sum = made_by(c, s, SG__OP_SUM);
    if (!sum || !private_value(c, s, 1)) return NULL;
    const sg__ref *e = arg(c, sum, 0);
    const sg__irnode *ex = made_by(c, e, SG__OP_EXP);
    if (!ex || !private_value(c, e, ereads) || kept_dim(c, sum, e) != d) return NULL;
    return arg(c, ex, 0);
}

/* Nothing in nodes (from, to) writes x's slot. */
static bool unwritten(const canon *c, const sg__ref *x, int from, int to) {
    for (int i = from + 1; i < to; i++)
        if (c->ir->refs[c->ir->nodes[i].out].slot == x->slot) return false;
    return true;
}

/* Node i as op over its nin inputs in (NULL: an optional input left out,
 * -1), with f[0] and i[0]; ir->args has room for them at the node's args.
 * Each input's slot now lives up to i. */
static void rewrite(canon *c, int i, sg__op op, int nin, const sg__ref *const *in, double f0,
                    int64_t i0) {
    sg__ir *ir = c->ir;
    sg__irnode *n = &ir->nodes[i];
    for (int k = 0; k < nin; k++) {
        ir->args[n->args + k] = in[k] ? (int)(in[k] - ir->refs) : -1;
        if (in[k] && ir->slots[in[k]->slot].last < i) ir->slots[in[k]->slot].last = i;
    }
    n->op = op;
    n->nin = nin;
    n->mask = 0;
    memset(n->f, 0, sizeof n->f);
    memset(n->i, 0, sizeof n->i);
    n->f[0] = f0;
    n->i[0] = i0;
}

/* exp(t) / sum(exp(t)) with t = x - max(x): softmax over x. */
static bool softmax_at(canon *c, int i) {
    const sg__irnode *n = &c->ir->nodes[i];
    if (n->op != SG__OP_DIV || n->nin != 2) return false;
    const sg__ref *num = arg(c, n, 0), *den = arg(c, n, 1), *out = &c->ir->refs[n->out];
    const sg__irnode *ex = made_by(c, num, SG__OP_EXP);
    if (!ex || !den || !same_shape(num, out)) return false;
    const sg__ref *t = arg(c, ex, 0);
    int d = -1, from = -1;
    /* The exp read by both the sum and the division, or two exps of one t. */
    bool shared = c->writer[num->slot] >= 0 && c->reads[num->slot] == 2;
    const sg__ref *x = shifted(c, t, shared ? 1 : 2, &d, &from);
    if (!x) return false;
    const sg__ref *ts = sum_of_exp(c, den, d, shared ? 2 : 1);
    if (!ts || !same_view(ts, t) || (!shared && !private_value(c, num, 1))) return false;
    if (!unwritten(c, x, from, i)) return false;
    rewrite(c, i, SG__OP_SOFTMAX, 1, &x, 0, d);
    return true;
}

/* t - log(sum(exp(t))) with t = x - max(x): log_softmax over x. */
static bool log_softmax_at(canon *c, int i) {
    const sg__irnode *n = &c->ir->nodes[i];
    if (n->op != SG__OP_SUB || n->nin != 2) return false;
    const sg__ref *t = arg(c, n, 0), *l = arg(c, n, 1), *out = &c->ir->refs[n->out];
    const sg__irnode *lg = made_by(c, l, SG__OP_LOG);
    if (!t || !lg || !private_value(c, l, 1) || !same_shape(t, out)) return false;
    int d = -1, from = -1;
    const sg__ref *x = shifted(c, t, 2, &d, &from);
    if (!x) return false;
    const sg__ref *ts = sum_of_exp(c, arg(c, lg, 0), d, 1);
    if (!ts || !same_view(ts, t) || !unwritten(c, x, from, i)) return false;
    rewrite(c, i, SG__OP_LOG_SOFTMAX, 1, &x, 0, d);
    return true;
}

/* ---- layer_norm */

/* The one input of binary node n that is a 1-d tensor of len elements of
 * dt (an affine weight or bias), or -1 when neither or both are; *other the
 * other input. */
static int affine_arg(const canon *c, const sg__irnode *n, int64_t len, sg_dtype dt,
                      const sg__ref **other) {
    int hit = -1;
    for (int j = 0; j < 2 && n->nin == 2; j++) {
        const sg__ref *a = arg(c, n, j);
        if (a && a->ndim == 1 && a->shape[0] == len && a->dtype == dt) {
            if (hit >= 0) return -1;
            hit = j;
        }
    }
    if (hit >= 0) *other = arg(c, n, 1 - hit);
    return hit;
}

/* eps when a is add_scalar(v, eps), private, of v private too: v; else NULL. */
static const sg__ref *plus_eps(const canon *c, const sg__ref *a, double *eps) {
    const sg__irnode *n = made_by(c, a, SG__OP_ADD_SCALAR);
    if (!n || !private_value(c, a, 1)) return NULL;
    *eps = n->f[0];
    const sg__ref *v = arg(c, n, 0);
    return v && private_value(c, v, 1) ? v : NULL;
}

/*
 * n = (x - mean(x)) normalized by the row's population variance: xc *
 * rsqrt(var + eps) or xc / sqrt(var + eps), var = mean(xc * xc) (or of
 * pow(xc, 2)) or var(x) without correction, over the last dim kept. x, with
 * *eps and *from (the first node of the form) set; else NULL.
 */
static const sg__ref *normalized(const canon *c, const sg__ref *n, double *eps, int *from) {
    const sg__irnode *m = made_by(c, n, SG__OP_MUL), *dv = made_by(c, n, SG__OP_DIV);
    const sg__ref *xc = NULL, *v = NULL;
    if (m && m->nin == 2) { /* xc * rsqrt(v + eps), either order */
        for (int j = 0; j < 2 && !v; j++) {
            const sg__irnode *rs = made_by(c, arg(c, m, j), SG__OP_RSQRT);
            if (!rs || !private_value(c, arg(c, m, j), 1)) continue;
            v = plus_eps(c, arg(c, rs, 0), eps);
            xc = arg(c, m, 1 - j);
        }
    } else if (dv && dv->nin == 2) { /* xc / sqrt(v + eps) */
        const sg__irnode *sq = made_by(c, arg(c, dv, 1), SG__OP_SQRT);
        if (sq && private_value(c, arg(c, dv, 1), 1)) v = plus_eps(c, arg(c, sq, 0), eps);
        xc = arg(c, dv, 0);
    }
    const sg__irnode *sub = made_by(c, xc, SG__OP_SUB);
    if (!v || !sub || !same_shape(xc, n)) return NULL;
    const sg__ref *x = arg(c, sub, 0), *mu = arg(c, sub, 1);
    if (!x || x->ndim < 1 || !sg__dtype_is_float(x->dtype) || !same_shape(x, xc)) return NULL;
    int last = x->ndim - 1;
    const sg__irnode *vn = made_by(c, v, SG__OP_VAR), *mn = made_by(c, mu, SG__OP_MEAN);
    if (!mn || !private_value(c, mu, 1) || !same_view(arg(c, mn, 0), x) ||
        kept_dim(c, mn, x) != last)
        return NULL;
    *from = (int)(mn - c->ir->nodes);
    if (vn) { /* var(x, correction 0) */
        if (vn->i[0] != 0 || !same_view(arg(c, vn, 0), x) || kept_dim(c, vn, x) != last ||
            !private_value(c, xc, 1))
            return NULL;
        int at = (int)(vn - c->ir->nodes);
        if (at < *from) *from = at;
        return x;
    }
    const sg__irnode *mv = made_by(c, v, SG__OP_MEAN);
    if (!mv || kept_dim(c, mv, xc) != last) return NULL;
    const sg__ref *sq = arg(c, mv, 0);
    const sg__irnode *mul = made_by(c, sq, SG__OP_MUL), *pw = made_by(c, sq, SG__OP_POW_SCALAR);
    if (!private_value(c, sq, 1)) return NULL;
    if (mul && mul->nin == 2 && same_view(arg(c, mul, 0), xc) && same_view(arg(c, mul, 1), xc))
        return private_value(c, xc, 3) ? x : NULL;
    if (pw && pw->f[0] == 2.0 && same_view(arg(c, pw, 0), xc))
        return private_value(c, xc, 2) ? x : NULL;
    return NULL;
}

/* Room for three inputs of node i at the end of ir->args; false when out of memory. */
static bool three_args(canon *c, int i) {
    sg__ir *ir = c->ir;
    if (ir->nargs + 3 > ir->cap_args) {
        int cap = ir->nargs + 3 + ir->nargs / 2;
        int *a = sg__alloc(c->ctx, sizeof(int) * (size_t)cap);
        if (!a) return !(c->oom = true);
        memcpy(a, ir->args, sizeof(int) * (size_t)ir->nargs);
        sg__free(c->ctx, ir->args, sizeof(int) * (size_t)ir->cap_args);
        ir->args = a;
        ir->cap_args = cap;
    }
    ir->nodes[i].args = ir->nargs;
    ir->nargs += 3;
    return true;
}

/* (normalized x) [* w] [+ b], w and b 1-d over x's last dim: layer_norm. */
static bool layer_norm_at(canon *c, int i) {
    const sg__irnode *n = &c->ir->nodes[i];
    const sg__ref *out = &c->ir->refs[n->out], *cur = out, *w = NULL, *b = NULL, *other = NULL;
    if ((n->op != SG__OP_ADD && n->op != SG__OP_MUL && n->op != SG__OP_DIV) || out->ndim < 1)
        return false;
    int64_t len = out->shape[out->ndim - 1];
    int j;
    if (n->op == SG__OP_ADD && (j = affine_arg(c, n, len, out->dtype, &other)) >= 0) {
        b = arg(c, n, j);
        if (!other || !private_value(c, other, 1)) return false;
        cur = other;
    }
    if (cur != out && !private_value(c, cur, 1)) return false;
    double eps = 0;
    int from = -1;
    const sg__ref *x = NULL;
    /* cur = w * normalized, either order; or cur normalized itself (no weight) */
    const sg__irnode *wn = made_by(c, cur, SG__OP_MUL);
    if (wn && (j = affine_arg(c, wn, len, out->dtype, &other)) >= 0 && other &&
        private_value(c, other, 1) && (x = normalized(c, other, &eps, &from)) != NULL)
        w = arg(c, wn, j);
    if (!x) x = normalized(c, cur, &eps, &from);
    if (!x || !same_shape(x, out) || !unwritten(c, x, from, i) || !three_args(c, i)) return false;
    const sg__ref *in[3] = {x, w, b};
    rewrite(c, i, SG__OP_LAYER_NORM, 3, in, eps, 0);
    return true;
}

static void count(canon *c) {
    const sg__ir *ir = c->ir;
    for (int s = 0; s < ir->nslots; s++) c->writer[s] = -1, c->reads[s] = 0;
    for (int i = 0; i < ir->nnodes; i++) {
        const sg__irnode *n = &ir->nodes[i];
        for (int j = 0; j < n->nin; j++) {
            const sg__ref *a = arg(c, n, j);
            if (a) c->reads[a->slot]++;
        }
        int s = ir->refs[n->out].slot;
        c->writer[s] = c->writer[s] == -1 ? i : -2;
    }
}

sg_status sg__canon(sg_ctx *ctx, sg__ir *ir, int *done) {
    *done = 0;
    if (ir->nslots < 1 || ir->nnodes < 1) return SG_OK;
    canon c = {.ctx = ctx, .ir = ir};
    c.writer = sg__alloc(ctx, sizeof(int) * (size_t)ir->nslots);
    c.reads = sg__alloc(ctx, sizeof(int) * (size_t)ir->nslots);
    if (c.writer && c.reads) {
        count(&c);
        /* From the last node back, so that a form is taken whole (a layer_norm
         * with its affine terms, not the normalization inside it); a node whose
         * value nothing reads any more (inside a form taken) is left alone. */
        for (int i = ir->nnodes - 1; i >= 0 && !c.oom; i--) {
            const sg__slot *sl = &ir->slots[ir->refs[ir->nodes[i].out].slot];
            if (sl->kind == SG__SLOT_INTERNAL && sl->output < 0 &&
                c.reads[ir->refs[ir->nodes[i].out].slot] == 0)
                continue;
            /* A rewrite changes what the form's values are read by: count again. */
            if (softmax_at(&c, i) || log_softmax_at(&c, i) || layer_norm_at(&c, i))
                (*done)++, count(&c);
        }
    }
    bool oom = !c.writer || !c.reads || c.oom;
    sg__free(ctx, c.writer, sizeof(int) * (size_t)ir->nslots);
    sg__free(ctx, c.reads, sizeof(int) * (size_t)ir->nslots);
    return oom ? sg__fail(ctx, SG_ERR_OOM,
                          "fusion: out of host memory reading the capture's row ops")
               : SG_OK;
}
