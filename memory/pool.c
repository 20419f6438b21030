/* SPDX-License-Identifier: MIT */
/*
 * pool.c -- the context's static pool: scratch, one allocation from the
 * backend (host memory on the CPU, device memory on a GPU) shared by every
 * plan, and blocks, one allocation each. It grows only when a capture asks:
 * replays never allocate. Scratch holds nothing between replays, so growing
 * it gives the old bytes back before taking the new ones (the pool never
 * holds both); blocks hold outputs still valid and never move. A released
 * block is given back at once and its record reused by the next block, so
 * the records stay as many as the blocks alive at once.
 */
#include "memory.h"

static sg_status pool_get(sg_ctx *ctx, sg__pool **out) {
    if (!ctx->pool) {
        ctx->pool = sg__calloc(ctx, sizeof *ctx->pool);
        if (!ctx->pool) return sg__fail(ctx, SG_ERR_OOM, "memory pool: out of host memory");
    }
    *out = ctx->pool;
    return SG_OK;
}

static sg_status out_of_memory(sg_ctx *ctx, const char *what, size_t bytes, const sg__pool *p) {
    return sg__fail(ctx, SG_ERR_OOM,
                    "memory pool: out of %s memory for %s of %zu bytes (the pool holds %zu); "
                    "free tensors or compile fewer shapes",
                    ctx->exec.name, what, bytes, p->size);
}

/*
 * Scratch of `scratch` bytes in place of the present one. The old bytes go
 * first; should the new ones not come, the old size is taken again (what
 * was just given back), so that the plans already made keep their scratch.
 * Either way scratch moved: its generation changes.
 */
static sg_status grow_scratch(sg_ctx *ctx, sg__pool *p, size_t scratch) {
    size_t old = p->scratch;
    if (p->base) sg__dev_free(ctx, p->base, old);
    p->base = NULL;
    p->size -= old;
    p->scratch = 0;
    p->generation++;
    void *base = NULL;
    if (sg__dev_alloc(ctx, scratch, &base) == SG_OK) {
        p->base = base;
        p->scratch = scratch;
        p->size += scratch;
        return SG_OK;
    }
    if (old && sg__dev_alloc(ctx, old, &base) == SG_OK) {
        p->base = base;
        p->scratch = old;
        p->size += old;
    }
    return out_of_memory(ctx, "scratch", scratch, p);
}

sg_status sg__pool_reserve(sg_ctx *ctx, size_t scratch, size_t size, int *block) {
    sg__pool *p = NULL;
    sg_status s = pool_get(ctx, &p);
    if (s != SG_OK) return s;
    int slot = p->nblocks; /* the record the new block takes: a released one, or a new one */
    for (int b = 0; size && b < p->nblocks; b++)
        if (!p->blocks[b].used) {
            slot = b;
            break;
        }
    /* Room for the block record first, so that failure below changes nothing. */
    if (size && slot == p->nblocks && p->nblocks == p->cap) {
        int ncap = p->cap ? p->cap * 2 : 8;
        sg__pool_block *nb = sg__alloc(ctx, sizeof *nb * (size_t)ncap);
        if (!nb) return sg__fail(ctx, SG_ERR_OOM, "memory pool: out of host memory");
        if (p->blocks) {
            memcpy(nb, p->blocks, sizeof *nb * (size_t)p->nblocks);
            sg__free(ctx, p->blocks, sizeof *nb * (size_t)p->cap);
        }
        p->blocks = nb;
        p->cap = ncap;
    }
    if (scratch > p->scratch && (s = grow_scratch(ctx, p, scratch)) != SG_OK) return s;
    if (!size) return SG_OK;
    void *base = NULL;
    if (sg__dev_alloc(ctx, size, &base) != SG_OK)
        return out_of_memory(ctx, "an output set", size, p);
    p->blocks[slot] = (sg__pool_block){.base = base, .size = size, .used = true};
    if (slot == p->nblocks) p->nblocks++;
    p->size += size;
    *block = slot;
    return SG_OK;
}

void sg__pool_release(sg_ctx *ctx, int block) {
    sg__pool *p = ctx->pool;
    if (!p || block < 0 || block >= p->nblocks || !p->blocks[block].used) return;
    sg__dev_free(ctx, p->blocks[block].base, p->blocks[block].size);
    p->size -= p->blocks[block].size;
    p->blocks[block] = (sg__pool_block){.base = NULL, .size = 0, .used = false};
}

void sg__pool_drop_scratch(sg_ctx *ctx) {
    sg__pool *p = ctx->pool;
    if (!p || !p->base) return;
    sg__dev_free(ctx, p->base, p->scratch);
    p->size -= p->scratch;
    p->base = NULL;
    p->scratch = 0;
    p->generation++;
}

void *sg__pool_addr(sg_ctx *ctx, int block, size_t off) {
    sg__pool *p = ctx->pool;
    return (char *)(block < 0 ? p->base : p->blocks[block].base) + off;
}

void sg__pool_destroy(sg_ctx *ctx) {
    sg__pool *p = ctx->pool;
    if (!p) return;
    for (int b = 0; b < p->nblocks; b++) sg__pool_release(ctx, b);
    sg__pool_drop_scratch(ctx);
    sg__free(ctx, p->blocks, sizeof *p->blocks * (size_t)p->cap);
    sg__free(ctx, p, sizeof *p);
    ctx->pool = NULL;
}
