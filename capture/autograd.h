/* SPDX-License-Identifier: MIT */
/*
 * autograd.h -- the internal header shared by capture/autograd.c (the
 * backward graph, its lifetimes and sg_grad's walk) and capture/grad_rules.c
 * (the gradient of every differentiable op, written with the op
 * front-ends).
 *
 * Every tensor that needs a gradient points at a backward node (grad_fn):
 * a leaf's own node (made by sg_requires_grad_), or the node of the op or
 * view that made it. A node holds a reference to the node of each input
 * (its edges), the geometry of each input, and held handles over the bytes
 * its backward reads (inputs or its output), with their storages' versions
 * at the time, so that sg_grad can tell when an in-place op wrote them
 * since. Nodes are reference counted by the tensors they made and by the
 * nodes that consume those: releasing the outputs of a forward frees its
 * backward graph, and there is no global tape.
 */
#ifndef SG_AUTOGRAD_H
#define SG_AUTOGRAD_H

#include "capture.h"

#define SG__GK_LEAF (-1) /* a tensor given sg_requires_grad_ */
#define SG__GK_VIEW (-2) /* a view; gnode.view says which kind */

/* The dtype and shape of a tensor (ndim -1: an optional input left out). */
typedef struct sg__gmeta {
    sg_dtype dtype;
    int ndim;
    int64_t shape[SG_MAX_DIMS];
} sg__gmeta;

typedef struct sg__gnode {
    int refs;
    int op; /* an sg__op, SG__GK_LEAF or SG__GK_VIEW */
    sg__view_kind view;
    double f[3];
    int64_t i[3];
    uint32_t mask;
    int64_t info[SG_MAX_DIMS]; /* views: the permutation, or {dim, start, step} */
    int nin;
    sg__gmeta outm;
    sg__gmeta *in;           /* nin */
    struct sg__gnode **next; /* nin: the node of each input; NULL: no gradient */
    sg_tensor **saved;       /* nin: held inputs the backward reads, else NULL */
    uint32_t *ver;           /* nin: their storages' versions when saved */
    sg_tensor *out;          /* the held output, when the backward reads it */
    uint32_t out_ver;
    size_t bytes; /* the size of this block */
    /* sg_grad's bookkeeping, valid while grad_epoch matches */
    uint32_t epoch, target_epoch;
    bool needed;
    sg_tensor *grad; /* the gradient of the output gathered so far */
    struct sg__gpart *parts; /* gradients of slices of the output, not yet placed */
    int nparts, partcap;
} sg__gnode;

/* The gradient of one slice view of a node's output (its {dim, start,
 * step}): sg_grad gathers these per node and places them in one tensor of
 * the output's shape when the node's backward runs (autograd.c settle). */
typedef struct sg__gpart {
    sg_tensor *g;
    int dim;
    int64_t start, step;
} sg__gpart;

/* What one backward rule sees: g, the gradient of the node's output, and
 * the saved tensors; it sets gi[k] for the inputs with want[k] to a
 * gradient of the output's shape (broadcast) or of the input's; the caller
 * sums broadcast dims away and casts to the input's dtype. acc[k] is the
 * gradient gathered so far for input k (NULL when none, or when another
 * input of the node has the same one): a rule that adds it into gi[k]
 * itself (the norms' kernel, the residual's gradient) sets took[k], and
 * gi[k] then replaces the gathered gradient instead of being added to it. */
typedef struct sg__bw {
    sg_ctx *ctx;
    const sg__gnode *n;
    sg_tensor *g;
    sg_tensor *out;
    sg_tensor **x; /* n->saved */
    bool *want;
    sg_tensor **gi;
    sg_tensor **acc;
    bool *took;
} sg__bw;

/* Which inputs' bytes (and whether the output's) op's backward reads. */
SG__HIDDEN bool sg__grad_saves_input(int op, int k);
SG__HIDDEN bool sg__grad_saves_output(int op);
/* Whether op's rule may take input 0's gathered gradient (sg__bw.acc). */
SG__HIDDEN bool sg__grad_takes_acc(int op);
/* Whether op has a gradient at all (comparisons, argmax, fills do not). */
SG__HIDDEN bool sg__grad_differentiable(int op);
/* Run the rule of b->n; SG_OK with b->gi set, or the failing status. */
SG__HIDDEN sg_status sg__grad_rule(sg__bw *b);

#endif /* SG_AUTOGRAD_H */
