#!/usr/bin/env bash
# Compile time vs number of layers: generates long-chain programs and times `dmc check` and
# `dmc plan` (release build) for each N. Prints one markdown table per program.
#
#   bench/compile-scaling.sh                         # all programs, N = 1000 .. 100000
#   DMC=/tmp/dmc-old bench/compile-scaling.sh        # another binary (e.g. an older build)
#   NS="1000 2000 4000" PROGRAMS="relu dense" bench/compile-scaling.sh
#   LIMIT=60 bench/compile-scaling.sh                # skip larger N of a program once a run takes > 60 s
#   CAP=1 bench/compile-scaling.sh                   # also `dmc plan --vram-cap` (rematerialization)
#   COMPILE=1 bench/compile-scaling.sh               # also `dmc compile -o DIR` (plan.json + kernels)
#   BASE=/tmp/dmc-base COMPILE=1 bench/compile-scaling.sh
#                                                    # also time BASE right after each command of DMC
#                                                    # (same program, same moment) and print CPU ratios
#
# Each time is "wall seconds (CPU seconds, user + sys)"; on a shared machine the CPU time is the
# steadier of the two.
#
# Programs (N = number of layers):
#   relu      x[64] |> dense(64) |> repeat N-1 { relu }   (a program needs a parameter)
#   dense     x[16] |> repeat N { dense(16) }
#   conv      x[4,4,4] |> repeat N { conv2d(4, 3) }           ('same' padding)
#   residual  x[16] |> repeat N/5 { res }, res = relu(x + dense(16) after dense(16, activation: relu))
#             (5 layers a block: dense, its relu, dense, add, relu)
# With CAP=1, `plan --vram-cap` gets half of the arena `plan` reports without a cap.
set -euo pipefail
cd "$(dirname "$0")/.."
DMC=${DMC:-target/release/dmc}
NS=${NS:-"1000 2000 4000 8000 16000 32000 100000"}
PROGRAMS=${PROGRAMS:-"relu dense conv residual"}
LIMIT=${LIMIT:-120}
CAP=${CAP:-0}
COMPILE=${COMPILE:-0}
BASE=${BASE:-}
if [ "$DMC" = target/release/dmc ] && [ -z "${NO_BUILD:-}" ]; then
    cargo build --release --bin dmc >&2
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

gen() { # program N -> file
    local p=$1 n=$2 f="$work/$1-$2.dm"
    case $p in
    relu) printf 'input x: [64]\ntarget y: [64]\nout = x |> dense(64) |> repeat %d { relu }\n' $((n - 1)) ;;
    dense) printf 'input x: [16]\ntarget y: [16]\nout = x |> repeat %d { dense(16) }\n' "$n" ;;
    conv) printf 'input x: [4, 4, 4]\ntarget y: [4, 4, 4]\nout = x |> repeat %d { conv2d(4, 3) }\n' "$n" ;;
    residual)
        printf 'input x: [16]\ntarget y: [16]\n'
        printf 'block res(x) {\n  y = x |> dense(16, activation: relu) |> dense(16)\n  return relu(x + y)\n}\n'
        printf 'out = x |> repeat %d { res }\n' $((n / 5)) ;;
    *) echo "unknown program $p" >&2; exit 2 ;;
    esac >"$f"
    printf 'loss mse(out, y)\ntrain { batch: 1, optimizer: sgd(lr: 0.01) }\n' >>"$f"
    echo "$f"
}

secs() { # command... -> "wall s (CPU s)", or "fail: ..."
    if /usr/bin/time -f "%e %U %S" -o "$work/time" "$@" >"$work/out" 2>"$work/err"; then
        awk '{printf "%.2f (%.2f)", $1, $2 + $3}' "$work/time"
    else
        echo "fail: $(grep -m1 -o '×.*' "$work/err" | head -c 80)"
    fi
}

ratio() { # "wall (CPU)" "wall (CPU)" -> CPU of the first / CPU of the second
    local a=${1#*(} b=${2#*(}
    awk -v a="${a%)}" -v b="${b%)}" 'BEGIN{if (b + 0 > 0) printf "%.2f", a / b; else print "?"}'
}

echo "binary: $DMC ($(git rev-parse --short HEAD 2>/dev/null || echo '?')), $(nproc) cores, $(uname -m)"
[ -n "$BASE" ] && echo "base: $BASE"
for p in $PROGRAMS; do
    echo
    echo "### $p"
    echo
    head="| N | check: wall (CPU) s | plan: wall (CPU) s | arena |"
    rule="|---:|---:|---:|---:|"
    if [ "$CAP" = 1 ]; then
        head="$head plan --vram-cap: wall (CPU) s | capped arena |"
        rule="$rule---:|---:|"
    fi
    if [ "$COMPILE" = 1 ]; then
        head="$head compile: wall (CPU) s |"
        rule="$rule---:|"
    fi
    if [ -n "$BASE" ]; then
        head="$head BASE plan: wall (CPU) s | plan CPU / BASE |"
        rule="$rule---:|---:|"
        if [ "$COMPILE" = 1 ]; then
            head="$head BASE compile: wall (CPU) s | compile CPU / BASE |"
            rule="$rule---:|---:|"
        fi
    fi
    echo "$head"
    echo "$rule"
    skip=0
    for n in $NS; do
        if [ $skip = 1 ]; then
            echo "| $n | skipped | skipped | |"
            continue
        fi
        f=$(gen "$p" "$n")
        tc=$(secs "$DMC" check "$f")
        tp=$(secs "$DMC" plan --json "$f")
        arena=$(grep -o '"arena_bytes": *[0-9]*' "$work/out" | head -1 | grep -o '[0-9]*$' || true)
        row="| $n | $tc | $tp | ${arena:-?}"
        if [ "$CAP" = 1 ] && [ -n "$arena" ]; then
            tcap=$(secs "$DMC" plan --json --vram-cap $((arena / 2)) "$f")
            carena=$(grep -o '"arena_bytes": *[0-9]*' "$work/out" | head -1 | grep -o '[0-9]*$' || true)
            row="$row | $tcap | ${carena:-?}"
        fi
        if [ "$COMPILE" = 1 ]; then
            rm -rf "$work/out-dir"
            tk=$(secs "$DMC" compile "$f" -o "$work/out-dir")
            row="$row | $tk"
            rm -rf "$work/out-dir"
        fi
        if [ -n "$BASE" ]; then
            bp=$(secs "$BASE" plan --json "$f")
            row="$row | $bp | $(ratio "$tp" "$bp")"
            if [ "$COMPILE" = 1 ]; then
                rm -rf "$work/out-dir"
                bk=$(secs "$BASE" compile "$f" -o "$work/out-dir")
                rm -rf "$work/out-dir"
                row="$row | $bk | $(ratio "$tk" "$bk")"
            fi
        fi
        echo "$row |"
        for t in "$tc" "$tp"; do
            case $t in
            fail*) ;;
            *) if awk -v t="${t%% *}" -v l="$LIMIT" 'BEGIN{exit !(t > l)}'; then skip=1; fi ;;
            esac
        done
    done
done
