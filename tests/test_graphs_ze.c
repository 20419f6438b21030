/* SPDX-License-Identifier: MIT */
/*
 * test_graphs_ze.c -- the Level Zero backend's whole call sequence against
 * a fake driver (tests/fake_ze/) that the real loader takes through
 * ZE_ENABLE_ALT_DRIVERS: context creation, eager upload and download, a
 * module from SPIR-V built by libocloc (a hand-made SPIR-V header when
 * libocloc is absent, said in the case's line), launches run by C kernels
 * registered here and checked against f64 references on random inputs, a
 * recorded command list replayed, an address table moved (an upload, no
 * re-record) and a launch argument moved (a re-record), and the frees; the
 * driver's call log is checked at each step. With the OpenCL C generator
 * in the build, also an eager op (a one-op capture whose one kernel gets a
 * table of the tensors' addresses, its unit reused by signature) and a
 * compiled step (one recorded list replayed, a moved input one table
 * upload); the fake driver runs no SPIR-V, so those check addresses and
 * launches, not numbers, unless it runs in its OpenCL mode (FAKE_ZE_OPENCL,
 * the test_graphs_ze_opencl variant): then every kernel, the registered
 * ones' sources included, runs for real and the generated cases check
 * their numbers too. Before that, in a child
 * process, the path with the real loader and no driver: sg_ctx_create
 * fails with zeInit's result in the message, and the process goes on (a
 * call after a failed zeInit would crash it); skipped without a loader and
 * in sanitizer builds, which keep the installed drivers unopened.
 */
#define _GNU_SOURCE /* setenv, unsetenv */

#include "capture/capture.h"
#include "graphs/ze/ze.h"
#include "testutil.h"

#include <dlfcn.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#ifdef FAKE_ZE_PATH
#include "fake_ze/fake_ze.h"

static fake_ze_register_fn fz_register;
static fake_ze_calls_fn fz_calls;
static fake_ze_clear_fn fz_clear;
static fake_ze_nlaunches_fn fz_nlaunches;
static fake_ze_launch_at_fn fz_launch;
static fake_ze_live_fn fz_live;

static const char kernels_cl[] =
    "__kernel void scale(__global float *y, __global const float *x, float a, uint n) {\n"
    "    uint i = get_global_id(0);\n"
    "    if (i < n) y[i] = a * x[i];\n"
    "}\n"
    "__kernel void table_add(__global const ulong *table, uint n) {\n"
    "    __global const float *x = (__global const float *)table[0];\n"
    "    __global float *y = (__global float *)table[1];\n"
    "    uint i = get_global_id(0);\n"
    "    if (i < n) y[i] = x[i] + 1.0f;\n"
    "}\n";

/* The kernels as the fake device runs them: the whole range at once. */
static void *arg_ptr(const fake_ze_launch *l, int i) {
    void *p;
    memcpy(&p, l->value[i], sizeof p);
    return p;
}
static uint64_t global_size(const fake_ze_launch *l) {
    return (uint64_t)l->groups[0] * l->gsize[0];
}
static void run_scale(const fake_ze_launch *l) {
    float *y = arg_ptr(l, 0), a;
    const float *x = arg_ptr(l, 1);
    uint32_t n;
    memcpy(&a, l->value[2], 4);
    memcpy(&n, l->value[3], 4);
    for (uint64_t i = 0; i < global_size(l) && i < n; i++) y[i] = a * x[i];
}
static void run_table_add(const fake_ze_launch *l) {
    const uint64_t *table = arg_ptr(l, 0);
    uint32_t n;
    memcpy(&n, l->value[1], 4);
    const float *x = (const float *)(uintptr_t)table[0];
    float *y = (float *)(uintptr_t)table[1];
    for (uint64_t i = 0; i < global_size(l) && i < n; i++) y[i] = x[i] + 1.0f;
}

static int count_calls(const char *name) {
    int n = 0;
    size_t l = strlen(name);
    for (const char *p = fz_calls(); (p = strstr(p, name)); p += l)
        if ((p == fz_calls() || p[-1] == '\n') && p[l] == '\n') n++;
    return n;
}

static bool near_all(const char *what, const float *got, const double *ref, int n) {
    for (int i = 0; i < n; i++)
        if (fabs(got[i] - ref[i]) > 1e-5 * fabs(ref[i]) + 1e-6) {
            fprintf(stderr, "  %s[%d] = %.9g, expected %.9g\n", what, i, got[i], ref[i]);
            return false;
        }
    return true;
}

#define N 1000
#define GS 64u

typedef struct bufs {
    float *x, *y, *z, *x2, *z2; /* device */
    uint64_t *table;            /* device: {y, z} */
    float hx[N], hx2[N], a;
} bufs;

static void case_init(sg_ctx *ctx) {
    sg_backend_info b[4];
    int n = 0;
    bool ok = TU_EXPECT(sg_ctx_backend(ctx) == SG_BACKEND_ZE) &&
              TU_EXPECT(strcmp(sg__ze_device_name(ctx), "stepgraph fake GPU") == 0) &&
              TU_EXPECT(sg__ze_device_memory(ctx) == (size_t)1 << 30) &&
              TU_EXPECT(count_calls("zeInit") >= 1) &&
              TU_EXPECT(count_calls("zeContextCreate") == 1) &&
              TU_EXPECT(count_calls("zeCommandListCreateImmediate(sync)") == 1) &&
              TU_EXPECT(count_calls("zeCommandQueueCreate") == 1) &&
              TU_EXPECT(count_calls("zeFenceCreate") == 1) &&
              TU_EXPECT(sg_list_backends(b, 4, &n) == SG_OK) &&
              TU_EXPECT(b[2].backend == SG_BACKEND_ZE && b[2].built && b[2].available);
    tu_case(ok, "ZE_INIT(fake driver through ZE_ENABLE_ALT_DRIVERS: zeInit, context, sync "
                "immediate list, queue, fence)");
}

static void case_eager(sg_ctx *ctx, uint64_t seed) {
    tu_seed(seed);
    float h[N], back[N];
    for (int i = 0; i < N; i++) h[i] = (float)tu_uniform(-3, 3);
    fz_clear();
    int64_t shape[1] = {N};
    sg_tensor *t = sg_from_host(ctx, SG_F32, 1, shape, h);
    bool ok = TU_EXPECT(t != NULL) && TU_EXPECT(sg_read(t, back, sizeof back) == SG_OK) &&
              TU_EXPECT(memcmp(h, back, sizeof h) == 0) &&
              TU_EXPECT(count_calls("zeMemAllocDevice") == 1) &&
              TU_EXPECT(count_calls("zeCommandListAppendMemoryCopy") >= 2);
    sg_release(t);
    tu_case(ok, "ZE_EAGER(upload, download, f32 [%d] bit for bit) seed=%llu", N,
            (unsigned long long)seed);
}

/* The two kernels: from libocloc's SPIR-V, or a hand-made module header
 * when libocloc is absent (the fake driver checks only the magic). */
/* Whether libocloc builds OpenCL C here (case_module finds out): the
 * generated cases need it. */
static bool have_ocloc = true;
/* Whether the fake driver runs the real kernels (its OpenCL mode). */
static bool real_kernels;

/* t's values against ref, when the kernels ran for real. */
static bool real_numbers(const char *what, sg_tensor *t, const double *ref, int n) {
    if (!real_kernels) return true;
    float got[1100];
    return TU_EXPECT(n <= 1100) && TU_EXPECT(sg_read(t, got, sizeof(float) * (size_t)n) == SG_OK) &&
           near_all(what, got, ref, n);
}

static bool case_module(sg_ctx *ctx, sg__ze_kfn **scale, sg__ze_kfn **tadd) {
    fz_clear();
    const char *how = "libocloc";
    sg_status s = sg__ze_kernel(ctx, "ze_test_kernels", kernels_cl, "scale", scale);
    if (s == SG_ERR_BACKEND_UNAVAILABLE) {
        have_ocloc = false;
        printf("  skip the libocloc part: %s\n", sg_last_error(ctx));
        sg_clear_error(ctx);
        how = "hand-made SPIR-V header (no libocloc)";
        static const uint32_t header[5] = {0x07230203u, 0x00010000u, 0, 16, 0};
        s = sg__ze_kernel_spirv(ctx, "ze_test_kernels", header, sizeof header, "scale", scale);
        if (s == SG_OK)
            s = sg__ze_kernel_spirv(ctx, "ze_test_kernels", header, sizeof header, "table_add",
                                    tadd);
    } else if (s == SG_OK) {
        s = sg__ze_kernel(ctx, "ze_test_kernels", kernels_cl, "table_add", tadd);
    }
    if (s != SG_OK) fprintf(stderr, "  %s\n", sg_last_error(ctx));
    bool ok = TU_EXPECT(s == SG_OK) && TU_EXPECT(count_calls("zeModuleCreate") == 1) &&
              TU_EXPECT(count_calls("zeKernelCreate") == 2);
    /* Asking again costs nothing; a module that is not SPIR-V is refused
     * with the driver's build log in the message. */
    sg__ze_kfn *again = NULL, *bad = NULL;
    ok = ok &&
         TU_EXPECT(sg__ze_kernel(ctx, "ze_test_kernels", kernels_cl, "scale", &again) == SG_OK ||
                   strcmp(how, "libocloc") != 0) &&
         TU_EXPECT(strcmp(how, "libocloc") != 0 || again == *scale);
    sg_clear_error(ctx);
    static const char junk[24] = "this is not SPIR-V....";
    ok = ok &&
         TU_EXPECT(sg__ze_kernel_spirv(ctx, "junk", junk, sizeof junk, "k", &bad) ==
                   SG_ERR_COMPILE) &&
         TU_EXPECT(strstr(sg_last_error(ctx), "is not SPIR-V") != NULL) &&
         TU_EXPECT(count_calls("zeModuleCreate") == 2);
    sg_clear_error(ctx);
    tu_case(ok,
            "ZE_MODULE(%s: one module, kernels scale and table_add; junk refused with the "
            "build log)",
            how);
    return ok;
}

static sg_status dev_upload(sg_ctx *ctx, size_t bytes, const void *host, void **dev) {
    sg_status s = sg__dev_alloc(ctx, bytes, dev);
    if (s == SG_OK && host) s = ctx->exec.upload(ctx, *dev, host, bytes);
    return s;
}

static void case_launch(sg_ctx *ctx, sg__ze_kfn *scale, bufs *b, uint64_t seed) {
    tu_seed(seed);
    for (int i = 0; i < N; i++) b->hx[i] = (float)tu_uniform(-2, 2);
    b->a = (float)tu_uniform(0.5, 2);
    fz_clear();
    bool ok = TU_EXPECT(dev_upload(ctx, sizeof b->hx, b->hx, (void **)&b->x) == SG_OK) &&
              TU_EXPECT(dev_upload(ctx, sizeof b->hx, NULL, (void **)&b->y) == SG_OK);
    uint32_t n = N, groups[3] = {(N + GS - 1) / GS, 1, 1}, gsize[3] = {GS, 1, 1};
    sg__ze_arg args[4] = {{8, &b->y}, {8, &b->x}, {4, &b->a}, {4, &n}};
    float y[N];
    double ref[N];
    for (int i = 0; i < N; i++) ref[i] = (double)b->a * b->hx[i];
    ok = ok && TU_EXPECT(sg__ze_launch(ctx, scale, groups, gsize, 4, args) == SG_OK) &&
         TU_EXPECT(ctx->exec.download(ctx, y, b->y, sizeof y) == SG_OK) &&
         TU_EXPECT(near_all("y", y, ref, N)) && TU_EXPECT(fz_nlaunches() == 1);
    if (ok) {
        const fake_ze_launch *l = fz_launch(0);
        ok = TU_EXPECT(strcmp(l->name, "scale") == 0) && TU_EXPECT(l->groups[0] == groups[0]) &&
             TU_EXPECT(l->gsize[0] == GS) && TU_EXPECT(l->nargs == 4) &&
             TU_EXPECT(arg_ptr(l, 0) == b->y && arg_ptr(l, 1) == b->x) &&
             TU_EXPECT(count_calls("zeCommandListAppendLaunchKernel") == 1);
    }
    tu_case(ok, "ZE_LAUNCH(eager scale f32 [%d], a=%.4f, %u groups of %u) seed=%llu", N, b->a,
            groups[0], GS, (unsigned long long)seed);
}

/* scale then table_add recorded once, replayed; then the table's z moved
 * (an upload: the list stays) and scale's x moved (a re-record). */
static void case_record(sg_ctx *ctx, sg__ze_kfn *scale, sg__ze_kfn *tadd, bufs *b, uint64_t seed) {
    tu_seed(seed);
    for (int i = 0; i < N; i++) b->hx2[i] = (float)tu_uniform(-2, 2);
    uint64_t table[2];
    bool ok = TU_EXPECT(dev_upload(ctx, sizeof b->hx, NULL, (void **)&b->z) == SG_OK) &&
              TU_EXPECT(dev_upload(ctx, sizeof b->hx, NULL, (void **)&b->z2) == SG_OK) &&
              TU_EXPECT(dev_upload(ctx, sizeof b->hx2, b->hx2, (void **)&b->x2) == SG_OK);
    table[0] = (uint64_t)(uintptr_t)b->y, table[1] = (uint64_t)(uintptr_t)b->z;
    ok = ok && TU_EXPECT(dev_upload(ctx, sizeof table, table, (void **)&b->table) == SG_OK);
    uint32_t n = N, groups[3] = {(N + GS - 1) / GS, 1, 1}, gsize[3] = {GS, 1, 1};
    sg__ze_arg sargs[4] = {{8, &b->y}, {8, &b->x}, {4, &b->a}, {4, &n}};
    sg__ze_arg targs[2] = {{8, &b->table}, {4, &n}};
    sg__ze_rec *r = NULL;
    int i0 = -1, i1 = -1;
    fz_clear();
    ok = ok && TU_EXPECT(sg__ze_rec_create(ctx, &r) == SG_OK) &&
         TU_EXPECT(sg__ze_rec_launch(ctx, r, scale, groups, gsize, 4, sargs, &i0) == SG_OK) &&
         TU_EXPECT(sg__ze_rec_launch(ctx, r, tadd, groups, gsize, 2, targs, &i1) == SG_OK) &&
         TU_EXPECT(i0 == 0 && i1 == 1) && TU_EXPECT(fz_nlaunches() == 0); /* recorded, not run */
    float z[N];
    double ref[N], ref2[N];
    for (int i = 0; i < N; i++) ref[i] = (double)b->a * b->hx[i] + 1.0;
    for (int i = 0; i < N; i++) ref2[i] = (double)b->a * b->hx2[i] + 1.0;
    ok = ok && TU_EXPECT(sg__ze_rec_replay(ctx, r) == SG_OK) &&
         TU_EXPECT(ctx->exec.download(ctx, z, b->z, sizeof z) == SG_OK) &&
         TU_EXPECT(near_all("z", z, ref, N)) && TU_EXPECT(fz_nlaunches() == 2) &&
         TU_EXPECT(count_calls("zeCommandListClose") == 1) &&
         TU_EXPECT(count_calls("zeCommandQueueExecuteCommandLists") == 1) &&
         TU_EXPECT(count_calls("zeFenceHostSynchronize") == 1);
    tu_case(ok, "ZE_RECORD(scale + table_add recorded once, replayed, f32 [%d]) seed=%llu", N,
            (unsigned long long)seed);

    /* The table's output moves: an upload, and the same recorded list. */
    table[1] = (uint64_t)(uintptr_t)b->z2;
    fz_clear();
    ok = ok && TU_EXPECT(ctx->exec.upload(ctx, b->table, table, sizeof table) == SG_OK) &&
         TU_EXPECT(sg__ze_rec_replay(ctx, r) == SG_OK) &&
         TU_EXPECT(ctx->exec.download(ctx, z, b->z2, sizeof z) == SG_OK) &&
         TU_EXPECT(near_all("z2", z, ref, N)) && TU_EXPECT(sg__ze_rec_recordings(r) == 1) &&
         TU_EXPECT(count_calls("zeCommandListReset") == 0) &&
         TU_EXPECT(count_calls("zeCommandListAppendLaunchKernel") == 0);
    tu_case(ok, "ZE_MOVED_TABLE(address table updated by an upload, no re-record) seed=%llu",
            (unsigned long long)seed);

    /* scale's input moves: recorded arguments are fixed, so the list is
     * recorded again before the replay. */
    sg__ze_arg nx = {8, &b->x2};
    fz_clear();
    ok = ok && TU_EXPECT(sg__ze_rec_set_arg(ctx, r, i0, 1, &nx) == SG_OK) &&
         TU_EXPECT(sg__ze_rec_replay(ctx, r) == SG_OK) &&
         TU_EXPECT(ctx->exec.download(ctx, z, b->z2, sizeof z) == SG_OK) &&
         TU_EXPECT(near_all("z2", z, ref2, N)) && TU_EXPECT(sg__ze_rec_recordings(r) == 2) &&
         TU_EXPECT(count_calls("zeCommandListReset") == 1) &&
         TU_EXPECT(count_calls("zeCommandListAppendLaunchKernel") == 2) &&
         TU_EXPECT(fz_nlaunches() == 2) && TU_EXPECT(arg_ptr(fz_launch(0), 1) == b->x2);
    /* A set_arg that changes nothing records nothing. */
    ok = ok && TU_EXPECT(sg__ze_rec_set_arg(ctx, r, i0, 1, &nx) == SG_OK) &&
         TU_EXPECT(sg__ze_rec_replay(ctx, r) == SG_OK) && TU_EXPECT(sg__ze_rec_recordings(r) == 2);
    tu_case(ok, "ZE_MOVED_ARG(launch argument changed: list re-recorded, replayed) seed=%llu",
            (unsigned long long)seed);
    sg__ze_rec_free(ctx, r);
}

/* Whether the table a launch received holds address p among its n entries. */
static bool table_has(const fake_ze_launch *l, int n, const void *p) {
    char *const *table = arg_ptr(l, 0);
    for (int i = 0; i < n; i++)
        if (table[i] == p) return true;
    return false;
}

/* An eager op is a one-op capture in the OpenCL C dialect: one generated
 * kernel whose one argument is a table holding the tensors' addresses; the
 * same op again reuses the unit; a row op is one row kernel; a reduction
 * CUDA runs as a library kernel (max) is one generated kernel too, and so
 * is a data op CUDA runs as one (topk's indices); an op with more tensors
 * than an eager table holds (a concat of 8) names itself as not on ze. */
static void case_generated_eager(sg_ctx *ctx, uint64_t seed) {
    tu_seed(seed);
    int64_t shape[2] = {37, 29};
    double *va, *vb, ref[37 * 29], ref2[37 * 29], refmax[37];
    int64_t reftop[37 * 2];
    sg_tensor *a = tu_rand(ctx, SG_F32, 2, shape, -1, 1, &va);
    sg_tensor *b = tu_rand(ctx, SG_F32, 2, shape, -1, 1, &vb);
    for (int i = 0; i < 37 * 29; i++) ref[i] = (float)(va[i] + vb[i]), ref2[i] = ref[i] + vb[i];
    for (int r = 0; r < 37; r++) {
        refmax[r] = va[r * 29];
        for (int j = 1; j < 29; j++) refmax[r] = va[r * 29 + j] > refmax[r] ? va[r * 29 + j] : refmax[r];
        int64_t first = 0, second = -1; /* the two largest, the lower index first among equals */
        for (int j = 1; j < 29; j++)
            if (va[r * 29 + j] > va[r * 29 + first]) first = j;
        for (int j = 0; j < 29; j++)
            if (j != first && (second < 0 || va[r * 29 + j] > va[r * 29 + second])) second = j;
        reftop[2 * r] = first, reftop[2 * r + 1] = second;
    }
    free(va), free(vb);
    fz_clear();
    sg_tensor *c = sg_add(a, b);
    if (!c) fprintf(stderr, "  %s\n", sg_last_error(ctx));
    bool ok = TU_EXPECT(c != NULL) && TU_EXPECT(fz_nlaunches() == 1) &&
              TU_EXPECT(count_calls("zeModuleCreate") == 1);
    if (ok) {
        const fake_ze_launch *l = fz_launch(0);
        ok = TU_EXPECT(l->nargs == 1 && l->size[0] == sizeof(void *)) &&
             TU_EXPECT((uint64_t)l->groups[0] * l->gsize[0] >= 37 * 29 / 4) &&
             TU_EXPECT(table_has(l, 3, sg__data(a)) && table_has(l, 3, sg__data(b)) &&
                       table_has(l, 3, sg__data(c)));
        printf("  add: kernel %s, %u groups of %u\n", l->name, l->groups[0], l->gsize[0]);
    }
    fz_clear();
    sg_tensor *d = sg_add(c, b); /* the same signature: no new unit */
    ok = ok && TU_EXPECT(real_numbers("c", c, ref, 37 * 29)) &&
         TU_EXPECT(real_numbers("d", d, ref2, 37 * 29));
    ok = ok && TU_EXPECT(d != NULL) && TU_EXPECT(fz_nlaunches() == 1) &&
         TU_EXPECT(count_calls("zeModuleCreate") == 0) &&
         TU_EXPECT(table_has(fz_launch(0), 3, sg__data(d)) &&
                   table_has(fz_launch(0), 3, sg__data(c)));
    fz_clear();
    sg_tensor *sm = sg_softmax(a, -1); /* a row kernel: a work-group per row */
    ok = ok && TU_EXPECT(sm != NULL) && TU_EXPECT(fz_nlaunches() == 1) &&
         TU_EXPECT(strstr(fz_launch(0)->name, "softmax") != NULL) &&
         TU_EXPECT(fz_launch(0)->groups[0] == 37 && fz_launch(0)->gsize[0] == 32);
    int last = 1;
    fz_clear();
    sg_tensor *mx = sg_max(a, 1, &last, false); /* CUDA's library reduction: generated */
    ok = ok && TU_EXPECT(mx != NULL) && TU_EXPECT(fz_nlaunches() == 1) &&
         TU_EXPECT(real_numbers("max", mx, refmax, 37));
    fz_clear();
    sg_tensor *tk = sg_topk_indices(a, 2); /* CUDA's library data kernel: generated */
    int64_t got[37 * 2];
    ok = ok && TU_EXPECT(tk != NULL) && TU_EXPECT(fz_nlaunches() == 1) &&
         TU_EXPECT(strstr(fz_launch(0)->name, "topk") != NULL);
    if (ok && real_kernels) {
        ok = TU_EXPECT(sg_read(tk, got, sizeof got) == SG_OK);
        for (int i = 0; ok && i < 37 * 2; i++)
            if (got[i] != reftop[i])
                ok = TU_EXPECT(got[i] == reftop[i]) &&
                     fprintf(stderr, "  topk[%d]: %lld, want %lld\n", i, (long long)got[i],
                             (long long)reftop[i]) < 0;
    }
    sg_tensor *parts[8] = {a, b, a, b, a, b, a, b};
    sg_tensor *cat = sg_concat(8, parts, 0); /* 9 tensors: more than an eager table takes */
    ok = ok && TU_EXPECT(cat == NULL) &&
         TU_EXPECT(strstr(sg_last_error(ctx), "not yet on the ze backend") != NULL) &&
         TU_EXPECT(strstr(sg_last_error(ctx), "concat") != NULL);
    printf("  %s\n", sg_last_error(ctx));
    sg_clear_error(ctx);
    sg_release(a), sg_release(b), sg_release(c), sg_release(d), sg_release(sm), sg_release(mx);
    sg_release(tk);
    tu_case(ok,
            "ZE_GENERATED_EAGER(add f32 [37,29] as a one-op OpenCL C unit, reused by "
            "signature; softmax: one generated row kernel; max and topk k=2: one generated "
            "kernel each; concat of 8: not yet on the ze backend%s) "
            "seed=%llu",
            real_kernels ? "; numbers from the real kernels" : "", (unsigned long long)seed);
}

static sg_status step_fn(sg_ctx *ctx, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)ctx, (void)user;
    out[0] = sg_add(sg_mul(in[0], in[0]), in[1]);
    return out[0] ? SG_OK : SG_ERR_INTERNAL;
}

/* A compiled step in reduce-overhead: one recorded command list per output
 * set, replayed; an input at a new address is one table upload. */
static void case_compiled(sg_ctx *ctx, uint64_t seed) {
    tu_seed(seed);
    int64_t shape[1] = {300};
    double *vx, *vy, *vx2, ref[300], ref2[300];
    sg_tensor *x = tu_rand(ctx, SG_F32, 1, shape, -1, 1, &vx);
    sg_tensor *y = tu_rand(ctx, SG_F32, 1, shape, -1, 1, &vy);
    sg_tensor *x2 = tu_rand(ctx, SG_F32, 1, shape, -1, 1, &vx2);
    for (int i = 0; i < 300; i++) ref[i] = vx[i] * vx[i] + vy[i], ref2[i] = vx2[i] * vx2[i] + vy[i];
    free(vx), free(vy), free(vx2);
    sg_compile_opts o = {.mode = SG_MODE_REDUCE_OVERHEAD, .name = "ze_step", .output_sets = 1};
    sg_fn *fn = NULL;
    bool ok = TU_EXPECT(sg_compile(ctx, step_fn, NULL, 2, 1, &o, &fn) == SG_OK);
    sg_tensor *in[2] = {x, y}, *out[1] = {NULL};
    fz_clear();
    sg_status s = sg_call(fn, in, 2, out, 1);
    if (s != SG_OK) fprintf(stderr, "  %s\n", sg_last_error(ctx));
    ok = ok && TU_EXPECT(s == SG_OK) && TU_EXPECT(count_calls("zeCommandListCreate") == 1) &&
         TU_EXPECT(count_calls("zeCommandQueueExecuteCommandLists") == 1) &&
         TU_EXPECT(fz_nlaunches() >= 1);
    int nl = fz_nlaunches();
    ok = ok && TU_EXPECT(nl >= 1 && table_has(fz_launch(0), 8, sg__data(x))) &&
         TU_EXPECT(real_numbers("x*x+y", out[0], ref, 300));
    in[0] = x2;
    fz_clear();
    s = sg_call(fn, in, 2, out, 1);
    ok = ok && TU_EXPECT(s == SG_OK) && TU_EXPECT(count_calls("zeCommandListCreate") == 0) &&
         TU_EXPECT(count_calls("zeCommandListReset") == 0) &&
         TU_EXPECT(count_calls("zeCommandListAppendLaunchKernel") == 0) &&
         TU_EXPECT(count_calls("zeCommandQueueExecuteCommandLists") == 1) &&
         TU_EXPECT(fz_nlaunches() == nl) && TU_EXPECT(table_has(fz_launch(0), 8, sg__data(x2))) &&
         TU_EXPECT(real_numbers("x2*x2+y", out[0], ref2, 300));
    printf("  %s\n", sg_fn_explain(fn));
    sg_fn_destroy(fn);
    sg_release(x), sg_release(y), sg_release(x2);
    tu_case(ok,
            "ZE_COMPILED(x*x+y f32 [300], reduce-overhead: one recorded list replayed; a new "
            "input address is a table upload) seed=%llu",
            (unsigned long long)seed);
}

/* A matmul on ze (no BLAS library there) is the generated GEMM: an eager
 * sg_linear with bias is one launch of 64 x 64 tiles, 256 work-items each,
 * whose table holds x, w, the bias and the output. */
static void case_generated_gemm(sg_ctx *ctx, uint64_t seed) {
    tu_seed(seed);
    int64_t xs[2] = {70, 33}, ws[2] = {130, 33}, bs[1] = {130};
    sg_tensor *x = tu_rand(ctx, SG_BF16, 2, xs, -1, 1, NULL);
    sg_tensor *w = tu_rand(ctx, SG_BF16, 2, ws, -1, 1, NULL);
    sg_tensor *b = tu_rand(ctx, SG_BF16, 1, bs, -1, 1, NULL);
    fz_clear();
    sg_tensor *y = sg_linear(x, w, b);
    if (!y) fprintf(stderr, "  %s\n", sg_last_error(ctx));
    bool ok = TU_EXPECT(y != NULL) && TU_EXPECT(fz_nlaunches() == 1);
    if (ok) {
        const fake_ze_launch *l = fz_launch(0);
        ok = TU_EXPECT(l->nargs == 1) && TU_EXPECT(l->gsize[0] == 256) &&
             TU_EXPECT(l->groups[0] == 2 * 3) &&
             TU_EXPECT(table_has(l, 4, sg__data(x)) && table_has(l, 4, sg__data(w)) &&
                       table_has(l, 4, sg__data(b)) && table_has(l, 4, sg__data(y)));
        printf("  linear: kernel %s, %u groups of %u\n", l->name, l->groups[0], l->gsize[0]);
    }
    sg_clear_error(ctx);
    sg_release(x), sg_release(w), sg_release(b), sg_release(y);
    tu_case(ok,
            "ZE_GENERATED_GEMM(linear bf16 x [70,33] w [130,33] + bias: one generated GEMM "
            "launch of 2 x 3 tiles) seed=%llu",
            (unsigned long long)seed);
}

/* Whether libocloc loads (codegen/codegen.h). */
sg_status sg__ocloc_probe(char *why, size_t n);

static void fake_driver_cases(void) {
    setenv("ZE_ENABLE_ALT_DRIVERS", FAKE_ZE_PATH, 1);
    const char *ocl = getenv("FAKE_ZE_OPENCL");
    real_kernels = ocl && *ocl;
    unsetenv("SG_ZE_LOADER");
    sg_ctx *ctx = NULL;
    sg_ctx_opts o = {.backend = SG_BACKEND_ZE};
    sg_status s = sg_ctx_create(&o, &ctx);
    if (s != SG_OK) {
        tu_case(false, "ZE_INIT(fake driver): sg_ctx_create failed: %s", sg_last_error(NULL));
        return;
    }
    void *lib = dlopen(FAKE_ZE_PATH, RTLD_NOW | RTLD_NOLOAD);
    if (!lib) {
        tu_case(false, "ZE_INIT(the loader did not load the fake driver %s)", FAKE_ZE_PATH);
        sg_ctx_destroy(ctx);
        return;
    }
    fz_register = (fake_ze_register_fn)(uintptr_t)dlsym(lib, "fake_ze_register");
    fz_calls = (fake_ze_calls_fn)(uintptr_t)dlsym(lib, "fake_ze_calls");
    fz_clear = (fake_ze_clear_fn)(uintptr_t)dlsym(lib, "fake_ze_clear");
    fz_nlaunches = (fake_ze_nlaunches_fn)(uintptr_t)dlsym(lib, "fake_ze_nlaunches");
    fz_launch = (fake_ze_launch_at_fn)(uintptr_t)dlsym(lib, "fake_ze_launch_at");
    fz_live = (fake_ze_live_fn)(uintptr_t)dlsym(lib, "fake_ze_live");
    fz_register("scale", run_scale);
    fz_register("table_add", run_table_add);
    case_init(ctx);
    case_eager(ctx, 11);
    sg__ze_kfn *scale = NULL, *tadd = NULL;
    bufs b;
    memset(&b, 0, sizeof b);
    if (case_module(ctx, &scale, &tadd)) {
        case_launch(ctx, scale, &b, 12);
        case_record(ctx, scale, tadd, &b, 13);
    }
    if (have_ocloc) {
        case_generated_eager(ctx, 14);
        case_compiled(ctx, 15);
        case_generated_gemm(ctx, 16);
    } else {
        printf("  skip ZE_GENERATED_EAGER, ZE_COMPILED and ZE_GENERATED_GEMM: no libocloc to build their "
               "units\n");
    }
    void *dev[] = {b.x, b.y, b.z, b.x2, b.z2, b.table};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++)
        if (dev[i]) sg__dev_free(ctx, dev[i], i == 5 ? 16 : sizeof b.hx);
    fz_clear();
    sg_ctx_destroy(ctx);
    bool ok = TU_EXPECT(fz_live() == 0) && TU_EXPECT(count_calls("zeKernelDestroy") >= 2) &&
              TU_EXPECT(count_calls("zeModuleDestroy") >= 1) &&
              TU_EXPECT(count_calls("zeCommandListDestroy") >= 1) &&
              TU_EXPECT(count_calls("zeContextDestroy") == 1) &&
              TU_EXPECT(strstr(fz_calls(), "zeContextDestroy\n")[17] == '\0');
    tu_case(ok, "ZE_FREE(device memory, kernels, module, lists freed; the context last)");
}

/* The real loader and no driver, in a child: exit 0 when the create fails
 * with zeInit's result and the process goes on, 3 when there is no loader. */
static int no_driver_child(void) {
    unsetenv("ZE_ENABLE_ALT_DRIVERS");
    unsetenv("SG_ZE_LOADER");
    sg_ctx *ctx = NULL;
    sg_ctx_opts o = {.backend = SG_BACKEND_ZE};
    sg_status s = sg_ctx_create(&o, &ctx);
    const char *m = sg_last_error(NULL);
    printf("  no driver: %s\n", m);
    if (s == SG_ERR_BACKEND_UNAVAILABLE &&
        (strstr(m, "no Level Zero loader") || strstr(m, "built with a sanitizer")))
        return 3;
    bool ok = TU_EXPECT(s == SG_ERR_BACKEND_UNAVAILABLE) && TU_EXPECT(ctx == NULL) &&
              TU_EXPECT(strstr(m, "zeInit") != NULL) && TU_EXPECT(strstr(m, "0x") != NULL);
    sg_backend_info b[4];
    int n = 0;
    ok = ok && TU_EXPECT(sg_list_backends(b, 4, &n) == SG_OK) &&
         TU_EXPECT(!b[2].available && strstr(b[2].why, "zeInit"));
    /* AUTO goes on to a backend that works, and ops run there. */
    sg_ctx_opts a = {.backend = SG_BACKEND_AUTO};
    ok = ok && TU_EXPECT(sg_ctx_create(&a, &ctx) == SG_OK);
    if (ok) {
        float h[3] = {1.5f, -2, 4}, r[3];
        int64_t shape[1] = {3};
        sg_tensor *t = sg_from_host(ctx, SG_F32, 1, shape, h);
        sg_tensor *u = sg_add(t, t);
        ok = TU_EXPECT(u && sg_read(u, r, sizeof r) == SG_OK) &&
             TU_EXPECT(r[0] == 3 && r[1] == -4 && r[2] == 8);
        sg_ctx_destroy(ctx);
    }
    return ok ? 0 : 1;
}

static void case_no_driver(void) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        int rc = no_driver_child();
        fflush(stdout);
        _exit(rc);
    }
    int st = 0;
    bool ok = TU_EXPECT(pid > 0) && TU_EXPECT(waitpid(pid, &st, 0) == pid);
    if (ok && WIFEXITED(st) && WEXITSTATUS(st) == 3) {
        printf(
            "  skip ZE_NO_DRIVER: no Level Zero loader here, or a sanitizer build (see above)\n");
        return;
    }
    if (ok && WIFSIGNALED(st))
        fprintf(stderr, "  the child died of signal %d after the failed zeInit\n", WTERMSIG(st));
    ok = ok && TU_EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    tu_case(ok, "ZE_NO_DRIVER(real loader, no driver: SG_ERR_BACKEND_UNAVAILABLE with zeInit's "
                "result, no later ze call, AUTO still runs ops)");
}
#endif /* FAKE_ZE_PATH */

int main(void) {
#ifdef FAKE_ZE_PATH
    /* The OpenCL mode runs SPIR-V from libocloc only (absent in sanitizer builds). */
    const char *ocl = getenv("FAKE_ZE_OPENCL");
    char why[512];
    if (ocl && *ocl && sg__ocloc_probe(why, sizeof why) != SG_OK) {
        printf("skip: the fake driver's OpenCL mode needs libocloc's SPIR-V: %s\n", why);
        return 77;
    }
    if (ocl && *ocl && access(ocl, R_OK) != 0) {
        printf("skip: no OpenCL CPU runtime at %s (pip install intel-opencl-rt)\n", ocl);
        return 77;
    }
    /* Nothing may touch the loader before this: it reads its environment
     * once per process. */
    case_no_driver();
    fake_driver_cases();
    return tu_finish();
#else
    printf("skip: this stepgraph's tests were built without the Level Zero headers\n");
    return 77;
#endif
}
