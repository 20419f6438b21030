/* SPDX-License-Identifier: MIT */
/*
 * ocloc.c -- OpenCL C to a SPIR-V module with libocloc, loaded at run time,
 * through the disk cache. The source goes to oclocInvoke in memory (its
 * sources arrays) with "-spv_only"; the .spv output comes back in memory.
 * libocloc has reported success on a truncated module, so every new module
 * is checked: the SPIR-V magic and a whole number of words always, and
 * spirv-val (from PATH) when it is there. An entry is one file,
 * <root>/spv-<key>.spv, kept by blob.c; the key hashes the generator
 * version, ocloc's version, the options and the source.
 */
#include "codegen.h"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* libocloc's entry points (ocloc_api.h), declared here so that building
 * needs no header of it. */
typedef int (*ocloc_invoke_fn)(unsigned argc, const char **argv, uint32_t nsrc, const uint8_t **src,
                               const uint64_t *src_len, const char **src_names, uint32_t nhdr,
                               const uint8_t **hdr, const uint64_t *hdr_len, const char **hdr_names,
                               uint32_t *nout, uint8_t ***out, uint64_t **out_len,
                               char ***out_names);
typedef int (*ocloc_free_fn)(uint32_t *nout, uint8_t ***out, uint64_t **out_len, char ***out_names);
typedef int (*ocloc_version_fn)(void);

static struct {
    ocloc_invoke_fn invoke;
    ocloc_free_fn free_output;
    int version;
} api;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER; /* one oclocInvoke at a time */
static bool loaded;
static char load_why[512];
static atomic_uint_fast64_t n_compiles;
static atomic_flag said_no_val = ATOMIC_FLAG_INIT;

static const char magic[8] = {'S', 'G', 'S', 'P', 'I', 'R', 'V', '1'};

static void load_once(void) {
    if (SG__SANITIZED) {
        snprintf(load_why, sizeof load_why,
                 "ocloc: this stepgraph is built with a sanitizer, which aborts the process when "
                 "libocloc opens its compiler (RTLD_DEEPBIND); use a build without sanitizers "
                 "to compile kernels for the ze backend");
        return;
    }
    const char *path = getenv("SG_OCLOC_LIB");
    if (!path || !*path) path = "libocloc.so";
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *e = dlerror();
        snprintf(load_why, sizeof load_why,
                 "ocloc: cannot load %s (%s); install intel-opencl-icd (it ships libocloc.so) "
                 "to compile kernels for the ze backend",
                 path, e ? e : "not found");
        return;
    }
    api.invoke = (ocloc_invoke_fn)(uintptr_t)dlsym(lib, "oclocInvoke");
    api.free_output = (ocloc_free_fn)(uintptr_t)dlsym(lib, "oclocFreeOutput");
    ocloc_version_fn ver = (ocloc_version_fn)(uintptr_t)dlsym(lib, "oclocVersion");
    if (!api.invoke || !api.free_output) {
        snprintf(load_why, sizeof load_why,
                 "ocloc: %s lacks oclocInvoke or oclocFreeOutput; install a newer "
                 "intel-opencl-icd",
                 path);
        return;
    }
    api.version = ver ? ver() : 0;
    loaded = true;
}

uint64_t sg__ocloc_compiles(void) { return atomic_load(&n_compiles); }

sg_status sg__ocloc_probe(char *why, size_t n) {
    pthread_once(&once, load_once);
    if (!loaded && why && n) snprintf(why, n, "%s", load_why);
    return loaded ? SG_OK : SG_ERR_BACKEND_UNAVAILABLE;
}

static const char *device(void) {
    const char *d = getenv("SG_ZE_OCLOC_DEVICE");
    return d && d[0] ? d : "pvc";
}

/* SPIR-V's own check: a header of five words starting with the magic, and
 * a whole number of words. */
static bool spirv_shaped(const void *img, size_t n) {
    uint32_t w0;
    if (n < 20 || n % 4) return false;
    memcpy(&w0, img, 4);
    return w0 == 0x07230203u;
}

/* Read up to size-1 bytes of fd from its start into buf. */
static void read_head(int fd, char *buf, size_t size) {
    ssize_t r = pread(fd, buf, size - 1, 0);
    buf[r > 0 ? r : 0] = '\0';
}

sg_status sg__ocloc_check(sg_ctx *ctx, const char *name, const void *img, size_t n) {
    if (!spirv_shaped(img, n))
        return sg__fail(ctx, SG_ERR_COMPILE,
                        "ocloc: the module of '%s' is no SPIR-V (%zu bytes, bad magic or "
                        "length); set SG_DUMP_DIR to keep the source and report it",
                        name, n);
    const char *dir = getenv("TMPDIR");
    char spv[PATH_MAX], log[PATH_MAX];
    snprintf(spv, sizeof spv, "%s/sg-spv-XXXXXX", dir && dir[0] ? dir : "/tmp");
    snprintf(log, sizeof log, "%s/sg-spvlog-XXXXXX", dir && dir[0] ? dir : "/tmp");
    int fd = mkstemp(spv);
    if (fd < 0) return SG_OK; /* cannot check: the shape check above stands */
    int lfd = mkstemp(log);
    bool wrote = write(fd, img, n) == (ssize_t)n;
    close(fd);
    sg_status s = SG_OK;
    if (wrote && lfd >= 0) {
        char *argv[] = {"spirv-val", spv, NULL};
        int status = 0;
        int rc = sg__run_program(argv, lfd, &status, 60);
        if (rc == ENOENT) {
            if (!atomic_flag_test_and_set(&said_no_val))
                sg__log(ctx, "fallbacks",
                        "ocloc: spirv-val is not on PATH; SPIR-V modules get only the magic and "
                        "length check (install spirv-tools)");
        } else if (rc == 0 && status != 0) {
            char head[500];
            read_head(lfd, head, sizeof head);
            s = sg__fail(ctx, SG_ERR_COMPILE, "ocloc: spirv-val rejects the module of '%s': %s",
                         name, head);
        }
    }
    if (lfd >= 0) close(lfd), unlink(log);
    unlink(spv);
    return s;
}

/* The .spv output of one oclocInvoke, or the log head on failure. */
static sg_status compile(sg_ctx *ctx, const char *name, const char *source, void **spirv,
                         size_t *size) {
    char file[256];
    snprintf(file, sizeof file, "%s.cl", name);
    /* OpenCL C 2.0: generated kernels take their address table as a pointer
     * to pointers, which 1.2 refuses in a kernel's parameters. */
    const char *argv[] = {"ocloc",    "-file",         file, "-spv_only", "-device", device(),
                          "-options", "-cl-std=CL2.0", "-q"};
    const uint8_t *src[] = {(const uint8_t *)source};
    uint64_t len[] = {strlen(source) + 1};
    const char *names[] = {file};
    uint32_t nout = 0;
    uint8_t **out = NULL;
    uint64_t *out_len = NULL;
    char **out_names = NULL;
    pthread_mutex_lock(&lock);
    int rc = api.invoke((unsigned)(sizeof argv / sizeof *argv), argv, 1, src, len, names, 0, NULL,
                        NULL, NULL, &nout, &out, &out_len, &out_names);
    pthread_mutex_unlock(&lock);
    atomic_fetch_add(&n_compiles, 1);
    int spv = -1, lg = -1;
    for (uint32_t i = 0; i < nout; i++) {
        size_t l = strlen(out_names[i]);
        if (l > 4 && strcmp(out_names[i] + l - 4, ".spv") == 0) spv = (int)i;
        if (strcmp(out_names[i], "stdout.log") == 0) lg = (int)i;
    }
    sg_status s = SG_OK;
    if (rc != 0 || spv < 0) {
        char head[600] = "";
        if (lg >= 0)
            snprintf(head, sizeof head, "%.*s", (int)(out_len[lg] < 599 ? out_len[lg] : 599),
                     (const char *)out[lg]);
        s = sg__fail(ctx, SG_ERR_COMPILE, "ocloc: compiling '%s' to SPIR-V failed (%d): %s%s", name,
                     rc, head[0] ? head : "no log",
                     getenv("SG_DUMP_DIR") ? "" : " (set SG_DUMP_DIR to keep the source)");
    } else {
        void *img = sg__alloc(ctx, (size_t)out_len[spv]);
        if (!img)
            s = sg__fail(ctx, SG_ERR_OOM, "ocloc: out of host memory for the module of '%s'", name);
        else {
            memcpy(img, out[spv], (size_t)out_len[spv]);
            *spirv = img;
            *size = (size_t)out_len[spv];
        }
    }
    if (nout) api.free_output(&nout, &out, &out_len, &out_names);
    if (s == SG_OK && (s = sg__ocloc_check(ctx, name, *spirv, *size)) != SG_OK) {
        sg__free(ctx, *spirv, *size);
        *spirv = NULL;
        *size = 0;
    }
    return s;
}

sg_status sg__ocloc_build(sg_ctx *ctx, const char *name, const char *source, void **spirv,
                          size_t *size) {
    SG_ASSERT(ctx && spirv && size);
    *spirv = NULL;
    *size = 0;
    if (!source)
        return sg__fail(ctx, SG_ERR_INVALID_ARG, "ocloc: kernel '%s' has no source",
                        name ? name : "(null)");
    pthread_once(&once, load_once);
    if (!loaded) return sg__fail(ctx, SG_ERR_BACKEND_UNAVAILABLE, "%s", load_why);
    char root[PATH_MAX];
    sg_status s = sg__cache_root_or_none(ctx, name, root, sizeof root - 80);
    if (s != SG_OK) return s;
    char *owned = NULL;
    size_t owned_n = 0;
    s = sg__read_override(ctx, name, ".cl", &owned, &owned_n);
    if (s == SG_OK && owned) source = owned;
    if (s == SG_OK) s = sg__dump_source(ctx, name, ".cl", source, strlen(source));
    if (s != SG_OK) {
        if (owned) sg__free(ctx, owned, owned_n + 1);
        return s;
    }
    char ver[32], opts[96], key[65];
    snprintf(ver, sizeof ver, "%d", api.version);
    snprintf(opts, sizeof opts, "-spv_only -device %s -options -cl-std=CL2.0", device());
    const char *fields[] = {SG__CODEGEN_VERSION, "opencl", ver, opts, source};
    sg__blob_key(fields, (int)(sizeof fields / sizeof *fields), key);
    char path[PATH_MAX + 96]; /* root is at most PATH_MAX - 80 */
    snprintf(path, sizeof path, "%s/spv-%s.spv", root, key);
    if (root[0] && !sg__always_compile() && !ctx->no_cache_reads &&
        (s = sg__blob_lookup(ctx, path, magic, spirv, size)) != SG_OK) {
        if (owned) sg__free(ctx, owned, owned_n + 1);
        return s;
    }
    if (*spirv && !spirv_shaped(*spirv, *size)) { /* a sound file of a bad module: rebuild */
        sg__free(ctx, *spirv, *size);
        *spirv = NULL;
    }
    if (!*spirv) {
        s = compile(ctx, name, source, spirv, size);
        if (s == SG_OK && root[0]) sg__blob_publish(ctx, root, path, magic, *spirv, *size);
    }
    if (owned) sg__free(ctx, owned, owned_n + 1);
    return s;
}
