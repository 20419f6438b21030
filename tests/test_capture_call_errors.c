/* SPDX-License-Identifier: MIT */
/*
 * test_capture_call_errors.c -- bad input to sg_compile, sg_call and their
 * kin: each case checks the status, that the message names the problem, and
 * that the context and the fn still work afterwards.
 */
#include "testutil.h"

#include <string.h>

static sg_ctx *ctx, *other;

static sg_status double_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)user;
    out[0] = sg_mul_scalar(in[0], 2.0);
    return out[0] ? SG_OK : sg_ctx_status(c);
}

static sg_status failing_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)c, (void)in, (void)out, (void)user;
    return SG_ERR_INVALID_ARG;
}

static sg_status null_out_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)c, (void)user;
    out[0] = sg_neg(in[0]);
    return SG_OK; /* leaves out[1] NULL */
}

static sg_status bad_op_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)user;
    out[0] = sg_exp(sg_cast(in[0], SG_I32)); /* exp of an int: fails inside the step */
    return out[0] ? SG_OK : sg_ctx_status(c);
}

/* A step that tries to release its input, destroy its own fn, or destroy
 * the context it runs on: each is refused inside the step, and the step
 * goes on (its output is still right). */
static sg_fn *self_fn;
static char refusal[1024]; /* the refusal's message, kept before the step clears it */
static sg_status selfish_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    int what = *(int *)user;
    sg_status got = SG_OK;
    if (what == 0) got = sg_release(in[0]);
    if (what == 1) got = sg_fn_destroy(self_fn);
    if (what == 2) {
        sg_ctx_destroy(c);
        got = sg_ctx_status(c);
    }
    if (got != SG_ERR_INVALID_ARG && got != SG_ERR_UNSUPPORTED) return SG_ERR_INVALID_ARG;
    snprintf(refusal, sizeof refusal, "%s", sg_last_error(c));
    sg_clear_error(c); /* the refusal was expected: the step goes on */
    out[0] = sg_mul_scalar(in[0], 2.0);
    return out[0] ? SG_OK : sg_ctx_status(c);
}

/* A step that passes an op's NULL along: the call fails with the op's
 * status, even with an earlier failure left uncleared on the context. */
static sg_status softmax_dim_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)c, (void)user;
    out[0] = sg_softmax(in[0], 5);
    return out[0] ? SG_OK : SG_ERR_NULL;
}

/* Leaves its output released. */
static sg_status released_out_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)c, (void)user;
    out[0] = sg_neg(in[0]);
    sg_release(out[0]);
    return SG_OK;
}

/* After an error: clear it, and a valid call must still work. */
static bool still_works(sg_fn *fn, sg_tensor *x) {
    sg_clear_error(ctx);
    sg_tensor *y;
    double v = 0;
    sg_mark_step_begin(ctx);
    return TU_EXPECT(sg_call(fn, &x, 1, &y, 1) == SG_OK) && TU_EXPECT(sg_item(y, &v) == SG_OK) &&
           TU_EXPECT(v == 6.0);
}

static bool says(sg_status got, sg_status want, const char *text) {
    bool ok = TU_EXPECT(got == want) && TU_EXPECT(strstr(sg_last_error(ctx), text) != NULL);
    if (!ok) fprintf(stderr, "  status %s, message: %s\n", sg_status_str(got), sg_last_error(ctx));
    return ok;
}

int main(void) {
    ctx = tu_ctx((sg_ctx_opts){0});
    other = tu_ctx((sg_ctx_opts){0});
    int64_t one[1] = {1};
    sg_tensor *x = sg_full(ctx, SG_F32, 1, one, 3.0), *y[2] = {NULL, NULL};
    sg_tensor *foreign = sg_full(other, SG_F32, 1, one, 3.0);
    sg_fn *fn = NULL, *bad = NULL;
    sg_compile_opts ro = {.mode = SG_MODE_REDUCE_OVERHEAD, .name = "double"};
    sg_compile(ctx, double_step, NULL, 1, 1, &ro, &fn);

    tu_case(says(sg_compile(ctx, NULL, NULL, 1, 1, &ro, &bad), SG_ERR_NULL, "step is NULL") &&
                TU_EXPECT(bad == NULL) && still_works(fn, x),
            "COMPILE(step=NULL)");
    tu_case(says(sg_compile(ctx, double_step, NULL, 1, 1, &ro, NULL), SG_ERR_NULL, "fn is NULL") &&
                still_works(fn, x),
            "COMPILE(out=NULL)");
    tu_case(says(sg_compile(ctx, double_step, NULL, -1, 0, &ro, &bad), SG_ERR_INVALID_ARG, "nin -1") &&
                still_works(fn, x),
            "COMPILE(nin=-1,nout=0)");
    sg_compile_opts badmode = {.mode = (sg_mode)42};
    tu_case(says(sg_compile(ctx, double_step, NULL, 1, 1, &badmode, &bad), SG_ERR_INVALID_ARG, "mode 42") &&
                still_works(fn, x),
            "COMPILE(mode=42)");
    tu_case(TU_EXPECT(sg_compile(NULL, double_step, NULL, 1, 1, &ro, &bad) == SG_ERR_NULL),
            "COMPILE(ctx=NULL)");

    tu_case(TU_EXPECT(sg_call(NULL, &x, 1, y, 1) == SG_ERR_NULL) && still_works(fn, x), "CALL(fn=NULL)");
    tu_case(says(sg_call(fn, &x, 2, y, 1), SG_ERR_INVALID_ARG, "takes 1 inputs") && still_works(fn, x),
            "CALL(nin=2 for a 1-input fn)");
    tu_case(says(sg_call(fn, &x, 1, y, 3), SG_ERR_INVALID_ARG, "1 outputs") && still_works(fn, x),
            "CALL(nout=3 for a 1-output fn)");
    tu_case(says(sg_call(fn, NULL, 1, y, 1), SG_ERR_NULL, "in is NULL") && still_works(fn, x),
            "CALL(in=NULL)");
    tu_case(says(sg_call(fn, &x, 1, NULL, 1), SG_ERR_NULL, "out is NULL") && still_works(fn, x),
            "CALL(out=NULL)");
    sg_tensor *nul = NULL;
    tu_case(says(sg_call(fn, &nul, 1, y, 1), SG_ERR_NULL, "input 0") && still_works(fn, x),
            "CALL(in[0]=NULL)");
    tu_case(says(sg_call(fn, &foreign, 1, y, 1), SG_ERR_WRONG_CONTEXT, "another context") &&
                still_works(fn, x),
            "CALL(input from another context)");
    sg_tensor *gone = sg_full(ctx, SG_F32, 1, one, 1.0);
    sg_release(gone);
    tu_case(says(sg_call(fn, &gone, 1, y, 1), SG_ERR_RELEASED, "released") && still_works(fn, x),
            "CALL(released input)");

    sg_fn *f2;
    sg_compile(ctx, failing_step, NULL, 1, 1, &ro, &f2);
    tu_case(says(sg_call(f2, &x, 1, y, 1), SG_ERR_INVALID_ARG, "the step returned SG_ERR_INVALID_ARG") &&
                still_works(fn, x),
            "CALL(step returns an error)");
    sg_fn_destroy(f2);
    sg_compile(ctx, null_out_step, NULL, 1, 2, &ro, &f2);
    tu_case(says(sg_call(f2, &x, 1, y, 2), SG_ERR_NULL, "output 1 NULL") && still_works(fn, x),
            "CALL(step leaves output 1 NULL)");
    sg_fn_destroy(f2);
    sg_compile(ctx, bad_op_step, NULL, 1, 1, &ro, &f2);
    tu_case(says(sg_call(f2, &x, 1, y, 1), SG_ERR_DTYPE, "sg_exp") && still_works(fn, x),
            "CALL(an op inside the step fails: its message comes through)");
    sg_fn_destroy(f2);

    sg_compile(ctx, double_step, NULL, 1, 1, &ro, &f2);
    sg_call(f2, &x, 1, y, 1);
    sg_fn_destroy(f2);
    tu_case(says(sg_call(f2, &x, 1, y, 1), SG_ERR_RELEASED, "destroyed") &&
                says(sg_fn_reset(f2), SG_ERR_RELEASED, "destroyed") &&
                TU_EXPECT(sg_fn_explain(f2)[0] == '\0') && still_works(fn, x),
            "CALL(destroyed fn)");
    /* Outputs of a destroyed fn read as released, not as a crash. */
    float v;
    tu_case(TU_EXPECT(sg_read(y[0], &v, sizeof v) == SG_ERR_RELEASED) && still_works(fn, x),
            "READ(output of a destroyed fn)");
    sg_fn_destroy(f2); /* twice: no-op */
    sg_fn_destroy(NULL);

    /* What a step may not do to itself, in eager and compiled modes. */
    const char *said[3] = {"input 0 of the step running now", "is running its step",
                           "called inside a step"};
    for (int what = 0; what < 3; what++)
        for (int m = 0; m < 2; m++) {
            sg_compile_opts o = {.mode = m ? SG_MODE_REDUCE_OVERHEAD : SG_MODE_EAGER};
            sg_compile(ctx, selfish_step, &what, 1, 1, &o, &self_fn);
            refusal[0] = '\0';
            sg_status st = sg_call(self_fn, &x, 1, y, 1);
            double v = 0;
            bool ok = TU_EXPECT(st == SG_OK) && TU_EXPECT(sg_item(y[0], &v) == SG_OK) &&
                      TU_EXPECT(v == 6.0) && TU_EXPECT(sg_item(x, &v) == SG_OK) &&
                      TU_EXPECT(v == 3.0) && TU_EXPECT(strstr(refusal, said[what]) != NULL);
            if (!ok) fprintf(stderr, "  status %s, refusal: %s\n", sg_status_str(st), refusal);
            sg_fn_destroy(self_fn);
            tu_case(ok && still_works(fn, x), "CALL(a %s step: %s -> refused, the step goes on)",
                    m ? "compiled" : "eager", said[what]);
        }
    sg_compile(ctx, softmax_dim_step, NULL, 1, 1, &ro, &f2);
    sg_clear_error(ctx);
    sg_tensor *bad_shape = sg_reshape(x, 1, (int64_t[]){5}); /* left uncleared */
    tu_case(TU_EXPECT(!bad_shape) && TU_EXPECT(sg_ctx_status(ctx) == SG_ERR_SHAPE) &&
                says(sg_call(f2, &x, 1, y, 1), SG_ERR_INDEX, "sg_softmax: dim 5") &&
                still_works(fn, x),
            "CALL(an op's NULL passed along after an uncleared failure: the op's status)");
    sg_fn_destroy(f2);
    sg_compile(ctx, released_out_step, NULL, 1, 1, &ro, &f2);
    tu_case(says(sg_call(f2, &x, 1, y, 1), SG_ERR_RELEASED, "output 0 released") &&
                still_works(fn, x),
            "CALL(step leaves its output released)");
    sg_fn_destroy(f2);

    sg_release(x);
    sg_fn_destroy(fn);
    sg_ctx_destroy(other);
    sg_ctx_destroy(ctx);
    return tu_finish();
}
