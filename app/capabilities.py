"""What the engine can do on this machine, for the Load form: options it lacks are shown disabled, with the
reason. The engine publishes its answer as ``engine.capabilities.capabilities() -> dict`` (torch-free); the
defaults here are only what the form assumes when that probe cannot be read (then tensor parallelism is shown
off, with TP_REASON)."""

from __future__ import annotations

from dataclasses import dataclass, field

TP_REASON = "the engine did not report tensor-parallel support"


@dataclass(frozen=True)
class Capabilities:
    tensor_parallel: bool = False
    comm_strategies: tuple[str, ...] = ()  # of EngineConfig.comm_strategy's choices
    keeps_quantized_weights: bool = False  # GGUF kept quantized in memory (else dequantized at load)
    notes: dict[str, str] = field(default_factory=dict)


def detect() -> Capabilities:
    try:
        # guarded: a broken engine install must not break the Load form
        from engine.capabilities import capabilities  # type: ignore[import-not-found]
    except ImportError:
        return Capabilities()
    try:
        raw = dict(capabilities())
    except Exception:  # noqa: BLE001 - a broken probe must not break the form
        return Capabilities()
    known = {f for f in Capabilities.__dataclass_fields__}
    values = {k: (tuple(v) if isinstance(v, list) else v) for k, v in raw.items() if k in known}
    return Capabilities(**values)
