#!/usr/bin/env bash
# run.sh -- build stepgraph (Release) and run the reference workloads through
# stepgraph (every mode) and PyTorch (eager and every torch.compile mode) on
# this machine's GPU, then print one table: per-step us, first-call seconds
# (cold disk cache, then warm in a second process), peak device memory,
# stepgraph's speedup over torch's best, and the floor.
#   bench/run.sh [out-dir]      (the device machine: $OUT)
# SG_BENCH_BACKEND (default cuda), SG_BENCH_WORK ("w1s w2" to pick),
# TORCH_MODES (default every mode).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUTDIR=${1:-${OUT:-/tmp}}
mkdir -p "$OUTDIR"
cmake -S . -B build-bench -DCMAKE_BUILD_TYPE=Release -DSTEPGRAPH_TESTS=OFF >/dev/null
cmake --build build-bench -j"$(nproc)" >/dev/null
export SG_CACHE_DIR=${SG_CACHE_DIR:-$(mktemp -d)}   # a cold cache: first_s counts compiles
./build-bench/bench/bench --backend "${SG_BENCH_BACKEND:-cuda}" ${SG_BENCH_WORK:-} 2> "$OUTDIR/stepgraph.txt" | tee "$OUTDIR/stepgraph_table.txt"
# The same again over the cache the first run filled: the warm first call.
SG_BENCH_TAG=warm ./build-bench/bench/bench --backend "${SG_BENCH_BACKEND:-cuda}" ${SG_BENCH_WORK:-} 2> "$OUTDIR/stepgraph_warm.txt" >/dev/null
PYTHONUNBUFFERED=1 python3 bench/torch_ref.py --modes "${TORCH_MODES:-eager,default,reduce-overhead,max-autotune}" ${SG_BENCH_WORK:-} 2> "$OUTDIR/torch.txt" | tee "$OUTDIR/torch_table.txt"
python3 bench/table.py "$OUTDIR/stepgraph.txt" "$OUTDIR/stepgraph_warm.txt" "$OUTDIR/torch.txt" | tee "$OUTDIR/table.md"
