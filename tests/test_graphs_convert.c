/* SPDX-License-Identifier: MIT */
/*
 * test_graphs_convert.c -- the CPU backend's f16 and bf16 conversions
 * (graphs/cpu/cpu.h: sg__h2f, sg__f2h, sg__bf2f, sg__f2bf) against the
 * independent decoders and rounding of testutil: every f16 and bf16 bit
 * pattern decoded and round-tripped, a few million random floats over all
 * exponents rounded, every exact tie between two neighbours, and the special
 * values (signed zeros, subnormals, overflow to inf, NaN with any payload).
 */
#include "graphs/cpu/cpu.h"
#include "testutil.h"

#include <float.h>
#include <math.h>
#include <string.h>

static uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float float_of(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Bit-exact equality of two decoded values: NaN matches any NaN of the same
 * sign, zeros must agree in sign. */
static bool same_value(double got, double ref) {
    if (ref != ref) return got != got && signbit(got) == signbit(ref);
    return got == ref && signbit(got) == signbit(ref);
}

/* Up to a few failures are printed per case; the count decides. */
static long report(long bad, const char *what, uint32_t in, double got, double ref) {
    if (bad < 4)
        fprintf(stderr, "  %s: input 0x%08x gives %.10g, expected %.10g\n", what, (unsigned)in, got,
                ref);
    return bad + 1;
}

/* Every f16 pattern decodes as testutil decodes it and encodes back to itself;
 * a NaN stays a NaN of the same sign. */
static void test_h2f_all(void) {
    long bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        uint16_t h16 = (uint16_t)h;
        float f = sg__h2f(h16);
        double ref = tu_load(&h16, SG_F16, 0);
        if (!same_value(f, ref)) bad = report(bad, "h2f", h, f, ref);
        uint16_t back = sg__f2h(f);
        bool ok = ref != ref
                      ? (back & 0x7c00) == 0x7c00 && (back & 0x3ff) && (back >> 15) == (h >> 15)
                      : back == h16;
        if (!ok) bad = report(bad, "f2h(h2f)", h, back, h);
    }
    tu_case(bad == 0, "H2F_ROUNDTRIP(all 65536 f16 patterns) bad=%ld", bad);
}

static void test_bf2f_all(void) {
    long bad = 0;
    for (uint32_t b = 0; b < 65536; b++) {
        uint16_t b16 = (uint16_t)b;
        float f = sg__bf2f(b16);
        double ref = tu_load(&b16, SG_BF16, 0);
        if (!same_value(f, ref)) bad = report(bad, "bf2f", b, f, ref);
        uint16_t back = sg__f2bf(f);
        bool ok = ref != ref
                      ? (back & 0x7f80) == 0x7f80 && (back & 0x7f) && (back >> 15) == (b >> 15)
                      : back == b16;
        if (!ok) bad = report(bad, "f2bf(bf2f)", b, back, b);
    }
    tu_case(bad == 0, "BF2F_ROUNDTRIP(all 65536 bf16 patterns) bad=%ld", bad);
}

/* Runs of every f16 and bf16 pattern through the tile gather (its
 * contiguous runs take vectorizable paths of their own): bit for bit what
 * testutil decodes, NaN payloads included; and a strided run through the
 * element path. */
static void test_gather_runs(void) {
    static uint16_t all[65536];
    static float got[65536];
    for (uint32_t i = 0; i < 65536; i++) all[i] = (uint16_t)i;
    sg_dtype dts[2] = {SG_F16, SG_BF16};
    for (int d = 0; d < 2; d++) {
        long bad = 0;
        for (int off = 0; off < 65536; off += 4096) /* runs of 4096, as the kernels' tiles */
            sg__gather_f(all + off, dts[d], 1, 4096, got + off);
        for (uint32_t i = 0; i < 65536; i++) {
            double ref = tu_load(all, dts[d], i);
            bool same = same_value(got[i], ref);
            if (same && ref != ref) { /* the payload: the pattern's mantissa, widened */
                uint32_t want = dts[d] == SG_F16 ? (i & 0x3ffu) << 13 : (i & 0x7fu) << 16;
                same = (bits_of(got[i]) & 0x007fffffu) == want;
            }
            if (!same)
                bad = report(bad, dts[d] == SG_F16 ? "gather f16" : "gather bf16", i, got[i], ref);
        }
        float strided[100];
        sg__gather_f(all + 31, dts[d], 655, 100, strided);
        for (int i = 0; i < 100; i++)
            if (!same_value(strided[i], tu_load(all, dts[d], 31 + 655 * i)))
                bad = report(bad, "gather strided", 31 + 655 * (uint32_t)i, strided[i],
                             tu_load(all, dts[d], 31 + 655 * i));
        tu_case(bad == 0,
                "GATHER_RUNS(%s: all 65536 patterns in contiguous runs, 100 strided) bad=%ld",
                sg_dtype_name(dts[d]), bad);
    }
}

/* Round f to dt with the library and decode the result independently. */
static double lib_round(sg_dtype dt, float f) {
    uint16_t h = dt == SG_F16 ? sg__f2h(f) : sg__f2bf(f);
    return tu_load(&h, dt, 0);
}

static long check_round(sg_dtype dt, float f, long bad) {
    double got = lib_round(dt, f), ref = tu_round(dt, (double)f);
    if (!same_value(got, ref))
        bad = report(bad, dt == SG_F16 ? "f2h" : "f2bf", bits_of(f), got, ref);
    return bad;
}

/* Random floats: uniform bit patterns (every exponent, NaNs and infs
 * included) and, for f16, floats whose exponent lies in or near f16's range
 * (subnormal halves, the overflow edge) where uniform patterns seldom land. */
static void test_random(sg_dtype dt, long n) {
    tu_seed(dt == SG_F16 ? 11 : 12);
    long bad = 0;
    for (long i = 0; i < n; i++) {
        uint32_t u = (uint32_t)(tu_next() >> 32);
        if (dt == SG_F16 && (i & 1)) {
            uint32_t e = (uint32_t)tu_randint(127 - 27, 127 + 16); /* 2^-27 .. 2^16 */
            u = (u & 0x807fffffu) | (e << 23);
        }
        bad = check_round(dt, float_of(u), bad);
    }
    tu_case(bad == 0, "%s_RANDOM(type=%s,n=%ld) bad=%ld", dt == SG_F16 ? "F2H" : "F2BF",
            sg_dtype_name(dt), n, bad);
}

/* Every tie: the float half-way between two neighbouring finite values of dt
 * must round to the one with an even last bit, and one float ulp either side
 * of it to the nearer one. Halves: midpoints need 12 significant bits, exact
 * in float; bf16: the midpoint is the pattern with bit 15 set. */
static void test_ties(sg_dtype dt) {
    long bad = 0, n = 0;
    for (uint32_t sign = 0; sign < 2; sign++)
        for (uint32_t v = 0; v < (dt == SG_F16 ? 0x7c00u : 0x7f80u); v++) {
            uint16_t lo = (uint16_t)(v | sign << 15), hi = (uint16_t)((v + 1) | sign << 15);
            double dlo = tu_load(&lo, dt, 0), dhi = tu_load(&hi, dt, 0);
            if (isinf(dhi)) continue; /* the overflow edge is checked on its own */
            float mid =
                dt == SG_F16 ? (float)((dlo + dhi) / 2) : float_of((uint32_t)lo << 16 | 0x8000);
            double even = (v & 1) ? dhi : dlo;
            double got = lib_round(dt, mid);
            if (!same_value(got, even)) bad = report(bad, "tie", bits_of(mid), got, even);
            float below = nextafterf(mid, 0.0f),
                  above = nextafterf(mid, sign ? -INFINITY : INFINITY);
            if (!same_value(lib_round(dt, below), dlo))
                bad = report(bad, "below tie", bits_of(below), lib_round(dt, below), dlo);
            if (!same_value(lib_round(dt, above), dhi))
                bad = report(bad, "above tie", bits_of(above), lib_round(dt, above), dhi);
            n++;
        }
    tu_case(bad == 0, "%s_TIES(type=%s,ties=%ld) bad=%ld", dt == SG_F16 ? "F2H" : "F2BF",
            sg_dtype_name(dt), n, bad);
}

/* Fixed inputs with their expected bit patterns, in both signs. */
typedef struct special {
    uint32_t in;  /* float bits */
    uint16_t out; /* expected bits, or 0xffff for "any NaN" */
    const char *what;
} special;

static void test_specials(sg_dtype dt) {
    static const special f16[] = {
        {0x00000000u, 0x0000, "zero"},
        {0x00000001u, 0x0000, "smallest float subnormal"},
        {0x33000000u, 0x0000, "2^-25 (tie to zero)"},
        {0x33000001u, 0x0001, "just above 2^-25"},
        {0x33c00000u, 0x0002, "3*2^-25 (tie to 2)"},
        {0x33800000u, 0x0001, "2^-24 (smallest subnormal)"},
        {0x387fc000u, 0x03ff, "largest subnormal"},
        {0x387fe000u, 0x0400, "tie between largest subnormal and smallest normal"},
        {0x38800000u, 0x0400, "smallest normal"},
        {0x3f800000u, 0x3c00, "one"},
        {0x477fe000u, 0x7bff, "65504 (largest finite)"},
        {0x477fefffu, 0x7bff, "just below 65520"},
        {0x477ff000u, 0x7c00, "65520 (rounds to inf)"},
        {0x7f7fffffu, 0x7c00, "FLT_MAX"},
        {0x7f800000u, 0x7c00, "inf"},
        {0x7fc00000u, 0xffff, "quiet NaN"},
        {0x7f800001u, 0xffff, "signalling NaN, low payload"},
        {0x7fffffffu, 0xffff, "NaN, all payload"},
    };
    static const special bf[] = {
        {0x00000000u, 0x0000, "zero"},
        {0x00000001u, 0x0000, "smallest float subnormal"},
        {0x00008000u, 0x0000, "tie to zero"},
        {0x00008001u, 0x0001, "just above the tie"},
        {0x00018000u, 0x0002, "tie to 2"},
        {0x007f8000u, 0x0080, "tie from the largest subnormal to the smallest normal"},
        {0x3f800000u, 0x3f80, "one"},
        {0x3f808000u, 0x3f80, "1 + 2^-8 (tie to 1)"},
        {0x3f818000u, 0x3f82, "1 + 3*2^-8 (tie up)"},
        {0x7f7f0000u, 0x7f7f, "largest finite"},
        {0x7f7f7fffu, 0x7f7f, "just below the overflow tie"},
        {0x7f7f8000u, 0x7f80, "the overflow tie (to inf)"},
        {0x7f7fffffu, 0x7f80, "FLT_MAX"},
        {0x7f800000u, 0x7f80, "inf"},
        {0x7fc00000u, 0xffff, "quiet NaN"},
        {0x7f800001u, 0xffff, "signalling NaN, low payload"},
        {0x7f80ffffu, 0xffff, "NaN, low payload that would carry"},
        {0x7fffffffu, 0xffff, "NaN, all payload"},
    };
    const special *sp = dt == SG_F16 ? f16 : bf;
    int n = (int)((dt == SG_F16 ? sizeof f16 : sizeof bf) / sizeof(special));
    for (int i = 0; i < n; i++)
        for (uint32_t sign = 0; sign < 2; sign++) {
            uint32_t in = sp[i].in | sign << 31;
            uint16_t got = dt == SG_F16 ? sg__f2h(float_of(in)) : sg__f2bf(float_of(in));
            bool ok;
            if (sp[i].out == 0xffff) {
                uint16_t expmask = dt == SG_F16 ? 0x7c00 : 0x7f80;
                ok = (got & expmask) == expmask && (got & (uint16_t) ~(expmask | 0x8000)) &&
                     (got >> 15) == sign;
            } else {
                ok = got == (uint16_t)(sp[i].out | sign << 15);
            }
            if (!ok)
                fprintf(stderr, "  0x%08x gives 0x%04x, expected 0x%04x\n", (unsigned)in, got,
                        (unsigned)(sp[i].out | sign << 15));
            tu_case(ok, "%s_SPECIAL(type=%s,in=0x%08x,%s%s)", dt == SG_F16 ? "F2H" : "F2BF",
                    sg_dtype_name(dt), (unsigned)in, sign ? "-" : "", sp[i].what);
        }
}

/* The same conversions through the library: every pattern of dt as a tensor,
 * cast to f32 and back. (This also makes the test link the library.) */
static void test_through_cast(sg_dtype dt) {
    sg_ctx *ctx;
    if (!TU_EXPECT(sg_ctx_create(&(sg_ctx_opts){.backend = SG_BACKEND_CPU}, &ctx) == SG_OK)) {
        tu_case(false, "CAST_ALL(type=%s)", sg_dtype_name(dt));
        return;
    }
    static uint16_t pat[65536], back[65536];
    static float wide[65536];
    for (uint32_t i = 0; i < 65536; i++) pat[i] = (uint16_t)i;
    int64_t n = 65536;
    sg_tensor *x = sg_from_host(ctx, dt, 1, &n, pat);
    sg_tensor *y = sg_cast(x, SG_F32);
    sg_tensor *z = sg_cast(y, dt);
    bool ok = TU_EXPECT(z != NULL) && TU_EXPECT(sg_read(y, wide, sizeof wide) == SG_OK) &&
              TU_EXPECT(sg_read(z, back, sizeof back) == SG_OK);
    long bad = 0;
    for (uint32_t i = 0; ok && i < 65536; i++) {
        double ref = tu_load(pat, dt, i);
        bool nan_ok = ref != ref && tu_load(back, dt, i) != tu_load(back, dt, i);
        if (!same_value(wide[i], ref) || (back[i] != pat[i] && !nan_ok))
            bad = report(bad, "cast", i, wide[i], ref);
    }
    tu_case(ok && bad == 0, "CAST_ALL(type=%s,to=f32,and back) bad=%ld", sg_dtype_name(dt), bad);
    sg_ctx_destroy(ctx);
}

int main(void) {
    test_through_cast(SG_F16);
    test_through_cast(SG_BF16);
    test_h2f_all();
    test_bf2f_all();
    test_gather_runs();
    test_specials(SG_F16);
    test_specials(SG_BF16);
    test_ties(SG_F16);
    test_ties(SG_BF16);
    test_random(SG_F16, 3000000);
    test_random(SG_BF16, 3000000);
    return tu_finish();
}
