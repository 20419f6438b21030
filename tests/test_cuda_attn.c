/* SPDX-License-Identifier: MIT */
/*
 * test_cuda_attn.c -- the CUDA attention kernels (k_attn.cu) against the CPU
 * kernel on the same inputs, at the sizes the op test keeps small: decode
 * over a 1024-slot cache (B=1, H=12, D=64) at kv_len 1 .. 1024 (one split up
 * to many, merged by the combine kernel), grouped-query decode (32 query
 * heads over 8 and 4 K/V heads, D=128) with per-batch lengths, D=256, and
 * causal prefill (B=4, H=12, L=512, D=64) with q/k/v narrowed out of one
 * fused QKV projection; bf16 and f32. The decode cases run three times:
 * through the lean decode kernel (as a cluster per row where it fits), with
 * SG_ATTN_CLUSTER=0 (the combine kernel merges its splits), and with
 * SG_ATTN_DECODE=0 through the split kernel. The 16-bit prefill cases
 * (partial tiles, Lq < S, grouped heads, kv_len below Lq, no causal mask,
 * f16) run through the flash kernels and, with SG_ATTN_FLASH=0, through
 * sg_attn_mma; unaligned rows and D=96 take sg_attn_mma anyway. Then,
 * unless SG_ATTN_TIMING=0 (set it under compute-sanitizer), the time of
 * decode and prefill per call (eager, synchronized, best of 5 runs of 50)
 * against the bytes and FLOP floors of an H100 (3.35 TB/s HBM3; 989 TFLOP/s
 * bf16 dense tensor, 67 TFLOP/s f32 FFMA), and the decode kernels alone: one
 * attention compiled into a CUDA graph (reduce-overhead), 200 replays
 * between two synchronizations, so the host's launch cost overlaps the GPU.
 * Without a CUDA device it exits 77.
 */
#define _POSIX_C_SOURCE 200809L
#include "testutil.h"

#include <math.h>
#include <string.h>
#include <time.h>

static sg_ctx *gpu, *cpu;

/* The same host bytes as a tensor in both contexts. */
typedef struct pair {
    sg_tensor *g, *c;
} pair;

static pair both(sg_dtype dt, int ndim, const int64_t *shape, double lo, double hi) {
    double *v;
    pair p;
    p.c = tu_rand(cpu, dt, ndim, shape, lo, hi, &v);
    int64_t n = sg_tensor_numel(p.c);
    size_t es = sg_dtype_size(dt);
    void *buf = malloc((size_t)(n ? n : 1) * es);
    sg_read(p.c, buf, (size_t)n * es);
    p.g = sg_from_host(gpu, dt, ndim, shape, buf);
    free(buf), free(v);
    return p;
}

static pair len_pair(int64_t B, const int64_t *vals) {
    int64_t s[1] = {B};
    pair p = {sg_from_host(gpu, SG_I64, 1, s, vals), sg_from_host(cpu, SG_I64, 1, s, vals)};
    return p;
}

static void release(pair p) { sg_release(p.g), sg_release(p.c); }

static bool same(sg_tensor *g, sg_tensor *c, sg_dtype dt) {
    double *a = g ? tu_read(g) : NULL, *b = c ? tu_read(c) : NULL;
    int64_t n = sg_tensor_numel(c);
    /* Two f32 accumulations in different orders; 16-bit results may differ by a rounding. */
    double rtol = dt == SG_F32 ? 1e-4 : 1.6e-2, atol = dt == SG_F32 ? 1e-5 : 1e-2;
    bool ok = TU_EXPECT(a && b) && TU_EXPECT(sg_tensor_numel(g) == n) &&
              TU_EXPECT(tu_close("gpu vs cpu", a, b, n, rtol, atol));
    if (!g) fprintf(stderr, "  gpu: %s\n", sg_last_error(gpu));
    free(a), free(b);
    return ok;
}

/* Decode: q (B, Hq, Lq, D) over caches (B, Hkv, S, D) at lengths lens. */
static void decode_case(sg_dtype dt, int64_t B, int64_t Hq, int64_t Hkv, int64_t Lq, int64_t S,
                        int64_t D, const int64_t *lens) {
    int64_t qs[4] = {B, Hq, Lq, D}, ks[4] = {B, Hkv, S, D};
    pair q = both(dt, 4, qs, -1, 1), k = both(dt, 4, ks, -1, 1), v = both(dt, 4, ks, -1, 1);
    pair len = len_pair(B, lens);
    sg_tensor *yg = sg_sdpa_cached(q.g, k.g, v.g, len.g, 0);
    sg_tensor *yc = sg_sdpa_cached(q.c, k.c, v.c, len.c, 0);
    const char *e = getenv("SG_ATTN_DECODE"), *c = getenv("SG_ATTN_CLUSTER");
    tu_case(same(yg, yc, dt),
            "DECODE(kernel=%s,type=%s,B=%lld,Hq=%lld,Hkv=%lld,Lq=%lld,S=%lld,D=%lld,"
            "kv_len[0]=%lld)",
            e && strcmp(e, "0") == 0   ? "split"
            : c && strcmp(c, "0") == 0 ? "decode+combine"
                                       : "decode",
            sg_dtype_name(dt), (long long)B, (long long)Hq, (long long)Hkv, (long long)Lq,
            (long long)S, (long long)D, (long long)lens[0]);
    sg_release(yg), sg_release(yc);
    release(q), release(k), release(v), release(len);
    sg_clear_error(gpu);
}

/* Causal prefill through sg_sdpa, q/k/v narrowed out of one (B, L, 3H, D) projection. */
static void prefill_case(sg_dtype dt, int64_t B, int64_t H, int64_t L, int64_t D) {
    int64_t ps[4] = {B, L, 3 * H, D};
    pair p = both(dt, 4, ps, -1, 1);
    static const int perm[4] = {0, 2, 1, 3};
    sg_tensor *y[2];
    for (int s = 0; s < 2; s++) {
        sg_tensor *base = s ? p.c : p.g, *t[3];
        for (int j = 0; j < 3; j++) {
            sg_tensor *n = sg_narrow(base, 2, j * H, H);
            t[j] = sg_permute(n, perm);
            sg_release(n);
        }
        y[s] = sg_sdpa(t[0], t[1], t[2], NULL, true, 0);
        for (int j = 0; j < 3; j++) sg_release(t[j]);
    }
    tu_case(same(y[0], y[1], dt), "PREFILL(type=%s,B=%lld,H=%lld,L=%lld,D=%lld,causal,fused_qkv)",
            sg_dtype_name(dt), (long long)B, (long long)H, (long long)L, (long long)D);
    sg_release(y[0]), sg_release(y[1]);
    release(p);
    sg_clear_error(gpu);
}

/* Attention of contiguous q (B, Hq, Lq, D) over k, v (B, Hkv, S, D): sg_sdpa (causal or not)
 * when lens is NULL, else sg_sdpa_cached at lengths lens (causal among the new queries). With
 * skew, q/k/v are narrowed out of (.., D + 8) at element 1: rows no longer 16-byte aligned. */
static void attn_case(sg_dtype dt, int64_t B, int64_t Hq, int64_t Hkv, int64_t Lq, int64_t S,
                      int64_t D, bool causal, const int64_t *lens, bool skew) {
    int64_t w = skew ? D + 8 : D, qs[4] = {B, Hq, Lq, w}, ks[4] = {B, Hkv, S, w};
    pair q = both(dt, 4, qs, -1, 1), k = both(dt, 4, ks, -1, 1), v = both(dt, 4, ks, -1, 1);
    pair len = lens ? len_pair(B, lens) : (pair){NULL, NULL};
    sg_tensor *y[2];
    for (int s = 0; s < 2; s++) {
        sg_tensor *t[3] = {s ? q.c : q.g, s ? k.c : k.g, s ? v.c : v.g};
        for (int j = 0; j < 3; j++) t[j] = sg_narrow(t[j], 3, skew ? 1 : 0, D);
        y[s] = lens ? sg_sdpa_cached(t[0], t[1], t[2], s ? len.c : len.g, 0)
                    : sg_sdpa(t[0], t[1], t[2], NULL, causal, 0);
        for (int j = 0; j < 3; j++) sg_release(t[j]);
    }
    const char *e = getenv("SG_ATTN_FLASH");
    tu_case(same(y[0], y[1], dt),
            "ATTN(kernel=%s,type=%s,B=%lld,Hq=%lld,Hkv=%lld,Lq=%lld,S=%lld,D=%lld,%s%s,"
            "kv_len[0]=%lld)",
            e && strcmp(e, "0") == 0 ? "mma" : "flash", sg_dtype_name(dt), (long long)B,
            (long long)Hq, (long long)Hkv, (long long)Lq, (long long)S, (long long)D,
            causal || lens ? "causal" : "full", skew ? ",unaligned" : "",
            (long long)(lens ? lens[0] : S));
    sg_release(y[0]), sg_release(y[1]);
    release(q), release(k), release(v);
    if (lens) release(len);
    sg_clear_error(gpu);
}

/* The prefill shapes of the tensor-core kernels (flash for D 64 / 128 with aligned rows, else
 * sg_attn_mma): partial tiles, Lq < S, grouped heads, kv_len, no causal mask, f16. */
static void prefill_cases(void) {
    static const int64_t pl[3] = {300, 40, 0}, one[1] = {200};
    for (int f = 0; f < 2; f++) {
        setenv("SG_ATTN_FLASH", f ? "0" : "1", 1);
        prefill_case(SG_BF16, 4, 12, 512, 64);
        prefill_case(SG_F16, 2, 4, 200, 128);
        attn_case(SG_BF16, 2, 4, 4, 100, 300, 64, true, NULL, false);
        attn_case(SG_F16, 1, 3, 3, 257, 257, 64, false, NULL, false);
        attn_case(SG_BF16, 2, 8, 2, 150, 150, 128, true, NULL, false);
        attn_case(SG_BF16, 1, 4, 2, 33, 700, 128, true, NULL, false);
        attn_case(SG_BF16, 3, 4, 2, 70, 300, 64, true, pl, false);
        attn_case(SG_F16, 1, 2, 1, 64, 512, 128, true, one, false);
    }
    unsetenv("SG_ATTN_FLASH");
    attn_case(SG_BF16, 2, 4, 4, 130, 130, 64, true, NULL, true);  /* not 16-byte rows: mma */
    attn_case(SG_BF16, 2, 4, 4, 130, 130, 96, true, NULL, false); /* D 96: mma */
}

/* Seconds per call of one attention (eager), best of 5 runs of 50. */
static double time_call(sg_tensor *q, sg_tensor *k, sg_tensor *v, sg_tensor *len) {
    double best = 1e30;
    for (int r = 0; r < 5; r++) {
        sg_ctx_synchronize(gpu);
        double t0 = tu_now();
        for (int i = 0; i < 50; i++) {
            sg_tensor *y = len ? sg_sdpa_cached(q, k, v, len, 0) : sg_sdpa(q, k, v, NULL, true, 0);
            sg_release(y);
        }
        sg_ctx_synchronize(gpu);
        double t = (tu_now() - t0) / 50;
        best = t < best ? t : best;
    }
    return best;
}

/* The step of the graph timing: in = q, k, v, kv_len. */
static sg_status attn_step(sg_ctx *ctx, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)ctx, (void)user;
    out[0] = sg_sdpa_cached(in[0], in[1], in[2], in[3], 0);
    return out[0] ? SG_OK : sg_ctx_status(ctx);
}

/* The step of the prefill graph timing: in = one (B, T, 3H, D) QKV projection, as GPT-2's. */
static sg_status prefill_step(sg_ctx *ctx, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)user;
    static const int perm[4] = {0, 2, 1, 3};
    int64_t H = sg_tensor_size(in[0], 2) / 3;
    sg_tensor *t[3];
    for (int j = 0; j < 3; j++) {
        sg_tensor *n = sg_narrow(in[0], 2, j * H, H);
        t[j] = sg_permute(n, perm);
        sg_release(n);
    }
    out[0] = sg_sdpa(t[0], t[1], t[2], NULL, true, 0);
    for (int j = 0; j < 3; j++) sg_release(t[j]);
    return out[0] ? SG_OK : sg_ctx_status(ctx);
}

/* Microseconds per replay of one compiled attention step (nin inputs), 200 replays between
 * two synchronizations: the kernels' time once it passes the host's cost per replay. */
static double time_graph(sg_step_fn step, int nin, sg_tensor *const *in) {
    sg_fn *fn = NULL;
    sg_tensor *y = NULL;
    double best = 1e30;
    if (sg_compile(gpu, step, NULL, nin, 1, &(sg_compile_opts){.mode = SG_MODE_REDUCE_OVERHEAD},
                   &fn) != SG_OK)
        return -1;
    for (int w = 0; w < 3; w++)
        if (sg_call(fn, in, nin, &y, 1) != SG_OK) return sg_fn_destroy(fn), -1;
    for (int r = 0; r < 3; r++) {
        sg_ctx_synchronize(gpu);
        double t0 = tu_now();
        for (int i = 0; i < 200; i++) sg_call(fn, in, nin, &y, 1);
        sg_ctx_synchronize(gpu);
        double t = (tu_now() - t0) / 200;
        best = t < best ? t : best;
    }
    sg_fn_destroy(fn);
    return best * 1e6;
}

static void graph_timings(void) {
    int64_t qs[4] = {1, 12, 1, 64}, ks[4] = {1, 12, 1024, 64}, one[1] = {1};
    pair q = both(SG_BF16, 4, qs, -1, 1), k = both(SG_BF16, 4, ks, -1, 1);
    pair v = both(SG_BF16, 4, ks, -1, 1);
    static const int64_t lens[] = {8, 256, 1024};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        sg_tensor *len = sg_from_host(gpu, SG_I64, 1, one, &lens[i]);
        sg_tensor *in[4] = {q.g, k.g, v.g, len};
        double t[3];
        for (int m = 0; m < 3; m++) {
            setenv("SG_ATTN_DECODE", m < 2 ? "1" : "0", 1);
            setenv("SG_ATTN_CLUSTER", m ? "0" : "1", 1);
            t[m] = time_graph(attn_step, 4, in);
        }
        unsetenv("SG_ATTN_DECODE"), unsetenv("SG_ATTN_CLUSTER");
        double bytes = 2.0 * 12 * (double)lens[i] * 64 * 2;
        printf("time DECODE graph replay(bf16,B=1,H=12,D=64,S=1024,kv_len=%4lld): decode %6.2f us, "
               "decode+combine %6.2f us, split %6.2f us; bytes floor %.2f us at 3 TB/s\n",
               (long long)lens[i], t[0], t[1], t[2], bytes / 3e12 * 1e6);
        sg_release(len);
    }
    release(q), release(k), release(v);
    for (int c = 0; c < 4; c++) {
        int64_t L = c & 1 ? 1024 : 512, ps[4] = {4, L, 36, 64};
        pair p = both(SG_BF16, 4, ps, -1, 1);
        setenv("SG_ATTN_FLASH", c < 2 ? "1" : "0", 1);
        double t = time_graph(prefill_step, 1, &p.g);
        unsetenv("SG_ATTN_FLASH");
        double flop = 4.0 * 4 * 12 * (double)L * (double)L * 64 / 2;
        printf("time PREFILL graph replay(bf16,B=4,H=12,T=%4lld,D=64,causal,fused_qkv) %-5s: "
               "%8.2f us, %6.1f TFLOP/s; floor %.2f us at 989 TFLOP/s\n",
               (long long)L, c < 2 ? "flash" : "mma", t, flop / (t * 1e-6) * 1e-12,
               flop / 989e12 * 1e6);
        release(p);
    }
}

static void timings(void) {
    int64_t qs[4] = {1, 12, 1, 64}, ks[4] = {1, 12, 1024, 64}, one[1] = {1};
    pair q = both(SG_BF16, 4, qs, -1, 1), k = both(SG_BF16, 4, ks, -1, 1);
    pair v = both(SG_BF16, 4, ks, -1, 1);
    static const int64_t lens[] = {1, 8, 64, 256, 512, 1024};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        sg_tensor *len = sg_from_host(gpu, SG_I64, 1, one, &lens[i]);
        double t = time_call(q.g, k.g, v.g, len);
        double bytes = 2.0 * 12 * (double)lens[i] * 64 * 2 + 2.0 * 12 * 64 * 2;
        printf("time DECODE(bf16,B=1,H=12,D=64,S=1024,kv_len=%4lld): %7.2f us/call, %6.1f GB/s, "
               "HBM floor %.2f us\n",
               (long long)lens[i], t * 1e6, bytes / t * 1e-9, bytes / 3.35e12 * 1e6);
        sg_release(len);
    }
    release(q), release(k), release(v);
    static const int64_t pls[2] = {512, 1024};
    for (int c = 0; c < 5; c++) {
        /* bf16 flash at T 512 and 1024, sg_attn_mma (SG_ATTN_FLASH=0) and f32 FFMA at 512 */
        sg_dtype dt = c == 4 ? SG_F32 : SG_BF16;
        int64_t L = pls[c & 1], ps[4] = {4, L, 36, 64};
        const char *kern = c < 2 ? "flash" : c < 4 ? "mma" : "ffma";
        if (c == 2 || c == 3) setenv("SG_ATTN_FLASH", "0", 1);
        pair p = both(dt, 4, ps, -1, 1); /* the GPT-2 layout: views of one QKV projection */
        static const int perm[4] = {0, 2, 1, 3};
        sg_tensor *t[3];
        for (int j = 0; j < 3; j++) {
            sg_tensor *n = sg_narrow(p.g, 2, j * 12, 12);
            t[j] = sg_permute(n, perm);
            sg_release(n);
        }
        double tm = time_call(t[0], t[1], t[2], NULL);
        unsetenv("SG_ATTN_FLASH");
        double flop = 4.0 * 4 * 12 * (double)L * (double)L * 64 / 2; /* causal: half */
        printf("time PREFILL(%s,B=4,H=12,T=%4lld,D=64,causal,fused_qkv) %-5s: %8.2f us/call, "
               "%6.1f TFLOP/s; floor %.2f us at %s\n",
               sg_dtype_name(dt), (long long)L, kern, tm * 1e6, flop / tm * 1e-12,
               flop / (c == 4 ? 67e12 : 989e12) * 1e6,
               c == 4 ? "67 TFLOP/s FFMA" : "989 TFLOP/s bf16 MMA");
        for (int j = 0; j < 3; j++) sg_release(t[j]);
        release(p);
    }
}

int main(void) {
    sg_ctx_opts o = {0};
    o.backend = SG_BACKEND_CUDA;
    if (sg_ctx_create(&o, &gpu) != SG_OK) {
        printf("no CUDA device: %s\n", sg_last_error(NULL));
        return 77;
    }
    o.backend = SG_BACKEND_CPU;
    if (sg_ctx_create(&o, &cpu) != SG_OK) {
        printf("no CPU context: %s\n", sg_last_error(NULL));
        return 1;
    }
    tu_seed(11);
    static const sg_dtype dts[2] = {SG_BF16, SG_F32};
    for (int t = 0; t < 6; t++) {
        /* the decode kernel (a cluster per row where it fits), with the combine kernel, split */
        sg_dtype dt = dts[t % 2];
        setenv("SG_ATTN_DECODE", t < 4 ? "1" : "0", 1);
        setenv("SG_ATTN_CLUSTER", t < 2 ? "1" : "0", 1);
        static const int64_t lens[] = {1,  2,   31,  32,  33,  63,   64,
                                       65, 255, 256, 257, 700, 1023, 1024};
        for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++)
            decode_case(dt, 1, 12, 12, 1, 1024, 64, &lens[i]);
        int64_t gl[4] = {1000, 1, 513, 0}, gs[2] = {9, 40};
        decode_case(dt, 4, 32, 8, 1, 1000, 128, gl);
        decode_case(dt, 4, 32, 4, 4, 1000, 128, gl);
        decode_case(dt, 2, 8, 2, 3, 300, 256, gl);
        decode_case(dt, 2, 6, 3, 1, 77, 80, gl + 1);
        decode_case(dt, 2, 12, 12, 1, 9, 64, gs); /* the example's short cache */
        decode_case(dt, 1, 4, 4, 1, 64, 16, gs + 1);
        if (t >= 2) continue;
        prefill_case(dt, 4, 12, 512, 64);
        prefill_case(dt, 1, 4, 333, 128);
    }
    prefill_cases();
    const char *e = getenv("SG_ATTN_TIMING");
    unsetenv("SG_ATTN_DECODE"), unsetenv("SG_ATTN_CLUSTER");
    if (!(e && strcmp(e, "0") == 0)) timings(), graph_timings();
    sg_ctx_destroy(gpu);
    sg_ctx_destroy(cpu);
    return tu_finish();
}
