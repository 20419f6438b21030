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
 * its own capture. A recording's branches (exec.h: lanes) each get one of
 * their own before the recording, so products on two branches may run at
 * once. cu_destroy calls sg__cublaslt_release after the stream is idle.
 *
 * It also owns max-autotune's algorithm picks (see cublaslt.h): the timing
 * of the heuristic's candidates during a step's tuning run, the table of
 * picks a context knows (timed, or read from a tune file), and their text.
 */
#include "cublaslt.h"

#include "../graphs.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

/* ------------------------------------------------------------ picks as text (no device) */

int sg__lt_pick_format(const sg__lt_pick *p, char *buf, size_t size) {
    size_t n = 0;
    for (int i = 0; i <= SG__LT_KEY_WORDS + 1; i++) {
        int w = i == 0 ? snprintf(buf, size, "lt")
                : i <= SG__LT_KEY_WORDS
                    ? snprintf(buf + n, size - n, " %lld", (long long)p->key[i - 1])
                    : snprintf(buf + n, size - n, " %d\n", p->pick);
        if (w < 0 || (size_t)w >= size - n) return -1;
        n += (size_t)w;
    }
    return (int)n;
}

static bool pow2_upto256(int64_t v) { return v >= 1 && v <= 256 && (v & (v - 1)) == 0; }

/* The words of a key as make_key writes them (see there). */
static bool key_ok(const int64_t *k) {
    bool ok = k[0] >= 0 && k[0] < 64;
    for (int i = 1; i < 3; i++) ok = ok && (k[i] == 0 || k[i] == 1);
    for (int i = 3; i < 10; i++) ok = ok && k[i] >= 1;  /* m n k lda ldb ldc batch */
    for (int i = 10; i < 13; i++) ok = ok && k[i] >= 0; /* batch strides */
    ok = ok && k[13] >= 0 && k[13] < 16 && k[14] >= 0 && k[14] <= 2; /* epilogue, beta */
    for (int i = 15; i < 18; i++) ok = ok && pow2_upto256(k[i]);
    ok = ok && (k[18] == 0 || pow2_upto256(k[18])) && (k[19] == 0 || k[19] == 1);
    return ok;
}

bool sg__lt_pick_parse(const char *s, sg__lt_pick *p, int *used) {
    const char *q = s;
    while (*q == ' ' || *q == '\n') q++;
    if (strncmp(q, "lt ", 3) != 0) return false;
    q += 2;
    for (int i = 0; i <= SG__LT_KEY_WORDS; i++) {
        if (*q != ' ' || !((q[1] >= '0' && q[1] <= '9') || q[1] == '-')) return false;
        char *end;
        errno = 0;
        long long v = strtoll(q + 1, &end, 10);
        if (end == q + 1 || errno) return false;
        if (i < SG__LT_KEY_WORDS)
            p->key[i] = v;
        else if (v < SG__LT_GEMV || v >= SG__LT_NALGO)
            return false;
        else
            p->pick = (int)v;
        q = end;
    }
    if ((*q != '\n' && *q != '\0') || !key_ok(p->key)) return false;
    *used = (int)(q - s);
    return true;
}

/* ------------------------------------------------------------ split-K (no device) */

int sg__lt_splits(int own, int64_t k, int *out, int max) {
    int n = 0;
    for (int p = 1; n < max && p <= 256 && (p == 1 || k / p >= SG__LT_SPLIT_MIN_K); p *= 2)
        if (p != own) out[n++] = p;
    return n;
}

int sg__lt_default_pick(const sg__lt_cand *c, int n, int64_t k) {
    if (n <= 0 || c[0].splitk <= 1 || k / 2 >= SG__LT_SPLIT_MIN_K) return 0;
    for (int i = 1; i < n; i++)
        if (c[i].base == 0 && c[i].splitk == 1) return i;
    return 0;
}

#ifdef SG_HAVE_CUDA_HEADERS

#include "cuda.h"

#include <cublasLt.h>
#include <dlfcn.h>

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
    X(cublasStatus_t, cublasLtMatmulAlgoCheck,                                                    \
      (cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,    \
       cublasLtMatrixLayout_t, cublasLtMatrixLayout_t, const cublasLtMatmulAlgo_t *,              \
       cublasLtMatmulHeuristicResult_t *))                                                        \
    X(cublasStatus_t, cublasLtMatmulAlgoConfigGetAttribute,                                       \
      (const cublasLtMatmulAlgo_t *, cublasLtMatmulAlgoConfigAttributes_t, void *, size_t,        \
       size_t *))                                                                                 \
    X(cublasStatus_t, cublasLtMatmulAlgoConfigSetAttribute,                                       \
      (cublasLtMatmulAlgo_t *, cublasLtMatmulAlgoConfigAttributes_t, const void *, size_t))       \
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
#define KEY_WORDS SG__LT_KEY_WORDS
typedef struct lt_entry {
    int64_t key[KEY_WORDS];
    uint64_t hash;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;   /* sg__lt_default_pick's candidate */
    cublasLtMatmulAlgo_t picked; /* max-autotune's, once tuned */
    int def;       /* algo's index in the call's candidate list */
    bool has_algo; /* false: the heuristic found none (remembered too) */
    bool tuned;    /* picked is set (timed or remembered) */
} lt_entry;

/* A pick the context knows; mark: the tuning run that made or used it. */
typedef struct lt_known {
    sg__lt_pick p;
    unsigned mark;
} lt_known;

typedef struct lt_state {
    void *lib;
    lt_api api;
    cublasLtHandle_t handle;
    bool ready;   /* the workspace is made: usable */
    bool pending; /* sg__cublaslt_prewarm's thread (th) is loading it */
    pthread_t th;
    void *cuctx; /* the context the thread makes current */
    const sg__cu_api *cu;
    int load_err;      /* lt_load's answer */
    cublasStatus_t cr; /* cublasLtCreate's status, for LOAD_CREATE */
    char why[512];     /* what lt_load tried, or the missing symbol */
    char name[256];    /* the library it opened */
    double load_ms;
    double heur_ms; /* the loading thread's first heuristic query (warm_heuristic), or 0 */
    void *workspace;
    void *lane_ws[SG__CUDA_LANES]; /* lanes 1..: a recording's branches (sg__cublaslt_lane_ready) */
    lt_entry *entries;
    int nentries, cap;
    bool tf32;
    lt_known *known;
    int nknown, kcap;
    bool tuning;    /* between sg__lt_tune_begin and sg__lt_tune_end */
    bool scope;     /* a max-autotune step runs: picks apply */
    unsigned epoch; /* the tuning run's number */
    sg_status lost; /* the first pick of this tuning run not made or kept, and why */
    char lost_why[SG__MSG_SIZE];
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

size_t sg__cublaslt_host_bytes(const sg_ctx *ctx) {
    const lt_state *s = *sg__cuda_lt_state((sg_ctx *)ctx);
    if (!s) return 0;
    return sizeof *s + sizeof *s->entries * (size_t)s->cap + sizeof *s->known * (size_t)s->kcap;
}

void sg__cublaslt_release(sg_ctx *ctx) {
    void **slot = sg__cuda_lt_state(ctx);
    lt_state *s = *slot;
    if (!s) return;
    if (s->pending) pthread_join(s->th, NULL);
    for (int i = 0; i < s->nentries; i++) free_entry(&s->api, &s->entries[i]);
    sg__free(ctx, s->entries, sizeof *s->entries * (size_t)s->cap);
    sg__free(ctx, s->known, sizeof *s->known * (size_t)s->kcap);
    if (s->handle) s->api.cublasLtDestroy(s->handle);
    if (s->workspace) ctx->exec.free(ctx, s->workspace, WORKSPACE_BYTES);
    for (int l = 1; l < SG__CUDA_LANES; l++)
        if (s->lane_ws[l]) ctx->exec.free(ctx, s->lane_ws[l], WORKSPACE_BYTES);
    if (s->lib) dlclose(s->lib);
    sg__free(ctx, s, sizeof *s);
    *slot = NULL;
}

/* HIP has no cuBLASLt (cuda_matmul.c runs every product through the GEMV
 * kernel there); a call that reaches here on HIP says what would be needed. */
static sg_status hip_no_blas(sg_ctx *ctx) {
    return sg__fail(ctx, SG_ERR_BACKEND_UNAVAILABLE,
                    "hip: cuBLASLt does not exist on HIP and this stepgraph does not call "
                    "hipBLASLt (libhipblaslt.so) or rocBLAS; set SG_CUDA_MATMUL=gemv, or use "
                    "SG_BACKEND_CPU");
}

/* What lt_load says. */
enum { LOAD_OK, LOAD_NO_LIBRARY, LOAD_NO_SYMBOL, LOAD_CREATE, LOAD_THREAD };

/* Open the library, find its entry points and make the handle, touching
 * nothing of the context (sg__cublaslt_prewarm runs it on a thread);
 * s->why and s->cr say what failed. */
static int lt_load(lt_state *s) {
    double t0 = sg__graph_clock();
    /* SG_CUBLASLT names the library (tests point it at one that is not there). */
    const char *over = getenv("SG_CUBLASLT");
    const char *const *names = lib_names, *one[1] = {over};
    size_t nnames = sizeof lib_names / sizeof lib_names[0];
    if (over && over[0]) names = one, nnames = 1;
    for (size_t i = 0; i < nnames && !s->lib; i++) {
        s->lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        snprintf(s->name, sizeof s->name, "%s", names[i]);
        if (!s->lib) {
            const char *e = dlerror();
            size_t len = strlen(s->why);
            snprintf(s->why + len, sizeof s->why - len, "%s%s (%s)", len ? ", " : "", names[i],
                     e ? e : "not found");
        }
    }
    if (!s->lib) return LOAD_NO_LIBRARY;
#define X(ret, name, params)                                                                       \
    {                                                                                              \
        void *f = dlsym(s->lib, #name);                                                            \
        if (!f) {                                                                                  \
            snprintf(s->why, sizeof s->why, "%s", #name);                                          \
            return LOAD_NO_SYMBOL;                                                                 \
        }                                                                                          \
        memcpy(&s->api.name, &f, sizeof f);                                                        \
    }
    SG__LT_API(X)
#undef X
    s->cr = s->api.cublasLtCreate(&s->handle);
    if (s->cr != CUBLAS_STATUS_SUCCESS) {
        s->handle = NULL;
        return LOAD_CREATE;
    }
    s->load_ms = (sg__graph_clock() - t0) * 1e3;
    return LOAD_OK;
}

/* The heuristic's first query in a process costs more than the later ones
 * (what it loads on first use): ask it once, for a bf16 product, on the
 * loading thread, so that a step's first product does not pay it. The
 * answer is not used; a failure changes nothing (the step asks again). */
static void warm_heuristic(lt_state *s) {
    double t0 = sg__graph_clock();
    const lt_api *a = &s->api;
    cublasLtMatmulDesc_t d = NULL;
    cublasLtMatrixLayout_t l = NULL;
    cublasLtMatmulPreference_t p = NULL;
    cublasLtMatmulHeuristicResult_t r;
    int found = 0;
    size_t ws = WORKSPACE_BYTES;
    if (a->cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS &&
        a->cublasLtMatrixLayoutCreate(&l, CUDA_R_16BF, 1024, 1024, 1024) == CUBLAS_STATUS_SUCCESS &&
        a->cublasLtMatmulPreferenceCreate(&p) == CUBLAS_STATUS_SUCCESS &&
        a->cublasLtMatmulPreferenceSetAttribute(p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                                sizeof ws) == CUBLAS_STATUS_SUCCESS)
        (void)a->cublasLtMatmulAlgoGetHeuristic(s->handle, d, l, l, l, l, p, 1, &r, &found);
    if (p) a->cublasLtMatmulPreferenceDestroy(p);
    if (l) a->cublasLtMatrixLayoutDestroy(l);
    if (d) a->cublasLtMatmulDescDestroy(d);
    s->heur_ms = (sg__graph_clock() - t0) * 1e3;
}

static void *prewarm_main(void *arg) {
    lt_state *s = arg;
    /* cuBLASLt makes its handle for the current device's context. */
    if (s->cu->cuCtxSetCurrent((CUcontext)s->cuctx) != CUDA_SUCCESS) {
        snprintf(s->why, sizeof s->why, "cuCtxSetCurrent on cuBLASLt's loading thread failed");
        s->load_err = LOAD_THREAD;
        return NULL;
    }
    s->load_err = lt_load(s);
    if (s->load_err == LOAD_OK) warm_heuristic(s);
    return NULL;
}

void sg__cublaslt_prewarm(sg_ctx *ctx, bool step) {
    void **slot = sg__cuda_lt_state(ctx);
    const char *e = getenv("SG_CUDA_PREWARM");
    if (*slot || sg__cuda_is_hip(ctx) || (e && strcmp(e, "0") == 0) ||
        (!step && e && strcmp(e, "step") == 0))
        return;
    lt_state *s = sg__calloc(ctx, sizeof *s);
    if (!s) return; /* the first matmul loads it, and says so when it cannot */
    s->cuctx = sg__cuda_context(ctx);
    s->cu = sg__cuda_api(ctx);
    s->pending = pthread_create(&s->th, NULL, prewarm_main, s) == 0;
    if (!s->pending) {
        sg__free(ctx, s, sizeof *s);
        return;
    }
    *slot = s;
}

/* Load the library, make the handle and the workspace (first use only;
 * the library and handle may be on their way from sg__cublaslt_prewarm). */
static sg_status lt_state_get(sg_ctx *ctx, lt_state **out) {
    void **slot = sg__cuda_lt_state(ctx);
    lt_state *s = *slot;
    if (s && s->ready) {
        *out = s;
        return SG_OK;
    }
    if (sg__cuda_is_hip(ctx))
        return hip_no_blas(ctx);
    if (sg__cuda_capturing(ctx))
        return sg__fail(ctx, SG_ERR_UNSUPPORTED, "cuda: the first matmul of a context ran while a "
                        "CUDA graph was recorded; cuBLASLt's handle and workspace cannot be made "
                        "inside a recording: run the step once without a graph first");
    if (!s) {
        s = sg__calloc(ctx, sizeof *s);
        if (!s) return sg__fail(ctx, SG_ERR_OOM, "cuda: out of host memory for the cuBLASLt state");
        *slot = s;
        s->load_err = lt_load(s);
    }
    double t0 = sg__graph_clock();
    bool waited = s->pending;
    if (s->pending) pthread_join(s->th, NULL), s->pending = false;
    sg_status st = SG_OK;
    if (s->load_err == LOAD_NO_LIBRARY) {
        st = sg__fail(ctx, SG_ERR_BACKEND_UNAVAILABLE,
                      "cuda: matmul needs cuBLASLt, and "
                      "libcublasLt could not be loaded: tried %.400s; install the CUDA 13 cuBLAS "
                      "library (libcublas-13-0), put its directory on LD_LIBRARY_PATH or name "
                      "it in SG_CUBLASLT",
                      s->why);
        goto fail;
    }
    if (s->load_err == LOAD_NO_SYMBOL) {
        st = sg__fail(ctx, SG_ERR_BACKEND_UNAVAILABLE,
                      "cuda: libcublasLt (%s) lacks %s; install the cuBLAS of CUDA 12 or newer",
                      s->name, s->why);
        goto fail;
    }
    if (s->load_err == LOAD_THREAD) {
        st = sg__fail(ctx, SG_ERR_DRIVER, "cuda: %s; run with SG_CUDA_PREWARM=0", s->why);
        goto fail;
    }
    if (s->load_err == LOAD_CREATE) {
        const char *name = s->api.cublasLtGetStatusName(s->cr);
        st = sg__fail(ctx, SG_ERR_DRIVER,
                      "cuda: cublasLtCreate failed with %s (%d); check the "
                      "device with nvidia-smi",
                      name ? name : "an unknown status", (int)s->cr);
        goto fail;
    }
    sg__log(ctx, "perf_hints", "cuda: cuBLASLt loaded and its handle made in %.1f ms%s", s->load_ms,
            waited ? "" : " (on first use)");
    if (waited) {
        sg__log(ctx, "perf_hints",
                "cuda: cuBLASLt's first heuristic query took %.1f ms on its "
                "loading thread",
                s->heur_ms);
        sg__log(ctx, "perf_hints", "cuda: the first matmul waited %.1f ms for cuBLASLt's thread",
                (sg__graph_clock() - t0) * 1e3);
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
    s->ready = true;
    *out = s;
    return SG_OK;
fail:
    sg__cublaslt_release(ctx);
    return st;
}

/* The workspace of the lane the call goes on: two products on two branches
 * of a graph may run at once, and cuBLASLt's workspace serves one at a time. */
static void *workspace_of(const sg_ctx *ctx, const lt_state *s) {
    int l = sg__cuda_lane(ctx);
    return l ? s->lane_ws[l] : s->workspace;
}

sg_status sg__cublaslt_lane_ready(sg_ctx *ctx, int lane) {
    lt_state *s = *sg__cuda_lt_state(ctx);
    if (lane <= 0 || lane >= SG__CUDA_LANES || !s || !s->ready || s->lane_ws[lane]) return SG_OK;
    sg_status st = ctx->exec.alloc(ctx, WORKSPACE_BYTES, &s->lane_ws[lane]);
    if (st != SG_OK) {
        s->lane_ws[lane] = NULL;
        return sg__fail(ctx, st,
                        "cuda: cannot allocate cuBLASLt's %zu MiB workspace for a graph's "
                        "branch; free device memory first, or run with SG_CUDA_LANES=1",
                        WORKSPACE_BYTES >> 20);
    }
    return SG_OK;
}

/* The key's words: dtype, transa, transb, m, n, k, lda, ldb, ldc, batch,
 * sa, sb, sc, the epilogue (bias | act << 1 | aux << 3), beta (0; 1 with
 * C = D; 2 with a C of its own), the alignments of A, B, of D with C and
 * aux (one layout), of the bias (0: none), TF32. */
static void make_key(const sg__lt_call *c, const void *a, const void *b, const void *cin,
                     const void *d, const void *bias, const void *aux, bool tf32, int64_t *k) {
    int64_t al = align_of(d);
    if (cin && align_of(cin) < al) al = align_of(cin);
    if (aux && align_of(aux) < al) al = align_of(aux);
    int64_t epi = c->bias | c->act << 1 | (int64_t)c->aux << 3;
    int64_t beta = c->accumulate ? (cin && cin != d ? 2 : 1) : 0;
    int64_t v[KEY_WORDS] = {c->dtype, c->transa, c->transb, c->m, c->n, c->k, c->lda, c->ldb,
                            c->ldc, c->batch, c->sa, c->sb, c->sc, epi, beta, align_of(a),
                            align_of(b), al, bias ? align_of(bias) : 0, tf32};
    memcpy(k, v, sizeof v);
}

/* The cuBLASLt epilogue of a call. */
static cublasLtEpilogue_t epilogue_of(const sg__lt_call *c) {
    if (c->act == SG__LT_ACT_GELU)
        return c->aux ? (c->bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX)
                      : (c->bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU);
    if (c->act == SG__LT_ACT_RELU)
        return c->bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU;
    if (c->act == SG__LT_ACT_DGELU) return CUBLASLT_EPILOGUE_DGELU;
    return c->bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
}

/* A call's epilogue in words, for logs ("" for none); own_c: beta = 1 with
 * a C apart from D (a residual). */
static const char *epilogue_words(const sg__lt_call *c, bool own_c) {
    if (c->act == SG__LT_ACT_GELU)
        return c->aux ? " with the GELU epilogue (and its input)" : " with the GELU epilogue";
    if (c->act == SG__LT_ACT_RELU) return " with the RELU epilogue";
    if (c->act == SG__LT_ACT_DGELU) return " with the GELU-gradient epilogue";
    if (own_c) return c->bias ? " with the bias epilogue and a residual C" : " with a residual C";
    return c->bias ? " with the bias epilogue" : "";
}

/* The call's per-call pointers on its descriptor: the bias and aux. */
static cublasStatus_t set_pointers(const lt_api *api, const lt_entry *e, const sg__lt_call *c,
                                   const void *bias, const void *aux) {
    cublasStatus_t r = CUBLAS_STATUS_SUCCESS;
    if (c->bias)
        r = api->cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                sizeof bias);
    if (r == CUBLAS_STATUS_SUCCESS && c->aux)
        r = api->cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                &aux, sizeof aux);
    return r;
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

/* The heuristic's first n (at most SG__LT_NALGO) usable algorithms for e's
 * call, within the workspace, into out (*found of them); *call: the call
 * that failed. */
static cublasStatus_t heuristic(lt_state *s, const lt_entry *e, int n,
                                cublasLtMatmulHeuristicResult_t *out, int *found,
                                const char **call) {
    const lt_api *api = &s->api;
    cublasLtMatmulPreference_t pref = NULL;
    *call = "cublasLtMatmulPreferenceCreate";
    cublasStatus_t r = api->cublasLtMatmulPreferenceCreate(&pref);
    if (r == CUBLAS_STATUS_SUCCESS) {
        uint64_t ws = WORKSPACE_BYTES;
        *call = "cublasLtMatmulPreferenceSetAttribute";
        r = api->cublasLtMatmulPreferenceSetAttribute(
            pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
        /* The default assumes 256-byte aligned pointers; views may be less. */
        static const cublasLtMatmulPreferenceAttributes_t which[4] = {
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
        for (int i = 0; i < 4 && r == CUBLAS_STATUS_SUCCESS; i++) {
            uint32_t al = (uint32_t)e->key[15 + (i < 2 ? i : 2)];
            r = api->cublasLtMatmulPreferenceSetAttribute(pref, which[i], &al, sizeof al);
        }
    }
    cublasLtMatmulHeuristicResult_t res[SG__LT_NALGO];
    memset(res, 0, sizeof(*res) * (size_t)n);
    *found = 0;
    if (r == CUBLAS_STATUS_SUCCESS) {
        *call = "cublasLtMatmulAlgoGetHeuristic";
        r = api->cublasLtMatmulAlgoGetHeuristic(s->handle, e->desc, e->la, e->lb, e->lc, e->lc,
                                                pref, n, res, found);
        /* No algorithm is an answer, not a failure: the caller falls back. */
        if (r == CUBLAS_STATUS_NOT_SUPPORTED) r = CUBLAS_STATUS_SUCCESS, *found = 0;
    }
    if (pref) api->cublasLtMatmulPreferenceDestroy(pref);
    /* Only the usable ones, in the heuristic's order. */
    int m = 0;
    for (int i = 0; i < *found && i < n; i++)
        if (res[i].state == CUBLAS_STATUS_SUCCESS && res[i].workspaceSize <= WORKSPACE_BYTES)
            out[m++] = res[i];
    *found = m;
    return r;
}

/* Algorithm a with K in `parts` parts (reduced in the compute type, or in
 * place for 2 parts where cuBLASLt takes that; none for one part) when
 * cuBLASLt takes it for e's call within the workspace: false otherwise. */
static bool split_variant(lt_state *s, const lt_entry *e, cublasLtMatmulAlgo_t a, int32_t parts,
                          cublasLtMatmulHeuristicResult_t *out) {
    const lt_api *api = &s->api;
    uint32_t schemes[2] = {CUBLASLT_REDUCTION_SCHEME_NONE, 0};
    int ns = 1;
    if (parts == 2)
        schemes[0] = CUBLASLT_REDUCTION_SCHEME_INPLACE,
        schemes[1] = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE, ns = 2;
    else if (parts > 2)
        schemes[0] = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    for (int i = 0; i < ns; i++) {
        cublasLtMatmulAlgo_t v = a;
        if (api->cublasLtMatmulAlgoConfigSetAttribute(&v, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &parts,
                                                      sizeof parts) != CUBLAS_STATUS_SUCCESS ||
            api->cublasLtMatmulAlgoConfigSetAttribute(&v, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME,
                                                      &schemes[i], sizeof schemes[i]) !=
                CUBLAS_STATUS_SUCCESS)
            return false;
        memset(out, 0, sizeof *out);
        if (api->cublasLtMatmulAlgoCheck(s->handle, e->desc, e->la, e->lb, e->lc, e->lc, &v, out) ==
                CUBLAS_STATUS_SUCCESS &&
            out->state == CUBLAS_STATUS_SUCCESS && out->workspaceSize <= WORKSPACE_BYTES) {
            out->algo = v;
            return true;
        }
    }
    return false;
}

static int splitk_of(const lt_state *s, const cublasLtMatmulAlgo_t *a) {
    int32_t v = 1;
    size_t w = 0;
    if (s->api.cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &v, sizeof v,
                                                    &w) != CUBLAS_STATUS_SUCCESS)
        v = 1;
    return v;
}

/* e's call's candidates (cublaslt.h, "Split-K"): the heuristic's first
 * SG__LT_NHEUR usable algorithms, then up to an equal share of the rest
 * each of split-K variants of the first SG__LT_SPLIT_BASES (the most parts
 * first), in a fixed order: a pick is an index into this list. */
static cublasStatus_t candidates(lt_state *s, const lt_entry *e, int64_t k,
                                 cublasLtMatmulHeuristicResult_t *out, sg__lt_cand *cd, int *found,
                                 const char **call) {
    cublasStatus_t r = heuristic(s, e, SG__LT_NHEUR, out, found, call);
    if (r != CUBLAS_STATUS_SUCCESS) return r;
    int nh = *found, n = nh;
    for (int i = 0; i < nh; i++) cd[i] = (sg__lt_cand){i, splitk_of(s, &out[i].algo)};
    int per = nh ? (SG__LT_NALGO - nh) / SG__LT_SPLIT_BASES : 0;
    for (int i = 0; i < nh && i < SG__LT_SPLIT_BASES; i++) {
        int parts[SG__LT_NALGO];
        int np = sg__lt_splits(cd[i].splitk, k, parts, SG__LT_NALGO);
        for (int j = np - 1, made = 0; j >= 0 && made < per && n < SG__LT_NALGO; j--)
            if (split_variant(s, e, out[i].algo, parts[j], &out[n]))
                cd[n] = (sg__lt_cand){i, parts[j]}, n++, made++;
    }
    *found = n;
    return r;
}

/* Descriptors, layouts and the untimed choice of algorithm for e's call. */
static sg_status build_entry(sg_ctx *ctx, lt_state *s, lt_entry *e, const sg__lt_call *c,
                             const void *bias, const void *aux) {
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
    cublasLtEpilogue_t ep = epilogue_of(c);
    if (r == CUBLAS_STATUS_SUCCESS && ep != CUBLASLT_EPILOGUE_DEFAULT) {
        r = api->cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep);
        if (r == CUBLAS_STATUS_SUCCESS && c->aux) {
            int64_t ld = c->ldc;
            r = api->cublasLtMatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                                    &ld, sizeof ld);
        }
        if (r == CUBLAS_STATUS_SUCCESS) /* the heuristic reads their alignment */
            r = set_pointers(api, e, c, bias, aux);
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
    cublasLtMatmulHeuristicResult_t res[SG__LT_NALGO];
    sg__lt_cand cd[SG__LT_NALGO];
    int found = 0;
    r = candidates(s, e, c->k, res, cd, &found, &call);
    if (r != CUBLAS_STATUS_SUCCESS) return lt_fail(ctx, s, r, call, c);
    e->has_algo = found > 0;
    if (e->has_algo) {
        e->def = sg__lt_default_pick(cd, found, c->k);
        e->algo = res[e->def].algo;
        if (e->def > 0)
            sg__log(ctx, "perf_hints", "cuda: a %s matmul m=%lld n=%lld k=%lld: cuBLASLt's "
                    "first algorithm splits K in %d parts; it runs unsplit",
                    sg_dtype_name(c->dtype), (long long)c->m, (long long)c->n, (long long)c->k,
                    cd[0].splitk);
    } else /* once per distinct call: the entry remembers the answer */
        sg__log(ctx, "fallbacks",
                "cuda: cuBLASLt has no algorithm for a %s matmul m=%lld n=%lld "
                "k=%lld lda=%lld ldb=%lld ldc=%lld batch=%lld%s; %s",
                sg_dtype_name(c->dtype), (long long)c->m, (long long)c->n, (long long)c->k,
                (long long)c->lda, (long long)c->ldb, (long long)c->ldc, (long long)c->batch,
                epilogue_words(c, e->key[14] == 2),
                c->act || e->key[14] == 2
                    ? "the product runs alone and the group's epilogue kernel after it"
                : c->bias ? "the bias is written first and the product added to it"
                          : "the GEMV kernel runs it");
    return SG_OK;
}

/* The cached entry for key k, made now if new. */
static sg_status find_entry(sg_ctx *ctx, lt_state *s, const int64_t *k, const sg__lt_call *c,
                            const void *bias, const void *aux, lt_entry **out) {
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
    sg_status st = build_entry(ctx, s, e, c, bias, aux);
    if (st != SG_OK) {
        free_entry(&s->api, e);
        return st;
    }
    s->nentries++;
    *out = e;
    return SG_OK;
}

/* ------------------------------------------------------------ max-autotune */

static lt_known *known_find(lt_state *s, const int64_t *k) {
    for (int i = 0; i < s->nknown; i++)
        if (memcmp(s->known[i].p.key, k, sizeof s->known[i].p.key) == 0) return &s->known[i];
    return NULL;
}

/* Remember the pick for key k (replacing one): NULL when out of memory. */
static lt_known *known_put(sg_ctx *ctx, lt_state *s, const int64_t *k, int pick) {
    lt_known *kn = known_find(s, k);
    if (!kn) {
        if (s->nknown == s->kcap) {
            int ncap = s->kcap ? s->kcap * 2 : 16;
            lt_known *nk = sg__alloc(ctx, sizeof *nk * (size_t)ncap);
            if (!nk) return NULL;
            if (s->known) {
                memcpy(nk, s->known, sizeof *nk * (size_t)s->nknown);
                sg__free(ctx, s->known, sizeof *nk * (size_t)s->kcap);
            }
            s->known = nk;
            s->kcap = ncap;
        }
        kn = &s->known[s->nknown++];
        memcpy(kn->p.key, k, sizeof kn->p.key);
        kn->mark = 0;
    }
    kn->p.pick = pick;
    return kn;
}

/* One call of the product being tuned: an algorithm, or the alternative. */
typedef struct cand {
    lt_state *s;
    lt_entry *e;
    const void *a, *b;
    void *d;
    sg__lt_alt alt;
    void *user;
    const void *cin; /* a C apart from D (beta = 1), NULL when none */
} cand;

static bool cand_run(sg_ctx *ctx, const cand *t, const cublasLtMatmulAlgo_t *algo) {
    if (!algo) return t->alt(ctx, t->user) == SG_OK;
    float alpha = 1.0f, beta = t->cin ? 1.0f : 0.0f;
    const lt_entry *e = t->e;
    return t->s->api.cublasLtMatmul(t->s->handle, e->desc, &alpha, t->a, e->la, t->b, e->lb, &beta,
                                    t->cin ? t->cin : t->d, e->lc, t->d, e->lc, algo,
                                    workspace_of(ctx, t->s), WORKSPACE_BYTES,
                                    (cudaStream_t)sg__cuda_stream(ctx)) == CUBLAS_STATUS_SUCCESS;
}

/* Milliseconds of 5 runs of a candidate (algo, or the alternative when
 * NULL) after one warm-up, between two events: the least of 3 such rounds,
 * since a round only ever runs slower than the call (clocks, other work);
 * false when any step fails. */
static bool cand_time(sg_ctx *ctx, const cand *t, const cublasLtMatmulAlgo_t *algo, float *ms) {
    const sg__cu_api *cu = sg__cuda_api(ctx);
    CUstream stream = sg__cuda_stream(ctx);
    CUevent e0 = NULL, e1 = NULL;
    bool ok = cu->cuEventCreate(&e0, CU_EVENT_DEFAULT) == CUDA_SUCCESS &&
              cu->cuEventCreate(&e1, CU_EVENT_DEFAULT) == CUDA_SUCCESS;
    ok = ok && cand_run(ctx, t, algo);
    for (int round = 0; ok && round < 3; round++) {
        float r = 0;
        ok = cu->cuEventRecord(e0, stream) == CUDA_SUCCESS;
        for (int i = 0; ok && i < 5; i++) ok = cand_run(ctx, t, algo);
        ok = ok && cu->cuEventRecord(e1, stream) == CUDA_SUCCESS &&
             cu->cuEventSynchronize(e1) == CUDA_SUCCESS &&
             cu->cuEventElapsedTime_v2(&r, e0, e1) == CUDA_SUCCESS;
        if (ok && (round == 0 || r < *ms)) *ms = r;
    }
    if (e0) cu->cuEventDestroy_v2(e0);
    if (e1) cu->cuEventDestroy_v2(e1);
    return ok;
}

/* Time the heuristic's algorithms for e's call (and t's alternative when it
 * has one) and keep the fastest in e: the pick. The default (the first
 * algorithm, or the alternative when alt_first) stays unless another is 3%
 * faster, and stays when it cannot be timed; a candidate that fails is
 * dropped. */
static int tune_call(sg_ctx *ctx, const cand *t, const sg__lt_call *c, bool alt_first) {
    lt_state *s = t->s;
    lt_entry *e = t->e;
    cublasLtMatmulHeuristicResult_t res[SG__LT_NALGO];
    sg__lt_cand cd[SG__LT_NALGO];
    int found = 0;
    const char *call;
    if (e->has_algo && candidates(s, e, c->k, res, cd, &found, &call) != CUBLAS_STATUS_SUCCESS)
        found = 0;
    int def = t->alt && alt_first ? SG__LT_GEMV : e->has_algo ? e->def : 0, best = def;
    float def_ms = 0, best_ms = 0, ms = 0;
    if (def >= 0 && def >= found) return def;
    if (!cand_time(ctx, t, def >= 0 ? &res[def].algo : NULL, &def_ms)) return def;
    best_ms = def_ms;
    for (int i = t->alt ? SG__LT_GEMV : 0; i < found; i++)
        if (i != def && cand_time(ctx, t, i >= 0 ? &res[i].algo : NULL, &ms) &&
            ms < 0.97f * best_ms)
            best = i, best_ms = ms;
    e->picked = best >= 0 ? res[best].algo : e->algo;
    e->tuned = true;
    char what[64];
    if (best == SG__LT_GEMV)
        snprintf(what, sizeof what, "the GEMV kernel");
    else
        snprintf(what, sizeof what, "cuBLASLt's algorithm %d of %d", best + 1, found);
    sg__log(ctx, "perf_hints",
            "cuda: max-autotune: a %s matmul m=%lld n=%lld k=%lld batch=%lld "
            "runs %s (%.2f us; the default %.2f us)",
            sg_dtype_name(c->dtype), (long long)c->m, (long long)c->n, (long long)c->k,
            (long long)c->batch, what, best_ms / 5 * 1e3, def_ms / 5 * 1e3);
    return best;
}

/* A remembered pick into e: the candidate at that index (the untimed
 * choice where the list is now shorter). */
static void use_pick(lt_state *s, lt_entry *e, int pick, const sg__lt_call *c) {
    cublasLtMatmulHeuristicResult_t res[SG__LT_NALGO];
    sg__lt_cand cd[SG__LT_NALGO];
    int found = 0;
    const char *call;
    e->picked = e->algo;
    if (pick >= 0 && pick != e->def &&
        candidates(s, e, c->k, res, cd, &found, &call) == CUBLAS_STATUS_SUCCESS && pick < found)
        e->picked = res[pick].algo;
    e->tuned = true;
}

/* The first pick of the tuning run that could not be made or kept: the
 * call keeps its default, and sg__lt_tune_end reports it. */
static void tune_lost(lt_state *s, sg_status st, const char *why) {
    if (s->lost != SG_OK) return;
    s->lost = st;
    snprintf(s->lost_why, sizeof s->lost_why, "%s", why);
}

/* Restores the context's status after work whose failures are not the call's. */
typedef struct quiet {
    sg_status status;
    char msg[SG__MSG_SIZE];
} quiet;

static void quiet_begin(const sg_ctx *ctx, quiet *q) {
    q->status = ctx->status;
    snprintf(q->msg, sizeof q->msg, "%s", ctx->msg);
}

static void quiet_end(sg_ctx *ctx, const quiet *q) {
    ctx->status = q->status;
    snprintf(ctx->msg, sizeof ctx->msg, "%s", q->msg);
}

/* The pick for e's call (t's product): remembered, or timed now while
 * tuning; -2 when there is none (the call keeps its default). */
static int pick_for(sg_ctx *ctx, const cand *t, const sg__lt_call *c, bool alt_first) {
    lt_state *s = t->s;
    lt_known *kn = known_find(s, t->e->key);
    int pick;
    if (kn) {
        pick = kn->p.pick;
        if (!t->e->tuned) use_pick(s, t->e, pick, c);
    } else if (s->tuning && (!c->accumulate || t->cin) && !sg__cuda_capturing(ctx)) {
        pick = tune_call(ctx, t, c, alt_first);
        kn = known_put(ctx, s, t->e->key, pick);
        if (!kn)
            tune_lost(s, SG_ERR_OOM, "cuda: max-autotune: out of host memory for a cuBLASLt pick");
    } else {
        return -2;
    }
    if (kn && s->tuning) kn->mark = s->epoch;
    return pick;
}

sg_status sg__lt_scope(sg_ctx *ctx, bool on) {
    lt_state *s = *sg__cuda_lt_state(ctx);
    if (on && (!s || !s->ready)) {
        quiet q;
        quiet_begin(ctx, &q);
        sg_status st = lt_state_get(ctx, &s);
        if (st == SG_ERR_OOM) return st;
        quiet_end(ctx, &q);
        if (st != SG_OK) s = NULL;
    }
    if (s) s->scope = on;
    return SG_OK;
}

bool sg__lt_scoped(sg_ctx *ctx) {
    const lt_state *s = *sg__cuda_lt_state(ctx);
    return s && s->scope;
}

sg_status sg__lt_tune_begin(sg_ctx *ctx) {
    quiet q;
    quiet_begin(ctx, &q);
    lt_state *s = NULL;
    sg_status st = lt_state_get(ctx, &s);
    /* Out of memory is the tuning's failure; no library (HIP, or none
     * installed) leaves nothing to pick, and a product that needs it says so. */
    if (st != SG_OK && st != SG_ERR_OOM) quiet_end(ctx, &q);
    if (st != SG_OK) return st == SG_ERR_OOM ? st : SG_OK;
    s->tuning = true, s->epoch++;
    s->lost = SG_OK, s->lost_why[0] = '\0';
    return SG_OK;
}

int sg__lt_tune_end(sg_ctx *ctx, sg__lt_pick *out, int max, sg_status *lost) {
    lt_state *s = *sg__cuda_lt_state(ctx);
    int n = 0;
    *lost = SG_OK;
    if (!s || !s->tuning) return 0;
    s->tuning = false;
    if (s->lost != SG_OK) {
        *lost = sg__fail(ctx, s->lost, "%s", s->lost_why);
        return -1;
    }
    for (int i = 0; i < s->nknown && n < max; i++)
        if (s->known[i].mark == s->epoch) out[n++] = s->known[i].p;
    return n;
}

int sg__lt_picks_set(sg_ctx *ctx, const sg__lt_pick *p, int n) {
    quiet q;
    quiet_begin(ctx, &q);
    lt_state *s = NULL;
    sg_status st = lt_state_get(ctx, &s);
    if (st == SG_ERR_OOM) return -1;
    quiet_end(ctx, &q);
    if (st != SG_OK) return 0;
    for (int i = 0; i < n; i++)
        if (!known_put(ctx, s, p[i].key, p[i].pick)) {
            sg__fail(ctx, SG_ERR_OOM,
                     "cuda: max-autotune: out of host memory for the picks "
                     "remembered in the cache directory");
            return -1;
        }
    return 1;
}

bool sg__lt_prefer_gemv(sg_ctx *ctx, const sg__lt_call *c, const void *a, const void *b, void *d,
                        const void *bias, sg__lt_alt alt, void *user, bool gemv) {
    lt_state *s = *sg__cuda_lt_state(ctx);
    if (!s || !s->scope || (!s->tuning && s->nknown == 0)) return gemv;
    int64_t k[KEY_WORDS];
    make_key(c, a, b, NULL, d, c->bias ? bias : NULL, NULL, s->tf32, k);
    lt_known *kn = known_find(s, k);
    if (kn) {
        if (s->tuning) kn->mark = s->epoch;
        return kn->p.pick == SG__LT_GEMV;
    }
    if (!s->tuning || c->accumulate || sg__cuda_capturing(ctx)) return gemv;
    quiet q;
    quiet_begin(ctx, &q);
    lt_entry *e = NULL;
    int pick = -2;
    sg_status fs = find_entry(ctx, s, k, c, bias, NULL, &e);
    cublasStatus_t r =
        fs == SG_OK ? set_pointers(&s->api, e, c, bias, NULL) : CUBLAS_STATUS_SUCCESS;
    if (fs == SG_OK && r != CUBLAS_STATUS_SUCCESS)
        fs = lt_fail(ctx, s, r, "cublasLtMatmulDescSetAttribute", c);
    if (fs == SG_OK) {
        cand t = {s, e, a, b, d, alt, user, NULL};
        pick = pick_for(ctx, &t, c, gemv);
    } else {
        tune_lost(s, fs, ctx->msg);
    }
    quiet_end(ctx, &q);
    return pick == -2 ? gemv : pick == SG__LT_GEMV;
}

sg_status sg__lt_matmul(sg_ctx *ctx, const sg__lt_call *c, const void *a, const void *b, void *d,
                        const void *bias, bool *ran) {
    return sg__lt_matmul_epi(ctx, c, a, b, NULL, d, bias, NULL, ran);
}

sg_status sg__lt_matmul_epi(sg_ctx *ctx, const sg__lt_call *c, const void *a, const void *b,
                            const void *cin, void *d, const void *bias, void *aux, bool *ran) {
    *ran = false;
    lt_state *s = NULL;
    sg_status st = lt_state_get(ctx, &s);
    if (st != SG_OK) return st;
    if (!c->accumulate || cin == d) cin = NULL;
    if (!c->aux) aux = NULL;
    int64_t k[KEY_WORDS];
    make_key(c, a, b, cin, d, c->bias ? bias : NULL, aux, s->tf32, k);
    lt_entry *e = NULL;
    st = find_entry(ctx, s, k, c, bias, aux, &e);
    if (st != SG_OK || !e->has_algo) return st;
    /* the pointers of this call (the cached ones were another's) */
    cublasStatus_t r = set_pointers(&s->api, e, c, bias, aux);
    if (r != CUBLAS_STATUS_SUCCESS) return lt_fail(ctx, s, r, "cublasLtMatmulDescSetAttribute", c);
    if (s->scope && (s->tuning || (!e->tuned && s->nknown > 0))) {
        quiet q; /* a pick that cannot be made keeps the default */
        quiet_begin(ctx, &q);
        cand t = {s, e, a, b, d, NULL, NULL, cin};
        pick_for(ctx, &t, c, false);
        quiet_end(ctx, &q);
    }
    if (!workspace_of(ctx, s))
        return sg__fail(ctx, SG_ERR_INTERNAL,
                        "cuda: a matmul on a graph's branch %d without its "
                        "cuBLASLt workspace; run with SG_CUDA_LANES=1",
                        sg__cuda_lane(ctx));
    const cublasLtMatmulAlgo_t *algo = s->scope && e->tuned ? &e->picked : &e->algo;
    float alpha = 1.0f, beta = c->accumulate ? 1.0f : 0.0f;
    const void *cp = cin ? cin : d;
    r = s->api.cublasLtMatmul(s->handle, e->desc, &alpha, a, e->la, b, e->lb, &beta, cp, e->lc, d,
                              e->lc, algo, workspace_of(ctx, s), WORKSPACE_BYTES,
                              (cudaStream_t)sg__cuda_stream(ctx));
    if (r != CUBLAS_STATUS_SUCCESS && algo == &e->picked) {
        /* A pick that fails is dropped for the heuristic's first. */
        e->picked = e->algo;
        r = s->api.cublasLtMatmul(s->handle, e->desc, &alpha, a, e->la, b, e->lb, &beta, cp, e->lc,
                                  d, e->lc, &e->algo, workspace_of(ctx, s), WORKSPACE_BYTES,
                                  (cudaStream_t)sg__cuda_stream(ctx));
    }
    if ((r == CUBLAS_STATUS_NOT_SUPPORTED || r == CUBLAS_STATUS_INVALID_VALUE) &&
        c->act == SG__LT_ACT_DGELU) {
        /* Refused before any launch: the caller runs the product and the
         * group's kernel, now and for every later call with this key. */
        e->has_algo = false;
        sg__log(ctx, "fallbacks",
                "cuda: cuBLASLt refused a %s matmul m=%lld n=%lld k=%lld%s (status %d); "
                "the product runs alone and the group's epilogue kernel after it",
                sg_dtype_name(c->dtype), (long long)c->m, (long long)c->n, (long long)c->k,
                epilogue_words(c, false), (int)r);
        return SG_OK;
    }
    if (r != CUBLAS_STATUS_SUCCESS) return lt_fail(ctx, s, r, "cublasLtMatmul", c);
    *ran = true;
    return SG_OK;
}

#endif /* SG_HAVE_CUDA_HEADERS */
