/* SPDX-License-Identifier: MIT */
/*
 * cuda.h -- the CUDA driver, loaded at run time. stepgraph has no link-time
 * dependency on libcuda: driver.c opens libcuda.so.1 with dlopen, takes
 * cuGetProcAddress from it, and resolves every entry point below through it
 * into one typed table. A machine without a driver (or without a device)
 * gets SG_ERR_BACKEND_UNAVAILABLE with the reason, and SG_BACKEND_AUTO
 * picks the CPU.
 *
 * The table's field types come from the toolkit's <cuda.h>, which this
 * file includes only when CMake found the toolkit (SG_HAVE_CUDA_HEADERS).
 * A field is named after the versioned symbol the header maps a name to
 * (cuMemAlloc -> cuMemAlloc_v2); the string is the base name that
 * cuGetProcAddress resolves for the CUDA version we were built against.
 */
#ifndef SG_CUDA_DRIVER_H
#define SG_CUDA_DRIVER_H

#include "../../capture/capture.h"

/* What a probe learns about device 0 (or why there is none). */
typedef struct sg__cuda_device {
    char name[128];
    int cc_major, cc_minor; /* compute capability: 9.0 on the H100 */
    int sms;                /* multiprocessors */
    int driver_version;     /* 13000 for 13.0 */
    size_t total_mem;       /* bytes */
    int count;              /* devices present */
    bool hip;               /* read through the HIP runtime (hip.c) */
    char arch_name[32];     /* HIP: the gfx arch hiprtc compiles for ("gfx90a"); "" on CUDA */
} sg__cuda_device;

/*
 * Whether a CUDA device is usable: loads the driver, initializes it and
 * reads device 0. SG_OK and *dev filled, or SG_ERR_BACKEND_UNAVAILABLE with
 * the reason (no libcuda.so.1, cuInit failed, no device, a missing entry
 * point) in why. Cheap after the first call (the outcome is remembered).
 */
SG__HIDDEN sg_status sg__cuda_probe(char *why, size_t n, sg__cuda_device *dev);
/* The same for the HIP runtime (hip.c): loads libamdhip64, hipInit, reads
 * device 0 (arch_name set); the reason names hipInit's result or the
 * missing library, and the fix. */
SG__HIDDEN sg_status sg__hip_probe(char *why, size_t n, sg__cuda_device *dev);
/* What runs HIP's matmuls (hip.c): no hipBLASLt path (its API's numbers are
 * not cuBLASLt's), so the generated GEMM and the GEMV kernel; the line into
 * buf says so and whether libhipblaslt is installed (returned). The HIP
 * executor logs it once per process under "fallbacks". */
SG__HIDDEN bool sg__hip_blaslt_note(char *buf, size_t n);

#ifdef SG_HAVE_CUDA_HEADERS
#include <cuda.h>

/* X(field, "name for cuGetProcAddress") */
#define SG__CU_API(X)                                                                              \
    X(cuInit, "cuInit")                                                                            \
    X(cuDriverGetVersion, "cuDriverGetVersion")                                                    \
    X(cuGetErrorName, "cuGetErrorName")                                                            \
    X(cuGetErrorString, "cuGetErrorString")                                                        \
    X(cuDeviceGetCount, "cuDeviceGetCount")                                                        \
    X(cuDeviceGet, "cuDeviceGet")                                                                  \
    X(cuDeviceGetName, "cuDeviceGetName")                                                          \
    X(cuDeviceGetAttribute, "cuDeviceGetAttribute")                                                \
    X(cuDeviceTotalMem_v2, "cuDeviceTotalMem")                                                     \
    X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain")                                        \
    X(cuDevicePrimaryCtxRelease_v2, "cuDevicePrimaryCtxRelease")                                   \
    X(cuCtxSetCurrent, "cuCtxSetCurrent")                                                          \
    X(cuCtxSynchronize, "cuCtxSynchronize")                                                        \
    X(cuStreamCreate, "cuStreamCreate")                                                            \
    X(cuStreamCreateWithPriority, "cuStreamCreateWithPriority")                                    \
    X(cuCtxGetStreamPriorityRange, "cuCtxGetStreamPriorityRange")                                  \
    X(cuStreamDestroy_v2, "cuStreamDestroy")                                                       \
    X(cuStreamSynchronize, "cuStreamSynchronize")                                                  \
    X(cuStreamBeginCapture_v2, "cuStreamBeginCapture")                                             \
    X(cuStreamEndCapture, "cuStreamEndCapture")                                                    \
    X(cuMemAlloc_v2, "cuMemAlloc")                                                                 \
    X(cuMemFree_v2, "cuMemFree")                                                                   \
    X(cuMemGetInfo_v2, "cuMemGetInfo")                                                             \
    X(cuMemcpyHtoDAsync_v2, "cuMemcpyHtoDAsync")                                                   \
    X(cuMemcpyDtoHAsync_v2, "cuMemcpyDtoHAsync")                                                   \
    X(cuMemcpyDtoDAsync_v2, "cuMemcpyDtoDAsync")                                                   \
    X(cuMemsetD8Async, "cuMemsetD8Async")                                                          \
    X(cuModuleLoadData, "cuModuleLoadData")                                                        \
    X(cuModuleGetFunction, "cuModuleGetFunction")                                                  \
    X(cuModuleUnload, "cuModuleUnload")                                                            \
    X(cuModuleGetGlobal_v2, "cuModuleGetGlobal")                                                   \
    X(cuFuncSetAttribute, "cuFuncSetAttribute")                                                    \
    X(cuLaunchKernel, "cuLaunchKernel")                                                            \
    X(cuLaunchKernelEx, "cuLaunchKernelEx")                                                        \
    X(cuEventCreate, "cuEventCreate")                                                              \
    X(cuEventRecord, "cuEventRecord")                                                              \
    X(cuEventSynchronize, "cuEventSynchronize")                                                    \
    X(cuEventElapsedTime_v2, "cuEventElapsedTime")                                                 \
    X(cuEventDestroy_v2, "cuEventDestroy")                                                         \
    X(cuStreamWaitEvent, "cuStreamWaitEvent")                                                      \
    X(cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags")                                  \
    X(cuGraphExecUpdate_v2, "cuGraphExecUpdate")                                                   \
    X(cuGraphUpload, "cuGraphUpload")                                                              \
    X(cuGraphLaunch, "cuGraphLaunch")                                                              \
    X(cuGraphDestroy, "cuGraphDestroy")                                                            \
    X(cuGraphExecDestroy, "cuGraphExecDestroy")                                                    \
    X(cuGraphGetNodes, "cuGraphGetNodes")                                                          \
    X(cuGraphNodeGetType, "cuGraphNodeGetType")                                                    \
    X(cuGraphMemsetNodeGetParams, "cuGraphMemsetNodeGetParams")                                    \
    X(cuGraphNodeGetDependencies, "cuGraphNodeGetDependencies")                                    \
    X(cuGraphNodeGetDependentNodes, "cuGraphNodeGetDependentNodes")                                \
    X(cuGraphAddDependencies, "cuGraphAddDependencies")                                            \
    X(cuGraphAddKernelNode, "cuGraphAddKernelNode")                                                \
    X(cuGraphDestroyNode, "cuGraphDestroyNode")

typedef struct sg__cu_api {
#define X(field, name) __typeof__(&field) field;
    SG__CU_API(X)
#undef X
} sg__cu_api;

/* The driver table (loaded and cuInit'ed once per process), or
 * SG_ERR_BACKEND_UNAVAILABLE with the reason in why. */
SG__HIDDEN sg_status sg__cuda_load(char *why, size_t n, const sg__cu_api **out);
/* The same table filled from the HIP runtime (hip.c: hip* functions where
 * they agree with the driver call, shims where not), hipInit'ed once. The
 * graph-editing entries (cuGraphGetNodes and after) stay NULL there: what
 * uses them (cuda_graph.c's memset nodes) is for CUDA's libraries. */
SG__HIDDEN sg_status sg__hip_load(char *why, size_t n, const sg__cu_api **out);
/* The table of a context of the CUDA executor (CUDA's or HIP's). */
SG__HIDDEN const sg__cu_api *sg__cuda_api(const sg_ctx *ctx);
/* What the probe read of the context's device (exec.c keeps it). */
SG__HIDDEN const sg__cuda_device *sg__cuda_device_of(const sg_ctx *ctx);
/* "CUDA_ERROR_OUT_OF_MEMORY (out of memory)" into buf. */
SG__HIDDEN const char *sg__cu_strerror(CUresult r, char *buf, size_t size);
/* The same through a given table (HIP's names its errors hipError...). */
SG__HIDDEN const char *sg__cu_strerror_in(const sg__cu_api *api, CUresult r, char *buf,
                                          size_t size);
/* Record a failed driver call: SG_ERR_OOM for out-of-memory, else
 * SG_ERR_DRIVER, with a message naming the backend, the call, what it was
 * doing and the driver's error. Returns the status. */
SG__HIDDEN sg_status sg__cu_fail(sg_ctx *ctx, CUresult r, const char *call, const char *doing);
#endif /* SG_HAVE_CUDA_HEADERS */

#endif /* SG_CUDA_DRIVER_H */
