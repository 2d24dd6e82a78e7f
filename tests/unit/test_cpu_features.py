"""One source for the CPU features each kernel level needs: csrc/cpu_features.h (the three ISA dispatchers' checks)
and engine/cpu_features.py CPU_LEVELS agree (the header parsed: its feature list with /proc/cpuinfo's names and the
body of each cpu_has_<level>()); and on this machine the levels engine._C reports are ones the Python table finds."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from engine import cpu_features

ROOT = Path(__file__).resolve().parents[2]
HEADER = ROOT / "csrc" / "cpu_features.h"


def _header_levels() -> dict[str, frozenset[str]]:
    text = HEADER.read_text()
    cpuinfo = dict(re.findall(r"(k[A-Z0-9]+),\s*// cpuinfo: (\w+)", text))
    bodies = dict(re.findall(r"static inline bool cpu_has_(\w+)\(\) \{(.*?)\n?\}", text, re.S))
    levels: dict[str, frozenset[str]] = {}

    def need(level: str) -> frozenset[str]:
        if level not in levels:
            body = bodies[level]
            own = {cpuinfo[f] for f in re.findall(r"CpuFeature::(k\w+)", body)}
            for other in re.findall(r"cpu_has_(\w+)\(\)", body):
                own |= need(other)
            levels[level] = frozenset(own)
        return levels[level]

    for level in bodies:
        need(level)
    return levels


def test_the_header_and_the_module_agree():
    header = _header_levels()
    assert header, "no cpu_has_<level>() parsed from csrc/cpu_features.h"
    assert header == {k: frozenset(v) for k, v in cpu_features.CPU_LEVELS.items()}


def test_the_dispatchers_use_the_header():
    """No __builtin_cpu_supports outside csrc/cpu_features.h: the dispatchers ask its functions."""
    offenders = [str(p.relative_to(ROOT)) for p in (ROOT / "csrc").rglob("*") if p.suffix in (".h", ".cpp")
                 and p != HEADER and "__builtin_cpu_supports" in p.read_text()]
    assert not offenders


def test_levels_of_this_machine():
    levels = cpu_features.cpu_levels(frozenset({"avx2", "fma", "f16c", "avx_vnni"}))
    assert levels == ["avx2", "avxvnni"]
    assert cpu_features.cpu_levels(frozenset()) == []
    _C = pytest.importorskip("engine._C")
    here = set(cpu_features.cpu_levels())
    assert set(_C.available_isas()) - {"scalar"} <= here
    assert set(_C.gguf_isas()) - {"scalar"} <= here
