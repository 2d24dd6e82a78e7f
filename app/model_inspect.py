"""What a local model is, read from its files without loading it (and without torch): format,
architecture, quantization, parameter count, context length, shape, size on disk, and whether the engine
can load it (and if not, why, in plain words)."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, replace
from math import prod
from pathlib import Path

from app.fit import ModelShape
from app.gguf_header import GGUFHeaderError, read_gguf_header
from app.quant_scheme import describe_quantization, quantization_method
from engine.config import SUPPORTED_ARCHITECTURES
from engine.constants import GGUF_ARCHITECTURES
from engine.expert_blocks import EXPERT_DOWN_SUFFIX

# A mirror of engine.loader.gguf's SUPPORTED_QTYPES (that module imports torch); tests/app/test_model_data.py checks
# they agree. GGUF_ARCHITECTURES is engine.constants' (torch-free).
GGUF_TENSOR_TYPES = frozenset({
    "BF16", "F16", "F32", "IQ1_M", "IQ1_S", "IQ2_S", "IQ2_XS", "IQ2_XXS", "IQ3_S", "IQ3_XXS", "IQ4_NL", "IQ4_XS",
    "MXFP4", "NVFP4", "Q2_K", "Q3_K", "Q4_0", "Q4_1", "Q4_K", "Q5_0", "Q5_1", "Q5_K", "Q6_K", "Q8_0", "TQ1_0",
    "TQ2_0",
})


@dataclass
class ModelFacts:
    path: Path
    format: str  # "gguf" | "safetensors"
    name: str
    architecture: str | None = None  # the Hugging Face class name, e.g. LlamaForCausalLM
    # the GGUF file type ("Q4_K_M") or the checkpoint's quant_method ("GPTQ", "AWQ", "FP8": compressed-tensors FP8
    # is "FP8"; app.fit reads these); None for plain float weights
    quantization: str | None = None
    # the quantization in words: the engine's name for a checkpoint it loads ("GPTQ int4 g128", "FP8 block
    # 128x128"), the method for one it does not ("bitsandbytes"), the GGUF file type; None for float weights
    quantization_name: str | None = None
    torch_dtype: str | None = None
    num_params: int | None = None
    context_length: int | None = None
    size_bytes: int = 0
    shape: ModelShape | None = None
    generation_config: dict | None = None
    supported: bool = True
    reason: str = ""  # why not supported
    # False when the file is not a model Kestrel can read at all (not a GGUF file, a corrupt header, no or a
    # broken config.json): nothing is known of its size in memory, so no memory estimate (app.fit.can_estimate)
    readable: bool = True

    @property
    def format_text(self) -> str:
        """The format in words: "GGUF" / "SAFETENSORS" only for a file that reads as one (a PNG renamed .gguf
        is "not a model file", not "GGUF")."""
        return self.format.upper() if self.readable else "not a model file"


def inspect_model(path: str | Path) -> ModelFacts:
    """Facts about a .gguf file or a Hugging Face model directory. Never raises for a bad model: the
    facts say it is unsupported and why."""
    path = Path(path)
    if path.is_file():
        return _inspect_gguf(path)
    return _inspect_dir(path)


def _inspect_gguf(path: Path) -> ModelFacts:
    facts = ModelFacts(path=path, format="gguf", name=path.name.removesuffix(".gguf"), size_bytes=_size(path))
    try:
        header = read_gguf_header(path)
    except GGUFHeaderError as e:
        facts.supported, facts.reason, facts.readable = False, str(e), False
        return facts
    except OSError as e:  # the path is shown beside the reason: not in it again
        facts.supported, facts.readable = False, False
        facts.reason = f"the file cannot be read ({e.strerror or type(e).__name__})"
        return facts
    md = header.metadata
    arch = header.architecture
    facts.architecture = GGUF_ARCHITECTURES.get(arch, f"{arch} (GGUF)")
    facts.quantization = facts.quantization_name = header.quantization
    facts.num_params = header.num_params
    facts.context_length = header.arch_value("context_length")
    facts.shape = ModelShape.from_gguf_metadata(md, header.vocab_size)
    downs = tuple(sorted({t for name, t in header.tensor_types.items() if name.endswith(EXPERT_DOWN_SUFFIX)}))
    if facts.shape is not None and downs:  # the experts' blocks a TP size must not split (app.fit.expert_block)
        facts.shape = replace(facts.shape, expert_down_types=downs)
    if arch not in GGUF_ARCHITECTURES:
        facts.supported = False
        facts.reason = f"Architecture '{arch}' is not supported (supported: {', '.join(sorted(GGUF_ARCHITECTURES))})."
        return facts
    unknown = sorted({t for t in header.tensor_types.values() if t not in GGUF_TENSOR_TYPES})
    if unknown:
        facts.supported = False
        facts.reason = f"Tensor types the engine cannot read: {', '.join(unknown)}."
    return facts


def _inspect_dir(path: Path) -> ModelFacts:
    facts = ModelFacts(path=path, format="safetensors", name=path.name, size_bytes=_size(path))
    config_file = path / "config.json"
    if not config_file.is_file():
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return _inspect_gguf(ggufs[0])
        facts.supported, facts.readable = False, False
        facts.reason = "No config.json (and not exactly one .gguf file) in this folder."
        return facts
    try:
        cfg = json.loads(config_file.read_text())
    except (OSError, ValueError) as e:
        facts.supported, facts.reason, facts.readable = False, f"config.json cannot be read: {e}", False
        return facts
    if not isinstance(cfg, dict):
        facts.supported, facts.reason, facts.readable = False, "config.json is not a model configuration.", False
        return facts
    archs = cfg.get("architectures") or [cfg.get("model_type", "unknown")]
    facts.architecture = archs[0]
    facts.torch_dtype = cfg.get("torch_dtype") or cfg.get("dtype")
    facts.context_length = cfg.get("max_position_embeddings")
    facts.shape = ModelShape.from_hf_config(cfg)
    gen = path / "generation_config.json"
    if gen.is_file():
        try:
            facts.generation_config = json.loads(gen.read_text())
        except (OSError, ValueError):
            pass
    qc = cfg.get("quantization_config")
    facts.quantization_name, refused = describe_quantization(qc)
    if facts.quantization_name:
        facts.quantization = str(qc["quant_method"]).upper() if refused else quantization_method(
            facts.quantization_name)
    facts.num_params = _safetensors_params(path)
    shards = list(path.glob("*.safetensors"))
    if facts.architecture not in SUPPORTED_ARCHITECTURES:
        facts.supported = False
        facts.reason = (f"Architecture '{facts.architecture}' is not supported (supported: "
                        f"{', '.join(sorted(SUPPORTED_ARCHITECTURES))}).")
    elif refused:
        facts.supported, facts.reason = False, refused
    elif not shards:
        facts.supported = False
        facts.reason = "No .safetensors weights in this folder (only PyTorch .bin files?)."
    return facts


def _safetensors_params(path: Path) -> int | None:
    total = 0
    found = False
    for shard in sorted(path.glob("*.safetensors")):
        try:
            with open(shard, "rb") as f:
                (n,) = struct.unpack("<Q", f.read(8))
                if n > 100 * 2**20:
                    return None
                header = json.loads(f.read(n))
        except (OSError, ValueError, struct.error):
            return None
        for name, entry in header.items():
            if name != "__metadata__" and isinstance(entry, dict):
                total += prod(entry.get("shape", []))
                found = True
    return total if found else None


def _size(path: Path) -> int:
    try:
        if path.is_file():
            return path.stat().st_size
        return sum(p.stat().st_size for p in path.iterdir() if p.is_file())
    except OSError:
        return 0
