/* SPDX-License-Identifier: MIT */
/*
 * test_graphs_inspect.c -- seeing a compiled step: SG_LOGS=output_code
 * gives the whole generated unit (line for line the file SG_DUMP_DIR
 * gets); sg_fn_write_dot draws the expected kernels, inputs, parameters,
 * outputs and buffers, and runs `dot` for SVG when there is one (a stand-in
 * script here) and says so when there is none; sg_fn_trace writes valid
 * trace JSON with one event per kernel per replay, named as the kernels,
 * while the results stay right; sg_list_backends agrees with sg_ctx_create.
 */
#define _POSIX_C_SOURCE 200809L /* setenv, mkdtemp */
#include "testutil.h"

#include <ctype.h>
#include <dirent.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ------------------------------------------------------------ logs */

static char *code; /* every "output_code" line, each with '\n' */
static size_t code_len, code_cap;

static void log_hook(void *user, const char *topic, const char *line) {
    (void)user;
    if (strcmp(topic, "output_code") != 0) return;
    size_t n = strlen(line);
    if (code_len + n + 2 > code_cap) {
        code_cap = (code_len + n + 2) * 2;
        code = realloc(code, code_cap);
    }
    memcpy(code + code_len, line, n);
    code_len += n;
    code[code_len++] = '\n';
    code[code_len] = '\0';
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

/* ------------------------------------------------------------ the step */

enum { R = 4, C = 8 };
static sg_tensor *w; /* a parameter */

/* a = tanh(sin(x) * w) (R, C); c = sum(a, dim 1) + 1 (R) */
static sg_status step(sg_ctx *ctx, sg_tensor *const *in, sg_tensor **out, void *user) {
    (void)user;
    int dim = 1;
    sg_tensor *a = sg_tanh(sg_mul(sg_sin(in[0]), w));
    out[0] = sg_add_scalar(sg_sum(a, 1, &dim, false), 1.0);
    out[1] = a;
    return out[0] && out[1] ? SG_OK : sg_ctx_status(ctx);
}

static bool check_results(sg_tensor *const *out, const double *xv, const double *wv) {
    double ra[R * C], rc[R];
    for (int i = 0; i < R; i++) {
        rc[i] = 1.0;
        for (int j = 0; j < C; j++) {
            ra[i * C + j] = tanh(sin(xv[i * C + j]) * wv[i * C + j]);
            rc[i] += ra[i * C + j];
        }
    }
    double *gc = tu_read(out[0]), *ga = tu_read(out[1]);
    bool ok = gc && ga && tu_close("c", gc, rc, R, tu_rtol(SG_F32), 1e-5) &&
              tu_close("a", ga, ra, R * C, tu_rtol(SG_F32), tu_atol(SG_F32));
    free(gc);
    free(ga);
    return ok;
}

/* "kernels: N (fused" or "N ops" from sg_fn_explain. */
static int explain_int(sg_fn *fn, const char *before) {
    const char *p = strstr(sg_fn_explain(fn), before);
    return p ? atoi(p + strlen(before)) : -1;
}

/* ------------------------------------------------------------ DOT parsing */

typedef struct dnode {
    char id[32], shape[32], label[512];
} dnode;
typedef struct dedge {
    char from[32], to[32], label[256];
    bool dashed;
} dedge;

static dnode nodes[256];
static dedge edges[512];
static int nnodes, nedges;

/* `  id [shape=S, label="L"];` and `  a -> b [style=dashed, label="L"];` */
static bool parse_dot(const char *text) {
    nnodes = nedges = 0;
    if (strncmp(text, "digraph ", 8) != 0) return false;
    bool closed = false;
    for (const char *p = text; *p;) {
        const char *eol = strchr(p, '\n');
        size_t n = eol ? (size_t)(eol - p) : strlen(p);
        char line[1024];
        snprintf(line, sizeof line, "%.*s", (int)n, p);
        p += n + (eol ? 1 : 0);
        char a[32], b[32];
        const char *lab = strstr(line, "label=\"");
        if (strcmp(line, "}") == 0) {
            closed = true;
        } else if (sscanf(line, " %31s -> %31s [", a, b) == 2 && lab && nedges < 512) {
            dedge *e = &edges[nedges++];
            snprintf(e->from, sizeof e->from, "%s", a);
            snprintf(e->to, sizeof e->to, "%s", b);
            snprintf(e->label, sizeof e->label, "%s", lab + 7);
            e->dashed = strstr(line, "style=dashed") != NULL;
        } else if (sscanf(line, " %31s [shape=%31[a-z],", a, b) == 2 && lab && nnodes < 256) {
            dnode *d = &nodes[nnodes++];
            snprintf(d->id, sizeof d->id, "%s", a);
            snprintf(d->shape, sizeof d->shape, "%s", b);
            snprintf(d->label, sizeof d->label, "%s", lab + 7);
        }
    }
    return closed;
}

static const dnode *find_node(const char *id) {
    for (int i = 0; i < nnodes; i++)
        if (strcmp(nodes[i].id, id) == 0) return &nodes[i];
    return NULL;
}

static int edges_into(const char *to, const dedge **last) {
    int n = 0;
    for (int i = 0; i < nedges; i++)
        if (strcmp(edges[i].to, to) == 0) n++, *last = &edges[i];
    return n;
}

static bool has_edge(const char *from_prefix, const char *to_prefix) {
    for (int i = 0; i < nedges; i++)
        if (strncmp(edges[i].from, from_prefix, strlen(from_prefix)) == 0 &&
            strncmp(edges[i].to, to_prefix, strlen(to_prefix)) == 0)
            return true;
    return false;
}

/* The kernel name of node k<k> (its label's first line) into buf. */
static const char *kernel_label_name(int k, char *buf, size_t size) {
    char id[32];
    snprintf(id, sizeof id, "k%d", k);
    const dnode *d = find_node(id);
    if (!d) return NULL;
    snprintf(buf, size, "%.*s", (int)strcspn(d->label, "\\\""), d->label);
    return buf;
}

/* ------------------------------------------------------------ a tiny JSON checker */

typedef struct jp {
    const char *p;

} jp;

static void ws(jp *j) {
    while (isspace((unsigned char)*j->p)) j->p++;
}

static bool value(jp *j);

static bool jstring(jp *j, char *out, size_t size) {
    size_t n = 0;
    if (*j->p != '"') return false;
    for (j->p++; *j->p != '"'; j->p++) {
        if (!*j->p || (unsigned char)*j->p < 0x20) return false;
        if (*j->p == '\\') {
            j->p++;
            if (!strchr("\"\\/bfnrtu", *j->p)) return false;
        }
        if (out && n + 1 < size) out[n++] = *j->p;
    }
    j->p++;
    if (out) out[n] = '\0';
    return true;
}

static bool jnumber(jp *j, double *v) {
    char *end;
    if (!(*j->p == '-' || isdigit((unsigned char)*j->p))) return false;
    double d = strtod(j->p, &end);
    if (end == j->p) return false;
    if (v) *v = d;
    j->p = end;
    return true;
}

static bool container(jp *j, char open, char close, bool keys) {
    if (*j->p != open) return false;
    j->p++;
    ws(j);
    if (*j->p == close) return j->p++, true;
    for (;;) {
        ws(j);
        if (keys) {
            if (!jstring(j, NULL, 0)) return false;
            ws(j);
            if (*j->p++ != ':') return false;
        }
        if (!value(j)) return false;
        ws(j);
        if (*j->p == ',') {
            j->p++;
            continue;
        }
        return *j->p++ == close;
    }
}

static bool value(jp *j) {
    ws(j);
    if (*j->p == '{') return container(j, '{', '}', true);
    if (*j->p == '[') return container(j, '[', ']', false);
    if (*j->p == '"') return jstring(j, NULL, 0);
    if (!strncmp(j->p, "true", 4) || !strncmp(j->p, "null", 4)) return j->p += 4, true;
    if (!strncmp(j->p, "false", 5)) return j->p += 5, true;
    return jnumber(j, NULL);
}

static bool json_valid(const char *text) {
    jp j = {text};
    if (!value(&j)) return false;
    ws(&j);
    return *j.p == '\0';
}

/* The value after "key": inside one event object [p, end). */
static const char *field(const char *p, const char *end, const char *key) {
    char k[64];
    snprintf(k, sizeof k, "\"%s\": ", key);
    const char *f = strstr(p, k);
    return f && f < end ? f + strlen(k) : NULL;
}

typedef struct tev {
    char name[160], ph[8];
    double ts, dur, replay, kernel;
    bool has_pid, has_tid;
} tev;

/* The events of a valid trace: each is one line "{...}" in traceEvents. */
static int trace_events(const char *text, tev *ev, int cap) {
    int n = 0;
    const char *p = strstr(text, "\"traceEvents\": [");
    if (!p) return -1;
    while ((p = strstr(p, "\n  {\"name\": ")) != NULL && n < cap) {
        p += 3;
        const char *end = strchr(p, '\n');
        tev *e = &ev[n++];
        memset(e, 0, sizeof *e);
        jp j = {field(p, end, "name")};
        if (!j.p || !jstring(&j, e->name, sizeof e->name)) return -1;
        j.p = field(p, end, "ph");
        if (!j.p || !jstring(&j, e->ph, sizeof e->ph)) return -1;
        const char *num[] = {"ts", "dur", "replay", "kernel"};
        double *dst[] = {&e->ts, &e->dur, &e->replay, &e->kernel};
        for (int q = 0; q < 4; q++) {
            j.p = field(p, end, num[q]);
            if (!j.p || !jnumber(&j, dst[q])) return -1;
        }
        e->has_pid = field(p, end, "pid") != NULL;
        e->has_tid = field(p, end, "tid") != NULL;
        if (!field(p, end, "args")) return -1;
    }
    return n;
}

/* ------------------------------------------------------------ cases */

static char tmpdir[64];

/* Whether a `dot` program is on PATH, looked up here independently. */
static bool dot_on_path(void) {
    const char *path = getenv("PATH");
    char buf[4096], f[4200];
    snprintf(buf, sizeof buf, "%s", path ? path : "");
    for (char *save = NULL, *d = strtok_r(buf, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
        snprintf(f, sizeof f, "%s/dot", d);
        if (access(f, X_OK) == 0) return true;
    }
    return false;
}

static void case_output_code_and_dot(sg_ctx *ctx, sg_fn *fn) {
    /* output_code: the header line, then the unit as SG_DUMP_DIR has it. */
    char module[128] = "";
    int lines = -1;
    const char *h = code ? strstr(code, "generated unit ") : NULL;
    if (h) sscanf(h, "generated unit %127[^,], %d lines", module, &lines);
    char path[256];
    snprintf(path, sizeof path, "%s/dump/%s.c", tmpdir, module);
    char *dumped = read_all(path);
    const char *src = h ? strchr(h, '\n') + 1 : NULL;
    bool ok = TU_EXPECT(h && lines > 20) && TU_EXPECT(dumped != NULL) &&
              TU_EXPECT(strncmp(src, dumped, strlen(dumped)) == 0) &&
              TU_EXPECT(strstr(src + strlen(dumped), " IR ops -> ") != NULL) &&
              TU_EXPECT(strstr(dumped, "int sg_kernel(int k, char *const *slot"));
    int nl = 0;
    for (const char *q = dumped ? dumped : ""; *q; q++) nl += *q == '\n';
    ok = ok && TU_EXPECT(nl == lines);
    tu_case(ok,
            "OUTPUT_CODE(x=f32[4,8], the whole unit, one log call per line, = SG_DUMP_DIR file)");

    /* DOT: the kernels of sg_fn_explain, named as in the source. */
    snprintf(path, sizeof path, "%s/step.dot", tmpdir);
    bool svg = true;
    sg_status s = sg_fn_write_dot(fn, path, &svg);
    char *dot = read_all(path);
    int K = explain_int(fn, "kernels: ");
    ok = TU_EXPECT(s == SG_OK) && TU_EXPECT(svg == dot_on_path()) &&
         TU_EXPECT(dot && parse_dot(dot)) && TU_EXPECT(K >= 2);
    int nk = 0;
    for (int i = 0; i < nnodes; i++) nk += nodes[i].id[0] == 'k' && !strcmp(nodes[i].shape, "box");
    ok = ok && TU_EXPECT(nk == K);
    for (int k = 0; ok && k < K; k++) {
        /* sg_k<k>_<ops>_f32, defined as sg_k<k>_[pro_]<ops>_f32_<shape>_<hash> */
        char name[160], pre[32], def[200], pro[200];
        ok = TU_EXPECT(kernel_label_name(k, name, sizeof name));
        snprintf(pre, sizeof pre, "sg_k%d_", k);
        snprintf(def, sizeof def, "static void %s_", name);
        snprintf(pro, sizeof pro, "static void sg_k%d_pro_%s_", k, name + strlen(pre));
        ok =
            ok && TU_EXPECT(strncmp(name, pre, strlen(pre)) == 0) &&
            TU_EXPECT(strlen(name) > strlen(pre) + 4 && !strcmp(name + strlen(name) - 4, "_f32")) &&
            TU_EXPECT(strstr(dumped, def) != NULL || strstr(dumped, pro) != NULL);
    }
    const dnode *in0 = find_node("in0"), *o0 = find_node("out0"), *o1 = find_node("out1");
    const dedge *e0 = NULL, *e1 = NULL;
    int np = 0;
    for (int i = 0; i < nnodes; i++)
        if (!strcmp(nodes[i].shape, "cylinder"))
            np++, ok = ok && TU_EXPECT(strstr(nodes[i].label, "128 bytes"));
    ok = ok && TU_EXPECT(in0 && !strcmp(in0->shape, "invhouse")) &&
         TU_EXPECT(strstr(in0->label, "f32[4") != NULL) && TU_EXPECT(np == 1) &&
         TU_EXPECT(o0 && !strcmp(o0->shape, "house")) &&
         TU_EXPECT(o1 && !strcmp(o1->shape, "house")) && TU_EXPECT(edges_into("out0", &e0) == 1) &&
         TU_EXPECT(edges_into("out1", &e1) == 1) &&
         TU_EXPECT(e0->from[0] == 'k' && e1->from[0] == 'k') &&
         TU_EXPECT(strstr(e0->label, "f32[4]") && strstr(e0->label, "output set +")) &&
         TU_EXPECT(strstr(e1->label, "f32[4") && strstr(e1->label, "output set +")) &&
         TU_EXPECT(has_edge("in0", "k")) && TU_EXPECT(has_edge("p", "k"));
    /* Every kernel but the first is fed by another kernel or by the inputs. */
    for (int k = 0; ok && k < K; k++) {
        char id[32];
        const dedge *last = NULL;
        snprintf(id, sizeof id, "k%d", k);
        ok = TU_EXPECT(edges_into(id, &last) >= 1);
    }
    tu_case(ok, "DOT(x=f32[4,8], w=param, %d kernels, in0/p/out0/out1, svg=%d as dot on PATH)", K,
            (int)svg);
    free(dot);
    free(dumped);
    (void)ctx;
}

/* A stand-in `dot` on PATH: writes "<svg>" and the DOT text, or fails. */
static void case_svg(sg_ctx *ctx, sg_fn *fn) {
    char bin[128], script[160], path[256], svgpath[300];
    snprintf(bin, sizeof bin, "%s/bin", tmpdir);
    mkdir(bin, 0700);
    snprintf(script, sizeof script, "%s/dot", bin);
    const char *old = getenv("PATH");
    char *saved = old ? strdup(old) : NULL;
    char newpath[8192];
    snprintf(newpath, sizeof newpath, "%s:%s", bin, old ? old : "");
    setenv("PATH", newpath, 1);
    snprintf(path, sizeof path, "%s/svg.dot", tmpdir);
    snprintf(svgpath, sizeof svgpath, "%s.svg", path);
    for (int fail = 0; fail < 2; fail++) {
        FILE *f = fopen(script, "w");
        fprintf(f, fail ? "#!/bin/sh\nexit 3\n"
                        : "#!/bin/sh\n[ \"$1\" = -Tsvg ] && [ \"$2\" = -o ] || exit 2\n"
                          "{ echo '<svg>'; cat \"$4\"; } > \"$3\"\n");
        fclose(f);
        chmod(script, 0700);
        unlink(svgpath);
        bool svg = false;
        sg_status s = sg_fn_write_dot(fn, path, &svg);
        char *out = read_all(svgpath), *dot = read_all(path);
        bool ok = fail ? TU_EXPECT(s == SG_ERR_COMPILE) && TU_EXPECT(!svg) &&
                             TU_EXPECT(strstr(sg_last_error(ctx), "dot -Tsvg") != NULL)
                       : TU_EXPECT(s == SG_OK) && TU_EXPECT(svg) && TU_EXPECT(out && dot) &&
                             TU_EXPECT(strncmp(out, "<svg>\n", 6) == 0) &&
                             TU_EXPECT(strcmp(out + 6, dot) == 0);
        tu_case(ok, "DOT_SVG(dot on PATH %s)",
                fail ? "exits 3: SG_ERR_COMPILE" : "-Tsvg -o <path>.svg <path>");
        free(out);
        free(dot);
    }
    if (saved) setenv("PATH", saved, 1);
    free(saved);
}

/* Three traced calls: 3 x K events named as the kernels, results right. */
static void case_trace(sg_ctx *ctx, sg_fn *fn, sg_tensor *x, const double *xv, const double *wv,
                       bool fused, const char *what) {
    char path[256];
    snprintf(path, sizeof path, "%s/trace_%s.json", tmpdir, what);
    sg_status s = sg_fn_trace(fn, &x, 1, path, 3);
    char *text = read_all(path);
    int K = fused ? explain_int(fn, "kernels: ") : explain_int(fn, "capture 1: ");
    static tev ev[512];
    int n = text ? trace_events(text, ev, 512) : -1;
    bool ok = TU_EXPECT(s == SG_OK) && TU_EXPECT(text && json_valid(text)) && TU_EXPECT(K >= 2) &&
              TU_EXPECT(n == 3 * K);
    for (int i = 0; ok && i < n; i++) {
        char want[160], pre[32];
        int k = i % K;
        snprintf(pre, sizeof pre, fused ? "sg_k%d_" : "sg_op%d_", k);
        if (fused) kernel_label_name(k, want, sizeof want);
        ok = TU_EXPECT(!strcmp(ev[i].ph, "X")) && TU_EXPECT(ev[i].dur >= 0) &&
             TU_EXPECT(ev[i].ts >= 0) && TU_EXPECT(ev[i].has_pid && ev[i].has_tid) &&
             TU_EXPECT((int)ev[i].kernel == k) && TU_EXPECT((int)ev[i].replay == i / K) &&
             TU_EXPECT(strncmp(ev[i].name, pre, strlen(pre)) == 0) &&
             TU_EXPECT(!fused || strcmp(ev[i].name, want) == 0) &&
             TU_EXPECT(i == 0 || ev[i].ts >= ev[i - 1].ts + ev[i - 1].dur - 1e-3);
    }
    sg_tensor *out[2];
    ok = ok && TU_EXPECT(sg_call(fn, &x, 1, out, 2) == SG_OK) && check_results(out, xv, wv);
    tu_case(ok, "TRACE(%s, x=f32[4,8], replays=3, %d kernels: %d events, valid JSON)", what, K, n);
    free(text);
    (void)ctx;
}

static void case_backends(void) {
    sg_backend_info b[4];
    int n = 0;
    sg_status s = sg_list_backends(b, 4, &n);
    bool ok = TU_EXPECT(s == SG_OK) && TU_EXPECT(n == 4);
    for (int i = 0; ok && i < 4; i++) {
        sg_ctx *c = NULL;
        sg_ctx_opts o = {.backend = b[i].backend};
        sg_status cs = sg_ctx_create(&o, &c);
        sg_ctx_destroy(c);
        ok = TU_EXPECT(!strcmp(b[i].name, sg_backend_name(b[i].backend))) &&
             TU_EXPECT(b[i].available == (cs == SG_OK)) &&
             TU_EXPECT(b[i].available == (b[i].why[0] == '\0')) &&
             TU_EXPECT(!b[i].available || b[i].built);
        printf("  %s: built=%d available=%d %s\n", b[i].name, b[i].built, b[i].available, b[i].why);
    }
    ok = ok && TU_EXPECT(b[0].backend == SG_BACKEND_CUDA && b[3].backend == SG_BACKEND_CPU) &&
         TU_EXPECT(b[3].available) && TU_EXPECT(b[1].built || strstr(b[1].why, "built without")) &&
         TU_EXPECT(b[2].built ? b[2].available || strstr(b[2].why, "Level Zero") != NULL
                              : strstr(b[2].why, "without the Level Zero headers") != NULL);
    int m = -1;
    ok = ok && TU_EXPECT(sg_list_backends(NULL, 0, &m) == SG_OK && m == 4) &&
         TU_EXPECT(sg_list_backends(b, 2, &m) == SG_OK && m == 4) &&
         TU_EXPECT(sg_list_backends(b, 4, NULL) == SG_ERR_NULL);
    tu_case(ok, "LIST_BACKENDS(cuda, hip, ze, cpu: availability = sg_ctx_create's)");
}

/* Remove dir and the files in it and in its subdirectories (one level). */
static void remove_tree(const char *dir, int depth) {
    DIR *d = opendir(dir);
    struct dirent *e;
    char p[512];
    while (d && (e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (snprintf(p, sizeof p, "%s/%s", dir, e->d_name) >= (int)sizeof p) continue;
        if (unlink(p) != 0 && depth > 0) remove_tree(p, depth - 1);
    }
    if (d) closedir(d);
    rmdir(dir);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/sg_inspect_XXXXXX");
    if (!mkdtemp(tmpdir)) return 1;
    char dump[128];
    snprintf(dump, sizeof dump, "%s/dump", tmpdir);
    setenv("SG_DUMP_DIR", dump, 1);
    setenv("SG_ALWAYS_COMPILE", "1", 1);
    sg_ctx *ctx = NULL;
    sg_ctx_opts o = {.backend = SG_BACKEND_CPU, .log = log_hook};
    if (sg_ctx_create(&o, &ctx) != SG_OK) return 1;
    tu_seed(11);
    int64_t shape[2] = {R, C};
    double *xv = NULL, *wv = NULL;
    sg_tensor *x = tu_rand(ctx, SG_F32, 2, shape, -2, 2, &xv);
    w = tu_rand(ctx, SG_F32, 2, shape, -1.5, 1.5, &wv);

    sg_fn *fn = NULL;
    sg_tensor *out[2];
    bool ok =
        sg_compile(ctx, step, NULL, 1, 2, &(sg_compile_opts){.name = "inspect"}, &fn) == SG_OK &&
        sg_call(fn, &x, 1, out, 2) == SG_OK && check_results(out, xv, wv) &&
        strstr(sg_fn_explain(fn), "kernels: ");
    tu_case(ok, "COMPILE(x=f32[4,8], tanh(sin(x)*w), sum+1) seed=11");
    if (ok) {
        case_output_code_and_dot(ctx, fn);
        case_svg(ctx, fn);
        case_trace(ctx, fn, x, xv, wv, true, "fused");
    }

    /* Op by op (SG_CODEGEN=0): one event per IR op per replay. */
    setenv("SG_CODEGEN", "0", 1);
    sg_fn *fn2 = NULL;
    ok = sg_compile(ctx, step, NULL, 1, 2, &(sg_compile_opts){.name = "unfused"}, &fn2) == SG_OK &&
         sg_call(fn2, &x, 1, out, 2) == SG_OK;
    unsetenv("SG_CODEGEN");
    if (TU_EXPECT(ok)) case_trace(ctx, fn2, x, xv, wv, false, "op_by_op");

    /* Errors: no capture yet, bad replays. */
    sg_fn *fn3 = NULL;
    sg_compile(ctx, step, NULL, 1, 2, NULL, &fn3);
    bool svg = true;
    ok = TU_EXPECT(sg_fn_write_dot(fn3, "/tmp/x.dot", &svg) == SG_ERR_INVALID_ARG) &&
         TU_EXPECT(!svg) && TU_EXPECT(strstr(sg_last_error(ctx), "no capture yet")) &&
         TU_EXPECT(sg_fn_trace(fn, &x, 1, "/tmp/x.json", 0) == SG_ERR_INVALID_ARG) &&
         TU_EXPECT(sg_fn_write_dot(NULL, "/tmp/x.dot", NULL) == SG_ERR_NULL);
    tu_case(ok, "INSPECT_ERRORS(no capture, replays=0, NULL fn)");

    case_backends();
    sg_fn_destroy(fn);
    sg_fn_destroy(fn2);
    sg_fn_destroy(fn3);
    sg_release(x);
    sg_release(w);
    sg_ctx_destroy(ctx);
    free(xv);
    free(wv);
    free(code);
    remove_tree(tmpdir, 1);
    return tu_finish();
}
