/* SPDX-License-Identifier: MIT */
/*
 * train.c -- the GPT-2 training and evaluation steps (see train.h): what
 * they compute, the optimizers, and the learning-rate schedule.
 */
#include "train.h"

#include <math.h>
#include <stdlib.h>

/* inputs, targets (B, T) -> the mean cross-entropy of every position. */
static sg_tensor *loss_of(gpt2 *g, sg_tensor *inputs, sg_tensor *targets) {
    int64_t rows[2] = {-1, g->cfg.vocab}, flat = -1;
    sg_tensor *logits = sg_reshape(gpt2_forward(g, inputs), 2, rows);
    return sg_cross_entropy(logits, sg_reshape(targets, 1, &flat));
}

/* Data parallel: the mean of every rank's gradients, as one all-reduce of
 * one flat bucket (DDP's), whose slices become the gradients. */
static sg_status mean_grads(gpt2_trainer *t, sg_tensor **grads) {
    int64_t flat = -1, off = 0;
    sg_tensor **cols = calloc((size_t)t->n, sizeof *cols);
    if (!cols) return SG_ERR_OOM;
    for (int k = 0; k < t->n; k++) cols[k] = sg_reshape(grads[k], 1, &flat);
    sg_tensor *bucket = sg_concat(t->n, cols, 0);
    free(cols);
    sg_status st = sg_all_reduce_(t->opts.comm, bucket, SG_REDUCE_MEAN);
    for (int k = 0; st == SG_OK && k < t->n; k++) {
        int64_t shape[SG_MAX_DIMS], n = sg_tensor_numel(grads[k]);
        int nd = sg_tensor_ndim(grads[k]);
        sg_tensor_shape(grads[k], shape);
        grads[k] = sg_reshape(sg_narrow(bucket, 0, off, n), nd, shape);
        off += n;
        if (!grads[k]) st = SG_ERR_SHAPE;
    }
    return st;
}

static sg_status train_step(sg_ctx *ctx, sg_tensor *const *in, sg_tensor **out, void *user) {
    gpt2_trainer *t = user;
    sg_tensor *loss = loss_of(t->g, in[0], in[1]);
    /* Without output_grads the gradients stay inside the step; t->out + 1
     * is room no output of the call uses then. */
    sg_tensor **grads = t->opts.output_grads ? out + 1 : t->out + 1;
    sg_status st = loss ? sg_grad(loss, t->n, t->params, grads) : sg_ctx_status(ctx);
    sg_set_grad_enabled(ctx, false);
    if (st == SG_OK && t->opts.comm) {
        st = mean_grads(t, grads);
        loss = sg_all_reduce(t->opts.comm, loss, SG_REDUCE_MEAN);
    }
    /* Gradients the caller does not see are clipped inside AdamW's update
     * (same values, one pass over them fewer); output ones in place. */
    sg_tensor *coef = NULL;
    if (st == SG_OK && t->opts.grad_clip > 0 && t->opts.output_grads)
        st = sg_clip_grad_norm_(t->n, grads, t->opts.grad_clip, NULL);
    else if (st == SG_OK && t->opts.grad_clip > 0)
        st = sg_clip_grad_norm_coef(t->n, grads, t->opts.grad_clip, &coef, NULL);
    for (int k = 0; st == SG_OK && k < t->n; k++) t->sorted[t->n + k] = grads[t->order[k]];
    if (st == SG_OK) st = sg_optim_step_scaled(t->opt[0], t->sorted + t->n, coef);
    if (st == SG_OK) st = sg_optim_step_scaled(t->opt[1], t->sorted + t->n + t->nmat, coef);
    sg_set_grad_enabled(ctx, true);
    out[0] = loss;
    return st;
}

static sg_status eval_step(sg_ctx *ctx, sg_tensor *const *in, sg_tensor **out, void *user) {
    gpt2_trainer *t = user;
    sg_set_grad_enabled(ctx, false);
    out[0] = loss_of(t->g, in[0], in[1]);
    if (t->opts.comm) out[0] = sg_all_reduce(t->opts.comm, out[0], SG_REDUCE_MEAN);
    sg_set_grad_enabled(ctx, true);
    return out[0] ? SG_OK : sg_ctx_status(ctx);
}

sg_status gpt2_trainer_create(gpt2 *g, const gpt2_train_opts *o, gpt2_trainer **out) {
    if (!g) return SG_ERR_INVALID_ARG;
    gpt2_trainer *t = calloc(1, sizeof *t);
    if (!t) return SG_ERR_OOM;
    t->g = g;
    t->opts = o ? *o : (gpt2_train_opts){0};
    t->n = (int)gpt2_num_params(g);
    t->params = calloc((size_t)t->n, sizeof *t->params);
    t->out = calloc((size_t)t->n + 1, sizeof *t->out);
    t->order = calloc((size_t)t->n, sizeof *t->order);
    t->sorted = calloc(2 * (size_t)t->n, sizeof *t->sorted);
    sg_status st = t->params && t->out && t->order && t->sorted ? SG_OK : SG_ERR_OOM;
    if (st == SG_OK) gpt2_params(g, t->params);
    for (int i = 0; i < t->n && st == SG_OK; i++) st = sg_requires_grad_(t->params[i], true);
    /* The matrices first (weight decay), then the rest. */
    for (int pass = 0, k = 0; pass < 2 && st == SG_OK; pass++)
        for (int i = 0; i < t->n; i++)
            if ((sg_tensor_ndim(t->params[i]) == 2) == (pass == 0)) {
                t->order[k] = i;
                t->sorted[k++] = t->params[i];
                t->nmat += pass == 0;
            }
    /* llm.c's AdamW: betas 0.9/0.95, eps 1e-8; lr is set per step. */
    sg_adamw_opts ao = {.lr = 1e-4,
                        .beta1 = 0.9,
                        .beta2 = 0.95,
                        .eps = 1e-8,
                        .weight_decay = t->opts.weight_decay > 0 ? t->opts.weight_decay : 1e-30,
                        .master_weights = t->opts.master_weights};
    if (st == SG_OK) st = sg_adamw_create(g->ctx, t->nmat, t->sorted, &ao, &t->opt[0]);
    ao.weight_decay = 1e-30; /* sg_adamw_opts' zero means torch's default */
    if (st == SG_OK)
        st = sg_adamw_create(g->ctx, t->n - t->nmat, t->sorted + t->nmat, &ao, &t->opt[1]);
    sg_compile_opts co = {.mode = t->opts.mode, .fullgraph = t->opts.mode != SG_MODE_EAGER};
    co.name = "gpt2_train";
    int nout = 1 + (t->opts.output_grads ? t->n : 0);
    if (st == SG_OK) st = sg_compile(g->ctx, train_step, t, 2, nout, &co, &t->train_fn);
    co.name = "gpt2_eval";
    if (st == SG_OK) st = sg_compile(g->ctx, eval_step, t, 2, 1, &co, &t->eval_fn);
    if (st != SG_OK) {
        gpt2_trainer_destroy(t);
        return st;
    }
    *out = t;
    return SG_OK;
}

sg_status gpt2_trainer_step(gpt2_trainer *t, sg_tensor *inputs, sg_tensor *targets, double lr,
                            double *loss, sg_tensor **grads) {
    sg_tensor *in[2] = {inputs, targets}, **out = t->out;
    int nout = 1 + (t->opts.output_grads ? t->n : 0);
    sg_status st = sg_fill_(sg_optim_lr(t->opt[0]), lr);
    if (st == SG_OK) st = sg_fill_(sg_optim_lr(t->opt[1]), lr);
    if (st == SG_OK) st = sg_mark_step_begin(t->g->ctx);
    if (st == SG_OK) st = sg_call(t->train_fn, in, 2, out, nout);
    if (st == SG_OK && t->opts.comm) st = sg_comm_synchronize(t->opts.comm);
    if (st == SG_OK && loss) st = sg_item(out[0], loss);
    for (int i = 0; st == SG_OK && grads && i < nout - 1; i++) grads[i] = out[1 + i];
    return st;
}

sg_status gpt2_trainer_eval(gpt2_trainer *t, sg_tensor *inputs, sg_tensor *targets, double *loss) {
    sg_tensor *in[2] = {inputs, targets}, *out;
    sg_status st = sg_mark_step_begin(t->g->ctx);
    if (st == SG_OK) st = sg_call(t->eval_fn, in, 2, &out, 1);
    if (st == SG_OK && t->opts.comm) st = sg_comm_synchronize(t->opts.comm);
    return st == SG_OK ? sg_item(out, loss) : st;
}

void gpt2_trainer_destroy(gpt2_trainer *t) {
    if (!t) return;
    sg_fn_destroy(t->train_fn);
    sg_fn_destroy(t->eval_fn);
    sg_optim_destroy(t->opt[0]);
    sg_optim_destroy(t->opt[1]);
    free(t->params);
    free(t->order);
    free(t->sorted);
    free(t->out);
    free(t);
}

double gpt2_lr_at(double max_lr, int64_t step, int64_t warmup, int64_t total, double final_frac) {
    if (step < warmup) return max_lr * (double)(step + 1) / (double)warmup;
    double min_lr = max_lr * final_frac;
    if (total <= warmup) return max_lr;
    double r = (double)(step - warmup) / (double)(total - warmup);
    if (r > 1) r = 1;
    return min_lr + 0.5 * (1.0 + cos(3.14159265358979323846 * r)) * (max_lr - min_lr);
}
