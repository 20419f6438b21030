/* SPDX-License-Identifier: MIT */
/*
 * driver.c -- load the CUDA driver at run time: dlopen("libcuda.so.1"),
 * cuGetProcAddress from it, and every entry point of SG__CU_API through
 * that, once per process. The outcome (the table, or why there is none) is
 * kept, so later probes cost a lock and a copy.
 */
#include "cuda.h"

#include <stdio.h>

#ifdef SG_HAVE_CUDA_HEADERS

#include <dlfcn.h>
#include <pthread.h>

static pthread_once_t once = PTHREAD_ONCE_INIT;
static sg__cu_api table;
static bool loaded;
static char load_why[512];
static sg__cuda_device dev0;

typedef CUresult (*get_proc_fn)(const char *, void **, int, cuuint64_t,
                                CUdriverProcAddressQueryResult *);

static void load_once(void) {
    /* Tests may point the loader at a library that is not there, to check
     * the unavailable path on a machine that has a driver. */
    const char *path = getenv("SG_CUDA_DRIVER");
    if (!path || !*path) path = "libcuda.so.1";
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *e = dlerror();
        snprintf(load_why, sizeof load_why,
                 "no CUDA driver: cannot load %s (%s); install the "
                 "NVIDIA driver or use SG_BACKEND_CPU",
                 path, e ? e : "dlopen failed");
        return;
    }
    get_proc_fn get = (get_proc_fn)(uintptr_t)dlsym(lib, "cuGetProcAddress_v2");
    if (!get) {
        snprintf(load_why, sizeof load_why,
                 "the CUDA driver in %s is too old (no "
                 "cuGetProcAddress_v2; CUDA 12 or newer is needed); update the NVIDIA driver",
                 path);
        return;
    }
#define X(field, name)                                                                             \
    {                                                                                              \
        void *p = NULL;                                                                            \
        CUdriverProcAddressQueryResult q = CU_GET_PROC_ADDRESS_SUCCESS;                            \
        CUresult r = get(name, &p, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &q);                 \
        if (r != CUDA_SUCCESS || !p || q != CU_GET_PROC_ADDRESS_SUCCESS) {                         \
            snprintf(load_why, sizeof load_why,                                                    \
                     "the CUDA driver in %s lacks %s (version %d "                                 \
                     "asked); update the NVIDIA driver",                                           \
                     path, name, CUDA_VERSION);                                                    \
            return;                                                                                \
        }                                                                                          \
        table.field = (__typeof__(table.field))(uintptr_t)p;                                       \
    }
    SG__CU_API(X)
#undef X
    CUresult r = table.cuInit(0);
    char e[160];
    if (r != CUDA_SUCCESS) {
        snprintf(load_why, sizeof load_why,
                 "cuInit failed: %s (no usable GPU, or the driver and "
                 "the kernel module disagree)",
                 sg__cu_strerror(r, e, sizeof e));
        return;
    }
    int count = 0;
    r = table.cuDeviceGetCount(&count);
    if (r != CUDA_SUCCESS || count < 1) {
        snprintf(load_why, sizeof load_why, "the CUDA driver sees no device (%s)",
                 r != CUDA_SUCCESS ? sg__cu_strerror(r, e, sizeof e) : "count 0");
        return;
    }
    CUdevice d;
    r = table.cuDeviceGet(&d, 0);
    if (r == CUDA_SUCCESS) r = table.cuDeviceGetName(dev0.name, (int)sizeof dev0.name, d);
    if (r == CUDA_SUCCESS)
        r = table.cuDeviceGetAttribute(&dev0.cc_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                                       d);
    if (r == CUDA_SUCCESS)
        r = table.cuDeviceGetAttribute(&dev0.cc_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                                       d);
    if (r == CUDA_SUCCESS)
        r = table.cuDeviceGetAttribute(&dev0.sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, d);
    if (r == CUDA_SUCCESS) r = table.cuDeviceTotalMem_v2(&dev0.total_mem, d);
    if (r == CUDA_SUCCESS) r = table.cuDriverGetVersion(&dev0.driver_version);
    if (r != CUDA_SUCCESS) {
        snprintf(load_why, sizeof load_why, "reading CUDA device 0 failed: %s",
                 sg__cu_strerror(r, e, sizeof e));
        return;
    }
    dev0.count = count;
    /* The library stays loaded for the life of the process: the table
     * points into it. */
    loaded = true;
}

sg_status sg__cuda_load(char *why, size_t n, const sg__cu_api **out) {
    pthread_once(&once, load_once);
    if (!loaded) {
        if (why && n) snprintf(why, n, "%s", load_why);
        *out = NULL;
        return SG_ERR_BACKEND_UNAVAILABLE;
    }
    *out = &table;
    return SG_OK;
}

sg_status sg__cuda_probe(char *why, size_t n, sg__cuda_device *dev) {
    const sg__cu_api *cu;
    sg_status s = sg__cuda_load(why, n, &cu);
    if (s == SG_OK && dev) *dev = dev0;
    return s;
}

const char *sg__cu_strerror_in(const sg__cu_api *api, CUresult r, char *buf, size_t size) {
    const char *name = NULL, *str = NULL;
    /* Usable before the table is complete only for entries already set. */
    if (api->cuGetErrorName) api->cuGetErrorName(r, &name);
    if (api->cuGetErrorString) api->cuGetErrorString(r, &str);
    if (name)
        snprintf(buf, size, "%s (%s)", name, str ? str : "no description");
    else
        snprintf(buf, size, "error %d", (int)r);
    return buf;
}

const char *sg__cu_strerror(CUresult r, char *buf, size_t size) {
    return sg__cu_strerror_in(&table, r, buf, size);
}

sg_status sg__cu_fail(sg_ctx *ctx, CUresult r, const char *call, const char *doing) {
    char e[200];
    const sg__cu_api *api = &table;
    if (ctx->backend == SG_BACKEND_HIP && sg__hip_load(NULL, 0, &api) != SG_OK) api = &table;
    sg__cu_strerror_in(api, r, e, sizeof e);
    const char *b = sg_backend_name(ctx->backend);
    if (r == CUDA_ERROR_OUT_OF_MEMORY)
        return sg__fail(ctx, SG_ERR_OOM,
                        "%s: %s failed while %s: %s; free device memory "
                        "(release tensors, destroy unused fns) or use smaller shapes",
                        b, call, doing, e);
    return sg__fail(ctx, SG_ERR_DRIVER, "%s: %s failed while %s: %s", b, call, doing, e);
}

#else /* no CUDA headers at build time */

sg_status sg__cuda_probe(char *why, size_t n, sg__cuda_device *dev) {
    (void)dev;
    if (why && n)
        snprintf(why, n,
                 "this stepgraph was built without the CUDA headers (STEPGRAPH_CUDA=OFF "
                 "or no toolkit at build time); rebuild with the CUDA toolkit installed");
    return SG_ERR_BACKEND_UNAVAILABLE;
}

#endif
