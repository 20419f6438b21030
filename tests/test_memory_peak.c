/* SPDX-License-Identifier: MIT */
/*
 * test_memory_peak.c -- the device bytes a compiled training step holds, seen
 * through sg_memory_stats, against what its values need. A two-layer
 * perceptron (x (B, D) -> tanh(x W1) (B, H) -> y (B, O), mean squared error
 * against t, sg_grad, SGD in place) and its forward-only evaluation on a
 * smaller batch, each compiled in the mode under test; the evaluation runs
 * first, so that the training step's larger scratch comes while the
 * evaluation's output set is alive. Per mode, in a context of its own:
 *  - before compiling, the context holds the tensors' bytes (from shapes);
 *  - after the calls it holds those, the pool's scratch and the output sets
 *    (a 4-byte loss each, rounded to the pool's 256 bytes), and scratch is
 *    at least the most intermediate bytes live at once and at most the
 *    bytes of every value of the step (counted in the test from shapes);
 *  - the peak is what it holds then: nothing held on top of it at any time,
 *    as when the pool held its old and its new bytes while growing;
 *  - after both fns are destroyed, the tensors' bytes again;
 *  - every loss and the weights after the updates match an f64 reference.
 * Cases: `PEAK(mode=reduce-overhead, ...)`.
 *
 * And a linear classifier's step (logits x W (N, C), cross_entropy, its
 * gradient, SGD): the logits' gradient takes the logits' bytes, so scratch
 * stays under the two of them together, over rows of 16-byte multiples and
 * over padded ones; its losses and W against f64. Cases: `XENT_INPLACE(...)`.
 */
#include "testutil.h"

#include <math.h>
#include <string.h>

enum { B = 32, BE = 8, D = 24, H = 48, O = 8, STEPS = 3 };
#define LR 0.25

typedef struct mlp {
    sg_tensor *w1, *w2;
} mlp;

static sg_tensor *mse(mlp *m, sg_tensor *x, sg_tensor *t) {
    sg_tensor *y = sg_matmul(sg_tanh(sg_matmul(x, m->w1)), m->w2);
    sg_tensor *d = sg_sub(y, t);
    return sg_mean(sg_mul(d, d), 0, NULL, false);
}

static sg_status train_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    mlp *m = user;
    sg_tensor *loss = mse(m, in[0], in[1]), *g[2], *w[2] = {m->w1, m->w2};
    sg_status s = sg_grad(loss, 2, w, g);
    if (s != SG_OK) return s;
    sg_set_grad_enabled(c, false);
    for (int k = 0; k < 2 && s == SG_OK; k++)
        s = sg_copy_(w[k], sg_sub(w[k], sg_mul_scalar(g[k], LR)));
    sg_set_grad_enabled(c, true);
    out[0] = loss;
    return s;
}

static sg_status eval_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    sg_set_grad_enabled(c, false);
    out[0] = mse(user, in[0], in[1]);
    sg_set_grad_enabled(c, true);
    return out[0] ? SG_OK : sg_ctx_status(c);
}

/* The f64 reference: the loss of rows n of x against t under w1, w2. */
static double ref_loss(const double *w1, const double *w2, const double *x, const double *t, int n,
                       double *h, double *dy) {
    double loss = 0;
    for (int b = 0; b < n; b++) {
        for (int j = 0; j < H; j++) {
            double z = 0;
            for (int i = 0; i < D; i++) z += x[b * D + i] * w1[i * H + j];
            h[b * H + j] = tanh(z);
        }
        for (int o = 0; o < O; o++) {
            double y = 0;
            for (int j = 0; j < H; j++) y += h[b * H + j] * w2[j * O + o];
            double d = y - t[b * O + o];
            loss += d * d;
            dy[b * O + o] = 2 * d / (n * O);
        }
    }
    return loss / (n * O);
}

/* One SGD step of the reference; the loss before it. */
static double ref_train(double *w1, double *w2, const double *x, const double *t) {
    static double h[B * H], dy[B * O], dz[B * H], g1[D * H], g2[H * O];
    double loss = ref_loss(w1, w2, x, t, B, h, dy);
    for (int b = 0; b < B; b++)
        for (int j = 0; j < H; j++) {
            double dh = 0;
            for (int o = 0; o < O; o++) dh += dy[b * O + o] * w2[j * O + o];
            dz[b * H + j] = dh * (1 - h[b * H + j] * h[b * H + j]);
        }
    memset(g1, 0, sizeof g1);
    memset(g2, 0, sizeof g2);
    for (int b = 0; b < B; b++) {
        for (int j = 0; j < H; j++)
            for (int o = 0; o < O; o++) g2[j * O + o] += h[b * H + j] * dy[b * O + o];
        for (int i = 0; i < D; i++)
            for (int j = 0; j < H; j++) g1[i * H + j] += x[b * D + i] * dz[b * H + j];
    }
    for (int k = 0; k < D * H; k++) w1[k] -= LR * g1[k];
    for (int k = 0; k < H * O; k++) w2[k] -= LR * g2[k];
    return loss;
}

/* Every value the training step makes, forward, backward and update, at
 * most this many floats: what no scratch needs to exceed. */
static size_t step_value_bytes(void) {
    size_t f = 6 * (B * H) + 8 * (B * O) + 3 * (D * H + H * O) + 8;
    return f * sizeof(float) + 40 * 256; /* each value rounded to the pool's alignment */
}

static bool call(sg_fn *fn, sg_tensor *x, sg_tensor *t, double want, const char *what) {
    sg_tensor *in[2] = {x, t}, *loss = NULL;
    double got = NAN;
    bool ok = TU_EXPECT(sg_mark_step_begin(sg_tensor_ctx(x)) == SG_OK) &&
              TU_EXPECT(sg_call(fn, in, 2, &loss, 1) == SG_OK) &&
              TU_EXPECT(sg_item(loss, &got) == SG_OK);
    if (!ok) fprintf(stderr, "  %s: %s\n", what, sg_last_error(sg_tensor_ctx(x)));
    return ok && tu_close(what, &got, &want, 1, 1e-5, 1e-6);
}

static void peak(sg_mode mode) {
    sg_ctx *ctx = tu_ctx((sg_ctx_opts){0});
    tu_seed(7);
    int64_t s1[2] = {D, H}, s2[2] = {H, O}, sx[2] = {B, D}, st[2] = {B, O}, sxe[2] = {BE, D},
            ste[2] = {BE, O};
    double *w1v, *w2v, *xv, *tv, *xev, *tev;
    mlp m = {tu_rand(ctx, SG_F32, 2, s1, -0.3, 0.3, &w1v),
             tu_rand(ctx, SG_F32, 2, s2, -0.3, 0.3, &w2v)};
    sg_tensor *x = tu_rand(ctx, SG_F32, 2, sx, -1, 1, &xv),
              *t = tu_rand(ctx, SG_F32, 2, st, -1, 1, &tv);
    sg_tensor *xe = tu_rand(ctx, SG_F32, 2, sxe, -1, 1, &xev);
    sg_tensor *te = tu_rand(ctx, SG_F32, 2, ste, -1, 1, &tev);
    size_t tensors = sizeof(float) * (D * H + H * O + B * D + B * O + BE * D + BE * O);
    sg_requires_grad_(m.w1, true);
    sg_requires_grad_(m.w2, true);
    sg_memory_stats before, cs, fs;
    bool ok = TU_EXPECT(sg_ctx_memory_stats(ctx, &before) == SG_OK) &&
              TU_EXPECT(before.device_bytes == tensors);
    sg_ctx_reset_peak_memory(ctx);

    sg_fn *train = NULL, *eval = NULL;
    sg_compile_opts o = {.mode = mode, .fullgraph = true};
    ok = ok && TU_EXPECT(sg_compile(ctx, eval_step, &m, 2, 1, &o, &eval) == SG_OK) &&
         TU_EXPECT(sg_compile(ctx, train_step, &m, 2, 1, &o, &train) == SG_OK);
    static double h[B * H], dy[B * O];
    ok = ok && call(eval, xe, te, ref_loss(w1v, w2v, xev, tev, BE, h, dy), "eval loss (capture)");
    for (int k = 0; k < STEPS && ok; k++) {
        char what[64];
        snprintf(what, sizeof what, "training loss %d", k + 1);
        ok = call(train, x, t, ref_train(w1v, w2v, xv, tv), what);
    }
    ok = ok && call(eval, xe, te, ref_loss(w1v, w2v, xev, tev, BE, h, dy), "eval loss (replay)");
    double *w1 = ok ? tu_read(m.w1) : NULL, *w2 = ok ? tu_read(m.w2) : NULL;
    ok = ok && TU_EXPECT(w1 && w2) && tu_close("w1", w1, w1v, D * H, 1e-5, 1e-6) &&
         tu_close("w2", w2, w2v, H * O, 1e-5, 1e-6);
    free(w1);
    free(w2);

    ok = ok && TU_EXPECT(sg_ctx_memory_stats(ctx, &cs) == SG_OK) &&
         TU_EXPECT(sg_fn_memory_stats(train, &fs) == SG_OK);
    size_t sets = cs.pool_bytes - cs.scratch_bytes - cs.constant_bytes;
    if (ok)
        fprintf(stderr,
                "  %s: tensors %zu, scratch %zu (live at most %zu), output sets %zu, "
                "held %zu, peak %zu\n",
                sg_mode_name(mode), tensors, cs.scratch_bytes, fs.peak_live_bytes, sets,
                cs.device_bytes, cs.device_peak_bytes);
    ok = ok && TU_EXPECT(cs.device_bytes == tensors + cs.pool_bytes) &&
         TU_EXPECT(sets == cs.output_bytes) && TU_EXPECT(sets % 256 == 0) &&
         TU_EXPECT(sets >= 2 * 256 && sets <= 4 * 256) &&
         TU_EXPECT(cs.scratch_bytes >= fs.peak_live_bytes) &&
         TU_EXPECT(cs.scratch_bytes <= step_value_bytes()) &&
         TU_EXPECT(cs.device_peak_bytes == cs.device_bytes);
    sg_fn_destroy(train);
    sg_fn_destroy(eval);
    ok = ok && TU_EXPECT(sg_ctx_memory_stats(ctx, &cs) == SG_OK) &&
         TU_EXPECT(cs.device_bytes == tensors);
    tu_case(ok, "PEAK(mode=%s, MLP %dx%d -> %d -> %d, eval on %d rows first, %d SGD steps)",
            sg_mode_name(mode), B, D, H, O, BE, STEPS);
    free(w1v), free(w2v), free(xv), free(tv), free(xev), free(tev);
    sg_release(m.w1), sg_release(m.w2), sg_release(x), sg_release(t), sg_release(xe),
        sg_release(te);
    sg_ctx_destroy(ctx);
}

/* ------------------------------------------------------------ the classifier */

enum { N = 64, DX = 16 };

static sg_status xent_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    sg_tensor **w = user, *g;
    sg_tensor *loss = sg_cross_entropy(sg_matmul(in[0], *w), in[1]);
    sg_status s = sg_grad(loss, 1, w, &g);
    if (s != SG_OK) return s;
    sg_set_grad_enabled(c, false);
    s = sg_copy_(*w, sg_sub(*w, sg_mul_scalar(g, LR)));
    sg_set_grad_enabled(c, true);
    out[0] = loss;
    return s;
}

/* One SGD step of the classifier in f64; the loss before it. */
static double ref_xent(double *w, const double *x, const int64_t *y, int C) {
    double loss = 0, *dl = malloc(sizeof(double) * N * (size_t)C);
    for (int r = 0; r < N; r++) {
        double top = -INFINITY, sum = 0;
        for (int c = 0; c < C; c++) {
            double z = 0;
            for (int i = 0; i < DX; i++) z += x[r * DX + i] * w[i * C + c];
            dl[r * C + c] = z;
            top = fmax(top, z);
        }
        for (int c = 0; c < C; c++) sum += exp(dl[r * C + c] - top);
        loss += log(sum) + top - dl[r * C + y[r]];
        for (int c = 0; c < C; c++)
            dl[r * C + c] = (exp(dl[r * C + c] - top) / sum - (c == y[r])) / N;
    }
    for (int i = 0; i < DX; i++)
        for (int c = 0; c < C; c++) {
            double gw = 0;
            for (int r = 0; r < N; r++) gw += x[r * DX + i] * dl[r * C + c];
            w[i * C + c] -= LR * gw;
        }
    free(dl);
    return loss / N;
}

static void xent_inplace(sg_mode mode, int C) {
    sg_ctx *ctx = tu_ctx((sg_ctx_opts){0});
    tu_seed((uint64_t)C);
    int64_t sw[2] = {DX, C}, sx[2] = {N, DX}, sy[1] = {N}, y[N];
    double *wv, *xv;
    sg_tensor *w = tu_rand(ctx, SG_F32, 2, sw, -0.5, 0.5, &wv),
              *x = tu_rand(ctx, SG_F32, 2, sx, -1, 1, &xv);
    for (int r = 0; r < N; r++) y[r] = tu_randint(0, C - 1);
    sg_tensor *t = sg_from_host(ctx, SG_I64, 1, sy, y);
    sg_requires_grad_(w, true);
    sg_fn *fn = NULL;
    bool ok = TU_EXPECT(
        sg_compile(ctx, xent_step, &w, 2, 1, &(sg_compile_opts){.mode = mode}, &fn) == SG_OK);
    for (int k = 0; k < STEPS && ok; k++) {
        char what[64];
        snprintf(what, sizeof what, "loss %d", k + 1);
        ok = call(fn, x, t, ref_xent(wv, xv, y, C), what);
    }
    double *wg = ok ? tu_read(w) : NULL;
    ok = ok && TU_EXPECT(wg) && tu_close("w", wg, wv, DX * (int64_t)C, 1e-5, 1e-6);
    free(wg);
    sg_memory_stats fs, cs;
    size_t logits = (size_t)N * (size_t)C * sizeof(float);
    ok = ok && TU_EXPECT(sg_fn_memory_stats(fn, &fs) == SG_OK) &&
         TU_EXPECT(sg_ctx_memory_stats(ctx, &cs) == SG_OK);
    if (ok)
        fprintf(stderr, "  %s C=%d: logits %zu bytes, scratch %zu, peak %zu, held %zu\n",
                sg_mode_name(mode), C, logits, fs.scratch_bytes, cs.device_peak_bytes,
                cs.device_bytes);
    ok = ok && TU_EXPECT(fs.scratch_bytes >= logits) && TU_EXPECT(fs.scratch_bytes < 2 * logits) &&
         TU_EXPECT(cs.device_peak_bytes == cs.device_bytes);
    tu_case(ok, "XENT_INPLACE(mode=%s, logits [%d,%d] f32 from x [%d,%d] W [%d,%d], %d SGD steps)",
            sg_mode_name(mode), N, C, N, DX, DX, C, STEPS);
    sg_fn_destroy(fn);
    free(wv), free(xv);
    sg_release(w), sg_release(x), sg_release(t);
    sg_ctx_destroy(ctx);
}

int main(void) {
    xent_inplace(SG_MODE_REDUCE_OVERHEAD, 1000);
    xent_inplace(SG_MODE_REDUCE_OVERHEAD, 1001);
    xent_inplace(SG_MODE_MAX_AUTOTUNE, 1001);
    xent_inplace(SG_MODE_DEFAULT, 1000);
    peak(SG_MODE_REDUCE_OVERHEAD);
    peak(SG_MODE_MAX_AUTOTUNE);
    peak(SG_MODE_DEFAULT);
    return tu_finish();
}
