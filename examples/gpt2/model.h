/* SPDX-License-Identifier: MIT */
/*
 * model.h -- GPT-2 inference over the public stepgraph API: the weights in
 * llm.c's layout and checkpoint format, a KV cache, and two compiled steps
 * (prefill and decode), each one sg_call (one graph replay in the graph
 * modes).
 *
 * Parameters, named as llm.c names them (C channels, L layers, Vp the
 * vocabulary padded to a multiple of 128, maxT positions):
 *   wte (Vp, C)  wpe (maxT, C)
 *   per layer: ln1w ln1b (C), qkvw (3C, C) qkvb (3C), attprojw (C, C)
 *   attprojb (C), ln2w ln2b (C), fcw (4C, C) fcb (4C), fcprojw (C, 4C)
 *   fcprojb (C)
 *   lnfw lnfb (C)
 * The LM head is wte itself (tied), over its first V rows: logits have V
 * columns, not Vp.
 *
 * A checkpoint (llm.c's gpt2_124M.bin) is 256 int32 of header -- magic
 * 20240326, version (3: f32 parameters, 5: bf16), maxT, V, L, NH, C, Vp --
 * then every parameter in the order above, each kind for all layers at once
 * (all ln1w, then all ln1b, ...).
 */
#ifndef GPT2_MODEL_H
#define GPT2_MODEL_H

#include <stepgraph.h>

#include <stdbool.h>
#include <stdint.h>

typedef struct gpt2_config {
    int64_t max_t;        /* positions (wpe rows) */
    int64_t vocab;        /* V: real vocabulary */
    int64_t n_layer;      /* L */
    int64_t n_head;       /* NH; C % NH == 0 */
    int64_t channels;     /* C */
    int64_t padded_vocab; /* Vp >= V (wte rows); 0 in gpt2_init: V rounded up to 128 */
} gpt2_config;

/* The 12 tensors of one block. */
typedef struct gpt2_layer {
    sg_tensor *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb;
    sg_tensor *ln2w, *ln2b, *fcw, *fcb, *fcprojw, *fcprojb;
} gpt2_layer;

typedef struct gpt2 {
    sg_ctx *ctx;
    gpt2_config cfg;
    sg_dtype dtype; /* of weights, activations, the cache and the logits */
    sg_tensor *wte, *wpe, *lnfw, *lnfb;
    gpt2_layer *layers;
    /* The KV cache: per layer (B, NH, S, C/NH), made by gpt2_cache_create. */
    sg_tensor **kcache, **vcache;
    int64_t cache_batch, cache_slots;
    sg_tensor *slots; /* i64 (S): 0 .. S-1, for the attention mask */
    sg_tensor *one;   /* i64 (1): 1, to advance the position */
    sg_compile_opts opts;
    sg_fn *prefill_fn[2]; /* [0]: last position's logits, [1]: every position's */
    sg_fn *decode_fn;
} gpt2;

/* Seeded random weights (GPT-2's init: N(0, 0.02); the residual projections
 * N(0, 0.02 / sqrt(2L)); LayerNorm weight 1, biases 0; wte's padding rows
 * 0) in dtype on ctx. */
sg_status gpt2_init(sg_ctx *ctx, const gpt2_config *cfg, sg_dtype dtype, uint64_t seed, gpt2 **out);
/* Load an llm.c checkpoint (f32 or bf16) and convert its weights to dtype. */
sg_status gpt2_load(sg_ctx *ctx, const char *path, sg_dtype dtype, gpt2 **out);
/* Write the weights as an llm.c checkpoint: version 3 (file_dtype SG_F32)
 * or 5 (SG_BF16). */
sg_status gpt2_save(gpt2 *g, const char *path, sg_dtype file_dtype);
/* Why the last gpt2_init, gpt2_load or gpt2_save of this thread failed, in
 * words: the file's or the configuration's fault, else the library's
 * message (ctx's). */
const char *gpt2_error(sg_ctx *ctx);
/* Free the model, its cache and its compiled steps. NULL does nothing. */
void gpt2_destroy(gpt2 *g);

/* Make (or remake) the KV cache, zeroed: batch rows of slots positions
 * (slots <= maxT), and compile the steps in opts' mode (opts NULL: eager).
 * Remaking the cache drops every capture. */
sg_status gpt2_cache_create(gpt2 *g, int64_t batch, int64_t slots, const sg_compile_opts *opts);
/* Free the cache and the compiled steps (and their memory pools); the
 * weights stay. gpt2_destroy does this too. */
void gpt2_cache_destroy(gpt2 *g);

/*
 * Prefill: tokens (B, T) i64 at positions 0 .. T-1 (T <= slots) fill the
 * cache's first T slots; *logits gets (B, V) of the last position, or
 * (B, T, V) of every position when all is true. The logits are an output of
 * the compiled step (owned by it; see sg_call).
 */
sg_status gpt2_prefill(gpt2 *g, sg_tensor *tokens, bool all, sg_tensor **logits);

/*
 * Decode one token per row: token (B) i64 at position pos ((1) i64 tensor,
 * pos < slots) attends to slots 0 .. pos of the cache after writing its own
 * K and V at slot pos. *logits gets (B, V). The step then advances in place,
 * on the device: token becomes the greedy next token (argmax of the
 * logits) and pos becomes pos + 1, so calling it again continues the text.
 */
sg_status gpt2_decode(gpt2 *g, sg_tensor *token, sg_tensor *pos, sg_tensor **logits);

/*
 * Training: the parameters as one list, and the forward pass over whole
 * sequences without the KV cache (what a training step differentiates).
 */

/* The number of parameter tensors: 4 + 12 L. */
int64_t gpt2_num_params(const gpt2 *g);
/* Every parameter tensor into out (room for gpt2_num_params), in checkpoint
 * order: wte, wpe, the L ln1w, the L ln1b, ..., lnfw, lnfb. */
void gpt2_params(gpt2 *g, sg_tensor **out);
/* tokens (B, T) i32/i64, T <= maxT, at positions 0 .. T-1 -> logits
 * (B, T, V) of every position, causal attention, no cache. An op
 * expression: NULL on failure (the reason is in the context). */
sg_tensor *gpt2_forward(gpt2 *g, sg_tensor *tokens);

#endif /* GPT2_MODEL_H */
