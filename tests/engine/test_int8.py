"""--quantization int8: every linear layer with int8 weights (groups of 32) must compute exactly what transformers
computes on the same weights quantized and dequantized (float32), for every architecture; and on the real
SmolLM2 GGUF the quantized model stays close to the float one."""

import copy

import pytest
import torch

from engine import LLM
from engine.ops import Int8Weight
from tests.support.tiny_models import TINY_ARCHS


def _dequantized_reference(hf):
    """A copy of the transformers model whose linear weights went through int8 and back, and the LM head matrix
    as the engine quantizes it (tied models: the embedding's rows, quantized for the head only)."""
    ref = copy.deepcopy(hf)
    for m in ref.model.modules():
        if isinstance(m, torch.nn.Linear) and Int8Weight.supports(m.weight):
            m.weight.data = Int8Weight.quantize(m.weight.data).dequantize()
    head = Int8Weight.quantize(ref.lm_head.weight.data).dequantize()
    return ref, head


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_int8_model_equals_transformers_on_dequantized_weights(arch, tiny_model_dir, hf_reference):
    path = tiny_model_dir(arch)
    ref, head = _dequantized_reference(hf_reference(path))
    llm = LLM(str(path), dtype="float32", quantization="int8", kv_cache_memory_gib=0.05)
    try:
        ids = torch.randint(3, llm.core.model_config.vocab_size, (41,), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            hidden = ref.model(ids.unsqueeze(0)).last_hidden_state[0]
        expected = hidden @ head.T
        torch.testing.assert_close(llm.core.score(ids.tolist()), expected, atol=1e-4, rtol=1e-4)
        # and it really is the int8 path: the float weights are gone
        layer = llm.core.runner.model.layers[0]
        assert layer.mlp.gate_up_proj.quant is not None and layer.mlp.gate_up_proj.weight.numel() == 0
    finally:
        llm.close()


def test_int8_smollm2_stays_close_to_float(smollm2_fp32, smollm2_gguf):
    q = LLM(str(smollm2_gguf), dtype="float32", quantization="int8")
    try:
        ids = smollm2_fp32.tokenizer.encode("The three primary colors are red, blue and yellow. Mixing red and")
        a, b = smollm2_fp32.core.score(ids), q.core.score(ids)
        # the float model's next-token log-likelihood of the text vs the int8 one: within 1%
        def nll(logits):
            lp = torch.log_softmax(logits[:-1], -1)
            return -lp.gather(1, torch.tensor(ids[1:]).unsqueeze(1)).mean().item()
        assert abs(nll(b) - nll(a)) / nll(a) < 0.01, (nll(a), nll(b))
        assert (a.argmax(-1) == b.argmax(-1)).float().mean() > 0.9
    finally:
        q.close()

