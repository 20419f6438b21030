/* SPDX-License-Identifier: MIT */
/*
 * opencl.h -- OpenCL through the ICD loader (libOpenCL.so.1), loaded at run
 * time (opencl.c), for what checks the OpenCL C dialect on a machine
 * without the GPU it is meant for: building every unit on the first
 * OpenCL CPU device (PoCL in CI) and, in tests, running its kernels there.
 * Only when the Khronos headers are present (SG_HAVE_OPENCL_HEADERS);
 * without them sg__opencl_build (codegen.h) reports the backend absent.
 */
#ifndef SG_OPENCL_H
#define SG_OPENCL_H

#include "codegen.h"

#if defined(__has_include)
#if __has_include(<CL/cl.h>)
#define SG_HAVE_OPENCL_HEADERS 1
#endif
#endif

#ifdef SG_HAVE_OPENCL_HEADERS
#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 300
#endif
#include <CL/cl.h>

#define SG__OCL_API(X)                                                                             \
    X(clGetPlatformIDs)                                                                            \
    X(clGetDeviceIDs)                                                                              \
    X(clGetDeviceInfo)                                                                             \
    X(clCreateContext)                                                                             \
    X(clCreateProgramWithSource)                                                                   \
    X(clBuildProgram)                                                                              \
    X(clGetProgramBuildInfo)                                                                       \
    X(clReleaseProgram)                                                                            \
    X(clCreateKernel)                                                                              \
    X(clReleaseKernel)                                                                             \
    X(clCreateCommandQueueWithProperties)                                                          \
    X(clReleaseCommandQueue)                                                                       \
    X(clSVMAlloc)                                                                                  \
    X(clSVMFree)                                                                                   \
    X(clSetKernelArgSVMPointer)                                                                    \
    X(clEnqueueNDRangeKernel)                                                                      \
    X(clFinish)

/* The entry points, and the context of the first CPU device, made once per
 * process and kept (the ICD loader has no clean unload). */
typedef struct sg__ocl {
#define X(f) __typeof__(&f) f;
    SG__OCL_API(X)
#undef X
    cl_device_id device;
    cl_context context;
    bool fine_svm; /* fine-grained SVM buffers: the host reads and writes them */
    char device_name[128];
} sg__ocl;

/* The loaded API with its device, or NULL with the reason in why. */
SG__HIDDEN const sg__ocl *sg__ocl_get(char *why, size_t size);
#endif

#endif /* SG_OPENCL_H */
