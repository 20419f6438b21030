/* SPDX-License-Identifier: MIT */
/*
 * test_graphs_hip_unavailable.c -- the HIP backend where it cannot run. With
 * the HIP runtime installed and no AMD GPU (this machine, CI), asking for
 * HIP is SG_ERR_BACKEND_UNAVAILABLE with a message that names hipInit's
 * result and the fix; with SG_HIP_RUNTIME naming a library that is not
 * there (the test's "noruntime" variant), one that names the library and
 * the fix. Either way sg_list_backends says the same, nothing of the failed
 * context is left in the allocator hook, AUTO picks a backend that runs ops
 * (the CPU here) and the process stays usable; without the runtime hiprtc
 * is unavailable too, with the same reason. Exits 77 where a HIP device
 * is present, or where the library was built without HIP.
 */
#define _POSIX_C_SOURCE 200809L
#include "codegen/codegen.h"
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What the message must say: which case this run is. */
static bool expected(const char *m, const char *runtime) {
    if (runtime && runtime[0]) /* no runtime: the library, where it looked, the fix */
        return TU_EXPECT(strstr(m, "libamdhip64") != NULL) &&
               TU_EXPECT(strstr(m, runtime) != NULL) && TU_EXPECT(strstr(m, "install") != NULL) &&
               TU_EXPECT(strstr(m, "hipInit") == NULL);
    /* a runtime, no device: hipInit's result by number and name, and the fix */
    return TU_EXPECT(strstr(m, "hipInit failed with ") != NULL) &&
           TU_EXPECT(strstr(m, "no device") != NULL) && TU_EXPECT(strstr(m, "amdgpu") != NULL) &&
           TU_EXPECT(strstr(m, "SG_BACKEND_CPU") != NULL);
}

/* x + x on a context of AUTO, against the f64 sum. */
static bool auto_runs(void) {
    sg_ctx *ctx = NULL;
    sg_status s = sg_ctx_create(&(sg_ctx_opts){.backend = SG_BACKEND_AUTO}, &ctx);
    bool ok = TU_EXPECT(s == SG_OK) && TU_EXPECT(ctx != NULL) &&
              TU_EXPECT(sg_ctx_backend(ctx) != SG_BACKEND_HIP);
    if (!ctx) return false;
    int64_t shape[1] = {37};
    double *xv;
    sg_tensor *x = tu_rand(ctx, SG_F32, 1, shape, -1, 1, &xv);
    sg_tensor *y = sg_add(x, x);
    double *got = y ? tu_read(y) : NULL, ref[37];
    for (int i = 0; i < 37; i++) ref[i] = tu_round(SG_F32, xv[i] + xv[i]);
    ok = ok && TU_EXPECT(got != NULL) && tu_close("add", got, ref, 37, 0, 0);
    free(got), free(xv);
    sg_release(x), sg_release(y);
    sg_ctx_destroy(ctx);
    return ok;
}

int main(void) {
    const char *runtime = getenv("SG_HIP_RUNTIME");
    sg_backend_info info[4];
    int n = 0;
    sg_status s = sg_list_backends(info, 4, &n);
    const sg_backend_info *hip = NULL;
    for (int i = 0; s == SG_OK && i < n && i < 4; i++)
        if (info[i].backend == SG_BACKEND_HIP) hip = &info[i];
    if (!hip || !hip->built) {
        printf("SKIP: this stepgraph was built without HIP (%s)\n", hip ? hip->why : "not listed");
        return 77;
    }
    if (hip->available) {
        printf("SKIP: a HIP device is present\n");
        return 77;
    }
    bool ok = TU_EXPECT(strcmp(hip->name, "hip") == 0) &&
              TU_EXPECT(info[1].backend == SG_BACKEND_HIP) && expected(hip->why, runtime);
    tu_case(ok, "sg_list_backends: hip built, unavailable (\"%s\")", hip->why);

    /* Asked for by name, twice (the outcome is remembered, the message the same). */
    tu_alloc a = {0};
    for (int k = 0; k < 2; k++) {
        sg_ctx *ctx = (sg_ctx *)&a; /* must come back NULL */
        s = sg_ctx_create(
            &(sg_ctx_opts){.backend = SG_BACKEND_HIP, .alloc = tu_alloc_hook, .alloc_user = &a},
            &ctx);
        const char *m = sg_last_error(NULL);
        ok = TU_EXPECT(s == SG_ERR_BACKEND_UNAVAILABLE) && TU_EXPECT(ctx == NULL) &&
             TU_EXPECT(strstr(m, "the hip backend is unavailable") != NULL) &&
             TU_EXPECT(strstr(m, hip->why) != NULL) && expected(m, runtime) &&
             TU_EXPECT(a.live == 0) && TU_EXPECT(a.bytes == 0);
        tu_case(ok,
                "sg_ctx_create(backend=hip) #%d -> SG_ERR_BACKEND_UNAVAILABLE, %ld blocks left "
                "(\"%s\")",
                k + 1, a.live, m);
    }

    ok = auto_runs();
    tu_case(ok, "backend=auto after a failed hip context runs x + x");

    if (runtime && runtime[0]) {
        sg_ctx *ctx = tu_ctx((sg_ctx_opts){0});
        void *img = NULL;
        size_t n = 0;
        s = sg__rtc_build(ctx, SG__RTC_HIPRTC, "k", "extern \"C\" __global__ void k() {}\n",
                          "gfx90a", &img, &n);
        const char *m = sg_last_error(ctx);
        ok = TU_EXPECT(s == SG_ERR_BACKEND_UNAVAILABLE) && TU_EXPECT(img == NULL) &&
             TU_EXPECT(sg__rtc_compiles(SG__RTC_HIPRTC) == 0) && expected(m, runtime);
        tu_case(ok, "hiprtc without the runtime -> SG_ERR_BACKEND_UNAVAILABLE (\"%.160s\")", m);
        sg_ctx_destroy(ctx);
    }
    return tu_finish();
}
