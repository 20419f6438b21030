/* SPDX-License-Identifier: MIT */
/*
 * test_graphs_lt_split.c -- the split-K rule of the CUDA matmul family
 * (graphs/cuda/cublaslt.c, no device): sg__lt_splits lists one part and
 * every power of two whose parts keep at least SG__LT_SPLIT_MIN_K of K, in
 * increasing order, never the algorithm's own count and never more than
 * asked; sg__lt_default_pick keeps the heuristic's first algorithm unless
 * its parts are shorter than SG__LT_SPLIT_MIN_K or its CTAs (tiles times
 * parts, where tiles are counted) overflow one wave of the SMs, and then
 * takes the variant of that algorithm with the most parts that fit (W4's
 * products on 132 SMs: K = 10 in 8 parts runs unsplit, K = 1024 in 132
 * parts in 32, 32 tiles in 8 parts in 4; K = 128 unsplit and 16 tiles in 8
 * parts stay); sg__lt_tiles counts tiles from cuBLASLt's tile ids. Random
 * K, counts, tiles and candidate lists against references written here
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

/* Whether `parts` suits candidate c, from the rule's statement. */
static bool fits(const sg__lt_cand *c, int parts, int64_t k, int sms) {
    if (parts == 1) return true;
    bool long_parts = k / parts >= SG__LT_SPLIT_MIN_K;
    bool one_wave = c->tiles == 0 || c->tiles * parts <= sms;
    return long_parts && one_wave;
}

static int ref_pick(const sg__lt_cand *c, int n, int64_t k, int sms) {
    if (fits(&c[0], c[0].splitk, k, sms)) return 0;
    int best = 0, most = 0;
    for (int i = 1; i < n; i++)
        if (c[i].base == 0 && fits(&c[0], c[i].splitk, k, sms) && c[i].splitk > most)
            best = i, most = c[i].splitk;
    return best;
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
        int64_t k = tu_randint(1, 4096);
        int n = (int)tu_randint(1, SG__LT_NALGO), sms = (int)tu_randint(1, 200);
        int64_t tiles = tu_randint(0, 1) ? 0 : tu_randint(1, 300);
        sg__lt_cand c[SG__LT_NALGO];
        for (int i = 0; i < n; i++)
            c[i] =
                (sg__lt_cand){i < SG__LT_NHEUR ? i : (int)tu_randint(0, 1),
                              (int)(tu_randint(0, 1) ? 1 : (int64_t)1 << tu_randint(0, 8)), tiles};
        if (tu_randint(0, 1)) c[0].splitk = (int)tu_randint(2, 300);
        int got = sg__lt_default_pick(c, n, k, sms), want = ref_pick(c, n, k, sms);
        bool ok = TU_EXPECT(got == want) && TU_EXPECT(got >= 0 && got < n) &&
                  TU_EXPECT(got == 0 || fits(&c[0], c[got].splitk, k, sms));
        tu_case(ok, "lt_split default_pick(n=%d,k=%lld,first=%d,tiles=%lld,sms=%d) seed=%d", n,
                (long long)k, c[0].splitk, (long long)tiles, sms, 5000 + t);
    }
    /* Tiles from cuBLASLt's tile ids, against the ids' names. */
    {
        bool ok = TU_EXPECT(sg__lt_tiles(15, 1024, 128) == 32) &&  /* 64x64 */
                  TU_EXPECT(sg__lt_tiles(18, 1024, 128) == 16) &&  /* 128x64 */
                  TU_EXPECT(sg__lt_tiles(14, 10, 128) == 1) &&     /* 32x128 */
                  TU_EXPECT(sg__lt_tiles(13, 784, 1024) == 416) && /* 64x32: 13 x 32 */
                  TU_EXPECT(sg__lt_tiles(1, 9, 17) == 6) &&        /* 8x8 */
                  TU_EXPECT(sg__lt_tiles(24, 1000, 1000) == 32) && /* 256x128: 4 x 8 */
                  TU_EXPECT(sg__lt_tiles(0, 64, 64) == 0) &&
                  TU_EXPECT(sg__lt_tiles(100000, 64, 64) == 0);
        tu_case(ok, "lt_split tiles");
    }
    /* W4's products on 132 SMs, with the candidate lists candidates() makes
     * (the heuristic's splits and tiles as measured on an H100). */
    {
        /* dh2: K = 10 in 8 parts of a 128x64 tile (16 tiles) -> one part */
        sg__lt_cand a[10] = {{0, 8, 16},  {1, 4, 128}, {2, 8, 32},  {3, 4, 32}, {4, 15, 16},
                             {5, 1, 128}, {6, 8, 128}, {7, 25, 32}, {0, 1, 16}, {1, 1, 128}};
        /* fwd3: K = 1024 in 132 parts of one 32x128 tile -> 32 parts */
        sg__lt_cand b[12] = {{0, 132, 1}, {1, 66, 1}, {2, 99, 1}, {3, 1, 1},
                             {4, 16, 1},  {5, 32, 1}, {6, 8, 1},  {7, 264, 1},
                             {0, 32, 1},  {0, 16, 1}, {0, 8, 1},  {0, 4, 1}};
        /* dW2: K = 128 unsplit: stays */
        sg__lt_cand d[10] = {{0, 1, 256},  {1, 1, 256}, {2, 1, 512}, {3, 1, 128}, {4, 1, 128},
                             {5, 1, 1024}, {6, 2, 256}, {7, 2, 32},  {0, 4, 256}, {0, 2, 256}};
        /* fwd1: K = 784 in 8 parts of 32 64x64 tiles (256 CTAs) -> 4 parts */
        sg__lt_cand f[12] = {{0, 8, 32},  {1, 6, 64},  {2, 12, 32}, {3, 8, 64},
                             {4, 3, 128}, {5, 3, 128}, {6, 1, 128}, {7, 1, 64},
                             {0, 16, 32}, {0, 4, 32},  {0, 2, 32},  {0, 1, 32}};
        /* dh1: K = 1024 in 8 parts of 16 128x64 tiles (128 CTAs): stays */
        sg__lt_cand h[9] = {{0, 8, 16},  {1, 8, 32},  {2, 15, 16}, {3, 4, 32}, {4, 4, 128},
                            {5, 16, 64}, {6, 8, 128}, {7, 1, 128}, {0, 16, 16}};
        bool ok = TU_EXPECT(sg__lt_default_pick(a, 10, 10, 132) == 8) &&
                  TU_EXPECT(sg__lt_default_pick(b, 12, 1024, 132) == 8) &&
                  TU_EXPECT(sg__lt_default_pick(d, 10, 128, 132) == 0) &&
                  TU_EXPECT(sg__lt_default_pick(f, 12, 784, 132) == 9) &&
                  TU_EXPECT(sg__lt_default_pick(h, 9, 1024, 132) == 0) &&
                  TU_EXPECT(sg__lt_default_pick(b, 8, 1024, 132) == 0);
        tu_case(ok, "lt_split w4_products");
    }
    return tu_finish();
}
