/* SPDX-License-Identifier: MIT */
/*
 * test_capture_grad_opmath.c -- the gradients of bf16 and f16 pointwise ops
 * whose rule is a formula of several ops (gelu, gelu_tanh, silu, sigmoid,
 * tanh, sin, cos, rsqrt, pow_scalar, div, pow) are rounded once: each
 * element is within one rounding of the f64 formula evaluated on the same
 * stored values (x, the stored output where the rule reads it, and g), eager
 * and in a compiled step. Rounding every op of the formula (19 roundings for
 * gelu_tanh) misses that bound.
 *
 * loss = sum(f(x) * r) with r random in the dtype, so g = r exactly.
 */
#include "testutil.h"

#include <math.h>
#include <string.h>

enum { GELU, GELU_TANH, SILU, SIGMOID, TANH, SIN, COS, RSQRT, POW3, DIV, POW, NOPS };

static const char *const names[NOPS] = {"gelu",        "gelu_tanh", "silu", "sigmoid",
                                        "tanh",        "sin",       "cos",  "rsqrt",
                                        "pow_scalar3", "div",       "pow"};

#define ROWS 4
#define COLS 259
#define N (ROWS * COLS)

static sg_ctx *ctx;

typedef struct tcase {
    int op;
    sg_tensor *x, *y, *r; /* y: the second operand of div and pow */
} tcase;

static sg_tensor *forward(int op, sg_tensor *x, sg_tensor *y) {
    switch (op) {
    case GELU: return sg_gelu(x);
    case GELU_TANH: return sg_gelu_tanh(x);
    case SILU: return sg_silu(x);
    case SIGMOID: return sg_sigmoid(x);
    case TANH: return sg_tanh(x);
    case SIN: return sg_sin(x);
    case COS: return sg_cos(x);
    case RSQRT: return sg_rsqrt(x);
    case POW3: return sg_pow_scalar(x, 3.0);
    case DIV: return sg_div(x, y);
    default: return sg_pow(x, y);
    }
}

/* out: f(x), dx and (div, pow) dy. */
static sg_status step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)c, (void)in;
    const tcase *t = user;
    bool two = t->op == DIV || t->op == POW;
    sg_tensor *wrt[2] = {t->x, t->y};
    out[0] = forward(t->op, t->x, t->y);
    sg_tensor *fr = sg_mul(out[0], t->r);
    sg_tensor *loss = sg_sum(fr, 0, NULL, false);
    sg_status s = sg_grad(loss, two ? 2 : 1, wrt, out + 1);
    sg_release(fr), sg_release(loss);
    return s;
}

/* The f64 gradient(s) of element i from the stored x, y, output o and g. */
static void reference(int op, double x, double y, double o, double g, double *dx, double *dy) {
    const double c = 0.7978845608028654, k = 0.044715;
    double s = 1.0 / (1.0 + exp(-x)), u = c * (x + k * x * x * x), th = tanh(u);
    *dy = 0;
    switch (op) {
    case GELU:
        *dx = g * (0.5 * (1 + erf(x / sqrt(2.0))) + x * exp(-0.5 * x * x) * 0.3989422804014327);
        break;
    case GELU_TANH:
        *dx = g * (0.5 * (1 + th) + 0.5 * x * (1 - th * th) * c * (1 + 3 * k * x * x));
        break;
    case SILU: *dx = g * s * (1 + x * (1 - s)); break;
    case SIGMOID: *dx = g * o * (1 - o); break;
    case TANH: *dx = g * (1 - o * o); break;
    case SIN: *dx = g * cos(x); break;
    case COS: *dx = -g * sin(x); break;
    case RSQRT: *dx = g * -0.5 * o * o * o; break;
    case POW3: *dx = g * 3 * x * x; break;
    case DIV:
        *dx = g / y;
        *dy = -g * o / y;
        break;
    default:
        *dx = g * y * pow(x, y - 1);
        *dy = g * o * log(x);
        break;
    }
}

/*
 * Within one rounding: |got - ref| <= u |ref| (u = 2^-8 for bf16, 2^-11 for
 * f16; a hair more for the f32 formula and its transcendental functions)
 * plus u/64 of the largest |ref| for the f32 cancellations near a zero.
 */
static bool once(const char *what, const double *got, const double *ref, sg_dtype dt) {
    double u = dt == SG_BF16 ? 0x1p-8 : 0x1p-11, big = 0;
    for (int64_t i = 0; i < N; i++) big = fabs(ref[i]) > big ? fabs(ref[i]) : big;
    return tu_close(what, got, ref, N, u * 1.01, u / 64 * big);
}

static bool check(const tcase *t, sg_tensor *const *out, sg_dtype dt) {
    bool two = t->op == DIV || t->op == POW;
    double *xv = tu_read(t->x), *yv = two ? tu_read(t->y) : NULL, *rv = tu_read(t->r);
    double *ov = tu_read(out[0]), *gx = tu_read(out[1]), *gy = two ? tu_read(out[2]) : NULL;
    double *rx = malloc(sizeof(double) * N), *ry = malloc(sizeof(double) * N);
    bool ok = TU_EXPECT(xv && rv && ov && gx && rx && ry) && TU_EXPECT(!two || (yv && gy)) &&
              TU_EXPECT(sg_tensor_dtype(out[1]) == dt);
    for (int64_t i = 0; ok && i < N; i++)
        reference(t->op, xv[i], two ? yv[i] : 0, ov[i], rv[i], &rx[i], &ry[i]);
    ok = ok && once("dx", gx, rx, dt);
    if (two) ok = ok && once("dy", gy, ry, dt);
    free(xv), free(yv), free(rv), free(ov), free(gx), free(gy), free(rx), free(ry);
    return ok;
}

static void run_case(int op, sg_dtype dt, bool compiled, uint64_t seed) {
    static const int64_t shape[2] = {ROWS, COLS};
    bool two = op == DIV || op == POW;
    double lo = op == RSQRT ? 0.25 : op == POW ? 0.5 : -3, hi = op == RSQRT ? 4 : op == POW ? 2 : 3;
    tu_seed(seed);
    tcase t = {.op = op};
    t.x = tu_rand(ctx, dt, 2, shape, lo, hi, NULL);
    t.y = two ? tu_rand(ctx, dt, 2, shape, op == POW ? -2 : 0.5, 2, NULL) : NULL;
    t.r = tu_rand(ctx, dt, 2, shape, -1, 1, NULL);
    bool ok = TU_EXPECT(t.x && t.r && (!two || t.y)) &&
              TU_EXPECT(sg_requires_grad_(t.x, true) == SG_OK) &&
              TU_EXPECT(!two || sg_requires_grad_(t.y, true) == SG_OK);
    int nout = two ? 3 : 2;
    sg_tensor *out[3] = {NULL};
    sg_fn *fn = NULL;
    if (ok && compiled) {
        ok = TU_EXPECT(sg_compile(ctx, step, &t, 0, nout,
                                  &(sg_compile_opts){.mode = SG_MODE_DEFAULT, .fullgraph = true},
                                  &fn) == SG_OK) &&
             TU_EXPECT(sg_call(fn, NULL, 0, out, nout) == SG_OK);
    } else if (ok) {
        ok = TU_EXPECT(step(ctx, NULL, out, &t) == SG_OK);
    }
    if (!ok) fprintf(stderr, "  %s\n", sg_last_error(ctx));
    ok = ok && check(&t, out, dt);
    tu_case(ok, "GRAD_OPMATH(%s,type=%s,x=[%d,%d],%s) seed=%llu", names[op], sg_dtype_name(dt),
            ROWS, COLS, compiled ? "compiled" : "eager", (unsigned long long)seed);
    if (!compiled)
        for (int k = 0; k < nout; k++) sg_release(out[k]);
    sg_fn_destroy(fn);
    sg_release(t.x), sg_release(t.y), sg_release(t.r);
}

int main(void) {
    ctx = tu_ctx((sg_ctx_opts){0});
    uint64_t seed = 1;
    for (int op = 0; op < NOPS; op++)
        for (int h = 0; h < 2; h++)
            for (int compiled = 0; compiled < 2; compiled++)
                run_case(op, h ? SG_F16 : SG_BF16, compiled != 0, seed++);
    sg_ctx_destroy(ctx);
    return tu_finish();
}
