/* SPDX-License-Identifier: MIT */
/*
 * cgen_gemm.c -- the generated GEMM: a MATMUL group (a matmul or linear
 * anchor, then its pointwise epilogue) as one tiled kernel, for backends
 * that have no BLAS library (Level Zero always, HIP without hipBLASLt) and,
 * on CUDA, when SG_CUDA_GEMM=generated asks for it (sg__cgen_gemm_wanted).
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
 * Groups it does not take (sg__cgen_gemm returns false): a norm merged in
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

bool sg__cgen_gemm_wanted(sg__dialect d) {
    if (d == SG__DIALECT_OPENCL || d == SG__DIALECT_HIP) return true;
    const char *e = getenv("SG_CUDA_GEMM");
    return d == SG__DIALECT_CUDA && e && strcmp(e, "generated") == 0;
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
        grp->ncopies)
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

/* Element (m, n) of the block: the anchor's value from acc[ri][cj] (plus
 * the bias), its store, the epilogue at walk index i. */
static void emit_store(sg__cuda_gen *g, const sg__group *grp, const gemm *p) {
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
        snprintf(sum, sizeof sum, "(%s + acc[ri][cj])", ld);
    } else {
        snprintf(sum, sizeof sum, "acc[ri][cj]");
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

bool sg__cgen_gemm(sg__cuda_gen *g, const sg__group *grp, sg__cuda_kinfo *ki) {
    gemm p;
    if (!plan(g, grp, &p)) return false;
    sg__emit *e = sg__cuda_out(g);
    const sg__spell *sp = sg__spell_of(sg__cuda_dialect(g));
    int64_t tn = (p.N + TILE - 1) / TILE, tm = (p.M + TILE - 1) / TILE;
    sg__emit_line(e, "%s float sg_ta[%d][%d];", sp->shared, TK, TILE);
    sg__emit_line(e, "%s float sg_tb[%d][%d];", sp->shared, TK, TILE);
    sg__emit_line(e, "const sg_i64 t = (sg_i64)%s;", sp->bid);
    sg__emit_line(e, "const sg_i64 bz = t / %lld;", (long long)(tn * tm));
    sg__emit_line(e, "const sg_i64 m0 = t / %lld %% %lld * %d, n0 = t %% %lld * %d;", (long long)tn,
                  (long long)tm, TILE, (long long)tn, TILE);
    sg__emit_line(e, "const int tx = (int)%s %% 16, ty = (int)%s / 16;", sp->tid, sp->tid);
    emit_batch(g, &p);
    sg__emit_line(e, "float acc[%d][%d];", PER, PER);
    sg__emit_line(e, "for (int ri = 0; ri < %d; ri++)", PER);
    sg__emit_line(e, "    for (int cj = 0; cj < %d; cj++) acc[ri][cj] = 0.0f;", PER);
    sg__emit_open(e, "for (sg_i64 k0 = 0; k0 < %lld; k0 += %d)", (long long)p.K, TK);
    /* A's rows are m, B's are n; each loads along its contiguous dim. */
    bool a_kfast = p.acs == 1 || p.ars != 1;
    bool b_kfast = p.brs == 1 || p.bcs != 1;
    emit_tile_load(g, "sg_ta", p.a, "a_o", "m0", p.M, p.ars, p.acs, a_kfast, p.K);
    emit_tile_load(g, "sg_tb", p.b, "b_o", "n0", p.N, p.bcs, p.brs, b_kfast, p.K);
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
    emit_store(g, grp, &p);
    sg__emit_close(e);
    sg__emit_close(e);
    ki->grid = (unsigned)(tn * tm * p.batch);
    ki->block = THREADS;
    ki->iters = p.batch * p.M * p.N;
    ki->replaces_call = true;
    return true;
}
