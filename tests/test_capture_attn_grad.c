/* SPDX-License-Identifier: MIT */
/*
 * test_capture_attn_grad.c -- the gradient of fused attention (sg_sdpa and
 * sg_sdpa_cached through the ATTENTION node and its ATTENTION_BWD) against
 * an f64 reference written here: the loss is sum(sdpa(q, k, v) * r) for a
 * random r, and dq, dk, dv are checked against the reference's analytic
 * gradients on every case and against central finite differences of the
 * reference forward on the small f32 ones. Cases: causal and not, Lq != S,
 * grouped-query heads, bool and float masks, kv_len, 3-d operands, K/V
 * broadcast over the batch, non-contiguous q/k/v (permuted, sliced), f32,
 * bf16 and f16, head dims 8 to 128 (64 and 128 are the tensor-core
 * kernels' on CUDA). Then: a second eager run gives identical bits, the
 * compiled modes (DEFAULT, REDUCE_OVERHEAD, MAX_AUTOTUNE) give the eager
 * gradients and run one attention_bwd node with no softmax (the scores
 * never reach memory), and a head dim past the kernels still differentiates
 * through the decomposed ops.
 *
 * Fused projections: q, k and v as views of one (B, L, W) tensor (GPT-2's
 * transpose(reshape(narrow(qkv, 2, o, H * D))), grouped heads included),
 * the gradient taken of that tensor: against the reference's dq, dk, dv
 * placed in its columns (zeros in the columns no view reads: the case with
 * gaps; dk + dv where k and v view the same columns), and, but for
 * overlapping views, bit for bit against the gradients of q, k and v
 * viewed alike from three copies of that tensor. Compiled, the step of GPT-2's layout runs no
 * copy, fill or add after attention_bwd: its gradients are written in
 * place.
 */
#include "testutil.h"

#include <math.h>
#include <string.h>

static sg_ctx *ctx;

typedef struct acase {
    sg_dtype dt;
    int64_t B, Hq, Hkv, Lq, S, D;
    bool causal;
    int mask;      /* 0 none, 1 bool (B, 1, Lq, S), 2 float (Lq, S) */
    bool cached;   /* sg_sdpa_cached with kv_len (B) in [Lq, S] */
    bool three;    /* 3-d operands (B = 1, no batch dim) */
    bool kv_bcast; /* k and v of batch 1 */
    bool fd;       /* also against finite differences */
    int fused; /* q, k, v views of one tensor: 1 dense, 2 with gaps, 3 k and v the same columns */
} acase;

/* ------------------------------------------------------------ the f64 reference */

typedef struct ref {
    const acase *c;
    const double *q, *k, *v, *mask, *r;
    const int64_t *len;
    double scale;
} ref;

static int64_t qat(const acase *c, int64_t b, int64_t h, int64_t i, int64_t e) {
    return ((b * c->Hq + h) * c->Lq + i) * c->D + e;
}

static int64_t kat(const acase *c, int64_t b, int64_t h, int64_t j, int64_t e) {
    return (((c->kv_bcast ? 0 : b) * c->Hkv + h) * c->S + j) * c->D + e;
}

/* The scores of row (b, h, i) into s (-inf where not seen); false when it sees none. */
static bool ref_scores(const ref *R, int64_t b, int64_t h, int64_t i, double *s) {
    const acase *c = R->c;
    int64_t hk = h / (c->Hq / c->Hkv), L = R->len ? R->len[b] : c->S;
    bool any = false;
    for (int64_t j = 0; j < c->S; j++) {
        bool seen = j < L && (!(c->causal || c->cached) || j <= L - c->Lq + i);
        if (c->mask == 1) seen = seen && R->mask[(b * c->Lq + i) * c->S + j] != 0;
        s[j] = -INFINITY;
        if (!seen) continue;
        double d = 0;
        for (int64_t e = 0; e < c->D; e++)
            d += R->q[qat(c, b, h, i, e)] * R->k[kat(c, b, hk, j, e)];
        s[j] = d * R->scale + (c->mask == 2 ? R->mask[i * c->S + j] : 0);
        any = true;
    }
    return any;
}

/* Softmax of s in place (every row here sees a key). */
static void softmax(double *s, int64_t n) {
    double m = -INFINITY, z = 0;
    for (int64_t j = 0; j < n; j++) m = s[j] > m ? s[j] : m;
    for (int64_t j = 0; j < n; j++) z += s[j] == -INFINITY ? 0 : exp(s[j] - m);
    for (int64_t j = 0; j < n; j++) s[j] = s[j] == -INFINITY ? 0 : exp(s[j] - m) / z;
}

static double ref_loss(const ref *R, double *p) {
    const acase *c = R->c;
    double l = 0;
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t h = 0; h < c->Hq; h++)
            for (int64_t i = 0; i < c->Lq; i++) {
                if (!ref_scores(R, b, h, i, p)) continue;
                softmax(p, c->S);
                int64_t hk = h / (c->Hq / c->Hkv);
                for (int64_t e = 0; e < c->D; e++) {
                    double o = 0;
                    for (int64_t j = 0; j < c->S; j++) o += p[j] * R->v[kat(c, b, hk, j, e)];
                    l += o * R->r[qat(c, b, h, i, e)];
                }
            }
    return l;
}

/* d loss / d q, k, v in f64 (dk, dv zeroed by the caller). */
static void ref_grad(const ref *R, double *dq, double *dk, double *dv, double *p, double *dp) {
    const acase *c = R->c;
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t h = 0; h < c->Hq; h++)
            for (int64_t i = 0; i < c->Lq; i++) {
                int64_t hk = h / (c->Hq / c->Hkv);
                for (int64_t e = 0; e < c->D; e++) dq[qat(c, b, h, i, e)] = 0;
                if (!ref_scores(R, b, h, i, p)) continue;
                softmax(p, c->S);
                double Dsum = 0;
                for (int64_t j = 0; j < c->S; j++) {
                    dp[j] = 0;
                    for (int64_t e = 0; e < c->D; e++)
                        dp[j] += R->r[qat(c, b, h, i, e)] * R->v[kat(c, b, hk, j, e)];
                    Dsum += p[j] * dp[j];
                }
                for (int64_t j = 0; j < c->S; j++) {
                    double ds = p[j] * (dp[j] - Dsum) * R->scale;
                    for (int64_t e = 0; e < c->D; e++) {
                        dq[qat(c, b, h, i, e)] += ds * R->k[kat(c, b, hk, j, e)];
                        dk[kat(c, b, hk, j, e)] += ds * R->q[qat(c, b, h, i, e)];
                        dv[kat(c, b, hk, j, e)] += p[j] * R->r[qat(c, b, h, i, e)];
                    }
                }
            }
}

/* ------------------------------------------------------------ one case */

typedef struct made {
    sg_tensor *x[3], *mask, *len, *r;
    double *xv[3], *mv, *rv;
    int64_t lens[16];
    int nd, xnd[3];
    int64_t sh[3][4];
    sg_tensor *base; /* fused: the (B, L, W) tensor q, k and v view, and its values */
    double *bv;
    int64_t W, off[3];
} made;

static sg_tensor *forward(const acase *c, const made *m) {
    if (c->cached) return sg_sdpa_cached(m->x[0], m->x[1], m->x[2], m->len, 0);
    return sg_sdpa(m->x[0], m->x[1], m->x[2], m->mask, c->causal, 0);
}

/* q, k and v as views of one (B, L, W) tensor at columns m->off[k]. */
static void make_fused(const acase *c, made *m) {
    int64_t wq = c->Hq * c->D, wk = c->Hkv * c->D, gap = c->fused == 2 ? 2 : 0;
    m->off[0] = 0, m->off[1] = wq + gap;
    m->off[2] = c->fused == 3 ? m->off[1] : m->off[1] + wk;
    m->W = m->off[2] + wk + (c->fused == 2 ? 3 : 0);
    int64_t bs[3] = {c->B, c->Lq, m->W}, L = c->Lq, D = c->D;
    m->base = tu_rand(ctx, c->dt, 3, bs, -1.5, 1.5, &m->bv);
    sg_requires_grad_(m->base, true);
    m->nd = 4;
    for (int k = 0; k < 3; k++) {
        int64_t H = k ? c->Hkv : c->Hq, heads[4] = {c->B, L, H, D};
        sg_tensor *n = sg_narrow(m->base, 2, m->off[k], H * D), *r = sg_reshape(n, 4, heads);
        m->x[k] = sg_transpose(r, 1, 2);
        sg_release(n), sg_release(r);
        int64_t sh[4] = {c->B, H, L, D};
        memcpy(m->sh[k], sh, sizeof sh);
        m->xv[k] = malloc(sizeof(double) * (size_t)(c->B * H * L * D));
        for (int64_t b = 0; b < c->B; b++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t i = 0; i < L; i++)
                    for (int64_t e = 0; e < D; e++)
                        m->xv[k][((b * H + h) * L + i) * D + e] =
                            m->bv[(b * L + i) * m->W + m->off[k] + h * D + e];
    }
}

static void make(const acase *c, uint64_t seed, made *m) {
    memset(m, 0, sizeof *m);
    tu_seed(seed);
    if (c->fused) make_fused(c, m);
    int64_t kb = c->kv_bcast ? 1 : c->B;
    int64_t qs[4] = {c->B, c->Hq, c->Lq, c->D}, ks[4] = {kb, c->Hkv, c->S, c->D};
    m->nd = c->three ? 3 : 4;
    for (int k = 0; !c->fused && k < 3; k++) {
        const int64_t *s = k ? ks : qs;
        memcpy(m->sh[k], s + (c->three ? 1 : 0), sizeof(int64_t) * (size_t)m->nd);
        m->x[k] = tu_rand_layout(ctx, c->dt, m->nd, m->sh[k], -1.5, 1.5,
                                 (tu_layout)((seed + (uint64_t)k) % TU_NUM_LAYOUTS), &m->xv[k]);
        sg_requires_grad_(m->x[k], true);
    }
    if (c->mask == 1) {
        int64_t ms[4] = {c->B, 1, c->Lq, c->S};
        m->mask = tu_rand(ctx, SG_BOOL, 4, ms, 0, 1, &m->mv);
        /* Every row keeps key 0 (which every query sees), so none is empty. */
        for (int64_t r = 0; r < c->B * c->Lq; r++) m->mv[r * c->S] = 1;
        uint8_t *host = malloc((size_t)(c->B * c->Lq * c->S));
        for (int64_t i = 0; i < c->B * c->Lq * c->S; i++) host[i] = m->mv[i] != 0;
        sg_release(m->mask);
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
    m->r = tu_rand(ctx, c->dt, m->nd, m->sh[0], -1, 1, &m->rv);
}

static void unmake(made *m) {
    for (int k = 0; k < 3; k++) sg_release(m->x[k]), free(m->xv[k]);
    sg_release(m->mask), sg_release(m->len), sg_release(m->r), sg_release(m->base);
    free(m->mv), free(m->rv), free(m->bv);
}

/* What the gradients are taken of: the fused tensor, or q, k and v. */
static int wrt(const made *m, sg_tensor *const **x) {
    *x = m->base ? &m->base : m->x;
    return m->base ? 1 : 3;
}

/* sg_grad of sum(sdpa * r): g[0..2] (g[0] alone when fused), or false. */
static bool grads(const acase *c, const made *m, sg_tensor **g) {
    sg_tensor *y = forward(c, m);
    sg_tensor *yr = sg_mul(y, m->r), *loss = sg_sum(yr, 0, NULL, false);
    sg_tensor *const *x;
    int n = wrt(m, &x);
    sg_status s = loss ? sg_grad(loss, n, x, g) : SG_ERR_NULL;
    if (s != SG_OK) fprintf(stderr, "  %s\n", sg_last_error(ctx));
    sg_release(y), sg_release(yr), sg_release(loss);
    return s == SG_OK;
}

static const char *case_name(const acase *c, char *buf, size_t n) {
    static const char *fused[4] = {"", ",fused", ",fused=gaps", ",fused=kv_overlap"};
    snprintf(buf, n, "ATTN_GRAD(type=%s,B=%lld,Hq=%lld,Hkv=%lld,Lq=%lld,S=%lld,D=%lld%s%s%s%s%s%s)",
             sg_dtype_name(c->dt), (long long)c->B, (long long)c->Hq, (long long)c->Hkv,
             (long long)c->Lq, (long long)c->S, (long long)c->D, c->causal ? ",causal" : "",
             c->mask == 1   ? ",mask=bool"
             : c->mask == 2 ? ",mask=float"
                            : "",
             c->cached ? ",kv_len" : "", c->three ? ",3d" : "", c->kv_bcast ? ",kv_bcast" : "",
             fused[c->fused]);
    return buf;
}

/* got against want: within tol times the largest |want| (plus rtol of each). */
static bool close_to(const char *what, const double *got, const double *want, int64_t n,
                     double tol) {
    double big = 1e-3;
    for (int64_t i = 0; i < n; i++) big = fabs(want[i]) > big ? fabs(want[i]) : big;
    return tu_close(what, got, want, n, tol, tol * big);
}

static void attn_case(const acase *c, uint64_t seed) {
    made m;
    make(c, seed, &m);
    char name[200];
    case_name(c, name, sizeof name);
    sg_tensor *g[3] = {NULL}, *g2[3] = {NULL};
    bool ok = TU_EXPECT(grads(c, &m, g)) && TU_EXPECT(grads(c, &m, g2));
    ref R = {.c = c,
             .q = m.xv[0],
             .k = m.xv[1],
             .v = m.xv[2],
             .mask = m.mv,
             .r = m.rv,
             .len = c->cached ? m.lens : NULL,
             .scale = 1.0 / sqrt((double)c->D)};
    int64_t n[3];
    double *want[3], *p = malloc(sizeof(double) * (size_t)c->S * 2);
    for (int k = 0; k < 3; k++) {
        n[k] = 1;
        for (int d = 0; d < m.nd; d++) n[k] *= m.sh[k][d];
        want[k] = calloc((size_t)n[k], sizeof(double));
    }
    ref_grad(&R, want[0], want[1], want[2], p, p + c->S);
    double tol = c->dt == SG_F32 ? 1e-4 : 2e-2;
    for (int k = 0; ok && k < 3; k++) {
        double *got = tu_read(g[k]);
        size_t bytes = (size_t)n[k] * sg_dtype_size(c->dt);
        char *b1 = malloc(bytes + 1), *b2 = malloc(bytes + 1);
        ok = TU_EXPECT(got != NULL) &&
             TU_EXPECT(close_to("grad vs f64", got, want[k], n[k], tol)) &&
             TU_EXPECT(sg_read(g[k], b1, bytes) == SG_OK) &&
             TU_EXPECT(sg_read(g2[k], b2, bytes) == SG_OK) && TU_EXPECT(!memcmp(b1, b2, bytes));
        if (ok && c->fd) { /* the reference's own gradient against finite differences */
            double *x = (double *)(k == 0   ? R.q
                                   : k == 1 ? R.k
                                            : R.v),
                   *fd = malloc(sizeof(double) * (size_t)n[k]);
            for (int64_t i = 0; i < n[k]; i++) {
                double v = x[i], h = 1e-6;
                x[i] = v + h;
                double lp = ref_loss(&R, p);
                x[i] = v - h;
                double lm = ref_loss(&R, p);
                x[i] = v;
                fd[i] = (lp - lm) / (2 * h);
            }
            ok = TU_EXPECT(
                     close_to("f64 analytic vs finite differences", want[k], fd, n[k], 1e-6)) &&
                 TU_EXPECT(close_to("grad vs finite differences", got, fd, n[k], 2e-3));
            free(fd);
        }
        if (!ok) fprintf(stderr, "  input %d (%s)\n", k, k == 0 ? "q" : k == 1 ? "k" : "v");
        free(got), free(b1), free(b2);
    }
    tu_case(ok, "%s seed=%llu", name, (unsigned long long)seed);
    for (int k = 0; k < 3; k++) sg_release(g[k]), sg_release(g2[k]), free(want[k]);
    free(p);
    unmake(&m);
}

/* ------------------------------------------------------------ fused projections */

/* The reference's dq, dk, dv (want) placed in the fused tensor's columns. */
static double *fused_want(const acase *c, const made *m, double *const *want) {
    int64_t L = c->Lq, D = c->D;
    double *w = calloc((size_t)(c->B * L * m->W), sizeof(double));
    for (int k = 0; k < 3; k++) {
        int64_t H = k ? c->Hkv : c->Hq;
        for (int64_t b = 0; b < c->B; b++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t i = 0; i < L; i++)
                    for (int64_t e = 0; e < D; e++)
                        w[(b * L + i) * m->W + m->off[k] + h * D + e] +=
                            want[k][((b * H + h) * L + i) * D + e];
    }
    return w;
}

/* The fused gradient bit for bit against the gradients of q, k and v made
 * the same way from three copies of the fused tensor: the same geometry
 * and alignment (so the same forward and backward kernels: both pick
 * their paths by the operands' strides), but no one base to write into. */
static bool fused_bits(const acase *c, const made *m, const double *got) {
    made sep = *m;
    sep.base = NULL;
    sg_tensor *copy[3];
    int64_t L = c->Lq, D = c->D, bad = 0;
    for (int k = 0; k < 3; k++) {
        int64_t H = k ? c->Hkv : c->Hq, heads[4] = {c->B, L, H, D};
        sg_set_grad_enabled(ctx, false);
        copy[k] = sg_clone(m->base);
        sg_set_grad_enabled(ctx, true);
        sg_requires_grad_(copy[k], true);
        sg_tensor *n = sg_narrow(copy[k], 2, m->off[k], H * D), *r = sg_reshape(n, 4, heads);
        sep.x[k] = sg_transpose(r, 1, 2);
        sg_release(n), sg_release(r);
    }
    sg_tensor *g[3] = {NULL};
    bool ok = TU_EXPECT(grads(c, &sep, g));
    for (int k = 0; ok && k < 3; k++) {
        int64_t H = k ? c->Hkv : c->Hq;
        double *v = tu_read(g[k]);
        ok = TU_EXPECT(v != NULL);
        for (int64_t b = 0; ok && b < c->B; b++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t i = 0; i < L; i++)
                    for (int64_t e = 0; e < D; e++)
                        bad += got[(b * L + i) * m->W + m->off[k] + h * D + e] !=
                               v[((b * H + h) * L + i) * D + e];
        free(v);
    }
    if (bad)
        fprintf(stderr, "  %lld elements differ from the separate tensors' gradients\n",
                (long long)bad);
    for (int k = 0; k < 3; k++) sg_release(g[k]), sg_release(sep.x[k]), sg_release(copy[k]);
    return ok && TU_EXPECT(bad == 0);
}

static void fused_case(const acase *c, uint64_t seed) {
    made m;
    make(c, seed, &m);
    char name[200];
    case_name(c, name, sizeof name);
    sg_tensor *g = NULL, *g2 = NULL;
    bool ok = TU_EXPECT(grads(c, &m, &g)) && TU_EXPECT(grads(c, &m, &g2));
    ref R = {.c = c,
             .q = m.xv[0],
             .k = m.xv[1],
             .v = m.xv[2],
             .r = m.rv,
             .scale = 1.0 / sqrt((double)c->D)};
    double *want[3], *p = malloc(sizeof(double) * (size_t)c->S * 2);
    for (int k = 0; k < 3; k++) {
        int64_t n = 1;
        for (int d = 0; d < 4; d++) n *= m.sh[k][d];
        want[k] = calloc((size_t)n, sizeof(double));
    }
    ref_grad(&R, want[0], want[1], want[2], p, p + c->S);
    double *wb = fused_want(c, &m, want), *got = ok ? tu_read(g) : NULL, *got2 = NULL;
    int64_t n = c->B * c->Lq * m.W;
    ok = ok && TU_EXPECT(got != NULL) && TU_EXPECT(sg_tensor_numel(g) == n) &&
         TU_EXPECT(close_to("fused grad vs f64", got, wb, n, c->dt == SG_F32 ? 1e-4 : 2e-2));
    if (ok) { /* replays of the backward give the same bits */
        got2 = tu_read(g2);
        ok = TU_EXPECT(got2 != NULL) && TU_EXPECT(!memcmp(got, got2, sizeof(double) * (size_t)n));
    }
    if (ok && c->fused != 3) ok = fused_bits(c, &m, got);
    tu_case(ok, "%s seed=%llu", name, (unsigned long long)seed);
    sg_release(g), sg_release(g2);
    for (int k = 0; k < 3; k++) free(want[k]);
    free(p), free(wb), free(got), free(got2);
    unmake(&m);
}

/* ------------------------------------------------------------ compiled */

static const acase *step_case;
static const made *step_made;

static sg_status grad_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)c, (void)in, (void)user;
    sg_tensor *loss = sg_sum(sg_mul(forward(step_case, step_made), step_made->r), 0, NULL, false);
    sg_tensor *const *x;
    int n = wrt(step_made, &x);
    return sg_grad(loss, n, x, out);
}

static void compiled_case(const acase *c, uint64_t seed) {
    made m;
    make(c, seed, &m);
    char name[200];
    case_name(c, name, sizeof name);
    sg_tensor *eager[3] = {NULL}, *out[3] = {NULL};
    sg_tensor *const *x;
    int nout = wrt(&m, &x);
    bool ok0 = TU_EXPECT(grads(c, &m, eager));
    step_case = c, step_made = &m;
    static const sg_mode modes[3] = {SG_MODE_DEFAULT, SG_MODE_REDUCE_OVERHEAD,
                                     SG_MODE_MAX_AUTOTUNE};
    for (int mo = 0; mo < 3; mo++) {
        sg_fn *fn = NULL;
        bool ok =
            ok0 && TU_EXPECT(sg_compile(ctx, grad_step, NULL, 0, nout,
                                        &(sg_compile_opts){.mode = modes[mo], .fullgraph = true},
                                        &fn) == SG_OK);
        for (int call = 0; ok && call < 2; call++) {
            sg_mark_step_begin(ctx);
            ok = TU_EXPECT(sg_call(fn, NULL, 0, out, nout) == SG_OK);
            for (int k = 0; ok && k < nout; k++) {
                double *a = tu_read(out[k]), *b = tu_read(eager[k]);
                ok = TU_EXPECT(a && b) &&
                     TU_EXPECT(sg_tensor_numel(out[k]) == sg_tensor_numel(eager[k])) &&
                     TU_EXPECT(close_to("compiled vs eager", a, b, sg_tensor_numel(eager[k]),
                                        c->dt == SG_F32 ? 1e-5 : 1e-2));
                free(a), free(b);
            }
        }
        const char *ex = fn ? sg_fn_explain(fn) : "";
        ok = ok && TU_EXPECT(strstr(ex, "attention_bwd") != NULL) &&
             TU_EXPECT(strstr(ex, "softmax") == NULL);
        if (ok && c->fused == 1 && c->Hq == c->Hkv) { /* in place: one copy (the result) */
            const char *p = strstr(ex, "attention_bwd");
            int copies = 0;
            while ((p = strstr(p, "= copy(")) != NULL) copies++, p++;
            ok = TU_EXPECT(copies == 1) &&
                 TU_EXPECT(strstr(ex, "= fill(") == strstr(ex, "= fill(1)")) &&
                 TU_EXPECT(strstr(ex, "= add(") == NULL);
        }
        if (!ok) fprintf(stderr, "  %s\n%s\n", sg_last_error(ctx), ex);
        tu_case(ok, "%s compiled mode=%s seed=%llu", name, sg_mode_name(modes[mo]),
                (unsigned long long)seed);
        sg_fn_destroy(fn);
    }
    for (int k = 0; k < 3; k++) sg_release(eager[k]);
    unmake(&m);
}

int main(void) {
    ctx = tu_ctx((sg_ctx_opts){0});
    const sg_dtype F = SG_F32, BF = SG_BF16, H = SG_F16;
    const acase cases[] = {
        /* dt  B  Hq Hkv Lq  S   D   causal mask cached three kv_bcast fd fused */
        {F, 2, 2, 2, 5, 7, 8, false, 0, false, false, false, true, 0},
        {F, 1, 2, 2, 6, 6, 4, true, 0, false, false, false, true, 0},
        {F, 2, 2, 2, 3, 7, 8, true, 0, false, false, false, true, 0},
        {F, 2, 4, 2, 5, 5, 8, true, 0, false, false, false, true, 0},
        {F, 2, 2, 2, 4, 6, 8, false, 1, false, false, false, true, 0},
        {F, 1, 2, 2, 4, 6, 8, true, 2, false, false, false, true, 0},
        {F, 1, 3, 3, 5, 6, 8, false, 0, false, true, false, true, 0},
        {F, 2, 2, 2, 4, 5, 8, false, 0, false, false, true, true, 0},
        {F, 2, 4, 1, 3, 9, 8, false, 0, true, false, false, true, 0},
        {F, 2, 6, 2, 37, 45, 24, true, 0, false, false, false, false, 0},
        {BF, 2, 4, 2, 9, 9, 16, true, 0, false, false, false, false, 0},
        {H, 2, 2, 2, 6, 11, 16, false, 1, false, false, false, false, 0},
        {BF, 2, 4, 4, 70, 70, 64, true, 0, false, false, false, false, 0},
        {BF, 1, 4, 2, 65, 130, 64, false, 0, false, false, false, false, 0},
        {H, 1, 4, 1, 40, 100, 64, false, 0, true, false, false, false, 0},
        {BF, 1, 2, 2, 50, 50, 128, true, 0, false, false, false, false, 0},
        {H, 1, 4, 2, 33, 70, 128, true, 0, false, false, false, false, 0},
        {F, 1, 2, 2, 40, 40, 64, true, 0, false, false, false, false, 0},
    };
    uint64_t seed = 1;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) attn_case(&cases[i], seed++);
    compiled_case(&cases[3], 100);
    compiled_case(&cases[12], 101);
    /* q, k, v as views of one projection (GPT-2's layout), grouped heads, gaps, overlap. */
    const acase fused[] = {
        /* dt  B  Hq Hkv Lq  S   D   causal mask cached three kv_bcast fd fused */
        {F, 2, 2, 2, 5, 5, 8, true, 0, false, false, false, false, 1},
        {F, 1, 3, 3, 6, 6, 4, false, 0, false, false, false, false, 2},
        {F, 2, 2, 2, 5, 5, 8, true, 0, false, false, false, false, 3},
        {F, 2, 4, 2, 7, 7, 8, true, 0, false, false, false, false, 1},
        {F, 1, 2, 2, 40, 40, 64, true, 0, false, false, false, false, 1},
        {BF, 2, 4, 4, 70, 70, 64, true, 0, false, false, false, false, 1},
        {BF, 1, 2, 2, 100, 100, 128, false, 0, false, false, false, false, 2},
        {H, 1, 4, 2, 65, 65, 64, true, 0, false, false, false, false, 1},
        {BF, 1, 2, 2, 33, 33, 64, true, 0, false, false, false, false, 3},
    };
    for (size_t i = 0; i < sizeof fused / sizeof fused[0]; i++) fused_case(&fused[i], seed++);
    compiled_case(&fused[0], 102);
    compiled_case(&fused[5], 103);
    compiled_case(&fused[3], 104);
    /* A head dim past the fused kernels: the decomposed ops, still differentiated. */
    acase big = {F, 1, 1, 1, 3, 4, 260, false, 0, false, false, false, false, 0};
    attn_case(&big, seed++);
    sg_ctx_destroy(ctx);
    return tu_finish();
}
