"""Where the GEMM regime's threads come from (csrc/cpu/gemm_pool.h gemm_on_pool): the float GEMM, the GGUF native
panels and the GGUF dequantization of the prefill route run on the linear pool or in OpenMP regions
(KernelConfig.gemm_threads = pool / openmp through _C.set_gemm_threads, set at engine start; auto: the pool when
OMP_WAIT_POLICY is passive). Both
split the same work into the same kernel calls per column range, so each random case must agree bit for bit, at 2
threads (and at 1, where neither forks)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf import quants

from engine import ops
from engine.ops.native import dtype_code

_C = pytest.importorskip("engine._C")


@pytest.fixture(autouse=True)
def _two_threads_default_mode(monkeypatch):
    before, was = _C.get_num_threads(), ops.batch_invariant()
    ops.set_batch_invariant(False)
    yield
    ops.set_num_threads(before)
    ops.set_batch_invariant(was)
    _C.set_gemm_threads("auto")


def _both(monkeypatch, fn):
    """fn() with the GEMM regime on the pool and in OpenMP regions (fresh outputs each time)."""
    _C.set_gemm_threads("pool")
    on_pool = fn()
    _C.set_gemm_threads("openmp")
    in_openmp = fn()
    return on_pool, in_openmp


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("seed", range(4))
def test_float_gemm_equal_on_pool_and_openmp(monkeypatch, seed, threads):
    ops.set_num_threads(threads)
    g = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    for dtype in (torch.bfloat16, torch.float32):
        M, N, K = int(rng.integers(17, 300)), int(rng.integers(40, 700)), int(rng.choice([64, 200, 576]))
        x = torch.randn(M, K, generator=g).to(dtype)
        w = (torch.randn(N, K, generator=g) * 0.05).to(dtype)
        b = torch.randn(N, generator=g).to(dtype) if seed % 2 else None
        pool, omp = _both(monkeypatch, lambda: ops.linear(x, w, b))
        assert torch.equal(pool, omp), (M, N, K, dtype)
        ref = x.double() @ w.double().t() + (b.double() if b is not None else 0)
        tol = (2e-2 if dtype == torch.bfloat16 else 1e-4) * (x.double().abs() @ w.double().abs().t()) + 1e-3
        assert ((pool.double() - ref).abs() <= tol).all()


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q8_0, Q.Q5_0])
@pytest.mark.parametrize("seed", range(3))
def test_gguf_prefill_equal_on_pool_and_openmp(monkeypatch, seed, qtype):
    """The native panels (9-23 rows: x quantized, then panels claimed one at a time) and the dequantized route
    (24+ bfloat16 rows: panels dequantized, then the float GEMM), and the dequantization itself."""
    ops.set_num_threads(2)
    rng = np.random.default_rng(10 + seed)
    K, N = int(rng.choice([512, 576])), int(rng.integers(1000, 2500))  # big enough that both regimes fork
    w_f = (rng.standard_normal((N, K)) * 0.05).astype(np.float32)
    w = ops.GGUFWeight.from_blocks(quants.quantize(w_f, qtype), int(qtype), K)
    g = torch.Generator().manual_seed(seed)
    for M in (12, 64, 200):
        x = torch.randn(M, K, generator=g).to(torch.bfloat16)
        pool, omp = _both(monkeypatch, lambda: ops.gguf_linear(x, w))
        assert torch.equal(pool, omp), (M, N, K, qtype)
        truth = x.float() @ torch.from_numpy(quants.dequantize(w.file_blocks().numpy(), qtype)).reshape(N, K).t()
        assert ((pool.float() - truth).abs() <= 0.03 * (x.float().abs() @ w.dequantize().abs().t()) + 1e-2).all()

    def dequantized():  # the route's own call (engine/ops/gguf_quant.py _dequantized_linear)
        out = torch.empty(N, K, dtype=torch.bfloat16)
        _C.gguf_dequantize(dtype_code(torch.bfloat16), out.data_ptr(), w.data.data_ptr(), w.data.shape[1],
                           w.qtype, N, K)
        return out

    pool, omp = _both(monkeypatch, dequantized)
    assert torch.equal(pool, omp) and torch.equal(pool, w.dequantize(torch.bfloat16))


def test_the_choice_follows_the_setting():
    """pool / openmp force the choice (set once, as engine.ops.configure does at engine start); auto: the pool
    exactly when this process started with OMP_WAIT_POLICY=passive (the engine sets it before torch loads:
    engine/__init__.py); anything else is refused (KernelConfig refuses it first)."""
    import os

    from engine.kernel_config import KernelConfig

    started_passive = os.environ.get("OMP_WAIT_POLICY", "").lower() == "passive"
    for value, want in (("pool", True), ("openmp", False), ("auto", started_passive)):
        _C.set_gemm_threads(value)
        assert _C.gemm_on_pool() is want, value
    with pytest.raises(ValueError):
        _C.set_gemm_threads("nonsense")
    with pytest.raises(ValueError, match="gemm_threads"):
        KernelConfig(gemm_threads="nonsense")
    ops.configure(KernelConfig(gemm_threads="openmp"))
    assert _C.gemm_on_pool() is False
    ops.configure(KernelConfig())
    assert _C.gemm_on_pool() is started_passive
