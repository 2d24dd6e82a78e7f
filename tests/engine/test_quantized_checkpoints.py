"""Pre-quantized Hugging Face checkpoints (engine/loader/quantized.py): GPTQ, AWQ and FP8 files written here by an
independent round-to-nearest quantizer and packer, read back exactly (whole, sliced, and as IntCodes / Fp8Weight);
Kestrel on each equals Kestrel on the same model saved as floats; broken files give readable CheckpointErrors."""

from __future__ import annotations

import json
import logging
import re
import shutil
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.errors import CheckpointError
from engine.loader import load_checkpoint
from engine.loader.quantized import QuantizedWeights, parse_scheme
from engine.weight_quant import Fp8Weight, IntCodes

from tests.support.tiny_models import WIDE_DIMS, build_tiny_model, write_tokenizer  # noqa: I001

LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
           "mlp.up_proj", "mlp.down_proj")
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # AutoAWQ WQLinear_GEMM.from_linear's order_map
E4M3 = torch.float8_e4m3fn

# id -> (quantization_config, the scheme's name, torch_dtype in config.json or None, writer options)
FORMATS = {
    "gptq-4b-g128-sym": ({"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True, "desc_act": False},
                         "GPTQ int4 g128", "float16", {}),
    "gptq-4b-g32-asym": ({"quant_method": "gptq", "bits": 4, "group_size": 32, "sym": False, "desc_act": False},
                         "GPTQ int4 g32", "float16", {}),
    "gptq-4b-g64-act-order": ({"quant_method": "gptq", "bits": 4, "group_size": 64, "sym": True, "desc_act": True},
                              "GPTQ int4 g64 act-order", "bfloat16", {}),
    "gptq-8b-per-channel": ({"quant_method": "gptq", "bits": 8, "group_size": -1, "sym": False, "desc_act": False},
                            "GPTQ int8 per-channel", None, {}),
    "gptq_v2-4b-g64-asym": ({"quant_method": "gptq", "bits": 4, "group_size": 64, "sym": False, "desc_act": False,
                             "checkpoint_format": "gptq_v2"}, "GPTQ int4 g64", "float16", {"g_idx": False}),
    "awq-4b-g128": ({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm",
                     "modules_to_not_convert": None}, "AWQ int4 g128", "float16", {}),
    "fp8-block": ({"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
                   "weight_block_size": [128, 128]}, "FP8 block 128x128", "bfloat16", {}),
    "fp8-tensor": ({"quant_method": "fp8", "activation_scheme": "static"}, "FP8 per-tensor", None,
                   {"input_scale": True}),
    "ct-fp8-tensor": ("tensor", "FP8 per-tensor", "bfloat16", {}),
    "ct-fp8-channel": ("channel", "FP8 per-channel", "bfloat16", {"input_scale": True}),
    "ct-fp8-block": ("block", "FP8 block 128x128", "float16", {}),
}


def _compressed_tensors(strategy: str, static_inputs: bool) -> dict:
    weights = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": False, "strategy": strategy,
               "block_structure": [128, 128] if strategy == "block" else None}
    inputs = ({"num_bits": 8, "type": "float", "symmetric": True, "dynamic": not static_inputs,
               "strategy": "tensor" if static_inputs else "token"})
    return {"quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
            "ignore": ["lm_head"], "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights,
                                                                 "input_activations": inputs}}}


# -- the test's own quantizers and packers (round to nearest; the formats' documented layouts) ----------------

def rtn_int(w: torch.Tensor, bits: int, group: int, sym: bool, perm: torch.Tensor | None):
    """codes [N, K], zeros [N, G], scales fp16 [N, G], g_idx [K]: GPTQ's round to nearest, with its symmetric
    grid (scale 2 * absmax / maxq, zero (maxq + 1) / 2) or min-max; act-order (perm): groups of consecutive
    columns in perm's order, so g_idx[k] = position of k in perm // group."""
    n, k = w.shape
    group = k if group == -1 else group
    maxq = 2 ** bits - 1
    order = torch.arange(k) if perm is None else perm
    g_idx = torch.empty(k, dtype=torch.long)
    g_idx[order] = torch.arange(k) // group
    ng = -(-k // group)
    codes = torch.zeros(n, k, dtype=torch.long)
    zeros = torch.zeros(n, ng, dtype=torch.long)
    scales = torch.zeros(n, ng, dtype=torch.float16)
    for g in range(ng):
        cols = order[g * group:(g + 1) * group]
        x = w[:, cols].double()
        if sym:
            s = (2 * x.abs().amax(1) / maxq).half()
            z = torch.full((n,), (maxq + 1) // 2, dtype=torch.long)
        else:
            lo, hi = x.amin(1).clamp(max=0), x.amax(1).clamp(min=0)
            s = ((hi - lo) / maxq).half()
            z = torch.round(-lo / s.double()).long()
        codes[:, cols] = (torch.round(x / s.double()[:, None]).long() + z[:, None]).clamp(0, maxq)
        zeros[:, g], scales[:, g] = z, s
    return codes, zeros, scales, g_idx


def dequant_int(codes, zeros, scales, g_idx) -> torch.Tensor:
    return (codes.float() - zeros.float()[:, g_idx]) * scales.float()[:, g_idx]


def pack(values: torch.Tensor, bits: int, dim: int, order: list[int] | None = None) -> torch.Tensor:
    """int32 words of ``values`` packed along ``dim``: value i of a word in bits bits*i.. (``order``: slot i holds
    the word's value order[i])."""
    per = 32 // bits
    v = values.numpy().astype(np.uint32)
    v = v.reshape(v.shape[0] // per, per, v.shape[1]).transpose(0, 2, 1) if dim == 0 else \
        v.reshape(v.shape[0], v.shape[1] // per, per)
    if order is not None:
        v = v[:, :, order]
    out = np.zeros(v.shape[:2], dtype=np.uint32)
    for i in range(per):
        out |= v[:, :, i] << np.uint32(bits * i)
    return torch.from_numpy(out.view(np.int32).copy())


def quantize_fp8(w: torch.Tensor, kind: str):
    """(e4m3 [N, K], scale: [] per tensor, [N, 1] per channel, [ceil(N/128), ceil(K/128)] per block, the
    reference dequantization float32)."""
    n, k = w.shape
    if kind == "tensor":
        s = w.abs().amax() / 448
        full = s.expand(n, k)
    elif kind == "channel":
        s = w.abs().amax(1, keepdim=True) / 448
        full = s.expand(n, k)
    else:
        s = torch.zeros(-(-n // 128), -(-k // 128))
        for i in range(s.shape[0]):
            for j in range(s.shape[1]):
                s[i, j] = w[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128].abs().amax() / 448
        full = s.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]
    q = (w / full).clamp(-448, 448).to(E4M3)
    return q, s.float(), q.float() * full.float()


def act_order_perm(prefix: str, k: int) -> torch.Tensor:
    """GPTQ's act-order sorts the columns by its input's Hessian, so the layers of one input (q / k / v, gate /
    up) share their order (and the engine can fuse them quantized); other layers get their own."""
    shared = re.sub(r"\.(q|k|v)_proj$", ".qkv", re.sub(r"\.(gate|up)_proj$", ".gate_up", prefix))
    return torch.randperm(k, generator=torch.Generator().manual_seed(zlib.crc32(shared.encode())))


def quantize_linear(fmt: str, qc, w: torch.Tensor, prefix: str, opts: dict, gen: torch.Generator):
    """The stored tensors of one linear and its reference dequantization (float32)."""
    if isinstance(qc, str) or qc["quant_method"] == "fp8":
        kind = qc if isinstance(qc, str) else ("block" if qc.get("weight_block_size") else "tensor")
        q, s, ref = quantize_fp8(w, kind)
        name = "weight_scale_inv" if kind == "block" and not isinstance(qc, str) else "weight_scale"
        if isinstance(qc, str) and kind == "tensor":
            s = s.reshape(1)
        out = {f"{prefix}.weight": q, f"{prefix}.{name}": s}
        if opts.get("input_scale"):
            out[f"{prefix}.input_scale"] = torch.tensor([0.05])
        return out, ref
    bits, group = qc["bits"], qc["group_size"]
    if qc["quant_method"] == "awq":
        codes, zeros, scales, g_idx = rtn_int(w, 4, group, False, None)
        out = {f"{prefix}.qweight": pack(codes.t(), 4, 1, AWQ_ORDER),
               f"{prefix}.qzeros": pack(zeros.t(), 4, 1, AWQ_ORDER),
               f"{prefix}.scales": scales.t().contiguous()}
        return out, dequant_int(codes, zeros, scales, g_idx)
    perm = act_order_perm(prefix, w.shape[1]) if qc["desc_act"] else None
    codes, zeros, scales, g_idx = rtn_int(w, bits, group, qc["sym"], perm)
    stored = zeros if qc.get("checkpoint_format") == "gptq_v2" else zeros - 1  # v1: each zero minus one
    assert stored.min() >= 0
    out = {f"{prefix}.qweight": pack(codes.t(), bits, 0), f"{prefix}.qzeros": pack(stored.t(), bits, 1),
           f"{prefix}.scales": scales.t().contiguous()}
    if opts.get("g_idx", True):
        out[f"{prefix}.g_idx"] = g_idx.to(torch.int32)
    return out, dequant_int(codes, zeros, scales, g_idx)


# -- checkpoints -------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def float_model(tmp_path_factory):
    """A tiny random Llama with K and N multiples of 128 (hidden 256, intermediate 512, 2 KV heads of 64), its
    config.json and its float32 tensors; a small vocabulary and a separate (float) lm_head."""
    model = build_tiny_model("llama", dims=WIDE_DIMS, vocab_size=1024)
    d = tmp_path_factory.mktemp("float_src")
    model.save_pretrained(str(d))
    config = json.loads((d / "config.json").read_text())
    return config, {k: v.contiguous() for k, v in model.state_dict().items()}


def _write(dest: Path, tensors: dict, config: dict, tokenizer_dir: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(dest / "model.safetensors"))
    (dest / "config.json").write_text(json.dumps(config, indent=1))
    write_tokenizer(dest, tokenizer_dir, "llama")
    return dest


@pytest.fixture(scope="module")
def quantized_dir(float_model, tmp_path_factory, smollm2_tokenizer_dir):
    """Factory: ``quantized_dir(fmt, torch_dtype=...) -> (directory, {linear weight name: reference float32})``."""
    root = tmp_path_factory.mktemp("quantized")
    cache: dict = {}

    def make(fmt: str, torch_dtype: str | None = "default"):
        key = (fmt, torch_dtype)
        if key not in cache:
            qc, _, dtype, opts = FORMATS[fmt]
            dtype = dtype if torch_dtype == "default" else torch_dtype
            config, state = float_model
            gen = torch.Generator().manual_seed(7)
            tensors, refs = {}, {}
            for name, t in state.items():
                prefix = name.removesuffix(".weight")
                if prefix.split(".", 3)[-1] in LINEARS and name.endswith(".weight"):
                    stored, refs[name] = quantize_linear(fmt, qc, t, prefix, opts, gen)
                    tensors.update(stored)
                else:
                    tensors[name] = t
            cfg = dict(config, quantization_config=_compressed_tensors(qc, bool(opts.get("input_scale")))
                       if isinstance(qc, str) else qc)
            cfg.pop("dtype", None)
            cfg.pop("torch_dtype", None)
            if dtype is not None:
                cfg["torch_dtype"] = dtype
            cache[key] = _write(root / f"{fmt}-{dtype}", tensors, cfg, smollm2_tokenizer_dir), refs
        return cache[key]

    return make


def _default_dtype(fmt: str) -> torch.dtype:
    dtype = FORMATS[fmt][2]
    if dtype is None:
        return torch.bfloat16 if "fp8" in fmt else torch.float16
    return getattr(torch, dtype)


# -- 1. every format reads back exactly ------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", FORMATS)
def test_tensors_read_back_exactly(fmt, quantized_dir, float_model):
    path, refs = quantized_dir(fmt)
    ck = load_checkpoint(path)  # validate_weights passes on the wrapper
    w = ck.weights
    dtype = _default_dtype(fmt)
    assert isinstance(w, QuantizedWeights) and ck.quantization == FORMATS[fmt][1]
    hidden = ("qweight", "qzeros", "scales", "g_idx", "weight_scale", "weight_scale_inv", "input_scale")
    assert not [n for n in w.names() if n.rsplit(".", 1)[-1] in hidden]
    assert set(w.names()) == set(float_model[1])
    for name, ref in refs.items():
        want = ref.to(dtype)
        n, k = ref.shape
        assert w.shape(name) == (n, k) and w.dtype(name) == dtype and name in w
        got = w.get(name)
        assert got.dtype == dtype and torch.equal(got, want), name
        q = w.quantized(name, 0, 0, n)
        assert isinstance(q, Fp8Weight if "fp8" in fmt else IntCodes)
        assert torch.equal(q.dequantize(dtype), want), name
        if isinstance(q, IntCodes):
            assert (q.g_idx is not None) == ("act-order" in fmt) and q.bits == FORMATS[fmt][0]["bits"]
        cuts_blocks = "block" in fmt
        cuts_groups = cuts_blocks or (isinstance(q, IntCodes) and q.g_idx is None and q.group < k)
        for dim, start, stop, cuts in ((0, 16, 48, cuts_blocks), (0, n // 2, n, cuts_blocks and n // 2 % 128),
                                       (1, 128, k, False), (1, 0, 128, False), (1, 8, 40, cuts_groups)):
            part = want.narrow(dim, start, stop - start)
            assert torch.equal(w.get_slice(name, dim, start, stop), part), (name, dim, start, stop)
            if cuts:
                with pytest.raises(ValueError, match="cut"):
                    w.quantized(name, dim, start, stop)
            else:
                qs = w.quantized(name, dim, start, stop)
                assert qs.shape == part.shape and torch.equal(qs.dequantize(dtype), part), (name, dim, start, stop)
                whole = q.rows(start, stop) if dim == 0 else q.cols(start, stop)  # the whole form, sliced
                assert torch.equal(whole.dequantize(), qs.dequantize()) and whole.group == qs.group \
                    if isinstance(q, IntCodes) else torch.equal(whole.scale, qs.scale)
    # everything else passes through, lm_head (kept float) included
    for name in ("lm_head.weight", "model.embed_tokens.weight", "model.layers.1.input_layernorm.weight"):
        assert w.quantized(name, 0, 0, 1) is None and torch.equal(w.get(name), float_model[1][name])


def test_dequantization_is_logged_once(quantized_dir, caplog):
    path, refs = quantized_dir("gptq-4b-g128-sym")
    w = load_checkpoint(path).weights
    with caplog.at_level(logging.INFO, logger="engine.loader.quantized"):
        for name in list(refs)[:3]:
            w.get(name)
            w.get_slice(name, 0, 0, 8)
    said = [r.getMessage() for r in caplog.records if "dequantized" in r.getMessage()]
    assert said == ["GPTQ int4 g128 weights are dequantized to float16 (this device has no kernels for them; "
                    "memory as an unquantized model)"]


def test_static_input_scales_are_ignored_with_a_log_line(quantized_dir, caplog):
    path, _ = quantized_dir("ct-fp8-channel")
    with caplog.at_level(logging.INFO, logger="engine.loader.quantized"):
        ck = load_checkpoint(path)
    assert not [n for n in ck.weights.names() if n.endswith("input_scale")]
    assert any("input_scale tensors are ignored" in r.getMessage() for r in caplog.records)


# -- 2. end to end: the quantized checkpoint runs as its dequantized float twin ---------------------------------

@pytest.fixture(scope="module")
def float_twin(quantized_dir, float_model, tmp_path_factory, smollm2_tokenizer_dir):
    """Factory: the model of ``quantized_dir(fmt, "float32")`` saved as a float32 checkpoint, the linears
    replaced by their reference dequantization."""
    root = tmp_path_factory.mktemp("twins")

    def make(fmt: str) -> Path:
        _, refs = quantized_dir(fmt, "float32")
        config, state = float_model
        return _write(root / fmt, {**state, **refs}, dict(config, torch_dtype="float32"), smollm2_tokenizer_dir)

    return make


def _run(path: Path, ids: list[int]):
    from engine import LLM, SamplingParams

    llm = LLM(str(path), device="cpu", dtype="float32", kv_cache_memory_gib=0.02)
    try:
        logits = llm.core.score(ids)
        out = llm.generate([ids], SamplingParams(max_tokens=12, min_tokens=12, temperature=0, logprobs=1))
        return logits, out[0].outputs[0]
    finally:
        llm.close()


@pytest.mark.parametrize("fmt", FORMATS)
def test_runs_as_the_dequantized_float_model(fmt, quantized_dir, float_twin):
    path, _ = quantized_dir(fmt, "float32")
    ids = torch.randint(3, 1024, (23,), generator=torch.Generator().manual_seed(3)).tolist()
    logits, out = _run(path, ids)
    ref_logits, ref_out = _run(float_twin(fmt), ids)
    torch.testing.assert_close(logits, ref_logits, atol=1e-5, rtol=1e-5)
    assert out.token_ids == ref_out.token_ids
    assert len(out.logprobs) == 12
    assert np.allclose([lp.logprob for lp in out.logprobs], [lp.logprob for lp in ref_out.logprobs], atol=1e-5)


# checkpoints whose config.json says float16 or bfloat16 (their scales' dtype), one of each method and layout
_HALF_FORMATS = ["gptq-4b-g128-sym", "gptq-4b-g64-act-order", "awq-4b-g128", "fp8-block", "ct-fp8-channel"]


@pytest.mark.parametrize("fmt", _HALF_FORMATS)
def test_dequantized_once_into_the_engines_dtype(fmt, quantized_dir, float_twin):
    """A float16 / bfloat16 checkpoint in a float32 (or bfloat16) engine: its weights are dequantized straight into
    the engine's dtype (exact in float32, one rounding to bfloat16), never through the checkpoint's own dtype: the
    engine's weights are the float32 twin's bit for bit, and a float32 engine gives the twin's logits and logprobs
    at float32 tolerance (through float16 they moved ~1e-3)."""
    from engine import LLM, SamplingParams

    path, _ = quantized_dir(fmt)
    assert FORMATS[fmt][2] in ("float16", "bfloat16")
    ids = torch.randint(3, 1024, (23,), generator=torch.Generator().manual_seed(3)).tolist()
    params = SamplingParams(max_tokens=12, min_tokens=12, temperature=0, logprobs=1)
    for dtype in ("float32", "bfloat16"):
        got = {}
        for name, where in (("quantized", path), ("twin", float_twin(fmt))):
            llm = LLM(str(where), device="cpu", dtype=dtype, kv_cache_memory_gib=0.02)
            try:
                got[name] = ({k: v.clone() for k, v in llm.core.runner.model.state_dict().items()},
                             llm.core.score(ids), llm.generate([ids], params)[0].outputs[0])
            finally:
                llm.close()
        (weights, logits, out), (twin_weights, twin_logits, twin_out) = got["quantized"], got["twin"]
        assert weights.keys() == twin_weights.keys()
        differ = [k for k in weights if not torch.equal(weights[k], twin_weights[k])]
        assert not differ, (dtype, differ)
        if dtype == "float32":
            torch.testing.assert_close(logits, twin_logits, atol=1e-5, rtol=1e-5)
            assert out.token_ids == twin_out.token_ids
            assert np.allclose([lp.logprob for lp in out.logprobs], [lp.logprob for lp in twin_out.logprobs],
                               atol=1e-5, rtol=0)


_GPU_FORMATS = ["gptq-4b-g128-sym", "gptq-4b-g64-act-order", "gptq-8b-per-channel", "gptq_v2-4b-g64-asym",
                "awq-4b-g128", "fp8-block", "ct-fp8-channel", "ct-fp8-tensor"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the GPU's quantized kernels need CUDA")
@pytest.mark.parametrize("fmt", _GPU_FORMATS)
def test_gpu_runs_the_weights_quantized(fmt, quantized_dir, float_twin):
    """On a GPU the linears keep the checkpoint's codes (IntWeight / Fp8Weight, packed from ``quantized``); the
    logits are as close to the float32 CPU run as those of the dequantized twin on the same GPU."""
    from engine import LLM
    from engine.layers.linear import LinearBase
    from engine.weight_quant import IntWeight

    if "fp8" in fmt and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 weights stay quantized on GPUs with fp8 support only")
    path, _ = quantized_dir(fmt, "float32")
    ids = torch.randint(3, 1024, (23,), generator=torch.Generator().manual_seed(3)).tolist()
    truth, _ = _run(path, ids)
    got = {}
    for name, where in (("quantized", path), ("twin", float_twin(fmt))):
        llm = LLM(str(where), device="cuda", dtype="bfloat16", kv_cache_memory_gib=0.02)
        try:
            quants = [m.quant for m in llm.core.runner.model.modules() if isinstance(m, LinearBase)]
            if name == "quantized":  # 2 layers of qkv, o, gate_up, down
                assert len(quants) == 8 and all(isinstance(q, (IntWeight, Fp8Weight)) for q in quants), quants
            got[name] = llm.core.score(ids).float().cpu()
        finally:
            llm.close()
    err, twin_err = (got["quantized"] - truth).abs().max(), (got["twin"] - truth).abs().max()
    assert err <= 2 * twin_err + 1e-3, (float(err), float(twin_err))


# -- 4. transformers, where it can load the format on the CPU -----------------------------------------------------

# fmt -> the packages transformers needs for it (GPTQ: gptqmodel; AWQ: gptqmodel / autoawq; compressed-tensors:
# compressed_tensors); quant_method "fp8" needs only accelerate (dequantized to floats without a GPU)
_HF_NEEDS = {"fp8-block": "accelerate", "gptq-4b-g128-sym": "gptqmodel", "awq-4b-g128": "awq",
             "ct-fp8-channel": "compressed_tensors"}


@pytest.mark.parametrize("fmt", _HF_NEEDS)
def test_matches_transformers(fmt, quantized_dir):
    pytest.importorskip(_HF_NEEDS[fmt], reason=f"transformers needs {_HF_NEEDS[fmt]} for {fmt} checkpoints")
    from transformers import AutoModelForCausalLM

    path, _ = quantized_dir(fmt, "float32")
    hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32, device_map="cpu").eval()
    ids = torch.randint(3, 1024, (19,), generator=torch.Generator().manual_seed(5)).tolist()
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0].float()
    logits, _ = _run(path, ids)
    torch.testing.assert_close(logits, ref, atol=1e-4, rtol=1e-4)


# -- 3. bad input: readable CheckpointErrors naming the file and tensor -------------------------------------------

def _broken(src: Path, dest: Path, config=None, tensors=None) -> Path:
    shutil.copytree(src, dest)
    if config is not None:
        cfg = json.loads((dest / "config.json").read_text())
        config(cfg)
        (dest / "config.json").write_text(json.dumps(cfg))
    if tensors is not None:
        t = load_file(str(dest / "model.safetensors"))
        tensors(t)
        save_file(t, str(dest / "model.safetensors"))
    return dest


@pytest.mark.parametrize("qc, match", [
    ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "quant_method = 'bitsandbytes' is not supported"),
    ({"quant_method": "hqq", "nbits": 4}, "quant_method = 'hqq' is not supported"),
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemv"}, "version = 'gemv'.*gemm"),
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm", "backend": "llm-awq"}, "llm-awq"),
    ({"quant_method": "gptq", "bits": 3, "group_size": 128}, "bits = 3 is not supported.*4 or 8"),
    ({"quant_method": "gptq", "bits": 4, "group_size": 128, "checkpoint_format": "marlin"}, "marlin"),
    ({"quant_method": "gptq", "bits": 4, "group_size": 0}, "group_size = 0"),
    ({"quant_method": "fp8", "weight_block_size": [64, 64]}, r"weight_block_size = \[64, 64\]"),
    ({"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"group_0": {
        "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128}}}}, "pack-quantized"),
    ({"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"group_0": {
        "weights": {"num_bits": 8, "type": "float", "strategy": "group"}}}}, "strategy = 'group'"),
])
def test_unsupported_configs_are_refused(qc, match, quantized_dir, tmp_path):
    d = _broken(quantized_dir("gptq-4b-g128-sym")[0], tmp_path / "m",
                config=lambda cfg: cfg.update(quantization_config=qc))
    with pytest.raises(CheckpointError, match=match) as e:
        load_checkpoint(d)
    assert str(d / "config.json") in str(e.value) and "quantization_config." in str(e.value)
    with pytest.raises(CheckpointError, match=match):
        parse_scheme(qc, "config.json")


P = "model.layers.0.self_attn.q_proj"


def _drop(name):
    return lambda t: t.pop(name)


def _set(name, fn):
    return lambda t: t.update({name: fn(t[name])})


def _out_of_range(g):
    g = g.clone()
    g[5] = 4  # K = 256 in groups of 64: groups 0..3
    return g


def _narrow_q_proj(t):
    """A consistent q_proj of 128 outputs: qweight, scales and qzeros all cut."""
    for name, cols in (("qweight", 128), ("scales", 128), ("qzeros", 16)):
        t[f"{P}.{name}"] = t[f"{P}.{name}"][:, :cols].contiguous()


@pytest.mark.parametrize("fmt, tensors, match", [
    ("gptq-4b-g128-sym", _drop(f"{P}.qzeros"), f"no tensor named '{P}.qzeros'"),
    ("gptq-4b-g128-sym", _drop(f"{P}.scales"), f"no tensor named '{P}.scales'"),
    ("gptq-4b-g128-sym", _set(f"{P}.qweight", lambda q: q[:, :128].contiguous()), f"'{P}.scales'.*N = 128"),
    ("gptq-4b-g128-sym", _set("model.layers.1.mlp.up_proj.qweight", lambda q: q[:16].contiguous()),
     r"'model.layers.1.mlp.up_proj.scales' is float16 \[2, 512\]; expected \[1, 512\]"),
    ("gptq-4b-g128-sym", _narrow_q_proj,
     rf"{P}.weight has shape \(128, 256\) but config.json implies \(256, 256\)"),
    ("gptq-4b-g128-sym", _set(f"{P}.scales", lambda s: torch.cat([s, s[:1]])),
     f"'{P}.scales' is float16 \\[3, 256\\]"),
    ("gptq-4b-g128-sym", _set(f"{P}.qweight", lambda q: q.float()), f"'{P}.qweight' is float32"),
    ("gptq-4b-g64-act-order", _set(f"{P}.g_idx", _out_of_range), f"'{P}.g_idx' holds groups 0..4 but there are 4"),
    ("gptq-4b-g64-act-order", _drop(f"{P}.g_idx"), "desc_act"),
    ("awq-4b-g128", _drop(f"{P}.qzeros"), f"no tensor named '{P}.qzeros'"),
    ("fp8-block", _set(f"{P}.weight_scale_inv", lambda s: s[:1].contiguous()), f"'{P}.weight_scale_inv' is float32"),
    ("fp8-block", _set(f"{P}.weight", lambda w: w.float()), f"'{P}.weight' is float32"),
    ("ct-fp8-channel", _drop(f"{P}.weight_scale"), f"'{P}.weight' is float8 without a scale"),
])
def test_broken_tensors_are_named(fmt, tensors, match, quantized_dir, tmp_path):
    d = _broken(quantized_dir(fmt)[0], tmp_path / "m", tensors=tensors)
    with pytest.raises(CheckpointError, match=match) as e:
        load_checkpoint(d)
    assert str(d) in str(e.value)


def test_a_quantization_config_without_quantized_tensors_is_refused(float_model, tmp_path, smollm2_tokenizer_dir):
    config, state = float_model
    d = _write(tmp_path / "m", state, dict(config, quantization_config=FORMATS["awq-4b-g128"][0]),
               smollm2_tokenizer_dir)
    with pytest.raises(CheckpointError, match="quant_method awq .* no tensor is quantized"):
        load_checkpoint(d)
