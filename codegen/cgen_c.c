/* SPDX-License-Identifier: MIT */
/*
 * cgen_c.c -- the C + OpenMP dialect: one translation unit per fused
 * capture. Each pointwise group (and each epilogue after a library-run
 * anchor) becomes a readable function with constant shapes, strides and
 * offsets, run as an orphaned `omp for` inside the parallel region of the
 * whole step; anchors and opaque nodes call back into the library. The
 * pointwise prologue of a reduction or row op is its own function, run
 * before the library call, and stores the value the call reads.
 *
 * Values in registers equal what the eager path would read back from
 * memory: each result is narrowed to its dtype and widened again (f16 and
 * bf16 round at every op, as eager does), so fused and unfused agree.
 */
#include "codegen.h"

#include <math.h>
#include <stdio.h>

#define D SG__DIALECT_C

/* ------------------------------------------------------------ loops */

typedef struct gen {
    const sg__ir *ir;
    const sg__fused *f;
    sg__emit *e;
} gen;

static const sg__ref *ref_of(const gen *g, int r) { return sg__lower_ref(g->ir, g->f, r); }

static const sg__ref *arg_of(const gen *g, const sg__irnode *n, int j) {
    return sg__lower_arg(g->ir, g->f, n, j);
}

/* Does gnode k's argument j come from a register (and not the anchor, whose
 * value the library wrote to memory)? */
static int reg_src(const sg__group *grp, int k, int j) {
    return sg__lower_reg_src(grp, k, j, false);
}

/* The members [from, to) of a group, elementwise over (nd, shape): the body. */
static void emit_body(gen *g, const sg__group *grp, int from, int to, int nd, const int64_t *shape,
                      bool flat) {
    char off[256], lv[320], ld[400], rt[1200], st[1400];
    for (int k = from; k < to; k++) {
        const sg__irnode *n = &g->ir->nodes[grp->g[k].node];
        const sg__ref *o = ref_of(g, n->out);
        char args[3][32] = {"", "", ""};
        for (int j = 0; j < n->nin && j < 3; j++) {
            const sg__ref *a = arg_of(g, n, j);
            if (!a) continue;
            int src = reg_src(grp, k, j);
            bool twice = false; /* v == v on integers is a -Wtautological-compare warning */
            for (int q = 0; q < j && src >= 0; q++) twice |= reg_src(grp, k, q) == src;
            if (src >= 0 && twice && !sg__lower_fdom(a->dtype)) {
                sg__emit_line(g->e, "%s a%d_%d = v%d;", sg__lower_vtype(D, false), k, j, src);
                snprintf(args[j], sizeof args[j], "a%d_%d", k, j);
            } else if (src >= 0) {
                snprintf(args[j], sizeof args[j], "v%d", src);
            } else {
                sg__lower_offset(a, nd, shape, flat, off, sizeof off);
                snprintf(lv, sizeof lv, "((const %s *)slot[%d])[%s]", sg__lower_ctype(D, a->dtype),
                         a->slot, off);
                sg__lower_widen(D, a->dtype, lv, ld, sizeof ld);
                /* Loads go through a named temporary: some ops use an argument twice. */
                sg__emit_line(g->e, "%s a%d_%d = %s;", sg__lower_vtype(D, sg__lower_fdom(a->dtype)),
                              k, j, ld);
                snprintf(args[j], sizeof args[j], "a%d_%d", k, j);
            }
        }
        const char *const av[3] = {args[0], args[1], args[2]};
        sg__lower_member(D, g->ir, g->f, n, av, rt, sizeof rt);
        sg__emit_line(g->e, "%s v%d = %s; /* %s */", sg__lower_vtype(D, sg__lower_fdom(o->dtype)),
                      k, rt, sg__op_name(n->op));
        bool read = false; /* by a later member, from the register */
        for (int q = k + 1; q < to && !read; q++)
            for (int j = 0; j < g->ir->nodes[grp->g[q].node].nin && !read; j++)
                read = reg_src(grp, q, j) == k;
        if (!read && !grp->g[k].store) /* a value nothing reads (fusion disabled keeps it) */
            sg__emit_line(g->e, "(void)v%d;", k);
        if (grp->g[k].store) {
            char v[32];
            snprintf(v, sizeof v, "v%d", k);
            sg__lower_offset(o, nd, shape, flat, off, sizeof off);
            snprintf(lv, sizeof lv, "((%s *)slot[%d])[%s]", sg__lower_ctype(D, o->dtype), o->slot,
                     off);
            sg__lower_narrow_store(D, o->dtype, lv, v, st, sizeof st);
            sg__emit_line(g->e, "%s", st);
        }
    }
}

/* Is every ref a member touches flat-addressable over the shape? */
static bool group_flat(const gen *g, const sg__group *grp, int from, int to, int nd,
                       const int64_t *shape) {
    return sg__lower_group_flat(g->ir, g->f, grp, from, to, nd, shape, false);
}

/* The loop nest over (nd, shape) around the body of members [from, to);
 * nowait for MULTI members. */
static void emit_loop(gen *g, const sg__group *grp, int from, int to, int nd, const int64_t *shape,
                      bool nowait) {
    int64_t numel = 1;
    for (int d = 0; d < nd; d++) numel *= shape[d];
    bool flat = group_flat(g, grp, from, to, nd, shape);
    const char *nw = nowait ? " nowait" : "";
    if (numel == 0) return;
    if (flat) {
        sg__emit_line(g->e, "SG_OMP(omp for simd schedule(simd:static)%s)", nw);
        sg__emit_open(g->e, "for (int64_t i = 0; i < %lld; i++)", (long long)numel);
        emit_body(g, grp, from, to, nd, shape, true);
        sg__emit_close(g->e);
        return;
    }
    if (nd == 1) {
        sg__emit_line(g->e, "SG_OMP(omp for schedule(static)%s)", nw);
    } else {
        sg__emit_line(g->e, "SG_OMP(omp for collapse(%d) schedule(static)%s)", nd - 1, nw);
    }
    for (int d = 0; d < nd; d++) {
        if (d == nd - 1 && nd > 1) sg__emit_line(g->e, "SG_OMP(omp simd)");
        sg__emit_open(g->e, "for (int64_t i%d = 0; i%d < %lld; i%d++)", d, d, (long long)shape[d], d);
    }
    emit_body(g, grp, from, to, nd, shape, false);
    for (int d = 0; d < nd; d++) sg__emit_close(g->e);
}

/* ------------------------------------------------------------ kernels */

static uint32_t fnv1a(const char *s, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 16777619u;
    return h;
}

/* Does the group have generated code after its library call, if any? */
static bool has_loop(const sg__group *grp) {
    if (grp->kind == SG__G_OPAQUE) return false;
    if (grp->kind == SG__G_POINTWISE || grp->kind == SG__G_MULTI) return true;
    return grp->anchor + 1 < grp->n; /* an epilogue after the anchor */
}

/* Does a reduction or row group compute its anchor's input first? The
 * prologue runs as its own loop and stores what the library call reads. */
static bool has_prologue(const sg__group *grp) {
    return (grp->kind == SG__G_REDUCE || grp->kind == SG__G_ROW) && grp->anchor > 0;
}

/* The prologue's loop shape: the anchor's input. */
static const sg__ref *prologue_ref(const gen *g, const sg__group *grp) {
    return arg_of(g, &g->ir->nodes[grp->g[grp->anchor].node], 0);
}

static void kernel_comment(gen *g, const sg__group *grp, int k, bool pro, const char *name) {
    char sh[96];
    sg__emit_line(g->e, "/*");
    sg__emit_line(g->e, " * kernel %d: %s", k, name);
    if (grp->kind == SG__G_MULTI) {
        sg__emit_line(g->e, " * %d independent loops in one kernel", grp->nmembers);
    } else {
        const char *kind = pro                            ? "prologue before a library call"
                           : grp->kind == SG__G_POINTWISE ? "pointwise"
                                                          : "epilogue after a library call";
        const sg__ref *pr = pro ? prologue_ref(g, grp) : NULL;
        sg__emit_line(g->e, " * %s over %s, IR lines %d..%d, ops:", kind,
                      pr ? sg__shape_str(pr->ndim, pr->shape, sh, sizeof sh)
                         : sg__shape_str(grp->ndim, grp->shape, sh, sizeof sh),
                      grp->first, grp->last);
        for (int i = 0; i < grp->n; i++) {
            char line[512];
            sg__emit_line(g->e, " *   %s%s", sg__ir_node_str(g->ir, grp->g[i].node, line, sizeof line),
                          grp->g[i].store ? "  [stored]" : "");
        }
    }
    sg__emit_line(g->e, " */");
}

/* The function of kernel k (its prologue when `pro`), named after what it
 * fuses, its shape and a hash of its body. */
static void emit_kernel(gen *g, const sg__group *grp, int k, bool pro, char *fname, size_t fsize) {
    sg__emit body = {.ctx = g->e->ctx, .depth = 1};
    gen bg = *g;
    bg.e = &body;
    int nd = grp->ndim;
    const int64_t *shape = grp->shape;
    if (pro) {
        nd = prologue_ref(g, grp)->ndim;
        shape = prologue_ref(g, grp)->shape;
        emit_loop(&bg, grp, 0, grp->anchor, nd, shape, false);
    } else if (grp->kind == SG__G_MULTI) {
        /* Members share no data; one barrier at the end (after the last
         * loop that ran) lets the next kernel of the region read them. */
        for (int m = 0; m < grp->nmembers; m++) {
            const sg__group *part = &g->f->parts[grp->members[m]];
            emit_loop(&bg, part, 0, part->n, part->ndim, part->shape, true);
        }
        sg__emit_line(&body, "SG_OMP(omp barrier)");
    } else {
        emit_loop(&bg, grp, grp->anchor >= 0 ? grp->anchor + 1 : 0, grp->n, nd, shape, false);
    }
    char ops[96], sh[64] = "";
    sg__group_name(g->ir, grp, ops, sizeof ops);
    if (strlen(ops) > 48) ops[48] = '\0';
    size_t q = 0;
    for (int d = 0; d < nd && q < sizeof sh; d++)
        q += (size_t)snprintf(sh + q, sizeof sh - q, d ? "x%lld" : "%lld", (long long)shape[d]);
    const sg__group *tail = grp->kind == SG__G_MULTI ? &g->f->parts[grp->members[0]] : grp;
    sg_dtype dt = g->ir->refs[g->ir->nodes[tail->g[tail->n - 1].node].out].dtype;
    snprintf(fname, fsize, "sg_k%d%s_%s_%s_%s_%06x", k, pro ? "_pro" : "", ops, sg_dtype_name(dt),
             sh[0] ? sh : "1", body.buf ? fnv1a(body.buf, body.len) & 0xffffff : 0);
    kernel_comment(g, grp, k, pro, fname);
    sg__emit_line(g->e, "static void %s(char *const *slot) {", fname);
    if (body.buf) sg__emit_raw(g->e, "%s", body.buf);
    if (body.oom) g->e->oom = true;
    sg__emit_line(g->e, "}");
    sg__emit_line(g->e, "%s", "");
    sg__emit_free(&body);
}

/* ------------------------------------------------------------ the unit */

/* Work in a kernel's loops: forking threads for less costs more than it saves. */
static int64_t kernel_work(const sg__fused *f, const sg__group *grp) {
    if (grp->kind == SG__G_MULTI) {
        int64_t w = 0;
        for (int m = 0; m < grp->nmembers; m++) w += kernel_work(f, &f->parts[grp->members[m]]);
        return w;
    }
    /* Elements times ops: a long chain of transcendentals pays for threads sooner. */
    int64_t w = grp->n;
    for (int d = 0; d < grp->ndim; d++) w *= grp->shape[d];
    return w;
}

/* Work in a group's prologue loop. */
static int64_t prologue_work(const gen *g, const sg__group *grp) {
    const sg__ref *r = prologue_ref(g, grp);
    int64_t w = grp->anchor;
    for (int d = 0; d < r->ndim; d++) w *= r->shape[d];
    return w;
}

#define SG__PAR_MIN 32768 /* as the eager kernels (graphs/cpu/cpu.c) */

/* The library call of a group (its anchor or opaque node), or -1. */
static int call_node(const sg__group *grp) {
    if (grp->kind == SG__G_OPAQUE) return grp->g[0].node;
    if (grp->anchor >= 0) return grp->g[grp->anchor].node;
    return -1;
}

sg_status sg__cgen_c(sg_ctx *ctx, const sg__ir *ir, const sg__fused *f, const char *title,
                     sg__emit *e) {
    gen g = {.ir = ir, .f = f, .e = e};
    /* names[2k]: kernel k's loop after its library call; names[2k+1]: its prologue. */
    char (*names)[160] = sg__calloc(ctx, sizeof *names * (size_t)(f->ngroups ? f->ngroups : 1) * 2);
    if (!names) return sg__fail(ctx, SG_ERR_OOM, "codegen: out of host memory");
    sg__emit_line(e, "/* stepgraph: %s -- %d kernels for %d IR ops (generated; %s) */", title,
                  f->ngroups, ir->nnodes, sg__spell_of(D)->name);
    sg__lower_preamble(D, e);
    sg__emit_raw(e, "\n");
    for (int k = 0; k < f->ngroups; k++) {
        if (has_prologue(&f->groups[k]))
            emit_kernel(&g, &f->groups[k], k, true, names[2 * k + 1], sizeof names[0]);
        if (has_loop(&f->groups[k]))
            emit_kernel(&g, &f->groups[k], k, false, names[2 * k], sizeof names[0]);
    }
    /* The whole step: runs of generated kernels share one parallel region. */
    sg__emit_open(e, "int sg_step(char *const *slot, const sg_rt *rt)");
    sg__emit_line(e, "int rc = 0;");
    sg__emit_line(e, "(void)rt, (void)slot; /* a step of library calls only uses neither */");
    for (int k = 0; k < f->ngroups;) {
        const sg__group *grp = &f->groups[k];
        int call = call_node(grp);
        if (has_prologue(grp)) {
            sg__emit_line(e, "SG_OMP(omp parallel if (%d))", prologue_work(&g, grp) >= SG__PAR_MIN);
            sg__emit_open(e, "%s", "");
            sg__emit_line(e, "%s(slot);", names[2 * k + 1]);
            sg__emit_close(e);
        }
        if (call >= 0) {
            sg__emit_line(e, "if ((rc = rt->run_node(rt->ctx, %d)) != 0) return rc; /* %s */", call,
                          sg__op_name(ir->nodes[call].op));
        }
        if (!has_loop(grp)) {
            k++;
            continue;
        }
        /* Extend the region over following kernels that need no library call first. */
        int j = k;
        int64_t work = 0;
        for (; j < f->ngroups && has_loop(&f->groups[j]) && (j == k || call_node(&f->groups[j]) < 0); j++) {
            int64_t w = kernel_work(f, &f->groups[j]);
            if (w > work) work = w;
        }
        sg__emit_line(e, "SG_OMP(omp parallel if (%d))", work >= SG__PAR_MIN);
        sg__emit_open(e, "%s", "");
        for (int q = k; q < j; q++) sg__emit_line(e, "%s(slot);", names[2 * q]);
        sg__emit_close(e);
        k = j;
    }
    sg__emit_line(e, "return rc;");
    sg__emit_close(e);
    sg__emit_line(e, "%s", "");
    /* One kernel at a time, for the modes that launch kernels one by one. */
    sg__emit_open(e, "int sg_kernel(int k, char *const *slot, const sg_rt *rt)");
    sg__emit_line(e, "int rc = 0;");
    sg__emit_line(e, "(void)rt, (void)rc, (void)slot;");
    sg__emit_line(e, "switch (k) {");
    for (int k = 0; k < f->ngroups; k++) {
        const sg__group *grp = &f->groups[k];
        int call = call_node(grp);
        sg__emit_line(e, "case %d:", k);
        e->depth++;
        if (has_prologue(grp)) {
            sg__emit_line(e, "SG_OMP(omp parallel if (%d))", prologue_work(&g, grp) >= SG__PAR_MIN);
            sg__emit_line(e, "%s(slot);", names[2 * k + 1]);
        }
        if (call >= 0) sg__emit_line(e, "if ((rc = rt->run_node(rt->ctx, %d)) != 0) return rc;", call);
        if (has_loop(grp)) {
            sg__emit_line(e, "SG_OMP(omp parallel if (%d))", kernel_work(f, grp) >= SG__PAR_MIN);
            sg__emit_line(e, "%s(slot);", names[2 * k]);
        }
        sg__emit_line(e, "return 0;");
        e->depth--;
    }
    sg__emit_line(e, "default: return -1;");
    sg__emit_line(e, "}");
    sg__emit_close(e);
    sg__free(ctx, names, sizeof *names * (size_t)(f->ngroups ? f->ngroups : 1) * 2);
    if (e->oom) return sg__fail(ctx, SG_ERR_OOM, "codegen: out of host memory for the source");
    return SG_OK;
}
