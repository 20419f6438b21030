/* SPDX-License-Identifier: MIT */
/*
 * fake_ze.h -- what a test sees of the fake Level Zero driver (fake_ze.c):
 * the log of the calls the driver received, the kernel launches it ran,
 * and kernels a test runs in C by name. The driver is a shared library the
 * real loader takes through ZE_ENABLE_ALT_DRIVERS; a test reaches these
 * functions with dlopen(path, RTLD_NOLOAD) and dlsym.
 */
#ifndef FAKE_ZE_H
#define FAKE_ZE_H

#include <stddef.h>
#include <stdint.h>

#define FAKE_ZE_MAX_ARGS 16

/* One launch as the device ran it: the kernel's name, the work-group
 * counts and size, and the argument values as set when it was appended. */
typedef struct fake_ze_launch {
    char name[96];
    uint32_t groups[3], gsize[3];
    int nargs;
    size_t size[FAKE_ZE_MAX_ARGS];
    unsigned char value[FAKE_ZE_MAX_ARGS][16];
} fake_ze_launch;

typedef void (*fake_ze_kernel_fn)(const fake_ze_launch *l);

/* Run fn for every launch of kernel `name` (device memory is host memory). */
typedef void (*fake_ze_register_fn)(const char *name, fake_ze_kernel_fn fn);
/* The calls received since the last clear, one name a line. */
typedef const char *(*fake_ze_calls_fn)(void);
typedef void (*fake_ze_clear_fn)(void);
/* The launches run since the last clear, and the one at i. */
typedef int (*fake_ze_nlaunches_fn)(void);
typedef const fake_ze_launch *(*fake_ze_launch_at_fn)(int i);
/* Device allocations not freed. */
typedef long (*fake_ze_live_fn)(void);

#endif /* FAKE_ZE_H */
