# SPDX-License-Identifier: MIT
"""ktrace.py -- where one graph replay's time goes, from bench/ktrace.c's
timeline: the last complete replay of the last graph the program launched
(its records, from the end, until a node repeats).

    python3 bench/ktrace.py trace.csv [--top K] [--graph G] [--tail N]

Prints the replay's wall time (first start to last end), the time some
kernel runs (the union), the sum of the kernels' own times, the time two or
more run at once, the idle gaps between them (largest first, with the
kernels on either side), and the kernels by name: effective total (from
the later of a kernel's start and the end of the one before it on its
stream, so that a programmatic launch's wait is not counted), count, mean,
and the total of their own durations. --tail N lists the replay's last N
records by start: offset from the replay's start, duration, stream, name.
"""
import csv
import signal
import sys
from collections import defaultdict


def load(path):
    with open(path, newline="") as f:
        return [(int(r["start_ns"]), int(r["end_ns"]), int(r["stream"]), int(r["graph"]),
                 int(r["node"]), r["kind"], r["name"]) for r in csv.DictReader(f)]


def last_replay(recs, graph):
    recs = sorted((r for r in recs if r[3] == graph), key=lambda r: r[0])
    seen, out = set(), []
    for r in reversed(recs):
        if r[4] in seen:
            break
        seen.add(r[4])
        out.append(r)
    before = recs[:len(recs) - len(out)]
    return sorted(out, key=lambda r: r[0]), before


def short(name, n=60):
    return name if len(name) <= n else name[:n - 3] + "..."


def main(argv):
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # quiet under | head
    if not argv or argv[0] in ("-h", "--help"):
        sys.exit(__doc__)
    top = int(argv[argv.index("--top") + 1]) if "--top" in argv else 15
    recs = load(argv[0])
    graphs = [r[3] for r in recs if r[3]]
    if not graphs:
        sys.exit("ktrace.py: no graph records in the trace")
    graph = int(argv[argv.index("--graph") + 1]) if "--graph" in argv else max(
        graphs, key=lambda g: max(r[1] for r in recs if r[3] == g))
    rep, before = last_replay(recs, graph)
    t0, t1 = rep[0][0], max(r[1] for r in rep)
    own = sum(r[1] - r[0] for r in rep)
    # sweep: busy (>= 1 running) and overlapped (>= 2)
    ev = sorted([(r[0], 1) for r in rep] + [(r[1], -1) for r in rep])
    busy = two = 0
    run, last = 0, t0
    for t, d in ev:
        if run >= 1:
            busy += t - last
        if run >= 2:
            two += t - last
        run += d
        last = t
    print(f"graph {graph}: {len(rep)} records in the last replay "
          f"({sum(1 for r in rep if r[5] == 'K')} kernels, {len(set(r[2] for r in rep))} streams)")
    if before:
        prev_end = max(r[1] for r in before)
        print(f"  from the replay before's last end to this one's first start: {(t0 - prev_end) / 1e3:.1f} us")
    print(f"  wall {(t1 - t0) / 1e3:.1f} us, busy {busy / 1e3:.1f} us, idle {(t1 - t0 - busy) / 1e3:.1f} us, "
          f"kernels' own sum {own / 1e3:.1f} us, two or more at once {two / 1e3:.1f} us")
    # idle gaps, in start order: a gap opens when nothing runs
    gaps, end_max, prev = [], t0, None
    for r in rep:
        if r[0] > end_max and prev is not None:
            gaps.append((r[0] - end_max, prev, r))
        if r[1] > end_max:
            end_max, prev = r[1], r
        elif prev is None:
            prev = r
    gaps.sort(key=lambda g: -g[0])
    hist = defaultdict(lambda: [0, 0])
    for g, _, _ in gaps:
        b = "<1us" if g < 1000 else "1-2us" if g < 2000 else "2-4us" if g < 4000 else ">=4us"
        hist[b][0] += 1
        hist[b][1] += g
    print("  idle gaps: " + ", ".join(f"{k} {v[0]} ({v[1] / 1e3:.1f} us)" for k, v in sorted(hist.items())))
    for g, a, b in gaps[:top]:
        print(f"    {g / 1e3:7.2f} us after {short(a[6], 48)} [s{a[2]}] before {short(b[6], 48)} [s{b[2]}]")
    # A kernel launched early (programmatic dependent launch) waits inside
    # itself for the one before it on its stream: its effective time ends
    # at its end and starts at the later of its start and that kernel's end.
    by = defaultdict(lambda: [0, 0, 0])
    last = defaultdict(int)
    for r in rep:
        eff = r[1] - max(r[0], last[r[2]])
        last[r[2]] = max(last[r[2]], r[1])
        by[r[6]][0] += max(eff, 0)
        by[r[6]][1] += 1
        by[r[6]][2] += r[1] - r[0]
    print("  by name (effective total us, count, effective mean us, own total us):")
    for name, (t, c, own) in sorted(by.items(), key=lambda kv: -kv[1][0])[:top * 2]:
        print(f"    {t / 1e3:9.1f} {c:4d} {t / c / 1e3:8.2f} {own / 1e3:9.1f}  {short(name, 80)}")
    if "--tail" in argv:
        n = int(argv[argv.index("--tail") + 1])
        print("  last records (start us, duration us, stream, name):")
        for r in rep[-n:]:
            print(f"    {(r[0] - t0) / 1e3:9.1f} {(r[1] - r[0]) / 1e3:8.1f}  s{r[2]}  {short(r[6], 70)}")


if __name__ == "__main__":
    main(sys.argv[1:])
