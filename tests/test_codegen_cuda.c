/* SPDX-License-Identifier: MIT */
/*
 * test_codegen_cuda.c -- the CUDA C dialect (codegen/cgen_cuda.c) without a
 * GPU: steps are captured on the CPU backend, their IR fused with the CUDA
 * fusion options and turned into CUDA units, and every unit is compiled by
 * NVRTC for sm_90. Checked: the kernel and library-call counts of the
 * patterns that matter (W1's 24-op chain in one kernel, softmax and
 * layer_norm with prologue and epilogues as one row kernel each, a row
 * reduction with prologue and epilogue as one kernel, linear + bias +
 * gelu_tanh as one GEMV kernel at batch 1 and as a library call plus one
 * epilogue at batch 64, AdamW over
 * 10 parameters as one MULTI kernel whose loops of one code (but for where
 * and how long) are emitted once, so that the unit does not grow with 64
 * parameters of one shape, GEMV at odd sizes and for a matmul with
 * its weight either way round, no GEMV when its epilogue writes its own
 * input, an input whose base is not 16-byte aligned, a 12-layer
 * transformer-like step whose layers share their kernels: as many distinct
 * kernels as one layer has, and twelve times its launches, embedding,
 * index_select, concat of narrowed halves and index_copy_ into a cache as
 * generated kernels with no library call, the gelu_tanh backward over
 * (4, 1024, 3072) bf16 as one vectorized kernel whose bf16 round trips are
 * one conversion each way, permute copies of (B,H,T,D) heads walking
 * 16-byte vectors along D only where every access is contiguous there and
 * aligned) and random op DAGs over every dtype, 24 programs to a unit.
 * The numerics of the kernels run under the gpu label (the capture tests on
 * the CUDA backend). Exits 77 when NVRTC cannot be loaded.
 */
#define _POSIX_C_SOURCE 200809L
#include "testutil.h"

#include "graphs/graphs.h"

#include <math.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static sg_ctx *ctx;
static bool nvrtc_missing;
static int units_compiled;

/* What a capture became on CUDA. */
typedef struct counts {
    int groups, kernels, calls, gemv, multi;
    int rows;     /* row kernels: a ROW or REDUCE group computed without a library call */
    int distinct; /* kernels whose text is in the unit (the others reuse one) */
    bool vec;     /* a 16-, 8- or 4-byte vector path */
    int soft_rt;  /* bf16/f16 round trips written out in bits, not one conversion each way */
    int branches; /* MULTI members' block ranges ("if (blockIdx.x < ") */
    int vec_loops; /* loops with a vector path */
    int bf_rt2;    /* packed pairs of bf16 round trips (sg_bf_rt2) in the kernels */
    int row_vec;   /* vector loops that walk rows by indices (not flat) */
    size_t code;   /* bytes of the unit outside comments */
    double nvrtc_s;
} counts;

/* Bytes of C text s outside its comments. */
static size_t code_bytes(const char *s) {
    size_t n = 0;
    for (const char *p = s; *p; p++) {
        if (p[0] == '/' && p[1] == '*') {
            const char *end = strstr(p + 2, "*/");
            if (!end) break;
            p = end + 1;
        } else {
            n++;
        }
    }
    return n;
}

/*
 * Fuse the last capture of fn for CUDA, generate its unit, count what it
 * launches, and compile it through NVRTC for sm_90.
 */
static bool cuda_unit(sg_fn *fn, const char *name, counts *c) {
    memset(c, 0, sizeof *c);
    if (!TU_EXPECT(fn->ngraphs > 0)) return false;
    sg__graph *g = fn->graphs[fn->ngraphs - 1];
    sg__fuse_opts fo;
    sg__cgen_cuda_fuse_opts(&fo, false);
    sg__fused f;
    if (!TU_EXPECT(sg__fuse(ctx, &g->ir, &fo, &f) == SG_OK)) return false;
    sg__cuda_kinfo *ki = calloc((size_t)(f.ngroups ? f.ngroups : 1), sizeof *ki);
    sg__emit e = {.ctx = ctx};
    int nk = 0;
    bool ok = TU_EXPECT(sg__cgen_cuda(ctx, &g->ir, &f, name, &e, ki, &nk) == SG_OK);
    c->groups = f.ngroups;
    c->kernels = nk;
    for (int k = 0; ok && k < f.ngroups; k++) {
        const sg__group *grp = &f.groups[k];
        bool lib = grp->kind == SG__G_OPAQUE || grp->anchor >= 0;
        if (lib && !ki[k].replaces_call) c->calls++;
        if (ki[k].replaces_call && grp->kind == SG__G_MATMUL) c->gemv++;
        if (ki[k].replaces_call && grp->kind != SG__G_MATMUL) c->rows++;
        if (grp->kind == SG__G_MULTI) c->multi++;
        if (ki[k].name[0]) ok = TU_EXPECT(ki[k].grid > 0 && ki[k].block > 0);
        c->distinct += ki[k].emitted;
        /* Each kernel's own table names the slots it uses, once each. */
        for (int i = 0; ok && ki[k].name[0] && i < ki[k].nlocal; i++)
            for (int j = 0; ok && j < i; j++) ok = TU_EXPECT(ki[k].local[i] != ki[k].local[j]);
        /* A kernel named like an earlier one is emitted once, and its text is there. */
        if (ok && ki[k].name[0]) {
            char sig[sizeof ki[k].name + 64];
            snprintf(sig, sizeof sig, " %s(char *const *slot)", ki[k].name);
            const char *at = strstr(e.buf, sig);
            ok = TU_EXPECT(at != NULL) && TU_EXPECT(strstr(at + 1, sig) == NULL);
            for (int j = 0; ok && j < k; j++)
                if (strcmp(ki[j].name, ki[k].name) == 0) ok = TU_EXPECT(!ki[k].emitted);
        }
        /* A MULTI kernel: three blocks of 512 per SM, and no slot base
         * loaded in its head (each member's branch loads its own). */
        if (ok && grp->kind == SG__G_MULTI && ki[k].emitted) {
            char sig[sizeof ki[k].name + 64];
            snprintf(sig, sizeof sig, "__launch_bounds__(512, 3) %s(char *const *slot) {",
                     ki[k].name);
            const char *at = strstr(e.buf, sig), *pdl = at ? strstr(at, "sg_pdl_launch();") : NULL;
            const char *first = at ? strstr(at + strlen(sig), "= slot[") : NULL;
            ok = TU_EXPECT(at && pdl) && TU_EXPECT(first > pdl);
        }
    }
    if (ok && getenv("SG_TEST_PRINT_CUDA")) fprintf(stderr, "%s\n", e.buf);
    c->vec = ok && strstr(e.buf, "union {") != NULL;
    c->code = ok ? code_bytes(e.buf) : 0;
    for (const char *at = e.buf; ok && (at = strstr(at, "if (blockIdx.x < ")); at++) c->branches++;
    for (const char *at = e.buf; ok && (at = strstr(at, "for (sg_i64 q = tid;")); at++)
        c->vec_loops++;
    for (const char *at = e.buf; ok && (at = strstr(at, "rem = (sg_u32)q;")); at++) c->row_vec++;
    for (const char *at = strstr(e.buf, "__global__"); ok && at && (at = strstr(at, "sg_bf_rt2("));
         at++)
        c->bf_rt2++;
    static const char *const soft[2] = {"sg_bf2f(sg_f2bf(", "sg_h2f(sg_f2h("};
    for (int p = 0; ok && p < 2; p++) /* in the kernels, after the preamble */
        for (const char *at = strstr(e.buf, "__global__"); at && (at = strstr(at, soft[p])); at++)
            c->soft_rt++;
    if (ok && nk > 0 && !nvrtc_missing) {
        void *cubin = NULL;
        size_t size = 0;
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        sg_status s = sg__nvrtc_build(ctx, name, e.buf, 90, &cubin, &size);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        c->nvrtc_s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        fprintf(stderr, "  %s: %d kernels (%d distinct), %zu bytes of CUDA C, NVRTC %.2f s\n", name,
                nk, c->distinct, e.len, c->nvrtc_s);
        if (s == SG_ERR_BACKEND_UNAVAILABLE) {
            nvrtc_missing = true;
        } else {
            ok = TU_EXPECT(s == SG_OK && cubin && size > 0);
            if (!ok) fprintf(stderr, "  %s\n", sg_last_error(ctx));
            units_compiled += ok;
        }
        sg__free(ctx, cubin, size);
        sg_clear_error(ctx);
    }
    sg__emit_free(&e);
    free(ki);
    sg__fused_free(ctx, &f, &g->ir);
    return ok;
}

/* Capture fn once on inputs in[] (no outputs kept). */
static bool capture(sg_fn *fn, sg_tensor *const *in, int nin, int nout) {
    sg_tensor *out[4] = {NULL};
    sg_mark_step_begin(ctx);
    bool ok = TU_EXPECT(sg_call(fn, in, nin, out, nout) == SG_OK);
    if (!ok) fprintf(stderr, "  %s\n", sg_last_error(ctx));
    return ok;
}

static sg_fn *compile(sg_step_fn step, void *user, int nin, int nout) {
    sg_fn *fn = NULL;
    sg_compile(ctx, step, user, nin, nout, &(sg_compile_opts){.mode = SG_MODE_REDUCE_OVERHEAD},
               &fn);
    return fn;
}

/* ------------------------------------------------------------ the patterns */

static sg_status chain_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)user;
    sg_tensor *y = in[0];
    for (int i = 0; i < 6; i++) y = sg_tanh(sg_add_scalar(sg_mul_scalar(sg_sin(y), 1.01), 0.1));
    out[0] = y;
    return y ? SG_OK : sg_ctx_status(c);
}

/* skew > 0: the input is a view starting skew elements into its storage,
 * so its base is not 16-byte aligned and the kernel takes its scalar path. */
static void test_chain(sg_dtype dt, int64_t n, int64_t skew) {
    sg_fn *fn = compile(chain_step, NULL, 1, 1);
    int64_t total = n + skew;
    sg_tensor *base = tu_rand(ctx, dt, 1, &total, -2, 2, NULL);
    sg_tensor *x = skew ? sg_narrow(base, 0, skew, n) : base;
    counts c = {0};
    char name[64];
    snprintf(name, sizeof name, "cu_chain_%s_%lld_%lld", sg_dtype_name(dt), (long long)n,
             (long long)skew);
    bool ok = capture(fn, &x, 1, 1) && cuda_unit(fn, name, &c) && TU_EXPECT(c.kernels == 1) &&
              TU_EXPECT(c.groups == 1) && TU_EXPECT(c.calls == 0);
    tu_case(ok, "CUDA_CHAIN24(type=%s,n=%lld,skew=%lld) -> %d kernel", sg_dtype_name(dt),
            (long long)n, (long long)skew, c.kernels);
    if (skew) sg_release(x);
    sg_release(base);
    sg_fn_destroy(fn);
}

/* softmax(x * 0.5) * 2 + 1: one row kernel with prologue and epilogue. */
static sg_status softmax_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)user;
    out[0] = sg_add_scalar(sg_mul_scalar(sg_softmax(sg_mul_scalar(in[0], 0.5), -1), 2.0), 1.0);
    return out[0] ? SG_OK : sg_ctx_status(c);
}

/* layer_norm(x, w, b) then gelu; and layer_norm(x) * w + b (affine as an epilogue). */
static sg_status layernorm_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)user;
    out[0] = sg_gelu(sg_layer_norm(in[0], in[1], in[2], 1e-5));
    out[1] = sg_add(sg_mul(sg_layer_norm(in[0], NULL, NULL, 1e-5), in[1]), in[2]);
    return out[0] && out[1] ? SG_OK : sg_ctx_status(c);
}

static void test_rows(sg_dtype dt) {
    int64_t xs[2] = {64, 768}, ws = 768;
    sg_tensor *x = tu_rand(ctx, dt, 2, xs, -2, 2, NULL);
    sg_tensor *w = tu_rand(ctx, dt, 1, &ws, -1, 1, NULL),
              *b = tu_rand(ctx, dt, 1, &ws, -1, 1, NULL);
    sg_fn *fn = compile(softmax_step, NULL, 1, 1);
    counts c = {0};
    char name[64];
    snprintf(name, sizeof name, "cu_softmax_%s", sg_dtype_name(dt));
    bool ok = capture(fn, &x, 1, 1) && cuda_unit(fn, name, &c) && TU_EXPECT(c.kernels == 1) &&
              TU_EXPECT(c.calls == 0) && TU_EXPECT(c.rows == 1);
    tu_case(ok, "CUDA_SOFTMAX_EPILOGUE(type=%s,x=[64,768]) -> %d kernels + %d library call",
            sg_dtype_name(dt), c.kernels, c.calls);
    sg_fn_destroy(fn);
    fn = compile(layernorm_step, NULL, 3, 2);
    sg_tensor *in[3] = {x, w, b};
    snprintf(name, sizeof name, "cu_layernorm_%s", sg_dtype_name(dt));
    ok = capture(fn, in, 3, 2) && cuda_unit(fn, name, &c) && TU_EXPECT(c.calls == 0) &&
         TU_EXPECT(c.kernels == 2) && TU_EXPECT(c.rows == 2);
    tu_case(ok, "CUDA_LAYERNORM_AFFINE(type=%s,x=[64,768]) -> %d kernels + %d library calls",
            sg_dtype_name(dt), c.kernels, c.calls);
    sg_fn_destroy(fn);
    sg_release(x), sg_release(w), sg_release(b);
}

/* W2: layers x (linear + gelu_tanh). */
typedef struct mlp {
    int layers;
    sg_tensor *w[8], *b[8];
    bool matmul;    /* x @ w (K, N) instead of linear */
    bool transpose; /* matmul with w viewed transposed from (N, K) */
} mlp;

static sg_status mlp_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    const mlp *m = user;
    sg_tensor *h = in[0];
    for (int l = 0; l < m->layers; l++) {
        if (!m->matmul)
            h = sg_gelu_tanh(sg_linear(h, m->w[l], m->b[l]));
        else
            h = sg_gelu_tanh(sg_add(
                sg_matmul(h, m->transpose ? sg_transpose(m->w[l], 0, 1) : m->w[l]), m->b[l]));
    }
    out[0] = h;
    return h ? SG_OK : sg_ctx_status(c);
}

static void test_mlp(sg_dtype dt, int64_t batch, int layers, bool matmul, bool transpose) {
    mlp m = {.layers = layers, .matmul = matmul, .transpose = transpose};
    int64_t ws[2] = {1024, 1024}, bs = 1024, xs[2] = {batch, 1024};
    for (int l = 0; l < layers; l++) {
        m.w[l] = tu_rand(ctx, dt, 2, ws, -0.03, 0.03, NULL);
        m.b[l] = tu_rand(ctx, dt, 1, &bs, -0.1, 0.1, NULL);
    }
    sg_tensor *x = tu_rand(ctx, dt, 2, xs, -1, 1, NULL);
    sg_fn *fn = compile(mlp_step, &m, 1, 1);
    counts c = {0};
    char name[96];
    snprintf(name, sizeof name, "cu_mlp_%s_b%lld_l%d_%s%s", sg_dtype_name(dt), (long long)batch,
             layers, matmul ? "matmul" : "linear", transpose ? "_t" : "");
    bool gemv = batch <= 8;
    bool ok = capture(fn, &x, 1, 1) && cuda_unit(fn, name, &c) && TU_EXPECT(c.kernels == layers) &&
              TU_EXPECT(c.distinct == 1) && TU_EXPECT(c.gemv == (gemv ? layers : 0)) &&
              TU_EXPECT(c.calls == (gemv ? 0 : layers));
    tu_case(ok,
            "CUDA_MLP(type=%s,batch=%lld,layers=%d,%s%s) -> %d kernels (%d GEMV) + %d library "
            "calls",
            sg_dtype_name(dt), (long long)batch, layers, matmul ? "matmul" : "linear",
            transpose ? ",w transposed" : "", c.kernels, c.gemv, c.calls);
    sg_release(x);
    for (int l = 0; l < layers; l++) sg_release(m.w[l]), sg_release(m.b[l]);
    sg_fn_destroy(fn);
}

/* A decoder-like block per layer at batch 1: rms_norm, a gated MLP
 * (silu(x w1) * (x w3)) w2, a residual add, each layer's weights its own. */
#define TL_MAX 12
typedef struct tlayers {
    int layers;
    sg_tensor *g[TL_MAX], *w1[TL_MAX], *w3[TL_MAX], *w2[TL_MAX];
} tlayers;

static sg_status tlayers_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    const tlayers *m = user;
    sg_tensor *h = in[0];
    for (int l = 0; l < m->layers; l++) {
        sg_tensor *x = sg_rms_norm(h, m->g[l], 1e-6);
        sg_tensor *u = sg_mul(sg_silu(sg_linear(x, m->w1[l], NULL)), sg_linear(x, m->w3[l], NULL));
        h = sg_add(h, sg_linear(u, m->w2[l], NULL));
    }
    out[0] = h;
    return h ? SG_OK : sg_ctx_status(c);
}

static bool tlayers_unit(sg_dtype dt, int layers, counts *c) {
    tlayers m = {.layers = layers};
    int64_t d = 256, f = 512, w1s[2] = {f, d}, w2s[2] = {d, f}, xs[2] = {1, d};
    for (int l = 0; l < layers; l++) {
        m.g[l] = tu_rand(ctx, dt, 1, &d, 0.5, 1.5, NULL);
        m.w1[l] = tu_rand(ctx, dt, 2, w1s, -0.05, 0.05, NULL);
        m.w3[l] = tu_rand(ctx, dt, 2, w1s, -0.05, 0.05, NULL);
        m.w2[l] = tu_rand(ctx, dt, 2, w2s, -0.05, 0.05, NULL);
    }
    sg_tensor *x = tu_rand(ctx, dt, 2, xs, -1, 1, NULL);
    sg_fn *fn = compile(tlayers_step, &m, 1, 1);
    char name[64];
    snprintf(name, sizeof name, "cu_layers_%s_l%d", sg_dtype_name(dt), layers);
    bool ok = capture(fn, &x, 1, 1) && cuda_unit(fn, name, c);
    sg_fn_destroy(fn);
    sg_release(x);
    for (int l = 0; l < layers; l++)
        sg_release(m.g[l]), sg_release(m.w1[l]), sg_release(m.w3[l]), sg_release(m.w2[l]);
    return ok;
}

/* 12 layers emit the distinct kernels of one, and launch 12 times as many. */
static void test_layers(sg_dtype dt) {
    counts one = {0}, all = {0};
    bool ok = tlayers_unit(dt, 1, &one) && tlayers_unit(dt, TL_MAX, &all) &&
              TU_EXPECT(one.kernels >= 2) && TU_EXPECT(all.kernels == TL_MAX * one.kernels) &&
              TU_EXPECT(all.calls == TL_MAX * one.calls) && TU_EXPECT(all.distinct == one.distinct);
    tu_case(ok,
            "CUDA_LAYERS_SHARE_KERNELS(type=%s,layers=%d,d=256,f=512,batch=1) -> %d launches of "
            "%d distinct kernels (one layer: %d of %d), NVRTC %.2f s",
            sg_dtype_name(dt), TL_MAX, all.kernels, all.distinct, one.kernels, one.distinct,
            all.nvrtc_s);
}

/* Decode-step data movement: token embedding plus a position row, the
 * halves rotated by concat, the result written into a cache row by
 * index_copy_ (every one generated, no library call; being small, they
 * run in order as one chain kernel). */
typedef struct datamove {
    sg_tensor *wte, *wpe, *cache;
} datamove;

static sg_status datamove_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    const datamove *m = user;
    int64_t d = m->wte->shape[1];
    sg_tensor *h = sg_add(sg_embedding(m->wte, in[0]), sg_index_select(m->wpe, 0, in[1]));
    sg_tensor *halves[2] = {sg_neg(sg_narrow(h, 1, d / 2, d / 2)), sg_narrow(h, 1, 0, d / 2)};
    sg_tensor *r = sg_add(h, sg_concat(2, halves, 1));
    sg_status s = sg_index_copy_(m->cache, 0, in[1], r);
    out[0] = r;
    return s != SG_OK ? s : sg_ctx_status(c);
}

static void test_datamove(sg_dtype dt, sg_dtype it, int64_t rows) {
    int64_t ws[2] = {50, 64}, ps[2] = {32, 64};
    datamove m = {tu_rand(ctx, dt, 2, ws, -1, 1, NULL), tu_rand(ctx, dt, 2, ps, -1, 1, NULL),
                  tu_rand(ctx, dt, 2, ps, -1, 1, NULL)};
    sg_tensor *in[2] = {tu_rand(ctx, it, 1, &rows, 0, 49, NULL),
                        tu_rand(ctx, it, 1, &rows, 0, 31, NULL)};
    sg_fn *fn = compile(datamove_step, &m, 2, 1);
    counts c = {0};
    char name[64];
    snprintf(name, sizeof name, "cu_datamove_%s_%s_%lld", sg_dtype_name(dt), sg_dtype_name(it),
             (long long)rows);
    bool ok = capture(fn, in, 2, 1) && cuda_unit(fn, name, &c) && TU_EXPECT(c.calls == 0) &&
              TU_EXPECT(c.kernels == 1); /* all small: one chain kernel, in order */
    tu_case(ok,
            "CUDA_DATA_MOVEMENT(type=%s,idx=%s,rows=%lld: embedding, index_select, concat, "
            "index_copy_) -> %d kernels + %d library calls",
            sg_dtype_name(dt), sg_dtype_name(it), (long long)rows, c.kernels, c.calls);
    sg_fn_destroy(fn);
    sg_release(in[0]), sg_release(in[1]);
    sg_release(m.wte), sg_release(m.wpe), sg_release(m.cache);
}

/* Odd sizes: 3 rows, N = 37, K = 100 (vector loads only where K divides). */
typedef struct odd {
    sg_tensor *w, *b;
} odd;

static sg_status odd_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    const odd *o = user;
    out[0] = sg_relu(sg_add_scalar(sg_linear(in[0], o->w, o->b), -0.05));
    return out[0] ? SG_OK : sg_ctx_status(c);
}

static void test_gemv_odd(sg_dtype dt) {
    int64_t ws[2] = {37, 100}, bs = 37, xs[3] = {3, 1, 100};
    odd o = {tu_rand(ctx, dt, 2, ws, -0.3, 0.3, NULL), tu_rand(ctx, dt, 1, &bs, -0.1, 0.1, NULL)};
    sg_tensor *x = tu_rand(ctx, dt, 3, xs, -1, 1, NULL);
    sg_fn *fn = compile(odd_step, &o, 1, 1);
    counts c = {0};
    char name[64];
    snprintf(name, sizeof name, "cu_gemv_odd_%s", sg_dtype_name(dt));
    bool ok = capture(fn, &x, 1, 1) && cuda_unit(fn, name, &c) && TU_EXPECT(c.kernels == 1) &&
              TU_EXPECT(c.gemv == 1) && TU_EXPECT(c.calls == 0);
    tu_case(ok, "CUDA_GEMV_ODD(type=%s,x=[3,1,100],w=[37,100]) -> %d GEMV kernel",
            sg_dtype_name(dt), c.gemv);
    sg_release(x), sg_release(o.w), sg_release(o.b);
    sg_fn_destroy(fn);
}

/* h = gelu(linear(h, w, b)) written back into the parameter h: other
 * columns still read h while one column's epilogue would write it, so
 * this is no GEMV but the library call and an epilogue kernel. */
typedef struct inplace {
    sg_tensor *h, *w, *b;
} inplace;

static sg_status inplace_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)in;
    const inplace *p = user;
    sg_status s = sg_copy_(p->h, sg_gelu(sg_linear(p->h, p->w, p->b)));
    out[0] = p->h;
    return s != SG_OK ? s : sg_ctx_status(c);
}

static void test_gemv_inplace(void) {
    int64_t hs[2] = {1, 256}, ws[2] = {256, 256}, bs = 256;
    inplace p = {tu_rand(ctx, SG_F32, 2, hs, -1, 1, NULL),
                 tu_rand(ctx, SG_F32, 2, ws, -0.1, 0.1, NULL),
                 tu_rand(ctx, SG_F32, 1, &bs, -0.1, 0.1, NULL)};
    sg_fn *fn = compile(inplace_step, &p, 0, 1);
    counts c = {0};
    bool ok = capture(fn, NULL, 0, 1) && cuda_unit(fn, "cu_gemv_inplace", &c) &&
              TU_EXPECT(c.gemv == 0) && TU_EXPECT(c.calls == 1) && TU_EXPECT(c.kernels == 1);
    tu_case(ok,
            "CUDA_GEMV_INPLACE(h=[1,256] written by its own linear's epilogue) -> %d GEMV, "
            "%d library call, %d kernel",
            c.gemv, c.calls, c.kernels);
    sg_release(p.h), sg_release(p.w), sg_release(p.b);
    sg_fn_destroy(fn);
}

/* AdamW over n parameters: m, v and p updated in place, one MULTI kernel. */
#define ADAMW_MAX 72
typedef struct adamw {
    int n;
    sg_tensor *p[ADAMW_MAX], *g[ADAMW_MAX], *m[ADAMW_MAX], *v[ADAMW_MAX];
} adamw;

static sg_status adamw_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)in;
    const adamw *a = user;
    const double lr = 1e-3, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.01;
    sg_status s = SG_OK;
    for (int i = 0; i < a->n && s == SG_OK; i++) {
        sg_tensor *m = sg_add(sg_mul_scalar(a->m[i], b1), sg_mul_scalar(a->g[i], 1 - b1));
        sg_tensor *v =
            sg_add(sg_mul_scalar(a->v[i], b2), sg_mul_scalar(sg_mul(a->g[i], a->g[i]), 1 - b2));
        sg_tensor *upd =
            sg_add(sg_div(m, sg_add_scalar(sg_sqrt(v), eps)), sg_mul_scalar(a->p[i], wd));
        sg_tensor *p = sg_sub(a->p[i], sg_mul_scalar(upd, lr));
        s = sg_copy_(a->m[i], m);
        if (s == SG_OK) s = sg_copy_(a->v[i], v);
        if (s == SG_OK) s = sg_copy_(a->p[i], p);
    }
    out[0] = a->p[0];
    return s != SG_OK ? s : sg_ctx_status(c);
}

/*
 * AdamW over `same` parameters of one shape (fusion puts their updates in
 * one loop of too many vectors, which the MULTI kernel splits into a loop
 * per parameter) and `other` of shapes of their own. Every parameter's loop
 * is one code but for its slots, its length and its blocks: one shared loop
 * runs them all (one branch, one vector loop); with SG_MULTI_SHARE=0
 * (share false) each runs its own. *c gets what the unit became.
 */
static bool test_adamw(sg_dtype dt, int same, int other, bool share, counts *c) {
    adamw a = {.n = same + other};
    for (int i = 0; i < a.n; i++) {
        int64_t shape[2] = {32 + 16 * i, 40 + i};
        if (i < same) shape[0] = 48, shape[1] = 40;
        a.p[i] = tu_rand(ctx, dt, 2, shape, -1, 1, NULL);
        a.g[i] = tu_rand(ctx, dt, 2, shape, -1, 1, NULL);
        a.m[i] = tu_rand(ctx, dt, 2, shape, -0.1, 0.1, NULL);
        a.v[i] = tu_rand(ctx, dt, 2, shape, 0, 0.1, NULL);
    }
    if (!share) setenv("SG_MULTI_SHARE", "0", 1);
    sg_fn *fn = compile(adamw_step, &a, 0, 1);
    char name[64];
    snprintf(name, sizeof name, "cu_adamw_%s_%d_%d%s", sg_dtype_name(dt), same, other,
             share ? "" : "_apart");
    int loops = share ? 1 : a.n;
    bool ok = capture(fn, NULL, 0, 1) && cuda_unit(fn, name, c) && TU_EXPECT(c->kernels == 1) &&
              TU_EXPECT(c->multi == 1) && TU_EXPECT(c->calls == 0) &&
              TU_EXPECT(c->branches == loops && c->vec_loops == loops);
    unsetenv("SG_MULTI_SHARE");
    tu_case(ok,
            "CUDA_ADAMW(type=%s,params=%d,of_one_shape=%d,share=%d) -> %d kernel (%d MULTI, "
            "%d branches, %d vector loops, %zu bytes of code)",
            sg_dtype_name(dt), a.n, same, share, c->kernels, c->multi, c->branches, c->vec_loops,
            c->code);
    sg_fn_destroy(fn);
    for (int i = 0; i < a.n; i++)
        sg_release(a.p[i]), sg_release(a.g[i]), sg_release(a.m[i]), sg_release(a.v[i]);
    return ok;
}

/* The unit's code (comments aside: they list every member's ops) for 64
 * parameters of one shape against 8: a few table entries more per
 * parameter when their loop is shared, its whole loop apart. */
static void test_adamw_growth(sg_dtype dt) {
    counts c[2][2];
    bool ok = true;
    for (int share = 0; share < 2; share++)
        for (int k = 0; k < 2; k++) ok = test_adamw(dt, k ? 64 : 8, 3, share, &c[share][k]) && ok;
    double apart = ok ? ((double)c[0][1].code - (double)c[0][0].code) / 56 : 0;
    double shared = ok ? ((double)c[1][1].code - (double)c[1][0].code) / 56 : 0;
    ok = ok && TU_EXPECT(shared < 100) && TU_EXPECT(apart > 10 * shared);
    tu_case(ok,
            "CUDA_ADAMW_GROWTH(type=%s,params=8..64 of one shape + 3) -> %.0f bytes of code "
            "per parameter shared, %.0f apart",
            sg_dtype_name(dt), shared, apart);
}

/* A row reduction with prologue and epilogue (one generated kernel), and
 * an argmax with a cast prologue (another). */
static sg_status misc_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)user;
    int dims[1] = {1};
    sg_tensor *s = sg_sum(sg_mul(in[0], in[0]), 1, dims, true);
    out[0] = sg_rsqrt(sg_add_scalar(sg_mul_scalar(s, 1.0 / 384), 1e-6));
    out[1] = sg_argmax(sg_cast(in[0], SG_F32), 1, false);
    return out[0] && out[1] ? SG_OK : sg_ctx_status(c);
}

static void test_reduce(sg_dtype dt) {
    int64_t xs[2] = {16, 384};
    sg_tensor *x = tu_rand(ctx, dt, 2, xs, -2, 2, NULL);
    sg_fn *fn = compile(misc_step, NULL, 1, 2);
    counts c = {0};
    char name[64];
    snprintf(name, sizeof name, "cu_reduce_%s", sg_dtype_name(dt));
    bool ok = capture(fn, &x, 1, 2) && cuda_unit(fn, name, &c) && TU_EXPECT(c.calls == 0) &&
              TU_EXPECT(c.rows == 2) && TU_EXPECT(c.kernels == 2);
    tu_case(ok, "CUDA_REDUCE(type=%s,x=[16,384]) -> %d kernels + %d library calls",
            sg_dtype_name(dt), c.kernels, c.calls);
    sg_fn_destroy(fn);
    sg_release(x);
}

/* The gelu_tanh backward as the grad rule writes it, times dy: one
 * pointwise kernel over (4, 1024, 3072) bf16 with a vector path. */
static sg_status gelu_bwd_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)user;
    const double k = 0.044715, cc = 0.7978845608028654;
    sg_tensor *x = in[0], *x2 = sg_mul(x, x);
    sg_tensor *t = sg_tanh(sg_mul_scalar(sg_mul(x, sg_add_scalar(sg_mul_scalar(x2, k), 1.0)), cc));
    sg_tensor *du = sg_mul_scalar(sg_add_scalar(sg_mul_scalar(x2, 3.0 * k), 1.0), cc);
    sg_tensor *left = sg_mul_scalar(sg_add_scalar(t, 1.0), 0.5);
    sg_tensor *sech2 = sg_add_scalar(sg_neg(sg_mul(t, t)), 1.0);
    out[0] = sg_mul(in[1], sg_add(left, sg_mul(sg_mul_scalar(x, 0.5), sg_mul(sech2, du))));
    return out[0] ? SG_OK : sg_ctx_status(c);
}

static void test_gelu_bwd(void) {
    int64_t xs[3] = {4, 1024, 3072};
    sg_tensor *in[2] = {tu_rand(ctx, SG_BF16, 3, xs, -3, 3, NULL),
                        tu_rand(ctx, SG_BF16, 3, xs, -1, 1, NULL)};
    sg_fn *fn = compile(gelu_bwd_step, NULL, 2, 1);
    counts c = {0};
    bool ok = capture(fn, in, 2, 1) && cuda_unit(fn, "cu_gelu_bwd_bf16", &c) &&
              TU_EXPECT(c.kernels == 1) && TU_EXPECT(c.calls == 0) && TU_EXPECT(c.vec) &&
              TU_EXPECT(c.soft_rt == 0) && TU_EXPECT(c.bf_rt2 == 19);
    /* Its 19 bf16-rounded members, two lanes each, in 19 packed conversions. */
    tu_case(ok,
            "CUDA_GELU_TANH_BWD(type=bf16,x=[4,1024,3072]) -> %d kernel, vector path %d, "
            "%d packed bf16 pairs",
            c.kernels, c.vec, c.bf_rt2);
    sg_fn_destroy(fn);
    sg_release(in[0]);
    sg_release(in[1]);
}

/* Permute copies over (B,H,T,D) heads, one pattern per capture: which walk
 * 16-byte (or narrower) vectors along D, by the vector's indices. */
typedef struct permcopy {
    int kind;
    int64_t h, t, d;
    sg_tensor *cache;
} permcopy;

static const char *const permcopy_name[] = {
    "transpose (B,H,T,D)->(B,T,H,D)", "QKV split at offset H*D", "QKV split at offset 1",
    "transpose + bias[D]",            "transpose * gate[...,1]", "copy_ into a cache slice"};

static sg_status permcopy_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    const permcopy *p = user;
    int64_t hd = p->h * p->d, heads[4] = {2, p->t, p->h, p->d};
    sg_tensor *xt = sg_transpose(in[0], 1, 2);
    sg_tensor *qk = sg_transpose(sg_reshape(sg_narrow(in[1], 2, p->kind == 2 ? 1 : hd, hd), 4, heads), 1, 2);
    sg_status s = SG_OK;
    switch (p->kind) {
    case 0: out[0] = sg_contiguous(xt); break;
    case 1:
    case 2: out[0] = sg_contiguous(qk); break;
    case 3: out[0] = sg_add(xt, in[2]); break;
    case 4: out[0] = sg_mul(xt, in[3]); break;
    default: s = sg_copy_(sg_narrow(p->cache, 2, 2, p->t), qk), out[0] = sg_neg(in[2]);
    }
    return s != SG_OK ? s : sg_ctx_status(c);
}

static void test_permcopy(sg_dtype dt, int64_t d) {
    int64_t h = 12, t = 64, xs[4] = {2, h, t, d}, qs[3] = {2, t, 3 * h * d}, gs[4] = {2, t, h, 1};
    int64_t cs[4] = {2, h, t + 8, d};
    sg_tensor *in[4] = {tu_rand(ctx, dt, 4, xs, -1, 1, NULL), tu_rand(ctx, dt, 3, qs, -1, 1, NULL),
                        tu_rand(ctx, dt, 1, &d, -1, 1, NULL), tu_rand(ctx, dt, 4, gs, -1, 1, NULL)};
    sg_tensor *cache = tu_rand(ctx, dt, 4, cs, -1, 1, NULL);
    for (int kind = 0; kind < 6; kind++) {
        permcopy p = {kind, h, t, d, cache};
        sg_fn *fn = compile(permcopy_step, &p, 4, 1);
        counts c = {0};
        char name[64];
        snprintf(name, sizeof name, "cu_permcopy_%s_%lld_%d", sg_dtype_name(dt), (long long)d, kind);
        /* Vectors: D divides into them, every access is contiguous along D,
         * and offsets and strides keep them aligned. */
        bool vec = d % 2 == 0 && kind != 2 && kind != 4;
        bool ok = capture(fn, in, 4, 1) && cuda_unit(fn, name, &c) &&
                  TU_EXPECT(c.row_vec == (vec ? 1 : 0));
        tu_case(ok, "CUDA_PERMUTE_COPY(type=%s,x=[2,%lld,%lld,%lld],%s) -> %d kernels, %d row walks "
                    "in vectors",
                sg_dtype_name(dt), (long long)h, (long long)t, (long long)d, permcopy_name[kind],
                c.kernels, c.row_vec);
        sg_fn_destroy(fn);
    }
    for (int k = 0; k < 4; k++) sg_release(in[k]);
    sg_release(cache);
}

/* ------------------------------------------------------------ random DAGs */

enum kind { K_UNARY, K_SCALAR, K_BINARY, K_WHERE, K_CAST, K_TRANSPOSE, K_SLICE, K_CMP, K_COUNT };

typedef struct instr {
    enum kind kind;
    int sub, a, b;
    double s0, s1;
} instr;

typedef struct meta {
    sg_dtype dt;
    int ndim;
    int64_t shape[3];
} meta;

#define MAXV 48
#define NPROG 24
typedef struct prog {
    int nin, n;
    meta m[MAXV];
    instr code[MAXV];
} prog;

typedef struct fuzz {
    prog p[NPROG];
    int nprog;
} fuzz;

typedef sg_tensor *(*unary_fn)(sg_tensor *);
static const unary_fn unary_ops[] = {sg_neg,     sg_abs,  sg_relu,      sg_sin,  sg_cos, sg_tanh,
                                     sg_sigmoid, sg_gelu, sg_gelu_tanh, sg_silu, sg_exp};
typedef sg_tensor *(*binary_fn)(sg_tensor *, sg_tensor *);
static const binary_fn binary_ops[] = {sg_add, sg_sub, sg_mul, sg_maximum, sg_minimum};
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
    return true;
}

static int pick(int count) {
    int lo = count > 6 ? count - 6 : 0;
    return (int)tu_randint(tu_next() % 4 == 0 ? 0 : lo, count - 1);
}

static void generate(prog *p, uint64_t seed) {
    tu_seed(seed);
    memset(p, 0, sizeof *p);
    static const sg_dtype dts[5] = {SG_F32, SG_F16, SG_BF16, SG_I32, SG_I64};
    p->nin = (int)tu_randint(1, 3);
    int64_t A = tu_randint(1, 9), B = tu_randint(1, 40) * (tu_next() % 2 ? 8 : 1);
    sg_dtype base = dts[tu_randint(0, 4)];
    for (int i = 0; i < p->nin; i++) {
        meta *m = &p->m[i];
        m->dt = base;
        int form = (int)tu_randint(0, 3);
        m->ndim = form == 3 ? 1 : 2;
        m->shape[0] = form == 1 ? 1 : A;
        m->shape[1] = form == 2 ? 1 : B;
        if (form == 3) m->shape[0] = B;
    }
    int len = (int)tu_randint(4, 30), count = p->nin;
    while (p->n < len && count < MAXV) {
        instr in = {.kind = (enum kind)tu_randint(0, K_COUNT - 1), .a = pick(count)};
        const meta *ma = &p->m[in.a];
        meta out = *ma;
        bool fl = is_float(ma->dt);
        switch (in.kind) {
        case K_UNARY: in.sub = (int)tu_randint(0, fl ? COUNT(unary_ops) - 1 : 2); break;
        case K_SCALAR:
            in.sub = (int)tu_randint(0, 2);
            in.s0 = fl ? tu_uniform(-1.5, 1.5) : (double)tu_randint(-3, 3);
            in.s1 = in.s0 + (fl ? tu_uniform(0, 2) : (double)tu_randint(0, 4));
            if (tu_next() % 8 == 0) in.s1 = INFINITY; /* clamp to inf: a scalar of its own */
            break;
        case K_BINARY:
        case K_WHERE:
        case K_CMP:
            in.sub = (int)tu_randint(0, COUNT(binary_ops) - 1);
            in.b = pick(count);
            if (p->m[in.b].dt != ma->dt || !broadcast(ma, &p->m[in.b], &out)) continue;
            if (in.kind == K_CMP) out.dt = SG_BOOL;
            break;
        case K_CAST:
            if (ma->dt == SG_BOOL) {
                out.dt = dts[tu_randint(0, 4)];
            } else {
                out.dt = dts[tu_randint(0, 4)];
            }
            break;
        case K_TRANSPOSE:
            if (ma->ndim < 2) continue;
            out.shape[0] = ma->shape[1], out.shape[1] = ma->shape[0];
            break;
        case K_SLICE: out.shape[out.ndim - 1] = (ma->shape[ma->ndim - 1] + 1) / 2; break;
        default: continue;
        }
        if (ma->dt == SG_BOOL && in.kind != K_CAST) continue;
        p->code[p->n++] = in;
        p->m[count++] = out;
    }
}

static sg_tensor *run_prog(const prog *p, sg_tensor *const *in) {
    sg_tensor *v[MAXV] = {NULL};
    for (int i = 0; i < p->nin; i++) v[i] = in[i];
    for (int k = 0; k < p->n; k++) {
        const instr *c = &p->code[k];
        sg_tensor *a = v[c->a], *b = v[c->b], *r = NULL;
        switch (c->kind) {
        case K_UNARY: r = unary_ops[c->sub](a); break;
        case K_SCALAR:
            r = c->sub == 0   ? sg_add_scalar(a, c->s0)
                : c->sub == 1 ? sg_mul_scalar(a, c->s0)
                              : sg_clamp(a, c->s0, c->s1);
            break;
        case K_BINARY: r = binary_ops[c->sub](a, b); break;
        case K_WHERE: r = sg_where(sg_gt(a, b), a, binary_ops[c->sub](a, b)); break;
        case K_CMP: r = c->sub % 2 ? sg_le(a, b) : sg_ne(a, b); break;
        case K_CAST: r = sg_cast(a, p->m[p->nin + k].dt); break;
        case K_TRANSPOSE: r = sg_transpose(a, 0, 1); break;
        case K_SLICE: r = sg_slice(a, -1, 0, INT64_MAX, 2); break;
        default: break;
        }
        if (!r) return NULL;
        v[p->nin + k] = r;
    }
    return v[p->nin + p->n - 1];
}

/* Every program of the batch in one step: one capture, one unit. */
static sg_status fuzz_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    const fuzz *z = user;
    int at = 0;
    for (int i = 0; i < z->nprog; i++) {
        out[i] = run_prog(&z->p[i], in + at);
        at += z->p[i].nin;
        if (!out[i]) return sg_ctx_status(c) ? sg_ctx_status(c) : SG_ERR_INTERNAL;
    }
    return SG_OK;
}

static void test_fuzz(uint64_t first) {
    static fuzz z;
    z.nprog = NPROG;
    sg_tensor *in[NPROG * 3];
    int nin = 0;
    for (int i = 0; i < NPROG; i++) {
        generate(&z.p[i], first + (uint64_t)i);
        for (int k = 0; k < z.p[i].nin; k++) {
            const meta *m = &z.p[i].m[k];
            in[nin++] = tu_rand(ctx, m->dt, m->ndim, m->shape, -2, 2, NULL);
        }
    }
    sg_fn *fn = NULL;
    sg_compile(ctx, fuzz_step, &z, nin, NPROG, &(sg_compile_opts){.mode = SG_MODE_REDUCE_OVERHEAD},
               &fn);
    sg_tensor *out[NPROG];
    sg_mark_step_begin(ctx);
    bool ok = TU_EXPECT(sg_call(fn, in, nin, out, NPROG) == SG_OK);
    if (!ok) fprintf(stderr, "  %s\n", sg_last_error(ctx));
    counts c = {0};
    char name[64];
    snprintf(name, sizeof name, "cu_fuzz_%llu", (unsigned long long)first);
    ok = ok && cuda_unit(fn, name, &c) && TU_EXPECT(c.kernels >= 1);
    tu_case(ok, "CUDA_FUZZ(seeds %llu..%llu, one unit) -> %d groups, %d kernels, %d library calls",
            (unsigned long long)first, (unsigned long long)first + NPROG - 1, c.groups, c.kernels,
            c.calls);
    sg_fn_destroy(fn);
    for (int i = 0; i < nin; i++) sg_release(in[i]);
}

int main(int argc, char **argv) {
    /* Capture only: the CPU's C compiler has nothing to do here. */
    setenv("SG_CODEGEN", "0", 1);
    char dir[] = "/tmp/sg_cgen_cuda_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    setenv("SG_CACHE_DIR", dir, 1); /* every unit is compiled, none served from an old cache */
    /* Captures run on the CPU whatever SG_TEST_BACKEND says: only the IR matters. */
    if (sg_ctx_create(&(sg_ctx_opts){.backend = SG_BACKEND_CPU}, &ctx) != SG_OK) return 1;
    if (argc > 1 && strcmp(argv[1], "gelu") == 0) {
        test_gelu_bwd();
    } else if (argc > 1 && strcmp(argv[1], "permcopy") == 0) {
        test_permcopy(SG_BF16, 64);
        test_permcopy(SG_BF16, 7);
    } else if (argc > 1) { /* re-run one fuzz batch */
        test_fuzz(strtoull(argv[1], NULL, 10));
    } else {
        test_chain(SG_F32, 4096, 0);
        test_chain(SG_BF16, 1 << 20, 0);
        test_chain(SG_F16, 1001, 0);
        test_chain(SG_F32, 4096, 1);
        test_rows(SG_F32);
        test_rows(SG_BF16);
        test_layers(SG_F32);
        test_datamove(SG_F32, SG_I64, 1);
        test_datamove(SG_BF16, SG_I32, 5);
        test_layers(SG_BF16);
        test_mlp(SG_BF16, 1, 8, false, false);
        test_mlp(SG_F32, 4, 2, false, false);
        test_mlp(SG_F16, 1, 1, true, false);
        test_mlp(SG_BF16, 1, 1, true, true);
        test_mlp(SG_BF16, 64, 2, false, false);
        test_gemv_odd(SG_F32);
        test_gemv_odd(SG_BF16);
        test_gemv_inplace();
        counts c;
        test_adamw(SG_F32, 0, 10, true, &c);
        test_adamw(SG_BF16, 0, 10, true, &c);
        test_adamw(SG_F32, 10, 2, true, &c);
        test_adamw(SG_BF16, 10, 2, true, &c);
        test_adamw(SG_F32, 10, 2, false, &c);
        test_adamw_growth(SG_BF16);
        test_reduce(SG_F32);
        test_gelu_bwd();
        test_permcopy(SG_BF16, 64);
        test_permcopy(SG_F32, 64);
        test_permcopy(SG_BF16, 6);
        test_permcopy(SG_BF16, 7);
        for (uint64_t s = 1; s <= 4; s++) test_fuzz(1 + (s - 1) * NPROG);
    }
    sg_ctx_destroy(ctx);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "  could not remove %s\n", dir);
    if (nvrtc_missing) {
        fprintf(stderr, "NVRTC is not available: the units were generated but not compiled\n");
        tu_finish();
        return 77;
    }
    fprintf(stderr, "%d units compiled by NVRTC for sm_90\n", units_compiled);
    return tu_finish();
}
