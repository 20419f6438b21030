/* SPDX-License-Identifier: MIT */
/*
 * cpu_random.c -- the counter-based generator (Philox 4x32-10, as Random123,
 * curand and torch) and the CPU kernel of the RAND op.
 *
 * The element mapping, which k_data.cu's sg_data_rand repeats word for word
 * so that both backends give the same bits for a seed: the rng tensor holds
 * (seed, offset) as i64; the key is (low, high) 32 bits of the seed. Element
 * e (row-major index of the contiguous output) takes
 *   uniform: block b = offset + e / 4, word e % 4 of philox(b, key), the top
 *            `bits` of it times 2^-bits (24 for f32, 11 for f16, 8 for bf16:
 *            exact in the dtype, so U[0, 1) never rounds up to 1);
 *   normal:  block b = offset + e / 2, words 2k and 2k+1 (k = e % 2) as
 *            u1 = (w0 + 1) 2^-32 in (0, 1] and u2 = w1 2^-32, Box-Muller
 *            sqrt(-2 ln u1) cos(2 pi u2) in double, rounded once to dtype;
 * with the counter (low, high 32 bits of b, 0, 0). A draw of N elements uses
 * ceil(N / 4) or ceil(N / 2) blocks; the front-end advances offset by that.
 * Nothing depends on how the elements are split among threads.
 */
#include "cpu.h"

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

void sg__philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3], k0 = key[0], k1 = key[1];
    for (int r = 0; r < 10; r++) {
        if (r > 0) k0 += PHILOX_W0, k1 += PHILOX_W1;
        uint64_t p0 = (uint64_t)PHILOX_M0 * c0, p1 = (uint64_t)PHILOX_M1 * c2;
        uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
    }
    out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

static int uniform_bits(sg_dtype dt) { return dt == SG_F32 ? 24 : dt == SG_F16 ? 11 : 8; }

/* One block of the generator for block index b. */
static void block(uint64_t b, const uint32_t key[2], uint32_t w[4]) {
    uint32_t ctr[4] = {(uint32_t)b, (uint32_t)(b >> 32), 0, 0};
    sg__philox4x32_10(ctr, key, w);
}

sg_status sg__cpu_rand(sg_ctx *ctx, const sg__node *n) {
    const sg_tensor *rng = n->in[0], *out = n->out;
    const int64_t *rv = sg__data(rng);
    uint64_t seed = (uint64_t)rv[0], offset = (uint64_t)rv[rng->stride[0]];
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    int64_t numel = sg__numel(out->ndim, out->shape);
    void *p = sg__data(out);
    sg_dtype dt = out->dtype;
    bool normal = n->i[0] == 1;
    int per = normal ? 2 : 4, bits = uniform_bits(dt);
    int64_t nblocks = (numel + per - 1) / per;
    int nth = sg__cpu_threads(ctx, numel * 8);
#pragma omp parallel for num_threads(nth) if (nth > 1) schedule(static)
    for (int64_t bi = 0; bi < nblocks; bi++) {
        uint32_t w[4];
        block(offset + (uint64_t)bi, key, w);
        for (int k = 0; k < per && bi * per + k < numel; k++) {
            int64_t e = bi * per + k;
            float v;
            if (normal) {
                double u1 = ((double)w[2 * k] + 1.0) * 0x1p-32, u2 = (double)w[2 * k + 1] * 0x1p-32;
                double z = sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
                v = dt == SG_F32 ? (float)z : sg__round_odd(z); /* one rounding to dt */
            } else {
                v = (float)(w[k] >> (32 - bits)) * ldexpf(1.0f, -bits);
            }
            sg__stf(p, dt, e, v);
        }
    }
    return SG_OK;
}
