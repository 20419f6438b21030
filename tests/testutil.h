/* SPDX-License-Identifier: MIT */
/*
 * testutil.h -- the shared test harness: a seeded RNG, random tensors with
 * their values in f64, an independent f64 view of every dtype (its own
 * f16/bf16 conversions, not the library's), closeness checks with
 * tolerances by dtype, and pass/fail counting that ends in the line
 * "N passed, N failed".
 *
 * Every case prints one line naming what it ran, e.g.
 *   ok   ADD(type=f32,a=[2,1,3],b=[3],view=permuted) seed=7
 * so a failure can be re-run by its name and seed.
 */
#ifndef SG_TESTUTIL_H
#define SG_TESTUTIL_H

#include <stepgraph.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

/* RNG: xorshift64*, seeded per case. */
void tu_seed(uint64_t seed);
uint64_t tu_next(void);
double tu_uniform(double lo, double hi);
int64_t tu_randint(int64_t lo, int64_t hi); /* in [lo, hi] */

/* Round a double as the dtype would store it (independent conversions). */
double tu_round(sg_dtype dt, double v);
/* Encode / decode one element of dt at p[i]. */
void tu_store(void *p, sg_dtype dt, int64_t i, double v);
double tu_load(const void *p, sg_dtype dt, int64_t i);

/* A contiguous tensor with uniform values in [lo, hi] (ints: integers in the
 * range; bool: random 0/1); *vals (malloc'd, row-major) gets the stored values. */
sg_tensor *tu_rand(sg_ctx *ctx, sg_dtype dt, int ndim, const int64_t *shape, double lo, double hi,
                   double **vals);

/* How the test lays out its inputs. */
typedef enum tu_layout { TU_CONTIG, TU_PERMUTED, TU_SLICED, TU_NUM_LAYOUTS } tu_layout;
const char *tu_layout_name(tu_layout l);
/* Like tu_rand, but the returned tensor is a non-contiguous view for
 * TU_PERMUTED (a transposed base, viewed back) and TU_SLICED (every other
 * element of a base twice as long in the last dim). The view's values in
 * row-major order land in *vals. Release the returned view; its base is
 * released already (the view keeps it alive). */
sg_tensor *tu_rand_layout(sg_ctx *ctx, sg_dtype dt, int ndim, const int64_t *shape, double lo,
                          double hi, tu_layout layout, double **vals);

/* All of t's elements in row-major order as doubles (malloc'd), or NULL. */
double *tu_read(const sg_tensor *t);

/* Tolerances by dtype: relative and absolute. */
double tu_rtol(sg_dtype dt);
double tu_atol(sg_dtype dt);

/* True when |got - ref| <= atol + rtol * |ref| for all n (NaN matches NaN,
 * inf matches inf of the same sign); prints the worst element otherwise. */
bool tu_close(const char *name, const double *got, const double *ref, int64_t n, double rtol,
              double atol);

/* Shape as "[2,3]" into buf. */
const char *tu_shape(int ndim, const int64_t *shape, char *buf, size_t size);

/* Record a case: ok or FAIL with its name. Returns ok. */
bool tu_case(bool ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A check inside a case; prints the failing expression. */
#define TU_EXPECT(cond)                                                                            \
    ((cond) ? true                                                                                 \
            : (fprintf(stderr, "  expected %s at %s:%d\n", #cond, __FILE__, __LINE__), false))

/* Print "N passed, N failed" and return the exit code (0 when none failed). */
int tu_finish(void);
/* Seconds on the monotonic clock (for the info lines that time a case). */
double tu_now(void);

/* An allocator hook that fails the Nth allocation (1-based; 0: never) and
 * counts live blocks and bytes. */
typedef struct tu_alloc {
    long count;      /* allocations so far */
    long fail_at;    /* fail this one (0: never) */
    long live;       /* blocks not yet freed */
    size_t bytes;    /* bytes not yet freed */
    void *where[16]; /* the call stack of the failed allocation (glibc; else none) */
    int nwhere;
} tu_alloc;
void *tu_alloc_hook(void *user, void *ptr, size_t old_size, size_t new_size);
/* Print where a's failed allocation was asked for (addresses for addr2line). */
void tu_alloc_where(const tu_alloc *a);

/* The backend a test runs its ops on: SG_TEST_BACKEND=cpu (the default) or
 * cuda. The same test executables run under the gpu label with cuda. */
sg_backend tu_backend(void);
/* sg_ctx_create with opts.backend set to tu_backend(). A GPU backend that is
 * unavailable prints why and exits 77 (ctest reports the test skipped); any
 * other failure prints the error and exits 1. */
sg_ctx *tu_ctx(sg_ctx_opts opts);
/* The same on opts.backend as given (a test that needs CUDA beside the CPU). */
sg_ctx *tu_ctx_on(sg_ctx_opts opts);
/* Whether to run the next case of a sweep: every one, or with SG_TEST_EVERY=N
 * the first of every N (the ze variants: each new case there is a new kernel
 * to compile). A run is reproducible under the same N. */
bool tu_sampled(void);

#endif
