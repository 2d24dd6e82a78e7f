"""One source for the dtype codes: csrc/dtype_codes.h (C++) and engine/dtype_codes.py (Python) agree (the header
parsed), and nothing else in csrc or the engine defines them again."""

from __future__ import annotations

import re
from pathlib import Path

from engine import dtype_codes

ROOT = Path(__file__).resolve().parents[2]
HEADER = ROOT / "csrc" / "dtype_codes.h"


def _header_values() -> dict[str, int]:
    text = HEADER.read_text()
    enum = re.search(r"enum DType : int \{([^}]*)\}", text).group(1)
    values = {name: int(value, 0) for name, value in re.findall(r"(k\w+)\s*=\s*(\w+)", enum)}
    for name, expr in re.findall(r"constexpr int (k\w+)\s*=\s*([^;]+);", text):
        values[name] = eval(expr, {})  # literals and shifts only: "0xff", "1 << 8"
    return values


def test_the_header_and_the_module_agree():
    h = _header_values()
    assert h == {"kFloat32": dtype_codes.FLOAT32, "kBFloat16": dtype_codes.BFLOAT16, "kFloat16": dtype_codes.FLOAT16,
                 "kCacheFp8E4M3": dtype_codes.CACHE_FP8_E4M3, "kDTypeMask": dtype_codes.DTYPE_MASK,
                 "kBatchInvariant": dtype_codes.BATCH_INVARIANT}
    assert dtype_codes.BY_NAME == {"float32": h["kFloat32"], "bfloat16": h["kBFloat16"], "float16": h["kFloat16"]}
    assert dtype_codes.CACHE_BY_NAME["float8_e4m3fn"] == h["kCacheFp8E4M3"]


def test_the_torch_maps_are_built_from_the_module():
    import torch

    from engine.ops import native
    from engine.parallel.comm import kernels

    want = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
    assert kernels.DTYPE_CODE == want and {d: native.dtype_code(d) for d in want} == want
    assert native.cache_code(torch.float8_e4m3fn) == 3 and native.BATCH_INVARIANT == 1 << 8


def test_no_second_definition():
    """csrc: no enum or constant of the codes outside the header; Python: no literal {torch.float32: 0, ...} map
    outside engine/dtype_codes.py (tests may key a seed on one)."""
    again = re.compile(r"enum\s+DType\b|k(Float32|BFloat16|Float16|F32|BF16|F16|CacheFp8E4M3|BatchInvariant)\s*=\s*\d")
    offenders = [str(p.relative_to(ROOT)) for p in (ROOT / "csrc").rglob("*")
                 if p.suffix in (".h", ".cuh", ".cpp", ".cu") and p != HEADER and again.search(p.read_text())]
    literal = re.compile(r"torch\.float32:\s*0\s*,\s*torch\.bfloat16:\s*1")
    offenders += [str(p.relative_to(ROOT)) for p in (ROOT / "engine").rglob("*.py")
                  if literal.search("\n".join(line.split("#")[0] for line in p.read_text().splitlines()))]
    assert not offenders
