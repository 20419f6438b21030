/* SPDX-License-Identifier: MIT */
/*
 * lower.c -- the op semantics of generated code, written once for every
 * dialect: what each pointwise op computes (op text), how a value is
 * rounded to its dtype and widened back, how a scalar is written so that
 * it survives the trip through text, how an element is loaded and stored,
 * where a ref's element sits at the loop indices, and the helpers every
 * unit carries (the f16/bf16 conversions bit for bit those of
 * graphs/cpu/cpu.h, saturating casts, gelu). The generators (cgen_c.c,
 * cgen_cuda.c and cgen_cuda_row.c) decide which loops and kernels there
 * are and call these for every expression.
 *
 * How a thing is spelled in a dialect is one entry of the table below
 * (sg__spell): type names, the helpers' qualifier, the suffix of float
 * math functions, the address space of tensor pointers, thread indices,
 * and the few places where a dialect has a better spelling of the same
 * value (CUDA's hardware bf16/f16 round trips, exact float bits in place
 * of a hex literal). The lowering decides what is computed, the table how
 * it is written.
 */
#include "codegen.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* ------------------------------------------------------------ the dialects' spellings */

/* The C dialect's own preamble: includes, the runtime table, OpenMP
 * guards, the fixed-width types and the float bit casts. */
static const char *const c_head =
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
    "typedef uint8_t sg_u8;\n"
    "typedef uint16_t sg_u16;\n"
    "typedef uint32_t sg_u32;\n"
    "typedef int32_t sg_i32;\n"
    "typedef int64_t sg_i64;\n"
    "typedef uint64_t sg_u64;\n"
    "static inline float sg_u2f(sg_u32 u) { float f; memcpy(&f, &u, 4); return f; }\n"
    "static inline sg_u32 sg_f2u(float f) { sg_u32 u; memcpy(&u, &f, 4); return u; }\n";

/* After the shared helpers: the scalars' rounding to odd (C writes scalars
 * as hex literals of doubles) and glibc's vector libm. */
static const char *const c_tail =
    "/* Rounding to float 'to odd' first makes the later f16/bf16 rounding single. */\n"
    "static inline float sg_round_odd(double v) {\n"
    "    float f = (float)v; uint32_t u;\n"
    "    if ((double)f == v || f != f || isinf(f)) return f;\n"
    "    memcpy(&u, &f, 4); if (u & 1) return f;\n"
    "    return nextafterf(f, v > (double)f ? INFINITY : -INFINITY);\n"
    "}\n"
    "/* glibc's vector libm (see graphs/cpu/cpu_pointwise.c for why it is declared here). */\n"
    "#if defined(_OPENMP) && defined(__x86_64__) && defined(__GLIBC__) && !defined(__FAST_MATH__) "
    "&& \\\n"
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

/* CUDA's (and HIP's, through the HIP prelude's name map): NVRTC has no
 * include path, so the types are written out; the vector types of 16- and
 * 8-byte accesses; programmatic dependent launch. */
static const char *const cuda_head =
    "typedef unsigned char sg_u8;\n"
    "typedef unsigned short sg_u16;\n"
    "typedef unsigned int sg_u32;\n"
    "typedef int sg_i32;\n"
    "typedef long long sg_i64;\n"
    "typedef unsigned long long sg_u64;\n"
    "/* Vector types for 16-, 8-, 4- and 2-byte loads and stores. */\n"
    "struct alignas(16) sg_v16 { sg_u32 w[4]; };\n"
    "struct alignas(8) sg_v8 { sg_u32 w[2]; };\n"
    "#define SG_DEV static __device__ __forceinline__\n"
    "/* Programmatic dependent launch (sm_90+): the next kernel may start once\n"
    " * every block here has begun; each kernel waits for the one before it\n"
    " * to finish, and its writes to show, before it reads what that wrote. */\n"
    "SG_DEV void sg_pdl_launch(void) {\n"
    "#if __CUDA_ARCH__ >= 900\n"
    "    asm volatile(\"griddepcontrol.launch_dependents;\" ::: \"memory\");\n"
    "#endif\n"
    "}\n"
    "SG_DEV void sg_pdl_wait(void) {\n"
    "#if __CUDA_ARCH__ >= 900\n"
    "    asm volatile(\"griddepcontrol.wait;\" ::: \"memory\");\n"
    "#endif\n"
    "}\n"
    "#define sg_u2f(u) __uint_as_float(u)\n"
    "#define sg_f2u(f) __float_as_uint(f)\n";

/* After the shared helpers: one hardware conversion each way. */
static const char *const cuda_tail =
    "/* A float rounded to bf16 or f16 and widened back, as a store and a load\n"
    " * would: one hardware conversion each way, rounding to nearest even as\n"
    " * sg_f2bf and sg_f2h do (a NaN stays a NaN; its payload is the device's). */\n"
    "SG_DEV float sg_bf_rt(float f) {\n"
    "#if __CUDA_ARCH__ >= 800\n"
    "    sg_u16 h; asm(\"cvt.rn.bf16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f));\n"
    "    return __uint_as_float((sg_u32)h << 16);\n"
    "#else\n"
    "    return sg_bf2f(sg_f2bf(f));\n"
    "#endif\n"
    "}\n"
    "/* Two floats rounded as sg_bf_rt does, in one packed conversion. */\n"
    "SG_DEV void sg_bf_rt2(float a, float b, float *ra, float *rb) {\n"
    "#if __CUDA_ARCH__ >= 800\n"
    "    sg_u32 p; asm(\"cvt.rn.bf16x2.f32 %0, %1, %2;\" : \"=r\"(p) : \"f\"(a), \"f\"(b));\n"
    "    *ra = __uint_as_float(p & 0xffff0000u); *rb = __uint_as_float(p << 16);\n"
    "#else\n"
    "    *ra = sg_bf_rt(a); *rb = sg_bf_rt(b);\n"
    "#endif\n"
    "}\n"
    "/* TF32 tensor-core products (sm_80+; cgen_gemm.c): x as a TF32 head h and\n"
    " * the TF32 rounding of its remainder l (x - h is exact), and c, a 16 x 8\n"
    " * f32 tile, += a (16 x 8) b (8 x 8) in mma.sync's fragment layouts. */\n"
    "SG_DEV void sg_tf32_split(float x, sg_u32 *h, sg_u32 *l) {\n"
    "    /* Rounding to nearest (ties away) by adding half of the dropped 13\n"
    "     * bits to the magnitude: integer operations where cvt.rna.tf32 takes\n"
    "     * four. inf stays inf; a NaN keeps a NaN head (the addition would\n"
    "     * carry the payload of 0x7fffffff, the device's NaN, into the sign and\n"
    "     * leave -0), so the product is NaN; its remainder is then any value. */\n"
    "    const sg_u32 u = sg_f2u(x);\n"
    "    *h = ((u & 0x7fffffffu) > 0x7f800000u ? u | 0x7fc00000u : u + 0x1000u) & 0xffffe000u;\n"
    "    *l = (sg_f2u(x - sg_u2f(*h)) + 0x1000u) & 0xffffe000u;\n"
    "}\n"
    "/* The TF32 head alone, rounded as cvt.rna.tf32 does (NaN kept). */\n"
    "SG_DEV sg_u32 sg_tf32(float x) {\n"
    "#if __CUDA_ARCH__ >= 800\n"
    "    sg_u32 h; asm(\"cvt.rna.tf32.f32 %0, %1;\" : \"=r\"(h) : \"f\"(x));\n"
    "    return h;\n"
    "#else\n"
    "    return sg_f2u(x);\n"
    "#endif\n"
    "}\n"
    "SG_DEV void sg_mma_tf32(float *c, const sg_u32 *a, const sg_u32 *b) {\n"
    "#if __CUDA_ARCH__ >= 800\n"
    "    asm volatile(\"mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, \"\n"
    "                 \"{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\"\n"
    "                 : \"+f\"(c[0]), \"+f\"(c[1]), \"+f\"(c[2]), \"+f\"(c[3])\n"
    "                 : \"r\"(a[0]), \"r\"(a[1]), \"r\"(a[2]), \"r\"(a[3]), \"r\"(b[0]), "
    "\"r\"(b[1]));\n"
    "#endif\n"
    "}\n"
    "/* 4 bytes from global to shared memory, asynchronously on sm_80+ (zeros\n"
    " * where !ok; src is then any valid address), a commit group of them, and\n"
    " * a wait until at most n groups are in flight (a plain copy before). */\n"
    "SG_DEV void sg_cp4(float *dst, const float *src, bool ok) {\n"
    "#if __CUDA_ARCH__ >= 800\n"
    "    asm volatile(\"cp.async.ca.shared.global [%0], [%1], 4, %2;\"\n"
    "                 :: \"r\"((sg_u32)__cvta_generic_to_shared(dst)), \"l\"(src), \"r\"(ok ? 4 : "
    "0));\n"
    "#else\n"
    "    *dst = ok ? *src : 0.0f;\n"
    "#endif\n"
    "}\n"
    "/* The same for 16 bytes (dst and src on 16 bytes). */\n"
    "SG_DEV void sg_cp16(float *dst, const float *src, bool ok) {\n"
    "#if __CUDA_ARCH__ >= 800\n"
    "    asm volatile(\"cp.async.cg.shared.global [%0], [%1], 16, %2;\"\n"
    "                 :: \"r\"((sg_u32)__cvta_generic_to_shared(dst)), \"l\"(src), \"r\"(ok ? 16 : "
    "0));\n"
    "#else\n"
    "    for (int i = 0; i < 4; i++) dst[i] = ok ? src[i] : 0.0f;\n"
    "#endif\n"
    "}\n"
    "#if __CUDA_ARCH__ >= 800\n"
    "#define sg_cp_commit() asm volatile(\"cp.async.commit_group;\" ::: \"memory\")\n"
    "#define sg_cp_wait(n) asm volatile(\"cp.async.wait_group \" #n \";\" ::: \"memory\")\n"
    "#else\n"
    "#define sg_cp_commit() ((void)0)\n"
    "#define sg_cp_wait(n) ((void)0)\n"
    "#endif\n"
    "SG_DEV float sg_h_rt(float f) {\n"
    "#if defined(__CUDA_ARCH__)\n"
    "    sg_u16 h; float r;\n"
    "    asm(\"cvt.rn.f16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f));\n"
    "    asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(r) : \"h\"(h));\n"
    "    return r;\n"
    "#else /* hiprtc (HIP): no PTX */\n"
    "    return (float)(_Float16)f;\n"
    "#endif\n"
    "}\n";

/* OpenCL C: no contraction into fma (the CPU computes a * b + c in two
 * roundings), the built-in vector types for 16- and 8-byte accesses, no
 * dependent launch. */
static const char *const opencl_head =
    "#pragma OPENCL FP_CONTRACT OFF\n"
    "typedef uchar sg_u8;\n"
    "typedef ushort sg_u16;\n"
    "typedef uint sg_u32;\n"
    "typedef int sg_i32;\n"
    "typedef long sg_i64;\n"
    "typedef ulong sg_u64;\n"
    "/* Vector types for 16-, 8-, 4- and 2-byte loads and stores. */\n"
    "typedef uint4 sg_v16;\n"
    "typedef uint2 sg_v8;\n"
    "#define sg_pdl_launch()\n"
    "#define sg_pdl_wait()\n"
    "#define sg_u2f(u) as_float(u)\n"
    "#define sg_f2u(f) as_uint(f)\n";

/* After the shared helpers: the round trips under CUDA's names, which the
 * row and GEMV kernels write in every GPU dialect. */
static const char *const opencl_tail =
    "static inline float sg_bf_rt(float f) { return sg_bf2f(sg_f2bf(f)); }\n"
    "static inline float sg_h_rt(float f) { return sg_h2f(sg_f2h(f)); }\n";

/*
 * The helpers of every unit, one text: "$D" is the dialect's function
 * qualifier, "$F" the suffix of its float math functions. Integers round
 * to float 'to odd' (the bits shifted out stick to the last one kept), so
 * that their later rounding to f16/bf16 is single, as the CPU's.
 */
static const char *const shared_helpers =
    "#define SG_WRAP(x) ((sg_i64)(sg_u64)(x))\n"
    "\n"
    "/* f16 and bf16 conversions, bit for bit those of the CPU backend. */\n"
    "$D float sg_h2f(sg_u16 h) {\n"
    "    sg_u32 sign = (sg_u32)(h & 0x8000) << 16, e = (h >> 10) & 31, m = h & 1023, u;\n"
    "    if (e == 0) {\n"
    "        if (m == 0) { u = sign; }\n"
    "        else { e = 113; while (!(m & 1024)) { m <<= 1; e--; } u = sign | (e << 23) | ((m & "
    "1023) << 13); }\n"
    "    } else if (e == 31) { u = sign | 0x7f800000u | (m << 13); }\n"
    "    else { u = sign | ((e + 112) << 23) | (m << 13); }\n"
    "    return sg_u2f(u);\n"
    "}\n"
    "$D sg_u16 sg_f2h(float f) {\n"
    "    sg_u32 u = sg_f2u(f);\n"
    "    sg_u32 sign = (u >> 16) & 0x8000, a = u & 0x7fffffffu;\n"
    "    if (a > 0x7f800000u) return (sg_u16)(sign | 0x7e00);\n"
    "    if (a >= 0x477ff000u) return (sg_u16)(sign | 0x7c00);\n"
    "    if (a < 0x38800000u) { float r = sg_u2f(a) + 0.5f;\n"
    "        return (sg_u16)(sign | (sg_f2u(r) - 0x3f000000u)); }\n"
    "    sg_u32 odd = (a >> 13) & 1; a += 0xc8000fffu + odd; return (sg_u16)(sign | (a >> 13));\n"
    "}\n"
    "$D float sg_bf2f(sg_u16 b) { return sg_u2f((sg_u32)b << 16); }\n"
    "$D sg_u16 sg_f2bf(float f) {\n"
    "    sg_u32 u = sg_f2u(f);\n"
    "    if ((u & 0x7fffffffu) > 0x7f800000u) return (sg_u16)((u >> 16) | 0x40);\n"
    "    u += 0x7fffu + ((u >> 16) & 1); return (sg_u16)(u >> 16);\n"
    "}\n"
    "/* Saturating casts: NaN to 0, out of range to the nearest limit. */\n"
    "$D sg_i64 sg_f2i32(float v) {\n"
    "    return v != v ? 0 : v >= 2147483647.0f ? (sg_i64)2147483647 : v <= -2147483648.0f\n"
    "         ? (sg_i64)(-2147483647 - 1) : (sg_i64)(sg_i32)v;\n"
    "}\n"
    "$D sg_i64 sg_f2i64(float v) {\n"
    "    return v != v ? 0 : v >= 9.2233720e18f ? (sg_i64)9223372036854775807\n"
    "         : v <= -9.2233720e18f ? -(sg_i64)9223372036854775807 - 1 : (sg_i64)v;\n"
    "}\n"
    "$D float sg_gelu(float x) { return 0.5f * x * erfc$F(x * -0.70710678118654752f); }\n"
    "$D float sg_gelu_tanh(float x) {\n"
    "    return 0.5f * x * (1.0f + tanh$F(0.7978845608028654f * (x + 0.044715f * x * x * x)));\n"
    "}\n"
    "/* gelu_tanh'(x) * g (GELU_TANH_BWD). */\n"
    "$D float sg_gelu_tanh_bwd(float x, float g) {\n"
    "    float x2 = x * x, t = tanh$F(0.7978845608028654f * (x + 0.044715f * x2 * x));\n"
    "    float du = 0.7978845608028654f * (1.0f + 0.134145f * x2);\n"
    "    return (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du) * g;\n"
    "}\n"
    "/* An integer rounded to float 'to odd', so that its later f16/bf16 rounding is single. */\n"
    "$D float sg_i2f_odd(sg_i64 v) {\n"
    "    sg_u64 u = v < 0 ? 0 - (sg_u64)v : (sg_u64)v, sticky = 0; int sh = 0;\n"
    "    while (u >> 24) { sticky |= u & 1; u >>= 1; sh++; }\n"
    "    float f = ldexp$F((float)(u | sticky), sh);\n"
    "    return v < 0 ? -f : f;\n"
    "}\n";

/* CUDA's spellings, which HIP shares (its prelude maps the names). */
#define CUDA_LIKE(unit_name)                                                                       \
    {                                                                                              \
        .name = unit_name, .u8 = "sg_u8", .u16 = "sg_u16", .i32 = "sg_i32", .i64 = "sg_i64",       \
        .u64 = "sg_u64", .i64_min = "(-9223372036854775807LL - 1)", .ll = "LL", .fn = "SG_DEV",    \
        .mf = "f", .gp = "", .fbits = "__uint_as_float(0x%08xu) /* %g */", .h_rt = "sg_h_rt(%s)",  \
        .bf_rt = "sg_bf_rt(%s)", .head = cuda_head, .tail = cuda_tail,                             \
        .kernel = "extern \"C\" __global__ void", .tid = "threadIdx.x", .bid = "blockIdx.x",       \
        .bdim = "blockDim.x", .gdim = "gridDim.x", .sync = "__syncthreads();",                     \
        .launch_bounds = true, .shuffles = true, .u2f = "__uint_as_float", .shared = "__shared__", \
        .lp = "", .table = "static __device__ const", .ctable = "static __constant__ const"          \
    }

static const sg__spell spells[] = {
    [SG__DIALECT_C] =
        {
            .name = "C + OpenMP",
            .u8 = "uint8_t",
            .u16 = "uint16_t",
            .i32 = "int32_t",
            .i64 = "int64_t",
            .u64 = "uint64_t",
            .i64_min = "INT64_MIN",
            .ll = "LL",
            .fn = "static inline",
            .mf = "f",
            .gp = "",
            .h_rt = "sg_h2f(sg_f2h(%s))",
            .bf_rt = "sg_bf2f(sg_f2bf(%s))",
            .head = c_head,
            .tail = c_tail,
        },
    [SG__DIALECT_CUDA] = CUDA_LIKE("CUDA C for NVRTC"),
    /* The CUDA text, compiled after the HIP prelude's name map. */
    [SG__DIALECT_HIP] = CUDA_LIKE("HIP C++ for hiprtc"),
    [SG__DIALECT_OPENCL] =
        {
            .name = "OpenCL C",
            .u8 = "sg_u8",
            .u16 = "sg_u16",
            .i32 = "sg_i32",
            .i64 = "sg_i64",
            .u64 = "sg_u64",
            .i64_min = "(-9223372036854775807L - 1)",
            .ll = "L",
            .fn = "static inline",
            .mf = "",
            .gp = "__global ",
            .fbits = "as_float(0x%08xu) /* %g */",
            .h_rt = "sg_h2f(sg_f2h(%s))",
            .bf_rt = "sg_bf2f(sg_f2bf(%s))",
            .head = opencl_head,
            .tail = opencl_tail,
            .kernel = "__kernel void",
            .tid = "get_local_id(0)",
            .bid = "get_group_id(0)",
            .bdim = "get_local_size(0)",
            .gdim = "get_num_groups(0)",
            .sync = "barrier(CLK_GLOBAL_MEM_FENCE | CLK_LOCAL_MEM_FENCE);",
            .launch_bounds = false,
            .u2f = "as_float",
            .shared = "__local",
            .lp = "__local ",
            .shared_top = true,
        },
};

const sg__spell *sg__spell_of(sg__dialect d) {
    return d >= SG__DIALECT_C && d <= SG__DIALECT_OPENCL ? &spells[d] : &spells[SG__DIALECT_C];
}

void sg__lower_preamble(sg__dialect d, sg__emit *e) {
    const sg__spell *s = sg__spell_of(d);
    sg__emit_raw(e, "%s", s->head);
    for (const char *p = shared_helpers; *p;) {
        const char *q = strchr(p, '$');
        if (!q) {
            sg__emit_raw(e, "%s", p);
            break;
        }
        sg__emit_raw(e, "%.*s%s", (int)(q - p), p, q[1] == 'D' ? s->fn : q[1] == 'F' ? s->mf : "");
        p = q[1] ? q + 2 : q + 1;
    }
    sg__emit_raw(e, "%s", s->tail);
}

/* Is c a character of an identifier or a number? */
static bool word_char(char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

size_t sg__lower_literals(sg__dialect d, char *text, size_t len) {
    const char *ll = sg__spell_of(d)->ll;
    if (!text || !ll || strcmp(ll, "LL") == 0) return len;
    size_t w = 0;
    for (size_t r = 0; r < len; r++) {
        text[w++] = text[r];
        /* The second L of "<number>LL" or "<number>ull" (a number: a word
         * that starts with a digit) ends the word: drop it. */
        bool two = r + 2 <= len && (text[r] == 'L' || text[r] == 'l') && text[r + 1] == text[r] &&
                   (r + 2 == len || !word_char(text[r + 2]));
        if (!two) continue;
        size_t b = r;
        while (b > 0 && word_char(text[b - 1])) b--;
        if (b < r && text[b] >= '0' && text[b] <= '9') r++;
    }
    return w;
}

/* ------------------------------------------------------------ types and values */

bool sg__lower_fdom(sg_dtype dt) { return dt == SG_F32 || dt == SG_F16 || dt == SG_BF16; }

const char *sg__lower_ctype(sg__dialect d, sg_dtype dt) {
    const sg__spell *s = sg__spell_of(d);
    switch (dt) {
    case SG_F32: return "float";
    case SG_F16:
    case SG_BF16: return s->u16;
    case SG_I32: return s->i32;
    case SG_I64: return s->i64;
    case SG_BOOL: return s->u8;
    }
    return "?";
}

const char *sg__lower_vtype(sg__dialect d, bool fl) { return fl ? "float" : sg__spell_of(d)->i64; }

void sg__lower_widen(sg__dialect d, sg_dtype dt, const char *lv, char *buf, size_t size) {
    const char *i64 = sg__spell_of(d)->i64;
    switch (dt) {
    case SG_F32: snprintf(buf, size, "%s", lv); break;
    case SG_F16: snprintf(buf, size, "sg_h2f(%s)", lv); break;
    case SG_BF16: snprintf(buf, size, "sg_bf2f(%s)", lv); break;
    case SG_BOOL: snprintf(buf, size, "(%s)(%s != 0)", i64, lv); break;
    default: snprintf(buf, size, "(%s)%s", i64, lv); break;
    }
}

void sg__lower_narrow_store(sg__dialect d, sg_dtype dt, const char *lv, const char *v, char *buf,
                            size_t size) {
    switch (dt) {
    case SG_F32: snprintf(buf, size, "%s = %s;", lv, v); break;
    case SG_F16: snprintf(buf, size, "%s = sg_f2h(%s);", lv, v); break;
    case SG_BF16: snprintf(buf, size, "%s = sg_f2bf(%s);", lv, v); break;
    case SG_BOOL: snprintf(buf, size, "%s = (%s)(%s != 0);", lv, sg__spell_of(d)->u8, v); break;
    default: snprintf(buf, size, "%s = (%s)%s;", lv, sg__lower_ctype(d, dt), v); break;
    }
}

void sg__lower_round_trip(sg__dialect d, const char *e, bool src_float, sg_dtype dt, char *buf,
                          size_t size) {
    const sg__spell *s = sg__spell_of(d);
    char inner[1200];
    switch (dt) {
    case SG_F32: snprintf(buf, size, src_float ? "%s" : "(float)%s", e); break;
    case SG_F16:
    case SG_BF16:
        if (src_float)
            snprintf(inner, sizeof inner, "%s", e);
        else
            snprintf(inner, sizeof inner, "sg_i2f_odd(%s)", e);
        snprintf(buf, size, dt == SG_F16 ? s->h_rt : s->bf_rt, inner);
        break;
    case SG_I32:
        if (src_float)
            snprintf(buf, size, "sg_f2i32(%s)", e);
        else
            snprintf(buf, size, "(%s)(%s)%s", s->i64, s->i32, e);
        break;
    case SG_I64: snprintf(buf, size, src_float ? "sg_f2i64(%s)" : "%s", e); break;
    case SG_BOOL:
        snprintf(buf, size, src_float ? "(%s)(%s != 0.0f)" : "(%s)(%s != 0)", s->i64, e);
        break;
    }
}

/*
 * A scalar in the compute domain: a dialect with `fbits` writes a float as
 * its exact bits (rounded to odd here when it is a half's, so the rounding
 * to the half is single), so that inf, NaN and every finite value survive
 * the trip through text; C writes the double as a hex literal (math.h's
 * NAN and INFINITY for those) and rounds it to odd in the unit.
 */
void sg__lower_scalar(sg__dialect d, double v, bool fl, sg_dtype dt, char *buf, size_t size) {
    const sg__spell *s = sg__spell_of(d);
    if (fl && s->fbits) {
        float f = dt != SG_F32 && sg__dtype_is_float(dt) ? sg__round_odd(v) : (float)v;
        uint32_t u;
        memcpy(&u, &f, 4);
        snprintf(buf, size, s->fbits, (unsigned)u, (double)f);
    } else if (fl) {
        char t[40];
        if (v != v)
            snprintf(t, sizeof t, "NAN");
        else if (isinf(v))
            snprintf(t, sizeof t, v > 0 ? "INFINITY" : "-INFINITY");
        else
            snprintf(t, sizeof t, "%a", v);
        if (dt != SG_F32 && sg__dtype_is_float(dt))
            snprintf(buf, size, "sg_round_odd(%s)", t); /* one rounding to f16/bf16 */
        else
            snprintf(buf, size, "(float)(%s)", t);
    } else if (sg__double_to_int(v, dt) == INT64_MIN) {
        snprintf(buf, size, "%s", s->i64_min);
    } else {
        snprintf(buf, size, "(%s)%lld%s", s->i64, (long long)sg__double_to_int(v, dt), s->ll);
    }
}

/* The op of a float argument a (and b): a math function's call, its name
 * spelled with the dialect's suffix; false when the op is not one. */
static bool float_call(const sg__spell *s, sg__op op, const char *a, const char *b, const char *s0,
                       char *buf, size_t size) {
    const char *mf = s->mf;
    switch (op) {
    case SG__OP_ABS: snprintf(buf, size, "fabs%s(%s)", mf, a); break;
    case SG__OP_EXP: snprintf(buf, size, "exp%s(%s)", mf, a); break;
    case SG__OP_LOG: snprintf(buf, size, "log%s(%s)", mf, a); break;
    case SG__OP_SQRT: snprintf(buf, size, "sqrt%s(%s)", mf, a); break;
    case SG__OP_RSQRT: snprintf(buf, size, "(1.0f / sqrt%s(%s))", mf, a); break;
    case SG__OP_SIN: snprintf(buf, size, "sin%s(%s)", mf, a); break;
    case SG__OP_COS: snprintf(buf, size, "cos%s(%s)", mf, a); break;
    case SG__OP_TANH: snprintf(buf, size, "tanh%s(%s)", mf, a); break;
    case SG__OP_SIGMOID: snprintf(buf, size, "(1.0f / (1.0f + exp%s(-%s)))", mf, a); break;
    case SG__OP_SILU: snprintf(buf, size, "(%s / (1.0f + exp%s(-%s)))", a, mf, a); break;
    case SG__OP_POW_SCALAR: snprintf(buf, size, "pow%s(%s, %s)", mf, a, s0); break;
    case SG__OP_POW: snprintf(buf, size, "pow%s(%s, %s)", mf, a, b); break;
    default: return false;
    }
    return true;
}

/* The other ops of float arguments. */
static bool float_op(const sg__spell *s, const sg__irnode *n, const char *a, const char *b,
                     const char *s0, const char *s1, char *buf, size_t size) {
    if (float_call(s, n->op, a, b, s0, buf, size)) return true;
    switch (n->op) {
    case SG__OP_NEG: snprintf(buf, size, "(-%s)", a); break;
    case SG__OP_RELU: snprintf(buf, size, "(%s > 0.0f || %s != %s ? %s : 0.0f)", a, a, a, a); break;
    case SG__OP_GELU: snprintf(buf, size, "sg_gelu(%s)", a); break;
    case SG__OP_GELU_TANH: snprintf(buf, size, "sg_gelu_tanh(%s)", a); break;
    case SG__OP_GELU_TANH_BWD: snprintf(buf, size, "sg_gelu_tanh_bwd(%s, %s)", a, b); break;
    case SG__OP_ADD_SCALAR: snprintf(buf, size, "(%s + %s)", a, s0); break;
    case SG__OP_MUL_SCALAR: snprintf(buf, size, "(%s * %s)", a, s0); break;
    case SG__OP_CLAMP:
        snprintf(buf, size, "(%s < %s ? %s : %s > %s ? %s : %s)", a, s0, s0, a, s1, s1, a);
        break;
    case SG__OP_ADD: snprintf(buf, size, "(%s + %s)", a, b); break;
    case SG__OP_SUB: snprintf(buf, size, "(%s - %s)", a, b); break;
    case SG__OP_MUL: snprintf(buf, size, "(%s * %s)", a, b); break;
    case SG__OP_DIV: snprintf(buf, size, "(%s / %s)", a, b); break;
    case SG__OP_MAXIMUM:
        snprintf(buf, size, "(%s != %s || %s > %s ? %s : %s)", a, a, a, b, a, b);
        break;
    case SG__OP_MINIMUM:
        snprintf(buf, size, "(%s != %s || %s < %s ? %s : %s)", a, a, a, b, a, b);
        break;
    case SG__OP_LOGICAL_AND: snprintf(buf, size, "(%s)(%s != 0.0f && %s)", s->i64, a, b); break;
    case SG__OP_LOGICAL_OR: snprintf(buf, size, "(%s)(%s != 0.0f || %s)", s->i64, a, b); break;
    default: return false;
    }
    return true;
}

/* The ops of integer arguments: 64-bit values, wrapping as two's complement. */
static bool int_op(const sg__spell *s, const sg__irnode *n, const char *a, const char *b,
                   const char *s0, const char *s1, char *buf, size_t size) {
    const char *u = s->u64, *i = s->i64;
    switch (n->op) {
    case SG__OP_NEG: snprintf(buf, size, "SG_WRAP(0u - (%s)%s)", u, a); break;
    case SG__OP_ABS: snprintf(buf, size, "(%s < 0 ? SG_WRAP(0u - (%s)%s) : %s)", a, u, a, a); break;
    case SG__OP_RELU: snprintf(buf, size, "(%s > 0 ? %s : 0)", a, a); break;
    case SG__OP_ADD_SCALAR: snprintf(buf, size, "SG_WRAP((%s)%s + (%s)%s)", u, a, u, s0); break;
    case SG__OP_MUL_SCALAR: snprintf(buf, size, "SG_WRAP((%s)%s * (%s)%s)", u, a, u, s0); break;
    case SG__OP_CLAMP:
        snprintf(buf, size, "(%s < %s ? %s : %s > %s ? %s : %s)", a, s0, s0, a, s1, s1, a);
        break;
    case SG__OP_ADD: snprintf(buf, size, "SG_WRAP((%s)%s + (%s)%s)", u, a, u, b); break;
    case SG__OP_SUB: snprintf(buf, size, "SG_WRAP((%s)%s - (%s)%s)", u, a, u, b); break;
    case SG__OP_MUL: snprintf(buf, size, "SG_WRAP((%s)%s * (%s)%s)", u, a, u, b); break;
    case SG__OP_MAXIMUM: snprintf(buf, size, "(%s > %s ? %s : %s)", a, b, a, b); break;
    case SG__OP_MINIMUM: snprintf(buf, size, "(%s < %s ? %s : %s)", a, b, a, b); break;
    case SG__OP_LOGICAL_AND: snprintf(buf, size, "(%s)(%s != 0 && %s)", i, a, b); break;
    case SG__OP_LOGICAL_OR: snprintf(buf, size, "(%s)(%s != 0 || %s)", i, a, b); break;
    default: return false;
    }
    return true;
}

bool sg__lower_op(sg__dialect d, const sg__irnode *n, bool fl, sg_dtype dt, const char *a,
                  const char *b, const char *c, char *buf, size_t size) {
    const sg__spell *s = sg__spell_of(d);
    char s0[96], s1[96];
    bool fill_half = n->op == SG__OP_FILL && (dt == SG_F16 || dt == SG_BF16);
    sg__lower_scalar(d, n->f[0], fl, fill_half ? dt : fl ? SG_F32 : dt, s0, sizeof s0);
    sg__lower_scalar(d, n->f[1], fl, fl ? SG_F32 : dt, s1, sizeof s1);
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
    if (cmp) return snprintf(buf, size, "(%s)(%s %s %s)", s->i64, a, cmp, b), true;
    switch (n->op) {
    case SG__OP_LOGICAL_NOT:
        snprintf(buf, size, "(%s)(%s == %s)", s->i64, a, fl ? "0.0f" : "0");
        return true;
    case SG__OP_WHERE: snprintf(buf, size, "(%s ? %s : %s)", a, b, c); return true;
    case SG__OP_CAST:
    case SG__OP_COPY: snprintf(buf, size, "%s", a); return true;
    case SG__OP_FILL: snprintf(buf, size, "%s", s0); return true;
    default: break;
    }
    return fl ? float_op(s, n, a, b, s0, s1, buf, size) : int_op(s, n, a, b, s0, s1, buf, size);
}

bool sg__lower_member(sg__dialect d, const sg__ir *ir, const sg__fused *f, const sg__irnode *n,
                      const char *const args[3], char *buf, size_t size) {
    const sg__ref *o = sg__lower_ref(ir, f, n->out);
    const sg__ref *a0 = n->nin ? sg__lower_arg(ir, f, n, 0) : NULL;
    bool in_fl = n->op == SG__OP_FILL ? sg__lower_fdom(o->dtype) : a0 && sg__lower_fdom(a0->dtype);
    bool res_fl = in_fl;
    if ((n->op >= SG__OP_EQ && n->op <= SG__OP_LOGICAL_OR) || n->op == SG__OP_LOGICAL_NOT)
        res_fl = false;
    if (n->op == SG__OP_WHERE) res_fl = sg__lower_fdom(sg__lower_arg(ir, f, n, 1)->dtype);
    sg_dtype sdt = n->op == SG__OP_FILL ? o->dtype : a0 ? a0->dtype : o->dtype;
    char expr[1024];
    bool ok = sg__lower_op(d, n, in_fl, sdt, args[0], args[1], args[2], expr, sizeof expr);
    sg__lower_round_trip(d, expr, res_fl, o->dtype, buf, size);
    return ok;
}

/* ------------------------------------------------------------ refs and offsets */

const sg__ref *sg__lower_ref(const sg__ir *ir, const sg__fused *f, int r) {
    return &ir->refs[f->alias[r]];
}

const sg__ref *sg__lower_arg(const sg__ir *ir, const sg__fused *f, const sg__irnode *n, int j) {
    int r = ir->args[n->args + j];
    return r < 0 ? NULL : sg__lower_ref(ir, f, r);
}

bool sg__lower_is_scalar(const sg__ref *r) {
    for (int d = 0; d < r->ndim; d++)
        if (r->shape[d] > 1 && r->stride[d] != 0) return false;
    return true;
}

bool sg__lower_flat_ok(const sg__ref *r, int nd, const int64_t *shape) {
    if (sg__lower_is_scalar(r)) return true;
    if (r->ndim != nd) return false;
    int64_t expect = 1;
    for (int d = nd - 1; d >= 0; d--) {
        if (r->shape[d] != shape[d]) return false;
        if (shape[d] > 1 && r->stride[d] != expect) return false;
        expect *= shape[d];
    }
    return true;
}

int sg__lower_reg_src(const sg__group *grp, int k, int j, bool anchor_reg) {
    int s = j < 4 ? grp->g[k].arg_src[j] : -1; /* arg_src holds 4; more inputs load */
    return s >= 0 && (s != grp->anchor || anchor_reg) ? s : -1;
}

bool sg__lower_group_flat(const sg__ir *ir, const sg__fused *f, const sg__group *grp, int from,
                          int to, int nd, const int64_t *shape, bool anchor_reg) {
    for (int k = from; k < to; k++) {
        const sg__irnode *n = &ir->nodes[grp->g[k].node];
        if (grp->g[k].store && !sg__lower_flat_ok(sg__lower_ref(ir, f, n->out), nd, shape))
            return false;
        for (int j = 0; j < n->nin; j++) {
            const sg__ref *a = sg__lower_arg(ir, f, n, j);
            if (a && sg__lower_reg_src(grp, k, j, anchor_reg) < 0 &&
                !sg__lower_flat_ok(a, nd, shape))
                return false;
        }
    }
    return true;
}

void sg__lower_offset(const sg__ref *r, int nd, const int64_t *shape, bool flat, char *buf,
                      size_t size) {
    size_t k = (size_t)snprintf(buf, size, "%lld", (long long)r->offset);
    if (sg__lower_is_scalar(r)) return;
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

