/* SPDX-License-Identifier: MIT */
/*
 * fn.c -- compiled steps: sg_compile, sg_call, sg_mark_step_begin, stances,
 * sg_reset and the counters. A call finds the capture whose guard key
 * matches its inputs (or captures anew, or falls back to eager: an error
 * under strict, else said once and logged), has outputs.c pick the output
 * set it writes, replays, and hands out the set's output handles.
 */
#include "graphs.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#define SG__DEAD_FNS 64 /* destroyed fn records kept to report a later use */

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

/* The most captures a fn may keep (sg_compile_opts.cache_size_limit). */
#define SG__MAX_CACHE_SIZE 65536
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

/* The end of an fn record: out of the registry, then freed. */
static void fn_free(sg_ctx *ctx, sg_fn *fn) {
    sg__reg_remove(ctx, &fn->reg);
    sg__free(ctx, fn, sizeof *fn);
}

/* Free a fn that sg_compile could not finish. The user never saw it nor its
 * handles, so none of it goes to the quarantine or the destroyed fns: a
 * failed sg_compile leaves the context as it found it. */
static void fn_discard(sg_fn *fn) {
    sg_ctx *ctx = fn->ctx;
    fn_unlink(fn);
    for (int h = 0; h < fn->nhandles; h++) sg__handle_free(ctx, fn->handles[h]);
    fn->nhandles = 0;
    sg__outputs_free(fn);
    if (fn->graphs)
        sg__free(ctx, fn->graphs, sizeof *fn->graphs * (size_t)fn->opts.cache_size_limit);
    fn_free(ctx, fn);
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
    if (o.cache_size_limit < 0 || o.cache_size_limit > SG__MAX_CACHE_SIZE)
        return sg__fail(ctx, SG_ERR_INVALID_ARG,
                        "sg_compile: cache_size_limit %d is not in [0, %d]; "
                        "0 means the default (8)",
                        o.cache_size_limit, SG__MAX_CACHE_SIZE);
    if ((unsigned)o.dynamic > SG_DYNAMIC_TRUE)
        return sg__fail(ctx, SG_ERR_INVALID_ARG, "sg_compile: dynamic %d is not an sg_dynamic",
                        (int)o.dynamic);
    if (o.cache_size_limit == 0) o.cache_size_limit = 8;
    if (o.output_sets < 0 || o.output_sets > SG__MAX_OUTPUT_SETS)
        return sg__fail(ctx, SG_ERR_INVALID_ARG,
                        "sg_compile: output_sets %d is not in [0, %d]; 0 means the default (2)",
                        o.output_sets, SG__MAX_OUTPUT_SETS);
    if (o.output_sets == 0) o.output_sets = 2;
    int backend_kind = SG__BACKEND_INDUCTOR;
    if (o.backend_name && strcmp(o.backend_name, "eager") == 0)
        backend_kind = SG__BACKEND_EAGER;
    else if (o.backend_name && strcmp(o.backend_name, "aot_eager") == 0)
        backend_kind = SG__BACKEND_AOT_EAGER;
    else if (o.backend_name && strcmp(o.backend_name, "inductor") != 0)
        return sg__fail(ctx, SG_ERR_INVALID_ARG,
                        "sg_compile: backend_name '%.100s' is none of \"inductor\", \"eager\", "
                        "\"aot_eager\"; for your own backend set backend_fn",
                        o.backend_name);
    if ((unsigned)o.epilogue_fusion > SG_FLAG_FALSE)
        return sg__fail(ctx, SG_ERR_INVALID_ARG, "sg_compile: epilogue_fusion %d is not an sg_flag",
                        (int)o.epilogue_fusion);
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
    fn->opts.backend_name = NULL;
    fn->backend_kind = backend_kind;
    fn->nsets = o.output_sets;
    sg__reg_add(ctx, &fn->reg, fn, SG__REG_FN);
    fn_link(fn);
    fn->graphs = sg__calloc(ctx, sizeof *fn->graphs * (size_t)o.cache_size_limit);
    if (!fn->graphs || sg__outputs_init(fn) != SG_OK) {
        fn_discard(fn);
        return sg__fail(ctx, SG_ERR_OOM,
                        "sg_compile: out of host memory for %d output sets of %d outputs",
                        o.output_sets, nout);
    }
    *out = fn;
    return SG_OK;
}

/* ------------------------------------------------------------ running the step */

/* Drop every handle made since `mark` (ids are increasing along the live list). */
static void drop_step_handles(sg_ctx *ctx, uint32_t mark) {
    while (ctx->live.prev != &ctx->live && ctx->live.prev->id > mark)
        sg__tensor_drop(ctx->live.prev);
}

/* Run step (the user's, or what a custom backend gave); on success tmp
 * holds nout live outputs. */
static sg_status run_step(sg_fn *fn, sg_step_fn step, void *user, sg_tensor *const *in,
                          sg_tensor **tmp) {
    sg_ctx *ctx = fn->ctx;
    for (int i = 0; i < fn->nout; i++) tmp[i] = NULL;
    sg_status before = ctx->status;
    uint64_t fails = ctx->nfails;
    struct sg__step_frame frame = {fn, in, fn->nin, ctx->steps};
    ctx->steps = &frame;
    sg_status s = step(ctx, in, tmp, user);
    ctx->steps = frame.up;
    if (s != SG_OK) {
        /* The step's own failure says why; with none, this does. */
        if ((ctx->nfails == fails && ctx->status == before) || ctx->msg[0] == '\0')
            sg__fail(ctx, s, "fn '%s': the step returned %s", fn->name, sg_status_str(s));
        /* SG_ERR_NULL from a chain of ops that propagated an op's NULL: the
         * call fails with that op's status (SG_ERR_OOM, say), as its message
         * says; an earlier failure left uncleared is not this one. */
        else if (s == SG_ERR_NULL && ctx->nfails != fails)
            s = ctx->last;
        return s;
    }
    for (int i = 0; i < fn->nout; i++) {
        if (!tmp[i] || tmp[i]->magic != SG__TENSOR_LIVE) {
            sg_status why = ctx->nfails != fails ? ctx->last
                            : tmp[i]             ? SG_ERR_RELEASED
                                                 : SG_ERR_NULL;
            char first[SG__MSG_SIZE]; /* the op's own message (formatted apart: ctx->msg is
                                         rewritten) */
            snprintf(first, sizeof first, "%s", ctx->nfails != fails ? ctx->msg : "");
            return sg__fail(ctx, why,
                            "fn '%s': the step returned SG_OK but left output %d %s%s%.900s",
                            fn->name, i, tmp[i] ? "released" : "NULL",
                            first[0] ? "; the first failure in it: " : "", first);
        }
        if (tmp[i]->ctx != ctx)
            return sg__fail(ctx, SG_ERR_WRONG_CONTEXT,
                            "fn '%s': output %d belongs to another "
                            "context",
                            fn->name, i);
    }
    return SG_OK;
}

/* Hand out the outputs of an eager run (tmp, made after `mark`) through a set. */
static sg_status publish_eager(sg_fn *fn, sg_tensor *const *in, sg_tensor **tmp, uint32_t mark,
                               sg_tensor **out) {
    int si;
    sg_status s = sg__outputs_pick(fn, in, &si);
    for (int i = 0; s == SG_OK && i < fn->nout; i++) {
        sg__ref geom = {.dtype = tmp[i]->dtype, .ndim = tmp[i]->ndim};
        memcpy(geom.shape, tmp[i]->shape, sizeof geom.shape);
        memcpy(geom.stride, tmp[i]->stride, sizeof geom.stride);
        /* A handle made by this call owns its storage's fate; one from outside doesn't. */
        s = sg__outputs_put(fn, si, i, &geom, tmp[i]->st, tmp[i]->offset, tmp[i]->st->born > mark);
    }
    drop_step_handles(fn->ctx, mark);
    if (s == SG_OK) sg__outputs_publish(fn, si, out);
    return s;
}

/* Run step eagerly and hand out its outputs. */
static sg_status call_step(sg_fn *fn, sg_step_fn step, void *user, sg_tensor *const *in,
                           sg_tensor **out) {
    sg_ctx *ctx = fn->ctx;
    sg_tensor *tmp[fn->nout];
    uint32_t mark = ctx->next_id;
    sg_status s = sg__outputs_check(fn, in); /* refused before the step changes anything */
    if (s == SG_OK) s = run_step(fn, step, user, in, tmp);
    if (s == SG_OK) return publish_eager(fn, in, tmp, mark, out);
    drop_step_handles(ctx, mark);
    return s;
}

static sg_status call_eager(sg_fn *fn, sg_tensor *const *in, sg_tensor **out) {
    fn->stats.fallbacks++;
    return call_step(fn, fn->step, fn->user, in, out);
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
        a->grad = t->grad_fn != NULL;
        for (int j = 0; j < k; j++)
            if (in[j]->st == t->st) {
                a->alias = j;
                a->alias_off = t->offset - in[j]->offset;
                break;
            }
    }
}

/* Which guard of g the inputs fail, as text; NULL when they pass. */
static const char *guard_fail(const sg_ctx *ctx, const sg__graph *g, int nin, sg_tensor *const *in,
                              char *buf, size_t size, bool *dead) {
    *dead = false; /* set for a miss that holds for every later call: a parameter's */
    if (ctx->grad_off != g->grad_off) {
        snprintf(buf, size, "grad mode %s, captured %s", g->grad_off ? "on" : "off",
                 g->grad_off ? "off" : "on");
        return buf;
    }
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
        if ((t->grad_fn != NULL) != a->grad) {
            snprintf(buf, size, "input %d %s grad, captured %s", k,
                     a->grad ? "does not require" : "requires", a->grad ? "requiring it" : "not");
            return buf;
        }
    }
    bool pinned = false; /* an input whose storage some capture holds (a parameter's?) */
    for (int k = 0; k < nin && !pinned; k++) pinned = in[k]->st->pins > 0;
    for (int s = 0; s < g->ir.nslots; s++) {
        const sg__slot *sl = &g->ir.slots[s];
        if (sl->kind == SG__SLOT_INPUT && sl->alias && in[sl->input]->st != sl->alias) {
            snprintf(buf, size,
                     "input %d was a parameter's storage when captured (the step read it "
                     "through both), now another tensor",
                     sl->input);
            return buf;
        }
        for (int k = 0; pinned && sl->kind == SG__SLOT_PARAM && k < nin; k++)
            if (in[k]->st == sl->param) {
                snprintf(buf, size, "input %d is parameter p%d's storage, captured apart", k, s);
                return buf;
            }
        /* Only the fns pin it: the user let go of this parameter. */
        if (sl->kind == SG__SLOT_PARAM && sl->param->refs <= sl->param->pins) {
            snprintf(buf, size, "parameter p%d (%zu bytes) was released by its owner", s,
                     sl->param->nbytes);
            *dead = true;
            return buf;
        }
        if (sl->kind == SG__SLOT_PARAM && sl->param->grad_gen != sl->grad_gen) {
            snprintf(buf, size, "parameter p%d started or stopped requiring grad", s);
            *dead = true;
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

/* A call that matches capture g: eagerly, through a custom backend's step, or a replay. */
static sg_status call_graph(sg_fn *fn, sg__graph *g, sg_tensor *const *in, sg_tensor **out) {
    if (g->eager) return call_eager(fn, in, out);
    if (g->custom) return call_step(fn, g->custom, fn->opts.backend_user, in, out);
    return call_replay(fn, g, in, out);
}

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

/* A capture that cannot replay runs eagerly: said as a fallback (an error
 * under strict, and then the capture is dropped). */
static sg_status capture_eager(sg_fn *fn, sg__graph *g, const char *why) {
    g->eager = true;
    snprintf(g->why, sizeof g->why, "%s", why);
    sg_status s =
        sg__fn_fallback(fn, strstr(why, "graph break") ? SG_ERR_GRAPH_BREAK : SG_ERR_COMPILE,
                        "capture %d runs eagerly: %s", fn->ngraphs, why);
    if (s != SG_OK) drop_graph(fn, fn->ngraphs - 1);
    return s;
}

/* Capture a new graph from this call; the call's results come from the
 * capture run, or, for a dry capture, from the first replay. */
static sg_status call_capture(sg_fn *fn, sg_tensor *const *in, sg_tensor **out) {
    sg_ctx *ctx = fn->ctx;
    sg_status s0 = sg__outputs_check(fn, in); /* before a capture that runs changes anything */
    if (s0 != SG_OK) return s0;
    sg__graph *g = sg__calloc(ctx, sizeof *g);
    if (!g) return sg__fail(ctx, SG_ERR_OOM, "fn '%s': out of host memory for a capture", fn->name);
    g->key = sg__calloc(ctx, sizeof *g->key * (size_t)(fn->nin ? fn->nin : 1));
    if (!g->key) {
        sg__free(ctx, g, sizeof *g);
        return sg__fail(ctx, SG_ERR_OOM, "fn '%s': out of host memory for a capture", fn->name);
    }
    make_key(fn->nin, in, g->key);
    g->grad_off = ctx->grad_off;
    sg__rec rec;
    sg_tensor *tmp[fn->nout];
    uint32_t mark = ctx->next_id;
    sg_status before = ctx->status;
    char msg[SG__MSG_SIZE];
    snprintf(msg, sizeof msg, "%s", ctx->msg);
    fn->stats.captures++;
    sg_status s = sg__rec_begin(ctx, &rec, &g->ir, fn->nin, in, fn->opts.fullgraph);
    if (s == SG_OK) {
        /* fullgraph: always dry, so that a break, its failure, changes nothing */
        rec.dry = fn->opts.fullgraph || dry_capture(ctx);
        s = run_step(fn, fn->step, fn->user, in, tmp);
        sg_status e = sg__rec_end(ctx, s == SG_OK ? fn->nout : 0, tmp);
        if (s == SG_OK) s = e;
        if (s == SG_OK && rec.refused) /* the step went on past it: still the call's failure */
            s = sg__fail(ctx, SG_ERR_GRAPH_BREAK, "fn '%s': %s", fn->name, rec.why);
    } else {
        ctx->rec = NULL;
    }
    bool dry_break = s != SG_OK && rec.dry && rec.broken && !fn->opts.fullgraph;
    if (s != SG_OK && !dry_break) {
        drop_step_handles(ctx, mark);
        sg__graph_free(ctx, g);
        return s;
    }
    if (dry_break) { /* nothing ran: the step runs again, eagerly */
        drop_step_handles(ctx, mark);
        ctx->status = before;
        snprintf(ctx->msg, sizeof ctx->msg, "%s", msg);
    }
    fn->graphs[fn->ngraphs++] = g;
    if (rec.broken) {
        sg__log(ctx, "graph_breaks", "fn '%s': %s", fn->name, rec.why);
        s = capture_eager(fn, g, rec.why);
    } else if ((s = sg__graph_build(fn, g)) != SG_OK && fn->opts.strict) {
        drop_graph(fn, fn->ngraphs - 1); /* the failure (a strict fallback) says why */
    } else if (s != SG_OK) {
        char why[SG__MSG_SIZE];
        snprintf(why, sizeof why, "the plan could not be built: %.900s", ctx->msg);
        ctx->status = before;
        snprintf(ctx->msg, sizeof ctx->msg, "%s", msg);
        s = capture_eager(fn, g, why);
    }
    if (s != SG_OK || dry_break) {
        drop_step_handles(ctx, mark);
        return s != SG_OK ? s : call_eager(fn, in, out);
    }
    if (rec.dry) { /* nothing ran yet: the results come from running the plan */
        drop_step_handles(ctx, mark);
        return call_graph(fn, g, in, out);
    }
    fn->stats.fallbacks += g->eager;
    return publish_eager(fn, in, tmp, mark, out);
}

static sg_status call_replay(sg_fn *fn, sg__graph *g, sg_tensor *const *in, sg_tensor **out) {
    int si;
    sg_status s = sg__outputs_pick(fn, in, &si);
    if (s == SG_OK) s = sg__graph_outbuf(fn, g, si);
    if (s == SG_OK) s = sg__graph_replay(fn, g, in, si);
    if (s != SG_OK) return s;
    fn->stats.replays++;
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
        s = sg__outputs_put(fn, si, i, ref, st, off, sl->kind == SG__SLOT_INTERNAL);
        if (s != SG_OK) return s;
    }
    sg__outputs_publish(fn, si, out);
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

/* The message for an fn that no live context holds (what: the call). */
static sg_status fn_unknown(const sg_fn *fn, const char *what) {
    sg__set_create_error("%s: %p is no live fn: the context of this fn was destroyed "
                         "(sg_ctx_destroy frees every fn it made), or it is no stepgraph fn; "
                         "destroy fns before sg_ctx_destroy, or skip the destroy",
                         what, (const void *)fn);
    return SG_ERR_INVALID_ARG;
}

/* A destroyed fn's record, an fn of a destroyed context, or not an fn at
 * all: the status to return. Found in the registry before fn is read
 * (cached per thread: sg_call takes no process-wide lock while no fn was
 * freed). */
sg_status sg__fn_check(const sg_fn *fn, const char *what) {
    if (!fn) return SG_ERR_NULL;
    if (!sg__reg_fn_known(fn)) return fn_unknown(fn, what);
    if (fn->magic == SG__FN_DEAD)
        return sg__fail(fn->ctx, SG_ERR_RELEASED,
                        "%s: the fn was destroyed with sg_fn_destroy; "
                        "compile the step again",
                        what);
    return fn->magic == SG__FN_LIVE ? SG_OK : SG_ERR_INVALID_ARG;
}

sg_status sg__fn_fallback(sg_fn *fn, sg_status s, const char *fmt, ...) {
    char why[SG__MSG_SIZE];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    if (fn->opts.strict)
        return sg__fail(fn->ctx, s, "fn '%s': %s; strict makes this fallback an error", fn->name,
                        why);
    if (fn->said_fallback) {
        sg__log(fn->ctx, "fallbacks", "fn '%s': %s", fn->name, why);
    } else {
        fn->said_fallback = true;
        sg__log_always(fn->ctx, "fallbacks",
                       "fn '%s': %s (said once per fn; SG_LOGS=fallbacks shows every fallback, "
                       "sg_compile_opts.strict makes them errors)",
                       fn->name, why);
    }
    return SG_OK;
}

/* No capture matches (why: the last guard that failed, or "" for none). */
static sg_status call_miss(sg_fn *fn, sg_tensor *const *in, sg_tensor **out, const char *why) {
    sg_ctx *ctx = fn->ctx;
    bool recompile = fn->ngraphs > 0 || why[0];
    if (recompile && fn->stance == SG_STANCE_EAGER_ON_RECOMPILE) {
        sg__log(ctx, "recompiles", "fn '%s': stance eager_on_recompile: runs eagerly because %s",
                fn->name, why);
        return call_eager(fn, in, out);
    }
    if (recompile && fn->stance == SG_STANCE_FAIL_ON_RECOMPILE)
        return sg__fail(ctx, SG_ERR_UNSUPPORTED,
                        "sg_call: fn '%s' has stance fail_on_recompile, and this call would "
                        "recompile because %s; call with a captured signature or change the stance",
                        fn->name, why[0] ? why : "its captures were dropped");
    if (fn->ngraphs >= fn->opts.cache_size_limit) {
        /* A fallback: said once, then under "fallbacks" for each signature
         * other than the last one said (a loop over one uncaptured shape
         * says it once). */
        if (fn->opts.strict || strncmp(fn->limit_why, why, sizeof fn->limit_why - 1) != 0) {
            sg_status s = sg__fn_fallback(fn, SG_ERR_UNSUPPORTED,
                                          "cache_size_limit (%d) reached; new input signatures "
                                          "run eagerly (this miss: %s)",
                                          fn->opts.cache_size_limit, why);
            if (s != SG_OK) return s;
            snprintf(fn->limit_why, sizeof fn->limit_why, "%s", why);
            fn->said_limit = true;
        }
        return call_eager(fn, in, out);
    }
    if (recompile)
        sg__log(ctx, "recompiles", "fn '%s': recompiling (capture %d of at most %d) because %s",
                fn->name, fn->ngraphs + 1, fn->opts.cache_size_limit, why);
    return call_capture(fn, in, out);
}

sg_status sg_call(sg_fn *fn, sg_tensor *const *in, int nin, sg_tensor **out, int nout) {
    sg_status s0 = sg__fn_check(fn, "sg_call");
    if (s0 != SG_OK) return s0;
    sg_ctx *ctx = fn->ctx;
    sg_status s = check_call(fn, in, nin, out, nout);
    if (s != SG_OK) return s;
    fn->stats.calls++;
    if (fn->opts.disable || fn->opts.mode == SG_MODE_EAGER || fn->stance == SG_STANCE_FORCE_EAGER)
        return call_eager(fn, in, out);
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
        bool dead;
        const char *miss = guard_fail(ctx, g, fn->nin, in, why, sizeof why, &dead);
        if (!miss) {
            fn->stats.cache_hits++;
            return call_graph(fn, g, in, out);
        }
        sg__log(ctx, "guards", "fn '%s': capture %d does not match: %s", fn->name, gi + 1, miss);
        if (dead) { /* never valid again: make room, keeping the outputs handed out */
            sg__graph_keep_outputs(ctx, g);
            drop_graph(fn, gi);
            gi--;
        }
    }
    return call_miss(fn, in, out, why);
}

sg_status sg_mark_step_begin(sg_ctx *ctx) {
    if (!ctx) return SG_ERR_NULL;
    ctx->step++;
    return SG_OK;
}

sg_status sg_fn_reset(sg_fn *fn) {
    sg_status s = sg__fn_check(fn, "sg_fn_reset");
    if (s != SG_OK) return s;
    while (fn->ngraphs) drop_graph(fn, fn->ngraphs - 1);
    return SG_OK;
}

sg_status sg_reset(sg_ctx *ctx) {
    if (!ctx) return SG_ERR_NULL;
    for (sg_fn *fn = ctx->fns; fn; fn = fn->next) sg_fn_reset(fn);
    return SG_OK;
}

sg_status sg_fn_set_stance(sg_fn *fn, sg_stance stance) {
    sg_status s = sg__fn_check(fn, "sg_fn_set_stance");
    if (s != SG_OK) return s;
    if ((unsigned)stance > SG_STANCE_FAIL_ON_RECOMPILE)
        return sg__fail(fn->ctx, SG_ERR_INVALID_ARG,
                        "sg_fn_set_stance: %d is not an sg_stance; use SG_STANCE_DEFAULT, "
                        "SG_STANCE_FORCE_EAGER, SG_STANCE_EAGER_ON_RECOMPILE or "
                        "SG_STANCE_FAIL_ON_RECOMPILE",
                        (int)stance);
    fn->stance = stance;
    return SG_OK;
}

sg_status sg_fn_get_stats(const sg_fn *fn, sg_fn_stats *stats) {
    sg_status s = sg__fn_check(fn, "sg_fn_get_stats");
    if (s != SG_OK) return s;
    if (!stats) return sg__fail(fn->ctx, SG_ERR_NULL, "sg_fn_get_stats: stats is NULL");
    *stats = fn->stats;
    return SG_OK;
}

/* Keep the record of a destroyed fn a while (so that a later call is
 * reported, not a crash); the oldest beyond SG__DEAD_FNS is freed. */
static void fn_bury(sg_ctx *ctx, sg_fn *fn) {
    memset(fn, 0, offsetof(sg_fn, reg)); /* the registry's entry stays as it is */
    fn->magic = SG__FN_DEAD;
    fn->ctx = ctx;
    fn->next = ctx->dead_fns;
    ctx->dead_fns = fn;
    if (++ctx->ndead_fns <= SG__DEAD_FNS) return;
    sg_fn **p = &ctx->dead_fns;
    while ((*p)->next) p = &(*p)->next;
    fn_free(ctx, *p);
    *p = NULL;
    ctx->ndead_fns--;
}

/* Scratch goes back to the backend once no capture of the context plans into it. */
static void drop_unused_scratch(sg_ctx *ctx) {
    for (const sg_fn *f = ctx->fns; f; f = f->next)
        for (int gi = 0; gi < f->ngraphs; gi++)
            if (!f->graphs[gi]->eager && f->graphs[gi]->scratch) return;
    sg__pool_drop_scratch(ctx);
}

/* Free a live fn's captures, outputs and handles; keep its record a while. */
static void fn_destroy(sg_fn *fn) {
    sg_ctx *ctx = fn->ctx;
    fn_unlink(fn);
    while (fn->ngraphs) drop_graph(fn, fn->ngraphs - 1);
    drop_unused_scratch(ctx);
    sg__outputs_free(fn);
    if (fn->graphs)
        sg__free(ctx, fn->graphs, sizeof *fn->graphs * (size_t)fn->opts.cache_size_limit);
    sg__free(ctx, fn->explain, fn->explain_size);
    fn_bury(ctx, fn);
}

sg_status sg_fn_destroy(sg_fn *fn) {
    if (!fn) return SG_OK;
    if (!sg__reg_find(fn, SG__REG_FN)) return fn_unknown(fn, "sg_fn_destroy");
    if (fn->magic == SG__FN_DEAD) return SG_ERR_RELEASED; /* harmless, as for tensors */
    for (const struct sg__step_frame *f = fn->ctx->steps; f; f = f->up)
        if (f->fn == fn)
            return sg__fail(fn->ctx, SG_ERR_UNSUPPORTED,
                            "sg_fn_destroy: fn '%s' is running its step (the call is inside "
                            "it); destroy the fn after sg_call returns",
                            fn->name);
    fn_destroy(fn);
    return SG_OK;
}

void sg__fns_repoint(sg_ctx *ctx) {
    for (sg_fn *fn = ctx->fns; fn; fn = fn->next)
        for (int gi = 0; gi < fn->ngraphs; gi++)
            if (!fn->graphs[gi]->eager) sg__graph_repoint(ctx, fn->graphs[gi]);
}

void sg__fns_destroy_all(sg_ctx *ctx) {
    while (ctx->fns) fn_destroy(ctx->fns);
    while (ctx->dead_fns) {
        sg_fn *fn = ctx->dead_fns;
        ctx->dead_fns = fn->next;
        fn_free(ctx, fn);
    }
    ctx->ndead_fns = 0;
}

/* ------------------------------------------------------------ memory stats */

static void add_graph_stats(const sg__graph *g, sg_memory_stats *st) {
    if (g->eager) return;
    st->output_bytes += g->out_bytes * (size_t)g->noutbufs;
    if (g->const_block >= 0) st->constant_bytes += g->const_bytes;
    if (g->peak > st->peak_live_bytes) st->peak_live_bytes = g->peak;
    st->unshared_bytes += g->unshared;
    st->captures++;
}

sg_status sg_fn_memory_stats(const sg_fn *fn, sg_memory_stats *st) {
    sg_status s = sg__fn_check(fn, "sg_fn_memory_stats");
    if (s != SG_OK) return s;
    if (!st) return sg__fail(fn->ctx, SG_ERR_NULL, "sg_fn_memory_stats: stats is NULL");
    memset(st, 0, sizeof *st);
    for (int gi = 0; gi < fn->ngraphs; gi++) {
        add_graph_stats(fn->graphs[gi], st);
        if (fn->graphs[gi]->scratch > st->scratch_bytes)
            st->scratch_bytes = fn->graphs[gi]->scratch;
    }
    st->pool_bytes = st->scratch_bytes + st->output_bytes + st->constant_bytes;
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
