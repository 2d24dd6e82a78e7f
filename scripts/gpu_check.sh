#!/usr/bin/env bash
# On a CUDA machine with the toolchain (the `device` machine): build engine._C with its CUDA kernels for this GPU
# only and run the GPU tests. Results go to $OUT (or ./out). Usage: bash scripts/gpu_check.sh [pytest args]
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
cap=$(python3 -c "import torch; print(''.join(map(str, torch.cuda.get_device_capability())))")
export KESTREL_CUDA_ARCHS=${KESTREL_CUDA_ARCHS:-$cap}
start=$SECONDS
if ! python3 -m pip install -q --no-build-isolation --no-deps -e . > "$OUT/build.log" 2>&1; then
  tail -40 "$OUT/build.log"; exit 1
fi
echo "built for sm_$KESTREL_CUDA_ARCHS in $((SECONDS - start)) s"
python3 -m pytest -q -p no:cacheprovider tests/gpu "$@" 2>&1 | tee "$OUT/gpu_tests.txt" | tail -25
