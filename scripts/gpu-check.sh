#!/usr/bin/env bash
# The GPU check, for a machine with one NVIDIA GPU, its driver and NVRTC, but no Rust toolchain and no
# network. It does not build: the release binary travels with the repository copy at target/release/dmc
# (build it elsewhere with `cargo build --release`).
#
# It runs `dmc gpu-selftest`, which
#   * renders and NVRTC-compiles every kernel of every example (train and eval plans) for the GPU's
#     architecture, failing on warnings or register spills;
#   * runs every kernel on fresh random inputs against the CPU backend (outputs poisoned with NaN first,
#     so an element the GPU never writes shows), relative error <= 1e-5 (max |gpu-cpu| / max |cpu|);
#   * runs every GEMM of the op zoo on TF32 tensor cores (sm_80+) on inputs on a 1/8 grid, which TF32
#     holds exactly: the plain GEMMs must match the CPU exactly (the MMA fragments' layout);
#   * trains examples/seed.dm and examples/deep_convnet.dm for 20 steps on the GPU under a memory cap,
#     compares the device memory taken (cuMemGetInfo) with the planned arena and the first step's loss
#     with the CPU backend's, and times the step;
# and prints one summary table; then the GEMM variants (cp.async, registers, unsplit, baseline, TF32), the dmc vs
# PyTorch eager table of every example with and without --cuda-graph, the TF32 table (TF32 on both sides) and
# the --profile tables (bench/gpu_compare.py; PyTorch where installed), and examples/gpt.dm against PyTorch
# with plain attention and with SDPA (bench/gpt.py --gpu-quick; where PyTorch sees the GPU). It is
# sized for 10 minutes of GPU time. `scripts/gpu-check.sh --dry-run` does everything but launch (no GPU).
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${DMC_BIN:-target/release/dmc}
if [ ! -x "$BIN" ]; then
  echo "gpu-check: $BIN not found; build it first with 'cargo build --release' (this script does not build)" >&2
  exit 1
fi

# NVRTC: keep $DMC_NVRTC if set, else look where CUDA installs and where pip wheels (e.g. PyTorch's) put it.
if [ -z "${DMC_NVRTC:-}" ]; then
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu; do
    for n in libnvrtc.so.13 libnvrtc.so.12 libnvrtc.so; do
      if [ -e "$d/$n" ]; then DMC_NVRTC="$d/$n"; break 2; fi
    done
  done
fi
if [ -z "${DMC_NVRTC:-}" ] && command -v python3 >/dev/null 2>&1; then
  DMC_NVRTC=$(python3 - <<'PY' 2>/dev/null || true
import glob, site, sys
roots = site.getsitepackages() + [site.getusersitepackages()]
for r in roots:
    for pat in ("nvidia/cu13/lib/libnvrtc.so.13", "nvidia/cuda_nvrtc/lib/libnvrtc.so.1*"):
        hits = sorted(glob.glob(f"{r}/{pat}"))
        hits = [h for h in hits if "builtins" not in h and "alt" not in h]
        if hits:
            print(hits[0]); sys.exit(0)
PY
)
fi
if [ -n "${DMC_NVRTC:-}" ]; then export DMC_NVRTC; echo "gpu-check: NVRTC = $DMC_NVRTC"; fi
export DMC_CACHE_DIR=${DMC_CACHE_DIR:-$(mktemp -d)}

command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true

# The CLI on the GPU: `dmc run --device auto` must pick CUDA and land on the CPU's loss.
echo "gpu-check: dmc run examples/resnet_small.dm --steps 30 on cuda (auto) and on cpu:"
"$BIN" run examples/resnet_small.dm --steps 30 --device auto 2>&1 | grep -E "^device|steps, final loss" || echo "gpu-check: FAIL dmc run --device auto"
"$BIN" run examples/resnet_small.dm --steps 30 --device cpu 2>&1 | grep -E "^device|steps, final loss" || true

# Data parallel on the GPU (issue 20): one rank (this machine's one GPU) through the NCCL path, the
# loss summed over the ranks by ncclAllReduce each step; its final loss must equal the plain run's.
# (Several GPUs: `mpirun -np N dmc run net.dm --data-parallel --device cuda`, one rank per GPU; the
# sharded steps' programs are the ones the emulator runs in CI with MPI in NCCL's place.)
case " $* " in *" --dry-run "*) ;; *)
  if [ -z "${DMC_NCCL:-}" ] && command -v python3 >/dev/null 2>&1; then
    DMC_NCCL=$(python3 -c "import glob, site; h = [g for r in site.getsitepackages() + [site.getusersitepackages()] for g in glob.glob(r + '/nvidia/nccl/lib/libnccl.so.2')]; print(h[0] if h else '')" 2>/dev/null || true)
    [ -n "$DMC_NCCL" ] && export DMC_NCCL
  fi
  echo "gpu-check: data parallel, one rank over NCCL (mlp, 20 steps; NCCL = ${DMC_NCCL:-libnccl.so.2 on the library path}):"
  plain=$(timeout 60 "$BIN" run examples/mlp.dm --steps 20 --device cuda 2>&1 | grep -o 'final loss [0-9.]*, [0-9.]* ms/step' || echo "?")
  dp=$(timeout 90 "$BIN" run examples/mlp.dm --steps 20 --device cuda --data-parallel 2>&1 | grep -E 'final loss|^data parallel|error' | tr '\n' ' ' || echo "?")
  echo "  plain: $plain"
  echo "  --data-parallel (1 rank, NCCL): $dp"
  [ "${plain%%,*}" = "$(echo "$dp" | grep -o 'final loss [0-9.]*' | head -1)" ] && echo "  same final loss: ok" || echo "gpu-check: FAIL data parallel over NCCL (final loss differs or the run failed)" ;;
esac

# the plans: seed.dm 1.6 GiB, deep_convnet.dm 2.2 GiB; both must fit under the cap.
rc=0
timeout 300 "$BIN" gpu-selftest --examples examples --steps 20 --vram-cap 3GiB "$@" || rc=$?

# The GEMMs: the model's choice (the default: tiles and splits with cp.async stages, and the skinny
# kernels for a few rows or a short reduction), every GEMM tiled (--no-skinny: the kernels the
# 2026-12-04 H200 log measured), the tiles staged through registers (--no-cp-async), unsplit
# (--no-split-k), and the baseline kernel the first H200 log measured (--baseline-gemm: one tile,
# unpipelined, unsplit), the same training steps in one run.
case " $* " in *" --dry-run "*) ;; *)
  echo "gpu-check: GEMM variants (ms/step of 10 steps, --device cuda):"
  for ex in deep_convnet seed; do
    ms() { timeout 120 "$BIN" run "examples/$ex.dm" --steps 10 --device cuda -q "$@" 2>&1 | grep -o '[0-9.]* ms/step' || echo "? ms/step"; }
    on=$(ms)
    tiled=$(ms --no-skinny)
    regs=$(ms --no-cp-async)
    tf32=$(ms --precision tf32)
    off=$(ms --no-split-k)
    base=$(ms --baseline-gemm)
    echo "  $ex: chosen (skinny + tiles + split-K + cp.async) $on, every GEMM tiled $tiled, staged in registers $regs, unsplit $off, baseline GEMM $base, TF32 tensor cores $tf32"
  done ;;
esac

# Streaming (issue 13): the seed network under caps its 826 MB of parameters do not fit, its weights
# copied through windows of the arena from a pinned host store on a second stream. Each step's time
# against the transfer floor (the plan's bytes copied each way / this machine's pinned-copy
# bandwidth, measured here by PyTorch), the loss against the resident run's, once with --poison.
case " $* " in *" --dry-run "*) ;; *)
  echo "gpu-check: streaming (seed, 5 steps, --device cuda):"
  bw=$(timeout 60 python3 - <<'PY' 2>/dev/null || echo "0 0"
import torch, time
n = 256 << 20
h = torch.empty(n, dtype=torch.uint8).pin_memory()
d = torch.empty(n, dtype=torch.uint8, device="cuda")
def rate(f):
    f(); torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(5):
        f()
    torch.cuda.synchronize()
    return 5 * n / (time.perf_counter() - t)
print(rate(lambda: d.copy_(h, non_blocking=True)), rate(lambda: h.copy_(d, non_blocking=True)))
PY
)
  echo "  pinned copies (PyTorch): host->device $(python3 -c "print(f'{$(echo $bw | cut -d' ' -f1)/1e9:.1f}')") GB/s, device->host $(python3 -c "print(f'{$(echo $bw | cut -d' ' -f2)/1e9:.1f}')") GB/s"
  resident=$(timeout 120 "$BIN" run examples/seed.dm --steps 5 --device cuda 2>&1 | grep -o 'final loss [0-9.]*, [0-9.]* ms/step' || echo "? ms/step")
  echo "  resident: $resident"
  for cap in 256MB 128MB; do
    line=$(timeout 120 "$BIN" run examples/seed.dm --steps 5 --device cuda --vram-cap "$cap" 2>&1 | grep -o 'final loss [0-9.]*, [0-9.]* ms/step' || echo "? ms/step")
    poison=$(timeout 120 "$BIN" run examples/seed.dm --steps 5 --device cuda --vram-cap "$cap" --poison 2>&1 | grep -o 'final loss [0-9.]*' || echo "?")
    "$BIN" plan examples/seed.dm --vram-cap "$cap" --json > /tmp/gpu-check-stream.json 2>/dev/null || true
    floor=$(python3 - "$bw" /tmp/gpu-check-stream.json "$line" <<'PY' 2>/dev/null || echo "?"
import json, re, sys
up, down = (float(x) for x in sys.argv[1].split())
t = json.load(open(sys.argv[2]))["streaming"]["totals"]
f = t["host_to_device"] / up + t["device_to_host"] / down
m = re.search(r"([0-9.]+) ms/step", sys.argv[3])
print(f"transfer floor {f*1e3:.2f} ms ({t['host_to_device']:,} B in, {t['device_to_host']:,} B back): step / floor = {float(m.group(1))/(f*1e3):.2f}x" if m and up > 0 else f"transfer floor ? ({t['host_to_device']:,} B in, {t['device_to_host']:,} B back)")
PY
)
    echo "  --vram-cap $cap: $line; with --poison: $poison; $floor"
  done ;;
esac

# dmc vs PyTorch eager on this GPU, one markdown table for BENCHMARKS.md (bench/gpu_compare.py): every
# example's ms/step launching kernel by kernel and with --cuda-graph (whose losses must be identical),
# PyTorch eager fp32 with TF32 off on both sides, then the --profile per-kernel tables of seed and
# deep_convnet. Without PyTorch, dmc only; in --dry-run, only the commands. GPU_CHECK_BENCH=0 skips it.
case " $* " in *" --dry-run "*)
  python3 bench/gpu_compare.py --dry-run --dmc "$BIN" || { echo "gpu-check: FAIL bench/gpu_compare.py --dry-run"; rc=1; } ;;
*)
  if [ "${GPU_CHECK_BENCH:-1}" != 0 ]; then
    torch_flag=--no-torch
    python3 -c "import torch, safetensors, numpy" 2>/dev/null && torch_flag=
    echo "gpu-check: dmc vs PyTorch eager on the GPU (bench/gpu_compare.py ${torch_flag}):"
    timeout 200 python3 bench/gpu_compare.py --dmc "$BIN" $torch_flag --timeout 60 \
      --workdir "${GPU_CHECK_OUT:-$(mktemp -d)}" || { echo "gpu-check: FAIL bench/gpu_compare.py"; rc=1; }
  fi ;;
esac

# examples/gpt.dm on this GPU (bench/gpt.py --gpu-quick, about a minute): T 256, batch 8, 30 steps each of dmc
# (kernel by kernel and with --cuda-graph, whose losses must be identical), PyTorch eager with plain attention
# and with F.scaled_dot_product_attention(is_causal=True) (fp32, TF32 off), ms/step and memory, and the first 5
# losses within 1e-4 of PyTorch's. Only where PyTorch (with safetensors and numpy) sees the GPU; a failure is
# printed and does not fail the check. GPU_CHECK_GPT=0 skips it.
case " $* " in *" --dry-run "*)
  python3 bench/gpt.py --gpu-quick --dry-run --dmc "$BIN" || echo "gpu-check: FAIL bench/gpt.py --gpu-quick --dry-run" ;;
*)
  if [ "${GPU_CHECK_GPT:-1}" != 0 ]; then
    if python3 -c "import torch, safetensors, numpy, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
      gpt_dir="${GPU_CHECK_OUT:-$(mktemp -d)}/gpt"
      echo "gpu-check: examples/gpt.dm vs PyTorch plain attention and SDPA on the GPU (bench/gpt.py --device cuda --gpu-quick):"
      timeout 150 python3 bench/gpt.py --device cuda --gpu-quick --dmc "$BIN" --workdir "$gpt_dir" \
        --markdown "$gpt_dir/gpt-cuda.md" 2>&1 \
        || echo "gpu-check: FAIL bench/gpt.py --device cuda --gpu-quick (exit $?; 124: the 150 s timeout), not counted"
    else
      echo "gpu-check: skipped bench/gpt.py --device cuda (PyTorch with CUDA, safetensors and numpy not importable)"
    fi
  fi ;;
esac
exit $rc
