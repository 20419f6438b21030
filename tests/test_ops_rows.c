/* SPDX-License-Identifier: MIT */
/*
 * test_ops_rows.c -- softmax, log_softmax, layer_norm, rms_norm and
 * cross_entropy against f64 formulas computed here: float dtypes, contiguous
 * / permuted / sliced inputs (and sliced weights), softmax along first,
 * middle and last dims, size-1 dims, 0-d and empty tensors, rows longer than
 * a tile, shapes big enough for several threads, inputs of large magnitude
 * (stability), weight/bias present or left out; then bad input.
 */
#include "testutil.h"

#include <math.h>
#include <string.h>

static sg_ctx *ctx, *ctx_mt; /* ctx_mt asks for 5 threads */

static const sg_dtype floats[3] = {SG_F32, SG_F16, SG_BF16};

static int64_t numel_of(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    return n;
}

static bool check(sg_tensor *y, sg_dtype dt, int ndim, const int64_t *shape, const double *ref) {
    int64_t gs[SG_MAX_DIMS];
    int64_t n = numel_of(ndim, shape);
    bool ok = TU_EXPECT(y != NULL) && TU_EXPECT(sg_tensor_dtype(y) == dt) &&
              TU_EXPECT(sg_tensor_ndim(y) == ndim) &&
              TU_EXPECT(sg_tensor_shape(y, gs) == SG_OK &&
                        !memcmp(gs, shape, sizeof(int64_t) * (size_t)ndim));
    double *got = ok ? tu_read(y) : NULL;
    ok = ok && TU_EXPECT(got != NULL) &&
         TU_EXPECT(tu_close("values", got, ref, n, tu_rtol(dt), tu_atol(dt)));
    free(got);
    return ok;
}

/* ------------------------------------------------------------ softmax */

/* f64 softmax / log_softmax of row-major v along dim, max subtracted. */
static void ref_softmax(int ndim, const int64_t *shape, int dim, const double *v, bool lg,
                        double *out) {
    int64_t len = ndim ? shape[dim] : 1, inner = 1, outer = 1;
    for (int d = dim + 1; d < ndim; d++) inner *= shape[d];
    for (int d = 0; d < dim; d++) outer *= shape[d];
    for (int64_t o = 0; o < outer; o++)
        for (int64_t i = 0; i < inner; i++) {
            const double *x = v + o * len * inner + i;
            double *y = out + o * len * inner + i;
            double m = -INFINITY, s = 0;
            for (int64_t j = 0; j < len; j++) m = x[j * inner] > m ? x[j * inner] : m;
            for (int64_t j = 0; j < len; j++) s += exp(x[j * inner] - m);
            for (int64_t j = 0; j < len; j++)
                y[j * inner] = lg ? x[j * inner] - m - log(s) : exp(x[j * inner] - m) / s;
        }
}

static void softmax_case(sg_ctx *c, sg_dtype dt, int ndim, const int64_t *shape, int dim, bool lg,
                         tu_layout layout, double mag) {
    if (!tu_sampled()) return;
    double *v;
    sg_tensor *x = tu_rand_layout(c, dt, ndim, shape, -mag, mag, layout, &v);
    int nd = dim < 0 ? dim + (ndim ? ndim : 1) : dim;
    double *ref = malloc((size_t)(numel_of(ndim, shape) + 1) * sizeof(double));
    ref_softmax(ndim, shape, ndim ? nd : 0, v, lg, ref);
    sg_tensor *y = lg ? sg_log_softmax(x, dim) : sg_softmax(x, dim);
    bool ok = check(y, dt, ndim, shape, ref);
    char sh[64];
    tu_case(ok, "%s(type=%s,x=%s,dim=%d,range=%g,view=%s)", lg ? "LOG_SOFTMAX" : "SOFTMAX",
            sg_dtype_name(dt), tu_shape(ndim, shape, sh, sizeof sh), dim, mag,
            tu_layout_name(layout));
    sg_release(x), sg_release(y);
    free(v), free(ref);
}

typedef struct row_case {
    int ndim;
    int64_t shape[SG_MAX_DIMS];
    int dim;
} row_case;

static void test_softmax(void) {
    static const row_case cases[] = {
        {2, {4, 7}, -1},   {2, {4, 7}, 0},       {3, {3, 5, 6}, 1}, {3, {3, 5, 6}, -1},
        {3, {3, 5, 6}, 0}, {4, {2, 3, 4, 5}, 2}, {2, {2, 300}, 1},  {2, {2, 300}, 0},
        {2, {1, 1}, 0},    {2, {5, 1}, 1},       {0, {0}, 0},       {0, {0}, -1},
        {1, {7}, 0},       {2, {0, 5}, 1},       {2, {3, 0}, 1},    {2, {3, 0}, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        for (int t = 0; t < 3; t++)
            for (int l = 0; l < TU_NUM_LAYOUTS; l++)
                for (int lg = 0; lg < 2; lg++)
                    softmax_case(ctx, floats[t], cases[i].ndim, cases[i].shape, cases[i].dim, lg,
                                 (tu_layout)l, 4);
    /* Stability: exp(80) overflows f16 and exp(1e4) overflows every dtype. */
    int64_t s[2] = {6, 50}, big[2] = {64, 1000}, mid[3] = {40, 300, 5};
    for (int t = 0; t < 3; t++)
        for (int lg = 0; lg < 2; lg++) {
            softmax_case(ctx, floats[t], 2, s, -1, lg, TU_CONTIG, 80);
            softmax_case(ctx, floats[t], 2, s, 0, lg, TU_PERMUTED, 80);
            softmax_case(ctx_mt, floats[t], 2, big, 1, lg, (tu_layout)t, 10);
            softmax_case(ctx_mt, floats[t], 3, mid, 1, lg, TU_SLICED, 10);
        }
    for (int lg = 0; lg < 2; lg++) softmax_case(ctx, SG_F32, 2, s, 1, lg, TU_SLICED, 1e4);
}

/* Masked (-inf) positions add exactly 0, even when a whole tile of them
 * comes first; a row of only -inf is NaN (as in PyTorch). Rows read one by
 * one (contiguous, dim 1) and side by side (dim 0, and a transposed view). */
static void test_softmax_masked(void) {
    enum { R = 600, C = 16 };
    static double v[R * C], ref[R * C];
    for (int i = 0; i < R; i++)
        for (int c = 0; c < C; c++)
            v[i * C + c] = c == C - 1 || i < 300 + c * 10 ? -INFINITY
                                                          : tu_round(SG_F32, tu_uniform(-5, 5));
    int64_t shape[2] = {R, C}, tshape[2] = {C, R};
    float buf[R * C];
    for (int i = 0; i < R * C; i++) buf[i] = (float)v[i];
    sg_tensor *x = sg_from_host(ctx, SG_F32, 2, shape, buf);
    sg_tensor *xt = sg_transpose(x, 0, 1), *xc = sg_contiguous(xt);
    for (int lg = 0; lg < 2; lg++) {
        ref_softmax(2, shape, 0, v, lg, ref);
        sg_tensor *y = lg ? sg_log_softmax(x, 0) : sg_softmax(x, 0);
        bool ok = check(y, SG_F32, 2, shape, ref);
        /* The same rows, transposed: ref is read back in transposed order. */
        static double rt[R * C];
        for (int i = 0; i < R; i++)
            for (int c = 0; c < C; c++) rt[c * R + i] = ref[i * C + c];
        sg_tensor *yt = lg ? sg_log_softmax(xt, 1) : sg_softmax(xt, 1);
        sg_tensor *yc = lg ? sg_log_softmax(xc, -1) : sg_softmax(xc, -1);
        ok = ok && check(yt, SG_F32, 2, tshape, rt) && check(yc, SG_F32, 2, tshape, rt);
        tu_case(ok, "%s(type=f32,x=[600,16],dim=0 and its transpose,masked=-inf prefixes and a "
                "column of only -inf)", lg ? "LOG_SOFTMAX" : "SOFTMAX");
        sg_release(y), sg_release(yt), sg_release(yc);
    }
    sg_release(x), sg_release(xt), sg_release(xc);
}

/* An expanded input (stride 0 along the broadcast dim): softmax along the
 * repeats is uniform; across them it runs side by side over stride-0 lanes. */
static void test_softmax_expanded(sg_dtype dt) {
    int64_t bshape[2] = {4, 1}, shape[2] = {4, 9};
    double *bv, v[36], ref[36];
    sg_tensor *b = tu_rand(ctx, dt, 2, bshape, -4, 4, &bv);
    sg_tensor *x = sg_expand(b, 2, shape);
    for (int i = 0; i < 36; i++) v[i] = bv[i / 9];
    for (int dim = 0; dim < 2; dim++)
        for (int lg = 0; lg < 2; lg++) {
            ref_softmax(2, shape, dim, v, lg, ref);
            sg_tensor *y = lg ? sg_log_softmax(x, dim) : sg_softmax(x, dim);
            tu_case(check(y, dt, 2, shape, ref), "%s(type=%s,x=expand([4,1] to [4,9]),dim=%d)",
                    lg ? "LOG_SOFTMAX" : "SOFTMAX", sg_dtype_name(dt), dim);
            sg_release(y);
        }
    sg_release(b), sg_release(x);
    free(bv);
}

/* ------------------------------------------------------------ norms */

/* f64 layer_norm (layer) or rms_norm of row-major v over the last dim. */
static void ref_norm(bool layer, int64_t rows, int64_t C, const double *v, const double *w,
                     const double *b, double eps, double *out) {
    for (int64_t r = 0; r < rows; r++) {
        const double *x = v + r * C;
        double mean = 0, var = 0;
        for (int64_t j = 0; j < C; j++) mean += x[j] / (double)C;
        if (!layer) mean = 0;
        for (int64_t j = 0; j < C; j++) var += (x[j] - mean) * (x[j] - mean) / (double)C;
        for (int64_t j = 0; j < C; j++)
            out[r * C + j] = (x[j] - mean) / sqrt(var + eps) * (w ? w[j] : 1.0) + (b ? b[j] : 0.0);
    }
}

/* which: bit 0 weight, bit 1 bias. */
/* Set around the cases every sampled run keeps (SG_TEST_EVERY skips the others). */
static bool norm_always;

static void norm_case(sg_ctx *c, bool layer, sg_dtype dt, int ndim, const int64_t *shape, int which,
                      tu_layout layout, double eps, double shift) {
    if (!norm_always && !tu_sampled()) return;
    double *v, *wv = NULL, *bv = NULL;
    int64_t C = shape[ndim - 1], rows = numel_of(ndim - 1, shape);
    sg_tensor *x = tu_rand_layout(c, dt, ndim, shape, shift - 3, shift + 3, layout, &v);
    sg_tensor *w = NULL, *b = NULL;
    /* A sliced layout slices the weights too (stride 2). */
    if (which & 1) w = tu_rand_layout(c, dt, 1, &C, 0.5, 2, layout, &wv);
    if (which & 2) b = tu_rand_layout(c, dt, 1, &C, -1, 1, layout, &bv);
    double *ref = malloc((size_t)(numel_of(ndim, shape) + 1) * sizeof(double));
    ref_norm(layer, rows, C, v, wv, bv, eps, ref);
    sg_tensor *y = layer ? sg_layer_norm(x, w, b, eps) : sg_rms_norm(x, w, eps);
    bool ok = check(y, dt, ndim, shape, ref);
    char sh[64];
    tu_case(ok, "%s(type=%s,x=%s,weight=%d,bias=%d,eps=%g,mean=%g,view=%s)",
            layer ? "LAYER_NORM" : "RMS_NORM", sg_dtype_name(dt),
            tu_shape(ndim, shape, sh, sizeof sh), which & 1, (which >> 1) & 1, eps, shift,
            tu_layout_name(layout));
    sg_release(x), sg_release(w), sg_release(b), sg_release(y);
    free(v), free(wv), free(bv), free(ref);
}

static void test_norms(void) {
    static const row_case cases[] = {
        {2, {4, 8}, 0}, {2, {3, 1}, 0}, {3, {2, 3, 300}, 0},
        {1, {7}, 0},    {2, {0, 5}, 0}, {3, {2, 1, 6}, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        for (int t = 0; t < 3; t++)
            for (int l = 0; l < TU_NUM_LAYOUTS; l++) {
                for (int which = 0; which < 4; which++)
                    norm_case(ctx, true, floats[t], cases[i].ndim, cases[i].shape, which,
                              (tu_layout)l, 1e-5, 0);
                for (int which = 0; which < 2; which++)
                    norm_case(ctx, false, floats[t], cases[i].ndim, cases[i].shape, which,
                              (tu_layout)l, 1e-5, 0);
            }
    int64_t big[2] = {64, 1000}, e[2] = {5, 0}, s[2] = {8, 64};
    for (int t = 0; t < 3; t++) {
        norm_case(ctx_mt, true, floats[t], 2, big, 3, (tu_layout)t, 1e-5, 0);
        norm_case(ctx_mt, false, floats[t], 2, big, 1, (tu_layout)t, 1e-6, 0);
        norm_case(ctx, true, floats[t], 2, e, 0, TU_CONTIG, 1e-5, 0);
        norm_case(ctx, false, floats[t], 2, s, 1, TU_SLICED, 0.5, 0);
    }
    /* A mean far from zero must not cancel the variance away, nor its f32
     * rounding (half an ulp of 1000, 3e-5) shift every normalized value:
     * kept in every sampled run. */
    norm_always = true;
    norm_case(ctx, true, SG_F32, 2, s, 3, TU_CONTIG, 1e-5, 1000);
    norm_case(ctx, false, SG_F32, 2, s, 1, TU_PERMUTED, 1e-5, 1000);
    norm_always = false;
}

/* ------------------------------------------------------------ cross entropy */

static void ce_case(sg_ctx *c, sg_dtype dt, sg_dtype tdt, int64_t N, int64_t C, tu_layout layout,
                    double mag) {
    if (!tu_sampled()) return;
    int64_t shape[2] = {N, C};
    double *v, *tv;
    sg_tensor *x = tu_rand_layout(c, dt, 2, shape, -mag, mag, layout, &v);
    /* Targets are sliced (stride 2) when the logits are. */
    sg_tensor *t = tu_rand_layout(c, tdt, 1, &N, 0, (double)(C - 1), layout, &tv);
    double total = 0;
    for (int64_t n = 0; n < N; n++) {
        double m = -INFINITY, s = 0;
        for (int64_t j = 0; j < C; j++) m = v[n * C + j] > m ? v[n * C + j] : m;
        for (int64_t j = 0; j < C; j++) s += exp(v[n * C + j] - m);
        total += m + log(s) - v[n * C + (int64_t)tv[n]];
    }
    double ref = N ? total / (double)N : NAN;
    sg_tensor *y = sg_cross_entropy(x, t);
    int64_t none[1] = {0};
    bool ok = check(y, SG_F32, 0, none, &ref);
    tu_case(ok, "CROSS_ENTROPY(type=%s,targets=%s,logits=[%lld,%lld],range=%g,view=%s)",
            sg_dtype_name(dt), sg_dtype_name(tdt), (long long)N, (long long)C, mag,
            tu_layout_name(layout));
    sg_release(x), sg_release(t), sg_release(y);
    free(v), free(tv);
}

static void test_cross_entropy(void) {
    /* {128, 10}: W4's loss (on CUDA, 16 blocks, the last taking the mean). */
    static const int64_t nc[][2] = {{4, 5}, {1, 1},   {0, 5},    {37, 300},
                                    {3, 2}, {200, 7}, {128, 10}, {64, 64}};
    for (size_t i = 0; i < sizeof nc / sizeof *nc; i++)
        for (int t = 0; t < 3; t++)
            for (int l = 0; l < TU_NUM_LAYOUTS; l++) {
                ce_case(ctx, floats[t], SG_I64, nc[i][0], nc[i][1], (tu_layout)l, 4);
                ce_case(ctx, floats[t], SG_I32, nc[i][0], nc[i][1], (tu_layout)l, 4);
            }
    for (int t = 0; t < 3; t++) {
        ce_case(ctx, floats[t], SG_I64, 6, 50, TU_PERMUTED, 80);
        ce_case(ctx_mt, floats[t], SG_I32, 512, 1000, (tu_layout)t, 10);
    }
    ce_case(ctx, SG_F32, SG_I64, 6, 50, TU_CONTIG, 1e4);
    /* Rows over 1k: a block each (on CUDA, 16-byte vectors from an odd start). */
    for (int t = 0; t < 3; t++)
        for (int l = 0; l < TU_NUM_LAYOUTS; l++)
            ce_case(ctx, floats[t], SG_I64, 16, 3001, (tu_layout)l, 8);
}

/* ------------------------------------------------------------ bad input */

/* After a failure the context must still run a valid op. */
static bool still_works(void) {
    sg_clear_error(ctx);
    int64_t shape[2] = {2, 4};
    sg_tensor *x = sg_full(ctx, SG_F32, 2, shape, 3.0);
    sg_tensor *s = sg_softmax(x, 1);
    float v[8] = {0};
    bool ok = TU_EXPECT(s && sg_read(s, v, sizeof v) == SG_OK && v[0] == 0.25f && v[7] == 0.25f) &&
              TU_EXPECT(sg_ctx_status(ctx) == SG_OK);
    sg_release(x), sg_release(s);
    return ok;
}

static bool expect_fail(sg_tensor *y, sg_status want, const char *op, const char *what) {
    const char *msg = sg_last_error(ctx);
    bool ok = TU_EXPECT(y == NULL) && TU_EXPECT(sg_ctx_status(ctx) == want) &&
              TU_EXPECT(strstr(msg, op) != NULL) && TU_EXPECT(strstr(msg, what) != NULL);
    if (!ok) fprintf(stderr, "  message: %s\n", msg);
    return ok;
}

static void test_bad_input(void) {
    int64_t s2[2] = {3, 5}, s5[1] = {5}, s4[1] = {4}, s3[1] = {3}, s35[2] = {3, 5},
            s135[3] = {1, 3, 5};
    sg_tensor *x = sg_zeros(ctx, SG_F32, 2, s2), *xi = sg_zeros(ctx, SG_I32, 2, s2);
    sg_tensor *z = sg_zeros(ctx, SG_F32, 0, NULL), *w5 = sg_zeros(ctx, SG_F32, 1, s5);
    sg_tensor *w4 = sg_zeros(ctx, SG_F32, 1, s4), *w2d = sg_zeros(ctx, SG_F32, 2, s35);
    sg_tensor *w5h = sg_zeros(ctx, SG_F16, 1, s5), *x3 = sg_zeros(ctx, SG_F32, 3, s135);
    int64_t tbad[3] = {0, 4, 5}, tneg[3] = {0, -100, 1};
    sg_tensor *t3 = sg_zeros(ctx, SG_I64, 1, s3), *t4 = sg_zeros(ctx, SG_I64, 1, s4);
    sg_tensor *tf = sg_zeros(ctx, SG_F32, 1, s3), *t2d = sg_zeros(ctx, SG_I64, 2, s35);
    sg_tensor *tb = sg_from_host(ctx, SG_I64, 1, s3, tbad),
              *tn = sg_from_host(ctx, SG_I64, 1, s3, tneg);
#define BAD(call, st, op, what, label)                                                             \
    do {                                                                                           \
        bool ok_ = expect_fail(call, st, op, what);                                                \
        tu_case(still_works() && ok_, "BAD(%s)", label);                                           \
    } while (0)
    BAD(sg_softmax(xi, 1), SG_ERR_DTYPE, "sg_softmax", "f32, f16 or bf16", "softmax of i32");
    BAD(sg_log_softmax(x, 2), SG_ERR_INDEX, "sg_log_softmax", "out of range", "dim 2 of 2-d");
    BAD(sg_softmax(x, -3), SG_ERR_INDEX, "sg_softmax", "out of range", "dim -3 of 2-d");
    BAD(sg_softmax(z, 1), SG_ERR_INDEX, "sg_softmax", "out of range", "dim 1 of 0-d");
    BAD(sg_layer_norm(xi, NULL, NULL, 1e-5), SG_ERR_DTYPE, "sg_layer_norm", "i32", "x of i32");
    BAD(sg_layer_norm(z, NULL, NULL, 1e-5), SG_ERR_SHAPE, "sg_layer_norm", "0-d", "x 0-d");
    BAD(sg_layer_norm(x, w4, NULL, 1e-5), SG_ERR_SHAPE, "sg_layer_norm", "weight", "weight [4]");
    BAD(sg_layer_norm(x, w2d, NULL, 1e-5), SG_ERR_SHAPE, "sg_layer_norm", "1-d", "weight 2-d");
    BAD(sg_layer_norm(x, w5, w4, 1e-5), SG_ERR_SHAPE, "sg_layer_norm", "bias", "bias [4]");
    BAD(sg_layer_norm(x, NULL, w5h, 1e-5), SG_ERR_DTYPE, "sg_layer_norm", "bias", "bias f16");
    BAD(sg_layer_norm(x, w5, NULL, -1.0), SG_ERR_INVALID_ARG, "sg_layer_norm", "eps", "eps -1");
    BAD(sg_rms_norm(x, w5, NAN), SG_ERR_INVALID_ARG, "sg_rms_norm", "eps", "eps NaN");
    BAD(sg_rms_norm(x, w4, 1e-5), SG_ERR_SHAPE, "sg_rms_norm", "weight", "rms weight [4]");
    BAD(sg_rms_norm(x, w5h, 1e-5), SG_ERR_DTYPE, "sg_rms_norm", "weight", "rms weight f16");
    BAD(sg_cross_entropy(w5, t3), SG_ERR_SHAPE, "sg_cross_entropy", "2-d", "logits 1-d");
    BAD(sg_cross_entropy(x3, t3), SG_ERR_SHAPE, "sg_cross_entropy", "2-d", "logits 3-d");
    BAD(sg_cross_entropy(xi, t3), SG_ERR_DTYPE, "sg_cross_entropy", "logits", "logits i32");
    BAD(sg_cross_entropy(x, tf), SG_ERR_DTYPE, "sg_cross_entropy", "i32 or i64", "targets f32");
    BAD(sg_cross_entropy(x, t4), SG_ERR_SHAPE, "sg_cross_entropy", "N = 3", "targets [4]");
    BAD(sg_cross_entropy(x, t2d), SG_ERR_SHAPE, "sg_cross_entropy", "1-d", "targets 2-d");
    BAD(sg_cross_entropy(x, tb), SG_ERR_INDEX, "sg_cross_entropy", "targets[2] is 5",
        "target 5 of 5 classes");
    BAD(sg_cross_entropy(x, tn), SG_ERR_INDEX, "sg_cross_entropy", "targets[1] is -100",
        "target -100");
#undef BAD
    /* NULL x (an earlier failure) returns NULL silently; a NULL weight is left out. */
    bool ok =
        TU_EXPECT(sg_softmax(NULL, 0) == NULL && sg_layer_norm(NULL, w5, NULL, 1e-5) == NULL &&
                  sg_cross_entropy(x, NULL) == NULL) &&
        TU_EXPECT(sg_ctx_status(ctx) == SG_OK && sg_last_error(ctx)[0] == '\0');
    tu_case(still_works() && ok, "BAD(NULL input returns NULL, no new error)");
    sg_tensor *r = sg_zeros(ctx, SG_F32, 1, s5);
    sg_release(r);
    ok = expect_fail(sg_layer_norm(x, r, NULL, 1e-5), SG_ERR_RELEASED, "layer_norm", "released");
    tu_case(still_works() && ok, "BAD(released weight)");
    sg_release(x), sg_release(xi), sg_release(z), sg_release(w5), sg_release(w4), sg_release(w2d);
    sg_release(w5h), sg_release(x3), sg_release(t3), sg_release(t4), sg_release(tf);
    sg_release(t2d), sg_release(tb), sg_release(tn);
}

int main(void) {
    ctx = tu_ctx((sg_ctx_opts){0});
    ctx_mt = tu_ctx((sg_ctx_opts){.num_threads = 5});
    tu_seed(11);
    test_softmax();
    test_softmax_masked();
    for (int t = 0; t < 3; t++) test_softmax_expanded(floats[t]);
    test_norms();
    test_cross_entropy();
    test_bad_input();
    sg_ctx_destroy(ctx_mt);
    sg_ctx_destroy(ctx);
    return tu_finish();
}
