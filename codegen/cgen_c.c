/* SPDX-License-Identifier: MIT */
/*
 * cgen_c.c -- the C + OpenMP dialect: one translation unit per fused
 * capture. Each pointwise group (and each epilogue after a library-run
 * anchor) becomes a readable function with constant shapes, strides and
 * offsets, run as an orphaned `omp for` inside the parallel region of the
 * whole step; anchors and opaque nodes call back into the library. The
 * pointwise prologue of a reduction or row op is its own function, run
 * before the library call, and stores the value the call reads.
 *
 * Values in registers equal what the eager path would read back from
 * memory: each result is narrowed to its dtype and widened again (f16 and
 * bf16 round at every op, as eager does), so fused and unfused agree.
 */
#include "codegen.h"

#include <math.h>
#include <stdio.h>

/* The helpers generated code uses, matching graphs/cpu/cpu.h bit for bit. */
static const char *const preamble =
    "#include <math.h>\n"
    "#include <stdint.h>\n"
    "#include <string.h>\n"
    "\n"
    "typedef struct sg_rt { void *ctx; int (*run_node)(void *ctx, int node); } sg_rt;\n"
    "/* OpenMP directives vanish cleanly when the compiler runs without OpenMP. */\n"
    "#ifdef _OPENMP\n"
    "#define SG_OMP(x) _Pragma(#x)\n"
    "#else\n"
    "#define SG_OMP(x)\n"
    "#endif\n"
    "\n"
    "static inline float sg_h2f(uint16_t h) {\n"
    "    uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 31, m = h & 1023, u;\n"
    "    if (e == 0) {\n"
    "        if (m == 0) { u = sign; }\n"
    "        else { e = 113; while (!(m & 1024)) { m <<= 1; e--; } u = sign | (e << 23) | ((m & 1023) << 13); }\n"
    "    } else if (e == 31) { u = sign | 0x7f800000u | (m << 13); }\n"
    "    else { u = sign | ((e + 112) << 23) | (m << 13); }\n"
    "    float f; memcpy(&f, &u, 4); return f;\n"
    "}\n"
    "static inline uint16_t sg_f2h(float f) {\n"
    "    uint32_t u; memcpy(&u, &f, 4);\n"
    "    uint32_t sign = (u >> 16) & 0x8000, a = u & 0x7fffffffu;\n"
    "    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00);\n"
    "    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00);\n"
    "    if (a < 0x38800000u) { float af, r; uint32_t ru; memcpy(&af, &a, 4); r = af + 0.5f;\n"
    "        memcpy(&ru, &r, 4); return (uint16_t)(sign | (ru - 0x3f000000u)); }\n"
    "    uint32_t odd = (a >> 13) & 1; a += 0xc8000fffu + odd; return (uint16_t)(sign | (a >> 13));\n"
    "}\n"
    "static inline float sg_bf2f(uint16_t b) { uint32_t u = (uint32_t)b << 16; float f; memcpy(&f, &u, 4); return f; }\n"
    "static inline uint16_t sg_f2bf(float f) {\n"
    "    uint32_t u; memcpy(&u, &f, 4);\n"
    "    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);\n"
    "    u += 0x7fffu + ((u >> 16) & 1); return (uint16_t)(u >> 16);\n"
    "}\n"
    "static inline int64_t sg_f2i32(float v) {\n"
    "    return v != v ? 0 : v >= 2147483647.0f ? INT32_MAX : v <= -2147483648.0f ? INT32_MIN : (int32_t)v;\n"
    "}\n"
    "static inline int64_t sg_f2i64(float v) {\n"
    "    return v != v ? 0 : v >= 9.2233720e18f ? INT64_MAX : v <= -9.2233720e18f ? INT64_MIN : (int64_t)v;\n"
    "}\n"
    "static inline float sg_gelu(float x) { return 0.5f * x * erfcf(x * -0.70710678118654752f); }\n"
    "static inline float sg_gelu_tanh(float x) {\n"
    "    return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));\n"
    "}\n"
    "#define SG_WRAP(x) ((int64_t)(uint64_t)(x))\n"
    "/* Rounding to float 'to odd' first makes the later f16/bf16 rounding single. */\n"
    "static inline float sg_round_odd(double v) {\n"
    "    float f = (float)v; uint32_t u;\n"
    "    if ((double)f == v || f != f || isinf(f)) return f;\n"
    "    memcpy(&u, &f, 4); if (u & 1) return f;\n"
    "    return nextafterf(f, v > (double)f ? INFINITY : -INFINITY);\n"
    "}\n"
    "static inline float sg_i2f_odd(int64_t v) {\n"
    "    uint64_t u = v < 0 ? 0 - (uint64_t)v : (uint64_t)v, sticky = 0; int sh = 0;\n"
    "    while (u >> 53) { sticky |= u & 1; u >>= 1; sh++; }\n"
    "    double d = ldexp((double)(u | sticky), sh);\n"
    "    return sg_round_odd(v < 0 ? -d : d);\n"
    "}\n"
    "/* glibc's vector libm (see graphs/cpu/cpu_pointwise.c for why it is declared here). */\n"
    "#if defined(_OPENMP) && defined(__x86_64__) && defined(__GLIBC__) && !defined(__FAST_MATH__) && \\\n"
    "    (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 35))\n"
    "#pragma omp declare simd notinbranch\n"
    "float expf(float);\n"
    "#pragma omp declare simd notinbranch\n"
    "float logf(float);\n"
    "#pragma omp declare simd notinbranch\n"
    "float sinf(float);\n"
    "#pragma omp declare simd notinbranch\n"
    "float cosf(float);\n"
    "#pragma omp declare simd notinbranch\n"
    "float tanhf(float);\n"
    "#pragma omp declare simd notinbranch\n"
    "float erfcf(float);\n"
    "#pragma omp declare simd notinbranch\n"
    "float powf(float, float);\n"
    "#endif\n";

/* ------------------------------------------------------------ types and values */

static bool fdom(sg_dtype dt) { return dt == SG_F32 || dt == SG_F16 || dt == SG_BF16; }

static const char *ctype(sg_dtype dt) {
    switch (dt) {
    case SG_F32: return "float";
    case SG_F16:
    case SG_BF16: return "uint16_t";
    case SG_I32: return "int32_t";
    case SG_I64: return "int64_t";
    case SG_BOOL: return "uint8_t";
    }
    return "?";
}

/* The element offset of ref r at the loop indices, as C text. */
static void offset_expr(const sg__ref *r, int nd, const int64_t *shape, bool flat, char *buf,
                        size_t size) {
    size_t k = (size_t)snprintf(buf, size, "%lld", (long long)r->offset);
    bool scalar = true;
    for (int d = 0; d < r->ndim; d++)
        if (r->shape[d] > 1 && r->stride[d] != 0) scalar = false;
    if (scalar) return;
    if (flat) {
        snprintf(buf + k, size - k, " + i");
        return;
    }
    for (int d = 0; d < nd && k < size; d++) {
        int rd = d - (nd - r->ndim);
        if (rd < 0 || r->shape[rd] == 1 || shape[d] == 1 || r->stride[rd] == 0) continue;
        k += (size_t)snprintf(buf + k, size - k, " + i%d * %lld", d, (long long)r->stride[rd]);
    }
}

static void load_expr(const sg__ref *r, const char *off, char *buf, size_t size) {
    const char *t = ctype(r->dtype);
    switch (r->dtype) {
    case SG_F32: snprintf(buf, size, "((const float *)slot[%d])[%s]", r->slot, off); break;
    case SG_F16: snprintf(buf, size, "sg_h2f(((const uint16_t *)slot[%d])[%s])", r->slot, off); break;
    case SG_BF16: snprintf(buf, size, "sg_bf2f(((const uint16_t *)slot[%d])[%s])", r->slot, off); break;
    case SG_BOOL: snprintf(buf, size, "(int64_t)(((const uint8_t *)slot[%d])[%s] != 0)", r->slot, off); break;
    default: snprintf(buf, size, "(int64_t)((const %s *)slot[%d])[%s]", t, r->slot, off); break;
    }
}

/* Narrow a value of the given domain to dt and widen it back, as a store and load would. */
static void round_trip(const char *e, bool src_float, sg_dtype dt, char *buf, size_t size) {
    switch (dt) {
    case SG_F32: snprintf(buf, size, src_float ? "%s" : "(float)%s", e); break;
    case SG_F16: snprintf(buf, size, src_float ? "sg_h2f(sg_f2h(%s))" : "sg_h2f(sg_f2h(sg_i2f_odd(%s)))", e); break;
    case SG_BF16: snprintf(buf, size, src_float ? "sg_bf2f(sg_f2bf(%s))" : "sg_bf2f(sg_f2bf(sg_i2f_odd(%s)))", e); break;
    case SG_I32: snprintf(buf, size, src_float ? "sg_f2i32(%s)" : "(int64_t)(int32_t)%s", e); break;
    case SG_I64: snprintf(buf, size, src_float ? "sg_f2i64(%s)" : "%s", e); break;
    case SG_BOOL: snprintf(buf, size, src_float ? "(int64_t)(%s != 0.0f)" : "(int64_t)(%s != 0)", e); break;
    }
}

static void store_stmt(const sg__ref *r, const char *off, const char *v, char *buf, size_t size) {
    switch (r->dtype) {
    case SG_F32: snprintf(buf, size, "((float *)slot[%d])[%s] = %s;", r->slot, off, v); break;
    case SG_F16: snprintf(buf, size, "((uint16_t *)slot[%d])[%s] = sg_f2h(%s);", r->slot, off, v); break;
    case SG_BF16: snprintf(buf, size, "((uint16_t *)slot[%d])[%s] = sg_f2bf(%s);", r->slot, off, v); break;
    case SG_BOOL: snprintf(buf, size, "((uint8_t *)slot[%d])[%s] = (uint8_t)(%s != 0);", r->slot, off, v); break;
    default: snprintf(buf, size, "((%s *)slot[%d])[%s] = (%s)%s;", ctype(r->dtype), r->slot, off, ctype(r->dtype), v); break;
    }
}

static void scalar_text(double v, bool fl, sg_dtype dt, char *buf, size_t size) {
    /* %a prints inf and nan, which are no C constants: math.h's are. */
    char d[40];
    if (v != v)
        snprintf(d, sizeof d, "NAN");
    else if (isinf(v))
        snprintf(d, sizeof d, v > 0 ? "INFINITY" : "-INFINITY");
    else
        snprintf(d, sizeof d, "%a", v);
    if (fl && dt != SG_F32 && sg__dtype_is_float(dt))
        snprintf(buf, size, "sg_round_odd(%s)", d); /* one rounding to f16/bf16 */
    else if (fl)
        snprintf(buf, size, "(float)(%s)", d);
    else if (sg__double_to_int(v, dt) == INT64_MIN)
        snprintf(buf, size, "INT64_MIN");
    else
        snprintf(buf, size, "(int64_t)%lldLL", (long long)sg__double_to_int(v, dt));
}

/* The op applied to argument names a, b, c (C text), in the domain of `fl`;
 * dt is the dtype whose rules the scalars follow. */
static bool op_expr(const sg__irnode *n, bool fl, sg_dtype dt, const char *a, const char *b,
                    const char *c, char *buf, size_t size) {
    char s0[64], s1[64];
    bool fill_half = n->op == SG__OP_FILL && (dt == SG_F16 || dt == SG_BF16);
    scalar_text(n->f[0], fl, fill_half ? dt : fl ? SG_F32 : dt, s0, sizeof s0);
    scalar_text(n->f[1], fl, fl ? SG_F32 : dt, s1, sizeof s1);
    const char *cmp = NULL;
    switch (n->op) {
    case SG__OP_EQ: cmp = "=="; break;
    case SG__OP_NE: cmp = "!="; break;
    case SG__OP_LT: cmp = "<"; break;
    case SG__OP_LE: cmp = "<="; break;
    case SG__OP_GT: cmp = ">"; break;
    case SG__OP_GE: cmp = ">="; break;
    default: break;
    }
    if (cmp) return snprintf(buf, size, "(int64_t)(%s %s %s)", a, cmp, b), true;
    const char *z = fl ? "0.0f" : "0";
    switch (n->op) {
    case SG__OP_LOGICAL_NOT: snprintf(buf, size, "(int64_t)(%s == %s)", a, z); return true;
    case SG__OP_WHERE: snprintf(buf, size, "(%s ? %s : %s)", a, b, c); return true;
    case SG__OP_CAST:
    case SG__OP_COPY: snprintf(buf, size, "%s", a); return true;
    case SG__OP_FILL: snprintf(buf, size, "%s", s0); return true;
    default: break;
    }
    if (fl) {
        switch (n->op) {
        case SG__OP_NEG: snprintf(buf, size, "(-%s)", a); break;
        case SG__OP_ABS: snprintf(buf, size, "fabsf(%s)", a); break;
        case SG__OP_EXP: snprintf(buf, size, "expf(%s)", a); break;
        case SG__OP_LOG: snprintf(buf, size, "logf(%s)", a); break;
        case SG__OP_SQRT: snprintf(buf, size, "sqrtf(%s)", a); break;
        case SG__OP_RSQRT: snprintf(buf, size, "(1.0f / sqrtf(%s))", a); break;
        case SG__OP_SIN: snprintf(buf, size, "sinf(%s)", a); break;
        case SG__OP_COS: snprintf(buf, size, "cosf(%s)", a); break;
        case SG__OP_TANH: snprintf(buf, size, "tanhf(%s)", a); break;
        case SG__OP_SIGMOID: snprintf(buf, size, "(1.0f / (1.0f + expf(-%s)))", a); break;
        case SG__OP_RELU: snprintf(buf, size, "(%s > 0.0f || %s != %s ? %s : 0.0f)", a, a, a, a); break;
        case SG__OP_GELU: snprintf(buf, size, "sg_gelu(%s)", a); break;
        case SG__OP_GELU_TANH: snprintf(buf, size, "sg_gelu_tanh(%s)", a); break;
        case SG__OP_SILU: snprintf(buf, size, "(%s / (1.0f + expf(-%s)))", a, a); break;
        case SG__OP_ADD_SCALAR: snprintf(buf, size, "(%s + %s)", a, s0); break;
        case SG__OP_MUL_SCALAR: snprintf(buf, size, "(%s * %s)", a, s0); break;
        case SG__OP_POW_SCALAR: snprintf(buf, size, "powf(%s, %s)", a, s0); break;
        case SG__OP_CLAMP: snprintf(buf, size, "(%s < %s ? %s : %s > %s ? %s : %s)", a, s0, s0, a, s1, s1, a); break;
        case SG__OP_ADD: snprintf(buf, size, "(%s + %s)", a, b); break;
        case SG__OP_SUB: snprintf(buf, size, "(%s - %s)", a, b); break;
        case SG__OP_MUL: snprintf(buf, size, "(%s * %s)", a, b); break;
        case SG__OP_DIV: snprintf(buf, size, "(%s / %s)", a, b); break;
        case SG__OP_POW: snprintf(buf, size, "powf(%s, %s)", a, b); break;
        case SG__OP_MAXIMUM: snprintf(buf, size, "(%s != %s || %s > %s ? %s : %s)", a, a, a, b, a, b); break;
        case SG__OP_MINIMUM: snprintf(buf, size, "(%s != %s || %s < %s ? %s : %s)", a, a, a, b, a, b); break;
        case SG__OP_LOGICAL_AND: snprintf(buf, size, "(int64_t)(%s != 0.0f && %s)", a, b); break;
        case SG__OP_LOGICAL_OR: snprintf(buf, size, "(int64_t)(%s != 0.0f || %s)", a, b); break;
        default: return false;
        }
        return true;
    }
    switch (n->op) {
    case SG__OP_NEG: snprintf(buf, size, "SG_WRAP(0u - (uint64_t)%s)", a); break;
    case SG__OP_ABS: snprintf(buf, size, "(%s < 0 ? SG_WRAP(0u - (uint64_t)%s) : %s)", a, a, a); break;
    case SG__OP_RELU: snprintf(buf, size, "(%s > 0 ? %s : 0)", a, a); break;
    case SG__OP_ADD_SCALAR: snprintf(buf, size, "SG_WRAP((uint64_t)%s + (uint64_t)%s)", a, s0); break;
    case SG__OP_MUL_SCALAR: snprintf(buf, size, "SG_WRAP((uint64_t)%s * (uint64_t)%s)", a, s0); break;
    case SG__OP_CLAMP: snprintf(buf, size, "(%s < %s ? %s : %s > %s ? %s : %s)", a, s0, s0, a, s1, s1, a); break;
    case SG__OP_ADD: snprintf(buf, size, "SG_WRAP((uint64_t)%s + (uint64_t)%s)", a, b); break;
    case SG__OP_SUB: snprintf(buf, size, "SG_WRAP((uint64_t)%s - (uint64_t)%s)", a, b); break;
    case SG__OP_MUL: snprintf(buf, size, "SG_WRAP((uint64_t)%s * (uint64_t)%s)", a, b); break;
    case SG__OP_MAXIMUM: snprintf(buf, size, "(%s > %s ? %s : %s)", a, b, a, b); break;
    case SG__OP_MINIMUM: snprintf(buf, size, "(%s < %s ? %s : %s)", a, b, a, b); break;
    case SG__OP_LOGICAL_AND: snprintf(buf, size, "(int64_t)(%s != 0 && %s)", a, b); break;
    case SG__OP_LOGICAL_OR: snprintf(buf, size, "(int64_t)(%s != 0 || %s)", a, b); break;
    default: return false;
    }
    return true;
}

/* ------------------------------------------------------------ loops */

typedef struct gen {
    const sg__ir *ir;
    const sg__fused *f;
    sg__emit *e;
} gen;

static const sg__ref *ref_of(const gen *g, int r) { return &g->ir->refs[g->f->alias[r]]; }

static const sg__ref *arg_of(const gen *g, const sg__irnode *n, int j) {
    int r = g->ir->args[n->args + j];
    return r < 0 ? NULL : ref_of(g, r);
}

/* A ref the loop can address as element i of a flat row-major walk (or a
 * single element). */
static bool flat_ok(const sg__ref *r, int nd, const int64_t *shape) {
    bool scalar = true;
    for (int d = 0; d < r->ndim; d++)
        if (r->shape[d] > 1 && r->stride[d] != 0) scalar = false;
    if (scalar) return true;
    if (r->ndim != nd) return false;
    int64_t expect = 1;
    for (int d = nd - 1; d >= 0; d--) {
        if (r->shape[d] != shape[d]) return false;
        if (shape[d] > 1 && r->stride[d] != expect) return false;
        expect *= shape[d];
    }
    return true;
}

/* Does gnode k's argument j come from a register (and not the anchor, whose
 * value the library wrote to memory)? */
static int reg_src(const sg__group *grp, int k, int j) {
    int s = grp->g[k].arg_src[j];
    return s >= 0 && s != grp->anchor ? s : -1;
}

/* The members [from, to) of a group, elementwise over (nd, shape): the body. */
static void emit_body(gen *g, const sg__group *grp, int from, int to, int nd, const int64_t *shape,
                      bool flat) {
    char off[256], ld[320], expr[700], rt[800], st[1200];
    for (int k = from; k < to; k++) {
        const sg__irnode *n = &g->ir->nodes[grp->g[k].node];
        const sg__ref *o = ref_of(g, n->out);
        char args[3][32] = {"", "", ""};
        for (int j = 0; j < n->nin && j < 3; j++) {
            const sg__ref *a = arg_of(g, n, j);
            if (!a) continue;
            int src = reg_src(grp, k, j);
            bool twice = false; /* v == v on integers is a -Wtautological-compare warning */
            for (int q = 0; q < j && src >= 0; q++) twice |= reg_src(grp, k, q) == src;
            if (src >= 0 && twice && !fdom(a->dtype)) {
                sg__emit_line(g->e, "int64_t a%d_%d = v%d;", k, j, src);
                snprintf(args[j], sizeof args[j], "a%d_%d", k, j);
            } else if (src >= 0) {
                snprintf(args[j], sizeof args[j], "v%d", src);
            } else {
                offset_expr(a, nd, shape, flat, off, sizeof off);
                load_expr(a, off, ld, sizeof ld);
                /* Loads go through a named temporary: some ops use an argument twice. */
                sg__emit_line(g->e, "%s a%d_%d = %s;", fdom(a->dtype) ? "float" : "int64_t", k, j, ld);
                snprintf(args[j], sizeof args[j], "a%d_%d", k, j);
            }
        }
        const sg__ref *a0 = n->nin ? arg_of(g, n, 0) : NULL;
        bool in_fl = n->op == SG__OP_FILL ? fdom(o->dtype) : a0 && fdom(a0->dtype);
        bool res_fl = in_fl;
        if ((n->op >= SG__OP_EQ && n->op <= SG__OP_LOGICAL_OR) || n->op == SG__OP_LOGICAL_NOT)
            res_fl = false;
        if (n->op == SG__OP_WHERE) res_fl = fdom(arg_of(g, n, 1)->dtype);
        sg_dtype sdt = n->op == SG__OP_FILL ? o->dtype : a0 ? a0->dtype : o->dtype;
        op_expr(n, in_fl, sdt, args[0], args[1], args[2], expr, sizeof expr);
        round_trip(expr, res_fl, o->dtype, rt, sizeof rt);
        sg__emit_line(g->e, "%s v%d = %s; /* %s */", fdom(o->dtype) ? "float" : "int64_t", k, rt,
                      sg__op_name(n->op));
        bool read = false; /* by a later member, from the register */
        for (int q = k + 1; q < to && !read; q++)
            for (int j = 0; j < g->ir->nodes[grp->g[q].node].nin && !read; j++)
                read = reg_src(grp, q, j) == k;
        if (!read && !grp->g[k].store) /* a value nothing reads (fusion disabled keeps it) */
            sg__emit_line(g->e, "(void)v%d;", k);
        if (grp->g[k].store) {
            char v[32];
            snprintf(v, sizeof v, "v%d", k);
            offset_expr(o, nd, shape, flat, off, sizeof off);
            store_stmt(o, off, v, st, sizeof st);
            sg__emit_line(g->e, "%s", st);
        }
    }
}

/* Is every ref a member touches flat-addressable over the shape? */
static bool group_flat(const gen *g, const sg__group *grp, int from, int to, int nd,
                       const int64_t *shape) {
    for (int k = from; k < to; k++) {
        const sg__irnode *n = &g->ir->nodes[grp->g[k].node];
        if (grp->g[k].store && !flat_ok(ref_of(g, n->out), nd, shape)) return false;
        for (int j = 0; j < n->nin; j++) {
            const sg__ref *a = arg_of(g, n, j);
            if (a && reg_src(grp, k, j) < 0 && !flat_ok(a, nd, shape)) return false;
        }
    }
    return true;
}

/* The loop nest over (nd, shape) around the body of members [from, to);
 * nowait for MULTI members. */
static void emit_loop(gen *g, const sg__group *grp, int from, int to, int nd, const int64_t *shape,
                      bool nowait) {
    int64_t numel = 1;
    for (int d = 0; d < nd; d++) numel *= shape[d];
    bool flat = group_flat(g, grp, from, to, nd, shape);
    const char *nw = nowait ? " nowait" : "";
    if (numel == 0) return;
    if (flat) {
        sg__emit_line(g->e, "SG_OMP(omp for simd schedule(simd:static)%s)", nw);
        sg__emit_open(g->e, "for (int64_t i = 0; i < %lld; i++)", (long long)numel);
        emit_body(g, grp, from, to, nd, shape, true);
        sg__emit_close(g->e);
        return;
    }
    if (nd == 1) {
        sg__emit_line(g->e, "SG_OMP(omp for schedule(static)%s)", nw);
    } else {
        sg__emit_line(g->e, "SG_OMP(omp for collapse(%d) schedule(static)%s)", nd - 1, nw);
    }
    for (int d = 0; d < nd; d++) {
        if (d == nd - 1 && nd > 1) sg__emit_line(g->e, "SG_OMP(omp simd)");
        sg__emit_open(g->e, "for (int64_t i%d = 0; i%d < %lld; i%d++)", d, d, (long long)shape[d], d);
    }
    emit_body(g, grp, from, to, nd, shape, false);
    for (int d = 0; d < nd; d++) sg__emit_close(g->e);
}

/* ------------------------------------------------------------ kernels */

static uint32_t fnv1a(const char *s, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 16777619u;
    return h;
}

/* Does the group have generated code after its library call, if any? */
static bool has_loop(const sg__group *grp) {
    if (grp->kind == SG__G_OPAQUE) return false;
    if (grp->kind == SG__G_POINTWISE || grp->kind == SG__G_MULTI) return true;
    return grp->anchor + 1 < grp->n; /* an epilogue after the anchor */
}

/* Does a reduction or row group compute its anchor's input first? The
 * prologue runs as its own loop and stores what the library call reads. */
static bool has_prologue(const sg__group *grp) {
    return (grp->kind == SG__G_REDUCE || grp->kind == SG__G_ROW) && grp->anchor > 0;
}

/* The prologue's loop shape: the anchor's input. */
static const sg__ref *prologue_ref(const gen *g, const sg__group *grp) {
    return arg_of(g, &g->ir->nodes[grp->g[grp->anchor].node], 0);
}

static void kernel_comment(gen *g, const sg__group *grp, int k, bool pro, const char *name) {
    char sh[96];
    sg__emit_line(g->e, "/*");
    sg__emit_line(g->e, " * kernel %d: %s", k, name);
    if (grp->kind == SG__G_MULTI) {
        sg__emit_line(g->e, " * %d independent loops in one kernel", grp->nmembers);
    } else {
        const char *kind = pro                            ? "prologue before a library call"
                           : grp->kind == SG__G_POINTWISE ? "pointwise"
                                                          : "epilogue after a library call";
        const sg__ref *pr = pro ? prologue_ref(g, grp) : NULL;
        sg__emit_line(g->e, " * %s over %s, IR lines %d..%d, ops:", kind,
                      pr ? sg__shape_str(pr->ndim, pr->shape, sh, sizeof sh)
                         : sg__shape_str(grp->ndim, grp->shape, sh, sizeof sh),
                      grp->first, grp->last);
        for (int i = 0; i < grp->n; i++) {
            char line[512];
            sg__emit_line(g->e, " *   %s%s", sg__ir_node_str(g->ir, grp->g[i].node, line, sizeof line),
                          grp->g[i].store ? "  [stored]" : "");
        }
    }
    sg__emit_line(g->e, " */");
}

/* The function of kernel k (its prologue when `pro`), named after what it
 * fuses, its shape and a hash of its body. */
static void emit_kernel(gen *g, const sg__group *grp, int k, bool pro, char *fname, size_t fsize) {
    sg__emit body = {.ctx = g->e->ctx, .depth = 1};
    gen bg = *g;
    bg.e = &body;
    int nd = grp->ndim;
    const int64_t *shape = grp->shape;
    if (pro) {
        nd = prologue_ref(g, grp)->ndim;
        shape = prologue_ref(g, grp)->shape;
        emit_loop(&bg, grp, 0, grp->anchor, nd, shape, false);
    } else if (grp->kind == SG__G_MULTI) {
        /* Members share no data; one barrier at the end (after the last
         * loop that ran) lets the next kernel of the region read them. */
        for (int m = 0; m < grp->nmembers; m++) {
            const sg__group *part = &g->f->parts[grp->members[m]];
            emit_loop(&bg, part, 0, part->n, part->ndim, part->shape, true);
        }
        sg__emit_line(&body, "SG_OMP(omp barrier)");
    } else {
        emit_loop(&bg, grp, grp->anchor >= 0 ? grp->anchor + 1 : 0, grp->n, nd, shape, false);
    }
    char ops[96], sh[64] = "";
    sg__group_name(g->ir, grp, ops, sizeof ops);
    if (strlen(ops) > 48) ops[48] = '\0';
    size_t q = 0;
    for (int d = 0; d < nd && q < sizeof sh; d++)
        q += (size_t)snprintf(sh + q, sizeof sh - q, d ? "x%lld" : "%lld", (long long)shape[d]);
    const sg__group *tail = grp->kind == SG__G_MULTI ? &g->f->parts[grp->members[0]] : grp;
    sg_dtype dt = g->ir->refs[g->ir->nodes[tail->g[tail->n - 1].node].out].dtype;
    snprintf(fname, fsize, "sg_k%d%s_%s_%s_%s_%06x", k, pro ? "_pro" : "", ops, sg_dtype_name(dt),
             sh[0] ? sh : "1", body.buf ? fnv1a(body.buf, body.len) & 0xffffff : 0);
    kernel_comment(g, grp, k, pro, fname);
    sg__emit_line(g->e, "static void %s(char *const *slot) {", fname);
    if (body.buf) sg__emit_raw(g->e, "%s", body.buf);
    if (body.oom) g->e->oom = true;
    sg__emit_line(g->e, "}");
    sg__emit_line(g->e, "%s", "");
    sg__emit_free(&body);
}

/* ------------------------------------------------------------ the unit */

/* Work in a kernel's loops: forking threads for less costs more than it saves. */
static int64_t kernel_work(const sg__fused *f, const sg__group *grp) {
    if (grp->kind == SG__G_MULTI) {
        int64_t w = 0;
        for (int m = 0; m < grp->nmembers; m++) w += kernel_work(f, &f->parts[grp->members[m]]);
        return w;
    }
    /* Elements times ops: a long chain of transcendentals pays for threads sooner. */
    int64_t w = grp->n;
    for (int d = 0; d < grp->ndim; d++) w *= grp->shape[d];
    return w;
}

/* Work in a group's prologue loop. */
static int64_t prologue_work(const gen *g, const sg__group *grp) {
    const sg__ref *r = prologue_ref(g, grp);
    int64_t w = grp->anchor;
    for (int d = 0; d < r->ndim; d++) w *= r->shape[d];
    return w;
}

#define SG__PAR_MIN 32768 /* as the eager kernels (graphs/cpu/cpu.c) */

/* The library call of a group (its anchor or opaque node), or -1. */
static int call_node(const sg__group *grp) {
    if (grp->kind == SG__G_OPAQUE) return grp->g[0].node;
    if (grp->anchor >= 0) return grp->g[grp->anchor].node;
    return -1;
}

sg_status sg__cgen_c(sg_ctx *ctx, const sg__ir *ir, const sg__fused *f, const char *title,
                     sg__emit *e) {
    gen g = {.ir = ir, .f = f, .e = e};
    /* names[2k]: kernel k's loop after its library call; names[2k+1]: its prologue. */
    char (*names)[160] = sg__calloc(ctx, sizeof *names * (size_t)(f->ngroups ? f->ngroups : 1) * 2);
    if (!names) return sg__fail(ctx, SG_ERR_OOM, "codegen: out of host memory");
    sg__emit_line(e, "/* stepgraph: %s -- %d kernels for %d IR ops (generated; C + OpenMP) */",
                  title, f->ngroups, ir->nnodes);
    sg__emit_raw(e, "%s\n", preamble);
    for (int k = 0; k < f->ngroups; k++) {
        if (has_prologue(&f->groups[k]))
            emit_kernel(&g, &f->groups[k], k, true, names[2 * k + 1], sizeof names[0]);
        if (has_loop(&f->groups[k]))
            emit_kernel(&g, &f->groups[k], k, false, names[2 * k], sizeof names[0]);
    }
    /* The whole step: runs of generated kernels share one parallel region. */
    sg__emit_open(e, "int sg_step(char *const *slot, const sg_rt *rt)");
    sg__emit_line(e, "int rc = 0;");
    sg__emit_line(e, "(void)rt, (void)slot; /* a step of library calls only uses neither */");
    for (int k = 0; k < f->ngroups;) {
        const sg__group *grp = &f->groups[k];
        int call = call_node(grp);
        if (has_prologue(grp)) {
            sg__emit_line(e, "SG_OMP(omp parallel if (%d))", prologue_work(&g, grp) >= SG__PAR_MIN);
            sg__emit_open(e, "%s", "");
            sg__emit_line(e, "%s(slot);", names[2 * k + 1]);
            sg__emit_close(e);
        }
        if (call >= 0) {
            sg__emit_line(e, "if ((rc = rt->run_node(rt->ctx, %d)) != 0) return rc; /* %s */", call,
                          sg__op_name(ir->nodes[call].op));
        }
        if (!has_loop(grp)) {
            k++;
            continue;
        }
        /* Extend the region over following kernels that need no library call first. */
        int j = k;
        int64_t work = 0;
        for (; j < f->ngroups && has_loop(&f->groups[j]) && (j == k || call_node(&f->groups[j]) < 0); j++) {
            int64_t w = kernel_work(f, &f->groups[j]);
            if (w > work) work = w;
        }
        sg__emit_line(e, "SG_OMP(omp parallel if (%d))", work >= SG__PAR_MIN);
        sg__emit_open(e, "%s", "");
        for (int q = k; q < j; q++) sg__emit_line(e, "%s(slot);", names[2 * q]);
        sg__emit_close(e);
        k = j;
    }
    sg__emit_line(e, "return rc;");
    sg__emit_close(e);
    sg__emit_line(e, "%s", "");
    /* One kernel at a time, for the modes that launch kernels one by one. */
    sg__emit_open(e, "int sg_kernel(int k, char *const *slot, const sg_rt *rt)");
    sg__emit_line(e, "int rc = 0;");
    sg__emit_line(e, "(void)rt, (void)rc, (void)slot;");
    sg__emit_line(e, "switch (k) {");
    for (int k = 0; k < f->ngroups; k++) {
        const sg__group *grp = &f->groups[k];
        int call = call_node(grp);
        sg__emit_line(e, "case %d:", k);
        e->depth++;
        if (has_prologue(grp)) {
            sg__emit_line(e, "SG_OMP(omp parallel if (%d))", prologue_work(&g, grp) >= SG__PAR_MIN);
            sg__emit_line(e, "%s(slot);", names[2 * k + 1]);
        }
        if (call >= 0) sg__emit_line(e, "if ((rc = rt->run_node(rt->ctx, %d)) != 0) return rc;", call);
        if (has_loop(grp)) {
            sg__emit_line(e, "SG_OMP(omp parallel if (%d))", kernel_work(f, grp) >= SG__PAR_MIN);
            sg__emit_line(e, "%s(slot);", names[2 * k]);
        }
        sg__emit_line(e, "return 0;");
        e->depth--;
    }
    sg__emit_line(e, "default: return -1;");
    sg__emit_line(e, "}");
    sg__emit_close(e);
    sg__free(ctx, names, sizeof *names * (size_t)(f->ngroups ? f->ngroups : 1) * 2);
    if (e->oom) return sg__fail(ctx, SG_ERR_OOM, "codegen: out of host memory for the source");
    return SG_OK;
}
