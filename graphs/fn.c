/*
 * fn.c -- compiled steps: sg_compile, sg_call and sg_mark_step_begin. A call
 * finds the capture whose guard key matches its inputs (or captures anew,
 * or falls back to eager with a logged reason), picks an output set that
 * holds nothing still valid, invalidates what that set held, replays, and
 * hands out fresh output handles from the fn's ring.
 */
#include "graphs.h"

#include <stdio.h>
#include <stdlib.h>

#define SG__RING 64 /* output handles kept per output before one is reused */

const char *sg_mode_name(sg_mode m) {
    switch (m) {
    case SG_MODE_EAGER: return "eager";
    case SG_MODE_DEFAULT: return "default";
    case SG_MODE_REDUCE_OVERHEAD: return "reduce-overhead";
    case SG_MODE_MAX_AUTOTUNE: return "max-autotune";
    case SG_MODE_MAX_AUTOTUNE_NO_GRAPHS: return "max-autotune-no-cudagraphs";
    }
    return "?";
}

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
        sg_tensor *t = sg__calloc(ctx, sizeof *t);
        if (!t) return sg__fail(ctx, SG_ERR_OOM, "call: out of host memory for handles");
        t->ctx = ctx;
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

/* A set holds nothing valid: every handle released or already stale. */
static bool set_free(const sg__outset *set, int nout) {
    for (int i = 0; i < nout; i++) {
        const sg_tensor *h = set->cur ? set->cur[i] : NULL;
        if (h && h->magic == SG__TENSOR_LIVE && h->st && h->st_gen == h->st->gen) return false;
    }
    return true;
}

static bool set_holds_input(const sg__outset *set, int nout, int nin, sg_tensor *const *in) {
    for (int i = 0; i < nout; i++) {
        const sg_tensor *h = set->cur ? set->cur[i] : NULL;
        if (!h || !set->produced[i] || h->magic != SG__TENSOR_LIVE) continue;
        for (int k = 0; k < nin; k++)
            if (in[k]->st == h->st) return true;
    }
    return false;
}

/* Invalidate what a set holds: its handles and the views made of them. */
static void set_invalidate(sg_fn *fn, sg__outset *set) {
    sg_ctx *ctx = fn->ctx;
    if (!set->cur) return;
    set->stale.overwritten_in = ctx->step;
    for (int i = 0; i < fn->nout; i++) {
        sg_tensor *h = set->cur[i];
        if (!h) continue;
        if (h->st && set->produced[i] && h->st_gen == h->st->gen) {
            h->st->gen++;
            h->st->overwritten_in = ctx->step;
        }
        if (h->st && h->st->refs < (1 << 29)) sg__storage_unref(ctx, h->st);
        h->st = &set->stale;
        h->st_gen = 0;
        set->cur[i] = NULL;
        fifo_push(fn, h); /* cannot fail: the fifo holds every handle already */
    }
}

/* The set a call uses: the lowest that holds nothing valid this step and no input. */
static sg_status pick_set(sg_fn *fn, sg_tensor *const *in, int *out) {
    sg_ctx *ctx = fn->ctx;
    for (int j = 0; j < fn->nsets; j++) {
        sg__outset *set = &fn->sets[j];
        bool reusable = !set->used || set->used_step != ctx->step || set_free(set, fn->nout);
        if (reusable && !set_holds_input(set, fn->nout, fn->nin, in)) {
            *out = j;
            return SG_OK;
        }
    }
    int n = fn->nsets + 1;
    sg__outset *ns = sg__calloc(ctx, sizeof *ns * (size_t)n);
    sg_tensor **cur = sg__calloc(ctx, sizeof *cur * (size_t)(fn->nout ? fn->nout : 1));
    bool *produced = sg__calloc(ctx, sizeof *produced * (size_t)(fn->nout ? fn->nout : 1));
    if (!ns || !cur || !produced) {
        sg__free(ctx, ns, sizeof *ns * (size_t)n);
        sg__free(ctx, cur, sizeof *cur * (size_t)(fn->nout ? fn->nout : 1));
        sg__free(ctx, produced, sizeof *produced * (size_t)(fn->nout ? fn->nout : 1));
        return sg__fail(ctx, SG_ERR_OOM, "call: out of host memory for an output set");
    }
    if (fn->sets) {
        memcpy(ns, fn->sets, sizeof *ns * (size_t)fn->nsets);
        /* Handles point at each set's `stale` storage: move them along. */
        for (int j = 0; j < fn->nsets; j++)
            for (int h = 0; h < fn->nhandles; h++)
                if (fn->handles[h]->st == &fn->sets[j].stale) fn->handles[h]->st = &ns[j].stale;
        sg__free(ctx, fn->sets, sizeof *ns * (size_t)fn->nsets);
    }
    /* Never freed: handles only point here to read `gen` and the step. */
    ns[fn->nsets].stale.refs = 1 << 30;
    ns[fn->nsets].stale.gen = 1;
    ns[fn->nsets].cur = cur;
    ns[fn->nsets].produced = produced;
    fn->sets = ns;
    *out = fn->nsets++;
    if (fn->nsets == 16 && !fn->said_sets) {
        fn->said_sets = true;
        sg__log(ctx, "perf_hints",
                "fn '%s' holds 16 output sets: call sg_mark_step_begin once "
                "per step, or sg_release outputs when done, so that calls can reuse them",
                fn->name);
    }
    return SG_OK;
}

/* ------------------------------------------------------------ compile */

static void fn_link(sg_fn *fn) {
    fn->next = fn->ctx->fns;
    fn->ctx->fns = fn;
}

static void fn_unlink(sg_fn *fn) {
    for (sg_fn **p = &fn->ctx->fns; *p; p = &(*p)->next)
        if (*p == fn) {
            *p = fn->next;
            return;
        }
}

sg_status sg_compile(sg_ctx *ctx, sg_step_fn step, void *user, int nin, int nout,
                     const sg_compile_opts *opts, sg_fn **out) {
    if (!ctx) return SG_ERR_NULL;
    if (!out)
        return sg__fail(ctx, SG_ERR_NULL,
                        "sg_compile: fn is NULL; pass an sg_fn pointer's address");
    if (!step)
        return sg__fail(ctx, SG_ERR_NULL, "sg_compile: step is NULL; pass the step function");
    if (nin < 0 || nout < 1 || nin > 4096 || nout > 4096)
        return sg__fail(ctx, SG_ERR_INVALID_ARG,
                        "sg_compile: nin %d and nout %d must be in "
                        "[0, 4096] and [1, 4096]",
                        nin, nout);
    sg_compile_opts o = opts ? *opts : (sg_compile_opts){0};
    if ((unsigned)o.mode > SG_MODE_MAX_AUTOTUNE_NO_GRAPHS)
        return sg__fail(ctx, SG_ERR_INVALID_ARG, "sg_compile: mode %d is not an sg_mode",
                        (int)o.mode);
    if (o.cache_size_limit < 0)
        return sg__fail(ctx, SG_ERR_INVALID_ARG,
                        "sg_compile: cache_size_limit %d is negative; "
                        "0 means the default (8)",
                        o.cache_size_limit);
    if (o.cache_size_limit == 0) o.cache_size_limit = 8;
    sg_fn *fn = sg__calloc(ctx, sizeof *fn);
    if (!fn) return sg__fail(ctx, SG_ERR_OOM, "sg_compile: out of host memory");
    fn->magic = SG__FN_LIVE;
    fn->ctx = ctx;
    fn->step = step;
    fn->user = user;
    fn->nin = nin;
    fn->nout = nout;
    fn->opts = o;
    snprintf(fn->name, sizeof fn->name, "%s", o.name ? o.name : "step");
    fn->opts.name = NULL;
    fn->graphs = sg__calloc(ctx, sizeof *fn->graphs * (size_t)o.cache_size_limit);
    if (!fn->graphs || add_handles(fn, nout * SG__RING) != SG_OK) {
        sg_fn_destroy(fn);
        return sg__fail(ctx, SG_ERR_OOM, "sg_compile: out of host memory for %d output handles",
                        nout * SG__RING);
    }
    fn_link(fn);
    *out = fn;
    return SG_OK;
}

/* ------------------------------------------------------------ running the step */

/* Drop every handle made since `mark` (ids are increasing along the live list). */
static void drop_step_handles(sg_ctx *ctx, uint32_t mark) {
    while (ctx->live.prev != &ctx->live && ctx->live.prev->id > mark)
        sg__tensor_drop(ctx->live.prev);
}

/* Run the user's step; on success tmp holds nout live outputs. */
static sg_status run_step(sg_fn *fn, sg_tensor *const *in, sg_tensor **tmp) {
    sg_ctx *ctx = fn->ctx;
    for (int i = 0; i < fn->nout; i++) tmp[i] = NULL;
    sg_status before = ctx->status;
    sg_status s = fn->step(ctx, in, tmp, fn->user);
    if (s != SG_OK) {
        if (ctx->status == before || ctx->msg[0] == '\0')
            sg__fail(ctx, s, "fn '%s': the step returned %s", fn->name, sg_status_str(s));
        return s;
    }
    for (int i = 0; i < fn->nout; i++) {
        if (!tmp[i] || tmp[i]->magic != SG__TENSOR_LIVE) {
            sg_status why = ctx->status != SG_OK ? ctx->status : SG_ERR_NULL;
            return sg__fail(ctx, why, "fn '%s': the step returned SG_OK but left output %d %s%s%s",
                            fn->name, i, tmp[i] ? "released" : "NULL",
                            ctx->status != SG_OK ? "; the first failure in it: " : "",
                            ctx->status != SG_OK ? ctx->msg : "");
        }
        if (tmp[i]->ctx != ctx)
            return sg__fail(ctx, SG_ERR_WRONG_CONTEXT,
                            "fn '%s': output %d belongs to another "
                            "context",
                            fn->name, i);
    }
    return SG_OK;
}

/* Hand out the outputs of an eager run through set `si`. */
static sg_status publish_eager(sg_fn *fn, int si, sg_tensor **tmp, uint32_t mark, sg_tensor **out) {
    sg__outset *set = &fn->sets[si];
    set_invalidate(fn, set);
    for (int i = 0; i < fn->nout; i++) {
        sg__ref geom = {.dtype = tmp[i]->dtype, .ndim = tmp[i]->ndim};
        memcpy(geom.shape, tmp[i]->shape, sizeof geom.shape);
        memcpy(geom.stride, tmp[i]->stride, sizeof geom.stride);
        /* A handle made by this call owns its storage's fate; one from outside doesn't. */
        set->produced[i] = tmp[i]->st->born > mark;
        set->cur[i] = take_handle(fn, &geom, tmp[i]->st, tmp[i]->offset);
        if (!set->cur[i]) return fn->ctx->status;
    }
    set->used = true;
    set->used_step = fn->ctx->step;
    for (int i = 0; i < fn->nout; i++) out[i] = set->cur[i];
    return SG_OK;
}

static sg_status call_eager(sg_fn *fn, sg_tensor *const *in, sg_tensor **out) {
    sg_ctx *ctx = fn->ctx;
    sg_tensor *tmp[fn->nout];
    uint32_t mark = ctx->next_id;
    int si;
    sg_status s = run_step(fn, in, tmp);
    if (s == SG_OK) s = pick_set(fn, in, &si);
    if (s == SG_OK) s = publish_eager(fn, si, tmp, mark, out);
    drop_step_handles(ctx, mark);
    fn->eager_calls++;
    return s;
}

/* ------------------------------------------------------------ guards */

static void make_key(int nin, sg_tensor *const *in, sg__argkey *key) {
    for (int k = 0; k < nin; k++) {
        const sg_tensor *t = in[k];
        sg__argkey *a = &key[k];
        memset(a, 0, sizeof *a);
        a->dtype = t->dtype;
        a->ndim = t->ndim;
        memcpy(a->shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
        memcpy(a->stride, t->stride, sizeof(int64_t) * (size_t)t->ndim);
        a->alias = -1;
        for (int j = 0; j < k; j++)
            if (in[j]->st == t->st) {
                a->alias = j;
                a->alias_off = t->offset - in[j]->offset;
                break;
            }
    }
}

/* Which guard of g the inputs fail, as text; NULL when they pass. */
static const char *guard_fail(const sg__graph *g, int nin, sg_tensor *const *in, char *buf,
                              size_t size) {
    for (int k = 0; k < nin; k++) {
        const sg_tensor *t = in[k];
        const sg__argkey *a = &g->key[k];
        char x[96], y[96];
        if (t->dtype != a->dtype) {
            snprintf(buf, size, "input %d dtype %s, captured as %s", k, sg_dtype_name(t->dtype),
                     sg_dtype_name(a->dtype));
            return buf;
        }
        if (t->ndim != a->ndim || memcmp(t->shape, a->shape, sizeof(int64_t) * (size_t)t->ndim)) {
            snprintf(buf, size, "input %d shape %s, captured as %s", k,
                     sg__shape_str(t->ndim, t->shape, x, sizeof x),
                     sg__shape_str(a->ndim, a->shape, y, sizeof y));
            return buf;
        }
        if (memcmp(t->stride, a->stride, sizeof(int64_t) * (size_t)t->ndim)) {
            snprintf(buf, size, "input %d strides %s, captured as %s", k,
                     sg__shape_str(t->ndim, t->stride, x, sizeof x),
                     sg__shape_str(a->ndim, a->stride, y, sizeof y));
            return buf;
        }
        int alias = -1;
        int64_t off = 0;
        for (int j = 0; j < k; j++)
            if (in[j]->st == t->st) {
                alias = j;
                off = t->offset - in[j]->offset;
                break;
            }
        if (alias != a->alias || (alias >= 0 && off != a->alias_off)) {
            snprintf(buf, size, "input %d shares storage with %s%d, captured %s%d", k,
                     alias < 0 ? "no input" : "input ", alias,
                     a->alias < 0 ? "with none" : "with input ", a->alias);
            return buf;
        }
    }
    for (int s = 0; s < g->ir.nslots; s++) {
        const sg__slot *sl = &g->ir.slots[s];
        /* Only the fns pin it: the user let go of this parameter. */
        if (sl->kind == SG__SLOT_PARAM && sl->param->refs <= sl->param->pins) {
            snprintf(buf, size, "parameter p%d (%zu bytes) was released by its owner", s,
                     sl->param->nbytes);
            return buf;
        }
    }
    return NULL;
}

/* ------------------------------------------------------------ capture and replay */

static void drop_graph(sg_fn *fn, int gi) {
    sg__graph_free(fn->ctx, fn->graphs[gi]);
    for (int j = gi + 1; j < fn->ngraphs; j++) fn->graphs[j - 1] = fn->graphs[j];
    fn->ngraphs--;
}

static sg_status call_replay(sg_fn *fn, sg__graph *g, sg_tensor *const *in, sg_tensor **out);

/*
 * Whether captures record without executing ("dry"). Running every op as
 * it is recorded would make the first call pay the eager path on top of
 * the compile: on a GPU, every eager kernel family the step touches
 * compiled by NVRTC (seconds on a cold cache); on any device, every
 * intermediate allocated at once (1.6 GB for a 24-op chain over 16M
 * floats, where the plan needs 128 MB). So the capture only records, and
 * the call's results come from the first replay of the compiled plan. A
 * graph break in a dry capture stops the step (nothing before it ran), and
 * the call runs the whole step again eagerly. SG_DRY_CAPTURE=0 makes the
 * capture run the step as it records (its results are then the call's).
 */
static bool dry_capture(const sg_ctx *ctx) {
    (void)ctx;
    const char *e = getenv("SG_DRY_CAPTURE");
    return !(e && strcmp(e, "0") == 0);
}

/* Capture a new graph from this call; the call's results come from the
 * capture run, or, for a dry capture, from the first replay. */
static sg_status call_capture(sg_fn *fn, sg_tensor *const *in, sg_tensor **out) {
    sg_ctx *ctx = fn->ctx;
    sg__graph *g = sg__calloc(ctx, sizeof *g);
    if (!g) return sg__fail(ctx, SG_ERR_OOM, "fn '%s': out of host memory for a capture", fn->name);
    g->key = sg__calloc(ctx, sizeof *g->key * (size_t)(fn->nin ? fn->nin : 1));
    if (!g->key) {
        sg__free(ctx, g, sizeof *g);
        return sg__fail(ctx, SG_ERR_OOM, "fn '%s': out of host memory for a capture", fn->name);
    }
    make_key(fn->nin, in, g->key);
    sg__rec rec;
    sg_tensor *tmp[fn->nout];
    uint32_t mark = ctx->next_id;
    sg_status before = ctx->status;
    char msg[SG__MSG_SIZE];
    snprintf(msg, sizeof msg, "%s", ctx->msg);
    sg_status s = sg__rec_begin(ctx, &rec, &g->ir, fn->nin, in, fn->opts.fullgraph);
    if (s == SG_OK) {
        rec.dry = dry_capture(ctx);
        s = run_step(fn, in, tmp);
        sg_status e = sg__rec_end(ctx, s == SG_OK ? fn->nout : 0, tmp);
        if (s == SG_OK) s = e;
    } else {
        ctx->rec = NULL;
    }
    if (s != SG_OK && rec.dry && rec.broken && !fn->opts.fullgraph) {
        /* Nothing ran: keep the capture as "eager" and run the step for real. */
        drop_step_handles(ctx, mark);
        ctx->status = before;
        snprintf(ctx->msg, sizeof ctx->msg, "%s", msg);
        fn->graphs[fn->ngraphs++] = g;
        g->eager = true;
        snprintf(g->why, sizeof g->why, "%s", rec.why);
        sg__log(ctx, "graph_breaks", "fn '%s': %s", fn->name, rec.why);
        sg__log(ctx, "fallbacks", "fn '%s': capture %d runs eagerly: %s", fn->name, fn->ngraphs,
                rec.why);
        return call_eager(fn, in, out);
    }
    if (s != SG_OK) {
        drop_step_handles(ctx, mark);
        sg__graph_free(ctx, g);
        return s;
    }
    fn->graphs[fn->ngraphs++] = g;
    if (rec.broken) {
        g->eager = true;
        snprintf(g->why, sizeof g->why, "%s", rec.why);
        sg__log(ctx, "graph_breaks", "fn '%s': %s", fn->name, rec.why);
        sg__log(ctx, "fallbacks", "fn '%s': capture %d runs eagerly: %s", fn->name, fn->ngraphs,
                rec.why);
    } else if ((s = sg__graph_build(fn, g)) != SG_OK) {
        g->eager = true;
        snprintf(g->why, sizeof g->why, "the plan could not be built: %.900s", ctx->msg);
        sg__log(ctx, "fallbacks", "fn '%s': capture %d runs eagerly: %s", fn->name, fn->ngraphs,
                g->why);
        sg_clear_error(ctx);
    }
    if (rec.dry) { /* nothing ran yet: the results come from running the plan */
        drop_step_handles(ctx, mark);
        return g->eager ? call_eager(fn, in, out) : call_replay(fn, g, in, out);
    }
    int si;
    s = pick_set(fn, in, &si);
    if (s == SG_OK) s = publish_eager(fn, si, tmp, mark, out);
    drop_step_handles(ctx, mark);
    return s;
}

static sg_status call_replay(sg_fn *fn, sg__graph *g, sg_tensor *const *in, sg_tensor **out) {
    sg_ctx *ctx = fn->ctx;
    int si;
    sg_status s = pick_set(fn, in, &si);
    if (s == SG_OK) s = sg__graph_outbuf(fn, g, si);
    if (s != SG_OK) return s;
    sg__outset *set = &fn->sets[si];
    set_invalidate(fn, set);
    s = sg__graph_replay(fn, g, in, si);
    if (s != SG_OK) return s;
    for (int i = 0; i < fn->nout; i++) {
        const sg__ref *ref = &g->ir.refs[g->ir.out_refs[i]];
        const sg__slot *sl = &g->ir.slots[ref->slot];
        sg__storage *st;
        int64_t off = ref->offset;
        if (sl->kind == SG__SLOT_INPUT) {
            st = in[sl->input]->st;
            off += in[sl->input]->offset;
        } else if (sl->kind == SG__SLOT_PARAM) {
            st = sl->param;
        } else {
            st = g->outbufs[si].st[ref->slot];
        }
        set->produced[i] = sl->kind == SG__SLOT_INTERNAL;
        set->cur[i] = take_handle(fn, ref, st, off);
        if (!set->cur[i]) return ctx->status;
    }
    set->used = true;
    set->used_step = ctx->step;
    for (int i = 0; i < fn->nout; i++) out[i] = set->cur[i];
    return SG_OK;
}

static sg_status check_call(sg_fn *fn, sg_tensor *const *in, int nin, sg_tensor **out, int nout) {
    sg_ctx *ctx = fn->ctx;
    if (nin != fn->nin || nout != fn->nout)
        return sg__fail(ctx, SG_ERR_INVALID_ARG,
                        "sg_call: fn '%s' takes %d inputs and %d outputs, "
                        "not %d and %d",
                        fn->name, fn->nin, fn->nout, nin, nout);
    if (fn->nin && !in)
        return sg__fail(ctx, SG_ERR_NULL,
                        "sg_call: in is NULL but fn '%s' takes "
                        "%d inputs",
                        fn->name, fn->nin);
    if (!out)
        return sg__fail(ctx, SG_ERR_NULL, "sg_call: out is NULL; pass room for %d outputs",
                        fn->nout);
    if (ctx->rec)
        return sg__fail(ctx, SG_ERR_UNSUPPORTED,
                        "sg_call: fn '%s' was called inside "
                        "another step's capture; call the inner step's ops directly",
                        fn->name);
    for (int k = 0; k < fn->nin; k++) {
        const sg_tensor *t = in[k];
        if (!t)
            return sg__fail(ctx, SG_ERR_NULL, "sg_call: input %d of fn '%s' is NULL", k, fn->name);
        if (t->magic == SG__TENSOR_DEAD)
            return sg__fail(ctx, SG_ERR_RELEASED,
                            "sg_call: input %d of fn '%s' (tensor #%u) was "
                            "released",
                            k, fn->name, t->id);
        if (t->magic != SG__TENSOR_LIVE)
            return sg__fail(ctx, SG_ERR_INVALID_ARG,
                            "sg_call: input %d of fn '%s' is not a "
                            "tensor",
                            k, fn->name);
        if (t->ctx != ctx)
            return sg__fail(ctx, SG_ERR_WRONG_CONTEXT,
                            "sg_call: input %d of fn '%s' belongs to "
                            "another context",
                            k, fn->name);
        sg_status s = sg__check_stale(t, "sg_call");
        if (s != SG_OK) return s;
    }
    return SG_OK;
}

/* A destroyed fn's record, or not an fn at all: the status to return. */
static sg_status check_fn(const sg_fn *fn, const char *what) {
    if (!fn) return SG_ERR_NULL;
    if (fn->magic == SG__FN_DEAD)
        return sg__fail(fn->ctx, SG_ERR_RELEASED,
                        "%s: the fn was destroyed with sg_fn_destroy; "
                        "compile the step again",
                        what);
    return fn->magic == SG__FN_LIVE ? SG_OK : SG_ERR_INVALID_ARG;
}

sg_status sg_call(sg_fn *fn, sg_tensor *const *in, int nin, sg_tensor **out, int nout) {
    sg_status s0 = check_fn(fn, "sg_call");
    if (s0 != SG_OK) return s0;
    sg_ctx *ctx = fn->ctx;
    sg_status s = check_call(fn, in, nin, out, nout);
    if (s != SG_OK) return s;
    fn->calls++;
    if (fn->opts.disable || fn->opts.mode == SG_MODE_EAGER) return call_eager(fn, in, out);
    if (fn->opts.dynamic == SG_DYNAMIC_TRUE && !fn->said_dynamic) {
        fn->said_dynamic = true;
        sg__log(ctx, "perf_hints",
                "fn '%s': dynamic=true: captures are specialized per input "
                "shape for now",
                fn->name);
    }
    char why[512] = "";
    for (int gi = 0; gi < fn->ngraphs; gi++) {
        sg__graph *g = fn->graphs[gi];
        const char *miss = guard_fail(g, fn->nin, in, why, sizeof why);
        if (!miss) return g->eager ? call_eager(fn, in, out) : call_replay(fn, g, in, out);
        sg__log(ctx, "guards", "fn '%s': capture %d does not match: %s", fn->name, gi + 1, miss);
        if (strstr(miss, "parameter")) { /* never valid again: make room */
            drop_graph(fn, gi);
            gi--;
        }
    }
    if (fn->ngraphs >= fn->opts.cache_size_limit) {
        if (!fn->said_limit) {
            fn->said_limit = true;
            sg__log(ctx, "fallbacks",
                    "fn '%s': cache_size_limit (%d) reached; new input "
                    "signatures run eagerly (last miss: %s)",
                    fn->name, fn->opts.cache_size_limit, why);
        }
        return call_eager(fn, in, out);
    }
    if (fn->ngraphs > 0 || why[0])
        sg__log(ctx, "recompiles", "fn '%s': recompiling (capture %d of at most %d) because %s",
                fn->name, fn->ngraphs + 1, fn->opts.cache_size_limit, why);
    return call_capture(fn, in, out);
}

sg_status sg_mark_step_begin(sg_ctx *ctx) {
    if (!ctx) return SG_ERR_NULL;
    ctx->step++;
    return SG_OK;
}

sg_status sg_fn_reset(sg_fn *fn) {
    sg_status s = check_fn(fn, "sg_fn_reset");
    if (s != SG_OK) return s;
    while (fn->ngraphs) drop_graph(fn, fn->ngraphs - 1);
    return SG_OK;
}

void sg_fn_destroy(sg_fn *fn) {
    if (!fn || fn->magic != SG__FN_LIVE) return;
    sg_ctx *ctx = fn->ctx;
    fn_unlink(fn);
    for (int j = 0; j < fn->nsets; j++) set_invalidate(fn, &fn->sets[j]);
    sg_fn_reset(fn);
    /* Handles the user may still hold go to the context's quarantine, so a
     * later use is reported rather than a crash. */
    for (int h = 0; h < fn->nhandles; h++) {
        sg_tensor *t = fn->handles[h];
        if (t->st && t->st->refs < (1 << 29)) sg__storage_unref(ctx, t->st);
        t->st = NULL;
        sg__tensor_bury(t);
    }
    for (int j = 0; j < fn->nsets; j++) {
        sg__free(ctx, fn->sets[j].cur, sizeof(sg_tensor *) * (size_t)(fn->nout ? fn->nout : 1));
        sg__free(ctx, fn->sets[j].produced, sizeof(bool) * (size_t)(fn->nout ? fn->nout : 1));
    }
    sg__free(ctx, fn->sets, sizeof *fn->sets * (size_t)(fn->nsets ? fn->nsets : 1));
    sg__free(ctx, fn->handles,
             sizeof *fn->handles * (size_t)(fn->cap_handles ? fn->cap_handles : 1));
    sg__free(ctx, fn->fifo, sizeof *fn->fifo * (size_t)(fn->fifo_cap ? fn->fifo_cap : 1));
    sg__free(ctx, fn->graphs, sizeof *fn->graphs * (size_t)fn->opts.cache_size_limit);
    sg__free(ctx, fn->explain, fn->explain_size);
    /* The record itself stays until the context goes, so that calling a
     * destroyed fn is an error and not a crash. */
    memset(fn, 0, sizeof *fn);
    fn->magic = SG__FN_DEAD;
    fn->ctx = ctx;
    fn->next = ctx->dead_fns;
    ctx->dead_fns = fn;
}

void sg__fns_repoint(sg_ctx *ctx) {
    for (sg_fn *fn = ctx->fns; fn; fn = fn->next)
        for (int gi = 0; gi < fn->ngraphs; gi++)
            if (!fn->graphs[gi]->eager) sg__graph_repoint(ctx, fn->graphs[gi]);
}

void sg__fns_destroy_all(sg_ctx *ctx) {
    while (ctx->fns) sg_fn_destroy(ctx->fns);
    while (ctx->dead_fns) {
        sg_fn *fn = ctx->dead_fns;
        ctx->dead_fns = fn->next;
        sg__free(ctx, fn, sizeof *fn);
    }
}

/* ------------------------------------------------------------ memory stats */

static void add_graph_stats(const sg__graph *g, sg_memory_stats *st) {
    if (g->eager) return;
    st->output_bytes += g->out_bytes * (size_t)g->noutbufs;
    if (g->peak > st->peak_live_bytes) st->peak_live_bytes = g->peak;
    st->unshared_bytes += g->unshared;
    st->captures++;
}

sg_status sg_fn_memory_stats(const sg_fn *fn, sg_memory_stats *st) {
    sg_status s = check_fn(fn, "sg_fn_memory_stats");
    if (s != SG_OK) return s;
    if (!st) return sg__fail(fn->ctx, SG_ERR_NULL, "sg_fn_memory_stats: stats is NULL");
    memset(st, 0, sizeof *st);
    for (int gi = 0; gi < fn->ngraphs; gi++) {
        add_graph_stats(fn->graphs[gi], st);
        if (fn->graphs[gi]->scratch > st->scratch_bytes)
            st->scratch_bytes = fn->graphs[gi]->scratch;
    }
    st->pool_bytes = st->scratch_bytes + st->output_bytes;
    sg_ctx_host_bytes(fn->ctx, &st->host_bytes, NULL);
    return SG_OK;
}

sg_status sg_ctx_memory_stats(const sg_ctx *ctx, sg_memory_stats *st) {
    if (!ctx || !st) return SG_ERR_NULL;
    memset(st, 0, sizeof *st);
    for (const sg_fn *fn = ctx->fns; fn; fn = fn->next)
        for (int gi = 0; gi < fn->ngraphs; gi++) add_graph_stats(fn->graphs[gi], st);
    if (ctx->pool) {
        st->pool_bytes = ctx->pool->size;
        st->scratch_bytes = ctx->pool->scratch;
    }
    sg_ctx_host_bytes(ctx, &st->host_bytes, NULL);
    st->device_bytes = ctx->dev_live;
    st->device_peak_bytes = ctx->dev_peak;
    return SG_OK;
}
