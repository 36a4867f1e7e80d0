#!/usr/bin/env python3
"""Where dmc's CPU time goes: reads `perf script` output of a dwarf call-graph recording (stdin) and attributes
every sample to the innermost dmc kernel function on its stack (`dmc_runtime::cpu::<module>::<fn>`, also
found inside the closure types of rayon jobs), and to what the sample was doing at the leaf: the GEMM
micro-kernel, GEMM packing, scheduling / spinning (sched_yield, futex, context switches), page faults, other.
Samples on matrixmultiply's own worker threads carry no dmc frame: they are counted as "sgemm (worker thread)".
Usage: perf script -F comm,tid,ip,sym | python3 bench/perf_kernels.py   (bench/profile.sh does it all)
"""
import collections
import re
import sys

KERNEL = re.compile(r"dmc_runtime::cpu::(\w+)::(\w+)")
OTHER = re.compile(r"dmc_runtime::(\w+)::(\w+)::")


def leaf_kind(frames):
    leaf = frames[0] if frames else ""
    text = " ".join(frames[:6])
    if "sgemm_kernel" in leaf or "kernel_target" in leaf:
        return "gemm micro-kernel"
    if "packing" in leaf or "pack_" in leaf:
        return "gemm packing"
    if any(s in text for s in ("sched_yield", "finish_task_switch", "__schedule", "futex", "_raw_spin_unlock",
                               "crossbeam", "lock_contended", "wait_until", "LocalKey", "do_syscall")):
        return "scheduling / spinning"
    if "page_fault" in text or "clear_page" in text:
        return "page faults"
    if "memmove" in leaf or "memcpy" in leaf or "memset" in leaf:
        return "memcpy/memset"
    return "compute (dmc loops)"


def main():
    samples = []
    frames = []
    for line in sys.stdin:
        if not line.strip():
            if frames:
                samples.append(frames)
            frames = []
            continue
        if line[0] not in " \t":
            if frames:
                samples.append(frames)
            frames = []
            continue
        parts = line.strip().split(None, 1)
        frames.append(parts[1] if len(parts) > 1 else "")
    if frames:
        samples.append(frames)
    total = len(samples)
    by_kernel = collections.Counter()
    by_leaf = collections.Counter()
    by_pair = collections.Counter()
    for fr in samples:
        kern = None
        for f in fr:
            m = KERNEL.search(f)
            if m:
                kern = f"{m.group(1)}::{m.group(2)}"
                break
        if kern is None:
            joined = " ".join(fr)
            if "matrixmultiply" in joined or "thread_tree" in joined:
                kern = "sgemm (matrixmultiply worker thread)"
            elif "rayon_core" in joined:
                kern = "rayon worker, idle/stealing"
            else:
                m = None
                for f in fr:
                    m = OTHER.search(f)
                    if m:
                        break
                kern = f"(setup) {m.group(1)}::{m.group(2)}" if m else "(other: setup, main thread, kernel)"
        lk = leaf_kind(fr)
        by_kernel[kern] += 1
        by_leaf[lk] += 1
        by_pair[(kern, lk)] += 1
    print(f"{total} samples")
    print("\nby dmc kernel function (innermost on the stack):")
    for k, v in by_kernel.most_common(20):
        detail = ", ".join(f"{lk} {100 * n / v:.0f}%" for (kk, lk), n in by_pair.most_common() if kk == k)
        print(f"  {100 * v / total:5.1f}%  {k:45s} [{detail}]")
    print("\nby leaf activity:")
    for k, v in by_leaf.most_common():
        print(f"  {100 * v / total:5.1f}%  {k}")


if __name__ == "__main__":
    main()
