"""GPU quantization compiled on the device: the fused dequantize-and-multiply kernel, the whole-weight
dequantization, per-token fp8 activations and torch._scaled_mm against dequantize-then-matmul references on random
shapes (and the Llama-3-8B ones), fp8 weights on the Triton kernels, integer weights (the "mma" layout) through
quant_linear on the tensor-core kernels (the Triton integer kernels were deleted, issue 46); then the engine with
--quantization int8 / int4 / fp8: graph replays equal the
same steps eager, greedy tokens equal --enforce-eager's, and the logits stay near the CPU's on the same
quantized weights."""

from __future__ import annotations

import random

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from engine.layers.linear import LinearBase, quantize_for_gpu
from engine.llm import LLM
from engine.ops import quant_linear_triton as kern
from engine.ops.quant_linear import quant_linear
from engine.sampling_params import SamplingParams
from engine.weight_quant import FP8, Fp8Weight, IntCodes, quantize_int

FP8_OK = torch.cuda.get_device_capability() >= (8, 9)


def _act_order(w: torch.Tensor, group: int, gen) -> IntCodes:
    c = quantize_int(w, 4, group, symmetric=False)
    order = torch.randperm(w.shape[1], generator=gen)
    g_idx = torch.empty(w.shape[1], dtype=torch.int32)
    g_idx[order] = (torch.arange(w.shape[1]) // group).to(torch.int32)
    return IntCodes(c.codes, c.scales, c.zeros, 4, group, g_idx)


def _weights(n: int, k: int, gen) -> dict:
    w = torch.randn(n, k, generator=gen) * 0.02
    # the engine's integer forms in the GPU's one layout ("mma": the tensor-core kernels, also test_int_mma.py)
    forms = {"int8": quantize_for_gpu(w, "int8").as_layout("mma"),
             "int4": quantize_for_gpu(w, "int4").as_layout("mma"),
             "int4 g32": quantize_int(w, 4, 32, False).pack(layout="mma"),
             "int8 g64 asym": quantize_int(w, 8, 64, False).pack(layout="mma"),
             "int4 act-order": _act_order(w, 64, gen).pack(layout="mma")}
    if FP8_OK:
        forms.update({"fp8 channel": Fp8Weight.quantize(w, "channel"), "fp8 tensor": Fp8Weight.quantize(w, "tensor"),
                      "fp8 block": Fp8Weight((w * 3000).clamp(-448, 448).to(FP8), torch.rand(-(-n // 128), -(-k // 128), generator=gen)
                                             / 1000 + 1e-4)})
    return {name: f.to("cuda") for name, f in forms.items() if f is not None}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fused_kernel_random_shapes(dtype):
    """Every form at 1 row, a few rows and past 16 (fp8: the Triton kernel's configurations; integers: quant_linear,
    the tensor-core kernels sliced by 16 rows up to 64, the dequantized weight and cuBLAS beyond); fp16 on the
    integer forms. Few shapes: each (form, K, configuration) is a compile."""
    rng = random.Random(11)
    gen = torch.Generator().manual_seed(11)
    for n, k in ((200, 384), (4096, 576)):
        for name, w in _weights(n, k, gen).items():
            if dtype == torch.float16 and not name.startswith("int"):
                continue
            integer = name.startswith("int")
            if not integer and not kern.supported(w):
                assert name == "fp8 block" and k % 128, name  # a partial last block: dequantized instead
                continue
            ref_w = w.dequantize().cuda()
            for m in ((1, rng.randrange(2, 16), rng.randrange(33, 257)) if n == 200 else (1, 16)):
                x = torch.randn(m, k, device="cuda", dtype=dtype)
                bias = torch.randn(n, device="cuda", dtype=dtype) if m % 2 else None
                ref = x.float() @ ref_w.t() + (0 if bias is None else bias.float())
                got = quant_linear(x, w, bias) if integer else kern.fused(x, w, bias)
                err = (got.float() - ref).abs().max().item()
                assert err <= 1e-2 * ref.abs().max().item() + 1e-3, (name, n, k, m, err)


def test_dequantize_kernel_is_exact_and_prefill_path_matches():
    gen = torch.Generator().manual_seed(3)
    from engine.ops import int_mma

    for name, w in _weights(384, 1024, gen).items():
        whole = int_mma.dequantize(w, torch.float32) if name.startswith("int") else kern.dequantize(w, torch.float32)
        assert torch.equal(whole, w.dequantize().cuda()), name
        x = torch.randn(1000, 1024, device="cuda", dtype=torch.bfloat16)  # past the fused kernel's rows: a prefill
        ref = x.float() @ w.dequantize().cuda().t()
        got = quant_linear(x, w)
        # fp8 per channel / tensor: W8A8 through _scaled_mm (x quantized per token: a few % per product)
        tol = 5e-2 if isinstance(w, Fp8Weight) and w.kind != "block" else 1e-2
        assert (got.float() - ref).abs().max() <= tol * ref.abs().max(), name


@pytest.mark.skipif(not FP8_OK, reason="fp8 needs compute capability 8.9+")
def test_fp8_per_token_and_scaled_mm():
    gen = torch.Generator(device="cuda").manual_seed(5)
    x = torch.randn(300, 4096, device="cuda", generator=gen, dtype=torch.bfloat16) * 3
    x[7] = 0
    q, s = kern.fp8_per_token(x)
    amax = x.float().abs().amax(1, keepdim=True)
    s_ref = torch.where(amax > 0, amax / 448, torch.ones_like(amax))
    torch.testing.assert_close(s, s_ref)
    assert torch.equal(q.float(), (x.float() / s_ref).clamp(-448, 448).to(FP8).float())
    w = Fp8Weight.quantize(torch.randn(512, 4096, device="cuda", generator=gen) * 0.02, "channel")
    got = kern.fp8_scaled_mm(x, w)
    ref = (q.float() * s) @ w.dequantize().t()  # the same quantized operands, float32
    torch.testing.assert_close(got.float(), ref, atol=2e-2 * ref.abs().max().item(), rtol=1e-2)


def _generate(model_dir, quantization: str, eager: bool = False, bucketed: bool = False):
    prompts = ["The quick brown fox", "Quantized weights on the GPU", "x", "One two three four five six", "Hello"]
    params = [SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, logprobs=2),
              SamplingParams(max_tokens=7, temperature=0.9, seed=4, ignore_eos=True)]
    with LLM(str(model_dir), dtype="bfloat16", device="cuda", quantization=quantization, enable_prefix_caching=False,
             max_num_seqs=8, kv_cache_memory_gib=0.25, enforce_eager=eager) as llm:
        linears = [m for m in llm.core.runner.model.modules() if isinstance(m, LinearBase)]
        assert all(m.quant is not None for m in linears)
        if bucketed:
            llm.core.runner.capture_decode_graphs(capture=False)
        outs = llm.generate(prompts, [params[i % 2] for i in range(len(prompts))])
        return [(o.outputs[0].token_ids, [(lp.token_id, lp.logprob) for lp in o.outputs[0].logprobs or []])
                for o in outs]


@pytest.mark.parametrize("quantization", ["int8", "int4"] + (["fp8"] if FP8_OK else []))
def test_engine_quantized_graphs_equal_eager(tiny_model_dir, quantization):
    d = tiny_model_dir("llama")
    graphs = _generate(d, quantization)
    assert graphs == _generate(d, quantization, bucketed=True)  # replay = the same padded steps eager, bit for bit
    eager = _generate(d, quantization, eager=True)
    assert [t for t, _ in graphs][::2] == [t for t, _ in eager][::2]  # greedy prompts: the same tokens


@pytest.mark.parametrize("quantization", ["int8", "int4"] + (["fp8"] if FP8_OK else []))
def test_engine_quantized_logits_near_the_cpu(tiny_model_dir, quantization):
    """The same quantized weights (quantize_weights on the CPU, float32, dequantized per call) against the GPU's
    kernels in bf16: the logits agree to bf16's precision."""
    d = tiny_model_dir("qwen2")
    ids = list(range(5, 60))
    with LLM(str(d), dtype="float32", device="cpu", kv_cache_memory_gib=0.05) as cpu:
        cpu.core.runner.model.quantize_weights(quantization)
        ref = cpu.core.score(ids)
    with LLM(str(d), dtype="bfloat16", device="cuda", quantization=quantization, kv_cache_memory_gib=0.1) as gpu:
        got = gpu.core.score(ids).cpu()
    assert (got - ref).abs().max() <= 0.05 * ref.abs().max() + 0.05
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean() >= 0.9
