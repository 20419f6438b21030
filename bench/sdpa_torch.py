#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""
sdpa_torch.py -- torch's scaled_dot_product_attention (causal, bf16) forward and
backward at GPT-2's attention shapes, per backend (flash, cuDNN, memory-efficient),
timed with CUDA events: the figures that ATTENTION's kernels (graphs/cuda/k_attn.cu,
k_attn_bwd.cu) are measured against. q, k and v are views of one (B, T, 3H, D)
projection, as GPT-2 makes them. One line per (T, backend):
    torch SDPA <backend> B4 H12 T<T> D64 causal bf16: fwd <us> us, bwd <us> us
Usage: python3 bench/sdpa_torch.py [--iters 50] [--T 512,1024]
"""
import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def timed(fn, iters):
    for _ in range(5):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(3):
        torch.cuda.synchronize()
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) * 1e3 / iters)
    return best


def one(T, backend, iters, B=4, H=12, D=64):
    torch.manual_seed(0)
    qkv = torch.randn(B, T, 3 * H, D, device="cuda", dtype=torch.bfloat16)
    q, k, v = (qkv[:, :, j * H:(j + 1) * H].transpose(1, 2).requires_grad_() for j in range(3))
    dout = torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16)
    with sdpa_kernel([backend]):
        fwd = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), iters)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        bwd = timed(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True), iters)
    return fwd, bwd


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--T", default="512,1024")
    a = ap.parse_args()
    names = {SDPBackend.FLASH_ATTENTION: "flash", SDPBackend.CUDNN_ATTENTION: "cudnn",
             SDPBackend.EFFICIENT_ATTENTION: "efficient"}
    for T in (int(t) for t in a.T.split(",")):
        for be, name in names.items():
            try:
                f, b = one(T, be, a.iters)
                print(f"torch SDPA {name:9s} B4 H12 T{T} D64 causal bf16: fwd {f:7.2f} us, "
                      f"bwd {b:7.2f} us")
            except RuntimeError as e:
                print(f"torch SDPA {name:9s} T{T}: not available ({str(e).splitlines()[0]})")


if __name__ == "__main__":
    main()
