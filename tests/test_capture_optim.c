/* SPDX-License-Identifier: MIT */
/*
 * test_capture_optim.c -- AdamW, SGD and clip_grad_norm_ against torch's
 * update formulas written here in f64, over several steps on random params
 * and grads: eagerly (sg_optim_step outside any step) and inside a step
 * compiled in each mode, with lr changed between calls (no recapture), and
 * the kernel count of a compiled AdamW step; the clip folded into the
 * update (sg_clip_grad_norm_coef, sg_optim_step_scaled) equal bit for bit
 * to the clip in place; and one step updating 46 parameters, 40 of one
 * shape, by AdamW and SGD together (on CUDA the loops of one code but for
 * their tensors share one loop of the multi-tensor kernel). Each case prints
 * its name:
 *   ok   ADAMW(type=f32,params=4,steps=4,mode=reduce-overhead) kernels=2
 */
#define _POSIX_C_SOURCE 200809L
#include "graphs/graphs.h"
#include "testutil.h"

#include <math.h>
#include <string.h>

static sg_ctx *ctx;

#define NP 4
#define NSTEPS 4
#define MAXP 48 /* params of the many-parameter step */
static const int64_t shapes[NP][2] = {{3, 5}, {17, 1}, {1, 33}, {8, 9}};

/* The reference: params and state in f64, the update torch's. */
typedef struct ref {
    double *p[MAXP], *m[MAXP], *v[MAXP], *master[MAXP];
    int64_t n[MAXP];
} ref;

typedef struct setup {
    const char *kind; /* "adamw" or "sgd" */
    sg_dtype dt;
    sg_adamw_opts a;
    sg_sgd_opts s;
} setup;

static void ref_free(ref *r) {
    for (int i = 0; i < MAXP; i++) free(r->p[i]), free(r->m[i]), free(r->v[i]), free(r->master[i]);
}

/* torch.optim.AdamW._single_tensor_adamw, step t (1-based), in f64. */
static void ref_adamw(ref *r, int i, const double *g, double lr, int t, const sg_adamw_opts *o,
                      sg_dtype dt) {
    double bc1 = 1 - pow(o->beta1, t), bc2 = 1 - pow(o->beta2, t);
    double *p = o->master_weights && dt != SG_F32 ? r->master[i] : r->p[i];
    for (int64_t k = 0; k < r->n[i]; k++) {
        p[k] *= 1 - lr * o->weight_decay;
        r->m[i][k] += (1 - o->beta1) * (g[k] - r->m[i][k]);
        r->v[i][k] = r->v[i][k] * o->beta2 + (1 - o->beta2) * g[k] * g[k];
        double denom = sqrt(r->v[i][k]) / sqrt(bc2) + o->eps;
        p[k] -= lr / bc1 * r->m[i][k] / denom;
        if (p != r->p[i])
            r->p[i][k] = tu_round(dt, p[k]);
        else
            p[k] = tu_round(dt, p[k]);
    }
}

/* torch.optim.SGD._single_tensor_sgd, step t (1-based), in f64. */
static void ref_sgd(ref *r, int i, const double *g, double lr, int t, const sg_sgd_opts *o,
                    sg_dtype dt) {
    for (int64_t k = 0; k < r->n[i]; k++) {
        double d = g[k] + o->weight_decay * r->p[i][k];
        if (o->momentum != 0) {
            r->m[i][k] = t == 1 ? d : o->momentum * r->m[i][k] + (1 - o->dampening) * d;
            d = o->nesterov ? d + o->momentum * r->m[i][k] : r->m[i][k];
        }
        r->p[i][k] = tu_round(dt, r->p[i][k] - lr * d);
    }
}

typedef struct world {
    sg_tensor *p[NP];
    sg_optim *opt;
} world;

static sg_status opt_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    world *w = user;
    sg_status s = sg_optim_step(w->opt, in);
    out[0] = sg_optim_step_count(w->opt);
    return s != SG_OK ? s : sg_ctx_status(c);
}

/* The kernel count of fn's first capture, from sg_fn_explain; -1 if none. */
static int explained_kernels(sg_fn *fn) {
    const char *s = strstr(sg_fn_explain(fn), "kernels: ");
    return s ? atoi(s + 9) : -1;
}

static bool has_multi(sg_fn *fn, int members) {
    if (fn->ngraphs < 1) return false;
    const sg__fused *f = &fn->graphs[0]->fused;
    for (int i = 0; i < f->ngroups; i++)
        if (f->groups[i].kind == SG__G_MULTI && f->groups[i].nmembers == members) return true;
    return false;
}

/*
 * NSTEPS steps of the optimizer of su over NP params, eagerly (mode < 0:
 * sg_optim_step called directly) or in a step compiled in mode; lr changes
 * after step 2 through sg_fill_. Each step's params match the reference.
 */
/* The reference applies torch's defaults to zero AdamW fields itself. */
static setup with_defaults(const setup *given) {
    setup full = *given;
    sg_adamw_opts *a = &full.a;
    if (a->lr == 0) a->lr = 1e-3;
    if (a->beta1 == 0) a->beta1 = 0.9;
    if (a->beta2 == 0) a->beta2 = 0.999;
    if (a->eps == 0) a->eps = 1e-8;
    if (a->weight_decay == 0) a->weight_decay = 1e-2;
    return full;
}

static void run(const setup *given, int mode, uint64_t seed) {
    setup full = with_defaults(given), *su = &full;
    tu_seed(seed);
    world w = {0};
    ref r = {0};
    bool ok = true;
    for (int i = 0; i < NP; i++) {
        w.p[i] = tu_rand(ctx, su->dt, 2, shapes[i], -1, 1, &r.p[i]);
        r.n[i] = shapes[i][0] * shapes[i][1];
        r.m[i] = calloc((size_t)r.n[i], sizeof(double));
        r.v[i] = calloc((size_t)r.n[i], sizeof(double));
        r.master[i] = malloc(sizeof(double) * (size_t)r.n[i]);
        memcpy(r.master[i], r.p[i], sizeof(double) * (size_t)r.n[i]);
    }
    bool adam = strcmp(su->kind, "adamw") == 0;
    ok = TU_EXPECT((adam ? sg_adamw_create(ctx, NP, w.p, &given->a, &w.opt)
                         : sg_sgd_create(ctx, NP, w.p, &su->s, &w.opt)) == SG_OK);
    sg_fn *fn = NULL;
    if (ok && mode >= 0)
        ok = TU_EXPECT(sg_compile(ctx, opt_step, &w, NP, 1,
                                  &(sg_compile_opts){.mode = (sg_mode)mode}, &fn) == SG_OK);
    double lr = adam ? su->a.lr : su->s.lr;
    for (int t = 1; ok && t <= NSTEPS; t++) {
        if (t == 3) { /* a new lr, read by the next replay */
            lr *= 0.5;
            ok = TU_EXPECT(sg_fill_(sg_optim_lr(w.opt), lr) == SG_OK);
            lr = tu_round(SG_F32, lr);
        }
        sg_mark_step_begin(ctx);
        sg_tensor *g[NP];
        double *gv[NP];
        for (int i = 0; i < NP; i++) g[i] = tu_rand(ctx, su->dt, 2, shapes[i], -1, 1, &gv[i]);
        sg_tensor *out = NULL;
        ok = ok && TU_EXPECT((fn ? sg_call(fn, g, NP, &out, 1) : sg_optim_step(w.opt, g)) == SG_OK);
        for (int i = 0; i < NP; i++) {
            if (adam)
                ref_adamw(&r, i, gv[i], lr, t, &su->a, su->dt);
            else
                ref_sgd(&r, i, gv[i], lr, t, &su->s, su->dt);
            double *got = ok ? tu_read(w.p[i]) : NULL;
            /* f32: torch's tolerance plus the f32 rounding of 1 - beta^t */
            double rt = su->dt == SG_F32 ? 1e-5 : 1e-2, at = su->dt == SG_F32 ? 2e-6 : 1e-2;
            char nm[64];
            snprintf(nm, sizeof nm, "param %d after step %d", i, t);
            ok = ok && TU_EXPECT(got) && tu_close(nm, got, r.p[i], r.n[i], rt, at);
            free(got), free(gv[i]);
            sg_release(g[i]);
        }
        double cnt = 0;
        ok = ok && TU_EXPECT(sg_item(sg_optim_step_count(w.opt), &cnt) == SG_OK) &&
             TU_EXPECT(cnt == t);
    }
    int kernels = fn && ok ? explained_kernels(fn) : -1;
    if (fn && ok) ok = TU_EXPECT(fn->ngraphs == (mode == SG_MODE_EAGER ? 0 : 1));
    /* On the CPU: the step-count kernel and one multi-tensor kernel. */
    if (fn && ok && mode != SG_MODE_EAGER && su->dt == SG_F32 && adam &&
        sg_ctx_backend(ctx) == SG_BACKEND_CPU)
        ok = TU_EXPECT(kernels == 2) && TU_EXPECT(has_multi(fn, NP));
    if (!ok) fprintf(stderr, "%s\n%s\n", sg_last_error(ctx), fn ? sg_fn_explain(fn) : "");
    char desc[160];
    if (adam)
        snprintf(desc, sizeof desc, "lr=%g,betas=%g/%g,wd=%g,master=%d", su->a.lr, su->a.beta1,
                 su->a.beta2, su->a.weight_decay, su->a.master_weights);
    else
        snprintf(desc, sizeof desc, "lr=%g,momentum=%g,dampening=%g,wd=%g,nesterov=%d", su->s.lr,
                 su->s.momentum, su->s.dampening, su->s.weight_decay, su->s.nesterov);
    tu_case(ok, "%s(type=%s,params=%d,steps=%d,%s,mode=%s) kernels=%d seed=%llu",
            adam ? "ADAMW" : "SGD", sg_dtype_name(su->dt), NP, NSTEPS, desc,
            mode < 0 ? "direct" : sg_mode_name((sg_mode)mode), kernels, (unsigned long long)seed);
    sg_clear_error(ctx);
    sg_fn_destroy(fn);
    sg_optim_destroy(w.opt);
    for (int i = 0; i < NP; i++) sg_release(w.p[i]);
    ref_free(&r);
}

/* ------------------------------------------------------------ clip_grad_norm_ */

static double clip_max;

static sg_status clip_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)user;
    sg_status s = sg_clip_grad_norm_(NP, in, clip_max, &out[0]);
    return s != SG_OK ? s : sg_ctx_status(c);
}

static void test_clip(sg_dtype dt, double max_norm, int mode, uint64_t seed) {
    tu_seed(seed);
    sg_tensor *g[NP];
    double *gv[NP], sq = 0;
    for (int i = 0; i < NP; i++) {
        g[i] = tu_rand(ctx, dt, 2, shapes[i], -1, 1, &gv[i]);
        for (int64_t k = 0; k < shapes[i][0] * shapes[i][1]; k++) sq += gv[i][k] * gv[i][k];
    }
    double norm = sqrt(sq), coef = fmin(max_norm / (norm + 1e-6), 1.0);
    sg_tensor *total = NULL;
    sg_fn *fn = NULL;
    bool ok = true;
    clip_max = max_norm;
    if (mode >= 0)
        ok = TU_EXPECT(sg_compile(ctx, clip_step, NULL, NP, 1,
                                  &(sg_compile_opts){.mode = (sg_mode)mode}, &fn) == SG_OK) &&
             TU_EXPECT(sg_call(fn, g, NP, &total, 1) == SG_OK);
    else
        ok = TU_EXPECT(sg_clip_grad_norm_(NP, g, max_norm, &total) == SG_OK);
    double got_norm = NAN;
    ok = ok && TU_EXPECT(sg_item(total, &got_norm) == SG_OK) &&
         TU_EXPECT(fabs(got_norm - norm) <= 1e-5 * norm);
    for (int i = 0; ok && i < NP; i++) {
        int64_t n = shapes[i][0] * shapes[i][1];
        double *got = tu_read(g[i]);
        for (int64_t k = 0; k < n; k++) gv[i][k] = tu_round(dt, gv[i][k] * coef);
        ok = TU_EXPECT(got) && tu_close("clipped grad", got, gv[i], n, tu_rtol(dt), tu_atol(dt));
        free(got);
    }
    if (!ok) fprintf(stderr, "%s\n", sg_last_error(ctx));
    tu_case(ok, "CLIP_GRAD_NORM(type=%s,grads=%d,max_norm=%g,norm=%.4f,mode=%s) seed=%llu",
            sg_dtype_name(dt), NP, max_norm, norm,
            mode < 0 ? "direct" : sg_mode_name((sg_mode)mode), (unsigned long long)seed);
    sg_clear_error(ctx);
    if (!fn) sg_release(total);
    sg_fn_destroy(fn);
    for (int i = 0; i < NP; i++) sg_release(g[i]), free(gv[i]);
}

/* ------------------------------------------------------------ clipping inside the update */

static sg_status scaled_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    world *w = user;
    sg_tensor *coef = NULL;
    sg_status s = sg_clip_grad_norm_coef(NP, in, clip_max, &coef, NULL);
    if (s == SG_OK) s = sg_optim_step_scaled(w->opt, in, coef);
    out[0] = sg_optim_step_count(w->opt);
    return s != SG_OK ? s : sg_ctx_status(c);
}

static sg_status inplace_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    world *w = user;
    sg_status s = sg_clip_grad_norm_(NP, in, clip_max, NULL);
    if (s == SG_OK) s = sg_optim_step(w->opt, in);
    out[0] = sg_optim_step_count(w->opt);
    return s != SG_OK ? s : sg_ctx_status(c);
}

/* sg_clip_grad_norm_coef then sg_optim_step_scaled (mode < 0: directly, else
 * compiled), NSTEPS steps: the params equal, bit for bit, those of
 * sg_clip_grad_norm_ then sg_optim_step on copies run the same way (eager
 * and generated kernels may round differently: compared within a mode),
 * match the f64 reference on round(g * coef), and the grads stay unscaled. */
static void test_scaled(const setup *given, double max_norm, int mode, uint64_t seed) {
    setup full = with_defaults(given), *su = &full;
    tu_seed(seed);
    world w = {0}, cp = {0};
    ref r = {0};
    bool adam = strcmp(su->kind, "adamw") == 0, ok = true;
    for (int i = 0; i < NP; i++) {
        w.p[i] = tu_rand(ctx, su->dt, 2, shapes[i], -1, 1, &r.p[i]);
        cp.p[i] = sg_clone(w.p[i]);
        r.n[i] = shapes[i][0] * shapes[i][1];
        r.m[i] = calloc((size_t)r.n[i], sizeof(double));
        r.v[i] = calloc((size_t)r.n[i], sizeof(double));
        r.master[i] = malloc(sizeof(double) * (size_t)r.n[i]);
        memcpy(r.master[i], r.p[i], sizeof(double) * (size_t)r.n[i]);
    }
    ok = adam ? TU_EXPECT(sg_adamw_create(ctx, NP, w.p, &given->a, &w.opt) == SG_OK) &&
                    TU_EXPECT(sg_adamw_create(ctx, NP, cp.p, &given->a, &cp.opt) == SG_OK)
              : TU_EXPECT(sg_sgd_create(ctx, NP, w.p, &su->s, &w.opt) == SG_OK) &&
                    TU_EXPECT(sg_sgd_create(ctx, NP, cp.p, &su->s, &cp.opt) == SG_OK);
    sg_fn *fn = NULL, *fc = NULL;
    clip_max = max_norm;
    if (ok && mode >= 0)
        ok = TU_EXPECT(sg_compile(ctx, scaled_step, &w, NP, 1,
                                  &(sg_compile_opts){.mode = (sg_mode)mode}, &fn) == SG_OK) &&
             TU_EXPECT(sg_compile(ctx, inplace_step, &cp, NP, 1,
                                  &(sg_compile_opts){.mode = (sg_mode)mode}, &fc) == SG_OK);
    double lr = adam ? su->a.lr : su->s.lr, coef = 0;
    for (int t = 1; ok && t <= NSTEPS; t++) {
        sg_mark_step_begin(ctx);
        sg_tensor *g[NP], *gc[NP], *out = NULL, *outc = NULL;
        double *gv[NP], sq = 0;
        for (int i = 0; i < NP; i++) {
            g[i] = tu_rand(ctx, su->dt, 2, shapes[i], -1, 1, &gv[i]);
            gc[i] = sg_clone(g[i]);
            for (int64_t k = 0; k < r.n[i]; k++) sq += gv[i][k] * gv[i][k];
        }
        coef = fmin(max_norm / (sqrt(sq) + 1e-6), 1.0);
        ok = TU_EXPECT((fn ? sg_call(fn, g, NP, &out, 1) : scaled_step(ctx, g, &out, &w)) ==
                       SG_OK) &&
             TU_EXPECT((fc ? sg_call(fc, gc, NP, &outc, 1) : inplace_step(ctx, gc, &outc, &cp)) ==
                       SG_OK);
        for (int i = 0; i < NP; i++) {
            double *gs = malloc(sizeof(double) * (size_t)r.n[i]);
            for (int64_t k = 0; k < r.n[i]; k++) gs[k] = tu_round(su->dt, gv[i][k] * coef);
            if (adam)
                ref_adamw(&r, i, gs, lr, t, &su->a, su->dt);
            else
                ref_sgd(&r, i, gs, lr, t, &su->s, su->dt);
            double *got = ok ? tu_read(w.p[i]) : NULL, *same = ok ? tu_read(cp.p[i]) : NULL;
            double *gread = ok ? tu_read(g[i]) : NULL;
            char nm[64];
            snprintf(nm, sizeof nm, "param %d after step %d", i, t);
            ok = ok && TU_EXPECT(got && same && gread) &&
                 TU_EXPECT(memcmp(got, same, sizeof(double) * (size_t)r.n[i]) == 0) &&
                 TU_EXPECT(memcmp(gread, gv[i], sizeof(double) * (size_t)r.n[i]) == 0) &&
                 tu_close(nm, got, r.p[i], r.n[i], su->dt == SG_F32 ? 1e-5 : 1e-2,
                          su->dt == SG_F32 ? 2e-6 : 1e-2);
            free(got), free(same), free(gread), free(gs), free(gv[i]);
            sg_release(g[i]), sg_release(gc[i]);
        }
    }
    if (!ok) fprintf(stderr, "%s\n", sg_last_error(ctx));
    tu_case(ok,
            "CLIP_SCALED_%s(type=%s,params=%d,steps=%d,max_norm=%g,coef=%.4f,mode=%s) seed=%llu",
            adam ? "ADAMW" : "SGD", sg_dtype_name(su->dt), NP, NSTEPS, max_norm, coef,
            mode < 0 ? "direct" : sg_mode_name((sg_mode)mode), (unsigned long long)seed);
    sg_clear_error(ctx);
    sg_fn_destroy(fn), sg_fn_destroy(fc);
    sg_optim_destroy(w.opt), sg_optim_destroy(cp.opt);
    for (int i = 0; i < NP; i++) sg_release(w.p[i]), sg_release(cp.p[i]);
    ref_free(&r);
}

/* ------------------------------------------------------------ many parameters */

/* AdamW over the first na params, SGD over the rest, in one step. */
typedef struct many {
    int na;
    sg_optim *adam, *sgd;
} many;

static sg_status many_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    many *w = user;
    sg_status s = sg_optim_step(w->adam, in);
    if (s == SG_OK) s = sg_optim_step(w->sgd, in + w->na);
    out[0] = sg_optim_step_count(w->adam);
    return s != SG_OK ? s : sg_ctx_status(c);
}

/*
 * 46 params, 40 of them [48, 128] (more elements than a one-block chain
 * kernel takes, sg__fuse_opts.chain) and 6 of shapes of their own; AdamW (of
 * dtype adam_dt, with f32 master weights when bf16) updates 34 of them, 30
 * of the one shape, and SGD with momentum (f32) the other 12, 10 of that
 * shape, in one compiled step, NSTEPS steps with AdamW's lr changed after
 * step 2. Each param matches the f64 reference after each step.
 */
static void test_many(sg_dtype adam_dt, int mode, uint64_t seed) {
    static const int64_t own[6][2] = {{17, 1}, {1, 33}, {5, 7}, {96, 1}, {3, 5}, {8, 9}};
    const int n = 46, na = 34;
    const setup adam = with_defaults(&(setup){
        .kind = "adamw", .dt = adam_dt, .a = {.lr = 1e-2, .master_weights = adam_dt != SG_F32}});
    const sg_sgd_opts so = {.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .weight_decay = 0.01};
    int64_t shape[MAXP][2];
    tu_seed(seed);
    sg_tensor *p[MAXP];
    ref r = {0};
    for (int i = 0; i < n; i++) {
        /* params 30..33 and 44, 45 have shapes of their own */
        int o = i >= 30 && i < 34 ? i - 30 : i >= 44 ? i - 40 : -1;
        shape[i][0] = o < 0 ? 48 : own[o][0];
        shape[i][1] = o < 0 ? 128 : own[o][1];
        p[i] = tu_rand(ctx, i < na ? adam_dt : SG_F32, 2, shape[i], -1, 1, &r.p[i]);
        r.n[i] = shape[i][0] * shape[i][1];
        r.m[i] = calloc((size_t)r.n[i], sizeof(double));
        r.v[i] = calloc((size_t)r.n[i], sizeof(double));
        r.master[i] = malloc(sizeof(double) * (size_t)r.n[i]);
        memcpy(r.master[i], r.p[i], sizeof(double) * (size_t)r.n[i]);
    }
    many w = {.na = na};
    sg_adamw_opts ao = adam.a;
    bool ok = TU_EXPECT(sg_adamw_create(ctx, na, p, &ao, &w.adam) == SG_OK) &&
              TU_EXPECT(sg_sgd_create(ctx, n - na, p + na, &so, &w.sgd) == SG_OK);
    sg_fn *fn = NULL;
    ok = ok && TU_EXPECT(sg_compile(ctx, many_step, &w, n, 1,
                                    &(sg_compile_opts){.mode = (sg_mode)mode}, &fn) == SG_OK);
    double lr = adam.a.lr;
    for (int t = 1; ok && t <= NSTEPS; t++) {
        if (t == 3) {
            lr *= 0.5;
            ok = TU_EXPECT(sg_fill_(sg_optim_lr(w.adam), lr) == SG_OK);
            lr = tu_round(SG_F32, lr);
        }
        sg_mark_step_begin(ctx);
        sg_tensor *g[MAXP], *out = NULL;
        double *gv[MAXP];
        for (int i = 0; i < n; i++)
            g[i] = tu_rand(ctx, i < na ? adam_dt : SG_F32, 2, shape[i], -1, 1, &gv[i]);
        ok = ok && TU_EXPECT(sg_call(fn, g, n, &out, 1) == SG_OK);
        for (int i = 0; i < n; i++) {
            sg_dtype dt = i < na ? adam_dt : SG_F32;
            if (i < na)
                ref_adamw(&r, i, gv[i], lr, t, &adam.a, dt);
            else
                ref_sgd(&r, i, gv[i], so.lr, t, &so, dt);
            double *got = ok ? tu_read(p[i]) : NULL;
            double rt = dt == SG_F32 ? 1e-5 : 1e-2, at = dt == SG_F32 ? 2e-6 : 1e-2;
            char nm[64];
            snprintf(nm, sizeof nm, "param %d (%s) after step %d", i, i < na ? "adamw" : "sgd", t);
            ok = ok && TU_EXPECT(got) && tu_close(nm, got, r.p[i], r.n[i], rt, at);
            free(got), free(gv[i]);
            sg_release(g[i]);
        }
    }
    if (!ok) fprintf(stderr, "%s\n%s\n", sg_last_error(ctx), fn ? sg_fn_explain(fn) : "");
    tu_case(ok,
            "MANY(params=%d,of_one_shape=40,adamw=%d of %s,sgd=%d of f32,steps=%d,mode=%s) "
            "seed=%llu",
            n, na, sg_dtype_name(adam_dt), n - na, NSTEPS, sg_mode_name((sg_mode)mode),
            (unsigned long long)seed);
    sg_clear_error(ctx);
    sg_fn_destroy(fn);
    sg_optim_destroy(w.adam), sg_optim_destroy(w.sgd);
    for (int i = 0; i < n; i++) sg_release(p[i]);
    ref_free(&r);
}

/* ------------------------------------------------------------ errors */

static void test_errors(void) {
    int64_t sh[1] = {4};
    sg_tensor *p = sg_zeros(ctx, SG_F32, 1, sh), *pi = sg_zeros(ctx, SG_I32, 1, sh);
    sg_tensor *g = sg_zeros(ctx, SG_F32, 1, (int64_t[]){5});
    sg_optim *o = NULL;
    sg_tensor *keep = p;
    bool ok = TU_EXPECT(sg_adamw_create(ctx, 1, &pi, NULL, &o) == SG_ERR_DTYPE) &&
              TU_EXPECT(strstr(sg_last_error(ctx), "sg_adamw_create") != NULL) &&
              TU_EXPECT(sg_sgd_create(ctx, 1, &p, NULL, &o) == SG_ERR_INVALID_ARG) &&
              TU_EXPECT(sg_sgd_create(ctx, 1, &p, &(sg_sgd_opts){.lr = 0.1, .nesterov = true},
                                      &o) == SG_ERR_INVALID_ARG) &&
              TU_EXPECT(sg_adamw_create(ctx, 1, &p, NULL, &o) == SG_OK) &&
              TU_EXPECT(sg_optim_step(o, &g) == SG_ERR_SHAPE) &&
              TU_EXPECT(strstr(sg_last_error(ctx), "grad 0") != NULL) &&
              TU_EXPECT(sg_clip_grad_norm_(1, &p, -1, NULL) == SG_ERR_INVALID_ARG) &&
              TU_EXPECT(sg_clip_grad_norm_coef(1, &p, 1, NULL, NULL) == SG_ERR_NULL) &&
              TU_EXPECT(sg_clip_grad_norm_coef(1, &p, -1, &keep, NULL) == SG_ERR_INVALID_ARG) &&
              TU_EXPECT(keep == p) && /* out-parameters are set on success only */
              TU_EXPECT(sg_optim_step_scaled(o, &p, p) == SG_ERR_SHAPE) &&
              TU_EXPECT(strstr(sg_last_error(ctx), "sg_optim_step_scaled") != NULL);
    tu_case(ok, "OPTIM_ERRORS(int param, sgd without lr, nesterov without momentum, grad shape, "
                "negative max_norm (coef left as it was), no coef out, scale not 0-d)");
    sg_clear_error(ctx);
    /* A grad of the right shape and a wrong dtype; a param listed twice (the
     * same handle, or another handle of the same elements). */
    sg_tensor *gi = sg_zeros(ctx, SG_I32, 1, sh), *alias = sg_reshape(p, 1, sh);
    sg_tensor *twice[2] = {p, p}, *aliased[2] = {p, alias};
    sg_optim *dup = NULL;
    ok = TU_EXPECT(sg_optim_step(o, &gi) == SG_ERR_DTYPE) &&
         TU_EXPECT(strstr(sg_last_error(ctx), "dtype") != NULL) &&
         TU_EXPECT(sg_adamw_create(ctx, 2, twice, NULL, &dup) == SG_ERR_INVALID_ARG) &&
         TU_EXPECT(strstr(sg_last_error(ctx), "params 0 and 1 are the same tensor") != NULL) &&
         TU_EXPECT(sg_sgd_create(ctx, 2, aliased, &(sg_sgd_opts){.lr = 0.1}, &dup) ==
                   SG_ERR_INVALID_ARG) &&
         TU_EXPECT(dup == NULL);
    tu_case(ok, "OPTIM_ERRORS(int grad of the param's shape: dtype; a param listed twice)");
    sg_clear_error(ctx);
    sg_release(gi), sg_release(alias);
    /* A NULL element of an array: named, with the context's status set. */
    sg_tensor *two[2] = {p, NULL};
    sg_optim *o2 = NULL;
    const char *want[3] = {"sg_adamw_create: params[1] is NULL", "sg_optim_step: grads[0] is NULL",
                           "sg_clip_grad_norm_: grads[1] is NULL"};
    for (int k = 0; k < 3; k++) {
        sg_tensor *one[1] = {NULL};
        sg_status st = k == 0   ? sg_adamw_create(ctx, 2, two, NULL, &o2)
                       : k == 1 ? sg_optim_step(o, one)
                                : sg_clip_grad_norm_(2, two, 1.0, NULL);
        bool okk = TU_EXPECT(st == SG_ERR_NULL) && TU_EXPECT(sg_ctx_status(ctx) == SG_ERR_NULL) &&
                   TU_EXPECT(strstr(sg_last_error(ctx), want[k]) != NULL) && TU_EXPECT(o2 == NULL);
        tu_case(okk, "OPTIM_NULL_ELEMENT(%s) -> SG_ERR_NULL, \"%s\"", want[k], sg_last_error(ctx));
        sg_clear_error(ctx);
    }
    sg_optim_destroy(o);
    sg_optim_destroy(NULL);
    sg_release(p), sg_release(pi), sg_release(g);
}

int main(void) {
    ctx = tu_ctx((sg_ctx_opts){0}); /* SG_TEST_BACKEND: cpu unless the gpu suite says cuda */
    const int modes[] = {-1, SG_MODE_EAGER, SG_MODE_DEFAULT, SG_MODE_REDUCE_OVERHEAD};
    const setup adam = {.kind = "adamw", .dt = SG_F32, .a = {.lr = 1e-2, .weight_decay = 0.05}};
    const setup adam2 = {
        .kind = "adamw", .dt = SG_F32, .a = {.lr = 3e-2, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6}};
    const setup adam_bf = {
        .kind = "adamw", .dt = SG_BF16, .a = {.lr = 1e-2, .master_weights = true}};
    const setup adam_bf_nomaster = {.kind = "adamw", .dt = SG_BF16, .a = {.lr = 1e-2}};
    const setup sgd_m = {.kind = "sgd",
                         .dt = SG_F32,
                         .s = {.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .weight_decay = 0.01}};
    const setup sgd_n = {
        .kind = "sgd",
        .dt = SG_F32,
        .s = {.lr = 0.05, .momentum = 0.8, .nesterov = true, .weight_decay = 0.02}};
    const setup sgd_plain = {.kind = "sgd", .dt = SG_F32, .s = {.lr = 0.2}};
    for (int k = 0; k < 4; k++) {
        run(&adam, modes[k], 1);
        run(&adam2, modes[k], 2);
        run(&adam_bf, modes[k], 3);
        run(&adam_bf_nomaster, modes[k], 4);
        run(&sgd_m, modes[k], 5);
        run(&sgd_n, modes[k], 6);
        run(&sgd_plain, modes[k], 7);
    }
    for (int k = 0; k < 4; k += 3) {
        test_clip(SG_F32, 1.0, modes[k], 8);
        test_clip(SG_F32, 100.0, modes[k], 9);
        test_clip(SG_BF16, 2.0, modes[k], 10);
        test_scaled(&adam_bf, 2.0, modes[k], 11);
        test_scaled(&adam_bf_nomaster, 1.0, modes[k], 12);
        test_scaled(&adam, 100.0, modes[k], 13);
        test_scaled(&sgd_m, 1.5, modes[k], 14);
    }
    test_many(SG_F32, SG_MODE_REDUCE_OVERHEAD, 15);
    test_many(SG_BF16, SG_MODE_REDUCE_OVERHEAD, 16);
    test_many(SG_BF16, SG_MODE_DEFAULT, 17);
    test_errors();
    sg_ctx_destroy(ctx);
    return tu_finish();
}
