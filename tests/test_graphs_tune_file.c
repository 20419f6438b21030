/* SPDX-License-Identifier: MIT */
/*
 * test_graphs_tune_file.c -- max-autotune's tune file on CUDA, which needs
 * no device: block-size lines and cuBLASLt algorithm picks
 * (graphs/cuda/cublaslt.c: sg__lt_pick_format, sg__lt_pick_parse) written
 * as a checksummed note (sg__note_write), read back (sg__note_read) and
 * parsed (graphs/cuda/cuda_graph.c: sg__tune_parse) give back every pick
 * exactly, on random keys and picks (GEMV included); a corrupted pick line
 * (a pick out of range, a key word missing or not a number, trailing text,
 * an impossible alignment, a transpose flag of 2) or a body changed on disk
 * makes the whole file unusable, so that the step is tuned again and no
 * remembered pick applies; a line that does not fit its buffer is refused;
 * the line remembering the whole-step check ("-1 0") parses beside them.
 * (That the picks are timed and applied needs a device: test_cuda_* and the
 * benchmark runs.)
 */
#define _POSIX_C_SOURCE 200809L /* mkdtemp, strtok_r */
#include "codegen/codegen.h"
#include "graphs/cuda/cublaslt.h"
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A key as cublaslt.c makes one: dtype, transposes, m n k, leading dims,
 * batch and its strides, bias and accumulate flags, four alignments, TF32. */
static void rand_pick(sg__lt_pick *p) {
    int64_t *k = p->key;
    k[0] = tu_randint(0, 2); /* dtype */
    k[1] = tu_randint(0, 1), k[2] = tu_randint(0, 1);
    for (int i = 3; i < 6; i++) k[i] = tu_randint(1, 8192); /* m n k */
    k[6] = k[3] + tu_randint(0, 8), k[7] = k[5] + tu_randint(0, 8), k[8] = k[3];
    k[9] = tu_randint(1, 64); /* batch, then its strides */
    k[10] = k[9] > 1 ? k[3] * k[5] : 0, k[11] = k[9] > 1 ? k[5] * k[4] : 0;
    k[12] = k[9] > 1 ? k[3] * k[4] : 0;
    k[13] = tu_randint(0, 1), k[14] = tu_randint(0, 1);
    for (int i = 15; i < 18; i++) k[i] = (int64_t)1 << tu_randint(0, 8);
    k[18] = k[13] ? (int64_t)1 << tu_randint(0, 8) : 0;
    k[19] = tu_randint(0, 1);
    p->pick = (int)tu_randint(SG__LT_GEMV, SG__LT_NALGO - 1);
}

static bool same_pick(const sg__lt_pick *a, const sg__lt_pick *b) {
    return memcmp(a->key, b->key, sizeof a->key) == 0 && a->pick == b->pick;
}

/* nb block lines then np picks, as tune_save writes them. */
static size_t body_of(char *buf, size_t size, const sg__tune_block *b, int nb, const sg__lt_pick *p,
                      int np) {
    size_t n = 0;
    for (int i = 0; i < nb; i++)
        n += (size_t)snprintf(buf + n, size - n, "%d %d\n", b[i].group, b[i].threads);
    for (int i = 0; i < np; i++) {
        int w = sg__lt_pick_format(&p[i], buf + n, size - n);
        if (w < 0) return 0;
        n += (size_t)w;
    }
    return n;
}

static void round_trip(const char *path, uint64_t seed) {
    tu_seed(seed);
    sg__tune_block b[8], gb[16];
    sg__lt_pick p[16], gp[16];
    int nb = (int)tu_randint(0, 8), np = (int)tu_randint(1, 16);
    for (int i = 0; i < nb; i++)
        b[i] = (sg__tune_block){(int)tu_randint(0, 300), 128 << tu_randint(0, 2)};
    for (int i = 0; i < np; i++) rand_pick(&p[i]);
    char body[4096], back[4096];
    bool ok = TU_EXPECT(body_of(body, sizeof body, b, nb, p, np) > 0);
    ok = ok && TU_EXPECT(sg__note_write(path, body));
    ok = ok && TU_EXPECT(sg__note_read(path, back, sizeof back)) &&
         TU_EXPECT(strcmp(back, body) == 0);
    int gnb = -1, gnp = -1;
    ok = ok && TU_EXPECT(sg__tune_parse(back, gb, 16, &gnb, gp, 16, &gnp));
    ok = ok && TU_EXPECT(gnb == nb) && TU_EXPECT(gnp == np);
    for (int i = 0; ok && i < nb; i++)
        ok = TU_EXPECT(gb[i].group == b[i].group && gb[i].threads == b[i].threads);
    for (int i = 0; ok && i < np; i++) ok = TU_EXPECT(same_pick(&gp[i], &p[i]));
    tu_case(ok, "tune_file round_trip(blocks=%d,picks=%d) seed=%llu", nb, np,
            (unsigned long long)seed);
}

/* A file whose body is good but for one pick line, made bad by replacing
 * word `word` (0: "lt", 1..20: the key, 21: the pick) with `with`
 * (NULL: dropped) or by appending `tail`. */
static void corrupt(const char *path, const char *name, int word, const char *with,
                    const char *tail) {
    tu_seed(99);
    sg__tune_block b[1] = {{3, 256}};
    sg__lt_pick p[3];
    for (int i = 0; i < 3; i++) rand_pick(&p[i]);
    p[1].pick = 2;
    char line[512], bad[600] = "";
    bool ok = TU_EXPECT(sg__lt_pick_format(&p[1], line, sizeof line) > 0);
    line[strcspn(line, "\n")] = '\0';
    size_t n = 0;
    char *save = NULL;
    int w = 0;
    for (char *t = strtok_r(line, " ", &save); t; t = strtok_r(NULL, " ", &save), w++) {
        const char *put = w == word ? with : t;
        if (put) n += (size_t)snprintf(bad + n, sizeof bad - n, "%s%s", n ? " " : "", put);
    }
    n += (size_t)snprintf(bad + n, sizeof bad - n, "%s\n", tail ? tail : "");
    char body[4096], back[4096];
    size_t m = body_of(body, sizeof body, b, 1, p, 1);
    m += (size_t)snprintf(body + m, sizeof body - m, "%s", bad);
    int w2 = sg__lt_pick_format(&p[2], body + m, sizeof body - m);
    ok = ok && TU_EXPECT(w2 > 0);
    ok = ok && TU_EXPECT(sg__note_write(path, body)) &&
         TU_EXPECT(sg__note_read(path, back, sizeof back));
    sg__tune_block gb[4];
    sg__lt_pick gp[4];
    int gnb = -1, gnp = -1;
    ok = ok && TU_EXPECT(!sg__tune_parse(back, gb, 4, &gnb, gp, 4, &gnp)) &&
         TU_EXPECT(gnb == 0 && gnp == 0);
    /* The same line uncorrupted parses: the failure was the corruption's. */
    sg__lt_pick one;
    int used = 0;
    char good[512];
    ok = ok && TU_EXPECT(sg__lt_pick_format(&p[1], good, sizeof good) > 0) &&
         TU_EXPECT(sg__lt_pick_parse(good, &one, &used)) && TU_EXPECT(same_pick(&one, &p[1]));
    tu_case(ok, "tune_file corrupt_pick(%s) seed=99", name);
}

int main(void) {
    char dir[] = "/tmp/sg-tune-file-XXXXXX", path[64];
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    snprintf(path, sizeof path, "%s/cu-tune-test.txt", dir);
    for (uint64_t seed = 1; seed <= 20; seed++) round_trip(path, seed);

    char past[16]; /* the first pick past the candidate list */
    snprintf(past, sizeof past, "%d", SG__LT_NALGO);
    corrupt(path, "pick=SG__LT_NALGO", 21, past, NULL);
    corrupt(path, "pick=-2", 21, "-2", NULL);
    corrupt(path, "pick=x", 21, "x", NULL);
    corrupt(path, "pick_missing", 21, NULL, NULL);
    corrupt(path, "key_word_missing", 7, NULL, NULL);
    corrupt(path, "key_word_not_a_number", 5, "12a", NULL);
    corrupt(path, "trailing_text", -1, NULL, " 7");
    corrupt(path, "alignment=3", 16, "3", NULL);
    corrupt(path, "transa=2", 2, "2", NULL);
    corrupt(path, "m=0", 4, "0", NULL);
    corrupt(path, "prefix=lx", 0, "lx", NULL);

    /* The line that remembers how the whole-step check ended ("-1 0": the
     * defaults stay) parses beside the picks, as group -1. */
    {
        tu_seed(7);
        sg__lt_pick p;
        rand_pick(&p);
        char body[1024], back[4096];
        int n = snprintf(body, sizeof body, "3 512\n");
        int w = sg__lt_pick_format(&p, body + n, sizeof body - (size_t)n);
        bool ok = TU_EXPECT(w > 0);
        snprintf(body + n + (w > 0 ? w : 0), sizeof body - (size_t)n - (size_t)(w > 0 ? w : 0),
                 "-1 0\n");
        sg__tune_block gb[4];
        sg__lt_pick gp[4];
        int gnb = -1, gnp = -1;
        ok = ok && TU_EXPECT(sg__note_write(path, body)) &&
             TU_EXPECT(sg__note_read(path, back, sizeof back)) &&
             TU_EXPECT(sg__tune_parse(back, gb, 4, &gnb, gp, 4, &gnp)) &&
             TU_EXPECT(gnb == 2 && gnp == 1) &&
             TU_EXPECT(gb[0].group == 3 && gb[0].threads == 512) &&
             TU_EXPECT(gb[1].group == -1 && gb[1].threads == 0) && TU_EXPECT(same_pick(&gp[0], &p));
        tu_case(ok, "tune_file check_line(\"-1 0\" beside a block line and a pick) seed=7");
    }
    /* A body changed on disk after its checksum: not read at all. */
    {
        tu_seed(5);
        sg__lt_pick p;
        rand_pick(&p);
        char body[512], back[4096];
        bool ok = TU_EXPECT(sg__lt_pick_format(&p, body, sizeof body) > 0) &&
                  TU_EXPECT(sg__note_write(path, body));
        FILE *f = ok ? fopen(path, "r+b") : NULL;
        ok = ok && TU_EXPECT(f != NULL);
        if (f) { /* one digit of the body, past the 72-byte checksum line */
            fseek(f, 72 + 3, SEEK_SET);
            int c = fgetc(f);
            fseek(f, 72 + 3, SEEK_SET);
            fputc(c == '1' ? '2' : '1', f);
            fclose(f);
        }
        ok = ok && TU_EXPECT(!sg__note_read(path, back, sizeof back));
        tu_case(ok, "tune_file corrupt_checksum seed=5");
    }
    /* A line that does not fit is refused, not cut. */
    {
        tu_seed(6);
        sg__lt_pick p;
        rand_pick(&p);
        char full[512], small[40];
        int n = sg__lt_pick_format(&p, full, sizeof full);
        bool ok = TU_EXPECT(n > (int)sizeof small) &&
                  TU_EXPECT(sg__lt_pick_format(&p, small, sizeof small) == -1) &&
                  TU_EXPECT(sg__lt_pick_format(&p, full, (size_t)n) == -1) &&
                  TU_EXPECT(sg__lt_pick_format(&p, full, (size_t)n + 1) == n);
        tu_case(ok, "tune_file pick_too_long seed=6");
    }
    unlink(path);
    rmdir(dir);
    return tu_finish();
}
