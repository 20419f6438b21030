/* SPDX-License-Identifier: MIT */
/*
 * test_ops_index_add.c -- index_add (the gradient of embedding and
 * index_select): dst[.., idx[j], ..] += src[.., j, ..] on the test's backend
 * (SG_TEST_BACKEND; the CUDA kernels sort the positions by index and add
 * each run of equal indices on one thread per lane), with heavy duplicates
 * (every index equal), none (a permutation) and random ones, along dim 0
 * (the embedding table's rows) and dim 1, into a dst that already holds
 * values.
 *
 * References, computed here: the f64 sum (f32 within 1e-5 relative plus
 * 1e-6 * sqrt(count) * scale; f16 and bf16 within 1e-2), and the
 * sequential loop in float (each element adds its positions in order to
 * its value in f32), rounded once for f16 and bf16, which every backend
 * (OpenCL C and Level Zero too: cgen_serial_data.c) must give bit for bit
 * (an embedding's gradient with a token repeated 3000 times: rounded after
 * each row, bf16's sum would stop growing at 256 rows).
 * Each case runs twice and the two results must be equal bit for bit. An
 * index out of range fails the call with SG_ERR_INDEX naming the op and
 * leaves dst as it was (the host check before any kernel). Past 8192
 * positions the CUDA kernels sort by a radix sort (SG_CUDA_INDEX_ADD=radix
 * takes it at every count); the embedding's gradient inside compiled steps
 * checks the recorded graph on CUDA, whose scratch the first call sized. On
 * CUDA an "info" line times the GPT-2 embedding gradient (4096 tokens into
 * a 50257 x 768 bf16 table).
 */
#include "testutil.h"

#include "capture/capture.h"

#include <math.h>
#include <string.h>

static sg_ctx *ctx;

typedef enum dist { ALL_EQUAL, ALL_DISTINCT, RANDOM } dist;
static const char *const dist_names[3] = {"all_equal", "all_distinct", "random"};

/* count indices in [0, size) drawn by d (ALL_DISTINCT: count <= size). */
static int64_t *indices(dist d, int64_t count, int64_t size) {
    int64_t *iv = malloc(sizeof *iv * (size_t)(size > count ? size : count));
    int64_t same = tu_randint(0, size - 1);
    for (int64_t j = 0; j < count; j++) iv[j] = d == ALL_EQUAL ? same : tu_randint(0, size - 1);
    if (d == ALL_DISTINCT) { /* the first count of a shuffle of [0, size) */
        for (int64_t j = 0; j < size; j++) iv[j] = j;
        for (int64_t j = size - 1; j > 0; j--) {
            int64_t k = tu_randint(0, j), t = iv[j];
            iv[j] = iv[k], iv[k] = t;
        }
    }
    return iv;
}

/* dst (rows, cols), src with count entries along dim, idx into dim of dst. */
static void index_add_case(sg_dtype dt, int dim, int64_t rows, int64_t cols, int64_t count,
                           dist d) {
    int64_t ds[2] = {rows, cols}, ss[2] = {dim == 0 ? count : rows, dim == 0 ? cols : count};
    int64_t size = ds[dim], is[1] = {count};
    double *dv, *sv;
    sg_tensor *dst0 = tu_rand(ctx, dt, 2, ds, -1, 1, &dv),
              *src = tu_rand(ctx, dt, 2, ss, -1, 1, &sv);
    int64_t *iv = indices(d, count, size);
    sg_tensor *idx = sg_from_host(ctx, SG_I64, 1, is, iv);
    int64_t n = rows * cols;
    double *ref = malloc(sizeof *ref * (size_t)n);
    float *seq = malloc(sizeof *seq * (size_t)n);
    memcpy(ref, dv, sizeof *ref * (size_t)n);
    for (int64_t i = 0; i < n; i++) seq[i] = (float)dv[i];
    int64_t lanes = dim == 0 ? cols : rows;
    for (int64_t l = 0; l < lanes; l++)
        for (int64_t j = 0; j < count; j++) {
            int64_t at = dim == 0 ? iv[j] * cols + l : l * cols + iv[j];
            double x = sv[dim == 0 ? j * cols + l : l * count + j];
            ref[at] += x;
            seq[at] += (float)x;
        }
    double *got[2] = {NULL, NULL};
    bool ok = TU_EXPECT(dst0 && src && idx);
    for (int r = 0; r < 2 && ok; r++) {
        sg_tensor *dst = sg_clone(dst0);
        ok = TU_EXPECT(sg__index_add_(dst, dim, idx, src) == SG_OK) &&
             TU_EXPECT((got[r] = tu_read(dst)) != NULL);
        sg_release(dst);
    }
    /* Each element's f32 sum in position order, rounded once to dt (f32: as it is). */
    for (int64_t i = 0; ok && i < n; i++)
        if (got[0][i] != tu_round(dt, seq[i]))
            ok = TU_EXPECT(got[0][i] == tu_round(dt, seq[i])) &&
                 fprintf(stderr, "  element %lld: %.9g, the f32 sum rounded once %.9g (f64 %.9g)\n",
                         (long long)i, got[0][i], tu_round(dt, seq[i]), ref[i]) < 0;
    if (ok && dt == SG_F32)
        ok = tu_close("out", got[0], ref, n, 1e-5, 1e-6 * (1 + sqrt((double)count)));
    else if (ok)
        ok = tu_close("out", got[0], ref, n, 1e-2, 1e-2);
    for (int64_t i = 0; ok && i < n; i++)
        ok = TU_EXPECT(memcmp(&got[0][i], &got[1][i], sizeof(double)) == 0);
    if (!ok && sg_last_error(ctx)[0]) fprintf(stderr, "  error: %s\n", sg_last_error(ctx));
    char s1[32], s2[32];
    tu_case(ok, "INDEX_ADD(type=%s,dim=%d,dst=%s,src=%s,idx=%s)", sg_dtype_name(dt), dim,
            tu_shape(2, ds, s1, sizeof s1), tu_shape(2, ss, s2, sizeof s2), dist_names[d]);
    sg_clear_error(ctx);
    sg_release(dst0), sg_release(src), sg_release(idx);
    free(dv), free(sv), free(iv), free(ref), free(seq), free(got[0]), free(got[1]);
}

/* in: the table w (requires grad), the positions' indices, the gradient
 * up of the rows they pick; out: d sum(embedding(w, idx) * up) / d w, the
 * index_add of up's rows into zeros. */
static sg_status embedding_grad_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *u) {
    (void)c, (void)u;
    sg_tensor *e = sg_embedding(in[0], in[1]);
    sg_tensor *loss = sg_sum(sg_mul(e, in[2]), 0, NULL, false);
    return sg_grad(loss, 1, &in[0], &out[0]);
}

/* The embedding gradient inside a compiled step: on CUDA the first call
 * runs the kernels and sizes the op scratch, the second records the graph,
 * the third replays it; every call gives the f32 sum in position order
 * rounded once. */
static void compiled_case(sg_mode mode, sg_dtype dt, int64_t rows, int64_t cols, int64_t count) {
    int64_t ws[2] = {rows, cols}, us[2] = {count, cols}, is[1] = {count};
    double *uv;
    sg_tensor *w = tu_rand(ctx, dt, 2, ws, -1, 1, NULL), *up = tu_rand(ctx, dt, 2, us, -1, 1, &uv);
    int64_t *iv = indices(RANDOM, count, rows);
    sg_tensor *idx = sg_from_host(ctx, SG_I64, 1, is, iv);
    float *seq = calloc((size_t)(rows * cols), sizeof *seq);
    for (int64_t j = 0; j < count; j++)
        for (int64_t l = 0; l < cols; l++) seq[iv[j] * cols + l] += (float)uv[j * cols + l];
    sg_fn *fn = NULL;
    bool ok =
        TU_EXPECT(w && up && idx && seq) && TU_EXPECT(sg_requires_grad_(w, true) == SG_OK) &&
        TU_EXPECT(sg_compile(ctx, embedding_grad_step, NULL, 3, 1,
                             &(sg_compile_opts){.mode = mode, .fullgraph = true}, &fn) == SG_OK);
    for (int call = 0; ok && call < 3; call++) {
        sg_tensor *in[3] = {w, idx, up}, *out = NULL;
        double *got = NULL;
        ok = TU_EXPECT(sg_mark_step_begin(ctx) == SG_OK) &&
             TU_EXPECT(sg_call(fn, in, 3, &out, 1) == SG_OK) &&
             TU_EXPECT((got = tu_read(out)) != NULL);
        for (int64_t i = 0; ok && i < rows * cols; i++)
            if (got[i] != tu_round(dt, seq[i]))
                ok = TU_EXPECT(got[i] == tu_round(dt, seq[i])) &&
                     fprintf(stderr,
                             "  call %d, element %lld: %.9g, the f32 sum rounded once %.9g\n", call,
                             (long long)i, got[i], tu_round(dt, seq[i])) < 0;
        free(got);
    }
    if (!ok && sg_last_error(ctx)[0]) fprintf(stderr, "  error: %s\n", sg_last_error(ctx));
    tu_case(ok, "EMBEDDING_GRAD(mode=%s,type=%s,table=[%lld,%lld],positions=%lld)",
            sg_mode_name(mode), sg_dtype_name(dt), (long long)rows, (long long)cols,
            (long long)count);
    sg_clear_error(ctx);
    sg_fn_destroy(fn);
    sg_release(w), sg_release(up), sg_release(idx);
    free(uv), free(iv), free(seq);
}

/* An index out of range: SG_ERR_INDEX naming index_add, dst unchanged. */
static void bad_index_case(int64_t bad) {
    int64_t ds[2] = {6, 5}, ss[2] = {3, 5}, is[1] = {3}, iv[3] = {1, bad, 2};
    double *dv;
    sg_tensor *dst = tu_rand(ctx, SG_F32, 2, ds, -1, 1, &dv),
              *src = tu_rand(ctx, SG_F32, 2, ss, -1, 1, NULL);
    sg_tensor *idx = sg_from_host(ctx, SG_I64, 1, is, iv);
    sg_status st = sg__index_add_(dst, 0, idx, src);
    bool ok = TU_EXPECT(st == SG_ERR_INDEX) &&
              TU_EXPECT(strstr(sg_last_error(ctx), "index_add") != NULL) &&
              TU_EXPECT(strstr(sg_last_error(ctx), "out of range") != NULL);
    sg_clear_error(ctx);
    double *after = tu_read(dst);
    ok = ok && TU_EXPECT(after && memcmp(after, dv, sizeof(double) * 30) == 0);
    tu_case(ok, "INDEX_ADD_BAD_INDEX(dst=[6,5],idx={1,%lld,2}) SG_ERR_INDEX, dst unchanged",
            (long long)bad);
    sg_clear_error(ctx);
    sg_release(dst), sg_release(src), sg_release(idx);
    free(dv), free(after);
}

/* Host allocations that fail from the n-th on inside index_add (a CPU
 * context of its own): each call either succeeds or fails with SG_ERR_OOM
 * and a message naming index_add, leaving dst as it was; some failures hit
 * the positions' order. */
static long oom_countdown = -1;

static void *failing_alloc(void *user, void *p, size_t old_size, size_t new_size) {
    (void)user, (void)old_size;
    if (new_size == 0) {
        free(p);
        return NULL;
    }
    if (oom_countdown >= 0 && oom_countdown-- == 0) return NULL;
    return realloc(p, new_size);
}

static void oom_case(void) {
    sg_ctx *c = NULL;
    bool ok =
        TU_EXPECT(sg_ctx_create(&(sg_ctx_opts){.backend = SG_BACKEND_CPU, .alloc = failing_alloc},
                                &c) == SG_OK);
    int failures = 0, order = 0;
    for (long n = 0; ok && n < 40; n++) {
        uint16_t dv[12], sv[8] = {0x3f80, 0x4000, 0x4040, 0x4080, 0x3f80, 0x4000, 0x4040, 0x4080};
        for (int i = 0; i < 12; i++) dv[i] = 0x3f00; /* 0.5 */
        int64_t iv[4] = {2, 0, 2, 2};
        sg_tensor *dst = sg_from_host(c, SG_BF16, 2, (int64_t[2]){6, 2}, dv);
        sg_tensor *src = sg_from_host(c, SG_BF16, 2, (int64_t[2]){4, 2}, sv);
        sg_tensor *idx = sg_from_host(c, SG_I64, 1, (int64_t[1]){4}, iv);
        ok = TU_EXPECT(dst && src && idx);
        oom_countdown = n;
        sg_status st = ok ? sg__index_add_(dst, 0, idx, src) : SG_ERR_INTERNAL;
        oom_countdown = -1;
        uint16_t after[12];
        ok = ok && TU_EXPECT(st == SG_OK || st == SG_ERR_OOM) &&
             TU_EXPECT(sg_read(dst, after, sizeof after) == SG_OK);
        if (ok && st == SG_ERR_OOM) {
            failures++;
            order += strstr(sg_last_error(c), "for the order of") != NULL;
            ok = TU_EXPECT(strstr(sg_last_error(c), "index_add") != NULL) &&
                 TU_EXPECT(strstr(sg_last_error(c), "out of host memory") != NULL) &&
                 TU_EXPECT(memcmp(after, dv, sizeof after) == 0);
        } else if (ok) { /* row 2: 0.5 + 1 + 1 + 3, 0.5 + 2 + 2 + 4; row 0: 0.5 + 3, 0.5 + 4 */
            ok = TU_EXPECT(after[4] == 0x40b0) && TU_EXPECT(after[5] == 0x4108) &&
                 TU_EXPECT(after[0] == 0x4060) && TU_EXPECT(after[1] == 0x4090) &&
                 TU_EXPECT(after[2] == 0x3f00);
        }
        sg_clear_error(c);
        sg_release(dst), sg_release(src), sg_release(idx);
    }
    ok = ok && TU_EXPECT(failures > 0) && TU_EXPECT(order > 0);
    tu_case(ok,
            "INDEX_ADD_OOM(every host allocation inside index_add failing in turn: %d failed, %d "
            "in the positions' order) SG_ERR_OOM naming index_add, dst unchanged",
            failures, order);
    sg_ctx_destroy(c);
}

/* Not a check: the embedding gradient of a GPT-2 step on the device, from
 * W6's 4096 tokens to 128 x 1024 (the rank pass, then a radix sort). */
static void report_time(int64_t count) {
    int64_t ds[2] = {50257, 768}, ss[2] = {count, 768}, is[1] = {count};
    sg_tensor *dst = sg_zeros(ctx, SG_BF16, 2, ds), *src = sg_full(ctx, SG_BF16, 2, ss, 0.5);
    int64_t *iv = indices(RANDOM, count, 50257);
    sg_tensor *idx = sg_from_host(ctx, SG_I64, 1, is, iv);
    for (int r = 0; r < 3; r++) sg__index_add_(dst, 0, idx, src);
    sg_ctx_synchronize(ctx);
    int reps = 20;
    double t0 = tu_now();
    for (int r = 0; r < reps; r++) sg__index_add_(dst, 0, idx, src);
    sg_ctx_synchronize(ctx);
    printf("info INDEX_ADD(bf16 [50257,768] += %lld random rows): %.1f us per call (eager, with "
           "its index check)\n",
           (long long)count, (tu_now() - t0) / reps * 1e6);
    sg_release(dst), sg_release(src), sg_release(idx);
    free(iv);
    sg_clear_error(ctx);
}

int main(void) {
    tu_seed(41);
    ctx = tu_ctx((sg_ctx_opts){0});
    for (int d = 0; d < 3; d++) {
        index_add_case(SG_F32, 0, 500, 37, 300, (dist)d);
        index_add_case(SG_F32, 1, 9, 70, 64, (dist)d);
        index_add_case(SG_F32, 0, 5000, 64, 4096, (dist)d);
    }
    index_add_case(SG_BF16, 0, 1000, 40, 200, ALL_DISTINCT);
    index_add_case(SG_BF16, 0, 3000, 96, 256, RANDOM);
    /* A token repeated thousands of times: added one row at a time in bf16
     * its sum would stall once it is 256 times a row. */
    index_add_case(SG_BF16, 0, 50, 8, 3000, ALL_EQUAL);
    index_add_case(SG_F16, 1, 6, 40, 700, RANDOM);
    index_add_case(SG_BF16, 0, 5000, 64, 4096, RANDOM);
    /* More positions than the rank pass takes on CUDA (8192): a radix sort;
     * 70000 rows of keys take it three passes. */
    index_add_case(SG_F32, 0, 3000, 16, 70001, RANDOM);
    index_add_case(SG_BF16, 0, 300, 8, 90000, RANDOM);
    index_add_case(SG_F32, 0, 70000, 4, 70000, ALL_DISTINCT);
    index_add_case(SG_BF16, 1, 4, 200, 80000, RANDOM);
    /* Inside compiled steps; 50000 positions' sort needs more than the 1 MiB
     * of scratch a context starts with. */
    compiled_case(SG_MODE_REDUCE_OVERHEAD, SG_BF16, 1000, 8, 50000);
    compiled_case(SG_MODE_REDUCE_OVERHEAD, SG_F32, 2000, 4, 70000);
    compiled_case(SG_MODE_DEFAULT, SG_BF16, 500, 16, 3000);
    bad_index_case(6);
    bad_index_case(-1);
    if (tu_backend() == SG_BACKEND_CPU) oom_case();
    if (tu_backend() == SG_BACKEND_CUDA)
        for (int64_t n = 4096; n <= 131072; n *= 2) report_time(n);
    sg_ctx_destroy(ctx);
    return tu_finish();
}
