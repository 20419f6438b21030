#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# run.sh -- build stepgraph (Release) and run the reference workloads through
# stepgraph (every mode) and PyTorch (eager and every torch.compile mode) on
# this machine's GPU, then print one table: per-step us, first-call seconds
# (a fresh process on a cold disk cache, then on the warm cache), peak device
# memory, stepgraph's speedup over torch's best, and the floor; then the
# correctness checks of W3 to W6 (stepgraph's outputs and losses against
# torch's on the same weights and data). bench/README.md describes the workloads.
#   bench/run.sh [out-dir]      (the device machine: $OUT)
# SG_BENCH_BACKEND (default cuda), SG_BENCH_WORK ("w1s w2" to pick; w1s w1l w2 w3 w4 w5 w6),
# SG_BENCH_MODES (stepgraph's modes, a comma list; default every mode),
# TORCH_MODES (default every mode), SG_BENCH_GPT2 (the llm.c checkpoint W3/W5/W6
# use; default: bench writes its seeded random init into a temporary file,
# and torch_ref.py loads the same file).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUTDIR=${1:-${OUT:-/tmp}}
mkdir -p "$OUTDIR"
cmake -S . -B build-bench -DCMAKE_BUILD_TYPE=Release -DSTEPGRAPH_TESTS=OFF >/dev/null
cmake --build build-bench -j"$(nproc)" --target bench >/dev/null
B=./build-bench/bench/bench
# Every kernel cache of the run is a temporary directory, removed at exit.
CACHES=$(mktemp -d)
WORK=$(mktemp -d)
trap 'rm -rf "$CACHES" "$WORK"' EXIT
BACK=${SG_BENCH_BACKEND:-cuda}
# The checkpoint (500 MB for 124M in f32) and the compared outputs stay out
# of OUTDIR; the verdicts go into it.
GPT2=${SG_BENCH_GPT2:-$WORK/gpt2_seeded.bin}
CHECK=$WORK/check
mkdir -p "$CHECK"
MODES=${SG_BENCH_MODES:-eager,default,reduce-overhead,max-autotune,max-autotune-no-cudagraphs}
# Per-step times: every mode in one process (it writes GPT2 when absent).
SG_CACHE_DIR=$(mktemp -d -p "$CACHES") $B --backend "$BACK" --gpt2 "$GPT2" --check "$CHECK" --modes "$MODES" ${SG_BENCH_WORK:-} 2>"$OUTDIR/stepgraph.txt" | tee "$OUTDIR/stepgraph_table.txt"
# First calls: each compiled mode first in a fresh process on an empty cache
# (cold), then again in another process over the cache it filled (warm);
# these processes take the first three calls only. NVRTC (13.0 at least)
# keeps what it compiled in the driver's compute cache
# (~/.nv/ComputeCache by default) and answers a repeated compile from there,
# so each cold process also gets an empty CUDA_CACHE_PATH of its own.
: >"$OUTDIR/stepgraph_cold.txt"
: >"$OUTDIR/stepgraph_warm.txt"
for m in ${MODES//,/ }; do
    [ "$m" = eager ] && continue
    dir=$(mktemp -d -p "$CACHES")
    CUDA_CACHE_PATH=$(mktemp -d -p "$CACHES") SG_CACHE_DIR=$dir SG_BENCH_TAG=cold $B --backend "$BACK" --gpt2 "$GPT2" --modes "$m" --first-only ${SG_BENCH_WORK:-} 2>>"$OUTDIR/stepgraph_cold.txt" >/dev/null
    SG_CACHE_DIR=$dir SG_BENCH_TAG=warm $B --backend "$BACK" --gpt2 "$GPT2" --modes "$m" --first-only ${SG_BENCH_WORK:-} 2>>"$OUTDIR/stepgraph_warm.txt" >/dev/null
done
# torch on the device bench ran on (cuda unless SG_BENCH_BACKEND=cpu)
DEV=cuda
[ "$BACK" = cpu ] && DEV=cpu
PYTHONUNBUFFERED=1 python3 bench/torch_ref.py --device "$DEV" --modes "${TORCH_MODES:-eager,default,reduce-overhead,max-autotune}" --gpt2 "$GPT2" --check "$CHECK" ${SG_BENCH_WORK:-} 2> "$OUTDIR/torch.txt" | tee "$OUTDIR/torch_table.txt"
python3 bench/table.py "$OUTDIR/stepgraph.txt" "$OUTDIR/stepgraph_cold.txt" "$OUTDIR/stepgraph_warm.txt" "$OUTDIR/torch.txt" | tee "$OUTDIR/table.md"
# Correctness: W3's greedy tokens (32 steps) and logits, W5's logits, W4's and
# W6's losses, each stepgraph mode against torch eager; exit status 1 when one
# disagrees.
python3 bench/table.py --check "$CHECK" | tee "$OUTDIR/check.txt"
