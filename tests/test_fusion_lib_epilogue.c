/* SPDX-License-Identifier: MIT */
/*
 * test_fusion_lib_epilogue.c -- which MATMUL groups the CUDA backend's
 * fusion hands whole to cuBLASLt (sg__group.lib_epi), without a GPU: steps
 * are captured on the CPU backend and their IR fused with the CUDA
 * backend's options. Checked: linear + gelu_tanh is GELU, and GELU with aux
 * when sg_grad's backward reads the pre-activation; linear + relu is RELU,
 * forward and training (relu's gradient reads its output); the residual
 * add names its residual operand either way round; nothing is marked when
 * the product is seen elsewhere (relu's input a step output), when the
 * epilogue has a second member, when the residual broadcasts, or when the
 * result is written over an input of the product; a GPT-2 block marks its
 * fc (GELU) and both projections (residual); no group of the CPU backend's
 * own fusion is marked (its numbers do not change). In training (bf16), the
 * GELU's gradient, one gelu_tanh_bwd after the product that makes its g,
 * is DGELU, its input read as the aux, the next linear's weight trained or
 * frozen (its dW product runs before its dX product). Also the tune file's
 * key words for the new epilogues parse, and out-of-range ones do not.
 */
#define _POSIX_C_SOURCE 200809L
#include "graphs/cuda/cublaslt.h"
#include "graphs/graphs.h"
#include "testutil.h"

#include <string.h>

static sg_ctx *ctx;

enum {
    K_GELU,
    K_RELU,
    K_ADD_RH,
    K_ADD_HR,
    K_RELU_SEEN,
    K_GELU_MUL,
    K_ADD_BCAST,
    K_MATMUL_GELU,
    K_INPLACE,
    K_BLOCK,
    K_CHAIN,
    K_CHAIN_FROZEN,
    NK
};
static const char *const names[NK] = {"linear+gelu_tanh",
                                      "linear+relu",
                                      "add(r,linear)",
                                      "add(linear,r)",
                                      "relu, its input an output too",
                                      "linear+gelu_tanh+mul_scalar",
                                      "add(linear,bias-shaped r)",
                                      "matmul+gelu_tanh",
                                      "x = x + linear(x) in place",
                                      "gpt2 block",
                                      "linear+gelu_tanh+linear, loss sum(y * r)",
                                      "linear+gelu_tanh+linear, the second frozen"};

typedef struct spec {
    int kind;
    bool train;
    sg_tensor *w, *b, *w2, *b2; /* parameters */
} spec;

static sg_tensor *loss_of(sg_tensor *y) { return sg_sum(sg_mul(y, y), 0, NULL, false); }

static sg_status step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    const spec *p = user;
    sg_tensor *x = in[0], *r = in[1], *h = NULL, *y = NULL;
    int nout = 1;
    switch (p->kind) {
    case K_GELU: y = sg_gelu_tanh(sg_linear(x, p->w, p->b)); break;
    case K_RELU: y = sg_relu(sg_linear(x, p->w, p->b)); break;
    case K_ADD_RH: y = sg_add(r, sg_linear(x, p->w, p->b)); break;
    case K_ADD_HR: y = sg_add(sg_linear(x, p->w, p->b), r); break;
    case K_RELU_SEEN:
        h = sg_linear(x, p->w, p->b);
        y = sg_relu(h);
        out[1] = h, nout = 2;
        break;
    case K_GELU_MUL: y = sg_mul_scalar(sg_gelu_tanh(sg_linear(x, p->w, p->b)), 0.5); break;
    case K_ADD_BCAST: y = sg_add(sg_linear(x, p->w, p->b), p->b2); break;
    case K_MATMUL_GELU: y = sg_gelu_tanh(sg_matmul(x, sg_transpose(p->w, 0, 1))); break;
    case K_INPLACE: { /* square w: the result goes back into x */
        sg_status s = sg_copy_(x, sg_add(x, sg_linear(x, p->w2, NULL)));
        out[0] = sg_mul_scalar(x, 1.0);
        return s != SG_OK ? s : out[0] ? SG_OK : sg_ctx_status(c);
    }
    case K_BLOCK: { /* ln, fc + gelu, proj + residual, twice */
        y = x;
        for (int l = 0; l < 2; l++) {
            sg_tensor *n = sg_layer_norm(y, NULL, NULL, 1e-5);
            sg_tensor *f = sg_gelu_tanh(sg_linear(n, p->w, p->b));
            y = sg_add(y, sg_linear(f, p->w2, p->b2));
        }
        break;
    }
    case K_CHAIN:
    case K_CHAIN_FROZEN: { /* the loss's gradient r itself */
        y = sg_linear(sg_gelu_tanh(sg_linear(x, p->w, p->b)), p->w2, p->b2);
        sg_tensor *loss = sg_sum(sg_mul(y, r), 0, NULL, false);
        sg_tensor *params[4] = {p->w, p->b, p->w2, p->b2};
        out[0] = y;
        return loss ? sg_grad(loss, p->kind == K_CHAIN ? 4 : 2, params, out + 1) : sg_ctx_status(c);
    }
    }
    out[0] = y;
    if (!y) return sg_ctx_status(c);
    if (!p->train) return SG_OK;
    /* y feeds a product, as in a model: the epilogue stays the group's last member */
    sg_tensor *z = sg_linear(y, in[2], NULL);
    sg_tensor *params[2] = {p->w, p->b};
    return sg_grad(loss_of(z), 2, params, out + nout);
}

/* The CUDA backend's fusion options (graphs/cuda/cuda_graph.c). */
static void cuda_opts(sg__fuse_opts *o) {
    if (sg__cuda_graph_ops.fuse_opts) {
        sg__cuda_graph_ops.fuse_opts(o, false);
    } else { /* built without the CUDA headers: the same options by hand */
        sg__cgen_cuda_fuse_opts(o, false);
        o->lib_epilogue = true;
    }
}

/* What the marks say, as counts, checking the invariants of each marked
 * group on the way: one epilogue member, its result not in a slot the
 * product reads, of the product's layout, the residual its other input. */
typedef struct marks {
    int gelu, gelu_aux, relu, add, res0, res1, dgelu;
    bool sane;
} marks;

static bool same_layout(const sg__ref *a, const sg__ref *b) {
    bool ok = a->dtype == b->dtype && a->ndim == b->ndim;
    for (int d = 0; ok && d < a->ndim; d++)
        ok = a->shape[d] == b->shape[d] && a->stride[d] == b->stride[d];
    return ok;
}

static marks marks_of(const sg__ir *ir, const sg__fused *f) {
    marks m = {.sane = true};
    for (int k = 0; k < f->ngroups; k++) {
        const sg__group *g = &f->groups[k];
        if (!g->lib_epi) continue;
        m.sane = m.sane && TU_EXPECT(g->kind == SG__G_MATMUL && g->n == 2 && g->anchor == 0);
        if (!m.sane) break;
        const sg__irnode *mm = &ir->nodes[g->g[0].node], *e = &ir->nodes[g->g[1].node];
        const sg__ref *a = &ir->refs[f->alias[mm->out]], *o = &ir->refs[f->alias[e->out]];
        for (int j = 0; j < mm->nin; j++) {
            int r = ir->args[mm->args + j];
            m.sane = m.sane && TU_EXPECT(r < 0 || ir->refs[f->alias[r]].slot != o->slot);
        }
        m.sane = m.sane && TU_EXPECT(same_layout(a, o)) && TU_EXPECT(a->slot != o->slot);
        if (g->lib_epi == SG__EPI_GELU) *(g->lib_aux ? &m.gelu_aux : &m.gelu) += 1;
        if (g->lib_epi == SG__EPI_RELU) m.relu++;
        if (g->lib_epi == SG__EPI_ADD) {
            m.add++;
            *(g->lib_res == 0 ? &m.res0 : &m.res1) += 1;
            int r = ir->args[e->args + g->lib_res];
            m.sane = m.sane && TU_EXPECT(g->g[1].arg_src[g->lib_res] < 0) &&
                     TU_EXPECT(g->g[1].arg_src[1 - g->lib_res] == 0) &&
                     TU_EXPECT(same_layout(&ir->refs[f->alias[r]], o));
        }
        if (g->lib_epi == SG__EPI_DGELU) { /* gelu_tanh_bwd(x, the product) */
            m.dgelu++;
            int x = ir->args[e->args];
            m.sane =
                m.sane && TU_EXPECT(e->op == SG__OP_GELU_TANH_BWD) && TU_EXPECT(g->lib_res == 0) &&
                TU_EXPECT(g->g[1].arg_src[0] < 0) && TU_EXPECT(g->g[1].arg_src[1] == 0) &&
                TU_EXPECT(same_layout(&ir->refs[f->alias[x]], o)) &&
                TU_EXPECT(ir->refs[f->alias[x]].slot != o->slot) &&
                TU_EXPECT(mm->op == SG__OP_MATMUL || mm->nin < 3 || ir->args[mm->args + 2] < 0);
        }
        m.sane = m.sane &&
                 TU_EXPECT(g->lib_epi == SG__EPI_ADD || g->lib_epi == SG__EPI_DGELU ||
                           g->lib_res == -1) &&
                 TU_EXPECT(g->lib_epi == SG__EPI_GELU || !g->lib_aux);
    }
    return m;
}

static void run(int kind, bool train, sg_dtype dt, marks want) {
    int64_t B = 2, T = 8, C = 16, H = 32;
    bool square = kind == K_INPLACE || kind == K_BLOCK || kind >= K_CHAIN;
    int64_t xs[3] = {B, T, C}, rs[3] = {B, T, square ? C : H}, ws[2] = {H, C}, bs[1] = {H},
            w2s[2] = {C, H}, b2s[1] = {kind == K_ADD_BCAST ? H : C}, sq[2] = {C, C},
            zs[2] = {4, square ? C : H};
    spec p = {kind,
              train,
              tu_rand(ctx, dt, 2, ws, -1, 1, NULL),
              tu_rand(ctx, dt, 1, bs, -1, 1, NULL),
              tu_rand(ctx, dt, 2, kind == K_INPLACE ? sq : w2s, -1, 1, NULL),
              tu_rand(ctx, dt, 1, b2s, -1, 1, NULL)};
    if (train) sg_requires_grad_(p.w, true), sg_requires_grad_(p.b, true);
    if (kind == K_CHAIN) sg_requires_grad_(p.w2, true), sg_requires_grad_(p.b2, true);
    sg_tensor *in[3] = {tu_rand(ctx, dt, 3, xs, -1, 1, NULL), tu_rand(ctx, dt, 3, rs, -1, 1, NULL),
                        tu_rand(ctx, dt, 2, zs, -1, 1, NULL)};
    int nout = kind == K_CHAIN ? 5 : (kind == K_RELU_SEEN ? 2 : 1) + (train ? 2 : 0);
    sg_fn *fn = NULL;
    sg_tensor *out[5] = {NULL};
    bool ok =
        TU_EXPECT(sg_compile(ctx, step, &p, 3, nout,
                             &(sg_compile_opts){.mode = SG_MODE_REDUCE_OVERHEAD}, &fn) == SG_OK);
    sg_mark_step_begin(ctx);
    ok = ok && TU_EXPECT(sg_call(fn, in, 3, out, nout) == SG_OK) && TU_EXPECT(fn->ngraphs == 1);
    if (!ok) fprintf(stderr, "  %s\n", sg_last_error(ctx));
    marks got = {0}, cpu = {0};
    if (ok) {
        sg__graph *g = fn->graphs[0];
        sg__fuse_opts fo;
        cuda_opts(&fo);
        sg__fused f;
        ok = TU_EXPECT(fo.lib_epilogue) && TU_EXPECT(sg__fuse(ctx, &g->ir, &fo, &f) == SG_OK);
        if (ok) got = marks_of(&g->ir, &f), sg__fused_free(ctx, &f, &g->ir);
        /* The CPU backend's own fusion marks nothing. */
        sg__fuse_opts co = {.horizontal = true};
        const sg__graph_ops *ops = ctx->gops;
        if (ops && ops->fuse_opts) ops->fuse_opts(&co, false);
        ok =
            ok && TU_EXPECT(!co.lib_epilogue) && TU_EXPECT(sg__fuse(ctx, &g->ir, &co, &f) == SG_OK);
        if (ok) cpu = marks_of(&g->ir, &f), sg__fused_free(ctx, &f, &g->ir);
    }
    ok = ok && got.sane && TU_EXPECT(got.gelu == want.gelu) &&
         TU_EXPECT(got.gelu_aux == want.gelu_aux) && TU_EXPECT(got.relu == want.relu) &&
         TU_EXPECT(got.add == want.add) && TU_EXPECT(got.res0 == want.res0) &&
         TU_EXPECT(got.res1 == want.res1) && TU_EXPECT(got.dgelu == want.dgelu) &&
         TU_EXPECT(cpu.gelu + cpu.gelu_aux + cpu.relu + cpu.add + cpu.dgelu == 0);
    if (!ok)
        fprintf(stderr,
                "  got gelu %d gelu_aux %d relu %d add %d (residual first %d, second %d) "
                "dgelu %d\n",
                got.gelu, got.gelu_aux, got.relu, got.add, got.res0, got.res1, got.dgelu);
    tu_case(ok, "LIB_EPILOGUE(%s,type=%s,%s): gelu %d, gelu+aux %d, relu %d, add %d, dgelu %d",
            names[kind], sg_dtype_name(dt), train ? "train" : "forward", got.gelu, got.gelu_aux,
            got.relu, got.add, got.dgelu);
    sg_clear_error(ctx);
    for (int o = 0; o < nout; o++) sg_release(out[o]);
    sg_fn_destroy(fn);
    sg_release(in[0]), sg_release(in[1]), sg_release(in[2]);
    sg_release(p.w), sg_release(p.b), sg_release(p.w2), sg_release(p.b2);
}

/* The key words of a tune-file pick: epilogue (bias | act << 1 | aux << 3)
 * below 16, beta 0, 1 or 2 (a C of its own). */
static void test_pick_words(void) {
    static const struct {
        int epi, beta;
        bool ok;
    } cases[] = {{0, 0, true},   {7, 0, true},   {15, 2, true}, {5, 1, true},
                 {16, 0, false}, {-1, 0, false}, {1, 3, false}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char line[256];
        snprintf(line, sizeof line,
                 "lt 14 1 0 192 256 128 128 128 192 1 0 0 0 %d %d 256 256 256 256 0 3\n",
                 cases[i].epi, cases[i].beta);
        sg__lt_pick p;
        int used = 0;
        bool parsed = sg__lt_pick_parse(line, &p, &used);
        bool ok = TU_EXPECT(parsed == cases[i].ok) &&
                  (!parsed || (TU_EXPECT(p.key[13] == cases[i].epi) && TU_EXPECT(p.pick == 3)));
        tu_case(ok, "LT_PICK_WORDS(epilogue=%d,beta=%d): %s", cases[i].epi, cases[i].beta,
                parsed ? "parsed" : "refused");
    }
}

int main(void) {
    setenv("SG_CODEGEN", "0", 1); /* capture only: the IR is what matters */
    if (sg_ctx_create(&(sg_ctx_opts){.backend = SG_BACKEND_CPU}, &ctx) != SG_OK) return 1;
    tu_seed(11);
    static const sg_dtype dts[2] = {SG_BF16, SG_F32};
    for (int t = 0; t < 2; t++) {
        sg_dtype dt = dts[t];
        /* f32 keeps its GELU kernel: cuBLASLt's tanh is approximate */
        run(K_GELU, false, dt, dt == SG_F32 ? (marks){0} : (marks){.gelu = 1});
        /* and its gradient after the product that makes g, as DGELU (bf16 only) */
        run(K_GELU, true, dt, dt == SG_F32 ? (marks){0} : (marks){.gelu_aux = 1, .dgelu = 1});
        run(K_RELU, false, dt, (marks){.relu = 1});
        run(K_RELU, true, dt, (marks){.relu = 1});
        run(K_ADD_RH, false, dt, (marks){.add = 1, .res0 = 1});
        run(K_ADD_HR, false, dt, (marks){.add = 1, .res1 = 1});
        run(K_ADD_HR, true, dt, (marks){.add = 1, .res1 = 1});
    }
    run(K_RELU_SEEN, false, SG_F32, (marks){0});
    run(K_GELU_MUL, false, SG_BF16, (marks){0});
    run(K_ADD_BCAST, false, SG_BF16, (marks){0});
    run(K_MATMUL_GELU, false, SG_BF16, (marks){.gelu = 1});
    run(K_INPLACE, false, SG_F32, (marks){0});
    run(K_BLOCK, false, SG_BF16, (marks){.gelu = 2, .add = 2, .res0 = 2});
    /* trained: the pre-activations kept (aux), each GELU's gradient after the product of its
     * g (DGELU), and a third residual add in the backward */
    run(K_BLOCK, true, SG_BF16, (marks){.gelu_aux = 2, .add = 3, .res0 = 3, .dgelu = 2});
    /* both linears trained: the linear's rule gives the second's dW product before its dX
     * product, which is then right before the GELU's gradient (DGELU) */
    run(K_CHAIN, true, SG_BF16, (marks){.gelu_aux = 1, .dgelu = 1});
    run(K_CHAIN_FROZEN, true, SG_BF16, (marks){.gelu_aux = 1, .dgelu = 1});
    test_pick_words();
    sg_ctx_destroy(ctx);
    return tu_finish();
}
