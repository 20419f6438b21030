/* SPDX-License-Identifier: MIT */
/*
 * cpu_matmul.c -- the eager CPU kernel of the matmul family (matmul, linear).
 * Every batch of the broadcast problem is one cblas_sgemm on f32 matrices;
 * there is no hand-written GEMM.
 *
 * Operands that BLAS can read as they are (f32 whose last two dims are a
 * row-major matrix, or the transpose of one) are passed in place, with
 * CblasTrans for the transposed case. Anything else (f16/bf16, sliced or
 * expanded matrices) is first packed into a contiguous f32 copy of the
 * operand (its own shape: a broadcast operand is not repeated). The result
 * goes straight into the output when that is f32 and row-major, else into an
 * f32 buffer that is rounded into the output once at the end.
 *
 * Batch dims along which B stays fixed and A and C step by whole matrices
 * fold into M, so that x (B, T, K) @ w^T is one (B*T) x K sgemm, not B
 * small ones. The remaining batches run one sgemm at a time (OpenBLAS
 * threads each call), except when there are many small ones: those run in
 * an OpenMP loop, one single-threaded sgemm per batch.
 *
 * A product of a few rows (at most GEMV_ROWS after folding: a decode step)
 * by an f16/bf16 matrix reads that matrix in place instead (gemv_half):
 * BLAS here has no half-precision product (OpenBLAS as Debian builds it
 * lacks sbgemm), and converting the whole matrix to f32 on every call
 * moves three times its bytes for a product that reads it once.
 */
#include "cpu.h"

#include <cblas.h>
#include <limits.h>
#include <stdio.h>

/*
 * OpenBLAS runs an sgemm of at most this many multiply-adds (M*N*K) on the
 * calling thread (SMP_THRESHOLD_MIN * GEMM_MULTITHREAD_THRESHOLD in its
 * interface/gemm.c), so calls this small can run side by side in an OpenMP
 * loop without its own threads joining in.
 */
#define SMALL_GEMM 262144.0

/* Staging rows are converted in chunks (gathers take an int count). */
#define CHUNK 4096

/* An f32 matrix operand: element (0, 0) of batch 0, row and column strides,
 * and its stride along each batch dim (0 where it is broadcast). */
typedef struct mat {
    float *p;
    int64_t rs, cs;
    int64_t bs[SG_MAX_DIMS];
} mat;

/* C[b] = A[b] (M x K) @ B[b] (K x N) for every index b of bshape. */
typedef struct gemm {
    int nb;
    int64_t bshape[SG_MAX_DIMS];
    int64_t M, N, K;
    mat A, B, C;
} gemm;

typedef sg__mm_role role; /* backend.h */

enum { LAY_NONE = -1, LAY_N, LAY_T };

/*
 * How BLAS can read an R x C matrix with strides (rs, cs): as row-major with
 * leading dim rs (LAY_N), or as the transpose of a row-major C x R matrix
 * with leading dim cs (LAY_T). Strides of dims of size 1 do not matter.
 */
static int layout(int64_t R, int64_t C, int64_t rs, int64_t cs, int64_t *ld) {
    int64_t min_n = C > 1 ? C : 1, min_t = R > 1 ? R : 1;
    if ((C <= 1 || cs == 1) && (R <= 1 || rs >= min_n)) {
        *ld = R <= 1 ? min_n : rs;
        return *ld <= INT_MAX ? LAY_N : LAY_NONE;
    }
    if ((R <= 1 || rs == 1) && (C <= 1 || cs >= min_t)) {
        *ld = C <= 1 ? min_t : cs;
        return *ld <= INT_MAX ? LAY_T : LAY_NONE;
    }
    return LAY_NONE;
}

static int64_t role_size(const sg_tensor *t, int dim) { return dim >= 0 ? t->shape[dim] : 1; }

static int tensor_layout(const sg_tensor *t, role r, const int64_t *stride) {
    int64_t ld;
    return layout(role_size(t, r.rdim), role_size(t, r.cdim), r.rdim >= 0 ? stride[r.rdim] : 0,
                  r.cdim >= 0 ? stride[r.cdim] : 0, &ld);
}

static void mat_set(mat *m, const sg_tensor *t, role r, float *p, const int64_t *stride, int nb) {
    m->p = p;
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

/* Copy t's elements, row-major, into dst as f32 (or back: dst into t). */
static void stage(sg_ctx *ctx, const sg_tensor *t, float *buf, bool to_tensor) {
    sg__rows r;
    sg__rows_init(&r, t->ndim, t->shape, 1);
    for (int d = 0; d < t->ndim; d++) r.stride[0][d] = t->stride[d];
    int64_t inner = t->ndim ? t->stride[t->ndim - 1] : 0;
    void *base = sg__data(t);
    sg_dtype dt = t->dtype;
    int nth = sg__cpu_threads(ctx, sg__numel(t->ndim, t->shape));
#pragma omp parallel for num_threads(nth) if (nth > 1) schedule(static)
    for (int64_t row = 0; row < r.nrows; row++) {
        int64_t off[SG__MAX_OPS];
        sg__rows_offsets(&r, row, off);
        for (int64_t c = 0; c < r.rowlen; c += CHUNK) {
            int len = (int)(r.rowlen - c < CHUNK ? r.rowlen - c : CHUNK);
            void *p = sg__at(base, dt, off[0] + c * inner);
            float *f = buf + row * r.rowlen + c;
            if (to_tensor)
                sg__scatter_f(p, dt, inner, len, f);
            else
                sg__gather_f(p, dt, inner, len, f);
        }
    }
}

/* A staging buffer of n floats; NULL with a message naming the op on failure. */
static float *buf_new(sg_ctx *ctx, const sg__node *n, int64_t count, const char *what) {
    float *p = sg__alloc(ctx, (size_t)count * sizeof(float));
    if (!p)
        sg__fail(ctx, SG_ERR_OOM, "sg_%s: out of host memory for the f32 copy of %s (%lld "
                 "elements)", sg__op_name(n->op), what, (long long)count);
    return p;
}

/*
 * Point m at operand t as f32: in place when BLAS can read it, else at a
 * packed copy (*buf, which the caller frees).
 */
static sg_status operand(sg_ctx *ctx, const sg__node *n, const sg_tensor *t, role r, int nb,
                         mat *m, float **buf, const char *what) {
    if (t->dtype == SG_F32 && tensor_layout(t, r, t->stride) != LAY_NONE) {
        mat_set(m, t, r, sg__data(t), t->stride, nb);
        return SG_OK;
    }
    int64_t count = sg__numel(t->ndim, t->shape), stride[SG_MAX_DIMS];
    *buf = buf_new(ctx, n, count, what);
    if (!*buf) return SG_ERR_OOM;
    stage(ctx, t, *buf, false);
    contiguous_strides(t->ndim, t->shape, stride);
    mat_set(m, t, r, *buf, stride, nb);
    return SG_OK;
}

/* Fold batch dims into M, innermost first, while B is fixed along them and
 * A and C stay row-major matrices with evenly spaced rows. */
static void fold(gemm *g) {
    while (g->nb > 0) {
        int d = g->nb - 1;
        int64_t s = g->bshape[d], ld;
        if (s == 1) {
            g->nb--;
            continue;
        }
        if (g->B.bs[d] != 0) break;
        int64_t ars = g->A.rs, crs = g->C.rs;
        if (g->M == 1) { /* a single row has no row stride yet: take the batch's */
            ars = g->A.bs[d];
            crs = g->C.bs[d];
        } else if (g->A.bs[d] != ars * g->M || g->C.bs[d] != crs * g->M) {
            break;
        }
        int64_t M = g->M * s;
        if (layout(M, g->K, ars, g->A.cs, &ld) != LAY_N ||
            layout(M, g->N, crs, g->C.cs, &ld) != LAY_N)
            break;
        g->A.rs = ars;
        g->C.rs = crs;
        g->M = M;
        g->nb--;
    }
}

static int64_t batch_count(const gemm *g) {
    int64_t nbatch = 1;
    for (int d = 0; d < g->nb; d++) nbatch *= g->bshape[d];
    return nbatch;
}

/* The element offsets of batch b in A, B and C. */
static void batch_offsets(const gemm *g, int64_t b, int64_t *oa, int64_t *ob, int64_t *oc) {
    *oa = *ob = *oc = 0;
    for (int d = g->nb - 1; d >= 0; d--) {
        int64_t i = b % g->bshape[d];
        b /= g->bshape[d];
        *oa += i * g->A.bs[d];
        *ob += i * g->B.bs[d];
        *oc += i * g->C.bs[d];
    }
}

/* Set every row of every C to the bias (or to zeros), so that the sgemm can
 * add to it with beta = 1 (and K = 0 leaves exactly this). */
static void init_c(sg_ctx *ctx, const gemm *g, const float *bias) {
    int64_t rows = batch_count(g) * g->M, N = g->N;
    int nth = sg__cpu_threads(ctx, rows * N);
#pragma omp parallel for num_threads(nth) if (nth > 1) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        int64_t oa, ob, oc;
        batch_offsets(g, r / g->M, &oa, &ob, &oc);
        float *c = g->C.p + oc + (r % g->M) * g->C.rs;
        for (int64_t j = 0; j < N; j++) c[j * g->C.cs] = bias ? bias[j] : 0.0f;
    }
}

static void run_gemms(sg_ctx *ctx, const gemm *g, float beta) {
    int64_t lda, ldb, ldc;
    int la = layout(g->M, g->K, g->A.rs, g->A.cs, &lda);
    int lb = layout(g->K, g->N, g->B.rs, g->B.cs, &ldb);
    int lc = layout(g->M, g->N, g->C.rs, g->C.cs, &ldc);
    SG_ASSERT(la != LAY_NONE && lb != LAY_NONE && lc == LAY_N);
    (void)lc;
    enum CBLAS_TRANSPOSE ta = la == LAY_T ? CblasTrans : CblasNoTrans;
    enum CBLAS_TRANSPOSE tb = lb == LAY_T ? CblasTrans : CblasNoTrans;
    int64_t nbatch = batch_count(g);
    double mnk = (double)g->M * (double)g->N * (double)g->K;
    int nth = 1;
    if (nbatch > 1 && mnk <= SMALL_GEMM) {
        /* A multiply-add is about an eighth of an elementwise op's cost. */
        double work = (double)nbatch * mnk / 8;
        nth = sg__cpu_threads(ctx, work > 1e18 ? (int64_t)1e18 : (int64_t)work);
    }
#pragma omp parallel for num_threads(nth) if (nth > 1) schedule(static)
    for (int64_t b = 0; b < nbatch; b++) {
        int64_t oa, ob, oc;
        batch_offsets(g, b, &oa, &ob, &oc);
        cblas_sgemm(CblasRowMajor, ta, tb, (int)g->M, (int)g->N, (int)g->K, 1.0f, g->A.p + oa,
                    (int)lda, g->B.p + ob, (int)ldb, beta, g->C.p + oc, (int)ldc);
    }
}

#define GEMV_ROWS 8     /* at most this many rows take gemv_half */
#define GEMV_CHUNK 1024 /* elements of a row of B converted at a time */

/* Folded to one product of few rows whose f16/bf16 B (its element (k, n)
 * at k * B.rs + n * B.cs of b's data) gemv_half can read in place: one of
 * B's dims is contiguous. */
static bool gemv_half_takes(const gemm *g) {
    return g->nb == 0 && g->M <= GEMV_ROWS && g->K > 0 &&
           (g->B.rs == 1 || g->B.cs == 1 || g->K == 1 || g->N == 1);
}

/*
 * C (M x N, f32, holding the bias or zeros) += A (M x K, f32) @ B, B read
 * in place from b's f16/bf16 data through its strides. With B's rows along
 * K contiguous (a linear's w (N, K)), each output column is M dot products
 * over K in f32, each element widened inside the dot (A's row contiguous;
 * else in chunks of GEMV_CHUNK converted elements); else
 * (B's rows along N contiguous: a matmul's b (K, N)) each row k of B adds
 * a[k] times it to C's rows, GEMV_CHUNK columns at a time. Threads split N.
 */
static void gemv_half(sg_ctx *ctx, const gemm *g, const sg_tensor *b) {
    void *base = sg__data(b);
    sg_dtype dt = b->dtype;
    int64_t M = g->M, N = g->N, K = g->K;
    int nth = sg__cpu_threads(ctx, N * K);
    if (g->B.rs == 1 && g->A.cs == 1) {
        /* rows along K, each element widened inside the dot itself: bf16 by a
         * 16-bit shift, f16 by sg__h2f_sel's selects */
        bool bf = dt == SG_BF16;
#pragma omp parallel for num_threads(nth) if (nth > 1) schedule(static)
        for (int64_t n = 0; n < N; n++) {
            const uint16_t *wr = (const uint16_t *)base + n * g->B.cs;
            for (int64_t r = 0; r < M; r++) {
                const float *a = g->A.p + r * g->A.rs;
                float sum = 0.0f;
                if (bf) {
#pragma omp simd reduction(+ : sum)
                    for (int64_t k = 0; k < K; k++) {
                        uint32_t u = (uint32_t)wr[k] << 16;
                        float w;
                        memcpy(&w, &u, sizeof w);
                        sum += a[k] * w;
                    }
                } else {
#pragma omp simd reduction(+ : sum)
                    for (int64_t k = 0; k < K; k++) sum += a[k] * sg__h2f_sel(wr[k]);
                }
                g->C.p[r * g->C.rs + n * g->C.cs] += sum;
            }
        }
        return;
    }
    if (g->B.rs == 1 || K == 1) {
#pragma omp parallel for num_threads(nth) if (nth > 1) schedule(static)
        for (int64_t n = 0; n < N; n++) {
            float w[GEMV_CHUNK], acc[GEMV_ROWS] = {0};
            for (int64_t k0 = 0; k0 < K; k0 += GEMV_CHUNK) {
                int len = (int)(K - k0 < GEMV_CHUNK ? K - k0 : GEMV_CHUNK);
                sg__gather_f(sg__at(base, dt, n * g->B.cs + k0 * g->B.rs), dt, g->B.rs, len, w);
                for (int64_t r = 0; r < M; r++) {
                    const float *a = g->A.p + r * g->A.rs + k0 * g->A.cs;
                    int64_t acs = g->A.cs;
                    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
                    for (int k = 0; k < len; k++) sum += a[k * acs] * w[k];
                    acc[r] += sum;
                }
            }
            for (int64_t r = 0; r < M; r++) g->C.p[r * g->C.rs + n * g->C.cs] += acc[r];
        }
        return;
    }
    int64_t nchunks = (N + GEMV_CHUNK - 1) / GEMV_CHUNK;
#pragma omp parallel for num_threads(nth) if (nth > 1) schedule(static)
    for (int64_t c = 0; c < nchunks; c++) {
        int64_t n0 = c * GEMV_CHUNK;
        int len = (int)(N - n0 < GEMV_CHUNK ? N - n0 : GEMV_CHUNK);
        float w[GEMV_CHUNK];
        for (int64_t k = 0; k < K; k++) {
            sg__gather_f(sg__at(base, dt, k * g->B.rs + n0 * g->B.cs), dt, g->B.cs, len, w);
            for (int64_t r = 0; r < M; r++) {
                const float ak = g->A.p[r * g->A.rs + k * g->A.cs];
                float *cr = g->C.p + r * g->C.rs + n0 * g->C.cs;
                int64_t ccs = g->C.cs;
#pragma omp simd
                for (int j = 0; j < len; j++) cr[j * ccs] += ak * w[j];
            }
        }
    }
}

/* The sizes and the roles of the three operands (graphs/dims.c). */
static void setup(const sg__node *n, gemm *g, role *ra, role *rb, role *rc) {
    sg__mm_dims d;
    sg__mm_dims_of(n, &d);
    g->M = d.M, g->N = d.N, g->K = d.K, g->nb = d.nb;
    memcpy(g->bshape, d.bshape, sizeof d.bshape);
    *ra = d.a, *rb = d.b, *rc = d.c;
}

/* The bias as N contiguous floats; NULL with a message on failure. */
static float *bias_row(sg_ctx *ctx, const sg__node *n, const sg_tensor *bias) {
    int64_t N = bias->shape[0];
    float *row = buf_new(ctx, n, N, "the bias");
    if (!row) return NULL;
    for (int64_t c = 0; c < N; c += CHUNK) {
        int len = (int)(N - c < CHUNK ? N - c : CHUNK);
        sg__gather_f(sg__at(sg__data(bias), bias->dtype, c * bias->stride[0]), bias->dtype,
                     bias->stride[0], len, row + c);
    }
    return row;
}

sg_status sg__cpu_matmul(sg_ctx *ctx, const sg__node *n) {
    sg_tensor *out = n->out;
    const sg_tensor *bias = n->op == SG__OP_LINEAR ? n->in[2] : NULL;
    gemm g;
    role ra, rb, rc;
    setup(n, &g, &ra, &rb, &rc);
    if (sg__numel(out->ndim, out->shape) == 0) return SG_OK;
    float *abuf = NULL, *bbuf = NULL, *cbuf = NULL, *brow = NULL;
    int64_t cstride[SG_MAX_DIMS];
    sg_status s = operand(ctx, n, n->in[0], ra, g.nb, &g.A, &abuf, "the left operand");
    /* A half-precision B of few rows' product is read in place (gemv_half),
     * once the batches have folded; until then only its strides are set. */
    const sg_tensor *b = n->in[1];
    bool half_b =
        (b->dtype == SG_F16 || b->dtype == SG_BF16) && (n->op == SG__OP_LINEAR || b->ndim <= 2);
    if (s == SG_OK && half_b)
        mat_set(&g.B, b, rb, NULL, b->stride, g.nb);
    else if (s == SG_OK)
        s = operand(ctx, n, b, rb, g.nb, &g.B, &bbuf, "the right operand");
    if (s != SG_OK) goto done;
    if (out->dtype == SG_F32 && tensor_layout(out, rc, out->stride) == LAY_N) {
        mat_set(&g.C, out, rc, sg__data(out), out->stride, g.nb);
    } else {
        cbuf = buf_new(ctx, n, sg__numel(out->ndim, out->shape), "the result");
        if (!cbuf) {
            s = SG_ERR_OOM;
            goto done;
        }
        contiguous_strides(out->ndim, out->shape, cstride);
        mat_set(&g.C, out, rc, cbuf, cstride, g.nb);
    }
    if (bias && !(brow = bias_row(ctx, n, bias))) {
        s = SG_ERR_OOM;
        goto done;
    }
    fold(&g);
    if (half_b && gemv_half_takes(&g)) {
        init_c(ctx, &g, brow); /* the bias, or zeros */
        gemv_half(ctx, &g, b);
        if (cbuf) stage(ctx, out, cbuf, true);
        goto done;
    }
    /* BLAS after all: B as a packed f32 copy (fixed along every batch dim,
     * so the batches folded away do not change how it is read) */
    if (half_b && (s = operand(ctx, n, b, rb, g.nb, &g.B, &bbuf, "the right operand")) != SG_OK)
        goto done;
    if (g.M > INT_MAX || g.N > INT_MAX || g.K > INT_MAX) {
        s = sg__fail(ctx, SG_ERR_UNSUPPORTED, "sg_%s: M=%lld, N=%lld, K=%lld exceed the 32-bit "
                     "sizes BLAS takes; split the product", sg__op_name(n->op), (long long)g.M,
                     (long long)g.N, (long long)g.K);
        goto done;
    }
    if (brow || g.K == 0) init_c(ctx, &g, brow);
    if (g.K > 0) run_gemms(ctx, &g, brow ? 1.0f : 0.0f);
    if (cbuf) stage(ctx, out, cbuf, true);
done:
    sg__free(ctx, abuf, abuf ? (size_t)sg__numel(n->in[0]->ndim, n->in[0]->shape) * 4 : 0);
    sg__free(ctx, bbuf, bbuf ? (size_t)sg__numel(n->in[1]->ndim, n->in[1]->shape) * 4 : 0);
    sg__free(ctx, cbuf, cbuf ? (size_t)sg__numel(out->ndim, out->shape) * 4 : 0);
    sg__free(ctx, brow, brow ? (size_t)bias->shape[0] * 4 : 0);
    return s;
}
