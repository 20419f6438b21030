/* SPDX-License-Identifier: MIT */
/*
 * memory.h -- the internal header of memory/: the liveness planner that
 * gives every intermediate of a capture an offset in one arena (and wide
 * unaligned matrices padded rows), and the context's static pool that holds
 * those arenas on the backend's device.
 *
 * The pool is scratch plus blocks, each its own allocation. Scratch is
 * shared by the intermediates of every compiled fn of the context (fns
 * replay one after another on one stream, so their intermediates never live
 * at once); blocks hold what must outlive a replay (a fn's output sets) and
 * never move. Scratch grows only when a capture needs more; growing moves
 * it (its old bytes are given back first, so the pool never holds both), so
 * its users re-point their storages afterwards (sg__pool_addr gives current
 * addresses).
 */
#ifndef SG_MEMORY_H
#define SG_MEMORY_H

#include "../capture/capture.h"

#define SG__POOL_ALIGN 256

/* One buffer to place: bytes, and the first and last node that use it. */
typedef struct sg__buf {
    size_t size;
    int first, last;
    size_t offset; /* out */
} sg__buf;

/*
 * Place n buffers so that two whose [first, last + gap] ranges intersect
 * never share a byte, nor any buffer of at most 64 bytes with another
 * (plan.c; gap: nodes after its last use before a buffer's bytes may be
 * another's, so that a write does not wait for a recent reader):
 * greedy by size (largest first), each at the best-fitting gap among the
 * buffers already placed that it conflicts with; an empty buffer takes no
 * bytes (offset 0). Offsets are multiples of align. *total gets the arena
 * size. SG_ERR_OOM on host memory.
 */
SG__HIDDEN sg_status sg__plan(sg_ctx *ctx, sg__buf *bufs, int n, size_t align, int gap,
                              size_t *total);
/* The largest sum of sizes live at one node (what no plan can go under). */
SG__HIDDEN size_t sg__plan_peak(const sg__buf *bufs, int n);

/* A row of n elements of es bytes, padded to whole 16-byte units. */
static inline int64_t sg__pad_row_len(int64_t n, size_t es) {
    int64_t per = 16 / (int64_t)es;
    return (n + per - 1) / per * per;
}

/*
 * Padded rows (pad.c): every internal buffer of ir that holds a matrix
 * whose rows are not a multiple of 16 bytes, written by a matmul or
 * cross_entropy's gradient and read only by ops that take strides (matmul,
 * linear, cross_entropy and its gradient), gets rows of sg__pad_row_len
 * elements: the slot grows and the strides of its refs step padded rows.
 * Never a step output. *npadded gets how many buffers it padded;
 * SG_ERR_OOM on host memory. SG_PAD_ROWS=0 turns it off.
 */
SG__HIDDEN sg_status sg__pad_rows(sg_ctx *ctx, sg__ir *ir, int *npadded);

typedef struct sg__pool_block {
    void *base;
    size_t size;
    bool used;
} sg__pool_block;

typedef struct sg__pool {
    void *base;     /* scratch */
    size_t size;    /* bytes held: scratch and the used blocks */
    size_t scratch; /* bytes of scratch, shared by all plans */
    sg__pool_block *blocks;
    int nblocks, cap;
    int generation; /* bumped each time scratch moves */
} sg__pool;

/*
 * Make room: scratch of at least `scratch` bytes and, if size > 0, a new
 * block of `size` bytes whose id goes to *block. Scratch may move (the
 * generation changes; also when growing it failed, and then it keeps its
 * old size): re-point every storage with sg__pool_addr after.
 */
SG__HIDDEN sg_status sg__pool_reserve(sg_ctx *ctx, size_t scratch, size_t size, int *block);
/* Give a block back to the backend. */
SG__HIDDEN void sg__pool_release(sg_ctx *ctx, int block);
/* Give scratch back (no plan needs it any more); the generation changes. */
SG__HIDDEN void sg__pool_drop_scratch(sg_ctx *ctx);
/* The address of byte `off` of a block (block -1: scratch). */
SG__HIDDEN void *sg__pool_addr(sg_ctx *ctx, int block, size_t off);
SG__HIDDEN void sg__pool_destroy(sg_ctx *ctx);

#endif /* SG_MEMORY_H */
