/* SPDX-License-Identifier: MIT */
/*
 * cgen_cuda_row.c -- the CUDA dialect's row kernels: a ROW or REDUCE group
 * that fusion marks rows_inline (fusion.h) becomes one kernel that computes
 * its pointwise prologue, its anchor and its epilogues, so no library call
 * runs for it:
 *   softmax, log_softmax over the last dim, layer_norm, rms_norm;
 *   sum and mean over the innermost dims, with the epilogue over the
 *   reduced shape and then over the input's shape (the written-out
 *   x * rsqrt(mean(x * x) + eps) * w in one kernel);
 *   argmax over the innermost dims (no epilogue: its i64 result is stored),
 *   with PyTorch's order: NaN above every number, then the first position
 *   among equals -- a total order, so lanes combine in any order.
 *
 * A team works one row: a warp for rows of at most 256 elements, else a
 * block of 256 threads. Lane j of a team takes elements j, j + team, ...;
 * the team combines its lanes with shuffles (and, for a block, one shared
 * word per warp summed in a fixed order), in f32. Softmax subtracts the
 * row's max (a row read from memory takes max and sum in one pass, the sum
 * rescaled as the max grows); layer_norm takes the variance about the mean
 * in a second pass.
 * A row of at most 32 elements per lane is computed once into registers
 * (prologue included) and read from there by every pass; a longer row is
 * recomputed from memory by each pass, its prologue storing only in the
 * last pass that computes it (an in-place prologue must not read its own
 * result back).
 *
 * The same rows, with every block computing all of them, open a GEMV kernel
 * whose x is the norm's result (sg__cgen_cuda_rows_into): the value the
 * matmul reads goes to an array in shared memory, rounded to its dtype as
 * its store would round it.
 *
 * Loads, stores, ops and their rounding are cgen_cuda.c's (through the
 * helpers of codegen.h), so a fused row rounds as the unfused ops would.
 */
#include "codegen.h"

#include <stdio.h>

#define BLOCK 256    /* threads per block, as cgen_cuda.c launches */
#define WARP_ROW 256 /* rows up to this length take a warp */
#define REG_MAX 32   /* elements per lane kept in registers */

typedef struct rowk {
    sg__cuda_gen *g;
    sg__emit *e;
    const sg__group *grp;
    const sg__irnode *an; /* the anchor */
    const sg__ref *x, *o; /* its input and output */
    int a;                /* the anchor's index in grp->g */
    int64_t rows, len;
    int team, per; /* threads per row; elements per lane (registers), 0 when re-read */
    int nd;        /* the input's shape: the walk of prologue and row epilogue */
    const int64_t *shape;
    bool flat;       /* that walk is flat */
    int nred;        /* shared arrays declared so far */
    sg__group quiet; /* grp with no member storing */
    int sink;        /* GEMV prologue: the member whose value goes to xs[i], else -1 */
    const char *xs;
} rowk;

/* `var` combined over the team (op: "+" for a sum, else fmaxf). */
static void team_reduce(rowk *k, const char *var, bool max) {
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
    sg__emit_line(k->e, "__shared__ float r_red%d[%d];", r, k->team / 32);
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
#define COMBINE_MS(m2, s2)                                                                         \
    "{ const float r_nm = fmaxf(r_m, " m2 "); r_s = (r_m == r_nm ? r_s : r_s * expf(r_m - r_nm))"  \
    " + (" m2 " == r_nm ? " s2 " : " s2 " * expf(" m2 " - r_nm)); r_m = r_nm; }"

static void team_reduce_ms(rowk *k) {
    sg__emit_open(k->e, "for (int o = %d; o > 0; o >>= 1)", k->team > 32 ? 16 : k->team / 2);
    sg__emit_line(k->e, "const float r_om = __shfl_xor_sync(0xffffffffu, r_m, o);");
    sg__emit_line(k->e, "const float r_os = __shfl_xor_sync(0xffffffffu, r_s, o);");
    sg__emit_line(k->e, "%s", COMBINE_MS("r_om", "r_os"));
    sg__emit_close(k->e);
    if (k->team <= 32) return;
    int r = k->nred;
    k->nred += 2;
    sg__emit_open(k->e, "%s", "");
    sg__emit_line(k->e, "__shared__ float r_red%d[%d], r_red%d[%d];", r, k->team / 32, r + 1,
                  k->team / 32);
    sg__emit_line(k->e,
                  "if ((threadIdx.x & 31) == 0) r_red%d[threadIdx.x >> 5] = r_m, "
                  "r_red%d[threadIdx.x >> 5] = r_s;",
                  r, r + 1);
    sg__emit_line(k->e, "__syncthreads();");
    sg__emit_line(k->e, "r_m = r_red%d[0], r_s = r_red%d[0];", r, r + 1);
    sg__emit_open(k->e, "for (int w = 1; w < %d; w++)", k->team / 32);
    sg__emit_line(k->e, "const float r_om = r_red%d[w], r_os = r_red%d[w];", r, r + 1);
    sg__emit_line(k->e, "%s", COMBINE_MS("r_om", "r_os"));
    sg__emit_close(k->e);
    sg__emit_close(k->e);
}

/* In the current scope: i for column r_c of the row, and (unless flat) its indices. */
static void walk_index(rowk *k) {
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

/*
 * One pass over the row: `body` runs once per column with the input in
 * r_x (and the column in r_c). From registers when the row lives there
 * (r_xr, filled by the first pass, `fill`), else recomputed.
 */
static void pass_open(rowk *k, bool fill, bool stores) {
    if (k->per) {
        sg__emit_line(k->e, "#pragma unroll");
        sg__emit_open(k->e, "for (int r_t = 0; r_t < %d; r_t++)", k->per);
        sg__emit_line(k->e, "const sg_i64 r_c = r_lane + (sg_i64)r_t * %d;", k->team);
        sg__emit_open(k->e, "if (r_c < %lldLL)", (long long)k->len);
        sg__emit_line(k->e, "float r_x;");
        if (fill) {
            sg__emit_open(k->e, "%s", "");
            row_input(k, true);
            sg__emit_close(k->e);
            sg__emit_line(k->e, "r_xr[r_t] = r_x;");
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

/* The anchor's value at column r_c into v<a> (from r_x and the statistics),
 * its store, and the row epilogue: the write pass of a ROW group. */
static void row_write(rowk *k) {
    char y[600], rt[900], lv[400], ld[480], st[1000], v[16];
    const sg__irnode *n = k->an;
    switch (n->op) {
    case SG__OP_SOFTMAX: snprintf(y, sizeof y, "(expf(r_x - r_m) * r_inv)"); break;
    case SG__OP_LOG_SOFTMAX: snprintf(y, sizeof y, "((r_x - r_m) - r_ls)"); break;
    default: {
        size_t q = (size_t)snprintf(
            y, sizeof y, n->op == SG__OP_LAYER_NORM ? "((r_x - r_mean) * r_r" : "(r_x * r_r");
        for (int j = 1; j < n->nin && j < 3; j++) {
            const sg__ref *p = sg__cuda_arg(k->g, n, j);
            if (!p) continue;
            char off[128];
            snprintf(off, sizeof off, "%lld + r_c * %lldLL", (long long)p->offset,
                     (long long)p->stride[0]);
            sg__cuda_lvalue_at(k->g, p, off, lv, sizeof lv);
            sg__cuda_widen(p->dtype, lv, ld, sizeof ld);
            q += (size_t)snprintf(y + q, sizeof y - q, j == 1 ? " * %s" : " + %s", ld);
        }
        snprintf(y + q, sizeof y - q, ")");
    }
    }
    walk_index(k);
    sg__cuda_round_trip(y, k->o->dtype, rt, sizeof rt);
    sg__emit_line(k->e, "const float v%d = %s; /* %s */", k->a, rt, sg__op_name(n->op));
    if (k->grp->g[k->a].store) {
        sg__cuda_lvalue(k->g, k->o, k->nd, k->shape, k->flat, lv, sizeof lv);
        snprintf(v, sizeof v, "v%d", k->a);
        sg__cuda_narrow_store(k->o->dtype, lv, v, st, sizeof st);
        sg__emit_line(k->e, "%s", st);
    }
    if (k->a + 1 < k->grp->n)
        sg__cuda_members(k->g, k->grp, k->a + 1, k->grp->n, k->nd, k->shape, k->flat);
    if (k->sink >= 0) {
        const sg__ref *x =
            sg__cuda_ref(k->g, sg__cuda_ir(k->g)->nodes[k->grp->g[k->sink].node].out);
        snprintf(lv, sizeof lv, "%s[i]", k->xs);
        snprintf(v, sizeof v, "v%d", k->sink);
        sg__cuda_narrow_store(x->dtype, lv, v, st, sizeof st);
        sg__emit_line(k->e, "%s", st);
    }
}

/* Statistics and write pass of softmax, log_softmax and the norms. */
static void emit_row_op(rowk *k) {
    sg__op op = k->an->op;
    bool fill = k->per > 0;
    /* Which pass computes the prologue last: the write pass. */
    if ((op == SG__OP_SOFTMAX || op == SG__OP_LOG_SOFTMAX) && !k->per) {
        /* A row read from memory: max and sum in one pass, the sum rescaled
         * as the max grows; -inf adds exactly 0, +inf and NaN make it NaN. */
        sg__emit_line(k->e, "float r_m = __uint_as_float(0xff800000u), r_s = 0.0f;");
        pass_open(k, false, false);
        sg__emit_open(k->e, "if (r_x > r_m)");
        sg__emit_line(k->e, "r_s = r_s * expf(r_m - r_x) + (r_x == __uint_as_float(0x7f800000u) ? "
                            "__uint_as_float(0x7fc00000u) : 1.0f);");
        sg__emit_line(k->e, "r_m = r_x;");
        sg__emit_close(k->e);
        sg__emit_line(k->e,
                      "else if (r_x != __uint_as_float(0xff800000u)) r_s += expf(r_x - r_m);");
        pass_close(k);
        team_reduce_ms(k);
        sg__emit_line(k->e, "const float r_inv = 1.0f / r_s, r_ls = logf(r_s);");
        sg__emit_line(k->e, "(void)r_inv, (void)r_ls;");
    } else if (op == SG__OP_SOFTMAX || op == SG__OP_LOG_SOFTMAX) {
        sg__emit_line(k->e, "float r_m = __uint_as_float(0xff800000u);");
        pass_open(k, fill, false);
        sg__emit_line(k->e, "r_m = r_x > r_m ? r_x : r_m;");
        pass_close(k);
        team_reduce(k, "r_m", true);
        sg__emit_line(k->e, "float r_s = 0.0f;");
        pass_open(k, false, false);
        sg__emit_line(k->e, "r_s += r_x == __uint_as_float(0xff800000u) ? 0.0f : expf(r_x - r_m);");
        pass_close(k);
        team_reduce(k, "r_s", false);
        sg__emit_line(k->e, "const float r_inv = 1.0f / r_s, r_ls = logf(r_s);");
        sg__emit_line(k->e, "(void)r_inv, (void)r_ls;");
    } else {
        bool layer = op == SG__OP_LAYER_NORM;
        sg__emit_line(k->e, "float r_s = 0.0f;");
        pass_open(k, fill, false);
        sg__emit_line(k->e, layer ? "r_s += r_x;" : "r_s += r_x * r_x;");
        pass_close(k);
        team_reduce(k, "r_s", false);
        if (layer) {
            sg__emit_line(k->e, "const float r_mean = r_s / %lld.0f;", (long long)k->len);
            sg__emit_line(k->e, "float r_q = 0.0f;");
            pass_open(k, false, false);
            sg__emit_line(k->e, "r_q += (r_x - r_mean) * (r_x - r_mean);");
            pass_close(k);
            team_reduce(k, "r_q", false);
            sg__emit_line(k->e, "const float r_var = r_q / %lld.0f;", (long long)k->len);
        } else {
            sg__emit_line(k->e, "const float r_var = r_s / %lld.0f;", (long long)k->len);
        }
        sg__emit_line(k->e,
                      "const float r_r = 1.0f / sqrtf((r_var > 0.0f ? r_var : 0.0f) + %.9ef);",
                      k->an->f[0]);
    }
    pass_open(k, false, true);
    row_write(k);
    pass_close(k);
}

/* Sum or mean, the epilogue over the reduced shape, then over the input's. */
static void emit_reduce(rowk *k) {
    const sg__group *grp = k->grp;
    int red_end = grp->bcast ? grp->bcast : grp->n;
    sg__emit_line(k->e, "float r_s = 0.0f;");
    k->per = 0; /* one pass: nothing to keep */
    pass_open(k, false, true);
    sg__emit_line(k->e, "r_s += r_x;");
    pass_close(k);
    team_reduce(k, "r_s", false);
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
        sg__emit_line(k->e, k->team > 32 ? "__syncthreads();" : "__syncwarp();");
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
    sg__emit_open(k->e, "for (sg_i64 r_c = r_lane; r_c < %lldLL; r_c += %d)", (long long)k->len,
                  k->team);
    walk_index(k);
    sg__cuda_members(k->g, grp, grp->bcast, grp->n, k->nd, k->shape, k->flat);
    sg__emit_close(k->e);
}

/* Team candidate (r_ob, r_oa) replaces (r_b, r_at): argmax's order. */
#define ARGMAX_BETTER                                                                              \
    "r_oa >= 0 && (r_at < 0 || (r_ob != r_ob ? (r_b == r_b || r_oa < r_at)"                        \
    " : (r_b == r_b && (r_ob > r_b || (r_ob == r_b && r_oa < r_at)))))"

/* Argmax over the row: each lane's first best, the team's, and lane 0 stores it. */
static void emit_argmax(rowk *k) {
    const sg__group *grp = k->grp;
    sg__emit_line(k->e, "float r_b = __uint_as_float(0xff800000u);");
    sg__emit_line(k->e, "sg_i64 r_at = -1;");
    /* One pass in chunks of u columns per lane: the chunk's loads (and
     * prologue) first, all in flight at once, then its compares in column
     * order -- a long row is a few memory latencies, not one per column. */
    int u = k->a > 0 ? 8 : 32;
    int64_t per = (k->len + k->team - 1) / k->team;
    u = per < u ? (int)per : u;
    sg__emit_open(k->e, "for (sg_i64 r_c0 = r_lane; r_c0 < %lldLL; r_c0 += %lld)",
                  (long long)k->len, (long long)u * k->team);
    sg__emit_line(k->e, "float r_xs[%d];", u);
    sg__emit_line(k->e, "#pragma unroll");
    sg__emit_open(k->e, "for (int r_u = 0; r_u < %d; r_u++)", u);
    sg__emit_line(k->e, "const sg_i64 r_c = r_c0 + (sg_i64)r_u * %d;", k->team);
    sg__emit_line(k->e, "float r_x = 0.0f;");
    sg__emit_open(k->e, "if (r_c < %lldLL)", (long long)k->len);
    row_input(k, true);
    sg__emit_close(k->e);
    sg__emit_line(k->e, "r_xs[r_u] = r_x;");
    sg__emit_close(k->e);
    sg__emit_line(k->e, "#pragma unroll");
    sg__emit_open(k->e, "for (int r_u = 0; r_u < %d; r_u++)", u);
    sg__emit_line(k->e, "const sg_i64 r_c = r_c0 + (sg_i64)r_u * %d;", k->team);
    sg__emit_line(k->e, "const float r_x = r_xs[r_u];");
    sg__emit_line(k->e,
                  "if (r_c < %lldLL && (r_at < 0 || r_x > r_b || (r_x != r_x && r_b == r_b))) "
                  "r_b = r_x, r_at = r_c;",
                  (long long)k->len);
    sg__emit_close(k->e);
    sg__emit_close(k->e);
    sg__emit_open(k->e, "for (int o = %d; o > 0; o >>= 1)", k->team > 32 ? 16 : k->team / 2);
    sg__emit_line(k->e, "const float r_ob = __shfl_xor_sync(0xffffffffu, r_b, o);");
    sg__emit_line(k->e, "const sg_i64 r_oa = __shfl_xor_sync(0xffffffffu, r_at, o);");
    sg__emit_line(k->e, "if (%s) r_b = r_ob, r_at = r_oa;", ARGMAX_BETTER);
    sg__emit_close(k->e);
    if (k->team > 32) {
        int r = k->nred;
        k->nred += 2;
        sg__emit_open(k->e, "%s", "");
        sg__emit_line(k->e, "__shared__ float r_red%d[%d];", r, k->team / 32);
        sg__emit_line(k->e, "__shared__ sg_i64 r_red%d[%d];", r + 1, k->team / 32);
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

/*
 * The rows of grp (k: its fields set by the caller) over the loop of rows
 * that starts at row block `blk` and steps over `nblk` blocks; fills the
 * rest of k.
 */
static void emit_rows(rowk *kp, const char *blk, const char *nblk) {
    rowk k = *kp;
    sg__cuda_gen *g = k.g;
    const sg__group *grp = k.grp;
    const sg__ir *ir = sg__cuda_ir(g);
    k.an = &ir->nodes[grp->g[k.a].node];
    k.x = sg__cuda_arg(g, k.an, 0);
    k.o = sg__cuda_ref(g, k.an->out);
    k.nd = k.x->ndim;
    k.shape = k.x->shape;
    k.team = k.len <= WARP_ROW ? 32 : BLOCK;
    int64_t per = (k.len + k.team - 1) / k.team;
    k.per = per <= REG_MAX ? (int)per : 0;
    /* The walk over the input's shape: prologue, the anchor's load and
     * store, the row epilogue (ROW) or the full epilogue (REDUCE). */
    int epi_from = grp->kind == SG__G_ROW ? k.a + 1 : grp->bcast ? grp->bcast : grp->n;
    bool loads = grp->g[k.a].arg_src[0] < 0;
    k.flat = sg__cuda_walk_flat(g, grp, 0, k.a, k.nd, k.shape, loads ? k.x : NULL) &&
             sg__cuda_walk_flat(g, grp, epi_from, grp->n, k.nd, k.shape,
                                grp->kind == SG__G_ROW && grp->g[k.a].store ? k.o : NULL);
    /* The same group with no member storing, for passes that only read. */
    sg__gnode quiet[64];
    sg__gnode *qg =
        grp->n <= 64 ? quiet : sg__alloc(sg__cuda_out(g)->ctx, sizeof *qg * (size_t)grp->n);
    if (!qg) {
        k.e->oom = true;
        *kp = k;
        return;
    }
    for (int m = 0; m < grp->n; m++) qg[m] = grp->g[m], qg[m].store = false;
    k.quiet = *grp;
    k.quiet.g = qg;

    int rpb = BLOCK / k.team;
    sg__emit_line(k.e, "const int r_lane = threadIdx.x %% %d;", k.team);
    sg__emit_open(k.e,
                  "for (sg_i64 r_row = (sg_i64)%s * %d + threadIdx.x / %d; r_row < %lldLL; "
                  "r_row += (sg_i64)%s * %d)",
                  blk, rpb, k.team, (long long)k.rows, nblk, rpb);
    if (k.per && grp->kind == SG__G_ROW) sg__emit_line(k.e, "float r_xr[%d];", k.per);
    if (grp->kind == SG__G_ROW)
        emit_row_op(&k);
    else if (k.an->op == SG__OP_ARGMAX)
        emit_argmax(&k);
    else
        emit_reduce(&k);
    /* The next row reuses the shared words. */
    if (k.team > 32 && k.nred) sg__emit_line(k.e, "__syncthreads();");
    sg__emit_close(k.e);
    if (qg != quiet) sg__free(k.e->ctx, qg, sizeof *qg * (size_t)grp->n);
    *kp = k;
}

const char *sg__cgen_cuda_rows(sg__cuda_gen *g, const sg__group *grp, sg__cuda_kinfo *ki) {
    rowk k = {.g = g,
              .e = sg__cuda_out(g),
              .grp = grp,
              .a = grp->anchor,
              .rows = grp->nrows,
              .len = grp->rowlen,
              .sink = -1};
    emit_rows(&k, "blockIdx.x", "gridDim.x");
    int rpb = BLOCK / k.team;
    int64_t blocks = (k.rows + rpb - 1) / rpb;
    ki->grid = (unsigned)(blocks < 1 ? 1 : blocks > 65535 * 16 ? 65535 * 16 : blocks);
    ki->iters = k.rows * k.len;
    ki->replaces_call = true;
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
              .sink = sink,
              .xs = xs};
    emit_rows(&k, "0", "1");
}
