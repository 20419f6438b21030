/* SPDX-License-Identifier: MIT */
/*
 * test_capture_alloc.c -- every host allocation stepgraph makes can fail
 * cleanly (SQLite's and Lua's way of proving it). A fixed workload -- make a
 * context, tensors, views, pointwise ops with broadcasting, a strided read
 * and write that need temporaries, a clone, a reshape that copies, in-place
 * ops with overlapping inputs, releases, destroy -- runs once with no failure
 * to count its N allocations, then once for every k in 1..N with the k-th
 * allocation failing. In each run:
 *  - the call whose allocation failed returns NULL or SG_ERR_OOM (for
 *    sg_ctx_create: SG_ERR_OOM and a NULL context), the sticky status is
 *    SG_ERR_OOM, and sg_last_error speaks of memory;
 *  - that call leaves the context's and the hook's byte counts as they were;
 *  - every other call succeeds, or -- given a NULL from the failed one --
 *    returns NULL or SG_ERR_NULL without allocating or recording anything;
 *  - values read back match a reference computed here in f64;
 *  - the context's own byte count equals the hook's before destroy, and after
 *    sg_ctx_destroy the hook holds no block and no byte.
 * Each run is one case: `OOM(fail_at=17) -> sg_reshape(at, 1, s24)`.
 */
#include "testutil.h"

#include <math.h>
#include <string.h>

static tu_alloc hook;
static sg_ctx *ctx;

/* What the current run saw. */
static struct {
    bool ok;         /* every check passed */
    const char *hit; /* the call that met the failing allocation */
    char msg[256];   /* and its message */
} run;

static size_t ctx_live(void) {
    size_t live = 0;
    sg_ctx_host_bytes(ctx, &live, NULL);
    return live;
}

typedef struct before {
    long count, blocks;
    size_t live;
} before;

static before snap(void) { return (before){hook.count, hook.live, ctx_live()}; }

/* Judge one call of the workload (see the top of the file). */
static void judge(const char *what, bool failed, sg_status st, bool inputs_ok, before b) {
    bool hit = hook.fail_at > b.count && hook.fail_at <= hook.count, ok;
    if (!inputs_ok) {
        /* An input is NULL: an earlier call failed and said why. */
        ok = TU_EXPECT(failed) && TU_EXPECT(hook.count == b.count) &&
             TU_EXPECT(sg_ctx_status(ctx) == SG_OK);
    } else if (hit) {
        const char *m = sg_last_error(ctx);
        ok = TU_EXPECT(failed) && TU_EXPECT(st == SG_ERR_OOM) &&
             TU_EXPECT(sg_ctx_status(ctx) == SG_ERR_OOM) &&
             TU_EXPECT(strstr(m, "memory") != NULL) && TU_EXPECT(hook.live == b.blocks) &&
             TU_EXPECT(ctx_live() == b.live);
        run.hit = what;
        snprintf(run.msg, sizeof run.msg, "%s", m);
        sg_clear_error(ctx);
    } else {
        ok = TU_EXPECT(!failed) && TU_EXPECT(sg_ctx_status(ctx) == SG_OK);
        if (!ok) fprintf(stderr, "  message: %s\n", sg_last_error(ctx));
    }
    if (!ok) {
        fprintf(stderr, "  at %s (fail_at=%ld)\n", what, hook.fail_at);
        run.ok = false;
    }
}

/* A call that makes a tensor; inputs says whether its inputs exist. (Calls
 * that return a status are judged in place, since what follows needs it.) */
#define T(var, expr, inputs)                                                                       \
    do {                                                                                           \
        before b_ = snap();                                                                        \
        var = (expr);                                                                              \
        judge(#expr, var == NULL, sg_ctx_status(ctx), (inputs) != 0, b_);                          \
    } while (0)

/* Read an f32 tensor of n elements (a step of its own: strided reads
 * allocate) and compare with ref when the read worked. */
static void check_read(const char *what, const sg_tensor *t, const double *ref, int64_t n,
                       double rtol, double atol) {
    float buf[24];
    double got[24];
    before b = snap();
    sg_status s = sg_read(t, buf, (size_t)n * sizeof(float));
    judge(what, s != SG_OK, s, t != NULL, b);
    if (s != SG_OK) return;
    for (int64_t i = 0; i < n; i++) got[i] = buf[i];
    if (!tu_close(what, got, ref, n, rtol, atol)) {
        fprintf(stderr, "  at %s (fail_at=%ld)\n", what, hook.fail_at);
        run.ok = false;
    }
}

enum { R = 4, C = 6, N = R * C };

/* The workload's inputs, and a host mirror of the base storage of `a`. */
static float av[N], src[N];
static double base[N];

static double ref_c(int i, int j) { return (double)av[i * C + j] + 0.5; }

/* The workload; returns after destroying the context (or failing to make it). */
static void workload(long fail_at) {
    memset(&hook, 0, sizeof hook);
    hook.fail_at = fail_at;
    run.ok = true;
    run.hit = NULL;
    run.msg[0] = '\0';
    sg_ctx_opts opts = {.backend = SG_BACKEND_CPU, .alloc = tu_alloc_hook, .alloc_user = &hook};
    ctx = NULL;
    sg_status s = sg_ctx_create(&opts, &ctx);
    if (s != SG_OK) {
        const char *m = sg_last_error(NULL);
        run.ok = TU_EXPECT(fail_at == hook.count) && TU_EXPECT(s == SG_ERR_OOM) &&
                 TU_EXPECT(ctx == NULL) && TU_EXPECT(strstr(m, "memory") != NULL) &&
                 TU_EXPECT(hook.live == 0 && hook.bytes == 0);
        run.hit = "sg_ctx_create";
        snprintf(run.msg, sizeof run.msg, "%s", m);
        return;
    }
    int64_t s46[2] = {R, C}, s6[1] = {C}, s24[1] = {N};
    double ref[N];
    for (int i = 0; i < N; i++) base[i] = av[i];
    sg_tensor *a, *b, *at, *even, *odd, *c, *e1, *e2, *e3, *e4, *gt, *w, *h, *hb, *cl, *r, *u, *ex;

    T(a, sg_from_host(ctx, SG_F32, 2, s46, av), 1);
    T(b, sg_full(ctx, SG_F32, 1, s6, 0.5), 1);
    T(at, sg_transpose(a, 0, 1), a);     /* (6,4) view */
    T(even, sg_slice(a, 1, 0, C, 2), a); /* (4,3): columns 0, 2, 4 */
    T(odd, sg_slice(a, 1, 1, C, 2), a);  /* (4,3): columns 1, 3, 5 */
    T(c, sg_add(a, b), a && b);          /* (4,6) + (6) broadcasts */
    T(e1, sg_sin(c), c);
    T(e2, sg_mul(e1, b), e1 && b);
    T(e3, sg_tanh(e2), e2);
    T(e4, sg_add_scalar(e3, 0.1), e3);
    T(gt, sg_gt(c, b), c && b);
    T(w, sg_where(gt, c, b), gt && c && b);
    T(h, sg_cast(w, SG_BF16), w);
    T(hb, sg_cast(h, SG_F32), h);
    for (int i = 0; i < R; i++)
        for (int j = 0; j < C; j++) ref[i * C + j] = tanh(sin(ref_c(i, j)) * 0.5) + 0.1;
    check_read("sg_read(e4)", e4, ref, N, 1e-5, 1e-6);
    for (int i = 0; i < N; i++) ref[i] = fmax(ref_c(i / C, i % C), 0.5);
    check_read("sg_read(hb)", hb, ref, N, tu_rtol(SG_BF16), tu_atol(SG_BF16));
    for (int j = 0; j < C; j++)
        for (int i = 0; i < R; i++) ref[j * R + i] = av[i * C + j];
    check_read("sg_read(at) (strided: a temporary)", at, ref, N, 0, 0);

    T(cl, sg_clone(even), even);
    T(r, sg_reshape(at, 1, s24), at); /* merging transposed dims copies */
    T(u, sg_unsqueeze(even, 0), even);
    T(ex, sg_expand(b, 2, s46), b);
    check_read("sg_read(r)", r, ref, N, 0, 0);
    sg_release(a); /* the views keep its bytes alive */

    /* odd overlaps even in one storage: sg_copy_ clones it first. */
    bool copied = false, written = false;
    {
        before b_ = snap();
        sg_status st = sg_copy_(even, odd);
        judge("sg_copy_(even, odd)", st != SG_OK, st, even && odd, b_);
        copied = st == SG_OK;
    }
    if (copied)
        for (int i = 0; i < R; i++)
            for (int k = 0; k < C / 2; k++) base[i * C + 2 * k] = base[i * C + 2 * k + 1];
    for (int i = 0; i < R * 3; i++) ref[i] = base[(i / 3) * C + 2 * (i % 3)];
    check_read("sg_read(even) (strided)", even, ref, R * 3, 0, 0);
    for (int i = 0; i < R * 3; i++) ref[i] = av[(i / 3) * C + 2 * (i % 3)];
    check_read("sg_read(cl)", cl, ref, R * 3, 0, 0);

    /* A strided write stages through a temporary. */
    {
        before b_ = snap();
        sg_status st = sg_write(at, src, sizeof src);
        judge("sg_write(at, src)", st != SG_OK, st, at != NULL, b_);
        written = st == SG_OK;
    }
    if (written)
        for (int j = 0; j < C; j++)
            for (int i = 0; i < R; i++) base[i * C + j] = src[j * R + i];
    for (int i = 0; i < R * 3; i++) ref[i] = base[(i / 3) * C + 2 * (i % 3)];
    check_read("sg_read(even) after the write", even, ref, R * 3, 0, 0);

    {
        before b_ = snap();
        sg_status st = sg_add_(c, ex);
        judge("sg_add_(c, ex)", st != SG_OK, st, c && ex, b_);
        for (int i = 0; i < N; i++) ref[i] = ref_c(i / C, i % C) + (st == SG_OK ? 0.5 : 0.0);
    }
    check_read("sg_read(c)", c, ref, N, 1e-6, 0);

    sg_release(b), sg_release(at), sg_release(c), sg_release(e1), sg_release(e2);
    sg_release(e3), sg_release(gt), sg_release(w), sg_release(h), sg_release(cl);
    sg_release(u), sg_release(ex);
    /* e4, hb, r, even and odd are left for sg_ctx_destroy to free. */
    (void)e4, (void)hb, (void)r, (void)odd;
    size_t live = ctx_live();
    bool same = TU_EXPECT(live == hook.bytes);
    if (!same) fprintf(stderr, "  context counts %zu bytes, the hook %zu\n", live, hook.bytes);
    run.ok = run.ok && same;
    sg_ctx_destroy(ctx);
    ctx = NULL;
}

/*
 * A call that runs out of memory returns SG_ERR_OOM even when the context
 * already holds an older, uncleared failure: the sticky status keeps the
 * older one, the message becomes the newest, and the returned status is
 * this call's own.
 */
static void oom_after_sticky(const char *what) {
    memset(&hook, 0, sizeof hook);
    sg_ctx_opts opts = {.backend = SG_BACKEND_CPU, .alloc = tu_alloc_hook, .alloc_user = &hook};
    if (sg_ctx_create(&opts, &ctx) != SG_OK) {
        tu_case(false, "OOM_AFTER_STICKY(%s): no context", what);
        return;
    }
    int64_t s46[2] = {R, C};
    sg_tensor *a = sg_from_host(ctx, SG_F32, 2, s46, av);
    sg_tensor *at = sg_transpose(a, 0, 1), *even = sg_slice(a, 1, 0, C, 2);
    sg_tensor *odd = sg_slice(a, 1, 1, C, 2);
    bool ok = TU_EXPECT(a && at && even && odd) && TU_EXPECT(sg_transpose(a, 0, 5) == NULL) &&
              TU_EXPECT(sg_ctx_status(ctx) == SG_ERR_INDEX);
    float buf[N];
    hook.fail_at = hook.count + 1; /* the next allocation fails */
    sg_status st = SG_OK;
    if (strcmp(what, "sg_read") == 0) st = sg_read(at, buf, sizeof buf);
    if (strcmp(what, "sg_write") == 0) st = sg_write(at, buf, sizeof buf);
    if (strcmp(what, "sg_copy_") == 0) st = sg_copy_(even, odd);
    ok = ok && TU_EXPECT(hook.count >= hook.fail_at) && TU_EXPECT(st == SG_ERR_OOM) &&
         TU_EXPECT(sg_ctx_status(ctx) == SG_ERR_INDEX) &&
         TU_EXPECT(strstr(sg_last_error(ctx), "memory") != NULL);
    if (!ok)
        fprintf(stderr, "  returned %s, message \"%s\"\n", sg_status_str(st), sg_last_error(ctx));
    sg_ctx_destroy(ctx);
    ctx = NULL;
    ok = ok && TU_EXPECT(hook.live == 0 && hook.bytes == 0);
    tu_case(ok, "OOM_AFTER_STICKY(%s with an uncleared SG_ERR_INDEX) -> SG_ERR_OOM", what);
}

int main(void) {
    tu_seed(3);
    for (int i = 0; i < N; i++) {
        av[i] = (float)tu_uniform(-2, 2);
        src[i] = (float)tu_uniform(-2, 2);
    }
    workload(0);
    long total = hook.count;
    bool clean = TU_EXPECT(hook.live == 0 && hook.bytes == 0);
    tu_case(run.ok && clean && total > 20, "OOM(fail_at=0: no failure, %ld allocations)", total);
    for (long k = 1; k <= total; k++) {
        workload(k);
        clean = TU_EXPECT(hook.live == 0) && TU_EXPECT(hook.bytes == 0);
        if (!clean) fprintf(stderr, "  leak: %ld blocks, %zu bytes\n", hook.live, hook.bytes);
        bool seen = TU_EXPECT(run.hit != NULL);
        tu_case(run.ok && clean && seen, "OOM(fail_at=%ld) -> %s: \"%s\"", k,
                run.hit ? run.hit : "(no call saw it)", run.msg);
    }
    oom_after_sticky("sg_read");
    oom_after_sticky("sg_write");
    oom_after_sticky("sg_copy_");
    return tu_finish();
}
