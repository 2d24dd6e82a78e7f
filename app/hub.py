"""The Hugging Face Hub, through huggingface_hub's HfApi: search text-generation models by format, and a
repo's files with their sizes and hashes, its config and what the engine makes of it. Network calls; run
them on a worker thread. Errors come out as HubError with a plain message."""

from __future__ import annotations

import os
import re
import socket
import threading
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from app.downloader import HubFile
from app.fit import ModelShape
from app.model_inspect import GGUF_ARCHITECTURES
from app.paths import hf_endpoint
from app.quant_scheme import describe_quantization
from engine.config import SUPPORTED_ARCHITECTURES

FORMATS = {"Any format": None, "safetensors": "safetensors", "GGUF": "gguf", "GPTQ": "gptq", "AWQ": "awq"}
_WEIGHT_SUFFIXES = (".safetensors", ".gguf", ".bin", ".pt", ".pth", ".onnx", ".msgpack", ".h5", ".ot")
_NEEDED_SMALL = re.compile(r"^(config\.json|generation_config\.json|tokenizer.*|special_tokens_map\.json|"
                           r"chat_template\.(jinja|json)|.*\.safetensors\.index\.json|vocab\.json|merges\.txt)$")
PROBE_TIMEOUT = 2.0  # seconds: one TCP connect to the Hub before a call (huggingface_hub retries 5 times, ~23 s)
_QUANT_IN_NAME = re.compile(r"(?i)(?:^|[-_.])((?:I?Q\d[\w]*?)|F16|F32|BF16)(?=\.gguf$|-\d{5}-of-)")


class HubError(Exception):
    pass


@dataclass
class HubModel:
    repo_id: str
    downloads: int = 0
    likes: int = 0
    last_modified: datetime | None = None
    tags: list[str] = field(default_factory=list)
    gated: bool = False

    @property
    def formats(self) -> list[str]:
        tags = set(self.tags)
        return [name for name, tag in FORMATS.items() if tag and tag in tags]


@dataclass
class Variant:
    """One thing to download: a GGUF file (one quantization), or the safetensors weights with their
    config and tokenizer files."""

    label: str  # "Q4_K_M", "safetensors (bfloat16)", "safetensors (GPTQ int4 g128)", ...
    files: list[HubFile]
    quantization: str | None  # the GGUF type, or the checkpoint's quantization in words ("GPTQ int4 g128")
    size: int
    reason: str = ""  # why the engine cannot load it (a quantization it does not read); "" when it can

    @property
    def loadable(self) -> bool:
        return not self.reason

    @property
    def is_gguf(self) -> bool:
        return any(f.path.endswith(".gguf") for f in self.files)


@dataclass
class RepoDetails:
    repo_id: str
    sha: str | None
    files: list[HubFile]
    config: dict[str, Any]
    gated: bool
    architecture: str | None
    num_params: int | None
    context_length: int | None
    shape: ModelShape | None
    torch_dtype: str | None
    variants: list[Variant]
    supported: bool
    reason: str


def _api(token: str | None):
    # Hub access only when the user searches or downloads
    from huggingface_hub import HfApi

    return HfApi(endpoint=hf_endpoint(), token=token or False)


def offline_mode() -> bool:
    """huggingface_hub's offline mode (HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE, read at its import), or the
    variable set since."""
    from huggingface_hub import constants

    env = (os.environ.get("HF_HUB_OFFLINE") or "").strip().upper() in ("1", "ON", "YES", "TRUE")
    return bool(constants.HF_HUB_OFFLINE) or env


def endpoint() -> str:
    from huggingface_hub import constants

    return hf_endpoint() or constants.ENDPOINT


def probe(what: str, timeout: float = PROBE_TIMEOUT) -> None:
    """Fail fast, before huggingface_hub's retries: HubError at once in offline mode, and when one TCP connect
    to the Hub's host (name lookup included) does not succeed within ``timeout`` seconds."""
    if offline_mode():
        raise HubError(f"Cannot {what}: offline mode is on (HF_HUB_OFFLINE=1).")
    parts = urlsplit(endpoint())
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    proxy = urllib.request.getproxies().get(parts.scheme)
    if proxy and not urllib.request.proxy_bypass(host):  # behind a proxy: the proxy is what must answer
        pp = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        host, port = pp.hostname or host, pp.port or 8080
    outcome: list[BaseException | None] = []

    def connect() -> None:  # on a thread of its own: a name lookup does not honour a socket timeout
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            outcome.append(None)
        except BaseException as e:  # noqa: BLE001
            outcome.append(e)

    t = threading.Thread(target=connect, name="hub-probe", daemon=True)
    t.start()
    t.join(timeout)
    if not outcome:
        raise HubError(f"Cannot {what}: the Hub is not reachable (no answer from {host} in {timeout:g} s).")
    if outcome[0] is not None:
        raise HubError(f"Cannot {what}: the Hub is not reachable ({host}: {_reason(outcome[0])}).")


def _reason(e: BaseException) -> str:
    if isinstance(e, socket.gaierror):
        return "name lookup failed; is the network up?"
    return getattr(e, "strerror", None) or str(e) or type(e).__name__


def search_models(query: str, fmt: str | None = None, limit: int = 50, token: str | None = None) -> list[HubModel]:
    """Text-generation models matching ``query``, most downloaded first; ``fmt`` one of FORMATS' values."""
    probe("search the Hub")
    try:
        models = _api(token).list_models(
            search=query or None, filter=[fmt] if fmt else None, pipeline_tag="text-generation",
            sort="downloads", limit=limit,
            expand=["downloads", "likes", "lastModified", "tags", "gated"])
        return [HubModel(repo_id=m.id, downloads=m.downloads or 0, likes=m.likes or 0,
                         last_modified=m.last_modified, tags=list(m.tags or []), gated=bool(m.gated))
                for m in models]
    except Exception as e:  # noqa: BLE001 - network, HTTP, offline mode: all become one plain message
        raise HubError(_explain(e, "search the Hub")) from None


def repo_details(repo_id: str, token: str | None = None) -> RepoDetails:
    probe(f"read {repo_id}")
    try:
        info = _api(token).model_info(repo_id, files_metadata=True)
    except Exception as e:  # noqa: BLE001
        raise HubError(_explain(e, f"read {repo_id}")) from None
    files = [HubFile(path=s.rfilename, size=s.size, sha256=(s.lfs or {}).get("sha256") if s.lfs else None,
                     blob_id=s.blob_id) for s in info.siblings or []]
    config = dict(info.config or {})
    gguf = dict(info.gguf or {}) if isinstance(info.gguf, dict) else {}
    st_total = getattr(info.safetensors, "total", None) if info.safetensors else None
    archs = config.get("architectures") or []
    architecture = archs[0] if archs else None
    gguf_arch = gguf.get("architecture")
    if gguf_arch:
        architecture = architecture or GGUF_ARCHITECTURES.get(gguf_arch, f"{gguf_arch} (GGUF)")
    shape = ModelShape.from_hf_config(config) if config.get("num_attention_heads") else None
    variants = _variants(files, config)
    supported, reason = _support(architecture, config, variants)
    return RepoDetails(
        repo_id=repo_id, sha=info.sha, files=files, config=config, gated=bool(info.gated),
        architecture=architecture, num_params=st_total or gguf.get("total"),
        context_length=config.get("max_position_embeddings") or gguf.get("context_length"),
        shape=shape, torch_dtype=config.get("torch_dtype") or config.get("dtype"), variants=variants,
        supported=supported, reason=reason)


def _variants(files: list[HubFile], config: dict) -> list[Variant]:
    out: list[Variant] = []
    ggufs: dict[str, list[HubFile]] = {}
    for f in files:
        if f.path.endswith(".gguf"):
            m = _QUANT_IN_NAME.search(f.path.rsplit("/", 1)[-1])
            ggufs.setdefault(m.group(1).upper() if m else f.path, []).append(f)
    for quant, fs in sorted(ggufs.items()):
        out.append(Variant(quant, fs, quant, sum(f.size or 0 for f in fs)))
    weights = [f for f in files if f.path.endswith(".safetensors")]
    if weights:
        small = [f for f in files if _NEEDED_SMALL.match(f.path)]
        # the Hub's summary of config.json may leave fields of quantization_config out (complete=False)
        quant, refused = describe_quantization(config.get("quantization_config"), complete=False)
        dtype = config.get("torch_dtype") or config.get("dtype") or "float"
        label = f"safetensors ({quant or dtype})"
        out.append(Variant(label, weights + small, quant, sum(f.size or 0 for f in weights + small), refused or ""))
    return out


def _support(architecture: str | None, config: dict, variants: list[Variant]) -> tuple[bool, str]:
    if architecture is None:
        return False, "The repo does not say its architecture (no config.json or GGUF metadata)."
    if architecture not in SUPPORTED_ARCHITECTURES:
        return False, (f"Architecture {architecture} is not supported (supported: "
                       f"{', '.join(sorted(SUPPORTED_ARCHITECTURES))}).")
    if not variants:
        return False, "No safetensors or GGUF weights in this repo."
    if not any(v.loadable for v in variants):
        return False, variants[0].reason
    return True, ""


def _explain(e: Exception, what: str) -> str:
    name = type(e).__name__
    text = (str(e).strip().splitlines() or [name])[0]
    if name == "OfflineModeIsEnabled":
        return f"Cannot {what}: offline mode is on (HF_HUB_OFFLINE=1)."
    if name == "GatedRepoError":
        return f"Cannot {what}: the model is gated. Accept its terms on the Hub and set your Hugging Face token."
    if name == "RepositoryNotFoundError":
        return f"Cannot {what}: not found on the Hub (private? set your Hugging Face token)."
    if name in ("ConnectError", "ConnectTimeout", "ReadTimeout", "TimeoutException") or isinstance(e, OSError):
        return f"Cannot {what}: the Hub is not reachable ({text})."
    return f"Cannot {what}: {text}"
