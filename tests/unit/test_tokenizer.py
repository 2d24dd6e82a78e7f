"""engine.tokenizer against transformers: encodings, decoding, chat templates; the incremental detokenizer."""

from __future__ import annotations

import json
import shutil

import pytest

from engine.errors import CheckpointError, InvalidRequestError
from engine.loader.gguf_file import GGUFFile
from engine.tokenizer import IncrementalDetokenizer, Tokenizer

TEXTS = [
    "Hello world",
    " leading space and trailing space ",
    "multiple   spaces\t\ttabs\n\n\nnewlines\r\nCRLF",
    "数字 2024年12月31日 中文测试，标点。",
    "emoji 👍🏽🎉 family 👨‍👩‍👧‍👦 flag 🇫🇷",
    "def f(x):\n    return x ** 2  # comment\n\nclass A:\n\tpass\n",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|> and <repo_name> and <|im_end|>trailing",
    "Ünïcödé façade naïve café Ångström",
    "العربية русский 日本語のテキスト 한국어",
    "I'll they're we've he'd SHE'LL",
    "1234567890 3.14159 -42 1e-5 0x1F",
    "\u200b zero width \ufeff bom \u00a0nbsp",
    "                ",
    "x" * 300,
    "",
]

CONVERSATIONS = [
    [{"role": "user", "content": "Hi there!"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2+2?"}],
    [
        {"role": "system", "content": "Be kind."},
        {"role": "user", "content": "Tell me a joke."},
        {"role": "assistant", "content": "Why did the chicken cross the road? 🐔"},
        {"role": "user", "content": "Another one, in 中文 please."},
    ],
    [
        {"role": "user", "content": "  spaces around  "},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "line1\nline2\n\n"},
    ],
]


@pytest.fixture(scope="module")
def gguf_tok(smollm2_gguf) -> Tokenizer:
    return Tokenizer.from_gguf(GGUFFile(smollm2_gguf))


def test_gguf_tokenizer_takes_an_open_file_not_a_path(smollm2_gguf):
    # the tokenizer package sits below the loader: it reads metadata, the loader opens files
    with pytest.raises(TypeError, match="open the GGUF file first"):
        Tokenizer.from_gguf(smollm2_gguf)


def _hf_chat(hf, messages, add_generation_prompt, tokenize, **kw):
    out = hf.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=tokenize, **kw)
    if tokenize and not isinstance(out, list):
        out = out["input_ids"]
    return out


# -- GGUF tokenizer vs transformers' GGUF tokenizer --------------------------------------------------


def test_gguf_tokenizer_attributes(gguf_tok):
    assert gguf_tok.bos_token_id == 1 and gguf_tok.eos_token_id == 2 and gguf_tok.eos_token_ids == [2]
    assert gguf_tok.add_bos_token is False and gguf_tok.vocab_size == 49152
    assert gguf_tok.bos_token == "<|im_start|>" and gguf_tok.eos_token == "<|im_end|>"
    assert gguf_tok.encode("hi")[:1] != [1]
    assert gguf_tok.convert_ids_to_tokens([1, 2]) == ["<|im_start|>", "<|im_end|>"]
    assert {0, 1, 2} <= gguf_tok.all_special_ids


def test_gguf_encodings_equal_transformers(gguf_tok, smollm2_gguf, hf_tokenizer):
    hf = hf_tokenizer(smollm2_gguf)
    for text in TEXTS:
        ids = gguf_tok.encode(text)
        assert ids == hf(text)["input_ids"], text
        assert gguf_tok.encode(text, add_special_tokens=False) == hf.encode(text, add_special_tokens=False), text
        assert gguf_tok.decode(ids) == hf.decode(ids, skip_special_tokens=True), text
        assert gguf_tok.decode(ids, skip_special_tokens=False) == hf.decode(ids), text
        assert gguf_tok.convert_ids_to_tokens(ids) == hf.convert_ids_to_tokens(ids), text
    assert gguf_tok.vocab_size == len(hf)


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_gguf_chat_template_equals_transformers(gguf_tok, smollm2_gguf, hf_tokenizer, add_generation_prompt):
    hf = hf_tokenizer(smollm2_gguf)
    for conv in CONVERSATIONS:
        for tokenize in (False, True):
            want = _hf_chat(hf, conv, add_generation_prompt, tokenize)
            got = gguf_tok.apply_chat_template(conv, add_generation_prompt=add_generation_prompt, tokenize=tokenize)
            assert got == want, (conv, tokenize)
    # SmolLM2's template adds its default system prompt when none is given
    text = gguf_tok.apply_chat_template(CONVERSATIONS[0], tokenize=False)
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert text.endswith("<|im_start|>assistant\n")


def test_content_parts_are_joined(gguf_tok):
    parts = [{"role": "user", "content": [{"type": "text", "text": "first"}, {"type": "text", "text": "second"}]}]
    joined = [{"role": "user", "content": "first\nsecond"}]
    assert gguf_tok.apply_chat_template(parts) == gguf_tok.apply_chat_template(joined)
    with pytest.raises(InvalidRequestError, match="image_url"):
        gguf_tok.apply_chat_template([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}])
    with pytest.raises(InvalidRequestError):
        gguf_tok.apply_chat_template([])
    with pytest.raises(InvalidRequestError):
        gguf_tok.apply_chat_template([{"content": "no role"}])
    # None-valued keys are dropped (OpenAI clients send content=None / tool_calls=None)
    none = [{"role": "user", "content": "hi", "tool_calls": None, "name": None}]
    assert gguf_tok.apply_chat_template(none, tokenize=False) == gguf_tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False)


# -- directory tokenizers (tokenizer.json + tokenizer_config.json + chat_template.jinja) -------------


@pytest.mark.parametrize("arch", ["llama", "llama3", "mistral", "qwen2", "qwen3", "smollm2"])
def test_dir_tokenizer_equals_transformers(arch, tiny_model_dir, hf_tokenizer):
    path = tiny_model_dir(arch)
    tok = Tokenizer.from_dir(path)
    hf = hf_tokenizer(path)
    assert tok.bos_token_id == hf.bos_token_id and tok.eos_token_id == hf.eos_token_id
    assert tok.add_bos_token == (arch == "llama3")
    for text in TEXTS:
        ids = tok.encode(text)
        assert ids == hf(text)["input_ids"], (arch, text)
        assert tok.encode(text, add_special_tokens=False) == hf.encode(text, add_special_tokens=False)
        assert tok.decode(ids) == hf.decode(ids, skip_special_tokens=True), (arch, text)
    if arch == "llama3":
        assert tok.encode("hi")[0] == tok.bos_token_id and tok.eos_token_ids == [2, 0]

    for conv in CONVERSATIONS:
        for add_generation_prompt in (True, False):
            for tokenize in (False, True):
                want = _hf_chat(hf, conv, add_generation_prompt, tokenize)
                got = tok.apply_chat_template(conv, add_generation_prompt=add_generation_prompt, tokenize=tokenize)
                assert got == want, (arch, conv, add_generation_prompt, tokenize)


def test_template_raise_exception_becomes_invalid_request(tiny_model_dir, hf_tokenizer):
    import jinja2

    path = tiny_model_dir("mistral")
    tok, hf = Tokenizer.from_dir(path), hf_tokenizer(path)
    bad = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    with pytest.raises(jinja2.TemplateError, match="must alternate"):
        hf.apply_chat_template(bad, tokenize=False)
    with pytest.raises(InvalidRequestError, match="must alternate") as e:
        tok.apply_chat_template(bad)
    assert e.value.param == "messages" and e.value.status_code == 400


def test_qwen_templates_with_tools_and_thinking(tiny_model_dir, hf_tokenizer):
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                               "parameters": {"type": "object",
                                                              "properties": {"city": {"type": "string"}}}}}]
    conv = [
        {"role": "user", "content": "Weather in Zürich?"},
        {"role": "assistant", "content": "", "reasoning_content": "Need the tool.",
         "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}]},
        {"role": "tool", "content": "{\"temp\": 21}"},
    ]
    for arch in ("qwen2", "qwen3"):
        path = tiny_model_dir(arch)
        tok, hf = Tokenizer.from_dir(path), hf_tokenizer(path)
        for kw in ({}, {"enable_thinking": False}):
            want = hf.apply_chat_template(conv, tools=tools, add_generation_prompt=True, tokenize=False, **kw)
            got = tok.apply_chat_template(conv, tools=tools, tokenize=False, **kw)
            assert got == want, (arch, kw)
            assert '"Zürich"' in got  # tojson without ASCII escaping, as transformers
        if arch == "qwen3":
            assert "<think>\nNeed the tool.\n</think>" in got and got.endswith("<think>\n\n</think>\n\n")


def test_no_chat_template(tiny_model_dir, tmp_path):
    d = tmp_path / "notemplate"
    shutil.copytree(tiny_model_dir("llama"), d)
    (d / "chat_template.jinja").unlink()
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    tok = Tokenizer.from_dir(d)
    assert tok.chat_template is None
    assert tok.encode("still encodes") == Tokenizer.from_dir(tiny_model_dir("llama")).encode("still encodes")
    with pytest.raises(InvalidRequestError, match="no chat template"):
        tok.apply_chat_template([{"role": "user", "content": "hi"}])


def test_template_in_tokenizer_config_and_named_templates(tiny_model_dir, tmp_path):
    d = tmp_path / "named"
    shutil.copytree(tiny_model_dir("qwen2"), d)
    default = (d / "chat_template.jinja").read_text()
    (d / "chat_template.jinja").unlink()
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["chat_template"] = [{"name": "default", "template": default},
                            {"name": "tool_use", "template": "TOOLS{{ tools | length }}"}]
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    tok = Tokenizer.from_dir(d)
    conv = [{"role": "user", "content": "hi"}]
    assert tok.apply_chat_template(conv, tokenize=False).startswith("<|im_start|>system")
    assert tok.apply_chat_template(conv, tools=[{"a": 1}], tokenize=False) == "TOOLS1"


def test_bad_tokenizer_files(tmp_path):
    with pytest.raises(CheckpointError, match="no tokenizer.json"):
        Tokenizer.from_dir(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{broken")
    with pytest.raises(CheckpointError, match="tokenizer.json"):
        Tokenizer.from_dir(tmp_path)
    with pytest.raises(CheckpointError, match="no tokenizer"):
        Tokenizer.from_gguf({"general.architecture": "llama"})


def test_sandbox_blocks_escapes(gguf_tok):
    evil = "{{ messages.__class__.__mro__[1].__subclasses__() }}"
    with pytest.raises(InvalidRequestError):
        gguf_tok.apply_chat_template([{"role": "user", "content": "x"}], chat_template=evil)


# -- incremental detokenizer ------------------------------------------------------------------------

STREAM_TEXTS = [
    "emoji 👍🏽🎉 family 👨‍👩‍👧‍👦 and 🇫🇷🇯🇵 flags",
    "中文测试：你好，世界！日本語のテキストも。한국어도 됩니다.",
    "mixed ascii é ü ñ ß and math ∑∫√∞ ≠ ≤ and arrows ⇒ ⟶",
    "code:\n```python\nprint('héllo 👋')\n```\n",
]


@pytest.mark.parametrize("text", STREAM_TEXTS)
def test_incremental_detokenizer_deltas(gguf_tok, text):
    ids = gguf_tok.encode(text)
    # multi-byte characters really are split across tokens here
    assert any("\ufffd" in gguf_tok.decode([i]) for i in ids)
    detok = IncrementalDetokenizer(gguf_tok, prompt_ids=[])
    deltas = [detok.add(i) for i in ids]
    assert "".join(deltas) == gguf_tok.decode(ids) == detok.text
    assert not any("\ufffd" in d for d in deltas)
    assert detok.flush() == ""


def test_incremental_detokenizer_with_prompt_and_special_tokens(gguf_tok):
    prompt = gguf_tok.apply_chat_template([{"role": "user", "content": "Say hi 👋"}])
    answer = "Hi 👋! 你好。<|im_end|>"
    ids = gguf_tok.encode(answer)
    for skip in (True, False):
        detok = IncrementalDetokenizer(gguf_tok, prompt, skip_special_tokens=skip)
        deltas = [detok.add(i) for i in ids]
        assert "".join(deltas) == gguf_tok.decode(ids, skip_special_tokens=skip)
        assert not any("\ufffd" in d for d in deltas)
    assert detok.text.endswith("<|im_end|>") and "<|im_end|>" not in gguf_tok.decode(ids)


def test_incremental_detokenizer_window_stays_small(gguf_tok):
    text = "Streaming 流式输出 👍 " * 200
    ids = gguf_tok.encode(text)
    detok = IncrementalDetokenizer(gguf_tok, prompt_ids=gguf_tok.encode("prompt " * 50))
    longest = 0
    for i in ids:
        detok.add(i)
        longest = max(longest, len(detok.ids) - detok.prefix_offset)
        assert len(detok.ids) <= 80
    assert longest <= 8 and detok.text == gguf_tok.decode(ids)


def test_incremental_detokenizer_holds_then_flushes(gguf_tok):
    ids = gguf_tok.encode(" 👍")
    assert len(ids) >= 2
    detok = IncrementalDetokenizer(gguf_tok)
    assert [detok.add(i) for i in ids[:-1]] == [""] * (len(ids) - 1)  # an incomplete character is held back
    tail = detok.flush()
    assert "\ufffd" in tail  # only flush (end of stream) may show the broken character


# -- SentencePiece (tokenizer.ggml.model == "llama") GGUF tokenizer ---------------------------------

SPM_TEXTS = ["Hello world", "the cat sat on the mat", " leading space", "multiple   spaces  here", "Hello",
             "emoji 👍 and ü outside the vocabulary", "中文 words", "line\nbreak\n\n", "<s>inline</s> specials",
             "", "the the the"]


@pytest.fixture(scope="module")
def spm_gguf(tmp_path_factory):
    """A llama-arch GGUF whose tokenizer is a small SentencePiece BPE vocabulary (no merges: scores only,
    like Llama 2 / Mistral GGUFs), with byte-fallback tokens."""
    import gguf
    import numpy as np

    words = "Hello world the cat sat on mat leading space multiple spaces here words line break emoji and " \
            "outside vocabulary inline specials 中文".split()
    pieces: dict[str, float] = {}
    for ch in sorted(set("".join(words))):
        pieces.setdefault(ch, -1000.0)
    pieces.setdefault("\u2581", -1000.0)
    for w in words:
        for k in range(1, len(w) + 1):
            pieces.setdefault("\u2581" + w[:k], -float(k) - 0.01 * len(pieces))
        for k in range(2, len(w)):
            pieces.setdefault(w[:k], -float(k) - 0.5 - 0.01 * len(pieces))
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + list(pieces)
    scores = [0.0, 0.0, 0.0] + [0.0] * 256 + list(pieces.values())
    types = [2, 3, 3] + [6] * 256 + [1] * len(pieces)
    out = tmp_path_factory.mktemp("spm") / "spm.gguf"
    w = gguf.GGUFWriter(str(out), "llama")
    w.add_block_count(1)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    from tests.support.chat_templates import LLAMA2_TEMPLATE

    w.add_chat_template(LLAMA2_TEMPLATE)
    w.add_tensor("token_embd.weight", np.zeros((len(tokens), 32), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def test_sentencepiece_gguf_tokenizer_equals_transformers(spm_gguf, hf_tokenizer):
    tok = Tokenizer.from_gguf(GGUFFile(spm_gguf))
    hf = hf_tokenizer(spm_gguf)
    assert tok.add_bos_token and tok.bos_token == "<s>" and tok.eos_token_ids == [2] and tok.unk_token == "<unk>"
    for text in SPM_TEXTS:
        ids = tok.encode(text)
        assert ids == hf(text)["input_ids"], text
        assert tok.encode(text, add_special_tokens=False) == hf.encode(text, add_special_tokens=False), text
        assert tok.decode(ids) == hf.decode(ids, skip_special_tokens=True), text
        assert tok.decode(ids, skip_special_tokens=False) == hf.decode(ids), text
        assert tok.convert_ids_to_tokens(ids) == hf.convert_ids_to_tokens(ids), text
    assert any(t.startswith("<0x") for t in tok.convert_ids_to_tokens(tok.encode("👍")))  # byte fallback
    for conv in CONVERSATIONS:
        for tokenize in (False, True):
            assert tok.apply_chat_template(conv, tokenize=tokenize) == _hf_chat(hf, conv, True, tokenize)
    # streaming through byte-fallback tokens and the leading-space rule
    text = "Hello world 👍 中文 the end ü"
    ids = tok.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, tok.encode("Hello"))
    deltas = [detok.add(i) for i in ids]
    assert not any("\ufffd" in d for d in deltas)
    assert "".join(deltas) == tok.decode(tok.encode("Hello") + ids)[len(tok.decode(tok.encode("Hello"))):]
