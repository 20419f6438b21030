/* SPDX-License-Identifier: MIT */
/*
 * opencl.c -- OpenCL C units built with clBuildProgram on the first OpenCL
 * CPU device, the ICD loader opened at run time; see opencl.h. A build is
 * a check (no disk cache: the Level Zero backend caches its SPIR-V), with
 * the options every OpenCL C unit is built with: OpenCL C 3.0 where the
 * device takes it (1.2 otherwise; the dialect needs no generic address
 * space), single-precision division and square root correctly rounded as
 * the CPU's, no contraction (the unit's FP_CONTRACT OFF).
 */
#include "opencl.h"

#include <stdio.h>
#include <string.h>

#ifdef SG_HAVE_OPENCL_HEADERS

#include <dlfcn.h>
#include <pthread.h>

static sg__ocl api;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static bool loaded;
static char load_why[512];

/* The first platform with a CPU device, its context. */
static void pick_device(void) {
    cl_platform_id plats[16];
    cl_uint np = 0;
    if (api.clGetPlatformIDs(16, plats, &np) != CL_SUCCESS || np == 0) {
        snprintf(load_why, sizeof load_why,
                 "no OpenCL platform (the ICD loader found no driver; install pocl-opencl-icd)");
        return;
    }
    for (cl_uint p = 0; p < np && p < 16; p++) {
        cl_device_id dev;
        cl_uint nd = 0;
        if (api.clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_CPU, 1, &dev, &nd) != CL_SUCCESS || !nd)
            continue;
        cl_int err = CL_SUCCESS;
        cl_context_properties props[] = {CL_CONTEXT_PLATFORM, (cl_context_properties)plats[p], 0};
        api.context = api.clCreateContext(props, 1, &dev, NULL, NULL, &err);
        if (!api.context || err != CL_SUCCESS) continue;
        api.device = dev;
        cl_device_svm_capabilities svm = 0;
        if (api.clGetDeviceInfo(dev, CL_DEVICE_SVM_CAPABILITIES, sizeof svm, &svm, NULL) ==
            CL_SUCCESS)
            api.fine_svm = (svm & CL_DEVICE_SVM_FINE_GRAIN_BUFFER) != 0;
        api.clGetDeviceInfo(dev, CL_DEVICE_NAME, sizeof api.device_name - 1, api.device_name, NULL);
        loaded = true;
        return;
    }
    snprintf(load_why, sizeof load_why,
             "no OpenCL CPU device among %u platforms (install pocl-opencl-icd)", np);
}

static void load_once(void) {
    void *lib = dlopen("libOpenCL.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *err = dlerror();
        snprintf(load_why, sizeof load_why,
                 "OpenCL is not available: cannot load libOpenCL.so.1 (%s); install "
                 "ocl-icd-libopencl1 and a driver such as pocl-opencl-icd",
                 err ? err : "not found");
        return;
    }
#define X(f)                                                                                       \
    api.f = (__typeof__(api.f))(uintptr_t)dlsym(lib, #f);                                          \
    if (!api.f) {                                                                                  \
        snprintf(load_why, sizeof load_why, "the OpenCL loader lacks %s (OpenCL 2.0 or newer)",    \
                 #f);                                                                              \
        return;                                                                                    \
    }
    SG__OCL_API(X)
#undef X
    pick_device();
}

const sg__ocl *sg__ocl_get(char *why, size_t size) {
    pthread_once(&once, load_once);
    if (!loaded && why) snprintf(why, size, "%s", load_why);
    return loaded ? &api : NULL;
}

/* clBuildProgram under the dialect's options; CL3.0 first. */
static cl_int build(cl_program prog, bool *cl3) {
    static const char *const opts[] = {"-cl-std=CL3.0 -cl-fp32-correctly-rounded-divide-sqrt",
                                       "-cl-std=CL1.2 -cl-fp32-correctly-rounded-divide-sqrt"};
    cl_int rc = CL_INVALID_BUILD_OPTIONS;
    for (int i = 0; i < 2 && rc == CL_INVALID_BUILD_OPTIONS; i++) {
        rc = api.clBuildProgram(prog, 1, &api.device, opts[i], NULL, NULL);
        *cl3 = i == 0;
    }
    return rc;
}

sg_status sg__opencl_build(sg_ctx *ctx, const char *name, const char *source, void **program) {
    char why[512];
    if (program) *program = NULL;
    if (!sg__ocl_get(why, sizeof why))
        return sg__fail(ctx, SG_ERR_BACKEND_UNAVAILABLE, "opencl: %s (building %s)", why, name);
    sg_status s = sg__dump_source(ctx, name, ".cl", source, strlen(source));
    if (s != SG_OK) return s;
    cl_int err = CL_SUCCESS;
    size_t len = strlen(source);
    cl_program prog = api.clCreateProgramWithSource(api.context, 1, &source, &len, &err);
    if (!prog || err != CL_SUCCESS)
        return sg__fail(ctx, SG_ERR_COMPILE, "opencl: clCreateProgramWithSource(%s) failed: %d",
                        name, (int)err);
    bool cl3 = false;
    err = build(prog, &cl3);
    if (err != CL_SUCCESS) {
        char log[2048] = "";
        api.clGetProgramBuildInfo(prog, api.device, CL_PROGRAM_BUILD_LOG, sizeof log - 1, log,
                                  NULL);
        api.clReleaseProgram(prog);
        return sg__fail(
            ctx, SG_ERR_COMPILE,
            "opencl: %s failed to build on %s (OpenCL C %s, clBuildProgram %d): %.1200s", name,
            api.device_name, cl3 ? "3.0" : "1.2", (int)err, log);
    }
    if (program)
        *program = prog;
    else
        api.clReleaseProgram(prog);
    return SG_OK;
}

#else

sg_status sg__opencl_build(sg_ctx *ctx, const char *name, const char *source, void **program) {
    (void)source;
    if (program) *program = NULL;
    return sg__fail(ctx, SG_ERR_BACKEND_UNAVAILABLE,
                    "opencl: built without the OpenCL headers (install opencl-c-headers and "
                    "rebuild) (building %s)",
                    name);
}

#endif
