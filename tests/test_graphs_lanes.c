/* SPDX-License-Identifier: MIT */
/*
 * test_graphs_lanes.c -- a replay's groups on several lanes (graphs/lanes.c:
 * sg__lanes_plan), which needs no device. On random groups of random byte
 * ranges (few addresses, so that many share bytes; resources as ranges
 * below SG__LANE_RESOURCES; some groups held to lane 0), for 1 to 4 lanes:
 * every pair of groups where one writes what the other reads or writes is
 * ordered by the plan -- the later one follows the earlier through its
 * lane's order and the waits, transitively (checked by a closure over the
 * plan's edges, against overlaps found here by brute force); every wait
 * names an earlier group on the lane it is filed under, whose end is
 * posted; one lane means no waits. And on known shapes: two groups that
 * read one result and write apart go on two lanes and the group that reads
 * both waits for the other; with every lane used, readers of one result
 * still go beside each other (onto lanes whose last groups the result
 * follows, or, none followed, that came before it, the oldest first); a
 * chain stays on one lane without waits; a
 * resource orders groups that share no memory. Out of host memory at any of
 * the plan's allocations: SG_ERR_OOM, its message, nothing leaked.
 */
#include "graphs/graphs.h"
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

#define MAXG 160
#define MAXS 6

typedef struct tgroup {
    sg__span rd[MAXS], wr[MAXS];
    int nrd, nwr;
    bool lane0;
} tgroup;

static bool spans_meet(const sg__span *a, int na, const sg__span *b, int nb) {
    for (int i = 0; i < na; i++)
        for (int j = 0; j < nb; j++)
            if (a[i].lo < b[j].hi && b[j].lo < a[i].hi && a[i].lo < a[i].hi && b[j].lo < b[j].hi)
                return true;
    return false;
}

static bool must_order(const tgroup *a, const tgroup *b) {
    return spans_meet(a->wr, a->nwr, b->rd, b->nrd) || spans_meet(a->wr, a->nwr, b->wr, b->nwr) ||
           spans_meet(a->rd, a->nrd, b->wr, b->nwr);
}

static sg__span rand_span(void) {
    if (tu_randint(0, 9) == 0) { /* a resource */
        uintptr_t r = (uintptr_t)tu_randint(1, 3);
        return (sg__span){r, r + 1};
    }
    uintptr_t lo = (uintptr_t)0x7f0000000000ull + (uintptr_t)tu_randint(0, 63) * 256;
    return (sg__span){lo, lo + (uintptr_t)tu_randint(0, 4) * 256}; /* may be empty */
}

/* Whether the plan orders every pair that must be, and its waits are well formed. */
static bool check_plan(const tgroup *tg, int n, int nlanes, const sg__lanes *p) {
    static unsigned char before[MAXG][MAXG]; /* before[k][j]: j ends before k starts */
    bool ok = TU_EXPECT(p->ngroups == n) && TU_EXPECT(p->nlanes >= 1 && p->nlanes <= nlanes);
    memset(before, 0, sizeof before);
    for (int k = 0; k < n && ok; k++) {
        int L = p->lane[k];
        ok = ok && TU_EXPECT(L >= 0 && L < nlanes) && TU_EXPECT(!tg[k].lane0 || L == 0);
        for (int j = k - 1; j >= 0; j--)
            if (p->lane[j] == L) { /* the lane's previous group, and all before it */
                before[k][j] = 1;
                for (int i = 0; i < j; i++) before[k][i] |= before[j][i];
                break;
            }
        for (int m = 0; m < SG__LANES_MAX && ok; m++) {
            int w = p->wait[(size_t)k * SG__LANES_MAX + m];
            if (w < 0) continue;
            ok = TU_EXPECT(w < k) && TU_EXPECT(p->lane[w] == m) && TU_EXPECT(m != L) &&
                 TU_EXPECT(p->post[w]) && TU_EXPECT(nlanes > 1);
            if (!ok) break;
            before[k][w] = 1;
            for (int i = 0; i < w; i++) before[k][i] |= before[w][i];
        }
    }
    for (int k = 0; k < n && ok; k++)
        for (int j = 0; j < k && ok; j++)
            if (must_order(&tg[j], &tg[k]) && !before[k][j]) {
                fprintf(stderr, "  groups %d (lane %d) and %d (lane %d) share bytes, unordered\n",
                        j, p->lane[j], k, p->lane[k]);
                ok = false;
            }
    return ok;
}

static bool plan_of(sg_ctx *ctx, const tgroup *tg, int n, int nlanes, int nhigh, sg__lanes *p) {
    sg__lane_use use[MAXG];
    for (int k = 0; k < n; k++)
        use[k] = (sg__lane_use){tg[k].rd, tg[k].wr, tg[k].nrd, tg[k].nwr, tg[k].lane0};
    return sg__lanes_plan(ctx, n, use, nlanes, nhigh, p) == SG_OK;
}

static void random_cases(sg_ctx *ctx) {
    static tgroup tg[MAXG];
    for (int c = 0; c < 60; c++) {
        uint64_t seed = 1000 + (uint64_t)c;
        tu_seed(seed);
        int n = (int)tu_randint(1, MAXG), nlanes = (int)tu_randint(1, SG__LANES_MAX);
        int nhigh = c % 2 ? (int)tu_randint(0, nlanes - 1) : 0; /* lanes by urgency */
        for (int k = 0; k < n; k++) {
            tg[k].nrd = (int)tu_randint(0, MAXS), tg[k].nwr = (int)tu_randint(0, 2);
            for (int i = 0; i < tg[k].nrd; i++) tg[k].rd[i] = rand_span();
            for (int i = 0; i < tg[k].nwr; i++) tg[k].wr[i] = rand_span();
            tg[k].lane0 = tu_randint(0, 15) == 0;
        }
        sg__lanes p;
        bool ok = TU_EXPECT(plan_of(ctx, tg, n, nlanes, nhigh, &p));
        if (ok) {
            ok = check_plan(tg, n, nlanes, &p);
            for (int k = 0; nlanes == 1 && k < n; k++) ok = ok && TU_EXPECT(p.lane[k] == 0);
            sg__lanes_free(ctx, &p);
        }
        tu_case(ok, "lanes_random(groups=%d,lanes=%d,urgent lanes=%d) seed=%llu", n, nlanes, nhigh,
                (unsigned long long)seed);
    }
}

#define A(i) ((uintptr_t)0x7f0000000000ull + (uintptr_t)(i)*4096)
#define SPAN(i) ((sg__span){A(i), A(i) + 4096})

/* x = f(); y = g(x); z = h(x); out = k(y, z): g and h at once, k after both. */
static void fork_join(sg_ctx *ctx) {
    tgroup tg[4];
    memset(tg, 0, sizeof tg);
    tg[0].wr[0] = SPAN(0), tg[0].nwr = 1;
    tg[1].rd[0] = SPAN(0), tg[1].nrd = 1, tg[1].wr[0] = SPAN(1), tg[1].nwr = 1;
    tg[2].rd[0] = SPAN(0), tg[2].nrd = 1, tg[2].wr[0] = SPAN(2), tg[2].nwr = 1;
    tg[3].rd[0] = SPAN(1), tg[3].rd[1] = SPAN(2), tg[3].nrd = 2;
    tg[3].wr[0] = SPAN(3), tg[3].nwr = 1;
    sg__lanes p;
    bool ok = TU_EXPECT(plan_of(ctx, tg, 4, 4, 0, &p));
    if (ok) {
        const int *w3 = p.wait + 3 * SG__LANES_MAX;
        ok = check_plan(tg, 4, 4, &p) && TU_EXPECT(p.nlanes == 2) &&
             TU_EXPECT(p.lane[1] == p.lane[0]) && TU_EXPECT(p.lane[2] != p.lane[1]) &&
             TU_EXPECT(p.lane[3] == p.lane[2]) && TU_EXPECT(w3[p.lane[1]] == 1) &&
             TU_EXPECT(p.post[1]) && TU_EXPECT(!p.post[3]);
        sg__lanes_free(ctx, &p);
    }
    tu_case(ok, "lanes_fork_join");
}

/* Four groups writing apart fill the four lanes; x = f(all four, or with
 * `one` the first only); then a backward's shape: b = sum(x) after x, and
 * w = g(x), d = h(x) writing apart. No lane is empty. With all four, every
 * lane's last group is one that x follows: w and d go beside b, not behind
 * it. With the first only, the other lanes' last groups are not ones x
 * follows, but they came before x: w and d go there, the oldest first. */
static void readers_after(sg_ctx *ctx, bool one) {
    tgroup tg[8];
    memset(tg, 0, sizeof tg);
    for (int k = 0; k < 4; k++) tg[k].wr[0] = SPAN(k), tg[k].nwr = 1;
    tg[4].nrd = one ? 1 : 4, tg[4].wr[0] = SPAN(4), tg[4].nwr = 1;
    for (int k = 0; k < tg[4].nrd; k++) tg[4].rd[k] = SPAN(k);
    for (int k = 5; k < 8; k++)
        tg[k].rd[0] = SPAN(4), tg[k].nrd = 1, tg[k].wr[0] = SPAN(k), tg[k].nwr = 1;
    sg__lanes p;
    bool ok = TU_EXPECT(plan_of(ctx, tg, 8, 4, 0, &p));
    if (ok) {
        ok = check_plan(tg, 8, 4, &p) && TU_EXPECT(p.nlanes == 4) &&
             TU_EXPECT(p.lane[5] == p.lane[4]) && TU_EXPECT(p.lane[6] != p.lane[5]) &&
             TU_EXPECT(p.lane[7] != p.lane[5]) && TU_EXPECT(p.lane[7] != p.lane[6]) &&
             TU_EXPECT(!one || (p.lane[4] == p.lane[0] && p.lane[6] == p.lane[1] &&
                                p.lane[7] == p.lane[2]));
        if (!ok)
            for (int k = 0; k < 8; k++) fprintf(stderr, "  group %d: lane %d\n", k, p.lane[k]);
        sg__lanes_free(ctx, &p);
    }
    tu_case(ok, "lanes_readers_after(%s: readers of one result beside each other)",
            one ? "every lane used, none followed: on the lanes whose last groups came first"
                : "every lane used, each followed");
}

/* Lanes by urgency (2 of 4 for groups that a group within the next three
 * waits for): x = f(); s = sum(x) and w = g(x), read only at the end; a
 * chain d, e, q, r from x; out = k(s, w, r). s and w go on lanes 2 and 3,
 * the chain after x on its lane, out on an urgent lane. */
static void urgency(sg_ctx *ctx) {
    tgroup tg[8];
    memset(tg, 0, sizeof tg);
    tg[0].wr[0] = SPAN(0), tg[0].nwr = 1;
    tg[1].rd[0] = SPAN(0), tg[1].nrd = 1, tg[1].wr[0] = SPAN(1), tg[1].nwr = 1;
    tg[2].rd[0] = SPAN(0), tg[2].nrd = 1, tg[2].wr[0] = SPAN(2), tg[2].nwr = 1;
    for (int k = 3; k < 7; k++)
        tg[k].rd[0] = SPAN(k == 3 ? 0 : k - 1), tg[k].nrd = 1, tg[k].wr[0] = SPAN(k), tg[k].nwr = 1;
    tg[7].rd[0] = SPAN(1), tg[7].rd[1] = SPAN(2), tg[7].rd[2] = SPAN(6), tg[7].nrd = 3;
    tg[7].wr[0] = SPAN(7), tg[7].nwr = 1;
    sg__lanes p;
    bool ok = TU_EXPECT(plan_of(ctx, tg, 8, 4, 2, &p));
    if (ok) {
        ok = check_plan(tg, 8, 4, &p) && TU_EXPECT(p.nhigh == 2) && TU_EXPECT(p.lane[1] >= 2) &&
             TU_EXPECT(p.lane[2] >= 2) && TU_EXPECT(p.lane[1] != p.lane[2]) &&
             TU_EXPECT(p.lane[0] < 2) && TU_EXPECT(p.lane[7] < 2);
        for (int k = 3; ok && k < 7; k++) ok = TU_EXPECT(p.lane[k] == p.lane[0]);
        if (!ok)
            for (int k = 0; k < 8; k++) fprintf(stderr, "  group %d: lane %d\n", k, p.lane[k]);
        sg__lanes_free(ctx, &p);
    }
    tu_case(ok, "lanes_urgency(results read only at the end on the other lanes, the chain on "
                "its lane)");
}

/* A chain (each reads the one before) stays one lane, no waits; the same
 * four groups writing apart but sharing a resource are ordered too. */
static void chain_and_resource(sg_ctx *ctx) {
    tgroup tg[4];
    memset(tg, 0, sizeof tg);
    for (int k = 0; k < 4; k++) {
        tg[k].wr[0] = SPAN(k), tg[k].nwr = 1;
        if (k) tg[k].rd[0] = SPAN(k - 1), tg[k].nrd = 1;
    }
    sg__lanes p;
    bool ok = TU_EXPECT(plan_of(ctx, tg, 4, 4, 0, &p));
    if (ok) {
        ok = check_plan(tg, 4, 4, &p) && TU_EXPECT(p.nlanes == 1);
        for (int k = 0; k < 4; k++) ok = ok && TU_EXPECT(!p.post[k]);
        sg__lanes_free(ctx, &p);
    }
    tu_case(ok, "lanes_chain");
    for (int k = 0; k < 4; k++) {
        tg[k].nrd = 0;
        tg[k].wr[1] = (sg__span){7, 8}, tg[k].nwr = 2; /* one resource */
    }
    ok = TU_EXPECT(plan_of(ctx, tg, 4, 4, 0, &p));
    if (ok) {
        ok = check_plan(tg, 4, 4, &p) && TU_EXPECT(p.nlanes == 1);
        sg__lanes_free(ctx, &p);
    }
    tg[3].nwr = 1; /* the last one without it: free to go beside */
    bool ok2 = TU_EXPECT(plan_of(ctx, tg, 4, 4, 0, &p));
    if (ok2) {
        ok2 = check_plan(tg, 4, 4, &p) && TU_EXPECT(p.lane[3] != p.lane[2]);
        sg__lanes_free(ctx, &p);
    }
    tu_case(ok && ok2, "lanes_resource");
}

/* Out of host memory at each of the plan's allocations in turn: SG_ERR_OOM
 * with a message that says what ran out, nothing leaked, and the same
 * context plans again once memory is there. */
static void out_of_memory(void) {
    tu_alloc hook = {0};
    sg_ctx *c = NULL;
    bool ok = TU_EXPECT(
        sg_ctx_create(
            &(sg_ctx_opts){.backend = SG_BACKEND_CPU, .alloc = tu_alloc_hook, .alloc_user = &hook},
            &c) == SG_OK);
    tgroup tg[4];
    memset(tg, 0, sizeof tg);
    for (int k = 0; k < 4; k++) tg[k].wr[0] = SPAN(k), tg[k].nwr = 1;
    tg[3].rd[0] = SPAN(0), tg[3].nrd = 1;
    int failed = 0;
    for (long at = 1; ok && at <= 6; at++) {
        sg__lanes p;
        long live = hook.live;
        hook.count = 0, hook.fail_at = at;
        bool planned = plan_of(c, tg, 4, 4, 0, &p);
        hook.fail_at = 0;
        if (planned) { /* past the plan's allocations */
            sg__lanes_free(c, &p);
            break;
        }
        failed++;
        ok =
            TU_EXPECT(sg_ctx_status(c) == SG_ERR_OOM) &&
            TU_EXPECT(strstr(sg_last_error(c), "out of host memory planning a graph's branches")) &&
            TU_EXPECT(hook.live == live);
    }
    sg__lanes p;
    ok = ok && TU_EXPECT(failed == 6) && TU_EXPECT(plan_of(c, tg, 4, 4, 0, &p)) &&
         check_plan(tg, 4, 4, &p);
    if (ok) sg__lanes_free(c, &p);
    tu_case(ok, "lanes_out_of_memory(each of %d allocations failing) -> SG_ERR_OOM, nothing leaked",
            failed);
    if (c) sg_ctx_destroy(c);
}

int main(void) {
    sg_ctx *ctx = NULL;
    sg_ctx_opts o = {0};
    o.backend = SG_BACKEND_CPU;
    if (sg_ctx_create(&o, &ctx) != SG_OK) {
        fprintf(stderr, "no CPU context\n");
        return 1;
    }
    random_cases(ctx);
    fork_join(ctx);
    readers_after(ctx, false);
    readers_after(ctx, true);
    urgency(ctx);
    chain_and_resource(ctx);
    out_of_memory();
    sg_ctx_destroy(ctx);
    return tu_finish();
}
