/* SPDX-License-Identifier: MIT */
/*
 * grad_rules.c -- the gradient of every differentiable op and view, written
 * with the public op front-ends so that eagerly they run and under capture
 * they are recorded (and fused) like any other op. Each rule gets g, the
 * gradient of the node's output, and the tensors the node saved, and gives
 * each wanted input a gradient of the output's (broadcast) shape or of the
 * input's own; autograd.c sums broadcast dims away, casts to the input's
 * dtype and drops every intermediate the rule made.
 */
#include "autograd.h"

#include <math.h>

bool sg__grad_differentiable(int op) {
    if (op < 0) return true;
    switch ((sg__op)op) {
    case SG__OP_LOGICAL_NOT:
    case SG__OP_EQ:
    case SG__OP_NE:
    case SG__OP_LT:
    case SG__OP_LE:
    case SG__OP_GT:
    case SG__OP_GE:
    case SG__OP_LOGICAL_AND:
    case SG__OP_LOGICAL_OR:
    case SG__OP_FILL:
    case SG__OP_ARGMAX:
    case SG__OP_INDEX_COPY:
    case SG__OP_INDEX_ADD:
    case SG__OP_ATTENTION_BWD:
    case SG__OP_CROSS_ENTROPY_BWD:
    case SG__OP_NORM_STATS:
    case SG__OP_NORM_BWD:
    case SG__OP_GELU_TANH_BWD:
    case SG__OP_ARANGE: return false;
    default: /* collectives record no gradient, as torch.distributed's */
        return op < SG__OP_COUNT && sg__op_family((sg__op)op) != SG__FAM_COMM;
    }
}

bool sg__grad_saves_input(int op, int k) {
    switch (op) {
    case SG__OP_ABS:
    case SG__OP_LOG:
    case SG__OP_SIN:
    case SG__OP_COS:
    case SG__OP_GELU:
    case SG__OP_GELU_TANH:
    case SG__OP_SILU:
    case SG__OP_POW_SCALAR:
    case SG__OP_CLAMP:
    case SG__OP_MAX:
    case SG__OP_MIN:
    case SG__OP_VAR: return k == 0;
    case SG__OP_MUL:
    case SG__OP_POW:
    case SG__OP_MAXIMUM:
    case SG__OP_MINIMUM:
    case SG__OP_MATMUL:
    case SG__OP_CROSS_ENTROPY:
    case SG__OP_LAYER_NORM:
    case SG__OP_RMS_NORM:
    case SG__OP_LINEAR: return k <= 1;
    case SG__OP_DIV: return k == 1;
    case SG__OP_WHERE: return k == 0;
    case SG__OP_EMBEDDING:
    case SG__OP_INDEX_SELECT: return k == 1;
    case SG__OP_ATTENTION: return k <= 4; /* q, k, v, mask, kv_len */
    default: return false;
    }
}

/* The norms (their NORM_BWD adds the residual's gradient) and the
 * scatter-adds (scatter_base). */
bool sg__grad_takes_acc(int op) {
    return op == SG__OP_LAYER_NORM || op == SG__OP_RMS_NORM || op == SG__OP_EMBEDDING ||
           op == SG__OP_INDEX_SELECT;
}

bool sg__grad_saves_output(int op) {
    switch (op) {
    case SG__OP_EXP:
    case SG__OP_RELU: /* y > 0 where x > 0: a BLAS epilogue need not keep x */
    case SG__OP_SQRT:
    case SG__OP_RSQRT:
    case SG__OP_TANH:
    case SG__OP_SIGMOID:
    case SG__OP_DIV:
    case SG__OP_POW:
    case SG__OP_MAX:
    case SG__OP_MIN:
    case SG__OP_SOFTMAX:
    case SG__OP_LOG_SOFTMAX:
    case SG__OP_ATTENTION: return true;
    default: return false;
    }
}

/* ------------------------------------------------------------ helpers */

/* A 0-d constant of g's dtype. */
static sg_tensor *cst(const sg__bw *b, double v) {
    return sg_full(b->ctx, b->g->dtype, 0, NULL, v);
}

/* A bool mask as 1/0 of g's dtype. */
static sg_tensor *num(const sg__bw *b, sg_tensor *mask) { return sg_cast(mask, b->g->dtype); }

/* A new handle to t (gradients handed on are always new handles). */
static sg_tensor *alias(sg_tensor *t) { return sg_reshape(t, t->ndim, t->shape); }

static sg_tensor *zeros_of(const sg__bw *b, const sg__gmeta *m) {
    return sg_zeros(b->ctx, m->dtype, m->ndim, m->shape);
}

/*
 * Where a scatter-add rule (embedding, index_select) adds its rows: into
 * the gradient already gathered for input 0 when the rule may write it in
 * place -- m's dtype and shape, contiguous, the only handle on its bytes
 * (not a pass-through alias of another gradient) -- so that a tied
 * embedding's rows go straight into the LM head's gradient (took[0]; a new
 * handle, as the caller drops the old one); else zeros of m.
 */
static sg_tensor *scatter_base(sg__bw *b, const sg__gmeta *m) {
    sg_tensor *a = b->acc[0];
    bool own = a && a->dtype == m->dtype && a->ndim == m->ndim && a->offset == 0 &&
               a->st->refs == 1 && sg__is_contiguous(a) &&
               a->st->nbytes == (size_t)sg__numel(a->ndim, a->shape) * sg_dtype_size(a->dtype);
    for (int d = 0; own && d < m->ndim; d++) own = a->shape[d] == m->shape[d];
    if (!own) return zeros_of(b, m);
    b->took[0] = true;
    return alias(a);
}

/* The reduced dims of a reduction node's mask, as a list. */
static int mask_dims(uint32_t mask, int ndim, int *dims) {
    int n = 0;
    for (int d = 0; d < ndim; d++)
        if (mask & (1u << d)) dims[n++] = d;
    return n;
}

/* An op recorded with grad on that has no rule here: sg_grad says so. */
static sg_status no_rule(const sg__bw *b) {
    return sg__fail(b->ctx, SG_ERR_UNSUPPORTED,
                    "sg_grad: %s has no gradient rule yet; run it "
                    "under sg_set_grad_enabled(ctx, false) and write its gradient with ops",
                    sg__op_name((sg__op)b->n->op));
}

/* ------------------------------------------------------------ pointwise */

/* d/dx of the unary op at x (or from out), to be multiplied by g. */
static sg_tensor *unary_deriv(const sg__bw *b, bool *known) {
    sg_tensor *x = b->x[0], *y = b->out;
    switch ((sg__op)b->n->op) {
    case SG__OP_ABS: return sg_sub(num(b, sg_gt(x, cst(b, 0))), num(b, sg_lt(x, cst(b, 0))));
    case SG__OP_EXP: return alias(y);
    case SG__OP_SIN: return sg_cos(x);
    case SG__OP_COS: return sg_neg(sg_sin(x));
    case SG__OP_TANH: return sg_add_scalar(sg_neg(sg_mul(y, y)), 1.0);
    case SG__OP_SIGMOID: return sg_mul(y, sg_add_scalar(sg_neg(y), 1.0));
    case SG__OP_RSQRT: return sg_mul_scalar(sg_pow_scalar(y, 3.0), -0.5);
    case SG__OP_GELU: {
        /* Phi(x) + x phi(x); Phi(x) = gelu(x) / x (1/2 at 0: there is no erf op). */
        sg_tensor *phi_cdf = sg_where(sg_eq(x, cst(b, 0)), cst(b, 0.5), sg_div(sg_gelu(x), x));
        sg_tensor *pdf =
            sg_mul_scalar(sg_exp(sg_mul_scalar(sg_mul(x, x), -0.5)), 0.3989422804014327);
        return sg_add(phi_cdf, sg_mul(x, pdf));
    }
    case SG__OP_SILU: {
        sg_tensor *s = sg_sigmoid(x);
        return sg_mul(s, sg_add_scalar(sg_mul(x, sg_add_scalar(sg_neg(s), 1.0)), 1.0));
    }
    case SG__OP_POW_SCALAR: return sg_mul_scalar(sg_pow_scalar(x, b->n->f[0] - 1.0), b->n->f[0]);
    default: *known = false; return NULL;
    }
}

static sg_status unary(sg__bw *b) {
    sg_tensor *g = b->g, *x = b->x[0];
    const sg__gnode *n = b->n;
    switch ((sg__op)n->op) {
    case SG__OP_NEG: b->gi[0] = sg_neg(g); break;
    case SG__OP_LOG: b->gi[0] = sg_div(g, x); break;
    case SG__OP_SQRT: b->gi[0] = sg_div(sg_mul_scalar(g, 0.5), b->out); break;
    case SG__OP_RELU: b->gi[0] = sg_where(sg_gt(b->out, cst(b, 0)), g, cst(b, 0)); break;
    /* One op, computed in f32 and rounded once, that a BLAS epilogue can take. */
    case SG__OP_GELU_TANH: b->gi[0] = sg__gelu_tanh_grad(x, g); break;
    case SG__OP_CAST:
    case SG__OP_COPY:
    case SG__OP_ADD_SCALAR: b->gi[0] = alias(g); break;
    case SG__OP_MUL_SCALAR: b->gi[0] = sg_mul_scalar(g, n->f[0]); break;
    case SG__OP_CLAMP: {
        sg_tensor *in = sg_logical_and(sg_ge(x, cst(b, n->f[0])), sg_le(x, cst(b, n->f[1])));
        b->gi[0] = sg_where(in, g, cst(b, 0));
        break;
    }
    case SG__OP_POW_SCALAR:
        if (n->f[0] == 0.0) {
            b->gi[0] = sg_mul_scalar(g, 0.0);
            break;
        }
        /* fall through */
    default: {
        bool known = true;
        sg_tensor *d = unary_deriv(b, &known);
        if (!known) return no_rule(b);
        b->gi[0] = sg_mul(g, d);
        break;
    }
    }
    return SG_OK;
}

/* Where a (or b) wins max/min: 1, 1/2 on ties, else 0 (as PyTorch splits ties). */
static sg_tensor *pick(const sg__bw *b, sg_tensor *wins, sg_tensor *tie) {
    return sg_add(num(b, wins), sg_mul_scalar(num(b, tie), 0.5));
}

static sg_status binary(sg__bw *b) {
    sg_tensor *g = b->g, *x = b->x[0], *y = b->x[1];
    switch ((sg__op)b->n->op) {
    case SG__OP_ADD:
        b->gi[0] = b->want[0] ? alias(g) : NULL;
        b->gi[1] = b->want[1] ? alias(g) : NULL;
        break;
    case SG__OP_SUB:
        b->gi[0] = b->want[0] ? alias(g) : NULL;
        b->gi[1] = b->want[1] ? sg_neg(g) : NULL;
        break;
    case SG__OP_MUL:
        b->gi[0] = b->want[0] ? sg_mul(g, y) : NULL;
        b->gi[1] = b->want[1] ? sg_mul(g, x) : NULL;
        break;
    case SG__OP_DIV:
        b->gi[0] = b->want[0] ? sg_div(g, y) : NULL;
        b->gi[1] = b->want[1] ? sg_neg(sg_div(sg_mul(g, b->out), y)) : NULL;
        break;
    case SG__OP_POW:
        /* 0 where the exponent is 0 (as torch): x^-1 is inf at x = 0 */
        if (b->want[0])
            b->gi[0] = sg_where(sg_eq(y, cst(b, 0)), cst(b, 0),
                                sg_mul(g, sg_mul(y, sg_pow(x, sg_add_scalar(y, -1.0)))));
        if (b->want[1])
            b->gi[1] =
                sg_where(sg_eq(x, cst(b, 0)), cst(b, 0), sg_mul(sg_mul(g, b->out), sg_log(x)));
        break;
    case SG__OP_MAXIMUM:
    case SG__OP_MINIMUM: {
        bool mx = b->n->op == SG__OP_MAXIMUM;
        sg_tensor *tie = sg_eq(x, y);
        if (b->want[0]) b->gi[0] = sg_mul(g, pick(b, mx ? sg_gt(x, y) : sg_lt(x, y), tie));
        if (b->want[1]) b->gi[1] = sg_mul(g, pick(b, mx ? sg_gt(y, x) : sg_lt(y, x), tie));
        break;
    }
    case SG__OP_WHERE:
        if (b->want[1]) b->gi[1] = sg_where(x, g, cst(b, 0));
        if (b->want[2]) b->gi[2] = sg_where(x, cst(b, 0), g);
        break;
    default: return no_rule(b);
    }
    return SG_OK;
}

/* ------------------------------------------------------------ reductions and rows */

static sg_status reduction(sg__bw *b) {
    const sg__gnode *n = b->n;
    const sg__gmeta *m = &n->in[0];
    sg_tensor *g = b->g, *x = b->x[0];
    int dims[SG_MAX_DIMS], nd = mask_dims(n->mask, m->ndim, dims);
    double count =
        (double)sg__numel(m->ndim, m->shape) / (double)(sg__numel(n->outm.ndim, n->outm.shape)
                                                            ? sg__numel(n->outm.ndim, n->outm.shape)
                                                            : 1);
    switch ((sg__op)n->op) {
    case SG__OP_SUM: b->gi[0] = sg_expand(g, m->ndim, m->shape); break;
    case SG__OP_MEAN: b->gi[0] = sg_expand(sg_mul_scalar(g, 1.0 / count), m->ndim, m->shape); break;
    case SG__OP_MAX:
    case SG__OP_MIN: { /* shared evenly among the elements equal to the extreme */
        sg_tensor *hit = num(b, sg_eq(x, b->out));
        b->gi[0] = sg_mul(hit, sg_div(g, sg_sum(hit, nd, dims, true)));
        break;
    }
    case SG__OP_VAR: {
        double denom = count - (double)n->i[0];
        sg_tensor *dev = sg_sub(x, sg_mean(x, nd, dims, true));
        b->gi[0] = sg_mul(dev, sg_mul_scalar(g, 2.0 / (denom > 0 ? denom : 0.0)));
        break;
    }
    default: return no_rule(b);
    }
    return SG_OK;
}

/*
 * layer_norm and rms_norm: one NORM_BWD node gives the input's gradient and
 * the weight's and bias's (column sums, in one packed result that views
 * take apart), the row statistics recomputed from x; the gradient already
 * gathered for x (a pre-norm residual's) is added by the same node, which
 * the backends run as one pass over x and g.
 */
static sg_status norm(sg__bw *b) {
    const sg__gnode *n = b->n;
    sg_tensor *g = b->g, *x = b->x[0], *w = b->x[1], *r = b->want[0] ? b->acc[0] : NULL;
    bool layer = n->op == SG__OP_LAYER_NORM;
    int parts = (b->want[1] ? SG__NB_DW : 0) | (layer && b->want[2] ? SG__NB_DB : 0);
    if (!b->want[0] && !parts) return SG_OK;
    bool same = r && r->dtype == x->dtype && r->ndim == x->ndim;
    for (int d = 0; same && d < x->ndim; d++) same = r->shape[d] == x->shape[d];
    if (!same) r = NULL;
    sg_tensor *o = sg__norm_grad(x, g, w, r, layer, n->f[0], parts);
    if (!o) return b->ctx->status != SG_OK ? b->ctx->status : SG_ERR_INTERNAL;
    b->took[0] = r != NULL;
    if (!parts) {
        b->gi[0] = o;
        return SG_OK;
    }
    int64_t m = sg__numel(x->ndim, x->shape), len = x->shape[x->ndim - 1];
    if (b->want[0]) b->gi[0] = sg_reshape(sg_narrow(o, 0, 0, m), x->ndim, x->shape);
    if (parts & SG__NB_DW) b->gi[1] = sg_narrow(o, 0, m, len);
    if (parts & SG__NB_DB) b->gi[2] = sg_narrow(o, 0, m + len, len);
    return SG_OK;
}

static sg_status rows(sg__bw *b) {
    const sg__gnode *n = b->n;
    sg_tensor *g = b->g, *y = b->out;
    int dim = (int)n->i[0];
    switch ((sg__op)n->op) {
    case SG__OP_SOFTMAX:
        b->gi[0] = sg_mul(y, sg_sub(g, sg_sum(sg_mul(g, y), 1, &dim, true)));
        return SG_OK;
    case SG__OP_LOG_SOFTMAX:
        b->gi[0] = sg_sub(g, sg_mul(sg_exp(y), sg_sum(g, 1, &dim, true)));
        return SG_OK;
    case SG__OP_LAYER_NORM:
    case SG__OP_RMS_NORM: return norm(b);
    case SG__OP_CROSS_ENTROPY: {
        /* (softmax(logits) - onehot(targets)) * g / N as one node: one pass
         * per row, the target compared in the kernel (no one-hot tensor). */
        b->gi[0] = sg__cross_entropy_grad(b->x[0], b->x[1], g);
        return SG_OK;
    }
    default: return no_rule(b);
    }
}

/* ------------------------------------------------------------ matmul and data */

static sg_status matmul(sg__bw *b) {
    sg_tensor *g = b->g, *x = b->x[0], *w = b->x[1];
    if (b->n->op == SG__OP_LINEAR) {
        int64_t N = w->shape[0], K = w->shape[1], gs[2] = {-1, N}, xs[2] = {-1, K};
        /* The bias's gradient (g summed over its leading dims) first: its
         * column sum then follows the node that made g (a relu backward's
         * where) and generated code takes that node as its prologue, one
         * kernel instead of two. */
        if (b->want[2] && g->ndim > 1) {
            int dims[SG_MAX_DIMS];
            for (int d = 0; d < g->ndim - 1; d++) dims[d] = d;
            b->gi[2] = sg_reshape(sg_sum(g, g->ndim - 1, dims, true), 1, &N);
        } else if (b->want[2]) {
            b->gi[2] = alias(g);
        }
        /* dW before dX: the input's gradient is then the last node of the
         * rule, right before the backward of the op that made x (a GELU's
         * gradient), which fusion can give the product as its epilogue
         * (cuBLASLt's DGELU). */
        if (b->want[1])
            b->gi[1] = sg_matmul(sg_transpose(sg_reshape(g, 2, gs), 0, 1), sg_reshape(x, 2, xs));
        if (b->want[0]) b->gi[0] = sg_matmul(g, w);
        return SG_OK;
    }
    /* A 1-d a is a row (1, K), a 1-d b a column (K, 1); g gets those dims back. */
    sg_tensor *A = x->ndim == 1 ? sg_unsqueeze(x, 0) : x;
    sg_tensor *B = w->ndim == 1 ? sg_unsqueeze(w, 1) : w;
    sg_tensor *G = g;
    if (x->ndim == 1) G = sg_unsqueeze(G, w->ndim == 1 ? 0 : -2);
    if (w->ndim == 1) G = sg_unsqueeze(G, -1);
    if (b->want[0]) {
        sg_tensor *ga = sg_matmul(G, sg_transpose(B, -1, -2));
        b->gi[0] = x->ndim == 1 ? sg_squeeze(ga, -2) : ga;
    }
    if (b->want[1]) {
        sg_tensor *gb = sg_matmul(sg_transpose(A, -1, -2), G);
        b->gi[1] = w->ndim == 1 ? sg_squeeze(gb, -1) : gb;
    }
    return SG_OK;
}

/*
 * ATTENTION: one ATTENTION_BWD node takes each row's logsumexp from the
 * forward's packed output (SG__ATTN_LSE: the saved result views its
 * storage) or recomputes it, computes rowsum(dO * O) and gives dq, dk and
 * dv (dk and dv summed over the query
 * heads of a grouped K/V head in a fixed order); the mask (a float mask that
 * needs a gradient never reaches this node: sg_sdpa decomposes it) and
 * kv_len get none.
 */
static sg_status attention(sg__bw *b) {
    if (b->want[3] || b->want[4])
        return sg__fail(b->ctx, SG_ERR_UNSUPPORTED,
                        "sg_grad: attention gives no gradient for "
                        "its mask or kv_len; compute a mask that needs one outside sg_sdpa");
    sg_tensor *d[3] = {NULL, NULL, NULL};
    /* The node's output and its gradient, (B, Lq, Hq, D), in the result's order. */
    sg_tensor *o = sg__attn_heads(b->out, "sg_grad"), *g = sg__attn_heads(b->g, "sg_grad");
    sg_tensor *lse = NULL;
    if (b->n->i[0] & SG__ATTN_LSE) { /* after the result in its packed output */
        const sg_tensor *t = b->out;
        int64_t rows = sg__numel(3, t->shape), no = rows * t->shape[3], one = 1;
        int64_t nl = sg__attn_numel(no, rows, sg_dtype_size(t->dtype)) - sg__attn_lse_at(no);
        lse = sg__tensor_view(b->out, "sg_grad", 1, &nl, &one, t->offset + sg__attn_lse_at(no));
    }
    sg_status s = b->ctx->status != SG_OK ? b->ctx->status : SG_ERR_OOM;
    if (o && g && (lse || !(b->n->i[0] & SG__ATTN_LSE)))
        s = sg__sdpa_grad(b->x, o, lse, g, b->n->f[0], (int)b->n->i[0], &d[0], &d[1], &d[2]);
    sg__tensor_drop(o), sg__tensor_drop(g), sg__tensor_drop(lse);
    if (s != SG_OK) return s;
    for (int k = 0; k < 3; k++)
        if (b->want[k]) b->gi[k] = d[k];
    return SG_OK;
}

static sg_status data(sg__bw *b) {
    const sg__gnode *n = b->n;
    sg_tensor *g = b->g;
    switch ((sg__op)n->op) {
    case SG__OP_EMBEDDING: {
        const sg__gmeta *m = &n->in[0];
        int64_t flat[1] = {-1}, rows2[2] = {-1, m->shape[1]};
        sg_tensor *z = scatter_base(b, m);
        sg_status s = sg__index_add_(z, 0, sg_reshape(b->x[1], 1, flat), sg_reshape(g, 2, rows2));
        b->gi[0] = z;
        return z ? s : b->ctx->status;
    }
    case SG__OP_INDEX_SELECT: {
        sg_tensor *z = scatter_base(b, &n->in[0]);
        sg_status s = sg__index_add_(z, (int)n->i[0], b->x[1], g);
        b->gi[0] = z;
        return z ? s : b->ctx->status;
    }
    case SG__OP_CONCAT: {
        int dim = (int)n->i[0];
        int64_t start = 0;
        for (int k = 0; k < n->nin; k++) {
            int64_t len = n->in[k].shape[dim];
            if (b->want[k]) b->gi[k] = sg_narrow(g, dim, start, len);
            start += len;
        }
        return SG_OK;
    }
    case SG__OP_ATTENTION: return attention(b);
    default: return no_rule(b);
    }
}

static sg_status view(sg__bw *b) {
    const sg__gnode *n = b->n;
    const sg__gmeta *m = &n->in[0];
    sg_tensor *g = b->g;
    switch (n->view) {
    case SG__VIEW_RESHAPE:
    case SG__VIEW_EXPAND: b->gi[0] = alias(g); break; /* the caller reshapes / sums */
    case SG__VIEW_PERMUTE: {
        int inv[SG_MAX_DIMS];
        for (int d = 0; d < m->ndim; d++) inv[n->info[d]] = d;
        b->gi[0] = sg_permute(g, inv);
        break;
    }
    case SG__VIEW_SLICE: {
        int dim = (int)n->info[0];
        int64_t start = n->info[1], step = n->info[2], len = n->outm.shape[dim];
        sg_tensor *z = zeros_of(b, m);
        sg_tensor *part = sg_slice(z, dim, start, len ? start + (len - 1) * step + 1 : start, step);
        sg_status s = part ? sg_copy_(part, g) : b->ctx->status;
        b->gi[0] = z;
        return z ? s : b->ctx->status;
    }
    }
    return SG_OK;
}

/* ------------------------------------------------------------ dispatch */

/* The rule of b->n by its family. */
static sg_status rule(sg__bw *b) {
    int op = b->n->op;
    sg_status s;
    if (op == SG__GK_VIEW)
        s = view(b);
    else if (op <= SG__OP_CLAMP)
        s = unary(b);
    else if (op <= SG__OP_WHERE)
        s = binary(b);
    else if (op <= SG__OP_VAR)
        s = reduction(b);
    else if (op <= SG__OP_CROSS_ENTROPY)
        s = rows(b);
    else if (op <= SG__OP_LINEAR)
        s = matmul(b);
    else
        s = data(b);
    if (s != SG_OK) return s;
    for (int k = 0; k < b->n->nin; k++)
        if (b->want[k] && !b->gi[k])
            return b->ctx->status != SG_OK ? b->ctx->status : SG_ERR_INTERNAL;
    return SG_OK;
}

/*
 * Whether op's rule is one pointwise formula of several rounding ops (not a
 * copy, a select or one product with g): for a bf16 or f16 node it computes
 * in f32 and fuses into one loop. The rules with a reduction inside (var,
 * max/min, softmax, log_softmax, layer_norm, rms_norm) keep the node's dtype:
 * their values cross between kernels, where f32 would double the bytes.
 * gelu_tanh's rule is one op (GELU_TANH_BWD) that computes in f32 itself.
 */
static bool opmath(int op) {
    switch (op) {
    case SG__OP_SIN:
    case SG__OP_COS:
    case SG__OP_TANH:
    case SG__OP_SIGMOID:
    case SG__OP_RSQRT:
    case SG__OP_GELU:
    case SG__OP_SILU:
    case SG__OP_POW_SCALAR:
    case SG__OP_DIV:
    case SG__OP_POW: return true;
    default: return false;
    }
}

#define OPMATH_MAX_IN 4

/* t in f32 when it is a bf16 or f16 tensor, else t itself. */
static sg_tensor *widen(sg_tensor *t) {
    return t && (t->dtype == SG_BF16 || t->dtype == SG_F16) ? sg_cast(t, SG_F32) : t;
}

/*
 * The rule of a bf16 or f16 node that opmath names runs on f32 copies of g,
 * the saved inputs and the saved output, as PyTorch computes such
 * gradients: every op of the formula keeps f32, and the gradient is rounded
 * to the input's dtype once, by the caller's cast. Fused, the widening casts
 * are free and the formula's intermediate roundings are gone; the copies are
 * intermediates of the rule, dropped with the rest.
 */
static sg_status rule_opmath(sg__bw *b) {
    sg_tensor *x[OPMATH_MAX_IN];
    sg__bw w = *b;
    w.g = widen(b->g);
    w.out = widen(b->out);
    for (int k = 0; k < b->n->nin; k++) x[k] = widen(b->x[k]);
    w.x = x;
    bool made = w.g && (w.out || !b->out);
    for (int k = 0; k < b->n->nin; k++) made = made && (x[k] || !b->x[k]);
    if (!made) return b->ctx->status != SG_OK ? b->ctx->status : SG_ERR_INTERNAL;
    return rule(&w);
}

sg_status sg__grad_rule(sg__bw *b) {
    sg_dtype dt = b->n->outm.dtype;
    if (opmath(b->n->op) && (dt == SG_BF16 || dt == SG_F16) && b->n->nin <= OPMATH_MAX_IN)
        return rule_opmath(b);
    return rule(b);
}
