/* SPDX-License-Identifier: MIT */
/*
 * hip.c -- the HIP runtime as the CUDA executor's driver table. AMD GPUs run
 * through the same executor, graph manager and kernel families as CUDA
 * (exec.c, cuda_graph.c, cuda_<family>.c); what differs is this table. It is
 * filled from libamdhip64 (loaded at run time: sg__hip_library), entry by
 * entry: the hip* function itself where its signature and meaning agree
 * with the CUDA driver call (the handle types are pointers of one size, the
 * error codes the executor tests have CUDA's values: both are checked at
 * build time below), and a small shim where they do not:
 *   cuGetErrorName/String   hipGetErrorName/String return the text;
 *   cuCtxSetCurrent         hipSetDevice(0) (HIP's context calls are
 *                           deprecated; the executor uses device 0's
 *                           primary context), cuCtxSynchronize is
 *                           hipDeviceSynchronize;
 *   cuDeviceGetAttribute    the attributes the executor reads, renumbered;
 *   cuFuncSetAttribute      HIP has none for module functions: a dynamic
 *                           shared size up to the 64 KiB every block may use
 *                           succeeds, anything else is NOT_SUPPORTED;
 *   cuLaunchKernelEx        NOT_SUPPORTED (no launch attributes, so no
 *                           programmatic dependent launch: the executor
 *                           launches plainly, and sg__cuda_arch is 0 on HIP
 *                           so it never asks);
 *   cuGraphExecUpdate       HIP's reports its result in two outputs;
 *   cuGraphUpload           absent in HIP 5: the first launch uploads.
 * The device's arch is its gcnArchName without feature flags ("gfx90a"),
 * which hiprtc compiles the kernel units for (codegen/nvrtc.c). Nothing is
 * called after a failed hipInit.
 */
#include "cuda.h"

#include <dlfcn.h>
#include <stdio.h>

#if defined(SG_HAVE_CUDA_HEADERS) && defined(SG_HAVE_HIP_HEADERS)

#include "../../codegen/codegen.h"

#include <dlfcn.h>
#include <hip/hip_runtime_api.h>
#include <pthread.h>

/* What the entries passed through unchanged rely on. */
_Static_assert(sizeof(CUdeviceptr) == sizeof(hipDeviceptr_t), "device pointers");
_Static_assert(sizeof(CUdevice) == sizeof(hipDevice_t), "device ordinals");
_Static_assert((int)CUDA_SUCCESS == (int)hipSuccess, "success");
_Static_assert((int)CUDA_ERROR_INVALID_VALUE == (int)hipErrorInvalidValue, "invalid value");
_Static_assert((int)CUDA_ERROR_OUT_OF_MEMORY == (int)hipErrorOutOfMemory, "out of memory");
_Static_assert((int)CUDA_ERROR_NO_DEVICE == (int)hipErrorNoDevice, "no device");
_Static_assert((int)CUDA_ERROR_NOT_SUPPORTED == (int)hipErrorNotSupported, "not supported");
_Static_assert(CU_STREAM_NON_BLOCKING == hipStreamNonBlocking, "stream flags");
_Static_assert(CU_EVENT_DEFAULT == hipEventDefault, "event flags");
_Static_assert(CU_EVENT_DISABLE_TIMING == hipEventDisableTiming, "event flags");
_Static_assert((int)CU_STREAM_CAPTURE_MODE_RELAXED == (int)hipStreamCaptureModeRelaxed,
               "capture mode");
_Static_assert((int)CU_GRAPH_EXEC_UPDATE_SUCCESS == (int)hipGraphExecUpdateSuccess &&
                   (int)CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED ==
                       (int)hipGraphExecUpdateErrorTopologyChanged,
               "graph update results");

#define SG__HIP_API(X)                                                                             \
    X(hipInit)                                                                                     \
    X(hipDriverGetVersion)                                                                         \
    X(hipGetErrorName)                                                                             \
    X(hipGetErrorString)                                                                           \
    X(hipGetDeviceCount)                                                                           \
    X(hipDeviceGet)                                                                                \
    X(hipDeviceGetName)                                                                            \
    X(hipDeviceGetAttribute)                                                                       \
    X(hipGetDeviceProperties)                                                                      \
    X(hipDeviceTotalMem)                                                                           \
    X(hipDevicePrimaryCtxRetain)                                                                   \
    X(hipDevicePrimaryCtxRelease)                                                                  \
    X(hipSetDevice)                                                                                \
    X(hipDeviceSynchronize)                                                                        \
    X(hipStreamCreateWithFlags)                                                                    \
    X(hipStreamDestroy)                                                                            \
    X(hipStreamSynchronize)                                                                        \
    X(hipStreamBeginCapture)                                                                       \
    X(hipStreamEndCapture)                                                                         \
    X(hipMalloc)                                                                                   \
    X(hipFree)                                                                                     \
    X(hipMemGetInfo)                                                                               \
    X(hipMemcpyHtoDAsync)                                                                          \
    X(hipMemcpyDtoHAsync)                                                                          \
    X(hipMemcpyDtoDAsync)                                                                          \
    X(hipMemsetD8Async)                                                                            \
    X(hipModuleLoadData)                                                                           \
    X(hipModuleGetFunction)                                                                        \
    X(hipModuleUnload)                                                                             \
    X(hipModuleLaunchKernel)                                                                       \
    X(hipEventCreateWithFlags)                                                                     \
    X(hipEventRecord)                                                                              \
    X(hipEventSynchronize)                                                                         \
    X(hipEventElapsedTime)                                                                         \
    X(hipEventDestroy)                                                                             \
    X(hipStreamWaitEvent)                                                                          \
    X(hipGraphInstantiateWithFlags)                                                                \
    X(hipGraphExecUpdate)                                                                          \
    X(hipGraphLaunch)                                                                              \
    X(hipGraphDestroy)                                                                             \
    X(hipGraphExecDestroy)

static struct {
#define X(f) __typeof__(&f) f;
    SG__HIP_API(X)
#undef X
} hip;

static pthread_once_t once = PTHREAD_ONCE_INIT;
static sg__cu_api table;
static bool loaded;
static char load_why[512];
static sg__cuda_device dev0;

/* ------------------------------------------------------------ shims */

static CUresult get_error_name(CUresult r, const char **s) {
    *s = hip.hipGetErrorName((hipError_t)r);
    return CUDA_SUCCESS;
}

static CUresult get_error_string(CUresult r, const char **s) {
    *s = hip.hipGetErrorString((hipError_t)r);
    return CUDA_SUCCESS;
}

static CUresult device_attribute(int *v, CUdevice_attribute a, CUdevice d) {
    hipDeviceAttribute_t h;
    switch (a) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
        h = hipDeviceAttributeComputeCapabilityMajor;
        break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
        h = hipDeviceAttributeComputeCapabilityMinor;
        break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: h = hipDeviceAttributeMultiprocessorCount; break;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: h = hipDeviceAttributeL2CacheSize; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: h = hipDeviceAttributeMaxThreadsPerBlock; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK:
        h = hipDeviceAttributeMaxSharedMemoryPerBlock;
        break;
    default: return CUDA_ERROR_INVALID_VALUE; /* not mapped: nothing reads it */
    }
    return (CUresult)hip.hipDeviceGetAttribute(v, h, d);
}

/* HIP's context calls are deprecated: the executor's context is device 0's
 * primary one, which hipSetDevice(0) makes current. */
static CUresult ctx_set_current(CUcontext c) {
    (void)c;
    return (CUresult)hip.hipSetDevice(0);
}

static CUresult func_set_attribute(CUfunction f, CUfunction_attribute a, int v) {
    (void)f;
    if (a == CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)
        return v >= 0 && v <= 65536 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    return CUDA_ERROR_NOT_SUPPORTED;
}

static CUresult launch_ex(const CUlaunchConfig *c, CUfunction f, void **params, void **extra) {
    (void)c, (void)f, (void)params, (void)extra;
    return CUDA_ERROR_NOT_SUPPORTED;
}

static CUresult graph_exec_update(CUgraphExec e, CUgraph g, CUgraphExecUpdateResultInfo *info) {
    hipGraphNode_t node = NULL;
    hipGraphExecUpdateResult res = hipGraphExecUpdateSuccess;
    hipError_t r = hip.hipGraphExecUpdate((hipGraphExec_t)e, (hipGraph_t)g, &node, &res);
    if (info) {
        memset(info, 0, sizeof *info);
        info->result = (CUgraphExecUpdateResult)res;
        info->errorNode = (CUgraphNode)node;
    }
    return (CUresult)r;
}

static CUresult graph_upload(CUgraphExec e, CUstream s) {
    (void)e, (void)s;
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------ loading */

/* hipInit's failures by name, without asking the runtime (nothing is
 * called after a failed hipInit). */
static const char *init_error(int r) {
    switch (r) {
    case 100: return "hipErrorNoDevice: no device";
    case 101: return "hipErrorInvalidDevice: no device";
    case 3: return "hipErrorNotInitialized";
    case 35: return "hipErrorInsufficientDriver";
    case 2: return "hipErrorOutOfMemory";
    default: return "unknown error";
    }
}

static void fill_table(void) {
#define SAME(field, f) table.field = (__typeof__(table.field))(uintptr_t)hip.f;
    SAME(cuInit, hipInit)
    SAME(cuDriverGetVersion, hipDriverGetVersion)
    table.cuGetErrorName = get_error_name;
    table.cuGetErrorString = get_error_string;
    SAME(cuDeviceGetCount, hipGetDeviceCount)
    SAME(cuDeviceGet, hipDeviceGet)
    SAME(cuDeviceGetName, hipDeviceGetName)
    table.cuDeviceGetAttribute = device_attribute;
    SAME(cuDeviceTotalMem_v2, hipDeviceTotalMem)
    SAME(cuDevicePrimaryCtxRetain, hipDevicePrimaryCtxRetain)
    SAME(cuDevicePrimaryCtxRelease_v2, hipDevicePrimaryCtxRelease)
    table.cuCtxSetCurrent = ctx_set_current;
    SAME(cuCtxSynchronize, hipDeviceSynchronize)
    SAME(cuStreamCreate, hipStreamCreateWithFlags)
    SAME(cuStreamDestroy_v2, hipStreamDestroy)
    SAME(cuStreamSynchronize, hipStreamSynchronize)
    SAME(cuStreamBeginCapture_v2, hipStreamBeginCapture)
    SAME(cuStreamEndCapture, hipStreamEndCapture)
    SAME(cuMemAlloc_v2, hipMalloc)
    SAME(cuMemFree_v2, hipFree)
    SAME(cuMemGetInfo_v2, hipMemGetInfo)
    SAME(cuMemcpyHtoDAsync_v2, hipMemcpyHtoDAsync)
    SAME(cuMemcpyDtoHAsync_v2, hipMemcpyDtoHAsync)
    SAME(cuMemcpyDtoDAsync_v2, hipMemcpyDtoDAsync)
    SAME(cuMemsetD8Async, hipMemsetD8Async)
    SAME(cuModuleLoadData, hipModuleLoadData)
    SAME(cuModuleGetFunction, hipModuleGetFunction)
    SAME(cuModuleUnload, hipModuleUnload)
    table.cuFuncSetAttribute = func_set_attribute;
    SAME(cuLaunchKernel, hipModuleLaunchKernel)
    table.cuLaunchKernelEx = launch_ex;
    SAME(cuEventCreate, hipEventCreateWithFlags)
    SAME(cuEventRecord, hipEventRecord)
    SAME(cuEventSynchronize, hipEventSynchronize)
    SAME(cuEventElapsedTime_v2, hipEventElapsedTime)
    SAME(cuEventDestroy_v2, hipEventDestroy)
    SAME(cuStreamWaitEvent, hipStreamWaitEvent)
    SAME(cuGraphInstantiateWithFlags, hipGraphInstantiateWithFlags)
    table.cuGraphExecUpdate_v2 = graph_exec_update;
    table.cuGraphUpload = graph_upload;
    SAME(cuGraphLaunch, hipGraphLaunch)
    SAME(cuGraphDestroy, hipGraphDestroy)
    SAME(cuGraphExecDestroy, hipGraphExecDestroy)
#undef SAME
}

/* Device 0's facts; false with load_why set on a failure. */
static bool read_device(void) {
    char e[160];
    hipDevice_t d;
    hipDeviceProp_t prop;
    memset(&prop, 0, sizeof prop);
    hipError_t r = hip.hipDeviceGet(&d, 0);
    if (r == hipSuccess) r = hip.hipDeviceGetName(dev0.name, (int)sizeof dev0.name, d);
    if (r == hipSuccess) r = hip.hipGetDeviceProperties(&prop, 0);
    if (r == hipSuccess) r = hip.hipDeviceTotalMem(&dev0.total_mem, d);
    if (r == hipSuccess) r = hip.hipDriverGetVersion(&dev0.driver_version);
    if (r != hipSuccess) {
        snprintf(load_why, sizeof load_why, "reading HIP device 0 failed: %s",
                 sg__cu_strerror_in(&table, (CUresult)r, e, sizeof e));
        return false;
    }
    prop.gcnArchName[sizeof prop.gcnArchName - 1] = '\0';
    size_t n = strcspn(prop.gcnArchName, ":");
    snprintf(dev0.arch_name, sizeof dev0.arch_name, "%.*s", (int)n, prop.gcnArchName);
    dev0.cc_major = prop.major, dev0.cc_minor = prop.minor;
    dev0.sms = prop.multiProcessorCount;
    if (!sg__hiprtc_arch_known(dev0.arch_name)) {
        snprintf(load_why, sizeof load_why,
                 "the AMD GPU '%s' is %s, an arch this stepgraph does not compile kernels for "
                 "(hiprtc is asked only for gfx803, gfx900, gfx906, gfx908, gfx90a, gfx90c and "
                 "gfx1010-gfx1036); use SG_BACKEND_CPU",
                 dev0.name, dev0.arch_name[0] ? dev0.arch_name : "(no arch name)");
        return false;
    }
    return true;
}

static void load_once(void) {
    const char *path = NULL;
    void *lib = sg__hip_library(load_why, sizeof load_why, &path);
    if (!lib) return;
#define X(f)                                                                                       \
    {                                                                                              \
        void *p = dlsym(lib, #f);                                                                  \
        if (!p) {                                                                                  \
            snprintf(load_why, sizeof load_why,                                                    \
                     "the HIP runtime in %s lacks %s; install ROCm 5.2 or newer", path, #f);       \
            return;                                                                                \
        }                                                                                          \
        memcpy(&hip.f, &p, sizeof p);                                                              \
    }
    SG__HIP_API(X)
#undef X
    fill_table();
    hipError_t r = hip.hipInit(0);
    if (r != hipSuccess) {
        snprintf(load_why, sizeof load_why,
                 "hipInit failed with %d (%s; %s): no usable AMD GPU; install the amdgpu kernel "
                 "driver, give this user /dev/kfd and /dev/dri (the render and video groups), or "
                 "use SG_BACKEND_CPU",
                 (int)r, init_error((int)r), path);
        return;
    }
    int count = 0;
    r = hip.hipGetDeviceCount(&count);
    if (r != hipSuccess || count < 1) {
        char e[160];
        snprintf(
            load_why, sizeof load_why, "the HIP runtime sees no device (%s); use SG_BACKEND_CPU",
            r != hipSuccess ? sg__cu_strerror_in(&table, (CUresult)r, e, sizeof e) : "count 0");
        return;
    }
    if (!read_device()) return;
    dev0.count = count;
    dev0.hip = true;
    loaded = true; /* the library stays loaded: the table points into it */
}

sg_status sg__hip_load(char *why, size_t n, const sg__cu_api **out) {
    pthread_once(&once, load_once);
    if (!loaded) {
        if (why && n) snprintf(why, n, "%s", load_why);
        *out = NULL;
        return SG_ERR_BACKEND_UNAVAILABLE;
    }
    *out = &table;
    return SG_OK;
}

sg_status sg__hip_probe(char *why, size_t n, sg__cuda_device *dev) {
    const sg__cu_api *api;
    sg_status s = sg__hip_load(why, n, &api);
    if (s == SG_OK && dev) *dev = dev0;
    return s;
}

#else /* no HIP (or no CUDA) headers at build time */

sg_status sg__hip_probe(char *why, size_t n, sg__cuda_device *dev) {
    (void)dev;
    if (why && n)
        snprintf(why, n,
                 "this stepgraph was built without the HIP headers (hip/hip_runtime_api.h) or the "
                 "CUDA headers its executor needs; install libamdhip64-dev and the CUDA toolkit's "
                 "headers and rebuild");
    return SG_ERR_BACKEND_UNAVAILABLE;
}

#ifdef SG_HAVE_CUDA_HEADERS /* the CUDA executor is built and asks for the HIP table */
sg_status sg__hip_load(char *why, size_t n, const sg__cu_api **out) {
    *out = NULL;
    return sg__hip_probe(why, n, NULL);
}
#endif

#endif

/*
 * hipBLASLt. Its API has cuBLASLt's shape (hipblasLtMatmul,
 * hipblasLtMatmulDescCreate, ...), but not its numbers: the descriptor and
 * layout attributes (HIPBLASLT_MATMUL_DESC_TRANSA is 0, CUBLASLT_'s 3), the
 * operations (HIPBLAS_OP_N is 111), the compute types, the heuristic's
 * result and the algorithm's configuration (cublaslt.c's split-K variants
 * have no counterpart) all differ, and cublasLtGetStatusName has none. A
 * name map cannot fill cublaslt.c's table from it, so the HIP executor does
 * not call it: compiled steps run their MATMUL groups as the generated GEMM
 * (codegen/cgen_gemm.c), eager matmuls the GEMV kernel. This says so, and
 * whether the library is installed at all.
 */
bool sg__hip_blaslt_note(char *buf, size_t n) {
    static const char *const names[] = {"libhipblaslt.so.1", "libhipblaslt.so.0",
                                        "libhipblaslt.so"};
    const char *found = NULL;
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !found; i++) {
        void *h = dlopen(names[i], RTLD_LAZY | RTLD_LOCAL);
        if (h) found = names[i], dlclose(h);
    }
    const char *tail = "compiled steps run their matmuls as the generated GEMM (64 x 64 tiles), "
                       "eager matmuls as the GEMV kernel";
    if (found)
        snprintf(buf, n, "hip: %s is installed but not called (its enums and algorithm "
                 "attributes are not cuBLASLt's); %s", found, tail);
    else
        snprintf(buf, n, "hip: no hipBLASLt (libhipblaslt.so not found); %s", tail);
    return found != NULL;
}
