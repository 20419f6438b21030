/* SPDX-License-Identifier: MIT */
/*
 * cpu.h -- the internal header of the CPU backend: element conversion
 * (f16/bf16 <-> f32), strided gathers and scatters into small typed tiles,
 * the row iterator every kernel family uses, and the family entry points.
 *
 * Every eager kernel works the same way: walk the output in rows (its last
 * dim), cut each row into tiles of SG__TILE elements, gather each input's
 * tile into a contiguous float or int64 buffer, compute there, and scatter
 * the result. Compute domains: floats in float (f16/bf16 widened), integers
 * and bools in int64. The per-op switch runs once per tile, not per element.
 */
#ifndef SG_CPU_H
#define SG_CPU_H

#include "../backend.h"

#include <math.h>

#define SG__TILE 256

/* ------------------------------------------------------------ element access */

/* f16 to f32 without a loop or a data-dependent branch the compiler cannot
 * turn into selects (a subnormal comes out of one exact f32 subtraction),
 * so that a run of them vectorizes; the same values as sg__h2f, NaN
 * payloads included (test_graphs_convert checks all 65536). */
static inline float sg__h2f_sel(uint16_t h) {
    const uint32_t exp_mask = 0x7c00u << 13;
    uint32_t o = ((uint32_t)h & 0x7fffu) << 13, e = o & exp_mask;
    o += (127u - 15u) << 23;
    float f;
    if (e == exp_mask) { /* inf, NaN */
        o += (128u - 16u) << 23;
    } else if (e == 0) { /* zero, subnormal: (1.m - 1) * 2^-14 */
        o += 1u << 23;
        memcpy(&f, &o, 4);
        f -= 6.103515625e-05f;
        memcpy(&o, &f, 4);
    }
    o |= ((uint32_t)h & 0x8000u) << 16;
    memcpy(&f, &o, 4);
    return f;
}

/* Read element i (stride in elements) of a typed array as float / int64. */
static inline float sg__ldf(const void *p, sg_dtype dt, int64_t i) {
    switch (dt) {
    case SG_F32: return ((const float *)p)[i];
    case SG_F16: return sg__h2f(((const uint16_t *)p)[i]);
    case SG_BF16: return sg__bf2f(((const uint16_t *)p)[i]);
    case SG_I32: return (float)((const int32_t *)p)[i];
    case SG_I64: return (float)((const int64_t *)p)[i];
    case SG_BOOL: return ((const uint8_t *)p)[i] ? 1.0f : 0.0f;
    }
    return 0.0f;
}

static inline int64_t sg__ldi(const void *p, sg_dtype dt, int64_t i) {
    switch (dt) {
    case SG_F32: return (int64_t)((const float *)p)[i];
    case SG_F16: return (int64_t)sg__h2f(((const uint16_t *)p)[i]);
    case SG_BF16: return (int64_t)sg__bf2f(((const uint16_t *)p)[i]);
    case SG_I32: return ((const int32_t *)p)[i];
    case SG_I64: return ((const int64_t *)p)[i];
    case SG_BOOL: return ((const uint8_t *)p)[i] != 0;
    }
    return 0;
}

static inline void sg__stf(void *p, sg_dtype dt, int64_t i, float v) {
    switch (dt) {
    case SG_F32: ((float *)p)[i] = v; break;
    case SG_F16: ((uint16_t *)p)[i] = sg__f2h(v); break;
    case SG_BF16: ((uint16_t *)p)[i] = sg__f2bf(v); break;
    /* Out-of-range float to int is undefined in C: saturate like a cast should. */
    case SG_I32:
        ((int32_t *)p)[i] = v != v ? 0 : v >= 2147483647.0f ? INT32_MAX
                          : v <= -2147483648.0f ? INT32_MIN : (int32_t)v;
        break;
    case SG_I64:
        ((int64_t *)p)[i] = v != v ? 0 : v >= 9.2233720e18f ? INT64_MAX
                          : v <= -9.2233720e18f ? INT64_MIN : (int64_t)v;
        break;
    case SG_BOOL: ((uint8_t *)p)[i] = v != 0.0f; break;
    }
}

static inline void sg__sti(void *p, sg_dtype dt, int64_t i, int64_t v) {
    switch (dt) {
    case SG_F32: ((float *)p)[i] = (float)v; break;
    case SG_F16: ((uint16_t *)p)[i] = sg__f2h((float)v); break;
    case SG_BF16: ((uint16_t *)p)[i] = sg__f2bf((float)v); break;
    case SG_I32: ((int32_t *)p)[i] = (int32_t)v; break;
    case SG_I64: ((int64_t *)p)[i] = v; break;
    case SG_BOOL: ((uint8_t *)p)[i] = v != 0; break;
    }
}

/* Gather n elements p[0], p[s], p[2s], ... into a float / int64 tile. */
SG__HIDDEN void sg__gather_f(const void *p, sg_dtype dt, int64_t s, int n, float *out);
SG__HIDDEN void sg__gather_i(const void *p, sg_dtype dt, int64_t s, int n, int64_t *out);
SG__HIDDEN void sg__scatter_f(void *p, sg_dtype dt, int64_t s, int n, const float *in);
SG__HIDDEN void sg__scatter_i(void *p, sg_dtype dt, int64_t s, int n, const int64_t *in);

/* A typed pointer to element `off` (in elements) of tensor data. */
static inline void *sg__at(void *base, sg_dtype dt, int64_t off) {
    return (char *)base + off * (int64_t)sg_dtype_size(dt);
}

/* ------------------------------------------------------------ row iteration */

/*
 * Rows of an n-d index space: every index of dims 0..ndim-2, in row-major
 * order, with the element offset of that row's first element in each of
 * nops operands. The row length is shape[ndim-1] (1 for ndim 0).
 */
#define SG__MAX_OPS 4
typedef struct sg__rows {
    int ndim, nops;
    int64_t shape[SG_MAX_DIMS];
    int64_t stride[SG__MAX_OPS][SG_MAX_DIMS];
    int64_t nrows, rowlen;
} sg__rows;

SG__HIDDEN void sg__rows_init(sg__rows *r, int ndim, const int64_t *shape, int nops);
/* The offsets of row `row` in each operand (base offsets added by the caller). */
SG__HIDDEN void sg__rows_offsets(const sg__rows *r, int64_t row, int64_t *off);

/* The number of threads for an op over `work` elements (1 when small). */
SG__HIDDEN int sg__cpu_threads(const sg_ctx *ctx, int64_t work);

/* ------------------------------------------------------------ families */

SG__HIDDEN sg_status sg__cpu_pointwise(sg_ctx *ctx, const sg__node *n);
SG__HIDDEN sg_status sg__cpu_reduce(sg_ctx *ctx, const sg__node *n);
SG__HIDDEN sg_status sg__cpu_row(sg_ctx *ctx, const sg__node *n);
SG__HIDDEN sg_status sg__cpu_matmul(sg_ctx *ctx, const sg__node *n);
SG__HIDDEN sg_status sg__cpu_data(sg_ctx *ctx, const sg__node *n);
SG__HIDDEN sg_status sg__cpu_attn(sg_ctx *ctx, const sg__node *n);

/* Random numbers (cpu_random.c): one Philox 4x32-10 block, and the RAND op. */
SG__HIDDEN void sg__philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);
SG__HIDDEN sg_status sg__cpu_rand(sg_ctx *ctx, const sg__node *n);
/* Sampling (cpu_sample.c): TOPK and SAMPLE. */
SG__HIDDEN sg_status sg__cpu_topk(sg_ctx *ctx, const sg__node *n);
SG__HIDDEN sg_status sg__cpu_sample(sg_ctx *ctx, const sg__node *n);

#endif /* SG_CPU_H */
