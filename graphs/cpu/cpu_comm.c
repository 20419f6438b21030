/* SPDX-License-Identifier: MIT */
/*
 * cpu_comm.c -- collectives on the CPU backend through MPI, loaded at run
 * time: libmpi is opened with dlopen (SG_MPI_LIB, else Open MPI's
 * libmpi.so.40) and its entry points and predefined objects
 * (MPI_COMM_WORLD, MPI_FLOAT, MPI_SUM, ... which Open MPI exports as the
 * ompi_mpi_* symbols its mpi.h takes the addresses of) resolved into one
 * table. MPI is initialized by the first holder (unless the program did it)
 * and finalized by the last. Each communicator is a duplicate of
 * MPI_COMM_WORLD with errors returned, not fatal.
 *
 * Every collective is the non-blocking MPI call followed by MPI_Test until
 * it completes or the communicator's timeout passes: a peer that died or
 * stopped calling collectives is an error naming the op, not a hang. f16
 * and bf16 are reduced in f32 (a buffer of the communicator's, grown once)
 * and rounded once; MEAN is the sum scaled by 1/size.
 */
#include "../comm.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* Open MPI's ABI: handles are pointers, MPI_IN_PLACE is (void *)1. */
typedef void *mpi_h;
#define SG__MPI_IN_PLACE ((void *)1)
#define SG__MPI_THREAD_FUNNELED 1

/* X(return type, name, parameters) */
#define SG__MPI_API(X)                                                                             \
    X(int, MPI_Initialized, (int *))                                                               \
    X(int, MPI_Finalized, (int *))                                                                 \
    X(int, MPI_Init_thread, (int *, char ***, int, int *))                                         \
    X(int, MPI_Finalize, (void))                                                                   \
    X(int, MPI_Comm_dup, (mpi_h, mpi_h *))                                                         \
    X(int, MPI_Comm_free, (mpi_h *))                                                               \
    X(int, MPI_Comm_set_errhandler, (mpi_h, mpi_h))                                                \
    X(int, MPI_Comm_rank, (mpi_h, int *))                                                          \
    X(int, MPI_Comm_size, (mpi_h, int *))                                                          \
    X(int, MPI_Iallreduce, (const void *, void *, int, mpi_h, mpi_h, mpi_h, mpi_h *))              \
    X(int, MPI_Iallgather, (const void *, int, mpi_h, void *, int, mpi_h, mpi_h, mpi_h *))         \
    X(int, MPI_Ireduce_scatter_block, (const void *, void *, int, mpi_h, mpi_h, mpi_h, mpi_h *))   \
    X(int, MPI_Ibcast, (void *, int, mpi_h, int, mpi_h, mpi_h *))                                  \
    X(int, MPI_Test, (mpi_h *, int *, void *))                                                     \
    X(int, MPI_Error_string, (int, char *, int *))

/* The predefined objects: X(field, symbol). */
#define SG__MPI_OBJS(X)                                                                            \
    X(world, "ompi_mpi_comm_world")                                                                \
    X(t_float, "ompi_mpi_float")                                                                   \
    X(t_int, "ompi_mpi_int")                                                                       \
    X(t_llong, "ompi_mpi_long_long_int")                                                           \
    X(t_byte, "ompi_mpi_byte")                                                                     \
    X(op_sum, "ompi_mpi_op_sum")                                                                   \
    X(errors_return, "ompi_mpi_errors_return")

typedef struct mpi_api {
#define X(ret, name, params) ret(*name) params;
    SG__MPI_API(X)
#undef X
#define X(field, sym) mpi_h field;
    SG__MPI_OBJS(X)
#undef X
} mpi_api;

/* MPI is one per process: the library, its table, and who holds it. */
static struct {
    pthread_mutex_t mu;
    void *lib;
    mpi_api api;
    int holders;
    bool ours;   /* stepgraph initialized MPI, so it finalizes it */
    bool broken; /* a collective was abandoned: finalizing could hang */
} mpi = {.mu = PTHREAD_MUTEX_INITIALIZER};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Load libmpi and fill the table (under mpi.mu). */
static sg_status load(sg_ctx *ctx) {
    if (mpi.lib) return SG_OK;
    const char *path = getenv("SG_MPI_LIB");
    if (!path || !*path) path = "libmpi.so.40";
    /* RTLD_GLOBAL: Open MPI's plugins resolve their symbols against libmpi. */
    void *lib = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    if (!lib)
        return sg__fail(ctx, SG_ERR_BACKEND_UNAVAILABLE,
                        "sg_comm_create: cannot load %s (%s); "
                        "CPU collectives need Open MPI: apt-get install openmpi-bin "
                        "libopenmpi-dev, or set SG_MPI_LIB to its libmpi.so",
                        path, dlerror());
    mpi_api a;
    const char *missing = NULL;
#define X(ret, name, params)                                                                       \
    if (!(*(void **)&a.name = dlsym(lib, #name)) && !missing) missing = #name;
    SG__MPI_API(X)
#undef X
#define X(field, sym)                                                                              \
    if (!(a.field = dlsym(lib, sym)) && !missing) missing = sym;
    SG__MPI_OBJS(X)
#undef X
    if (missing) {
        dlclose(lib);
        return sg__fail(ctx, SG_ERR_BACKEND_UNAVAILABLE,
                        "sg_comm_create: %s lacks %s; stepgraph "
                        "speaks Open MPI's ABI (MPI 3 or later): point SG_MPI_LIB at Open MPI's "
                        "libmpi.so",
                        path, missing);
    }
    mpi.api = a;
    mpi.lib = lib;
    return SG_OK;
}

static sg_status mpi_fail(sg_ctx *ctx, int rc, const char *call, const char *what) {
    char text[256] = "";
    int len = 0;
    if (mpi.lib) mpi.api.MPI_Error_string(rc, text, &len);
    return sg__fail(ctx, SG_ERR_DRIVER, "%s: %s failed (error %d: %s)", what, call, rc, text);
}

/* Take a hold on MPI, initializing it for the first holder. */
static sg_status acquire(sg_ctx *ctx) {
    pthread_mutex_lock(&mpi.mu);
    sg_status s = load(ctx);
    int flag = 0, fin = 0, provided = 0, rc = 0;
    if (s == SG_OK && mpi.holders == 0 && !mpi.ours) {
        mpi.api.MPI_Initialized(&flag);
        mpi.api.MPI_Finalized(&fin);
        if (fin)
            s = sg__fail(ctx, SG_ERR_UNSUPPORTED,
                         "sg_comm_create: MPI was finalized (when the "
                         "last communicator was destroyed) and cannot start again in this "
                         "process; keep one communicator for the life of the program");
        else if (!flag && (rc = mpi.api.MPI_Init_thread(NULL, NULL, SG__MPI_THREAD_FUNNELED,
                                                        &provided)) != 0)
            s = mpi_fail(ctx, rc, "MPI_Init_thread", "sg_comm_create");
        else
            mpi.ours = !flag;
    }
    if (s == SG_OK) mpi.holders++;
    pthread_mutex_unlock(&mpi.mu);
    return s;
}

static void release(void) {
    pthread_mutex_lock(&mpi.mu);
    if (--mpi.holders == 0 && mpi.ours && !mpi.broken) {
        mpi.api.MPI_Finalize();
        mpi.ours = false;
    }
    pthread_mutex_unlock(&mpi.mu);
}

/* Test req until it completes, or the timeout: then the communicator (and
 * MPI, which cannot cancel a collective) is broken. */
static sg_status wait_req(sg_comm *c, mpi_h req, const char *what, const char *desc) {
    double deadline = now_s() + c->timeout_s;
    char status[64]; /* room for any MPI_Status */
    for (long spins = 0;; spins++) {
        int done = 0, rc = mpi.api.MPI_Test(&req, &done, status);
        if (rc) return mpi_fail(c->ctx, rc, "MPI_Test", what);
        if (done) return SG_OK;
        if (now_s() > deadline) {
            c->broken = true;
            mpi.broken = true;
            return sg__fail(c->ctx, SG_ERR_DRIVER,
                            "%s of %s: rank %d of %d waited %.1f s for "
                            "the other ranks; a rank died or is not calling the same collectives "
                            "in the same order (the timeout is sg_comm_opts.timeout_s or "
                            "SG_COMM_TIMEOUT); this communicator is broken, exit the process",
                            what, desc, c->rank, c->size, c->timeout_s);
        }
        if (spins > 2000) nanosleep(&(struct timespec){0, 20 * 1000}, NULL);
    }
}

typedef struct mpi_comm {
    mpi_h comm;
    float *tmp; /* f32 room for f16/bf16 reductions: send, then receive */
    size_t tmp_bytes;
} mpi_comm;

/* The f32 buffer of at least n floats. */
static float *tmp_floats(sg_comm *c, int64_t n) {
    mpi_comm *m = c->state;
    size_t bytes = sizeof(float) * (size_t)n;
    if (bytes > m->tmp_bytes) {
        float *p = sg__alloc(c->ctx, bytes);
        if (!p) return NULL;
        sg__free(c->ctx, m->tmp, m->tmp_bytes);
        m->tmp = p, m->tmp_bytes = bytes;
    }
    return m->tmp;
}

static void to_f32(float *dst, const void *src, sg_dtype dt, int64_t n) {
    const uint16_t *h = src;
    for (int64_t i = 0; i < n; i++) dst[i] = dt == SG_F16 ? sg__h2f(h[i]) : sg__bf2f(h[i]);
}

static void from_f32(void *dst, const float *src, sg_dtype dt, int64_t n) {
    uint16_t *h = dst;
    for (int64_t i = 0; i < n; i++) h[i] = dt == SG_F16 ? sg__f2h(src[i]) : sg__f2bf(src[i]);
}

/* ALL_REDUCE and REDUCE_SCATTER: n elements in, n / size out. */
static sg_status reduce(sg_comm *c, const sg__node *n, const char *desc) {
    mpi_comm *m = c->state;
    const char *what = sg__op_name(n->op);
    sg_dtype dt = n->in[0]->dtype;
    int64_t cnt = sg__comm_count(n), ocnt = n->op == SG__OP_ALL_REDUCE ? cnt : cnt / c->size;
    void *src = sg__data(n->in[0]), *dst = sg__data(n->out);
    bool half = dt == SG_F16 || dt == SG_BF16;
    mpi_h type = dt == SG_I32 ? mpi.api.t_int : dt == SG_I64 ? mpi.api.t_llong : mpi.api.t_float;
    float *t = NULL;
    if (half) {
        if (!(t = tmp_floats(c, cnt + ocnt)))
            return sg__fail(c->ctx, SG_ERR_OOM, "%s of %s: out of host memory", what, desc);
        to_f32(t, src, dt, cnt);
    }
    const void *send = half ? t : src == dst ? SG__MPI_IN_PLACE : src;
    float *recv = half ? t + cnt : dst;
    mpi_h req = NULL;
    int rc = n->op == SG__OP_ALL_REDUCE
                 ? mpi.api.MPI_Iallreduce(send, recv, (int)cnt, type, mpi.api.op_sum, m->comm, &req)
                 : mpi.api.MPI_Ireduce_scatter_block(send, recv, (int)ocnt, type, mpi.api.op_sum,
                                                     m->comm, &req);
    if (rc)
        return mpi_fail(c->ctx, rc,
                        n->op == SG__OP_ALL_REDUCE ? "MPI_Iallreduce" : "MPI_Ireduce_scatter_block",
                        what);
    sg_status s = wait_req(c, req, what, desc);
    if (s != SG_OK) return s;
    if (n->i[1] == SG_REDUCE_MEAN) { /* floats only (checked by the front-end) */
        float k = 1.0f / (float)c->size;
        for (int64_t i = 0; i < ocnt; i++) recv[i] *= k;
    }
    if (half) from_f32(dst, recv, dt, ocnt);
    return SG_OK;
}

static sg_status mpi_run(sg_comm *c, const sg__node *n) {
    mpi_comm *m = c->state;
    char desc[SG__DESC];
    sg__describe(n->in[0], desc, sizeof desc);
    const char *what = sg__op_name(n->op);
    size_t bytes = (size_t)sg__comm_count(n) * sg_dtype_size(n->in[0]->dtype);
    int64_t limit = 2147483647; /* MPI counts are int */
    if ((int64_t)bytes > limit || (int64_t)bytes * c->size > limit * 2)
        return sg__fail(c->ctx, SG_ERR_UNSUPPORTED,
                        "%s of %s: more than 2^31 bytes in one MPI "
                        "call; split the tensor",
                        what, desc);
    if (n->op == SG__OP_ALL_REDUCE || n->op == SG__OP_REDUCE_SCATTER) return reduce(c, n, desc);
    void *src = sg__data(n->in[0]), *dst = sg__data(n->out);
    mpi_h req = NULL;
    int rc;
    if (n->op == SG__OP_ALL_GATHER) {
        rc = mpi.api.MPI_Iallgather(src, (int)bytes, mpi.api.t_byte, dst, (int)bytes,
                                    mpi.api.t_byte, m->comm, &req);
    } else { /* BROADCAST: the root's x into out, then out from the root */
        if (c->rank == n->i[1] && dst != src) memcpy(dst, src, bytes);
        rc = mpi.api.MPI_Ibcast(dst, (int)bytes, mpi.api.t_byte, (int)n->i[1], m->comm, &req);
    }
    if (rc)
        return mpi_fail(c->ctx, rc, n->op == SG__OP_ALL_GATHER ? "MPI_Iallgather" : "MPI_Ibcast",
                        what);
    return wait_req(c, req, what, desc);
}

static void mpi_destroy(sg_comm *c) {
    mpi_comm *m = c->state;
    if (!m) return;
    /* A broken communicator may have a collective in flight: leave it to the exit. */
    if (m->comm && !c->broken) mpi.api.MPI_Comm_free(&m->comm);
    sg__free(c->ctx, m->tmp, m->tmp_bytes);
    sg__free(c->ctx, m, sizeof *m);
    c->state = NULL;
    release();
}

static const sg__comm_impl mpi_impl = {"mpi", mpi_run, NULL, mpi_destroy};

sg_status sg__mpi_comm_init(sg_comm *c, const sg__comm_env *env) {
    sg_ctx *ctx = c->ctx;
    sg_status s = acquire(ctx);
    if (s != SG_OK) return s;
    mpi_comm *m = sg__calloc(ctx, sizeof *m);
    if (!m) {
        release();
        return sg__fail(ctx, SG_ERR_OOM, "sg_comm_create: out of host memory");
    }
    c->state = m;
    c->impl = &mpi_impl;
    int rank = -1, size = 0, rc = mpi.api.MPI_Comm_dup(mpi.api.world, &m->comm);
    if (rc) s = mpi_fail(ctx, rc, "MPI_Comm_dup", "sg_comm_create");
    if (s == SG_OK) mpi.api.MPI_Comm_set_errhandler(m->comm, mpi.api.errors_return);
    if (s == SG_OK && ((rc = mpi.api.MPI_Comm_rank(m->comm, &rank)) ||
                       (rc = mpi.api.MPI_Comm_size(m->comm, &size))))
        s = mpi_fail(ctx, rc, "MPI_Comm_rank/size", "sg_comm_create");
    if (s == SG_OK && (rank != env->rank || size != env->size))
        s = sg__fail(ctx, SG_ERR_INVALID_ARG,
                     "sg_comm_create: MPI says rank %d of %d, the "
                     "environment or opts say rank %d of %d; leave sg_comm_opts.size at 0 under "
                     "mpirun",
                     rank, size, env->rank, env->size);
    if (s != SG_OK) mpi_destroy(c);
    return s;
}

sg_status sg__mpi_bcast_bytes(sg_ctx *ctx, void *buf, size_t n, double timeout_s) {
    sg_status s = acquire(ctx);
    if (s != SG_OK) return s;
    sg_comm tmp = {.ctx = ctx, .timeout_s = timeout_s};
    mpi_h req = NULL;
    int rc = mpi.api.MPI_Ibcast(buf, (int)n, mpi.api.t_byte, 0, mpi.api.world, &req);
    s = rc ? mpi_fail(ctx, rc, "MPI_Ibcast", "sg_comm_create")
           : wait_req(&tmp, req, "sg_comm_create", "NCCL's unique id");
    if (s != SG_OK) release();
    return s;
}

void sg__mpi_release(void) { release(); }
