/* SPDX-License-Identifier: MIT */
/*
 * emit.c -- a small indenting text writer for generated source: lines at
 * the current depth, blocks that open with "{" and close with "}". It keeps
 * the first allocation failure and drops the rest, so a generator checks
 * once at the end.
 */
#include "codegen.h"

#include <stdio.h>

static void reserve(sg__emit *e, size_t more) {
    if (e->oom || e->len + more + 1 <= e->cap) return;
    size_t ncap = e->cap ? e->cap * 2 : 8192;
    while (ncap < e->len + more + 1) ncap *= 2;
    char *nb = sg__alloc(e->ctx, ncap);
    if (!nb) {
        e->oom = true;
        return;
    }
    if (e->buf) {
        memcpy(nb, e->buf, e->len + 1);
        sg__free(e->ctx, e->buf, e->cap);
    } else {
        nb[0] = '\0';
    }
    e->buf = nb;
    e->cap = ncap;
}

void sg__emit_raw(sg__emit *e, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char small[512];
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    reserve(e, (size_t)n);
    if (e->oom) return;
    if ((size_t)n < sizeof small) {
        memcpy(e->buf + e->len, small, (size_t)n + 1);
    } else {
        va_start(ap, fmt);
        vsnprintf(e->buf + e->len, (size_t)n + 1, fmt, ap);
        va_end(ap);
    }
    e->len += (size_t)n;
}

static void indent(sg__emit *e) {
    for (int i = 0; i < e->depth; i++) sg__emit_raw(e, "    ");
}

void sg__emit_line(sg__emit *e, const char *fmt, ...) {
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    /* Preprocessor lines stay in column 0, as C wants them. */
    if (line[0] != '#') indent(e);
    sg__emit_raw(e, "%s\n", line);
}

void sg__emit_open(sg__emit *e, const char *fmt, ...) {
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    indent(e);
    sg__emit_raw(e, line[0] ? "%s {\n" : "{\n", line);
    e->depth++;
}

void sg__emit_close(sg__emit *e) {
    e->depth--;
    indent(e);
    sg__emit_raw(e, "}\n");
}

void sg__emit_free(sg__emit *e) {
    sg__free(e->ctx, e->buf, e->cap);
    e->buf = NULL;
    e->len = e->cap = 0;
}
