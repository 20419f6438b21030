/* SPDX-License-Identifier: MIT */
/*
 * cgen_cuda.c -- the CUDA C dialect: one NVRTC unit per fused capture.
 * Each pointwise group, each MULTI group (its members' loops one after
 * another over consecutive ranges of blocks; members whose loops differ only
 * in where their operands lie and how long they are run one loop, their
 * slots, lengths and blocks from constant tables by the block's row) and
 * each epilogue after a library-run anchor becomes one extern "C" kernel
 * with constant shapes, strides and offsets, a grid-stride loop, and
 * 16-byte loads and stores when every access of the loop is contiguous and
 * aligned. A matmul of at
 * most 8 rows (16 where the weight's N is contiguous: a thread per column,
 * x read element by element, so x may be a transposed view) becomes one
 * GEMV kernel that also runs its bias and epilogue,
 * and, when fusion merged the layer_norm/rms_norm that makes its x, first
 * normalizes those rows into shared memory (every block, from L2); two
 * such matmuls on one x (a pair) become one kernel computing both products
 * per column, then their shared epilogue. A long K over too few blocks
 * is split over a group of warps per column, their sums added in shared
 * memory in a fixed order. Embedding, index_select, concat
 * and index_copy_ become one kernel each; a chain of small loops and data
 * ops runs in one block, in order, a barrier between them. Where the
 * dialect has no BLAS library (sg__cgen_gemm_wanted), any other matmul
 * group is the tiled GEMM of cgen_gemm.c, its epilogue fused.
 * Every kernel names its slots in its own numbering (first use first), so
 * that the kernels of a model's layers print the same text: each distinct
 * text is emitted once, and the groups that run it share its name.
 *
 * The math is cgen_c.c's, op for op: values are computed in f32 (ints in
 * 64 bits), f16 and bf16 round at every op through the same bit-exact
 * conversions, libdevice's precise functions (no fast-math intrinsics), so
 * fused, unfused and the CPU agree within the dtype's tolerance.
 *
 * The unit is self-contained: NVRTC runs with no include path, so the few
 * types and helpers it needs are written out in the preamble.
 */
#include "codegen.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#define BLOCK 256       /* threads per block unless max-autotune picks another */
#define MAX_BLOCK 512   /* the largest block max-autotune tries (launch bounds) */
#define GRID_CAP 2048   /* grid-stride loops: more blocks than this buy nothing */
#define MEMBER_CAP 1024 /* blocks per member of a MULTI kernel */
#define CHAIN_MAX 4096  /* elements per group of a one-block chain kernel */
#define GEMV_ROWS 8     /* the most rows a generated GEMV takes along K */
#define GEMV_ROWS_N 16  /* along N (a thread per column: a register a row) */
#define GEMV_SMEM 32768 /* bytes of normalized rows a GEMV keeps in shared memory */
#define GEMV_PREFETCH 16 /* 16-byte weight vectors a lane loads ahead (64 registers) */

/* ------------------------------------------------------------ types and values */

static const char *vtype(size_t bytes) {
    switch (bytes) {
    case 16: return "sg_v16";
    case 8: return "sg_v8";
    case 4: return "sg_u32";
    case 2: return "sg_u16";
    default: return "sg_u8";
    }
}

/* ------------------------------------------------------------ refs and loops */

typedef enum ixmode {
    IX_FLAT,   /* element i of a flat row-major walk */
    IX_NESTED, /* indices i0..i<nd-1> */
    IX_VEC     /* lane j of the 16-byte vectors loaded at vector q (flat), or
                  at the indices of a row walk (vec_row_ok) */
} ixmode;

typedef struct sg__cuda_gen {
    const sg__ir *ir;
    const sg__fused *f;
    sg__emit *e;
    sg__dialect d;       /* CUDA, HIP or OpenCL C */
    const sg__spell *sp; /* its spellings */
    bool anchor_reg; /* GEMV: the anchor's value is in register v<anchor> */
    bool stamps;     /* SG_CUDA_STAMPS, read once per unit: kernels stamp their times */
    /* A GEMV's epilogue operands loaded right after the wait (emit_gemv_epre):
     * argument j of member k of row `epre_row` is in ep<k>_<j>_<row> where
     * epre[k * 3 + j]; NULL: none. */
    const bool *epre;
    int epre_row;
    /* IX_VEC: the vectors loaded before the lane loop, by ref layout. */
    int nvec;
    const sg__ref *vec_ref[64];
    /* The kernel being emitted names IR slot s as s<loc[s]>: its own local
     * numbers in first-use order (locals[] maps them back), or, when
     * `global`, the IR's numbers. */
    int *loc;
    int locals[SG__CUDA_MAX_LOCAL];
    int nloc;
    bool global, overflow;
    /* The block index and count that data walks stride by (NULL: the grid's). */
    const char *walk_blk, *walk_nblk;
    /* A MULTI kernel's members load their own slot bases (emit_multi):
     * mark[n] is set for every s<n> named while it is non-NULL. */
    bool *mark;
    bool member_slots;
    /* A loop that several MULTI members share (share_text): each slot's
     * base is moved by bias[slot] bytes, which every offset into it gives
     * back (biased), and the loop runs over `len` elements, a C expression;
     * NULL: neither. */
    const int64_t *bias;
    const char *len;
    /* Bytes of the unit's tables in the constant bank so far (sg__cuda_table). */
    size_t ctable_bytes;
    /* Deferred stores (sg__cuda_defer_begin): declarations, statements, the
     * arrays' length, and the members whose values are kept. */
    sg__emit *defer_decl, *defer_st;
    int defer_n, ndefer;
    int deferred[64];
    /* The anchor op of the last group whose kernel the dialect cannot
     * write, else NULL (no group today: kept for a dialect that lacks one). */
    const char *unsupported;
    /* Declarations at the kernel's outermost scope (sg__cuda_shared where
     * the dialect says shared_top), and the team arrays declared there. */
    sg__emit *top;
    int ntree_f, ntree_i;
} gen;

/* The number under which the kernel being emitted names IR slot s (taken
 * on first use; past SG__CUDA_MAX_LOCAL the kernel is emitted again with
 * the IR's numbers). */
static int lslot(gen *g, int s) {
    if (g->global) g->loc[s] = s;
    if (g->loc[s] < 0) {
        if (g->nloc == SG__CUDA_MAX_LOCAL) {
            g->overflow = true;
            return 0;
        }
        g->locals[g->nloc] = s;
        g->loc[s] = g->nloc++;
    }
    if (g->mark) g->mark[g->loc[s]] = true;
    return g->loc[s];
}

static const sg__ref *ref_of(const gen *g, int r) { return sg__lower_ref(g->ir, g->f, r); }

static const sg__ref *arg_of(const gen *g, const sg__irnode *n, int j) {
    return sg__lower_arg(g->ir, g->f, n, j);
}

/* r as the loop being emitted addresses it: its offset less its slot's
 * bias (gen.bias, whole 16 bytes, so a multiple of any element). */
static const sg__ref *biased(const gen *g, const sg__ref *r, sg__ref *tmp) {
    if (!g->bias || g->bias[r->slot] <= 0) return r;
    *tmp = *r;
    tmp->offset -= g->bias[r->slot] / (int64_t)sg_dtype_size(r->dtype);
    return tmp;
}

/* Does gnode k's argument j come from a register? The anchor's value does
 * only when the kernel computed it (GEMV); the library writes it to memory. */
static int reg_src(const gen *g, const sg__group *grp, int k, int j) {
    return sg__lower_reg_src(grp, k, j, g->anchor_reg);
}

/* The element offset of ref r at the loop indices, as text. */
static void offset_expr(const sg__ref *r, int nd, const int64_t *shape, ixmode m, char *buf,
                        size_t size) {
    sg__lower_offset(r, nd, shape, m == IX_FLAT, buf, size);
}

/* Do refs a and b name the same elements in the same order? */
static bool same_layout(const sg__ref *a, const sg__ref *b) {
    if (a->slot != b->slot || a->offset != b->offset || a->dtype != b->dtype || a->ndim != b->ndim)
        return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d] || (a->shape[d] > 1 && a->stride[d] != b->stride[d]))
            return false;
    return true;
}

/* The vector that holds ref r's lanes in IX_VEC mode (added when new). */
static int vec_index(gen *g, const sg__ref *r) {
    for (int v = 0; v < g->nvec; v++)
        if (same_layout(g->vec_ref[v], r)) return v;
    if (g->nvec == 64) return -1;
    g->vec_ref[g->nvec] = r;
    return g->nvec++;
}

/* Store statement st of value v<k> (fl: float, else sg_i64): now, or
 * deferred (sg__cuda_defer_begin). */
static void store_stmt(gen *g, bool fl, int k, const char *st) {
    if (!g->defer_st) {
        sg__emit_line(g->e, "%s", st);
        return;
    }
    bool kept = false;
    for (int i = 0; i < g->ndefer; i++) kept = kept || g->deferred[i] == k;
    if (!kept && g->ndefer == 64) { /* out of room: store now (correct, only slower) */
        sg__emit_line(g->e, "%s", st);
        return;
    }
    const char *t = fl ? "float" : "sg_i64";
    if (!kept) {
        g->deferred[g->ndefer++] = k;
        sg__emit_line(g->defer_decl, "%s r_d%d[%d];", t, k, g->defer_n);
        sg__emit_line(g->e, "r_d%d[r_u] = v%d;", k, k);
    }
    sg__emit_line(g->defer_st, "{ const %s v%d = r_d%d[r_u]; %s }", t, k, k, st);
}

/* rt minus an outer sg_bf_rt( ... ) into inner; false when rt is not one call. */
static bool bf_rt_inner(const char *rt, char *inner, size_t size) {
    static const char pre[] = "sg_bf_rt(";
    size_t n = strlen(rt), np = sizeof pre - 1;
    if (n <= np || strncmp(rt, pre, np) || rt[n - 1] != ')') return false;
    int depth = 1;
    for (size_t i = np; i < n - 1; i++) {
        depth += (rt[i] == '(') - (rt[i] == ')');
        if (depth == 0) return false; /* the first call closes before the end */
    }
    if (n - np > size) return false;
    snprintf(inner, size, "%.*s", (int)(n - 1 - np), rt + np);
    return true;
}

/*
 * The members [from, n) of a group, one element: the body. In IX_VEC mode
 * with lanes 2 it computes lanes j and j + 1 of the vectors side by side
 * (values v<k>_0 and v<k>_1), and a member whose two values are rounded to
 * bf16 rounds them in one packed conversion (sg_bf_rt2): the same bits,
 * half the conversions, which bound a long bf16 chain.
 */
static void emit_body(gen *g, const sg__group *grp, int from, int nd, const int64_t *shape,
                      ixmode m, int lanes) {
    char off[256], lv[320], ld[400], rt[2][1200], in[2][1200], st[1400];
    const char *gp = g->sp->gp;
    sg__ref tmp;
    for (int k = from; k < grp->n; k++) {
        const sg__irnode *n = &g->ir->nodes[grp->g[k].node];
        const sg__ref *o = ref_of(g, n->out);
        const char *const sfx[2] = {lanes == 2 ? "_0" : "", "_1"};
        for (int h = 0; h < lanes; h++) {
            char args[3][40] = {"", "", ""};
            for (int j = 0; j < n->nin && j < 3; j++) {
                const sg__ref *a = arg_of(g, n, j);
                if (!a) continue;
                int src = reg_src(g, grp, k, j);
                if (src >= 0) {
                    snprintf(args[j], sizeof args[j], "v%d%s", src, sfx[h]);
                    continue;
                }
                if (g->epre && lanes == 1 && g->epre[k * 3 + j]) {
                    snprintf(args[j], sizeof args[j], "ep%d_%d_%d", k, j, g->epre_row);
                    continue;
                }
                if (m == IX_VEC && !sg__lower_is_scalar(a)) {
                    snprintf(lv, sizeof lv, h ? "l%d.e[j + 1]" : "l%d.e[j]", vec_index(g, a));
                } else {
                    offset_expr(biased(g, a, &tmp), nd, shape, m, off, sizeof off);
                    snprintf(lv, sizeof lv, "((%sconst %s *)s%d)[%s]", gp,
                             sg__lower_ctype(g->d, a->dtype), lslot(g, a->slot), off);
                }
                sg__lower_widen(g->d, a->dtype, lv, ld, sizeof ld);
                /* Loads go through a named temporary: some ops use an argument twice. */
                sg__emit_line(g->e, "const %s a%d_%d%s = %s;",
                              sg__lower_vtype(g->d, sg__lower_fdom(a->dtype)), k, j, sfx[h], ld);
                snprintf(args[j], sizeof args[j], "a%d_%d%s", k, j, sfx[h]);
            }
            const char *const av[3] = {args[0], args[1], args[2]};
            sg__lower_member(g->d, g->ir, g->f, n, av, rt[h], sizeof rt[h]);
        }
        const char *vt = sg__lower_vtype(g->d, sg__lower_fdom(o->dtype));
        if (lanes == 2 && bf_rt_inner(rt[0], in[0], sizeof in[0]) &&
            bf_rt_inner(rt[1], in[1], sizeof in[1])) {
            sg__emit_line(g->e, "float v%d_0, v%d_1; /* %s */", k, k, sg__op_name(n->op));
            sg__emit_line(g->e, "sg_bf_rt2(%s, %s, &v%d_0, &v%d_1);", in[0], in[1], k, k);
        } else {
            for (int h = 0; h < lanes; h++)
                sg__emit_line(g->e, "const %s v%d%s = %s; /* %s */", vt, k, sfx[h], rt[h],
                              sg__op_name(n->op));
        }
        if (!grp->g[k].store) continue;
        for (int h = 0; h < lanes; h++) {
            char v[32];
            snprintf(v, sizeof v, "v%d%s", k, sfx[h]);
            if (m == IX_VEC && !sg__lower_is_scalar(o)) {
                snprintf(lv, sizeof lv, h ? "o%d.e[j + 1]" : "o%d.e[j]", k);
            } else {
                offset_expr(biased(g, o, &tmp), nd, shape, m, off, sizeof off);
                snprintf(lv, sizeof lv, "((%s%s *)s%d)[%s]", gp, sg__lower_ctype(g->d, o->dtype),
                         lslot(g, o->slot), off);
            }
            sg__lower_narrow_store(g->d, o->dtype, lv, v, st, sizeof st);
            store_stmt(g, sg__lower_fdom(o->dtype), k, st); /* pairs: never deferred */
        }
    }
}

/* Is every ref a member touches flat-addressable over the shape? */
static bool group_flat(const gen *g, const sg__group *grp, int from, int nd, const int64_t *shape) {
    return sg__lower_group_flat(g->ir, g->f, grp, from, grp->n, nd, shape, g->anchor_reg);
}

static int64_t numel_of(int nd, const int64_t *shape) {
    int64_t n = 1;
    for (int d = 0; d < nd; d++) n *= shape[d];
    return n;
}

/* Ops whose libdevice code is long (argument reduction, polynomials). */
static bool is_heavy(sg__op op) {
    switch (op) {
    case SG__OP_EXP:
    case SG__OP_LOG:
    case SG__OP_SIN:
    case SG__OP_COS:
    case SG__OP_TANH:
    case SG__OP_SIGMOID:
    case SG__OP_GELU:
    case SG__OP_GELU_TANH:
    case SG__OP_GELU_TANH_BWD:
    case SG__OP_SILU:
    case SG__OP_POW:
    case SG__OP_POW_SCALAR: return true;
    default: return false;
    }
}

/* The loop's innermost dim longer than 1, or -1 when there is none. */
static int inner_dim(int nd, const int64_t *shape) {
    for (int d = nd - 1; d >= 0; d--)
        if (shape[d] > 1) return d;
    return -1;
}

/*
 * Can a loop that is not flat walk ref r in vectors of w elements along its
 * innermost dim `in`? r must be contiguous there (stride 1, not broadcast),
 * and its offset and every other stride it steps by must be multiples of
 * w, so that each vector starts on w elements (the base's 16 bytes are
 * checked at run time). A scalar ref is read as one value: always fine.
 */
static bool vec_row_ok(const sg__ref *r, int nd, const int64_t *shape, int in, int w) {
    if (sg__lower_is_scalar(r)) return true;
    if (r->ndim > nd || r->offset % w) return false;
    for (int d = 0; d < nd; d++) {
        int rd = d - (nd - r->ndim);
        bool steps = rd >= 0 && shape[d] > 1 && r->shape[rd] > 1 && r->stride[rd] != 0;
        if (d == in && (!steps || r->stride[rd] != 1)) return false;
        if (d != in && steps && r->stride[rd] % w) return false;
    }
    return true;
}

/* The loop shape in w-element vectors: its innermost dim divided by w. */
static void vec_row_shape(int nd, const int64_t *shape, int w, int64_t *vshape) {
    int in = inner_dim(nd, shape);
    for (int d = 0; d < nd; d++) vshape[d] = d == in ? shape[d] / w : shape[d];
}

/* r in units of w-element vectors for a row walk (vec_row_ok holds): its
 * offset and strides divided by w, the innermost stride 1; the loop shape
 * likewise (vec_row_shape). */
static void vec_row_units(const sg__ref *r, int nd, const int64_t *shape, int w, sg__ref *rv,
                          int64_t *vshape) {
    int in = inner_dim(nd, shape);
    vec_row_shape(nd, shape, w, vshape);
    *rv = *r;
    if (sg__lower_is_scalar(r)) return;
    rv->offset = r->offset / w;
    for (int d = 0; d < r->ndim; d++) {
        int ld = d + (nd - r->ndim);
        rv->stride[d] = ld == in ? 1 : r->stride[d] / w;
        if (ld == in) rv->shape[d] = vshape[in];
    }
}

/*
 * Elements per thread and iteration of the vector path: 16 bytes of the
 * widest dtype the loop reads or writes through memory, when every such
 * access is flat, the count divides and each offset keeps vectors aligned,
 * or, for a loop that is not flat (a permute copy), when every access is
 * contiguous along the innermost dim and vec_row_ok (emit_loop then walks
 * the vectors by their indices); 1 when there is no vector path.
 * *slots gets the slots whose bases the kernel checks for 16-byte
 * alignment at run time.
 */
static int vec_width(const gen *g, const sg__group *grp, int from, bool *slots) {
    int nd = grp->ndim;
    const int64_t *shape = grp->shape;
    bool flat = group_flat(g, grp, from, nd, shape);
    int in = inner_dim(nd, shape);
    if (!flat && in < 0) return 1;
    size_t widest = 0;
    const sg__ref *refs[64]; /* vec_index keeps at most 64 vectors */
    int nrefs = 0;
    for (int k = from; k < grp->n; k++) {
        const sg__irnode *n = &g->ir->nodes[grp->g[k].node];
        for (int j = -1; j < n->nin; j++) {
            const sg__ref *r =
                j < 0 ? (grp->g[k].store ? ref_of(g, n->out) : NULL) : arg_of(g, n, j);
            if (!r || (j >= 0 && reg_src(g, grp, k, j) >= 0) || sg__lower_is_scalar(r)) continue;
            if (nrefs == 64) return 1;
            refs[nrefs++] = r;
            if (sg_dtype_size(r->dtype) > widest) widest = sg_dtype_size(r->dtype);
        }
    }
    if (!widest) return 1;
    int w = (int)(16 / widest);
    if (w < 2) return 1;
    /* The vector path repeats the body w times: for a chain of
     * transcendentals the loop is bound by math, not by bytes, and w copies
     * of each inlined libdevice function only cost NVRTC time. */
    int heavy = 0;
    for (int k = from; k < grp->n; k++) heavy += is_heavy(g->ir->nodes[grp->g[k].node].op);
    if (heavy * w > 16) return 1;
    /* Long bodies take narrower vectors (8 bytes of bf16 still coalesce well). */
    while (w > 2 && (grp->n - from) * w > 64) w /= 2;
    /* The widest vectors whose count divides and whose accesses align. */
    for (; w >= 2; w /= 2) {
        bool ok = numel_of(nd, shape) % w == 0 && (flat || shape[in] % w == 0);
        for (int i = 0; i < nrefs && ok; i++)
            ok = flat ? refs[i]->offset % w == 0 : vec_row_ok(refs[i], nd, shape, in, w);
        if (ok) break;
    }
    if (w < 2) return 1;
    /* The alignment test names each slot once; keep it to one short line. */
    int nslots = 0;
    for (int i = 0; i < nrefs; i++) {
        bool seen = false;
        for (int j = 0; j < i; j++) seen = seen || refs[j]->slot == refs[i]->slot;
        nslots += !seen;
    }
    if (nslots > 24) return 1;
    for (int i = 0; i < nrefs; i++) slots[refs[i]->slot] = true;
    return w;
}

/* Declare i0..i<nd-1> from the flat index named var. Below 2^32 elements
 * the divisions by constants run in 32 bits (64-bit ones cost several
 * times more). */
static void emit_unflatten_from(gen *g, const char *var, int nd, const int64_t *shape) {
    int outer = -1;
    for (int d = 0; d < nd; d++)
        if (shape[d] > 1) {
            outer = d;
            break;
        }
    if (outer < 0) return;
    bool narrow = numel_of(nd, shape) <= (int64_t)UINT32_MAX;
    sg__emit_line(g->e, narrow ? "sg_u32 rem = (sg_u32)%s;" : "sg_i64 rem = %s;", var);
    for (int d = nd - 1; d >= outer; d--) {
        if (shape[d] == 1) continue;
        if (d == outer) {
            sg__emit_line(g->e, "const sg_i64 i%d = rem;", d);
        } else {
            sg__emit_line(g->e, "const sg_i64 i%d = rem %% %lld%s;", d, (long long)shape[d],
                          narrow ? "u" : "");
            sg__emit_line(g->e, "rem /= %lld%s;", (long long)shape[d], narrow ? "u" : "");
        }
    }
}

static void emit_unflatten(gen *g, int nd, const int64_t *shape) {
    emit_unflatten_from(g, "i", nd, shape);
}

/* The lvalue of ref r's vector in the vector loop: vector q when flat,
 * else the one at the row walk's indices i0..i<nd-1> (in vectors). */
static void vec_lvalue(gen *g, const sg__ref *r, bool flat, int w, int nd, const int64_t *shape,
                       const char *cv, char *buf, size_t size) {
    sg__ref tmp;
    r = biased(g, r, &tmp);
    size_t es = sg_dtype_size(r->dtype);
    const char *vt = vtype((size_t)w * es);
    if (flat) {
        snprintf(buf, size, "((%s%s%s *)(s%d + %lld))[q]", g->sp->gp, cv, vt, lslot(g, r->slot),
                 (long long)(r->offset * (int64_t)es));
        return;
    }
    sg__ref rv;
    int64_t vshape[SG_MAX_DIMS];
    char off[256];
    vec_row_units(r, nd, shape, w, &rv, vshape);
    sg__lower_offset(&rv, nd, vshape, false, off, sizeof off);
    snprintf(buf, size, "((%s%s%s *)s%d)[%s]", g->sp->gp, cv, vt, lslot(g, r->slot), off);
}

/*
 * The grid-stride loop of one group (members [from, n)) over blocks
 * blk .. blk + nblk - 1 (C expressions), with the vector path first when
 * w > 1 and the slots in `aligned` sit on 16 bytes; over gen.len elements
 * where that is set.
 */
static void emit_loop(gen *g, const sg__group *grp, int from, int w, const bool *aligned,
                      const char *blk, const char *nblk) {
    int nd = grp->ndim;
    const int64_t *shape = grp->shape;
    int64_t numel = numel_of(nd, shape);
    bool flat = group_flat(g, grp, from, nd, shape);
    sg__emit_line(g->e, "const sg_i64 tid = (sg_i64)(%s) * %s + %s;", blk, g->sp->bdim, g->sp->tid);
    sg__emit_line(g->e, "const sg_i64 step = (sg_i64)(%s) * %s;", nblk, g->sp->bdim);
    if (w > 1) {
        char cond[1024];
        size_t k = (size_t)snprintf(cond, sizeof cond, "(((sg_u64)0");
        /* In the kernel's own numbering order, so that equal kernels print equal text. */
        int n = g->global ? g->ir->nslots : g->nloc;
        for (int i = 0; i < n && k < sizeof cond; i++) {
            int s = g->global ? i : g->locals[i];
            if (aligned[s])
                k += (size_t)snprintf(cond + k, sizeof cond - k, " | (sg_u64)s%d", lslot(g, s));
        }
        snprintf(cond + k, sizeof cond - k, ") & 15) == 0");
        sg__emit_open(g->e, "if (%s)", cond);
        if (g->len)
            sg__emit_open(g->e, "for (sg_i64 q = tid; q < %s / %d; q += step)", g->len, w);
        else
            sg__emit_open(g->e, "for (sg_i64 q = tid; q < %lld; q += step)",
                          (long long)(numel / w));
        int64_t vshape[SG_MAX_DIMS];
        vec_row_shape(nd, shape, w, vshape);
        /* A row walk (not flat): the vector's indices, once per vector. */
        if (!flat) emit_unflatten_from(g, "q", nd, vshape);
        /* The body records which vectors it reads; emit it aside, then the loads. */
        sg__emit body = {.ctx = g->e->ctx, .depth = g->e->depth + 1};
        sg__emit *outer = g->e;
        g->e = &body;
        g->nvec = 0;
        /* Lanes in pairs (w is a power of two); deferred stores keep one lane a pass. */
        int lanes = g->defer_st ? 1 : 2;
        emit_body(g, grp, from, nd, shape, IX_VEC, lanes);
        g->e = outer;
        char lv[400];
        for (int v = 0; v < g->nvec; v++) {
            const sg__ref *r = g->vec_ref[v];
            size_t bytes = (size_t)w * sg_dtype_size(r->dtype);
            sg__emit_line(g->e, "union { %s v; %s e[%d]; } l%d;", vtype(bytes),
                          sg__lower_ctype(g->d, r->dtype), w, v);
            vec_lvalue(g, r, flat, w, nd, shape, "const ", lv, sizeof lv);
            sg__emit_line(g->e, "l%d.v = %s;", v, lv);
        }
        for (int k = from; k < grp->n; k++) {
            const sg__ref *o = ref_of(g, g->ir->nodes[grp->g[k].node].out);
            if (!grp->g[k].store || sg__lower_is_scalar(o)) continue;
            size_t bytes = (size_t)w * sg_dtype_size(o->dtype);
            sg__emit_line(g->e, "union { %s v; %s e[%d]; } o%d;", vtype(bytes),
                          sg__lower_ctype(g->d, o->dtype), w, k);
        }
        sg__emit_line(g->e, "#pragma unroll");
        sg__emit_open(g->e, "for (int j = 0; j < %d; j += %d)", w, lanes);
        if (body.buf) sg__emit_raw(g->e, "%s", body.buf);
        if (body.oom) g->e->oom = true;
        sg__emit_free(&body);
        sg__emit_close(g->e);
        for (int k = from; k < grp->n; k++) {
            const sg__ref *o = ref_of(g, g->ir->nodes[grp->g[k].node].out);
            if (!grp->g[k].store || sg__lower_is_scalar(o)) continue;
            vec_lvalue(g, o, flat, w, nd, shape, "", lv, sizeof lv);
            sg__emit_line(g->e, "%s = o%d.v;", lv, k);
        }
        sg__emit_close(g->e);
        sg__emit_line(g->e, "return;");
        sg__emit_close(g->e);
    }
    if (g->len)
        sg__emit_open(g->e, "for (sg_i64 i = tid; i < %s; i += step)", g->len);
    else
        sg__emit_open(g->e, "for (sg_i64 i = tid; i < %lld; i += step)", (long long)numel);
    if (!flat) emit_unflatten(g, nd, shape);
    emit_body(g, grp, from, nd, shape, flat ? IX_FLAT : IX_NESTED, 1);
    sg__emit_close(g->e);
}

/* ------------------------------------------------------------ GEMV */

/* A matmul the GEMV kernel takes: rows of x against weight element (n, k)
 * at woff + n * sn + k * sk, contiguous along K (warp per column) or
 * along N (thread per column). */
typedef struct gemv {
    const sg__ref *x, *w, *b, *o;
    int64_t rows, n, k;
    int64_t xoff[GEMV_ROWS_N];
    int64_t xs; /* along N: x's stride along K (a transposed x), else 1 */
    int64_t woff, sn, sk;
    bool along_k;
    bool norm; /* the group's norm_rows part fills x in shared memory (sg_xs) */
    int cols;  /* along K: output columns per warp */
    int ks;    /* along K: warps that share a column group, each a slice of K (split-K) */
    /* A pair (sg__group.anchor2): the second product's weight, at woff2
     * with the first's strides, and its output. */
    const sg__ref *w2, *o2;
    int64_t woff2;
    /* Segments (sg__group.nseg, along K, a column a warp): product j's
     * weight, bias and output; its columns are [c0[j], c0[j + 1]) of n. */
    int nseg;
    const sg__ref *sw[SG__GEMV_SEGS], *sb[SG__GEMV_SEGS], *so[SG__GEMV_SEGS];
    int64_t c0[SG__GEMV_SEGS + 1];
    int copies;    /* the first index_copy_ member (sg__group.ncopies), cend when none */
    int cend;      /* the end of the index_copy_ members: grp->n, or the argmax member */
    int am;        /* sg__group.argmax: an argmax over the result's rows, the last member */
    bool bias_reg; /* along K: the bias (a parameter the step does not write) of the
                      lane's column is loaded into b_pre before the wait */
} gemv;

/* Columns per warp of an along-K GEMV: enough 16-byte loads in flight per
 * lane (a K of 768 bf16 is 3 per lane with one column), while the grid
 * still covers the SMs (132 on an H100) with blocks of BLOCK threads. */
static int gemv_cols(const gemv *p) {
    int64_t per = (p->k * (int64_t)sg_dtype_size(p->x->dtype) / 16 + 31) / 32;
    int64_t wpb = BLOCK / 32, sms = 132;
    const char *env = getenv("SG_GEMV_COLS");
    if (env && (atoi(env) == 1 || atoi(env) == 2 || atoi(env) == 4)) return atoi(env);
    if (per <= 2 && p->n >= 4 * wpb * sms) return 4;
    if (per <= 4 && p->n >= 2 * wpb * sms) return 2;
    return 1;
}

/*
 * Warps per column group of an along-K GEMV (split-K): a long K (fcproj's
 * 3072 bf16 is 12 16-byte vectors a lane, one chain of 96 FMAs) over a
 * grid short of the SMs is cut into 2, 4 or 8 slices of K, one warp each,
 * while a lane keeps at least 3 vectors and the grid at most 4 blocks an
 * SM; the slices' sums meet in shared memory in slice order.
 */
static int gemv_split(const gemv *p) {
    int64_t per = (p->k * (int64_t)sg_dtype_size(p->x->dtype) / 16 + 31) / 32;
    int64_t wpb = BLOCK / 32, sms = 132, blocks = (p->n + wpb * p->cols - 1) / (wpb * p->cols);
    const char *env = getenv("SG_GEMV_SPLITK");
    if (env && (atoi(env) == 1 || atoi(env) == 2 || atoi(env) == 4 || atoi(env) == 8))
        return atoi(env);
    int ks = 1;
    while (2 * ks <= wpb && per / (2 * ks) >= 3 && blocks * 2 * ks <= 4 * sms) ks *= 2;
    return ks;
}

/*
 * The second product of a pair: a linear/matmul like the first (weight of
 * the same dtype, shape and strides, no bias) on the same x, along K, its
 * output rows x N contiguous; the epilogue may not write its weight.
 */
static bool gemv_pair_plan(const gen *g, const sg__group *grp, gemv *p) {
    const sg__irnode *n = &g->ir->nodes[grp->g[grp->anchor2].node];
    const sg__ref *w = arg_of(g, n, 1), *o = ref_of(g, n->out);
    if (grp->anchor2 != grp->anchor + 1 || !p->along_k || !w || w->ndim != 2 ||
        w->dtype != p->w->dtype || o->dtype != p->o->dtype ||
        (n->op == SG__OP_LINEAR && n->nin > 2 && arg_of(g, n, 2)))
        return false;
    for (int d = 0; d < 2; d++)
        if (w->shape[d] != p->w->shape[d] || (w->shape[d] > 1 && w->stride[d] != p->w->stride[d]))
            return false;
    if (numel_of(o->ndim, o->shape) != p->rows * p->n || !sg__lower_flat_ok(o, o->ndim, o->shape))
        return false;
    for (int k = grp->anchor2 + 1; k < grp->n; k++)
        if (grp->g[k].store && ref_of(g, g->ir->nodes[grp->g[k].node].out)->slot == w->slot)
            return false;
    p->w2 = w;
    p->o2 = o;
    p->woff2 = w->offset;
    return true;
}

/*
 * Segments: each product a linear like the anchor's on the same x (weight
 * (N_j, K) contiguous along K, of x's dtype, its own bias and output of
 * rows x N_j contiguous); nothing else in the group. n becomes their sum.
 */
static bool gemv_segs_plan(const gen *g, const sg__group *grp, gemv *p) {
    if (!p->along_k || grp->anchor2 || grp->ncopies || grp->argmax || grp->post ||
        grp->seg[0] != grp->anchor || grp->seg[grp->nseg - 1] != grp->n - 1)
        return false;
    p->nseg = grp->nseg;
    p->c0[0] = 0;
    for (int j = 0; j < grp->nseg; j++) {
        const sg__irnode *n = &g->ir->nodes[grp->g[grp->seg[j]].node];
        const sg__ref *w = arg_of(g, n, 1), *o = ref_of(g, n->out);
        const sg__ref *b = n->nin > 2 ? arg_of(g, n, 2) : NULL;
        if (n->op != SG__OP_LINEAR || !w || w->ndim != 2 || w->dtype != p->x->dtype ||
            o->dtype != p->x->dtype || (b && b->dtype != p->x->dtype) || w->shape[1] != p->k ||
            (p->k > 1 && w->stride[1] != 1) || w->shape[0] < 1)
            return false;
        int64_t nj = w->shape[0];
        if (numel_of(o->ndim, o->shape) != p->rows * nj || !sg__lower_flat_ok(o, o->ndim, o->shape))
            return false;
        for (int q = 0; q < j; q++) /* a product may not overwrite another's operands */
            if (p->so[q]->slot == w->slot || (b && p->so[q]->slot == b->slot)) return false;
        p->sw[j] = w, p->sb[j] = b, p->so[j] = o;
        p->c0[j + 1] = p->c0[j] + nj;
    }
    p->n = p->c0[grp->nseg];
    return true;
}

/* src's dims of more than one element, by stride from the largest; their
 * count, 0 when a stride is not positive or the dims overlap (an element
 * offset then has at most one set of indices, found by dividing). */
static int copy_dims(const sg__ref *src, int *ord) {
    int nd = 0;
    for (int d = 0; d < src->ndim; d++) {
        if (src->shape[d] == 1) continue;
        if (src->stride[d] < 1) return 0;
        int j = nd++;
        for (; j > 0 && src->stride[ord[j - 1]] < src->stride[d]; j--) ord[j] = ord[j - 1];
        ord[j] = d;
    }
    for (int j = 0; j + 1 < nd; j++)
        if (src->stride[ord[j]] < src->stride[ord[j + 1]] * src->shape[ord[j + 1]]) return 0;
    return nd;
}

/*
 * Member k of a GEMV group, an index_copy_ that fusion merged: one index
 * (src one element long along dim), src a view of the result o of o's
 * dtype whose elements lie within the rows x N of o (each written by the
 * thread holding it), dst of the same dtype and rank, not read by the GEMV.
 */
static bool gemv_copy_ok(const gen *g, const gemv *p, const sg__group *grp, int k) {
    const sg__irnode *n = &g->ir->nodes[grp->g[k].node];
    if (n->op != SG__OP_INDEX_COPY || n->nin < 3) return false;
    const sg__ref *d = ref_of(g, n->out), *idx = arg_of(g, n, 1), *src = arg_of(g, n, 2);
    int dim = (int)n->i[0], ord[SG_MAX_DIMS];
    if (!idx || !src || src->slot != p->o->slot || src->dtype != p->o->dtype ||
        d->dtype != src->dtype || d->ndim != src->ndim || dim < 0 || dim >= d->ndim ||
        src->shape[dim] != 1 || numel_of(idx->ndim, idx->shape) != 1 ||
        sg_dtype_size(idx->dtype) < 4 || sg__lower_fdom(idx->dtype))
        return false;
    if (d->slot == p->o->slot || d->slot == p->x->slot || d->slot == p->w->slot ||
        (p->b && d->slot == p->b->slot) || idx->slot == d->slot)
        return false;
    int nd = copy_dims(src, ord);
    if (nd == 0 && numel_of(src->ndim, src->shape) > 1) return false;
    int64_t hi = src->offset;
    for (int j = 0; j < nd; j++) hi += (src->shape[ord[j]] - 1) * src->stride[ord[j]];
    return src->offset >= p->o->offset && hi < p->o->offset + p->rows * p->n;
}

/* The index_copy_ members at the group's end: each checked, and no member
 * before them writes the result's slot (the copies take the anchor's value). */
static bool gemv_copies_plan(const gen *g, const sg__group *grp, gemv *p) {
    p->cend = grp->argmax ? grp->argmax : grp->n;
    p->copies = p->cend - grp->ncopies;
    for (int k = p->copies; k < p->cend; k++)
        if (!gemv_copy_ok(g, p, grp, k)) return false;
    for (int k = grp->anchor + 1; k < p->copies && grp->ncopies; k++)
        if (k != grp->anchor2 && ref_of(g, g->ir->nodes[grp->g[k].node].out)->slot == p->o->slot)
            return false;
    return true;
}

/*
 * Member am of a GEMV group, an argmax that fusion merged (the last): over
 * the rows of exactly the result (its reduced dims a suffix of the
 * result's of N elements), its i64 output one element a row; along K
 * only (every thread of the grid reaches its block-wide combine).
 */
static bool gemv_argmax_ok(const gen *g, const gemv *p, const sg__group *grp) {
    int am = grp->argmax;
    const sg__irnode *n = &g->ir->nodes[grp->g[am].node];
    const sg__ref *x = arg_of(g, n, 0), *o = ref_of(g, n->out);
    if (am != (grp->post ? grp->post : grp->n) - 1 || grp->ncopies || grp->anchor2 || !p->along_k ||
        n->op != SG__OP_ARGMAX || !x || x->slot != p->o->slot || x->offset != p->o->offset ||
        x->dtype != p->o->dtype || !sg__lower_flat_ok(x, x->ndim, x->shape) ||
        numel_of(o->ndim, o->shape) != p->rows || sg_dtype_size(o->dtype) != 8)
        return false;
    int64_t len = 1;
    int d = x->ndim - 1;
    for (; d >= 0 && (n->mask & (1u << d)); d--) len *= x->shape[d];
    for (int e = d; e >= 0; e--)
        if (n->mask & (1u << e)) return false;
    return len == p->n && numel_of(x->ndim, x->shape) == p->rows * p->n;
}

static bool gemv_plan(const gen *g, const sg__group *grp, gemv *p) {
    if (grp->kind != SG__G_MATMUL || grp->anchor < 0) return false;
    const sg__irnode *n = &g->ir->nodes[grp->g[grp->anchor].node];
    memset(p, 0, sizeof *p);
    p->x = arg_of(g, n, 0);
    p->w = arg_of(g, n, 1);
    p->b = n->op == SG__OP_LINEAR && n->nin > 2 ? arg_of(g, n, 2) : NULL;
    p->o = ref_of(g, n->out);
    const sg__ref *x = p->x, *w = p->w, *o = p->o;
    if (!x || !w || !sg__lower_fdom(x->dtype) || x->ndim < 1 || w->ndim != 2) return false;
    if (w->dtype != x->dtype || o->dtype != x->dtype || (p->b && p->b->dtype != x->dtype))
        return false;
    p->k = x->shape[x->ndim - 1];
    if (n->op == SG__OP_LINEAR) { /* w is (N, K) */
        p->n = w->shape[0], p->sn = w->stride[0], p->sk = w->stride[1];
    } else if (n->op == SG__OP_MATMUL) { /* b is (K, N) */
        p->n = w->shape[1], p->sn = w->stride[1], p->sk = w->stride[0];
    } else {
        return false;
    }
    p->woff = w->offset;
    if (p->k < 1 || p->n < 1) return false;
    if (p->k == 1) p->sk = 1;
    if (p->n == 1) p->sn = 1;
    p->along_k = p->sk == 1;
    if (!p->along_k && p->sn != 1) return false;
    p->norm = grp->norm_rows;
    /* Along K a lane loads x in vectors; along N each thread reads x's
     * elements one by one, so x may be a transposed view there (a weight
     * gradient's dY^T: W4's 10 x 128 against 128 x 1024). */
    p->xs = p->norm || p->k == 1 ? 1 : x->stride[x->ndim - 1];
    if (p->xs != 1 && (p->along_k || p->xs < 1)) return false;
    /* Every leading index of x is a row; each row's offset is a constant. */
    int64_t rows = 1;
    for (int d = 0; d < x->ndim - 1; d++) rows *= x->shape[d];
    if (rows < 1 || rows > (p->along_k ? GEMV_ROWS : GEMV_ROWS_N)) return false;
    /* Past GEMV_ROWS (along N) only where the columns give the grid 16
     * blocks and each thread's slice of K is short: else the tiled kernels
     * or the library do better. */
    if (rows > GEMV_ROWS && (p->n < 16 * 32 || p->k > 1024)) return false;
    p->rows = rows;
    /* Normalized rows live in shared memory, row r at r * K. */
    if (p->norm && (rows != grp->nrows || p->k != grp->rowlen ||
                    rows * p->k * (int64_t)sg_dtype_size(x->dtype) > GEMV_SMEM))
        return false;
    for (int64_t r = 0; r < rows; r++) {
        int64_t rem = r, off = x->offset;
        for (int d = x->ndim - 2; d >= 0; d--) {
            off += rem % x->shape[d] * x->stride[d];
            rem /= x->shape[d];
        }
        p->xoff[r] = p->norm ? r * p->k : off;
    }
    /* The output: rows x N, contiguous, and the epilogue runs over it. */
    if (numel_of(o->ndim, o->shape) != rows * p->n || !sg__lower_flat_ok(o, o->ndim, o->shape))
        return false;
    if (numel_of(grp->ndim, grp->shape) != rows * p->n) return false;
    /* The epilogue of one column runs while other warps still read x, w and
     * b: it may not write into them (an in-place update after the matmul). */
    for (int k = grp->anchor + 1; k < grp->n; k++) {
        int slot = ref_of(g, g->ir->nodes[grp->g[k].node].out)->slot;
        if (grp->g[k].store && (slot == x->slot || slot == w->slot || (p->b && slot == p->b->slot)))
            return false;
    }
    if (grp->anchor2 && !gemv_pair_plan(g, grp, p)) return false;
    if (grp->nseg && !gemv_segs_plan(g, grp, p)) return false;
    if (!gemv_copies_plan(g, grp, p)) return false;
    if (p->b && p->along_k && !p->nseg) {
        const sg__slot *bs = &g->ir->slots[p->b->slot];
        p->bias_reg = bs->kind == SG__SLOT_PARAM && bs->mutated_by < 0;
    }
    p->cols = p->along_k && !p->nseg ? gemv_cols(p) : 1;
    if (p->w2 && p->cols > 1) p->cols /= 2; /* each column is two weights' */
    /* Split K's and the argmax's shared words are spelled for CUDA/HIP only. */
    p->ks = p->along_k && g->sp->shuffles ? gemv_split(p) : 1;
    p->am = grp->argmax;
    if (grp->post && (!p->am || numel_of(grp->post_ndim, grp->post_shape) > 64)) return false;
    return !p->am || gemv_argmax_ok(g, p, grp);
}

/* Member a's value v<a> = expr (a product at element i) and its store into o. */
static void emit_gemv_result(gen *g, const sg__group *grp, int a, const sg__ref *o,
                             const char *expr) {
    char lv[200], st[1100], v[16];
    sg__emit_line(g->e, "const float v%d = %s; /* %s */", a, expr,
                  sg__op_name(g->ir->nodes[grp->g[a].node].op));
    snprintf(lv, sizeof lv, "((%s%s *)s%d)[%lld + i]", g->sp->gp, sg__lower_ctype(g->d, o->dtype),
             lslot(g, o->slot), (long long)o->offset);
    snprintf(v, sizeof v, "v%d", a);
    sg__lower_narrow_store(g->d, o->dtype, lv, v, st, sizeof st);
    sg__emit_line(g->e, "%s", st);
}

/*
 * Copy member k (gemv_copy_ok): element i of the result o, held in v<a>,
 * goes to dst at src's indices of it with idx's value along dim, when i
 * is in src (its offset from src's divides into src's indices).
 */
static void emit_gemv_copy(gen *g, const gemv *p, const sg__group *grp, int k, int a) {
    const sg__irnode *n = &g->ir->nodes[grp->g[k].node];
    const sg__ref *d = ref_of(g, n->out), *idx = arg_of(g, n, 1), *src = arg_of(g, n, 2);
    int dim = (int)n->i[0], ord[SG_MAX_DIMS], nd = copy_dims(src, ord);
    int64_t span = 1;
    if (nd) span = src->stride[ord[0]] * src->shape[ord[0]];
    char dof[400], cond[400], lv[460], st[1000], v[16];
    sg__emit_open(g->e, "%s", "");
    sg__emit_line(g->e, "sg_i64 c_rel = i + %lld;", (long long)(p->o->offset - src->offset));
    sg__emit_open(g->e, "if (c_rel >= 0 && c_rel < %lld)", (long long)span);
    size_t q = (size_t)snprintf(dof, sizeof dof, "%lld", (long long)d->offset);
    size_t c = (size_t)snprintf(cond, sizeof cond, "c_rel == 0");
    for (int j = 0; j < nd; j++) {
        int dd = ord[j];
        sg__emit_line(g->e, "const sg_i64 c%d = c_rel / %lld;", dd, (long long)src->stride[dd]);
        sg__emit_line(g->e, "c_rel -= c%d * %lld;", dd, (long long)src->stride[dd]);
        c += (size_t)snprintf(cond + c, c < sizeof cond ? sizeof cond - c : 0, " && c%d < %lld", dd,
                              (long long)src->shape[dd]);
        q += (size_t)snprintf(dof + q, q < sizeof dof ? sizeof dof - q : 0, " + c%d * %lld", dd,
                              (long long)d->stride[dd]);
    }
    sg__emit_line(g->e, "const sg_i64 at = (sg_i64)((%sconst %s *)s%d)[%lld];", g->sp->gp,
                  sg__lower_ctype(g->d, idx->dtype), lslot(g, idx->slot), (long long)idx->offset);
    sg__emit_open(g->e, "if (%s && at >= 0 && at < %lld)", cond, (long long)d->shape[dim]);
    snprintf(lv, sizeof lv, "((%s%s *)s%d)[%s + at * %lld]", g->sp->gp,
             sg__lower_ctype(g->d, d->dtype), lslot(g, d->slot), dof, (long long)d->stride[dim]);
    snprintf(v, sizeof v, "v%d", a);
    sg__lower_narrow_store(g->d, d->dtype, lv, v, st, sizeof st);
    sg__emit_line(g->e, "%s", st);
    sg__emit_close(g->e);
    sg__emit_close(g->e);
    sg__emit_close(g->e);
}

/* The branch of segment j of column `col` (an if / else-if ladder over the
 * segments' first columns; the last is the else). */
static void open_segment(gen *g, const gemv *p, int j, const char *col) {
    if (j + 1 < p->nseg)
        sg__emit_open(g->e, "%sif (%s < %lld)", j ? "else " : "", col, (long long)p->c0[j + 1]);
    else
        sg__emit_open(g->e, "else");
}

/* The anchor's value at (row r, column n) from acc<r>, its store, and the
 * epilogue: one output element, on the thread that holds the sum (a pair's
 * second product from accp<r> after it), then the copies of the result. */
static void emit_gemv_tail(gen *g, const sg__group *grp, const gemv *p, int r) {
    char ld[320], rt[900], lv[200], e[420];
    int a = grp->anchor;
    for (int j = 0; j < p->nseg; j++) { /* column n of segment j: its output, row r */
        open_segment(g, p, j, "n");
        int64_t nj = p->c0[j + 1] - p->c0[j];
        sg__emit_line(g->e, "const sg_i64 i = %lld + (n - %lld);", (long long)(r * nj),
                      (long long)p->c0[j]);
        const sg__ref *b = p->sb[j];
        if (b) {
            snprintf(lv, sizeof lv, "((%sconst %s *)s%d)[%lld + (n - %lld) * %lld]", g->sp->gp,
                     sg__lower_ctype(g->d, b->dtype), lslot(g, b->slot), (long long)b->offset,
                     (long long)p->c0[j], (long long)b->stride[0]);
            sg__lower_widen(g->d, b->dtype, lv, ld, sizeof ld);
            snprintf(e, sizeof e, "(%s + acc%d)", ld, r);
        } else {
            snprintf(e, sizeof e, "acc%d", r);
        }
        sg__lower_round_trip(g->d, e, true, p->so[j]->dtype, rt, sizeof rt);
        emit_gemv_result(g, grp, grp->seg[j], p->so[j], rt);
        sg__emit_close(g->e);
    }
    if (p->nseg) return;
    sg__emit_open(g->e, "%s", "");
    sg__emit_line(g->e, "const sg_i64 i = %lld + n;", (long long)(r * p->n));
    if (p->bias_reg) {
        snprintf(e, sizeof e, "(b_pre + acc%d)", r);
    } else if (p->b) {
        snprintf(lv, sizeof lv, "((%sconst %s *)s%d)[%lld + n * %lld]", g->sp->gp,
                 sg__lower_ctype(g->d, p->b->dtype), lslot(g, p->b->slot), (long long)p->b->offset,
                 (long long)p->b->stride[0]);
        sg__lower_widen(g->d, p->b->dtype, lv, ld, sizeof ld);
        snprintf(e, sizeof e, "(%s + acc%d)", ld, r);
    } else {
        snprintf(e, sizeof e, "acc%d", r);
    }
    sg__lower_round_trip(g->d, e, true, p->o->dtype, rt, sizeof rt);
    emit_gemv_result(g, grp, a, p->o, rt);
    if (p->am) sg__emit_line(g->e, "am_b%d = v%d, am_at%d = n;", r, a, r);
    if (p->w2) {
        snprintf(e, sizeof e, "accp%d", r);
        sg__lower_round_trip(g->d, e, true, p->o2->dtype, rt, sizeof rt);
        emit_gemv_result(g, grp, a = grp->anchor2, p->o2, rt);
    }
    sg__group epi = *grp;
    epi.n = p->copies;
    if (a + 1 < epi.n) {
        bool flat = group_flat(g, &epi, a + 1, grp->ndim, grp->shape);
        if (!flat) emit_unflatten(g, grp->ndim, grp->shape);
        g->epre_row = r;
        emit_body(g, &epi, a + 1, grp->ndim, grp->shape, flat ? IX_FLAT : IX_NESTED, 1);
    }
    for (int k = p->copies; k < p->cend; k++) emit_gemv_copy(g, p, grp, k, grp->anchor);
    sg__emit_close(g->e);
}

/*
 * Right after sg_pdl_wait, before the products: each epilogue operand of
 * an along-K GEMV that the tail would read from memory at its element (a
 * residual, a gate), loaded by the lane that stores that column, so that
 * its L2 trip overlaps the x row's and the sums instead of following them
 * (g->epre, which emit_body reads). Taken for float operands of a flat
 * epilogue whose slot no member of the group writes (or is the result of);
 * not with segments.
 * Returns the table, which the caller frees after the tail, or NULL.
 */
static bool *emit_gemv_epre(gen *g, const sg__group *grp, const gemv *p, int cols) {
    int a = p->w2 ? grp->anchor2 : grp->anchor;
    if (p->nseg || !g->sp->shuffles || a + 1 >= p->copies) return NULL;
    sg__group epi = *grp;
    epi.n = p->copies;
    if (!group_flat(g, &epi, a + 1, grp->ndim, grp->shape)) return NULL;
    bool *pre = sg__calloc(g->e->ctx, sizeof(bool) * 3 * (size_t)grp->n);
    if (!pre) {
        g->e->oom = true;
        return NULL;
    }
    bool any = false;
    char off[256], lv[320], ld[400];
    sg__ref tmp;
    for (int k = a + 1; k < p->copies; k++) {
        const sg__irnode *n = &g->ir->nodes[grp->g[k].node];
        for (int j = 0; j < n->nin && j < 3; j++) {
            const sg__ref *r = arg_of(g, n, j);
            if (!r || reg_src(g, grp, k, j) >= 0 || sg__lower_is_scalar(r) ||
                !sg__lower_fdom(r->dtype))
                continue;
            bool written = false;
            for (int m = 0; m < grp->n && !written; m++) /* stored, or copied into */
                written = ref_of(g, g->ir->nodes[grp->g[m].node].out)->slot == r->slot;
            if (written) continue;
            pre[k * 3 + j] = any = true;
            offset_expr(biased(g, r, &tmp), grp->ndim, grp->shape, IX_FLAT, off, sizeof off);
            snprintf(lv, sizeof lv, "((%sconst %s *)s%d)[%s]", g->sp->gp,
                     sg__lower_ctype(g->d, r->dtype), lslot(g, r->slot), off);
            sg__lower_widen(g->d, r->dtype, lv, ld, sizeof ld);
            for (int64_t row = 0; row < p->rows; row++) {
                sg__emit_line(g->e, "float ep%d_%d_%lld = 0.0f;", k, j, (long long)row);
                sg__emit_open(g->e, "if (kw == 0 && lane < %d && nb + lane < %lld)", cols,
                              (long long)p->n);
                sg__emit_line(g->e, "const sg_i64 i = %lld + nb + lane;", (long long)(row * p->n));
                sg__emit_line(g->e, "ep%d_%d_%lld = %s;", k, j, (long long)row, ld);
                sg__emit_close(g->e);
            }
        }
    }
    if (!any) {
        sg__free(g->e->ctx, pre, sizeof(bool) * 3 * (size_t)grp->n);
        return NULL;
    }
    return pre;
}

/*
 * Before sg_pdl_wait: every parameter the group reads from memory besides
 * the weights a lane loads ahead (the bias, the norm's scale and shift),
 * a few KB each, goes to L2 by the block's threads, so that reading it
 * after the wait costs an L2 hit, not a trip to memory on the kernel's
 * path (the weights streamed by the step's other kernels evict them).
 */
static void emit_gemv_l2(gen *g, const sg__group *grp, const gemv *p, bool wregs) {
    int seen[16], ns = 0;
    for (int k = 0; k < p->copies; k++) {
        const sg__irnode *n = &g->ir->nodes[grp->g[k].node];
        for (int j = 0; j < n->nin; j++) {
            const sg__ref *r = arg_of(g, n, j);
            if (!r || reg_src(g, grp, k, j) >= 0 || r->ndim < 1) continue;
            const sg__slot *sl = &g->ir->slots[r->slot];
            if (sl->kind != SG__SLOT_PARAM || sl->mutated_by >= 0) continue;
            if ((wregs && (r == p->w || r == p->w2)) || (p->bias_reg && r == p->b)) continue;
            int64_t span = 1;
            for (int d = 0; d < r->ndim; d++) {
                if (r->stride[d] < 0) span = -1;
                if (span > 0) span += (r->shape[d] - 1) * r->stride[d];
            }
            int64_t bytes = span * (int64_t)sg_dtype_size(r->dtype);
            bool dup = false;
            for (int q = 0; q < ns; q++) dup = dup || seen[q] == r->slot;
            if (span < 1 || bytes > 16384 || dup || ns == 16) continue;
            seen[ns++] = r->slot;
            sg__emit_open(g->e, "%s", "");
            sg__emit_line(g->e, "const sg_u64 pf = (sg_u64)(s%d + %lld);", lslot(g, r->slot),
                          (long long)(r->offset * (int64_t)sg_dtype_size(r->dtype)));
            sg__emit_raw(g->e, "#if defined(__CUDA_ARCH__) /* PTX: not under hiprtc */\n");
            sg__emit_line(
                g->e,
                "for (sg_u64 q = (pf & ~127ull) + threadIdx.x * 128ull; q < pf + %lldull; "
                "q += blockDim.x * 128ull)",
                (long long)bytes);
            sg__emit_line(g->e, "    asm volatile(\"prefetch.global.L2 [%%0];\" ::\"l\"(q));");
            sg__emit_raw(g->e, "#else\n");
            sg__emit_line(g->e, "(void)pf;");
            sg__emit_raw(g->e, "#endif\n");
            sg__emit_close(g->e);
        }
    }
}

/* acc<r> += x[r][kexpr] * wf for every row. */
static void emit_gemv_fma(gen *g, const gemv *p, const char *xlane) {
    char lv[160], ld[240];
    for (int r = 0; r < p->rows; r++) {
        snprintf(lv, sizeof lv, xlane, r);
        sg__lower_widen(g->d, p->x->dtype, lv, ld, sizeof ld);
        sg__emit_line(g->e, "acc%d += %s * wf;", r, ld);
    }
}

/*
 * A norm_rows group's rows into sg_xs, by every block (the rows are a few KB,
 * read from L2), then the block's barrier; a warp whose columns lie past N
 * leaves only after it. Nothing for a plain GEMV.
 */
static void emit_gemv_norm(gen *g, const sg__group *grp, const gemv *p) {
    if (!p->norm) return;
    sg__group part = *grp;
    part.kind = grp->row_bcast ? SG__G_REDUCE : SG__G_ROW;
    part.n = grp->anchor;
    part.anchor = grp->row_anchor;
    part.norm_rows = false;
    if (grp->row_bcast) { /* a REDUCE's epilogue over the reduced shape, then over x */
        part.bcast = grp->row_bcast;
        part.ndim = grp->row_ndim;
        memcpy(part.shape, grp->row_shape, sizeof part.shape);
    }
    sg__emit_open(g->e, "%s", "");
    sg__cgen_cuda_rows_into(g, &part, grp->g[grp->anchor].arg_src[0], "sg_xs");
    sg__emit_close(g->e);
    sg__emit_line(g->e, "%s", g->sp->sync);
    if (g->stamps) sg__emit_line(g->e, "sg_stamp_.mark(0);");
    /* Without shuffles every warp stays for the sums' barriers (its columns
     * past N read column N - 1, and nothing is stored); so does every warp
     * of a split K's group or of an argmax's. */
    if (p->along_k && g->sp->shuffles && p->ks == 1 && !p->am)
        sg__emit_line(g->e, "if (nb >= %lld) return;", (long long)p->n);
}

/* acc<r>_<c> += x<r> * w<c> for every row and column (wlane, xlane: printf
 * patterns of the column's and the row's element). */
static void emit_gemv_cols_fma(gen *g, const gemv *p, int cols, const char *wlane,
                               const char *xlane) {
    char lv[160], ld[240];
    for (int c = 0; c < cols; c++) {
        snprintf(lv, sizeof lv, wlane, c);
        sg__lower_widen(g->d, p->w->dtype, lv, ld, sizeof ld);
        sg__emit_line(g->e, "const float wf%d = %s;", c, ld);
    }
    for (int r = 0; r < p->rows; r++) {
        snprintf(lv, sizeof lv, xlane, r);
        sg__lower_widen(g->d, p->x->dtype, lv, ld, sizeof ld);
        sg__emit_line(g->e, "const float xf%d = %s;", r, ld);
        for (int c = 0; c < cols; c++) sg__emit_line(g->e, "acc%d_%d += xf%d * wf%d;", r, c, r, c);
    }
}

/* Step u of an along-K GEMV's vector loop: the prefetched vector u of each
 * column (u < npf), or the loop over the rest of K (u == npf). */
static void emit_gemv_vectors(gen *g, const gemv *p, int cols, int u, int npf, int64_t kv) {
    const char *t = sg__lower_ctype(g->d, p->x->dtype);
    int v = 16 / (int)sg_dtype_size(p->x->dtype), st = 32 * p->ks;
    if (u < npf) {
        sg__emit_open(g->e, "if (kl + %d < %lld)", st * u, (long long)kv);
        sg__emit_line(g->e, "const sg_i64 q = kl + %d;", st * u);
    } else {
        sg__emit_line(g->e, "#pragma unroll %d", cols > 1 ? 2 : 4);
        sg__emit_open(g->e, "for (sg_i64 q = kl + %d; q < %lld; q += %d)", st * npf, (long long)kv,
                      st);
    }
    for (int c = 0; c < cols; c++) {
        sg__emit_line(g->e, "union { sg_v16 v; %s e[%d]; } wv%d;", t, v, c);
        if (u < npf)
            sg__emit_line(g->e, "wv%d.v = wp[%d][%d];", c, u, c);
        else
            sg__emit_line(g->e, "wv%d.v = ((%sconst sg_v16 *)wr%d)[q];", c, g->sp->gp, c);
    }
    for (int r = 0; r < p->rows; r++) {
        sg__emit_line(g->e, "union { sg_v16 v; %s e[%d]; } xv%d;", t, v, r);
        sg__emit_line(g->e, "xv%d.v = ((%sconst sg_v16 *)x%d)[q];", r,
                      p->norm ? g->sp->lp : g->sp->gp, r);
    }
    sg__emit_line(g->e, "#pragma unroll");
    sg__emit_open(g->e, "for (int j = 0; j < %d; j++)", v);
    emit_gemv_cols_fma(g, p, cols, "wv%d.e[j]", "xv%d.e[j]");
    sg__emit_close(g->e);
    sg__emit_close(g->e);
}

/* Before the wait: the bias of lane c's column nb + c into b_pre (bias_reg). */
static void emit_gemv_bias(gen *g, const gemv *p, int cols) {
    char lv[200], ld[300];
    if (!p->bias_reg) return;
    snprintf(lv, sizeof lv, "((%sconst %s *)s%d)[%lld + (nb + lane) * %lld]", g->sp->gp,
             sg__lower_ctype(g->d, p->b->dtype), lslot(g, p->b->slot), (long long)p->b->offset,
             (long long)p->b->stride[0]);
    sg__lower_widen(g->d, p->b->dtype, lv, ld, sizeof ld);
    sg__emit_line(g->e, "float b_pre = 0.0f;");
    sg__emit_line(g->e, "if (lane < %d && nb + lane < %lld) b_pre = %s;", cols, (long long)p->n,
                  ld);
}

/* Split K: the warps of a column group add their sums into slice 0's, in
 * slice order (the same bits every launch). */
static void emit_gemv_slices(gen *g, const gemv *p, int nw) {
    int ks = p->ks, nv = (int)p->rows * nw;
    if (ks == 1) return;
    sg__emit_line(g->e, "__shared__ float sg_kred[%d][%d];", BLOCK / 32, nv);
    sg__emit_open(g->e, "if (lane == 0)");
    for (int r = 0; r < p->rows; r++)
        for (int c = 0; c < nw; c++)
            sg__emit_line(g->e, "sg_kred[threadIdx.x >> 5][%d] = acc%d_%d;", r * nw + c, r, c);
    sg__emit_close(g->e);
    sg__emit_line(g->e, "__syncthreads();");
    sg__emit_open(g->e, "if (kw == 0)");
    sg__emit_open(g->e, "for (int s = 1; s < %d; s++)", ks);
    for (int r = 0; r < p->rows; r++)
        for (int c = 0; c < nw; c++)
            sg__emit_line(g->e, "acc%d_%d += sg_kred[(threadIdx.x >> 5) + s][%d];", r, c,
                          r * nw + c);
    sg__emit_close(g->e);
    sg__emit_close(g->e);
}

/*
 * The loads and sums of an along-K GEMV: `cols` adjacent output columns per
 * warp (nb, nb + 1, ...), 16-byte loads along K shared by the columns for
 * x, then a shuffle sum, after which every lane holds acc<r>_<c> (a pair's
 * second product of column c in acc<r>_<cols + c>). Returns the grid; the
 * caller emits the tail on lanes 0 .. cols-1.
 */
static unsigned emit_gemv_warp(gen *g, const sg__group *grp, const gemv *p, int cols) {
    const char *t = sg__lower_ctype(g->d, p->x->dtype);
    int es = (int)sg_dtype_size(p->x->dtype), v = 16 / es;
    int ks = p->ks, st = 32 * ks;
    int64_t wpb = BLOCK / 32, per_block = wpb / ks * cols;
    unsigned grid = (unsigned)((p->n + per_block - 1) / per_block);
    int nw = p->w2 ? 2 * cols : cols; /* weight columns: a pair's second at cols + c */
    const sg__spell *sp = g->sp;
    sg__emit_line(g->e, "const int lane = %s & 31;", sp->tid);
    /* Split K: warp kw of a group of ks takes vectors kw * 32 + lane, then every st-th. */
    sg__emit_line(g->e, "const int kw = (%s >> 5) %% %d, kl = kw * 32 + lane;", sp->tid, ks);
    sg__emit_line(g->e, "const sg_i64 nb = ((sg_i64)%s * (%s >> 5) + (%s >> 5)) / %d * %d;",
                  sp->bid, sp->bdim, sp->tid, ks, cols);
    /* A group past N computes column N - 1 again when its block meets in a barrier. */
    if (!p->norm && sp->shuffles && ks == 1 && !p->am)
        sg__emit_line(g->e, "if (nb >= %lld) return;", (long long)p->n);
    for (int r = 0; r < p->rows; r++)
        for (int c = 0; c < nw; c++) sg__emit_line(g->e, "float acc%d_%d = 0.0f;", r, c);
    /* A warp's last columns past N read column N - 1 again (not stored). */
    if (p->nseg) { /* one column a warp: its segment's weight row */
        sg__emit_line(g->e, "const sg_i64 nc = nb < %lld ? nb : %lld;", (long long)p->n,
                      (long long)(p->n - 1));
        sg__emit_line(g->e, "%sconst %s *wr0;", sp->gp, t);
        for (int j = 0; j < p->nseg; j++) {
            const sg__ref *w = p->sw[j];
            open_segment(g, p, j, "nc");
            sg__emit_line(g->e, "wr0 = (%sconst %s *)s%d + (%lld + (nc - %lld) * %lld);", sp->gp, t,
                          lslot(g, w->slot), (long long)w->offset, (long long)p->c0[j],
                          (long long)w->stride[0]);
            sg__emit_close(g->e);
        }
    }
    for (int c = 0; c < nw && !p->nseg; c++) {
        const sg__ref *w = c < cols ? p->w : p->w2;
        int cc = c < cols ? c : c - cols;
        sg__emit_line(
            g->e,
            "%sconst %s *wr%d = (%sconst %s *)s%d + (%lld + (nb + %d < %lld ? nb + %d : %lld) * "
            "%lld);",
            sp->gp, t, c, sp->gp, t, lslot(g, w->slot), (long long)(c < cols ? p->woff : p->woff2),
            cc, (long long)p->n, cc, (long long)(p->n - 1), (long long)p->sn);
    }
    /* A weight nothing in the step writes may be loaded before the previous
     * kernel has finished: the loads of each lane go to registers ahead of
     * sg_pdl_wait, overlapping that kernel's tail -- all of them up to
     * GEMV_PREFETCH vectors a lane (a K of 3072 bf16 is 12), so that the
     * weights take one memory latency, not one per batch of loads. */
    const sg__slot *wsl = &g->ir->slots[p->w->slot];
    int64_t kv = p->k / v;
    const sg__slot *wsl2 = p->w2 ? &g->ir->slots[p->w2->slot] : wsl;
    bool wconst = wsl->kind != SG__SLOT_INTERNAL && wsl->mutated_by < 0 &&
                  wsl2->kind != SG__SLOT_INTERNAL && wsl2->mutated_by < 0;
    for (int j = 0; j < p->nseg; j++) {
        const sg__slot *sl = &g->ir->slots[p->sw[j]->slot];
        wconst = wconst && sl->kind != SG__SLOT_INTERNAL && sl->mutated_by < 0;
    }
    int npf = wconst && p->k % v == 0
                  ? (int)((kv + st - 1) / st < GEMV_PREFETCH ? (kv + st - 1) / st : GEMV_PREFETCH)
                  : 0;
    while (npf > 1 && npf * nw > GEMV_PREFETCH) npf--;
    emit_gemv_bias(g, p, cols);
    if (p->k % v != 0) {
        emit_gemv_l2(g, grp, p, false);
        sg__emit_line(g->e, "sg_pdl_wait();");
        g->epre = emit_gemv_epre(g, grp, p, cols);
        emit_gemv_norm(g, grp, p);
    } else {
        char cond[768];
        size_t k = (size_t)snprintf(cond, sizeof cond, "(((sg_u64)wr0");
        for (int c = 1; c < nw; c++)
            k += (size_t)snprintf(cond + k, sizeof cond - k, " | (sg_u64)wr%d", c);
        for (int r = 0; r < p->rows; r++)
            k += (size_t)snprintf(cond + k, sizeof cond - k, " | (sg_u64)x%d", r);
        snprintf(cond + k, sizeof cond - k, ") & 15) == 0");
        sg__emit_line(g->e, "const bool aligned = %s;", cond);
        if (npf) {
            sg__emit_line(g->e, "sg_v16 wp[%d][%d];", npf, nw);
            sg__emit_open(g->e, "if (aligned && nb < %lld)", (long long)p->n);
            for (int u = 0; u < npf; u++)
                for (int c = 0; c < nw; c++)
                    sg__emit_line(
                        g->e,
                        "if (kl + %d < %lld) wp[%d][%d] = ((%sconst sg_v16 *)wr%d)[kl + %d];",
                        st * u, (long long)kv, u, c, sp->gp, c, st * u);
            sg__emit_close(g->e);
        }
        emit_gemv_l2(g, grp, p, npf > 0);
        sg__emit_line(g->e, "sg_pdl_wait();");
        g->epre = emit_gemv_epre(g, grp, p, cols);
        emit_gemv_norm(g, grp, p);
        sg__emit_open(g->e, "if (aligned)");
        /* The prefetched vectors, then the rest of K, several loads in flight per lane. */
        for (int u = 0; u <= npf; u++) emit_gemv_vectors(g, p, nw, u, npf, kv);
        sg__emit_close(g->e);
        sg__emit_open(g->e, "else");
    }
    if (p->k % v != 0) sg__emit_open(g->e, "%s", "");
    sg__emit_open(g->e, "for (sg_i64 k = kl; k < %lld; k += %d)", (long long)p->k, st);
    emit_gemv_cols_fma(g, p, nw, "wr%d[k]", "x%d[k]");
    sg__emit_close(g->e);
    sg__emit_close(g->e);
    for (int r = 0; r < p->rows; r++)
        for (int c = 0; c < nw; c++) {
            char acc[32], fold[48];
            snprintf(acc, sizeof acc, "acc%d_%d", r, c);
            if (!sp->shuffles) {
                const char *t1[1] = {"float"}, *v1[1] = {acc}, *o1[1] = {"r_o"};
                snprintf(fold, sizeof fold, "%s += r_o;", acc);
                sg__cuda_tree(g, 1, t1, v1, o1, fold, 1);
                continue;
            }
            sg__emit_line(g->e,
                          "for (int o = 16; o > 0; o >>= 1) acc%d_%d += "
                          "__shfl_xor_sync(0xffffffffu, acc%d_%d, o);",
                          r, c, r, c);
        }
    emit_gemv_slices(g, p, nw);
    if (g->stamps) sg__emit_line(g->e, "sg_stamp_.mark(1);");
    return grid;
}

/* The pointwise members after a GEMV's argmax (sg__group.post), by one
 * thread of the last block once the argmax is stored (am_last). */
static void emit_gemv_post(gen *g, const sg__group *grp) {
    int nd = grp->post_ndim;
    const int64_t *shape = grp->post_shape;
    bool flat = group_flat(g, grp, grp->post, nd, shape);
    sg__emit_open(g->e, "if (am_last && threadIdx.x == 0)");
    sg__emit_open(g->e, "for (sg_i64 i = 0; i < %lld; i++)", (long long)numel_of(nd, shape));
    if (!flat) emit_unflatten(g, nd, shape);
    emit_body(g, grp, grp->post, nd, shape, flat ? IX_FLAT : IX_NESTED, 1);
    sg__emit_close(g->e);
    sg__emit_close(g->e);
}

/* The kernel body of a GEMV group; returns the grid. */
static unsigned emit_gemv(gen *g, const sg__group *grp, const gemv *p) {
    const char *t = sg__lower_ctype(g->d, p->x->dtype);
    char lv[160], ld[240];
    g->anchor_reg = true;
    const sg__spell *sp = g->sp;
    if (p->norm) sg__cuda_shared(g, 16, "%s sg_xs[%lld]", t, (long long)(p->rows * p->k));
    for (int r = 0; r < p->rows; r++)
        if (p->norm)
            sg__emit_line(g->e, "%sconst %s *x%d = sg_xs + %lld;", sp->lp, t, r,
                          (long long)p->xoff[r]);
        else
            sg__emit_line(g->e, "%sconst %s *x%d = (%sconst %s *)s%d + %lld;", sp->gp, t, r, sp->gp,
                          t, lslot(g, p->x->slot), (long long)p->xoff[r]);
    unsigned grid;
    if (p->along_k) {
        int cols = p->cols;
        grid = emit_gemv_warp(g, grp, p, cols);
        for (int r = 0; p->am && r < p->rows; r++)
            sg__emit_line(g->e, "float am_b%d = __uint_as_float(0xff800000u); sg_i64 am_at%d = -1;",
                          r, r);
        /* Lane c stores column nb + c. */
        sg__emit_open(g->e, "if (kw == 0 && lane < %d && nb + lane < %lld)", cols, (long long)p->n);
        sg__emit_line(g->e, "const sg_i64 n = nb + lane;");
        for (int r = 0; r < p->rows; r++) {
            char sel[512];
            size_t q = 0;
            for (int c = cols - 1; c > 0 && q < sizeof sel; c--)
                q += (size_t)snprintf(sel + q, sizeof sel - q, "lane == %d ? acc%d_%d : ", c, r, c);
            if (q < sizeof sel) snprintf(sel + q, sizeof sel - q, "acc%d_0", r);
            sg__emit_line(g->e, "const float acc%d = %s;", r, sel);
            if (!p->w2) continue;
            q = 0;
            for (int c = cols - 1; c > 0 && q < sizeof sel; c--)
                q += (size_t)snprintf(sel + q, sizeof sel - q, "lane == %d ? acc%d_%d : ", c, r,
                                      cols + c);
            if (q < sizeof sel) snprintf(sel + q, sizeof sel - q, "acc%d_%d", r, cols);
            sg__emit_line(g->e, "const float accp%d = %s;", r, sel);
        }
    } else {
        /* One thread per column, 8 slices of K per block summed in shared memory. */
        int slices = BLOCK / 32;
        grid = (unsigned)((p->n + 31) / 32);
        emit_gemv_l2(g, grp, p, false);
        sg__emit_line(g->e, "sg_pdl_wait();");
        emit_gemv_norm(g, grp, p);
        sg__emit_line(g->e, "const int c = %s & 31, ks = %s >> 5;", sp->tid, sp->tid);
        sg__emit_line(g->e, "const sg_i64 n = (sg_i64)%s * 32 + c;", sp->bid);
        for (int r = 0; r < p->rows; r++) sg__emit_line(g->e, "float acc%d = 0.0f;", r);
        sg__emit_open(g->e, "if (n < %lld)", (long long)p->n);
        sg__emit_line(g->e, "%sconst %s *wc = (%sconst %s *)s%d + (%lld + n);", sp->gp, t, sp->gp,
                      t, lslot(g, p->w->slot), (long long)p->woff);
        sg__emit_open(g->e, "for (sg_i64 k = ks; k < %lld; k += %d)", (long long)p->k, slices);
        snprintf(lv, sizeof lv, "wc[k * %lld]", (long long)p->sk);
        sg__lower_widen(g->d, p->w->dtype, lv, ld, sizeof ld);
        sg__emit_line(g->e, "const float wf = %s;", ld);
        char xl[48];
        snprintf(xl, sizeof xl, p->xs == 1 ? "x%%d[k]" : "x%%d[k * %lld]", (long long)p->xs);
        emit_gemv_fma(g, p, xl);
        sg__emit_close(g->e);
        sg__emit_close(g->e);
        sg__cuda_shared(g, 0, "float red[%lld][%d][32]", (long long)p->rows, slices);
        for (int r = 0; r < p->rows; r++) sg__emit_line(g->e, "red[%d][ks][c] = acc%d;", r, r);
        sg__emit_line(g->e, "%s", sp->sync);
        sg__emit_open(g->e, "if (ks == 0 && n < %lld)", (long long)p->n);
        for (int r = 0; r < p->rows; r++)
            sg__emit_line(g->e, "for (int s = 1; s < %d; s++) acc%d += red[%d][s][c];", slices, r,
                          r);
    }
    for (int r = 0; r < p->rows; r++) emit_gemv_tail(g, grp, p, r);
    if (g->epre) sg__free(g->e->ctx, (bool *)g->epre, sizeof(bool) * 3 * (size_t)grp->n);
    g->epre = NULL;
    sg__emit_close(g->e);
    grid = grid ? grid : 1;
    if (p->am) sg__cgen_cuda_gemv_argmax(g, grp, p->am, p->rows, grid);
    if (grp->post) emit_gemv_post(g, grp);
    g->anchor_reg = false;
    return grid;
}

/* ------------------------------------------------------------ data movement */

/*
 * The data ops the library would run as eager kernels (embedding,
 * index_select, concat, index_copy_) become one generated kernel each, a
 * grid-stride loop over the elements it writes with every offset a
 * constant. Index values are read from device memory and bounds-checked by
 * each thread: a gather of a bad index gives zeros, a scatter of one writes
 * nothing (the library checks indices on the host before launches it does
 * not record, as for its own kernels).
 */

/* " + i<d> * <stride>" for each dim d < nd of the walk but `skip`. */
static void walk_terms(const sg__ref *r, int nd, const int64_t *shape, int skip, char *buf,
                       size_t size) {
    size_t k = (size_t)snprintf(buf, size, "%lld", (long long)r->offset);
    for (int d = 0; d < nd && k < size; d++) {
        if (d == skip || shape[d] == 1 || r->stride[d] == 0) continue;
        k += (size_t)snprintf(buf + k, size - k, " + i%d * %lld", d, (long long)r->stride[d]);
    }
}

/* `v = idx[<off>]` as a 64-bit value. */
static void emit_index_load(gen *g, const char *v, const sg__ref *idx, const char *off) {
    sg__emit_line(g->e, "const sg_i64 %s = (sg_i64)((%sconst %s *)s%d)[%s];", v, g->sp->gp,
                  sg__lower_ctype(g->d, idx->dtype), lslot(g, idx->slot), off);
}

/* out = src[sel] where sel is in [0, limit), else zeros. */
static void emit_pick(gen *g, const sg__ref *o, const char *oo, const sg__ref *x, const char *xo,
                      const char *sel, int64_t limit) {
    const char *t = sg__lower_ctype(g->d, o->dtype);
    int so = lslot(g, o->slot), sx = lslot(g, x->slot);
    const char *gp = g->sp->gp;
    sg__emit_line(g->e,
                  "((%s%s *)s%d)[%s] = %s >= 0 && %s < %lld ? ((%sconst %s *)s%d)[%s] : (%s)0;", gp,
                  t, so, oo, sel, sel, (long long)limit, gp, t, sx, xo, t);
}

/* The loop over the walk's elements, i0..i<nd-1> declared; close it after. */
static void open_walk(gen *g, int nd, const int64_t *shape) {
    const char *blk = g->walk_blk ? g->walk_blk : g->sp->bid;
    const char *nblk = g->walk_nblk ? g->walk_nblk : g->sp->gdim;
    sg__emit_line(g->e, "const sg_i64 tid = (sg_i64)(%s) * %s + %s;", blk, g->sp->bdim, g->sp->tid);
    sg__emit_open(g->e, "for (sg_i64 i = tid; i < %lld; i += (sg_i64)(%s) * %s)",
                  (long long)numel_of(nd, shape), nblk, g->sp->bdim);
    emit_unflatten(g, nd, shape);
}

static void emit_embedding(gen *g, const sg__irnode *n) {
    const sg__ref *w = arg_of(g, n, 0), *idx = arg_of(g, n, 1), *o = ref_of(g, n->out);
    int nd = o->ndim;
    char io[320], oo[320], wo[400];
    open_walk(g, nd, o->shape);
    walk_terms(idx, idx->ndim, o->shape, -1, io, sizeof io);
    emit_index_load(g, "row", idx, io);
    walk_terms(o, nd, o->shape, -1, oo, sizeof oo);
    snprintf(wo, sizeof wo, "%lld + row * %lld", (long long)w->offset, (long long)w->stride[0]);
    if (o->shape[nd - 1] > 1)
        snprintf(wo + strlen(wo), sizeof wo - strlen(wo), " + i%d * %lld", nd - 1,
                 (long long)w->stride[1]);
    emit_pick(g, o, oo, w, wo, "row", w->shape[0]);
    sg__emit_close(g->e);
}

static void emit_index_select(gen *g, const sg__irnode *n) {
    const sg__ref *x = arg_of(g, n, 0), *idx = arg_of(g, n, 1), *o = ref_of(g, n->out);
    int nd = o->ndim, dim = (int)n->i[0];
    char io[96], oo[320], xo[400];
    open_walk(g, nd, o->shape);
    snprintf(io, sizeof io, "%lld", (long long)idx->offset);
    if (o->shape[dim] > 1)
        snprintf(io + strlen(io), sizeof io - strlen(io), " + i%d * %lld", dim,
                 (long long)idx->stride[0]);
    emit_index_load(g, "sel", idx, io);
    walk_terms(o, nd, o->shape, -1, oo, sizeof oo);
    walk_terms(x, nd, o->shape, dim, xo, sizeof xo);
    snprintf(xo + strlen(xo), sizeof xo - strlen(xo), " + sel * %lld", (long long)x->stride[dim]);
    emit_pick(g, o, oo, x, xo, "sel", x->shape[dim]);
    sg__emit_close(g->e);
}

/* Each output element takes its source by the range of its index along dim. */
static void emit_concat(gen *g, const sg__irnode *n) {
    const sg__ref *o = ref_of(g, n->out);
    int nd = o->ndim, dim = (int)n->i[0];
    const char *t = sg__lower_ctype(g->d, o->dtype);
    char oo[320], xo[400];
    open_walk(g, nd, o->shape);
    walk_terms(o, nd, o->shape, -1, oo, sizeof oo);
    int64_t start = 0;
    bool first = true;
    for (int j = 0; j < n->nin; j++) {
        const sg__ref *x = arg_of(g, n, j);
        if (x->shape[dim] == 0) continue;
        walk_terms(x, nd, o->shape, dim, xo, sizeof xo);
        if (x->shape[dim] > 1 || o->shape[dim] > 1)
            snprintf(xo + strlen(xo), sizeof xo - strlen(xo), " + (i%d - %lld) * %lld", dim,
                     (long long)start, (long long)x->stride[dim]);
        start += x->shape[dim];
        bool last = start >= o->shape[dim];
        if (last)
            sg__emit_open(g->e, "%s", first ? "" : "else");
        else
            sg__emit_open(g->e, "%sif (i%d < %lld)", first ? "" : "else ", dim, (long long)start);
        sg__emit_line(g->e, "((%s%s *)s%d)[%s] = ((%sconst %s *)s%d)[%s];", g->sp->gp, t,
                      lslot(g, o->slot), oo, g->sp->gp, t, lslot(g, x->slot), xo);
        sg__emit_close(g->e);
        first = false;
    }
    sg__emit_close(g->e);
}

/* dst[.., idx[j], ..] = src[.., j, ..]: a thread per src element; of
 * repeated indices the last one wins (a later equal index skips the write). */
static void emit_index_copy(gen *g, const sg__irnode *n) {
    const sg__ref *d = ref_of(g, n->out), *idx = arg_of(g, n, 1), *src = arg_of(g, n, 2);
    int nd = src->ndim, dim = (int)n->i[0];
    int64_t len = src->shape[dim];
    const char *t = sg__lower_ctype(g->d, d->dtype);
    char io[96], so[320], dof[400];
    open_walk(g, nd, src->shape);
    snprintf(io, sizeof io, "%lld", (long long)idx->offset);
    if (len > 1)
        snprintf(io + strlen(io), sizeof io - strlen(io), " + i%d * %lld", dim,
                 (long long)idx->stride[0]);
    emit_index_load(g, "at", idx, io);
    sg__emit_line(g->e, "if (at < 0 || at >= %lld) continue;", (long long)d->shape[dim]);
    if (len > 1) {
        sg__emit_line(g->e, "bool later = false;");
        sg__emit_line(g->e, "for (sg_i64 j = i%d + 1; j < %lld && !later; j++)", dim,
                      (long long)len);
        sg__emit_line(g->e, "    later = (sg_i64)((%sconst %s *)s%d)[%lld + j * %lld] == at;",
                      g->sp->gp, sg__lower_ctype(g->d, idx->dtype), lslot(g, idx->slot),
                      (long long)idx->offset, (long long)idx->stride[0]);
        sg__emit_line(g->e, "if (later) continue;");
    }
    walk_terms(src, nd, src->shape, -1, so, sizeof so);
    walk_terms(d, nd, src->shape, dim, dof, sizeof dof);
    snprintf(dof + strlen(dof), sizeof dof - strlen(dof), " + at * %lld",
             (long long)d->stride[dim]);
    sg__emit_line(g->e, "((%s%s *)s%d)[%s] = ((%sconst %s *)s%d)[%s];", g->sp->gp, t,
                  lslot(g, d->slot), dof, g->sp->gp, t, lslot(g, src->slot), so);
    sg__emit_close(g->e);
}

/* The elements a data op's kernel walks (its output; index_copy_: src),
 * or -1 when the op stays with the library. */
static int64_t data_walk(const gen *g, const sg__group *grp, const sg__irnode **node) {
    if (grp->kind != SG__G_OPAQUE || grp->n != 1) return -1;
    const sg__irnode *n = &g->ir->nodes[grp->g[0].node];
    const sg__ref *o = ref_of(g, n->out);
    *node = n;
    switch (n->op) {
    case SG__OP_EMBEDDING:
    case SG__OP_INDEX_SELECT:
    case SG__OP_CONCAT: return o->ndim > 0 ? numel_of(o->ndim, o->shape) : -1;
    case SG__OP_INDEX_COPY: {
        /* idx in dst's bytes would be read while other threads write them. */
        const sg__ref *idx = arg_of(g, n, 1), *src = arg_of(g, n, 2);
        if (idx->slot == o->slot || src->slot == o->slot || o->ndim == 0) return -1;
        return numel_of(src->ndim, src->shape);
    }
    default: return -1;
    }
}

/* The walk of data op n (one data_walk accepted); what it does, in words. */
static const char *data_body(gen *g, const sg__irnode *n) {
    switch (n->op) {
    case SG__OP_EMBEDDING: emit_embedding(g, n); return "embedding: a gather of rows";
    case SG__OP_INDEX_SELECT: emit_index_select(g, n); return "index_select: a gather";
    case SG__OP_CONCAT: emit_concat(g, n); return "concat: each element from its input";
    default: emit_index_copy(g, n); return "index_copy_: a scatter, the last index wins";
    }
}

/* An opaque group's kernel when it is a data op the dialect generates. */
static bool emit_data(gen *g, const sg__group *grp, sg__cuda_kinfo *ki, const char **what) {
    const sg__irnode *n = NULL;
    int64_t numel = data_walk(g, grp, &n);
    if (numel <= 0) return false;
    *what = data_body(g, n);
    for (int t = 0; t < SG__CUDA_NTUNE; t++) {
        int64_t b = (numel + (128 << t) - 1) / (128 << t);
        ki->tune_grid[t] = (unsigned)(b > GRID_CAP ? GRID_CAP : b);
    }
    ki->grid = ki->tune_grid[1];
    ki->block = BLOCK;
    ki->iters = numel;
    ki->replaces_call = true;
    return true;
}

/* ------------------------------------------------------------ kernels */

/* Number the slots a group's generated code reads or writes in memory, in
 * the order it touches them. */
static void used_slots(gen *g, const sg__group *grp, int from) {
    for (int k = from; k < grp->n; k++) {
        const sg__irnode *n = &g->ir->nodes[grp->g[k].node];
        if (grp->g[k].store) lslot(g, ref_of(g, n->out)->slot);
        for (int j = 0; j < n->nin; j++) {
            const sg__ref *a = arg_of(g, n, j);
            if (a && reg_src(g, grp, k, j) < 0) lslot(g, a->slot);
        }
    }
}

/* Launch of one elementwise loop: blocks of `block` threads for numel / w
 * iterations, capped (the loop strides over the rest). */
static unsigned loop_blocks(const sg__group *grp, int w, int block, int64_t cap) {
    int64_t it = numel_of(grp->ndim, grp->shape) / w, b = (it + block - 1) / block;
    return (unsigned)(b < 1 ? 1 : b > cap ? cap : b);
}

static void kernel_comment(gen *g, const sg__group *grp, int k, const sg__cuda_kinfo *ki,
                           const char *what) {
    char sh[96], line[512];
    sg__emit_line(g->e, "/*");
    sg__emit_line(g->e, " * kernel %d: %s", k, ki->name);
    sg__emit_line(g->e, " * %s; launch: %u blocks of %u threads", what, ki->grid, ki->block);
    const sg__group *list = grp;
    int nl = grp->kind == SG__G_MULTI ? grp->nmembers : 1;
    for (int m = 0; m < nl; m++) {
        if (grp->kind == SG__G_MULTI) list = &g->f->parts[grp->members[m]];
        sg__emit_line(
            g->e, " * %s over %s, IR lines %d..%d:", grp->kind == SG__G_MULTI ? "member" : "ops",
            sg__shape_str(list->ndim, list->shape, sh, sizeof sh), list->first, list->last);
        for (int i = 0; i < list->n; i++)
            sg__emit_line(g->e, " *   %s%s",
                          sg__ir_node_str(g->ir, list->g[i].node, line, sizeof line),
                          list->g[i].store ? "  [stored]" : "");
    }
    sg__emit_line(g->e, " */");
}

/* A data member of a MULTI (horizontal_data) over blocks start ..: its
 * walk, and the blocks it takes (0: none). fuse.c merges only what
 * data_walk takes. */
static int64_t multi_data(gen *g, const sg__group *part, int64_t start, sg__cuda_kinfo *ki) {
    const sg__irnode *n = NULL;
    int64_t numel = data_walk(g, part, &n), nb = (numel + BLOCK - 1) / BLOCK;
    if (numel <= 0) {
        sg__emit_line(g->e, "#error \"a merged data op this dialect does not generate\"");
        return 0;
    }
    nb = nb > MEMBER_CAP ? MEMBER_CAP : nb;
    char blk[64], nblk[32];
    snprintf(blk, sizeof blk, "%s - %lld", g->sp->bid, (long long)start);
    snprintf(nblk, sizeof nblk, "%lld", (long long)nb);
    g->walk_blk = blk, g->walk_nblk = nblk;
    data_body(g, n);
    g->walk_blk = g->walk_nblk = NULL;
    ki->iters += numel;
    return nb;
}

/* A pointwise member of a MULTI over blocks start ..: its loop, and the
 * blocks it takes (0: none). */
static int64_t multi_loop(gen *g, const sg__group *part, int64_t start, bool *aligned, int nslots,
                          sg__cuda_kinfo *ki) {
    if (numel_of(part->ndim, part->shape) == 0) return 0;
    used_slots(g, part, 0);
    memset(aligned, 0, sizeof(bool) * (size_t)nslots);
    int w = vec_width(g, part, 0, aligned);
    unsigned nb = loop_blocks(part, w, BLOCK, MEMBER_CAP);
    char blk[64], nblk[32];
    snprintf(blk, sizeof blk, "%s - %lld", g->sp->bid, (long long)start);
    snprintf(nblk, sizeof nblk, "%u", nb);
    emit_loop(g, part, 0, w, aligned, blk, nblk);
    ki->iters += numel_of(part->ndim, part->shape);
    return nb;
}

/* Union-find root of member k. */
static int comp_root(int *up, int k) {
    while (up[k] != k) k = up[k] = up[up[k]];
    return k;
}

/*
 * The independent parts of a pointwise member (AdamW's same-shaped weights
 * of every layer, fused into one loop): comp[k] gets member k's part, 0 ..
 * (the count returned). Members join through a reused value or a slot that
 * one of them writes and the other touches. -1 when out of memory.
 */
static int member_parts(gen *g, const sg__group *part, int *comp) {
    int n = part->n, *up = comp;
    for (int k = 0; k < n; k++) up[k] = k;
    for (int k = 0; k < n; k++) {
        const sg__irnode *a = &g->ir->nodes[part->g[k].node];
        for (int j = 0; j < 4 && j < a->nin; j++)
            if (part->g[k].arg_src[j] >= 0)
                up[comp_root(up, k)] = comp_root(up, part->g[k].arg_src[j]);
        int ws = ref_of(g, a->out)->slot;
        for (int i = 0; i < n; i++) {
            const sg__irnode *b = &g->ir->nodes[part->g[i].node];
            bool touch = i != k && ref_of(g, b->out)->slot == ws;
            for (int j = 0; j < b->nin && !touch; j++) {
                const sg__ref *r = arg_of(g, b, j);
                touch = r && r->slot == ws && i != k;
            }
            if (touch) up[comp_root(up, k)] = comp_root(up, i);
        }
    }
    int *id = sg__alloc(g->e->ctx, sizeof(int) * (size_t)n), count = 0;
    if (!id) return -1;
    for (int k = 0; k < n; k++) id[k] = -1;
    for (int k = 0; k < n; k++) {
        int r = comp_root(up, k);
        if (id[r] < 0) id[r] = count++;
    }
    for (int k = 0; k < n; k++) id[k] = id[comp_root(up, k)];
    memcpy(comp, id, sizeof(int) * (size_t)n);
    sg__free(g->e->ctx, id, sizeof(int) * (size_t)n);
    return count;
}

/* Part c of member part (comp: each member's part) as a group over sub. */
static sg__group part_of(const gen *g, const sg__group *part, int *comp, int c, sg__gnode *sub) {
    int n = part->n, *map = comp + n, m = 0;
    for (int k = 0; k < n; k++) map[k] = comp[k] == c ? m++ : -1;
    for (int k = 0; k < n; k++) {
        if (comp[k] != c) continue;
        sub[map[k]] = part->g[k];
        int nin = g->ir->nodes[part->g[k].node].nin;
        for (int j = 0; j < 4 && j < nin; j++) /* arg_src past nin is not set */
            if (part->g[k].arg_src[j] >= 0) sub[map[k]].arg_src[j] = map[part->g[k].arg_src[j]];
    }
    sg__group one = *part;
    one.g = sub, one.n = m;
    return one;
}

/* One loop of a MULTI kernel: a member, or a part of one (multi_split). */
typedef struct munit {
    sg__group grp; /* its group (a part's nodes in emit_multi's array) */
    bool data;     /* a data member (multi_data) */
    int cls;       /* the first unit whose loop it shares (share_classes), -1: its own */
    /* With a shared loop: its text, its blocks, and per slot the loop
     * names (s0, s1, .. in the loop's order) the IR slot and the bias. */
    sg__emit text;
    int64_t nb;
    int ns;
    int slot[SG__CUDA_MAX_LOCAL];
    int64_t bias[SG__CUDA_MAX_LOCAL];
} munit;

/*
 * The independent parts of a pointwise member of a MULTI with no vector
 * path (more than the 64 vectors it keeps), each its own unit over its own
 * blocks, into u (their nodes into sub): a part's loop loads, computes and
 * stores one weight's elements in 16-byte vectors and holds only their
 * registers. 0 when the member stays whole (one part, or a part alone has
 * no vector path either); else the count of parts.
 */
static int multi_split(gen *g, const sg__group *part, bool *aligned, int nslots, sg__gnode *sub,
                       munit *u) {
    sg_ctx *ctx = g->e->ctx;
    if (part->kind != SG__G_POINTWISE || part->n < 2) return 0;
    memset(aligned, 0, sizeof(bool) * (size_t)nslots);
    if (vec_width(g, part, 0, aligned) > 1) return 0;
    int n = part->n, *comp = sg__alloc(ctx, sizeof(int) * (size_t)n * 2), used = 0;
    int count = comp ? member_parts(g, part, comp) : -1;
    if (count < 0) g->e->oom = true;
    for (int c = 0; count > 1 && c < count; c++) {
        sg__group one = part_of(g, part, comp, c, sub + used);
        memset(aligned, 0, sizeof(bool) * (size_t)nslots);
        if (vec_width(g, &one, 0, aligned) < 2) count = 0;
        u[c] = (munit){.grp = one, .cls = -1};
        used += one.n;
    }
    if (comp) sg__free(ctx, comp, sizeof(int) * (size_t)n * 2);
    return count > 1 ? count : 0;
}

/* Unit u over blocks start .. in its own branch that loads the slot bases
 * it names; the blocks it takes. */
static int64_t emit_unit(gen *g, const munit *u, int64_t start, sg__cuda_kinfo *ki, bool *aligned,
                         int nslots, bool *mark) {
    sg__emit *outer = g->e, body = {.ctx = outer->ctx, .depth = outer->depth + 1};
    memset(mark, 0, sizeof(bool) * (size_t)nslots);
    g->e = &body, g->mark = mark;
    int64_t nb = u->data ? multi_data(g, &u->grp, start, ki)
                         : multi_loop(g, &u->grp, start, aligned, nslots, ki);
    g->e = outer, g->mark = NULL;
    if (nb > 0) {
        sg__emit_open(outer, "%sif (%s < %lld)", start ? "else " : "", g->sp->bid,
                      (long long)(start + nb));
        for (int i = 0; i < nslots; i++)
            if (mark[i]) sg__emit_line(outer, "%schar *const s%d = slot[%d];", g->sp->gp, i, i);
        if (body.buf) sg__emit_raw(outer, "%s", body.buf);
        sg__emit_close(outer);
    } else if (body.buf) {
        sg__emit_raw(outer, "%s", body.buf);
    }
    if (body.oom) outer->oom = true;
    sg__emit_free(&body);
    return nb;
}

/* bias[s] for each slot s of loop p's refs (the ones used_slots numbers):
 * the least byte offset of those refs into it, down to whole 16 bytes;
 * with reset, -1 again. */
static void loop_bias(const gen *g, const sg__group *p, int64_t *bias, bool reset) {
    for (int k = 0; k < p->n; k++) {
        const sg__irnode *n = &g->ir->nodes[p->g[k].node];
        for (int j = -1; j < n->nin; j++) {
            const sg__ref *r = j < 0 ? (p->g[k].store ? ref_of(g, n->out) : NULL) : arg_of(g, n, j);
            if (!r || (j >= 0 && reg_src(g, p, k, j) >= 0)) continue;
            int64_t b = r->offset * (int64_t)sg_dtype_size(r->dtype);
            b = b > 0 ? b / 16 * 16 : 0;
            if (reset || bias[r->slot] < 0 || b < bias[r->slot]) bias[r->slot] = reset ? -1 : b;
        }
    }
}

/*
 * Unit u's loop as a loop that units of the same code share: its slots
 * named in its own order, each base moved by the least byte offset of the
 * unit's refs into it (down to whole 16 bytes, so that alignment is
 * unchanged), its length r_n and its blocks from r_f, r_nb (emit_shared).
 * bias: -1 for every slot, and so left.
 */
static void share_text(gen *g, munit *u, int *loc, int64_t *bias, bool *aligned, int nslots) {
    const sg__group *p = &u->grp;
    if (numel_of(p->ndim, p->shape) == 0) return;
    int *was_loc = g->loc, was_locals[SG__CUDA_MAX_LOCAL], was_nloc = g->nloc;
    bool was_global = g->global, was_overflow = g->overflow;
    memcpy(was_locals, g->locals, sizeof was_locals);
    for (int s = 0; s < g->ir->nslots; s++) loc[s] = -1;
    g->loc = loc, g->nloc = 0, g->global = false, g->overflow = false;
    used_slots(g, p, 0);
    loop_bias(g, p, bias, false);
    memset(aligned, 0, sizeof(bool) * (size_t)nslots);
    int w = vec_width(g, p, 0, aligned);
    u->nb = loop_blocks(p, w, BLOCK, MEMBER_CAP);
    sg__emit *outer = g->e;
    u->text = (sg__emit){.ctx = outer->ctx, .depth = outer->depth + 1};
    char blk[64];
    snprintf(blk, sizeof blk, "%s - r_f", g->sp->bid);
    g->e = &u->text, g->bias = bias, g->len = "r_n";
    emit_loop(g, p, 0, w, aligned, blk, "r_nb");
    g->e = outer, g->bias = NULL, g->len = NULL;
    u->ns = g->nloc;
    for (int j = 0; j < g->nloc; j++) {
        u->slot[j] = g->locals[j];
        u->bias[j] = bias[g->locals[j]];
    }
    loop_bias(g, p, bias, true);
    if (u->text.oom) outer->oom = true;
    if (g->overflow || u->text.oom) sg__emit_free(&u->text); /* runs its own code */
    g->loc = was_loc, g->nloc = was_nloc, g->global = was_global, g->overflow = was_overflow;
    memcpy(g->locals, was_locals, sizeof was_locals);
}

/*
 * Units whose loops are one code but for their slots' bases, their lengths
 * and their blocks share that loop (emit_shared), so that a MULTI's code
 * does not grow with its members (AdamW over GPT-2's 148 parameters: the
 * same chain of ops for each weight): u->cls is the first unit of its class
 * where a class has two units or more. Not in a dialect without tables, nor
 * with SG_MULTI_SHARE=0. Returns the count of classes.
 */
static int share_classes(gen *g, munit *u, int nu, bool *aligned, int nslots) {
    const char *env = getenv("SG_MULTI_SHARE");
    if (!g->sp->table || (env && strcmp(env, "0") == 0)) return 0;
    sg_ctx *ctx = g->e->ctx;
    int *loc = sg__alloc(ctx, sizeof(int) * (size_t)nslots);
    int64_t *bias = sg__alloc(ctx, sizeof(int64_t) * (size_t)nslots);
    int nc = 0;
    if (!loc || !bias) g->e->oom = true;
    for (int s = 0; bias && s < nslots; s++) bias[s] = -1;
    for (int i = 0; loc && bias && i < nu; i++) {
        if (!u[i].data) share_text(g, &u[i], loc, bias, aligned, nslots);
        for (int c = 0; u[i].text.buf && c < i && u[i].cls < 0; c++)
            if (u[c].cls == c && u[c].text.len == u[i].text.len &&
                memcmp(u[c].text.buf, u[i].text.buf, u[i].text.len) == 0)
                u[i].cls = c;
        if (u[i].text.buf && u[i].cls < 0) u[i].cls = i; /* a class of its own so far */
    }
    for (int i = 0; i < nu; i++) { /* a class of one keeps its own code */
        bool shared = false;
        for (int o = 0; o < nu && !shared && u[i].cls >= 0; o++)
            shared = o != i && u[o].cls == u[i].cls;
        if (u[i].cls >= 0 && !shared) u[i].cls = -1;
        nc += u[i].cls == i;
    }
    if (loc) sg__free(ctx, loc, sizeof(int) * (size_t)nslots);
    if (bias) sg__free(ctx, bias, sizeof(int64_t) * (size_t)nslots);
    return nc;
}

/* The units of class c over consecutive blocks from start, in one branch:
 * the loop they share once, and tables of each unit's first block (and the
 * end), length, slots and bias, its row found by the block. The blocks
 * taken. */
static int64_t emit_shared(gen *g, const munit *u, int nu, int c, int64_t start,
                           sg__cuda_kinfo *ki) {
    sg__emit *e = g->e;
    int n = 0, ns = u[c].ns, k = 0;
    for (int i = c; i < nu; i++) n += u[i].cls == c;
    size_t nt = (size_t)n * (size_t)(ns ? ns : 1);
    int64_t *first = sg__alloc(e->ctx, sizeof(int64_t) * (size_t)(n + 1));
    int64_t *len = sg__alloc(e->ctx, sizeof(int64_t) * (size_t)n);
    int64_t *slots = sg__alloc(e->ctx, sizeof(int64_t) * nt);
    int64_t *bias = sg__alloc(e->ctx, sizeof(int64_t) * nt), at = start;
    bool moved = false;
    if (first && len && slots && bias) {
        for (int i = c; i < nu; i++) {
            if (u[i].cls != c) continue;
            first[k] = at;
            len[k] = numel_of(u[i].grp.ndim, u[i].grp.shape);
            for (int j = 0; j < ns; j++) {
                slots[k * ns + j] = lslot(g, u[i].slot[j]);
                bias[k * ns + j] = u[i].bias[j];
                moved = moved || u[i].bias[j] > 0;
            }
            ki->iters += len[k++];
            at += u[i].nb;
        }
        first[n] = at;
        sg__emit_open(e, "%sif (%s < %lld)", start ? "else " : "", g->sp->bid, (long long)at);
        sg__emit_line(e, "/* %d loops of one code: blocks, lengths and slots by table row */", n);
        sg__cuda_table(g, "r_mf", first, n + 1);
        sg__cuda_table(g, "r_ml", len, n);
        sg__cuda_table(g, "r_ms", slots, n * ns);
        if (moved) sg__cuda_table(g, "r_md", bias, n * ns);
        /* The row: by division when every loop takes as many blocks (the
         * usual case: MEMBER_CAP each), else by bisection of r_mf. A block
         * of a short loop has a few iterations, so a chain of dependent
         * table loads before them would cost about as much as its work. */
        bool even = first[1] > first[0];
        for (int i = 1; i < n; i++) even = even && first[i + 1] - first[i] == first[1] - first[0];
        if (even)
            sg__emit_line(e, "const int r_a = (int)(((sg_i64)%s - %lldLL) / %lldLL);", g->sp->bid,
                          (long long)first[0], (long long)(first[1] - first[0]));
        else
            sg__cuda_table_row(g, "r_mf", n);
        sg__emit_line(e,
                      "const sg_i64 r_f = r_mf[r_a], r_nb = r_mf[r_a + 1] - r_f, r_n = r_ml[r_a];");
        for (int j = 0; j < ns; j++)
            sg__emit_line(
                e,
                moved ? "%schar *const s%d = slot[r_ms[r_a * %d + %d]] + r_md[r_a * %d + %d];"
                      : "%schar *const s%d = slot[r_ms[r_a * %d + %d]];",
                g->sp->gp, j, ns, j, ns, j);
        sg__emit_raw(e, "%s", u[c].text.buf);
        sg__emit_close(e);
    } else {
        e->oom = true;
    }
    if (first) sg__free(e->ctx, first, sizeof(int64_t) * (size_t)(n + 1));
    if (len) sg__free(e->ctx, len, sizeof(int64_t) * (size_t)n);
    if (slots) sg__free(e->ctx, slots, sizeof(int64_t) * nt);
    if (bias) sg__free(e->ctx, bias, sizeof(int64_t) * nt);
    return at - start;
}

/*
 * A MULTI group: its members one after another over consecutive ranges of
 * blocks, each in its own branch that loads the slot bases it names (where
 * the kernel's head would load every member's: with dozens of members,
 * their pointers held live across the branches cost the registers that
 * set the kernel's occupancy). Members (or parts: multi_split) whose loops
 * are one code run it once (share_classes), their blocks together where
 * the first of them runs. True when some do.
 */
static bool emit_multi(gen *g, const sg__group *grp, sg__cuda_kinfo *ki, bool *aligned,
                       int nslots) {
    sg__emit *outer = g->e;
    sg_ctx *ctx = outer->ctx;
    int cap = 0, nodes = 0, nu = 0, used = 0, nc = 0;
    for (int m = 0; m < grp->nmembers; m++) {
        int n = g->f->parts[grp->members[m]].n;
        cap += n > 1 ? n : 1;
        nodes += n;
    }
    munit *u = sg__calloc(ctx, sizeof *u * (size_t)cap);
    sg__gnode *sub = sg__alloc(ctx, sizeof *sub * (size_t)(nodes ? nodes : 1));
    bool *mark = sg__calloc(ctx, sizeof(bool) * (size_t)nslots);
    g->member_slots = true;
    if (u && sub && mark) {
        for (int m = 0; m < grp->nmembers; m++) {
            const sg__group *part = &g->f->parts[grp->members[m]];
            int np = multi_split(g, part, aligned, nslots, sub + used, u + nu);
            for (int k = 0; k < np; k++) used += u[nu + k].grp.n;
            nu += np;
            if (!np) u[nu++] = (munit){.grp = *part, .data = part->kind == SG__G_OPAQUE, .cls = -1};
        }
        nc = share_classes(g, u, nu, aligned, nslots);
    } else {
        outer->oom = true;
    }
    int64_t start = 0;
    for (int i = 0; i < nu && !outer->oom; i++) {
        if (u[i].cls >= 0 && u[i].cls != i) continue; /* its class's loop runs it */
        start += u[i].cls == i ? emit_shared(g, u, nu, i, start, ki)
                               : emit_unit(g, &u[i], start, ki, aligned, nslots, mark);
    }
    for (int i = 0; i < nu; i++) sg__emit_free(&u[i].text);
    if (u) sg__free(ctx, u, sizeof *u * (size_t)cap);
    if (sub) sg__free(ctx, sub, sizeof *sub * (size_t)(nodes ? nodes : 1));
    if (mark) sg__free(ctx, mark, sizeof(bool) * (size_t)nslots);
    ki->grid = (unsigned)(start ? start : 1);
    /* Members own fixed ranges of blocks and stride over their loops:
     * any block size covers them with the same grid. */
    for (int t = 0; t < SG__CUDA_NTUNE; t++) ki->tune_grid[t] = ki->grid;
    return nc > 0;
}

/* A constant table of n 64-bit integers named `name`, eight a line. */
void sg__cuda_table(sg__cuda_gen *g, const char *name, const int64_t *v, int n) {
    sg__emit *e = g->e;
    size_t bytes = sizeof(int64_t) * (size_t)(n > 0 ? n : 1);
    bool cbank = g->sp->ctable && g->ctable_bytes + bytes <= SG__CONST_TABLES;
    g->ctable_bytes += cbank ? bytes : 0;
    sg__emit_line(e, "%s sg_i64 %s[%d] = {", cbank ? g->sp->ctable : g->sp->table, name,
                  n > 0 ? n : 1);
    for (int i = 0; i < n; i++)
        sg__emit_raw(e, "%s%lldLL", i % 8 ? ", " : i ? ",\n" : "", (long long)v[i]);
    sg__emit_raw(e, n > 0 ? "};\n" : "0};\n");
}

void sg__cuda_table_row(sg__cuda_gen *g, const char *first, int n) {
    sg__emit *e = g->e;
    sg__emit_line(e, "int r_a = 0, r_b = %d;", n - 1);
    sg__emit_open(e, "while (r_a < r_b)");
    sg__emit_line(e, "const int r_h = (r_a + r_b + 1) / 2;");
    sg__emit_line(e, "if (%s[r_h] <= (sg_i64)%s) r_a = r_h; else r_b = r_h - 1;", first,
                  g->sp->bid);
    sg__emit_close(e);
}

void sg__cuda_branch(sg__cuda_gen *g, const char *open, void (*body)(sg__cuda_gen *, void *),
                     void *arg) {
    sg__cuda_branch_based(g, open, body, arg, -1, NULL);
}

int sg__cuda_local_slot(sg__cuda_gen *g, int slot) {
    bool *was = g->mark;
    g->mark = NULL;
    int l = lslot(g, slot);
    g->mark = was;
    return l;
}

void sg__cuda_branch_based(sg__cuda_gen *g, const char *open,
                           void (*body)(sg__cuda_gen *, void *), void *arg, int local,
                           const char *base) {
    sg__emit *outer = g->e;
    int nslots = g->ir->nslots ? g->ir->nslots : 1;
    bool *mark = sg__calloc(outer->ctx, sizeof(bool) * (size_t)nslots), *was = g->mark;
    if (!mark) {
        outer->oom = true;
        return;
    }
    g->member_slots = true;
    sg__emit inner = {.ctx = outer->ctx, .depth = outer->depth + 1};
    g->e = &inner, g->mark = mark;
    body(g, arg);
    g->e = outer, g->mark = was;
    sg__emit_open(outer, "%s", open);
    for (int i = 0; i < nslots; i++)
        if (mark[i] && i == local)
            sg__emit_line(outer, "%schar *const s%d = %s;", g->sp->gp, i, base);
        else if (mark[i])
            sg__emit_line(outer, "%schar *const s%d = slot[%d];", g->sp->gp, i, i);
    if (inner.buf) sg__emit_raw(outer, "%s", inner.buf);
    sg__emit_close(outer);
    if (inner.oom) outer->oom = true;
    sg__emit_free(&inner);
    sg__free(outer->ctx, mark, sizeof(bool) * (size_t)nslots);
}

/* The elements one loop of a chain member walks (its data walk, or its
 * pointwise shape), or -1 when it is no loop a chain runs. */
static int64_t chain_walk(const gen *g, const sg__group *part) {
    const sg__irnode *n = NULL;
    if (part->kind == SG__G_OPAQUE) return data_walk(g, part, &n);
    if (part->kind != SG__G_POINTWISE) return -1;
    int64_t numel = numel_of(part->ndim, part->shape);
    return numel > 0 ? numel : -1;
}

/*
 * A chain (sg__group.chain): its members in order in one block, each a
 * loop over the block's threads in its own scope, a block barrier between
 * them (which also makes the global writes of one visible to the next).
 */
static void emit_chain(gen *g, const sg__group *grp, sg__cuda_kinfo *ki, bool *aligned,
                       int nslots) {
    sg__emit *outer = g->e;
    bool *mark = sg__calloc(outer->ctx, sizeof(bool) * (size_t)nslots);
    if (!mark) {
        outer->oom = true;
        return;
    }
    g->member_slots = true; /* each member's scope loads its own slot bases */
    for (int m = 0; m < grp->nmembers; m++) {
        const sg__group *part = &g->f->parts[grp->members[m]];
        const sg__irnode *n = NULL;
        sg__emit body = {.ctx = outer->ctx, .depth = outer->depth + 1};
        memset(mark, 0, sizeof(bool) * (size_t)nslots);
        g->e = &body, g->mark = mark;
        if (part->kind == SG__G_OPAQUE) {
            ki->iters += data_walk(g, part, &n);
            g->walk_blk = "0", g->walk_nblk = "1";
            data_body(g, n);
            g->walk_blk = g->walk_nblk = NULL;
        } else {
            used_slots(g, part, 0);
            ki->iters += numel_of(part->ndim, part->shape);
            emit_loop(g, part, 0, 1, aligned, "0", "1"); /* w 1: no early return */
        }
        g->e = outer, g->mark = NULL;
        if (m) sg__emit_line(outer, "%s", g->sp->sync);
        sg__emit_open(outer, "%s", "");
        for (int i = 0; i < nslots; i++)
            if (mark[i]) sg__emit_line(outer, "%schar *const s%d = slot[%d];", g->sp->gp, i, i);
        if (body.buf) sg__emit_raw(outer, "%s", body.buf);
        sg__emit_close(outer);
        if (body.oom) outer->oom = true;
        sg__emit_free(&body);
    }
    sg__free(outer->ctx, mark, sizeof(bool) * (size_t)nslots);
    ki->grid = 1;
    for (int t = 0; t < SG__CUDA_NTUNE; t++) ki->tune_grid[t] = 1;
}

/*
 * Group grp's kernel body into g->e, its slots numbered through lslot, and
 * its launch into ki; false when the group has no kernel. *what describes
 * the kernel, *gemv says it is a GEMV (which waits for the kernel before it
 * on its own).
 */
static void reset_slots(gen *g, bool global);

static bool emit_group(gen *g, const sg__group *grp, sg__cuda_kinfo *ki, bool *aligned,
                       const char **what, bool *gemv_out) {
    *gemv_out = false;
    /* The library's kernel computes both (sg__group.xent, sg__group.nbsum). */
    if (grp->xent || grp->nbsum) return false;
    if (grp->kind == SG__G_OPAQUE && sg__cgen_serial_wanted(g->d) && sg__cgen_serial(g, grp, ki)) {
        *what = "arange: a work-item per element";
        return true;
    }
    if (grp->kind == SG__G_OPAQUE && sg__cgen_serial_wanted(g->d) &&
        sg__cgen_serial_data(g, grp, ki, what))
        return true;
    if (grp->kind == SG__G_OPAQUE) return emit_data(g, grp, ki, what);
    gemv p;
    bool is_gemv = gemv_plan(g, grp, &p);
    if (is_gemv && p.am && !g->sp->shuffles) { /* SG_GEMV_ARGMAX=1 merged it */
        g->unsupported = "argmax merged into a GEMV (SG_GEMV_ARGMAX=1)";
        return false;
    }
    /* Products merged for a GEMV kernel (a pair, segments) have no other
     * kernel: the library would run the first alone. */
    if (!is_gemv && grp->kind == SG__G_MATMUL && (grp->anchor2 || grp->nseg)) {
        g->unsupported =
            "matmuls of one x merged for a GEMV kernel that the dialect's plan refused";
        return false;
    }
    int from = grp->anchor >= 0 ? grp->anchor + 1 : 0;
    /* A MATMUL group no GEMV kernel takes: the generated GEMM, where the
     * dialect wants it (cgen_gemm.c). */
    if (grp->kind == SG__G_MATMUL && !is_gemv &&
        sg__cgen_gemm_wanted(g->d)) {
        g->anchor_reg = true;
        used_slots(g, grp, 0);
        const char *taken = sg__cgen_gemm(g, grp, ki);
        g->anchor_reg = false;
        if (taken) {
            *what = taken;
            return true;
        }
        reset_slots(g, g->global);
    }
    /* A library anchor, where the dialect has no library (cgen_serial.c). */
    if (!is_gemv && sg__cgen_serial_wanted(g->d) &&
        (grp->kind == SG__G_REDUCE || grp->kind == SG__G_ROW) && !grp->rows_inline) {
        g->anchor_reg = true;
        used_slots(g, grp, 0);
        bool taken = sg__cgen_serial(g, grp, ki);
        g->anchor_reg = false;
        if (taken) {
            *what = "a work-item per output element walking its inputs, then the epilogue";
            return true;
        }
        reset_slots(g, g->global);
    }
    *gemv_out = is_gemv;
    bool is_row = !is_gemv && grp->rows_inline; /* cgen_cuda_row.c computes the anchor */
    if (!is_gemv && !is_row && grp->kind != SG__G_MULTI &&
        (from >= grp->n || numel_of(grp->ndim, grp->shape) == 0))
        return false;
    int nslots = g->ir->nslots ? g->ir->nslots : 1;
    if (is_gemv) {
        g->anchor_reg = true;
        used_slots(g, grp, 0);
        lslot(g, p.o->slot);
        if (p.o2) lslot(g, p.o2->slot);
        for (int j = 0; j < p.nseg; j++) lslot(g, p.so[j]->slot);
        ki->grid = emit_gemv(g, grp, &p);
        ki->iters = p.n;
        /* Warps per block vary, except where the norm's team is the block or
         * the block's warps share words sized for BLOCK (split K, argmax). */
        for (int t = 0; t < SG__CUDA_NTUNE && p.along_k && !p.norm && p.ks == 1 && !p.am; t++)
            ki->tune_grid[t] =
                (unsigned)((p.n + (128 << t) / 32 * p.cols - 1) / ((128 << t) / 32 * p.cols));
        ki->replaces_call = true;
        *what = p.norm      ? (p.along_k ? "norm rows into shared memory, then GEMV, a warp per "
                                           "output column, then the epilogue"
                                         : "norm rows into shared memory, then GEMV, a thread "
                                           "per output column, then the epilogue")
                : p.ks > 1  ? "GEMV, a group of warps per output column each summing a slice of "
                              "K, the slices added in shared memory, then the epilogue"
                : p.along_k ? "GEMV, a warp per output column, then the epilogue"
                            : "GEMV, a thread per output column, then the epilogue";
    } else if (is_row) {
        g->anchor_reg = true;
        used_slots(g, grp, 0);
        g->anchor_reg = false;
        *what = sg__cgen_cuda_rows(g, grp, ki);
    } else if (grp->kind == SG__G_MULTI && grp->sums) {
        *what = sg__cgen_cuda_sums(g, grp, ki);
    } else if (grp->kind == SG__G_MULTI && grp->chain) {
        emit_chain(g, grp, ki, aligned, nslots);
        *what = "dependent loops in order in one block, a barrier between them";
    } else if (grp->kind == SG__G_MULTI) {
        *what = emit_multi(g, grp, ki, aligned, nslots)
                    ? "independent loops, each over its own range of blocks, those of one code "
                      "sharing it (their slots, lengths and blocks by table row)"
                    : "independent loops, each over its own range of blocks";
    } else {
        used_slots(g, grp, from);
        int w = vec_width(g, grp, from, aligned);
        ki->grid = loop_blocks(grp, w, BLOCK, GRID_CAP);
        for (int t = 0; t < SG__CUDA_NTUNE; t++)
            ki->tune_grid[t] = loop_blocks(grp, w, 128 << t, GRID_CAP);
        ki->iters = numel_of(grp->ndim, grp->shape);
        emit_loop(g, grp, from, w, aligned, g->sp->bid, g->sp->gdim);
        *what = grp->kind == SG__G_POINTWISE ? "pointwise" : "epilogue after a library call";
    }
    g->anchor_reg = false;
    if (!ki->block) ki->block = BLOCK; /* row kernels set theirs */
    return true;
}

/* The threads a kernel is compiled for: any block size max-autotune tries. */
static int launch_bound(const sg__cuda_kinfo *ki) { return ki->tune_grid[0] ? MAX_BLOCK : BLOCK; }

/* The launch bounds after __launch_bounds__: a MULTI kernel also asks for
 * three blocks of the most threads per SM (at most 42 registers), which its
 * large members' streaming loops need to keep enough loads in flight; a
 * member with many merged params spills a little instead (AdamW over
 * GPT-2 124M: 1.26 ms against 1.74 ms at 108 registers, on an H100). */
static const char *launch_bounds(const sg__group *grp, const sg__cuda_kinfo *ki, char *buf,
                                 size_t size) {
    snprintf(buf, size, grp->kind == SG__G_MULTI ? "%d, 3" : "%d", launch_bound(ki));
    return buf;
}

/* The kernel's name: its ops, dtype and shape, and 48 bits of the SHA-256
 * of its text (head: everything before the body). */
static void kernel_name(const gen *g, const sg__group *grp, const sg__emit *head,
                        const sg__emit *top, const sg__emit *body, sg__cuda_kinfo *ki) {
    char ops[96], sh[64] = "", hex[65];
    sg__group_name(g->ir, grp, ops, sizeof ops);
    if (strlen(ops) > 48) ops[48] = '\0';
    size_t q = 0;
    for (int d = 0; d < grp->ndim && q < sizeof sh; d++)
        q +=
            (size_t)snprintf(sh + q, sizeof sh - q, d ? "x%lld" : "%lld", (long long)grp->shape[d]);
    const sg__group *tail = grp->kind == SG__G_MULTI ? &g->f->parts[grp->members[0]] : grp;
    sg_dtype dt = g->ir->refs[g->ir->nodes[tail->g[tail->n - 1].node].out].dtype;
    sg__sha256_ctx c;
    uint8_t d[32];
    char lb[32];
    char lbs[32];
    int nlb =
        snprintf(lb, sizeof lb, "__launch_bounds__(%s)\n", launch_bounds(grp, ki, lbs, sizeof lbs));
    sg__sha256_init(&c);
    sg__sha256_update(&c, lb, (size_t)nlb);
    if (head->buf) sg__sha256_update(&c, head->buf, head->len);
    if (top->buf) sg__sha256_update(&c, top->buf, top->len);
    if (body->buf) sg__sha256_update(&c, body->buf, body->len);
    sg__sha256_final(&c, d);
    sg__sha256_hex(d, hex);
    snprintf(ki->name, sizeof ki->name, "sg_%.48s_%s_%.24s_%.12s", ops, sg_dtype_name(dt),
             sh[0] ? sh : "1", hex);
}

/* Forget the slot numbers of the last kernel; the next is numbered
 * globally or locally. */
static void reset_slots(gen *g, bool global) {
    for (int s = 0; s < g->ir->nslots; s++) g->loc[s] = -1;
    g->nloc = 0;
    g->global = global;
    g->overflow = false;
    g->member_slots = false;
}

/* SG_CUDA_STAMPS=N (N > 0): every generated CUDA kernel stamps, on the
 * global timer, when its blocks begin, when their wait for the kernel before
 * returns and when its warps end, into a table of the unit keyed by the
 * launch's slot table; the executor reads N replays back and prints each
 * launch's times (graphs/cuda/cuda_graph.c). A GEMV also marks when its
 * norm's rows are ready (mark 0) and when its sums are, before the epilogue
 * (mark 1). A measuring aid: the stamps are atomics on every block's path. */
int sg__cuda_stamps(void) {
    const char *e = getenv("SG_CUDA_STAMPS");
    long n = e && e[0] ? atol(e) : 0;
    return n > 0 ? (int)(n > 100000 ? 100000 : n) : 0;
}

/* The stamps' table and recorder, after the preamble. A kernel declares a
 * recorder first (its destructor stamps each warp's end on every return
 * path) and its sg_pdl_wait() becomes the recorder's. */
static const char *const stamp_prelude =
    "#define SG_STAMP_N " SG__STAMP_N_TEXT "\n"
    "__device__ sg_u64 sg_stamp_buf[SG_STAMP_N * 8];\n"
    "SG_DEV sg_u64 sg_stamp_now(void) {\n"
    "    sg_u64 t;\n"
    "    asm volatile(\"mov.u64 %0, %%globaltimer;\" : \"=l\"(t));\n"
    "    return t;\n"
    "}\n"
    "struct sg_stamper {\n"
    "    sg_u64 *e;\n"
    "    __device__ sg_stamper(char *const *slot) {\n"
    "        e = sg_stamp_buf + (((sg_u64)slot >> 3) & (SG_STAMP_N - 1)) * 8;\n"
    "        if (threadIdx.x == 0) {\n"
    "            const sg_u64 t = sg_stamp_now();\n"
    "            atomicMax(e, ~t);\n"
    "            atomicMax(e + 1, t);\n"
    "        }\n"
    "    }\n"
    "    __device__ void wait(void) {\n"
    "        sg_pdl_wait();\n"
    "        if (threadIdx.x == 0) {\n"
    "            const sg_u64 t = sg_stamp_now();\n"
    "            atomicMax(e + 2, ~t);\n"
    "            atomicMax(e + 3, t);\n"
    "        }\n"
    "    }\n"
    "    __device__ void mark(int n) {\n"
    "        if (threadIdx.x == 0) atomicMax(e + 6 + n, sg_stamp_now());\n"
    "    }\n"
    "    __device__ ~sg_stamper() {\n"
    "        if ((threadIdx.x & 31) == 0) atomicMax(e + 4, sg_stamp_now());\n"
    "        if (threadIdx.x == 0) atomicAdd(e + 5, 1ull);\n"
    "    }\n"
    "};\n"
    "#define sg_pdl_wait() sg_stamp_.wait()\n";

/* The opening of a kernel after its signature: the slot bases and the
 * dependent-launch calls. */
static void kernel_head(gen *g, bool is_gemv, sg__emit *head) {
    if (g->stamps) sg__emit_line(head, "    sg_stamper sg_stamp_(slot);");
    int n = g->member_slots ? 0 : g->global ? g->ir->nslots : g->nloc;
    for (int i = 0; i < n; i++)
        if (!g->global || g->loc[i] >= 0)
            sg__emit_line(head, "    %schar *const s%d = slot[%d];", g->sp->gp, i, i);
    sg__emit_line(head, "    sg_pdl_launch();");
    if (!is_gemv) sg__emit_line(head, "    sg_pdl_wait();");
}

/* Group k's kernel into g->e (and its launch into kinfo[k]), or nothing; a
 * kernel whose text an earlier group's has is named, not emitted again. */
static void emit_kernel(gen *g, const sg__group *grp, int k, sg__cuda_kinfo *kinfo) {
    sg__cuda_kinfo *ki = &kinfo[k];
    memset(ki, 0, sizeof *ki);
    int nslots = g->ir->nslots ? g->ir->nslots : 1;
    bool *aligned = sg__calloc(g->e->ctx, sizeof(bool) * (size_t)nslots);
    if (!aligned) {
        g->e->oom = true;
        return;
    }
    sg__emit body = {.ctx = g->e->ctx}, head = {.ctx = g->e->ctx}, top = {.ctx = g->e->ctx};
    sg__emit *outer = g->e;
    const char *what = "";
    bool is_gemv = false, has = false;
    for (int global = 0; global < 2; global++) { /* the global numbering when too many slots */
        reset_slots(g, global);
        memset(ki, 0, sizeof *ki);
        memset(aligned, 0, sizeof(bool) * (size_t)nslots);
        sg__emit_free(&body);
        sg__emit_free(&top);
        body = (sg__emit){.ctx = outer->ctx, .depth = 1};
        top = (sg__emit){.ctx = outer->ctx, .depth = 1};
        g->e = &body;
        g->top = &top;
        g->ntree_f = g->ntree_i = 0;
        g->unsupported = NULL;
        has = emit_group(g, grp, ki, aligned, &what, &is_gemv);
        g->e = outer;
        g->top = NULL;
        if (!g->overflow) break;
    }
    /* The row kernels write CUDA's literal suffixes. */
    body.len = sg__lower_literals(g->d, body.buf, body.len);
    if (body.buf) body.buf[body.len] = '\0';
    ki->unsupported = g->unsupported != NULL;
    if (has) {
        kernel_head(g, is_gemv, &head);
        kernel_name(g, grp, &head, &top, &body, ki);
        ki->nlocal = g->global ? -1 : g->nloc;
        memcpy(ki->local, g->locals, sizeof(int) * (size_t)(g->global ? 0 : g->nloc));
        const sg__cuda_kinfo *same = NULL;
        for (int j = 0; j < k && !same; j++)
            if (kinfo[j].emitted && strcmp(kinfo[j].name, ki->name) == 0) same = &kinfo[j];
        ki->emitted = same == NULL;
        if (same) {
            sg__emit_line(g->e, "/* kernel %d (IR lines %d..%d): %s, as above */", k, grp->first,
                          grp->last, ki->name);
        } else {
            ki->text_at = g->e->len;
            kernel_comment(g, grp, k, ki, what);
            char lbs[32], lb[64] = "";
            if (g->sp->launch_bounds)
                snprintf(lb, sizeof lb, "__launch_bounds__(%s) ",
                         launch_bounds(grp, ki, lbs, sizeof lbs));
            sg__emit_line(g->e, "%s %s%s(%schar *%sconst *slot) {", g->sp->kernel, lb, ki->name,
                          g->sp->gp, g->sp->gp);
            if (head.buf) sg__emit_raw(g->e, "%s", head.buf);
            if (top.buf) sg__emit_raw(g->e, "%s", top.buf);
            if (body.buf) sg__emit_raw(g->e, "%s", body.buf);
            sg__emit_line(g->e, "}");
            ki->text_len = g->e->len - ki->text_at;
        }
        sg__emit_line(g->e, "%s", "");
    }
    if (body.oom || head.oom || top.oom) g->e->oom = true;
    sg__emit_free(&head);
    sg__emit_free(&top);
    sg__emit_free(&body);
    sg__free(g->e->ctx, aligned, sizeof(bool) * (size_t)nslots);
}

/* ------------------------------------------------------------ for cgen_cuda_row.c */

sg__emit *sg__cuda_out(sg__cuda_gen *g) { return g->e; }

const sg__ref *sg__cuda_ref(const sg__cuda_gen *g, int r) { return ref_of(g, r); }

const sg__ref *sg__cuda_arg(const sg__cuda_gen *g, const sg__irnode *n, int j) {
    return arg_of(g, n, j);
}

const sg__ir *sg__cuda_ir(const sg__cuda_gen *g) { return g->ir; }

const sg__fused *sg__cuda_fused(const sg__cuda_gen *g) { return g->f; }

/* Row kernels spell values as CUDA's (HIP's and OpenCL C's preambles have
 * the same helpers: sg_bf_rt, sg_h_rt). */
void sg__cuda_widen(sg_dtype dt, const char *lv, char *buf, size_t size) {
    sg__lower_widen(SG__DIALECT_CUDA, dt, lv, buf, size);
}

void sg__cuda_narrow_store(sg_dtype dt, const char *lv, const char *v, char *buf, size_t size) {
    sg__lower_narrow_store(SG__DIALECT_CUDA, dt, lv, v, buf, size);
}

void sg__cuda_round_trip(const char *e, sg_dtype dt, char *buf, size_t size) {
    sg__lower_round_trip(SG__DIALECT_CUDA, e, true, dt, buf, size);
}

bool sg__cuda_walk_flat(const sg__cuda_gen *g, const sg__group *grp, int from, int to, int nd,
                        const int64_t *shape, const sg__ref *extra) {
    sg__group part = *grp;
    part.n = to;
    bool flat = group_flat(g, &part, from, nd, shape);
    return flat && (!extra || sg__lower_flat_ok(extra, nd, shape));
}

void sg__cuda_lvalue_at(sg__cuda_gen *g, const sg__ref *r, const char *off, char *buf,
                        size_t size) {
    snprintf(buf, size, "((%s%s *)s%d)[%s]", g->sp->gp, sg__lower_ctype(g->d, r->dtype),
             lslot(g, r->slot), off);
}

void sg__cuda_lvalue(sg__cuda_gen *g, const sg__ref *r, int nd, const int64_t *shape,
                     bool flat, char *buf, size_t size) {
    char off[256];
    offset_expr(r, nd, shape, flat ? IX_FLAT : IX_NESTED, off, sizeof off);
    sg__cuda_lvalue_at(g, r, off, buf, size);
}

void sg__cuda_unflatten(sg__cuda_gen *g, int nd, const int64_t *shape) {
    emit_unflatten(g, nd, shape);
}

void sg__cuda_members(sg__cuda_gen *g, const sg__group *grp, int from, int to, int nd,
                      const int64_t *shape, bool flat) {
    sg__group part = *grp;
    part.n = to;
    bool reg = g->anchor_reg;
    g->anchor_reg = true;
    emit_body(g, &part, from, nd, shape, flat ? IX_FLAT : IX_NESTED, 1);
    g->anchor_reg = reg;
}

sg__emit *sg__cuda_set_out(sg__cuda_gen *g, sg__emit *e) {
    sg__emit *old = g->e;
    g->e = e;
    return old;
}

void sg__cuda_defer_begin(sg__cuda_gen *g, sg__emit *decl, sg__emit *later, int n) {
    g->defer_decl = decl;
    g->defer_st = later;
    g->defer_n = n;
    g->ndefer = 0;
}

void sg__cuda_defer_end(sg__cuda_gen *g) {
    g->defer_decl = g->defer_st = NULL;
    g->ndefer = 0;
}

void sg__cuda_store(sg__cuda_gen *g, bool fl, int k, const char *st) { store_stmt(g, fl, k, st); }

const sg__spell *sg__cuda_spell(const sg__cuda_gen *g) { return g->sp; }

void sg__cuda_shared(sg__cuda_gen *g, int align, const char *fmt, ...) {
    char decl[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(decl, sizeof decl, fmt, ap);
    va_end(ap);
    const char *q = g->sp->shared;
    sg__emit *e = g->sp->shared_top && g->top ? g->top : g->e;
    if (!align)
        sg__emit_line(e, "%s %s;", q, decl);
    else if (g->sp->shared_top)
        sg__emit_line(e, "%s %s __attribute__((aligned(%d)));", q, decl, align);
    else
        sg__emit_line(e, "%s alignas(%d) %s;", q, align, decl);
}

/* Team array i of type t (float or sg_i64) at the kernel's outermost
 * scope, a word per thread, declared on first use. */
static void tree_array(gen *g, const char *t, int i, char *name, size_t size) {
    bool fl = strcmp(t, "float") == 0;
    int *have = fl ? &g->ntree_f : &g->ntree_i;
    snprintf(name, size, fl ? "r_lf%d" : "r_li%d", i);
    for (; *have <= i; (*have)++)
        sg__cuda_shared(g, 0, "%s %s%d[%d]", t, fl ? "r_lf" : "r_li", *have, MAX_BLOCK);
}

void sg__cuda_tree(sg__cuda_gen *g, int nv, const char *const *type, const char *const *var,
                   const char *const *other, const char *fold, int warps) {
    char arr[4][16];
    int nf = 0, ni = 0;
    nv = nv < 4 ? nv : 4;
    for (int v = 0; v < nv; v++)
        tree_array(g, type[v], strcmp(type[v], "float") == 0 ? nf++ : ni++, arr[v], sizeof arr[v]);
    sg__emit *e = g->e;
    sg__emit_open(e, "%s", "");
    sg__emit_line(e, "const int r_l = %s;", g->sp->tid);
    for (int v = 0; v < nv; v++) sg__emit_line(e, "%s[r_l] = %s;", arr[v], var[v]);
    sg__emit_line(e, "%s", g->sp->sync);
    /* Round o: lane j < o of each 32 takes lane j + o's value, as lane j's
     * shuffle by o does (lane j + o's result equals lane j's: only j's is kept). */
    sg__emit_open(e, "for (int o = 16; o > 0; o >>= 1)");
    sg__emit_open(e, "if ((r_l & 31) < o)");
    for (int v = 0; v < nv; v++)
        sg__emit_line(e, "const %s %s = %s[r_l + o];", type[v], other[v], arr[v]);
    sg__emit_line(e, "%s", fold);
    for (int v = 0; v < nv; v++) sg__emit_line(e, "%s[r_l] = %s;", arr[v], var[v]);
    sg__emit_close(e);
    sg__emit_line(e, "%s", g->sp->sync);
    sg__emit_close(e);
    if (warps > 1) { /* the warps' results in warp order, as the shared words are */
        for (int v = 0; v < nv; v++) sg__emit_line(e, "%s = %s[0];", var[v], arr[v]);
        sg__emit_open(e, "for (int w = 1; w < %d; w++)", warps);
        for (int v = 0; v < nv; v++)
            sg__emit_line(e, "const %s %s = %s[w * 32];", type[v], other[v], arr[v]);
        sg__emit_line(e, "%s", fold);
        sg__emit_close(e);
    } else {
        for (int v = 0; v < nv; v++) sg__emit_line(e, "%s = %s[r_l & ~31];", var[v], arr[v]);
    }
    sg__emit_line(e, "%s", g->sp->sync); /* before the arrays are written again */
    sg__emit_close(e);
}
sg__dialect sg__cuda_dialect(const sg__cuda_gen *g) { return g->d; }

int sg__cuda_slot(sg__cuda_gen *g, int s) { return lslot(g, s); }

/* ------------------------------------------------------------ the unit */

/* sg__fuse_opts.gemv_rows: a norm merged into a matmul group, a pair of
 * matmuls on one x or its segments, cache writes or an argmax after it, is one GEMV kernel
 * here (gemv_plan on the merged group). */
static bool gemv_rows(const sg__ir *ir, const int *alias, const sg__group *merged) {
    sg__fused f = {.alias = (int *)alias};
    gen g = {.ir = ir, .f = &f, .d = SG__DIALECT_CUDA, .sp = sg__spell_of(SG__DIALECT_CUDA)};
    gemv p;
    /* An argmax merged into the GEMV: only with SG_GEMV_ARGMAX=1 until it is
     * measured faster than its own kernel (bench/NOTES.md, W3). */
    const char *am = getenv("SG_GEMV_ARGMAX");
    if (merged->argmax && !(am && atoi(am) == 1)) return false;
    return gemv_plan(&g, merged, &p) &&
           (p.norm || p.w2 || p.nseg || merged->ncopies || merged->argmax);
}

/* sg__fuse_opts.chain: a pointwise loop or a generated data op (a MULTI of
 * them) of at most CHAIN_MAX elements in all, which one block runs in a few
 * passes (a MULTI's members, which ran side by side, run one by one). */
static bool chain_takes(const sg__ir *ir, const sg__fused *f, const sg__group *grp) {
    gen g = {.ir = ir, .f = f, .d = SG__DIALECT_CUDA, .sp = sg__spell_of(SG__DIALECT_CUDA)};
    int nl = grp->kind == SG__G_MULTI ? grp->nmembers : 1;
    int64_t total = 0;
    if (grp->kind == SG__G_MULTI && grp->chain) return false;
    for (int m = 0; m < nl; m++) {
        const sg__group *part = grp->kind == SG__G_MULTI ? &f->parts[grp->members[m]] : grp;
        int64_t numel = chain_walk(&g, part);
        if (numel < 1) return false;
        total += numel;
    }
    return total <= CHAIN_MAX;
}

void sg__cgen_cuda_fuse_opts(sg__fuse_opts *o, bool disable) {
    memset(o, 0, sizeof *o);
    o->disable = disable;
    o->horizontal = true;
    o->no_prologue = true;
    o->rows_inline = true;
    o->horizontal_data = true;
    o->gemv_rows = gemv_rows;
    o->chain = chain_takes;
    o->multi_sums = true;
    o->multi_ready = true;
}

sg_status sg__cgen_gpu(sg_ctx *ctx, const sg__ir *ir, const sg__fused *f, const char *title,
                       sg__dialect d, sg__emit *e, sg__cuda_kinfo *kinfo, int *nkernels) {
    const sg__spell *sp = sg__spell_of(d);
    if (!sp->kernel)
        return sg__fail(ctx, SG_ERR_INVALID_ARG,
                        "codegen: %s is no GPU dialect; sg__cgen_c writes the C unit", sp->name);
    gen g = {.ir = ir, .f = f, .e = e, .d = d, .sp = sp};
    g.stamps = d == SG__DIALECT_CUDA && sg__cuda_stamps() > 0; /* HIP's table has no stamps */
    g.loc = sg__calloc(ctx, sizeof(int) * (size_t)(ir->nslots ? ir->nslots : 1));
    if (!g.loc)
        return sg__fail(ctx, SG_ERR_OOM, "codegen: out of host memory for the %s source", sp->name);
    sg__emit_line(e, "/* stepgraph: %s -- %d groups for %d IR ops (generated; %s) */", title,
                  f->ngroups, ir->nnodes, sp->name);
    sg__lower_preamble(d, e);
    sg__cgen_serial_data_prelude(d, ir, e);
    if (g.stamps) sg__emit_raw(e, "%s", stamp_prelude);
    sg__emit_raw(e, "\n");
    int nk = 0, nun = 0, first = -1;
    const char *op = "";
    for (int k = 0; k < f->ngroups; k++) {
        emit_kernel(&g, &f->groups[k], k, kinfo);
        nk += kinfo[k].name[0] != '\0';
        if (kinfo[k].unsupported && nun++ == 0) first = k, op = g.unsupported;
    }
    sg__free(ctx, g.loc, sizeof(int) * (size_t)(ir->nslots ? ir->nslots : 1));
    if (e->oom)
        return sg__fail(ctx, SG_ERR_OOM, "codegen: out of host memory for the %s source", sp->name);
    *nkernels = nk;
    if (nun)
        return sg__fail(ctx, SG_ERR_UNSUPPORTED,
                        "codegen: group %d (IR lines %d..%d, %s) needs a row or GEMV kernel, which "
                        "is not yet in the %s dialect (%d such groups of %d; the unit holds the "
                        "others' kernels); run this capture on the CPU or CUDA backend",
                        first, f->groups[first].first, f->groups[first].last, op, sp->name, nun,
                        f->ngroups);
    return SG_OK;
}

sg_status sg__cgen_cuda(sg_ctx *ctx, const sg__ir *ir, const sg__fused *f, const char *title,
                        sg__emit *e, sg__cuda_kinfo *kinfo, int *nkernels) {
    return sg__cgen_gpu(ctx, ir, f, title, SG__DIALECT_CUDA, e, kinfo, nkernels);
}
