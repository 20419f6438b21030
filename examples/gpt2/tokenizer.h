/* SPDX-License-Identifier: MIT */
/*
 * tokenizer.h -- llm.c's GPT-2 tokenizer file (gpt2_tokenizer.bin), read
 * for decoding token ids to bytes. The file: 256 uint32 of header (magic
 * 20240328, version 1 or 2, vocabulary size, and for version 2 the
 * end-of-text token), then per token a uint8 length and that many bytes.
 */
#ifndef GPT2_TOKENIZER_H
#define GPT2_TOKENIZER_H

#include <stdint.h>

typedef struct gpt2_tokenizer {
    uint32_t vocab;  /* tokens in the file */
    int64_t eot;     /* end-of-text token; -1 when the file (version 1) has none */
    char **text;     /* text[i]: token i's bytes, NUL-terminated */
    uint8_t *length; /* length[i]: its byte count (a token may hold a NUL) */
} gpt2_tokenizer;

/* Read path into *tok; 0 on success, -1 when the file is missing, not this
 * format or truncated (*tok is then untouched). */
int gpt2_tokenizer_load(gpt2_tokenizer *tok, const char *path);
/* Token id's text, or NULL when id is outside the vocabulary. */
const char *gpt2_tokenizer_decode(const gpt2_tokenizer *tok, int64_t id);
void gpt2_tokenizer_free(gpt2_tokenizer *tok);

#endif /* GPT2_TOKENIZER_H */
