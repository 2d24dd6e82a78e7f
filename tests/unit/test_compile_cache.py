"""tests/support/compile_cache.py: a remembered compilation is found again only with the same compiler, command and
input bytes, wherever the checkout lies; nothing half-written or unrecorded is ever found."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import compile_cache


def _tree(root: Path) -> tuple[Path, Path]:
    (root / "csrc" / "cuda").mkdir(parents=True)
    src = root / "csrc" / "cuda" / "k.cu"
    src.write_text('#include "ops.h"\n#include <cuda_runtime.h>\n__global__ void k() {}\n')
    (root / "csrc" / "cuda" / "ops.h").write_text('#pragma once\n#include "common.cuh"\n')  # beside the source
    header = root / "csrc" / "common.cuh"  # reached through ops.h, found in the include folder
    header.write_text("#pragma once\n")
    (root / "csrc" / "unrelated.h").write_text("#pragma once\n")
    return src, header


def _key(root: Path, src: Path, *flags: str) -> str:
    cmd = ["nvcc", "-O3", *flags, f"-I{root / 'csrc'}", "-c", str(src)]
    return compile_cache.run_key("nvcc 12.9", cmd, compile_cache.include_closure(src, [root / "csrc"]), root)


@pytest.fixture
def cache_home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_the_key_follows_every_input_but_not_the_checkouts_place(tmp_path):
    a_src, a_header = _tree(tmp_path / "a")
    b_src, _ = _tree(tmp_path / "b")
    key = _key(tmp_path / "a", a_src)
    assert key == _key(tmp_path / "b", b_src)                       # the same files elsewhere
    assert key != _key(tmp_path / "a", a_src, "-G")                 # another flag
    assert key != compile_cache.run_key("nvcc 13.0", ["nvcc"], [a_src], tmp_path / "a") != \
        compile_cache.run_key("nvcc 12.9", ["nvcc"], [a_src], tmp_path / "a")  # another compiler
    assert compile_cache.include_closure(a_src, [tmp_path / "a" / "csrc"]) == sorted(
        [a_src, a_src.parent / "ops.h", a_header])
    (tmp_path / "a" / "csrc" / "unrelated.h").write_text("#pragma once\n#define Y 2\n")
    assert key == _key(tmp_path / "a", a_src)                       # a header nothing includes
    a_header.write_text("#pragma once\n#define X 1\n")
    assert key != _key(tmp_path / "a", a_src)                       # an included header's bytes, two levels down
    a_header.write_text("#pragma once\n")
    assert key == _key(tmp_path / "a", a_src)
    a_src.write_text(a_src.read_text().replace("{}", "{ }"))
    assert key != _key(tmp_path / "a", a_src)                       # the source's bytes


def test_only_a_stored_run_is_restored_with_its_output(tmp_path, cache_home):
    out = tmp_path / "k.o"
    assert not compile_cache.restore("k1", out) and not out.exists()
    out.write_bytes(b"\x7fELF object")
    compile_cache.store("k1", out)
    out.unlink()
    assert compile_cache.restore("k1", out) and out.read_bytes() == b"\x7fELF object"
    assert not compile_cache.restore("k2", out)
    compile_cache.store("k3", None)
    assert compile_cache.restore("k3", None)
    (cache_home / "kestrel-compile-cache" / "k4").mkdir(parents=True)   # an entry without its mark of success
    assert not compile_cache.restore("k4", None)


def test_storing_a_key_twice_keeps_the_first_entry(tmp_path, cache_home):
    out = tmp_path / "k.o"
    out.write_bytes(b"first")
    compile_cache.store("k", out)
    out.write_bytes(b"second")
    compile_cache.store("k", out)
    assert compile_cache.restore("k", out) and out.read_bytes() == b"first"
    assert [p.name for p in (cache_home / "kestrel-compile-cache").iterdir()] == ["k"]  # no temporary left
