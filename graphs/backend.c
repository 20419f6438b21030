/* SPDX-License-Identifier: MIT */
/*
 * backend.c -- sg_ctx_create and sg_ctx_destroy: pick a backend (AUTO takes
 * the first present of cuda > hip > ze > cpu) and let it fill the executor.
 */
#include "graphs.h"
#include "comm.h"
#include "cuda/exec.h"
#include "ze/ze.h"

#include <stdlib.h>

sg_status sg_ctx_create(const sg_ctx_opts *opts, sg_ctx **out) {
    if (!out) {
        sg__set_create_error("sg_ctx_create: out is NULL; pass the address of an sg_ctx pointer");
        return SG_ERR_NULL;
    }
    *out = NULL;
    sg_backend want = opts ? opts->backend : SG_BACKEND_AUTO;
    if ((unsigned)want > SG_BACKEND_ZE) {
        sg__set_create_error("sg_ctx_create: backend %d is not an sg_backend value", (int)want);
        return SG_ERR_INVALID_ARG;
    }
    if (opts && opts->num_threads < 0) {
        sg__set_create_error("sg_ctx_create: num_threads %d is negative; 0 means OpenMP's default",
                             opts->num_threads);
        return SG_ERR_INVALID_ARG;
    }
    sg_ctx tmp;
    memset(&tmp, 0, sizeof tmp);
    sg__ctx_init(&tmp, opts);
    sg_ctx *ctx = tmp.alloc(tmp.alloc_user, NULL, 0, sizeof *ctx);
    if (!ctx) {
        sg__set_create_error("sg_ctx_create: out of host memory for the context (%zu bytes)",
                             sizeof *ctx);
        return SG_ERR_OOM;
    }
    *ctx = tmp;
    sg__ctx_init(ctx, opts); /* the list sentinels must point into *ctx */
    ctx->host_live = ctx->host_peak = sizeof *ctx;
    sg_status s = SG_ERR_BACKEND_UNAVAILABLE;
    char why[SG__MSG_SIZE] = "";
    /* AUTO takes CUDA, then HIP, when a driver and a device are there (both
     * run the one GPU executor, with their own driver table); SG_BACKEND=cpu
     * makes it take the CPU. */
    const char *env = getenv("SG_BACKEND");
    bool auto_gpu = want == SG_BACKEND_AUTO && !(env && strcmp(env, "cpu") == 0);
    const sg_backend gpus[2] = {SG_BACKEND_CUDA, SG_BACKEND_HIP};
    for (int i = 0; i < 2 && s != SG_OK; i++) {
        if (want != gpus[i] && !auto_gpu) continue;
        ctx->backend = gpus[i];
        s = sg__cuda_init(ctx, why, sizeof why);
        if (s == SG_OK) ctx->gops = &sg__cuda_graph_ops;
        if (s != SG_OK && want == gpus[i]) {
            sg__set_create_error("sg_ctx_create: the %s backend is unavailable: %s; "
                                 "SG_BACKEND_AUTO falls back to the CPU",
                                 sg_backend_name(gpus[i]), why);
            if (ctx->exec.destroy) ctx->exec.destroy(ctx);
            ctx->alloc(ctx->alloc_user, ctx, sizeof *ctx, 0);
            return s;
        }
    }
    /* Level Zero: asked for, or AUTO when no CUDA or HIP device was taken. */
    if (s != SG_OK && (want == SG_BACKEND_ZE || auto_gpu)) {
        if (ctx->exec.destroy) ctx->exec.destroy(ctx);
        memset(&ctx->exec, 0, sizeof ctx->exec);
        ctx->backend = SG_BACKEND_ZE;
        s = sg__ze_init(ctx, why, sizeof why);
        if (s != SG_OK && want == SG_BACKEND_ZE) {
            sg__set_create_error("sg_ctx_create: the ze backend is unavailable: %s; "
                                 "SG_BACKEND_AUTO falls back to the CPU",
                                 why);
            if (ctx->exec.destroy) ctx->exec.destroy(ctx);
            ctx->alloc(ctx->alloc_user, ctx, sizeof *ctx, 0);
            return s;
        }
    }
    if (s != SG_OK) {
        ctx->backend = SG_BACKEND_CPU;
        s = sg__cpu_init(ctx);
    }
    if (s != SG_OK) {
        sg__set_create_error("%s", ctx->msg);
        ctx->alloc(ctx->alloc_user, ctx, sizeof *ctx, 0);
        return s;
    }
    sg__reg_ctx_list(ctx);
    *out = ctx;
    return SG_OK;
}

void sg_ctx_destroy(sg_ctx *ctx) {
    /* Inside a step the context runs it: refused, as the context's failure
     * (a listed context's fields are read only then). */
    if (ctx && sg__reg_ctx_listed(ctx) && ctx->steps) {
        sg__fail(ctx, SG_ERR_UNSUPPORTED,
                 "sg_ctx_destroy: called inside a step, which runs on this context; destroy "
                 "the context after sg_call returns");
        return;
    }
    /* A context destroyed already is no listed one: nothing of it is read. */
    if (!ctx || !sg__reg_ctx_unlist(ctx)) return;
    sg__fns_destroy_all(ctx); /* before tensors: captures pin parameters */
    sg__comm_destroy_all(ctx); /* while the device is there */
    sg__optims_destroy_all(ctx);
    sg__ctx_release_all(ctx);
    sg__pool_destroy(ctx);
    if (ctx->exec.destroy) ctx->exec.destroy(ctx);
    ctx->alloc(ctx->alloc_user, ctx, sizeof *ctx, 0);
}
