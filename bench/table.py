"""table.py -- merge the RESULT lines of bench.c (a cold-cache run and a
warm-cache run) and torch_ref.py into one markdown table: per-step us,
first-call seconds (cold and warm cache), peak device memory, speedup over
torch's best mode, and the floor of WORKLOADS.md.

    python3 bench/table.py stepgraph.txt stepgraph_warm.txt torch.txt
"""
import sys

FLOOR_US = {"W1s": 2.0, "W1l": 45.0, "W2": 8.0}


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


def main():
    sg, warm, th = load(sys.argv[1]), load(sys.argv[2]), load(sys.argv[3])
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
                ptxt = f"{peak:.1f}" if peak is not None else "-"
                print(f"| {w} | {src} | {m} | {us:.1f} | {first:.3f} | {wtxt} | {ptxt} | {ratio} | {FLOOR_US.get(w, '-')} |")


if __name__ == "__main__":
    main()
