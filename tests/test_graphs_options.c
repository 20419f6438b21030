/* SPDX-License-Identifier: MIT */
/*
 * test_graphs_options.c -- the compile options under torch's names:
 * epilogue_fusion = SG_FLAG_FALSE leaves every pointwise op after a
 * reduction, row op or matmul out of that kernel (read back from the DOT
 * picture) and keeps the results; force_disable_caches compiles a unit
 * that the disk cache already holds (seen as the "compiled" log line).
 */
#define _POSIX_C_SOURCE 200809L /* setenv, mkdtemp */
#include "testutil.h"

#include <dirent.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int compiled_lines; /* "compiled ..." lines under output_code */

static void log_hook(void *user, const char *topic, const char *line) {
    (void)user;
    if (strcmp(topic, "output_code") == 0 && strncmp(line, "compiled ", 9) == 0) compiled_lines++;
}

enum { M = 6, K = 5, N = 7 };
static sg_tensor *wt; /* K x N parameter */

/* y = softmax(relu(x @ w) * 0.5 + 1, -1) * 2 (M, N); s = sum(tanh(y), 1) - 3 (M) */
static sg_status step(sg_ctx *ctx, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)user;
    int dim = 1;
    sg_tensor *h = sg_add_scalar(sg_mul_scalar(sg_relu(sg_matmul(in[0], wt)), 0.5), 1.0);
    sg_tensor *y = sg_mul_scalar(sg_softmax(h, -1), 2.0);
    out[0] = y;
    out[1] = sg_add_scalar(sg_sum(sg_tanh(y), 1, &dim, false), -3.0);
    return out[0] && out[1] ? SG_OK : sg_ctx_status(ctx);
}

static bool check(sg_tensor *const *out, const double *xv, const double *wv) {
    double y[M * N], s[M];
    for (int i = 0; i < M; i++) {
        double h[N], mx = -INFINITY, den = 0;
        for (int j = 0; j < N; j++) {
            double acc = 0;
            for (int k = 0; k < K; k++) acc += xv[i * K + k] * wv[k * N + j];
            h[j] = (acc > 0 ? acc : 0) * 0.5 + 1.0;
            mx = h[j] > mx ? h[j] : mx;
        }
        for (int j = 0; j < N; j++) den += exp(h[j] - mx);
        s[i] = -3.0;
        for (int j = 0; j < N; j++) {
            y[i * N + j] = exp(h[j] - mx) / den * 2.0;
            s[i] += tanh(y[i * N + j]);
        }
    }
    double *gy = tu_read(out[0]), *gs = tu_read(out[1]);
    bool ok =
        gy && gs && tu_close("y", gy, y, M * N, 1e-4, 1e-5) && tu_close("s", gs, s, M, 1e-4, 1e-5);
    free(gy);
    free(gs);
    return ok;
}

/* From the DOT picture: kernels whose op list has a pointwise op after an
 * anchor (matmul, softmax, sum), and the number of kernels. */
static int epilogues(const char *dot, int *kernels) {
    int n = 0;
    *kernels = 0;
    for (const char *p = dot; (p = strstr(p, "\\nops: ")) != NULL;) {
        p += 7;
        size_t len = strcspn(p, "\\");
        char ops[512];
        snprintf(ops, sizeof ops, "%.*s", (int)len, p);
        (*kernels)++;
        const char *anchors[] = {"matmul", "softmax", "sum"};
        for (int a = 0; a < 3; a++) {
            const char *at = strstr(ops, anchors[a]);
            if (at && at[strlen(anchors[a])] == ',') {
                n++;
                break;
            }
        }
    }
    return n;
}

static char *read_all(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    size_t got = fread(b, 1, (size_t)n, f);
    b[got] = '\0';
    fclose(f);
    return b;
}

static char tmpdir[64];

static bool run(sg_ctx *ctx, sg_tensor *x, const double *xv, const double *wv,
                const sg_compile_opts *o, int *eps, int *kernels) {
    sg_fn *fn = NULL;
    sg_tensor *out[2];
    char path[128];
    snprintf(path, sizeof path, "%s/o.dot", tmpdir);
    bool ok = TU_EXPECT(sg_compile(ctx, step, NULL, 1, 2, o, &fn) == SG_OK) &&
              TU_EXPECT(sg_call(fn, &x, 1, out, 2) == SG_OK) && check(out, xv, wv) &&
              TU_EXPECT(sg_call(fn, &x, 1, out, 2) == SG_OK) && check(out, xv, wv) &&
              TU_EXPECT(strstr(sg_fn_explain(fn), "kernels: ") != NULL) &&
              TU_EXPECT(sg_fn_write_dot(fn, path, NULL) == SG_OK);
    char *dot = ok ? read_all(path) : NULL;
    if (dot) *eps = epilogues(dot, kernels);
    ok = ok && TU_EXPECT(dot != NULL);
    free(dot);
    sg_fn_destroy(fn);
    return ok;
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/sg_options_XXXXXX");
    if (!mkdtemp(tmpdir)) return 1;
    sg_ctx *ctx = NULL;
    sg_ctx_opts co = {.backend = SG_BACKEND_CPU, .log = log_hook};
    if (sg_ctx_create(&co, &ctx) != SG_OK) return 1;
    tu_seed(5);
    double *xv = NULL, *wv = NULL;
    sg_tensor *x = tu_rand(ctx, SG_F32, 2, (int64_t[]){M, K}, -1, 1, &xv);
    wt = tu_rand(ctx, SG_F32, 2, (int64_t[]){K, N}, -1, 1, &wv);

    int eps_on = -1, k_on = 0, eps_off = -1, k_off = 0;
    bool ok = run(ctx, x, xv, wv, &(sg_compile_opts){.name = "epi_default"}, &eps_on, &k_on);
    ok = ok && TU_EXPECT(eps_on >= 1);
    tu_case(ok,
            "EPILOGUE_FUSION(default, matmul->relu..softmax->mul..sum->add) seed=5: %d of %d "
            "kernels fuse an epilogue",
            eps_on, k_on);
    ok =
        run(ctx, x, xv, wv, &(sg_compile_opts){.name = "epi_off", .epilogue_fusion = SG_FLAG_FALSE},
            &eps_off, &k_off);
    /* The pointwise ops move to kernels of their own or before the next anchor. */
    ok = ok && TU_EXPECT(eps_off == 0) && TU_EXPECT(k_off >= k_on);
    tu_case(ok, "EPILOGUE_FUSION(false) seed=5: %d epilogues, %d kernels (default %d)", eps_off,
            k_off, k_on);
    int eps_true = -1, k_true = 0;
    ok =
        run(ctx, x, xv, wv, &(sg_compile_opts){.name = "epi_true", .epilogue_fusion = SG_FLAG_TRUE},
            &eps_true, &k_true);
    ok = ok && TU_EXPECT(eps_true == eps_on && k_true == k_on);
    tu_case(ok, "EPILOGUE_FUSION(true) = default seed=5");

    /* The same unit again: a cache hit, unless force_disable_caches. */
    int eps, kern;
    sg_compile_opts same = {.name = "epi_default"};
    compiled_lines = 0;
    ok = run(ctx, x, xv, wv, &same, &eps, &kern) && TU_EXPECT(compiled_lines == 0);
    tu_case(ok, "FORCE_DISABLE_CACHES(false): the cached unit is loaded, %d compiles",
            compiled_lines);
    same.force_disable_caches = true;
    compiled_lines = 0;
    ok = run(ctx, x, xv, wv, &same, &eps, &kern) && TU_EXPECT(compiled_lines == 1);
    tu_case(ok, "FORCE_DISABLE_CACHES(true): the unit is compiled anew, %d compiles",
            compiled_lines);
    compiled_lines = 0;
    same.force_disable_caches = false;
    ok = run(ctx, x, xv, wv, &same, &eps, &kern) && TU_EXPECT(compiled_lines == 0);
    tu_case(ok, "FORCE_DISABLE_CACHES: the next fn without it hits the cache again");

    /* max-autotune with force_disable_caches, run from an empty directory:
     * the pick goes beside the unit, no file lands in the working directory. */
    char cwd[4096], here[128];
    snprintf(here, sizeof here, "%s/cwd", tmpdir);
    ok = TU_EXPECT(getcwd(cwd, sizeof cwd) != NULL) && TU_EXPECT(mkdir(here, 0700) == 0) &&
         TU_EXPECT(chdir(here) == 0);
    sg_compile_opts tuned = {
        .name = "epi_tuned", .mode = SG_MODE_MAX_AUTOTUNE, .force_disable_caches = true};
    ok = ok && run(ctx, x, xv, wv, &tuned, &eps, &kern);
    int left = 0;
    DIR *d = ok ? opendir(".") : NULL;
    for (struct dirent *e; d && (e = readdir(d));) left += e->d_name[0] != '.';
    if (d) closedir(d);
    ok = ok && TU_EXPECT(left == 0) && TU_EXPECT(chdir(cwd) == 0);
    rmdir(here);
    tu_case(ok, "FORCE_DISABLE_CACHES(true, max-autotune): %d files in the working directory",
            left);

    char path[128];
    snprintf(path, sizeof path, "%s/o.dot", tmpdir);
    unlink(path);
    rmdir(tmpdir);
    sg_release(x);
    sg_release(wt);
    sg_ctx_destroy(ctx);
    free(xv);
    free(wv);
    return tu_finish();
}
