/* SPDX-License-Identifier: MIT */
/*
 * context.c -- what every context has whatever its backend: the allocator
 * hook and its accounting, the sticky status and its message, logging under
 * SG_LOGS topics, and the names of statuses, dtypes, backends and ops.
 * sg_ctx_create itself lives in graphs/, which picks the backend.
 */
#include "capture.h"

#include <stdio.h>
#include <stdlib.h>

const char *sg_version(void) { return SG_VERSION_STRING; }

const char *sg_status_str(sg_status s) {
    switch (s) {
    case SG_OK: return "SG_OK";
    case SG_ERR_INVALID_ARG: return "SG_ERR_INVALID_ARG";
    case SG_ERR_NULL: return "SG_ERR_NULL";
    case SG_ERR_SHAPE: return "SG_ERR_SHAPE";
    case SG_ERR_DTYPE: return "SG_ERR_DTYPE";
    case SG_ERR_INDEX: return "SG_ERR_INDEX";
    case SG_ERR_OOM: return "SG_ERR_OOM";
    case SG_ERR_WRONG_CONTEXT: return "SG_ERR_WRONG_CONTEXT";
    case SG_ERR_RELEASED: return "SG_ERR_RELEASED";
    case SG_ERR_BACKEND_UNAVAILABLE: return "SG_ERR_BACKEND_UNAVAILABLE";
    case SG_ERR_UNSUPPORTED: return "SG_ERR_UNSUPPORTED";
    case SG_ERR_STALE_OUTPUT: return "SG_ERR_STALE_OUTPUT";
    case SG_ERR_GRAPH_BREAK: return "SG_ERR_GRAPH_BREAK";
    case SG_ERR_COMPILE: return "SG_ERR_COMPILE";
    case SG_ERR_DRIVER: return "SG_ERR_DRIVER";
    case SG_ERR_INTERNAL: return "SG_ERR_INTERNAL";
    }
    return "SG_ERR_UNKNOWN";
}

size_t sg_dtype_size(sg_dtype dt) {
    static const size_t sizes[SG_NUM_DTYPES] = {4, 2, 2, 4, 8, 1};
    return sg__dtype_valid(dt) ? sizes[dt] : 0;
}

const char *sg_dtype_name(sg_dtype dt) {
    static const char *const names[SG_NUM_DTYPES] = {"f32", "f16", "bf16", "i32", "i64", "bool"};
    return sg__dtype_valid(dt) ? names[dt] : "?";
}

bool sg__dtype_valid(sg_dtype dt) { return (unsigned)dt < SG_NUM_DTYPES; }

bool sg__dtype_is_float(sg_dtype dt) { return dt == SG_F32 || dt == SG_F16 || dt == SG_BF16; }

const char *sg_backend_name(sg_backend b) {
    switch (b) {
    case SG_BACKEND_AUTO: return "auto";
    case SG_BACKEND_CPU: return "cpu";
    case SG_BACKEND_CUDA: return "cuda";
    case SG_BACKEND_HIP: return "hip";
    case SG_BACKEND_ZE: return "ze";
    }
    return "?";
}

static const char *const op_names[SG__OP_COUNT] = {
#define X(name, fam, str) str,
#include "ops.def"
#undef X
};

static const sg__family op_families[SG__OP_COUNT] = {
#define X(name, fam, str) SG__FAM_##fam,
#include "ops.def"
#undef X
};

const char *sg__op_name(sg__op op) { return (unsigned)op < SG__OP_COUNT ? op_names[op] : "?"; }

sg__family sg__op_family(sg__op op) {
    SG_ASSERT((unsigned)op < SG__OP_COUNT);
    return op_families[op];
}

/* ------------------------------------------------------------ allocator */

static void *default_alloc(void *user, void *ptr, size_t old_size, size_t new_size) {
    (void)user, (void)old_size;
    if (new_size == 0) {
        free(ptr);
        return NULL;
    }
    return realloc(ptr, new_size);
}

void *sg__alloc(sg_ctx *ctx, size_t nbytes) {
    if (nbytes == 0) nbytes = 1; /* a zero-byte request is still a distinct block */
    void *p = ctx->alloc(ctx->alloc_user, NULL, 0, nbytes);
    if (p) {
        ctx->host_live += nbytes;
        if (ctx->host_live > ctx->host_peak) ctx->host_peak = ctx->host_live;
    }
    return p;
}

void *sg__calloc(sg_ctx *ctx, size_t nbytes) {
    void *p = sg__alloc(ctx, nbytes);
    if (p) memset(p, 0, nbytes ? nbytes : 1);
    return p;
}

void sg__free(sg_ctx *ctx, void *p, size_t nbytes) {
    if (!p) return;
    if (nbytes == 0) nbytes = 1;
    ctx->alloc(ctx->alloc_user, p, nbytes, 0);
    ctx->host_live -= nbytes;
}

sg_status sg__dev_alloc(sg_ctx *ctx, size_t nbytes, void **data) {
    sg_status s = ctx->exec.alloc(ctx, nbytes, data);
    if (s == SG_OK) {
        ctx->dev_live += nbytes;
        if (ctx->dev_live > ctx->dev_peak) ctx->dev_peak = ctx->dev_live;
    }
    return s;
}

void sg__dev_free(sg_ctx *ctx, void *data, size_t nbytes) {
    if (!data) return;
    ctx->exec.free(ctx, data, nbytes);
    ctx->dev_live -= nbytes;
}

size_t sg__exec_cache_bytes(const sg_ctx *ctx) {
    return ctx->exec.cache_bytes ? ctx->exec.cache_bytes(ctx) : 0;
}

void sg_ctx_reset_peak_memory(sg_ctx *ctx) {
    if (!ctx) return;
    ctx->dev_peak = ctx->dev_live;
    ctx->host_peak = ctx->host_live;
}

sg_status sg_ctx_synchronize(sg_ctx *ctx) {
    if (!ctx) return SG_ERR_NULL;
    return ctx->exec.sync ? ctx->exec.sync(ctx) : SG_OK;
}

sg_status sg_ctx_host_bytes(const sg_ctx *ctx, size_t *live, size_t *peak) {
    if (!ctx) return SG_ERR_NULL;
    if (live) *live = ctx->host_live;
    if (peak) *peak = ctx->host_peak;
    return SG_OK;
}

/* ------------------------------------------------------------ errors and logs */

static const char *const log_topic_names[] = {"error",      "graph_breaks", "recompiles", "guards",
                                              "perf_hints", "output_code",  "fallbacks"};
#define NUM_TOPICS ((int)(sizeof log_topic_names / sizeof log_topic_names[0]))

static _Atomic bool said_unknown_topic;

/* SG_LOGS words that name no topic: said once per process on stderr. */
/* SG_LOGS: words apart by ',', '+' or ' '; each a topic, or "all" (every
 * one); the first word that names none is said once on stderr. */
static uint32_t parse_sg_logs(void) {
    const char *env = getenv("SG_LOGS");
    uint32_t bits = 0;
    for (const char *p = env; p && *p;) {
        size_t n = strcspn(p, ",+ ");
        if (n > 0) {
            bool known = n == 3 && strncmp(p, "all", 3) == 0;
            if (known) bits = ~0u;
            for (int t = 0; t < NUM_TOPICS && !known; t++)
                if (strlen(log_topic_names[t]) == n && strncmp(p, log_topic_names[t], n) == 0)
                    bits |= 1u << t, known = true;
            if (!known && !said_unknown_topic) {
                said_unknown_topic = true;
                fprintf(stderr,
                        "[stepgraph] SG_LOGS: unknown topic '%.*s' ignored; the topics are all, "
                        "error, graph_breaks, recompiles, guards, perf_hints, output_code, "
                        "fallbacks\n",
                        n > 200 ? 200 : (int)n, p);
            }
        }
        p += n;
        if (*p) p++;
    }
    return bits;
}

static int topic_index(const char *topic) {
    for (int t = 0; t < NUM_TOPICS; t++)
        if (strcmp(topic, log_topic_names[t]) == 0) return t;
    return -1;
}

static void vlog(sg_ctx *ctx, const char *topic, const char *fmt, va_list ap) {
    char line[SG__MSG_SIZE];
    if (!ctx->log) {
        int t = topic_index(topic);
        if (t < 0 || !(ctx->log_topics & (1u << t))) return;
    }
    vsnprintf(line, sizeof line, fmt, ap);
    if (ctx->log)
        ctx->log(ctx->log_user, topic, line);
    else
        fprintf(stderr, "[stepgraph %s] %s\n", topic, line);
}

void sg__log(sg_ctx *ctx, const char *topic, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vlog(ctx, topic, fmt, ap);
    va_end(ap);
}

void sg__log_always(sg_ctx *ctx, const char *topic, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int t = topic_index(topic);
    if (ctx->log || (t >= 0 && (ctx->log_topics & (1u << t)))) {
        vlog(ctx, topic, fmt, ap);
    } else {
        char line[SG__MSG_SIZE];
        vsnprintf(line, sizeof line, fmt, ap);
        fprintf(stderr, "[stepgraph %s] %s\n", topic, line);
    }
    va_end(ap);
}

sg_status sg__vfail(sg_ctx *ctx, sg_status s, const char *fmt, va_list ap) {
    if (!ctx) return s;
    va_list copy;
    va_copy(copy, ap);
    vsnprintf(ctx->msg, sizeof ctx->msg, fmt, ap);
    if (ctx->status == SG_OK) ctx->status = s;
    ctx->last = s;
    ctx->nfails++;
    vlog(ctx, "error", fmt, copy);
    va_end(copy);
    return s;
}

sg_status sg__fail(sg_ctx *ctx, sg_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    sg__vfail(ctx, s, fmt, ap);
    va_end(ap);
    return s;
}

/* Per thread: the message of a failed sg_ctx_create, or of a call given a
 * handle whose context was destroyed (there is no context to hold it). */
static _Thread_local char create_error[SG__MSG_SIZE];

void sg__set_create_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(create_error, sizeof create_error, fmt, ap);
    va_end(ap);
}

const char *sg_last_error(const sg_ctx *ctx) { return ctx ? ctx->msg : create_error; }

sg_status sg_ctx_status(const sg_ctx *ctx) { return ctx ? ctx->status : SG_ERR_NULL; }

void sg_clear_error(sg_ctx *ctx) {
    if (!ctx) return;
    ctx->status = SG_OK;
    ctx->msg[0] = '\0';
}

sg_backend sg_ctx_backend(const sg_ctx *ctx) { return ctx ? ctx->backend : SG_BACKEND_CPU; }

/* ------------------------------------------------------------ lifetime */

void sg__ctx_init(sg_ctx *ctx, const sg_ctx_opts *opts) {
    ctx->alloc = opts && opts->alloc ? opts->alloc : default_alloc;
    ctx->alloc_user = opts ? opts->alloc_user : NULL;
    ctx->log = opts ? opts->log : NULL;
    ctx->log_user = opts ? opts->log_user : NULL;
    ctx->num_threads = opts ? opts->num_threads : 0;
    ctx->log_topics = parse_sg_logs();
    ctx->live.prev = ctx->live.next = &ctx->live;
    ctx->dead.prev = ctx->dead.next = &ctx->dead;
    atomic_flag_clear(&ctx->reg_lock);
    ctx->reg_next = NULL;
    memset(ctx->reg_bucket, 0, sizeof ctx->reg_bucket);
}
