/* SPDX-License-Identifier: MIT */
/*
 * nvrtc.c -- GPU C++ to a device image at run time, through the disk cache,
 * with one of two drivers whose APIs mirror each other: NVRTC (CUDA C to a
 * cubin for sm_<arch>) and hiprtc (the same source, after the HIP prelude
 * below, to a code object for an AMD gfx<N> arch). Both are loaded at run
 * time (dlopen): libnvrtc from the CUDA toolkit; hiprtc from the HIP
 * runtime (libamdhip64, or libhiprtc where ROCm ships it apart).
 *
 * An entry is one file, <root>/cu-<key>.cubin (NVRTC) or
 * <root>/hip-<key>.hsaco (hiprtc): a magic, the SHA-256 of the image, and
 * the image, kept by blob.c (written whole or not at all; a damaged file is
 * removed and rebuilt). The key hashes the generator version, the driver
 * and its version, the options, the arch and the source. Files are read
 * and written under the cache's trust rules (cache_dir.c): never through a
 * link, only regular files of the user's, in a root that is the user's
 * alone; a root that cannot be used means compiling uncached.
 *
 * Generated code never relies on fused multiply-add contraction
 * (--fmad=false, -ffp-contract=off): the eager CPU kernels round after
 * every multiply, and a fused kernel must agree with them within the
 * dtype's tolerance.
 *
 * hiprtc is asked only for the archs of hiprtc_archs: for an arch its
 * code-object manager does not know, ROCm 5's aborts the process.
 */

#include "codegen.h"
#include "nvrtc_opts.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#ifdef SG_HAVE_CUDA_HEADERS
#include <nvrtc.h>
_Static_assert(NVRTC_SUCCESS == 0 && NVRTC_ERROR_OUT_OF_MEMORY == 1, "nvrtcResult codes");
#endif
#ifdef SG_HAVE_HIP_HEADERS
#include <hip/hiprtc.h>
_Static_assert(HIPRTC_SUCCESS == 0 && HIPRTC_ERROR_OUT_OF_MEMORY == 1, "hiprtcResult codes");
#endif

/* ------------------------------------------------------------ the HIP prelude */

/*
 * What hiprtc needs before a unit written for NVRTC: the CUDA spellings the
 * kernels use that HIP names otherwise. A warp stays 32 lanes: on a wave64
 * GPU each shuffle has width 32, so it stays within its half of the wave,
 * and the kernels' lane (threadIdx.x & 31) and warp (threadIdx.x >> 5)
 * arithmetic keeps its meaning. __syncwarp orders shared memory within the
 * wave (whose lanes run in lockstep). The mask arguments are ignored: every
 * kernel passes the full warp. __ldcg (a load past the L1 of what other
 * blocks wrote: the cut reductions' partials) is a volatile load. Guarded, so that a unit that has
 * it already may get it again.
 */
const char sg__hip_prelude[] =
    "#ifndef SG_HIP_PRELUDE\n"
    "#define SG_HIP_PRELUDE 1\n"
    "template <typename T>\n"
    "static __device__ __forceinline__ T __shfl_xor_sync(unsigned, T v, int m, int w = 32) {\n"
    "    return __shfl_xor(v, m, w);\n"
    "}\n"
    "template <typename T>\n"
    "static __device__ __forceinline__ T __shfl_sync(unsigned, T v, int l, int w = 32) {\n"
    "    return __shfl(v, l, w);\n"
    "}\n"
    "template <typename T>\n"
    "static __device__ __forceinline__ T __shfl_down_sync(unsigned, T v, unsigned d, int w = 32) "
    "{\n"
    "    return __shfl_down(v, d, w);\n"
    "}\n"
    "template <typename T>\n"
    "static __device__ __forceinline__ T __shfl_up_sync(unsigned, T v, unsigned d, int w = 32) {\n"
    "    return __shfl_up(v, d, w);\n"
    "}\n"
    "template <typename T> /* HIP's headers may have only __half's */\n"
    "static __device__ __forceinline__ T __ldcg(const T *p) {\n"
    "    return *(const volatile T *)p;\n"
    "}\n"
    "static __device__ __forceinline__ void __syncwarp(unsigned = 0xffffffffu) {\n"
    "    __builtin_amdgcn_fence(__ATOMIC_RELEASE, \"wavefront\");\n"
    "    __builtin_amdgcn_wave_barrier();\n"
    "    __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, \"wavefront\");\n"
    "}\n"
    "#endif\n";

/* ------------------------------------------------------------ the two drivers */

/* The calls both drivers have, in their shared shape (both result enums
 * are ints with SUCCESS 0 and OUT_OF_MEMORY 1; programs are pointers). */
typedef struct rtc_api {
    const char *(*error_string)(int);
    int (*version)(int *, int *);
    int (*create)(void **, const char *, const char *, int, const char *const *,
                  const char *const *);
    int (*compile)(void *, int, const char *const *);
    int (*log_size)(void *, size_t *);
    int (*log)(void *, char *);
    int (*code_size)(void *, size_t *);
    int (*code)(void *, char *);
    int (*destroy)(void **);
} rtc_api;

/* Per driver: its symbols in rtc_api's order, names, options and cache file. */
typedef struct rtc_driver {
    const char *tag, *syms[9], *arch_flag, *opts[3], *prefix, *suffix;
    pthread_once_t once;
    bool loaded;
    rtc_api api;
    char ver[32], why[512];
    atomic_uint_fast64_t compiles;
} rtc_driver;

static rtc_driver drivers[2] = {
    [SG__RTC_NVRTC] = {"nvrtc",
                       {"nvrtcGetErrorString", "nvrtcVersion", "nvrtcCreateProgram",
                        "nvrtcCompileProgram", "nvrtcGetProgramLogSize", "nvrtcGetProgramLog",
                        "nvrtcGetCUBINSize", "nvrtcGetCUBIN", "nvrtcDestroyProgram"},
                       "--gpu-architecture=",
                       {SG_NVRTC_OPTS},
                       "cu",
                       "cubin",
                       PTHREAD_ONCE_INIT},
    [SG__RTC_HIPRTC] = {"hiprtc",
                        {"hiprtcGetErrorString", "hiprtcVersion", "hiprtcCreateProgram",
                         "hiprtcCompileProgram", "hiprtcGetProgramLogSize", "hiprtcGetProgramLog",
                         "hiprtcGetCodeSize", "hiprtcGetCode", "hiprtcDestroyProgram"},
                        "--offload-arch=",
                        {"-std=c++17", "-ffp-contract=off", "-O3"},
                        "hip",
                        "hsaco",
                        PTHREAD_ONCE_INIT},
};

/* The archs hiprtc is asked for: those ROCm 5.2's code-object manager
 * compiles (each checked here); gfx940 and later abort it. */
static const char *const hiprtc_archs[] = {"gfx803",  "gfx900",  "gfx906",  "gfx908",  "gfx90a",
                                           "gfx90c",  "gfx1010", "gfx1011", "gfx1012", "gfx1030",
                                           "gfx1031", "gfx1032", "gfx1034", "gfx1035", "gfx1036"};

bool sg__hiprtc_arch_known(const char *arch) {
    for (size_t i = 0; arch && i < sizeof hiprtc_archs / sizeof *hiprtc_archs; i++)
        if (strcmp(arch, hiprtc_archs[i]) == 0) return true;
    return false;
}

/* ------------------------------------------------------------ the HIP runtime library */

static pthread_once_t hip_once = PTHREAD_ONCE_INIT;
static void *hip_lib;
static char hip_why[320], hip_path[256];

static void hip_open(void) {
    /* SG_HIP_RUNTIME names the library (tests point it at one that is not there). */
    const char *over = getenv("SG_HIP_RUNTIME");
    const char *names[] = {"libamdhip64.so.6", "libamdhip64.so.5", "libamdhip64.so"};
    size_t nn = over && over[0] ? 1 : sizeof names / sizeof *names;
    size_t len = 0;
    for (size_t i = 0; i < nn && !hip_lib; i++) {
        const char *name = over && over[0] ? over : names[i];
        hip_lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
        if (hip_lib) {
            snprintf(hip_path, sizeof hip_path, "%s", name);
        } else {
            const char *e = dlerror();
            int w = snprintf(hip_why + len, sizeof hip_why - len, "%s%.120s", len ? "; " : "",
                             e ? e : name);
            if (w > 0 && (size_t)w < sizeof hip_why - len) len += (size_t)w;
        }
    }
}

void *sg__hip_library(char *why, size_t n, const char **path) {
    pthread_once(&hip_once, hip_open);
    if (!hip_lib && why && n)
        snprintf(
            why, n,
            "no HIP runtime: cannot load libamdhip64 (tried %.300s); install ROCm's HIP runtime "
            "(apt-get install libamdhip64-5, or ROCm 6's hip-runtime-amd) or set "
            "SG_HIP_RUNTIME to its path",
            hip_why);
    if (path) *path = hip_lib ? hip_path : NULL;
    return hip_lib;
}

static void load(rtc_driver *d, void *lib, const char *libname) {
    void **slot = (void **)&d->api;
    for (int i = 0; i < 9; i++) {
        void *f = dlsym(lib, d->syms[i]);
        if (!f) {
            snprintf(d->why, sizeof d->why, "%s lacks %s; install a newer %s", libname, d->syms[i],
                     d == &drivers[SG__RTC_NVRTC] ? "NVRTC (12 or newer)" : "ROCm");
            return;
        }
        memcpy(&slot[i], &f, sizeof f);
    }
    int major = 0, minor = 0;
    if (d->api.version(&major, &minor) != 0) {
        snprintf(d->why, sizeof d->why, "%sVersion failed", d->tag);
        return;
    }
    snprintf(d->ver, sizeof d->ver, "%d.%d", major, minor);
    d->loaded = true;
}

static void nvrtc_once(void) {
    /* The soname first (what a user's loader path finds), then the toolkit. */
    const char *names[] = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so",
                           "/usr/local/cuda/lib64/libnvrtc.so.13",
                           "/usr/local/cuda/lib64/libnvrtc.so"};
    rtc_driver *d = &drivers[SG__RTC_NVRTC];
    void *lib = NULL;
    const char *err = NULL;
    for (size_t i = 0; i < sizeof names / sizeof *names && !lib; i++) {
        lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (!lib && !err) err = dlerror();
    }
    if (!lib) {
        snprintf(d->why, sizeof d->why,
                 "NVRTC is not available: cannot load libnvrtc.so.13 "
                 "(%s); install the CUDA toolkit's NVRTC or add its lib64 to LD_LIBRARY_PATH",
                 err ? err : "not found");
        return;
    }
    load(d, lib, "the NVRTC library");
}

static void hiprtc_once(void) {
    rtc_driver *d = &drivers[SG__RTC_HIPRTC];
    const char *path;
    void *lib = sg__hip_library(d->why, sizeof d->why, &path);
    if (!lib) return;
    /* ROCm 5 keeps hiprtc inside libamdhip64; ROCm 6 ships it apart. */
    if (!dlsym(lib, "hiprtcCompileProgram")) {
        void *rtc = dlopen("libhiprtc.so.6", RTLD_NOW | RTLD_LOCAL);
        if (!rtc) rtc = dlopen("libhiprtc.so", RTLD_NOW | RTLD_LOCAL);
        if (!rtc) {
            snprintf(d->why, sizeof d->why,
                     "hiprtc is not available: %s has no hiprtc and libhiprtc.so.6 cannot be "
                     "loaded; install ROCm's hiprtc (hiprtc package)",
                     path);
            return;
        }
        lib = rtc, path = "libhiprtc.so";
    }
    load(d, lib, path);
}

bool sg__rtc_available(sg__rtc drv, char *why, size_t n) {
    rtc_driver *d = &drivers[drv];
    pthread_once(&d->once, drv == SG__RTC_NVRTC ? nvrtc_once : hiprtc_once);
    if (!d->loaded && why && n) snprintf(why, n, "%s", d->why);
    return d->loaded;
}

uint64_t sg__rtc_compiles(sg__rtc drv) { return atomic_load(&drivers[drv].compiles); }
uint64_t sg__nvrtc_compiles(void) { return sg__rtc_compiles(SG__RTC_NVRTC); }

static const char *env(const char *name) {
    const char *v = getenv(name);
    return v && v[0] ? v : NULL;
}

static const char magic[8] = {'S', 'G', 'C', 'U', 'B', 'I', 'N', '1'};

/* One compile, touching no sg_ctx, so that several may run on threads: the
 * image in *img (malloc'd, as the driver's own working memory is; the
 * caller copies it into memory of the context's allocator), or a status and
 * the message in err. */
static sg_status compile_core(rtc_driver *d, const char *name, const char *source,
                              const char *arch_opt, const char *arch, void **img, size_t *size,
                              char *err, size_t errn) {
    const rtc_api *api = &d->api;
    void *prog;
    char file[256];
    snprintf(file, sizeof file, "%s.cu", name);
    *img = NULL, *size = 0;
    int r = api->create(&prog, source, file, 0, NULL, NULL);
    if (r != 0) {
        snprintf(err, errn, "%s: creating the program '%s' failed: %s", d->tag, name,
                 api->error_string(r));
        return r == 1 ? SG_ERR_OOM : SG_ERR_COMPILE;
    }
    const char *opts[] = {arch_opt, d->opts[0], d->opts[1], d->opts[2]};
    r = api->compile(prog, (int)(sizeof opts / sizeof *opts), opts);
    atomic_fetch_add(&d->compiles, 1);
    sg_status s = SG_OK;
    if (r != 0) {
        size_t logn = 0;
        char head[600] = "";
        if (api->log_size(prog, &logn) == 0 && logn > 1) {
            char *log = malloc(logn);
            if (log && api->log(prog, log) == 0)
                snprintf(head, sizeof head, "%.*s", (int)sizeof head - 1, log);
            free(log);
        }
        snprintf(err, errn, "%s: compiling '%s' for %s failed (%s): %s%s", d->tag, name, arch,
                 api->error_string(r), head,
                 env("SG_DUMP_DIR") ? "" : " (set SG_DUMP_DIR to keep the source)");
        s = SG_ERR_COMPILE;
    } else {
        size_t n = 0;
        r = api->code_size(prog, &n);
        void *code = r == 0 && n ? malloc(n) : NULL;
        if (!code) {
            snprintf(err, errn, "%s: no device code for '%s' (%zu bytes): %s", d->tag, name, n,
                     api->error_string(r));
            s = r == 0 ? SG_ERR_OOM : SG_ERR_COMPILE;
        } else if ((r = api->code(prog, code)) != 0) {
            free(code);
            snprintf(err, errn, "%s: reading the code of '%s' failed: %s", d->tag, name,
                     api->error_string(r));
            s = SG_ERR_COMPILE;
        } else {
            *img = code, *size = n;
        }
    }
    api->destroy(&prog);
    return s;
}

/* compile_core's image into memory of the context's allocator, or its failure. */
static sg_status take_image(sg_ctx *ctx, sg_status s, const char *err, void *img, size_t n,
                            void **cubin, size_t *size) {
    if (s != SG_OK) return sg__fail(ctx, s, "%s", err);
    *cubin = sg__alloc(ctx, n);
    if (*cubin) memcpy(*cubin, img, n);
    free(img);
    if (!*cubin) return sg__fail(ctx, SG_ERR_OOM, "out of host memory for a %zu-byte image", n);
    *size = n;
    return SG_OK;
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

/* The cache file of one compile: <root>/<prefix>-<key>.<suffix>. */
static void entry_path(const rtc_driver *d, const char *root, const char *arch_opt,
                       const char *source, char *path, size_t size) {
    char opts[128], key[65];
    snprintf(opts, sizeof opts, "%s %s %s", d->opts[0], d->opts[1], d->opts[2]);
    const char *fields[] = {SG__CODEGEN_VERSION,
                            d == &drivers[SG__RTC_NVRTC] ? "cuda" : d->tag,
                            d->ver,
                            arch_opt,
                            opts,
                            source};
    sg__blob_key(fields, (int)(sizeof fields / sizeof *fields), key);
    snprintf(path, size, "%s/%s-%s.%s", root, d->prefix, key, d->suffix);
}

/* The unit hiprtc compiles: the prelude, then the source. */
static char *with_prelude(sg_ctx *ctx, const char *source, size_t *n) {
    size_t a = strlen(sg__hip_prelude), b = strlen(source);
    char *s = sg__alloc(ctx, a + b + 1);
    if (!s) return NULL;
    memcpy(s, sg__hip_prelude, a);
    memcpy(s + a, source, b + 1);
    *n = a + b + 1;
    return s;
}

/* One program of sg__rtc_build_many: what it compiles and where it goes. */
typedef struct rtc_job {
    rtc_driver *d;
    const char *name, *source, *arch_opt, *arch;
    char *owned, *unit; /* an override's text, the hiprtc unit (ctx memory) */
    size_t owned_n, unit_n;
    char path[PATH_MAX + 96];
    bool todo; /* missed the cache */
    void *img; /* compile_core's image (malloc'd) */
    size_t n;
    sg_status s;
    char err[SG__MSG_SIZE];
} rtc_job;

typedef struct rtc_pool {
    rtc_job *jobs;
    int njobs;
    atomic_int next;
} rtc_pool;

static void *rtc_worker(void *arg) {
    rtc_pool *p = arg;
    for (int i; (i = atomic_fetch_add(&p->next, 1)) < p->njobs;) {
        rtc_job *j = &p->jobs[i];
        if (j->todo)
            j->s = compile_core(j->d, j->name, j->source, j->arch_opt, j->arch, &j->img, &j->n,
                                j->err, sizeof j->err);
    }
    return NULL;
}

sg_status sg__rtc_build_many(sg_ctx *ctx, sg__rtc drv, int n, const char *const *names,
                             const char *const *sources, const char *arch, int nthreads,
                             void **cubins, size_t *sizes) {
    SG_ASSERT(ctx && n >= 1 && names && sources && cubins && sizes &&
              (drv == SG__RTC_NVRTC || drv == SG__RTC_HIPRTC));
    rtc_driver *d = &drivers[drv];
    for (int i = 0; i < n; i++) cubins[i] = NULL, sizes[i] = 0;
    for (int i = 0; i < n; i++)
        if (!sources[i])
            return sg__fail(ctx, SG_ERR_INVALID_ARG, "%s: kernel '%s' has no source", d->tag,
                            names[i] ? names[i] : "(null)");
    if (drv == SG__RTC_HIPRTC && !sg__hiprtc_arch_known(arch))
        return sg__fail(ctx, SG_ERR_BACKEND_UNAVAILABLE,
                        "hiprtc: cannot compile '%s' for %s: this stepgraph asks hiprtc only for "
                        "gfx803, gfx900, gfx906, gfx908, gfx90a, gfx90c and gfx1010-gfx1036 (ROCm "
                        "5.2's code-object manager aborts on archs it does not know); use "
                        "SG_BACKEND_CPU on this GPU",
                        names[0] ? names[0] : "(null)", arch ? arch : "(no arch)");
    char why[512];
    if (!sg__rtc_available(drv, why, sizeof why))
        return sg__fail(ctx, SG_ERR_BACKEND_UNAVAILABLE, "%s", why);
    char root[PATH_MAX];
    sg_status s = sg__cache_root_or_none(ctx, names[0], root, sizeof root - 80);
    if (s != SG_OK) return s;
    rtc_job *jobs = sg__calloc(ctx, sizeof *jobs * (size_t)n);
    if (!jobs) return sg__fail(ctx, SG_ERR_OOM, "%s: out of host memory", d->tag);
    char arch_opt[64];
    snprintf(arch_opt, sizeof arch_opt, "%s%s", d->arch_flag, arch);
    int todo = 0;
    for (int i = 0; i < n && s == SG_OK; i++) {
        rtc_job *j = &jobs[i];
        *j = (rtc_job){
            .d = d, .name = names[i], .source = sources[i], .arch_opt = arch_opt, .arch = arch};
        s = override_and_dump(ctx, j->name, &j->source, &j->owned, &j->owned_n);
        if (s == SG_OK && drv == SG__RTC_HIPRTC) {
            j->unit = with_prelude(ctx, j->source, &j->unit_n);
            if (j->unit)
                j->source = j->unit;
            else
                s = sg__fail(ctx, SG_ERR_OOM, "hiprtc: out of host memory for '%s'", j->name);
        }
        if (s != SG_OK) break;
        entry_path(d, root, arch_opt, j->source, j->path,
                   sizeof j->path); /* root <= PATH_MAX - 80 */
        if (root[0] && !sg__always_compile() && !ctx->no_cache_reads &&
            (s = sg__blob_lookup(ctx, j->path, magic, &cubins[i], &sizes[i])) != SG_OK)
            break;
        j->todo = cubins[i] == NULL;
        todo += j->todo;
    }
    /* The misses, on up to nthreads threads (this one among them); a
     * thread that cannot be started leaves its share to the others. */
    if (s == SG_OK && todo) {
        rtc_pool pool = {.jobs = jobs, .njobs = n};
        atomic_init(&pool.next, 0);
        pthread_t th[16];
        int nt = 0, want = nthreads < todo ? nthreads : todo;
        if (want > 17) want = 17;
        while (nt + 1 < want && pthread_create(&th[nt], NULL, rtc_worker, &pool) == 0) nt++;
        rtc_worker(&pool);
        for (int t = 0; t < nt; t++) pthread_join(th[t], NULL);
    }
    for (int i = 0; i < n; i++) {
        rtc_job *j = &jobs[i];
        if (s == SG_OK && j->todo) {
            s = take_image(ctx, j->s, j->err, j->img, j->n, &cubins[i], &sizes[i]);
            j->img = NULL;
            if (s == SG_OK && root[0])
                sg__blob_publish(ctx, root, j->path, magic, cubins[i], sizes[i]);
        }
        free(j->img);
        if (j->unit) sg__free(ctx, j->unit, j->unit_n);
        if (j->owned) sg__free(ctx, j->owned, j->owned_n + 1);
    }
    sg__free(ctx, jobs, sizeof *jobs * (size_t)n);
    if (s != SG_OK)
        for (int i = 0; i < n; i++) {
            if (cubins[i]) sg__free(ctx, cubins[i], sizes[i]);
            cubins[i] = NULL, sizes[i] = 0;
        }
    return s;
}

/* ------------------------------------------------------------ a unit in parts */

int sg__unit_max_parts(void) {
    const char *e = getenv("SG_NVRTC_THREADS");
    long n = e && e[0] ? atol(e) : sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > SG__MAX_PARTS ? SG__MAX_PARTS : (int)n;
}

void sg__unit_parts_free(sg_ctx *ctx, sg__unit_parts *u) {
    for (int p = 0; p < u->n; p++)
        if (u->size[p]) sg__free(ctx, u->src[p], u->size[p]);
    if (u->part) sg__free(ctx, u->part, sizeof *u->part * (size_t)(u->ngroups ? u->ngroups : 1));
    memset(u, 0, sizeof *u);
}

size_t sg__unit_part_text(void) {
    const char *e = getenv("SG_NVRTC_PART_KB");
    long kb = e && e[0] ? atol(e) : 0;
    return kb > 0 ? (size_t)kb << 10 : SG__PART_TEXT;
}

sg_status sg__unit_split(sg_ctx *ctx, const char *src, const sg__cuda_kinfo *ki, int ngroups,
                         int maxparts, sg__unit_parts *u) {
    memset(u, 0, sizeof *u);
    size_t pre = strlen(src);
    for (int k = 0; k < ngroups; k++)
        if (ki[k].name[0] && ki[k].emitted) {
            u->kernels++, u->text += ki[k].text_len;
            if (ki[k].text_at < pre) pre = ki[k].text_at;
        }
    long np = (long)(u->text / sg__unit_part_text());
    if (np > maxparts) np = maxparts;
    if (np > SG__MAX_PARTS) np = SG__MAX_PARTS;
    if (np > u->kernels) np = u->kernels;
    const char *dump = getenv("SG_DUMP_DIR"), *over = getenv("SG_OVERRIDE_DIR");
    if (np < 2 || (dump && dump[0]) || (over && over[0])) np = 1;
    u->n = (int)np, u->ngroups = ngroups;
    u->part = sg__calloc(ctx, sizeof *u->part * (size_t)(ngroups ? ngroups : 1));
    if (!u->part) {
        u->n = 0;
        return sg__fail(ctx, SG_ERR_OOM, "codegen: out of host memory for a unit's parts");
    }
    if (np == 1) {
        u->src[0] = (char *)src; /* size 0: not ours */
        return SG_OK;
    }
    size_t load[SG__MAX_PARTS] = {0};
    for (int k = 0; k < ngroups; k++) u->part[k] = -1;
    for (int placed = 0; placed < u->kernels; placed++) {
        int big = -1, light = 0;
        for (int k = 0; k < ngroups; k++)
            if (ki[k].name[0] && ki[k].emitted && u->part[k] < 0 &&
                (big < 0 || ki[k].text_len > ki[big].text_len))
                big = k;
        for (int p = 1; p < np; p++)
            if (load[p] < load[light]) light = p;
        u->part[big] = light;
        load[light] += ki[big].text_len;
    }
    for (int k = 0; k < ngroups; k++) {
        if (!ki[k].name[0]) {
            u->part[k] = 0;
        } else if (!ki[k].emitted) { /* the part of the earlier group whose kernel it runs */
            u->part[k] = 0;
            for (int j = 0; j < k; j++)
                if (ki[j].emitted && strcmp(ki[j].name, ki[k].name) == 0) {
                    u->part[k] = u->part[j];
                    break;
                }
        }
    }
    sg_status s = SG_OK;
    for (int p = 0; p < np && s == SG_OK; p++) {
        u->size[p] = pre + load[p] + 1;
        u->src[p] = sg__alloc(ctx, u->size[p]);
        if (!u->src[p]) {
            u->size[p] = 0;
            s = sg__fail(ctx, SG_ERR_OOM, "codegen: out of host memory for a unit's part");
            break;
        }
        memcpy(u->src[p], src, pre);
        size_t at = pre;
        for (int k = 0; k < ngroups; k++)
            if (ki[k].name[0] && ki[k].emitted && u->part[k] == p) {
                memcpy(u->src[p] + at, src + ki[k].text_at, ki[k].text_len);
                at += ki[k].text_len;
            }
        u->src[p][at] = '\0';
    }
    if (s != SG_OK) sg__unit_parts_free(ctx, u);
    return s;
}

sg_status sg__rtc_build(sg_ctx *ctx, sg__rtc drv, const char *name, const char *source,
                        const char *arch, void **cubin, size_t *size) {
    SG_ASSERT(ctx && cubin && size);
    return sg__rtc_build_many(ctx, drv, 1, &name, &source, arch, 1, cubin, size);
}

sg_status sg__nvrtc_build(sg_ctx *ctx, const char *name, const char *source, int arch, void **cubin,
                          size_t *size) {
    char sm[16];
    snprintf(sm, sizeof sm, "sm_%d", arch);
    return sg__rtc_build(ctx, SG__RTC_NVRTC, name, source, sm, cubin, size);
}
