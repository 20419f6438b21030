/* SPDX-License-Identifier: MIT */
/*
 * test_codegen_hiprtc.c -- the HIP side of the runtime compile, without an
 * AMD GPU: every kernel unit the library carries (graphs/cuda/k_*.cu)
 * compiles through hiprtc, after the HIP prelude, for gfx90a (wave64) and
 * gfx1030 (wave32) into an AMDGPU code object for that arch (ELF machine
 * and arch flags read here) holding every kernel the host side may ask for
 * on HIP, and none of the tensor-core kernels (PTX only: the host never
 * asks for them there). A second build compiles nothing and returns the
 * same image; each arch is its own entry, beside NVRTC's; the prelude's
 * names (width-32 shuffles, __syncwarp) compile; an arch hiprtc is not
 * asked for is SG_ERR_BACKEND_UNAVAILABLE naming it, with no compile; a
 * kernel with an error is SG_ERR_COMPILE with hiprtc's log. Exits 77
 * without hiprtc.
 */
#define _POSIX_C_SOURCE 200809L
#include "codegen/codegen.h"
#include "graphs/cuda/exec.h"
#include "testutil.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The kernels each family's host side may ask for on HIP (arch 0: no
 * tensor cores, no clusters), then, after NULL, those it never asks for. */
static const char *const unit_kernels[SG__CU_NUM_UNITS][20] = {
    [SG__CU_POINTWISE] = {"sg_pw_vec", "sg_pw_flat", "sg_pw_nd32", "sg_pw_nd64", NULL},
    [SG__CU_DATA] = {"sg_data_gather32", "sg_data_gather64", "sg_data_scatter32",
                     "sg_data_scatter64", "sg_data_index_prep", "sg_data_zero", "sg_data_arange",
                     "sg_data_rand", "sg_data_topk", "sg_data_sample", "sg_data_index_add",
                     "sg_data_index_rank", "sg_data_index_order", "sg_data_index_add_runs", NULL},
    [SG__CU_REDUCE] = {"sg_reduce_fold", "sg_reduce_finish", NULL},
    [SG__CU_ROW] = {"sg_row_softmax", "sg_row_norm", "sg_row_xent", "sg_row_xent_mean", NULL},
    [SG__CU_MATMUL] = {"sg_mm_gemv_f32", "sg_mm_gemv_f16", "sg_mm_gemv_bf16", "sg_mm_copy_f32",
                       "sg_mm_copy_f16", "sg_mm_copy_bf16", "sg_mm_fill_f32", "sg_mm_fill_f16",
                       "sg_mm_fill_bf16", "sg_mm_pitch_f32", "sg_mm_pitch_f16", "sg_mm_pitch_bf16",
                       NULL},
    [SG__CU_ATTN] = {"sg_attn_split", "sg_attn_combine", "sg_attn_decode", "sg_attn_decode_m",
                     NULL, "sg_attn_mma", "sg_attn_decode8", "sg_attn_decode8_m", "sg_attn_flash64", "sg_attn_flash128", "sg_attn_flash64_lse",
                     "sg_attn_flash128_lse", NULL},
    [SG__CU_ATTN_BWD] = {"sg_attn_bwd_rows", "sg_attn_bwd_keys", NULL, "sg_attn_bwd_dq64",
                         "sg_attn_bwd_dq128", "sg_attn_bwd_dkv64", "sg_attn_bwd_dkv128", NULL},
};

/* Whether the image holds the symbol (a kernel's name is in its ELF string table). */
static bool has_name(const void *img, size_t n, const char *name) {
    size_t k = strlen(name);
    for (size_t i = 0; img && i + k <= n; i++)
        if (memcmp((const char *)img + i, name, k) == 0 &&
            (i + k == n || ((const char *)img)[i + k] == '\0'))
            return true;
    return false;
}

/* An AMDGPU code object for arch: a 64-bit little-endian ELF, e_machine
 * EM_AMDGPU (224), and e_flags' EF_AMDGPU_MACH (low byte) the arch's number
 * in the ELF spec (gfx90a 0x3f, gfx1030 0x36). */
static bool amdgpu_elf(const unsigned char *img, size_t n, const char *arch) {
    if (!img || n < 64 || memcmp(img, "\177ELF", 4) != 0 || img[4] != 2 || img[5] != 1)
        return false;
    unsigned machine = img[18] | (unsigned)img[19] << 8;
    uint32_t flags =
        img[48] | (uint32_t)img[49] << 8 | (uint32_t)img[50] << 16 | (uint32_t)img[51] << 24;
    unsigned want = strcmp(arch, "gfx90a") == 0 ? 0x3f : strcmp(arch, "gfx1030") == 0 ? 0x36 : 0;
    return machine == 224 && (flags & 0xff) == want;
}

/* Every unit for one arch, with the kernels the host asks for and not the others. */
static void units(sg_ctx *ctx, const char *arch) {
    for (int u = 0; u < SG__CU_NUM_UNITS; u++) {
        void *b = NULL;
        size_t nb = 0;
        sg_status s =
            sg__rtc_build(ctx, SG__RTC_HIPRTC, sg__cu_names[u], sg__cu_sources[u], arch, &b, &nb);
        bool ok = TU_EXPECT(sg__cu_sources[u] != NULL) && TU_EXPECT(s == SG_OK) &&
                  TU_EXPECT(amdgpu_elf(b, nb, arch));
        if (s != SG_OK) fprintf(stderr, "  %.1500s\n", sg_last_error(ctx));
        const char *const *k = unit_kernels[u];
        int nk = 0, nabsent = 0;
        for (; ok && *k; k++, nk++)
            if (!has_name(b, nb, *k)) {
                fprintf(stderr, "  kernel %s is missing from the code object\n", *k);
                ok = false;
            }
        for (k++; ok && k < unit_kernels[u] + 20 && *k; k++, nabsent++)
            if (has_name(b, nb, *k)) {
                fprintf(stderr, "  tensor-core kernel %s was built for HIP\n", *k);
                ok = false;
            }
        tu_case(ok, "hiprtc %s %s: %d kernels, %d PTX-only absent (%zu-byte code object)",
                sg__cu_names[u], arch, nk, nabsent, nb);
        sg__free(ctx, b, nb);
        sg_clear_error(ctx);
    }
}

int main(void) {
    char why[512];
    if (!sg__rtc_available(SG__RTC_HIPRTC, why, sizeof why)) {
        printf("SKIP: %s\n", why);
        return 77;
    }
    sg_ctx *ctx = tu_ctx((sg_ctx_opts){0});
    /* The units through the tests' shared cache (a second run compiles
     * nothing); the cache checks below in a cache of their own. */
    units(ctx, "gfx90a");
    units(ctx, "gfx1030");
    char dir[256];
    snprintf(dir, sizeof dir, "/tmp/sg-hiprtc-test-%d", (int)getpid());
    setenv("SG_CACHE_DIR", dir, 1);

    /* The prelude's names, a cache hit, and one entry per arch and driver. */
    static const char *shfl =
        "extern \"C\" __global__ void warp_sum(float *y, const float *x) {\n"
        "    float v = x[threadIdx.x];\n"
        "    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);\n"
        "    __syncwarp();\n"
        "    if ((threadIdx.x & 31) == 0) y[threadIdx.x >> 5] = v;\n"
        "}\n";
    void *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    uint64_t c0 = sg__rtc_compiles(SG__RTC_HIPRTC);
    sg_status s = sg__rtc_build(ctx, SG__RTC_HIPRTC, "warp_sum", shfl, "gfx90a", &a, &na);
    bool ok = TU_EXPECT(s == SG_OK) && TU_EXPECT(amdgpu_elf(a, na, "gfx90a")) &&
              TU_EXPECT(has_name(a, na, "warp_sum")) &&
              TU_EXPECT(sg__rtc_compiles(SG__RTC_HIPRTC) == c0 + 1);
    tu_case(ok, "__shfl_xor_sync and __syncwarp compile for gfx90a through the prelude");
    s = sg__rtc_build(ctx, SG__RTC_HIPRTC, "warp_sum", shfl, "gfx90a", &b, &nb);
    ok = TU_EXPECT(s == SG_OK) && TU_EXPECT(nb == na) && TU_EXPECT(b && memcmp(a, b, na) == 0) &&
         TU_EXPECT(sg__rtc_compiles(SG__RTC_HIPRTC) == c0 + 1);
    tu_case(ok, "the second build is a cache hit with the same image");
    sg__free(ctx, b, nb), b = NULL;
    s = sg__rtc_build(ctx, SG__RTC_HIPRTC, "warp_sum", shfl, "gfx1030", &b, &nb);
    ok = TU_EXPECT(s == SG_OK) && TU_EXPECT(amdgpu_elf(b, nb, "gfx1030")) &&
         TU_EXPECT(sg__rtc_compiles(SG__RTC_HIPRTC) == c0 + 2);
    tu_case(ok, "another arch is another entry (compiled)");
    sg__free(ctx, b, nb), b = NULL;
    if (sg__rtc_available(SG__RTC_NVRTC, NULL, 0)) {
        uint64_t n0 = sg__rtc_compiles(SG__RTC_NVRTC);
        s = sg__rtc_build(ctx, SG__RTC_NVRTC, "warp_sum", shfl, "sm_90", &b, &nb);
        ok = TU_EXPECT(s == SG_OK) && TU_EXPECT(!amdgpu_elf(b, nb, "gfx90a")) &&
             TU_EXPECT(sg__rtc_compiles(SG__RTC_NVRTC) == n0 + 1) &&
             TU_EXPECT(sg__rtc_compiles(SG__RTC_HIPRTC) == c0 + 2);
        tu_case(ok, "NVRTC's build of the same source is its own entry (a cubin)");
        sg__free(ctx, b, nb), b = NULL;
    }

    /* An arch hiprtc is not asked for: refused by name, nothing compiled. */
    const char *bad[] = {"gfx942", "gfx1100", "sm_90", ""};
    for (int i = 0; i < 4; i++) {
        s = sg__rtc_build(ctx, SG__RTC_HIPRTC, "warp_sum", shfl, bad[i], &b, &nb);
        const char *m = sg_last_error(ctx);
        ok = TU_EXPECT(s == SG_ERR_BACKEND_UNAVAILABLE) && TU_EXPECT(b == NULL) &&
             TU_EXPECT(strstr(m, bad[i]) != NULL) && TU_EXPECT(strstr(m, "gfx90a") != NULL) &&
             TU_EXPECT(sg__rtc_compiles(SG__RTC_HIPRTC) == c0 + 2);
        tu_case(ok, "arch '%s' -> SG_ERR_BACKEND_UNAVAILABLE, no compile (\"%.120s\")", bad[i], m);
        sg_clear_error(ctx);
    }

    /* A kernel with an error: hiprtc's log in the message. */
    s = sg__rtc_build(ctx, SG__RTC_HIPRTC, "broken_test",
                      "extern \"C\" __global__ void k(float *y) { y[0] = undeclared_x; }\n",
                      "gfx90a", &b, &nb);
    const char *m = sg_last_error(ctx);
    ok = TU_EXPECT(s == SG_ERR_COMPILE) && TU_EXPECT(b == NULL) &&
         TU_EXPECT(strstr(m, "hiprtc") != NULL) && TU_EXPECT(strstr(m, "broken_test") != NULL) &&
         TU_EXPECT(strstr(m, "undeclared_x") != NULL);
    tu_case(ok, "a kernel with an error: SG_ERR_COMPILE with the log (\"%.160s\")", m);
    sg_clear_error(ctx);

    sg__free(ctx, a, na);
    sg_ctx_destroy(ctx);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return tu_finish();
}
