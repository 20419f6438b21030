#!/bin/sh
# SPDX-License-Identifier: MIT
# test_bench_w6.sh -- bench's W6 (the GPT-2 training step) on the CPU, in
# eager and reduce-overhead, with --check: the losses of steps 1..20 it
# writes start at ln V (the seeded init's logits are near zero, so the
# softmax is near uniform), fall as the model learns the fixed batch, and
# agree between the two modes step by step.
#   test_bench_w6.sh path/to/bench
set -eu
BENCH=$1
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
"$BENCH" --backend cpu --modes eager,reduce-overhead --check "$DIR" w6 >"$DIR/table" 2>"$DIR/log" ||
    { cat "$DIR/log"; exit 1; }
fail=0
for m in eager reduce-overhead; do
    f=$DIR/W6_stepgraph_$m.loss
    if ! awk -v m="$m" '{
            lnv = log(512); ok = NF == 20 && ($1 - lnv < 1e-2) && (lnv - $1 < 1e-2) && $20 < $1 - 0.3
            for (i = 2; i <= NF; i++) ok = ok && $i < $(i - 1)
            printf "W6_LOSSES(mode=%s,steps=%d) step1 %.6f (ln V %.6f) step20 %.6f: %s\n",
                   m, NF, $1, lnv, $20, ok ? "ok" : "FAIL"
            exit !ok }' "$f"; then
        fail=1
    fi
done
# the two modes follow one curve (f32 on the CPU: rounding only)
paste -d' ' "$DIR/W6_stepgraph_eager.loss" "$DIR/W6_stepgraph_reduce-overhead.loss" | awk '{
    n = NF / 2; worst = 0
    for (i = 1; i <= n; i++) { d = $i - $(i + n); d = d < 0 ? -d : d; if (d / $(i + n) > worst) worst = d / $(i + n) }
    printf "W6_MODES(eager vs reduce-overhead,steps=%d) worst relative difference %.2e: %s\n",
           n, worst, n == 20 && worst <= 1e-4 ? "ok" : "FAIL"
    exit !(n == 20 && worst <= 1e-4) }' || fail=1
exit $fail
