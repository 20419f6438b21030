/* SPDX-License-Identifier: MIT */
/*
 * train.h -- GPT-2 training over the public stepgraph API: one compiled
 * step runs the forward over (B, T) tokens with every position's logits,
 * the cross-entropy against the targets, sg_grad over every parameter,
 * optionally sg_clip_grad_norm_, and AdamW (sg_optim_step: as llm.c, weight
 * decay applies to the four weight matrices and the two embeddings only, so
 * there are two optimizers, with and without it); a second,
 * forward-only compiled step gives the validation loss. The learning rate
 * is a tensor of the optimizer, set between steps, so a schedule never
 * recaptures. Also llm.c's schedule: linear warmup, then cosine decay.
 */
#ifndef GPT2_TRAIN_H
#define GPT2_TRAIN_H

#include "model.h"

typedef struct gpt2_train_opts {
    sg_mode mode;        /* of both steps (SG_MODE_DEFAULT when zero) */
    double weight_decay; /* AdamW's, on the 2-d parameters (0: 0, unlike sg_adamw_opts) */
    double grad_clip;    /* clip the global grad norm to this; 0: no clipping */
    bool master_weights; /* keep f32 copies of bf16/f16 parameters in AdamW */
    bool output_grads;   /* the step also returns every gradient (after clipping) */
    sg_comm *comm;       /* data parallel: each rank trains on its shard of the batch, and the
                            gradients (one bucket) and the losses are all-reduced (mean) inside
                            the step, before clipping and AdamW; NULL: one process */
} gpt2_train_opts;

typedef struct gpt2_trainer {
    gpt2 *g;
    gpt2_train_opts opts;
    int n;              /* parameters */
    sg_tensor **params; /* gpt2_params order */
    sg_optim *opt[2];   /* AdamW over the 2-d parameters (decayed), and over the rest */
    int nmat;           /* 2-d parameters */
    int *order;         /* parameter indices, the 2-d ones first */
    sg_tensor **sorted; /* 2n: the parameters in that order, then room for their grads */
    sg_fn *train_fn;    /* in: inputs, targets (B, T) i64; out: loss [, grads...] */
    sg_fn *eval_fn;     /* in: inputs, targets; out: loss */
    sg_tensor **out;    /* room for the train step's outputs (1 + n) */
} gpt2_trainer;

/* Mark g's parameters as requiring gradients, make AdamW over them and
 * compile both steps (nothing runs yet). o may be NULL (defaults). */
sg_status gpt2_trainer_create(gpt2 *g, const gpt2_train_opts *o, gpt2_trainer **out);
/*
 * One training step at learning rate lr on inputs and targets ((B, T) i64
 * tensors of g's context): the parameters are updated in place. *loss gets
 * the loss before the update (read to the host, which waits for the step);
 * loss NULL reads nothing and waits for nothing (the loss tensor is then
 * t->out[0], valid until the next call). When grads is not NULL
 * (and output_grads was set), grads gets the step's n gradient tensors
 * (outputs of the step: valid until the next call).
 */
sg_status gpt2_trainer_step(gpt2_trainer *t, sg_tensor *inputs, sg_tensor *targets, double lr,
                            double *loss, sg_tensor **grads);
/* The loss on inputs and targets without training. */
sg_status gpt2_trainer_eval(gpt2_trainer *t, sg_tensor *inputs, sg_tensor *targets, double *loss);
/* Free the steps and the optimizer; the model stays. NULL does nothing. */
void gpt2_trainer_destroy(gpt2_trainer *t);

/* llm.c's schedule for step (0-based) of total: lr rises linearly over
 * warmup steps to max_lr, then falls along a cosine towards max_lr *
 * final_frac, which it would reach at step total. */
double gpt2_lr_at(double max_lr, int64_t step, int64_t warmup, int64_t total, double final_frac);

#endif /* GPT2_TRAIN_H */
