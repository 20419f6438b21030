/* SPDX-License-Identifier: MIT */
/*
 * test_capture_views.c -- views against index arithmetic done here: reshape
 * and view (with and without copies), permute, transpose, slice, narrow,
 * expand, squeeze/unsqueeze, contiguous and clone, on every dtype; host
 * transfer through strided views; use after release; and, compiled, the
 * permute copies of attention (heads split out of a QKV row at an offset,
 * (B,H,T,D) <-> (B,T,H,D), a copy_ into a slice of a cache) with
 * broadcasts along outer and inner dims and odd head sizes, whose
 * generated kernels walk 16-byte vectors along D where the layout allows.
 */
#include "testutil.h"

#include <math.h>
#include <string.h>

static sg_ctx *ctx;

/* Check t's values (row-major) equal ref exactly. */
static bool same(const sg_tensor *t, const double *ref, int64_t n) {
    double *got = tu_read(t);
    bool ok = got && sg_tensor_numel(t) == n && tu_close("values", got, ref, n, 0, 0);
    free(got);
    return ok;
}

static void test_permute_transpose(sg_dtype dt) {
    int64_t shape[3] = {2, 3, 4};
    double *v;
    sg_tensor *x = tu_rand(ctx, dt, 3, shape, -4, 4, &v);
    int perm[3] = {2, 0, 1};
    sg_tensor *p = sg_permute(x, perm);
    double ref[24];
    for (int k = 0; k < 4; k++)
        for (int i = 0; i < 2; i++)
            for (int j = 0; j < 3; j++) ref[(k * 2 + i) * 3 + j] = v[(i * 3 + j) * 4 + k];
    bool ok = TU_EXPECT(p && !sg_tensor_is_contiguous(p)) && TU_EXPECT(sg_tensor_size(p, 0) == 4) &&
              TU_EXPECT(same(p, ref, 24));
    sg_tensor *tr = sg_transpose(x, -1, 0); /* (4,3,2) */
    for (int k = 0; k < 4; k++)
        for (int j = 0; j < 3; j++)
            for (int i = 0; i < 2; i++) ref[(k * 3 + j) * 2 + i] = v[(i * 3 + j) * 4 + k];
    ok = ok && TU_EXPECT(same(tr, ref, 24));
    /* A contiguous copy of the transpose reads the same. */
    sg_tensor *c = sg_contiguous(tr);
    ok = ok && TU_EXPECT(c && sg_tensor_is_contiguous(c)) && TU_EXPECT(same(c, ref, 24));
    tu_case(ok, "PERMUTE_TRANSPOSE(type=%s,x=[2,3,4])", sg_dtype_name(dt));
    sg_release(x), sg_release(p), sg_release(tr), sg_release(c);
    free(v);
}

static void test_slice_narrow(sg_dtype dt) {
    int64_t shape[2] = {5, 7};
    double *v;
    sg_tensor *x = tu_rand(ctx, dt, 2, shape, -9, 9, &v);
    sg_tensor *s = sg_slice(x, 1, 1, -1, 2); /* cols 1,3,5 */
    sg_tensor *nr = sg_narrow(x, 0, 2, 3);   /* rows 2..4 */
    sg_tensor *e = sg_slice(x, 0, 3, 3, 1);  /* empty */
    double ref[35];
    for (int i = 0; i < 5; i++)
        for (int j = 0; j < 3; j++) ref[i * 3 + j] = v[i * 7 + 1 + 2 * j];
    bool ok = TU_EXPECT(s && sg_tensor_size(s, 1) == 3) && TU_EXPECT(same(s, ref, 15));
    ok = ok && TU_EXPECT(nr && same(nr, v + 14, 21));
    ok = ok && TU_EXPECT(e && sg_tensor_numel(e) == 0 && sg_tensor_size(e, 0) == 0);
    tu_case(ok, "SLICE_NARROW(type=%s,x=[5,7])", sg_dtype_name(dt));
    sg_release(x), sg_release(s), sg_release(nr), sg_release(e);
    free(v);
}

static void test_reshape_view(sg_dtype dt) {
    int64_t shape[3] = {2, 3, 4};
    double *v;
    sg_tensor *x = tu_rand(ctx, dt, 3, shape, -4, 4, &v);
    int64_t s2[2] = {6, -1};
    sg_tensor *r = sg_view(x, 2, s2);
    bool ok = TU_EXPECT(r && sg_tensor_size(r, 1) == 4) && TU_EXPECT(same(r, v, 24));
    /* Splitting a dim of a transposed tensor is still a view... */
    sg_tensor *t = sg_transpose(x, 0, 2); /* (4,3,2) */
    int64_t s4[4] = {2, 2, 3, 2};
    sg_tensor *tv = sg_view(t, 4, s4);
    double ref[24];
    for (int k = 0; k < 4; k++)
        for (int j = 0; j < 3; j++)
            for (int i = 0; i < 2; i++) ref[(k * 3 + j) * 2 + i] = v[(i * 3 + j) * 4 + k];
    ok = ok && TU_EXPECT(tv != NULL) && TU_EXPECT(same(tv, ref, 24));
    /* ...but merging its dims is not: view fails, reshape copies. */
    int64_t flat[1] = {24};
    sg_tensor *bad = sg_view(t, 1, flat);
    ok = ok && TU_EXPECT(bad == NULL && sg_ctx_status(ctx) == SG_ERR_SHAPE) &&
         TU_EXPECT(strstr(sg_last_error(ctx), "sg_reshape") != NULL);
    sg_clear_error(ctx);
    sg_tensor *rf = sg_reshape(t, 1, flat);
    ok = ok && TU_EXPECT(rf && same(rf, ref, 24));
    int64_t wrong[2] = {5, 5};
    ok = ok && TU_EXPECT(sg_reshape(x, 2, wrong) == NULL && sg_ctx_status(ctx) == SG_ERR_SHAPE);
    sg_clear_error(ctx);
    tu_case(ok, "RESHAPE_VIEW(type=%s,x=[2,3,4])", sg_dtype_name(dt));
    sg_release(x), sg_release(r), sg_release(t), sg_release(tv), sg_release(rf);
    free(v);
}

static void test_expand_squeeze(sg_dtype dt) {
    int64_t shape[2] = {3, 1};
    double *v;
    sg_tensor *x = tu_rand(ctx, dt, 2, shape, -4, 4, &v);
    int64_t es[3] = {2, 3, 4};
    sg_tensor *e = sg_expand(x, 3, es);
    double ref[24];
    for (int a = 0; a < 2; a++)
        for (int i = 0; i < 3; i++)
            for (int j = 0; j < 4; j++) ref[(a * 3 + i) * 4 + j] = v[i];
    bool ok = TU_EXPECT(e && sg_tensor_stride(e, 0) == 0) && TU_EXPECT(same(e, ref, 24));
    sg_tensor *s = sg_squeeze(x, 1), *u = sg_unsqueeze(s, 0);
    ok = ok && TU_EXPECT(s && sg_tensor_ndim(s) == 1 && same(s, v, 3));
    ok = ok && TU_EXPECT(u && sg_tensor_ndim(u) == 2 && sg_tensor_size(u, 0) == 1 && same(u, v, 3));
    int64_t bad[2] = {3, 2};
    sg_tensor *be = sg_expand(e, 2, bad);
    ok = ok && TU_EXPECT(be == NULL && sg_ctx_status(ctx) == SG_ERR_SHAPE);
    sg_clear_error(ctx);
    tu_case(ok, "EXPAND_SQUEEZE(type=%s,x=[3,1])", sg_dtype_name(dt));
    sg_release(x), sg_release(e), sg_release(s), sg_release(u);
    free(v);
}

/* Writing through a strided view lands in the right base elements. */
static void test_strided_write(sg_dtype dt) {
    int64_t shape[2] = {4, 6};
    sg_tensor *x = sg_zeros(ctx, dt, 2, shape);
    sg_tensor *s = sg_slice(x, 1, 0, 6, 3); /* (4,2): cols 0 and 3 */
    double vals[8], ref[24] = {0};
    unsigned char buf[64];
    for (int i = 0; i < 8; i++) {
        vals[i] = dt == SG_BOOL ? 1 : i + 1;
        tu_store(buf, dt, i, vals[i]);
        ref[(i / 2) * 6 + (i % 2) * 3] = vals[i];
    }
    bool ok = TU_EXPECT(sg_write(s, buf, 8 * sg_dtype_size(dt)) == SG_OK) &&
              TU_EXPECT(same(x, ref, 24)) && TU_EXPECT(same(s, vals, 8));
    ok = ok && TU_EXPECT(sg_write(s, buf, 3) == SG_ERR_INVALID_ARG);
    sg_clear_error(ctx);
    tu_case(ok, "STRIDED_WRITE(type=%s,x=[4,6],view=slice(1,0,6,3))", sg_dtype_name(dt));
    sg_release(x), sg_release(s);
}

static void test_release(void) {
    int64_t shape[1] = {4};
    sg_tensor *x = sg_full(ctx, SG_F32, 1, shape, 2.5);
    sg_tensor *v = sg_slice(x, 0, 1, 3, 1);
    sg_release(x); /* the view keeps the bytes alive */
    double got[2] = {0};
    float buf[2];
    bool ok = TU_EXPECT(sg_read(v, buf, sizeof buf) == SG_OK);
    got[0] = buf[0], got[1] = buf[1];
    double ref[2] = {2.5, 2.5};
    ok = ok && TU_EXPECT(tu_close("view", got, ref, 2, 0, 0));
    ok = ok && TU_EXPECT(sg_read(x, buf, 16) == SG_ERR_RELEASED) &&
         TU_EXPECT(strstr(sg_last_error(ctx), "released") != NULL);
    sg_clear_error(ctx);
    ok = ok && TU_EXPECT(sg_neg(x) == NULL && sg_ctx_status(ctx) == SG_ERR_RELEASED);
    sg_clear_error(ctx);
    sg_release(x); /* twice is harmless */
    sg_release(v);
    tu_case(ok, "RELEASE(use after release is SG_ERR_RELEASED)");
}

/* ------------------------------------------------------------ compiled permute copies */

typedef struct permcopy {
    int64_t b, h, t, d;
    sg_tensor *cache; /* [b, h, t + 3, d]: rows 2 .. t + 1 are written */
} permcopy;

/* Inputs: x [b,h,t,d], qkv [b,t,3*h*d], bias [d], gate [b,t,h,1], y [b,h,t,d]. */
static sg_status permcopy_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    const permcopy *p = user;
    int64_t hd = p->h * p->d, heads[4] = {p->b, p->t, p->h, p->d};
    sg_tensor *xt = sg_transpose(in[0], 1, 2); /* (b,t,h,d) */
    out[0] = sg_contiguous(xt);
    /* Heads out of the middle third of a QKV row (offset h*d), and at offset 1. */
    out[1] = sg_contiguous(sg_transpose(sg_reshape(sg_narrow(in[1], 2, hd, hd), 4, heads), 1, 2));
    out[2] = sg_contiguous(sg_transpose(sg_reshape(sg_narrow(in[1], 2, 1, hd), 4, heads), 1, 2));
    out[3] = sg_add(xt, in[2]);                        /* broadcast along the outer dims */
    out[4] = sg_mul(sg_transpose(in[4], 1, 2), in[3]); /* broadcast along d */
    sg_tensor *v = sg_transpose(sg_reshape(sg_narrow(in[1], 2, 2 * hd, hd), 4, heads), 1, 2);
    sg_status s = sg_copy_(sg_narrow(p->cache, 2, 2, p->t), v);
    return s != SG_OK ? s : sg_ctx_status(c);
}

static void test_permute_copies(sg_dtype dt, int64_t d) {
    permcopy p = {2, 3, 5, d, NULL};
    int64_t b = p.b, h = p.h, t = p.t, tc = t + 3, hd = h * d, n = b * h * t * d;
    int64_t sx[4] = {b, h, t, d}, sq[3] = {b, t, 3 * hd}, sg[4] = {b, t, h, 1}, sc[4] = {b, h, tc, d};
    double *xv, *qv, *bv, *gv, *yv, *cv;
    sg_tensor *in[5] = {tu_rand(ctx, dt, 4, sx, -4, 4, &xv), tu_rand(ctx, dt, 3, sq, -4, 4, &qv),
                        tu_rand(ctx, dt, 1, &d, -4, 4, &bv), tu_rand(ctx, dt, 4, sg, -2, 2, &gv),
                        tu_rand(ctx, dt, 4, sx, -4, 4, &yv)};
    p.cache = tu_rand(ctx, dt, 4, sc, -4, 4, &cv);
    double *ref[5], *cref = malloc(sizeof(double) * (size_t)(b * h * tc * d));
    for (int k = 0; k < 5; k++) ref[k] = malloc(sizeof(double) * (size_t)n);
    memcpy(cref, cv, sizeof(double) * (size_t)(b * h * tc * d));
    for (int64_t i = 0; i < b; i++)
        for (int64_t j = 0; j < h; j++)
            for (int64_t k = 0; k < t; k++)
                for (int64_t e = 0; e < d; e++) {
                    int64_t bhtd = ((i * h + j) * t + k) * d + e, bthd = ((i * t + k) * h + j) * d + e;
                    int64_t row = (i * t + k) * 3 * hd + j * d + e;
                    ref[0][bthd] = xv[bhtd];
                    ref[1][bhtd] = qv[row + hd];
                    ref[2][bhtd] = qv[row + 1];
                    ref[3][bthd] = tu_round(dt, xv[bhtd] + bv[e]);
                    ref[4][bthd] = tu_round(dt, yv[bhtd] * gv[(i * t + k) * h + j]);
                    cref[((i * h + j) * tc + k + 2) * d + e] = qv[row + 2 * hd];
                }
    sg_fn *fn = NULL;
    bool ok = TU_EXPECT(sg_compile(ctx, permcopy_step, &p, 5, 5,
                                   &(sg_compile_opts){.mode = SG_MODE_REDUCE_OVERHEAD}, &fn) == SG_OK);
    for (int call = 0; ok && call < 2; call++) { /* the capture, then a replay */
        sg_tensor *out[5] = {NULL};
        sg_mark_step_begin(ctx);
        ok = TU_EXPECT(sg_call(fn, in, 5, out, 5) == SG_OK);
        if (!ok) fprintf(stderr, "  %s\n", sg_last_error(ctx));
        for (int k = 0; ok && k < 3; k++) ok = TU_EXPECT(same(out[k], ref[k], n));
        for (int k = 3; ok && k < 5; k++) { /* computed: one rounding, maybe two */
            double *got = tu_read(out[k]);
            ok = TU_EXPECT(got && tu_close("computed", got, ref[k], n, tu_rtol(dt), tu_atol(dt)));
            free(got);
        }
        ok = ok && TU_EXPECT(same(p.cache, cref, b * h * tc * d));
    }
    tu_case(ok,
            "PERMUTE_COPIES(type=%s,x=[%lld,%lld,%lld,%lld],compiled: transpose, QKV split at "
            "offsets %lld and 1, outer and inner broadcasts, copy_ into a cache slice)",
            sg_dtype_name(dt), (long long)b, (long long)h, (long long)t, (long long)d,
            (long long)hd);
    sg_fn_destroy(fn);
    for (int k = 0; k < 5; k++) sg_release(in[k]), free(ref[k]);
    sg_release(p.cache);
    free(xv), free(qv), free(bv), free(gv), free(yv), free(cv), free(cref);
}

int main(void) {
    ctx = tu_ctx((sg_ctx_opts){0});
    tu_seed(1);
    for (sg_dtype dt = SG_F32; dt <= SG_BOOL; dt++) {
        test_permute_transpose(dt);
        test_slice_narrow(dt);
        test_reshape_view(dt);
        test_expand_squeeze(dt);
        test_strided_write(dt);
    }
    test_release();
    /* Head sizes: 64 and 24 (16-byte vectors), 6 (4-byte), 7 (no vectors). */
    static const int64_t heads[4] = {64, 24, 6, 7};
    for (sg_dtype dt = SG_F32; dt <= SG_BF16; dt++)
        for (int k = 0; k < 4; k++) test_permute_copies(dt, heads[k]);
    sg_ctx_destroy(ctx);
    return tu_finish();
}
