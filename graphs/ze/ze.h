/* SPDX-License-Identifier: MIT */
/*
 * ze.h -- the Level Zero backend. The loader (libze_loader.so.1, or the
 * library SG_ZE_LOADER names) is opened with dlopen and initialized once
 * per process with zeInit(GPU only); when zeInit fails nothing else of the
 * loader is ever called (with some drivers installed a later call crashes).
 * A context gets the first GPU device of the first driver that has one, a
 * Level Zero context, device USM for tensors and the static pool, and an
 * immediate command list in synchronous mode for transfers and eager
 * launches.
 *
 * Kernels: OpenCL C compiled to SPIR-V by libocloc (codegen/ocloc.c), one
 * module per source, kernels by name. Recorded steps (sg__ze_rec): a
 * regular command list recorded once and replayed on the context's queue
 * with a fence; a launch's recorded argument values cannot be updated in
 * place, so changing one (sg__ze_rec_set_arg) re-records the list at the
 * next replay, while an address table in device memory that kernels read
 * is updated with an upload and needs no re-record.
 */
#ifndef SG_ZE_H
#define SG_ZE_H

#include "../backend.h"

/* Make ctx a Level Zero context (sg_ctx_create calls this): SG_OK, or
 * SG_ERR_BACKEND_UNAVAILABLE / SG_ERR_OOM with the reason in why. */
SG__HIDDEN sg_status sg__ze_init(sg_ctx *ctx, char *why, size_t n);
/* Whether a Level Zero GPU is usable (loads and initializes the loader
 * once per process): SG_OK, or SG_ERR_BACKEND_UNAVAILABLE with why. */
SG__HIDDEN sg_status sg__ze_probe(char *why, size_t n);
SG__HIDDEN extern const sg__graph_ops sg__ze_graph_ops; /* ze_graph.c */

/* An eager op (ze_eager.c): n as a one-op capture generated in the OpenCL C
 * dialect, its kernels kept by the capture's signature in *state (the
 * context's, NULL at first; sg__ze_eager_release frees it). */
SG__HIDDEN sg_status sg__ze_eager_run(sg_ctx *ctx, void **state, const sg__node *n);
SG__HIDDEN void sg__ze_eager_release(sg_ctx *ctx, void *state);

/* The device's name and its total memory in bytes (a ze context only). */
SG__HIDDEN const char *sg__ze_device_name(const sg_ctx *ctx);
SG__HIDDEN size_t sg__ze_device_memory(const sg_ctx *ctx);

typedef struct sg__ze_kfn sg__ze_kfn; /* a kernel of a loaded module */
typedef struct sg__ze_rec sg__ze_rec; /* a recorded command list */

/* One kernel argument: its bytes (a device address, a scalar). */
typedef struct sg__ze_arg {
    size_t size;
    const void *value;
} sg__ze_arg;
#define SG__ZE_MAX_ARGS 8
#define SG__ZE_MAX_ARG_BYTES 16

/*
 * The kernel `kernel` of the OpenCL C unit `name` (compiled by
 * sg__ocloc_build on first use, module loaded once per context), or of a
 * SPIR-V module given as is (sg__ze_kernel_spirv: `name` names the module
 * for caching and messages). The kernel lives as long as the context.
 * Failures: those of sg__ocloc_build; SG_ERR_COMPILE with the module's
 * build log; SG_ERR_DRIVER naming the call.
 */
SG__HIDDEN sg_status sg__ze_kernel(sg_ctx *ctx, const char *name, const char *source,
                                   const char *kernel, sg__ze_kfn **out);
SG__HIDDEN sg_status sg__ze_kernel_spirv(sg_ctx *ctx, const char *name, const void *spirv,
                                         size_t size, const char *kernel, sg__ze_kfn **out);
/* Run k now on the immediate list: groups work-groups of group_size
 * work-items each, with nargs arguments (at most SG__ZE_MAX_ARGS of at most
 * SG__ZE_MAX_ARG_BYTES bytes). Returns when it has finished. */
SG__HIDDEN sg_status sg__ze_launch(sg_ctx *ctx, sg__ze_kfn *k, const uint32_t groups[3],
                                   const uint32_t group_size[3], int nargs, const sg__ze_arg *args);

/* A recorded command list: create, append launches (each gets an index),
 * replay (closing it on the first replay; waits for the device), change
 * one argument of one launch (re-recorded at the next replay), free. */
SG__HIDDEN sg_status sg__ze_rec_create(sg_ctx *ctx, sg__ze_rec **out);
SG__HIDDEN sg_status sg__ze_rec_launch(sg_ctx *ctx, sg__ze_rec *r, sg__ze_kfn *k,
                                       const uint32_t groups[3], const uint32_t group_size[3],
                                       int nargs, const sg__ze_arg *args, int *index);
SG__HIDDEN sg_status sg__ze_rec_set_arg(sg_ctx *ctx, sg__ze_rec *r, int index, int arg,
                                        const sg__ze_arg *value);
SG__HIDDEN sg_status sg__ze_rec_replay(sg_ctx *ctx, sg__ze_rec *r);
/* How many times the list was recorded (1 + re-recordings), for tests. */
SG__HIDDEN int sg__ze_rec_recordings(const sg__ze_rec *r);
SG__HIDDEN void sg__ze_rec_free(sg_ctx *ctx, sg__ze_rec *r);

#endif /* SG_ZE_H */
