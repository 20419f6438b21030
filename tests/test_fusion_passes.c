/* SPDX-License-Identifier: MIT */
/*
 * test_fusion_passes.c -- the fusion passes one at a time, and the corners
 * of the C dialect: dead-code removal (and what it must keep), common
 * subexpression removal (and what it must not merge), copy forwarding (a
 * clone of an intermediate dropped, also after in-place updates; of an input, a view of another
 * geometry, a value written later or an output kept; a value copied into
 * rows of a buffer written there by its producer, unless the buffer is
 * touched before, the value read after a later write, or the copy
 * converts), views of a removed
 * value, concat of many inputs, inf and NaN scalars in generated source,
 * integer self-comparisons under -Werror, the multi-tensor kernel's
 * barrier, several full reductions as one multi-tensor sum, and explain's
 * text for values kept in registers. Each step runs eagerly and compiled
 * on the same random inputs; the compiled fn must have compiled (no
 * fallback) with SG_CFLAGS="-Wall -Wextra -Werror".
 */
#define _POSIX_C_SOURCE 200809L
#include "graphs/cuda/exec.h"
#include "graphs/graphs.h"
#include "testutil.h"

#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static sg_ctx *ctx;

#define STEP(name)                                                                                 \
    static sg_status name(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user)
#define DONE(t) (void)user, (out[0] = (t)) ? SG_OK : sg_ctx_status(c)

static double rtol_of(sg_dtype dt) {
    return dt == SG_F32 ? 1e-5 : sg__dtype_is_float(dt) ? 1e-2 : 0;
}
static double atol_of(sg_dtype dt) {
    return dt == SG_F32 ? 1e-6 : sg__dtype_is_float(dt) ? 1e-2 : 0;
}

/* Run step eagerly and compiled (REDUCE_OVERHEAD) on the same inputs, twice;
 * outputs must agree and the compiled fn must have compiled its capture.
 * The compiled fn is returned in *keep (destroy it) for inspection. */
static bool versus_eager(sg_step_fn step, void *user, int nin, sg_tensor *const *in, int nout,
                         sg_fn **keep) {
    sg_fn *eager = NULL, *comp = NULL;
    bool ok =
        TU_EXPECT(sg_compile(ctx, step, user, nin, nout, &(sg_compile_opts){.mode = SG_MODE_EAGER},
                             &eager) == SG_OK) &&
        TU_EXPECT(sg_compile(ctx, step, user, nin, nout,
                             &(sg_compile_opts){.mode = SG_MODE_REDUCE_OVERHEAD}, &comp) == SG_OK);
    for (int call = 0; ok && call < 2; call++) {
        sg_mark_step_begin(ctx);
        sg_tensor *oe[4] = {NULL}, *oc[4] = {NULL};
        ok = TU_EXPECT(sg_call(eager, in, nin, oe, nout) == SG_OK) &&
             TU_EXPECT(sg_call(comp, in, nin, oc, nout) == SG_OK);
        for (int i = 0; ok && i < nout; i++) {
            sg_dtype dt = sg_tensor_dtype(oe[i]);
            int64_t n = sg_tensor_numel(oe[i]);
            double *a = tu_read(oe[i]), *b = tu_read(oc[i]);
            ok = TU_EXPECT(a && b) &&
                 tu_close("compiled vs eager", b, a, n, rtol_of(dt), atol_of(dt));
            free(a), free(b);
        }
    }
    ok = ok && TU_EXPECT(comp->ngraphs == 1 && comp->graphs[0]->compiled);
    if (!ok) fprintf(stderr, "%s\n%s\n", sg_last_error(ctx), comp ? sg_fn_explain(comp) : "");
    sg_clear_error(ctx);
    sg_fn_destroy(eager);
    if (keep && ok)
        *keep = comp;
    else
        sg_fn_destroy(comp);
    return ok;
}

/* How many IR nodes of op the capture has, and how many of them fusion removed. */
static int count_op(sg_fn *fn, sg__op op, int *dead) {
    const sg__graph *g = fn->graphs[0];
    int n = 0;
    *dead = 0;
    for (int i = 0; i < g->ir.nnodes; i++)
        if (g->ir.nodes[i].op == op) n++, *dead += g->has_fused && g->fused.dead[i];
    return n;
}

static sg_tensor *rand2(sg_dtype dt, int64_t a, int64_t b) {
    int64_t sh[2] = {a, b};
    return tu_rand(ctx, dt, 2, sh, -2, 2, NULL);
}

/* ------------------------------------------------------------ dce */

STEP(dce_step) {
    sg_tensor *unused = sg_mul_scalar(sg_exp(in[0]), 2.0); /* nothing reads it */
    (void)unused;
    return DONE(sg_sin(in[0]));
}

typedef struct param_box {
    sg_tensor *p;
} param_box;

/* A write into a parameter is kept though no output reads it. */
STEP(dce_param_step) {
    param_box *b = user;
    sg_status s = sg_add_(b->p, sg_mul_scalar(in[0], 0.5));
    if (s != SG_OK) return s;
    return DONE(sg_cos(in[0]));
}

static void test_dce(void) {
    sg_tensor *x = rand2(SG_F32, 5, 12);
    sg_fn *fn = NULL;
    bool ok = versus_eager(dce_step, NULL, 1, &x, 1, &fn);
    int dexp = 0, dmul = 0, dsin = 0;
    ok = ok && TU_EXPECT(count_op(fn, SG__OP_EXP, &dexp) == 1 && dexp == 1) &&
         TU_EXPECT(count_op(fn, SG__OP_MUL_SCALAR, &dmul) == 1 && dmul == 1) &&
         TU_EXPECT(count_op(fn, SG__OP_SIN, &dsin) == 1 && dsin == 0) &&
         TU_EXPECT(fn->graphs[0]->fused.ngroups == 1) &&
         TU_EXPECT(strstr(sg_fn_explain(fn), "removed by fusion") != NULL);
    tu_case(ok, "DCE(sin(x) kept, exp(x)*2 unused: 2 nodes removed, kernels=1, explained)");
    sg_fn_destroy(fn);

    param_box be = {sg_zeros(ctx, SG_F32, 2, (int64_t[]){5, 12})};
    param_box bc = {sg_zeros(ctx, SG_F32, 2, (int64_t[]){5, 12})};
    sg_fn *fe, *fc;
    sg_compile(ctx, dce_param_step, &be, 1, 1, &(sg_compile_opts){.mode = SG_MODE_EAGER}, &fe);
    sg_compile(ctx, dce_param_step, &bc, 1, 1, &(sg_compile_opts){.mode = SG_MODE_REDUCE_OVERHEAD},
               &fc);
    ok = true;
    for (int i = 0; ok && i < 3; i++) {
        sg_tensor *y;
        sg_mark_step_begin(ctx);
        ok = TU_EXPECT(sg_call(fe, &x, 1, &y, 1) == SG_OK) &&
             TU_EXPECT(sg_call(fc, &x, 1, &y, 1) == SG_OK);
    }
    double *pe = tu_read(be.p), *pc = tu_read(bc.p);
    int d = 0;
    ok = ok && TU_EXPECT(tu_close("param", pc, pe, 60, 1e-6, 0)) &&
         TU_EXPECT(count_op(fc, SG__OP_ADD, &d) == 1 && d == 0) &&
         TU_EXPECT(fc->graphs[0]->compiled);
    tu_case(ok, "DCE(a write into a parameter that no output reads is kept, 3 steps)");
    free(pe), free(pc);
    sg_fn_destroy(fe), sg_fn_destroy(fc);
    sg_release(be.p), sg_release(bc.p), sg_release(x);
}

/* ------------------------------------------------------------ cse */

STEP(cse_step) { return DONE(sg_mul(sg_tanh(in[0]), sg_tanh(in[0]))); }
/* x bf16: a widening cast read by a reduction and by the pointwise op after it. */
STEP(cse_widen_step) {
    sg_tensor *a = sg_cast(in[0], SG_F32), *s = sg_sum(sg_mul(a, a), 0, NULL, false);
    return DONE(sg_mul(sg_cast(in[0], SG_F32), s));
}
/* x f32: a narrowing cast twice. */
STEP(cse_narrow_step) { return DONE(sg_add(sg_cast(in[0], SG_BF16), sg_cast(in[0], SG_BF16))); }
STEP(cse_attr_step) { return DONE(sg_add(sg_mul_scalar(in[0], 2.0), sg_mul_scalar(in[0], 3.0))); }
/* Same op over two views of x with different geometry: not one value. */
STEP(cse_views_step) {
    sg_tensor *a = sg_sin(sg_transpose(in[0], 0, 1)), *b = sg_sin(in[0]);
    sg_tensor *s0 = sg_exp(sg_slice(in[0], 1, 0, 4, 1)), *s1 = sg_exp(sg_slice(in[0], 1, 4, 8, 1));
    return DONE(sg_add(sg_sub(a, b), sg_concat(2, (sg_tensor *[]){s0, s1}, 1)));
}
/* The removed duplicate's value is read through a view of another geometry. */
STEP(cse_view_of_removed_step) {
    sg_tensor *a = sg_sin(in[0]), *b = sg_sin(in[0]);
    return DONE(sg_add(a, sg_transpose(b, 0, 1)));
}
/* An input written between two equal expressions: they differ. */
STEP(cse_clobber_step) {
    sg_tensor *a = sg_neg(in[0]);
    sg_status s = sg_add_(in[0], in[1]);
    if (s != SG_OK) return s;
    return DONE(sg_add(a, sg_neg(in[0])));
}

static void test_cse(void) {
    sg_tensor *x = rand2(SG_F32, 8, 8), *y = rand2(SG_F32, 8, 8);
    sg_fn *fn = NULL;
    int d = 0;
    bool ok = versus_eager(cse_step, NULL, 1, &x, 1, &fn);
    ok = ok && TU_EXPECT(count_op(fn, SG__OP_TANH, &d) == 2 && d == 1) &&
         TU_EXPECT(fn->graphs[0]->fused.ngroups == 1);
    tu_case(ok, "CSE(tanh(x) * tanh(x): one tanh removed, kernels=1)");
    sg_fn_destroy(fn), fn = NULL;

    ok = versus_eager(cse_attr_step, NULL, 1, &x, 1, &fn);
    ok = ok && TU_EXPECT(count_op(fn, SG__OP_MUL_SCALAR, &d) == 2 && d == 0);
    tu_case(ok, "CSE(x*2 + x*3: different attributes, both kept)");
    sg_fn_destroy(fn), fn = NULL;

    ok = versus_eager(cse_views_step, NULL, 1, &x, 1, &fn);
    int ds = 0;
    ok = ok && TU_EXPECT(count_op(fn, SG__OP_SIN, &ds) == 2 && ds == 0) &&
         TU_EXPECT(count_op(fn, SG__OP_EXP, &d) == 2 && d == 0);
    tu_case(ok, "CSE(sin(x^T) vs sin(x), exp(x[:, :4]) vs exp(x[:, 4:]): views differ, all kept)");
    sg_fn_destroy(fn), fn = NULL;

    ok = versus_eager(cse_view_of_removed_step, NULL, 1, &x, 1, NULL);
    tu_case(ok, "CSE(sin(x) + sin(x)^T: the duplicate read through a transposed view)");

    sg_tensor *xb = rand2(SG_BF16, 8, 8);
    ok = versus_eager(cse_widen_step, NULL, 1, &xb, 1, &fn);
    ok = ok && TU_EXPECT(count_op(fn, SG__OP_CAST, &d) == 2 && d == 0);
    tu_case(ok, "CSE(f32(x) * sum(f32(x)^2), x bf16: the widening cast recomputed, both kept)");
    sg_fn_destroy(fn), fn = NULL;
    sg_release(xb);
    ok = versus_eager(cse_narrow_step, NULL, 1, &x, 1, &fn);
    ok = ok && TU_EXPECT(count_op(fn, SG__OP_CAST, &d) == 2 && d == 1);
    tu_case(ok, "CSE(bf16(x) + bf16(x), x f32: one narrowing cast removed)");
    sg_fn_destroy(fn), fn = NULL;

    /* Each call adds y into a fresh copy of x. */
    sg_tensor *in[2] = {sg_clone(x), y};
    sg_fn *fe, *fc;
    sg_compile(ctx, cse_clobber_step, NULL, 2, 1, &(sg_compile_opts){.mode = SG_MODE_EAGER}, &fe);
    sg_compile(ctx, cse_clobber_step, NULL, 2, 1,
               &(sg_compile_opts){.mode = SG_MODE_REDUCE_OVERHEAD}, &fc);
    ok = true;
    for (int call = 0; ok && call < 3; call++) {
        sg_tensor *oe, *oc;
        sg_mark_step_begin(ctx);
        sg_release(in[0]), in[0] = sg_clone(x);
        ok = TU_EXPECT(sg_call(fe, in, 2, &oe, 1) == SG_OK);
        sg_release(in[0]), in[0] = sg_clone(x);
        ok = ok && TU_EXPECT(sg_call(fc, in, 2, &oc, 1) == SG_OK);
        double *a = ok ? tu_read(oe) : NULL, *b = ok ? tu_read(oc) : NULL;
        ok = ok && TU_EXPECT(tu_close("clobber", b, a, 64, 1e-6, 0));
        free(a), free(b);
    }
    ok = ok && TU_EXPECT(count_op(fc, SG__OP_NEG, &d) == 2 && d == 0) &&
         TU_EXPECT(fc->graphs[0]->compiled);
    tu_case(ok, "CSE(neg(x); x += y; neg(x): input written in between, both kept)");
    sg_fn_destroy(fe), sg_fn_destroy(fc);
    sg_release(in[0]), sg_release(x), sg_release(y);
}

/* ------------------------------------------------------------ copy forwarding */

/* A clone of an intermediate, read twice: the copy is dropped. */
STEP(copy_step) {
    sg_tensor *k = sg_clone(sg_exp(in[0]));
    return DONE(sg_mul(k, sg_add(k, in[0])));
}
/* The source is written after the clone: the clone keeps the old value. */
STEP(copy_clobber_step) {
    sg_tensor *a = sg_exp(in[0]), *k = sg_clone(a);
    sg_status s = sg_add_(a, in[0]);
    if (s != SG_OK) return s;
    return DONE(sg_sub(k, a));
}
/* The source written twice, both before the clone: the copy is dropped. */
STEP(copy_settled_step) {
    sg_tensor *a = sg_exp(in[0]);
    sg_status s = sg_add_(a, in[0]);
    if (s != SG_OK) return s;
    sg_tensor *k = sg_clone(a);
    return DONE(sg_mul(k, sg_sin(k)));
}
/* A clone of an input, and a clone of a transposed view: both kept. */
STEP(copy_kept_step) {
    sg_tensor *k = sg_clone(in[0]), *t = sg_clone(sg_transpose(sg_sin(in[0]), 0, 1));
    return DONE(sg_add(k, t));
}
/* A clone of rows 3..6 of an intermediate (a view at an offset, as a
 * norm's weight gradient in its packed result): dropped. */
STEP(copy_offset_step) {
    sg_tensor *k = sg_clone(sg_narrow(sg_exp(in[0]), 0, 3, 4));
    return DONE(sg_mul(k, sg_add(k, sg_narrow(in[0], 0, 0, 4))));
}
/* The same, the intermediate written after the clone: kept. */
STEP(copy_offset_clobber_step) {
    sg_tensor *a = sg_exp(in[0]), *k = sg_clone(sg_narrow(a, 0, 3, 4));
    sg_status s = sg_add_(a, in[0]);
    if (s != SG_OK) return s;
    return DONE(sg_sub(k, sg_narrow(a, 0, 3, 4)));
}
/* The clone is the step's output: kept. */
STEP(copy_output_step) { return DONE(sg_clone(sg_cos(in[0]))); }

static void test_copy_forwarding(void) {
    sg_tensor *x = rand2(SG_F32, 8, 8);
    sg_fn *fn = NULL;
    int d = 0;
    bool ok = versus_eager(copy_step, NULL, 1, &x, 1, &fn);
    ok = ok && TU_EXPECT(count_op(fn, SG__OP_COPY, &d) == 1 && d == 1);
    tu_case(ok, "COPY(clone(exp(x)) read twice: the copy removed)");
    sg_fn_destroy(fn), fn = NULL;

    ok = versus_eager(copy_clobber_step, NULL, 1, &x, 1, &fn);
    ok = ok && TU_EXPECT(count_op(fn, SG__OP_COPY, &d) == 1 && d == 0);
    tu_case(ok, "COPY(clone(a); a += x: the source written after the copy, kept)");
    sg_fn_destroy(fn), fn = NULL;

    ok = versus_eager(copy_settled_step, NULL, 1, &x, 1, &fn);
    ok = ok && TU_EXPECT(count_op(fn, SG__OP_COPY, &d) == 1 && d == 1);
    tu_case(ok, "COPY(a = exp(x); a += x; clone(a): every write before the copy, removed)");
    sg_fn_destroy(fn), fn = NULL;

    ok = versus_eager(copy_kept_step, NULL, 1, &x, 1, &fn);
    ok = ok && TU_EXPECT(count_op(fn, SG__OP_COPY, &d) == 2 && d == 0);
    tu_case(ok, "COPY(clone(x) of an input, clone(sin(x)^T) of another geometry: both kept)");
    sg_fn_destroy(fn), fn = NULL;

    ok = versus_eager(copy_offset_step, NULL, 1, &x, 1, &fn);
    ok = ok && TU_EXPECT(count_op(fn, SG__OP_COPY, &d) == 1 && d == 1) &&
         TU_EXPECT(strstr(sg_fn_explain(fn), "read there instead (the copy removed by fusion"));
    tu_case(ok, "COPY(clone(rows 3..6 of exp(x)), a view at an offset: the copy removed, explain "
                "says where it is read)");
    sg_fn_destroy(fn), fn = NULL;

    ok = versus_eager(copy_offset_clobber_step, NULL, 1, &x, 1, &fn);
    ok = ok && TU_EXPECT(count_op(fn, SG__OP_COPY, &d) == 1 && d == 0);
    tu_case(ok, "COPY(clone(rows 3..6 of a); a += x: kept)");
    sg_fn_destroy(fn), fn = NULL;

    ok = versus_eager(copy_output_step, NULL, 1, &x, 1, &fn);
    ok = ok && TU_EXPECT(count_op(fn, SG__OP_COPY, &d) == 1 && d == 0);
    tu_case(ok, "COPY(the output is a clone: kept)");
    sg_fn_destroy(fn);
    sg_release(x);
}

/* A value copied into rows 2..5 of a buffer that a fill completes: the producer
 * writes it there, the copy is dropped (fusion/fuse.c forward_into). */
static sg_tensor *rows_buffer(sg_ctx *c, sg_tensor *src, bool fill_first, sg_tensor **buf) {
    int64_t sh[2] = {6, 8};
    *buf = sg_empty(c, sg_tensor_dtype(src) == SG_F32 ? SG_F32 : SG_BF16, 2, sh);
    if (fill_first && sg_fill_(*buf, 1.0) != SG_OK) return NULL;
    sg_tensor *top = sg_narrow(*buf, 0, 2, 4), *low = sg_narrow(*buf, 0, 0, 2);
    if (sg_copy_(top, src) != SG_OK || sg_fill_(low, 0.5) != SG_OK) return NULL;
    return top;
}
STEP(into_step) {
    sg_tensor *buf, *top = rows_buffer(c, sg_exp(in[0]), false, &buf);
    return DONE(top ? sg_mul_scalar(buf, 2.0) : NULL);
}
/* The source read after a later write of the buffer's rows: kept. */
STEP(into_late_read_step) {
    sg_tensor *a = sg_exp(in[0]), *buf, *top = rows_buffer(c, a, false, &buf);
    if (!top || sg_add_(top, in[0]) != SG_OK) return sg_ctx_status(c);
    return DONE(sg_sub(sg_narrow(buf, 0, 2, 4), a));
}
/* The buffer written before the copy: kept. */
STEP(into_touched_step) {
    sg_tensor *buf, *top = rows_buffer(c, sg_exp(in[0]), true, &buf);
    return DONE(top ? sg_mul_scalar(buf, 2.0) : NULL);
}
/* Another dtype (the copy converts): kept. */
STEP(into_cast_step) {
    sg_tensor *buf, *top = rows_buffer(c, sg_cast(sg_exp(in[0]), SG_F16), false, &buf);
    return DONE(top ? sg_mul_scalar(buf, 2.0) : NULL);
}

static void test_copy_into(void) {
    sg_tensor *x = rand2(SG_F32, 4, 8);
    struct {
        sg_step_fn step;
        int dead;
        const char *what;
    } cases[] = {
        {into_step, 1,
         "exp(x) copied into rows 2..5 of a buffer, rows 0..1 filled: the copy removed"},
        {into_late_read_step, 0, "the source read after the rows are written again: kept"},
        {into_touched_step, 0, "the buffer filled before the copy: kept"},
        {into_cast_step, 0, "f16 copied into bf16 rows (a conversion): kept"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        sg_fn *fn = NULL;
        int d = -1;
        bool ok = versus_eager(cases[k].step, NULL, 1, &x, 1, &fn);
        ok = ok && TU_EXPECT(count_op(fn, SG__OP_COPY, &d) >= 1 && d == cases[k].dead);
        /* explain says where the value went */
        bool said = ok && strstr(sg_fn_explain(fn), "written straight into b") != NULL;
        ok = ok && TU_EXPECT(said == (cases[k].dead == 1));
        tu_case(ok, "COPY_INTO(%s)", cases[k].what);
        sg_fn_destroy(fn);
    }
    sg_release(x);
}

/* ------------------------------------------------------------ dialect corners */

#define NCAT 6
STEP(concat_step) { return DONE(sg_sin(sg_concat(NCAT, in, 1))); }

static void test_concat_many(void) {
    sg_tensor *in[NCAT];
    for (int i = 0; i < NCAT; i++) in[i] = rand2(SG_F32, 3, i + 1);
    bool ok = versus_eager(concat_step, NULL, NCAT, in, 1, NULL);
    tu_case(ok, "CONCAT(%d inputs of [3,k], then sin)", NCAT);
    for (int i = 0; i < NCAT; i++) sg_release(in[i]);
}

STEP(inf_step) {
    sg_tensor *x = in[0];
    sg_tensor *a = sg_clamp(x, -INFINITY, INFINITY),
              *b = sg_clamp(sg_mul_scalar(x, 1e30), 0.0, INFINITY);
    sg_tensor *n = sg_add_scalar(x, NAN), *m = sg_mul_scalar(sg_relu(x), -INFINITY);
    out[1] = sg_add(n, m);
    return DONE(sg_add(a, b));
}

static void test_inf_nan(void) {
    sg_dtype dts[3] = {SG_F32, SG_F16, SG_BF16};
    for (int d = 0; d < 3; d++) {
        sg_tensor *x = rand2(dts[d], 4, 9);
        bool ok = versus_eager(inf_step, NULL, 1, &x, 2, NULL);
        tu_case(ok, "SCALARS(type=%s: clamp(x,-inf,inf), clamp(x*1e30,0,inf), x+NaN, relu(x)*-inf)",
                sg_dtype_name(dts[d]));
        sg_release(x);
    }
}

/* Both arguments of a comparison come from one value kept in registers. */
STEP(self_cmp_step) {
    sg_tensor *v = sg_add(in[0], in[1]);
    out[1] = sg_maximum(sg_minimum(v, v), v);
    return DONE(sg_logical_and(sg_eq(v, v), sg_ge(v, v)));
}

static void test_self_compare(void) {
    sg_dtype dts[3] = {SG_I32, SG_I64, SG_F32};
    for (int d = 0; d < 3; d++) {
        sg_tensor *in[2] = {rand2(dts[d], 3, 7), rand2(dts[d], 3, 7)};
        bool ok = versus_eager(self_cmp_step, NULL, 2, in, 2, NULL);
        tu_case(ok, "SELF_COMPARE(type=%s: eq(v,v), ge(v,v), min/max(v,v) in registers, -Werror)",
                sg_dtype_name(dts[d]));
        sg_release(in[0]), sg_release(in[1]);
    }
}

/* Independent updates of parameters, the last one empty: one multi-tensor
 * kernel that ends in a barrier, then, in the same parallel region, a
 * kernel that reads the first update transposed (other threads' rows). */
typedef struct multi_box {
    sg_tensor *p[4];
} multi_box;

STEP(multi_step) {
    multi_box *b = user;
    sg_status s = SG_OK;
    for (int i = 0; i < 4 && s == SG_OK; i++)
        s = sg_copy_(b->p[i], sg_add(sg_mul_scalar(b->p[i], 0.5), in[i]));
    if (s != SG_OK) return s;
    return DONE(sg_tanh(sg_transpose(b->p[0], 0, 1)));
}

static void test_multi_barrier(void) {
    char dir[] = "/tmp/sg_test_dump_XXXXXX";
    bool ok = TU_EXPECT(mkdtemp(dir) != NULL);
    setenv("SG_DUMP_DIR", dir, 1);
    setenv("SG_ALWAYS_COMPILE", "1", 1);
    int64_t sh[4][2] = {{512, 300}, {7, 5}, {3, 3}, {0, 5}};
    multi_box be, bc;
    sg_tensor *in[4];
    for (int i = 0; i < 4; i++) {
        be.p[i] = tu_rand(ctx, SG_F32, 2, sh[i], -1, 1, NULL);
        bc.p[i] = sg_clone(be.p[i]);
        in[i] = tu_rand(ctx, SG_F32, 2, sh[i], -1, 1, NULL);
    }
    sg_fn *fe, *fc;
    sg_compile(ctx, multi_step, &be, 4, 1, &(sg_compile_opts){.mode = SG_MODE_EAGER}, &fe);
    sg_compile(ctx, multi_step, &bc, 4, 1, &(sg_compile_opts){.mode = SG_MODE_REDUCE_OVERHEAD},
               &fc);
    for (int call = 0; ok && call < 3; call++) {
        sg_tensor *oe, *oc;
        sg_mark_step_begin(ctx);
        ok = TU_EXPECT(sg_call(fe, in, 4, &oe, 1) == SG_OK) &&
             TU_EXPECT(sg_call(fc, in, 4, &oc, 1) == SG_OK);
        double *a = ok ? tu_read(oe) : NULL, *b = ok ? tu_read(oc) : NULL;
        ok = ok && TU_EXPECT(tu_close("tanh(p0^T)", b, a, 512 * 300, 1e-5, 1e-6));
        free(a), free(b);
    }
    for (int i = 0; ok && i < 3; i++) {
        double *a = tu_read(be.p[i]), *b = tu_read(bc.p[i]);
        ok = TU_EXPECT(tu_close("param", b, a, sh[i][0] * sh[i][1], 1e-6, 0));
        free(a), free(b);
    }
    const sg__graph *g = fc->graphs[0];
    ok = ok &&
         TU_EXPECT(g->compiled && g->fused.ngroups == 2 && g->fused.groups[0].kind == SG__G_MULTI);
    char path[256], src[1 << 16] = "";
    snprintf(path, sizeof path, "%s/%s.c", dir, g->module);
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(src, 1, sizeof src - 1, f) : 0;
    src[n] = '\0';
    if (f) fclose(f);
    const char *k0 = strstr(src, "static void sg_k0_multi");
    const char *k1 = k0 ? strstr(k0, "static void sg_k1") : NULL;
    const char *bar = k0 ? strstr(k0, "SG_OMP(omp barrier)") : NULL;
    /* The barrier is the C dialect's: other backends' units are checked by the numbers. */
    bool c_unit = tu_backend() == SG_BACKEND_CPU;
    ok = ok && TU_EXPECT(!c_unit || (k0 && bar && (!k1 || bar < k1)));
    tu_case(ok,
            "MULTI(4 parameter updates, the last empty, then tanh(p0^T) in the same region: "
            "%s)",
            c_unit ? "barrier ends the loops" : "the numbers only, not a C unit");
    unlink(path);
    rmdir(dir);
    unsetenv("SG_DUMP_DIR");
    unsetenv("SG_ALWAYS_COMPILE");
    sg_fn_destroy(fe), sg_fn_destroy(fc);
    for (int i = 0; i < 4; i++) sg_release(be.p[i]), sg_release(bc.p[i]), sg_release(in[i]);
}

/* ------------------------------------------------------------ multi-tensor sums */

/* Squared norms of two tensors (one in bf16), a mean of the squares of a
 * transposed view, and the square root of their total: the backends
 * that generate a multi-tensor sum (CUDA, HIP, OpenCL C) run the three
 * reductions as one kernel. */
STEP(sums_step) {
    sg_tensor *a = in[0];
    out[0] = sg_sum(sg_mul(a, a), 0, NULL, false);
    sg_tensor *b = sg_cast(in[1], SG_F32);
    out[1] = sg_sum(sg_mul(b, b), 0, NULL, false);
    sg_tensor *t = sg_transpose(in[2], 0, 1);
    out[2] = sg_mean(sg_mul(t, t), 0, NULL, false);
    out[3] = sg_sqrt(sg_add(sg_add(out[0], sg_mul_scalar(out[1], 2.0)), out[2]));
    (void)user;
    return out[0] && out[1] && out[2] && out[3] ? SG_OK : sg_ctx_status(c);
}

static void test_multi_sums(void) {
    sg_tensor *in[3] = {rand2(SG_F32, 1, 3), rand2(SG_BF16, 1000, 21), rand2(SG_F32, 33, 70)};
    bool ok = versus_eager(sums_step, NULL, 3, in, 4, NULL);
    tu_case(ok, "SUMS(sum(a^2) f32[1,3], sum(f32(b)^2) bf16[1000,21], mean((c^T)^2) "
                "f32[70,33] transposed, sqrt(a + 2 b + c))");
    for (int i = 0; i < 3; i++) sg_release(in[i]);
}

/* A clip's coefficient and total norm over values ready at different
 * times: three products first, then a chain of three that makes the last. */
STEP(ready_step) {
    sg_tensor *w = in[4], *q = in[3];
    sg_tensor *v[4];
    for (int i = 0; i < 3; i++) v[i] = sg_matmul(in[i], w);
    for (int i = 0; i < 3; i++) q = sg_tanh(sg_matmul(q, w));
    v[3] = q;
    sg_tensor *coef = NULL;
    sg_status st = sg_clip_grad_norm_coef(4, v, 1.0, &coef, &out[1]);
    (void)user;
    return st == SG_OK && (out[0] = coef) ? SG_OK : sg_ctx_status(c);
}

/* The groups of graph g's IR fused with the CUDA backend's options: where
 * the multi-tensor sums went (*early: a MULTI of `sums`, *nmembers its
 * members; *last_mm: the last product). False without the CUDA headers. */
static bool cuda_sums_layout(const sg__graph *g, int *early, int *nmembers, int *last_mm,
                             int *nsums) {
    sg__fuse_opts fo;
    sg__fused f;
    if (!sg__cuda_graph_ops.fuse_opts) return false;
    sg__cuda_graph_ops.fuse_opts(&fo, false);
    *early = *last_mm = -1, *nmembers = *nsums = 0;
    if (!TU_EXPECT(sg__fuse(ctx, &g->ir, &fo, &f) == SG_OK)) return true;
    for (int k = 0; k < f.ngroups; k++) {
        const sg__group *gr = &f.groups[k];
        if (gr->kind == SG__G_MULTI && gr->sums) {
            if (*early < 0) *early = k, *nmembers = gr->nmembers;
            *nsums += gr->nmembers;
        } else if (gr->kind == SG__G_REDUCE) {
            (*nsums)++;
        }
        if (gr->kind == SG__G_MATMUL) *last_mm = k;
    }
    sg__fused_free(ctx, &f, &g->ir);
    return true;
}

static void test_sums_by_readiness(void) {
    sg_tensor *in[5] = {rand2(SG_F32, 6, 16), rand2(SG_F32, 6, 16), rand2(SG_F32, 6, 16),
                        rand2(SG_F32, 5, 16), rand2(SG_F32, 16, 16)};
    sg_fn *fn = NULL;
    bool ok = versus_eager(ready_step, NULL, 5, in, 2, &fn);
    int early = -1, nm = 0, last_mm = -1, nsums = 0;
    bool have = ok && cuda_sums_layout(fn->graphs[0], &early, &nm, &last_mm, &nsums);
    ok = ok && TU_EXPECT(!have || (nm == 3 && nsums == 4 && early >= 0 && early < last_mm));
    if (!ok)
        fprintf(stderr, "  early sums at %d (%d members), last product %d, %d sums\n", early, nm,
                last_mm, nsums);
    tu_case(ok,
            "SUMS_READY(a clip of four values, three of products ready first, one after a chain of "
            "three: %s)",
            have ? "with the CUDA options the three are one kernel before the chain's last product"
                 : "the numbers only");
    sg_fn_destroy(fn);
    for (int i = 0; i < 5; i++) sg_release(in[i]);
}

/* An MLP's training step without a clip: three layers, cross-entropy,
 * sg_grad and AdamW over the six parameters. The last layers' updates need
 * only their own gradients: fusion moves them (one multi-tensor kernel)
 * before the first layer's weight-gradient product, and the bias
 * corrections they read to the step's start. */
typedef struct mlp_box {
    sg_tensor *p[6];
    sg_optim *opt;
} mlp_box;

STEP(mlp_train_step) {
    mlp_box *b = user;
    sg_tensor *h = sg_relu(sg_linear(in[0], b->p[0], b->p[1]));
    h = sg_relu(sg_linear(h, b->p[2], b->p[3]));
    sg_tensor *loss = sg_cross_entropy(sg_linear(h, b->p[4], b->p[5]), in[1]), *g[6];
    if (!loss) return sg_ctx_status(c);
    sg_status st = sg_grad(loss, 6, b->p, g);
    if (st == SG_OK) st = sg_optim_step(b->opt, g);
    out[0] = loss;
    return st;
}

/* Where fused groups f put a step's parameter updates: how many (MULTIs
 * count their members), how many before the last product, and in how many
 * groups. */
typedef struct upd_layout {
    int nupd, before, ngroups, last_mm;
} upd_layout;

static bool param_update(const sg__ir *ir, const sg__fused *f, const sg__group *p) {
    for (int q = 0; q < p->n; q++) { /* a parameter's update, not the step count's copy */
        const sg__ref *o = &ir->refs[f->alias[ir->nodes[p->g[q].node].out]];
        if (ir->slots[o->slot].kind == SG__SLOT_PARAM &&
            ir->nodes[p->g[q].node].op == SG__OP_COPY && sg__numel(o->ndim, o->shape) > 1)
            return true;
    }
    return false;
}

static upd_layout updates_layout(const sg__ir *ir, const sg__fused *f) {
    upd_layout u = {.last_mm = -1};
    for (int k = 0; k < f->ngroups; k++)
        if (f->groups[k].kind == SG__G_MATMUL) u.last_mm = k;
    for (int k = 0; k < f->ngroups; k++) {
        const sg__group *gr = &f->groups[k];
        int np = gr->kind == SG__G_MULTI ? gr->nmembers : 1, here = 0;
        for (int m = 0; m < np; m++)
            here += param_update(ir, f, gr->kind == SG__G_MULTI ? &f->parts[gr->members[m]] : gr);
        u.nupd += here, u.ngroups += here > 0, u.before += k < u.last_mm ? here : 0;
    }
    return u;
}

/* A training step run eagerly (over ue's parameters) and compiled (over
 * uc's, a clone of them) for `calls` steps: the losses (output 0) and then the np
 * parameters pe[i] and pc[i] agree within rtol and atol; *fc keeps the
 * compiled fn on success (else NULL). */
static bool train_vs_eager(sg_step_fn step, void *ue, void *uc, int nin, sg_tensor *const *in,
                           int calls, sg_tensor *const *pe, sg_tensor *const *pc, int np,
                           double rtol, double atol, sg_fn **fc) {
    sg_fn *fe = NULL;
    *fc = NULL;
    bool ok =
        TU_EXPECT(sg_compile(ctx, step, ue, nin, 1, &(sg_compile_opts){.mode = SG_MODE_EAGER},
                             &fe) == SG_OK) &&
        TU_EXPECT(sg_compile(ctx, step, uc, nin, 1,
                             &(sg_compile_opts){.mode = SG_MODE_REDUCE_OVERHEAD}, fc) == SG_OK);
    for (int call = 0; ok && call < calls; call++) {
        sg_tensor *oe = NULL, *oc = NULL;
        sg_mark_step_begin(ctx);
        ok = TU_EXPECT(sg_call(fe, in, nin, &oe, 1) == SG_OK) &&
             TU_EXPECT(sg_call(*fc, in, nin, &oc, 1) == SG_OK);
        double *a = ok ? tu_read(oe) : NULL, *b = ok ? tu_read(oc) : NULL;
        ok = ok && TU_EXPECT(tu_close("loss", b, a, 1, rtol, atol));
        free(a), free(b);
    }
    for (int i = 0; ok && i < np; i++) {
        double *a = tu_read(pe[i]), *b = tu_read(pc[i]);
        ok = TU_EXPECT(tu_close("param", b, a, sg_tensor_numel(pe[i]), rtol, atol));
        free(a), free(b);
    }
    ok = ok && TU_EXPECT((*fc)->ngraphs == 1 && (*fc)->graphs[0]->compiled);
    sg_fn_destroy(fe);
    if (!ok) sg_fn_destroy(*fc), *fc = NULL;
    return ok;
}

static void test_updates_by_readiness(void) {
    int64_t sh[6][2] = {{24, 12}, {24}, {20, 24}, {20}, {10, 20}, {10}};
    mlp_box be, bc;
    for (int i = 0; i < 6; i++) {
        be.p[i] = tu_rand(ctx, SG_F32, i % 2 ? 1 : 2, sh[i], -0.5, 0.5, NULL);
        bc.p[i] = sg_clone(be.p[i]);
        sg_requires_grad_(be.p[i], true), sg_requires_grad_(bc.p[i], true);
    }
    int64_t xs[2] = {9, 12}, ys[1] = {9};
    sg_tensor *in[2] = {tu_rand(ctx, SG_F32, 2, xs, -1, 1, NULL), sg_zeros(ctx, SG_I64, 1, ys)};
    int64_t lab[9] = {0, 3, 9, 1, 1, 7, 2, 5, 8};
    /* An eps near the gradients' size: with 1e-8, a gradient element near 0
     * steps by +-lr on its sign alone, and the backends' last bits decide it. */
    sg_adamw_opts ao = {.eps = 1e-2};
    bool ok = TU_EXPECT(sg_write(in[1], lab, sizeof lab) == SG_OK) &&
              TU_EXPECT(sg_adamw_create(ctx, 6, be.p, &ao, &be.opt) == SG_OK) &&
              TU_EXPECT(sg_adamw_create(ctx, 6, bc.p, &ao, &bc.opt) == SG_OK);
    sg_fn *fc = NULL;
    ok = ok && train_vs_eager(mlp_train_step, &be, &bc, 2, in, 4, be.p, bc.p, 6, 1e-4, 1e-6, &fc);
    /* The layout: this backend's own fusion, and the CUDA options' too. */
    upd_layout u = {0}, uc = {0}, u0 = {0};
    const sg__graph *g = ok ? fc->graphs[0] : NULL;
    if (g) u = updates_layout(&g->ir, &g->fused);
    ok = ok && TU_EXPECT(u.nupd == 6 && u.before == 5 && u.ngroups >= 2 && u.last_mm >= 0) &&
         TU_EXPECT(strstr(sg_fn_explain(fc), "updates by readiness: 5 parameter updates in "));
    bool have = false;
    if (ok && sg__cuda_graph_ops.fuse_opts) {
        sg__fuse_opts fo;
        sg__fused f;
        sg__cuda_graph_ops.fuse_opts(&fo, false);
        have = TU_EXPECT(sg__fuse(ctx, &g->ir, &fo, &f) == SG_OK);
        if (have) uc = updates_layout(&g->ir, &f), sg__fused_free(ctx, &f, &g->ir);
        ok = have && TU_EXPECT(uc.nupd == 6 && uc.before == 5 && uc.ngroups >= 2);
    }
    /* Off by SG_MULTI_READY=0: one update kernel after the backward. */
    sg_fn *f0 = NULL;
    setenv("SG_MULTI_READY", "0", 1);
    ok = ok &&
         TU_EXPECT(sg_compile(ctx, mlp_train_step, &bc, 2, 1,
                              &(sg_compile_opts){.mode = SG_MODE_REDUCE_OVERHEAD}, &f0) == SG_OK);
    sg_tensor *o0 = NULL;
    ok = ok && TU_EXPECT(sg_call(f0, in, 2, &o0, 1) == SG_OK);
    if (ok) u0 = updates_layout(&f0->graphs[0]->ir, &f0->graphs[0]->fused);
    ok = ok && TU_EXPECT(u0.nupd == 6 && u0.before == 0 && u0.ngroups == 1) &&
         TU_EXPECT(!strstr(sg_fn_explain(f0), "updates by readiness"));
    unsetenv("SG_MULTI_READY");
    if (!ok)
        fprintf(stderr,
                "  updates (of, before the last product, groups): on %d %d %d, cuda %d %d %d, "
                "off %d %d %d\n",
                u.nupd, u.before, u.ngroups, uc.nupd, uc.before, uc.ngroups, u0.nupd, u0.before,
                u0.ngroups);
    tu_case(ok,
            "UPDATES_READY(an MLP's AdamW without a clip: the five updates ready before the first "
            "layer's weight gradient run in tiers before its product%s; off, one kernel after; "
            "the numbers as eager)",
            have ? ", with this backend's and the CUDA options" : "");
    sg_fn_destroy(f0), sg_fn_destroy(fc);
    sg_optim_destroy(be.opt), sg_optim_destroy(bc.opt);
    for (int i = 0; i < 6; i++) sg_release(be.p[i]), sg_release(bc.p[i]);
    sg_release(in[0]), sg_release(in[1]);
}

/* Twelve layers of tanh, no clip: the updates by readiness come in at most
 * eight tiers (TIERS_MAX, fusion/fuse.c) plus the rest, each layer's
 * before the layers below it finish. */
#define DEEP 12
typedef struct deep_box {
    sg_tensor *p[2 * DEEP];
    sg_optim *opt;
} deep_box;

STEP(deep_train_step) {
    deep_box *b = user;
    sg_tensor *h = in[0], *g[2 * DEEP];
    for (int l = 0; l < DEEP; l++) h = sg_tanh(sg_linear(h, b->p[2 * l], b->p[2 * l + 1]));
    sg_tensor *loss = sg_mean(sg_mul(h, h), 0, NULL, false);
    if (!loss) return sg_ctx_status(c);
    sg_status st = sg_grad(loss, 2 * DEEP, b->p, g);
    if (st == SG_OK) st = sg_optim_step(b->opt, g);
    out[0] = loss;
    return st;
}

static void test_updates_deep(void) {
    deep_box be, bc;
    for (int i = 0; i < 2 * DEEP; i++) {
        int64_t sh[2] = {16, 16};
        be.p[i] = tu_rand(ctx, SG_F32, i % 2 ? 1 : 2, sh, -0.4, 0.4, NULL);
        bc.p[i] = sg_clone(be.p[i]);
        sg_requires_grad_(be.p[i], true), sg_requires_grad_(bc.p[i], true);
    }
    int64_t xs[2] = {5, 16};
    sg_tensor *x = tu_rand(ctx, SG_F32, 2, xs, -1, 1, NULL);
    bool ok =
        TU_EXPECT(sg_sgd_create(ctx, 2 * DEEP, be.p, &(sg_sgd_opts){.lr = 0.1, .momentum = 0.9},
                                &be.opt) == SG_OK) &&
        TU_EXPECT(sg_sgd_create(ctx, 2 * DEEP, bc.p, &(sg_sgd_opts){.lr = 0.1, .momentum = 0.9},
                                &bc.opt) == SG_OK);
    sg_fn *fc = NULL;
    ok = ok &&
         train_vs_eager(deep_train_step, &be, &bc, 1, &x, 3, be.p, bc.p, 2 * DEEP, 1e-5, 1e-7, &fc);
    upd_layout u = {0};
    if (ok) u = updates_layout(&fc->graphs[0]->ir, &fc->graphs[0]->fused);
    ok = ok && TU_EXPECT(u.nupd == 2 * DEEP && u.ngroups >= 4 && u.ngroups <= 9 &&
                         u.before >= 2 * DEEP - 4);
    if (!ok)
        fprintf(stderr, "  updates %d, before the last product %d, in %d groups\n", u.nupd,
                u.before, u.ngroups);
    tu_case(
        ok,
        "UPDATES_DEEP(12 layers, SGD with momentum, no clip: the updates in %d groups (4 to 9), "
        "%d of 24 before the last product; the numbers as eager)",
        u.ngroups, u.before);
    sg_fn_destroy(fc);
    sg_optim_destroy(be.opt), sg_optim_destroy(bc.opt);
    for (int i = 0; i < 2 * DEEP; i++) sg_release(be.p[i]), sg_release(bc.p[i]);
    sg_release(x);
}

/* Cross-entropy's gradient with respect to its logits (9 rows of 10, the
 * rows not aligned to any vector width): where the gradient's kernel takes
 * the logits' bytes (graphs/graph.c inplace_hosts), every row must be read
 * whole before any of it is written. */
STEP(xent_grad_step) {
    sg_tensor *lg = sg_add(sg_narrow(in[0], 1, 0, 10), in[2]), *g = NULL;
    sg_tensor *loss = sg_cross_entropy(lg, in[1]);
    if (!loss) return sg_ctx_status(c);
    sg_status st = sg_grad(loss, 1, &lg, &g);
    (void)user;
    out[0] = g, out[1] = loss;
    return st;
}

static void test_xent_grad_rows(void) {
    int64_t xs[2] = {9, 12}, ys[1] = {9}, bs[1] = {10};
    sg_tensor *in[3] = {tu_rand(ctx, SG_F32, 2, xs, -2, 2, NULL), sg_zeros(ctx, SG_I64, 1, ys),
                        tu_rand(ctx, SG_F32, 1, bs, -1, 1, NULL)};
    int64_t lab[9] = {0, 3, 9, 1, 1, 7, 2, 5, 8};
    bool ok = TU_EXPECT(sg_write(in[1], lab, sizeof lab) == SG_OK) &&
              TU_EXPECT(sg_requires_grad_(in[2], true) == SG_OK) &&
              versus_eager(xent_grad_step, NULL, 3, in, 2, NULL);
    tu_case(ok, "XENT_GRAD(d cross_entropy / d logits, 9 rows of 10 from a narrowed view plus a "
                "bias: compiled as eager)");
    for (int i = 0; i < 3; i++) sg_release(in[i]);
}

STEP(chain_step) { return DONE(sg_tanh(sg_add_scalar(sg_sin(in[0]), 0.5))); }

static void test_explain_registers(void) {
    sg_tensor *x = rand2(SG_F32, 4, 16);
    sg_fn *fn = NULL;
    bool ok = versus_eager(chain_step, NULL, 1, &x, 1, &fn);
    const char *ex = ok ? sg_fn_explain(fn) : "";
    char huge[32];
    snprintf(huge, sizeof huge, "%zu", (size_t)SIZE_MAX);
    ok = ok && TU_EXPECT(strstr(ex, huge) == NULL) && TU_EXPECT(strstr(ex, "registers") != NULL);
    if (!ok) fprintf(stderr, "%s", ex);
    tu_case(ok, "EXPLAIN(values kept in registers say so, no offset)");
    sg_fn_destroy(fn);
    sg_release(x);
}

int main(void) {
    setenv("SG_CFLAGS", "-Wall -Wextra -Werror", 1);
    ctx = tu_ctx((sg_ctx_opts){0});
    tu_seed(9);
    test_dce();
    test_cse();
    test_copy_forwarding();
    test_copy_into();
    test_concat_many();
    test_inf_nan();
    test_self_compare();
    test_multi_barrier();
    test_multi_sums();
    test_sums_by_readiness();
    test_xent_grad_rows();
    test_updates_by_readiness();
    test_updates_deep();
    test_explain_registers();
    sg_ctx_destroy(ctx);
    return tu_finish();
}
