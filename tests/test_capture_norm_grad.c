/* SPDX-License-Identifier: MIT */
/*
 * test_capture_norm_grad.c -- the gradients of layer_norm and rms_norm
 * (input, weight, bias) against the f64 formulas written here, on rows of
 * 3 (many rows), 512, 768, 769, 4100 and 9000 elements, f32, bf16 and f16, with and
 * without weight and bias, the input contiguous or a strided view; the loss
 * is sum(norm(x) * r) for a random r, so the output's gradient is r, or
 * with a residual sum((x + norm(x) * s) * r), so that x's gradient is
 * gathered from the residual before the norm's (its kernel adds it). Then
 * every case in one compiled step (DEFAULT and REDUCE_OVERHEAD): the same
 * gradients as eager, and the same bits on a second call. Last, a pre-norm
 * block (a norm, a linear with bias added to the residual, the next norm):
 * the bias's gradient is the column sum of the next norm's input gradient,
 * which the CUDA backend's fusion merges into that norm's kernel
 * (sg__group.nbsum; counted in the plan fused with the CUDA options, and
 * SG_CUDA_NORM_BWD=off keeping them apart): every gradient against f64,
 * compiled against eager, and the same bits on a second replay.
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include "graphs/cuda/exec.h"
#include "graphs/graphs.h"
#include "testutil.h"

#include <math.h>
#include <string.h>

static sg_ctx *ctx;

typedef struct ncase {
    bool layer, w, b; /* layer_norm or rms_norm; with weight, bias */
    bool res;         /* x + norm(x) * s, a residual around the norm */
    int64_t rows0, rows1, len;
    sg_dtype dt;
    tu_layout lay;
} ncase;

typedef struct kept {
    ncase c;
    sg_tensor *x, *w, *b, *r, *s, *g[3];
    int ng;
} kept;

#define MAXKEPT 96
static kept keep[MAXKEPT];
static int nkeep;

static const double EPS = 1e-5;

/* The f64 gradients of sum(norm(x) * r): gx (rows * len), gw and gb (len). */
static void ref_grads(const ncase *c, const double *x, const double *w, const double *r, double *gx,
                      double *gw, double *gb) {
    int64_t rows = c->rows0 * c->rows1, len = c->len;
    for (int64_t j = 0; j < len; j++) gw[j] = gb[j] = 0;
    for (int64_t i = 0; i < rows; i++) {
        const double *xr = x + i * len, *rr = r + i * len;
        double mean = 0, var = 0, s1 = 0, s2 = 0;
        for (int64_t j = 0; c->layer && j < len; j++) mean += xr[j];
        mean /= (double)len;
        for (int64_t j = 0; j < len; j++) var += (xr[j] - mean) * (xr[j] - mean);
        double rs = 1 / sqrt(var / (double)len + EPS);
        for (int64_t j = 0; j < len; j++) {
            double xh = (xr[j] - mean) * rs, gxh = rr[j] * (c->w ? w[j] : 1);
            s1 += gxh, s2 += gxh * xh;
            gw[j] += rr[j] * xh, gb[j] += rr[j];
        }
        for (int64_t j = 0; j < len; j++) {
            double xh = (xr[j] - mean) * rs, gxh = rr[j] * (c->w ? w[j] : 1);
            gx[i * len + j] =
                rs * (gxh - (c->layer ? s1 / (double)len : 0) - xh * s2 / (double)len);
        }
    }
}

static sg_tensor *forward(const ncase *c, sg_tensor *x, sg_tensor *w, sg_tensor *b,
                          sg_tensor *s) {
    sg_tensor *y = c->layer ? sg_layer_norm(x, w, b, EPS) : sg_rms_norm(x, w, EPS);
    return c->res ? sg_add(x, sg_mul(y, s)) : y;
}

/* got against ref: within rtol of each element, plus atol of the largest. */
static bool close_to(const char *what, sg_tensor *got, const double *ref, int64_t n, sg_dtype dt) {
    double *v = tu_read(got), big = 1;
    for (int64_t i = 0; i < n; i++) big = fabs(ref[i]) > big ? fabs(ref[i]) : big;
    bool half = dt != SG_F32;
    bool ok = TU_EXPECT(v != NULL) && TU_EXPECT(sg_tensor_dtype(got) == dt) &&
              TU_EXPECT(tu_close(what, v, ref, n, half ? 2e-2 : 1e-4, (half ? 1e-2 : 1e-5) * big));
    free(v);
    return ok;
}

static void norm_case(const ncase *c, uint64_t seed) {
    tu_seed(seed);
    int64_t sh[3] = {c->rows0, c->rows1, c->len}, len = c->len, n = c->rows0 * c->rows1 * len;
    double *xv = NULL, *wv = NULL, *bv = NULL, *rv = NULL, *sv = NULL;
    sg_tensor *x = tu_rand_layout(ctx, c->dt, 3, sh, -2, 2, c->lay, &xv);
    sg_tensor *w = c->w ? tu_rand(ctx, c->dt, 1, &len, 0.5, 1.5, &wv) : NULL;
    sg_tensor *b = c->b ? tu_rand(ctx, c->dt, 1, &len, -1, 1, &bv) : NULL;
    sg_tensor *r = tu_rand(ctx, c->dt, 3, sh, -1, 1, &rv);
    sg_tensor *sc = c->res ? tu_rand(ctx, c->dt, 3, sh, -1, 1, &sv) : NULL;
    double *go = malloc(sizeof(double) * (size_t)n); /* the norm's output's gradient */
    for (int64_t i = 0; i < n; i++) go[i] = c->res ? tu_round(c->dt, rv[i] * sv[i]) : rv[i];
    sg_tensor *leaves[3] = {x, w, b}, *wrt[3], *g[3] = {NULL};
    int ng = 0;
    for (int k = 0; k < 3; k++)
        if (leaves[k]) sg_requires_grad_(leaves[k], true), wrt[ng++] = leaves[k];
    sg_tensor *y = forward(c, x, w, b, sc), *yr = sg_mul(y, r), *loss = sg_sum(yr, 0, NULL, false);
    bool ok = TU_EXPECT(sg_grad(loss, ng, wrt, g) == SG_OK);
    double *gx = malloc(sizeof(double) * (size_t)n), *gw = malloc(sizeof(double) * (size_t)len);
    double *gb = malloc(sizeof(double) * (size_t)len);
    ref_grads(c, xv, wv, go, gx, gw, gb);
    for (int64_t i = 0; c->res && i < n; i++) gx[i] += rv[i];
    ok = ok && close_to("dx", g[0], gx, n, c->dt);
    if (ok && c->w) ok = close_to("dweight", g[1], gw, len, c->dt);
    if (ok && c->b) ok = close_to("dbias", g[c->w ? 2 : 1], gb, len, c->dt);
    char s[64];
    tu_case(ok, "NORM_GRAD(%s,type=%s,x=%s %s,weight=%d,bias=%d,residual=%d) seed=%llu",
            c->layer ? "layer_norm" : "rms_norm", sg_dtype_name(c->dt), tu_shape(3, sh, s, 64),
            tu_layout_name(c->lay), c->w, c->b, c->res, (unsigned long long)seed);
    if (ok && nkeep < MAXKEPT) { /* inputs and gradients stay for the compiled step */
        kept *kp = &keep[nkeep++];
        *kp = (kept){.c = *c, .x = x, .w = w, .b = b, .r = r, .s = sc, .ng = ng};
        for (int k = 0; k < ng; k++) kp->g[k] = g[k], g[k] = NULL;
        x = w = b = r = sc = NULL;
    }
    for (int k = 0; k < 3; k++) sg_release(g[k]);
    sg_release(x), sg_release(w), sg_release(b), sg_release(r), sg_release(sc);
    sg_release(y), sg_release(yr), sg_release(loss);
    free(xv), free(wv), free(bv), free(rv), free(sv), free(go), free(gx), free(gw), free(gb);
}

/* Every kept case's forward, loss and gradients in one captured step. */
static sg_status all_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)c, (void)in, (void)user;
    sg_status s = SG_OK;
    for (int i = 0; i < nkeep && s == SG_OK; i++) {
        kept *kp = &keep[i];
        sg_tensor *leaves[3] = {kp->x, kp->w, kp->b}, *wrt[3];
        int ng = 0;
        for (int k = 0; k < 3; k++)
            if (leaves[k]) wrt[ng++] = leaves[k];
        sg_tensor *y = forward(&kp->c, kp->x, kp->w, kp->b, kp->s);
        s = sg_grad(sg_sum(sg_mul(y, kp->r), 0, NULL, false), ng, wrt, out);
        out += ng;
    }
    return s;
}

static void compiled_cases(void) {
    static const sg_mode modes[2] = {SG_MODE_DEFAULT, SG_MODE_REDUCE_OVERHEAD};
    int nout = 0;
    for (int i = 0; i < nkeep; i++) nout += keep[i].ng;
    sg_tensor **out = calloc((size_t)nout, sizeof *out);
    double **first = calloc((size_t)nout, sizeof *first);
    for (int m = 0; m < 2; m++) {
        sg_fn *fn = NULL;
        bool ok = TU_EXPECT(sg_compile(ctx, all_step, NULL, 0, nout,
                                       &(sg_compile_opts){.mode = modes[m], .fullgraph = true},
                                       &fn) == SG_OK);
        for (int call = 0; ok && call < 2; call++) {
            sg_mark_step_begin(ctx);
            ok = TU_EXPECT(sg_call(fn, NULL, 0, out, nout) == SG_OK);
            for (int i = 0, j = 0; ok && i < nkeep; i++)
                for (int k = 0; ok && k < keep[i].ng; k++, j++) {
                    int64_t n = sg_tensor_numel(keep[i].g[k]);
                    double *want = tu_read(keep[i].g[k]), *got = tu_read(out[j]);
                    bool half = keep[i].c.dt != SG_F32;
                    ok = TU_EXPECT(want && got) &&
                         TU_EXPECT(tu_close("compiled", got, want, n, half ? 2e-2 : 1e-4,
                                            half ? 1e-2 : 1e-5));
                    if (ok && call == 0) first[j] = got, got = NULL;
                    if (ok && call == 1) /* a replay repeats its bits */
                        ok = TU_EXPECT(!memcmp(got, first[j], sizeof(double) * (size_t)n));
                    if (!ok) fprintf(stderr, "  case %d, gradient %d\n", i, k);
                    free(want), free(got);
                }
        }
        if (!ok) fprintf(stderr, "  %s\n", sg_last_error(ctx));
        /* On CUDA rows of an odd length take the team-per-row kernels, and say so. */
        bool odd = false;
        for (int i = 0; i < nkeep; i++) odd = odd || keep[i].c.len % 8 != 0;
        if (ok && odd && sg_ctx_backend(ctx) == SG_BACKEND_CUDA)
            ok = TU_EXPECT(strstr(sg_fn_explain(fn), "(norm_bwd): a team per row") != NULL);
        tu_case(ok,
                "NORM_GRAD_COMPILED(%d cases, %d gradients, mode=%s, == eager, replay "
                "bit-identical)",
                nkeep, nout, sg_mode_name(modes[m]));
        for (int j = 0; j < nout; j++) free(first[j]), first[j] = NULL; /* out: fn's */
        sg_fn_destroy(fn);
    }
    free(out), free(first);
}

/* ------------------------------------------------------------ a pre-norm block */

/* h = x + linear(norm1(x), W, b); loss = sum(norm2(h) * r). layer1: norm1
 * is layer_norm and norm2 rms_norm with a weight (its NORM_BWD's result
 * packed with the weight's gradient), else norm1 rms_norm and norm2
 * layer_norm without weight or bias (its result dx alone). */
typedef struct bcase {
    bool layer1;
    sg_dtype dt;
    int64_t rows0, rows1, len;
} bcase;

typedef struct block {
    bcase c;
    sg_tensor *x, *W, *b, *w2, *r;
} block;

static sg_tensor *block_loss(const block *k) {
    sg_tensor *n1 =
        k->c.layer1 ? sg_layer_norm(k->x, NULL, NULL, EPS) : sg_rms_norm(k->x, NULL, EPS);
    sg_tensor *h = sg_add(k->x, sg_linear(n1, k->W, k->b));
    sg_tensor *n2 = k->c.layer1 ? sg_rms_norm(h, k->w2, EPS) : sg_layer_norm(h, NULL, NULL, EPS);
    return sg_sum(sg_mul(n2, k->r), 0, NULL, false);
}

static int block_leaves(const block *k, sg_tensor **wrt) {
    wrt[0] = k->x, wrt[1] = k->W, wrt[2] = k->b, wrt[3] = k->w2;
    return k->w2 ? 4 : 3;
}

static sg_status block_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)c, (void)in;
    const block *k = user;
    sg_tensor *wrt[4];
    int n = block_leaves(k, wrt);
    return sg_grad(block_loss(k), n, wrt, out);
}

/* The f64 gradients of the block's loss: gx, gW, gb and gw2 (of norm2's weight). */
static void block_ref(const bcase *c, const double *x, const double *W, const double *b,
                      const double *w2, const double *r, double *gx, double *gW, double *gb,
                      double *gw2) {
    int64_t rows = c->rows0 * c->rows1, C = c->len, n = rows * C;
    double *n1 = malloc(sizeof(double) * (size_t)n), *h = malloc(sizeof(double) * (size_t)n);
    double *gh = malloc(sizeof(double) * (size_t)n), *gn1 = malloc(sizeof(double) * (size_t)n);
    double *tmp = malloc(sizeof(double) * (size_t)C);
    for (int64_t i = 0; i < rows; i++) { /* the forward, rounded where the device stores */
        const double *xr = x + i * C;
        double mean = 0, var = 0;
        for (int64_t j = 0; c->layer1 && j < C; j++) mean += xr[j];
        mean /= (double)C;
        for (int64_t j = 0; j < C; j++) var += (xr[j] - mean) * (xr[j] - mean);
        double rs = 1 / sqrt(var / (double)C + EPS);
        for (int64_t j = 0; j < C; j++) n1[i * C + j] = tu_round(c->dt, (xr[j] - mean) * rs);
        for (int64_t o = 0; o < C; o++) {
            double z = b[o];
            for (int64_t j = 0; j < C; j++) z += n1[i * C + j] * W[o * C + j];
            h[i * C + o] = tu_round(c->dt, xr[o] + tu_round(c->dt, z));
        }
    }
    ncase c2 = {
        .layer = !c->layer1, .w = c->layer1, .rows0 = c->rows0, .rows1 = c->rows1, .len = C};
    ref_grads(&c2, h, w2, r, gh, gw2, tmp);
    for (int64_t i = 0; i < n; i++) gh[i] = tu_round(c->dt, gh[i]); /* dx as stored */
    for (int64_t o = 0; o < C; o++) {
        gb[o] = 0;
        for (int64_t i = 0; i < rows; i++) gb[o] += gh[i * C + o];
        for (int64_t j = 0; j < C; j++) {
            double a = 0;
            for (int64_t i = 0; i < rows; i++) a += gh[i * C + o] * n1[i * C + j];
            gW[o * C + j] = a;
        }
    }
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < C; j++) {
            double a = 0;
            for (int64_t o = 0; o < C; o++) a += gh[i * C + o] * W[o * C + j];
            gn1[i * C + j] = tu_round(c->dt, a);
        }
    ncase c1 = {.layer = c->layer1, .rows0 = c->rows0, .rows1 = c->rows1, .len = C};
    ref_grads(&c1, x, NULL, gn1, gx, tmp, tmp);
    for (int64_t i = 0; i < n; i++) gx[i] += gh[i];
    free(n1), free(h), free(gh), free(gn1), free(tmp);
}

/* The CUDA backend's fusion options (false without the CUDA headers),
 * with SG_CUDA_NORM_BWD=off when off, else unset. */
static bool cuda_opts(sg__fuse_opts *fo, bool off) {
    if (!sg__cuda_graph_ops.fuse_opts) return false;
    const char *was = getenv("SG_CUDA_NORM_BWD");
    char keep[64];
    snprintf(keep, sizeof keep, "%s", was ? was : "");
    if (off)
        setenv("SG_CUDA_NORM_BWD", "off", 1);
    else
        unsetenv("SG_CUDA_NORM_BWD");
    sg__cuda_graph_ops.fuse_opts(fo, false);
    if (was)
        setenv("SG_CUDA_NORM_BWD", keep, 1);
    else
        unsetenv("SG_CUDA_NORM_BWD");
    return true;
}

/* The norm-gradient sums merged in graph g's IR fused with the CUDA
 * backend's options (-1 without the CUDA headers), each merged group
 * checked (*sane); with off, SG_CUDA_NORM_BWD=off. */
static int cuda_merged(sg__graph *g, bool off, bool *sane) {
    sg__fuse_opts fo;
    if (!cuda_opts(&fo, off)) return -1;
    sg__fused f;
    if (fo.norm_sums == off || sg__fuse(ctx, &g->ir, &fo, &f) != SG_OK) return *sane = false, 0;
    int n = 0;
    for (int k = 0; k < f.ngroups; k++) {
        const sg__group *gr = &f.groups[k];
        if (!gr->nbsum) continue;
        *sane = *sane && gr->n == 2 && gr->nbsum == 1 &&
                g->ir.nodes[gr->g[0].node].op == SG__OP_NORM_BWD &&
                g->ir.nodes[gr->g[1].node].op == SG__OP_SUM;
        n++;
    }
    sg__fused_free(ctx, &f, &g->ir);
    return n;
}

static bool block_close(const char *what, const double *got, const double *ref, int64_t n,
                        sg_dtype dt) {
    double big = 1;
    for (int64_t i = 0; i < n; i++) big = fabs(ref[i]) > big ? fabs(ref[i]) : big;
    bool half = dt != SG_F32;
    return tu_close(what, got, ref, n, half ? 3e-2 : 1e-4, (half ? 2e-2 : 1e-5) * big);
}

static void block_case(const bcase *c, uint64_t seed) {
    tu_seed(seed);
    int64_t sh[3] = {c->rows0, c->rows1, c->len}, C = c->len, ws[2] = {C, C};
    int64_t n = c->rows0 * c->rows1 * C;
    double *xv, *Wv, *bv, *w2v = NULL, *rv;
    block k = {.c = *c};
    k.x = tu_rand(ctx, c->dt, 3, sh, -2, 2, &xv);
    k.W = tu_rand(ctx, c->dt, 2, ws, -1.0 / sqrt((double)C), 1.0 / sqrt((double)C), &Wv);
    k.b = tu_rand(ctx, c->dt, 1, &C, -1, 1, &bv);
    k.w2 = c->layer1 ? tu_rand(ctx, c->dt, 1, &C, 0.5, 1.5, &w2v) : NULL;
    k.r = tu_rand(ctx, c->dt, 3, sh, -1, 1, &rv);
    sg_tensor *wrt[4], *eager[4] = {NULL}, *out[4] = {NULL};
    int ng = block_leaves(&k, wrt);
    for (int i = 0; i < ng; i++) sg_requires_grad_(wrt[i], true);
    double *ref[4], *first[4] = {NULL};
    int64_t cnt[4] = {n, C * C, C, C};
    for (int i = 0; i < 4; i++) ref[i] = malloc(sizeof(double) * (size_t)cnt[i]);
    block_ref(c, xv, Wv, bv, w2v, rv, ref[0], ref[1], ref[2], ref[3]);
    static const char *const names[4] = {"dx", "dW", "db", "dweight2"};
    bool ok = TU_EXPECT(sg_grad(block_loss(&k), ng, wrt, eager) == SG_OK);
    for (int i = 0; ok && i < ng; i++) {
        double *v = tu_read(eager[i]);
        ok = TU_EXPECT(v != NULL) && TU_EXPECT(block_close(names[i], v, ref[i], cnt[i], c->dt));
        free(v);
    }
    sg_fn *fn = NULL;
    ok =
        ok &&
        TU_EXPECT(sg_compile(ctx, block_step, &k, 0, ng,
                             &(sg_compile_opts){.mode = SG_MODE_REDUCE_OVERHEAD, .fullgraph = true},
                             &fn) == SG_OK);
    for (int call = 0; ok && call < 2; call++) {
        sg_mark_step_begin(ctx);
        ok = TU_EXPECT(sg_call(fn, NULL, 0, out, ng) == SG_OK);
        for (int i = 0; ok && i < ng; i++) {
            double *got = tu_read(out[i]), *want = tu_read(eager[i]);
            ok = TU_EXPECT(got && want) &&
                 TU_EXPECT(block_close(names[i], got, ref[i], cnt[i], c->dt)) &&
                 TU_EXPECT(block_close(names[i], got, want, cnt[i], c->dt));
            if (ok && call == 0) first[i] = got, got = NULL;
            if (ok && call == 1) /* a replay repeats its bits */
                ok = TU_EXPECT(!memcmp(got, first[i], sizeof(double) * (size_t)cnt[i]));
            free(got), free(want);
        }
    }
    if (!ok) fprintf(stderr, "  %s\n", sg_last_error(ctx));
    /* The CUDA options merge norm2's gradient with b's (norm1's gradient is
     * summed by nothing), and the switch keeps them apart; the CPU's never. */
    int merged = -1, off = -1, here = 0;
    bool sane = true;
    if (ok && TU_EXPECT(fn->ngraphs == 1)) {
        sg__graph *g = fn->graphs[0];
        merged = cuda_merged(g, false, &sane);
        off = cuda_merged(g, true, &sane);
        for (int i = 0; i < g->fused.ngroups; i++) here += g->fused.groups[i].nbsum != 0;
        const char *e = sg_fn_explain(fn), *sw = getenv("SG_CUDA_NORM_BWD");
        bool cuda = sg_ctx_backend(ctx) == SG_BACKEND_CUDA &&
                    (!sw || !*sw || strstr(sw, "sum")); /* SG_CUDA_NORM_BWD=off: apart */
        ok = TU_EXPECT(sane) && TU_EXPECT(merged == 1 || merged == -1) &&
             TU_EXPECT(off == 0 || off == -1) && TU_EXPECT(here == (cuda ? 1 : 0)) &&
             TU_EXPECT(e && (strstr(e, "norm gradient sum: IR line") != NULL) == cuda);
    }
    tu_case(ok,
            "NORM_GRAD_BLOCK(%s then %s,type=%s,x=[%lld,%lld,%lld]) seed=%llu: bias gradient "
            "summed in the norm's kernel on CUDA (%d merged with the CUDA options, %d with "
            "SG_CUDA_NORM_BWD=off, %d here), == f64 and eager, replay bit-identical",
            c->layer1 ? "layer_norm" : "rms_norm", c->layer1 ? "rms_norm" : "layer_norm",
            sg_dtype_name(c->dt), (long long)c->rows0, (long long)c->rows1, (long long)C,
            (unsigned long long)seed, merged, off, here);
    sg_fn_destroy(fn);
    for (int i = 0; i < 4; i++) sg_release(eager[i]), free(ref[i]), free(first[i]);
    sg_release(k.x), sg_release(k.W), sg_release(k.b), sg_release(k.w2), sg_release(k.r);
    free(xv), free(Wv), free(bv), free(w2v), free(rv);
}

/* A norm's input gradient summed by the step itself: over every dim but
 * the last (merged on CUDA) and over the first only (not: its columns are
 * not the norm's, which the plan says); each against the f64 sums of the
 * eager gradient as stored. */
static sg_tensor *us_x, *us_r;

/* out: the gradient's sums over (0, 1) and over 0; with user, the
 * gradient itself (eager: a compiled step would copy it into an output,
 * and the sums would read the copy). */
static sg_status user_sums_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)c, (void)in;
    sg_tensor *y = sg_layer_norm(us_x, NULL, NULL, EPS), *gx = NULL;
    sg_status s = sg_grad(sg_sum(sg_mul(y, us_r), 0, NULL, false), 1, &us_x, &gx);
    int d01[2] = {0, 1}, d0[1] = {0};
    out[0] = sg_sum(gx, 2, d01, false);
    out[1] = sg_sum(gx, 1, d0, false);
    if (user) *(sg_tensor **)user = gx;
    return s;
}

static void user_sums_case(sg_dtype dt) {
    int64_t sh[3] = {3, 40, 256}, rows = sh[0] * sh[1], C = sh[2];
    us_x = tu_rand(ctx, dt, 3, sh, -2, 2, NULL);
    us_r = tu_rand(ctx, dt, 3, sh, -1, 1, NULL);
    sg_requires_grad_(us_x, true);
    sg_fn *fn = NULL;
    sg_tensor *out[2] = {NULL}, *eager[2] = {NULL}, *egx = NULL;
    bool ok = TU_EXPECT(user_sums_step(ctx, NULL, eager, &egx) == SG_OK) &&
              TU_EXPECT(sg_compile(ctx, user_sums_step, NULL, 0, 2,
                                   &(sg_compile_opts){.mode = SG_MODE_REDUCE_OVERHEAD},
                                   &fn) == SG_OK) &&
              TU_EXPECT(sg_call(fn, NULL, 0, out, 2) == SG_OK);
    double *gx = ok ? tu_read(egx) : NULL, *s01 = ok ? tu_read(out[0]) : NULL;
    double *s0 = ok ? tu_read(out[1]) : NULL;
    double *w01 = calloc((size_t)C, sizeof(double)), *w0 = calloc((size_t)(rows / sh[0] * C), sizeof(double));
    ok = ok && TU_EXPECT(gx && s01 && s0);
    for (int64_t i = 0; ok && i < rows; i++)
        for (int64_t j = 0; j < C; j++) w01[j] += gx[i * C + j], w0[i % sh[1] * C + j] += gx[i * C + j];
    ok = ok && block_close("sum over (0, 1)", s01, w01, C, dt) &&
         block_close("sum over 0", s0, w0, sh[1] * C, dt);
    int merged = -1;
    bool said = true, sane = true;
    if (ok && TU_EXPECT(fn->ngraphs == 1)) {
        sg__graph *g = fn->graphs[0];
        merged = cuda_merged(g, false, &sane);
        sg__fuse_opts fo;
        sg__fused f;
        if (merged >= 0 && cuda_opts(&fo, false)) {
            if (TU_EXPECT(sg__fuse(ctx, &g->ir, &fo, &f) == SG_OK)) {
                sg__fused keep = g->fused;
                bool had = g->has_fused;
                g->fused = f, g->has_fused = true;
                const char *e = sg_fn_explain(fn);
                said = e && strstr(e, "run as two kernels: the sum does not keep exactly the last dim");
                g->fused = keep, g->has_fused = had;
                sg__fused_free(ctx, &f, &g->ir);
            }
        }
        ok = TU_EXPECT(sane) && TU_EXPECT(merged == 1 || merged == -1) && TU_EXPECT(said);
    }
    if (!ok) fprintf(stderr, "  %s\n", sg_last_error(ctx));
    tu_case(ok,
            "NORM_GRAD_USER_SUMS(layer_norm,type=%s,x=[3,40,256]): dx summed over dims (0, 1) "
            "merged into the norm's kernel with the CUDA options (%d merged), over dim 0 not "
            "(said: %d), both == f64 sums of dx",
            sg_dtype_name(dt), merged, said);
    free(gx), free(s01), free(s0), free(w01), free(w0);
    for (int i = 0; i < 2; i++) sg_release(out[i]), sg_release(eager[i]);
    sg_release(egx);
    sg_fn_destroy(fn);
    sg_release(us_x), sg_release(us_r);
}

int main(void) {
    ctx = tu_ctx((sg_ctx_opts){0});
    /* Rows of 768 and 512 (whole 16-byte vectors) as well as odd ones; row
     * counts that are not a multiple of a block's 8 warps (15, 21), and more
     * rows (1200) than one pass of the grid's warps over them. */
    static const int64_t shapes[8][3] = {{2, 600, 3},  {1, 3, 769}, {2, 1, 4100},
                                         {1, 2, 9000}, {2, 8, 768}, {3, 5, 512},
                                         {3, 7, 768},  {4, 300, 768}};
    static const sg_dtype dts[3] = {SG_F32, SG_BF16, SG_F16};
    uint64_t seed = 1;
    int i = 0;
    for (int d = 0; d < 3; d++)
        for (int s = 0; s < 8; s++)
            for (int layer = 1; layer >= 0; layer--, i++) {
                if (s == 3 && d > 0) continue; /* the longest rows in f32 only */
                int aff = (i / 2) % 4; /* none; weight; weight and bias; bias (layer_norm) */
                ncase c = {.layer = layer,
                           .w = aff == 1 || aff == 2 || (aff == 3 && !layer),
                           .b = layer && aff >= 2,
                           .res = (i / 2 + d) % 2 == 1,
                           .rows0 = shapes[s][0],
                           .rows1 = shapes[s][1],
                           .len = shapes[s][2],
                           .dt = dts[d],
                           .lay = s >= 4 && layer ? TU_CONTIG : (tu_layout)(i % TU_NUM_LAYOUTS)};
                if (tu_sampled()) norm_case(&c, seed);
                seed++;
            }
    compiled_cases();
    /* Rows the one-pass kernel takes on CUDA (bf16 768: three sets of
     * column sums over 48 KiB of shared memory a block; 4800 rows of 64:
     * more than one pass of the grid's warps), and rows of 100 and f32
     * rows of 768 (a team per row: the sum then runs alone). */
    static const bcase blocks[6] = {{true, SG_BF16, 2, 64, 768},
                                    {false, SG_F32, 3, 7, 512},
                                    {true, SG_F32, 3, 7, 768},
                                    {false, SG_BF16, 8, 600, 64},
                                    {false, SG_BF16, 2, 9, 100},
                                    {true, SG_F32, 2, 5, 100}};
    for (int b = 0; b < 6; b++) block_case(&blocks[b], 100 + (uint64_t)b);
    user_sums_case(SG_BF16);
    user_sums_case(SG_F32);
    for (int k = 0; k < nkeep; k++) {
        for (int j = 0; j < 3; j++) sg_release(keep[k].g[j]);
        sg_release(keep[k].x), sg_release(keep[k].w), sg_release(keep[k].b);
        sg_release(keep[k].r), sg_release(keep[k].s);
    }
    sg_ctx_destroy(ctx);
    return tu_finish();
}
