/* SPDX-License-Identifier: MIT */
/*
 * cuda_pointwise.c -- the host side of the CUDA elementwise kernels
 * (k_pointwise.cu): it coalesces the output's index space with the
 * operands' broadcast strides, as the CPU kernel does, works out the
 * scalars each op needs in its domain, and picks the layout kernel:
 * sg_pw_vec (one dim, contiguous or broadcast operands, 16-byte aligned),
 * sg_pw_flat (one dim, any strides), else sg_pw_nd32 / sg_pw_nd64.
 *
 * The semantics (domains, NaN rules, saturating casts, one rounding into
 * f16/bf16) live in the kernel and follow graphs/cpu/cpu_pointwise.c.
 */
#include "exec.h"

#ifdef SG_HAVE_CUDA_HEADERS

#include <math.h>

#define MAXOPS 4
#define VEC 8 /* elements a thread in sg_pw_vec (k_pointwise.cu) */

/* The kernel parameter: the same layout as pw_args in k_pointwise.cu. */
typedef struct pw_args {
    void *ptr[MAXOPS];
    int64_t shape[SG_MAX_DIMS];
    int64_t stride[MAXOPS][SG_MAX_DIMS];
    int64_t n;
    int64_t i0, i1;
    uint64_t fill;
    float s0, s1;
    int op, nin, ndim;
    int dt[MAXOPS];
} pw_args;
_Static_assert(sizeof(pw_args) == 344, "pw_args changed: update k_pointwise.cu too");

/* The kernel numbers the pointwise ops from NEG in ops.def's order. */
_Static_assert(SG__OP_FILL - SG__OP_NEG == 37 && SG__OP_WHERE - SG__OP_NEG == 36 &&
                   SG__OP_CAST - SG__OP_NEG == 15 && SG__OP_EQ - SG__OP_NEG == 28,
               "k_pointwise.cu's op enum follows ops.def from NEG to FILL");

/* ------------------------------------------------------------ host scalars */

/* A scalar reaches the kernel already in the domain and rounding the CPU
 * gives it (sg__double_to_int, sg__round_odd, sg__f2h, sg__f2bf). */

/* The bits of one element of dt holding v, as sg_fill_ stores it. */
static uint64_t fill_bits(double v, sg_dtype dt) {
    float f;
    uint32_t u;
    switch (dt) {
    case SG_F32:
        f = (float)v;
        memcpy(&u, &f, 4);
        return u;
    case SG_F16: return sg__f2h(sg__round_odd(v));
    case SG_BF16: return sg__f2bf(sg__round_odd(v));
    case SG_I32: return (uint32_t)(int32_t)sg__double_to_int(v, dt);
    case SG_I64: return (uint64_t)sg__double_to_int(v, dt);
    case SG_BOOL: return v != 0.0;
    }
    return 0;
}

/* ------------------------------------------------------------ layout */

/* True when every operand of a one-dim op is contiguous or broadcast and
 * the contiguous ones start on their chunk's alignment (sg_pw_vec). */
static bool vec_ok(const pw_args *a, int nops) {
    if (a->ndim > 1 || a->n < VEC) return false;
    for (int k = 0; k < nops; k++) {
        int64_t s = a->ndim ? a->stride[k][0] : 0;
        if (k == 0 && s != 1) return false;
        if (s != 0 && s != 1) return false;
        size_t chunk = VEC * sg_dtype_size(a->dt[k]), align = chunk < 16 ? chunk : 16;
        if (s == 1 && (uintptr_t)a->ptr[k] % align != 0) return false;
    }
    return true;
}

/* True when every index and element offset fits an int (sg_pw_nd32). The
 * grid-stride loop may step past n by one grid, hence the margin. */
static bool fits_32(const pw_args *a, int nops) {
    const int64_t lim = (int64_t)1 << 30;
    if (a->n >= lim) return false;
    for (int k = 0; k < nops; k++) {
        int64_t hi = 0;
        for (int d = 0; d < a->ndim; d++) hi += (a->shape[d] - 1) * a->stride[k][d];
        if (hi >= lim) return false;
    }
    return true;
}

/* The grid for `work` items of a grid-stride loop: enough blocks to fill
 * every SM a few times over, no more. */
static void grid_for(sg_ctx *ctx, int64_t work, unsigned grid[3], unsigned block[3]) {
    int64_t blocks = (work + 255) / 256, cap = (int64_t)sg__cuda_sm_count(ctx) * 8;
    if (cap < 1) cap = 1;
    grid[0] = (unsigned)(blocks < cap ? blocks : cap);
    grid[1] = grid[2] = 1;
    block[0] = 256;
    block[1] = block[2] = 1;
}

/* ------------------------------------------------------------ the family */

sg_status sg__cuda_pointwise(sg_ctx *ctx, const sg__node *n) {
    const sg_tensor *out = n->out;
    int nops = 1 + n->nin;
    bool pw = (n->op >= SG__OP_NEG && n->op <= SG__OP_FILL) || n->op == SG__OP_GELU_TANH_BWD;
    if (!pw || nops > MAXOPS)
        return sg__fail(ctx, SG_ERR_INTERNAL,
                        "cuda: %s is not a pointwise op with at most 3 "
                        "inputs",
                        sg__op_name(n->op));
    int64_t numel = sg__numel(out->ndim, out->shape);
    if (numel == 0) return SG_OK;
    pw_args a;
    memset(&a, 0, sizeof a);
    for (int k = 0; k < nops; k++) {
        const sg_tensor *t = k == 0 ? out : n->in[k - 1];
        a.ptr[k] = sg__data(t);
        a.dt[k] = (int)t->dtype;
        sg__broadcast_strides(t, out->ndim, out->shape, a.stride[k]);
    }
    memcpy(a.shape, out->shape, sizeof(int64_t) * (size_t)out->ndim);
    a.ndim = sg__coalesce_dims(out->ndim, a.shape, nops, a.stride);
    a.n = numel;
    /* GELU_TANH_BWD follows FILL in the kernel's numbering. */
    a.op = n->op == SG__OP_GELU_TANH_BWD ? SG__OP_FILL - SG__OP_NEG + 1 : (int)(n->op - SG__OP_NEG);
    a.nin = n->nin;
    /* Scalars in the domain of the op's first input, as the CPU takes them. */
    sg_dtype d0 = n->nin > 0 ? n->in[0]->dtype : out->dtype;
    a.s0 = (float)n->f[0];
    a.s1 = (float)n->f[1];
    if (!sg__dtype_is_float(d0)) {
        a.i0 = sg__double_to_int(n->f[0], d0);
        a.i1 = sg__double_to_int(n->f[1], d0);
    }
    if (n->op == SG__OP_FILL) a.fill = fill_bits(n->f[0], out->dtype);

    const char *name;
    int64_t work = numel;
    if (vec_ok(&a, nops)) {
        name = "sg_pw_vec";
        work = numel / VEC > 0 ? numel / VEC : 1;
    } else if (a.ndim <= 1) {
        name = "sg_pw_flat";
    } else {
        name = fits_32(&a, nops) ? "sg_pw_nd32" : "sg_pw_nd64";
    }
    if (a.ndim == 0) a.shape[0] = 1; /* a 0-d op: one element, strides 0 */
    void *f;
    sg_status s = sg__cuda_kernel(ctx, SG__CU_POINTWISE, name, &f);
    if (s != SG_OK) return s;
    unsigned grid[3], block[3];
    grid_for(ctx, work, grid, block);
    void *args[1] = {&a};
    return sg__cuda_launch(ctx, f, grid, block, 0, args);
}

#endif /* SG_HAVE_CUDA_HEADERS */
