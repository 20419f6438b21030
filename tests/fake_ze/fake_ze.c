/* SPDX-License-Identifier: MIT */
/*
 * fake_ze.c -- a Level Zero driver with one fake GPU, for tests: it fills
 * the DDI tables the loader asks for (ze_ddi.h), keeps device memory in
 * host memory, really does copies, checks that a module is SPIR-V (magic
 * and length), records command lists and replays them on a queue, and runs
 * a launch by calling the C function a test registered for the kernel's
 * name. Every call is logged by name (fake_ze.h). Not thread-safe: one
 * test thread drives it.
 *
 * With FAKE_ZE_OPENCL naming an OpenCL CPU runtime's library, the same
 * calls forward to it (fake_ze_ocl.c): device memory is its USM, a module
 * is its program built from the SPIR-V (the build log is the module's),
 * launches run the real kernels in order (registered C kernels are not
 * called), an immediate list waits for each command, and a queue's
 * execution waits before it signals the fence. zeInit fails when the
 * runtime cannot be loaded.
 */
#include "fake_ze.h"
#include "fake_ze_ocl.h"

#include <level_zero/ze_ddi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define API __attribute__((visibility("default")))

/* ------------------------------------------------------------ logs */

static char calls[1 << 16];
static size_t ncalls;
static fake_ze_launch *launches;
static int nlaunches, cap_launches;
static long live_allocs;
static struct {
    char name[96];
    fake_ze_kernel_fn fn;
} registry[16];
static int nregistry;

static void called(const char *name) {
    size_t n = strlen(name);
    if (ncalls + n + 2 >= sizeof calls) return;
    memcpy(calls + ncalls, name, n);
    ncalls += n;
    calls[ncalls++] = '\n';
    calls[ncalls] = '\0';
}

API void fake_ze_register(const char *name, fake_ze_kernel_fn fn) {
    snprintf(registry[nregistry].name, sizeof registry[nregistry].name, "%s", name);
    registry[nregistry++].fn = fn;
}
API const char *fake_ze_calls(void) { return calls; }
API void fake_ze_clear(void) {
    ncalls = 0;
    calls[0] = '\0';
    nlaunches = 0;
}
API int fake_ze_nlaunches(void) { return nlaunches; }
API const fake_ze_launch *fake_ze_launch_at(int i) { return &launches[i]; }
API long fake_ze_live(void) { return live_allocs; }

/* ------------------------------------------------------------ objects */

static struct { int dummy; } the_driver, the_device;

typedef struct fctx {
    int dummy;
} fctx;

typedef struct fkernel {
    fake_ze_launch now; /* name, group size and argument values as set now */
    unsigned null_args; /* arguments set with no value: local memory */
    void *cl;           /* the OpenCL kernel (OpenCL mode) */
} fkernel;

typedef struct fmodule {
    size_t size;
    void *cl; /* the OpenCL program (OpenCL mode) */
} fmodule;

static int forward; /* OpenCL mode: set by zeInit */

enum { CMD_COPY, CMD_LAUNCH };
typedef struct cmd {
    int kind;
    void *dst;
    const void *src;
    size_t n;
    fake_ze_launch l;
    unsigned null_args;
    void *cl;
} cmd;

typedef struct flist {
    int immediate, closed;
    cmd *c;
    int n, cap;
} flist;

typedef struct ffence {
    int signalled;
} ffence;

/* Run one command: in OpenCL mode a copy waits for the kernels before it
 * and a launch is enqueued. */
static ze_result_t run_cmd(const cmd *c) {
    if (c->kind == CMD_COPY) {
        if (forward && fzo_finish() != 0) return ZE_RESULT_ERROR_DEVICE_LOST;
        memmove(c->dst, c->src, c->n);
        return ZE_RESULT_SUCCESS;
    }
    if (nlaunches == cap_launches) {
        cap_launches = cap_launches ? cap_launches * 2 : 64;
        launches = realloc(launches, sizeof *launches * (size_t)cap_launches);
    }
    launches[nlaunches++] = c->l;
    if (forward)
        return fzo_launch(c->cl, &c->l, c->null_args) == 0 ? ZE_RESULT_SUCCESS
                                                           : ZE_RESULT_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < nregistry; i++)
        if (strcmp(registry[i].name, c->l.name) == 0) registry[i].fn(&c->l);
    return ZE_RESULT_SUCCESS;
}

static ze_result_t push(flist *l, const cmd *c) {
    if (l->immediate) { /* synchronous: done when the call returns */
        ze_result_t r = run_cmd(c);
        if (r == ZE_RESULT_SUCCESS && forward && fzo_finish() != 0) r = ZE_RESULT_ERROR_DEVICE_LOST;
        return r;
    }
    if (l->closed) return ZE_RESULT_ERROR_INVALID_ARGUMENT;
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 16;
        l->c = realloc(l->c, sizeof *l->c * (size_t)l->cap);
    }
    l->c[l->n++] = *c;
    return ZE_RESULT_SUCCESS;
}

/* ------------------------------------------------------------ entry points */

static ze_result_t f_init(ze_init_flags_t flags) {
    (void)flags;
    called("zeInit");
    if (!fzo_wanted()) return ZE_RESULT_SUCCESS;
    if (fzo_init() != 0) return ZE_RESULT_ERROR_UNINITIALIZED;
    forward = 1;
    return ZE_RESULT_SUCCESS;
}

static ze_result_t f_driver_get(uint32_t *n, ze_driver_handle_t *d) {
    called("zeDriverGet");
    if (d && *n >= 1) d[0] = (ze_driver_handle_t)&the_driver;
    *n = 1;
    return ZE_RESULT_SUCCESS;
}

static ze_result_t f_driver_version(ze_driver_handle_t d, ze_api_version_t *v) {
    (void)d;
    *v = ZE_API_VERSION_CURRENT;
    return ZE_RESULT_SUCCESS;
}

static ze_result_t f_driver_props(ze_driver_handle_t d, ze_driver_properties_t *p) {
    (void)d;
    memset(&p->uuid, 0, sizeof p->uuid);
    p->driverVersion = 1;
    return ZE_RESULT_SUCCESS;
}

static ze_result_t f_device_get(ze_driver_handle_t d, uint32_t *n, ze_device_handle_t *out) {
    (void)d;
    called("zeDeviceGet");
    if (out && *n >= 1) out[0] = (ze_device_handle_t)&the_device;
    *n = 1;
    return ZE_RESULT_SUCCESS;
}

static ze_result_t f_device_props(ze_device_handle_t d, ze_device_properties_t *p) {
    (void)d;
    called("zeDeviceGetProperties");
    p->type = ZE_DEVICE_TYPE_GPU;
    p->vendorId = 0x8086;
    p->deviceId = 0xfa4e;
    p->maxMemAllocSize = (uint64_t)1 << 32;
    p->numThreadsPerEU = 8;
    snprintf(p->name, sizeof p->name, "stepgraph fake GPU");
    return ZE_RESULT_SUCCESS;
}

static ze_result_t f_device_mem(ze_device_handle_t d, uint32_t *n,
                                ze_device_memory_properties_t *p) {
    (void)d;
    called("zeDeviceGetMemoryProperties");
    if (p && *n >= 1) p[0].totalSize = (uint64_t)1 << 30;
    *n = 1;
    return ZE_RESULT_SUCCESS;
}

static ze_result_t f_ctx_create(ze_driver_handle_t d, const ze_context_desc_t *desc,
                                ze_context_handle_t *out) {
    (void)d, (void)desc;
    called("zeContextCreate");
    *out = (ze_context_handle_t)calloc(1, sizeof(fctx));
    return ZE_RESULT_SUCCESS;
}

static ze_result_t f_ctx_destroy(ze_context_handle_t c) {
    called("zeContextDestroy");
    free(c);
    return ZE_RESULT_SUCCESS;
}

/* Memory of every kind: host memory, or the runtime's USM. */
static ze_result_t mem_alloc(size_t size, size_t align, int host, void **out) {
    if (align < 16) align = 16;
    size = (size + align - 1) / align * align;
    *out = forward ? fzo_alloc(size ? size : align, align, host) : aligned_alloc(align, size);
    if (!*out) return ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY;
    memset(*out, 0xcd, size); /* memory starts as garbage */
    live_allocs++;
    return ZE_RESULT_SUCCESS;
}

static ze_result_t f_alloc_device(ze_context_handle_t c, const ze_device_mem_alloc_desc_t *desc,
                                  size_t size, size_t align, ze_device_handle_t d, void **out) {
    (void)c, (void)desc, (void)d;
    called("zeMemAllocDevice");
    return mem_alloc(size, align, 0, out);
}

static ze_result_t f_alloc_host(ze_context_handle_t c, const ze_host_mem_alloc_desc_t *desc,
                                size_t size, size_t align, void **out) {
    (void)c, (void)desc;
    called("zeMemAllocHost");
    return mem_alloc(size, align, 1, out);
}

static ze_result_t f_alloc_shared(ze_context_handle_t c, const ze_device_mem_alloc_desc_t *dd,
                                  const ze_host_mem_alloc_desc_t *hd, size_t size, size_t align,
                                  ze_device_handle_t d, void **out) {
    (void)c, (void)dd, (void)hd, (void)d;
    called("zeMemAllocShared");
    return mem_alloc(size, align, 0, out);
}

static ze_result_t f_free(ze_context_handle_t c, void *p) {
    (void)c;
    called("zeMemFree");
    if (forward)
        fzo_free(p);
    else
        free(p);
    live_allocs--;
    return ZE_RESULT_SUCCESS;
}

static ze_result_t f_list_create(ze_context_handle_t c, ze_device_handle_t d,
                                 const ze_command_list_desc_t *desc,
                                 ze_command_list_handle_t *out) {
    (void)c, (void)d, (void)desc;
    called("zeCommandListCreate");
    *out = (ze_command_list_handle_t)calloc(1, sizeof(flist));
    return ZE_RESULT_SUCCESS;
}

static ze_result_t f_list_create_imm(ze_context_handle_t c, ze_device_handle_t d,
                                     const ze_command_queue_desc_t *desc,
                                     ze_command_list_handle_t *out) {
    (void)c, (void)d;
    called(desc->mode == ZE_COMMAND_QUEUE_MODE_SYNCHRONOUS ? "zeCommandListCreateImmediate(sync)"
                                                           : "zeCommandListCreateImmediate");
    flist *l = calloc(1, sizeof *l);
    l->immediate = 1;
    *out = (ze_command_list_handle_t)l;
    return ZE_RESULT_SUCCESS;
}

static ze_result_t f_list_close(ze_command_list_handle_t h) {
    called("zeCommandListClose");
    ((flist *)h)->closed = 1;
    return ZE_RESULT_SUCCESS;
}

static ze_result_t f_list_reset(ze_command_list_handle_t h) {
    called("zeCommandListReset");
    flist *l = (flist *)h;
    l->n = 0;
    l->closed = 0;
    return ZE_RESULT_SUCCESS;
}

static ze_result_t f_list_destroy(ze_command_list_handle_t h) {
    called("zeCommandListDestroy");
    flist *l = (flist *)h;
    free(l->c);
    free(l);
    return ZE_RESULT_SUCCESS;
}

static ze_result_t f_copy(ze_command_list_handle_t h, void *dst, const void *src, size_t n,
                          ze_event_handle_t ev, uint32_t nwait, ze_event_handle_t *wait) {
    (void)ev, (void)nwait, (void)wait;
    called("zeCommandListAppendMemoryCopy");
    cmd c = {.kind = CMD_COPY, .dst = dst, .src = src, .n = n};
    return push((flist *)h, &c);
}

static ze_result_t f_barrier(ze_command_list_handle_t h, ze_event_handle_t ev, uint32_t nwait,
                             ze_event_handle_t *wait) {
    (void)h, (void)ev, (void)nwait, (void)wait;
    called("zeCommandListAppendBarrier");
    return ZE_RESULT_SUCCESS;
}

static ze_result_t f_launch(ze_command_list_handle_t h, ze_kernel_handle_t k,
                            const ze_group_count_t *g, ze_event_handle_t ev, uint32_t nwait,
                            ze_event_handle_t *wait) {
    (void)ev, (void)nwait, (void)wait;
    called("zeCommandListAppendLaunchKernel");
    fkernel *fk = (fkernel *)k;
    cmd c = {.kind = CMD_LAUNCH, .l = fk->now, .null_args = fk->null_args, .cl = fk->cl};
    c.l.groups[0] = g->groupCountX, c.l.groups[1] = g->groupCountY, c.l.groups[2] = g->groupCountZ;
    return push((flist *)h, &c);
}

static ze_result_t f_queue_create(ze_context_handle_t c, ze_device_handle_t d,
                                  const ze_command_queue_desc_t *desc,
                                  ze_command_queue_handle_t *out) {
    (void)c, (void)d, (void)desc;
    called("zeCommandQueueCreate");
    *out = (ze_command_queue_handle_t)calloc(1, 16);
    return ZE_RESULT_SUCCESS;
}

static ze_result_t f_queue_destroy(ze_command_queue_handle_t q) {
    called("zeCommandQueueDestroy");
    free(q);
    return ZE_RESULT_SUCCESS;
}

static ze_result_t f_queue_exec(ze_command_queue_handle_t q, uint32_t n,
                                ze_command_list_handle_t *lists, ze_fence_handle_t fence) {
    (void)q;
    called("zeCommandQueueExecuteCommandLists");
    for (uint32_t i = 0; i < n; i++)
        if (!((flist *)lists[i])->closed) return ZE_RESULT_ERROR_INVALID_ARGUMENT; /* closed */
    for (uint32_t i = 0; i < n; i++) {
        flist *l = (flist *)lists[i];
        for (int k = 0; k < l->n; k++) {
            ze_result_t r = run_cmd(&l->c[k]);
            if (r != ZE_RESULT_SUCCESS) return r;
        }
    }
    /* The fence is signalled when the device is done. */
    if (forward && fzo_finish() != 0) return ZE_RESULT_ERROR_DEVICE_LOST;
    if (fence) ((ffence *)fence)->signalled = 1;
    return ZE_RESULT_SUCCESS;
}

static ze_result_t f_queue_sync(ze_command_queue_handle_t q, uint64_t t) {
    (void)q, (void)t;
    called("zeCommandQueueSynchronize");
    if (forward && fzo_finish() != 0) return ZE_RESULT_ERROR_DEVICE_LOST;
    return ZE_RESULT_SUCCESS;
}

static ze_result_t f_fence_create(ze_command_queue_handle_t q, const ze_fence_desc_t *d,
                                  ze_fence_handle_t *out) {
    (void)q, (void)d;
    called("zeFenceCreate");
    *out = (ze_fence_handle_t)calloc(1, sizeof(ffence));
    return ZE_RESULT_SUCCESS;
}

static ze_result_t f_fence_destroy(ze_fence_handle_t f) {
    called("zeFenceDestroy");
    free(f);
    return ZE_RESULT_SUCCESS;
}

static ze_result_t f_fence_sync(ze_fence_handle_t f, uint64_t t) {
    (void)t;
    called("zeFenceHostSynchronize");
    return ((ffence *)f)->signalled ? ZE_RESULT_SUCCESS : ZE_RESULT_NOT_READY;
}

static ze_result_t f_fence_reset(ze_fence_handle_t f) {
    called("zeFenceReset");
    ((ffence *)f)->signalled = 0;
    return ZE_RESULT_SUCCESS;
}

static ze_result_t f_module_create(ze_context_handle_t c, ze_device_handle_t d,
                                   const ze_module_desc_t *desc, ze_module_handle_t *out,
                                   ze_module_build_log_handle_t *log) {
    (void)c, (void)d;
    called("zeModuleCreate");
    uint32_t w0 = 0;
    if (desc->inputSize >= 4) memcpy(&w0, desc->pInputModule, 4);
    int ok = desc->format == ZE_MODULE_FORMAT_IL_SPIRV && desc->inputSize >= 20 &&
             desc->inputSize % 4 == 0 && w0 == 0x07230203u;
    enum { LOG = 4096 };
    char *text = malloc(LOG);
    snprintf(text, LOG, ok ? "" : "fake_ze: input of %zu bytes is not SPIR-V", desc->inputSize);
    void *prog = NULL;
    if (ok && forward) ok = fzo_program(desc->pInputModule, desc->inputSize, &prog, text, LOG) == 0;
    if (log)
        *log = (ze_module_build_log_handle_t)text;
    else
        free(text);
    if (!ok) return ZE_RESULT_ERROR_MODULE_BUILD_FAILURE;
    fmodule *m = calloc(1, sizeof *m);
    m->size = desc->inputSize;
    m->cl = prog;
    *out = (ze_module_handle_t)m;
    return ZE_RESULT_SUCCESS;
}

static ze_result_t f_module_destroy(ze_module_handle_t m) {
    called("zeModuleDestroy");
    if (((fmodule *)m)->cl) fzo_program_free(((fmodule *)m)->cl);
    free(m);
    return ZE_RESULT_SUCCESS;
}

static ze_result_t f_log_string(ze_module_build_log_handle_t log, size_t *n, char *out) {
    const char *text = (const char *)log;
    if (out)
        memcpy(out, text, *n);
    else
        *n = strlen(text) + 1;
    return ZE_RESULT_SUCCESS;
}

static ze_result_t f_log_destroy(ze_module_build_log_handle_t log) {
    free(log);
    return ZE_RESULT_SUCCESS;
}

static ze_result_t f_kernel_create(ze_module_handle_t m, const ze_kernel_desc_t *d,
                                   ze_kernel_handle_t *out) {
    called("zeKernelCreate");
    void *clk = NULL;
    if (forward && !(clk = fzo_kernel(((fmodule *)m)->cl, d->pKernelName)))
        return ZE_RESULT_ERROR_INVALID_KERNEL_NAME;
    fkernel *k = calloc(1, sizeof *k);
    snprintf(k->now.name, sizeof k->now.name, "%s", d->pKernelName);
    k->cl = clk;
    *out = (ze_kernel_handle_t)k;
    return ZE_RESULT_SUCCESS;
}

static ze_result_t f_kernel_destroy(ze_kernel_handle_t k) {
    called("zeKernelDestroy");
    if (((fkernel *)k)->cl) fzo_kernel_free(((fkernel *)k)->cl);
    free(k);
    return ZE_RESULT_SUCCESS;
}

static ze_result_t f_group_size(ze_kernel_handle_t h, uint32_t x, uint32_t y, uint32_t z) {
    called("zeKernelSetGroupSize");
    fkernel *k = (fkernel *)h;
    k->now.gsize[0] = x, k->now.gsize[1] = y, k->now.gsize[2] = z;
    return ZE_RESULT_SUCCESS;
}

static ze_result_t f_set_arg(ze_kernel_handle_t h, uint32_t i, size_t size, const void *v) {
    called("zeKernelSetArgumentValue");
    fkernel *k = (fkernel *)h;
    /* A value of at most 16 bytes, or none: local memory of any size. */
    if (i >= FAKE_ZE_MAX_ARGS || (v && size > 16))
        return ZE_RESULT_ERROR_INVALID_KERNEL_ARGUMENT_INDEX;
    k->now.size[i] = size;
    if (v)
        memcpy(k->now.value[i], v, size);
    else
        memset(k->now.value[i], 0, sizeof k->now.value[i]);
    k->null_args = v ? k->null_args & ~(1u << i) : k->null_args | (1u << i);
    if ((int)i >= k->now.nargs) k->now.nargs = (int)i + 1;
    return ZE_RESULT_SUCCESS;
}

/* ------------------------------------------------------------ the DDI tables */

API ze_result_t zeGetGlobalProcAddrTable(ze_api_version_t v, ze_global_dditable_t *t) {
    (void)v;
    t->pfnInit = f_init;
    return ZE_RESULT_SUCCESS;
}

API ze_result_t zeGetDriverProcAddrTable(ze_api_version_t v, ze_driver_dditable_t *t) {
    (void)v;
    t->pfnGet = f_driver_get;
    t->pfnGetApiVersion = f_driver_version;
    t->pfnGetProperties = f_driver_props;
    return ZE_RESULT_SUCCESS;
}

API ze_result_t zeGetDeviceProcAddrTable(ze_api_version_t v, ze_device_dditable_t *t) {
    (void)v;
    t->pfnGet = f_device_get;
    t->pfnGetProperties = f_device_props;
    t->pfnGetMemoryProperties = f_device_mem;
    return ZE_RESULT_SUCCESS;
}

API ze_result_t zeGetContextProcAddrTable(ze_api_version_t v, ze_context_dditable_t *t) {
    (void)v;
    t->pfnCreate = f_ctx_create;
    t->pfnDestroy = f_ctx_destroy;
    return ZE_RESULT_SUCCESS;
}

API ze_result_t zeGetCommandQueueProcAddrTable(ze_api_version_t v, ze_command_queue_dditable_t *t) {
    (void)v;
    t->pfnCreate = f_queue_create;
    t->pfnDestroy = f_queue_destroy;
    t->pfnExecuteCommandLists = f_queue_exec;
    t->pfnSynchronize = f_queue_sync;
    return ZE_RESULT_SUCCESS;
}

API ze_result_t zeGetCommandListProcAddrTable(ze_api_version_t v, ze_command_list_dditable_t *t) {
    (void)v;
    t->pfnCreate = f_list_create;
    t->pfnCreateImmediate = f_list_create_imm;
    t->pfnClose = f_list_close;
    t->pfnReset = f_list_reset;
    t->pfnDestroy = f_list_destroy;
    t->pfnAppendMemoryCopy = f_copy;
    t->pfnAppendBarrier = f_barrier;
    t->pfnAppendLaunchKernel = f_launch;
    return ZE_RESULT_SUCCESS;
}

API ze_result_t zeGetFenceProcAddrTable(ze_api_version_t v, ze_fence_dditable_t *t) {
    (void)v;
    t->pfnCreate = f_fence_create;
    t->pfnDestroy = f_fence_destroy;
    t->pfnHostSynchronize = f_fence_sync;
    t->pfnReset = f_fence_reset;
    return ZE_RESULT_SUCCESS;
}

API ze_result_t zeGetMemProcAddrTable(ze_api_version_t v, ze_mem_dditable_t *t) {
    (void)v;
    t->pfnAllocDevice = f_alloc_device;
    t->pfnAllocHost = f_alloc_host;
    t->pfnAllocShared = f_alloc_shared;
    t->pfnFree = f_free;
    return ZE_RESULT_SUCCESS;
}

API ze_result_t zeGetModuleProcAddrTable(ze_api_version_t v, ze_module_dditable_t *t) {
    (void)v;
    t->pfnCreate = f_module_create;
    t->pfnDestroy = f_module_destroy;
    return ZE_RESULT_SUCCESS;
}

API ze_result_t zeGetModuleBuildLogProcAddrTable(ze_api_version_t v,
                                                 ze_module_build_log_dditable_t *t) {
    (void)v;
    t->pfnGetString = f_log_string;
    t->pfnDestroy = f_log_destroy;
    return ZE_RESULT_SUCCESS;
}

API ze_result_t zeGetKernelProcAddrTable(ze_api_version_t v, ze_kernel_dditable_t *t) {
    (void)v;
    t->pfnCreate = f_kernel_create;
    t->pfnDestroy = f_kernel_destroy;
    t->pfnSetGroupSize = f_group_size;
    t->pfnSetArgumentValue = f_set_arg;
    return ZE_RESULT_SUCCESS;
}

/* Tables of objects the backend never uses, and of the tools (zet) and
 * sysman (zes) interfaces, which the loader asks every driver for: present,
 * with no entries. */
#define EMPTY_TABLE(fn, type)                                                                      \
    API ze_result_t fn(ze_api_version_t v, type *t) {                                              \
        (void)v, (void)t;                                                                          \
        return ZE_RESULT_SUCCESS;                                                                  \
    }
EMPTY_TABLE(zeGetEventPoolProcAddrTable, ze_event_pool_dditable_t)
EMPTY_TABLE(zeGetEventProcAddrTable, ze_event_dditable_t)
EMPTY_TABLE(zeGetImageProcAddrTable, ze_image_dditable_t)
EMPTY_TABLE(zeGetSamplerProcAddrTable, ze_sampler_dditable_t)
EMPTY_TABLE(zeGetPhysicalMemProcAddrTable, ze_physical_mem_dditable_t)
EMPTY_TABLE(zeGetVirtualMemProcAddrTable, ze_virtual_mem_dditable_t)
EMPTY_TABLE(zeGetDeviceExpProcAddrTable, ze_device_exp_dditable_t)
EMPTY_TABLE(zeGetEventExpProcAddrTable, ze_event_exp_dditable_t)
EMPTY_TABLE(zeGetImageExpProcAddrTable, ze_image_exp_dditable_t)
EMPTY_TABLE(zeGetKernelExpProcAddrTable, ze_kernel_exp_dditable_t)
EMPTY_TABLE(zeGetFabricVertexExpProcAddrTable, ze_fabric_vertex_exp_dditable_t)
EMPTY_TABLE(zeGetFabricEdgeExpProcAddrTable, ze_fabric_edge_exp_dditable_t)
EMPTY_TABLE(zetGetCommandListProcAddrTable, void)
EMPTY_TABLE(zetGetContextProcAddrTable, void)
EMPTY_TABLE(zetGetDebugProcAddrTable, void)
EMPTY_TABLE(zetGetDeviceProcAddrTable, void)
EMPTY_TABLE(zetGetKernelProcAddrTable, void)
EMPTY_TABLE(zetGetMetricGroupExpProcAddrTable, void)
EMPTY_TABLE(zetGetMetricGroupProcAddrTable, void)
EMPTY_TABLE(zetGetMetricProcAddrTable, void)
EMPTY_TABLE(zetGetMetricQueryPoolProcAddrTable, void)
EMPTY_TABLE(zetGetMetricQueryProcAddrTable, void)
EMPTY_TABLE(zetGetMetricStreamerProcAddrTable, void)
EMPTY_TABLE(zetGetModuleProcAddrTable, void)
EMPTY_TABLE(zetGetTracerExpProcAddrTable, void)
EMPTY_TABLE(zesGetDeviceProcAddrTable, void)
EMPTY_TABLE(zesGetDiagnosticsProcAddrTable, void)
EMPTY_TABLE(zesGetDriverProcAddrTable, void)
EMPTY_TABLE(zesGetEngineProcAddrTable, void)
EMPTY_TABLE(zesGetFabricPortProcAddrTable, void)
EMPTY_TABLE(zesGetFanProcAddrTable, void)
EMPTY_TABLE(zesGetFirmwareProcAddrTable, void)
EMPTY_TABLE(zesGetFrequencyProcAddrTable, void)
EMPTY_TABLE(zesGetLedProcAddrTable, void)
EMPTY_TABLE(zesGetMemoryProcAddrTable, void)
EMPTY_TABLE(zesGetPerformanceFactorProcAddrTable, void)
EMPTY_TABLE(zesGetPowerProcAddrTable, void)
EMPTY_TABLE(zesGetPsuProcAddrTable, void)
EMPTY_TABLE(zesGetRasProcAddrTable, void)
EMPTY_TABLE(zesGetSchedulerProcAddrTable, void)
EMPTY_TABLE(zesGetStandbyProcAddrTable, void)
EMPTY_TABLE(zesGetTemperatureProcAddrTable, void)
