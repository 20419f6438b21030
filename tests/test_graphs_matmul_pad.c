/* SPDX-License-Identifier: MIT */
/*
 * test_graphs_matmul_pad.c -- the CUDA matmul family's padding decision
 * (graphs/cuda/cuda_matmul.c, sg__mm_pad_make), which needs no device: a
 * product whose operand or result rows are not 16-byte aligned (GPT-2's LM
 * head, N = 50257, forward and both backward products; an odd K) goes
 * through aligned scratch, in chunks of rows that keep the scratch under
 * its cap, with K zero-padded where it is contiguous (split into an
 * aligned part and the rest when the rows are aligned: padded logits), N
 * split into an aligned part and the rest, and with A stored transposed M
 * likewise; a result whose rows alone are unaligned (x @ w^T, no bias, M a
 * multiple of the classes) written in place in row classes instead, with
 * only its leftover columns in scratch (SG_CUDA_MATMUL_CLASSES=off: as
 * before);
 * aligned, small, batched and GEMV products do not; the note
 * sg_fn_explain prints; SG_CUDA_MATMUL_PAD's cap and off. Every expected
 * number is worked out here from the shapes. (test_codegen_nvrtc compiles
 * the copy kernel, sg_mm_pitch_<dt>; test_cuda_matmul runs padded products
 * against an f64 reference on a device.)
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include "graphs/cuda/cublaslt.h"
#include "testutil.h"

#include <string.h>

/* A tensor header (no storage) of dtype dt, contiguous unless stride. */
static sg_tensor fake(sg_dtype dt, int nd, const int64_t *shape, const int64_t *stride) {
    sg_tensor t;
    memset(&t, 0, sizeof t);
    t.dtype = dt;
    t.ndim = nd;
    memcpy(t.shape, shape, sizeof(int64_t) * (size_t)nd);
    int64_t s = 1;
    for (int d = nd - 1; d >= 0; d--) t.stride[d] = stride ? stride[d] : s, s *= shape[d];
    return t;
}

typedef struct want {
    bool pad, a, b, c, a_t, b_t;
    int64_t kp, nm, mm, mchunk, ldb;
    size_t bytes_a, bytes_b, bytes_c;
    int64_t km;                    /* K of the first call; 0: kp (no K split) */
    int64_t classes, cshift, ncls; /* C in place in row classes (0: not) */
} want;

static sg_tensor *case_bias; /* LINEAR's bias in pad_case (NULL: none) */

static size_t r256(size_t n) { return (n + 255) / 256 * 256; }

static void pad_case(const char *name, sg__op op, sg_tensor a, sg_tensor b, sg_tensor out, want w) {
    sg_tensor *in[3] = {&a, &b, case_bias};
    sg__node n = {.op = op, .nin = op == SG__OP_LINEAR ? 3 : 2, .in = in, .out = &out};
    sg__mm_plan p;
    sg__mm_plan_make(&n, &p);
    sg__mm_pad pad;
    bool got = sg__mm_pad_make(&p, out.dtype, &pad);
    bool ok = TU_EXPECT(got == w.pad);
    if (ok && got) {
        ok = TU_EXPECT(pad.a == w.a) && TU_EXPECT(pad.b == w.b) && TU_EXPECT(pad.c == w.c) &&
             TU_EXPECT(pad.a_t == w.a_t) && TU_EXPECT(pad.b_t == w.b_t) &&
             TU_EXPECT(pad.kp == w.kp) && TU_EXPECT(pad.km == (w.km ? w.km : w.kp)) &&
             TU_EXPECT(pad.nm == w.nm) && TU_EXPECT(pad.mm == w.mm) &&
             TU_EXPECT(pad.mchunk == w.mchunk) && TU_EXPECT(pad.ldb == w.ldb) &&
             TU_EXPECT(pad.bytes_a == w.bytes_a) && TU_EXPECT(pad.bytes_b == w.bytes_b) &&
             TU_EXPECT(pad.bytes_c == w.bytes_c) && TU_EXPECT(pad.classes == w.classes) &&
             TU_EXPECT(pad.cshift == w.cshift) && TU_EXPECT(pad.ncls == w.ncls);
        if (!ok)
            fprintf(stderr,
                    "  got a=%d b=%d c=%d a_t=%d b_t=%d kp=%lld km=%lld nm=%lld mm=%lld "
                    "mchunk=%lld ldb=%lld bytes %zu %zu %zu classes %lld shift %lld ncls %lld\n",
                    pad.a, pad.b, pad.c, pad.a_t, pad.b_t, (long long)pad.kp, (long long)pad.km,
                    (long long)pad.nm, (long long)pad.mm, (long long)pad.mchunk, (long long)pad.ldb,
                    pad.bytes_a, pad.bytes_b, pad.bytes_c, (long long)pad.classes,
                    (long long)pad.cshift, (long long)pad.ncls);
    }
    char note[256];
    bool noted = sg__mm_pad_note(&n, note, sizeof note);
    ok = ok && TU_EXPECT(noted == (w.pad && p.M > 8)) && TU_EXPECT(noted == (note[0] != '\0'));
    tu_case(ok, "MATMUL_PAD(%s,%s,M=%lld,N=%lld,K=%lld) -> %s%s", name, sg_dtype_name(out.dtype),
            (long long)p.M, (long long)p.N, (long long)p.K, got ? "padded" : "as is",
            noted ? "" : " (no note)");
    if (noted) printf("     note: %s\n", note);
}

int main(void) {
    const int64_t V = 50257, C = 768, T = 4096, Vp = 50264; /* Vp: V padded to 8 bf16 */
    const size_t cap = (size_t)256 << 20, bf = 2;
    int64_t x3[3] = {4, 1024, 768}, wte[2] = {V, C}, lg3[3] = {4, 1024, V};
    int64_t lg[2] = {T, V}, x2[2] = {T, C}, lgT[2] = {V, T}, lgTs[2] = {1, V}, dw[2] = {V, C};
    /* forward: logits = x @ wte^T; C in place in 8 row classes (ldc 8 * 50257; class j's
     * columns from 7j, 50208 each), columns 0..49 and 50208..50257 (49 each, ld 56) through
     * scratch */
    pad_case("lm_head", SG__OP_LINEAR, fake(SG_BF16, 3, x3, NULL), fake(SG_BF16, 2, wte, NULL),
             fake(SG_BF16, 3, lg3, NULL),
             (want){.pad = true,
                    .c = true,
                    .kp = C,
                    .nm = V - 1,
                    .mm = T,
                    .mchunk = T,
                    .bytes_c = r256((size_t)(2 * T * 56) * bf),
                    .classes = 8,
                    .cshift = 7,
                    .ncls = 50208});
    /* f32: 4 classes (ldc 4 * 50257), columns from 3j, 50248 each; 9 left (ld 12) */
    pad_case("lm_head", SG__OP_LINEAR, fake(SG_F32, 3, x3, NULL), fake(SG_F32, 2, wte, NULL),
             fake(SG_F32, 3, lg3, NULL),
             (want){.pad = true,
                    .c = true,
                    .kp = C,
                    .nm = V - 1,
                    .mm = T,
                    .mchunk = T,
                    .bytes_c = r256((size_t)(2 * T * 12) * 4),
                    .classes = 4,
                    .cshift = 3,
                    .ncls = 50248});
    /* with a bias (its pointer would shift per class), M not a multiple of 8, or classes
     * off: C rows of 50257 into scratch, N as 50256 + 1 */
    int64_t mc = (int64_t)(cap / ((size_t)Vp * bf)) / 256 * 256, bv[1] = {V}, x7[2] = {T - 1, C},
            lg7[2] = {T - 1, V};
    static sg_tensor bias;
    bias = fake(SG_BF16, 1, bv, NULL);
    case_bias = &bias;
    pad_case("lm_head_bias", SG__OP_LINEAR, fake(SG_BF16, 3, x3, NULL), fake(SG_BF16, 2, wte, NULL),
             fake(SG_BF16, 3, lg3, NULL),
             (want){.pad = true,
                    .c = true,
                    .kp = C,
                    .nm = V - 1,
                    .mm = T,
                    .mchunk = mc,
                    .bytes_c = r256((size_t)(mc * Vp) * bf)});
    case_bias = NULL;
    pad_case("lm_head_rows_4095", SG__OP_LINEAR, fake(SG_BF16, 2, x7, NULL),
             fake(SG_BF16, 2, wte, NULL), fake(SG_BF16, 2, lg7, NULL),
             (want){.pad = true,
                    .c = true,
                    .kp = C,
                    .nm = V - 1,
                    .mm = T - 1,
                    .mchunk = mc,
                    .bytes_c = r256((size_t)(mc * Vp) * bf)});
    setenv("SG_CUDA_MATMUL_CLASSES", "off", 1);
    pad_case("lm_head_classes_off", SG__OP_LINEAR, fake(SG_BF16, 3, x3, NULL),
             fake(SG_BF16, 2, wte, NULL), fake(SG_BF16, 3, lg3, NULL),
             (want){.pad = true,
                    .c = true,
                    .kp = C,
                    .nm = V - 1,
                    .mm = T,
                    .mchunk = mc,
                    .bytes_c = r256((size_t)(mc * Vp) * bf)});
    unsetenv("SG_CUDA_MATMUL_CLASSES");
    /* dx = dlogits @ wte: K = 50257 contiguous in A: A and B copied, K zero-padded to 50264
     * (B whole: K x 768) */
    pad_case("lm_head_dx", SG__OP_MATMUL, fake(SG_BF16, 2, lg, NULL), fake(SG_BF16, 2, wte, NULL),
             fake(SG_BF16, 2, x2, NULL),
             (want){.pad = true,
                    .a = true,
                    .b = true,
                    .kp = Vp,
                    .nm = C,
                    .mm = T,
                    .mchunk = mc,
                    .ldb = C,
                    .bytes_a = r256((size_t)(mc * Vp) * bf),
                    .bytes_b = r256((size_t)(Vp * C) * bf)});
    /* dw = dlogits^T @ x: A stored transposed (contiguous along M = 50257, leading dim 50257):
     * copied in chunks of the rows whose K x chunk block fits, the last row on its own */
    int64_t mct = (int64_t)(cap / ((size_t)T * bf)) / 256 * 256;
    pad_case("lm_head_dw", SG__OP_MATMUL, fake(SG_BF16, 2, lgT, lgTs), fake(SG_BF16, 2, x2, NULL),
             fake(SG_BF16, 2, dw, NULL),
             (want){.pad = true,
                    .a = true,
                    .a_t = true,
                    .kp = T,
                    .nm = C,
                    .mm = V - 1,
                    .mchunk = mct,
                    .bytes_a = r256((size_t)(T * mct) * bf)});
    /* The same three with the logits' rows padded to 50264 (memory/pad.c): nothing is
     * copied; N as 50256 + 1, K as 50256 + 1 (the second call accumulates), M as 50256 + 1 */
    int64_t lgp3[3] = {1024 * Vp, Vp, 1}, lgp[2] = {Vp, 1}, lgTp[2] = {1, Vp};
    pad_case("lm_head_padded", SG__OP_LINEAR, fake(SG_BF16, 3, x3, NULL),
             fake(SG_BF16, 2, wte, NULL), fake(SG_BF16, 3, lg3, lgp3),
             (want){.pad = true, .kp = C, .nm = V - 1, .mm = T, .mchunk = T});
    pad_case("lm_head_dx_padded", SG__OP_MATMUL, fake(SG_BF16, 2, lg, lgp),
             fake(SG_BF16, 2, wte, NULL), fake(SG_BF16, 2, x2, NULL),
             (want){.pad = true, .kp = V, .km = V - 1, .nm = C, .mm = T, .mchunk = T});
    pad_case("lm_head_dw_padded", SG__OP_MATMUL, fake(SG_BF16, 2, lgT, lgTp),
             fake(SG_BF16, 2, x2, NULL), fake(SG_BF16, 2, dw, NULL),
             (want){.pad = true, .kp = T, .nm = C, .mm = V - 1, .mchunk = V - 1});
    /* f32 logits, classes off: rows padded to 4 floats, N as 50256 + 1 */
    setenv("SG_CUDA_MATMUL_CLASSES", "off", 1);
    pad_case(
        "lm_head_classes_off", SG__OP_LINEAR, fake(SG_F32, 3, x3, NULL), fake(SG_F32, 2, wte, NULL),
        fake(SG_F32, 3, lg3, NULL),
        (want){.pad = true,
               .c = true,
               .kp = C,
               .nm = V - 1,
               .mm = T,
               .mchunk = (int64_t)(cap / (50260 * 4)) / 256 * 256,
               .bytes_c = r256((size_t)((int64_t)(cap / (50260 * 4)) / 256 * 256 * 50260) * 4)});
    unsetenv("SG_CUDA_MATMUL_CLASSES");
    /* odd K: x's rows and w's rows (B read transposed) both padded with zeros to 1008,
     * the result's rows of 300 (600 bytes) to 304, N as 296 + 4; all 512 rows in one chunk */
    int64_t xk[2] = {512, 1001}, wk[2] = {300, 1001}, ok2[2] = {512, 300};
    pad_case("odd_k", SG__OP_LINEAR, fake(SG_BF16, 2, xk, NULL), fake(SG_BF16, 2, wk, NULL),
             fake(SG_BF16, 2, ok2, NULL),
             (want){.pad = true,
                    .a = true,
                    .b = true,
                    .c = true,
                    .b_t = true,
                    .kp = 1008,
                    .nm = 296,
                    .mm = 512,
                    .mchunk = 512,
                    .ldb = 1008,
                    .bytes_a = r256(512 * 1008 * bf),
                    .bytes_b = r256(300 * 1008 * bf),
                    .bytes_c = r256(512 * 304 * bf)});
    /* aligned, small, batched, and a batch-1 row (the GEMV's): as is */
    int64_t wf[2] = {3072, 768}, of[3] = {4, 1024, 3072};
    pad_case("aligned", SG__OP_LINEAR, fake(SG_BF16, 3, x3, NULL), fake(SG_BF16, 2, wf, NULL),
             fake(SG_BF16, 3, of, NULL), (want){0});
    int64_t xs[2] = {16, 33}, ws[2] = {40, 33}, os[2] = {16, 40};
    pad_case("small", SG__OP_LINEAR, fake(SG_BF16, 2, xs, NULL), fake(SG_BF16, 2, ws, NULL),
             fake(SG_BF16, 2, os, NULL), (want){0});
    int64_t qa[3] = {12, 1023, 64}, kb[3] = {12, 64, 1023}, sc[3] = {12, 1023, 1023};
    pad_case("batched", SG__OP_MATMUL, fake(SG_BF16, 3, qa, NULL), fake(SG_BF16, 3, kb, NULL),
             fake(SG_BF16, 3, sc, NULL), (want){0});
    int64_t x1[2] = {1, 768}, o1[2] = {1, V};
    pad_case("gemv_row", SG__OP_LINEAR, fake(SG_BF16, 2, x1, NULL), fake(SG_BF16, 2, wte, NULL),
             fake(SG_BF16, 2, o1, NULL), (want){0}); /* M = 1 < 2 */
    int64_t x8[2] = {8, 768}, o8[2] = {8, V};
    pad_case("gemv_rows", SG__OP_LINEAR, fake(SG_BF16, 2, x8, NULL), fake(SG_BF16, 2, wte, NULL),
             fake(SG_BF16, 2, o8, NULL),
             (want){.pad = true,
                    .c = true,
                    .kp = C,
                    .nm = V - 1,
                    .mm = 8,
                    .mchunk = 8,
                    .bytes_c = r256(2 * 8 * 56 * bf),
                    .classes = 8,
                    .cshift = 7,
                    .ncls = 50208}); /* no note: GEMV */
    /* a 1 MiB cap (row classes off): chunks of 256 rows (the least); off: as is */
    setenv("SG_CUDA_MATMUL_PAD", "1", 1);
    setenv("SG_CUDA_MATMUL_CLASSES", "off", 1);
    pad_case("cap_1mib", SG__OP_LINEAR, fake(SG_BF16, 3, x3, NULL), fake(SG_BF16, 2, wte, NULL),
             fake(SG_BF16, 3, lg3, NULL),
             (want){.pad = true,
                    .c = true,
                    .kp = C,
                    .nm = V - 1,
                    .mm = T,
                    .mchunk = 256,
                    .bytes_c = r256(256 * Vp * bf)});
    setenv("SG_CUDA_MATMUL_PAD", "off", 1);
    pad_case("off", SG__OP_LINEAR, fake(SG_BF16, 3, x3, NULL), fake(SG_BF16, 2, wte, NULL),
             fake(SG_BF16, 3, lg3, NULL), (want){0});
    unsetenv("SG_CUDA_MATMUL_PAD");
    unsetenv("SG_CUDA_MATMUL_CLASSES");
    return tu_finish();
}
