/* SPDX-License-Identifier: MIT */
/*
 * ze_eager.c -- eager ops on Level Zero. There is no hand-written kernel
 * family here: a node becomes a one-op capture (an IR whose slots are its
 * tensors' storages, taken as the capture's inputs), fused with the GPU
 * options and generated in the OpenCL C dialect (sg__cgen_gpu), compiled to
 * SPIR-V and loaded. What is kept is the capture's signature (its IR
 * without addresses) and the unit's kernels, so an op seen before costs
 * its table upload and its launches. Pointwise and data ops, and the row
 * and reduce ops the generator computes (softmax, log_softmax, layer_norm,
 * rms_norm; sum, mean, var and argmax over the innermost dims; sums and
 * means keeping inner columns) and matmul/linear of at most 8 rows (a
 * GEMV) or more (the generated GEMM, codegen/cgen_gemm.c: Level Zero has no
 * BLAS library), run so; so do the ops CUDA runs as library kernels
 * (max, min, argmax, var and sums over any dims, softmax over any dim,
 * cross_entropy and its gradient, arange: codegen/cgen_serial.c; rand,
 * topk, sample, gather and index_add: codegen/cgen_serial_data.c), and
 * attention runs as its decomposition (capture/ops_data.c). An op with more
 * tensors than MAX_T, or whose group would need a library call or a kernel
 * the dialect lacks (none today), fails with SG_ERR_UNSUPPORTED naming it.
 */
#include "../comm.h"
#include "../graphs.h"
#include "ze.h"

#include <stdio.h>

#ifdef SG_HAVE_ZE_HEADERS

typedef struct entry {
    struct entry *next;
    char key[65];
    int ngroups, nslots, ntable;
    sg__cuda_kinfo *kinfo;
    sg__ze_kfn **kfn;
    int *argoff;
} entry;

typedef struct eager {
    entry *entries;
    void *table; /* device scratch for one op's address table */
    size_t table_bytes;
} eager;

#define N1(n) ((size_t)((n) ? (n) : 1))
#define MAX_T 8 /* tensors of one node: its inputs and its output */

static void entry_free(sg_ctx *ctx, entry *e) {
    sg__free(ctx, e->kinfo, sizeof *e->kinfo * N1(e->ngroups));
    sg__free(ctx, e->kfn, sizeof *e->kfn * N1(e->ngroups));
    sg__free(ctx, e->argoff, sizeof *e->argoff * N1(e->ngroups));
    sg__free(ctx, e, sizeof *e);
}

void sg__ze_eager_release(sg_ctx *ctx, void *state) {
    eager *z = state;
    if (!z) return;
    while (z->entries) {
        entry *e = z->entries;
        z->entries = e->next;
        entry_free(ctx, e);
    }
    if (z->table) sg__dev_free(ctx, z->table, z->table_bytes);
    sg__free(ctx, z, sizeof *z);
}

/*
 * The one-op IR of n: its distinct tensors (inputs, then the output) as the
 * capture's inputs, recorded by the capture's own recorder. The recorder
 * marks storages with the capture's id; a capture in progress keeps its
 * marks, so they are put back.
 */
static sg_status one_op_ir(sg_ctx *ctx, const sg__node *n, sg__ir *ir, sg_tensor **t, int *nt) {
    *nt = 0;
    memset(ir, 0, sizeof *ir); /* freed by the caller, whatever happens here */
    for (int j = 0; j <= n->nin; j++) {
        sg_tensor *x = j < n->nin ? n->in[j] : n->out;
        if (!x) continue;
        if (*nt == MAX_T)
            return sg__fail(ctx, SG_ERR_UNSUPPORTED,
                            "ze: op %s has more than %d tensors; not yet on the ze backend",
                            sg__op_name(n->op), MAX_T);
        t[(*nt)++] = x;
    }
    uint32_t cap_id[MAX_T];
    int cap_slot[MAX_T];
    for (int k = 0; k < *nt; k++) cap_id[k] = t[k]->st->cap_id, cap_slot[k] = t[k]->st->cap_slot;
    sg__rec *outer = ctx->rec, rec;
    sg_status s = sg__rec_begin(ctx, &rec, ir, *nt, t, false);
    if (s == SG_OK) s = sg__rec_node(ctx, n);
    sg_tensor *out = n->out;
    if (s == SG_OK) s = sg__rec_end(ctx, 1, &out);
    ctx->rec = outer;
    for (int k = *nt - 1; k >= 0; k--)
        t[k]->st->cap_id = cap_id[k], t[k]->st->cap_slot = cap_slot[k];
    return s == SG_OK
               ? SG_OK
               : sg__fail(ctx, s, "ze: out of host memory recording op %s", sg__op_name(n->op));
}

/* The IR's signature: everything but addresses, field by field (the
 * structs have padding). */
static void signature(const sg__ir *ir, char key[65]) {
    sg__sha256_ctx sh;
    uint8_t d[32];
    int64_t v[8 + 3 * SG_MAX_DIMS];
    sg__sha256_init(&sh);
    sg__sha256_update(&sh, "ze-eager-1", 10);
    for (int s = 0; s < ir->nslots; s++) {
        v[0] = ir->slots[s].input;
        sg__sha256_update(&sh, v, sizeof *v);
    }
    for (int r = 0; r < ir->nrefs; r++) {
        const sg__ref *f = &ir->refs[r];
        int n = 0;
        v[n++] = f->slot, v[n++] = f->dtype, v[n++] = f->ndim, v[n++] = f->offset;
        for (int k = 0; k < f->ndim; k++) v[n++] = f->shape[k], v[n++] = f->stride[k];
        sg__sha256_update(&sh, v, sizeof *v * (size_t)n);
    }
    for (int i = 0; i < ir->nnodes; i++) {
        const sg__irnode *x = &ir->nodes[i];
        int n = 0;
        v[n++] = x->op, v[n++] = x->mask, v[n++] = x->nin, v[n++] = x->args, v[n++] = x->out;
        for (int k = 0; k < 3; k++) v[n++] = x->i[k];
        sg__sha256_update(&sh, v, sizeof *v * (size_t)n);
        sg__sha256_update(&sh, x->f, sizeof x->f);
    }
    sg__sha256_update(&sh, ir->args, sizeof *ir->args * (size_t)ir->nargs);
    sg__sha256_update(&sh, ir->out_refs, sizeof(int) * (size_t)ir->nout);
    sg__sha256_final(&sh, d);
    sg__sha256_hex(d, key);
}

/* The library's part of a group: its anchor or opaque node, or -1. */
static int call_node(const sg__group *grp) {
    if (grp->kind == SG__G_OPAQUE) return grp->g[0].node;
    if (grp->anchor >= 0) return grp->g[grp->anchor].node;
    return -1;
}

static sg_status unsupported(sg_ctx *ctx, const sg__node *n, const char *why) {
    return sg__fail(ctx, SG_ERR_UNSUPPORTED,
                    "ze: op %s is not yet on the ze backend (%s); use SG_BACKEND_CPU",
                    sg__op_name(n->op), why);
}

/* Generate, compile and load the unit of a new signature. */
static sg_status build(sg_ctx *ctx, const sg__node *n, const sg__ir *ir, entry *e) {
    sg__fuse_opts fo;
    sg__cgen_cuda_fuse_opts(&fo, false);
    sg__fused f;
    memset(&f, 0, sizeof f);
    sg_status s = sg__fuse(ctx, ir, &fo, &f);
    if (s != SG_OK) return s;
    e->ngroups = f.ngroups;
    e->nslots = ir->nslots;
    e->kinfo = sg__calloc(ctx, sizeof *e->kinfo * N1(f.ngroups));
    e->kfn = sg__calloc(ctx, sizeof *e->kfn * N1(f.ngroups));
    e->argoff = sg__calloc(ctx, sizeof *e->argoff * N1(f.ngroups));
    if (!e->kinfo || !e->kfn || !e->argoff) s = sg__fail(ctx, SG_ERR_OOM, "ze: out of host memory");
    char name[96];
    snprintf(name, sizeof name, "sg_ze_%s_%.12s", sg__op_name(n->op), e->key);
    sg__emit em = {.ctx = ctx};
    int nk = 0;
    if (s == SG_OK) s = sg__cgen_gpu(ctx, ir, &f, name, SG__DIALECT_OPENCL, &em, e->kinfo, &nk);
    if (s == SG_ERR_UNSUPPORTED)
        s = unsupported(ctx, n, "the OpenCL C dialect has no kernel for it");
    for (int k = 0; s == SG_OK && k < f.ngroups; k++)
        if (call_node(&f.groups[k]) >= 0 && !e->kinfo[k].replaces_call)
            s = unsupported(ctx, n, "it needs a library kernel");
    void *spirv = NULL;
    size_t size = 0;
    if (s == SG_OK && nk > 0) s = sg__ocloc_build(ctx, name, em.buf, &spirv, &size);
    for (int k = 0; s == SG_OK && k < f.ngroups; k++)
        if (e->kinfo[k].name[0])
            s = sg__ze_kernel_spirv(ctx, name, spirv, size, e->kinfo[k].name, &e->kfn[k]);
    sg__free(ctx, spirv, size);
    sg__emit_free(&em);
    sg__fused_free(ctx, &f, ir);
    e->ntable = e->nslots;
    for (int k = 0; s == SG_OK && k < e->ngroups; k++) {
        bool own = e->kinfo[k].name[0] && e->kinfo[k].nlocal >= 0;
        e->argoff[k] = own ? e->ntable : 0;
        e->ntable += own ? e->kinfo[k].nlocal : 0;
    }
    return s;
}

static sg_status lookup(sg_ctx *ctx, eager *z, const sg__node *n, const sg__ir *ir, entry **out) {
    char key[65];
    signature(ir, key);
    for (entry *e = z->entries; e; e = e->next)
        if (strcmp(e->key, key) == 0) return *out = e, SG_OK;
    entry *e = sg__calloc(ctx, sizeof *e);
    if (!e) return sg__fail(ctx, SG_ERR_OOM, "ze: out of host memory");
    snprintf(e->key, sizeof e->key, "%s", key);
    sg_status s = build(ctx, n, ir, e);
    if (s != SG_OK) {
        entry_free(ctx, e);
        return s;
    }
    e->next = z->entries;
    z->entries = e;
    *out = e;
    return SG_OK;
}

/* The table of this call's addresses (slot bases, then the kernels' own
 * entries) in the device scratch. */
static sg_status upload_table(sg_ctx *ctx, eager *z, const entry *e, const sg__ir *ir,
                              sg_tensor *const *t) {
    char *slotp[MAX_T], *addrs[MAX_T + SG__CUDA_MAX_LOCAL * 4];
    size_t bytes = sizeof(char *) * (size_t)e->ntable;
    if (e->ntable > (int)(sizeof addrs / sizeof *addrs))
        return sg__fail(ctx, SG_ERR_UNSUPPORTED, "ze: an eager op with %d table entries",
                        e->ntable);
    for (int s = 0; s < ir->nslots; s++) {
        const sg_tensor *x = t[ir->slots[s].input];
        slotp[s] = (char *)x->st->data + x->offset * (int64_t)sg_dtype_size(x->dtype);
    }
    memcpy(addrs, slotp, sizeof(char *) * (size_t)ir->nslots);
    for (int k = 0; k < e->ngroups; k++)
        if (e->kinfo[k].name[0] && e->kinfo[k].nlocal >= 0)
            for (int i = 0; i < e->kinfo[k].nlocal; i++)
                addrs[e->argoff[k] + i] = slotp[e->kinfo[k].local[i]];
    if (bytes > z->table_bytes) {
        if (z->table) sg__dev_free(ctx, z->table, z->table_bytes);
        z->table = NULL;
        z->table_bytes = 0;
        size_t want = bytes < 4096 ? 4096 : bytes;
        sg_status s = sg__dev_alloc(ctx, want, &z->table);
        if (s != SG_OK) return sg__fail(ctx, s, "ze: no device memory for an op's table");
        z->table_bytes = want;
    }
    return bytes ? ctx->exec.upload(ctx, z->table, addrs, bytes) : SG_OK;
}

sg_status sg__ze_eager_run(sg_ctx *ctx, void **state, const sg__node *n) {
    if (sg__op_family(n->op) == SG__FAM_COMM) return sg__comm_run(ctx, n);
    /* An empty output: nothing to compute (the generator writes no kernel for it). */
    if (n->out && sg__numel(n->out->ndim, n->out->shape) == 0) return SG_OK;
    /* An index_copy_ of no rows writes nothing (its kernel walks src). */
    if (n->op == SG__OP_INDEX_COPY && sg__numel(n->in[2]->ndim, n->in[2]->shape) == 0) return SG_OK;
    if (!*state && !(*state = sg__calloc(ctx, sizeof(eager))))
        return sg__fail(ctx, SG_ERR_OOM, "ze: out of host memory");
    eager *z = *state;
    sg__ir ir;
    sg_tensor *t[MAX_T];
    int nt = 0;
    sg_status s = one_op_ir(ctx, n, &ir, t, &nt);
    entry *e = NULL;
    if (s == SG_OK) s = lookup(ctx, z, n, &ir, &e);
    if (s == SG_OK) s = upload_table(ctx, z, e, &ir, t);
    if (s == SG_OK) s = sg__data_check(ctx, n); /* bad indices: nothing written */
    for (int k = 0; s == SG_OK && k < e->ngroups; k++) {
        if (!e->kfn[k]) continue;
        uint32_t groups[3] = {e->kinfo[k].grid, 1, 1}, size[3] = {e->kinfo[k].block, 1, 1};
        void *tab = (char *)z->table + sizeof(char *) * (size_t)e->argoff[k];
        sg__ze_arg arg = {sizeof tab, &tab};
        s = sg__ze_launch(ctx, e->kfn[k], groups, size, 1, &arg);
    }
    sg__ir_free(ctx, &ir);
    return s;
}

#endif
