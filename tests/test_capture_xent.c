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
 * (the compiled step against the eager one); and the loss with its
 * gradient compiled (on CUDA one kernel: sg__group.xent) for vocabularies
 * short and long, rows off 16 bytes, i32 and i64 targets, against the f64
 * reference and, on CUDA, bit for bit against the eager kernels, replays
 * repeating their bits, a target out of range in a replay giving NaN, and
 * a step reading the loss before its gradient (no merge), also for few
 * short rows (W4's 128 x 10: a warp a row on CUDA).
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

/* ------------------------------------------------------------ the loss with its gradient */

/* in: base logits (N, C + skip), targets (N); the logits are columns [skip,
 * skip + C) of the base (skip 1: rows start off 16 bytes); out: the loss, the
 * base's gradient and, with read_between, the loss * 2 (read before the
 * gradient: the pair must not merge). */
typedef struct pair {
    int64_t skip, cols;
    bool read_between;
} pair;

static sg_status pair_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    const pair *p = user;
    sg_tensor *base = in[0];
    sg_tensor *loss = sg_cross_entropy(sg_narrow(in[0], 1, p->skip, p->cols), in[1]);
    if (p->read_between) out[2] = sg_mul_scalar(loss, 2.0); /* out has 3 entries only then */
    out[1] = NULL;
    sg_status s = loss ? sg_grad(loss, 1, &base, &out[1]) : sg_ctx_status(c);
    out[0] = loss;
    return s;
}

static size_t nbytes_of(const sg_tensor *t) {
    return (size_t)sg_tensor_numel(t) * sg_dtype_size(sg_tensor_dtype(t));
}

/* Each output's bytes, concatenated (malloc'd), *n their count. */
static unsigned char *bytes_of(sg_tensor *const *t, int n, size_t *nb) {
    size_t total = 0, at = 0;
    for (int k = 0; k < n; k++) total += nbytes_of(t[k]);
    unsigned char *b = malloc(total ? total : 1);
    for (int k = 0; k < n && b; k++) {
        size_t m = nbytes_of(t[k]);
        if (sg_read(t[k], b + at, m) != SG_OK) return free(b), NULL;
        at += m;
    }
    *nb = total;
    return b;
}

/*
 * The compiled step (REDUCE_OVERHEAD: on CUDA the loss's kernel merges into
 * its gradient's, sg__group.xent, unless read_between) against the f64
 * reference, twice (the replay gives the same bits), and against the eager
 * step (on CUDA the unfused kernels: the same bits); then with one target
 * out of range in a replay: on CUDA (no host check while replaying) the loss
 * and that row's gradient are NaN and the other rows unchanged; elsewhere
 * the call fails with SG_ERR_INDEX.
 */
static void pair_case(sg_dtype dt, sg_dtype tdt, int64_t rows, int64_t cols, int64_t skip,
                      bool read_between, uint64_t seed) {
    tu_seed(seed);
    int64_t wide = cols + skip, sh[2] = {rows, wide}, n = rows * wide;
    int64_t *tv = malloc(sizeof(int64_t) * (size_t)rows);
    int32_t *t32 = malloc(sizeof(int32_t) * (size_t)rows);
    double *bv, *ref = calloc((size_t)n, sizeof(double)), lref = 0;
    double *lv = calloc((size_t)(rows * cols), sizeof(double));
    sg_tensor *base = tu_rand(ctx, dt, 2, sh, -4, 4, &bv);
    for (int64_t i = 0; i < rows; i++) tv[i] = tu_randint(0, cols - 1), t32[i] = (int32_t)tv[i];
    tv[0] = 0, tv[rows - 1] = cols - 1, t32[0] = 0, t32[rows - 1] = (int32_t)(cols - 1);
    sg_tensor *t = sg_from_host(ctx, tdt, 1, &rows, tdt == SG_I32 ? (void *)t32 : (void *)tv);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < cols; j++) lv[r * cols + j] = bv[r * wide + skip + j];
    double *d = malloc(sizeof(double) * (size_t)(rows * cols));
    ref_dlogits(lv, tv, rows, cols, 1.0, d);
    for (int64_t r = 0; r < rows; r++) {
        double m = -INFINITY, s = 0;
        for (int64_t j = 0; j < cols; j++) m = lv[r * cols + j] > m ? lv[r * cols + j] : m;
        for (int64_t j = 0; j < cols; j++) s += exp(lv[r * cols + j] - m);
        lref += (m + log(s) - lv[r * cols + tv[r]]) / (double)rows;
        for (int64_t j = 0; j < cols; j++) ref[r * wide + skip + j] = d[r * cols + j];
    }
    pair p = {.skip = skip, .cols = cols, .read_between = read_between};
    int nout = read_between ? 3 : 2;
    sg_tensor *in[2] = {base, t}, *got[3] = {NULL}, *eag[3] = {NULL};
    sg_fn *fn = NULL;
    bool cuda = sg_ctx_backend(ctx) == SG_BACKEND_CUDA;
    bool ok =
        TU_EXPECT(sg_requires_grad_(base, true) == SG_OK) &&
        TU_EXPECT(pair_step(ctx, in, eag, &p) == SG_OK) &&
        TU_EXPECT(sg_compile(ctx, pair_step, &p, 2, nout,
                             &(sg_compile_opts){.mode = SG_MODE_REDUCE_OVERHEAD}, &fn) == SG_OK);
    unsigned char *first = NULL, *again = NULL, *eb = NULL;
    size_t nf = 0, na = 0, ne = 0;
    for (int call = 0; ok && call < 2; call++) {
        for (int k = 0; k < 3; k++) sg_release(got[k]), got[k] = NULL;
        ok = TU_EXPECT(sg_call(fn, in, 2, got, nout) == SG_OK);
        if (ok && call == 0) first = bytes_of(got, nout, &nf);
        if (ok && call == 1) again = bytes_of(got, nout, &na);
    }
    if (ok) eb = bytes_of(eag, nout, &ne);
    ok = ok && TU_EXPECT(first && again && eb) &&
         TU_EXPECT(nf == na && memcmp(first, again, nf) == 0);
    /* On CUDA the fused pair and the eager kernels give the same bits. */
    ok = ok && (!cuda || TU_EXPECT(nf == ne && memcmp(first, eb, nf) == 0));
    /* f16 keeps gradients of ~1/C as subnormals: one step of 2^-24 apart */
    double atol = fmax(tu_atol(dt) / (double)cols, dt == SG_F16 ? 0x1p-24 : 0.0);
    double lgot = NAN, *g = ok ? tu_read(got[1]) : NULL;
    ok = ok && TU_EXPECT(g != NULL) && TU_EXPECT(sg_item(got[0], &lgot) == SG_OK) &&
         TU_EXPECT(tu_close("loss", &lgot, &lref, 1, tu_rtol(dt), 1e-6)) &&
         TU_EXPECT(tu_close("dlogits", g, ref, n, tu_rtol(dt), atol));
    const char *ex = fn ? sg_fn_explain(fn) : "";
    bool merged = strstr(ex, "also computes IR line") != NULL;
    ok = ok && TU_EXPECT(merged == (cuda && !read_between));
    /* A target out of range in a replay. */
    int64_t bad = rows / 2;
    tv[bad] = cols, t32[bad] = (int32_t)cols;
    ok = ok &&
         TU_EXPECT(sg_write(t, tdt == SG_I32 ? (void *)t32 : (void *)tv, nbytes_of(t)) == SG_OK);
    for (int k = 0; ok && k < 3; k++) sg_release(got[k]), got[k] = NULL;
    sg_status bs = ok ? sg_call(fn, in, 2, got, nout) : SG_OK;
    double *g2 = NULL;
    if (ok && cuda) {
        g2 = TU_EXPECT(bs == SG_OK) ? tu_read(got[1]) : NULL;
        ok = TU_EXPECT(g2 != NULL) && TU_EXPECT(sg_item(got[0], &lgot) == SG_OK) &&
             TU_EXPECT(isnan(lgot));
        for (int64_t r = 0; ok && r < rows; r++)
            for (int64_t j = skip; ok && j < wide; j++) {
                double v = g2[r * wide + j];
                ok = r == bad ? TU_EXPECT(isnan(v)) : TU_EXPECT(v == g[r * wide + j]);
            }
    } else if (ok) {
        ok = TU_EXPECT(bs == SG_ERR_INDEX);
    }
    tu_case(ok,
            "XENT_PAIR(type=%s,targets=%s,logits=[%lld,%lld],row_offset=%lld,%s) merged=%d "
            "seed=%llu",
            sg_dtype_name(dt), sg_dtype_name(tdt), (long long)rows, (long long)cols,
            (long long)skip, read_between ? "loss read between" : "loss then gradient", merged,
            (unsigned long long)seed);
    if (!ok && sg_last_error(ctx)[0]) fprintf(stderr, "  %s\n", sg_last_error(ctx));
    sg_clear_error(ctx);
    sg_fn_destroy(fn);
    free(first), free(again), free(eb), free(g), free(g2);
    free(tv), free(t32), free(bv), free(ref), free(lv), free(d);
    for (int k = 0; k < 3; k++) sg_release(got[k]), sg_release(eag[k]);
    sg_release(base), sg_release(t);
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
    /* Vocabularies: GPT-2's (odd, a block's row staged in shared memory for
     * halves), a warp's row, a tiny one over many rows (the forward's
     * thread per row), a block's row of 3001, and few short rows (W4's
     * 128 x 10, a row of 3 over 333, a warp's width over 128), and block
     * rows over more rows than an H100 has SMs (blocks in several waves;
     * 4095 with skip 1: rows off 16 bytes whose strides are on them). */
    static const int64_t vocab[9][2] = {{50257, 6}, {1000, 40}, {7, 1100},   {3001, 20}, {10, 128},
                                        {3, 333},   {32, 128},  {4096, 200}, {4095, 150}};
    for (int v = 0; v < 9; v++)
        for (int d = 0; d < 3; d++)
            for (int skip = 0; skip < 2; skip++)
                pair_case(dts[d], (v + d + skip) % 2 ? SG_I32 : SG_I64, vocab[v][1], vocab[v][0],
                          skip, false, seed++);
    pair_case(SG_BF16, SG_I64, 6, 50257, 0, true, seed++);
    pair_case(SG_F32, SG_I32, 40, 1000, 1, true, seed++);
    sg_ctx_destroy(ctx);
    return tu_finish();
}
