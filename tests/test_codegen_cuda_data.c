/* SPDX-License-Identifier: MIT */
/*
 * test_codegen_cuda_data.c -- the CUDA dialect's horizontal merge of data
 * ops (fuse.c's horizontal_data, cgen_cuda.c's data members of a MULTI):
 * a decode step's two index_copy_ of K and V into their caches at the same
 * positions, from transposed views of one (B, L, 2H, D) projection, become
 * one kernel; an index_copy_ into a cache the step wrote just before stays
 * its own kernel. f32 and bf16, one position and three (one repeated: the
 * last one wins).
 *
 * Each case runs the compiled step on the test's backend (SG_TEST_BACKEND:
 * the CPU's generated C by default, the CUDA kernels under the gpu label)
 * against an f64 reference written here, then fuses its capture with the
 * CUDA options, counts the generated kernels and library calls, and
 * compiles the unit with NVRTC for sm_90 (skipped, not failed, when NVRTC
 * cannot be loaded).
 */
#include "testutil.h"

#include "graphs/graphs.h"
#include "cuda_unit.h"

#include <math.h>
#include <string.h>

enum { B = 2, H = 3, S = 16, D = 8 };

static sg_ctx *ctx;
static bool nvrtc_missing;

typedef struct spec {
    bool dependent; /* the second write goes into the first cache, after a scale */
} spec;

/* in: kcache, vcache, projection (B, L, 2H, D), pos (L). out: the two caches. */
static sg_status kv_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    const spec *s = user;
    sg_tensor *p = in[2], *k = sg_transpose(sg_narrow(p, 2, 0, H), 1, 2);
    sg_tensor *v = sg_transpose(sg_narrow(p, 2, H, H), 1, 2);
    sg_status st = sg_index_copy_(in[0], 2, in[3], k);
    if (st == SG_OK && s->dependent)
        st = sg_index_copy_(in[0], 2, in[3], sg_mul_scalar(sg_index_select(in[0], 2, in[3]), 2.0));
    if (st == SG_OK) st = sg_index_copy_(in[1], 2, in[3], v);
    out[0] = in[0], out[1] = in[1];
    return st != SG_OK ? st : sg_ctx_status(c);
}

/* Fuse fn's last capture with the CUDA options and generate its unit:
 * its kernels, library calls and MULTI groups with data members. */
static bool cuda_unit(sg_fn *fn, const char *name, int *kernels, int *calls, int *merged) {
    *kernels = *calls = *merged = 0;
    if (!TU_EXPECT(fn->ngraphs > 0)) return false;
    sg__graph *g = fn->graphs[fn->ngraphs - 1];
    sg__fuse_opts fo;
    sg__cgen_cuda_fuse_opts(&fo, false);
    sg__fused f;
    if (!TU_EXPECT(sg__fuse(ctx, &g->ir, &fo, &f) == SG_OK)) return false;
    sg__cuda_kinfo *ki = calloc((size_t)(f.ngroups ? f.ngroups : 1), sizeof *ki);
    sg__emit e = {.ctx = ctx};
    bool ok = TU_EXPECT(ki && sg__cgen_cuda(ctx, &g->ir, &f, name, &e, ki, kernels) == SG_OK);
    for (int k = 0; ok && k < f.ngroups; k++) {
        const sg__group *grp = &f.groups[k];
        if ((grp->kind == SG__G_OPAQUE || grp->anchor >= 0) && !ki[k].replaces_call) (*calls)++;
        if (grp->kind == SG__G_MULTI && f.parts[grp->members[0]].kind == SG__G_OPAQUE) (*merged)++;
    }
    if (ok && getenv("SG_TEST_PRINT_CUDA")) fprintf(stderr, "%s\n", e.buf);
    ok = ok && cu_unit_compiles(ctx, name, e.buf, &nvrtc_missing);
    sg__emit_free(&e);
    free(ki);
    sg__fused_free(ctx, &f, &g->ir);
    return ok;
}

/* The caches after the step, in f64 (kc, vc: (B, H, S, D); p: (B, L, 2H, D)). */
static void reference(sg_dtype dt, bool dependent, int64_t L, const int64_t *pos, double *kc,
                      double *vc, const double *p) {
    for (int64_t j = 0; j < L; j++) /* in order: a repeated position keeps the last */
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t d = 0; d < D; d++) {
                    int64_t at = ((b * H + h) * S + pos[j]) * D + d;
                    kc[at] = p[((b * L + j) * 2 * H + h) * D + d];
                    vc[at] = p[((b * L + j) * 2 * H + H + h) * D + d];
                }
    if (!dependent) return;
    /* kc[.., pos[j], ..] = 2 * kc[.., pos[j], ..] (gathered first, then written in order) */
    double *g = malloc(sizeof(double) * (size_t)(B * H * L * D));
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t j = 0; j < L; j++)
                for (int64_t d = 0; d < D; d++)
                    g[((b * H + h) * L + j) * D + d] =
                        tu_round(dt, 2.0 * kc[((b * H + h) * S + pos[j]) * D + d]);
    for (int64_t j = 0; j < L; j++)
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t d = 0; d < D; d++)
                    kc[((b * H + h) * S + pos[j]) * D + d] = g[((b * H + h) * L + j) * D + d];
    free(g);
}

static void test_case(sg_dtype dt, bool dependent, int64_t L, const int64_t *pos) {
    tu_seed((uint64_t)(L * 31 + dt * 7 + dependent));
    int64_t cs[4] = {B, H, S, D}, ps[4] = {B, L, 2 * H, D};
    double *kv, *vv, *pv;
    sg_tensor *in[4] = {tu_rand(ctx, dt, 4, cs, -1, 1, &kv), tu_rand(ctx, dt, 4, cs, -1, 1, &vv),
                        tu_rand(ctx, dt, 4, ps, -1, 1, &pv), sg_from_host(ctx, SG_I64, 1, &L, pos)};
    spec s = {.dependent = dependent};
    sg_fn *fn = NULL;
    bool ok =
        TU_EXPECT(sg_compile(ctx, kv_step, &s, 4, 2,
                             &(sg_compile_opts){.mode = SG_MODE_REDUCE_OVERHEAD}, &fn) == SG_OK);
    sg_tensor *out[2] = {NULL, NULL};
    /* The second call replays what the first captured: the caches take the
     * same values again (the reference applies the step once or twice alike
     * only when it is idempotent: so the dependent case runs once). */
    for (int call = 0; call < (dependent ? 1 : 2) && ok; call++) {
        sg_mark_step_begin(ctx);
        ok = TU_EXPECT(sg_call(fn, in, 4, out, 2) == SG_OK);
        if (!ok) fprintf(stderr, "  %s\n", sg_last_error(ctx));
    }
    char name[128];
    snprintf(name, sizeof name, "KV_WRITE(type=%s,%s,B=%d,H=%d,S=%d,D=%d,pos=[%lld%s])",
             sg_dtype_name(dt), dependent ? "dependent" : "independent", B, H, S, D,
             (long long)pos[0], L > 1 ? ",..." : "");
    if (ok) {
        reference(dt, dependent, L, pos, kv, vv, pv);
        double *gk = tu_read(out[0]), *gv = tu_read(out[1]);
        int64_t n = B * H * S * D;
        ok = TU_EXPECT(gk && gv) && tu_close(name, gk, kv, n, 0, 0) &&
             tu_close(name, gv, vv, n, 0, 0);
        free(gk), free(gv);
    }
    int kernels = 0, calls = 0, merged = 0;
    char uname[96];
    snprintf(uname, sizeof uname, "cu_kv_%s_%d_%lld", sg_dtype_name(dt), (int)dependent,
             (long long)L);
    ok = ok && cuda_unit(fn, uname, &kernels, &calls, &merged) && TU_EXPECT(calls == 0);
    /* independent: one kernel writes both caches; dependent: the gather and
     * scale sit between the writes of kc, so none merge into a MULTI, but
     * all, being small, run in order as one chain kernel in one block */
    ok = ok && (dependent ? TU_EXPECT(kernels == 1) : TU_EXPECT(kernels == 1 && merged == 1));
    tu_case(ok, "%s on %s -> %d CUDA kernels (%d merged data kernels), %d library calls", name,
            tu_backend() == SG_BACKEND_CUDA ? "cuda" : "cpu", kernels, merged, calls);
    sg_fn_destroy(fn);
    for (int k = 0; k < 4; k++) sg_release(in[k]);
    free(kv), free(vv), free(pv);
}

int main(void) {
    ctx = tu_ctx((sg_ctx_opts){0});
    static const int64_t one[1] = {5}, three[3] = {S - 1, 0, S - 1};
    static const sg_dtype dts[2] = {SG_F32, SG_BF16};
    for (int d = 0; d < 2; d++) {
        test_case(dts[d], false, 1, one);
        test_case(dts[d], false, 3, three);
        test_case(dts[d], true, 1, one);
    }
    sg_ctx_destroy(ctx);
    return tu_finish();
}
