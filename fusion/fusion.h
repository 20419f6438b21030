/* SPDX-License-Identifier: MIT */
/*
 * fusion.h -- the internal header of fusion/: passes over a capture's IR
 * (capture.h: sg__ir) that decide which ops run together in one generated
 * kernel. No backend knowledge here: the result is a list of kernel groups
 * in execution order, each a contiguous run of IR nodes of one of a few
 * shapes of loop, with the refs it reads from memory and the refs it must
 * write back (materialize). Codegen turns each group into source text in
 * one dialect; graphs/ runs the groups.
 *
 * Passes, in order (each small and testable alone):
 *  - dce: drop nodes whose results nothing uses (kept: outputs, writes into
 *    inputs and parameters, and everything those depend on).
 *  - cse: a node equal to an earlier one (op, attributes, input refs) reads
 *    that one's result instead.
 *  - copy forwarding: a same-geometry copy of an internal value written
 *    once into a fresh internal slot (sg_clone) is dropped; reads of it
 *    read the source.
 *  - group: walk the nodes in order and grow the open group while the next
 *    node can join it:
 *      POINTWISE  elementwise nodes over one iteration shape; a value made
 *                 in the group and read back with the same geometry stays
 *                 in registers; views of materialized tensors are folded
 *                 into the loads' index arithmetic, never copied.
 *      REDUCE     pointwise prologue (computing the reduced input), the
 *                 reduction, pointwise epilogue over the reduced shape
 *                 (with rows_inline, then over the input's shape: the
 *                 written-out rms_norm x * rsqrt(mean(x*x) + eps) * w).
 *      ROW        softmax, log_softmax, layer_norm, rms_norm, cross_entropy
 *                 one pass per row, with prologue and epilogue as above.
 *      MATMUL     matmul/linear through the BLAS, then an epilogue over its
 *                 output (bias, activation, residual add, cast) in one loop.
 *      OPAQUE     any other node, run by the backend's eager kernel.
 *  - norm into GEMV (with gemv_rows): a layer_norm/rms_norm ROW group, or a
 *    rows_inline REDUCE group whose sum or mean over the rows feeds an
 *    epilogue over its input (a norm written out of primitives: x *
 *    rsqrt(mean(x*x) + eps) * w), and the MATMUL group that reads its
 *    result become one MATMUL group whose generated kernel normalizes the
 *    rows on chip and then runs the GEMV.
 *  - GEMV pairs (with gemv_rows): a MATMUL group without epilogue and the
 *    next MATMUL group whose anchor reads the same x (SwiGLU's two
 *    projections) become one MATMUL group (sg__group.anchor2) whose kernel
 *    computes both products per output column, then the second group's
 *    epilogue on the pair: silu(x W1) * (x W3) in one kernel.
 *  - GEMV segments (with gemv_rows): bare MATMUL groups (no epilogue; a
 *    pair's two products count as two) whose anchors read the same x (a
 *    decode step's q, k and v projections, each its own weight), the later
 *    ones at most 8 groups after the first and independent of the groups
 *    between (they then run earlier), become one group (sg__group.nseg)
 *    whose kernel's columns run through the products one after another: one
 *    GEMV kernel, the norm before it computed once.
 *  - cache writes into GEMV (with gemv_rows): the index_copy_ groups right
 *    after a MATMUL group that copy part of its result into a tensor no
 *    member touches (a decode step's K and V rows, views of the QKV
 *    product, into the caches at the position) join it as its last members
 *    (sg__group.ncopies): the GEMV's thread that holds an element of the
 *    result also writes it into the cache.
 *  - copies into attention (with attn_copies): a POINTWISE group right
 *    before an ATTENTION whose members each copy exactly its k or v view
 *    into a tensor the attention does not touch (a prefill's K and V into
 *    the cache) joins it (sg__group.ncopies): the attention kernel writes
 *    them from the rows it reads.
 *  - cross_entropy with its gradient (with xent_pairs): a lone
 *    CROSS_ENTROPY_BWD group and the lone CROSS_ENTROPY group before it of
 *    the same logits and targets, nothing between them touching the loss
 *    or writing the logits or targets (a training step's loss and its
 *    first backward node): the forward joins the gradient's group as its
 *    second member (sg__group.xent), run where the gradient runs by one
 *    kernel that also writes the loss; a pair that cannot join says why
 *    (sg__fused.xent_why, a perf hint).
 *  - a norm's gradient with the column sum of it (with norm_sums): a lone
 *    sum group (no prologue, no epilogue) over every leading dim of exactly
 *    the input gradient a lone NORM_BWD group writes (its elements in their
 *    order, through any reshape or narrow of the packed result), nothing
 *    between them writing that gradient or touching the sum's result (a
 *    pre-norm block's residual gradient and the bias gradient of the
 *    linear that adds into it): the sum joins the NORM_BWD's group as its
 *    second member (sg__group.nbsum), computed by the norm's kernel from
 *    the values it stores; a sum of a NORM_BWD's result that cannot join
 *    says why (sg__fused.nbsum_why, a perf hint).
 *  - epilogues into the BLAS (with lib_epilogue): a MATMUL group whose
 *    epilogue is one gelu_tanh, relu, residual add or gelu_tanh_bwd is marked
 *    (sg__group.lib_epi) for a library call that computes it itself.
 *  - argmax into GEMV (with gemv_rows): an argmax group (no prologue, no
 *    epilogue) over the rows of the result of the MATMUL group right before
 *    it, which has no epilogue, joins it as its last member
 *    (sg__group.argmax): a decode step's greedy token from the LM head's
 *    logits in the GEMV's kernel; a small POINTWISE group right after it
 *    that reads nothing else the GEMV writes and writes nothing it reads
 *    joins too (sg__group.post: the token and position updates).
 *  - horizontal: consecutive POINTWISE groups with no data between them
 *    (an optimizer's per-parameter updates) become one MULTI group: one
 *    kernel with one loop per member; with horizontal_data, so do
 *    consecutive independent index_copy_ groups (OPAQUE members: a decode
 *    step's K and V cache writes) for a backend that generates them.
 *  - constants (unless no_fold): a POINTWISE group whose every member
 *    depends on no input, parameter or RNG state (fills and their pointwise
 *    functions, each written once), or an OPAQUE arange, leaves the kernel
 *    list for sg__fused.consts: graphs/ computes those once when it builds
 *    the plan and keeps them in a pool block of their own, so replays only
 *    read them. A constant fused into a group with other work stays there
 *    (it costs nothing in registers).
 *  - chains (with chain): consecutive small kernels that the backend can
 *    run in one block each (a decode step's rotation, its concat and its
 *    K/V cache writes; elements, not bandwidth, set their time) become one
 *    MULTI group with `chain` set: one kernel running them in order with a
 *    barrier between them, so dependent ones may join.
 *  - sums (with multi_sums): consecutive independent full reductions (a
 *    sum or mean to one value each, with its prologue and its epilogue over
 *    the one value: a clip's squared norms, the losses of several heads)
 *    become one MULTI group with `sums` set: one kernel whose blocks each
 *    take a chunk of one member, the last block finishing every member's
 *    sum in a fixed order.
 *  - updates by readiness (with multi_ready): a multi-tensor update whose
 *    members wait for different groups (an optimizer without a clip: each
 *    parameter's update waits for its own gradient, the last layers' first)
 *    is cut by readiness: the members ready before the last, in at most eight
 *    tiers, each moved as one group to just after its members' last
 *    conflict, where a backend with streams runs it beside the rest of the
 *    backward; the single-value groups it reads
 *    (bias corrections from the step count) move to just after theirs.
 *    Group order is kernel order, and the pool's lifetimes follow it.
 * SG_DISABLE_FUSION=1 makes every node its own group.
 */
#ifndef SG_FUSION_H
#define SG_FUSION_H

#include "../capture/capture.h"

typedef enum sg__gkind {
    SG__G_POINTWISE,
    SG__G_REDUCE,
    SG__G_ROW,
    SG__G_MATMUL,
    SG__G_OPAQUE,
    SG__G_MULTI
} sg__gkind;

/* How a node of a group gets each input and what it does with its result. */
typedef struct sg__gnode {
    int node;       /* IR node index */
    int arg_src[4]; /* per input: -1 load from memory (the IR ref), else the
                       group-local index of the gnode whose value it reuses */
    bool store;     /* its result is written to memory (the IR out ref) */
} sg__gnode;

#define SG__GEMV_SEGS 4 /* products of one x in one GEMV kernel, at most */

typedef struct sg__group {
    sg__gkind kind;
    int first, last; /* the run of IR nodes [first, last] it covers */
    sg__gnode *g;    /* the nodes it keeps after dce/cse, in order */
    int n;
    int anchor;      /* index into g of the REDUCE/ROW/MATMUL node, -1 else */
    int ndim;        /* the iteration shape of a POINTWISE group (or of the */
    int64_t shape[SG_MAX_DIMS]; /* epilogue of an anchored group) */
    int *members;    /* MULTI: indices into sg__fused.parts, in run order */
    int nmembers;
    bool chain;      /* MULTI: the members depend on one another (a chain of
                        sg__fuse_opts.chain): they run in order, each after
                        the one before it has finished */
    bool early;      /* an update's members moved before the rest by
                        readiness (sg__fuse_opts.multi_ready) */
    bool sums;       /* MULTI: the members are independent full reductions
                        (REDUCE groups of one sum or mean each, with their
                        prologue and epilogue: sg__fuse_opts.multi_sums) */
    /* REDUCE/ROW groups that sg__fuse_opts.rows_inline gives to the backend's
     * generated code: the anchor works along rows of its input (nrows rows
     * of rowlen elements, row r being elements [r * rowlen, (r + 1) * rowlen)
     * of a row-major walk of the input's shape). A sum or mean may also keep
     * inner dims: then each row is rowlen runs of ncols consecutive elements
     * (the input walks as (nrows, rowlen, ncols), the output as (nrows,
     * ncols): a column sum); ncols is 1 for every other anchor. */
    bool rows_inline;
    int64_t nrows, rowlen, ncols;
    const char *lib_why; /* with rows_inline asked for: why this REDUCE or ROW
                            anchor runs as the backend's library kernel
                            (static text), NULL when generated code runs it */
    int bcast; /* REDUCE: index into g of the first epilogue member over the
                  anchor's input shape (it reads the reduced values broadcast
                  along the rows); 0 when none */
    /* MATMUL groups that sg__fuse_opts.gemv_rows merged with the norm before
     * them: members [0, anchor) are that rows_inline ROW group (its prologue,
     * the layer_norm/rms_norm at index row_anchor, its epilogue) or REDUCE
     * group (its prologue, the sum or mean at row_anchor, its epilogue over
     * the reduced shape row_ndim/row_shape, and from row_bcast on, its
     * epilogue over the input), a value of which the anchor reads as x
     * (arg_src[0]); nrows rows of rowlen. row_bcast is 0 for a ROW group. */
    bool norm_rows;
    int row_anchor, row_bcast, row_ndim;
    int64_t row_shape[SG_MAX_DIMS];
    /* MATMUL groups that sg__fuse_opts.gemv_rows merged with the matmul
     * group after them (same x, no epilogue between): the index into g of
     * the second matmul, right after the anchor, 0 when none. Members after
     * it are the epilogue of both products (reading either from a
     * register); both results are stored. */
    int anchor2;
    /* MATMUL groups that sg__fuse_opts.gemv_rows merged with the bare
     * matmul groups after them on the same x (Q, K and V projected apart):
     * the indices into g of the products (each a member's anchor, seg[0]
     * the group's own), nseg of them, 0 when none; every member is one of
     * them (no epilogue), each result is stored, and the kernel's output
     * columns run through the products one after another. */
    int nseg;
    int seg[SG__GEMV_SEGS];
    /* MATMUL groups that sg__fuse_opts.gemv_rows merged with the index_copy_
     * groups after them: the last ncopies members are those index_copy_
     * nodes, each copying a view of the anchor's result (src, in the
     * anchor's output slot) into dst at idx; 0 when none. OPAQUE attention
     * groups that sg__fuse_opts.attn_copies merged with the copy group
     * before them: the last ncopies members are COPY nodes of exactly the
     * attention's k or v view into a tensor the attention does not touch
     * (a prefill's K and V into the cache), which the attention kernel
     * writes as it goes. */
    int ncopies;
    /* MATMUL groups that sg__fuse_opts.lib_epilogue hands whole to the BLAS
     * call: the group is its anchor and one epilogue member (g[1]) that the
     * library computes in its own epilogue (sg__lib_epi), the member's
     * result written by the call; lib_res is the member's input index of
     * the residual (SG__EPI_ADD) or of the GELU's input (SG__EPI_DGELU), -1
     * otherwise, and lib_aux says that the
     * anchor's value is read outside the group too, so that the call also
     * writes it (SG__EPI_GELU only). The backend may still run the group as
     * the product and then its epilogue kernel (the library refused). */
    int lib_epi;
    int lib_res;
    bool lib_aux;
    /* MATMUL groups that sg__fuse_opts.gemv_rows merged with the argmax
     * group after them: the index into g of that argmax (the last member),
     * which reads the anchor's value along its rows; 0 when none. */
    int argmax;
    /* With argmax: the index into g of the first member of a small
     * pointwise group merged after it (a decode step's token and position
     * updates), which one thread of the GEMV's last block runs over
     * post_shape once the argmax is stored; 0 when none. */
    int post, post_ndim;
    int64_t post_shape[SG_MAX_DIMS];
    /* A CROSS_ENTROPY_BWD group (g[0]) that sg__fuse_opts.xent_pairs merged
     * with the CROSS_ENTROPY of the same logits and targets before it: the
     * index into g of that forward node (1), which the backend computes in
     * the gradient's kernel; 0 when none. */
    int xent;
    /* A NORM_BWD group (g[0]) that sg__fuse_opts.norm_sums merged with the
     * column sum of its input gradient after it: the index into g of that
     * sum (1), which the backend computes in the norm's kernel; 0 when none. */
    int nbsum;
} sg__group;

/* What a MATMUL group's one epilogue member is, for sg__group.lib_epi:
 * gelu_tanh (the tanh form BLAS epilogues compute), relu, an add of a
 * residual of the result's dtype, shape and strides (beta = 1 with C the
 * residual), or gelu_tanh_bwd with the product as its g and a GELU input
 * of the result's layout (the BLAS's GELU-gradient epilogue, the input
 * read as its aux). */
typedef enum sg__lib_epi {
    SG__EPI_NONE,
    SG__EPI_GELU,
    SG__EPI_RELU,
    SG__EPI_ADD,
    SG__EPI_DGELU
} sg__lib_epi;

typedef struct sg__fused {
    sg__group *groups; /* the kernels, in execution order */
    int ngroups;
    sg__group *parts;  /* the POINTWISE groups that MULTI kernels run */
    int nparts;
    int cap_groups, cap_parts;
    bool *dead; /* per IR node: removed by dce, cse or copy forwarding */
    /* Constant folding: the groups computed once, when the plan is built
     * (in order, each member by the backend's eager kernel, every member's
     * result kept in memory), not in any replay; folded marks their nodes. */
    sg__group *consts;
    int nconsts, cap_consts;
    bool *folded; /* per IR node, NULL when nothing was folded */
    int *alias; /* per IR ref: cse maps a ref to an equal earlier one (copy forwarding:
                   to the copy's source), or itself */
    /* With xent_pairs: the first cross_entropy (IR node xent_fwd) and
     * gradient of it (xent_bwd) that stayed two kernels, and why (static
     * text); NULL when every such pair merged. */
    const char *xent_why;
    int xent_fwd, xent_bwd;
    /* With norm_sums: the first column sum (IR node nbsum_sum) of a
     * NORM_BWD's result (nbsum_norm) that stayed a kernel of its own, and
     * why (static text); NULL when every such sum merged. */
    const char *nbsum_why;
    int nbsum_norm, nbsum_sum;
} sg__fused;

typedef struct sg__fuse_opts {
    bool disable;    /* one group per node (SG_DISABLE_FUSION=1) */
    bool horizontal; /* merge independent pointwise groups */
    bool no_prologue; /* REDUCE/ROW groups take no pointwise prologue: a backend
                         whose anchors run as library kernels reading memory
                         (CUDA) needs the prologue as its own POINTWISE group */
    bool rows_inline; /* the backend computes row-like anchors in generated code:
                         softmax/log_softmax over the last dim, layer_norm,
                         rms_norm, argmax and var whose reduced dims are
                         the innermost, and sum/mean over a run of dims (rows
                         or columns: sg__group.ncols). Those take a
                         prologue even with no_prologue, a row sum/mean's
                         epilogue may go on over its input's shape
                         (sg__group.bcast), and no prologue value is
                         stored for a library call; the other anchors get
                         sg__group.lib_why */
    bool per_op;      /* cse and dce, then one group per surviving node (the
                         aot_eager backend of sg_compile_opts.backend_name) */
    bool no_epilogue; /* no pointwise epilogue after a REDUCE/ROW/MATMUL anchor
                         (sg_compile_opts.epilogue_fusion = SG_FLAG_FALSE) */
    bool horizontal_data; /* with horizontal: consecutive independent OPAQUE
                             index_copy_ groups that the backend generates
                             (idx and src outside dst) merge into one MULTI */
    /* The backend computes a matmul group in generated code that also
     * computes the rows of a norm before it (a GEMV reading its few rows of
     * x from on-chip memory): a rows_inline layer_norm/rms_norm ROW group
     * whose result only the next MATMUL group's anchor reads as x merges
     * into it (sg__group.norm_rows) when this says the merged group is one
     * it generates; so does a pair of matmul groups reading the same x
     * (sg__group.anchor2) when this takes the merged group, so do the
     * index_copy_ groups of a view of a matmul's result right after it
     * (sg__group.ncopies), and so does an argmax over its rows
     * (sg__group.argmax). NULL: no such merge. */
    bool (*gemv_rows)(const sg__ir *ir, const int *alias, const sg__group *merged);
    /* The backend generates group g (of f, after horizontal: a MULTI's parts
     * are in f) as loops that one block of its threads may run alone, in
     * order with others: runs of two or more such groups become one chain
     * (sg__group.chain). NULL: no chains. */
    bool (*chain)(const sg__ir *ir, const sg__fused *f, const sg__group *g);
    /* The backend's BLAS can take a MATMUL group's epilogue into the call
     * (cuBLASLt's GELU/RELU epilogues, beta = 1 with a separate C): set
     * sg__group.lib_epi where the group allows it. */
    bool lib_epilogue;
    /* The backend's attention kernel also copies its k and v inputs: a
     * POINTWISE group right before an ATTENTION that only copies those views
     * joins it (sg__group.ncopies). */
    bool attn_copies;
    /* The backend computes a cross_entropy's loss in the kernel of its
     * gradient: the pair merges (sg__group.xent). */
    bool xent_pairs;
    /* The backend's NORM_BWD kernel also writes the column sum of its input
     * gradient: such a sum merges into the norm's group (sg__group.nbsum). */
    bool norm_sums;
    /* The backend generates a MULTI of full reductions (sg__group.sums):
     * consecutive independent rows_inline REDUCE groups of one sum or mean
     * each, with no epilogue over their input's shape, merge into one. */
    bool multi_sums;
    /* A multi-tensor update's members ready before the last (no clip: each
     * parameter's gradient) move, in tiers of one group each, to just after
     * what they wait for, beside the rest of the backward (fuse.c multi_ready). */
    bool multi_ready;
    /* No constant folding (SG_CONST_FOLD=0): constant groups replay. */
    bool no_fold;
} sg__fuse_opts;

/* Row ops written out of primitives (softmax, log_softmax, layer_norm)
 * rewritten in ir as the op itself (canon.c), before fusion; *done gets how
 * many. SG_ERR_OOM when host memory runs out (ir then holds the rewrites
 * made so far, each whole). */
/* The same elements of one slot in the same order (a size-1 dim's stride
 * aside); false when either is NULL. */
static inline bool sg__same_geom(const sg__ref *a, const sg__ref *b) {
    if (!a || !b || a->slot != b->slot || a->dtype != b->dtype || a->ndim != b->ndim ||
        a->offset != b->offset)
        return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d] || (a->shape[d] > 1 && a->stride[d] != b->stride[d]))
            return false;
    return true;
}

SG__HIDDEN sg_status sg__canon(sg_ctx *ctx, sg__ir *ir, int *done);
SG__HIDDEN sg_status sg__fuse(sg_ctx *ctx, const sg__ir *ir, const sg__fuse_opts *opts,
                              sg__fused *out);
SG__HIDDEN void sg__fused_free(sg_ctx *ctx, sg__fused *f, const sg__ir *ir);
/* The group's fused op names joined by '_' ("sin_mul_scalar_add_scalar_tanh"). */
SG__HIDDEN const char *sg__group_name(const sg__ir *ir, const sg__group *g, char *buf, size_t size);

#endif /* SG_FUSION_H */
