/* SPDX-License-Identifier: MIT */
/*
 * canon.c -- row ops and attention written out of primitives become the
 * IR's own op before fusion, so that they run as one row kernel (and fold
 * into a GEMV where a norm would) or as the attention kernel: as
 * torch.compile's decompositions and its SDPA pattern matcher meet its
 * fused kernels from the other side.
 *
 *   softmax:     exp(x - max(x, d)) / sum(exp(x - max(x, d)), d)
 *   log_softmax: (x - max(x, d)) - log(sum(exp(x - max(x, d)), d))
 *   layer_norm:  (x - mean(x)) * rsqrt(var + eps) [* w] [+ b], or
 *                (x - mean(x)) / sqrt(var + eps) [* w] [+ b], over the last
 *                dim, var = mean((x - mean(x))^2) (a product or pow 2) or
 *                var(x) without correction, w and b 1-d (either operand)
 *   attention:   softmax(scale * q @ k^T [+ mask]) @ v over the last dim
 *                (attention_at: the forms it peels), with Lq or Hq 1
 *   sdpa's K/V:  repeated for grouped-query heads by the caller: the K/V
 *                the repeat read (attention_unrepeat_at)
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

#include <math.h>
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

/* The node writing r's slot, when it is op and writes r's exact view; else NULL. */
static const sg__irnode *made_by(const canon *c, const sg__ref *r, sg__op op) {
    if (!r) return NULL;
    int w = c->writer[r->slot];
    if (w < 0) return NULL;
    const sg__irnode *n = &c->ir->nodes[w];
    return n->op == op && sg__same_geom(&c->ir->refs[n->out], r) ? n : NULL;
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
    if (!x || !mx || !private_value(c, m, 1) || !sg__same_geom(arg(c, mx, 0), x) || !same_shape(x, t) ||
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
    if (!ts || !sg__same_geom(ts, t) || (!shared && !private_value(c, num, 1))) return false;
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
    if (!ts || !sg__same_geom(ts, t) || !unwritten(c, x, from, i)) return false;
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
    if (!mn || !private_value(c, mu, 1) || !sg__same_geom(arg(c, mn, 0), x) ||
        kept_dim(c, mn, x) != last)
        return NULL;
    *from = (int)(mn - c->ir->nodes);
    if (vn) { /* var(x, correction 0) */
        if (vn->i[0] != 0 || !sg__same_geom(arg(c, vn, 0), x) || kept_dim(c, vn, x) != last ||
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
    if (mul && mul->nin == 2 && sg__same_geom(arg(c, mul, 0), xc) && sg__same_geom(arg(c, mul, 1), xc))
        return private_value(c, xc, 3) ? x : NULL;
    if (pw && pw->f[0] == 2.0 && sg__same_geom(arg(c, pw, 0), xc))
        return private_value(c, xc, 2) ? x : NULL;
    return NULL;
}

/* An IR array of n used elements of size es grown to hold need; false
 * (c->oom set) when out of memory. */
static bool grow(canon *c, void **arr, int *cap, int n, int need, size_t es) {
    if (need <= *cap) return true;
    int nc = need + n / 2;
    void *a = sg__alloc(c->ctx, es * (size_t)nc);
    if (!a) return !(c->oom = true);
    memcpy(a, *arr, es * (size_t)n);
    sg__free(c->ctx, *arr, es * (size_t)*cap);
    *arr = a, *cap = nc;
    return true;
}

/*
 * Room for nin inputs of node i at the end of ir->args (none: its args
 * stay) and for nref more refs; false when out of memory. Growing ir->refs
 * moves it: the caller holds refs by value or index across this call.
 */
static bool room(canon *c, int i, int nin, int nref) {
    sg__ir *ir = c->ir;
    if (!grow(c, (void **)&ir->args, &ir->cap_args, ir->nargs, ir->nargs + nin, sizeof(int)) ||
        !grow(c, (void **)&ir->refs, &ir->cap_refs, ir->nrefs, ir->nrefs + nref, sizeof(sg__ref)))
        return false;
    if (nin > 0) {
        ir->nodes[i].args = ir->nargs;
        ir->nargs += nin;
    }
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
    if (!x || !same_shape(x, out) || !unwritten(c, x, from, i) || !room(c, i, 3, 0)) return false;
    const sg__ref *in[3] = {x, w, b};
    rewrite(c, i, SG__OP_LAYER_NORM, 3, in, eps, 0);
    return true;
}

/* ---- attention */

/* r with its last two dims swapped (k from k^T). */
static sg__ref swapped(const sg__ref *r) {
    sg__ref t = *r;
    int a = r->ndim - 2, b = r->ndim - 1;
    t.shape[a] = r->shape[b], t.shape[b] = r->shape[a];
    t.stride[a] = r->stride[b], t.stride[b] = r->stride[a];
    return t;
}

/* r's dims laid out densely (row-major) from its offset. */
static bool dense(const sg__ref *r) {
    int64_t m = 1;
    for (int d = r->ndim - 1; d >= 0; d--) {
        if (r->shape[d] > 1 && r->stride[d] != m) return false;
        m *= r->shape[d];
    }
    return true;
}

/*
 * t, a 4-d (B, H, S, D) read of a K or V: where it is the whole of a copy,
 * private to the form (`reads` reads), of a 5-d (B, Hkv, rep, S, D) view
 * that repeats each head rep times (stride 0: sg_repeat_interleave, or
 * expand and reshape as Llama's repeat_kv; 4-d with stride 0 over the heads
 * when Hkv is 1), the (B, Hkv, S, D) view the copy read, with *from lowered
 * to the copy's node; else t itself.
 */
static sg__ref unrepeated(const canon *c, const sg__ref *t, int reads, int *from) {
    const sg__irnode *cp = c->writer[t->slot] >= 0 ? &c->ir->nodes[c->writer[t->slot]] : NULL;
    if (!cp || cp->op != SG__OP_COPY || cp->nin != 1 || !private_value(c, t, reads)) return *t;
    const sg__ref *o = &c->ir->refs[cp->out], *x = arg(c, cp, 0);
    if (x && o->ndim == 4 && x->ndim == 4 && x->dtype == t->dtype && x->stride[1] == 0 &&
        o->offset == t->offset && dense(o) && sg__same_geom(o, t)) {
        /* one K/V head repeated: the view reads it with stride 0 over the heads */
        sg__ref r = *x;
        r.shape[1] = 1;
        int at = (int)(cp - c->ir->nodes);
        if (at < *from) *from = at;
        return r;
    }
    if (!x || o->ndim != 5 || x->ndim != 5 || x->dtype != t->dtype || x->stride[2] != 0 ||
        o->offset != t->offset || !dense(o) || !dense(t) || t->ndim != 4)
        return *t;
    int64_t want[4] = {o->shape[0], o->shape[1] * o->shape[2], o->shape[3], o->shape[4]};
    for (int d = 0; d < 4; d++)
        if (t->shape[d] != want[d]) return *t;
    for (int d = 0; d < 5; d++)
        if (x->shape[d] != o->shape[d]) return *t;
    sg__ref r = *x;
    r.ndim = 4;
    for (int d = 2; d < 4; d++) r.shape[d] = x->shape[d + 1], r.stride[d] = x->stride[d + 1];
    for (int d = 4; d < SG_MAX_DIMS; d++) r.shape[d] = 1, r.stride[d] = 0;
    int at = (int)(cp - c->ir->nodes);
    if (at < *from) *from = at;
    return r;
}

/* The node writing value r, private to the form (read once), of op; else NULL. */
static const sg__irnode *step_back(const canon *c, const sg__ref *r, sg__op op) {
    const sg__irnode *n = made_by(c, r, op);
    return n && private_value(c, r, 1) ? n : NULL;
}

/* A scalar constant: a 0-d (or all size-1) private FILL; its value in *v. */
static bool fill_value(const canon *c, const sg__ref *r, double *v) {
    const sg__irnode *f = r ? made_by(c, r, SG__OP_FILL) : NULL;
    if (!f || !private_value(c, r, 1)) return false;
    for (int d = 0; d < r->ndim; d++)
        if (r->shape[d] != 1) return false;
    *v = f->f[0];
    return true;
}

/* What the walk back from softmax's input found. */
typedef struct scores {
    double scale;
    const sg__ref *mask; /* bool (true keeps) or float (added), or NULL */
    bool drops;          /* the bool mask is true where keys are dropped (masked_fill) */
    int from;            /* the form's first node */
} scores;

/*
 * x, the input of softmax over the last dim: peel private casts between
 * float dtypes, positive scalings (mul_scalar, mul or div by a constant
 * fill) and one mask (where(m, s, -inf), where(m, -inf, s) as masked_fill
 * writes it, or s + m in q's dtype) back to the scores q @ k^T, returning
 * that matmul; NULL when anything else stands between them. An added mask
 * must come after every scaling (scale * (s + m) is not scale * s + m).
 */
static const sg__irnode *peel_scores(const canon *c, const sg__ref *x, sg_dtype qdt, scores *sc) {
    bool scaled = false;
    for (int guard = 0; guard < 16; guard++) {
        const sg__irnode *n;
        double v;
        if ((n = step_back(c, x, SG__OP_MATMUL)) != NULL) return n;
        if ((n = step_back(c, x, SG__OP_CAST)) != NULL) {
            const sg__ref *a = arg(c, n, 0);
            if (!a || !sg__dtype_is_float(a->dtype) || !sg__dtype_is_float(x->dtype)) return NULL;
            x = a;
        } else if ((n = step_back(c, x, SG__OP_MUL_SCALAR)) != NULL && n->f[0] > 0) {
            sc->scale *= n->f[0], scaled = true, x = arg(c, n, 0);
        } else if (((n = step_back(c, x, SG__OP_MUL)) != NULL ||
                    (n = step_back(c, x, SG__OP_DIV)) != NULL) &&
                   n->nin == 2 && fill_value(c, arg(c, n, 1), &v) && v > 0 && isfinite(v)) {
            sc->scale = n->op == SG__OP_MUL ? sc->scale * v : sc->scale / v;
            scaled = true, x = arg(c, n, 0);
        } else if ((n = step_back(c, x, SG__OP_WHERE)) != NULL && n->nin == 3 && !sc->mask) {
            const sg__ref *m = arg(c, n, 0), *a = arg(c, n, 1), *b = arg(c, n, 2);
            if (!m || m->dtype != SG_BOOL) return NULL;
            if (fill_value(c, b, &v) && v == -INFINITY) { /* keep where m */
                sc->mask = m, x = a;
            } else if (fill_value(c, a, &v) && v == -INFINITY) { /* masked_fill: drop where m */
                const sg__irnode *no = step_back(c, m, SG__OP_LOGICAL_NOT);
                sc->mask = no ? arg(c, no, 0) : m, sc->drops = !no; /* not(m'): keep where m' */
                x = b;
            } else {
                return NULL;
            }
            int at = (int)(n - c->ir->nodes);
            if (at < sc->from) sc->from = at;
        } else if ((n = step_back(c, x, SG__OP_ADD)) != NULL && n->nin == 2 && !sc->mask &&
                   !scaled) {
            const sg__ref *a = arg(c, n, 0), *b = arg(c, n, 1);
            /* the scores are the operand of the output's shape; the mask broadcasts */
            const sg__ref *m = same_shape(a, &c->ir->refs[n->out]) ? b : a;
            x = m == b ? a : b;
            if (!m || m->dtype != qdt || !same_shape(x, &c->ir->refs[n->out])) return NULL;
            sc->mask = m;
        } else {
            return NULL;
        }
        int at = (int)(n - c->ir->nodes);
        if (at < sc->from) sc->from = at;
    }
    return NULL;
}

/* r right-aligned to the 4-d shape sh, stride 0 where it broadcasts; false
 * when it does not broadcast. */
static bool as4(const sg__ref *r, const int64_t *sh, sg__ref *o) {
    if (r->ndim > 4) return false;
    *o = *r;
    o->ndim = 4;
    for (int d = 3, k = r->ndim - 1; d >= 0; d--, k--) {
        int64_t n = k >= 0 ? r->shape[k] : 1, s = k >= 0 ? r->stride[k] : 0;
        if (n != 1 && n != sh[d]) return false;
        o->shape[d] = sh[d], o->stride[d] = n == 1 ? 0 : s;
    }
    for (int d = 4; d < SG_MAX_DIMS; d++) o->shape[d] = 1, o->stride[d] = 0;
    return true;
}

/*
 * softmax(scale * q @ k^T [+ mask]) @ v written out (a float or bool mask,
 * masked_fill with -inf, the softmax taken in f32 between casts, K and V
 * repeated over grouped-query heads) becomes ATTENTION: the scores never
 * reach memory and the repeated K/V are never made. The node's result is
 * stored (B, Lq, Hq, D), the matmul's (B, Hq, Lq, D): the same bytes when Lq
 * or Hq is 1 (decode), the case taken here.
 */
static bool attention_at(canon *c, int i) {
    const sg__irnode *n = &c->ir->nodes[i];
    if (n->op != SG__OP_MATMUL || n->nin != 2 || c->ctx->backend == SG_BACKEND_ZE) return false;
    const sg__ref *p = arg(c, n, 0), *vr = arg(c, n, 1), *out = &c->ir->refs[n->out];
    if (!p || !vr || out->ndim != 4 || p->ndim != 4 || vr->ndim != 4 || !dense(out) ||
        (out->shape[1] != 1 && out->shape[2] != 1))
        return false;
    /* p = softmax(x) over the last dim, or cast(softmax(cast(x))) */
    const sg__ref *x = p;
    const sg__irnode *cs = step_back(c, x, SG__OP_CAST);
    if (cs) x = arg(c, cs, 0);
    const sg__irnode *sm = step_back(c, x, SG__OP_SOFTMAX);
    if (!sm || sm->i[0] != 3) return false;
    x = arg(c, sm, 0);
    if (!x || !sg__dtype_is_float(x->dtype)) return false;
    scores sc = {.scale = 1.0, .from = (int)(sm - c->ir->nodes)};
    const sg__irnode *mm = peel_scores(c, x, p->dtype, &sc);
    if (!mm || mm->nin != 2) return false;
    const sg__ref *q = arg(c, mm, 0), *kt = arg(c, mm, 1);
    if (!q || !kt || q->ndim != 4 || kt->ndim != 4 || q->dtype != p->dtype ||
        kt->dtype != q->dtype || vr->dtype != q->dtype)
        return false;
    int at = (int)(mm - c->ir->nodes);
    if (at < sc.from) sc.from = at;
    sg__ref k = swapped(kt);
    k = unrepeated(c, &k, 1, &sc.from);
    sg__ref v = unrepeated(c, vr, 1, &sc.from);
    int64_t B = q->shape[0], Hq = q->shape[1], Lq = q->shape[2], D = q->shape[3];
    int64_t S = k.shape[2], Hkv = k.shape[1];
    if (k.shape[0] != B || v.shape[0] != B || v.shape[1] != Hkv || Hkv < 1 || Hq % Hkv ||
        k.shape[3] != D || v.shape[2] != S || v.shape[3] != D || D > 256 || out->shape[0] != B ||
        out->shape[1] != Hq || out->shape[2] != Lq || out->shape[3] != D)
        return false;
    int64_t ms[4] = {B, Hq, Lq, S};
    sg__ref m = {0};
    if (sc.mask && !as4(sc.mask, ms, &m)) return false;
    const sg__ref *reads[4] = {q, &k, &v, sc.mask};
    /* What the form read must be what the op reads at i: a value made once in
     * the step is; an input, a parameter or a buffer written more than once
     * must not be written from the form's first node on (a cache written
     * between the scores and the result). */
    for (int j = 0; j < 4; j++) {
        const sg__ref *r = reads[j];
        bool once = r && c->ir->slots[r->slot].kind == SG__SLOT_INTERNAL && c->writer[r->slot] >= 0;
        if (r && !once && !unwritten(c, r, sc.from, i)) return false;
    }
    sg__ref qc = *q;
    if (!room(c, i, 5, 4)) return false;
    /* From here ir->refs may have moved: only the copies above are used. */
    sg__ir *ir = c->ir;
    int base = ir->nrefs;
    ir->refs[base] = qc, ir->refs[base + 1] = k, ir->refs[base + 2] = v;
    ir->nrefs += 3;
    const sg__ref *in[5] = {&ir->refs[base], &ir->refs[base + 1], &ir->refs[base + 2], NULL, NULL};
    if (sc.mask) {
        ir->refs[ir->nrefs] = m;
        in[3] = &ir->refs[ir->nrefs++];
    }
    rewrite(c, i, SG__OP_ATTENTION, 5, in, sc.scale, sc.drops ? SG__ATTN_MASK_DROPS : 0);
    return true;
}

/*
 * ATTENTION (sg_sdpa) over K and V repeated for grouped-query heads by the
 * caller: the K/V the repeat read, so that nothing copies the cache.
 */
static bool attention_unrepeat_at(canon *c, int i) {
    const sg__irnode *n = &c->ir->nodes[i];
    if (n->op != SG__OP_ATTENTION || n->nin < 3 || (n->i[0] & SG__ATTN_LSE)) return false;
    const sg__ref *k0 = arg(c, n, 1), *v0 = arg(c, n, 2);
    if (!k0 || !v0) return false;
    int from = i;
    sg__ref k = unrepeated(c, k0, 1, &from), v = unrepeated(c, v0, 1, &from);
    if (k.slot == k0->slot || v.slot == v0->slot || k.shape[1] != v.shape[1] ||
        !unwritten(c, &k, from, i) || !unwritten(c, &v, from, i))
        return false;
    if (!room(c, i, 0, 2)) return false;
    sg__ir *ir = c->ir;
    n = &ir->nodes[i];
    ir->refs[ir->nrefs] = k, ir->refs[ir->nrefs + 1] = v;
    for (int j = 0; j < 2; j++) {
        ir->args[n->args + 1 + j] = ir->nrefs + j;
        if (ir->slots[ir->refs[ir->nrefs + j].slot].last < i)
            ir->slots[ir->refs[ir->nrefs + j].slot].last = i;
    }
    ir->nrefs += 2;
    return true;
}

/* Each slot's writer, and its reads by the nodes whose values are still read
 * (from the last node back: what a taken form left unread reads nothing). */
static void count(canon *c) {
    const sg__ir *ir = c->ir;
    for (int s = 0; s < ir->nslots; s++) c->writer[s] = -1, c->reads[s] = 0;
    for (int i = 0; i < ir->nnodes; i++) {
        int s = ir->refs[ir->nodes[i].out].slot;
        c->writer[s] = c->writer[s] == -1 ? i : -2;
    }
    for (int i = ir->nnodes - 1; i >= 0; i--) {
        const sg__irnode *n = &ir->nodes[i];
        int s = ir->refs[n->out].slot;
        const sg__slot *sl = &ir->slots[s];
        if (sl->kind == SG__SLOT_INTERNAL && sl->output < 0 && c->writer[s] >= 0 &&
            c->reads[s] == 0)
            continue;
        for (int j = 0; j < n->nin; j++) {
            const sg__ref *a = arg(c, n, j);
            if (a) c->reads[a->slot]++;
        }
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
        /* Again while a pass took something: an attention whose softmax was
         * itself written out is seen whole once the softmax is the op. */
        for (int pass = 0, before = -1; pass < 3 && *done != before && !c.oom; pass++) {
            before = *done;
            for (int i = ir->nnodes - 1; i >= 0 && !c.oom; i--) {
                const sg__slot *sl = &ir->slots[ir->refs[ir->nodes[i].out].slot];
                if (sl->kind == SG__SLOT_INTERNAL && sl->output < 0 &&
                    c.reads[ir->refs[ir->nodes[i].out].slot] == 0)
                    continue;
                /* A rewrite changes what the form's values are read by: count again. */
                if (softmax_at(&c, i) || log_softmax_at(&c, i) || layer_norm_at(&c, i) ||
                    attention_at(&c, i) || attention_unrepeat_at(&c, i))
                    (*done)++, count(&c);
            }
        }
    }
    bool oom = !c.writer || !c.reads || c.oom;
    sg__free(ctx, c.writer, sizeof(int) * (size_t)ir->nslots);
    sg__free(ctx, c.reads, sizeof(int) * (size_t)ir->nslots);
    return oom ? sg__fail(ctx, SG_ERR_OOM,
                          "fusion: out of host memory reading the capture's row ops")
               : SG_OK;
}
