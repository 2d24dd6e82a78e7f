"""--kv-cache-dtype fp8's accuracy on the real default model (SmolLM2-135M, its GGUF dequantized), measured on the
CPU: the engine refuses fp8 KV there (its native kernels read caches in the model dtype), so the test swaps the
loaded runner's caches for e4m3 ones as a GPU load allocates them (scales set by the first prefill step from its
keys and values: Attention._calibrate_scales); every read then goes through
the torch references (reference.to_cache / from_cache: the stored form the CUDA kernels write and read) and SDPA's
dequantized prefix. The text is scored in chunks of 32 tokens, so each chunk after the first attends to its prefix
through the fp8 cache (a single chunk would attend to its own unrounded keys only). Gate: perplexity within +1% of
the same chunked scoring over the float32 cache. Measured here (2026-12-07): 18.213 -> 18.287 (+0.41%); with scales
left at 1.0, 18.486 (+1.50%)."""

from __future__ import annotations

import pytest
import torch

from engine import LLM
from tests.engine.test_gpu_quant_modes import TEXT, _perplexity

if torch.cuda.is_available():
    pytest.skip("the CPU measurement (a GPU runs the kernels: tests/gpu/test_fp8_kv_cache_cuda.py)",
                allow_module_level=True)


def test_smollm2_perplexity_with_an_fp8_kv_cache(smollm2_gguf):
    llm = LLM(str(smollm2_gguf), dtype="float32", kv_cache_memory_gib=0.1, quantization="none",
              max_num_batched_tokens=32, enable_prefix_caching=False)
    try:
        ids = llm.tokenizer.encode(TEXT)
        assert len(ids) > 128
        base = _perplexity(llm, ids)
        runner = llm.core.runner
        runner.kv_cache_dtype = torch.float8_e4m3fn
        runner._allocate_kv_cache()  # the same blocks, one byte an element, scales to be set by the first chunk
        attn = runner.model.attention_layers()[0]
        assert attn.k_cache.dtype == torch.float8_e4m3fn and attn.k_scale.item() == 1.0 and attn.calibrate_scales
        fp8 = _perplexity(llm, ids)
        scales = (attn.k_scale.item(), attn.v_scale.item())
        assert not attn.calibrate_scales and scales != (1.0, 1.0)
    finally:
        llm.close()
    rel = fp8 / base - 1
    print(f"\nSmolLM2-135M, {len(ids)} tokens in chunks of 32, float32: perplexity {base:.3f} with a float32 KV cache, "
          f"{fp8:.3f} with fp8 e4m3 ({100 * rel:+.2f}%); layer 0's scales {scales[0]:.4f} (keys), {scales[1]:.4f}")
    assert fp8 != base  # the fp8 cache was really read
    assert rel <= 0.01, (base, fp8)
