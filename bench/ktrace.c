/* SPDX-License-Identifier: MIT */
/*
 * ktrace.c -- a timeline of every kernel, copy and memset a CUDA program
 * runs, graph replays included (each node is its own record), for finding
 * where a replay loses time between and around its kernels: ncu times each
 * kernel alone, so its sum says nothing of the gaps, the overlap of the
 * recording's streams, or a kernel slowed by a neighbour.
 *
 * A CUPTI injection library: the driver loads it into any CUDA program
 * named by CUDA_INJECTION64_PATH, with no change to the program. It keeps
 * the last SG_KTRACE_MAX records (default 20000) and writes them at exit to
 * SG_KTRACE_OUT (default ktrace.csv): start_ns,end_ns,stream,graph,node,
 * kind,name. bench/ktrace.py reads it. Build (CUPTI from the toolkit, or
 * from the nvidia-cuda-cupti wheel):
 *   gcc -O2 -shared -fPIC -I$CUPTI/include bench/ktrace.c \
 *       -L$CUPTI/lib64 -lcupti -Wl,-rpath,$CUPTI/lib64 -o ktrace.so
 *   CUDA_INJECTION64_PATH=$PWD/ktrace.so SG_KTRACE_OUT=w6.csv PROGRAM
 * Not part of the library or its build: CUPTI is a profiler's dependency.
 */
#include <cupti.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if CUPTI_API_VERSION >= 130200
typedef CUpti_ActivityKernel11 kernel_rec;
#elif CUPTI_API_VERSION >= 130000
typedef CUpti_ActivityKernel10 kernel_rec;
#else
typedef CUpti_ActivityKernel9 kernel_rec;
#endif

typedef struct {
    uint64_t start, end;
    uint32_t stream, graph, node;
    char kind;
    char name[96];
} rec;

static rec *ring;
static size_t cap, total;

static void keep(uint64_t s, uint64_t e, uint32_t stream, uint32_t graph, uint32_t node, char kind,
                 const char *name) {
    rec *r = &ring[total++ % cap];
    r->start = s;
    r->end = e;
    r->stream = stream;
    r->graph = graph;
    r->node = node;
    r->kind = kind;
    snprintf(r->name, sizeof r->name, "%s", name ? name : "?");
}

static void CUPTIAPI buf_want(uint8_t **buf, size_t *size, size_t *max) {
    *size = (size_t)8 << 20;
    *buf = aligned_alloc(8, *size);
    *max = 0;
}

static void CUPTIAPI buf_done(CUcontext c, uint32_t sid, uint8_t *buf, size_t size, size_t valid) {
    (void)c, (void)sid, (void)size;
    CUpti_Activity *a = NULL;
    while (cuptiActivityGetNextRecord(buf, valid, &a) == CUPTI_SUCCESS) {
        if (a->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL ||
            a->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
            const kernel_rec *k = (const kernel_rec *)a;
            keep(k->start, k->end, k->streamId, k->graphId, (uint32_t)k->graphNodeId, 'K', k->name);
        } else if (a->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
            const CUpti_ActivityMemcpy6 *m = (const CUpti_ActivityMemcpy6 *)a;
            char what[32];
            snprintf(what, sizeof what, "memcpy %llu B", (unsigned long long)m->bytes);
            keep(m->start, m->end, m->streamId, m->graphId, (uint32_t)m->graphNodeId, 'C', what);
        } else if (a->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
            const CUpti_ActivityMemset4 *m = (const CUpti_ActivityMemset4 *)a;
            char what[32];
            snprintf(what, sizeof what, "memset %llu B", (unsigned long long)m->bytes);
            keep(m->start, m->end, m->streamId, m->graphId, (uint32_t)m->graphNodeId, 'S', what);
        }
    }
    free(buf);
}

static void finish(void) {
    cuptiActivityFlushAll(1);
    const char *path = getenv("SG_KTRACE_OUT");
    FILE *f = fopen(path && *path ? path : "ktrace.csv", "w");
    if (!f) return;
    fprintf(f, "start_ns,end_ns,stream,graph,node,kind,name\n");
    size_t n = total < cap ? total : cap;
    for (size_t i = total - n; i < total; i++) {
        const rec *r = &ring[i % cap];
        fprintf(f, "%llu,%llu,%u,%u,%u,%c,\"%s\"\n", (unsigned long long)r->start,
                (unsigned long long)r->end, r->stream, r->graph, r->node, r->kind, r->name);
    }
    fclose(f);
    fprintf(stderr, "ktrace: %zu of %zu records written\n", n, total);
}

int InitializeInjection(void) {
    const char *m = getenv("SG_KTRACE_MAX");
    cap = m && *m ? strtoull(m, NULL, 10) : 20000;
    if (!cap) cap = 20000;
    ring = calloc(cap, sizeof *ring);
    if (!ring) return 0;
    if (cuptiActivityRegisterCallbacks(buf_want, buf_done) != CUPTI_SUCCESS) return 0;
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY);
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET);
    atexit(finish);
    return 1;
}
