/* SPDX-License-Identifier: MIT */
/*
 * lanes.c -- a recorded step as a graph with branches. A replay's groups
 * run in capture order on one stream unless a device backend records them
 * on several (lanes): then a group waits only for the groups it must, and
 * groups with nothing between them (a layer's weight and input gradients,
 * the head's bias sum beside its products) run at once.
 *
 * What a group must wait for is read from memory, not from the IR's edges:
 * each group says which byte ranges it reads and writes at this replay's
 * addresses (its nodes' refs, the pool's reuse of bytes included, since two
 * slots that share bytes share addresses), and a later group waits for an
 * earlier one when one writes what the other reads or writes. Things that
 * are not memory but still must not be used by two groups at once (a
 * library's scratch, a kernel's own static counters) are given as ranges
 * too, outside any device address (sg__lane_resource).
 *
 * The plan is greedy, in capture order: a group goes on the lane of the
 * latest group it waits for when that group is still the lane's last (so
 * the pair keeps its programmatic launch), else on a lane whose last group
 * it follows anyway (waits for, or what it waits for does, through the
 * clocks below: a backward's weight gradient and bias sum, placed after
 * the input gradient's producer, leave that lane to the input gradient),
 * else on an empty lane, else on the lane whose last group came first,
 * before that latest group (likely done by then), else on that latest
 * group's lane.
 *
 * With classes (nhigh: the CUDA executor's lanes by stream priority), a
 * group goes only on lanes [0, nhigh) when it is urgent -- a group within
 * the next LANES_NEAR waits for it, or the step ends as soon -- and only on
 * the others when not (a weight gradient or bias sum that only the
 * optimizer reads), so that the critical chain keeps its lanes and the
 * rest fills idle SMs.
 *
 * Each lane keeps a vector clock -- the last group of every lane its work
 * is known to follow -- so that a wait already implied by an earlier one is
 * not made again: a group waits at most once per other lane. The search for
 * what a group waits for stops once every lane has its latest conflict or
 * no group left below: a chain costs a step a group.
 */
#include "graphs.h"

#include <stdlib.h>

static int span_cmp(const void *a, const void *b) {
    const sg__span *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo ? 1 : 0;
}

/* Sort and merge n spans in place (empty ones dropped); the count left. */
static int normalize(sg__span *s, int n) {
    int m = 0;
    for (int i = 0; i < n; i++)
        if (s[i].hi > s[i].lo) s[m++] = s[i];
    if (m == 0) return 0;
    qsort(s, (size_t)m, sizeof *s, span_cmp);
    int k = 0;
    for (int i = 1; i < m; i++) {
        if (s[i].lo <= s[k].hi) {
            if (s[i].hi > s[k].hi) s[k].hi = s[i].hi;
        } else {
            s[++k] = s[i];
        }
    }
    return k + 1;
}

/* Whether two sorted, merged lists share a byte. */
static bool overlap(const sg__span *a, int na, const sg__span *b, int nb) {
    int i = 0, j = 0;
    while (i < na && j < nb) {
        if (a[i].hi <= b[j].lo)
            i++;
        else if (b[j].hi <= a[i].lo)
            j++;
        else
            return true;
    }
    return false;
}

typedef struct uses {
    sg__span *rd, *wr;
    int nrd, nwr;
} uses;

static bool conflict(const uses *j, const uses *k) {
    return overlap(j->wr, j->nwr, k->rd, k->nrd) || overlap(j->wr, j->nwr, k->wr, k->nwr) ||
           overlap(j->rd, j->nrd, k->wr, k->nwr);
}

void sg__lanes_free(sg_ctx *ctx, sg__lanes *p) {
    int n = p->ngroups ? p->ngroups : 1;
    sg__free(ctx, p->lane, sizeof *p->lane * (size_t)n);
    sg__free(ctx, p->wait, sizeof *p->wait * (size_t)n * SG__LANES_MAX);
    sg__free(ctx, p->post, sizeof *p->post * (size_t)n);
    memset(p, 0, sizeof *p);
}

/* Groups this close after a group that must wait for it make it urgent
 * (sg__lanes.nhigh). */
#define LANES_NEAR 3

sg_status sg__lanes_plan(sg_ctx *ctx, int n, const sg__lane_use *use, int nlanes, int nhigh,
                         sg__lanes *out) {
    memset(out, 0, sizeof *out);
    if (nlanes < 1) nlanes = 1;
    if (nlanes > SG__LANES_MAX) nlanes = SG__LANES_MAX;
    if (nhigh <= 0 || nhigh >= nlanes) nhigh = 0;
    out->nhigh = nhigh;
    size_t nn = (size_t)(n ? n : 1), nspans = 0;
    for (int k = 0; k < n; k++) nspans += (size_t)use[k].nrd + (size_t)use[k].nwr;
    out->ngroups = n;
    out->lane = sg__calloc(ctx, sizeof *out->lane * nn);
    out->wait = sg__calloc(ctx, sizeof *out->wait * nn * SG__LANES_MAX);
    out->post = sg__calloc(ctx, sizeof *out->post * nn);
    uses *u = sg__calloc(ctx, sizeof *u * nn);
    sg__span *all = sg__calloc(ctx, sizeof *all * (nspans ? nspans : 1));
    int *after = sg__calloc(ctx, sizeof *after * nn * SG__LANES_MAX); /* clocks after each */
    if (!out->lane || !out->wait || !out->post || !u || !all || !after) {
        sg__lanes_free(ctx, out);
        sg__free(ctx, u, sizeof *u * nn);
        sg__free(ctx, all, sizeof *all * (nspans ? nspans : 1));
        sg__free(ctx, after, sizeof *after * nn * SG__LANES_MAX);
        return sg__fail(ctx, SG_ERR_OOM, "out of host memory planning a graph's branches");
    }
    sg__span *at = all;
    for (int k = 0; k < n; k++) {
        memcpy(at, use[k].rd, sizeof *at * (size_t)use[k].nrd);
        u[k].rd = at, u[k].nrd = normalize(at, use[k].nrd), at += use[k].nrd;
        memcpy(at, use[k].wr, sizeof *at * (size_t)use[k].nwr);
        u[k].wr = at, u[k].nwr = normalize(at, use[k].nwr), at += use[k].nwr;
    }
    int tail[SG__LANES_MAX], first[SG__LANES_MAX], clock[SG__LANES_MAX][SG__LANES_MAX];
    for (int l = 0; l < SG__LANES_MAX; l++) {
        tail[l] = first[l] = -1;
        for (int m = 0; m < SG__LANES_MAX; m++) clock[l][m] = -1;
    }
    for (int k = 0; k < n; k++) {
        /* With classes, the lanes it may take: [lo, hi). Urgent: a group
         * within the next LANES_NEAR waits for it, or it is that close to
         * the step's end (which waits for it). The search goes no further,
         * so a plan costs at most LANES_NEAR checks a group. */
        bool urgent = use[k].lane0 || !nhigh || k + LANES_NEAR >= n - 1;
        for (int j = k + 1; !urgent && j <= k + LANES_NEAR; j++) urgent = conflict(&u[k], &u[j]);
        int lo = urgent ? 0 : nhigh, hi = urgent && nhigh ? nhigh : nlanes;
        int need[SG__LANES_MAX], latest = -1;
        for (int l = 0; l < SG__LANES_MAX; l++) need[l] = -1;
        for (int j = k - 1; j >= 0; j--) {
            bool open = false; /* a lane whose latest conflict may still lie at or below j */
            for (int l = 0; l < nlanes && !open; l++)
                open = need[l] < 0 && tail[l] >= 0 && j >= first[l];
            if (!open) break;
            int m = out->lane[j];
            if (j <= need[m] || !conflict(&u[j], &u[k])) continue;
            need[m] = j;
            if (j > latest) latest = j;
        }
        /* The lane of the latest group it waits for, when its class may take it. */
        bool latest_ok = latest >= 0 && out->lane[latest] >= lo && out->lane[latest] < hi;
        int L = -1;
        if (use[k].lane0) {
            L = 0;
        } else if (latest_ok && tail[out->lane[latest]] == latest) {
            L = out->lane[latest]; /* right after what it waits for */
        } else {
            /* What the groups it waits for already follow, lane by lane. */
            int known[SG__LANES_MAX];
            for (int l = 0; l < SG__LANES_MAX; l++) known[l] = need[l];
            for (int m = 0; m < nlanes; m++)
                for (int q = 0; need[m] >= 0 && q < SG__LANES_MAX; q++) {
                    int c = after[(size_t)need[m] * SG__LANES_MAX + q];
                    if (c > known[q]) known[q] = c;
                }
            int best = -1; /* a lane whose last group it follows anyway */
            for (int l = lo; l < hi; l++)
                if (tail[l] >= 0 && known[l] >= tail[l] && tail[l] > best) best = tail[l], L = l;
            for (int l = lo; L < 0 && l < hi; l++)
                if (tail[l] < 0) L = l; /* an empty lane */
            /* A lane whose last group came before the latest it waits for
             * (likely done by then: the oldest such), not behind a group
             * that may run at the same time as that one. */
            if (L < 0) {
                int oldest = latest;
                for (int l = lo; l < hi; l++)
                    if (tail[l] >= 0 && tail[l] < oldest) oldest = tail[l], L = l;
            }
            if (L < 0) L = latest_ok ? out->lane[latest] : lo;
        }
        out->lane[k] = L;
        int *w = out->wait + (size_t)k * SG__LANES_MAX;
        for (int m = 0; m < SG__LANES_MAX; m++) w[m] = -1;
        for (int m = 0; m < nlanes; m++) {
            if (m == L || need[m] <= clock[L][m]) continue;
            w[m] = need[m];
            out->post[need[m]] = true;
            const int *c = after + (size_t)need[m] * SG__LANES_MAX;
            for (int q = 0; q < SG__LANES_MAX; q++)
                if (c[q] > clock[L][q]) clock[L][q] = c[q];
        }
        clock[L][L] = tail[L] = k;
        if (first[L] < 0) first[L] = k;
        memcpy(after + (size_t)k * SG__LANES_MAX, clock[L], sizeof clock[L]);
        if (L + 1 > out->nlanes) out->nlanes = L + 1;
    }
    sg__free(ctx, u, sizeof *u * nn);
    sg__free(ctx, all, sizeof *all * (nspans ? nspans : 1));
    sg__free(ctx, after, sizeof *after * nn * SG__LANES_MAX);
    return SG_OK;
}
