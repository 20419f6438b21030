/* SPDX-License-Identifier: MIT */
/*
 * test_codegen_ocloc.c -- OpenCL C to SPIR-V through libocloc and the disk
 * cache, without an Intel GPU: a kernel compiles to a module that names
 * it, a second build compiles nothing and returns the same module, a
 * damaged entry is rebuilt, a kernel with an error is SG_ERR_COMPILE with
 * ocloc's log, a module cut short is refused (by its length, and by
 * spirv-val when cut at a word), spirv-val missing from PATH is said once
 * under "fallbacks" and the shape check still stands; in a child process,
 * no libocloc is SG_ERR_BACKEND_UNAVAILABLE naming the package. Sanitizer
 * builds never open libocloc (SG__SANITIZED): there the cases that need it
 * skip.
 */
#define _GNU_SOURCE /* setenv, mkdtemp */
#include "codegen/codegen.h"
#include "testutil.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *good = "__kernel void sg_axpy(__global float *y, __global const float *x,\n"
                          "                      float a, int n) {\n"
                          "    int i = get_global_id(0);\n"
                          "    if (i < n) y[i] += a * x[i];\n"
                          "}\n";

static char dir[256];
static int fallback_lines;

static void on_log(void *user, const char *topic, const char *line) {
    (void)user;
    if (strcmp(topic, "fallbacks") == 0 && strstr(line, "spirv-val")) fallback_lines++;
}

static bool has_name(const void *img, size_t n, const char *name) {
    size_t k = strlen(name);
    for (size_t i = 0; img && i + k <= n; i++)
        if (memcmp((const char *)img + i, name, k) == 0) return true;
    return false;
}

/* The one spv-*.spv in the cache dir, into path. */
static bool entry_path(char *path, size_t size) {
    DIR *d = opendir(dir);
    if (!d) return false;
    bool found = false;
    for (struct dirent *e; (e = readdir(d));)
        if (strncmp(e->d_name, "spv-", 4) == 0) {
            snprintf(path, size, "%s/%s", dir, e->d_name);
            found = true;
        }
    closedir(d);
    return found;
}

/* No libocloc (in a child: the library is looked for once per process). */
static void case_no_ocloc(void) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        setenv("SG_OCLOC_LIB", "/nonexistent/libocloc.so", 1);
        sg_ctx *ctx = tu_ctx((sg_ctx_opts){.backend = SG_BACKEND_CPU});
        void *spv = NULL;
        size_t n = 0;
        sg_status s = sg__ocloc_build(ctx, "sg_axpy", good, &spv, &n);
        bool ok = s == SG_ERR_BACKEND_UNAVAILABLE && !spv &&
                  (strstr(sg_last_error(ctx), "intel-opencl-icd") != NULL ||
                   strstr(sg_last_error(ctx), "built with a sanitizer") != NULL);
        printf("  %s\n", sg_last_error(ctx));
        sg_ctx_destroy(ctx);
        fflush(stdout);
        _exit(ok ? 0 : 1);
    }
    int st = 0;
    bool ok = TU_EXPECT(pid > 0 && waitpid(pid, &st, 0) == pid) &&
              TU_EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    tu_case(ok, "OCLOC_MISSING(SG_OCLOC_LIB=/nonexistent: SG_ERR_BACKEND_UNAVAILABLE)");
}

int main(void) {
    case_no_ocloc();
    snprintf(dir, sizeof dir, "/tmp/sg-ocloc-test-XXXXXX");
    if (!mkdtemp(dir)) return 1;
    setenv("SG_CACHE_DIR", dir, 1);
    unsetenv("SG_ALWAYS_COMPILE");
    sg_ctx *ctx = tu_ctx((sg_ctx_opts){.backend = SG_BACKEND_CPU, .log = on_log});
    void *spv = NULL, *again = NULL;
    size_t n = 0, n2 = 0;
    uint64_t c0 = sg__ocloc_compiles();
    sg_status s = sg__ocloc_build(ctx, "sg_axpy", good, &spv, &n);
    if (s == SG_ERR_BACKEND_UNAVAILABLE) {
        printf("skip the libocloc cases: %s\n", sg_last_error(ctx));
        sg_ctx_destroy(ctx);
        rmdir(dir);
        return tu_finish();
    }
    uint32_t w0 = 0;
    if (spv) memcpy(&w0, spv, 4);
    char path[512];
    bool ok = TU_EXPECT(s == SG_OK) && TU_EXPECT(n >= 20 && n % 4 == 0 && w0 == 0x07230203u) &&
              TU_EXPECT(has_name(spv, n, "sg_axpy")) && TU_EXPECT(sg__ocloc_compiles() == c0 + 1) &&
              TU_EXPECT(entry_path(path, sizeof path));
    tu_case(ok, "OCLOC_BUILD(OpenCL C axpy -> SPIR-V, %zu bytes, entry spv-<key>.spv)", n);

    /* The same source again: from the cache, the same bytes. */
    s = sg__ocloc_build(ctx, "sg_axpy", good, &again, &n2);
    ok = TU_EXPECT(s == SG_OK) && TU_EXPECT(n2 == n && again && memcmp(again, spv, n) == 0) &&
         TU_EXPECT(sg__ocloc_compiles() == c0 + 1);
    tu_case(ok, "OCLOC_CACHE_HIT(second build compiles nothing, same module)");
    sg__free(ctx, again, n2);

    /* A damaged entry: detected by its hash, removed and rebuilt. */
    FILE *f = fopen(path, "r+b");
    ok = TU_EXPECT(f != NULL);
    if (f) {
        fseek(f, 48, SEEK_SET);
        fputc(0x5a ^ 0xff, f);
        fclose(f);
    }
    again = NULL;
    s = sg__ocloc_build(ctx, "sg_axpy", good, &again, &n2);
    ok = ok && TU_EXPECT(s == SG_OK) && TU_EXPECT(n2 == n && memcmp(again, spv, n) == 0) &&
         TU_EXPECT(sg__ocloc_compiles() == c0 + 2);
    tu_case(ok, "OCLOC_CACHE_DAMAGED(a flipped byte: rebuilt, same module)");
    sg__free(ctx, again, n2);

    /* A kernel with an error: ocloc's log in the message. */
    again = NULL;
    s = sg__ocloc_build(ctx, "sg_bad", "__kernel void k(__global float *a) { a[0] = 2.0f * ; }",
                        &again, &n2);
    ok = TU_EXPECT(s == SG_ERR_COMPILE) && TU_EXPECT(again == NULL) &&
         TU_EXPECT(strstr(sg_last_error(ctx), "sg_bad") != NULL) &&
         TU_EXPECT(strstr(sg_last_error(ctx), "expected expression") != NULL);
    printf("  %.160s\n", sg_last_error(ctx));
    sg_clear_error(ctx);
    tu_case(ok, "OCLOC_ERROR(a syntax error: SG_ERR_COMPILE with ocloc's log)");

    /* Modules cut short: one byte (no whole words), and half the words
     * (a sound header, an incomplete body: spirv-val's to refuse). */
    size_t half = n / 8 * 4;
    ok = TU_EXPECT(sg__ocloc_check(ctx, "cut1", spv, n - 1) == SG_ERR_COMPILE) &&
         TU_EXPECT(strstr(sg_last_error(ctx), "no SPIR-V") != NULL);
    sg_clear_error(ctx);
    ok = ok && TU_EXPECT(sg__ocloc_check(ctx, "whole", spv, n) == SG_OK);
    bool have_val = system("spirv-val --version >/dev/null 2>&1") == 0;
    if (have_val) {
        ok = ok && TU_EXPECT(sg__ocloc_check(ctx, "cut_half", spv, half) == SG_ERR_COMPILE) &&
             TU_EXPECT(strstr(sg_last_error(ctx), "spirv-val") != NULL);
        printf("  %.160s\n", sg_last_error(ctx));
        sg_clear_error(ctx);
    }
    tu_case(ok, "OCLOC_CHECK(cut by a byte: refused; cut to %zu of %zu bytes: %s)", half, n,
            have_val ? "spirv-val refuses it" : "spirv-val absent, not checked");

    /* spirv-val not on PATH: said once, and the shape check stands. */
    const char *old = getenv("PATH");
    char *saved = old ? strdup(old) : NULL;
    setenv("PATH", dir, 1);
    int before = fallback_lines;
    ok = TU_EXPECT(sg__ocloc_check(ctx, "cut_half", spv, half) == SG_OK) &&
         TU_EXPECT(sg__ocloc_check(ctx, "cut1", spv, n - 1) == SG_ERR_COMPILE) &&
         TU_EXPECT(sg__ocloc_check(ctx, "whole", spv, n) == SG_OK);
    sg_clear_error(ctx);
    ok = ok && TU_EXPECT(fallback_lines - before == (before == 0 ? 1 : 0));
    if (saved) setenv("PATH", saved, 1), free(saved);
    tu_case(ok, "OCLOC_NO_SPIRV_VAL(PATH without spirv-val: said once under fallbacks)");

    sg__free(ctx, spv, n);
    sg_cache_clear(ctx);
    sg_ctx_destroy(ctx);
    rmdir(dir);
    return tu_finish();
}
