"""GGUF checkpoints (llama.cpp): Hugging Face names and shapes, a config.json equivalent built from the
metadata, and tensors dequantized to float32 with ``gguf.quants.dequantize`` -- bit-identical to what
transformers' GGUF loader produces (its q/k un-permutation included).

Linear weights of a type with a native CPU kernel (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K:
engine/ops/gguf_quant.py) can instead be
read as their blocks (``quantized_slice``), which the CPU linear layers keep as they are: the model then takes
about the file's size in memory. The default on the CPU (``--quantization auto``, or ``gguf``: the model runner sets
``keep_quantized``; ``none`` dequantizes every tensor at load). The kernels quantize activations per block, llama.cpp's
way, so a request's greedy output may change with what it is batched with (``--deterministic`` keeps it invariant);
types without a kernel are dequantized, with a log line per type."""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Collection
from typing import Any

import numpy as np
import torch

from engine import heap
from engine.constants import GGUF_ARCHITECTURES, GGUF_LLAMA_MOE_ARCHITECTURE
from engine.errors import CheckpointError, UnsupportedArchitectureError
from engine.loader import gguf_deepseek as deepseek
from engine.loader.gguf_file import (
    GGML_QUANT_SIZES,
    LLAMA_FILE_TYPES,
    GGMLQuantizationType,
    GGUFFile,
    GGUFTensorInfo,
)
from engine.loader.weights import WeightSource

log = logging.getLogger(__name__)

_MODEL_TYPE = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe",
               deepseek.DEEPSEEK2: "deepseek_v2"}

_FLOAT_TYPES = (GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16)
# every type gguf.quants can dequantize (gguf 0.19: F32, F16 and each type with a class of dequantize_blocks),
# named here without importing gguf (GGMLQuantizationType's docstring says why); tests/unit/test_loader.py holds it
# equal to what the installed gguf has
SUPPORTED_QTYPES = frozenset([*_FLOAT_TYPES] + [GGMLQuantizationType[n] for n in (
    "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ2_XXS", "IQ2_XS", "IQ3_XXS",
    "IQ1_S", "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS", "IQ1_M", "BF16", "TQ1_0", "TQ2_0", "MXFP4", "NVFP4")])


def dequantize(data: np.ndarray, qtype: int) -> np.ndarray:
    """``gguf.quants.dequantize(data, qtype)``: F32 and F16 the same way here (a view; float16 widened), every
    other type by gguf, imported then (only a load that dequantizes blocks pays for the package)."""
    if qtype == GGMLQuantizationType.F32:
        return data.view(np.float32)
    if qtype == GGMLQuantizationType.F16:
        return data.view(np.float16).astype(np.float32)
    import gguf  # only to dequantize blocks: a load that keeps them imports no gguf (1.5 MiB with PyYAML)
    from gguf import quants as gguf_quants

    return gguf_quants.dequantize(data, gguf.GGMLQuantizationType(qtype))


_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_output.bias": "self_attn.o_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
# Mixture of experts (llama.cpp's names): the router, the 3-D expert tensors [experts, rows, cols] (each expert's
# matrix exposed under the checkpoint's per-expert name: ``expert_names``) and Qwen2-MoE's shared expert. Mixtral
# ("llama" GGUFs with experts) names them block_sparse_moe.* with w1 / w3 / w2, the Qwen MoEs mlp.*.
_MOE_NAMES = {
    "ffn_gate_inp.weight": "mlp.gate.weight",
    "ffn_gate_inp_shexp.weight": "mlp.shared_expert_gate.weight",
    "ffn_gate_shexp.weight": "mlp.shared_expert.gate_proj.weight",
    "ffn_up_shexp.weight": "mlp.shared_expert.up_proj.weight",
    "ffn_down_shexp.weight": "mlp.shared_expert.down_proj.weight",
}
_EXPERT_NAMES = {"ffn_gate_exps.weight": "gate_proj", "ffn_up_exps.weight": "up_proj",
                 "ffn_down_exps.weight": "down_proj"}
_MIXTRAL_EXPERT_NAMES = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}
# Other tensors (rope_freqs, folded into rope_scaling; anything unknown) have no HF name and are not exposed.
_BLOCK_RE = re.compile(r"blk\.(\d+)\.(.+)")


def hf_name(gguf_name: str, mixtral: bool = False, deepseek_names: bool = False) -> str | None:
    """The Hugging Face name of a GGUF tensor, or None if it has none (the 3-D expert tensors have one name per
    expert: ``expert_names``). ``mixtral``: a llama-arch file with experts (Mixtral's names); ``deepseek_names``: a
    deepseek2 file (MLA's projections, shared_experts: engine/loader/gguf_deepseek.py)."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = _BLOCK_RE.fullmatch(gguf_name)
    if deepseek_names and m and m.group(2) in deepseek.BLOCK_NAMES:
        return f"model.layers.{m.group(1)}.{deepseek.BLOCK_NAMES[m.group(2)]}"
    if m and m.group(2) in _BLOCK_NAMES:
        return f"model.layers.{m.group(1)}.{_BLOCK_NAMES[m.group(2)]}"
    if m and m.group(2) in _MOE_NAMES:
        name = _MOE_NAMES[m.group(2)]
        return f"model.layers.{m.group(1)}.{'block_sparse_moe.gate.weight' if mixtral else name}" \
            if name == "mlp.gate.weight" else f"model.layers.{m.group(1)}.{name}"
    return None


def expert_names(gguf_name: str, experts: int, mixtral: bool = False) -> list[str] | None:
    """The checkpoint's per-expert names of a 3-D GGUF expert tensor (expert e's matrix under the e-th name:
    ``model.layers.N.mlp.experts.E.gate_proj.weight``, Mixtral's ``block_sparse_moe.experts.E.w1.weight``), or
    None for any other tensor."""
    m = _BLOCK_RE.fullmatch(gguf_name)
    if not m or m.group(2) not in _EXPERT_NAMES:
        return None
    proj = _EXPERT_NAMES[m.group(2)]
    if mixtral:
        return [f"model.layers.{m.group(1)}.block_sparse_moe.experts.{e}.{_MIXTRAL_EXPERT_NAMES[proj]}.weight"
                for e in range(experts)]
    return [f"model.layers.{m.group(1)}.mlp.experts.{e}.{proj}.weight" for e in range(experts)]


def is_mixtral(gf: GGUFFile) -> bool:
    """A llama-arch GGUF with experts: how llama.cpp writes Mixtral."""
    return gf.metadata.get("general.architecture") == "llama" and bool(gf.metadata.get("llama.expert_count"))


def qk_row_order(rows: int, n_head: int) -> np.ndarray:
    """Row indices undoing llama.cpp's q/k permutation: ``hf = gguf[order]``.

    llama.cpp's converter (``LlamaModel.permute``) turns HF's rotate-half layout into GPT-J's interleaved
    one with ``w.reshape(n_head, 2, rows // n_head // 2, ...).swapaxes(1, 2)``; transformers undoes it
    with ``w.reshape(n_head, rows // n_head // 2, 2, ...).swapaxes(2, 1)`` (LlamaTensorProcessor). This is
    that inverse applied to row indices, so it also serves row slices and biases.
    """
    dim = rows // n_head // 2
    return np.arange(rows).reshape(n_head, dim, 2).swapaxes(2, 1).reshape(rows)


def _md(gf: GGUFFile, arch: str, key: str, default: Any = None) -> Any:
    return gf.metadata.get(f"{arch}.{key}", default)


def gguf_hf_config(gf: GGUFFile) -> dict[str, Any]:
    """A config.json equivalent from the GGUF metadata (same keys transformers' GGUF loader sets)."""
    arch = gf.metadata.get("general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise UnsupportedArchitectureError(
            f"{arch} (GGUF general.architecture)", sorted(GGUF_ARCHITECTURES)
        )

    def need(key: str) -> Any:
        value = _md(gf, arch, key)
        if value is None:
            raise CheckpointError(gf.path, f"GGUF metadata lacks '{arch}.{key}'")
        return value

    hidden = int(need("embedding_length"))
    heads = int(need("attention.head_count"))
    kv_heads = _md(gf, arch, "attention.head_count_kv", heads)
    if isinstance(kv_heads, list):  # per-layer counts (hybrid models): take the max, like transformers
        kv_heads = max(kv_heads)
    head_dim = _md(gf, arch, "attention.key_length")
    if head_dim is None and arch == "llama":
        head_dim = _md(gf, arch, "rope.dimension_count")
    head_dim = int(head_dim) if head_dim else hidden // heads
    tokens = gf.metadata.get("tokenizer.ggml.tokens")
    vocab = _md(gf, arch, "vocab_size") or (len(tokens) if isinstance(tokens, list) else None)
    if vocab is None:
        embd = gf.tensors.get("token_embd.weight")
        vocab = embd.shape[0] if embd is not None else None
    if vocab is None:
        raise CheckpointError(gf.path, "GGUF metadata gives no vocabulary size")
    names = set(gf.tensors)
    cfg: dict[str, Any] = {
        "architectures": [GGUF_ARCHITECTURES[arch]],
        "model_type": _MODEL_TYPE[arch],
        "vocab_size": int(vocab),
        "hidden_size": hidden,
        "intermediate_size": int(_md(gf, arch, "feed_forward_length") or _md(gf, arch, "expert_feed_forward_length")
                                 or need("feed_forward_length")),
        "num_hidden_layers": int(need("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(kv_heads),
        "head_dim": head_dim,
        "rms_norm_eps": float(_md(gf, arch, "attention.layer_norm_rms_epsilon", 1e-6 if arch != "llama" else 1e-5)),
        "rope_theta": float(_md(gf, arch, "rope.freq_base", 10000.0)),
        "max_position_embeddings": int(_md(gf, arch, "context_length", 4096)),
        "tie_word_embeddings": "output.weight" not in names,
        "attention_bias": "blk.0.attn_q.bias" in names,
        "bos_token_id": gf.metadata.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": gf.metadata.get("tokenizer.ggml.eos_token_id"),
        "pad_token_id": gf.metadata.get("tokenizer.ggml.padding_token_id"),
    }
    if arch == "llama":
        cfg["mlp_bias"] = "blk.0.ffn_gate.bias" in names
    if arch == deepseek.DEEPSEEK2:
        deepseek.deepseek2_config(gf.path, gf.metadata, cfg)
    else:
        _moe_config(gf, arch, cfg)
    if (dtype := _float_dtype(gf)) is not None:
        cfg["torch_dtype"] = dtype
    rope_scaling = _rope_scaling(gf, arch, head_dim, cfg["rope_theta"])
    if rope_scaling is not None:
        is_yarn = arch == deepseek.DEEPSEEK2 and rope_scaling["rope_type"] == "yarn"
        cfg["rope_scaling"] = deepseek.yarn_scaling(gf.metadata, rope_scaling) if is_yarn else rope_scaling
    return cfg


def _moe_config(gf: GGUFFile, arch: str, cfg: dict[str, Any]) -> None:
    """The mixture-of-experts keys of ``cfg`` (transformers' names) from the metadata llama.cpp writes: Mixtral
    (llama-arch with experts), Qwen2-MoE (plus its shared expert) and Qwen3-MoE. Routing as llama.cpp runs these
    files: top-k weights renormalised for Mixtral and Qwen3-MoE, not for Qwen2-MoE."""
    experts = _md(gf, arch, "expert_count")
    if not experts:
        if arch in ("qwen2moe", "qwen3moe"):
            raise CheckpointError(gf.path, f"GGUF metadata lacks '{arch}.expert_count'")
        return
    used = _md(gf, arch, "expert_used_count")
    if not used:
        raise CheckpointError(gf.path, f"GGUF metadata lacks '{arch}.expert_used_count'")
    if arch == "llama":
        cfg.update(architectures=[GGUF_LLAMA_MOE_ARCHITECTURE], model_type="mixtral", num_local_experts=int(experts),
                   num_experts_per_tok=int(used))
        cfg.pop("mlp_bias", None)
        return
    expert_ffn = _md(gf, arch, "expert_feed_forward_length")
    if expert_ffn is None:
        raise CheckpointError(gf.path, f"GGUF metadata lacks '{arch}.expert_feed_forward_length'")
    cfg.update(num_experts=int(experts), num_experts_per_tok=int(used), moe_intermediate_size=int(expert_ffn),
               norm_topk_prob=arch == "qwen3moe", decoder_sparse_step=1, mlp_only_layers=[])
    if arch == "qwen2moe":
        shared = _md(gf, arch, "expert_shared_feed_forward_length")
        if shared is None and "blk.0.ffn_up_shexp.weight" in gf.tensors:
            shared = gf.tensors["blk.0.ffn_up_shexp.weight"].shape[0]
        cfg["shared_expert_intermediate_size"] = int(shared or 0)


def _float_dtype(gf: GGUFFile) -> str | None:
    """The dtype of an unquantized file (its half type, since norms are F32 in every file), else None."""
    types = {t.qtype for t in gf.tensors.values()}
    if not types <= {int(t) for t in _FLOAT_TYPES}:
        return None
    if GGMLQuantizationType.BF16 in types:
        return "bfloat16"
    if GGMLQuantizationType.F16 in types:
        return "float16"
    return "float32"


def _rope_scaling(gf: GGUFFile, arch: str, head_dim: int, theta: float) -> dict | None:
    kind = _md(gf, arch, "rope.scaling.type")
    factor = _md(gf, arch, "rope.scaling.factor")
    if kind in ("linear", "yarn") and factor:
        out = {"rope_type": kind, "factor": float(factor)}
        orig = _md(gf, arch, "rope.scaling.original_context_length")
        if orig:
            out["original_max_position_embeddings"] = int(orig)
        return out
    if "rope_freqs.weight" in gf.tensors and arch == "llama":
        return _llama3_scaling_from_freqs(gf, head_dim, theta)
    return None


def _llama3_scaling_from_freqs(gf: GGUFFile, head_dim: int, theta: float) -> dict | None:
    """Llama 3.1+ GGUFs carry rope scaling as a ``rope_freqs`` tensor (per-frequency divisors) instead of
    metadata. Recover transformers' ``llama3`` rope_scaling: try the published parameter sets and keep the
    one that reproduces the tensor."""
    info = gf.tensors["rope_freqs.weight"]
    freqs = dequantize(gf.raw("rope_freqs.weight"), info.qtype).reshape(-1)
    inv_freq = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    if freqs.shape[0] != inv_freq.shape[0]:
        raise CheckpointError(gf.path, f"rope_freqs has {freqs.shape[0]} entries, expected {inv_freq.shape[0]}")
    factor = float(freqs.max())
    for low, high, orig in ((1.0, 4.0, 8192), (1.0, 4.0, 4096), (1.0, 2.0, 8192)):
        low_wavelen, high_wavelen = orig / low, orig / high
        wavelen = 2 * np.pi / inv_freq
        smooth = (orig / wavelen - low) / (high - low)
        divisor = np.where(wavelen < high_wavelen, 1.0,
                           np.where(wavelen > low_wavelen, factor, 1.0 / ((1 - smooth) / factor + smooth)))
        if np.allclose(divisor, freqs, rtol=1e-3, atol=1e-4):
            return {"rope_type": "llama3", "factor": factor, "low_freq_factor": low,
                    "high_freq_factor": high, "original_max_position_embeddings": orig}
    raise CheckpointError(
        gf.path, "has a rope_freqs tensor that matches no known Llama 3 rope scaling; cannot reproduce its RoPE"
    )


def gguf_quantization(gf: GGUFFile) -> str | None:
    """The file's quantization: general.file_type (e.g. 'Q4_K_M'), else the most common type of its 2-D
    weights; None when nothing in it is quantized."""
    if _float_dtype(gf) is not None:
        return None
    ftype = gf.metadata.get("general.file_type")
    if ftype is not None:
        name = LLAMA_FILE_TYPES.get(ftype) if isinstance(ftype, int) else None
        if name is not None and name != "GUESSED":
            return name.removeprefix("MOSTLY_").removeprefix("ALL_")
    counts = Counter(t.type_name for t in gf.tensors.values() if len(t.shape) >= 2)
    return counts.most_common(1)[0][0] if counts else None


class GGUFWeights(WeightSource):
    """Tensors of a GGUF file under Hugging Face names, dequantized to float32 on access."""

    def __init__(self, gf: GGUFFile, num_heads: int, num_kv_heads: int):
        self.path = gf.path
        self.file = gf
        self.keep_quantized = False  # --quantization gguf / auto on the CPU: quantized_slice hands out the blocks
        arch = gf.metadata.get("general.architecture")
        self._permute = arch == "llama"  # llama.cpp permutes q/k for llama-arch files only
        self._heads = {"self_attn.q_proj": num_heads, "self_attn.k_proj": num_kv_heads}
        self._map: dict[str, GGUFTensorInfo] = {}
        mixtral, deepseek_names = is_mixtral(gf), arch == deepseek.DEEPSEEK2
        # kv_b_proj stored split (attn_k_b / attn_v_b: newer deepseek2 files), put back together on access
        self._kv_b = deepseek.kv_b_parts(self.path, gf.tensors) if deepseek_names else {}
        for name, info in gf.tensors.items():
            hf = hf_name(name, mixtral, deepseek_names)
            if hf is not None:
                self._map[hf] = info
            elif len(info.shape) == 3 and (per_expert := expert_names(name, info.shape[0], mixtral)):
                for e, hf in enumerate(per_expert):  # each expert's matrix: a contiguous part of the tensor
                    self._map[hf] = info.expert_part(e)
        self._no_kernel_logged: set[str] = set()
        for hf, info in self._map.items():
            if info.qtype not in SUPPORTED_QTYPES:
                raise CheckpointError(
                    self.path,
                    f"tensor {info.name!r} is stored as {info.type_name}, which Kestrel cannot dequantize. "
                    f"Supported: {', '.join(sorted(GGMLQuantizationType(q).name for q in SUPPORTED_QTYPES))}",
                )

    def names(self) -> list[str]:
        return [*self._map, *self._kv_b]

    def __contains__(self, name: str) -> bool:
        return name in self._map or name in self._kv_b

    def _info(self, name: str) -> GGUFTensorInfo:
        try:
            return self._map[name]
        except KeyError:
            raise self._missing(name) from None

    def shape(self, name: str) -> tuple[int, ...]:
        if name in self._kv_b:
            return self._kv_b[name][2]
        return self._info(name).shape

    def quant_type(self, name: str) -> str:
        """The GGUF storage type of a tensor, e.g. 'Q4_1' (a split kv_b_proj: its attn_k_b's)."""
        if name in self._kv_b:
            return self.file.tensors[self._kv_b[name][0]].type_name
        return self._info(name).type_name

    def matrix_types(self) -> set[str]:
        """The GGUF storage types of the model's 2-D tensors (linear weights, token table, LM head), e.g.
        {'Q4_1', 'Q8_0'}: what ``--quantization auto`` looks at (engine.config.auto_quantization)."""
        return {info.type_name for info in self._map.values() if len(info.shape) == 2}

    def _row_order(self, name: str, info: GGUFTensorInfo) -> np.ndarray | None:
        if not self._permute:
            return None
        for prefix, n_head in self._heads.items():
            if f".{prefix}." in name:
                return qk_row_order(info.shape[0], n_head)
        return None

    def _dequantize(self, info: GGUFTensorInfo, raw: np.ndarray) -> torch.Tensor:
        try:
            values = dequantize(np.ascontiguousarray(raw), info.qtype)
        except (ValueError, NotImplementedError, AssertionError) as e:
            raise CheckpointError(self.path, f"cannot dequantize tensor {info.name!r} ({info.type_name}): {e}") from e
        # a fresh writable array (F32 tensors come back as views of the read-only map)
        return torch.from_numpy(np.require(values, np.float32, ["C_CONTIGUOUS", "WRITEABLE"]))

    def get(self, name: str) -> torch.Tensor:
        if name in self._kv_b:  # attn_k_b / attn_v_b dequantized, joined into kv_b_proj
            return deepseek.join_kv_b(*(self._whole(self.file.tensors[part]) for part in self._kv_b[name][:2]))
        info = self._info(name)
        return self._whole(info, self._row_order(name, info))

    def _whole(self, info: GGUFTensorInfo, order: np.ndarray | None = None) -> torch.Tensor:
        raw = self.file.raw_of(info)
        if order is not None:
            raw = raw[order]
        out = self._dequantize(info, raw).reshape(info.shape)
        self.file.release_of(info)
        return out

    def get_slice(self, name: str, dim: int, start: int, stop: int) -> torch.Tensor:
        if name in self._kv_b:
            self._check_slice(name, dim, start, stop)
            return self.get(name).narrow(dim, start, stop - start).contiguous()
        out = self._get_slice(name, dim, start, stop)
        self.file.release_of(self._info(name))
        return out

    def _get_slice(self, name: str, dim: int, start: int, stop: int) -> torch.Tensor:
        shape = self._check_slice(name, dim, start, stop)
        dim %= len(shape)
        info = self._info(name)
        raw = self.file.raw_of(info)
        order = self._row_order(name, info)
        if start == stop:
            return torch.empty(*shape[:dim], 0, *shape[dim + 1:])
        if len(shape) == 1:  # norms and biases: small
            return self.get(name)[start:stop].contiguous()
        if dim == 0:  # whole rows: read only those (quant blocks never span rows)
            rows = order[start:stop] if order is not None else slice(start, stop)
            out_shape = (stop - start, *shape[1:])
            return self._dequantize(info, raw[rows]).reshape(out_shape)
        if order is not None:
            raw = raw[order]
        block, type_size = _block(info)
        if dim == len(shape) - 1 and start % block == 0 and (stop % block == 0 or stop == shape[-1]):
            sub = raw[..., start // block * type_size: -(-stop // block) * type_size]
            return self._dequantize(info, sub).reshape(*shape[:-1], stop - start)
        return self._dequantize(info, raw).reshape(shape).narrow(dim, start, stop - start).contiguous()

    def quantized_slice(self, name: str, dim: int, start: int, stop: int,
                        kernel_types: Collection[int]) -> tuple[np.ndarray, int, int] | None:
        """``get_slice`` of a 2-D tensor as its GGUF blocks: ``(blocks, qtype, k)`` with blocks the rows' bytes
        (uint8 [rows, k / block * type_size], a copy), when the tensor's ggml type is one of
        ``kernel_types`` (the caller's kernels: engine.ops.GGUFWeight.KERNEL_TYPES); else None and the caller takes
        the dequantized ``get_slice``: another quantized type (logged once per type), a float type, a column
        slice not on block boundaries (256 for the K-quants), or ``keep_quantized`` off (--quantization none, or
        a GPU: blocks dequantized at load)."""
        if not self.keep_quantized or name in self._kv_b:
            return None
        shape = self._check_slice(name, dim, start, stop)
        info = self._info(name)
        if len(shape) != 2 or info.qtype in _FLOAT_TYPES:
            return None
        if info.qtype not in kernel_types:
            if info.type_name not in self._no_kernel_logged:
                self._no_kernel_logged.add(info.type_name)
                log.info("%s: GGUF %s tensors have no CPU kernel yet; dequantized at load (more memory, as "
                         "before)", self.path.name, info.type_name)
            return None
        dim %= 2
        raw = self.file.raw_of(info)
        order = self._row_order(name, info)
        if dim == 0:
            rows = order[start:stop] if order is not None else slice(start, stop)
            blocks, k = raw[rows], shape[1]
        else:
            block, type_size = _block(info)
            if start % block or stop % block or stop == start:
                return None
            if order is not None:
                raw = raw[order]
            blocks, k = raw[:, start // block * type_size: stop // block * type_size], stop - start
        blocks = np.array(blocks, copy=True)  # off the map, whose pages are then dropped
        self.file.release_of(info)
        return blocks, info.qtype, k

    def column_block(self, name: str, kernel_types: Collection[int]) -> tuple[str, int, int] | None:
        """(type name, block width, block bytes) of a tensor that ``quantized_slice`` keeps as blocks (
        ``keep_quantized`` on, 2-D, a type in ``kernel_types``): a slice of its columns stays blocks only from and to
        a multiple of the block width. None for any other tensor (float, dequantized at load, a split kv_b_proj)."""
        if not self.keep_quantized or name in self._kv_b:
            return None
        info = self._info(name)
        if len(info.shape) != 2 or info.qtype in _FLOAT_TYPES or info.qtype not in kernel_types:
            return None
        block, type_size = _block(info)
        return info.type_name, block, type_size

    def loaded(self) -> None:
        """The model has copied every tensor out (``load_weights``' last call): the file's remaining pages leave the
        resident set (``GGUFFile.loaded``), and the C heap returns the free pages the load left behind (the numpy
        copies of each tensor before its planar / fused form, freed in the middle of the heap, where glibc does not
        give them back by itself: 6-7 MiB on SmolLM2 Q4_1). One ``malloc_trim`` per load, not per tensor (per
        tensor it cost the 1B Q8_0 file 0.7-1.4 s of load time: docs/benchmarks/cpu_gguf_models_2026-12-03.md)."""
        self.file.loaded()
        heap.trim()

    def close(self) -> None:
        self.file.close()


def _block(info: GGUFTensorInfo) -> tuple[int, int]:
    return GGML_QUANT_SIZES[GGMLQuantizationType(info.qtype)]
