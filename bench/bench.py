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
import itertools
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
                         opt=("sgd", dict(lr=0.001, momentum=0.9, weight_decay=5e-4))),
    # Batch normalisation (issue 15): the running statistics after the run are compared too.
    "bn_cnn": dict(file="examples/bn_cnn.dm", steps=50, modes=["plain", "fused"],
                   # train { batch: 8, optimizer: sgd(lr: 0.05, momentum: 0.9) }
                   opt=("sgd", dict(lr=0.05, momentum=0.9))),
    # batches: a data set of this many batches, one per step (file order): ResNet-18 memorises one batch of
    # 8 random samples within 2-3 steps, after which the relative differences of losses near 0 are noise.
    # lr: a learning rate for both (dmc: --lr). ResNet-18 trains chaotically in fp32 at the program's
    # lr 5e-3 at batch 8 on random data (at 1e-3 already, PyTorch's own fp32 losses leave its fp64 ones by
    # 2e-4 at step 3 and by 5e-2 at step 4; a 1e-7 relative perturbation of the weights, by 1e-2 at step 5),
    # so a first-losses parity needs a gentler rate: at 1e-4 dmc is within 4e-6 of PyTorch fp64 over 5 steps.
    # f64: PyTorch in float64 too, the reference either is measured against.
    "resnet18": dict(file="examples/resnet18.dm", steps=6, batches=6, modes=["plain", "fused", "f64"], lr=1e-4,
                     # train { batch: 8, optimizer: sgd(lr: 0.005, momentum: 0.9, weight_decay: 5e-4) }
                     opt=("sgd", dict(lr=0.005, momentum=0.9, weight_decay=5e-4))),
    "mobilenet": dict(file="examples/mobilenet.dm", steps=20, modes=["plain", "fused"],
                      # train { batch: 16, optimizer: adam(lr: 1e-3) }
                      opt=("adam", dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8))),
    "unet": dict(file="examples/unet.dm", steps=20, modes=["plain", "fused"],
                 # train { batch: 4, optimizer: adam(lr: 1e-3) }
                 opt=("adam", dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8))),
    # A variant: the program's `train` section replaced (written to bench/out/<name>/program.dm), with a
    # learning-rate schedule: PyTorch runs the documented equivalent (LambdaLR is not used: SequentialLR of
    # LinearLR and CosineAnnealingLR, as docs/LANGUAGE.md says). Its parity covers every step of the run.
    # ... and global-norm gradient clipping (`clip_norm: m`; PyTorch `clip_grad_norm_(params, m)` before
    # `opt.step()`), m below the gradient's norm so that every step clips (the worker records the norms).
    "unet_cosine_clip": dict(file="examples/unet.dm", steps=10, modes=["plain"], parity_steps=10,
                             train="train { batch: 4, optimizer: adam(lr: 1e-3), seed: 5, "
                                   "schedule: cosine(warmup: 3, steps: 10, min_lr: 1e-4), clip_norm: 0.5 }",
                             sched=("cosine", dict(warmup=3, steps=10, min_lr=1e-4)), clip_norm=0.5,
                             opt=("adam", dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8))),
}
PARITY_STEPS = 5
PARITY_RTOL = 1e-4
# batchnorm's running mean / variance after the first step (max difference relative to the tensor's largest
# element): they are then computed
# from the same initial weights. After more steps they follow the weights, which Adam's first steps (about
# lr * sign(g) for every element) let drift apart wherever a gradient is near 0: reported, not judged.
STATS_RTOL = 1e-4
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

    def bn(c):  # dmc's batchnorm defaults are PyTorch's (momentum 0.1, eps 1e-5)
        return nn.BatchNorm2d(c)

    class BnCnn(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv2d_1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
            self.batchnorm_1 = bn(8)
            self.conv2d_2 = nn.Conv2d(8, 16, 3, padding=1, bias=False)
            self.batchnorm_2 = bn(16)
            self.dense_1 = nn.Linear(16, 16, bias=False)
            self.batchnorm_3 = nn.BatchNorm1d(16)
            self.dense_2 = nn.Linear(16, 10)

        def forward(self, x):
            h = F.max_pool2d(F.relu(self.batchnorm_1(self.conv2d_1(x))), 2)
            h = F.relu(self.batchnorm_2(self.conv2d_2(h))).mean(dim=(2, 3))
            return self.dense_2(F.relu(self.batchnorm_3(self.dense_1(h))))

    class Basic(nn.Module):  # torchvision's BasicBlock; `down`: stride 2 and a projected skip
        def __init__(self, cin, c, down):
            super().__init__()
            s = 2 if down else 1
            self.conv1 = nn.Conv2d(cin, c, 3, stride=s, padding=1, bias=False)
            self.bn1 = bn(c)
            self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
            self.bn2 = bn(c)
            self.down = down
            if down:
                self.proj = nn.Conv2d(cin, c, 1, stride=2, bias=False)
                self.proj_bn = bn(c)

        def forward(self, x):
            y = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
            s = self.proj_bn(self.proj(x)) if self.down else x
            return F.relu(s + y)

    class ResNet18(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
            self.bn1 = bn(64)
            cin = 64
            for i, c in enumerate([64, 128, 256, 512], start=1):
                setattr(self, f"layer{i}_0", Basic(cin, c, down=i > 1))
                setattr(self, f"layer{i}_1", Basic(c, c, down=False))
                cin = c
            self.fc = nn.Linear(512, 10)

        def forward(self, x):
            h = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 3, stride=2, padding=1)
            for i in range(1, 5):
                h = getattr(self, f"layer{i}_1")(getattr(self, f"layer{i}_0")(h))
            return self.fc(h.mean(dim=(2, 3)))

    class Separable(nn.Module):
        def __init__(self, c, f, s):
            super().__init__()
            self.dw = nn.Conv2d(c, c, 3, stride=s, padding=1, groups=c, bias=False)
            self.dw_bn = bn(c)
            self.pw = nn.Conv2d(c, f, 1, bias=False)
            self.pw_bn = bn(f)

        def forward(self, x):
            return F.relu(self.pw_bn(self.pw(F.relu(self.dw_bn(self.dw(x))))))

    class MobileNet(nn.Module):
        BLOCKS = [(16, 32, 1), (32, 64, 2), (64, 64, 1), (64, 128, 2), (128, 128, 1), (128, 256, 2),
                  (256, 256, 1), (256, 256, 1)]

        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, 16, 3, stride=2, padding=1, bias=False)
            self.stem_bn = bn(16)
            for i, (c, f, s) in enumerate(self.BLOCKS, start=1):
                setattr(self, f"separable_{i}", Separable(c, f, s))
            self.classifier = nn.Linear(256, 10)

        def forward(self, x):
            h = F.relu(self.stem_bn(self.stem(x)))
            for i in range(1, len(self.BLOCKS) + 1):
                h = getattr(self, f"separable_{i}")(h)
            return self.classifier(h.mean(dim=(2, 3)))

    class DoubleConv(nn.Module):
        def __init__(self, cin, c):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, c, 3, padding=1, bias=False)
            self.bn1 = bn(c)
            self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
            self.bn2 = bn(c)

        def forward(self, x):
            return F.relu(self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x))))))

    class UNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.enc1 = DoubleConv(3, 16)
            self.enc2 = DoubleConv(16, 32)
            self.bottleneck = DoubleConv(32, 64)
            self.up2 = nn.ConvTranspose2d(64, 32, 2, stride=2)
            self.dec2 = DoubleConv(64, 32)
            self.up1 = nn.ConvTranspose2d(32, 16, 2, stride=2)
            self.dec1 = DoubleConv(32, 16)
            self.head = nn.Conv2d(16, 1, 1)

        def forward(self, x):
            e1 = self.enc1(x)
            e2 = self.enc2(F.max_pool2d(e1, 2))
            b = self.bottleneck(F.max_pool2d(e2, 2))
            d2 = self.dec2(torch.cat([self.up2(b), e2], dim=1))  # dmc's concat: channels in order
            d1 = self.dec1(torch.cat([self.up1(d2), e1], dim=1))
            return self.head(d1)

    return {"mlp": MLP, "resnet_small": ResNetSmall, "deep_convnet": DeepConvnet, "seed": Seed,
            "bn_cnn": BnCnn, "resnet18": ResNet18, "mobilenet": MobileNet, "unet": UNet}[name]()


# Program inputs/targets: (input name, per-sample shape NHWC), (target name, kind)
IO = {
    "mlp": (("image", (784,)), ("label", 10)),
    "resnet_small": (("image", (16, 16, 3)), ("label", 10)),
    "deep_convnet": (("image", (64, 64, 3)), ("label", 10)),
    "seed": (("x", (16, 16, 1)), ("y", (1,))),  # mse target [1]
    "bn_cnn": (("image", (12, 12, 3)), ("label", 10)),
    "resnet18": (("image", (32, 32, 3)), ("label", 10)),
    "mobilenet": (("image", (32, 32, 3)), ("label", 10)),
    "unet": (("image", (32, 32, 3)), ("mask", (32, 32, 1))),  # mse target, per pixel
}
LOSS = {"mlp": "ce", "resnet_small": "ce", "deep_convnet": "ce", "seed": "mse", "bn_cnn": "ce",
        "resnet18": "ce", "mobilenet": "ce", "unet": "mse"}


def arch(example):
    """The network an example (or a variant of one: `unet_cosine`) builds."""
    return os.path.splitext(os.path.basename(EXAMPLES[example]["file"]))[0]


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

    (xin, shape), (tname, classes) = IO[arch(example)]
    rng = np.random.default_rng(DATA_SEED)
    x = rng.random((batch,) + shape, dtype=np.float32)
    if isinstance(classes, tuple):  # a regression target of this per-sample shape
        t = rng.standard_normal((batch,) + classes).astype(np.float32)
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


def save_state(m, path):
    """A PyTorch model's state_dict in dmc's names and layouts (HWIO convs, [in, out] dense)."""
    from safetensors.numpy import save_file
    final = {}
    for k, v in m.state_dict().items():
        if k.endswith("num_batches_tracked"):
            continue
        v = v.detach().cpu().float()
        v = v.permute(2, 3, 1, 0) if v.dim() == 4 else (v.t() if v.dim() == 2 else v)
        final[k] = v.contiguous().numpy()
    save_file(final, path)


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
        # DMC_BENCH_TF32=1 (gpu_compare.py's TF32 table, against dmc --precision tf32): TF32 on.
        tf32 = os.environ.get("DMC_BENCH_TF32") == "1"
        torch.backends.cudnn.allow_tf32 = tf32
        torch.backends.cuda.matmul.allow_tf32 = tf32
    ex = a.example
    cfg = EXAMPLES[ex]
    data = load_file(os.path.join(a.workdir, "data.safetensors"))
    init = load_file(os.path.join(a.workdir, "init.safetensors"))
    net = arch(ex)
    (xin, _), (tname, _) = IO[net]
    x = torch.from_numpy(data[xin])
    if x.dim() == 4:
        x = x.permute(0, 3, 1, 2).contiguous()  # NHWC -> NCHW, once, outside the timed steps
    dtype = torch.float64 if a.mode == "f64" else torch.float32
    x = x.to(dev, dtype)
    t = data[tname]
    t = torch.from_numpy(t.astype(np.int64) if t.dtype == np.int32 else t)
    if t.dim() == 4:
        t = t.permute(0, 3, 1, 2).contiguous()  # a per-pixel target, NHWC -> NCHW like the output
    t = t.to(dev, dtype if t.is_floating_point() else t.dtype)
    # `batches` > 1: step k trains on batch k mod batches, in the file's order (dmc runs --no-shuffle)
    nb = cfg.get("batches", 1)
    xs, ts = x.chunk(nb), t.chunk(nb)
    lossfn = torch.nn.functional.cross_entropy if LOSS[net] == "ce" else torch.nn.functional.mse_loss
    kind, hp = cfg["opt"]
    if "lr" in cfg:
        hp = dict(hp, lr=cfg["lr"])

    def make_opt(params):
        if kind == "sgd":
            return torch.optim.SGD(params, **hp)
        return torch.optim.Adam(params, **hp)

    grad_norms = []  # with clip_norm: each step's global gradient norm before clipping

    def make_sched(opt):
        """docs/LANGUAGE.md's PyTorch equivalent of the variant's `schedule:`."""
        if "sched" not in cfg:
            return None
        skind, sp = cfg["sched"]
        assert skind == "cosine" and a.mode == "plain"
        w, n = sp["warmup"], sp["steps"]
        S = torch.optim.lr_scheduler
        warm = S.LinearLR(opt, start_factor=1 / w, end_factor=1.0, total_iters=w - 1)
        decay = S.CosineAnnealingLR(opt, T_max=n - w, eta_min=sp["min_lr"])
        return S.SequentialLR(opt, [warm, decay], milestones=[w])

    def build():
        m = build_model(net, torch)
        sd = {k: to_torch(k, v, torch) for k, v in init.items()}
        # Every dmc parameter and running statistic, exactly the PyTorch set (dmc has no counterpart of
        # batchnorm's `num_batches_tracked`, which only matters for momentum=None).
        for k, v in m.state_dict().items():
            if k.endswith("num_batches_tracked"):
                sd[k] = v
        m.load_state_dict(sd, strict=True)
        m.to(dtype)
        counter = itertools.count()
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
                k = next(counter) % nb
                loss = lossfn(m(xs[k]), ts[k])
                loss.backward()
                return loss

            return m, list(opts.values()), step
        opt = make_opt(m.parameters())
        sched = make_sched(opt)

        def step():
            k = next(counter) % nb
            loss = lossfn(m(xs[k]), ts[k])
            loss.backward()
            if "clip_norm" in cfg:
                grad_norms.append(torch.nn.utils.clip_grad_norm_(m.parameters(), cfg["clip_norm"]).item())
            opt.step()
            opt.zero_grad(set_to_none=True)
            if sched is not None:
                sched.step()
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
    n_state = min(PARITY_STEPS, a.steps)
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
        if i + 1 in (1, n_state):  # the states after 1 and the parity steps, for the driver's `state_diffs`
            save_state(m, os.path.join(a.workdir, f"torch-state{i + 1}-{a.mode}.safetensors"))
    res = dict(example=ex, mode=a.mode, device=a.device, threads=threads, torch=torch.__version__,
               losses=losses, times_ms=times, rss0=rss0, hwm_reset=hwm_ok, grad_norms=grad_norms,
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


def run_dmc(dmc, file, workdir, steps, device, extra, lr=None):
    log = os.path.join(workdir, "dmc-loss.txt")
    summary = os.path.join(workdir, "dmc-summary.json")
    cmd = [dmc, "run", file, "--data", os.path.join(workdir, "data.safetensors"),
           "--init", os.path.join(workdir, "init.safetensors"), "--steps", str(steps),
           "--loss-log", log, "--summary-json", summary, "--device", device, "-q",
           # the file's order, as PyTorch's: a shuffled order within the one batch changes the rounding of
           # the batch's sums, which a ReLU or max-pool tie can amplify within a few dozen steps
           "--no-shuffle"] + extra + (["--lr", repr(lr)] if lr is not None else [])
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


def state_diffs(workdir, mode, n):
    """Max relative differences between dmc's and PyTorch's state after n steps: (running statistics,
    weights); a tensor's relative difference is max |a - b| / max |b| over its elements."""
    import numpy as np
    from safetensors.numpy import load_file

    d = load_file(os.path.join(workdir, f"dmc-state{n}.safetensors"))
    t = load_file(os.path.join(workdir, f"torch-state{n}-{mode}.safetensors"))
    if set(d) != set(t):
        raise SystemExit(f"dmc and PyTorch state names differ: {sorted(set(d) ^ set(t))}")
    stats, weights = 0.0, 0.0
    for k in d:
        r = float(np.max(np.abs(d[k] - t[k])) / max(float(np.max(np.abs(t[k]))), 1e-30))
        if k.endswith(("running_mean", "running_var")):
            stats = max(stats, r)
        else:
            weights = max(weights, r)
    has_stats = any(k.endswith("running_mean") for k in d)
    return (stats if has_stats else None), weights


def parity_verdict(r):
    """(ok, text) of an example's parity: every PyTorch configuration's first losses within PARITY_RTOL of
    dmc's (and the running statistics after the first step within STATS_RTOL); with an `f64` run, where PyTorch's own fp32
    losses are further than PARITY_RTOL from its fp64 ones, dmc passes if its distance to fp64 is at most
    3x PyTorch fp32's + PARITY_RTOL."""
    t = r["torch"]
    par = ", ".join(f"{m} {t[m]['parity']:.1e}" for m in t)
    ok = all(t[m]["parity"] <= PARITY_RTOL and t[m].get("parity_cap", 0.0) <= PARITY_RTOL for m in t)
    stats = [t[m]["stats_diff1"] for m in t if t[m].get("stats_diff1") is not None and m != "f64"]
    if stats:  # judged after one step: the update rule itself, before the weights drift apart
        later = max(t[m]["stats_diff"] for m in t if m != "f64")
        par += (f"; running stats after 1 step {max(stats):.1e}, after {min(PARITY_STEPS, r['steps'])} "
                f"{later:.1e}")
        ok = ok and max(stats) <= STATS_RTOL
    if "f64" in t:
        n = r.get("parity_steps", PARITY_STEPS)
        dmc64 = t["f64"]["parity"]
        torch64 = max_rel_diff(t["plain"]["losses"], t["f64"]["losses"], n)
        par += f"; vs PyTorch fp64: dmc {dmc64:.1e}, PyTorch fp32 {torch64:.1e}"
        if not ok and torch64 > PARITY_RTOL:
            ok = dmc64 <= 3 * torch64 + PARITY_RTOL
            par += " (chaotic: judged against fp64)"
    return ok, par


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
        if "train" in cfg:  # a variant: the example with another `train` section
            src = open(os.path.join(ROOT, file)).read()
            src, n = re.subn(r"(?m)^train \{.*\}\s*$", cfg["train"], src)
            assert n == 1, f"{file}: no one-line train section to replace"
            file = os.path.join(wd, "program.dm")
            with open(file, "w") as f:
                f.write(src + "\n")
        batch = program_batch(a.dmc, os.path.join(ROOT, file))
        make_data(ex, batch * cfg.get("batches", 1), os.path.join(wd, "data.safetensors"))
        subprocess.run([a.dmc, "run", file, "--steps", "0", "--save", os.path.join(wd, "init.safetensors"),
                        "-q", "--device", "cpu"], check=True, capture_output=True, cwd=ROOT)
        print(f"[{ex}] dmc: {steps} steps ...", file=sys.stderr, flush=True)
        d = run_dmc(a.dmc, file, wd, steps, a.dmc_device or a.device, [], lr=cfg.get("lr"))
        print(f"[{ex}]   {d['line']}", file=sys.stderr, flush=True)
        row = dict(example=ex, file=file, batch=batch, steps=steps, dmc=d, torch={})
        # dmc's states after 1 step and after the parity steps (running statistics, weights), from short runs
        n_state = min(PARITY_STEPS, steps)
        for n in sorted({1, n_state}):
            run_dmc(a.dmc, file, wd, n, "cpu", ["--save", os.path.join(wd, f"dmc-state{n}.safetensors")], lr=cfg.get("lr"))
        if cfg.get("dmc_cap"):
            print(f"[{ex}] dmc --vram-cap {cfg['dmc_cap']}: {steps} steps ...", file=sys.stderr, flush=True)
            dc = run_dmc(a.dmc, file, wd, steps, a.dmc_device or a.device, ["--vram-cap", cfg["dmc_cap"]], lr=cfg.get("lr"))
            dc["cap"] = cfg["dmc_cap"]
            print(f"[{ex}]   {dc['line']}", file=sys.stderr, flush=True)
            row["dmc_cap"] = dc
        for mode in cfg["modes"]:
            print(f"[{ex}] PyTorch ({mode}) ...", file=sys.stderr, flush=True)
            r = run_worker(ex, mode, wd, steps, a.device, a.threads, profile=not a.no_profile)
            r["parity"] = max_rel_diff(d["losses"], r["losses"], cfg.get("parity_steps", PARITY_STEPS))
            r["stats_diff1"], r["weights_diff1"] = state_diffs(wd, mode, 1)
            r["stats_diff"], r["weights_diff"] = state_diffs(wd, mode, n_state)
            if "dmc_cap" in row:
                r["parity_cap"] = max_rel_diff(row["dmc_cap"]["losses"], r["losses"], PARITY_STEPS)
            print(f"[{ex}]   median {median_warm(r['times_ms']):.1f} ms/step, RSS peak increase "
                  f"{mb(r['rss_peak_increase'])}, loss parity {r['parity']:.2e}; running stats, weights after 1 "
                  f"step: {r['stats_diff1']}, {r['weights_diff1']:.2e}; after {n_state}: {r['stats_diff']}, "
                  f"{r['weights_diff']:.2e}", file=sys.stderr, flush=True)
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
    bad = [r["example"] for r in results if not parity_verdict(r)[0]]
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
        ok, par = parity_verdict(r)
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
