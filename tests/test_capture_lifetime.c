/* SPDX-License-Identifier: MIT */
/*
 * test_capture_lifetime.c -- handles outliving their context (capture/
 * registry.c). A "world" is a context with an allocator hook, a tensor from
 * the host, an op's output, a view, and a compiled fn called once (its
 * output handle too); every value is checked against an f64 reference.
 * Then, per case:
 *  - destroyed first: sg_release of every tensor, sg_call, sg_fn_explain
 *    and sg_fn_destroy of the fn, and a second sg_ctx_destroy read nothing
 *    of the freed handles (ASan in CI would say otherwise) and return
 *    SG_ERR_INVALID_ARG with a message in sg_last_error(NULL) that names
 *    the call and says the context was destroyed;
 *  - in order: every release and the destroy return SG_OK; again:
 *    SG_ERR_RELEASED and the context's status untouched; calling the
 *    destroyed fn: SG_ERR_RELEASED;
 *  - two contexts: destroying one leaves the other's tensors and fn as
 *    they were (the fn's next call after a free takes the slow path);
 *  - an optimizer and a communicator: destroyed after their context (which
 *    freed them: the hook is empty), sg_optim_destroy and sg_comm_destroy
 *    read nothing; destroyed before it, they free what they hold;
 *  - NULL everywhere;
 *  - 400 cycles of both orders: the hook holds no block after each destroy
 *    and the process's heap does not grow from cycle 40 to cycle 400.
 * Stale handles are released before anything new is allocated: an address
 * the allocator gives to a new handle names that handle (see registry.c).
 */
#define _GNU_SOURCE /* mallinfo2 */

#include "testutil.h"

#include <malloc.h>
#include <math.h>
#include <string.h>

enum { N = 37 };

static sg_status affine_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)user;
    out[0] = sg_add_scalar(sg_mul_scalar(in[0], 2.0), 1.0);
    return out[0] ? SG_OK : sg_ctx_status(c);
}

typedef struct world {
    tu_alloc hook;
    sg_ctx *ctx;
    sg_tensor *x, *y, *view, *out; /* x from the host, y = sin(x), view of y, out = fn(x) */
    sg_fn *fn;
    double xs[N];
} world;

/* Make a world and check its values; false (said) if anything is off. */
static bool world_make(world *w, sg_mode mode) {
    memset(w, 0, sizeof *w);
    sg_ctx_opts o = {.backend = tu_backend(), .alloc = tu_alloc_hook, .alloc_user = &w->hook};
    w->ctx = tu_ctx(o);
    int64_t shape[1] = {N}, two[2] = {1, N};
    float xf[N];
    for (int i = 0; i < N; i++) xf[i] = (float)tu_uniform(-3, 3), w->xs[i] = xf[i];
    w->x = sg_from_host(w->ctx, SG_F32, 1, shape, xf);
    w->y = sg_sin(w->x);
    w->view = sg_reshape(w->y, 2, two);
    sg_compile_opts co = {.mode = mode};
    bool ok = TU_EXPECT(w->view != NULL) &&
              TU_EXPECT(sg_compile(w->ctx, affine_step, NULL, 1, 1, &co, &w->fn) == SG_OK) &&
              TU_EXPECT(sg_call(w->fn, &w->x, 1, &w->out, 1) == SG_OK);
    if (!ok) {
        fprintf(stderr, "  %s\n", sg_last_error(w->ctx));
        return false;
    }
    double *gy = tu_read(w->view), *go = tu_read(w->out), ry[N], ro[N];
    for (int i = 0; i < N; i++) ry[i] = sin(w->xs[i]), ro[i] = w->xs[i] * 2.0 + 1.0;
    ok = gy && go && tu_close("sin(x) through a view", gy, ry, N, tu_rtol(SG_F32), 1e-6) &&
         tu_close("fn: x*2+1", go, ro, N, tu_rtol(SG_F32), tu_atol(SG_F32));
    free(gy), free(go);
    return ok;
}

/* got is SG_ERR_INVALID_ARG and sg_last_error(NULL) names call and the destroyed context. */
static bool says_destroyed(sg_status got, const char *call) {
    const char *m = sg_last_error(NULL);
    bool ok = TU_EXPECT(got == SG_ERR_INVALID_ARG) && TU_EXPECT(strstr(m, call) != NULL) &&
              TU_EXPECT(strstr(m, "was destroyed") != NULL);
    if (!ok) fprintf(stderr, "  %s returned %s: \"%s\"\n", call, sg_status_str(got), m);
    return ok;
}

static bool hook_empty(const world *w) {
    bool ok = TU_EXPECT(w->hook.live == 0) && TU_EXPECT(w->hook.bytes == 0);
    if (!ok)
        fprintf(stderr, "  the hook holds %ld blocks, %zu bytes\n", w->hook.live, w->hook.bytes);
    return ok;
}

/* The context goes first; every handle after it. */
static bool destroy_first(world *w) {
    sg_ctx *ctx = w->ctx;
    sg_ctx_destroy(ctx);
    bool ok = hook_empty(w);
    ok = says_destroyed(sg_release(w->view), "sg_release") && ok;
    ok = says_destroyed(sg_release(w->y), "sg_release") && ok;
    ok = says_destroyed(sg_release(w->out), "sg_release") && ok;
    ok = says_destroyed(sg_release(w->x), "sg_release") && ok;
    sg_tensor *o = NULL;
    ok = says_destroyed(sg_call(w->fn, &w->x, 1, &o, 1), "sg_call") && TU_EXPECT(o == NULL) && ok;
    ok = TU_EXPECT(strcmp(sg_fn_explain(w->fn), "") == 0) && ok;
    ok = says_destroyed(sg_fn_destroy(w->fn), "sg_fn_destroy") && ok;
    sg_ctx_destroy(ctx); /* a second time: nothing */
    return hook_empty(w) && ok;
}

/* Handles first, in the order a careful program takes; then each again. */
static bool in_order(world *w) {
    sg_ctx *ctx = w->ctx;
    bool ok = TU_EXPECT(sg_release(w->view) == SG_OK) && TU_EXPECT(sg_release(w->y) == SG_OK) &&
              TU_EXPECT(sg_release(w->out) == SG_OK) && TU_EXPECT(sg_fn_destroy(w->fn) == SG_OK) &&
              TU_EXPECT(sg_ctx_status(ctx) == SG_OK);
    /* Again: harmless, and no failure of the context's. */
    ok = ok && TU_EXPECT(sg_release(w->y) == SG_ERR_RELEASED) &&
         TU_EXPECT(sg_release(w->out) == SG_ERR_RELEASED) &&
         TU_EXPECT(sg_fn_destroy(w->fn) == SG_ERR_RELEASED) &&
         TU_EXPECT(sg_ctx_status(ctx) == SG_OK);
    sg_tensor *o = NULL;
    ok =
        ok && TU_EXPECT(sg_call(w->fn, &w->x, 1, &o, 1) == SG_ERR_RELEASED) && TU_EXPECT(o == NULL);
    sg_clear_error(ctx);
    /* x is still the user's: it reads back as it was written. */
    double *gx = tu_read(w->x);
    ok = ok && gx && tu_close("x after the others went", gx, w->xs, N, 0, 0);
    free(gx);
    ok = TU_EXPECT(sg_release(w->x) == SG_OK) && ok;
    sg_ctx_destroy(ctx);
    return hook_empty(w) && ok;
}

static void test_orders(void) {
    static const sg_mode modes[2] = {SG_MODE_DEFAULT, SG_MODE_EAGER};
    for (int m = 0; m < 2; m++) {
        world w;
        bool ok = world_make(&w, modes[m]) && destroy_first(&w);
        tu_case(ok,
                "LIFETIME(mode=%s, sg_ctx_destroy then release x,y,view,out, call, destroy "
                "fn, destroy ctx -> SG_ERR_INVALID_ARG, no read)",
                sg_mode_name(modes[m]));
        ok = world_make(&w, modes[m]) && in_order(&w);
        tu_case(ok,
                "LIFETIME(mode=%s, release, destroy fn, then again -> SG_OK, then "
                "SG_ERR_RELEASED)",
                sg_mode_name(modes[m]));
    }
}

/* Destroying one context leaves another's handles alone. */
static void test_two_contexts(void) {
    world a, b;
    bool ok = world_make(&a, SG_MODE_DEFAULT) && world_make(&b, SG_MODE_DEFAULT);
    ok = ok && destroy_first(&a);
    sg_tensor *o = NULL;
    ok = ok && TU_EXPECT(sg_call(b.fn, &b.x, 1, &o, 1) == SG_OK) &&
         TU_EXPECT(sg_ctx_status(b.ctx) == SG_OK);
    double *gy = ok ? tu_read(b.view) : NULL, *go = ok ? tu_read(o) : NULL, ry[N], ro[N];
    for (int i = 0; i < N; i++) ry[i] = sin(b.xs[i]), ro[i] = b.xs[i] * 2.0 + 1.0;
    ok = ok && gy && go && tu_close("b: sin(x)", gy, ry, N, tu_rtol(SG_F32), 1e-6) &&
         tu_close("b: fn after a's destroy", go, ro, N, tu_rtol(SG_F32), tu_atol(SG_F32));
    free(gy), free(go);
    ok = ok && in_order(&b);
    tu_case(ok, "LIFETIME(two contexts: destroy a, release a's handles; b's tensors and fn "
                "unchanged)");
}

/* An optimizer (AdamW over x: its moments are tensors of the context) and
 * a one-rank communicator, made on a world and destroyed after or before
 * its context. */
static void test_optim_comm(void) {
    for (int after = 0; after < 2; after++) {
        world w;
        sg_optim *opt = NULL;
        sg_comm *comm = NULL;
        bool ok = world_make(&w, SG_MODE_DEFAULT) &&
                  TU_EXPECT(sg_adamw_create(w.ctx, 1, &w.x, NULL, &opt) == SG_OK) &&
                  TU_EXPECT(sg_comm_create(w.ctx, &(sg_comm_opts){.size = 1}, &comm) == SG_OK);
        if (!ok) fprintf(stderr, "  %s\n", sg_last_error(w.ctx));
        if (after) {
            sg_ctx_destroy(w.ctx);
            ok = hook_empty(&w) && ok; /* the context freed both */
            sg_optim_destroy(opt);     /* then these read nothing (ASan would say) */
            sg_comm_destroy(comm);
            ok = says_destroyed(sg_release(w.x), "sg_release") && ok;
        } else {
            sg_optim_destroy(opt);
            sg_comm_destroy(comm);
            ok = TU_EXPECT(sg_ctx_status(w.ctx) == SG_OK) && ok;
            sg_ctx_destroy(w.ctx);
            ok = hook_empty(&w) && ok;
        }
        tu_case(ok, "LIFETIME(AdamW optimizer and one-rank communicator destroyed %s sg_ctx_destroy)",
                after ? "after" : "before");
    }
}

static void test_null(void) {
    sg_tensor *o = NULL;
    sg_ctx_destroy(NULL);
    bool ok = TU_EXPECT(sg_release(NULL) == SG_OK) && TU_EXPECT(sg_fn_destroy(NULL) == SG_OK) &&
              TU_EXPECT(sg_call(NULL, NULL, 0, &o, 1) == SG_ERR_NULL) &&
              TU_EXPECT(strcmp(sg_fn_explain(NULL), "") == 0);
    tu_case(ok, "LIFETIME(NULL: sg_release, sg_fn_destroy -> SG_OK; sg_call -> SG_ERR_NULL)");
}

/* Many lives: nothing is left behind, in the hook or in the heap. */
static void test_cycles(void) {
    enum { CYCLES = 400, FROM = 40 };
    size_t heap_from = 0, heap_to = 0;
    bool ok = true;
    for (int c = 0; ok && c < CYCLES; c++) {
        world w;
        ok = world_make(&w, c % 3 ? SG_MODE_DEFAULT : SG_MODE_EAGER) &&
             (c % 2 ? destroy_first(&w) : in_order(&w));
        if (c == FROM) heap_from = mallinfo2().uordblks;
        if (c == CYCLES - 1) heap_to = mallinfo2().uordblks;
    }
    /* The heap may wobble by a few blocks of the C library's own. */
    ok = ok && TU_EXPECT(heap_to <= heap_from + 16384);
    tu_case(ok,
            "LIFETIME(%d cycles of both orders: hook empty after each; heap %zu -> %zu bytes "
            "from cycle %d)",
            CYCLES, heap_from, heap_to, FROM);
}

int main(void) {
    tu_seed(11);
    test_null();
    test_orders();
    test_two_contexts();
    test_optim_comm();
    test_cycles();
    return tu_finish();
}
