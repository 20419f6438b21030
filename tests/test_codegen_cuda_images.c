/* SPDX-License-Identifier: MIT */
/*
 * test_codegen_cuda_images.c -- the CUDA kernel families the build compiled
 * (tools/sg_cubins.c, graphs/cuda/exec.h sg__cu_images): every family has
 * an image for every architecture the build named, no image is listed twice,
 * and the image of k_reduce.cu (the quickest family to compile) is byte for
 * byte what the run time's NVRTC compile of the embedded source gives, so a
 * context that loads an image runs the kernels it would have compiled. A
 * build without images (no NVRTC library, STEPGRAPH_CUBIN_ARCHS empty) has
 * an empty table; skipped when NVRTC cannot be loaded here.
 */
#define _POSIX_C_SOURCE 200809L
#include "codegen/codegen.h"
#include "graphs/cuda/exec.h"
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

int main(void) {
    sg_ctx *ctx = tu_ctx((sg_ctx_opts){0});
    int archs[8], na = 0;
    bool ok = TU_EXPECT(sg__cu_nimages >= 0);
    for (int i = 0; ok && i < sg__cu_nimages; i++) {
        const sg__cu_image *im = &sg__cu_images[i];
        ok = TU_EXPECT(im->unit >= 0 && im->unit < SG__CU_NUM_UNITS) && TU_EXPECT(im->data) &&
             TU_EXPECT(im->size > 64) && TU_EXPECT(memcmp(im->data, "\177ELF", 4) == 0);
        bool seen = false;
        for (int a = 0; a < na; a++) seen = seen || archs[a] == im->arch;
        if (!seen && na < 8) archs[na++] = im->arch;
        for (int j = 0; ok && j < i; j++)
            ok = TU_EXPECT(sg__cu_images[j].unit != im->unit || sg__cu_images[j].arch != im->arch);
    }
    for (int a = 0; ok && a < na; a++)
        for (int u = 0; ok && u < SG__CU_NUM_UNITS; u++) {
            bool has = false;
            for (int i = 0; i < sg__cu_nimages; i++)
                has = has || (sg__cu_images[i].unit == (sg__cu_unit)u && sg__cu_images[i].arch == archs[a]);
            ok = TU_EXPECT(has);
            if (!has) fprintf(stderr, "  %s has no image for sm_%d\n", sg__cu_names[u], archs[a]);
        }
    tu_case(ok, "CU_IMAGES(%d images, %d architectures, every family for each)", sg__cu_nimages, na);
    char why[256];
    for (int i = 0; i < sg__cu_nimages; i++) {
        const sg__cu_image *im = &sg__cu_images[i];
        if (im->unit != SG__CU_REDUCE) continue;
        if (!sg__rtc_available(SG__RTC_NVRTC, why, sizeof why)) {
            printf("NVRTC unavailable (%s): the image is not compared\n", why);
            break;
        }
        setenv("SG_ALWAYS_COMPILE", "1", 1);
        void *cubin = NULL;
        size_t size = 0;
        ok = TU_EXPECT(sg__nvrtc_build(ctx, sg__cu_names[im->unit], sg__cu_sources[im->unit],
                                       im->arch, &cubin, &size) == SG_OK) &&
             TU_EXPECT(size == im->size) && TU_EXPECT(memcmp(cubin, im->data, size) == 0);
        unsetenv("SG_ALWAYS_COMPILE");
        sg__free(ctx, cubin, size);
        tu_case(ok, "CU_IMAGE_SAME(%s for sm_%d: %zu bytes, as NVRTC compiles it at run time)",
                sg__cu_names[im->unit], im->arch, im->size);
    }
    sg_ctx_destroy(ctx);
    return tu_finish();
}
