/* SPDX-License-Identifier: MIT */
/*
 * args.h -- the examples' command-line numbers, read whole: a value that
 * is not a number, has anything after it, or lies outside [lo, hi] is
 * refused (false, the out-parameter untouched), so that a typo is an error
 * and not a silent 0 (as atoi and atof give).
 */
#ifndef SG_EXAMPLES_ARGS_H
#define SG_EXAMPLES_ARGS_H

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>

static inline bool arg_int(const char *s, long long lo, long long hi, long long *out) {
    char *end = NULL;
    errno = 0;
    long long v = s ? strtoll(s, &end, 10) : 0;
    if (!s || end == s || *end || errno == ERANGE || v < lo || v > hi) return false;
    *out = v;
    return true;
}

/* A finite number in [lo, hi]. */
static inline bool arg_real(const char *s, double lo, double hi, double *out) {
    char *end = NULL;
    double v = s ? strtod(s, &end) : 0;
    if (!s || end == s || *end || !isfinite(v) || v < lo || v > hi) return false;
    *out = v;
    return true;
}

#endif
