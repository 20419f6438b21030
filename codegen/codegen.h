/*
 * codegen.h -- the internal header of codegen/: fused kernel groups become
 * source text in one dialect (C + OpenMP for the CPU here), which is
 * compiled and cached on disk.
 */
#ifndef SG_CODEGEN_H
#define SG_CODEGEN_H

#include "../fusion/fusion.h"

/* ------------------------------------------------------------ the emitter (emit.c) */

typedef struct sg__emit {
    sg_ctx *ctx;
    char *buf;
    size_t len, cap;
    int depth;
    bool oom;
} sg__emit;

SG__HIDDEN void sg__emit_raw(sg__emit *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* One line at the current depth. */
SG__HIDDEN void sg__emit_line(sg__emit *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* "<line> {" and one level deeper; sg__emit_close ends it. */
SG__HIDDEN void sg__emit_open(sg__emit *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
SG__HIDDEN void sg__emit_close(sg__emit *e);
SG__HIDDEN void sg__emit_free(sg__emit *e);

/* ------------------------------------------------------------ the C dialect (cgen_c.c) */

/*
 * The ABI between generated C and the library. Generated code sees each
 * IR slot as a base address (slot[s]: an input's element 0, a pool
 * address, a parameter's storage); every shape, stride and offset is a
 * constant in the source. Kernels it cannot express are run back in the
 * library through rt->run_node (the eager kernel of that IR node).
 *
 *   int sg_step(char *const *slot, const sg_rt *rt);          whole step
 *   int sg_kernel(int k, char *const *slot, const sg_rt *rt); kernel k alone
 *
 * Both return 0, or the status of a failed run_node.
 */
typedef struct sg__rt {
    void *ctx;
    int (*run_node)(void *ctx, int node);
} sg__rt;

typedef int (*sg__step_entry)(char *const *slot, const sg__rt *rt);
typedef int (*sg__kernel_entry)(int k, char *const *slot, const sg__rt *rt);

/* The translation unit of one fused capture, into e. `title` names it in
 * the header comment. */
SG__HIDDEN sg_status sg__cgen_c(sg_ctx *ctx, const sg__ir *ir, const sg__fused *f,
                                const char *title, sg__emit *e);

/* ------------------------------------------------------------ the cache (cache.c) */

typedef struct sg__module sg__module;
SG__HIDDEN sg_status sg__cache_build_c(sg_ctx *ctx, const char *name, const char *source,
                                       sg__module **out);
SG__HIDDEN void *sg__module_sym(const sg__module *m, const char *symbol);
SG__HIDDEN void sg__module_free(sg_ctx *ctx, sg__module *m);

#endif /* SG_CODEGEN_H */
