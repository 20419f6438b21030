/* SPDX-License-Identifier: MIT */
/*
 * inspect.c -- seeing a compiled step: the generated source under the
 * "output_code" log topic, kernel names, the last capture as a Graphviz
 * DOT picture (sg_fn_write_dot, with SVG when `dot` is on PATH), a timed
 * timeline of replays as Chrome / Perfetto trace JSON (sg_fn_trace), and
 * the list of backends with whether each can be used now
 * (sg_list_backends); the read-only view a custom backend gets (sg_graph_view).
 */
#include "cuda/cuda.h"
#include "graphs.h"
#include "ze/ze.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------ the generated source */

void sg__graph_log_source(sg_fn *fn, const sg__graph *g, const char *source) {
    if (!source) return;
    int lines = 0;
    for (const char *p = source; *p; p++) lines += *p == '\n';
    sg__log(fn->ctx, "output_code", "fn '%s': capture %d: generated unit %s, %d lines", fn->name,
            fn->ngraphs, g->module, lines);
    enum { PIECE = 1000 };
    for (const char *p = source; *p;) {
        size_t n = strcspn(p, "\n");
        size_t at = 0;
        do { /* an empty line is one empty call */
            int len = (int)(n - at < PIECE ? n - at : PIECE);
            sg__log(fn->ctx, "output_code", "%.*s", len, p + at);
            at += (size_t)len;
        } while (at < n);
        p += n;
        if (*p) p++;
    }
}

/* ------------------------------------------------------------ kernel names */

int sg__graph_nkernels(const sg__graph *g) {
    return g->has_fused ? g->fused.ngroups : g->ir.nnodes;
}

/* The shape-free tail group a kernel's dtype comes from. */
static const sg__group *tail_group(const sg__fused *f, const sg__group *grp) {
    return grp->kind == SG__G_MULTI ? &f->parts[grp->members[0]] : grp;
}

int sg__graph_kernel_node(const sg__graph *g, int k) {
    return g->has_fused ? g->fused.groups[k].g[0].node : k;
}

const char *sg__graph_kernel_name(const sg__graph *g, int k, char *buf, size_t size) {
    const sg__ir *ir = &g->ir;
    if (!g->has_fused || g->op_by_op) {
        snprintf(buf, size, "sg_op%d_%s", k,
                 sg__op_name(ir->nodes[sg__graph_kernel_node(g, k)].op));
        return buf;
    }
    const sg__group *grp = &g->fused.groups[k];
    char ops[96];
    sg__group_name(ir, grp, ops, sizeof ops);
    if (strlen(ops) > 48) ops[48] = '\0'; /* as the generated name */
    const sg__group *tail = tail_group(&g->fused, grp);
    sg_dtype dt = ir->refs[ir->nodes[tail->g[tail->n - 1].node].out].dtype;
    snprintf(buf, size, "sg_k%d_%s_%s", k, ops, sg_dtype_name(dt));
    return buf;
}

/* The ops of kernel k, ", "-separated. */
static const char *kernel_ops(const sg__graph *g, int k, char *buf, size_t size) {
    const sg__ir *ir = &g->ir;
    size_t q = 0;
    buf[0] = '\0';
    if (!g->has_fused) {
        snprintf(buf, size, "%s", sg__op_name(ir->nodes[k].op));
        return buf;
    }
    const sg__group *grp = &g->fused.groups[k];
    int nparts = grp->kind == SG__G_MULTI ? grp->nmembers : 1;
    for (int m = 0; m < nparts; m++) {
        const sg__group *p = grp->kind == SG__G_MULTI ? &g->fused.parts[grp->members[m]] : grp;
        for (int i = 0; i < p->n && q < size; i++)
            q += (size_t)snprintf(buf + q, size - q, "%s%s", q ? ", " : "",
                                  sg__op_name(ir->nodes[p->g[i].node].op));
    }
    return buf;
}

/* ------------------------------------------------------------ a growing sg__text */

static void text_free(sg__text *t) {
    if (t->buf) sg__free(t->ctx, t->buf, t->cap);
    t->buf = NULL;
}

/* Write t to path (created or truncated, mode 0644). */
static sg_status text_write(sg__text *t, const char *what, const char *path) {
    if (t->oom) return sg__fail(t->ctx, SG_ERR_OOM, "%s: out of host memory", what);
    if (sg__write_file(path, t->buf ? t->buf : "", t->len) != 0)
        return sg__fail(t->ctx, SG_ERR_COMPILE, "%s: cannot write %s: %s; pass a writable path",
                        what, path, strerror(errno));
    return SG_OK;
}

/* ------------------------------------------------------------ DOT */

typedef struct dot {
    sg__text t;
    const sg__graph *g;
    int *writer; /* per slot: the last kernel that wrote it so far, -1 none */
    int *seen;   /* per slot: the last kernel an edge into it was drawn for */
} dot;

static void ref_str(const sg__ref *r, char *buf, size_t size) {
    char sh[96];
    snprintf(buf, size, "%s%s", sg_dtype_name(r->dtype),
             sg__shape_str(r->ndim, r->shape, sh, sizeof sh));
}

/* Where slot s lives, for an edge label. */
static void where_str(const sg__graph *g, int s, char *buf, size_t size) {
    const sg__slot *sl = &g->ir.slots[s];
    if (sl->kind == SG__SLOT_INPUT)
        snprintf(buf, size, "input %d", sl->input);
    else if (sl->kind == SG__SLOT_PARAM)
        snprintf(buf, size, "parameter");
    else if (g->slot_off[s] == SIZE_MAX)
        snprintf(buf, size, "no pool bytes");
    else
        snprintf(buf, size, "%s +%zu", sl->output >= 0 ? "output set" : "scratch", g->slot_off[s]);
}

/* The DOT node that holds slot s before any kernel wrote it. */
static void source_node(const dot *d, int s, char *buf, size_t size) {
    const sg__slot *sl = &d->g->ir.slots[s];
    if (d->writer[s] >= 0)
        snprintf(buf, size, "k%d", d->writer[s]);
    else if (sl->kind == SG__SLOT_INPUT)
        snprintf(buf, size, "in%d", sl->input);
    else if (sl->kind == SG__SLOT_PARAM)
        snprintf(buf, size, "p%d", s);
    else
        buf[0] = '\0'; /* never written: nothing to draw */
}

static void edge(dot *d, int ref, int k) {
    const sg__ir *ir = &d->g->ir;
    const sg__ref *r = &ir->refs[ref];
    if (d->seen[r->slot] == k) return;
    d->seen[r->slot] = k;
    char src[32], rs[128], where[64];
    source_node(d, r->slot, src, sizeof src);
    if (!src[0] || (d->writer[r->slot] == k)) return;
    ref_str(r, rs, sizeof rs);
    where_str(d->g, r->slot, where, sizeof where);
    sg__text_put(&d->t, "  %s -> k%d [label=\"%s\\n%s\"];\n", src, k, rs, where);
}

static void wrote(dot *d, int ref, int k) {
    const sg__ir *ir = &d->g->ir;
    int s = ir->refs[ref].slot;
    const sg__slot *sl = &ir->slots[s];
    if (sl->kind != SG__SLOT_INTERNAL && d->writer[s] != k) {
        char dst[32];
        int saved = d->writer[s];
        d->writer[s] = -1;
        source_node(d, s, dst, sizeof dst);
        d->writer[s] = saved;
        sg__text_put(&d->t, "  k%d -> %s [style=dashed, label=\"written in place\"];\n", k, dst);
    }
    d->writer[s] = k;
}

/* Edges into kernel k from what its group reads in memory (as graph.c's
 * plan sees it), then note what it writes. */
static void group_edges(dot *d, const sg__group *grp, int k, bool writes) {
    const sg__ir *ir = &d->g->ir;
    const sg__fused *f = &d->g->fused;
    for (int i = 0; i < grp->n; i++) {
        const sg__irnode *n = &ir->nodes[grp->g[i].node];
        bool lib = grp->kind == SG__G_OPAQUE || i == grp->anchor;
        if (writes) {
            if (lib || grp->g[i].store) wrote(d, f->alias[n->out], k);
            continue;
        }
        for (int j = 0; j < n->nin; j++) {
            int r = ir->args[n->args + j];
            if (r < 0) continue;
            int src = j < 4 ? grp->g[i].arg_src[j] : -1;
            if (lib || src < 0 || src == grp->anchor) edge(d, f->alias[r], k);
        }
    }
}

static void kernel_edges(dot *d, int k) {
    const sg__graph *g = d->g;
    const sg__ir *ir = &g->ir;
    if (!g->has_fused) {
        const sg__irnode *n = &ir->nodes[k];
        for (int j = 0; j < n->nin; j++)
            if (ir->args[n->args + j] >= 0) edge(d, ir->args[n->args + j], k);
        wrote(d, n->out, k);
        return;
    }
    const sg__group *grp = &g->fused.groups[k];
    for (int pass = 0; pass < 2; pass++) {
        if (grp->kind == SG__G_MULTI)
            for (int m = 0; m < grp->nmembers; m++)
                group_edges(d, &g->fused.parts[grp->members[m]], k, pass == 1);
        else
            group_edges(d, grp, k, pass == 1);
    }
}

static void dot_nodes(dot *d, const sg_fn *fn) {
    const sg__graph *g = d->g;
    const sg__ir *ir = &g->ir;
    char sh[96], name[160], ops[512];
    for (int i = 0; i < fn->nin; i++)
        sg__text_put(&d->t, "  in%d [shape=invhouse, label=\"input %d\\n%s%s\"];\n", i, i,
            sg_dtype_name(g->key[i].dtype),
            sg__shape_str(g->key[i].ndim, g->key[i].shape, sh, sizeof sh));
    for (int s = 0; s < ir->nslots; s++)
        if (ir->slots[s].kind == SG__SLOT_PARAM)
            sg__text_put(&d->t, "  p%d [shape=cylinder, label=\"parameter p%d\\n%zu bytes\"];\n", s, s,
                ir->slots[s].param->nbytes);
    int nk = sg__graph_nkernels(g);
    for (int k = 0; k < nk; k++) {
        const sg__ref *r = NULL;
        if (!g->has_fused) {
            r = &ir->refs[ir->nodes[k].out];
        } else {
            const sg__group *t = tail_group(&g->fused, &g->fused.groups[k]);
            r = &ir->refs[ir->nodes[t->g[t->n - 1].node].out];
        }
        const sg__group *grp = g->has_fused ? &g->fused.groups[k] : NULL;
        if (grp && grp->kind != SG__G_MULTI && grp->anchor >= 0) /* what the anchor walks */
            r = &ir->refs[ir->args[ir->nodes[grp->g[grp->anchor].node].args]];
        else if (grp && grp->ndim > 0)
            r = NULL;
        sg__text_put(&d->t, "  k%d [shape=box, label=\"%s\\nops: %s\\nover %s\"];\n", k,
            sg__graph_kernel_name(g, k, name, sizeof name), kernel_ops(g, k, ops, sizeof ops),
            r ? sg__shape_str(r->ndim, r->shape, sh, sizeof sh)
              : sg__shape_str(grp->ndim, grp->shape, sh, sizeof sh));
    }
    for (int o = 0; o < ir->nout; o++) {
        char rs[128];
        ref_str(&ir->refs[ir->out_refs[o]], rs, sizeof rs);
        sg__text_put(&d->t, "  out%d [shape=house, label=\"output %d\\n%s\"];\n", o, o, rs);
    }
}

static sg_status dot_text(sg_fn *fn, const sg__graph *g, sg__text *out) {
    const sg__ir *ir = &g->ir;
    size_t bytes = sizeof(int) * (size_t)(ir->nslots ? ir->nslots : 1);
    dot d = {.t = {.ctx = fn->ctx}, .g = g};
    d.writer = sg__alloc(fn->ctx, bytes);
    d.seen = sg__alloc(fn->ctx, bytes);
    if (!d.writer || !d.seen) d.t.oom = true;
    for (int s = 0; !d.t.oom && s < ir->nslots; s++) d.writer[s] = d.seen[s] = -1;
    sg__text_put(&d.t, "digraph \"%s\" {\n  rankdir=TB;\n  node [fontname=\"monospace\"];\n", fn->name);
    dot_nodes(&d, fn);
    int nk = sg__graph_nkernels(g);
    for (int k = 0; k < nk && !d.t.oom; k++) kernel_edges(&d, k);
    for (int o = 0; o < ir->nout && !d.t.oom; o++) {
        int r = g->has_fused ? g->fused.alias[ir->out_refs[o]] : ir->out_refs[o];
        char src[32], rs[128], where[64];
        source_node(&d, ir->refs[r].slot, src, sizeof src);
        if (!src[0]) continue;
        ref_str(&ir->refs[r], rs, sizeof rs);
        where_str(g, ir->refs[r].slot, where, sizeof where);
        sg__text_put(&d.t, "  %s -> out%d [label=\"%s\\n%s\"];\n", src, o, rs, where);
    }
    sg__text_put(&d.t, "}\n");
    if (d.writer) sg__free(fn->ctx, d.writer, bytes);
    if (d.seen) sg__free(fn->ctx, d.seen, bytes);
    *out = d.t;
    return d.t.oom ? sg__fail(fn->ctx, SG_ERR_OOM, "sg_fn_write_dot: out of host memory") : SG_OK;
}

/* `dot -Tsvg -o <path>.svg <path>`, without a shell; *svg false when no dot. */
static sg_status dot_svg(sg_ctx *ctx, const char *path, bool *svg) {
    char out[4200];
    snprintf(out, sizeof out, "%s.svg", path);
    char *argv[] = {"dot", "-Tsvg", "-o", out, (char *)path, NULL};
    int fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
    if (fd < 0) return sg__fail(ctx, SG_ERR_COMPILE, "sg_fn_write_dot: cannot open /dev/null");
    int status = 0;
    int rc = sg__run_program(argv, fd, &status, 60);
    close(fd);
    if (rc == ENOENT || (rc == 0 && WIFEXITED(status) && WEXITSTATUS(status) == 127)) return SG_OK;
    if (rc != 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        char why[64];
        if (rc == 0 && WIFEXITED(status))
            snprintf(why, sizeof why, "exit status %d", WEXITSTATUS(status));
        else if (rc == 0 && WIFSIGNALED(status))
            snprintf(why, sizeof why, "killed by signal %d", WTERMSIG(status));
        else
            snprintf(why, sizeof why, "%s", rc == ETIMEDOUT ? "took over 60 s" : strerror(rc));
        return sg__fail(ctx, SG_ERR_COMPILE,
                        "sg_fn_write_dot: `dot -Tsvg` on %s failed (%s); the DOT file is "
                        "written, render it by hand",
                        path, why);
    }
    *svg = true;
    return SG_OK;
}

/* The last capture of fn, if it has a plan to picture. */
static sg_status last_capture(sg_fn *fn, const char *what, sg__graph **g) {
    sg_status s = sg__fn_check(fn, what);
    if (s != SG_OK) return s;
    if (fn->ngraphs == 0)
        return sg__fail(fn->ctx, SG_ERR_INVALID_ARG,
                        "%s: fn '%s' has no capture yet; call it with sg_call first", what,
                        fn->name);
    *g = fn->graphs[fn->ngraphs - 1];
    if ((*g)->eager)
        return sg__fail(fn->ctx, SG_ERR_INVALID_ARG,
                        "%s: the last capture of fn '%s' runs eagerly (%.600s): it has no plan",
                        what, fn->name, (*g)->why);
    return SG_OK;
}

sg_status sg_fn_write_dot(sg_fn *fn, const char *path, bool *svg) {
    if (svg) *svg = false;
    sg__graph *g = NULL;
    sg_status s = last_capture(fn, "sg_fn_write_dot", &g);
    if (s != SG_OK) return s;
    if (!path) return sg__fail(fn->ctx, SG_ERR_NULL, "sg_fn_write_dot: path is NULL");
    sg__text t;
    s = dot_text(fn, g, &t);
    if (s == SG_OK) s = text_write(&t, "sg_fn_write_dot", path);
    text_free(&t);
    bool made = false;
    if (s == SG_OK) s = dot_svg(fn->ctx, path, &made);
    if (svg) *svg = made;
    return s;
}

/* ------------------------------------------------------------ trace */

typedef struct trace_ev {
    const sg__graph *g;
    int capture, kernel;
    uint64_t replay;
    double t0, t1;
} trace_ev;

typedef struct sg__trace {
    trace_ev *ev;
    int n, cap;
    uint64_t replay; /* the replay being run */
    bool oom;
} sg__trace;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void trace_add(sg_fn *fn, const sg__graph *g, int k, double t0, double t1) {
    sg__trace *tr = fn->trace;
    if (tr->n == tr->cap) {
        int ncap = tr->cap ? tr->cap * 2 : 256;
        trace_ev *ne = sg__alloc(fn->ctx, sizeof *ne * (size_t)ncap);
        if (!ne) {
            tr->oom = true;
            return;
        }
        if (tr->ev) {
            memcpy(ne, tr->ev, sizeof *ne * (size_t)tr->n);
            sg__free(fn->ctx, tr->ev, sizeof *ne * (size_t)tr->cap);
        }
        tr->ev = ne;
        tr->cap = ncap;
    }
    int gi = 0;
    while (gi < fn->ngraphs && fn->graphs[gi] != g) gi++;
    tr->ev[tr->n++] = (trace_ev){g, gi + 1, k, tr->replay, t0, t1};
}

void sg__trace_kernel(sg_fn *fn, const sg__graph *g, int k, double t0, double t1) {
    trace_add(fn, g, k, t0, t1);
}

void sg__trace_next(sg_fn *fn) { fn->trace->replay++; }

/* The compiled CPU unit, one sg_kernel at a time. */
static int run_node_cb(void *p, int node) {
    sg__graph *g = p;
    return (int)g->ctx->exec.run(g->ctx, &g->nodes[node]);
}

sg_status sg__trace_replay(sg_fn *fn, sg__graph *g) {
    sg_ctx *ctx = fn->ctx;
    int nk = sg__graph_nkernels(g);
    sg__rt rt = {.ctx = g, .run_node = run_node_cb};
    for (int k = 0; k < nk; k++) {
        double t0 = now_s();
        sg_status s = g->compiled ? (sg_status)g->kernel_fn(k, g->slotp, &rt)
                                  : ctx->exec.run(ctx, &g->nodes[sg__graph_kernel_node(g, k)]);
        double t1 = now_s();
        if (s != SG_OK) return s;
        trace_add(fn, g, k, t0, t1);
    }
    fn->trace->replay++;
    return SG_OK;
}

/* A JSON string body: names and op lists hold no quote or control byte,
 * but say so safely anyway. */
static void put_json_str(sg__text *t, const char *s) {
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            sg__text_put(t, "\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            sg__text_put(t, "\\u%04x", (unsigned)(unsigned char)*s);
        else
            sg__text_put(t, "%c", *s);
    }
}

static void trace_json(const sg__trace *tr, sg__text *t) {
    double base = tr->n ? tr->ev[0].t0 : 0;
    sg__text_put(t, "{\"traceEvents\": [\n");
    for (int i = 0; i < tr->n && !t->oom; i++) {
        const trace_ev *e = &tr->ev[i];
        char name[160], ops[512];
        sg__text_put(t, "  {\"name\": \"");
        put_json_str(t, sg__graph_kernel_name(e->g, e->kernel, name, sizeof name));
        sg__text_put(t,
            "\", \"cat\": \"kernel\", \"ph\": \"X\", \"ts\": %.3f, \"dur\": %.3f, \"pid\": 1, "
            "\"tid\": 1, \"args\": {\"replay\": %llu, \"kernel\": %d, \"capture\": %d, \"ops\": \"",
            (e->t0 - base) * 1e6, (e->t1 - e->t0) * 1e6, (unsigned long long)e->replay, e->kernel,
            e->capture);
        put_json_str(t, kernel_ops(e->g, e->kernel, ops, sizeof ops));
        sg__text_put(t, "\"}}%s\n", i + 1 < tr->n ? "," : "");
    }
    sg__text_put(t, "], \"displayTimeUnit\": \"ms\"}\n");
}

sg_status sg_fn_trace(sg_fn *fn, sg_tensor *const *in, int nin, const char *path, int replays) {
    sg_status s0 = sg__fn_check(fn, "sg_fn_trace");
    if (s0 != SG_OK) return s0;
    sg_ctx *ctx = fn->ctx;
    if (!path) return sg__fail(ctx, SG_ERR_NULL, "sg_fn_trace: path is NULL");
    if (replays < 1)
        return sg__fail(ctx, SG_ERR_INVALID_ARG, "sg_fn_trace: replays %d; pass 1 or more",
                        replays);
    if (ctx->backend != SG_BACKEND_CPU && ctx->backend != SG_BACKEND_CUDA)
        return sg__fail(ctx, SG_ERR_UNSUPPORTED,
                        "sg_fn_trace: per-kernel timing is implemented for the cpu and cuda "
                        "backends, not %s",
                        sg_backend_name(ctx->backend));
    if (fn->trace) return sg__fail(ctx, SG_ERR_INVALID_ARG, "sg_fn_trace: already tracing fn");
    size_t outsz = sizeof(sg_tensor *) * (size_t)fn->nout;
    sg_tensor **out = sg__alloc(ctx, outsz);
    if (!out) return sg__fail(ctx, SG_ERR_OOM, "sg_fn_trace: out of host memory");
    sg__trace tr = {0};
    fn->trace = &tr;
    sg_status s = SG_OK;
    for (int r = 0; r < replays && s == SG_OK; r++) s = sg_call(fn, in, nin, out, fn->nout);
    fn->trace = NULL;
    sg__free(ctx, out, outsz);
    sg__text t = {.ctx = ctx};
    if (s == SG_OK && tr.oom) s = sg__fail(ctx, SG_ERR_OOM, "sg_fn_trace: out of host memory");
    if (s == SG_OK) {
        trace_json(&tr, &t);
        s = text_write(&t, "sg_fn_trace", path);
    }
    text_free(&t);
    if (tr.ev) sg__free(ctx, tr.ev, sizeof *tr.ev * (size_t)tr.cap);
    return s;
}

/* ------------------------------------------------------------ backends */

sg_status sg_list_backends(sg_backend_info *out, int cap, int *n) {
    if (!n || (cap > 0 && !out)) return SG_ERR_NULL;
    static const sg_backend order[] = {SG_BACKEND_CUDA, SG_BACKEND_HIP, SG_BACKEND_ZE,
                                       SG_BACKEND_CPU};
    *n = 4;
    for (int i = 0; i < 4 && i < cap; i++) {
        sg_backend_info *b = &out[i];
        memset(b, 0, sizeof *b);
        b->backend = order[i];
        b->name = sg_backend_name(order[i]);
        switch (order[i]) {
        case SG_BACKEND_CUDA:
#ifdef SG_HAVE_CUDA_HEADERS
            b->built = true;
#endif
            b->available = sg__cuda_probe(b->why, sizeof b->why, NULL) == SG_OK;
            break;
        case SG_BACKEND_ZE:
#ifdef SG_HAVE_ZE_HEADERS
            b->built = true;
#endif
            b->available = sg__ze_probe(b->why, sizeof b->why) == SG_OK;
            break;
        case SG_BACKEND_HIP:
#if defined(SG_HAVE_CUDA_HEADERS) && defined(SG_HAVE_HIP_HEADERS)
            b->built = true;
#endif
            b->available = sg__hip_probe(b->why, sizeof b->why, NULL) == SG_OK;
            break;
        case SG_BACKEND_CPU: b->built = b->available = true; break;
        default:
            snprintf(b->why, sizeof b->why, "the %s backend is not built into this stepgraph",
                     b->name);
            break;
        }
        if (b->available) b->why[0] = '\0';
    }
    return SG_OK;
}

/* ------------------------------------------------------------ the custom backend's view */

int sg_graph_view_num_kernels(const sg_graph_view *v) { return v ? sg__graph_nkernels(v->g) : 0; }

const char *sg_graph_view_kernel_name(const sg_graph_view *v, int k, char *buf, size_t size) {
    if (!buf || size == 0) return "";
    buf[0] = '\0';
    if (!v || k < 0 || k >= sg__graph_nkernels(v->g)) return buf;
    return sg__graph_kernel_name(v->g, k, buf, size);
}

/* The g of op i of kernel k (a group of a MULTI kernel's parts), or NULL. */
static const sg__gnode *view_op(const sg_graph_view *v, int k, int i, int *n) {
    *n = 0;
    if (!v || k < 0 || k >= sg__graph_nkernels(v->g)) return NULL;
    const sg__graph *g = v->g;
    if (!g->has_fused) {
        *n = 1;
        return NULL;
    }
    const sg__group *grp = &g->fused.groups[k];
    int nparts = grp->kind == SG__G_MULTI ? grp->nmembers : 1;
    const sg__gnode *hit = NULL;
    for (int m = 0; m < nparts; m++) {
        const sg__group *p = grp->kind == SG__G_MULTI ? &g->fused.parts[grp->members[m]] : grp;
        if (i >= *n && i < *n + p->n) hit = &p->g[i - *n];
        *n += p->n;
    }
    return hit;
}

int sg_graph_view_num_ops(const sg_graph_view *v, int k) {
    int n;
    view_op(v, k, -1, &n);
    return n;
}

const char *sg_graph_view_op_name(const sg_graph_view *v, int k, int i) {
    int n;
    const sg__gnode *gn = view_op(v, k, i, &n);
    if (gn) return sg__op_name(v->g->ir.nodes[gn->node].op);
    if (v && !v->g->has_fused && i == 0 && n == 1) return sg__op_name(v->g->ir.nodes[k].op);
    return "";
}

int sg_graph_view_num_inputs(const sg_graph_view *v) { return v ? v->fn->nin : 0; }
int sg_graph_view_num_outputs(const sg_graph_view *v) { return v ? v->fn->nout : 0; }

static sg_status view_tensor(sg_dtype dt, int nd, const int64_t *sh, sg_dtype *dtype, int *ndim,
                             int64_t *shape) {
    if (dtype) *dtype = dt;
    if (ndim) *ndim = nd;
    if (shape) memcpy(shape, sh, sizeof(int64_t) * (size_t)nd);
    return SG_OK;
}

sg_status sg_graph_view_input(const sg_graph_view *v, int i, sg_dtype *dtype, int *ndim,
                              int64_t *shape) {
    if (!v) return SG_ERR_NULL;
    if (i < 0 || i >= v->fn->nin) return SG_ERR_INDEX;
    const sg__argkey *a = &v->g->key[i];
    return view_tensor(a->dtype, a->ndim, a->shape, dtype, ndim, shape);
}

sg_status sg_graph_view_output(const sg_graph_view *v, int i, sg_dtype *dtype, int *ndim,
                               int64_t *shape) {
    if (!v) return SG_ERR_NULL;
    if (i < 0 || i >= v->fn->nout) return SG_ERR_INDEX;
    const sg__ref *r = &v->g->ir.refs[v->g->ir.out_refs[i]];
    return view_tensor(r->dtype, r->ndim, r->shape, dtype, ndim, shape);
}
