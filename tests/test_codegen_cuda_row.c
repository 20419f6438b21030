/* SPDX-License-Identifier: MIT */
/*
 * test_codegen_cuda_row.c -- the CUDA dialect's row kernels
 * (codegen/cgen_cuda_row.c) and the fusion that feeds them: softmax with a
 * scale prologue and a cast epilogue, layer_norm after a residual add,
 * rms_norm built in and written out of primitives (x * rsqrt(mean(x*x) +
 * eps) * w), log_softmax, row sums, layer_norm (also after adding one row
 * broadcast over the rows: W5's embedding), softmax over the rows
 * of a transposed view, and cross_entropy's backward written out
 * ((softmax(x) - cast(r > x)) / rows, the comparison a kernel of its own as
 * the one-hot is), over rows of 1, 7, 768, 1024, 5000 and 50257
 * elements in f32 and bf16; argmax over the last dim (kept, and dropped
 * after a scale prologue) with ties of the maximum and NaN planted in some
 * rows (first maximum wins, NaN counts as the maximum: PyTorch's rule).
 * Then the reductions that must use the whole GPU: a gradient's squared
 * norm over one row of 38.6M elements, sums, means and argmax over 4 rows
 * of 1M (rows cut over blocks, the last block finishing), column sums of
 * (4096, 768), (4, 1024, 768), (128, 1024) and (2048, 50257) with a cast *
 * mul prologue and a * 0.5 epilogue, odd (3, 5, 7) shapes and rows of one
 * element, NaN and infinities planted in some outputs' ranges; each checked
 * against an f64 sum within an f32 sum's rounding (2e-5 of the sum of
 * magnitudes), and the three calls (run, record, replay) bit for bit equal;
 * two squared norms recorded back to back stay two reductions (members of
 * one multi-tensor sum kernel), and six squared norms of sizes 1 to 1e6 + 7
 * in f32, bf16 and f16, two of them views that are not contiguous, are one
 * kernel whose sums and total match an f64 reference, bit for bit alike on
 * each call.
 *
 * Each case runs the compiled step on the test's backend (SG_TEST_BACKEND:
 * the CPU's generated C by default, the CUDA row kernels under the gpu
 * label) against an f64 reference written here, then fuses its capture
 * with the CUDA options, checks that the whole pattern is one generated
 * kernel with no library call, and compiles the unit with NVRTC for sm_90
 * (skipped, not failed, when NVRTC cannot be loaded); contiguous norm and
 * log_softmax rows of widths a multiple of 8 must take 16-byte vectors,
 * strided rows and rows with both a prologue and an epilogue must not.
 *
 * SG_ROW_SECTION=reduce runs the reductions only, SG_ROW_SECTION=sums the
 * squared norms only. SG_ROW_TIMING=1 (with
 * SG_TEST_BACKEND=cuda) also times compiled and eager
 * rms_norm, layer_norm and softmax in bf16 over (1, 768), (1, 4096),
 * (2048, 768) and (2048, 50257) against the HBM bytes floor.
 */
#define _POSIX_C_SOURCE 200809L
#include "testutil.h"

#include "graphs/graphs.h"
#include "cuda_unit.h"

#include <math.h>
#include <string.h>
#include <time.h>

static sg_ctx *ctx;
static bool nvrtc_missing;

typedef enum pattern {
    P_SOFTMAX_CAST,  /* cast(softmax(x * 0.5), other dtype) */
    P_LAYERNORM_RES, /* h = x + r; layer_norm(h, w, b) */
    P_RMS_BUILTIN,   /* rms_norm(x, w) */
    P_RMS_WRITTEN,   /* x * rsqrt(mean(x * x, -1) + eps) * w */
    P_LOG_SOFTMAX,   /* log_softmax(x) - 1 */
    P_ROW_SUM,       /* sum(x * x, -1, keepdim) * 2 */
    P_LAYERNORM,     /* layer_norm(x, w, b) */
    P_SOFTMAX_T,     /* softmax(transpose(x)) over its last dim: a strided walk */
    P_ARGMAX_KEEP,   /* argmax(x, -1, keepdim) */
    P_ARGMAX_SCALED, /* argmax(x * -2, -1): a prologue, the dim dropped */
    P_XENT_BWD,      /* (softmax(x) - cast(r > x)) / rows: cross_entropy's backward */
    P_LAYERNORM_BC,  /* h = x + r (r one row, broadcast: a walk that is not flat); layer_norm */
    P_COUNT
} pattern;

static const char *const pattern_name[P_COUNT] = {
    "SOFTMAX_SCALE_CAST", "LAYERNORM_RESIDUAL", "RMSNORM_BUILTIN",
    "RMSNORM_WRITTEN",    "LOG_SOFTMAX",        "ROW_SUM",
    "LAYERNORM",          "SOFTMAX_TRANSPOSED", "ARGMAX_KEEPDIM",
    "ARGMAX_SCALED",      "XENT_BACKWARD",      "LAYERNORM_BROADCAST"};

#define EPS 1e-5

typedef struct spec {
    pattern p;
    sg_dtype dt;
    sg_tensor *w, *b;
} spec;

static sg_dtype other(sg_dtype dt) { return dt == SG_F32 ? SG_BF16 : SG_F32; }

static sg_status row_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    const spec *s = user;
    sg_tensor *x = in[0];
    int last[1] = {-1};
    switch (s->p) {
    case P_SOFTMAX_CAST:
        out[0] = sg_cast(sg_softmax(sg_mul_scalar(x, 0.5), -1), other(s->dt));
        break;
    case P_LAYERNORM_RES:
    case P_LAYERNORM_BC:
        out[0] = sg_add(x, in[1]);
        out[1] = sg_layer_norm(out[0], s->w, s->b, EPS);
        break;
    case P_RMS_BUILTIN: out[0] = sg_rms_norm(x, s->w, EPS); break;
    case P_RMS_WRITTEN:
        out[0] = sg_mul(
            sg_mul(x, sg_rsqrt(sg_add_scalar(sg_mean(sg_mul(x, x), 1, last, true), EPS))), s->w);
        break;
    case P_LOG_SOFTMAX: out[0] = sg_add_scalar(sg_log_softmax(x, -1), -1.0); break;
    case P_ROW_SUM: out[0] = sg_mul_scalar(sg_sum(sg_mul(x, x), 1, last, true), 2.0); break;
    case P_LAYERNORM: out[0] = sg_layer_norm(x, s->w, s->b, EPS); break;
    case P_SOFTMAX_T: out[0] = sg_softmax(sg_transpose(x, 0, 1), -1); break;
    case P_ARGMAX_KEEP: out[0] = sg_argmax(x, -1, true); break;
    case P_ARGMAX_SCALED: out[0] = sg_argmax(sg_mul_scalar(x, -2.0), -1, false); break;
    case P_XENT_BWD:
        out[0] = sg_mul_scalar(sg_sub(sg_softmax(x, -1), sg_cast(sg_gt(in[1], x), s->dt)),
                               1.0 / (double)x->shape[0]);
        break;
    default: break;
    }
    return out[0] ? SG_OK : sg_ctx_status(c);
}

/* The f64 reference of out[k] for rows x (and r, w, b), rounding where the
 * step stores a value of dtype dt. */
static void reference(const spec *s, int64_t rows, int64_t len, const double *x, const double *r,
                      const double *w, const double *b, double *out0, double *out1) {
    sg_dtype dt = s->dt;
    for (int64_t i = 0; i < rows; i++) {
        const double *xr = x + i * len;
        double *o = out0 + i * len;
        if (s->p == P_SOFTMAX_CAST || s->p == P_LOG_SOFTMAX || s->p == P_SOFTMAX_T ||
            s->p == P_XENT_BWD) {
            double m = -INFINITY, sum = 0;
            for (int64_t j = 0; j < len; j++) {
                double v = s->p == P_SOFTMAX_CAST ? tu_round(dt, xr[j] * 0.5) : xr[j];
                o[j] = v;
                if (v > m) m = v;
            }
            for (int64_t j = 0; j < len; j++) sum += exp(o[j] - m);
            for (int64_t j = 0; j < len; j++) {
                if (s->p == P_SOFTMAX_CAST)
                    o[j] = tu_round(other(dt), tu_round(dt, exp(o[j] - m) / sum));
                else if (s->p == P_SOFTMAX_T)
                    o[j] = tu_round(dt, exp(o[j] - m) / sum);
                else if (s->p == P_XENT_BWD) /* every op rounds to dt */
                    o[j] = tu_round(dt, tu_round(dt, tu_round(dt, exp(o[j] - m) / sum) -
                                                         (r[i * len + j] > xr[j] ? 1.0 : 0.0)) /
                                            (double)rows);
                else
                    o[j] = tu_round(dt, tu_round(dt, (o[j] - m) - log(sum)) - 1.0);
            }
        } else if (s->p == P_LAYERNORM_RES || s->p == P_LAYERNORM || s->p == P_LAYERNORM_BC) {
            double mean = 0, var = 0;
            double *y = s->p == P_LAYERNORM ? out1 + i * len : o;
            for (int64_t j = 0; j < len; j++)
                y[j] = r ? tu_round(dt, xr[j] + r[(s->p == P_LAYERNORM_BC ? 0 : i) * len + j])
                         : xr[j];
            o = y;
            for (int64_t j = 0; j < len; j++) mean += o[j];
            mean /= (double)len;
            for (int64_t j = 0; j < len; j++) var += (o[j] - mean) * (o[j] - mean);
            double rs = 1.0 / sqrt(var / (double)len + EPS);
            double *ln = s->p == P_LAYERNORM ? out0 + i * len : out1 + i * len;
            for (int64_t j = 0; j < len; j++)
                ln[j] = tu_round(dt, (o[j] - mean) * rs * w[j] + b[j]);
        } else if (s->p == P_RMS_BUILTIN) {
            double ss = 0;
            for (int64_t j = 0; j < len; j++) ss += xr[j] * xr[j];
            double rs = 1.0 / sqrt(ss / (double)len + EPS);
            for (int64_t j = 0; j < len; j++) o[j] = tu_round(dt, xr[j] * rs * w[j]);
        } else if (s->p == P_RMS_WRITTEN) {
            /* Every op rounds: x*x, mean, + eps, rsqrt, x * r, * w. */
            double ss = 0;
            for (int64_t j = 0; j < len; j++) ss += tu_round(dt, xr[j] * xr[j]);
            double rs =
                tu_round(dt, 1.0 / sqrt(tu_round(dt, tu_round(dt, ss / (double)len) + EPS)));
            for (int64_t j = 0; j < len; j++) o[j] = tu_round(dt, tu_round(dt, xr[j] * rs) * w[j]);
        } else if (s->p == P_ARGMAX_KEEP || s->p == P_ARGMAX_SCALED) {
            /* The first NaN, else the first maximum. */
            int64_t at = 0;
            double best = -INFINITY;
            for (int64_t j = 0; j < len; j++) {
                double v = s->p == P_ARGMAX_SCALED ? tu_round(dt, xr[j] * -2.0) : xr[j];
                if (isnan(v)) {
                    at = j;
                    break;
                }
                if (j == 0 || v > best) best = v, at = j;
            }
            out0[i] = (double)at;
        } else { /* P_ROW_SUM: one value per row */
            double ss = 0;
            for (int64_t j = 0; j < len; j++) ss += tu_round(dt, xr[j] * xr[j]);
            out0[i] = tu_round(dt, tu_round(dt, ss) * 2.0);
        }
    }
}

/* What the capture became in the CUDA dialect. */
typedef struct counts {
    int kernels, calls, rows;
    bool split, cols; /* a reduction cut over blocks; a column reduction */
    bool vec;         /* a row in 16-byte vectors (its per-row alignment test) */
    int shared;       /* a multi-tensor sum's folds shared by several members */
} counts;

/* Fuse fn's last capture with the CUDA options, generate its unit, count
 * its kernels, library calls and row kernels, and compile it for sm_90. */
static bool cuda_unit(sg_fn *fn, const char *name, counts *c) {
    memset(c, 0, sizeof *c);
    if (!TU_EXPECT(fn->ngraphs > 0)) return false;
    sg__graph *g = fn->graphs[fn->ngraphs - 1];
    sg__fuse_opts fo;
    sg__cgen_cuda_fuse_opts(&fo, false);
    sg__fused f;
    if (!TU_EXPECT(sg__fuse(ctx, &g->ir, &fo, &f) == SG_OK)) return false;
    sg__cuda_kinfo *ki = calloc((size_t)(f.ngroups ? f.ngroups : 1), sizeof *ki);
    sg__emit e = {.ctx = ctx};
    bool ok = TU_EXPECT(ki && sg__cgen_cuda(ctx, &g->ir, &f, name, &e, ki, &c->kernels) == SG_OK);
    for (int k = 0; ok && k < f.ngroups; k++) {
        const sg__group *grp = &f.groups[k];
        if ((grp->kind == SG__G_OPAQUE || grp->anchor >= 0) && !ki[k].replaces_call) c->calls++;
        if (ki[k].replaces_call && grp->kind != SG__G_MATMUL) c->rows++;
    }
    if (ok && getenv("SG_TEST_PRINT_CUDA")) fprintf(stderr, "%s\n", e.buf);
    c->split = ok && strstr(e.buf, "r_count") != NULL;
    c->cols = ok && strstr(e.buf, "r_cred") != NULL;
    c->vec = ok && strstr(e.buf, "const bool r_al") != NULL;
    for (const char *p = ok ? e.buf : NULL; p && (p = strstr(p, "r_tc[r_t] == ")) != NULL; p++)
        c->shared++;
    ok = ok && cu_unit_compiles(ctx, name, e.buf, &nvrtc_missing);
    sg__emit_free(&e);
    free(ki);
    sg__fused_free(ctx, &f, &g->ir);
    return ok;
}

/*
 * Argmax's hard rows, in x and its values xv: row 1 holds its maximum
 * (beyond the draws, after the prologue) at three places, row 2 also a NaN after the first
 * of them, row 3 two NaNs (the first wins) and -inf at column 0, row 4
 * -inf everywhere (column 0 wins). The last column takes part in each.
 */
static void plant(pattern p, sg_tensor *x, double *xv, int64_t rows, int64_t len, sg_dtype dt) {
    double top = p == P_ARGMAX_SCALED ? -4.0 : 4.0; /* the maximum after the prologue */
    for (int64_t i = 1; i < rows && i <= 4; i++) {
        double *r = xv + i * len;
        int64_t a = len / 3, b = len - 1, m = len / 2;
        if (i == 1 || i == 2) r[b] = r[m] = r[a] = top;
        if (i == 2 && len > 1) r[a + 1 < len ? a + 1 : a] = NAN;
        if (i == 3) r[b] = r[m] = NAN, r[0] = -INFINITY;
        if (i == 4)
            for (int64_t j = 0; j < len; j++) r[j] = -INFINITY;
    }
    size_t es = sg_dtype_size(dt);
    void *buf = malloc((size_t)(rows * len) * es);
    for (int64_t j = 0; j < rows * len; j++) tu_store(buf, dt, j, xv[j]);
    sg_write(x, buf, (size_t)(rows * len) * es);
    free(buf);
}

static void test_case(pattern p, sg_dtype dt, int64_t rows, int64_t len) {
    tu_seed((uint64_t)(p * 1000003 + len * 7 + rows + dt));
    int64_t xs[2] = {rows, len}, ts[2] = {len, rows};
    double *xv = NULL, *rv = NULL, *wv = NULL, *bv = NULL;
    spec s = {.p = p, .dt = dt};
    sg_tensor *in[2] = {tu_rand(ctx, dt, 2, p == P_SOFTMAX_T ? ts : xs, -2, 2, &xv), NULL};
    if (p == P_SOFTMAX_T) { /* the reference reads the rows of the transpose */
        double *t = malloc(sizeof(double) * (size_t)(rows * len));
        for (int64_t i = 0; i < rows; i++)
            for (int64_t j = 0; j < len; j++) t[i * len + j] = xv[j * rows + i];
        free(xv);
        xv = t;
    }
    if (p == P_ARGMAX_KEEP || p == P_ARGMAX_SCALED) plant(p, in[0], xv, rows, len, dt);
    bool res = p == P_LAYERNORM_RES || p == P_LAYERNORM_BC;
    int64_t rs1[2] = {1, len};
    int nin = 1, nout = res ? 2 : 1;
    if (res || p == P_XENT_BWD)
        in[1] = tu_rand(ctx, dt, 2, p == P_LAYERNORM_BC ? rs1 : xs, -1, 1, &rv), nin = 2;
    if (res || p == P_LAYERNORM || p == P_RMS_BUILTIN || p == P_RMS_WRITTEN)
        s.w = tu_rand(ctx, dt, 1, &len, 0.5, 1.5, &wv);
    if (res || p == P_LAYERNORM) s.b = tu_rand(ctx, dt, 1, &len, -0.5, 0.5, &bv);
    sg_fn *fn = NULL;
    bool ok =
        TU_EXPECT(sg_compile(ctx, row_step, &s, nin, nout,
                             &(sg_compile_opts){.mode = SG_MODE_REDUCE_OVERHEAD}, &fn) == SG_OK);
    sg_tensor *out[2] = {NULL, NULL};
    /* The second call replays what the first captured. */
    for (int call = 0; call < 2 && ok; call++) {
        sg_mark_step_begin(ctx);
        ok = TU_EXPECT(sg_call(fn, in, nin, out, nout) == SG_OK);
        if (!ok) fprintf(stderr, "  %s\n", sg_last_error(ctx));
    }
    bool argmax = p == P_ARGMAX_KEEP || p == P_ARGMAX_SCALED;
    int64_t n0 = p == P_ROW_SUM || argmax ? rows : rows * len;
    double *ref0 = calloc((size_t)(rows * len), sizeof(double));
    double *ref1 = calloc((size_t)(rows * len), sizeof(double));
    char name[96];
    snprintf(name, sizeof name, "%s(type=%s,x=[%lld,%lld])", pattern_name[p], sg_dtype_name(dt),
             (long long)rows, (long long)len);
    if (ok) {
        reference(&s, rows, len, xv, rv, wv, bv, ref0, ref1);
        sg_dtype odt = p == P_SOFTMAX_CAST ? other(dt) : argmax ? SG_I64 : dt;
        /* bf16 outputs near a rounding boundary may round either way. */
        double rtol = tu_rtol(odt) > tu_rtol(dt) ? tu_rtol(odt) : tu_rtol(dt);
        double atol = tu_atol(odt) > tu_atol(dt) ? tu_atol(odt) : tu_atol(dt);
        double *got = tu_read(out[nout - 1]);
        ok = TU_EXPECT(got) &&
             tu_close(name, got, nout == 2 ? ref1 : ref0, nout == 2 ? rows * len : n0, rtol, atol);
        free(got);
        if (ok && nout == 2) {
            got = tu_read(out[0]);
            ok = TU_EXPECT(got) && tu_close(name, got, ref0, rows * len, rtol, atol);
            free(got);
        }
    }
    counts c = {0};
    char uname[96];
    snprintf(uname, sizeof uname, "cu_row_%d_%s_%lld_%lld", (int)p, sg_dtype_name(dt),
             (long long)rows, (long long)len);
    /* The backward's comparison is a kernel of its own, as the one-hot is. */
    ok = ok && cuda_unit(fn, uname, &c) && TU_EXPECT(c.kernels == (p == P_XENT_BWD ? 2 : 1)) &&
         TU_EXPECT(c.calls == 0) && TU_EXPECT(c.rows == 1);
    /* Rows in 16-byte vectors: a contiguous row read straight from memory or
     * stored as the kernel's only store (after a prologue, flat or not), its
     * width a multiple of 8; never a strided row, nor one with both a
     * prologue and an epilogue. */
    if (p == P_LAYERNORM || p == P_RMS_BUILTIN || res || p == P_LOG_SOFTMAX)
        ok = ok && TU_EXPECT(c.vec == (len % 8 == 0));
    if (p == P_SOFTMAX_CAST || p == P_SOFTMAX_T) ok = ok && TU_EXPECT(!c.vec);
    tu_case(ok, "%s on %s -> %d CUDA kernel, %d library calls%s", name,
            tu_backend() == SG_BACKEND_CUDA ? "cuda" : "cpu", c.kernels, c.calls,
            c.vec ? ", 16-byte rows" : "");
    sg_fn_destroy(fn);
    for (int k = 0; k < nin; k++) sg_release(in[k]);
    if (s.w) sg_release(s.w);
    if (s.b) sg_release(s.b);
    free(xv), free(rv), free(wv), free(bv), free(ref0), free(ref1);
}

/* ------------------------------------------------------------ long rows and columns */

typedef enum rop { R_SUM, R_MEAN, R_ARGMAX, R_VAR, R_VAR1 } rop; /* var: correction 0, 1 */
typedef enum rpro {
    PRO_NONE,    /* the input itself */
    PRO_SQUARE,  /* cast(x, f32) * cast(x, f32): a gradient's squared norm */
    PRO_CASTMUL, /* cast(x, f32) * cast(y, f32): a layer_norm weight gradient */
    PRO_KEPT     /* PRO_SQUARE, and cast(x, f32) again as a second output (as
                    clip_grad_norm_ scales it): the prologue stores the cast */
} rpro;

typedef struct rcase {
    rop op;
    rpro pro;
    sg_dtype dt; /* the input's */
    int nd;
    int64_t shape[3];
    int nred, dims[3];
    bool keep, half; /* keepdim; an epilogue * 0.5 */
    bool plant;      /* NaN and infinities in a few outputs' ranges */
    int expect;      /* 0: a team per row, 1: rows cut over blocks, 2: columns */
} rcase;

static sg_status red_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    const rcase *rc = user;
    sg_tensor *x = in[0];
    if (rc->pro == PRO_SQUARE || rc->pro == PRO_KEPT)
        x = sg_mul(sg_cast(x, SG_F32), sg_cast(x, SG_F32));
    if (rc->pro == PRO_KEPT) out[1] = sg_cast(in[0], SG_F32);
    if (rc->pro == PRO_CASTMUL) x = sg_mul(sg_cast(x, SG_F32), sg_cast(in[1], SG_F32));
    sg_tensor *y = rc->op == R_SUM    ? sg_sum(x, rc->nred, rc->dims, rc->keep)
                   : rc->op == R_MEAN ? sg_mean(x, rc->nred, rc->dims, rc->keep)
                   : rc->op == R_ARGMAX
                       ? sg_argmax(x, rc->dims[0], rc->keep)
                       : sg_var(x, rc->nred, rc->dims, rc->op == R_VAR1 ? 1 : 0, rc->keep);
    out[0] = rc->half ? sg_mul_scalar(y, 0.5) : y;
    return out[0] ? SG_OK : sg_ctx_status(c);
}

/* The flat index in x of output o's j-th reduced element (row-major over
 * the reduced dims, as argmax counts positions). */
static int64_t red_index(const rcase *rc, int64_t o, int64_t j) {
    int64_t idx[3] = {0}, rest = o, inner = j;
    for (int d = rc->nd - 1; d >= 0; d--) {
        bool red = false;
        for (int k = 0; k < rc->nred; k++) red = red || rc->dims[k] == d;
        if (red) {
            idx[d] = inner % rc->shape[d];
            inner /= rc->shape[d];
        } else {
            idx[d] = rest % rc->shape[d];
            rest /= rc->shape[d];
        }
    }
    int64_t f = 0;
    for (int d = 0; d < rc->nd; d++) f = f * rc->shape[d] + idx[d];
    return f;
}

/* The reference: each output's f64 sum (or first NaN / first maximum) of
 * the prologue's f32 values, and the sum of their magnitudes, the scale
 * of an f32 sum's rounding. */
static void red_reference(const rcase *rc, const double *x, const double *y, int64_t nout,
                          int64_t len, sg_dtype odt, double *ref, double *scale) {
    for (int64_t o = 0; o < nout; o++) {
        double s = 0, a = 0, best = -INFINITY;
        int64_t at = 0;
        for (int64_t j = 0; j < len; j++) {
            int64_t f = red_index(rc, o, j);
            double t = rc->pro == PRO_NONE      ? x[f]
                       : rc->pro == PRO_CASTMUL ? tu_round(SG_F32, x[f] * y[f])
                                                : tu_round(SG_F32, x[f] * x[f]);
            if (rc->op == R_ARGMAX) {
                if (isnan(best)) continue;
                if (isnan(t) || j == 0 || t > best) best = t, at = j;
                continue;
            }
            s += t;
            a += fabs(t);
        }
        if (rc->op == R_VAR || rc->op == R_VAR1) { /* two passes; scale: the variance */
            double mean = s / (double)len, m2 = 0, den = (double)(len - (rc->op == R_VAR1));
            for (int64_t j = 0; j < len; j++) {
                int64_t f = red_index(rc, o, j);
                double t = rc->pro == PRO_NONE ? x[f] : tu_round(SG_F32, x[f] * x[f]);
                m2 += (t - mean) * (t - mean);
            }
            double v = den > 0 ? m2 / den : m2 > 0 ? INFINITY : NAN;
            ref[o] = tu_round(odt, v);
            if (rc->half) ref[o] = tu_round(odt, ref[o] * 0.5);
            scale[o] = fabs(v) * (rc->half ? 0.5 : 1.0);
            continue;
        }
        if (rc->op == R_ARGMAX) {
            ref[o] = (double)at;
            scale[o] = 0;
            continue;
        }
        double div = rc->op == R_MEAN ? (double)len : 1.0, h = rc->half ? 0.5 : 1.0;
        ref[o] = tu_round(odt, s / div);
        if (rc->half) ref[o] = tu_round(odt, ref[o] * 0.5);
        scale[o] = a / div * h;
    }
}

/* got within an f32 sum's rounding of ref (plus the output dtype's), NaN
 * for NaN and the same infinity. */
static bool red_close(const char *name, const double *got, const double *ref, const double *scale,
                      int64_t n, sg_dtype odt) {
    int64_t bad = -1;
    double worst = 0;
    for (int64_t o = 0; o < n; o++) {
        bool ok;
        if (isnan(ref[o]))
            ok = isnan(got[o]);
        else if (isinf(ref[o]))
            ok = got[o] == ref[o];
        else
            ok = fabs(got[o] - ref[o]) <= 2e-5 * scale[o] + tu_rtol(odt) * fabs(ref[o]) + 1e-30;
        double err = isnan(got[o]) || isnan(ref[o]) ? INFINITY : fabs(got[o] - ref[o]);
        if (!ok && (bad < 0 || err > worst)) bad = o, worst = err;
    }
    if (bad >= 0)
        fprintf(stderr, "  %s: output %lld is %.9g, expected %.9g (scale %.3g)\n", name,
                (long long)bad, got[bad], ref[bad], scale[bad]);
    return bad < 0;
}

/* NaN in one range, +inf in another, +inf and -inf in a third; for
 * argmax, the maximum three times in range 1 (the first wins). */
static void red_plant(const rcase *rc, sg_tensor *t, double *xv, int64_t nout, int64_t len) {
    int64_t numel = nout * len;
    if (rc->op == R_ARGMAX) {
        for (int64_t k = 1; k <= 3; k++) xv[red_index(rc, 1 % nout, len * k / 4)] = 4.0;
        xv[red_index(rc, 2 % nout, len / 3)] = NAN;
        xv[red_index(rc, 2 % nout, len / 2)] = NAN;
    } else {
        xv[red_index(rc, 0, len / 2)] = NAN;
        xv[red_index(rc, 1 % nout, len - 1)] = INFINITY;
        xv[red_index(rc, 2 % nout, 0)] = INFINITY;
        xv[red_index(rc, 2 % nout, len / 3)] = -INFINITY;
    }
    size_t es = sg_dtype_size(rc->dt);
    void *buf = malloc((size_t)numel * es);
    for (int64_t j = 0; j < numel; j++) tu_store(buf, rc->dt, j, xv[j]);
    sg_write(t, buf, (size_t)numel * es);
    free(buf);
}

static void red_case(const rcase *rc) {
    static const char *const opn[5] = {"SUM", "MEAN", "ARGMAX", "VAR", "VAR1"};
    static const char *const pron[4] = {"x", "f32(x)*f32(x)", "f32(x)*f32(y)",
                                        "f32(x)*f32(x),f32(x)"};
    int64_t numel = 1, len = 1;
    for (int d = 0; d < rc->nd; d++) numel *= rc->shape[d];
    for (int k = 0; k < rc->nred; k++) len *= rc->shape[rc->dims[k]];
    int64_t nout = numel / len;
    char name[160], sh[48], dm[32] = "";
    size_t q = 0;
    for (int k = 0; k < rc->nred; k++)
        q += (size_t)snprintf(dm + q, sizeof dm - q, k ? ",%d" : "%d", rc->dims[k]);
    snprintf(name, sizeof name, "%s(%s,type=%s,x=%s,dims=[%s]%s%s%s)", opn[rc->op], pron[rc->pro],
             sg_dtype_name(rc->dt), tu_shape(rc->nd, rc->shape, sh, sizeof sh), dm,
             rc->keep ? ",keepdim" : "", rc->half ? ",*0.5" : "", rc->plant ? ",nan/inf" : "");
    tu_seed((uint64_t)(numel * 31 + rc->op * 7 + rc->pro * 3 + rc->dt + rc->nred));
    double *xv = NULL, *yv = NULL;
    int nin = rc->pro == PRO_CASTMUL ? 2 : 1, nouts = rc->pro == PRO_KEPT ? 2 : 1;
    sg_tensor *in[2] = {tu_rand(ctx, rc->dt, rc->nd, rc->shape, -1, 1, &xv), NULL};
    if (nin == 2) in[1] = tu_rand(ctx, rc->dt, rc->nd, rc->shape, -1, 1, &yv);
    if (rc->plant) red_plant(rc, in[0], xv, nout, len);
    sg_fn *fn = NULL;
    bool ok =
        TU_EXPECT(in[0] && (nin == 1 || in[1])) &&
        TU_EXPECT(sg_compile(ctx, red_step, (void *)rc, nin, nouts,
                             &(sg_compile_opts){.mode = SG_MODE_REDUCE_OVERHEAD}, &fn) == SG_OK);
    /* Call 1 runs the kernels, 2 records the graph, 3 replays it: the
     * results of the three must be the same bits. */
    sg_tensor *out[2] = {NULL, NULL};
    double *got[3] = {NULL, NULL, NULL};
    for (int call = 0; call < 3 && ok; call++) {
        sg_mark_step_begin(ctx);
        ok = TU_EXPECT(sg_call(fn, in, nin, out, nouts) == SG_OK) &&
             TU_EXPECT(got[call] = tu_read(out[0]));
        if (!ok) fprintf(stderr, "  %s\n", sg_last_error(ctx));
    }
    sg_dtype odt = rc->op == R_ARGMAX ? SG_I64 : rc->pro == PRO_NONE ? rc->dt : SG_F32;
    if (ok) {
        double *ref = malloc(sizeof(double) * (size_t)nout);
        double *scale = malloc(sizeof(double) * (size_t)nout);
        red_reference(rc, xv, yv, nout, len, odt, ref, scale);
        ok = red_close(name, got[0], ref, scale, nout, odt);
        for (int call = 1; call < 3 && ok; call++)
            ok = TU_EXPECT(memcmp(got[0], got[call], sizeof(double) * (size_t)nout) == 0);
        free(ref), free(scale);
        if (ok && nouts == 2) { /* the stored cast: exact */
            double *kept = tu_read(out[1]);
            ok = TU_EXPECT(kept) && tu_close(name, kept, xv, numel, 0, 0);
            free(kept);
        }
    }
    counts c = {0};
    char uname[96];
    snprintf(uname, sizeof uname, "cu_red_%d_%d_%s_%lld_%lld", (int)rc->op, (int)rc->pro,
             sg_dtype_name(rc->dt), (long long)nout, (long long)len);
    ok = ok && cuda_unit(fn, uname, &c) && TU_EXPECT(c.kernels == 1) && TU_EXPECT(c.calls == 0) &&
         TU_EXPECT(c.rows == 1) && TU_EXPECT(c.cols == (rc->expect == 2)) &&
         TU_EXPECT(rc->expect == 2 || c.split == (rc->expect == 1));
    tu_case(ok, "%s on %s -> %d CUDA kernel (%s), %d library calls", name,
            tu_backend() == SG_BACKEND_CUDA ? "cuda" : "cpu", c.kernels,
            c.cols    ? (c.split ? "columns, cut" : "columns")
            : c.split ? "rows, cut"
                      : "rows",
            c.calls);
    sg_fn_destroy(fn);
    for (int k = 0; k < nin; k++) sg_release(in[k]);
    for (int k = 0; k < 3; k++) free(got[k]);
    free(xv), free(yv);
}

/* Reductions the generated kernels leave to the library: a max, and a sum
 * over dims 0 and 2 of (3, 5, 7) (not one run); next to a column sum that
 * they take. */
static sg_status lib_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)user;
    int d1[1] = {1}, d02[2] = {0, 2}, d0[1] = {0};
    out[0] = sg_max(in[0], 1, d1, false);
    out[1] = sg_sum(in[0], 2, d02, false);
    out[2] = sg_sum(in[0], 1, d0, false);
    return out[0] && out[1] && out[2] ? SG_OK : sg_ctx_status(c);
}

/* Fusion gives each library anchor its reason; sg_fn_explain shows them on CUDA. */
static void library_reasons(void) {
    int64_t shape[3] = {3, 5, 7};
    sg_tensor *x = tu_rand(ctx, SG_F32, 3, shape, -1, 1, NULL);
    sg_fn *fn = NULL;
    sg_tensor *out[3] = {NULL, NULL, NULL};
    bool ok = TU_EXPECT(sg_compile(ctx, lib_step, NULL, 1, 3, NULL, &fn) == SG_OK) &&
              TU_EXPECT(sg_call(fn, &x, 1, out, 3) == SG_OK) && TU_EXPECT(fn->ngraphs > 0);
    int nmax = 0, nrun = 0, ncol = 0;
    if (ok) {
        sg__graph *g = fn->graphs[fn->ngraphs - 1];
        sg__fuse_opts fo;
        sg__cgen_cuda_fuse_opts(&fo, false);
        sg__fused f;
        ok = TU_EXPECT(sg__fuse(ctx, &g->ir, &fo, &f) == SG_OK);
        for (int k = 0; ok && k < f.ngroups; k++) {
            const sg__group *grp = &f.groups[k];
            if (grp->kind != SG__G_REDUCE) continue;
            const char *why = grp->lib_why;
            sg__op op = g->ir.nodes[grp->g[grp->anchor].node].op;
            if (op == SG__OP_MAX) nmax += why && strstr(why, "no generated kernel") != NULL;
            if (op == SG__OP_SUM && grp->rows_inline) ncol += why == NULL && grp->ncols == 35;
            if (op == SG__OP_SUM && !grp->rows_inline)
                nrun += why && strstr(why, "one run") != NULL;
        }
        sg__fused_free(ctx, &f, &g->ir);
        ok = ok && TU_EXPECT(nmax == 1) && TU_EXPECT(nrun == 1) && TU_EXPECT(ncol == 1);
        if (ok && tu_backend() == SG_BACKEND_CUDA)
            ok = TU_EXPECT(strstr(sg_fn_explain(fn), "library kernel: IR line") != NULL);
    }
    tu_case(ok, "LIBRARY_REASONS(max over [1], sum over [0,2], sum over [0] of [3,5,7]) on %s",
            tu_backend() == SG_BACKEND_CUDA ? "cuda" : "cpu");
    sg_fn_destroy(fn);
    sg_release(x);
}

/* clip_grad_norm_'s squared norms recorded back to back: after a sum of
 * one row, the next gradient's cast and square read nothing of it. */
static sg_status norms_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)user;
    for (int k = 0; k < 2; k++) {
        sg_tensor *g = sg_cast(in[k], SG_F32), *g2 = sg_mul(g, g);
        out[k] = sg_sum(g2, 0, NULL, false);
        sg_release(g), sg_release(g2);
    }
    return out[0] && out[1] ? SG_OK : sg_ctx_status(c);
}

/* Each sum is its own reduction with its square as prologue: the second
 * square is no epilogue of the first sum (which would walk it in that sum's
 * one row, one block); the two are members of one multi-tensor sum kernel;
 * both sums match an f64 sum of squares. */
static void norms_apart(void) {
    int64_t shape[2] = {300, 1000};
    double *v[2] = {NULL, NULL};
    sg_tensor *x[2] = {tu_rand(ctx, SG_BF16, 2, shape, -1, 1, &v[0]),
                       tu_rand(ctx, SG_BF16, 2, shape, -1, 1, &v[1])};
    sg_fn *fn = NULL;
    sg_tensor *out[2] = {NULL, NULL};
    bool ok = TU_EXPECT(sg_compile(ctx, norms_step, NULL, 2, 2, NULL, &fn) == SG_OK) &&
              TU_EXPECT(sg_call(fn, x, 2, out, 2) == SG_OK) && TU_EXPECT(fn->ngraphs > 0);
    for (int k = 0; ok && k < 2; k++) {
        double ref = 0, *got = tu_read(out[k]);
        for (int64_t i = 0; i < shape[0] * shape[1]; i++) ref += v[k][i] * v[k][i];
        ok = TU_EXPECT(got != NULL) && TU_EXPECT(tu_close("norm", got, &ref, 1, 0, 2e-5 * ref));
        free(got);
    }
    int nsum = 0, nbcast = 0, nmulti = 0;
    if (ok) {
        sg__graph *g = fn->graphs[fn->ngraphs - 1];
        sg__fuse_opts fo;
        sg__cgen_cuda_fuse_opts(&fo, false);
        sg__fused f;
        ok = TU_EXPECT(sg__fuse(ctx, &g->ir, &fo, &f) == SG_OK);
        for (int k = 0; ok && k < f.ngroups; k++) {
            const sg__group *grp = &f.groups[k];
            bool sums = grp->kind == SG__G_MULTI && grp->sums;
            nmulti += sums;
            for (int m = 0; m < (sums ? grp->nmembers : 1); m++) {
                const sg__group *p = sums ? &f.parts[grp->members[m]] : grp;
                if (p->kind != SG__G_REDUCE) continue;
                nsum++;
                nbcast += p->bcast != 0;
            }
        }
        if (ok) sg__fused_free(ctx, &f, &g->ir);
        ok = ok && TU_EXPECT(nsum == 2) && TU_EXPECT(nbcast == 0) && TU_EXPECT(nmulti == 1);
    }
    tu_case(ok, "NORMS_APART(sum(f32(x)^2) then sum(f32(y)^2), bf16 [300,1000]) on %s",
            tu_backend() == SG_BACKEND_CUDA ? "cuda" : "cpu");
    sg_fn_destroy(fn);
    for (int k = 0; k < 2; k++) sg_release(x[k]), free(v[k]);
}

/* ------------------------------------------------------------ multi-tensor sums */

/* The members of MULTI_NORMS: sizes 1, 3, 1e6 + 7 and two views that are
 * not contiguous, in f32, bf16 and f16. */
#define NMEM 6
typedef struct member {
    sg_dtype dt;
    int nd;
    int64_t shape[2];
    tu_layout layout;
} member;
static const member members[NMEM] = {
    {SG_F32, 1, {1, 0}, TU_CONTIG},       {SG_BF16, 1, {3, 0}, TU_CONTIG},
    {SG_F16, 1, {1000007, 0}, TU_CONTIG}, {SG_BF16, 2, {300, 1001}, TU_PERMUTED},
    {SG_F32, 2, {257, 65}, TU_SLICED},    {SG_F16, 2, {768, 2304}, TU_CONTIG},
};

/* sum(f32(g)^2) of each member (clip_grad_norm_'s squared norms), then
 * their total in a running sum and its sqrt: NMEM + 1 outputs. */
static sg_status multi_norms_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)user;
    sg_tensor *tot;
    for (int k = 0; k < NMEM; k++) {
        sg_tensor *g = sg_tensor_dtype(in[k]) == SG_F32 ? in[k] : sg_cast(in[k], SG_F32);
        sg_tensor *g2 = sg_mul(g, g);
        out[k] = sg_sum(g2, 0, NULL, false);
        if (g != in[k]) sg_release(g);
        sg_release(g2);
    }
    tot = sg_add(out[0], out[1]);
    for (int k = 2; k < NMEM; k++) {
        sg_tensor *next = sg_add(tot, out[k]);
        sg_release(tot);
        tot = next;
    }
    out[NMEM] = sg_sqrt(tot);
    sg_release(tot);
    for (int k = 0; k <= NMEM; k++)
        if (!out[k]) return sg_ctx_status(c);
    return SG_OK;
}

/*
 * Six squared norms recorded back to back are one kernel of the CUDA
 * dialect (a multi-tensor sum: fusion's sums), which NVRTC compiles; the
 * compiled step's sums and their total match an f64 sum of squares within
 * an f32 sum's rounding, and the four calls (run, record, two replays)
 * give the same bits. The two contiguous f16 members run one shared fold
 * (their bases from the kernel's tables), the others their own.
 */
static void multi_norms(void) {
    sg_tensor *x[NMEM];
    double *v[NMEM];
    tu_seed(77);
    bool ok = true;
    for (int k = 0; k < NMEM; k++) {
        const member *mb = &members[k];
        x[k] = tu_rand_layout(ctx, mb->dt, mb->nd, mb->shape, -1, 1, mb->layout, &v[k]);
        ok = ok && TU_EXPECT(x[k] != NULL);
    }
    sg_fn *fn = NULL;
    ok = ok &&
         TU_EXPECT(sg_compile(ctx, multi_norms_step, NULL, NMEM, NMEM + 1,
                              &(sg_compile_opts){.mode = SG_MODE_REDUCE_OVERHEAD}, &fn) == SG_OK);
    sg_tensor *out[NMEM + 1] = {NULL};
    double got[4][NMEM + 1];
    for (int call = 0; call < 4 && ok; call++) {
        sg_mark_step_begin(ctx);
        ok = TU_EXPECT(sg_call(fn, x, NMEM, out, NMEM + 1) == SG_OK);
        for (int k = 0; ok && k <= NMEM; k++) {
            double *r = tu_read(out[k]);
            ok = TU_EXPECT(r != NULL);
            if (ok) got[call][k] = r[0];
            free(r);
        }
        if (!ok) fprintf(stderr, "  %s\n", sg_last_error(ctx));
    }
    double ref[NMEM + 1], tot = 0;
    for (int k = 0; ok && k < NMEM; k++) {
        int64_t n = members[k].shape[0] * (members[k].nd > 1 ? members[k].shape[1] : 1);
        ref[k] = 0;
        for (int64_t i = 0; i < n; i++) ref[k] += v[k][i] * v[k][i];
        tot += ref[k];
        ok = tu_close("squared norm", &got[0][k], &ref[k], 1, 0, 2e-5 * ref[k]);
    }
    ref[NMEM] = sqrt(tot);
    ok = ok && tu_close("total norm", &got[0][NMEM], &ref[NMEM], 1, 1e-5, 0);
    for (int call = 1; call < 4 && ok; call++)
        ok = TU_EXPECT(memcmp(got[0], got[call], sizeof got[0]) == 0);
    /* The CUDA dialect's unit: every sum a member of one kernel. */
    int nsums = 0, nred = 0;
    counts c = {0};
    if (ok) {
        sg__graph *g = fn->graphs[fn->ngraphs - 1];
        sg__fuse_opts fo;
        sg__cgen_cuda_fuse_opts(&fo, false);
        sg__fused f;
        ok = TU_EXPECT(sg__fuse(ctx, &g->ir, &fo, &f) == SG_OK);
        for (int k = 0; ok && k < f.ngroups; k++) {
            const sg__group *grp = &f.groups[k];
            nred += grp->kind == SG__G_REDUCE;
            if (grp->kind == SG__G_MULTI && grp->sums && grp->nmembers == NMEM) nsums++;
        }
        if (ok) sg__fused_free(ctx, &f, &g->ir);
        ok = ok && TU_EXPECT(nsums == 1) && TU_EXPECT(nred == 0) &&
             cuda_unit(fn, "cu_multi_norms", &c) && TU_EXPECT(c.calls == 0) && TU_EXPECT(c.split) &&
             TU_EXPECT(c.shared == 1); /* the two contiguous f16 members share one fold */
    }
    /* On the GPU, explain shows the two kernels that ran: the sums, then the total. */
    if (ok && tu_backend() == SG_BACKEND_CUDA) {
        const char *ex = sg_fn_explain(fn);
        ok = TU_EXPECT(strstr(ex, "kernels: 2 (") != NULL);
        if (!ok) fprintf(stderr, "%s", ex);
    }
    tu_case(ok,
            "MULTI_NORMS(sum(f32(g)^2) of f32[1], bf16[3], f16[1000007], bf16[300,1001] permuted, "
            "f32[257,65] sliced, f16[768,2304]; sqrt of the total) on %s -> %d CUDA kernels",
            tu_backend() == SG_BACKEND_CUDA ? "cuda" : "cpu", c.kernels);
    sg_fn_destroy(fn);
    for (int k = 0; k < NMEM; k++) sg_release(x[k]), free(v[k]);
}

static void reductions(void) {
    static const rcase cases[] = {
        /* A gradient's squared norm: one row of 38.6M (the GPT-2 embedding). */
        {R_SUM, PRO_SQUARE, SG_BF16, 2, {1, 38597376}, 2, {0, 1}, true, false, false, 1},
        {R_SUM, PRO_NONE, SG_F32, 2, {4, 1 << 20}, 1, {1}, false, false, false, 1},
        {R_SUM, PRO_KEPT, SG_BF16, 2, {768, 3072}, 2, {0, 1}, false, false, true, 1},
        {R_MEAN, PRO_NONE, SG_BF16, 2, {4, 1 << 20}, 1, {1}, true, true, true, 1},
        {R_ARGMAX, PRO_NONE, SG_F32, 2, {4, 1 << 20}, 1, {1}, false, false, true, 1},
        {R_ARGMAX, PRO_SQUARE, SG_BF16, 2, {3, 100000}, 1, {1}, true, false, false, 1},
        /* Bias and layer_norm gradients: sums over the leading dims. */
        {R_SUM, PRO_CASTMUL, SG_BF16, 2, {4096, 768}, 1, {0}, false, false, false, 2},
        {R_SUM, PRO_CASTMUL, SG_BF16, 3, {4, 1024, 768}, 2, {0, 1}, true, true, false, 2},
        {R_SUM, PRO_NONE, SG_F32, 2, {128, 1024}, 1, {0}, true, false, false, 2},
        {R_SUM, PRO_NONE, SG_F32, 2, {128, 1024}, 1, {0}, true, true, true, 2},
        {R_SUM, PRO_NONE, SG_F32, 2, {128, 1024}, 1, {0}, false, false, true, 2},
        {R_SUM, PRO_KEPT, SG_BF16, 2, {4096, 768}, 1, {0}, true, false, false, 2},
        {R_MEAN, PRO_NONE, SG_BF16, 2, {2048, 50257}, 1, {0}, true, false, false, 2},
        /* Bias gradients: GPT-2's (cut over blocks), a wider one with NaN and infinities,
         * an f16 mean of few rows. */
        {R_SUM, PRO_NONE, SG_BF16, 3, {4, 1024, 768}, 2, {0, 1}, true, false, false, 2},
        {R_SUM, PRO_NONE, SG_BF16, 2, {4096, 2304}, 1, {0}, false, false, true, 2},
        {R_MEAN, PRO_NONE, SG_F16, 2, {333, 72}, 1, {0}, true, true, false, 2},
        /* Short ranges: a positional embedding's gradient over a batch of 4 (a thread per
         * column), 8 rows (two row groups), NaN and infinities planted. */
        {R_SUM, PRO_NONE, SG_BF16, 3, {4, 1024, 768}, 1, {0}, false, false, false, 2},
        {R_SUM, PRO_NONE, SG_F32, 2, {8, 4000}, 1, {0}, true, true, true, 2},
        {R_MEAN, PRO_SQUARE, SG_BF16, 2, {3, 1001}, 1, {0}, false, false, false, 2},
        /* Column sums of several row blocks (a middle dim): bf16 with NaN and
         * infinities, f32 of three vectors a row block. */
        {R_SUM, PRO_NONE, SG_BF16, 3, {3, 50, 64}, 1, {1}, false, false, true, 2},
        {R_MEAN, PRO_NONE, SG_F32, 3, {2, 33, 12}, 1, {1}, true, true, false, 2},
        /* Odd shapes: a middle dim, the first dim, rows of 1 element. */
        {R_SUM, PRO_NONE, SG_F32, 3, {3, 5, 7}, 1, {1}, false, false, false, 2},
        {R_MEAN, PRO_SQUARE, SG_BF16, 3, {3, 5, 7}, 1, {1}, true, true, false, 2},
        {R_SUM, PRO_NONE, SG_F32, 3, {3, 5, 7}, 1, {0}, false, false, false, 2},
        {R_SUM, PRO_NONE, SG_F32, 3, {3, 5, 7}, 2, {1, 2}, false, false, false, 0},
        /* var over the last dim (layer_norm's backward), one-element rows. */
        {R_VAR, PRO_NONE, SG_BF16, 3, {4, 256, 768}, 1, {2}, true, false, false, 0},
        {R_VAR1, PRO_SQUARE, SG_F32, 2, {6, 5000}, 1, {1}, true, true, true, 0},
        {R_VAR1, PRO_NONE, SG_F32, 2, {5, 1}, 1, {1}, true, false, false, 0},
        {R_SUM, PRO_NONE, SG_F32, 2, {64, 1}, 1, {1}, false, false, false, 0},
        {R_SUM, PRO_NONE, SG_BF16, 3, {5, 1, 7}, 1, {1}, true, true, false, 0},
        {R_SUM, PRO_NONE, SG_F32, 2, {1, 1}, 2, {0, 1}, false, false, false, 0},
        {R_SUM, PRO_NONE, SG_F32, 2, {1, 20000}, 1, {1}, false, false, true, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) red_case(&cases[i]);
    library_reasons();
    norms_apart();
    multi_norms();
}

/* ------------------------------------------------------------ timing */

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Microseconds per call of the step in mode m (after warm-up). */
static double time_fn(sg_step_fn step, void *user, sg_mode m, sg_tensor *const *x, int nin,
                      int nout) {
    sg_fn *fn = NULL;
    if (sg_compile(ctx, step, user, nin, nout, &(sg_compile_opts){.mode = m}, &fn) != SG_OK)
        return -1;
    sg_tensor *out[2] = {NULL, NULL};
    int iters = 200;
    double t0 = 0;
    for (int it = 0; it < iters + 10; it++) {
        if (it == 10) {
            sg_ctx_synchronize(ctx);
            t0 = now_s();
        }
        sg_mark_step_begin(ctx);
        if (sg_call(fn, x, nin, out, nout) != SG_OK) {
            sg_fn_destroy(fn);
            return -1;
        }
    }
    sg_ctx_synchronize(ctx);
    double us = (now_s() - t0) / iters * 1e6;
    sg_fn_destroy(fn);
    return us;
}

static void timing(bool rows) {
    static const int64_t shapes[4][2] = {{1, 768}, {1, 4096}, {2048, 768}, {2048, 50257}};
    static const pattern pats[3] = {P_RMS_BUILTIN, P_LAYERNORM, P_SOFTMAX_CAST};
    for (int si = 0; si < 4 && rows; si++)
        for (int pi = 0; pi < 3; pi++) {
            int64_t rows = shapes[si][0], len = shapes[si][1], xs[2] = {rows, len};
            spec s = {.p = pats[pi], .dt = SG_BF16};
            sg_tensor *x = tu_rand(ctx, SG_BF16, 2, xs, -2, 2, NULL);
            s.w = tu_rand(ctx, SG_BF16, 1, &len, 0.5, 1.5, NULL);
            s.b = tu_rand(ctx, SG_BF16, 1, &len, -0.5, 0.5, NULL);
            /* x in, y out (f32 after softmax's cast), weight and bias. */
            double ob = s.p == P_SOFTMAX_CAST ? 4 : 2;
            double bytes = (double)rows * (double)len * (2 + ob) + (double)len * 2 * 2;
            double compiled = time_fn(row_step, &s, SG_MODE_REDUCE_OVERHEAD, &x, 1, 1);
            double eager = time_fn(row_step, &s, SG_MODE_EAGER, &x, 1, 1);
            fprintf(stderr,
                    "TIMING %s bf16 [%lld,%lld]: compiled %.2f us, eager %.2f us, bytes floor %.2f "
                    "us (%.0f KB at 3.35 TB/s)\n",
                    pattern_name[s.p], (long long)rows, (long long)len, compiled, eager,
                    bytes / 3.35e12 * 1e6, bytes / 1024);
            sg_release(x), sg_release(s.w), sg_release(s.b);
        }
    /* The reductions: a gradient's squared norm (also storing the f32
     * cast, as clip_grad_norm_ does), a layer_norm weight gradient (two bf16
     * inputs), a bias gradient in f32. */
    static const rcase red[5] = {
        {R_SUM, PRO_SQUARE, SG_BF16, 2, {1, 38597376}, 2, {0, 1}, true, false, false, 1},
        {R_SUM, PRO_KEPT, SG_BF16, 2, {50257, 768}, 2, {0, 1}, true, false, false, 1},
        {R_SUM, PRO_KEPT, SG_BF16, 2, {768, 3072}, 2, {0, 1}, true, false, false, 1},
        {R_SUM, PRO_CASTMUL, SG_BF16, 2, {4096, 768}, 1, {0}, false, false, false, 2},
        {R_SUM, PRO_NONE, SG_F32, 2, {128, 1024}, 1, {0}, false, false, false, 2}};
    for (int i = 0; i < 5; i++) {
        const rcase *rc = &red[i];
        int nin = rc->pro == PRO_CASTMUL ? 2 : 1, nout = rc->pro == PRO_KEPT ? 2 : 1;
        sg_tensor *x[2] = {tu_rand(ctx, rc->dt, 2, rc->shape, -1, 1, NULL), NULL};
        if (nin == 2) x[1] = tu_rand(ctx, rc->dt, 2, rc->shape, -1, 1, NULL);
        double bytes = (double)(rc->shape[0] * rc->shape[1]) *
                       (double)(sg_dtype_size(rc->dt) * nin + (nout == 2 ? 4 : 0));
        double compiled = time_fn(red_step, (void *)rc, SG_MODE_REDUCE_OVERHEAD, x, nin, nout);
        double eager = time_fn(red_step, (void *)rc, SG_MODE_EAGER, x, nin, nout);
        fprintf(stderr,
                "TIMING REDUCE sum %s%s [%lld,%lld] dims=[%s]: compiled %.2f us, eager %.2f us, "
                "bytes floor %.2f us (%.0f KB at 3.35 TB/s)\n",
                sg_dtype_name(rc->dt), nout == 2 ? " (the cast stored)" : "",
                (long long)rc->shape[0], (long long)rc->shape[1], rc->nred == 2 ? "0,1" : "0",
                compiled, eager, bytes / 3.35e12 * 1e6, bytes / 1024);
        for (int k = 0; k < nin; k++) sg_release(x[k]);
    }
}

int main(void) {
    ctx = tu_ctx((sg_ctx_opts){0});
    static const int64_t lens[6] = {1, 7, 768, 1024, 5000, 50257};
    static const sg_dtype dts[2] = {SG_F32, SG_BF16};
    /* SG_ROW_SECTION=reduce runs only the long-row and column reductions. */
    const char *sec = getenv("SG_ROW_SECTION");
    if (sec && strcmp(sec, "sums") == 0) { /* the squared norms only */
        norms_apart();
        multi_norms();
        sg_ctx_destroy(ctx);
        return tu_finish();
    }
    bool rows = !sec || strcmp(sec, "reduce") != 0;
    for (int p = 0; p < P_COUNT && rows; p++)
        for (int d = 0; d < 2; d++)
            for (int l = 0; l < 6; l++) {
                /* Short rows: several per block (warp teams), a partial block. */
                int64_t rows = lens[l] <= 256 ? 13 : lens[l] <= 1024 ? 5 : 3;
                if (p == P_ARGMAX_KEEP || p == P_ARGMAX_SCALED) rows = 6; /* the planted rows */
                test_case((pattern)p, dts[d], rows, lens[l]);
            }
    reductions();
    const char *t = getenv("SG_ROW_TIMING");
    if (t && strcmp(t, "1") == 0 && tu_backend() == SG_BACKEND_CUDA) timing(rows);
    sg_ctx_destroy(ctx);
    return tu_finish();
}
