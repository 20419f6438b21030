# SPDX-License-Identifier: MIT
"""ncu_summary.py -- sum the per-kernel times of an ncu CSV by kernel name.

    ncu --graph-profiling node --clock-control none \
        --metrics gpu__time_duration.sum --csv PROGRAM > run.csv
    python3 bench/ncu_summary.py run.csv [--last N] [--top K]

--last N keeps only the last N kernel rows (one graph replay of N nodes when
the program ends with it). Prints, largest first: total us, count, mean us,
the share of the total, and the kernel name (its grid beside it).
"""
import csv
import sys
from collections import defaultdict


def rows(path):
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        v = float(r["Metric Value"].replace(",", ""))
        unit = r.get("Metric Unit", "ns")
        us = v / 1000.0 if unit == "ns" else v * 1000.0 if unit == "ms" else v
        yield r["Kernel Name"], r.get("Grid Size", ""), us


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    path, last, top = argv[0], 0, 40
    i = 1
    while i < len(argv):
        if argv[i] == "--last":
            last, i = int(argv[i + 1]), i + 2
        elif argv[i] == "--top":
            top, i = int(argv[i + 1]), i + 2
        else:
            print(f"ncu_summary: unknown argument {argv[i]}", file=sys.stderr)
            return 2
    rs = list(rows(path))
    if last:
        rs = rs[-last:]
    tot = defaultdict(float)
    cnt = defaultdict(int)
    grid = {}
    for name, g, us in rs:
        tot[name] += us
        cnt[name] += 1
        grid.setdefault(name, g)
    total = sum(tot.values())
    print(f"{len(rs)} kernels, {total:.1f} us summed")
    for name in sorted(tot, key=tot.get, reverse=True)[:top]:
        print(f"{tot[name]:10.1f} us {cnt[name]:5d}x {tot[name] / cnt[name]:8.2f} us "
              f"{100 * tot[name] / total:5.1f}%  {name[:90]} {grid[name]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
