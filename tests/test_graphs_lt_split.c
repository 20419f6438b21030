/* SPDX-License-Identifier: MIT */
/*
 * test_graphs_lt_split.c -- the split-K rule of the CUDA matmul family
 * (graphs/cuda/cublaslt.c, no device): sg__lt_splits lists one part and
 * every power of two whose parts keep at least SG__LT_SPLIT_MIN_K of K, in
 * increasing order, never the algorithm's own count and never more than
 * asked; sg__lt_default_pick keeps the heuristic's first algorithm unless
 * it splits a K too short for two parts of SG__LT_SPLIT_MIN_K, and then
 * takes that algorithm's unsplit variant (W4's products: K = 10 in 8 parts
 * runs unsplit; K = 1024 in 132 or 8 parts and K = 128 unsplit stay).
 * Random K, counts and candidate lists against references written here
 * from the rule's statement.
 */
#include "graphs/cuda/cublaslt.h"
#include "testutil.h"

#include <stdio.h>

/* The counts the rule allows for K = k, by enumeration of every count. */
static int ref_splits(int own, int64_t k, int *out, int max) {
    int n = 0;
    for (int p = 1; p <= 256 && n < max; p++) {
        bool pow2 = (p & (p - 1)) == 0;
        if (pow2 && p != own && (p == 1 || k / p >= SG__LT_SPLIT_MIN_K)) out[n++] = p;
    }
    return n;
}

/* The rule's statement: a split K that no two parts of SG__LT_SPLIT_MIN_K
 * fill runs unsplit, through the first's variant of one part. */
static int ref_pick(const sg__lt_cand *c, int n, int64_t k) {
    bool too_short = c[0].splitk > 1 && k < 2 * SG__LT_SPLIT_MIN_K;
    for (int i = 1; too_short && i < n; i++)
        if (c[i].base == 0 && c[i].splitk == 1) return i;
    return 0;
}

int main(void) {
    for (int t = 0; t < 200; t++) {
        tu_seed(1000 + (uint64_t)t);
        int64_t k = tu_randint(1, t % 2 ? 100000 : 300);
        int own = (int)tu_randint(1, 200), max = (int)tu_randint(1, 12);
        int got[16], want[16];
        int ng = sg__lt_splits(own, k, got, max), nw = ref_splits(own, k, want, max);
        bool ok = TU_EXPECT(ng == nw);
        for (int i = 0; ok && i < ng; i++) ok = TU_EXPECT(got[i] == want[i]);
        tu_case(ok, "lt_split splits(own=%d,k=%lld,max=%d) seed=%d", own, (long long)k, max,
                1000 + t);
    }
    for (int t = 0; t < 300; t++) {
        tu_seed(5000 + (uint64_t)t);
        int64_t k = tu_randint(1, t % 2 ? 4096 : 100);
        int n = (int)tu_randint(1, SG__LT_NALGO);
        sg__lt_cand c[SG__LT_NALGO];
        for (int i = 0; i < n; i++)
            c[i] = (sg__lt_cand){i < SG__LT_NHEUR ? i : (int)tu_randint(0, 1),
                                 (int)(tu_randint(0, 1) ? 1 : (int64_t)1 << tu_randint(0, 8))};
        if (tu_randint(0, 1)) c[0].splitk = (int)tu_randint(2, 300);
        int got = sg__lt_default_pick(c, n, k), want = ref_pick(c, n, k);
        bool ok = TU_EXPECT(got == want) && TU_EXPECT(got >= 0 && got < n) &&
                  TU_EXPECT(got == 0 || (c[got].base == 0 && c[got].splitk == 1));
        tu_case(ok, "lt_split default_pick(n=%d,k=%lld,first=%d) seed=%d", n, (long long)k,
                c[0].splitk, 5000 + t);
    }
    /* W4's products, with the candidate lists candidates() makes from the
     * heuristic's splits as measured on an H100. */
    {
        /* dh2: K = 10 in 8 parts -> its unsplit variant */
        sg__lt_cand a[10] = {{0, 8}, {1, 4}, {2, 8},  {3, 4}, {4, 15},
                             {5, 1}, {6, 8}, {7, 25}, {0, 1}, {1, 1}};
        /* fwd3: K = 1024 in 132 parts: stays */
        sg__lt_cand b[12] = {{0, 132}, {1, 66},  {2, 99}, {3, 1},  {4, 16}, {5, 32},
                             {6, 8},   {7, 264}, {0, 32}, {0, 16}, {0, 8},  {0, 4}};
        /* dW2: K = 128 unsplit: stays */
        sg__lt_cand d[10] = {{0, 1}, {1, 1}, {2, 1}, {3, 1}, {4, 1},
                             {5, 1}, {6, 2}, {7, 2}, {0, 4}, {0, 2}};
        /* fwd1: K = 784 in 8 parts: stays */
        sg__lt_cand f[12] = {{0, 8}, {1, 6}, {2, 12}, {3, 8}, {4, 3}, {5, 3},
                             {6, 1}, {7, 1}, {0, 16}, {0, 4}, {0, 2}, {0, 1}};
        bool ok = TU_EXPECT(sg__lt_default_pick(a, 10, 10) == 8) &&
                  TU_EXPECT(sg__lt_default_pick(a, 8, 10) == 0) && /* no variant made */
                  TU_EXPECT(sg__lt_default_pick(b, 12, 1024) == 0) &&
                  TU_EXPECT(sg__lt_default_pick(d, 10, 128) == 0) &&
                  TU_EXPECT(sg__lt_default_pick(f, 12, 784) == 0);
        tu_case(ok, "lt_split w4_products");
    }
    return tu_finish();
}
