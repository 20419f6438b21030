/* SPDX-License-Identifier: MIT */
/*
 * test_fusion_patterns.c -- every fusion pattern, compiled and replayed on
 * random inputs, against the same step run eagerly (one kernel per op), and
 * the number of kernels it fused into. Generated C is compiled with
 * SG_CFLAGS="-Wall -Wextra -Werror", so a warning in generated code fails the case.
 * Each case prints its name, dtype, shapes and the kernel count, e.g.
 *   ok   SOFTMAX(type=f32,x=[7,33]) kernels=1 (max 1, 1 IR ops)
 */
#define _POSIX_C_SOURCE 200809L
#include "graphs/graphs.h"
#include "testutil.h"

#include <math.h>
#include <string.h>

static sg_ctx *ctx;

typedef struct pattern {
    const char *name;
    sg_step_fn step;
    void *user;
    int nin, nout;
    sg_dtype dt;
    int ndim[10];
    int64_t shape[10][3];
    int max_kernels;
} pattern;

static double rtol_of(sg_dtype dt) { return dt == SG_F32 ? 1e-5 : 1e-2; }
static double atol_of(sg_dtype dt) { return dt == SG_F32 ? 1e-6 : 1e-2; }

/* The kernel count of a fn's first capture, read back from sg_fn_explain. */
static int explained_kernels(sg_fn *fn, bool *fused) {
    const char *s = strstr(sg_fn_explain(fn), "kernels: ");
    if (!s) return -1;
    *fused = strstr(s, "(fused from") != NULL;
    return atoi(s + 9);
}

static bool outputs_match(sg_tensor **oe, sg_tensor **oc, int nout) {
    bool ok = true;
    for (int i = 0; ok && i < nout; i++) {
        sg_dtype dt = sg_tensor_dtype(oe[i]);
        int64_t n = sg_tensor_numel(oe[i]);
        double *a = tu_read(oe[i]), *b = tu_read(oc[i]);
        ok = TU_EXPECT(a && b && n == sg_tensor_numel(oc[i])) &&
             tu_close("fused vs eager", b, a, n, rtol_of(dt), atol_of(dt));
        free(a), free(b);
    }
    return ok;
}

/* Run p eagerly and compiled in `mode` over 3 steps of fresh random inputs;
 * the compiled fn's kernel count goes to *kernels, its IR op count to *ops.
 * In reduce-overhead mode a 4th step passes transposed views (new strides:
 * a second capture, whose loads are strided). */
/*
 * On a GPU backend a REDUCE or ROW anchor that its row kernels do not
 * compute (max, softmax over dim 0: a library kernel on CUDA, a serial
 * kernel on Level Zero) reads its input from memory, so a prologue before
 * it is a kernel of its own: the count of such groups of the last compiled
 * fn, which check() allows on top of the pattern's bound.
 */
static int lib_anchors;

static int count_lib_anchors(const sg_fn *fn) {
    int n = 0;
    if (tu_backend() == SG_BACKEND_CPU || !fn->ngraphs) return 0;
    const sg__fused *f = &fn->graphs[0]->fused;
    for (int k = 0; k < f->ngroups; k++)
        n += (f->groups[k].kind == SG__G_REDUCE || f->groups[k].kind == SG__G_ROW) &&
             f->groups[k].anchor >= 0 && !f->groups[k].rows_inline;
    return n;
}

static bool run_pattern(const pattern *p, sg_mode mode, int *kernels, int *ops) {
    sg_fn *eager = NULL, *comp = NULL;
    bool ok = TU_EXPECT(sg_compile(ctx, p->step, p->user, p->nin, p->nout,
                                   &(sg_compile_opts){.mode = SG_MODE_EAGER}, &eager) == SG_OK) &&
              TU_EXPECT(sg_compile(ctx, p->step, p->user, p->nin, p->nout,
                                   &(sg_compile_opts){.mode = mode}, &comp) == SG_OK);
    int calls = mode == SG_MODE_REDUCE_OVERHEAD ? 4 : 3;
    for (int call = 0; ok && call < calls; call++) {
        sg_mark_step_begin(ctx);
        sg_tensor *in[10] = {NULL}, *oe[4] = {NULL}, *oc[4] = {NULL};
        tu_layout lay = call == 3 ? TU_PERMUTED : TU_CONTIG;
        for (int i = 0; i < p->nin; i++)
            in[i] = tu_rand_layout(ctx, p->dt, p->ndim[i], p->shape[i], -2, 2, lay, NULL);
        ok = TU_EXPECT(sg_call(eager, in, p->nin, oe, p->nout) == SG_OK) &&
             TU_EXPECT(sg_call(comp, in, p->nin, oc, p->nout) == SG_OK) &&
             outputs_match(oe, oc, p->nout);
        for (int i = 0; i < p->nin; i++) sg_release(in[i]);
    }
    bool fused = false;
    *kernels = ok ? explained_kernels(comp, &fused) : -1;
    *ops = ok && comp->ngraphs ? comp->graphs[0]->ir.nnodes : -1;
    lib_anchors = ok ? count_lib_anchors(comp) : 0;
    ok = ok && TU_EXPECT(fused) && TU_EXPECT(*kernels == comp->graphs[0]->fused.ngroups);
    for (int gi = 0; ok && gi < comp->ngraphs; gi++) ok = TU_EXPECT(comp->graphs[gi]->compiled);
    if (!ok) fprintf(stderr, "%s\n%s\n", sg_last_error(ctx), comp ? sg_fn_explain(comp) : "");
    sg_clear_error(ctx);
    sg_fn_destroy(eager), sg_fn_destroy(comp);
    return ok;
}

static const char *shapes_str(const pattern *p, char *buf, size_t size) {
    size_t k = 0;
    buf[0] = '\0';
    for (int i = 0; i < p->nin && i < 3 && k < size; i++) {
        char sh[64];
        k += (size_t)snprintf(buf + k, size - k, "%s%s", i ? "," : "",
                              tu_shape(p->ndim[i], p->shape[i], sh, sizeof sh));
    }
    if (p->nin > 3 && k < size) snprintf(buf + k, size - k, ",...(%d inputs)", p->nin);
    return buf;
}

/* Fused in the graph modes and launched kernel by kernel; then with fusion
 * disabled, one kernel per IR op. */
static void check(const pattern *p) {
    if (!tu_sampled()) return;
    char sh[256];
    shapes_str(p, sh, sizeof sh);
    int k1 = -1, k2 = -1, ops = -1, ops2 = -1;
    bool ok = run_pattern(p, SG_MODE_REDUCE_OVERHEAD, &k1, &ops) &&
              run_pattern(p, SG_MODE_DEFAULT, &k2, &ops2);
    ok = ok && TU_EXPECT(k1 == k2) && TU_EXPECT(k1 >= 1 && k1 <= p->max_kernels + lib_anchors);
    tu_case(ok, "%s(type=%s,in=%s) kernels=%d (max %d, %d IR ops)", p->name, sg_dtype_name(p->dt),
            sh, k1, p->max_kernels, ops);
    setenv("SG_DISABLE_FUSION", "1", 1);
    int ku = -1;
    ok = run_pattern(p, SG_MODE_REDUCE_OVERHEAD, &ku, &ops) && TU_EXPECT(ku == ops);
    unsetenv("SG_DISABLE_FUSION");
    tu_case(ok, "%s(type=%s,in=%s,SG_DISABLE_FUSION=1) kernels=%d (one per IR op: %d)", p->name,
            sg_dtype_name(p->dt), sh, ku, ops);
}

/* ------------------------------------------------------------ the steps */

#define STEP(name)                                                                                 \
    static sg_status name(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user)
#define DONE(t) (void)user, (out[0] = (t)) ? SG_OK : sg_ctx_status(c)

/* W1: 6 x (y = tanh(sin(y) * 1.01 + 0.1)), 24 ops. */
STEP(chain24) {
    sg_tensor *y = in[0];
    for (int i = 0; i < 6; i++) y = sg_tanh(sg_add_scalar(sg_mul_scalar(sg_sin(y), 1.01), 0.1));
    return DONE(y);
}

static const int last_dim[1] = {-1};

STEP(softmax) { return DONE(sg_softmax(in[0], -1)); }
STEP(softmax_pro) { return DONE(sg_softmax(sg_add(sg_mul_scalar(in[0], 0.125), in[1]), -1)); }
STEP(softmax_epi) { return DONE(sg_mul(sg_softmax(in[0], -1), in[1])); }
STEP(log_softmax_pro) { return DONE(sg_log_softmax(sg_tanh(in[0]), -1)); }
STEP(layer_norm) { return DONE(sg_layer_norm(in[0], in[1], in[2], 1e-5)); }
STEP(layer_norm_pro_epi) {
    sg_tensor *h = sg_add(in[0], in[3]); /* residual add, then norm, then gelu */
    return DONE(sg_gelu(sg_layer_norm(h, in[1], in[2], 1e-5)));
}
STEP(rms_norm_pro) { return DONE(sg_rms_norm(sg_mul(in[0], in[0]), in[1], 1e-6)); }
STEP(sum_sq) { return DONE(sg_sum(sg_mul(in[0], in[0]), 1, last_dim, false)); }
STEP(sum_all_sq) { return DONE(sg_sum(sg_mul(in[0], in[0]), 0, NULL, false)); }
STEP(rms) { /* prologue, reduction and epilogue */
    return DONE(sg_rsqrt(sg_add_scalar(sg_mean(sg_mul(in[0], in[0]), 1, last_dim, true), 1e-6)));
}
STEP(max_epi) { return DONE(sg_exp(sg_sub(sg_max(sg_abs(in[0]), 1, last_dim, true), in[1]))); }
static const int first_dim[1] = {0};
STEP(sum0_pro) { return DONE(sg_sum(sg_mul(in[0], in[0]), 1, first_dim, false)); }
STEP(sum_view_pro) {
    return DONE(sg_sum(sg_mul(sg_transpose(in[0], 0, 1), in[1]), 1, last_dim, true));
}
STEP(pro_also_out) { /* the prologue's value is an output too */
    sg_tensor *t = sg_sigmoid(in[0]);
    out[1] = t;
    return DONE(sg_mean(t, 1, last_dim, true));
}
STEP(two_reductions) { /* the second reduction reads the first one's prologue value */
    sg_tensor *t = sg_exp(in[0]);
    return DONE(sg_add(sg_sum(t, 1, last_dim, true), sg_max(t, 1, last_dim, true)));
}
STEP(softmax0_pro) { return DONE(sg_softmax(sg_mul_scalar(in[0], 2.0), 0)); }

/* softmax, log_softmax and layer_norm written out of primitives: one row
 * kernel (fusion/canon.c), unless a value between x and the result is read
 * elsewhere, or the reductions run over different dims. */
static sg_tensor *written_softmax(sg_tensor *x, int dim, bool two_exps, sg_tensor **exp_out) {
    sg_tensor *t = sg_sub(x, sg_max(x, 1, &dim, true));
    sg_tensor *e = sg_exp(t);
    if (exp_out) *exp_out = e;
    return sg_div(two_exps ? sg_exp(t) : e, sg_sum(e, 1, &dim, true));
}
STEP(softmax_written) { return DONE(written_softmax(in[0], -1, false, NULL)); }
STEP(softmax_written0) { return DONE(written_softmax(sg_mul_scalar(in[0], 2.0), 0, false, NULL)); }
STEP(softmax_two_exps) { return DONE(written_softmax(in[0], 1, true, NULL)); }
STEP(softmax_exp_out) { return DONE(written_softmax(in[0], -1, false, &out[1])); }
STEP(log_softmax_written) {
    sg_tensor *t = sg_sub(in[0], sg_max(in[0], 1, last_dim, true));
    return DONE(sg_sub(t, sg_log(sg_sum(sg_exp(t), 1, last_dim, true))));
}
STEP(layer_norm_written) { /* (x - mean) * rsqrt(mean((x - mean)^2) + eps) * w + b */
    sg_tensor *xc = sg_sub(in[0], sg_mean(in[0], 1, last_dim, true));
    sg_tensor *v = sg_mean(sg_mul(xc, xc), 1, last_dim, true);
    return DONE(sg_add(sg_mul(sg_mul(xc, sg_rsqrt(sg_add_scalar(v, 1e-5))), in[1]), in[2]));
}
STEP(layer_norm_written_var) { /* w * ((x - mean) / sqrt(var(x) + eps)) */
    sg_tensor *xc = sg_sub(in[0], sg_mean(in[0], 1, last_dim, true));
    sg_tensor *v = sg_var(in[0], 1, last_dim, 0, true);
    return DONE(sg_mul(in[1], sg_div(xc, sg_sqrt(sg_add_scalar(v, 1e-5)))));
}
STEP(softmax_mixed_dims) { /* max over the rows, the sum down the columns: no softmax */
    sg_tensor *e = sg_exp(sg_sub(in[0], sg_max(in[0], 1, last_dim, true)));
    return DONE(sg_div(e, sg_sum(e, 1, first_dim, true)));
}
STEP(linear_gelu) { return DONE(sg_gelu(sg_linear(in[0], in[1], in[2]))); }
STEP(linear_bias_gelu) { return DONE(sg_gelu(sg_add(sg_linear(in[0], in[1], NULL), in[2]))); }
STEP(matmul_res) { return DONE(sg_add(sg_silu(sg_matmul(in[0], in[1])), in[2])); }

STEP(view_transpose) { return DONE(sg_sin(sg_add(sg_transpose(in[0], 0, 1), in[1]))); }
STEP(view_slice) { return DONE(sg_mul(sg_slice(in[0], -1, 1, INT64_MAX, 2), in[1])); }
STEP(view_expand) {
    int64_t shape[2] = {sg_tensor_size(in[1], 0), sg_tensor_size(in[0], 0)};
    return DONE(sg_tanh(sg_sub(sg_expand(in[0], 2, shape), in[1])));
}
STEP(view_reshape) {
    int64_t shape[2] = {sg_tensor_size(in[1], 0), sg_tensor_size(in[1], 1)};
    return DONE(sg_cos(sg_add(sg_reshape(in[0], 2, shape), in[1])));
}
/* A reshape of a value made in the step changes the loop shape: its
 * producer stores it and the next loop reads the view (no copy kernel). */
STEP(view_reshape_made) {
    int64_t shape[2] = {sg_tensor_size(in[1], 0), sg_tensor_size(in[1], 1)};
    return DONE(sg_add(sg_reshape(sg_cos(in[0]), 2, shape), in[1]));
}
STEP(view_mix) { /* views on both sides of a value kept in registers */
    sg_tensor *t = sg_sigmoid(in[0]);
    sg_tensor *u = sg_unsqueeze(sg_slice(sg_transpose(t, 0, 1), 0, 0, INT64_MAX, 1), 0);
    return DONE(sg_mul(sg_squeeze(u, 0), sg_transpose(in[1], 0, 1)));
}

/* AdamW over 10 parameters: each update is its own loop of one kernel. */
#define NPARAM 10
typedef struct adamw {
    sg_tensor *p[NPARAM], *m[NPARAM], *v[NPARAM];
} adamw;

static sg_status adamw_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    adamw *s = user;
    const double lr = 1e-2, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.01;
    sg_status st = SG_OK;
    for (int i = 0; i < NPARAM && st == SG_OK; i++) {
        sg_tensor *g = in[i];
        sg_tensor *m = sg_add(sg_mul_scalar(s->m[i], b1), sg_mul_scalar(g, 1 - b1));
        sg_tensor *v = sg_add(sg_mul_scalar(s->v[i], b2), sg_mul_scalar(sg_mul(g, g), 1 - b2));
        sg_tensor *upd = sg_div(sg_mul_scalar(m, 1 / (1 - b1)),
                                sg_add_scalar(sg_sqrt(sg_mul_scalar(v, 1 / (1 - b2))), eps));
        sg_tensor *p = sg_sub(sg_mul_scalar(s->p[i], 1 - lr * wd), sg_mul_scalar(upd, lr));
        st = sg_copy_(s->m[i], m);
        if (st == SG_OK) st = sg_copy_(s->v[i], v);
        if (st == SG_OK) st = sg_copy_(s->p[i], p);
    }
    out[0] = s->p[0];
    return st != SG_OK ? st : sg_ctx_status(c);
}

static void adamw_init(adamw *s, int64_t (*shape)[3]) {
    for (int i = 0; i < NPARAM; i++) {
        s->p[i] = tu_rand(ctx, SG_F32, 2, shape[i], -1, 1, NULL);
        s->m[i] = sg_zeros(ctx, SG_F32, 2, shape[i]);
        s->v[i] = sg_zeros(ctx, SG_F32, 2, shape[i]);
    }
}

static void adamw_free(adamw *s) {
    for (int i = 0; i < NPARAM; i++) sg_release(s->p[i]), sg_release(s->m[i]), sg_release(s->v[i]);
}

/* Both copies start equal and take the same 3 steps; every state tensor
 * must agree afterwards. */
static void test_adamw(void) {
    int64_t shape[NPARAM][3];
    for (int i = 0; i < NPARAM; i++) shape[i][0] = i + 1, shape[i][1] = 17 + 3 * i;
    adamw se, sc;
    tu_seed(11);
    adamw_init(&se, shape);
    tu_seed(11);
    adamw_init(&sc, shape);
    sg_fn *eager, *comp;
    bool ok =
        TU_EXPECT(sg_compile(ctx, adamw_step, &se, NPARAM, 1,
                             &(sg_compile_opts){.mode = SG_MODE_EAGER}, &eager) == SG_OK) &&
        TU_EXPECT(sg_compile(ctx, adamw_step, &sc, NPARAM, 1,
                             &(sg_compile_opts){.mode = SG_MODE_REDUCE_OVERHEAD}, &comp) == SG_OK);
    for (int step = 0; ok && step < 3; step++) {
        sg_mark_step_begin(ctx);
        sg_tensor *g[NPARAM], *oe, *oc;
        for (int i = 0; i < NPARAM; i++) g[i] = tu_rand(ctx, SG_F32, 2, shape[i], -1, 1, NULL);
        ok = TU_EXPECT(sg_call(eager, g, NPARAM, &oe, 1) == SG_OK) &&
             TU_EXPECT(sg_call(comp, g, NPARAM, &oc, 1) == SG_OK);
        for (int i = 0; i < NPARAM; i++) sg_release(g[i]);
    }
    for (int i = 0; ok && i < NPARAM; i++)
        ok = outputs_match(&se.p[i], &sc.p[i], 1) && outputs_match(&se.m[i], &sc.m[i], 1) &&
             outputs_match(&se.v[i], &sc.v[i], 1);
    bool fused = false;
    int k = ok ? explained_kernels(comp, &fused) : -1;
    int ops = comp->ngraphs ? comp->graphs[0]->ir.nnodes : -1;
    bool multi = ok && comp->graphs[0]->fused.ngroups == 1 &&
                 comp->graphs[0]->fused.groups[0].kind == SG__G_MULTI &&
                 comp->graphs[0]->fused.groups[0].nmembers == NPARAM;
    ok = ok && TU_EXPECT(fused) && TU_EXPECT(k == 1) && TU_EXPECT(multi);
    if (!ok) fprintf(stderr, "%s\n%s\n", sg_last_error(ctx), sg_fn_explain(comp));
    tu_case(ok,
            "ADAMW(type=f32,params=%d,steps=3) kernels=%d (max 1, MULTI of %d loops, %d IR ops)",
            NPARAM, k, NPARAM, ops);
    sg_fn_destroy(eager), sg_fn_destroy(comp);
    adamw_free(&se), adamw_free(&sc);
}

/* ------------------------------------------------------------ main */

#define P1(nm, fn, dtype, maxk, nd0, ...)                                                          \
    check(&(pattern){.name = nm,                                                                   \
                     .step = fn,                                                                   \
                     .nin = 1,                                                                     \
                     .nout = 1,                                                                    \
                     .dt = dtype,                                                                  \
                     .max_kernels = maxk,                                                          \
                     .ndim = {nd0},                                                                \
                     .shape = {__VA_ARGS__}})

int main(void) {
    /* Warnings in generated code are errors (see codegen/codegen.h). */
    setenv("SG_CFLAGS", "-Wall -Wextra -Werror", 1);
    ctx = tu_ctx((sg_ctx_opts){0});
    tu_seed(5);
    sg_dtype dts[3] = {SG_F32, SG_F16, SG_BF16};
    for (int d = 0; d < 3; d++) {
        sg_dtype dt = dts[d];
        P1("CHAIN24", chain24, dt, 1, 2, {3, 129});
        P1("SOFTMAX", softmax, dt, 1, 2, {7, 33});
        check(&(pattern){
            "SOFTMAX_PROLOGUE", softmax_pro, NULL, 2, 1, dt, {2, 2}, {{5, 40}, {5, 40}}, 1});
        check(
            &(pattern){"SOFTMAX_EPILOGUE", softmax_epi, NULL, 2, 1, dt, {2, 1}, {{6, 9}, {9}}, 1});
        P1("LOG_SOFTMAX_PROLOGUE", log_softmax_pro, dt, 1, 2, {4, 65});
        P1("SOFTMAX_WRITTEN_OUT", softmax_written, dt, 1, 2, {6, 77});
        P1("SOFTMAX_WRITTEN_OUT_DIM0", softmax_written0, dt, 1, 2, {19, 5});
        P1("SOFTMAX_WRITTEN_OUT_TWO_EXPS", softmax_two_exps, dt, 1, 3, {2, 9, 40});
        P1("LOG_SOFTMAX_WRITTEN_OUT", log_softmax_written, dt, 1, 2, {3, 300});
        P1("SOFTMAX_MIXED_DIMS(not one)", softmax_mixed_dims, dt, 4, 2, {5, 12});
        /* (in bf16 the written-out ops' own roundings, the mean rounded to 8 bits
         * before the subtraction, put eager's rows up to ~8 ulps from the row
         * op's: test_fusion_canon checks bf16 against f64) */
        if (dt != SG_BF16)
            check(&(pattern){"LAYER_NORM_WRITTEN_OUT", layer_norm_written, NULL, 3, 1, dt,
                             {2, 1, 1}, {{7, 96}, {96}, {96}}, 1});
        check(&(pattern){"LAYER_NORM_WRITTEN_OUT_VAR", layer_norm_written_var, NULL, 2, 1, dt,
                         {3, 1}, {{2, 3, 50}, {50}}, 1});
        check(&(pattern){"SOFTMAX_WRITTEN_OUT_EXP_ALSO_OUT(not one)", softmax_exp_out, NULL, 1, 2,
                         dt, {2}, {{4, 33}}, 3});
        check(&(pattern){
            "LAYER_NORM_AFFINE", layer_norm, NULL, 3, 1, dt, {2, 1, 1}, {{8, 48}, {48}, {48}}, 1});
        check(&(pattern){"LAYER_NORM_PROLOGUE_EPILOGUE",
                         layer_norm_pro_epi,
                         NULL,
                         4,
                         1,
                         dt,
                         {2, 1, 1, 2},
                         {{8, 48}, {48}, {48}, {8, 48}},
                         1});
        check(&(pattern){
            "RMS_NORM_PROLOGUE", rms_norm_pro, NULL, 2, 1, dt, {2, 1}, {{3, 20}, {20}}, 1});
        P1("SUM_PROLOGUE(sum(x*x,-1))", sum_sq, dt, 1, 2, {9, 31});
        P1("SUM_PROLOGUE(sum(x*x))", sum_all_sq, dt, 1, 2, {9, 31});
        P1("REDUCE_PROLOGUE_EPILOGUE(rsqrt(mean(x*x)+eps))", rms, dt, 1, 2, {5, 64});
        check(&(pattern){"REDUCE_EPILOGUE(exp(max(|x|)-y))",
                         max_epi,
                         NULL,
                         2,
                         1,
                         dt,
                         {2, 2},
                         {{6, 10}, {6, 1}},
                         1});
        /* An epilogue that broadcasts the reduced value to a larger shape
         * runs as its own loop. */
        check(&(pattern){
            "REDUCE_BROADCAST_EPILOGUE", max_epi, NULL, 2, 1, dt, {2, 2}, {{6, 10}, {6, 3}}, 2});
        P1("SUM_PROLOGUE(sum(x*x,0))", sum0_pro, dt, 1, 2, {7, 13});
        check(&(pattern){"SUM_PROLOGUE_VIEW(sum(x^T*y,-1))",
                         sum_view_pro,
                         NULL,
                         2,
                         1,
                         dt,
                         {2, 2},
                         {{12, 5}, {5, 12}},
                         1});
        check(&(pattern){
            "PROLOGUE_ALSO_OUTPUT(mean(t), t)", pro_also_out, NULL, 1, 2, dt, {2}, {{4, 30}}, 1});
        P1("TWO_REDUCTIONS_ONE_PROLOGUE", two_reductions, dt, 2, 2, {6, 21});
        P1("SOFTMAX_DIM0_PROLOGUE", softmax0_pro, dt, 1, 2, {9, 4});
        check(&(pattern){"LINEAR_BIAS_GELU",
                         linear_gelu,
                         NULL,
                         3,
                         1,
                         dt,
                         {2, 2, 1},
                         {{5, 16}, {12, 16}, {12}},
                         2});
        check(&(pattern){"LINEAR_ADD_BIAS_GELU",
                         linear_bias_gelu,
                         NULL,
                         3,
                         1,
                         dt,
                         {2, 2, 1},
                         {{5, 16}, {12, 16}, {12}},
                         2});
        check(&(pattern){"MATMUL_SILU_RESIDUAL",
                         matmul_res,
                         NULL,
                         3,
                         1,
                         dt,
                         {2, 2, 2},
                         {{4, 8}, {8, 6}, {4, 6}},
                         2});
        check(&(pattern){
            "VIEW_TRANSPOSE", view_transpose, NULL, 2, 1, dt, {2, 2}, {{9, 5}, {5, 9}}, 1});
        check(&(pattern){"VIEW_SLICE", view_slice, NULL, 2, 1, dt, {2, 2}, {{4, 14}, {4, 7}}, 1});
        check(&(pattern){"VIEW_EXPAND", view_expand, NULL, 2, 1, dt, {1, 2}, {{11}, {6, 11}}, 1});
        check(&(pattern){
            "VIEW_RESHAPE", view_reshape, NULL, 2, 1, dt, {3, 2}, {{2, 3, 10}, {6, 10}}, 1});
        check(&(pattern){"VIEW_RESHAPE_OF_MADE",
                         view_reshape_made,
                         NULL,
                         2,
                         1,
                         dt,
                         {3, 2},
                         {{2, 3, 10}, {6, 10}},
                         2});
        check(&(pattern){"VIEW_MIX", view_mix, NULL, 2, 1, dt, {2, 2}, {{3, 8}, {3, 8}}, 2});
    }
    test_adamw();
    sg_ctx_destroy(ctx);
    return tu_finish();
}
