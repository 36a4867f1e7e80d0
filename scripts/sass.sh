#!/usr/bin/env bash
# The machine code (SASS) of one generated kernel, without a GPU: dmc renders it, NVRTC compiles it
# to PTX ($DMC_NVRTC), ptxas assembles it for the architecture (the nvidia-cuda-nvcc-cu12 wheel) and
# nvdisasm disassembles it (the nvidia-cuda-nvdisasm wheel); both wheels are fetched once into
# .ci/.cache/sass. Prints ptxas' registers and spills and the kernel's global loads and stores,
# shared loads, FMAs and barriers in order (runs of one instruction counted), or the whole listing
# with FULL=1. What it tells: whether loads issue together, what ptxas predicated, what spilled.
#
#   scripts/sass.sh examples/seed.dm conv2d_3                 # sm_90, the default options
#   scripts/sass.sh examples/seed.dm conv2d_3 sm_80 --no-skinny
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { echo "usage: scripts/sass.sh <program.dm> <kernel> [sm_XX] [dmc compile flags...]" >&2; exit 2; }
prog=$1 kernel=$2 arch=${3:-sm_90}
shift $(( $# >= 3 ? 3 : 2 ))
DMC=${DMC:-target/release/dmc}
[ -x "$DMC" ] || cargo build --release --bin dmc >&2
: "${DMC_NVRTC:?set DMC_NVRTC to libnvrtc.so.12 (pip install nvidia-cuda-nvrtc-cu12)}"
tools=.ci/.cache/sass
if [ ! -x "$tools/ptxas" ] || [ ! -x "$tools/nvdisasm" ]; then
    mkdir -p "$tools/wheels"
    python3 -m pip download --quiet --no-deps -d "$tools/wheels" nvidia-cuda-nvcc-cu12 nvidia-cuda-nvdisasm >&2
    for w in "$tools"/wheels/*.whl; do python3 -m zipfile -e "$w" "$tools/x" >/dev/null; done
    cp "$(find "$tools/x" -type f -name ptxas | head -1)" "$tools/ptxas"
    cp "$(find "$tools/x" -type f -name nvdisasm | head -1)" "$tools/nvdisasm"
    chmod +x "$tools/ptxas" "$tools/nvdisasm"
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$DMC" compile "$prog" -o "$work/out" "$@" >/dev/null
src="$work/out/$kernel.cu"
[ -f "$src" ] || { echo "no kernel $kernel in $prog (see $DMC compile)" >&2; exit 1; }
python3 - "$src" "$work/k.ptx" "$arch" <<'PY'
import ctypes, os, sys
src, out, arch = sys.argv[1], sys.argv[2], sys.argv[3]
lib = ctypes.CDLL(os.environ["DMC_NVRTC"])
prog = ctypes.c_void_p()
if lib.nvrtcCreateProgram(ctypes.byref(prog), open(src, "rb").read(), b"k.cu", 0, None, None):
    sys.exit("nvrtcCreateProgram failed")
opts = [b"--gpu-architecture=compute_" + arch.removeprefix("sm_").encode(), b"--std=c++17"]
rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
n = ctypes.c_size_t()
lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
log = ctypes.create_string_buffer(n.value)
lib.nvrtcGetProgramLog(prog, log)
if rc:
    sys.exit(log.value.decode())
lib.nvrtcGetPTXSize(prog, ctypes.byref(n))
ptx = ctypes.create_string_buffer(n.value)
lib.nvrtcGetPTX(prog, ptx)
open(out, "w").write(ptx.value.decode())
PY
"$tools/ptxas" -arch="$arch" -v "$work/k.ptx" -o "$work/k.cubin" 2>&1 | grep -E "Compiling|registers|spill"
"$tools/nvdisasm" "$work/k.cubin" 2>/dev/null > "$work/k.sass"
if [ -n "${FULL:-}" ]; then
    cat "$work/k.sass"
else
    grep -E '^ +/\*[0-9a-f]{4}\*/' "$work/k.sass" | grep -E "LDG|STG|LDS|STS|FFMA|BAR|EXIT" | sed -E 's@/\*[0-9a-f]+\*/@@g; s/ +/ /g' |
        awk '{ i = ($1 ~ /^@/) ? $1 " " $2 : $1; print i }' | uniq -c
fi
