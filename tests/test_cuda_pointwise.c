/* SPDX-License-Identifier: MIT */
/*
 * test_cuda_pointwise.c -- the paths of the CUDA pointwise and data kernels
 * that the op tests reach only by chance (test_codegen_nvrtc compiles both
 * units, with every kernel present, without a GPU): on a device, the
 * 16-byte vectorized path (every dtype, tails, more elements
 * than one grid covers), its fallbacks (an unaligned start, strided,
 * permuted and broadcast operands, 6 dims), 64-bit offsets, and data ops at
 * sizes of real models; each against an f64 reference computed here.
 * Without a CUDA device it exits 77.
 */
#define _POSIX_C_SOURCE 200809L
#include "codegen/codegen.h"
#include "graphs/cuda/exec.h"
#include "testutil.h"

#include <math.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static sg_ctx *ctx;

static int64_t prod(int nd, const int64_t *s) {
    int64_t p = 1;
    for (int d = 0; d < nd; d++) p *= s[d];
    return p;
}

/* ------------------------------------------------------------ pointwise */

static double gelu(double x) { return 0.5 * x * erfc(-x / sqrt(2.0)); }

/* y = op(a, b) on the device against f64, for the op tests below. */
enum { ADD, MUL, GELU, CAST, LT, NOT };

static double ref_op(int op, double a, double b) {
    switch (op) {
    case ADD: return a + b;
    case MUL: return a * b;
    case GELU: return gelu(a);
    case CAST: return a;
    case LT: return a < b;
    default: return a == 0;
    }
}

static sg_tensor *run_op(int op, sg_tensor *a, sg_tensor *b, sg_dtype to) {
    switch (op) {
    case ADD: return sg_add(a, b);
    case MUL: return sg_mul(a, b);
    case GELU: return sg_gelu(a);
    case CAST: return sg_cast(a, to);
    case LT: return sg_lt(a, b);
    default: return sg_logical_not(a);
    }
}

static const char *op_name(int op) {
    static const char *const names[] = {"ADD", "MUL", "GELU", "CAST", "LT", "NOT"};
    return names[op];
}

/*
 * One case: a (shape sa, layout la) and b (shape sb) broadcast to the output;
 * `to` is the output dtype of a cast. Integer results must match exactly
 * (the reference wraps nothing: values stay small).
 */
static void pw_case(int op, sg_dtype dt, int na, const int64_t *sa, tu_layout la, int nb,
                    const int64_t *sb, sg_dtype to) {
    double *av, *bv = NULL;
    bool unary = op == GELU || op == CAST || op == NOT;
    double lo = dt == SG_BOOL ? 0 : -8, hi = dt == SG_BOOL ? 1 : 8;
    sg_tensor *a = tu_rand_layout(ctx, dt, na, sa, lo, hi, la, &av);
    sg_tensor *b = unary ? NULL : tu_rand(ctx, dt, nb, sb, lo, hi, &bv);
    sg_tensor *y = run_op(op, a, b, to);
    bool ok = TU_EXPECT(y != NULL);
    int nd = na;
    int64_t so[SG_MAX_DIMS];
    memcpy(so, sa, sizeof(int64_t) * (size_t)na);
    if (!unary) { /* the broadcast shape, right-aligned */
        nd = na > nb ? na : nb;
        for (int d = 0; d < nd; d++) {
            int ia = d - (nd - na), ib = d - (nd - nb);
            int64_t x = ia < 0 ? 1 : sa[ia], z = ib < 0 ? 1 : sb[ib];
            so[d] = x == 1 ? z : x;
        }
    }
    int64_t n = prod(nd, so);
    double *got = ok ? tu_read(y) : NULL, *ref = malloc((size_t)(n + 1) * sizeof(double));
    sg_dtype dy = y ? sg_tensor_dtype(y) : dt;
    for (int64_t i = 0; ok && i < n; i++) {
        int64_t rem = i, ia = 0, ib = 0, ma = 1, mb = 1;
        for (int d = nd - 1; d >= 0; d--) { /* element i's place in a and b */
            int64_t c = rem % so[d];
            rem /= so[d];
            int da = d - (nd - na), db = d - (nd - nb);
            if (da >= 0) ia += (sa[da] == 1 ? 0 : c) * ma, ma *= sa[da];
            if (!unary && db >= 0) ib += (sb[db] == 1 ? 0 : c) * mb, mb *= sb[db];
        }
        ref[i] = tu_round(dy, ref_op(op, av[ia], unary ? 0 : bv[ib]));
    }
    ok = ok && TU_EXPECT(got != NULL) &&
         tu_close("y", got, ref, n, tu_rtol(dy), sg__dtype_is_float(dy) ? tu_atol(dy) : 0);
    if (!y) fprintf(stderr, "  %s\n", sg_last_error(ctx));
    char s1[64], s2[64];
    tu_case(ok, "%s(type=%s,to=%s,a=%s,b=%s,view=%s,n=%lld)", op_name(op), sg_dtype_name(dt),
            sg_dtype_name(dy), tu_shape(na, sa, s1, sizeof s1),
            unary ? "-" : tu_shape(nb, sb, s2, sizeof s2), tu_layout_name(la), (long long)n);
    sg_clear_error(ctx);
    sg_release(a), sg_release(b), sg_release(y);
    free(av), free(bv), free(got), free(ref);
}

static void test_vectorized(void) {
    /* 8 (one chunk), a tail, and more chunks than one grid of 8 blocks per SM covers. */
    static const int64_t sizes[] = {8, 1003, 3000017};
    static const sg_dtype all[] = {SG_F32, SG_F16, SG_BF16, SG_I32, SG_I64};
    for (int s = 0; s < 3; s++) {
        int64_t n[1] = {sizes[s]}, one[1] = {1};
        for (int k = 0; k < 5; k++) {
            pw_case(ADD, all[k], 1, n, TU_CONTIG, 1, n, all[k]);
            pw_case(LT, all[k], 1, n, TU_CONTIG, 1, n, SG_BOOL);
            pw_case(MUL, all[k], 1, n, TU_CONTIG, 1, one, all[k]); /* a broadcast scalar */
            if (k < 3) pw_case(GELU, all[k], 1, n, TU_CONTIG, 0, NULL, all[k]);
        }
        pw_case(CAST, SG_F32, 1, n, TU_CONTIG, 0, NULL, SG_F16);
        pw_case(CAST, SG_F32, 1, n, TU_CONTIG, 0, NULL, SG_I64);
        pw_case(CAST, SG_I32, 1, n, TU_CONTIG, 0, NULL, SG_BF16);
        pw_case(CAST, SG_BF16, 1, n, TU_CONTIG, 0, NULL, SG_F32);
        pw_case(NOT, SG_BOOL, 1, n, TU_CONTIG, 0, NULL, SG_BOOL);
        pw_case(CAST, SG_BOOL, 1, n, TU_CONTIG, 0, NULL, SG_F32);
    }
}

static void test_layouts(void) {
    int64_t s3[3] = {37, 41, 43}, col[2] = {1001, 1}, row[2] = {1, 517};
    int64_t s6[6] = {2, 3, 1, 4, 5, 6}, b6[6] = {3, 1, 4, 1, 6};
    int64_t big[2] = {1500, 2001};
    for (int k = 0; k < 3; k++) {
        sg_dtype dt = k == 0 ? SG_F32 : k == 1 ? SG_BF16 : SG_I32;
        pw_case(ADD, dt, 3, s3, TU_PERMUTED, 3, s3, dt);
        pw_case(ADD, dt, 3, s3, TU_SLICED, 1, s3 + 2, dt);
        pw_case(MUL, dt, 2, col, TU_CONTIG, 2, row, dt);
        pw_case(ADD, dt, 6, s6, TU_PERMUTED, 5, b6, dt);
        pw_case(CAST, dt, 2, big, TU_SLICED, 0, NULL, SG_F16);
    }
    /* An unaligned start: one element into a contiguous base. */
    int64_t n[1] = {100001};
    sg_tensor *base = sg_arange(ctx, SG_F32, 0, 100002, 1);
    sg_tensor *x = sg_narrow(base, 0, 1, n[0]);
    sg_tensor *y = sg_add_scalar(x, 0.5);
    double *got = y ? tu_read(y) : NULL;
    bool ok = TU_EXPECT(got != NULL);
    for (int64_t i = 0; ok && i < n[0]; i++) ok = TU_EXPECT(got[i] == (double)(i + 1) + 0.5);
    tu_case(ok, "ADD_SCALAR(type=f32,x=[100001],view=offset 1 element,unaligned)");
    sg_release(base), sg_release(x), sg_release(y);
    free(got);
}

/* Offsets past 2^30 elements: a strided view over a 1.6 GB bool tensor. */
static void test_offsets_64(void) {
    const int64_t M = ((int64_t)1 << 29) + 64;
    int64_t bs[2] = {3, M};
    sg_tensor *base = sg_zeros(ctx, SG_BOOL, 2, bs);
    if (!base) {
        printf("skip OFFSETS_64: %s\n", sg_last_error(ctx));
        sg_clear_error(ctx);
        return;
    }
    sg_tensor *v = sg_slice(base, 1, 3, M, M / 5); /* [3, 5] with strides [M, M/5] */
    unsigned char src[15] = {1, 0, 1, 1, 0, 0, 1, 0, 1, 1, 1, 1, 0, 0, 1};
    int64_t ss[2] = {3, 5};
    sg_tensor *s = sg_from_host(ctx, SG_BOOL, 2, ss, src);
    bool ok = TU_EXPECT(v != NULL) && TU_EXPECT(sg_copy_(v, s) == SG_OK);
    sg_tensor *y = ok ? sg_cast(v, SG_I32) : NULL, *z = ok ? sg_logical_not(v) : NULL;
    int32_t yi[15] = {0};
    unsigned char zb[15] = {0};
    ok = ok && TU_EXPECT(sg_read(y, yi, sizeof yi) == SG_OK) &&
         TU_EXPECT(sg_read(z, zb, sizeof zb) == SG_OK);
    for (int i = 0; ok && i < 15; i++) ok = TU_EXPECT(yi[i] == src[i] && zb[i] == !src[i]);
    /* The neighbours of the written elements stay zero. */
    sg_tensor *w = ok ? sg_slice(base, 1, 4, M, M / 5) : NULL;
    sg_tensor *any = w ? sg_cast(w, SG_I32) : NULL;
    int32_t wi[15] = {1};
    ok = ok && TU_EXPECT(sg_read(any, wi, sizeof wi) == SG_OK);
    for (int i = 0; ok && i < 15; i++) ok = TU_EXPECT(wi[i] == 0);
    if (!ok) fprintf(stderr, "  %s\n", sg_last_error(ctx));
    tu_case(ok, "COPY+CAST+NOT(type=bool,base=[3,%lld],view=[3,5] strides [%lld,%lld])",
            (long long)M, (long long)M, (long long)(M / 5));
    sg_clear_error(ctx);
    sg_release(base), sg_release(v), sg_release(s), sg_release(y), sg_release(z);
    sg_release(w), sg_release(any);
}

/* ------------------------------------------------------------ data */

static sg_tensor *indices(sg_dtype dt, int64_t n, int64_t limit, int64_t **vals) {
    int64_t *v = malloc((size_t)(n + 1) * sizeof(int64_t));
    void *buf = malloc((size_t)(n + 1) * 8);
    for (int64_t i = 0; i < n; i++) {
        v[i] = tu_randint(0, limit - 1);
        if (dt == SG_I32)
            ((int32_t *)buf)[i] = (int32_t)v[i];
        else
            ((int64_t *)buf)[i] = v[i];
    }
    int64_t s[1] = {n};
    sg_tensor *t = sg_from_host(ctx, dt, 1, s, buf);
    free(buf);
    *vals = v;
    return t;
}

static void test_data(void) {
    /* Embedding at GPT-2's size: 50257 x 768 f16, 4096 tokens. */
    int64_t ws[2] = {50257, 768};
    double *wv;
    int64_t *iv;
    sg_tensor *w = tu_rand(ctx, SG_F16, 2, ws, -1, 1, &wv);
    sg_tensor *idx = indices(SG_I32, 4096, ws[0], &iv);
    sg_tensor *e = sg_embedding(w, idx);
    double *got = e ? tu_read(e) : NULL;
    bool ok = TU_EXPECT(got != NULL);
    for (int64_t r = 0; ok && r < 4096; r++)
        for (int64_t c = 0; ok && c < ws[1]; c++)
            ok = TU_EXPECT(got[r * ws[1] + c] == wv[iv[r] * ws[1] + c]);
    tu_case(ok, "EMBEDDING(type=f16,weight=[50257,768],idx=i32[4096])");
    free(got);

    /* index_select along dim 1 of a transposed view. */
    int dims[2] = {1, 0};
    sg_tensor *wt = sg_permute(w, dims); /* [768, 50257] */
    int64_t *jv;
    sg_tensor *jdx = indices(SG_I64, 333, ws[0], &jv);
    sg_tensor *sel = sg_index_select(wt, 1, jdx);
    got = sel ? tu_read(sel) : NULL;
    ok = TU_EXPECT(got != NULL);
    for (int64_t r = 0; ok && r < ws[1]; r++)
        for (int64_t j = 0; ok && j < 333; j++)
            ok = TU_EXPECT(got[r * 333 + j] == wv[jv[j] * ws[1] + r]);
    tu_case(ok, "INDEX_SELECT(type=f16,x=[768,50257] view=permuted,dim=1,idx=i64[333])");
    free(got);

    /* index_copy_ with many repeated indices: the last of each wins. */
    int64_t ds[2] = {1000, 257}, ss[2] = {20000, 257};
    double *dv, *sv;
    int64_t *kv;
    sg_tensor *dst = tu_rand(ctx, SG_F32, 2, ds, -1, 1, &dv);
    sg_tensor *src = tu_rand(ctx, SG_F32, 2, ss, -1, 1, &sv);
    sg_tensor *kdx = indices(SG_I64, ss[0], ds[0], &kv);
    ok = TU_EXPECT(sg_index_copy_(dst, 0, kdx, src) == SG_OK);
    for (int64_t i = 0; i < ss[0]; i++)
        memcpy(dv + kv[i] * ds[1], sv + i * ss[1], sizeof(double) * (size_t)ds[1]);
    got = ok ? tu_read(dst) : NULL;
    ok = ok && TU_EXPECT(got != NULL) && tu_close("dst", got, dv, ds[0] * ds[1], 0, 0);
    tu_case(ok, "INDEX_COPY(type=f32,dst=[1000,257],src=[20000,257],dim=0,repeats)");
    free(got);

    /* Bad indices fail the call and leave dst as it was. */
    int64_t bad[1] = {ds[0]}, one[1] = {1}, row[2] = {1, 257};
    sg_tensor *bi = sg_from_host(ctx, SG_I64, 1, one, bad), *src1 = sg_zeros(ctx, SG_F32, 2, row);
    ok = TU_EXPECT(sg_index_copy_(dst, 0, bi, src1) == SG_ERR_INDEX) &&
         TU_EXPECT(strstr(sg_last_error(ctx), "out of range") != NULL);
    sg_clear_error(ctx);
    got = tu_read(dst);
    ok = ok && TU_EXPECT(got != NULL) && tu_close("dst", got, dv, ds[0] * ds[1], 0, 0);
    tu_case(ok, "INDEX_COPY_BAD(idx=[1000] for dst dim 0 of 1000 is SG_ERR_INDEX, dst kept)");
    free(got);

    /* concat of three, the middle one every other row of w (strided). */
    sg_tensor *c0 = sg_narrow(w, 0, 7, 300), *c1 = sg_slice(w, 0, 0, 2000, 2);
    sg_tensor *cs[3] = {c0, c1, c0};
    sg_tensor *cat = sg_concat(3, cs, 0);
    got = cat ? tu_read(cat) : NULL;
    ok = TU_EXPECT(got != NULL);
    for (int64_t r = 0; ok && r < 1600; r++) {
        int64_t wr = r < 300 ? r + 7 : r < 1300 ? 2 * (r - 300) : r - 1300 + 7;
        for (int64_t c = 0; ok && c < ws[1]; c++)
            ok = TU_EXPECT(got[r * ws[1] + c] == wv[wr * ws[1] + c]);
    }
    tu_case(ok, "CONCAT(type=f16,[300,768]+[1000,768] strided+[300,768],dim=0)");
    free(got);

    static const sg_dtype ad[] = {SG_F32, SG_BF16, SG_I64};
    for (int k = 0; k < 3; k++) {
        sg_tensor *r = sg_arange(ctx, ad[k], -5, 3000000 * 0.25 - 5, 0.25);
        got = r ? tu_read(r) : NULL;
        ok = TU_EXPECT(got != NULL) && TU_EXPECT(sg_tensor_numel(r) == 3000000);
        for (int64_t i = 0; ok && i < 3000000; i++) {
            double v = -5 + (double)i * 0.25;
            ok = TU_EXPECT(got[i] == (ad[k] == SG_I64 ? trunc(v) : tu_round(ad[k], (float)v)));
        }
        tu_case(ok, "ARANGE(type=%s,start=-5,step=0.25,n=3000000)", sg_dtype_name(ad[k]));
        free(got);
        sg_release(r);
    }
    sg_clear_error(ctx);
    sg_release(w), sg_release(idx), sg_release(e), sg_release(wt), sg_release(jdx);
    sg_release(sel), sg_release(dst), sg_release(src), sg_release(kdx), sg_release(bi);
    sg_release(src1), sg_release(c0), sg_release(c1), sg_release(cat);
    free(wv), free(iv), free(jv), free(dv), free(sv), free(kv);
}

/* ------------------------------------------------------------ in a graph */

/* A KV-cache update: cache[:, pos[i], :] = kv[:, i, :], then read the cache. */
static sg_status kv_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    sg_tensor *cache = user;
    sg_status s = sg_index_copy_(cache, 1, in[0], in[1]);
    out[0] = s == SG_OK ? sg_mul_scalar(cache, 1.0) : NULL;
    return out[0] ? SG_OK : sg_ctx_status(c);
}

/* index_copy_ replayed from a CUDA graph (its recorded path scans for
 * repeated indices itself): three positions a call, the first repeated as
 * the third, so the third write must win. */
static void test_index_copy_graph(void) {
    int64_t cs[3] = {2, 16, 8}, ks[3] = {2, 3, 8}, ps[1] = {3};
    sg_tensor *cache = sg_zeros(ctx, SG_F32, 3, cs);
    double ref[2 * 16 * 8] = {0};
    sg_fn *fn = NULL;
    bool ok =
        TU_EXPECT(sg_compile(ctx, kv_step, cache, 2, 1,
                             &(sg_compile_opts){.mode = SG_MODE_REDUCE_OVERHEAD}, &fn) == SG_OK);
    for (int call = 0; ok && call < 6; call++) {
        int64_t p = (call * 5) % 15, pos[3] = {p, p + 1, p};
        double *kv;
        sg_tensor *k = tu_rand(ctx, SG_F32, 3, ks, -1, 1, &kv);
        sg_tensor *pt = sg_from_host(ctx, SG_I64, 1, ps, pos), *in[2] = {pt, k}, *y = NULL;
        for (int b = 0; b < 2; b++)
            for (int i = 0; i < 3; i++)
                for (int d = 0; d < 8; d++)
                    ref[(b * 16 + pos[i]) * 8 + d] = kv[(b * 3 + i) * 8 + d];
        ok = TU_EXPECT(sg_mark_step_begin(ctx) == SG_OK) &&
             TU_EXPECT(sg_call(fn, in, 2, &y, 1) == SG_OK);
        double *got = ok ? tu_read(y) : NULL;
        ok = ok && TU_EXPECT(got != NULL) && tu_close("cache", got, ref, 2 * 16 * 8, 0, 0);
        if (!ok) fprintf(stderr, "  call %d: %s\n", call, sg_last_error(ctx));
        sg_release(k), sg_release(pt);
        free(kv), free(got);
    }
    tu_case(ok, "INDEX_COPY_GRAPH(type=f32,cache=[2,16,8],dim=1,idx=[p,p+1,p],6 calls,"
                "reduce-overhead)");
    sg_clear_error(ctx);
    sg_fn_destroy(fn);
    sg_release(cache);
}

int main(void) {
    sg_status s = sg_ctx_create(&(sg_ctx_opts){.backend = SG_BACKEND_CUDA}, &ctx);
    if (s == SG_ERR_BACKEND_UNAVAILABLE) {
        printf("skipped the device part: %s\n", sg_last_error(NULL));
        int rc = tu_finish();
        return rc == 0 ? 77 : 1;
    }
    if (s != SG_OK) {
        fprintf(stderr, "sg_ctx_create(cuda): %s: %s\n", sg_status_str(s), sg_last_error(NULL));
        return 1;
    }
    tu_seed(11);
    test_vectorized();
    test_layouts();
    test_offsets_64();
    test_data();
    test_index_copy_graph();
    sg_ctx_destroy(ctx);
    return tu_finish();
}
