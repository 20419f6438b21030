/* SPDX-License-Identifier: MIT */
/*
 * data.c -- llm.c's token file format and its contiguous-window data loader
 * (see data.h).
 */
#include "data.h"

#include <stdio.h>
#include <stdlib.h>

sg_status gpt2_tokens_load(const char *path, gpt2_tokens *out) {
    FILE *f = fopen(path, "rb");
    if (!f) return SG_ERR_INVALID_ARG;
    int32_t h[256];
    sg_status st = SG_OK;
    uint16_t *tok = NULL;
    if (fread(h, sizeof h, 1, f) != 1 || h[0] != GPT2_TOKENS_MAGIC || h[1] != 1 || h[2] < 0)
        st = SG_ERR_INVALID_ARG;
    else if (!(tok = malloc(sizeof *tok * (size_t)(h[2] ? h[2] : 1))))
        st = SG_ERR_OOM;
    else if (fread(tok, sizeof *tok, (size_t)h[2], f) != (size_t)h[2])
        st = SG_ERR_INVALID_ARG; /* truncated */
    fclose(f);
    if (st != SG_OK) {
        free(tok);
        return st;
    }
    out->tok = tok;
    out->n = h[2];
    return SG_OK;
}

sg_status gpt2_tokens_save(const char *path, const uint16_t *tok, int64_t n) {
    if (n < 0 || n > INT32_MAX) return SG_ERR_INVALID_ARG;
    FILE *f = fopen(path, "wb");
    if (!f) return SG_ERR_INVALID_ARG;
    int32_t h[256] = {GPT2_TOKENS_MAGIC, 1, (int32_t)n};
    bool ok = fwrite(h, sizeof h, 1, f) == 1 && fwrite(tok, sizeof *tok, (size_t)n, f) == (size_t)n;
    return fclose(f) == 0 && ok ? SG_OK : SG_ERR_INVALID_ARG;
}

void gpt2_tokens_free(gpt2_tokens *t) {
    free(t->tok);
    t->tok = NULL;
    t->n = 0;
}

sg_status gpt2_loader_init(gpt2_loader *l, const gpt2_tokens *data, int64_t B, int64_t T) {
    if (B < 1 || T < 1 || data->n < B * T + 1) return SG_ERR_INVALID_ARG;
    *l = (gpt2_loader){data, B, T, 0};
    return SG_OK;
}

void gpt2_loader_next(gpt2_loader *l, int64_t *inputs, int64_t *targets) {
    int64_t n = l->B * l->T;
    if (l->pos + n + 1 > l->data->n) l->pos = 0;
    const uint16_t *w = l->data->tok + l->pos;
    for (int64_t i = 0; i < n; i++) {
        inputs[i] = w[i];
        targets[i] = w[i + 1];
    }
    l->pos += n;
}

void gpt2_loader_reset(gpt2_loader *l) { l->pos = 0; }

int64_t gpt2_loader_batches(const gpt2_loader *l) { return (l->data->n - 1) / (l->B * l->T); }
