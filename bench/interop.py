#!/usr/bin/env python3
"""`dmc weights import|export` with real PyTorch, on the examples (the fixture-based test without PyTorch is
tests/it/interop.rs; see docs/INTEROP.md).

For each example (bench.py's hand-written PyTorch modules):
  1. import: a PyTorch model (PyTorch's own initialisation) is saved as an `nn.Sequential`-style state_dict
     (keys renamed `0.weight`, `1.weight`, ... in module order, so only order and shape can match them),
     converted with `dmc weights import`, and `dmc eval` on a seeded data set must give PyTorch's eval loss
     (relative 1e-4: both in float32, with different summation orders);
  2. export: dmc's weights after a few training steps, `dmc weights export --to torch`, must load into the
     module with `load_state_dict(strict=True)` and give dmc's eval loss;
  3. round trip: importing that export gives back dmc's weights file byte for byte.

Usage: bench/.venv/bin/python bench/interop.py [--only mlp,resnet_small] [--samples 64]
       (bench/run.sh makes the venv; the seed example, 206M parameters, only with --only seed)
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench  # noqa: E402  (build_model, IO, LOSS, make_data, EXAMPLES, ROOT)

RTOL = 1e-4


def dmc(binary, *args):
    out = subprocess.run([binary, *args], capture_output=True, text=True, cwd=bench.ROOT)
    if out.returncode != 0:
        raise SystemExit(f"dmc {' '.join(args)} failed:\n{out.stdout}\n{out.stderr}")
    return out.stdout


def dmc_eval(binary, program, weights, data):
    out = dmc(binary, "eval", program, "--init", weights, "--data", data, "-q")
    m = re.match(r"loss (\S+?),? ", out)
    if not m:
        raise SystemExit(f"cannot parse `dmc eval`: {out!r}")
    return float(m.group(1))


def torch_eval(model, example, data, torch):
    from safetensors.numpy import load_file
    import numpy as np

    d = load_file(data)
    (xin, _), (tname, _) = bench.IO[example]
    x = torch.from_numpy(d[xin])
    if x.dim() == 4:
        x = x.permute(0, 3, 1, 2).contiguous()  # dmc's data is NHWC
    t = d[tname]
    t = torch.from_numpy(t.astype(np.int64) if t.dtype == np.int32 else t)
    if t.dim() == 4:
        t = t.permute(0, 3, 1, 2).contiguous()  # a per-pixel target
    with torch.no_grad():
        out = model(x)
        if bench.LOSS[example] == "ce":
            return torch.nn.functional.cross_entropy(out, t).item()
        return torch.nn.functional.mse_loss(out, t).item()


def close(a, b):
    return abs(a - b) <= RTOL * max(abs(a), abs(b))


def check(example, binary, samples, work, torch):
    from safetensors.torch import save_file

    program = bench.EXAMPLES[example]["file"]
    data = os.path.join(work, "data.safetensors")
    bench.make_data(example, samples, data)
    torch.manual_seed(0)
    model = bench.build_model(example, torch)
    norms = [m for m in model.modules() if isinstance(m, (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d))]
    if norms:  # batchnorm: scales, shifts and running statistics away from their 1 / 0 defaults
        with torch.no_grad():
            for m in norms:
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)
            (xin, shape), _ = bench.IO[example]
            for _ in range(3):
                x = torch.rand((8,) + shape)
                model.train()(x.permute(0, 3, 1, 2) if x.dim() == 4 else x)
    model = model.eval()
    results = []

    # 1. import a PyTorch state_dict with Sequential-style names
    sd = model.state_dict()
    modules = list(dict.fromkeys(k.rsplit(".", 1)[0] for k in sd))
    renamed = {f"{modules.index(k.rsplit('.', 1)[0])}.{k.rsplit('.', 1)[1]}": v.contiguous()
               for k, v in sd.items()}
    tfile, wfile = os.path.join(work, "torch.safetensors"), os.path.join(work, "w.safetensors")
    save_file(renamed, tfile)
    dmc(binary, "weights", "import", program, tfile, "--from", "torch", "-o", wfile, "-q")
    a, b = torch_eval(model, example, data, torch), dmc_eval(binary, program, wfile, data)
    results.append(("import", a, b))

    # 2. export dmc's trained weights and load them strictly
    trained = os.path.join(work, "trained.safetensors")
    dmc(binary, "run", program, "--data", data, "--steps", "3", "--save", trained, "-q")
    efile = os.path.join(work, "export.safetensors")
    dmc(binary, "weights", "export", program, "--init", trained, "--to", "torch", "-o", efile, "-q")
    from safetensors.torch import load_file

    model.load_state_dict(load_file(efile), strict=True)
    a, b = torch_eval(model, example, data, torch), dmc_eval(binary, program, trained, data)
    results.append(("export", a, b))

    # 3. export -> import gives the same bytes
    back = os.path.join(work, "back.safetensors")
    dmc(binary, "weights", "import", program, efile, "--from", "torch", "-o", back, "-q")
    same = open(back, "rb").read() == open(trained, "rb").read()
    return results, same


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--only", default="mlp,resnet_small,deep_convnet,bn_cnn,resnet18,mobilenet,unet")
    p.add_argument("--samples", type=int, default=64)
    p.add_argument("--dmc", default=os.path.join(bench.ROOT, "target", "release", "dmc"))
    a = p.parse_args()
    import torch

    ok = True
    for ex in a.only.split(","):
        with tempfile.TemporaryDirectory() as work:
            results, same = check(ex, a.dmc, a.samples, work, torch)
        for what, t, d in results:
            good = close(t, d)
            ok &= good
            print(f"{ex:13} {what:7} torch {t:.7f}  dmc {d:.7f}  {'ok' if good else 'MISMATCH'}")
        ok &= same
        print(f"{ex:13} export -> import: {'same bytes' if same else 'DIFFERENT BYTES'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
