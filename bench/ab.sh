#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# ab.sh -- build bench (Release) and time workloads under several environment
# settings, alternated, in one process per setting and round, so that a change
# behind a variable is measured against its absence on the same GPU in the same
# call (machines differ by more than most changes: bench/NOTES.md).
#   bench/ab.sh [-r ROUNDS] [-m MODES] [-b BACKEND] [-w "w6 w4"] NAME=VAR=VALUE[,VAR=VALUE...] ...
# A setting is a name, '=', then a comma list of VAR=VALUE (none: the
# defaults), e.g. `bench/ab.sh -w "w6 w4" base= gap6=SG_CUDA_REUSE_GAP=6`. Each
# round runs every setting once in the order given; the end prints each
# workload and mode's us per step under every setting, round by round.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROUNDS=2 MODES=reduce-overhead BACK=${SG_BENCH_BACKEND:-cuda} WORK="w6 w4"
while getopts r:m:b:w: o; do
    case $o in
    r) ROUNDS=$OPTARG ;;
    m) MODES=$OPTARG ;;
    b) BACK=$OPTARG ;;
    w) WORK=$OPTARG ;;
    *) sed -n 3,11p "$0" >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || { sed -n 3,11p "$0" >&2; exit 2; }
for s in "$@"; do
    case $s in
    *=*) ;;
    *) echo "ab.sh: setting '$s' has no '=' (NAME=VAR=VALUE,...)" >&2; exit 2 ;;
    esac
done
cmake -S . -B build-bench -DCMAKE_BUILD_TYPE=Release -DSTEPGRAPH_TESTS=OFF >/dev/null
cmake --build build-bench -j"$(nproc)" --target bench >/dev/null
CACHE=$(mktemp -d)
LOG=$(mktemp)
trap 'rm -rf "$CACHE" "$LOG"' EXIT
for ((r = 1; r <= ROUNDS; r++)); do
    for s in "$@"; do
        name=${s%%=*} vars=${s#*=}
        env=()
        IFS=, read -ra env <<<"$vars"
        # shellcheck disable=SC2086
        env "${env[@]}" SG_CACHE_DIR="$CACHE" ./build-bench/bench/bench --backend "$BACK" \
            --modes "$MODES" $WORK 2>&1 >/dev/null | awk -v n="$name" -v r="$r" \
            '/^RESULT /{print n, r, $3, $4, $5; fflush()}' | tee -a "$LOG"
    done
done
echo
awk '{k = $3 " " $4; if (!(k in seen)) {seen[k] = 1; keys[++nk] = k}
      if (!(($1) in sn)) {sn[$1] = 1; names[++nn] = $1}
      v[k, $1] = v[k, $1] (v[k, $1] == "" ? "" : " / ") $5}
     END {for (i = 1; i <= nk; i++) {print keys[i];
          for (j = 1; j <= nn; j++) printf "  %-12s %s\n", names[j], v[keys[i], names[j]]}}' "$LOG"
