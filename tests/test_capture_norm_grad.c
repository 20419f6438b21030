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
 * gradients as eager, and the same bits on a second call.
 */
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
    for (int k = 0; k < nkeep; k++) {
        for (int j = 0; j < 3; j++) sg_release(keep[k].g[j]);
        sg_release(keep[k].x), sg_release(keep[k].w), sg_release(keep[k].b);
        sg_release(keep[k].r), sg_release(keep[k].s);
    }
    sg_ctx_destroy(ctx);
    return tu_finish();
}
