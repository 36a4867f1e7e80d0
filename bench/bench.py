#!/usr/bin/env python3
"""dmc vs PyTorch, side by side: memory of a training step, time per step, and loss parity.

For each example program (examples/*.dm) this script
  1. writes a seeded data set of exactly one batch (`data.safetensors`, NHWC, tensors named after the
     program's inputs/targets) and dmc's initial weights (`dmc run P --steps 0 --save init.safetensors`);
  2. runs dmc on it (`dmc run P --data ... --init ... --steps N --loss-log ...`): planned arena, measured
     peak, per-step losses and times;
  3. runs the same network, written by hand below in PyTorch (NCHW/OIHW; weights converted from dmc's
     HWIO / [in, out] layouts), from the same weights, on the same data, with the same optimizer, each
     configuration in a fresh subprocess: plain (`zero_grad(set_to_none)` after `step()`), with the
     optimizer step fused into backward (`register_post_accumulate_grad_hook`), and, for deep_convnet,
     with activation checkpointing (`torch.utils.checkpoint.checkpoint_sequential`);
  4. compares: the losses of the first 5 steps must agree to 1e-4 relative.

Because the data set is exactly one batch, every step trains on the same samples (dmc shuffles the
order within the batch; the losses are means, so the order only changes rounding).

Memory (CPU): the increase of the process's peak RSS (VmHWM, reset through /proc/self/clear_refs) from just
before the model is built to the end of the measured steps, after a throw-away warm-up run of the same
configuration (so that libraries, thread pools and oneDNN caches are already resident and excluded) and
malloc_trim. Plus an allocator-level figure: bytes of parameters and optimizer state live before a step +
the peak of the running sum of torch.profiler's [memory] events during one step.
Memory (CUDA): torch.cuda.max_memory_allocated / max_memory_reserved since just before the model is built.

Usage: bench/run.sh [--only mlp,seed] [--device cpu|cuda] [--markdown bench/results-cpu.md]
       (run.sh makes the venv and calls this script; see bench/README.md)
"""

import argparse
import ctypes
import gc
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Per example: program, steps for the benchmark run, the optimizer (hard-coded from the program's `train`
# section), and which PyTorch configurations to run. `steps` >= 5 for the parity check; the big nets get
# fewer (deep_convnet is ~6 s/step in dmc on 2 cores).
EXAMPLES = {
    "mlp": dict(file="examples/mlp.dm", steps=200, modes=["plain", "fused"],
                # train { batch: 64, optimizer: sgd(lr: 0.01, momentum: 0.9) }
                opt=("sgd", dict(lr=0.01, momentum=0.9))),
    "resnet_small": dict(file="examples/resnet_small.dm", steps=200, modes=["plain", "fused"],
                         # train { batch: 8, optimizer: adam(lr: 1e-3) }
                         opt=("adam", dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8))),
    "seed": dict(file="examples/seed.dm", steps=8, modes=["plain", "fused"],
                 # train { batch: 1, optimizer: sgd(lr: 0.01) }
                 opt=("sgd", dict(lr=0.01))),
    # dmc_cap: also run dmc under this --vram-cap (rematerialization, issue 5), the counterpart of PyTorch's
    # checkpointing; 306MB is half of deep_convnet's no-remat arena.
    "deep_convnet": dict(file="examples/deep_convnet.dm", steps=5, modes=["plain", "fused", "ckpt"], dmc_cap="306MB",
                         # train { batch: 32, optimizer: sgd(lr: 0.01, momentum: 0.9, weight_decay: 5e-4) }
                         opt=("sgd", dict(lr=0.01, momentum=0.9, weight_decay=5e-4))),
}
PARITY_STEPS = 5
PARITY_RTOL = 1e-4
DATA_SEED = 1234

# ---------------------------------------------------------------------------------------------------
# /proc helpers (Linux)


def proc_status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def reset_hwm():
    """Resets VmHWM (peak RSS) to the current RSS; False where the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def malloc_trim():
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


# ---------------------------------------------------------------------------------------------------
# The four networks, by hand, in PyTorch. Module attribute names are dmc's layer names, so a parameter
# `conv2d_3.weight` in dmc's weight file is `conv2d_3.weight` here (layout converted by `to_torch`).


def build_model(name, torch):
    nn = torch.nn
    F = torch.nn.functional

    def conv(cin, cout):
        # dmc: 3x3, stride 1, padding 'same' (TF-style; for an odd kernel at stride 1 it is symmetric).
        return nn.Conv2d(cin, cout, 3, stride=1, padding=1, bias=True)

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.hidden1 = nn.Linear(784, 256)
            self.hidden2 = nn.Linear(256, 128)
            self.classifier = nn.Linear(128, 10)

        def forward(self, x):
            return self.classifier(F.relu(self.hidden2(F.relu(self.hidden1(x)))))

    class ResNetSmall(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = conv(3, 16)
            for i in range(1, 7):
                setattr(self, f"conv2d_{i}", conv(16, 16))
            self.dense_1 = nn.Linear(16, 10)

        def forward(self, x):
            h = F.relu(self.stem(x))
            for b in range(3):
                c1 = getattr(self, f"conv2d_{2 * b + 1}")
                c2 = getattr(self, f"conv2d_{2 * b + 2}")
                h = F.relu(h + c2(F.relu(c1(h))))
            return self.dense_1(h.mean(dim=(2, 3)))

    class Block(nn.Module):  # conv2d(64, 3) |> relu, one checkpointable unit
        def __init__(self, conv_):
            super().__init__()
            self.conv = conv_

        def forward(self, x):
            return F.relu(self.conv(x))

    class DeepConvnet(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = conv(3, 64)
            for i in range(1, 17):
                setattr(self, f"conv2d_{i}", conv(64, 64))
            self.dense_1 = nn.Linear(64, 10)
            self.checkpoint_segments = 0  # > 0: torch.utils.checkpoint over the 16 blocks

        def forward(self, x):
            h = F.relu(self.stem(x))
            blocks = nn.Sequential(*[Block(getattr(self, f"conv2d_{i}")) for i in range(1, 17)])
            if self.checkpoint_segments:
                from torch.utils.checkpoint import checkpoint_sequential
                h = checkpoint_sequential(blocks, self.checkpoint_segments, h, use_reentrant=False)
            else:
                h = blocks(h)
            return self.dense_1(h.mean(dim=(2, 3)))

    class Seed(nn.Module):
        # The question's Keras model: no activations, 'same' 3x3 convs, 'valid' 2x2 max pools.
        def __init__(self):
            super().__init__()
            chans = [1, 256, 512] + [1024] * 22 + [256, 32]
            for i in range(1, 27):
                setattr(self, f"conv2d_{i}", conv(chans[i - 1], chans[i]))
            self.dense_1 = nn.Linear(32, 4)
            self.dense_2 = nn.Linear(4, 1)

        def forward(self, x):
            c = lambda i, h: getattr(self, f"conv2d_{i}")(h)  # noqa: E731
            h = F.max_pool2d(c(1, x), 2)
            h = F.max_pool2d(c(2, h), 2)
            for i in range(3, 25):
                h = c(i, h)
            h = F.max_pool2d(h, 2)
            h = F.max_pool2d(c(26, c(25, h)), 2)
            h = h.permute(0, 2, 3, 1).flatten(1)  # dmc flattens NHWC
            return self.dense_2(self.dense_1(h))

    return {"mlp": MLP, "resnet_small": ResNetSmall, "deep_convnet": DeepConvnet, "seed": Seed}[name]()


# Program inputs/targets: (input name, per-sample shape NHWC), (target name, kind)
IO = {
    "mlp": (("image", (784,)), ("label", 10)),
    "resnet_small": (("image", (16, 16, 3)), ("label", 10)),
    "deep_convnet": (("image", (64, 64, 3)), ("label", 10)),
    "seed": (("x", (16, 16, 1)), ("y", None)),  # mse target [1]
}
LOSS = {"mlp": "ce", "resnet_small": "ce", "deep_convnet": "ce", "seed": "mse"}


def to_torch(name, arr, torch):
    """A dmc weight (HWIO conv / [in, out] dense / bias) as the PyTorch parameter (OIHW / [out, in])."""
    t = torch.from_numpy(arr.copy())
    if t.dim() == 4:
        return t.permute(3, 2, 0, 1).contiguous()
    if t.dim() == 2:
        return t.t().contiguous()
    return t


def make_data(example, batch, path):
    import numpy as np
    from safetensors.numpy import save_file

    (xin, shape), (tname, classes) = IO[example]
    rng = np.random.default_rng(DATA_SEED)
    x = rng.random((batch,) + shape, dtype=np.float32)
    if classes is None:
        t = rng.standard_normal((batch, 1)).astype(np.float32)
    else:
        t = rng.integers(0, classes, size=(batch,), dtype=np.int32)
    save_file({xin: x, tname: t}, path)


def program_batch(dmc, file):
    out = subprocess.run([dmc, "summary", "--json", file], capture_output=True, text=True, check=True)
    js = json.loads(out.stdout)
    for key in ("batch",):
        if key in js:
            return int(js[key])
    m = re.search(r'"batch"\s*:\s*(\d+)', out.stdout)
    if m:
        return int(m.group(1))
    raise SystemExit(f"cannot find the batch size in `dmc summary --json {file}`")


# ---------------------------------------------------------------------------------------------------
# PyTorch worker: one configuration in a fresh process, prints one JSON line.


def worker(a):
    import numpy as np
    import torch
    from safetensors.numpy import load_file

    threads = a.threads or os.cpu_count()
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    if cuda:
        # Full fp32, like dmc: cuDNN convolutions default to TF32 on Ampere+, which breaks a 1e-4 parity.
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
    ex = a.example
    cfg = EXAMPLES[ex]
    data = load_file(os.path.join(a.workdir, "data.safetensors"))
    init = load_file(os.path.join(a.workdir, "init.safetensors"))
    (xin, _), (tname, _) = IO[ex]
    x = torch.from_numpy(data[xin])
    if x.dim() == 4:
        x = x.permute(0, 3, 1, 2).contiguous()  # NHWC -> NCHW, once, outside the timed steps
    x = x.to(dev)
    t = data[tname]
    t = torch.from_numpy(t.astype(np.int64) if t.dtype == np.int32 else t).to(dev)
    lossfn = torch.nn.functional.cross_entropy if LOSS[ex] == "ce" else torch.nn.functional.mse_loss
    kind, hp = cfg["opt"]

    def make_opt(params):
        if kind == "sgd":
            return torch.optim.SGD(params, **hp)
        return torch.optim.Adam(params, **hp)

    def build():
        m = build_model(ex, torch)
        sd = {k: to_torch(k, v, torch) for k, v in init.items()}
        m.load_state_dict(sd, strict=True)  # every dmc parameter, exactly the PyTorch set
        m.to(dev)
        if a.mode == "ckpt":
            m.checkpoint_segments = 4
        if a.mode == "fused":
            # The optimizer step inside backward: each parameter is updated, and its gradient freed,
            # as soon as its gradient is complete (PyTorch's "optimizer step in backward" recipe).
            opts = {p: make_opt([p]) for p in m.parameters()}

            def hook(p):
                opts[p].step()
                opts[p].zero_grad(set_to_none=True)

            # (the handles let the warm-up instance be freed: a hook held by C++ is invisible to gc)
            m.hook_handles = [p.register_post_accumulate_grad_hook(hook) for p in m.parameters()]

            def step():
                loss = lossfn(m(x), t)
                loss.backward()
                return loss

            return m, list(opts.values()), step
        opt = make_opt(m.parameters())

        def step():
            loss = lossfn(m(x), t)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss

        return m, [opt], step

    def sync():
        if cuda:
            torch.cuda.synchronize()

    # Throw-away warm-up of the same configuration: loads libraries, JIT kernels, thread pools.
    m, opts, step = build()
    for _ in range(1):
        step().item()
    for h in getattr(m, "hook_handles", []):
        h.remove()
    del m, opts, step
    gc.collect()
    malloc_trim()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()

    rss0 = proc_status("VmRSS")
    m, opts, step = build()
    # The peak is taken over the steps only: building the model (PyTorch's own init, then the copy of
    # dmc's weights) briefly holds two copies of the parameters, which is not part of a training step.
    gc.collect()
    malloc_trim()
    hwm_ok = reset_hwm()
    peak = proc_status("VmHWM")
    losses, times, step_incr = [], [], []
    for i in range(a.steps):
        rss_b = proc_status("VmRSS")
        reset_hwm()
        sync()
        t0 = time.perf_counter()
        loss = step()
        lv = loss.item()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
        hwm = proc_status("VmHWM")
        peak = max(peak, hwm)
        step_incr.append(hwm - rss_b)
        losses.append(lv)
        del loss
    res = dict(example=ex, mode=a.mode, device=a.device, threads=threads, torch=torch.__version__,
               losses=losses, times_ms=times, rss0=rss0, hwm_reset=hwm_ok,
               rss_peak_increase=peak - rss0, step_rss_increase_max=max(step_incr[1:] or step_incr))
    # Bytes live between steps: parameters + optimizer state.
    nparams = sum(p.numel() for p in m.parameters())
    state = 0
    for o in opts:
        for st in o.state.values():
            for v in st.values():
                if torch.is_tensor(v) and v.numel() > 1:
                    state += v.numel() * v.element_size()
    res.update(params=nparams, param_bytes=nparams * 4, opt_state_bytes=state)
    if cuda:
        res.update(cuda_max_allocated=torch.cuda.max_memory_allocated(),
                   cuda_max_reserved=torch.cuda.max_memory_reserved())
    elif a.profile:
        # One more step under torch.profiler: peak of the running sum of allocations during the step.
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            step().item()
        evs = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                     if e.name() == "[memory]")
        cur = top = 0
        for _, nb in evs:
            cur += nb
            top = max(top, cur)
        res.update(profiler_step_peak=top, profiler_total=nparams * 4 + state + top)
    print("RESULT " + json.dumps(res), flush=True)


# ---------------------------------------------------------------------------------------------------
# Driver


def run_dmc(dmc, file, workdir, steps, device, extra):
    log = os.path.join(workdir, "dmc-loss.txt")
    summary = os.path.join(workdir, "dmc-summary.json")
    cmd = [dmc, "run", file, "--data", os.path.join(workdir, "data.safetensors"),
           "--init", os.path.join(workdir, "init.safetensors"), "--steps", str(steps),
           "--loss-log", log, "--summary-json", summary, "--device", device, "-q"] + extra
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if out.returncode != 0:
        raise SystemExit(f"dmc failed: {' '.join(cmd)}\n{out.stdout}\n{out.stderr}")
    with open(summary) as f:
        s = json.load(f)
    losses, times = [], []
    with open(log) as f:
        for line in f:
            _, l, ms = line.split()
            losses.append(float(l))
            times.append(float(ms))
    return dict(cmd=cmd, line=out.stdout.strip(), mean_ms=float(s["ms_per_step"]),
                arena=int(s["planned_arena_bytes"]), peak=int(s["measured_peak_bytes"]),
                losses=losses, times_ms=times)


def run_worker(example, mode, workdir, steps, device, threads, profile):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--example", example, "--mode", mode,
           "--workdir", workdir, "--steps", str(steps), "--device", device, "--threads", str(threads)]
    if profile:
        cmd.append("--profile")
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise SystemExit(f"PyTorch worker failed: {' '.join(cmd)}\n{out.stdout}\n{out.stderr[-4000:]}")


def median_warm(times):
    warm = times[1:] if len(times) > 1 else times  # step 1 is the warm-up (first touch, caches)
    return statistics.median(warm)


def max_rel_diff(a, b, n):
    n = min(n, len(a), len(b))
    return max(abs(x - y) / max(abs(y), 1e-30) for x, y in zip(a[:n], b[:n])) if n else float("nan")


def mb(b):
    return f"{b / 1e6:,.1f} MB"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default=",".join(EXAMPLES), help="comma-separated examples")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--dmc", default=os.path.join(ROOT, "target", "release", "dmc"))
    p.add_argument("--dmc-device", default=None, help="--device passed to dmc (default: --device)")
    p.add_argument("--steps", type=int, default=None, help="override every example's step count")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--workdir", default=os.path.join(ROOT, "bench", "out"))
    p.add_argument("--markdown", default=None, help="write the tables here (default: <workdir>/results-<device>.md)")
    p.add_argument("--no-profile", action="store_true", help="skip the torch.profiler step")
    p.add_argument("--render", metavar="JSON", help="only print the tables of a saved results-<device>.json")
    # internal: one PyTorch configuration
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--example", help=argparse.SUPPRESS)
    p.add_argument("--mode", default="plain", help=argparse.SUPPRESS)
    p.add_argument("--profile", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        return worker(a)

    if a.render:
        with open(a.render) as f:
            saved = json.load(f)
        print(render(saved["results"], saved["machine"], a))
        return 0
    import torch  # only for the version line
    if not os.path.exists(a.dmc):
        raise SystemExit(f"{a.dmc} not found: run `cargo build --release` first")
    results = []
    load_start = open("/proc/loadavg").read().split()[:3]
    for ex in [e for e in a.only.split(",") if e]:
        cfg = EXAMPLES[ex]
        steps = a.steps or cfg["steps"]
        wd = os.path.join(a.workdir, ex)
        os.makedirs(wd, exist_ok=True)
        file = cfg["file"]
        batch = program_batch(a.dmc, os.path.join(ROOT, file))
        make_data(ex, batch, os.path.join(wd, "data.safetensors"))
        subprocess.run([a.dmc, "run", file, "--steps", "0", "--save", os.path.join(wd, "init.safetensors"),
                        "-q", "--device", "cpu"], check=True, capture_output=True, cwd=ROOT)
        print(f"[{ex}] dmc: {steps} steps ...", file=sys.stderr, flush=True)
        d = run_dmc(a.dmc, file, wd, steps, a.dmc_device or a.device, [])
        print(f"[{ex}]   {d['line']}", file=sys.stderr, flush=True)
        row = dict(example=ex, file=file, batch=batch, steps=steps, dmc=d, torch={})
        if cfg.get("dmc_cap"):
            print(f"[{ex}] dmc --vram-cap {cfg['dmc_cap']}: {steps} steps ...", file=sys.stderr, flush=True)
            dc = run_dmc(a.dmc, file, wd, steps, a.dmc_device or a.device, ["--vram-cap", cfg["dmc_cap"]])
            dc["cap"] = cfg["dmc_cap"]
            print(f"[{ex}]   {dc['line']}", file=sys.stderr, flush=True)
            row["dmc_cap"] = dc
        for mode in cfg["modes"]:
            print(f"[{ex}] PyTorch ({mode}) ...", file=sys.stderr, flush=True)
            r = run_worker(ex, mode, wd, steps, a.device, a.threads, profile=not a.no_profile)
            r["parity"] = max_rel_diff(d["losses"], r["losses"], PARITY_STEPS)
            if "dmc_cap" in row:
                r["parity_cap"] = max_rel_diff(row["dmc_cap"]["losses"], r["losses"], PARITY_STEPS)
            print(f"[{ex}]   median {median_warm(r['times_ms']):.1f} ms/step, RSS peak increase "
                  f"{mb(r['rss_peak_increase'])}, loss parity {r['parity']:.2e}", file=sys.stderr, flush=True)
            row["torch"][mode] = r
        results.append(row)
        with open(os.path.join(wd, "result.json"), "w") as f:
            json.dump(row, f, indent=1)

    machine = dict(nproc=os.cpu_count(), cpu=cpu_model(), torch=torch.__version__,
                   python=platform.python_version(), threads=a.threads, device=a.device,
                   loadavg_start=" ".join(load_start), loadavg_end=" ".join(open("/proc/loadavg").read().split()[:3]),
                   date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), git=git_describe())
    if a.device == "cuda":
        machine["gpu"] = torch.cuda.get_device_name(0)
    md = render(results, machine, a)
    path = a.markdown or os.path.join(a.workdir, f"results-{a.device}.md")
    with open(path, "w") as f:
        f.write(md)
    with open(os.path.join(a.workdir, f"results-{a.device}.json"), "w") as f:
        json.dump(dict(machine=machine, results=results), f, indent=1)
    print(md)
    bad = [(r["example"], m) for r in results for m, t in r["torch"].items()
           if not (t["parity"] <= PARITY_RTOL and t.get("parity_cap", 0.0) <= PARITY_RTOL)]
    if bad:
        print(f"PARITY FAILED (> {PARITY_RTOL} relative over the first {PARITY_STEPS} losses): {bad}",
              file=sys.stderr)
        return 1
    return 0


def render(results, machine, a):
    dev = machine["device"]
    L = []
    L.append(f"Machine: {machine['nproc']} cores, {machine['cpu']}"
             + (f", GPU {machine['gpu']}" if "gpu" in machine else "")
             + f"; torch {machine['torch']} ({machine['threads']} threads), Python {machine['python']}; "
             f"dmc at {os.path.relpath(a.dmc, ROOT)} (`git describe`: {machine.get('git') or git_describe()}); {machine['date']}; "
             f"load average (1/5/15 min) {machine['loadavg_start']} at the start, {machine['loadavg_end']} at the end.")
    L.append("")
    L.append(f"Command: `bench/run.sh --device {dev}"
             + (f" --dmc-device {a.dmc_device}" if getattr(a, "dmc_device", None) else "")
             + (f" --only {a.only}" if a.only != ",".join(EXAMPLES) else "")
             + (f" --steps {a.steps}" if getattr(a, "steps", None) else "") + "`")
    L.append("")
    # Memory table
    if dev == "cpu":
        L.append("| example | batch | params (4 B each) | dmc planned arena | dmc measured peak | PyTorch peak RSS increase | "
                 "PyTorch allocator peak (profiler) | PyTorch + optimizer in backward (RSS / profiler) | "
                 "PyTorch + checkpointing (RSS / profiler) | dmc + remat under a cap (planned / measured) |")
    else:
        L.append("| example | batch | params (4 B each) | dmc planned arena | dmc measured peak | PyTorch max allocated / reserved | "
                 "+ optimizer in backward (allocated / reserved) | + checkpointing (allocated / reserved) | "
                 "dmc + remat under a cap (planned / measured) |")
    L.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|" if dev == "cpu" else "|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        t = r["torch"]
        pl = t["plain"]

        def cpu_pair(m):
            if m not in t:
                return "—"
            x = t[m]
            s = mb(x["rss_peak_increase"])
            if "profiler_total" in x:
                s += " / " + mb(x["profiler_total"])
            return s

        def cuda_pair(m):
            if m not in t:
                return "—"
            x = t[m]
            return f"{mb(x['cuda_max_allocated'])} / {mb(x['cuda_max_reserved'])}"

        head = (f"| {r['example']} | {r['batch']} | {pl['params']:,} ({mb(pl['param_bytes'])}) | "
                f"{mb(r['dmc']['arena'])} | {mb(r['dmc']['peak'])} | ")
        capcol = (f"`--vram-cap {r['dmc_cap']['cap']}`: {mb(r['dmc_cap']['arena'])} / {mb(r['dmc_cap']['peak'])}"
                  if "dmc_cap" in r else "—")
        if dev == "cpu":
            L.append(head + f"{mb(pl['rss_peak_increase'])} | "
                     + (mb(pl["profiler_total"]) if "profiler_total" in pl else "—")
                     + f" | {cpu_pair('fused')} | {cpu_pair('ckpt')} | {capcol} |")
        else:
            L.append(head + f"{cuda_pair('plain')} | {cuda_pair('fused')} | {cuda_pair('ckpt')} | {capcol} |")
    L.append("")
    # Time + parity table
    L.append("| example | steps | dmc ms/step (median) | PyTorch ms/step (median) | dmc / PyTorch | "
             "fastest step: dmc / PyTorch | "
             "PyTorch + opt. in backward ms/step | PyTorch + checkpointing ms/step | dmc + remat under a cap ms/step | "
             f"loss parity (max rel. diff, first {PARITY_STEPS} steps) | dmc losses (steps 1-{PARITY_STEPS}) |")
    L.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|")
    for r in results:
        t = r["torch"]
        dm = median_warm(r["dmc"]["times_ms"])
        tp = median_warm(t["plain"]["times_ms"])
        opt = lambda m: f"{median_warm(t[m]['times_ms']):,.1f}" if m in t else "—"  # noqa: E731
        par = ", ".join(f"{m} {t[m]['parity']:.1e}" for m in t)
        ok = all(t[m]["parity"] <= PARITY_RTOL for m in t)
        if "dmc_cap" in r:
            pc = max(t[m].get("parity_cap", float("nan")) for m in t)
            par += f"; dmc under the cap vs PyTorch {pc:.1e}"
            ok = ok and pc <= PARITY_RTOL
        capt = f"{median_warm(r['dmc_cap']['times_ms']):,.1f}" if "dmc_cap" in r else "—"
        losses = " ".join(f"{v:.6g}" for v in r["dmc"]["losses"][:PARITY_STEPS])
        dmin = min(r["dmc"]["times_ms"][1:] or r["dmc"]["times_ms"])
        tmin = min(t["plain"]["times_ms"][1:] or t["plain"]["times_ms"])
        L.append(f"| {r['example']} | {r['steps']} | {dm:,.1f} | {tp:,.1f} | **{dm / tp:.2f}x** | "
                 f"{dmin:,.1f} / {tmin:,.1f} = {dmin / tmin:.2f}x | {opt('fused')} | "
                 f"{opt('ckpt')} | {capt} | {'ok' if ok else 'FAIL'}: {par} | {losses} |")
    L.append("")
    return "\n".join(L)


def git_describe():
    try:
        return subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True,
                              cwd=ROOT).stdout.strip() or "?"
    except OSError:
        return "?"


if __name__ == "__main__":
    sys.exit(main())
