# SPDX-License-Identifier: MIT
"""torch_ref.py -- the reference workloads in PyTorch, timed as bench.c times
stepgraph: a host loop of `steps` steps synchronized at the end, median of 5
loops, after 3 warm-up calls (their wall time is first_s: compile, autotune,
graph recording) and 20 untimed steps. One line per figure starts with
RESULT, for bench/run.sh. The workloads are specified in bench/README.md.

    python3 bench/torch_ref.py [--modes eager,default,reduce-overhead,max-autotune]
                               [--device cuda|cpu] [--gpt2 FILE] [--check DIR]
                               [--full] [--w6-recipe autocast|bf16|f32]
                               [--w6-warmup N] [--infer-dtype bf16|f32]
                               [w1s w1l w2 w3 w4 w5 w6]

W3 and W5 run GPT-2 with the weights of the llm.c checkpoint --gpt2 FILE, the
one bench.c wrote (bench --gpt2 FILE, as run.sh does), so that both run the
same weights: bf16 on CUDA, f32 on the CPU. The inputs are bench.c's: W3
decodes from token 50256 (mod V) at position 0, each timed loop starting
there again; W5 prefills 4 x T tokens, token (b, t) = (7919 b + 104729 t)
mod V, T = 512 (min(512, maxT / 4) for a smaller checkpoint). --check DIR
writes W3's 32 greedy tokens and their logits and W5's last-position logits
as bench.c does, for table.py --check; with --infer-dtype f32 on CUDA, W3
and W5 run in f32 and those files are named MODE-f32 (an f32 reference:
table.py --check DIR --ref eager-f32).

W6 trains GPT-2 from the same checkpoint on bench.c's fixed batch (4 x
min(1024, maxT) tokens of its bigram stream) as llm.c's train_gpt2.py does:
f32 parameters, the forward and the loss under bf16 autocast on CUDA (f32 on
the CPU), backward, clip_grad_norm_ 1.0 and AdamW (fused on CUDA; betas
0.9/0.95, eps 1e-8, lr 3e-4, weight decay 0.1 on the 2-d parameters, none
on the rest); torch.compile compiles the model's forward and loss (its
backward through AOTAutograd), the clip and the optimizer run eagerly.
--check writes the losses of steps 1..20 from the init (with --w6-warmup N,
step s at lr 3e-4 min(1, s / N), as bench --w6-warmup N). --w6-recipe picks
the twin's precision on CUDA: autocast (the default, above); bf16, the
recipe of stepgraph's step and of llm.c's C trainer (bf16 parameters,
activations and gradients; f32 master weights that AdamW updates and that
are rounded back into the parameters after each step; the clip over the
master gradients, f32 copies of the bf16 ones; the loss in f32), on the
CPU too when asked; f32: no autocast. bench/RESULTS.md's figures and
timings are the default's; bench/NOTES.md ("W6's losses against the
twin") has each recipe's losses beside stepgraph's.

The decode step follows gpt-fast: the compiled function takes the token and
the position as tensors and returns the logits and the greedy next token;
the KV caches are module buffers written in place with index_copy_; the
next token and position are set outside the compiled function (two small
eager ops per step), so that cudagraphs keep to static inputs. stepgraph's
step advances both on the device, inside its graph.
"""
import argparse
import math
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F


def w1(y):
    for _ in range(6):
        y = torch.tanh(torch.sin(y) * 1.01 + 0.1)
    return y


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(1024, 1024) for _ in range(8))

    def forward(self, h):
        for layer in self.layers:
            h = torch.nn.functional.gelu(layer(h), approximate="tanh")
        return h


# ---------------------------------------------------------------- GPT-2

# llm.c's parameter order; L-prefixed shapes hold every layer's tensor.
LLMC_PARAMS = ["wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
               "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"]


def llmc_shapes(maxT, L, C, Vp):
    return [(Vp, C), (maxT, C), (L, C), (L, C), (L, 3 * C, C), (L, 3 * C), (L, C, C), (L, C),
            (L, C), (L, C), (L, 4 * C, C), (L, 4 * C), (L, C, 4 * C), (L, C), (C,), (C,)]


def load_llmc(path):
    """An llm.c checkpoint: (config dict, {name: tensor on the CPU})."""
    with open(path, "rb") as f:
        data = f.read()
    h = torch.frombuffer(bytearray(data[:1024]), dtype=torch.int32).tolist()
    magic, version, maxT, V, L, NH, C, Vp = h[:8]
    if magic != 20240326 or version not in (3, 5):
        raise ValueError(f"{path}: not an llm.c GPT-2 checkpoint (magic {magic}, version {version})")
    flat = torch.frombuffer(bytearray(data[1024:]),
                            dtype=torch.float32 if version == 3 else torch.bfloat16)
    params, off = {}, 0
    for name, shape in zip(LLMC_PARAMS, llmc_shapes(maxT, L, C, Vp)):
        n = math.prod(shape)
        params[name] = flat[off:off + n].view(shape)
        off += n
    if off != flat.numel():
        raise ValueError(f"{path}: {flat.numel()} values, the header asks for {off}")
    return dict(maxT=maxT, V=V, L=L, NH=NH, C=C, Vp=Vp), params


def block(m, x, NH, attend):
    """One GPT-2 block over m's twelve tensors (llm.c's names) on x (B, T, C);
    attend(q, k, v), each (B, NH, T, C / NH), gives the attention's output."""
    B, T, C = x.shape
    h = F.layer_norm(x, (C,), m.ln1w, m.ln1b, 1e-5)
    q, k, v = F.linear(h, m.qkvw, m.qkvb).split(C, dim=2)
    q, k, v = (t.view(B, T, NH, C // NH).transpose(1, 2) for t in (q, k, v))
    y = attend(q, k, v)
    x = x + F.linear(y.transpose(1, 2).reshape(B, T, C), m.attprojw, m.attprojb)
    h = F.layer_norm(x, (C,), m.ln2w, m.ln2b, 1e-5)
    h = F.gelu(F.linear(h, m.fcw, m.fcb), approximate="tanh")
    return x + F.linear(h, m.fcprojw, m.fcprojb)


def causal(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def lm_head(m, x, V):
    """The final LayerNorm and the tied LM head over wte's first V rows."""
    C = x.shape[-1]
    return F.linear(F.layer_norm(x, (C,), m.lnfw, m.lnfb, 1e-5), m.wte[:V])


class Block(torch.nn.Module):
    def __init__(self, p, l, NH, B, S, dtype, dev):
        super().__init__()
        for name in LLMC_PARAMS[2:14]:
            self.register_buffer(name, p[name][l].to(dev, dtype))
        C = self.ln1w.numel()
        self.NH = NH
        self.register_buffer("k_cache", torch.zeros(B, NH, S, C // NH, dtype=dtype, device=dev))
        self.register_buffer("v_cache", torch.zeros(B, NH, S, C // NH, dtype=dtype, device=dev))

    def forward(self, x, pos, mask):
        """x (B, T, C) at positions pos (T); mask None: causal prefill from 0,
        else (S) bool: decode over the cache."""

        def attend(q, k, v):
            self.k_cache.index_copy_(2, pos, k)
            self.v_cache.index_copy_(2, pos, v)
            if mask is None:
                return causal(q, k, v)
            return F.scaled_dot_product_attention(q, self.k_cache, self.v_cache, attn_mask=mask)

        return block(self, x, self.NH, attend)


class GPT2(torch.nn.Module):
    """GPT-2 inference with a KV cache of S slots for B rows; the tied LM head
    over wte's first V rows."""

    def __init__(self, cfg, p, B, S, dtype, dev):
        super().__init__()
        self.V = cfg["V"]
        for name in ("wte", "wpe", "lnfw", "lnfb"):
            self.register_buffer(name, p[name].to(dev, dtype))
        self.blocks = torch.nn.ModuleList(
            Block(p, l, cfg["NH"], B, S, dtype, dev) for l in range(cfg["L"]))
        self.register_buffer("slots", torch.arange(S, device=dev))

    def head(self, x):
        return lm_head(self, x, self.V)

    def prefill(self, tokens):
        """tokens (B, T) -> logits (B, T, V); K, V into slots 0 .. T-1."""
        T = tokens.shape[1]
        pos = self.slots[:T]
        x = self.wte[tokens] + self.wpe[:T]
        for blk in self.blocks:
            x = blk(x, pos, None)
        return self.head(x)

    def decode(self, token, pos):
        """token (B), pos (1) -> logits (B, V), greedy next token (B)."""
        x = (self.wte[token] + self.wpe[pos]).unsqueeze(1)
        mask = (self.slots <= pos).view(1, 1, 1, -1)  # (1, 1, 1, S): sdpa wants >= 2 dims
        for blk in self.blocks:
            x = blk(x, pos, mask)
        logits = self.head(x).squeeze(1)
        return logits, logits.argmax(-1)


class Decode:
    """W3's state: one step decodes one token; rewind goes back to position 0."""

    def __init__(self, model, start, dev):
        self.model, self.start = model, start
        self.token = torch.full((1,), start, dtype=torch.long, device=dev)
        self.pos = torch.zeros(1, dtype=torch.long, device=dev)

    def rewind(self):
        self.token.fill_(self.start)
        self.pos.zero_()

    def make(self, mode):
        f = self.model.decode if mode == "eager" else torch.compile(self.model.decode, mode=mode)

        def step():
            logits, nxt = f(self.token, self.pos)
            self.token.copy_(nxt)
            self.pos.add_(1)
            return logits

        return step


# ---------------------------------------------------------------- W4: MLP training


def lcg_values(n, scale, state):
    """bench.c's w4_values: n values scale * U(-1, 1) of the 32-bit LCG, as an
    f32 tensor computed as bench.c does (U exact in f32, one f32 multiply by
    the f32 scale); state is a one-element list holding the seed, advanced."""
    s, out = state[0], [0.0] * n
    for i in range(n):
        s = (s * 1664525 + 1013904223) & 0xFFFFFFFF
        out[i] = float(s >> 8) / 16777216.0 * 2.0 - 1.0
    state[0] = s
    return torch.tensor(out, dtype=torch.float32) * torch.tensor(scale, dtype=torch.float32)


class W4:
    """bench.c's W4 on the same init and data: MLP 784 -> H -> H -> 10, ReLU,
    cross-entropy, backward, AdamW (torch's defaults; fused on CUDA)."""

    def __init__(self, hidden, dev):
        dims, state = [784, hidden, hidden, 10], [4444]
        self.init = []
        for l in range(3):
            one = torch.tensor(1.0, dtype=torch.float32)  # 1.0f / sqrtf(fan_in), in f32
            bound = float(one / torch.sqrt(torch.tensor(float(dims[l]), dtype=torch.float32)))
            w = lcg_values(dims[l + 1] * dims[l], bound, state)
            b = lcg_values(dims[l + 1], bound, state)
            self.init += [w.view(dims[l + 1], dims[l]), b]
        self.x = lcg_values(128 * 784, 1.0, state).view(128, 784).to(dev)
        self.y = torch.tensor([(7 * i) % 10 for i in range(128)], dtype=torch.long, device=dev)
        self.dev = dev
        self.reset()

    def reset(self):
        self.p = [t.clone().to(self.dev).requires_grad_(True) for t in self.init]
        self.opt = torch.optim.AdamW(self.p, lr=1e-3, fused=self.dev == "cuda")

    def loss(self):
        w1, b1, w2, b2, w3, b3 = self.p
        h = F.relu(F.linear(self.x, w1, b1))
        h = F.relu(F.linear(h, w2, b2))
        return F.cross_entropy(F.linear(h, w3, b3), self.y)

    def make(self, mode):
        self.reset()

        def train_step():
            loss = self.loss()
            loss.backward()
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            return loss.detach()

        return train_step if mode == "eager" else torch.compile(train_step, mode=mode)


def check_w4(w4, mode, check):
    step = w4.make(mode)
    mark = mode in ("reduce-overhead", "max-autotune")
    losses = []
    for s in range(1, 51):
        loss = step_marked(step, mark)
        if s in (1, 10, 50):
            losses.append(float(loss.item()))
    with open(os.path.join(check, f"W4_torch_{mode}.loss"), "w") as f:
        f.write(" ".join(f"{v:.9g}" for v in losses) + "\n")


# ---------------------------------------------------------------- W6: GPT-2 training


def w6_batch(V, T):
    """bench.c's w6_batch: 4 T + 1 tokens of the bigram stream (prev = (37 prev
    + 11 + (s >> 30)) mod min(V, 256), s the 32-bit LCG from 6666); inputs
    token b T + t, targets the next one, each (4, T)."""
    s, prev, out = 6666, 0, []
    for _ in range(4 * T + 1):
        s = (s * 1664525 + 1013904223) & 0xFFFFFFFF
        prev = (37 * prev + 11 + (s >> 30)) % min(V, 256)
        out.append(prev)
    t = torch.tensor(out, dtype=torch.long)
    return t[:-1].view(4, T), t[1:].view(4, T)


class TrainGPT2(torch.nn.Module):
    """GPT-2 to train: f32 parameters, one per llm.c tensor and layer, from the
    checkpoint; forward(tokens, targets) is the mean cross-entropy of every
    position, as llm.c's train_gpt2.py computes it (under autocast the loss
    is taken in f32)."""

    def __init__(self, cfg, p, dev, dtype=torch.float32):
        super().__init__()
        self.V, self.NH = cfg["V"], cfg["NH"]
        # copies: .to() on the CPU would share the checkpoint's storage
        own = lambda t: torch.nn.Parameter(t.to(dev, dtype, copy=True))
        for name in ("wte", "wpe", "lnfw", "lnfb"):
            setattr(self, name, own(p[name]))
        self.layers = torch.nn.ModuleList(torch.nn.Module() for _ in range(cfg["L"]))
        for l, m in enumerate(self.layers):
            for name in LLMC_PARAMS[2:14]:
                setattr(m, name, own(p[name][l]))

    def load(self, p):
        """Put the checkpoint's values back, in place (compiled graphs keep
        the parameters' addresses)."""
        with torch.no_grad():
            for name in ("wte", "wpe", "lnfw", "lnfb"):
                getattr(self, name).copy_(p[name])
            for l, m in enumerate(self.layers):
                for name in LLMC_PARAMS[2:14]:
                    getattr(m, name).copy_(p[name][l])

    def forward(self, tokens, targets):
        T = tokens.shape[1]
        x = self.wte[tokens] + self.wpe[:T]
        for m in self.layers:
            x = block(m, x, self.NH, causal)
        logits = lm_head(self, x, self.V)
        return F.cross_entropy(logits.view(-1, self.V).float(), targets.view(-1))


class W6:
    """bench.c's W6 on the same checkpoint and batch: one step is forward and
    loss, backward, clip to 1.0, AdamW; in the precision of recipe on CUDA
    (autocast, bf16 with f32 master weights, or f32); on the CPU f32 unless
    recipe is bf16."""

    def __init__(self, cfg, params, dev, recipe="autocast"):
        T = min(1024, cfg["maxT"])
        self.x, self.y = (t.to(dev) for t in w6_batch(cfg["V"], T))
        self.params, self.dev = params, dev
        self.recipe = recipe if dev == "cuda" or recipe == "bf16" else "f32"
        dtype = torch.bfloat16 if self.recipe == "bf16" else torch.float32
        self.model = TrainGPT2(cfg, params, dev, dtype)
        self.master = None

    def reset(self):
        """The checkpoint's weights and a fresh AdamW (over f32 master copies
        of the bf16 parameters in the bf16 recipe)."""
        self.model.load(self.params)
        ps = list(self.model.parameters())
        if self.recipe == "bf16":
            self.master = [p.detach().float() for p in ps]
            ps = self.master
        groups = [{"params": [p for p in ps if p.dim() == 2], "weight_decay": 0.1},
                  {"params": [p for p in ps if p.dim() != 2], "weight_decay": 0.0}]
        self.opt = torch.optim.AdamW(groups, lr=3e-4, betas=(0.9, 0.95), eps=1e-8,
                                     fused=self.dev == "cuda")

    def make(self, mode):
        self.reset()
        f = self.model if mode == "eager" else torch.compile(self.model, mode=mode)
        params = list(self.model.parameters())

        def train_step():
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.recipe == "autocast"):
                loss = f(self.x, self.y)
            loss.backward()
            if self.master is None:
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                self.opt.step()
                self.opt.zero_grad(set_to_none=True)
                return loss.detach()
            for m, p in zip(self.master, params):
                m.grad, p.grad = p.grad.float(), None
            torch.nn.utils.clip_grad_norm_(self.master, 1.0)
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            with torch.no_grad():
                torch._foreach_copy_(params, self.master)
            return loss.detach()

        return train_step


def check_w6(w6, step, mark, mode, check, warmup=0):
    """The losses of steps 1..20 from the init, through the step already made
    (no new compile); with warmup, step s's lr is 3e-4 min(1, s / warmup), as
    bench --w6-warmup's."""
    w6.reset()
    losses = []
    for s in range(1, 21):
        for g in w6.opt.param_groups:
            g["lr"] = 3e-4 * min(1.0, s / warmup) if warmup > 0 else 3e-4
        losses.append(float(step_marked(step, mark).item()))
    with open(os.path.join(check, f"W6_torch_{mode}.loss"), "w") as f:
        f.write(" ".join(f"{v:.9g}" for v in losses) + "\n")


def w5_tokens(V, T, dev):
    b = torch.arange(4).view(4, 1)
    t = torch.arange(T).view(1, T)
    return ((7919 * b + 104729 * t) % V).to(dev)


# ---------------------------------------------------------------- timing


def sync(dev):
    if dev == "cuda":
        torch.cuda.synchronize()


def step_marked(step, mark):
    if mark:
        torch.compiler.cudagraph_mark_step_begin()
    return step()


def bench(make, mode, steps, dev, rewind=None, loops=5):
    """make(mode) -> a function running one step; rewind (or None) puts the
    state back before each loop, untimed."""
    torch._dynamo.reset()
    step = make(mode)
    mark = mode in ("reduce-overhead", "max-autotune")

    def run(n):
        if rewind:
            rewind()
        for _ in range(n):
            step_marked(step, mark)

    sync(dev)
    if dev == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    run(3)
    sync(dev)
    first = time.perf_counter() - t0
    run(min(20, steps))
    per = []
    for _ in range(loops):
        if rewind:
            rewind()
        sync(dev)
        t0 = time.perf_counter()
        for _ in range(steps):
            step_marked(step, mark)
        sync(dev)
        per.append((time.perf_counter() - t0) / steps * 1e6)
    peak = torch.cuda.max_memory_allocated() if dev == "cuda" else 0
    return statistics.median(per), first, peak, step


def f32_bytes(t):
    """A tensor's values as f32 bytes in row-major order (numpy when there)."""
    t = t.float().cpu().contiguous()
    try:
        return t.numpy().tobytes()
    except (ImportError, RuntimeError):
        return bytes(t.view(-1).view(torch.uint8).tolist())


CHECK_SUFFIX = ""  # "-f32" under --infer-dtype f32 on CUDA: the check files of an f32 reference


def write_check(check, name, mode, logits_rows, tokens=None):
    mode += CHECK_SUFFIX
    with open(os.path.join(check, f"{name}_torch_{mode}.f32"), "wb") as f:
        for r in logits_rows:
            f.write(f32_bytes(r))
    if tokens is not None:
        with open(os.path.join(check, f"{name}_torch_{mode}.tokens"), "w") as f:
            f.write(" ".join(str(t) for t in tokens) + "\n")


def check_w3(dec, step, mark, check, mode, steps=32):
    dec.rewind()
    rows, toks = [], []
    for _ in range(steps):
        logits = step_marked(step, mark)
        rows.append(logits.clone())
        toks.append(int(dec.token.item()))
    write_check(check, "W3", mode, rows, toks)


def check_w5(step, mark, check, mode):
    logits = step_marked(step, mark)
    write_check(check, "W5", mode, [logits[:, -1, :].clone()])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--modes", default="eager,default,reduce-overhead,max-autotune")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--gpt2", help="llm.c checkpoint for W3/W5/W6 (bench --gpt2 FILE writes it)")
    ap.add_argument("--check", help="directory for W3/W4/W5/W6 outputs (table.py --check)")
    ap.add_argument("--full", action="store_true", help="W4 at its full width on the CPU too")
    ap.add_argument("--w6-recipe", default="autocast", choices=["autocast", "bf16", "f32"],
                    help="W6's precision (default autocast; on the CPU f32 unless bf16)")
    ap.add_argument("--infer-dtype", choices=["bf16", "f32"],
                    help="W3/W5's precision (default bf16 on CUDA, f32 on the CPU); f32 on CUDA "
                         "names the check files MODE-f32, a reference for table.py --check --ref")
    ap.add_argument("--w6-warmup", type=int, default=0,
                    help="W6's --check steps warm the lr up linearly over N steps (default 0)")
    ap.add_argument("work", nargs="*", help="w1s w1l w2 w3 w4 w5 w6 (default: all)")
    args = ap.parse_args()
    works = ["w1s", "w1l", "w2", "w3", "w4", "w5", "w6"]
    args.work = args.work or works
    for w in args.work:
        if w not in works:
            ap.error(f"unknown workload '{w}'")
    torch.manual_seed(0)
    dev = args.device
    gpu = dev == "cuda"
    cases = []  # (name, make(mode) -> step, steps, rewind, check(step, mark, mode) or None)

    def fn_case(name, fn, x, steps=200):
        make = lambda mode: (lambda f: (lambda: f(x)))(fn if mode == "eager" else torch.compile(fn, mode=mode))
        cases.append((name, make, steps, None, None))

    if "w1s" in args.work:
        fn_case("W1s", w1, torch.randn(4096, device=dev))
    if "w1l" in args.work:
        fn_case("W1l", w1, torch.randn(16 << 20, device=dev), 200 if gpu else 5)
    if "w2" in args.work:
        dt = torch.bfloat16 if gpu else torch.float32
        fn_case("W2", MLP().to(dev, dt).eval(), torch.randn(1, 1024, device=dev, dtype=dt))
    if "w3" in args.work or "w5" in args.work or "w6" in args.work:
        if not args.gpt2 or not os.path.exists(args.gpt2):
            sys.exit("torch_ref: W3/W5/W6 need --gpt2 FILE, the checkpoint bench --gpt2 FILE writes")
        cfg, params = load_llmc(args.gpt2)
        dt = torch.bfloat16 if gpu else torch.float32
        if args.infer_dtype:
            dt = torch.bfloat16 if args.infer_dtype == "bf16" else torch.float32
            global CHECK_SUFFIX
            CHECK_SUFFIX = "-f32" if gpu and dt == torch.float32 else ""
        print(f"GPT-2 from {args.gpt2}: {cfg}", file=sys.stderr)
    if "w3" in args.work:
        model = GPT2(cfg, params, 1, cfg["maxT"], dt, dev).eval()
        dec = Decode(model, 50256 % cfg["V"], dev)
        chk = (lambda step, mark, mode: check_w3(dec, step, mark, args.check, mode)) if args.check else None
        cases.append(("W3", dec.make, 200 if gpu else 20, dec.rewind, chk))
    if "w5" in args.work:
        T = 512 if cfg["maxT"] >= 512 else cfg["maxT"] // 4
        model5 = GPT2(cfg, params, 4, T, dt, dev).eval()
        tokens = w5_tokens(cfg["V"], T, dev)
        make5 = lambda mode: (lambda f: (lambda: f(tokens)))(
            model5.prefill if mode == "eager" else torch.compile(model5.prefill, mode=mode))
        chk = (lambda step, mark, mode: check_w5(step, mark, args.check, mode)) if args.check else None
        cases.append(("W5", make5, 200 if gpu else 3, None, chk))
    where = torch.cuda.get_device_name() if gpu else "the CPU"
    print(f"torch {torch.__version__} on {where}")
    with torch.inference_mode():
        for name, make, steps, rewind, chk in cases:
            for mode in args.modes.split(","):
                print(f"torch_ref: {name} {mode}", file=sys.stderr, flush=True)
                try:
                    us, first, peak, step = bench(make, mode, steps, dev, rewind)
                    if chk:
                        chk(step, mode in ("reduce-overhead", "max-autotune"), mode)
                except Exception as e:  # a failed mode is reported, not fatal
                    print(f"{name} {mode}: failed: {e}", file=sys.stderr)
                    continue
                print(f"| {name:4} | {mode:16} | {us:10.1f} us | first {first:7.2f} s | peak {peak / 2**20:8.1f} MiB |")
                print(f"RESULT torch {name} {mode} {us:.2f} {first:.4f} {peak}", file=sys.stderr, flush=True)
    if "w4" in args.work:  # training: outside inference_mode
        w4 = W4(1024 if gpu or args.full else 128, dev)
        for mode in args.modes.split(","):
            print(f"torch_ref: W4 {mode}", file=sys.stderr, flush=True)
            try:
                us, first, peak, step = bench(w4.make, mode, 200 if gpu else 5, dev,
                                              loops=5 if gpu else 3)
                if args.check:
                    check_w4(w4, mode, args.check)
            except Exception as e:  # a failed mode is reported, not fatal
                print(f"W4 {mode}: failed: {e}", file=sys.stderr)
                continue
            print(f"| W4   | {mode:16} | {us:10.1f} us | first {first:7.2f} s | peak {peak / 2**20:8.1f} MiB |")
            print(f"RESULT torch W4 {mode} {us:.2f} {first:.4f} {peak}", file=sys.stderr, flush=True)
    if "w6" in args.work:  # training: outside inference_mode; a step is 10 ms or more
        w6 = W6(cfg, params, dev, args.w6_recipe)
        for mode in args.modes.split(","):
            print(f"torch_ref: W6 {mode}", file=sys.stderr, flush=True)
            try:
                us, first, peak, step = bench(w6.make, mode, 10 if gpu else 3, dev, loops=3)
                if args.check:
                    check_w6(w6, step, mode in ("reduce-overhead", "max-autotune"), mode, args.check,
                             args.w6_warmup)
            except Exception as e:  # a failed mode is reported, not fatal
                print(f"W6 {mode}: failed: {e}", file=sys.stderr)
                continue
            print(f"| W6   | {mode:16} | {us:10.1f} us | first {first:7.2f} s | peak {peak / 2**20:8.1f} MiB |")
            print(f"RESULT torch W6 {mode} {us:.2f} {first:.4f} {peak}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
