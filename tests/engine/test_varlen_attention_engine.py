"""The engine with the paged varlen attention kernel (Triton, in its interpreter on the CPU: tests/conftest.py sets
TRITON_INTERPRET=1 where there is no GPU) forced on: greedy tokens equal those of the SDPA path. The kernel itself
against its reference: tests/unit/test_varlen_attention.py."""

from __future__ import annotations

import pytest
import torch

if torch.cuda.is_available():
    pytest.skip("CPU interpreter tests (tests/gpu covers CUDA)", allow_module_level=True)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_engine_greedy_with_the_kernel_equals_sdpa(tiny_model_dir, arch, monkeypatch):
    """Chunked prefill and a prefix-cache hit, with decodes in the same steps: the Triton kernel (forced on the
    CPU) and the SDPA path give the same greedy tokens in float32."""
    from engine.llm import LLM
    from engine.sampling_params import SamplingParams

    prompts = ["The quick brown fox jumps over the lazy dog " * 3, "The quick brown fox jumps over the lazy cat",
               "Paged attention"]
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)

    from engine.kernel_config import KernelConfig, resolve
    from engine.runner import model_runner

    def greedy(backend: str) -> list[list[int]]:
        # the kernel configuration's prefill_attention, as a user's choice would set it at start-up
        monkeypatch.setattr(model_runner, "resolve_kernels", lambda facts, config: resolve(
            facts, config, KernelConfig(prefill_attention=backend)))
        with LLM(str(tiny_model_dir(arch)), dtype="float32", num_threads=1, max_num_batched_tokens=24,
                 enable_prefix_caching=True) as llm:
            assert llm.core.runner.attention.name == backend
            first = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
            again = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]  # prefix-cache hits
            assert again == first
            return first

    assert greedy("triton") == greedy("sdpa")
