/* SPDX-License-Identifier: MIT */
/*
 * blob.c -- cache entries that are one file holding a compiled image (an
 * NVRTC cubin, an ocloc SPIR-V module): <root>/<prefix>-<key>.<ext> with
 * an 8-byte magic, the SHA-256 of the image, and the image. The key hashes
 * a list of strings (length-prefixed, so no two lists hash alike). A file
 * is written under a temporary name and renamed into place, so a reader
 * never sees half an entry and two processes racing on one key end with
 * one valid file; a file whose hash does not match is removed, so the
 * caller rebuilds it. Reads follow the cache's trust rules (cache_dir.c).
 */
#define _GNU_SOURCE /* mkostemp */

#include "codegen.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

void sg__blob_key(const char *const *fields, int n, char key[65]) {
    sg__sha256_ctx sh;
    uint8_t digest[32];
    sg__sha256_init(&sh);
    for (int i = 0; i < n; i++) {
        uint64_t len = strlen(fields[i]);
        sg__sha256_update(&sh, &len, sizeof len);
        sg__sha256_update(&sh, fields[i], len);
    }
    sg__sha256_final(&sh, digest);
    sg__sha256_hex(digest, key);
}

static int write_all(int fd, const void *p, size_t n) {
    const char *c = p;
    while (n) {
        ssize_t w = write(fd, c, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return errno ? errno : EIO;
        c += w, n -= (size_t)w;
    }
    return 0;
}

sg_status sg__blob_lookup(sg_ctx *ctx, const char *path, const char magic[8], void **img,
                          size_t *size) {
    char *data;
    size_t n;
    *img = NULL;
    int rc = sg__read_file(ctx, path, (size_t)1 << 28, &data, &n);
    if (rc == ENOMEM)
        return sg__fail(ctx, SG_ERR_OOM, "codegen: out of host memory reading the cache entry '%s'",
                        path);
    if (rc != 0) return SG_OK;
    uint8_t digest[32];
    bool ok = n > 40 && memcmp(data, magic, 8) == 0;
    if (ok) {
        sg__sha256(data + 40, n - 40, digest);
        ok = memcmp(digest, data + 8, 32) == 0;
    }
    if (!ok) {
        unlink(path);
        sg__free(ctx, data, n + 1);
        return SG_OK;
    }
    void *out = sg__alloc(ctx, n - 40);
    if (out) memcpy(out, data + 40, n - 40);
    sg__free(ctx, data, n + 1);
    if (!out)
        return sg__fail(
            ctx, SG_ERR_OOM,
            "codegen: out of host memory for the %zu-byte image of the cache entry '%s'", n - 40,
            path);
    *img = out;
    *size = n - 40;
    sg__cache_touch(path);
    return SG_OK;
}

void sg__blob_publish(sg_ctx *ctx, const char *root, const char *path, const char magic[8],
                      const void *img, size_t size) {
    char tmp[PATH_MAX + 96];
    if (snprintf(tmp, sizeof tmp, "%s/tmp-blob-XXXXXX", root) >= (int)sizeof tmp) return;
    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0) return;
    uint8_t digest[32];
    sg__sha256(img, size, digest);
    int rc = write_all(fd, magic, 8);
    if (!rc) rc = write_all(fd, digest, 32);
    if (!rc) rc = write_all(fd, img, size);
    if (close(fd) != 0 && !rc) rc = errno;
    if (rc || rename(tmp, path) != 0) {
        unlink(tmp);
        return;
    }
    sg__cache_evict(ctx, root, strrchr(path, '/') + 1);
}
