/* SPDX-License-Identifier: MIT */
/*
 * fake_ze_ocl.c -- the fake Level Zero driver's OpenCL mode (see
 * fake_ze_ocl.h): it owns the OpenCL CPU runtime the driver forwards to.
 * The runtime's library is opened directly with dlopen (the path in
 * FAKE_ZE_OPENCL), not through the ICD loader, so that no ICD file, no
 * OCL_ICD_VENDORS and no other installed OpenCL platform is involved, and
 * the library's own OpenCL C checks (which pick PoCL through the ICD loader)
 * stay as they are in the same process.
 *
 * Mapping: device and shared allocations are shared USM
 * (clSharedMemAllocINTEL: the host may read a table a test inspects, and
 * copies are a wait plus a memmove), host allocations host USM; a module is
 * clCreateProgramWithIL + clBuildProgram; an argument of pointer size whose
 * value lies in a live allocation (a pool base plus an offset included) is
 * set with clSetKernelArgMemPointerINTEL, any other with clSetKernelArg;
 * kernels may read USM addresses from tables (indirect access enabled); a
 * launch is clEnqueueNDRangeKernel of groups x group size work-items on one
 * in-order queue. Built programs are kept as the runtime's binaries in
 * SG_CACHE_DIR (fake_ze-<hash>.clbin), since compiling SPIR-V is most of
 * a warm run's time.
 */
#define CL_TARGET_OPENCL_VERSION 300
#include "fake_ze_ocl.h"

#include <stdio.h>
#include <stdlib.h>

int fzo_wanted(void) {
    const char *p = getenv("FAKE_ZE_OPENCL");
    return p && *p;
}

#if __has_include(<CL/cl_ext.h>)
#include <CL/cl.h>
#include <CL/cl_ext.h>
#include <dlfcn.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#define CL_API(X)                                                                                  \
    X(clGetPlatformIDs)                                                                            \
    X(clGetDeviceIDs)                                                                              \
    X(clCreateContext)                                                                             \
    X(clCreateCommandQueueWithProperties)                                                          \
    X(clFinish)                                                                                    \
    X(clCreateProgramWithIL)                                                                       \
    X(clCreateProgramWithBinary)                                                                   \
    X(clGetProgramInfo)                                                                            \
    X(clBuildProgram)                                                                              \
    X(clGetProgramBuildInfo)                                                                       \
    X(clReleaseProgram)                                                                            \
    X(clCreateKernel)                                                                              \
    X(clReleaseKernel)                                                                             \
    X(clSetKernelArg)                                                                              \
    X(clSetKernelExecInfo)                                                                         \
    X(clEnqueueNDRangeKernel)                                                                      \
    X(clGetExtensionFunctionAddressForPlatform)

#define USM_API(X)                                                                                 \
    X(clSharedMemAllocINTEL)                                                                       \
    X(clHostMemAllocINTEL)                                                                         \
    X(clMemBlockingFreeINTEL)                                                                      \
    X(clSetKernelArgMemPointerINTEL)

static struct {
#define X(f) __typeof__(&f) f;
    CL_API(X) USM_API(X)
#undef X
} cl;

static int state; /* 0: not tried, 1: ready, -1: failed */
static cl_platform_id platform;
static cl_device_id device;
static cl_context context;
static cl_command_queue queue;

/* The live allocations, for telling a pointer argument from a value. */
typedef struct alloc {
    char *base;
    size_t size;
} alloc;
static alloc *allocs;
static int nallocs, cap_allocs;

static int fail(const char *what, cl_int err) {
    fprintf(stderr, "fake_ze: %s failed (OpenCL error %d)\n", what, (int)err);
    return -1;
}

static uintptr_t usm_entry(void *lib, const char *name) {
    void *f = dlsym(lib, name);
    return (uintptr_t)(f ? f : cl.clGetExtensionFunctionAddressForPlatform(platform, name));
}

static int load(void) {
    const char *path = getenv("FAKE_ZE_OPENCL");
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *e = dlerror();
        fprintf(stderr, "fake_ze: cannot load the OpenCL runtime %s: %s\n", path,
                e ? e : "dlopen failed");
        return -1;
    }
#define X(f)                                                                                       \
    cl.f = (__typeof__(cl.f))(uintptr_t)dlsym(lib, #f);                                            \
    if (!cl.f) {                                                                                   \
        fprintf(stderr, "fake_ze: %s has no %s\n", path, #f);                                      \
        return -1;                                                                                 \
    }
    CL_API(X)
#undef X
    cl_uint n = 0;
    cl_int err = cl.clGetPlatformIDs(1, &platform, &n);
    if (err != CL_SUCCESS || n == 0) return fail("clGetPlatformIDs", err);
        /* The USM entry points: exported by Intel's runtime, else through the
         * extension query. */
#define X(f)                                                                                       \
    cl.f = (__typeof__(cl.f))usm_entry(lib, #f);                                                   \
    if (!cl.f) {                                                                                   \
        fprintf(stderr, "fake_ze: %s has no %s (cl_intel_unified_shared_memory)\n", path, #f);     \
        return -1;                                                                                 \
    }
    USM_API(X)
#undef X
    err = cl.clGetDeviceIDs(platform, CL_DEVICE_TYPE_CPU, 1, &device, &n);
    if (err != CL_SUCCESS || n == 0) return fail("clGetDeviceIDs(CPU)", err);
    context = cl.clCreateContext(NULL, 1, &device, NULL, NULL, &err);
    if (!context) return fail("clCreateContext", err);
    queue = cl.clCreateCommandQueueWithProperties(context, device, NULL, &err);
    if (!queue) return fail("clCreateCommandQueueWithProperties", err);
    return 0;
}

int fzo_init(void) {
    if (state == 0) state = load() == 0 ? 1 : -1;
    return state == 1 ? 0 : -1;
}

void *fzo_alloc(size_t size, size_t align, int host) {
    cl_int err = CL_SUCCESS;
    void *p = host ? cl.clHostMemAllocINTEL(context, NULL, size, (cl_uint)align, &err)
                   : cl.clSharedMemAllocINTEL(context, device, NULL, size, (cl_uint)align, &err);
    if (!p) return NULL;
    if (nallocs == cap_allocs) {
        cap_allocs = cap_allocs ? cap_allocs * 2 : 64;
        allocs = realloc(allocs, sizeof *allocs * (size_t)cap_allocs);
    }
    allocs[nallocs++] = (alloc){p, size};
    return p;
}

void fzo_free(void *p) {
    for (int i = 0; i < nallocs; i++)
        if (allocs[i].base == p) {
            allocs[i] = allocs[--nallocs];
            break;
        }
    cl.clMemBlockingFreeINTEL(context, p);
}

/* Whether v lies in a live allocation (its end included: an empty view). */
static int is_usm(const void *v) {
    for (int i = 0; i < nallocs; i++)
        if ((const char *)v >= allocs[i].base && (const char *)v <= allocs[i].base + allocs[i].size)
            return 1;
    return 0;
}

/* Built programs are kept as the runtime's binaries in SG_CACHE_DIR, as
 * fake_ze-<hash of the SPIR-V>.clbin (the library's cache ignores such
 * names): the runtime's compile of SPIR-V is most of a warm run's time. */
static int bin_path(const void *il, size_t n, char *path, size_t size) {
    const char *dir = getenv("SG_CACHE_DIR");
    if (!dir || !*dir) return -1;
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ ((const unsigned char *)il)[i]) * 1099511628211ull;
    return snprintf(path, size, "%s/fake_ze-%016llx-%zu.clbin", dir, (unsigned long long)h, n) <
                   (int)size
               ? 0
               : -1;
}

static cl_program from_binary(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = len > 0 ? malloc((size_t)len) : NULL;
    size_t got = buf ? fread(buf, 1, (size_t)len, f) : 0;
    fclose(f);
    cl_program p = NULL;
    if (buf && got == (size_t)len) {
        size_t blen = got;
        const unsigned char *bins[1] = {buf};
        cl_int st = CL_SUCCESS, err = CL_SUCCESS;
        p = cl.clCreateProgramWithBinary(context, 1, &device, &blen, bins, &st, &err);
        if (p && cl.clBuildProgram(p, 1, &device, "", NULL, NULL) != CL_SUCCESS) {
            cl.clReleaseProgram(p);
            p = NULL;
        }
    }
    free(buf);
    return p;
}

static void keep_binary(cl_program p, const char *path) {
    size_t len = 0;
    if (cl.clGetProgramInfo(p, CL_PROGRAM_BINARY_SIZES, sizeof len, &len, NULL) != CL_SUCCESS ||
        !len)
        return;
    unsigned char *buf = malloc(len);
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid());
    FILE *f = NULL;
    if (buf && cl.clGetProgramInfo(p, CL_PROGRAM_BINARIES, sizeof buf, &buf, NULL) == CL_SUCCESS &&
        (f = fopen(tmp, "wb"))) {
        int ok = fwrite(buf, 1, len, f) == len;
        ok = fclose(f) == 0 && ok;
        if (!ok || rename(tmp, path) != 0) remove(tmp);
    }
    free(buf);
}

int fzo_program(const void *il, size_t n, void **prog, char *log, size_t size) {
    cl_int err = CL_SUCCESS;
    char path[4096];
    int cached = bin_path(il, n, path, sizeof path) == 0;
    cl_program p = cached ? from_binary(path) : NULL;
    log[0] = '\0';
    if (p) {
        *prog = p;
        return 0;
    }
    p = cl.clCreateProgramWithIL(context, il, n, &err);
    if (!p) {
        snprintf(log, size, "fake_ze: clCreateProgramWithIL failed (OpenCL error %d)", (int)err);
        return -1;
    }
    err = cl.clBuildProgram(p, 1, &device, "", NULL, NULL);
    if (err != CL_SUCCESS) {
        int head =
            snprintf(log, size, "fake_ze: clBuildProgram failed (OpenCL error %d): ", (int)err);
        size_t got = 0;
        if (head > 0 && (size_t)head < size)
            cl.clGetProgramBuildInfo(p, device, CL_PROGRAM_BUILD_LOG, size - (size_t)head,
                                     log + head, &got);
        log[size - 1] = '\0';
        cl.clReleaseProgram(p);
        return -1;
    }
    if (cached) keep_binary(p, path);
    *prog = p;
    return 0;
}

void fzo_program_free(void *prog) { cl.clReleaseProgram(prog); }

void *fzo_kernel(void *prog, const char *name) {
    cl_int err = CL_SUCCESS;
    cl_kernel k = cl.clCreateKernel(prog, name, &err);
    if (!k) return NULL;
    /* Generated kernels read USM addresses from a table in USM. */
    cl_bool yes = CL_TRUE;
    cl.clSetKernelExecInfo(k, CL_KERNEL_EXEC_INFO_INDIRECT_SHARED_ACCESS_INTEL, sizeof yes, &yes);
    cl.clSetKernelExecInfo(k, CL_KERNEL_EXEC_INFO_INDIRECT_HOST_ACCESS_INTEL, sizeof yes, &yes);
    return k;
}

void fzo_kernel_free(void *kernel) { cl.clReleaseKernel(kernel); }

int fzo_launch(void *kernel, const fake_ze_launch *l, unsigned null_mask) {
    cl_kernel k = kernel;
    for (int i = 0; i < l->nargs; i++) {
        void *p = NULL;
        if (l->size[i] == sizeof p) memcpy(&p, l->value[i], sizeof p);
        cl_int err = (null_mask >> i) & 1 ? cl.clSetKernelArg(k, (cl_uint)i, l->size[i], NULL)
                     : p && is_usm(p)     ? cl.clSetKernelArgMemPointerINTEL(k, (cl_uint)i, p)
                                      : cl.clSetKernelArg(k, (cl_uint)i, l->size[i], l->value[i]);
        if (err != CL_SUCCESS) {
            fprintf(stderr, "fake_ze: argument %d (%zu bytes) of %s: ", i, l->size[i], l->name);
            return fail("clSetKernelArg", err);
        }
    }
    size_t global[3], local[3];
    for (int d = 0; d < 3; d++) {
        local[d] = l->gsize[d] ? l->gsize[d] : 1;
        global[d] = (size_t)l->groups[d] * local[d];
    }
    if (!global[0] || !global[1] || !global[2]) return 0;
    cl_int err = cl.clEnqueueNDRangeKernel(queue, k, 3, NULL, global, local, 0, NULL, NULL);
    if (err != CL_SUCCESS) {
        fprintf(stderr, "fake_ze: %s, %ux%ux%u groups of %zux%zux%zu: ", l->name, l->groups[0],
                l->groups[1], l->groups[2], local[0], local[1], local[2]);
        return fail("clEnqueueNDRangeKernel", err);
    }
    return 0;
}

int fzo_finish(void) {
    cl_int err = cl.clFinish(queue);
    return err == CL_SUCCESS ? 0 : fail("clFinish", err);
}

#else /* no OpenCL headers at build time: the OpenCL mode is unavailable */

int fzo_init(void) {
    fprintf(stderr, "fake_ze: built without the OpenCL headers (install opencl-c-headers)\n");
    return -1;
}
void *fzo_alloc(size_t size, size_t align, int host) {
    return (void)size, (void)align, (void)host, NULL;
}
void fzo_free(void *p) { (void)p; }
int fzo_program(const void *il, size_t n, void **prog, char *log, size_t size) {
    return (void)il, (void)n, (void)prog, (void)log, (void)size, -1;
}
void fzo_program_free(void *prog) { (void)prog; }
void *fzo_kernel(void *prog, const char *name) { return (void)prog, (void)name, NULL; }
void fzo_kernel_free(void *kernel) { (void)kernel; }
int fzo_launch(void *kernel, const fake_ze_launch *l, unsigned null_mask) {
    return (void)kernel, (void)l, (void)null_mask, -1;
}
int fzo_finish(void) { return -1; }

#endif
