/* SPDX-License-Identifier: MIT */
/*
 * cgen_serial_data.c -- the data ops a library kernel runs on CUDA
 * (graphs/cuda/k_data.cu), as generated code for dialects that have no
 * such library (sg__cgen_serial_wanted: OpenCL C, Level Zero): the random
 * draws (rand, randn), topk's indices, sample and multinomial, gather, and
 * the index_add of embedding and index_select gradients. Each is computed
 * as the CPU backend computes it (graphs/cpu/cpu_random.c, cpu_sample.c,
 * cpu_data.c), so that the same seed gives the same numbers and ties fall
 * the same way on every backend:
 *   rand: a work-item per Philox 4x32-10 block, the CPU's element mapping
 *         (uniform from the top bits of a word, normal by Box-Muller in
 *         double, rounded to odd first for f16 and bf16);
 *   topk: a work-item per output element; the s-th entry of a row in the
 *         order (value, largest first, NaN above all, ties by index) is the
 *         boundary of the first s + 1 entries, found by the CPU's 32-pass
 *         radix search on the order key;
 *   sample: a work-item per row, the CPU's selection step for step (f64
 *         weights as the row's integers, exact sums, the row's uniform from
 *         Philox block offset + row);
 *   gather: a work-item per output element (an index out of range, which
 *         the host check rules out before an eager launch, writes zero);
 *   index_add: a work-item per lane (a position off dim) adds src's rows
 *         in index order (f32: rounding after each, the CPU's sequential
 *         loop); into f16 or bf16 each index's first position adds every
 *         row of that index in position order in f32 and stores once, as
 *         the CPU does: no atomics, the same bits every launch. (Without a
 *         sort that costs up to count^2 / 2 index reads a lane.)
 * The Philox and sampling helpers go once into a unit that uses them
 * (sg__cgen_serial_data_prelude); sample and randn need the device's f64
 * (cl_khr_fp64).
 */
#include "codegen.h"

#include <stdio.h>
#include <string.h>

#define THREADS 256
#define GRID_MAX 65535

/* The helpers, after the dialect's preamble (sg_h2f, sg_bf2f, sg_u32). */
static const char *const helpers =
    "/* Random draws and sampling: graphs/cpu/cpu_random.c and cpu_sample.c step for step. */\n"
    "#ifdef cl_khr_fp64\n"
    "#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n"
    "#endif\n"
    "/* Philox 4x32-10 of counter c under key (k0, k1). */\n"
    "static inline uint4 sg_philox(uint4 c, sg_u32 k0, sg_u32 k1) {\n"
    "    for (int r = 0; r < 10; r++) {\n"
    "        if (r > 0) k0 += 0x9E3779B9u, k1 += 0xBB67AE85u;\n"
    "        const sg_u32 hi0 = mul_hi(0xD2511F53u, c.x), lo0 = 0xD2511F53u * c.x;\n"
    "        const sg_u32 hi1 = mul_hi(0xCD9E8D57u, c.z), lo1 = 0xCD9E8D57u * c.z;\n"
    "        c = (uint4)(hi1 ^ c.y ^ k0, lo1, hi0 ^ c.w ^ k1, lo0);\n"
    "    }\n"
    "    return c;\n"
    "}\n"
    "/* U[0, 1) from the top `bits` of a word, exact in the dtype. */\n"
    "static inline float sg_rand_uniform(sg_u32 w, int bits) {\n"
    "    return (float)(w >> (32 - bits)) * as_float((sg_u32)(127 - bits) << 23);\n"
    "}\n"
    "#ifdef cl_khr_fp64\n"
    "/* Box-Muller in double, rounded once to float, or to odd (odd: the later\n"
    " * f16/bf16 rounding is then single). */\n"
    "static inline float sg_rand_normal(sg_u32 w0, sg_u32 w1, int odd) {\n"
    "    const double u1 = ((double)w0 + 1.0) * 2.3283064365386963e-10;\n"
    "    const double u2 = (double)w1 * 2.3283064365386963e-10;\n"
    "    const double z = sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);\n"
    "    if (!odd) return (float)z;\n"
    "    float f = convert_float_rtz(z);\n"
    "    if ((double)f != z && !(as_uint(f) & 1u)) f = as_float(as_uint(f) + 1u);\n"
    "    return f;\n"
    "}\n"
    "#endif\n"
    "/* A row of V elements of dtype dt (0 f32, 1 f16, 2 bf16) from p. */\n"
    "typedef struct { __global const void *p; int dt; sg_i64 V; } sg_srow;\n"
    "typedef struct { sg_u32 key; sg_i64 idx; } sg_sbound;\n"
    "static inline float sg_row_at(sg_srow r, sg_i64 j) {\n"
    "    if (r.dt == 0) return ((__global const float *)r.p)[j];\n"
    "    const sg_u16 h = ((__global const sg_u16 *)r.p)[j];\n"
    "    return r.dt == 1 ? sg_h2f(h) : sg_bf2f(h);\n"
    "}\n"
    "/* The order key: larger floats larger keys, NaN the largest, -0 == +0. */\n"
    "static inline sg_u32 sg_okey(float v) {\n"
    "    if (v != v) return 0xffffffffu;\n"
    "    if (v == 0.0f) v = 0.0f;\n"
    "    const sg_u32 u = as_uint(v);\n"
    "    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);\n"
    "}\n"
    "static inline int sg_kept(sg_sbound b, sg_u32 key, sg_i64 j) {\n"
    "    return key > b.key || (key == b.key && j <= b.idx);\n"
    "}\n"
    "/* The boundary of the first k entries of the order (1 <= k <= V): the k-th. */\n"
    "static sg_sbound sg_topk_bound(sg_srow r, sg_i64 k) {\n"
    "    sg_u32 t = 0;\n"
    "    for (int bit = 31; bit >= 0; bit--) {\n"
    "        const sg_u32 cand = t | (1u << bit);\n"
    "        sg_i64 cnt = 0;\n"
    "        for (sg_i64 j = 0; j < r.V; j++) cnt += sg_okey(sg_row_at(r, j)) >= cand;\n"
    "        if (cnt >= k) t = cand;\n"
    "    }\n"
    "    sg_i64 gt = 0, need, j;\n"
    "    for (j = 0; j < r.V; j++) gt += sg_okey(sg_row_at(r, j)) > t;\n"
    "    need = k - gt;\n"
    "    for (j = 0; j < r.V && need > 0; j++)\n"
    "        if (sg_okey(sg_row_at(r, j)) == t && --need == 0) break;\n"
    "    sg_sbound b = {t, j};\n"
    "    return b;\n"
    "}\n"
    "#ifdef cl_khr_fp64\n"
    "typedef struct { int kind; double temp, max, wmax, scale; } sg_wparams;\n"
    "static inline double sg_weight(sg_wparams w, float x) {\n"
    "    if (w.kind == 0) return x > 0 ? ((double)x < 1e300 ? (double)x : 1e300) : 0.0;\n"
    "    return exp(((double)x - w.max) / w.temp);\n"
    "}\n"
    "/* The weight as the row's integer, floor(w / W 2^S) (cpu_sample.c). */\n"
    "static inline sg_u64 sg_qweight(sg_wparams w, float x) {\n"
    "    const double v = sg_weight(w, x);\n"
    "    return v > 0 ? (sg_u64)(v / w.wmax * w.scale) : (sg_u64)0;\n"
    "}\n"
    "static sg_u64 sg_mass_from(sg_srow r, sg_wparams w, sg_sbound kb, sg_u32 lo, int strict) {\n"
    "    sg_u64 m = 0;\n"
    "    for (sg_i64 j = 0; j < r.V; j++) {\n"
    "        const float x = sg_row_at(r, j);\n"
    "        const sg_u32 key = sg_okey(x);\n"
    "        if (sg_kept(kb, key, j) && (strict ? key > lo : key >= lo)) m += sg_qweight(w, x);\n"
    "    }\n"
    "    return m;\n"
    "}\n"
    "static sg_sbound sg_topp_bound(sg_srow r, sg_wparams w, sg_sbound kb, double target) {\n"
    "    sg_u32 t = 0;\n"
    "    for (int bit = 31; bit >= 0; bit--) {\n"
    "        const sg_u32 cand = t | (1u << bit);\n"
    "        if ((double)sg_mass_from(r, w, kb, cand, 0) >= target) t = cand;\n"
    "    }\n"
    "    sg_u64 acc = sg_mass_from(r, w, kb, t, 1);\n"
    "    sg_i64 j, last = -1;\n"
    "    for (j = 0; j < r.V; j++) {\n"
    "        const float x = sg_row_at(r, j);\n"
    "        if (sg_okey(x) != t || !sg_kept(kb, t, j)) continue;\n"
    "        last = j;\n"
    "        acc += sg_qweight(w, x);\n"
    "        if ((double)acc >= target) break;\n"
    "    }\n"
    "    sg_sbound b = {t, j < r.V ? j : last};\n"
    "    return b;\n"
    "}\n"
    "/* The index drawn for row r by uniform u (kind 0 weights, 1 logits). */\n"
    "static sg_i64 sg_sample_row(sg_srow r, int kind, sg_i64 top_k, double temp, double top_p,\n"
    "                            double u) {\n"
    "    sg_i64 first_max = 0;\n"
    "    sg_u32 best = 0;\n"
    "    for (sg_i64 j = 0; j < r.V; j++) {\n"
    "        const sg_u32 key = sg_okey(sg_row_at(r, j));\n"
    "        if (key > best || j == 0) best = key, first_max = j;\n"
    "    }\n"
    "    sg_wparams w = {kind, temp, (double)sg_row_at(r, first_max), 0.0, 1.0};\n"
    "    for (sg_i64 j = 0; j < r.V; j++) {\n"
    "        const double v = sg_weight(w, sg_row_at(r, j));\n"
    "        if (v > w.wmax) w.wmax = v;\n"
    "    }\n"
    "    int bits = 0;\n"
    "    while (bits < 62 && ((sg_u64)r.V >> bits) != 0) bits++;\n"
    "    for (int b = bits; b < 62; b++) w.scale *= 2.0; /* 2^(62 - bits(V)) */\n"
    "    sg_sbound kb = {0u, r.V};\n"
    "    if (kind == 1 && top_k > 0 && top_k < r.V) kb = sg_topk_bound(r, top_k);\n"
    "    if (kind == 1 && top_p < 1)\n"
    "        kb = sg_topp_bound(r, w, kb, top_p * (double)sg_mass_from(r, w, kb, 0u, 0));\n"
    "    const sg_u64 total = w.wmax > 0 ? sg_mass_from(r, w, kb, 0u, 0) : (sg_u64)0;\n"
    "    const double target = u * (double)total;\n"
    "    sg_u64 cum = 0;\n"
    "    sg_i64 pick = -1;\n"
    "    for (sg_i64 j = 0; j < r.V && total > 0; j++) {\n"
    "        const float x = sg_row_at(r, j);\n"
    "        if (!sg_kept(kb, sg_okey(x), j)) continue;\n"
    "        const sg_u64 q = sg_qweight(w, x);\n"
    "        if (q > 0) pick = j;\n"
    "        cum += q;\n"
    "        if ((double)cum > target && q > 0) break;\n"
    "    }\n"
    "    return pick >= 0 ? pick : first_max;\n"
    "}\n"
    "#endif\n";

static bool uses_helpers(int op) {
    return op == SG__OP_RAND || op == SG__OP_TOPK || op == SG__OP_SAMPLE;
}

void sg__cgen_serial_data_prelude(sg__dialect d, const sg__ir *ir, sg__emit *e) {
    if (!sg__cgen_serial_wanted(d)) return;
    for (int i = 0; i < ir->nnodes; i++)
        if (uses_helpers(ir->nodes[i].op)) {
            sg__emit_raw(e, "%s", helpers);
            return;
        }
}

typedef struct sd {
    sg__cuda_gen *g;
    sg__emit *e;
    sg__dialect d;
    const sg__spell *sp;
    const sg__irnode *n;
} sd;

/* `var` += the offset along strides st of walk index `idx` over shape (nd
 * dims, row-major), dim `skip` left out (-1: none). */
static void walk_offset(sd *s, const char *var, const char *idx, int nd, const int64_t *shape,
                        const int64_t *st, int skip) {
    if (nd == 0) return;
    sg__emit_open(s->e, "%s", "");
    sg__emit_line(s->e, "sg_i64 q = %s;", idx);
    for (int k = nd - 1; k >= 0; k--) {
        if (k != skip && st[k] != 0 && shape[k] > 1)
            sg__emit_line(s->e, "%s += q %% %lldLL * %lldLL;", var, (long long)shape[k],
                          (long long)st[k]);
        if (k > 0 && shape[k] != 1) sg__emit_line(s->e, "q /= %lldLL;", (long long)shape[k]);
    }
    sg__emit_close(s->e);
}

/* r's element at element offset `off`: its lvalue, and its value widened. */
static void lvalue(sd *s, const sg__ref *r, const char *off, char *buf, size_t size) {
    sg__cuda_lvalue_at(s->g, r, off, buf, size);
}

static void load(sd *s, const sg__ref *r, const char *off, char *buf, size_t size) {
    char lv[256];
    lvalue(s, r, off, lv, sizeof lv);
    sg__lower_widen(s->d, r->dtype, lv, buf, size);
}

/* Store the value v (float or sg_i64 text) into r at offset `off`. */
static void store(sd *s, const sg__ref *r, const char *off, const char *v) {
    char lv[256], st[600];
    lvalue(s, r, off, lv, sizeof lv);
    sg__lower_narrow_store(s->d, r->dtype, lv, v, st, sizeof st);
    sg__emit_line(s->e, "%s", st);
}

/* The grid-stride loop over n work items (index `i`); closed by the caller. */
static void open_loop(sd *s, const char *i, int64_t n) {
    sg__emit_open(s->e,
                  "for (sg_i64 %s = (sg_i64)%s * %d + %s; %s < %lldLL; %s += (sg_i64)%s * %d)", i,
                  s->sp->bid, THREADS, s->sp->tid, i, (long long)n, i, s->sp->gdim, THREADS);
}

static bool contiguous(const sg__ref *r) {
    int64_t want = 1;
    for (int k = r->ndim - 1; k >= 0; k--) {
        if (r->shape[k] != 1 && r->stride[k] != want) return false;
        want *= r->shape[k];
    }
    return true;
}

static int float_code(sg_dtype dt) { return dt == SG_F32 ? 0 : dt == SG_F16 ? 1 : 2; }

/* seed and offset of the generator state rng (i64 [2]), as sg_u64. */
static void emit_state(sd *s, const sg__ref *rng) {
    char a[96], b[96], va[400], vb[400];
    snprintf(a, sizeof a, "%lldLL", (long long)rng->offset);
    snprintf(b, sizeof b, "%lldLL", (long long)(rng->offset + rng->stride[0]));
    load(s, rng, a, va, sizeof va);
    load(s, rng, b, vb, sizeof vb);
    sg__emit_line(s->e, "const sg_u64 seed = (sg_u64)(%s), offset = (sg_u64)(%s);", va, vb);
}

/* Philox block b's words into w4 (b: an sg_u64 expression). */
static void emit_block(sd *s, const char *b) {
    sg__emit_line(s->e, "const sg_u64 b = %s;", b);
    sg__emit_line(s->e, "const uint4 w4 = sg_philox((uint4)((sg_u32)b, (sg_u32)(b >> 32), 0u, 0u), "
                        "(sg_u32)seed, (sg_u32)(seed >> 32));");
}

static bool rng_ok(const sg__ref *rng) {
    return rng && rng->dtype == SG_I64 && rng->ndim == 1 && rng->shape[0] == 2;
}

/* rand / randn: a work-item per Philox block. */
static int64_t emit_rand(sd *s, const sg__ref *rng, const sg__ref *o) {
    if (!rng_ok(rng) || !sg__lower_fdom(o->dtype)) return -1;
    bool normal = s->n->i[0] == 1;
    int64_t numel = sg__numel(o->ndim, o->shape), per = normal ? 2 : 4;
    int64_t blocks = (numel + per - 1) / per;
    int bits = o->dtype == SG_F32 ? 24 : o->dtype == SG_F16 ? 11 : 8;
    emit_state(s, rng);
    open_loop(s, "bi", blocks);
    emit_block(s, "offset + (sg_u64)bi");
    sg__emit_line(s->e, "const sg_u32 w[4] = {w4.x, w4.y, w4.z, w4.w};");
    sg__emit_open(s->e, "for (int k = 0; k < %d && bi * %d + k < %lldLL; k++)", (int)per, (int)per,
                  (long long)numel);
    sg__emit_line(s->e, "const sg_i64 e = bi * %d + k;", (int)per);
    if (normal)
        sg__emit_line(s->e, "const float v = sg_rand_normal(w[2 * k], w[2 * k + 1], %d);",
                      o->dtype != SG_F32);
    else
        sg__emit_line(s->e, "const float v = sg_rand_uniform(w[k], %d);", bits);
    sg__emit_line(s->e, "sg_i64 oo = %lldLL;", (long long)o->offset);
    walk_offset(s, "oo", "e", o->ndim, o->shape, o->stride, -1);
    store(s, o, "oo", "v");
    sg__emit_close(s->e);
    sg__emit_close(s->e);
    return blocks;
}

/* The row `row` (an expression) of x (rows.., V) contiguous, as `r`. */
static void emit_row(sd *s, const sg__ref *x, const char *row) {
    int64_t V = x->shape[x->ndim - 1];
    char off[128], lv[256];
    snprintf(off, sizeof off, "%lldLL + (%s) * %lldLL", (long long)x->offset, row, (long long)V);
    lvalue(s, x, off, lv, sizeof lv);
    sg__emit_line(s->e, "const sg_srow r = {(__global const void *)&%s, %d, %lldLL};", lv,
                  float_code(x->dtype), (long long)V);
}

static bool rows_ok(const sg__ref *x) {
    return x && x->ndim >= 1 && x->shape[x->ndim - 1] >= 1 && sg__lower_fdom(x->dtype) &&
           contiguous(x);
}

/* topk: out (rows.., k) element i is the (i % k + 1)-th entry of row i / k. */
static int64_t emit_topk(sd *s, const sg__ref *x, const sg__ref *o) {
    int64_t k = s->n->i[0], numel = sg__numel(o->ndim, o->shape);
    if (!rows_ok(x) || k < 1 || o->dtype != SG_I64) return -1;
    char row[64];
    snprintf(row, sizeof row, "i / %lldLL", (long long)k);
    open_loop(s, "i", numel);
    emit_row(s, x, row);
    sg__emit_line(s->e, "const sg_i64 v = sg_topk_bound(r, i %% %lldLL + 1).idx;", (long long)k);
    sg__emit_line(s->e, "sg_i64 oo = %lldLL;", (long long)o->offset);
    walk_offset(s, "oo", "i", o->ndim, o->shape, o->stride, -1);
    store(s, o, "oo", "v");
    sg__emit_close(s->e);
    return numel;
}

/* sample / multinomial: out (rows..) element i is row i's pick. */
static int64_t emit_sample(sd *s, const sg__ref *x, const sg__ref *rng, const sg__ref *o) {
    int64_t rows = sg__numel(o->ndim, o->shape);
    if (!rows_ok(x) || !rng_ok(rng) || o->dtype != SG_I64) return -1;
    emit_state(s, rng);
    open_loop(s, "i", rows);
    emit_block(s, "offset + (sg_u64)i");
    sg__emit_line(s->e,
                  "const double u = ((double)(w4.x >> 5) * 67108864.0 + (double)(w4.y >> 6)) * "
                  "1.1102230246251565e-16;");
    emit_row(s, x, "i");
    sg__emit_line(s->e, "const sg_i64 v = sg_sample_row(r, %d, %lldLL, %.17g, %.17g, u);",
                  (int)s->n->i[1], (long long)s->n->i[0], s->n->f[0], s->n->f[1]);
    sg__emit_line(s->e, "sg_i64 oo = %lldLL;", (long long)o->offset);
    walk_offset(s, "oo", "i", o->ndim, o->shape, o->stride, -1);
    store(s, o, "oo", "v");
    sg__emit_close(s->e);
    return rows;
}

/* gather: out[c] = x[c with idx[c] at dim], raw elements; out of range: 0. */
static int64_t emit_gather(sd *s, const sg__ref *x, const sg__ref *idx, const sg__ref *o) {
    int dim = (int)s->n->i[0], nd = o->ndim;
    int64_t numel = sg__numel(nd, o->shape);
    if (!x || !idx || x->ndim != nd || idx->ndim != nd || dim < 0 || dim >= nd ||
        x->dtype != o->dtype || (idx->dtype != SG_I32 && idx->dtype != SG_I64))
        return -1;
    char iv[400], olv[256], xlv[256];
    open_loop(s, "i", numel);
    sg__emit_line(s->e, "sg_i64 io = %lldLL, oo = %lldLL, xo = %lldLL;", (long long)idx->offset,
                  (long long)o->offset, (long long)x->offset);
    walk_offset(s, "io", "i", nd, o->shape, idx->stride, -1);
    walk_offset(s, "oo", "i", nd, o->shape, o->stride, -1);
    walk_offset(s, "xo", "i", nd, o->shape, x->stride, dim);
    load(s, idx, "io", iv, sizeof iv);
    sg__emit_line(s->e, "const sg_i64 v = %s;", iv);
    char xoff[96];
    snprintf(xoff, sizeof xoff, "xo + v * %lldLL", (long long)x->stride[dim]);
    lvalue(s, o, "oo", olv, sizeof olv);
    lvalue(s, x, xoff, xlv, sizeof xlv);
    sg__emit_line(s->e, "%s = v < 0 || v >= %lldLL ? 0 : %s;", olv, (long long)x->shape[dim], xlv);
    sg__emit_close(s->e);
    return numel;
}

/* index_add: dst[.., idx[j], ..] += src[.., j, ..], each lane's j in order. */
static int64_t emit_index_add(sd *s, const sg__ref *idx, const sg__ref *src, const sg__ref *o) {
    int dim = (int)s->n->i[0], nd = o->ndim;
    if (!idx || !src || src->ndim != nd || dim < 0 || dim >= nd || idx->ndim > 1 ||
        !sg__lower_fdom(o->dtype) || !sg__lower_fdom(src->dtype) ||
        (idx->dtype != SG_I32 && idx->dtype != SG_I64))
        return -1;
    for (int k = 0; k < nd; k++)
        if (k != dim && src->shape[k] != o->shape[k]) return -1;
    int64_t walk[SG_MAX_DIMS], L = src->shape[dim];
    memcpy(walk, src->shape, sizeof(int64_t) * (size_t)nd);
    walk[dim] = 1;
    int64_t lanes = sg__numel(nd, walk);
    char ioff[96], soff[96], iv[400], dv[400], sv[400];
    snprintf(ioff, sizeof ioff, "%lldLL + j * %lldLL", (long long)idx->offset,
             (long long)(idx->ndim ? idx->stride[0] : 0));
    snprintf(soff, sizeof soff, "so + j * %lldLL", (long long)src->stride[dim]);
    open_loop(s, "i", lanes);
    sg__emit_line(s->e, "sg_i64 dof = %lldLL, so = %lldLL;", (long long)o->offset,
                  (long long)src->offset);
    walk_offset(s, "dof", "i", nd, walk, o->stride, dim);
    walk_offset(s, "so", "i", nd, walk, src->stride, dim);
    sg__emit_open(s->e, "for (sg_i64 j = 0; j < %lldLL; j++)", (long long)L);
    load(s, idx, ioff, iv, sizeof iv);
    sg__emit_line(s->e, "const sg_i64 v = %s;", iv);
    sg__emit_line(s->e, "if (v < 0 || v >= %lldLL) continue;", (long long)o->shape[dim]);
    sg__emit_line(s->e, "const sg_i64 at = dof + v * %lldLL;", (long long)o->stride[dim]);
    load(s, o, "at", dv, sizeof dv);
    if (o->dtype == SG_F32) {
        load(s, src, soff, sv, sizeof sv);
        sg__emit_line(s->e, "const float sum = (%s) + (%s);", dv, sv);
        store(s, o, "at", "sum");
    } else { /* f16, bf16: v's first position adds them all in f32, rounded once */
        char koff[96], kv[400];
        snprintf(koff, sizeof koff, "%lldLL + k * %lldLL", (long long)idx->offset,
                 (long long)(idx->ndim ? idx->stride[0] : 0));
        load(s, idx, koff, kv, sizeof kv);
        sg__emit_line(s->e, "bool seen = false;");
        sg__emit_line(s->e, "for (sg_i64 k = 0; k < j && !seen; k++) seen = (%s) == v;", kv);
        sg__emit_line(s->e, "if (seen) continue;");
        sg__emit_line(s->e, "float sum = %s;", dv);
        sg__emit_open(s->e, "for (sg_i64 k = j; k < %lldLL; k++)", (long long)L);
        snprintf(soff, sizeof soff, "so + k * %lldLL", (long long)src->stride[dim]);
        load(s, src, soff, sv, sizeof sv);
        sg__emit_line(s->e, "if ((%s) == v) sum += %s;", kv, sv);
        sg__emit_close(s->e);
        store(s, o, "at", "sum");
    }
    sg__emit_close(s->e);
    sg__emit_close(s->e);
    return lanes;
}

bool sg__cgen_serial_data(sg__cuda_gen *g, const sg__group *grp, sg__cuda_kinfo *ki,
                          const char **what) {
    if (grp->kind != SG__G_OPAQUE || grp->n != 1) return false;
    sd s = {.g = g, .e = sg__cuda_out(g), .d = sg__cuda_dialect(g)};
    s.sp = sg__spell_of(s.d);
    s.n = &sg__cuda_ir(g)->nodes[grp->g[0].node];
    if (!uses_helpers(s.n->op) && s.n->op != SG__OP_GATHER && s.n->op != SG__OP_INDEX_ADD)
        return false;
    const sg__ref *o = sg__cuda_ref(g, s.n->out);
    const sg__ref *a0 = s.n->nin > 0 ? sg__cuda_arg(g, s.n, 0) : NULL;
    const sg__ref *a1 = s.n->nin > 1 ? sg__cuda_arg(g, s.n, 1) : NULL;
    const sg__ref *a2 = s.n->nin > 2 ? sg__cuda_arg(g, s.n, 2) : NULL;
    if (sg__numel(o->ndim, o->shape) < 1) return false;
    /* Each emitter checks its refs before it names a slot; a declined body is dropped. */
    sg__emit *outer = s.e, body = {.ctx = outer->ctx, .depth = outer->depth};
    s.e = &body;
    int64_t n = -1;
    switch (s.n->op) {
    case SG__OP_RAND:
        n = emit_rand(&s, a0, o);
        *what = "rand: a work-item per Philox block, the CPU's element mapping";
        break;
    case SG__OP_TOPK:
        n = emit_topk(&s, a0, o);
        *what = "topk: a work-item per output element, the CPU's radix search of its rank";
        break;
    case SG__OP_SAMPLE:
        n = emit_sample(&s, a0, a1, o);
        *what = "sample: a work-item per row, the CPU's selection step for step";
        break;
    case SG__OP_GATHER:
        n = emit_gather(&s, a0, a1, o);
        *what = "gather: a work-item per output element";
        break;
    default:
        n = emit_index_add(&s, a1, a2, o);
        *what = "index_add: a work-item per lane adding src's rows in index order";
        break;
    }
    if (n > 0 && body.buf) sg__emit_raw(outer, "%s", body.buf);
    if (body.oom) outer->oom = true;
    sg__emit_free(&body);
    if (n <= 0) return false;
    int64_t blocks = (n + THREADS - 1) / THREADS;
    ki->grid = (unsigned)(blocks > GRID_MAX ? GRID_MAX : blocks);
    ki->block = THREADS;
    ki->iters = n;
    ki->replaces_call = true;
    return true;
}
