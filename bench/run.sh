#!/usr/bin/env bash
# run.sh -- build stepgraph (Release) and run the reference workloads through
# stepgraph (every mode) and PyTorch (eager and every torch.compile mode) on
# this machine's GPU, then print one table: per-step us, first-call seconds
# (a fresh process on a cold disk cache, then on the warm cache), peak device
# memory, stepgraph's speedup over torch's best, and the floor.
#   bench/run.sh [out-dir]      (the device machine: $OUT)
# SG_BENCH_BACKEND (default cuda), SG_BENCH_WORK ("w1s w2" to pick),
# TORCH_MODES (default every mode).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUTDIR=${1:-${OUT:-/tmp}}
mkdir -p "$OUTDIR"
cmake -S . -B build-bench -DCMAKE_BUILD_TYPE=Release -DSTEPGRAPH_TESTS=OFF >/dev/null
cmake --build build-bench -j"$(nproc)" >/dev/null
B=./build-bench/bench/bench
# Every kernel cache of the run is a temporary directory, removed at exit.
CACHES=$(mktemp -d)
trap 'rm -rf "$CACHES"' EXIT
BACK=${SG_BENCH_BACKEND:-cuda}
# Per-step times: every mode in one process.
SG_CACHE_DIR=$(mktemp -d -p "$CACHES") $B --backend "$BACK" ${SG_BENCH_WORK:-} 2>"$OUTDIR/stepgraph.txt" | tee "$OUTDIR/stepgraph_table.txt"
# First calls: each compiled mode first in a fresh process on an empty cache
# (cold), then again in another process over the cache it filled (warm).
: >"$OUTDIR/stepgraph_cold.txt"
: >"$OUTDIR/stepgraph_warm.txt"
for m in default reduce-overhead max-autotune max-autotune-no-cudagraphs; do
    dir=$(mktemp -d -p "$CACHES")
    SG_CACHE_DIR=$dir SG_BENCH_TAG=cold $B --backend "$BACK" --modes "$m" ${SG_BENCH_WORK:-} 2>>"$OUTDIR/stepgraph_cold.txt" >/dev/null
    SG_CACHE_DIR=$dir SG_BENCH_TAG=warm $B --backend "$BACK" --modes "$m" ${SG_BENCH_WORK:-} 2>>"$OUTDIR/stepgraph_warm.txt" >/dev/null
done
PYTHONUNBUFFERED=1 python3 bench/torch_ref.py --modes "${TORCH_MODES:-eager,default,reduce-overhead,max-autotune}" ${SG_BENCH_WORK:-} 2> "$OUTDIR/torch.txt" | tee "$OUTDIR/torch_table.txt"
python3 bench/table.py "$OUTDIR/stepgraph.txt" "$OUTDIR/stepgraph_cold.txt" "$OUTDIR/stepgraph_warm.txt" "$OUTDIR/torch.txt" | tee "$OUTDIR/table.md"
