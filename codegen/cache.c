/* SPDX-License-Identifier: MIT */
/*
 * cache.c -- the disk kernel cache and the run-time C compiler driver.
 * sg__cache_build_c turns C source into a loaded shared object: it looks the
 * source up in the cache, and on a miss runs the compiler (posix_spawnp, no
 * shell), loads the result and publishes it as a cache entry.
 *
 * Layout, as in Triton: <root>/<key>/ holds source.c, kernel.so,
 * compile.log and meta.txt. The key is the hex SHA-256 over the generator
 * version, the dialect, the compiler (path and first line of --version),
 * the host CPU (-march=native makes binaries CPU-specific, and a cache in
 * an NFS home may be shared by different machines), the flags and the
 * source. meta.txt starts with the key and the SHA-256s of kernel.so and
 * source.c, so a hit can prove the entry intact before loading it.
 *
 * Concurrency: a build compiles into a fresh <root>/tmp-XXXXXX and renames
 * it to <root>/<key>. rename() of a directory is atomic, so readers see a
 * whole entry or none; if another process published the key first, ours is
 * thrown away (the module we already loaded from it stays valid: a mapped
 * file outlives its name). Damaged entries are renamed to a trash
 * directory before being deleted, for the same reason. A failed compile
 * leaves its directory as <root>/<key>.failed, so the log the error message
 * points to stays there to be read.
 *
 * Trust: the root must be the user's and writable by no one else, and so
 * must every entry loaded (cache_dir.c has the checks); a root that cannot
 * be used at all (not creatable, not writable, or below a directory that
 * other users may write to) makes the build compile into a private mkdtemp
 * directory instead. The compiler runs in its own process
 * group, killed after SG_COMPILE_TIMEOUT seconds (default 120).
 */
#define _GNU_SOURCE /* pipe2 */

#include "codegen.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef PATH_MAX
#define PATH_MAX 4096
#endif

extern char **environ;

struct sg__module {
    void *handle;
    char path[PATH_MAX]; /* the cache entry */
};

/* ------------------------------------------------------------ process-wide state */

static atomic_uint_fast64_t n_compiles, n_hits, n_corrupt;

void sg__cache_get_stats(sg__cache_stats *out) {
    out->compiles = atomic_load(&n_compiles);
    out->hits = atomic_load(&n_hits);
    out->rebuilt_corrupt = atomic_load(&n_corrupt);
}

/* Guards the two memo tables below. It is held only to copy a few hundred
 * bytes (the slow work happens outside), so a spin lock is enough and spares
 * the library a dependency on pthreads. */
static atomic_flag memo_lock = ATOMIC_FLAG_INIT;

static void memo_take(void) {
    while (atomic_flag_test_and_set_explicit(&memo_lock, memory_order_acquire)) sched_yield();
}

static void memo_give(void) { atomic_flag_clear_explicit(&memo_lock, memory_order_release); }

#define ID_SIZE 256
#define ARCH_SIZE 320

/* The first line of `<cc> --version`, per compiler, computed once each. */
#define ID_SLOTS 8
static struct {
    char cc[512];
    char id[ID_SIZE];
} id_memo[ID_SLOTS];
static int id_count;

static char arch_memo[ARCH_SIZE];
static bool arch_known;

/* ------------------------------------------------------------ small file helpers */

/* dst = a b c; whether it fit. open_root keeps the root short enough that
 * every path made from it fits, so most callers need not look. (Not
 * snprintf: optimizing builds see through it and warn about truncation.) */
static bool path3(char *dst, size_t size, const char *a, const char *b, const char *c) {
    size_t la = strlen(a), lb = strlen(b), lc = strlen(c);
    if (la + lb + lc >= size) {
        dst[0] = '\0'; /* names nothing rather than the wrong file */
        return false;
    }
    memcpy(dst, a, la);
    memcpy(dst + la, b, lb);
    memcpy(dst + la + lb, c, lc + 1);
    return true;
}

/* Up to size-1 bytes of the file's start into buf, NUL-terminated; the
 * count read into *n. Returns 0 or an errno. */
static int read_head(const char *path, bool own, char *buf, size_t size, size_t *n) {
    int fd = sg__open_file(path, O_RDONLY, own);
    if (fd < 0) return -fd;
    size_t got = 0;
    while (got < size - 1) {
        ssize_t r = read(fd, buf + got, size - 1 - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(fd);
    buf[got] = '\0';
    if (n) *n = got;
    return 0;
}

/* The SHA-256 of a whole file as hex. Returns 0 or an errno. */
static int hash_file(const char *path, char hex[65]) {
    int fd = sg__open_file(path, O_RDONLY, true);
    if (fd < 0) return -fd;
    sg__sha256_ctx s;
    sg__sha256_init(&s);
    uint8_t buf[16384];
    for (;;) {
        ssize_t r = read(fd, buf, sizeof buf);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            int e = errno;
            close(fd);
            return e;
        }
        if (r == 0) break;
        sg__sha256_update(&s, buf, (size_t)r);
    }
    close(fd);
    uint8_t d[32];
    sg__sha256_final(&s, d);
    sg__sha256_hex(d, hex);
    return 0;
}

static long elapsed_ms(const struct timespec *t0) {
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (long)(t1.tv_sec - t0->tv_sec) * 1000 + (t1.tv_nsec - t0->tv_nsec) / 1000000;
}

/* ------------------------------------------------------------ running programs */

typedef struct pipe_drain {
    int read_fd;
    char *buf;
    size_t size, len;
} pipe_drain;

/* SG_COMPILE_TIMEOUT in seconds (default 120; 0 or less: none). */
static double compile_timeout(void) {
    const char *v = getenv("SG_COMPILE_TIMEOUT");
    char *end = NULL;
    double t = v && v[0] ? strtod(v, &end) : 120.0;
    return v && v[0] && end == v ? 120.0 : t;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Read what the program writes into the pipe (keeping the start) until EOF
 * or the deadline; false on the deadline. */
static bool drain_until(pipe_drain *pd, double deadline) {
    char sink[512];
    for (;;) {
        int ms = 1000;
        if (deadline > 0) {
            double left = deadline - now_s();
            if (left <= 0) return false;
            ms = left < 1.0 ? (int)(left * 1000) + 1 : 1000;
        }
        struct pollfd p = {.fd = pd->read_fd, .events = POLLIN};
        int r = poll(&p, 1, ms);
        if (r < 0 && errno != EINTR) return true;
        if (r <= 0) continue;
        char *dst = pd->len + 1 < pd->size ? pd->buf + pd->len : sink;
        size_t room = dst == sink ? sizeof sink : pd->size - 1 - pd->len;
        ssize_t n = read(pd->read_fd, dst, room);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return true;
        if (dst != sink) pd->len += (size_t)n;
    }
}

/* Wait for pid until the deadline (0: none), polling with a growing sleep
 * (1 to 20 ms). False on the deadline. */
static bool wait_until(pid_t pid, int *status, double deadline) {
    long ns = 1000000;
    for (;;) {
        pid_t r = waitpid(pid, status, deadline > 0 ? WNOHANG : 0);
        if (r == pid) return true;
        /* ECHILD: the application ignores SIGCHLD, so the status is lost;
         * the caller then judges by the files the program left. */
        if (r < 0 && errno != EINTR) return true;
        if (r == 0 && now_s() >= deadline) return false;
        if (r == 0) {
            struct timespec ts = {0, ns};
            nanosleep(&ts, NULL);
            ns = ns < 20000000 ? ns * 2 : ns;
        }
    }
}

/* Spawn argv[0] (searched in PATH) in its own process group, with stdin
 * from /dev/null and stdout and stderr into out_fd; with pd, out_fd is the
 * write end of a pipe (closed here) whose output pd collects. Waits for
 * the program, at most timeout_s seconds (0 or less: forever); on expiry
 * its whole process group is killed. *status gets the wait status.
 * Returns 0, ETIMEDOUT, or the errno of a spawn that failed (ENOENT: no
 * such program). */
static int run_program(char *const argv[], int out_fd, int *status, pipe_drain *pd,
                       double timeout_s) {
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t at;
    int rc = posix_spawn_file_actions_init(&fa);
    if (rc) return rc;
    rc = posix_spawnattr_init(&at);
    if (rc) {
        posix_spawn_file_actions_destroy(&fa);
        return rc;
    }
    rc = posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    if (!rc) rc = posix_spawn_file_actions_adddup2(&fa, out_fd, 1);
    if (!rc) rc = posix_spawn_file_actions_adddup2(&fa, out_fd, 2);
    if (!rc) rc = posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP);
    if (!rc) rc = posix_spawnattr_setpgroup(&at, 0);
    pid_t pid;
    if (!rc) rc = posix_spawnp(&pid, argv[0], &fa, &at, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
    if (pd) close(out_fd);
    if (rc) return rc;
    double deadline = timeout_s > 0 ? now_s() + timeout_s : 0;
    *status = 0;
    bool in_time = (!pd || drain_until(pd, deadline)) && wait_until(pid, status, deadline);
    if (pd) pd->buf[pd->len] = '\0';
    if (in_time) return 0;
    kill(-pid, SIGKILL); /* the compiler and whatever it started */
    kill(pid, SIGKILL);
    while (waitpid(pid, status, 0) < 0 && errno == EINTR) {
    }
    return ETIMEDOUT;
}

int sg__run_program(char *const argv[], int out_fd, int *status, double timeout_s) {
    return run_program(argv, out_fd, status, NULL, timeout_s);
}

/* The first line of `cc --version` into id. Returns 0 or the spawn's errno
 * (ENOENT when the program does not exist). */
static int query_compiler_id(const char *cc, char id[ID_SIZE]) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return errno;
    char *argv[] = {(char *)cc, "--version", NULL};
    pipe_drain pd = {fds[0], id, ID_SIZE, 0};
    int status = 0;
    int rc = run_program(argv, fds[1], &status, &pd, compile_timeout());
    close(fds[0]);
    if (rc) return rc;
    /* A shell wrapper reports a missing program as exit status 127. */
    if (WIFEXITED(status) && WEXITSTATUS(status) == 127) return ENOENT;
    id[strcspn(id, "\r\n")] = '\0';
    if (id[0] == '\0') snprintf(id, ID_SIZE, "unknown (%.200s --version printed nothing)", cc);
    return 0;
}

/* The compiler's identity, memoized per compiler path (a failure is not
 * memoized: the user may install the compiler and try again). */
static int compiler_id(const char *cc, char id[ID_SIZE]) {
    bool found = false;
    memo_take();
    for (int i = 0; i < id_count && !found; i++)
        if (strcmp(id_memo[i].cc, cc) == 0) {
            memcpy(id, id_memo[i].id, ID_SIZE);
            found = true;
        }
    memo_give();
    if (found) return 0;
    int rc = query_compiler_id(cc, id);
    if (rc || strlen(cc) >= sizeof id_memo[0].cc) return rc;
    memo_take();
    bool present = false;
    for (int i = 0; i < id_count; i++) present = present || strcmp(id_memo[i].cc, cc) == 0;
    if (!present && id_count < ID_SLOTS) {
        strcpy(id_memo[id_count].cc, cc);
        memcpy(id_memo[id_count].id, id, ID_SIZE);
        id_count++;
    }
    memo_give();
    return 0;
}

/* What -march=native compiles for: the machine, and the first processor's
 * identity lines of /proc/cpuinfo (model and feature flags), hashed. */
static void describe_host(char arch[ARCH_SIZE]) {
    static const char *const keys[] = {"vendor_id",       "cpu family",       "model",
                                        "model name",      "flags",            "Features",
                                        "CPU implementer", "CPU architecture", "CPU part",
                                        "isa"};
    struct utsname u;
    char model[128] = "", info[8192];
    if (uname(&u) != 0) strcpy(u.machine, "unknown");
    sg__sha256_ctx s;
    sg__sha256_init(&s);
    if (read_head("/proc/cpuinfo", false, info, sizeof info, NULL) != 0) info[0] = '\0';
    /* The first processor's block ends at the first empty line. */
    for (char *line = info, *next; *line && *line != '\n'; line = next) {
        size_t len = strcspn(line, "\n");
        next = line + len + (line[len] == '\n');
        char *colon = memchr(line, ':', len);
        if (!colon) continue;
        size_t klen = (size_t)(colon - line);
        while (klen && (line[klen - 1] == ' ' || line[klen - 1] == '\t')) klen--;
        for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
            if (strlen(keys[k]) != klen || strncmp(line, keys[k], klen) != 0) continue;
            sg__sha256_update(&s, line, len);
            const char *v = colon + 1 + (colon[1] == ' ');
            if (k == 3) snprintf(model, sizeof model, "%.*s", (int)(line + len - v), v);
        }
    }
    uint8_t d[32];
    char hex[65];
    sg__sha256_final(&s, d);
    sg__sha256_hex(d, hex);
    snprintf(arch, ARCH_SIZE, "%s; %s; cpuinfo %.16s", u.machine, model[0] ? model : "?", hex);
}

static void host_arch(char arch[ARCH_SIZE]) {
    memo_take();
    bool known = arch_known;
    if (known) memcpy(arch, arch_memo, ARCH_SIZE);
    memo_give();
    if (known) return;
    describe_host(arch);
    memo_take();
    memcpy(arch_memo, arch, ARCH_SIZE);
    arch_known = true;
    memo_give();
}

/* ------------------------------------------------------------ one build */

/* Everything one build call works with; allocated once per call. */
typedef struct job {
    sg_ctx *ctx;
    const char *name;
    const char *source; /* what is compiled: the given source or the override */
    size_t source_len;
    bool always;
    bool private_root; /* root is a mkdtemp dir of this build alone */
    bool unusable;     /* the cache root cannot be used: why says why */
    char why[SG__MSG_SIZE];
    double timeout; /* SG_COMPILE_TIMEOUT */
    char root[PATH_MAX];
    char entry[PATH_MAX]; /* <root>/<key> */
    char tmp[PATH_MAX];   /* <root>/tmp-XXXXXX while building */
    char cc[PATH_MAX];
    bool cc_from_env;
    char cc_id[ID_SIZE];
    char arch[ARCH_SIZE];
    char key[65];
    char source_hex[65];
    char kernel_hex[65];
    char *override; /* SG_OVERRIDE_DIR's file, when there is one */
    size_t override_size;
    char *cflags; /* a copy of SG_CFLAGS, cut into tokens */
    size_t cflags_size;
    char **argv; /* the compiler's command line */
    size_t argv_size;
    int nbase; /* argv[0..nbase) are the compiler and its fixed flags */
    int nargs;
} job;

static const char *env(const char *name) {
    const char *v = getenv(name);
    return v && v[0] ? v : NULL;
}

static bool name_ok(const char *name) {
    size_t n = strlen(name);
    if (n == 0 || n > 200 || name[0] == '.') return false;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '_' || c == '.' || c == '-';
        if (!ok) return false;
    }
    return true;
}

static sg_status io_fail(job *j, const char *what, const char *path, int err) {
    return sg__fail(j->ctx, SG_ERR_COMPILE,
                    "codegen: building kernel '%s': cannot %s '%s': %s; set SG_CACHE_DIR to a "
                    "writable directory",
                    j->name, what, path, strerror(err));
}

/* Said once per process: builds go to private directories. */
static atomic_flag said_private = ATOMIC_FLAG_INIT;

/* The cache root from the environment, created 0700 if missing. A root
 * that is not the user's or that others may write to is refused (they
 * could plant shared objects for us to load); one that cannot be used at
 * all sets j->unusable (the build then goes to a private directory). */
static sg_status open_root(job *j) {
    const char *dir = env("SG_CACHE_DIR"), *base;
    int n;
    if (dir) {
        n = snprintf(j->root, sizeof j->root, "%s", dir);
    } else if ((base = env("XDG_CACHE_HOME")) != NULL) {
        n = snprintf(j->root, sizeof j->root, "%s/stepgraph", base);
    } else if ((base = env("HOME")) != NULL) {
        n = snprintf(j->root, sizeof j->root, "%s/.cache/stepgraph", base);
    } else {
        n = snprintf(j->root, sizeof j->root, "/tmp/stepgraph-%lu", (unsigned long)geteuid());
    }
    if (n < 0 || (size_t)n >= sizeof j->root - 128) { /* room for "/<key>.failed/compile.log" */
        j->unusable = true;
        snprintf(j->why, sizeof j->why, "%s", strerror(ENAMETOOLONG));
        return SG_OK;
    }
    int rc = sg__make_dirs(j->root, 0700);
    if (!rc) rc = sg__dir_trusted(j->root, true);
    if (rc == EPERM) {
        struct stat st = {0};
        stat(j->root, &st); /* just made or found: only for the message */
        unsigned mode = (unsigned)st.st_mode & 07777;
        unsigned long uid = (unsigned long)st.st_uid, me = (unsigned long)geteuid();
        char fix[PATH_MAX + 64];
        if (uid != me)
            snprintf(fix, sizeof fix, "it is not yours: chown it to uid %lu", me);
        else
            snprintf(fix, sizeof fix, "chmod 700 '%s'", j->root);
        return sg__fail(j->ctx, SG_ERR_COMPILE,
                        "codegen: building kernel '%s': the kernel cache '%s' (mode %04o, owner "
                        "uid %lu) is not trusted: stepgraph loads code from it, so it must belong "
                        "to you (uid %lu) and be writable by no one else; %s, or set "
                        "SG_CACHE_DIR to a directory you own",
                        j->name, j->root, mode, uid, me, fix);
    }
    if (!rc && access(j->root, W_OK | X_OK) != 0) rc = errno;
    /* A directory above the root that others may write to lets them rename
     * the root away and put their own in its place. */
    char bad[PATH_MAX];
    if (!rc && sg__dir_parents_trusted(j->root, bad, sizeof bad) == EPERM) {
        j->unusable = true;
        sg__parent_why(bad, j->why, sizeof j->why);
        return SG_OK;
    }
    if (rc) {
        j->unusable = true;
        snprintf(j->why, sizeof j->why, "%s", strerror(rc));
    }
    return SG_OK;
}

/* An unusable cache: the build goes to a fresh private directory (removed
 * when the build is over; the loaded module outlives it). */
static sg_status open_private_root(job *j) {
    char bad[PATH_MAX];
    memcpy(bad, j->root, sizeof bad);
    const char *tmpdir = env("TMPDIR");
    if (snprintf(j->root, sizeof j->root, "%s/sg-build-XXXXXX", tmpdir ? tmpdir : "/tmp") >=
            (int)sizeof j->root - 128 ||
        !mkdtemp(j->root)) {
        int e = errno;
        return sg__fail(j->ctx, SG_ERR_COMPILE,
                        "codegen: building kernel '%s': the kernel cache '%s' cannot be used (%s) "
                        "and no private directory can be made in %s (%s); set SG_CACHE_DIR to a "
                        "writable directory you own",
                        j->name, bad, j->why, tmpdir ? tmpdir : "/tmp", strerror(e));
    }
    j->private_root = true;
    if (!atomic_flag_test_and_set(&said_private))
        sg__log(j->ctx, "fallbacks",
                "codegen: the kernel cache '%s' cannot be used (%s): kernels are compiled into "
                "private temporary directories and not kept; set SG_CACHE_DIR to a writable "
                "directory you own",
                bad, j->why);
    return SG_OK;
}

/* The compiler, its identity and the host's; a missing compiler fails here,
 * before anything is written. */
static sg_status find_compiler(job *j) {
    const char *cc = env("SG_CC");
    j->cc_from_env = cc != NULL;
    if (snprintf(j->cc, sizeof j->cc, "%s", cc ? cc : "cc") >= (int)sizeof j->cc)
        return sg__fail(j->ctx, SG_ERR_COMPILE, "codegen: SG_CC is longer than %d characters",
                        PATH_MAX - 1);
    int rc = compiler_id(j->cc, j->cc_id);
    if (rc == ETIMEDOUT)
        return sg__fail(j->ctx, SG_ERR_COMPILE,
                        "codegen: the C compiler '%s' did not answer '--version' within "
                        "SG_COMPILE_TIMEOUT=%g s and was killed (building kernel '%s'); fix or "
                        "replace it (SG_CC), or raise SG_COMPILE_TIMEOUT",
                        j->cc, j->timeout, j->name);
    if (rc && j->cc_from_env && strpbrk(j->cc, " \t"))
        return sg__fail(j->ctx, SG_ERR_COMPILE,
                        "codegen: cannot run the C compiler '%s' (from SG_CC) to build kernel "
                        "'%s': %s; SG_CC names one program, run as it stands: put its flags in "
                        "SG_CFLAGS, and a launcher such as ccache in a wrapper script SG_CC names",
                        j->cc, j->name, strerror(rc));
    if (rc)
        return sg__fail(j->ctx, SG_ERR_COMPILE,
                        "codegen: cannot run the C compiler '%s' (%s) to build kernel '%s': %s; "
                        "install gcc (e.g. apt-get install gcc) or set SG_CC to a C compiler",
                        j->cc, j->cc_from_env ? "from SG_CC" : "the default; SG_CC is not set",
                        j->name, strerror(rc));
    host_arch(j->arch);
    return SG_OK;
}

/* The compiler's command line: the fixed flags, -o kernel.so source.c -lm,
 * then SG_CFLAGS split on spaces (last, so that they may override -O3 and
 * add libraries after the source). */
static sg_status make_argv(job *j) {
    static const char *const base[] = {"-O3", "-march=native", "-fPIC", "-shared", "-std=c11",
#ifdef _OPENMP
                                       "-fopenmp",
#endif
#ifdef SG_SANITIZE_GENERATED /* the library is built with the sanitizers: so is its code */
                                       "-fsanitize=address,undefined", "-fno-omit-frame-pointer",
#endif
    };
    const char *extra = env("SG_CFLAGS");
    size_t len = extra ? strlen(extra) : 0, ntok = len / 2 + 1;
    j->cflags_size = len + 1;
    j->argv_size = (ntok + 16) * sizeof(char *);
    j->cflags = sg__alloc(j->ctx, j->cflags_size);
    j->argv = sg__alloc(j->ctx, j->argv_size);
    if (!j->cflags || !j->argv)
        return sg__fail(j->ctx, SG_ERR_OOM, "codegen: out of memory building kernel '%s'",
                        j->name);
    memcpy(j->cflags, extra ? extra : "", len + 1);
    int n = 0;
    j->argv[n++] = j->cc;
    for (size_t i = 0; i < sizeof base / sizeof base[0]; i++) j->argv[n++] = (char *)base[i];
    j->nbase = n;
    j->argv[n++] = "-o";
    j->argv[n++] = NULL; /* kernel.so and source.c: filled in by compile() */
    j->argv[n++] = NULL;
    j->argv[n++] = "-lm";
    char *save = NULL;
    for (char *tok = strtok_r(j->cflags, " \t\n", &save); tok;
         tok = strtok_r(NULL, " \t\n", &save))
        j->argv[n++] = tok;
    j->argv[n] = NULL;
    j->nargs = n;
    return SG_OK;
}

/* SG_OVERRIDE_DIR/<name>.c replaces the source when it exists. */
static sg_status apply_override(job *j) {
    size_t n = 0;
    sg_status s = sg__read_override(j->ctx, j->name, ".c", &j->override, &n);
    if (s != SG_OK || !j->override) return s;
    j->override_size = n + 1;
    j->source = j->override;
    j->source_len = n;
    return SG_OK;
}

/* Whether argv[i] is a flag (not the compiler, "-o" or the file names). */
static bool is_flag(const job *j, int i) {
    return i > 0 && i < j->nargs && (i < j->nbase || i > j->nbase + 2);
}

/* One key field, length-prefixed so that no two field lists hash alike. */
static void key_field(sg__sha256_ctx *s, const char *tag, const char *v, size_t n) {
    char head[64];
    int h = snprintf(head, sizeof head, "%s %zu:", tag, n);
    sg__sha256_update(s, head, (size_t)h);
    sg__sha256_update(s, v, n);
}

static void make_key(job *j) {
    sg__sha256_ctx s;
    uint8_t d[32];
    sg__sha256_init(&s);
    key_field(&s, "version", SG__CODEGEN_VERSION, strlen(SG__CODEGEN_VERSION));
    key_field(&s, "dialect", "c", 1);
    key_field(&s, "compiler", j->cc, strlen(j->cc));
    key_field(&s, "compiler_id", j->cc_id, strlen(j->cc_id));
    key_field(&s, "arch", j->arch, strlen(j->arch));
    for (int i = 1; i < j->nargs; i++)
        if (is_flag(j, i)) key_field(&s, "flag", j->argv[i], strlen(j->argv[i]));
    key_field(&s, "source", j->source, j->source_len);
    sg__sha256_final(&s, d);
    sg__sha256_hex(d, j->key);
    sg__sha256(j->source, j->source_len, d);
    sg__sha256_hex(d, j->source_hex);
    path3(j->entry, sizeof j->entry, j->root, "/", j->key);
}

/* ------------------------------------------------------------ lookup */

/* The value of "<field> <64 hex>" in meta text, or NULL. */
static const char *meta_hex(const char *meta, const char *field, char out[65]) {
    size_t fl = strlen(field);
    for (const char *p = meta; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
        if (strncmp(p, field, fl) != 0 || p[fl] != ' ') continue;
        const char *v = p + fl + 1;
        size_t n = strspn(v, "0123456789abcdef");
        if (n != 64 || v[64] != '\n') return NULL;
        memcpy(out, v, 64);
        out[64] = '\0';
        return out;
    }
    return NULL;
}

/* Whether entry dir holds an intact build of this key: meta.txt names the
 * key, source.c and kernel.so hash to what meta.txt says, compile.log is
 * there, each a regular file of the user's (the directory was checked). */
static bool entry_intact(job *j, const char *dir) {
    char path[PATH_MAX], meta[1024], want[65], got[65];
    path3(path, sizeof path, dir, "/meta.txt", "");
    if (read_head(path, true, meta, sizeof meta, NULL) != 0) return false;
    if (!meta_hex(meta, "key", want) || strcmp(want, j->key) != 0) return false;
    path3(path, sizeof path, dir, "/source.c", "");
    if (!meta_hex(meta, "source_sha256", want) || hash_file(path, got) || strcmp(want, got))
        return false;
    path3(path, sizeof path, dir, "/kernel.so", "");
    if (!meta_hex(meta, "kernel_sha256", want) || hash_file(path, got) || strcmp(want, got))
        return false;
    path3(path, sizeof path, dir, "/compile.log", "");
    int fd = sg__open_file(path, O_RDONLY, true);
    if (fd < 0) return false;
    close(fd);
    return true;
}

/* The module loaded from dir/kernel.so, or NULL with *dl_msg set. */
static void *load(const char *dir, const char **dl_msg) {
    char path[PATH_MAX];
    path3(path, sizeof path, dir, "/kernel.so", "");
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) *dl_msg = dlerror();
    return h;
}

/* Look the key up: a loaded handle on a hit (the entry marked used), NULL
 * on a miss. An entry that is damaged, not a directory (a stray file or
 * link), or a directory that is not the user's or that others may write to
 * is never loaded: it is discarded (and counted) so that the build
 * replaces it. */
static void *lookup(job *j) {
    struct stat st;
    if (lstat(j->entry, &st) != 0) return NULL;
    const char *dl_msg = NULL, *why = "files missing, not regular, or not matching meta.txt";
    int trust = sg__dir_trusted(j->entry, false);
    void *h = NULL;
    if (trust == ENOTDIR)
        why = "not a directory";
    else if (trust)
        why = "not yours, or writable by group or others";
    else if (entry_intact(j, j->entry))
        h = load(j->entry, &dl_msg);
    if (h) {
        sg__cache_touch(j->entry);
        return h;
    }
    atomic_fetch_add(&n_corrupt, 1);
    sg__log(j->ctx, "output_code", "cache entry %s of %s is damaged (%s); rebuilding", j->entry,
            j->name, dl_msg ? dl_msg : why);
    sg__cache_discard(j->root, j->entry);
    return NULL;
}

/* ------------------------------------------------------------ compile and publish */

static sg_status write_meta(job *j) {
    char path[PATH_MAX], flags[2048];
    size_t fl = 0;
    flags[0] = '\0';
    for (int i = 1; i < j->nargs; i++)
        if (is_flag(j, i) && fl < sizeof flags)
            fl += (size_t)snprintf(flags + fl, sizeof flags - fl, "%s%s", fl ? " " : "",
                                   j->argv[i]);
    char meta[PATH_MAX + 3072];
    int n = snprintf(meta, sizeof meta,
                     "key %s\nkernel_sha256 %s\nsource_sha256 %s\nname %s\nversion %s\n"
                     "dialect c\ncompiler %s\ncompiler_id %s\narch %s\nflags %s\n",
                     j->key, j->kernel_hex, j->source_hex, j->name, SG__CODEGEN_VERSION, j->cc,
                     j->cc_id, j->arch, flags);
    path3(path, sizeof path, j->tmp, "/meta.txt", "");
    int rc = sg__write_file(path, meta, n < (int)sizeof meta ? (size_t)n : sizeof meta - 1);
    return rc ? io_fail(j, "write", path, rc) : SG_OK;
}

/* Keep a failed build where its log can be read: <root>/<key>.failed. The
 * path of the log goes into logpath. */
static void keep_failed(job *j, char *logpath, size_t size) {
    char failed[PATH_MAX];
    path3(failed, sizeof failed, j->entry, ".failed", "");
    sg__remove_dir(failed);
    if (rename(j->tmp, failed) == 0) {
        path3(logpath, size, failed, "/compile.log", "");
        j->tmp[0] = '\0';
    } else {
        path3(logpath, size, j->tmp, "/compile.log", ""); /* left in place for reading */
        j->tmp[0] = '\0';
    }
}

/* The first lines of the compiler's log (at most 8, about 500 bytes), with
 * the build directory's source path shortened to <name>.c: that directory
 * is renamed away, and the short name is the one SG_DUMP_DIR and
 * SG_OVERRIDE_DIR use. */
static void log_excerpt(const job *j, const char *logpath, char *out, size_t size) {
    char log[2048], src[PATH_MAX];
    size_t n = 0, o = 0;
    if (read_head(logpath, true, log, sizeof log, &n) != 0) log[0] = '\0';
    path3(src, sizeof src, j->tmp, "/source.c", "");
    size_t sl = strlen(src), nl = strlen(j->name);
    int lines = 0;
    for (const char *p = log; *p && o + nl + 3 < size && o < 500 && lines < 8;) {
        if (strncmp(p, src, sl) == 0) {
            o += (size_t)snprintf(out + o, size - o, "%s.c", j->name);
            p += sl;
            continue;
        }
        lines += *p == '\n';
        out[o++] = *p++;
    }
    while (o && out[o - 1] == '\n') o--;
    out[o] = '\0';
}

/* The compiler failed: the message gets its first lines and the log's path. */
static sg_status compile_fail(job *j, const char *why) {
    char logpath[PATH_MAX], excerpt[600];
    path3(logpath, sizeof logpath, j->tmp, "/compile.log", "");
    log_excerpt(j, logpath, excerpt, sizeof excerpt);
    keep_failed(j, logpath, sizeof logpath);
    /* A compiler named by SG_CC that printed nothing is most likely no C
     * compiler at all (false, true, a wrapper that exits). */
    const char *cause = j->cc_from_env && !excerpt[0]
                            ? "SG_CC names a program that printed nothing: set SG_CC to a C "
                              "compiler (gcc, clang), or unset it"
                            : "unless SG_CC, SG_OVERRIDE_DIR or SG_CFLAGS caused it, this is a "
                              "stepgraph bug: please report it with the log";
    return sg__fail(j->ctx, SG_ERR_COMPILE,
                    "codegen: compiling kernel '%s' with %s%s failed (%s); full log: %s; %s\n%s",
                    j->name, j->cc, j->cc_from_env ? " (SG_CC)" : "", why, logpath, cause,
                    excerpt[0] ? excerpt : "(the compiler printed nothing)");
}

/* Run the compiler in j->tmp. */
static sg_status compile(job *j) {
    char src[PATH_MAX], so[PATH_MAX], logpath[PATH_MAX], why[96];
    path3(src, sizeof src, j->tmp, "/source.c", "");
    path3(so, sizeof so, j->tmp, "/kernel.so", "");
    path3(logpath, sizeof logpath, j->tmp, "/compile.log", "");
    int rc = sg__write_file(src, j->source, j->source_len);
    if (rc) return io_fail(j, "write", src, rc);
    int fd = sg__open_file(logpath, O_WRONLY | O_CREAT | O_TRUNC, true);
    if (fd < 0) return io_fail(j, "create", logpath, -fd);
    j->argv[j->nbase + 1] = so;
    j->argv[j->nbase + 2] = src;
    int status = 0;
    rc = run_program(j->argv, fd, &status, NULL, j->timeout);
    close(fd);
    j->argv[j->nbase + 1] = j->argv[j->nbase + 2] = NULL;
    if (rc == ETIMEDOUT) {
        snprintf(why, sizeof why, "no result within SG_COMPILE_TIMEOUT=%g s: killed", j->timeout);
        return compile_fail(j, why);
    }
    if (rc)
        return sg__fail(j->ctx, SG_ERR_COMPILE,
                        "codegen: cannot run the C compiler '%s' to build kernel '%s': %s; "
                        "install gcc (e.g. apt-get install gcc) or set SG_CC to a C compiler",
                        j->cc, j->name, strerror(rc));
    if (WIFSIGNALED(status)) {
        snprintf(why, sizeof why, "killed by signal %d", WTERMSIG(status));
        return compile_fail(j, why);
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) != 0) {
        snprintf(why, sizeof why, "exit status %d", WEXITSTATUS(status));
        return compile_fail(j, why);
    }
    struct stat st;
    if (lstat(so, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size == 0)
        return compile_fail(j, "no kernel.so was written");
    rc = hash_file(so, j->kernel_hex);
    if (rc) return io_fail(j, "read", so, rc);
    return write_meta(j);
}

/* Move the finished build to its key. If another process got there first
 * its entry is kept and ours dropped (the handle we loaded stays valid),
 * except with SG_ALWAYS_COMPILE, where ours replaces it. */
static sg_status publish(job *j) {
    for (int attempt = 0;; attempt++) {
        if (!sg__file_fault() && rename(j->tmp, j->entry) == 0) {
            j->tmp[0] = '\0';
            return SG_OK;
        }
        if (errno == ENOTDIR && attempt < 3) { /* a stray file or link at the key: ours */
            sg__cache_discard(j->root, j->entry);
            continue;
        }
        if (errno != EEXIST && errno != ENOTEMPTY) return io_fail(j, "rename", j->tmp, errno);
        /* Theirs is as good (the caller deletes ours), unless we must replace
         * it. Every discard is followed by a rename, so however many
         * processes race here, one entry is left. */
        if (!j->always || attempt == 3) return SG_OK;
        sg__cache_discard(j->root, j->entry);
    }
}

/* Compile, load and publish; *handle on success. */
static sg_status build(job *j, void **handle) {
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (snprintf(j->tmp, sizeof j->tmp, "%s/tmp-XXXXXX", j->root) >= (int)sizeof j->tmp ||
        !mkdtemp(j->tmp)) {
        sg_status s = io_fail(j, "create a build directory in", j->root, errno);
        j->tmp[0] = '\0';
        return s;
    }
    sg_status s = compile(j);
    if (s != SG_OK) return s;
    /* Load before publishing: a binary that does not load (an undefined
     * symbol, say) is a compile error, never a cache entry. */
    const char *dl_msg = NULL;
    void *h = load(j->tmp, &dl_msg);
    if (!h) {
        char logpath[PATH_MAX];
        keep_failed(j, logpath, sizeof logpath);
        return sg__fail(j->ctx, SG_ERR_COMPILE,
                        "codegen: kernel '%s' compiled but does not load: %s; build log: %s",
                        j->name, dl_msg ? dl_msg : "?", logpath);
    }
    atomic_fetch_add(&n_compiles, 1);
    /* A module that loaded is kept even if it cannot be published: it only
     * costs the next process a compile. */
    sg_status before = j->ctx->status;
    char msg[SG__MSG_SIZE];
    snprintf(msg, sizeof msg, "%s", j->ctx->msg);
    if (publish(j) != SG_OK) {
        sg__log(j->ctx, "fallbacks", "%s (the kernel is used, but not kept)", j->ctx->msg);
        j->ctx->status = before;
        snprintf(j->ctx->msg, sizeof j->ctx->msg, "%s", msg);
    } else if (!j->private_root) {
        sg__cache_evict(j->ctx, j->root, j->key);
    }
    sg__log(j->ctx, "output_code", "compiled %s in %ld ms -> %s", j->name, elapsed_ms(&t0),
            j->entry);
    *handle = h;
    return SG_OK;
}

static void job_free(job *j) {
    if (j->tmp[0]) sg__remove_dir(j->tmp);
    if (j->private_root) { /* the module stays mapped; a failed build's log stays to read */
        if (j->entry[0]) sg__remove_dir(j->entry);
        rmdir(j->root);
    }
    sg__free(j->ctx, j->override, j->override_size);
    sg__free(j->ctx, j->cflags, j->cflags_size);
    sg__free(j->ctx, j->argv, j->argv_size);
    sg__free(j->ctx, j, sizeof *j);
}

static sg_status prepare(job *j) {
    j->timeout = compile_timeout();
    sg_status s = open_root(j);
    if (s == SG_OK && j->unusable) s = open_private_root(j);
    if (s == SG_OK) s = find_compiler(j);
    if (s == SG_OK) s = make_argv(j);
    if (s == SG_OK) s = apply_override(j);
    if (s == SG_OK) s = sg__dump_source(j->ctx, j->name, ".c", j->source, j->source_len);
    if (s == SG_OK) make_key(j);
    return s;
}

sg_status sg__cache_build_c(sg_ctx *ctx, const char *name, const char *source, sg__module **out) {
    SG_ASSERT(ctx && out);
    if (!name || !source || !name_ok(name))
        return sg__fail(ctx, SG_ERR_INVALID_ARG,
                        "codegen: kernel name '%s' must be 1 to 200 characters of [A-Za-z0-9_.-] "
                        "not starting with '.' (it names <name>.c files), and source non-NULL",
                        name ? name : "(null)");
    sg__module *m = sg__alloc(ctx, sizeof *m);
    job *j = sg__calloc(ctx, sizeof *j);
    if (!m || !j) {
        sg__free(ctx, m, sizeof *m);
        sg__free(ctx, j, sizeof *j);
        return sg__fail(ctx, SG_ERR_OOM, "codegen: out of memory building kernel '%s'", name);
    }
    j->ctx = ctx, j->name = name, j->source = source, j->source_len = strlen(source);
    j->always = sg__always_compile() || ctx->no_cache_reads;
    void *h = NULL;
    sg_status s = prepare(j);
    if (s == SG_OK && !j->always && !j->private_root && (h = lookup(j)) != NULL)
        atomic_fetch_add(&n_hits, 1);
    if (s == SG_OK && !h) s = build(j, &h);
    if (s == SG_OK) {
        m->handle = h;
        snprintf(m->path, sizeof m->path, "%s", j->entry);
        *out = m;
    } else {
        sg__free(ctx, m, sizeof *m);
    }
    job_free(j);
    return s;
}

void *sg__module_sym(const sg__module *m, const char *symbol) {
    return m && symbol ? dlsym(m->handle, symbol) : NULL;
}

const char *sg__module_path(const sg__module *m) { return m ? m->path : ""; }

void sg__module_free(sg_ctx *ctx, sg__module *m) {
    if (!m) return;
    dlclose(m->handle);
    sg__free(ctx, m, sizeof *m);
}

/* The root for callers outside this file; *unusable when it cannot be used. */
static sg_status shared_root(sg_ctx *ctx, const char *name, char *root, size_t size,
                             bool *unusable, char *why, size_t why_size) {
    SG_ASSERT(ctx && root);
    if (!name || !name_ok(name))
        return sg__fail(ctx, SG_ERR_INVALID_ARG,
                        "codegen: kernel name '%s' must be 1 to 200 characters of [A-Za-z0-9_.-] "
                        "not starting with '.'",
                        name ? name : "(null)");
    job *j = sg__calloc(ctx, sizeof *j);
    if (!j) return sg__fail(ctx, SG_ERR_OOM, "codegen: out of memory building kernel '%s'", name);
    j->ctx = ctx, j->name = name;
    sg_status s = open_root(j);
    *unusable = j->unusable;
    if (s == SG_OK && snprintf(root, size, "%s", j->root) >= (int)size)
        *unusable = true, snprintf(j->why, sizeof j->why, "%s", strerror(ENAMETOOLONG));
    snprintf(why, why_size, "%s", j->why);
    sg__free(ctx, j, sizeof *j);
    return s;
}

sg_status sg__cache_root(sg_ctx *ctx, const char *name, char *root, size_t size) {
    bool unusable = false;
    char why[SG__MSG_SIZE];
    sg_status s = shared_root(ctx, name, root, size, &unusable, why, sizeof why);
    if (s == SG_OK && unusable)
        s = sg__fail(ctx, SG_ERR_COMPILE,
                     "codegen: building kernel '%s': cannot use the kernel cache '%s': %s; set "
                     "SG_CACHE_DIR to a writable directory you own",
                     name, root, why);
    return s;
}

bool sg__always_compile(void) {
    const char *always = env("SG_ALWAYS_COMPILE");
    return always && strcmp(always, "0") != 0;
}

sg_status sg__cache_root_or_none(sg_ctx *ctx, const char *name, char *root, size_t size) {
    bool unusable = false;
    char why[SG__MSG_SIZE];
    sg_status s = shared_root(ctx, name, root, size, &unusable, why, sizeof why);
    if (s == SG_OK && unusable) {
        if (!atomic_flag_test_and_set(&said_private))
            sg__log(ctx, "fallbacks",
                    "codegen: the kernel cache '%s' cannot be used (%s): kernels are compiled "
                    "and not kept; set SG_CACHE_DIR to a writable directory you own",
                    root, why);
        root[0] = '\0';
    }
    return s;
}
