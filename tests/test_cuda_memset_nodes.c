/* SPDX-License-Identifier: MIT */
/*
 * test_cuda_memset_nodes.c -- a recorded graph's small memset nodes run as
 * kernel nodes (graphs/cuda/cuda_graph.c memsets_as_kernels) and change no
 * value. The step: f32 attention (whose FMA kernels keep no logsumexps, so
 * a memset sets them to NaN and the backward recomputes them: a wrong fill
 * gives wrong gradients), the loss sum(o * r), dq, dk and dv. Compiled
 * reduce-overhead twice, with SG_CUDA_MEMSET_NODES=keep and without: the
 * second logs that memset nodes ran as kernels and the first does not; four
 * calls each, every gradient within f32's tolerance of the CPU backend's,
 * and the two recordings' replays the same bits. Exits 77 without a CUDA
 * device.
 */
#define _POSIX_C_SOURCE 200809L
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int converted; /* perf_hints lines that say memset nodes became kernels */

static void on_log(void *user, const char *topic, const char *line) {
    (void)user;
    if (strcmp(topic, "perf_hints") == 0 && strstr(line, "memset nodes of the recording"))
        converted++;
}

/* in: q, k, v, r. out: dq, dk, dv. */
static sg_status step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    bool causal = *(const bool *)user;
    sg_tensor *q = in[0], *k = in[1], *v = in[2];
    sg_tensor *o = sg_sdpa(q, k, v, NULL, causal, 0);
    sg_tensor *loss = sg_sum(sg_mul(o, in[3]), 0, NULL, false);
    if (!loss) return sg_ctx_status(c);
    sg_tensor *wrt[3] = {q, k, v};
    return sg_grad(loss, 3, wrt, out);
}

static void make(sg_ctx *c, const int64_t *shape, uint64_t seed, sg_tensor **x) {
    tu_seed(seed);
    for (int j = 0; j < 4; j++) x[j] = tu_rand(c, SG_F32, 4, shape, -1, 1, NULL);
    for (int j = 0; j < 3; j++) sg_requires_grad_(x[j], true);
}

/* Four calls of the step compiled on cuda (memset nodes kept or not):
 * each against the CPU's gradients; the last call's gradients into got. */
static bool compiled(sg_ctx *cuda, sg_tensor **x, bool causal, bool keep, double *const *ref,
                     int64_t n, double **got) {
    if (keep)
        setenv("SG_CUDA_MEMSET_NODES", "keep", 1);
    else
        unsetenv("SG_CUDA_MEMSET_NODES");
    sg_fn *fn = NULL;
    bool ok =
        TU_EXPECT(sg_compile(cuda, step, &causal, 4, 3,
                             &(sg_compile_opts){.mode = SG_MODE_REDUCE_OVERHEAD}, &fn) == SG_OK);
    for (int call = 0; ok && call < 4; call++) {
        sg_tensor *out[3] = {NULL};
        sg_mark_step_begin(cuda);
        ok = TU_EXPECT(sg_call(fn, x, 4, out, 3) == SG_OK);
        for (int j = 0; ok && j < 3; j++) {
            free(got[j]);
            got[j] = tu_read(out[j]);
            ok = TU_EXPECT(got[j]) && tu_close("gradient", got[j], ref[j], n, 1e-4, 1e-5);
        }
        for (int j = 0; j < 3; j++) sg_release(out[j]);
    }
    if (!ok) fprintf(stderr, "  error: %s\n", sg_last_error(cuda));
    sg_fn_destroy(fn);
    unsetenv("SG_CUDA_MEMSET_NODES");
    return ok;
}

static void run_case(sg_ctx *cpu, sg_ctx *cuda, int64_t B, int64_t H, int64_t T, int64_t D,
                     bool causal, uint64_t seed) {
    int64_t shape[4] = {B, H, T, D}, n = B * H * T * D;
    sg_tensor *xc[4], *xg[4], *ref_t[3] = {NULL};
    make(cpu, shape, seed, xc);
    make(cuda, shape, seed, xg);
    double *ref[3] = {NULL}, *kept[3] = {NULL}, *conv[3] = {NULL};
    sg_mark_step_begin(cpu);
    bool ok = TU_EXPECT(step(cpu, xc, ref_t, &causal) == SG_OK);
    for (int j = 0; ok && j < 3; j++) ok = TU_EXPECT((ref[j] = tu_read(ref_t[j])) != NULL);
    int before = converted;
    ok = ok && compiled(cuda, xg, causal, true, ref, n, kept);
    int after_keep = converted;
    ok = ok && compiled(cuda, xg, causal, false, ref, n, conv);
    ok = ok && TU_EXPECT(after_keep == before) && TU_EXPECT(converted > after_keep);
    for (int j = 0; ok && j < 3; j++)
        ok = TU_EXPECT(memcmp(kept[j], conv[j], sizeof(double) * (size_t)n) == 0);
    tu_case(ok,
            "MEMSET_NODES(q=[%lld,%lld,%lld,%lld]%s,f32): memset nodes as kernels, gradients as "
            "the cpu's and the same bits as with the nodes kept",
            (long long)B, (long long)H, (long long)T, (long long)D, causal ? ",causal" : "");
    for (int j = 0; j < 4; j++) sg_release(xc[j]), sg_release(xg[j]);
    for (int j = 0; j < 3; j++) sg_release(ref_t[j]), free(ref[j]), free(kept[j]), free(conv[j]);
    sg_clear_error(cuda);
    sg_clear_error(cpu);
}

int main(void) {
    sg_ctx *cuda = tu_ctx_on((sg_ctx_opts){.backend = SG_BACKEND_CUDA, .log = on_log});
    sg_ctx *cpu = tu_ctx_on((sg_ctx_opts){.backend = SG_BACKEND_CPU});
    run_case(cpu, cuda, 2, 3, 37, 16, true, 1);
    run_case(cpu, cuda, 1, 2, 64, 32, false, 2);
    run_case(cpu, cuda, 3, 1, 5, 8, true, 3);
    sg_ctx_destroy(cuda);
    sg_ctx_destroy(cpu);
    return tu_finish();
}
