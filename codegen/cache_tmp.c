/* cache_tmp.c -- a minimal compile-and-load path (no disk cache). */
#include "codegen.h"
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
struct sg__module { void *dl; };
sg_status sg__cache_build_c(sg_ctx *ctx, const char *name, const char *source, sg__module **out) {
    char src[256], so[256], cmd[1024];
    static int n;
    snprintf(src, sizeof src, "/tmp/sgtmp_%d_%d.c", (int)getpid(), n);
    snprintf(so, sizeof so, "/tmp/sgtmp_%d_%d.so", (int)getpid(), n++);
    FILE *f = fopen(src, "w"); fputs(source, f); fclose(f);
    const char *extra = getenv("SG_CFLAGS");
    snprintf(cmd, sizeof cmd, "cc -O3 -march=native -fPIC -shared -std=c11 -fopenmp %s -o %s %s -lm", extra ? extra : "", so, src);
    if (system(cmd) != 0) return sg__fail(ctx, SG_ERR_COMPILE, "compile of %s failed", name);
    void *dl = dlopen(so, RTLD_NOW | RTLD_LOCAL);
    if (!dl) return sg__fail(ctx, SG_ERR_COMPILE, "dlopen: %s", dlerror());
    *out = sg__alloc(ctx, sizeof **out); (*out)->dl = dl;
    return SG_OK;
}
void *sg__module_sym(const sg__module *m, const char *symbol) { return dlsym(m->dl, symbol); }
void sg__module_free(sg_ctx *ctx, sg__module *m) { if (m) { dlclose(m->dl); sg__free(ctx, m, sizeof *m); } }
