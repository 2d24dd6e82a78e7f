"""Model runner: owns the model and the KV cache on one device; turns a scheduler step into
input tensors, runs the forward pass and samples."""

from __future__ import annotations

import logging

import torch

from engine import ops
from engine.config import EngineConfig, ModelConfig
from engine.core.request import Request
from engine.core.scheduler import SchedulerOutput
from engine.layers.attention import AttentionMetadata, PrefillSegment
from engine.layers.sampler import Sampler, TokenLogprobs
from engine.models.registry import model_class
from engine.parallel.context import SINGLE, TPContext
from engine.runner.device import physical_cores, resolve_device, resolve_dtype

log = logging.getLogger(__name__)

CPU_DEFAULT_KV_GIB = 2.0


class ModelRunner:
    def __init__(self, config: EngineConfig, model_config: ModelConfig, weights, max_model_len: int,
                 checkpoint_dtype: str | None = None, tp: TPContext = SINGLE):
        self.config = config
        self.model_config = model_config
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device, checkpoint_dtype)
        self.tp = tp
        if self.device.type == "cpu":
            threads = config.num_threads or physical_cores()
            torch.set_num_threads(threads)
            ops.set_num_threads(threads)
        self.block_size = config.block_size
        cls = model_class(model_config)
        with torch.device(self.device):
            self.model = cls(model_config, self.dtype, tp, max_model_len)
        self.model.load_weights(weights)
        self.model.eval()
        self.num_blocks = self._num_kv_blocks()
        self._allocate_kv_cache()
        self.generators: dict[str, torch.Generator] = {}
        self.sampler = Sampler(torch.Generator(device="cpu").manual_seed(config.seed))

    # -- KV cache -------------------------------------------------------------------------
    def kv_bytes_per_block(self) -> int:
        layer = self.model.layers[0].self_attn.attn
        elem = torch.tensor([], dtype=self.dtype).element_size()
        return 2 * len(self.model.layers) * self.block_size * layer.num_kv_heads * layer.head_dim * elem

    def _num_kv_blocks(self) -> int:
        if self.config.num_kv_blocks:
            return self.config.num_kv_blocks
        per_block = self.kv_bytes_per_block()
        if self.device.type == "cpu" or self.config.kv_cache_memory_gib is not None:
            gib = self.config.kv_cache_memory_gib or CPU_DEFAULT_KV_GIB
            return max(1, int(gib * 2**30) // per_block)
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info(self.device)
        budget = total * self.config.gpu_memory_utilization - (total - free)
        return max(1, int(budget * 0.9) // per_block)

    def _allocate_kv_cache(self) -> None:
        attn0 = self.model.layers[0].self_attn.attn
        shape = (self.num_blocks, self.block_size, attn0.num_kv_heads, attn0.head_dim)
        for attn in self.model.attention_layers():
            attn.k_cache = torch.empty(shape, dtype=self.dtype, device=self.device)
            attn.v_cache = torch.empty(shape, dtype=self.dtype, device=self.device)

    # -- per-request sampling state -----------------------------------------------------------
    def add_request(self, req: Request) -> None:
        if req.params.seed is not None:
            self.generators[req.request_id] = torch.Generator(device="cpu").manual_seed(req.params.seed)

    def remove_request(self, request_id: str) -> None:
        self.generators.pop(request_id, None)

    # -- one step -------------------------------------------------------------------------
    def _prepare(self, sched: SchedulerOutput):
        bs = self.block_size
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        decode_tables: list[list[int]] = []
        decode_lens: list[int] = []
        prefills: list[PrefillSegment] = []
        sample_rows: list[int] = []
        sample_reqs: list[Request] = []
        for s in sched.scheduled:
            req, n = s.request, s.num_new_tokens
            start = req.num_computed_tokens
            toks = req.all_token_ids[start:start + n] if n > 1 else [req.token_at(start)]
            q0 = len(ids)
            ids.extend(toks)
            positions.extend(range(start, start + n))
            table = req.block_ids
            slots.extend(table[p // bs] * bs + p % bs for p in range(start, start + n))
            if n == 1:
                decode_tables.append(table)
                decode_lens.append(start + 1)
            else:
                ctx = start + n
                prefills.append(PrefillSegment(q0, n, ctx, torch.tensor(table[: -(-ctx // bs)], dtype=torch.long,
                                                                        device=self.device)))
            if s.samples:
                sample_rows.append(q0 + n - 1)
                sample_reqs.append(req)
        nd = len(decode_lens)
        dev = self.device
        meta = AttentionMetadata(
            positions=torch.tensor(positions, dtype=torch.long, device=dev),
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=dev),
            num_decode_tokens=nd,
            prefills=prefills,
        )
        if nd:
            width = max(len(t) for t in decode_tables)
            meta.decode_block_tables = torch.tensor([t + [0] * (width - len(t)) for t in decode_tables],
                                                    dtype=torch.int32, device=dev)
            meta.decode_context_lens = torch.tensor(decode_lens, dtype=torch.int32, device=dev)
        input_ids = torch.tensor(ids, dtype=torch.long, device=dev)
        return input_ids, meta, sample_rows, sample_reqs

    @torch.inference_mode()
    def execute(self, sched: SchedulerOutput) -> tuple[list[Request], list[int], list[TokenLogprobs | None]]:
        input_ids, meta, rows, reqs = self._prepare(sched)
        hidden = self.model(input_ids, meta)
        if not reqs:
            return [], [], []
        logits = self.model.compute_logits(hidden[rows])
        gens = [self.generators.get(r.request_id) for r in reqs]
        tokens, lps = self.sampler(logits, reqs, gens)
        return reqs, tokens, lps

    @torch.inference_mode()
    def all_logits(self, sched: SchedulerOutput) -> torch.Tensor:
        """Float32 logits at every position the step computes (scoring, perplexity, tests)."""
        input_ids, meta, _, _ = self._prepare(sched)
        return self.model.compute_logits(self.model(input_ids, meta)).float()
