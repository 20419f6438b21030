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
 * checks the unit has one. Also: a row kernel (softmax) is refused with
 * SG_ERR_UNSUPPORTED naming the op, and its unit still holds the other
 * groups' kernels. Exits 77 without an OpenCL CPU device.
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
static char gen_msg[512]; /* the generator's message when it refused a group */
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
static void *slot_memory(const sg__ir *ir, int s, sg_tensor *const *in, const prog *p) {
    const sg__slot *sl = &ir->slots[s];
    size_t bytes = sl->kind == SG__SLOT_INTERNAL ? sl->nbytes : 0;
    double *vals = NULL;
    int64_t n = 0;
    if (sl->kind == SG__SLOT_INPUT) {
        const meta *m = &p->m[sl->input];
        n = m->ndim == 2 ? m->shape[0] * m->shape[1] : m->shape[0];
        bytes = (size_t)n * sg_dtype_size(m->dt);
        vals = tu_read(in[sl->input]);
    }
    void *mem = ocl->clSVMAlloc(ocl->context, CL_MEM_READ_WRITE | CL_MEM_SVM_FINE_GRAIN_BUFFER,
                                bytes ? bytes : 16, 128);
    if (mem) memset(mem, 0, bytes ? bytes : 16);
    for (int64_t i = 0; mem && vals && i < n; i++) tu_store(mem, p->m[sl->input].dt, i, vals[i]);
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

/* Every group's kernel in order on the device, then each output against ref. */
static bool run_and_compare(const prog *p, sg_fn *fn, cl_program prog, const sg__fused *f,
                            const sg__cuda_kinfo *ki, sg_tensor *const *in, sg_tensor **ref,
                            const char *name) {
    const sg__ir *ir = &fn->graphs[fn->ngraphs - 1]->ir;
    void **base = calloc((size_t)ir->nslots + 1, sizeof *base);
    bool ok = TU_EXPECT(base != NULL);
    for (int s = 0; ok && s < ir->nslots; s++) {
        ok = TU_EXPECT(ir->slots[s].kind != SG__SLOT_PARAM);
        if (ok) ok = TU_EXPECT((base[s] = slot_memory(ir, s, in, p)) != NULL);
    }
    for (int k = 0; ok && k < f->ngroups; k++) {
        ok = TU_EXPECT(ki[k].name[0] != '\0');
        if (ok) ok = launch(prog, &ki[k], base, ir->nslots);
    }
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
    for (int s = 0; base && s < ir->nslots; s++)
        if (base[s]) ocl->clSVMFree(ocl->context, base[s]);
    free(base);
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

/* softmax is a row kernel: refused by name; the pointwise group after it
 * still gets its kernel in the unit. */
static sg_status softmax_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)user;
    sg_tensor *s = sg_softmax(in[0], -1);
    out[0] = sg_add_scalar(sg_mul_scalar(s, 2.0), 1.0);
    out[1] = sg_sin(in[1]);
    sg_release(s);
    return out[0] && out[1] ? SG_OK : sg_ctx_status(c);
}

static void test_row_refused(void) {
    int64_t xs[2] = {4, 64}, ys = 100;
    sg_tensor *in[2] = {tu_rand(ctx, SG_F32, 2, xs, -2, 2, NULL),
                        tu_rand(ctx, SG_F32, 1, &ys, -2, 2, NULL)};
    sg_fn *fn = NULL;
    sg_compile(ctx, softmax_step, NULL, 2, 2, NULL, &fn);
    sg_tensor *out[2] = {NULL, NULL};
    sg_mark_step_begin(ctx);
    bool ok = TU_EXPECT(fn && sg_call(fn, in, 2, out, 2) == SG_OK);
    sg__fused f;
    memset(&f, 0, sizeof f);
    sg__cuda_kinfo *ki = NULL;
    sg_status gen = SG_OK;
    cl_program prog = ok ? build_unit(fn, "ocl_softmax_refused", &f, &ki, &gen) : NULL;
    int refused = 0, kernels = 0;
    for (int k = 0; ok && k < f.ngroups; k++)
        refused += ki[k].unsupported, kernels += ki[k].name[0] != 0;
    ok = ok && TU_EXPECT(gen == SG_ERR_UNSUPPORTED) && TU_EXPECT(refused == 1) &&
         TU_EXPECT(kernels >= 1) && TU_EXPECT(prog != NULL) &&
         TU_EXPECT(strstr(gen_msg, "softmax") && strstr(gen_msg, "OpenCL C"));
    if (gen_msg[0]) printf("  %s\n", gen_msg);
    tu_case(ok, "OPENCL_ROW_REFUSED(softmax,[4,64]) -> %d refused, %d kernels", refused, kernels);
    if (prog) ocl->clReleaseProgram(prog);
    if (fn && ok) sg__fused_free(ctx, &f, &fn->graphs[fn->ngraphs - 1]->ir);
    free(ki);
    sg_fn_destroy(fn);
    for (int i = 0; i < 2; i++) sg_release(in[i]), sg_release(out[i]);
    sg_clear_error(ctx);
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
    test_row_refused();
    ocl->clReleaseCommandQueue(queue);
    sg_ctx_destroy(ctx);
    return tu_finish();
}

#endif
