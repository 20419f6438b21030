/* SPDX-License-Identifier: MIT */
/*
 * test_cuda_dgelu.c -- the GELU's gradient computed in the epilogue of the
 * product that makes its g (cuBLASLt's DGELU, the GELU's input read as the
 * aux): the gradients of a linear -> gelu_tanh -> linear chain in bf16,
 * loss = sum(y * r) for a random r, with and without biases, with aligned
 * sizes and with odd K and N (where the product runs alone and the
 * gelu_tanh_bwd kernel after it), every parameter trained or the second
 * linear frozen. Each case runs eagerly on the CPU backend (checked against
 * the f64 gradients written here), eagerly on CUDA and compiled on CUDA
 * (reduce-overhead): every gradient within bf16's tolerance of the f64
 * reference and of the CPU backend's, compiled within it of eager, the
 * replays bit-identical. The second linear's dX product is right before the
 * GELU's gradient (its dW product, when trained, comes first), so explain
 * names the epilogue in every case (with aligned sizes cuBLASLt logs no
 * refusal of it; fusion/fuse.c lib_epi_of). Exits 77 without a CUDA device.
 */
#define _POSIX_C_SOURCE 200809L
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define NG 4 /* dw1, db1, dw2, db2 (the biases' only when the chain has them) */

typedef struct chain {
    int64_t B, T, C, H, O; /* x (B, T, C) -> h (.., H) -> y (.., O) */
    bool bias, frozen;     /* frozen: w2 and b2 not trained */
    sg_tensor *w1, *b1, *w2, *b2;
} chain;

/* in: x, r. out: dw1, dw2, then db1, db2 with biases (frozen: dw1, then db1). */
static sg_status step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    const chain *p = user;
    sg_tensor *a = sg_gelu_tanh(sg_linear(in[0], p->w1, p->b1));
    sg_tensor *y = sg_linear(a, p->w2, p->b2);
    sg_tensor *loss = sg_sum(sg_mul(y, in[1]), 0, NULL, false);
    sg_tensor *wrt[4] = {p->w1, p->w2, p->b1, p->b2}, *fz[2] = {p->w1, p->b1};
    if (!loss) return sg_ctx_status(c);
    if (p->frozen) return sg_grad(loss, p->bias ? 2 : 1, fz, out);
    return sg_grad(loss, p->bias ? 4 : 2, wrt, out);
}

static double gelu(double h) {
    return 0.5 * h * (1 + tanh(sqrt(2 / 3.14159265358979323846) * (h + 0.044715 * h * h * h)));
}

static double gelu_deriv(double h) {
    double c = sqrt(2 / 3.14159265358979323846), t = tanh(c * (h + 0.044715 * h * h * h));
    return 0.5 * (1 + t) + 0.5 * h * (1 - t * t) * c * (1 + 3 * 0.044715 * h * h);
}

/* The inputs' stored values and the f64 gradients, in out's order. */
typedef struct vals {
    double *x, *r, *w1, *b1, *w2, *b2;
    double *ref[NG];
    int64_t n[NG];
} vals;

static void reference(const chain *p, vals *v) {
    int64_t M = p->B * p->T, C = p->C, H = p->H, O = p->O;
    double *dh = calloc((size_t)(M * H), sizeof(double)),
           *a = calloc((size_t)(M * H), sizeof(double));
    double *dw1 = calloc((size_t)(H * C), sizeof(double)),
           *dw2 = calloc((size_t)(O * H), sizeof(double));
    double *db1 = calloc((size_t)H, sizeof(double)), *db2 = calloc((size_t)O, sizeof(double));
    for (int64_t m = 0; m < M; m++)
        for (int64_t j = 0; j < H; j++) {
            double h = p->bias ? v->b1[j] : 0, da = 0;
            for (int64_t k = 0; k < C; k++) h += v->x[m * C + k] * v->w1[j * C + k];
            for (int64_t o = 0; o < O; o++) da += v->r[m * O + o] * v->w2[o * H + j];
            a[m * H + j] = gelu(h);
            dh[m * H + j] = da * gelu_deriv(h);
        }
    for (int64_t m = 0; m < M; m++) {
        for (int64_t j = 0; j < H; j++) {
            db1[j] += dh[m * H + j];
            for (int64_t k = 0; k < C; k++) dw1[j * C + k] += dh[m * H + j] * v->x[m * C + k];
        }
        for (int64_t o = 0; o < O; o++) {
            db2[o] += v->r[m * O + o];
            for (int64_t j = 0; j < H; j++) dw2[o * H + j] += v->r[m * O + o] * a[m * H + j];
        }
    }
    double *refs[NG] = {dw1, dw2, db1, db2}, *fz[NG] = {dw1, db1, dw2, db2};
    int64_t n[NG] = {H * C, O * H, H, O}, nf[NG] = {H * C, H, O * H, O};
    if (p->frozen) memcpy(refs, fz, sizeof fz), memcpy(n, nf, sizeof nf);
    memcpy(v->ref, refs, sizeof refs);
    memcpy(v->n, n, sizeof n);
    free(dh), free(a);
}

/* The parameters and inputs on ctx from seed (the same values on every
 * context); vals filled when v is not NULL. */
static void make(sg_ctx *ctx, chain *p, sg_tensor **in, uint64_t seed, vals *v) {
    int64_t xs[3] = {p->B, p->T, p->C}, rs[3] = {p->B, p->T, p->O}, w1s[2] = {p->H, p->C},
            w2s[2] = {p->O, p->H};
    double *d[6] = {NULL};
    tu_seed(seed);
    in[0] = tu_rand(ctx, SG_BF16, 3, xs, -1, 1, &d[0]);
    in[1] = tu_rand(ctx, SG_BF16, 3, rs, -1, 1, &d[1]);
    p->w1 = tu_rand(ctx, SG_BF16, 2, w1s, -0.3, 0.3, &d[2]);
    p->b1 = tu_rand(ctx, SG_BF16, 1, &p->H, -0.5, 0.5, &d[3]);
    p->w2 = tu_rand(ctx, SG_BF16, 2, w2s, -0.3, 0.3, &d[4]);
    p->b2 = tu_rand(ctx, SG_BF16, 1, &p->O, -0.5, 0.5, &d[5]);
    if (!p->bias) sg_release(p->b1), sg_release(p->b2), p->b1 = p->b2 = NULL;
    sg_requires_grad_(p->w1, true), sg_requires_grad_(p->w2, !p->frozen);
    if (p->bias) sg_requires_grad_(p->b1, true), sg_requires_grad_(p->b2, !p->frozen);
    if (v) {
        v->x = d[0], v->r = d[1], v->w1 = d[2], v->b1 = d[3], v->w2 = d[4], v->b2 = d[5];
    } else {
        for (int i = 0; i < 6; i++) free(d[i]);
    }
}

static void unmake(chain *p, sg_tensor **in) {
    sg_release(in[0]), sg_release(in[1]);
    sg_release(p->w1), sg_release(p->b1), sg_release(p->w2), sg_release(p->b2);
}

static bool norm_close(const char *what, const double *got, const double *ref, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++)
        num += (got[i] - ref[i]) * (got[i] - ref[i]), den += ref[i] * ref[i];
    bool ok = got && sqrt(num) <= 1e-2 * sqrt(den) + 1e-30;
    if (!ok) fprintf(stderr, "  %s: ||got-ref|| = %g, ||ref|| = %g\n", what, sqrt(num), sqrt(den));
    return ok;
}

static const char *const gnames[NG] = {"grad0", "grad1", "grad2", "grad3"};

/* The gradients of one eager step on ctx, read back (NULL on failure). */
static bool eager(sg_ctx *ctx, chain *p, uint64_t seed, vals *v, double **got) {
    sg_tensor *in[2], *out[NG] = {NULL};
    make(ctx, p, in, seed, v);
    bool ok = TU_EXPECT(step(ctx, in, out, p) == SG_OK);
    for (int o = 0; o < NG; o++) {
        got[o] = ok && out[o] ? tu_read(out[o]) : NULL;
        sg_release(out[o]);
    }
    unmake(p, in);
    return ok;
}

/* Fallbacks cuBLASLt logged for the GELU-gradient epilogue (cublaslt.c). */
static int refusals;

static void on_log(void *user, const char *topic, const char *line) {
    (void)user;
    if (strcmp(topic, "fallbacks") == 0 && strstr(line, "GELU-gradient")) refusals++;
}

static void run_case(sg_ctx *cpu, sg_ctx *cuda, int64_t C, int64_t H, int64_t O, bool bias,
                     bool frozen, uint64_t seed) {
    chain p = {3, 43, C, H, O, bias, frozen, NULL, NULL, NULL, NULL};
    int ng = (bias ? 2 : 1) * (frozen ? 1 : 2);
    vals v = {0};
    double *c_got[NG] = {NULL}, *e_got[NG] = {NULL}, *prev[NG] = {NULL};
    bool ok = eager(cpu, &p, seed, &v, c_got);
    reference(&p, &v);
    for (int o = 0; ok && o < ng; o++) ok = norm_close(gnames[o], c_got[o], v.ref[o], v.n[o]);
    ok = ok && eager(cuda, &p, seed, NULL, e_got);
    for (int o = 0; ok && o < ng; o++)
        ok = norm_close(gnames[o], e_got[o], v.ref[o], v.n[o]) &&
             norm_close(gnames[o], e_got[o], c_got[o], v.n[o]);
    int before = refusals;
    sg_tensor *in[2];
    make(cuda, &p, in, seed, NULL);
    sg_fn *fn = NULL;
    ok = ok &&
         TU_EXPECT(sg_compile(cuda, step, &p, 2, ng,
                              &(sg_compile_opts){.mode = SG_MODE_REDUCE_OVERHEAD}, &fn) == SG_OK);
    /* run, record, then two replays: each within tolerance, the replays the same bits */
    for (int call = 0; ok && call < 4; call++) {
        sg_tensor *out[NG] = {NULL};
        sg_mark_step_begin(cuda);
        ok = TU_EXPECT(sg_call(fn, in, 2, out, ng) == SG_OK);
        for (int o = 0; ok && o < ng; o++) {
            double *got = tu_read(out[o]);
            ok = norm_close(gnames[o], got, v.ref[o], v.n[o]) &&
                 norm_close(gnames[o], got, c_got[o], v.n[o]) &&
                 norm_close(gnames[o], got, e_got[o], v.n[o]);
            if (ok && call == 3)
                ok = TU_EXPECT(memcmp(prev[o], got, sizeof(double) * (size_t)v.n[o]) == 0);
            free(prev[o]);
            prev[o] = got;
        }
        for (int o = 0; o < ng; o++) sg_release(out[o]);
    }
    const char *ex = ok ? sg_fn_explain(fn) : "";
    const char *line = ex ? strstr(ex, "GELU gradient (DGELU)") : NULL;
    ok = ok && TU_EXPECT(line != NULL);
    /* aligned sizes: cuBLASLt has the algorithm and takes it */
    bool aligned = C % 8 == 0 && H % 8 == 0 && O % 8 == 0;
    if (ok && aligned) ok = TU_EXPECT(refusals == before);
    if (!ok) fprintf(stderr, "  error: %s\n", sg_last_error(cuda));
    tu_case(ok,
            "CUDA_DGELU(x=[3,43,%lld],H=%lld,O=%lld,%s,%s,bf16): cpu, cuda eager, compiled, "
            "replays%s%s",
            (long long)C, (long long)H, (long long)O, bias ? "bias" : "no bias",
            frozen ? "second frozen" : "all trained", line ? ", explain names DGELU" : "",
            refusals == before ? "" : " (cuBLASLt refused the epilogue: the kernel ran)");
    sg_clear_error(cuda);
    sg_clear_error(cpu);
    sg_fn_destroy(fn);
    unmake(&p, in);
    for (int o = 0; o < NG; o++) free(c_got[o]), free(e_got[o]), free(prev[o]), free(v.ref[o]);
    free(v.x), free(v.r), free(v.w1), free(v.b1), free(v.w2), free(v.b2);
}

int main(void) {
    sg_ctx *cuda = tu_ctx_on((sg_ctx_opts){.backend = SG_BACKEND_CUDA, .log = on_log});
    sg_ctx *cpu = tu_ctx_on((sg_ctx_opts){.backend = SG_BACKEND_CPU});
    for (int f = 0; f < 2; f++) {
        run_case(cpu, cuda, 64, 256, 96, true, f, 1);
        run_case(cpu, cuda, 64, 256, 96, false, f, 2);
        run_case(cpu, cuda, 45, 200, 37, true, f, 3); /* odd K of the dX product (37) and of x */
        run_case(cpu, cuda, 64, 131, 64, true, f, 4); /* odd N: the aux's rows unaligned */
        run_case(cpu, cuda, 72, 136, 24, false, f, 5);
    }
    sg_ctx_destroy(cuda);
    sg_ctx_destroy(cpu);
    return tu_finish();
}
