/* SPDX-License-Identifier: MIT */
/*
 * data.h -- llm.c's token files and its data loader.
 *
 * A token file (the .bin files of llm.c's dev/data) is 256 int32 of header -- magic
 * 20240520, version 1, the token count -- then that many uint16 tokens.
 * The loader hands out batches as llm.c's does: B rows of T tokens taken
 * from one contiguous window of B*T+1 tokens (the targets are the inputs
 * shifted by one), the window advancing by B*T and starting over at the
 * beginning when the next one would run past the end.
 */
#ifndef GPT2_DATA_H
#define GPT2_DATA_H

#include <stepgraph.h>

#include <stdint.h>

#define GPT2_TOKENS_MAGIC 20240520

typedef struct gpt2_tokens {
    uint16_t *tok;
    int64_t n;
} gpt2_tokens;

/* Read a token file into out (free with gpt2_tokens_free). SG_ERR_INVALID_ARG
 * when the file cannot be opened, its magic or version is not llm.c's, or it
 * holds fewer tokens than its header says; SG_ERR_OOM. */
sg_status gpt2_tokens_load(const char *path, gpt2_tokens *out);
/* Write n tokens as a token file. */
sg_status gpt2_tokens_save(const char *path, const uint16_t *tok, int64_t n);
void gpt2_tokens_free(gpt2_tokens *t);

typedef struct gpt2_loader {
    const gpt2_tokens *data;
    int64_t B, T, pos; /* pos: the first token of the next window */
} gpt2_loader;

/* A loader over data (not copied) for batches of (B, T); SG_ERR_INVALID_ARG
 * when data has fewer than B*T+1 tokens. */
sg_status gpt2_loader_init(gpt2_loader *l, const gpt2_tokens *data, int64_t B, int64_t T);
/* The next batch: inputs and targets, B*T each, row-major (B, T). */
void gpt2_loader_next(gpt2_loader *l, int64_t *inputs, int64_t *targets);
/* Start over at the first token. */
void gpt2_loader_reset(gpt2_loader *l);
/* The number of windows in one pass over the data. */
int64_t gpt2_loader_batches(const gpt2_loader *l);

#endif /* GPT2_DATA_H */
