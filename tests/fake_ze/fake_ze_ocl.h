/* SPDX-License-Identifier: MIT */
/*
 * fake_ze_ocl.h -- the fake Level Zero driver's second mode (fake_ze_ocl.c):
 * with FAKE_ZE_OPENCL naming an OpenCL CPU runtime's library (Intel's
 * libintelocl.so), device memory is that runtime's shared USM, modules are
 * its programs built from the SPIR-V, and launches run the real kernels on
 * its in-order queue. Internal to the driver.
 */
#ifndef FAKE_ZE_OCL_H
#define FAKE_ZE_OCL_H

#include "fake_ze.h"

/* Whether FAKE_ZE_OPENCL asks for the OpenCL mode. */
int fzo_wanted(void);
/* Load the runtime and make its context and queue (once): 0, or -1 with
 * the reason printed to stderr. */
int fzo_init(void);
/* USM of size bytes (host: 1 for host USM, 0 for shared), or NULL. */
void *fzo_alloc(size_t size, size_t align, int host);
void fzo_free(void *p);
/* A program built from SPIR-V: 0 and *prog, or -1 with the build log in
 * log (size bytes). */
int fzo_program(const void *il, size_t n, void **prog, char *log, size_t size);
void fzo_program_free(void *prog);
/* The kernel `name` of a program, or NULL. */
void *fzo_kernel(void *prog, const char *name);
void fzo_kernel_free(void *kernel);
/* Enqueue one launch: the arguments as recorded (those in null_mask are
 * local memory of their size), groups x group size work-items. 0 or -1. */
int fzo_launch(void *kernel, const fake_ze_launch *l, unsigned null_mask);
/* Wait for everything enqueued: 0 or -1. */
int fzo_finish(void);

#endif /* FAKE_ZE_OCL_H */
