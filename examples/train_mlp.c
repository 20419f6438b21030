/* SPDX-License-Identifier: MIT */
/*
 * train_mlp.c -- trains an MNIST-shaped MLP (784 -> 1024 -> 1024 -> 10,
 * ReLU, cross-entropy) with stepgraph's autograd: the whole train step
 * (forward, sg_grad, the AdamW update) is one function compiled in
 * REDUCE_OVERHEAD mode, so after the first call every step replays as one
 * graph. Data: an IDX pair (MNIST's train-images-idx3-ubyte and
 * train-labels-idx1-ubyte) given on the command line, or synthetic inputs
 * labelled by a fixed random linear teacher (learnable, so the loss falls).
 * The mean loss is printed per epoch; at the end the parameters are saved
 * to a checkpoint (magic "SGCK", a count, then per tensor its dtype, ndim,
 * shape and bytes), loaded back into new tensors and checked to give the
 * same loss.
 *
 * usage: train_mlp [-e epochs] [-b batch] [-s steps-per-epoch] [-c ckpt]
 *                  [images.idx labels.idx]
 *        (defaults: 3 epochs, batch 64, one pass over the data per epoch,
 *         ckpt train_mlp.ckpt; synthetic data has 2048 samples)
 *
 * Exit status: 0 on success, 1 on a stepgraph or I/O failure (its message
 * is printed), 2 on bad usage.
 */
#include <stepgraph.h>

#include "args.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define IN 784
#define HID 1024
#define OUT 10
#define NPARAM 6
#define LR 1e-3

static sg_ctx *ctx;

static void die(const char *what) {
    fprintf(stderr, "train_mlp: %s failed: %s\n", what, ctx ? sg_last_error(ctx) : "");
    sg_ctx_destroy(ctx);
    exit(1);
}

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "train_mlp: out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

static uint64_t rng = 0x2545f4914f6cdd1dull;

static float uniform(float lo, float hi) {
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return lo + (hi - lo) * (float)((rng * 0x2545f4914f6cdd1dull) >> 40) / (float)(1 << 24);
}

/* ------------------------------------------------------------ data */

typedef struct dataset {
    int64_t n;
    float *x;   /* n x IN, in [0, 1] */
    int64_t *y; /* n labels in [0, OUT) */
} dataset;

static uint32_t be32(FILE *f) {
    unsigned char b[4] = {0};
    if (fread(b, 1, 4, f) != 4) return 0;
    return (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3];
}

/* An IDX pair: images (magic 0x803, n x 28 x 28 bytes) and labels (0x801). */
static bool load_idx(const char *images, const char *labels, dataset *d) {
    FILE *fi = fopen(images, "rb"), *fl = fopen(labels, "rb");
    bool ok = fi && fl && be32(fi) == 0x803 && be32(fl) == 0x801;
    uint32_t n = ok ? be32(fi) : 0, rows = ok ? be32(fi) : 0, cols = ok ? be32(fi) : 0;
    ok = ok && rows * cols == IN && be32(fl) == n && n > 0;
    if (ok) {
        d->n = n;
        d->x = xmalloc(sizeof(float) * n * IN);
        d->y = xmalloc(sizeof(int64_t) * n);
        unsigned char *px = xmalloc((size_t)n * IN), *lb = xmalloc(n);
        ok = fread(px, 1, (size_t)n * IN, fi) == (size_t)n * IN && fread(lb, 1, n, fl) == n;
        for (size_t i = 0; ok && i < (size_t)n * IN; i++) d->x[i] = px[i] / 255.0f;
        for (uint32_t i = 0; ok && i < n; i++) ok = lb[i] < OUT, d->y[i] = lb[i];
        free(px), free(lb);
    }
    if (fi) fclose(fi);
    if (fl) fclose(fl);
    if (!ok) free(d->x), free(d->y), d->x = NULL, d->y = NULL;
    return ok;
}

/* Random inputs labelled by argmax of a fixed random linear map. */
static void synthetic(int64_t n, dataset *d) {
    float *teacher = xmalloc(sizeof(float) * OUT * IN);
    for (int i = 0; i < OUT * IN; i++) teacher[i] = uniform(-1, 1);
    d->n = n;
    d->x = xmalloc(sizeof(float) * (size_t)n * IN);
    d->y = xmalloc(sizeof(int64_t) * (size_t)n);
    for (int64_t s = 0; s < n; s++) {
        float *x = d->x + s * IN, best = -INFINITY;
        for (int i = 0; i < IN; i++) x[i] = uniform(0, 1);
        for (int c = 0; c < OUT; c++) {
            float v = 0;
            for (int i = 0; i < IN; i++) v += teacher[c * IN + i] * (x[i] - 0.5f);
            if (v > best) best = v, d->y[s] = c;
        }
    }
    free(teacher);
}

/* ------------------------------------------------------------ the model */

typedef struct mlp {
    sg_tensor *p[NPARAM]; /* w1 (HID, IN), b1, w2 (HID, HID), b2, w3 (OUT, HID), b3 */
    sg_optim *opt;        /* AdamW over p; its state lives on the device */
} mlp;

static const int64_t shapes[NPARAM][2] = {{HID, IN}, {HID}, {HID, HID}, {HID}, {OUT, HID}, {OUT}};

static void init(mlp *m) {
    for (int k = 0; k < NPARAM; k++) {
        int nd = k % 2 ? 1 : 2;
        int64_t n = nd == 2 ? shapes[k][0] * shapes[k][1] : shapes[k][0];
        float bound = 1.0f / sqrtf((float)shapes[k & ~1][1]); /* nn.Linear's init */
        float *v = xmalloc(sizeof(float) * (size_t)n);
        for (int64_t i = 0; i < n; i++) v[i] = uniform(-bound, bound);
        m->p[k] = sg_from_host(ctx, SG_F32, nd, shapes[k], v);
        free(v);
        if (!m->p[k] || sg_requires_grad_(m->p[k], true) != SG_OK) die("making the parameters");
    }
}

static sg_tensor *loss_of(const mlp *m, sg_tensor *x, sg_tensor *y) {
    sg_tensor *h1 = sg_relu(sg_linear(x, m->p[0], m->p[1]));
    sg_tensor *h2 = sg_relu(sg_linear(h1, m->p[2], m->p[3]));
    return sg_cross_entropy(sg_linear(h2, m->p[4], m->p[5]), y);
}

/* One train step: in = {x (B, IN), y (B)}; out = {loss}. Everything it
 * makes vanishes with the step; the parameters are updated in place. */
static sg_status train_step(sg_ctx *c, sg_tensor *const *in, sg_tensor **out, void *user) {
    mlp *m = user;
    sg_tensor *g[NPARAM];
    out[0] = loss_of(m, in[0], in[1]);
    (void)c;
    sg_status s = sg_grad(out[0], NPARAM, m->p, g);
    /* The update, in place, inside the same graph; its learning rate and step
     * count are device tensors, so a schedule needs no recapture. */
    return s == SG_OK ? sg_optim_step(m->opt, g) : s;
}

/* ------------------------------------------------------------ checkpoints */

static bool save(const char *path, const mlp *m) {
    FILE *f = fopen(path, "wb");
    if (!f) return false;
    uint32_t count = NPARAM;
    bool ok = fwrite("SGCK", 1, 4, f) == 4 && fwrite(&count, 4, 1, f) == 1;
    for (int k = 0; ok && k < NPARAM; k++) {
        uint32_t dt = (uint32_t)sg_tensor_dtype(m->p[k]), nd = (uint32_t)sg_tensor_ndim(m->p[k]);
        int64_t shape[SG_MAX_DIMS];
        size_t nbytes = (size_t)sg_tensor_numel(m->p[k]) * sg_dtype_size((sg_dtype)dt);
        void *buf = xmalloc(nbytes);
        ok = sg_tensor_shape(m->p[k], shape) == SG_OK && sg_read(m->p[k], buf, nbytes) == SG_OK &&
             fwrite(&dt, 4, 1, f) == 1 && fwrite(&nd, 4, 1, f) == 1 &&
             fwrite(shape, sizeof(int64_t), nd, f) == nd && fwrite(buf, 1, nbytes, f) == nbytes;
        free(buf);
    }
    return fclose(f) == 0 && ok;
}

static bool load(const char *path, mlp *m) {
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    char magic[4];
    uint32_t count = 0;
    bool ok = fread(magic, 1, 4, f) == 4 && !memcmp(magic, "SGCK", 4) &&
              fread(&count, 4, 1, f) == 1 && count == NPARAM;
    for (int k = 0; k < NPARAM; k++) m->p[k] = NULL;
    for (int k = 0; ok && k < NPARAM; k++) {
        uint32_t dt, nd;
        int64_t shape[SG_MAX_DIMS] = {0};
        ok = fread(&dt, 4, 1, f) == 1 && fread(&nd, 4, 1, f) == 1 && nd <= SG_MAX_DIMS &&
             dt < SG_NUM_DTYPES && fread(shape, sizeof(int64_t), nd, f) == nd;
        if (!ok) break;
        size_t n = sg_dtype_size((sg_dtype)dt);
        for (uint32_t d = 0; d < nd; d++) n *= (size_t)shape[d];
        void *buf = xmalloc(n);
        ok = fread(buf, 1, n, f) == n;
        if (ok) m->p[k] = sg_from_host(ctx, (sg_dtype)dt, (int)nd, shape, buf);
        ok = ok && m->p[k];
        free(buf);
    }
    fclose(f);
    return ok;
}

/* ------------------------------------------------------------ main */

typedef struct options {
    int epochs;
    int64_t bsz, steps;
    const char *ckpt, *files[2];
    int nfiles;
} options;

static bool parse(int argc, char **argv, options *o) {
    *o = (options){.epochs = 3, .bsz = 64, .ckpt = "train_mlp.ckpt"};
    long long n = 0;
    for (int i = 1; i < argc; i++) {
        if (i + 1 < argc && !strcmp(argv[i], "-e")) {
            if (!arg_int(argv[++i], 1, 1 << 20, &n)) return false;
            o->epochs = (int)n;
        } else if (i + 1 < argc && !strcmp(argv[i], "-b")) {
            if (!arg_int(argv[++i], 1, 1 << 24, &n)) return false;
            o->bsz = n;
        } else if (i + 1 < argc && !strcmp(argv[i], "-s")) {
            if (!arg_int(argv[++i], 0, LLONG_MAX, &n)) return false;
            o->steps = n;
        } else if (i + 1 < argc && !strcmp(argv[i], "-c"))
            o->ckpt = argv[++i];
        else if (argv[i][0] != '-' && o->nfiles < 2)
            o->files[o->nfiles++] = argv[i];
        else
            return false;
    }
    return o->epochs >= 1 && o->bsz >= 1 && o->steps >= 0 && o->nfiles != 1;
}

/* Epochs of per_epoch steps over consecutive batches; the mean loss of each. */
static void train(sg_fn *fn, sg_tensor *x, sg_tensor *y, const dataset *d, int epochs,
                  int64_t per_epoch, int64_t bsz) {
    sg_tensor *in[2] = {x, y}, *out[1];
    for (int e = 0; e < epochs; e++) {
        double total = 0, loss;
        for (int64_t s = 0; s < per_epoch; s++) {
            int64_t first = (s * bsz) % (d->n - bsz + 1);
            if (sg_write(x, d->x + first * IN, sizeof(float) * (size_t)(bsz * IN)) != SG_OK ||
                sg_write(y, d->y + first, sizeof(int64_t) * (size_t)bsz) != SG_OK)
                die("sg_write");
            sg_mark_step_begin(ctx);
            if (sg_call(fn, in, 2, out, 1) != SG_OK || sg_item(out[0], &loss) != SG_OK)
                die("the train step");
            total += loss;
        }
        printf("epoch %d: mean loss %.5f\n", e + 1, total / (double)per_epoch);
    }
}

/* Save m, load it back, and compare the loss of both on the last batch. */
static bool checkpoint(const char *path, const mlp *m, sg_tensor *x, sg_tensor *y) {
    mlp back;
    double l0, l1;
    sg_set_grad_enabled(ctx, false);
    sg_tensor *a = loss_of(m, x, y);
    if (!save(path, m)) die("saving the checkpoint");
    if (!load(path, &back)) die("loading the checkpoint");
    sg_tensor *b = loss_of(&back, x, y);
    if (!a || !b || sg_item(a, &l0) != SG_OK || sg_item(b, &l1) != SG_OK) die("the reloaded loss");
    printf("checkpoint %s: %d tensors saved and reloaded, loss %.6f == %.6f\n", path, NPARAM, l0,
           l1);
    return l0 == l1 && isfinite(l0);
}

int main(int argc, char **argv) {
    options o;
    if (!parse(argc, argv, &o)) {
        fprintf(stderr, "usage: train_mlp [-e epochs] [-b batch] [-s steps-per-epoch] [-c ckpt] "
                        "[images.idx labels.idx]\n");
        return 2;
    }
    dataset data = {0};
    if (o.nfiles == 2 && !load_idx(o.files[0], o.files[1], &data)) {
        fprintf(stderr, "train_mlp: %s and %s are not an IDX image/label pair of 28x28\n",
                o.files[0], o.files[1]);
        return 1;
    }
    if (o.nfiles == 0) synthetic(2048, &data);
    int64_t bsz = o.bsz, per_epoch = data.n / bsz;
    if (o.steps > 0 && o.steps < per_epoch) per_epoch = o.steps;
    if (per_epoch < 1) {
        fprintf(stderr, "train_mlp: batch %lld is larger than the %lld samples\n", (long long)bsz,
                (long long)data.n);
        free(data.x), free(data.y);
        return 2;
    }
    if (sg_ctx_create(NULL, &ctx) != SG_OK) {
        fprintf(stderr, "train_mlp: sg_ctx_create failed: %s\n", sg_last_error(NULL));
        free(data.x), free(data.y);
        return 1;
    }
    mlp m;
    init(&m);
    if (sg_adamw_create(ctx, NPARAM, m.p, &(sg_adamw_opts){.lr = LR}, &m.opt) != SG_OK)
        die("making the optimizer");
    int64_t xs[2] = {bsz, IN};
    sg_tensor *x = sg_empty(ctx, SG_F32, 2, xs), *y = sg_empty(ctx, SG_I64, 1, &bsz);
    sg_fn *fn;
    if (!x || !y ||
        sg_compile(ctx, train_step, &m, 2, 1,
                   &(sg_compile_opts){.mode = SG_MODE_REDUCE_OVERHEAD, .name = "train_step"},
                   &fn) != SG_OK)
        die("compiling the train step");
    printf("train_mlp: %lld samples (%s), batch %lld, %lld steps per epoch, backend %s\n",
           (long long)data.n, o.nfiles ? "IDX" : "synthetic", (long long)bsz, (long long)per_epoch,
           sg_backend_name(sg_ctx_backend(ctx)));
    train(fn, x, y, &data, o.epochs, per_epoch, bsz);
    int rc = checkpoint(o.ckpt, &m, x, y) ? 0 : 1;
    sg_fn_destroy(fn);
    sg_optim_destroy(m.opt);
    sg_ctx_destroy(ctx); /* frees every tensor */
    free(data.x), free(data.y);
    return rc;
}
