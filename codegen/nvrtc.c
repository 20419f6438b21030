/* SPDX-License-Identifier: MIT */
/*
 * nvrtc.c -- CUDA C to a cubin with NVRTC, loaded at run time, through the
 * disk cache. An entry is one file, <root>/cu-<key>.cubin, kept by blob.c
 * (magic, SHA-256, image; written whole or not at all). The key hashes the
 * generator version, NVRTC's version, the options, the arch and the source.
 * Files are read and written under the cache's trust rules (cache_dir.c):
 * never through a link, only regular files of the user's, in a root that is
 * the user's alone; a root that cannot be used means compiling uncached.
 *
 * Generated code never relies on fused multiply-add contraction
 * (--fmad=false): the eager CPU kernels round after every multiply, and a
 * fused kernel must agree with them within the dtype's tolerance.
 */
#include "codegen.h"

#include <stdio.h>

#ifdef SG_HAVE_CUDA_HEADERS

#include <dlfcn.h>
#include <limits.h>
#include <nvrtc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#define SG__NVRTC_API(X)                                                                           \
    X(nvrtcVersion)                                                                                \
    X(nvrtcGetErrorString)                                                                         \
    X(nvrtcCreateProgram)                                                                          \
    X(nvrtcCompileProgram)                                                                         \
    X(nvrtcGetProgramLogSize)                                                                      \
    X(nvrtcGetProgramLog)                                                                          \
    X(nvrtcGetCUBINSize)                                                                           \
    X(nvrtcGetCUBIN)                                                                               \
    X(nvrtcDestroyProgram)

static struct {
#define X(f) __typeof__(&f) f;
    SG__NVRTC_API(X)
#undef X
} api;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static bool loaded;
static int ver_major, ver_minor;
static char load_why[512];
static atomic_uint_fast64_t n_compiles;

static void load_once(void) {
    /* The soname first (what a user's loader path finds), then the toolkit. */
    const char *names[] = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so",
                           "/usr/local/cuda/lib64/libnvrtc.so.13",
                           "/usr/local/cuda/lib64/libnvrtc.so"};
    void *lib = NULL;
    const char *err = NULL;
    for (size_t i = 0; i < sizeof names / sizeof *names && !lib; i++) {
        lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (!lib && !err) err = dlerror();
    }
    if (!lib) {
        snprintf(load_why, sizeof load_why,
                 "NVRTC is not available: cannot load libnvrtc.so.13 "
                 "(%s); install the CUDA toolkit's NVRTC or add its lib64 to LD_LIBRARY_PATH",
                 err ? err : "not found");
        return;
    }
#define X(f)                                                                                       \
    api.f = (__typeof__(api.f))(uintptr_t)dlsym(lib, #f);                                          \
    if (!api.f) {                                                                                  \
        snprintf(load_why, sizeof load_why,                                                        \
                 "the NVRTC library lacks %s; install NVRTC 12 or "                                \
                 "newer",                                                                          \
                 #f);                                                                              \
        return;                                                                                    \
    }
    SG__NVRTC_API(X)
#undef X
    if (api.nvrtcVersion(&ver_major, &ver_minor) != NVRTC_SUCCESS) {
        snprintf(load_why, sizeof load_why, "nvrtcVersion failed");
        return;
    }
    loaded = true;
}

uint64_t sg__nvrtc_compiles(void) { return atomic_load(&n_compiles); }

static const char *env(const char *name) {
    const char *v = getenv(name);
    return v && v[0] ? v : NULL;
}

static const char magic[8] = {'S', 'G', 'C', 'U', 'B', 'I', 'N', '1'};

static sg_status compile(sg_ctx *ctx, const char *name, const char *source, const char *arch_opt,
                         void **cubin, size_t *size) {
    nvrtcProgram prog;
    char file[256];
    snprintf(file, sizeof file, "%s.cu", name);
    nvrtcResult r = api.nvrtcCreateProgram(&prog, source, file, 0, NULL, NULL);
    if (r != NVRTC_SUCCESS)
        return sg__fail(ctx, r == NVRTC_ERROR_OUT_OF_MEMORY ? SG_ERR_OOM : SG_ERR_COMPILE,
                        "nvrtc: creating the program '%s' failed: %s", name,
                        api.nvrtcGetErrorString(r));
    const char *opts[] = {arch_opt, "--std=c++17", "--fmad=false", "-default-device"};
    r = api.nvrtcCompileProgram(prog, (int)(sizeof opts / sizeof *opts), opts);
    atomic_fetch_add(&n_compiles, 1);
    sg_status s = SG_OK;
    if (r != NVRTC_SUCCESS) {
        size_t logn = 0;
        char head[600] = "";
        if (api.nvrtcGetProgramLogSize(prog, &logn) == NVRTC_SUCCESS && logn > 1) {
            char *log = sg__alloc(ctx, logn);
            if (log && api.nvrtcGetProgramLog(prog, log) == NVRTC_SUCCESS)
                snprintf(head, sizeof head, "%.*s", (int)sizeof head - 1, log);
            sg__free(ctx, log, logn);
        }
        s = sg__fail(ctx, SG_ERR_COMPILE, "nvrtc: compiling '%s' for %s failed (%s): %s%s", name,
                     arch_opt + 19, api.nvrtcGetErrorString(r), head,
                     env("SG_DUMP_DIR") ? "" : " (set SG_DUMP_DIR to keep the source)");
    } else {
        size_t n = 0;
        r = api.nvrtcGetCUBINSize(prog, &n);
        void *img = r == NVRTC_SUCCESS && n ? sg__alloc(ctx, n) : NULL;
        if (!img)
            s = sg__fail(ctx, r == NVRTC_SUCCESS ? SG_ERR_OOM : SG_ERR_COMPILE,
                         "nvrtc: no cubin for '%s' (%zu bytes): %s", name, n,
                         api.nvrtcGetErrorString(r));
        else if ((r = api.nvrtcGetCUBIN(prog, img)) != NVRTC_SUCCESS) {
            sg__free(ctx, img, n);
            s = sg__fail(ctx, SG_ERR_COMPILE, "nvrtc: reading the cubin of '%s' failed: %s", name,
                         api.nvrtcGetErrorString(r));
        } else {
            *cubin = img;
            *size = n;
        }
    }
    api.nvrtcDestroyProgram(&prog);
    return s;
}

/* SG_OVERRIDE_DIR/<name>.cu replaces the source; SG_DUMP_DIR/<name>.cu gets
 * what is compiled. *owned is the override text to free (size *owned_n). */
static sg_status override_and_dump(sg_ctx *ctx, const char *name, const char **source, char **owned,
                                   size_t *owned_n) {
    sg_status s = sg__read_override(ctx, name, ".cu", owned, owned_n);
    if (s != SG_OK) return s;
    if (*owned) *source = *owned;
    return sg__dump_source(ctx, name, ".cu", *source, strlen(*source));
}

sg_status sg__nvrtc_build(sg_ctx *ctx, const char *name, const char *source, int arch, void **cubin,
                          size_t *size) {
    SG_ASSERT(ctx && cubin && size);
    *cubin = NULL;
    *size = 0;
    if (!source)
        return sg__fail(ctx, SG_ERR_INVALID_ARG, "nvrtc: kernel '%s' has no source",
                        name ? name : "(null)");
    pthread_once(&once, load_once);
    if (!loaded) return sg__fail(ctx, SG_ERR_BACKEND_UNAVAILABLE, "%s", load_why);
    char root[PATH_MAX];
    sg_status s = sg__cache_root_or_none(ctx, name, root, sizeof root - 80);
    if (s != SG_OK) return s;
    char *owned = NULL;
    size_t owned_n = 0;
    s = override_and_dump(ctx, name, &source, &owned, &owned_n);
    if (s != SG_OK) {
        if (owned) sg__free(ctx, owned, owned_n + 1);
        return s;
    }

    char arch_opt[40], ver[32], key[65];
    snprintf(arch_opt, sizeof arch_opt, "--gpu-architecture=sm_%d", arch);
    snprintf(ver, sizeof ver, "%d.%d", ver_major, ver_minor);
    const char *fields[] = {SG__CODEGEN_VERSION,
                            "cuda",
                            ver,
                            arch_opt,
                            "--std=c++17 --fmad=false -default-device",
                            source};
    sg__blob_key(fields, (int)(sizeof fields / sizeof *fields), key);
    char path[PATH_MAX + 96]; /* root is at most PATH_MAX - 80 */
    snprintf(path, sizeof path, "%s/cu-%s.cubin", root, key);

    const char *always = env("SG_ALWAYS_COMPILE");
    if (root[0] && !(always && strcmp(always, "0") != 0) && !ctx->no_cache_reads)
        sg__blob_lookup(ctx, path, magic, cubin, size);
    if (!*cubin) {
        s = compile(ctx, name, source, arch_opt, cubin, size);
        if (s == SG_OK && root[0]) sg__blob_publish(ctx, root, path, magic, *cubin, *size);
    }
    if (owned) sg__free(ctx, owned, owned_n + 1);
    return s;
}

#else /* no CUDA headers at build time */

uint64_t sg__nvrtc_compiles(void) { return 0; }

sg_status sg__nvrtc_build(sg_ctx *ctx, const char *name, const char *source, int arch, void **cubin,
                          size_t *size) {
    (void)source, (void)arch;
    *cubin = NULL;
    *size = 0;
    return sg__fail(ctx, SG_ERR_BACKEND_UNAVAILABLE,
                    "nvrtc: cannot compile '%s': this stepgraph was built without the CUDA "
                    "headers; rebuild with the CUDA toolkit installed",
                    name ? name : "(null)");
}

#endif
