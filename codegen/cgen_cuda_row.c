/* SPDX-License-Identifier: MIT */
/*
 * cgen_cuda_row.c -- the CUDA dialect's row kernels: a ROW or REDUCE group
 * that fusion marks rows_inline (fusion.h) becomes one kernel that computes
 * its pointwise prologue, its anchor and its epilogues, so no library call
 * runs for it:
 *   softmax, log_softmax over the last dim, layer_norm, rms_norm;
 *   sum, mean and var over the innermost dims, with the epilogue over the
 *   reduced shape and then over the input's shape (the written-out
 *   x * rsqrt(mean(x * x) + eps) * w in one kernel);
 *   argmax over the innermost dims (no epilogue: its i64 result is stored),
 *   with PyTorch's order: NaN above every number, then the first position
 *   among equals -- a total order, so lanes combine in any order;
 *   sum and mean over leading dims that keep inner columns ((A, R, C) ->
 *   (A, 1, C), a bias gradient): a block per 32 columns (emit_columns).
 * A sum, mean or argmax over a few long rows (a gradient's squared norm:
 * one row of 38.6M) is cut over ~1024 blocks, and so is a column sum with
 * few column tiles; the last block to finish combines the partials in a
 * fixed order (emit_split), so results are the same bits every launch.
 *
 * A team works one row: a warp for rows of at most 256 elements, else a
 * block of 256 threads. Lane j of a team takes elements j, j + team, ...;
 * the team combines its lanes with shuffles (and, for a block, one shared
 * word per warp summed in a fixed order), in f32. Softmax subtracts the
 * row's max (a row read from memory takes max and sum in one pass, the sum
 * rescaled as the max grows); layer_norm takes the variance about the mean
 * in a second pass. A norm of at most 8 elements a lane reads its scale
 * and shift with the row in the first pass, not after the statistics.
 * A row of at most 32 elements per lane is computed once into registers
 * (prologue included) and read from there by every pass; a longer row is
 * recomputed from memory by each pass, its prologue storing only in the
 * last pass that computes it (an in-place prologue must not read its own
 * result back). Passes over memory load 8 elements per lane before using
 * them, and the write pass (and a reduction's epilogue over the input's
 * shape) computes 8 elements, keeping the values to store, before a second
 * walk stores them: no load waits behind a store (deferred_walk).
 *
 * The same rows, with every block computing all of them, open a GEMV kernel
 * whose x is the norm's result (sg__cgen_cuda_rows_into): the value the
 * matmul reads goes to an array in shared memory, rounded to its dtype as
 * its store would round it.
 *
 * A contiguous softmax or norm row whose width is a multiple of a 16-byte
 * vector is laid out in vectors instead (vec_plan): lane j keeps vectors
 * j, j + team, ..., loaded and stored 16 bytes at a time when the row's
 * addresses sit on 16 bytes, a warp per row when they fit the registers.
 *
 * Loads, stores, ops and their rounding are cgen_cuda.c's (through the
 * helpers of codegen.h), so a fused row rounds as the unfused ops would.
 *
 * The same kernels in OpenCL C (sg__spell without shuffles): a team's
 * lanes combine through local memory in the shuffles' order
 * (sg__cuda_tree), a work-group is one team (its barriers are the
 * team's), and the cut rows and column ranges are folded chunk by chunk
 * by one work-group (emit_split_seq, emit_columns_seq): the same bits as
 * the CUDA kernels (but for rows in vectors, which OpenCL C keeps in the
 * scalar layout: their sums may differ by rounding), with no memory shared
 * between work-groups.
 */
#include "codegen.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BLOCK 256             /* threads per block, as cgen_cuda.c launches */
#define WARP_ROW 256          /* rows up to this length take a warp */
#define REG_MAX 32            /* elements per lane kept in registers */
#define TARGET_BLOCKS 1024    /* a long reduction's blocks: a wave of 8 per SM on an H100 */
#define SPLIT_LEAST 8192      /* positions per block of a cut row, at least */
#define SPLIT_LEAST_ARGMAX 2048 /* an argmax's (a vocabulary's logits: one load batch a thread) */
#define GRID_MAX (65535 * 16) /* more blocks stride over the work */

typedef struct rowk {
    sg__cuda_gen *g;
    sg__emit *e;
    const sg__group *grp;
    const sg__irnode *an;    /* the anchor */
    const sg__ref *x, *o;    /* its input and output */
    int a;                   /* the anchor's index in grp->g */
    int64_t rows, len, cols; /* cols: a column sum's kept inner extent, else 1 */
    int team, per;           /* threads per row; elements per lane (registers), 0 when re-read */
    int nd;                  /* the input's shape: the walk of prologue and row epilogue */
    const int64_t *shape;
    bool flat;       /* that walk is flat */
    int nred;        /* shared arrays declared so far */
    sg__group quiet; /* grp with no member storing */
    int sink;        /* GEMV prologue: the member whose value goes to xs[i], else -1 */
    const char *xs;
    const sg__spell *sp;               /* the dialect's spellings */
    int block;                         /* threads per block (OpenCL C: a team's; see row_setup) */
    char ninf[40], pinf[40], qnan[40]; /* -inf, +inf and NaN from their bits */
    bool wreg;        /* a norm's scale and shift, read by the first pass into r_pw1, r_pw2 */
    int vw;           /* elements per 16-byte vector of a row in vectors (vec_plan), else 0 */
    bool vld, vst;    /* that row's input loads, its result stores 16 bytes at a time */
    bool vpar;        /* and (vst) a norm's scale and shift load 16 bytes at a time */
    const char *vout; /* row_write narrows the anchor's value into this lvalue instead */
} rowk;

/* The column of register element `t` (a C expression): lane j's
 * elements are j, j + team, ...; in a row of vectors (k->vw) lane j's
 * are the vectors j, j + team, ... of vw columns each. */
static void col_of(const rowk *k, const char *t, char *buf, size_t size) {
    if (k->vw)
        snprintf(buf, size, "((sg_i64)(r_lane + (%s) / %d * %d) * %d + (%s) %% %d)", t, k->vw,
                 k->team, k->vw, t, k->vw);
    else
        snprintf(buf, size, "(r_lane + (sg_i64)(%s) * %d)", t, k->team);
}

/* `var` combined over the team (op: "+" for a sum, else fmaxf). */
static void team_reduce(rowk *k, const char *var, bool max) {
    if (!k->sp->shuffles) {
        const char *t[1] = {"float"}, *v[1] = {var}, *o[1] = {"r_o"};
        char fold[96];
        if (max)
            snprintf(fold, sizeof fold, "%s = fmax%s(%s, r_o);", var, k->sp->mf, var);
        else
            snprintf(fold, sizeof fold, "%s += r_o;", var);
        sg__cuda_tree(k->g, 1, t, v, o, fold, k->team / 32);
        return;
    }
    if (max)
        sg__emit_line(
            k->e,
            "for (int o = %d; o > 0; o >>= 1) %s = fmaxf(%s, __shfl_xor_sync(0xffffffffu, "
            "%s, o));",
            k->team > 32 ? 16 : k->team / 2, var, var, var);
    else
        sg__emit_line(k->e,
                      "for (int o = %d; o > 0; o >>= 1) %s += __shfl_xor_sync(0xffffffffu, %s, o);",
                      k->team > 32 ? 16 : k->team / 2, var, var);
    if (k->team <= 32) return;
    int r = k->nred++;
    sg__emit_open(k->e, "%s", "");
    sg__cuda_shared(k->g, 0, "float r_red%d[%d]", r, k->team / 32);
    sg__emit_line(k->e, "if ((threadIdx.x & 31) == 0) r_red%d[threadIdx.x >> 5] = %s;", r, var);
    sg__emit_line(k->e, "__syncthreads();");
    sg__emit_line(k->e, "%s = r_red%d[0];", var, r);
    if (max)
        sg__emit_line(k->e, "for (int w = 1; w < %d; w++) %s = fmaxf(%s, r_red%d[w]);",
                      k->team / 32, var, var, r);
    else
        sg__emit_line(k->e, "for (int w = 1; w < %d; w++) %s += r_red%d[w];", k->team / 32, var, r);
    sg__emit_close(k->e);
}

/* The softmax statistics (r_m, r_s) combined over the team: the max, and
 * each sum of exps rescaled to it. Lanes that saw nothing hold (-inf, 0). */
static void team_reduce_ms(rowk *k) {
    char ms[400];
    const char *mf = k->sp->mf;
    snprintf(ms, sizeof ms,
             "{ const float r_nm = fmax%s(r_m, r_om); r_s = (r_m == r_nm ? r_s : r_s * exp%s(r_m "
             "- r_nm)) + (r_om == r_nm ? r_os : r_os * exp%s(r_om - r_nm)); r_m = r_nm; }",
             mf, mf, mf);
    if (!k->sp->shuffles) {
        const char *t[2] = {"float", "float"}, *v[2] = {"r_m", "r_s"}, *o[2] = {"r_om", "r_os"};
        sg__cuda_tree(k->g, 2, t, v, o, ms, k->team / 32);
        return;
    }
    sg__emit_open(k->e, "for (int o = %d; o > 0; o >>= 1)", k->team > 32 ? 16 : k->team / 2);
    sg__emit_line(k->e, "const float r_om = __shfl_xor_sync(0xffffffffu, r_m, o);");
    sg__emit_line(k->e, "const float r_os = __shfl_xor_sync(0xffffffffu, r_s, o);");
    sg__emit_line(k->e, "%s", ms);
    sg__emit_close(k->e);
    if (k->team <= 32) return;
    int r = k->nred;
    k->nred += 2;
    sg__emit_open(k->e, "%s", "");
    sg__cuda_shared(k->g, 0, "float r_red%d[%d], r_red%d[%d]", r, k->team / 32, r + 1,
                    k->team / 32);
    sg__emit_line(k->e,
                  "if ((threadIdx.x & 31) == 0) r_red%d[threadIdx.x >> 5] = r_m, "
                  "r_red%d[threadIdx.x >> 5] = r_s;",
                  r, r + 1);
    sg__emit_line(k->e, "__syncthreads();");
    sg__emit_line(k->e, "r_m = r_red%d[0], r_s = r_red%d[0];", r, r + 1);
    sg__emit_open(k->e, "for (int w = 1; w < %d; w++)", k->team / 32);
    sg__emit_line(k->e, "const float r_om = r_red%d[w], r_os = r_red%d[w];", r, r + 1);
    sg__emit_line(k->e, "%s", ms);
    sg__emit_close(k->e);
    sg__emit_close(k->e);
}

/* The two f32 sums r_q and r_dm combined over the team, each in
 * team_reduce's order (so each has the bits it would alone), side by side
 * so that their shuffles overlap. */
static void team_reduce_qd(rowk *k) {
    if (!k->sp->shuffles) {
        const char *t[2] = {"float", "float"}, *v[2] = {"r_q", "r_dm"}, *o[2] = {"r_oq", "r_odm"};
        sg__cuda_tree(k->g, 2, t, v, o, "r_q += r_oq; r_dm += r_odm;", k->team / 32);
        return;
    }
    sg__emit_open(k->e, "for (int o = %d; o > 0; o >>= 1)", k->team > 32 ? 16 : k->team / 2);
    sg__emit_line(k->e, "r_q += __shfl_xor_sync(0xffffffffu, r_q, o);");
    sg__emit_line(k->e, "r_dm += __shfl_xor_sync(0xffffffffu, r_dm, o);");
    sg__emit_close(k->e);
    if (k->team <= 32) return;
    int r = k->nred;
    k->nred += 2;
    sg__emit_open(k->e, "%s", "");
    sg__cuda_shared(k->g, 0, "float r_red%d[%d], r_red%d[%d]", r, k->team / 32, r + 1,
                    k->team / 32);
    sg__emit_line(k->e,
                  "if ((threadIdx.x & 31) == 0) r_red%d[threadIdx.x >> 5] = r_q, "
                  "r_red%d[threadIdx.x >> 5] = r_dm;",
                  r, r + 1);
    sg__emit_line(k->e, "__syncthreads();");
    sg__emit_line(k->e, "r_q = r_red%d[0], r_dm = r_red%d[0];", r, r + 1);
    sg__emit_line(k->e, "for (int w = 1; w < %d; w++) r_q += r_red%d[w], r_dm += r_red%d[w];",
                  k->team / 32, r, r + 1);
    sg__emit_close(k->e);
}

/*
 * A row's mean and the sum of squares about it, by the corrected two-pass
 * rule: r_q sums (x - m)^2 and r_dm sums (x - m) about the f32 mean m of
 * the first pass, whose rounding (large for a row far from zero: a mean of
 * ~1000 is off by up to half its ulp, 3e-5, in f32) the second sum
 * measures and takes back: the mean is m + r_mc with r_mc = r_dm / n, and
 * sum (x - mean)^2 = r_q - r_dm^2 / n. After it r_m0, r_mc and r_q hold
 * those; x - m0 is exact for x near the mean, so x - mean is taken as
 * (x - r_m0) - r_mc, not against a mean rounded to f32. `pass` emits the
 * second pass over the row with the fold it is given.
 */
static void stat_pass(rowk *k, bool fill, const char *fold);
static void chunk_loop(rowk *k, const char *start, const char *hi, int step, int u,
                       const char *fold, bool quiet);
static int chunk_of(int64_t len, int step, int u);

/* The second pass of a norm's statistics (its registers or its chunks). */
static void norm_second_pass(rowk *k, const char *fold) { stat_pass(k, false, fold); }

/* The second pass of a var anchor: the row in chunks, its prologue quiet. */
static void var_second_pass(rowk *k, const char *fold) {
    char hi[32];
    snprintf(hi, sizeof hi, "%lldLL", (long long)k->len);
    chunk_loop(k, "r_lane", hi, k->team, chunk_of(k->len, k->team, 8), fold, true);
}

static void corrected_q(rowk *k, void (*pass)(rowk *, const char *)) {
    sg__emit_line(k->e, "const float r_m0 = r_s / %lld.0f;", (long long)k->len);
    sg__emit_line(k->e, "float r_q = 0.0f, r_dm = 0.0f;");
    pass(k, "{ const float r_d = r_x - r_m0; r_q += r_d * r_d; r_dm += r_d; }");
    team_reduce_qd(k);
    sg__emit_line(k->e, "const float r_mc = r_dm / %lld.0f;", (long long)k->len);
    sg__emit_line(k->e, "r_q -= r_dm * (r_dm / %lld.0f);", (long long)k->len);
}

/* In the current scope: i for column r_c of the row, and (unless flat) its indices. */
static void walk_index(rowk *k) {
    if (k->cols > 1) /* (r_row, r_c, r_col) of the (rows, len, cols) walk */
        sg__emit_line(k->e, "const sg_i64 i = (r_row * %lldLL + r_c) * %lldLL + r_col;",
                      (long long)k->len, (long long)k->cols);
    else
        sg__emit_line(k->e, "const sg_i64 i = r_row * %lldLL + r_c;", (long long)k->len);
    if (!k->flat) sg__cuda_unflatten(k->g, k->nd, k->shape);
}

/* r_x = the anchor's input at column r_c: the prologue, or a load.
 * `stores`: the prologue stores what it marks. */
static void row_input(rowk *k, bool stores) {
    walk_index(k);
    const sg__group *grp = stores ? k->grp : &k->quiet;
    if (k->a > 0) sg__cuda_members(k->g, grp, 0, k->a, k->nd, k->shape, k->flat);
    int src = k->grp->g[k->a].arg_src[0];
    char lv[400], ld[480];
    if (src >= 0) {
        sg__emit_line(k->e, "r_x = v%d;", src);
    } else {
        sg__cuda_lvalue(k->g, k->x, k->nd, k->shape, k->flat, lv, sizeof lv);
        sg__cuda_widen(k->x->dtype, lv, ld, sizeof ld);
        sg__emit_line(k->e, "r_x = %s;", ld);
    }
}

/* Argument j (1: scale, 2: shift) of the norm at column r_c, widened, into ld. */
static void norm_param(rowk *k, int j, char *ld, size_t size) {
    const sg__ref *p = sg__cuda_arg(k->g, k->an, j);
    char off[128], lv[400];
    snprintf(off, sizeof off, "%lld + r_c * %lldLL", (long long)p->offset, (long long)p->stride[0]);
    sg__cuda_lvalue_at(k->g, p, off, lv, sizeof lv);
    sg__cuda_widen(p->dtype, lv, ld, size);
}

/* Whether a member of the group stores into the norm's scale or shift
 * (then they are read after the statistics, where the scalar path reads
 * them). */
static bool norm_params_written(const rowk *k) {
    const sg__ir *ir = sg__cuda_ir(k->g);
    for (int j = 1; j < k->an->nin && j < 3; j++) {
        const sg__ref *p = sg__cuda_arg(k->g, k->an, j);
        for (int m = 0; p && m < k->grp->n; m++)
            if (k->grp->g[m].store &&
                sg__cuda_ref(k->g, ir->nodes[k->grp->g[m].node].out)->slot == p->slot)
                return true;
    }
    return false;
}

/* The first pass's loads of the norm's scale and shift at column r_c, in
 * flight with the row's (k->wreg), so that the write pass waits for no
 * load after the statistics. */
static void norm_params_load(rowk *k) {
    char ld[480];
    for (int j = 1; j < k->an->nin && j < 3; j++) {
        if (!sg__cuda_arg(k->g, k->an, j)) continue;
        norm_param(k, j, ld, sizeof ld);
        sg__emit_line(k->e, "r_pw%d[r_t] = %s;", j, ld);
    }
}

/*
 * k->wreg: a norm whose row lives in registers, at most 8 a lane, reads its
 * scale and shift in the first pass when no member of the group writes
 * them (declaring r_pw1, r_pw2).
 */
static void norm_params_plan(rowk *k) {
    k->wreg = k->per > 0 && k->per <= 8 && !k->vpar &&
              (k->an->op == SG__OP_LAYER_NORM || k->an->op == SG__OP_RMS_NORM) &&
              !norm_params_written(k);
    for (int j = 1; k->wreg && j < k->an->nin && j < 3; j++)
        if (sg__cuda_arg(k->g, k->an, j)) sg__emit_line(k->e, "float r_pw%d[%d];", j, k->per);
}

/* The 16-byte vector type of a row in vectors: a union with its elements. */
static void vec_union(const rowk *k, const sg__ref *r, const char *name, int n) {
    const char *ct = sg__lower_ctype(sg__cuda_dialect(k->g), r->dtype);
    if (n)
        sg__emit_line(k->e, "union { sg_v16 v; %s e[%d]; } %s[%d];", ct, k->vw, name, n);
    else
        sg__emit_line(k->e, "union { sg_v16 v; %s e[%d]; } %s;", ct, k->vw, name);
}

/* The address of ref r's row r_row (a flat, contiguous row) into buf. */
static void vec_row_base(rowk *k, const sg__ref *r, char *buf, size_t size) {
    char off[96], lv[400];
    snprintf(off, sizeof off, "%lldLL + r_row * %lldLL", (long long)r->offset, (long long)k->len);
    sg__cuda_lvalue_at(k->g, r, off, lv, sizeof lv);
    snprintf(buf, size, "&%s", lv);
}

/* The address of a norm's scale or shift (contiguous) into buf. */
static void vec_param_base(rowk *k, const sg__ref *r, char *buf, size_t size) {
    char off[32], lv[400];
    snprintf(off, sizeof off, "%lldLL", (long long)r->offset);
    sg__cuda_lvalue_at(k->g, r, off, lv, sizeof lv);
    snprintf(buf, size, "&%s", lv);
}

/* r_al: this row's vector accesses sit on 16 bytes (the row's input when
 * k->vld, its result when k->vst); when not, the same elements go
 * through the scalar loads and stores, in the same order. */
static void vec_check(rowk *k) {
    char a[420], b[420], p[2][420];
    if (k->vld) vec_row_base(k, k->x, a, sizeof a);
    if (k->vst) vec_row_base(k, k->o, b, sizeof b);
    for (int j = 1; j < 3; j++) {
        const sg__ref *r = k->vpar && j < k->an->nin ? sg__cuda_arg(k->g, k->an, j) : NULL;
        snprintf(p[j - 1], sizeof p[j - 1], "0");
        if (r) vec_param_base(k, r, p[j - 1], sizeof p[j - 1]);
    }
    sg__emit_line(k->e,
                  "const bool r_al = (((sg_u64)%s | (sg_u64)%s | (sg_u64)%s | (sg_u64)%s) & 15) "
                  "== 0;",
                  k->vld ? a : "0", k->vst ? b : "0", p[0], p[1]);
}

/* The first pass's loads of a row in vectors: vector q of lane j into r_l[q]. */
static void vec_loads(rowk *k) {
    int nq = k->per / k->vw;
    char base[420];
    vec_row_base(k, k->x, base, sizeof base);
    vec_union(k, k->x, "r_l", nq);
    sg__emit_open(k->e, "if (r_al)");
    sg__emit_line(k->e, "#pragma unroll");
    sg__emit_open(k->e, "for (int r_q = 0; r_q < %d; r_q++)", nq);
    sg__emit_line(k->e, "const sg_i64 r_v = r_lane + (sg_i64)r_q * %d;", k->team);
    sg__emit_line(k->e, "if (r_v < %lldLL) r_l[r_q].v = ((%sconst sg_v16 *)%s)[r_v];",
                  (long long)(k->len / k->vw), k->sp->gp, base);
    sg__emit_close(k->e);
    sg__emit_close(k->e);
}

/* The first pass's loads of a norm's scale and shift in vectors (k->vpar):
 * lane j's vectors of them into r_p1[q], r_p2[q], in flight with the row's,
 * so that the write pass waits for no load after the statistics. */
static void vec_param_loads(rowk *k) {
    int nq = k->per / k->vw;
    for (int j = 1; j < k->an->nin && j < 3; j++) {
        const sg__ref *r = sg__cuda_arg(k->g, k->an, j);
        if (!r) continue;
        char pb[420], nm[8];
        vec_param_base(k, r, pb, sizeof pb);
        snprintf(nm, sizeof nm, "r_p%d", j);
        vec_union(k, r, nm, nq);
        sg__emit_open(k->e, "if (r_al)");
        sg__emit_line(k->e, "#pragma unroll");
        sg__emit_open(k->e, "for (int r_q = 0; r_q < %d; r_q++)", nq);
        sg__emit_line(k->e, "const sg_i64 r_v = r_lane + (sg_i64)r_q * %d;", k->team);
        sg__emit_line(k->e, "if (r_v < %lldLL) r_p%d[r_q].v = ((%sconst sg_v16 *)%s)[r_v];",
                      (long long)(k->len / k->vw), j, k->sp->gp, pb);
        sg__emit_close(k->e);
        sg__emit_close(k->e);
    }
}

/*
 * One pass over the row: `body` runs once per column with the input in
 * r_x (and the column in r_c). From registers when the row lives there
 * (r_xr, filled by the first pass, `fill`), else recomputed.
 */
static void pass_open(rowk *k, bool fill, bool stores) {
    if (k->per) {
        char c[160];
        col_of(k, "r_t", c, sizeof c);
        if (fill && k->vld) vec_loads(k);
        if (fill && k->vpar) vec_param_loads(k);
        sg__emit_line(k->e, "#pragma unroll");
        sg__emit_open(k->e, "for (int r_t = 0; r_t < %d; r_t++)", k->per);
        sg__emit_line(k->e, "const sg_i64 r_c = %s;", c);
        sg__emit_open(k->e, "if (r_c < %lldLL)", (long long)k->len);
        sg__emit_line(k->e, "float r_x;");
        if (fill) {
            if (k->vld) {
                char lv[64], ld[160];
                snprintf(lv, sizeof lv, "r_l[r_t / %d].e[r_t %% %d]", k->vw, k->vw);
                sg__cuda_widen(k->x->dtype, lv, ld, sizeof ld);
                sg__emit_line(k->e, "if (r_al) r_x = %s;", ld);
                sg__emit_open(k->e, "else");
            } else {
                sg__emit_open(k->e, "%s", "");
            }
            row_input(k, true);
            sg__emit_close(k->e);
            sg__emit_line(k->e, "r_xr[r_t] = r_x;");
            if (k->wreg) norm_params_load(k);
        } else {
            sg__emit_line(k->e, "r_x = r_xr[r_t];");
        }
    } else {
        sg__emit_open(k->e, "for (sg_i64 r_c = r_lane; r_c < %lldLL; r_c += %d)", (long long)k->len,
                      k->team);
        sg__emit_line(k->e, "float r_x;");
        sg__emit_open(k->e, "%s", "");
        row_input(k, stores);
        sg__emit_close(k->e);
    }
}

static void pass_close(rowk *k) {
    if (k->per) sg__emit_close(k->e);
    sg__emit_close(k->e);
}

/* A GEMV prologue's value (the sink member's, at element i) into its row
 * in shared memory, rounded to its dtype as its store would round it. */
static void sink_store(rowk *k) {
    if (k->sink < 0) return;
    char lv[400], v[16], st[1000];
    const sg__ref *x = sg__cuda_ref(k->g, sg__cuda_ir(k->g)->nodes[k->grp->g[k->sink].node].out);
    snprintf(lv, sizeof lv, "%s[i]", k->xs);
    snprintf(v, sizeof v, "v%d", k->sink);
    sg__cuda_narrow_store(x->dtype, lv, v, st, sizeof st);
    sg__cuda_store(k->g, true, k->sink, st);
}

/* The anchor's value at column r_c into v<a> (from r_x and the statistics),
 * its store, and the row epilogue: the write pass of a ROW group. */
static void row_write(rowk *k) {
    char y[600], rt[900], lv[400], ld[480], st[1000], v[16];
    const sg__irnode *n = k->an;
    switch (n->op) {
    case SG__OP_SOFTMAX: snprintf(y, sizeof y, "(exp%s(r_x - r_m) * r_inv)", k->sp->mf); break;
    case SG__OP_LOG_SOFTMAX: snprintf(y, sizeof y, "((r_x - r_m) - r_ls)"); break;
    default: {
        size_t q = (size_t)snprintf(
            y, sizeof y, n->op == SG__OP_LAYER_NORM ? "((r_x - r_m0 - r_mc) * r_r" : "(r_x * r_r");
        for (int j = 1; j < n->nin && j < 3; j++) {
            if (!sg__cuda_arg(k->g, n, j)) continue;
            if (k->vout && k->vpar) {
                char pv[32];
                snprintf(pv, sizeof pv, "r_p%d[r_q].e[r_e]", j);
                sg__cuda_widen(sg__cuda_arg(k->g, n, j)->dtype, pv, ld, sizeof ld);
            } else if (k->wreg)
                snprintf(ld, sizeof ld, "r_pw%d[r_t0 + r_u]", j);
            else
                norm_param(k, j, ld, sizeof ld);
            q += (size_t)snprintf(y + q, sizeof y - q, j == 1 ? " * %s" : " + %s", ld);
        }
        snprintf(y + q, sizeof y - q, ")");
    }
    }
    walk_index(k);
    sg__cuda_round_trip(y, k->o->dtype, rt, sizeof rt);
    sg__emit_line(k->e, "const float v%d = %s; /* %s */", k->a, rt, sg__op_name(n->op));
    if (k->vout) { /* a vector's element (vec_write) */
        snprintf(v, sizeof v, "v%d", k->a);
        sg__cuda_narrow_store(k->o->dtype, k->vout, v, st, sizeof st);
        sg__emit_line(k->e, "%s", st);
    } else if (k->grp->g[k->a].store) {
        sg__cuda_lvalue(k->g, k->o, k->nd, k->shape, k->flat, lv, sizeof lv);
        snprintf(v, sizeof v, "v%d", k->a);
        sg__cuda_narrow_store(k->o->dtype, lv, v, st, sizeof st);
        sg__cuda_store(k->g, true, k->a, st);
    }
    if (k->a + 1 < k->grp->n)
        sg__cuda_members(k->g, k->grp, k->a + 1, k->grp->n, k->nd, k->shape, k->flat);
    sink_store(k);
}

static void chunk_loop(rowk *k, const char *start, const char *hi, int step, int u,
                       const char *fold, bool quiet);
static int chunk_of(int64_t len, int step, int u);

/*
 * Columns base + (r_t0 + r_u) * team (regs; else base + r_u * team), r_u <
 * n, of the row (those below len): `elem`
 * emits each one's loads, values and stores, the stores kept aside
 * (sg__cuda_defer_begin) and replayed by a second walk over the same
 * columns, so that the loads of all n columns issue before the first store
 * (a store waits for its value, and warps issue in order: a load placed
 * after a store would wait for the load before it).
 */
static void deferred_walk(rowk *k, const char *base, bool regs, int n, void (*elem)(rowk *)) {
    sg__emit *out = k->e;
    sg__emit decl = {.ctx = out->ctx, .depth = out->depth};
    sg__emit body = {.ctx = out->ctx, .depth = out->depth};
    sg__emit later = {.ctx = out->ctx, .depth = out->depth + 2};
    sg__cuda_defer_begin(k->g, &decl, &later, n);
    k->e = &body;
    sg__cuda_set_out(k->g, &body);
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) sg__cuda_defer_end(k->g);
        if (pass == 1 && !later.buf) break;
        sg__emit_line(k->e, "#pragma unroll");
        sg__emit_open(k->e, "for (int r_u = 0; r_u < %d; r_u++)", n);
        if (regs) {
            char c[160];
            col_of(k, "r_t0 + r_u", c, sizeof c);
            sg__emit_line(k->e, "const sg_i64 r_c = %s;", c);
        } else {
            sg__emit_line(k->e, "const sg_i64 r_c = %s + (sg_i64)r_u * %d;", base, k->team);
        }
        sg__emit_open(k->e, "if (r_c < %lldLL)", (long long)k->len);
        if (pass == 0) {
            elem(k);
        } else {
            walk_index(k);
            sg__emit_raw(k->e, "%s", later.buf);
        }
        sg__emit_close(k->e);
        sg__emit_close(k->e);
    }
    k->e = out;
    sg__cuda_set_out(k->g, out);
    if (decl.buf) sg__emit_raw(out, "%s", decl.buf);
    if (body.buf) sg__emit_raw(out, "%s", body.buf);
    if (decl.oom || body.oom || later.oom) out->oom = true;
    sg__emit_free(&decl);
    sg__emit_free(&body);
    sg__emit_free(&later);
}

/* A column of the write pass: the input (kept in registers, or
 * recomputed with the prologue's stores), then row_write. */
static void write_elem(rowk *k) {
    sg__emit_line(k->e, "float r_x;");
    if (k->per) {
        sg__emit_line(k->e, "r_x = r_xr[r_t0 + r_u];");
    } else {
        sg__emit_open(k->e, "%s", "");
        row_input(k, true);
        sg__emit_close(k->e);
    }
    row_write(k);
}

/* A statistics pass folding each column's r_x: over the registers (the
 * first pass fills them), or over memory in chunks of loads in flight. */
static void stat_pass(rowk *k, bool fill, const char *fold) {
    if (k->per) {
        pass_open(k, fill, false);
        sg__emit_line(k->e, "%s", fold);
        pass_close(k);
        return;
    }
    char hi[32];
    snprintf(hi, sizeof hi, "%lldLL", (long long)k->len);
    chunk_loop(k, "r_lane", hi, k->team, chunk_of(k->len, k->team, 8), fold, true);
}

/* The write pass of a row in vectors whose accesses sit on 16 bytes
 * (r_al): each vector's values into a union, stored in one 16-byte store
 * (k->vst: the anchor's value is the row's only store). */
static void vec_write(rowk *k) {
    int nq = k->per / k->vw;
    char base[420], lv[64];
    vec_row_base(k, k->o, base, sizeof base);
    sg__emit_open(k->e, "if (r_al)");
    sg__emit_line(k->e, "#pragma unroll");
    sg__emit_open(k->e, "for (int r_q = 0; r_q < %d; r_q++)", nq);
    sg__emit_line(k->e, "const sg_i64 r_v = r_lane + (sg_i64)r_q * %d;", k->team);
    sg__emit_open(k->e, "if (r_v < %lldLL)", (long long)(k->len / k->vw));
    vec_union(k, k->o, "r_w", 0);
    sg__emit_line(k->e, "#pragma unroll");
    sg__emit_open(k->e, "for (int r_e = 0; r_e < %d; r_e++)", k->vw);
    /* row_write's register index is r_t0 + r_u */
    sg__emit_line(k->e, "const int r_t0 = r_q * %d, r_u = r_e;", k->vw);
    sg__emit_line(k->e, "const sg_i64 r_c = r_v * %d + r_e;", k->vw);
    sg__emit_line(k->e, "const float r_x = r_xr[r_t0 + r_u];");
    k->vout = lv;
    snprintf(lv, sizeof lv, "r_w.e[r_e]");
    row_write(k);
    k->vout = NULL;
    sg__emit_close(k->e);
    sg__emit_line(k->e, "((%ssg_v16 *)%s)[r_v] = r_w.v;", k->sp->gp, base);
    sg__emit_close(k->e);
    sg__emit_close(k->e);
    sg__emit_close(k->e);
}

/* Statistics and write pass of softmax, log_softmax and the norms. */
static void emit_row_op(rowk *k) {
    sg__op op = k->an->op;
    bool fill = k->per > 0;
    const char *mf = k->sp->mf;
    if (k->vw) vec_check(k);
    /* Which pass computes the prologue last: the write pass. */
    if ((op == SG__OP_SOFTMAX || op == SG__OP_LOG_SOFTMAX) && !k->per) {
        /* A row read from memory: max and sum in one pass, the sum rescaled
         * as the max grows; -inf adds exactly 0, +inf and NaN make it NaN. */
        char fold[400];
        snprintf(fold, sizeof fold,
                 "{ if (r_x > r_m) { r_s = r_s * exp%s(r_m - r_x) + (r_x == %s ? %s : 1.0f); r_m = "
                 "r_x; } else if (r_x != %s) r_s += exp%s(r_x - r_m); }",
                 mf, k->pinf, k->qnan, k->ninf, mf);
        sg__emit_line(k->e, "float r_m = %s, r_s = 0.0f;", k->ninf);
        stat_pass(k, false, fold);
        team_reduce_ms(k);
        sg__emit_line(k->e, "const float r_inv = 1.0f / r_s, r_ls = log%s(r_s);", mf);
        sg__emit_line(k->e, "(void)r_inv, (void)r_ls;");
    } else if (op == SG__OP_SOFTMAX || op == SG__OP_LOG_SOFTMAX) {
        sg__emit_line(k->e, "float r_m = %s;", k->ninf);
        pass_open(k, fill, false);
        sg__emit_line(k->e, "r_m = r_x > r_m ? r_x : r_m;");
        pass_close(k);
        team_reduce(k, "r_m", true);
        sg__emit_line(k->e, "float r_s = 0.0f;");
        pass_open(k, false, false);
        sg__emit_line(k->e, "r_s += r_x == %s ? 0.0f : exp%s(r_x - r_m);", k->ninf, mf);
        pass_close(k);
        team_reduce(k, "r_s", false);
        sg__emit_line(k->e, "const float r_inv = 1.0f / r_s, r_ls = log%s(r_s);", mf);
        sg__emit_line(k->e, "(void)r_inv, (void)r_ls;");
    } else {
        bool layer = op == SG__OP_LAYER_NORM;
        norm_params_plan(k);
        sg__emit_line(k->e, "float r_s = 0.0f;");
        stat_pass(k, fill, layer ? "r_s += r_x;" : "r_s += r_x * r_x;");
        team_reduce(k, "r_s", false);
        if (layer) {
            corrected_q(k, norm_second_pass);
            sg__emit_line(k->e, "const float r_var = r_q / %lld.0f;", (long long)k->len);
        } else {
            sg__emit_line(k->e, "const float r_var = r_s / %lld.0f;", (long long)k->len);
        }
        sg__emit_line(k->e,
                      "const float r_r = 1.0f / sqrt%s((r_var > 0.0f ? r_var : 0.0f) + %.9ef);", mf,
                      k->an->f[0]);
    }
    if (k->per) { /* the registers, 8 at a time (the kept values are registers too) */
        int u = k->per < 8 ? k->per : 8;
        if (k->vst) {
            vec_write(k);
            sg__emit_open(k->e, "else");
        }
        sg__emit_line(k->e, "#pragma unroll");
        sg__emit_open(k->e, "for (int r_t0 = 0; r_t0 < %d; r_t0 += %d)", k->per, u);
        deferred_walk(k, "r_lane", true, u, write_elem);
        sg__emit_close(k->e);
        if (k->vst) sg__emit_close(k->e);
        return;
    }
    int u = chunk_of(k->len, k->team, 8);
    sg__emit_open(k->e, "for (sg_i64 r_c0 = r_lane; r_c0 < %lldLL; r_c0 += %lld)",
                  (long long)k->len, (long long)u * k->team);
    deferred_walk(k, "r_c0", false, u, write_elem);
    sg__emit_close(k->e);
}

/*
 * One pass over positions [start, hi) of the reduced range, `step` apart:
 * in chunks of u positions, the chunk's loads (and prologue) first, all in
 * flight at once, then `fold` on each (r_x, r_c) in position order -- a
 * long range is a few memory latencies, not one per element. The prologue
 * stores (each position is visited once), but only after the chunk's
 * loads: a store waits for its value, and warps issue in order, so a load
 * placed after a store would wait for the load before it -- one memory
 * latency per element again. The stores' second walk reads what the first
 * just brought into the cache.
 */
static void chunk_loop(rowk *k, const char *start, const char *hi, int step, int u,
                       const char *fold, bool quiet) {
    bool stores = false;
    for (int m = 0; m < k->a; m++) stores = stores || k->grp->g[m].store;
    sg__emit_open(k->e, "for (sg_i64 r_c0 = %s; r_c0 < %s; r_c0 += %lld)", start, hi,
                  (long long)u * step);
    sg__emit_line(k->e, "float r_xs[%d];", u);
    for (int pass = 0; pass < 3; pass++) {
        if (pass == 1 && (!stores || quiet)) continue;
        sg__emit_line(k->e, "#pragma unroll");
        sg__emit_open(k->e, "for (int r_u = 0; r_u < %d; r_u++)", u);
        sg__emit_line(k->e, "const sg_i64 r_c = r_c0 + (sg_i64)r_u * %d;", step);
        if (pass == 2) {
            sg__emit_line(k->e, "const float r_x = r_xs[r_u];");
            sg__emit_line(k->e, "if (r_c < %s) %s", hi, fold);
        } else {
            sg__emit_line(k->e, "float r_x = 0.0f;");
            sg__emit_open(k->e, "if (r_c < %s)", hi);
            row_input(k, pass == 1);
            sg__emit_close(k->e);
            sg__emit_line(k->e, pass == 0 ? "r_xs[r_u] = r_x;" : "(void)r_x;");
        }
        sg__emit_close(k->e);
    }
    sg__emit_close(k->e);
}

/* Positions per chunk: 8, fewer when a lane has fewer to take. */
static int chunk_of(int64_t len, int step, int u) {
    int64_t per = (len + step - 1) / step;
    return per < u ? (int)(per < 1 ? 1 : per) : u;
}

/* The reduced value r_s of output `idx` by one thread: the anchor's value,
 * its store and the epilogue over the reduced shape (no full epilogue). */
static void single_tail(rowk *k, const char *idx) {
    const sg__group *grp = k->grp;
    char y[160], rt[600], lv[400], st[1000], v[16];
    if (k->an->op == SG__OP_MEAN)
        snprintf(y, sizeof y, "(r_s / %lld.0f)", (long long)k->len);
    else
        snprintf(y, sizeof y, "r_s");
    bool rflat = sg__cuda_walk_flat(k->g, grp, k->a + 1, grp->n, grp->ndim, grp->shape, k->o);
    sg__emit_line(k->e, "const sg_i64 i = %s;", idx);
    if (!rflat) sg__cuda_unflatten(k->g, grp->ndim, grp->shape);
    sg__cuda_round_trip(y, k->o->dtype, rt, sizeof rt);
    sg__emit_line(k->e, "const float v%d = %s; /* %s */", k->a, rt, sg__op_name(k->an->op));
    if (grp->g[k->a].store) {
        sg__cuda_lvalue(k->g, k->o, grp->ndim, grp->shape, rflat, lv, sizeof lv);
        snprintf(v, sizeof v, "v%d", k->a);
        sg__cuda_narrow_store(k->o->dtype, lv, v, st, sizeof st);
        sg__emit_line(k->e, "%s", st);
    }
    if (k->a + 1 < grp->n)
        sg__cuda_members(k->g, grp, k->a + 1, grp->n, grp->ndim, grp->shape, rflat);
}

/* A column of a reduction's epilogue over the input's shape. */
static void bcast_elem(rowk *k) {
    walk_index(k);
    sg__cuda_members(k->g, k->grp, k->grp->bcast, k->grp->n, k->nd, k->shape, k->flat);
    sink_store(k);
}

/* Sum or mean, the epilogue over the reduced shape, then over the input's. */
static void emit_reduce(rowk *k) {
    const sg__group *grp = k->grp;
    int red_end = grp->bcast ? grp->bcast : grp->n;
    char hi[32];
    snprintf(hi, sizeof hi, "%lldLL", (long long)k->len);
    sg__emit_line(k->e, "float r_s = 0.0f;");
    k->per = 0; /* one pass: nothing to keep */
    chunk_loop(k, "r_lane", hi, k->team, chunk_of(k->len, k->team, 8), "r_s += r_x;", false);
    team_reduce(k, "r_s", false);
    if (k->an->op == SG__OP_VAR) { /* a second pass, about the mean; a quiet prologue */
        int64_t den = k->len - k->an->i[0];
        corrected_q(k, var_second_pass);
        if (den > 0) /* var, or NaN/inf as torch's for too few elements */
            sg__emit_line(k->e, "r_s = r_q / %lld.0f;", (long long)den);
        else
            sg__emit_line(k->e, "r_s = r_q > 0.0f ? %s : %s;", k->pinf, k->qnan);
    }
    char y[160], rt[600], lv[400], st[1000], v[16];
    if (k->an->op == SG__OP_MEAN)
        snprintf(y, sizeof y, "(r_s / %lld.0f)", (long long)k->len);
    else
        snprintf(y, sizeof y, "r_s");
    /* The reduced values, on every lane (the full epilogue reads them). */
    bool rflat = sg__cuda_walk_flat(k->g, grp, k->a + 1, red_end, grp->ndim, grp->shape, k->o);
    sg__emit_line(k->e, "const sg_i64 i = r_row;");
    if (!rflat) sg__cuda_unflatten(k->g, grp->ndim, grp->shape);
    sg__cuda_round_trip(y, k->o->dtype, rt, sizeof rt);
    sg__emit_line(k->e, "const float v%d = %s; /* %s */", k->a, rt, sg__op_name(k->an->op));
    sg__cuda_members(k->g, &k->quiet, k->a + 1, red_end, grp->ndim, grp->shape, rflat);
    /* Then their stores, by lane 0 once every lane has read what they overwrite. */
    bool any = grp->g[k->a].store;
    for (int m = k->a + 1; m < red_end; m++) any = any || grp->g[m].store;
    if (any) {
        sg__emit_line(k->e, "%s", k->team > 32 || !k->sp->shuffles ? k->sp->sync : "__syncwarp();");
        sg__emit_open(k->e, "if (r_lane == 0)");
        if (grp->g[k->a].store) {
            sg__cuda_lvalue(k->g, k->o, grp->ndim, grp->shape, rflat, lv, sizeof lv);
            snprintf(v, sizeof v, "v%d", k->a);
            sg__cuda_narrow_store(k->o->dtype, lv, v, st, sizeof st);
            sg__emit_line(k->e, "%s", st);
        }
        if (k->a + 1 < red_end)
            sg__cuda_members(k->g, grp, k->a + 1, red_end, grp->ndim, grp->shape, rflat);
        sg__emit_close(k->e);
    }
    if (!grp->bcast) return;
    int u = chunk_of(k->len, k->team, 8);
    sg__emit_open(k->e, "for (sg_i64 r_c0 = r_lane; r_c0 < %lldLL; r_c0 += %lld)",
                  (long long)k->len, (long long)u * k->team);
    deferred_walk(k, "r_c0", false, u, bcast_elem);
    sg__emit_close(k->e);
}

/* Team candidate (r_ob, r_oa) replaces (r_b, r_at): argmax's order. */
#define ARGMAX_BETTER                                                                              \
    "r_oa >= 0 && (r_at < 0 || (r_ob != r_ob ? (r_b == r_b || r_oa < r_at)"                        \
    " : (r_b == r_b && (r_ob > r_b || (r_ob == r_b && r_oa < r_at)))))"

/* A lane's fold of (r_x, r_c) in position order: the first best. */
#define ARGMAX_FOLD                                                                                \
    "if (r_at < 0 || r_x > r_b || (r_x != r_x && r_b == r_b)) r_b = r_x, r_at = r_c;"

/* (r_b, r_at) combined over the team in argmax's total order. */
static void team_argmax(rowk *k) {
    if (!k->sp->shuffles) {
        const char *t[2] = {"float", "sg_i64"}, *v[2] = {"r_b", "r_at"}, *o[2] = {"r_ob", "r_oa"};
        sg__cuda_tree(k->g, 2, t, v, o, "if (" ARGMAX_BETTER ") r_b = r_ob, r_at = r_oa;",
                      k->team / 32);
        return;
    }
    sg__emit_open(k->e, "for (int o = %d; o > 0; o >>= 1)", k->team > 32 ? 16 : k->team / 2);
    sg__emit_line(k->e, "const float r_ob = __shfl_xor_sync(0xffffffffu, r_b, o);");
    sg__emit_line(k->e, "const sg_i64 r_oa = __shfl_xor_sync(0xffffffffu, r_at, o);");
    sg__emit_line(k->e, "if (%s) r_b = r_ob, r_at = r_oa;", ARGMAX_BETTER);
    sg__emit_close(k->e);
    if (k->team <= 32) return;
    int r = k->nred;
    k->nred += 2;
    sg__emit_open(k->e, "%s", "");
    sg__cuda_shared(k->g, 0, "float r_red%d[%d]", r, k->team / 32);
    sg__cuda_shared(k->g, 0, "sg_i64 r_red%d[%d]", r + 1, k->team / 32);
    sg__emit_line(k->e,
                  "if ((threadIdx.x & 31) == 0) r_red%d[threadIdx.x >> 5] = r_b, "
                  "r_red%d[threadIdx.x >> 5] = r_at;",
                  r, r + 1);
    sg__emit_line(k->e, "__syncthreads();");
    sg__emit_open(k->e, "for (int w = 0; w < %d; w++)", k->team / 32);
    sg__emit_line(k->e, "const float r_ob = r_red%d[w];", r);
    sg__emit_line(k->e, "const sg_i64 r_oa = r_red%d[w];", r + 1);
    sg__emit_line(k->e, "if (%s) r_b = r_ob, r_at = r_oa;", ARGMAX_BETTER);
    sg__emit_close(k->e);
    sg__emit_close(k->e);
}

/* Lane 0 stores the row's r_at. */
static void argmax_store(rowk *k) {
    const sg__group *grp = k->grp;
    if (!grp->g[k->a].store) return;
    char lv[400];
    bool rflat = sg__cuda_walk_flat(k->g, grp, k->a + 1, k->a + 1, grp->ndim, grp->shape, k->o);
    sg__emit_open(k->e, "if (r_lane == 0)");
    sg__emit_line(k->e, "const sg_i64 i = r_row;");
    if (!rflat) sg__cuda_unflatten(k->g, grp->ndim, grp->shape);
    sg__cuda_lvalue(k->g, k->o, grp->ndim, grp->shape, rflat, lv, sizeof lv);
    sg__emit_line(k->e, "%s = r_at; /* argmax */", lv);
    sg__emit_close(k->e);
}

/* Argmax over the row: each lane's first best, the team's, and lane 0 stores it. */
static void emit_argmax(rowk *k) {
    char hi[32];
    snprintf(hi, sizeof hi, "%lldLL", (long long)k->len);
    sg__emit_line(k->e, "float r_b = %s;", k->ninf);
    sg__emit_line(k->e, "sg_i64 r_at = -1;");
    chunk_loop(k, "r_lane", hi, k->team, chunk_of(k->len, k->team, k->a > 0 ? 8 : 32), ARGMAX_FOLD,
               false);
    team_argmax(k);
    argmax_store(k);
}

/*
 * A few long rows (sum, mean, argmax with no epilogue over the input's
 * shape): each row is cut into `split` chunks of `ch` positions, a block
 * each. A block folds its chunk, publishes its partial, and the row's last
 * block to arrive (a fence, then a counter; it resets the counter for the
 * next launch) combines the partials in chunk order -- the same tree every
 * launch, whatever order blocks finish in -- and runs the epilogue.
 * Partials and counters are the kernel's own static device arrays,
 * zeroed when the module loads.
 */
static void emit_split(rowk *k, int64_t split, int64_t ch) {
    bool argmax = k->an->op == SG__OP_ARGMAX;
    sg__emit *e = k->e;
    sg__emit_line(e, "const int r_lane = threadIdx.x;");
    sg__emit_line(e, "static __device__ float r_part[%lld];", (long long)(k->rows * split));
    if (argmax)
        sg__emit_line(e, "static __device__ sg_i64 r_parti[%lld];", (long long)(k->rows * split));
    sg__emit_line(e, "static __device__ unsigned int r_count[%lld];", (long long)k->rows);
    sg__emit_line(e, "__shared__ bool r_last;");
    sg__emit_line(e, "const sg_i64 r_row = blockIdx.x / %lld, r_sp = blockIdx.x %% %lld;",
                  (long long)split, (long long)split);
    sg__emit_line(e, "const sg_i64 r_lo = r_sp * %lldLL;", (long long)ch);
    sg__emit_line(e, "const sg_i64 r_hi = r_lo + %lldLL < %lldLL ? r_lo + %lldLL : %lldLL;",
                  (long long)ch, (long long)k->len, (long long)ch, (long long)k->len);
    int u = chunk_of(ch, k->team, 8);
    if (argmax) {
        sg__emit_line(e, "float r_b = __uint_as_float(0xff800000u);");
        sg__emit_line(e, "sg_i64 r_at = -1;");
        chunk_loop(k, "r_lo + r_lane", "r_hi", k->team, u, ARGMAX_FOLD, false);
        team_argmax(k);
    } else {
        sg__emit_line(e, "float r_s = 0.0f;");
        chunk_loop(k, "r_lo + r_lane", "r_hi", k->team, u, "r_s += r_x;", false);
        team_reduce(k, "r_s", false);
    }
    sg__emit_open(e, "if (r_lane == 0)");
    sg__emit_line(e, argmax ? "r_part[blockIdx.x] = r_b, r_parti[blockIdx.x] = r_at;"
                            : "r_part[blockIdx.x] = r_s;");
    sg__emit_line(e, "__threadfence();");
    sg__emit_line(e, "r_last = atomicAdd(&r_count[r_row], 1u) == %lldu;", (long long)(split - 1));
    sg__emit_close(e);
    sg__emit_line(e, "__syncthreads();");
    sg__emit_line(e, "if (!r_last) return;");
    sg__emit_line(e, "__threadfence();");
    if (argmax) {
        sg__emit_line(e, "r_b = __uint_as_float(0xff800000u), r_at = -1;");
        sg__emit_open(e, "for (sg_i64 j = r_lane; j < %lldLL; j += %d)", (long long)split, k->team);
        sg__emit_line(e, "const float r_ob = __ldcg(&r_part[r_row * %lldLL + j]);",
                      (long long)split);
        sg__emit_line(e, "const sg_i64 r_oa = __ldcg(&r_parti[r_row * %lldLL + j]);",
                      (long long)split);
        sg__emit_line(e, "if (%s) r_b = r_ob, r_at = r_oa;", ARGMAX_BETTER);
        sg__emit_close(e);
        team_argmax(k);
    } else {
        sg__emit_line(e, "r_s = 0.0f;");
        sg__emit_line(e,
                      "for (sg_i64 j = r_lane; j < %lldLL; j += %d) r_s += "
                      "__ldcg(&r_part[r_row * %lldLL + j]);",
                      (long long)split, k->team, (long long)split);
        team_reduce(k, "r_s", false);
    }
    sg__emit_line(e, "if (r_lane == 0) r_count[r_row] = 0;");
    if (argmax) {
        argmax_store(k);
    } else {
        sg__emit_open(e, "if (r_lane == 0)");
        single_tail(k, "r_row");
        sg__emit_close(e);
    }
}

/* Lane r_sp % team folds the team's (r_b, r_at) of chunk r_sp into its
 * (r_fb, r_fa), as emit_split's last block folds the partials it reads. */
#define ARGMAX_KEEP                                                                                \
    "{ const float r_ob = r_b; const sg_i64 r_oa = r_at; r_b = r_fb, r_at = r_fa; if "             \
    "(" ARGMAX_BETTER ") r_b = r_ob, r_at = r_oa; r_fb = r_b, r_fa = r_at; }"

/*
 * emit_split where blocks cannot meet (OpenCL C: a kernel's own device
 * arrays need program-scope globals, which PoCL lacks): a block per row
 * folds the row's chunks one after another, each as emit_split's block
 * does, and lane j of the team keeps the fold of partials j, j + team, ..
 * in chunk order, as the last block's lane j does; then the same combine
 * over the team. The same bits as emit_split, on fewer blocks.
 */
static void emit_split_seq(rowk *k, int64_t split, int64_t ch) {
    bool argmax = k->an->op == SG__OP_ARGMAX;
    sg__emit *e = k->e;
    int u = chunk_of(ch, k->team, 8);
    sg__emit_line(e, "const int r_lane = %s;", k->sp->tid);
    sg__emit_open(e, "for (sg_i64 r_row = %s; r_row < %lldLL; r_row += %s)", k->sp->bid,
                  (long long)k->rows, k->sp->gdim);
    if (argmax) {
        sg__emit_line(e, "float r_b, r_fb = %s;", k->ninf);
        sg__emit_line(e, "sg_i64 r_at, r_fa = -1;");
    } else {
        sg__emit_line(e, "float r_s, r_f = 0.0f;");
    }
    sg__emit_open(e, "for (sg_i64 r_sp = 0; r_sp < %lldLL; r_sp++)", (long long)split);
    sg__emit_line(e, "const sg_i64 r_lo = r_sp * %lldLL;", (long long)ch);
    sg__emit_line(e, "const sg_i64 r_hi = r_lo + %lldLL < %lldLL ? r_lo + %lldLL : %lldLL;",
                  (long long)ch, (long long)k->len, (long long)ch, (long long)k->len);
    if (argmax) {
        sg__emit_line(e, "r_b = %s, r_at = -1;", k->ninf);
        chunk_loop(k, "r_lo + r_lane", "r_hi", k->team, u, ARGMAX_FOLD, false);
        team_argmax(k);
        sg__emit_line(e, "if (r_lane == r_sp %% %d) %s", k->team, ARGMAX_KEEP);
    } else {
        sg__emit_line(e, "r_s = 0.0f;");
        chunk_loop(k, "r_lo + r_lane", "r_hi", k->team, u, "r_s += r_x;", false);
        team_reduce(k, "r_s", false);
        sg__emit_line(e, "if (r_lane == r_sp %% %d) r_f += r_s;", k->team);
    }
    sg__emit_close(e);
    if (argmax) {
        sg__emit_line(e, "r_b = r_fb, r_at = r_fa;");
        team_argmax(k);
        argmax_store(k);
    } else {
        sg__emit_line(e, "r_s = r_f;");
        team_reduce(k, "r_s", false);
        sg__emit_open(e, "if (r_lane == 0)");
        single_tail(k, "r_row");
        sg__emit_close(e);
    }
    sg__emit_close(e);
}

/* r_s summed over the block's row groups, in group order, into the
 * threads of group 0. */
static void column_combine(rowk *k, int tc, int rg) {
    sg__emit_line(k->e, "r_cred[%s] = r_s;", k->sp->tid);
    sg__emit_line(k->e, "%s", k->sp->sync);
    sg__emit_line(k->e, "if (r_rg == 0) for (int w = 1; w < %d; w++) r_s += r_cred[w * %d + r_lc];",
                  rg, tc);
}

/* The head of a column kernel (emit_columns): lane r_lc
 * and group r_rg of a block, r_cred (a float a thread), the split's
 * partials (a float a lane of each item) and counters, and the loop over
 * items r_w = (tile r_t, chunk r_sp) with the tile's row block r_row, its
 * column `col` of tc a tile, and the chunk's range [r_lo, r_hi). */
static void columns_open(rowk *k, int tc, int64_t split, int64_t ch, int64_t items,
                         const char *col) {
    sg__emit *e = k->e;
    int64_t nct = k->cols, tiles;
    nct = (nct + tc - 1) / tc, tiles = k->rows * nct;
    sg__emit_line(e, "const int r_lc = %s %% %d, r_rg = %s / %d;", k->sp->tid, tc, k->sp->tid, tc);
    sg__cuda_shared(k->g, 0, "float r_cred[%d]", BLOCK);
    if (split > 1) {
        sg__emit_line(e, "static __device__ float r_part[%lld];", (long long)(items * tc));
        sg__emit_line(e, "static __device__ unsigned int r_count[%lld];", (long long)tiles);
        sg__emit_line(e, "__shared__ bool r_last;");
    }
    sg__emit_open(e, "for (sg_i64 r_w = %s; r_w < %lldLL; r_w += %s)", k->sp->bid, (long long)items,
                  k->sp->gdim);
    sg__emit_line(e, "const sg_i64 r_t = r_w / %lld, r_sp = r_w %% %lld;", (long long)split,
                  (long long)split);
    sg__emit_line(e, "const sg_i64 r_row = r_t / %lld, %s = (r_t %% %lld) * %d + r_lc;",
                  (long long)nct, col, (long long)nct, tc);
    sg__emit_line(e, "const sg_i64 r_lo = r_sp * %lldLL;", (long long)ch);
    sg__emit_line(e, "const sg_i64 r_hi = r_lo + %lldLL < %lldLL ? r_lo + %lldLL : %lldLL;",
                  (long long)ch, (long long)k->len, (long long)ch, (long long)k->len);
}

/* Group 0's partial of item r_w stored by `store`, and the tile's last
 * block to arrive opening `if (r_last)`, where it reads every chunk's. */
static void columns_last(rowk *k, int64_t split, const char *store) {
    sg__emit *e = k->e;
    sg__emit_open(e, "if (r_rg == 0)");
    sg__emit_line(e, "%s", store);
    sg__emit_line(e, "__threadfence();");
    sg__emit_close(e);
    sg__emit_line(e, "__syncthreads();");
    sg__emit_line(e, "if (threadIdx.x == 0) r_last = atomicAdd(&r_count[r_t], 1u) == %lldu;",
                  (long long)(split - 1));
    sg__emit_line(e, "__syncthreads();");
    sg__emit_open(e, "if (r_last)");
    sg__emit_line(e, "__threadfence();");
}

/*
 * A column sum or mean, (rows, len, cols) -> (rows, cols): a block takes tc
 * consecutive columns (32, fewer for narrower rows, up to a block's threads
 * for a short range: emit_wide) of one row block, its
 * threads rg = 256 / tc groups of positions along the reduced range (a warp
 * reads a run of 32 neighbours at each step), combined in shared memory in
 * group order. With few column tiles the range is also cut into `split`
 * chunks of `ch`, finished by the last block as in emit_split.
 */
static void emit_columns(rowk *k, int tc, int64_t split, int64_t ch, int64_t items) {
    sg__emit *e = k->e;
    int rg = BLOCK / tc;
    char tile[64], hi[32], store[64];
    columns_open(k, tc, split, ch, items, "r_col");
    sg__emit_line(e, "float r_s = 0.0f;");
    sg__emit_open(e, "if (r_col < %lldLL)", (long long)k->cols);
    chunk_loop(k, "r_lo + r_rg", "r_hi", rg, chunk_of(ch, rg, 8), "r_s += r_x;", false);
    sg__emit_close(e);
    column_combine(k, tc, rg);
    snprintf(tile, sizeof tile, "r_row * %lldLL + r_col", (long long)k->cols);
    snprintf(hi, sizeof hi, "%lldLL", (long long)k->cols);
    if (split > 1) {
        snprintf(store, sizeof store, "r_part[r_w * %d + r_lc] = r_s;", tc);
        columns_last(k, split, store);
        sg__emit_line(e, "r_s = 0.0f;");
        sg__emit_line(e,
                      "for (sg_i64 j = r_rg; j < %lldLL; j += %d) r_s += "
                      "__ldcg(&r_part[(r_t * %lldLL + j) * %d + r_lc]);",
                      (long long)split, rg, (long long)split, tc);
        column_combine(k, tc, rg);
        sg__emit_line(e, "if (threadIdx.x == 0) r_count[r_t] = 0;");
    }
    sg__emit_open(e, "if (r_rg == 0 && r_col < %s)", hi);
    single_tail(k, tile);
    sg__emit_close(e);
    if (split > 1) sg__emit_close(e);
    sg__emit_line(e, "%s", k->sp->sync);
    sg__emit_close(e);
}

/*
 * emit_columns with `split` chunks where blocks cannot meet (emit_split_seq):
 * a block per column tile folds the chunks one after another, each as
 * emit_columns' block does; group 0's sum of chunk j goes through shared
 * memory to group j % rg, which folds it in chunk order, as the last
 * block's group does; then the same combine over the groups.
 */
static void emit_columns_seq(rowk *k, int tc, int64_t split, int64_t ch) {
    sg__emit *e = k->e;
    const sg__spell *sp = k->sp;
    int rg = BLOCK / tc;
    int64_t nct = (k->cols + tc - 1) / tc, tiles = k->rows * nct;
    char tile[64];
    sg__emit_line(e, "const int r_lc = %s %% %d, r_rg = %s / %d;", sp->tid, tc, sp->tid, tc);
    sg__cuda_shared(k->g, 0, "float r_cred[%d]", BLOCK);
    sg__cuda_shared(k->g, 0, "float r_cpart[%d]", tc);
    sg__emit_open(e, "for (sg_i64 r_t = %s; r_t < %lldLL; r_t += %s)", sp->bid, (long long)tiles,
                  sp->gdim);
    sg__emit_line(e, "const sg_i64 r_row = r_t / %lld, r_col = (r_t %% %lld) * %d + r_lc;",
                  (long long)nct, (long long)nct, tc);
    sg__emit_line(e, "float r_s, r_f = 0.0f;");
    sg__emit_open(e, "for (sg_i64 r_sp = 0; r_sp < %lldLL; r_sp++)", (long long)split);
    sg__emit_line(e, "const sg_i64 r_lo = r_sp * %lldLL;", (long long)ch);
    sg__emit_line(e, "const sg_i64 r_hi = r_lo + %lldLL < %lldLL ? r_lo + %lldLL : %lldLL;",
                  (long long)ch, (long long)k->len, (long long)ch, (long long)k->len);
    sg__emit_line(e, "r_s = 0.0f;");
    sg__emit_open(e, "if (r_col < %lldLL)", (long long)k->cols);
    chunk_loop(k, "r_lo + r_rg", "r_hi", rg, chunk_of(ch, rg, 8), "r_s += r_x;", false);
    sg__emit_close(e);
    column_combine(k, tc, rg);
    sg__emit_line(e, "if (r_rg == 0) r_cpart[r_lc] = r_s;");
    sg__emit_line(e, "%s", sp->sync);
    sg__emit_line(e, "if (r_rg == r_sp %% %d) r_f += r_cpart[r_lc];", rg);
    sg__emit_close(e);
    sg__emit_line(e, "r_s = r_f;");
    column_combine(k, tc, rg);
    snprintf(tile, sizeof tile, "r_row * %lldLL + r_col", (long long)k->cols);
    sg__emit_open(e, "if (r_rg == 0 && r_col < %lldLL)", (long long)k->cols);
    single_tail(k, tile);
    sg__emit_close(e);
    sg__emit_line(e, "%s", sp->sync);
    sg__emit_close(e);
}

/* Blocks for (a few rows of) a long reduction: about TARGET_BLOCKS in all,
 * at least `least` positions each; *ch the positions per chunk. 1 when
 * the rows alone fill the GPU or are too short to cut. With `batch` (the
 * positions a block loads at once; 0: none) a chunk is whole batches, cut
 * down to them: W3's argmax over 50257 logits is 25 chunks of 2048, one
 * batch each, rather than 24 of 2095, whose blocks would each wait for a
 * second batch of 47. */
static int64_t plan_split(int64_t units, int64_t len, int64_t least, int64_t batch, int64_t *ch) {
    int64_t want = (TARGET_BLOCKS + units - 1) / units, cap = len / least;
    int64_t s = want < cap ? want : cap;
    *ch = len;
    if (s < 2) return 1;
    *ch = (len + s - 1) / s;
    if (batch > 0 && *ch > batch) *ch = *ch / batch * batch;
    return (len + *ch - 1) / *ch;
}

/*
 * A softmax, log_softmax or norm row of CUDA or HIP whose input is read
 * straight from memory or whose result is its only store, flat and
 * contiguous, with a width and offsets that are multiples of a 16-byte
 * vector, is a row in vectors (k->vw, vld, vst): lane j keeps vectors j,
 * j + team, ... in registers, loaded and stored 16 bytes at a time when
 * the row's addresses sit on 16 bytes (checked per row: vec_check), and a
 * warp takes the row when its vectors fit the registers (a row of 768
 * bf16: 3 vectors a lane). A row computed by a prologue need not be flat
 * (W5's embedding, x + wpe broadcast over the batch): only its result's
 * store goes in vectors then, and the prologue walks its own indices. A
 * norm's contiguous scale and shift are loaded in vectors with the row, in
 * the first pass (vec_param_loads). The lanes' partial sums hold other
 * columns than in the scalar layout, so sums may differ from it by rounding.
 */
static void vec_plan(rowk *k) {
    const sg__group *grp = k->grp;
    sg__op op = k->an->op;
    sg__dialect d = sg__cuda_dialect(k->g);
    if ((d != SG__DIALECT_CUDA && d != SG__DIALECT_HIP) || grp->kind != SG__G_ROW || k->xs ||
        k->sink >= 0 || k->cols > 1 || (!k->flat && k->a == 0) ||
        (op != SG__OP_SOFTMAX && op != SG__OP_LOG_SOFTMAX && op != SG__OP_LAYER_NORM &&
         op != SG__OP_RMS_NORM))
        return;
    size_t xs = sg_dtype_size(k->x->dtype), os = sg_dtype_size(k->o->dtype);
    int vw = (int)(16 / (xs > os ? xs : os));
    bool vld = k->flat && k->a == 0 && grp->g[k->a].arg_src[0] < 0 && xs * (size_t)vw == 16 &&
               sg__lower_flat_ok(k->x, k->nd, k->shape) && k->x->offset % vw == 0;
    bool vst = grp->g[k->a].store && k->a + 1 == grp->n && os * (size_t)vw == 16 &&
               sg__lower_flat_ok(k->o, k->nd, k->shape) && k->o->offset % vw == 0;
    if (vw < 2 || k->len % vw || (!vld && !vst)) return;
    int64_t nv = k->len / vw;
    int team = (nv + 31) / 32 * vw <= REG_MAX ? 32 : BLOCK;
    int64_t per = (nv + team - 1) / team * vw;
    if (per > REG_MAX) return;
    k->team = team, k->per = (int)per, k->vw = vw, k->vld = vld, k->vst = vst;
    /* A norm's scale and shift: vectors too when contiguous and aligned alike. */
    k->vpar = vst && (op == SG__OP_LAYER_NORM || op == SG__OP_RMS_NORM) && !norm_params_written(k);
    for (int j = 1; k->vpar && j < k->an->nin && j < 3; j++) {
        const sg__ref *r = sg__cuda_arg(k->g, k->an, j);
        k->vpar = !r || (r->ndim == 1 && r->shape[0] == k->len && r->stride[0] == 1 &&
                         r->offset % vw == 0 && sg_dtype_size(r->dtype) * (size_t)vw == 16);
    }
}

/*
 * k's fields from its group (k->g, e, grp, a, rows, len, cols, sink, xs
 * set by the caller). Returns the members with no store (for passes that
 * only read): `quiet` when it holds them, else an allocation row_done
 * frees; NULL when out of memory (e->oom set).
 */
static sg__gnode *row_setup(rowk *k, sg__gnode *quiet, int nquiet) {
    sg__cuda_gen *g = k->g;
    const sg__group *grp = k->grp;
    const sg__ir *ir = sg__cuda_ir(g);
    k->an = &ir->nodes[grp->g[k->a].node];
    k->x = sg__cuda_arg(g, k->an, 0);
    k->o = sg__cuda_ref(g, k->an->out);
    k->nd = k->x->ndim;
    k->shape = k->x->shape;
    k->sp = sg__cuda_spell(g);
    snprintf(k->ninf, sizeof k->ninf, "%s(0xff800000u)", k->sp->u2f);
    snprintf(k->pinf, sizeof k->pinf, "%s(0x7f800000u)", k->sp->u2f);
    snprintf(k->qnan, sizeof k->qnan, "%s(0x7fc00000u)", k->sp->u2f);
    /* Without shuffles a team's barriers are the block's: a block is one
     * team (a warp's 32 threads for a short row), every team of it taking
     * the same rows; a GEMV's rows (the block is the GEMV's) take the block. */
    bool into = k->xs != NULL;
    k->team = k->len <= WARP_ROW && (k->sp->shuffles || !into) ? 32 : BLOCK;
    k->block = k->sp->shuffles ? BLOCK : k->team;
    int64_t per = (k->len + k->team - 1) / k->team;
    k->per = per <= REG_MAX ? (int)per : 0;
    /* The walk over the input's shape: prologue, the anchor's load and
     * store, the row epilogue (ROW) or the full epilogue (REDUCE). */
    int epi_from = grp->kind == SG__G_ROW ? k->a + 1 : grp->bcast ? grp->bcast : grp->n;
    bool loads = grp->g[k->a].arg_src[0] < 0;
    k->flat = sg__cuda_walk_flat(g, grp, 0, k->a, k->nd, k->shape, loads ? k->x : NULL) &&
              sg__cuda_walk_flat(g, grp, epi_from, grp->n, k->nd, k->shape,
                                 grp->kind == SG__G_ROW && grp->g[k->a].store ? k->o : NULL);
    vec_plan(k);
    sg__gnode *qg = grp->n <= nquiet ? quiet
                                     : sg__alloc(sg__cuda_out(g)->ctx, sizeof *qg * (size_t)grp->n);
    if (!qg) {
        k->e->oom = true;
        return NULL;
    }
    for (int m = 0; m < grp->n; m++) qg[m] = grp->g[m], qg[m].store = false;
    k->quiet = *grp;
    k->quiet.g = qg;
    return qg;
}

static void row_done(rowk *k, sg__gnode *qg, const sg__gnode *quiet) {
    if (qg && qg != quiet) sg__free(k->e->ctx, qg, sizeof *qg * (size_t)k->grp->n);
}

/* The loop of rows that starts at row block `blk` and steps over `nblk`
 * blocks, a team per row. */
static void row_loop(rowk *k, const char *blk, const char *nblk) {
    const sg__group *grp = k->grp;
    const char *tid = k->sp->tid;
    int rpb = k->block / k->team;
    sg__emit_line(k->e, "const int r_lane = %s %% %d;", tid, k->team);
    sg__emit_open(k->e,
                  "for (sg_i64 r_row = (sg_i64)%s * %d + %s / %d; r_row < %lldLL; "
                  "r_row += (sg_i64)%s * %d)",
                  blk, rpb, tid, k->team, (long long)k->rows, nblk, rpb);
    /* Room for whole groups of 8 (the write pass's steps; those past the row go unused). */
    if (k->per && grp->kind == SG__G_ROW)
        sg__emit_line(k->e, "float r_xr[%d];", k->per < 8 ? k->per : (k->per + 7) / 8 * 8);
    if (grp->kind == SG__G_ROW)
        emit_row_op(k);
    else if (k->an->op == SG__OP_ARGMAX)
        emit_argmax(k);
    else
        emit_reduce(k);
    /* The next row reuses the shared words. */
    if (k->team > 32 && k->nred) sg__emit_line(k->e, "%s", k->sp->sync);
    sg__emit_close(k->e);
}

/* A column reduction or a few long rows cut over blocks (emit_columns,
 * emit_split), with its grid; NULL when the group is neither. */
static const char *emit_wide(rowk *k, sg__cuda_kinfo *ki) {
    const sg__group *grp = k->grp;
    int64_t ch = k->len, split = 1;
    if (grp->kind == SG__G_REDUCE && k->cols > 1) {
        int64_t n = k->cols;
        int tc = 32; /* the least power of 2 >= n, at most 32 */
        while (tc > 2 && tc / 2 >= n) tc /= 2;
        /* A short range (a positional embedding's gradient summed over a
         * batch of 4): fewer row groups and more columns a block, until each
         * group takes 4 positions or one group takes the range; otherwise
         * most threads hold one position and a block moves a few hundred
         * bytes (32 µs for GPT-2's 1024 x 768 over 4 against ~4). */
        while (tc < BLOCK && tc < n && k->len / (BLOCK / tc) < 4) tc *= 2;
        int64_t tiles = k->rows * ((n + tc - 1) / tc);
        split = plan_split(tiles, k->len, 4 * (BLOCK / tc), 0, &ch);
        int64_t items = tiles * split;
        if (split > 1 && !k->sp->shuffles) {
            ki->grid = (unsigned)(tiles > GRID_MAX ? GRID_MAX : tiles);
            emit_columns_seq(k, tc, split, ch);
            return "column reduction, a block per column tile folding the chunks of the range "
                   "in order; prologue and epilogue fused";
        }
        ki->grid = (unsigned)(items > GRID_MAX ? GRID_MAX : items);
        emit_columns(k, tc, split, ch, items);
        return split > 1 ? "column reduction, a block per column tile and chunk of the range, "
                           "the last block of a tile combining the chunks in order; prologue "
                           "and epilogue fused"
                         : "column reduction, a block per column tile; prologue and epilogue "
                           "fused";
    }
    if (grp->kind == SG__G_REDUCE && !grp->bcast && k->team == BLOCK && k->an->op != SG__OP_VAR &&
        (split = k->an->op == SG__OP_ARGMAX
                     ? plan_split(k->rows, k->len, SPLIT_LEAST_ARGMAX, 8 * (int64_t)k->team, &ch)
                     : plan_split(k->rows, k->len, SPLIT_LEAST, 0, &ch)) > 1) {
        if (!k->sp->shuffles) {
            ki->grid = (unsigned)(k->rows > GRID_MAX ? GRID_MAX : k->rows);
            emit_split_seq(k, split, ch);
            return "long-row reduction, a block per row folding its chunks in order; prologue "
                   "and epilogue fused";
        }
        ki->grid = (unsigned)(k->rows * split);
        emit_split(k, split, ch);
        return "long-row reduction, a block per chunk of a row, the row's last block "
               "combining the chunks in order; prologue and epilogue fused";
    }
    return NULL;
}

const char *sg__cgen_cuda_rows(sg__cuda_gen *g, const sg__group *grp, sg__cuda_kinfo *ki) {
    rowk k = {.g = g,
              .e = sg__cuda_out(g),
              .grp = grp,
              .a = grp->anchor,
              .rows = grp->nrows,
              .len = grp->rowlen,
              .cols = grp->ncols > 1 ? grp->ncols : 1,
              .sink = -1};
    sg__gnode quiet[64];
    sg__gnode *qg = row_setup(&k, quiet, 64);
    if (!qg) return "";
    ki->iters = k.rows * k.len * k.cols;
    ki->replaces_call = true;
    const char *what = emit_wide(&k, ki);
    ki->block = what ? BLOCK : (unsigned)k.block;
    if (!what) {
        int rpb = k.block / k.team;
        int64_t blocks = (k.rows + rpb - 1) / rpb;
        ki->grid = (unsigned)(blocks < 1 ? 1 : blocks > GRID_MAX ? GRID_MAX : blocks);
        row_loop(&k, k.sp->bid, k.sp->gdim);
    }
    row_done(&k, qg, quiet);
    if (what) return what;
    if (grp->kind == SG__G_ROW)
        return k.team > 32 ? "row op, a block per row, prologue and epilogue fused"
                           : "row op, a warp per row, prologue and epilogue fused";
    if (k.an->op == SG__OP_ARGMAX)
        return k.team > 32 ? "row argmax, a block per row, prologue fused"
                           : "row argmax, a warp per row, prologue fused";
    return k.team > 32 ? "row reduction, a block per row, prologue and epilogues fused"
                       : "row reduction, a warp per row, prologue and epilogues fused";
}

void sg__cgen_cuda_rows_into(sg__cuda_gen *g, const sg__group *grp, int sink, const char *xs) {
    rowk k = {.g = g,
              .e = sg__cuda_out(g),
              .grp = grp,
              .a = grp->anchor,
              .rows = grp->nrows,
              .len = grp->rowlen,
              .cols = 1,
              .sink = sink,
              .xs = xs};
    sg__gnode quiet[64];
    sg__gnode *qg = row_setup(&k, quiet, 64);
    if (!qg) return;
    row_loop(&k, "0", "1");
    row_done(&k, qg, quiet);
}

/*
 * An argmax merged into a GEMV (sg__group.argmax): each thread's candidate
 * (am_b<r>, am_at<r>) per row, the block's best through its warps' shuffles
 * and shared memory, published by thread 0; the last block to arrive (a
 * fence, then a counter that it resets for the next launch) combines the
 * blocks' bests, as emit_split does, and stores each row's index. The
 * order is argmax's total order, so the result is the same whatever order
 * the blocks finish in.
 */
void sg__cgen_cuda_gemv_argmax(sg__cuda_gen *g, const sg__group *grp, int am, int64_t rows,
                               unsigned grid) {
    sg__emit *e = sg__cuda_out(g);
    const sg__ref *o = sg__cuda_ref(g, sg__cuda_ir(g)->nodes[grp->g[am].node].out);
    rowk warp = {.g = g, .e = e, .grp = grp, .team = 32, .nred = 100, .sp = sg__cuda_spell(g)};
    rowk blk = warp;
    blk.team = BLOCK;
    int nw = BLOCK / 32;
    char lv[400];
    sg__emit_line(e, "__shared__ bool am_last; /* this block finished the argmax */");
    sg__emit_open(e, "%s", "");
    sg__emit_line(e, "static __device__ float am_part[%lld];", (long long)(rows * grid));
    sg__emit_line(e, "static __device__ sg_i64 am_parti[%lld];", (long long)(rows * grid));
    sg__emit_line(e, "static __device__ unsigned int am_count[1];");
    sg__emit_line(e, "__shared__ float am_wb[%lld][%d];", (long long)rows, nw);
    sg__emit_line(e, "__shared__ sg_i64 am_wa[%lld][%d];", (long long)rows, nw);
    for (int64_t r = 0; r < rows; r++) {
        sg__emit_open(e, "%s", "");
        sg__emit_line(e, "float r_b = am_b%lld;", (long long)r);
        sg__emit_line(e, "sg_i64 r_at = am_at%lld;", (long long)r);
        team_argmax(&warp);
        sg__emit_line(e,
                      "if ((threadIdx.x & 31) == 0) am_wb[%lld][threadIdx.x >> 5] = r_b, "
                      "am_wa[%lld][threadIdx.x >> 5] = r_at;",
                      (long long)r, (long long)r);
        sg__emit_close(e);
    }
    sg__emit_line(e, "__syncthreads();");
    sg__emit_open(e, "if (threadIdx.x == 0)");
    for (int64_t r = 0; r < rows; r++) {
        sg__emit_open(e, "%s", "");
        sg__emit_line(e, "float r_b = am_wb[%lld][0];", (long long)r);
        sg__emit_line(e, "sg_i64 r_at = am_wa[%lld][0];", (long long)r);
        sg__emit_open(e, "for (int w = 1; w < %d; w++)", nw);
        sg__emit_line(e, "const float r_ob = am_wb[%lld][w];", (long long)r);
        sg__emit_line(e, "const sg_i64 r_oa = am_wa[%lld][w];", (long long)r);
        sg__emit_line(e, "if (%s) r_b = r_ob, r_at = r_oa;", ARGMAX_BETTER);
        sg__emit_close(e);
        sg__emit_line(e,
                      "am_part[%lldLL + blockIdx.x] = r_b, am_parti[%lldLL + blockIdx.x] = r_at;",
                      (long long)(r * grid), (long long)(r * grid));
        sg__emit_close(e);
    }
    sg__emit_line(e, "__threadfence();");
    sg__emit_line(e, "am_last = atomicAdd(&am_count[0], 1u) == %uu;", grid - 1);
    sg__emit_close(e);
    sg__emit_line(e, "__syncthreads();");
    sg__emit_open(e, "if (am_last)");
    sg__emit_line(e, "__threadfence();");
    bool flat = sg__cuda_walk_flat(g, grp, 0, 0, o->ndim, o->shape, o);
    for (int64_t r = 0; r < rows; r++) {
        sg__emit_open(e, "%s", "");
        sg__emit_line(e, "float r_b = __uint_as_float(0xff800000u);");
        sg__emit_line(e, "sg_i64 r_at = -1;");
        /* The partials in chunks of `u` a thread, every load of a chunk in
         * flight before the first is used. */
        int u = (int)((grid + BLOCK - 1) / BLOCK);
        u = u < 1 ? 1 : u > 16 ? 16 : u;
        sg__emit_open(e, "for (sg_i64 j0 = threadIdx.x; j0 < %u; j0 += %d)", grid, u * BLOCK);
        sg__emit_line(e, "float r_pb[%d];", u);
        sg__emit_line(e, "sg_i64 r_pa[%d];", u);
        sg__emit_line(e, "#pragma unroll");
        sg__emit_open(e, "for (int r_u = 0; r_u < %d; r_u++)", u);
        sg__emit_line(e, "const sg_i64 j = j0 + (sg_i64)r_u * %d;", BLOCK);
        sg__emit_line(e, "r_pb[r_u] = j < %u ? __ldcg(&am_part[%lldLL + j]) : 0.0f;", grid,
                      (long long)(r * grid));
        sg__emit_line(e, "r_pa[r_u] = j < %u ? __ldcg(&am_parti[%lldLL + j]) : -1;", grid,
                      (long long)(r * grid));
        sg__emit_close(e);
        sg__emit_line(e, "#pragma unroll");
        sg__emit_open(e, "for (int r_u = 0; r_u < %d; r_u++)", u);
        sg__emit_line(e, "const float r_ob = r_pb[r_u];");
        sg__emit_line(e, "const sg_i64 r_oa = r_pa[r_u];");
        sg__emit_line(e, "if (%s) r_b = r_ob, r_at = r_oa;", ARGMAX_BETTER);
        sg__emit_close(e);
        sg__emit_close(e);
        team_argmax(&blk);
        if (grp->g[am].store) {
            sg__emit_open(e, "if (threadIdx.x == 0)");
            sg__emit_line(e, "const sg_i64 i = %lld;", (long long)r);
            if (!flat) sg__cuda_unflatten(g, o->ndim, o->shape);
            sg__cuda_lvalue(g, o, o->ndim, o->shape, flat, lv, sizeof lv);
            sg__emit_line(e, "%s = r_at; /* argmax */", lv);
            sg__emit_close(e);
        }
        sg__emit_close(e);
    }
    sg__emit_line(e, "if (threadIdx.x == 0) am_count[0] = 0;");
    sg__emit_close(e);
    sg__emit_close(e);
}

/* ------------------------------------------------------------ multi-tensor sums */

/* One member of a MULTI of full reductions: its rowk, its first block (or
 * partial), its chunks and chunk length, its fold's warp. */
typedef struct sums_member {
    rowk k;
    sg__gnode quiet[16];
    sg__gnode *qg;
    int64_t first, split, ch;
    const sg__ref *in; /* its one input when its fold may be shared (sums_input) */
    int cls;           /* the shared fold it runs (a member index: the first of
                          its class), or -1: its own */
    int tab;           /* with a class: its row of the tables */
} sums_member;

/* Member part's rowk, a block per team (its chunks are long); false when
 * out of memory. */
static bool sums_setup(sums_member *sm, sg__cuda_gen *g, const sg__group *part) {
    sm->k = (rowk){.g = g,
                   .e = sg__cuda_out(g),
                   .grp = part,
                   .a = part->anchor,
                   .rows = 1,
                   .len = part->rowlen,
                   .cols = 1,
                   .sink = -1};
    sm->qg = row_setup(&sm->k, sm->quiet, 16);
    if (!sm->qg) return false;
    sm->k.team = sm->k.block = BLOCK;
    sm->k.per = 0;
    return true;
}

/* Positions r_lo..r_hi of chunk `sp` of a member of `len` positions (C
 * expressions; len NULL: member sm's own). */
static void sums_range(sums_member *sm, const char *sp, const char *len) {
    rowk *k = &sm->k;
    char own[32];
    snprintf(own, sizeof own, "%lldLL", (long long)k->len);
    if (!len) len = own;
    sg__emit_line(k->e, "const sg_i64 r_lo = (%s) * %lldLL;", sp, (long long)sm->ch);
    sg__emit_line(k->e, "const sg_i64 r_hi = r_lo + %lldLL < %s ? r_lo + %lldLL : %s;",
                  (long long)sm->ch, len, (long long)sm->ch, len);
}

/* Loads a thread keeps in flight in a member's fold: 32 bytes of its input
 * (8 floats, 16 halves), since the folds stream whole gradients and wait on
 * memory (8 halves a thread held W6's clip at 55 % of DRAM's bandwidth).
 * The positions a thread adds, and their order, do not depend on it. */
static int sums_unroll(const sums_member *sm) {
    int es = sm->in ? (int)sg_dtype_size(sm->in->dtype) : 4;
    return es >= 4 ? 8 : 32 / es;
}

/* Fold chunk r_lo..r_hi of member sm into r_s (r_s += each position). */
static void sums_fold(sums_member *sm) {
    rowk *k = &sm->k;
    int64_t n = sm->ch < k->len ? sm->ch : k->len;
    chunk_loop(k, "r_lo + r_lane", "r_hi", BLOCK, chunk_of(n, BLOCK, sums_unroll(sm)),
               "r_s += r_x;", false);
}

/*
 * Members whose folds are one code but for where their input lies share
 * one fold, so that a clip's 148 squared norms compile as one loop, not
 * 148 (NVRTC took 10 s for them apart, ~70 ms a member): the fold of a
 * flat walk with no store before the anchor, whose every load is of one
 * contiguous ref (sums_input), is the same for members with the same ops,
 * constants, dtypes and operand sources (sums_same); its slot base comes
 * from a table indexed by the block's member (sums_tables), moved by the
 * member's offset less the first's, whose offset the shared code adds.
 */
static const sg__ref *sums_input(const sums_member *sm) {
    const rowk *k = &sm->k;
    const sg__ir *ir = sg__cuda_ir(k->g);
    const sg__ref *in = NULL;
    if (!k->flat) return NULL;
    for (int j = 0; j <= k->a; j++) {
        const sg__gnode *m = &k->grp->g[j];
        const sg__irnode *n = &ir->nodes[m->node];
        if ((m->store && j < k->a) || n->nin > 4) return NULL;
        for (int q = 0; q < n->nin; q++) {
            const sg__ref *r = m->arg_src[q] >= 0 ? NULL : sg__cuda_arg(k->g, n, q);
            if (!r) continue;
            if (in && (r->slot != in->slot || r->offset != in->offset || r->dtype != in->dtype))
                return NULL;
            if (!sg__lower_flat_ok(r, k->nd, k->shape)) return NULL;
            in = r;
        }
    }
    return in;
}

static bool sums_same(const sums_member *a, const sums_member *b) {
    const rowk *x = &a->k, *y = &b->k;
    const sg__ir *ir = sg__cuda_ir(x->g);
    if (x->a != y->a || a->in->dtype != b->in->dtype) return false;
    for (int j = 0; j <= x->a; j++) {
        const sg__gnode *p = &x->grp->g[j], *q = &y->grp->g[j];
        const sg__irnode *m = &ir->nodes[p->node], *n = &ir->nodes[q->node];
        if (m->op != n->op || m->nin != n->nin || memcmp(m->f, n->f, sizeof m->f) != 0 ||
            memcmp(p->arg_src, q->arg_src, sizeof(int) * (size_t)m->nin) != 0 ||
            sg__cuda_ref(x->g, m->out)->dtype != sg__cuda_ref(y->g, n->out)->dtype)
            return false;
        if (j < x->a && (memcmp(m->i, n->i, sizeof m->i) != 0 || m->mask != n->mask))
            return false;
        for (int k = 0; k < m->nin; k++)
            if ((sg__cuda_arg(x->g, m, k) == NULL) != (sg__cuda_arg(y->g, n, k) == NULL))
                return false;
    }
    return true;
}

/* Each member's class: the first earlier member whose fold it shares. */
static void sums_classes(sums_member *sm, int n) {
    for (int m = 0; m < n; m++) {
        sm[m].in = sums_input(&sm[m]);
        sm[m].cls = -1;
        for (int c = 0; sm[m].in && c < m && sm[m].cls < 0; c++)
            if (sm[c].in && sm[c].cls == c && sums_same(&sm[c], &sm[m])) sm[m].cls = c;
        if (sm[m].in && sm[m].cls < 0) sm[m].cls = m; /* a class of its own so far */
    }
    for (int m = 0; m < n; m++) { /* a class of one keeps its own fold */
        bool shared = false;
        for (int o = 0; o < n && !shared; o++) shared = o != m && sm[o].cls == sm[m].cls;
        if (!shared) sm[m].cls = -1;
    }
}

/* Column `what` of the tables over the members of shared folds into v. */
static void sums_column(const sums_member *sm, int n, int what, int64_t *v) {
    for (int m = 0, at = 0; m < n; m++) {
        if (sm[m].cls < 0) continue;
        const sums_member *c = &sm[sm[m].cls];
        v[at++] = what == 0   ? sm[m].first
                  : what == 1 ? sm[m].first + sm[m].split
                  : what == 2 ? sm[m].k.len
                  : what == 3
                      ? (sm[m].in->offset - c->in->offset) * (int64_t)sg_dtype_size(sm[m].in->dtype)
                  : what == 4 ? sg__cuda_local_slot(sm[m].k.g, sm[m].in->slot)
                              : sm[m].cls;
    }
}

/* The members of shared folds in block order: first and end blocks,
 * lengths, byte moves and slots, classes; r_t the block's row, or -1. */
static void sums_tables(sg__cuda_gen *g, sums_member *sm, int n) {
    sg__emit *e = sg__cuda_out(g);
    int nt = 0;
    for (int m = 0; m < n; m++) nt += sm[m].cls >= 0;
    int64_t *v = sg__alloc(e->ctx, sizeof(int64_t) * (size_t)nt);
    if (!v) {
        e->oom = true;
        return;
    }
    static const char *names[6] = {"r_tf", "r_te", "r_tl", "r_td", "r_ts", "r_tc"};
    for (int w = 0; w < 6; w++) {
        sums_column(sm, n, w, v);
        sg__cuda_table(g, names[w], v, nt);
    }
    sg__free(e->ctx, v, sizeof(int64_t) * (size_t)nt);
    sg__emit_line(e, "int r_t = -1;");
    sg__cuda_table_row(g, "r_tf", nt);
    sg__emit_line(e,
                  "if (r_tf[r_a] <= (sg_i64)blockIdx.x && (sg_i64)blockIdx.x < r_te[r_a]) r_t = r_a;");
}

/* A shared fold: the chunk of table row r_t's member, the code sm's. */
static void sums_shared(sg__cuda_gen *g, void *arg) {
    sums_member *sm = arg;
    rowk *k = &sm->k;
    k->e = sg__cuda_out(g);
    sg__emit_line(k->e, "const sg_i64 r_row = 0;");
    sums_range(sm, "(sg_i64)blockIdx.x - r_tf[r_t]", "r_tl[r_t]");
    chunk_loop(k, "r_lo + r_lane", "r_hi", BLOCK, chunk_of(sm->ch, BLOCK, sums_unroll(sm)),
               "r_s += r_x;", false);
}

/* Blocks that meet: this block's chunk of member sm into r_s. */
static void sums_chunk(sg__cuda_gen *g, void *arg) {
    sums_member *sm = arg;
    char sp[64];
    sm->k.e = sg__cuda_out(g);
    sg__emit_line(sm->k.e, "const sg_i64 r_row = 0;");
    snprintf(sp, sizeof sp, "(sg_i64)blockIdx.x - %lldLL", (long long)sm->first);
    sums_range(sm, sp, NULL);
    sums_fold(sm);
}

/* `v` = the n partials from r_part[f0] folded by lane r_l of one warp in
 * chunk order (lane j takes partials j, j + 32, ..; then the xor
 * shuffles); one partial is taken as it is. f0, n: C expressions. */
static void fold_parts(sg__emit *e, const char *v, const char *f0, const char *n) {
    sg__emit_line(e, "%s = __ldcg(&r_part[%s]);", v, f0);
    sg__emit_open(e, "if (%s > 1)", n);
    sg__emit_line(e, "%s = 0.0f;", v);
    sg__emit_line(e, "for (sg_i64 j = r_l; j < %s; j += 32) %s += __ldcg(&r_part[%s + j]);", n, v,
                  f0);
    sg__emit_line(e, "for (int o = 16; o > 0; o >>= 1) %s += __shfl_xor_sync(0xffffffffu, %s, o);",
                  v, v);
    sg__emit_close(e);
}

/* The last block: member sm's partials folded in chunk order by lane r_l
 * of one warp (lane j takes partials j, j + 32, ..; then the xor shuffles),
 * and lane 0 stores the sum and runs the member's epilogue. */
static void sums_finish(sg__cuda_gen *g, void *arg) {
    sums_member *sm = arg;
    rowk *k = &sm->k;
    k->e = sg__cuda_out(g);
    char f0[32], n[32];
    snprintf(f0, sizeof f0, "%lldLL", (long long)sm->first);
    snprintf(n, sizeof n, "%lldLL", (long long)sm->split);
    fold_parts(k->e, "r_s", f0, n);
    sg__emit_open(k->e, "if (r_l == 0)");
    single_tail(k, "0");
    sg__emit_close(k->e);
}

/* A shared fold's member: its sum from r_fv, stored, its epilogue run. */
static void sums_tail(sg__cuda_gen *g, void *arg) {
    sums_member *sm = arg;
    rowk *k = &sm->k;
    k->e = sg__cuda_out(g);
    sg__emit_line(k->e, "r_s = r_fv[%d];", sm->tab);
    single_tail(k, "0");
}

/* Blocks that cannot meet (OpenCL C): this work-group folds member sm's
 * chunks in order, each over the team as a block of the CUDA kernel does,
 * then stores the sum and runs the member's epilogue. */
static void sums_seq(sg__cuda_gen *g, void *arg) {
    sums_member *sm = arg;
    rowk *k = &sm->k;
    k->e = sg__cuda_out(g);
    sg__emit_line(k->e, "const sg_i64 r_row = 0;");
    sg__emit_line(k->e, "float r_f = 0.0f;");
    sg__emit_open(k->e, "for (sg_i64 r_sp = 0; r_sp < %lldLL; r_sp++)", (long long)sm->split);
    sums_range(sm, "r_sp", NULL);
    sg__emit_line(k->e, "r_s = 0.0f;");
    sums_fold(sm);
    team_reduce(k, "r_s", false);
    sg__emit_line(k->e, "r_f += r_s;");
    sg__emit_line(k->e, "%s", k->sp->sync); /* the next chunk reuses the team's words */
    sg__emit_close(k->e);
    sg__emit_line(k->e, "r_s = r_f;");
    sg__emit_open(k->e, "if (r_lane == 0)");
    single_tail(k, "0");
    sg__emit_close(k->e);
}

/* The positions per chunk of a MULTI of sums over `total` positions: about
 * SUMS_BLOCKS chunks in all (several waves, so that the last wave's idle
 * SMs cost little), at least SPLIT_LEAST positions each, whole steps of 32
 * loads a thread (any sums_unroll). */
#define SUMS_BLOCKS (4 * TARGET_BLOCKS)
static int64_t sums_chunk_len(int64_t total) {
    int64_t ch = (total + SUMS_BLOCKS - 1) / SUMS_BLOCKS, step = (int64_t)BLOCK * 32;
    if (ch < SPLIT_LEAST) ch = SPLIT_LEAST;
    return (ch + step - 1) / step * step;
}

/* The blocks' partials folded and each member finished (sg__cgen_cuda_sums). */
static void sums_last(sg__cuda_gen *g, sums_member *sm, int n, int64_t blocks) {
    sg__emit *e = sg__cuda_out(g);
    sg__emit_open(e, "if (r_lane == 0)");
    sg__emit_line(e, "r_part[blockIdx.x] = r_s;");
    sg__emit_line(e, "__threadfence();");
    sg__emit_line(e, "r_last = atomicAdd(&r_count[0], 1u) == %lldu;", (long long)(blocks - 1));
    sg__emit_close(e);
    sg__emit_line(e, "__syncthreads();");
    sg__emit_line(e, "if (!r_last) return;");
    sg__emit_line(e, "__threadfence();");
    sg__emit_line(e, "const int r_w = r_lane >> 5, r_l = r_lane & 31;");
    int nt = 0;
    for (int m = 0; m < n; m++) nt += sm[m].cls >= 0;
    if (nt) { /* the shared folds' members: one loop folds their partials (fold_parts) */
        sg__cuda_shared(g, 0, "float r_fv[%d]", nt);
        sg__emit_open(e, "for (int r_q = r_w; r_q < %d; r_q += %d)", nt, BLOCK / 32);
        sg__emit_line(e, "const sg_i64 r_f0 = r_tf[r_q], r_n = r_te[r_q] - r_f0;");
        sg__emit_line(e, "float r_v;");
        fold_parts(e, "r_v", "r_f0", "r_n");
        sg__emit_line(e, "if (r_l == 0) r_fv[r_q] = r_v;");
        sg__emit_close(e);
        sg__emit_line(e, "__syncthreads();");
    }
    for (int m = 0, t = 0; m < n; m++) {
        char open[64];
        if (sm[m].cls >= 0) { /* its store and epilogue by thread t of the block */
            snprintf(open, sizeof open, "if (r_lane == %d)", t % BLOCK);
            sm[m].tab = t++;
            sg__cuda_branch(g, open, sums_tail, &sm[m]);
            continue;
        }
        snprintf(open, sizeof open, "if (r_w == %d)", m % (BLOCK / 32));
        sg__cuda_branch(g, open, sums_finish, &sm[m]);
    }
    sg__emit_line(e, "if (r_lane == 0) r_count[0] = 0;");
}

const char *sg__cgen_cuda_sums(sg__cuda_gen *g, const sg__group *grp, sg__cuda_kinfo *ki) {
    sg__emit *e = sg__cuda_out(g);
    const sg__spell *sp = sg__cuda_spell(g);
    int n = grp->nmembers;
    sums_member *sm = sg__calloc(e->ctx, sizeof *sm * (size_t)n);
    if (!sm) {
        e->oom = true;
        return "";
    }
    const sg__fused *f = sg__cuda_fused(g);
    int ok = 0;
    int64_t total = 0, blocks = 0;
    for (; ok < n && sums_setup(&sm[ok], g, &f->parts[grp->members[ok]]); ok++)
        total += sm[ok].k.len;
    if (ok < n) {
        e->oom = true;
        n = ok;
    }
    int64_t ch = sums_chunk_len(total);
    for (int m = 0; m < n; m++) {
        int64_t len = sm[m].k.len, split = (len + ch - 1) / ch;
        sm[m].ch = ch;
        sm[m].split = split < 1 ? 1 : split;
        sm[m].first = blocks;
        blocks += sm[m].split;
    }
    rowk base = {.g = g, .e = e, .sp = sp, .team = BLOCK, .block = BLOCK};
    sg__emit_line(e, "const int r_lane = %s;", sp->tid);
    sg__emit_line(e, "float r_s = 0.0f;");
    if (sp->shuffles) {
        sg__emit_line(e, "static __device__ float r_part[%lld];", (long long)blocks);
        sg__emit_line(e, "static __device__ unsigned int r_count[1];");
        sg__emit_line(e, "__shared__ bool r_last;");
    }
    for (int m = 0; m < n; m++) sm[m].cls = -1; /* OpenCL C: each member its own fold */
    if (sp->shuffles) sums_classes(sm, n);
    bool tables = false;
    for (int m = 0; m < n; m++) tables = tables || sm[m].cls >= 0;
    if (tables) sums_tables(g, sm, n);
    /* One flat `if` per member or shared fold, not an else-if chain: nested
     * branches, one reconvergence point per level, held 80 registers and
     * spilled where flat ones take 40. */
    for (int m = 0; m < n; m++) {
        char open[96], base[96];
        if (sm[m].cls >= 0 && sm[m].cls != m) continue; /* its class's fold runs it */
        if (sm[m].cls == m) {
            snprintf(open, sizeof open, "if (r_t >= 0 && r_tc[r_t] == %d)", m);
            snprintf(base, sizeof base, "slot[r_ts[r_t]] + r_td[r_t]");
            sg__cuda_branch_based(g, open, sums_shared, &sm[m],
                                  sg__cuda_local_slot(g, sm[m].in->slot), base);
            continue;
        }
        if (sp->shuffles)
            snprintf(open, sizeof open, "if (blockIdx.x >= %lld && blockIdx.x < %lld)",
                     (long long)sm[m].first, (long long)(sm[m].first + sm[m].split));
        else
            snprintf(open, sizeof open, "if (%s == %d)", sp->bid, m);
        sg__cuda_branch(g, open, sp->shuffles ? sums_chunk : sums_seq, &sm[m]);
    }
    if (sp->shuffles) {
        team_reduce(&base, "r_s", false);
        sums_last(g, sm, n, blocks);
    }
    for (int m = 0; m < ok; m++) {
        sm[m].k.e = e; /* a branch's text is gone */
        row_done(&sm[m].k, sm[m].qg, sm[m].quiet);
    }
    sg__free(e->ctx, sm, sizeof *sm * (size_t)grp->nmembers);
    ki->grid = (unsigned)(sp->shuffles ? blocks : n > 0 ? n : 1);
    ki->block = BLOCK;
    ki->iters = total;
    ki->replaces_call = true;
    return sp->shuffles ? "full reductions of several tensors, a block per chunk of a member, the "
                          "last block folding each member's chunks in order (a warp per member); "
                          "prologues and epilogues fused"
                        : "full reductions of several tensors, a work-group per member folding "
                          "its chunks in order; prologues and epilogues fused";
}
