/* SPDX-License-Identifier: MIT */
/*
 * cuda_comm.c -- collectives on the CUDA backend through NCCL, loaded at
 * run time (SG_NCCL_LIB, else libnccl.so.2) into one table of entry points
 * declared here (no NCCL header is needed to build). Each communicator is
 * one non-blocking NCCL communicator (ncclConfig_t.blocking = 0) on the
 * context's device, made from a unique id that rank 0 sends to the others
 * through MPI under mpirun, else over TCP (comm.c). Collectives go on the
 * context's stream, so inside a compiled step stream capture records them
 * into the CUDA graph with the kernels around them.
 *
 * Nothing waits without a bound: the initialization and each call that
 * reports ncclInProgress are polled with ncclCommGetAsyncError until the
 * communicator's timeout, and sg_comm_synchronize polls the stream and the
 * communicator's error together; on expiry or a peer's error the NCCL
 * communicator is aborted (which releases kernels stuck waiting for it).
 */
#include "../comm.h"

#include <stdio.h>

#ifdef SG_HAVE_CUDA_HEADERS

#include "exec.h"

#include <cuda.h>
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

/* NCCL's ABI (nccl.h, stable since 2.x). */
typedef void *nccl_comm_t;
typedef struct nccl_id {
    char internal[128];
} nccl_id;
enum { NCCL_SUCCESS = 0, NCCL_IN_PROGRESS = 7 };
enum { NCCL_UINT8 = 1, NCCL_INT32 = 2, NCCL_INT64 = 4, NCCL_F16 = 6, NCCL_F32 = 7, NCCL_BF16 = 9 };
enum { NCCL_SUM = 0, NCCL_AVG = 4 };
/* ncclConfig_t as of NCCL 2.17 (NCCL reads the fields its version field names). */
typedef struct nccl_config {
    size_t size;
    unsigned int magic, version;
    int blocking, cga_cluster_size, min_ctas, max_ctas;
    const char *net_name;
    int split_share;
} nccl_config;

#define SG__NCCL_API(X)                                                                            \
    X(int, ncclGetVersion, (int *))                                                                \
    X(int, ncclGetUniqueId, (nccl_id *))                                                           \
    X(int, ncclCommInitRankConfig, (nccl_comm_t *, int, nccl_id, int, nccl_config *))              \
    X(int, ncclCommGetAsyncError, (nccl_comm_t, int *))                                            \
    X(int, ncclCommFinalize, (nccl_comm_t))                                                        \
    X(int, ncclCommDestroy, (nccl_comm_t))                                                         \
    X(int, ncclCommAbort, (nccl_comm_t))                                                           \
    X(const char *, ncclGetErrorString, (int))                                                     \
    X(int, ncclAllReduce, (const void *, void *, size_t, int, int, nccl_comm_t, CUstream))         \
    X(int, ncclAllGather, (const void *, void *, size_t, int, nccl_comm_t, CUstream))              \
    X(int, ncclReduceScatter, (const void *, void *, size_t, int, int, nccl_comm_t, CUstream))     \
    X(int, ncclBroadcast, (const void *, void *, size_t, int, int, nccl_comm_t, CUstream))

typedef struct nccl_api {
#define X(ret, name, params) ret(*name) params;
    SG__NCCL_API(X)
#undef X
    CUresult (*cuStreamQuery)(CUstream);
} nccl_api;

static nccl_api api;
static void *lib; /* loaded once per process, never unloaded */
static pthread_mutex_t lib_mu = PTHREAD_MUTEX_INITIALIZER;

typedef struct nccl_state {
    nccl_comm_t comm;
    bool mpi_held; /* MPI carried the id: held until the communicator goes */
} nccl_state;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static sg_status load_locked(sg_ctx *ctx) {
    if (lib) return SG_OK;
    const char *path = getenv("SG_NCCL_LIB");
    if (!path || !*path) path = "libnccl.so.2";
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return sg__fail(ctx, SG_ERR_BACKEND_UNAVAILABLE,
                        "sg_comm_create: cannot load %s (%s); "
                        "CUDA collectives need NCCL: install it (the libnccl2 package, or pip's "
                        "nvidia-nccl-cu13) or set SG_NCCL_LIB to its libnccl.so.2",
                        path, dlerror());
    nccl_api a;
    const char *missing = NULL;
#define X(ret, name, params)                                                                       \
    if (!(*(void **)&a.name = dlsym(h, #name)) && !missing) missing = #name;
    SG__NCCL_API(X)
#undef X
    /* The driver the backend loaded (driver.c): dlopen hands back its handle. */
    const char *drv = getenv("SG_CUDA_DRIVER");
    void *cu = dlopen(drv && *drv ? drv : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!cu || !(*(void **)&a.cuStreamQuery = dlsym(cu, "cuStreamQuery")))
        missing = "cuStreamQuery";
    int version = 0;
    if (!missing && a.ncclGetVersion(&version) == NCCL_SUCCESS && version < 21700)
        missing = "version 2.17 or later";
    if (missing) {
        dlclose(h);
        return sg__fail(ctx, SG_ERR_BACKEND_UNAVAILABLE,
                        "sg_comm_create: %s lacks %s; install "
                        "NCCL 2.17 or later (SG_NCCL_LIB names the file)",
                        path, missing);
    }
    api = a;
    lib = h;
    return SG_OK;
}

static sg_status load(sg_ctx *ctx) {
    pthread_mutex_lock(&lib_mu);
    sg_status s = load_locked(ctx);
    pthread_mutex_unlock(&lib_mu);
    return s;
}

static sg_status nccl_fail(sg_comm *c, int rc, const char *call, const char *what) {
    return sg__fail(c->ctx, SG_ERR_DRIVER, "%s: %s failed on rank %d of %d (error %d: %s)", what,
                    call, c->rank, c->size, rc, api.ncclGetErrorString(rc));
}

/* Abort the NCCL communicator: kernels waiting on it return, and every
 * later collective fails. */
static void abort_comm(sg_comm *c) {
    nccl_state *st = c->state;
    if (st->comm) api.ncclCommAbort(st->comm);
    st->comm = NULL;
    c->broken = true;
}

/* Poll the communicator until it leaves ncclInProgress (rc is what the
 * call returned), within the timeout. */
static sg_status settle(sg_comm *c, int rc, const char *call, const char *what) {
    nccl_state *st = c->state;
    double deadline = now_s() + c->timeout_s;
    while (rc == NCCL_IN_PROGRESS) {
        if (now_s() > deadline) {
            abort_comm(c);
            return sg__fail(c->ctx, SG_ERR_DRIVER,
                            "%s: %s did not finish on rank %d of %d within "
                            "%.1f s; a rank died or did not join (sg_comm_opts.timeout_s or "
                            "SG_COMM_TIMEOUT sets the wait); the communicator was aborted",
                            what, call, c->rank, c->size, c->timeout_s);
        }
        nanosleep(&(struct timespec){0, 50 * 1000}, NULL);
        int e = NCCL_SUCCESS;
        int q = api.ncclCommGetAsyncError(st->comm, &e);
        rc = q != NCCL_SUCCESS ? q : e;
    }
    if (rc == NCCL_SUCCESS) return SG_OK;
    sg_status s = nccl_fail(c, rc, call, what);
    abort_comm(c);
    return s;
}

static int nccl_type(sg_dtype dt) {
    switch (dt) {
    case SG_F32: return NCCL_F32;
    case SG_F16: return NCCL_F16;
    case SG_BF16: return NCCL_BF16;
    case SG_I32: return NCCL_INT32;
    case SG_I64: return NCCL_INT64;
    default: return NCCL_UINT8;
    }
}

static sg_status nccl_run(sg_comm *c, const sg__node *n) {
    nccl_state *st = c->state;
    const char *what = sg__op_name(n->op);
    if (!st->comm)
        return sg__fail(c->ctx, SG_ERR_DRIVER, "%s: the NCCL communicator was aborted", what);
    CUstream stream = sg__cuda_stream(c->ctx);
    const void *src = sg__data(n->in[0]);
    void *dst = sg__data(n->out);
    size_t cnt = (size_t)sg__comm_count(n);
    int type = nccl_type(n->in[0]->dtype), op = n->i[1] == SG_REDUCE_MEAN ? NCCL_AVG : NCCL_SUM;
    int rc;
    const char *call;
    switch (n->op) {
    case SG__OP_ALL_REDUCE:
        call = "ncclAllReduce";
        rc = api.ncclAllReduce(src, dst, cnt, type, op, st->comm, stream);
        break;
    case SG__OP_ALL_GATHER:
        call = "ncclAllGather";
        rc = api.ncclAllGather(src, dst, cnt, type, st->comm, stream);
        break;
    case SG__OP_REDUCE_SCATTER:
        call = "ncclReduceScatter";
        rc = api.ncclReduceScatter(src, dst, cnt / (size_t)c->size, type, op, st->comm, stream);
        break;
    default:
        call = "ncclBroadcast";
        rc = api.ncclBroadcast(src, dst, cnt, type, (int)n->i[1], st->comm, stream);
        break;
    }
    return settle(c, rc, call, what);
}

/* Wait for the stream while watching the communicator. */
static sg_status nccl_sync(sg_comm *c) {
    nccl_state *st = c->state;
    if (!st->comm)
        return sg__fail(c->ctx, SG_ERR_DRIVER,
                        "sg_comm_synchronize: the NCCL "
                        "communicator was aborted");
    CUstream stream = sg__cuda_stream(c->ctx);
    double deadline = now_s() + c->timeout_s;
    for (;;) {
        CUresult r = api.cuStreamQuery(stream);
        if (r == CUDA_SUCCESS) return SG_OK;
        if (r != CUDA_ERROR_NOT_READY) return sg_ctx_synchronize(c->ctx); /* says what failed */
        int e = NCCL_SUCCESS;
        api.ncclCommGetAsyncError(st->comm, &e);
        if (e != NCCL_SUCCESS && e != NCCL_IN_PROGRESS) {
            sg_status s = nccl_fail(c, e, "a collective", "sg_comm_synchronize");
            abort_comm(c);
            return s;
        }
        if (now_s() > deadline) {
            abort_comm(c);
            return sg__fail(c->ctx, SG_ERR_DRIVER,
                            "sg_comm_synchronize: rank %d of %d waited "
                            "%.1f s for the device; a rank died or is not calling the same "
                            "collectives in the same order (the timeout is sg_comm_opts.timeout_s "
                            "or SG_COMM_TIMEOUT); the communicator was aborted",
                            c->rank, c->size, c->timeout_s);
        }
        nanosleep(&(struct timespec){0, 50 * 1000}, NULL);
    }
}

static void nccl_destroy(sg_comm *c) {
    nccl_state *st = c->state;
    if (!st) return;
    if (st->comm) {
        int rc = api.ncclCommFinalize(st->comm);
        if (settle(c, rc, "ncclCommFinalize", "sg_comm_destroy") == SG_OK)
            api.ncclCommDestroy(st->comm);
    }
    if (st->mpi_held) sg__mpi_release();
    sg__free(c->ctx, st, sizeof *st);
    c->state = NULL;
}

/* One all-reduce of one float, waited for: the communicator works end to
 * end (within the timeout) before any step is captured, and NCCL makes the
 * connections it makes on first use here rather than inside a capture. */
static sg_status warm_up(sg_comm *c) {
    void *p = NULL;
    float zero = 0;
    sg_status s = sg__dev_alloc(c->ctx, sizeof(float), &p);
    if (s != SG_OK) return s;
    s = c->ctx->exec.upload(c->ctx, p, &zero, sizeof zero);
    nccl_state *st = c->state;
    if (s != SG_OK) {
        sg__dev_free(c->ctx, p, sizeof(float));
        return s;
    }
    int rc = api.ncclAllReduce(p, p, 1, NCCL_F32, NCCL_SUM, st->comm, sg__cuda_stream(c->ctx));
    s = settle(c, rc, "ncclAllReduce", "sg_comm_create");
    if (s == SG_OK) s = nccl_sync(c);
    sg__dev_free(c->ctx, p, sizeof(float));
    return s;
}

static const sg__comm_impl nccl_impl = {"nccl", nccl_run, nccl_sync, nccl_destroy};

sg_status sg__nccl_comm_init(sg_comm *c, const sg__comm_env *env) {
    sg_ctx *ctx = c->ctx;
    sg_status s = load(ctx);
    if (s != SG_OK) return s;
    nccl_state *st = sg__calloc(ctx, sizeof *st);
    if (!st) return sg__fail(ctx, SG_ERR_OOM, "sg_comm_create: out of host memory");
    c->state = st;
    c->impl = &nccl_impl;
    nccl_id id;
    memset(&id, 0, sizeof id);
    int rc = env->rank == 0 ? api.ncclGetUniqueId(&id) : NCCL_SUCCESS;
    if (rc != NCCL_SUCCESS) s = nccl_fail(c, rc, "ncclGetUniqueId", "sg_comm_create");
    if (s == SG_OK && env->size > 1) {
        if (env->mpirun) {
            s = sg__mpi_bcast_bytes(ctx, &id, sizeof id, c->timeout_s);
            st->mpi_held = s == SG_OK;
        } else {
            s = sg__comm_tcp_bcast(ctx, env, &id, sizeof id);
        }
    }
    nccl_config cfg = {.size = sizeof cfg,
                       .magic = 0xcafebeef,
                       .version = 21700,
                       .blocking = 0,
                       .cga_cluster_size = INT_MIN,
                       .min_ctas = INT_MIN,
                       .max_ctas = INT_MIN,
                       .split_share = INT_MIN};
    if (s == SG_OK) {
        rc = api.ncclCommInitRankConfig(&st->comm, env->size, id, env->rank, &cfg);
        s = st->comm || rc == NCCL_SUCCESS || rc == NCCL_IN_PROGRESS
                ? settle(c, rc, "ncclCommInitRankConfig", "sg_comm_create")
                : nccl_fail(c, rc, "ncclCommInitRankConfig", "sg_comm_create");
    }
    if (s == SG_OK) s = warm_up(c);
    if (s != SG_OK) {
        if (st->comm) abort_comm(c);
        nccl_destroy(c);
    }
    return s;
}

#else

sg_status sg__nccl_comm_init(sg_comm *c, const sg__comm_env *env) {
    (void)env;
    return sg__fail(c->ctx, SG_ERR_UNSUPPORTED, "sg_comm_create: this build has no CUDA backend");
}

#endif
