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
    SG__FAM_DATA
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
    void *data; /* host pointer, or a device address for device backends */
    size_t nbytes;
} sg__storage;

#define SG__TENSOR_LIVE 0x5347544eu /* "SGTN" */
#define SG__TENSOR_DEAD 0xdeadbeefu

struct sg_tensor {
    uint32_t magic;
    uint32_t id; /* a serial number, for messages */
    sg_ctx *ctx;
    sg_dtype dtype;
    int ndim;
    int64_t shape[SG_MAX_DIMS];
    int64_t stride[SG_MAX_DIMS]; /* in elements */
    int64_t offset;              /* in elements, into storage */
    sg__storage *st;
    sg_tensor *prev, *next; /* the context's list of live or quarantined handles */
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
    /* Byte copies between a storage and the host. */
    sg_status (*download)(sg_ctx *ctx, void *dst, const void *src, size_t nbytes);
    sg_status (*upload)(sg_ctx *ctx, void *dst, const void *src, size_t nbytes);
    void (*destroy)(sg_ctx *ctx);
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

    sg_status status; /* sticky: the first failure since sg_clear_error */
    char msg[SG__MSG_SIZE];

    sg__exec exec;

    uint32_t next_id;
    sg_tensor live;      /* sentinel of the live handle list */
    sg_tensor dead;      /* sentinel of the quarantine (oldest first) */
    int ndead;
};

/* ------------------------------------------------------------ context helpers */

/* Host memory through the context's hook; sg__alloc returns NULL on failure
 * without setting an error (callers name what failed). */
SG__HIDDEN void *sg__alloc(sg_ctx *ctx, size_t nbytes);
SG__HIDDEN void *sg__calloc(sg_ctx *ctx, size_t nbytes);
SG__HIDDEN void sg__free(sg_ctx *ctx, void *p, size_t nbytes);

/* Record a failure: sets the message (printf-style), the sticky status if
 * none is set, logs it under "error", and returns s. */
SG__HIDDEN sg_status sg__fail(sg_ctx *ctx, sg_status s, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
SG__HIDDEN sg_status sg__vfail(sg_ctx *ctx, sg_status s, const char *fmt, va_list ap);
/* Log one line under a topic (see sg_log_fn). */
SG__HIDDEN void sg__log(sg_ctx *ctx, const char *topic, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Fill a context's common fields; the backend then sets ctx->exec. */
SG__HIDDEN void sg__ctx_init(sg_ctx *ctx, const sg_ctx_opts *opts);
/* Free every handle and storage still held (before the backend goes). */
SG__HIDDEN void sg__ctx_release_all(sg_ctx *ctx);
/* The message of a failed sg_ctx_create, per thread. */
SG__HIDDEN void sg__set_create_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

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
SG__HIDDEN bool sg__broadcast(sg_ctx *ctx, const char *op, int n, sg_tensor *const *ts,
                              int *ndim, int64_t *shape);
/* Strides that read t as if expanded to (ndim, shape): 0 on broadcast dims. */
SG__HIDDEN void sg__broadcast_strides(const sg_tensor *t, int ndim, const int64_t *shape,
                                      int64_t *stride);

/* Hand a node to the executor (or, later, the recorder). */
SG__HIDDEN sg_status sg__dispatch(sg_ctx *ctx, const sg__node *n);

/*
 * Run an op whose output is new: make out (dt, ndim, shape), fill n->out,
 * dispatch, and return out, or NULL with out dropped on failure.
 */
SG__HIDDEN sg_tensor *sg__run_new(sg_ctx *ctx, sg__node *n, sg_dtype dt, int ndim,
                                  const int64_t *shape);

#endif /* SG_CAPTURE_H */
