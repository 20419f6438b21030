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
 * Make a context. opts may be NULL (all defaults). SG_BACKEND_AUTO takes
 * CUDA when a driver and a device are there (environment SG_BACKEND=cpu
 * makes it take the CPU) and never fails for want of a device: it falls
 * back to the CPU. The CUDA driver, NVRTC and cuBLASLt are loaded at run
 * time; nothing links against them. Naming a backend
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
 * replays op by op through the eager kernels (logged under "fallbacks").
 * Environment: SG_CACHE_DIR, SG_DUMP_DIR (every generated source),
 * SG_OVERRIDE_DIR (compile a hand-edited <name>.c instead), SG_ALWAYS_COMPILE=1,
 * SG_CC, SG_CFLAGS, SG_DISABLE_FUSION=1 (one kernel per op), SG_CODEGEN=0
 * (no generated code: replay op by op).
 *
 * On CUDA the same fused groups become one CUDA C program per capture,
 * compiled by NVRTC for the device's arch and cached on disk: pointwise and
 * multi-tensor kernels (16-byte vector loads where the layout allows),
 * epilogue kernels after reductions, row ops and cuBLASLt matmuls, and
 * GEMV kernels with bias and epilogue fused for matmuls of up to 8 rows
 * (batch-1 inference). REDUCE_OVERHEAD and MAX_AUTOTUNE record a CUDA graph
 * per output set and replay it with one launch; a new input address
 * rewrites the device table of addresses the kernels read and re-records
 * the graph, which patches the instantiated one (cuGraphExecUpdate). The
 * MAX_AUTOTUNE modes time 128/256/512 threads per generated kernel on the
 * real buffers. Kernels launch with programmatic dependent launch on sm_90
 * (SG_CUDA_PDL=0 turns it off).
 *
 * What a step may do: read its inputs and any tensors made outside it (its
 * *parameters*: weights, caches), make new tensors with ops (they belong to
 * the step and vanish after it), and update inputs and parameters in place
 * (sg_copy_, sg_add_, sg_index_copy_, sg_fill_): replays repeat those
 * updates on the same tensors (inputs: on the tensors passed to that call).
 * What it may not rely on: host reads or writes of tensor data (sg_read,
 * sg_item, sg_write, sg_from_host) are *graph breaks* -- with fullgraph they
 * fail with SG_ERR_GRAPH_BREAK; without it that signature runs eagerly from
 * then on (logged under "graph_breaks" and "fallbacks"). The capture had not
 * run the ops before the break, so that first call runs the whole step
 * again, eagerly: a step with a graph break is called twice on its first
 * call (SG_DRY_CAPTURE=0 makes captures run the step as they record, and
 * then it is called once). Host values the
 * step reads from your own structs are baked into the capture: pass what
 * changes per call as a tensor (a position as an i64 tensor, not an int),
 * and if you swap a parameter for another tensor, call sg_fn_reset.
 *
 * Guards: a capture holds for the dtypes, shapes and strides of the inputs
 * and for which inputs share storage. Another signature is captured anew
 * (logged under "recompiles", with the guard that failed), up to
 * cache_size_limit captures; past that, new signatures run eagerly (said
 * once under "fallbacks"). A new *address* for an input is not a miss.
 *
 * Outputs and steps: outputs of sg_call are handles owned by the fn,
 * valid until a later call overwrites them. sg_mark_step_begin(ctx) opens
 * a new step: the first call of a fn in a step reuses the output buffers of
 * the fn's first call of the previous step, the second call those of the
 * second, and so on; within one step, calls never overwrite each other's
 * outputs (a second call in a step gets its own output buffers, made once).
 * An output set whose handles were all released with sg_release is
 * reused at once. Using an overwritten output, or a view of it, fails with
 * SG_ERR_STALE_OUTPUT naming the step that overwrote it (detected for the
 * 64 most recent calls of the fn); sg_clone what you keep. Without any
 * sg_mark_step_begin, release outputs when done, or each call takes new
 * output buffers (a perf hint says so).
 */
typedef enum sg_mode {
    SG_MODE_EAGER = 0,
    SG_MODE_DEFAULT,
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

typedef struct sg_compile_opts {
    sg_mode mode;         /* SG_MODE_EAGER when zero: pass a mode */
    bool fullgraph;       /* graph breaks are errors instead of eager fallbacks */
    sg_dynamic dynamic;
    int cache_size_limit; /* captures per fn; 0 means the default, 8 */
    bool disable;         /* run eagerly, as torch.compile(disable=True) */
    const char *name;     /* for logs and sg_fn_explain; "step" when NULL */
} sg_compile_opts;

typedef struct sg_fn sg_fn;

/*
 * The step: in holds nin tensors, out has room for nout. Set every out[i]
 * to a tensor (one the step made, an input, or a parameter) and return
 * SG_OK; a status other than SG_OK fails the call with it.
 */
typedef sg_status (*sg_step_fn)(sg_ctx *ctx, sg_tensor *const *in, sg_tensor **out, void *user);

/* Wrap step; nothing runs until the first sg_call. opts may be NULL (eager). */
SG_API sg_status sg_compile(sg_ctx *ctx, sg_step_fn step, void *user, int nin, int nout,
                            const sg_compile_opts *opts, sg_fn **fn);
/*
 * Run the step on the nin tensors in `in` (nin must be the count fn was
 * compiled with); out, with room for nout (likewise), gets the output
 * handles (owned by fn; see above). On failure out is untouched and the
 * reason is in sg_last_error.
 */
SG_API sg_status sg_call(sg_fn *fn, sg_tensor *const *in, int nin, sg_tensor **out, int nout);
/* Open a new step: outputs of earlier steps may be overwritten by the next calls. */
SG_API sg_status sg_mark_step_begin(sg_ctx *ctx);
/* Drop every capture of fn (the next call captures again). */
SG_API sg_status sg_fn_reset(sg_fn *fn);
/*
 * fn's captures in text: for each, its guards, IR (one line per op),
 * buffers and pool offsets, parameters, in-place mutations, and every
 * fallback with its reason. The text is owned by fn and valid until the
 * next sg_fn_explain or sg_fn_destroy; "" on NULL.
 */
SG_API const char *sg_fn_explain(sg_fn *fn);
/* Free fn, its captures and its output buffers. Outputs it returned become
 * invalid. NULL does nothing. */
SG_API void sg_fn_destroy(sg_fn *fn);

typedef struct sg_memory_stats {
    size_t pool_bytes;      /* bytes the static pool holds (scratch + output sets) */
    size_t scratch_bytes;   /* the share of intermediates, reused by every fn */
    size_t output_bytes;    /* the output sets */
    size_t peak_live_bytes; /* the most intermediate bytes live at one op (a lower bound) */
    size_t unshared_bytes;  /* every intermediate's bytes added up: the pool without sharing */
    size_t host_bytes;      /* host memory the context holds now */
    size_t device_bytes;    /* tensor and pool bytes held now (on the device for GPU backends) */
    size_t device_peak_bytes; /* the most device_bytes ever held by the context */
    int captures;           /* captures (graphs) counted in the figures */
} sg_memory_stats;

/* Start device_peak_bytes (and the host peak) over from what is held now,
 * like torch.cuda.reset_peak_memory_stats. */
SG_API void sg_ctx_reset_peak_memory(sg_ctx *ctx);

/* For the whole context (stats of every fn) or for one fn. */
SG_API sg_status sg_ctx_memory_stats(const sg_ctx *ctx, sg_memory_stats *stats);
SG_API sg_status sg_fn_memory_stats(const sg_fn *fn, sg_memory_stats *stats);

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
 * under the "fallbacks" log topic): kernels still run, none is kept.
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
