#!/usr/bin/env python3
"""Fixtures for `dmc weights import`: PyTorch- and Keras-layout weight files with reference eval losses.

Written independently of dmc's code: for small programs shaped like examples/*.dm (an MLP, a residual
net, a deep plain convnet, the seed net's conv -> maxpool -> flatten -> dense), this script draws weights
in the other framework's layout and naming (a PyTorch `state_dict` of an equivalent `nn.Module`, or
Keras `kernel`/`bias` variables), a data set in dmc's layout (NHWC images, int32 labels / f32 targets),
and computes the eval loss with that framework's forward pass written here in numpy (float64):

  PyTorch: NCHW activations, OIHW convolutions (`padding=1` for the 3x3 'same' ones), `x @ W.T + b` for a
           Linear weight [out, in], `torch.flatten` of NCHW (C, H, W order), `F.cross_entropy`/`F.mse_loss`;
  Keras:   NHWC activations, HWIO kernels, `x @ K + b` for a Dense kernel [in, out], `Flatten` of NHWC.

tests/it/interop.rs imports each file with `dmc weights import`, runs `dmc eval` and compares the loss with
the reference here (relative 1e-5). Each fixture also checks that it can tell a wrong conversion from the
right one: the loss under a plausible mistake (rows flattened H,W,C for PyTorch; two equal-shaped layers
swapped) must differ from the reference by more than 1e-3 relative.

Needs only numpy (the .safetensors files are written by hand: an 8-byte header length, a JSON header,
little-endian data). Usage:
    python3 bench/interop_fixture.py [OUT_DIR]        # default tests/fixtures/interop
"""

import json
import os
import struct
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLES = 16


# ----------------------------------------------------------------------------------------------------
# safetensors, by hand


def save_safetensors(path, tensors, metadata=None):
    """tensors: dict name -> np.ndarray (float32 or int32)."""
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        dtype = {np.dtype("float32"): "F32", np.dtype("int32"): "I32"}[a.dtype]
        raw = a.astype(a.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


# ----------------------------------------------------------------------------------------------------
# the two forward passes, in float64


def conv_nchw(x, w, b):
    """PyTorch Conv2d(k, stride=1, padding=k//2): x [N,C,H,W], w [O,C,kh,kw]."""
    kh, kw = w.shape[2], w.shape[3]
    xp = np.pad(x, ((0, 0), (0, 0), (kh // 2, kh // 2), (kw // 2, kw // 2)))
    n, _, h, wd = x.shape
    out = np.zeros((n, w.shape[0], h, wd))
    for i in range(kh):
        for j in range(kw):
            out += np.einsum("nchw,oc->nohw", xp[:, :, i:i + h, j:j + wd], w[:, :, i, j])
    return out + b[None, :, None, None]


def conv_nhwc(x, k, b):
    """Keras Conv2D(padding='same'), stride 1, odd kernel: x [N,H,W,C], k [kh,kw,C,O]."""
    kh, kw = k.shape[0], k.shape[1]
    xp = np.pad(x, ((0, 0), (kh // 2, kh // 2), (kw // 2, kw // 2), (0, 0)))
    n, h, wd, _ = x.shape
    out = np.zeros((n, h, wd, k.shape[3]))
    for i in range(kh):
        for j in range(kw):
            out += np.einsum("nhwc,co->nhwo", xp[:, i:i + h, j:j + wd, :], k[i, j])
    return out + b


def maxpool2_nchw(x):
    n, c, h, w = x.shape
    h2, w2 = h // 2, w // 2
    return x[:, :, :h2 * 2, :w2 * 2].reshape(n, c, h2, 2, w2, 2).max(axis=(3, 5))


def maxpool2_nhwc(x):
    n, h, w, c = x.shape
    h2, w2 = h // 2, w // 2
    return x[:, :h2 * 2, :w2 * 2, :].reshape(n, h2, 2, w2, 2, c).max(axis=(2, 4))


relu = lambda v: np.maximum(v, 0.0)  # noqa: E731


def cross_entropy(logits, labels):
    m = logits.max(axis=1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(logits - m).sum(axis=1))
    return float(np.mean(lse - logits[np.arange(len(labels)), labels]))


def mse(pred, target):
    return float(np.mean((pred - target) ** 2))


# ----------------------------------------------------------------------------------------------------
# parameters in PyTorch's init style (so losses are O(1)), kept in float32 as the files hold them


def rng_for(name):
    """A generator seeded by the fixture's name (the same on every run: Python's hash() is salted)."""
    return np.random.default_rng(sum(ord(c) * 31 ** i for i, c in enumerate(name)) % 2 ** 32)


def linear(rng, i, o):
    """(weight [out, in], bias [out])"""
    return (rng.normal(0, np.sqrt(2.0 / i), (o, i)).astype(np.float32),
            rng.uniform(-0.1, 0.1, o).astype(np.float32))


def conv(rng, i, o, k=3):
    """(weight OIHW, bias [out])"""
    return (rng.normal(0, np.sqrt(2.0 / (i * k * k)), (o, i, k, k)).astype(np.float32),
            rng.uniform(-0.1, 0.1, o).astype(np.float32))


def f64(d):
    return {k: v.astype(np.float64) for k, v in d.items()}


# ----------------------------------------------------------------------------------------------------
# the fixtures: (program text, weights, data, forward) per network


MLP = """# Like examples/mlp.dm, smaller: dense layers with relu, named.
input  image: [48]
target label: int
logits = image
  |> dense(32, activation: relu) as hidden1
  |> dense(16, activation: relu) as hidden2
  |> dense(10) as classifier
loss cross_entropy(logits, label)
train { batch: 4, optimizer: sgd(lr: 0.01, momentum: 0.9) }
"""

RESNET = """# Like examples/resnet_small.dm, smaller: a stem, two residual blocks, global average pooling.
input  image: [8, 8, 3]
target label: int
block res(x, c) {
  y = x |> conv2d(c, 3, activation: relu) |> conv2d(c, 3)
  return relu(x + y)
}
h = image |> conv2d(8, 3, activation: relu) as stem
logits = h |> res(8) |> res(8) |> global_avgpool |> dense(10)
loss cross_entropy(logits, label)
train { batch: 4, optimizer: adam(lr: 1e-3) }
"""

CONVNET = """# Like examples/deep_convnet.dm, smaller: a stem and five identical conv + relu blocks.
input  image: [8, 8, 3]
target label: int
logits = image
  |> conv2d(8, 3, activation: relu) as stem
  |> repeat 5 { conv2d(8, 3) |> relu }
  |> global_avgpool
  |> dense(10)
loss cross_entropy(logits, label)
train { batch: 4, optimizer: sgd(lr: 0.01, momentum: 0.9, weight_decay: 5e-4) }
"""

SEED = """# Like examples/seed.dm, smaller: conv -> maxpool twice, then flatten -> dense -> dense (mse).
input  x: [8, 12, 2]
target y: [1]
out = x |> conv2d(4, 3) |> maxpool(2)
        |> conv2d(6, 3) |> maxpool(2)
        |> flatten |> dense(4) |> dense(1)
loss mse(out, y)
train { batch: 4, optimizer: sgd(lr: 0.01) }
"""


def images(rng, shape):
    return rng.random((SAMPLES,) + shape, dtype=np.float32)


def mlp_torch():
    """nn.Sequential(Linear(48,32), ReLU(), Linear(32,16), ReLU(), Linear(16,10)): keys 0., 2., 4."""
    r = rng_for("mlp")
    sd = {}
    for idx, (i, o) in zip((0, 2, 4), ((48, 32), (32, 16), (16, 10))):
        sd[f"{idx}.weight"], sd[f"{idx}.bias"] = linear(r, i, o)
    x = images(r, (48,))
    y = r.integers(0, 10, SAMPLES).astype(np.int32)

    def forward(p, order=(0, 2, 4)):
        h = x.astype(np.float64)
        for n, idx in enumerate(order):
            h = h @ p[f"{idx}.weight"].T + p[f"{idx}.bias"]
            if n < 2:
                h = relu(h)
        return cross_entropy(h, y)

    # Every layer has a shape of its own, so matching by shape alone is unambiguous, and a missing
    # transposition is a shape error rather than a different loss: no wrong variant to tell apart.
    wrong = {}
    return MLP, sd, {"image": x, "label": y}, forward, wrong


def resnet_torch():
    """stem, blocks.{0,1}.conv{1,2}, fc (a hand-written nn.Module's names)."""
    r = rng_for("resnet")
    sd = {}
    sd["stem.weight"], sd["stem.bias"] = conv(r, 3, 8)
    for b in range(2):
        for c in (1, 2):
            sd[f"blocks.{b}.conv{c}.weight"], sd[f"blocks.{b}.conv{c}.bias"] = conv(r, 8, 8)
    sd["fc.weight"], sd["fc.bias"] = linear(r, 8, 10)
    x = images(r, (8, 8, 3))
    y = r.integers(0, 10, SAMPLES).astype(np.int32)

    def forward(p, convs=("blocks.0.conv1", "blocks.0.conv2", "blocks.1.conv1", "blocks.1.conv2")):
        h = relu(conv_nchw(x.astype(np.float64).transpose(0, 3, 1, 2), p["stem.weight"], p["stem.bias"]))
        for b in range(2):
            c1, c2 = convs[2 * b], convs[2 * b + 1]
            t = relu(conv_nchw(h, p[c1 + ".weight"], p[c1 + ".bias"]))
            h = relu(h + conv_nchw(t, p[c2 + ".weight"], p[c2 + ".bias"]))
        return cross_entropy(h.mean(axis=(2, 3)) @ p["fc.weight"].T + p["fc.bias"], y)

    wrong = {"the two convolutions of the first block swapped":
             dict(convs=("blocks.0.conv2", "blocks.0.conv1", "blocks.1.conv1", "blocks.1.conv2"))}
    return RESNET, sd, {"image": x, "label": y}, forward, wrong


def convnet_torch():
    """nn.Sequential(Conv, ReLU, 5 x (Conv, ReLU), AdaptiveAvgPool2d(1), Flatten(), Linear): keys
    0, 2, 4, 6, 8, 10 and 14 (natural order puts 10 after 8, plain string order before 2)."""
    r = rng_for("convnet")
    sd = {}
    sd["0.weight"], sd["0.bias"] = conv(r, 3, 8)
    for idx in (2, 4, 6, 8, 10):
        sd[f"{idx}.weight"], sd[f"{idx}.bias"] = conv(r, 8, 8)
    sd["14.weight"], sd["14.bias"] = linear(r, 8, 10)
    x = images(r, (8, 8, 3))
    y = r.integers(0, 10, SAMPLES).astype(np.int32)

    def forward(p, order=(0, 2, 4, 6, 8, 10)):
        h = x.astype(np.float64).transpose(0, 3, 1, 2)
        for idx in order:
            h = relu(conv_nchw(h, p[f"{idx}.weight"], p[f"{idx}.bias"]))
        return cross_entropy(h.mean(axis=(2, 3)) @ p["14.weight"].T + p["14.bias"], y)

    wrong = {"layers in string order (10 before 2)": dict(order=(0, 10, 2, 4, 6, 8))}
    return CONVNET, sd, {"image": x, "label": y}, forward, wrong


def seed_torch():
    """features.{0,3} (Conv2d), classifier.{0,1} (Linear): nn.Sequential(features) + flatten + classifier."""
    r = rng_for("seed")
    sd = {}
    sd["features.0.weight"], sd["features.0.bias"] = conv(r, 2, 4)
    sd["features.3.weight"], sd["features.3.bias"] = conv(r, 4, 6)
    sd["classifier.0.weight"], sd["classifier.0.bias"] = linear(r, 6 * 2 * 3, 4)
    sd["classifier.1.weight"], sd["classifier.1.bias"] = linear(r, 4, 1)
    x = images(r, (8, 12, 2))
    y = r.normal(0, 1, (SAMPLES, 1)).astype(np.float32)

    def forward(p, flatten_hwc=False):
        h = x.astype(np.float64).transpose(0, 3, 1, 2)
        h = maxpool2_nchw(conv_nchw(h, p["features.0.weight"], p["features.0.bias"]))
        h = maxpool2_nchw(conv_nchw(h, p["features.3.weight"], p["features.3.bias"]))
        h = (h.transpose(0, 2, 3, 1) if flatten_hwc else h).reshape(len(h), -1)  # torch.flatten: C,H,W
        h = h @ p["classifier.0.weight"].T + p["classifier.0.bias"]
        return mse(h @ p["classifier.1.weight"].T + p["classifier.1.bias"], y.astype(np.float64))

    wrong = {"the dense rows in H,W,C order (no flatten permutation)": dict(flatten_hwc=True)}
    return SEED, sd, {"x": x, "y": y}, forward, wrong


def seed_keras():
    """Keras 3 variable paths: conv2d/kernel, conv2d_1/kernel, dense/kernel, dense_1/kernel (HWIO, [in, out])."""
    r = rng_for("seed-keras")
    kw = {}
    for name, (i, o) in (("conv2d", (2, 4)), ("conv2d_1", (4, 6))):
        w, b = conv(r, i, o)
        kw[f"{name}/kernel"], kw[f"{name}/bias"] = w.transpose(2, 3, 1, 0).copy(), b
    for name, (i, o) in (("dense", (36, 4)), ("dense_1", (4, 1))):
        w, b = linear(r, i, o)
        kw[f"{name}/kernel"], kw[f"{name}/bias"] = w.T.copy(), b
    x = images(r, (8, 12, 2))
    y = r.normal(0, 1, (SAMPLES, 1)).astype(np.float32)

    def forward(p, flatten_chw=False):
        h = x.astype(np.float64)
        h = maxpool2_nhwc(conv_nhwc(h, p["conv2d/kernel"], p["conv2d/bias"]))
        h = maxpool2_nhwc(conv_nhwc(h, p["conv2d_1/kernel"], p["conv2d_1/bias"]))
        h = (h.transpose(0, 3, 1, 2) if flatten_chw else h).reshape(len(h), -1)  # Keras Flatten: H,W,C
        h = h @ p["dense/kernel"] + p["dense/bias"]
        return mse(h @ p["dense_1/kernel"] + p["dense_1/bias"], y.astype(np.float64))

    wrong = {"the dense rows in C,H,W order (a PyTorch permutation applied to Keras)": dict(flatten_chw=True)}
    return SEED, kw, {"x": x, "y": y}, forward, wrong


def convnet_keras():
    """TF2-Keras names with `:0`: stem/kernel:0, conv2d/kernel:0 ... conv2d_4/kernel:0, dense/kernel:0."""
    r = rng_for("convnet-keras")
    kw = {}
    names = ["stem", "conv2d", "conv2d_1", "conv2d_2", "conv2d_3", "conv2d_4"]
    for n, name in enumerate(names):
        w, b = conv(r, 3 if n == 0 else 8, 8)
        kw[f"{name}/kernel:0"], kw[f"{name}/bias:0"] = w.transpose(2, 3, 1, 0).copy(), b
    w, b = linear(r, 8, 10)
    kw["dense/kernel:0"], kw["dense/bias:0"] = w.T.copy(), b
    x = images(r, (8, 8, 3))
    y = r.integers(0, 10, SAMPLES).astype(np.int32)

    def forward(p, order=tuple(names)):
        h = x.astype(np.float64)
        for name in order:
            h = relu(conv_nhwc(h, p[f"{name}/kernel:0"], p[f"{name}/bias:0"]))
        return cross_entropy(h.mean(axis=(1, 2)) @ p["dense/kernel:0"] + p["dense/bias:0"], y)

    wrong = {"two equal convolutions swapped": dict(order=("stem", "conv2d_1", "conv2d", "conv2d_2", "conv2d_3",
                                                          "conv2d_4"))}
    return CONVNET, kw, {"image": x, "label": y}, forward, wrong


FIXTURES = {
    "mlp_torch": ("mlp_small", "torch", mlp_torch),
    "resnet_torch": ("resnet_tiny", "torch", resnet_torch),
    "convnet_torch": ("convnet_tiny", "torch", convnet_torch),
    "seed_torch": ("seed_tiny", "torch", seed_torch),
    "seed_keras": ("seed_tiny", "keras", seed_keras),
    "convnet_keras": ("convnet_tiny", "keras", convnet_keras),
}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "tests", "fixtures", "interop")
    os.makedirs(out, exist_ok=True)
    for key, (program, framework, make) in FIXTURES.items():
        text, weights, data, forward, wrong = make()
        with open(os.path.join(out, f"{program}.dm"), "w") as f:
            f.write(text)
        loss = forward(f64(weights))
        for what, kwargs in wrong.items():
            bad = forward(f64(weights), **kwargs)
            assert abs(bad - loss) > 1e-3 * abs(loss), f"{key}: '{what}' gives the same loss ({bad} vs {loss})"
        meta = {"format": "pt"} if framework == "torch" else None
        save_safetensors(os.path.join(out, f"{key}.safetensors"), weights, meta)
        save_safetensors(os.path.join(out, f"{key}-data.safetensors"), data)
        ref = {
            "program": f"{program}.dm",
            "framework": framework,
            "weights": f"{key}.safetensors",
            "data": f"{key}-data.safetensors",
            "samples": SAMPLES,
            "eval_loss": loss,
            "discriminates": sorted(wrong),
        }
        with open(os.path.join(out, f"{key}.json"), "w") as f:
            json.dump(ref, f, indent=2)
            f.write("\n")
        print(f"{key}: {program}.dm, {framework}, {len(weights)} tensors, eval loss {loss:.9f}")


if __name__ == "__main__":
    main()
