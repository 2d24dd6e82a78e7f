"""The token embedding and the LM head on GGUF blocks (--quantization gguf on the CPU; engine/layers/embedding.py,
ops.gguf_embedding, csrc/cpu/gguf_dispatch.cpp gguf_get_rows): the lookup gives the rows of gguf's own
dequantization, the LM head computes on the blocks, a tied table serves both from the file's bytes, and tensor
parallelism slices the vocabulary as it slices float tables. The logits' agreement with the dequantized model
is test_gguf_model.py's (its quantized engines now take this table too)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, quants
from gguf import GGMLQuantizationType as Q

from engine import LLM, ops
from engine.ops import GGUFWeight, gguf_quant

pytestmark = pytest.mark.skipif(not ops.native_available(), reason="needs engine._C")

TYPES = [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K]


def _table(qtype, n, k, seed=0) -> tuple[GGUFWeight, torch.Tensor]:
    """A random [n, k] table in qtype, and gguf's own dequantization of it (float32)."""
    from tests.support.gguf_writer import quantize_kquant

    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((n, k)) * rng.uniform(0.01, 2.0, (n, 1))).astype(np.float32)
    raw = quantize_kquant(w, qtype) if GGML_QUANT_SIZES[qtype][0] == 256 else quants.quantize(w, qtype)
    truth = torch.from_numpy(quants.dequantize(raw, qtype).astype(np.float32)).reshape(n, k)
    return GGUFWeight.from_blocks(raw, int(qtype), k), truth


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_lookup_gives_the_dequantized_rows(qtype, dtype):
    table, truth = _table(qtype, 97, 512, seed=int(qtype))
    ids = torch.tensor([[0, 96, 5, 5], [17, 3, 96, 0]])
    got = ops.gguf_embedding(ids, table, dtype)
    assert got.shape == (2, 4, 512) and got.dtype == dtype
    # float32: one rounding of q d + m (a fused multiply-add here, two roundings in gguf's numpy): 1e-6 relative
    torch.testing.assert_close(got.float(), truth[ids].to(dtype).float(),
                               rtol=1e-6 if dtype == torch.float32 else 1e-2, atol=1e-7)
    assert ops.gguf_embedding(torch.empty(0, dtype=torch.int64), table, dtype).shape == (0, 512)


def test_out_of_range_ids_raise_and_the_fallback_agrees(monkeypatch):
    table, truth = _table(Q.Q8_0, 40, 64)
    for bad in (-1, 40):
        with pytest.raises(IndexError, match="out of range"):
            ops.gguf_embedding(torch.tensor([1, bad]), table, torch.float32)
    ids = torch.tensor([39, 0, 7])
    native = ops.gguf_embedding(ids, table, torch.float32)
    monkeypatch.setattr(gguf_quant, "native_lib", None)  # CUDA tensors and builds without engine._C take this
    torch.testing.assert_close(ops.gguf_embedding(ids, table, torch.float32), native, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(native, truth[ids], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("tp_size", [1, 2, 3])
def test_vocab_shards_hold_their_rows_of_the_file(smollm2_gguf, tp_size):
    """SmolLM2's tied Q8_0 table (49152 x 576), sliced per rank as the float table is: rank r's blocks are rows
    [start, stop) of the file, its lookup gives them (zeros for other ranks' ids, summed by the all-reduce) and
    its LM head the matching columns of the whole head's logits."""
    from engine.layers.embedding import ParallelLMHead
    from engine.loader.gguf import GGUFWeights
    from engine.loader.gguf_file import GGUFFile
    from engine.parallel.context import TPContext

    gf = GGUFFile(smollm2_gguf)
    weights = GGUFWeights(gf, 9, 3)
    weights.keep_quantized = True
    try:
        def build(rank, size):
            head = ParallelLMHead(49152, 576, torch.float32, TPContext(rank=rank, size=size))
            head.load(weights, "model.embed_tokens.weight")
            return head

        full = build(0, 1)
        assert full.gguf is not None and full.gguf.type_name == "Q8_0" and full.weight.numel() == 0
        assert full.gguf.nbytes == gf.tensors["token_embd.weight"].nbytes  # the file's bytes
        ids = torch.tensor([0, 1, 16383, 16384, 32767, 32768, 49151])
        rows = ops.gguf_embedding(ids, full.gguf, torch.float32)
        hidden = torch.randn(2, 576, generator=torch.Generator().manual_seed(0))
        logits = full.logits(hidden)
        assert logits.shape == (2, 49152)
        torch.testing.assert_close(full(ids), rows)
        for rank in range(tp_size):
            head = build(rank, tp_size)
            head.tp.all_reduce = lambda t: t  # one rank's part, unsummed (no comm group in this process)
            assert head.gguf.shape == (head.stop - head.start, 576)
            mine = (ids >= head.start) & (ids < head.stop)
            got = head(ids)
            torch.testing.assert_close(got[mine], rows[mine])
            assert (got[~mine] == 0).all()
            torch.testing.assert_close(ops.linear(hidden, head.gguf), logits[:, head.start:head.stop],
                                       rtol=1e-5, atol=1e-5)
    finally:
        gf.close()


def test_the_embedded_model_keeps_its_table_as_blocks(smollm2_gguf, smollm2_fp32):
    from engine.loader.gguf_file import GGUFFile

    llm = LLM(dtype="float32", kv_cache_memory_gib=0.02, quantization="gguf")
    try:
        model = llm.core.runner.model
        table = model.embed_tokens
        assert model.lm_head is table and isinstance(table.gguf, GGUFWeight) and table.weight.numel() == 0
        gf = GGUFFile(smollm2_gguf)
        try:
            assert table.gguf.nbytes == gf.tensors["token_embd.weight"].nbytes
        finally:
            gf.close()
    finally:
        llm.close()
    d = smollm2_fp32  # dequantized (quantization="none", the session's engine): a float table
    assert d.config.quantization == "none" and d.core.runner.model.embed_tokens.gguf is None


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("rows", [0, 1, 37, 300])
def test_whole_weight_dequantize_over_the_threads(qtype, rows):
    """gguf_dequantize (the panels of the oneDNN prefill route): every row, split over the kernel threads, equal
    to the lookup of all rows (the same per-row code) and to gguf's own dequantization."""
    from engine.ops.native import dtype_code, native_lib

    ops.set_num_threads(2)
    table, truth = _table(qtype, max(rows, 1), 1024, seed=rows)
    table = GGUFWeight(table.data[:rows], table.qtype, table.k)
    for dtype in (torch.float32, torch.bfloat16):
        out = torch.full((rows, 1024), float("nan"), dtype=dtype)
        native_lib.gguf_dequantize(dtype_code(dtype), out.data_ptr(), table.data.data_ptr(), table.data.shape[1],
                                   table.qtype, rows, 1024)
        assert torch.equal(out, ops.gguf_embedding(torch.arange(rows), table, dtype))
        torch.testing.assert_close(out.float(), truth[:rows].to(dtype).float(),
                                   rtol=1e-6 if dtype == torch.float32 else 1e-2, atol=1e-7)
