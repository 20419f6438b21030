/* SPDX-License-Identifier: MIT */
/*
 * tokenizer.c -- reads llm.c's tokenizer file (see tokenizer.h).
 */
#include "tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOKENIZER_MAGIC 20240328u

void gpt2_tokenizer_free(gpt2_tokenizer *tok) {
    if (!tok || !tok->text) return;
    for (uint32_t i = 0; i < tok->vocab; i++) free(tok->text[i]);
    free(tok->text);
    free(tok->length);
    tok->text = NULL;
    tok->length = NULL;
}

int gpt2_tokenizer_load(gpt2_tokenizer *tok, const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    uint32_t h[256];
    gpt2_tokenizer t = {0, -1, NULL, NULL};
    int ok = fread(h, sizeof h, 1, f) == 1 && h[0] == TOKENIZER_MAGIC && (h[1] == 1 || h[1] == 2);
    if (ok) {
        t.vocab = h[2];
        t.eot = h[1] == 2 ? (int64_t)h[3] : -1;
        t.text = calloc(t.vocab ? t.vocab : 1, sizeof *t.text);
        t.length = calloc(t.vocab ? t.vocab : 1, 1);
        ok = t.text && t.length;
    }
    for (uint32_t i = 0; ok && i < t.vocab; i++) {
        unsigned char n;
        ok = fread(&n, 1, 1, f) == 1 && (t.text[i] = malloc((size_t)n + 1)) != NULL &&
             fread(t.text[i], 1, n, f) == n;
        if (ok) t.text[i][n] = '\0', t.length[i] = n;
    }
    fclose(f);
    if (!ok) {
        if (!t.text) t.vocab = 0;
        gpt2_tokenizer_free(&t);
        free(t.length);
        return -1;
    }
    *tok = t;
    return 0;
}

const char *gpt2_tokenizer_decode(const gpt2_tokenizer *tok, int64_t id) {
    if (!tok || !tok->text || id < 0 || id >= (int64_t)tok->vocab) return NULL;
    return tok->text[id];
}
