/* SPDX-License-Identifier: MIT */
/*
 * test_codegen_nvrtc.c -- CUDA C through NVRTC and the disk cache, without
 * a GPU: a kernel compiles to an sm_90 cubin, a second build compiles
 * nothing and returns the same image, a damaged entry is detected and
 * rebuilt, a kernel with an error is SG_ERR_COMPILE with NVRTC's log in the
 * message, SG_DUMP_DIR / SG_OVERRIDE_DIR work with <name>.cu, an unusable
 * cache compiles uncached and a world-writable one is refused; several
 * programs compile on threads to the images of single compiles, each
 * cached, and a failing one fails the call by its name; a unit cut into
 * parts (sg__unit_split) puts each kernel in exactly one part, and every
 * host allocation of the cut and its build, its cache reads among them,
 * can fail: SG_ERR_OOM, nothing kept.
 */
#define _POSIX_C_SOURCE 200809L
#include "codegen/codegen.h"
#include "graphs/cuda/exec.h"
#include "testutil.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *good =
    "extern \"C\" __global__ void axpy(float *y, const float *x, float a, int n) {\n"
    "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i < n) y[i] += a * x[i];\n"
    "}\n";

static char dir[256];

/* The kernels each family's host side looks up by name (cuda_<family>.c). */
static const char *const unit_kernels[SG__CU_NUM_UNITS][24] = {
    [SG__CU_POINTWISE] = {"sg_pw_vec", "sg_pw_flat", "sg_pw_nd32", "sg_pw_nd64", NULL},
    [SG__CU_DATA] = {"sg_data_gather32", "sg_data_gather64", "sg_data_scatter32",
                     "sg_data_scatter64", "sg_data_index_prep", "sg_data_zero", "sg_data_arange",
                     "sg_data_rand", "sg_data_topk", "sg_data_topk_blk", "sg_data_sample",
                     "sg_data_index_add", "sg_data_index_rank", "sg_data_index_order",
                     "sg_data_index_add_runs", "sg_data_radix_count", "sg_data_radix_scan",
                     "sg_data_radix_place", NULL},
    [SG__CU_REDUCE] = {"sg_reduce_fold", "sg_reduce_finish", NULL},
    [SG__CU_ROW] = {"sg_row_softmax", "sg_row_norm", "sg_row_xent", "sg_row_xent_mean",
                    "sg_row_xent_bwd", "sg_row_xent_bwd_warp", "sg_row_norm_bwd",
                    "sg_row_norm_bwd_cols", "sg_row_norm_bwd_vec", "sg_row_norm_bwd_reg",
                    "sg_row_norm_bwd_fin", NULL},
    [SG__CU_MATMUL] = {"sg_mm_gemv_f32", "sg_mm_gemv_f16", "sg_mm_gemv_bf16", "sg_mm_copy_f32",
                       "sg_mm_copy_f16", "sg_mm_copy_bf16", "sg_mm_fill_f32", "sg_mm_fill_f16",
                       "sg_mm_fill_bf16", "sg_mm_pitch_f32", "sg_mm_pitch_f16", "sg_mm_pitch_bf16",
                       NULL},
    [SG__CU_ATTN] = {"sg_attn_split", "sg_attn_combine", "sg_attn_mma", "sg_attn_decode",
                     "sg_attn_decode8", "sg_attn_decode_m", "sg_attn_decode8_m", "sg_attn_flash64",
                     "sg_attn_flash128", "sg_attn_flash64_lse", "sg_attn_flash128_lse", NULL},
    [SG__CU_ATTN_BWD] = {"sg_attn_bwd_rows", "sg_attn_bwd_keys", "sg_attn_bwd_dq64_bf16",
                         "sg_attn_bwd_dq64_f16", "sg_attn_bwd_dq128_bf16", "sg_attn_bwd_dq128_f16",
                         "sg_attn_bwd_dkv64_bf16", "sg_attn_bwd_dkv64_f16",
                         "sg_attn_bwd_dkv128_bf16", "sg_attn_bwd_dkv128_f16", NULL},
};

/* Whether the image holds the symbol (a kernel's name is in its ELF string table). */
static bool has_name(const void *img, size_t n, const char *name) {
    size_t k = strlen(name);
    for (size_t i = 0; img && i + k <= n; i++)
        if (memcmp((const char *)img + i, name, k) == 0) return true;
    return false;
}

/* The one cu-*.cubin in the cache dir, into path. */
static bool entry_path(char *path, size_t size) {
    DIR *d = opendir(dir);
    if (!d) return false;
    struct dirent *e;
    bool found = false;
    while ((e = readdir(d)) != NULL)
        if (strncmp(e->d_name, "cu-", 3) == 0 && strstr(e->d_name, ".cubin")) {
            snprintf(path, size, "%s/%s", dir, e->d_name);
            found = true;
        }
    closedir(d);
    return found;
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/sg-nvrtc-test-%d", (int)getpid());
    setenv("SG_CACHE_DIR", dir, 1);
    sg_ctx *ctx = tu_ctx((sg_ctx_opts){0});
    void *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    uint64_t c0 = sg__nvrtc_compiles();
    sg_status s = sg__nvrtc_build(ctx, "axpy_test", good, 90, &a, &na);
    if (s == SG_ERR_BACKEND_UNAVAILABLE) {
        printf("skipped: %s\n", sg_last_error(ctx));
        sg_ctx_destroy(ctx);
        return 77;
    }
    bool ok = TU_EXPECT(s == SG_OK) && TU_EXPECT(a && na > 64) &&
              TU_EXPECT(memcmp(a,
                               "\x7f"
                               "ELF",
                               4) == 0) &&
              TU_EXPECT(sg__nvrtc_compiles() == c0 + 1);
    tu_case(ok, "compile a kernel for sm_90 (%zu-byte ELF cubin): %s", na,
            s == SG_OK ? "ok" : sg_last_error(ctx));

    s = sg__nvrtc_build(ctx, "axpy_test", good, 90, &b, &nb);
    ok = TU_EXPECT(s == SG_OK) && TU_EXPECT(nb == na) && TU_EXPECT(b && memcmp(a, b, na) == 0) &&
         TU_EXPECT(sg__nvrtc_compiles() == c0 + 1);
    tu_case(ok, "a second build is a cache hit: no compile, the same image");
    sg__free(ctx, b, nb), b = NULL;

    /* Damage the entry: flip a byte of the image. */
    char path[512];
    ok = TU_EXPECT(entry_path(path, sizeof path));
    FILE *f = ok ? fopen(path, "r+b") : NULL;
    if (f) {
        fseek(f, 100, SEEK_SET);
        int ch = fgetc(f);
        fseek(f, 100, SEEK_SET);
        fputc(ch ^ 0x5a, f);
        fclose(f);
    }
    s = sg__nvrtc_build(ctx, "axpy_test", good, 90, &b, &nb);
    ok = ok && TU_EXPECT(f != NULL) && TU_EXPECT(s == SG_OK) && TU_EXPECT(nb == na) &&
         TU_EXPECT(b && memcmp(a, b, na) == 0) && TU_EXPECT(sg__nvrtc_compiles() == c0 + 2);
    tu_case(ok, "a damaged entry is detected and rebuilt");
    sg__free(ctx, b, nb), b = NULL;

    /* Another arch is another key. */
    s = sg__nvrtc_build(ctx, "axpy_test", good, 80, &b, &nb);
    ok = TU_EXPECT(s == SG_OK) && TU_EXPECT(sg__nvrtc_compiles() == c0 + 3);
    tu_case(ok, "sm_80 is a separate entry");
    sg__free(ctx, b, nb), b = NULL;

    s = sg__nvrtc_build(ctx, "broken_test",
                        "extern \"C\" __global__ void k() { undeclared_x = 1; }", 90, &b, &nb);
    const char *m = sg_last_error(ctx);
    ok = TU_EXPECT(s == SG_ERR_COMPILE) && TU_EXPECT(b == NULL) &&
         TU_EXPECT(strstr(m, "broken_test") != NULL) &&
         TU_EXPECT(strstr(m, "undeclared_x") != NULL);
    tu_case(ok, "a kernel with an error: SG_ERR_COMPILE with the log (\"%.160s\")", m);
    sg_clear_error(ctx);

    /* The kernel families the library carries, as the CUDA backend builds
     * them, each with every kernel its host side asks for. */
    for (int u = 0; u < SG__CU_NUM_UNITS; u++) {
        s = sg__nvrtc_build(ctx, sg__cu_names[u], sg__cu_sources[u], 90, &b, &nb);
        ok = TU_EXPECT(sg__cu_sources[u] != NULL) && TU_EXPECT(s == SG_OK);
        if (!ok) fprintf(stderr, "  %s\n", sg_last_error(ctx));
        for (const char *const *k = unit_kernels[u]; ok && *k; k++)
            if (!has_name(b, nb, *k)) {
                fprintf(stderr, "  kernel %s is missing from the cubin\n", *k);
                ok = false;
            }
        tu_case(ok, "the %s unit compiles for sm_90 with its kernels (%zu-byte cubin)",
                sg__cu_names[u], nb);
        sg__free(ctx, b, nb), b = NULL;
        sg_clear_error(ctx);
    }

    /* Bad input: each a status and a message naming the problem. */
    s = sg__nvrtc_build(ctx, "../evil", good, 90, &b, &nb);
    m = sg_last_error(ctx);
    ok = TU_EXPECT(s == SG_ERR_INVALID_ARG) && TU_EXPECT(b == NULL) &&
         TU_EXPECT(strstr(m, "../evil") != NULL) && TU_EXPECT(strstr(m, "[A-Za-z0-9_.-]") != NULL);
    tu_case(ok, "a kernel name with '/' -> SG_ERR_INVALID_ARG (\"%s\")", m);
    sg_clear_error(ctx);
    s = sg__nvrtc_build(ctx, "nosource_test", NULL, 90, &b, &nb);
    m = sg_last_error(ctx);
    ok = TU_EXPECT(s == SG_ERR_INVALID_ARG) && TU_EXPECT(b == NULL) &&
         TU_EXPECT(strstr(m, "nosource_test") != NULL) && TU_EXPECT(strstr(m, "no source") != NULL);
    tu_case(ok, "a NULL source -> SG_ERR_INVALID_ARG (\"%s\")", m);
    sg_clear_error(ctx);
    /* A cache that cannot be used compiles without it; one that others may
     * write to is refused. */
    setenv("SG_CACHE_DIR", "/dev/null/cache", 1);
    uint64_t cu = sg__nvrtc_compiles();
    s = sg__nvrtc_build(ctx, "axpy_test", good, 90, &b, &nb);
    ok = TU_EXPECT(s == SG_OK) && TU_EXPECT(b != NULL) && TU_EXPECT(nb == na) &&
         TU_EXPECT(sg__nvrtc_compiles() == cu + 1);
    tu_case(ok, "an unusable SG_CACHE_DIR -> compiled, not cached");
    sg__free(ctx, b, nb), b = NULL;
    sg_clear_error(ctx);
    char open_dir[300];
    snprintf(open_dir, sizeof open_dir, "%s/open", dir);
    mkdir(open_dir, 0755);
    chmod(open_dir, 0777);
    setenv("SG_CACHE_DIR", open_dir, 1);
    s = sg__nvrtc_build(ctx, "axpy_test", good, 90, &b, &nb);
    m = sg_last_error(ctx);
    ok = TU_EXPECT(s == SG_ERR_COMPILE) && TU_EXPECT(b == NULL) &&
         TU_EXPECT(strstr(m, open_dir) != NULL) && TU_EXPECT(strstr(m, "chmod 700") != NULL) &&
         TU_EXPECT(strstr(m, "SG_CACHE_DIR") != NULL);
    tu_case(ok, "a world-writable SG_CACHE_DIR (0777) -> SG_ERR_COMPILE (\"%s\")", m);
    sg_clear_error(ctx);
    setenv("SG_CACHE_DIR", dir, 1);

    /* Dump and override. */
    char dump[300], over[300], file[400];
    snprintf(dump, sizeof dump, "%s/dump/deeper", dir);
    snprintf(over, sizeof over, "%s/over", dir);
    setenv("SG_DUMP_DIR", dump, 1);
    s = sg__nvrtc_build(ctx, "axpy_test", good, 90, &b, &nb);
    snprintf(file, sizeof file, "%s/axpy_test.cu", dump);
    ok = TU_EXPECT(s == SG_OK) && TU_EXPECT(access(file, R_OK) == 0);
    tu_case(ok, "SG_DUMP_DIR (made if missing, nested) gets <name>.cu");
    sg__free(ctx, b, nb), b = NULL;
    unsetenv("SG_DUMP_DIR");
    mkdir(over, 0755);
    snprintf(file, sizeof file, "%s/axpy_test.cu", over);
    f = fopen(file, "w");
    if (f) {
        fputs("extern \"C\" __global__ void axpy(float *y) { y[0] = 2.0f; }\n", f);
        fclose(f);
    }
    setenv("SG_OVERRIDE_DIR", over, 1);
    uint64_t c1 = sg__nvrtc_compiles();
    s = sg__nvrtc_build(ctx, "axpy_test", good, 90, &b, &nb);
    ok = TU_EXPECT(s == SG_OK) && TU_EXPECT(sg__nvrtc_compiles() == c1 + 1) &&
         TU_EXPECT(nb != na || memcmp(a, b, na) != 0);
    tu_case(ok, "SG_OVERRIDE_DIR/<name>.cu is compiled instead");
    sg__free(ctx, b, nb), b = NULL;
    snprintf(file, sizeof file, "%s/dir_test.cu", over);
    mkdir(file, 0755); /* an override that is no file */
    s = sg__nvrtc_build(ctx, "dir_test", good, 90, &b, &nb);
    m = sg_last_error(ctx);
    ok = TU_EXPECT(s == SG_ERR_COMPILE) && TU_EXPECT(b == NULL) &&
         TU_EXPECT(strstr(m, "SG_OVERRIDE_DIR") != NULL) &&
         TU_EXPECT(strstr(m, "dir_test.cu") != NULL);
    tu_case(ok, "an unreadable override -> SG_ERR_COMPILE (\"%s\")", m);
    sg_clear_error(ctx);
    snprintf(file, sizeof file, "%s/fifo_test.cu", over);
    alarm(60); /* opening a FIFO would block forever */
    ok = TU_EXPECT(mkfifo(file, 0600) == 0);
    s = sg__nvrtc_build(ctx, "fifo_test", good, 90, &b, &nb);
    alarm(0);
    m = sg_last_error(ctx);
    ok = ok && TU_EXPECT(s == SG_ERR_COMPILE) && TU_EXPECT(b == NULL) &&
         TU_EXPECT(strstr(m, "fifo_test.cu") != NULL) &&
         TU_EXPECT(strstr(m, "not a regular file") != NULL);
    tu_case(ok, "a FIFO as override -> SG_ERR_COMPILE, no hang (\"%s\")", m);
    sg_clear_error(ctx);
    unsetenv("SG_OVERRIDE_DIR");

    /* Several programs at once, on threads: the images one by one gives,
     * each cached under its own name (a second call compiles nothing); a
     * program that fails makes the call fail with its name, no image out. */
    {
        static char src[3][400];
        const char *names[3] = {"many_a", "many_b", "many_c"}, *srcs[3];
        for (int i = 0; i < 3; i++) {
            snprintf(src[i], sizeof src[i],
                     "extern \"C\" __global__ void k%d(float *y, int n) {\n"
                     "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
                     "    if (i < n) y[i] = y[i] * %d.5f + 1.0f;\n}\n",
                     i, i + 2);
            srcs[i] = src[i];
        }
        void *one[3] = {NULL}, *many[3] = {NULL};
        size_t none[3] = {0}, nmany[3] = {0};
        ok = true;
        setenv("SG_CACHE_DIR", "/dev/null/cache", 1); /* compiled every time */
        for (int i = 0; i < 3; i++)
            ok = ok &&
                 TU_EXPECT(sg__nvrtc_build(ctx, names[i], srcs[i], 90, &one[i], &none[i]) == SG_OK);
        uint64_t c0 = sg__nvrtc_compiles();
        ok = ok &&
             TU_EXPECT(sg__rtc_build_many(ctx, SG__RTC_NVRTC, 3, names, srcs, "sm_90", 3, many,
                                          nmany) == SG_OK) &&
             TU_EXPECT(sg__nvrtc_compiles() == c0 + 3);
        for (int i = 0; i < 3; i++)
            ok = ok && TU_EXPECT(nmany[i] == none[i] && memcmp(one[i], many[i], none[i]) == 0) &&
                 TU_EXPECT(has_name(many[i], nmany[i],
                                    i == 0   ? "k0"
                                    : i == 1 ? "k1"
                                             : "k2"));
        for (int i = 0; i < 3; i++) {
            sg__free(ctx, one[i], none[i]), sg__free(ctx, many[i], nmany[i]);
            many[i] = NULL;
        }
        setenv("SG_CACHE_DIR", dir, 1);
        ok = ok && TU_EXPECT(sg__rtc_build_many(ctx, SG__RTC_NVRTC, 3, names, srcs, "sm_90", 3,
                                                many, nmany) == SG_OK);
        c0 = sg__nvrtc_compiles();
        for (int i = 0; i < 3; i++) sg__free(ctx, many[i], nmany[i]), many[i] = NULL;
        ok = ok &&
             TU_EXPECT(sg__rtc_build_many(ctx, SG__RTC_NVRTC, 3, names, srcs, "sm_90", 3, many,
                                          nmany) == SG_OK) &&
             TU_EXPECT(sg__nvrtc_compiles() == c0);
        for (int i = 0; i < 3; i++) sg__free(ctx, many[i], nmany[i]), many[i] = NULL;
        tu_case(ok, "3 programs on 3 threads -> the images of 3 single compiles, each cached");
        const char *bad[3] = {srcs[0], "extern \"C\" __global__ void kb() { undefined_x(); }\n",
                              srcs[2]};
        const char *bnames[3] = {"many_a", "many_broken", "many_c"};
        s = sg__rtc_build_many(ctx, SG__RTC_NVRTC, 3, bnames, bad, "sm_90", 3, many, nmany);
        m = sg_last_error(ctx);
        ok = TU_EXPECT(s == SG_ERR_COMPILE) && TU_EXPECT(strstr(m, "many_broken") != NULL) &&
             TU_EXPECT(strstr(m, "undefined_x") != NULL) &&
             TU_EXPECT(!many[0] && !many[1] && !many[2]);
        tu_case(ok, "one of 3 programs fails -> SG_ERR_COMPILE naming it, no image (\"%.120s\")",
                m);
        sg_clear_error(ctx);
    }
    /* A unit in parts (sg__unit_split): five kernels of 20-40 KB of text
     * (a padding comment each) and a group running the second's kernel
     * again, cut into at most 3 parts, each the prelude and its kernels;
     * every kernel in exactly one part's image, the repeat in its kernel's
     * part; with SG_DUMP_DIR set, one part, the unit itself. */
    {
        enum { NK = 6 };
        static const int pad_kb[NK] = {20, 40, 30, 0, 25, 35};
        sg__cuda_kinfo ki[NK];
        memset(ki, 0, sizeof ki);
        size_t cap = (size_t)200 << 10, len = 0;
        char *unit = malloc(cap);
        ok = TU_EXPECT(unit != NULL);
        if (unit)
            len = (size_t)snprintf(unit, cap, "typedef float sg_f32;\n#define SG_ONE 1.0f\n\n");
        for (int k = 0; ok && k < NK; k++) {
            snprintf(ki[k].name, sizeof ki[k].name, "split_k%d", k == 3 ? 1 : k);
            ki[k].emitted = k != 3;
            if (!ki[k].emitted) continue;
            ki[k].text_at = len;
            len += (size_t)snprintf(unit + len, cap - len, "/* kernel %d: ", k);
            for (int i = 0; i < pad_kb[k] * 1024; i++) unit[len++] = 'x';
            len += (size_t)snprintf(unit + len, cap - len,
                                    " */\nextern \"C\" __global__ void split_k%d(sg_f32 *y) "
                                    "{ y[threadIdx.x] += SG_ONE * %d; }\n\n",
                                    k, k);
            ki[k].text_len = len - ki[k].text_at;
        }
        sg__unit_parts u = {0};
        ok = ok && TU_EXPECT(sg__unit_split(ctx, unit, ki, NK, 3, &u) == SG_OK) &&
             TU_EXPECT(u.n == 3) && TU_EXPECT(u.kernels == 5) && TU_EXPECT(u.part[3] == u.part[1]);
        void *img[3] = {NULL};
        size_t nimg[3] = {0};
        const char *nm[3] = {"split_p0", "split_p1", "split_p2"}, *sc[3];
        for (int p = 0; ok && p < 3; p++) {
            sc[p] = u.src[p];
            ok = TU_EXPECT(strncmp(u.src[p], unit, ki[0].text_at) == 0);
        }
        ok = ok && TU_EXPECT(sg__rtc_build_many(ctx, SG__RTC_NVRTC, 3, nm, sc, "sm_90", 3, img,
                                                nimg) == SG_OK);
        for (int k = 0; ok && k < NK; k++)
            for (int p = 0; p < 3; p++)
                ok = ok && TU_EXPECT(has_name(img[p], nimg[p], ki[k].name) == (u.part[k] == p));
        for (int p = 0; p < 3; p++) sg__free(ctx, img[p], nimg[p]);
        sg__unit_parts_free(ctx, &u);
        tu_case(ok, "a unit of 5 kernels (150 KB) in 3 parts -> each kernel in one part's image");
        setenv("SG_DUMP_DIR", dir, 1);
        ok = ok && TU_EXPECT(sg__unit_split(ctx, unit, ki, NK, 3, &u) == SG_OK) &&
             TU_EXPECT(u.n == 1) && TU_EXPECT(u.src[0] == unit);
        sg__unit_parts_free(ctx, &u);
        unsetenv("SG_DUMP_DIR");
        tu_case(ok, "the same unit with SG_DUMP_DIR set -> one part, the unit itself");
        /* Every host allocation of the cut and of its build (from the
         * cache the build above filled, and compiled anew) can fail: the
         * call says SG_ERR_OOM and speaks of memory and gives back what it
         * took, or it recovers (a cache entry it cannot read is compiled)
         * with every kernel in its part's image. */
        for (int fresh = 0; fresh < 2; fresh++) {
            tu_alloc h = {0};
            sg_ctx *c2 = NULL;
            sg_ctx_opts o = {.backend = SG_BACKEND_CPU, .alloc = tu_alloc_hook, .alloc_user = &h};
            if (fresh) setenv("SG_CACHE_DIR", "/dev/null/cache", 1); /* compiled every time */
            ok = TU_EXPECT(sg_ctx_create(&o, &c2) == SG_OK);
            long n = 0, failed = 0, bad = 0;
            for (long k = 0; ok && (k == 0 || k <= n); k++) {
                long live = h.live, start = h.count;
                h.fail_at = k ? start + k : 0;
                void *im[3] = {NULL};
                size_t ni[3] = {0};
                sg_status st = sg__unit_split(c2, unit, ki, NK, 3, &u);
                bool right = true; /* a success's images hold their parts' kernels */
                if (st == SG_OK) {
                    for (int p = 0; p < u.n; p++) sc[p] = u.src[p];
                    st = sg__rtc_build_many(c2, SG__RTC_NVRTC, u.n, nm, sc, "sm_90", u.n, im, ni);
                    for (int q = 0; st == SG_OK && q < NK; q++)
                        right = right && has_name(im[u.part[q]], ni[u.part[q]], ki[q].name);
                    for (int p = 0; p < u.n; p++)
                        if (im[p]) sg__free(c2, im[p], ni[p]);
                    sg__unit_parts_free(c2, &u);
                }
                if (k == 0) {
                    n = h.count - start;
                    ok = TU_EXPECT(st == SG_OK) && TU_EXPECT(n > 3);
                } else if (st != SG_OK) {
                    failed++;
                    const char *m = sg_last_error(c2);
                    bad += !(st == SG_ERR_OOM && strstr(m, "memory") && h.live == live);
                    if (st != SG_ERR_OOM || !strstr(m, "memory") || h.live != live)
                        fprintf(stderr, "  fail_at +%ld: status %d, %ld blocks kept: %s\n", k,
                                (int)st, h.live - live, m);
                    sg_clear_error(c2);
                } else { /* went on without the allocation: never, since none is optional */
                    bad += h.live != live || !right;
                }
            }
            h.fail_at = 0;
            /* A cache entry that cannot be read for want of memory is an
             * error, not a miss compiled again without a word. */
            ok = ok && TU_EXPECT(failed > 0) && TU_EXPECT(bad == 0) && TU_EXPECT(failed == n);
            if (c2) sg_ctx_destroy(c2);
            ok = ok && TU_EXPECT(h.live == 0);
            setenv("SG_CACHE_DIR", dir, 1);
            tu_case(ok,
                    "the cut and build of that unit (%s) with each of its %ld host allocations "
                    "failing -> SG_ERR_OOM (%ld) or recovered (%ld), nothing kept",
                    fresh ? "compiled" : "cached", n, failed, n - failed);
        }
        free(unit);
    }
    sg__free(ctx, a, na);
    sg_ctx_destroy(ctx);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return tu_finish();
}
