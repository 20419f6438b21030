/* SPDX-License-Identifier: MIT */
/*
 * test_codegen_cuda_families.c -- every kernel of the CUDA kernel families
 * (graphs/cuda/k_*.cu, as the library embeds them) may be launched as a
 * programmatic dependent: sg__cuda_launch launches every kernel so on sm_90,
 * and such a kernel may start while the kernel before it still runs, so it
 * must execute griddepcontrol.wait before it reads or writes memory.
 *
 * Checked on the sources: the body of each extern "C" __global__ function,
 * past its shared-memory declarations, begins with pdl_begin(); or calls a
 * function of the same file whose body reaches pdl_wait(); with nothing
 * before it but declarations and decode_prefetch (an L2 prefetch of the
 * cache, which reads nothing into registers); pdl_begin itself must reach
 * griddepcontrol.wait (itself or through pdl_wait). A new kernel without the wait fails here, in
 * CI, rather than as a race on the device.
 */
#include "graphs/cuda/exec.h"
#include "testutil.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

/* Past spaces, newlines and the macros' line continuations. */
static const char *skip_ws(const char *p) {
    while (*p && (isspace((unsigned char)*p) || *p == '\\')) p++;
    return p;
}

/* Past any `__shared__ ...;` or `extern __shared__ ...;` declarations. */
static const char *skip_shared(const char *p) {
    for (;;) {
        p = skip_ws(p);
        if (strncmp(p, "__shared__", 10) != 0 && strncmp(p, "extern __shared__", 17) != 0) return p;
        const char *semi = strchr(p, ';');
        if (!semi) return p;
        p = semi + 1;
    }
}

/* The body of the function whose definition opens at `sig` (the '{' after
 * its parameters): the text after the brace. */
static const char *body_of(const char *sig) {
    const char *p = strchr(sig, '(');
    int depth = 0;
    for (; p && *p; p++) {
        if (*p == '(') depth++;
        if (*p == ')' && --depth == 0) {
            const char *q = skip_ws(p + 1);
            if (*q == '{') return q + 1;
            p = q - 1; /* __launch_bounds__(...) then the name and parameters */
        }
    }
    return NULL;
}

/* The definition of device function `name` in src (its body), or NULL. */
static const char *device_body(const char *src, const char *name) {
    char pat[96];
    snprintf(pat, sizeof pat, "void %s(", name);
    const char *d = strstr(src, pat);
    return d ? body_of(d) : NULL;
}

/* Whether the kernel body at b waits before it touches memory. */
static bool waits_first(const char *src, const char *b, char *why, size_t n) {
    const char *s = skip_shared(b);
    if (strncmp(s, "pdl_begin();", 12) == 0) return true;
    /* A call of a helper of this file: its body must reach pdl_wait() past
     * declarations and decode_prefetch only. */
    char name[64];
    size_t len = 0;
    while ((isalnum((unsigned char)s[len]) || s[len] == '_') && len < sizeof name - 1) len++;
    memcpy(name, s, len);
    name[len] = '\0';
    const char *h = len ? device_body(src, name) : NULL;
    if (!h) {
        snprintf(why, n, "its first statement is neither pdl_begin(); nor a helper: %.60s", s);
        return false;
    }
    const char *w = strstr(h, "pdl_wait();"), *end = strstr(h, "\n}");
    if (!w || (end && w > end)) {
        snprintf(why, n, "its helper %s never calls pdl_wait();", name);
        return false;
    }
    for (const char *p = skip_shared(h); p < w; p = skip_shared(p)) {
        if (strncmp(p, "decode_prefetch", 15) != 0) {
            snprintf(why, n, "its helper %s does something before pdl_wait();: %.60s", name, p);
            return false;
        }
        p = strchr(p, ';') + 1;
    }
    return true;
}

int main(void) {
    int kernels = 0, bad = 0;
    for (int u = 0; u < SG__CU_NUM_UNITS; u++) {
        const char *src = sg__cu_sources[u], *name = sg__cu_names[u];
        if (!TU_EXPECT(src && name)) return 1;
        const char *pb = device_body(src, "pdl_begin"), *pe = pb ? strstr(pb, "\n}") : NULL;
        const char *pw = pb ? strstr(pb, "griddepcontrol.wait") : NULL;
        if (pb && (!pw || pw > pe)) pw = strstr(pb, "pdl_wait();"); /* through pdl_wait */
        const char *ww = pw ? device_body(src, "pdl_wait") : NULL;
        bool helper =
            pw && pw < pe &&
            (strncmp(pw, "pdl_wait", 8) != 0 || (ww && strstr(ww, "griddepcontrol.wait")));
        if (!helper) {
            bad++;
            fprintf(stderr, "FAIL %s: no pdl_begin that executes griddepcontrol.wait\n", name);
        }
        int here = 0;
        for (const char *k = strstr(src, "extern \"C\" __global__"); k;
             k = strstr(k + 1, "extern \"C\" __global__")) {
            const char *b = body_of(k);
            char why[200] = "";
            here++;
            if (!b) {
                bad++;
                fprintf(stderr, "FAIL %s: a kernel whose body was not found: %.80s\n", name, k);
            } else if (!waits_first(src, b, why, sizeof why)) {
                bad++;
                fprintf(stderr, "FAIL %s: kernel at \"%.70s\": %s\n", name, k + 22, why);
            }
        }
        if (here == 0) {
            bad++;
            fprintf(stderr, "FAIL %s: no kernels found\n", name);
        }
        kernels += here;
    }
    printf("%d kernels in %d families; %d without the wait first\n", kernels, SG__CU_NUM_UNITS,
           bad);
    if (bad) return 1;
    printf("1 passed, 0 failed\n");
    return 0;
}
