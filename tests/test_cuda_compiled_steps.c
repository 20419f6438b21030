/* SPDX-License-Identifier: MIT */
/*
 * test_cuda_compiled_steps.c -- compiled steps on the GPU against f64
 * references written here, in every compiling mode: a 12-layer decoder-like
 * step at batch 1 whose layers share one set of generated kernels (each
 * launch reading its own table of addresses), called on inputs at new
 * addresses so that the tables are rewritten and the graphs patched; a
 * decode-step data path (embedding, index_select, concat of rotated halves,
 * index_copy_ into a cache with a repeated index, an accumulator updated in
 * place) run by generated kernels, where max-autotune must leave the cache
 * and the accumulator exactly as one step leaves them; and a bad index,
 * which fails the call with SG_ERR_INDEX and writes nothing; max-autotune's
 * comparison of the tuned and the default graph of a step that adds into a
 * tensor in place (said once, the tensor as the calls alone leave it); a
 * step whose products and sums have nothing between them, recorded on
 * several streams (said in perf_hints and sg_fn_explain) and still equal to the reference
 * call after call, its in-place sum included. Prints the
 * launches per step of the 12-layer step. Exits 77 without a CUDA device.
 */
#include "testutil.h"

#include "graphs/graphs.h"

#include <math.h>
#include <string.h>

static sg_ctx *ctx;

static const sg_mode modes[] = {SG_MODE_DEFAULT, SG_MODE_REDUCE_OVERHEAD, SG_MODE_MAX_AUTOTUNE,
                                SG_MODE_MAX_AUTOTUNE_NO_GRAPHS};
#define NMODES ((int)(sizeof modes / sizeof modes[0]))

static bool close_to(const char *what, const sg_tensor *t, const double *ref, int64_t n,
                     double rtol, double atol) {
    double *got = tu_read(t);
    bool ok = TU_EXPECT(got != NULL) && tu_close(what, got, ref, n, rtol, atol);
    free(got);
    return ok;
}

/* ------------------------------------------------------------ 12 layers */

#define L 12
#define D 256
#define F 512
typedef struct layers {
    sg_tensor *g[L], *w1[L], *w3[L], *w2[L];
    double *gv[L], *w1v[L], *w3v[L], *w2v[L];
} layers;

static sg_status layers_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    const layers *m = user;
    sg_tensor *h = in[0];
    for (int l = 0; l < L; l++) {
        sg_tensor *x = sg_rms_norm(h, m->g[l], 1e-6);
        sg_tensor *u = sg_mul(sg_silu(sg_linear(x, m->w1[l], NULL)), sg_linear(x, m->w3[l], NULL));
        h = sg_add(h, sg_linear(u, m->w2[l], NULL));
    }
    out[0] = h;
    return h ? SG_OK : sg_ctx_status(c);
}

/* y[n] = sum_k x[k] w[n][k] */
static void ref_linear(const double *x, const double *w, int64_t n, int64_t k, double *y) {
    for (int64_t i = 0; i < n; i++) {
        double s = 0;
        for (int64_t j = 0; j < k; j++) s += x[j] * w[i * k + j];
        y[i] = s;
    }
}

static void ref_layers(const layers *m, const double *x0, double *h) {
    static double x[D], a[F], b[F], o[D];
    memcpy(h, x0, sizeof(double) * D);
    for (int l = 0; l < L; l++) {
        double ss = 0;
        for (int i = 0; i < D; i++) ss += h[i] * h[i];
        double r = 1 / sqrt(ss / D + 1e-6);
        for (int i = 0; i < D; i++) x[i] = h[i] * r * m->gv[l][i];
        ref_linear(x, m->w1v[l], F, D, a);
        ref_linear(x, m->w3v[l], F, D, b);
        for (int i = 0; i < F; i++) a[i] = a[i] / (1 + exp(-a[i])) * b[i];
        ref_linear(a, m->w2v[l], D, F, o);
        for (int i = 0; i < D; i++) h[i] += o[i];
    }
}

/* Launches per step of the capture on CUDA: generated kernels plus library
 * calls, and the distinct kernels among them. */
static void print_launches(sg_fn *fn) {
    sg__graph *g = fn->graphs[fn->ngraphs - 1];
    sg__fuse_opts fo;
    sg__cgen_cuda_fuse_opts(&fo, false);
    sg__fused f;
    if (sg__fuse(ctx, &g->ir, &fo, &f) != SG_OK) return;
    sg__cuda_kinfo *ki = calloc((size_t)(f.ngroups ? f.ngroups : 1), sizeof *ki);
    sg__emit e = {.ctx = ctx};
    int nk = 0, calls = 0, distinct = 0;
    if (ki && sg__cgen_cuda(ctx, &g->ir, &f, "launches", &e, ki, &nk) == SG_OK) {
        for (int k = 0; k < f.ngroups; k++) {
            const sg__group *grp = &f.groups[k];
            calls += (grp->kind == SG__G_OPAQUE || grp->anchor >= 0) && !ki[k].replaces_call;
            distinct += ki[k].emitted;
        }
        fprintf(stderr,
                "  %d layers: %d launches per step (%d generated kernels, %d distinct; %d "
                "library calls) for %d IR ops\n",
                L, nk + calls, nk, distinct, calls, g->ir.nnodes);
    }
    const char *x = strstr(sg_fn_explain(fn), "    kernels:");
    if (x) fprintf(stderr, "  sg_fn_explain: %.*s\n", (int)strcspn(x + 4, "\n"), x + 4);
    sg__emit_free(&e);
    free(ki);
    sg__fused_free(ctx, &f, &g->ir);
}

static void test_layers(sg_mode mode) {
    static layers m;
    int64_t d = D, w1s[2] = {F, D}, w2s[2] = {D, F}, xs[2] = {1, D};
    tu_seed(11);
    for (int l = 0; l < L; l++) {
        m.g[l] = tu_rand(ctx, SG_F32, 1, &d, 0.5, 1.5, &m.gv[l]);
        m.w1[l] = tu_rand(ctx, SG_F32, 2, w1s, -0.06, 0.06, &m.w1v[l]);
        m.w3[l] = tu_rand(ctx, SG_F32, 2, w1s, -0.06, 0.06, &m.w3v[l]);
        m.w2[l] = tu_rand(ctx, SG_F32, 2, w2s, -0.06, 0.06, &m.w2v[l]);
    }
    sg_fn *fn = NULL;
    bool ok = TU_EXPECT(
        sg_compile(ctx, layers_step, &m, 1, 1, &(sg_compile_opts){.mode = mode}, &fn) == SG_OK);
    double *xv[3] = {NULL}, ref[D];
    sg_tensor *x[3] = {NULL};
    for (int i = 0; i < 3; i++) x[i] = tu_rand(ctx, SG_F32, 2, xs, -1, 1, &xv[i]);
    /* New addresses each call, then the first again: the tables move. */
    const int order[5] = {0, 1, 2, 0, 1};
    for (int c = 0; ok && c < 5; c++) {
        sg_tensor *out[1] = {NULL};
        sg_mark_step_begin(ctx);
        ok = TU_EXPECT(sg_call(fn, &x[order[c]], 1, out, 1) == SG_OK);
        if (!ok) fprintf(stderr, "  %s\n", sg_last_error(ctx));
        ref_layers(&m, xv[order[c]], ref);
        ok = ok && close_to("layers", out[0], ref, D, 2e-4, 2e-4);
    }
    tu_case(ok, "CUDA_STEP_LAYERS(mode=%s,layers=%d,d=%d,f=%d,f32,batch=1,5 calls on 3 inputs)",
            sg_mode_name(mode), L, D, F);
    if (ok && mode == SG_MODE_REDUCE_OVERHEAD) print_launches(fn);
    sg_fn_destroy(fn);
    for (int i = 0; i < 3; i++) sg_release(x[i]), free(xv[i]);
    for (int l = 0; l < L; l++) {
        sg_release(m.g[l]), sg_release(m.w1[l]), sg_release(m.w3[l]), sg_release(m.w2[l]);
        free(m.gv[l]), free(m.w1v[l]), free(m.w3v[l]), free(m.w2v[l]);
    }
}

/* ------------------------------------------------------------ data movement in place */

#define V 50
#define P 32
#define E 64
#define R 3
typedef struct datamove {
    sg_tensor *wte, *wpe, *cache, *acc;
    double *wtev, *wpev, *cachev, *accv;
} datamove;

static sg_status datamove_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    const datamove *m = user;
    sg_tensor *h = sg_add(sg_embedding(m->wte, in[0]), sg_index_select(m->wpe, 0, in[1]));
    sg_tensor *halves[2] = {sg_neg(sg_narrow(h, 1, E / 2, E / 2)), sg_narrow(h, 1, 0, E / 2)};
    sg_tensor *r = sg_add(h, sg_concat(2, halves, 1));
    sg_status s = sg_index_copy_(m->cache, 0, in[1], r);
    if (s == SG_OK) s = sg_add_(m->acc, r);
    out[0] = r;
    return s != SG_OK ? s : sg_ctx_status(c);
}

static void ref_datamove(datamove *m, const int64_t *tok, const int64_t *pos, double *r) {
    for (int i = 0; i < R; i++) {
        double h[E];
        for (int j = 0; j < E; j++) h[j] = m->wtev[tok[i] * E + j] + m->wpev[pos[i] * E + j];
        for (int j = 0; j < E; j++)
            r[i * E + j] = h[j] + (j < E / 2 ? -h[j + E / 2] : h[j - E / 2]);
    }
    for (int i = 0; i < R; i++) /* in order: the last repeated index wins */
        memcpy(&m->cachev[pos[i] * E], &r[i * E], sizeof(double) * E);
    for (int i = 0; i < R * E; i++) m->accv[i] += r[i];
}

static void test_datamove(sg_mode mode) {
    datamove m;
    int64_t ws[2] = {V, E}, ps[2] = {P, E}, as[2] = {R, E}, n = R;
    tu_seed(23);
    m.wte = tu_rand(ctx, SG_F32, 2, ws, -1, 1, &m.wtev);
    m.wpe = tu_rand(ctx, SG_F32, 2, ps, -1, 1, &m.wpev);
    m.cache = tu_rand(ctx, SG_F32, 2, ps, -1, 1, &m.cachev);
    m.acc = tu_rand(ctx, SG_F32, 2, as, -1, 1, &m.accv);
    sg_fn *fn = NULL;
    bool ok = TU_EXPECT(
        sg_compile(ctx, datamove_step, &m, 2, 1, &(sg_compile_opts){.mode = mode}, &fn) == SG_OK);
    const int64_t toks[3][R] = {{3, 49, 0}, {7, 7, 21}, {48, 1, 30}};
    const int64_t poss[3][R] = {{5, 9, 5}, {0, 31, 2}, {6, 6, 6}}; /* repeats: the last wins */
    double r[R * E];
    for (int c = 0; ok && c < 3; c++) {
        sg_tensor *in[2] = {sg_from_host(ctx, SG_I64, 1, &n, toks[c]),
                            sg_from_host(ctx, SG_I64, 1, &n, poss[c])};
        sg_tensor *out[1] = {NULL};
        sg_mark_step_begin(ctx);
        ok = TU_EXPECT(sg_call(fn, in, 2, out, 1) == SG_OK);
        if (!ok) fprintf(stderr, "  %s\n", sg_last_error(ctx));
        ref_datamove(&m, toks[c], poss[c], r);
        /* Copies are exact; r and acc are one or a few f32 adds away. */
        ok = ok && close_to("r", out[0], r, R * E, 1e-6, 1e-6) &&
             close_to("cache", m.cache, m.cachev, P * E, 1e-6, 1e-6) &&
             close_to("acc", m.acc, m.accv, R * E, 1e-5, 1e-5);
        sg_release(in[0]), sg_release(in[1]);
    }
    tu_case(ok,
            "CUDA_STEP_DATA_IN_PLACE(mode=%s,embedding+index_select+concat+index_copy_"
            "(repeated index)+add_,3 calls)",
            sg_mode_name(mode));
    /* A position out of range, launching kernel by kernel: SG_ERR_INDEX,
     * the cache and acc untouched. (A recorded graph cannot stop: there the
     * kernels skip the bad write, as the eager kernels do.) */
    if (ok && (mode == SG_MODE_DEFAULT || mode == SG_MODE_MAX_AUTOTUNE_NO_GRAPHS)) {
        const int64_t badpos[R] = {1, P, 2}, tok[R] = {0, 1, 2};
        sg_tensor *in[2] = {sg_from_host(ctx, SG_I64, 1, &n, tok),
                            sg_from_host(ctx, SG_I64, 1, &n, badpos)};
        sg_tensor *out[1] = {NULL};
        double *cache0 = tu_read(m.cache), *acc0 = tu_read(m.acc);
        sg_mark_step_begin(ctx);
        sg_status s = sg_call(fn, in, 2, out, 1);
        sg_clear_error(ctx);
        ok = TU_EXPECT(s == SG_ERR_INDEX) && TU_EXPECT(cache0 && acc0) &&
             close_to("cache untouched", m.cache, cache0, P * E, 0, 0) &&
             close_to("acc untouched", m.acc, acc0, R * E, 0, 0);
        free(cache0), free(acc0);
        tu_case(ok, "CUDA_STEP_BAD_INDEX(mode=%s,pos=[1,%d,2]) -> %s", sg_mode_name(mode), P,
                sg_status_str(s));
        sg_release(in[0]), sg_release(in[1]);
    }
    sg_fn_destroy(fn);
    sg_release(m.wte), sg_release(m.wpe), sg_release(m.cache), sg_release(m.acc);
    free(m.wtev), free(m.wpev), free(m.cachev), free(m.accv);
}

/* ------------------------------------------------------------ max-autotune's whole-step check */

/* acc += linear(x, w) + b, acc written in place, with a product large
 * enough for cuBLASLt: max-autotune picks an algorithm, then replays the
 * step's graph with the pick and with the default (perf_hints says which
 * stays), and the replays it timed leave acc as the calls alone leave it. */
enum { AM = 64, AK = 96, AN = 80 };
typedef struct autochk {
    sg_tensor *w, *b, *acc;
    double *wv, *bv, *accv;
} autochk;

static sg_status autochk_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    const autochk *m = user;
    sg_tensor *y = sg_linear(in[0], m->w, m->b);
    sg_status st = sg_add_(m->acc, y);
    out[0] = sg_relu(y);
    return st != SG_OK ? st : out[0] ? SG_OK : sg_ctx_status(c);
}

static int step_lines;
static void count_step_lines(void *user, const char *topic, const char *line) {
    (void)user;
    if (!strcmp(topic, "perf_hints") && strstr(line, "with the defaults;")) step_lines++;
}

static void test_autotune_check(void) {
    sg_ctx *c = NULL;
    if (!TU_EXPECT(
            sg_ctx_create(&(sg_ctx_opts){.backend = SG_BACKEND_CUDA, .log = count_step_lines},
                          &c) == SG_OK))
        return;
    autochk m;
    int64_t ws[2] = {AN, AK}, bs = AN, as[2] = {AM, AN}, xs[2] = {AM, AK};
    tu_seed(31);
    m.w = tu_rand(c, SG_F32, 2, ws, -1, 1, &m.wv);
    m.b = tu_rand(c, SG_F32, 1, &bs, -1, 1, &m.bv);
    m.acc = tu_rand(c, SG_F32, 2, as, -1, 1, &m.accv);
    sg_fn *fn = NULL;
    step_lines = 0;
    bool ok = TU_EXPECT(
        sg_compile(c, autochk_step, &m, 1, 1,
                   &(sg_compile_opts){.mode = SG_MODE_MAX_AUTOTUNE, .force_disable_caches = true},
                   &fn) == SG_OK);
    static double r[AM * AN];
    for (int call = 0; ok && call < 4; call++) {
        double *xv = NULL;
        sg_tensor *in[1] = {tu_rand(c, SG_F32, 2, xs, -1, 1, &xv)};
        sg_tensor *out[1] = {NULL};
        sg_mark_step_begin(c);
        ok = TU_EXPECT(sg_call(fn, in, 1, out, 1) == SG_OK);
        if (!ok) fprintf(stderr, "  %s\n", sg_last_error(c));
        for (int i = 0; i < AM; i++)
            for (int n = 0; n < AN; n++) {
                double a = m.bv[n];
                for (int k = 0; k < AK; k++) a += xv[i * AK + k] * m.wv[n * AK + k];
                r[i * AN + n] = a > 0 ? a : 0;
                m.accv[i * AN + n] += a;
            }
        ok = ok && close_to("relu(y)", out[0], r, AM * AN, 1e-4, 1e-4) &&
             close_to("acc", m.acc, m.accv, AM * AN, 1e-4, 1e-4);
        sg_release(in[0]);
        free(xv);
    }
    ok = ok && TU_EXPECT(step_lines == 1);
    tu_case(ok,
            "CUDA_AUTOTUNE_WHOLE_STEP(f32,acc(%d,%d)+=linear(x,w,b),4 calls) -> the tuned and "
            "the default graph compared %d time(s), acc as the calls leave it",
            AM, AN, step_lines);
    sg_fn_destroy(fn);
    sg_release(m.w), sg_release(m.b), sg_release(m.acc);
    free(m.wv), free(m.bv), free(m.accv);
    sg_ctx_destroy(c);
}

/* ------------------------------------------------------------ branches */

/* y = relu(x W1^T); a = y Wa^T and b = y Wb^T (products with nothing
 * between them); sa = sum(a, 0) and sb = sum(b * b, 0) (sums likewise);
 * acc += sa in place; out = sa + sb. The recording puts the two products
 * and the two sums on branches of their own (cuda_graph.c: lanes). */
#define BM 256
#define BK 256
#define BN 512
typedef struct branchy {
    sg_tensor *w1, *wa, *wb, *acc;
    double *w1v, *wav, *wbv, *accv;
} branchy;

static sg_status branchy_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    const branchy *m = user;
    int d0 = 0;
    sg_tensor *y = sg_relu(sg_linear(in[0], m->w1, NULL));
    sg_tensor *a = sg_linear(y, m->wa, NULL), *b = sg_linear(y, m->wb, NULL);
    sg_tensor *sa = sg_sum(a, 1, &d0, false), *sb = sg_sum(sg_mul(b, b), 1, &d0, false);
    sg_status st = sg_add_(m->acc, sa);
    out[0] = sg_add(sa, sb);
    return st != SG_OK ? st : out[0] ? SG_OK : sg_ctx_status(c);
}

static int lane_lines, lanes_seen;
static void count_lane_lines(void *user, const char *topic, const char *line) {
    (void)user;
    const char *at = strstr(line, " groups recorded on ");
    int n = 0;
    if (!strcmp(topic, "perf_hints") && at && sscanf(at, " groups recorded on %d streams", &n) == 1)
        lane_lines++, lanes_seen = n > lanes_seen ? n : lanes_seen;
}

static void test_branches(sg_mode mode) {
    sg_ctx *c = NULL;
    if (!TU_EXPECT(
            sg_ctx_create(&(sg_ctx_opts){.backend = SG_BACKEND_CUDA, .log = count_lane_lines},
                          &c) == SG_OK))
        return;
    branchy m;
    int64_t w1s[2] = {BN, BK}, ws[2] = {BN, BN}, as = BN, xs[2] = {BM, BK};
    tu_seed(41);
    m.w1 = tu_rand(c, SG_F32, 2, w1s, -0.1, 0.1, &m.w1v);
    m.wa = tu_rand(c, SG_F32, 2, ws, -0.1, 0.1, &m.wav);
    m.wb = tu_rand(c, SG_F32, 2, ws, -0.1, 0.1, &m.wbv);
    m.acc = tu_rand(c, SG_F32, 1, &as, -1, 1, &m.accv);
    sg_fn *fn = NULL;
    lane_lines = lanes_seen = 0;
    bool ok = TU_EXPECT(sg_compile(c, branchy_step, &m, 1, 1,
                                   &(sg_compile_opts){.mode = mode, .force_disable_caches = true},
                                   &fn) == SG_OK);
    double *y = malloc(sizeof *y * BM * BN), *r = malloc(sizeof *r * BN);
    ok = ok && TU_EXPECT(y && r);
    for (int call = 0; ok && call < 5; call++) {
        double *xv = NULL;
        sg_tensor *in[1] = {tu_rand(c, SG_F32, 2, xs, -1, 1, &xv)};
        sg_tensor *out[1] = {NULL};
        sg_mark_step_begin(c);
        ok = TU_EXPECT(sg_call(fn, in, 1, out, 1) == SG_OK);
        if (!ok) fprintf(stderr, "  %s\n", sg_last_error(c));
        for (int i = 0; i < BM; i++)
            for (int n = 0; n < BN; n++) {
                double v = 0;
                for (int k = 0; k < BK; k++) v += xv[i * BK + k] * m.w1v[n * BK + k];
                y[i * BN + n] = v > 0 ? v : 0;
            }
        for (int n = 0; n < BN; n++) {
            double sa = 0, sb = 0;
            for (int i = 0; i < BM; i++) {
                double a = 0, b = 0;
                for (int k = 0; k < BN; k++)
                    a += y[i * BN + k] * m.wav[n * BN + k], b += y[i * BN + k] * m.wbv[n * BN + k];
                sa += a, sb += b * b;
            }
            r[n] = sa + sb;
            m.accv[n] += sa;
        }
        ok = ok && close_to("sa + sb", out[0], r, BN, 1e-4, 1e-3) &&
             close_to("acc", m.acc, m.accv, BN, 1e-4, 1e-3);
        sg_release(in[0]);
        free(xv);
    }
    bool graphs = mode == SG_MODE_REDUCE_OVERHEAD || mode == SG_MODE_MAX_AUTOTUNE;
    ok = ok && TU_EXPECT(!graphs || (lane_lines >= 1 && lanes_seen >= 2));
    const char *ex = sg_fn_explain(fn), *at = strstr(ex, "CUDA graph: the last recording put ");
    int streams = 0;
    ok = ok && TU_EXPECT(!graphs || (at &&
                                     sscanf(strstr(at, " on ") ? strstr(at, " on ") : "",
                                            " on %d stream", &streams) == 1 &&
                                     streams == lanes_seen));
    ok = ok && TU_EXPECT(graphs || !at);
    tu_case(ok,
            "CUDA_BRANCHES(mode=%s,f32,two products and two sums apart,acc+=sum in place,5 calls)"
            " -> %d recording(s) on up to %d streams",
            sg_mode_name(mode), lane_lines, lanes_seen);
    free(y), free(r);
    sg_fn_destroy(fn);
    sg_release(m.w1), sg_release(m.wa), sg_release(m.wb), sg_release(m.acc);
    free(m.w1v), free(m.wav), free(m.wbv), free(m.accv);
    sg_ctx_destroy(c);
}

int main(void) {
    sg_status s = sg_ctx_create(&(sg_ctx_opts){.backend = SG_BACKEND_CUDA}, &ctx);
    if (s == SG_ERR_BACKEND_UNAVAILABLE) {
        fprintf(stderr, "no CUDA device: %s\n", sg_last_error(NULL));
        return 77;
    }
    if (s != SG_OK) {
        fprintf(stderr, "sg_ctx_create(cuda): %s: %s\n", sg_status_str(s), sg_last_error(NULL));
        return 1;
    }
    for (int i = 0; i < NMODES; i++) test_layers(modes[i]);
    for (int i = 0; i < NMODES; i++) test_datamove(modes[i]);
    test_autotune_check();
    for (int i = 0; i < NMODES; i++) test_branches(modes[i]);
    sg_ctx_destroy(ctx);
    return tu_finish();
}
