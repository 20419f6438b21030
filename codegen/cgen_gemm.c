/* SPDX-License-Identifier: MIT */
/*
 * cgen_gemm.c -- the generated GEMM: a MATMUL group (a matmul or linear
 * anchor, then its pointwise epilogue) as one tiled kernel, for backends
 * that have no BLAS library (Level Zero always, HIP without hipBLASLt) and,
 * on CUDA, for small f32 products (MMA_SMALL) or when SG_CUDA_GEMM=generated
 * asks for it (sg__cgen_gemm_wanted), and for small products of at most 16
 * output columns in any float dtype (emit_narrow).
 * One text for the CUDA, HIP and OpenCL C dialects: the few words that
 * differ (the shared arrays' qualifier, the barrier, thread and block
 * indices, pointer address spaces) come from lower.c's spellings.
 *
 * The product, in the terms of the anchor's operands:
 *     C[b] (M x N) = A[b] (M x K) B[b] (K x N) [+ bias (N)]
 * with A's element (m, k) at a_off(b) + m * ars + k * acs and B's (k, n) at
 * b_off(b) + k * brs + n * bcs, any strides (a transposed operand, a view,
 * a broadcast batch: stride 0), b running over the batch dims the output
 * has before M and N (batch dims that B does not step along, and that A
 * steps along evenly, are folded into M: a linear over (B, T, C) is one
 * product of B * T rows). The output is contiguous, element (b, m, n) at
 * (b * M + m) * N + n, which is also the walk index of the epilogue.
 *
 * A block of 256 threads computes a 64 x 64 tile of C: K goes in steps of
 * 16, each step's 64 x 16 of A and 16 x 64 of B read into shared memory as
 * f32 (the loads run along whichever of an operand's dims is contiguous),
 * then each thread adds the 4 x 4 products it owns (rows ty + 16 i, columns
 * tx + 16 j: the stores of a warp are contiguous). Every output element is
 * one f32 sum over k in order, the same bits every launch (deterministic);
 * bf16 and f16 operands are widened on load and the sum plus the bias is
 * rounded once to the output's dtype, as the library does. Then the
 * epilogue runs on the element, from the register, as in a GEMV kernel.
 *
 * On CUDA (SG_CUDA_GEMM=generated) an f32 product takes the tensor cores
 * instead (emit_mma): a
 * block of 4 warps computes a BM x BN tile (64 x 64, or 32 x 32 where a
 * 64 x 64 grid leaves SMs idle), K in steps of 16 through shared memory
 * (cp.async, three steps in flight while the tensor cores run one), each
 * warp a (BM/2) x (BN/2) quarter in m16n8k8 TF32 mma.sync tiles. f32 is
 * kept by splitting each operand x into a TF32 head h = tf32(x) and its
 * remainder l = tf32(x - h) (rounded by integer adds: cvt.rna.tf32 is four
 * instructions on sm_90) and adding l*h' + h*l' + h*h' into the f32
 * accumulator (3xTF32: the dropped l*l' is ~2^-22 of the product, below
 * the sum's own f32 rounding over K terms), each step's 16 products in
 * a partial of their own (the tensor cores' accumulation truncates),
 * added to the running f32 sum; SG_ALLOW_TF32=1 keeps the
 * heads' product only, as cuBLASLt's TF32 mode. Where the tiles alone do
 * not fill the GPU, K is cut into S slices (split-K), a block each: the
 * slices' partial tiles go to the kernel's own device array and the
 * tile's last block to arrive (a fence, then a counter it resets) adds
 * them in slice order -- the same bits whichever block finishes last --
 * and runs the epilogue. Every output element's sum runs in a fixed
 * order (deterministic). Without sm_80's mma.sync the same kernel adds
 * the same tile elements with f32 FMAs. cuBLASLt's f32 kernels stay the
 * default for larger products: on an H100 this kernel was no faster on
 * W4's large products and slower at 1024^3 (bench/NOTES.md, "f32 products
 * on tensor cores"); products of at most MMA_SMALL multiply-adds take it
 * by default, since cuBLASLt splits them into kernels that each cost more
 * than the whole product here.
 *
 * Groups it does not take (sg__cgen_gemm returns NULL): a norm merged in
 * front (norm_rows), a pair of products (anchor2), cache copies (ncopies),
 * operands of different dtypes or not float, a non-contiguous output, an
 * epilogue that writes into an operand (other blocks still read it).
 */
#include "codegen.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TILE 64 /* rows and columns of C per block */
#define TK 16   /* K per step */
#define THREADS 256
#define PER 4 /* rows and columns per thread: TILE = 16 * PER */

typedef struct gemm {
    const sg__ref *a, *b, *bias, *o;
    int64_t M, N, K;
    int64_t ars, acs, brs, bcs, bias_s;
    int nb; /* batch dims left after folding */
    int64_t bshape[SG_MAX_DIMS], abs_[SG_MAX_DIMS], bbs[SG_MAX_DIMS];
    int64_t batch;
} gemm;

/* tensor-core tile geometry (emit_mma) */
#define MMA_THREADS 128
#define MMA_TK 16
#define MMA_LD (MMA_TK + 4) /* a shared row, padded: fragment loads hit 32 banks */
#define MMA_STAGES 4        /* steps of K in shared memory: 3 in flight */
#define MMA_FILL 132        /* blocks that fill an H100's SMs once */

/* Which kernel a MATMUL group of dtype dt gets in dialect d. */
typedef enum gemm_kind { GEMM_LIBRARY, GEMM_SIMT, GEMM_MMA, GEMM_NARROW } gemm_kind;

/* The f32 products small enough (multiply-adds) that the tensor-core
 * kernel takes them on CUDA by default: cuBLASLt runs such products (W4's
 * 128 x 10 logits, their gradient through a K of 10, the head's weight
 * gradient: ~1.3M multiply-adds each) as SIMT kernels with K split into a
 * reduction kernel, 8-12 µs each in ncu. */
#define MMA_SMALL ((int64_t)1 << 22)
#define MMA_SMALL_K                                                                                \
    4096 /* and a K short enough for a few blocks' steps (a long dot product's                     \
            one tile would walk it in at most 16 slices) */

/* small: a product of at most MMA_SMALL multiply-adds (and K <= MMA_SMALL_K);
 * narrow: one the few-column kernel takes (narrow_ok). */
static gemm_kind kind_of(sg__dialect d, sg_dtype dt, bool small, bool narrow) {
    const char *e = getenv("SG_CUDA_GEMM");
    bool lib = e && strcmp(e, "library") == 0, simt = e && strcmp(e, "simt") == 0;
    if (small && narrow && !lib && !simt) return GEMM_NARROW; /* any dialect */
    if (d == SG__DIALECT_OPENCL || d == SG__DIALECT_HIP) return GEMM_SIMT;
    if (d != SG__DIALECT_CUDA) return GEMM_LIBRARY;
    if (lib) return GEMM_LIBRARY;
    if (simt) return GEMM_SIMT;
    if (e && strcmp(e, "generated") == 0) return dt == SG_F32 ? GEMM_MMA : GEMM_SIMT;
    return dt == SG_F32 && small ? GEMM_MMA : GEMM_LIBRARY;
}

bool sg__cgen_gemm_wanted(sg__dialect d) {
    return kind_of(d, SG_F32, true, false) != GEMM_LIBRARY ||
           kind_of(d, SG_BF16, false, false) != GEMM_LIBRARY;
}

/* The batch stride of operand r along output batch dim d of nb (r's own
 * batch dims are its first rnb, aligned to the right; size 1: 0). */
static int64_t batch_stride(const sg__ref *r, int rnb, int nb, int d) {
    int rd = d - (nb - rnb);
    return rd < 0 || r->shape[rd] == 1 ? 0 : r->stride[rd];
}

/* The operands' geometry of a MATMUL (a @ b, 1-d operands as PyTorch) or
 * LINEAR (x w^T + bias) node; false when the kernel cannot take it. */
static bool operands(const sg__irnode *n, gemm *p) {
    const sg__ref *a = p->a, *b = p->b;
    int anb = 0, bnb = 0;
    p->K = a->shape[a->ndim - 1];
    p->acs = a->stride[a->ndim - 1];
    if (a->ndim >= 2) {
        p->M = a->shape[a->ndim - 2];
        p->ars = a->stride[a->ndim - 2];
        anb = a->ndim - 2;
    } else {
        p->M = 1, p->ars = 0;
    }
    if (n->op == SG__OP_LINEAR) { /* w is (N, K) */
        if (b->ndim != 2) return false;
        p->N = b->shape[0], p->bcs = b->stride[0], p->brs = b->stride[1];
    } else if (b->ndim >= 2) {
        p->N = b->shape[b->ndim - 1], p->bcs = b->stride[b->ndim - 1];
        p->brs = b->stride[b->ndim - 2];
        bnb = b->ndim - 2;
        if (b->shape[b->ndim - 2] != p->K) return false;
    } else {
        p->N = 1, p->bcs = 0, p->brs = b->stride[0];
        if (b->shape[0] != p->K) return false;
    }
    p->nb = anb > bnb ? anb : bnb;
    if (p->nb > p->o->ndim) return false;
    for (int d = 0; d < p->nb; d++) {
        p->bshape[d] = p->o->shape[d];
        p->abs_[d] = batch_stride(a, anb, p->nb, d);
        p->bbs[d] = batch_stride(b, bnb, p->nb, d);
    }
    /* Fold trailing batch dims that B does not step along into M. */
    while (p->nb > 0) {
        int d = p->nb - 1;
        if (p->bbs[d] != 0) break;
        if (p->bshape[d] != 1 && p->M == 1)
            p->ars = p->abs_[d]; /* one row: any stride */
        else if (p->bshape[d] != 1 && p->abs_[d] != p->ars * p->M)
            break;
        p->M *= p->bshape[d];
        p->nb--;
    }
    p->batch = 1;
    for (int d = 0; d < p->nb; d++) p->batch *= p->bshape[d];
    return true;
}

static int64_t numel_of(int nd, const int64_t *shape) {
    int64_t n = 1;
    for (int d = 0; d < nd; d++) n *= shape[d];
    return n;
}

static bool plan(sg__cuda_gen *g, const sg__group *grp, gemm *p) {
    if (grp->kind != SG__G_MATMUL || grp->anchor < 0 || grp->norm_rows || grp->anchor2 ||
        grp->nseg || grp->ncopies)
        return false;
    const sg__ir *ir = sg__cuda_ir(g);
    const sg__irnode *n = &ir->nodes[grp->g[grp->anchor].node];
    if (n->op != SG__OP_MATMUL && n->op != SG__OP_LINEAR) return false;
    memset(p, 0, sizeof *p);
    p->a = sg__cuda_arg(g, n, 0);
    p->b = sg__cuda_arg(g, n, 1);
    p->bias = n->op == SG__OP_LINEAR && n->nin > 2 ? sg__cuda_arg(g, n, 2) : NULL;
    p->o = sg__cuda_ref(g, n->out);
    if (!p->a || !p->b || p->a->ndim < 1 || p->b->ndim < 1 || !sg__lower_fdom(p->a->dtype))
        return false;
    sg_dtype dt = p->a->dtype;
    if (p->b->dtype != dt || p->o->dtype != dt || (p->bias && p->bias->dtype != dt)) return false;
    if (!operands(n, p)) return false;
    p->bias_s = p->bias ? (p->bias->shape[0] == 1 ? 0 : p->bias->stride[0]) : 0;
    int64_t total = p->batch * p->M * p->N;
    if (numel_of(p->o->ndim, p->o->shape) != total ||
        !sg__lower_flat_ok(p->o, p->o->ndim, p->o->shape) ||
        numel_of(grp->ndim, grp->shape) != total)
        return false;
    int64_t tiles = ((p->M + TILE - 1) / TILE) * ((p->N + TILE - 1) / TILE) * p->batch;
    if (total == 0 || tiles > 0x7fffffff) return false;
    /* Other blocks still read the operands while one block's epilogue runs. */
    for (int k = grp->anchor + 1; k < grp->n; k++) {
        int slot = sg__cuda_ref(g, ir->nodes[grp->g[k].node].out)->slot;
        if (grp->g[k].store &&
            (slot == p->a->slot || slot == p->b->slot || (p->bias && slot == p->bias->slot)))
            return false;
    }
    return true;
}

/* Step k0's tile of one operand into shared array `tile` ([TK][TILE], f32):
 * rows of the tile are `outer` (m of A, n of B) and columns k; thread e's
 * element runs along k when k is the contiguous dim (kfast). */
static void emit_tile_load(sg__cuda_gen *g, const char *tile, const sg__ref *r, const char *base,
                           const char *o0, int64_t limit, int64_t s_outer, int64_t s_k, bool kfast,
                           int64_t K) {
    sg__emit *e = sg__cuda_out(g);
    const sg__spell *sp = sg__spell_of(sg__cuda_dialect(g));
    char lv[320], ld[400];
    sg__emit_open(e, "for (int l = 0; l < %d; l++)", TILE * TK / THREADS);
    sg__emit_line(e, "const int q = %s + l * %d;", sp->tid, THREADS);
    if (kfast)
        sg__emit_line(e, "const int r = q / %d, c = q %% %d;", TK, TK);
    else
        sg__emit_line(e, "const int r = q %% %d, c = q / %d;", TILE, TILE);
    sg__emit_line(e, "const sg_i64 ro = %s + r, kc = k0 + c;", o0);
    snprintf(lv, sizeof lv, "((%sconst %s *)s%d)[%s + ro * %lld + kc * %lld]", sp->gp,
             sg__lower_ctype(sg__cuda_dialect(g), r->dtype), sg__cuda_slot(g, r->slot), base,
             (long long)s_outer, (long long)s_k);
    sg__lower_widen(sg__cuda_dialect(g), r->dtype, lv, ld, sizeof ld);
    sg__emit_line(e, "%s[c][r] = ro < %lld && kc < %lld ? %s : 0.0f;", tile, (long long)limit,
                  (long long)K, ld);
    sg__emit_close(e);
}

/* The batch offsets a_o and b_o of block batch index bz. */
static void emit_batch(sg__cuda_gen *g, const gemm *p) {
    sg__emit *e = sg__cuda_out(g);
    sg__emit_line(e, "sg_i64 a_o = %lld, b_o = %lld;", (long long)p->a->offset,
                  (long long)p->b->offset);
    if (p->nb == 0) return;
    sg__emit_open(e, "%s", "");
    sg__emit_line(e, "sg_i64 rem = bz;");
    for (int d = p->nb - 1; d >= 0; d--) {
        sg__emit_line(e, "const sg_i64 j%d = rem %% %lld;", d, (long long)p->bshape[d]);
        sg__emit_line(e, "rem /= %lld;", (long long)p->bshape[d]);
        if (p->abs_[d]) sg__emit_line(e, "a_o += j%d * %lld;", d, (long long)p->abs_[d]);
        if (p->bbs[d]) sg__emit_line(e, "b_o += j%d * %lld;", d, (long long)p->bbs[d]);
    }
    sg__emit_close(e);
}

/* Element (m, n) of the block: the anchor's value from register acc (plus
 * the bias), its store, the epilogue at walk index i. */
static void emit_store(sg__cuda_gen *g, const sg__group *grp, const gemm *p, const char *acc) {
    sg__emit *e = sg__cuda_out(g);
    sg__dialect d = sg__cuda_dialect(g);
    const sg__spell *sp = sg__spell_of(d);
    char lv[320], ld[400], sum[480], rt[900], st[1300];
    int a = grp->anchor;
    sg__emit_open(e, "if (m < %lld && n < %lld)", (long long)p->M, (long long)p->N);
    sg__emit_line(e, "const sg_i64 i = (bz * %lld + m) * %lld + n;", (long long)p->M,
                  (long long)p->N);
    if (p->bias) {
        snprintf(lv, sizeof lv, "((%sconst %s *)s%d)[%lld + n * %lld]", sp->gp,
                 sg__lower_ctype(d, p->bias->dtype), sg__cuda_slot(g, p->bias->slot),
                 (long long)p->bias->offset, (long long)p->bias_s);
        sg__lower_widen(d, p->bias->dtype, lv, ld, sizeof ld);
        snprintf(sum, sizeof sum, "(%s + %s)", ld, acc);
    } else {
        snprintf(sum, sizeof sum, "%s", acc);
    }
    sg__lower_round_trip(d, sum, true, p->o->dtype, rt, sizeof rt);
    sg__emit_line(e, "const float v%d = %s; /* %s */", a, rt,
                  sg__op_name(sg__cuda_ir(g)->nodes[grp->g[a].node].op));
    if (grp->g[a].store) {
        char v[16];
        snprintf(lv, sizeof lv, "((%s%s *)s%d)[%lld + i]", sp->gp, sg__lower_ctype(d, p->o->dtype),
                 sg__cuda_slot(g, p->o->slot), (long long)p->o->offset);
        snprintf(v, sizeof v, "v%d", a);
        sg__lower_narrow_store(d, p->o->dtype, lv, v, st, sizeof st);
        sg__emit_line(e, "%s", st);
    }
    if (a + 1 < grp->n) {
        bool flat = sg__cuda_walk_flat(g, grp, a + 1, grp->n, grp->ndim, grp->shape, NULL);
        if (!flat) sg__cuda_unflatten(g, grp->ndim, grp->shape);
        sg__cuda_members(g, grp, a + 1, grp->n, grp->ndim, grp->shape, flat);
    }
    sg__emit_close(e);
}

/* The SIMT kernel: 64 x 64 tiles, 256 threads, 4 x 4 outputs a thread. */
static void emit_simt(sg__cuda_gen *g, const sg__group *grp, const gemm *p, sg__cuda_kinfo *ki) {
    sg__emit *e = sg__cuda_out(g);
    const sg__spell *sp = sg__spell_of(sg__cuda_dialect(g));
    int64_t tn = (p->N + TILE - 1) / TILE, tm = (p->M + TILE - 1) / TILE;
    sg__emit_line(e, "%s float sg_ta[%d][%d];", sp->shared, TK, TILE);
    sg__emit_line(e, "%s float sg_tb[%d][%d];", sp->shared, TK, TILE);
    sg__emit_line(e, "const sg_i64 t = (sg_i64)%s;", sp->bid);
    sg__emit_line(e, "const sg_i64 bz = t / %lld;", (long long)(tn * tm));
    sg__emit_line(e, "const sg_i64 m0 = t / %lld %% %lld * %d, n0 = t %% %lld * %d;", (long long)tn,
                  (long long)tm, TILE, (long long)tn, TILE);
    sg__emit_line(e, "const int tx = (int)%s %% 16, ty = (int)%s / 16;", sp->tid, sp->tid);
    emit_batch(g, p);
    sg__emit_line(e, "float acc[%d][%d];", PER, PER);
    sg__emit_line(e, "for (int ri = 0; ri < %d; ri++)", PER);
    sg__emit_line(e, "    for (int cj = 0; cj < %d; cj++) acc[ri][cj] = 0.0f;", PER);
    sg__emit_open(e, "for (sg_i64 k0 = 0; k0 < %lld; k0 += %d)", (long long)p->K, TK);
    /* A's rows are m, B's are n; each loads along its contiguous dim. */
    bool a_kfast = p->acs == 1 || p->ars != 1;
    bool b_kfast = p->brs == 1 || p->bcs != 1;
    emit_tile_load(g, "sg_ta", p->a, "a_o", "m0", p->M, p->ars, p->acs, a_kfast, p->K);
    emit_tile_load(g, "sg_tb", p->b, "b_o", "n0", p->N, p->bcs, p->brs, b_kfast, p->K);
    sg__emit_line(e, "%s", sp->sync);
    sg__emit_open(e, "for (int kk = 0; kk < %d; kk++)", TK);
    sg__emit_line(e, "float av[%d], bv[%d];", PER, PER);
    sg__emit_line(e, "for (int ri = 0; ri < %d; ri++) av[ri] = sg_ta[kk][ty + 16 * ri];", PER);
    sg__emit_line(e, "for (int cj = 0; cj < %d; cj++) bv[cj] = sg_tb[kk][tx + 16 * cj];", PER);
    sg__emit_line(e, "for (int ri = 0; ri < %d; ri++)", PER);
    sg__emit_line(e, "    for (int cj = 0; cj < %d; cj++) acc[ri][cj] += av[ri] * bv[cj];", PER);
    sg__emit_close(e);
    sg__emit_line(e, "%s", sp->sync);
    sg__emit_close(e);
    sg__emit_open(e, "for (int ri = 0; ri < %d; ri++)", PER);
    sg__emit_open(e, "for (int cj = 0; cj < %d; cj++)", PER);
    sg__emit_line(e, "const sg_i64 m = m0 + ty + 16 * ri, n = n0 + tx + 16 * cj;");
    emit_store(g, grp, p, "acc[ri][cj]");
    sg__emit_close(e);
    sg__emit_close(e);
    ki->grid = (unsigned)(tn * tm * p->batch);
    ki->block = THREADS;
    ki->iters = p->batch * p->M * p->N;
    ki->replaces_call = true;
}

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* The tensor-core kernel's tile (bm x bn), slice count and K per slice:
 * 64 x 64 tiles where they fill the SMs (cutting their K too measured
 * slower: W4's 1024x1024x128 16.7 against 14.4 µs), else 32 x 32 tiles
 * with K cut for about four blocks an SM, each at least four steps of K. */
typedef struct mma_geo {
    int bm, bn;
    int64_t tm, tn, tiles, split, ks;
} mma_geo;

static mma_geo mma_shape(const gemm *p) {
    mma_geo q = {.bm = 64, .bn = 64};
    q.tm = cdiv(p->M, 64), q.tn = cdiv(p->N, 64);
    q.tiles = q.tm * q.tn * p->batch;
    q.split = 1, q.ks = cdiv(p->K, MMA_TK) * MMA_TK;
    if (q.tiles >= MMA_FILL * 3 / 4) return q;
    q.bm = q.bn = 32;
    q.tm = cdiv(p->M, 32), q.tn = cdiv(p->N, 32);
    q.tiles = q.tm * q.tn * p->batch;
    int64_t s = cdiv(4 * MMA_FILL, q.tiles), most = cdiv(p->K, 4 * MMA_TK);
    if (s > most) s = most;
    if (s > 16) s = 16;
    if (s < 1) s = 1;
    q.ks = cdiv(cdiv(p->K, s), MMA_TK) * MMA_TK;
    q.split = q.ks > 0 ? cdiv(p->K, q.ks) : 1; /* K = 0: one slice of no steps */
    return q;
}

/* One operand of the tensor-core kernel: the shared array its steps of K
 * land in ([MMA_STAGES][rows][MMA_LD]), element (r, c) being row o0 + r (m
 * of A, n of B) and column kl + c of the step at kl. A thread copies
 * rows * MMA_TK / MMA_THREADS elements a step, along k when k is the
 * contiguous dim (kfast: the same column c0, rows r0 + l * rstep), else
 * along the rows (the same row r0, columns c0 + l * cstep); so its
 * addresses are one pointer (pre_p, at k = 0) plus constants. */
typedef struct mma_opnd {
    const char *pre, *tile, *o0;
    int slot, rows, rstep, cstep;
    int64_t limit, s_outer, s_k;
    bool kfast;
    bool vec; /* k contiguous, rows and K in whole 16-byte vectors: 16-byte
                 copies where the operand's base sits on 16 bytes (pre_v) */
} mma_opnd;

static mma_opnd mma_operand(sg__cuda_gen *g, const gemm *p, const char *pre, const char *tile,
                            const sg__ref *r, const int64_t *bstride, const char *o0, int64_t limit,
                            int64_t s_outer, int64_t s_k, bool kfast, int rows) {
    mma_opnd o = {.pre = pre,
                  .tile = tile,
                  .o0 = o0,
                  .slot = sg__cuda_slot(g, r->slot),
                  .rows = rows,
                  .limit = limit,
                  .s_outer = s_outer,
                  .s_k = s_k,
                  .kfast = kfast};
    o.vec = kfast && s_k == 1 && s_outer % 4 == 0 && p->K % 4 == 0 && r->offset % 4 == 0;
    for (int d = 0; d < p->nb; d++) o.vec = o.vec && bstride[d] % 4 == 0;
    o.rstep = kfast ? MMA_THREADS / MMA_TK : 0;
    o.cstep = kfast ? 0 : MMA_THREADS / rows;
    return o;
}

static void emit_mma_setup(sg__cuda_gen *g, const mma_opnd *o, const char *base) {
    sg__emit *e = sg__cuda_out(g);
    if (o->kfast)
        sg__emit_line(e, "const int %s_r = (int)threadIdx.x / %d, %s_c = (int)threadIdx.x %% %d;",
                      o->pre, MMA_TK, o->pre, MMA_TK);
    else
        sg__emit_line(e, "const int %s_r = (int)threadIdx.x %% %d, %s_c = (int)threadIdx.x / %d;",
                      o->pre, o->rows, o->pre, o->rows);
    sg__emit_line(e,
                  "const float *const %s_p = (const float *)s%d + %s + (%s + %s_r) * %lldLL + "
                  "%s_c * %lldLL;",
                  o->pre, o->slot, base, o->o0, o->pre, (long long)o->s_outer, o->pre,
                  (long long)o->s_k);
    if (!o->vec) return;
    /* 16-byte copies: 4 threads a row of the step, MMA_THREADS / 4 rows apart. */
    sg__emit_line(e, "const int %s_r4 = (int)threadIdx.x / %d, %s_c4 = (int)threadIdx.x %% %d * 4;",
                  o->pre, MMA_TK / 4, o->pre, MMA_TK / 4);
    sg__emit_line(e,
                  "const float *const %s_p4 = (const float *)s%d + %s + (%s + %s_r4) * %lldLL + "
                  "%s_c4;",
                  o->pre, o->slot, base, o->o0, o->pre, (long long)o->s_outer, o->pre);
    sg__emit_line(
        e, "const bool %s_v = (((sg_u64)((const float *)s%d + %s + %s * %lldLL)) & 15) == 0;",
        o->pre, o->slot, base, o->o0, (long long)o->s_outer);
}

/* Its step at kl into buffer buf, asynchronously; elements past M, N or
 * the slice's K are zeros. */
static void emit_mma_step(sg__cuda_gen *g, const mma_opnd *o) {
    sg__emit *e = sg__cuda_out(g);
    const char *x = o->pre;
    int per = o->rows * MMA_TK / MMA_THREADS;
    if (o->vec) {
        int rs = MMA_THREADS / (MMA_TK / 4);
        sg__emit_open(e, "if (%s_v)", x);
        sg__emit_line(e, "const float *const p = %s_p4 + kl;", x);
        for (int l = 0; l < per / 4; l++)
            sg__emit_line(e,
                          "sg_cp16(&%s[buf][%s_r4 + %d][%s_c4], p + %lldLL, %s + %s_r4 + %d < "
                          "%lldLL && kl + %s_c4 < k_hi);",
                          o->tile, x, l * rs, x, (long long)(l * rs * o->s_outer), o->o0, x, l * rs,
                          (long long)o->limit, x);
        sg__emit_close(e);
        sg__emit_open(e, "else");
    } else {
        sg__emit_open(e, "%s", "");
    }
    sg__emit_line(e, "const float *const p = %s_p + kl * %lldLL;", x, (long long)o->s_k);
    for (int l = 0; l < per; l++) {
        if (o->kfast)
            sg__emit_line(e,
                          "sg_cp4(&%s[buf][%s_r + %d][%s_c], p + %lldLL, %s + %s_r + %d < %lldLL "
                          "&& kl + %s_c < k_hi);",
                          o->tile, x, l * o->rstep, x, (long long)(l * o->rstep * o->s_outer),
                          o->o0, x, l * o->rstep, (long long)o->limit, x);
        else
            sg__emit_line(e,
                          "sg_cp4(&%s[buf][%s_r][%s_c + %d], p + %lldLL, %s + %s_r < %lldLL && "
                          "kl + %s_c + %d < k_hi);",
                          o->tile, x, x, l * o->cstep, (long long)(l * o->cstep * o->s_k), o->o0, x,
                          (long long)o->limit, x, l * o->cstep);
    }
    sg__emit_close(e);
}

/* Both operands' step `st` into buffer st % MMA_STAGES, when the slice has
 * it; a commit group either way (the waits count groups). */
static void emit_mma_issue(sg__cuda_gen *g, const mma_opnd *oa, const mma_opnd *ob,
                           const char *st) {
    sg__emit *e = sg__cuda_out(g);
    sg__emit_open(e, "if (%s < g_nst)", st);
    sg__emit_line(e, "const int buf = %s %% %d;", st, MMA_STAGES);
    sg__emit_line(e, "const sg_i64 kl = k_lo + (sg_i64)%s * %d;", st, MMA_TK);
    emit_mma_step(g, oa);
    emit_mma_step(g, ob);
    sg__emit_close(e);
    sg__emit_line(e, "sg_cp_commit();");
}

/* A loop over the thread's accumulator elements: g_mi, g_ni (its 16 x 8
 * tiles) and g_e (c0..c3 of mma.sync's layout), unrolled. */
static void open_acc_loop(sg__emit *e, int mi, int ni) {
    sg__emit_line(e, "#pragma unroll");
    sg__emit_open(e, "for (int g_mi = 0; g_mi < %d; g_mi++)", mi);
    sg__emit_line(e, "#pragma unroll");
    sg__emit_open(e, "for (int g_ni = 0; g_ni < %d; g_ni++)", ni);
    sg__emit_line(e, "#pragma unroll");
    sg__emit_open(e, "for (int g_e = 0; g_e < 4; g_e++)");
}

/* A warp's fragments of one operand for the k-step at kk: for each of its
 * n tiles (loop variable v), the TF32 head (<x>h) and remainder (<x>l) of
 * each element at tile[g_b]<idx[f]>, with row or column `rc` = `at`; the
 * heads only (cvt.rna.tf32) when `one`. */
static void emit_fragment(sg__emit *e, bool one, const char *x, const char *v, int n,
                          const char *rc, const char *at, const char *tile, const char *const *idx,
                          int nf) {
    sg__emit_line(e, "#pragma unroll");
    sg__emit_open(e, "for (int %s = 0; %s < %d; %s++)", v, v, n, v);
    sg__emit_line(e, "const int %s = %s;", rc, at);
    for (int f = 0; f < nf; f++)
        if (one)
            sg__emit_line(e, "%sh[%s][%d] = sg_tf32(%s[g_b]%s);", x, v, f, tile, idx[f]);
        else
            sg__emit_line(e, "sg_tf32_split(%s[g_b]%s, &%sh[%s][%d], &%sl[%s][%d]);", tile, idx[f],
                          x, v, f, x, v, f);
    sg__emit_close(e);
}

static const char *emit_mma(sg__cuda_gen *g, const sg__group *grp, const gemm *p,
                            sg__cuda_kinfo *ki) {
    sg__emit *e = sg__cuda_out(g);
    mma_geo q = mma_shape(p);
    const char *tf = getenv("SG_ALLOW_TF32");
    bool one = tf && strcmp(tf, "1") == 0; /* the TF32 heads only */
    int wm = q.bm / 2, wn = q.bn / 2, mi = wm / 16, ni = wn / 8, tile_n = q.bm * q.bn;
    sg__emit_line(e, "__shared__ __align__(16) float g_ta[%d][%d][%d];", MMA_STAGES, q.bm, MMA_LD);
    sg__emit_line(e, "__shared__ __align__(16) float g_tb[%d][%d][%d];", MMA_STAGES, q.bn, MMA_LD);
    sg__emit_line(e,
                  "const sg_i64 g_tile = (sg_i64)blockIdx.x / %lld, g_s = (sg_i64)blockIdx.x %% "
                  "%lld;",
                  (long long)q.split, (long long)q.split);
    sg__emit_line(e, "const sg_i64 bz = g_tile / %lld;", (long long)(q.tn * q.tm));
    sg__emit_line(e, "const sg_i64 m0 = g_tile / %lld %% %lld * %d, n0 = g_tile %% %lld * %d;",
                  (long long)q.tn, (long long)q.tm, q.bm, (long long)q.tn, q.bn);
    sg__emit_line(e, "const sg_i64 k_lo = g_s * %lld;", (long long)q.ks);
    sg__emit_line(e, "const sg_i64 k_hi = k_lo + %lld < %lld ? k_lo + %lld : %lld;",
                  (long long)q.ks, (long long)p->K, (long long)q.ks, (long long)p->K);
    sg__emit_line(e, "const int g_nst = (int)((k_hi - k_lo + %d) / %d);", MMA_TK - 1, MMA_TK);
    sg__emit_line(e, "const int g_w = (int)threadIdx.x / 32, g_l = (int)threadIdx.x %% 32;");
    sg__emit_line(e, "const int g8 = g_l / 4, t4 = g_l %% 4;");
    sg__emit_line(e, "const int wm = g_w / 2 * %d, wn = g_w %% 2 * %d;", wm, wn);
    emit_batch(g, p);
    bool a_kfast = p->acs == 1 || p->ars != 1;
    bool b_kfast = p->brs == 1 || p->bcs != 1;
    mma_opnd oa =
        mma_operand(g, p, "ga", "g_ta", p->a, p->abs_, "m0", p->M, p->ars, p->acs, a_kfast, q.bm);
    mma_opnd ob =
        mma_operand(g, p, "gb", "g_tb", p->b, p->bbs, "n0", p->N, p->bcs, p->brs, b_kfast, q.bn);
    emit_mma_setup(g, &oa, "a_o");
    emit_mma_setup(g, &ob, "b_o");
    sg__emit_line(e, "float acc[%d][%d][4];", mi, ni);
    open_acc_loop(e, mi, ni);
    sg__emit_line(e, "acc[g_mi][g_ni][g_e] = 0.0f;");
    sg__emit_close(e), sg__emit_close(e), sg__emit_close(e);
    /* MMA_STAGES - 1 steps in flight ahead of the one computed. */
    sg__emit_line(e, "#pragma unroll");
    sg__emit_open(e, "for (int g_st = 0; g_st < %d; g_st++)", MMA_STAGES - 1);
    emit_mma_issue(g, &oa, &ob, "g_st");
    sg__emit_close(e);
    sg__emit_open(e, "for (int g_it = 0; g_it < g_nst; g_it++)");
    sg__emit_line(e, "sg_cp_wait(%d);", MMA_STAGES - 2);
    sg__emit_line(e, "__syncthreads();");
    sg__emit_line(e, "const int g_b = g_it %% %d;", MMA_STAGES);
    /* The buffer computed in the step before: every thread is past it. */
    char ahead[32];
    snprintf(ahead, sizeof ahead, "(g_it + %d)", MMA_STAGES - 1);
    emit_mma_issue(g, &oa, &ob, ahead);
    /* The step's products in a partial of their own, added to acc in f32:
     * the tensor cores' accumulation truncates, so a long chain of them
     * in one register would drift by ~2^-23 a step. */
    sg__emit_line(e, "float part[%d][%d][4];", mi, ni);
    open_acc_loop(e, mi, ni);
    sg__emit_line(e, "part[g_mi][g_ni][g_e] = 0.0f;");
    sg__emit_close(e), sg__emit_close(e), sg__emit_close(e);
    sg__emit_raw(e, "#if __CUDA_ARCH__ >= 800\n");
    sg__emit_line(e, "#pragma unroll");
    sg__emit_open(e, "for (int kk = 0; kk < %d; kk += 8)", MMA_TK);
    if (one)
        sg__emit_line(e, "sg_u32 ah[%d][4], bh[%d][2];", mi, ni);
    else
        sg__emit_line(e, "sg_u32 ah[%d][4], al[%d][4], bh[%d][2], bl[%d][2];", mi, mi, ni, ni);
    static const char *const aidx[4] = {"[r][kk + t4]", "[r + 8][kk + t4]", "[r][kk + t4 + 4]",
                                        "[r + 8][kk + t4 + 4]"};
    static const char *const bidx[2] = {"[c][kk + t4]", "[c][kk + t4 + 4]"};
    emit_fragment(e, one, "a", "g_mi", mi, "r", "wm + g_mi * 16 + g8", "g_ta", aidx, 4);
    emit_fragment(e, one, "b", "g_ni", ni, "c", "wn + g_ni * 8 + g8", "g_tb", bidx, 2);
    sg__emit_line(e, "#pragma unroll");
    sg__emit_open(e, "for (int g_mi = 0; g_mi < %d; g_mi++)", mi);
    sg__emit_line(e, "#pragma unroll");
    sg__emit_open(e, "for (int g_ni = 0; g_ni < %d; g_ni++)", ni);
    if (!one) {
        sg__emit_line(e, "sg_mma_tf32(part[g_mi][g_ni], al[g_mi], bh[g_ni]);");
        sg__emit_line(e, "sg_mma_tf32(part[g_mi][g_ni], ah[g_mi], bl[g_ni]);");
    }
    sg__emit_line(e, "sg_mma_tf32(part[g_mi][g_ni], ah[g_mi], bh[g_ni]);");
    sg__emit_close(e), sg__emit_close(e), sg__emit_close(e);
    sg__emit_raw(e, "#else\n");
    sg__emit_open(e, "for (int kk = 0; kk < %d; kk++)", MMA_TK);
    open_acc_loop(e, mi, ni);
    sg__emit_line(e,
                  "part[g_mi][g_ni][g_e] += g_ta[g_b][wm + g_mi * 16 + g8 + (g_e >> 1) * 8][kk] * "
                  "g_tb[g_b][wn + g_ni * 8 + 2 * t4 + (g_e & 1)][kk];");
    sg__emit_close(e), sg__emit_close(e), sg__emit_close(e), sg__emit_close(e);
    sg__emit_raw(e, "#endif\n");
    open_acc_loop(e, mi, ni);
    sg__emit_line(e, "acc[g_mi][g_ni][g_e] += part[g_mi][g_ni][g_e];");
    sg__emit_close(e), sg__emit_close(e), sg__emit_close(e);
    sg__emit_close(e);
    if (q.split > 1) {
        /* The slices meet: partials in (element, thread) order, so a warp's
         * stores and loads are contiguous. */
        sg__emit_line(e, "static __device__ float g_part[%lld];",
                      (long long)(q.tiles * q.split * tile_n));
        sg__emit_line(e, "static __device__ unsigned int g_count[%lld];", (long long)q.tiles);
        sg__emit_line(e, "__shared__ bool g_last;");
        open_acc_loop(e, mi, ni);
        sg__emit_line(e, "const int j = (g_mi * %d + g_ni) * 4 + g_e;", ni);
        sg__emit_line(
            e, "g_part[(g_tile * %lld + g_s) * %d + j * %d + threadIdx.x] = acc[g_mi][g_ni][g_e];",
            (long long)q.split, tile_n, MMA_THREADS);
        sg__emit_close(e), sg__emit_close(e), sg__emit_close(e);
        sg__emit_line(e, "__threadfence();");
        sg__emit_line(e, "__syncthreads();");
        sg__emit_line(e, "if (threadIdx.x == 0) g_last = atomicAdd(&g_count[g_tile], 1u) == %lldu;",
                      (long long)(q.split - 1));
        sg__emit_line(e, "__syncthreads();");
        sg__emit_line(e, "if (!g_last) return;");
        sg__emit_line(e, "__threadfence();");
        open_acc_loop(e, mi, ni);
        sg__emit_line(e, "const int j = (g_mi * %d + g_ni) * 4 + g_e;", ni);
        sg__emit_line(e, "float v = 0.0f;");
        sg__emit_line(e,
                      "for (int s = 0; s < %lld; s++) v += __ldcg(&g_part[(g_tile * %lld + s) * %d "
                      "+ j * %d + threadIdx.x]);",
                      (long long)q.split, (long long)q.split, tile_n, MMA_THREADS);
        sg__emit_line(e, "acc[g_mi][g_ni][g_e] = v;");
        sg__emit_close(e), sg__emit_close(e), sg__emit_close(e);
        sg__emit_line(e, "if (threadIdx.x == 0) g_count[g_tile] = 0;");
    }
    open_acc_loop(e, mi, ni);
    sg__emit_line(e, "const sg_i64 m = m0 + wm + g_mi * 16 + g8 + (g_e >> 1) * 8;");
    sg__emit_line(e, "const sg_i64 n = n0 + wn + g_ni * 8 + 2 * t4 + (g_e & 1);");
    emit_store(g, grp, p, "acc[g_mi][g_ni][g_e]");
    sg__emit_close(e), sg__emit_close(e), sg__emit_close(e);
    ki->grid = (unsigned)(q.tiles * q.split);
    ki->block = MMA_THREADS;
    ki->iters = p->batch * p->M * p->N;
    ki->replaces_call = true;
    static const char *const what[2][2][2] = {
        {{"tiled GEMM on tensor cores (3xTF32 mma.sync, 32 x 32 per block), then the epilogue",
          "tiled GEMM on tensor cores (3xTF32 mma.sync, 32 x 32 per block, K split over "
          "blocks, the last adding the slices in order), then the epilogue"},
         {"tiled GEMM on tensor cores (3xTF32 mma.sync, 64 x 64 per block), then the epilogue",
          "tiled GEMM on tensor cores (3xTF32 mma.sync, 64 x 64 per block, K split), then the "
          "epilogue"}},
        {{"tiled GEMM on tensor cores (TF32 mma.sync, 32 x 32 per block), then the epilogue",
          "tiled GEMM on tensor cores (TF32 mma.sync, 32 x 32 per block, K split over blocks, "
          "the last adding the slices in order), then the epilogue"},
         {"tiled GEMM on tensor cores (TF32 mma.sync, 64 x 64 per block), then the epilogue",
          "tiled GEMM on tensor cores (TF32 mma.sync, 64 x 64 per block, K split), then the "
          "epilogue"}}};
    return what[one][q.bm == 64][q.split > 1];
}

/* ------------------------------------------------------------ few columns */

/*
 * A product of few output columns (N <= NARROW_N: a classifier's logits,
 * W4's 128 x 10), K contiguous in both operands: a warp (32 work-items) per
 * row of C and slice of K, its lanes reading 16-byte vectors of the row of
 * A and of all N rows of B (L2 hits after the first warp), N sums a lane,
 * each folded over the warp (xor shuffles; sg__cuda_tree where the dialect
 * has none); the S warps of a row (S = 1, 2, 4 or 8, so that each lane
 * keeps at least two vectors of each operand) add their sums through
 * shared memory in slice order, and lane n of the first one stores column
 * n and runs the epilogue. Every sum runs in a fixed order
 * (deterministic). The tiled kernels spend a 32-wide tile on the N columns
 * and a second pass on split K's partials: W4's logits took 8.3 µs in ncu
 * on an H100 for 1.3M multiply-adds.
 */
#define NARROW_N 16
#define NARROW_WARPS 8  /* a block of 256 threads */
#define NARROW_LOADS 48 /* 16-byte vectors a lane loads before its sums */

static bool narrow_ok(const gemm *p) {
    int64_t v = 16 / (int64_t)sg_dtype_size(p->a->dtype);
    return p->N >= 1 && p->N <= NARROW_N && p->M >= 1 && p->nb == 0 && p->K >= 2 * v &&
           p->acs == 1 && p->brs == 1;
}

/* acc<c> += x * w<c> for every column: x the element `xl` of A, w<c> the
 * element of B's row c at the printf pattern `wl` (of c). */
static void narrow_fma(sg__cuda_gen *g, const gemm *p, const char *xl, const char *wl) {
    sg__emit *e = sg__cuda_out(g);
    sg__dialect d = sg__cuda_dialect(g);
    char lv[160], ld[400];
    sg__lower_widen(d, p->a->dtype, xl, ld, sizeof ld);
    sg__emit_line(e, "const float xf = %s;", ld);
    for (int64_t c = 0; c < p->N; c++) {
        snprintf(lv, sizeof lv, wl, (long long)c);
        sg__lower_widen(d, p->b->dtype, lv, ld, sizeof ld);
        sg__emit_line(e, "acc%lld += xf * %s;", (long long)c, ld);
    }
}

static const char *emit_narrow(sg__cuda_gen *g, const sg__group *grp, const gemm *p,
                               sg__cuda_kinfo *ki) {
    sg__emit *e = sg__cuda_out(g);
    sg__dialect d = sg__cuda_dialect(g);
    const sg__spell *sp = sg__spell_of(d);
    const char *ta = sg__lower_ctype(d, p->a->dtype), *gp = sp->gp;
    int64_t v = 16 / (int64_t)sg_dtype_size(p->a->dtype), kv = p->K / v, n = p->N;
    /* Warps per row: at least two vectors a lane, the grid within a few
     * blocks an SM (132 on an H100). */
    int64_t per = cdiv(kv, 32);
    int ks = 1;
    while (2 * ks <= NARROW_WARPS && per / (2 * ks) >= 2 &&
           cdiv(p->M * 2 * ks, NARROW_WARPS) <= 4 * MMA_FILL)
        ks *= 2;
    int rows = NARROW_WARPS / ks, st = 32 * ks;
    int u = (int)(NARROW_LOADS / (n + 1)), need = (int)cdiv(kv, st);
    if (u > need) u = need;
    if (u < 1) u = 1;
    /* 16-byte vectors where every row of both operands starts on one. */
    bool vec = p->ars % v == 0 && p->bcs % v == 0 && p->a->offset % v == 0 && p->b->offset % v == 0;
    sg__emit_line(e, "const int g_l = (int)%s & 31, g_w = (int)%s >> 5;", sp->tid, sp->tid);
    sg__emit_line(e, "const int g_kw = g_w %% %d;", ks);
    sg__emit_line(e, "const sg_i64 bz = 0, m = (sg_i64)%s * %d + g_w / %d;", sp->bid, rows, ks);
    /* A warp past M reads row M - 1 again (stores nothing): every thread
     * reaches the barriers. */
    sg__emit_line(e, "const sg_i64 g_m = m < %lld ? m : %lld;", (long long)p->M,
                  (long long)(p->M - 1));
    sg__emit_line(e, "%sconst %s *const g_x = (%sconst %s *)s%d + (%lld + g_m * %lld);", gp, ta, gp,
                  ta, sg__cuda_slot(g, p->a->slot), (long long)p->a->offset, (long long)p->ars);
    for (int64_t c = 0; c < n; c++) {
        sg__emit_line(e, "%sconst %s *const g_b%lld = (%sconst %s *)s%d + %lld;", gp, ta,
                      (long long)c, gp, ta, sg__cuda_slot(g, p->b->slot),
                      (long long)(p->b->offset + c * p->bcs));
        sg__emit_line(e, "float acc%lld = 0.0f;", (long long)c);
    }
    sg__emit_line(e, "sg_i64 g_k0 = 0; /* the first element summed one at a time */");
    if (vec) {
        char cond[64 * NARROW_N + 64];
        size_t q = (size_t)snprintf(cond, sizeof cond, "(((sg_u64)g_x");
        for (int64_t c = 0; c < n; c++)
            q += (size_t)snprintf(cond + q, sizeof cond - q, " | (sg_u64)g_b%lld", (long long)c);
        snprintf(cond + q, sizeof cond - q, ") & 15) == 0");
        sg__emit_open(e, "if (%s)", cond);
        sg__emit_line(e, "g_k0 = %lld;", (long long)(kv * v));
        sg__emit_open(e, "for (sg_i64 q0 = g_kw * 32 + g_l; q0 < %lld; q0 += %d)", (long long)kv,
                      st * u);
        sg__emit_line(e, "union { sg_v16 v; %s e[%lld]; } xv[%d], wv[%d][%lld];", ta, (long long)v,
                      u, u, (long long)n);
        sg__emit_line(e, "#pragma unroll");
        sg__emit_open(e, "for (int j = 0; j < %d; j++)", u);
        sg__emit_open(e, "if (q0 + j * %d < %lld)", st, (long long)kv);
        sg__emit_line(e, "xv[j].v = ((%sconst sg_v16 *)g_x)[q0 + j * %d];", gp, st);
        for (int64_t c = 0; c < n; c++)
            sg__emit_line(e, "wv[j][%lld].v = ((%sconst sg_v16 *)g_b%lld)[q0 + j * %d];",
                          (long long)c, gp, (long long)c, st);
        sg__emit_close(e);
        sg__emit_close(e);
        sg__emit_line(e, "#pragma unroll");
        sg__emit_open(e, "for (int j = 0; j < %d; j++)", u);
        sg__emit_open(e, "if (q0 + j * %d < %lld)", st, (long long)kv);
        sg__emit_line(e, "#pragma unroll");
        sg__emit_open(e, "for (int t = 0; t < %lld; t++)", (long long)v);
        narrow_fma(g, p, "xv[j].e[t]", "wv[j][%lld].e[t]");
        sg__emit_close(e);
        sg__emit_close(e);
        sg__emit_close(e);
        sg__emit_close(e);
        sg__emit_close(e);
    }
    /* The elements past the vectors (all of them where rows are unaligned). */
    sg__emit_open(e, "for (sg_i64 k = g_k0 + g_kw * 32 + g_l; k < %lld; k += %d)", (long long)p->K,
                  st);
    narrow_fma(g, p, "g_x[k]", "g_b%lld[k]");
    sg__emit_close(e);
    /* Each column's sum over the warp. */
    for (int64_t c0 = 0; c0 < n; c0 += 4) {
        int nv = (int)(n - c0 < 4 ? n - c0 : 4);
        char names[4][24], others[4][16], fold[256];
        const char *ty[4], *var[4], *oth[4];
        size_t q = 0;
        for (int j = 0; j < nv; j++) {
            snprintf(names[j], sizeof names[j], "acc%lld", (long long)(c0 + j));
            snprintf(others[j], sizeof others[j], "o%d", j);
            ty[j] = "float", var[j] = names[j], oth[j] = others[j];
            q += (size_t)snprintf(fold + q, sizeof fold - q, "%s += o%d; ", names[j], j);
            if (sp->shuffles)
                sg__emit_line(e,
                              "for (int o = 16; o > 0; o >>= 1) %s += __shfl_xor_sync(0xffffffffu, "
                              "%s, o);",
                              names[j], names[j]);
        }
        if (!sp->shuffles) sg__cuda_tree(g, nv, ty, var, oth, fold, 1);
    }
    /* Lane n's column: its sum selected from the registers. */
    char sel[40 * NARROW_N + 16];
    size_t q = 0;
    for (int64_t c = n - 1; c > 0; c--)
        q += (size_t)snprintf(sel + q, sizeof sel - q, "g_l == %lld ? acc%lld : ", (long long)c,
                              (long long)c);
    snprintf(sel + q, sizeof sel - q, "acc0");
    sg__emit_line(e, "float g_sum = %s;", sel);
    if (ks > 1) {
        sg__cuda_shared(g, 0, "float g_red[%d][%lld]", NARROW_WARPS, (long long)n);
        sg__emit_line(e, "if (g_l < %lld) g_red[g_w][g_l] = g_sum;", (long long)n);
        sg__emit_line(e, "%s", sp->sync);
        sg__emit_line(e, "if (g_kw == 0 && g_l < %lld)", (long long)n);
        sg__emit_line(e, "    for (int s = 1; s < %d; s++) g_sum += g_red[g_w + s][g_l];", ks);
    }
    sg__emit_open(e, "if (g_kw == 0)");
    sg__emit_line(e, "const sg_i64 n = g_l;");
    emit_store(g, grp, p, "g_sum");
    sg__emit_close(e);
    ki->grid = (unsigned)cdiv(p->M, rows);
    ki->block = 32 * NARROW_WARPS;
    ki->iters = p->M * p->N;
    ki->replaces_call = true;
    return "few columns: a warp per row and slice of K, N sums a lane folded over the warp, the "
           "slices added in order, then the epilogue";
}

const char *sg__cgen_gemm(sg__cuda_gen *g, const sg__group *grp, sg__cuda_kinfo *ki) {
    gemm p;
    if (!plan(g, grp, &p)) return NULL;
    bool small = p.K <= MMA_SMALL_K &&
                 (double)p.batch * (double)p.M * (double)p.N * (double)p.K <= (double)MMA_SMALL;
    switch (kind_of(sg__cuda_dialect(g), p.a->dtype, small, narrow_ok(&p))) {
    case GEMM_LIBRARY: return NULL;
    case GEMM_NARROW: return emit_narrow(g, grp, &p, ki);
    case GEMM_MMA: return emit_mma(g, grp, &p, ki);
    case GEMM_SIMT: break;
    }
    emit_simt(g, grp, &p, ki);
    return "tiled GEMM (64 x 64 per block, K through shared memory), then the epilogue";
}
