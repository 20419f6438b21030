/* SPDX-License-Identifier: MIT */
/*
 * test_kernels_emulated.cpp -- the logic of CUDA kernels that split a row
 * or a sort over a block's threads, run on the host through cuda_emu.h
 * (graphs/cuda/k_data.cu compiled as C++ with barriers between real
 * threads), against what the CPU backend computes through the public
 * header, on random inputs:
 *   sg_data_sample (multinomial and sample: temperature, top-k, top-p, bf16
 *     rows with hundreds of ties a value, a NaN row, rows longer than the
 *     block; each row staged in shared memory first, at odd offsets from
 *     16 bytes, or read where it lies) pick for pick against sg_multinomial
 *     / sg_sample on the CPU;
 *   sg_data_topk_blk against sg_topk_indices on the CPU (ties, NaN, k up to
 *     2048, k = V);
 *   the radix sort of index_add's positions (sg_data_radix_count, _scan,
 *     _place; 1 to 4 passes, indices out of range) against a stable sort of
 *     (index, position), the order the runs kernel reads;
 *   sg_data_index_add_runs (several lanes a thread, f32 and bf16) against
 *     each element's sum in position order, rounded once;
 *   k_prelude.cuh's f16 and bf16 conversions (h2f, f2h, f2bf, pack2h in
 *     their portable forms) bit for bit against sg_cast on the CPU: every
 *     f16 value, and floats around every rounding boundary, NaNs included.
 * Each case prints "ok   NAME" or "FAIL NAME" with what differed.
 */
#include "cuda_emu.h"
/* The kernels after the emulation, their prelude first: */
#include "graphs/cuda/k_prelude.cuh"
/* then the family: */
#include "graphs/cuda/k_data.cu"

extern "C" {
#include "stepgraph.h"
}

#include <algorithm>
#include <cstdio>
#include <random>

static std::mt19937_64 gen(7);
static int passed, failed;

static void report(bool ok, const char *what) {
    printf("%s %s\n", ok ? "ok  " : "FAIL", what);
    (ok ? passed : failed)++;
}

static float to_bf16(float f) { /* bf16 values, as floats: the CPU and the kernel read alike */
    uint32_t u;
    memcpy(&u, &f, 4);
    u &= 0xffff0000u;
    memcpy(&f, &u, 4);
    return f;
}

static void sample_case(sg_ctx *ctx, int64_t rows, int64_t V, int kind, double T, int64_t top_k,
                        double top_p, bool ties, bool bf16, bool nan_row, unsigned grid,
                        bool staged = true) {
    std::vector<float> x((size_t)(rows * V));
    std::uniform_real_distribution<float> U(kind == 0 ? -0.2f : -4.f, kind == 0 ? 1.f : 4.f);
    for (auto &v : x) v = to_bf16(ties ? std::round(U(gen) * 4) / 4 : U(gen));
    if (nan_row) x[3] = NAN;
    std::vector<uint16_t> xb(x.size());
    for (size_t i = 0; i < x.size(); i++) xb[i] = (uint16_t)(__float_as_uint(x[i]) >> 16);
    int64_t shape[2] = {rows, V}, st[2];
    sg_tensor *xt = sg_from_host(ctx, SG_F32, 2, shape, x.data());
    sg_tensor *rng = sg_rng_create(ctx, gen() % 100000);
    bool ok = xt && rng && sg_read(rng, st, sizeof st) == SG_OK;
    sg_tensor *o = !ok         ? NULL
                   : kind == 0 ? sg_multinomial(xt, rng)
                               : sg_sample(xt, T, top_k, top_p, rng);
    std::vector<int64_t> want((size_t)rows), got((size_t)rows, -9);
    ok = ok && o && sg_read(o, want.data(), want.size() * 8) == SG_OK;
    const void *xp = bf16 ? (const void *)xb.data() : (const void *)x.data();
    i64 *out = (i64 *)got.data();
    /* Staged: the row copied into shared memory first, at its offset from
     * 16 bytes in x (odd V: rows that start mid-vector). */
    emu_dyn.assign(staged ? (size_t)V * (bf16 ? 2 : 4) + 16 : 0, 0xcd);
    emu_launch(grid, 1, SB, [&] {
        sg_data_sample(out, xp, bf16 ? DT_BF16 : DT_F32, rows, V, (const i64 *)st, 1, kind, top_k,
                       T, top_p, staged);
    });
    int64_t differ = 0, first = -1;
    for (int64_t r = 0; r < rows; r++)
        if (got[(size_t)r] != want[(size_t)r]) differ++, first = first < 0 ? r : first;
    char what[256];
    snprintf(what, sizeof what,
             "SAMPLE(kind=%d,%s,x=[%lld,%lld],T=%g,top_k=%lld,top_p=%g,ties=%d,nan=%d,blocks=%u,"
             "staged=%d) %lld rows differ from the CPU's%s",
             kind, bf16 ? "bf16" : "f32", (long long)rows, (long long)V, T, (long long)top_k, top_p,
             ties, nan_row, grid, staged, (long long)differ, ok ? "" : " (the CPU call failed)");
    if (first >= 0)
        snprintf(what + strlen(what), sizeof what - strlen(what), " (row %lld: %lld, CPU %lld)",
                 (long long)first, (long long)got[(size_t)first], (long long)want[(size_t)first]);
    report(ok && differ == 0, what);
    sg_release(xt), sg_release(rng), sg_release(o);
}

static void topk_case(sg_ctx *ctx, int64_t rows, int64_t V, int64_t k, bool ties,
                      bool staged = true) {
    std::vector<float> x((size_t)(rows * V));
    std::uniform_real_distribution<float> U(-3, 3);
    for (auto &v : x) v = ties ? std::round(U(gen)) : U(gen);
    for (int64_t r = 0; r < rows; r++) x[(size_t)(r * V + (r * 7) % V)] = NAN;
    int64_t shape[2] = {rows, V};
    sg_tensor *xt = sg_from_host(ctx, SG_F32, 2, shape, x.data());
    sg_tensor *o = xt ? sg_topk_indices(xt, k) : NULL;
    std::vector<int64_t> want((size_t)(rows * k)), got((size_t)(rows * k), -9);
    bool ok = o && sg_read(o, want.data(), want.size() * 8) == SG_OK;
    i64 *out = (i64 *)got.data();
    const float *xp = x.data();
    emu_dyn.assign(staged ? (size_t)V * 4 + 16 : 0, 0xcd);
    emu_launch(2, 1, SB, [&] { sg_data_topk_blk(out, xp, DT_F32, rows, V, k, staged); });
    int64_t differ = 0;
    for (size_t i = 0; i < got.size(); i++) differ += got[i] != want[i];
    char what[160];
    snprintf(what, sizeof what,
             "TOPK_BLK(x=[%lld,%lld],k=%lld,ties=%d,nan=1,staged=%d) %lld of %lld differ",
             (long long)rows, (long long)V, (long long)k, ties, staged, (long long)differ,
             (long long)(rows * k));
    report(ok && differ == 0, what);
    sg_release(xt), sg_release(o);
}

/* The passes as cuda_data.c's index_add_radix launches them. */
static void radix_case(int64_t L, int64_t limit, bool out_of_range) {
    std::vector<int64_t> idx((size_t)L);
    std::uniform_int_distribution<int64_t> D(0, limit - 1);
    for (auto &v : idx) v = D(gen);
    if (out_of_range) idx[(size_t)(L / 2)] = limit + 3, idx[1] = -1;
    dt_args a;
    memset(&a, 0, sizeof a);
    a.idx = idx.data(), a.idx_is_i64 = 1, a.istride[0] = 1, a.count = L, a.limit = limit;
    i64 ntiles = (L + RADIX_TILE - 1) / RADIX_TILE;
    std::vector<int64_t> sorted((size_t)(2 * L), -9);
    std::vector<uint32_t> buf((size_t)(4 * L)), hist((size_t)(256 * ntiles)), total(256);
    a.idx64 = (i64 *)sorted.data();
    int bits = 1;
    while (bits < 64 && ((uint64_t)limit >> bits) != 0) bits++;
    int passes = (bits + 7) / 8;
    const u32 *kin = NULL, *pin = NULL;
    for (int p = 0; p < passes; p++) {
        int shift = 8 * p;
        u32 *kout = p + 1 == passes ? NULL : buf.data() + (p % 2) * 2 * L;
        u32 *pout = kout ? kout + L : NULL;
        emu_launch((unsigned)ntiles, 1, 256,
                   [&] { sg_data_radix_count(a, kin, hist.data(), shift, ntiles); });
        emu_launch(256, 1, 256, [&] { sg_data_radix_scan(hist.data(), total.data(), ntiles); });
        emu_launch((unsigned)ntiles, 1, 256, [&] {
            sg_data_radix_place(a, kin, pin, kout, pout, hist.data(), total.data(), shift, ntiles);
        });
        kin = kout, pin = pout;
    }
    std::vector<int64_t> ord((size_t)L);
    for (int64_t j = 0; j < L; j++) ord[(size_t)j] = j;
    auto key = [&](int64_t j) {
        return idx[(size_t)j] < 0 || idx[(size_t)j] >= limit ? -1 : idx[(size_t)j];
    };
    std::stable_sort(ord.begin(), ord.end(), [&](int64_t p, int64_t q) { return key(p) < key(q); });
    int64_t differ = 0;
    for (int64_t r = 0; r < L; r++)
        differ +=
            sorted[(size_t)r] != key(ord[(size_t)r]) || sorted[(size_t)(L + r)] != ord[(size_t)r];
    char what[160];
    snprintf(what, sizeof what,
             "INDEX_ADD_RADIX(positions=%lld,rows=%lld,passes=%d,out_of_range=%d) %lld of %lld "
             "places differ from the stable sort",
             (long long)L, (long long)limit, passes, out_of_range, (long long)differ, (long long)L);
    report(differ == 0, what);
}

static uint16_t bf16_rne(float f) { /* as the kernels round */
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

/* sg_data_index_add_runs over positions in (index, position) order, as
 * cuda_data.c's add_runs launches it but with gy blocks along the
 * positions (each walking several): table [limit, W] in f32 or bf16, W
 * lanes a row, against each (index, lane)'s sum in position order in f32,
 * rounded once. */
static void runs_case(int64_t L, int64_t limit, int64_t W, bool bf16, unsigned gy) {
    std::uniform_int_distribution<int64_t> D(0, limit - 1);
    std::uniform_real_distribution<float> U(-1.f, 1.f);
    std::vector<int64_t> idx((size_t)L);
    for (auto &v : idx) v = D(gen);
    idx[(size_t)(L / 3)] = -1; /* out of range: skipped */
    std::vector<float> dst((size_t)(limit * W)), src((size_t)(L * W));
    /* f32 values use every mantissa bit, so that another order of adds shows */
    for (auto &v : dst) v = bf16 ? to_bf16(U(gen)) : U(gen);
    for (auto &v : src) v = bf16 ? to_bf16(U(gen)) : U(gen);
    std::vector<int64_t> ord((size_t)L), sorted((size_t)(2 * L));
    for (int64_t j = 0; j < L; j++) ord[(size_t)j] = j;
    auto key = [&](int64_t j) { return idx[(size_t)j]; };
    std::stable_sort(ord.begin(), ord.end(), [&](int64_t p, int64_t q) { return key(p) < key(q); });
    for (int64_t r = 0; r < L; r++)
        sorted[(size_t)r] = key(ord[(size_t)r]), sorted[(size_t)(L + r)] = ord[(size_t)r];
    std::vector<float> want = dst;
    for (int64_t r = 0; r < L; r++) {
        int64_t v = sorted[(size_t)r], j = sorted[(size_t)(L + r)];
        for (int64_t c = 0; v >= 0 && c < W; c++)
            want[(size_t)(v * W + c)] += src[(size_t)(j * W + c)];
    }
    std::vector<uint16_t> db(dst.size()), sb(src.size());
    for (size_t i = 0; i < dst.size(); i++) db[i] = (uint16_t)(__float_as_uint(dst[i]) >> 16);
    for (size_t i = 0; i < src.size(); i++) sb[i] = (uint16_t)(__float_as_uint(src[i]) >> 16);
    dt_args a;
    memset(&a, 0, sizeof a);
    a.dst = bf16 ? (void *)db.data() : (void *)dst.data();
    a.src = bf16 ? (const void *)sb.data() : (const void *)src.data();
    a.ndim = 1, a.shape[0] = W, a.dstride[0] = 1, a.sstride[0] = 1, a.n = W;
    a.sel_stride = W, a.jstride = W, a.count = L, a.limit = limit, a.idx64 = (i64 *)sorted.data();
    int dt = bf16 ? DT_BF16 : DT_F32;
    unsigned gx = (unsigned)((W + 256 * RUN_LANES - 1) / (256 * RUN_LANES));
    emu_launch(gx, gy, 256, [&] { sg_data_index_add_runs(a, dt); });
    int64_t differ = 0;
    for (size_t i = 0; i < want.size(); i++) {
        uint32_t got = bf16 ? (uint32_t)db[i] : __float_as_uint(dst[i]);
        uint32_t exp = bf16 ? (uint32_t)bf16_rne(want[i]) : __float_as_uint(want[i]);
        differ += got != exp;
    }
    char what[256];
    snprintf(what, sizeof what,
             "INDEX_ADD_RUNS(positions=%lld,rows=%lld,lanes=%lld,%s,blocks_y=%u) %lld of %lld "
             "elements differ from the sums in position order",
             (long long)L, (long long)limit, (long long)W, bf16 ? "bf16" : "f32", gy,
             (long long)differ, (long long)want.size());
    report(differ == 0, what);
}

/* The prelude's conversions against the CPU's sg_cast, bit for bit. */
static void conversion_case(sg_ctx *ctx) {
    std::vector<uint16_t> h(65536);
    for (uint32_t i = 0; i < 65536; i++) h[i] = (uint16_t)i;
    std::vector<float> f(65536);
    const int64_t n = 65536;
    sg_tensor *th = sg_from_host(ctx, SG_F16, 1, &n, h.data());
    sg_tensor *tf = th ? sg_cast(th, SG_F32) : NULL;
    bool ok = tf && sg_read(tf, f.data(), sizeof(float) * f.size()) == SG_OK;
    int bad = 0;
    for (uint32_t i = 0; ok && i < 65536; i++) {
        const float d = h2f(i);
        if (memcmp(&d, &f[i], 4)) bad++;
    }
    report(ok && bad == 0, "h2f: all 65536 f16 values as sg_cast f16 -> f32");
    sg_release(th);
    sg_release(tf);

    /* Floats: every f16 value and its neighbours one and two ulps of f32
     * away (the rounding boundaries, f16's overflow, subnormals), random
     * bits, NaNs with payloads, infinities. */
    std::vector<float> x;
    for (uint32_t i = 0; i < 65536; i++) {
        uint32_t u;
        memcpy(&u, &f[i], 4);
        for (int d = -2; d <= 2; d++) {
            uint32_t v = u + (uint32_t)d;
            float y;
            memcpy(&y, &v, 4);
            x.push_back(y);
        }
        float mid; /* halfway to the next f16 value */
        if (i < 65535 && f[i] == f[i] && f[i + 1] == f[i + 1]) {
            mid = 0.5f * (f[i] + f[i + 1]);
            x.push_back(mid);
        }
    }
    for (int i = 0; i < 200000; i++) {
        uint32_t u = (uint32_t)gen();
        float y;
        memcpy(&y, &u, 4);
        x.push_back(y);
    }
    const int64_t m = (int64_t)x.size();
    std::vector<uint16_t> rh(x.size()), rb(x.size());
    sg_tensor *tx = sg_from_host(ctx, SG_F32, 1, &m, x.data());
    sg_tensor *t16 = tx ? sg_cast(tx, SG_F16) : NULL, *tbf = tx ? sg_cast(tx, SG_BF16) : NULL;
    ok = t16 && tbf && sg_read(t16, rh.data(), 2 * rh.size()) == SG_OK &&
         sg_read(tbf, rb.data(), 2 * rb.size()) == SG_OK;
    int bad_h = 0, bad_b = 0, bad_p = 0;
    for (size_t i = 0; ok && i < x.size(); i++) {
        bad_h += f2h(x[i]) != rh[i];
        bad_b += f2bf(x[i]) != rb[i];
        if (i + 1 < x.size()) {
            bad_p +=
                pack2h(x[i], x[i + 1], DT_F16) != ((uint32_t)rh[i] | (uint32_t)rh[i + 1] << 16);
            bad_p +=
                pack2h(x[i], x[i + 1], DT_BF16) != ((uint32_t)rb[i] | (uint32_t)rb[i + 1] << 16);
        }
    }
    char what[160];
    snprintf(what, sizeof what,
             "f2h, f2bf, pack2h: %lld floats as sg_cast f32 -> f16 / bf16 (%d, %d, %d differ)",
             (long long)m, bad_h, bad_b, bad_p);
    report(ok && bad_h == 0 && bad_b == 0 && bad_p == 0, what);
    sg_release(tx);
    sg_release(t16);
    sg_release(tbf);
}

int main() {
    sg_ctx *ctx = NULL;
    sg_ctx_opts opts = {};
    opts.backend = SG_BACKEND_CPU;
    if (sg_ctx_create(&opts, &ctx) != SG_OK) return printf("FAIL no CPU context\n"), 1;
    conversion_case(ctx);
    radix_case(5000, 300, true);
    radix_case(9000, 70000, true);
    radix_case(3000, 1, false);
    radix_case(4100, 20000000, false);
    radix_case(100, 5, true);
    runs_case(300, 40, 768, true, 37);   /* GPT-2's rows: 3 lanes a thread */
    runs_case(200, 7, 1500, false, 200); /* two blocks of lanes, the last part-filled */
    runs_case(64, 1000, 5, true, 3);     /* fewer lanes than a block's threads */
    sample_case(ctx, 3, 50257, 1, 0.8, 50, 0.95, true, true, false, 2);
    sample_case(ctx, 2, 50257, 1, 0.8, 0, 0.9, false, false, false, 2);
    sample_case(ctx, 4, 1500, 1, 0.5, 300, 1, true, true, false, 1);
    sample_case(ctx, 4, 2049, 1, 3.0, 1000, 0.3, true, false, false, 4);
    sample_case(ctx, 5, 3000, 0, 1, 0, 1, false, false, false, 2);
    sample_case(ctx, 6, 40, 1, 0.7, 10, 0.9, false, false, false, 6);
    sample_case(ctx, 4, 700, 1, 1.0, 699, 0.5, true, false, false, 2);
    sample_case(ctx, 4, 513, 1, 2.0, 1, 1, true, false, false, 2);
    sample_case(ctx, 3, 300, 1, 0.8, 20, 0.9, false, false, true, 2);
    sample_case(ctx, 3, 300, 0, 1, 0, 1, false, false, true, 2);
    sample_case(ctx, 8, 20000, 1, 0.05, 0, 0.99, true, true, false, 3);
    sample_case(ctx, 6, 4000, 1, 1.0, 0, 0.01, true, false, false, 3);
    topk_case(ctx, 3, 50257, 50, true);
    topk_case(ctx, 2, 5000, 2048, false);
    topk_case(ctx, 3, 1000, 777, true);
    topk_case(ctx, 2, 37, 37, true);
    topk_case(ctx, 2, 600, 1, false);
    /* The row read where it lies (no shared memory to stage it in). */
    sample_case(ctx, 3, 50257, 1, 0.8, 50, 0.95, true, true, false, 2, false);
    sample_case(ctx, 5, 3000, 0, 1, 0, 1, false, false, false, 2, false);
    sample_case(ctx, 3, 300, 1, 0.8, 20, 0.9, false, false, true, 2, false);
    topk_case(ctx, 3, 1001, 50, true, false);
    sg_ctx_destroy(ctx);
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
