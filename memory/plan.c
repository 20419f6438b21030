/* SPDX-License-Identifier: MIT */
/*
 * plan.c -- the liveness planner: offsets for a capture's intermediates in
 * one arena, sharing bytes between buffers whose lifetimes do not overlap.
 * Greedy by size with best fit, as in TFLite's arena planner: large buffers
 * first, each into the smallest gap left by the buffers it conflicts with.
 */
#include "memory.h"

static size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

/* A buffer of at most TINY bytes (a step's scalars: a loss, an optimizer's
 * bias corrections) shares its bytes with no other: reused bytes order the
 * kernels that touch them on a device (lanes.c), and a kernel that reads
 * only the step's inputs should not wait for the last reader of a dead
 * value to write a few bytes. */
#define TINY 64

static bool tiny(const sg__buf *b) { return b->size && b->size <= TINY; }

static bool overlaps(const sg__buf *a, const sg__buf *b, int gap) {
    if (!a->size || !b->size) return false;
    if (tiny(a) || tiny(b)) return true;
    return a->first <= b->last + gap && b->first <= a->last + gap;
}

/* Insertion sorts: n is a capture's buffer count, small enough. */
static void sort_by_size(const sg__buf *bufs, int *order, int n) {
    for (int i = 1; i < n; i++) {
        int v = order[i], j = i;
        /* Ties by first use keep plans deterministic. */
        while (j > 0 && (bufs[order[j - 1]].size < bufs[v].size ||
                         (bufs[order[j - 1]].size == bufs[v].size &&
                          bufs[order[j - 1]].first > bufs[v].first))) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = v;
    }
}

static void sort_by_offset(const sg__buf *bufs, int *ids, int n) {
    for (int i = 1; i < n; i++) {
        int v = ids[i], j = i;
        while (j > 0 && bufs[ids[j - 1]].offset > bufs[v].offset) {
            ids[j] = ids[j - 1];
            j--;
        }
        ids[j] = v;
    }
}

sg_status sg__plan(sg_ctx *ctx, sg__buf *bufs, int n, size_t align, int gap, size_t *total) {
    *total = 0;
    if (n == 0) return SG_OK;
    int *order = sg__alloc(ctx, sizeof(int) * (size_t)n * 2);
    if (!order) return sg__fail(ctx, SG_ERR_OOM, "memory plan: out of host memory");
    int *conflict = order + n;
    for (int i = 0; i < n; i++) order[i] = i;
    sort_by_size(bufs, order, n);
    size_t end = 0;
    for (int k = 0; k < n; k++) {
        sg__buf *b = &bufs[order[k]];
        if (b->size == 0) { /* no bytes to keep apart (these come last) */
            b->offset = 0;
            continue;
        }
        size_t size = round_up(b->size, align);
        int nc = 0;
        for (int j = 0; j < k; j++)
            if (overlaps(&bufs[order[j]], b, gap)) conflict[nc++] = order[j];
        sort_by_offset(bufs, conflict, nc);
        size_t prev_end = 0, best = SIZE_MAX, best_gap = SIZE_MAX;
        for (int j = 0; j < nc; j++) {
            const sg__buf *c = &bufs[conflict[j]];
            if (c->offset >= prev_end && c->offset - prev_end >= size &&
                c->offset - prev_end < best_gap) {
                best = prev_end;
                best_gap = c->offset - prev_end;
            }
            size_t c_end = c->offset + round_up(c->size, align);
            if (c_end > prev_end) prev_end = c_end;
        }
        b->offset = best != SIZE_MAX ? best : prev_end;
        if (b->offset + size > end) end = b->offset + size;
    }
    sg__free(ctx, order, sizeof(int) * (size_t)n * 2);
    *total = end;
    return SG_OK;
}

size_t sg__plan_peak(const sg__buf *bufs, int n) {
    size_t peak = 0;
    int last = 0;
    for (int i = 0; i < n; i++)
        if (bufs[i].last > last) last = bufs[i].last;
    for (int t = 0; t <= last; t++) {
        size_t live = 0;
        for (int i = 0; i < n; i++)
            if (bufs[i].first <= t && t <= bufs[i].last) live += bufs[i].size;
        if (live > peak) peak = live;
    }
    return peak;
}
