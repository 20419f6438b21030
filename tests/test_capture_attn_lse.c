/* SPDX-License-Identifier: MIT */
/*
 * test_capture_attn_lse.c -- the row logsumexps that attention keeps for its
 * backward (SG__ATTN_LSE, capture.h). With q, k and v needing gradients
 * (eager), the result of sg_sdpa / sg_sdpa_cached is a view of a packed
 * output whose tail holds each row's logsumexp of its scaled, masked
 * scores: checked against an f64 reference (+inf for a row that sees no
 * key) wherever the backend's path keeps them (every path on the CPU, the
 * flash kernels on CUDA; the others fill NaN). The backward reads them: with
 * every kept logsumexp raised by ln 2 (each P halved) dv comes out halved;
 * with them all NaN (not kept) it recomputes them and the gradients agree
 * with the kept ones within the dtype's tolerance (the count of differing
 * bits is printed). Without gradients the result is bit for bit the same
 * and its storage holds the result alone; a compiled inference step's
 * attention writes the 4-d result, a compiled training step's the packed
 * one, and both give the eager bits. Cases: causal and not, bool and float
 * masks, grouped K/V heads, kv_len, Lq and S not multiples of 64, f32, bf16
 * and f16, D 16 to 128 (64 and 128 with 16-bit types: the flash kernels).
 */
#include "capture/capture.h"
#include "testutil.h"

#include <math.h>
#include <string.h>

static sg_ctx *ctx;

typedef struct lcase {
    sg_dtype dt;
    int64_t B, Hq, Hkv, Lq, S, D;
    bool causal;
    int mask;    /* 0 none, 1 bool (B, 1, Lq, S), 2 float (Lq, S) */
    bool cached; /* sg_sdpa_cached, kv_len (B) in [Lq, S] */
} lcase;

typedef struct made {
    sg_tensor *x[3], *mask, *len, *r;
    double *xv[3], *mv, *rv;
    int64_t lens[8];
} made;

static void make(const lcase *c, uint64_t seed, made *m) {
    memset(m, 0, sizeof *m);
    tu_seed(seed);
    int64_t qs[4] = {c->B, c->Hq, c->Lq, c->D}, ks[4] = {c->B, c->Hkv, c->S, c->D};
    for (int k = 0; k < 3; k++) {
        m->x[k] = tu_rand(ctx, c->dt, 4, k ? ks : qs, -1.5, 1.5, &m->xv[k]);
        sg_requires_grad_(m->x[k], true);
    }
    if (c->mask == 1) { /* every row keeps key 0 but for the last row of batch 0 (sees none) */
        int64_t ms[4] = {c->B, 1, c->Lq, c->S}, n = c->B * c->Lq * c->S;
        sg_tensor *t = tu_rand(ctx, SG_F32, 4, ms, 0, 1, &m->mv);
        sg_release(t);
        uint8_t *host = malloc((size_t)n);
        for (int64_t i = 0; i < n; i++) {
            int64_t row = i / c->S, j = i % c->S;
            m->mv[i] = row == c->Lq - 1 ? 0 : j == 0 ? 1 : m->mv[i] > 0.5;
            host[i] = m->mv[i] != 0;
        }
        m->mask = sg_from_host(ctx, SG_BOOL, 4, ms, host);
        free(host);
    } else if (c->mask == 2) {
        int64_t ms[2] = {c->Lq, c->S};
        m->mask = tu_rand(ctx, c->dt, 2, ms, -1, 1, &m->mv);
    }
    if (c->cached) {
        for (int64_t b = 0; b < c->B; b++) m->lens[b] = tu_randint(c->Lq, c->S);
        int64_t n = c->B;
        m->len = sg_from_host(ctx, SG_I64, 1, &n, m->lens);
    }
    m->r = tu_rand(ctx, c->dt, 4, qs, -1, 1, &m->rv);
}

static void unmake(made *m) {
    for (int k = 0; k < 3; k++) sg_release(m->x[k]), free(m->xv[k]);
    sg_release(m->mask), sg_release(m->len), sg_release(m->r);
    free(m->mv), free(m->rv);
}

static sg_tensor *forward(const lcase *c, const made *m) {
    if (c->cached) return sg_sdpa_cached(m->x[0], m->x[1], m->x[2], m->len, 0);
    return sg_sdpa(m->x[0], m->x[1], m->x[2], m->mask, c->causal, 0);
}

/* The f64 logsumexp of row (b, h, i): -inf scores where not seen, +inf when none is. */
static double ref_lse(const lcase *c, const made *m, int64_t b, int64_t h, int64_t i) {
    int64_t hk = h / (c->Hq / c->Hkv), L = c->cached ? m->lens[b] : c->S;
    double scale = 1.0 / sqrt((double)c->D), mx = -INFINITY, sum = 0, *s = malloc(sizeof *s * c->S);
    for (int64_t j = 0; j < c->S; j++) {
        bool seen = j < L && (!(c->causal || c->cached) || j <= L - c->Lq + i);
        if (c->mask == 1) seen = seen && m->mv[(b * c->Lq + i) * c->S + j] != 0;
        s[j] = -INFINITY;
        if (!seen) continue;
        double d = 0;
        for (int64_t e = 0; e < c->D; e++)
            d += m->xv[0][((b * c->Hq + h) * c->Lq + i) * c->D + e] *
                 m->xv[1][((b * c->Hkv + hk) * c->S + j) * c->D + e];
        s[j] = d * scale + (c->mask == 2 ? m->mv[i * c->S + j] : 0);
        mx = s[j] > mx ? s[j] : mx;
    }
    for (int64_t j = 0; mx > -INFINITY && j < c->S; j++) sum += exp(s[j] - mx);
    free(s);
    return sum > 0 ? mx + log(sum) : INFINITY;
}

/* The kept logsumexps of y (a packed output's result view), f32 bits as a
 * 1-d view of y's dtype; NULL when y's storage holds the result alone. */
static sg_tensor *lse_view(const lcase *c, sg_tensor *y) {
    int64_t rows = c->B * c->Hq * c->Lq, no = rows * c->D, one = 1;
    size_t es = sg_dtype_size(c->dt);
    int64_t nl = sg__attn_numel(no, rows, es) - sg__attn_lse_at(no);
    if (y->st->nbytes < (size_t)sg__attn_numel(no, rows, es) * es) return NULL;
    return sg__tensor_view(y, "test", 1, &nl, &one, y->offset + sg__attn_lse_at(no));
}

/* Whether the backend's path keeps the logsumexps (else NaN). */
static bool kept(const lcase *c) {
    if (tu_backend() == SG_BACKEND_CPU) return true;
    return c->dt != SG_F32 && (c->D == 64 || c->D == 128) && c->mask == 0 && c->Lq >= 32;
}

/* A forward, then (how 0) nothing, (1) every kept lse + ln 2, (2) all NaN,
 * then sg_grad of sum(y * r): g[0..2]; the forward's lse into lse when not NULL. */
static bool run(const lcase *c, const made *m, int how, sg_tensor **g, float *lse) {
    sg_tensor *y = forward(c, m);
    sg_tensor *lv = y ? lse_view(c, y) : NULL;
    int64_t rows = c->B * c->Hq * c->Lq;
    size_t lb = (size_t)(lv ? sg_tensor_numel(lv) : 0) * sg_dtype_size(c->dt);
    float *h = malloc(lb + 4);
    bool ok = TU_EXPECT(lv != NULL) && TU_EXPECT(sg_read(lv, h, lb) == SG_OK);
    if (ok && lse) memcpy(lse, h, sizeof(float) * (size_t)rows);
    for (int64_t r = 0; ok && how && r < rows; r++) h[r] = how == 2 ? NAN : h[r] + (float)log(2.0);
    if (ok && how) ok = TU_EXPECT(sg_write(lv, h, lb) == SG_OK);
    sg_tensor *yr = sg_mul(y, m->r), *loss = sg_sum(yr, 0, NULL, false);
    ok = ok && TU_EXPECT(sg_grad(loss, 3, m->x, g) == SG_OK);
    if (!ok) fprintf(stderr, "  %s\n", sg_last_error(ctx));
    sg_release(lv), sg_release(y), sg_release(yr), sg_release(loss);
    free(h);
    return ok;
}

static bool close_to(const char *what, const double *got, const double *want, int64_t n,
                     double tol) {
    double big = 1e-3;
    for (int64_t i = 0; i < n; i++) big = fabs(want[i]) > big ? fabs(want[i]) : big;
    return tu_close(what, got, want, n, tol, tol * big);
}

static void lse_case(const lcase *c, uint64_t seed) {
    made m;
    make(c, seed, &m);
    int64_t rows = c->B * c->Hq * c->Lq, bad = 0, nan = 0, diff = 0;
    double tol = c->dt == SG_F32 ? 1e-5 : 1e-2;
    float *lse = malloc(sizeof(float) * (size_t)rows);
    sg_tensor *g[3][3] = {{NULL}};
    bool ok = run(c, &m, 0, g[0], lse);
    for (int64_t r = 0; ok && r < rows; r++) {
        double want = ref_lse(c, &m, r / (c->Hq * c->Lq), (r / c->Lq) % c->Hq, r % c->Lq);
        if (lse[r] != lse[r]) {
            nan++;
            continue;
        }
        bool good = isinf(want) ? lse[r] == want : fabs(lse[r] - want) <= 1e-4 * (1 + fabs(want));
        if (!good && bad++ < 3)
            fprintf(stderr, "  row %lld: lse %.7g, f64 %.7g\n", (long long)r, lse[r], want);
    }
    /* kept: every row; else every row NaN */
    ok = ok && TU_EXPECT(bad == 0) && TU_EXPECT(kept(c) ? nan == 0 : nan == rows);
    ok = ok && run(c, &m, 2, g[2], NULL);
    int64_t n[3] = {rows * c->D, c->B * c->Hkv * c->S * c->D, c->B * c->Hkv * c->S * c->D};
    for (int k = 0; ok && k < 3; k++) { /* recomputed against kept */
        double *a = tu_read(g[0][k]), *b = tu_read(g[2][k]);
        ok = TU_EXPECT(a && b) && TU_EXPECT(close_to("recomputed vs kept", b, a, n[k], tol));
        for (int64_t i = 0; ok && i < n[k]; i++) diff += a[i] != b[i];
        free(a), free(b);
    }
    if (ok && kept(c)) { /* lse + ln 2 halves every P: dv halves */
        ok = run(c, &m, 1, g[1], NULL);
        double *a = ok ? tu_read(g[0][2]) : NULL, *b = ok ? tu_read(g[1][2]) : NULL;
        for (int64_t i = 0; a && b && i < n[2]; i++) a[i] *= 0.5;
        ok = ok && TU_EXPECT(a && b) && TU_EXPECT(close_to("dv, lse + ln 2", b, a, n[2], tol));
        free(a), free(b);
    }
    tu_case(ok,
            "ATTN_LSE(type=%s,B=%lld,Hq=%lld,Hkv=%lld,Lq=%lld,S=%lld,D=%lld%s%s%s) seed=%llu "
            "kept=%s recomputed-vs-kept differing gradient elements=%lld",
            sg_dtype_name(c->dt), (long long)c->B, (long long)c->Hq, (long long)c->Hkv,
            (long long)c->Lq, (long long)c->S, (long long)c->D, c->causal ? ",causal" : "",
            c->mask == 1   ? ",mask=bool"
            : c->mask == 2 ? ",mask=float"
                           : "",
            c->cached ? ",kv_len" : "", (unsigned long long)seed, nan ? "no" : "yes",
            (long long)diff);
    for (int v = 0; v < 3; v++)
        for (int k = 0; k < 3; k++) sg_release(g[v][k]);
    free(lse);
    unmake(&m);
}

/* ------------------------------------------------------------ no gradient */

static const lcase *step_case;
static const made *step_made;

static sg_status infer_step(sg_ctx *cx, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)in, (void)user;
    sg_set_grad_enabled(cx, false);
    out[0] = forward(step_case, step_made);
    sg_set_grad_enabled(cx, true);
    return out[0] ? SG_OK : SG_ERR_NULL;
}

static sg_status train_step(sg_ctx *cx, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)cx, (void)in, (void)user;
    sg_tensor *y = forward(step_case, step_made);
    sg_tensor *loss = sg_sum(sg_mul(y, step_made->r), 0, NULL, false);
    out[0] = sg_clone(y);
    sg_release(y);
    return sg_grad(loss, 3, step_made->x, out + 1);
}

/* The explain line of the step's attention node. */
static bool attn_line(const char *ex, char *line, size_t n) {
    const char *p = strstr(ex, "= attention(");
    if (!p) return false;
    const char *a = p, *z = strchr(p, '\n');
    while (a > ex && a[-1] != '\n') a--;
    size_t len = (size_t)((z ? z : p + strlen(p)) - a);
    len = len < n - 1 ? len : n - 1;
    memcpy(line, a, len);
    line[len] = 0;
    return true;
}

static void nograd_case(const lcase *c, uint64_t seed) {
    made m;
    make(c, seed, &m);
    int64_t no = c->B * c->Hq * c->Lq * c->D;
    size_t bytes = (size_t)no * sg_dtype_size(c->dt);
    char *b0 = malloc(bytes), *b1 = malloc(bytes), *b2 = malloc(bytes), *b3 = malloc(bytes);
    sg_set_grad_enabled(ctx, false);
    sg_tensor *y0 = forward(c, &m);
    sg_set_grad_enabled(ctx, true);
    sg_tensor *y1 = forward(c, &m);
    bool ok = TU_EXPECT(y0 && y1) && TU_EXPECT(y0->st->nbytes == bytes) &&
              TU_EXPECT(y1->st->nbytes > bytes) && TU_EXPECT(sg_read(y0, b0, bytes) == SG_OK) &&
              TU_EXPECT(sg_read(y1, b1, bytes) == SG_OK) && TU_EXPECT(!memcmp(b0, b1, bytes));
    step_case = c, step_made = &m;
    char l0[512] = "", l1[512] = "";
    sg_tensor *out[4] = {NULL};
    sg_fn *fi = NULL, *ft = NULL;
    sg_compile_opts o = {.mode = SG_MODE_REDUCE_OVERHEAD, .fullgraph = true};
    ok = ok && TU_EXPECT(sg_compile(ctx, infer_step, NULL, 0, 1, &o, &fi) == SG_OK) &&
         TU_EXPECT(sg_compile(ctx, train_step, NULL, 0, 4, &o, &ft) == SG_OK);
    for (int call = 0; ok && call < 2; call++) {
        sg_mark_step_begin(ctx);
        ok = TU_EXPECT(sg_call(fi, NULL, 0, out, 1) == SG_OK) &&
             TU_EXPECT(sg_read(out[0], b2, bytes) == SG_OK) && TU_EXPECT(!memcmp(b0, b2, bytes));
        sg_mark_step_begin(ctx);
        ok = ok && TU_EXPECT(sg_call(ft, NULL, 0, out, 4) == SG_OK) &&
             TU_EXPECT(sg_read(out[0], b3, bytes) == SG_OK) && TU_EXPECT(!memcmp(b0, b3, bytes));
    }
    /* Inference: the 4-d result (B, Lq, Hq, D); training: the packed 1-d output. */
    char want[160], packed[160];
    snprintf(want, sizeof want, "[%lld,%lld,%lld,%lld]", (long long)c->B, (long long)c->Lq,
             (long long)c->Hq, (long long)c->D);
    snprintf(packed, sizeof packed, "[%lld]",
             (long long)sg__attn_numel(no, no / c->D, sg_dtype_size(c->dt)));
    ok = ok && TU_EXPECT(attn_line(sg_fn_explain(fi), l0, sizeof l0)) &&
         TU_EXPECT(attn_line(sg_fn_explain(ft), l1, sizeof l1));
    ok = ok && TU_EXPECT(strstr(l0, want) != NULL) && TU_EXPECT(strstr(l1, packed) != NULL);
    if (!ok) fprintf(stderr, "  inference: %s\n  training: %s\n", l0, l1);
    tu_case(ok, "ATTN_NOGRAD(type=%s,B=%lld,Hq=%lld,Lq=%lld,D=%lld%s) seed=%llu",
            sg_dtype_name(c->dt), (long long)c->B, (long long)c->Hq, (long long)c->Lq,
            (long long)c->D, c->causal ? ",causal" : "", (unsigned long long)seed);
    sg_fn_destroy(fi), sg_fn_destroy(ft);
    sg_release(y0), sg_release(y1);
    free(b0), free(b1), free(b2), free(b3);
    unmake(&m);
}

int main(void) {
    ctx = tu_ctx((sg_ctx_opts){0});
    const sg_dtype F = SG_F32, BF = SG_BF16, H = SG_F16;
    const lcase cases[] = {
        /* dt  B  Hq Hkv Lq   S    D   causal mask cached */
        {F, 2, 2, 2, 5, 7, 8, false, 0, false},
        {F, 2, 4, 2, 37, 45, 16, true, 0, false},
        {F, 2, 2, 2, 6, 9, 8, false, 1, false},
        {F, 1, 2, 2, 6, 9, 8, true, 2, false},
        {F, 2, 4, 1, 3, 9, 8, false, 0, true},
        {F, 1, 2, 2, 70, 70, 64, true, 0, false},
        {BF, 2, 4, 2, 9, 9, 16, true, 0, false},
        {BF, 2, 4, 4, 70, 70, 64, true, 0, false},
        {BF, 1, 4, 2, 65, 130, 64, false, 0, false},
        {H, 1, 4, 1, 40, 100, 64, false, 0, true},
        {BF, 1, 2, 2, 50, 50, 128, true, 0, false},
        {H, 1, 4, 2, 33, 70, 128, true, 0, false},
        {BF, 2, 2, 2, 40, 48, 64, false, 1, false},
        {BF, 1, 2, 2, 20, 20, 32, true, 0, false},
    };
    uint64_t seed = 1;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) lse_case(&cases[i], seed++);
    nograd_case(&cases[1], seed++);
    nograd_case(&cases[7], seed++);
    nograd_case(&cases[11], seed++);
    sg_ctx_destroy(ctx);
    return tu_finish();
}
