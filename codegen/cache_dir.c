/* SPDX-License-Identifier: MIT */
/*
 * cache_dir.c -- the kernel cache's files as a trust boundary, and its
 * housekeeping. Every directory stepgraph loads code from (the cache root,
 * its entries, SG_OVERRIDE_DIR) must belong to the user and be writable by
 * no one else, and every directory above the root, SG_OVERRIDE_DIR and
 * SG_DUMP_DIR up to "/" must belong to root or the user and be writable by
 * no one else unless sticky (/tmp); every file it reads or writes there is opened without
 * following symbolic links and without blocking (a FIFO or a device is
 * refused, never waited on), then checked to be a regular file owned by
 * the user. This file also owns SG_DUMP_DIR's writes, the override reads,
 * the small checksummed notes kept beside entries (max-autotune's picks),
 * the size limit with least-recently-used eviction (SG_CACHE_MAX_MB), the
 * removal of builds killed half-way, and sg_cache_clear / sg_cache_dir.
 */
#define _XOPEN_SOURCE 700 /* S_ISVTX, realpath */

#include "codegen.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#ifndef PATH_MAX
#define PATH_MAX 4096
#endif

/* Builds (tmp-*) and discards (trash-*) older than this were abandoned by a
 * process that died: they are removed when an entry is published. */
#define STALE_SECONDS 3600

/* ------------------------------------------------------------ fault injection */

static _Atomic long fault_at, fault_ops;

void sg__file_fault_set(long n) {
    atomic_store(&fault_ops, 0);
    atomic_store(&fault_at, n);
}

long sg__file_fault_count(void) { return atomic_load(&fault_ops); }

bool sg__file_fault(void) {
    long at = atomic_load(&fault_at);
    if (at <= 0 || atomic_fetch_add(&fault_ops, 1) + 1 != at) return false;
    errno = EIO;
    return true;
}

/* ------------------------------------------------------------ trust */

int sg__dir_trusted(const char *path, bool follow) {
    struct stat st;
    if ((follow ? stat(path, &st) : lstat(path, &st)) != 0) return errno;
    if (!S_ISDIR(st.st_mode)) return ENOTDIR;
    if (st.st_uid != geteuid() || (st.st_mode & (S_IWGRP | S_IWOTH))) return EPERM;
    return 0;
}

/* A directory no one but root and the user can change the entries of: owned
 * by one of them, and not writable by group or others unless sticky (in a
 * sticky directory such as /tmp, mode 1777, no one may rename or remove
 * another user's entries). OpenSSH's safe_path asks the same of a key's
 * parents. */
static bool parent_safe(const struct stat *st) {
    if (st->st_uid != 0 && st->st_uid != geteuid()) return false;
    return !(st->st_mode & (S_IWGRP | S_IWOTH)) || (st->st_mode & S_ISVTX);
}

/* Each directory above the absolute path abs, up to "/": 0, or EPERM with
 * the first unsafe one in bad, or a stat errno. */
static int parents_safe(const char *abs, char *bad, size_t size) {
    char p[PATH_MAX];
    size_t n = strlen(abs);
    if (n >= sizeof p) return ENAMETOOLONG;
    memcpy(p, abs, n + 1);
    while (n > 1 && p[n - 1] == '/') p[--n] = '\0';
    for (;;) {
        char *slash = strrchr(p, '/');
        if (!slash || (slash == p && p[1] == '\0')) return 0; /* "/" was the last */
        slash[slash == p ? 1 : 0] = '\0';
        struct stat st;
        if (stat(p, &st) != 0) return errno;
        if (!S_ISDIR(st.st_mode)) return ENOTDIR;
        if (!parent_safe(&st)) {
            snprintf(bad, size, "%s", p);
            return EPERM;
        }
    }
}

int sg__dir_parents_trusted(const char *path, char *bad, size_t size) {
    char abs[PATH_MAX], real[PATH_MAX];
    if (path[0] == '/') {
        if (snprintf(abs, sizeof abs, "%s", path) >= (int)sizeof abs) return ENAMETOOLONG;
    } else {
        char cwd[PATH_MAX];
        if (!getcwd(cwd, sizeof cwd)) return errno;
        if (snprintf(abs, sizeof abs, "%s/%s", cwd, path) >= (int)sizeof abs) return ENAMETOOLONG;
    }
    /* The path as named (a link's own directory counts: whoever may write
     * there may swap the link), then as it resolves. */
    int rc = parents_safe(abs, bad, size);
    if (!rc && realpath(abs, real)) rc = parents_safe(real, bad, size);
    return rc;
}

/* The end of a message about an unsafe parent: what is wrong and the fix. */
const char *sg__parent_why(const char *bad, char *buf, size_t size) {
    struct stat st = {0};
    stat(bad, &st);
    int n = snprintf(
        buf, size,
        "its parent directory '%.240s' (mode %04o, owner uid %lu) lets other users rename "
        "what is in it: each directory above must belong to root or you (uid %lu) and not be "
        "writable by group or others unless sticky (as /tmp, mode 1777, is); chmod go-w "
        "'%.240s', or choose a directory below ones only you and root can write to",
        bad, (unsigned)st.st_mode & 07777, (unsigned long)st.st_uid, (unsigned long)geteuid(), bad);
    (void)n; /* a long path may cut the text short: the path comes first */
    return buf;
}

int sg__open_file(const char *path, int flags, bool own) {
    if (sg__file_fault()) return -EIO;
    int fd = open(path, flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
    if (fd < 0) return -errno;
    struct stat st;
    int err = 0;
    if (fstat(fd, &st) != 0)
        err = errno;
    else if (!S_ISREG(st.st_mode))
        err = EINVAL;
    else if (own && st.st_uid != geteuid())
        err = EPERM;
    else if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0)
        err = errno;
    if (err) {
        close(fd);
        return -err;
    }
    return fd;
}

const char *sg__file_why(int err) {
    switch (err) {
    case EINVAL: return "not a regular file (a FIFO, device or directory is refused)";
    case EPERM: return "owned by another user";
    case ELOOP: return "a symbolic link (never followed)";
    case ENXIO: return "not a regular file (a FIFO without a reader)";
    default: return strerror(err);
    }
}

int sg__write_file(const char *path, const void *data, size_t n) {
    int fd = sg__open_file(path, O_WRONLY | O_CREAT | O_TRUNC, true);
    if (fd < 0) return -fd;
    const char *p = data;
    while (n > 0) {
        ssize_t w = sg__file_fault() ? -1 : write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) {
            int e = errno;
            close(fd);
            return e;
        }
        p += w, n -= (size_t)w;
    }
    return close(fd) == 0 ? 0 : errno;
}

int sg__read_file(sg_ctx *ctx, const char *path, size_t max, char **data, size_t *size) {
    int fd = sg__open_file(path, O_RDONLY, true);
    if (fd < 0) return -fd;
    struct stat st;
    if (fstat(fd, &st) != 0 || (size_t)st.st_size > max) {
        close(fd);
        return EFBIG;
    }
    size_t n = (size_t)st.st_size, got = 0;
    char *buf = sg__alloc(ctx, n + 1);
    if (!buf) {
        close(fd);
        return ENOMEM;
    }
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(fd);
    if (got != n) {
        sg__free(ctx, buf, n + 1);
        return EIO;
    }
    buf[n] = '\0';
    *data = buf;
    *size = n;
    return 0;
}

int sg__make_dirs(const char *path, unsigned mode) {
    char p[PATH_MAX];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof p) return ENAMETOOLONG;
    memcpy(p, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (p[i] != '/' && p[i] != '\0') continue;
        char c = p[i];
        p[i] = '\0';
        if (mkdir(p, mode) != 0 && errno != EEXIST) return errno;
        p[i] = c;
    }
    struct stat st;
    if (stat(path, &st) != 0) return errno;
    return S_ISDIR(st.st_mode) ? 0 : ENOTDIR;
}

void sg__remove_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOTDIR || errno == ELOOP) unlink(dir); /* a file or link: itself */
        return;
    }
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return;
    }
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        unlinkat(fd, e->d_name, 0); /* entries hold plain files only */
    }
    closedir(d);
    rmdir(dir);
}

void sg__cache_discard(const char *root, const char *dir) {
    char trash[PATH_MAX];
    if (snprintf(trash, sizeof trash, "%s/trash-XXXXXX", root) >= (int)sizeof trash ||
        !mkdtemp(trash)) {
        sg__remove_dir(dir);
        return;
    }
    /* rename() may replace an empty directory; if dir is already gone
     * (another process discarded it), only the trash dir is left to remove. */
    char inner[PATH_MAX + 8];
    snprintf(inner, sizeof inner, "%s/e", trash);
    if (rename(dir, inner) != 0) {
        if (errno == ENOTDIR || errno == EISDIR) unlink(dir);
        rmdir(trash);
        return;
    }
    sg__remove_dir(inner);
    rmdir(trash);
}

void sg__cache_touch(const char *path) { utimensat(AT_FDCWD, path, NULL, AT_SYMLINK_NOFOLLOW); }

/* ------------------------------------------------------------ SG_OVERRIDE_DIR, SG_DUMP_DIR */

static const char *env(const char *name) {
    const char *v = getenv(name);
    return v && v[0] ? v : NULL;
}

sg_status sg__read_override(sg_ctx *ctx, const char *name, const char *ext, char **text,
                            size_t *n) {
    const char *dir = env("SG_OVERRIDE_DIR");
    char path[PATH_MAX];
    struct stat st;
    *text = NULL;
    *n = 0;
    if (!dir || snprintf(path, sizeof path, "%s/%s%s", dir, name, ext) >= (int)sizeof path ||
        lstat(path, &st) != 0)
        return SG_OK; /* no override for this kernel */
    int rc = sg__dir_trusted(dir, true);
    if (rc)
        return sg__fail(ctx, SG_ERR_COMPILE,
                        "codegen: SG_OVERRIDE_DIR '%s' holds '%s%s' but %s; code is loaded from "
                        "there, so it must be a directory you own that no one else can write to: "
                        "chmod 700 '%s', or set SG_OVERRIDE_DIR to a directory you own",
                        dir, name, ext,
                        rc == EPERM ? "is writable by other users or not yours" : strerror(rc),
                        dir);
    char bad[PATH_MAX], why[SG__MSG_SIZE];
    if (sg__dir_parents_trusted(dir, bad, sizeof bad) == EPERM)
        return sg__fail(ctx, SG_ERR_COMPILE,
                        "codegen: SG_OVERRIDE_DIR '%s' holds '%s%s' but is not trusted: %s; or "
                        "set SG_OVERRIDE_DIR to such a directory",
                        dir, name, ext, sg__parent_why(bad, why, sizeof why));
    rc = sg__read_file(ctx, path, (size_t)1 << 26, text, n);
    if (rc == ENOMEM) return sg__fail(ctx, SG_ERR_OOM, "codegen: out of memory reading '%s'", path);
    if (rc)
        return sg__fail(ctx, SG_ERR_COMPILE,
                        "codegen: SG_OVERRIDE_DIR: '%s' is not a readable source file: %s (a "
                        "regular file you own, at most 64 MiB, is required)",
                        path, rc == EFBIG ? "over 64 MiB" : sg__file_why(rc));
    return SG_OK;
}

sg_status sg__dump_source(sg_ctx *ctx, const char *name, const char *ext, const char *src,
                          size_t n) {
    const char *dir = env("SG_DUMP_DIR");
    char path[PATH_MAX];
    if (!dir) return SG_OK;
    if (snprintf(path, sizeof path, "%s/%s%s", dir, name, ext) >= (int)sizeof path)
        return sg__fail(ctx, SG_ERR_COMPILE, "codegen: SG_DUMP_DIR '%s' is too long", dir);
    int rc = sg__make_dirs(dir, 0700);
    char bad[PATH_MAX], why[SG__MSG_SIZE];
    if (!rc && sg__dir_parents_trusted(dir, bad, sizeof bad) == EPERM)
        return sg__fail(ctx, SG_ERR_COMPILE,
                        "codegen: will not write kernel '%s' to SG_DUMP_DIR '%s': %s; or set "
                        "SG_DUMP_DIR to such a directory",
                        name, dir, sg__parent_why(bad, why, sizeof why));
    if (!rc) rc = sg__write_file(path, src, n);
    if (rc)
        return sg__fail(ctx, SG_ERR_COMPILE,
                        "codegen: cannot write kernel '%s' to SG_DUMP_DIR as '%s': %s; set "
                        "SG_DUMP_DIR to a directory you own",
                        name, path, sg__file_why(rc));
    return SG_OK;
}

/* ------------------------------------------------------------ notes beside entries */

/* A note is "sha256 <hex of the body>\n" then the body. */
bool sg__note_read(const char *path, char *body, size_t size) {
    char buf[4096 + 80];
    int fd = sg__open_file(path, O_RDONLY, true);
    if (fd < 0) return false;
    ssize_t got = 0, r;
    while ((size_t)got < sizeof buf - 1 &&
           (r = read(fd, buf + got, sizeof buf - 1 - (size_t)got)) != 0) {
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) break;
        got += r;
    }
    close(fd);
    buf[got] = '\0';
    if (got < 72 || strncmp(buf, "sha256 ", 7) != 0 || buf[71] != '\n') return false;
    uint8_t d[32];
    char hex[65];
    sg__sha256(buf + 72, (size_t)got - 72, d);
    sg__sha256_hex(d, hex);
    if (memcmp(hex, buf + 7, 64) != 0 || (size_t)got - 72 >= size) return false;
    memcpy(body, buf + 72, (size_t)got - 72 + 1);
    return true;
}

bool sg__note_write(const char *path, const char *body) {
    char tmp[PATH_MAX + 32], head[80];
    uint8_t d[32];
    char hex[65];
    size_t n = strlen(body);
    sg__sha256(body, n, d);
    sg__sha256_hex(d, hex);
    snprintf(head, sizeof head, "sha256 %s\n", hex);
    /* The name is the process's and the write's own: threads of one process
     * writing one note must not share (and truncate) one temporary file. */
    static _Atomic unsigned long seq;
    if (snprintf(tmp, sizeof tmp, "%s.%ld.%lu.tmp", path, (long)getpid(),
                 atomic_fetch_add(&seq, 1)) >= (int)sizeof tmp)
        return false;
    int fd = sg__open_file(tmp, O_WRONLY | O_CREAT | O_TRUNC, true);
    if (fd < 0) return false;
    bool ok = write(fd, head, 72) == 72 && write(fd, body, n) == (ssize_t)n;
    ok = close(fd) == 0 && ok;
    if (ok && !sg__file_fault() && rename(tmp, path) == 0) return true;
    unlink(tmp);
    return false;
}

/* ------------------------------------------------------------ eviction and clearing */

typedef struct item {
    char name[96];
    struct timespec used; /* mtime: publish, then every hit (sg__cache_touch) */
    uint64_t bytes;
} item;

static bool is_hex(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return false;
    return true;
}

/* What a name in the root is: 1 an entry the cache owns (a key directory,
 * a failed build, a cubin, hsaco or SPIR-V module, a note), 2 a build or discard in progress or
 * abandoned (tmp-*, trash-*), 0 anything else (left alone). */
static int kind_of(const char *n) {
    size_t l = strlen(n);
    if ((l == 64 || (l == 71 && strcmp(n + 64, ".failed") == 0)) && is_hex(n, 64)) return 1;
    if (strncmp(n, "cu-", 3) == 0 && l < sizeof((item *)0)->name &&
        ((l > 9 && strcmp(n + l - 6, ".cubin") == 0) || (l > 7 && strcmp(n + l - 4, ".txt") == 0)))
        return 1;
    if (strncmp(n, "spv-", 4) == 0 && l < sizeof((item *)0)->name && l > 8 &&
        strcmp(n + l - 4, ".spv") == 0)
        return 1; /* an ocloc module (ocloc.c) */
    if (strncmp(n, "hip-", 4) == 0 && l < sizeof((item *)0)->name && l > 10 &&
        strcmp(n + l - 6, ".hsaco") == 0)
        return 1;
    if (strncmp(n, "tmp-", 4) == 0 || strncmp(n, "trash-", 6) == 0) return 2;
    return 0;
}

/* Bytes of an entry: the file, or the files of the directory. */
static uint64_t entry_bytes(int rootfd, const char *name, const struct stat *st) {
    if (!S_ISDIR(st->st_mode)) return (uint64_t)st->st_size;
    uint64_t total = 0;
    int fd = openat(rootfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        if (fd >= 0) close(fd);
        return 0;
    }
    struct stat fs;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        if (e->d_name[0] != '.' && fstatat(fd, e->d_name, &fs, AT_SYMLINK_NOFOLLOW) == 0)
            total += (uint64_t)fs.st_size;
    closedir(d);
    return total;
}

static int older_first(const void *a, const void *b) {
    const item *x = a, *y = b;
    if (x->used.tv_sec != y->used.tv_sec) return x->used.tv_sec < y->used.tv_sec ? -1 : 1;
    return (x->used.tv_nsec > y->used.tv_nsec) - (x->used.tv_nsec < y->used.tv_nsec);
}

static void remove_named(const char *root, const char *name) {
    char p[PATH_MAX];
    if (snprintf(p, sizeof p, "%s/%s", root, name) < (int)sizeof p) sg__cache_discard(root, p);
}

/* The root's entries into *items (sg__alloc'd, *cap slots), their count
 * into *n; abandoned builds and discards are removed on the way (a young
 * tmp-* may be another process's build in progress: it stays). Returns 0
 * or an errno. */
static int scan(sg_ctx *ctx, const char *root, item **items, size_t *cap, size_t *n) {
    *items = NULL, *cap = 0, *n = 0;
    int rootfd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = rootfd >= 0 ? fdopendir(rootfd) : NULL;
    if (!d) {
        int e = errno;
        if (rootfd >= 0) close(rootfd);
        return e;
    }
    time_t now = time(NULL);
    int err = 0;
    for (struct dirent *e; !err && (e = readdir(d)) != NULL;) {
        int kind = kind_of(e->d_name);
        struct stat st;
        if (!kind || fstatat(rootfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
        if (kind == 2) {
            if (now - st.st_mtime > STALE_SECONDS) remove_named(root, e->d_name);
            continue;
        }
        if (*n == *cap) {
            size_t nc = *cap ? *cap * 2 : 64;
            item *grown = sg__alloc(ctx, nc * sizeof *grown);
            if (!grown) {
                err = ENOMEM;
                break;
            }
            if (*n) memcpy(grown, *items, *n * sizeof *grown);
            sg__free(ctx, *items, *cap * sizeof **items);
            *items = grown, *cap = nc;
        }
        item *it = &(*items)[(*n)++];
        memcpy(it->name, e->d_name, strlen(e->d_name) + 1); /* kind_of: it fits */
        it->used = st.st_mtim;
        it->bytes = entry_bytes(rootfd, e->d_name, &st);
    }
    closedir(d);
    return err;
}

double sg__cache_limit_mb(void) {
    const char *v = env("SG_CACHE_MAX_MB");
    char *end = NULL;
    double mb = v ? strtod(v, &end) : 1024.0;
    if (v && (end == v || !(mb >= 0))) return 1024.0; /* not a number, negative or NaN */
    return mb > 1e12 ? 1e12 : mb; /* an exabyte: no limit, and bytes that fit 64 bits */
}

void sg__cache_evict(sg_ctx *ctx, const char *root, const char *keep) {
    item *items;
    size_t cap, n;
    if (scan(ctx, root, &items, &cap, &n) != 0) {
        sg__free(ctx, items, cap * sizeof *items);
        return;
    }
    double mb = sg__cache_limit_mb();
    uint64_t total = 0, limit = (uint64_t)(mb * 1048576.0), freed = 0;
    size_t evicted = 0;
    for (size_t i = 0; i < n; i++) total += items[i].bytes;
    if (mb > 0 && total > limit) {
        qsort(items, n, sizeof *items, older_first);
        for (size_t i = 0; i < n && total > limit; i++) {
            if (keep && strcmp(items[i].name, keep) == 0) continue;
            remove_named(root, items[i].name);
            total -= items[i].bytes, freed += items[i].bytes;
            evicted++;
        }
        sg__log(ctx, "output_code",
                "kernel cache %s over SG_CACHE_MAX_MB=%g: evicted %zu least recently used "
                "entries (%llu bytes)",
                root, mb, evicted, (unsigned long long)freed);
    }
    sg__free(ctx, items, cap * sizeof *items);
}

sg_status sg_cache_dir(sg_ctx *ctx, char *buf, size_t size) {
    if (!ctx) return SG_ERR_INVALID_ARG;
    if (!buf || size == 0)
        return sg__fail(ctx, SG_ERR_INVALID_ARG, "sg_cache_dir: buf is NULL or size is 0");
    char root[PATH_MAX];
    sg_status s = sg__cache_root(ctx, "sg_cache_dir", root, sizeof root);
    if (s != SG_OK) return s;
    if (strlen(root) >= size)
        return sg__fail(ctx, SG_ERR_INVALID_ARG,
                        "sg_cache_dir: the cache directory '%s' needs %zu bytes, buf has %zu", root,
                        strlen(root) + 1, size);
    memcpy(buf, root, strlen(root) + 1);
    return SG_OK;
}

sg_status sg_cache_clear(sg_ctx *ctx) {
    if (!ctx) return SG_ERR_INVALID_ARG;
    char root[PATH_MAX];
    sg_status s = sg__cache_root(ctx, "sg_cache_clear", root, sizeof root);
    if (s != SG_OK) return s;
    item *items;
    size_t cap, n;
    int rc = scan(ctx, root, &items, &cap, &n);
    for (size_t i = 0; !rc && i < n; i++) remove_named(root, items[i].name);
    sg__free(ctx, items, cap * sizeof *items);
    if (rc == ENOMEM)
        return sg__fail(ctx, SG_ERR_OOM, "sg_cache_clear: out of memory listing '%s'", root);
    if (rc)
        return sg__fail(ctx, SG_ERR_COMPILE, "sg_cache_clear: cannot list '%s': %s", root,
                        strerror(rc));
    sg__log(ctx, "output_code", "kernel cache %s cleared (%zu entries)", root, n);
    return SG_OK;
}
