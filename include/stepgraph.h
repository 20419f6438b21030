/* SPDX-License-Identifier: MIT */
/*
 * stepgraph.h -- the one public header of stepgraph, and its manual.
 *
 * stepgraph makes a training or inference step written in C cheap to run
 * again and again. A step is a C function over stepgraph tensor ops. The ops
 * run eagerly (one kernel per op) on the CPU or on a CUDA device; a step
 * wrapped with sg_compile is captured once into IR, fused, compiled to
 * generated code (C + OpenMP on the CPU, CUDA C through NVRTC on a GPU) and
 * replayed (on CUDA, as one device graph) over a static memory pool: see
 * "compiled steps" below.
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
 *  - Threads: a context and everything made from it (tensors, fns) is used
 *    by one thread at a time; different contexts may run in different
 *    threads at once.
 *  - After sg_ctx_destroy every handle made from the context (tensors, fns)
 *    is gone, and cleanup code may still release and destroy in any order:
 *    sg_release of such a tensor, sg_fn_destroy or sg_call of such an fn
 *    read nothing of it and return SG_ERR_INVALID_ARG with the reason in
 *    sg_last_error(NULL); the other sg_fn_* calls fail likewise (explain
 *    gives ""), and sg_ctx_destroy of a destroyed context does nothing.
 *    Passing such a tensor to an op, sg_read, sg_write or sg_tensor_* is
 *    undefined. A stale handle is recognized by its address until the
 *    allocator gives that address to a new handle; from then on it names
 *    the new one, as any pointer after free does.
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

#include "stepgraph_version.h" /* SG_VERSION_MAJOR, _MINOR, _PATCH, _STRING, _NUMBER */

/* The version string of the library that is linked, e.g. "0.2.0"; equal to
 * SG_VERSION_STRING when the header and the library match. */
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
 * topic, in which case the line goes to stderr (SG_LOGS=all names every one;
 * a word in SG_LOGS that names no topic is said once on stderr).
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
 * Make a context. opts may be NULL (all defaults). SG_BACKEND_AUTO takes
 * CUDA when a driver and a device are there (environment SG_BACKEND=cpu
 * makes it take the CPU) and never fails for want of a device: it falls
 * back to the CPU. The CUDA driver, NVRTC and cuBLASLt are loaded at run
 * time; nothing links against them. Naming a backend
 * that is absent returns SG_ERR_BACKEND_UNAVAILABLE, and *out is NULL; the
 * reason is in sg_last_error(NULL).
 */
SG_API sg_status sg_ctx_create(const sg_ctx_opts *opts, sg_ctx **out);
/* Free the context and every tensor and fn it still holds. NULL, or a
 * context destroyed already, does nothing (see the conventions above). */
SG_API void sg_ctx_destroy(sg_ctx *ctx);
/* The backend the context runs on (never AUTO). */
SG_API sg_backend sg_ctx_backend(const sg_ctx *ctx);

/*
 * The text of the newest failure: the op, the shapes and dtypes involved and
 * what to do about it. "" when there was none. With ctx == NULL, the message
 * of the last sg_ctx_create that failed in this thread, or of the last call
 * in this thread given a handle whose context was destroyed.
 */
SG_API const char *sg_last_error(const sg_ctx *ctx);
/* The first failure status since the last sg_clear_error; SG_OK if none. */
SG_API sg_status sg_ctx_status(const sg_ctx *ctx);
/* Forget the sticky status and the message. */
SG_API void sg_clear_error(sg_ctx *ctx);

/* Wait until every op queued on the context's device has finished (a no-op
 * on the CPU, where ops finish before they return). Device errors that
 * surface here are returned. */
SG_API sg_status sg_ctx_synchronize(sg_ctx *ctx);

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
 * Drop the user's hold on t and return SG_OK. Views share storage with
 * their base: the bytes are freed when the last tensor that sees them is
 * released. NULL: SG_OK. Using a released tensor is SG_ERR_RELEASED, and
 * releasing it again returns SG_ERR_RELEASED and changes nothing, the
 * context's status included (detected for the most recent 4096 releases
 * of the context; after that the handle is freed, and may be reused). A
 * tensor whose handle was freed (by sg_ctx_destroy, or after those 4096)
 * is never read: SG_ERR_INVALID_ARG, the message in sg_last_error(NULL).
 */
SG_API sg_status sg_release(sg_tensor *t);

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
/*
 * Convert to dt. Floats to ints truncate toward zero and saturate at the
 * int's range (NaN gives 0); ints to narrower ints wrap (as in PyTorch);
 * anything to bool is nonzero (NaN is true), bool to numbers 1 or 0; values
 * reach f16/bf16 rounded once to nearest even (overflow gives inf).
 */
SG_API sg_tensor *sg_cast(sg_tensor *x, sg_dtype dt);

/* Scalar forms: x + s, x * s, x ^ s, min(max(x, lo), hi). Numeric dtypes;
 * on ints the scalar is truncated toward zero and saturated to the dtype's
 * range (so clamp(x, -INFINITY, 5) works); pow is float only. clamp lets
 * NaN through and needs lo <= hi. */
SG_API sg_tensor *sg_add_scalar(sg_tensor *x, double s);
SG_API sg_tensor *sg_mul_scalar(sg_tensor *x, double s);
SG_API sg_tensor *sg_pow_scalar(sg_tensor *x, double s);
SG_API sg_tensor *sg_clamp(sg_tensor *x, double lo, double hi);

/*
 * Binary ops broadcast their inputs and need one dtype for both (cast one with
 * sg_cast). add, sub, mul, maximum, minimum take every numeric dtype (ints
 * wrap on overflow); div and pow are float only; maximum and minimum
 * propagate NaN. Comparisons take any dtype and give bool; logical ops take
 * any dtypes, even two different ones (nonzero, NaN included, is true), and
 * give bool.
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
 * keeps reduced dims with size 1. A dim listed twice is an error; a 0-d x
 * takes dim 0 or -1, as in PyTorch. sum/mean/max/min take numeric dtypes (not
 * bool); sum of ints gives i64 (as PyTorch); mean and var are float only. var
 * uses `correction` (1: unbiased, 0: population), dividing by
 * max(0, N - correction). max/min of an empty range is an error (SG_ERR_SHAPE);
 * the sum of none is 0, the mean and var of none NaN. max/min propagate NaN.
 * argmax reduces one dim (or all when dim is SG_ALL_DIMS: the index into the
 * flattened x) and gives i64; the first maximum wins and NaN counts as the
 * maximum, as in PyTorch.
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
 * the last dim's size and x's dtype, either may be NULL; eps >= 0. rms_norm:
 * x / sqrt(mean(x^2) + eps) * weight. cross_entropy: logits (N, C) float,
 * targets (N) i64 or i32 in [0, C) (else SG_ERR_INDEX; there is no
 * ignore_index); the mean over N of -log_softmax(logits)[n, target[n]], as a
 * scalar f32 (NaN when N is 0).
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
 * An index out of range is SG_ERR_INDEX. The gradient (of this and of
 * sg_index_select) adds each row's repeats in position order in f32 and
 * rounds once to the weight's dtype (on CUDA up to 2^31 positions and
 * rows; past them f16 and bf16 round after each row). */
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
 * with every key masked comes out NaN, as in PyTorch. k and v may have fewer
 * heads (dim -3) than q when that count divides q's (grouped-query attention,
 * torch's enable_gqa): query head h reads K/V head h / (Hq / Hkv). See the
 * attention section below for how it runs.
 */
SG_API sg_tensor *sg_sdpa(sg_tensor *q, sg_tensor *k, sg_tensor *v, sg_tensor *mask, bool causal,
                          double scale);

/*
 * In place. dst keeps its storage and may be a strided view, but not an
 * expanded one (SG_ERR_INVALID_ARG). src broadcasts to dst and is converted
 * as by sg_cast; src may overlap dst (copy_(x, transpose(x)) transposes).
 * fill_ converts value as sg_cast would.
 */
SG_API sg_status sg_copy_(sg_tensor *dst, sg_tensor *src);
SG_API sg_status sg_fill_(sg_tensor *dst, double value);
/* dst += src (broadcast, same numeric dtype; src may overlap dst). */
SG_API sg_status sg_add_(sg_tensor *dst, sg_tensor *src);
/* dst.index(dim, idx[i]) = src.index(dim, i): idx 1-d i32/i64; src of dst's
 * dtype and sizes except along dim, where it has idx's length. An index out of
 * range is SG_ERR_INDEX and nothing is written; of repeated indices the last
 * one wins. */
SG_API sg_status sg_index_copy_(sg_tensor *dst, int dim, sg_tensor *idx, sg_tensor *src);

/* ---------------------------------------------------------------- composite ops */
/*
 * Ops torch users reach for, composed from the ops above (so they run on
 * every backend, fuse, and differentiate like them).
 *
 * masked_fill: x where mask is false, value where it is true (torch's
 * Tensor.masked_fill); mask is bool and broadcasts to x without growing it;
 * value is converted to x's dtype as by sg_cast. div_scalar: x / s as a true
 * division (not x * (1/s)), computed in f32 and rounded once to x's dtype;
 * int x gives f32 (torch's true division); bool is an error. s = 0 gives
 * inf/NaN as in IEEE. repeat_interleave: each entry of x along dim repeated
 * `repeats` (>= 0) times in a row: [a, b] -> [a, a, b, b] (a 0-d x counts as
 * 1-d); the result owns its storage.
 */
SG_API sg_tensor *sg_masked_fill(sg_tensor *x, sg_tensor *mask, double value);
SG_API sg_tensor *sg_div_scalar(sg_tensor *x, double s);
SG_API sg_tensor *sg_repeat_interleave(sg_tensor *x, int64_t repeats, int dim);

/* ---------------------------------------------------------------- optimizers */
/*
 * Fused multi-tensor optimizers, as torch.optim's, updating params in place.
 * The state (moment buffers, master copies, the learning rate and the step
 * count) lives in tensors the optimizer makes at create time: call the
 * create functions outside any step. sg_optim_step works eagerly and inside
 * a compiled step, where the update records as ordinary ops that fusion
 * merges into few kernels (one pointwise loop per param, the loops merged
 * into one multi-tensor kernel, plus one small kernel for the step count and
 * the bias corrections); a replay advances the state in place, and nothing
 * that changes per step is baked into the capture.
 *
 * Updates are computed in f32; moment buffers are f32 whatever the param
 * dtype. A bf16/f16 param is read, updated and written back rounded once;
 * with master_weights an f32 copy of it is kept, updated and read instead,
 * so updates below the param's precision are not lost.
 *
 * AdamW (torch.optim.AdamW): p *= 1 - lr*wd; m = b1 m + (1-b1) g;
 * v = b2 v + (1-b2) g^2; p -= lr/(1 - b1^t) * m / (sqrt(v)/sqrt(1 - b2^t) + eps),
 * with t the step count after it is advanced. Zero fields take torch's
 * defaults: lr 1e-3, betas 0.9/0.999, eps 1e-8, weight_decay 1e-2 (so a
 * weight_decay of exactly 0 is not expressible: pass 1e-30).
 * SGD (torch.optim.SGD): d = g + wd p; with momentum buf = d on the first
 * step, then momentum buf + (1 - dampening) d, and d = buf (nesterov:
 * d + momentum buf); p -= lr d. lr must be > 0 (no default); nesterov needs
 * momentum > 0 and dampening 0.
 */
typedef struct sg_optim sg_optim;
typedef struct sg_adamw_opts {
    double lr, beta1, beta2, eps, weight_decay;
    bool master_weights;
} sg_adamw_opts;
typedef struct sg_sgd_opts {
    double lr, momentum, dampening, weight_decay;
    bool nesterov;
} sg_sgd_opts;

/* Make an optimizer over n float params of ctx (the array is copied; the
 * params stay the caller's and must outlive it). o may be NULL (AdamW:
 * defaults). */
SG_API sg_status sg_adamw_create(sg_ctx *ctx, int n, sg_tensor *const *params,
                                 const sg_adamw_opts *o, sg_optim **out);
SG_API sg_status sg_sgd_create(sg_ctx *ctx, int n, sg_tensor *const *params, const sg_sgd_opts *o,
                               sg_optim **out);
/* One update of every param from grads (n tensors of the params' shapes, of
 * the param's dtype or f32), in place; inside or outside a step. */
SG_API sg_status sg_optim_step(sg_optim *opt, sg_tensor *const *grads);
/* The learning rate, a 0-d f32 tensor owned by opt: sg_fill_ it (outside a
 * step) to change lr; compiled steps read it on every replay, no recapture. */
SG_API sg_tensor *sg_optim_lr(sg_optim *opt);
/* The step count, a 0-d f32 tensor owned by opt, advanced by each step. */
SG_API sg_tensor *sg_optim_step_count(sg_optim *opt);
/* Free the optimizer and its state tensors (not the params). sg_ctx_destroy
 * frees the optimizers made on the context, so after it this does nothing
 * (and reads nothing of opt). NULL does nothing. */
SG_API void sg_optim_destroy(sg_optim *opt);
/*
 * torch.nn.utils.clip_grad_norm_: scales the n float grads in place so that
 * their global L2 norm is at most max_norm (coef = min(max_norm / (norm +
 * 1e-6), 1), computed on the device: no host read, graph-safe). total_norm
 * may be NULL; else it gets a new 0-d f32 tensor holding the norm before
 * clipping (the caller's to release; inside a step, the step's).
 */
SG_API sg_status sg_clip_grad_norm_(int n, sg_tensor *const *grads, double max_norm,
                                    sg_tensor **total_norm);

/* ---------------------------------------------------------------- random numbers and sampling */
/*
 * A counter-based generator, Philox 4x32-10 (as curand and torch): its
 * state is a device tensor, i64 [2] = (seed, offset). Each draw reads the
 * state in its kernel and advances offset in place by the Philox blocks it
 * used (4 uniforms or 2 normals per block), so a replayed compiled step
 * draws fresh numbers every time. Numbers depend only on (seed, offset) and
 * the element's row-major index: not on thread counts, and the CPU and CUDA
 * give the same uniforms bit for bit for a seed (normals are computed in f64
 * and rounded once to the dtype: the same up to the last bit of the
 * backends' f64 log and cos). Uniforms take the top 24 (f32), 11 (f16) or 8
 * (bf16) bits of a Philox word, so they are exact and below 1.
 */

/* A new generator state (seed, offset 0), owned by the caller. Make it
 * outside any step (inside a capture it is an error) and pass it in. */
SG_API sg_tensor *sg_rng_create(sg_ctx *ctx, uint64_t seed);
/* A new contiguous tensor of dt (f32, f16 or bf16) and shape: U[0, 1) /
 * N(0, 1) draws. rng must be a tensor from sg_rng_create; it advances. */
SG_API sg_tensor *sg_rand(sg_tensor *rng, sg_dtype dt, int ndim, const int64_t *shape);
SG_API sg_tensor *sg_randn(sg_tensor *rng, sg_dtype dt, int ndim, const int64_t *shape);
/* Dropout as in training: x * (u >= p) / (1 - p) with u = sg_rand(rng, x's
 * dtype and shape), p in [0, 1] (compared in x's dtype); p == 0 draws
 * nothing; p == 1 gives zeros. Built from ordinary ops. */
SG_API sg_tensor *sg_dropout(sg_tensor *x, double p, sg_tensor *rng);

/*
 * Sampling on the device. Rows are along the last dim of x (f32, f16 or
 * bf16). The order of a row's entries is by value, largest first, NaN above
 * everything, ties by index, lowest first (torch's topk order).
 *
 * sg_topk_indices: the indices (i64, x's shape with the last dim k, 0 <= k <=
 * its size) of each row's k first entries in that order; their values are
 * sg_gather(x, -1, idx). The kernels take O(k V) per row: meant for small k.
 * sg_gather: torch.gather: out[c] = x[c with idx[c] at dim]; idx (i32/i64)
 * has x's number of dims and sizes no larger than x's except at dim; out has
 * idx's shape and x's dtype. An index out of range is SG_ERR_INDEX.
 * sg_multinomial: one index per row (i64, x's shape without the last dim)
 * drawn with probability proportional to the row's weights (torch's
 * multinomial(probs, 1) with the last dim dropped); negative and NaN weights
 * count 0, +inf ones share the row equally, and a row of no weight gives its
 * largest entry's index.
 * sg_sample: one token per row from logits: temperature 0 is argmax (no
 * draw); else softmax(logits / temperature) restricted to the top_k first
 * entries (top_k 0: all) and then to the shortest prefix of the order whose
 * probability reaches top_p (top_p 1: all; nucleus sampling), renormalized.
 * Both draw one uniform per row from rng (53 bits; the offset advances by
 * the number of rows), so they are deterministic for a seed, the same on the
 * CPU and CUDA, and fresh on each replay. Their weights count as integers
 * (w / the row's largest weight, times 2^(62 - bits(V)), rounded down: a
 * probability under ~2^-46 of the largest is 0 at V = 50257), so every sum
 * is exact in any order: a CUDA block draws a row (the CPU: a thread).
 */
SG_API sg_tensor *sg_topk_indices(sg_tensor *x, int64_t k);
SG_API sg_tensor *sg_gather(sg_tensor *x, int dim, sg_tensor *idx);
SG_API sg_tensor *sg_multinomial(sg_tensor *probs, sg_tensor *rng);
SG_API sg_tensor *sg_sample(sg_tensor *logits, double temperature, int64_t top_k, double top_p,
                            sg_tensor *rng);
/* ---------------------------------------------------------------- attention */
/*
 * sg_sdpa runs as one fused kernel (online softmax in f32, no scores in
 * memory) when q, k, v have at most 4 dims and Dv = D <= 256; other shapes
 * run as matmul, mask, softmax, matmul. q, k and v may be strided views (say
 * narrowed out of one fused QKV projection with heads permuted): the kernels
 * read them through their strides without a copy. The fused result is
 * stored with the heads side by side, (..., Lq, H, Dv) in memory, as an
 * output projection reads them: its transpose (-3, -2) is contiguous, so
 * transpose + reshape to (..., Lq, H * Dv) copies nothing. On CUDA, few queries
 * (decode) split the keys over blocks and merge the splits; many queries
 * in bf16/f16 with D a multiple of 16 up to 128 and no mask (prefill) run
 * on tensor cores (SG_ATTN_MMA=0 keeps them on the f32 FMA kernel).
 * Gradients of q, k and v (sg_grad) go through one fused backward
 * (flash-attention style: no scores in memory; when q, k or v needs a
 * gradient the forward keeps each query row's logsumexp, 4 bytes a row,
 * beside its result for the backward -- on CUDA the bf16 / f16 prefill
 * kernels with D = 64 or 128; elsewhere on CUDA the backward recomputes it;
 * without gradients nothing is kept; dk and dv of a grouped-query head summed in a fixed order,
 * so replays are bit-identical), on CUDA on tensor cores for bf16 / f16
 * with D = 64 or 128 and no mask. Shapes that run as matmul, mask,
 * softmax, matmul, and a float mask that itself needs a gradient,
 * differentiate through those ops (SG_LOGS=perf_hints says so).
 *
 * Attention of q (B, Hq, Lq, D) over the first kv_len[b] positions of
 * k_cache / v_cache (B, Hkv, S, D), S slots, Hq a multiple of Hkv (query
 * head h reads K/V head h / (Hq / Hkv); nothing is repeated). Query i
 * attends key j when j <= kv_len[b] - Lq + i: the new tokens are the last
 * Lq valid positions, causal among themselves. kv_len is i32 or i64 of
 * shape () or (B), a tensor on the context's device, read by the kernel, so
 * that a replayed step sees the new length; values are clamped to [0, S].
 * Only positions < kv_len are read. A query that sees no key (kv_len 0, or
 * kv_len < Lq for the first queries) comes out NaN, as sg_sdpa's fully
 * masked rows do. scale <= 0 means 1/sqrt(D). D > 256 runs as matmul,
 * mask, softmax, matmul, with the mask computed from kv_len on the device.
 * Result (B, Hq, Lq, D) of q's dtype; from the kernel (D <= 256) stored
 * (B, Lq, Hq, D) like sg_sdpa's fused result (contiguous when Lq is 1).
 */
SG_API sg_tensor *sg_sdpa_cached(sg_tensor *q, sg_tensor *k_cache, sg_tensor *v_cache,
                                 sg_tensor *kv_len, double scale);
/* ---------------------------------------------------------------- gradients */
/*
 * Autograd recorded with the forward, as in PyTorch. Mark the tensors to
 * differentiate (parameters: leaves) with sg_requires_grad_; every op or view
 * with an input that requires grad records what its backward needs on its
 * output, which then requires grad too. sg_grad walks back from a loss and
 * computes the gradients with the ordinary ops: eagerly they run; inside a
 * compiled step they are captured into the same graph as the forward (and
 * the optimizer), fused with it and replayed with it.
 *
 * What is recorded lives as long as the tensors it made: releasing the
 * outputs of a forward frees its backward (inside a step everything goes
 * with the step). In-place ops (sg_copy_, sg_add_, sg_fill_,
 * sg_index_copy_) are not differentiated; writing in place to a tensor a
 * pending backward reads makes sg_grad fail with SG_ERR_INVALID_ARG naming
 * it. Comparisons, logical ops and argmax give no gradient; a gradient
 * through a non-float op stops there. A float op with no gradient rule yet
 * (sg_gather, for one) makes sg_grad fail with SG_ERR_UNSUPPORTED naming
 * it.
 * For f16 and bf16 ops whose derivative is a formula of several ops (sin,
 * cos, tanh, sigmoid, rsqrt, gelu, gelu_tanh, silu, pow, div) the formula
 * computes in f32 and the gradient is rounded once, as PyTorch's are.
 * A compiled fn's outputs carry no recorded backward, in every mode (where
 * torch.compile's outputs keep theirs): call sg_grad inside the step, so
 * that the backward is captured and fused with the forward; sg_grad on an
 * output of sg_call is SG_ERR_INVALID_ARG (nothing was recorded for it).
 *
 *     sg_requires_grad_(w, true);                 // once, on the parameters
 *     sg_tensor *loss = sg_cross_entropy(sg_linear(x, w, b), y);
 *     sg_tensor *gw;
 *     sg_grad(loss, 1, &w, &gw);                  // gw: d loss / d w
 */

/* Mark t (f32, f16 or bf16) as a leaf that gradients are taken for, or
 * unmark it (false; only leaves can be unmarked: SG_ERR_INVALID_ARG for the
 * result of an op). */
SG_API sg_status sg_requires_grad_(sg_tensor *t, bool requires_grad);
/* True when t is a marked leaf or was computed from one with grad enabled. */
SG_API bool sg_tensor_requires_grad(const sg_tensor *t);
/* Whether ops record gradients (default on); off is torch.no_grad(): use it
 * around parameter updates and evaluation. */
SG_API sg_status sg_set_grad_enabled(sg_ctx *ctx, bool enabled);
/*
 * Like torch.autograd.grad: grads[i] gets a new contiguous tensor shaped and
 * typed like wrt[i] holding d loss / d wrt[i] (zeros when loss does not
 * depend on it). loss: a float tensor of one element that requires grad
 * (SG_ERR_INVALID_ARG when nothing was recorded for it: no marked tensor
 * before its forward, or a forward with gradients off). wrt may be leaves or
 * intermediate tensors of the forward. The graph stays, so sg_grad may be
 * called again on the same loss; the backward records no gradients itself.
 */
SG_API sg_status sg_grad(sg_tensor *loss, int n, sg_tensor *const *wrt, sg_tensor **grads);

/* ---------------------------------------------------------------- distributed */
/*
 * Collectives across processes, for data-parallel training: one process per
 * device, each with its own context, joined by a communicator. stepgraph
 * runs the collective engines the field uses and has no algorithm of its
 * own: NCCL between CUDA contexts, MPI between CPU contexts. Both libraries
 * are loaded at run time (dlopen), so nothing links against them and a
 * program that makes no communicator never needs them.
 *
 *     sg_comm *comm;                              // from torchrun's or mpirun's variables
 *     if (sg_comm_create(ctx, NULL, &comm) != SG_OK) { ... sg_last_error(ctx) ... }
 *     // inside the step, after sg_grad:
 *     sg_all_reduce_(comm, grad, SG_REDUCE_MEAN); // every rank now holds the mean
 *
 * The launch environment: mpirun's (OMPI_COMM_WORLD_RANK/_SIZE/_LOCAL_RANK,
 * or PMI_RANK/PMI_SIZE) or torchrun's (RANK, WORLD_SIZE, LOCAL_RANK,
 * MASTER_ADDR, MASTER_PORT); neither means one process of one rank, whose
 * collectives are copies. One of those variables (or SG_COMM_PORT,
 * SG_COMM_TIMEOUT) set to something that is not a number is
 * SG_ERR_INVALID_ARG naming it, never a quiet run as one process. On the CPU every collective is an MPI call
 * (Open MPI's libmpi.so.40; SG_MPI_LIB names another file), so a CPU job of
 * several ranks must be launched by mpirun. On CUDA the collectives are NCCL
 * calls on the context's stream (libnccl.so.2; SG_NCCL_LIB names another
 * file). NCCL's unique id goes from rank 0 to the others through MPI when
 * mpirun launched the job, else over one TCP connection per rank to
 * MASTER_ADDR:MASTER_PORT (MASTER_PORT + 1 when torchrun's agent holds
 * MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE=True; SG_COMM_PORT overrides).
 * Each process uses the context's device: give each rank its own GPU with
 * CUDA_VISIBLE_DEVICES (see bench/run-ddp.sh). A library that is missing is
 * SG_ERR_BACKEND_UNAVAILABLE naming it and the fix; the context stays usable.
 *
 * Collectives are ops: eagerly they run at once; inside a compiled step they
 * are nodes of the same graph, kept in their place (fusion never moves work
 * across one, nor removes one whose result is unused, since every rank must
 * make the same calls in the same order). On CUDA the NCCL call is recorded
 * into the step's CUDA graph by stream capture; on the CPU the MPI call runs
 * where the replay reaches it. Every rank must run the same collectives, in
 * the same order, on tensors of the same dtype and shape (and the same
 * compile mode), as with torch.distributed. They record no gradient (reduce
 * the gradients, not the loss). Dtypes: f32, f16, bf16, i32, i64 (bool too
 * for all_gather and broadcast); SG_REDUCE_MEAN takes floats only. On the
 * CPU, f16 and bf16 are reduced in f32 and rounded once.
 *
 * Failures: a rank that dies or stops calling collectives must not hang the
 * others forever. On the CPU a collective waits at most the timeout (then
 * SG_ERR_DRIVER naming the op, the rank and the timeout; the communicator
 * is broken from then on, and the process should exit); mpirun itself also
 * ends the whole job when one of its processes exits without MPI_Finalize
 * (Open MPI prints which one). On CUDA, NCCL runs non-blocking: the
 * bootstrap and sg_comm_synchronize wait at most the timeout, polling
 * ncclCommGetAsyncError, and on expiry abort the NCCL communicator
 * (ncclCommAbort) and return SG_ERR_DRIVER; call sg_comm_synchronize
 * instead of sg_ctx_synchronize after a step with collectives.
 */
typedef struct sg_comm sg_comm;

typedef enum sg_reduce_op {
    SG_REDUCE_SUM = 0, /* the elementwise sum over ranks */
    SG_REDUCE_MEAN     /* the sum divided by the number of ranks (floats only) */
} sg_reduce_op;

typedef struct sg_comm_opts {
    int size;                /* 0: the launch environment's (1 when it names none) */
    int rank;                /* with size > 0: this process's rank in [0, size) */
    const char *master_addr; /* NCCL's rendezvous without mpirun; NULL: MASTER_ADDR */
    int master_port;         /* 0: SG_COMM_PORT, else MASTER_PORT (see above) */
    double timeout_s;        /* 0: SG_COMM_TIMEOUT (seconds) when set, else 600 */
} sg_comm_opts;

/*
 * Join this process's communicator on ctx (opts NULL: everything from the
 * environment). Every rank must call it. With MPI, the first communicator
 * initializes MPI (unless the program already did) and the last one to be
 * destroyed finalizes it; MPI cannot start twice in one process, so keep one
 * communicator for the life of the program. Statuses: SG_ERR_BACKEND_UNAVAILABLE
 * (libmpi or libnccl missing, a CPU job of several ranks not launched by
 * mpirun), SG_ERR_INVALID_ARG (environment or opts inconsistent), SG_ERR_DRIVER
 * (the library failed, or a peer did not arrive within the timeout).
 */
SG_API sg_status sg_comm_create(sg_ctx *ctx, const sg_comm_opts *opts, sg_comm **out);
/* Leave the communicator; sg_ctx_destroy destroys those left, so after it
 * this does nothing (and reads nothing of comm). NULL does nothing. */
SG_API void sg_comm_destroy(sg_comm *comm);
/* This process's rank in [0, size), and the number of ranks. */
SG_API int sg_comm_rank(const sg_comm *comm);
SG_API int sg_comm_size(const sg_comm *comm);
/* The rank among the processes of this machine (LOCAL_RANK). */
SG_API int sg_comm_local_rank(const sg_comm *comm);
/* Wait for every op queued on the context, watching the collectives: a peer
 * failure or the timeout is SG_ERR_DRIVER instead of a hang. */
SG_API sg_status sg_comm_synchronize(sg_comm *comm);

/* Elementwise reduction of x over every rank; every rank gets the result
 * (a new contiguous tensor shaped like x). */
SG_API sg_tensor *sg_all_reduce(sg_comm *comm, sg_tensor *x, sg_reduce_op op);
/* The same in place: x must be contiguous (SG_ERR_INVALID_ARG otherwise). */
SG_API sg_status sg_all_reduce_(sg_comm *comm, sg_tensor *x, sg_reduce_op op);
/* Every rank's x (same shape on all, ndim >= 1) concatenated along dim 0 in
 * rank order: (size * x.shape[0], ...). */
SG_API sg_tensor *sg_all_gather(sg_comm *comm, sg_tensor *x);
/* Reduce x over the ranks, then rank r gets the r-th of size equal parts
 * along dim 0 (x.shape[0] a multiple of size): (x.shape[0] / size, ...). */
SG_API sg_tensor *sg_reduce_scatter(sg_comm *comm, sg_tensor *x, sg_reduce_op op);
/* root's x on every rank (x gives the shape and dtype elsewhere; its values
 * are not read there). */
SG_API sg_tensor *sg_broadcast(sg_comm *comm, sg_tensor *x, int root);

/* ---------------------------------------------------------------- the HIP backend */

/*
 * SG_BACKEND_HIP runs on AMD GPUs through the CUDA backend's executor,
 * kernels and graphs, with the HIP runtime (libamdhip64, loaded at run
 * time: libamdhip64.so.6, then .so.5, then libamdhip64.so; SG_HIP_RUNTIME
 * names another) in place of the CUDA driver, and hiprtc in place of NVRTC,
 * compiling for the device's gfx arch. Only archs hiprtc is known to
 * compile for are used (gfx803, gfx900, gfx906, gfx908, gfx90a, gfx90c,
 * gfx1010-gfx1036); a device of another arch, a machine without the runtime
 * or without a device (hipInit fails) make sg_ctx_create fail with
 * SG_ERR_BACKEND_UNAVAILABLE, naming the library, the arch or hipInit's
 * result and the fix, and sg_list_backends says the same. On HIP, attention
 * runs its FMA kernels (the tensor-core kernels are CUDA-only), a compiled
 * step's matmuls run as generated kernels (a tiled GEMM with the bias and
 * epilogue, or a GEMV for at most 8 rows) and eager matmuls as the GEMV
 * kernel (there is no cuBLASLt; hipBLASLt, whose enums are not cuBLASLt's,
 * and rocBLAS are not called; said once under "fallbacks"), and launches
 * are never programmatic dependent launches.
 * Nothing of this backend has yet run on AMD hardware.
 *
 * SG_HIPRTC_CHECK=1 (like SG_NVRTC_CHECK=1, for CI without a GPU): every
 * capture compiled on the CPU is also emitted in the CUDA dialect and
 * compiled by hiprtc for gfx90a, failures logged under "error".
 */

/* ---------------------------------------------------------------- the Level Zero backend */

/*
 * SG_BACKEND_ZE runs on the first GPU of the Level Zero drivers. The loader
 * (libze_loader.so.1; SG_ZE_LOADER names another) is opened at run time and
 * initialized once per process with zeInit for GPUs only. When zeInit fails
 * (no driver, no GPU), sg_ctx_create(SG_BACKEND_ZE) returns
 * SG_ERR_BACKEND_UNAVAILABLE with zeInit's result in the message and the
 * loader is never called again in the process; SG_BACKEND_AUTO goes on to
 * the CPU. Tensors and the compiled steps' pool live in device memory
 * (USM); kernels are OpenCL C compiled to SPIR-V by libocloc (loaded at run
 * time; SG_OCLOC_LIB names another, SG_ZE_OCLOC_DEVICE its -device, default
 * pvc), validated by spirv-val when it is on PATH, and kept in the kernel
 * cache. Ops reach the device only through the OpenCL C generator (an eager
 * op is a one-op capture; a compiled step in SG_MODE_REDUCE_OVERHEAD or
 * MAX_AUTOTUNE replays one recorded command list). Matmuls and linears
 * (there is no BLAS library) are a generated tiled GEMM with their bias and
 * epilogue. An op it does not cover (row kernels, GEMV) fails with
 * SG_ERR_UNSUPPORTED naming the op ("not yet on the ze backend"), never
 * with a wrong result. sg_list_backends
 * says why the backend is unavailable. A stepgraph built with a sanitizer
 * opens the loader only when ZE_ENABLE_ALT_DRIVERS names the drivers:
 * installed GPU drivers open libraries with RTLD_DEEPBIND, which sanitizers
 * abort on.
 */

/* ---------------------------------------------------------------- clipping in the update */
/*
 * sg_clip_grad_norm_ followed by sg_optim_step reads and writes every
 * gradient once more than the update needs. These two split it: the first
 * computes the clipping coefficient only (grads untouched), the second is
 * sg_optim_step on the grads scaled by a 0-d f32 tensor inside the update,
 * each scaled grad rounded to its own dtype first, so the update sees the
 * same values, bit for bit, as after sg_clip_grad_norm_. Use them when the
 * clipped grads are not needed after the step (they stay unscaled).
 */
/* coef = min(max_norm / (norm + 1e-6), 1) of the n float grads' global L2
 * norm, as a new 0-d f32 tensor (the caller's to release; inside a step,
 * the step's); total_norm as in sg_clip_grad_norm_ (may be NULL). */
SG_API sg_status sg_clip_grad_norm_coef(int n, sg_tensor *const *grads, double max_norm,
                                        sg_tensor **coef, sg_tensor **total_norm);
/* sg_optim_step with every grad g read as cast(g * scale, g's dtype); scale
 * is a 0-d f32 tensor of opt's context (NULL: sg_optim_step). */
SG_API sg_status sg_optim_step_scaled(sg_optim *opt, sg_tensor *const *grads, sg_tensor *scale);

/* ---------------------------------------------------------------- compiled steps */
/*
 * A step is a function over tensor ops. sg_compile wraps it in an sg_fn;
 * sg_call runs it. In the compiling modes the first call for a new input
 * signature *captures* the step: it records every op into IR without
 * running it (no eager kernel runs and no intermediate is allocated; the
 * first call's results come from the first replay), plans every
 * buffer the step makes into the context's static memory pool, and from
 * then on each call *replays* the recording with no allocation at all.
 * The modes mean what torch.compile's do:
 *
 *   SG_MODE_EAGER                    no capture: the step runs op by op, every call
 *   SG_MODE_DEFAULT                  captured; kernels launched one by one
 *   SG_MODE_REDUCE_OVERHEAD          captured; replayed as one device graph
 *   SG_MODE_MAX_AUTOTUNE             + kernels tuned on the real shapes
 *   SG_MODE_MAX_AUTOTUNE_NO_GRAPHS   tuned, launched one by one
 *
 * On the CPU a capture is fused (pointwise chains into one loop, pointwise
 * epilogues after reductions, row ops and matmuls, independent pointwise
 * updates into one kernel), emitted as one C + OpenMP translation unit,
 * compiled by the system C compiler and cached on disk (SG_CACHE_DIR). The
 * "graph" is the unit's sg_step function: every kernel inside one OpenMP
 * parallel region; DEFAULT and MAX_AUTOTUNE_NO_GRAPHS call kernels one by
 * one; the MAX_AUTOTUNE modes also time thread counts on the real buffers
 * and remember the pick. If the compiler is missing or fails, the capture
 * replays op by op through the eager kernels (a fallback: see "Fallbacks").
 * Environment: SG_CACHE_DIR, SG_DUMP_DIR (every generated source),
 * SG_OVERRIDE_DIR (compile a hand-edited <name>.c instead), SG_ALWAYS_COMPILE=1,
 * SG_CC, SG_CFLAGS, SG_DISABLE_FUSION=1 (one kernel per op), SG_CODEGEN=0
 * (no generated code: replay op by op).
 * Constant folding, on every backend: a kernel of a capture whose values
 * depend on no input, parameter or random state (fills, arange and
 * pointwise functions of them, written once) runs once, when the capture
 * is built, into pool bytes of its own; replays only read its values
 * (sg_fn_explain: "constants: N values folded"). SG_CONST_FOLD=0 replays it.
 *
 * On CUDA the same fused groups become one CUDA C program per capture,
 * compiled by NVRTC for the device's arch and cached on disk: pointwise and
 * multi-tensor kernels (16-byte vector loads where the layout allows),
 * epilogue kernels after reductions, row ops and cuBLASLt matmuls, and
 * GEMV kernels with bias and epilogue fused for matmuls of up to 8 rows
 * (batch-1 inference), and embedding, index_select, concat and
 * index_copy_ as generated kernels. Kernels that do the same work on
 * different tensors (the layers of a model) are one kernel in the program,
 * each launch reading its own table of addresses. REDUCE_OVERHEAD and MAX_AUTOTUNE record a CUDA
 * graph per output set and replay it with one launch; a new input address rewrites the device table
 * of addresses the kernels read and re-records the graph, which patches the instantiated one
 * (cuGraphExecUpdate). The MAX_AUTOTUNE modes time 128/256/512 threads per generated kernel on the
 * real buffers (what the step writes in place is copied aside first and put
 * back after), and for each distinct cuBLASLt call up to 8 of the
 * heuristic's algorithms (within its 32 MiB workspace), and the GEMV kernel
 * against them for products of up to 8 rows; the heuristic's first (or,
 * for few rows, the usual choice) stays unless another is at least 3%
 * faster, and calls that add into their output keep it. The picks apply
 * only to MAX_AUTOTUNE steps and are remembered on disk with the block
 * sizes, so a second process times nothing. MAX_AUTOTUNE also records the
 * step with the default launches and algorithms and replays both graphs
 * (two runs of 20 each, from the same saved values); the picks stay only
 * when their graph is at least 1% faster (logged under perf_hints, and
 * remembered with them), so max-autotune replays no slower than
 * reduce-overhead. Kernels launch with programmatic dependent launch on sm_90
 * (SG_CUDA_PDL=0 turns it off). SG_CUDA_GEMM=generated runs a compiled
 * step's matmuls (those of more than 8 rows) as the generated tiled GEMM,
 * its bias and epilogue fused, instead of cuBLASLt: f32 on the tensor cores
 * (3xTF32, about f32's accuracy, deterministic), f16/bf16 on the SIMT kernel
 * of the backends without a BLAS library (SG_CUDA_GEMM=simt: every dtype
 * there). cuBLASLt is as fast or faster on the shapes measured.
 *
 * What a step may do: read its inputs and any tensors made outside it (its
 * *parameters*: weights, caches), make new tensors with ops (they belong to
 * the step and vanish after it), and update inputs and parameters in place
 * (sg_copy_, sg_add_, sg_index_copy_, sg_fill_): replays repeat those
 * updates on the same tensors (inputs: on the tensors passed to that call).
 * What it may not rely on: host reads or writes of tensor data (sg_read,
 * sg_item, sg_write, sg_from_host) are *graph breaks* -- with fullgraph they
 * fail with SG_ERR_GRAPH_BREAK; without it that signature runs eagerly from
 * then on (logged under "graph_breaks"; a fallback). The capture had not
 * run the ops before the break, so that first call runs the whole step
 * again, eagerly: a step with a graph break is called twice on its first
 * call (SG_DRY_CAPTURE=0 makes captures run the step as they record, and
 * then it is called once). Host values the
 * step reads from your own structs are baked into the capture: pass what
 * changes per call as a tensor (a position as an i64 tensor, not an int),
 * and if you swap a parameter for another tensor, call sg_fn_reset.
 *
 * Guards: a capture holds for the dtypes, shapes and strides of the inputs,
 * for which inputs share storage, for which inputs and parameters require
 * grad (a parameter that starts or stops requiring grad ends the captures
 * that read it), for which inputs are a parameter's storage (a parameter
 * the step reads, passed as an input too, or a view of one: captured apart
 * from the calls where it is not) and for sg_set_grad_enabled's state.
 * (The very handle a step reads as a parameter, passed as an input itself,
 * cannot be told from the input: pass a view of it, such as sg_reshape to
 * its own shape, or never both.) Another signature is
 * captured anew (logged under "recompiles", with the guard that failed), up
 * to cache_size_limit captures; past that, new signatures run eagerly (a
 * fallback). A new *address* for an input is not a miss.
 *
 * Defaults: a zeroed sg_compile_opts, or opts == NULL, is SG_MODE_DEFAULT
 * (captured, compiled, kernels launched one by one) with 2 output sets,
 * cache_size_limit 8, no fullgraph, not strict. SG_MODE_EAGER must be asked
 * for by name.
 *
 * Fallbacks: whenever stepgraph runs something slower than asked because it
 * could not do better -- generated code failed to emit or compile (a missing
 * C compiler, an SG_CACHE_DIR not trusted: see "Trust"), a plan could not be built, a CUDA
 * graph could not be recorded or instantiated, a graph break made a
 * signature eager, cache_size_limit was reached -- that is a fallback. With
 * `strict`, a fallback is an error instead: the call fails with the status
 * of the cause (SG_ERR_COMPILE, SG_ERR_GRAPH_BREAK, SG_ERR_UNSUPPORTED for
 * the cache limit, ...) and a message naming the fallback and its reason,
 * and nothing is left half-made. Without it the call succeeds and the first
 * fallback of each fn is said once even when SG_LOGS is unset: through the
 * log hook under "fallbacks" if one is installed, else on stderr; later ones
 * go under "fallbacks" as any log line.
 *
 * Outputs: outputs of sg_call are handles owned by the fn, valid until a
 * later call of the same fn overwrites them. A fn has a fixed number of
 * output sets, `output_sets` (2 by default), each holding one call's
 * outputs; no call ever allocates another, and picking one costs the same
 * whatever the history.
 *  - Without sg_mark_step_begin (the plain loop), each call of a fn begins
 *    a new step for that fn, as in torch: a call overwrites the outputs of
 *    the fn's call `output_sets` calls before it (with the default 2, the
 *    outputs of the previous call stay valid, so y = f(y) and comparing two
 *    consecutive results both work). A set holding one of the call's inputs
 *    is never overwritten by it; the next set is taken instead. A set whose
 *    outputs and their views were all released is reused first (a loop that
 *    releases its outputs needs one set).
 *  - Once sg_mark_step_begin(ctx) has been called on the context, steps are
 *    the user's: within one step calls of a fn do not overwrite each other's
 *    outputs, up to `output_sets` calls (micro-batches: set output_sets to
 *    the number of calls whose outputs you keep alive in a step); the first
 *    call of a step reuses a set of an earlier step (the lowest-numbered set
 *    not used in this step, or whose outputs and views were all released).
 *    A further call in the same step recycles the set of the step's oldest
 *    call (a perf hint says so once).
 * When a set is overwritten, the outputs it held and every view made of
 * them become stale, whether or not the output handles were released: using
 * one fails with SG_ERR_STALE_OUTPUT naming the call of the fn that
 * overwrote it (detected for the fn's 64 most recent calls per output);
 * sg_clone what you keep. Eager mode follows the same rule.
 *
 * Stances (torch.compiler.set_stance): sg_fn_set_stance changes how a fn
 * treats captures from its next call on. SG_STANCE_FORCE_EAGER runs every
 * call eagerly (captures are kept for later); SG_STANCE_EAGER_ON_RECOMPILE
 * replays existing captures and runs new signatures eagerly instead of
 * capturing them (the first capture of a fn is no recompile and still
 * happens); SG_STANCE_FAIL_ON_RECOMPILE makes a call that would recapture
 * fail with SG_ERR_UNSUPPORTED naming the guard that failed. sg_reset
 * drops every capture of every fn of a context (torch._dynamo.reset).
 *
 * Counters: sg_fn_get_stats reports what a fn did (see sg_fn_stats); they
 * count from sg_compile and survive sg_fn_reset and sg_reset.
 */
typedef enum sg_mode {
    SG_MODE_DEFAULT = 0, /* what a zeroed sg_compile_opts asks for */
    SG_MODE_EAGER,
    SG_MODE_REDUCE_OVERHEAD,
    SG_MODE_MAX_AUTOTUNE,
    SG_MODE_MAX_AUTOTUNE_NO_GRAPHS
} sg_mode;

/* "eager", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs". */
SG_API const char *sg_mode_name(sg_mode m);

typedef enum sg_dynamic {
    SG_DYNAMIC_AUTO = 0, /* as torch: specialize per shape (for now) */
    SG_DYNAMIC_FALSE,    /* specialize per shape */
    SG_DYNAMIC_TRUE      /* asks for shape-generic captures: specialized per shape for now,
                            with a perf hint */
} sg_dynamic;

/* A boolean option whose zero value means "the default" (torch's default). */
typedef enum sg_flag { SG_FLAG_DEFAULT = 0, SG_FLAG_TRUE, SG_FLAG_FALSE } sg_flag;

/* A custom backend (see "inspecting and extending compiled steps"). */
typedef struct sg_graph_view sg_graph_view;
typedef sg_status (*sg_step_fn)(sg_ctx *ctx, sg_tensor *const *in, sg_tensor **out, void *user);
typedef sg_status (*sg_backend_fn)(void *user, const sg_graph_view *graph, sg_step_fn *run);

typedef struct sg_compile_opts {
    sg_mode mode;         /* SG_MODE_DEFAULT when zero */
    bool fullgraph;       /* graph breaks are errors instead of eager fallbacks */
    sg_dynamic dynamic;
    int cache_size_limit; /* captures per fn; 0 means the default, 8 */
    bool disable;         /* run eagerly, as torch.compile(disable=True) */
    const char *name;     /* for logs and sg_fn_explain; "step" when NULL */
    int output_sets;      /* calls whose outputs stay valid at once, 1..64; 0: 2 */
    bool strict;          /* every fallback is an error (see "Fallbacks") */
    /* Options under torch._inductor.config's names (see "inspecting and
     * extending compiled steps"): */
    bool force_disable_caches; /* no disk cache reads: every capture compiles anew */
    sg_flag epilogue_fusion;   /* SG_FLAG_FALSE: no pointwise epilogue fused after
                                  reductions, row ops and matmuls (default: fused) */
    const char *backend_name;  /* torch.compile's backend=: NULL or "inductor" (fuse and
                                  generate code), "eager", "aot_eager" */
    sg_backend_fn backend_fn;  /* torch's backend=callable; NULL: none */
    void *backend_user;        /* passed to backend_fn and to the step it returns */
} sg_compile_opts;

typedef struct sg_fn sg_fn;

/*
 * The step (sg_step_fn, declared above): in holds nin tensors, out has
 * room for nout. Set every out[i] to a tensor (one the step made, an input,
 * or a parameter) and return SG_OK; a status other than SG_OK fails the
 * call with it (except that
 * SG_ERR_NULL, returned after an op of the step failed and the ops after it
 * passed its NULL along, fails the call with that op's status).
 */

/* Wrap step; nothing runs until the first sg_call. opts may be NULL (the
 * defaults: SG_MODE_DEFAULT). */
SG_API sg_status sg_compile(sg_ctx *ctx, sg_step_fn step, void *user, int nin, int nout,
                            const sg_compile_opts *opts, sg_fn **fn);
/*
 * Run the step on the nin tensors in `in` (nin must be the count fn was
 * compiled with); out, with room for nout (likewise), gets the output
 * handles (owned by fn; see above). On failure out is untouched and the
 * reason is in sg_last_error. A call that fails on a value found only while
 * its kernels run (an index out of range: SG_ERR_INDEX) is the exception to
 * "as they were": like the same ops run eagerly one by one, the step's
 * in-place updates before that op have happened.
 */
SG_API sg_status sg_call(sg_fn *fn, sg_tensor *const *in, int nin, sg_tensor **out, int nout);
/* Open a new step: outputs of earlier steps may be overwritten by the next
 * calls (see "Outputs" above: from the first sg_mark_step_begin on, steps
 * are the user's). */
SG_API sg_status sg_mark_step_begin(sg_ctx *ctx);
/* Drop every capture of fn (the next call captures again). */
SG_API sg_status sg_fn_reset(sg_fn *fn);
/*
 * fn's captures in text: for each, its guards, IR (one line per op, with
 * its scalar attributes: `mul_scalar(in0:f32[8], 0.25)`), buffers and pool
 * offsets, parameters, in-place mutations, and every fallback with its
 * reason (on CUDA also each reduction or row op left to a library kernel
 * rather than generated code, and why); then the output sets and the counters of sg_fn_get_stats. The text is owned by fn and valid until the
 * next sg_fn_explain or sg_fn_destroy; "" on NULL.
 */
SG_API const char *sg_fn_explain(sg_fn *fn);
/* Free fn, its captures and its output buffers and return SG_OK. Outputs
 * it returned become invalid. NULL: SG_OK. Calling a destroyed fn is
 * SG_ERR_RELEASED; destroying it again returns SG_ERR_RELEASED and changes
 * nothing (detected for the context's 64 most recently destroyed fns). An
 * fn whose record was freed (by sg_ctx_destroy, or after those 64) is never
 * read: SG_ERR_INVALID_ARG from this and from sg_call, the message in
 * sg_last_error(NULL). */
SG_API sg_status sg_fn_destroy(sg_fn *fn);

typedef enum sg_stance {
    SG_STANCE_DEFAULT = 0,         /* capture, recapture up to cache_size_limit */
    SG_STANCE_FORCE_EAGER,         /* every call runs eagerly */
    SG_STANCE_EAGER_ON_RECOMPILE,  /* known signatures replay; new ones run eagerly */
    SG_STANCE_FAIL_ON_RECOMPILE    /* a new signature after the first is an error */
} sg_stance;

/* Set fn's stance (see "Stances"); SG_ERR_INVALID_ARG for a value that is none. */
SG_API sg_status sg_fn_set_stance(sg_fn *fn, sg_stance stance);
/* Drop every capture of every fn of ctx (each fn captures again at its next call). */
SG_API sg_status sg_reset(sg_ctx *ctx);

/* What a fn did since sg_compile. */
typedef struct sg_fn_stats {
    uint64_t calls;                /* sg_call that got past argument checks */
    uint64_t captures;             /* recordings of the step into IR (graph breaks included) */
    uint64_t compiles;             /* captures turned into generated code */
    uint64_t cache_hits;           /* calls that found a capture matching their inputs */
    uint64_t graph_instantiations; /* device graphs instantiated (CUDA) */
    uint64_t exec_updates;         /* instantiated graphs patched in place (CUDA) */
    uint64_t patched_pointers;     /* replays that rewrote the addresses kernels read */
    uint64_t replays;              /* calls that ran a capture's plan */
    uint64_t fallbacks;            /* calls that ran the step eagerly (mode eager included) */
    uint64_t recycled_sets;        /* calls that overwrote an output set still holding
                                      valid outputs */
} sg_fn_stats;

/* Copy fn's counters into *stats. */
SG_API sg_status sg_fn_get_stats(const sg_fn *fn, sg_fn_stats *stats);

typedef struct sg_memory_stats {
    size_t pool_bytes;      /* bytes the static pool holds (scratch + output sets + constants) */
    size_t scratch_bytes;   /* the share of intermediates, reused by every fn */
    size_t output_bytes;    /* the output sets */
    size_t peak_live_bytes; /* the most intermediate bytes live at one op (a lower bound) */
    size_t unshared_bytes;  /* every intermediate's bytes added up: the pool without sharing */
    size_t host_bytes;      /* host memory the context holds now */
    size_t device_bytes;    /* tensor and pool bytes held now (on the device for GPU backends) */
    size_t device_peak_bytes; /* the most device_bytes ever held by the context */
    int captures;           /* captures (graphs) counted in the figures */
    size_t constant_bytes;  /* folded constants: values of no input, computed once */
} sg_memory_stats;

/* Start device_peak_bytes (and the host peak) over from what is held now,
 * like torch.cuda.reset_peak_memory_stats. */
SG_API void sg_ctx_reset_peak_memory(sg_ctx *ctx);

/* For the whole context (stats of every fn) or for one fn. */
SG_API sg_status sg_ctx_memory_stats(const sg_ctx *ctx, sg_memory_stats *stats);
SG_API sg_status sg_fn_memory_stats(const sg_fn *fn, sg_memory_stats *stats);

/* ---------------------------------------------------------------- inspecting and extending compiled steps */
/*
 * Seeing what the compiler did, beyond sg_fn_explain.
 *
 * SG_LOGS=output_code (or a log hook, topic "output_code") prints the whole
 * generated unit of every capture that compiles (C on the CPU, CUDA C on
 * CUDA): first a line "fn '<name>': capture <n>: generated unit <module>,
 * <lines> lines", then one log call per line of the source (a line longer
 * than 1,000 bytes comes in pieces of 1,000), then the summary line
 * "fn '<name>': capture <n>: <ops> IR ops -> <kernels> kernels in <module>".
 *
 * Kernel names: kernel k of a fused capture is called
 * sg_k<k>_<fused ops>_<dtype>; its generated functions are that name (or
 * sg_k<k>_pro_..., for the part before a library call) followed by the
 * shape and a hash. The op at IR line k of a capture that replays op by
 * op, unfused, is sg_op<k>_<op>. The DOT picture and the trace use these
 * names.
 *
 * Compile options under torch._inductor.config's names (sg_compile_opts):
 * force_disable_caches makes every capture of the fn compile its unit anew
 * (no kernel or max-autotune pick is read from the disk cache; what it
 * compiles is still written there); epilogue_fusion = SG_FLAG_FALSE keeps
 * pointwise ops after a reduction, row op or matmul out of its kernel (they
 * go to a kernel of their own or before the next reduction, row op or
 * matmul), as torch's epilogue_fusion=False. torch's
 * coordinate_descent_tuning, fallback_random and shape_padding have no
 * counterpart here: compiled random ops already draw what eager ones do.
 */

/*
 * Write the last capture of fn as a Graphviz DOT graph to `path`: one box
 * per kernel (label: its name, the ops it fused, the shape it walks), an
 * inverted house per input, a cylinder per parameter, a house per output,
 * and one edge per buffer passed between them, labelled with its dtype and
 * shape and where it lives ("scratch +<offset>", "output set +<offset>",
 * "input <i>", "parameter"); a kernel writing an input or parameter in
 * place has a dashed edge to it. When Graphviz's `dot` is on PATH it is run
 * (no shell, at most 60 seconds) to write `<path>.svg` too, and *svg (may
 * be NULL) is set to true; without `dot`, *svg is false and that is no
 * error. SG_ERR_INVALID_ARG when fn has no capture (call it first) or its
 * last capture runs eagerly; SG_ERR_COMPILE when a file cannot be written
 * or `dot` fails (the message says why).
 */
SG_API sg_status sg_fn_write_dot(sg_fn *fn, const char *path, bool *svg);

/*
 * Call fn `replays` times on `in` (as sg_call, so in-place updates happen
 * each time and the outputs are fn's as usual), timing every kernel (on the
 * CPU with clock_gettime around each generated kernel; on CUDA with a device
 * event before and after each kernel, the replay launched kernel by kernel
 * rather than as one graph), and write the timeline as Chrome / Perfetto trace JSON to
 * `path`: {"traceEvents": [{"name", "cat": "kernel", "ph": "X", "ts",
 * "dur", "pid": 1, "tid": 1, "args": {"replay", "kernel", "capture",
 * "ops"}}, ...]}, times in microseconds from the first event; one event per
 * kernel per replay (open it at ui.perfetto.dev or chrome://tracing).
 * Kernels are named as above. A call that runs eagerly (a fallback) adds no
 * events. cpu and cuda backends; on others SG_ERR_UNSUPPORTED.
 */
SG_API sg_status sg_fn_trace(sg_fn *fn, sg_tensor *const *in, int nin, const char *path,
                             int replays);

/*
 * Backends, as torch.compile's backend= (sg_compile_opts.backend_name):
 *   "inductor" (or NULL)  capture, fuse, generate code (everything above)
 *   "eager"               capture and plan, then replay op by op through
 *                         the eager kernels (as SG_CODEGEN=0)
 *   "aot_eager"           capture, then the fusion passes that rewrite the
 *                         graph (duplicate ops merged, unused ops dropped),
 *                         then replay the ops that remain one by one
 *                         through the eager kernels
 * Another name fails sg_compile with SG_ERR_INVALID_ARG.
 *
 * A custom backend (backend_fn, torch's backend=callable) is called once
 * per capture, after fusion, with a read-only view of the fused graph; it
 * sets *run to a step to run instead of the compiled capture (called as
 * run(ctx, in, out, backend_user) on every call that matches the capture:
 * eagerly, op by op, its outputs handed out like eager outputs), or leaves
 * *run NULL to let stepgraph go on as backend_name says. A status other
 * than SG_OK is a fallback (see "Fallbacks": the capture replays unfused,
 * op by op; under strict the call fails with that status). The view of
 * "aot_eager" has one kernel per op that remains, that of "eager" one per
 * IR op. The view and its strings are valid only during the callback. A
 * capture that backend_fn took over says so in sg_fn_explain; its calls
 * count neither as replays nor as eager calls in sg_fn_stats.
 */
SG_API int sg_graph_view_num_kernels(const sg_graph_view *graph);
/* Kernel k's name (see "Kernel names") into buf; "" when k is out of range. */
SG_API const char *sg_graph_view_kernel_name(const sg_graph_view *graph, int k, char *buf,
                                             size_t size);
/* The ops kernel k fused, in order, and the name of op i of them ("mul"). */
SG_API int sg_graph_view_num_ops(const sg_graph_view *graph, int k);
SG_API const char *sg_graph_view_op_name(const sg_graph_view *graph, int k, int i);
/* The step's inputs and outputs: counts, and dtype and shape of one (shape
 * has room for SG_MAX_DIMS). SG_ERR_INDEX when i is out of range. */
SG_API int sg_graph_view_num_inputs(const sg_graph_view *graph);
SG_API int sg_graph_view_num_outputs(const sg_graph_view *graph);
SG_API sg_status sg_graph_view_input(const sg_graph_view *graph, int i, sg_dtype *dtype,
                                     int *ndim, int64_t *shape);
SG_API sg_status sg_graph_view_output(const sg_graph_view *graph, int i, sg_dtype *dtype,
                                      int *ndim, int64_t *shape);

/* One backend of sg_list_backends. */
typedef struct sg_backend_info {
    sg_backend backend;
    const char *name; /* sg_backend_name(backend) */
    bool built;       /* compiled into this library */
    bool available;   /* sg_ctx_create with it would find a driver and a device now */
    char why[256];    /* when not available: why not */
} sg_backend_info;

/*
 * The backends this library knows, in the order SG_BACKEND_AUTO tries them
 * (cuda, hip, ze, cpu), into out (room for cap; may be NULL with cap 0);
 * *n gets how many there are (4), even when cap is smaller.
 */
SG_API sg_status sg_list_backends(sg_backend_info *out, int cap, int *n);

/* ---------------------------------------------------------------- kernel cache */

/*
 * Compiled kernels are kept on disk, one directory (C) or file (CUDA) per
 * SHA-256 key, so that a second process compiles nothing. The root is
 * SG_CACHE_DIR, else $XDG_CACHE_HOME/stepgraph, else ~/.cache/stepgraph,
 * else /tmp/stepgraph-<uid>; it is created with mode 0700.
 *
 * Trust: code is loaded from the cache and from SG_OVERRIDE_DIR, so both
 * must belong to the user and be writable by no one else. A root that is
 * not the user's, or that group or others may write to, fails the compile
 * with SG_ERR_COMPILE and a message naming the directory and the fix
 * ("chmod 700 <dir>", or set SG_CACHE_DIR to a directory you own); an
 * entry that is a link, not the user's or writable by others is never
 * loaded but rebuilt; files are opened without following links and must
 * be regular files (a FIFO or device is refused, never waited on). A root
 * that cannot be used at all (not creatable or not writable) makes each
 * build compile into a private temporary directory instead (said once
 * under the "fallbacks" log topic): kernels still run as fast, none is
 * kept. That is no fallback (nothing runs slower, only later processes
 * compile again), so strict does not make it an error.
 *
 * Size: after each new entry, the least recently used entries (an entry is
 * used when it is written or loaded) are removed until the cache holds at
 * most SG_CACHE_MAX_MB megabytes (default 1024; fractions allowed; 0: no
 * limit). The entry just written is never removed. Builds abandoned by a
 * killed process (tmp-* directories) are removed after an hour.
 *
 * The C compiler (SG_CC) runs with a time limit, SG_COMPILE_TIMEOUT
 * seconds (default 120; 0: none); on expiry it is killed with its whole
 * process group and the compile fails with SG_ERR_COMPILE.
 */

/* The cache root the context's compiles use now (from the environment),
 * created if missing, into buf (size bytes with the NUL). SG_ERR_COMPILE
 * when it cannot be used or trusted, SG_ERR_INVALID_ARG when buf is NULL or
 * too small; the message says which. */
SG_API sg_status sg_cache_dir(sg_ctx *ctx, char *buf, size_t size);
/*
 * Remove every entry of the cache root: compiled kernels, kept failed
 * builds, remembered max-autotune picks, and abandoned builds. Files and
 * directories whose names the cache does not use are left alone, and so
 * are builds younger than an hour (another process may be writing them).
 * Modules already loaded stay valid. From a shell, deleting the root
 * directory (see sg_cache_dir) does the same whenever no stepgraph process
 * is compiling.
 */
SG_API sg_status sg_cache_clear(sg_ctx *ctx);

#ifdef __cplusplus
}
#endif
#endif /* STEPGRAPH_H */
