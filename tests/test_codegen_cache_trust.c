/* SPDX-License-Identifier: MIT */
/*
 * test_codegen_cache_trust.c -- the kernel cache as a trust boundary, and
 * its housekeeping (codegen/cache.c, codegen/cache_dir.c): a root that
 * group or others may write to is refused with a message naming it and the
 * fix; an entry that is a link, holds a linked file or a FIFO, or that
 * others may write to is never loaded but rebuilt; SG_OVERRIDE_DIR refuses
 * FIFOs, links and untrusted directories; SG_DUMP_DIR never writes through
 * a link; a compiler that hangs is killed after SG_COMPILE_TIMEOUT; a
 * stray file at an entry's path is replaced; an unusable cache compiles
 * into a private directory; SG_CACHE_MAX_MB evicts least recently used
 * entries, never the one just written, and abandoned builds are removed;
 * sg_cache_clear and sg_cache_dir; checksummed notes beside entries; a
 * root, SG_OVERRIDE_DIR or SG_DUMP_DIR below a directory that other users
 * may write to (mode 777 without the sticky bit, or another user's) is
 * not used, but a sticky one (1777, as /tmp) is.
 *
 * A case that would hang without its fix is cut off by alarm(): the test
 * then dies instead of waiting. Every built kernel is run against a
 * reference computed here.
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
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static sg_ctx *ctx;
static char base[] = "/tmp/sg_cache_trust_XXXXXX";
static int fallback_logs;

static void log_hook(void *user, const char *topic, const char *line) {
    (void)user, (void)line;
    if (strcmp(topic, "fallbacks") == 0) fallback_logs++;
}

/* ------------------------------------------------------------ helpers */

static const char *use_cache(const char *tag, unsigned mode) {
    static char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", base, tag);
    mkdir(dir, 0700);
    chmod(dir, mode);
    setenv("SG_CACHE_DIR", dir, 1);
    return dir;
}

/* y = x * scale + 1 over n, as generated code would spell it. */
static const char *kernel_src(int scale) {
    static char buf[512];
    snprintf(buf, sizeof buf,
             "void sg_k(float *restrict y, const float *restrict x, long n) {\n"
             "    for (long i = 0; i < n; i++) y[i] = x[i] * %d.0f + 1.0f;\n"
             "}\n",
             scale);
    return buf;
}

static bool runs_as(const sg__module *m, int scale) {
    enum { N = 257 };
    void *p = sg__module_sym(m, "sg_k");
    if (!TU_EXPECT(p != NULL)) return false;
    void (*f)(float *, const float *, long);
    memcpy(&f, &p, sizeof f);
    float x[N], y[N];
    double got[N], ref[N];
    for (int i = 0; i < N; i++) x[i] = (float)tu_uniform(-4, 4);
    f(y, x, N);
    for (int i = 0; i < N; i++) got[i] = y[i], ref[i] = (double)x[i] * scale + 1.0;
    return tu_close("sg_k", got, ref, N, tu_rtol(SG_F32), tu_atol(SG_F32));
}

static sg__cache_stats stats(void) {
    sg__cache_stats s;
    sg__cache_get_stats(&s);
    return s;
}

/* Build; expect (compiles, hits, rebuilt) deltas and a kernel that runs.
 * entry (if not NULL) gets the entry's path. */
static bool build_expect(const char *name, int scale, uint64_t dc, uint64_t dh, uint64_t dr,
                         char *entry) {
    sg__cache_stats a = stats();
    sg__module *m = NULL;
    sg_status s = sg__cache_build_c(ctx, name, kernel_src(scale), &m);
    sg__cache_stats b = stats();
    bool ok = TU_EXPECT(s == SG_OK) && TU_EXPECT(m != NULL);
    if (!ok) fprintf(stderr, "  %s: %s\n", sg_status_str(s), sg_last_error(ctx));
    ok = ok && TU_EXPECT(b.compiles - a.compiles == dc) && TU_EXPECT(b.hits - a.hits == dh) &&
         TU_EXPECT(b.rebuilt_corrupt - a.rebuilt_corrupt == dr) && runs_as(m, scale);
    if (ok && entry) snprintf(entry, 1024, "%s", sg__module_path(m));
    sg__module_free(ctx, m);
    sg_clear_error(ctx);
    return ok;
}

/* The build fails with want and a message holding every needle. */
static bool build_fails(const char *name, int scale, sg_status want, const char *const *needles) {
    sg__module *m = NULL;
    sg_status s = sg__cache_build_c(ctx, name, kernel_src(scale), &m);
    const char *msg = sg_last_error(ctx);
    bool ok = TU_EXPECT(s == want) && TU_EXPECT(m == NULL);
    for (; ok && *needles; needles++)
        if (!strstr(msg, *needles)) {
            fprintf(stderr, "  message lacks \"%s\": %s\n", *needles, msg);
            ok = false;
        }
    if (!ok && s == SG_OK) sg__module_free(ctx, m);
    sg_clear_error(ctx);
    return ok;
}

static bool is_dir(const char *p) {
    struct stat st;
    return lstat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static bool exists(const char *p) {
    struct stat st;
    return lstat(p, &st) == 0;
}

static void set_age(const char *p, time_t seconds_ago) {
    struct timespec t[2];
    clock_gettime(CLOCK_REALTIME, &t[0]);
    t[0].tv_sec -= seconds_ago;
    t[1] = t[0];
    utimensat(AT_FDCWD, p, t, AT_SYMLINK_NOFOLLOW);
}

static bool write_text(const char *path, const char *text, unsigned mode) {
    FILE *f = fopen(path, "w");
    if (!f) return false;
    bool ok = fputs(text, f) >= 0;
    ok = fclose(f) == 0 && ok;
    return ok && chmod(path, mode) == 0;
}

static uint64_t dir_bytes(const char *dir) {
    uint64_t total = 0;
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d)) != NULL;) {
        char p[1400];
        struct stat st;
        snprintf(p, sizeof p, "%.1100s/%.255s", dir, e->d_name);
        if (e->d_name[0] != '.' && lstat(p, &st) == 0) total += (uint64_t)st.st_size;
    }
    if (d) closedir(d);
    return total;
}

/* ------------------------------------------------------------ the root */

static void test_untrusted_root(void) {
    static const unsigned modes[] = {0777, 0775, 0757};
    for (int i = 0; i < 3; i++) {
        char tag[32];
        snprintf(tag, sizeof tag, "root%03o", modes[i]);
        const char *dir = use_cache(tag, modes[i]);
        bool ok = build_fails("sg_k_root", 2, SG_ERR_COMPILE,
                              (const char *const[]){dir, "chmod 700", "SG_CACHE_DIR", NULL});
        char buf[600];
        ok = ok && TU_EXPECT(sg_cache_dir(ctx, buf, sizeof buf) == SG_ERR_COMPILE);
        sg_clear_error(ctx);
        /* Nothing was written there. */
        DIR *d = opendir(dir);
        int n = 0;
        for (struct dirent *e; d && (e = readdir(d)) != NULL;) n += e->d_name[0] != '.';
        if (d) closedir(d);
        ok = ok && TU_EXPECT(n == 0);
        chmod(dir, 0700);
        ok = ok && build_expect("sg_k_root", 2, 1, 0, 0, NULL);
        tu_case(ok, "CACHE_TRUST(root mode=%03o -> SG_ERR_COMPILE; after chmod 700 -> OK)",
                modes[i]);
    }
    /* A root of mode 700 that another user owns: the fix named is its
     * owner, not its mode (only root can give one away). */
    if (geteuid() == 0) {
        const char *dir = use_cache("root_nobody", 0700);
        bool ok = TU_EXPECT(chown(dir, 65534, 65534) == 0) &&
                  build_fails("sg_k_root", 2, SG_ERR_COMPILE,
                              (const char *const[]){dir, "owner uid 65534", "chown it to uid 0",
                                                    "SG_CACHE_DIR", NULL});
        sg_clear_error(ctx);
        ok = ok && TU_EXPECT(chown(dir, 0, 0) == 0) && build_expect("sg_k_root", 2, 1, 0, 0, NULL);
        tu_case(ok, "CACHE_TRUST(root owned by uid 65534 -> SG_ERR_COMPILE naming chown; after "
                    "chown -> OK)");
    }
}

/* ------------------------------------------------------------ entries */

typedef enum attack {
    LINKED_ENTRY, /* the entry is a link to a valid entry elsewhere */
    LINKED_SO,    /* kernel.so is a link to an identical copy */
    OPEN_ENTRY,   /* the entry directory is mode 0777 */
    FIFO_META,    /* meta.txt is a FIFO */
    FIFO_SO,      /* kernel.so is a FIFO */
    STRAY_FILE,   /* a plain file sits at the entry's path */
    NUM_ATTACKS
} attack;

static const char *const attack_names[NUM_ATTACKS] = {"linked_entry", "linked_so", "open_entry",
                                                      "fifo_meta",    "fifo_so",   "stray_file"};

/* Tamper with entry (a valid build of sg_k_at in the root). */
static bool do_attack(const char *entry, attack a) {
    char p[1100], q[1200], elsewhere[600];
    snprintf(elsewhere, sizeof elsewhere, "%s/elsewhere-%d", base, (int)a);
    switch (a) {
    case LINKED_ENTRY: return rename(entry, elsewhere) == 0 && symlink(elsewhere, entry) == 0;
    case LINKED_SO:
        snprintf(p, sizeof p, "%s/kernel.so", entry);
        snprintf(q, sizeof q, "%s.copy", elsewhere);
        return rename(p, q) == 0 && symlink(q, p) == 0;
    case OPEN_ENTRY: return chmod(entry, 0777) == 0;
    case FIFO_META:
    case FIFO_SO:
        snprintf(p, sizeof p, "%s/%s", entry, a == FIFO_META ? "meta.txt" : "kernel.so");
        return unlink(p) == 0 && mkfifo(p, 0600) == 0;
    case STRAY_FILE:
        snprintf(q, sizeof q, "rm -rf '%s'", entry);
        return system(q) == 0 && write_text(entry, "stray\n", 0600);
    case NUM_ATTACKS: break;
    }
    return false;
}

static void test_entries(void) {
    for (int a = 0; a < NUM_ATTACKS; a++) {
        char tag[64], entry[1024];
        snprintf(tag, sizeof tag, "entry_%s", attack_names[a]);
        use_cache(tag, 0700);
        alarm(60); /* a FIFO that is opened blocks forever without the fix */
        bool ok = build_expect("sg_k_at", 3, 1, 0, 0, entry);
        ok = ok && TU_EXPECT(do_attack(entry, (attack)a));
        /* Never loaded: rebuilt in place, a real directory again, then a hit. */
        ok = ok && build_expect("sg_k_at", 3, 1, 0, 1, NULL);
        ok = ok && TU_EXPECT(is_dir(entry));
        struct stat st;
        ok = ok && TU_EXPECT(stat(entry, &st) == 0 && (st.st_mode & 022) == 0);
        ok = ok && build_expect("sg_k_at", 3, 0, 1, 0, NULL);
        alarm(0);
        tu_case(ok, "CACHE_TRUST(entry=%s -> rebuilt, never loaded)", attack_names[a]);
    }
}

/* ------------------------------------------------------------ override and dump */

static void test_override(void) {
    use_cache("override", 0700);
    char odir[600], path[700], other[700];
    snprintf(odir, sizeof odir, "%s/over", base);
    snprintf(path, sizeof path, "%s/sg_k_ovr.c", odir);
    snprintf(other, sizeof other, "%s/over_target.c", base);
    mkdir(odir, 0700);
    setenv("SG_OVERRIDE_DIR", odir, 1);

    alarm(60);
    bool ok = TU_EXPECT(mkfifo(path, 0600) == 0) &&
              build_fails("sg_k_ovr", 2, SG_ERR_COMPILE,
                          (const char *const[]){path, "not a regular file", NULL});
    alarm(0);
    tu_case(ok, "CACHE_TRUST(override=fifo -> SG_ERR_COMPILE, no hang)");

    unlink(path);
    ok = TU_EXPECT(write_text(other, kernel_src(7), 0600)) &&
         TU_EXPECT(symlink(other, path) == 0) &&
         build_fails("sg_k_ovr", 2, SG_ERR_COMPILE,
                     (const char *const[]){path, "symbolic link", NULL});
    tu_case(ok, "CACHE_TRUST(override=symlink -> SG_ERR_COMPILE)");

    unlink(path);
    ok = TU_EXPECT(write_text(path, kernel_src(7), 0600)) && TU_EXPECT(chmod(odir, 0777) == 0) &&
         build_fails("sg_k_ovr", 2, SG_ERR_COMPILE,
                     (const char *const[]){odir, "chmod 700", "SG_OVERRIDE_DIR", NULL});
    tu_case(ok, "CACHE_TRUST(override dir mode=777 -> SG_ERR_COMPILE)");

    chmod(odir, 0700); /* now trusted: the edited kernel (scale 7) runs */
    sg__module *m = NULL;
    ok = TU_EXPECT(sg__cache_build_c(ctx, "sg_k_ovr", kernel_src(2), &m) == SG_OK) && runs_as(m, 7);
    sg__module_free(ctx, m);
    tu_case(ok, "CACHE_TRUST(override dir mode=700, regular file -> used)");
    unsetenv("SG_OVERRIDE_DIR");
}

static void test_dump(void) {
    use_cache("dump", 0700);
    char ddir[600], path[700], victim[700];
    snprintf(ddir, sizeof ddir, "%s/dump", base);
    snprintf(path, sizeof path, "%s/sg_k_dump.c", ddir);
    snprintf(victim, sizeof victim, "%s/victim.txt", base);
    mkdir(ddir, 0700);
    bool ok =
        TU_EXPECT(write_text(victim, "precious\n", 0600)) && TU_EXPECT(symlink(victim, path) == 0);
    setenv("SG_DUMP_DIR", ddir, 1);
    ok = ok && build_fails("sg_k_dump", 2, SG_ERR_COMPILE,
                           (const char *const[]){path, "symbolic link", "SG_DUMP_DIR", NULL});
    FILE *f = fopen(victim, "r");
    char text[64] = "";
    if (f) {
        if (!fgets(text, sizeof text, f)) text[0] = '\0';
        fclose(f);
    }
    ok = ok && TU_EXPECT(strcmp(text, "precious\n") == 0);
    unlink(path);
    ok = ok && build_expect("sg_k_dump", 2, 1, 0, 0, NULL) && TU_EXPECT(!is_dir(path)) &&
         TU_EXPECT(exists(path));
    unsetenv("SG_DUMP_DIR");
    tu_case(ok, "CACHE_TRUST(dump file=symlink -> refused, target untouched)");
}

/* ------------------------------------------------------------ the compiler */

static void test_timeout(void) {
    use_cache("timeout", 0700);
    char cc[600], cc2[600];
    snprintf(cc, sizeof cc, "%s/slow-cc", base);
    snprintf(cc2, sizeof cc2, "%s/mute-cc", base);
    bool ok =
        TU_EXPECT(write_text(cc,
                             "#!/bin/sh\n"
                             "if [ \"$1\" = --version ]; then echo 'slow cc 1.0'; exit 0; fi\n"
                             "sleep 30\n",
                             0700)) &&
        TU_EXPECT(write_text(cc2, "#!/bin/sh\nsleep 30\n", 0700));
    setenv("SG_COMPILE_TIMEOUT", "1", 1);
    const char *const ccs[2] = {cc, cc2};
    for (int i = 0; i < 2; i++) {
        setenv("SG_CC", ccs[i], 1);
        alarm(60);
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        bool c = ok && build_fails("sg_k_slow", 2, SG_ERR_COMPILE,
                                   (const char *const[]){ccs[i], "SG_COMPILE_TIMEOUT=1", NULL});
        clock_gettime(CLOCK_MONOTONIC, &t1);
        alarm(0);
        double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        c = c && TU_EXPECT(s < 10.0);
        tu_case(c, "CACHE_TIMEOUT(SG_CC=%s,SG_COMPILE_TIMEOUT=1 -> SG_ERR_COMPILE in %.1f s)",
                i ? "mute-cc" : "slow-cc", s);
    }
    unsetenv("SG_CC");
    unsetenv("SG_COMPILE_TIMEOUT");
    tu_case(build_expect("sg_k_slow", 2, 1, 0, 0, NULL), "CACHE_TIMEOUT(then cc builds)");
}

/* ------------------------------------------------------------ an unusable cache */

static void test_unusable(void) {
    char tmpdir[600];
    snprintf(tmpdir, sizeof tmpdir, "%s/private-tmp", base);
    mkdir(tmpdir, 0700);
    setenv("TMPDIR", tmpdir, 1);
    setenv("SG_CACHE_DIR", "/dev/null/cache", 1);
    int logs = fallback_logs;
    bool ok = build_expect("sg_k_private", 4, 1, 0, 0, NULL) &&
              build_expect("sg_k_private", 4, 1, 0, 0, NULL);
    ok = ok && TU_EXPECT(fallback_logs == logs + 1); /* said once */
    /* The private directories are gone once the modules are loaded. */
    DIR *d = opendir(tmpdir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d)) != NULL;) n += e->d_name[0] != '.';
    if (d) closedir(d);
    ok = ok && TU_EXPECT(n == 0);
    unsetenv("TMPDIR");
    tu_case(ok, "CACHE_PRIVATE(SG_CACHE_DIR=/dev/null/cache -> compiled, SG_OK, nothing left)");
}

/* ------------------------------------------------------------ the directories above */

static int count_entries(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d)) != NULL;) n += e->d_name[0] != '.';
    if (d) closedir(d);
    return n;
}

/* SG_CACHE_DIR=root, with a directory above it that is unsafe: builds still
 * work (compiled privately, never kept, nothing written in root) and
 * sg_cache_dir names the unsafe directory and the fix. */
static bool refused_below(const char *root, const char *unsafe, const char *tmpdir) {
    setenv("SG_CACHE_DIR", root, 1);
    setenv("TMPDIR", tmpdir, 1);
    bool ok = build_expect("sg_k_parent", 3, 1, 0, 0, NULL) &&
              build_expect("sg_k_parent", 3, 1, 0, 0, NULL);
    char buf[600];
    ok = ok && TU_EXPECT(sg_cache_dir(ctx, buf, sizeof buf) == SG_ERR_COMPILE);
    const char *m = sg_last_error(ctx);
    ok = ok && TU_EXPECT(strstr(m, unsafe) != NULL) && TU_EXPECT(strstr(m, "chmod go-w") != NULL) &&
         TU_EXPECT(strstr(m, "sticky") != NULL);
    if (!ok) fprintf(stderr, "  message: %s\n", m);
    sg_clear_error(ctx);
    ok = ok && TU_EXPECT(count_entries(tmpdir) == 0);
    unsetenv("TMPDIR");
    return ok;
}

static void test_unsafe_parents(void) {
    char open_dir[600], root[700], link[700], safe[700], tmpdir[600], other[600], root2[700];
    snprintf(open_dir, sizeof open_dir, "%s/open", base);
    snprintf(root, sizeof root, "%s/cache", open_dir);
    snprintf(link, sizeof link, "%s/link", open_dir);
    snprintf(safe, sizeof safe, "%s/safe-cache", base);
    snprintf(tmpdir, sizeof tmpdir, "%s/parent-tmp", base);
    mkdir(open_dir, 0700);
    mkdir(root, 0700);
    mkdir(safe, 0700);
    mkdir(tmpdir, 0700);
    bool ok = TU_EXPECT(chmod(open_dir, 0777) == 0) && refused_below(root, open_dir, tmpdir) &&
              TU_EXPECT(count_entries(root) == 0);
    tu_case(ok, "CACHE_TRUST(root below a dir of mode 777 -> compiled privately, nothing kept, "
                "sg_cache_dir names it)");

    /* A link to a safe root, in the unsafe directory: whoever may write
     * there may swap the link. */
    ok = TU_EXPECT(symlink(safe, link) == 0) && refused_below(link, open_dir, tmpdir) &&
         TU_EXPECT(count_entries(safe) == 0);
    tu_case(ok, "CACHE_TRUST(root through a link in a dir of mode 777 -> refused the same)");

    /* Sticky, as /tmp: no one may rename another's entries. */
    setenv("SG_CACHE_DIR", root, 1);
    ok = TU_EXPECT(chmod(open_dir, 01777) == 0) && build_expect("sg_k_parent", 3, 1, 0, 0, NULL) &&
         build_expect("sg_k_parent", 3, 0, 1, 0, NULL) && TU_EXPECT(count_entries(root) == 1);
    tu_case(ok, "CACHE_TRUST(root below a dir of mode 1777 -> used and kept)");

    /* SG_OVERRIDE_DIR and SG_DUMP_DIR below the unsafe directory. */
    char odir[700], opath[800], ddir[700];
    snprintf(odir, sizeof odir, "%s/over", open_dir);
    snprintf(opath, sizeof opath, "%s/sg_k_pover.c", odir);
    snprintf(ddir, sizeof ddir, "%s/dump", open_dir);
    use_cache("parents", 0700);
    mkdir(odir, 0700);
    chmod(open_dir, 0777);
    ok = TU_EXPECT(write_text(opath, kernel_src(9), 0600));
    setenv("SG_OVERRIDE_DIR", odir, 1);
    ok = ok && build_fails("sg_k_pover", 2, SG_ERR_COMPILE,
                           (const char *const[]){open_dir, "chmod go-w", "SG_OVERRIDE_DIR", NULL});
    chmod(open_dir, 01777);
    sg__module *m = NULL;
    ok = ok && TU_EXPECT(sg__cache_build_c(ctx, "sg_k_pover", kernel_src(2), &m) == SG_OK) &&
         runs_as(m, 9);
    sg__module_free(ctx, m);
    unsetenv("SG_OVERRIDE_DIR");
    tu_case(ok,
            "CACHE_TRUST(override dir below a dir of mode 777 -> SG_ERR_COMPILE; 1777 -> used)");

    chmod(open_dir, 0777);
    setenv("SG_DUMP_DIR", ddir, 1);
    ok = build_fails("sg_k_pdump", 2, SG_ERR_COMPILE,
                     (const char *const[]){open_dir, "chmod go-w", "SG_DUMP_DIR", NULL}) &&
         TU_EXPECT(count_entries(ddir) == 0);
    chmod(open_dir, 01777);
    ok = ok && build_expect("sg_k_pdump", 2, 1, 0, 0, NULL) && TU_EXPECT(count_entries(ddir) == 1);
    unsetenv("SG_DUMP_DIR");
    tu_case(ok, "CACHE_TRUST(dump dir below a dir of mode 777 -> SG_ERR_COMPILE, nothing written; "
                "1777 -> written)");
    chmod(open_dir, 0700);

    /* A directory above that another user owns, even 0755 (only root can
     * give one away, so only then is there one to test). */
    if (geteuid() == 0) {
        snprintf(other, sizeof other, "%s/nobody", base);
        snprintf(root2, sizeof root2, "%s/cache", other);
        mkdir(other, 0755);
        mkdir(root2, 0700);
        ok = TU_EXPECT(chown(other, 65534, 65534) == 0) && refused_below(root2, other, tmpdir);
        tu_case(ok, "CACHE_TRUST(root below a dir of mode 755 owned by uid 65534 -> refused)");
    }
}

/* ------------------------------------------------------------ size and clearing */

static void test_evict(void) {
    const char *dir = use_cache("evict", 0700);
    char e1[1024], e2[1024], e3[1024], e4[1024], old_tmp[700], young_tmp[700];
    bool ok = build_expect("sg_k_ev1", 11, 1, 0, 0, e1);
    double entry = (double)dir_bytes(e1);
    ok = ok && build_expect("sg_k_ev2", 12, 1, 0, 0, e2);
    set_age(e1, 300);
    set_age(e2, 200);
    /* A hit makes ev1 the most recently used. */
    ok = ok && build_expect("sg_k_ev1", 11, 0, 1, 0, NULL);
    snprintf(old_tmp, sizeof old_tmp, "%s/tmp-old123", dir);
    snprintf(young_tmp, sizeof young_tmp, "%s/tmp-new123", dir);
    mkdir(old_tmp, 0700);
    mkdir(young_tmp, 0700);
    set_age(old_tmp, 7200);
    char mb[64];
    snprintf(mb, sizeof mb, "%.9f", entry * 2.5 / 1048576.0);
    setenv("SG_CACHE_MAX_MB", mb, 1);
    ok = ok && build_expect("sg_k_ev3", 13, 1, 0, 0, e3);
    ok = ok && TU_EXPECT(is_dir(e1)) && TU_EXPECT(!exists(e2)) && TU_EXPECT(is_dir(e3));
    ok = ok && TU_EXPECT(!exists(old_tmp)) && TU_EXPECT(is_dir(young_tmp));
    tu_case(ok, "CACHE_EVICT(SG_CACHE_MAX_MB=%s, 3 entries of %.0f bytes -> LRU one evicted)", mb,
            entry);
    /* A limit below one entry keeps the entry just written. */
    setenv("SG_CACHE_MAX_MB", "0.000001", 1);
    ok = build_expect("sg_k_ev4", 14, 1, 0, 0, e4) && TU_EXPECT(is_dir(e4)) &&
         TU_EXPECT(!exists(e1)) && TU_EXPECT(!exists(e3));
    ok = ok && build_expect("sg_k_ev4", 14, 0, 1, 0, NULL);
    tu_case(ok, "CACHE_EVICT(SG_CACHE_MAX_MB=0.000001 -> only the new entry)");
    /* Limits past 64 bits of bytes are no limit (not an overflow to 0). */
    const char *huge[3] = {"inf", "1e30", "nan"};
    for (int k = 0; k < 3; k++) {
        setenv("SG_CACHE_MAX_MB", huge[k], 1);
        char name[32];
        snprintf(name, sizeof name, "sg_k_ev%d", 5 + k);
        ok = build_expect(name, 15 + k, 1, 0, 0, NULL) && TU_EXPECT(is_dir(e4));
        tu_case(ok, "CACHE_EVICT(SG_CACHE_MAX_MB=%s -> nothing evicted)", huge[k]);
    }
    unsetenv("SG_CACHE_MAX_MB");
}

static void test_clear(void) {
    const char *dir = use_cache("clear", 0700);
    char e1[1024], e2[1024], keep[700], buf[700];
    bool ok = build_expect("sg_k_cl1", 5, 1, 0, 0, e1) && build_expect("sg_k_cl2", 6, 1, 0, 0, e2);
    snprintf(keep, sizeof keep, "%s/not-ours.txt", dir);
    ok = ok && TU_EXPECT(write_text(keep, "user file\n", 0600));
    ok = ok && TU_EXPECT(sg_cache_dir(ctx, buf, sizeof buf) == SG_OK) &&
         TU_EXPECT(strcmp(buf, dir) == 0);
    ok = ok && TU_EXPECT(sg_cache_dir(ctx, buf, 4) == SG_ERR_INVALID_ARG);
    sg_clear_error(ctx);
    ok = ok && TU_EXPECT(sg_cache_clear(ctx) == SG_OK) && TU_EXPECT(!exists(e1)) &&
         TU_EXPECT(!exists(e2)) && TU_EXPECT(exists(keep));
    ok = ok && build_expect("sg_k_cl1", 5, 1, 0, 0, NULL);
    tu_case(ok, "CACHE_CLEAR(2 entries removed, a foreign file kept, rebuilt after)");
    ok = TU_EXPECT(sg_cache_clear(NULL) == SG_ERR_INVALID_ARG);
    tu_case(ok, "CACHE_CLEAR(ctx=NULL -> SG_ERR_INVALID_ARG)");
}

/* ------------------------------------------------------------ notes */

static void test_notes(void) {
    char path[600], link[600], body[128];
    snprintf(path, sizeof path, "%s/note.txt", base);
    snprintf(link, sizeof link, "%s/note-link.txt", base);
    bool ok = TU_EXPECT(sg__note_write(path, "threads=7\n")) &&
              TU_EXPECT(sg__note_read(path, body, sizeof body)) &&
              TU_EXPECT(strcmp(body, "threads=7\n") == 0);
    tu_case(ok, "CACHE_NOTE(write, read back)");
    /* A changed body no longer matches its checksum. */
    FILE *f = fopen(path, "r+");
    if (f) {
        fseek(f, 72 + 8, SEEK_SET);
        fputc('9', f);
        fclose(f);
    }
    ok = TU_EXPECT(f != NULL) && TU_EXPECT(!sg__note_read(path, body, sizeof body));
    ok = ok && TU_EXPECT(write_text(path, "threads=3\n", 0600)) &&
         TU_EXPECT(!sg__note_read(path, body, sizeof body));
    tu_case(ok, "CACHE_NOTE(edited body or no checksum line -> ignored)");
    ok = TU_EXPECT(sg__note_write(path, "threads=2\n")) && TU_EXPECT(symlink(path, link) == 0) &&
         TU_EXPECT(!sg__note_read(link, body, sizeof body));
    alarm(60);
    unlink(path);
    ok = ok && TU_EXPECT(mkfifo(path, 0600) == 0) &&
         TU_EXPECT(!sg__note_read(path, body, sizeof body));
    alarm(0);
    tu_case(ok, "CACHE_NOTE(symlink or fifo -> ignored, no hang)");
}

/* ------------------------------------------------------------ main */

int main(void) {
    if (!mkdtemp(base)) {
        perror("mkdtemp");
        return 1;
    }
    setenv("SG_CFLAGS", "-Wall -Werror", 1);
    unsetenv("SG_CC"), unsetenv("SG_DUMP_DIR"), unsetenv("SG_OVERRIDE_DIR");
    unsetenv("SG_ALWAYS_COMPILE"), unsetenv("SG_CACHE_MAX_MB"), unsetenv("SG_COMPILE_TIMEOUT");
    sg_ctx_opts o = {.backend = SG_BACKEND_CPU, .log = log_hook};
    if (sg_ctx_create(&o, &ctx) != SG_OK) return 1;
    tu_seed(3);
    char cmd[600];
    use_cache("probe", 0700);
    sg__module *probe = NULL;
    if (sg__cache_build_c(ctx, "sg_k_probe", kernel_src(1), &probe) != SG_OK &&
        strstr(sg_last_error(ctx), "cannot run the C compiler")) {
        printf("skipped: %s\n", sg_last_error(ctx));
        sg_ctx_destroy(ctx);
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", base);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", base);
        return 77;
    }
    sg__module_free(ctx, probe);

    test_untrusted_root();
    test_entries();
    test_override();
    test_dump();
    test_timeout();
    test_unusable();
    test_unsafe_parents();
    test_evict();
    test_clear();
    test_notes();

    sg_ctx_destroy(ctx);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", base);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", base);
    return tu_finish();
}
