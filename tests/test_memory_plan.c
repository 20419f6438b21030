/* SPDX-License-Identifier: MIT */
/*
 * test_memory_plan.c -- the liveness planner on random buffer sets: no two
 * buffers whose lifetimes overlap share a byte, nor a buffer of at most 64
 * bytes with any other (a step's scalars), offsets are aligned, the
 * arena is never larger than the unshared sum and never smaller than the
 * peak of live bytes; and the pool of a compiled step, seen through
 * sg_memory_stats, on a deep chain where sharing must pay.
 */
#define _POSIX_C_SOURCE 200809L
#include "testutil.h"

#include "memory/memory.h"

#include <string.h>

static sg_ctx *ctx;

static bool check_plan(sg__buf *b, int n, size_t align, int gap, size_t total) {
    size_t unshared = 0;
    for (int i = 0; i < n; i++) {
        unshared += (b[i].size + align - 1) / align * align;
        if (b[i].offset % align) return TU_EXPECT(!"offset aligned");
        if (b[i].offset + b[i].size > total) return TU_EXPECT(!"inside the arena");
        for (int j = 0; j < i; j++) {
            bool live_together = b[i].first <= b[j].last + gap && b[j].first <= b[i].last + gap;
            bool bytes_overlap = b[i].offset < b[j].offset + b[j].size &&
                                 b[j].offset < b[i].offset + b[i].size;
            /* A buffer of at most 64 bytes shares no byte with any other. */
            bool tiny = b[i].size <= 64 || b[j].size <= 64;
            if ((live_together || tiny) && bytes_overlap && b[i].size && b[j].size) {
                fprintf(stderr, "  buffers %d [%d,%d] @%zu+%zu and %d [%d,%d] @%zu+%zu overlap\n", i,
                        b[i].first, b[i].last, b[i].offset, b[i].size, j, b[j].first, b[j].last,
                        b[j].offset, b[j].size);
                return false;
            }
        }
    }
    return TU_EXPECT(total <= unshared) && TU_EXPECT(total >= sg__plan_peak(b, n));
}

static void test_random_plans(void) {
    for (int seed = 1; seed <= 300; seed++) {
        tu_seed((uint64_t)seed);
        int n = (int)tu_randint(0, 60), nodes = (int)tu_randint(1, 40);
        sg__buf b[60];
        for (int i = 0; i < n; i++) {
            int first = (int)tu_randint(0, nodes - 1);
            size_t size = (size_t)(i % 4 == 0 ? tu_randint(0, 100) : tu_randint(0, 5000));
            b[i] =
                (sg__buf){.size = size, .first = first, .last = (int)tu_randint(first, nodes - 1)};
        }
        size_t align = seed % 3 == 0 ? 1 : 256, total = 0;
        int gap = seed % 4 == 1 ? (int)tu_randint(1, 5) : 0;
        bool ok = TU_EXPECT(sg__plan(ctx, b, n, align, gap, &total) == SG_OK) &&
                  check_plan(b, n, align, gap, total);
        if (!ok || seed % 50 == 0 || seed % 50 == 1)
            tu_case(ok, "PLAN(seed=%d,buffers=%d,nodes=%d,align=%zu,gap=%d,total=%zu)", seed, n,
                    nodes, align, gap, total);
    }
}

/* A deep chain of same-size buffers needs only two of them at a time. */
static sg_status deep_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)user;
    sg_tensor *y = in[0];
    for (int layer = 0; layer < 12; layer++)
        y = sg_tanh(sg_add_scalar(sg_mul_scalar(y, 0.5), 0.25));
    out[0] = y;
    return y ? SG_OK : sg_ctx_status(c);
}

static void test_pool_stats(bool fused) {
    setenv("SG_CODEGEN", fused ? "1" : "0", 1);
    sg_fn *fn;
    sg_compile(ctx, deep_step, NULL, 1, 1, &(sg_compile_opts){.mode = SG_MODE_REDUCE_OVERHEAD}, &fn);
    int64_t shape[2] = {64, 256};
    sg_tensor *x = tu_rand(ctx, SG_F32, 2, shape, -1, 1, NULL), *y;
    bool ok = true;
    for (int i = 0; i < 3; i++) {
        sg_mark_step_begin(ctx);
        ok = ok && TU_EXPECT(sg_call(fn, &x, 1, &y, 1) == SG_OK);
    }
    sg_memory_stats fs, cs;
    ok = ok && TU_EXPECT(sg_fn_memory_stats(fn, &fs) == SG_OK) &&
         TU_EXPECT(sg_ctx_memory_stats(ctx, &cs) == SG_OK);
    size_t buf = 64 * 256 * 4;
    /* 36 intermediates of which 35 are scratch: unfused two live at a
     * time; fused, one kernel keeps them all in registers. */
    ok = ok && TU_EXPECT(fs.unshared_bytes == 36 * buf) &&
         TU_EXPECT(fs.scratch_bytes == (fused ? 0 : 2 * buf)) && TU_EXPECT(fs.output_bytes == buf) &&
         TU_EXPECT(cs.pool_bytes >= fs.scratch_bytes + fs.output_bytes) &&
         TU_EXPECT(cs.pool_bytes <= fs.unshared_bytes * 4 / 10);
    if (!fused) ok = ok && TU_EXPECT(fs.peak_live_bytes == 2 * buf);
    tu_case(ok, "POOL_STATS(%s, 12 layers x 3 ops on f32[64,256]: pool %zu of %zu unshared bytes)",
            fused ? "fused" : "unfused", cs.pool_bytes, fs.unshared_bytes);
    sg_release(x);
    sg_fn_destroy(fn);
}

int main(void) {
    ctx = tu_ctx((sg_ctx_opts){0});
    test_random_plans();
    test_pool_stats(false);
    test_pool_stats(true);
    sg_ctx_destroy(ctx);
    return tu_finish();
}
