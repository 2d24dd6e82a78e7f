"""A stand-in engine core (tests/server/fake_engine.FakeCore) whose load waits until a gate file exists
(``KESTREL_TEST_GATE``, read in the engine process at its start) and which is named after its model path: a
test can hold a load open as long as it needs, and tell two loaded "models" apart."""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import SimpleNamespace

from tests.server.fake_engine import FakeCore

GATE_ENV = "KESTREL_TEST_GATE"


class GatedCore(FakeCore):
    def __init__(self, config):
        gate = os.environ.get(GATE_ENV)
        while gate and not os.path.exists(gate):
            time.sleep(0.02)
        super().__init__(config)
        path = Path(config.model or "fake-model")
        self.checkpoint = SimpleNamespace(name=path.stem, path=path, format="fake", quantization=None)
