import pytest


@pytest.fixture(scope="session")
def smollm2_fp32():
    """One float32 engine on the embedded model, shared by the engine tests (loading takes seconds)."""
    from engine import LLM

    return LLM(dtype="float32")
