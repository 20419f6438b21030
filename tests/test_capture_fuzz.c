/* SPDX-License-Identifier: MIT */
/*
 * test_capture_fuzz.c -- random op DAGs, run eagerly and compiled.
 * Unfused (SG_CODEGEN=0) the replay must give the eager results bit for
 * bit: both run the same CPU kernels, so any difference is a replay bug (a
 * wrong address, a buffer shared while live, a missed input patch). Fused
 * and generated, results agree within the dtype's tolerance in every mode
 * that compiles (default, reduce-overhead, max-autotune, and
 * max-autotune-no-cudagraphs): the C compiler may fold a libm call on a
 * constant to the correctly rounded value where the library's call is 1 ulp
 * off. Generated code with fusion disabled (one kernel per op) is checked
 * the same way. Even seeds favour reductions and row ops, so that pointwise
 * prologues and epilogues around them are common; every third seed mixes
 * input dtypes (binary ops cast their second operand); every fourth ends
 * with two calls on transposed views of its inputs. Besides pointwise,
 * reduction and row ops, programs use div, exp, log and pow (kept in
 * range), matmul, concat, var and argmax, and every fifth seed has i32/i64
 * inputs (argmax and casts to ints take only inputs and ints, so that an
 * ulp of difference in a computed float cannot flip them). Generated C is
 * compiled with SG_CFLAGS="-Wall -Wextra -Werror". Each program prints as
 * text with its seed, e.g. "v3 = add(v1, v2)", to be re-run by seed
 * (argument 1). SG_FUZZ_SEEDS=a:b runs seeds a..b in every pass (CI runs
 * 1..300 unfused, 1..30 fused, 1..10 one kernel per op).
 */
#define _POSIX_C_SOURCE 200809L
#include "graphs/graphs.h"
#include "testutil.h"

#include <math.h>
#include <string.h>

enum kind {
    K_UNARY, K_SCALAR, K_BINARY, K_WHERE, K_CAST, K_TRANSPOSE, K_SLICE, K_UNSQUEEZE, K_ADD_INPLACE,
    K_REDUCE, K_ROW, K_MATH, K_MATMUL, K_CONCAT, K_VAR, K_ARGMAX, K_COUNT
};

typedef struct instr {
    enum kind kind;
    int sub; /* which op within the kind */
    int a, b;
    double s0, s1;
} instr;

typedef struct meta {
    sg_dtype dt;
    int ndim;
    int64_t shape[3];
    bool owned; /* made by an op of the step, contiguous: in-place ops may write it */
} meta;

#define MAXV 96
typedef struct prog {
    int nin, n, nout;
    meta m[MAXV];
    instr code[MAXV];
    int out[2];
} prog;

typedef sg_tensor *(*unary_fn)(sg_tensor *);
static const unary_fn unary_ops[] = {sg_neg, sg_abs, sg_sin, sg_cos, sg_tanh, sg_sigmoid,
                                     sg_relu, sg_gelu, sg_gelu_tanh, sg_silu};
static const char *const unary_names[] = {"neg", "abs", "sin", "cos", "tanh", "sigmoid",
                                          "relu", "gelu", "gelu_tanh", "silu"};
typedef sg_tensor *(*binary_fn)(sg_tensor *, sg_tensor *);
static const binary_fn binary_ops[] = {sg_add, sg_sub, sg_mul, sg_maximum, sg_minimum};
static const char *const binary_names[] = {"add", "sub", "mul", "maximum", "minimum"};
static const char *const reduce_names[] = {"sum", "mean", "max"};
static const char *const row_names[] = {"softmax", "log_softmax", "layer_norm", "rms_norm"};
/* Kept in range: div by |b| + 0.5, exp of a clamped to [-4, 4], log of
 * |a| + 0.1, pow of min(|a| + 0.1, 4) to b clamped to [-2, 2]. */
static const char *const math_names[] = {"div", "exp", "log", "pow"};

static bool is_int(sg_dtype dt) { return dt == SG_I32 || dt == SG_I64; }
/* Float-only ops see ints cast to f32 (unary: all but neg, abs, relu). */
static bool takes_ints(enum kind k, int sub) {
    return k == K_SCALAR || k == K_BINARY || k == K_WHERE || k == K_ADD_INPLACE ||
           k == K_CAST || k == K_TRANSPOSE || k == K_SLICE || k == K_UNSQUEEZE ||
           k == K_CONCAT || k == K_ARGMAX || (k == K_UNARY && (sub == 0 || sub == 1 || sub == 6)) ||
           (k == K_REDUCE && sub != 1);
}
#define COUNT(a) ((int)(sizeof a / sizeof a[0]))

static bool broadcast(const meta *x, const meta *y, meta *out) {
    int nd = x->ndim > y->ndim ? x->ndim : y->ndim;
    for (int d = 0; d < nd; d++) {
        int dx = d - (nd - x->ndim), dy = d - (nd - y->ndim);
        int64_t sx = dx < 0 ? 1 : x->shape[dx], sy = dy < 0 ? 1 : y->shape[dy];
        if (sx != sy && sx != 1 && sy != 1) return false;
        out->shape[d] = sx == 1 ? sy : sx;
    }
    out->ndim = nd;
    return true;
}

/* Pick a random value of a float dtype, preferring recent ones. */
static int pick(int count) {
    int lo = count > 6 ? count - 6 : 0;
    return (int)tu_randint(tu_next() % 4 == 0 ? 0 : lo, count - 1);
}

static void generate(prog *p, uint64_t seed) {
    tu_seed(seed);
    memset(p, 0, sizeof *p);
    p->nin = (int)tu_randint(1, 3);
    int64_t A = tu_randint(1, 9), B = tu_randint(1, 40);
    sg_dtype dts[3] = {SG_F32, SG_F16, SG_BF16};
    sg_dtype base = tu_next() % 3 == 0 ? dts[tu_randint(1, 2)] : SG_F32;
    bool mixed = seed % 3 == 1, heavy = seed % 2 == 0, ints = seed % 5 == 2;
    for (int i = 0; i < p->nin; i++) {
        meta *m = &p->m[i];
        m->dt = mixed ? dts[tu_randint(0, 2)] : base;
        if (ints && tu_next() % 2) m->dt = tu_next() % 2 ? SG_I32 : SG_I64;
        int form = (int)tu_randint(0, 3);
        m->ndim = form == 3 ? 1 : 2;
        m->shape[0] = form == 1 ? 1 : A;
        m->shape[1] = form == 2 ? 1 : B;
        if (form == 3) m->shape[0] = B;
    }
    int len = (int)tu_randint(4, 40), count = p->nin;
    while (p->n < len && count < MAXV) {
        instr in = {.kind = (enum kind)tu_randint(0, K_COUNT - 1), .a = pick(count)};
        if (heavy && tu_next() % 3 == 0) in.kind = tu_next() % 2 ? K_REDUCE : K_ROW;
        meta out = p->m[in.a];
        out.owned = true;
        const meta *ma = &p->m[in.a];
        const meta *mb;
        switch (in.kind) {
        case K_UNARY: in.sub = (int)tu_randint(0, COUNT(unary_ops) - 1); break;
        case K_SCALAR:
            in.sub = (int)tu_randint(0, 2);
            in.s0 = tu_uniform(-1.5, 1.5);
            in.s1 = in.s0 + tu_uniform(0, 2);
            break;
        case K_BINARY:
        case K_WHERE:
            in.sub = (int)tu_randint(0, COUNT(binary_ops) - 1);
            in.b = pick(count); /* of another dtype: cast to a's */
            if (!broadcast(ma, &p->m[in.b], &out)) continue;
            break;
        case K_CAST:
            /* To an int only from an input or an int: a computed float may
             * differ by an ulp from the eager one and truncate differently. */
            out.dt = dts[tu_randint(0, 2)];
            if ((in.a < p->nin || is_int(ma->dt)) && tu_next() % 3 == 0)
                out.dt = tu_next() % 2 ? SG_I32 : SG_I64;
            break;
        case K_TRANSPOSE:
            if (ma->ndim < 2) continue;
            out.shape[0] = ma->shape[1], out.shape[1] = ma->shape[0];
            out.owned = false;
            break;
        case K_SLICE:
            out.shape[out.ndim - 1] = (ma->shape[ma->ndim - 1] + 1) / 2;
            out.owned = false;
            break;
        case K_UNSQUEEZE:
            if (ma->ndim >= 3) continue;
            out.ndim = ma->ndim + 1;
            out.shape[0] = 1;
            for (int d = 0; d < ma->ndim; d++) out.shape[d + 1] = ma->shape[d];
            out.owned = false;
            break;
        case K_ADD_INPLACE: {
            if (!ma->owned) continue;
            in.b = pick(count);
            meta bc;
            if (!broadcast(ma, &p->m[in.b], &bc) || bc.ndim != ma->ndim ||
                memcmp(bc.shape, ma->shape, sizeof(int64_t) * (size_t)ma->ndim))
                continue;
            break;
        }
        case K_REDUCE: /* over the last dim, kept as size 1 */
            in.sub = (int)tu_randint(0, COUNT(reduce_names) - 1);
            out.shape[out.ndim - 1] = 1;
            break;
        case K_ROW: in.sub = (int)tu_randint(0, COUNT(row_names) - 1); break;
        case K_MATH:
            in.sub = (int)tu_randint(0, COUNT(math_names) - 1);
            in.b = pick(count);
            if ((in.sub == 0 || in.sub == 3) && !broadcast(ma, &p->m[in.b], &out)) continue;
            break;
        case K_MATMUL: /* a (M, K) @ b (N, K)^T, or a @ a^T */
            in.b = pick(count);
            mb = &p->m[in.b];
            if (ma->ndim != 2) continue;
            if (mb->ndim != 2 || mb->shape[1] != ma->shape[1]) in.b = in.a, mb = ma;
            out.shape[1] = mb->shape[0];
            break;
        case K_CONCAT: /* along the last dim, with b or with a itself */
            in.b = pick(count);
            mb = &p->m[in.b];
            if (mb->ndim != ma->ndim ||
                memcmp(mb->shape, ma->shape, sizeof(int64_t) * (size_t)(ma->ndim - 1)))
                in.b = in.a, mb = ma;
            out.shape[out.ndim - 1] = ma->shape[ma->ndim - 1] + mb->shape[mb->ndim - 1];
            if (out.shape[out.ndim - 1] > 64) continue;
            break;
        case K_VAR: out.shape[out.ndim - 1] = 1; break;
        case K_ARGMAX: /* of inputs and ints only: near-ties of computed floats could flip */
            if (in.a >= p->nin && !is_int(ma->dt)) continue;
            out.shape[out.ndim - 1] = 1;
            out.dt = SG_I64;
            break;
        default: continue;
        }
        if (is_int(ma->dt) && !takes_ints(in.kind, in.sub)) out.dt = SG_F32;
        bool two = in.kind == K_BINARY || in.kind == K_WHERE || in.kind == K_CONCAT ||
                   in.kind == K_ADD_INPLACE;
        if (two && is_int(ma->dt) && !is_int(p->m[in.b].dt)) {
            if (in.kind == K_ADD_INPLACE) continue; /* would truncate b */
            out.dt = p->m[in.b].dt;
        }
        if (in.kind == K_REDUCE && in.sub == 0 && is_int(ma->dt)) out.dt = SG_I64;
        p->code[p->n++] = in;
        p->m[count++] = out;
    }
    p->nout = count - p->nin >= 2 && tu_next() % 2 ? 2 : 1;
    p->out[0] = count - 1;
    p->out[1] = count > p->nin + 1 ? count - 2 : count - 1;
}

static void print_prog(const prog *p, uint64_t seed) {
    fprintf(stderr, "  program seed=%llu:\n", (unsigned long long)seed);
    for (int i = 0; i < p->nin; i++)
        fprintf(stderr, "    v%d = input %s[%lld,%lld](ndim %d)\n", i, sg_dtype_name(p->m[i].dt),
                (long long)p->m[i].shape[0], (long long)p->m[i].shape[1], p->m[i].ndim);
    for (int k = 0; k < p->n; k++) {
        const instr *in = &p->code[k];
        int v = p->nin + k;
        switch (in->kind) {
        case K_UNARY: fprintf(stderr, "    v%d = %s(v%d)\n", v, unary_names[in->sub], in->a); break;
        case K_SCALAR: fprintf(stderr, "    v%d = scalar%d(v%d, %g, %g)\n", v, in->sub, in->a, in->s0, in->s1); break;
        case K_BINARY: fprintf(stderr, "    v%d = %s(v%d, v%d)\n", v, binary_names[in->sub], in->a, in->b); break;
        case K_WHERE: fprintf(stderr, "    v%d = where(gt(v%d, v%d), v%d, %s(v%d, v%d))\n", v, in->a, in->b, in->a, binary_names[in->sub], in->a, in->b); break;
        case K_CAST: fprintf(stderr, "    v%d = cast(v%d, %s)\n", v, in->a, sg_dtype_name(p->m[v].dt)); break;
        case K_TRANSPOSE: fprintf(stderr, "    v%d = transpose(v%d)\n", v, in->a); break;
        case K_SLICE: fprintf(stderr, "    v%d = v%d[..., ::2]\n", v, in->a); break;
        case K_UNSQUEEZE: fprintf(stderr, "    v%d = unsqueeze(v%d, 0)\n", v, in->a); break;
        case K_ADD_INPLACE: fprintf(stderr, "    v%d = add_(v%d, v%d)\n", v, in->a, in->b); break;
        case K_REDUCE:
            fprintf(stderr, "    v%d = %s(v%d, -1, keepdim)\n", v, reduce_names[in->sub], in->a);
            break;
        case K_ROW: fprintf(stderr, "    v%d = %s(v%d)\n", v, row_names[in->sub], in->a); break;
        case K_MATH: fprintf(stderr, "    v%d = %s(v%d, v%d)\n", v, math_names[in->sub], in->a, in->b); break;
        case K_MATMUL: fprintf(stderr, "    v%d = matmul(v%d, transpose(v%d))\n", v, in->a, in->b); break;
        case K_CONCAT: fprintf(stderr, "    v%d = concat(v%d, v%d, dim=-1)\n", v, in->a, in->b); break;
        case K_VAR: fprintf(stderr, "    v%d = var(v%d, dim=-1, correction=1, keepdim)\n", v, in->a); break;
        case K_ARGMAX: fprintf(stderr, "    v%d = argmax(v%d, dim=-1, keepdim)\n", v, in->a); break;
        default: break;
        }
    }
    fprintf(stderr, "    out = v%d%s\n", p->out[0], p->nout == 2 ? " and another" : "");
}

static sg_status interpret(sg_ctx *ctx, sg_tensor *const *in, sg_tensor **out, void *user) {
    const prog *p = user;
    sg_tensor *v[MAXV] = {NULL};
    for (int i = 0; i < p->nin; i++) v[i] = in[i];
    for (int k = 0; k < p->n; k++) {
        const instr *c = &p->code[k];
        sg_tensor *a = v[c->a], *b = v[c->b], *r = NULL;
        if (a && is_int(sg_tensor_dtype(a)) && !takes_ints(c->kind, c->sub)) a = sg_cast(a, SG_F32);
        bool two = c->kind == K_BINARY || c->kind == K_WHERE || c->kind == K_ADD_INPLACE ||
                   c->kind == K_MATH || c->kind == K_MATMUL || c->kind == K_CONCAT;
        /* Two dtypes: an int operand takes the float one's dtype (a float
         * truncated to an int could land on either side of an integer). */
        if (two && b && a && sg_tensor_dtype(b) != sg_tensor_dtype(a)) {
            if (is_int(sg_tensor_dtype(a)) && !is_int(sg_tensor_dtype(b)))
                a = sg_cast(a, sg_tensor_dtype(b));
            else
                b = sg_cast(b, sg_tensor_dtype(a));
        }
        static const int last[1] = {-1};
        switch (c->kind) {
        case K_UNARY: r = unary_ops[c->sub](a); break;
        case K_SCALAR:
            r = c->sub == 0 ? sg_add_scalar(a, c->s0) : c->sub == 1 ? sg_mul_scalar(a, c->s0)
                                                                     : sg_clamp(a, c->s0, c->s1);
            break;
        case K_BINARY: r = binary_ops[c->sub](a, b); break;
        case K_WHERE: r = sg_where(sg_gt(a, b), a, binary_ops[c->sub](a, b)); break;
        case K_CAST: r = sg_cast(a, p->m[p->nin + k].dt); break;
        case K_TRANSPOSE: r = sg_transpose(a, 0, 1); break;
        case K_SLICE: r = sg_slice(a, -1, 0, INT64_MAX, 2); break;
        case K_UNSQUEEZE: r = sg_unsqueeze(a, 0); break;
        case K_ADD_INPLACE: r = sg_add_(a, b) == SG_OK ? a : NULL; break;
        case K_REDUCE:
            r = c->sub == 0   ? sg_sum(a, 1, last, true)
                : c->sub == 1 ? sg_mean(a, 1, last, true)
                              : sg_max(a, 1, last, true);
            break;
        case K_ROW:
            r = c->sub == 0   ? sg_softmax(a, -1)
                : c->sub == 1 ? sg_log_softmax(a, -1)
                : c->sub == 2 ? sg_layer_norm(a, NULL, NULL, 1e-5)
                              : sg_rms_norm(a, NULL, 1e-6);
            break;
        case K_MATH:
            r = c->sub == 0   ? sg_div(a, sg_add_scalar(sg_abs(b), 0.5))
                : c->sub == 1 ? sg_exp(sg_clamp(a, -4, 4))
                : c->sub == 2 ? sg_log(sg_add_scalar(sg_abs(a), 0.1))
                              : sg_pow(sg_clamp(sg_add_scalar(sg_abs(a), 0.1), 0, 4),
                                       sg_clamp(b, -2, 2));
            break;
        case K_MATMUL: r = sg_matmul(a, sg_transpose(b, 0, 1)); break;
        case K_CONCAT: r = sg_concat(2, (sg_tensor *const[]){a, b}, -1); break;
        case K_VAR: r = sg_var(a, 1, last, 1, true); break;
        case K_ARGMAX: r = sg_argmax(a, -1, true); break;
        default: break;
        }
        if (!r) return sg_ctx_status(ctx) ? sg_ctx_status(ctx) : SG_ERR_INTERNAL;
        v[p->nin + k] = r;
    }
    for (int i = 0; i < p->nout; i++) out[i] = v[p->out[i]];
    return SG_OK;
}

static bool fused_mode;

static bool same_values(const sg_tensor *x, const sg_tensor *y) {
    int64_t n = sg_tensor_numel(x);
    sg_dtype dt = sg_tensor_dtype(x);
    if (n != sg_tensor_numel(y) || dt != sg_tensor_dtype(y)) return false;
    double *a = tu_read(x), *b = tu_read(y);
    bool ok = a && b;
    double rtol = fused_mode ? (dt == SG_F32 ? 1e-4 : 3e-2) : 0;
    double atol = fused_mode ? (dt == SG_F32 ? 1e-5 : 3e-2) : 0;
    for (int64_t i = 0; ok && i < n; i++) {
        bool nan_both = a[i] != a[i] && b[i] != b[i];
        if (!(a[i] == b[i] || nan_both || fabs(a[i] - b[i]) <= atol + rtol * fabs(a[i]))) {
            fprintf(stderr, "  element %lld: compiled %.9g, eager %.9g\n", (long long)i, b[i], a[i]);
            ok = false;
        }
    }
    free(a), free(b);
    return ok;
}

/* The modes that compile: each replays the capture through generated code. */
static const sg_mode compiled_modes[] = {SG_MODE_DEFAULT, SG_MODE_REDUCE_OVERHEAD,
                                         SG_MODE_MAX_AUTOTUNE, SG_MODE_MAX_AUTOTUNE_NO_GRAPHS};

/* Eager against each of nmodes compiled fns, over 4 calls of fresh inputs. */
static bool run_seed(sg_ctx *ctx, uint64_t seed, int nmodes, const sg_mode *modes) {
    prog p;
    generate(&p, seed);
    sg_fn *eager, *comp[4] = {NULL};
    sg_compile(ctx, interpret, &p, p.nin, p.nout, &(sg_compile_opts){.mode = SG_MODE_EAGER}, &eager);
    for (int m = 0; m < nmodes; m++)
        sg_compile(ctx, interpret, &p, p.nin, p.nout, &(sg_compile_opts){.mode = modes[m]},
                   &comp[m]);
    bool ok = true;
    int bad_mode = -1;
    for (int call = 0; ok && call < 4; call++) {
        sg_mark_step_begin(ctx);
        sg_tensor *in[3], *oe[2], *oc[2];
        /* Every 4th seed, the last two calls pass transposed views: a
         * second capture, with strided loads. */
        tu_layout lay = seed % 4 == 3 && call >= 2 ? TU_PERMUTED : TU_CONTIG;
        for (int i = 0; i < p.nin; i++) {
            int64_t sh[2] = {p.m[i].shape[0], p.m[i].shape[1]};
            in[i] = tu_rand_layout(ctx, p.m[i].dt, p.m[i].ndim, sh, -2, 2, lay, NULL);
        }
        ok = TU_EXPECT(sg_call(eager, in, p.nin, oe, p.nout) == SG_OK);
        for (int m = 0; ok && m < nmodes; m++) {
            ok = TU_EXPECT(sg_call(comp[m], in, p.nin, oc, p.nout) == SG_OK);
            for (int i = 0; ok && i < p.nout; i++) ok = same_values(oe[i], oc[i]);
            /* Fused, the capture must compile (a generated-code warning is an error). */
            for (int gi = 0; ok && fused_mode && gi < comp[m]->ngraphs; gi++)
                ok = TU_EXPECT(comp[m]->graphs[gi]->compiled);
            if (!ok) bad_mode = m;
        }
        for (int i = 0; i < p.nin; i++) sg_release(in[i]);
    }
    if (!ok) {
        print_prog(&p, seed);
        if (bad_mode >= 0)
            fprintf(stderr, "  mode %s\n%s", sg_mode_name(modes[bad_mode]),
                    sg_fn_explain(comp[bad_mode]));
        fprintf(stderr, "%s\n", sg_last_error(ctx));
        sg_clear_error(ctx);
    }
    sg_fn_destroy(eager);
    for (int m = 0; m < nmodes; m++) sg_fn_destroy(comp[m]);
    return ok;
}

int main(int argc, char **argv) {
    sg_ctx *ctx;
    ctx = tu_ctx((sg_ctx_opts){0});
    setenv("SG_CFLAGS", "-Wall -Wextra -Werror", 1);
    /* CI: seeds 1..300 unfused, the first 30 generated and fused, the first
     * 10 one kernel per op. SG_FUZZ_SEEDS=a:b runs a..b in every pass (the
     * long run); argument 1 re-runs one seed. */
    uint64_t first = 1, last = 300;
    const char *range = getenv("SG_FUZZ_SEEDS");
    unsigned long long a = 0, b = 0;
    bool all = false;
    if (range && sscanf(range, "%llu:%llu", &a, &b) == 2 && a <= b)
        first = a, last = b, all = true;
    else if (range)
        fprintf(stderr, "SG_FUZZ_SEEDS='%s' is not a:b with a <= b; using 1:300\n", range);
    if (argc > 1) first = last = strtoull(argv[1], NULL, 10), all = true;
    /* Pass 0: unfused replay, bit for bit; 1: fused and generated, every
     * compiling mode; 2: generated with fusion disabled (one kernel per op). */
    for (int pass = 0; pass < 3; pass++) {
        fused_mode = pass >= 1;
        setenv("SG_CODEGEN", fused_mode ? "1" : "0", 1);
        if (pass == 2) setenv("SG_DISABLE_FUSION", "1", 1);
        const char *how = pass == 0   ? "unfused, bit for bit"
                          : pass == 1 ? "fused C within tolerance, 4 modes"
                                      : "generated C one kernel per op, within tolerance";
        int failed = 0;
        /* Generated, each seed compiles a unit (~0.1 s): fewer of them. */
        uint64_t end = all || pass == 0 ? last : pass == 1 ? first + 29 : first + 9;
        for (uint64_t seed = first; seed <= end; seed++) {
            if (!all && !tu_sampled()) continue; /* SG_TEST_EVERY: the ze variant */
            const sg_mode reduce_overhead = SG_MODE_REDUCE_OVERHEAD;
            bool ok = pass == 1 ? run_seed(ctx, seed, 4, compiled_modes)
                                : run_seed(ctx, seed, 1, &reduce_overhead);
            failed += !ok;
            if (!ok || seed % 100 == 0 || first == last)
                tu_case(ok, "FUZZ(seed=%llu, compiled == eager, %s, 4 calls)",
                        (unsigned long long)seed, how);
        }
        tu_case(failed == 0, "FUZZ(seeds %llu..%llu, %s: %d mismatches)", (unsigned long long)first,
                (unsigned long long)end, how, failed);
        unsetenv("SG_DISABLE_FUSION");
    }
    sg_ctx_destroy(ctx);
    return tu_finish();
}
