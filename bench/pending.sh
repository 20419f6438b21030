#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# pending.sh -- on a machine with an NVIDIA GPU: measure the defaults that
# bench/NOTES.md lists as written but not yet measured on a GPU, each against
# its switch in the same call (bench/ab.sh), after the gpu tests that cover
# them. A default stays only if it wins here; NOTES.md's newest section says
# which section each belongs to.
#   bench/pending.sh [tests|sample|ab|probe|first|all]   (default: all; each part
#   fits a 10-minute call on its own, most telling lines first)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PART=${1:-all}
J=$(nproc)
build() {
    cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DSTEPGRAPH_EXAMPLES=OFF >/dev/null &&
        cmake --build build-gpu -j"$J" >/dev/null 2>build-gpu.err ||
        { grep -E "error" build-gpu.err | head -20; exit 1; }
}

# A draw from GPT-2's logits (test_capture_sample's info lines) with the
# row staged in shared memory (the default) and without.
sample() {
    build
    for r in 1 2; do
        for st in 1 0; do
            SG_CUDA_ROW_STAGE=$st SG_TEST_BACKEND=cuda ./build-gpu/tests/test_capture_sample |
                grep "^info" | sed "s/^/stage=$st round $r: /"
        done
    done
}

# The gpu tests: every kernel family changed (k_prelude.cuh), the
# cross-entropy pair (cp.async stage), the optimizer's updates by readiness,
# the products (cuBLASLt loaded from the context's start).
tests() {
    build
    SG_CACHE_DIR=$(mktemp -d) ctest --test-dir build-gpu -L gpu -j4 --timeout 300 2>&1 |
        grep -E "tests passed|tests failed|\*\*\*|Failed" | head -40
}

# Per-step times, alternated: the reuse gap, the updates by readiness, the
# cross-entropy gradient's cp.async stage (W6, W4); the reuse gap on W3, W5.
ab() {
    bench/ab.sh -r 2 -w "w6 w4" base= gap6=SG_CUDA_REUSE_GAP=6 gap12=SG_CUDA_REUSE_GAP=12 \
        mr0=SG_MULTI_READY=0 xsync=SG_CUDA_XENT=stage,pair
    bench/ab.sh -r 2 -w "w3 w5" base= gap6=SG_CUDA_REUSE_GAP=6
}

# cuBLASLt's DGELU algorithms on W6's fc backward against the plain product.
probe() {
    gcc -O2 -std=c11 -I/usr/local/cuda/include bench/lt_probe.c -o build-gpu/lt_probe \
        -L/usr/local/cuda/lib64 -lcublasLt -lcudart && ./build-gpu/lt_probe w6
}

# Warm first calls of W5 and W3 with cuBLASLt loaded from the context's
# start (the default) against the compile-only start; then where W5's goes.
first() {
    [ -x build-bench/bench/bench ] || bench/ab.sh -r 0 -w w1s base= >/dev/null
    local c
    c=$(mktemp -d)
    SG_CACHE_DIR=$c ./build-bench/bench/bench --backend cuda --modes reduce-overhead \
        --first-only w5 w3 >/dev/null 2>&1 # fills the cache
    for r in 1 2; do
        for p in 1 step; do
            SG_CUDA_PREWARM=$p SG_CACHE_DIR=$c ./build-bench/bench/bench --backend cuda \
                --modes reduce-overhead --first-only w5 w3 2>&1 >/dev/null |
                awk -v p="$p" -v r="$r" '/^RESULT /{print "prewarm=" p, "round", r, $3, $4, "first_s", $6}'
        done
    done
    SG_LOGS=perf_hints SG_CACHE_DIR=$c ./build-bench/bench/bench --backend cuda \
        --modes reduce-overhead --first-only w5 2>&1 >/dev/null | grep -E "perf_hints" | head -30
}

case $PART in
tests) tests ;;
sample) sample ;;
ab) ab ;;
probe) build && probe ;;
first) first ;;
all) tests && sample && ab && probe && first ;;
*) sed -n 3,9p "$0" >&2; exit 2 ;;
esac
