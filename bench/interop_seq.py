#!/usr/bin/env python3
"""`dmc weights import|export` of the sequence layers with real PyTorch (the test without PyTorch is
tests/it/interop_seq.rs; see docs/INTEROP.md).

A small GPT-like program (embedding, pos_embedding, a causal attention with bias, a non-causal one without,
an MLP over the sequence, a tied output head) and the same model in PyTorch (`nn.Embedding`,
`nn.MultiheadAttention(batch_first=True)`, `lm_head.weight = wte.weight`):
  1. export: dmc's weights after a few training steps, `dmc weights export --to torch`, must load into the
     module with `load_state_dict(strict=True)` and give `dmc predict`'s logits (absolute 1e-5);
  2. import: a PyTorch model's weights (biases moved off zero), saved with `safetensors.torch.save_model`
     (which keeps one name of the shared head / embedding tensor) and as a full state_dict (both names),
     imported with `dmc weights import` give PyTorch's logits in `dmc predict`;
  3. a head weight that is not the embedding table is refused.

Usage: bench/.venv/bin/python bench/interop_seq.py   (needs target/release/dmc; bench/run.sh makes the venv)
"""

import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.numpy import load_file as np_load
from safetensors.numpy import save_file as np_save
from safetensors.torch import load_file, save_file, save_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DMC = os.path.join(ROOT, "target", "release", "dmc")
T, V, C = 8, 32, 16
ATOL = 1e-5
PROGRAM = f"""input tokens: int[{T}]
target next: int[{T}]
e = tokens |> embedding({V}, {C}) as wte
x = e |> pos_embedding as wpe
h1 = x + (x |> layernorm as ln1 |> attention(4) as att1)
h2 = h1 + (h1 |> layernorm as ln2 |> attention(2, causal: false, bias: false) as att2)
h3 = h2 + (h2 |> dense(24, activation: gelu) as fc1 |> dense({C}) as fc2)
logits = h3 |> layernorm as lnf |> dense({V}, tie: e) as head
loss cross_entropy(logits, next)
train {{ batch: 4, optimizer: adam(lr: 1e-2), seed: 1 }}
"""


class GPT(nn.Module):
    """The program in PyTorch; attribute names = dmc's layer names."""

    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
        self.ln1, self.att1 = nn.LayerNorm(C), nn.MultiheadAttention(C, 4, batch_first=True)
        self.ln2, self.att2 = nn.LayerNorm(C), nn.MultiheadAttention(C, 2, bias=False, batch_first=True)
        self.fc1, self.fc2, self.lnf = nn.Linear(C, 24), nn.Linear(24, C), nn.LayerNorm(C)
        self.head = nn.Linear(C, V)
        self.head.weight = self.wte.weight  # tied

    def forward(self, tok):
        x = self.wte(tok) + self.wpe(torch.arange(T))
        causal = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
        a = self.ln1(x)
        h1 = x + self.att1(a, a, a, attn_mask=causal, need_weights=False)[0]
        a = self.ln2(h1)
        h2 = h1 + self.att2(a, a, a, need_weights=False)[0]
        h3 = h2 + self.fc2(F.gelu(self.fc1(h2)))  # exact (erf) GELU, as dmc's
        return self.head(self.lnf(h3))


def dmc(*args, check=True):
    r = subprocess.run([DMC, *args], capture_output=True, text=True)
    if check and r.returncode != 0:
        sys.exit(f"dmc {' '.join(args)} failed:\n{r.stdout}\n{r.stderr}")
    return r


def main():
    failed = False
    with tempfile.TemporaryDirectory() as d:
        p = lambda name: os.path.join(d, name)  # noqa: E731
        with open(p("gpt.dm"), "w") as f:
            f.write(PROGRAM)
        tok = np.random.default_rng(0).integers(0, V, size=(6, T)).astype(np.int32)
        np_save({"tokens": tok, "next": np.roll(tok, -1, axis=1)}, p("d.safetensors"))

        def predict(weights):
            dmc("predict", p("gpt.dm"), "--init", weights, "--data", p("d.safetensors"), "-o", p("out.safetensors"),
                "-q", "--device", "cpu")
            (out,) = np_load(p("out.safetensors")).values()
            return out

        def report(what, ours, ref):
            nonlocal failed
            err = float(np.abs(ours - ref).max())
            ok = err <= ATOL
            failed |= not ok
            print(f"{what}: max |dmc - torch| = {err:.3g} (|logits| up to {np.abs(ref).max():.3g}) "
                  f"{'ok' if ok else 'FAIL'}")

        # 1. export
        dmc("run", p("gpt.dm"), "--steps", "3", "--synthetic-samples", "16", "--save", p("w.safetensors"), "-q")
        dmc("weights", "export", p("gpt.dm"), "--init", p("w.safetensors"), "--to", "torch", "-o",
            p("torch.safetensors"), "-q")
        model = GPT().eval()
        print("export, load_state_dict(strict=True):", model.load_state_dict(load_file(p("torch.safetensors"))))
        with torch.no_grad():
            ref = model(torch.from_numpy(tok).long()).numpy()
        report("export", predict(p("w.safetensors")), ref)

        # 2. import
        torch.manual_seed(1)
        model = GPT().eval()
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "bias" in name or name.startswith("ln"):
                    param.add_(torch.randn_like(param) * 0.1)
            ref = model(torch.from_numpy(tok).long()).numpy()
        save_model(model, p("save_model.safetensors"))
        save_file({k: v.clone() for k, v in model.state_dict().items()}, p("state_dict.safetensors"))
        for f in ["save_model", "state_dict"]:
            dmc("weights", "import", p("gpt.dm"), p(f"{f}.safetensors"), "--from", "torch", "-o",
                p("w2.safetensors"), "-q")
            kept = sorted(k for k in load_file(p(f"{f}.safetensors")) if k.split(".")[0] in ("wte", "head"))
            report(f"import of {f} ({', '.join(kept)})", predict(p("w2.safetensors")), ref)

        # 3. an untied head
        sd = {k: v.clone() for k, v in model.state_dict().items()}
        sd["head.weight"] += 1
        save_file(sd, p("untied.safetensors"))
        r = dmc("weights", "import", p("gpt.dm"), p("untied.safetensors"), "--from", "torch", "-o",
                p("w3.safetensors"), check=False)
        refused = r.returncode != 0 and "ties them" in r.stderr
        failed |= not refused
        print(f"untied head refused: {'ok' if refused else 'FAIL'}: {r.stderr.strip()[:160]}...")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
