/* SPDX-License-Identifier: MIT */
/*
 * registry.c -- which handles are alive, known without reading them. It
 * makes sg_release, sg_fn_destroy, sg_call (and the other sg_fn_* calls)
 * and sg_ctx_destroy defined for a handle whose context was destroyed: they
 * return SG_ERR_INVALID_ARG with the message in sg_last_error(NULL)
 * instead of reading freed memory.
 *
 * The design. Each context keeps its handles (tensor handles and fn
 * records) in a hash table of 1024 chains keyed by address, linked through
 * an sg__reg inside each handle, under the context's own spin lock; the
 * process keeps the list of live contexts under one spin lock. A handle is
 * added when its memory is allocated and removed before that memory is
 * freed, so "in some live context's table" means "this address is a handle
 * now". A lookup (sg__reg_find) walks the live contexts and probes each
 * table; it compares addresses and reads only registry nodes, which are
 * inside handles that are alive. Nothing here allocates: the chains are
 * intrusive, the table is part of the context, so registering cannot fail
 * and every byte still goes through the allocator hook.
 *
 * Costs. Making or dropping a tensor (every op) takes only its own
 * context's lock, which no other thread holds except for the few
 * instructions of a lookup's probe: the ops take no process-wide lock.
 * sg_release, sg_fn_destroy and sg_ctx_create/destroy take the process
 * lock for one walk over the live contexts. sg_call must not: each thread
 * remembers the last few fns it found alive together with an epoch that
 * every removal of an fn bumps, so a call pays one atomic load while no fn
 * anywhere was freed since, and one lookup after.
 *
 * What is guaranteed. No call reads or writes memory that was freed for a
 * handle, whatever order the user destroys things in. A pointer to a handle
 * that was freed (with its context, or after the quarantine let it go) is
 * recognized as long as no later handle occupies its address. Once the
 * allocator has given that address to a new handle (ABA), the old pointer
 * and the new handle cannot be told apart: the call acts on the new handle
 * (a released one answers SG_ERR_RELEASED), as any C pointer would after
 * free. The per-context quarantine of released tensors (SG__QUARANTINE)
 * and destroyed fns keeps recent addresses from being reused; the same
 * holds for a context's address and sg_ctx_destroy called twice.
 */
#include "capture.h"

#include <sched.h>

/* ------------------------------------------------------------ locks */

static atomic_flag contexts_lock = ATOMIC_FLAG_INIT;
static sg_ctx *contexts;          /* live contexts, through reg_next */
static _Atomic uint64_t fn_epoch; /* bumped whenever an fn record leaves */

static void take(atomic_flag *f) {
    while (atomic_flag_test_and_set_explicit(f, memory_order_acquire)) sched_yield();
}

static void give(atomic_flag *f) { atomic_flag_clear_explicit(f, memory_order_release); }

/* ------------------------------------------------------------ contexts */

void sg__reg_ctx_list(sg_ctx *ctx) {
    take(&contexts_lock);
    ctx->reg_next = contexts;
    contexts = ctx;
    give(&contexts_lock);
}

bool sg__reg_ctx_unlist(sg_ctx *ctx) {
    bool found = false;
    take(&contexts_lock);
    for (sg_ctx **p = &contexts; *p; p = &(*p)->reg_next)
        if (*p == ctx) {
            *p = ctx->reg_next; /* ctx is live: reading it is safe */
            found = true;
            break;
        }
    give(&contexts_lock);
    return found;
}

bool sg__reg_ctx_listed(const sg_ctx *ctx) {
    bool found = false;
    take(&contexts_lock);
    for (const sg_ctx *p = contexts; p && !found; p = p->reg_next) found = p == ctx;
    give(&contexts_lock);
    return found;
}

/* ------------------------------------------------------------ handles */

_Static_assert(SG__REG_BUCKETS == 1024, "bucket_of takes the top 10 bits of the hash");

static size_t bucket_of(const void *obj) {
    uint64_t h = (uint64_t)(uintptr_t)obj >> 4;
    h *= 0x9e3779b97f4a7c15ull;
    return (size_t)(h >> 54);
}

void sg__reg_add(sg_ctx *ctx, sg__reg *r, const void *obj, int kind) {
    sg__reg **head = &ctx->reg_bucket[bucket_of(obj)];
    take(&ctx->reg_lock);
    r->obj = obj;
    r->kind = kind;
    r->next = *head;
    r->pprev = head;
    if (*head) (*head)->pprev = &r->next;
    *head = r;
    give(&ctx->reg_lock);
}

void sg__reg_remove(sg_ctx *ctx, sg__reg *r) {
    if (!r->kind) return;
    take(&ctx->reg_lock);
    *r->pprev = r->next;
    if (r->next) r->next->pprev = r->pprev;
    if (r->kind == SG__REG_FN) atomic_fetch_add_explicit(&fn_epoch, 1, memory_order_release);
    r->next = NULL, r->pprev = NULL, r->obj = NULL, r->kind = 0;
    give(&ctx->reg_lock);
}

sg_ctx *sg__reg_find(const void *obj, int kind) {
    if (!obj) return NULL;
    size_t b = bucket_of(obj);
    sg_ctx *owner = NULL;
    take(&contexts_lock);
    for (sg_ctx *c = contexts; c && !owner; c = c->reg_next) {
        take(&c->reg_lock);
        for (const sg__reg *r = c->reg_bucket[b]; r; r = r->next)
            if (r->obj == obj) {
                if (r->kind == kind) owner = c;
                break;
            }
        give(&c->reg_lock);
    }
    give(&contexts_lock);
    return owner;
}

/* The fns this thread found alive lately, each with the epoch it was found at. */
#define KNOWN 4
static _Thread_local struct {
    const void *fn;
    uint64_t epoch;
} known[KNOWN];
static _Thread_local unsigned known_next;

bool sg__reg_fn_known(const void *fn) {
    uint64_t e = atomic_load_explicit(&fn_epoch, memory_order_acquire);
    for (int i = 0; i < KNOWN; i++)
        if (known[i].fn == fn && known[i].epoch == e) return true;
    if (!sg__reg_find(fn, SG__REG_FN)) return false;
    /* e was read before the lookup: a removal since then makes it stale. */
    known[known_next % KNOWN].fn = fn;
    known[known_next % KNOWN].epoch = e;
    known_next++;
    return true;
}
