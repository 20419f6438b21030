/*
 * stepgraph.h -- the one public header of stepgraph, and its manual.
 *
 * stepgraph makes a training or inference step written in C cheap to run
 * again and again. A step is a C function over stepgraph tensor ops. It runs
 * eagerly (one kernel per op) on the CPU today; captured, fused and replayed
 * as one device graph over a static memory pool as the later layers land.
 *
 * A first program:
 *
 *     #include <stepgraph.h>
 *
 *     sg_ctx *ctx;
 *     if (sg_ctx_create(NULL, &ctx) != SG_OK) return 1;     // CPU, defaults
 *     int64_t shape[2] = {2, 3};
 *     float xs[6] = {1, 2, 3, 4, 5, 6};
 *     sg_tensor *x = sg_from_host(ctx, SG_F32, 2, shape, xs);
 *     sg_tensor *y = sg_softmax(sg_mul_scalar(x, 0.5), -1); // NULL-propagating
 *     if (!y) { fprintf(stderr, "%s\n", sg_last_error(ctx)); return 1; }
 *     float ys[6];
 *     sg_read(y, ys, sizeof ys);
 *     sg_ctx_destroy(ctx);                                  // frees every tensor
 *
 * Conventions that hold everywhere:
 *  - Every fallible call that is not an op returns an sg_status and sets its
 *    results through out-parameters only on success.
 *  - Ops return a new tensor, or NULL on failure. An op given a NULL input
 *    returns NULL without a new message, so a whole expression can be checked
 *    once at its end: the context keeps the failure (sg_ctx_status) and its
 *    text (sg_last_error) until sg_clear_error. In-place ops end in '_' and
 *    return a status.
 *  - A failed call leaves the context and every tensor as they were.
 *  - Dtypes: f32, f16, bf16, i32, i64, bool. f16 and bf16 are computed in f32;
 *    reductions and matmuls accumulate in at least f32.
 *  - Shapes and element counts are int64_t, byte sizes size_t. A negative dim
 *    counts from the end (-1 is the last dim), as in PyTorch.
 *  - Broadcasting follows NumPy and PyTorch: shapes align at their last dim;
 *    a dim of size 1 stretches.
 *  - Tensors made by the user belong to the user until sg_release; the context
 *    frees whatever is left when it is destroyed.
 *  - Destroying or releasing NULL does nothing.
 */
#ifndef STEPGRAPH_H
#define STEPGRAPH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define SG_API
#else
#define SG_API __attribute__((visibility("default")))
#endif

#define SG_VERSION_MAJOR 0
#define SG_VERSION_MINOR 1
#define SG_VERSION_PATCH 0

/* The version string of the library that is linked, "0.1.0". */
SG_API const char *sg_version(void);

/* ---------------------------------------------------------------- status */

typedef enum sg_status {
    SG_OK = 0,
    SG_ERR_INVALID_ARG,         /* an argument is out of its domain */
    SG_ERR_NULL,                /* a required pointer was NULL */
    SG_ERR_SHAPE,               /* shapes do not fit the op */
    SG_ERR_DTYPE,               /* a dtype the op does not take */
    SG_ERR_INDEX,               /* an index or a dim out of range */
    SG_ERR_OOM,                 /* an allocation failed */
    SG_ERR_WRONG_CONTEXT,       /* tensors of two contexts were mixed */
    SG_ERR_RELEASED,            /* a tensor was used after sg_release */
    SG_ERR_BACKEND_UNAVAILABLE, /* the asked-for backend has no driver or device */
    SG_ERR_UNSUPPORTED,         /* valid, but not implemented for this case */
    SG_ERR_STALE_OUTPUT,        /* an output was overwritten by a later step */
    SG_ERR_GRAPH_BREAK,         /* a host read inside a fullgraph capture */
    SG_ERR_COMPILE,             /* generated code failed to compile */
    SG_ERR_DRIVER,              /* a device driver call failed */
    SG_ERR_INTERNAL             /* a bug in stepgraph: please report it */
} sg_status;

/* A short constant name for a status, "SG_ERR_SHAPE"; never NULL. */
SG_API const char *sg_status_str(sg_status s);

/* ---------------------------------------------------------------- dtypes */

typedef enum sg_dtype { SG_F32 = 0, SG_F16, SG_BF16, SG_I32, SG_I64, SG_BOOL } sg_dtype;

#define SG_NUM_DTYPES 6

/* Bytes per element (4, 2, 2, 4, 8, 1); 0 for a value that is no dtype. */
SG_API size_t sg_dtype_size(sg_dtype dt);
/* "f32", "f16", "bf16", "i32", "i64", "bool"; "?" for a value that is no dtype. */
SG_API const char *sg_dtype_name(sg_dtype dt);

/* ---------------------------------------------------------------- context */

typedef struct sg_ctx sg_ctx;
typedef struct sg_tensor sg_tensor;

typedef enum sg_backend {
    SG_BACKEND_AUTO = 0, /* the best one present: cuda > hip > ze > cpu */
    SG_BACKEND_CPU,
    SG_BACKEND_CUDA,
    SG_BACKEND_HIP,
    SG_BACKEND_ZE
} sg_backend;

/* "auto", "cpu", "cuda", "hip", "ze". */
SG_API const char *sg_backend_name(sg_backend b);

/*
 * The allocator hook, in Lua's shape: allocate (ptr == NULL) or free
 * (new_size == 0) host memory. A free gets the size the block was made with.
 * Returning NULL for an allocation makes the call that needed it fail with
 * SG_ERR_OOM and leave everything as it was; tests use this to fail the Nth
 * allocation. All host memory stepgraph holds goes through this hook.
 */
typedef void *(*sg_alloc_fn)(void *user, void *ptr, size_t old_size, size_t new_size);

/*
 * The log hook: one line of text (no newline) under one topic: "error",
 * "graph_breaks", "recompiles", "guards", "perf_hints", "output_code",
 * "fallbacks". Without a hook nothing is printed, unless SG_LOGS names the
 * topic, in which case the line goes to stderr.
 */
typedef void (*sg_log_fn)(void *user, const char *topic, const char *line);

typedef struct sg_ctx_opts {
    sg_backend backend; /* SG_BACKEND_AUTO when zero */
    int num_threads;    /* CPU threads for eager ops; 0: OpenMP's default */
    sg_alloc_fn alloc;  /* NULL: malloc/free */
    void *alloc_user;
    sg_log_fn log; /* NULL: stderr for the topics SG_LOGS names */
    void *log_user;
} sg_ctx_opts;

/*
 * Make a context. opts may be NULL (all defaults). SG_BACKEND_AUTO never
 * fails for want of a device: it falls back to the CPU. Naming a backend
 * that is absent returns SG_ERR_BACKEND_UNAVAILABLE, and *out is NULL; the
 * reason is in sg_last_error(NULL).
 */
SG_API sg_status sg_ctx_create(const sg_ctx_opts *opts, sg_ctx **out);
/* Free the context and every tensor it still holds. NULL does nothing. */
SG_API void sg_ctx_destroy(sg_ctx *ctx);
/* The backend the context runs on (never AUTO). */
SG_API sg_backend sg_ctx_backend(const sg_ctx *ctx);

/*
 * The text of the newest failure: the op, the shapes and dtypes involved and
 * what to do about it. "" when there was none. With ctx == NULL, the message
 * of the last sg_ctx_create that failed in this thread.
 */
SG_API const char *sg_last_error(const sg_ctx *ctx);
/* The first failure status since the last sg_clear_error; SG_OK if none. */
SG_API sg_status sg_ctx_status(const sg_ctx *ctx);
/* Forget the sticky status and the message. */
SG_API void sg_clear_error(sg_ctx *ctx);

/* Host bytes held by the context now, and at most so far (allocator view). */
SG_API sg_status sg_ctx_host_bytes(const sg_ctx *ctx, size_t *live, size_t *peak);

/* ---------------------------------------------------------------- tensors */

#define SG_MAX_DIMS 6

/*
 * Make tensors. shape holds ndim sizes (0 <= ndim <= SG_MAX_DIMS, each >= 0;
 * ndim 0 is a scalar, a size 0 makes an empty tensor). Contents: sg_empty
 * leaves them undefined, sg_zeros and sg_full set them, sg_from_host copies
 * numel elements of dt from data (row-major).
 */
SG_API sg_tensor *sg_empty(sg_ctx *ctx, sg_dtype dt, int ndim, const int64_t *shape);
SG_API sg_tensor *sg_zeros(sg_ctx *ctx, sg_dtype dt, int ndim, const int64_t *shape);
SG_API sg_tensor *sg_full(sg_ctx *ctx, sg_dtype dt, int ndim, const int64_t *shape, double value);
SG_API sg_tensor *sg_from_host(sg_ctx *ctx, sg_dtype dt, int ndim, const int64_t *shape,
                               const void *data);
/* A 1-d tensor start, start+step, ... < end (or > end for step < 0): ceil((end -
 * start) / step) values, none when that is <= 0, each computed in double and
 * stored in dt (ints truncate toward zero). Numeric dtypes; step nonzero and
 * all three finite, else SG_ERR_INVALID_ARG. */
SG_API sg_tensor *sg_arange(sg_ctx *ctx, sg_dtype dt, double start, double end, double step);

/*
 * Drop the user's hold on t. Views share storage with their base: the
 * bytes are freed when the last tensor that sees them is released. Using a
 * released tensor is SG_ERR_RELEASED (detected for the most recent 4096
 * releases of the context; after that the handle may be reused).
 */
SG_API void sg_release(sg_tensor *t);

/* Facts about a tensor. On NULL or released: 0, SG_F32 or NULL. */
SG_API sg_ctx *sg_tensor_ctx(const sg_tensor *t);
SG_API sg_dtype sg_tensor_dtype(const sg_tensor *t);
SG_API int sg_tensor_ndim(const sg_tensor *t);
SG_API int64_t sg_tensor_size(const sg_tensor *t, int dim);   /* negative dims count back */
SG_API int64_t sg_tensor_stride(const sg_tensor *t, int dim); /* in elements */
SG_API int64_t sg_tensor_numel(const sg_tensor *t);
SG_API bool sg_tensor_is_contiguous(const sg_tensor *t);
/* Writes ndim sizes to shape (room for SG_MAX_DIMS is always enough). */
SG_API sg_status sg_tensor_shape(const sg_tensor *t, int64_t *shape);
/* "f32[2,3]" or "bf16[4,8] strides [1,4]" into buf; returns buf. */
SG_API const char *sg_tensor_describe(const sg_tensor *t, char *buf, size_t size);

/*
 * Host transfer, in row-major element order whatever the strides, in the
 * tensor's own dtype: nbytes must equal numel * sg_dtype_size(dtype).
 * sg_read is also the way to copy to the host; sg_item reads a one-element
 * tensor as a double.
 */
SG_API sg_status sg_write(sg_tensor *t, const void *src, size_t nbytes);
SG_API sg_status sg_read(const sg_tensor *t, void *dst, size_t nbytes);
SG_API sg_status sg_item(const sg_tensor *t, double *value);

/* ---------------------------------------------------------------- views */
/*
 * Views share storage with their input and copy nothing. A view is a new
 * handle that the user releases like any other; it keeps the bytes alive.
 */

/* Same elements, new shape; one size may be -1. A view when the strides
 * allow it, else a contiguous copy (PyTorch's reshape). */
SG_API sg_tensor *sg_reshape(sg_tensor *t, int ndim, const int64_t *shape);
/* Like sg_reshape but never copies: SG_ERR_SHAPE when no view exists. */
SG_API sg_tensor *sg_view(sg_tensor *t, int ndim, const int64_t *shape);
SG_API sg_tensor *sg_permute(sg_tensor *t, const int *dims);
SG_API sg_tensor *sg_transpose(sg_tensor *t, int dim0, int dim1);
/* Elements start, start+step, ... < end along dim (0 <= start <= end <= size, step >= 1;
 * start and end are clamped like Python slices, negatives count back). */
SG_API sg_tensor *sg_slice(sg_tensor *t, int dim, int64_t start, int64_t end, int64_t step);
SG_API sg_tensor *sg_narrow(sg_tensor *t, int dim, int64_t start, int64_t length);
/* Broadcast to shape (size-1 dims stretch with stride 0; -1 keeps a size). */
SG_API sg_tensor *sg_expand(sg_tensor *t, int ndim, const int64_t *shape);
SG_API sg_tensor *sg_unsqueeze(sg_tensor *t, int dim);
SG_API sg_tensor *sg_squeeze(sg_tensor *t, int dim);
/* t itself (a new handle to it) if contiguous, else a contiguous copy. */
SG_API sg_tensor *sg_contiguous(sg_tensor *t);
/* A contiguous copy that owns its storage. */
SG_API sg_tensor *sg_clone(sg_tensor *t);

/* ---------------------------------------------------------------- pointwise */
/*
 * Unary math ops take f32/f16/bf16 (cast ints first with sg_cast); neg, abs
 * and relu also take i32/i64. gelu is the erf form; gelu_tanh the tanh
 * approximation GPT-2 uses.
 */
SG_API sg_tensor *sg_neg(sg_tensor *x);
SG_API sg_tensor *sg_abs(sg_tensor *x);
SG_API sg_tensor *sg_exp(sg_tensor *x);
SG_API sg_tensor *sg_log(sg_tensor *x);
SG_API sg_tensor *sg_sqrt(sg_tensor *x);
SG_API sg_tensor *sg_rsqrt(sg_tensor *x);
SG_API sg_tensor *sg_sin(sg_tensor *x);
SG_API sg_tensor *sg_cos(sg_tensor *x);
SG_API sg_tensor *sg_tanh(sg_tensor *x);
SG_API sg_tensor *sg_sigmoid(sg_tensor *x);
SG_API sg_tensor *sg_relu(sg_tensor *x);
SG_API sg_tensor *sg_gelu(sg_tensor *x);
SG_API sg_tensor *sg_gelu_tanh(sg_tensor *x);
SG_API sg_tensor *sg_silu(sg_tensor *x);
/* Convert to dt: floats to ints truncate toward zero, nonzero to bool is true. */
SG_API sg_tensor *sg_cast(sg_tensor *x, sg_dtype dt);

/* Scalar forms: x + s, x * s, x ^ s, min(max(x, lo), hi). Numeric dtypes;
 * on ints the scalar is truncated; pow is float only. */
SG_API sg_tensor *sg_add_scalar(sg_tensor *x, double s);
SG_API sg_tensor *sg_mul_scalar(sg_tensor *x, double s);
SG_API sg_tensor *sg_pow_scalar(sg_tensor *x, double s);
SG_API sg_tensor *sg_clamp(sg_tensor *x, double lo, double hi);

/*
 * Binary ops broadcast their inputs and need one dtype for both (cast one with
 * sg_cast). add, sub, mul, maximum, minimum take every numeric dtype; div and
 * pow are float only. Comparisons take any dtype and give bool; logical ops
 * take bool.
 */
SG_API sg_tensor *sg_add(sg_tensor *a, sg_tensor *b);
SG_API sg_tensor *sg_sub(sg_tensor *a, sg_tensor *b);
SG_API sg_tensor *sg_mul(sg_tensor *a, sg_tensor *b);
SG_API sg_tensor *sg_div(sg_tensor *a, sg_tensor *b);
SG_API sg_tensor *sg_pow(sg_tensor *a, sg_tensor *b);
SG_API sg_tensor *sg_maximum(sg_tensor *a, sg_tensor *b);
SG_API sg_tensor *sg_minimum(sg_tensor *a, sg_tensor *b);
SG_API sg_tensor *sg_eq(sg_tensor *a, sg_tensor *b);
SG_API sg_tensor *sg_ne(sg_tensor *a, sg_tensor *b);
SG_API sg_tensor *sg_lt(sg_tensor *a, sg_tensor *b);
SG_API sg_tensor *sg_le(sg_tensor *a, sg_tensor *b);
SG_API sg_tensor *sg_gt(sg_tensor *a, sg_tensor *b);
SG_API sg_tensor *sg_ge(sg_tensor *a, sg_tensor *b);
SG_API sg_tensor *sg_logical_and(sg_tensor *a, sg_tensor *b);
SG_API sg_tensor *sg_logical_or(sg_tensor *a, sg_tensor *b);
SG_API sg_tensor *sg_logical_not(sg_tensor *x);
/* cond ? a : b, elementwise; cond is bool, a and b share a dtype; all broadcast. */
SG_API sg_tensor *sg_where(sg_tensor *cond, sg_tensor *a, sg_tensor *b);

/* ---------------------------------------------------------------- reductions */
/*
 * Reduce over ndims dims (dims may be NULL with ndims 0: every dim). keepdim
 * keeps reduced dims with size 1. sum/mean/max/min take numeric dtypes; sum of
 * ints gives i64 (as PyTorch); mean and var are float only. var uses
 * `correction` (1: unbiased, 0: population). max/min of an empty range is an
 * error; sum of one is 0. argmax reduces one dim (or all when dim is
 * SG_ALL_DIMS) and gives i64; the first maximum wins.
 */
#define SG_ALL_DIMS 0x7fffffff
SG_API sg_tensor *sg_sum(sg_tensor *x, int ndims, const int *dims, bool keepdim);
SG_API sg_tensor *sg_mean(sg_tensor *x, int ndims, const int *dims, bool keepdim);
SG_API sg_tensor *sg_max(sg_tensor *x, int ndims, const int *dims, bool keepdim);
SG_API sg_tensor *sg_min(sg_tensor *x, int ndims, const int *dims, bool keepdim);
SG_API sg_tensor *sg_var(sg_tensor *x, int ndims, const int *dims, int correction, bool keepdim);
SG_API sg_tensor *sg_argmax(sg_tensor *x, int dim, bool keepdim);

/* ---------------------------------------------------------------- rows */
/*
 * Row ops work along one dim (softmax, log_softmax) or the last dim (the
 * norms), one pass per row, float dtypes. layer_norm: (x - mean) / sqrt(var +
 * eps) * weight + bias with population variance; weight and bias are 1-d of
 * the last dim's size, either may be NULL. rms_norm: x / sqrt(mean(x^2) + eps)
 * * weight. cross_entropy: logits (N, C) float, targets (N) i64 or i32 in
 * [0, C); the mean over N of -log_softmax(logits)[n, target[n]], as a scalar
 * f32.
 */
SG_API sg_tensor *sg_softmax(sg_tensor *x, int dim);
SG_API sg_tensor *sg_log_softmax(sg_tensor *x, int dim);
SG_API sg_tensor *sg_layer_norm(sg_tensor *x, sg_tensor *weight, sg_tensor *bias, double eps);
SG_API sg_tensor *sg_rms_norm(sg_tensor *x, sg_tensor *weight, double eps);
SG_API sg_tensor *sg_cross_entropy(sg_tensor *logits, sg_tensor *targets);

/* ---------------------------------------------------------------- matmul */
/*
 * a (..., M, K) @ b (..., K, N) -> (..., M, N), batch dims broadcast; a 1-d a
 * or b is a vector, as in PyTorch. Either operand may be a transposed view.
 * Floats only, both of one dtype; accumulation in f32 or better.
 * linear: x (..., K) @ w(N, K)^T + b(N); b may be NULL.
 */
SG_API sg_tensor *sg_matmul(sg_tensor *a, sg_tensor *b);
SG_API sg_tensor *sg_linear(sg_tensor *x, sg_tensor *w, sg_tensor *b);

/* ---------------------------------------------------------------- data movement */

/* weight (V, D) of any dtype, idx of any shape, i32 or i64, in [0, V) -> (idx..., D).
 * An index out of range is SG_ERR_INDEX. */
SG_API sg_tensor *sg_embedding(sg_tensor *weight, sg_tensor *idx);
/* Pick entries idx (1-d, i32/i64, in range: else SG_ERR_INDEX) of x along dim. */
SG_API sg_tensor *sg_index_select(sg_tensor *x, int dim, sg_tensor *idx);
/* Join n >= 1 tensors along dim; all other sizes and the dtype must agree. With
 * n < 1 or ts NULL no tensor names a context: the call returns NULL and
 * sg_last_error(NULL) says why. */
SG_API sg_tensor *sg_concat(int n, sg_tensor *const *ts, int dim);

/*
 * Scaled dot-product attention: q (..., Lq, D), k (..., Lk, D) and v (..., Lk,
 * Dv) of one float dtype, batch dims broadcast -> (..., Lq, Dv) =
 * softmax(q k^T * scale + mask) v. mask (broadcast to (..., Lq, Lk), which it
 * may not grow) is bool (true keeps) or of q's dtype (added); it may be NULL.
 * causal masks key j > query i + (Lk - Lq). scale <= 0 means 1/sqrt(D). A row
 * with every key masked comes out NaN, as in PyTorch. Built from the ops above.
 */
SG_API sg_tensor *sg_sdpa(sg_tensor *q, sg_tensor *k, sg_tensor *v, sg_tensor *mask, bool causal,
                          double scale);

/* In place. dst keeps its storage; src broadcasts to dst and is cast to its dtype. */
SG_API sg_status sg_copy_(sg_tensor *dst, sg_tensor *src);
SG_API sg_status sg_fill_(sg_tensor *dst, double value);
/* dst += src (broadcast, same dtype). */
SG_API sg_status sg_add_(sg_tensor *dst, sg_tensor *src);
/* dst.index(dim, idx[i]) = src.index(dim, i): idx 1-d i32/i64; src of dst's
 * dtype and sizes except along dim, where it has idx's length. An index out of
 * range is SG_ERR_INDEX and nothing is written; of repeated indices the last
 * one wins. */
SG_API sg_status sg_index_copy_(sg_tensor *dst, int dim, sg_tensor *idx, sg_tensor *src);

#ifdef __cplusplus
}
#endif
#endif /* STEPGRAPH_H */
