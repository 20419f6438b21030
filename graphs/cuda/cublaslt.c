/* SPDX-License-Identifier: MIT */
/*
 * cublaslt.c -- cuBLASLt, loaded at run time (dlopen; no link-time
 * dependency), one handle and one workspace per context, and a cache of
 * every distinct matmul the context has run: its descriptors, layouts and
 * the heuristic's algorithm. A call found in the cache costs one attribute
 * write (the bias pointer) and cublasLtMatmul, so eager steps and graph
 * recordings never query the heuristic twice for one shape.
 *
 * The workspace (32 MiB) is allocated at the first matmul, never while a
 * CUDA graph is being recorded: a graph would hold an allocation made inside
 * its own capture. cu_destroy calls sg__cublaslt_release after the stream is
 * idle.
 */
#include "cublaslt.h"

#include <stdio.h>

#ifdef SG_HAVE_CUDA_HEADERS

#include <cublasLt.h>
#include <dlfcn.h>
#include <stdlib.h>

#define WORKSPACE_BYTES ((size_t)32 << 20)

/* The entry points used, in one place: return type, name, parameters. */
#define SG__LT_API(X)                                                                             \
    X(cublasStatus_t, cublasLtCreate, (cublasLtHandle_t *))                                       \
    X(cublasStatus_t, cublasLtDestroy, (cublasLtHandle_t))                                        \
    X(const char *, cublasLtGetStatusName, (cublasStatus_t))                                      \
    X(cublasStatus_t, cublasLtMatmulDescCreate,                                                   \
      (cublasLtMatmulDesc_t *, cublasComputeType_t, cudaDataType_t))                              \
    X(cublasStatus_t, cublasLtMatmulDescDestroy, (cublasLtMatmulDesc_t))                          \
    X(cublasStatus_t, cublasLtMatmulDescSetAttribute,                                             \
      (cublasLtMatmulDesc_t, cublasLtMatmulDescAttributes_t, const void *, size_t))               \
    X(cublasStatus_t, cublasLtMatrixLayoutCreate,                                                 \
      (cublasLtMatrixLayout_t *, cudaDataType, uint64_t, uint64_t, int64_t))                      \
    X(cublasStatus_t, cublasLtMatrixLayoutDestroy, (cublasLtMatrixLayout_t))                      \
    X(cublasStatus_t, cublasLtMatrixLayoutSetAttribute,                                           \
      (cublasLtMatrixLayout_t, cublasLtMatrixLayoutAttribute_t, const void *, size_t))            \
    X(cublasStatus_t, cublasLtMatmulPreferenceCreate, (cublasLtMatmulPreference_t *))             \
    X(cublasStatus_t, cublasLtMatmulPreferenceDestroy, (cublasLtMatmulPreference_t))              \
    X(cublasStatus_t, cublasLtMatmulPreferenceSetAttribute,                                       \
      (cublasLtMatmulPreference_t, cublasLtMatmulPreferenceAttributes_t, const void *, size_t))   \
    X(cublasStatus_t, cublasLtMatmulAlgoGetHeuristic,                                             \
      (cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,    \
       cublasLtMatrixLayout_t, cublasLtMatrixLayout_t, cublasLtMatmulPreference_t, int,           \
       cublasLtMatmulHeuristicResult_t *, int *))                                                 \
    X(cublasStatus_t, cublasLtMatmul,                                                             \
      (cublasLtHandle_t, cublasLtMatmulDesc_t, const void *, const void *,                        \
       cublasLtMatrixLayout_t, const void *, cublasLtMatrixLayout_t, const void *, const void *,  \
       cublasLtMatrixLayout_t, void *, cublasLtMatrixLayout_t, const cublasLtMatmulAlgo_t *,      \
       void *, size_t, cudaStream_t))

typedef struct lt_api {
#define X(ret, name, params) ret(*name) params;
    SG__LT_API(X)
#undef X
} lt_api;

/* What identifies a matmul to cuBLASLt, as plain integers (no padding to
 * compare): the call, the pointers' alignments, TF32. */
#define KEY_WORDS 20
typedef struct lt_entry {
    int64_t key[KEY_WORDS];
    uint64_t hash;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
    bool has_algo; /* false: the heuristic found none (remembered too) */
} lt_entry;

typedef struct lt_state {
    void *lib;
    lt_api api;
    cublasLtHandle_t handle;
    void *workspace;
    lt_entry *entries;
    int nentries, cap;
    bool tf32;
} lt_state;

static const char *const lib_names[] = {"libcublasLt.so.13", "libcublasLt.so",
                                        "/usr/local/cuda/lib64/libcublasLt.so.13"};

static cudaDataType_t data_type(sg_dtype dt) {
    return dt == SG_F16 ? CUDA_R_16F : dt == SG_BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

static sg_status lt_fail(sg_ctx *ctx, const lt_state *s, cublasStatus_t r, const char *call,
                         const sg__lt_call *c) {
    const char *name = s->api.cublasLtGetStatusName ? s->api.cublasLtGetStatusName(r) : NULL;
    return sg__fail(ctx, SG_ERR_DRIVER, "cuda: %s failed with %s (%d) for a %s matmul m=%lld n=%lld "
                    "k=%lld batch=%lld; check the device with nvidia-smi, or run with "
                    "SG_CUDA_MATMUL=gemv to bypass cuBLASLt", call, name ? name : "an unknown status",
                    (int)r, sg_dtype_name(c->dtype), (long long)c->m, (long long)c->n,
                    (long long)c->k, (long long)c->batch);
}

/* The largest power of two (up to 256) that divides a device address. */
static int64_t align_of(const void *p) {
    uintptr_t u = (uintptr_t)p;
    int64_t a = 1;
    while (a < 256 && !(u & (uintptr_t)a)) a <<= 1;
    return a;
}

static void free_entry(const lt_api *api, lt_entry *e) {
    if (e->la) api->cublasLtMatrixLayoutDestroy(e->la);
    if (e->lb) api->cublasLtMatrixLayoutDestroy(e->lb);
    if (e->lc) api->cublasLtMatrixLayoutDestroy(e->lc);
    if (e->desc) api->cublasLtMatmulDescDestroy(e->desc);
}

void sg__cublaslt_release(sg_ctx *ctx) {
    void **slot = sg__cuda_lt_state(ctx);
    lt_state *s = *slot;
    if (!s) return;
    for (int i = 0; i < s->nentries; i++) free_entry(&s->api, &s->entries[i]);
    sg__free(ctx, s->entries, sizeof *s->entries * (size_t)s->cap);
    if (s->handle) s->api.cublasLtDestroy(s->handle);
    if (s->workspace) ctx->exec.free(ctx, s->workspace, WORKSPACE_BYTES);
    if (s->lib) dlclose(s->lib);
    sg__free(ctx, s, sizeof *s);
    *slot = NULL;
}

/* Load the library, make the handle and the workspace (first use only). */
static sg_status lt_state_get(sg_ctx *ctx, lt_state **out) {
    void **slot = sg__cuda_lt_state(ctx);
    if (*slot) {
        *out = *slot;
        return SG_OK;
    }
    if (sg__cuda_capturing(ctx))
        return sg__fail(ctx, SG_ERR_UNSUPPORTED, "cuda: the first matmul of a context ran while a "
                        "CUDA graph was recorded; cuBLASLt's handle and workspace cannot be made "
                        "inside a recording: run the step once without a graph first");
    lt_state *s = sg__calloc(ctx, sizeof *s);
    if (!s) return sg__fail(ctx, SG_ERR_OOM, "cuda: out of host memory for the cuBLASLt state");
    *slot = s;
    char tried[512] = "";
    for (size_t i = 0; i < sizeof lib_names / sizeof lib_names[0] && !s->lib; i++) {
        s->lib = dlopen(lib_names[i], RTLD_NOW | RTLD_LOCAL);
        if (!s->lib) {
            const char *e = dlerror();
            size_t len = strlen(tried);
            snprintf(tried + len, sizeof tried - len, "%s%s (%s)", len ? ", " : "", lib_names[i],
                     e ? e : "not found");
        }
    }
    sg_status st = SG_OK;
    if (!s->lib) {
        st = sg__fail(ctx, SG_ERR_BACKEND_UNAVAILABLE, "cuda: matmul needs cuBLASLt, and "
                      "libcublasLt could not be loaded: tried %.400s; install the CUDA 13 cuBLAS "
                      "library (libcublas-13-0) or put its directory on LD_LIBRARY_PATH", tried);
        goto fail;
    }
#define X(ret, name, params)                                                                      \
    if (st == SG_OK) {                                                                            \
        void *f = dlsym(s->lib, #name);                                                           \
        if (f)                                                                                    \
            memcpy(&s->api.name, &f, sizeof f);                                                   \
        else                                                                                      \
            st = sg__fail(ctx, SG_ERR_BACKEND_UNAVAILABLE, "cuda: libcublasLt lacks %s; install " \
                          "the cuBLAS of CUDA 12 or newer", #name);                               \
    }
    SG__LT_API(X)
#undef X
    if (st != SG_OK) goto fail;
    cublasStatus_t r = s->api.cublasLtCreate(&s->handle);
    if (r != CUBLAS_STATUS_SUCCESS) {
        s->handle = NULL;
        const char *name = s->api.cublasLtGetStatusName(r);
        st = sg__fail(ctx, SG_ERR_DRIVER, "cuda: cublasLtCreate failed with %s (%d); check the "
                      "device with nvidia-smi", name ? name : "an unknown status", (int)r);
        goto fail;
    }
    st = ctx->exec.alloc(ctx, WORKSPACE_BYTES, &s->workspace);
    if (st != SG_OK) {
        s->workspace = NULL;
        st = sg__fail(ctx, st, "cuda: cannot allocate cuBLASLt's %zu MiB workspace on the device; "
                      "free device memory first", WORKSPACE_BYTES >> 20);
        goto fail;
    }
    const char *tf = getenv("SG_ALLOW_TF32");
    s->tf32 = tf && strcmp(tf, "1") == 0;
    *out = s;
    return SG_OK;
fail:
    sg__cublaslt_release(ctx);
    return st;
}

static void make_key(const sg__lt_call *c, const void *a, const void *b, const void *d,
                     const void *bias, bool tf32, int64_t *k) {
    int64_t v[KEY_WORDS] = {c->dtype, c->transa, c->transb, c->m, c->n, c->k, c->lda, c->ldb,
                            c->ldc, c->batch, c->sa, c->sb, c->sc, c->bias, c->accumulate,
                            align_of(a), align_of(b), align_of(d), bias ? align_of(bias) : 0, tf32};
    memcpy(k, v, sizeof v);
}

static uint64_t hash_key(const int64_t *k) {
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < KEY_WORDS; i++) h = (h ^ (uint64_t)k[i]) * 1099511628211ull;
    return h;
}

static cublasStatus_t layout(const lt_api *api, cublasLtMatrixLayout_t *l, cudaDataType_t t,
                             int64_t rows, int64_t cols, int64_t ld, int64_t batch, int64_t stride) {
    cublasStatus_t r = api->cublasLtMatrixLayoutCreate(l, t, (uint64_t)rows, (uint64_t)cols, ld);
    if (r != CUBLAS_STATUS_SUCCESS || batch <= 1) return r;
    int32_t n = (int32_t)batch;
    r = api->cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &n, sizeof n);
    if (r == CUBLAS_STATUS_SUCCESS)
        r = api->cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                  &stride, sizeof stride);
    return r;
}

/* Descriptors, layouts and the heuristic's first algorithm for e's call. */
static sg_status build_entry(sg_ctx *ctx, lt_state *s, lt_entry *e, const sg__lt_call *c,
                             const void *bias) {
    const lt_api *api = &s->api;
    cudaDataType_t t = data_type(c->dtype);
    cublasComputeType_t ct = c->dtype == SG_F32 && s->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                           : CUBLAS_COMPUTE_32F;
    const char *call = "cublasLtMatmulDescCreate";
    cublasStatus_t r = api->cublasLtMatmulDescCreate(&e->desc, ct, CUDA_R_32F);
    cublasOperation_t ta = c->transa ? CUBLAS_OP_T : CUBLAS_OP_N, tb = c->transb ? CUBLAS_OP_T : CUBLAS_OP_N;
    if (r == CUBLAS_STATUS_SUCCESS) {
        call = "cublasLtMatmulDescSetAttribute";
        r = api->cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    }
    if (r == CUBLAS_STATUS_SUCCESS)
        r = api->cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    if (r == CUBLAS_STATUS_SUCCESS && c->bias) {
        cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_BIAS;
        r = api->cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep);
        if (r == CUBLAS_STATUS_SUCCESS) /* the heuristic reads its alignment */
            r = api->cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                    &bias, sizeof bias);
    }
    if (r == CUBLAS_STATUS_SUCCESS) {
        call = "cublasLtMatrixLayoutCreate";
        r = layout(api, &e->la, t, c->transa ? c->k : c->m, c->transa ? c->m : c->k, c->lda,
                   c->batch, c->sa);
    }
    if (r == CUBLAS_STATUS_SUCCESS)
        r = layout(api, &e->lb, t, c->transb ? c->n : c->k, c->transb ? c->k : c->n, c->ldb,
                   c->batch, c->sb);
    if (r == CUBLAS_STATUS_SUCCESS) r = layout(api, &e->lc, t, c->m, c->n, c->ldc, c->batch, c->sc);
    if (r != CUBLAS_STATUS_SUCCESS) return lt_fail(ctx, s, r, call, c);

    cublasLtMatmulPreference_t pref = NULL;
    call = "cublasLtMatmulPreferenceCreate";
    r = api->cublasLtMatmulPreferenceCreate(&pref);
    if (r == CUBLAS_STATUS_SUCCESS) {
        uint64_t ws = WORKSPACE_BYTES;
        call = "cublasLtMatmulPreferenceSetAttribute";
        r = api->cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                      &ws, sizeof ws);
        /* The default assumes 256-byte aligned pointers; views may be less. */
        static const cublasLtMatmulPreferenceAttributes_t which[4] = {
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
        for (int i = 0; i < 4 && r == CUBLAS_STATUS_SUCCESS; i++) {
            uint32_t al = (uint32_t)e->key[15 + (i < 2 ? i : 2)];
            r = api->cublasLtMatmulPreferenceSetAttribute(pref, which[i], &al, sizeof al);
        }
    }
    cublasLtMatmulHeuristicResult_t res;
    memset(&res, 0, sizeof res);
    int found = 0;
    if (r == CUBLAS_STATUS_SUCCESS) {
        call = "cublasLtMatmulAlgoGetHeuristic";
        r = api->cublasLtMatmulAlgoGetHeuristic(s->handle, e->desc, e->la, e->lb, e->lc, e->lc,
                                                pref, 1, &res, &found);
        /* No algorithm is an answer, not a failure: the caller falls back. */
        if (r == CUBLAS_STATUS_NOT_SUPPORTED) r = CUBLAS_STATUS_SUCCESS, found = 0;
    }
    if (pref) api->cublasLtMatmulPreferenceDestroy(pref);
    if (r != CUBLAS_STATUS_SUCCESS) return lt_fail(ctx, s, r, call, c);
    e->has_algo = found > 0 && res.state == CUBLAS_STATUS_SUCCESS;
    if (e->has_algo)
        e->algo = res.algo;
    else /* once per distinct call: the entry remembers the answer */
        sg__log(ctx, "fallbacks", "cuda: cuBLASLt has no algorithm for a %s matmul m=%lld n=%lld "
                "k=%lld lda=%lld ldb=%lld ldc=%lld batch=%lld%s; %s", sg_dtype_name(c->dtype),
                (long long)c->m, (long long)c->n, (long long)c->k, (long long)c->lda,
                (long long)c->ldb, (long long)c->ldc, (long long)c->batch,
                c->bias ? " with the bias epilogue" : "",
                c->bias ? "the bias is written first and the product added to it"
                        : "the GEMV kernel runs it");
    return SG_OK;
}

/* The cached entry for key k, made now if new. */
static sg_status find_entry(sg_ctx *ctx, lt_state *s, const int64_t *k, const sg__lt_call *c,
                            const void *bias, lt_entry **out) {
    uint64_t h = hash_key(k);
    for (int i = 0; i < s->nentries; i++)
        if (s->entries[i].hash == h && memcmp(s->entries[i].key, k, sizeof s->entries[i].key) == 0) {
            *out = &s->entries[i];
            return SG_OK;
        }
    if (s->nentries == s->cap) {
        int ncap = s->cap ? s->cap * 2 : 16;
        lt_entry *ne = sg__alloc(ctx, sizeof *ne * (size_t)ncap);
        if (!ne) return sg__fail(ctx, SG_ERR_OOM, "cuda: out of host memory for a cuBLASLt plan");
        if (s->entries) {
            memcpy(ne, s->entries, sizeof *ne * (size_t)s->nentries);
            sg__free(ctx, s->entries, sizeof *ne * (size_t)s->cap);
        }
        s->entries = ne;
        s->cap = ncap;
    }
    lt_entry *e = &s->entries[s->nentries];
    memset(e, 0, sizeof *e);
    memcpy(e->key, k, sizeof e->key);
    e->hash = h;
    sg_status st = build_entry(ctx, s, e, c, bias);
    if (st != SG_OK) {
        free_entry(&s->api, e);
        return st;
    }
    s->nentries++;
    *out = e;
    return SG_OK;
}

sg_status sg__lt_matmul(sg_ctx *ctx, const sg__lt_call *c, const void *a, const void *b, void *d,
                        const void *bias, bool *ran) {
    *ran = false;
    lt_state *s = NULL;
    sg_status st = lt_state_get(ctx, &s);
    if (st != SG_OK) return st;
    int64_t k[KEY_WORDS];
    make_key(c, a, b, d, c->bias ? bias : NULL, s->tf32, k);
    lt_entry *e = NULL;
    st = find_entry(ctx, s, k, c, bias, &e);
    if (st != SG_OK || !e->has_algo) return st;
    cublasStatus_t r = CUBLAS_STATUS_SUCCESS;
    if (c->bias) /* the pointer of this call (the cached one was another's) */
        r = s->api.cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                  sizeof bias);
    if (r != CUBLAS_STATUS_SUCCESS) return lt_fail(ctx, s, r, "cublasLtMatmulDescSetAttribute", c);
    float alpha = 1.0f, beta = c->accumulate ? 1.0f : 0.0f;
    r = s->api.cublasLtMatmul(s->handle, e->desc, &alpha, a, e->la, b, e->lb, &beta, d, e->lc, d,
                              e->lc, &e->algo, s->workspace, WORKSPACE_BYTES,
                              (cudaStream_t)sg__cuda_stream(ctx));
    if (r != CUBLAS_STATUS_SUCCESS) return lt_fail(ctx, s, r, "cublasLtMatmul", c);
    *ran = true;
    return SG_OK;
}

#endif /* SG_HAVE_CUDA_HEADERS */
