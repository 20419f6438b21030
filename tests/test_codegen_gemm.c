/* SPDX-License-Identifier: MIT */
/*
 * test_codegen_gemm.c -- the generated GEMM (codegen/cgen_gemm.c) against an
 * f64 reference. Random products -- sg_matmul with batch dims (one operand's
 * broadcast), 1-d operands, either operand transposed (a strided view), and
 * sg_linear with and without bias over (B, T, K) -- of odd M, N and K (K = 1
 * included) in f32, f16 and bf16, each followed by an epilogue (none, gelu,
 * a residual add, relu then a scale with the product also an output), are
 * captured on the CPU backend, fused as for a GPU and generated in the
 * OpenCL C dialect; the test checks that the MATMUL group became one GEMM
 * kernel (no library call), builds the unit on the first OpenCL CPU device
 * (PoCL), runs every kernel on fine-grained SVM and compares each output
 * with the reference computed here in f64 from the inputs' values (the
 * product rounded to the dtype, then the epilogue); products of at most 16
 * columns with K contiguous in both operands (the fixed cases marked
 * narrow) must be the few-column kernel, in every dialect. Tolerances as
 * test_ops_matmul's: f32 rtol 1e-5 plus 1e-6 * sqrt(K) * max|a| * max|b|;
 * f16/bf16 by the norm of the error. Every case's unit is also generated in
 * the CUDA dialect with SG_CUDA_GEMM=generated and in the HIP dialect, and
 * compiled by NVRTC (sm_90) and hiprtc (gfx90a) where those load
 * (SG_TEST_GEMM_DIALECT=cuda|hip: one dialect per process). Exits 77
 * without an OpenCL CPU device.
 *
 * With SG_TEST_BACKEND=cuda (the _cuda variant, gpu label) the same cases
 * run as compiled steps on the CUDA backend with SG_CUDA_GEMM=generated,
 * against the same references; each case checks in the unit the CUDA
 * backend logs (output_code) that a generated GEMM computed the product
 * (or a GEMV, for at most 8 rows); f32 products there run on the tensor
 * cores (3xTF32, split-K in the fixed cases of few tiles). The last cases
 * time a few products (bf16 and f32) as the generated GEMM and through
 * cuBLASLt, and check the two results against each other (the times are a
 * report, not a check).
 */
#define _POSIX_C_SOURCE 200809L
#include "testutil.h"

#include "codegen/opencl.h"
#include "graphs/cuda/cuda.h"
#include "graphs/graphs.h"

#include <math.h>
#include <string.h>
#include <time.h>

static sg_ctx *ctx;
#ifdef SG_HAVE_OPENCL_HEADERS
static const sg__ocl *ocl;
static cl_command_queue queue;
#endif
/* SG_TEST_GEMM_DIALECT=cuda|hip: compile each case's unit of that dialect
 * instead of running the OpenCL C one (hiprtc's LLVM and PoCL's clash in
 * one process, so the checks run as separate variants). */
static sg__dialect mode = SG__DIALECT_OPENCL;
static bool on_device; /* SG_TEST_BACKEND=cuda: compiled steps on the device */
static int gemm_lines; /* output_code lines naming a generated GEMM (or GEMV) kernel */
static bool saw_narrow; /* the last unit (or the CUDA backend's log) has a few-column kernel */

static void log_hook(void *user, const char *topic, const char *line) {
    (void)user;
    if (strcmp(topic, "output_code") == 0 && strstr(line, " * tiled GEMM")) gemm_lines++;
    if (strcmp(topic, "output_code") == 0 && strstr(line, " * GEMV,")) gemm_lines++;
    if (strcmp(topic, "output_code") == 0 && strstr(line, " * few columns:"))
        gemm_lines++, saw_narrow = true;
}

/* ------------------------------------------------------------ a case */

enum { EPI_NONE, EPI_GELU, EPI_RESIDUAL, EPI_RELU_SCALE, EPI_COUNT };
static const char *const epi_names[EPI_COUNT] = {"none", "gelu", "residual", "relu_scale"};

typedef struct spec {
    bool linear;
    sg_dtype dt;
    int nb;         /* batch dims of the product (matmul: a's; linear: x's leading) */
    int64_t bs[2];  /* their sizes */
    bool b_batched; /* matmul: b has the batch dims too (else it is broadcast) */
    bool a1, b1;    /* matmul: a 1-d a (a row) or b (a column) */
    int64_t M, N, K;
    bool ta, tb; /* the operand is a transposed view of its stored transpose */
    bool bias;
    int epi;
    bool narrow; /* the product must be the few-column kernel */
} spec;

typedef struct shapes {
    int an, bn, on;
    int64_t as[4], bsh[4], os[4]; /* a's and b's shapes as stored (before ta/tb) */
} shapes;

static void shapes_of(const spec *s, shapes *h) {
    memset(h, 0, sizeof *h);
    for (int d = 0; d < s->nb; d++) h->as[h->an++] = s->bs[d];
    if (!s->a1) h->as[h->an++] = s->ta ? s->K : s->M;
    h->as[h->an++] = s->a1 || !s->ta ? s->K : s->M;
    if (s->linear) {
        h->bn = 2; /* w is (N, K), stored (K, N) when tb */
        h->bsh[0] = s->tb ? s->K : s->N, h->bsh[1] = s->tb ? s->N : s->K;
    } else {
        for (int d = 0; s->b_batched && d < s->nb; d++) h->bsh[h->bn++] = s->bs[d];
        if (s->b1) {
            h->bsh[h->bn++] = s->K;
        } else {
            h->bsh[h->bn++] = s->tb ? s->N : s->K;
            h->bsh[h->bn++] = s->tb ? s->K : s->N;
        }
    }
    for (int d = 0; d < s->nb; d++) h->os[h->on++] = s->bs[d];
    if (!s->a1) h->os[h->on++] = s->M;
    if (!s->b1) h->os[h->on++] = s->N;
}

static sg_status step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    const spec *s = user;
    sg_tensor *a = s->ta ? sg_transpose(in[0], -1, -2) : in[0];
    sg_tensor *b = s->tb ? sg_transpose(in[1], -1, -2) : in[1];
    sg_tensor *y = s->linear ? sg_linear(a, b, s->bias ? in[2] : NULL) : sg_matmul(a, b);
    int r = s->bias ? 3 : 2;
    switch (s->epi) {
    case EPI_GELU: out[0] = sg_gelu(y); break;
    case EPI_RESIDUAL: out[0] = sg_add(y, in[r]); break;
    case EPI_RELU_SCALE: out[0] = sg_mul_scalar(sg_relu(y), 0.5), out[1] = y; break;
    default: out[0] = y; break;
    }
    if (s->epi != EPI_NONE && s->epi != EPI_RELU_SCALE) sg_release(y);
    if (s->ta) sg_release(a);
    if (s->tb) sg_release(b);
    return out[0] ? SG_OK : sg_ctx_status(c);
}

/* out (the product, rounded to dt) and the epilogue's result, in f64. */
static void reference(const spec *s, const shapes *h, double *const *v, double *prod, double *fin) {
    int64_t batch = s->nb ? s->bs[0] * (s->nb > 1 ? s->bs[1] : 1) : 1;
    int64_t M = s->M, N = s->N, K = s->K;
    (void)h;
    for (int64_t bz = 0; bz < batch; bz++)
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < N; n++) {
                double acc = 0;
                for (int64_t k = 0; k < K; k++) {
                    /* The stored operands, row-major: a (.., M, K) or (.., K, M) when ta. */
                    int64_t ai = s->ta && !s->a1 ? (bz * K + k) * M + m : (bz * M + m) * K + k;
                    int64_t bb = s->linear || !s->b_batched ? 0 : bz;
                    int64_t bi = s->linear ? (s->tb ? k * N + n : n * K + k)
                                 : s->b1   ? bb * K + k
                                 : s->tb   ? (bb * N + n) * K + k
                                           : (bb * K + k) * N + n;
                    acc += v[0][ai] * v[1][bi];
                }
                if (s->bias) acc += v[2][n];
                int64_t o = (bz * M + m) * N + n;
                double y = tu_round(s->dt, acc), z = y;
                if (s->epi == EPI_GELU) z = 0.5 * y * erfc(-y / sqrt(2.0));
                if (s->epi == EPI_RESIDUAL) z = y + v[s->bias ? 3 : 2][o];
                if (s->epi == EPI_RELU_SCALE) z = (y > 0 ? y : 0) * 0.5;
                prod[o] = y;
                fin[o] = tu_round(s->dt, z);
            }
}

/* ------------------------------------------------------------ running a unit */

#ifdef SG_HAVE_OPENCL_HEADERS
/* Slot s's memory: an input's values, or zeros. */
static void *slot_memory(const sg__ir *ir, int s, double *const *vals, const int64_t *nvals,
                         sg_dtype dt) {
    const sg__slot *sl = &ir->slots[s];
    size_t bytes = sl->kind == SG__SLOT_INTERNAL ? sl->nbytes
                   : sl->kind == SG__SLOT_INPUT  ? (size_t)nvals[sl->input] * sg_dtype_size(dt)
                                                 : 0;
    void *mem = ocl->clSVMAlloc(ocl->context, CL_MEM_READ_WRITE | CL_MEM_SVM_FINE_GRAIN_BUFFER,
                                bytes ? bytes : 16, 128);
    if (mem) memset(mem, 0, bytes ? bytes : 16);
    for (int64_t i = 0; mem && sl->kind == SG__SLOT_INPUT && i < nvals[sl->input]; i++)
        tu_store(mem, dt, i, vals[sl->input][i]);
    return mem;
}

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

/* Output o through its ref, in row-major order. */
static double *read_out(const sg__ir *ir, const sg__fused *f, int o, void *const *base, int64_t n) {
    const sg__ref *r = &ir->refs[f->alias[ir->out_refs[o]]];
    double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
    for (int64_t i = 0; v && i < n; i++) {
        int64_t rem = i, off = r->offset;
        for (int d = r->ndim - 1; d >= 0; d--) {
            off += rem % r->shape[d] * r->stride[d];
            rem /= r->shape[d];
        }
        v[i] = tu_load(base[r->slot], r->dtype, off);
    }
    return v;
}

#endif

static double max_abs(const double *v, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) m = fabs(v[i]) > m ? fabs(v[i]) : m;
    return m;
}

static bool check(const char *what, sg_dtype dt, const double *got, const double *ref, int64_t n,
                  int64_t K, double scale) {
    if (dt == SG_F32)
        return tu_close(what, got, ref, n, tu_rtol(dt),
                        tu_atol(dt) * sqrt((double)(K > 1 ? K : 1)) * (scale > 1 ? scale : 1));
    double e = 0, r = 0;
    for (int64_t i = 0; i < n; i++)
        e += (got[i] - ref[i]) * (got[i] - ref[i]), r += ref[i] * ref[i];
    if (sqrt(e) <= tu_rtol(dt) * sqrt(r) + 1e-6) return true;
    fprintf(stderr, "  %s: ||err|| %g > %g ||ref|| %g\n", what, sqrt(e), tu_rtol(dt), sqrt(r));
    return false;
}

/* The unit of dialect d for the capture (fused as for a GPU): kinfo, and
 * whether each MATMUL group became a generated kernel. */
static bool generate(const sg__ir *ir, sg__fused *f, sg__dialect d, const char *name, sg__emit *e,
                     sg__cuda_kinfo **ki) {
    sg__fuse_opts fo;
    sg__cgen_cuda_fuse_opts(&fo, false);
    if (!TU_EXPECT(sg__fuse(ctx, ir, &fo, f) == SG_OK)) return false;
    *ki = calloc((size_t)(f->ngroups ? f->ngroups : 1), sizeof **ki);
    int nk = 0;
    sg_status s = sg__cgen_gpu(ctx, ir, f, name, d, e, *ki, &nk);
    if (!TU_EXPECT(s == SG_OK)) {
        fprintf(stderr, "  %s\n", sg_last_error(ctx));
        return false;
    }
    int gemms = 0;
    saw_narrow = e->buf && strstr(e->buf, " * few columns:");
    for (int k = 0; k < f->ngroups; k++)
        if (f->groups[k].kind == SG__G_MATMUL) {
            if (!TU_EXPECT((*ki)[k].replaces_call && (*ki)[k].name[0])) return false;
            gemms++;
        }
    return TU_EXPECT(gemms == 1);
}

/* The capture's CUDA (SG_CUDA_GEMM=generated) or HIP unit, compiled; *ngroups: the fusion's groups.
 */
static bool compile_rtc(const sg__ir *ir, const char *name, int *ngroups) {
    sg__fused f;
    memset(&f, 0, sizeof f);
    sg__cuda_kinfo *ki = NULL;
    sg__emit e = {.ctx = ctx};
    bool hip = mode == SG__DIALECT_HIP, ok = generate(ir, &f, mode, name, &e, &ki);
    *ngroups = f.ngroups;
    void *image = NULL;
    size_t size = 0;
    if (ok) {
        sg_status s = sg__rtc_build(ctx, hip ? SG__RTC_HIPRTC : SG__RTC_NVRTC, name, e.buf,
                                    hip ? "gfx90a" : "sm_90", &image, &size);
        ok = TU_EXPECT(s == SG_OK);
        if (!ok) fprintf(stderr, "  %s\n", sg_last_error(ctx));
    }
    if (getenv("SG_TEST_PRINT_GEMM") && e.buf) fprintf(stderr, "%s\n", e.buf);
    sg__free(ctx, image, size);
    sg__emit_free(&e);
    free(ki);
    sg__fused_free(ctx, &f, ir);
    return ok;
}

#ifdef SG_HAVE_OPENCL_HEADERS
/* The capture's OpenCL C unit built and run on PoCL, each output against
 * ref[o]; *ngroups: the fusion's groups. */
static bool run_opencl(const sg__ir *ir, const spec *s, double *const *v, const int64_t *nv,
                       int nout, int64_t no, double *const *ref, const char *name, int *ngroups) {
    sg__fused f;
    memset(&f, 0, sizeof f);
    sg__cuda_kinfo *ki = NULL;
    sg__emit e = {.ctx = ctx};
    bool ok = generate(ir, &f, SG__DIALECT_OPENCL, name, &e, &ki);
    *ngroups = f.ngroups;
    void *prog = NULL;
    if (ok) {
        ok = TU_EXPECT(sg__opencl_build(ctx, name, e.buf, &prog) == SG_OK);
        if (!ok) fprintf(stderr, "  %s\n", sg_last_error(ctx));
    }
    if (getenv("SG_TEST_PRINT_GEMM") && e.buf) fprintf(stderr, "%s\n", e.buf);
    void **base = ok ? calloc((size_t)ir->nslots + 1, sizeof *base) : NULL;
    for (int sl = 0; ok && sl < ir->nslots; sl++)
        ok = TU_EXPECT((base[sl] = slot_memory(ir, sl, v, nv, s->dt)) != NULL);
    for (int k = 0; ok && k < f.ngroups; k++)
        ok = TU_EXPECT(ki[k].name[0] != '\0') && launch(prog, &ki[k], base, ir->nslots);
    double scale = max_abs(v[0], nv[0]) * max_abs(v[1], nv[1]) + (s->bias ? 1 : 0);
    for (int o = 0; ok && o < nout; o++) {
        double *got = read_out(ir, &f, o, base, no);
        char what[96];
        snprintf(what, sizeof what, "%s output %d", name, o);
        ok = TU_EXPECT(got) && check(what, s->dt, got, ref[o], no, s->K, scale);
        free(got);
    }
    for (int sl = 0; base && sl < ir->nslots; sl++)
        if (base[sl]) ocl->clSVMFree(ocl->context, base[sl]);
    free(base);
    if (prog) ocl->clReleaseProgram(prog);
    sg__emit_free(&e);
    free(ki);
    sg__fused_free(ctx, &f, ir);
    return ok;
}
#endif

/* The case's inputs (their values into v, counts into nv), its output's
 * shape and size, and the references: the product and the final result. */
typedef struct inputs {
    shapes h;
    sg_tensor *in[4];
    double *v[4];
    int64_t nv[4];
    int nin, nout;
    int64_t no;
    double *ref[2]; /* the final result (output 0), the product (output 1) */
} inputs;

static void make_inputs(const spec *s, uint64_t seed, inputs *x) {
    memset(x, 0, sizeof *x);
    shapes_of(s, &x->h);
    tu_seed(seed);
    int64_t ns = s->linear ? s->N : 0;
    const shapes *h = &x->h;
    x->in[x->nin] = tu_rand(ctx, s->dt, h->an, h->as, -1, 1, &x->v[x->nin]), x->nin++;
    x->in[x->nin] = tu_rand(ctx, s->dt, h->bn, h->bsh, -1, 1, &x->v[x->nin]), x->nin++;
    if (s->bias) x->in[x->nin] = tu_rand(ctx, s->dt, 1, &ns, -1, 1, &x->v[x->nin]), x->nin++;
    if (s->epi == EPI_RESIDUAL)
        x->in[x->nin] = tu_rand(ctx, s->dt, h->on, h->os, -1, 1, &x->v[x->nin]), x->nin++;
    for (int i = 0; i < x->nin; i++) {
        int64_t shp[SG_MAX_DIMS];
        x->nv[i] = 1;
        if (x->in[i] && sg_tensor_shape(x->in[i], shp) == SG_OK)
            for (int d = 0; d < sg_tensor_ndim(x->in[i]); d++) x->nv[i] *= shp[d];
    }
    x->nout = s->epi == EPI_RELU_SCALE ? 2 : 1;
    x->no = 1;
    for (int d = 0; d < h->on; d++) x->no *= h->os[d];
    x->ref[0] = malloc(sizeof(double) * (size_t)x->no);
    x->ref[1] = malloc(sizeof(double) * (size_t)x->no);
    reference(s, h, x->v, x->ref[1], x->ref[0]);
}

static void free_inputs(inputs *x) {
    for (int i = 0; i < x->nin; i++) sg_release(x->in[i]), free(x->v[i]);
    free(x->ref[0]), free(x->ref[1]);
}

/* The case's one-line name after "GEMM(" (the shapes as stored). */
static const char *case_name(const spec *s, const shapes *h, uint64_t seed, char *buf,
                             size_t size) {
    char sh[3][48];
    snprintf(buf, size, "seed=%llu,%s,type=%s,a=%s%s,b=%s%s,out=%s,bias=%d,epilogue=%s%s",
             (unsigned long long)seed, s->linear ? "linear" : "matmul", sg_dtype_name(s->dt),
             tu_shape(h->an, h->as, sh[0], sizeof sh[0]), s->ta ? "^T" : "",
             tu_shape(h->bn, h->bsh, sh[1], sizeof sh[1]), s->tb ? "^T" : "",
             tu_shape(h->on, h->os, sh[2], sizeof sh[2]), s->bias, epi_names[s->epi],
             s->narrow ? ",few columns" : "");
    return buf;
}

/* The case captured on the CPU backend, its unit run on PoCL or compiled. */
static void run_case(const spec *s, uint64_t seed) {
    inputs x;
    make_inputs(s, seed, &x);
    char name[64], cn[256];
    snprintf(name, sizeof name, "gemm_%llu", (unsigned long long)seed);
    sg_fn *fn = NULL;
    sg_compile(ctx, step, (void *)s, x.nin, x.nout, NULL, &fn);
    sg_tensor *out[2] = {NULL, NULL};
    sg_mark_step_begin(ctx);
    bool ok = TU_EXPECT(fn && sg_call(fn, x.in, x.nin, out, x.nout) == SG_OK);
    if (!ok) fprintf(stderr, "  %s\n", sg_last_error(ctx));
    const sg__ir *ir = ok ? &fn->graphs[fn->ngraphs - 1]->ir : NULL;
    int ngroups = 0;
    bool rtc = mode != SG__DIALECT_OPENCL;
    if (ok && rtc) ok = compile_rtc(ir, name, &ngroups);
#ifdef SG_HAVE_OPENCL_HEADERS
    if (ok && !rtc) ok = run_opencl(ir, s, x.v, x.nv, x.nout, x.no, x.ref, name, &ngroups);
#endif
    ok = ok && TU_EXPECT(!s->narrow || saw_narrow);
    tu_case(ok, "GEMM(%s%s) -> %d groups", case_name(s, &x.h, seed, cn, sizeof cn),
            rtc ? (mode == SG__DIALECT_HIP ? ",hiprtc build" : ",nvrtc build") : ",PoCL run",
            ngroups);
    sg_fn_destroy(fn);
    for (int o = 0; o < x.nout; o++) sg_release(out[o]);
    free_inputs(&x);
    sg_clear_error(ctx);
}

/* The case as a compiled step on the device: its outputs against the
 * references, and a generated kernel for the product in the unit. */
static void run_case_device(const spec *s, uint64_t seed) {
    inputs x;
    make_inputs(s, seed, &x);
    char cn[256];
    double scale = max_abs(x.v[0], x.nv[0]) * max_abs(x.v[1], x.nv[1]) + (s->bias ? 1 : 0);
    sg_fn *fn = NULL;
    sg_compile(ctx, step, (void *)s, x.nin, x.nout, NULL, &fn);
    sg_tensor *out[2] = {NULL, NULL};
    gemm_lines = 0, saw_narrow = false;
    bool ok = TU_EXPECT(fn && sg_call(fn, x.in, x.nin, out, x.nout) == SG_OK);
    if (!ok) fprintf(stderr, "  %s\n", sg_last_error(ctx));
    ok = ok && TU_EXPECT(gemm_lines > 0 || x.no / s->N <= 8) && TU_EXPECT(!s->narrow || saw_narrow);
    for (int o = 0; ok && o < x.nout; o++) {
        double *got = tu_read(out[o]);
        ok = TU_EXPECT(got) && check("out", s->dt, got, x.ref[o], x.no, s->K, scale);
        free(got);
    }
    tu_case(ok, "GEMM(%s,%s compiled step) -> %d generated kernel(s)",
            case_name(s, &x.h, seed, cn, sizeof cn), sg_backend_name(tu_backend()), gemm_lines);
    sg_fn_destroy(fn);
    for (int o = 0; o < x.nout; o++) sg_release(out[o]);
    free_inputs(&x);
    sg_clear_error(ctx);
}

static sg_status mm_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)user;
    out[0] = sg_matmul(in[0], in[1]);
    return out[0] ? SG_OK : sg_ctx_status(c);
}

/* Milliseconds per call of a compiled 1024^3 bf16 matmul, generated (gen)
 * or through cuBLASLt; the first call's result into *vals (read before the
 * timed calls reuse its output set). */
static double time_mm(sg_tensor *a, sg_tensor *b, bool gen, double **vals) {
    setenv("SG_CUDA_GEMM", gen ? "generated" : "library", 1);
    sg_fn *fn = NULL;
    sg_compile_opts o = {.name = gen ? "mm_generated" : "mm_cublaslt"};
    sg_compile(ctx, mm_step, NULL, 2, 1, &o, &fn);
    sg_tensor *in[2] = {a, b}, *c = NULL;
    double ms = -1;
    *vals = NULL;
    if (fn && sg_call(fn, in, 2, &c, 1) == SG_OK && (*vals = tu_read(c)) != NULL) {
        enum { REPS = 50 };
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (int r = 0; r < REPS; r++) {
            sg_release(c), c = NULL;
            sg_call(fn, in, 2, &c, 1);
        }
        sg_ctx_synchronize(ctx);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        ms = ((double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6) /
             REPS;
    }
    sg_release(c);
    sg_fn_destroy(fn);
    setenv("SG_CUDA_GEMM", "generated", 1);
    return ms;
}

/* The generated GEMM against cuBLASLt on a few shapes (bf16: the SIMT
 * kernel; f32: the tensor-core one), timed as compiled steps. */
static void test_timing(void) {
    static const struct {
        sg_dtype dt;
        int64_t M, N, K;
    } shapes[] = {{SG_BF16, 1024, 1024, 1024},
                  {SG_F32, 1024, 1024, 1024},
                  {SG_F32, 128, 1024, 784},
                  {SG_F32, 1024, 1024, 128}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        int64_t M = shapes[i].M, N = shapes[i].N, K = shapes[i].K, sa[2] = {M, K}, sb[2] = {K, N};
        sg_dtype dt = shapes[i].dt;
        tu_seed(77 + i);
        sg_tensor *a = tu_rand(ctx, dt, 2, sa, -1, 1, NULL);
        sg_tensor *b = tu_rand(ctx, dt, 2, sb, -1, 1, NULL);
        double *vg = NULL, *vl = NULL;
        double tg = time_mm(a, b, true, &vg), tl = time_mm(a, b, false, &vl);
        /* Two f32 sums of K terms, each rounded its own way: their
         * difference grows with the partial sums (~sqrt(K) here), so
         * the absolute tolerance scales by sqrt(K) / 4 too. */
        double scale = dt == SG_F32 ? sqrt((double)K) / 4 : 1;
        bool ok = TU_EXPECT(tg > 0 && tl > 0 && vg && vl) &&
                  check("generated vs cuBLASLt", dt, vg, vl, M * N, K, scale);
        double flop = 2.0 * (double)M * (double)N * (double)K;
        tu_case(ok,
                "GEMM_TIME(matmul %s %lldx%lldx%lld: generated %.4f ms (%.1f TFLOP/s), cuBLASLt "
                "%.4f ms (%.1f TFLOP/s), %.2fx)",
                dt == SG_F32 ? "f32" : "bf16", (long long)M, (long long)N, (long long)K, tg,
                flop / tg / 1e9, tl, flop / tl / 1e9, tg / tl);
        free(vg), free(vl);
        sg_release(a), sg_release(b);
    }
}

/* CUDA's choice with SG_CUDA_GEMM unset: at most 16 rows against 512 or
 * more contiguous columns and a K of at most 1024 are the GEMV (a thread
 * per column); else a product of at most 4M
 * multiply-adds and K <= 4096 with at most 16 columns, K contiguous in both
 * operands, is the few-column kernel in any float dtype; other f32 products
 * of that size are the tensor-core kernel (cuBLASLt splits such products
 * into kernels slower than the whole product here); larger f32 products and
 * other dtypes stay cuBLASLt's, and =library leaves every product to it.
 * Read from the unit: the group's kernel replaces the call, and its text. */
enum { K_LIB, K_MMA, K_NARROW, K_GEMV };
static void test_default_kind(void) {
    static const char *const kind_names[4] = {"cuBLASLt", "tensor-core kernel", "few-column kernel",
                                              "GEMV"};
    static const struct {
        spec s;
        const char *env;
        int kind;
    } cases[] = {
        {{.dt = SG_F32, .linear = true, .M = 128, .N = 10, .K = 1024, .bias = true},
         NULL,
         K_NARROW},
        {{.dt = SG_BF16, .linear = true, .M = 96, .N = 16, .K = 768, .bias = true}, NULL, K_NARROW},
        {{.dt = SG_F32, .linear = true, .M = 128, .N = 17, .K = 1024}, NULL, K_MMA},
        {{.dt = SG_F32, .M = 128, .N = 10, .K = 1024}, NULL, K_MMA}, /* B's K strided */
        {{.dt = SG_F32, .M = 128, .N = 1024, .K = 10}, NULL, K_MMA},
        {{.dt = SG_F32, .M = 10, .N = 1024, .K = 128, .ta = true}, NULL, K_GEMV},
        {{.dt = SG_F32, .M = 10, .N = 256, .K = 128, .ta = true}, NULL, K_MMA},
        {{.dt = SG_F32, .M = 256, .N = 256, .K = 256}, NULL, K_LIB},
        {{.dt = SG_F32, .M = 9, .N = 9, .K = 5000}, NULL, K_LIB},
        {{.dt = SG_BF16, .M = 64, .N = 64, .K = 64}, NULL, K_LIB},
        {{.dt = SG_F32, .linear = true, .M = 128, .N = 10, .K = 1024}, "library", K_LIB},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const spec *sp = &cases[i].s;
        if (cases[i].env)
            setenv("SG_CUDA_GEMM", cases[i].env, 1);
        else
            unsetenv("SG_CUDA_GEMM");
        inputs x;
        make_inputs(sp, 500 + i, &x);
        sg_fn *fn = NULL;
        sg_compile(ctx, step, (void *)sp, x.nin, x.nout, NULL, &fn);
        sg_tensor *out[2] = {NULL, NULL};
        sg_mark_step_begin(ctx);
        bool ok = TU_EXPECT(fn && sg_call(fn, x.in, x.nin, out, x.nout) == SG_OK);
        sg__fused f;
        memset(&f, 0, sizeof f);
        sg__cuda_kinfo *ki = NULL;
        sg__emit e = {.ctx = ctx};
        int nk = 0, mm = -1;
        if (ok) {
            const sg__ir *ir = &fn->graphs[fn->ngraphs - 1]->ir;
            sg__fuse_opts fo;
            sg__cgen_cuda_fuse_opts(&fo, false);
            ok = TU_EXPECT(sg__fuse(ctx, ir, &fo, &f) == SG_OK) &&
                 TU_EXPECT((ki = calloc((size_t)f.ngroups + 1, sizeof *ki)) != NULL) &&
                 TU_EXPECT(sg__cgen_gpu(ctx, ir, &f, "gemm_kind", SG__DIALECT_CUDA, &e, ki, &nk) ==
                           SG_OK);
            for (int k = 0; ok && k < f.ngroups; k++)
                if (f.groups[k].kind == SG__G_MATMUL) mm = k;
            int kind = cases[i].kind;
            ok = ok && TU_EXPECT(mm >= 0) && TU_EXPECT(ki[mm].replaces_call == (kind != K_LIB)) &&
                 TU_EXPECT((e.buf && strstr(e.buf, "sg_mma_tf32(part[")) == (kind == K_MMA)) &&
                 TU_EXPECT((e.buf && strstr(e.buf, " * few columns:")) == (kind == K_NARROW)) &&
                 TU_EXPECT((e.buf && strstr(e.buf, " * GEMV,")) == (kind == K_GEMV));
            sg__fused_free(ctx, &f, ir);
        }
        char cn[256];
        tu_case(ok, "GEMM_KIND(%s, SG_CUDA_GEMM=%s) -> %s",
                case_name(sp, &x.h, 500 + i, cn, sizeof cn), cases[i].env ? cases[i].env : "unset",
                kind_names[cases[i].kind]);
        sg__emit_free(&e);
        free(ki);
        sg_fn_destroy(fn);
        for (int o = 0; o < x.nout; o++) sg_release(out[o]);
        free_inputs(&x);
        sg_clear_error(ctx);
    }
    setenv("SG_CUDA_GEMM", "generated", 1);
}

/* HIP's line about its matmuls (logged once by its executor): without
 * libhipblaslt (Debian), the not-found text naming the generated GEMM. */
static void test_hip_note(void) {
    char line[400];
    bool found = sg__hip_blaslt_note(line, sizeof line);
    bool ok = TU_EXPECT(strstr(line, "generated GEMM") != NULL) &&
              TU_EXPECT(strstr(line, found ? "not called" : "no hipBLASLt") != NULL);
    printf("  %s\n", line);
    tu_case(ok, "HIP_BLASLT_NOTE(found=%d)", found);
}

/* A random product of seed: sizes odd and small (tiles partly filled),
 * now and then K = 1 or one size past a tile. */
static void random_spec(uint64_t seed, spec *s) {
    static const sg_dtype dts[3] = {SG_F32, SG_F16, SG_BF16};
    tu_seed(seed * 7919);
    memset(s, 0, sizeof *s);
    s->dt = dts[seed % 3];
    s->linear = tu_randint(0, 2) == 0;
    s->M = tu_randint(9, 40) | 1;
    s->N = tu_randint(9, 80) | 1;
    s->K = tu_randint(0, 5) == 0 ? 1 : tu_randint(2, 70) | 1;
    if (tu_randint(0, 4) == 0) s->M += 64;
    s->nb = (int)tu_randint(0, 2);
    for (int d = 0; d < s->nb; d++) s->bs[d] = tu_randint(1, 3);
    s->ta = tu_randint(0, 2) == 0;
    s->tb = tu_randint(0, 1) == 0;
    if (s->linear) {
        s->bias = tu_randint(0, 1) == 0;
    } else {
        s->b_batched = s->nb > 0 && tu_randint(0, 1) == 0;
        int one = (int)tu_randint(0, 7);
        s->a1 = one == 0 && !s->ta;
        s->b1 = one == 1 && !s->tb;
        if (s->b1) s->b_batched = false;
        if (s->a1) s->nb = 0, s->b_batched = false;
        if (s->a1) s->M = 1;
        if (s->b1) s->N = 1;
    }
    s->epi = (int)tu_randint(0, EPI_COUNT - 1);
}

int main(void) {
    char why[512] = "";
    on_device = tu_backend() != SG_BACKEND_CPU;
    const char *dm = getenv("SG_TEST_GEMM_DIALECT");
    if (dm && strcmp(dm, "cuda") == 0) mode = SG__DIALECT_CUDA;
    if (dm && strcmp(dm, "hip") == 0) mode = SG__DIALECT_HIP;
    if (mode != SG__DIALECT_OPENCL &&
        !sg__rtc_available(mode == SG__DIALECT_HIP ? SG__RTC_HIPRTC : SG__RTC_NVRTC, why,
                           sizeof why)) {
        printf("%s; skipped\n", why);
        return 77;
    }
    if (mode == SG__DIALECT_OPENCL && !on_device) {
#ifndef SG_HAVE_OPENCL_HEADERS
        printf("built without the OpenCL headers: skipped\n");
        return 77;
#else
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
#endif
    }
    /* Captures keep their IR; the CPU needs no C unit here. */
    if (!on_device) setenv("SG_CODEGEN", "0", 1);
    setenv("SG_CUDA_GEMM", "generated", 1);
    ctx = tu_ctx((sg_ctx_opts){.log = log_hook});
    /* Fixed shapes first: K = 1, one full tile, tiles past the edge, transposes. */
    static const spec fixed[] = {
        {.dt = SG_F32, .M = 64, .N = 64, .K = 16},
        {.dt = SG_F32, .M = 7, .N = 5, .K = 1},
        {.dt = SG_F32, .M = 65, .N = 129, .K = 33, .ta = true, .tb = true},
        /* f32 on CUDA's tensor cores: 64 x 64 tiles, a transposed A; K split
         * over blocks (a linear with bias and GELU; batched, B batched). */
        {.dt = SG_F32, .M = 640, .N = 704, .K = 100, .ta = true},
        {.dt = SG_F32,
         .linear = true,
         .M = 128,
         .N = 256,
         .K = 1000,
         .bias = true,
         .epi = EPI_GELU},
        {.dt = SG_F32,
         .nb = 1,
         .bs = {3},
         .b_batched = true,
         .M = 40,
         .N = 72,
         .K = 300,
         .tb = true,
         .epi = EPI_RESIDUAL},
        {.dt = SG_BF16,
         .linear = true,
         .nb = 2,
         .bs = {2, 3},
         .M = 11,
         .N = 70,
         .K = 37,
         .bias = true,
         .epi = EPI_GELU},
        {.dt = SG_F16,
         .nb = 1,
         .bs = {3},
         .b_batched = true,
         .M = 13,
         .N = 17,
         .K = 19,
         .tb = true,
         .epi = EPI_RESIDUAL},
        {.dt = SG_BF16,
         .nb = 1,
         .bs = {4},
         .M = 9,
         .N = 21,
         .K = 5,
         .ta = true,
         .epi = EPI_RELU_SCALE},
        /* Few columns (K contiguous in both operands): W4's logits;
         * bf16 rows of whole vectors, split K; f16 and one column;
         * a batch folded into M; unaligned rows (K odd: one at a time). */
        {.dt = SG_F32,
         .linear = true,
         .M = 128,
         .N = 10,
         .K = 1024,
         .bias = true,
         .epi = EPI_RELU_SCALE,
         .narrow = true},
        {.dt = SG_BF16,
         .linear = true,
         .nb = 1,
         .bs = {3},
         .M = 50,
         .N = 16,
         .K = 776,
         .bias = true,
         .epi = EPI_GELU,
         .narrow = true},
        {.dt = SG_F16, .M = 70, .N = 3, .K = 304, .tb = true, .epi = EPI_RESIDUAL, .narrow = true},
        {.dt = SG_F32, .nb = 1, .bs = {2}, .M = 33, .N = 7, .K = 64, .tb = true, .narrow = true},
        {.dt = SG_F32, .linear = true, .M = 40, .N = 1, .K = 129, .bias = true, .narrow = true},
        /* Few rows against a weight of contiguous N: the GEMV, a thread per
         * column, x transposed (W4's weight gradient of its 10 classes). */
        {.dt = SG_F32, .M = 10, .N = 1024, .K = 128, .ta = true},
        {.dt = SG_BF16, .M = 16, .N = 600, .K = 33, .ta = true, .epi = EPI_RESIDUAL},
        {.dt = SG_F16, .M = 12, .N = 520, .K = 17, .epi = EPI_GELU},
    };
    int nfixed = (int)(sizeof fixed / sizeof fixed[0]);
    void (*run)(const spec *, uint64_t) = on_device ? run_case_device : run_case;
    for (int i = 0; i < nfixed; i++) run(&fixed[i], 1000 + (uint64_t)i);
    /* hiprtc takes about a second a unit: every third random case there. */
    for (uint64_t seed = 1; seed <= 36; seed++) {
        spec s;
        random_spec(seed, &s);
        if (mode != SG__DIALECT_HIP || seed % 3 == 0) run(&s, seed);
    }
    if (mode == SG__DIALECT_OPENCL && !on_device) test_hip_note();
    if (mode == SG__DIALECT_CUDA && !on_device) test_default_kind();
    if (on_device && tu_backend() == SG_BACKEND_CUDA) test_timing();
#ifdef SG_HAVE_OPENCL_HEADERS
    if (queue) ocl->clReleaseCommandQueue(queue);
#endif
    sg_ctx_destroy(ctx);
    return tu_finish();
}
