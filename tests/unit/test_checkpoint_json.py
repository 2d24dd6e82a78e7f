"""engine/checkpoint_json.py read_json: the one reader of a checkpoint's JSON files, for the loader (config.json,
the safetensors index) and the tokenizer (tokenizer_config.json, generation_config.json, chat_template.json); every
fault a CheckpointError naming the file."""

from __future__ import annotations

import shutil

import pytest

from engine.checkpoint_json import read_json
from engine.errors import CheckpointError
from engine.tokenizer import Tokenizer


def test_an_object_is_read_and_every_fault_names_the_file(tmp_path):
    good = tmp_path / "config.json"
    good.write_text('{"a": [1, 2]}', encoding="utf-8")
    assert read_json(good) == {"a": [1, 2]}
    bad = tmp_path / "bad.json"
    bad.write_text("{not json", encoding="utf-8")
    with pytest.raises(CheckpointError, match=r"bad\.json: is not valid JSON \(.*\); re-download"):
        read_json(bad, "; re-download")
    listed = tmp_path / "list.json"
    listed.write_text("[1]", encoding="utf-8")
    with pytest.raises(CheckpointError, match=r"list\.json: is not a JSON object"):
        read_json(listed)
    with pytest.raises(CheckpointError, match=r"missing\.json: cannot be read"):
        read_json(tmp_path / "missing.json")


def test_the_tokenizer_reads_its_json_files_through_it(tmp_path, smollm2_tokenizer_dir):
    tok_dir = tmp_path / "tok"
    shutil.copytree(smollm2_tokenizer_dir, tok_dir)
    (tok_dir / "generation_config.json").write_text("[]", encoding="utf-8")
    with pytest.raises(CheckpointError, match=r"generation_config\.json: is not a JSON object"):
        Tokenizer.from_dir(tok_dir)
