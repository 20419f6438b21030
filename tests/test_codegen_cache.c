/* SPDX-License-Identifier: MIT */
/*
 * test_codegen_cache.c -- the disk kernel cache and the C compiler driver
 * (codegen/cache.c, codegen/sha256.c): SHA-256 against the FIPS 180-2
 * vectors; a generated-looking kernel compiled, loaded and run against a
 * reference computed here; hits in the same and in a second process
 * compile nothing; two processes racing on one key leave one valid entry;
 * damaged entries (flipped or truncated binary, missing or truncated
 * meta.txt, missing source, a binary that does not load) are rebuilt;
 * SG_OVERRIDE_DIR, SG_DUMP_DIR and SG_ALWAYS_COMPILE; compile errors,
 * binaries with undefined symbols and a missing compiler give
 * SG_ERR_COMPILE with a useful message and leave the context usable;
 * failed allocations leak nothing.
 *
 * Every case runs in its own cache directory under one mkdtemp dir, set
 * through SG_CACHE_DIR (the cache reads the environment at each call).
 * SG_CFLAGS="-Wall -Werror" keeps the kernels here warning-free.
 */
#define _POSIX_C_SOURCE 200809L

#include "testutil.h"

#include "codegen/codegen.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static sg_ctx *ctx;
static char base[] = "/tmp/sg_cache_test_XXXXXX";
static int compile_logs; /* "compiled ..." lines under output_code */

static void log_hook(void *user, const char *topic, const char *line) {
    (void)user;
    if (strcmp(topic, "output_code") == 0 && strncmp(line, "compiled ", 9) == 0) compile_logs++;
}

/* ------------------------------------------------------------ helpers */

/* A fresh cache directory for one case, made the cache root. */
static const char *use_cache(const char *tag) {
    static char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", base, tag);
    mkdir(dir, 0755);
    setenv("SG_CACHE_DIR", dir, 1);
    return dir;
}

/* The source of a generated-looking kernel: y = tanh(x) * scale over n. */
static const char *kernel_src(int scale) {
    static char buf[1024];
    snprintf(buf, sizeof buf,
             "/*\n"
             " * sg_k: y = tanh(x) * %d, f32[n] (test kernel)\n"
             " */\n"
             "#include <math.h>\n"
             "\n"
             "void sg_k(float *restrict y, const float *restrict x, long n) {\n"
             "#ifdef _OPENMP\n"
             "#pragma omp parallel for if (n > 65536)\n"
             "#endif\n"
             "    for (long i = 0; i < n; i++) y[i] = tanhf(x[i]) * %d.0f;\n"
             "}\n",
             scale, scale);
    return buf;
}

typedef void (*kfn)(float *, const float *, long);

/* Run sg_k from m over random inputs; compare with tanh(x) * scale in f64. */
static bool runs_as(const sg__module *m, int scale) {
    enum { N = 1000 };
    void *p = sg__module_sym(m, "sg_k");
    if (!TU_EXPECT(p != NULL)) return false;
    kfn f;
    memcpy(&f, &p, sizeof f);
    float x[N], y[N];
    double got[N], ref[N];
    for (int i = 0; i < N; i++) x[i] = (float)tu_uniform(-3, 3);
    f(y, x, N);
    for (int i = 0; i < N; i++) {
        got[i] = y[i];
        ref[i] = tanh((double)x[i]) * scale;
    }
    return tu_close("sg_k", got, ref, N, tu_rtol(SG_F32), tu_atol(SG_F32));
}

static sg__cache_stats stats(void) {
    sg__cache_stats s;
    sg__cache_get_stats(&s);
    return s;
}

/* Subdirectories of dir; *names gets them, space-separated. */
static int count_dirs(const char *dir, char *names, size_t size) {
    int n = 0;
    DIR *d = opendir(dir);
    if (names) names[0] = '\0';
    for (struct dirent *e; d && (e = readdir(d)) != NULL;) {
        char p[1024];
        struct stat st;
        if (e->d_name[0] == '.') continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (stat(p, &st) != 0 || !S_ISDIR(st.st_mode)) continue;
        n++;
        if (names && strlen(names) + strlen(e->d_name) + 2 < size)
            strcat(strcat(names, " "), e->d_name);
    }
    if (d) closedir(d);
    return n;
}

static bool file_exists(const char *dir, const char *leaf) {
    char p[1024];
    struct stat st;
    snprintf(p, sizeof p, "%s%s%s", dir, leaf[0] ? "/" : "", leaf);
    return stat(p, &st) == 0;
}

/* The whole file (malloc'd, NUL-terminated) or NULL. */
static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)len + 1);
    size_t got = fread(buf, 1, (size_t)len, f);
    fclose(f);
    buf[got] = '\0';
    if (n) *n = got;
    return buf;
}

static bool spit(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return false;
    bool ok = fwrite(data, 1, n, f) == n;
    return fclose(f) == 0 && ok;
}

/* Build, check the counters moved by (compiles, hits, corrupt), run. */
static bool build_expect(const char *name, const char *src, int scale, uint64_t dc, uint64_t dh,
                         uint64_t dr, sg__module **keep) {
    sg__cache_stats a = stats();
    sg__module *m = NULL;
    sg_status s = sg__cache_build_c(ctx, name, src, &m);
    sg__cache_stats b = stats();
    bool ok = TU_EXPECT(s == SG_OK) && TU_EXPECT(m != NULL);
    if (!ok) fprintf(stderr, "  %s: %s\n", sg_status_str(s), sg_last_error(ctx));
    ok = ok && TU_EXPECT(b.compiles - a.compiles == dc) && TU_EXPECT(b.hits - a.hits == dh) &&
         TU_EXPECT(b.rebuilt_corrupt - a.rebuilt_corrupt == dr) && runs_as(m, scale);
    if (keep)
        *keep = m;
    else
        sg__module_free(ctx, m);
    return ok;
}

/* ------------------------------------------------------------ SHA-256 */

static bool sha_is(const void *data, size_t n, const char *want) {
    uint8_t d[32];
    char hex[65];
    sg__sha256(data, n, d);
    sg__sha256_hex(d, hex);
    if (strcmp(hex, want) == 0) return true;
    fprintf(stderr, "  sha256 of %zu bytes: got %s want %s\n", n, hex, want);
    return false;
}

static void test_sha256(void) {
    static const char *const m448 = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    static const char *const m896 = "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmn"
                                    "hijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu";
    tu_case(sha_is("", 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
            "SHA256(msg=\"\")");
    tu_case(sha_is("abc", 3, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"),
            "SHA256(msg=\"abc\")");
    tu_case(sha_is(m448, strlen(m448),
                   "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"),
            "SHA256(msg=448 bits)");
    tu_case(sha_is(m896, strlen(m896),
                   "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"),
            "SHA256(msg=896 bits)");
    char *million = malloc(1000000);
    memset(million, 'a', 1000000);
    tu_case(sha_is(million, 1000000,
                   "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"),
            "SHA256(msg=a*1000000)");
    /* Incremental in uneven pieces (crossing block boundaries) equals one shot. */
    static const size_t pieces[] = {0, 1, 3, 55, 56, 57, 63, 64, 65, 127, 1000};
    sg__sha256_ctx s;
    uint8_t d1[32], d2[32];
    sg__sha256_init(&s);
    size_t off = 0;
    for (int r = 0; off < 100000; r++) {
        size_t n = pieces[r % 11];
        if (off + n > 100000) n = 100000 - off;
        sg__sha256_update(&s, million + off, n);
        off += n;
    }
    sg__sha256_final(&s, d1);
    sg__sha256(million, 100000, d2);
    tu_case(memcmp(d1, d2, 32) == 0, "SHA256_INCREMENTAL(n=100000,pieces=0..1000)");
    free(million);
}

/* ------------------------------------------------------------ builds and hits */

static void test_build_and_hit(void) {
    const char *dir = use_cache("basic");
    int logs = compile_logs;
    sg__module *m1 = NULL, *m2 = NULL;
    bool ok = build_expect("sg_k_tanh2", kernel_src(2), 2, 1, 0, 0, &m1);
    ok = ok && TU_EXPECT(compile_logs == logs + 1) && TU_EXPECT(count_dirs(dir, NULL, 0) == 1);
    const char *entry = sg__module_path(m1);
    ok = ok && TU_EXPECT(strncmp(entry, dir, strlen(dir)) == 0);
    for (const char *const *f = (const char *const[]){"source.c", "kernel.so", "compile.log",
                                                      "meta.txt", NULL};
         ok && *f; f++)
        ok = TU_EXPECT(file_exists(entry, *f));
    char path[1024];
    snprintf(path, sizeof path, "%s/meta.txt", entry);
    char *meta = ok ? slurp(path, NULL) : NULL;
    ok = ok && TU_EXPECT(meta && strstr(meta, "kernel_sha256 ") && strstr(meta, "compiler_id ") &&
                         strstr(meta, "-Werror") && strstr(meta, "dialect c"));
    free(meta);
    tu_case(ok, "CACHE_BUILD(name=sg_k_tanh2,n=1000)");

    /* Same source again, while the first module is still loaded: a hit. */
    ok = build_expect("sg_k_tanh2", kernel_src(2), 2, 0, 1, 0, &m2) && runs_as(m1, 2);
    ok = ok && TU_EXPECT(compile_logs == logs + 1);
    sg__module_free(ctx, m1);
    sg__module_free(ctx, m2);
    /* And after both are closed. */
    ok = ok && build_expect("sg_k_tanh2", kernel_src(2), 2, 0, 1, 0, NULL);
    tu_case(ok, "CACHE_HIT(name=sg_k_tanh2,same_process)");

    /* A second process finds the entry and compiles nothing. */
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) _exit(build_expect("sg_k_tanh2", kernel_src(2), 2, 0, 1, 0, NULL) ? 0 : 1);
    int st = -1;
    waitpid(pid, &st, 0);
    tu_case(WIFEXITED(st) && WEXITSTATUS(st) == 0, "CACHE_HIT(name=sg_k_tanh2,second_process)");
}

/* Parent and child build one new key at the same moment. */
static void test_race(void) {
    const char *dir = use_cache("race");
    int go[2];
    if (pipe(go) != 0) return (void)tu_case(false, "CACHE_RACE(pipe)");
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        char c;
        close(go[1]);
        if (read(go[0], &c, 1) < 0) _exit(2); /* EOF: start */
        sg__module *cm = NULL;
        bool ok = sg__cache_build_c(ctx, "sg_k_race", kernel_src(5), &cm) == SG_OK &&
                  runs_as(cm, 5);
        sg__module_free(ctx, cm);
        _exit(ok ? 0 : 1);
    }
    close(go[0]);
    close(go[1]); /* both go */
    sg__module *m = NULL;
    sg__cache_stats a = stats();
    sg_status s = sg__cache_build_c(ctx, "sg_k_race", kernel_src(5), &m);
    sg__cache_stats b = stats();
    bool ok = TU_EXPECT(s == SG_OK) && runs_as(m, 5);
    sg__module_free(ctx, m);
    int st = -1;
    waitpid(pid, &st, 0);
    char names[512];
    int n = count_dirs(dir, names, sizeof names);
    ok = ok && TU_EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    if (n != 1) fprintf(stderr, "  cache holds:%s\n", names);
    ok = ok && TU_EXPECT(n == 1);
    /* The one entry is whole: a third build hits. */
    ok = ok && build_expect("sg_k_race", kernel_src(5), 5, 0, 1, 0, NULL);
    tu_case(ok, "CACHE_RACE(processes=2,parent_compiled=%d)", (int)(b.compiles - a.compiles));
}

/* ------------------------------------------------------------ damaged entries */

typedef enum damage {
    FLIP_SO,
    TRUNCATE_SO,
    DELETE_META,
    TRUNCATE_META,
    DELETE_SOURCE,
    GARBAGE_SO, /* a kernel.so that does not load, with meta.txt agreeing */
    NUM_DAMAGES
} damage;

static const char *const damage_names[NUM_DAMAGES] = {
    "flip_so", "truncate_so", "delete_meta", "truncate_meta", "delete_source", "garbage_so"};

static bool do_damage(const char *entry, damage kind) {
    char so[1024], meta[1024], src[1024];
    snprintf(so, sizeof so, "%s/kernel.so", entry);
    snprintf(meta, sizeof meta, "%s/meta.txt", entry);
    snprintf(src, sizeof src, "%s/source.c", entry);
    size_t n = 0;
    char *b = NULL;
    bool ok = false;
    switch (kind) {
    case FLIP_SO:
        b = slurp(so, &n);
        if (b && n > 100) {
            b[n / 2] ^= (char)0xff;
            b[n / 3] ^= 0x55;
            ok = spit(so, b, n);
        }
        break;
    case TRUNCATE_SO:
        b = slurp(so, &n);
        ok = b && truncate(so, (off_t)(n / 2)) == 0;
        break;
    case DELETE_META: ok = unlink(meta) == 0; break;
    case TRUNCATE_META: ok = truncate(meta, 20) == 0; break; /* inside the key line */
    case DELETE_SOURCE: ok = unlink(src) == 0; break;
    case GARBAGE_SO: {
        static const char junk[] = "this is not an ELF shared object\n";
        uint8_t d[32];
        char hex[65];
        sg__sha256(junk, sizeof junk - 1, d);
        sg__sha256_hex(d, hex);
        b = slurp(meta, &n);
        char *line = b ? strstr(b, "kernel_sha256 ") : NULL;
        if (line && strlen(line) > 14 + 64) {
            memcpy(line + 14, hex, 64);
            ok = spit(meta, b, n) && spit(so, junk, sizeof junk - 1);
        }
        break;
    }
    case NUM_DAMAGES: break;
    }
    free(b);
    return ok;
}

static void test_damaged(void) {
    use_cache("damaged");
    sg__module *m = NULL;
    char entry[1024] = "";
    if (build_expect("sg_k_damage", kernel_src(2), 2, 1, 0, 0, &m))
        snprintf(entry, sizeof entry, "%s", sg__module_path(m));
    sg__module_free(ctx, m); /* never damage a file that is mapped */
    for (int k = 0; k < NUM_DAMAGES; k++) {
        bool ok = TU_EXPECT(entry[0] && do_damage(entry, (damage)k));
        m = NULL;
        ok = ok && build_expect("sg_k_damage", kernel_src(2), 2, 1, 0, 1, &m);
        ok = ok && TU_EXPECT(strcmp(sg__module_path(m), entry) == 0);
        sg__module_free(ctx, m);
        /* The rebuilt entry is whole again. */
        ok = ok && build_expect("sg_k_damage", kernel_src(2), 2, 0, 1, 0, NULL);
        tu_case(ok, "CACHE_DAMAGED(damage=%s)", damage_names[k]);
    }
}

/* ------------------------------------------------------------ dump, override, always */

static void test_override(void) {
    use_cache("override");
    char odir[512], path[600];
    snprintf(odir, sizeof odir, "%s/override", base);
    mkdir(odir, 0755);
    snprintf(path, sizeof path, "%s/sg_k_ovr.c", odir);
    bool ok = build_expect("sg_k_ovr", kernel_src(2), 2, 1, 0, 0, NULL);
    const char *edited = kernel_src(3);
    ok = ok && TU_EXPECT(spit(path, edited, strlen(edited)));
    setenv("SG_OVERRIDE_DIR", odir, 1);
    ok = ok && build_expect("sg_k_ovr", kernel_src(2), 3, 1, 0, 0, NULL);
    ok = ok && build_expect("sg_k_ovr", kernel_src(2), 3, 0, 1, 0, NULL);
    /* Kernels without a file in the override dir are untouched. */
    ok = ok && build_expect("sg_k_other", kernel_src(2), 2, 0, 1, 0, NULL);
    unsetenv("SG_OVERRIDE_DIR");
    ok = ok && build_expect("sg_k_ovr", kernel_src(2), 2, 0, 1, 0, NULL);
    tu_case(ok, "CACHE_OVERRIDE(name=sg_k_ovr,edit=scale 2->3)");
}

static void test_dump(void) {
    use_cache("dump");
    char ddir[512], path[600];
    snprintf(ddir, sizeof ddir, "%s/dump/deeper", base); /* made with mkdir -p */
    snprintf(path, sizeof path, "%s/sg_k_dump.c", ddir);
    setenv("SG_DUMP_DIR", ddir, 1);
    bool ok = build_expect("sg_k_dump", kernel_src(4), 4, 1, 0, 0, NULL);
    char *text = slurp(path, NULL);
    ok = ok && TU_EXPECT(text && strcmp(text, kernel_src(4)) == 0);
    free(text);
    /* A hit dumps too. */
    unlink(path);
    ok = ok && build_expect("sg_k_dump", kernel_src(4), 4, 0, 1, 0, NULL);
    ok = ok && TU_EXPECT(file_exists(path, ""));
    unsetenv("SG_DUMP_DIR");
    tu_case(ok, "CACHE_DUMP(name=sg_k_dump,dir=dump/deeper)");
}

static void test_always(void) {
    const char *dir = use_cache("always");
    int logs = compile_logs;
    bool ok = build_expect("sg_k_always", kernel_src(2), 2, 1, 0, 0, NULL);
    setenv("SG_ALWAYS_COMPILE", "1", 1);
    ok = ok && build_expect("sg_k_always", kernel_src(2), 2, 1, 0, 0, NULL);
    unsetenv("SG_ALWAYS_COMPILE");
    ok = ok && TU_EXPECT(compile_logs == logs + 2);
    /* The republished entry serves the next build. */
    ok = ok && build_expect("sg_k_always", kernel_src(2), 2, 0, 1, 0, NULL);
    ok = ok && TU_EXPECT(count_dirs(dir, NULL, 0) == 1);
    tu_case(ok, "CACHE_ALWAYS_COMPILE(name=sg_k_always)");
}

/* ------------------------------------------------------------ errors */

/* The build fails with want, *out untouched, the message holds every
 * string of needles; then the context builds a good kernel again. */
static bool fails_with(const char *name, const char *src, sg_status want,
                       const char *const *needles) {
    sg__module *m = NULL;
    sg__cache_stats a = stats();
    sg_status s = sg__cache_build_c(ctx, name, src, &m);
    const char *msg = sg_last_error(ctx);
    bool ok = TU_EXPECT(s == want) && TU_EXPECT(m == NULL) &&
              TU_EXPECT(stats().compiles == a.compiles);
    for (; ok && *needles; needles++)
        if (!strstr(msg, *needles)) {
            fprintf(stderr, "  message lacks \"%s\": %s\n", *needles, msg);
            ok = false;
        }
    /* A compile error points at its full log, which is still there. */
    const char *lp = strstr(msg, "log: ");
    if (ok && want == SG_ERR_COMPILE && lp) {
        char path[1024];
        snprintf(path, sizeof path, "%.*s", (int)strcspn(lp + 5, "\n;"), lp + 5);
        ok = TU_EXPECT(file_exists(path, ""));
    }
    ok = ok && TU_EXPECT(sg_ctx_status(ctx) == want);
    sg_clear_error(ctx);
    return ok && build_expect("sg_k_fine", kernel_src(2), 2, 0, 1, 0, NULL);
}

static void test_errors(void) {
    const char *dir = use_cache("errors");
    bool ok = build_expect("sg_k_fine", kernel_src(2), 2, 1, 0, 0, NULL);
    tu_case(ok && fails_with("sg_k_syntax", "void sg_k(float *y) {\n    y[0] = 1.0f\n}\n",
                             SG_ERR_COMPILE,
                             (const char *const[]){"sg_k_syntax", "error", "expected",
                                                   "compile.log", NULL}),
            "CACHE_ERROR(kind=syntax)");
    tu_case(fails_with("sg_k_warning",
                       "void sg_k(float *y) {\n    int unused = 0;\n    y[0] = 1;\n}\n",
                       SG_ERR_COMPILE, (const char *const[]){"unused", "error", NULL}),
            "CACHE_ERROR(kind=warning,SG_CFLAGS=-Wall -Werror)");
    tu_case(fails_with("sg_k_undef",
                       "void sg_missing_helper(float *y);\n"
                       "void sg_k(float *y) { sg_missing_helper(y); }\n",
                       SG_ERR_COMPILE,
                       (const char *const[]){"sg_k_undef", "does not load", "sg_missing_helper",
                                             NULL}),
            "CACHE_ERROR(kind=undefined_symbol)");
    setenv("SG_CC", "/nonexistent/cc", 1);
    sg__module *m = NULL;
    sg_status s = sg__cache_build_c(ctx, "sg_k_fine", kernel_src(2), &m);
    unsetenv("SG_CC");
    const char *msg = sg_last_error(ctx);
    ok = TU_EXPECT(s == SG_ERR_COMPILE) && TU_EXPECT(m == NULL) &&
         TU_EXPECT(strstr(msg, "/nonexistent/cc") && strstr(msg, "SG_CC") && strstr(msg, "gcc"));
    sg_clear_error(ctx);
    ok = ok && build_expect("sg_k_fine", kernel_src(2), 2, 0, 1, 0, NULL);
    tu_case(ok, "CACHE_ERROR(kind=missing_compiler,SG_CC=/nonexistent/cc)");
    /* SG_CC with a flag in it, and a program that fails printing nothing:
     * the message says what SG_CC must be, not a bug of the library. */
    const char *ccs[2] = {"cc -DX", "false"}, *says[2] = {"SG_CFLAGS", "set SG_CC to a C compiler"};
    for (int i = 0; i < 2; i++) {
        setenv("SG_CC", ccs[i], 1);
        setenv("SG_ALWAYS_COMPILE", "1", 1);
        m = NULL;
        s = sg__cache_build_c(ctx, "sg_k_fine", kernel_src(2), &m);
        unsetenv("SG_CC"), unsetenv("SG_ALWAYS_COMPILE");
        msg = sg_last_error(ctx);
        ok = TU_EXPECT(s == SG_ERR_COMPILE) && TU_EXPECT(m == NULL) &&
             TU_EXPECT(strstr(msg, says[i]) != NULL) &&
             TU_EXPECT(strstr(msg, "stepgraph bug") == NULL);
        if (!ok) fprintf(stderr, "  %s\n", msg);
        sg_clear_error(ctx);
        ok = ok && build_expect("sg_k_fine", kernel_src(2), 2, 0, 1, 0, NULL);
        tu_case(ok, "CACHE_ERROR(kind=bad_compiler,SG_CC=%s)", ccs[i]);
    }
    tu_case(fails_with("../evil", kernel_src(2), SG_ERR_INVALID_ARG,
                       (const char *const[]){"../evil", "[A-Za-z0-9_.-]", NULL}),
            "CACHE_ERROR(kind=bad_name,name=../evil)");
    /* Failed builds are kept aside (<key>.failed), never as entries. */
    char names[1024];
    count_dirs(dir, names, sizeof names);
    int entries = 0;
    for (char *t = strtok(names, " "); t; t = strtok(NULL, " ")) entries += !strstr(t, ".failed");
    tu_case(TU_EXPECT(entries == 1), "CACHE_ERROR(failed builds are not entries)");
}

/* Fail each allocation of a build in turn: OOM, nothing leaked, then OK. */
static void test_oom(void) {
    use_cache("oom");
    bool ok = build_expect("sg_k_oom", kernel_src(2), 2, 1, 0, 0, NULL);
    int ooms = 0;
    for (long k = 1; ok && k < 50; k++) {
        tu_alloc a = {0};
        sg_ctx *c = NULL;
        sg_ctx_opts o = {.backend = SG_BACKEND_CPU, .alloc = tu_alloc_hook, .alloc_user = &a};
        if (!TU_EXPECT(sg_ctx_create(&o, &c) == SG_OK)) break;
        size_t live = a.bytes;
        a.fail_at = a.count + k;
        sg__module *m = NULL;
        sg_status s = sg__cache_build_c(c, "sg_k_oom", kernel_src(2), &m);
        if (s == SG_OK) ok = runs_as(m, 2);
        sg__module_free(c, m);
        ok = ok && TU_EXPECT(s == SG_OK || s == SG_ERR_OOM) && TU_EXPECT(a.bytes == live);
        sg_ctx_destroy(c);
        ok = ok && TU_EXPECT(a.live == 0);
        if (s == SG_OK) break;
        ooms++;
    }
    tu_case(ok && TU_EXPECT(ooms >= 2), "CACHE_OOM(fail_nth=1..%d)", ooms + 1);
}

/* ------------------------------------------------------------ main */

static void remove_tree(const char *path) {
    DIR *d = opendir(path);
    for (struct dirent *e; d && (e = readdir(d)) != NULL;) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        char p[1024];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", path, e->d_name);
        if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode))
            remove_tree(p);
        else
            unlink(p);
    }
    if (d) closedir(d);
    rmdir(path);
}

int main(void) {
    if (!mkdtemp(base)) {
        perror("mkdtemp");
        return 1;
    }
    setenv("SG_CFLAGS", "-Wall -Werror", 1);
    unsetenv("SG_CC"), unsetenv("SG_DUMP_DIR"), unsetenv("SG_OVERRIDE_DIR");
    unsetenv("SG_ALWAYS_COMPILE");
    sg_ctx_opts o = {.backend = SG_BACKEND_CPU, .log = log_hook};
    if (sg_ctx_create(&o, &ctx) != SG_OK) return 1;
    tu_seed(1);
    size_t live0 = 0, live1 = 0;
    sg_ctx_host_bytes(ctx, &live0, NULL);

    test_sha256();
    /* Without a C compiler there is nothing to test: skip. */
    use_cache("probe");
    sg__module *probe = NULL;
    if (sg__cache_build_c(ctx, "sg_k_probe", kernel_src(1), &probe) != SG_OK &&
        strstr(sg_last_error(ctx), "cannot run the C compiler")) {
        printf("skipped: %s\n", sg_last_error(ctx));
        sg_ctx_destroy(ctx);
        remove_tree(base);
        return 77;
    }
    sg__module_free(ctx, probe);

    test_build_and_hit();
    test_race();
    test_damaged();
    test_override();
    test_dump();
    test_always();
    test_errors();
    test_oom();

    sg_ctx_host_bytes(ctx, &live1, NULL);
    tu_case(live1 == live0, "CACHE_NO_LEAK(host_bytes=%zu->%zu)", live0, live1);
    sg_ctx_destroy(ctx);
    remove_tree(base);
    return tu_finish();
}
