/* SPDX-License-Identifier: MIT */
/*
 * testutil.c -- see testutil.h. The dtype conversions here are written
 * apart from the library's so that a wrong conversion there shows up.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef __GLIBC__
#include <execinfo.h>
#endif

static uint64_t rng_state = 88172645463325252ull;
static int passed, failed;

void tu_seed(uint64_t seed) { rng_state = seed * 2654435761ull + 0x9e3779b97f4a7c15ull; }

uint64_t tu_next(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 2685821657736338717ull;
}

double tu_uniform(double lo, double hi) {
    return lo + (hi - lo) * ((double)(tu_next() >> 11) / 9007199254740992.0);
}

int64_t tu_randint(int64_t lo, int64_t hi) {
    return lo + (int64_t)(tu_next() % (uint64_t)(hi - lo + 1));
}

/* Round to a float format with `mant` stored mantissa bits and minimum normal
 * exponent emin, max finite value maxv, by arithmetic on doubles. */
static double round_to(double v, int mant, int emin, double maxv) {
    if (v != v || v == 0.0 || isinf(v)) return v;
    double a = fabs(v);
    int e;
    frexp(a, &e); /* a = f * 2^e, f in [0.5, 1) */
    e -= 1;       /* a = g * 2^e, g in [1, 2) */
    if (e < emin) e = emin;
    double q = ldexp(1.0, e - mant); /* spacing of representable values */
    double r = nearbyint(a / q) * q; /* ties to even under the default rounding mode */
    if (r > maxv) {
        /* Values at or beyond max + half a step overflow to inf. */
        double step = ldexp(1.0, (int)floor(log2(maxv)) - mant);
        r = a >= maxv + step / 2 ? INFINITY : maxv;
    }
    return v < 0 ? -r : r;
}

double tu_round(sg_dtype dt, double v) {
    switch (dt) {
    case SG_F32: return (double)(float)v;
    case SG_F16: return round_to(v, 10, -14, 65504.0);
    case SG_BF16: return round_to(v, 7, -126, 3.3895313892515355e38);
    case SG_I32: return (double)(int32_t)v;
    case SG_I64: return (double)(int64_t)v;
    case SG_BOOL: return v != 0.0;
    }
    return v;
}

static uint16_t encode_small(double v, int mant, int ebits) {
    /* v is already representable: build the bits field by field. */
    int bias = (1 << (ebits - 1)) - 1;
    uint16_t sign = signbit(v) ? (uint16_t)(1u << 15) : 0;
    double a = fabs(v);
    if (a != a) return (uint16_t)(sign | (((1u << ebits) - 1) << mant) | (1u << (mant - 1)));
    if (isinf(a)) return (uint16_t)(sign | (((1u << ebits) - 1) << mant));
    if (a == 0) return sign;
    int e;
    double f = frexp(a, &e);
    e -= 1;
    if (e < 1 - bias) { /* subnormal */
        uint32_t m = (uint32_t)nearbyint(a / ldexp(1.0, 1 - bias - mant));
        return (uint16_t)(sign | m);
    }
    uint32_t m = (uint32_t)nearbyint((f * 2 - 1) * (double)(1u << mant));
    return (uint16_t)(sign | ((uint32_t)(e + bias) << mant) | m);
}

static double decode_small(uint16_t h, int mant, int ebits) {
    int bias = (1 << (ebits - 1)) - 1;
    int e = (h >> mant) & ((1 << ebits) - 1);
    int m = h & ((1 << mant) - 1);
    double v;
    if (e == 0)
        v = ldexp((double)m, 1 - bias - mant);
    else if (e == (1 << ebits) - 1)
        v = m ? NAN : INFINITY;
    else
        v = ldexp(1.0 + (double)m / (double)(1 << mant), e - bias);
    return (h >> 15) ? -v : v;
}

void tu_store(void *p, sg_dtype dt, int64_t i, double v) {
    v = tu_round(dt, v);
    switch (dt) {
    case SG_F32: ((float *)p)[i] = (float)v; break;
    case SG_F16: ((uint16_t *)p)[i] = encode_small(v, 10, 5); break;
    case SG_BF16: ((uint16_t *)p)[i] = encode_small(v, 7, 8); break;
    case SG_I32: ((int32_t *)p)[i] = (int32_t)v; break;
    case SG_I64: ((int64_t *)p)[i] = (int64_t)v; break;
    case SG_BOOL: ((uint8_t *)p)[i] = v != 0; break;
    }
}

double tu_load(const void *p, sg_dtype dt, int64_t i) {
    switch (dt) {
    case SG_F32: return ((const float *)p)[i];
    case SG_F16: return decode_small(((const uint16_t *)p)[i], 10, 5);
    case SG_BF16: return decode_small(((const uint16_t *)p)[i], 7, 8);
    case SG_I32: return ((const int32_t *)p)[i];
    case SG_I64: return (double)((const int64_t *)p)[i];
    case SG_BOOL: return ((const uint8_t *)p)[i] ? 1.0 : 0.0;
    }
    return 0;
}

static int64_t numel_of(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    return n;
}

sg_tensor *tu_rand(sg_ctx *ctx, sg_dtype dt, int ndim, const int64_t *shape, double lo, double hi,
                   double **vals) {
    int64_t n = numel_of(ndim, shape);
    size_t es = sg_dtype_size(dt);
    void *buf = malloc((size_t)(n ? n : 1) * es);
    double *v = malloc((size_t)(n ? n : 1) * sizeof(double));
    for (int64_t i = 0; i < n; i++) {
        double x = dt == SG_BOOL                  ? (double)(tu_next() & 1)
                   : dt == SG_I32 || dt == SG_I64 ? (double)tu_randint((int64_t)lo, (int64_t)hi)
                                                  : tu_uniform(lo, hi);
        tu_store(buf, dt, i, x);
        v[i] = tu_load(buf, dt, i);
    }
    sg_tensor *t = sg_from_host(ctx, dt, ndim, shape, buf);
    free(buf);
    if (vals)
        *vals = v;
    else
        free(v);
    return t;
}

const char *tu_layout_name(tu_layout l) {
    return l == TU_CONTIG ? "contig" : l == TU_PERMUTED ? "permuted" : "sliced";
}

sg_tensor *tu_rand_layout(sg_ctx *ctx, sg_dtype dt, int ndim, const int64_t *shape, double lo,
                          double hi, tu_layout layout, double **vals) {
    if (layout == TU_CONTIG || ndim == 0) return tu_rand(ctx, dt, ndim, shape, lo, hi, vals);
    int64_t bshape[SG_MAX_DIMS];
    double *bv = NULL;
    sg_tensor *base, *view;
    if (layout == TU_PERMUTED) {
        /* base holds the reversed shape; permuting it back gives shape with
         * reversed strides. The values in view order are a transpose of bv. */
        int perm[SG_MAX_DIMS];
        for (int d = 0; d < ndim; d++) {
            bshape[d] = shape[ndim - 1 - d];
            perm[d] = ndim - 1 - d;
        }
        base = tu_rand(ctx, dt, ndim, bshape, lo, hi, &bv);
        view = sg_permute(base, perm);
    } else {
        for (int d = 0; d < ndim; d++) bshape[d] = shape[d];
        bshape[ndim - 1] = shape[ndim - 1] * 2;
        base = tu_rand(ctx, dt, ndim, bshape, lo, hi, &bv);
        view = sg_slice(base, ndim - 1, 0, bshape[ndim - 1], 2);
    }
    sg_release(base);
    if (vals) {
        /* The view's values in its row-major order, computed from the base's
         * values by index arithmetic (not through the library). */
        int64_t n = numel_of(ndim, shape), idx[SG_MAX_DIMS];
        double *v = malloc((size_t)(n ? n : 1) * sizeof(double));
        for (int64_t i = 0; i < n; i++) {
            int64_t r = i, src = 0;
            for (int d = ndim - 1; d >= 0; d--) {
                idx[d] = r % shape[d];
                r /= shape[d];
            }
            for (int d = 0; d < ndim; d++) {
                int bd = layout == TU_PERMUTED ? ndim - 1 - d : d;
                int64_t bi =
                    layout == TU_PERMUTED ? idx[bd] : (d == ndim - 1 ? 2 * idx[d] : idx[d]);
                src = src * bshape[d] + bi;
            }
            v[i] = bv[src];
        }
        *vals = v;
    }
    free(bv);
    return view;
}

double *tu_read(const sg_tensor *t) {
    int64_t n = sg_tensor_numel(t);
    sg_dtype dt = sg_tensor_dtype(t);
    size_t es = sg_dtype_size(dt);
    void *buf = malloc((size_t)(n ? n : 1) * es);
    if (sg_read(t, buf, (size_t)n * es) != SG_OK) {
        free(buf);
        return NULL;
    }
    double *v = malloc((size_t)(n ? n : 1) * sizeof(double));
    for (int64_t i = 0; i < n; i++) v[i] = tu_load(buf, dt, i);
    free(buf);
    return v;
}

double tu_rtol(sg_dtype dt) {
    switch (dt) {
    case SG_F32: return 1e-5;
    case SG_F16:
    case SG_BF16: return 1e-2;
    default: return 0;
    }
}

double tu_atol(sg_dtype dt) {
    switch (dt) {
    case SG_F32: return 1e-6;
    case SG_F16: return 1e-3;
    case SG_BF16: return 1e-2;
    default: return 0;
    }
}

bool tu_close(const char *name, const double *got, const double *ref, int64_t n, double rtol,
              double atol) {
    int64_t worst = -1;
    double worst_excess = 0;
    for (int64_t i = 0; i < n; i++) {
        double g = got[i], r = ref[i];
        if (r != r) {
            if (g == g) {
                worst = i;
                break;
            }
            continue;
        }
        if (isinf(r)) {
            if (g != r) {
                worst = i;
                break;
            }
            continue;
        }
        double err = fabs(g - r), lim = atol + rtol * fabs(r);
        if (!(err <= lim) && (worst < 0 || err - lim > worst_excess)) {
            worst = i;
            worst_excess = err - lim;
        }
    }
    if (worst >= 0)
        fprintf(stderr, "  %s: element %lld is %.9g, expected %.9g (rtol %g, atol %g)\n", name,
                (long long)worst, got[worst], ref[worst], rtol, atol);
    return worst < 0;
}

const char *tu_shape(int ndim, const int64_t *shape, char *buf, size_t size) {
    size_t k = (size_t)snprintf(buf, size, "[");
    for (int d = 0; d < ndim && k < size; d++)
        k += (size_t)snprintf(buf + k, size - k, d ? ",%lld" : "%lld", (long long)shape[d]);
    if (k < size) snprintf(buf + k, size - k, "]");
    return buf;
}

bool tu_case(bool ok, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("%s ", ok ? "ok  " : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    if (ok)
        passed++;
    else
        failed++;
    fflush(stdout);
    return ok;
}

/* The library's count of captures whose CUDA unit failed NVRTC under
 * SG_NVRTC_CHECK=1 (graphs/graphs.h). */
uint64_t sg__cuda_check_failures(void);
/* The same for SG_OPENCL_CHECK=1: dialect 3 is SG__DIALECT_OPENCL. */
uint64_t sg__dialect_check_count(int dialect, int what);
/* Whether SG_HIPRTC_CHECK=1 found no hiprtc (graphs/graphs.h). */
bool sg__hiprtc_check_skipped(void);

int tu_finish(void) {
    const char *chk = getenv("SG_NVRTC_CHECK");
    if (chk && strcmp(chk, "1") == 0) {
        uint64_t nf = sg__cuda_check_failures();
        tu_case(nf == 0,
                "SG_NVRTC_CHECK: every capture's CUDA unit compiled by NVRTC for sm_90 "
                "(%llu failed)",
                (unsigned long long)nf);
    }
    chk = getenv("SG_OPENCL_CHECK");
    if (chk && strcmp(chk, "1") == 0) {
        /* graphs.h's sg__check_what: built, failed, unsupported groups, unavailable */
        uint64_t built = sg__dialect_check_count(3, 0), nf = sg__dialect_check_count(3, 1);
        uint64_t nun = sg__dialect_check_count(3, 2), none = sg__dialect_check_count(3, 3);
        if (none && !built && !nf) {
            printf("SG_OPENCL_CHECK: no OpenCL CPU device (ICD) here: nothing checked, skipped\n");
            printf("%d passed, %d failed\n", passed, failed);
            return failed ? 1 : 77;
        }
        tu_case(nf == 0 && (built > 0 || none == 0),
                "SG_OPENCL_CHECK: every capture's OpenCL C unit built on the OpenCL CPU device "
                "(%llu built, %llu failed, %llu groups not in the dialect)",
                (unsigned long long)built, (unsigned long long)nf, (unsigned long long)nun);
    }
    const char *hchk = getenv("SG_HIPRTC_CHECK");
    if (hchk && strcmp(hchk, "1") == 0) {
        uint64_t nf = sg__cuda_check_failures();
        if (nf == 0 && failed == 0 && sg__hiprtc_check_skipped()) {
            printf("SKIP: SG_HIPRTC_CHECK: hiprtc is absent (%d cases passed)\n", passed);
            return 77;
        }
        tu_case(nf == 0,
                "SG_HIPRTC_CHECK: every capture's CUDA unit compiled by hiprtc for gfx90a "
                "(%llu failed)",
                (unsigned long long)nf);
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}

void *tu_alloc_hook(void *user, void *ptr, size_t old_size, size_t new_size) {
    tu_alloc *a = user;
    if (new_size == 0) {
        if (ptr) {
            a->live--;
            a->bytes -= old_size;
        }
        free(ptr);
        return NULL;
    }
    a->count++;
    if (a->fail_at && a->count == a->fail_at) {
#ifdef __GLIBC__
        a->nwhere = backtrace(a->where, 16);
#endif
        return NULL;
    }
    void *p = malloc(new_size);
    if (p) {
        a->live++;
        a->bytes += new_size;
    }
    return p;
}

void tu_alloc_where(const tu_alloc *a) {
    fprintf(stderr, "  the failed allocation was asked for at:\n");
#ifdef __GLIBC__
    backtrace_symbols_fd((void *const *)a->where, a->nwhere, 2);
#endif
}

sg_backend tu_backend(void) {
    const char *b = getenv("SG_TEST_BACKEND");
    if (!b || !*b || strcmp(b, "cpu") == 0) return SG_BACKEND_CPU;
    if (strcmp(b, "cuda") == 0) return SG_BACKEND_CUDA;
    if (strcmp(b, "hip") == 0) return SG_BACKEND_HIP;
    if (strcmp(b, "ze") == 0) return SG_BACKEND_ZE;
    fprintf(stderr, "SG_TEST_BACKEND=%s: expected cpu, cuda, hip or ze\n", b);
    exit(1);
}

/* Whether libocloc loads (codegen/codegen.h): the ze backend compiles every
 * op with it. */
sg_status sg__ocloc_probe(char *why, size_t n);

sg_ctx *tu_ctx(sg_ctx_opts opts) {
    opts.backend = tu_backend();
    return tu_ctx_on(opts);
}

sg_ctx *tu_ctx_on(sg_ctx_opts opts) {
    char why[512];
    if (opts.backend == SG_BACKEND_ZE && sg__ocloc_probe(why, sizeof why) != SG_OK) {
        fprintf(stderr, "skip: the ze backend compiles every op with libocloc: %s\n", why);
        exit(77);
    }
    sg_ctx *ctx = NULL;
    sg_status s = sg_ctx_create(&opts, &ctx);
    if (s == SG_OK) return ctx;
    fprintf(stderr, "sg_ctx_create(%s): %s: %s\n", sg_backend_name(opts.backend), sg_status_str(s),
            sg_last_error(NULL));
    exit(s == SG_ERR_BACKEND_UNAVAILABLE && opts.backend != SG_BACKEND_CPU ? 77 : 1);
}

bool tu_sampled(void) {
    static long every = -1, n;
    if (every < 0) {
        const char *e = getenv("SG_TEST_EVERY");
        every = e && atol(e) > 1 ? atol(e) : 1;
    }
    return n++ % every == 0;
}

double tu_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}
