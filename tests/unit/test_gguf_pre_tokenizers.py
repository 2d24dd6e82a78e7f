"""DeepSeek's pre-tokenizers for a GGUF vocabulary (issue 48): a byte-level BPE GGUF whose tokenizer.ggml.pre is
"deepseek-v3" or "deepseek-llm" (llama.cpp's names for DeepSeek-V3 / R1 and DeepSeek LLM / V2 / V2-Lite files)
tokenizes text exactly as a ``tokenizers`` Tokenizer over the same vocabulary and merges whose pre_tokenizer is the
Sequence of Split steps DeepSeek's tokenizer.json files hold (written here in that JSON form); GPT-2's split, which
such a file got before, gives other tokens on these samples; a pre name Kestrel does not know logs a warning.

The vocabulary is trained here with no pre-tokenizer split (merges across spaces, digits, punctuation and scripts:
"Ġ1", "12", "'s", "ĊĊ", ...), so how the text is split shows in the tokens."""

from __future__ import annotations

import json
import logging

import pytest
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from engine.loader.gguf_file import GGUFFile
from engine.tokenizer import Tokenizer
from engine.tokenizer.gguf_vocab import GGUF_PRE_TOKENIZER_SPLITS, gguf_pre_tokenizer

SAMPLES = [
    "In 2024 we sold 1234567 units, up 89.5% from 3 years ago: 10000000!",
    "你好，世界！今日はいい天気ですね。안녕하세요 한국어 문장입니다.",
    "Hello, world!!! (Is it ok?) -- yes... [maybe]; {x: 1}",
    "line one\n\nline two\r\n  indented line\n\n\n   trailing spaces   ",
    "Don't do that, I'll say it: we've SHE'S they'd it's YOU'RE",
    "def f(x):\n    return x**2 + 12  # square it\n\nif __name__ == '__main__':\n\tprint(f(345))\n",
    "naïve café Ὅμηρος ΩMEGA ＡＢＣ ｘｙｚ ﬁne Кириллица résumé",
    "mixed中文and English123混合，标点!?",
]
CORPUS = SAMPLES * 3 + [
    "The numbers 123 456 7890 and 12,345.67 appear often; 2023-2024 too.",
    "Chinese 中文字符 and Japanese ひらがな カタカナ with Korean 가나다.",
    "She's here, they're there, I'm fine, we'll see, he'd go, you've got it.",
    "for i in range(10):\n    total += i * 2\n    print(f'{i}: {total}')\n",
]

# DeepSeek-V3's pre_tokenizer, as its tokenizer.json writes it (JSON text: \r \n are JSON escapes there)
DEEPSEEK_V3_JSON = r"""{"type": "Sequence", "pretokenizers": [
  {"type": "Split", "pattern": {"Regex": "\\p{N}{1,3}"}, "behavior": "Isolated", "invert": false},
  {"type": "Split", "pattern": {"Regex": "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"}, "behavior": "Isolated",
   "invert": false},
  {"type": "Split", "pattern": {"Regex": "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"}, "behavior": "Isolated", "invert": false},
  {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}]}"""

# DeepSeek LLM / V2's letter class, as code point ranges (the tokenizer.json spells the characters themselves)
_LETTER_RANGES = [
    (0x41, 0x5A), (0x61, 0x7A), (0xB5, 0xB5), (0xC0, 0xD6), (0xD8, 0xF6), (0xF8, 0x1BA), (0x1BC, 0x1BF),
    (0x1C4, 0x293), (0x295, 0x2AF), (0x370, 0x373), (0x376, 0x377), (0x37B, 0x37D), (0x37F, 0x37F),
    (0x386, 0x386), (0x388, 0x38A), (0x38C, 0x38C), (0x38E, 0x3A1), (0x3A3, 0x3F5), (0x3F7, 0x481),
    (0x48A, 0x52F), (0x531, 0x556), (0x10A0, 0x10C5), (0x13A0, 0x13F5), (0x13F8, 0x13FD), (0x1C90, 0x1CBA),
    (0x1CBD, 0x1CBF), (0x1D00, 0x1D2B), (0x1D6B, 0x1D77), (0x1D79, 0x1D9A), (0x1E00, 0x1F15), (0x1F18, 0x1F1D),
    (0x1F20, 0x1F45), (0x1F48, 0x1F4D), (0x1F50, 0x1F57), (0x1F59, 0x1F59), (0x1F5B, 0x1F5B), (0x1F5D, 0x1F5D),
    (0x1F5F, 0x1F7D), (0x1F80, 0x1FB4), (0x1FB6, 0x1FBC), (0x1FBE, 0x1FBE), (0x1FC2, 0x1FC4), (0x1FC6, 0x1FCC),
    (0x1FD0, 0x1FD3), (0x1FD6, 0x1FDB), (0x1FE0, 0x1FEC), (0x1FF2, 0x1FF4), (0x1FF6, 0x1FFC), (0x2102, 0x2102),
    (0x2107, 0x2107), (0x210A, 0x2113), (0x2115, 0x2115), (0x2119, 0x211D), (0x2124, 0x2124), (0x2126, 0x2126),
    (0x2128, 0x2128), (0x212A, 0x212D), (0x212F, 0x2134), (0x2139, 0x2139), (0x213C, 0x213F), (0x2145, 0x2149),
    (0x214E, 0x214E), (0x2183, 0x2184), (0x2C00, 0x2C7B), (0x2C7E, 0x2CE4), (0x2CEB, 0x2CEE), (0x2CF2, 0x2CF3),
    (0xA640, 0xA66D), (0xA680, 0xA69B), (0xA722, 0xA76F), (0xA771, 0xA787), (0xA78B, 0xA78E), (0xAB70, 0xABBF),
    (0xFB00, 0xFB06), (0xFB13, 0xFB17), (0xFF21, 0xFF3A), (0xFF41, 0xFF5A), (0x10400, 0x1044F),
    (0x104B0, 0x104D3), (0x104D8, 0x104FB), (0x10C80, 0x10CB2), (0x10CC0, 0x10CF2), (0x118A0, 0x118DF),
    (0x1E900, 0x1E943),
]
_LETTERS = "".join(chr(a) if a == b else f"{chr(a)}-{chr(b)}" for a, b in _LETTER_RANGES)


def _split(regex: str) -> dict:
    return {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False}


# DeepSeek LLM / V2 / V2-Lite's pre_tokenizer (their tokenizer.json's Sequence)
DEEPSEEK_LLM_PRE = {"type": "Sequence", "pretokenizers": [
    _split("[\r\n]"),
    _split("\\s?[" + _LETTERS + "]+"),
    _split("\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+"),
    _split("\\s+$"),
    _split("[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"),
    {"type": "Digits", "individual_digits": True},
    {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
]}
REFERENCE_PRE = {"deepseek-v3": json.loads(DEEPSEEK_V3_JSON), "deepseek-llm": DEEPSEEK_LLM_PRE}


@pytest.fixture(scope="module")
def trained():
    """(vocabulary in id order, merges): byte-level BPE trained on CORPUS with no split but the bytes'."""
    tok = BackendTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=1200, special_tokens=["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    model = json.loads(tok.to_str())["model"]
    vocab = sorted(model["vocab"], key=model["vocab"].get)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return vocab, merges, tok.to_str()


def _write_gguf(path, vocab, merges, pre):
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(path), "deepseek2")
    w.add_block_count(1)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(vocab)
    w.add_token_merges(merges)
    w.add_token_types([3, 3] + [1] * (len(vocab) - 2))
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)
    w.add_add_bos_token(False)
    w.add_tensor("token_embd.weight", np.zeros((len(vocab), 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def gguf_tokenizers(trained, tmp_path_factory):
    vocab, merges, _ = trained
    root = tmp_path_factory.mktemp("pre")
    return {pre: Tokenizer.from_gguf(GGUFFile(_write_gguf(root / f"{pre}.gguf", vocab, merges, pre)))
            for pre in ("deepseek-v3", "deepseek-llm", "gpt2")}


def _reference(trained_json: str, pre: str) -> BackendTokenizer:
    spec = json.loads(trained_json)
    spec["pre_tokenizer"] = REFERENCE_PRE[pre]
    return BackendTokenizer.from_str(json.dumps(spec))


@pytest.mark.parametrize("pre", ["deepseek-v3", "deepseek-llm"])
def test_deepseek_gguf_tokenizes_as_its_tokenizer_json(trained, gguf_tokenizers, pre):
    ref = _reference(trained[2], pre)
    ours, gpt2 = gguf_tokenizers[pre], gguf_tokenizers["gpt2"]
    differs = []
    for text in SAMPLES:
        ids = ours.encode(text, add_special_tokens=False)
        assert ids == ref.encode(text, add_special_tokens=False).ids, text
        assert ours.decode(ids) == text
        differs += [text] if gpt2.encode(text, add_special_tokens=False) != ids else []
    assert len(differs) >= len(SAMPLES) // 2, differs  # GPT-2's split (what such a file got before) is not it


def test_deepseek_split_steps_are_the_documented_ones():
    """Each step's pieces, on text that tells them apart: digit runs of at most 3 (V3) or single digits (V2), CJK
    and kana runs alone, a space before a letter run kept with it, newlines alone (V2)."""
    text = "Price: 12345 元, 你好 world's\n\nカタカナ x"
    v3 = [p for p, _ in gguf_pre_tokenizer("deepseek-v3").pre_tokenize_str(text)]
    v2 = [p for p, _ in gguf_pre_tokenizer("deepseek-llm").pre_tokenize_str(text)]
    for got, pre in ((v3, "deepseek-v3"), (v2, "deepseek-llm")):
        assert got == [p for p, _ in _reference_pre(pre).pre_tokenize_str(text)], pre
    assert "123" in v3 and "45" in v3 and "ä½łå¥½" in v3 and "ĊĊ" in v3
    assert {"1", "2", "3", "4", "5"} <= set(v2) and v2.count("Ċ") == 2


def _reference_pre(pre: str) -> pre_tokenizers.PreTokenizer:
    spec = {"version": "1.0", "model": {"type": "BPE", "vocab": {}, "merges": []}, "pre_tokenizer": REFERENCE_PRE[pre]}
    return BackendTokenizer.from_str(json.dumps(spec)).pre_tokenizer


def test_unknown_or_missing_pre_name_warns_and_splits_as_gpt2(caplog):
    with caplog.at_level(logging.WARNING, logger="engine.tokenizer.gguf_vocab"):
        unknown = gguf_pre_tokenizer("some-new-model", "x.gguf")
        gguf_pre_tokenizer(None, "y.gguf")
        for known in ("gpt2", "smollm", "deepseek-v3", "llama-bpe", "qwen2"):
            gguf_pre_tokenizer(known)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2, messages
    assert "x.gguf" in messages[0] and "'some-new-model'" in messages[0] and "GPT-2" in messages[0]
    assert "y.gguf has no tokenizer.ggml.pre" in messages[1]
    text = "don't 12345"
    assert unknown.pre_tokenize_str(text) == pre_tokenizers.ByteLevel(add_prefix_space=False).pre_tokenize_str(text)
    assert {"deepseek-llm", "deepseek-v3", "deepseek-coder", "gpt-4o", "qwen2", "llama-bpe"} <= set(
        GGUF_PRE_TOKENIZER_SPLITS)


@pytest.mark.parametrize("pre", sorted(GGUF_PRE_TOKENIZER_SPLITS))
def test_every_known_pre_name_compiles_and_keeps_every_byte(pre, caplog):
    """Each table entry's regexes compile (tokenizers' onig), its steps lose no text, and no warning is logged."""
    with caplog.at_level(logging.WARNING, logger="engine.tokenizer.gguf_vocab"):
        steps = gguf_pre_tokenizer(pre)
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    for text in SAMPLES:
        pieces = steps.pre_tokenize_str(text)
        assert "".join(p for p, _ in pieces) == byte_level.pre_tokenize_str(text)[0][0], (pre, text)
        assert [span for _, span in pieces] == sorted(span for _, span in pieces)
    assert not caplog.records
