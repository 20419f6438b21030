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

    sg_release(x);
    sg_fn_destroy(fn);
    sg_ctx_destroy(other);
    sg_ctx_destroy(ctx);
    return tu_finish();
}
