/* SPDX-License-Identifier: MIT */
/*
 * graphs.h -- the internal header of compiled fns: a fn's captures (IR,
 * guard key, memory plan, the executable form of the plan), its output sets
 * and the ring of output handles it returns. fn.c owns calls, guards,
 * stances and fallbacks; outputs.c the output sets and handles; graph.c turns
 * an IR into an executable plan over the pool and replays it; explain.c
 * prints it all; inspect.c shows it otherwise (the generated source under
 * "output_code", DOT, trace JSON, the backend list, a custom backend's view).
 */
#ifndef SG_GRAPHS_H
#define SG_GRAPHS_H

#include "../codegen/codegen.h"
#include "../memory/memory.h"
#include "backend.h"

/* The guard key of one input. */
typedef struct sg__argkey {
    sg_dtype dtype;
    int ndim;
    int64_t shape[SG_MAX_DIMS], stride[SG_MAX_DIMS];
    int alias;         /* the first earlier input sharing storage, or -1 */
    int64_t alias_off; /* this input's offset minus that input's, in elements */
    bool grad;         /* it requires grad (a gradient node) */
} sg__argkey;

/* One output set of a capture: pool bytes for the output slots. */
typedef struct sg__outbuf {
    int block;          /* pool block, -1 when the capture has no pool outputs */
    sg__storage **st;   /* per slot (NULL for slots that are no output) */
} sg__outbuf;

typedef struct sg__graph { /* struct tag used by backend.h */
    sg__ir ir;
    sg__argkey *key; /* nin */
    bool grad_off;   /* captured under sg_set_grad_enabled(ctx, false) (a guard too) */
    bool eager;      /* cannot replay (graph break, failed plan): runs eagerly */
    char why[SG__MSG_SIZE];

    /* The plan. */
    size_t *slot_off;  /* per slot: offset in scratch or in an output set */
    size_t scratch;    /* bytes of scratch this plan needs */
    size_t out_bytes;  /* bytes of one output set */
    size_t peak, unshared;
    int reuse_gap; /* groups after its last use before a buffer's bytes go to
                      another (the backend's compile sets it; 0: at once) */
    /* Constant folding (sg__fused.consts): the slots the folded groups
     * write, in a pool block of their own, computed once by the build. */
    bool *slot_const;   /* per slot; NULL when nothing was folded */
    size_t const_bytes; /* bytes of that block (0: none) */
    int const_block;    /* its pool block */
    int nfolded;        /* values folded (IR nodes) */

    /* The executable form. */
    sg__storage *slot_st;   /* per slot (params point at their own storage) */
    sg__storage **slot_ptr; /* what each slot's refs use */
    sg_tensor *ref_t;       /* per ref */
    sg_tensor **args;       /* per ir arg */
    sg__node *nodes;        /* per ir node */
    sg__outbuf *outbufs;
    int noutbufs;
    int pool_gen;
    uint64_t replays;

    /* Fused and compiled (when the mode compiles and the compile worked). */
    sg_ctx *ctx;
    sg__fused fused;
    bool has_fused;
    bool compiled;    /* the backend compiled it: replays run its code */
    void *dev;        /* the backend's state for it (device graphs, modules) */
    sg__module *mod;
    sg__step_entry step_fn;
    sg__kernel_entry kernel_fn;
    char **slotp;     /* per slot: the base address generated code sees */
    bool one_by_one;  /* DEFAULT / MAX_AUTOTUNE_NO_GRAPHS: kernel at a time */
    bool tune;        /* MAX_AUTOTUNE*: pick the thread count at the first replay */
    int threads;      /* the thread count replays use (0: OpenMP's default) */
    char module[96];  /* the generated unit's name */
    sg_step_fn custom; /* what sg_compile_opts.backend_fn asked to run instead */
    bool op_by_op;     /* aot_eager: fused groups of one op each, run by the eager kernels */
} sg__graph;

/* One output set of a fn: the handles its last call there returned. */
typedef struct sg__outset {
    sg_tensor **cur;     /* nout; NULL before first use */
    bool *produced;      /* nout: the handle's storage was made by the fn */
    sg__storage **st;    /* nout: the produced storages, one ref each held by the set */
    int *base;           /* nout: their refs when published, before any handle or view */
    uint32_t used_step;  /* the step of the last call that used this set */
    uint64_t call;       /* the fn call that filled it (1-based) */
    bool used;
    sg__storage stale;   /* what invalidated handles point at */
} sg__outset;

#define SG__MAX_OUTPUT_SETS 64

enum { SG__BACKEND_INDUCTOR = 0, SG__BACKEND_EAGER, SG__BACKEND_AOT_EAGER };

/* A custom backend's view of a capture (inspect.c). */
struct sg_graph_view {
    const sg_fn *fn;
    const sg__graph *g;
};

#define SG__FN_LIVE 0x5347464eu /* "SGFN" */
#define SG__FN_DEAD 0xdeadf00du

struct sg_fn {
    uint32_t magic;
    sg_ctx *ctx;
    sg_step_fn step;
    void *user;
    int nin, nout;
    sg_compile_opts opts;
    char name[64];
    int backend_kind; /* SG__BACKEND_INDUCTOR, _EAGER, _AOT_EAGER (opts.backend_name) */

    sg__graph **graphs;
    int ngraphs;

    sg__outset *sets; /* opts.output_sets of them, made at sg_compile */
    int nsets;
    int cursor;       /* the next set of the plain (one call, one step) rule */
    sg_stance stance;
    sg_fn_stats stats;

    /* Output handles: a FIFO of free ones; handles in use are in sets. */
    sg_tensor **handles; /* every handle the fn made */
    int nhandles, cap_handles;
    sg_tensor **fifo;
    int fifo_head, fifo_len, fifo_cap;

    bool said_limit, said_dynamic, said_recycle, said_fallback;
    char limit_why[256]; /* the last miss past cache_size_limit that was said */
    char *explain;
    size_t explain_size;
    struct sg__trace *trace; /* sg_fn_trace in progress: replays time each kernel */
    sg_fn *next; /* the context's list */
    sg__reg reg; /* the registry's entry (capture/registry.c); last: fn_bury keeps it */
};

/* graph.c */
SG__HIDDEN sg_status sg__graph_build(sg_fn *fn, sg__graph *g);
SG__HIDDEN sg_status sg__graph_outbuf(sg_fn *fn, sg__graph *g, int set);
SG__HIDDEN void sg__graph_repoint(sg_ctx *ctx, sg__graph *g);
SG__HIDDEN sg_status sg__graph_replay(sg_fn *fn, sg__graph *g, sg_tensor *const *in, int set);
SG__HIDDEN void sg__graph_free(sg_ctx *ctx, sg__graph *g);
/* Before g is dropped by a guard that fails for good (a parameter released,
 * or one that started or stopped requiring grad): its output storages that
 * an output set still holds move out of the pool into memory of their own
 * (a copy), so that the outputs of the calls before stay valid, as they do
 * when a capture simply misses. A storage that cannot move (out of memory)
 * stays and goes stale with g. sg_fn_reset and sg_fn_destroy don't keep. */
SG__HIDDEN void sg__graph_keep_outputs(sg_ctx *ctx, sg__graph *g);
/* Seconds on the monotonic clock (for the compile phases' perf_hints). */
SG__HIDDEN double sg__graph_clock(void);

/* lanes.c: a replay's groups on several streams, each waiting only for the
 * groups whose memory it shares (see the file's comment). */
#define SG__LANES_MAX 4
typedef struct sg__span {
    uintptr_t lo, hi; /* bytes [lo, hi) */
} sg__span;
/* Ranges below this are never device memory: what only one group at a
 * time may use (a library's scratch, a kernel's static counters) is the
 * write of the range [r, r + 1) for a number r of the caller's below it. */
#define SG__LANE_RESOURCES ((uintptr_t)1 << 16)
typedef struct sg__lane_use {
    const sg__span *rd, *wr; /* what the group reads and writes, in any order */
    int nrd, nwr;
    bool lane0; /* it must run on lane 0 */
} sg__lane_use;
typedef struct sg__lanes {
    int ngroups, nlanes; /* nlanes: how many the plan uses */
    int nhigh;           /* with classes: lanes [0, nhigh) take urgent groups, the rest the
                            others (0: no classes) */
    int *lane;           /* per group */
    int *wait;           /* per group, SG__LANES_MAX entries: per other lane, the group whose
                            end it waits for first (-1: none) */
    bool *post;          /* per group: a group on another lane waits for its end */
} sg__lanes;
SG__HIDDEN sg_status sg__lanes_plan(sg_ctx *ctx, int n, const sg__lane_use *use, int nlanes,
                                    int nhigh, sg__lanes *out);
SG__HIDDEN void sg__lanes_free(sg_ctx *ctx, sg__lanes *p);

/* outputs.c */
SG__HIDDEN sg_status sg__outputs_init(sg_fn *fn);
SG__HIDDEN void sg__outputs_free(sg_fn *fn);
/* The set a call writes (it holds none of the call's inputs); what it held
 * becomes stale. */
SG__HIDDEN sg_status sg__outputs_pick(sg_fn *fn, sg_tensor *const *in, int *set);
/* Whether some set can take this call's outputs (one that holds no input),
 * asked before a step runs eagerly so that a call refused for it changes
 * nothing; the same failure as sg__outputs_pick's. */
SG__HIDDEN sg_status sg__outputs_check(sg_fn *fn, sg_tensor *const *in);
/* Hand out output i of set si: geometry of geom over st at offset;
 * produced: st was made by this call (it becomes stale when the set is reused). */
SG__HIDDEN sg_status sg__outputs_put(sg_fn *fn, int si, int i, const sg__ref *geom,
                                     sg__storage *st, int64_t offset, bool produced);
/* After every sg__outputs_put of a call: out gets the set's handles. */
SG__HIDDEN void sg__outputs_publish(sg_fn *fn, int si, sg_tensor **out);

/* fn.c */
/* A fallback of fn (see "Fallbacks" in stepgraph.h): with strict, fails
 * with status s and the reason; else logs it (the fn's first one visibly
 * even without SG_LOGS) and returns SG_OK. */
/* Whether fn is a live fn (SG_OK), else its status with the reason said
 * (destroyed, its context destroyed, not a fn); what names the call. */
SG__HIDDEN sg_status sg__fn_check(const sg_fn *fn, const char *what);
SG__HIDDEN sg_status sg__fn_fallback(sg_fn *fn, sg_status s, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
SG__HIDDEN void sg__fns_repoint(sg_ctx *ctx);
SG__HIDDEN void sg__fns_destroy_all(sg_ctx *ctx);
/* SG_NVRTC_CHECK=1 (tests on a machine without a GPU): every capture the
 * CPU compiles is also fused for CUDA, emitted in the CUDA dialect and
 * compiled by NVRTC for sm_90; the failures so far in this process (each
 * logged under "error"). */
SG__HIDDEN uint64_t sg__cuda_check_failures(void);
/* SG_OPENCL_CHECK=1 does the same in the OpenCL C dialect, each unit built
 * on the first OpenCL CPU device (PoCL). Per dialect, the counts so far:
 * units built, units that failed (each logged under "error"), groups the
 * dialect has no kernel for (their units counted as failed too), and
 * captures not checked for want of a compiler (said once under
 * "fallbacks"). */
typedef enum sg__check_what {
    SG__CHECK_BUILT,
    SG__CHECK_FAILED,
    SG__CHECK_UNSUPPORTED,
    SG__CHECK_UNAVAILABLE,
    SG__CHECK_NCOUNTS
} sg__check_what;
SG__HIDDEN uint64_t sg__dialect_check_count(sg__dialect d, sg__check_what w);

/* SG_HIPRTC_CHECK=1: the same through hiprtc for gfx90a (the unit after
 * the HIP prelude), its failures counted with NVRTC's above; true once a
 * check found hiprtc absent (nothing was compiled then). */
SG__HIDDEN bool sg__hiprtc_check_skipped(void);

/* inspect.c */
/* Log a capture's generated source under "output_code", one call per line. */
SG__HIDDEN void sg__graph_log_source(sg_fn *fn, const sg__graph *g, const char *source);
/* The name of kernel k of g (see "Kernel names" in stepgraph.h). */
SG__HIDDEN const char *sg__graph_kernel_name(const sg__graph *g, int k, char *buf, size_t size);
/* The number of kernels a replay of g runs (fused groups, else IR ops). */
SG__HIDDEN int sg__graph_nkernels(const sg__graph *g);
/* The IR node a capture that is not compiled runs as its kernel k. */
SG__HIDDEN int sg__graph_kernel_node(const sg__graph *g, int k);
/* A replay of g under sg_fn_trace: runs it kernel by kernel, timing each. */
SG__HIDDEN sg_status sg__trace_replay(sg_fn *fn, sg__graph *g);

/* A growing text in host memory through ctx's allocator (explain, DOT,
 * trace JSON): sg__text_put appends printf-style; a failed allocation sets
 * oom and later puts do nothing. (explain.c) */
typedef struct sg__text {
    sg_ctx *ctx;
    char *buf;
    size_t len, cap;
    bool oom;
} sg__text;
SG__HIDDEN void sg__text_put(sg__text *t, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* For a backend's timed_run: kernel k of g ran from t0 to t1 (seconds on
 * one clock), then the replay is over. */
SG__HIDDEN void sg__trace_kernel(sg_fn *fn, const sg__graph *g, int k, double t0, double t1);
SG__HIDDEN void sg__trace_next(sg_fn *fn);

#endif /* SG_GRAPHS_H */
