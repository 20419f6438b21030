#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# gpu_suite.sh -- on a machine with an NVIDIA GPU: build (Release), run the
# gpu-labelled tests, then run each of them again under compute-sanitizer's
# memcheck. Logs and a summary go to the out dir.
#   tests/gpu_suite.sh [out-dir] [memcheck-seconds-per-test (0: no memcheck)]
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUTDIR=${1:-${OUT:-/tmp}}
LIMIT=${2:-150}
mkdir -p "$OUTDIR"
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DSTEPGRAPH_EXAMPLES=OFF >"$OUTDIR/configure.txt" 2>&1
if ! cmake --build build-gpu -j"$(nproc)" >"$OUTDIR/build.txt" 2>&1; then
    grep -E "error|Error" "$OUTDIR/build.txt" | head -30
    exit 1
fi
export SG_CACHE_DIR=${SG_CACHE_DIR:-$(mktemp -d)}
ctest --test-dir build-gpu -L gpu --output-on-failure -j4 --timeout 600 2>&1 | tee "$OUTDIR/ctest_gpu.txt" |
    grep -E "Test +#|tests passed|tests failed|FAIL" | head -80
[ "$LIMIT" -gt 0 ] || exit 0
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
[ -x "$SAN" ] || { echo "no compute-sanitizer: memcheck skipped"; exit 0; }
echo "== memcheck (at most ${LIMIT}s per test)" | tee "$OUTDIR/memcheck_summary.txt"
for name in $(ctest --test-dir build-gpu -L gpu -N | awk '/Test +#/{print $3}'); do
    exe=$name envs=()
    if [[ $name == *_cuda ]]; then exe=${name%_cuda}; envs=(SG_TEST_BACKEND=cuda); fi
    log="$OUTDIR/memcheck_$name.txt"
    env "${envs[@]}" timeout "$LIMIT" "$SAN" --tool memcheck --error-exitcode 99 --print-limit 20 \
        "build-gpu/tests/$exe" >"$log" 2>&1
    rc=$?
    errs=$(grep -Eo "ERROR SUMMARY: [0-9]+ error" "$log" | tail -1)
    case $rc in
    0) verdict="clean ($errs)" ;;
    77) verdict="skipped" ;;
    99) verdict="MEMCHECK ERRORS ($errs)" ;;
    124) verdict="timed out after ${LIMIT}s, no error before it: $(grep -c "Invalid\|Error" "$log") error lines" ;;
    *) verdict="test failed under memcheck (rc $rc, $errs)" ;;
    esac
    echo "$name: $verdict" | tee -a "$OUTDIR/memcheck_summary.txt"
done
