"""Tests' way to choose kernels (what KESTREL_* environment switches once did): the ``use_kernels`` fixture, whose
value ``use_kernels(**fields)`` applies ``KernelConfig(**fields)`` to this process at once (engine.ops.configure)
and makes every engine built during the test resolve its configuration from it (ModelRunner). Undone after the
test (every field back to auto). Import the fixture into a test module: ``from tests.support.kernels import
use_kernels  # noqa: F401``."""

from __future__ import annotations

import functools

import pytest

from engine.kernel_config import KernelConfig, resolve


@pytest.fixture
def use_kernels(monkeypatch):
    from engine import ops
    from engine.runner import model_runner

    def apply(**fields) -> KernelConfig:
        base = KernelConfig(**fields)
        monkeypatch.setattr(model_runner, "resolve_kernels", functools.partial(resolve, base=base))
        return ops.configure(resolve(ops.device_facts("cpu"), base=base))

    yield apply
    ops.configure(resolve(ops.device_facts("cpu")))
