"""table.py -- merge the RESULT lines of bench.c and torch_ref.py into one
markdown table: per-step us, first-call seconds, speedup over torch's best
mode, and the floor of WORKLOADS.md."""
import sys

FLOOR_US = {"W1s": 2.0, "W1l": 45.0, "W2": 8.0}


def load(path):
    rows = {}
    for line in open(path):
        if line.startswith("RESULT "):
            p = line.split()
            rows[(p[2], p[3])] = (float(p[4]), float(p[5]))
    return rows


def main():
    sg, th = load(sys.argv[1]), load(sys.argv[2])
    works = sorted({w for w, _ in sg} | {w for w, _ in th}, key=lambda w: list(FLOOR_US).index(w) if w in FLOOR_US else 9)
    print("| work | system | mode | us/step | first_s | vs torch best | floor us |")
    print("|---|---|---|---|---|---|---|")
    for w in works:
        best = min((v[0] for (ww, m), v in th.items() if ww == w), default=None)
        for src, rows in (("torch", th), ("stepgraph", sg)):
            for (ww, m), (us, first) in rows.items():
                if ww != w:
                    continue
                ratio = f"{best / us:.2f}x" if best else "-"
                print(f"| {w} | {src} | {m} | {us:.1f} | {first:.3f} | {ratio} | {FLOOR_US.get(w, '-')} |")


if __name__ == "__main__":
    main()
