/* SPDX-License-Identifier: MIT */
/*
 * test_capture_xent.c -- cross_entropy's gradient over wide rows of odd
 * width (a row of 1001 bf16 or f32 logits starts at every alignment), the
 * shape of a language model's head: the loss and the logits' own gradient
 * (contiguous, transposed and sliced logits, a scaled loss), and the gradients of x and
 * w through linear -> cross_entropy, eager and compiled (DEFAULT and
 * REDUCE_OVERHEAD, where the logits and their gradient get padded rows:
 * memory/pad.c), against an f64 reference written here; and which buffers
 * are padded when the logits are also returned or read by a pointwise op
 * (the compiled step against the eager one).
 */
#include "testutil.h"

#include <math.h>
#include <string.h>

static sg_ctx *ctx;

enum { N = 24, NH = 512, K = 40, C = 1001 }; /* NH x C x K: padded on CUDA (SG__MM_PAD_MIN) */

/* Lines logged when a compile pads buffers' rows. */
static char padded[256];

static void log_hook(void *user, const char *topic, const char *line) {
    (void)user;
    if (strcmp(topic, "perf_hints") == 0 && strstr(line, "unaligned rows padded"))
        snprintf(padded, sizeof padded, "%s", line);
}

/* d(scale * mean_r(lse(l_r) - l_r[t_r])) / dl, row-major (rows, cols). */
static void ref_dlogits(const double *l, const int64_t *t, int64_t rows, int64_t cols, double scale,
                        double *d) {
    for (int64_t r = 0; r < rows; r++) {
        const double *row = l + r * cols;
        double m = -INFINITY, s = 0;
        for (int64_t j = 0; j < cols; j++) m = row[j] > m ? row[j] : m;
        for (int64_t j = 0; j < cols; j++) s += exp(row[j] - m);
        for (int64_t j = 0; j < cols; j++)
            d[r * cols + j] =
                (exp(row[j] - m) / s - (j == t[r] ? 1.0 : 0.0)) * scale / (double)rows;
    }
}

/* |got - ref| <= rtol * (|ref| + the largest |ref|): a sum of many rounded
 * terms is checked against the scale of the whole gradient. */
static bool close_scaled(const char *what, const double *got, const double *ref, int64_t n,
                         double rtol) {
    double big = 0;
    for (int64_t i = 0; i < n; i++) big = fabs(ref[i]) > big ? fabs(ref[i]) : big;
    return tu_close(what, got, ref, n, rtol, rtol * big);
}

static sg_tensor *targets(int64_t n, int64_t cols, int64_t *tv) {
    for (int64_t i = 0; i < n; i++) tv[i] = tu_randint(0, cols - 1);
    tv[0] = 0, tv[n - 1] = cols - 1; /* the first and last columns */
    return sg_from_host(ctx, SG_I64, 1, &n, tv);
}

/* The logits as a leaf, rows of `cols`: the loss and its gradient, for
 * each layout of the logits. */
static void logits_case(sg_dtype dt, int64_t cols, tu_layout lay, uint64_t seed) {
    tu_seed(seed);
    int64_t sh[2] = {N, cols}, tv[N], n = N * cols;
    double *lv, *want = malloc(sizeof(double) * (size_t)n), scale = 0.75, lref = 0, lgot = NAN;
    sg_tensor *l = tu_rand_layout(ctx, dt, 2, sh, -4, 4, lay, &lv), *t = targets(N, cols, tv);
    sg_tensor *g = NULL;
    bool ok = TU_EXPECT(sg_requires_grad_(l, true) == SG_OK);
    sg_tensor *loss = sg_mul_scalar(sg_cross_entropy(l, t), scale);
    ok = ok && TU_EXPECT(sg_grad(loss, 1, &l, &g) == SG_OK) &&
         TU_EXPECT(sg_item(loss, &lgot) == SG_OK);
    double *got = ok ? tu_read(g) : NULL;
    ref_dlogits(lv, tv, N, cols, scale, want);
    for (int64_t r = 0; r < N; r++) { /* scale * mean(lse - x[t]) */
        double m = -INFINITY, s = 0;
        for (int64_t j = 0; j < cols; j++) m = lv[r * cols + j] > m ? lv[r * cols + j] : m;
        for (int64_t j = 0; j < cols; j++) s += exp(lv[r * cols + j] - m);
        lref += (m + log(s) - lv[r * cols + tv[r]]) * scale / N;
    }
    ok = ok && TU_EXPECT(got != NULL) && TU_EXPECT(sg_tensor_dtype(g) == dt) &&
         TU_EXPECT(tu_close("loss", &lgot, &lref, 1, 1e-5, 1e-6)) &&
         TU_EXPECT(tu_close("dlogits", got, want, n, tu_rtol(dt), tu_atol(dt) / (double)cols));
    tu_case(ok, "XENT_GRAD_LOGITS(type=%s,logits=[%d,%lld],layout=%s,scale=%g) seed=%llu",
            sg_dtype_name(dt), N, (long long)cols, tu_layout_name(lay), scale,
            (unsigned long long)seed);
    free(got), free(lv), free(want);
    sg_release(l), sg_release(t), sg_release(g), sg_release(loss);
}

/* ------------------------------------------------------------ linear -> cross_entropy */

/* How the step uses the logits: as the LM head does (both the logits and
 * their gradient padded), also returning them (an output keeps its layout:
 * only the gradient is padded), or scaling them first (read by a pointwise
 * op: neither is padded). */
enum use { U_HEAD, U_RETURNED, U_SCALED };
static const char *const use_names[] = {"head", "returned", "scaled"};

typedef struct head {
    sg_tensor *w; /* (C, K) */
    enum use use;
} head;

static sg_status head_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)c;
    head *h = user;
    sg_tensor *x = in[0], *p[2] = {x, h->w}, *g[2] = {NULL, NULL};
    sg_tensor *logits = sg_linear(x, h->w, NULL);
    sg_tensor *loss =
        sg_cross_entropy(h->use == U_SCALED ? sg_mul_scalar(logits, 0.5) : logits, in[1]);
    sg_status s = sg_grad(loss, 2, p, g);
    out[0] = loss, out[1] = g[0], out[2] = g[1];
    if (h->use == U_RETURNED) out[3] = logits;
    return s;
}

/* The rules of padding: the step as `use` says, compiled, gives the eager
 * step's numbers, and pads the buffers it may. */
static void use_case(enum use use, uint64_t seed) {
    tu_seed(seed);
    int64_t xs[2] = {NH, K}, ws[2] = {C, K}, tv[NH];
    double *xv, *wv;
    sg_tensor *x = tu_rand(ctx, SG_F32, 2, xs, -1, 1, &xv);
    head h = {.w = tu_rand(ctx, SG_F32, 2, ws, -1, 1, &wv), .use = use};
    sg_tensor *t = targets(NH, C, tv), *in[2] = {x, t}, *ref[4] = {NULL}, *got[4] = {NULL};
    int nout = use == U_RETURNED ? 4 : 3;
    bool ok = TU_EXPECT(sg_requires_grad_(x, true) == SG_OK) &&
              TU_EXPECT(sg_requires_grad_(h.w, true) == SG_OK) &&
              TU_EXPECT(head_step(ctx, in, ref, &h) == SG_OK);
    sg_fn *fn = NULL;
    padded[0] = '\0';
    ok = ok && TU_EXPECT(sg_compile(ctx, head_step, &h, 2, nout, NULL, &fn) == SG_OK);
    for (int call = 0; ok && call < 2; call++) {
        for (int k = 0; k < 4; k++) sg_release(got[k]), got[k] = NULL;
        ok = TU_EXPECT(sg_call(fn, in, 2, got, nout) == SG_OK);
    }
    const char *want = use == U_HEAD ? "2 buffers" : use == U_RETURNED ? "1 buffer " : NULL;
    ok = ok && (want ? TU_EXPECT(strstr(padded, want) != NULL) : TU_EXPECT(!padded[0]));
    for (int k = 0; ok && k < nout; k++) {
        int64_t n = sg_tensor_numel(ref[k]);
        double *a = tu_read(got[k]), *b = tu_read(ref[k]);
        ok = TU_EXPECT(a && b) && close_scaled("out", a, b, n, 1e-5) &&
             TU_EXPECT(sg_tensor_is_contiguous(got[k]));
        free(a), free(b);
    }
    tu_case(ok, "XENT_PAD_RULES(use=%s,x=[%d,%d],w=[%d,%d]) -> %s seed=%llu", use_names[use], NH, K,
            C, K, padded[0] ? padded : "none padded", (unsigned long long)seed);
    sg_fn_destroy(fn);
    for (int k = 0; k < 4; k++) sg_release(ref[k]), sg_release(got[k]);
    free(xv), free(wv);
    sg_release(x), sg_release(h.w), sg_release(t);
}

/* f64: the logits x w^T rounded to dt (as the product stores them), then
 * dx = d w and dw = d^T x from their gradient d. */
static void ref_head(sg_dtype dt, const double *x, const double *w, const int64_t *tv, double *dx,
                     double *dw) {
    double *l = malloc(sizeof(double) * NH * C), *d = malloc(sizeof(double) * NH * C);
    for (int64_t r = 0; r < NH; r++)
        for (int64_t j = 0; j < C; j++) {
            double a = 0;
            for (int64_t k = 0; k < K; k++) a += x[r * K + k] * w[j * K + k];
            l[r * C + j] = tu_round(dt, a);
        }
    ref_dlogits(l, tv, NH, C, 1.0, d);
    memset(dx, 0, sizeof(double) * NH * K);
    memset(dw, 0, sizeof(double) * C * K);
    for (int64_t r = 0; r < NH; r++)
        for (int64_t j = 0; j < C; j++)
            for (int64_t k = 0; k < K; k++) {
                dx[r * K + k] += d[r * C + j] * w[j * K + k];
                dw[j * K + k] += d[r * C + j] * x[r * K + k];
            }
    free(l), free(d);
}

static void head_case(sg_dtype dt, sg_mode mode, uint64_t seed) {
    tu_seed(seed);
    int64_t xs[2] = {NH, K}, ws[2] = {C, K}, tv[NH];
    double *xv, *wv, *dx = malloc(sizeof(double) * NH * K), *dw = malloc(sizeof(double) * C * K);
    sg_tensor *x = tu_rand(ctx, dt, 2, xs, -1, 1, &xv);
    head h = {.w = tu_rand(ctx, dt, 2, ws, -1, 1, &wv)};
    sg_tensor *t = targets(NH, C, tv), *in[2] = {x, t}, *out[4] = {NULL, NULL, NULL, NULL};
    bool ok = TU_EXPECT(sg_requires_grad_(x, true) == SG_OK) &&
              TU_EXPECT(sg_requires_grad_(h.w, true) == SG_OK);
    sg_fn *fn = NULL;
    padded[0] = '\0';
    if (ok && mode == SG_MODE_EAGER) {
        ok = TU_EXPECT(head_step(ctx, in, out, &h) == SG_OK);
    } else if (ok) {
        ok = TU_EXPECT(
            sg_compile(ctx, head_step, &h, 2, 3, &(sg_compile_opts){.mode = mode}, &fn) == SG_OK);
        /* Twice: the second call replays what the first recorded. */
        for (int call = 0; ok && call < 2; call++) {
            for (int k = 0; k < 3; k++) sg_release(out[k]), out[k] = NULL;
            ok = TU_EXPECT(sg_call(fn, in, 2, out, 3) == SG_OK);
        }
    }
    /* Compiled, the logits and their gradient have padded rows. */
    ok = ok && (mode == SG_MODE_EAGER ? TU_EXPECT(!padded[0])
                                      : TU_EXPECT(strstr(padded, "2 buffers") != NULL));
    ref_head(dt, xv, wv, tv, dx, dw);
    double *gx = ok ? tu_read(out[1]) : NULL, *gw = ok ? tu_read(out[2]) : NULL;
    ok = ok && TU_EXPECT(gx && gw) && close_scaled("dx", gx, dx, NH * K, tu_rtol(dt)) &&
         close_scaled("dw", gw, dw, C * K, tu_rtol(dt));
    if (!ok && sg_last_error(ctx)[0]) fprintf(stderr, "  %s\n", sg_last_error(ctx));
    tu_case(ok, "XENT_GRAD_HEAD(type=%s,mode=%s,x=[%d,%d],w=[%d,%d]) seed=%llu", sg_dtype_name(dt),
            sg_mode_name(mode), NH, K, C, K, (unsigned long long)seed);
    sg_clear_error(ctx);
    sg_fn_destroy(fn);
    free(gx), free(gw), free(xv), free(wv), free(dx), free(dw);
    for (int k = 0; k < 3; k++) sg_release(out[k]);
    sg_release(x), sg_release(h.w), sg_release(t);
}

int main(void) {
    ctx = tu_ctx((sg_ctx_opts){.log = log_hook});
    static const sg_dtype dts[3] = {SG_F32, SG_BF16, SG_F16};
    static const sg_mode modes[3] = {SG_MODE_EAGER, SG_MODE_DEFAULT, SG_MODE_REDUCE_OVERHEAD};
    uint64_t seed = 1;
    for (int d = 0; d < 3; d++)
        for (int w = 0; w < 2; w++) /* a warp's row and a block's row of the forward */
            for (int lay = 0; lay < TU_NUM_LAYOUTS; lay++)
                logits_case(dts[d], w ? 3001 : C, (tu_layout)lay, seed++);
    for (int d = 0; d < 2; d++)
        for (int m = 0; m < 3; m++) head_case(dts[d], modes[m], seed++);
    for (int u = 0; u < 3; u++) use_case((enum use)u, seed++);
    sg_ctx_destroy(ctx);
    return tu_finish();
}
