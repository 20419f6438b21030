/* SPDX-License-Identifier: MIT */
/*
 * test_graphs_backends.c -- torch.compile's backend= in stepgraph:
 * backend_name "inductor", "eager" (every IR op replayed by the eager
 * kernels), "aot_eager" (the duplicate and the unused op removed, the rest
 * replayed op by op), each against an f64 reference; a custom backend_fn
 * sees the fused graph (kernels, op names, input and output shapes) and
 * either takes the capture over with its own step, declines, or fails (a
 * fallback: op by op replay; an error under strict).
 */
#include "testutil.h"

#include <math.h>
#include <string.h>

enum { R = 4, C = 8 };
static sg_tensor *w;
static int step_calls, run_calls, backend_calls;

/* c = sin(x) * sin(x) + w (R, C), d = sum(c, 1) (R); exp(x) is computed and unused. */
static sg_status step(sg_ctx *ctx, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)user;
    step_calls++;
    int dim = 1;
    sg_tensor *unused = sg_exp(in[0]);
    out[0] = sg_add(sg_mul(sg_sin(in[0]), sg_sin(in[0])), w);
    out[1] = sg_sum(out[0], 1, &dim, false);
    sg_release(unused);
    return out[0] && out[1] ? SG_OK : sg_ctx_status(ctx);
}

/* The custom backend's own way: the same math with other eager ops. */
static sg_status my_run(sg_ctx *ctx, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)user;
    run_calls++;
    int dim = 1;
    sg_tensor *s = sg_sin(in[0]);
    out[0] = sg_add(sg_pow_scalar(s, 2.0), w);
    out[1] = sg_sum(out[0], 1, &dim, false);
    sg_release(s);
    return out[0] && out[1] ? SG_OK : sg_ctx_status(ctx);
}

static bool check(sg_tensor *const *out, const double *xv, const double *wv) {
    double c[R * C], d[R];
    for (int i = 0; i < R; i++) {
        d[i] = 0;
        for (int j = 0; j < C; j++) {
            double s = sin(xv[i * C + j]);
            c[i * C + j] = s * s + wv[i * C + j];
            d[i] += c[i * C + j];
        }
    }
    double *gc = tu_read(out[0]), *gd = tu_read(out[1]);
    bool ok =
        gc && gd && tu_close("c", gc, c, R * C, 1e-5, 1e-6) && tu_close("d", gd, d, R, 1e-5, 1e-5);
    free(gc);
    free(gd);
    return ok;
}

/* What the custom backend saw. */
typedef struct seen {
    int kernels, nin, nout, ndim_in, ndim_out[2];
    int64_t shape_in[SG_MAX_DIMS], shape_out[2][SG_MAX_DIMS];
    char ops[512], first_name[160];
    sg_status give; /* what the callback returns */
    bool take;      /* take the capture over */
} seen;

static sg_status backend(void *user, const sg_graph_view *g, sg_step_fn *run) {
    seen *s = user;
    backend_calls++;
    s->kernels = sg_graph_view_num_kernels(g);
    sg_graph_view_kernel_name(g, 0, s->first_name, sizeof s->first_name);
    s->ops[0] = '\0';
    for (int k = 0; k < s->kernels; k++)
        for (int i = 0; i < sg_graph_view_num_ops(g, k); i++) {
            size_t n = strlen(s->ops);
            snprintf(s->ops + n, sizeof s->ops - n, "%s ", sg_graph_view_op_name(g, k, i));
        }
    s->nin = sg_graph_view_num_inputs(g);
    s->nout = sg_graph_view_num_outputs(g);
    sg_dtype dt;
    if (sg_graph_view_input(g, 0, &dt, &s->ndim_in, s->shape_in) != SG_OK || dt != SG_F32)
        s->nin = -1;
    for (int o = 0; o < 2; o++)
        if (sg_graph_view_output(g, o, &dt, &s->ndim_out[o], s->shape_out[o]) != SG_OK ||
            dt != SG_F32)
            s->nout = -1;
    if (sg_graph_view_input(g, 1, NULL, NULL, NULL) != SG_ERR_INDEX) s->nin = -2;
    if (s->take) *run = my_run;
    return s->give;
}

static int count_word(const char *hay, const char *w) {
    int n = 0;
    for (const char *p = hay; (p = strstr(p, w)) != NULL; p += strlen(w)) n++;
    return n;
}

static int explain_int(sg_fn *fn, const char *before) {
    const char *p = strstr(sg_fn_explain(fn), before);
    return p ? atoi(p + strlen(before)) : -1;
}

/* Events per replay of a 2-replay trace, and the names of all events. */
static int trace_kernels(sg_fn *fn, sg_tensor *x, char *names, size_t size) {
    const char *path = "/tmp/sg_backends_trace.json";
    if (sg_fn_trace(fn, &x, 1, path, 2) != SG_OK) return -1;
    FILE *f = fopen(path, "r");
    char line[1024];
    int n = 0;
    names[0] = '\0';
    while (f && fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "{\"name\": \"");
        if (!p) continue;
        n++;
        size_t q = strlen(names);
        snprintf(names + q, size - q, "%.*s ", (int)strcspn(p + 10, "\""), p + 10);
    }
    if (f) fclose(f);
    remove(path);
    return n / 2;
}

static void case_named(sg_ctx *ctx, sg_tensor *x, const double *xv, const double *wv,
                       const char *name) {
    sg_fn *fn = NULL;
    sg_tensor *out[2];
    sg_compile_opts o = {.name = "named", .backend_name = name};
    bool ok = TU_EXPECT(sg_compile(ctx, step, NULL, 1, 2, &o, &fn) == SG_OK);
    for (int r = 0; ok && r < 2; r++)
        ok = TU_EXPECT(sg_call(fn, &x, 1, out, 2) == SG_OK) && check(out, xv, wv);
    sg_fn_stats st;
    sg_fn_get_stats(fn, &st);
    int irops = explain_int(fn, "capture 1: ");
    char names[2048];
    int per_replay = ok ? trace_kernels(fn, x, names, sizeof names) : -1;
    bool inductor = !name || !strcmp(name, "inductor");
    if (inductor) {
        ok = ok && TU_EXPECT(st.compiles == 1) && TU_EXPECT(per_replay >= 1) &&
             TU_EXPECT(per_replay < irops) && TU_EXPECT(strncmp(names, "sg_k0_", 6) == 0);
    } else {
        ok = ok && TU_EXPECT(st.compiles == 0) && TU_EXPECT(st.replays >= 2) &&
             TU_EXPECT(strstr(sg_fn_explain(fn), "unfused, eager kernels op by op"));
        if (!strcmp(name, "eager"))
            ok = ok && TU_EXPECT(per_replay == irops) &&
                 TU_EXPECT(count_word(names, "_sin ") == 4) &&
                 TU_EXPECT(count_word(names, "_exp ") == 2);
        else /* the second sin merged with the first, exp dropped */
            ok = ok && TU_EXPECT(per_replay == irops - 2) &&
                 TU_EXPECT(count_word(names, "_sin ") == 2) &&
                 TU_EXPECT(count_word(names, "_exp ") == 0) &&
                 TU_EXPECT(count_word(names, "_sum ") == 2);
    }
    tu_case(ok, "BACKEND_NAME(%s, x=f32[4,8]) seed=3: %d IR ops, %d kernels per replay: %s",
            name ? name : "NULL", irops, per_replay, names);
    sg_fn_destroy(fn);
}

static void case_custom(sg_ctx *ctx, sg_tensor *x, const double *xv, const double *wv, bool take,
                        sg_status give, bool strict) {
    seen s = {.take = take, .give = give};
    sg_compile_opts o = {
        .name = "custom", .backend_fn = backend, .backend_user = &s, .strict = strict};
    sg_fn *fn = NULL;
    sg_tensor *out[2];
    step_calls = run_calls = backend_calls = 0;
    bool ok = TU_EXPECT(sg_compile(ctx, step, NULL, 1, 2, &o, &fn) == SG_OK);
    sg_status cs = SG_OK;
    for (int r = 0; ok && r < 3 && cs == SG_OK; r++) {
        cs = sg_call(fn, &x, 1, out, 2);
        if (cs == SG_OK) ok = check(out, xv, wv);
    }
    sg_fn_stats st;
    sg_fn_get_stats(fn, &st);
    ok = ok && TU_EXPECT(backend_calls == 1) && TU_EXPECT(s.kernels >= 1) &&
         TU_EXPECT(strncmp(s.first_name, "sg_k0_", 6) == 0) &&
         TU_EXPECT(count_word(s.ops, "sin ") == 1) && TU_EXPECT(count_word(s.ops, "exp ") == 0) &&
         TU_EXPECT(count_word(s.ops, "mul ") == 1) && TU_EXPECT(count_word(s.ops, "add ") == 1) &&
         TU_EXPECT(count_word(s.ops, "sum ") == 1) && TU_EXPECT(s.nin == 1) &&
         TU_EXPECT(s.ndim_in == 2 && s.shape_in[0] == R && s.shape_in[1] == C) &&
         TU_EXPECT(s.nout == 2) && TU_EXPECT(s.ndim_out[0] == 2 && s.shape_out[0][1] == C) &&
         TU_EXPECT(s.ndim_out[1] == 1 && s.shape_out[1][0] == R);
    const char *what;
    if (give != SG_OK && strict) {
        what = "fails: strict makes the call fail with its status";
        ok = ok && TU_EXPECT(cs == give) && TU_EXPECT(strstr(sg_last_error(ctx), "backend_fn"));
        sg_clear_error(ctx);
    } else if (give != SG_OK) {
        what = "fails: a fallback, the capture replays op by op";
        ok = ok && TU_EXPECT(cs == SG_OK) && TU_EXPECT(st.replays == 3) &&
             TU_EXPECT(strstr(sg_fn_explain(fn), "unfused, eager kernels op by op")) &&
             TU_EXPECT(run_calls == 0) && TU_EXPECT(st.compiles == 0);
    } else if (take) {
        what = "takes over: its step runs every call";
        ok = ok && TU_EXPECT(cs == SG_OK) && TU_EXPECT(run_calls == 3) &&
             TU_EXPECT(step_calls == 1) && TU_EXPECT(st.compiles == 0) &&
             TU_EXPECT(st.replays == 0 && st.fallbacks == 0);
    } else {
        what = "declines: stepgraph compiles and replays";
        ok = ok && TU_EXPECT(cs == SG_OK) && TU_EXPECT(run_calls == 0) &&
             TU_EXPECT(st.compiles == 1) && TU_EXPECT(st.replays == 3);
    }
    tu_case(ok, "BACKEND_FN(x=f32[4,8], %s) seed=3: saw %d kernels, ops %s", what, s.kernels,
            s.ops);
    sg_fn_destroy(fn);
}

int main(void) {
    sg_ctx *ctx = NULL;
    sg_ctx_opts co = {.backend = SG_BACKEND_CPU};
    if (sg_ctx_create(&co, &ctx) != SG_OK) return 1;
    tu_seed(3);
    double *xv = NULL, *wv = NULL;
    int64_t shape[2] = {R, C};
    sg_tensor *x = tu_rand(ctx, SG_F32, 2, shape, -2, 2, &xv);
    w = tu_rand(ctx, SG_F32, 2, shape, -1, 1, &wv);

    case_named(ctx, x, xv, wv, NULL);
    case_named(ctx, x, xv, wv, "inductor");
    case_named(ctx, x, xv, wv, "eager");
    case_named(ctx, x, xv, wv, "aot_eager");
    sg_fn *bad = NULL;
    sg_compile_opts o = {.backend_name = "tvm"};
    bool ok = TU_EXPECT(sg_compile(ctx, step, NULL, 1, 2, &o, &bad) == SG_ERR_INVALID_ARG) &&
              TU_EXPECT(bad == NULL) && TU_EXPECT(strstr(sg_last_error(ctx), "'tvm'"));
    sg_clear_error(ctx);
    tu_case(ok, "BACKEND_NAME(tvm): SG_ERR_INVALID_ARG naming it");

    case_custom(ctx, x, xv, wv, true, SG_OK, false);
    case_custom(ctx, x, xv, wv, false, SG_OK, false);
    case_custom(ctx, x, xv, wv, false, SG_ERR_UNSUPPORTED, false);
    case_custom(ctx, x, xv, wv, false, SG_ERR_UNSUPPORTED, true);

    sg_release(x);
    sg_release(w);
    sg_ctx_destroy(ctx);
    free(xv);
    free(wv);
    return tu_finish();
}
