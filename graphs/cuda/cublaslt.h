/* SPDX-License-Identifier: MIT */
/*
 * cublaslt.h -- the CUDA matmul family's internal header: how a MATMUL or
 * LINEAR node becomes either cuBLASLt calls or launches of the GEMV kernel
 * (graphs/cuda/k_matmul.cu), and the cuBLASLt loader (cublaslt.c).
 *
 * The plan (cuda_matmul.c) is plain C over shapes and strides, with no CUDA
 * types, so that tests can check the mapping without a device:
 *
 *   C[b] (M x N) = A[b] (M x K) @ B[b] (K x N)   row-major, batch b
 *
 * is, in cuBLASLt's column-major terms, C^T = B^T A^T: cuBLASLt's A is our
 * B, its B is our A, m = N, n = M. A row-major operand (unit column stride)
 * is then read with CUBLAS_OP_N; a transposed one (unit row stride, e.g.
 * LINEAR's w) with CUBLAS_OP_T; anything else is packed first.
 */
#ifndef SG_CUDA_CUBLASLT_H
#define SG_CUDA_CUBLASLT_H

#include "exec.h"

/* ------------------------------------------------------------ the plan */

/* One operand as a matrix: row and column strides in elements, and its
 * stride along each batch dim of the problem (0 where it is broadcast). */
typedef struct sg__mm_mat {
    int64_t rs, cs;
    int64_t bs[SG_MAX_DIMS];
} sg__mm_mat;

/*
 * A node's product, after batch dims that B does not step along are folded
 * into M, and adjacent batch dims that all three operands step through
 * evenly are merged; the last batch dim (if any) is the strided batch of one
 * library call and the others are looped over. copy_a / copy_b: the operand
 * is packed into contiguous scratch first (its strides here are the
 * packed ones); copy_c: the result goes to contiguous scratch and is copied
 * into the output afterwards.
 */
typedef struct sg__mm_plan {
    int64_t M, N, K;
    int nb;
    int64_t bshape[SG_MAX_DIMS];
    sg__mm_mat A, B, C;
    bool copy_a, copy_b, copy_c;
    bool bias; /* LINEAR with a bias */
} sg__mm_plan;

SG__HIDDEN void sg__mm_plan_make(const sg__node *n, sg__mm_plan *p);

/* One cuBLASLt matmul in its own column-major terms:
 * D (m x n) = act(op(A) op(B) [+ bias (m) on every column] [+ C when accumulate]). */
typedef struct sg__lt_call {
    sg_dtype dtype;
    int transa, transb; /* 1: CUBLAS_OP_T */
    int64_t m, n, k;
    int64_t lda, ldb, ldc;
    int64_t batch;      /* matrices per call (strided batch), >= 1 */
    int64_t sa, sb, sc; /* element strides between them */
    bool bias;          /* the BIAS epilogue */
    bool accumulate;    /* beta = 1: D = C (the same buffer, or sg__lt_matmul_epi's c)
                           plus the product */
    int act;            /* SG__LT_ACT_*: cuBLASLt's GELU (tanh form) or RELU epilogue,
                           after the bias; DGELU: D = gelu'(aux) * the product (no bias) */
    bool aux;           /* with SG__LT_ACT_GELU: the value before it is written too;
                           with DGELU (always set): the GELU's input, read (sg__lt_matmul_epi's
                           aux, D's layout; ldc a multiple of 8) */
} sg__lt_call;

enum { SG__LT_ACT_NONE, SG__LT_ACT_GELU, SG__LT_ACT_RELU, SG__LT_ACT_DGELU };

/* The call for plan p's innermost batch (or its one matrix): false when an
 * operand is neither row-major nor transposed (the plan packs those, so
 * false means a plan bug) or a size exceeds what cuBLASLt takes. */
SG__HIDDEN bool sg__mm_lt_call(const sg__mm_plan *p, sg_dtype dt, sg__lt_call *c);

/* Which kernel runs a product: SG_CUDA_MATMUL=lt|gemv|auto (default auto). */
typedef enum sg__mm_path { SG__MM_AUTO, SG__MM_LT, SG__MM_GEMV } sg__mm_path;
SG__HIDDEN sg__mm_path sg__mm_path_env(void);
/* auto's choice: GEMV for at most 8 rows read along contiguous weight rows. */
SG__HIDDEN bool sg__mm_prefer_gemv(const sg__mm_plan *p);

/*
 * Padding. cuBLASLt takes its fast kernels only when every operand's rows
 * start 16 bytes apart and every extent along which an operand is
 * contiguous is a multiple of 16 bytes; otherwise it falls to align1
 * kernels, ten times slower (GPT-2's LM head: rows of 50257 bf16 logits).
 * Such a product runs through aligned scratch, the way torch.compile pads:
 *   - an A or B with unaligned rows is copied there with a padded leading
 *     dim; a C with unaligned rows is written there and copied out;
 *   - a K that is contiguous in A or B and not a multiple of 16 bytes is
 *     padded with zeros in both (both are copied), unless both have
 *     aligned rows (a buffer with padded rows, memory/pad.c): then K splits
 *     into the largest multiple of 16 bytes, one call, and the rest, a
 *     second call that adds its product to the first's (beta = 1);
 *   - N (C's contiguous extent) splits into the largest multiple of 16
 *     bytes, one call, and the rest, a second narrow call;
 *   - with A read transposed (contiguous along M), the rows past the
 *     largest multiple of 16 bytes of M go in a last call of their own.
 * A and C go in chunks of mchunk rows of M (a multiple of 256), so that
 * the scratch stays within SG__MM_PAD_BYTES (SG_CUDA_MATMUL_PAD=<MiB> sets
 * another cap; 0 or off turns padding off); B is copied whole. Only single
 * products (no batch dim left after folding) of at least SG__MM_PAD_MIN
 * multiply-adds whose operands cuBLASLt reads in place are padded. Every
 * output element is one dot product as before (two partial ones added,
 * when K splits), the same every run: deterministic.
 *
 * Row classes. When only C's rows are unaligned (x @ w^T with x row-major,
 * w read transposed, no bias: the LM head's logits), C is written in place
 * instead: with ldc % q = r (q elements in 16 bytes), the rows r' with
 * r' mod g = j (g = q / gcd(r, q) classes) are g * ldc apart, an aligned
 * leading dim, and start aligned past their first s * j columns (s = q - r).
 * One strided-batch call, a batch per class (strides: one row of A, s rows
 * of w, ldc + s of C), writes columns s * j .. s * j + ncls of class j's rows,
 * per chunk of columns whose w rows stay in a quarter of the L2 (the batches
 * run one after another and each reads them); the columns no class covers
 * for every row (0 .. s * (g - 1) and ncls .. N) go through scratch in one
 * small call of two batches and are copied out. This moves the product's
 * own bytes only, where scratch adds a read and a write of all of C.
 * SG_CUDA_MATMUL_CLASSES=off turns it off, =<n> sets n columns per call.
 */
#define SG__MM_PAD_BYTES ((size_t)256 << 20)
#define SG__MM_PAD_MIN ((int64_t)1 << 24)

typedef struct sg__mm_pad {
    bool a, b, c;   /* which operands go through scratch */
    bool a_t, b_t;  /* that operand is stored transposed (contiguous along M, K) */
    int64_t kp;     /* K with its zero padding (K when none) */
    int64_t km;     /* K of the first call; the rest (kp - km) in a second
                       that accumulates (kp: no second call) */
    int64_t nm;     /* columns of the first call (N: no second call) */
    int64_t mm;     /* rows of M in chunks; the rest (M - mm) in a last call */
    int64_t mchunk; /* rows of M per chunk */
    int64_t ldb;    /* B's padded leading dim */
    size_t bytes_a, bytes_b, bytes_c; /* scratch of each (256-byte multiples) */
    int64_t classes; /* > 0: C written in place in this many row classes (then
                        bytes_c holds the columns no class covers); 0: C (when
                        padded) through scratch in chunks of rows */
    int64_t cshift;  /* with classes: class j's columns start at cshift * j */
    int64_t ncls;    /* with classes: columns each class writes in place */
} sg__mm_pad;

/* Whether plan p (of dtype dt, run by cuBLASLt) is padded, and how. */
SG__HIDDEN bool sg__mm_pad_make(const sg__mm_plan *p, sg_dtype dt, sg__mm_pad *pad);
/* A padded leading dim: ld rounded up to 16 bytes of dt. */
SG__HIDDEN int64_t sg__mm_pad_ld(int64_t ld, sg_dtype dt);
/* For explain: a one-line note saying how node n's product is padded on
 * CUDA (empty, and false, when it is not). */
SG__HIDDEN bool sg__mm_pad_note(const sg__node *n, char *buf, size_t size);

/* ------------------------------------------------------------ cuBLASLt (cublaslt.c) */

/*
 * Run one call on the context's stream. The first use on a context loads
 * libcublasLt, makes the handle and a 32 MiB workspace; every distinct call
 * (sizes, strides, dtype, epilogue, pointer alignments) gets its descriptors
 * and heuristic's algorithm once, so that later runs and graph recordings do
 * no setup. *ran is false (and SG_OK returned, nothing recorded as an error)
 * when cuBLASLt has no algorithm for the call: the caller falls back.
 * Errors: SG_ERR_BACKEND_UNAVAILABLE (no libcublasLt), SG_ERR_UNSUPPORTED
 * (first use while a graph is recorded), SG_ERR_DRIVER, SG_ERR_OOM.
 */
SG__HIDDEN sg_status sg__lt_matmul(sg_ctx *ctx, const sg__lt_call *c, const void *a, const void *b,
                                   void *d, const void *bias, bool *ran);
/* The same with a C apart from D (cin: read with beta = 1 when c->accumulate,
 * of D's layout, either D itself or not overlapping it; NULL: D) and the
 * GELU epilogue's aux output or the GELU-gradient epilogue's aux input (with
 * c->aux). *ran false: no algorithm for this epilogue, or a GELU-gradient
 * call that cuBLASLt refused when run (not supported, invalid value: nothing
 * launched); logged once per call under fallbacks; nothing written. */
SG__HIDDEN sg_status sg__lt_matmul_epi(sg_ctx *ctx, const sg__lt_call *c, const void *a,
                                       const void *b, const void *cin, void *d, const void *bias,
                                       void *aux, bool *ran);

/* ------------------------------------------------------------ max-autotune */

/*
 * In the MAX_AUTOTUNE modes the step's tuning run (cuda_graph.c) also picks
 * each cuBLASLt call's algorithm: its candidates (up to SG__LT_NALGO: the
 * heuristic's algorithms within the workspace and their split-K variants,
 * see "Split-K" below) are each timed on the real buffers, and the fastest
 * is kept; for products of at most 8 rows the GEMV kernel is timed against
 * them. The untimed choice (sg__lt_default_pick's candidate, and, for few rows,
 * today's choice between GEMV and cuBLASLt) stays unless another
 * is at least 3% faster, and stays when a candidate fails. Calls that add
 * to their output in place (beta = 1, C = D) keep the untimed choice: timing
 * them would add the product again (with a separate C they are timed, with
 * their epilogue). A pick is the call's key (the words cublaslt.c
 * compares: sizes, strides, dtype, epilogue, pointer alignments, TF32) and
 * the index of the chosen algorithm in the call's candidate list, or
 * SG__LT_GEMV; picks are remembered with the block sizes in the tune file
 * (one line each: "lt <key words> <pick>"), so that a warm process applies
 * them without timing.
 */
#define SG__LT_KEY_WORDS 20
#define SG__LT_NHEUR 8  /* the heuristic's algorithms in a call's candidate list */
#define SG__LT_NALGO 16 /* the list: those, then split-K variants (see below) */
#define SG__LT_GEMV (-1)

typedef struct sg__lt_pick {
    int64_t key[SG__LT_KEY_WORDS];
    int pick; /* SG__LT_GEMV, or 0 .. SG__LT_NALGO - 1 */
} sg__lt_pick;

/*
 * Split-K (no device). cuBLASLt's heuristic splits K for small products,
 * sometimes into parts of a few elements (W4: K = 10 in 8 parts, each a
 * CTA, plus a reduction kernel, for 1.3M multiply-adds). A call's
 * candidates are the heuristic's first SG__LT_NHEUR algorithms, then
 * variants of the first SG__LT_SPLIT_BASES of them with K in other numbers
 * of parts (sg__lt_splits), reduced in the compute type in a second kernel
 * (in place, through the output, for 2 parts where cuBLASLt takes it: the
 * in-place reduction adds the parts one after another, and measured 2-10
 * times slower from 4 parts up). Either way the parts are added in a fixed
 * order, so replays give the same bits. Without timing (every mode but
 * max-autotune's tuning run) a call runs sg__lt_default_pick's candidate;
 * max-autotune times them all.
 */
#define SG__LT_SPLIT_BASES 2
#define SG__LT_SPLIT_MIN_K 32 /* the least K per part of a variant */

typedef struct sg__lt_cand {
    int base;   /* the heuristic's algorithm it is (or is a variant of) */
    int splitk; /* K parts (1: not split) */
} sg__lt_cand;

/* The numbers of K parts to try as variants of an algorithm that splits K
 * in `own` parts: 1, and powers of two from 2 while a part keeps at least
 * SG__LT_SPLIT_MIN_K, but not `own`; at most max into out, their number. */
SG__HIDDEN int sg__lt_splits(int own, int64_t k, int *out, int max);
/* The index of the candidate a call runs without timing: the first (the
 * heuristic's own), unless it splits a K too short for two parts of
 * SG__LT_SPLIT_MIN_K; then its unsplit variant, where the list has it.
 * (Splits of a longer K into short parts stay: W4's K = 1024 in 132 parts
 * measured no slower than in 32, and its 128 x 1024 products in 8 parts
 * of 32 tiles, 256 CTAs on 132 SMs, no slower than in 4.) */
SG__HIDDEN int sg__lt_default_pick(const sg__lt_cand *c, int n, int64_t k);

/* The pick as one tune-file line (with its newline) into buf: its length,
 * or -1 when it does not fit. */
SG__HIDDEN int sg__lt_pick_format(const sg__lt_pick *p, char *buf, size_t size);
/* One such line at s (leading blanks skipped); *used: the characters read.
 * False when s holds no well-formed pick (a bad key or pick number). */
SG__HIDDEN bool sg__lt_pick_parse(const char *s, sg__lt_pick *p, int *used);

/* A tune file's body (cuda_graph.c): "<group> <threads>" lines (block
 * sizes) and pick lines, into b (at most maxb) and p (at most maxp). False,
 * with nothing to apply, when any line is malformed or there are too many. */
typedef struct sg__tune_block {
    int group, threads;
} sg__tune_block;
SG__HIDDEN bool sg__tune_parse(const char *body, sg__tune_block *b, int maxb, int *nb,
                               sg__lt_pick *p, int maxp, int *np);

/* Picks apply only to calls made between sg__lt_scope(ctx, true) and
 * (ctx, false): while a MAX_AUTOTUNE step runs (launched, recorded or
 * tuned), so that steps of other modes on the context keep the heuristic's
 * first algorithm. On loads cuBLASLt if needed: SG_ERR_OOM (set in the
 * context) when memory ran out; where the library cannot be had, no pick
 * applies, SG_OK and the status untouched. sg__lt_scoped: whether in scope. */
SG__HIDDEN sg_status sg__lt_scope(sg_ctx *ctx, bool on);
SG__HIDDEN bool sg__lt_scoped(sg_ctx *ctx);

/* The tuning run's bracket (in scope): between begin and end every cuBLASLt call not
 * yet picked is timed (and GEMV against it where the caller asks, see
 * sg__lt_prefer_gemv). begin loads cuBLASLt if needed: SG_ERR_OOM (set in
 * the context) when memory ran out; where the library cannot be had,
 * nothing is timed, SG_OK and the status untouched. end returns the picks made or applied since
 * begin (at most max into out), or -1 with *lost (and the context's
 * failure) set where a pick could not be made or kept (that call kept its
 * default). */
SG__HIDDEN sg_status sg__lt_tune_begin(sg_ctx *ctx);
SG__HIDDEN int sg__lt_tune_end(sg_ctx *ctx, sg__lt_pick *out, int max, sg_status *lost);
/* Remembered picks, applied to calls with these keys from now on: 1; 0
 * (status untouched) when cuBLASLt cannot be loaded; -1 with SG_ERR_OOM set
 * in the context when memory ran out. */
SG__HIDDEN int sg__lt_picks_set(sg_ctx *ctx, const sg__lt_pick *p, int n);

/* Launch the alternative to a cuBLASLt call (the GEMV kernel) once. */
typedef sg_status (*sg__lt_alt)(sg_ctx *ctx, void *user);
/* For a product that GEMV could run: whether it should, given c, the
 * cuBLASLt call that would run it instead (arguments as sg__lt_matmul's).
 * gemv: the choice without tuning, returned unless a pick for c exists or
 * is made now (while tuning, by timing alt against the algorithms). Never
 * fails: any failure keeps gemv, the context's status untouched. */
SG__HIDDEN bool sg__lt_prefer_gemv(sg_ctx *ctx, const sg__lt_call *c, const void *a, const void *b,
                                   void *d, const void *bias, sg__lt_alt alt, void *user,
                                   bool gemv);

#endif /* SG_CUDA_CUBLASLT_H */
