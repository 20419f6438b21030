# SPDX-License-Identifier: MIT
"""table.py -- merge the RESULT lines of bench.c (every mode in one process;
each mode first in a fresh process on a cold cache; the same on the warm
cache) and torch_ref.py into one markdown table: per-step us, first-call
seconds (cold and warm cache), peak device memory, speedup over torch's best
mode, and the floor of bench/README.md.

    python3 bench/table.py stepgraph.txt stepgraph_cold.txt stepgraph_warm.txt torch.txt
    python3 bench/table.py --check DIR [--ref MODE]

--check compares the outputs bench --check and torch_ref.py --check wrote
into DIR, each stepgraph mode against torch's MODE (default eager): W3's
greedy tokens (equal for all 32 steps) and its logits over the steps before
the first differing token, W5's last-position logits; logits agree when
|a - b| <= 2e-2 (1 + |b|) everywhere. W4's losses at steps 1, 10 and 50
agree within 1e-3 (1 + |b|), W6's at steps 1, 10 and 20 within 2e-2
(absolute). Exit status 1 when a check fails.
"""
import array
import os
import sys

FLOOR_US = {"W1s": 2.0, "W1l": 45.0, "W2": 8.0, "W3": 100.0, "W4": 40.0, "W5": 700.0,
            "W6": 4200.0}
TOL = 2e-2
# The training checks, per workload: the steps its .loss files hold (1-based),
# the steps compared, and the bound on |a - b| for torch's loss b.
LOSSES = {"W4": ((1, 10, 50), (1, 10, 50), lambda b: 1e-3 * (1 + abs(b)), "1e-3 (1 + |torch|)"),
          "W6": (tuple(range(1, 21)), (1, 10, 20), lambda b: TOL, f"{TOL} absolute")}


def load(path):
    rows = {}
    try:
        lines = open(path).readlines()
    except OSError:
        return rows
    for line in lines:
        if line.startswith("RESULT "):
            p = line.split()
            peak = float(p[6]) / 2**20 if len(p) > 6 else None
            rows[(p[2], p[3])] = (float(p[4]), float(p[5]), peak)
    return rows


def table(paths):
    sg, cold, warm, th = (load(a) for a in paths)
    order = list(FLOOR_US)
    works = sorted({w for w, _ in sg} | {w for w, _ in th},
                   key=lambda w: order.index(w) if w in order else 9)
    print("| work | system | mode | us/step | first_s cold | first_s warm | peak MiB | torch best / this | floor us |")
    print("|---|---|---|---|---|---|---|---|---|")
    for w in works:
        best = min((v[0] for (ww, m), v in th.items() if ww == w), default=None)
        for src, rows in (("torch", th), ("stepgraph", sg)):
            for (ww, m), (us, first, peak) in rows.items():
                if ww != w:
                    continue
                ratio = f"{best / us:.2f}x" if best else "-"
                wf = warm.get((ww, m)) if src == "stepgraph" else None
                wtxt = f"{wf[1]:.3f}" if wf else "-"
                cf = cold.get((ww, m)) if src == "stepgraph" else None
                first = cf[1] if cf else first
                ptxt = f"{peak:.1f}" if peak is not None else "-"
                print(f"| {w} | {src} | {m} | {us:.1f} | {first:.3f} | {wtxt} | {ptxt} | {ratio} | {FLOOR_US.get(w, '-')} |")


def floats(path):
    a = array.array("f")
    with open(path, "rb") as f:
        a.frombytes(f.read())
    return a


def worst(got, ref, n):
    """The largest |got - ref| / (1 + |ref|) over the first n values."""
    return max((abs(g - r) / (1 + abs(r)) for g, r in zip(got[:n], ref[:n])), default=0.0)


def check_losses(d, work, ref_mode, files):
    """A training workload's losses at the steps LOSSES names against torch's."""
    held, picked, bound, what = LOSSES[work]
    ok, ref = True, f"{work}_torch_{ref_mode}.loss"
    prefix = f"{work}_stepgraph_"
    mine = [f for f in files if f.startswith(prefix) and f.endswith(".loss")]
    if not mine:
        return True
    if ref not in files:
        print(f"{work}: no torch {ref_mode} losses in {d}; nothing to compare")
        return True

    def at(path):
        v = [float(x) for x in open(os.path.join(d, path)).read().split()]
        return [v[held.index(s)] for s in picked] if len(v) == len(held) else None

    steps = ", ".join(str(s) for s in picked)
    b = at(ref)
    for f in files:  # torch's own modes against its eager: for scale
        if f.startswith(f"{work}_torch_") and f.endswith(".loss") and f != ref:
            t = at(f)
            if t and b:
                print(f"{work} torch {f[len(work) + 7:-5]} against torch {ref_mode}: losses at steps "
                      f"{steps} differ by at most {max(abs(x - y) for x, y in zip(t, b)):.2e} (for scale)")
    for f in mine:
        mode = f[len(prefix):-5]
        a = at(f)
        good = a is not None and b is not None and all(abs(x - y) <= bound(y) for x, y in zip(a, b))
        print(f"{work} {mode}: losses at steps {steps} {a} vs torch {ref_mode} {b} "
              f"(within {what}): {'ok' if good else 'FAIL'}")
        ok &= good
    return ok


def check(d, ref_mode):
    ok = True
    files = sorted(os.listdir(d))
    for work in LOSSES:
        ok &= check_losses(d, work, ref_mode, files)
    for work in ("W3", "W5"):
        ref = os.path.join(d, f"{work}_torch_{ref_mode}.f32")
        mine = [f for f in files if f.startswith(f"{work}_stepgraph_") and f.endswith(".f32")]
        if not mine:
            continue
        if not os.path.exists(ref):
            print(f"{work}: no torch {ref_mode} output in {d}; nothing to compare")
            continue
        rl = floats(ref)
        # torch's own modes against its eager: the spread of bf16 rounding orders
        for f in files:
            if f.startswith(f"{work}_torch_") and f.endswith(".f32") and f != os.path.basename(ref):
                tl = floats(os.path.join(d, f))
                if len(tl) == len(rl):
                    print(f"{work} torch {f[len(work) + 7:-4]} against torch {ref_mode}: "
                          f"{worst(tl, rl, len(rl)):.2e} (for scale)")
        rt = open(ref[:-4] + ".tokens").read().split() if work == "W3" else None
        for f in mine:
            mode = f[len(work) + len("_stepgraph_"):-4]
            gl = floats(os.path.join(d, f))
            if len(gl) != len(rl):
                print(f"{work} {mode}: {len(gl)} logits, torch {len(rl)}: FAIL")
                ok = False
                continue
            n, what = len(rl), "last-position logits"
            if rt is not None:
                gt = open(os.path.join(d, f[:-4] + ".tokens")).read().split()
                same = next((i for i, (a, b) in enumerate(zip(gt, rt)) if a != b), min(len(gt), len(rt)))
                n = len(rl) // len(rt) * same
                good = same == len(rt) == len(gt)
                print(f"{work} {mode}: greedy tokens equal to torch {ref_mode} for {same}/{len(rt)} steps: {'ok' if good else 'FAIL'}")
                ok &= good
                what = f"logits of those {same} steps"
            err = worst(gl, rl, n)
            good = err <= TOL
            print(f"{work} {mode}: {what} within {err:.2e} of torch (tolerance {TOL}): {'ok' if good else 'FAIL'}")
            ok &= good
    return ok


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--check":
        ref_mode = sys.argv[4] if len(sys.argv) > 4 and sys.argv[3] == "--ref" else "eager"
        sys.exit(0 if check(sys.argv[2], ref_mode) else 1)
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    table(sys.argv[1:5])


if __name__ == "__main__":
    main()
