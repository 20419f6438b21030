/* SPDX-License-Identifier: MIT */
/*
 * test_capture_errors.c -- bad input across the public API, for the parts that
 * exist today: contexts and backends, tensor creation, host transfer, views,
 * pointwise ops and the in-place ops. Every case checks, beyond the NULL or
 * status the call returned:
 *  - that sg_ctx_status holds that status and sg_last_error names the
 *    function (or op) and the problem,
 *  - that the log hook got the same text under the topic "error",
 *  - that the failed call left the host bytes as they were,
 *  - that the status stays sticky across a later successful call until
 *    sg_clear_error, which clears both status and text,
 *  - and that the context then still computes correctly.
 * A case prints the call it made, e.g. `sg_transpose(x23, 0, 2) -> SG_ERR_INDEX`.
 *
 * Bad input of the op families that are not written yet belongs to their own
 * tests; the cases they need are listed at the end of this file.
 */
#define _POSIX_C_SOURCE 200809L /* setenv, dup2, fileno */

#include "testutil.h"

#include <math.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

static sg_ctx *ctx; /* the context most cases run on; it has the log hook */

/* ------------------------------------------------------------ the log hook */

static struct {
    int nerror;      /* lines under "error" */
    int nother;      /* lines under any other topic */
    char last[1024]; /* the newest "error" line */
} logged;

static void log_hook(void *user, const char *topic, const char *line) {
    (void)user;
    if (strcmp(topic, "error") != 0) {
        logged.nother++;
        return;
    }
    logged.nerror++;
    snprintf(logged.last, sizeof logged.last, "%s", line);
}

/* ------------------------------------------------------------ shared checks */

/* A small valid computation: (x + 1) * 2 on [1, 2, 3], read back. */
static bool still_works(sg_ctx *c) {
    int64_t sh[1] = {3};
    float xs[3] = {1, 2, 3}, ys[3] = {0, 0, 0};
    sg_tensor *x = sg_from_host(c, SG_F32, 1, sh, xs);
    sg_tensor *p = sg_add_scalar(x, 1.0);
    sg_tensor *y = sg_mul_scalar(p, 2.0);
    bool ok = TU_EXPECT(y != NULL) && TU_EXPECT(sg_read(y, ys, sizeof ys) == SG_OK) &&
              TU_EXPECT(ys[0] == 4 && ys[1] == 6 && ys[2] == 8) &&
              TU_EXPECT(sg_ctx_status(c) == SG_OK);
    sg_release(x), sg_release(p), sg_release(y);
    return ok;
}

typedef struct snap {
    size_t live;
    int nerror;
} snap;

static snap take_snap(sg_ctx *c) {
    snap s = {0, logged.nerror};
    sg_ctx_host_bytes(c, &s.live, NULL);
    return s;
}

/*
 * The checks every failure shares (see the top of the file). got is what
 * the call returned (for ops: the sticky status, the op having returned
 * NULL); fn and problem must both appear in the message.
 */
static bool check_failure(sg_ctx *c, snap before, sg_status got, sg_status want, const char *fn,
                          const char *problem) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", sg_last_error(c));
    bool ok = TU_EXPECT(got == want) && TU_EXPECT(sg_ctx_status(c) == want);
    ok = ok && TU_EXPECT(strstr(msg, fn) != NULL) && TU_EXPECT(strstr(msg, problem) != NULL);
    if (c == ctx)
        ok = ok && TU_EXPECT(logged.nerror > before.nerror) &&
             TU_EXPECT(strcmp(logged.last, msg) == 0);
    size_t live = 0;
    ok = ok && TU_EXPECT(sg_ctx_host_bytes(c, &live, NULL) == SG_OK) &&
         TU_EXPECT(live == before.live);
    /* Sticky: a later successful call keeps the status and the text. */
    sg_tensor *t = sg_zeros(c, SG_F32, 0, NULL);
    ok = ok && TU_EXPECT(t != NULL) && TU_EXPECT(sg_ctx_status(c) == want) &&
         TU_EXPECT(strcmp(sg_last_error(c), msg) == 0);
    sg_release(t);
    sg_clear_error(c);
    ok = ok && TU_EXPECT(sg_ctx_status(c) == SG_OK) && TU_EXPECT(sg_last_error(c)[0] == '\0');
    ok = ok && TU_EXPECT(still_works(c));
    if (!ok) fprintf(stderr, "  returned %s, message: \"%s\"\n", sg_status_str(got), msg);
    sg_clear_error(c);
    return ok;
}

/* An op (returns a tensor) that must fail with `want` on context c. */
#define OP_FAILS(c, expr, want, fn, problem)                                                       \
    do {                                                                                           \
        snap before_ = take_snap(c);                                                               \
        sg_tensor *r_ = (expr);                                                                    \
        bool ok_ = TU_EXPECT(r_ == NULL);                                                          \
        sg_release(r_);                                                                            \
        ok_ = check_failure(c, before_, sg_ctx_status(c), want, fn, problem) && ok_;               \
        tu_case(ok_, "%s -> %s", #expr, sg_status_str(want));                                      \
    } while (0)

/* A call that returns a status and must fail with `want` on context c. */
#define CALL_FAILS(c, expr, want, fn, problem)                                                     \
    do {                                                                                           \
        snap before_ = take_snap(c);                                                               \
        sg_status s_ = (expr);                                                                     \
        bool ok_ = check_failure(c, before_, s_, want, fn, problem);                               \
        tu_case(ok_, "%s -> %s", #expr, sg_status_str(want));                                      \
    } while (0)

/* ------------------------------------------------------------ contexts and backends */

static void test_no_ops_on_null(void) {
    char buf[32];
    int64_t sh[1] = {2};
    float two[2] = {1, 2};
    sg_ctx_destroy(NULL);
    sg_release(NULL);
    sg_clear_error(NULL);
    bool ok = TU_EXPECT(sg_ctx_status(NULL) == SG_ERR_NULL) &&
              TU_EXPECT(sg_last_error(NULL) != NULL) &&
              TU_EXPECT(sg_ctx_host_bytes(NULL, NULL, NULL) == SG_ERR_NULL) &&
              TU_EXPECT(sg_tensor_numel(NULL) == 0 && sg_tensor_ndim(NULL) == 0) &&
              TU_EXPECT(sg_tensor_ctx(NULL) == NULL && sg_tensor_size(NULL, 0) == 0) &&
              TU_EXPECT(sg_tensor_shape(NULL, (int64_t[SG_MAX_DIMS]){0}) == SG_ERR_NULL) &&
              TU_EXPECT(strcmp(sg_tensor_describe(NULL, buf, sizeof buf), "NULL") == 0);
    /* Names of values that are none still give text, never NULL. */
    ok = ok && TU_EXPECT(strcmp(sg_dtype_name((sg_dtype)42), "?") == 0) &&
         TU_EXPECT(sg_dtype_size((sg_dtype)42) == 0) &&
         TU_EXPECT(strcmp(sg_backend_name((sg_backend)42), "?") == 0) &&
         TU_EXPECT(sg_status_str((sg_status)999) != NULL);
    /* Making tensors without a context returns NULL; there is nowhere to say why. */
    ok = ok && TU_EXPECT(sg_empty(NULL, SG_F32, 1, sh) == NULL) &&
         TU_EXPECT(sg_zeros(NULL, SG_F32, 1, sh) == NULL) &&
         TU_EXPECT(sg_full(NULL, SG_F32, 1, sh, 1.0) == NULL) &&
         TU_EXPECT(sg_from_host(NULL, SG_F32, 1, sh, two) == NULL);
    /* Tensor calls given NULL: ops return NULL, status calls SG_ERR_NULL. */
    float f[2];
    double v;
    ok = ok && TU_EXPECT(sg_neg(NULL) == NULL && sg_add(NULL, NULL) == NULL) &&
         TU_EXPECT(sg_transpose(NULL, 0, 1) == NULL && sg_clone(NULL) == NULL) &&
         TU_EXPECT(sg_read(NULL, f, sizeof f) == SG_ERR_NULL) &&
         TU_EXPECT(sg_write(NULL, f, sizeof f) == SG_ERR_NULL) &&
         TU_EXPECT(sg_item(NULL, &v) == SG_ERR_NULL) &&
         TU_EXPECT(sg_fill_(NULL, 1.0) == SG_ERR_NULL) &&
         TU_EXPECT(sg_copy_(NULL, NULL) == SG_ERR_NULL);
    tu_case(ok, "NULL_HANDLES(destroy/release/clear of NULL are no-ops; NULL in, NULL out)");
}

static void test_ctx_create(void) {
    sg_status s = sg_ctx_create(NULL, NULL);
    const char *m = sg_last_error(NULL);
    bool ok = TU_EXPECT(s == SG_ERR_NULL) && TU_EXPECT(strstr(m, "sg_ctx_create") != NULL) &&
              TU_EXPECT(strstr(m, "out") != NULL);
    tu_case(ok, "sg_ctx_create(NULL, NULL) -> SG_ERR_NULL (\"%s\")", m);

    sg_ctx *c = (sg_ctx *)&s; /* must come back NULL */
    s = sg_ctx_create(&(sg_ctx_opts){.backend = (sg_backend)42}, &c);
    m = sg_last_error(NULL);
    ok = TU_EXPECT(s == SG_ERR_INVALID_ARG) && TU_EXPECT(c == NULL) &&
         TU_EXPECT(strstr(m, "sg_ctx_create") != NULL) && TU_EXPECT(strstr(m, "42") != NULL);
    tu_case(ok, "sg_ctx_create(backend=42) -> SG_ERR_INVALID_ARG (\"%s\")", m);
}

/*
 * Naming a GPU backend on a machine (or a build) without it is
 * SG_ERR_BACKEND_UNAVAILABLE with the reason and the fix in
 * sg_last_error(NULL); AUTO then gives the CPU. Where a backend is present
 * (a GPU machine) the named context must really be of that backend.
 */
static void test_backends(void) {
    const sg_backend gpus[3] = {SG_BACKEND_CUDA, SG_BACKEND_HIP, SG_BACKEND_ZE};
    int present = 0;
    for (int i = 0; i < 3; i++) {
        sg_ctx *c = (sg_ctx *)&present; /* must come back NULL on failure */
        sg_status s = sg_ctx_create(&(sg_ctx_opts){.backend = gpus[i]}, &c);
        const char *name = sg_backend_name(gpus[i]);
        bool ok;
        if (s == SG_OK) {
            present++;
            ok = TU_EXPECT(c != NULL) && TU_EXPECT(sg_ctx_backend(c) == gpus[i]);
            sg_ctx_destroy(c);
            tu_case(ok, "sg_ctx_create(backend=%s) -> SG_OK (present)", name);
            continue;
        }
        const char *m = sg_last_error(NULL);
        ok = TU_EXPECT(s == SG_ERR_BACKEND_UNAVAILABLE) && TU_EXPECT(c == NULL) &&
             TU_EXPECT(strstr(m, name) != NULL) && TU_EXPECT(strstr(m, "SG_BACKEND_") != NULL);
        tu_case(ok, "sg_ctx_create(backend=%s) -> SG_ERR_BACKEND_UNAVAILABLE (\"%s\")", name, m);
    }
    sg_ctx *c = NULL;
    sg_status s = sg_ctx_create(&(sg_ctx_opts){.backend = SG_BACKEND_AUTO}, &c);
    bool ok = TU_EXPECT(s == SG_OK) && TU_EXPECT(c != NULL) &&
              TU_EXPECT(sg_ctx_backend(c) != SG_BACKEND_AUTO) &&
              TU_EXPECT(present > 0 || sg_ctx_backend(c) == SG_BACKEND_CPU) &&
              TU_EXPECT(sg_ctx_status(c) == SG_OK) && TU_EXPECT(still_works(c));
    tu_case(ok, "sg_ctx_create(backend=auto) -> %s", sg_backend_name(sg_ctx_backend(c)));
    sg_ctx_destroy(c);
    s = sg_ctx_create(NULL, &c);
    ok = TU_EXPECT(s == SG_OK) && TU_EXPECT(c != NULL) && TU_EXPECT(still_works(c));
    tu_case(ok, "sg_ctx_create(NULL opts) -> SG_OK");
    sg_ctx_destroy(c);
}

/* ------------------------------------------------------------ making tensors */

static void test_creation(void) {
    int64_t sh2[2] = {2, 3}, neg[2] = {2, -3}, sh7[7] = {1, 1, 1, 1, 1, 1, 1};
    int64_t huge[3] = {INT64_MAX / 4, 4, 4};
    float data[6] = {0};
    OP_FAILS(ctx, sg_empty(ctx, (sg_dtype)42, 2, sh2), SG_ERR_DTYPE, "sg_empty", "not a dtype");
    OP_FAILS(ctx, sg_empty(ctx, (sg_dtype)-1, 2, sh2), SG_ERR_DTYPE, "sg_empty", "not a dtype");
    OP_FAILS(ctx, sg_zeros(ctx, (sg_dtype)6, 2, sh2), SG_ERR_DTYPE, "sg_zeros", "not a dtype");
    OP_FAILS(ctx, sg_full(ctx, (sg_dtype)6, 2, sh2, 1.0), SG_ERR_DTYPE, "sg_full", "not a dtype");
    OP_FAILS(ctx, sg_from_host(ctx, (sg_dtype)9, 2, sh2, data), SG_ERR_DTYPE, "sg_from_host",
             "not a dtype");
    OP_FAILS(ctx, sg_empty(ctx, SG_F32, 2, neg), SG_ERR_SHAPE, "sg_empty", "negative");
    OP_FAILS(ctx, sg_zeros(ctx, SG_BF16, 2, neg), SG_ERR_SHAPE, "sg_zeros", "negative");
    OP_FAILS(ctx, sg_empty(ctx, SG_F32, 7, sh7), SG_ERR_SHAPE, "sg_empty", "ndim 7");
    OP_FAILS(ctx, sg_empty(ctx, SG_F32, -1, sh2), SG_ERR_SHAPE, "sg_empty", "ndim -1");
    OP_FAILS(ctx, sg_from_host(ctx, SG_F32, 7, sh7, data), SG_ERR_SHAPE, "sg_from_host", "ndim 7");
    OP_FAILS(ctx, sg_empty(ctx, SG_F32, 2, NULL), SG_ERR_NULL, "sg_empty", "shape is NULL");
    OP_FAILS(ctx, sg_full(ctx, SG_I32, 2, NULL, 3.0), SG_ERR_NULL, "sg_full", "shape is NULL");
    OP_FAILS(ctx, sg_from_host(ctx, SG_F32, 2, sh2, NULL), SG_ERR_NULL, "sg_from_host", "NULL");
    OP_FAILS(ctx, sg_empty(ctx, SG_F32, 3, huge), SG_ERR_OOM, "sg_empty", "too large");

    /* The edges that are valid: a scalar needs no shape, a size 0 is empty. */
    int64_t zero[2] = {0, 5};
    sg_tensor *s = sg_empty(ctx, SG_F32, 0, NULL);
    sg_tensor *e = sg_from_host(ctx, SG_I64, 2, zero, NULL);
    sg_tensor *f = sg_full(ctx, SG_BOOL, 6, (int64_t[6]){1, 1, 1, 1, 1, 2}, 1.0);
    bool ok = TU_EXPECT(s && sg_tensor_ndim(s) == 0 && sg_tensor_numel(s) == 1) &&
              TU_EXPECT(e && sg_tensor_numel(e) == 0) && TU_EXPECT(sg_read(e, NULL, 0) == SG_OK) &&
              TU_EXPECT(sg_write(e, NULL, 0) == SG_OK) && TU_EXPECT(f && sg_tensor_ndim(f) == 6) &&
              TU_EXPECT(sg_ctx_status(ctx) == SG_OK);
    tu_case(ok, "VALID_EDGES(scalar without shape, empty without data, 6 dims)");
    sg_release(s), sg_release(e), sg_release(f);
}

/* ------------------------------------------------------------ host transfer */

static void test_transfer(void) {
    int64_t sh[2] = {2, 3};
    float buf[6] = {1, 2, 3, 4, 5, 6};
    double v;
    sg_tensor *x = sg_from_host(ctx, SG_F32, 2, sh, buf);
    sg_tensor *xt = sg_transpose(x, 0, 1);
    CALL_FAILS(ctx, sg_read(x, buf, 20), SG_ERR_INVALID_ARG, "sg_read", "24 bytes");
    CALL_FAILS(ctx, sg_read(xt, buf, 48), SG_ERR_INVALID_ARG, "sg_read", "24 bytes");
    CALL_FAILS(ctx, sg_write(x, buf, 4), SG_ERR_INVALID_ARG, "sg_write", "24 bytes");
    CALL_FAILS(ctx, sg_read(x, NULL, 24), SG_ERR_NULL, "sg_read", "NULL");
    CALL_FAILS(ctx, sg_write(xt, NULL, 24), SG_ERR_NULL, "sg_write", "NULL");
    CALL_FAILS(ctx, sg_item(x, &v), SG_ERR_SHAPE, "sg_item", "6 elements");
    CALL_FAILS(ctx, sg_tensor_shape(x, NULL), SG_ERR_NULL, "sg_tensor_shape", "NULL");
    /* An expanded view repeats elements: there is no one place to write each value. */
    sg_tensor *ex = sg_expand(sg_slice(x, 0, 0, 1, 1), 2, sh);
    CALL_FAILS(ctx, sg_write(ex, buf, sizeof buf), SG_ERR_INVALID_ARG, "sg_write", "expanded");
    sg_tensor *one = sg_full(ctx, SG_F16, 2, (int64_t[2]){1, 1}, 1.5);
    CALL_FAILS(ctx, sg_item(one, NULL), SG_ERR_NULL, "sg_item", "NULL");
    bool ok = TU_EXPECT(sg_item(one, &v) == SG_OK) && TU_EXPECT(v == 1.5);
    tu_case(ok, "sg_item(f16[1,1]) -> 1.5");
    sg_release(x), sg_release(xt), sg_release(one), sg_release(ex);
}

/* ------------------------------------------------------------ views */

static void test_views(void) {
    int64_t sh[2] = {2, 3};
    sg_tensor *x23 = sg_zeros(ctx, SG_F32, 2, sh);
    int64_t bad_count[2] = {4, 2}, two_infer[2] = {-1, -1}, neg[2] = {-2, 3};
    int64_t sh7[7] = {1, 1, 1, 1, 1, 2, 3}, wider[2] = {4, 3}, fewer[1] = {3};
    int dup[2] = {0, 0}, far[2] = {0, 2};
    OP_FAILS(ctx, sg_transpose(x23, 0, 2), SG_ERR_INDEX, "sg_transpose", "range");
    OP_FAILS(ctx, sg_transpose(x23, -3, 1), SG_ERR_INDEX, "sg_transpose", "range");
    OP_FAILS(ctx, sg_permute(x23, dup), SG_ERR_INDEX, "sg_permute", "permutation");
    OP_FAILS(ctx, sg_permute(x23, far), SG_ERR_INDEX, "sg_permute", "permutation");
    OP_FAILS(ctx, sg_permute(x23, NULL), SG_ERR_NULL, "sg_permute", "NULL");
    OP_FAILS(ctx, sg_slice(x23, 2, 0, 1, 1), SG_ERR_INDEX, "sg_slice", "out of range");
    OP_FAILS(ctx, sg_slice(x23, -3, 0, 1, 1), SG_ERR_INDEX, "sg_slice", "out of range");
    OP_FAILS(ctx, sg_slice(x23, 1, 0, 3, 0), SG_ERR_INVALID_ARG, "sg_slice", "step 0");
    OP_FAILS(ctx, sg_narrow(x23, 1, 2, 2), SG_ERR_INDEX, "sg_narrow", "do not fit");
    OP_FAILS(ctx, sg_narrow(x23, 5, 0, 1), SG_ERR_INDEX, "sg_narrow", "dims run from -2 to 1");
    OP_FAILS(ctx, sg_squeeze(x23, 2), SG_ERR_INDEX, "sg_squeeze", "out of range");
    OP_FAILS(ctx, sg_squeeze(x23, 0), SG_ERR_SHAPE, "sg_squeeze", "not of size 1");
    OP_FAILS(ctx, sg_unsqueeze(x23, 3), SG_ERR_INDEX, "sg_unsqueeze", "out of range");
    OP_FAILS(ctx, sg_unsqueeze(x23, -4), SG_ERR_INDEX, "sg_unsqueeze", "out of range");
    OP_FAILS(ctx, sg_reshape(x23, 2, bad_count), SG_ERR_SHAPE, "sg_reshape", "cannot take shape");
    OP_FAILS(ctx, sg_reshape(x23, 2, two_infer), SG_ERR_SHAPE, "sg_reshape", "one may be -1");
    OP_FAILS(ctx, sg_view(x23, 2, neg), SG_ERR_SHAPE, "sg_view", "size -2");
    OP_FAILS(ctx, sg_view(x23, 7, sh7), SG_ERR_SHAPE, "sg_view", "ndim 7");
    OP_FAILS(ctx, sg_reshape(x23, 2, NULL), SG_ERR_NULL, "sg_reshape", "NULL");
    OP_FAILS(ctx, sg_expand(x23, 2, wider), SG_ERR_SHAPE, "sg_expand", "only size-1 dims stretch");
    OP_FAILS(ctx, sg_expand(x23, 1, fewer), SG_ERR_SHAPE, "sg_expand", "at least as many dims");
    OP_FAILS(ctx, sg_expand(x23, 7, sh7), SG_ERR_SHAPE, "sg_expand", "7 dims");
    OP_FAILS(ctx, sg_expand(x23, 2, NULL), SG_ERR_NULL, "sg_expand", "NULL");
    /* Sizes near INT64_MAX must fail (or work) without overflowing anything. */
    int64_t big[2] = {INT64_C(1) << 62, 4}, big3[3] = {-1, INT64_C(1) << 62, 4};
    int64_t huge[2] = {INT64_C(1) << 62, INT64_C(1) << 62};
    sg_tensor *one = sg_zeros(ctx, SG_F32, 1, (int64_t[1]){1});
    OP_FAILS(ctx, sg_view(x23, 2, big), SG_ERR_SHAPE, "sg_view", "cannot take shape");
    OP_FAILS(ctx, sg_reshape(x23, 3, big3), SG_ERR_SHAPE, "sg_reshape", "cannot take shape");
    OP_FAILS(ctx, sg_expand(one, 2, huge), SG_ERR_SHAPE, "sg_expand", "2^63 elements");
    OP_FAILS(ctx, sg_narrow(x23, 1, INT64_MAX, 2), SG_ERR_INDEX, "sg_narrow", "do not fit");
    sg_tensor *s1 = sg_slice(x23, 1, 1, INT64_MAX, INT64_MAX);
    sg_tensor *s0 = sg_slice(x23, -1, INT64_MIN, INT64_MIN + 1, 1);
    bool ok = TU_EXPECT(s1 && sg_tensor_size(s1, 1) == 1) &&
              TU_EXPECT(s0 && sg_tensor_size(s0, 1) == 0) && TU_EXPECT(sg_ctx_status(ctx) == SG_OK);
    tu_case(ok, "sg_slice(x23, 1, 1, INT64_MAX, INT64_MAX) -> [2,1]; "
                "sg_slice(x23, -1, INT64_MIN, INT64_MIN + 1, 1) -> [2,0]");
    sg_release(one), sg_release(s1), sg_release(s0);
    /* A 6-d tensor has no room for another dim. */
    sg_tensor *x6 = sg_zeros(ctx, SG_F32, 6, (int64_t[6]){1, 1, 1, 1, 2, 3});
    OP_FAILS(ctx, sg_unsqueeze(x6, 0), SG_ERR_INDEX, "sg_unsqueeze", "6-d");
    sg_release(x23), sg_release(x6);
}

/* ------------------------------------------------------------ pointwise */

static void test_pointwise(void) {
    int64_t s23[2] = {2, 3}, s4[1] = {4}, s3[1] = {3}, s2[1] = {2};
    sg_tensor *x23 = sg_full(ctx, SG_F32, 2, s23, 0.5), *x4 = sg_full(ctx, SG_F32, 1, s4, 1.0);
    sg_tensor *h3 = sg_full(ctx, SG_F16, 1, s3, 1.0), *f3 = sg_full(ctx, SG_F32, 1, s3, 2.0);
    sg_tensor *i3 = sg_full(ctx, SG_I32, 1, s3, 2.0), *b3 = sg_full(ctx, SG_BOOL, 1, s3, 1.0);
    sg_tensor *b23 = sg_full(ctx, SG_BOOL, 2, s23, 0.0), *f2 = sg_full(ctx, SG_F32, 1, s2, 1.0);
    OP_FAILS(ctx, sg_add(x23, x4), SG_ERR_SHAPE, "add", "do not broadcast");
    OP_FAILS(ctx, sg_mul(x4, x23), SG_ERR_SHAPE, "mul", "do not broadcast");
    OP_FAILS(ctx, sg_where(b23, f3, f2), SG_ERR_SHAPE, "where", "do not broadcast");
    OP_FAILS(ctx, sg_add(f3, h3), SG_ERR_DTYPE, "sg_add", "dtypes differ");
    OP_FAILS(ctx, sg_lt(f3, i3), SG_ERR_DTYPE, "sg_lt", "dtypes differ");
    OP_FAILS(ctx, sg_sin(i3), SG_ERR_DTYPE, "sg_sin", "sg_cast");
    OP_FAILS(ctx, sg_gelu_tanh(b3), SG_ERR_DTYPE, "sg_gelu_tanh", "sg_cast");
    OP_FAILS(ctx, sg_relu(b3), SG_ERR_DTYPE, "sg_relu", "bool");
    OP_FAILS(ctx, sg_div(i3, i3), SG_ERR_DTYPE, "sg_div", "i32");
    OP_FAILS(ctx, sg_add(b3, b3), SG_ERR_DTYPE, "sg_add", "bool");
    OP_FAILS(ctx, sg_pow_scalar(i3, 2.0), SG_ERR_DTYPE, "sg_pow_scalar", "i32");
    OP_FAILS(ctx, sg_mul_scalar(b3, 2.0), SG_ERR_DTYPE, "sg_mul_scalar", "bool");
    OP_FAILS(ctx, sg_where(f3, f3, f3), SG_ERR_DTYPE, "sg_where", "cond");
    OP_FAILS(ctx, sg_where(b3, f3, h3), SG_ERR_DTYPE, "sg_where", "differ");
    OP_FAILS(ctx, sg_cast(f3, (sg_dtype)99), SG_ERR_DTYPE, "sg_cast", "not a dtype");
    OP_FAILS(ctx, sg_clamp(f3, 1.0, -1.0), SG_ERR_INVALID_ARG, "sg_clamp", "above");

    /* In place: dst keeps its shape, its elements may not repeat, dtypes must agree for add_. */
    sg_tensor *ex = sg_expand(f3, 2, s23);
    CALL_FAILS(ctx, sg_fill_(ex, 1.0), SG_ERR_INVALID_ARG, "sg_fill_", "expanded");
    CALL_FAILS(ctx, sg_copy_(ex, x23), SG_ERR_INVALID_ARG, "sg_copy_", "expanded");
    CALL_FAILS(ctx, sg_copy_(f3, x23), SG_ERR_SHAPE, "sg_copy_", "cannot change");
    CALL_FAILS(ctx, sg_copy_(x23, x4), SG_ERR_SHAPE, "copy_", "do not broadcast");
    CALL_FAILS(ctx, sg_add_(f3, i3), SG_ERR_DTYPE, "sg_add_", "share a numeric dtype");
    CALL_FAILS(ctx, sg_add_(x23, x4), SG_ERR_SHAPE, "add_", "do not broadcast");
    sg_release(x23), sg_release(x4), sg_release(h3), sg_release(f3), sg_release(i3);
    sg_release(b3), sg_release(b23), sg_release(f2), sg_release(ex);
}

/*
 * An expression with a failure in the middle: the ops after it return NULL
 * without a message of their own, so the end of the chain is NULL and the
 * message is the first (only) failure's. With two failures, the status is
 * the first one's and the text the newest one's, as the header documents.
 */
static void test_chains(void) {
    int64_t s4[1] = {4};
    sg_tensor *x = sg_full(ctx, SG_F32, 1, s4, 0.25), *i = sg_full(ctx, SG_I32, 1, s4, 1.0);
    snap before = take_snap(ctx);
    sg_tensor *s = sg_sin(x);
    sg_tensor *bad = sg_add(s, i);        /* fails: dtypes differ */
    sg_tensor *m = sg_mul_scalar(bad, 2); /* NULL in, NULL out */
    sg_tensor *y = sg_tanh(sg_neg(m));    /* and again */
    sg_tensor *z = sg_add(x, y);          /* a NULL second input too */
    size_t live_s = 0;
    sg_ctx_host_bytes(ctx, &live_s, NULL);
    bool ok = TU_EXPECT(s != NULL) && TU_EXPECT(bad == NULL && m == NULL && y == NULL && !z) &&
              TU_EXPECT(logged.nerror == before.nerror + 1);
    before.nerror = logged.nerror - 1;
    before.live = live_s; /* s is still held; the failures added nothing */
    ok = check_failure(ctx, before, sg_ctx_status(ctx), SG_ERR_DTYPE, "sg_add", "dtypes differ") &&
         ok;
    tu_case(ok, "CHAIN(add(sin(x:f32), i:i32) then mul_scalar, neg, tanh, add) -> NULL, "
                "SG_ERR_DTYPE from sg_add");
    sg_release(s);

    /* Two failures: the first one's status, the second one's text. */
    int n = logged.nerror;
    sg_tensor *a = sg_sin(i);             /* SG_ERR_DTYPE */
    sg_tensor *b = sg_transpose(x, 0, 3); /* SG_ERR_INDEX */
    ok = TU_EXPECT(a == NULL && b == NULL) && TU_EXPECT(sg_ctx_status(ctx) == SG_ERR_DTYPE) &&
         TU_EXPECT(strstr(sg_last_error(ctx), "sg_transpose") != NULL) &&
         TU_EXPECT(logged.nerror == n + 2);
    sg_clear_error(ctx);
    ok = ok && TU_EXPECT(sg_ctx_status(ctx) == SG_OK) && TU_EXPECT(still_works(ctx));
    tu_case(ok,
            "STICKY(sin(i32) then transpose(x,0,3)) -> status SG_ERR_DTYPE, text of the second");
    sg_release(x), sg_release(i);
}

/* ------------------------------------------------------------ contexts and lifetimes */

static void test_wrong_context(void) {
    sg_ctx *other = NULL;
    if (sg_ctx_create(&(sg_ctx_opts){.backend = SG_BACKEND_CPU}, &other) != SG_OK) {
        tu_case(false, "WRONG_CONTEXT(second context could not be made: %s)", sg_last_error(NULL));
        return;
    }
    int64_t s3[1] = {3};
    sg_tensor *a = sg_full(ctx, SG_F32, 1, s3, 1.0), *b = sg_full(other, SG_F32, 1, s3, 2.0);
    sg_tensor *c = sg_full(ctx, SG_BOOL, 1, s3, 1.0);
    OP_FAILS(ctx, sg_add(a, b), SG_ERR_WRONG_CONTEXT, "add", "another context");
    OP_FAILS(ctx, sg_where(c, a, b), SG_ERR_WRONG_CONTEXT, "where", "another context");
    CALL_FAILS(ctx, sg_copy_(a, b), SG_ERR_WRONG_CONTEXT, "copy_", "another context");
    /* The failure lands on the context of the first input; the other one is untouched. */
    bool ok = TU_EXPECT(sg_ctx_status(other) == SG_OK);
    OP_FAILS(other, sg_mul(b, a), SG_ERR_WRONG_CONTEXT, "mul", "another context");
    ok = ok && TU_EXPECT(sg_ctx_status(ctx) == SG_OK);
    tu_case(ok, "WRONG_CONTEXT(the other context keeps its status)");
    sg_release(a), sg_release(b), sg_release(c);
    sg_ctx_destroy(other);
}

static void test_released(void) {
    int64_t s23[2] = {2, 3};
    float buf[6] = {0};
    double v;
    char d[32];
    sg_tensor *x = sg_full(ctx, SG_F32, 2, s23, 1.0), *y = sg_full(ctx, SG_F32, 2, s23, 2.0);
    sg_tensor *sc = sg_full(ctx, SG_F32, 0, NULL, 3.0);
    sg_release(x);
    sg_release(sc);
    CALL_FAILS(ctx, sg_read(x, buf, sizeof buf), SG_ERR_RELEASED, "sg_read", "released");
    CALL_FAILS(ctx, sg_write(x, buf, sizeof buf), SG_ERR_RELEASED, "sg_write", "released");
    CALL_FAILS(ctx, sg_item(sc, &v), SG_ERR_RELEASED, "sg_item", "released");
    CALL_FAILS(ctx, sg_fill_(x, 0.0), SG_ERR_RELEASED, "fill_", "released");
    CALL_FAILS(ctx, sg_copy_(y, x), SG_ERR_RELEASED, "copy_", "input 1");
    CALL_FAILS(ctx, sg_tensor_shape(x, (int64_t[SG_MAX_DIMS]){0}), SG_ERR_RELEASED,
               "sg_tensor_shape", "released");
    OP_FAILS(ctx, sg_neg(x), SG_ERR_RELEASED, "neg", "released");
    OP_FAILS(ctx, sg_add(y, x), SG_ERR_RELEASED, "add", "input 1");
    OP_FAILS(ctx, sg_slice(x, 0, 0, 1, 1), SG_ERR_RELEASED, "sg_slice", "released");
    OP_FAILS(ctx, sg_transpose(x, 0, 1), SG_ERR_RELEASED, "sg_transpose", "released");
    OP_FAILS(ctx, sg_reshape(x, 1, (int64_t[1]){6}), SG_ERR_RELEASED, "sg_reshape", "released");
    OP_FAILS(ctx, sg_clone(x), SG_ERR_RELEASED, "sg_clone", "released");
    /* Facts about a released tensor read as for NULL; releasing again is harmless. */
    sg_release(x);
    bool ok = TU_EXPECT(sg_tensor_numel(x) == 0 && sg_tensor_ctx(x) == NULL) &&
              TU_EXPECT(strcmp(sg_tensor_describe(x, d, sizeof d), "released") == 0) &&
              TU_EXPECT(sg_ctx_status(ctx) == SG_OK) && TU_EXPECT(still_works(ctx));
    tu_case(ok, "RELEASED(facts read as NULL, second release harmless)");
    sg_release(y);
}

/* ------------------------------------------------------------ logging */

/* Without a hook, SG_LOGS=error sends failures to stderr, and nothing else does. */
static bool stderr_of_failure(const char *sg_logs, char *out, size_t size) {
    if (sg_logs)
        setenv("SG_LOGS", sg_logs, 1);
    else
        unsetenv("SG_LOGS");
    sg_ctx *c = NULL;
    if (sg_ctx_create(&(sg_ctx_opts){.backend = SG_BACKEND_CPU}, &c) != SG_OK) return false;
    FILE *cap = tmpfile();
    if (!cap) return false;
    fflush(stderr);
    int saved = dup(fileno(stderr));
    dup2(fileno(cap), fileno(stderr));
    sg_tensor *t = sg_transpose(sg_zeros(c, SG_F32, 1, (int64_t[1]){2}), 0, 5);
    fflush(stderr);
    dup2(saved, fileno(stderr));
    close(saved);
    rewind(cap);
    size_t n = fread(out, 1, size - 1, cap);
    out[n] = '\0';
    fclose(cap);
    sg_ctx_destroy(c);
    unsetenv("SG_LOGS");
    return t == NULL;
}

static void test_logging(void) {
    /* The hook of ctx has seen every failure so far, and only "error" lines. */
    bool ok = TU_EXPECT(logged.nerror > 50) && TU_EXPECT(logged.nother == 0);
    tu_case(ok, "LOG_HOOK(%d error lines, %d others)", logged.nerror, logged.nother);

    char out[2048];
    ok = TU_EXPECT(stderr_of_failure("error", out, sizeof out)) &&
         TU_EXPECT(strstr(out, "[stepgraph error] sg_transpose") != NULL);
    tu_case(ok, "SG_LOGS=error prints failures to stderr");
    ok = TU_EXPECT(stderr_of_failure("fallbacks,guards", out, sizeof out)) &&
         TU_EXPECT(out[0] == '\0');
    tu_case(ok, "SG_LOGS=fallbacks,guards prints no error lines");
    ok = TU_EXPECT(stderr_of_failure(NULL, out, sizeof out)) && TU_EXPECT(out[0] == '\0');
    tu_case(ok, "SG_LOGS unset prints nothing");
}

int main(void) {
    unsetenv("SG_LOGS");
    sg_ctx_opts opts = {.backend = SG_BACKEND_CPU, .log = log_hook};
    if (sg_ctx_create(&opts, &ctx) != SG_OK) {
        fprintf(stderr, "sg_ctx_create: %s\n", sg_last_error(NULL));
        return 1;
    }
    test_no_ops_on_null();
    test_ctx_create();
    test_backends();
    test_creation();
    test_transfer();
    test_views();
    test_pointwise();
    test_chains();
    test_wrong_context();
    test_released();
    test_logging();
    sg_ctx_destroy(ctx);
    return tu_finish();
}

/*
 * Bad input of the op families that are being written elsewhere; each
 * family's own test (tests/test_capture_<family>.c) checks these with the
 * same rigor as above (status, message naming the op and the problem,
 * sticky status, context usable after):
 *
 *  reductions (sum, mean, max, min, var, argmax):
 *   - a dim out of range or repeated in dims; ndims > ndim; dims NULL with ndims > 0
 *   - mean/var of ints (SG_ERR_DTYPE); sum/max/min of bool
 *   - max/min over an empty range (SG_ERR_SHAPE); var with correction >= count
 *   - argmax with a dim out of range, and of an empty tensor
 *  rows (softmax, log_softmax, layer_norm, rms_norm, cross_entropy):
 *   - softmax of ints; a dim out of range
 *   - layer_norm/rms_norm weight or bias not 1-d of the last dim's size, or of another dtype
 *   - eps < 0 or NaN
 *   - cross_entropy: logits not 2-d, targets not 1-d of N, targets not i32/i64, a target
 *     out of [0, C) (found while running: SG_ERR_INDEX naming the row)
 *  matmul (matmul, linear):
 *   - K mismatch (SG_ERR_SHAPE naming both shapes), batch dims that do not broadcast
 *   - int or bool operands, operands of two dtypes
 *   - 0-d operands; linear with w not 2-d, b not 1-d of N
 *  data movement (embedding, index_select, concat, index_copy_, arange, sdpa):
 *   - embedding/index_select idx not i32/i64, an index out of range (found while running)
 *   - concat: n < 1, ts NULL, a NULL entry, sizes that differ off dim, dtypes that differ
 *   - index_copy_: src shape not dst's with idx's length at dim, repeated indices
 *   - arange: step 0, a NaN or infinite bound, a length that overflows, an int dtype with
 *     a fractional step
 *   - sdpa: q/k/v with different D, k/v with different Lk, a mask that does not broadcast
 *     or is neither bool nor q's dtype
 */
