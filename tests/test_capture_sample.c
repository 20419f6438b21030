/* SPDX-License-Identifier: MIT */
/*
 * test_capture_sample.c -- sampling on the device against references
 * written here: topk_indices against a stable sort (ties and NaN
 * included), gather against torch.gather's definition, multinomial and
 * sample (temperature, top-k, top-p) against a sort-based f64 reference
 * that draws the same per-row uniform from its own Philox, pick for pick;
 * frequencies within statistical bounds; fresh picks on each replay of a
 * compiled step, equal to the same calls made eagerly. The reference sums
 * f64 weights in order where the library sums them as exact integers: the
 * two pick apart only where a draw falls within rounding of a boundary. On
 * CUDA "info" lines time a draw from GPT-2's 50257 logits. Each case prints
 * its name, e.g.
 *   ok   SAMPLE(type=f32,x=[64,50],T=0.7,top_k=10,top_p=0.9,seed=5) picks equal
 */
#define _POSIX_C_SOURCE 200809L
#include "graphs/graphs.h"
#include "testutil.h"

#include <math.h>
#include <string.h>

static sg_ctx *ctx;

/* ------------------------------------------------------------ references */

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

/* The documented per-row uniform: 53 bits of block offset + row. */
static double row_uniform(uint64_t seed, uint64_t block) {
    uint32_t ctr[4] = {(uint32_t)block, (uint32_t)(block >> 32), 0, 0};
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)}, w[4];
    ref_philox(ctr, key, w);
    return ((double)(w[0] >> 5) * 67108864.0 + (double)(w[1] >> 6)) / 9007199254740992.0;
}

/* Sort order: larger first, NaN above all, then lower index. */
static const double *cmp_vals;
static int cmp_order(const void *pa, const void *pb) {
    int64_t a = *(const int64_t *)pa, b = *(const int64_t *)pb;
    double x = cmp_vals[a], y = cmp_vals[b];
    bool nx = isnan(x), ny = isnan(y);
    if (nx != ny) return nx ? -1 : 1;
    if (!nx && x != y) return x > y ? -1 : 1;
    return a < b ? -1 : a > b;
}

static void order_of(const double *v, int64_t V, int64_t *ord) {
    for (int64_t j = 0; j < V; j++) ord[j] = j;
    cmp_vals = v;
    qsort(ord, (size_t)V, sizeof *ord, cmp_order);
}

/* torch-style pick for one row: kind 0 weights, kind 1 logits. */
static int64_t ref_pick(const double *x, int64_t V, int kind, double T, int64_t top_k, double top_p,
                        double u) {
    int64_t *ord = malloc(sizeof(int64_t) * (size_t)V);
    double *w = calloc((size_t)V, sizeof(double));
    bool *keep = calloc((size_t)V, sizeof(bool));
    order_of(x, V, ord);
    int64_t nk = kind == 1 && top_k > 0 && top_k < V ? top_k : V;
    for (int64_t s = 0; s < nk; s++) keep[ord[s]] = true;
    for (int64_t j = 0; j < V; j++)
        w[j] = kind == 0 ? (x[j] > 0 ? x[j] : 0) : exp((x[j] - x[ord[0]]) / T);
    if (kind == 1 && top_p < 1) {
        double tot = 0, cum = 0;
        for (int64_t j = 0; j < V; j++) tot += keep[j] ? w[j] : 0;
        int64_t s = 0;
        for (; s < nk && cum < top_p * tot; s++) cum += w[ord[s]];
        for (int64_t t = s; t < nk; t++) keep[ord[t]] = false;
    }
    double total = 0, cum = 0;
    for (int64_t j = 0; j < V; j++) total += keep[j] ? w[j] : 0;
    int64_t pick = -1;
    for (int64_t j = 0; j < V && total > 0; j++) {
        if (!keep[j] || w[j] <= 0) continue;
        pick = j;
        cum += w[j];
        if (cum > u * total) break;
    }
    if (pick < 0) pick = ord[0];
    free(ord), free(w), free(keep);
    return pick;
}

/* ------------------------------------------------------------ topk and gather */

static void test_topk(sg_dtype dt, int64_t rows, int64_t V, int64_t k, bool ties, bool nan,
                      uint64_t seed) {
    tu_seed(seed);
    int64_t sh[2] = {rows, V};
    double *xv;
    sg_tensor *x0 = tu_rand(ctx, dt, 2, sh, -3, 3, &xv);
    if (ties || nan) { /* few distinct values, and a NaN per row */
        for (int64_t i = 0; i < rows * V; i++) xv[i] = ties ? round(xv[i]) : xv[i];
        for (int64_t r = 0; nan && r < rows; r++) xv[r * V + (r * 7) % V] = NAN;
        float *f = malloc(sizeof(float) * (size_t)(rows * V));
        for (int64_t i = 0; i < rows * V; i++) f[i] = (float)xv[i];
        sg_release(x0);
        sg_tensor *t = sg_from_host(ctx, SG_F32, 2, sh, f);
        x0 = sg_cast(t, dt);
        sg_release(t);
        free(f);
    }
    sg_tensor *xt = sg_transpose(sg_contiguous(sg_transpose(x0, 0, 1)), 0, 1); /* strided */
    sg_tensor *idx = sg_topk_indices(xt, k);
    sg_tensor *vals = idx ? sg_gather(xt, -1, idx) : NULL;
    double *got = tu_read(idx), *gv = tu_read(vals);
    int64_t *ord = malloc(sizeof(int64_t) * (size_t)V);
    bool ok = TU_EXPECT(k == 0 || (got && gv)) && TU_EXPECT(sg_tensor_size(idx, 1) == k);
    for (int64_t r = 0; ok && r < rows; r++) {
        order_of(xv + r * V, V, ord);
        for (int64_t s = 0; ok && s < k; s++) {
            double want = xv[r * V + ord[s]];
            ok = TU_EXPECT(got[r * k + s] == (double)ord[s]) &&
                 TU_EXPECT(gv[r * k + s] == want || (isnan(want) && isnan(gv[r * k + s])));
            if (!ok)
                fprintf(stderr, "  row %lld, rank %lld: got %g, want %lld\n", (long long)r,
                        (long long)s, got[r * k + s], (long long)ord[s]);
        }
    }
    tu_case(ok,
            "TOPK_INDICES(type=%s,x=[%lld,%lld] strided,k=%lld,ties=%d,nan=%d) + gather seed=%llu",
            sg_dtype_name(dt), (long long)rows, (long long)V, (long long)k, ties, nan,
            (unsigned long long)seed);
    free(xv), free(got), free(gv), free(ord);
    sg_release(x0), sg_release(xt), sg_release(idx), sg_release(vals);
    sg_clear_error(ctx);
}

static void test_gather(sg_dtype dt, sg_dtype it, int dim, uint64_t seed) {
    tu_seed(seed);
    int64_t xs[3] = {4, 6, 5}, is[3] = {3, 4, 5};
    int d = dim < 0 ? dim + 3 : dim;
    is[d] = 7;
    double *xv;
    sg_tensor *x = tu_rand(ctx, dt, 3, xs, -9, 9, &xv);
    int64_t n = is[0] * is[1] * is[2];
    int64_t *iv = malloc(sizeof(int64_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++) iv[i] = tu_randint(0, xs[d] - 1);
    sg_tensor *i64 = sg_from_host(ctx, SG_I64, 3, is, iv), *idx = sg_cast(i64, it);
    sg_tensor *y = sg_gather(x, dim, idx);
    double *got = tu_read(y), *ref = malloc(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++) {
        int64_t c[3] = {i / (is[1] * is[2]), (i / is[2]) % is[1], i % is[2]};
        c[d] = iv[i];
        ref[i] = xv[(c[0] * xs[1] + c[1]) * xs[2] + c[2]];
    }
    bool ok = TU_EXPECT(got) && tu_close("gather", got, ref, n, 0, 0);
    iv[n / 2] = xs[d]; /* out of range */
    sg_tensor *bad = sg_from_host(ctx, SG_I64, 3, is, iv);
    ok = ok && TU_EXPECT(sg_gather(x, dim, bad) == NULL) &&
         TU_EXPECT(sg_ctx_status(ctx) == SG_ERR_INDEX);
    sg_clear_error(ctx);
    tu_case(ok, "GATHER(type=%s,x=[4,6,5],idx=%s[%lld,%lld,%lld],dim=%d) + out of range seed=%llu",
            sg_dtype_name(dt), sg_dtype_name(it), (long long)is[0], (long long)is[1],
            (long long)is[2], dim, (unsigned long long)seed);
    free(xv), free(iv), free(got), free(ref);
    sg_release(x), sg_release(i64), sg_release(idx), sg_release(y), sg_release(bad);
}

/* ------------------------------------------------------------ multinomial and sample */

/* Draw from x (rows, V) with the library and with the reference, pick for pick. */
static void test_picks(const char *what, sg_dtype dt, int64_t rows, int64_t V, int kind, double T,
                       int64_t top_k, double top_p, uint64_t seed) {
    tu_seed(seed);
    int64_t sh[2] = {rows, V};
    double *xv;
    sg_tensor *x = tu_rand(ctx, dt, 2, sh, kind == 0 ? -0.2 : -4, kind == 0 ? 1 : 4, &xv);
    sg_tensor *rng = sg_rng_create(ctx, seed * 977);
    sg_tensor *t1 = kind == 0 ? sg_multinomial(x, rng) : sg_sample(x, T, top_k, top_p, rng);
    sg_tensor *t2 = kind == 0 ? sg_multinomial(x, rng) : sg_sample(x, T, top_k, top_p, rng);
    double *g1 = tu_read(t1), *g2 = tu_read(t2);
    bool ok = TU_EXPECT(g1 && g2) && TU_EXPECT(sg_tensor_ndim(t1) == 1);
    int64_t differ = 0;
    for (int64_t r = 0; ok && r < rows; r++) {
        int64_t want1, want2;
        if (T == 0 && kind == 1) {
            int64_t *ord = malloc(sizeof(int64_t) * (size_t)V);
            order_of(xv + r * V, V, ord);
            want1 = want2 = ord[0];
            free(ord);
        } else {
            want1 = ref_pick(xv + r * V, V, kind, T, top_k, top_p,
                             row_uniform(seed * 977, (uint64_t)r));
            want2 = ref_pick(xv + r * V, V, kind, T, top_k, top_p,
                             row_uniform(seed * 977, (uint64_t)(rows + r)));
        }
        ok = TU_EXPECT(g1[r] == (double)want1) && TU_EXPECT(g2[r] == (double)want2);
        if (!ok)
            fprintf(stderr, "  row %lld: got %g %g, want %lld %lld\n", (long long)r, g1[r], g2[r],
                    (long long)want1, (long long)want2);
        differ += g1[r] != g2[r];
    }
    if (T != 0) ok = ok && TU_EXPECT(differ > 0); /* the second draw is fresh */
    tu_case(ok,
            "%s(type=%s,x=[%lld,%lld],T=%g,top_k=%lld,top_p=%g,seed=%llu) picks equal, "
            "2nd draw differs in %lld rows",
            what, sg_dtype_name(dt), (long long)rows, (long long)V, T, (long long)top_k, top_p,
            (unsigned long long)seed, (long long)differ);
    free(xv), free(g1), free(g2);
    sg_release(x), sg_release(rng), sg_release(t1), sg_release(t2);
}

/* Frequencies of many rows of one distribution within 5 sigma of it. */
static void test_frequencies(uint64_t seed) {
    const int64_t N = 40000, V = 5;
    const double logits[5] = {1.0, 2.0, -1.0, 0.5, 2.0};
    float *f = malloc(sizeof(float) * (size_t)(N * V));
    for (int64_t i = 0; i < N * V; i++) f[i] = (float)logits[i % V];
    int64_t sh[2] = {N, V};
    sg_tensor *x = sg_from_host(ctx, SG_F32, 2, sh, f), *rng = sg_rng_create(ctx, seed);
    /* top_k 4 drops index 2; top_p 0.8 then keeps 1, 4 (0.6 of the four's
     * mass) and index 0 (order: 1, 4, 0, 3). */
    sg_tensor *t = sg_sample(x, 1.0, 4, 0.8, rng);
    double *g = tu_read(t), cnt[5] = {0}, p[5] = {0}, tot = 0;
    for (int64_t r = 0; g && r < N; r++) cnt[(int)g[r]]++;
    for (int j = 0; j < 5; j++)
        p[j] = (j == 0 || j == 1 || j == 4) ? exp(logits[j]) : 0, tot += p[j];
    bool ok = TU_EXPECT(g);
    for (int j = 0; ok && j < 5; j++) {
        double q = p[j] / tot, sd = sqrt(q * (1 - q) / (double)N);
        ok = TU_EXPECT(fabs(cnt[j] / (double)N - q) <= 5 * sd + 1e-12);
    }
    tu_case(ok,
            "SAMPLE_FREQ(x=[%lld,5] one row repeated,T=1,top_k=4,top_p=0.8,seed=%llu) "
            "freq=%.3f,%.3f,%.3f,%.3f,%.3f",
            (long long)N, (unsigned long long)seed, cnt[0] / N, cnt[1] / N, cnt[2] / N, cnt[3] / N,
            cnt[4] / N);
    free(f), free(g);
    sg_release(x), sg_release(rng), sg_release(t);
}

/* ------------------------------------------------------------ replays */

typedef struct world {
    sg_tensor *rng;
} world;

static sg_status sample_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    world *w = user;
    out[0] = sg_sample(in[0], 0.9, 8, 0.95, w->rng);
    out[1] = sg_multinomial(sg_softmax(in[0], -1), w->rng);
    return sg_ctx_status(c);
}

static void test_replay(sg_mode mode, uint64_t seed) {
    tu_seed(seed);
    int64_t sh[2] = {16, 40};
    sg_tensor *x = tu_rand(ctx, SG_F32, 2, sh, -2, 2, NULL);
    world w = {sg_rng_create(ctx, seed)}, twin = {sg_rng_create(ctx, seed)};
    sg_fn *fn = NULL;
    bool ok = TU_EXPECT(
        sg_compile(ctx, sample_step, &w, 1, 2, &(sg_compile_opts){.mode = mode}, &fn) == SG_OK);
    double *prev = NULL;
    int fresh = 0;
    for (int call = 0; ok && call < 4; call++) {
        sg_mark_step_begin(ctx);
        sg_tensor *out[2] = {NULL}, *ref[2] = {NULL};
        ok = TU_EXPECT(sg_call(fn, &x, 1, out, 2) == SG_OK) &&
             TU_EXPECT(sample_step(ctx, &x, ref, &twin) == SG_OK);
        for (int k = 0; ok && k < 2; k++) {
            double *a = tu_read(out[k]), *b = tu_read(ref[k]);
            ok = TU_EXPECT(a && b) && tu_close("replay vs eager", a, b, 16, 0, 0);
            if (k == 0 && ok && prev) fresh += memcmp(prev, a, sizeof(double) * 16) != 0;
            if (k == 0) free(prev), prev = a, a = NULL;
            free(a), free(b);
        }
        for (int k = 0; k < 2; k++) sg_release(ref[k]);
    }
    ok = ok && TU_EXPECT(fresh == 3) && TU_EXPECT(fn->ngraphs == (mode == SG_MODE_EAGER ? 0 : 1));
    if (!ok) fprintf(stderr, "%s\n%s\n", sg_last_error(ctx), fn ? sg_fn_explain(fn) : "");
    tu_case(ok,
            "SAMPLE_REPLAY(mode=%s,sample+multinomial x=[16,40],calls=4,seed=%llu) fresh each "
            "call, equal to eager",
            sg_mode_name(mode), (unsigned long long)seed);
    sg_clear_error(ctx);
    free(prev);
    sg_fn_destroy(fn);
    sg_release(x), sg_release(w.rng), sg_release(twin.rng);
}

static void test_errors(void) {
    int64_t sh[2] = {2, 3};
    sg_tensor *x = sg_zeros(ctx, SG_F32, 2, sh), *xi = sg_zeros(ctx, SG_I32, 2, sh),
              *rng = sg_rng_create(ctx, 1);
    bool ok =
        TU_EXPECT(!sg_topk_indices(x, 4)) && TU_EXPECT(sg_ctx_status(ctx) == SG_ERR_INVALID_ARG);
    sg_clear_error(ctx);
    ok = ok && TU_EXPECT(!sg_sample(x, 1, 0, 0, rng)) &&
         TU_EXPECT(sg_ctx_status(ctx) == SG_ERR_INVALID_ARG);
    sg_clear_error(ctx);
    ok = ok && TU_EXPECT(!sg_multinomial(xi, rng)) && TU_EXPECT(sg_ctx_status(ctx) == SG_ERR_DTYPE);
    sg_clear_error(ctx);
    ok = ok && TU_EXPECT(!sg_gather(x, 0, x)) && TU_EXPECT(sg_ctx_status(ctx) == SG_ERR_DTYPE);
    sg_clear_error(ctx);
    sg_tensor *one = sg_rng_create(ctx, 5), *flat = sg_narrow(one, 0, 0, 1);
    sg_tensor *bad = sg_expand(flat, 1, (int64_t[1]){2}); /* seed and offset one element */
    ok = ok && TU_EXPECT(bad != NULL) && TU_EXPECT(!sg_multinomial(x, bad)) &&
         TU_EXPECT(sg_ctx_status(ctx) == SG_ERR_INVALID_ARG) &&
         TU_EXPECT(strstr(sg_last_error(ctx), "strides [0]") != NULL);
    sg_clear_error(ctx);
    tu_case(ok, "SAMPLE_ERRORS(k > V, top_p 0, int probs, float idx, an rng of one element "
                "expanded)");
    sg_release(x), sg_release(xi), sg_release(rng), sg_release(bad), sg_release(flat),
        sg_release(one);
}

/* +inf weights share their row: the only one is always drawn, two split it. */
static sg_status multinomial_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    out[0] = sg_multinomial(in[0], (sg_tensor *)user);
    return out[0] ? SG_OK : sg_ctx_status(c);
}

static void test_multinomial_inf(void) {
    int64_t sh[2] = {3, 3};
    float v[9] = {1, INFINITY, 1, INFINITY, 1, 0, 0, INFINITY, INFINITY};
    sg_tensor *x = sg_from_host(ctx, SG_F32, 2, sh, v), *rng = sg_rng_create(ctx, 3), *y = NULL;
    sg_fn *fn = NULL;
    bool ok = TU_EXPECT(sg_compile(ctx, multinomial_step, rng, 1, 1, NULL, &fn) == SG_OK);
    int hits[2][3] = {{0}}, bad = 0;
    for (int k = 0; ok && k < 200; k++) {
        int64_t got[3];
        sg_tensor *t = (k & 1) ? NULL : sg_multinomial(x, rng);
        ok = (k & 1) ? TU_EXPECT(sg_call(fn, &x, 1, &y, 1) == SG_OK) : TU_EXPECT(t != NULL);
        ok = ok && TU_EXPECT(sg_read((k & 1) ? y : t, got, sizeof got) == SG_OK);
        sg_release(t);
        bad += ok && (got[0] != 1 || got[1] != 0 || (got[2] != 1 && got[2] != 2));
        if (ok) hits[k & 1][got[2] == 2]++;
    }
    ok = ok && TU_EXPECT(bad == 0) && TU_EXPECT(hits[0][0] > 20 && hits[0][1] > 20) &&
         TU_EXPECT(hits[1][0] > 20 && hits[1][1] > 20);
    tu_case(ok, "MULTINOMIAL_INF(rows {1,inf,1} {inf,1,0} {0,inf,inf}, eager and compiled, 200 "
                "draws) -> the inf entries, shared");
    sg_fn_destroy(fn);
    sg_release(x), sg_release(rng);
}

/* Not a check: one token drawn from GPT-2's 50257 bf16 logits. */
static void report_time(int64_t top_k, double top_p) {
    int64_t sh[2] = {1, 50257};
    sg_tensor *x = tu_rand(ctx, SG_BF16, 2, sh, -4, 4, NULL), *rng = sg_rng_create(ctx, 5);
    for (int r = 0; r < 3; r++) sg_release(sg_sample(x, 0.8, top_k, top_p, rng));
    sg_ctx_synchronize(ctx);
    int reps = 20;
    double t0 = tu_now();
    for (int r = 0; r < reps; r++) sg_release(sg_sample(x, 0.8, top_k, top_p, rng));
    sg_ctx_synchronize(ctx);
    printf("info SAMPLE(bf16 [1,50257],T=0.8,top_k=%lld,top_p=%g): %.1f us per call (eager)\n",
           (long long)top_k, top_p, (tu_now() - t0) / reps * 1e6);
    sg_release(x), sg_release(rng);
    sg_clear_error(ctx);
}

int main(void) {
    ctx = tu_ctx((sg_ctx_opts){0});
    test_topk(SG_F32, 6, 37, 5, false, false, 1);
    test_topk(SG_F32, 6, 37, 37, true, false, 2);
    test_topk(SG_BF16, 3, 20, 7, true, true, 3);
    test_topk(SG_F16, 4, 9, 1, false, true, 4);
    test_topk(SG_F32, 2, 5, 0, false, false, 5);
    /* Rows longer than a CUDA block's threads; the block's sort at k 2048,
     * a thread a row past it. */
    test_topk(SG_BF16, 3, 50257, 50, true, true, 25);
    test_topk(SG_F32, 2, 5000, 2048, false, true, 26);
    test_topk(SG_F32, 3, 1000, 777, true, false, 27);
    test_topk(SG_F32, 2, 3000, 2049, false, false, 28);
    test_gather(SG_F32, SG_I64, 1, 6);
    test_gather(SG_I64, SG_I32, 0, 7);
    test_gather(SG_BF16, SG_I64, -1, 8);
    test_picks("MULTINOMIAL", SG_F32, 64, 13, 0, 1, 0, 1, 9);
    test_picks("MULTINOMIAL", SG_BF16, 32, 7, 0, 1, 0, 1, 10);
    test_picks("SAMPLE", SG_F32, 64, 50, 1, 0.7, 10, 0.9, 11);
    test_picks("SAMPLE", SG_F32, 64, 50, 1, 1.3, 0, 1, 12);
    test_picks("SAMPLE", SG_F32, 64, 50, 1, 1.0, 5, 1, 13);
    test_picks("SAMPLE", SG_BF16, 64, 50, 1, 0.8, 0, 0.5, 14);
    test_picks("SAMPLE", SG_F16, 32, 33, 1, 2.0, 3, 0.7, 15);
    test_picks("SAMPLE", SG_F32, 16, 50, 1, 0, 5, 0.9, 16);
    /* Rows longer than a CUDA block's threads (each owns a segment), bf16
     * rows with hundreds of ties at each value, a GPT-2 vocabulary. */
    test_picks("SAMPLE", SG_BF16, 4, 50257, 1, 0.8, 50, 0.95, 20);
    test_picks("SAMPLE", SG_F32, 3, 5000, 1, 1.0, 0, 0.9, 21);
    test_picks("SAMPLE", SG_BF16, 8, 1500, 1, 0.5, 300, 1, 22);
    test_picks("SAMPLE", SG_BF16, 6, 2049, 1, 3.0, 1000, 0.3, 23);
    test_picks("MULTINOMIAL", SG_F32, 5, 3000, 0, 1, 0, 1, 24);
    test_frequencies(17);
    test_replay(SG_MODE_REDUCE_OVERHEAD, 18);
    test_replay(SG_MODE_DEFAULT, 19);
    test_errors();
    test_multinomial_inf();
    if (tu_backend() == SG_BACKEND_CUDA) report_time(50, 0.95), report_time(0, 0.9);
    sg_ctx_destroy(ctx);
    return tu_finish();
}
