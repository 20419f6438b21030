# SPDX-License-Identifier: MIT
"""ddp_torch.py -- W6 data parallel in PyTorch: GPT-2 small's training step
(llm.c's: forward over B x T tokens, cross-entropy, backward, clipping to 1.0,
AdamW with betas 0.9/0.95 and weight decay 0.1 on the matrices) under
DistributedDataParallel, bf16 autocast, fused AdamW, one process per GPU,
launched by torchrun:

    torchrun --standalone --nproc_per_node=2 bench/ddp_torch.py [--mode reduce-overhead]

--mode eager|default|reduce-overhead|max-autotune (torch.compile's modes of
the model; eager: none). Each rank trains on its own B rows of synthetic
tokens; rank 0 prints one line per step and a RESULT line with the median
step time of the steps after the warm-up, as bench/run-ddp.sh reads it.
"""
import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F


class Block(torch.nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.NH = NH
        self.ln1, self.ln2 = torch.nn.LayerNorm(C), torch.nn.LayerNorm(C)
        self.qkv, self.proj = torch.nn.Linear(C, 3 * C), torch.nn.Linear(C, C)
        self.fc, self.fcproj = torch.nn.Linear(C, 4 * C), torch.nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.NH, C // self.NH).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT2(torch.nn.Module):
    def __init__(self, L=12, C=768, NH=12, V=50257, Vp=50304, maxT=1024):
        super().__init__()
        self.V = V
        self.wte, self.wpe = torch.nn.Embedding(Vp, C), torch.nn.Embedding(maxT, C)
        self.blocks = torch.nn.ModuleList(Block(C, NH) for _ in range(L))
        self.lnf = torch.nn.LayerNorm(C)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        logits = F.linear(self.lnf(x), self.wte.weight[: self.V])  # tied head
        return F.cross_entropy(logits.float().view(-1, self.V), targets.view(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", default="reduce-overhead")
    ap.add_argument("-b", type=int, default=4)
    ap.add_argument("-t", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    a = ap.parse_args()
    dist.init_process_group("nccl")
    rank, local = dist.get_rank(), int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    torch.manual_seed(42)
    model = GPT2().to(dev)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local],
                                                    gradient_as_bucket_view=True)
    decay = [p for p in model.parameters() if p.dim() == 2]
    rest = [p for p in model.parameters() if p.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": rest, "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    fwd = ddp if a.mode == "eager" else torch.compile(ddp, mode=a.mode)
    g = torch.Generator(device=dev).manual_seed(1000 + rank)
    idx = torch.randint(0, 50257, (a.b, a.t + 1), device=dev, generator=g)
    x, y = idx[:, :-1].contiguous(), idx[:, 1:].contiguous()
    times = []
    for s in range(a.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fwd(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) * 1e3
        if s >= a.warmup:
            times.append(ms)
        if rank == 0:
            print(f"step {s + 1}/{a.steps}: loss {loss.item():.4f} ({ms:.2f} ms)", flush=True)
    if rank == 0:
        n = dist.get_world_size()
        med = statistics.median(times)
        print(f"RESULT torch-ddp mode={a.mode} gpus={n} B={a.b} T={a.t} step_ms={med:.2f} "
              f"tok_s={n * a.b * a.t / med * 1e3:.0f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
