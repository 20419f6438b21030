/* SPDX-License-Identifier: MIT */
/*
 * cuda_matmul.c -- the CUDA matmul family (MATMUL, LINEAR): a node becomes
 * a plan over shapes and strides (cublaslt.h), then either cuBLASLt calls
 * (cublaslt.c) or launches of the GEMV kernel (k_matmul.cu).
 *
 * The plan follows the CPU kernel (graphs/cpu/cpu_matmul.c): operands that
 * are row-major matrices or transposes of one are read in place; others are
 * packed into contiguous scratch first; a result that is not row-major is
 * written to scratch and copied out. Batch dims along which B is fixed fold
 * into M (x (B, T, K) @ w^T is one product of B*T rows), remaining batch dims
 * that all operands step through evenly merge into one, which is the strided
 * batch of a single cuBLASLt call; any others are looped over.
 *
 * Which kernel: the GEMV kernel when M <= 8 and the weight's rows are
 * contiguous along K (batch-1 inference: it streams the weight once at
 * memory bandwidth, where a GEMM tiles for reuse it cannot get), else
 * cuBLASLt. SG_CUDA_MATMUL=lt|gemv forces one (tests); gemv takes any
 * shape and layout, slowly when they are not its own. On HIP (no cuBLASLt)
 * every product runs the GEMV kernel. When cuBLASLt has no
 * algorithm for a call, the GEMV kernel runs it instead (logged under
 * fallbacks, once per distinct call). LINEAR's bias rides on cuBLASLt's BIAS epilogue, or is written
 * into the result first and the product added to it (beta = 1).
 *
 * A large product that is not 16-byte aligned (cublaslt.h: padding) runs
 * through aligned scratch, so that cuBLASLt takes its fast kernels rather
 * than align1 ones, or, when only its result's rows are unaligned, writes
 * them in place in row classes (run_classes); sg_fn_explain says so per
 * node (sg__mm_pad_note).
 */
#include "cublaslt.h"

#include "../../fusion/fusion.h"
#include "../../memory/memory.h"

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* ------------------------------------------------------------ the plan (no device) */

enum { LAY_NONE = -1, LAY_N, LAY_T };

/*
 * How an R x C matrix with strides (rs, cs) reads as a BLAS operand: as
 * row-major with leading dim rs (LAY_N), or as the transpose of a row-major
 * C x R matrix with leading dim cs (LAY_T). Strides of size-1 dims do not
 * matter. (graphs/cpu/cpu_matmul.c has the same rule.)
 */
static int layout(int64_t R, int64_t C, int64_t rs, int64_t cs, int64_t *ld) {
    int64_t min_n = C > 1 ? C : 1, min_t = R > 1 ? R : 1;
    if ((C <= 1 || cs == 1) && (R <= 1 || rs >= min_n)) {
        *ld = R <= 1 ? min_n : rs;
        return LAY_N;
    }
    if ((R <= 1 || rs == 1) && (C <= 1 || cs >= min_t)) {
        *ld = C <= 1 ? min_t : cs;
        return LAY_T;
    }
    return LAY_NONE;
}

typedef sg__mm_role role; /* backend.h */

static int64_t role_size(const sg_tensor *t, int dim) { return dim >= 0 ? t->shape[dim] : 1; }

static int tensor_layout(const sg_tensor *t, role r) {
    int64_t ld;
    return layout(role_size(t, r.rdim), role_size(t, r.cdim), r.rdim >= 0 ? t->stride[r.rdim] : 0,
                  r.cdim >= 0 ? t->stride[r.cdim] : 0, &ld);
}

static void mat_set(sg__mm_mat *m, const sg_tensor *t, role r, const int64_t *stride, int nb) {
    m->rs = r.rdim >= 0 ? stride[r.rdim] : 0;
    m->cs = r.cdim >= 0 ? stride[r.cdim] : 0;
    for (int d = 0; d < nb; d++) {
        int s = d - (nb - r.tb);
        m->bs[d] = s < 0 || t->shape[s] == 1 ? 0 : stride[s];
    }
}

static void contiguous_strides(int ndim, const int64_t *shape, int64_t *stride) {
    int64_t s = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        stride[d] = s;
        s *= shape[d] > 0 ? shape[d] : 1;
    }
}

/* The sizes and the roles of the three operands (graphs/dims.c). */
static void setup(const sg__node *n, sg__mm_plan *p, role *ra, role *rb, role *rc) {
    sg__mm_dims d;
    sg__mm_dims_of(n, &d);
    p->M = d.M, p->N = d.N, p->K = d.K, p->nb = d.nb;
    memcpy(p->bshape, d.bshape, sizeof d.bshape);
    *ra = d.a, *rb = d.b, *rc = d.c;
}

/* Fold batch dims into M, innermost first, while B is fixed along them and
 * A and C stay row-major matrices with evenly spaced rows. */
static void fold(sg__mm_plan *p) {
    while (p->nb > 0) {
        int d = p->nb - 1;
        int64_t s = p->bshape[d], ld;
        if (s == 1) {
            p->nb--;
            continue;
        }
        if (p->B.bs[d] != 0) break;
        int64_t ars = p->A.rs, crs = p->C.rs;
        if (p->M == 1) { /* a single row has no row stride yet: take the batch's */
            ars = p->A.bs[d];
            crs = p->C.bs[d];
        } else if (p->A.bs[d] != ars * p->M || p->C.bs[d] != crs * p->M) {
            break;
        }
        int64_t M = p->M * s;
        if (layout(M, p->K, ars, p->A.cs, &ld) != LAY_N || layout(M, p->N, crs, p->C.cs, &ld) != LAY_N)
            break;
        p->A.rs = ars;
        p->C.rs = crs;
        p->M = M;
        p->nb--;
    }
}

/* Drop size-1 batch dims and merge each into the next inner one when every
 * operand steps through the pair as through one dim. */
static void collapse(sg__mm_plan *p) {
    sg__mm_mat *m[3] = {&p->A, &p->B, &p->C};
    int w = 0;
    for (int d = 0; d < p->nb; d++) {
        if (p->bshape[d] == 1) continue;
        bool merge = w > 0;
        for (int i = 0; i < 3 && merge; i++) merge = m[i]->bs[w - 1] == m[i]->bs[d] * p->bshape[d];
        if (merge) {
            p->bshape[w - 1] *= p->bshape[d];
            for (int i = 0; i < 3; i++) m[i]->bs[w - 1] = m[i]->bs[d];
            continue;
        }
        p->bshape[w] = p->bshape[d];
        for (int i = 0; i < 3; i++) m[i]->bs[w] = m[i]->bs[d];
        w++;
    }
    p->nb = w;
}

void sg__mm_plan_make(const sg__node *n, sg__mm_plan *p) {
    const sg_tensor *a = n->in[0], *b = n->in[1], *out = n->out;
    memset(p, 0, sizeof *p);
    role ra, rb, rc;
    setup(n, p, &ra, &rb, &rc);
    int64_t st[SG_MAX_DIMS];
    p->copy_a = tensor_layout(a, ra) == LAY_NONE;
    if (p->copy_a) contiguous_strides(a->ndim, a->shape, st);
    mat_set(&p->A, a, ra, p->copy_a ? st : a->stride, p->nb);
    p->copy_b = tensor_layout(b, rb) == LAY_NONE;
    if (p->copy_b) contiguous_strides(b->ndim, b->shape, st);
    mat_set(&p->B, b, rb, p->copy_b ? st : b->stride, p->nb);
    p->copy_c = tensor_layout(out, rc) != LAY_N;
    if (p->copy_c) contiguous_strides(out->ndim, out->shape, st);
    mat_set(&p->C, out, rc, p->copy_c ? st : out->stride, p->nb);
    fold(p);
    collapse(p);
    p->bias = n->op == SG__OP_LINEAR && n->nin > 2 && n->in[2] != NULL;
}

bool sg__mm_lt_call(const sg__mm_plan *p, sg_dtype dt, sg__lt_call *c) {
    int64_t lda = 0, ldb = 0, ldc = 0;
    int la = layout(p->M, p->K, p->A.rs, p->A.cs, &lda);
    int lb = layout(p->K, p->N, p->B.rs, p->B.cs, &ldb);
    int lc = layout(p->M, p->N, p->C.rs, p->C.cs, &ldc);
    if (la == LAY_NONE || lb == LAY_NONE || lc != LAY_N) return false;
    memset(c, 0, sizeof *c);
    c->dtype = dt;
    /* C^T (N x M, column-major, ld = C's row stride) = B^T A^T. */
    c->m = p->N;
    c->n = p->M;
    c->k = p->K;
    c->transa = lb == LAY_T; /* B row-major is B^T column-major: no op */
    c->lda = ldb;
    c->transb = la == LAY_T;
    c->ldb = lda;
    c->ldc = ldc;
    c->batch = 1;
    if (p->nb > 0) {
        int d = p->nb - 1;
        c->batch = p->bshape[d];
        c->sa = p->B.bs[d];
        c->sb = p->A.bs[d];
        c->sc = p->C.bs[d];
    }
    return c->m <= INT_MAX && c->n <= INT_MAX && c->k <= INT_MAX && c->batch <= INT_MAX;
}

sg__mm_path sg__mm_path_env(void) {
    const char *e = getenv("SG_CUDA_MATMUL");
    if (e && strcmp(e, "lt") == 0) return SG__MM_LT;
    if (e && strcmp(e, "gemv") == 0) return SG__MM_GEMV;
    return SG__MM_AUTO;
}

bool sg__mm_prefer_gemv(const sg__mm_plan *p) {
    /* The weight (B read as w[n][k]) must be contiguous along K for the
     * 16-byte loads; a short K leaves most of a warp idle. */
    return p->M <= 8 && (p->B.rs == 1 || p->K == 1) && p->K >= 32;
}

/* ------------------------------------------------------------ padding (no device) */

static size_t round_up(size_t n) { return (n + 255) & ~(size_t)255; }

int64_t sg__mm_pad_ld(int64_t ld, sg_dtype dt) { return sg__pad_row_len(ld, sg_dtype_size(dt)); }

static bool misaligned(int64_t ld, sg_dtype dt) {
    return ld * (int64_t)sg_dtype_size(dt) % 16 != 0;
}

/* The scratch cap in bytes: SG_CUDA_MATMUL_PAD=<MiB>, 0 or off for no
 * padding, else SG__MM_PAD_BYTES. */
static size_t pad_cap(void) {
    const char *e = getenv("SG_CUDA_MATMUL_PAD");
    if (!e || !*e) return SG__MM_PAD_BYTES;
    if (strcmp(e, "off") == 0) return 0;
    char *end;
    long long mib = strtoll(e, &end, 10);
    return *end || mib < 0 ? SG__MM_PAD_BYTES : (size_t)mib << 20;
}

/* Rows of M per chunk: all mm of them, or as many (a multiple of 256) as
 * keep the padded A and C chunks within the cap (pad_cap). */
static int64_t pad_chunk(const sg__mm_plan *p, const sg__mm_pad *pad, sg_dtype dt) {
    int64_t es = (int64_t)sg_dtype_size(dt), row = 0;
    if (pad->a) row += pad->a_t ? pad->kp : sg__mm_pad_ld(pad->kp, dt);
    if (pad->c) row += sg__mm_pad_ld(p->N, dt);
    if (row == 0) return pad->mm;
    int64_t mc = (int64_t)pad_cap() / (row * es) / 256 * 256;
    if (mc < 256) mc = 256;
    return mc < pad->mm ? mc : pad->mm;
}

static int64_t gcd64(int64_t a, int64_t b) {
    while (b) {
        int64_t t = a % b;
        a = b, b = t;
    }
    return a;
}

/* Whether C goes in place in row classes (cublaslt.h): only C's rows
 * unaligned, A row-major and B read transposed (their per-class offsets
 * stay aligned), no bias (its pointer would shift by cshift per class), M a
 * multiple of the classes, and at least 7/8 of the columns in place. */
static void pad_classes(const sg__mm_plan *p, sg__mm_pad *pad, sg_dtype dt, int la, int lb,
                        int64_t ldc) {
    const char *e = getenv("SG_CUDA_MATMUL_CLASSES");
    if ((e && strcmp(e, "off") == 0) || !pad->c || pad->a || pad->b || pad->km != p->K ||
        pad->mm != p->M || la != LAY_N || lb != LAY_T || p->bias)
        return;
    int64_t q = 16 / (int64_t)sg_dtype_size(dt), r = ldc % q, g = q / gcd64(r, q), s = q - r;
    int64_t ncls = (p->N - s * (g - 1)) / q * q;
    if (p->M % g != 0 || ncls <= 0 || ncls * 8 < p->N * 7) return;
    pad->classes = g, pad->cshift = s, pad->ncls = ncls;
    pad->mchunk = p->M;
    /* the leftover columns: two batches of M rows of N - ncls (>= s * (g - 1)) */
    pad->bytes_c =
        round_up((size_t)(2 * p->M * sg__mm_pad_ld(p->N - ncls, dt)) * sg_dtype_size(dt));
}

bool sg__mm_pad_make(const sg__mm_plan *p, sg_dtype dt, sg__mm_pad *pad) {
    memset(pad, 0, sizeof *pad);
    if (pad_cap() == 0 || p->nb > 0 || p->copy_a || p->copy_b || p->copy_c) return false;
    if (p->M < 2 || p->N < 2 || p->K < 2 ||
        (double)p->M * (double)p->N * (double)p->K < (double)SG__MM_PAD_MIN)
        return false;
    int64_t lda = 0, ldb = 0, ldc = 0, q = 16 / (int64_t)sg_dtype_size(dt);
    int la = layout(p->M, p->K, p->A.rs, p->A.cs, &lda);
    int lb = layout(p->K, p->N, p->B.rs, p->B.cs, &ldb);
    int lc = layout(p->M, p->N, p->C.rs, p->C.cs, &ldc);
    if (la == LAY_NONE || lb == LAY_NONE || lc != LAY_N) return false;
    bool kpad = p->K % q != 0 && (la == LAY_N || lb == LAY_T); /* K contiguous in A or B */
    /* Both with aligned rows: K splits in place rather than being copied. */
    bool ksplit = kpad && p->K > q && !misaligned(lda, dt) && !misaligned(ldb, dt);
    kpad = kpad && !ksplit;
    pad->a = misaligned(lda, dt) || kpad, pad->a_t = pad->a && la == LAY_T;
    pad->b = misaligned(ldb, dt) || kpad, pad->b_t = pad->b && lb == LAY_T;
    pad->c = misaligned(ldc, dt);
    pad->kp = kpad ? sg__mm_pad_ld(p->K, dt) : p->K;
    pad->km = ksplit ? p->K - p->K % q : pad->kp;
    pad->nm = p->N > q ? p->N - p->N % q : p->N;
    pad->mm = la == LAY_T && p->M > q ? p->M - p->M % q : p->M;
    if (!pad->a && !pad->b && !pad->c && pad->nm == p->N && pad->mm == p->M && !ksplit)
        return false;
    size_t es = sg_dtype_size(dt);
    pad->mchunk = pad_chunk(p, pad, dt);
    if (pad->a) /* a chunk: mchunk rows of padded K, or K rows of padded mchunk */
        pad->bytes_a = round_up((size_t)(pad->a_t ? pad->kp * sg__mm_pad_ld(pad->mchunk, dt)
                                                  : pad->mchunk * sg__mm_pad_ld(pad->kp, dt)) *
                                es);
    if (pad->b) { /* B (K x N): K rows of padded N, or N rows of padded K */
        pad->ldb = sg__mm_pad_ld(pad->b_t ? pad->kp : p->N, dt);
        pad->bytes_b = round_up((size_t)((pad->b_t ? p->N : pad->kp) * pad->ldb) * es);
    }
    if (pad->c) pad->bytes_c = round_up((size_t)(pad->mchunk * sg__mm_pad_ld(p->N, dt)) * es);
    pad_classes(p, pad, dt, la, lb, ldc);
    return true;
}

bool sg__mm_pad_note(const sg__node *n, char *buf, size_t size) {
    if (size) buf[0] = '\0';
    if (n->op != SG__OP_MATMUL && n->op != SG__OP_LINEAR) return false;
    sg__mm_plan p;
    sg__mm_plan_make(n, &p);
    sg__mm_pad pad;
    sg_dtype dt = n->out->dtype;
    sg__mm_path path = sg__mm_path_env();
    if (path == SG__MM_GEMV || (path == SG__MM_AUTO && sg__mm_prefer_gemv(&p)) ||
        !sg__mm_pad_make(&p, dt, &pad))
        return false;
    if (pad.classes) {
        int64_t left = pad.cshift * (pad.classes - 1);
        snprintf(buf, size,
                 "M=%lld N=%lld K=%lld is not 16-byte aligned: C in place in %lld row classes "
                 "(rows %lld apart, columns from %lld * class, %lld each), columns 0..%lld and "
                 "%lld..%lld through %zu bytes of scratch",
                 (long long)p.M, (long long)p.N, (long long)p.K, (long long)pad.classes,
                 (long long)pad.classes, (long long)pad.cshift, (long long)pad.ncls,
                 (long long)left, (long long)pad.ncls, (long long)p.N, pad.bytes_c);
        return true;
    }
    int64_t chunks = (pad.mm + pad.mchunk - 1) / pad.mchunk + (pad.mm < p.M);
    char kz[64] = "", ns[64] = "";
    if (pad.kp > p.K) snprintf(kz, sizeof kz, ", K zero-padded to %lld", (long long)pad.kp);
    if (pad.km < pad.kp)
        snprintf(kz, sizeof kz, ", K as %lld + %lld", (long long)pad.km, (long long)(p.K - pad.km));
    if (pad.nm < p.N)
        snprintf(ns, sizeof ns, ", N as %lld + %lld", (long long)pad.nm, (long long)(p.N - pad.nm));
    snprintf(
        buf, size,
        "M=%lld N=%lld K=%lld is not 16-byte aligned: A %s, B %s, C %s%s%s; %zu bytes of scratch, "
        "%lld chunk%s of up to %lld rows",
        (long long)p.M, (long long)p.N, (long long)p.K, pad.a ? "copied" : "in place",
        pad.b ? "copied" : "in place", pad.c ? "written to scratch" : "in place", kz, ns,
        pad.bytes_a + pad.bytes_b + pad.bytes_c, (long long)chunks, chunks > 1 ? "s" : "",
        (long long)pad.mchunk);
    return true;
}

#ifdef SG_HAVE_CUDA_HEADERS

/* ------------------------------------------------------------ launches */

/* These mirror the structs of k_matmul.cu field for field. */
typedef struct gemv_args {
    int64_t M, N, K;
    int64_t a_rs, a_cs, w_ns, w_ks, c_rs, c_cs, bias_s;
    int64_t a_bs, w_bs, c_bs;
    int32_t vec, has_bias;
} gemv_args;

typedef struct geom {
    int64_t n;
    int64_t shape[SG_MAX_DIMS], ss[SG_MAX_DIMS], ds[SG_MAX_DIMS];
    int32_t nd, pad;
} geom;

#define GEMV_ROWS 8
#define GEMV_WARPS 8
#define MAX_GRID_Y 65535

static sg_status kernel(sg_ctx *ctx, const char *what, sg_dtype dt, void **f) {
    char name[64];
    snprintf(name, sizeof name, "sg_mm_%s_%s", what, sg_dtype_name(dt));
    return sg__cuda_kernel(ctx, SG__CU_MATMUL, name, f);
}

/* A walk over a tensor of (ndim, shape), read at src strides and written at
 * dst strides; a 0-d tensor walks as one element. */
static void geom_set(geom *g, int ndim, const int64_t *shape, const int64_t *ss, const int64_t *ds) {
    memset(g, 0, sizeof *g);
    g->nd = ndim ? ndim : 1;
    g->shape[0] = 1;
    for (int d = 0; d < ndim; d++) {
        g->shape[d] = shape[d];
        g->ss[d] = ss ? ss[d] : 0;
        g->ds[d] = ds[d];
    }
    g->n = sg__numel(ndim, shape);
}

static void elementwise_grid(sg_ctx *ctx, int64_t n, unsigned grid[3], unsigned block[3]) {
    int64_t blocks = (n + 255) / 256, cap = (int64_t)sg__cuda_sm_count(ctx) * 8;
    grid[0] = (unsigned)(blocks < cap ? blocks : cap), grid[1] = grid[2] = 1;
    block[0] = 256, block[1] = block[2] = 1;
}

static sg_status copy(sg_ctx *ctx, sg_dtype dt, const void *src, void *dst, geom *g) {
    void *f;
    sg_status s = kernel(ctx, "copy", dt, &f);
    if (s != SG_OK) return s;
    unsigned grid[3], block[3];
    elementwise_grid(ctx, g->n, grid, block);
    void *args[3] = {&src, &dst, g};
    return sg__cuda_launch(ctx, f, grid, block, 0, args);
}

/* dst (a tensor of out's shape at strides ds) set to the bias row or zeros. */
static sg_status fill(sg_ctx *ctx, const sg_tensor *out, void *dst, const int64_t *ds,
                      const sg_tensor *bias) {
    void *f;
    sg_status s = kernel(ctx, "fill", out->dtype, &f);
    if (s != SG_OK) return s;
    geom g;
    geom_set(&g, out->ndim, out->shape, NULL, ds);
    const void *bp = bias ? sg__data(bias) : NULL;
    int64_t bs = bias ? bias->stride[0] : 0;
    unsigned grid[3], block[3];
    elementwise_grid(ctx, g.n, grid, block);
    void *args[4] = {&dst, &bp, &bs, &g};
    return sg__cuda_launch(ctx, f, grid, block, 0, args);
}

/* Pointers of one product: A, B, C at their element 0 and the bias. */
typedef struct ptrs {
    const char *a, *b;
    char *c;
    const void *bias;
    int64_t bias_s;
} ptrs;

static bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* The GEMV kernel over one batch dim of nbatch (grid.y), every M rows in
 * launches of 8. */
static sg_status run_gemv(sg_ctx *ctx, const sg__mm_plan *p, sg_dtype dt, const ptrs *q, int64_t nbatch,
                          int64_t a_bs, int64_t b_bs, int64_t c_bs) {
    void *f;
    sg_status s = kernel(ctx, "gemv", dt, &f);
    if (s != SG_OK) return s;
    int64_t es = (int64_t)sg_dtype_size(dt);
    gemv_args g = {.N = p->N, .K = p->K, .a_rs = p->A.rs, .a_cs = p->A.cs, .w_ns = p->B.cs,
                   .w_ks = p->B.rs, .c_rs = p->C.rs, .c_cs = p->C.cs, .bias_s = q->bias_s,
                   .a_bs = a_bs, .w_bs = b_bs, .c_bs = c_bs, .has_bias = q->bias != NULL};
    int64_t gx = (p->N + GEMV_WARPS - 1) / GEMV_WARPS;
    if (gx > INT_MAX)
        return sg__fail(ctx, SG_ERR_UNSUPPORTED, "cuda: matmul with N=%lld is beyond the GEMV "
                        "kernel's grid; split the product", (long long)p->N);
    for (int64_t m0 = 0; m0 < p->M; m0 += GEMV_ROWS) {
        g.M = p->M - m0 < GEMV_ROWS ? p->M - m0 : GEMV_ROWS;
        for (int64_t b0 = 0; b0 < nbatch; b0 += MAX_GRID_Y) {
            int64_t nb = nbatch - b0 < MAX_GRID_Y ? nbatch - b0 : MAX_GRID_Y;
            const void *a = q->a + (m0 * p->A.rs + b0 * a_bs) * es, *w = q->b + b0 * b_bs * es;
            void *c = q->c + (m0 * p->C.rs + b0 * c_bs) * es;
            /* 16-byte loads need every row of A and W (in every batch) to start aligned. */
            g.vec = g.a_cs == 1 && g.w_ks == 1 && aligned16(a) && aligned16(w) &&
                    (g.M == 1 || (g.a_rs * es) % 16 == 0) && (p->N == 1 || (g.w_ns * es) % 16 == 0) &&
                    (nb == 1 || ((a_bs * es) % 16 == 0 && (b_bs * es) % 16 == 0));
            unsigned grid[3] = {(unsigned)gx, (unsigned)nb, 1}, block[3] = {32, GEMV_WARPS, 1};
            const void *bias = q->bias;
            void *args[5] = {&a, &w, &bias, &c, &g};
            s = sg__cuda_launch(ctx, f, grid, block, 0, args);
            if (s != SG_OK) return s;
        }
    }
    return SG_OK;
}

/* Every outer batch (all batch dims but the last) as one call of fn. */
typedef sg_status (*batch_fn)(sg_ctx *ctx, const sg__mm_plan *p, sg_dtype dt, const ptrs *q,
                              void *user);

static sg_status each_outer(sg_ctx *ctx, const sg__mm_plan *p, sg_dtype dt, const ptrs *q,
                            batch_fn fn, void *user) {
    int outer_dims = p->nb > 0 ? p->nb - 1 : 0;
    int64_t count = sg__numel(outer_dims, p->bshape), es = (int64_t)sg_dtype_size(dt);
    for (int64_t i = 0; i < count; i++) {
        int64_t rem = i, oa = 0, ob = 0, oc = 0;
        for (int d = outer_dims - 1; d >= 0; d--) {
            int64_t k = rem % p->bshape[d];
            rem /= p->bshape[d];
            oa += k * p->A.bs[d], ob += k * p->B.bs[d], oc += k * p->C.bs[d];
        }
        ptrs qi = {q->a + oa * es, q->b + ob * es, q->c + oc * es, q->bias, q->bias_s};
        sg_status s = fn(ctx, p, dt, &qi, user);
        if (s != SG_OK) return s;
    }
    return SG_OK;
}

static sg_status gemv_batch(sg_ctx *ctx, const sg__mm_plan *p, sg_dtype dt, const ptrs *q, void *user) {
    (void)user;
    int d = p->nb - 1;
    if (d < 0) return run_gemv(ctx, p, dt, q, 1, 0, 0, 0);
    return run_gemv(ctx, p, dt, q, p->bshape[d], p->A.bs[d], p->B.bs[d], p->C.bs[d]);
}

typedef struct lt_user {
    sg__lt_call call;
    bool ran; /* false once cuBLASLt had no algorithm */
} lt_user;

static sg_status lt_batch(sg_ctx *ctx, const sg__mm_plan *p, sg_dtype dt, const ptrs *q, void *user) {
    (void)p, (void)dt;
    lt_user *u = user;
    if (!u->ran) return SG_OK;
    /* cuBLASLt's A is our B, its B our A. */
    return sg__lt_matmul(ctx, &u->call, q->b, q->a, q->c, q->bias, &u->ran);
}

/* dst (rows x cols, leading dim dld) from src (leading dim sld) over its
 * first srows x scols, zeros elsewhere. */
static sg_status pitch_copy(sg_ctx *ctx, sg_dtype dt, const void *src, int64_t sld, void *dst,
                            int64_t dld, int64_t rows, int64_t cols, int64_t srows, int64_t scols) {
    void *f;
    sg_status s = kernel(ctx, "pitch", dt, &f);
    if (s != SG_OK) return s;
    int64_t gx = (cols + 2047) / 2048; /* PITCH_COLS in k_matmul.cu */
    unsigned grid[3] = {(unsigned)gx, (unsigned)(rows < MAX_GRID_Y ? rows : MAX_GRID_Y), 1};
    unsigned block[3] = {256, 1, 1};
    void *args[8] = {&src, &dst, &rows, &cols, &sld, &dld, &srows, &scols};
    return sg__cuda_launch(ctx, f, grid, block, 0, args);
}

/* A's rows m0.. (mc of them) into aligned scratch sa, K padded with zeros
 * to kp; c's strides for A set. */
static sg_status pad_a(sg_ctx *ctx, const sg__mm_plan *p, const sg__mm_pad *pad, sg_dtype dt,
                       const char *a, char *sa, int64_t mc, sg__mm_plan *c) {
    if (pad->a_t) { /* stored as K rows of M */
        int64_t ld = sg__mm_pad_ld(mc, dt);
        c->A.rs = 1, c->A.cs = ld;
        return pitch_copy(ctx, dt, a, p->A.cs, sa, ld, pad->kp, mc, p->K, mc);
    }
    int64_t ld = sg__mm_pad_ld(pad->kp, dt);
    c->A.rs = ld, c->A.cs = 1;
    return pitch_copy(ctx, dt, a, p->A.rs, sa, ld, mc, pad->kp, mc, p->K);
}

/* B into aligned scratch sb, K padded with zeros to kp; c's strides for B set. */
static sg_status pad_b(sg_ctx *ctx, const sg__mm_plan *p, const sg__mm_pad *pad, sg_dtype dt,
                       const char *b, char *sb, sg__mm_plan *c) {
    if (pad->b_t) { /* stored as N rows of K */
        c->B.rs = 1, c->B.cs = pad->ldb;
        return pitch_copy(ctx, dt, b, p->B.cs, sb, pad->ldb, p->N, pad->kp, p->N, p->K);
    }
    c->B.rs = pad->ldb, c->B.cs = 1;
    return pitch_copy(ctx, dt, b, p->B.rs, sb, pad->ldb, pad->kp, p->N, p->K, p->N);
}

/* Columns n0 .. n0 + nn of plan c's product: one cuBLASLt call over K's
 * first km, and a second that adds the rest's product when km < K. */
static sg_status lt_columns(sg_ctx *ctx, const sg__mm_plan *c, sg_dtype dt, const char *a,
                            const char *b, char *cp, const ptrs *q, int64_t n0, int64_t nn,
                            int64_t km, bool *ran) {
    int64_t es = (int64_t)sg_dtype_size(dt);
    sg_status s = SG_OK;
    *ran = true;
    for (int64_t k0 = 0; s == SG_OK && *ran && k0 < c->K; k0 += km, km = c->K - km) {
        sg__mm_plan cn = *c;
        cn.N = nn, cn.K = km;
        sg__lt_call call;
        if (!sg__mm_lt_call(&cn, dt, &call)) {
            *ran = false;
            return SG_OK;
        }
        call.bias = q->bias != NULL && k0 == 0;
        call.accumulate = k0 > 0;
        const char *bias = call.bias ? (const char *)q->bias + n0 * q->bias_s * es : NULL;
        s = sg__lt_matmul(ctx, &call, b + (n0 * c->B.cs + k0 * c->B.rs) * es, a + k0 * c->A.cs * es,
                          cp + n0 * c->C.cs * es, bias, ran);
    }
    return s;
}

/*
 * Plan p through aligned scratch (sg__mm_pad): B copied once, then per
 * chunk of rows A copied, the aligned columns in one cuBLASLt call and the
 * rest in another, C copied out. *ran is false when cuBLASLt had no
 * algorithm for a call: the caller runs the product unpadded, which
 * rewrites every row.
 */
static sg_status run_padded(sg_ctx *ctx, const sg__mm_plan *p, const sg__mm_pad *pad, sg_dtype dt,
                            const ptrs *q, char *scratch, bool *ran) {
    int64_t es = (int64_t)sg_dtype_size(dt);
    char *sa = scratch, *sb = scratch + pad->bytes_a, *sc = sb + pad->bytes_b;
    sg__mm_plan c = *p;
    const char *b = q->b;
    sg_status s = SG_OK;
    c.K = pad->kp;
    if (pad->b) s = pad_b(ctx, p, pad, dt, q->b, sb, &c), b = sb;
    if (pad->c) c.C.rs = sg__mm_pad_ld(p->N, dt), c.C.cs = 1;
    *ran = true;
    for (int64_t m0 = 0, mc; s == SG_OK && *ran && m0 < p->M; m0 += mc) {
        mc = m0 < pad->mm ? (pad->mm - m0 < pad->mchunk ? pad->mm - m0 : pad->mchunk) : p->M - m0;
        const char *a = q->a + m0 * p->A.rs * es;
        char *cp = pad->c ? sc : q->c + m0 * p->C.rs * es;
        c.M = mc;
        if (pad->a) s = pad_a(ctx, p, pad, dt, a, sa, mc, &c), a = sa;
        if (s == SG_OK) s = lt_columns(ctx, &c, dt, a, b, cp, q, 0, pad->nm, pad->km, ran);
        if (s == SG_OK && *ran && pad->nm < p->N)
            s = lt_columns(ctx, &c, dt, a, b, cp, q, pad->nm, p->N - pad->nm, pad->km, ran);
        if (s == SG_OK && *ran && pad->c)
            s = pitch_copy(ctx, dt, sc, c.C.rs, q->c + m0 * p->C.rs * es, p->C.rs, mc, p->N, mc,
                           p->N);
    }
    return s;
}

/* Columns of each row-class call: SG_CUDA_MATMUL_CLASSES=<n> (rounded down
 * to 16 bytes), else all ncls when B's rows for them fit in a quarter of the
 * L2 (12 MiB when the device does not say), else ncls in equal calls of a
 * multiple of 256 columns that each fit about that. */
static int64_t class_cols(sg_ctx *ctx, const sg__mm_plan *p, const sg__mm_pad *pad, sg_dtype dt) {
    int64_t es = (int64_t)sg_dtype_size(dt), q = 16 / es;
    const char *e = getenv("SG_CUDA_MATMUL_CLASSES");
    if (e && *e) {
        char *end;
        long long n = strtoll(e, &end, 10);
        if (!*end && n > 0) {
            int64_t nc = n < q ? q : (int64_t)n / q * q;
            return nc < pad->ncls ? nc : pad->ncls;
        }
    }
    size_t l2 = sg__cuda_l2_bytes(ctx);
    int64_t fit = (int64_t)((l2 ? l2 / 4 : (size_t)12 << 20) / (size_t)(p->K * es));
    if (fit >= pad->ncls) return pad->ncls;
    int64_t calls = (pad->ncls + fit - 1) / (fit > 0 ? fit : 1);
    int64_t nc = ((pad->ncls + calls - 1) / calls + 255) / 256 * 256;
    return nc < pad->ncls ? nc : pad->ncls;
}

/*
 * Plan p with C written in place in row classes (sg__mm_pad.classes, see
 * cublaslt.h): per chunk of columns one strided-batch call over the
 * classes, then the columns no class covers through scratch: one call of
 * two batches (columns 0.. and ncls.., N - ncls of each) and two copies out.
 * *ran as run_padded's.
 */
static sg_status run_classes(sg_ctx *ctx, const sg__mm_plan *p, const sg__mm_pad *pad, sg_dtype dt,
                             const ptrs *q, char *scratch, bool *ran) {
    int64_t es = (int64_t)sg_dtype_size(dt), g = pad->classes, w = p->N - pad->ncls;
    sg__mm_plan c = *p;
    c.M = p->M / g, c.A.rs = p->A.rs * g, c.C.rs = p->C.rs * g;
    c.nb = 1, c.bshape[0] = g;
    c.A.bs[0] = p->A.rs, c.B.bs[0] = pad->cshift * p->B.cs, c.C.bs[0] = p->C.rs + pad->cshift;
    int64_t nc = class_cols(ctx, p, pad, dt);
    sg__lt_call call;
    memset(&call, 0, sizeof call);
    sg_status s = SG_OK;
    *ran = true;
    for (int64_t n0 = 0; s == SG_OK && *ran && n0 < pad->ncls; n0 += nc) {
        c.N = pad->ncls - n0 < nc ? pad->ncls - n0 : nc;
        if (!sg__mm_lt_call(&c, dt, &call)) return *ran = false, SG_OK;
        s = sg__lt_matmul(ctx, &call, q->b + n0 * p->B.cs * es, q->a, q->c + n0 * es, NULL, ran);
    }
    /* The leftovers: batch 0 columns 0 .. ld, batch 1 columns N - ld .. N
     * (ld: w rounded up to 16 bytes, so that the call's result rows are whole
     * vectors -- an odd width gets cuBLASLt's align1 kernels, ~5x slower);
     * batch 1's columns ncls .. N start w - ld into its rows. B's columns
     * are rows of 16-byte multiples (read transposed, not padded), so any
     * column start is aligned. */
    sg__mm_plan l = *p;
    int64_t ld = sg__mm_pad_ld(w, dt), left = pad->cshift * (g - 1);
    int64_t lw = ld <= p->N ? ld : w, b1 = p->N - lw;
    l.N = lw, l.C.rs = ld, l.C.cs = 1;
    l.nb = 1, l.bshape[0] = 2;
    l.A.bs[0] = 0, l.B.bs[0] = b1 * p->B.cs, l.C.bs[0] = p->M * ld;
    if (s != SG_OK || !*ran) return s;
    if (!sg__mm_lt_call(&l, dt, &call)) return *ran = false, SG_OK;
    s = sg__lt_matmul(ctx, &call, q->b, q->a, scratch, NULL, ran);
    if (s == SG_OK && !*ran) { /* no algorithm for the two batches: a call each */
        l.nb = 0;
        if (!sg__mm_lt_call(&l, dt, &call)) return SG_OK;
        *ran = true;
        for (int b = 0; s == SG_OK && *ran && b < 2; b++)
            s = sg__lt_matmul(ctx, &call, q->b + b * b1 * p->B.cs * es, q->a,
                              scratch + b * p->M * ld * es, NULL, ran);
    }
    if (s == SG_OK && *ran)
        s = pitch_copy(ctx, dt, scratch, ld, q->c, p->C.rs, p->M, left, p->M, left);
    if (s == SG_OK && *ran)
        s = pitch_copy(ctx, dt, scratch + (p->M * ld + pad->ncls - b1) * es, ld,
                       q->c + pad->ncls * es, p->C.rs, p->M, w, p->M, w);
    return s;
}

/* ------------------------------------------------------------ GEMV or cuBLASLt, tuned */

typedef struct gemv_alt {
    const sg__mm_plan *p;
    sg_dtype dt;
    const ptrs *q;
} gemv_alt;

static sg_status gemv_run(sg_ctx *ctx, void *user) {
    const gemv_alt *g = user;
    return each_outer(ctx, g->p, g->dt, g->q, gemv_batch, NULL);
}

/* For a product of at most 8 rows that both could run in place (no packed
 * operand, result or bias, no padding, one cuBLASLt call): GEMV or not, as
 * max-autotune picked it (timed against cuBLASLt's algorithms in the tuning
 * run, remembered after); gemv, the choice without tuning, otherwise. */
static bool tuned_gemv(sg_ctx *ctx, const sg__node *n, const sg__mm_plan *p, sg_dtype dt,
                       bool gemv) {
    const sg_tensor *bias = n->op == SG__OP_LINEAR ? n->in[2] : NULL;
    sg__lt_call call;
    sg__mm_pad pad;
    if (!sg__lt_scoped(ctx) || p->M > 8 || p->nb > 1 || p->copy_a || p->copy_b || p->copy_c ||
        (bias && bias->stride[0] != 1 && bias->shape[0] > 1) || !sg__mm_lt_call(p, dt, &call) ||
        sg__mm_pad_make(p, dt, &pad))
        return gemv;
    call.bias = bias != NULL;
    ptrs q = {sg__data(n->in[0]), sg__data(n->in[1]), sg__data(n->out),
              bias ? sg__data(bias) : NULL, bias ? bias->stride[0] : 0};
    gemv_alt g = {p, dt, &q};
    /* cuBLASLt's A is our B, its B our A. */
    return sg__lt_prefer_gemv(ctx, &call, q.b, q.a, q.c, q.bias, gemv_run, &g, gemv);
}

/* ------------------------------------------------------------ epilogues in the call */

/*
 * Node n's product with the epilogue member e of its fused group computed
 * by cuBLASLt (sg__group.lib_epi): GELU or RELU after the bias into e's
 * result (with aux, the product also into n's own result, which GELU_AUX
 * writes), beta = 1 with C = e's input `res` (a residual of the result's
 * layout) and D = e's result, or DGELU: e's result = gelu'(e's input `res`,
 * read as the aux) * the product, for a product without a bias. Only for a
 * product that runs as one cuBLASLt call in place (no packed operand or
 * result, no batch left, no padding, not GEMV); *took false (nothing run)
 * otherwise, or when cuBLASLt has no algorithm with that epilogue
 * (cublaslt.c logs it), or SG_CUDA_LT_EPILOGUE leaves it out: the caller runs
 * the product and the group's epilogue kernel.
 */
/* SG_CUDA_LT_EPILOGUE: "off" (or "0") keeps every epilogue in the group's
 * kernel; a comma list of gelu, relu, add, dgelu lets cuBLASLt take only those;
 * unset, all of them. */
static bool epi_allowed(int epi) {
    const char *v = getenv("SG_CUDA_LT_EPILOGUE");
    if (!v) return true;
    const char *name = epi == SG__EPI_GELU    ? "gelu"
                       : epi == SG__EPI_RELU  ? "relu"
                       : epi == SG__EPI_DGELU ? "dgelu"
                                              : "add";
    size_t len = strlen(name);
    for (const char *p = v; (p = strstr(p, name)); p += len)
        if ((p == v || p[-1] == ',') && (p[len] == '\0' || p[len] == ',')) return true;
    return false;
}

sg_status sg__cuda_matmul_epi(sg_ctx *ctx, const sg__node *n, const sg__node *e, int epi, int res,
                              bool aux, bool *took) {
    const sg_tensor *a = n->in[0], *out = n->out;
    const sg_tensor *bias = n->op == SG__OP_LINEAR ? n->in[2] : NULL;
    sg_dtype dt = out->dtype;
    *took = false;
    if (sg__cuda_is_hip(ctx) || sg__numel(out->ndim, out->shape) == 0 ||
        a->shape[a->ndim - 1] == 0 || !epi_allowed(epi))
        return SG_OK;
    sg__mm_plan p;
    sg__mm_plan_make(n, &p);
    sg__mm_path path = sg__mm_path_env();
    sg__lt_call call;
    sg__mm_pad pad;
    if (path == SG__MM_GEMV || (path == SG__MM_AUTO && (p.M <= 8 || sg__mm_prefer_gemv(&p))) ||
        p.copy_a || p.copy_b || p.copy_c || p.nb > 0 ||
        (bias && bias->stride[0] != 1 && bias->shape[0] > 1) || !sg__mm_lt_call(&p, dt, &call) ||
        sg__mm_pad_make(&p, dt, &pad) || ((aux || epi == SG__EPI_DGELU) && call.ldc % 8 != 0) ||
        (epi == SG__EPI_DGELU && bias))
        return SG_OK;
    call.bias = bias != NULL;
    call.act = epi == SG__EPI_GELU    ? SG__LT_ACT_GELU
               : epi == SG__EPI_RELU  ? SG__LT_ACT_RELU
               : epi == SG__EPI_DGELU ? SG__LT_ACT_DGELU
                                      : 0;
    call.aux = (epi == SG__EPI_GELU && aux) || epi == SG__EPI_DGELU;
    call.accumulate = epi == SG__EPI_ADD;
    const void *cin = epi == SG__EPI_ADD ? sg__data(e->in[res]) : NULL;
    /* GELU_AUX writes the product beside the result; DGELU reads the GELU's input. */
    const void *auxp = !call.aux              ? NULL
                       : epi == SG__EPI_DGELU ? sg__data(e->in[res])
                                              : sg__data(out);
    /* cuBLASLt's A is our B, its B our A. */
    return sg__lt_matmul_epi(ctx, &call, sg__data(n->in[1]), sg__data(a), cin, sg__data(e->out),
                             bias ? sg__data(bias) : NULL, (void *)auxp, took);
}

/* ------------------------------------------------------------ the family */

sg_status sg__cuda_matmul(sg_ctx *ctx, const sg__node *n) {
    const sg_tensor *a = n->in[0], *b = n->in[1], *out = n->out;
    const sg_tensor *bias = n->op == SG__OP_LINEAR ? n->in[2] : NULL;
    sg_dtype dt = out->dtype;
    if (sg__numel(out->ndim, out->shape) == 0) return SG_OK;
    if (a->shape[a->ndim - 1] == 0) /* K = 0: the bias, or zeros */
        return fill(ctx, out, sg__data(out), out->stride, bias);
    sg__mm_plan p;
    sg__mm_plan_make(n, &p);
    /* HIP has no cuBLASLt: the GEMV kernel runs every product there. */
    sg__mm_path path = sg__cuda_is_hip(ctx) ? SG__MM_GEMV : sg__mm_path_env();
    bool gemv = path == SG__MM_GEMV || (path == SG__MM_AUTO && sg__mm_prefer_gemv(&p));
    if (path == SG__MM_AUTO && p.M <= 8) gemv = tuned_gemv(ctx, n, &p, dt, gemv);
    lt_user lt = {.ran = true};
    if (!gemv && !sg__mm_lt_call(&p, dt, &lt.call)) {
        if (p.M > INT_MAX || p.N > INT_MAX || p.K > INT_MAX)
            return sg__fail(ctx, SG_ERR_UNSUPPORTED, "sg_%s: M=%lld, N=%lld, K=%lld exceed the "
                            "32-bit sizes cuBLASLt takes; split the product", sg__op_name(n->op),
                            (long long)p.M, (long long)p.N, (long long)p.K);
        gemv = true; /* a batch beyond 32 bits: the kernel loops */
    }

    /* Scratch: packed A, packed B, the result before it is copied out, a
     * contiguous bias for the epilogue. */
    size_t es = sg_dtype_size(dt);
    size_t na = p.copy_a ? round_up((size_t)sg__numel(a->ndim, a->shape) * es) : 0;
    size_t nbb = p.copy_b ? round_up((size_t)sg__numel(b->ndim, b->shape) * es) : 0;
    size_t nc = p.copy_c ? round_up((size_t)sg__numel(out->ndim, out->shape) * es) : 0;
    bool pack_bias = !gemv && bias && bias->stride[0] != 1 && bias->shape[0] > 1;
    size_t nbias = pack_bias ? round_up((size_t)bias->shape[0] * es) : 0;
    sg__mm_pad pad;
    bool padded = !gemv && sg__mm_pad_make(&p, dt, &pad);
    size_t npad = padded ? pad.bytes_a + pad.bytes_b + pad.bytes_c : 0;
    char *scratch = NULL;
    sg_status s = SG_OK;
    if (na + nbb + nc + nbias + npad > 0) {
        void *sp;
        s = sg__cuda_scratch(ctx, na + nbb + nc + nbias + npad, &sp);
        if (s != SG_OK) return s;
        scratch = sp;
    }
    ptrs q = {sg__data(a), sg__data(b), sg__data(out), bias ? sg__data(bias) : NULL,
              bias ? bias->stride[0] : 0};
    int64_t st[SG_MAX_DIMS];
    geom g;
    if (p.copy_a) {
        contiguous_strides(a->ndim, a->shape, st);
        geom_set(&g, a->ndim, a->shape, a->stride, st);
        s = copy(ctx, dt, q.a, scratch, &g);
        q.a = scratch;
    }
    if (s == SG_OK && p.copy_b) {
        contiguous_strides(b->ndim, b->shape, st);
        geom_set(&g, b->ndim, b->shape, b->stride, st);
        s = copy(ctx, dt, q.b, scratch + na, &g);
        q.b = scratch + na;
    }
    if (p.copy_c) q.c = scratch + na + nbb;
    if (s == SG_OK && pack_bias) {
        int64_t one = 1;
        geom_set(&g, 1, bias->shape, bias->stride, &one);
        s = copy(ctx, dt, q.bias, scratch + na + nbb + nc, &g);
        q.bias = scratch + na + nbb + nc;
        q.bias_s = 1;
    }
    if (s != SG_OK) return s;

    bool done = false;
    if (padded) { /* a plan with no packed operand: q is untouched but the bias */
        char *sp = scratch + na + nbb + nc + nbias;
        s = pad.classes ? run_classes(ctx, &p, &pad, dt, &q, sp, &done)
                        : run_padded(ctx, &p, &pad, dt, &q, sp, &done);
        if (s != SG_OK) return s;
    }
    if (!gemv && !done) {
        lt.call.bias = bias != NULL;
        s = each_outer(ctx, &p, dt, &q, lt_batch, &lt);
        if (s == SG_OK && !lt.ran && bias) {
            /* No algorithm with the bias epilogue: the bias goes into C
             * first and the product is added to it. */
            contiguous_strides(out->ndim, out->shape, st);
            s = fill(ctx, out, q.c, p.copy_c ? st : out->stride, bias);
            lt.call.bias = false;
            lt.call.accumulate = true;
            lt.ran = true;
            ptrs nq = q;
            nq.bias = NULL;
            if (s == SG_OK) s = each_outer(ctx, &p, dt, &nq, lt_batch, &lt);
        }
        if (s == SG_OK && !lt.ran) gemv = true; /* logged by cublaslt.c, once per shape */
    }
    if (s == SG_OK && gemv) s = each_outer(ctx, &p, dt, &q, gemv_batch, NULL);
    if (s == SG_OK && p.copy_c) {
        contiguous_strides(out->ndim, out->shape, st);
        geom_set(&g, out->ndim, out->shape, st, out->stride);
        s = copy(ctx, dt, q.c, sg__data(out), &g);
    }
    return s;
}

#endif /* SG_HAVE_CUDA_HEADERS */
