/* SPDX-License-Identifier: MIT */
/*
 * tensor.c -- tensor handles and their storage: making, releasing (with a
 * quarantine that catches use after release), the facts about a tensor,
 * host transfer, and the checks every op front-end shares.
 */
#include "capture.h"

#include <math.h>
#include <stdio.h>

/* ------------------------------------------------------------ small helpers */

int64_t sg__numel(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    return n;
}

bool sg__is_contiguous(const sg_tensor *t) {
    int64_t expect = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        if (t->shape[d] == 0) return true;
        if (t->shape[d] != 1 && t->stride[d] != expect) return false;
        expect *= t->shape[d];
    }
    return true;
}

const char *sg__shape_str(int ndim, const int64_t *shape, char *buf, size_t size) {
    size_t n = (size_t)snprintf(buf, size, "[");
    for (int d = 0; d < ndim && n < size; d++)
        n += (size_t)snprintf(buf + n, size - n, d ? ",%lld" : "%lld", (long long)shape[d]);
    if (n < size) snprintf(buf + n, size - n, "]");
    return buf;
}

const char *sg__describe(const sg_tensor *t, char *buf, size_t size) {
    if (!t) {
        snprintf(buf, size, "NULL");
        return buf;
    }
    char sh[80];
    sg__shape_str(t->ndim, t->shape, sh, sizeof sh);
    if (sg__is_contiguous(t)) {
        snprintf(buf, size, "%s%s", sg_dtype_name(t->dtype), sh);
    } else {
        char st[80];
        sg__shape_str(t->ndim, t->stride, st, sizeof st);
        snprintf(buf, size, "%s%s strides %s", sg_dtype_name(t->dtype), sh, st);
    }
    return buf;
}

void *sg__data(const sg_tensor *t) {
    return (char *)t->st->data + t->offset * (int64_t)sg_dtype_size(t->dtype);
}

int sg__norm_dim(int dim, int ndim) {
    int d = dim < 0 ? dim + ndim : dim;
    return d >= 0 && d < ndim ? d : -1;
}

/* ------------------------------------------------------------ handles */

static void list_unlink(sg_tensor *t) {
    t->prev->next = t->next;
    t->next->prev = t->prev;
    t->prev = t->next = NULL;
}

static void list_push_back(sg_tensor *head, sg_tensor *t) {
    t->prev = head->prev;
    t->next = head;
    head->prev->next = t;
    head->prev = t;
}

void sg__storage_unref(sg_ctx *ctx, sg__storage *st) {
    if (!st || --st->refs > 0) return;
    if (st->data && st->owned) sg__dev_free(ctx, st->data, st->nbytes);
    sg__free(ctx, st, sizeof *st);
}

sg_tensor *sg__handle_alloc(sg_ctx *ctx) {
    sg_tensor *t = sg__calloc(ctx, sizeof *t);
    if (!t) return NULL;
    t->ctx = ctx;
    sg__reg_add(ctx, &t->reg, t, SG__REG_TENSOR);
    return t;
}

void sg__handle_free(sg_ctx *ctx, sg_tensor *t) {
    if (!t) return;
    sg__reg_remove(ctx, &t->reg);
    sg__free(ctx, t, sizeof *t);
}

static sg_tensor *handle_new(sg_ctx *ctx, const char *op) {
    sg_tensor *t = sg__handle_alloc(ctx);
    if (!t) {
        sg__fail(ctx, SG_ERR_OOM, "%s: out of host memory for a tensor handle (%zu bytes)", op,
                 sizeof *t);
        return NULL;
    }
    t->magic = SG__TENSOR_LIVE;
    t->id = ++ctx->next_id;
    t->src = t->id;
    list_push_back(&ctx->live, t);
    return t;
}

static void contiguous_strides(int ndim, const int64_t *shape, int64_t *stride) {
    int64_t s = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        stride[d] = s;
        s *= shape[d] > 0 ? shape[d] : 1;
    }
}

sg_tensor *sg__tensor_new(sg_ctx *ctx, const char *op, sg_dtype dt, int ndim,
                          const int64_t *shape) {
    char sh[96];
    if (!sg__dtype_valid(dt)) {
        sg__fail(ctx, SG_ERR_DTYPE,
                 "%s: %d is not a dtype; use SG_F32, SG_F16, SG_BF16, SG_I32, "
                 "SG_I64 or SG_BOOL",
                 op, (int)dt);
        return NULL;
    }
    if (ndim < 0 || ndim > SG_MAX_DIMS) {
        sg__fail(ctx, SG_ERR_SHAPE,
                 "%s: ndim %d is out of range; stepgraph tensors have 0 to %d "
                 "dims",
                 op, ndim, SG_MAX_DIMS);
        return NULL;
    }
    if (ndim > 0 && !shape) {
        sg__fail(ctx, SG_ERR_NULL, "%s: shape is NULL for ndim %d; pass ndim sizes", op, ndim);
        return NULL;
    }
    /* Sizes are checked one by one so that neither the byte count nor the
     * strides (the sizes' product with 0 sizes taken as 1) can overflow. */
    uint64_t bytes = sg_dtype_size(dt), span = bytes;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0) {
            sg__fail(ctx, SG_ERR_SHAPE,
                     "%s: shape %s has a negative size at dim %d; sizes must "
                     "be >= 0",
                     op, sg__shape_str(ndim, shape, sh, sizeof sh), d);
            return NULL;
        }
        if (shape[d] > 0 && span > (UINT64_MAX >> 2) / (uint64_t)shape[d]) {
            sg__fail(ctx, SG_ERR_OOM, "%s: shape %s of %s is too large to address", op,
                     sg__shape_str(ndim, shape, sh, sizeof sh), sg_dtype_name(dt));
            return NULL;
        }
        bytes *= (uint64_t)shape[d];
        span *= shape[d] > 0 ? (uint64_t)shape[d] : 1;
    }
    sg_tensor *t = handle_new(ctx, op);
    if (!t) return NULL;
    t->dtype = dt;
    t->ndim = ndim;
    for (int d = 0; d < ndim; d++) t->shape[d] = shape[d];
    contiguous_strides(ndim, shape, t->stride);
    t->st = sg__calloc(ctx, sizeof *t->st);
    if (!t->st) {
        sg__fail(ctx, SG_ERR_OOM, "%s: out of host memory for a storage record", op);
        sg__tensor_drop(t);
        return NULL;
    }
    t->st->refs = 1;
    t->st->nbytes = (size_t)bytes;
    t->st->owned = true;
    t->st->born = t->id;
    t->st->cap_slot = -1;
    /* A dry capture executes nothing: its buffers need no bytes (the plan
     * gives them pool offsets later). */
    bool dry = ctx->rec && ctx->rec->dry && !ctx->rec->broken;
    if (!dry && sg__dev_alloc(ctx, (size_t)bytes, &t->st->data) != SG_OK) {
        sg__fail(ctx, SG_ERR_OOM,
                 "%s: out of %s memory for %s%s (%llu bytes); free tensors with "
                 "sg_release or use smaller shapes",
                 op, ctx->exec.name, sg_dtype_name(dt), sg__shape_str(ndim, shape, sh, sizeof sh),
                 (unsigned long long)bytes);
        t->st->data = NULL;
        sg__tensor_drop(t);
        return NULL;
    }
    if (ctx->rec) sg__rec_storage(ctx, t->st);
    return t;
}

sg_tensor *sg__tensor_view(sg_tensor *t, const char *op, int ndim, const int64_t *shape,
                           const int64_t *stride, int64_t offset) {
    sg_tensor *v = handle_new(t->ctx, op);
    if (!v) return NULL;
    v->dtype = t->dtype;
    v->ndim = ndim;
    for (int d = 0; d < ndim; d++) {
        v->shape[d] = shape[d];
        v->stride[d] = stride[d];
    }
    v->offset = offset;
    v->st = t->st;
    v->st->refs++;
    v->st_gen = t->st_gen;
    if (t->ctx->rec) v->src = t->id < t->ctx->rec->id ? t->id : t->src;
    return v;
}

sg_tensor *sg__tensor_hold(sg_tensor *t) {
    sg_tensor *h = sg__calloc(t->ctx, sizeof *h);
    if (!h) return NULL;
    *h = *t;
    h->prev = h->next = NULL;
    h->fn_owned = h->was_output = false;
    h->grad_fn = NULL;
    h->magic = SG__TENSOR_LIVE;
    memset(&h->reg, 0, sizeof h->reg); /* internal: never given out, never registered */
    h->st->refs++;
    return h;
}

void sg__tensor_unhold(sg_tensor *h) {
    if (!h) return;
    sg_ctx *ctx = h->ctx;
    sg__storage_unref(ctx, h->st);
    sg__free(ctx, h, sizeof *h);
}

void sg__tensor_drop(sg_tensor *t) {
    if (!t) return;
    sg_ctx *ctx = t->ctx;
    sg__gnode_unref(ctx, t->grad_fn);
    t->grad_fn = NULL;
    list_unlink(t);
    sg__storage_unref(ctx, t->st);
    sg__handle_free(ctx, t);
}

/* Keep a dead handle a while so that a later use is caught, not a crash. */
static void quarantine(sg_ctx *ctx, sg_tensor *t) {
    t->magic = SG__TENSOR_DEAD;
    list_push_back(&ctx->dead, t);
    if (++ctx->ndead > SG__QUARANTINE) {
        sg_tensor *old = ctx->dead.next;
        list_unlink(old);
        sg__handle_free(ctx, old);
        ctx->ndead--;
    }
}

void sg__tensor_bury(sg_tensor *t) {
    t->was_output = t->fn_owned;
    t->fn_owned = false;
    quarantine(t->ctx, t);
}

sg_status sg_release(sg_tensor *t) {
    if (!t) return SG_OK;
    /* Found in a live context's registry before anything of t is read. */
    if (!sg__reg_find(t, SG__REG_TENSOR)) {
        sg__set_create_error(
            "sg_release: %p is no live tensor: the context of this tensor was destroyed "
            "(sg_ctx_destroy frees every tensor it holds), or it is no stepgraph tensor; release "
            "tensors before sg_ctx_destroy, or skip the release",
            (void *)t);
        return SG_ERR_INVALID_ARG;
    }
    sg_ctx *ctx = t->ctx;
    /* Released already (by sg_release, or as an output of a destroyed fn):
     * harmless, and no failure of the context's. */
    if (t->magic == SG__TENSOR_DEAD) return SG_ERR_RELEASED;
    if (t->magic != SG__TENSOR_LIVE) return SG_ERR_INVALID_ARG;
    for (const struct sg__step_frame *f = ctx->steps; f; f = f->up)
        for (int k = 0; k < f->nin; k++)
            if (f->in[k] == t)
                return sg__fail(ctx, SG_ERR_INVALID_ARG,
                                "sg_release: tensor #%u is input %d of the step running now; a "
                                "step's inputs belong to its caller: release it after sg_call "
                                "returns",
                                t->id, k);
    sg__gnode_unref(ctx, t->grad_fn);
    t->grad_fn = NULL;
    if (t->fn_owned) { /* an output handle: its fn keeps the handle itself */
        sg__storage_unref(ctx, t->st);
        t->st = NULL;
        t->magic = SG__TENSOR_DEAD;
        return SG_OK;
    }
    list_unlink(t);
    sg__storage_unref(ctx, t->st);
    t->st = NULL;
    quarantine(ctx, t);
    return SG_OK;
}

void sg__ctx_release_all(sg_ctx *ctx) {
    while (ctx->live.next != &ctx->live) sg__tensor_drop(ctx->live.next);
    while (ctx->dead.next != &ctx->dead) {
        sg_tensor *t = ctx->dead.next;
        list_unlink(t);
        sg__handle_free(ctx, t);
    }
    ctx->ndead = 0;
}

/* ------------------------------------------------------------ input checks */

/* Why a dead handle is dead, for the message that names it. */
static const char *dead_why(const sg_tensor *t) {
    return t->fn_owned || t->was_output
               ? "was an output of a compiled step, released with sg_release or dropped "
                 "with its fn (sg_fn_destroy, sg_fn_reset, sg_reset); sg_clone the "
                 "outputs you keep"
               : "was released with sg_release; keep it until its last use";
}

sg_ctx *sg__check_inputs(const char *op, int n, sg_tensor *const *ts, const bool *optional) {
    sg_ctx *ctx = NULL;
    for (int i = 0; i < n; i++)
        if (ts[i] && (ts[i]->magic == SG__TENSOR_LIVE || ts[i]->magic == SG__TENSOR_DEAD)) {
            ctx = ts[i]->ctx;
            break;
        }
    if (!ctx) return NULL;
    for (int i = 0; i < n; i++) {
        if (!ts[i]) {
            if (optional && optional[i]) continue;
            return NULL; /* an earlier op failed and said why */
        }
        if (ts[i]->magic == SG__TENSOR_DEAD) {
            sg__fail(ctx, SG_ERR_RELEASED, "%s: input %d (tensor #%u) %s", op, i, ts[i]->id,
                     dead_why(ts[i]));
            return NULL;
        }
        if (ts[i]->magic != SG__TENSOR_LIVE) {
            sg__fail(ctx, SG_ERR_INVALID_ARG, "%s: input %d is not a stepgraph tensor", op, i);
            return NULL;
        }
        if (ts[i]->ctx != ctx) {
            sg__fail(ctx, SG_ERR_WRONG_CONTEXT,
                     "%s: input %d belongs to another context than "
                     "input 0; copy it over with sg_read and sg_from_host",
                     op, i);
            return NULL;
        }
        if (sg__check_stale(ts[i], op) != SG_OK) return NULL;
    }
    return ctx;
}

sg_status sg__inputs_status(int n, sg_tensor *const *ts) {
    for (int i = 0; i < n; i++) {
        if (!ts[i]) return SG_ERR_NULL;
        if (ts[i]->magic == SG__TENSOR_DEAD) return SG_ERR_RELEASED;
        if (ts[i]->magic != SG__TENSOR_LIVE) return SG_ERR_INVALID_ARG;
        if (ts[i]->ctx != ts[0]->ctx) return SG_ERR_WRONG_CONTEXT;
        if (ts[i]->st && ts[i]->st_gen != ts[i]->st->gen) return SG_ERR_STALE_OUTPUT;
    }
    return SG_ERR_INVALID_ARG;
}

sg_status sg__check_tensor(const char *what, const sg_tensor *t) {
    if (!t) return SG_ERR_NULL;
    if (t->magic == SG__TENSOR_DEAD)
        return sg__fail(t->ctx, SG_ERR_RELEASED, "%s: tensor #%u %s", what, t->id, dead_why(t));
    if (t->magic != SG__TENSOR_LIVE) return SG_ERR_INVALID_ARG;
    return sg__check_stale(t, what);
}

sg_status sg__check_stale(const sg_tensor *t, const char *what) {
    if (!t->st || t->st_gen == t->st->gen) return SG_OK;
    char d[SG__DESC], by[64] = "sg_fn_reset, sg_reset or sg_fn_destroy dropped it";
    if (t->st->overwritten_in)
        snprintf(by, sizeof by, "call %u of that fn overwrote it", t->st->overwritten_in);
    return sg__fail(t->ctx, SG_ERR_STALE_OUTPUT,
                    "%s: tensor #%u (%s) is an output of a compiled step (or a view of one), and "
                    "%s; sg_clone the outputs you keep, or raise sg_compile_opts.output_sets",
                    what, t->id, sg__describe(t, d, sizeof d), by);
}

bool sg__broadcast(sg_ctx *ctx, const char *op, int n, sg_tensor *const *ts, int *ndim,
                   int64_t *shape) {
    int nd = 0;
    for (int i = 0; i < n; i++)
        if (ts[i] && ts[i]->ndim > nd) nd = ts[i]->ndim;
    for (int d = 0; d < nd; d++) shape[d] = 1;
    for (int i = 0; i < n; i++) {
        const sg_tensor *t = ts[i];
        if (!t) continue;
        for (int d = 0; d < t->ndim; d++) {
            int o = nd - t->ndim + d;
            int64_t s = t->shape[d];
            if (s == shape[o] || s == 1) continue;
            if (shape[o] == 1) {
                shape[o] = s;
                continue;
            }
            char a[SG__DESC], b[SG__DESC];
            sg__fail(ctx, SG_ERR_SHAPE,
                     "%s: shapes %s and %s do not broadcast (dim %d: %lld vs "
                     "%lld); sizes must match or be 1",
                     op, sg__describe(ts[0], a, sizeof a), sg__describe(t, b, sizeof b), o - nd,
                     (long long)shape[o], (long long)s);
            return false;
        }
    }
    *ndim = nd;
    return true;
}

void sg__broadcast_strides(const sg_tensor *t, int ndim, const int64_t *shape, int64_t *stride) {
    for (int d = 0; d < ndim; d++) {
        int s = d - (ndim - t->ndim);
        stride[d] = s < 0 || (t->shape[s] == 1 && shape[d] != 1) ? 0 : t->stride[s];
    }
}

/* ------------------------------------------------------------ dispatch */

sg_status sg__dispatch(sg_ctx *ctx, const sg__node *n) {
    if (n->out && n->out->st) n->out->st->version++;
    if (ctx->rec && !ctx->rec->broken) {
        sg_status s = sg__rec_node(ctx, n);
        if (s != SG_OK || ctx->rec->dry) return s;
    }
    /* After a dry capture's break nothing runs (its tensors have no bytes):
     * the step is run again, eagerly, once it returns. */
    if (ctx->rec && ctx->rec->dry) return SG_ERR_GRAPH_BREAK;
    return ctx->exec.run(ctx, n);
}

sg_tensor *sg__run_new(sg_ctx *ctx, sg__node *n, sg_dtype dt, int ndim, const int64_t *shape) {
    sg_tensor *out = sg__tensor_new(ctx, sg__op_name(n->op), dt, ndim, shape);
    if (!out) return NULL;
    n->out = out;
    if (sg__dispatch(ctx, n) != SG_OK) {
        sg__tensor_drop(out);
        return NULL;
    }
    return ctx->grad_off ? out : sg__grad_record(ctx, n, out);
}

/* ------------------------------------------------------------ making tensors */

sg_tensor *sg_empty(sg_ctx *ctx, sg_dtype dt, int ndim, const int64_t *shape) {
    if (!ctx) return NULL;
    return sg__tensor_new(ctx, "sg_empty", dt, ndim, shape);
}

/* sg_full under the name of the function the user called, for messages. */
static sg_tensor *full_named(sg_ctx *ctx, const char *name, sg_dtype dt, int ndim,
                             const int64_t *shape, double value) {
    if (!ctx) return NULL;
    sg_tensor *t = sg__tensor_new(ctx, name, dt, ndim, shape);
    if (t && sg_fill_(t, value) != SG_OK) {
        sg__tensor_drop(t);
        return NULL;
    }
    return t;
}

sg_tensor *sg_full(sg_ctx *ctx, sg_dtype dt, int ndim, const int64_t *shape, double value) {
    return full_named(ctx, "sg_full", dt, ndim, shape, value);
}

sg_tensor *sg_zeros(sg_ctx *ctx, sg_dtype dt, int ndim, const int64_t *shape) {
    return full_named(ctx, "sg_zeros", dt, ndim, shape, 0.0);
}

sg_tensor *sg_from_host(sg_ctx *ctx, sg_dtype dt, int ndim, const int64_t *shape,
                        const void *data) {
    if (!ctx) return NULL;
    sg_tensor *t = sg__tensor_new(ctx, "sg_from_host", dt, ndim, shape);
    if (!t) return NULL;
    size_t nbytes = (size_t)sg__numel(ndim, shape) * sg_dtype_size(dt);
    if (nbytes && !data) {
        sg__fail(ctx, SG_ERR_NULL, "sg_from_host: data is NULL for %zu bytes", nbytes);
        sg__tensor_drop(t);
        return NULL;
    }
    if (ctx->rec && sg__rec_break(ctx, "sg_from_host", t) != SG_OK) {
        sg__tensor_drop(t);
        return NULL;
    }
    if (nbytes && ctx->exec.upload(ctx, t->st->data, data, nbytes) != SG_OK) {
        sg__tensor_drop(t);
        return NULL;
    }
    return t;
}

/* ------------------------------------------------------------ facts */

static bool live(const sg_tensor *t) { return t && t->magic == SG__TENSOR_LIVE; }

sg_ctx *sg_tensor_ctx(const sg_tensor *t) { return live(t) ? t->ctx : NULL; }
sg_dtype sg_tensor_dtype(const sg_tensor *t) { return live(t) ? t->dtype : SG_F32; }
int sg_tensor_ndim(const sg_tensor *t) { return live(t) ? t->ndim : 0; }
int64_t sg_tensor_numel(const sg_tensor *t) { return live(t) ? sg__numel(t->ndim, t->shape) : 0; }
bool sg_tensor_is_contiguous(const sg_tensor *t) { return live(t) && sg__is_contiguous(t); }

int64_t sg_tensor_size(const sg_tensor *t, int dim) {
    if (!live(t)) return 0;
    int d = sg__norm_dim(dim, t->ndim);
    return d < 0 ? 0 : t->shape[d];
}

int64_t sg_tensor_stride(const sg_tensor *t, int dim) {
    if (!live(t)) return 0;
    int d = sg__norm_dim(dim, t->ndim);
    return d < 0 ? 0 : t->stride[d];
}

sg_status sg_tensor_shape(const sg_tensor *t, int64_t *shape) {
    sg_status s = sg__check_tensor("sg_tensor_shape", t);
    if (s != SG_OK) return s;
    if (!shape) return sg__fail(t->ctx, SG_ERR_NULL, "sg_tensor_shape: shape is NULL");
    for (int d = 0; d < t->ndim; d++) shape[d] = t->shape[d];
    return SG_OK;
}

const char *sg_tensor_describe(const sg_tensor *t, char *buf, size_t size) {
    if (!buf || size == 0) return "";
    if (t && t->magic == SG__TENSOR_DEAD) {
        snprintf(buf, size, "released");
        return buf;
    }
    return sg__describe(live(t) ? t : NULL, buf, size);
}

/* ------------------------------------------------------------ host transfer */

static sg_status check_nbytes(const char *what, const sg_tensor *t, const void *p, size_t nbytes) {
    size_t want = (size_t)sg__numel(t->ndim, t->shape) * sg_dtype_size(t->dtype);
    char d[SG__DESC];
    if (nbytes != want)
        return sg__fail(t->ctx, SG_ERR_INVALID_ARG,
                        "%s: %s holds %zu bytes but %zu were given; "
                        "pass numel * sg_dtype_size(dtype)",
                        what, sg__describe(t, d, sizeof d), want, nbytes);
    if (nbytes && !p) return sg__fail(t->ctx, SG_ERR_NULL, "%s: the host buffer is NULL", what);
    return SG_OK;
}

sg_status sg_write(sg_tensor *t, const void *src, size_t nbytes) {
    sg_status s = sg__check_tensor("sg_write", t);
    if (s == SG_OK) s = check_nbytes("sg_write", t, src, nbytes);
    if (s != SG_OK || nbytes == 0) return s;
    sg_ctx *ctx = t->ctx;
    if (ctx->rec && (s = sg__rec_break(ctx, "sg_write", t)) != SG_OK) return s;
    for (int d = 0; d < t->ndim; d++)
        if (t->stride[d] == 0 && t->shape[d] > 1) {
            char desc[SG__DESC];
            return sg__fail(ctx, SG_ERR_INVALID_ARG,
                            "sg_write: %s is an expanded view whose "
                            "elements repeat; write to the tensor it expands instead",
                            sg__describe(t, desc, sizeof desc));
        }
    if (sg__is_contiguous(t)) return ctx->exec.upload(ctx, sg__data(t), src, nbytes);
    /* Strided destination: stage contiguously, then copy on the backend. */
    /* t's dtype and shape are valid, so only memory can fail here; the sticky
     * ctx->status may hold an older failure and is not this call's answer. */
    sg_tensor *tmp = sg__tensor_new(ctx, "sg_write", t->dtype, t->ndim, t->shape);
    if (!tmp) return SG_ERR_OOM;
    s = ctx->exec.upload(ctx, tmp->st->data, src, nbytes);
    if (s == SG_OK) s = sg_copy_(t, tmp);
    sg__tensor_drop(tmp);
    return s;
}

sg_status sg_read(const sg_tensor *t, void *dst, size_t nbytes) {
    sg_status s = sg__check_tensor("sg_read", t);
    if (s == SG_OK) s = check_nbytes("sg_read", t, dst, nbytes);
    if (s != SG_OK || nbytes == 0) return s;
    sg_ctx *ctx = t->ctx;
    if (ctx->rec && (s = sg__rec_break(ctx, "sg_read", t)) != SG_OK) return s;
    if (sg__is_contiguous(t)) return ctx->exec.download(ctx, dst, sg__data(t), nbytes);
    sg_tensor *tmp = sg__tensor_new(ctx, "sg_read", t->dtype, t->ndim, t->shape);
    if (!tmp) return SG_ERR_OOM; /* only memory can fail, as in sg_write */
    s = sg_copy_(tmp, (sg_tensor *)t);
    if (s == SG_OK) s = ctx->exec.download(ctx, dst, tmp->st->data, nbytes);
    sg__tensor_drop(tmp);
    return s;
}

/* IEEE half and bfloat16 to float, for sg_item. */
static float half_to_float(uint16_t h) {
    int e = (h >> 10) & 31, m = h & 1023;
    float v = e == 0    ? ldexpf((float)m, -24)
              : e == 31 ? (m ? NAN : INFINITY)
                        : ldexpf((float)(m | 1024), e - 25);
    return h & 0x8000 ? -v : v;
}

sg_status sg_item(const sg_tensor *t, double *value) {
    sg_status s = sg__check_tensor("sg_item", t);
    if (s != SG_OK) return s;
    char d[SG__DESC];
    if (sg__numel(t->ndim, t->shape) != 1)
        return sg__fail(t->ctx, SG_ERR_SHAPE,
                        "sg_item: %s has %lld elements, not 1; use sg_read "
                        "for more",
                        sg__describe(t, d, sizeof d), (long long)sg__numel(t->ndim, t->shape));
    if (!value) return sg__fail(t->ctx, SG_ERR_NULL, "sg_item: value is NULL");
    if (t->ctx->rec && (s = sg__rec_break(t->ctx, "sg_item", t)) != SG_OK) return s;
    union {
        float f;
        uint16_t h;
        int32_t i;
        int64_t l;
        uint8_t b;
        uint32_t u;
    } v;
    memset(&v, 0, sizeof v);
    s = t->ctx->exec.download(t->ctx, &v, sg__data(t), sg_dtype_size(t->dtype));
    if (s != SG_OK) return s;
    switch (t->dtype) {
    case SG_F32: *value = v.f; break;
    case SG_F16: *value = half_to_float(v.h); break;
    case SG_BF16: {
        uint32_t u = (uint32_t)v.h << 16;
        float f;
        memcpy(&f, &u, 4);
        *value = f;
        break;
    }
    case SG_I32: *value = v.i; break;
    case SG_I64: *value = (double)v.l; break;
    case SG_BOOL: *value = v.b ? 1.0 : 0.0; break;
    }
    return SG_OK;
}

int64_t sg__double_to_int(double v, sg_dtype dt) {
    if (dt == SG_BOOL) return v != 0.0;
    if (v != v) return 0;
    double lim = dt == SG_I32 ? 2147483648.0 : 9223372036854775808.0;
    if (v >= lim) return dt == SG_I32 ? INT32_MAX : INT64_MAX;
    if (v <= -lim) return dt == SG_I32 ? INT32_MIN : INT64_MIN;
    return (int64_t)v;
}

float sg__round_odd(double v) {
    float f = (float)v;
    if ((double)f == v || f != f || isinf(f)) return f;
    uint32_t u;
    memcpy(&u, &f, 4);
    if (u & 1) return f;
    return nextafterf(f, v > (double)f ? INFINITY : -INFINITY);
}
