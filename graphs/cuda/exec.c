/* SPDX-License-Identifier: MIT */
/*
 * exec.c -- the CUDA executor: one primary context and one non-blocking
 * stream per sg_ctx, device memory for tensors (a caching allocator: freed
 * blocks are kept by size class and reused in stream order), host transfer,
 * the kernel units (each family's CUDA source compiled by NVRTC for the
 * device's arch, cached on disk, loaded once per context), launches, and the
 * dispatch of a node to its family.
 */
#include "exec.h"

#include <stdio.h>

#ifdef SG_HAVE_CUDA_HEADERS

#include "../../codegen/codegen.h"
#include "../comm.h"
#include "../graphs.h"
#include "cuda.h"

#include <stdlib.h>

/* Freed device blocks of one size class, reused before asking the driver. */
#define NCLASS 48
typedef struct block {
    CUdeviceptr ptr;
    struct block *next;
} block;

typedef struct kfunc { /* a loaded kernel by name */
    char name[96];
    CUfunction f;
} kfunc;

typedef struct sg__cuda {
    const sg__cu_api *cu;
    CUdevice dev;
    CUcontext pctx;
    CUstream stream;
    int arch, sms;        /* arch: 90 for sm_90; 0 on HIP (no CUDA compute capability) */
    int l2;               /* L2 cache bytes (0: unknown) */
    sg__cuda_device dev0; /* what the probe read (HIP: arch_name, the gfx arch) */
    CUmodule mod[SG__CU_NUM_UNITS];
    kfunc *funcs;
    int nfuncs, cap_funcs;
    block *free_list[NCLASS];
    /* One record for each block handed out, taken when the block is: a free
     * then only moves a record, and never asks the host for memory (a free
     * that could fail would have to give the block back without a word). */
    block *spare;
    size_t nrec; /* records held: spare and cached */
    CUdeviceptr scratch;
    size_t scratch_size;
    /* Outgrown scratch buffers stay allocated: recorded graphs may hold them. */
    CUdeviceptr retired[32];
    int nretired;
    bool capturing; /* a graph is being recorded: no host waits allowed */
    /* A recording's branches (cuda_graph.c): lanes[l] for l > 0 are streams
     * of their own, made by sg__cuda_lanes_make; ops go on lane `lane`. */
    CUstream lanes[SG__CUDA_LANES];
    int lane;
    bool prio;                     /* lanes by priority (SG_CUDA_LANE_PRIORITY=0: off) */
    int prio_least, prio_greatest; /* the device's stream priorities */
    uint64_t nops, nscratch; /* stream ops and scratch requests so far (sg__cuda_counts) */
    int pdl;                 /* programmatic dependent launch: 1 on, 0 off, -1 not yet known */
    void *lt;                /* cuBLASLt's handle, workspace and plans (cublaslt.c) */
    size_t device_live, device_cached;
} sg__cuda;

static sg__cuda *state(const sg_ctx *ctx) { return ctx->exec.state; }

/* The stream ops go on now: the context's, or a recording's lane. */
static CUstream cur(const sg__cuda *s) { return s->lane ? s->lanes[s->lane] : s->stream; }

/* ------------------------------------------------------------ memory */

/* Size classes: powers of two from 256 bytes; larger than 2^47 is refused. */
static int size_class(size_t n) {
    int c = 0;
    size_t s = 256;
    while (s < n && c < NCLASS - 1) s <<= 1, c++;
    return s >= n ? c : -1;
}

static size_t class_bytes(int c) { return (size_t)256 << c; }

static sg_status cu_alloc(sg_ctx *ctx, size_t nbytes, void **data) {
    sg__cuda *s = state(ctx);
    int c = size_class(nbytes ? nbytes : 1);
    if (c < 0) return SG_ERR_OOM;
    if (s->free_list[c]) { /* its record becomes the block's spare */
        block *b = s->free_list[c];
        s->free_list[c] = b->next;
        *data = (void *)(uintptr_t)b->ptr;
        b->next = s->spare;
        s->spare = b;
        s->device_cached -= class_bytes(c);
        s->device_live += class_bytes(c);
        return SG_OK;
    }
    block *rec = sg__alloc(ctx, sizeof *rec);
    if (!rec) return SG_ERR_OOM;
    s->nrec++;
    CUdeviceptr p;
    CUresult r = s->cu->cuMemAlloc_v2(&p, class_bytes(c));
    if (r == CUDA_ERROR_OUT_OF_MEMORY) {
        /* Give the cache back to the driver and try once more. */
        for (int k = 0; k < NCLASS; k++)
            while (s->free_list[k]) {
                block *b = s->free_list[k];
                s->free_list[k] = b->next;
                s->cu->cuMemFree_v2(b->ptr);
                sg__free(ctx, b, sizeof *b);
                s->nrec--;
            }
        s->device_cached = 0;
        r = s->cu->cuMemAlloc_v2(&p, class_bytes(c));
    }
    if (r != CUDA_SUCCESS) {
        sg__free(ctx, rec, sizeof *rec);
        s->nrec--;
        return r == CUDA_ERROR_OUT_OF_MEMORY ? SG_ERR_OOM : SG_ERR_DRIVER;
    }
    rec->next = s->spare;
    s->spare = rec;
    s->device_live += class_bytes(c);
    *data = (void *)(uintptr_t)p;
    return SG_OK;
}

static void cu_free(sg_ctx *ctx, void *data, size_t nbytes) {
    sg__cuda *s = state(ctx);
    if (!data) return;
    int c = size_class(nbytes ? nbytes : 1);
    block *b = s->spare; /* there is one for every block out */
    s->device_live -= class_bytes(c);
    if (!b) { /* a block this executor did not hand out: not cached */
        s->cu->cuMemFree_v2((CUdeviceptr)(uintptr_t)data);
        return;
    }
    s->spare = b->next;
    b->ptr = (CUdeviceptr)(uintptr_t)data;
    b->next = s->free_list[c];
    s->free_list[c] = b;
    s->device_cached += class_bytes(c);
}

static size_t cu_cache_bytes(const sg_ctx *ctx) {
    const sg__cuda *s = state(ctx);
    if (!s) return 0;
    return s->nrec * sizeof(block) + sizeof(kfunc) * (size_t)s->cap_funcs +
           sg__cublaslt_host_bytes(ctx);
}

static sg_status cu_upload(sg_ctx *ctx, void *dst, const void *src, size_t n) {
    sg__cuda *s = state(ctx);
    CUresult r = s->cu->cuMemcpyHtoDAsync_v2((CUdeviceptr)(uintptr_t)dst, src, n, s->stream);
    /* The host buffer is the caller's: wait before returning. */
    if (r == CUDA_SUCCESS) r = s->cu->cuStreamSynchronize(s->stream);
    return r == CUDA_SUCCESS ? SG_OK
                             : sg__cu_fail(ctx, r, "cuMemcpyHtoDAsync", "copying to the device");
}

bool sg__cuda_capturing(const sg_ctx *ctx) { return state(ctx)->capturing; }
void sg__cuda_set_capturing(sg_ctx *ctx, bool on) { state(ctx)->capturing = on; }

sg_status sg__cuda_download(sg_ctx *ctx, void *dst, const void *src, size_t n) {
    sg__cuda *s = state(ctx);
    if (s->capturing)
        return sg__fail(ctx, SG_ERR_UNSUPPORTED,
                        "cuda: a host read (%zu bytes) while a graph is "
                        "recorded; ops inside graphs must not wait for the device",
                        n);
    CUresult r = s->cu->cuMemcpyDtoHAsync_v2(dst, (CUdeviceptr)(uintptr_t)src, n, s->stream);
    if (r == CUDA_SUCCESS) r = s->cu->cuStreamSynchronize(s->stream);
    return r == CUDA_SUCCESS ? SG_OK
                             : sg__cu_fail(ctx, r, "cuMemcpyDtoHAsync", "copying to the host");
}

sg_status sg__cuda_memset(sg_ctx *ctx, void *dptr, unsigned char byte, size_t n) {
    sg__cuda *s = state(ctx);
    s->nops++;
    CUresult r = s->cu->cuMemsetD8Async((CUdeviceptr)(uintptr_t)dptr, byte, n, cur(s));
    return r == CUDA_SUCCESS ? SG_OK : sg__cu_fail(ctx, r, "cuMemsetD8Async", "filling memory");
}

static sg_status cu_copy(sg_ctx *ctx, void *dst, const void *src, size_t n) {
    sg__cuda *s = state(ctx);
    s->nops++;
    CUresult r = s->cu->cuMemcpyDtoDAsync_v2((CUdeviceptr)(uintptr_t)dst,
                                             (CUdeviceptr)(uintptr_t)src, n, cur(s));
    return r == CUDA_SUCCESS ? SG_OK
                             : sg__cu_fail(ctx, r, "cuMemcpyDtoDAsync", "copying on the device");
}

sg_status sg__cuda_scratch(sg_ctx *ctx, size_t bytes, void **dptr) {
    sg__cuda *s = state(ctx);
    s->nscratch++;
    if (bytes > s->scratch_size) {
        /* Work queued on the stream may still read the old buffer. */
        if (s->capturing)
            return sg__fail(ctx, SG_ERR_UNSUPPORTED,
                            "cuda: op scratch cannot grow while a graph is "
                            "recorded (%zu bytes wanted, %zu held)",
                            bytes, s->scratch_size);
        CUresult r = CUDA_SUCCESS;
        if (s->scratch && s->nretired < 32) {
            s->retired[s->nretired++] = s->scratch;
        } else if (s->scratch) { /* out of records: wait, then free the oldest use */
            r = s->cu->cuStreamSynchronize(s->stream);
            if (r != CUDA_SUCCESS)
                return sg__cu_fail(ctx, r, "cuStreamSynchronize", "growing scratch");
            s->cu->cuMemFree_v2(s->scratch);
        }
        s->scratch = 0;
        s->scratch_size = 0;
        size_t want = bytes < (1u << 20) ? (1u << 20) : bytes;
        r = s->cu->cuMemAlloc_v2(&s->scratch, want);
        if (r != CUDA_SUCCESS) return sg__cu_fail(ctx, r, "cuMemAlloc", "op scratch memory");
        s->scratch_size = want;
    }
    *dptr = (void *)(uintptr_t)s->scratch;
    return SG_OK;
}

bool sg__cuda_scratch_fits(const sg_ctx *ctx, size_t bytes) {
    const sg__cuda *s = state(ctx);
    return !s->capturing || bytes <= s->scratch_size;
}

sg_status sg__cuda_sync(sg_ctx *ctx) {
    sg__cuda *s = state(ctx);
    CUresult r = s->cu->cuStreamSynchronize(s->stream);
    return r == CUDA_SUCCESS ? SG_OK
                             : sg__cu_fail(ctx, r, "cuStreamSynchronize", "waiting for the device");
}

int sg__cuda_sm_count(const sg_ctx *ctx) { return state(ctx)->sms; }
size_t sg__cuda_l2_bytes(const sg_ctx *ctx) { return (size_t)state(ctx)->l2; }
int sg__cuda_arch(const sg_ctx *ctx) { return state(ctx)->arch; }
void *sg__cuda_stream(const sg_ctx *ctx) { return cur(state(ctx)); }

bool sg__cuda_lane_priority(const sg_ctx *ctx) { return state(ctx)->prio; }

sg_status sg__cuda_lanes_make(sg_ctx *ctx, int n) {
    sg__cuda *s = state(ctx);
    for (int l = 1; l < n && l < SG__CUDA_LANES; l++) {
        if (s->lanes[l]) continue;
        CUresult r = s->prio ? s->cu->cuStreamCreateWithPriority(
                                   &s->lanes[l], CU_STREAM_NON_BLOCKING,
                                   l < SG__CUDA_LANES_HIGH ? s->prio_greatest : s->prio_least)
                             : s->cu->cuStreamCreate(&s->lanes[l], CU_STREAM_NON_BLOCKING);
        if (r != CUDA_SUCCESS) {
            s->lanes[l] = NULL;
            return sg__cu_fail(ctx, r, s->prio ? "cuStreamCreateWithPriority" : "cuStreamCreate",
                               "a stream for a graph's branches");
        }
    }
    return SG_OK;
}

void *sg__cuda_lane_stream(const sg_ctx *ctx, int lane) {
    const sg__cuda *s = state(ctx);
    return lane ? s->lanes[lane] : s->stream;
}

void sg__cuda_set_lane(sg_ctx *ctx, int lane) { state(ctx)->lane = lane; }
int sg__cuda_lane(const sg_ctx *ctx) { return state(ctx)->lane; }

void sg__cuda_counts(const sg_ctx *ctx, uint64_t *ops, uint64_t *scratch) {
    *ops = state(ctx)->nops;
    *scratch = state(ctx)->nscratch;
}
void **sg__cuda_lt_state(sg_ctx *ctx) { return &state(ctx)->lt; }
void *sg__cuda_context(const sg_ctx *ctx) { return state(ctx)->pctx; }
const sg__cu_api *sg__cuda_api(const sg_ctx *ctx) { return state(ctx)->cu; }
bool sg__cuda_is_hip(const sg_ctx *ctx) { return state(ctx)->dev0.hip; }
const sg__cuda_device *sg__cuda_device_of(const sg_ctx *ctx) { return &state(ctx)->dev0; }

sg_status sg__cuda_rtc_build_many(sg_ctx *ctx, int n, const char *const *names,
                                  const char *const *sources, int nthreads, void **images,
                                  size_t *sizes) {
    sg__cuda *s = state(ctx);
    if (s->dev0.hip) /* not known to be safe on threads with ROCm 5's code-object manager */
        return sg__rtc_build_many(ctx, SG__RTC_HIPRTC, n, names, sources, s->dev0.arch_name, 1,
                                  images, sizes);
    char sm[16];
    snprintf(sm, sizeof sm, "sm_%d", s->arch);
    return sg__rtc_build_many(ctx, SG__RTC_NVRTC, n, names, sources, sm, nthreads, images, sizes);
}

sg_status sg__cuda_rtc_build(sg_ctx *ctx, const char *name, const char *source, void **image,
                             size_t *size) {
    return sg__cuda_rtc_build_many(ctx, 1, &name, &source, 1, image, size);
}

/* ------------------------------------------------------------ kernels */

/* The build's image of unit for this GPU's arch, loaded (true), or false:
 * none (HIP, another arch, a build without NVRTC, SG_ALWAYS_COMPILE or
 * SG_OVERRIDE_DIR set) or the driver refused it (said under fallbacks),
 * and NVRTC compiles the family. */
static bool load_image(sg_ctx *ctx, sg__cu_unit unit) {
    sg__cuda *s = state(ctx);
    const char *over = getenv("SG_OVERRIDE_DIR");
    if (s->dev0.hip || sg__always_compile() || (over && over[0])) return false;
    for (int i = 0; i < sg__cu_nimages; i++) {
        const sg__cu_image *im = &sg__cu_images[i];
        if (im->unit != unit || im->arch != s->arch) continue;
        CUresult r = s->cu->cuModuleLoadData(&s->mod[unit], im->data);
        if (r == CUDA_SUCCESS) return true;
        s->mod[unit] = NULL;
        const char *msg = NULL;
        if (s->cu->cuGetErrorString) s->cu->cuGetErrorString(r, &msg);
        sg__log(ctx, "fallbacks",
                "cuda: the library's prebuilt %s for sm_%d did not load (%s); compiling it "
                "with NVRTC",
                sg__cu_names[unit], s->arch, msg ? msg : "unknown error");
        return false;
    }
    return false;
}

static sg_status load_unit(sg_ctx *ctx, sg__cu_unit unit) {
    sg__cuda *s = state(ctx);
    if (s->mod[unit]) return SG_OK;
    if (!sg__cu_sources[unit])
        return sg__fail(ctx, SG_ERR_UNSUPPORTED,
                        "cuda: the kernel unit %d is not built into this "
                        "library",
                        (int)unit);
    double t0 = sg__graph_clock();
    if (load_image(ctx, unit)) {
        sg__log(ctx, "perf_hints", "cuda: kernel family %s loaded (prebuilt) in %.1f ms",
                sg__cu_names[unit], (sg__graph_clock() - t0) * 1e3);
        return SG_OK;
    }
    void *cubin = NULL;
    size_t size = 0;
    sg_status st = sg__cuda_rtc_build(ctx, sg__cu_names[unit], sg__cu_sources[unit], &cubin, &size);
    if (st != SG_OK) return st;
    CUresult r = s->cu->cuModuleLoadData(&s->mod[unit], cubin);
    sg__free(ctx, cubin, size);
    if (r != CUDA_SUCCESS) {
        s->mod[unit] = NULL;
        return sg__cu_fail(ctx, r, "cuModuleLoadData", sg__cu_names[unit]);
    }
    sg__log(ctx, "perf_hints",
            "cuda: kernel family %s built (NVRTC or the disk cache) and loaded in %.1f ms",
            sg__cu_names[unit], (sg__graph_clock() - t0) * 1e3);
    return SG_OK;
}

sg_status sg__cuda_kernel(sg_ctx *ctx, sg__cu_unit unit, const char *name, void **func) {
    sg__cuda *s = state(ctx);
    for (int i = 0; i < s->nfuncs; i++) /* few dozen names: a scan is enough */
        if (strcmp(s->funcs[i].name, name) == 0) {
            *func = s->funcs[i].f;
            return SG_OK;
        }
    sg_status st = load_unit(ctx, unit);
    if (st != SG_OK) return st;
    CUfunction f;
    CUresult r = s->cu->cuModuleGetFunction(&f, s->mod[unit], name);
    if (r != CUDA_SUCCESS) return sg__cu_fail(ctx, r, "cuModuleGetFunction", name);
    if (s->nfuncs == s->cap_funcs) {
        int ncap = s->cap_funcs ? s->cap_funcs * 2 : 64;
        kfunc *nf = sg__alloc(ctx, sizeof *nf * (size_t)ncap);
        if (!nf) return sg__fail(ctx, SG_ERR_OOM, "cuda: out of host memory");
        if (s->funcs) {
            memcpy(nf, s->funcs, sizeof *nf * (size_t)s->nfuncs);
            sg__free(ctx, s->funcs, sizeof *nf * (size_t)s->cap_funcs);
        }
        s->funcs = nf;
        s->cap_funcs = ncap;
    }
    snprintf(s->funcs[s->nfuncs].name, sizeof s->funcs[s->nfuncs].name, "%s", name);
    s->funcs[s->nfuncs++].f = f;
    *func = f;
    return SG_OK;
}

/* A launch with no attributes. */
static sg_status launch_plain(sg_ctx *ctx, void *func, const unsigned grid[3],
                              const unsigned block[3], size_t shmem, void **args) {
    sg__cuda *s = state(ctx);
    s->nops++;
    CUresult r = s->cu->cuLaunchKernel((CUfunction)func, grid[0], grid[1], grid[2], block[0],
                                       block[1], block[2], (unsigned)shmem, cur(s), args, NULL);
    return r == CUDA_SUCCESS ? SG_OK : sg__cu_fail(ctx, r, "cuLaunchKernel", "a kernel");
}

sg_status sg__cuda_launch(sg_ctx *ctx, void *func, const unsigned grid[3], const unsigned block[3],
                          size_t shmem, void **args) {
    sg__cuda *s = state(ctx);
    if (grid[0] == 0 || grid[1] == 0 || grid[2] == 0) return SG_OK; /* nothing to do */
    if (s->pdl < 0) {
        const char *e = getenv("SG_CUDA_PDL");
        s->pdl = s->arch >= 90 && !(e && strcmp(e, "0") == 0);
    }
    if (!s->pdl) return launch_plain(ctx, func, grid, block, shmem, args);
    CUlaunchAttribute attr;
    memset(&attr, 0, sizeof attr);
    attr.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmaticStreamSerializationAllowed = 1;
    CUlaunchConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDimX = grid[0], cfg.gridDimY = grid[1], cfg.gridDimZ = grid[2];
    cfg.blockDimX = block[0], cfg.blockDimY = block[1], cfg.blockDimZ = block[2];
    cfg.sharedMemBytes = (unsigned)shmem;
    cfg.hStream = cur(s);
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    s->nops++;
    CUresult r = s->cu->cuLaunchKernelEx(&cfg, (CUfunction)func, args, NULL);
    if (r == CUDA_ERROR_NOT_SUPPORTED || r == CUDA_ERROR_INVALID_VALUE) {
        /* The attribute, or the launch itself? A plain launch tells: if it
         * goes, this device or driver cannot, and launches are plain from
         * now on (said once); if not, its error is the launch's. */
        s->nops--;
        sg_status ps = launch_plain(ctx, func, grid, block, shmem, args);
        if (ps == SG_OK) {
            s->pdl = 0;
            sg__log(ctx, "fallbacks",
                    "cuda: cuLaunchKernelEx refused programmatic dependent launch (%d); kernels "
                    "launch plainly from now on",
                    (int)r);
        }
        return ps;
    }
    return r == CUDA_SUCCESS ? SG_OK : sg__cu_fail(ctx, r, "cuLaunchKernelEx", "a kernel");
}

/* ------------------------------------------------------------ the executor */

static sg_status cu_run(sg_ctx *ctx, const sg__node *n) {
    switch (sg__op_family(n->op)) {
    case SG__FAM_POINTWISE: return sg__cuda_pointwise(ctx, n);
    case SG__FAM_REDUCE: return sg__cuda_reduce(ctx, n);
    case SG__FAM_ROW: return sg__cuda_row(ctx, n);
    case SG__FAM_MATMUL: return sg__cuda_matmul(ctx, n);
    case SG__FAM_DATA: return sg__cuda_data(ctx, n);
    case SG__FAM_ATTN:
        return n->op == SG__OP_ATTENTION_BWD ? sg__cuda_attn_bwd(ctx, n) : sg__cuda_attn(ctx, n);
    case SG__FAM_COMM: return sg__comm_run(ctx, n);
    }
    return sg__fail(ctx, SG_ERR_INTERNAL, "cuda: op %s has no kernel family", sg__op_name(n->op));
}

static void cu_destroy(sg_ctx *ctx) {
    sg__cuda *s = state(ctx);
    if (!s) return;
    const sg__cu_api *cu = s->cu;
    if (s->stream) cu->cuStreamSynchronize(s->stream);
    sg__cublaslt_release(ctx);
    for (int k = 0; k < NCLASS; k++)
        while (s->free_list[k]) {
            block *b = s->free_list[k];
            s->free_list[k] = b->next;
            cu->cuMemFree_v2(b->ptr);
            sg__free(ctx, b, sizeof *b);
        }
    /* Blocks still out at the end are the driver's to reclaim with the
     * context; their records go here. */
    while (s->spare) {
        block *b = s->spare;
        s->spare = b->next;
        sg__free(ctx, b, sizeof *b);
    }
    if (s->scratch) cu->cuMemFree_v2(s->scratch);
    for (int k = 0; k < s->nretired; k++) cu->cuMemFree_v2(s->retired[k]);
    for (int u = 0; u < SG__CU_NUM_UNITS; u++)
        if (s->mod[u]) cu->cuModuleUnload(s->mod[u]);
    sg__free(ctx, s->funcs, sizeof *s->funcs * (size_t)(s->cap_funcs ? s->cap_funcs : 1));
    for (int l = 1; l < SG__CUDA_LANES; l++)
        if (s->lanes[l]) cu->cuStreamDestroy_v2(s->lanes[l]);
    if (s->stream) cu->cuStreamDestroy_v2(s->stream);
    if (s->pctx) cu->cuDevicePrimaryCtxRelease_v2(s->dev);
    sg__free(ctx, s, sizeof *s);
    ctx->exec.state = NULL;
}

sg_status sg__cuda_init(sg_ctx *ctx, char *why, size_t n) {
    /* One executor, two driver tables: HIP's for a context made for it. */
    bool hip = ctx->backend == SG_BACKEND_HIP;
    sg__cuda_device dev;
    sg_status st = hip ? sg__hip_probe(why, n, &dev) : sg__cuda_probe(why, n, &dev);
    if (st != SG_OK) return st;
    const sg__cu_api *cu;
    st = hip ? sg__hip_load(why, n, &cu) : sg__cuda_load(why, n, &cu);
    if (st != SG_OK) return st;
    sg__cuda *s = sg__calloc(ctx, sizeof *s);
    if (!s) {
        snprintf(why, n, "out of host memory for the %s state", hip ? "HIP" : "CUDA");
        return SG_ERR_OOM;
    }
    s->cu = cu;
    s->pdl = -1;
    s->dev0 = dev;
    s->arch = hip ? 0 : dev.cc_major * 10 + dev.cc_minor;
    s->sms = dev.sms;
    ctx->exec.state = s;
    ctx->exec.destroy = cu_destroy;
    CUresult r = cu->cuDeviceGet(&s->dev, 0);
    if (r == CUDA_SUCCESS &&
        cu->cuDeviceGetAttribute(&s->l2, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, s->dev) != CUDA_SUCCESS)
        s->l2 = 0;
    if (r == CUDA_SUCCESS) r = cu->cuDevicePrimaryCtxRetain(&s->pctx, s->dev);
    if (r == CUDA_SUCCESS) r = cu->cuCtxSetCurrent(s->pctx);
    const char *pe = getenv("SG_CUDA_LANE_PRIORITY");
    s->prio = !hip && !(pe && atoi(pe) == 0) && cu->cuCtxGetStreamPriorityRange &&
              cu->cuStreamCreateWithPriority;
    if (r == CUDA_SUCCESS && s->prio &&
        cu->cuCtxGetStreamPriorityRange(&s->prio_least, &s->prio_greatest) != CUDA_SUCCESS)
        s->prio = false;
    if (r == CUDA_SUCCESS)
        r = s->prio ? cu->cuStreamCreateWithPriority(&s->stream, CU_STREAM_NON_BLOCKING,
                                                     s->prio_greatest)
                    : cu->cuStreamCreate(&s->stream, CU_STREAM_NON_BLOCKING);
    if (r != CUDA_SUCCESS) {
        char e[256];
        snprintf(why, n, "%s context setup failed: %s", hip ? "HIP" : "CUDA",
                 sg__cu_strerror_in(cu, r, e, sizeof e));
        cu_destroy(ctx);
        return SG_ERR_BACKEND_UNAVAILABLE;
    }
    /* Op scratch exists from the start: it cannot be allocated while a
     * graph is recorded, which may be the first time an op asks for it. */
    void *scratch;
    if (sg__cuda_scratch(ctx, 1u << 20, &scratch) != SG_OK) {
        snprintf(why, n, "cannot allocate 1 MiB of device scratch: %s", ctx->msg);
        cu_destroy(ctx);
        return SG_ERR_BACKEND_UNAVAILABLE;
    }
    ctx->exec.name = "device";
    ctx->exec.run = cu_run;
    ctx->exec.alloc = cu_alloc;
    ctx->exec.free = cu_free;
    ctx->exec.cache_bytes = cu_cache_bytes;
    ctx->exec.upload = cu_upload;
    ctx->exec.download = sg__cuda_download;
    ctx->exec.copy = cu_copy;
    ctx->exec.sync = sg__cuda_sync;
    /* cuBLASLt's load (60-100 ms) starts now, on a thread: what a user does
     * before the first product (weights read and uploaded, a compile) hides it. */
    if (!hip) sg__cublaslt_prewarm(ctx, false);
    return SG_OK;
}

#else /* no CUDA headers at build time */

sg_status sg__cuda_init(sg_ctx *ctx, char *why, size_t n) {
    (void)ctx;
    snprintf(why, n,
             "this stepgraph was built without the CUDA headers (STEPGRAPH_CUDA=OFF or no "
             "toolkit at build time); rebuild with the CUDA toolkit installed");
    return SG_ERR_BACKEND_UNAVAILABLE;
}

#endif
