"""One attention backend per model, chosen at start-up (select_backend: KernelConfig.prefill_attention and the
device); its metadata builder decides each step's route once, and every layer takes that route."""

import torch

from engine.layers import attention
from engine.layers.attention import (DECODE, FRESH, ONE_CHUNK, RESUME, VARLEN, Attention, AttentionMetadata,
                                     CudaAutoBackend, SdpaBackend, SeqSpan, TritonBackend, select_backend)

CPU = torch.device("cpu")
LONG = attention.RESUME_MIN_QUERY

STEPS = {  # name -> the step's sequences (decodes first)
    "decodes": [SeqSpan(0, 1, 5, (0,)), SeqSpan(1, 1, 9, (1,))],
    "fresh": [SeqSpan(0, 4, 4, (0,)), SeqSpan(4, 4, 4, (1,))],
    "ragged": [SeqSpan(0, 4, 4, (0,)), SeqSpan(4, 3, 3, (1,))],
    "one chunk": [SeqSpan(0, 3, 10, (0,))],
    "mixed": [SeqSpan(0, 1, 5, (0,)), SeqSpan(1, 4, 4, (1,))],
    "long over a prefix": [SeqSpan(0, LONG, LONG + 16, tuple(range(-(-(LONG + 16) // 16))))],
}

WANT = {  # backend -> the route of each step
    "sdpa": {"decodes": DECODE, "fresh": FRESH, "ragged": DECODE, "one chunk": ONE_CHUNK, "mixed": DECODE,
             "long over a prefix": ONE_CHUNK},
    "triton": {"decodes": DECODE, "fresh": VARLEN, "ragged": VARLEN, "one chunk": VARLEN, "mixed": VARLEN,
               "long over a prefix": VARLEN},
    "auto": {"decodes": DECODE, "fresh": FRESH, "ragged": VARLEN, "one chunk": VARLEN, "mixed": VARLEN,
             "long over a prefix": RESUME},
}


def test_each_backend_routes_each_step_shape():
    for backend in (SdpaBackend(128), TritonBackend(128), CudaAutoBackend(128)):
        got = {name: backend.route(AttentionMetadata.build(seqs, 16, CPU)) for name, seqs in STEPS.items()}
        assert got == WANT[backend.name], backend.name
    # the merge over a prefix only at the head sizes it compiles at: other long chunks take the one launch
    meta = AttentionMetadata.build(STEPS["long over a prefix"], 16, CPU)
    assert CudaAutoBackend(64).route(meta) == VARLEN


def test_select_backend_from_the_kernel_configuration(monkeypatch):
    monkeypatch.setattr(attention.ops, "varlen_attention_available", lambda: True)
    assert type(select_backend("auto", CPU, 64)) is SdpaBackend  # auto off CUDA: SDPA
    assert type(select_backend("auto", torch.device("cuda"), 64)) is CudaAutoBackend
    assert type(select_backend("triton", CPU, 64)) is TritonBackend
    assert type(select_backend("sdpa", torch.device("cuda"), 64)) is SdpaBackend
    monkeypatch.setattr(attention.ops, "varlen_attention_available", lambda: False)
    assert type(select_backend("triton", torch.device("cuda"), 64)) is SdpaBackend  # no Triton: SDPA
    assert type(select_backend("auto", torch.device("cuda"), 64)) is SdpaBackend


def test_the_builder_routes_once_per_step_and_every_layer_takes_it():
    backend = SdpaBackend(8)
    seqs = STEPS["mixed"]
    meta = backend.build(seqs, 16, CPU)
    assert meta.route == DECODE
    calls = []
    real = SdpaBackend.route
    SdpaBackend.route = lambda self, m: calls.append(1) or real(self, m)
    try:
        layers = [Attention(2, 1, 8, i) for i in range(3)]
        for layer in layers:
            layer.backend = backend
            layer.k_cache, layer.v_cache = torch.zeros(4, 16, 1, 8), torch.zeros(4, 16, 1, 8)
            q, k, v = torch.randn(5, 16), torch.randn(5, 8), torch.randn(5, 8)
            assert layer(q, k, v, meta).shape == (5, 16)
        assert calls == []  # decided by the builder
        half, _ = meta.split(3)  # a micro-batch half: the first layer decides, the others reuse it
        for layer in layers:
            layer(torch.randn(3, 16), torch.randn(3, 8), torch.randn(3, 8), half)
        assert calls == [1] and half.route == DECODE
    finally:
        SdpaBackend.route = real
