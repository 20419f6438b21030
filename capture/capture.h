/* SPDX-License-Identifier: MIT */
/*
 * capture.h -- the internal header of capture/: the context, tensors and
 * their storage, the op node every op builds, and the helpers the op
 * front-ends share. Later modules (fusion, codegen, memory, graphs) include
 * this; nothing here names a device.
 *
 * How an op runs: its front-end (capture/ops_*.c) checks its inputs, works
 * out the output's dtype and shape, makes the output tensor and fills an
 * sg__node; sg__dispatch hands the node to the context's executor, which the
 * backend installed at sg_ctx_create. The same node is what a capture
 * records, so eager and compiled paths share one description of every op.
 */
#ifndef SG_CAPTURE_H
#define SG_CAPTURE_H

#include "stepgraph.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#define SG__HIDDEN __attribute__((visibility("hidden")))

/* Guards internal invariants only; user input never reaches one. */
#ifdef NDEBUG
#define SG_ASSERT(c) ((void)0)
#else
#include <assert.h>
#define SG_ASSERT(c) assert(c)
#endif

/* ------------------------------------------------------------ ops */

typedef enum sg__op {
#define X(name, fam, str) SG__OP_##name,
#include "ops.def"
#undef X
    SG__OP_COUNT
} sg__op;

typedef enum sg__family {
    SG__FAM_POINTWISE,
    SG__FAM_REDUCE,
    SG__FAM_ROW,
    SG__FAM_MATMUL,
    SG__FAM_DATA,
    SG__FAM_ATTN, /* ATTENTION (cuda_attn.c) and ATTENTION_BWD (cuda_attn_bwd.c); cpu_attn.c */
    SG__FAM_COMM  /* collectives: graphs/comm.c, run in order, never fused away */
} sg__family;

SG__HIDDEN const char *sg__op_name(sg__op op);
SG__HIDDEN sg__family sg__op_family(sg__op op);

/*
 * One op application. in[] are the inputs (a NULL entry is an optional
 * input left out), out the result (for in-place ops, the destination).
 * Attributes: f[] scalars, i[] integers, mask the set of reduced dims.
 */
typedef struct sg__node {
    sg__op op;
    int nin;
    sg_tensor *const *in;
    sg_tensor *out;
    double f[3];
    int64_t i[3];
    uint32_t mask;
} sg__node;

/* ------------------------------------------------------------ storage and tensors */

/* Bytes that tensors share: a base and its views point at one storage. */
typedef struct sg__storage {
    int refs;
    int pins;   /* refs held by compiled fns (a param the user no longer holds has refs == pins) */
    void *data; /* host pointer, or a device address for device backends */
    size_t nbytes;
    bool owned;              /* data was allocated for this storage (not pool bytes) */
    uint32_t born;           /* ctx->next_id when it was made: which call made it */
    uint32_t gen;            /* bumped when a later step overwrites the bytes */
    uint32_t overwritten_in; /* the step that last did */
    uint32_t cap_id;         /* the capture that last classified this storage ... */
    int cap_slot;            /* ... and the IR slot it got there */
    uint32_t version;        /* bumped by every op that writes the bytes (autograd's check) */
    uint32_t grad_gen;       /* bumped when a handle of it starts or stops requiring grad */
} sg__storage;

/* A handle's entry in its context's registry of live handles (registry.c):
 * what lets a stale pointer be recognized without being read. */
typedef struct sg__reg {
    struct sg__reg *next, **pprev; /* the bucket's chain */
    const void *obj;               /* the handle itself */
    int kind;                      /* SG__REG_*; 0: not registered */
} sg__reg;

enum { SG__REG_TENSOR = 1, SG__REG_FN = 2, SG__REG_OPTIM = 3, SG__REG_COMM = 4 };
#define SG__REG_BUCKETS 1024

#define SG__TENSOR_LIVE 0x5347544eu /* "SGTN" */
#define SG__TENSOR_DEAD 0xdeadbeefu

struct sg_tensor {
    uint32_t magic;
    uint32_t id; /* a serial number, for messages */
    /* A view made while recording: the id of the handle from before the
     * recording it descends from (its own id otherwise), so that the
     * capture tells a parameter's views from an input's (record.c). */
    uint32_t src;
    sg_ctx *ctx;
    sg_dtype dtype;
    int ndim;
    int64_t shape[SG_MAX_DIMS];
    int64_t stride[SG_MAX_DIMS]; /* in elements */
    int64_t offset;              /* in elements, into storage */
    sg__storage *st;
    uint32_t st_gen;        /* st->gen when this handle was made: a mismatch means stale */
    bool fn_owned;          /* an output handle in a compiled fn's ring, not in the lists */
    bool was_output;        /* buried with its fn (sg__tensor_bury): for the message */
    struct sg__gnode *grad_fn; /* what made it, for sg_grad (a leaf's own node); NULL: no grad */
    sg_tensor *prev, *next; /* the context's list of live or quarantined handles */
    sg__reg reg;            /* registered while its memory is the handle's (registry.c) */
};

/*
 * What a backend gives the context: running one node, and owning tensor
 * bytes. Storage may live on a device; the front-ends never touch data
 * pointers except through these.
 */
typedef struct sg__exec {
    const char *name;
    sg_status (*run)(sg_ctx *ctx, const sg__node *n);
    sg_status (*alloc)(sg_ctx *ctx, size_t nbytes, void **data);
    void (*free)(sg_ctx *ctx, void *data, size_t nbytes);
    /* Byte copies: device to device, and between a storage and the host. */
    sg_status (*copy)(sg_ctx *ctx, void *dst, const void *src, size_t nbytes);
    sg_status (*download)(sg_ctx *ctx, void *dst, const void *src, size_t nbytes);
    sg_status (*upload)(sg_ctx *ctx, void *dst, const void *src, size_t nbytes);
    sg_status (*sync)(sg_ctx *ctx); /* NULL: ops finish before they return */
    void (*destroy)(sg_ctx *ctx);
    /* Host bytes the executor keeps for the context's life, whatever fns
     * come and go: loaded kernels, the records of cached device blocks,
     * library plans (NULL: none). They grow with what has run, never with a
     * fn that is gone: sg__exec_cache_bytes. */
    size_t (*cache_bytes)(const sg_ctx *ctx);
    void *state;
} sg__exec;

#define SG__MSG_SIZE 1024
#define SG__QUARANTINE 4096

struct sg_ctx {
    sg_backend backend;
    int num_threads;
    sg_alloc_fn alloc;
    void *alloc_user;
    sg_log_fn log;
    void *log_user;
    uint32_t log_topics; /* SG_LOGS bits, when no hook is installed */
    size_t host_live, host_peak;
    size_t dev_live, dev_peak; /* tensor and pool bytes held through exec.alloc */

    sg_status status; /* sticky: the first failure since sg_clear_error */
    char msg[SG__MSG_SIZE];
    uint64_t nfails; /* failures said (sg__fail) so far: whether a stretch of work failed */
    sg_status last;  /* the latest failure's status (msg's) */

    sg__exec exec;
    const void *gops; /* the backend's compiled-graph operations (graphs/backend.h) */

    struct sg__rec *rec;    /* the capture in progress, or NULL */
    /* The steps running now (run_step; the innermost first): what a step may
     * not release or destroy under itself (its inputs, its fn, the context). */
    struct sg__step_frame {
        const struct sg_fn *fn;
        sg_tensor *const *in;
        int nin;
        struct sg__step_frame *up;
    } * steps;
    struct sg__pool *pool;  /* the static memory pool of compiled fns (memory/) */
    struct sg_fn *fns;      /* compiled fns, for the pool to re-point on growth */
    struct sg_fn *dead_fns; /* the most recently destroyed fns' records (newest first) */
    int ndead_fns;
    uint32_t step;          /* sg_mark_step_begin count */
    bool grad_off;          /* sg_set_grad_enabled(ctx, false), or inside sg_grad */
    uint32_t grad_epoch;    /* sg_grad calls, to mark the nodes one call visits */
    uint32_t next_id;
    sg_tensor live; /* sentinel of the live handle list */
    sg_tensor dead; /* sentinel of the quarantine (oldest first) */
    int ndead;
    bool no_cache_reads; /* while compiling for a fn with force_disable_caches */
    struct sg_comm *comms; /* communicators made on this context (graphs/comm.c) */
    struct sg_optim *optims; /* optimizers made on this context (optim.c) */
    uint32_t next_comm_id;

    /* The registry (registry.c): this context's handles by address, under
     * its own lock, and the process's list of live contexts. */
    atomic_flag reg_lock;
    struct sg_ctx *reg_next;
    sg__reg *reg_bucket[SG__REG_BUCKETS];
};

/* ------------------------------------------------------------ context helpers */

/* Host memory through the context's hook; sg__alloc returns NULL on failure
 * without setting an error (callers name what failed). */
SG__HIDDEN void *sg__alloc(sg_ctx *ctx, size_t nbytes);
SG__HIDDEN void *sg__calloc(sg_ctx *ctx, size_t nbytes);
SG__HIDDEN void sg__free(sg_ctx *ctx, void *p, size_t nbytes);
/* Tensor and pool bytes through the backend (exec.alloc / exec.free),
 * counted for sg_ctx_memory_stats. */
SG__HIDDEN sg_status sg__dev_alloc(sg_ctx *ctx, size_t nbytes, void **data);
SG__HIDDEN void sg__dev_free(sg_ctx *ctx, void *data, size_t nbytes);
/* The executor's cache bytes (sg__exec.cache_bytes; 0 without). */
SG__HIDDEN size_t sg__exec_cache_bytes(const sg_ctx *ctx);

/* Record a failure: sets the message (printf-style), the sticky status if
 * none is set, logs it under "error", and returns s. */
SG__HIDDEN sg_status sg__fail(sg_ctx *ctx, sg_status s, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
SG__HIDDEN sg_status sg__vfail(sg_ctx *ctx, sg_status s, const char *fmt, va_list ap);
/* Log one line under a topic (see sg_log_fn). */
SG__HIDDEN void sg__log(sg_ctx *ctx, const char *topic, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Like sg__log, but without a hook the line goes to stderr even when
 * SG_LOGS does not name the topic (for what must be said once). */
SG__HIDDEN void sg__log_always(sg_ctx *ctx, const char *topic, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Fill a context's common fields; the backend then sets ctx->exec. */
SG__HIDDEN void sg__ctx_init(sg_ctx *ctx, const sg_ctx_opts *opts);
/* Free every handle and storage still held (before the backend goes). */
SG__HIDDEN void sg__ctx_release_all(sg_ctx *ctx);
/* The registry of live handles (registry.c). A context is listed from
 * sg_ctx_create's success until sg_ctx_destroy; sg__reg_ctx_unlist says
 * whether it was listed, sg__reg_ctx_listed whether it is. A handle is added once its memory is the
 * handle's and removed before that memory is freed. sg__reg_find returns
 * the live context that holds obj as a handle of that kind, or NULL,
 * never reading obj; sg__reg_fn_known is its cached form for sg_call. */
SG__HIDDEN void sg__reg_ctx_list(sg_ctx *ctx);
SG__HIDDEN bool sg__reg_ctx_unlist(sg_ctx *ctx);
SG__HIDDEN bool sg__reg_ctx_listed(const sg_ctx *ctx);
SG__HIDDEN void sg__reg_add(sg_ctx *ctx, sg__reg *r, const void *obj, int kind);
SG__HIDDEN void sg__reg_remove(sg_ctx *ctx, sg__reg *r);
SG__HIDDEN sg_ctx *sg__reg_find(const void *obj, int kind);
/* Free every optimizer made on ctx (sg_ctx_destroy; optim.c). */
SG__HIDDEN void sg__optims_destroy_all(sg_ctx *ctx);
SG__HIDDEN bool sg__reg_fn_known(const void *fn);
/* A registered tensor handle, zeroed but for ctx and reg (magic 0), and
 * its end: unregistered, then freed. */
SG__HIDDEN sg_tensor *sg__handle_alloc(sg_ctx *ctx);
SG__HIDDEN void sg__handle_free(sg_ctx *ctx, sg_tensor *t);
/* The message of a failed sg_ctx_create, per thread; also of a call given
 * a handle whose context was destroyed (sg_last_error(NULL)). */
SG__HIDDEN void sg__set_create_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ------------------------------------------------------------ element conversions */

/* f16 and bf16 bits <-> float, exactly as every backend and generated
 * dialect rounds (nearest even, overflow to inf, NaN kept NaN). */

static inline float sg__h2f(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 31, m = h & 1023, u;
    if (e == 0) {
        if (m == 0) {
            u = sign;
        } else { /* subnormal: normalize */
            e = 113;
            while (!(m & 1024)) {
                m <<= 1;
                e--;
            }
            u = sign | (e << 23) | ((m & 1023) << 13);
        }
    } else if (e == 31) {
        u = sign | 0x7f800000u | (m << 13);
    } else {
        u = sign | ((e + 112) << 23) | (m << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Round to nearest even, with overflow to inf and NaN kept NaN. */
static inline uint16_t sg__f2h(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000;
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00);  /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00); /* >= 65520 rounds to inf */
    if (a < 0x38800000u) { /* below the smallest normal: subnormal or zero */
        float af;
        memcpy(&af, &a, 4);
        /* Adding 0.5 (2^-1) lines the half's subnormal step up with the float's last bits. */
        float r = af + 0.5f;
        uint32_t ru;
        memcpy(&ru, &r, 4);
        return (uint16_t)(sign | (ru - 0x3f000000u));
    }
    uint32_t mant_odd = (a >> 13) & 1;
    a += 0xc8000fffu + mant_odd; /* rebias exponent (-112 << 23) and round */
    return (uint16_t)(sign | (a >> 13));
}

static inline float sg__bf2f(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t sg__f2bf(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

/* A double as an integer of dt (i32, i64 or bool) by the cast rule:
 * truncate, saturate, NaN to 0 (NaN is true as a bool). (int64_t) of an
 * out-of-range double is undefined in C, hence the explicit limits. */
SG__HIDDEN int64_t sg__double_to_int(double v, sg_dtype dt);
/*
 * v rounded to float "to odd": when inexact, the neighbour whose last bit is
 * 1. Rounding that float to f16 or bf16 (at least 2 bits narrower) gives
 * what rounding v directly would; (float)v alone rounds twice and can turn
 * a value just above a tie into the tie (1 + 2^-11 + 2^-40 became 1.0 in f16).
 */
SG__HIDDEN float sg__round_odd(double v);

/* ------------------------------------------------------------ tensor helpers */

SG__HIDDEN bool sg__dtype_valid(sg_dtype dt);
SG__HIDDEN bool sg__dtype_is_float(sg_dtype dt);
SG__HIDDEN int64_t sg__numel(int ndim, const int64_t *shape);
SG__HIDDEN bool sg__is_contiguous(const sg_tensor *t);
/* "f32[2,3]" plus " strides [..]" when not contiguous; buf of 96 is enough. */
SG__HIDDEN const char *sg__describe(const sg_tensor *t, char *buf, size_t size);
SG__HIDDEN const char *sg__shape_str(int ndim, const int64_t *shape, char *buf, size_t size);
#define SG__DESC 160

/* A new contiguous tensor with fresh storage; NULL (and a message naming op)
 * on failure. */
SG__HIDDEN sg_tensor *sg__tensor_new(sg_ctx *ctx, const char *op, sg_dtype dt, int ndim,
                                     const int64_t *shape);
/* A new handle over t's storage with the given geometry (a view). */
SG__HIDDEN sg_tensor *sg__tensor_view(sg_tensor *t, const char *op, int ndim, const int64_t *shape,
                                      const int64_t *stride, int64_t offset);
/* Put a handle that stepgraph made outside the lists into the quarantine
 * (magic DEAD), as if the user had released it. */
SG__HIDDEN void sg__tensor_bury(sg_tensor *t);
/* Drop one reference to a storage; frees it with the last. */
SG__HIDDEN void sg__storage_unref(sg_ctx *ctx, sg__storage *st);
/* Drop a handle made inside stepgraph (no use-after-release tracking). */
SG__HIDDEN void sg__tensor_drop(sg_tensor *t);
/* The address of element 0 (offset applied). */
SG__HIDDEN void *sg__data(const sg_tensor *t);

/*
 * Check an op's inputs: returns the context, or NULL when the op must
 * return NULL. A NULL entry returns NULL silently (an earlier op failed and
 * said why) unless optional[i]; a released tensor or a mix of contexts
 * records an error naming op. n tensors in ts; optional may be NULL.
 */
SG__HIDDEN sg_ctx *sg__check_inputs(const char *op, int n, sg_tensor *const *ts,
                                    const bool *optional);
/* Why sg__check_inputs returned NULL, for calls that return a status:
 * SG_ERR_NULL for a NULL tensor, else the status it recorded. */
SG__HIDDEN sg_status sg__inputs_status(int n, sg_tensor *const *ts);
/* Normalize a possibly negative dim against ndim; -1 when out of range. */
SG__HIDDEN int sg__norm_dim(int dim, int ndim);
/* The broadcast of n shapes; false (and a message naming op) if they clash. */
SG__HIDDEN bool sg__broadcast(sg_ctx *ctx, const char *op, int n, sg_tensor *const *ts, int *ndim,
                              int64_t *shape);
/* Strides that read t as if expanded to (ndim, shape): 0 on broadcast dims. */
SG__HIDDEN void sg__broadcast_strides(const sg_tensor *t, int ndim, const int64_t *shape,
                                      int64_t *stride);

/* ------------------------------------------------------------ IR (record.c) */

/*
 * A capture records the ops of one run of a step as IR: slots are the
 * storages the step touched (its inputs, the parameters it read, the
 * buffers it made), refs are tensors as (slot, geometry), nodes are ops over
 * refs. The capture runs the step for real at the same time, so its first
 * call returns real results; what it records is what replays run.
 */
typedef enum sg__slot_kind { SG__SLOT_INPUT, SG__SLOT_PARAM, SG__SLOT_INTERNAL } sg__slot_kind;

typedef struct sg__slot {
    sg__slot_kind kind;
    int input;          /* INPUT: which input */
    sg__storage *param; /* PARAM: the storage, pinned by the fn */
    size_t nbytes;      /* INTERNAL: bytes */
    int first, last;    /* nodes that first write and last touch it; -1 none */
    int output;         /* INTERNAL: -1, or the first output that lives here */
    int mutated_by;     /* INPUT/PARAM: the first node that writes it, or -1 */
    uint32_t grad_gen;  /* PARAM: param->grad_gen when captured (a guard) */
    /* INPUT: its storage when the step also read it through a tensor made
     * outside the step (a parameter that the call passed as an input too),
     * pinned: replays are right only while that input is this storage (a
     * guard), since the IR reads the parameter through the input. */
    sg__storage *alias;
} sg__slot;

typedef struct sg__ref {
    int slot;
    sg_dtype dtype;
    int ndim;
    int64_t shape[SG_MAX_DIMS], stride[SG_MAX_DIMS];
    int64_t offset; /* elements from the slot's base (an input's element 0) */
} sg__ref;

typedef struct sg__irnode {
    sg__op op;
    double f[3];
    int64_t i[3];
    uint32_t mask;
    int nin;
    int args; /* index of the first of nin ref ids in ir->args (-1: optional input left out) */
    int out;  /* ref id */
} sg__irnode;

typedef struct sg__ir {
    sg__slot *slots;
    sg__ref *refs;
    sg__irnode *nodes;
    int *args;
    int nslots, nrefs, nnodes, nargs;
    int cap_slots, cap_refs, cap_nodes, cap_args;
    int nin, nout;
    int *out_refs; /* nout ref ids */
} sg__ir;

typedef struct sg__rec {
    sg__ir *ir;
    sg_tensor *const *in; /* the step's inputs: input refs are relative to their element 0 */
    uint32_t id;
    bool fullgraph;
    bool broken;            /* a graph break happened: the IR is not replayable */
    bool refused; /* fullgraph refused a break: the call fails, whatever the step returns */
    bool dry;               /* record without executing (see graphs/fn.c: call_capture) */
    char why[SG__MSG_SIZE]; /* the reason */
} sg__rec;

/* Start recording into ir (already zeroed) for a step with these inputs. */
SG__HIDDEN sg_status sg__rec_begin(sg_ctx *ctx, sg__rec *rec, sg__ir *ir, int nin,
                                   sg_tensor *const *in, bool fullgraph);
/* Stop recording; note the outputs (which must be non-NULL). */
SG__HIDDEN sg_status sg__rec_end(sg_ctx *ctx, int nout, sg_tensor *const *out);
/* Record one node (called by sg__dispatch while recording). */
SG__HIDDEN sg_status sg__rec_node(sg_ctx *ctx, const sg__node *n);
/* A new storage made while recording becomes an internal slot. */
SG__HIDDEN void sg__rec_storage(sg_ctx *ctx, sg__storage *st);
/* A host read or write of tensor data while recording: a graph break. With
 * fullgraph it fails (SG_ERR_GRAPH_BREAK, message naming what); otherwise it
 * marks the capture broken and returns SG_OK so the step runs on eagerly --
 * except in a dry capture, where nothing before it ran: it fails then too
 * (SG_ERR_GRAPH_BREAK), as does every op and host read after it (nothing
 * runs: the step's tensors have no bytes), and the caller runs the whole
 * step again eagerly. */
SG__HIDDEN sg_status sg__rec_break(sg_ctx *ctx, const char *what, const sg_tensor *t);
/* Free an IR's arrays and unpin its params. */
SG__HIDDEN void sg__ir_free(sg_ctx *ctx, sg__ir *ir);
/* One IR node as text ("%5 = add(%3, %4) : f32[4,8]") into buf. */
SG__HIDDEN const char *sg__ir_node_str(const sg__ir *ir, int node, char *buf, size_t size);

/* The status of a stale tensor, with its message, or SG_OK. */
SG__HIDDEN sg_status sg__check_stale(const sg_tensor *t, const char *what);
/* A single tensor argument of a call that is not an op (what names the
 * call): SG_ERR_NULL, SG_ERR_RELEASED (with a message), SG_ERR_INVALID_ARG
 * for something that is no tensor, a stale output's status, or SG_OK. */
SG__HIDDEN sg_status sg__check_tensor(const char *what, const sg_tensor *t);

/* Hand a node to the executor (and to the recorder while capturing). */
SG__HIDDEN sg_status sg__dispatch(sg_ctx *ctx, const sg__node *n);

/*
 * Run an op whose output is new: make out (dt, ndim, shape), fill n->out,
 * dispatch, and return out, or NULL with out dropped on failure.
 */
SG__HIDDEN sg_tensor *sg__run_new(sg_ctx *ctx, sg__node *n, sg_dtype dt, int ndim,
                                  const int64_t *shape);

/* ------------------------------------------------------------ attention (ops_data.c) */

/* ATTENTION's i[0] flags: key j is visible to query i when j < L (L =
 * kv_len[b] clamped to [0, S], or S without kv_len) and, with CAUSAL,
 * j <= L - Lq + i. A query that sees no key gives NaN. */
#define SG__ATTN_CAUSAL 1
/* ATTENTION's i[0] flag: the result will have a backward, so the node's
 * output is packed (sg__attn_lse_at): the result (B, Lq, Hq, D) at 0, then
 * each row's logsumexp of its scaled, masked scores (f32, row (b * Hq + h)
 * * Lq + i; +inf for a row that sees no key), which ATTENTION_BWD reads
 * instead of recomputing it. A CUDA path that does not compute it fills it
 * with NaN (every bit set): the backward then recomputes those rows. */
#define SG__ATTN_LSE 2
/* ATTENTION's i[0] flag: a bool mask is true where a key is dropped
 * (masked_fill's sense; fusion/canon.c sets it), not where it is kept. */
#define SG__ATTN_MASK_DROPS 4
/* Where the row logsumexps of ATTENTION's packed output start, in elements
 * of its dtype after no = B * Lq * Hq * D (16-byte aligned), and the packed
 * output's length for rows = B * Hq * Lq. */
static inline int64_t sg__attn_lse_at(int64_t no) { return (no + 7) / 8 * 8; }
static inline int64_t sg__attn_numel(int64_t no, int64_t rows, size_t esize) {
    return sg__attn_lse_at(no) + (int64_t)(((size_t)rows * sizeof(float) + esize - 1) / esize);
}

/* ATTENTION's output is stored (B, Lq, Hq, D), the heads side by side; the
 * result (B, Hq, Lq, D) is this view of it, dims 1 and 2 swapped (a new
 * reference, no gradient). Also takes a gradient of that output to the
 * result's order. */
SG__HIDDEN sg_tensor *sg__attn_heads(sg_tensor *t, const char *op);

/* sg_sdpa as the ops it is made of (matmul, where/add, softmax, matmul):
 * for what the ATTENTION kernels do not take (Dv != D, D > 256, more than
 * 4 dims, a float mask that needs a gradient). Grouped-query K/V (dim -3
 * dividing q's) included. */
SG__HIDDEN sg_tensor *sg__sdpa_decomposed(sg_tensor *q, sg_tensor *k, sg_tensor *v,
                                          sg_tensor *mask, bool causal, double scale);
/* ------------------------------------------------------------ collectives (ops_comm.c) */

/*
 * What the op front-ends know of a communicator: its id (the nodes name it
 * by that, so a capture that outlives it fails cleanly), rank and size.
 * graphs/comm.c makes it and owns the rest (impl: MPI or NCCL state).
 */
#define SG__COMM_LIVE 0x5347434du /* "SGCM" */
struct sg_comm {
    uint32_t magic;
    uint32_t id;
    sg_ctx *ctx;
    int rank, size, local_rank;
    double timeout_s;
    bool broken; /* a collective timed out or failed: every later one fails */
    const struct sg__comm_impl *impl;
    void *state;
    struct sg_comm *next; /* the context's list */
    sg__reg reg;          /* its entry in the context's registry */
};


/*
 * ATTENTION's gradients (the ATTENTION_BWD node): in = the ATTENTION node's
 * inputs {q, k, v, mask?, kv_len?} (4-d views), o its result (B,Hq,Lq,D)
 * (the node's output through sg__attn_heads), lse NULL or the forward's row
 * logsumexps (SG__ATTN_LSE: a 1-d view of o's dtype over their f32 bits),
 * dout the gradient of o, scale and flags its f[0] and i[0]. Sets *dq (B,Hq,Lq,D) and
 * *dk, *dv (B,Hkv,S,D), views of one packed buffer of q's dtype laid out as
 * q, k and v are where their strides allow (sg__attn_bwd_parts);
 * a query row that sees no key contributes nothing (its output is NaN).
 */
SG__HIDDEN sg_status sg__sdpa_grad(sg_tensor *const *in, sg_tensor *o, sg_tensor *lse,
                                   sg_tensor *dout, double scale, int flags, sg_tensor **dq,
                                   sg_tensor **dk, sg_tensor **dv);
/*
 * cross_entropy's gradient (the CROSS_ENTROPY_BWD node): logits (N, C) and
 * targets (N) as the CROSS_ENTROPY node's inputs, g the loss's gradient (a
 * 0-d float). Gives (softmax(logits) - onehot(targets)) * g / N, contiguous,
 * of logits' dtype, or NULL.
 */
SG__HIDDEN sg_tensor *sg__cross_entropy_grad(sg_tensor *logits, sg_tensor *targets, sg_tensor *g);
/*
 * layer_norm's and rms_norm's row statistics (the NORM_STATS node): x float,
 * at least 1-d; layer: true for layer_norm. Gives f32 (..., 2), x's shape
 * with the last dim 2: each row's mean (0 for rms_norm) and 1 / sqrt(var +
 * eps), or NULL.
 */
SG__HIDDEN sg_tensor *sg__norm_stats(sg_tensor *x, bool layer, double eps);
/*
 * The gradients of layer_norm or rms_norm (the NORM_BWD node): x the norm's
 * input, g the gradient of its output (x's shape and dtype), w the weight
 * or NULL, r a gradient to add to the input's (x's shape and dtype) or NULL,
 * eps the norm's; the row statistics are recomputed from x. parts 0: gives
 * the input's gradient rstd * (gw - mean(gw) - xh * mean(gw * xh)) (+ r)
 * with gw = g * w and xh = (x - mean) * rstd (without the mean(gw) term for
 * rms_norm), contiguous, of x's dtype. parts SG__NB_DW and/or SG__NB_DB:
 * gives the packed 1-d result of ops.def (the norms' rule takes views).
 * NULL on failure.
 */
#define SG__NB_DW 1 /* NORM_BWD's i[1]: the weight's gradient sum(g * xh) */
#define SG__NB_DB 2 /* ... and the bias's, sum(g) */
SG__HIDDEN sg_tensor *sg__norm_grad(sg_tensor *x, sg_tensor *g, sg_tensor *w, sg_tensor *r,
                                    bool layer, double eps, int parts);
/*
 * gelu_tanh's input gradient (the GELU_TANH_BWD node): x the gelu_tanh's
 * input, g the gradient of its output, float of one dtype (broadcast).
 * Gives gelu_tanh'(x) * g computed in f32 and rounded once to x's dtype, or
 * NULL. One pointwise op, so that a BLAS can compute it in the epilogue of
 * the product that makes g (fusion/fuse.c lib_epi_of).
 */
SG__HIDDEN sg_tensor *sg__gelu_tanh_grad(sg_tensor *x, sg_tensor *g);
/* ATTENTION_BWD's packed output, in elements of q's dtype: dq, dk and dv in
 * the first nq + 2 * nkv (sg__attn_bwd_parts), then at sg__attn_bwd_ws (16-byte aligned) the row
 * workspace of 2 * rows f32 (each row's logsumexp of the scaled scores, then
 * rowsum(dO * O)), rows = B * Hq * Lq. */
static inline int64_t sg__attn_bwd_ws(int64_t nq, int64_t nkv) {
    return (nq + 2 * nkv + 7) / 8 * 8;
}
static inline int64_t sg__attn_bwd_numel(int64_t nq, int64_t nkv, int64_t rows, size_t esize) {
    return sg__attn_bwd_ws(nq, nkv) + (int64_t)((size_t)(2 * rows) * sizeof(float) / esize);
}
/*
 * Where ATTENTION_BWD writes dq, dk and dv in its packed output: element
 * (b, h, i, e) of part k (0 dq, 1 dk, 2 dv) at off + b * sb + h * sh + i *
 * si + e. The node's i[1] says (sg__sdpa_grad sets it): 0 for each
 * contiguous at 0, nq and nq + nkv; else the layout of the forward's q, k
 * and v mirrored (bit 0), one dense region of all three when they are
 * views of one base (bit 1), so that their gradients are the same views
 * of one gradient of the base. qs = (B, Hq, Lq, D), ks = (B, Hkv, S, D).
 */
typedef struct sg__attn_part {
    int64_t off, sb, sh, si;
} sg__attn_part;
SG__HIDDEN void sg__attn_bwd_parts(int64_t layout, const int64_t *qs, const int64_t *ks,
                                   sg__attn_part *part);
/* ------------------------------------------------------------ autograd (autograd.c) */

/* How a view relates to the tensor it views, for its gradient. */
typedef enum sg__view_kind {
    SG__VIEW_RESHAPE, /* same elements in row-major order: view, reshape, (un)squeeze, contiguous */
    SG__VIEW_PERMUTE, /* info = the permutation */
    SG__VIEW_SLICE,   /* info = {dim, start, step} */
    SG__VIEW_EXPAND   /* size-1 dims stretched (and dims added in front) */
} sg__view_kind;

/* After an op made out from n (sg__run_new): when grad is on and an input
 * needs a gradient, attach the node's backward to out. Returns out, or NULL
 * with out dropped when memory ran out. */
SG__HIDDEN sg_tensor *sg__grad_record(sg_ctx *ctx, const sg__node *n, sg_tensor *out);
/* After a view v of src was made: likewise. v may be NULL (passed through). */
SG__HIDDEN sg_tensor *sg__grad_view(sg_tensor *src, sg_tensor *v, sg__view_kind kind,
                                    const int64_t *info);
/* Drop one reference to a backward node (tensors hold one each). */
SG__HIDDEN void sg__gnode_unref(sg_ctx *ctx, struct sg__gnode *g);
/* A handle over t's bytes and geometry that is in no list (autograd keeps
 * these for the backward); freed with sg__tensor_unhold. */
SG__HIDDEN sg_tensor *sg__tensor_hold(sg_tensor *t);
SG__HIDDEN void sg__tensor_unhold(sg_tensor *h);
/* dst.index(dim, idx[i]) += src.index(dim, i), in index order (deterministic);
 * dst float, src of its dtype; the INDEX_ADD node (in = {dst, idx, src}). */
SG__HIDDEN sg_status sg__index_add_(sg_tensor *dst, int dim, sg_tensor *idx, sg_tensor *src);

#endif /* SG_CAPTURE_H */
