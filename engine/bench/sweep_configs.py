"""Engine-configuration sweeps of `kestrel bench sweep --engine-configs`: for the embedded engine, the same sweep
points run against Kestrel's server started once per engine configuration (the engine reloaded between them).

A configuration is ``KEY=VALUE[,KEY=VALUE...]`` over engine/config.py's ``EngineConfig`` fields, named as the
`kestrel serve` flags without their dashes (``enable_prefix_caching``, ``quantization``, ``tensor_parallel_size``,
``comm_strategy``, ``num_threads``, ``dtype``, ``max_num_seqs``, ...; ``-`` and ``_`` alike), with the short names
``prefix_caching``, ``tp`` and ``threads``; booleans are on/off (true/false, yes/no, 1/0). ``--engine-common``
holds what every configuration shares (``model=...``, ``dtype=float32``, ``num_threads=2``); a configuration's
own keys win. Every configuration is checked (keys, types, choices) before any engine starts.

Each configuration's server is ``engine.server.serve.BackgroundServer`` (an engine process and a real uvicorn
server on a free 127.0.0.1 port, as the server tests use); it is stopped before the next one starts, so two
engines never share the machine during a measurement."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from dataclasses import dataclass, field

ALIASES = {"prefix_caching": "enable_prefix_caching", "tp": "tensor_parallel_size", "threads": "num_threads"}
TRUE, FALSE = ("on", "true", "yes", "1"), ("off", "false", "no", "0")


@dataclass
class EngineConfigSpec:
    """One configuration of the sweep: its name (as given on the command line) and the fields it sets."""

    name: str
    overrides: dict = field(default_factory=dict)  # the configuration's own keys (canonical field names)
    common: dict = field(default_factory=dict)  # --engine-common's

    def config(self):
        from engine.config import EngineConfig

        return EngineConfig(**{**self.common, **self.overrides})


def _fields() -> dict:
    from engine.config import EngineConfig

    return {f.name: f for f in dataclasses.fields(EngineConfig)}


def _value(key: str, raw: str, f, where: str):
    typ = str(f.type)
    optional = "None" in typ
    if optional and raw.lower() in ("none", "default") and "choices" not in f.metadata:
        return None
    base = typ.split(" ")[0]
    if base == "bool":
        low = raw.lower()
        if low in TRUE:
            return True
        if low in FALSE:
            return False
        raise ValueError(f"{where}: {key} is on or off, not {raw!r}")
    try:
        value = {"int": int, "float": float}.get(base, str)(raw)
    except ValueError:
        raise ValueError(f"{where}: {key} takes a number ({base}), not {raw!r}") from None
    choices = f.metadata.get("choices")
    if choices and value not in choices:
        raise ValueError(f"{where}: {key} is one of {', '.join(map(str, choices))}, not {raw!r}")
    return value


def parse_pairs(text: str, where: str) -> dict:
    """``"prefix_caching=off,quantization=int8"`` -> {"enable_prefix_caching": False, "quantization": "int8"};
    ValueError in words for an unknown key, a malformed pair or a bad value."""
    fields = _fields()
    out: dict = {}
    for pair in (p.strip() for p in text.split(",")):
        if not pair:
            continue
        key, sep, raw = pair.partition("=")
        key = key.strip().replace("-", "_")
        key = ALIASES.get(key, key)
        if not sep or not key:
            raise ValueError(f"{where}: {pair!r} is not KEY=VALUE")
        if key not in fields:
            known = ", ".join(sorted([*fields, *ALIASES]))
            raise ValueError(f"{where}: unknown engine option {pair.partition('=')[0].strip()!r} (known: {known})")
        out[key] = _value(key, raw.strip(), fields[key], where)
    return out


def parse(configs: list[str], common: str | None = None) -> list[EngineConfigSpec]:
    """The configurations of ``--engine-configs`` over ``--engine-common``, each checked by building its
    EngineConfig; ValueError in words otherwise."""
    base = parse_pairs(common or "", "--engine-common")
    specs = []
    for text in configs:
        spec = EngineConfigSpec(text.strip(), parse_pairs(text, f"--engine-configs {text!r}"), dict(base))
        try:
            spec.config()
        except (TypeError, ValueError) as e:
            raise ValueError(f"--engine-configs {text!r}: {e}") from None
        specs.append(spec)
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError("--engine-configs: each configuration once (the report tells the points apart by it)")
    return specs


@contextlib.contextmanager
def served(spec: EngineConfigSpec, served_model_name: str | None = None, startup_timeout: float = 900):
    """Kestrel's server on ``spec``'s engine, on a free loopback port; yields (url, seconds it took to start)."""
    from engine.server.serve import BackgroundServer

    kw = {"served_model_names": [served_model_name]} if served_model_name else {}
    t0 = time.perf_counter()
    srv = BackgroundServer(spec.config(), startup_timeout=startup_timeout, host="127.0.0.1", port=0, **kw)
    srv.start()
    try:
        yield srv.url, time.perf_counter() - t0
    finally:
        srv.stop()


def record(spec: EngineConfigSpec) -> dict:
    """What the report keeps of a configuration: its name, its own keys, the shared ones, the full config and the
    kernel and comm configuration it resolves to on this machine (the server started here runs it)."""
    from engine.bench.report import resolved_config

    config = spec.config()
    return {"name": spec.name, "overrides": spec.overrides, "common": spec.common,
            "engine_config": dataclasses.asdict(config), "config": resolved_config(engine_config=config)}
