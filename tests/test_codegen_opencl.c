/* SPDX-License-Identifier: MIT */
/*
 * test_codegen_opencl.c -- the numbers of the OpenCL C dialect
 * (sg__cgen_gpu with SG__DIALECT_OPENCL), run on the first OpenCL CPU device
 * (PoCL). Random pointwise programs (unary math, scalar ops, clamp, binary
 * ops with broadcasting, comparisons feeding where, casts among f32, f16,
 * bf16, i32 and bool, transposed views) over 1 to 3 inputs are captured on
 * the CPU backend, fused as for a GPU, generated in OpenCL C, built with
 * clBuildProgram and run kernel by kernel on fine-grained SVM holding the
 * inputs and every internal slot; each output is compared element by
 * element with the same program run eagerly by the CPU backend: bit for bit
 * when the program has only ops the device rounds as the CPU does (+ - * /,
 * sqrt, max/min, casts, comparisons), else within the output dtype's
 * tolerance (the device's libm differs from glibc's in the last bits). Two
 * independent chains over different shapes make a MULTI kernel; that case
 * checks the unit has one.
 * Row, reduce and GEMV kernels: softmax, log_softmax, layer_norm, rms_norm,
 * sum, mean, var, argmax over the last dim, x - mean(x) (a reduction's
 * epilogue over x's shape), column sums over a middle dim, linear and
 * matmul of 1 to 8 rows (GEMVs along K and along N), a layer_norm
 * feeding a linear (the norm's rows in local memory) and an rms_norm
 * written out of primitives feeding one (without a prologue: one kernel,
 * the mean's row and its epilogue over x in the GEMV), in f32, f16 and bf16,
 * with or without a pointwise prologue and epilogue, over random widths
 * (1, odd, around 32 and 256, up to 9001) and a few long rows and column
 * ranges that are cut into chunks; each against an f64 reference written
 * here (every op's result rounded to the dtype as stored), within the
 * dtype's tolerance plus 2e-6 of the magnitudes a sum adds; one case of
 * each kind and the long ones are also compiled to SPIR-V by libocloc and
 * checked by spirv-val, as the ze backend takes them (where libocloc loads).
 * Exits 77 without an OpenCL CPU device.
 */
#define _POSIX_C_SOURCE 200809L
#include "testutil.h"

#include "codegen/opencl.h"
#include "graphs/graphs.h"

#include <math.h>
#include <string.h>

#ifndef SG_HAVE_OPENCL_HEADERS
int main(void) {
    printf("built without the OpenCL headers: skipped\n");
    return 77;
}
#else

static sg_ctx *ctx;
static const sg__ocl *ocl;
static char gen_msg[512]; /* the generator's (or libocloc's) message when it failed */
static bool spirv_next;   /* build_unit also compiles the unit to SPIR-V (libocloc) */
static sg_status spirv_status;
static cl_command_queue queue;

/* ------------------------------------------------------------ random programs */

enum kind { K_UNARY, K_SCALAR, K_BINARY, K_WHERE, K_CAST, K_TRANSPOSE, K_COUNT };

typedef struct instr {
    enum kind kind;
    int sub, a, b;
    double s0, s1;
    sg_dtype to;
} instr;

typedef struct meta {
    sg_dtype dt;
    int ndim;
    int64_t shape[2];
} meta;

#define MAXV 40
typedef struct prog {
    int nin, n, nout, out[2];
    meta m[MAXV];
    instr code[MAXV];
    bool exact; /* only ops the device rounds as the CPU does */
} prog;

typedef sg_tensor *(*unary_fn)(sg_tensor *);
/* The first 4 are exact; neg, abs and relu also take ints. */
static const unary_fn unary_ops[] = {sg_neg,  sg_abs, sg_relu,      sg_sqrt, sg_sin,  sg_cos,
                                     sg_tanh, sg_exp, sg_gelu_tanh, sg_gelu, sg_silu, sg_sigmoid};
typedef sg_tensor *(*binary_fn)(sg_tensor *, sg_tensor *);
static const binary_fn binary_ops[] = {sg_add, sg_sub, sg_mul, sg_maximum, sg_minimum, sg_div};
typedef sg_tensor *(*cmp_fn)(sg_tensor *, sg_tensor *);
static const cmp_fn cmp_ops[] = {sg_lt, sg_ge, sg_eq, sg_ne};
#define COUNT(a) ((int)(sizeof a / sizeof a[0]))

static bool is_float(sg_dtype dt) { return dt == SG_F32 || dt == SG_F16 || dt == SG_BF16; }

static bool broadcast(const meta *x, const meta *y, meta *out) {
    int nd = x->ndim > y->ndim ? x->ndim : y->ndim;
    for (int d = 0; d < nd; d++) {
        int dx = d - (nd - x->ndim), dy = d - (nd - y->ndim);
        int64_t sx = dx < 0 ? 1 : x->shape[dx], sy = dy < 0 ? 1 : y->shape[dy];
        if (sx != sy && sx != 1 && sy != 1) return false;
        out->shape[d] = sx == 1 ? sy : sx;
    }
    out->ndim = nd;
    out->dt = x->dt;
    return true;
}

/* Inputs of one dtype in the broadcast forms [A,B], [1,B], [A,1], [B]. */
static void gen_inputs(prog *p, sg_dtype base, int64_t A, int64_t B) {
    p->nin = (int)tu_randint(1, 3);
    for (int i = 0; i < p->nin; i++) {
        meta *m = &p->m[i];
        int form = (int)tu_randint(0, 3);
        m->dt = base;
        m->ndim = form == 3 ? 1 : 2;
        m->shape[0] = form == 3 ? B : form == 1 ? 1 : A;
        m->shape[1] = form == 2 ? 1 : B;
    }
}

/* One instruction on value a (and b); false when it does not apply. */
static bool gen_instr(prog *p, int count, instr *in, meta *out) {
    static const sg_dtype casts[5] = {SG_F32, SG_F16, SG_BF16, SG_I32, SG_BOOL};
    const meta *ma = &p->m[in->a];
    bool fl = is_float(ma->dt);
    *out = *ma;
    if (ma->dt == SG_BOOL && in->kind != K_CAST) return false;
    switch (in->kind) {
    case K_UNARY:
        in->sub = (int)tu_randint(0, fl ? COUNT(unary_ops) - 1 : 2);
        p->exact = p->exact && in->sub < 4;
        return true;
    case K_SCALAR:
        in->sub = (int)tu_randint(0, 2);
        in->s0 = fl ? tu_uniform(-1.5, 1.5) : (double)tu_randint(-3, 3);
        in->s1 = in->s0 + (fl ? tu_uniform(0, 2) : (double)tu_randint(0, 4));
        return true;
    case K_BINARY:
    case K_WHERE:
        in->sub = (int)tu_randint(0, in->kind == K_WHERE ? COUNT(cmp_ops) - 1
                                                         : COUNT(binary_ops) - (fl ? 1 : 2));
        in->b = (int)tu_randint(0, count - 1);
        return p->m[in->b].dt == ma->dt && broadcast(ma, &p->m[in->b], out);
    case K_CAST:
        in->to = ma->dt == SG_BOOL ? casts[tu_randint(0, 3)] : casts[tu_randint(0, 4)];
        out->dt = in->to;
        return true;
    case K_TRANSPOSE:
        if (ma->ndim < 2) return false;
        out->shape[0] = ma->shape[1], out->shape[1] = ma->shape[0];
        return true;
    default: return false;
    }
}

/* A program of 3 to 24 instructions over inputs of `base`; `base` < 0: any. */
static void generate(prog *p, uint64_t seed, int base) {
    static const sg_dtype dts[4] = {SG_F32, SG_F16, SG_BF16, SG_I32};
    tu_seed(seed);
    memset(p, 0, sizeof *p);
    p->exact = true;
    int64_t A = tu_randint(1, 9), B = tu_randint(1, 40) * (tu_next() % 2 ? 8 : 1);
    gen_inputs(p, base >= 0 ? (sg_dtype)base : dts[tu_randint(0, 3)], A, B);
    int len = (int)tu_randint(3, 24), count = p->nin;
    while (p->n < len && count < MAXV) {
        int lo = count > 6 ? count - 6 : 0;
        instr in = {.kind = (enum kind)tu_randint(0, K_COUNT - 1),
                    .a = (int)tu_randint(tu_next() % 4 == 0 ? 0 : lo, count - 1)};
        meta out;
        if (!gen_instr(p, count, &in, &out)) continue;
        p->code[p->n++] = in;
        p->m[count++] = out;
    }
    /* The last value, and an earlier one when there is one (a bool one is
     * cast to f32 by the step). */
    p->out[p->nout++] = count - 1;
    if (count - 1 > p->nin) p->out[p->nout++] = (int)tu_randint(p->nin, count - 2);
}

static sg_tensor *apply(const instr *in, sg_tensor *const *v) {
    sg_tensor *a = v[in->a];
    switch (in->kind) {
    case K_UNARY: return unary_ops[in->sub](a);
    case K_SCALAR:
        return in->sub == 0   ? sg_add_scalar(a, in->s0)
               : in->sub == 1 ? sg_mul_scalar(a, in->s0)
                              : sg_clamp(a, in->s0, in->s1);
    case K_BINARY: return binary_ops[in->sub](a, v[in->b]);
    case K_WHERE: return sg_where(cmp_ops[in->sub](a, v[in->b]), a, v[in->b]);
    case K_CAST: return sg_cast(a, in->to);
    case K_TRANSPOSE: return sg_transpose(a, 0, 1);
    default: return NULL;
    }
}

static sg_status run_prog(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    const prog *p = user;
    sg_tensor *v[MAXV] = {NULL};
    for (int i = 0; i < p->nin; i++) v[i] = in[i];
    for (int k = 0; k < p->n; k++) v[p->nin + k] = apply(&p->code[k], v);
    for (int o = 0; o < p->nout; o++) {
        sg_tensor *t = v[p->out[o]];
        out[o] = t && sg_tensor_dtype(t) == SG_BOOL ? sg_cast(t, SG_F32) : t;
    }
    /* The step's temporaries are the context's until released. */
    for (int k = 0; k < p->n; k++) {
        bool kept = false;
        for (int o = 0; o < p->nout; o++) kept = kept || out[o] == v[p->nin + k];
        if (!kept) sg_release(v[p->nin + k]);
    }
    for (int o = 0; o < p->nout; o++)
        if (!out[o]) return sg_ctx_status(c);
    return SG_OK;
}

/* ------------------------------------------------------------ running a unit */

/* Slot s's memory on the device: an input's values, or an internal slot. */
static void *slot_memory(const sg__ir *ir, int s, sg_tensor *const *in) {
    const sg__slot *sl = &ir->slots[s];
    size_t bytes = sl->kind == SG__SLOT_INTERNAL ? sl->nbytes : 0;
    double *vals = NULL;
    int64_t n = 0;
    sg_dtype dt = SG_F32;
    if (sl->kind == SG__SLOT_INPUT) {
        n = sg_tensor_numel(in[sl->input]);
        dt = sg_tensor_dtype(in[sl->input]);
        bytes = (size_t)n * sg_dtype_size(dt);
        vals = tu_read(in[sl->input]);
    }
    void *mem = ocl->clSVMAlloc(ocl->context, CL_MEM_READ_WRITE | CL_MEM_SVM_FINE_GRAIN_BUFFER,
                                bytes ? bytes : 16, 128);
    if (mem) memset(mem, 0, bytes ? bytes : 16);
    for (int64_t i = 0; mem && vals && i < n; i++) tu_store(mem, dt, i, vals[i]);
    free(vals);
    return mem;
}

/* Group k's kernel on the device (its own slot table), to completion. */
static bool launch(cl_program prog, const sg__cuda_kinfo *ki, void *const *base, int nslots) {
    cl_int err = CL_SUCCESS;
    cl_kernel k = ocl->clCreateKernel(prog, ki->name, &err);
    if (!TU_EXPECT(k && err == CL_SUCCESS)) return false;
    int n = ki->nlocal >= 0 ? ki->nlocal : nslots;
    void **table = ocl->clSVMAlloc(ocl->context, CL_MEM_READ_ONLY | CL_MEM_SVM_FINE_GRAIN_BUFFER,
                                   sizeof(void *) * (size_t)(n ? n : 1), 128);
    bool ok = TU_EXPECT(table != NULL);
    for (int i = 0; ok && i < n; i++) table[i] = base[ki->nlocal >= 0 ? ki->local[i] : i];
    size_t local = ki->block, global = (size_t)ki->grid * ki->block;
    ok = ok && TU_EXPECT(ocl->clSetKernelArgSVMPointer(k, 0, table) == CL_SUCCESS) &&
         TU_EXPECT(ocl->clEnqueueNDRangeKernel(queue, k, 1, NULL, &global, &local, 0, NULL, NULL) ==
                   CL_SUCCESS) &&
         TU_EXPECT(ocl->clFinish(queue) == CL_SUCCESS);
    if (table) ocl->clSVMFree(ocl->context, table);
    ocl->clReleaseKernel(k);
    return ok;
}

/* Output o of the capture, read through its ref from the device's memory. */
static double *read_out(const sg__ir *ir, const sg__fused *f, int o, void *const *base,
                        int64_t *n) {
    const sg__ref *r = &ir->refs[f->alias[ir->out_refs[o]]];
    *n = 1;
    for (int d = 0; d < r->ndim; d++) *n *= r->shape[d];
    double *v = malloc(sizeof(double) * (size_t)(*n ? *n : 1));
    for (int64_t i = 0; v && i < *n; i++) {
        int64_t rem = i, off = r->offset;
        for (int d = r->ndim - 1; d >= 0; d--) {
            off += rem % r->shape[d] * r->stride[d];
            rem /= r->shape[d];
        }
        v[i] = tu_load(base[r->slot], r->dtype, off);
    }
    return v;
}

/* The last capture of fn as an OpenCL unit, built; *f its fusion. */
static cl_program build_unit(sg_fn *fn, const char *name, sg__fused *f, sg__cuda_kinfo **ki,
                             sg_status *gen) {
    sg__graph *g = fn->graphs[fn->ngraphs - 1];
    sg__fuse_opts fo;
    sg__cgen_cuda_fuse_opts(&fo, false);
    *ki = NULL;
    if (!TU_EXPECT(sg__fuse(ctx, &g->ir, &fo, f) == SG_OK)) return NULL;
    *ki = calloc((size_t)(f->ngroups ? f->ngroups : 1), sizeof **ki);
    sg__emit e = {.ctx = ctx};
    int nk = 0;
    *gen = sg__cgen_gpu(ctx, &g->ir, f, name, SG__DIALECT_OPENCL, &e, *ki, &nk);
    snprintf(gen_msg, sizeof gen_msg, "%s", *gen == SG_OK ? "" : sg_last_error(ctx));
    void *prog = NULL;
    if ((*gen == SG_OK || *gen == SG_ERR_UNSUPPORTED) && nk > 0) {
        sg_status s = sg__opencl_build(ctx, name, e.buf, &prog);
        if (!TU_EXPECT(s == SG_OK)) fprintf(stderr, "  %s\n", sg_last_error(ctx));
    }
    if (spirv_next && prog) { /* the same unit as the ze backend takes it */
        void *spv = NULL;
        size_t size = 0;
        spirv_status = sg__ocloc_build(ctx, name, e.buf, &spv, &size);
        if (spirv_status != SG_OK) snprintf(gen_msg, sizeof gen_msg, "%s", sg_last_error(ctx));
        sg__free(ctx, spv, size);
        sg_clear_error(ctx);
    }
    if (getenv("SG_TEST_PRINT_OPENCL") && e.buf) fprintf(stderr, "%s\n", e.buf);
    sg__emit_free(&e);
    return prog;
}

/* ------------------------------------------------------------ the cases */

static sg_fn *capture(prog *p, sg_tensor *const *in) {
    sg_fn *fn = NULL;
    sg_compile(ctx, run_prog, p, p->nin, p->nout, NULL, &fn);
    sg_tensor *out[2] = {NULL, NULL};
    sg_mark_step_begin(ctx);
    if (!TU_EXPECT(fn && sg_call(fn, in, p->nin, out, p->nout) == SG_OK)) {
        fprintf(stderr, "  %s\n", sg_last_error(ctx));
        sg_fn_destroy(fn);
        return NULL;
    }
    return fn;
}

static void free_slots(const sg__ir *ir, void **base) {
    for (int s = 0; base && s < ir->nslots; s++)
        if (base[s]) ocl->clSVMFree(ocl->context, base[s]);
    free(base);
}

/* Device memory for every slot (the inputs' values in theirs), then every
 * group's kernel in order; the slots' memory, or NULL when one step failed. */
static void **run_units(const sg__ir *ir, cl_program prog, const sg__fused *f,
                        const sg__cuda_kinfo *ki, sg_tensor *const *in) {
    void **base = calloc((size_t)ir->nslots + 1, sizeof *base);
    bool ok = TU_EXPECT(base != NULL);
    for (int s = 0; ok && s < ir->nslots; s++) {
        ok = TU_EXPECT(ir->slots[s].kind != SG__SLOT_PARAM);
        if (ok) ok = TU_EXPECT((base[s] = slot_memory(ir, s, in)) != NULL);
    }
    for (int k = 0; ok && k < f->ngroups; k++) {
        ok = TU_EXPECT(ki[k].name[0] != '\0');
        if (ok) ok = launch(prog, &ki[k], base, ir->nslots);
    }
    if (!ok) free_slots(ir, base);
    return ok ? base : NULL;
}

/* Every group's kernel in order on the device, then each output against ref. */
static bool run_and_compare(const prog *p, sg_fn *fn, cl_program prog, const sg__fused *f,
                            const sg__cuda_kinfo *ki, sg_tensor *const *in, sg_tensor **ref,
                            const char *name) {
    const sg__ir *ir = &fn->graphs[fn->ngraphs - 1]->ir;
    void **base = run_units(ir, prog, f, ki, in);
    bool ok = base != NULL;
    for (int o = 0; ok && o < p->nout; o++) {
        int64_t n = 0;
        double *got = read_out(ir, f, o, base, &n), *want = tu_read(ref[o]);
        sg_dtype dt = sg_tensor_dtype(ref[o]);
        char what[160];
        snprintf(what, sizeof what, "%s output %d", name, o);
        ok = TU_EXPECT(got && want) &&
             tu_close(what, got, want, n, p->exact ? 0 : tu_rtol(dt), p->exact ? 0 : tu_atol(dt));
        free(got);
        free(want);
    }
    free_slots(ir, base);
    return ok;
}

/* Two independent chains, x0 * 0.5 + x0 over [rows, 40] and sin(x1) * 2
 * over [n1]: fusion puts them side by side in one MULTI group (a chain of
 * loops in one block when they are small). */
static void gen_multi(prog *p, int64_t rows, int64_t n1) {
    memset(p, 0, sizeof *p);
    p->nin = 2;
    p->m[0] = (meta){.dt = SG_F32, .ndim = 2, .shape = {rows, 40}};
    p->m[1] = (meta){.dt = SG_F32, .ndim = 1, .shape = {n1}};
    p->code[0] = (instr){.kind = K_SCALAR, .sub = 1, .a = 0, .s0 = 0.5};
    p->code[1] = (instr){.kind = K_BINARY, .sub = 0, .a = 2, .b = 0};
    p->code[2] = (instr){.kind = K_UNARY, .sub = 4, .a = 1};
    p->code[3] = (instr){.kind = K_SCALAR, .sub = 1, .a = 4, .s0 = 2};
    p->n = 4;
    for (int k = 0; k < 4; k++) p->m[2 + k] = p->m[k < 2 ? 0 : 1];
    p->nout = 2, p->out[0] = 3, p->out[1] = 5;
}

/* Program `seed` (multi: gen_multi with `multi` rows) on the device against
 * the CPU's eager run of it. */
static void test_prog(uint64_t seed, int base, int multi) {
    prog *p = calloc(1, sizeof *p);
    if (multi)
        gen_multi(p, multi, 7 * multi + 3);
    else
        generate(p, seed, base);
    sg_tensor *in[4] = {NULL};
    tu_seed(seed);
    for (int i = 0; i < p->nin; i++) {
        const meta *m = &p->m[i];
        in[i] = tu_rand(ctx, m->dt, m->ndim, m->shape, -3, 3, NULL);
    }
    sg_tensor *ref[2] = {NULL, NULL};
    sg_status rs = run_prog(ctx, in, ref, p);
    char name[64];
    snprintf(name, sizeof name, "ocl_prog_%llu_%d", (unsigned long long)seed, multi);
    sg_fn *fn = rs == SG_OK ? capture(p, in) : NULL;
    sg__fused f;
    memset(&f, 0, sizeof f);
    sg__cuda_kinfo *ki = NULL;
    sg_status gen = SG_OK;
    cl_program prog = fn ? build_unit(fn, name, &f, &ki, &gen) : NULL;
    bool ok = TU_EXPECT(rs == SG_OK) && TU_EXPECT(gen == SG_OK) && TU_EXPECT(prog != NULL);
    int nmulti = 0;
    for (int k = 0; ok && k < f.ngroups; k++) nmulti += f.groups[k].kind == SG__G_MULTI;
    if (ok && multi) ok = TU_EXPECT(nmulti == 1);
    if (ok) ok = run_and_compare(p, fn, prog, &f, ki, in, ref, name);
    tu_case(ok, "OPENCL_PROG(seed=%llu,base=%s,ops=%d,inputs=%d,multi=%d,%s) -> %d groups",
            (unsigned long long)seed, sg_dtype_name(p->m[0].dt), p->n, p->nin, multi,
            p->exact ? "bit-exact" : "tolerance", f.ngroups);
    if (prog) ocl->clReleaseProgram(prog);
    if (fn) sg__fused_free(ctx, &f, &fn->graphs[fn->ngraphs - 1]->ir);
    free(ki);
    sg_fn_destroy(fn);
    for (int o = 0; o < 2; o++) sg_release(ref[o]);
    for (int i = 0; i < p->nin; i++) sg_release(in[i]);
    free(p);
    sg_clear_error(ctx);
}

/* ------------------------------------------------------------ row, reduce and GEMV kernels */

enum rop {
    R_SOFTMAX,
    R_LOG_SOFTMAX,
    R_LAYER_NORM,
    R_RMS_NORM,
    R_SUM,
    R_MEAN,
    R_VAR,
    R_ARGMAX,
    R_CENTER,      /* x - mean(x) over the last dim: a reduction's epilogue over x's shape */
    R_COLSUM,      /* (A, len, C) summed over dim 1 */
    R_LINEAR,      /* x (rows, K) against w (N, K), plus b: a GEMV along K */
    R_MATMUL,      /* x (rows, K) times w (K, N): a GEMV along N */
    R_NORM_LINEAR, /* layer_norm(x) against w (N, K): the norm's rows, then the GEMV */
    R_RMS_LINEAR,  /* x * rsqrt(mean(x * x) + eps) * g against w (N, K): written out, then the GEMV */
    R_COUNT
};
static const char *const rop_names[R_COUNT] = {
    "softmax", "log_softmax", "layer_norm", "rms_norm", "sum",    "mean",       "var",
    "argmax",  "center",      "colsum",     "linear",   "matmul", "norm_linear", "rms_linear"};

typedef struct rcase {
    enum rop op;
    sg_dtype dt;
    int64_t rows, len, cols; /* cols: colsum's C; GEMV: N (len is K) */
    bool pro, epi;           /* x * 0.5 + 0.25 before the op; its result * 2 after */
    int nin;
} rcase;

static bool gemv_op(enum rop op) { return op >= R_LINEAR; }

/* The inputs' shapes: x, then the op's weights. */
static int rcase_shapes(const rcase *c, int *nd, int64_t sh[5][3]) {
    int n = 1;
    nd[0] = 2, sh[0][0] = c->rows, sh[0][1] = c->len;
    if (c->op == R_COLSUM) nd[0] = 3, sh[0][1] = c->len, sh[0][2] = c->cols;
    if (c->op == R_LAYER_NORM || c->op == R_RMS_NORM || c->op == R_NORM_LINEAR ||
        c->op == R_RMS_LINEAR) {
        nd[n] = 1, sh[n++][0] = c->len;
        if (c->op != R_RMS_NORM && c->op != R_RMS_LINEAR) nd[n] = 1, sh[n++][0] = c->len;
    }
    if (gemv_op(c->op)) {
        nd[n] = 2;
        sh[n][0] = c->op == R_MATMUL ? c->len : c->cols;
        sh[n++][1] = c->op == R_MATMUL ? c->cols : c->len;
        if (c->op != R_MATMUL) nd[n] = 1, sh[n++][0] = c->cols;
    }
    return n;
}

static sg_status run_rcase(sg_ctx *cx, sg_tensor *const *in, sg_tensor **out, void *user) {
    const rcase *c = user;
    sg_tensor *x = in[0], *y = NULL;
    int last = 1, red = 1;
    if (c->pro) {
        sg_tensor *h = sg_mul_scalar(in[0], 0.5);
        x = sg_add_scalar(h, 0.25);
        sg_release(h);
    }
    switch (c->op) {
    case R_SOFTMAX: y = sg_softmax(x, -1); break;
    case R_LOG_SOFTMAX: y = sg_log_softmax(x, -1); break;
    case R_LAYER_NORM: y = sg_layer_norm(x, in[1], in[2], 1e-5); break;
    case R_RMS_NORM: y = sg_rms_norm(x, in[1], 1e-5); break;
    case R_SUM: y = sg_sum(x, 1, &last, false); break;
    case R_MEAN: y = sg_mean(x, 1, &last, false); break;
    case R_VAR: y = sg_var(x, 1, &last, 1, false); break;
    case R_ARGMAX: y = sg_argmax(x, 1, false); break;
    case R_CENTER: {
        sg_tensor *m = sg_mean(x, 1, &last, true);
        y = sg_sub(x, m);
        sg_release(m);
        break;
    }
    case R_COLSUM: y = sg_sum(x, 1, &red, false); break;
    case R_LINEAR: y = sg_linear(x, in[1], in[2]); break;
    case R_MATMUL: y = sg_matmul(x, in[1]); break;
    case R_NORM_LINEAR: {
        sg_tensor *h = sg_layer_norm(x, in[1], in[2], 1e-5);
        y = sg_linear(h, in[3], in[4]);
        sg_release(h);
        break;
    }
    case R_RMS_LINEAR: { /* as a user writes it; the tensors go with the step */
        sg_tensor *ms = sg_mean(sg_mul(x, x), 1, &last, true);
        sg_tensor *h = sg_mul(sg_mul(x, sg_rsqrt(sg_add_scalar(ms, 1e-5))), in[1]);
        y = sg_linear(h, in[2], in[3]);
        break;
    }
    default: break;
    }
    out[0] = c->epi && y ? sg_mul_scalar(y, 2.0) : y;
    if (out[0] != y) sg_release(y);
    if (c->pro) sg_release(x);
    return out[0] ? SG_OK : sg_ctx_status(cx);
}

/* ------------------------------------------------------------ their f64 reference */

/* x's row r (the prologue applied and rounded as each op rounds) into xr. */
static void ref_row(const rcase *c, const double *x, int64_t r, int64_t stride, int64_t step,
                    double *xr) {
    for (int64_t j = 0; j < c->len; j++) {
        double v = x[r * stride + j * step];
        xr[j] = c->pro ? tu_round(c->dt, tu_round(c->dt, v * 0.5) + 0.25) : v;
    }
}

/* The row op on xr into y (len values, or one), and the bound of its
 * rounding: the sum of the magnitudes the f32 sums add. */
static void ref_rowop(const rcase *c, const double *xr, double *const *w, double *y, double *mag) {
    int64_t n = c->len;
    double m = -INFINITY, s = 0, q = 0, a = 0;
    for (int64_t j = 0; j < n; j++) m = xr[j] > m ? xr[j] : m, s += xr[j], a += fabs(xr[j]);
    double mean = s / (double)n;
    for (int64_t j = 0; j < n; j++) q += (xr[j] - mean) * (xr[j] - mean);
    *mag = a / (double)n;
    switch (c->op) {
    case R_SOFTMAX:
    case R_LOG_SOFTMAX: {
        double e = 0;
        for (int64_t j = 0; j < n; j++) e += exp(xr[j] - m);
        for (int64_t j = 0; j < n; j++)
            y[j] = c->op == R_SOFTMAX ? exp(xr[j] - m) / e : (xr[j] - m) - log(e);
        *mag = 0;
        break;
    }
    case R_LAYER_NORM:
    case R_NORM_LINEAR:
    case R_RMS_NORM: {
        double ss = 0;
        for (int64_t j = 0; j < n; j++) ss += xr[j] * xr[j];
        double rr =
            c->op == R_RMS_NORM ? 1 / sqrt(ss / (double)n + 1e-5) : 1 / sqrt(q / (double)n + 1e-5);
        for (int64_t j = 0; j < n; j++)
            y[j] = c->op == R_RMS_NORM ? xr[j] * rr * w[0][j]
                                       : (xr[j] - mean) * rr * w[0][j] + w[1][j];
        *mag = 0;
        break;
    }
    case R_SUM: y[0] = s, *mag = a; break;
    case R_MEAN: y[0] = mean; break;
    case R_VAR: y[0] = n > 1 ? q / (double)(n - 1) : NAN, *mag = n > 1 ? y[0] : 0; break;
    case R_ARGMAX: {
        int64_t at = 0;
        for (int64_t j = 1; j < n; j++) at = xr[j] > xr[at] ? j : at;
        y[0] = (double)at, *mag = 0;
        break;
    }
    case R_CENTER:
        for (int64_t j = 0; j < n; j++) y[j] = xr[j] - tu_round(c->dt, mean);
        break;
    case R_RMS_LINEAR: { /* every op rounded to the dtype, as each op rounds */
        double ss = 0;
        for (int64_t j = 0; j < n; j++) ss += tu_round(c->dt, xr[j] * xr[j]);
        double t = tu_round(c->dt, tu_round(c->dt, ss / (double)n) + 1e-5);
        double rr = tu_round(c->dt, 1 / sqrt(t));
        for (int64_t j = 0; j < n; j++) y[j] = tu_round(c->dt, xr[j] * rr) * w[0][j];
        *mag = 0;
        break;
    }
    default: break;
    }
}

/* out (and mag) of case c from the inputs' values v[]; its element count. */
static int64_t ref_rcase(const rcase *c, double *const *v, double *out, double *mag) {
    size_t wide = (size_t)(c->len > c->cols ? c->len : c->cols);
    double *xr = malloc(sizeof(double) * wide), *yr = malloc(sizeof(double) * wide);
    bool norm_gemv = c->op == R_NORM_LINEAR || c->op == R_RMS_LINEAR;
    bool row = c->op <= R_CENTER || norm_gemv;
    int64_t n = 0, rl = c->op == R_SUM || c->op == R_MEAN || c->op == R_VAR || c->op == R_ARGMAX;
    int64_t outer = c->op == R_COLSUM ? c->rows * c->cols : c->rows;
    for (int64_t r = 0; r < outer; r++) {
        double mg = 0;
        if (c->op == R_COLSUM) {
            ref_row(c, v[0], r / c->cols * c->len * c->cols + r % c->cols, 1, c->cols, xr);
        } else {
            ref_row(c, v[0], r, c->len, 1, xr);
        }
        if (row) {
            ref_rowop(c, xr, v + 1, yr, &mg);
        } else if (c->op == R_COLSUM) {
            yr[0] = 0;
            for (int64_t j = 0; j < c->len; j++) yr[0] += xr[j], mg += fabs(xr[j]);
        }
        int64_t ny = row && !rl ? c->len : 1;
        if (norm_gemv) { /* the norm's rows rounded, then the products */
            for (int64_t j = 0; j < c->len; j++) xr[j] = tu_round(c->dt, yr[j]);
            ny = 0;
        }
        if (gemv_op(c->op)) {
            int wi = c->op == R_NORM_LINEAR ? 3 : c->op == R_RMS_LINEAR ? 2 : 1;
            const double *w = v[wi];
            const double *b = c->op == R_MATMUL ? NULL : v[wi + 1];
            for (int64_t o = 0; o < c->cols; o++) {
                double d = 0, dm = 0;
                for (int64_t k = 0; k < c->len; k++) {
                    double wk = c->op == R_MATMUL ? w[k * c->cols + o] : w[o * c->len + k];
                    d += xr[k] * wk, dm += fabs(xr[k] * wk);
                }
                yr[o] = d + (b ? b[o] : 0);
                mag[n + o] = dm;
            }
            ny = c->cols;
        } else {
            for (int64_t j = 0; j < ny; j++) mag[n + j] = mg;
        }
        for (int64_t j = 0; j < ny; j++) {
            double y = c->op == R_ARGMAX ? yr[j] : tu_round(c->dt, yr[j]);
            out[n++] = c->epi ? tu_round(c->dt, y * 2) : y;
        }
    }
    free(xr);
    free(yr);
    return n;
}
/* |got - ref| within the dtype's tolerance of ref, plus 2e-6 of the
 * magnitudes the f32 sums added (mag: the bound of their rounding). */
static bool close_mag(const char *what, const double *got, const double *ref, const double *mag,
                      int64_t n, sg_dtype dt) {
    double rt = tu_rtol(dt), at = tu_atol(dt);
    for (int64_t i = 0; i < n; i++) {
        bool same = (got[i] != got[i] && ref[i] != ref[i]) || got[i] == ref[i];
        if (same || fabs(got[i] - ref[i]) <= at + rt * fabs(ref[i]) + 2e-6 * mag[i]) continue;
        printf("  %s: element %lld of %lld: got %.9g, want %.9g (magnitude %.4g)\n", what,
               (long long)i, (long long)n, got[i], ref[i], mag[i]);
        return false;
    }
    return true;
}

/* Case c on the device against its f64 reference; `spirv`: its unit also
 * compiled to SPIR-V by libocloc and checked, as the ze backend does. */
static void test_rcase(const rcase *c, uint64_t seed, bool spirv) {
    int nd[5];
    int64_t sh[5][3];
    int nin = rcase_shapes(c, nd, sh);
    sg_tensor *in[5] = {NULL};
    double *v[5] = {NULL};
    tu_seed(seed);
    bool pos = c->op == R_SUM || c->op == R_MEAN || c->op == R_COLSUM;
    for (int i = 0; i < nin; i++)
        in[i] = tu_rand(ctx, c->dt, nd[i], sh[i],
                        i     ? -1
                        : pos ? 0.25
                              : -2,
                        i     ? 1
                        : pos ? 1.25
                              : 2,
                        &v[i]);
    rcase cc = *c;
    cc.nin = nin;
    char name[64];
    snprintf(name, sizeof name, "ocl_%s_%llu", rop_names[c->op], (unsigned long long)seed);
    sg_fn *fn = NULL;
    sg_compile(ctx, run_rcase, &cc, nin, 1, NULL, &fn);
    sg_tensor *out[1] = {NULL};
    sg_mark_step_begin(ctx);
    bool ok = TU_EXPECT(fn && sg_call(fn, in, nin, out, 1) == SG_OK);
    if (!ok) fprintf(stderr, "  %s\n", sg_last_error(ctx));
    sg__fused f;
    memset(&f, 0, sizeof f);
    sg__cuda_kinfo *ki = NULL;
    sg_status gen = SG_OK;
    spirv_next = spirv, spirv_status = SG_OK;
    cl_program prog = ok ? build_unit(fn, name, &f, &ki, &gen) : NULL;
    spirv_next = false;
    /* libocloc (and spirv-val where present) takes it too; not in sanitizer builds */
    bool no_ocloc = spirv_status == SG_ERR_BACKEND_UNAVAILABLE;
    ok = ok && TU_EXPECT(gen == SG_OK) && TU_EXPECT(prog != NULL) &&
         TU_EXPECT(spirv_status == SG_OK || no_ocloc);
    if (!ok && gen_msg[0]) fprintf(stderr, "  %s\n", gen_msg);
    const sg__ir *ir = ok ? &fn->graphs[fn->ngraphs - 1]->ir : NULL;
    int inlined = 0;
    for (int k = 0; ok && k < f.ngroups; k++) inlined += ki[k].replaces_call;
    ok = ok && TU_EXPECT(inlined >= 1);
    /* The written-out norm joins the GEMV (a prologue before it keeps it apart). */
    if (c->op == R_RMS_LINEAR && !c->pro) ok = ok && TU_EXPECT(f.ngroups == 1);
    void **base = ok ? run_units(ir, prog, &f, ki, in) : NULL;
    int64_t n = 0, total = c->rows * (c->len > c->cols ? c->len : c->cols) * (c->cols + 1);
    double *want = malloc(sizeof(double) * (size_t)total),
           *mag = malloc(sizeof(double) * (size_t)total);
    double *got = base ? read_out(ir, &f, 0, base, &n) : NULL;
    int64_t nw = ref_rcase(&cc, v, want, mag);
    ok = base && TU_EXPECT(n == nw) && close_mag(name, got, want, mag, n, c->dt);
    tu_case(ok,
            "OPENCL_ROWS(%s,%s,rows=%lld,len=%lld,cols=%lld,%s%sseed=%llu) -> %d groups, %d "
            "computing their anchor%s",
            rop_names[c->op], sg_dtype_name(c->dt), (long long)c->rows, (long long)c->len,
            (long long)c->cols, c->pro ? "prologue," : "", c->epi ? "epilogue," : "",
            (unsigned long long)seed, f.ngroups, inlined,
            !spirv     ? ""
            : no_ocloc ? "; no libocloc here"
                       : "; SPIR-V checked");
    free(got), free(want), free(mag);
    if (base) free_slots(ir, base);
    if (prog) ocl->clReleaseProgram(prog);
    if (fn && f.groups) sg__fused_free(ctx, &f, &fn->graphs[fn->ngraphs - 1]->ir);
    free(ki);
    sg_fn_destroy(fn);
    sg_release(out[0]);
    for (int i = 0; i < nin; i++) sg_release(in[i]), free(v[i]);
    sg_clear_error(ctx);
}

/* Row widths: 1, odd, around a warp and a block, one pass from registers
 * or several from memory. */
static int64_t pick_len(void) {
    static const int64_t lens[] = {1,   2,   3,   7,   31,   32,   33,  100,
                                   255, 256, 257, 333, 1000, 4099, 9001};
    return tu_next() % 3 == 0 ? tu_randint(1, 700) : lens[tu_randint(0, COUNT(lens) - 1)];
}

/* Case `seed`: a random op, dtype, shape, prologue and epilogue. */
static void random_rcase(uint64_t seed) {
    static const sg_dtype dts[3] = {SG_F32, SG_F16, SG_BF16};
    tu_seed(seed * 7919 + 17);
    rcase c = {.op = (enum rop)(seed % R_COUNT), .dt = dts[tu_randint(0, 2)]};
    c.rows = tu_randint(1, 9);
    c.len = pick_len();
    c.pro = tu_next() % 2;
    c.epi = c.op != R_ARGMAX && tu_next() % 2;
    if (c.op == R_COLSUM) c.rows = tu_randint(1, 3), c.cols = tu_randint(2, 40);
    if (gemv_op(c.op)) {
        c.rows = tu_randint(1, 8);
        c.len = tu_next() % 2 ? tu_randint(1, 300) : 8 * tu_randint(1, 40);
        c.cols = tu_randint(1, 200);
        c.pro = c.pro && (c.op == R_NORM_LINEAR || c.op == R_RMS_LINEAR);
    }
    if (c.len > 1000) c.rows = tu_randint(1, 2);
    test_rcase(&c, seed, seed <= R_COUNT);
}

/* A few long rows and columns, cut into chunks that one block per row
 * (or column tile) folds in order; and written-out rms_norms of a model's
 * width feeding a GEMV. */
static void long_rcases(void) {
    static const rcase cases[] = {
        {R_SUM, SG_F32, 1, 40000, 0, true, true, 0},
        {R_MEAN, SG_BF16, 2, 20011, 0, false, false, 0},
        {R_ARGMAX, SG_F32, 1, 10007, 0, true, false, 0},
        {R_ARGMAX, SG_F16, 2, 6000, 0, false, false, 0},
        {R_COLSUM, SG_F32, 1, 3001, 7, false, true, 0},
        {R_COLSUM, SG_BF16, 2, 1000, 33, true, false, 0},
        {R_SOFTMAX, SG_F32, 2, 20000, 0, true, true, 0},
        {R_LAYER_NORM, SG_BF16, 1, 12345, 0, false, true, 0},
        {R_RMS_LINEAR, SG_BF16, 1, 768, 96, false, false, 0},
        {R_RMS_LINEAR, SG_F32, 2, 1000, 17, false, true, 0},
    };
    for (int i = 0; i < COUNT(cases); i++) test_rcase(&cases[i], 500 + (uint64_t)i, true);
}

/* ------------------------------------------------------------ GEMV segments */

/* Q, K and V projected apart from one x (rms_norm written out, or x as it
 * is): n[j] columns each, q and v with a bias. */
typedef struct segcase {
    sg_dtype dt;
    int64_t rows, len, n[3];
    bool norm;
    bool between; /* another kernel's op between q's product and k's: k and v run earlier */
} segcase;

/* in = {x, g, wq, bq, wk, wv, bv} -> q, k, v */
static sg_status seg_step(sg_ctx *cx, sg_tensor *const *in, sg_tensor **out, void *user) {
    const segcase *c = user;
    sg_tensor *h = in[0];
    if (c->norm) {
        int last = 1;
        sg_tensor *ms = sg_mean(sg_mul(in[0], in[0]), 1, &last, true);
        h = sg_mul(sg_mul(in[0], sg_rsqrt(sg_add_scalar(ms, 1e-5))), in[1]);
    }
    out[0] = sg_linear(h, in[2], in[3]);
    if (c->between) out[3] = sg_mul_scalar(in[1], 3.0); /* a kernel of its own between */
    out[1] = sg_linear(h, in[4], NULL);
    out[2] = sg_linear(h, in[5], in[6]);
    return out[0] && out[1] && out[2] ? SG_OK : sg_ctx_status(cx);
}

/* The three products as one GEMV kernel (fusion's segments), run on the
 * device against f64: every product's columns, with and without the norm. */
static void test_segments(const segcase *c, uint64_t seed) {
    int64_t xs[2] = {c->rows, c->len}, gs[1] = {c->len};
    int64_t ws[3][2] = {{c->n[0], c->len}, {c->n[1], c->len}, {c->n[2], c->len}};
    tu_seed(seed);
    double *v[7] = {NULL};
    sg_tensor *in[7] = {tu_rand(ctx, c->dt, 2, xs, -2, 2, &v[0]),
                        tu_rand(ctx, c->dt, 1, gs, 0.5, 1.5, &v[1]),
                        tu_rand(ctx, c->dt, 2, ws[0], -1, 1, &v[2]),
                        tu_rand(ctx, c->dt, 1, &c->n[0], -1, 1, &v[3]),
                        tu_rand(ctx, c->dt, 2, ws[1], -1, 1, &v[4]),
                        tu_rand(ctx, c->dt, 2, ws[2], -1, 1, &v[5]),
                        tu_rand(ctx, c->dt, 1, &c->n[2], -1, 1, &v[6])};
    char name[64];
    snprintf(name, sizeof name, "ocl_segments_%llu", (unsigned long long)seed);
    sg_fn *fn = NULL;
    int nout = c->between ? 4 : 3;
    sg_compile(ctx, seg_step, (void *)c, 7, nout, NULL, &fn);
    sg_tensor *out[4] = {NULL};
    sg_mark_step_begin(ctx);
    bool ok = TU_EXPECT(fn && sg_call(fn, in, 7, out, nout) == SG_OK);
    sg__fused f;
    memset(&f, 0, sizeof f);
    sg__cuda_kinfo *ki = NULL;
    sg_status gen = SG_OK;
    cl_program prog = ok ? build_unit(fn, name, &f, &ki, &gen) : NULL;
    ok = ok && TU_EXPECT(gen == SG_OK) && TU_EXPECT(prog != NULL);
    if (!ok && gen_msg[0]) fprintf(stderr, "  %s\n", gen_msg);
    const sg__ir *ir = ok ? &fn->graphs[fn->ngraphs - 1]->ir : NULL;
    ok = ok && TU_EXPECT(f.ngroups == 1 + c->between) && TU_EXPECT(ki[0].replaces_call);
    void **base = ok ? run_units(ir, prog, &f, ki, in) : NULL;
    ok = ok && base;
    /* The norm's rows as each op rounds them (ref_rowop), then the products. */
    rcase rc = {.op = R_RMS_LINEAR, .dt = c->dt, .rows = c->rows, .len = c->len};
    double *h = malloc(sizeof(double) * (size_t)c->len), mg;
    for (int j = 0; ok && j < 3; j++) {
        int64_t n = 0, nj = c->n[j];
        double *got = read_out(ir, &f, j, base, &n);
        double *want = malloc(sizeof(double) * (size_t)(c->rows * nj));
        double *mag = malloc(sizeof(double) * (size_t)(c->rows * nj));
        const double *w = v[j == 0 ? 2 : j == 1 ? 4 : 5], *b = j == 0 ? v[3] : j == 2 ? v[6] : NULL;
        for (int64_t r = 0; r < c->rows; r++) {
            if (c->norm) {
                ref_rowop(&rc, v[0] + r * c->len, v + 1, h, &mg);
                for (int64_t k = 0; k < c->len; k++) h[k] = tu_round(c->dt, h[k]);
            } else {
                memcpy(h, v[0] + r * c->len, sizeof(double) * (size_t)c->len);
            }
            for (int64_t o = 0; o < nj; o++) {
                double d = 0, dm = 0;
                for (int64_t k = 0; k < c->len; k++)
                    d += h[k] * w[o * c->len + k], dm += fabs(h[k] * w[o * c->len + k]);
                want[r * nj + o] = tu_round(c->dt, d + (b ? b[o] : 0));
                mag[r * nj + o] = dm;
            }
        }
        ok = got && TU_EXPECT(n == c->rows * nj) && close_mag(name, got, want, mag, n, c->dt);
        free(got), free(want), free(mag);
    }
    free(h);
    tu_case(ok,
            "OPENCL_GEMV_SEGMENTS(%s,rows=%lld,K=%lld,N=%lld/%lld/%lld,%s,q and v with a bias%s) "
            "-> %d groups, against f64",
            sg_dtype_name(c->dt), (long long)c->rows, (long long)c->len, (long long)c->n[0],
            (long long)c->n[1], (long long)c->n[2], c->norm ? "rms_norm written out" : "x as is",
            c->between ? ",another kernel between q and k" : "", f.ngroups);
    if (base) free_slots(ir, base);
    if (prog) ocl->clReleaseProgram(prog);
    if (fn && f.groups) sg__fused_free(ctx, &f, &fn->graphs[fn->ngraphs - 1]->ir);
    free(ki);
    sg_fn_destroy(fn);
    for (int i = 0; i < 4; i++) sg_release(out[i]);
    for (int i = 0; i < 7; i++) sg_release(in[i]), free(v[i]);
    sg_clear_error(ctx);
}

static void segment_cases(void) {
    static const segcase cases[] = {
        {SG_BF16, 1, 512, {512, 128, 128}, true, false}, /* grouped-query: q wider than k and v */
        {SG_F32, 3, 200, {64, 64, 64}, true, false},     /* multi-head: q and k pair first */
        {SG_F16, 2, 97, {33, 5, 70}, false, false},      /* odd widths, no norm */
        {SG_BF16, 8, 256, {1, 300, 2}, true, false},     /* 8 rows, a one-column product */
        {SG_F32, 1, 128, {64, 32, 32}, true, true},      /* k and v hoisted over another kernel */
    };
    for (int i = 0; i < COUNT(cases); i++) test_segments(&cases[i], 900 + (uint64_t)i);
}

int main(void) {
    char why[512] = "";
    ocl = sg__ocl_get(why, sizeof why);
    if (!ocl) {
        printf("no OpenCL CPU device: %s; skipped\n", why);
        return 77;
    }
    if (!ocl->fine_svm) {
        printf("the OpenCL CPU device %s has no fine-grained SVM buffers; skipped\n",
               ocl->device_name);
        return 77;
    }
    cl_int err = CL_SUCCESS;
    queue = ocl->clCreateCommandQueueWithProperties(ocl->context, ocl->device, NULL, &err);
    if (!queue || err != CL_SUCCESS) {
        printf("clCreateCommandQueueWithProperties failed (%d)\n", (int)err);
        return 1;
    }
    printf("OpenCL device: %s\n", ocl->device_name);
    setenv("SG_CODEGEN", "0", 1); /* captures keep their IR; the CPU needs no C unit here */
    ctx = tu_ctx((sg_ctx_opts){0});
    static const int bases[5] = {SG_F32, SG_F16, SG_BF16, SG_I32, -1};
    for (uint64_t seed = 1; seed <= 30; seed++) test_prog(seed, bases[seed % 5], 0);
    test_prog(101, SG_F32, 4);   /* small: a chain in one block */
    test_prog(102, SG_F32, 200); /* large: members over their own blocks */
    for (uint64_t seed = 1; seed <= 4 * R_COUNT; seed++) random_rcase(seed);
    long_rcases();
    segment_cases();
    ocl->clReleaseCommandQueue(queue);
    sg_ctx_destroy(ctx);
    return tu_finish();
}

#endif
