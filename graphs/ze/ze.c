/* SPDX-License-Identifier: MIT */
/*
 * ze.c -- the Level Zero executor: the loader opened at run time and
 * initialized once per process, device USM for tensors, transfers and
 * eager launches on an immediate command list (synchronous mode), modules
 * from SPIR-V and their kernels, and recorded command lists replayed on a
 * queue with a fence (see ze.h). Ops reach the device through kernels the
 * OpenCL C generator writes (ze_eager.c, ze_graph.c); a build without that
 * generator fails every op with SG_ERR_UNSUPPORTED naming it.
 */
#include "ze.h"

#include <stdio.h>

#ifdef SG_HAVE_ZE_HEADERS

#include "../../codegen/codegen.h"
#include "../graphs.h"

#include <dlfcn.h>
#include <level_zero/ze_api.h>
#include <pthread.h>
#include <stdlib.h>

/* The loader's entry points this backend calls. */
#define SG__ZE_API(X)                                                                              \
    X(zeInit)                                                                                      \
    X(zeDriverGet)                                                                                 \
    X(zeDeviceGet)                                                                                 \
    X(zeDeviceGetProperties)                                                                       \
    X(zeDeviceGetMemoryProperties)                                                                 \
    X(zeContextCreate)                                                                             \
    X(zeContextDestroy)                                                                            \
    X(zeCommandQueueCreate)                                                                        \
    X(zeCommandQueueDestroy)                                                                       \
    X(zeCommandQueueExecuteCommandLists)                                                           \
    X(zeCommandListCreate)                                                                         \
    X(zeCommandListCreateImmediate)                                                                \
    X(zeCommandListClose)                                                                          \
    X(zeCommandListReset)                                                                          \
    X(zeCommandListDestroy)                                                                        \
    X(zeCommandListAppendMemoryCopy)                                                               \
    X(zeCommandListAppendLaunchKernel)                                                             \
    X(zeCommandListAppendBarrier)                                                                  \
    X(zeFenceCreate)                                                                               \
    X(zeFenceDestroy)                                                                              \
    X(zeFenceHostSynchronize)                                                                      \
    X(zeFenceReset)                                                                                \
    X(zeMemAllocDevice)                                                                            \
    X(zeMemFree)                                                                                   \
    X(zeModuleCreate)                                                                              \
    X(zeModuleDestroy)                                                                             \
    X(zeModuleBuildLogGetString)                                                                   \
    X(zeModuleBuildLogDestroy)                                                                     \
    X(zeKernelCreate)                                                                              \
    X(zeKernelDestroy)                                                                             \
    X(zeKernelSetGroupSize)                                                                        \
    X(zeKernelSetArgumentValue)

static struct {
#define X(f) __typeof__(&f) f;
    SG__ZE_API(X)
#undef X
} ze;

/* What the process-wide probe found: the first GPU of the drivers. */
static pthread_once_t once = PTHREAD_ONCE_INIT;
static bool loaded;
static char load_why[512];
static ze_driver_handle_t drv0;
static ze_device_handle_t dev0;
static char dev_name[ZE_MAX_DEVICE_NAME];
static size_t dev_mem;

static const char *result_name(ze_result_t r) {
    switch (r) {
    case ZE_RESULT_SUCCESS: return "ZE_RESULT_SUCCESS";
    case ZE_RESULT_NOT_READY: return "ZE_RESULT_NOT_READY";
    case ZE_RESULT_ERROR_DEVICE_LOST: return "ZE_RESULT_ERROR_DEVICE_LOST";
    case ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY: return "ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY";
    case ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY: return "ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY";
    case ZE_RESULT_ERROR_MODULE_BUILD_FAILURE: return "ZE_RESULT_ERROR_MODULE_BUILD_FAILURE";
    case ZE_RESULT_ERROR_UNINITIALIZED: return "ZE_RESULT_ERROR_UNINITIALIZED";
    case ZE_RESULT_ERROR_UNSUPPORTED_VERSION: return "ZE_RESULT_ERROR_UNSUPPORTED_VERSION";
    case ZE_RESULT_ERROR_UNSUPPORTED_FEATURE: return "ZE_RESULT_ERROR_UNSUPPORTED_FEATURE";
    case ZE_RESULT_ERROR_INVALID_ARGUMENT: return "ZE_RESULT_ERROR_INVALID_ARGUMENT";
    case ZE_RESULT_ERROR_INVALID_NULL_HANDLE: return "ZE_RESULT_ERROR_INVALID_NULL_HANDLE";
    case ZE_RESULT_ERROR_INVALID_NULL_POINTER: return "ZE_RESULT_ERROR_INVALID_NULL_POINTER";
    case ZE_RESULT_ERROR_INVALID_SIZE: return "ZE_RESULT_ERROR_INVALID_SIZE";
    case ZE_RESULT_ERROR_INVALID_KERNEL_NAME: return "ZE_RESULT_ERROR_INVALID_KERNEL_NAME";
    case ZE_RESULT_ERROR_INVALID_KERNEL_ARGUMENT_INDEX:
        return "ZE_RESULT_ERROR_INVALID_KERNEL_ARGUMENT_INDEX";
    case ZE_RESULT_ERROR_INVALID_KERNEL_ARGUMENT_SIZE:
        return "ZE_RESULT_ERROR_INVALID_KERNEL_ARGUMENT_SIZE";
    case ZE_RESULT_ERROR_INVALID_GROUP_SIZE_DIMENSION:
        return "ZE_RESULT_ERROR_INVALID_GROUP_SIZE_DIMENSION";
    case ZE_RESULT_ERROR_INVALID_NATIVE_BINARY: return "ZE_RESULT_ERROR_INVALID_NATIVE_BINARY";
    case ZE_RESULT_ERROR_UNKNOWN: return "ZE_RESULT_ERROR_UNKNOWN";
    default: return "a Level Zero error";
    }
}

static sg_status ze_fail(sg_ctx *ctx, ze_result_t r, const char *call, const char *doing) {
    if (r == ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY || r == ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY)
        return sg__fail(ctx, SG_ERR_OOM,
                        "ze: %s failed while %s: %s (0x%x); free device memory (release tensors, "
                        "destroy unused fns) or use smaller shapes",
                        call, doing, result_name(r), (unsigned)r);
    return sg__fail(ctx, SG_ERR_DRIVER, "ze: %s failed while %s: %s (0x%x)", call, doing,
                    result_name(r), (unsigned)r);
}

/* The first GPU device of the drivers, into drv0/dev0 (after zeInit). */
static bool find_gpu(void) {
    uint32_t nd = 0;
    ze_result_t r = ze.zeDriverGet(&nd, NULL);
    ze_driver_handle_t drivers[8];
    if (r == ZE_RESULT_SUCCESS && nd > 8) nd = 8;
    if (r == ZE_RESULT_SUCCESS && nd) r = ze.zeDriverGet(&nd, drivers);
    if (r != ZE_RESULT_SUCCESS || nd == 0) {
        snprintf(load_why, sizeof load_why, "zeDriverGet found no driver (%s, 0x%x)",
                 result_name(r), (unsigned)r);
        return false;
    }
    for (uint32_t i = 0; i < nd; i++) {
        uint32_t n = 0;
        ze_device_handle_t devs[16];
        if (ze.zeDeviceGet(drivers[i], &n, NULL) != ZE_RESULT_SUCCESS || n == 0) continue;
        if (n > 16) n = 16;
        if (ze.zeDeviceGet(drivers[i], &n, devs) != ZE_RESULT_SUCCESS) continue;
        for (uint32_t k = 0; k < n; k++) {
            ze_device_properties_t p = {.stype = ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES};
            if (ze.zeDeviceGetProperties(devs[k], &p) != ZE_RESULT_SUCCESS ||
                p.type != ZE_DEVICE_TYPE_GPU)
                continue;
            drv0 = drivers[i];
            dev0 = devs[k];
            snprintf(dev_name, sizeof dev_name, "%s", p.name);
            uint32_t nm = 0;
            ze_device_memory_properties_t mp[4];
            if (ze.zeDeviceGetMemoryProperties(dev0, &nm, NULL) == ZE_RESULT_SUCCESS) {
                if (nm > 4) nm = 4;
                for (uint32_t m = 0; m < nm; m++)
                    mp[m] = (ze_device_memory_properties_t){
                        .stype = ZE_STRUCTURE_TYPE_DEVICE_MEMORY_PROPERTIES};
                if (ze.zeDeviceGetMemoryProperties(dev0, &nm, mp) == ZE_RESULT_SUCCESS)
                    for (uint32_t m = 0; m < nm; m++) dev_mem += (size_t)mp[m].totalSize;
            }
            return true;
        }
    }
    snprintf(load_why, sizeof load_why,
             "the Level Zero drivers (%u) have no GPU device; use SG_BACKEND_CPU", nd);
    return false;
}

static void load_once(void) {
    /* With a sanitizer, the installed GPU drivers must stay unopened (see
     * SG__SANITIZED); a driver named by ZE_ENABLE_ALT_DRIVERS is the only
     * one the loader then opens. */
    const char *alt = getenv("ZE_ENABLE_ALT_DRIVERS");
    if (SG__SANITIZED && !(alt && *alt)) {
        snprintf(load_why, sizeof load_why,
                 "this stepgraph is built with a sanitizer, which aborts the process when a "
                 "Level Zero GPU driver opens its libraries (RTLD_DEEPBIND); the ze backend "
                 "opens the loader there only with ZE_ENABLE_ALT_DRIVERS set; use a build "
                 "without sanitizers");
        return;
    }
    const char *path = getenv("SG_ZE_LOADER");
    if (!path || !*path) path = "libze_loader.so.1";
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *e = dlerror();
        snprintf(load_why, sizeof load_why,
                 "no Level Zero loader: cannot load %s (%s); install libze1 and a GPU driver "
                 "(intel-level-zero-gpu), or use SG_BACKEND_CPU",
                 path, e ? e : "dlopen failed");
        return;
    }
#define X(f)                                                                                       \
    ze.f = (__typeof__(ze.f))(uintptr_t)dlsym(lib, #f);                                            \
    if (!ze.f) {                                                                                   \
        snprintf(load_why, sizeof load_why,                                                        \
                 "the Level Zero loader %s lacks %s; install libze1 1.8 or newer", path, #f);      \
        return;                                                                                    \
    }
    SG__ZE_API(X)
#undef X
    ze_result_t r = ze.zeInit(ZE_INIT_FLAG_GPU_ONLY);
    if (r != ZE_RESULT_SUCCESS) {
        /* Nothing of the loader is called after this: with some drivers
         * installed, a call after a failed zeInit crashes the process. */
        snprintf(load_why, sizeof load_why,
                 "zeInit(ZE_INIT_FLAG_GPU_ONLY) returned %s (0x%x): no Level Zero driver found a "
                 "GPU; install the GPU driver (intel-level-zero-gpu) on a machine with an Intel "
                 "GPU, or use SG_BACKEND_CPU",
                 result_name(r), (unsigned)r);
        return;
    }
    loaded = find_gpu(); /* the library stays loaded: the table points into it */
}

sg_status sg__ze_probe(char *why, size_t n) {
    pthread_once(&once, load_once);
    if (!loaded) {
        if (why && n) snprintf(why, n, "%s", load_why);
        return SG_ERR_BACKEND_UNAVAILABLE;
    }
    return SG_OK;
}

/* ------------------------------------------------------------ state */

struct sg__ze_kfn {
    struct sg__ze_kfn *next;
    char key[65];  /* the module's: hash of its name and source (or SPIR-V) */
    char name[96]; /* the kernel's */
    ze_module_handle_t module;
    bool owns_module;
    ze_kernel_handle_t k;
};

typedef struct launch {
    sg__ze_kfn *k;
    uint32_t groups[3], gsize[3];
    int nargs;
    size_t size[SG__ZE_MAX_ARGS];
    unsigned char value[SG__ZE_MAX_ARGS][SG__ZE_MAX_ARG_BYTES];
} launch;

struct sg__ze_rec {
    ze_command_list_handle_t list;
    launch *l;
    int n, cap;
    bool closed, dirty;
    int recordings;
};

typedef struct sg__ze {
    ze_context_handle_t zctx;
    ze_command_list_handle_t imm; /* synchronous immediate list */
    ze_command_queue_handle_t queue;
    ze_fence_handle_t fence;
    sg__ze_kfn *kernels;
    void *eager; /* ze_eager.c's units */
} sg__ze;

static sg__ze *state(const sg_ctx *ctx) { return ctx->exec.state; }

const char *sg__ze_device_name(const sg_ctx *ctx) { return (void)ctx, dev_name; }
size_t sg__ze_device_memory(const sg_ctx *ctx) { return (void)ctx, dev_mem; }

/* ------------------------------------------------------------ memory */

static sg_status ze_alloc(sg_ctx *ctx, size_t nbytes, void **data) {
    ze_device_mem_alloc_desc_t d = {.stype = ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC};
    ze_result_t r = ze.zeMemAllocDevice(state(ctx)->zctx, &d, nbytes ? nbytes : 1, 256, dev0, data);
    if (r == ZE_RESULT_SUCCESS) return SG_OK;
    return r == ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY || r == ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY
               ? SG_ERR_OOM
               : SG_ERR_DRIVER;
}

static void ze_free(sg_ctx *ctx, void *data, size_t nbytes) {
    (void)nbytes;
    if (data) ze.zeMemFree(state(ctx)->zctx, data);
}

static sg_status ze_copy_any(sg_ctx *ctx, void *dst, const void *src, size_t n, const char *what) {
    if (!n) return SG_OK;
    ze_result_t r = ze.zeCommandListAppendMemoryCopy(state(ctx)->imm, dst, src, n, NULL, 0, NULL);
    return r == ZE_RESULT_SUCCESS ? SG_OK : ze_fail(ctx, r, "zeCommandListAppendMemoryCopy", what);
}

static sg_status ze_upload(sg_ctx *ctx, void *dst, const void *src, size_t n) {
    return ze_copy_any(ctx, dst, src, n, "copying to the device");
}
static sg_status ze_download(sg_ctx *ctx, void *dst, const void *src, size_t n) {
    return ze_copy_any(ctx, dst, src, n, "copying to the host");
}
static sg_status ze_copy(sg_ctx *ctx, void *dst, const void *src, size_t n) {
    return ze_copy_any(ctx, dst, src, n, "copying on the device");
}

/* ------------------------------------------------------------ modules and kernels */

/* The build log's head, for a module that failed to build. */
static void build_log(sg_ctx *ctx, ze_module_build_log_handle_t log, char *buf, size_t size) {
    buf[0] = '\0';
    if (!log) return;
    size_t n = 0;
    if (ze.zeModuleBuildLogGetString(log, &n, NULL) == ZE_RESULT_SUCCESS && n > 1) {
        char *all = sg__alloc(ctx, n);
        if (all && ze.zeModuleBuildLogGetString(log, &n, all) == ZE_RESULT_SUCCESS)
            snprintf(buf, size, "%s", all);
        if (all) sg__free(ctx, all, n);
    }
    ze.zeModuleBuildLogDestroy(log);
}

static sg_status make_module(sg_ctx *ctx, const char *name, const void *spirv, size_t size,
                             ze_module_handle_t *out) {
    ze_module_desc_t d = {.stype = ZE_STRUCTURE_TYPE_MODULE_DESC,
                          .format = ZE_MODULE_FORMAT_IL_SPIRV,
                          .inputSize = size,
                          .pInputModule = spirv};
    ze_module_build_log_handle_t log = NULL;
    ze_result_t r = ze.zeModuleCreate(state(ctx)->zctx, dev0, &d, out, &log);
    if (r != ZE_RESULT_SUCCESS) {
        char head[500];
        build_log(ctx, log, head, sizeof head);
        *out = NULL;
        if (r == ZE_RESULT_ERROR_MODULE_BUILD_FAILURE || r == ZE_RESULT_ERROR_INVALID_NATIVE_BINARY)
            return sg__fail(
                ctx, SG_ERR_COMPILE,
                "ze: zeModuleCreate rejected the SPIR-V of '%s' (%zu bytes): %s (0x%x): "
                "%s",
                name, size, result_name(r), (unsigned)r, head[0] ? head : "no log");
        return ze_fail(ctx, r, "zeModuleCreate", name);
    }
    if (log) ze.zeModuleBuildLogDestroy(log);
    return SG_OK;
}

/* The kernel of a module keyed by key (made from spirv when new). */
static sg_status kernel_of(sg_ctx *ctx, const char *key, const char *name, const void *spirv,
                           size_t size, const char *kernel, sg__ze_kfn **out) {
    sg__ze *s = state(ctx);
    ze_module_handle_t module = NULL;
    for (sg__ze_kfn *k = s->kernels; k; k = k->next) {
        if (strcmp(k->key, key) != 0) continue;
        if (strcmp(k->name, kernel) == 0) return *out = k, SG_OK;
        module = k->module;
    }
    if (strlen(kernel) >= sizeof((sg__ze_kfn *)0)->name)
        return sg__fail(ctx, SG_ERR_INVALID_ARG, "ze: kernel name '%s' is too long", kernel);
    sg__ze_kfn *k = sg__calloc(ctx, sizeof *k);
    if (!k) return sg__fail(ctx, SG_ERR_OOM, "ze: out of host memory for kernel '%s'", kernel);
    sg_status st = SG_OK;
    if (!module && spirv) {
        st = make_module(ctx, name, spirv, size, &module);
        k->owns_module = st == SG_OK;
    }
    ze_kernel_desc_t d = {.stype = ZE_STRUCTURE_TYPE_KERNEL_DESC, .pKernelName = kernel};
    ze_result_t r = st == SG_OK ? ze.zeKernelCreate(module, &d, &k->k) : ZE_RESULT_SUCCESS;
    if (st == SG_OK && r != ZE_RESULT_SUCCESS) st = ze_fail(ctx, r, "zeKernelCreate", kernel);
    if (st != SG_OK) {
        if (k->owns_module) ze.zeModuleDestroy(module);
        sg__free(ctx, k, sizeof *k);
        return st;
    }
    snprintf(k->key, sizeof k->key, "%s", key);
    snprintf(k->name, sizeof k->name, "%s", kernel);
    k->module = module;
    k->next = s->kernels;
    s->kernels = k;
    *out = k;
    return SG_OK;
}

sg_status sg__ze_kernel_spirv(sg_ctx *ctx, const char *name, const void *spirv, size_t size,
                              const char *kernel, sg__ze_kfn **out) {
    char key[65], hex[65];
    uint8_t digest[32];
    sg__sha256(spirv, size, digest);
    sg__sha256_hex(digest, hex);
    const char *fields[] = {"spirv", name, hex};
    sg__blob_key(fields, 3, key);
    return kernel_of(ctx, key, name, spirv, size, kernel, out);
}

sg_status sg__ze_kernel(sg_ctx *ctx, const char *name, const char *source, const char *kernel,
                        sg__ze_kfn **out) {
    char key[65];
    const char *fields[] = {"opencl", name, source ? source : ""};
    sg__blob_key(fields, 3, key);
    for (sg__ze_kfn *k = state(ctx)->kernels; k; k = k->next)
        if (strcmp(k->key, key) == 0) return kernel_of(ctx, key, name, NULL, 0, kernel, out);
    void *spirv = NULL;
    size_t size = 0;
    sg_status st = sg__ocloc_build(ctx, name, source, &spirv, &size);
    if (st != SG_OK) return st;
    st = kernel_of(ctx, key, name, spirv, size, kernel, out);
    sg__free(ctx, spirv, size);
    return st;
}

/* Group size and arguments of k, then the launch appended to list. */
static sg_status append_launch(sg_ctx *ctx, ze_command_list_handle_t list, sg__ze_kfn *k,
                               const uint32_t groups[3], const uint32_t gsize[3], int nargs,
                               const size_t *sizes, const void *const *values) {
    ze_result_t r = ze.zeKernelSetGroupSize(k->k, gsize[0], gsize[1], gsize[2]);
    if (r != ZE_RESULT_SUCCESS) return ze_fail(ctx, r, "zeKernelSetGroupSize", k->name);
    for (int i = 0; i < nargs; i++) {
        r = ze.zeKernelSetArgumentValue(k->k, (uint32_t)i, sizes[i], values[i]);
        if (r != ZE_RESULT_SUCCESS) return ze_fail(ctx, r, "zeKernelSetArgumentValue", k->name);
    }
    ze_group_count_t g = {groups[0], groups[1], groups[2]};
    r = ze.zeCommandListAppendLaunchKernel(list, k->k, &g, NULL, 0, NULL);
    return r == ZE_RESULT_SUCCESS ? SG_OK
                                  : ze_fail(ctx, r, "zeCommandListAppendLaunchKernel", k->name);
}

static sg_status check_args(sg_ctx *ctx, const sg__ze_kfn *k, int nargs, const sg__ze_arg *args) {
    if (nargs < 0 || nargs > SG__ZE_MAX_ARGS)
        return sg__fail(ctx, SG_ERR_INVALID_ARG,
                        "ze: kernel '%s' launched with %d arguments (at "
                        "most %d)",
                        k->name, nargs, SG__ZE_MAX_ARGS);
    for (int i = 0; i < nargs; i++)
        if (args[i].size > SG__ZE_MAX_ARG_BYTES || !args[i].value)
            return sg__fail(ctx, SG_ERR_INVALID_ARG,
                            "ze: argument %d of kernel '%s' has %zu bytes (at most %d, not NULL)",
                            i, k->name, args[i].size, SG__ZE_MAX_ARG_BYTES);
    return SG_OK;
}

sg_status sg__ze_launch(sg_ctx *ctx, sg__ze_kfn *k, const uint32_t groups[3],
                        const uint32_t group_size[3], int nargs, const sg__ze_arg *args) {
    sg_status st = check_args(ctx, k, nargs, args);
    if (st != SG_OK) return st;
    if (!groups[0] || !groups[1] || !groups[2]) return SG_OK; /* nothing to do */
    size_t sizes[SG__ZE_MAX_ARGS];
    const void *values[SG__ZE_MAX_ARGS];
    for (int i = 0; i < nargs; i++) sizes[i] = args[i].size, values[i] = args[i].value;
    return append_launch(ctx, state(ctx)->imm, k, groups, group_size, nargs, sizes, values);
}

/* ------------------------------------------------------------ recorded command lists */

sg_status sg__ze_rec_create(sg_ctx *ctx, sg__ze_rec **out) {
    *out = NULL;
    sg__ze_rec *r = sg__calloc(ctx, sizeof *r);
    if (!r) return sg__fail(ctx, SG_ERR_OOM, "ze: out of host memory for a command list");
    ze_command_list_desc_t d = {.stype = ZE_STRUCTURE_TYPE_COMMAND_LIST_DESC};
    ze_result_t zr = ze.zeCommandListCreate(state(ctx)->zctx, dev0, &d, &r->list);
    if (zr != ZE_RESULT_SUCCESS) {
        sg__free(ctx, r, sizeof *r);
        return ze_fail(ctx, zr, "zeCommandListCreate", "making a command list to record");
    }
    r->recordings = 1;
    *out = r;
    return SG_OK;
}

static sg_status append_rec(sg_ctx *ctx, sg__ze_rec *r, const launch *l) {
    const void *values[SG__ZE_MAX_ARGS];
    for (int i = 0; i < l->nargs; i++) values[i] = l->value[i];
    return append_launch(ctx, r->list, l->k, l->groups, l->gsize, l->nargs, l->size, values);
}

sg_status sg__ze_rec_launch(sg_ctx *ctx, sg__ze_rec *r, sg__ze_kfn *k, const uint32_t groups[3],
                            const uint32_t group_size[3], int nargs, const sg__ze_arg *args,
                            int *index) {
    sg_status st = check_args(ctx, k, nargs, args);
    if (st != SG_OK) return st;
    if (r->closed)
        return sg__fail(ctx, SG_ERR_INVALID_ARG,
                        "ze: kernel '%s' appended to a command list already replayed", k->name);
    if (r->n == r->cap) {
        int ncap = r->cap ? r->cap * 2 : 16;
        launch *nl = sg__alloc(ctx, sizeof *nl * (size_t)ncap);
        if (!nl) return sg__fail(ctx, SG_ERR_OOM, "ze: out of host memory recording '%s'", k->name);
        if (r->l) {
            memcpy(nl, r->l, sizeof *nl * (size_t)r->n);
            sg__free(ctx, r->l, sizeof *nl * (size_t)r->cap);
        }
        r->l = nl;
        r->cap = ncap;
    }
    launch *l = &r->l[r->n];
    memset(l, 0, sizeof *l);
    l->k = k;
    memcpy(l->groups, groups, sizeof l->groups);
    memcpy(l->gsize, group_size, sizeof l->gsize);
    l->nargs = nargs;
    for (int i = 0; i < nargs; i++) {
        l->size[i] = args[i].size;
        memcpy(l->value[i], args[i].value, args[i].size);
    }
    st = append_rec(ctx, r, l);
    if (st != SG_OK) return st;
    if (index) *index = r->n;
    r->n++;
    return SG_OK;
}

sg_status sg__ze_rec_set_arg(sg_ctx *ctx, sg__ze_rec *r, int index, int arg,
                             const sg__ze_arg *value) {
    if (index < 0 || index >= r->n || arg < 0 || arg >= r->l[index].nargs ||
        value->size != r->l[index].size[arg])
        return sg__fail(ctx, SG_ERR_INVALID_ARG,
                        "ze: no argument %d (%zu bytes) of launch %d in a list of %d launches", arg,
                        value->size, index, r->n);
    if (memcmp(r->l[index].value[arg], value->value, value->size) != 0) {
        memcpy(r->l[index].value[arg], value->value, value->size);
        r->dirty = true; /* recorded values are fixed: record the list again */
    }
    return SG_OK;
}

/* Record the list again from the kept launches (their current values). */
static sg_status rerecord(sg_ctx *ctx, sg__ze_rec *r) {
    ze_result_t zr = ze.zeCommandListReset(r->list);
    if (zr != ZE_RESULT_SUCCESS) return ze_fail(ctx, zr, "zeCommandListReset", "re-recording");
    for (int i = 0; i < r->n; i++) {
        sg_status st = append_rec(ctx, r, &r->l[i]);
        if (st != SG_OK) return st;
    }
    r->recordings++;
    r->dirty = false;
    r->closed = false;
    return SG_OK;
}

sg_status sg__ze_rec_replay(sg_ctx *ctx, sg__ze_rec *r) {
    sg__ze *s = state(ctx);
    sg_status st = r->dirty ? rerecord(ctx, r) : SG_OK;
    if (st != SG_OK) return st;
    ze_result_t zr = ZE_RESULT_SUCCESS;
    if (!r->closed) {
        zr = ze.zeCommandListClose(r->list);
        if (zr != ZE_RESULT_SUCCESS) return ze_fail(ctx, zr, "zeCommandListClose", "replaying");
        r->closed = true;
    }
    zr = ze.zeCommandQueueExecuteCommandLists(s->queue, 1, &r->list, s->fence);
    if (zr != ZE_RESULT_SUCCESS)
        return ze_fail(ctx, zr, "zeCommandQueueExecuteCommandLists", "replaying");
    zr = ze.zeFenceHostSynchronize(s->fence, UINT64_MAX);
    if (zr == ZE_RESULT_SUCCESS) zr = ze.zeFenceReset(s->fence);
    return zr == ZE_RESULT_SUCCESS ? SG_OK
                                   : ze_fail(ctx, zr, "zeFenceHostSynchronize", "replaying");
}

int sg__ze_rec_recordings(const sg__ze_rec *r) { return r->recordings; }

void sg__ze_rec_free(sg_ctx *ctx, sg__ze_rec *r) {
    if (!r) return;
    if (r->list) ze.zeCommandListDestroy(r->list);
    if (r->l) sg__free(ctx, r->l, sizeof *r->l * (size_t)r->cap);
    sg__free(ctx, r, sizeof *r);
}

/* ------------------------------------------------------------ the executor */

static sg_status ze_run(sg_ctx *ctx, const sg__node *n) {
    return sg__ze_eager_run(ctx, &state(ctx)->eager, n);
}

static void ze_destroy(sg_ctx *ctx) {
    sg__ze *s = state(ctx);
    if (!s) return;
    sg__ze_eager_release(ctx, s->eager); /* device memory: before the context goes */
    s->eager = NULL;
    while (s->kernels) {
        sg__ze_kfn *k = s->kernels;
        s->kernels = k->next;
        if (k->k) ze.zeKernelDestroy(k->k);
        if (k->owns_module) ze.zeModuleDestroy(k->module);
        sg__free(ctx, k, sizeof *k);
    }
    if (s->fence) ze.zeFenceDestroy(s->fence);
    if (s->queue) ze.zeCommandQueueDestroy(s->queue);
    if (s->imm) ze.zeCommandListDestroy(s->imm);
    if (s->zctx) ze.zeContextDestroy(s->zctx);
    sg__free(ctx, s, sizeof *s);
    ctx->exec.state = NULL;
}

sg_status sg__ze_init(sg_ctx *ctx, char *why, size_t n) {
    sg_status st = sg__ze_probe(why, n);
    if (st != SG_OK) return st;
    sg__ze *s = sg__calloc(ctx, sizeof *s);
    if (!s) {
        snprintf(why, n, "out of host memory for the Level Zero state");
        return SG_ERR_OOM;
    }
    ctx->exec.state = s;
    ctx->exec.destroy = ze_destroy;
    ze_context_desc_t cd = {.stype = ZE_STRUCTURE_TYPE_CONTEXT_DESC};
    ze_command_queue_desc_t sync = {.stype = ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC,
                                    .mode = ZE_COMMAND_QUEUE_MODE_SYNCHRONOUS};
    ze_command_queue_desc_t async = {.stype = ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC,
                                     .mode = ZE_COMMAND_QUEUE_MODE_ASYNCHRONOUS};
    ze_fence_desc_t fd = {.stype = ZE_STRUCTURE_TYPE_FENCE_DESC};
    const char *call = "zeContextCreate";
    ze_result_t r = ze.zeContextCreate(drv0, &cd, &s->zctx);
    if (r == ZE_RESULT_SUCCESS) {
        call = "zeCommandListCreateImmediate";
        r = ze.zeCommandListCreateImmediate(s->zctx, dev0, &sync, &s->imm);
    }
    if (r == ZE_RESULT_SUCCESS) {
        call = "zeCommandQueueCreate";
        r = ze.zeCommandQueueCreate(s->zctx, dev0, &async, &s->queue);
    }
    if (r == ZE_RESULT_SUCCESS) {
        call = "zeFenceCreate";
        r = ze.zeFenceCreate(s->queue, &fd, &s->fence);
    }
    if (r != ZE_RESULT_SUCCESS) {
        snprintf(why, n, "Level Zero setup on '%s' failed: %s returned %s (0x%x)", dev_name, call,
                 result_name(r), (unsigned)r);
        ze_destroy(ctx);
        return SG_ERR_BACKEND_UNAVAILABLE;
    }
    ctx->exec.name = "device";
    ctx->exec.run = ze_run;
    ctx->exec.alloc = ze_alloc;
    ctx->exec.free = ze_free;
    ctx->exec.upload = ze_upload;
    ctx->exec.download = ze_download;
    ctx->exec.copy = ze_copy;
    ctx->exec.sync = NULL; /* the immediate list is synchronous */
    ctx->gops = &sg__ze_graph_ops;
    return SG_OK;
}

#else /* no Level Zero headers at build time */

static const char no_headers[] =
    "this stepgraph was built without the Level Zero headers (STEPGRAPH_ZE=OFF or no "
    "level_zero/ze_api.h at build time); install libze-dev and rebuild";

sg_status sg__ze_probe(char *why, size_t n) {
    if (why && n) snprintf(why, n, "%s", no_headers);
    return SG_ERR_BACKEND_UNAVAILABLE;
}

sg_status sg__ze_init(sg_ctx *ctx, char *why, size_t n) {
    (void)ctx;
    return sg__ze_probe(why, n);
}

#endif
