/* SPDX-License-Identifier: MIT */
/*
 * optim.c -- the optimizers (AdamW, SGD with momentum) and clip_grad_norm_,
 * written with the ordinary ops so that they run eagerly and, inside a
 * compiled step, record like any other ops: fusion turns each parameter's
 * update into one pointwise loop and merges the loops into one multi-tensor
 * kernel.
 *
 * State lives in tensors the optimizer makes at create time, outside any
 * step: the moment buffers, the f32 master copies, the learning rate and
 * the step count (0-d f32, as torch's capturable step). A capture sees them
 * as parameters updated in place, so a replay advances them; nothing that
 * changes per step is baked into a capture. The bias corrections come from
 * the step count on the device: 1 - beta^t as 1 - exp(t * log(beta)).
 *
 * Updates are computed in f32 whatever the parameter dtype; moment buffers
 * are f32. A bf16/f16 parameter is read, updated in f32 and written back
 * rounded once; with master_weights the f32 copy is what is updated and
 * read, so small updates are not lost to rounding.
 */
#include "capture.h"

#include <math.h>
#include <stdio.h>

typedef enum optim_kind { OPTIM_ADAMW, OPTIM_SGD } optim_kind;

struct sg_optim {
    sg_ctx *ctx;
    optim_kind kind;
    int n;
    sg_tensor **params; /* the caller's; not owned */
    sg_tensor **s1;     /* AdamW: exp_avg; SGD: momentum buffer (NULL without momentum) */
    sg_tensor **s2;     /* AdamW: exp_avg_sq */
    sg_tensor **master; /* f32 copies of bf16/f16 params, or NULL entries */
    sg_tensor *lr, *step;
    sg_adamw_opts adamw;
    sg_sgd_opts sgd;
    sg__reg reg;          /* its entry in the context's registry */
    struct sg_optim *next; /* the context's list */
};

/* ------------------------------------------------------------ scratch */

/* The tensors one update makes, dropped together when it is done. */
#define SCRATCH_MAX 40
typedef struct scratch {
    sg_tensor *t[SCRATCH_MAX];
    int n;
} scratch;

static sg_tensor *keep(scratch *s, sg_tensor *t) {
    SG_ASSERT(s->n < SCRATCH_MAX);
    if (t) s->t[s->n++] = t;
    return t;
}

static void scratch_drop(scratch *s) {
    for (int i = 0; i < s->n; i++) sg__tensor_drop(s->t[i]);
    s->n = 0;
}

/* x as f32 (x itself when it is f32). */
static sg_tensor *as_f32(scratch *s, sg_tensor *x) {
    return x && x->dtype != SG_F32 ? keep(s, sg_cast(x, SG_F32)) : x;
}

/* The status after a run of ops: the first failure, or one for a NULL that
 * came back silently. */
static sg_status ops_status(sg_ctx *ctx, bool all_made) {
    if (ctx->status != SG_OK && !all_made) return ctx->status;
    return all_made ? SG_OK
                    : sg__fail(ctx, SG_ERR_INTERNAL,
                               "sg_optim_step: an op failed "
                               "without a message");
}

/* ------------------------------------------------------------ create and destroy */

/* The status of an array argument that sg__check_inputs refused; a NULL
 * element is said here, naming it (as sg_grad does). */
static sg_status array_status(sg_ctx *ctx, const char *fn, const char *what, int n,
                              sg_tensor *const *ts) {
    for (int i = 0; ctx && i < n; i++)
        if (!ts[i])
            return sg__fail(ctx, SG_ERR_NULL,
                            "%s: %s[%d] is NULL (an earlier op failed?); pass "
                            "%d live tensors",
                            fn, what, i, n);
    return sg__inputs_status(n, ts);
}

static sg_status check_params(sg_ctx *ctx, const char *fn, int n, sg_tensor *const *params) {
    if (!ctx) return SG_ERR_NULL;
    if (ctx->rec)
        return sg__fail(ctx, SG_ERR_INVALID_ARG,
                        "%s: called inside a step that is being "
                        "captured; make the optimizer once, outside the step",
                        fn);
    if (n < 1 || !params)
        return sg__fail(ctx, n < 1 ? SG_ERR_INVALID_ARG : SG_ERR_NULL,
                        "%s: %d params%s; pass "
                        "an array of n >= 1 float tensors",
                        fn, n, params ? "" : " (NULL array)");
    if (!sg__check_inputs(fn, n, params, NULL)) return array_status(ctx, fn, "params", n, params);
    for (int i = 0; i < n; i++)
        if (params[i]->ctx != ctx || !sg__dtype_is_float(params[i]->dtype)) {
            char d[SG__DESC];
            return sg__fail(ctx, params[i]->ctx != ctx ? SG_ERR_WRONG_CONTEXT : SG_ERR_DTYPE,
                            "%s: param %d is %s; params must be f32, f16 or bf16 tensors of "
                            "ctx",
                            fn, i, sg__describe(params[i], d, sizeof d));
        }
    /* A param listed twice would be updated twice a step (torch refuses it
     * too): the same handle, or two handles of the same elements. */
    for (int i = 0; i < n; i++)
        for (int j = 0; j < i; j++) {
            const sg_tensor *a = params[i], *b = params[j];
            bool same = a == b || (a->st == b->st && a->offset == b->offset && a->ndim == b->ndim);
            for (int d = 0; same && d < a->ndim && a != b; d++)
                same = a->shape[d] == b->shape[d] && a->stride[d] == b->stride[d];
            if (same)
                return sg__fail(ctx, SG_ERR_INVALID_ARG,
                                "%s: params %d and %d are the same tensor; list each param once",
                                fn, j, i);
        }
    return SG_OK;
}

static void release_all(sg_tensor **ts, int n) {
    for (int i = 0; ts && i < n; i++) sg_release(ts[i]);
}

/* Unlisted from its context, its state released, its memory freed. */
static void optim_free(sg_optim *opt) {
    sg_ctx *ctx = opt->ctx;
    for (sg_optim **p = &ctx->optims; *p; p = &(*p)->next)
        if (*p == opt) {
            *p = opt->next;
            break;
        }
    sg__reg_remove(ctx, &opt->reg);
    size_t arr = sizeof(sg_tensor *) * (size_t)opt->n;
    release_all(opt->s1, opt->n);
    release_all(opt->s2, opt->n);
    release_all(opt->master, opt->n);
    sg_release(opt->lr);
    sg_release(opt->step);
    sg__free(ctx, opt->params, arr);
    sg__free(ctx, opt->s1, arr);
    sg__free(ctx, opt->s2, arr);
    sg__free(ctx, opt->master, arr);
    sg__free(ctx, opt, sizeof *opt);
}

/* An optimizer of a destroyed context went with it (sg_ctx_destroy frees
 * the optimizers made on it): found in a live context's registry before
 * anything of opt is read, else nothing to do. */
void sg_optim_destroy(sg_optim *opt) {
    if (opt && sg__reg_find(opt, SG__REG_OPTIM)) optim_free(opt);
}

void sg__optims_destroy_all(sg_ctx *ctx) {
    while (ctx->optims) optim_free(ctx->optims);
}

/* A zeroed f32 tensor of param's shape. */
static sg_tensor *zeros_like_f32(sg_tensor *p) {
    return sg_zeros(p->ctx, SG_F32, p->ndim, p->shape);
}

/* The optimizer shell with lr, step count and the state arrays it needs. */
static sg_status optim_new(sg_ctx *ctx, optim_kind kind, int n, sg_tensor *const *params, double lr,
                           bool need_s1, bool need_s2, bool master, sg_optim **out) {
    size_t arr = sizeof(sg_tensor *) * (size_t)n;
    sg_optim *o = sg__calloc(ctx, sizeof *o);
    if (!o) return sg__fail(ctx, SG_ERR_OOM, "sg_optim: out of host memory");
    o->ctx = ctx;
    sg__reg_add(ctx, &o->reg, o, SG__REG_OPTIM);
    o->next = ctx->optims;
    ctx->optims = o;
    o->kind = kind;
    o->n = n;
    o->params = sg__alloc(ctx, arr);
    o->s1 = need_s1 ? sg__calloc(ctx, arr) : NULL;
    o->s2 = need_s2 ? sg__calloc(ctx, arr) : NULL;
    o->master = master ? sg__calloc(ctx, arr) : NULL;
    bool ok = o->params && (!need_s1 || o->s1) && (!need_s2 || o->s2) && (!master || o->master);
    if (ok) {
        memcpy(o->params, params, arr);
        o->lr = sg_full(ctx, SG_F32, 0, NULL, lr);
        o->step = sg_zeros(ctx, SG_F32, 0, NULL);
        ok = o->lr && o->step;
    }
    for (int i = 0; ok && i < n; i++) {
        if (need_s1) ok = (o->s1[i] = zeros_like_f32(params[i])) != NULL;
        if (ok && need_s2) ok = (o->s2[i] = zeros_like_f32(params[i])) != NULL;
        if (ok && master && params[i]->dtype != SG_F32) {
            o->master[i] = sg_cast(params[i], SG_F32);
            ok = o->master[i] != NULL;
        }
    }
    if (!ok) {
        sg_status s = ctx->status != SG_OK ? ctx->status : SG_ERR_OOM;
        if (ctx->status == SG_OK) sg__fail(ctx, s, "sg_optim: out of host memory");
        sg_optim_destroy(o);
        return s;
    }
    *out = o;
    return SG_OK;
}

static double or_default(double v, double d) { return v == 0 ? d : v; }

sg_status sg_adamw_create(sg_ctx *ctx, int n, sg_tensor *const *params, const sg_adamw_opts *o,
                          sg_optim **out) {
    sg_status s = check_params(ctx, "sg_adamw_create", n, params);
    if (s != SG_OK) return s;
    if (!out) return sg__fail(ctx, SG_ERR_NULL, "sg_adamw_create: out is NULL");
    sg_adamw_opts a = o ? *o : (sg_adamw_opts){0};
    a.lr = or_default(a.lr, 1e-3);
    a.beta1 = or_default(a.beta1, 0.9);
    a.beta2 = or_default(a.beta2, 0.999);
    a.eps = or_default(a.eps, 1e-8);
    a.weight_decay = or_default(a.weight_decay, 1e-2);
    if (!(a.lr > 0) || !(a.beta1 > 0 && a.beta1 < 1) || !(a.beta2 > 0 && a.beta2 < 1) ||
        !(a.eps > 0) || !(a.weight_decay >= 0) || !isfinite(a.lr) || !isfinite(a.weight_decay))
        return sg__fail(ctx, SG_ERR_INVALID_ARG,
                        "sg_adamw_create: lr %g, betas %g/%g, eps %g, "
                        "weight_decay %g; need lr > 0, betas in (0, 1), eps > 0 and "
                        "weight_decay >= 0 (0 fields take the defaults)",
                        a.lr, a.beta1, a.beta2, a.eps, a.weight_decay);
    sg_optim *opt;
    s = optim_new(ctx, OPTIM_ADAMW, n, params, a.lr, true, true, a.master_weights, &opt);
    if (s != SG_OK) return s;
    opt->adamw = a;
    *out = opt;
    return SG_OK;
}

sg_status sg_sgd_create(sg_ctx *ctx, int n, sg_tensor *const *params, const sg_sgd_opts *o,
                        sg_optim **out) {
    sg_status s = check_params(ctx, "sg_sgd_create", n, params);
    if (s != SG_OK) return s;
    if (!out) return sg__fail(ctx, SG_ERR_NULL, "sg_sgd_create: out is NULL");
    sg_sgd_opts g = o ? *o : (sg_sgd_opts){0};
    if (!(g.lr > 0) || !isfinite(g.lr) || !(g.momentum >= 0) || !(g.weight_decay >= 0) ||
        !isfinite(g.momentum) || !isfinite(g.dampening) || !isfinite(g.weight_decay))
        return sg__fail(ctx, SG_ERR_INVALID_ARG,
                        "sg_sgd_create: lr %g, momentum %g, dampening "
                        "%g, weight_decay %g; need lr > 0 (SGD has no default lr), momentum >= 0 "
                        "and weight_decay >= 0, all finite",
                        g.lr, g.momentum, g.dampening, g.weight_decay);
    if (g.nesterov && (g.momentum <= 0 || g.dampening != 0))
        return sg__fail(ctx, SG_ERR_INVALID_ARG,
                        "sg_sgd_create: nesterov needs momentum > 0 "
                        "and dampening 0 (got momentum %g, dampening %g), as in torch",
                        g.momentum, g.dampening);
    sg_optim *opt;
    s = optim_new(ctx, OPTIM_SGD, n, params, g.lr, g.momentum > 0, false, false, &opt);
    if (s != SG_OK) return s;
    opt->sgd = g;
    *out = opt;
    return SG_OK;
}

sg_tensor *sg_optim_lr(sg_optim *opt) { return opt ? opt->lr : NULL; }
sg_tensor *sg_optim_step_count(sg_optim *opt) { return opt ? opt->step : NULL; }

/* ------------------------------------------------------------ steps */

static sg_status check_grads(sg_optim *opt, sg_tensor *const *grads) {
    sg_ctx *ctx = opt->ctx;
    if (!grads)
        return sg__fail(ctx, SG_ERR_NULL,
                        "sg_optim_step: grads is NULL; pass one "
                        "gradient per param");
    if (!sg__check_inputs("sg_optim_step", opt->n, grads, NULL))
        return array_status(ctx, "sg_optim_step", "grads", opt->n, grads);
    for (int i = 0; i < opt->n; i++) {
        const sg_tensor *p = opt->params[i], *g = grads[i];
        bool ok =
            g->ctx == ctx && g->ndim == p->ndim && (g->dtype == p->dtype || g->dtype == SG_F32);
        for (int d = 0; ok && d < p->ndim; d++) ok = g->shape[d] == p->shape[d];
        if (!ok) {
            char a[SG__DESC], b[SG__DESC];
            bool dims = g->ctx == ctx && g->ndim == p->ndim;
            for (int d = 0; dims && d < p->ndim; d++) dims = g->shape[d] == p->shape[d];
            return sg__fail(ctx,
                            g->ctx != ctx ? SG_ERR_WRONG_CONTEXT
                            : dims        ? SG_ERR_DTYPE
                                          : SG_ERR_SHAPE,
                            "sg_optim_step: grad %d is %s for param %s; a grad needs its "
                            "param's shape and its dtype (or f32)",
                            i, sg__describe(g, a, sizeof a), sg__describe(p, b, sizeof b));
        }
    }
    return SG_OK;
}

/* The value of param i to update, as f32: its master copy, or the param. */
static sg_tensor *param_f32(sg_optim *opt, scratch *s, int i) {
    if (opt->master && opt->master[i]) return opt->master[i];
    return as_f32(s, opt->params[i]);
}

/* grad as f32; with scale (sg_optim_step_scaled), grad * scale rounded to
 * grad's dtype first: the value an in-place sg_clip_grad_norm_ leaves. */
static sg_tensor *grad_f32(scratch *s, sg_tensor *grad, sg_tensor *scale) {
    sg_tensor *g = as_f32(s, grad);
    if (!scale || !g) return g;
    sg_tensor *scaled = keep(s, sg_mul(g, scale));
    return grad->dtype == SG_F32 ? scaled : as_f32(s, keep(s, sg_cast(scaled, grad->dtype)));
}

/* Store the updated value of param i (and of its master copy). */
static sg_status param_store(sg_optim *opt, int i, sg_tensor *p_new) {
    sg_status st = SG_OK;
    if (opt->master && opt->master[i]) st = sg_copy_(opt->master[i], p_new);
    return st == SG_OK ? sg_copy_(opt->params[i], p_new) : st;
}

/* t = step + 1 written back to the step count; returns t (in s). */
static sg_tensor *advance_step(sg_optim *opt, scratch *s) {
    sg_tensor *t = keep(s, sg_add_scalar(opt->step, 1));
    if (t && sg_copy_(opt->step, t) != SG_OK) return NULL;
    return t;
}

/* 1 - beta^t as 1 - exp(t * log(beta)), 0-d. */
static sg_tensor *bias_correction(scratch *s, sg_tensor *t, double beta) {
    sg_tensor *pw = keep(s, sg_exp(keep(s, sg_mul_scalar(t, log(beta)))));
    return keep(s, sg_add_scalar(keep(s, sg_mul_scalar(pw, -1)), 1));
}

/*
 * torch.optim.AdamW (decoupled weight decay, bias-corrected):
 *   p *= 1 - lr * wd;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
 *   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
 */
static sg_status adamw_param(sg_optim *opt, int i, sg_tensor *grad, sg_tensor *scale,
                             sg_tensor *decay, sg_tensor *step_size, sg_tensor *bc2_sqrt) {
    const sg_adamw_opts *a = &opt->adamw;
    scratch s = {.n = 0};
    sg_tensor *g = grad_f32(&s, grad, scale), *p = param_f32(opt, &s, i);
    sg_tensor *m = keep(&s, sg_add(keep(&s, sg_mul_scalar(opt->s1[i], a->beta1)),
                                   keep(&s, sg_mul_scalar(g, 1 - a->beta1))));
    sg_tensor *g2 = keep(&s, sg_mul_scalar(keep(&s, sg_mul(g, g)), 1 - a->beta2));
    sg_tensor *v = keep(&s, sg_add(keep(&s, sg_mul_scalar(opt->s2[i], a->beta2)), g2));
    sg_tensor *den =
        keep(&s, sg_add_scalar(keep(&s, sg_div(keep(&s, sg_sqrt(v)), bc2_sqrt)), a->eps));
    sg_tensor *upd = keep(&s, sg_mul(step_size, keep(&s, sg_div(m, den))));
    sg_tensor *pn = keep(&s, sg_sub(keep(&s, sg_mul(p, decay)), upd));
    sg_status st = ops_status(opt->ctx, pn != NULL);
    if (st == SG_OK) st = sg_copy_(opt->s1[i], m);
    if (st == SG_OK) st = sg_copy_(opt->s2[i], v);
    if (st == SG_OK) st = param_store(opt, i, pn);
    scratch_drop(&s);
    return st;
}

static sg_status adamw_step(sg_optim *opt, sg_tensor *const *grads, sg_tensor *scale) {
    const sg_adamw_opts *a = &opt->adamw;
    scratch s = {.n = 0};
    sg_tensor *t = advance_step(opt, &s);
    sg_tensor *bc1 = bias_correction(&s, t, a->beta1);
    sg_tensor *step_size = keep(&s, sg_div(opt->lr, bc1));
    sg_tensor *bc2_sqrt = keep(&s, sg_sqrt(bias_correction(&s, t, a->beta2)));
    sg_tensor *decay =
        keep(&s, sg_add_scalar(keep(&s, sg_mul_scalar(opt->lr, -a->weight_decay)), 1));
    sg_status st = ops_status(opt->ctx, step_size && bc2_sqrt && decay);
    for (int i = 0; i < opt->n && st == SG_OK; i++)
        st = adamw_param(opt, i, grads[i], scale, decay, step_size, bc2_sqrt);
    scratch_drop(&s);
    return st;
}

/*
 * torch.optim.SGD: d = g + wd p; with momentum, buf = d on the first step,
 * else momentum buf + (1 - dampening) d, and d = buf (or d + momentum buf
 * with nesterov); p -= lr d. The first step's rule is a coefficient from the
 * step count: buf = momentum buf + first_coef d, first_coef = 1 - dampening
 * min(step, 1) (buf is still zero on the first step).
 */
static sg_status sgd_param(sg_optim *opt, int i, sg_tensor *grad, sg_tensor *scale,
                           sg_tensor *neg_lr, sg_tensor *first_coef) {
    const sg_sgd_opts *o = &opt->sgd;
    scratch s = {.n = 0};
    sg_tensor *d = grad_f32(&s, grad, scale), *p = param_f32(opt, &s, i), *buf = NULL;
    if (o->weight_decay != 0) d = keep(&s, sg_add(d, keep(&s, sg_mul_scalar(p, o->weight_decay))));
    if (o->momentum != 0) {
        buf = keep(&s, sg_add(keep(&s, sg_mul_scalar(opt->s1[i], o->momentum)),
                              keep(&s, sg_mul(first_coef, d))));
        d = o->nesterov ? keep(&s, sg_add(d, keep(&s, sg_mul_scalar(buf, o->momentum)))) : buf;
    }
    sg_tensor *pn = keep(&s, sg_add(p, keep(&s, sg_mul(neg_lr, d))));
    sg_status st = ops_status(opt->ctx, pn != NULL);
    if (st == SG_OK && buf) st = sg_copy_(opt->s1[i], buf);
    if (st == SG_OK) st = param_store(opt, i, pn);
    scratch_drop(&s);
    return st;
}

static sg_status sgd_step(sg_optim *opt, sg_tensor *const *grads, sg_tensor *scale) {
    const sg_sgd_opts *o = &opt->sgd;
    scratch s = {.n = 0};
    sg_tensor *first = NULL;
    if (o->momentum != 0) {
        sg_tensor *seen = keep(&s, sg_clamp(opt->step, 0, 1));
        first = keep(&s, sg_add_scalar(keep(&s, sg_mul_scalar(seen, -o->dampening)), 1));
    }
    sg_tensor *t = advance_step(opt, &s);
    sg_tensor *neg_lr = keep(&s, sg_mul_scalar(opt->lr, -1));
    sg_status st = ops_status(opt->ctx, t && neg_lr && (o->momentum == 0 || first));
    for (int i = 0; i < opt->n && st == SG_OK; i++)
        st = sgd_param(opt, i, grads[i], scale, neg_lr, first);
    scratch_drop(&s);
    return st;
}

sg_status sg_optim_step_scaled(sg_optim *opt, sg_tensor *const *grads, sg_tensor *scale) {
    if (!opt) return SG_ERR_NULL;
    sg_status st = check_grads(opt, grads);
    if (st != SG_OK) return st;
    if (scale && (scale->ctx != opt->ctx || scale->ndim != 0 || scale->dtype != SG_F32)) {
        char d[SG__DESC];
        return sg__fail(opt->ctx, scale->ctx != opt->ctx ? SG_ERR_WRONG_CONTEXT : SG_ERR_SHAPE,
                        "sg_optim_step_scaled: scale is %s; it must be a 0-d f32 tensor of the "
                        "optimizer's context (sg_clip_grad_norm_coef makes one)",
                        sg__describe(scale, d, sizeof d));
    }
    return opt->kind == OPTIM_ADAMW ? adamw_step(opt, grads, scale) : sgd_step(opt, grads, scale);
}

sg_status sg_optim_step(sg_optim *opt, sg_tensor *const *grads) {
    return sg_optim_step_scaled(opt, grads, NULL);
}

/* ------------------------------------------------------------ clip_grad_norm_ */

/*
 * torch.nn.utils.clip_grad_norm_ (L2): total = sqrt(sum_i sum(g_i^2)),
 * coef = min(max_norm / (total + 1e-6), 1), g_i *= coef. All on the device.
 * clip_coef is all but the last step; *coef_out and *total_norm (may be
 * NULL) are set on success only.
 */
static sg_status clip_coef(int n, sg_tensor *const *grads, double max_norm, sg_tensor **coef_out,
                           sg_tensor **total_norm) {
    if (n < 1 || !grads) {
        sg__set_create_error("sg_clip_grad_norm_: %s; pass an array of n >= 1 tensors",
                             !grads ? "grads is NULL" : "n is below 1");
        return !grads ? SG_ERR_NULL : SG_ERR_INVALID_ARG;
    }
    sg_ctx *ctx = sg__check_inputs("sg_clip_grad_norm_", n, grads, NULL);
    if (!ctx) {
        for (int i = 0; i < n && !ctx; i++)
            if (grads[i] && grads[i]->magic == SG__TENSOR_LIVE) ctx = grads[i]->ctx;
        return array_status(ctx, "sg_clip_grad_norm_", "grads", n, grads);
    }
    for (int i = 0; i < n; i++)
        if (!sg__dtype_is_float(grads[i]->dtype)) {
            char d[SG__DESC];
            return sg__fail(ctx, SG_ERR_DTYPE,
                            "sg_clip_grad_norm_: grad %d is %s; grads must "
                            "be f32, f16 or bf16",
                            i, sg__describe(grads[i], d, sizeof d));
        }
    if (!(max_norm >= 0) || !isfinite(max_norm))
        return sg__fail(ctx, SG_ERR_INVALID_ARG,
                        "sg_clip_grad_norm_: max_norm %g; it must be "
                        "finite and >= 0",
                        max_norm);
    /* Every grad's sum of squares first, then their total: the reductions
     * are recorded back to back and the n - 1 adds after them, in the same
     * order as a running total, so the adds fuse into one small kernel
     * (with the sqrt and the coefficient) instead of one per grad. */
    sg_tensor **part = sg__calloc(ctx, sizeof *part * (size_t)n);
    if (!part)
        return sg__fail(ctx, SG_ERR_OOM, "sg_clip_grad_norm_: no host memory for %d partial norms",
                        n);
    for (int i = 0; i < n; i++) {
        sg_tensor *g = grads[i]->dtype == SG_F32 ? grads[i] : sg_cast(grads[i], SG_F32);
        sg_tensor *g2 = sg_mul(g, g);
        part[i] = sg_sum(g2, 0, NULL, false);
        if (g != grads[i]) sg__tensor_drop(g);
        sg__tensor_drop(g2);
    }
    sg_tensor *sq = part[0];
    for (int i = 1; i < n; i++) {
        sg_tensor *next = sg_add(sq, part[i]);
        if (i > 1) sg__tensor_drop(sq);
        sq = next;
    }
    for (int i = 0; i < n; i++)
        if (part[i] != sq) sg__tensor_drop(part[i]);
    sg__free(ctx, part, sizeof *part * (size_t)n);
    sg_tensor *total = sg_sqrt(sq);
    scratch s = {.n = 0};
    sg_tensor *maxn = keep(&s, sg_full(ctx, SG_F32, 0, NULL, max_norm));
    sg_tensor *ratio = keep(&s, sg_div(maxn, keep(&s, sg_add_scalar(total, 1e-6))));
    sg_tensor *coef = sg_clamp(ratio, -INFINITY, 1);
    sg__tensor_drop(sq);
    sg_status st = ops_status(ctx, coef != NULL);
    scratch_drop(&s);
    if (st == SG_OK)
        *coef_out = coef;
    else
        sg__tensor_drop(coef);
    if (st == SG_OK && total_norm)
        *total_norm = total;
    else
        sg__tensor_drop(total);
    return st;
}

sg_status sg_clip_grad_norm_coef(int n, sg_tensor *const *grads, double max_norm, sg_tensor **coef,
                                 sg_tensor **total_norm) {
    if (!coef) {
        sg__set_create_error("sg_clip_grad_norm_coef: coef is NULL; pass where to put it");
        return SG_ERR_NULL;
    }
    return clip_coef(n, grads, max_norm, coef, total_norm); /* *coef set on success only */
}

sg_status sg_clip_grad_norm_(int n, sg_tensor *const *grads, double max_norm,
                             sg_tensor **total_norm) {
    sg_tensor *coef = NULL, *total = NULL;
    sg_status st = clip_coef(n, grads, max_norm, &coef, &total);
    sg_ctx *ctx = coef ? coef->ctx : NULL;
    for (int i = 0; i < n && st == SG_OK; i++) {
        sg_tensor *g = grads[i]->dtype == SG_F32 ? grads[i] : sg_cast(grads[i], SG_F32);
        sg_tensor *scaled = sg_mul(g, coef);
        st = scaled ? sg_copy_(grads[i], scaled) : ops_status(ctx, false);
        if (g != grads[i]) sg__tensor_drop(g);
        sg__tensor_drop(scaled);
    }
    sg__tensor_drop(coef);
    if (st == SG_OK && total_norm)
        *total_norm = total;
    else
        sg__tensor_drop(total);
    return st;
}
