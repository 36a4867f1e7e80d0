"""dmc vs PyTorch eager on one GPU, one table for BENCHMARKS.md (scripts/gpu-check.sh runs it).

For each example: the same data and initial weights as bench/bench.py (one batch, file order), dmc with
--device cuda launching kernel by kernel and with --cuda-graph, PyTorch eager (bench.py's `plain` worker:
fp32, TF32 off for matmul and cuDNN, torch.cuda.synchronize() around each step). ms/step is the median
of the per-step times after the first. The losses of dmc's two runs must be identical (a graph replays
the same kernels in the same order). Then `dmc run --profile` per-kernel tables for the examples of
--profile.

Usage: python3 bench/gpu_compare.py --dmc target/release/dmc [--only seed,mlp] [--profile seed,deep_convnet]
       python3 bench/gpu_compare.py --dry-run   # print the commands, run nothing
"""

import argparse
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402  (the data, the weights and the PyTorch worker of bench.py)

# steps per example: a few seconds each on an H200 at the measured speeds (BENCHMARKS.md)
STEPS = {"seed": 12, "deep_convnet": 6, "resnet_small": 60, "mlp": 100}


def dmc_cmd(a, ex, wd, steps, extra):
    cfg = bench.EXAMPLES[ex]
    return [a.dmc, "run", cfg["file"], "--data", os.path.join(wd, "data.safetensors"),
            "--init", os.path.join(wd, "init.safetensors"), "--steps", str(steps),
            "--device", "cuda", "-q", "--no-shuffle"] + extra + (
                ["--lr", repr(cfg["lr"])] if cfg.get("lr") is not None else [])


def dmc_timed(a, ex, wd, steps, extra, tag):
    log = os.path.join(wd, f"dmc-loss-{tag}.txt")
    cmd = dmc_cmd(a, ex, wd, steps, extra + ["--loss-log", log])
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=bench.ROOT, timeout=a.timeout)
    if out.returncode != 0:
        return None, None, f"dmc failed ({' '.join(cmd)}): {out.stderr.strip()[-500:]}"
    losses, times = [], []
    with open(log) as f:
        for line in f:
            _, l, ms = line.split()
            losses.append(l)
            times.append(float(ms))
    return losses, bench.median_warm(times), None


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dmc", default=os.path.join(bench.ROOT, "target", "release", "dmc"))
    p.add_argument("--only", default="seed,deep_convnet,resnet_small,mlp")
    p.add_argument("--profile", default="seed,deep_convnet", help="examples to run with dmc --profile")
    p.add_argument("--workdir", default=None)
    p.add_argument("--timeout", type=int, default=120, help="seconds per dmc or PyTorch run")
    p.add_argument("--no-torch", action="store_true", help="dmc only")
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    p.add_argument("--tf32", default="seed,deep_convnet",
                   help="examples also timed with TF32 on both sides (dmc --precision tf32, PyTorch allow_tf32)")
    a = p.parse_args()
    wd_root = a.workdir or tempfile.mkdtemp(prefix="gpu-compare-")
    examples = [e for e in a.only.split(",") if e]
    if a.dry_run:
        for ex in examples:
            wd = os.path.join(wd_root, ex)
            print(" ".join(dmc_cmd(a, ex, wd, STEPS[ex], [])))
            print(" ".join(dmc_cmd(a, ex, wd, STEPS[ex], ["--cuda-graph"])))
            print(f"{sys.executable} bench/bench.py --worker --example {ex} --mode plain --device cuda "
                  f"--workdir {wd} --steps {STEPS[ex]}")
        for ex in [e for e in a.profile.split(",") if e]:
            print(" ".join(dmc_cmd(a, ex, os.path.join(wd_root, ex), STEPS[ex], ["--profile"])))
        return 0

    rows, notes = [], []
    for ex in examples:
        cfg = bench.EXAMPLES[ex]
        wd = os.path.join(wd_root, ex)
        os.makedirs(wd, exist_ok=True)
        batch = bench.program_batch(a.dmc, os.path.join(bench.ROOT, cfg["file"]))
        bench.make_data(ex, batch * cfg.get("batches", 1), os.path.join(wd, "data.safetensors"))
        subprocess.run([a.dmc, "run", cfg["file"], "--steps", "0", "--save", os.path.join(wd, "init.safetensors"),
                        "-q", "--device", "cpu"], check=True, capture_output=True, cwd=bench.ROOT)
        steps = STEPS[ex]
        print(f"[{ex}] dmc, {steps} steps, plain launches and --cuda-graph ...", file=sys.stderr, flush=True)
        l_off, ms_off, e1 = dmc_timed(a, ex, wd, steps, [], "launch")
        l_on, ms_on, e2 = dmc_timed(a, ex, wd, steps, ["--cuda-graph"], "graph")
        notes += [e for e in (e1, e2) if e]
        ms_torch = None
        if not a.no_torch:
            print(f"[{ex}] PyTorch eager ...", file=sys.stderr, flush=True)
            try:
                r = bench.run_worker(ex, "plain", wd, steps, "cuda", os.cpu_count(), profile=False)
                ms_torch = bench.median_warm(r["times_ms"])
            except (SystemExit, subprocess.TimeoutExpired) as e:
                notes.append(f"{ex}: PyTorch failed: {str(e)[-300:]}")
        same = "yes" if l_off is not None and l_off == l_on else ("**no**" if l_off and l_on else "-")
        rows.append((ex, batch, steps, ms_off, ms_on, ms_torch, same))

    fmt = lambda v: f"{v:.2f}" if v is not None else "-"
    ratio = lambda x, y: f"{x / y:.2f}x" if x is not None and y else "-"
    print("| example | batch | steps | dmc ms/step | dmc --cuda-graph ms/step | PyTorch eager ms/step "
          "| dmc/PyTorch | graph/dmc/PyTorch | losses graph = launches |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for ex, batch, steps, off, on, t, same in rows:
        print(f"| {ex} | {batch} | {steps} | {fmt(off)} | {fmt(on)} | {fmt(t)} | {ratio(off, t)} "
              f"| {ratio(on, t)} | {same} |")
    print()
    print("ms/step: median of the steps after the first (dmc: --loss-log, data feeding excluded; PyTorch: "
          "forward + backward + step, synchronised), fp32 with TF32 off on both sides.")
    for n in notes:
        print(f"- {n}")

    tf32 = [e for e in a.tf32.split(",") if e and os.path.exists(os.path.join(wd_root, e, "init.safetensors"))]
    if tf32:
        print("\n| example (TF32 both sides) | dmc fp32 ms/step | dmc --precision tf32 ms/step | PyTorch TF32 ms/step "
              "| dmc tf32/PyTorch tf32 | last loss fp32 | last loss tf32 |")
        print("|---|---:|---:|---:|---:|---:|---:|")
    for ex in tf32:
        wd = os.path.join(wd_root, ex)
        print(f"[{ex}] TF32: dmc --precision tf32 and PyTorch allow_tf32 ...", file=sys.stderr, flush=True)
        l32, ms32, e1 = dmc_timed(a, ex, wd, STEPS[ex], [], "fp32")
        ltf, mstf, e2 = dmc_timed(a, ex, wd, STEPS[ex], ["--precision", "tf32"], "tf32")
        notes = [e for e in (e1, e2) if e]
        ms_torch = None
        if not a.no_torch:
            os.environ["DMC_BENCH_TF32"] = "1"
            try:
                r = bench.run_worker(ex, "plain", wd, STEPS[ex], "cuda", os.cpu_count(), profile=False)
                ms_torch = bench.median_warm(r["times_ms"])
            except (SystemExit, subprocess.TimeoutExpired) as e:
                notes.append(f"{ex}: PyTorch TF32 failed: {str(e)[-300:]}")
            finally:
                os.environ.pop("DMC_BENCH_TF32", None)
        last = lambda l: l[-1] if l else "-"
        print(f"| {ex} | {fmt(ms32)} | {fmt(mstf)} | {fmt(ms_torch)} | {ratio(mstf, ms_torch)} | {last(l32)} | {last(ltf)} |")
        for n in notes:
            print(f"- {n}")

    for ex in [e for e in a.profile.split(",") if e]:
        wd = os.path.join(wd_root, ex)
        if not os.path.exists(os.path.join(wd, "init.safetensors")):
            continue
        cmd = dmc_cmd(a, ex, wd, STEPS[ex], ["--profile"])
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=bench.ROOT, timeout=a.timeout)
        print(f"\n#### `dmc run {bench.EXAMPLES[ex]['file']} --device cuda --profile` ({STEPS[ex]} steps)\n")
        if out.returncode != 0:
            print(f"dmc --profile failed: {out.stderr.strip()[-500:]}")
            continue
        # the table follows the run's summary lines on stdout
        lines = out.stdout.splitlines()
        start = next((i for i, l in enumerate(lines) if l.startswith("Measured per kernel")), len(lines))
        print("\n".join(lines[start:]))
    bad = [r[0] for r in rows if r[6] == "**no**"]
    if bad:
        print(f"\ngpu-compare: FAIL: --cuda-graph changed the losses of {bad}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
