/* SPDX-License-Identifier: MIT */
/*
 * lt_probe.c -- W4's eight f32 products through cuBLASLt directly, outside
 * stepgraph: every heuristic candidate (up to 32), with and without the
 * bias and bias-gradient epilogues, and split-K variants (1..32 parts, both
 * reduction schemes) of the first six, each timed warm (median of 15 rounds
 * of 10 calls); one line per candidate with its tile, parts, reduction
 * scheme and workspace, then the best per product. bench/NOTES.md ("split-K
 * and the gradient copies") quotes it. `./lt_probe w6` instead times W6's
 * bf16 backward products per layer (no split-K variants): the dX products
 * plain and with the GELU-gradient epilogues (DGELU, DGELU_BGRAD: the aux a
 * bf16 pre-activation), the dW products plain and with BGRADB (the bias
 * gradient as the reduction over k of the dY operand). Not built by CMake;
 * on a GPU machine:
 *   gcc -O2 -std=c11 -I/usr/local/cuda/include bench/lt_probe.c -o lt_probe \
 *       -L/usr/local/cuda/lib64 -lcublasLt -lcudart && ./lt_probe [w6]
 * Products are in cuBLASLt's column-major terms (cublaslt.h: m = N, n = M).
 */
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_) {                                                                                  \
            printf("cuda %s line %d\n", cudaGetErrorString(e_), __LINE__);                         \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)
typedef struct {
    const char *name;
    int ta, tb;
    int m, n, k, lda, ldb, ldc;
    int ep;
} shp;
static cublasLtHandle_t h;
static void *ws;
static size_t WS = 32u << 20;
static float *A, *B, *D, *bias, *aux;
static cudaDataType_t dtype = CUDA_R_32F; /* CUDA_R_16BF for w6 */
static int splits = 1;                    /* time split-K variants (not for w6) */
static const char *tile_name(int t) {
    static const char *n[] = {
        "U",      "8x8",    "8x16",    "16x8",   "8x32",   "16x16",   "32x8",    "8x64",   "16x32",
        "32x16",  "64x8",   "32x32",   "32x64",  "64x32",  "32x128",  "64x64",   "128x32", "64x128",
        "128x64", "64x256", "128x128", "256x64", "64x512", "128x256", "256x128", "512x64"};
    return t >= 0 && t < 26 ? n[t] : "big";
}
static float timeit(cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t la, cublasLtMatrixLayout_t lb,
                    cublasLtMatrixLayout_t lc, const cublasLtMatmulAlgo_t *algo) {
    float al = 1, be = 0;
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    for (int i = 0; i < 3; i++) {
        cublasStatus_t r =
            cublasLtMatmul(h, d, &al, A, la, B, lb, &be, D, lc, D, lc, algo, ws, WS, 0);
        if (r) {
            printf("  cublasLtMatmul: status %d\n", (int)r);
            return -1;
        }
    }
    /* median of 15 single timings */
    float t[15];
    for (int r = 0; r < 15; r++) {
        cudaEventRecord(e0, 0);
        for (int i = 0; i < 10; i++)
            cublasLtMatmul(h, d, &al, A, la, B, lb, &be, D, lc, D, lc, algo, ws, WS, 0);
        cudaEventRecord(e1, 0);
        cudaEventSynchronize(e1);
        cudaEventElapsedTime(&t[r], e0, e1);
        t[r] *= 100; /* us per call */
    }
    for (int i = 0; i < 15; i++)
        for (int j = i + 1; j < 15; j++)
            if (t[j] < t[i]) {
                float x = t[i];
                t[i] = t[j];
                t[j] = x;
            }
    return t[7];
}
static void cfg(const cublasLtMatmulAlgo_t *a, int *id, int *tile, int *sk, int *red, int *stages) {
    size_t w;
    *id = *tile = *sk = *red = *stages = 0;
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_ID, id, sizeof *id, &w);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_TILE_ID, tile, sizeof *tile, &w);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, sk, sizeof *sk, &w);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, red, sizeof *red,
                                         &w);
    cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_STAGES_ID, stages, sizeof *stages,
                                         &w);
}
static void run(const shp *s, int epi) {
    cublasLtMatmulDesc_t d;
    cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    cublasOperation_t ta = s->ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                      tb = s->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    cublasLtEpilogue_t ep = epi;
    if (epi != CUBLASLT_EPILOGUE_DEFAULT) {
        cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep);
        if (epi & (4 | 16 | 256 | 512)) /* BIAS, BGRAD, BGRADA, BGRADB */
            cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                           sizeof bias);
        if (epi & 128) { /* DGELU reads the pre-activation, D's layout */
            int64_t ld = s->ldc;
            cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux,
                                           sizeof aux);
            cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld);
        }
    }
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatrixLayoutCreate(&la, dtype, s->ta ? s->k : s->m, s->ta ? s->m : s->k, s->lda);
    cublasLtMatrixLayoutCreate(&lb, dtype, s->tb ? s->n : s->k, s->tb ? s->k : s->n, s->ldb);
    cublasLtMatrixLayoutCreate(&lc, dtype, s->m, s->n, s->ldc);
    cublasLtMatmulPreference_t pr;
    cublasLtMatmulPreferenceCreate(&pr);
    cublasLtMatmulPreferenceSetAttribute(pr, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &WS,
                                         sizeof WS);
    cublasLtMatmulHeuristicResult_t res[32];
    int found = 0;
    cublasStatus_t r = cublasLtMatmulAlgoGetHeuristic(h, d, la, lb, lc, lc, pr, 32, res, &found);
    printf("== %s ep=%d m=%d n=%d k=%d ta=%d tb=%d: heuristic %d, found %d\n", s->name, epi, s->m,
           s->n, s->k, s->ta, s->tb, (int)r, found);
    float best = 1e9;
    int besti = -1;
    for (int i = 0; i < found; i++) {
        int id, tile, sk, red, st;
        cfg(&res[i].algo, &id, &tile, &sk, &red, &st);
        float us = timeit(d, la, lb, lc, &res[i].algo);
        if (us > 0 && us < best) best = us, besti = i;
        printf("  h%-2d id=%d tile=%s(%d) splitk=%d red=%d stages=%d ws=%zu waves=%.2f : %.2f us\n",
               i, id, tile_name(tile), tile, sk, red, st, res[i].workspaceSize, res[i].wavesCount,
               us);
    }
    /* split-K variants of the first 6 candidates */
    for (int i = 0; splits && i < found && i < 6; i++) {
        int id, tile, sk0, red0, st;
        cfg(&res[i].algo, &id, &tile, &sk0, &red0, &st);
        for (int sk = 1; sk <= 32; sk *= 2) {
            if (sk == sk0) continue;
            for (int rs = 1; rs <= 2; rs *= 2) {
                cublasLtMatmulAlgo_t a = res[i].algo;
                int red = sk > 1 ? rs : 0;
                if (sk == 1 && rs == 2) continue;
                cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &sk,
                                                     sizeof sk);
                cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME,
                                                     &red, sizeof red);
                cublasLtMatmulHeuristicResult_t chk;
                if (cublasLtMatmulAlgoCheck(h, d, la, lb, lc, lc, &a, &chk) !=
                        CUBLAS_STATUS_SUCCESS ||
                    chk.workspaceSize > WS)
                    continue;
                float us = timeit(d, la, lb, lc, &a);
                printf("  h%d+sk%d red=%d ws=%zu : %.2f us\n", i, sk, red, chk.workspaceSize, us);
                if (us > 0 && us < best) best = us, besti = 100 * i + sk;
            }
        }
    }
    printf("  BEST %s ep=%d: %.2f us (h0 %.2f) at %d\n", s->name, epi, best,
           found ? timeit(d, la, lb, lc, &res[0].algo) : -1.f, besti);
    cublasLtMatmulPreferenceDestroy(pr);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(d);
}
/* W6 (GPT-2 d12, 4 x 1024 tokens) per layer, bf16, in cuBLASLt's terms (m = our N, n = our
 * M): the dX products g @ W (both read N) and the dW products g^T @ x (x read N, g read T, so
 * that BGRADB reduces g over the tokens: the linear's bias gradient). */
static void w6(void) {
    shp s[] = {
        {"fcproj dX (fc's dGELU)", 0, 0, 3072, 4096, 768, 3072, 768, 3072, 0},
        {"fcproj dW", 0, 1, 3072, 768, 4096, 3072, 768, 3072, CUBLASLT_EPILOGUE_BGRADB},
        {"fc dX", 0, 0, 768, 4096, 3072, 768, 3072, 768, 0},
        {"fc dW", 0, 1, 768, 3072, 4096, 768, 3072, 768, CUBLASLT_EPILOGUE_BGRADB},
        {"proj dW", 0, 1, 768, 768, 4096, 768, 768, 768, CUBLASLT_EPILOGUE_BGRADB},
        {"qkv dW", 0, 1, 768, 2304, 4096, 768, 2304, 768, CUBLASLT_EPILOGUE_BGRADB},
    };
    for (unsigned i = 0; i < sizeof s / sizeof *s; i++) {
        run(&s[i], CUBLASLT_EPILOGUE_DEFAULT);
        if (s[i].ep) run(&s[i], s[i].ep);
        if (i == 0) run(&s[i], CUBLASLT_EPILOGUE_DGELU), run(&s[i], CUBLASLT_EPILOGUE_DGELU_BGRAD);
    }
}

int main(int argc, char **argv) {
    bool bf = argc > 1 && strcmp(argv[1], "w6") == 0;
    size_t nb = bf ? 4u << 24 : 4u << 22; /* w6: 64 MiB a buffer */
    CK(cudaMalloc((void **)&A, nb));
    CK(cudaMalloc((void **)&B, nb));
    CK(cudaMalloc((void **)&D, nb));
    CK(cudaMalloc((void **)&aux, nb));
    CK(cudaMalloc((void **)&bias, 4u << 12));
    CK(cudaMalloc(&ws, WS));
    float *hb = malloc(nb);
    unsigned short *hh = (unsigned short *)hb;
    for (size_t i = 0; i < nb / 4; i++) {
        float v = (float)(((unsigned)i * 2654435761u) >> 8) / 16777216.0f - 0.5f;
        if (!bf) {
            hb[i] = v;
            continue;
        }
        unsigned u;
        memcpy(&u, &v, 4);
        hh[2 * i] = hh[2 * i + 1] = (unsigned short)(u >> 16); /* bf16, truncated */
    }
    CK(cudaMemcpy(A, hb, nb, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(B, hb, nb, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(aux, hb, nb, cudaMemcpyHostToDevice));
    cublasLtCreate(&h);
    if (bf) {
        dtype = CUDA_R_16BF, splits = 0;
        w6();
        CK(cudaDeviceSynchronize());
        return 0;
    }
    shp s[] = {
        {"fwd1 x@w1T", 1, 0, 1024, 128, 784, 784, 784, 1024, CUBLASLT_EPILOGUE_BIAS},
        {"fwd2 h1@w2T", 1, 0, 1024, 128, 1024, 1024, 1024, 1024, CUBLASLT_EPILOGUE_BIAS},
        {"fwd3 h2@w3T", 1, 0, 10, 128, 1024, 1024, 1024, 10, CUBLASLT_EPILOGUE_BIAS},
        {"dW3", 0, 1, 1024, 10, 128, 1024, 10, 1024, CUBLASLT_EPILOGUE_BGRADB},
        {"dh2", 0, 0, 1024, 128, 10, 1024, 10, 1024, 0},
        {"dW2", 0, 1, 1024, 1024, 128, 1024, 1024, 1024, CUBLASLT_EPILOGUE_BGRADB},
        {"dh1", 0, 0, 1024, 128, 1024, 1024, 1024, 1024, 0},
        {"dW1", 0, 1, 784, 1024, 128, 784, 1024, 784, CUBLASLT_EPILOGUE_BGRADB},
        /* the other orientation of the weight gradients: dW^T = h^T dz, BGRADA */
        {"dW2t", 0, 1, 1024, 1024, 128, 1024, 1024, 1024, CUBLASLT_EPILOGUE_BGRADA},
    };
    for (unsigned i = 0; i < sizeof s / sizeof *s; i++) {
        run(&s[i], CUBLASLT_EPILOGUE_DEFAULT);
        if (s[i].ep) run(&s[i], s[i].ep);
    }
    CK(cudaDeviceSynchronize());
    return 0;
}
