"""torch_ref.py -- the reference workloads in PyTorch, timed as bench.c times
stepgraph: a host loop of `steps` steps synchronized at the end, median of 5
loops, after 3 warm-up calls (their wall time is first_s: compile, autotune,
graph recording) and 20 untimed steps. One line per figure starts with
RESULT, for bench/run.sh.

    python3 bench/torch_ref.py [--modes eager,default,reduce-overhead,max-autotune] [w1s w1l w2]
"""
import argparse
import statistics
import sys
import time

import torch


def w1(y):
    for _ in range(6):
        y = torch.tanh(torch.sin(y) * 1.01 + 0.1)
    return y


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(1024, 1024) for _ in range(8))

    def forward(self, h):
        for layer in self.layers:
            h = torch.nn.functional.gelu(layer(h), approximate="tanh")
        return h


def bench(fn, x, mode, steps, loops=5):
    torch._dynamo.reset()
    f = fn if mode == "eager" else torch.compile(fn, mode=mode)
    mark = mode in ("reduce-overhead", "max-autotune")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(3):
        if mark:
            torch.compiler.cudagraph_mark_step_begin()
        f(x)
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    for _ in range(20):
        if mark:
            torch.compiler.cudagraph_mark_step_begin()
        f(x)
    per = []
    for _ in range(loops):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(steps):
            if mark:
                torch.compiler.cudagraph_mark_step_begin()
            f(x)
        torch.cuda.synchronize()
        per.append((time.perf_counter() - t0) / steps * 1e6)
    return statistics.median(per), first, torch.cuda.max_memory_allocated()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--modes", default="eager,default,reduce-overhead,max-autotune")
    ap.add_argument("work", nargs="*", default=["w1s", "w1l", "w2"])
    args = ap.parse_args()
    torch.manual_seed(0)
    dev = "cuda"
    cases = []
    if "w1s" in args.work:
        cases.append(("W1s", w1, torch.randn(4096, device=dev)))
    if "w1l" in args.work:
        cases.append(("W1l", w1, torch.randn(16 << 20, device=dev)))
    if "w2" in args.work:
        model = MLP().to(dev, torch.bfloat16).eval()
        x = torch.randn(1, 1024, device=dev, dtype=torch.bfloat16)
        cases.append(("W2", model, x))
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}")
    with torch.inference_mode():
        for name, fn, x in cases:
            for mode in args.modes.split(","):
                try:
                    us, first, peak = bench(fn, x, mode, 200)
                except Exception as e:  # a failed mode is reported, not fatal
                    print(f"{name} {mode}: failed: {e}", file=sys.stderr)
                    continue
                print(f"| {name:4} | {mode:16} | {us:10.1f} us | first {first:7.2f} s | peak {peak / 2**20:8.1f} MiB |")
                print(f"RESULT torch {name} {mode} {us:.2f} {first:.4f} {peak}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
