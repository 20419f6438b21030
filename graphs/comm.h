/* SPDX-License-Identifier: MIT */
/*
 * comm.h -- the internal header of communicators (see "distributed" in
 * stepgraph.h). comm.c owns sg_comm itself: the launch environment, the
 * choice of engine, the dispatch of COMM nodes, the TCP rendezvous for
 * NCCL's unique id, and the one-rank engine (copies). The engines are
 * graphs/cpu/cpu_comm.c (MPI, loaded at run time) and
 * graphs/cuda/cuda_comm.c (NCCL, loaded at run time).
 */
#ifndef SG_COMM_H
#define SG_COMM_H

#include "backend.h"

/* What one engine does for a communicator (sg_comm.impl). */
typedef struct sg__comm_impl {
    const char *name;                                /* "mpi", "nccl", "single" */
    sg_status (*run)(sg_comm *c, const sg__node *n); /* one COMM node */
    sg_status (*sync)(sg_comm *c);                   /* NULL: the context's synchronize */
    void (*destroy)(sg_comm *c);                     /* frees c->state */
} sg__comm_impl;

/* The launch, from sg_comm_opts and the environment. */
typedef struct sg__comm_env {
    int rank, size, local_rank;
    bool named;     /* opts or the environment named a launch (else: one rank, no engine) */
    bool mpirun;    /* launched by mpirun: Open MPI's or PMI's variables are set */
    char addr[256]; /* MASTER_ADDR (or opts) */
    int port;       /* the rendezvous port (see stepgraph.h) */
    double timeout_s;
    const char *bad; /* the first launch variable set to something else than a number */
} sg__comm_env;

/* MPI (graphs/cpu/cpu_comm.c). Make c an MPI communicator (a duplicate of
 * MPI_COMM_WORLD), initializing MPI on first use. */
SG__HIDDEN sg_status sg__mpi_comm_init(sg_comm *c, const sg__comm_env *env);
/* For NCCL's bootstrap under mpirun: take a hold on MPI (initialized on
 * first use) and broadcast n bytes from rank 0 over MPI_COMM_WORLD within
 * the timeout. On success the hold stays until sg__mpi_release (MPI is
 * finalized with the last holder); on failure it is let go. */
SG__HIDDEN sg_status sg__mpi_bcast_bytes(sg_ctx *ctx, void *buf, size_t n, double timeout_s);
SG__HIDDEN void sg__mpi_release(void);

/* NCCL (graphs/cuda/cuda_comm.c): make c a NCCL communicator on ctx's device. */
SG__HIDDEN sg_status sg__nccl_comm_init(sg_comm *c, const sg__comm_env *env);

/* Rank 0 sends n bytes to every other rank over TCP at env->addr:env->port
 * (rank 0 listens there); everything within env->timeout_s. */
SG__HIDDEN sg_status sg__comm_tcp_bcast(sg_ctx *ctx, const sg__comm_env *env, void *buf, size_t n);

/* Run one COMM node (the executors' COMM family). */
SG__HIDDEN sg_status sg__comm_run(sg_ctx *ctx, const sg__node *n);
/* Destroy every communicator of ctx (sg_ctx_destroy, before the backend goes). */
SG__HIDDEN void sg__comm_destroy_all(sg_ctx *ctx);

/* Whether a capture holds a collective: such a step must not be run again
 * for tuning (max-autotune), since every rank must make the same calls. */
SG__HIDDEN bool sg__comm_in_ir(const sg__ir *ir);

/* A collective's element count and bytes, and its buffers (out == in for
 * all_reduce_). */
SG__HIDDEN int64_t sg__comm_count(const sg__node *n);

#endif /* SG_COMM_H */
