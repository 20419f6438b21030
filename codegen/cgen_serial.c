/* SPDX-License-Identifier: MIT */
/*
 * cgen_serial.c -- the anchors a library kernel family runs on CUDA, as
 * generated code, for dialects that have no such library (OpenCL C: Level
 * Zero has no kernel family, so every op is generated): a REDUCE or ROW
 * group that fusion did not give to the row kernels (cgen_cuda_row.c) --
 * max and min, argmax, var, sum and mean over dims that are not one run,
 * integer sums, 0-d inputs, softmax and log_softmax over a dim other than
 * the last, cross_entropy and its gradient, the norms' row statistics and
 * input gradient -- and the arange data op.
 *
 * One work-item per element of the anchor's output (a grid-stride loop of
 * blocks of 256) walks the elements that element depends on in row-major
 * order, with any strides: a reduction reads its reduced range once (var:
 * twice, mean first), a softmax element its row twice (max, then the sum
 * of exps), a cross_entropy every row. It is not fast (no team shares a
 * row) but every sum is in a fixed order, the same bits every launch:
 * float sums are compensated (Kahan: the error of the f32 sum stays near
 * one rounding of the result, close to the CPU backend's double sums),
 * integer sums exact in 64 bits. NaN propagates and ties go to the first
 * element, as on the CPU. The anchor's value is rounded to its output's
 * dtype, stored where the group stores it, and the group's epilogue runs
 * on it at the same walk index, as in a GEMV or GEMM kernel.
 */
#include "codegen.h"

#include <stdio.h>
#include <string.h>

#define THREADS 256
#define GRID_MAX 65535

bool sg__cgen_serial_wanted(sg__dialect d) { return d == SG__DIALECT_OPENCL; }

typedef struct ser {
    sg__cuda_gen *g;
    sg__emit *e;
    sg__dialect d;
    const sg__spell *sp;
    const sg__irnode *n;
} ser;

/* `var` += the offset of element index `idx` (a C expression) of the
 * walk over dims `dims` (nd of them) of r, row-major. */
static void emit_offset(ser *s, const char *var, const char *idx, const sg__ref *r, int nd,
                        const int *dims) {
    if (nd == 0) return;
    sg__emit_open(s->e, "%s", "");
    sg__emit_line(s->e, "sg_i64 q = %s;", idx);
    for (int k = nd - 1; k >= 0; k--) {
        int d = dims[k];
        if (r->stride[d] != 0 && r->shape[d] > 1)
            sg__emit_line(s->e, "%s += q %% %lld * %lld;", var, (long long)r->shape[d],
                          (long long)r->stride[d]);
        if (k > 0) sg__emit_line(s->e, "q /= %lld;", (long long)r->shape[d]);
    }
    sg__emit_close(s->e);
}

/* The value of r's element at element offset `off`, widened, as text. */
static void load(ser *s, const sg__ref *r, const char *off, char *buf, size_t size) {
    char lv[256];
    sg__cuda_lvalue_at(s->g, r, off, lv, sizeof lv);
    sg__lower_widen(s->d, r->dtype, lv, buf, size);
}

/* acc (with compensation c) += v, in float, a fixed order (Kahan); an
 * infinite or NaN sum is kept as it is. */
static void kahan(ser *s, const char *acc, const char *c, const char *v) {
    sg__emit_open(s->e, "%s", "");
    sg__emit_line(s->e, "const float ky = (%s) - %s, kt = %s + ky;", v, c, acc);
    sg__emit_line(s->e, "%s = isfinite(kt) ? (kt - %s) - ky : 0.0f;", c, acc);
    sg__emit_line(s->e, "%s = kt;", acc);
    sg__emit_close(s->e);
}

static int64_t dims_numel(const sg__ref *r, int nd, const int *dims) {
    int64_t p = 1;
    for (int k = 0; k < nd; k++) p *= r->shape[dims[k]];
    return p;
}

/* A reduction over node.mask: the value into `val` (declared by the caller
 * as the anchor's domain type). */
static bool emit_reduce(ser *s, const sg__ref *x, const sg__ref *o, const char *val) {
    const sg__irnode *n = s->n;
    int kept[SG_MAX_DIMS], red[SG_MAX_DIMS], nk = 0, nr = 0;
    uint32_t mask = x->ndim ? n->mask : 0;
    for (int d = 0; d < x->ndim; d++) {
        if (mask & (1u << d))
            red[nr++] = d;
        else
            kept[nk++] = d;
    }
    if (dims_numel(x, nk, kept) != sg__numel(o->ndim, o->shape)) return false;
    int64_t L = dims_numel(x, nr, red);
    bool fl = sg__lower_fdom(x->dtype);
    char v[400];
    load(s, x, "xo", v, sizeof v);
    sg__emit_line(s->e, "sg_i64 base = %lld;", (long long)x->offset);
    emit_offset(s, "base", "i", x, nk, kept);
    /* The loop over the reduced range: element offset xo, index j. */
    char open[128];
    snprintf(open, sizeof open, "for (sg_i64 j = 0; j < %lldLL; j++)", (long long)L);
    switch (n->op) {
    case SG__OP_SUM:
    case SG__OP_MEAN:
    case SG__OP_VAR:
        if (!fl) {
            if (n->op != SG__OP_SUM) return false;
            sg__emit_line(s->e, "sg_u64 acc = 0;");
            sg__emit_open(s->e, "%s", open);
            sg__emit_line(s->e, "sg_i64 xo = base;");
            emit_offset(s, "xo", "j", x, nr, red);
            sg__emit_line(s->e, "acc += (sg_u64)(%s);", v);
            sg__emit_close(s->e);
            sg__emit_line(s->e, "%s = (sg_i64)acc;", val);
            return true;
        }
        sg__emit_line(s->e, "float acc = 0.0f, kc = 0.0f;");
        sg__emit_open(s->e, "%s", open);
        sg__emit_line(s->e, "sg_i64 xo = base;");
        emit_offset(s, "xo", "j", x, nr, red);
        kahan(s, "acc", "kc", v);
        sg__emit_close(s->e);
        if (n->op == SG__OP_SUM) {
            sg__emit_line(s->e, "%s = acc;", val);
            return true;
        }
        sg__emit_line(s->e, "const float mean = acc / %lld.0f;", (long long)L);
        if (n->op == SG__OP_MEAN) {
            sg__emit_line(s->e, "%s = mean;", val);
            return true;
        }
        sg__emit_line(s->e, "float sq = 0.0f, sc = 0.0f;");
        sg__emit_open(s->e, "%s", open);
        sg__emit_line(s->e, "sg_i64 xo = base;");
        emit_offset(s, "xo", "j", x, nr, red);
        sg__emit_line(s->e, "const float dev = (%s) - mean;", v);
        kahan(s, "sq", "sc", "dev * dev");
        sg__emit_close(s->e);
        {
            long long den = (long long)L - (long long)n->i[0];
            if (den > 0)
                sg__emit_line(s->e, "%s = sq / %lld.0f;", val, den);
            else
                sg__emit_line(s->e, "%s = sq > 0.0f ? INFINITY : NAN;", val);
        }
        return true;
    case SG__OP_MAX:
    case SG__OP_MIN:
    case SG__OP_ARGMAX: {
        const char *vt = sg__lower_vtype(s->d, fl);
        const char *cmp = n->op == SG__OP_MIN ? "<" : ">";
        sg__emit_line(s->e, "%s best = 0;", vt);
        sg__emit_line(s->e, "sg_i64 at = 0;");
        sg__emit_open(s->e, "%s", open);
        sg__emit_line(s->e, "sg_i64 xo = base;");
        emit_offset(s, "xo", "j", x, nr, red);
        sg__emit_line(s->e, "const %s xv = %s;", vt, v);
        /* The first NaN wins, then the first of equal values. */
        sg__emit_line(s->e,
                      "if (j == 0 || (best == best && (xv != xv || xv %s best))) "
                      "best = xv, at = j;",
                      cmp);
        sg__emit_close(s->e);
        sg__emit_line(s->e, "%s = %s;", val, n->op == SG__OP_ARGMAX ? "at" : "best");
        return true;
    }
    default: return false;
    }
}

/* The max rm (NaN when the row has one) and the sum rs of exp(x - rm) of
 * the row of len elements at element offsets row0 + k * xs of x. */
static void emit_lse(ser *s, const sg__ref *x, const char *row0, int64_t len, int64_t xs) {
    char v[400];
    load(s, x, "xo", v, sizeof v);
    sg__emit_line(s->e, "float rm = -INFINITY, rs = 0.0f, rc = 0.0f;");
    sg__emit_open(s->e, "for (sg_i64 k = 0; k < %lldLL; k++)", (long long)len);
    sg__emit_line(s->e, "const sg_i64 xo = %s + k * %lldLL;", row0, (long long)xs);
    sg__emit_line(s->e, "const float xv = %s;", v);
    sg__emit_line(s->e, "rm = xv != xv || rm != rm ? NAN : fmax(rm, xv);");
    sg__emit_close(s->e);
    sg__emit_open(s->e, "for (sg_i64 k = 0; k < %lldLL; k++)", (long long)len);
    sg__emit_line(s->e, "const sg_i64 xo = %s + k * %lldLL;", row0, (long long)xs);
    sg__emit_line(s->e, "const float ev = exp((%s) - rm);", v);
    kahan(s, "rs", "rc", "ev");
    sg__emit_close(s->e);
}

/* softmax / log_softmax of the element at walk index i, along dim i[0]. */
static bool emit_softmax(ser *s, const sg__ref *x, const char *val) {
    int dim = x->ndim ? (int)s->n->i[0] : -1, all[SG_MAX_DIMS];
    if (dim < 0 && x->ndim) dim += x->ndim;
    for (int d = 0; d < x->ndim; d++) all[d] = d;
    int64_t len = x->ndim ? x->shape[dim] : 1, xs = x->ndim ? x->stride[dim] : 0;
    char v[400];
    sg__emit_line(s->e, "sg_i64 own = %lld;", (long long)x->offset);
    emit_offset(s, "own", "i", x, x->ndim, all);
    /* The row's start: own less its index along dim times the stride. */
    int64_t inner = x->ndim ? dims_numel(x, x->ndim - dim - 1, all + dim + 1) : 1;
    sg__emit_line(s->e, "const sg_i64 row0 = own - (i / %lldLL %% %lldLL) * %lldLL;",
                  (long long)inner, (long long)len, (long long)xs);
    emit_lse(s, x, "row0", len, xs);
    load(s, x, "own", v, sizeof v);
    if (s->n->op == SG__OP_SOFTMAX)
        sg__emit_line(s->e, "%s = exp((%s) - rm) / rs;", val, v);
    else
        sg__emit_line(s->e, "%s = ((%s) - rm) - log(rs);", val, v);
    return true;
}

/* The target of row r (tv, a 64-bit integer) of cross_entropy's targets t. */
static void emit_target(ser *s, const sg__ref *t) {
    char v[400], off[96];
    snprintf(off, sizeof off, "%lldLL + r * %lldLL", (long long)t->offset,
             (long long)(t->ndim ? t->stride[0] : 0));
    load(s, t, off, v, sizeof v);
    sg__emit_line(s->e, "const sg_i64 tv = %s;", v);
}

/* cross_entropy: the mean over rows of logsumexp(row) - row[target] (one
 * output; a target outside [0, C) makes it NaN, no rows too). */
static bool emit_xent(ser *s, const sg__ref *x, const sg__ref *t, const char *val) {
    if (x->ndim != 2) return false;
    int64_t N = x->shape[0], C = x->shape[1];
    char v[400];
    sg__emit_line(s->e, "float tot = 0.0f, tc = 0.0f;");
    sg__emit_open(s->e, "for (sg_i64 r = 0; r < %lldLL; r++)", (long long)N);
    sg__emit_line(s->e, "const sg_i64 row0 = %lldLL + r * %lldLL;", (long long)x->offset,
                  (long long)x->stride[0]);
    emit_lse(s, x, "row0", C, x->stride[1]);
    emit_target(s, t);
    sg__emit_line(s->e, "const sg_i64 xo = row0 + tv * %lldLL;", (long long)x->stride[1]);
    load(s, x, "xo", v, sizeof v);
    sg__emit_line(s->e, "const float lr = tv < 0 || tv >= %lldLL ? NAN : (rm - (%s)) + log(rs);",
                  (long long)C, v);
    kahan(s, "tot", "tc", "lr");
    sg__emit_close(s->e);
    sg__emit_line(s->e, "%s = tot / %lld.0f;", val, (long long)N);
    return true;
}

/* cross_entropy's gradient at walk index i of (N, C): (softmax(row) -
 * onehot(target)) * g / N; a target outside [0, C) makes the row NaN. */
static bool emit_xent_bwd(ser *s, const sg__ref *x, const sg__ref *t, const sg__ref *gr,
                          const char *val) {
    if (x->ndim != 2) return false;
    int64_t N = x->shape[0], C = x->shape[1];
    char v[400], gv[400], go[64];
    sg__emit_line(s->e, "const sg_i64 r = i / %lldLL, c = i %% %lldLL;", (long long)C,
                  (long long)C);
    sg__emit_line(s->e, "const sg_i64 row0 = %lldLL + r * %lldLL;", (long long)x->offset,
                  (long long)x->stride[0]);
    emit_lse(s, x, "row0", C, x->stride[1]);
    emit_target(s, t);
    sg__emit_line(s->e, "const sg_i64 xo = row0 + c * %lldLL;", (long long)x->stride[1]);
    load(s, x, "xo", v, sizeof v);
    snprintf(go, sizeof go, "%lldLL", (long long)gr->offset);
    load(s, gr, go, gv, sizeof gv);
    sg__emit_line(s->e, "const float p = exp((%s) - rm) / rs - (c == tv ? 1.0f : 0.0f);", v);
    sg__emit_line(s->e, "%s = tv < 0 || tv >= %lldLL ? NAN : p * ((%s) / %lld.0f);", val,
                  (long long)C, gv, (long long)(N ? N : 1));
    return true;
}

/* The norms' statistics over the row at element offset row0 of x (len
 * elements, xs apart) into rmean (0 for rms_norm) and rrs = 1 / sqrt(var +
 * eps): the mean first, then the squares about it (layer_norm). */
static void emit_norm_stats(ser *s, const sg__ref *x, bool layer, double eps) {
    int last = x->ndim - 1;
    int64_t len = x->shape[last], xs = x->stride[last];
    char v[400], e[96];
    load(s, x, "xo", v, sizeof v);
    sg__lower_scalar(s->d, eps, true, SG_F32, e, sizeof e);
    sg__emit_line(s->e, "float rsum = 0.0f, rmean = 0.0f, rsq = 0.0f, rc = 0.0f;");
    for (int pass = layer ? 0 : 1; pass < 2; pass++) {
        sg__emit_line(s->e, "rc = 0.0f;");
        sg__emit_open(s->e, "for (sg_i64 k = 0; k < %lldLL; k++)", (long long)len);
        sg__emit_line(s->e, "const sg_i64 xo = row0 + k * %lldLL;", (long long)xs);
        sg__emit_line(s->e, "const float dv = (%s) - rmean;", v);
        kahan(s, pass ? "rsq" : "rsum", "rc", pass ? "dv * dv" : "dv");
        sg__emit_close(s->e);
        if (!pass) sg__emit_line(s->e, "rmean = rsum / %lld.0f;", (long long)len);
    }
    sg__emit_line(s->e, "const float rrs = 1.0f / sqrt(rsq / %lld.0f + %s);", (long long)len, e);
}

/* The element offset where the row of walk index `idx` (a row index over
 * the leading dims of rs[0]) starts in each of the n refs rs, into new
 * variables named by `names`. */
static void emit_row_starts(ser *s, const char *idx, int n, const sg__ref *const *rs,
                            const char *const *names) {
    int lead[SG_MAX_DIMS];
    for (int d = 0; d < rs[0]->ndim; d++) lead[d] = d;
    for (int k = 0; k < n; k++) {
        sg__emit_line(s->e, "sg_i64 %s = %lld;", names[k], (long long)rs[k]->offset);
        emit_offset(s, names[k], idx, rs[k], rs[0]->ndim - 1, lead);
    }
}

/* NORM_STATS at walk index i of (..., 2): its row's mean, or 1 / sqrt(var + eps). */
static bool emit_norm_stats_at(ser *s, const sg__ref *x, const char *val) {
    if (x->ndim < 1) return false;
    const sg__ref *rs[1] = {x};
    const char *names[1] = {"row0"};
    emit_row_starts(s, "i / 2", 1, rs, names);
    emit_norm_stats(s, x, s->n->i[0] != 0, s->n->f[0]);
    sg__emit_line(s->e, "%s = i %% 2 == 0 ? rmean : rrs;", val);
    return true;
}

/* In the current scope: gw = g * w and xh = (x - rmean) * rrs at column
 * `col` of NORM_BWD's row (nx0, ng0: the row's starts in x and g; s0, s1, ...
 * name the unit's slots). */
static void emit_gw_xh(ser *s, const sg__ref *x, const sg__ref *gr, const sg__ref *w,
                       const char *col) {
    int last = x->ndim - 1;
    char xv[400], gv[400], wv[400];
    load(s, x, "xo", xv, sizeof xv);
    load(s, gr, "go", gv, sizeof gv);
    sg__emit_line(s->e, "const sg_i64 xo = nx0 + (%s) * %lldLL, go = ng0 + (%s) * %lldLL;", col,
                  (long long)x->stride[last], col, (long long)gr->stride[last]);
    if (w) {
        load(s, w, "wo", wv, sizeof wv);
        sg__emit_line(s->e, "const sg_i64 wo = %lldLL + (%s) * %lldLL;", (long long)w->offset, col,
                      (long long)w->stride[0]);
        sg__emit_line(s->e, "const float gw = (%s) * (%s);", gv, wv);
    } else {
        sg__emit_line(s->e, "const float gw = %s;", gv);
    }
    sg__emit_line(s->e, "const float xh = ((%s) - rmean) * rrs;", xv);
}

/* NORM_BWD at walk index i of its output: below rows * len, the input's
 * gradient rstd * (gw - mean(gw) - xh * mean(gw * xh)) (+ r) of row i / len,
 * the statistics and the sums over the row compensated; past it (the packed
 * column sums of ops.def), sum(g * xh) or sum(g) of its column over the rows
 * in order, each row's statistics recomputed. */
static bool emit_norm_bwd(ser *s, const char *val) {
    const sg__irnode *n = s->n;
    const sg__ref *x = sg__cuda_arg(s->g, n, 0), *gr = sg__cuda_arg(s->g, n, 1);
    const sg__ref *w = sg__cuda_arg(s->g, n, 2), *r = sg__cuda_arg(s->g, n, 3);
    if (!x || !gr || x->ndim < 1) return false;
    int last = x->ndim - 1;
    int64_t len = x->shape[last], m = sg__numel(x->ndim, x->shape);
    bool layer = n->i[0] != 0;
    const sg__ref *rs[3] = {x, gr, r};
    const char *names[3] = {"nx0", "ng0", "nr0"};
    char idx[64], own[64], lenf[64], rv[400], xv[400], gv[400];
    sg__emit_open(s->e, "if (i < %lldLL)", (long long)m);
    snprintf(idx, sizeof idx, "i / %lldLL", (long long)len);
    emit_row_starts(s, idx, r ? 3 : 2, rs, names);
    sg__emit_line(s->e, "const sg_i64 row0 = nx0;");
    emit_norm_stats(s, x, layer, n->f[0]);
    sg__emit_line(s->e, "float n1 = 0.0f, nc1 = 0.0f, n2 = 0.0f, nc2 = 0.0f;");
    sg__emit_open(s->e, "for (sg_i64 k = 0; k < %lldLL; k++)", (long long)len);
    emit_gw_xh(s, x, gr, w, "k");
    kahan(s, "n1", "nc1", "gw");
    kahan(s, "n2", "nc2", "gw * xh");
    sg__emit_close(s->e);
    snprintf(lenf, sizeof lenf, "n1 / %lld.0f", (long long)len);
    snprintf(own, sizeof own, "i %% %lldLL", (long long)len);
    emit_gw_xh(s, x, gr, w, own);
    sg__emit_line(s->e, "const float m1 = %s, m2 = n2 / %lld.0f;", layer ? lenf : "0.0f",
                  (long long)len);
    if (r) {
        load(s, r, "ro", rv, sizeof rv);
        sg__emit_line(s->e, "const sg_i64 ro = nr0 + (%s) * %lldLL;", own,
                      (long long)r->stride[last]);
        sg__emit_line(s->e, "%s = rrs * ((gw - m1) - xh * m2) + (%s);", val, rv);
    } else {
        sg__emit_line(s->e, "%s = rrs * ((gw - m1) - xh * m2);", val);
    }
    sg__emit_close(s->e);
    if (!n->i[1]) return true;
    sg__emit_open(s->e, "else");
    sg__emit_line(s->e, "const sg_i64 c = (i - %lldLL) %% %lldLL, db = (i - %lldLL) / %lldLL;",
                  (long long)m, (long long)len, (long long)m, (long long)len);
    sg__emit_line(s->e, "float a = 0.0f, ac = 0.0f;");
    sg__emit_open(s->e, "for (sg_i64 rw = 0; rw < %lldLL; rw++)", (long long)(m / len));
    emit_row_starts(s, "rw", 2, rs, names);
    sg__emit_line(s->e, "const sg_i64 row0 = nx0;");
    emit_norm_stats(s, x, layer, n->f[0]);
    load(s, x, "xo", xv, sizeof xv);
    load(s, gr, "go", gv, sizeof gv);
    sg__emit_line(s->e, "const sg_i64 xo = nx0 + c * %lldLL, go = ng0 + c * %lldLL;",
                  (long long)x->stride[last], (long long)gr->stride[last]);
    sg__emit_line(s->e, "const float gv = %s, xh = ((%s) - rmean) * rrs;", gv, xv);
    kahan(s, "a", "ac", "db ? gv : gv * xh");
    sg__emit_close(s->e);
    sg__emit_line(s->e, "%s = a;", val);
    sg__emit_close(s->e);
    return true;
}

/* arange: start + i * step, in float for float outputs, exactly in 64 bits
 * for integer ones when start and step are whole numbers. */
static bool emit_arange(ser *s, const sg__ref *o, const char *val) {
    double a = s->n->f[0], st = s->n->f[1];
    char sa[96], ss[96];
    if (!sg__lower_fdom(o->dtype) && a == (double)(int64_t)a && st == (double)(int64_t)st) {
        sg__emit_line(s->e, "%s = %lldLL + i * %lldLL;", val, (long long)a, (long long)st);
        return true;
    }
    sg__lower_scalar(s->d, a, true, SG_F32, sa, sizeof sa);
    sg__lower_scalar(s->d, st, true, SG_F32, ss, sizeof ss);
    if (sg__lower_fdom(o->dtype))
        sg__emit_line(s->e, "%s = %s + (float)i * %s;", val, sa, ss);
    else
        sg__emit_line(s->e, "%s = (sg_i64)(%s + (float)i * %s);", val, sa, ss);
    return true;
}

/* The anchor's value at walk index i into v<a>; false: not taken. */
static bool emit_anchor(ser *s, const sg__group *grp, const sg__ref *o, const char *val) {
    const sg__irnode *n = s->n;
    const sg__ref *x = n->nin > 0 ? sg__cuda_arg(s->g, n, 0) : NULL;
    switch (n->op) {
    case SG__OP_SUM:
    case SG__OP_MEAN:
    case SG__OP_MAX:
    case SG__OP_MIN:
    case SG__OP_VAR:
    case SG__OP_ARGMAX: return x && emit_reduce(s, x, o, val);
    case SG__OP_SOFTMAX:
    case SG__OP_LOG_SOFTMAX:
        return x && sg__lower_fdom(x->dtype) &&
               sg__numel(o->ndim, o->shape) == sg__numel(x->ndim, x->shape) &&
               emit_softmax(s, x, val);
    case SG__OP_CROSS_ENTROPY: return x && emit_xent(s, x, sg__cuda_arg(s->g, n, 1), val);
    case SG__OP_CROSS_ENTROPY_BWD:
        return x && emit_xent_bwd(s, x, sg__cuda_arg(s->g, n, 1), sg__cuda_arg(s->g, n, 2), val);
    case SG__OP_NORM_STATS: return x && emit_norm_stats_at(s, x, val);
    case SG__OP_NORM_BWD: return emit_norm_bwd(s, val);
    case SG__OP_ARANGE: return grp->kind == SG__G_OPAQUE && o->ndim == 1 && emit_arange(s, o, val);
    default: return false;
    }
}

bool sg__cgen_serial(sg__cuda_gen *g, const sg__group *grp, sg__cuda_kinfo *ki) {
    int a = grp->kind == SG__G_OPAQUE ? 0 : grp->anchor;
    if (a < 0 || a >= grp->n || (grp->kind == SG__G_OPAQUE && grp->n != 1)) return false;
    if (grp->kind != SG__G_OPAQUE && grp->kind != SG__G_REDUCE && grp->kind != SG__G_ROW)
        return false;
    if (grp->rows_inline || grp->norm_rows) return false;
    ser s = {.g = g, .e = sg__cuda_out(g), .d = sg__cuda_dialect(g)};
    s.sp = sg__spell_of(s.d);
    s.n = &sg__cuda_ir(g)->nodes[grp->g[a].node];
    const sg__ref *o = sg__cuda_ref(g, s.n->out);
    int64_t numel = sg__numel(o->ndim, o->shape);
    /* The epilogue walks the anchor's output shape. */
    if (numel < 1 || (a + 1 < grp->n && sg__numel(grp->ndim, grp->shape) != numel)) return false;
    sg__emit *outer = s.e, body = {.ctx = outer->ctx, .depth = outer->depth};
    s.e = &body;
    sg__cuda_set_out(g, &body);
    bool fl = sg__lower_fdom(o->dtype);
    char val[16], rt[600], lv[320], st[1000];
    snprintf(val, sizeof val, "v%d", a);
    sg__emit_open(s.e, "for (sg_i64 i = (sg_i64)%s * %d + %s; i < %lldLL; i += (sg_i64)%s * %d)",
                  s.sp->bid, THREADS, s.sp->tid, (long long)numel, s.sp->gdim, THREADS);
    sg__emit_line(s.e, "%s va;", sg__lower_vtype(s.d, fl));
    bool taken = emit_anchor(&s, grp, o, "va");
    if (taken) {
        sg__lower_round_trip(s.d, "va", fl, o->dtype, rt, sizeof rt);
        sg__emit_line(s.e, "const %s %s = %s; /* %s */", sg__lower_vtype(s.d, fl), val, rt,
                      sg__op_name(s.n->op));
        int nd = grp->kind == SG__G_OPAQUE ? o->ndim : grp->ndim;
        const int64_t *shape = grp->kind == SG__G_OPAQUE ? o->shape : grp->shape;
        sg__cuda_unflatten(g, nd, shape);
        if (grp->g[a].store) {
            sg__cuda_lvalue(g, o, nd, shape, false, lv, sizeof lv);
            sg__lower_narrow_store(s.d, o->dtype, lv, val, st, sizeof st);
            sg__emit_line(s.e, "%s", st);
        }
        if (a + 1 < grp->n) sg__cuda_members(g, grp, a + 1, grp->n, nd, shape, false);
    }
    sg__emit_close(s.e);
    sg__cuda_set_out(g, outer);
    if (taken && body.buf) sg__emit_raw(outer, "%s", body.buf);
    if (body.oom) outer->oom = true;
    sg__emit_free(&body);
    if (!taken) return false;
    int64_t blocks = (numel + THREADS - 1) / THREADS;
    ki->grid = (unsigned)(blocks > GRID_MAX ? GRID_MAX : blocks);
    ki->block = THREADS;
    ki->iters = numel;
    ki->replaces_call = true;
    return true;
}
