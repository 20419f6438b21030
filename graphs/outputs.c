/* SPDX-License-Identifier: MIT */
/*
 * outputs.c -- a compiled fn's outputs: its fixed output sets (each holds
 * one call's outputs), which set a call writes, what becomes stale when a
 * set is overwritten (its handles and every view of the storages it made),
 * and the ring of output handles the fn hands out. The rules are the ones
 * stepgraph.h states under "Outputs"; picking a set costs O(output_sets).
 */
#include "graphs.h"

#include <stdio.h>

#define SG__RING 64 /* output handles kept per output before one is reused */

/* ------------------------------------------------------------ output handles */

static sg_status fifo_push(sg_fn *fn, sg_tensor *t) {
    if (fn->fifo_len == fn->fifo_cap) {
        int ncap = fn->fifo_cap ? fn->fifo_cap * 2 : 64;
        sg_tensor **nf = sg__alloc(fn->ctx, sizeof *nf * (size_t)ncap);
        if (!nf) return sg__fail(fn->ctx, SG_ERR_OOM, "call: out of host memory for handles");
        for (int i = 0; i < fn->fifo_len; i++) nf[i] = fn->fifo[(fn->fifo_head + i) % fn->fifo_cap];
        sg__free(fn->ctx, fn->fifo, sizeof *nf * (size_t)(fn->fifo_cap ? fn->fifo_cap : 1));
        fn->fifo = nf;
        fn->fifo_cap = ncap;
        fn->fifo_head = 0;
    }
    fn->fifo[(fn->fifo_head + fn->fifo_len++) % fn->fifo_cap] = t;
    return SG_OK;
}

/* Make n more handles, all free. */
static sg_status add_handles(sg_fn *fn, int n) {
    sg_ctx *ctx = fn->ctx;
    if (fn->nhandles + n > fn->cap_handles) {
        int ncap = fn->cap_handles ? fn->cap_handles : 64;
        while (ncap < fn->nhandles + n) ncap *= 2;
        sg_tensor **nh = sg__alloc(ctx, sizeof *nh * (size_t)ncap);
        if (!nh) return sg__fail(ctx, SG_ERR_OOM, "call: out of host memory for handles");
        if (fn->handles) {
            memcpy(nh, fn->handles, sizeof *nh * (size_t)fn->nhandles);
            sg__free(ctx, fn->handles, sizeof *nh * (size_t)fn->cap_handles);
        }
        fn->handles = nh;
        fn->cap_handles = ncap;
    }
    for (int i = 0; i < n; i++) {
        sg_tensor *t = sg__handle_alloc(ctx);
        if (!t) return sg__fail(ctx, SG_ERR_OOM, "call: out of host memory for handles");
        t->fn_owned = true;
        t->magic = SG__TENSOR_DEAD;
        fn->handles[fn->nhandles++] = t;
        sg_status s = fifo_push(fn, t);
        if (s != SG_OK) return s;
    }
    return SG_OK;
}

/* A free handle over st with the given geometry. */
static sg_tensor *take_handle(sg_fn *fn, const sg__ref *geom, sg__storage *st, int64_t offset) {
    if (fn->fifo_len == 0 && add_handles(fn, fn->nout * 8) != SG_OK) return NULL;
    sg_tensor *t = fn->fifo[fn->fifo_head];
    fn->fifo_head = (fn->fifo_head + 1) % fn->fifo_cap;
    fn->fifo_len--;
    if (t->st && t->st->refs < (1 << 29)) sg__storage_unref(fn->ctx, t->st);
    t->magic = SG__TENSOR_LIVE;
    t->id = ++fn->ctx->next_id;
    t->src = t->id;
    t->dtype = geom->dtype;
    t->ndim = geom->ndim;
    memcpy(t->shape, geom->shape, sizeof t->shape);
    memcpy(t->stride, geom->stride, sizeof t->stride);
    t->offset = offset;
    t->st = st;
    st->refs++;
    t->st_gen = st->gen;
    return t;
}

/* ------------------------------------------------------------ sets */

sg_status sg__outputs_init(sg_fn *fn) {
    sg_ctx *ctx = fn->ctx;
    size_t n = (size_t)fn->nout;
    fn->sets = sg__calloc(ctx, sizeof *fn->sets * (size_t)fn->nsets);
    if (!fn->sets) return SG_ERR_OOM;
    for (int j = 0; j < fn->nsets; j++) {
        sg__outset *set = &fn->sets[j];
        set->cur = sg__calloc(ctx, sizeof *set->cur * n);
        set->produced = sg__calloc(ctx, sizeof *set->produced * n);
        set->st = sg__calloc(ctx, sizeof *set->st * n);
        set->base = sg__calloc(ctx, sizeof *set->base * n);
        /* Never freed through refs: handles only point here to read `gen`. */
        set->stale.refs = 1 << 30;
        set->stale.gen = 1;
        if (!set->cur || !set->produced || !set->st || !set->base) return SG_ERR_OOM;
    }
    return add_handles(fn, fn->nout * SG__RING);
}

/* Invalidate what a set holds: its handles, and its storages with every
 * view of them (whether or not the handles were released). */
static void set_invalidate(sg_fn *fn, sg__outset *set, uint32_t call) {
    sg_ctx *ctx = fn->ctx;
    set->stale.overwritten_in = call;
    for (int i = 0; i < fn->nout; i++) {
        sg__storage *st = set->st[i];
        if (st) {
            st->gen++;
            st->overwritten_in = call;
            sg__storage_unref(ctx, st);
            set->st[i] = NULL;
        }
        sg_tensor *h = set->cur[i];
        if (!h) continue;
        if (h->st && h->st->refs < (1 << 29)) sg__storage_unref(ctx, h->st);
        h->st = &set->stale;
        h->st_gen = 0;
        set->cur[i] = NULL;
        fifo_push(fn, h); /* cannot fail: the fifo has room for every handle */
    }
}

void sg__outputs_free(sg_fn *fn) {
    sg_ctx *ctx = fn->ctx;
    size_t n = (size_t)fn->nout;
    for (int j = 0; fn->sets && j < fn->nsets; j++)
        if (fn->sets[j].cur && fn->sets[j].st) set_invalidate(fn, &fn->sets[j], 0);
    /* Handles the user may still hold go to the context's quarantine, so a
     * later use is reported rather than a crash. */
    for (int h = 0; h < fn->nhandles; h++) {
        sg_tensor *t = fn->handles[h];
        if (t->st && t->st->refs < (1 << 29)) sg__storage_unref(ctx, t->st);
        t->st = NULL;
        sg__tensor_bury(t);
    }
    for (int j = 0; fn->sets && j < fn->nsets; j++) {
        sg__outset *set = &fn->sets[j];
        sg__free(ctx, set->cur, sizeof *set->cur * n);
        sg__free(ctx, set->produced, sizeof *set->produced * n);
        sg__free(ctx, set->st, sizeof *set->st * n);
        sg__free(ctx, set->base, sizeof *set->base * n);
    }
    sg__free(ctx, fn->sets, sizeof *fn->sets * (size_t)fn->nsets);
    fn->sets = NULL;
    sg__free(ctx, fn->handles,
             sizeof *fn->handles * (size_t)(fn->cap_handles ? fn->cap_handles : 1));
    sg__free(ctx, fn->fifo, sizeof *fn->fifo * (size_t)(fn->fifo_cap ? fn->fifo_cap : 1));
    fn->handles = fn->fifo = NULL;
    fn->nhandles = fn->cap_handles = fn->fifo_len = fn->fifo_cap = 0;
}

/* Something valid is left in the set: a live handle, or a view (or any
 * other reference) of a storage it made. */
static bool set_holds_valid(const sg__outset *set, int nout) {
    for (int i = 0; i < nout; i++) {
        const sg_tensor *h = set->cur[i];
        if (h && h->magic == SG__TENSOR_LIVE && h->st && h->st_gen == h->st->gen) return true;
        if (set->st[i] && set->st[i]->refs > set->base[i]) return true;
    }
    return false;
}

static bool set_holds_input(const sg__outset *set, int nout, int nin, sg_tensor *const *in) {
    for (int i = 0; i < nout; i++)
        for (int k = 0; set->st[i] && k < nin; k++)
            if (in[k]->st == set->st[i]) return true;
    return false;
}

/* With user steps: the lowest set not used in this step (or holding nothing
 * valid), else the one of the step's oldest call; -1 if every set holds an input. */
static int pick_stepped(sg_fn *fn, sg_tensor *const *in) {
    uint32_t step = fn->ctx->step;
    int oldest = -1;
    for (int j = 0; j < fn->nsets; j++) {
        const sg__outset *set = &fn->sets[j];
        if (set_holds_input(set, fn->nout, fn->nin, in)) continue;
        if (!set->used || set->used_step != step || !set_holds_valid(set, fn->nout)) return j;
        if (oldest < 0 || set->call < fn->sets[oldest].call) oldest = j;
    }
    if (oldest >= 0 && !fn->said_recycle) {
        fn->said_recycle = true;
        sg__log(fn->ctx, "perf_hints",
                "fn '%s': more than %d calls in one step: call %llu overwrites the outputs of "
                "call %llu of the same step; raise sg_compile_opts.output_sets to keep them all",
                fn->name, fn->nsets, (unsigned long long)fn->stats.calls,
                (unsigned long long)fn->sets[oldest].call);
    }
    return oldest;
}

/* Without user steps: each call is its own step. A set whose outputs and
 * views were all released is reused first (one set serves a loop that
 * releases its outputs); else sets in turn. */
static int pick_plain(sg_fn *fn, sg_tensor *const *in) {
    for (int j = 0; j < fn->nsets; j++) {
        const sg__outset *set = &fn->sets[j];
        if (set->used && !set_holds_valid(set, fn->nout) &&
            !set_holds_input(set, fn->nout, fn->nin, in))
            return j;
    }
    for (int t = 0; t < fn->nsets; t++) {
        int j = (fn->cursor + t) % fn->nsets;
        if (set_holds_input(&fn->sets[j], fn->nout, fn->nin, in)) continue;
        fn->cursor = (j + 1) % fn->nsets;
        return j;
    }
    return -1;
}

static sg_status no_set(sg_fn *fn) {
    return sg__fail(fn->ctx, SG_ERR_INVALID_ARG,
                    "sg_call: fn '%s': each of its %d output sets holds an input of this "
                    "call, so no set can take its outputs; pass sg_clone of the outputs you "
                    "feed back, or raise sg_compile_opts.output_sets",
                    fn->name, fn->nsets);
}

sg_status sg__outputs_check(sg_fn *fn, sg_tensor *const *in) {
    for (int j = 0; j < fn->nsets; j++)
        if (!set_holds_input(&fn->sets[j], fn->nout, fn->nin, in)) return SG_OK;
    return no_set(fn);
}

sg_status sg__outputs_pick(sg_fn *fn, sg_tensor *const *in, int *out) {
    int j = fn->ctx->step > 0 ? pick_stepped(fn, in) : pick_plain(fn, in);
    if (j < 0) return no_set(fn);
    sg__outset *set = &fn->sets[j];
    if (set->used && set_holds_valid(set, fn->nout)) fn->stats.recycled_sets++;
    set_invalidate(fn, set, (uint32_t)fn->stats.calls);
    set->used = false;
    *out = j;
    return SG_OK;
}

sg_status sg__outputs_put(sg_fn *fn, int si, int i, const sg__ref *geom, sg__storage *st,
                          int64_t offset, bool produced) {
    sg__outset *set = &fn->sets[si];
    set->produced[i] = produced;
    if (produced) {
        set->st[i] = st;
        st->refs++;
    }
    set->cur[i] = take_handle(fn, geom, st, offset);
    return set->cur[i] ? SG_OK : fn->ctx->status;
}

void sg__outputs_publish(sg_fn *fn, int si, sg_tensor **out) {
    sg__outset *set = &fn->sets[si];
    /* What a storage is held by besides this set's handles: the set's own
     * refs and the fn's (a plan's output buffer); more means a view. */
    for (int i = 0; i < fn->nout; i++) {
        if (!set->st[i]) continue;
        int handles = 0;
        for (int k = 0; k < fn->nout; k++) handles += set->cur[k] && set->cur[k]->st == set->st[i];
        set->base[i] = set->st[i]->refs - handles;
    }
    set->used = true;
    set->used_step = fn->ctx->step;
    set->call = fn->stats.calls;
    for (int i = 0; i < fn->nout; i++) out[i] = set->cur[i];
}
