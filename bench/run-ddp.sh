#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# run-ddp.sh -- W6 data parallel on this machine's GPUs: GPT-2 small training
# (llm.c's step; B x T = 4 x 1024 tokens per GPU, bf16 with f32 master
# weights) through stepgraph (examples/train_gpt2 in reduce-overhead mode,
# one process per GPU under torchrun, gradients all-reduced by NCCL inside
# the step's CUDA graph) beside PyTorch DDP (bench/ddp_torch.py, torch.compile
# reduce-overhead) in the same run, plus stepgraph on one GPU for the scaling.
# Prints one line per run with the median step time after the warm-up.
#   bench/run-ddp.sh [gpus (default 2)] [out-dir]
# Needs torchrun (PyTorch) and NCCL: SG_NCCL_LIB defaults to the libnccl.so.2
# of pip's nvidia-nccl package that PyTorch brings.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
NGPU=${1:-2}
OUTDIR=${2:-${OUT:-/tmp}}
STEPS=${STEPS:-30}
mkdir -p "$OUTDIR"
cmake -S . -B build-bench -DCMAKE_BUILD_TYPE=Release -DSTEPGRAPH_TESTS=OFF >/dev/null
cmake --build build-bench -j"$(nproc)" --target train_gpt2 >/dev/null
if [ -z "${SG_NCCL_LIB:-}" ]; then
    SG_NCCL_LIB=$(python3 -c 'import os, nvidia.nccl as m; print(os.path.join(list(m.__path__)[0], "lib", "libnccl.so.2"))')
    export SG_NCCL_LIB
fi
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export SG_CACHE_DIR=$WORK/cache
# Each rank on its own GPU: the CUDA backend uses the first device it sees.
cat >"$WORK/rank.sh" <<'EOS'
#!/bin/sh
export CUDA_VISIBLE_DEVICES=${LOCAL_RANK:-${OMPI_COMM_WORLD_LOCAL_RANK:-0}}
exec "$@"
EOS
# The NCCL id's rendezvous port (torchrun's agent holds MASTER_PORT).
SG_COMM_PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])')
export SG_COMM_PORT
ARGS=(-e d12 -b 4 -t 1024 -x "$STEPS" -v 0 -m 1 -M reduce-overhead)
# One median over the steps after the first 5 of a train_gpt2 log.
median() {
    grep -E '^step +[0-9]+/' "$1" | awk 'NR > 5 { gsub(/\(/, ""); print $(NF - 3) }' | sort -g |
        awk '{ v[NR] = $1 } END { if (NR) print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'
}
./build-bench/examples/train_gpt2 "${ARGS[@]}" >"$OUTDIR/ddp_stepgraph_1gpu.txt"
torchrun --standalone --nproc_per_node="$NGPU" --no-python sh "$WORK/rank.sh" \
    ./build-bench/examples/train_gpt2 "${ARGS[@]}" >"$OUTDIR/ddp_stepgraph.txt"
torchrun --standalone --nproc_per_node="$NGPU" bench/ddp_torch.py --mode reduce-overhead \
    --steps "$STEPS" >"$OUTDIR/ddp_torch.txt"
one=$(median "$OUTDIR/ddp_stepgraph_1gpu.txt")
many=$(median "$OUTDIR/ddp_stepgraph.txt")
{
    echo "stepgraph 1 GPU: ${one} ms per step (4 x 1024 tokens)"
    echo "stepgraph ${NGPU} GPUs: ${many} ms per step ($NGPU x 4 x 1024 tokens), scaling $(
        awk -v a="$one" -v b="$many" 'BEGIN { printf "%.0f%%", 100 * a / b }')"
    grep RESULT "$OUTDIR/ddp_torch.txt"
} | tee "$OUTDIR/ddp_summary.txt"
