/* SPDX-License-Identifier: MIT */
/*
 * pool.c -- the context's static pool: one region from the backend (host
 * memory on the CPU, one device allocation on a GPU), laid out as shared
 * scratch followed by blocks. It only grows, and only when a capture asks:
 * replays never allocate. A released block's record is reused by the next
 * block, so the records stay as many as the blocks alive at once.
 */
#include "memory.h"

static size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

static sg_status pool_get(sg_ctx *ctx, sg__pool **out) {
    if (!ctx->pool) {
        ctx->pool = sg__calloc(ctx, sizeof *ctx->pool);
        if (!ctx->pool) return sg__fail(ctx, SG_ERR_OOM, "memory pool: out of host memory");
    }
    *out = ctx->pool;
    return SG_OK;
}

/* Lay out scratch and the used blocks (plus one of `extra` bytes) afresh. */
static size_t layout(const sg__pool *p, size_t scratch, size_t *offsets, size_t extra) {
    size_t at = round_up(scratch, SG__POOL_ALIGN);
    for (int b = 0; b < p->nblocks; b++) {
        if (!p->blocks[b].used) continue;
        offsets[b] = at;
        at += round_up(p->blocks[b].size, SG__POOL_ALIGN);
    }
    offsets[p->nblocks] = at;
    return at + round_up(extra, SG__POOL_ALIGN);
}

sg_status sg__pool_reserve(sg_ctx *ctx, size_t scratch, size_t size, int *block) {
    sg__pool *p = NULL;
    sg_status s = pool_get(ctx, &p);
    if (s != SG_OK) return s;
    if (scratch < p->scratch) scratch = p->scratch;
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
    size_t *offsets = sg__alloc(ctx, sizeof(size_t) * (size_t)(p->nblocks + 1));
    if (!offsets) return sg__fail(ctx, SG_ERR_OOM, "memory pool: out of host memory");
    size_t need = layout(p, scratch, offsets, size);
    bool same_layout = scratch == p->scratch;
    for (int b = 0; same_layout && b < p->nblocks; b++)
        if (p->blocks[b].used && offsets[b] != p->blocks[b].offset) same_layout = false;
    if (need > p->size || !same_layout) {
        void *base = NULL;
        if (sg__dev_alloc(ctx, need, &base) != SG_OK) {
            sg__free(ctx, offsets, sizeof(size_t) * (size_t)(p->nblocks + 1));
            return sg__fail(ctx, SG_ERR_OOM,
                            "memory pool: out of %s memory growing the pool to "
                            "%zu bytes (from %zu); free tensors or compile fewer shapes",
                            ctx->exec.name, need, p->size);
        }
        /* Blocks hold outputs still valid: carry their bytes over. */
        for (int b = 0; b < p->nblocks; b++)
            if (p->blocks[b].used && p->blocks[b].size)
                ctx->exec.copy(ctx, (char *)base + offsets[b],
                               (char *)p->base + p->blocks[b].offset, p->blocks[b].size);
        if (p->base) sg__dev_free(ctx, p->base, p->size);
        p->base = base;
        p->size = need;
        p->generation++;
    }
    for (int b = 0; b < p->nblocks; b++)
        if (p->blocks[b].used) p->blocks[b].offset = offsets[b];
    p->scratch = scratch;
    size_t nofs = (size_t)(p->nblocks + 1);
    if (size) {
        p->blocks[slot] =
            (sg__pool_block){.offset = offsets[p->nblocks], .size = size, .used = true};
        if (slot == p->nblocks) p->nblocks++;
        *block = slot;
    }
    sg__free(ctx, offsets, sizeof(size_t) * nofs);
    return SG_OK;
}

void sg__pool_release(sg_ctx *ctx, int block) {
    if (ctx->pool && block >= 0 && block < ctx->pool->nblocks)
        ctx->pool->blocks[block].used = false;
}

void *sg__pool_addr(sg_ctx *ctx, int block, size_t off) {
    sg__pool *p = ctx->pool;
    size_t at = block < 0 ? 0 : p->blocks[block].offset;
    return (char *)p->base + at + off;
}

void sg__pool_destroy(sg_ctx *ctx) {
    sg__pool *p = ctx->pool;
    if (!p) return;
    if (p->base) sg__dev_free(ctx, p->base, p->size);
    sg__free(ctx, p->blocks, sizeof *p->blocks * (size_t)p->cap);
    sg__free(ctx, p, sizeof *p);
    ctx->pool = NULL;
}
