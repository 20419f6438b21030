/* SPDX-License-Identifier: MIT */
/*
 * cuda_attn.c -- the host side of ATTENTION on CUDA (kernels in k_attn.cu).
 * It describes the node's 4-d views to the kernel (strides, dtypes, the
 * kv_len stride), picks the block shape by head dim (R rows of queries per
 * block, KT keys per tile, within 48 KiB of shared memory), and cuts the
 * keys into splits when the (batch, K/V head, row group) blocks alone would
 * leave SMs idle -- decode -- so that about two blocks per SM read K/V in
 * parallel; the splits are then merged by a second kernel through op
 * scratch. Prefill in 16-bit (D a multiple of 16, at most 128, no mask)
 * goes to a tensor-core kernel instead (SG_ATTN_MMA=0: not): FlashAttention-2's
 * forward for D 64 and 128 with 16-byte rows, else sg_attn_mma; decode (at most 4 queries
 * per row, 16-byte K/V rows; with a mask, the row reads only the keys from the first to
 * the last its mask lets through) to the lean sg_attn_decode (SG_ATTN_DECODE=0: not),
 * whose splits the device picks from kv_len within the count planned here, merged by a
 * cluster of blocks (sm_90) or by the combine kernel. With SG__ATTN_LSE the flash
 * kernels also write each row's logsumexp after the result; the other paths fill
 * that with NaN, so the backward recomputes it. The split count depends
 * only on shapes, never on kv_len, which stays on the device: a recorded graph replays with
 * whatever length the step wrote there.
 */
#include "exec.h"

#ifdef SG_HAVE_CUDA_HEADERS

#include <stdlib.h>

#define NT 128
#define MAXR 16
#define MAXACC 16
#define CMIN 32                       /* keys per split of sg_attn_decode, at least (k_attn.cu) */
#define DCL 8                         /* splits of a row in sg_attn_decode8's cluster (k_attn.cu) */
#define DCL_KEYS 2048                 /* keys per split of sg_attn_decode8, at most */
#define SCRATCH_CAP ((size_t)1 << 20) /* the op scratch that always exists (exec.c) */

/* k_attn.cu's flags; CAUSAL is SG__ATTN_CAUSAL, MDROP SG__ATTN_MASK_DROPS */
enum { CAUSAL = 1, VEC = 2, DECODE = 4, MDROP = 8 };

/* The same layout as struct ageom in k_attn.cu. */
typedef struct ageom {
    int64_t qs[4], ks[4], vs[4], ms[4];
    int64_t B, Hq, Hkv, Lq, S, D;
    int64_t ls, chunk;
    float scale;
    int32_t dt, mdt, ldt, flags;
    int32_t nsplit, rows, kt;
} ageom;
_Static_assert(sizeof(ageom) == 224, "ageom changed: update k_attn.cu too");

/* 16-byte loads of K and V rows: contiguous rows of whole vectors, aligned. */
static bool rows_vector(const sg_tensor *t, int64_t D) {
    int64_t w = 16 / (int64_t)sg_dtype_size(t->dtype);
    if (t->stride[3] != 1 || D % w != 0) return false;
    for (int d = 0; d < 3; d++)
        if (t->stride[d] % w != 0) return false;
    return ((uintptr_t)sg__data(t) & 15) == 0;
}

static void describe(ageom *g, const sg__node *n) {
    const sg_tensor *q = n->in[0], *k = n->in[1], *v = n->in[2];
    const sg_tensor *m = n->nin > 3 ? n->in[3] : NULL, *len = n->nin > 4 ? n->in[4] : NULL;
    memset(g, 0, sizeof *g);
    for (int d = 0; d < 4; d++) {
        g->qs[d] = q->stride[d], g->ks[d] = k->stride[d], g->vs[d] = v->stride[d];
        g->ms[d] = m ? m->stride[d] : 0;
    }
    g->B = q->shape[0], g->Hq = q->shape[1], g->Hkv = k->shape[1];
    g->Lq = q->shape[2], g->S = k->shape[2], g->D = q->shape[3];
    g->ls = len && len->ndim == 1 && len->shape[0] > 1 ? len->stride[0] : 0;
    g->scale = (float)n->f[0];
    g->dt = (int32_t)q->dtype;
    g->mdt = m ? (int32_t)m->dtype : -1;
    g->ldt = len ? (int32_t)len->dtype : -1;
    g->flags = (n->i[0] & SG__ATTN_CAUSAL) ? CAUSAL : 0;
    if (n->i[0] & SG__ATTN_MASK_DROPS) g->flags |= MDROP;
    if (rows_vector(k, g->D) && rows_vector(v, g->D)) g->flags |= VEC;
    /* Rows per block: no more than the queries sharing a K/V head (one, for MHA decode). */
    int64_t rows = g->D <= 128 ? MAXR : MAXR / 2,
            shared = (g->Hkv > 0 ? g->Hq / g->Hkv : 1) * g->Lq;
    g->rows = (int32_t)(shared < rows ? (shared > 0 ? shared : 1) : rows);
    g->kt = g->D <= 64 ? 64 : g->D <= 128 ? 32 : 16;
}

/* Splits of the keys: enough blocks for ~2 per SM, KT-multiple chunks, and
 * partials that fit the op scratch that always exists. */
static void plan_splits(ageom *g, int64_t blocks, int sms) {
    int64_t tiles = (g->S + g->kt - 1) / g->kt, ns = 1;
    if (blocks < 2 * (int64_t)sms) ns = (2 * (int64_t)sms + blocks - 1) / blocks;
    ns = ns > tiles ? tiles : ns;
    int64_t rows = g->B * g->Hq * g->Lq;
    while (ns > 1 && (size_t)(rows * ns * (g->D + 2)) * sizeof(float) > SCRATCH_CAP) ns /= 2;
    ns = ns < 1 ? 1 : ns;
    int64_t chunk = ((tiles + ns - 1) / ns) * g->kt;
    g->chunk = chunk > 0 ? chunk : g->kt;
    g->nsplit = (int32_t)(g->S > 0 ? (g->S + g->chunk - 1) / g->chunk : 1);
}

/* Prefill on tensor cores (sg_attn_mma): 16-bit, D a multiple of 16 up to 128, no mask,
 * enough queries for 64-row tiles, sm_80+; SG_ATTN_MMA=0 keeps the FFMA kernel. */
static bool use_mma(sg_ctx *ctx, const ageom *g) {
    const char *e = getenv("SG_ATTN_MMA");
    if (e && strcmp(e, "0") == 0) return false;
    return (g->dt == SG_BF16 || g->dt == SG_F16) && g->mdt < 0 && g->D % 16 == 0 && g->D <= 128 &&
           g->Lq >= 32 && g->B * g->Hq <= 65535 && sg__cuda_arch(ctx) >= 80;
}

/* FlashAttention-2's forward (sg_attn_flash64 / 128): D 64 or 128, q/k/v rows of 16-byte
 * vectors (rows_vector) and a 16-byte aligned result, sm_80+; SG_ATTN_FLASH=0 keeps sg_attn_mma. */
static bool use_flash(const sg__node *n, const ageom *g) {
    const char *e = getenv("SG_ATTN_FLASH");
    if (e && strcmp(e, "0") == 0) return false;
    return (g->D == 64 || g->D == 128) && (g->flags & VEC) && rows_vector(n->in[0], g->D) &&
           ((uintptr_t)sg__data(n->out) & 15) == 0 && (g->Lq + 63) / 64 <= 65535 &&
           g->B * g->Hq <= INT32_MAX;
}

/* The same layout as struct acopy in k_attn.cu: the flash kernel's copies of
 * its K and V views (NULL: that view is not copied). */
typedef struct acopy {
    void *kd, *vd;
    int64_t kds[4], vds[4];
} acopy;
_Static_assert(sizeof(acopy) == 80, "acopy changed: update k_attn.cu too");

/* With SG__ATTN_LSE: where the rows' logsumexps go in the packed output
 * (capture.h sg__attn_lse_at), else NULL. */
static float *lse_of(const sg__node *n, const ageom *g) {
    if (!(n->i[0] & SG__ATTN_LSE)) return NULL;
    size_t at = (size_t)sg__attn_lse_at(g->B * g->Lq * g->Hq * g->D) * sg_dtype_size(n->out->dtype);
    return (float *)((char *)sg__data(n->out) + at);
}

static sg_status launch_mma(sg_ctx *ctx, const sg__node *n, ageom *g, const acopy *cp) {
    bool flash = use_flash(n, g);
    float *lse = flash ? lse_of(n, g) : NULL;
    const char *name = !flash      ? "sg_attn_mma"
                       : g->D == 64 ? (lse ? "sg_attn_flash64_lse" : "sg_attn_flash64")
                                    : (lse ? "sg_attn_flash128_lse" : "sg_attn_flash128");
    void *f;
    sg_status st = sg__cuda_kernel(ctx, SG__CU_ATTN, name, &f);
    if (st != SG_OK) return st;
    void *q = sg__data(n->in[0]), *k = sg__data(n->in[1]), *v = sg__data(n->in[2]);
    void *len = n->nin > 4 && n->in[4] ? sg__data(n->in[4]) : NULL, *out = sg__data(n->out);
    acopy none = {0};
    void *args[] = {&q, &k, &v, &len, &out, g, (void *)(cp ? cp : &none), &lse};
    unsigned tiles = (unsigned)((g->Lq + 63) / 64), heads = (unsigned)(g->B * g->Hq);
    unsigned grid[3] = {flash ? heads : tiles, flash ? tiles : heads, 1};
    unsigned block[3] = {NT, 1, 1};
    return sg__cuda_launch(ctx, f, grid, block, 0, args);
}

/* sg_attn_decode: few query rows (a mask or none), K/V rows of 16-byte vectors that a warp's lanes
 * split evenly (D / W a power of two up to 32); SG_ATTN_DECODE=0 keeps the split kernel. */
static bool use_decode(const ageom *g) {
    const char *e = getenv("SG_ATTN_DECODE");
    if (e && strcmp(e, "0") == 0) return false;
    int64_t w = g->dt == SG_F32 ? 4 : 8, t = g->D / w;
    return (g->flags & VEC) && g->Lq <= 4 && g->D % w == 0 && t >= 1 && t <= 32 &&
           (t & (t - 1)) == 0 && g->B * g->Hq * g->Lq <= INT32_MAX;
}

/* Decode: a block per query row and split; up to ~2 blocks per SM of splits, each of at
 * least CMIN keys (the device cuts kv_len into at most that many). One split: no scratch and
 * no combine. On sm_90, when that is at most 4 DCL splits and each of DCL holds at most DCL_KEYS
 * keys, DCL splits as one cluster per row (sg_attn_decode8), merged in distributed shared memory:
 * no combine either (SG_ATTN_CLUSTER=0: not). Else partials within the op scratch and
 * sg_attn_combine. */
static sg_status launch_decode(sg_ctx *ctx, const sg__node *n, ageom *g) {
    int64_t rows = g->B * g->Hq * g->Lq, sms = sg__cuda_sm_count(ctx);
    int64_t ns = (2 * sms + rows - 1) / rows, most = (g->S + CMIN - 1) / CMIN;
    ns = ns > most ? most : ns;
    const char *e = getenv("SG_ATTN_CLUSTER");
    bool cl = ns > 1 && ns <= 4 * DCL && (g->S + DCL - 1) / DCL <= DCL_KEYS &&
              sg__cuda_arch(ctx) >= 90 && !(e && strcmp(e, "0") == 0);
    if (cl) ns = DCL;
    while (!cl && ns > 1 && (size_t)(rows * ns * (g->D + 2)) * sizeof(float) > SCRATCH_CAP) ns /= 2;
    g->nsplit = (int32_t)(ns < 1 ? 1 : ns > 65535 ? 65535 : ns);
    g->flags |= DECODE;
    bool combine_too = g->nsplit > 1 && !cl;
    void *dec, *combine = NULL, *part = NULL;
    sg_status st = sg__cuda_kernel(ctx, SG__CU_ATTN,
                                   g->mdt >= 0 ? (cl ? "sg_attn_decode8_m" : "sg_attn_decode_m")
                                               : (cl ? "sg_attn_decode8" : "sg_attn_decode"),
                                   &dec);
    if (st == SG_OK && combine_too)
        st = sg__cuda_kernel(ctx, SG__CU_ATTN, "sg_attn_combine", &combine);
    if (st == SG_OK && combine_too)
        st = sg__cuda_scratch(ctx, (size_t)(rows * g->nsplit * (g->D + 2)) * sizeof(float), &part);
    if (st != SG_OK) return st;
    void *q = sg__data(n->in[0]), *k = sg__data(n->in[1]), *v = sg__data(n->in[2]);
    void *m = n->nin > 3 && n->in[3] ? sg__data(n->in[3]) : NULL;
    void *len = n->nin > 4 && n->in[4] ? sg__data(n->in[4]) : NULL, *out = sg__data(n->out);
    void *args[] = {&q, &k, &v, &m, &len, &out, &part, g};
    unsigned grid[3] = {(unsigned)rows, (unsigned)g->nsplit, 1}, block[3] = {NT, 1, 1};
    st = sg__cuda_launch(ctx, dec, grid, block, 0, args);
    if (st != SG_OK || !combine_too) return st;
    void *cargs[] = {&part, &len, &out, g};
    unsigned cgrid[3] = {(unsigned)rows, 1, 1};
    unsigned cblock[3] = {(unsigned)(g->D < 32 ? 32 : (g->D + 31) / 32 * 32), 1, 1};
    return sg__cuda_launch(ctx, combine, cgrid, cblock, 0, cargs);
}

/* The FFMA kernel sg_attn_split, its splits merged by sg_attn_combine. */
static sg_status launch_split(sg_ctx *ctx, const sg__node *n, ageom *g0) {
    ageom g = *g0;
    int64_t rows = g.B * g.Hq * g.Lq;
    int64_t zr = ((g.Hq / g.Hkv) * g.Lq + g.rows - 1) / g.rows, bx = g.B * g.Hkv;
    plan_splits(&g, bx * zr, sg__cuda_sm_count(ctx));
    if (zr > 65535 || bx > INT32_MAX || rows > INT32_MAX)
        return sg__fail(ctx, SG_ERR_UNSUPPORTED,
                        "cuda: attention over %lld query rows in %lld "
                        "(batch, head) pairs is past the launch limits; split the batch",
                        (long long)rows, (long long)bx);
    void *split, *combine, *part = NULL;
    sg_status st = sg__cuda_kernel(ctx, SG__CU_ATTN, "sg_attn_split", &split);
    if (st == SG_OK && g.nsplit > 1)
        st = sg__cuda_kernel(ctx, SG__CU_ATTN, "sg_attn_combine", &combine);
    if (st == SG_OK && g.nsplit > 1)
        st = sg__cuda_scratch(ctx, (size_t)(rows * g.nsplit * (g.D + 2)) * sizeof(float), &part);
    if (st != SG_OK) return st;
    void *q = sg__data(n->in[0]), *k = sg__data(n->in[1]), *v = sg__data(n->in[2]);
    void *m = n->nin > 3 && n->in[3] ? sg__data(n->in[3]) : NULL;
    void *len = n->nin > 4 && n->in[4] ? sg__data(n->in[4]) : NULL;
    void *out = sg__data(n->out);
    void *args[] = {&q, &k, &v, &m, &len, &out, &part, &g};
    size_t shmem =
        sizeof(float) * (size_t)(g.rows * g.D + g.kt * (g.D + 1) + g.kt * g.D + g.rows * g.kt);
    unsigned grid[3] = {(unsigned)bx, (unsigned)g.nsplit, (unsigned)zr}, block[3] = {NT, 1, 1};
    st = sg__cuda_launch(ctx, split, grid, block, shmem, args);
    if (st != SG_OK || g.nsplit == 1) return st;
    void *cargs[] = {&part, &len, &out, &g};
    unsigned cgrid[3] = {(unsigned)rows, 1, 1};
    unsigned cblock[3] = {(unsigned)(g.D < 32 ? 32 : (g.D + 31) / 32 * 32), 1, 1};
    return sg__cuda_launch(ctx, combine, cgrid, cblock, 0, cargs);
}

sg_status sg__cuda_attn(sg_ctx *ctx, const sg__node *n) {
    ageom g;
    describe(&g, n);
    if (g.D > 256 || g.Hkv < 1 || g.Hq % g.Hkv != 0)
        return sg__fail(ctx, SG_ERR_INTERNAL,
                        "cuda: attention with D %lld, Hq %lld, Hkv %lld; "
                        "the kernels take D <= 256 and Hq a multiple of Hkv",
                        (long long)g.D, (long long)g.Hq, (long long)g.Hkv);
    int64_t rows = g.B * g.Hq * g.Lq;
    if (rows == 0) return SG_OK;
    float *lse = lse_of(n, &g);
    bool mma = use_mma(ctx, &g), wrote = mma && use_flash(n, &g);
    sg_status st = g.D == 0         ? SG_OK
                   : mma            ? launch_mma(ctx, n, &g, NULL)
                   : use_decode(&g) ? launch_decode(ctx, n, &g)
                                    : launch_split(ctx, n, &g);
    /* A path that keeps no logsumexps: NaN (every bit set), the backward recomputes. */
    if (st == SG_OK && lse && !wrote)
        st = sg__cuda_memset(ctx, lse, 0xff, (size_t)rows * sizeof(float));
    return st;
}

/*
 * ATTENTION with the copies of its k and v views that fusion gave it
 * (sg__group.ncopies): the flash kernel writes them from the rows it reads
 * when it runs the node and each destination has 16-byte rows (rows_vector);
 * else the node, then each copy by its own kernel.
 */
sg_status sg__cuda_attn_copies(sg_ctx *ctx, const sg__node *n, const sg__node *const *copies,
                               int ncopies) {
    ageom g;
    describe(&g, n);
    acopy cp = {0};
    bool fused = g.D <= 256 && g.Hkv >= 1 && g.Hq % g.Hkv == 0 && g.B * g.Hq * g.Lq > 0 &&
                 use_mma(ctx, &g) && use_flash(n, &g);
    for (int i = 0; i < ncopies && fused; i++) {
        const sg_tensor *src = copies[i]->in[0], *dst = copies[i]->out;
        int which = -1;
        for (int j = 1; j <= 2 && which < 0; j++) {
            const sg_tensor *x = n->in[j];
            bool same = sg__data(src) == sg__data(x) && src->ndim == 4 && dst->ndim == 4 &&
                        src->dtype == x->dtype && dst->dtype == x->dtype;
            for (int d = 0; d < 4 && same; d++)
                same = src->shape[d] == x->shape[d] && src->stride[d] == x->stride[d] &&
                       dst->shape[d] == x->shape[d];
            if (same && !(j == 1 ? cp.kd : cp.vd)) which = j;
        }
        fused = which > 0 && rows_vector(dst, g.D);
        int64_t *st = which == 1 ? cp.kds : cp.vds;
        for (int d = 0; d < 4 && fused; d++) st[d] = dst->stride[d];
        if (fused) *(which == 1 ? &cp.kd : &cp.vd) = sg__data(dst);
    }
    if (fused) return launch_mma(ctx, n, &g, &cp);
    sg_status s = sg__cuda_attn(ctx, n);
    for (int i = 0; i < ncopies && s == SG_OK; i++) s = ctx->exec.run(ctx, copies[i]);
    return s;
}

#endif /* SG_HAVE_CUDA_HEADERS */
