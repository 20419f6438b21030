#!/bin/sh
# SPDX-License-Identifier: MIT
# test_bench_w6_torch.sh -- bench's W6 and torch_ref.py's W6 twin are the same
# training step: both run on the CPU from one checkpoint, and the losses of
# steps 1..20 that their --check writes agree
#  - in f32 (both sides' default on the CPU) within 1e-5 (relative);
#  - in bf16 with f32 master weights (bench --w6-dtype bf16, torch_ref.py
#    --w6-recipe bf16: CUDA's recipe on both sides) within 2e-3.
# The checkpoint, written here, is the one that tells the step's details
# apart: a vocabulary padded in wte (V 500 of 512 rows, the tied LM head
# over the first V), three layers, and weights at 10x GPT-2's init so that
# the global grad norm is near 10 and the clip to 1.0 scales every step (at
# GPT-2's init it stays near 1). Needs python3 with torch: exit 77
# (skipped) without it.
#   test_bench_w6_torch.sh path/to/bench path/to/torch_ref.py
set -eu
BENCH=$1
REF=$2
python3 -c 'import torch' 2>/dev/null || { echo "W6_TWIN: no torch for python3: skipped"; exit 77; }
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
# an llm.c f32 checkpoint (maxT 64, V 500, L 3, NH 4, C 64, Vp 512), GPT-2's init x 10
python3 - "$REF" "$DIR/ck.bin" <<'EOF'
import math, os, sys
import torch
sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[1])))
import torch_ref as R
maxT, V, L, NH, C, Vp = 64, 500, 3, 4, 64, 512
g = torch.Generator().manual_seed(20240326)
flat = []
for name, shape in zip(R.LLMC_PARAMS, R.llmc_shapes(maxT, L, C, Vp)):
    sd = {"wte": 0.2, "wpe": 0.2, "qkvw": 0.2, "fcw": 0.2,
          "attprojw": 0.2 / math.sqrt(2 * L), "fcprojw": 0.2 / math.sqrt(2 * L)}.get(name)
    t = torch.randn(shape, generator=g) * sd if sd else \
        (torch.ones(shape) if name in ("ln1w", "ln2w", "lnfw") else torch.zeros(shape))
    if name == "wte":
        t[V:] = 0
    flat.append(t.reshape(-1))
h = torch.zeros(256, dtype=torch.int32)
h[:8] = torch.tensor([20240326, 3, maxT, V, L, NH, C, Vp], dtype=torch.int32)
with open(sys.argv[2], "wb") as f:
    f.write(bytes(h.view(torch.uint8).tolist()) + bytes(torch.cat(flat).view(torch.uint8).tolist()))
EOF
# compare NAME TOL [bench flag] [torch_ref flags]: one run of each, their 20 losses
compare() {
    name=$1 tol=$2 bflag=$3
    shift 3
    mkdir -p "$DIR/$name"
    # shellcheck disable=SC2086
    "$BENCH" --backend cpu --modes eager --gpt2 "$DIR/ck.bin" --check "$DIR/$name" $bflag w6 \
        >"$DIR/$name/table" 2>"$DIR/$name/log" || { cat "$DIR/$name/log"; return 1; }
    python3 "$REF" --device cpu --modes eager --gpt2 "$DIR/ck.bin" --check "$DIR/$name" "$@" w6 \
        >"$DIR/$name/ttable" 2>"$DIR/$name/tlog" || { cat "$DIR/$name/tlog"; return 1; }
    paste -d' ' "$DIR/$name/W6_stepgraph_eager.loss" "$DIR/$name/W6_torch_eager.loss" |
        awk -v name="$name" -v tol="$tol" '{
        n = NF / 2; worst = 0; at = 0
        for (i = 1; i <= n; i++) {
            d = $i - $(i + n); d = d < 0 ? -d : d; d /= $(i + n)
            if (d > worst) { worst = d; at = i }
        }
        ok = n == 20 && worst <= tol && $n < $1 - 1
        printf "W6_TWIN(%s,cpu,L=3,V=500,Vp=512,init_x10,steps=%d) step1 %.6f/%.6f", name, n,
               $1, $(1 + n)
        printf " step20 %.6f/%.6f worst relative difference %.2e at step %d (tolerance %g): %s\n",
               $n, $(2 * n), worst, at, tol, ok ? "ok" : "FAIL"
        exit !ok }'
}
fail=0
compare f32 1e-5 "" || fail=1
compare bf16 2e-3 "--w6-dtype bf16" --w6-recipe bf16 || fail=1
exit $fail
