/* SPDX-License-Identifier: MIT */
/*
 * test_capture_random.c -- the Philox generator and the draws made from it:
 * Random123's published known-answer vectors for philox4x32-10 (for the
 * library's generator and for the independent one written here), every
 * uniform's bits against that independent generator and the documented
 * element mapping, mean and variance within statistical bounds, determinism
 * per seed and per thread count, fresh numbers on every replay of a compiled
 * step (equal to the same draws made eagerly), and dropout against its
 * formula. Each case prints its name, e.g.
 *   ok   RAND(type=f32,n=262144,seed=7) mean=0.50012 var=0.08331
 */
#define _POSIX_C_SOURCE 200809L
#include "graphs/cpu/cpu.h"
#include "graphs/graphs.h"
#include "testutil.h"

#include <math.h>
#include <string.h>

static sg_ctx *ctx;

/* ------------------------------------------------------------ an independent Philox */

static void ref_philox(const uint32_t in[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c[4] = {in[0], in[1], in[2], in[3]}, k[2] = {key[0], key[1]};
    for (int r = 0; r < 10; r++) {
        uint64_t a = (uint64_t)0xD2511F53u * c[0], b = (uint64_t)0xCD9E8D57u * c[2];
        uint32_t n[4] = {(uint32_t)(b >> 32) ^ c[1] ^ k[0], (uint32_t)b,
                         (uint32_t)(a >> 32) ^ c[3] ^ k[1], (uint32_t)a};
        memcpy(c, n, sizeof c);
        k[0] += 0x9E3779B9u, k[1] += 0xBB67AE85u;
    }
    memcpy(out, c, sizeof c);
}

static void test_kat(void) {
    static const uint32_t kat[3][10] = {
        {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
        {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0x408f276d,
         0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
        {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09,
         0x94fdcceb, 0x5001e420, 0x24126ea1},
    };
    for (int v = 0; v < 3; v++) {
        uint32_t a[4], b[4];
        sg__philox4x32_10(kat[v], kat[v] + 4, a);
        ref_philox(kat[v], kat[v] + 4, b);
        tu_case(memcmp(a, kat[v] + 6, 16) == 0 && memcmp(b, kat[v] + 6, 16) == 0,
                "PHILOX4x32_10_KAT(ctr=%08x..,key=%08x%08x) -> %08x %08x %08x %08x", kat[v][0],
                kat[v][4], kat[v][5], a[0], a[1], a[2], a[3]);
    }
}

/* The uniform of element e for (seed, offset) by the documented mapping. */
static double ref_uniform(uint64_t seed, uint64_t offset, int64_t e, int bits) {
    uint64_t b = offset + (uint64_t)(e / 4);
    uint32_t ctr[4] = {(uint32_t)b, (uint32_t)(b >> 32), 0, 0};
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)}, w[4];
    ref_philox(ctr, key, w);
    return ldexp((double)(w[e % 4] >> (32 - bits)), -bits);
}

static int bits_of(sg_dtype dt) { return dt == SG_F32 ? 24 : dt == SG_F16 ? 11 : 8; }

/* Two draws from one rng: every value bit for bit, and the offset after. */
static void test_bits(sg_dtype dt, int64_t n, uint64_t seed) {
    sg_tensor *rng = sg_rng_create(ctx, seed);
    int64_t sh[1] = {n};
    sg_tensor *a = sg_rand(rng, dt, 1, sh), *b = sg_rand(rng, dt, 1, sh);
    double *va = tu_read(a), *vb = tu_read(b);
    int64_t state[2] = {0, 0};
    bool ok = TU_EXPECT(va && vb) && TU_EXPECT(sg_read(rng, state, sizeof state) == SG_OK);
    uint64_t blocks = (uint64_t)(n + 3) / 4;
    ok = ok && TU_EXPECT((uint64_t)state[0] == seed) && TU_EXPECT((uint64_t)state[1] == 2 * blocks);
    for (int64_t e = 0; ok && e < n; e++)
        ok = TU_EXPECT(va[e] == ref_uniform(seed, 0, e, bits_of(dt))) &&
             TU_EXPECT(vb[e] == ref_uniform(seed, blocks, e, bits_of(dt)));
    tu_case(ok, "RAND_BITS(type=%s,n=%lld,seed=%llu,draws=2) offset=%lld", sg_dtype_name(dt),
            (long long)n, (unsigned long long)seed, (long long)state[1]);
    free(va), free(vb);
    sg_release(a), sg_release(b), sg_release(rng);
}

/* Mean and variance of n draws within 5 standard errors; the range; for
 * normals the share within one sigma. */
static void test_stats(sg_dtype dt, bool normal, int64_t n, uint64_t seed) {
    sg_tensor *rng = sg_rng_create(ctx, seed);
    int64_t sh[2] = {n / 64, 64};
    sg_tensor *x = normal ? sg_randn(rng, dt, 2, sh) : sg_rand(rng, dt, 2, sh);
    double *v = tu_read(x), s = 0, s2 = 0, lo = INFINITY, hi = -INFINITY, in1 = 0;
    for (int64_t i = 0; v && i < n; i++) {
        s += v[i];
        lo = fmin(lo, v[i]), hi = fmax(hi, v[i]);
        in1 += fabs(v[i]) < 1;
    }
    double mean = s / (double)n;
    for (int64_t i = 0; v && i < n; i++) s2 += (v[i] - mean) * (v[i] - mean);
    double var = s2 / (double)(n - 1), m = normal ? 0 : 0.5, vv = normal ? 1 : 1.0 / 12;
    /* var of the sample variance: (mu4 - sigma^4) / n; mu4 = 3 (normal), 1/80 (uniform) */
    double se_mean = sqrt(vv / (double)n),
           se_var = sqrt(((normal ? 3 : 1.0 / 80) - vv * vv) / (double)n);
    /* bf16 quantizes: its grid adds a bias up to half a step to the moments */
    double slack = dt == SG_BF16 ? (normal ? 0.02 : 0.004) : dt == SG_F16 ? 0.001 : 0;
    bool ok = TU_EXPECT(v) && TU_EXPECT(fabs(mean - m) <= 5 * se_mean + slack) &&
              TU_EXPECT(fabs(var - vv) <= 5 * se_var + slack);
    if (normal)
        ok = ok && TU_EXPECT(fabs(in1 / (double)n - 0.6826894921) < 0.005 + slack) &&
             TU_EXPECT(lo < -3 && hi > 3 && lo > -7 && hi < 7);
    else
        ok = ok && TU_EXPECT(lo >= 0 && hi < 1 && lo < 0.01 && hi > 0.99);
    tu_case(ok, "%s(type=%s,n=%lld,seed=%llu) mean=%.5f var=%.5f range=[%.4f,%.4f]",
            normal ? "RANDN" : "RAND", sg_dtype_name(dt), (long long)n, (unsigned long long)seed,
            mean, var, lo, hi);
    free(v);
    sg_release(x), sg_release(rng);
}

/* Same seed: the same numbers, on a one-thread CPU context too (under
 * SG_TEST_BACKEND=cuda: the device against the CPU); another seed: others. */
static void test_determinism(uint64_t seed) {
    sg_ctx *one = NULL; /* always the CPU (tu_ctx would take SG_TEST_BACKEND's) */
    if (sg_ctx_create(&(sg_ctx_opts){.backend = SG_BACKEND_CPU, .num_threads = 1}, &one) != SG_OK) {
        tu_case(false, "RAND_DETERMINISM: no CPU context: %s", sg_last_error(NULL));
        return;
    }
    sg_ctx *cs[2] = {ctx, one};
    int64_t sh[1] = {300001};
    double *u[3], *z[3];
    for (int k = 0; k < 3; k++) {
        sg_tensor *r = sg_rng_create(cs[k == 1], seed + (k == 2));
        sg_tensor *a = sg_rand(r, SG_F32, 1, sh), *b = sg_randn(r, SG_F32, 1, sh);
        u[k] = tu_read(a), z[k] = tu_read(b);
        sg_release(a), sg_release(b), sg_release(r);
    }
    bool ok = TU_EXPECT(u[0] && u[1] && u[2] && z[0] && z[1] && z[2]) &&
              TU_EXPECT(memcmp(u[0], u[1], sizeof(double) * (size_t)sh[0]) == 0) &&
              /* normals: f64 log and cos of two backends may differ in the last bit */
              tu_close("randn across contexts", z[0], z[1], sh[0], 2e-7, 1e-7);
    int64_t same = 0;
    for (int64_t i = 0; ok && i < sh[0]; i++) same += z[0][i] == z[2][i];
    ok = ok && TU_EXPECT(same < 10);
    tu_case(ok, "RAND_DETERMINISM(n=%lld,seed=%llu,%s vs cpu with 1 thread; seed+1 equal in %lld)",
            (long long)sh[0], (unsigned long long)seed, sg_backend_name(sg_ctx_backend(ctx)),
            (long long)same);
    for (int k = 0; k < 3; k++) free(u[k]), free(z[k]);
    sg_ctx_destroy(one);
}

/* ------------------------------------------------------------ compiled replays */

typedef struct world {
    sg_tensor *rng;
} world;

static sg_status draw_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    world *w = user;
    int64_t sh[2] = {3, 50};
    out[0] = sg_rand(w->rng, SG_F32, 2, sh);
    out[1] = sg_dropout(in[0], 0.25, w->rng);
    out[2] = sg_randn(w->rng, SG_F32, 2, sh);
    return sg_ctx_status(c);
}

/* A compiled step draws, 4 calls: each call's numbers differ from the last
 * call's and equal the same draws made eagerly from a twin generator. */
static void test_replay(sg_mode mode, uint64_t seed) {
    world w = {sg_rng_create(ctx, seed)}, twin = {sg_rng_create(ctx, seed)};
    int64_t sh[2] = {3, 50};
    sg_tensor *x = tu_rand(ctx, SG_F32, 2, sh, -2, 2, NULL);
    sg_fn *fn = NULL;
    bool ok = TU_EXPECT(
        sg_compile(ctx, draw_step, &w, 1, 3, &(sg_compile_opts){.mode = mode}, &fn) == SG_OK);
    double *prev = NULL;
    for (int call = 0; ok && call < 4; call++) {
        sg_mark_step_begin(ctx);
        sg_tensor *out[3] = {NULL}, *ref[3] = {NULL};
        ok = TU_EXPECT(sg_call(fn, &x, 1, out, 3) == SG_OK) &&
             TU_EXPECT(draw_step(ctx, &x, ref, &twin) == SG_OK);
        for (int k = 0; ok && k < 3; k++) {
            double *a = tu_read(out[k]), *b = tu_read(ref[k]);
            ok = TU_EXPECT(a && b) && tu_close("replay vs eager", a, b, 150, 0, 0);
            if (k == 0 && ok && prev) ok = TU_EXPECT(memcmp(prev, a, sizeof(double) * 150) != 0);
            if (k == 0) free(prev), prev = a, a = NULL;
            free(a), free(b);
        }
        for (int k = 0; k < 3; k++) sg_release(ref[k]);
    }
    ok = ok && TU_EXPECT(fn->ngraphs == (mode == SG_MODE_EAGER ? 0 : 1));
    if (!ok) fprintf(stderr, "%s\n%s\n", sg_last_error(ctx), fn ? sg_fn_explain(fn) : "");
    tu_case(ok,
            "RAND_REPLAY(mode=%s,rand+dropout+randn [3,50],calls=4,seed=%llu) fresh each call, "
            "equal to eager",
            sg_mode_name(mode), (unsigned long long)seed);
    sg_clear_error(ctx);
    free(prev);
    sg_fn_destroy(fn);
    sg_release(w.rng), sg_release(twin.rng), sg_release(x);
}

/* ------------------------------------------------------------ dropout */

static void test_dropout(sg_dtype dt, double p, uint64_t seed) {
    int64_t sh[2] = {64, 129}, n = sh[0] * sh[1];
    double *xv;
    sg_tensor *x = tu_rand(ctx, dt, 2, sh, -3, 3, &xv);
    sg_tensor *rng = sg_rng_create(ctx, seed);
    sg_tensor *y = sg_dropout(x, p, rng);
    double *yv = tu_read(y), *ref = malloc(sizeof(double) * (size_t)n), pd = tu_round(dt, p);
    int64_t zeros = 0;
    for (int64_t e = 0; e < n; e++) {
        double u = ref_uniform(seed, 0, e, bits_of(dt));
        ref[e] = u >= pd ? tu_round(dt, xv[e] * tu_round(dt, 1.0)) / (1 - p) : 0;
        if (p == 1) ref[e] = 0;
        ref[e] = tu_round(dt, ref[e]);
        zeros += yv && yv[e] == 0;
    }
    bool ok = TU_EXPECT(yv) && tu_close("dropout", yv, ref, n, tu_rtol(dt), tu_atol(dt)) &&
              TU_EXPECT(fabs((double)zeros / (double)n - p) < 0.02);
    tu_case(ok, "DROPOUT(type=%s,x=[64,129],p=%g,seed=%llu) dropped=%.4f", sg_dtype_name(dt), p,
            (unsigned long long)seed, (double)zeros / (double)n);
    free(xv), free(yv), free(ref);
    sg_release(x), sg_release(y), sg_release(rng);
}

/* Host allocations that fail from the n-th on inside sg_dropout: every
 * failure leaves the rng's offset where it was. */
static long dropout_countdown = -1;

static void *failing_alloc(void *user, void *p, size_t old_size, size_t new_size) {
    (void)user, (void)old_size;
    if (new_size == 0) {
        free(p);
        return NULL;
    }
    if (dropout_countdown >= 0 && dropout_countdown-- == 0) return NULL;
    return realloc(p, new_size);
}

static void test_dropout_oom(void) {
    sg_ctx *c = NULL;
    bool ok =
        TU_EXPECT(sg_ctx_create(&(sg_ctx_opts){.backend = SG_BACKEND_CPU, .alloc = failing_alloc},
                                &c) == SG_OK);
    int failures = 0, moved = 0;
    for (long n = 0; ok && n < 40; n++) {
        float xv[6] = {1, 2, 3, 4, 5, 6};
        sg_tensor *x = sg_from_host(c, SG_F32, 1, (int64_t[1]){6}, xv);
        sg_tensor *rng = sg_rng_create(c, 3);
        ok = TU_EXPECT(x && rng);
        dropout_countdown = n;
        sg_tensor *y = ok ? sg_dropout(x, 0.3, rng) : NULL;
        dropout_countdown = -1;
        int64_t st[2] = {0, -1};
        ok = ok && TU_EXPECT(sg_read(rng, st, sizeof st) == SG_OK);
        if (ok && !y) failures++, moved += st[1] != 0;
        if (ok && y) ok = TU_EXPECT(st[1] == 2); /* ceil(6 / 4) blocks drawn */
        sg_clear_error(c);
        sg_release(y), sg_release(x), sg_release(rng);
    }
    ok = ok && TU_EXPECT(failures > 5) && TU_EXPECT(moved == 0);
    tu_case(ok,
            "DROPOUT_OOM(every host allocation inside sg_dropout failing in turn: %d failed) "
            "-> the rng's offset as it was",
            failures);
    sg_ctx_destroy(c);
}

static void test_errors(void) {
    int64_t sh[1] = {3};
    sg_tensor *bad = sg_zeros(ctx, SG_I64, 1, sh), *rng = sg_rng_create(ctx, 1);
    bool ok = TU_EXPECT(sg_rand(bad, SG_F32, 1, sh) == NULL) &&
              TU_EXPECT(strstr(sg_last_error(ctx), "sg_rng_create") != NULL) &&
              TU_EXPECT(sg_randn(rng, SG_I32, 1, sh) == NULL) &&
              TU_EXPECT(sg_ctx_status(ctx) == SG_ERR_INVALID_ARG) &&
              TU_EXPECT(sg_rand(NULL, SG_F32, 1, sh) == NULL);
    sg_clear_error(ctx);
    ok = ok && TU_EXPECT(sg_dropout(rng, 0.5, rng) == NULL) &&
         TU_EXPECT(sg_ctx_status(ctx) == SG_ERR_DTYPE);
    tu_case(ok, "RAND_ERRORS(rng of the wrong shape, int dtype, NULL rng, dropout of i64)");
    sg_clear_error(ctx);
    /* p == 1 gives zeros, also where x is infinite (not 0 * inf). */
    float v[4] = {1.5f, INFINITY, -INFINITY, 2.0f}, got[4] = {1, 1, 1, 1};
    sg_tensor *xi = sg_from_host(ctx, SG_F32, 1, (int64_t[1]){4}, v);
    sg_tensor *y = sg_dropout(xi, 1.0, rng);
    ok = TU_EXPECT(y != NULL) && TU_EXPECT(sg_read(y, got, sizeof got) == SG_OK);
    for (int k = 0; ok && k < 4; k++) ok = TU_EXPECT(got[k] == 0.0f);
    tu_case(ok, "DROPOUT(p=1, x={1.5, inf, -inf, 2}) -> zeros");
    sg_release(xi), sg_release(y);
    sg_release(bad), sg_release(rng);
}

int main(void) {
    ctx = tu_ctx((sg_ctx_opts){0}); /* SG_TEST_BACKEND: cpu unless the gpu suite says cuda */
    test_kat();
    test_bits(SG_F32, 1001, 42);
    test_bits(SG_BF16, 37, 0xfedcba9876543210ull);
    test_bits(SG_F16, 64, 3);
    test_stats(SG_F32, false, 1 << 18, 7);
    test_stats(SG_BF16, false, 1 << 18, 8);
    test_stats(SG_F16, false, 1 << 18, 9);
    test_stats(SG_F32, true, 1 << 18, 10);
    test_stats(SG_BF16, true, 1 << 18, 11);
    test_determinism(12);
    test_replay(SG_MODE_REDUCE_OVERHEAD, 13);
    test_replay(SG_MODE_DEFAULT, 14);
    test_replay(SG_MODE_EAGER, 15);
    test_dropout(SG_F32, 0.3, 16);
    test_dropout(SG_BF16, 0.5, 17);
    test_dropout(SG_F32, 1.0, 18);
    test_errors();
    test_dropout_oom();
    sg_ctx_destroy(ctx);
    return tu_finish();
}
