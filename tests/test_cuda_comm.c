/* SPDX-License-Identifier: MIT */
/*
 * test_cuda_comm.c -- collectives on CUDA through NCCL, with one rank
 * (WORLD_SIZE=1, as torchrun sets it for one process):
 *  - a missing libnccl is SG_ERR_BACKEND_UNAVAILABLE naming the library and
 *    the fix, and the context stays usable;
 *  - eager all_reduce (sum, mean; in place), all_gather, reduce_scatter and
 *    broadcast on f32, bf16 and i64 give x back, bit for bit;
 *  - the tiny GPT-2 config trained in a REDUCE_OVERHEAD step whose
 *    gradients and loss go through NCCL (recorded into the step's CUDA graph
 *    by stream capture) against the same step without a communicator: the
 *    same losses and parameters (f32 tolerance: the gradients' bucket may
 *    change how the clipping's norm is summed), every call a graph replay.
 * Exits 77 without a GPU, and without NCCL (SG_NCCL_LIB names the library;
 * unset, the test looks for the one PyTorch's pip packages carry).
 */
#define _POSIX_C_SOURCE 200809L
#include "gpt2/data.h"
#include "gpt2/model.h"
#include "gpt2/train.h"
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { V = 128, B = 2, T = 8, STEPS = 4 };

static const gpt2_config tiny = {
    .max_t = 16, .vocab = V, .n_layer = 2, .n_head = 4, .channels = 64, .padded_vocab = V};

static bool same_bits(sg_tensor *a, sg_tensor *b) {
    size_t n = (size_t)sg_tensor_numel(a) * sg_dtype_size(sg_tensor_dtype(a));
    char *x = malloc(n ? n : 1), *y = malloc(n ? n : 1);
    bool ok = a && b && sg_tensor_numel(a) == sg_tensor_numel(b) && sg_read(a, x, n) == SG_OK &&
              sg_read(b, y, n) == SG_OK && !memcmp(x, y, n);
    free(x), free(y);
    return ok;
}

static void eager_cases(sg_ctx *ctx, sg_comm *comm) {
    const sg_dtype dts[] = {SG_F32, SG_BF16, SG_I64};
    for (int d = 0; d < 3; d++) {
        int64_t shape[2] = {6, 5};
        tu_seed(40 + (uint64_t)d);
        sg_tensor *x = tu_rand(ctx, dts[d], 2, shape, -3, 3, NULL), *c = sg_clone(x);
        const char *dn = sg_dtype_name(dts[d]);
        bool flt = dts[d] != SG_I64;
        tu_case(same_bits(sg_all_reduce(comm, x, SG_REDUCE_SUM), x),
                "NCCL_ALL_REDUCE(op=sum,type=%s,"
                "x=[6,5],np=1)",
                dn);
        if (flt)
            tu_case(same_bits(sg_all_reduce(comm, x, SG_REDUCE_MEAN), x),
                    "NCCL_ALL_REDUCE(op=mean,type=%s,x=[6,5],np=1)", dn);
        tu_case(sg_all_reduce_(comm, c, SG_REDUCE_SUM) == SG_OK && same_bits(c, x),
                "NCCL_ALL_REDUCE_(op=sum,type=%s,in_place,np=1)", dn);
        tu_case(same_bits(sg_all_gather(comm, x), x), "NCCL_ALL_GATHER(type=%s,x=[6,5],np=1)", dn);
        tu_case(same_bits(sg_reduce_scatter(comm, x, SG_REDUCE_SUM), x),
                "NCCL_REDUCE_SCATTER(op=sum,type=%s,x=[6,5],np=1)", dn);
        tu_case(same_bits(sg_broadcast(comm, x, 0), x), "NCCL_BROADCAST(root=0,type=%s,np=1)", dn);
        tu_case(sg_comm_synchronize(comm) == SG_OK, "NCCL_SYNCHRONIZE(type=%s)", dn);
    }
}

/* Train STEPS steps; losses and the final parameters (f32, into p). */
static bool train(sg_ctx *ctx, sg_comm *comm, double *loss, float **p, int64_t *np,
                  sg_fn_stats *stats) {
    gpt2_tokens data = {.n = 4096};
    data.tok = malloc(sizeof *data.tok * (size_t)data.n);
    for (int64_t i = 0; i < data.n; i++) data.tok[i] = (uint16_t)((i * 37 + i / 7) % V);
    gpt2 *g = NULL;
    gpt2_trainer *tr = NULL;
    gpt2_loader ld;
    int64_t bt[2] = {B, T}, tok[B * T], tgt[B * T];
    gpt2_train_opts to = {
        .mode = SG_MODE_REDUCE_OVERHEAD, .weight_decay = 0.1, .grad_clip = 1.0, .comm = comm};
    bool ok = TU_EXPECT(gpt2_init(ctx, &tiny, SG_F32, 1, &g) == SG_OK) &&
              TU_EXPECT(gpt2_trainer_create(g, &to, &tr) == SG_OK) &&
              TU_EXPECT(gpt2_loader_init(&ld, &data, B, T) == SG_OK);
    sg_tensor *x = sg_empty(ctx, SG_I64, 2, bt), *y = sg_empty(ctx, SG_I64, 2, bt);
    for (int k = 0; ok && k < STEPS; k++) {
        gpt2_loader_next(&ld, tok, tgt);
        ok = TU_EXPECT(sg_write(x, tok, sizeof tok) == SG_OK) &&
             TU_EXPECT(sg_write(y, tgt, sizeof tgt) == SG_OK) &&
             TU_EXPECT(gpt2_trainer_step(tr, x, y, 1e-3, &loss[k], NULL) == SG_OK);
    }
    *np = 0;
    for (int i = 0; ok && i < tr->n; i++) *np += sg_tensor_numel(tr->params[i]);
    *p = ok ? malloc(sizeof(float) * (size_t)*np) : NULL;
    for (int i = 0, at = 0; ok && i < tr->n; at += (int)sg_tensor_numel(tr->params[i++]))
        ok = TU_EXPECT(sg_read(tr->params[i], *p + at,
                               sizeof(float) * (size_t)sg_tensor_numel(tr->params[i])) == SG_OK);
    ok = ok && TU_EXPECT(sg_fn_get_stats(tr->train_fn, stats) == SG_OK);
    if (ok && comm) {
        const char *ex = sg_fn_explain(tr->train_fn);
        ok = TU_EXPECT(strstr(ex, "all_reduce") != NULL);
    }
    if (!ok && sg_ctx_status(ctx)) fprintf(stderr, "  %s\n", sg_last_error(ctx));
    sg_release(x), sg_release(y);
    gpt2_trainer_destroy(tr);
    gpt2_destroy(g);
    free(data.tok);
    return ok;
}

/* Without SG_NCCL_LIB: the libnccl.so.2 of pip's nvidia-nccl package, when
 * python3 has one (PyTorch's wheels bring it), else the loader's default. */
static void find_nccl(void) {
    if (getenv("SG_NCCL_LIB")) return;
    FILE *p = popen("python3 -c 'import os, nvidia.nccl as m; "
                    "print(os.path.join(list(m.__path__)[0], \"lib\", \"libnccl.so.2\"))' "
                    "2>/dev/null",
                    "r");
    char path[4096] = "";
    if (p && fgets(path, sizeof path, p)) {
        path[strcspn(path, "\n")] = 0;
        if (access(path, R_OK) == 0) setenv("SG_NCCL_LIB", path, 1);
    }
    if (p) pclose(p);
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    sg_ctx *ctx = NULL;
    if (sg_ctx_create(&(sg_ctx_opts){.backend = SG_BACKEND_CUDA}, &ctx) != SG_OK) {
        printf("skip: no CUDA device (%s)\n", sg_last_error(NULL));
        return 77;
    }
    setenv("WORLD_SIZE", "1", 1), setenv("RANK", "0", 1), setenv("LOCAL_RANK", "0", 1);
    find_nccl();
    printf("NCCL: %s\n", getenv("SG_NCCL_LIB") ? getenv("SG_NCCL_LIB") : "libnccl.so.2");
    /* A missing libnccl: named, with the fix; the context still works. */
    const char *lib = getenv("SG_NCCL_LIB");
    char *keep = lib ? strdup(lib) : NULL;
    setenv("SG_NCCL_LIB", "/nonexistent/libnccl.so.2", 1);
    sg_comm *comm = NULL;
    sg_status s = sg_comm_create(ctx, NULL, &comm);
    const char *msg = sg_last_error(ctx);
    tu_case(s == SG_ERR_BACKEND_UNAVAILABLE && strstr(msg, "libnccl.so.2") &&
                strstr(msg, "install"),
            "COMM_CREATE(SG_NCCL_LIB missing) -> %s: %s", sg_status_str(s), msg);
    sg_clear_error(ctx);
    int64_t four = 4;
    tu_case(sg_exp(sg_full(ctx, SG_F32, 1, &four, 1.0)) != NULL, "CONTEXT_USABLE(after a failed "
                                                                 "sg_comm_create)");
    if (keep)
        setenv("SG_NCCL_LIB", keep, 1);
    else
        unsetenv("SG_NCCL_LIB");
    free(keep);
    s = sg_comm_create(ctx, NULL, &comm);
    if (s == SG_ERR_BACKEND_UNAVAILABLE) {
        printf("skip: %s\n", sg_last_error(ctx));
        sg_ctx_destroy(ctx);
        return tu_finish() ? 1 : 77;
    }
    tu_case(s == SG_OK && sg_comm_size(comm) == 1, "COMM_CREATE(WORLD_SIZE=1,nccl) -> %s %s",
            sg_status_str(s), s == SG_OK ? "" : sg_last_error(ctx));
    if (s == SG_OK) {
        eager_cases(ctx, comm);
        double l0[STEPS], l1[STEPS];
        float *p0 = NULL, *p1 = NULL;
        int64_t n0 = 0, n1 = 0;
        sg_fn_stats st0, st1;
        bool ok = train(ctx, NULL, l0, &p0, &n0, &st0) && train(ctx, comm, l1, &p1, &n1, &st1);
        double *d0 = malloc(sizeof(double) * (size_t)(n0 ? n0 : 1)),
               *d1 = malloc(sizeof(double) * (size_t)(n0 ? n0 : 1));
        for (int64_t i = 0; ok && i < n0 && n0 == n1; i++) d0[i] = p0[i], d1[i] = p1[i];
        ok = ok && TU_EXPECT(n0 == n1) && tu_close("loss", l1, l0, STEPS, 1e-5, 1e-6) &&
             tu_close("params", d1, d0, n0, 1e-5, 1e-6);
        free(d0), free(d1);
        tu_case(ok,
                "TRAIN_GPT2(tiny,B=%d,T=%d,steps=%d,reduce-overhead) with NCCL == without: "
                "losses %.6f .. %.6f",
                B, T, STEPS, l1[0], l1[STEPS - 1]);
        ok = ok && TU_EXPECT(st1.replays == STEPS) && TU_EXPECT(st1.fallbacks == 0) &&
             TU_EXPECT(st1.graph_instantiations >= 1);
        tu_case(ok, "TRAIN_GPT2_NCCL_GRAPH replays %llu fallbacks %llu graphs %llu",
                (unsigned long long)st1.replays, (unsigned long long)st1.fallbacks,
                (unsigned long long)st1.graph_instantiations);
        free(p0), free(p1);
        sg_comm_destroy(comm);
    }
    sg_ctx_destroy(ctx);
    return tu_finish();
}
