/* SPDX-License-Identifier: MIT */
/*
 * test_graphs_growth.c -- nothing a fn leaves behind grows with history:
 * 20,000 sg_compile + sg_call + sg_fn_destroy cycles (captures replayed op
 * by op, SG_CODEGEN=0, so that the capture and the plan are what is timed),
 * and 3,000 sg_fn_reset + recapture cycles of one fn through generated
 * code, each at flat time per 1,000 and flat host
 * bytes (destroyed fn records and pool block records are reclaimed); and
 * cleanup in any order before sg_ctx_destroy is clean (the ASan build runs
 * this test too), with a call of a recently destroyed fn reported.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime, setenv */
#include "testutil.h"

#include <math.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* y = exp(x) - 1 */
static sg_status step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)user;
    out[0] = sg_add_scalar(sg_exp(in[0]), -1.0);
    return out[0] ? SG_OK : sg_ctx_status(c);
}

static bool check(sg_tensor *y, const double *xv, int64_t n) {
    double *got = tu_read(y), ref[64];
    for (int64_t i = 0; i < n; i++) ref[i] = exp(xv[i]) - 1.0;
    bool ok = got && tu_close("expm1", got, ref, n, tu_rtol(SG_F32), tu_atol(SG_F32));
    free(got);
    return ok;
}

/* blocks x 1000 cycles of `cycle`; flat time (last vs first block after
 * the first) and flat host bytes (after the first block vs the end). */
static bool flat(const char *name, int blocks, bool (*cycle)(sg_ctx *, sg_tensor *, sg_fn **),
                 sg_ctx *ctx, sg_tensor *x, sg_fn **fn) {
    /* The fastest of the early and of the late blocks (three of each when
     * there are enough): a block slowed by other processes says nothing. */
    int n = blocks >= 7 ? 3 : 1;
    double t1 = 1e30, tl = 1e30, t0 = now_s();
    size_t b1 = 0, bl = 0;
    bool ok = true;
    for (int b = 0; ok && b < blocks; b++) {
        double tb = now_s();
        for (int i = 0; ok && i < 1000; i++) ok = TU_EXPECT(cycle(ctx, x, fn));
        double dt = now_s() - tb;
        if (b == 1) sg_ctx_host_bytes(ctx, &b1, NULL);
        if (b == blocks - 1) sg_ctx_host_bytes(ctx, &bl, NULL);
        if (b >= 1 && b <= n && dt < t1) t1 = dt;
        if (b >= blocks - n && dt < tl) tl = dt;
        if (b > n && dt > 50 * t1 + 1.0) ok = TU_EXPECT(!"time per 1000 cycles grew");
        if (now_s() - t0 > 240) ok = TU_EXPECT(!"the cycles took over 4 minutes");
    }
    ok = ok && TU_EXPECT(tl < 3 * t1 + 0.05) && TU_EXPECT(bl == b1);
    tu_case(ok, "%s(%d x 1000 cycles: early 1k %.3fs, late 1k %.3fs; host bytes %zu -> %zu)", name,
            blocks, t1, tl, b1, bl);
    return ok;
}

static bool compile_cycle(sg_ctx *ctx, sg_tensor *x, sg_fn **keep) {
    (void)keep;
    sg_fn *fn;
    sg_tensor *y;
    bool ok =
        sg_compile(ctx, step, NULL, 1, 1, NULL, &fn) == SG_OK && sg_call(fn, &x, 1, &y, 1) == SG_OK;
    sg_fn_destroy(fn);
    return ok;
}

static bool reset_cycle(sg_ctx *ctx, sg_tensor *x, sg_fn **fn) {
    (void)ctx;
    sg_tensor *y;
    return sg_fn_reset(*fn) == SG_OK && sg_call(*fn, &x, 1, &y, 1) == SG_OK;
}

static void test_growth(void) {
    sg_ctx *ctx = tu_ctx((sg_ctx_opts){0});
    int64_t shape[1] = {16};
    double *xv;
    sg_tensor *x = tu_rand(ctx, SG_F32, 1, shape, -1, 1, &xv), *y;
    setenv("SG_CODEGEN", "0", 1);
    flat("COMPILE_DESTROY", 20, compile_cycle, ctx, x, NULL);
    unsetenv("SG_CODEGEN");
    sg_fn *fn;
    sg_compile(ctx, step, NULL, 1, 1, &(sg_compile_opts){.mode = SG_MODE_REDUCE_OVERHEAD}, &fn);
    flat("RESET_RECAPTURE", 3, reset_cycle, ctx, x, &fn);
    bool ok = TU_EXPECT(sg_call(fn, &x, 1, &y, 1) == SG_OK) && TU_EXPECT(check(y, xv, 16));
    tu_case(ok, "RESET_RECAPTURE(result after 3000 recaptures)");
    sg_fn_destroy(fn);
    free(xv);
    sg_ctx_destroy(ctx);
}

/* Every order of cleanup before sg_ctx_destroy is clean. */
static void test_cleanup_orders(void) {
    for (int order = 0; order < 4; order++) {
        tu_alloc a = {0};
        sg_ctx *ctx = tu_ctx((sg_ctx_opts){.alloc = tu_alloc_hook, .alloc_user = &a});
        int64_t shape[1] = {16};
        double *xv;
        sg_tensor *x = tu_rand(ctx, SG_F32, 1, shape, -1, 1, &xv), *y;
        sg_fn *fn;
        sg_compile(ctx, step, NULL, 1, 1, NULL, &fn);
        bool ok = TU_EXPECT(sg_call(fn, &x, 1, &y, 1) == SG_OK) && TU_EXPECT(check(y, xv, 16));
        sg_tensor *v = sg_slice(y, 0, 0, 8, 1), *c = sg_clone(y);
        switch (order) {
        case 0: /* fn first, then its output, the view and the input */
            sg_fn_destroy(fn);
            sg_release(y), sg_release(v), sg_release(x), sg_release(c);
            break;
        case 1: /* input and output first, fn last */
            sg_release(x), sg_release(y);
            ok = ok && TU_EXPECT(check(v, xv, 8));
            sg_release(v), sg_fn_destroy(fn), sg_release(c);
            break;
        case 2: { /* a destroyed fn called, its view read: errors, not crashes */
            sg_fn_destroy(fn);
            sg_tensor *z;
            float buf[8];
            ok = ok && TU_EXPECT(sg_call(fn, &x, 1, &z, 1) == SG_ERR_RELEASED) &&
                 TU_EXPECT(sg_read(v, buf, sizeof buf) == SG_ERR_STALE_OUTPUT) &&
                 TU_EXPECT(check(c, xv, 16));
            sg_clear_error(ctx);
            break;
        }
        default: /* everything left to sg_ctx_destroy */ break;
        }
        sg_ctx_destroy(ctx);
        ok = ok && TU_EXPECT(a.live == 0 && a.bytes == 0);
        tu_case(ok, "CLEANUP(order=%d, then sg_ctx_destroy: %ld blocks left)", order, a.live);
        free(xv);
    }
}

int main(void) {
    tu_seed(17);
    test_growth();
    test_cleanup_orders();
    return tu_finish();
}
