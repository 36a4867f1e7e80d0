#!/usr/bin/env bash
# Memory of global-norm clipping: the planned arena of each one-line-`train` example without
# clipping, with `clip_norm: 1` as held gradients, and with `clip_norm: 1` as the norm pass
# (`dmc plan --clip-norm-method held|norm-pass`). Prints one markdown table.
#
#   bench/clip-norm-memory.sh                        # every example with a one-line train block
#   EXAMPLES="seed resnet18" bench/clip-norm-memory.sh
set -euo pipefail
cd "$(dirname "$0")/.."
DMC=${DMC:-target/release/dmc}
EXAMPLES=${EXAMPLES:-"seed resnet18 resnet_small mobilenet unet deep_convnet bn_cnn"}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
arena() { "$DMC" plan "$@" | sed -n 's/.*arena [^(]*(\([0-9,]*\) B).*/\1/p' | head -1 | tr -d ,; }
echo "| example | parameters | no clip | held gradients | norm pass | held / no clip | norm pass / no clip |"
echo "|---|---:|---:|---:|---:|---:|---:|"
for e in $EXAMPLES; do
  src=examples/$e.dm
  grep -q '^train {.*}' "$src" || { echo "skip $e (multi-line train block)" >&2; continue; }
  sed 's/^train {/train { clip_norm: 1,/' "$src" > "$tmp/$e.dm"
  none=$(arena "$src")
  held=$(arena "$tmp/$e.dm" --clip-norm-method held)
  np=$(arena "$tmp/$e.dm" --clip-norm-method norm-pass)
  params=$("$DMC" plan "$src" --json | python3 -c 'import json,sys; p=json.load(sys.stdin); print(p["all_buffers"]["parameters"])' 2>/dev/null || echo "?")
  python3 - "$e" "$params" "$none" "$held" "$np" <<'P'
import sys
e, params, none, held, np = sys.argv[1:]
f = lambda b: f"{int(b):,}"
print(f"| {e} | {f(params) if params != '?' else '?'} | {f(none)} | {f(held)} | {f(np)} | {int(held)/int(none):.3f}x | {int(np)/int(none):.3f}x |")
P
done
