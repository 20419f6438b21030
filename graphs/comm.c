/* SPDX-License-Identifier: MIT */
/*
 * comm.c -- communicators (see "distributed" in stepgraph.h and comm.h):
 * reading the launch environment (mpirun's or torchrun's variables),
 * choosing the engine (MPI on the CPU, NCCL on CUDA, plain copies for one
 * rank that no launcher started), dispatching COMM nodes to it by the
 * communicator's id, and the small TCP rendezvous that carries NCCL's
 * unique id from rank 0 to the others when no mpirun is there to do it.
 */
#include "comm.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------ the environment */

/* An integer environment variable: true and *v when it is set and valid.
 * One set to anything else (empty, "abc", "4x", past 2^30) is named in
 * e->bad, the first such, so that sg_comm_create refuses the launch rather
 * than run as one process. */
static bool env_int(sg__comm_env *e, const char *name, int *v) {
    const char *s = getenv(name);
    if (!s) return false;
    char *end;
    errno = 0;
    long x = strtol(s, &end, 10);
    if (!*s || *end || errno || x < -1 || x > 1 << 30) {
        if (!e->bad) e->bad = name;
        return false;
    }
    *v = (int)x;
    return true;
}

/* The first of three (rank, size, local rank) variable names that is set. */
static bool env_triple(sg__comm_env *e, const char *rank, const char *size, const char *local) {
    int r, s;
    bool hs = env_int(e, size, &s), hr = env_int(e, rank, &r);
    if (!hs || !hr) return false;
    e->rank = r, e->size = s;
    if (!local || !env_int(e, local, &e->local_rank)) e->local_rank = 0;
    return true;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static sg_status read_env(sg_ctx *ctx, const sg_comm_opts *o, sg__comm_env *e) {
    memset(e, 0, sizeof *e);
    if (o && (o->size < 0 || o->master_port < 0 || o->master_port > 65535 || !(o->timeout_s >= 0) ||
              o->timeout_s > 1e9))
        return sg__fail(ctx, SG_ERR_INVALID_ARG,
                        "sg_comm_create: opts has size %d, master_port %d, timeout_s %g; the size "
                        "must be >= 0, the port in [0, 65535], the timeout in [0, 1e9] seconds (0 "
                        "for each: the environment's)",
                        o->size, o->master_port, o->timeout_s);
    e->size = 1;
    e->mpirun = env_triple(e, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                           "OMPI_COMM_WORLD_LOCAL_RANK") ||
                env_triple(e, "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID");
    e->named = e->mpirun || env_triple(e, "RANK", "WORLD_SIZE", "LOCAL_RANK");
    if (o && o->size > 0) {
        e->rank = o->rank, e->size = o->size, e->named = true;
        if (!env_int(e, "LOCAL_RANK", &e->local_rank)) e->local_rank = 0;
    }
    if (e->size < 1 || e->rank < 0 || e->rank >= e->size)
        return sg__fail(ctx, SG_ERR_INVALID_ARG,
                        "sg_comm_create: rank %d of %d ranks is out of "
                        "range (from %s); the rank must lie in [0, size)",
                        e->rank, e->size, o && o->size > 0 ? "sg_comm_opts" : "the environment");
    const char *addr = o && o->master_addr ? o->master_addr : getenv("MASTER_ADDR");
    snprintf(e->addr, sizeof e->addr, "%s", addr && *addr ? addr : "127.0.0.1");
    int port = 0;
    if (o && o->master_port > 0) {
        port = o->master_port;
    } else if (!env_int(e, "SG_COMM_PORT", &port) && env_int(e, "MASTER_PORT", &port)) {
        /* torchrun's agent may serve its own store on MASTER_PORT. */
        const char *agent = getenv("TORCHELASTIC_USE_AGENT_STORE");
        if (agent && !strcmp(agent, "True")) port++;
    }
    e->port = port;
    const char *t = getenv("SG_COMM_TIMEOUT");
    char *end = NULL;
    double ts = t ? strtod(t, &end) : 600;
    if (t && (!*t || *end || !(ts > 0) || ts > 1e9) && !e->bad) e->bad = "SG_COMM_TIMEOUT";
    e->timeout_s = o && o->timeout_s > 0 ? o->timeout_s : ts; /* a bad ts fails below */
    if (e->bad)
        return sg__fail(ctx, SG_ERR_INVALID_ARG,
                        "sg_comm_create: %s is '%s', not %s; set it as the launcher would, or "
                        "unset it",
                        e->bad, getenv(e->bad),
                        strcmp(e->bad, "SG_COMM_TIMEOUT") == 0 ? "a positive number of seconds"
                                                               : "a whole number in [-1, 2^30]");
    return SG_OK;
}

bool sg__comm_in_ir(const sg__ir *ir) {
    for (int i = 0; i < ir->nnodes; i++)
        if (sg__op_family(ir->nodes[i].op) == SG__FAM_COMM) return true;
    return false;
}

/* ------------------------------------------------------------ one rank */

int64_t sg__comm_count(const sg__node *n) { return sg__numel(n->in[0]->ndim, n->in[0]->shape); }

/* One rank: every collective gives x back (a copy unless in place). */
static sg_status single_run(sg_comm *c, const sg__node *n) {
    void *dst = sg__data(n->out), *src = sg__data(n->in[0]);
    size_t bytes = (size_t)sg__comm_count(n) * sg_dtype_size(n->in[0]->dtype);
    return dst == src || !bytes ? SG_OK : c->ctx->exec.copy(c->ctx, dst, src, bytes);
}

static void single_destroy(sg_comm *c) { (void)c; }

static const sg__comm_impl single_impl = {"single", single_run, NULL, single_destroy};

/* ------------------------------------------------------------ communicators */

sg_status sg_comm_create(sg_ctx *ctx, const sg_comm_opts *opts, sg_comm **out) {
    if (!ctx || !out) return SG_ERR_NULL;
    sg__comm_env env;
    sg_status s = read_env(ctx, opts, &env);
    if (s != SG_OK) return s;
    sg_comm *c = sg__calloc(ctx, sizeof *c);
    if (!c) return sg__fail(ctx, SG_ERR_OOM, "sg_comm_create: out of host memory");
    c->ctx = ctx;
    c->rank = env.rank, c->size = env.size, c->local_rank = env.local_rank;
    c->timeout_s = env.timeout_s;
    c->impl = &single_impl;
    if (!env.named) {
        s = SG_OK;
    } else if (ctx->backend == SG_BACKEND_CPU) {
        if (env.mpirun)
            s = sg__mpi_comm_init(c, &env);
        else if (env.size > 1)
            s = sg__fail(ctx, SG_ERR_BACKEND_UNAVAILABLE,
                         "sg_comm_create: %d ranks on the CPU backend need MPI, and this "
                         "process was not started by mpirun; launch it with mpirun -np %d "
                         "(torchrun's variables cannot start MPI)",
                         env.size, env.size);
    } else if (ctx->backend == SG_BACKEND_CUDA) {
        s = sg__nccl_comm_init(c, &env);
    } else {
        s = sg__fail(ctx, SG_ERR_UNSUPPORTED,
                     "sg_comm_create: no collective engine for the %s "
                     "backend",
                     sg_backend_name(ctx->backend));
    }
    if (s != SG_OK) {
        sg__free(ctx, c, sizeof *c);
        return s;
    }
    c->magic = SG__COMM_LIVE;
    sg__reg_add(ctx, &c->reg, c, SG__REG_COMM);
    c->id = ++ctx->next_comm_id;
    c->next = ctx->comms;
    ctx->comms = c;
    sg__log(ctx, "perf_hints", "communicator %u: rank %d of %d (local %d) over %s", c->id, c->rank,
            c->size, c->local_rank, c->impl->name);
    *out = c;
    return SG_OK;
}

/* Unlisted from its context, its engine's state dropped, its memory freed. */
static void comm_free(sg_comm *c) {
    sg_ctx *ctx = c->ctx;
    sg__reg_remove(ctx, &c->reg);
    for (sg_comm **p = &ctx->comms; *p; p = &(*p)->next)
        if (*p == c) {
            *p = c->next;
            break;
        }
    c->impl->destroy(c);
    c->magic = 0;
    sg__free(ctx, c, sizeof *c);
}

/* A communicator of a destroyed context went with it: found in a live
 * context's registry before anything of c is read, else nothing to do. */
void sg_comm_destroy(sg_comm *c) {
    if (c && sg__reg_find(c, SG__REG_COMM)) comm_free(c);
}

void sg__comm_destroy_all(sg_ctx *ctx) {
    while (ctx->comms) comm_free(ctx->comms);
}

int sg_comm_rank(const sg_comm *c) { return c && c->magic == SG__COMM_LIVE ? c->rank : -1; }
int sg_comm_size(const sg_comm *c) { return c && c->magic == SG__COMM_LIVE ? c->size : 0; }
int sg_comm_local_rank(const sg_comm *c) {
    return c && c->magic == SG__COMM_LIVE ? c->local_rank : -1;
}

sg_status sg_comm_synchronize(sg_comm *c) {
    if (!c) return SG_ERR_NULL;
    if (c->magic != SG__COMM_LIVE) return SG_ERR_INVALID_ARG;
    return c->impl->sync ? c->impl->sync(c) : sg_ctx_synchronize(c->ctx);
}

sg_status sg__comm_run(sg_ctx *ctx, const sg__node *n) {
    sg_comm *c = ctx->comms;
    while (c && (int64_t)c->id != n->i[0]) c = c->next;
    if (!c)
        return sg__fail(ctx, SG_ERR_INVALID_ARG,
                        "%s: its communicator (id %lld) was destroyed; "
                        "destroy the compiled steps that use a communicator before it",
                        sg__op_name(n->op), (long long)n->i[0]);
    if (c->broken)
        return sg__fail(ctx, SG_ERR_DRIVER,
                        "%s: communicator %u (rank %d of %d) failed earlier "
                        "and cannot run collectives any more; the job must restart",
                        sg__op_name(n->op), c->id, c->rank, c->size);
    return c->impl->run(c, n);
}

/* ------------------------------------------------------------ TCP rendezvous */

/*
 * NCCL needs its 128-byte unique id, made by rank 0, on every rank before
 * any NCCL call. torchrun provides no transport for it besides the address
 * of rank 0 (MASTER_ADDR:MASTER_PORT), so rank 0 listens there and sends the
 * id to each rank that connects: one short TCP exchange per rank at
 * startup, the same job torch's TCPStore does. Nothing else goes over it.
 * Every wait is bounded by the timeout, so a rank that never comes (or
 * a rank 0 that died) is an error, not a hang. Framing: the peer sends
 * "SGC1", its rank and the size (so a stray client is refused), rank 0
 * answers with the bytes.
 */

/* Wait until fd is ready for events or the deadline passes. */
static bool wait_fd(int fd, short events, double deadline) {
    for (;;) {
        double left = deadline - now_s();
        if (left <= 0) return false;
        struct pollfd p = {.fd = fd, .events = events};
        int r = poll(&p, 1, (int)(left * 1e3) + 1);
        if (r > 0) return true;
        if (r < 0 && errno != EINTR) return false;
    }
}

/* Move n bytes through fd (send when out) before the deadline. */
static bool io_all(int fd, void *buf, size_t n, bool out, double deadline) {
    char *p = buf;
    while (n) {
        if (!wait_fd(fd, out ? POLLOUT : POLLIN, deadline)) return false;
        ssize_t k = out ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
        if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (k <= 0) return false;
        p += k, n -= (size_t)k;
    }
    return true;
}

static sg_status tcp_serve(sg_ctx *ctx, const sg__comm_env *e, void *buf, size_t n,
                           double deadline) {
    int ls = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1, served = 0;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)e->port)};
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    if (ls < 0 || setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) ||
        bind(ls, (struct sockaddr *)&a, sizeof a) || listen(ls, 64)) {
        int err = errno;
        if (ls >= 0) close(ls);
        return sg__fail(ctx, SG_ERR_DRIVER,
                        "sg_comm_create: rank 0 cannot listen on port %d "
                        "for the rendezvous: %s; pick a free MASTER_PORT (or SG_COMM_PORT)",
                        e->port, strerror(err));
    }
    bool *seen = sg__calloc(ctx, (size_t)e->size);
    while (seen && served < e->size - 1 && wait_fd(ls, POLLIN, deadline)) {
        int fd = accept(ls, NULL, NULL);
        if (fd < 0) continue;
        int32_t hello[3];
        if (io_all(fd, hello, sizeof hello, false, deadline) && !memcmp(hello, "SGC1", 4) &&
            hello[2] == e->size && hello[1] > 0 && hello[1] < e->size && !seen[hello[1]] &&
            io_all(fd, buf, n, true, deadline)) {
            seen[hello[1]] = true;
            served++;
        }
        close(fd);
    }
    close(ls);
    sg__free(ctx, seen, (size_t)e->size);
    if (served == e->size - 1) return SG_OK;
    return sg__fail(ctx, SG_ERR_DRIVER,
                    "sg_comm_create: rank 0 heard from %d of the other %d "
                    "ranks on port %d within %.0f s; a rank failed to start, or the ranks disagree "
                    "on MASTER_ADDR/MASTER_PORT/WORLD_SIZE (SG_COMM_TIMEOUT sets the wait)",
                    served, e->size - 1, e->port, e->timeout_s);
}

/* One connection attempt to rank 0 before the deadline; -1 when it failed. */
static int tcp_connect(const struct addrinfo *ai, double deadline) {
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return -1;
    int r = connect(fd, ai->ai_addr, ai->ai_addrlen), err = 0;
    socklen_t len = sizeof err;
    if (r == 0 || (errno == EINPROGRESS && wait_fd(fd, POLLOUT, deadline) &&
                   !getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) && !err))
        return fd;
    close(fd);
    return -1;
}

static sg_status tcp_fetch(sg_ctx *ctx, const sg__comm_env *e, void *buf, size_t n,
                           double deadline) {
    char port[16];
    snprintf(port, sizeof port, "%d", e->port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    int gr = getaddrinfo(e->addr, port, &hints, &ai);
    if (gr)
        return sg__fail(ctx, SG_ERR_DRIVER,
                        "sg_comm_create: rank %d cannot resolve MASTER_ADDR "
                        "'%s': %s",
                        e->rank, e->addr, gai_strerror(gr));
    bool ok = false;
    while (!ok && now_s() < deadline) {
        int fd = tcp_connect(ai, deadline);
        if (fd < 0) { /* rank 0 is not listening yet */
            nanosleep(&(struct timespec){0, 100 * 1000 * 1000}, NULL);
            continue;
        }
        int32_t hello[3] = {0, e->rank, e->size};
        memcpy(hello, "SGC1", 4);
        ok = io_all(fd, hello, sizeof hello, true, deadline) && io_all(fd, buf, n, false, deadline);
        close(fd);
    }
    freeaddrinfo(ai);
    if (ok) return SG_OK;
    return sg__fail(ctx, SG_ERR_DRIVER,
                    "sg_comm_create: rank %d got nothing from rank 0 at "
                    "%s:%d within %.0f s; rank 0 failed or has not started, or MASTER_ADDR/"
                    "MASTER_PORT differ between ranks (SG_COMM_TIMEOUT sets the wait)",
                    e->rank, e->addr, e->port, e->timeout_s);
}

sg_status sg__comm_tcp_bcast(sg_ctx *ctx, const sg__comm_env *e, void *buf, size_t n) {
    if (e->port <= 0 || e->port > 65535)
        return sg__fail(ctx, SG_ERR_INVALID_ARG,
                        "sg_comm_create: %d ranks without mpirun need "
                        "MASTER_ADDR and MASTER_PORT (as torchrun sets them), or "
                        "sg_comm_opts.master_addr/master_port",
                        e->size);
    double deadline = now_s() + e->timeout_s;
    return e->rank == 0 ? tcp_serve(ctx, e, buf, n, deadline) : tcp_fetch(ctx, e, buf, n, deadline);
}
