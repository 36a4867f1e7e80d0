#!/usr/bin/env bash
# Byte-identity of the compiler's outputs between two dmc binaries: every example and 60- and
# 2,000-layer chains of the four bench programs (bench/compile-scaling.sh), `compile -o DIR` in
# train/eval/predict (with and without --no-fuse), `plan --json` (with and without --no-fuse),
# `plan --verbose`, and `plan --json`/`compile -o` under --vram-cap at 1/2 of the arena.
#
#   bench/identity.sh OUT_DIR DMC          # writes every output of DMC under OUT_DIR
#   diff -r OUT_A OUT_B                    # then compare two binaries' trees
set -euo pipefail
cd "$(dirname "$0")/.."
out=$1 dmc=$2
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
gen() { # program N -> file (the generator of bench/compile-scaling.sh)
    local p=$1 n=$2 f="$work/$1-$2.dm"
    case $p in
    relu) printf 'input x: [64]\ntarget y: [64]\nout = x |> dense(64) |> repeat %d { relu }\n' $((n - 1)) ;;
    dense) printf 'input x: [16]\ntarget y: [16]\nout = x |> repeat %d { dense(16) }\n' "$n" ;;
    conv) printf 'input x: [4, 4, 4]\ntarget y: [4, 4, 4]\nout = x |> repeat %d { conv2d(4, 3) }\n' "$n" ;;
    residual)
        printf 'input x: [16]\ntarget y: [16]\n'
        printf 'block res(x) {\n  y = x |> dense(16, activation: relu) |> dense(16)\n  return relu(x + y)\n}\n'
        printf 'out = x |> repeat %d { res }\n' $((n / 5)) ;;
    esac >"$f"
    printf 'loss mse(out, y)\ntrain { batch: 1, optimizer: sgd(lr: 0.01) }\n' >>"$f"
    echo "$f"
}
files=(examples/*.dm)
for p in relu dense conv residual; do
    for n in 60 2000; do files+=("$(gen $p $n)"); done
done
for f in "${files[@]}"; do
    b=$(basename "$f" .dm)
    "$dmc" plan --json "$f" >"$out/$b.plan.json" 2>"$out/$b.plan.err" || echo "exit $?" >>"$out/$b.plan.err"
    "$dmc" plan --json --no-fuse "$f" >"$out/$b.plan-nofuse.json" 2>&1 || echo "exit $?" >>"$out/$b.plan-nofuse.json"
    "$dmc" plan --verbose "$f" >"$out/$b.plan.txt" 2>&1 || echo "exit $?" >>"$out/$b.plan.txt"
    for m in train eval predict; do
        for nf in "" --no-fuse; do
            d="$out/$b.compile-$m$nf"
            "$dmc" compile "$f" --mode $m $nf -o "$d" >"$d.log" 2>&1 || echo "exit $?" >>"$d.log"
        done
    done
    arena=$(grep -o '"arena_bytes": *[0-9]*' "$out/$b.plan.json" | head -1 | grep -o '[0-9]*$' || true)
    if [ -n "$arena" ]; then
        cap=$((arena / 2))
        "$dmc" plan --json --vram-cap "$cap" "$f" >"$out/$b.plan-cap.json" 2>&1 || echo "exit $?" >>"$out/$b.plan-cap.json"
        "$dmc" compile "$f" --vram-cap "$cap" -o "$out/$b.compile-cap" >"$out/$b.compile-cap.log" 2>&1 ||
            echo "exit $?" >>"$out/$b.compile-cap.log"
    fi
done
# the binary's name, the output directory and the generated programs' directory appear in messages
find "$out" -type f -name '*.log' -o -type f -name '*.err' -o -type f -name '*.txt' |
    xargs sed -i -e "s#$out#OUT#g" -e "s#$work#WORK#g" -e "s#$(basename "$dmc")#dmc#g"
echo "$(find "$out" -type f | wc -l) files under $out"
