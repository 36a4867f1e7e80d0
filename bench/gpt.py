#!/usr/bin/env python3
"""dmc vs PyTorch on examples/gpt.dm: loss parity of the first steps, and the memory of a T = 1024 step.

1. Parity (T = 256, the program as written). dmc's initial weights (`dmc run --steps 0 --save`) are loaded,
   converted to PyTorch's layouts, into the same GPT written by hand below (pre-norm blocks
   x + attn(ln(x)), h + mlp(ln(h)); final layernorm; head dense(256) with bias; causal attention) with
   `load_state_dict(strict=True)`. Both train on the same batches: the corpus' next-token windows in file
   order (dmc `--no-shuffle`; sample n = bytes[n*T : n*T+T], labels shifted by one byte; batch k = samples
   k*B .. k*B+B-1), with gpt.dm's train section: AdamW(lr 2e-3, betas (0.9, 0.95), weight_decay 0.01),
   cosine schedule with 30 warmup steps over 900 (PyTorch: SequentialLR(LinearLR, CosineAnnealingLR), docs/LANGUAGE.md), and
   clip_grad_norm_(1.0) before the step. The first 5 losses must agree within 1e-4 (absolute) with
   PyTorch's explicit attention and with its scaled_dot_product_attention, and the step-1 loss (the same
   weights, before any update: the forward alone) within 1e-5; a float64 PyTorch run is the reference that
   says which side is nearer where they do not.
2. Memory (T = 1024, a variant program written to bench/out/gpt/gpt1024.dm, the same batch as gpt.dm):
   PyTorch's peak training memory with (a) plain attention (softmax(q k^T / sqrt(dh)) v, the T x T
   probabilities saved per layer), (b) F.scaled_dot_product_attention(is_causal=True), (c) plain attention
   with torch.utils.checkpoint per block; dmc's planned arena (`dmc plan`) and measured peak (`dmc run`);
   and dmc under a `--vram-cap` below PyTorch's smallest figure (with --no-offload --no-stream, so that
   everything stays in the capped arena: it recomputes instead), training a few steps whose losses are
   compared with PyTorch's from the same weights.
   PyTorch's CPU memory is measured as bench/bench.py does (its helpers are imported from there): each
   configuration in a fresh process, after a throw-away warm-up step of the same configuration and
   malloc_trim; the peak RSS increase (VmHWM over the measured steps, reset via /proc/self/clear_refs, minus
   VmRSS just before the model was built) and the allocator peak (bytes of parameters + optimizer state +
   the peak of the running sum of torch.profiler [memory] events over one more step).

Writes bench/out/gpt.md (the tables, also printed) and bench/out/gpt/results.json; exits 1 when a parity
check fails. Usage: bench/gpt.sh [--mem-steps 3] [--mem-batch 8] [--cap 300MB] [--skip-memory]

On a GPU (`--device cuda`): the same, with dmc on `--device cuda` (a second run with `--cuda-graph`) and
PyTorch on the GPU (fp32, TF32 off for matmul and cuDNN, torch.cuda.synchronize() around each timed step, the
batches on the device before the first). At T = 256 each timed run trains --gpu-steps (30) steps: ms/step is
the median of the steps after the first for dmc (launching kernel by kernel, and with --cuda-graph, whose
losses must be identical), PyTorch plain attention and PyTorch SDPA; the parity is checked on the first 5 as
above (float64 PyTorch on the GPU too). Memory on the GPU: PyTorch's torch.cuda.max_memory_allocated() /
max_memory_reserved() (reset after its warm-up step), dmc's planned arena / measured peak as on the CPU.
`--gpu-quick` (implies --device cuda) is the T = 256 part only (about a minute on an H100;
scripts/gpu-check.sh runs it). Results in bench/out/gpt-cuda.md and bench/out/gpt-cuda/results.json unless
--markdown / --workdir say otherwise. Without a CUDA device PyTorch can see, --device cuda stops at once.
Usage: python3 bench/gpt.py --device cuda [--gpu-quick] [--gpu-steps 30] [--dmc target/release/dmc] [--dry-run]
"""

import argparse
import gc
import json
import math
import os
import platform
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import bench  # noqa: E402  (proc_status, reset_hwm, malloc_trim, cpu_model, git_describe, median_warm)

PROGRAM = "examples/gpt.dm"
CORPUS = "examples/data/corpus.txt"
VOCAB, WIDTH, HIDDEN, HEADS, BLOCKS = 256, 256, 1024, 4, 4
# gpt.dm's train section, which these constants mirror (checked by `check_train_section`)
TRAIN = ("train { batch: 8, optimizer: adamw(lr: 2e-3, betas: (0.9, 0.95), weight_decay: 0.01), "
         "schedule: cosine(warmup: 30, steps: 900, min_lr: 1e-4), clip_norm: 1.0, seed: 1 }")
BATCH = 8
ADAMW = dict(lr=2e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01)
WARMUP, SCHED_STEPS, MIN_LR = 30, 900, 1e-4
CLIP_NORM = 1.0
PARITY_STEPS = 5
PARITY_ATOL = 1e-4   # the first 5 losses, absolute
FORWARD_ATOL = 1e-5  # the step-1 loss: identical weights, the forward alone (float32 rounding: ~1e-6)
MEM_T = 1024
GPU_STEPS = 30       # --device cuda: the steps of each timed run at T = 256 (the parity: their first 5)
GPU_TIMEOUT = 90     # --device cuda: seconds per dmc or PyTorch run (--timeout)


def check_train_section():
    """The PyTorch side hard-codes gpt.dm's optimizer: refuse to compare if the program changed."""
    with open(os.path.join(ROOT, PROGRAM)) as f:
        lines = [l.strip() for l in f if l.startswith("train ")]
    if lines != [TRAIN]:
        sys.exit(f"bench/gpt.py: {PROGRAM}'s train section is {lines}, not the one this bench mirrors "
                 f"({TRAIN}); update ADAMW / WARMUP / SCHED_STEPS / MIN_LR / CLIP_NORM and TRAIN")


# ---------------------------------------------------------------------------------------------------
# The GPT in PyTorch. Parameter names: dmc's layer names, PyTorch's own parameter names inside
# (attention: nn.MultiheadAttention's in_proj_weight / in_proj_bias / out_proj), see to_torch.


def build_model(torch, T, attn_kind, checkpoint, device=None):
    nn = torch.nn
    F = torch.nn.functional

    class PosEmbedding(nn.Module):  # dmc pos_embedding: weight [T, d] added to every sample
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.zeros(T, WIDTH))

        def forward(self, x):
            return x + self.weight

    class Attention(nn.Module):
        """Causal multi-head self-attention with nn.MultiheadAttention's parameters: in_proj_weight [3d, d]
        (= dmc qkv_weight^T; rows: every head's queries, then keys, then values), out_proj = dmc out_weight^T."""

        def __init__(self, mask):
            super().__init__()
            self.in_proj_weight = nn.Parameter(torch.zeros(3 * WIDTH, WIDTH))
            self.in_proj_bias = nn.Parameter(torch.zeros(3 * WIDTH))
            self.out_proj = nn.Linear(WIDTH, WIDTH)
            self.mask = mask  # [T, T] bool, True above the diagonal (shared; not a parameter)

        def forward(self, x):
            B, T_, d = x.shape
            dh = d // HEADS
            qkv = F.linear(x, self.in_proj_weight, self.in_proj_bias)
            q, k, v = (t.view(B, T_, HEADS, dh).transpose(1, 2) for t in qkv.split(d, dim=-1))
            if attn_kind == "sdpa":
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:  # explicit: the [B, H, T, T] scores and probabilities are materialised
                att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(dh))
                att = att.masked_fill(self.mask, float("-inf"))
                att = F.softmax(att, dim=-1)
                y = att @ v
            return self.out_proj(y.transpose(1, 2).reshape(B, T_, d))

    class Block(nn.Module):
        def __init__(self, ln1, attn, ln2, fc1, fc2):
            super().__init__()
            self.ln1, self.attn, self.ln2, self.fc1, self.fc2 = ln1, attn, ln2, fc1, fc2

        def forward(self, x):
            h = x + self.attn(self.ln1(x))
            return h + self.fc2(F.gelu(self.fc1(self.ln2(h))))  # exact (erf) GELU, as dmc's

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            mask = torch.ones(T, T, dtype=torch.bool, device=device).triu(1)
            self.embedding_1 = nn.Embedding(VOCAB, WIDTH)
            self.pos_embedding_1 = PosEmbedding()
            for b in range(1, BLOCKS + 1):  # dmc numbers the layers in program order
                setattr(self, f"layernorm_{2 * b - 1}", nn.LayerNorm(WIDTH))
                setattr(self, f"attention_{b}", Attention(mask))
                setattr(self, f"layernorm_{2 * b}", nn.LayerNorm(WIDTH))
                setattr(self, f"dense_{2 * b - 1}", nn.Linear(WIDTH, HIDDEN))
                setattr(self, f"dense_{2 * b}", nn.Linear(HIDDEN, WIDTH))
            self.layernorm_9 = nn.LayerNorm(WIDTH)
            self.dense_9 = nn.Linear(WIDTH, VOCAB)
            # the blocks as units for checkpointing (same modules: no new parameters)
            self._blocks = [Block(getattr(self, f"layernorm_{2 * b - 1}"), getattr(self, f"attention_{b}"),
                                  getattr(self, f"layernorm_{2 * b}"), getattr(self, f"dense_{2 * b - 1}"),
                                  getattr(self, f"dense_{2 * b}")) for b in range(1, BLOCKS + 1)]

        def forward(self, tokens):
            h = self.pos_embedding_1(self.embedding_1(tokens))
            for blk in self._blocks:
                if checkpoint:
                    from torch.utils.checkpoint import checkpoint as ckpt
                    h = ckpt(blk, h, use_reentrant=False)
                else:
                    h = blk(h)
            return self.dense_9(self.layernorm_9(h))

    return GPT()


def to_torch(name, arr, torch):
    """dmc's (name, array) as PyTorch's (name, tensor): dense [in, out] -> nn.Linear [out, in]; attention
    qkv_weight [d, 3d] -> in_proj_weight [3d, d], out_weight [d, d] -> out_proj.weight (transposed)."""
    t = torch.from_numpy(arr.copy())
    layer, p = name.rsplit(".", 1)
    if layer.startswith("attention_"):
        tn = {"qkv_weight": "in_proj_weight", "qkv_bias": "in_proj_bias",
              "out_weight": "out_proj.weight", "out_bias": "out_proj.bias"}[p]
        return f"{layer}.{tn}", (t.t().contiguous() if t.dim() == 2 else t)
    if layer.startswith("dense_") and p == "weight":
        return name, t.t().contiguous()
    return name, t  # embedding [vocab, dim], pos_embedding [T, d], layernorm weight / bias, biases


def windows(T):
    """The corpus' next-token windows, as dmc makes them from a .txt file: sample n = bytes[n*T : n*T+T],
    its labels bytes[n*T+1 : n*T+T+1], floor((len - 1) / T) samples."""
    import numpy as np
    b = np.frombuffer(open(os.path.join(ROOT, CORPUS), "rb").read(), dtype=np.uint8)
    n = (len(b) - 1) // T
    x = b[:n * T].reshape(n, T).astype(np.int64)
    y = b[1:n * T + 1].reshape(n, T).astype(np.int64)
    return x, y


# ---------------------------------------------------------------------------------------------------
# PyTorch worker: one configuration in a fresh process (bench.py's method), prints one RESULT line.


def worker(a):
    import torch
    from safetensors.numpy import load_file

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    dev = torch.device(a.device or "cpu")
    cuda = dev.type == "cuda"
    if cuda:
        # Full fp32, like dmc's default GEMMs: no TF32 (PyTorch's matmul default is off already, cuDNN's on).
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    mode = a.mode  # plain | sdpa | ckpt (plain attention + checkpoint per block) | f64 (plain, float64)
    attn_kind = "sdpa" if mode == "sdpa" else "plain"
    dtype = torch.float64 if mode == "f64" else torch.float32
    T, B = a.T, a.batch
    xs, ys = windows(T)
    nb = len(xs) // B  # dmc --no-shuffle: every epoch the same batches, a remainder short of a batch dropped
    xs, ys = torch.from_numpy(xs), torch.from_numpy(ys)
    if cuda:
        xs, ys = xs.to(dev), ys.to(dev)  # every batch on the GPU once, outside the timed steps
    init = load_file(a.init)

    def build():
        m = build_model(torch, T, attn_kind, checkpoint=(mode == "ckpt"), device=dev if cuda else None)
        sd = dict(to_torch(k, v, torch) for k, v in init.items())
        m.load_state_dict(sd, strict=True)  # every dmc parameter, exactly PyTorch's set
        m.to(dtype)
        if cuda:
            m.to(dev)
        opt = torch.optim.AdamW(m.parameters(), **ADAMW)
        S = torch.optim.lr_scheduler
        sched = S.SequentialLR(opt, [S.LinearLR(opt, start_factor=1 / WARMUP, end_factor=1.0, total_iters=WARMUP - 1),
                                     S.CosineAnnealingLR(opt, T_max=SCHED_STEPS - WARMUP, eta_min=MIN_LR)],
                               milestones=[WARMUP])
        state = dict(k=0)

        def step():
            k = state["k"] % nb
            state["k"] += 1
            logits = m(xs[k * B:(k + 1) * B])
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), ys[k * B:(k + 1) * B].reshape(-1))
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(m.parameters(), CLIP_NORM)
            opt.step()
            opt.zero_grad(set_to_none=True)
            sched.step()
            return loss, norm

        return m, opt, step

    # Throw-away warm-up of the same configuration (libraries, thread pools, oneDNN caches).
    m, opt, step = build()
    step()[0].item()
    del m, opt, step
    gc.collect()
    bench.malloc_trim()
    if cuda:  # the peak of the measured instance alone: from just before it is built
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()

    rss0 = bench.proc_status("VmRSS")
    m, opt, step = build()
    gc.collect()
    bench.malloc_trim()
    hwm_ok = bench.reset_hwm()
    peak = bench.proc_status("VmHWM")
    losses, norms, times = [], [], []
    for _ in range(a.steps):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss, norm = step()
        lv = loss.item()
        if cuda:
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
        peak = max(peak, bench.proc_status("VmHWM"))
        losses.append(lv)
        norms.append(norm.item())
        del loss, norm
    nparams = sum(p.numel() for p in m.parameters())
    state = sum(v.numel() * v.element_size() for st in opt.state.values() for v in st.values()
                if torch.is_tensor(v) and v.numel() > 1)
    res = dict(mode=mode, T=T, batch=B, threads=a.threads, losses=losses, grad_norms=norms, times_ms=times,
               rss0=rss0, hwm_reset=hwm_ok, rss_peak_increase=peak - rss0, params=nparams,
               param_bytes=nparams * (8 if mode == "f64" else 4), opt_state_bytes=state)
    if cuda:
        res.update(device="cuda", gpu=torch.cuda.get_device_name(dev), torch_cuda=torch.version.cuda,
                   cuda_max_allocated=torch.cuda.max_memory_allocated(dev),
                   cuda_max_reserved=torch.cuda.max_memory_reserved(dev))
        if mode == "sdpa":
            # One more step under torch.profiler (CPU activity: the aten ops): which SDPA kernel ran.
            from torch.profiler import ProfilerActivity, profile
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                step()[0].item()
            res["attention_ops"] = sorted({e.name for e in prof.events() if "scaled_dot_product" in e.name
                                           or "flash_attention" in e.name or "efficient_attention" in e.name})
    elif a.profile:
        # One more step under torch.profiler: the peak of the running sum of the allocator's events.
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            step()[0].item()
        evs = prof.profiler.kineto_results.events()
        mem = sorted((e.start_ns(), e.nbytes()) for e in evs if e.name() == "[memory]")
        cur = top = 0
        for _, nbytes in mem:
            cur += nbytes
            top = max(top, cur)
        res.update(profiler_step_peak=top, profiler_total=res["param_bytes"] + state + top,
                   attention_ops=sorted({e.name() for e in evs if "scaled_dot_product" in e.name()
                                         or "flash_attention" in e.name()}))
    print("RESULT " + json.dumps(res), flush=True)


# ---------------------------------------------------------------------------------------------------
# Driver


def text(b):
    """A TimeoutExpired's captured output (bytes even with text=True, or None) as text."""
    return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")


def sh(cmd, timeout=None, **kw):
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=timeout, **kw)
    except subprocess.TimeoutExpired as e:
        raise SystemExit(f"timed out after {timeout} s: {' '.join(cmd)}\n{text(e.stderr)[-4000:]}")
    if out.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{out.stdout}\n{out.stderr}")
    return out


def dmc_init(dmc, program, path):
    # An explicit --steps 0 saves the initial (untrained) weights (with a warning saying so), as bench.py does.
    sh([dmc, "run", program, "--data", CORPUS, "--steps", "0", "--save", path, "-q", "--device", "cpu"])


def dmc_cmd(dmc, program, wd, tag, init, steps, extra=(), device="cpu"):
    log = os.path.join(wd, f"dmc-{tag}-loss.txt")
    summ = os.path.join(wd, f"dmc-{tag}-summary.json")
    cmd = [dmc, "run", program, "--data", CORPUS, "--init", init, "--steps", str(steps), "--no-shuffle",
           "--loss-log", log, "--summary-json", summ, "--device", device, "-q"] + list(extra)
    return cmd, log, summ


def dmc_run(dmc, program, wd, tag, init, steps, extra=(), device="cpu", timeout=None):
    cmd, log, summ = dmc_cmd(dmc, program, wd, tag, init, steps, extra, device)
    t0 = time.time()
    out = sh(cmd, timeout=timeout)
    s = json.load(open(summ))
    losses, times = [], []
    for line in open(log):
        _, l, ms = line.split()
        losses.append(float(l))
        times.append(float(ms))
    mem = [l for l in out.stdout.splitlines() if l.startswith("memory:")]
    return dict(cmd=" ".join(os.path.relpath(c, ROOT) if c.startswith(ROOT) else c for c in cmd),
                losses=losses, times_ms=times, arena=int(s["planned_arena_bytes"]),
                peak=int(s["measured_peak_bytes"]), memory_line=mem[-1] if mem else "",
                stdout=out.stdout, wall_s=time.time() - t0)


def dmc_plan(dmc, program, extra=()):
    out = sh([dmc, "plan", program] + list(extra)).stdout
    m = re.search(r"arena [\d.]+ \w+ \(([\d,]+) B\)", out)
    lines = [l.strip() for l in out.splitlines()]
    pick = lambda key: next((l for l in lines if l.startswith(key)), "")  # noqa: E731
    return dict(arena=int(m.group(1).replace(",", "")) if m else None, text=out,
                attention=pick("attention:"), recompute=pick("recomputation:"), clip=pick("clip_norm"),
                peak=pick("peak "))


def torch_cmd(mode, T, batch, init, steps, threads, profile, device="cpu"):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--mode", mode, "--T", str(T), "--batch",
           str(batch), "--init", init, "--steps", str(steps), "--threads", str(threads)]
    if profile:
        cmd.append("--profile")
    if device != "cpu":
        cmd += ["--device", device]
    return cmd


def torch_run(mode, T, batch, init, steps, threads, profile, device="cpu", timeout=None):
    cmd = torch_cmd(mode, T, batch, init, steps, threads, profile, device)
    t0 = time.time()
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise SystemExit(f"PyTorch worker timed out after {timeout} s: {' '.join(cmd)}\n{text(e.stderr)[-4000:]}")
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            r = json.loads(line[7:])
            r["wall_s"] = time.time() - t0
            return r
    raise SystemExit(f"PyTorch worker failed: {' '.join(cmd)}\n{out.stdout}\n{out.stderr[-4000:]}")


def mb(b):
    return f"{b / 1e6:,.1f} MB"


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def require_cuda():
    """--device cuda: stop at once, saying why, unless PyTorch sees a CUDA device."""
    try:
        import torch
    except ImportError as e:
        raise SystemExit(f"bench/gpt.py --device cuda: PyTorch is not importable ({e}); it needs PyTorch with "
                         "CUDA, safetensors and numpy (the CPU comparison: bench/gpt.sh)")
    if not torch.cuda.is_available():
        why = ("this PyTorch is built without CUDA" if torch.version.cuda is None else
               f"PyTorch {torch.__version__} (CUDA {torch.version.cuda}) finds no usable CUDA device or driver")
        raise SystemExit(f"bench/gpt.py --device cuda: torch.cuda.is_available() is False: {why}. Run it on a "
                         "machine with an NVIDIA GPU, or without --device cuda / --gpu-quick for the CPU comparison")
    return torch


def memory_runs(a, wd, device="cpu", timeout=None):
    """2. Memory at T = mem_T: dmc's plan and run, PyTorch's three configurations, dmc under a cap below
    PyTorch's smallest figure (CPU: RSS / allocator peak; cuda: max_memory_allocated)."""
    cuda = device == "cuda"
    T, B, n = a.mem_T, a.mem_batch, a.mem_steps
    src = open(os.path.join(ROOT, PROGRAM)).read()
    src, k = re.subn(r"int\[256\]", f"int[{T}]", src)
    assert k == 2, "gpt.dm: expected `int[256]` in its input and its target"
    prog = os.path.join(wd, f"gpt{T}.dm")
    with open(prog, "w") as f:
        f.write(src)
    init_t = os.path.join(wd, f"init{T}.safetensors")
    dmc_init(a.dmc, prog, init_t)
    bx = ["--batch", str(B)]
    mem = dict(T=T, batch=B, steps=n, program=os.path.relpath(prog, ROOT), torch={})
    mem["plan"] = dmc_plan(a.dmc, prog, bx)
    log(f"[gpt] dmc at T {T}, batch {B}: {n} steps ...")
    tag = f"t{T}-mem-cuda" if cuda else f"t{T}"
    mem["dmc"] = dmc_run(a.dmc, prog, wd, tag, init_t, n, bx, device=device, timeout=timeout)
    log(f"[gpt]   {mem['dmc']['memory_line']}")
    for mode in ("plain", "sdpa", "ckpt"):
        if cuda:
            log(f"[gpt] PyTorch ({mode}) at T {T}, batch {B} on cuda: warm-up + {n} steps ...")
            r = torch_run(mode, T, B, init_t, n, a.threads, profile=False, device=device, timeout=timeout)
            log(f"[gpt]   max_memory_allocated {mb(r['cuda_max_allocated'])}, max_memory_reserved "
                f"{mb(r['cuda_max_reserved'])}, losses {' '.join(f'{v:.6f}' for v in r['losses'])}")
        else:
            log(f"[gpt] PyTorch ({mode}) at T {T}, batch {B}: warm-up + {n} steps + 1 profiled ...")
            r = torch_run(mode, T, B, init_t, n, a.threads, profile=True)
            log(f"[gpt]   RSS peak increase {mb(r['rss_peak_increase'])}, allocator peak {mb(r['profiler_total'])}, "
                f"losses {' '.join(f'{v:.6f}' for v in r['losses'])}")
        mem["torch"][mode] = r
    if cuda:
        smallest = min(r["cuda_max_allocated"] for r in mem["torch"].values())
    else:
        smallest = min(min(r["rss_peak_increase"], r["profiler_total"]) for r in mem["torch"].values())
    cap = a.cap or f"{int(smallest * 0.8 / 1e7) * 10}MB"
    mem["smallest_torch"] = smallest
    capx = ["--vram-cap", cap, "--no-offload", "--no-stream"]
    mem["cap"] = cap
    mem["cap_plan"] = dmc_plan(a.dmc, prog, bx + capx)
    # dmc's smallest feasible cap with the same flags: its error message for a 1 MB cap names it
    out = subprocess.run([a.dmc, "plan", prog, "--vram-cap", "1MB", "--no-offload", "--no-stream"] + bx,
                         capture_output=True, text=True, cwd=ROOT)
    m = re.search(r"smallest cap that works is [\d.]+ \w+ \(([\d,]+) bytes\)", out.stdout + out.stderr)
    mem["min_cap"] = int(m.group(1).replace(",", "")) if m else None
    log(f"[gpt] dmc --vram-cap {cap} (below PyTorch's smallest, {mb(smallest)}): {n} steps ...")
    mem["dmc_cap"] = dmc_run(a.dmc, prog, wd, f"{tag}-cap", init_t, n, bx + capx, device=device, timeout=timeout)
    log(f"[gpt]   {mem['dmc_cap']['memory_line']}")
    return mem


def show(cmd):
    return " ".join(os.path.relpath(c, ROOT) if c.startswith(ROOT) else c for c in cmd)


def dry_run(a, wd, device, steps, skip_memory):
    """The commands of a run, none run."""
    init = os.path.join(wd, "init.safetensors")
    print(show([a.dmc, "run", PROGRAM, "--data", CORPUS, "--steps", "0", "--save", init, "-q", "--device", "cpu"]))
    if device == "cuda":
        dmcs = (("t256-cuda", []), ("t256-cuda-graph", ["--cuda-graph"]))
    else:
        dmcs = (("t256", []),)
    for tag, extra in dmcs:
        print(show(dmc_cmd(a.dmc, PROGRAM, wd, tag, init, steps, extra, device)[0]))
    for mode in ("plain", "sdpa", "f64"):
        n = PARITY_STEPS if mode == "f64" else steps
        print(show(torch_cmd(mode, 256, BATCH, init, n, a.threads, False, device)))
    if not skip_memory:
        print(f"(then the memory runs at T = {a.mem_T}, batch {a.mem_batch}: {wd}/gpt{a.mem_T}.dm with dmc on "
              f"--device {device}, PyTorch plain / sdpa / ckpt, and dmc under a --vram-cap below PyTorch's smallest)")
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dmc", default=os.path.join(ROOT, "target", "release", "dmc"))
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--workdir", default=None, help="default bench/out/gpt (--device cuda: bench/out/gpt-cuda)")
    p.add_argument("--markdown", default=None, help="default bench/out/gpt.md (--device cuda: bench/out/gpt-cuda.md)")
    p.add_argument("--mem-T", type=int, default=MEM_T, help="sequence length of the memory runs")
    p.add_argument("--mem-batch", type=int, default=BATCH, help="batch of the memory runs (gpt.dm's: 8)")
    p.add_argument("--mem-steps", type=int, default=3, help="measured steps of each memory run")
    p.add_argument("--cap", default=None, help="dmc's --vram-cap in the memory runs (default: 80%% of PyTorch's "
                   "smallest figure, rounded down to 10 MB)")
    p.add_argument("--skip-memory", action="store_true", help="only the parity at T = 256")
    p.add_argument("--render", metavar="JSON", help="only print the tables of a saved results.json")
    p.add_argument("--device", choices=["cpu", "cuda"], default=None,
                   help="where both sides run: cpu (the default) or cuda (dmc --device cuda, also with --cuda-graph; "
                   "PyTorch on the GPU, fp32 without TF32)")
    p.add_argument("--gpu-quick", action="store_true",
                   help="--device cuda, the T = 256 time per step and parity only (no memory runs; about a minute "
                   "on an H100): what scripts/gpu-check.sh runs")
    p.add_argument("--gpu-steps", type=int, default=GPU_STEPS,
                   help=f"--device cuda: steps of each timed run at T = 256 (default {GPU_STEPS}; the parity: the first "
                   f"{PARITY_STEPS})")
    p.add_argument("--timeout", type=int, default=None,
                   help=f"seconds per dmc or PyTorch run (default: none on the CPU, {GPU_TIMEOUT} on cuda)")
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    # internal: one PyTorch configuration
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--mode", default="plain", help=argparse.SUPPRESS)
    p.add_argument("--T", type=int, default=256, help=argparse.SUPPRESS)
    p.add_argument("--batch", type=int, default=BATCH, help=argparse.SUPPRESS)
    p.add_argument("--init", help=argparse.SUPPRESS)
    p.add_argument("--steps", type=int, default=PARITY_STEPS, help=argparse.SUPPRESS)
    p.add_argument("--profile", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        return worker(a)
    if a.render:
        res = json.load(open(a.render))
        md, ok = render(res)
        print(md)
        return 0 if ok else 1

    device = a.device or ("cuda" if a.gpu_quick else "cpu")
    if a.gpu_quick and device != "cuda":
        p.error("--gpu-quick runs on the GPU: drop --device cpu")
    cuda = device == "cuda"
    if cuda and a.gpu_steps < PARITY_STEPS:
        p.error(f"--gpu-steps must be at least {PARITY_STEPS} (the parity steps)")
    wd = a.workdir or os.path.join(ROOT, "bench", "out", "gpt-cuda" if cuda else "gpt")
    md_path = a.markdown or os.path.join(ROOT, "bench", "out", "gpt-cuda.md" if cuda else "gpt.md")
    skip_memory = a.skip_memory or a.gpu_quick
    timeout = a.timeout if a.timeout is not None else (GPU_TIMEOUT if cuda else None)
    steps = a.gpu_steps if cuda else PARITY_STEPS
    check_train_section()
    if a.dry_run:
        return dry_run(a, wd, device, steps, skip_memory)
    if cuda:
        torch = require_cuda()  # before anything runs
    else:
        import torch
    if not os.path.exists(a.dmc):
        raise SystemExit(f"{a.dmc} not found: run `cargo build --release` first")
    os.makedirs(wd, exist_ok=True)
    t_start = time.time()
    load_start = open("/proc/loadavg").read().split()[:3]
    res = dict(parity={}, memory=None)

    # 1. Parity at T = 256 ------------------------------------------------------------------------
    init = os.path.join(wd, "init.safetensors")
    dmc_init(a.dmc, PROGRAM, init)
    if not cuda:
        log(f"[gpt] dmc: {PARITY_STEPS} steps of {PROGRAM} (T 256, batch {BATCH}, --no-shuffle) ...")
        d = dmc_run(a.dmc, PROGRAM, wd, "t256", init, PARITY_STEPS)
        log(f"[gpt]   {d['memory_line']}")
        res["parity"]["dmc"] = d
        for mode in ("plain", "sdpa", "f64"):
            log(f"[gpt] PyTorch ({mode}): {PARITY_STEPS} steps ...")
            r = torch_run(mode, 256, BATCH, init, PARITY_STEPS, a.threads, profile=False)
            log(f"[gpt]   losses {' '.join(f'{v:.7f}' for v in r['losses'])}")
            res["parity"][mode] = r
    else:
        # On the GPU every run is kept apart: one that fails (or times out) is noted in the tables, the others
        # still run, so that a partial result still says something.
        res.update(device="cuda", steps=steps, quick=a.gpu_quick, errors={})
        for key, tag, extra in (("dmc", "t256-cuda", []), ("dmc_graph", "t256-cuda-graph", ["--cuda-graph"])):
            log(f"[gpt] dmc {' '.join(['--device', 'cuda'] + extra)}: {steps} steps of {PROGRAM} (T 256, batch {BATCH}, "
                "--no-shuffle) ...")
            try:
                d = dmc_run(a.dmc, PROGRAM, wd, tag, init, steps, extra, device="cuda", timeout=timeout)
            except SystemExit as e:
                res["errors"][key] = str(e)[-2000:]
                log(f"[gpt]   FAILED: {res['errors'][key]}")
                continue
            log(f"[gpt]   {bench.median_warm(d['times_ms']):.2f} ms/step; losses "
                f"{' '.join(f'{v:.7f}' for v in d['losses'][:PARITY_STEPS])} ...; {d['memory_line']}")
            res["parity"][key] = d
        for mode in ("plain", "sdpa", "f64"):
            n = PARITY_STEPS if mode == "f64" else steps  # float64: the parity reference only, not timed
            log(f"[gpt] PyTorch ({mode}) on cuda: warm-up + {n} steps ...")
            try:
                r = torch_run(mode, 256, BATCH, init, n, a.threads, profile=False, device="cuda", timeout=timeout)
            except SystemExit as e:
                res["errors"][mode] = str(e)[-2000:]
                log(f"[gpt]   FAILED: {res['errors'][mode]}")
                continue
            log(f"[gpt]   {bench.median_warm(r['times_ms']):.2f} ms/step; losses "
                f"{' '.join(f'{v:.7f}' for v in r['losses'][:PARITY_STEPS])} ...; max_memory_allocated "
                f"{mb(r['cuda_max_allocated'])}")
            res["parity"][mode] = r

    # 2. Memory at T = 1024 -------------------------------------------------------------------------
    if not skip_memory:
        if cuda:
            try:
                res["memory"] = memory_runs(a, wd, device, timeout)
            except SystemExit as e:
                res["errors"]["memory"] = str(e)[-2000:]
                log(f"[gpt]   FAILED: {res['errors']['memory']}")
        else:
            res["memory"] = memory_runs(a, wd)

    res["machine"] = dict(nproc=os.cpu_count(), cpu=bench.cpu_model(), torch=torch.__version__,
                          python=platform.python_version(), threads=a.threads,
                          loadavg_start=" ".join(load_start),
                          loadavg_end=" ".join(open("/proc/loadavg").read().split()[:3]),
                          date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), git=bench.git_describe(),
                          wall_s=round(time.time() - t_start, 1))
    if cuda:
        # the GPU's name as a worker saw it (the driver process itself never touches the GPU)
        gpu = next((r["gpu"] for r in res["parity"].values() if r.get("gpu")), "?")
        res["machine"].update(gpu=gpu, torch_cuda=torch.version.cuda,
                              command=" ".join(["bench/gpt.py"] + sys.argv[1:]))
    with open(os.path.join(wd, "results.json"), "w") as f:
        json.dump(res, f, indent=1)
    md, ok = render(res)
    with open(md_path, "w") as f:
        f.write(md)
    print(md)
    if not ok:
        log("PARITY FAILED: see the tables" if not res.get("errors") else
            f"FAILED: {', '.join(res['errors'])} did not run to the end (see the tables)")
        return 1
    return 0


def render_memory(L, M, ms, device="cpu"):
    """The memory section (appended to L); True when the T = mem_T losses agree."""
    cuda = device == "cuda"
    T, B, ns = M["T"], M["batch"], M["steps"]
    tr = M["torch"]
    L.append(f"## Memory of a training step: T = {T}, batch {B}\n")
    if cuda:
        L.append(f"Program `{M['program']}` (gpt.dm with `int[{T}]`); {ns} measured steps each, from the same "
                 f"initial weights (dmc's, for this T) on the same batches, on the GPU. dmc (`--device cuda`): the "
                 "planned arena and the measured peak of `dmc run` (the device memory the arena took + other "
                 "allocations); PyTorch: `torch.cuda.max_memory_allocated()` / `max_memory_reserved()` over the "
                 "steps (reset after a warm-up run, before the model is built; the CUDA context is in neither).")
        L.append("")
        L.append(f"| configuration | memory (dmc: planned / measured; PyTorch: max allocated / max reserved) | ms/step (median) | losses (steps 1-{ns}) | max \\|diff\\| vs PyTorch plain |")
    else:
        L.append(f"Program `{M['program']}` (gpt.dm with `int[{T}]`); {ns} measured steps each, from the same "
                 f"initial weights (dmc's, for this T) on the same batches. dmc: the planned arena and the "
                 "measured peak of `dmc run` (arena + other allocations); PyTorch: the peak RSS increase over the "
                 "steps (after a warm-up run and malloc_trim) and the allocator peak (parameters + AdamW state + "
                 "the profiler's peak over one step), as bench/bench.py measures the other examples.")
        L.append("")
        L.append(f"| configuration | memory (dmc: planned / measured; PyTorch: peak RSS increase / allocator peak) | ms/step (median) | losses (steps 1-{ns}) | max \\|diff\\| vs PyTorch plain |")
    L.append("|---|---:|---:|---|---:|")
    ref = tr["plain"]["losses"]

    def diff(l):
        k = min(len(l), len(ref))
        return max(abs(x - y) for x, y in zip(l[:k], ref[:k]))

    def row(name, memtxt, r):
        t = f"{ms(r):.2f}" if cuda else f"{ms(r):,.0f}"
        L.append(f"| {name} | {memtxt} | {t} | {' '.join(f'{v:.6f}' for v in r['losses'])} | "
                 f"{diff(r['losses']):.1e} |")

    dm, dc = M["dmc"], M["dmc_cap"]
    row(f"dmc (`dmc plan`: {mb(M['plan']['arena'])})", f"{mb(dm['arena'])} / {mb(dm['peak'])}", dm)
    row(f"dmc `--vram-cap {M['cap']} --no-offload --no-stream`", f"{mb(dc['arena'])} / {mb(dc['peak'])}", dc)
    names = {"plain": "PyTorch, plain attention (softmax(q kᵀ) v)",
             "sdpa": "PyTorch, `F.scaled_dot_product_attention(is_causal=True)`",
             "ckpt": "PyTorch, plain attention + `torch.utils.checkpoint` per block"}
    for mode in ("plain", "sdpa", "ckpt"):
        r = tr[mode]
        if cuda:
            row(names[mode], f"{mb(r['cuda_max_allocated'])} / {mb(r['cuda_max_reserved'])}", r)
        else:
            row(names[mode], f"{mb(r['rss_peak_increase'])} / {mb(r['profiler_total'])}", r)
    L.append("")
    L.append(f"Parameters {tr['plain']['params']:,} ({mb(tr['plain']['param_bytes'])}), AdamW state "
             f"{mb(tr['plain']['opt_state_bytes'])}. PyTorch's smallest figure: {mb(M['smallest_torch'])}; dmc's "
             f"cap {M['cap']} (the arena under it: {mb(dc['arena'])}, "
             f"{dc['arena'] / M['smallest_torch']:.0%} of it)"
             + (f"; the smallest cap dmc plans for with the same flags: {mb(M['min_cap'])} "
                f"({M['min_cap'] / M['smallest_torch']:.0%} of it, not run)." if M.get("min_cap") else "."))
    ops = tr["sdpa"].get("attention_ops")
    if ops:
        L.append(f"PyTorch's SDPA ran as {', '.join('`' + o + '`' for o in ops)}.")
    L.append("")
    L.append("`dmc plan` (no cap): " + "; ".join(x for x in (M["plan"]["peak"], M["plan"]["attention"]) if x) + ".")
    L.append("")
    L.append(f"`dmc plan --vram-cap {M['cap']} --no-offload --no-stream`: "
             + "; ".join(x for x in (M["cap_plan"]["peak"], M["cap_plan"]["recompute"], M["cap_plan"]["clip"]) if x) + ".")
    L.append("")
    for name, r in (("dmc", dm), ("dmc under the cap", dc)):
        L.append(f"{name}: `{r['memory_line']}`")
        L.append("")
    worst = max(diff(dm["losses"]), diff(dc["losses"]))
    good = worst <= PARITY_ATOL
    L.append(f"T = {T} losses, dmc (with and without the cap) vs PyTorch plain: max |diff| {worst:.1e} "
             f"(limit {PARITY_ATOL:g}): **{'ok' if good else 'FAIL'}**.")
    L.append("")
    return good


def render_cuda(res):
    """(markdown, ok) of a --device cuda run: the time per step and the parity at T = 256 (runs that failed
    are named, not fatal here: ok is False), then the memory section if it ran."""
    L = []
    mc = res["machine"]
    P, E = res["parity"], res.get("errors", {})
    steps = res["steps"]
    ms = lambda r: bench.median_warm(r["times_ms"])  # noqa: E731
    L.append("# examples/gpt.dm on the GPU: dmc vs PyTorch\n")
    L.append(f"Machine: {mc.get('gpu', '?')}; {mc['nproc']} cores, {mc['cpu']}; torch {mc['torch']} (CUDA "
             f"{mc.get('torch_cuda', '?')}), Python {mc['python']}; dmc `git describe` {mc['git']}; {mc['date']}; "
             f"the whole bench took {mc['wall_s']:.0f} s.")
    L.append("")
    L.append(f"Command: `{mc.get('command', 'bench/gpt.py --device cuda')}`. fp32 on both sides: dmc's default "
             "GEMMs, PyTorch with TF32 off (`torch.backends.cuda.matmul.allow_tf32 = False`, "
             "`torch.backends.cudnn.allow_tf32 = False`). Same initial weights (dmc's, `strict=True`), same batches "
             "(corpus windows in file order, dmc `--no-shuffle`; PyTorch's on the GPU before the first step), "
             "AdamW + cosine warmup + clip_grad_norm_(1.0).")
    L.append("")
    L.append(f"## Time per step: T = 256, batch {BATCH}, {steps} steps\n")
    L.append(f"ms/step: the median of steps 2-{steps} (dmc: `--loss-log`, each step's wall time, loss read back; "
             "PyTorch: forward + backward + clip + step + `loss.item()`, `torch.cuda.synchronize()` before and after, "
             "after a throw-away warm-up step in the same process). Memory: dmc's planned arena / measured peak; "
             "PyTorch's `torch.cuda.max_memory_allocated()` / `max_memory_reserved()` over the steps.")
    L.append("")
    rows = (("dmc", "dmc `--device cuda` (kernel by kernel)"),
            ("dmc_graph", "dmc `--device cuda --cuda-graph`"),
            ("plain", "PyTorch eager, plain attention (softmax(q kᵀ/√dh) v)"),
            ("sdpa", "PyTorch eager, `F.scaled_dot_product_attention(is_causal=True)`"))
    ref_sdpa = ms(P["sdpa"]) if "sdpa" in P else None
    ref_plain = ms(P["plain"]) if "plain" in P else None
    ratio = lambda x, y: f"{x / y:.2f}x" if y else "-"  # noqa: E731
    L.append("| run | ms/step | / PyTorch SDPA | / PyTorch plain | memory (planned / measured; max allocated / max reserved) |")
    L.append("|---|---:|---:|---:|---:|")
    for key, name in rows:
        r = P.get(key)
        if r is None:
            L.append(f"| {name} | failed | - | - | - |")
            continue
        memtxt = (f"{mb(r['arena'])} / {mb(r['peak'])}" if key.startswith("dmc")
                  else f"{mb(r['cuda_max_allocated'])} / {mb(r['cuda_max_reserved'])}")
        L.append(f"| {name} | {ms(r):.2f} | {ratio(ms(r), ref_sdpa)} | {ratio(ms(r), ref_plain)} | {memtxt} |")
    L.append("")
    ops = P.get("sdpa", {}).get("attention_ops")
    if ops:
        L.append(f"PyTorch's SDPA ran as {', '.join('`' + o + '`' for o in ops)}.")
        L.append("")
    if "dmc" in P:
        L.append(f"dmc: `{P['dmc']['cmd']}`; `{P['dmc']['memory_line']}`")
        L.append("")

    ok = not E
    # Parity ------------------------------------------------------------------------------------------
    L.append(f"## Loss parity: the first {PARITY_STEPS} steps\n")
    cols = [("dmc", "dmc"), ("dmc_graph", "dmc --cuda-graph"), ("plain", "PyTorch plain attention"),
            ("sdpa", "PyTorch SDPA"), ("f64", "PyTorch fp64 (plain)")]
    have = [(k, n) for k, n in cols if k in P]
    if "dmc" in P:
        d = P["dmc"]["losses"]
        head = "| step | " + " | ".join(n for _, n in have)
        head += "".join(f" | dmc − {k}" for k in ("plain", "sdpa", "f64") if k in P) + " |"
        L.append(head)
        L.append("|---:" * (1 + len(have) + sum(k in P for k in ("plain", "sdpa", "f64"))) + "|")
        for i in range(min(PARITY_STEPS, len(d))):
            cells = [f"{P[k]['losses'][i]:.7f}" if len(P[k]["losses"]) > i else "-" for k, _ in have]
            cells += [f"{d[i] - P[k]['losses'][i]:+.1e}" if len(P[k]["losses"]) > i else "-"
                      for k in ("plain", "sdpa", "f64") if k in P]
            L.append(f"| {i + 1} | " + " | ".join(cells) + " |")
        L.append("")
        n = min(PARITY_STEPS, len(d))
        verdicts = []
        for mode in ("plain", "sdpa"):
            if mode not in P:
                continue
            t = P[mode]["losses"]
            worst = max(abs(x - y) for x, y in zip(d[:n], t[:n]))
            first = abs(d[0] - t[0])
            good = worst <= PARITY_ATOL and first <= FORWARD_ATOL and len(t) >= n and n == PARITY_STEPS
            ok = ok and good
            verdicts.append(f"vs PyTorch {mode}: max |diff| over {n} steps {worst:.1e} (limit {PARITY_ATOL:g}), "
                            f"step 1 (forward only) {first:.1e} (limit {FORWARD_ATOL:g}): **{'ok' if good else 'FAIL'}**")
        if "f64" in P and "plain" in P:
            f64 = P["f64"]["losses"]
            dm64 = max(abs(x - y) for x, y in zip(d[:n], f64[:n]))
            pt64 = max(abs(x - y) for x, y in zip(P["plain"]["losses"][:n], f64[:n]))
            verdicts.append(f"distance to PyTorch fp64: dmc {dm64:.1e}, PyTorch fp32 {pt64:.1e}")
        L.append("dmc " + "; ".join(verdicts) + ".")
        L.append("")
        if "dmc_graph" in P:
            g = P["dmc_graph"]["losses"]
            same = g == d
            ok = ok and same
            L.append(f"dmc `--cuda-graph` vs kernel by kernel, all {len(d)} losses: "
                     + ("identical: **ok**." if same else
                        f"**FAIL** (max |diff| {max(abs(x - y) for x, y in zip(g, d)):.1e}; a graph replays the "
                        "same kernels in the same order, so they must be identical)."))
            L.append("")
    else:
        ok = False
        L.append("dmc `--device cuda` failed: no parity.")
        L.append("")
    if E:
        L.append("Failed runs:")
        L.append("")
        for k, msg in E.items():
            tail = " ".join(msg.split())[-600:]
            L.append(f"- {k}: `{tail}`")
        L.append("")

    M = res.get("memory")
    if M:
        ok = render_memory(L, M, ms, "cuda") and ok
    return "\n".join(L), ok


def render(res):
    """(markdown, ok)."""
    if res.get("device") == "cuda":
        return render_cuda(res)
    L = []
    mc = res["machine"]
    L.append(f"# examples/gpt.dm: dmc vs PyTorch\n")
    L.append(f"Machine: {mc['nproc']} cores, {mc['cpu']}; torch {mc['torch']} ({mc['threads']} threads), "
             f"Python {mc['python']}; dmc `git describe` {mc['git']}; {mc['date']}; load average {mc['loadavg_start']} "
             f"at the start, {mc['loadavg_end']} at the end; the whole bench took {mc['wall_s']:.0f} s.")
    L.append("")
    L.append("Command: `bench/gpt.sh` (bench/gpt.py); dmc on the CPU (`--device cpu`).")
    L.append("")
    # Parity
    P = res["parity"]
    d = P["dmc"]["losses"]
    n = min(PARITY_STEPS, len(d))
    L.append(f"## Loss parity: T = 256, batch {BATCH}, the first {PARITY_STEPS} steps\n")
    L.append("Same initial weights (dmc's, `strict=True`), same batches (corpus windows in file order, dmc "
             "`--no-shuffle`), AdamW + cosine warmup + clip_grad_norm_(1.0). `dmc` is "
             f"`{P['dmc']['cmd']}`.")
    L.append("")
    L.append("| step | dmc | PyTorch plain attention | dmc − plain | PyTorch SDPA | dmc − SDPA | PyTorch fp64 (plain) | dmc − fp64 | PyTorch fp32 − fp64 |")
    L.append("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for i in range(n):
        pl, sd, f64 = P["plain"]["losses"][i], P["sdpa"]["losses"][i], P["f64"]["losses"][i]
        L.append(f"| {i + 1} | {d[i]:.7f} | {pl:.7f} | {d[i] - pl:+.1e} | {sd:.7f} | {d[i] - sd:+.1e} | "
                 f"{f64:.7f} | {d[i] - f64:+.1e} | {pl - f64:+.1e} |")
    L.append("")
    ok = True
    verdicts = []
    for mode in ("plain", "sdpa"):
        t = P[mode]["losses"]
        worst = max(abs(x - y) for x, y in zip(d[:n], t[:n]))
        first = abs(d[0] - t[0])
        good = worst <= PARITY_ATOL and first <= FORWARD_ATOL and len(t) >= n and n == PARITY_STEPS
        ok = ok and good
        verdicts.append(f"vs PyTorch {mode}: max |diff| over {n} steps {worst:.1e} (limit {PARITY_ATOL:g}), "
                        f"step 1 (forward only) {first:.1e} (limit {FORWARD_ATOL:g}): **{'ok' if good else 'FAIL'}**")
    dm64 = max(abs(x - y) for x, y in zip(d[:n], P["f64"]["losses"][:n]))
    pt64 = max(abs(x - y) for x, y in zip(P["plain"]["losses"][:n], P["f64"]["losses"][:n]))
    verdicts.append(f"distance to PyTorch fp64: dmc {dm64:.1e}, PyTorch fp32 {pt64:.1e}")
    L.append("dmc " + "; ".join(verdicts) + ".")
    L.append("")
    gn = P["plain"].get("grad_norms", [])
    if gn:
        L.append("Gradient norms before clipping (PyTorch plain): " + ", ".join(f"{g:.3f}" for g in gn[:n])
                 + " (clip_norm 1.0: " + ("every step clips" if all(g > CLIP_NORM for g in gn[:n]) else
                                         "not every step clips") + ").")
        L.append("")
    ms = lambda r: bench.median_warm(r["times_ms"])  # noqa: E731
    L.append(f"Time per step at T = 256 (median after the first): dmc {ms(P['dmc']):,.0f} ms, PyTorch plain "
             f"{ms(P['plain']):,.0f} ms, SDPA {ms(P['sdpa']):,.0f} ms.")
    L.append("")

    M = res.get("memory")
    if M:
        ok = render_memory(L, M, ms) and ok
    return "\n".join(L), ok


if __name__ == "__main__":
    sys.exit(main())
