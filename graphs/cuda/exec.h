/* SPDX-License-Identifier: MIT */
/*
 * exec.h -- what the CUDA kernel families use of the CUDA executor. The
 * executor (exec.c) owns the primary context, one non-blocking stream per
 * sg_ctx, device memory, and the kernel units: each family's CUDA source
 * (graphs/cuda/k_<family>.cu, embedded in the library at build time) is one
 * NVRTC unit, compiled for the device's own arch on first use, cached on
 * disk, and loaded once per context.
 *
 * A family's host side (cuda_<family>.c) maps an sg__node to launches:
 *     sg_status sg__cuda_<family>(sg_ctx *ctx, const sg__node *n);
 * Tensor data pointers (sg__data(t)) are device addresses. Launches go on
 * the context's stream and are asynchronous; sg__cuda_sync waits.
 */
#ifndef SG_CUDA_EXEC_H
#define SG_CUDA_EXEC_H

#include "../backend.h"

/* The kernel units, one per family. */
typedef enum sg__cu_unit {
    SG__CU_POINTWISE, /* k_pointwise.cu: elementwise ops, casts, fills, where */
    SG__CU_DATA,      /* k_data.cu: embedding, index_select, index_copy, concat, arange */
    SG__CU_REDUCE,    /* k_reduce.cu: sum, mean, max, min, var, argmax */
    SG__CU_ROW,       /* k_row.cu: softmax, log_softmax, layer_norm, rms_norm, cross_entropy */
    SG__CU_MATMUL,    /* k_matmul.cu: gemv and the helpers around cuBLASLt */
    SG__CU_ATTN,      /* k_attn.cu: flash-decoding and flash attention (ATTENTION) */
    SG__CU_ATTN_BWD,  /* k_attn_bwd.cu: flash-attention backward (ATTENTION_BWD) */
    SG__CU_NUM_UNITS
} sg__cu_unit;

/* The embedded sources (generated from the .cu files by the build). */
SG__HIDDEN extern const char *const sg__cu_sources[SG__CU_NUM_UNITS];
SG__HIDDEN extern const char *const sg__cu_names[SG__CU_NUM_UNITS];
/* The families the build compiled (tools/sg_cubins.c, when it found
 * NVRTC): sg__cu_nimages images, each for one unit and sm_<arch>. */
typedef struct sg__cu_image {
    sg__cu_unit unit;
    int arch;
    const unsigned char *data;
    size_t size;
} sg__cu_image;
SG__HIDDEN extern const sg__cu_image sg__cu_images[];
SG__HIDDEN extern const int sg__cu_nimages;

/* A kernel of a unit by its extern "C" name (a CUfunction), compiling and
 * loading the unit on first use. */
SG__HIDDEN sg_status sg__cuda_kernel(sg_ctx *ctx, sg__cu_unit unit, const char *name, void **func);
/* Launch func on the context's stream: args as cuLaunchKernel's kernelParams
 * (an array of pointers to each argument). On sm_90+ the kernel may start
 * while the one before it on the stream finishes (programmatic dependent
 * launch): every kernel launched here, generated or of a family, executes
 * griddepcontrol.wait before it touches memory. Where the device or driver
 * cannot, a plain launch; SG_CUDA_PDL=0 turns it off. */
SG__HIDDEN sg_status sg__cuda_launch(sg_ctx *ctx, void *func, const unsigned grid[3],
                                     const unsigned block[3], size_t shmem, void **args);
/* Device scratch for one op, valid until the next call of this function on
 * the context (ops run one at a time on the stream, so one buffer serves). */
SG__HIDDEN sg_status sg__cuda_scratch(sg_ctx *ctx, size_t bytes, void **dptr);
/* Whether sg__cuda_scratch can give bytes now: always, except while a graph
 * is recorded, when the scratch cannot grow (the step's first run, which
 * sizes it, took the same path). */
SG__HIDDEN bool sg__cuda_scratch_fits(const sg_ctx *ctx, size_t bytes);
/* Set n bytes at dptr to byte, in stream order (a memset node in a graph). */
SG__HIDDEN sg_status sg__cuda_memset(sg_ctx *ctx, void *dptr, unsigned char byte, size_t n);
/* Copy device memory to the host and wait (for host-side index checks). */
SG__HIDDEN sg_status sg__cuda_download(sg_ctx *ctx, void *dst, const void *src, size_t nbytes);
/* True while a CUDA graph is being recorded: ops must not wait for the device
 * then (no host-side index checks; kernels guard their indices instead). */
SG__HIDDEN bool sg__cuda_capturing(const sg_ctx *ctx);
SG__HIDDEN void sg__cuda_set_capturing(sg_ctx *ctx, bool on);
/* Wait for the stream. */
SG__HIDDEN sg_status sg__cuda_sync(sg_ctx *ctx);
/* Device facts. */
SG__HIDDEN int sg__cuda_sm_count(const sg_ctx *ctx);
SG__HIDDEN size_t sg__cuda_l2_bytes(const sg_ctx *ctx); /* 0 when the device did not say */
SG__HIDDEN int sg__cuda_arch(const sg_ctx *ctx); /* 90 for sm_90 */
/* The CUstream ops go on now, for libraries (cuBLASLt): the context's, or
 * while a graph with branches is recorded, the current lane's. */
SG__HIDDEN void *sg__cuda_stream(const sg_ctx *ctx);
/* Lanes: while a CUDA graph is recorded, groups that need not wait for each
 * other go on streams of their own (cuda_graph.c), which the recording joins
 * into one graph with branches. Lane 0 is the context's stream; lanes 1 ..
 * SG__CUDA_LANES - 1 are made by sg__cuda_lanes_make (before a recording)
 * and live as long as the context. Launches, copies and fills go on the
 * current lane; host transfers and waits stay on lane 0. */
#define SG__CUDA_LANES 4
/* Unless SG_CUDA_LANE_PRIORITY=0 (read when the context is made; CUDA
 * only), the context's stream and lane 1 take the device's greatest priority and
 * lanes 2 and 3 its least: a plan's urgent groups go on the first two
 * (sg__lanes.nhigh), and the graph keeps each kernel's priority. */
#define SG__CUDA_LANES_HIGH 2
SG__HIDDEN bool sg__cuda_lane_priority(const sg_ctx *ctx);
SG__HIDDEN sg_status sg__cuda_lanes_make(sg_ctx *ctx, int n);
SG__HIDDEN void *sg__cuda_lane_stream(const sg_ctx *ctx, int lane);
SG__HIDDEN void sg__cuda_set_lane(sg_ctx *ctx, int lane);
SG__HIDDEN int sg__cuda_lane(const sg_ctx *ctx);
/* How many stream ops (launches, copies, fills) and scratch requests the
 * context has made: what tells a library call that only ran cuBLASLt. */
SG__HIDDEN void sg__cuda_counts(const sg_ctx *ctx, uint64_t *ops, uint64_t *scratch);
/* cuBLASLt's workspace for a lane (cublaslt.c): lane 0's is made at the
 * first matmul; another's here, before a recording puts a product there. */
SG__HIDDEN sg_status sg__cublaslt_lane_ready(sg_ctx *ctx, int lane);
/* Whether the context runs on the HIP runtime's table (an AMD GPU). */
SG__HIDDEN bool sg__cuda_is_hip(const sg_ctx *ctx);
/* Compile a unit for the context's device: NVRTC for sm_<arch> on CUDA,
 * hiprtc for its gfx arch on HIP (sg__rtc_build); the image loads with the
 * table's cuModuleLoadData. */
SG__HIDDEN sg_status sg__cuda_rtc_build(sg_ctx *ctx, const char *name, const char *source,
                                        void **image, size_t *size);
/* n units at once (sg__rtc_build_many): NVRTC's compiles on up to nthreads
 * threads; hiprtc's one after another. */
SG__HIDDEN sg_status sg__cuda_rtc_build_many(sg_ctx *ctx, int n, const char *const *names,
                                             const char *const *sources, int nthreads,
                                             void **images, size_t *sizes);

/* Make ctx a CUDA context (sg_ctx_create calls this), or a HIP one when
 * ctx->backend is SG_BACKEND_HIP (the HIP runtime's table): SG_OK, or
 * SG_ERR_BACKEND_UNAVAILABLE / SG_ERR_OOM with the reason in why. */
SG__HIDDEN sg_status sg__cuda_init(sg_ctx *ctx, char *why, size_t n);

SG__HIDDEN extern const sg__graph_ops sg__cuda_graph_ops;
/* Drop the context's cuBLASLt state (cublaslt.c). */
SG__HIDDEN void sg__cublaslt_release(sg_ctx *ctx);
/* Host bytes cuBLASLt's state holds: its record, plans and picks. */
SG__HIDDEN size_t sg__cublaslt_host_bytes(const sg_ctx *ctx);
/* Start loading cuBLASLt and making its handle on a thread of its own, so
 * that what the user does before the first product hides it: called when
 * the context is made (step false) and again by a compile of a step with
 * library matmuls, before its unit is built (step true). SG_CUDA_PREWARM=0:
 * neither; =step: only the second. The first matmul waits for the thread
 * and reports what failed, as a load on first use would. */
SG__HIDDEN void sg__cublaslt_prewarm(sg_ctx *ctx, bool step);
/* The primary context the executor made current (a CUcontext). */
SG__HIDDEN void *sg__cuda_context(const sg_ctx *ctx);
/* Where that state hangs: a slot of the context's CUDA state, NULL until
 * the first matmul (cublaslt.c owns what it points to). */
SG__HIDDEN void **sg__cuda_lt_state(sg_ctx *ctx);

/* The families (each a cuda_<family>.c). */
SG__HIDDEN sg_status sg__cuda_pointwise(sg_ctx *ctx, const sg__node *n);
SG__HIDDEN sg_status sg__cuda_data(sg_ctx *ctx, const sg__node *n);
/* The index values of a data node (embedding, index_select, index_copy_) in
 * range, as its eager kernel checks them, for generated kernels that run the
 * node instead; SG_OK for other nodes and while a graph is recorded. */
SG__HIDDEN sg_status sg__cuda_data_check(sg_ctx *ctx, const sg__node *n);
SG__HIDDEN sg_status sg__cuda_reduce(sg_ctx *ctx, const sg__node *n);
SG__HIDDEN sg_status sg__cuda_row(sg_ctx *ctx, const sg__node *n);
/* CROSS_ENTROPY_BWD bwd and the CROSS_ENTROPY fwd of the same logits and
 * targets that fusion merged into its group (sg__group.xent): one kernel
 * computing the gradient, fwd's row losses and their mean. */
SG__HIDDEN sg_status sg__cuda_xent_pair(sg_ctx *ctx, const sg__node *bwd, const sg__node *fwd);
/* Whether SG_CUDA_XENT (a comma list; unset: all) names what: "stage" (the
 * gradient's kernel keeps a block's row in shared memory between its two
 * passes), "async" (its statistics pass copies the row there by cp.async
 * first) or "pair" (fusion's sg__fuse_opts.xent_pairs). */
SG__HIDDEN bool sg__cuda_xent_on(const char *what);
/* NORM_BWD n and the SUM of its input gradient that fusion merged into its
 * group (sg__group.nbsum): the norm's kernel also writes the sum, *took,
 * where its rows take the one-pass kernel; else the caller runs the sum. */
SG__HIDDEN sg_status sg__cuda_norm_bwd_sum(sg_ctx *ctx, const sg__node *n, const sg__node *sum,
                                           bool *took);
/* Whether SG_CUDA_NORM_BWD (a comma list; unset: all; "off": nothing)
 * names what: "sum" (fusion's sg__fuse_opts.norm_sums) or "early" (the
 * one-pass kernel loads the added gradient r with x and g, before the
 * row's sums, rather than after them). */
SG__HIDDEN bool sg__cuda_norm_bwd_on(const char *what);
/* For sg_fn_explain: why NORM_BWD node n runs as a team per row and a
 * column-sum kernel rather than the one-pass kernel (into buf), or false. */
SG__HIDDEN bool sg__cuda_norm_bwd_note(const sg__node *n, char *buf, size_t size);
/* For sg_fn_explain: how g's last CUDA graph recording used the lanes
 * (streams, waits, each kernel's stream), or false before any. */
SG__HIDDEN bool sg__cuda_lanes_note(const struct sg__graph *g, char *buf, size_t size);
SG__HIDDEN sg_status sg__cuda_matmul(sg_ctx *ctx, const sg__node *n);
/* Node n's product with its fused group's epilogue member e in cuBLASLt's
 * epilogue (epi an sg__lib_epi, res and aux as sg__group's lib_res and
 * lib_aux; cuda_matmul.c): *took false when it ran nothing, for the caller
 * to run the product and the epilogue kernel. */
SG__HIDDEN sg_status sg__cuda_matmul_epi(sg_ctx *ctx, const sg__node *n, const sg__node *e, int epi,
                                         int res, bool aux, bool *took);
SG__HIDDEN sg_status sg__cuda_attn(sg_ctx *ctx, const sg__node *n);
/* ATTENTION n and the copies of its k and v views that fusion merged into
 * its group (sg__group.ncopies): one kernel where it can, else each alone. */
SG__HIDDEN sg_status sg__cuda_attn_copies(sg_ctx *ctx, const sg__node *n,
                                          const sg__node *const *copies, int ncopies);
SG__HIDDEN sg_status sg__cuda_attn_bwd(sg_ctx *ctx, const sg__node *n);

#endif /* SG_CUDA_EXEC_H */
