"""Model runner: owns the model and the KV cache on one device; turns a scheduler step into
input tensors, runs the forward pass and samples."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

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


@dataclass
class StepInputs:
    """One step, in plain Python so it pickles cheaply to tensor-parallel workers."""

    token_ids: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)
    decode_tables: list[list[int]] = field(default_factory=list)
    decode_lens: list[int] = field(default_factory=list)
    prefills: list[tuple[int, int, int, list[int]]] = field(default_factory=list)  # (start, len, context, blocks)
    logit_rows: list[int] | None = field(default_factory=list)  # None: logits at every position

CPU_DEFAULT_KV_GIB = 2.0


class ModelRunner:
    def __init__(self, config: EngineConfig, model_config: ModelConfig, weights, max_model_len: int,
                 checkpoint_dtype: str | None = None, tp: TPContext = SINGLE, defer_kv: bool = False):
        self.config = config
        self.model_config = model_config
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device, checkpoint_dtype)
        self.tp = tp
        if self.device.type == "cpu":
            threads = config.num_threads or physical_cores()
            if tp.size > 1:  # tensor parallelism on the CPU: the ranks share the cores
                threads = max(1, threads // tp.size)
            torch.set_num_threads(threads)
            ops.set_num_threads(threads)
        self.block_size = config.block_size
        cls = model_class(model_config)
        with torch.device(self.device):
            self.model = cls(model_config, self.dtype, tp, max_model_len)
        self.model.load_weights(weights)
        self.model.eval()
        if config.quantization == "int8":
            if self.device.type != "cpu":
                from engine.errors import KestrelError
                raise KestrelError("--quantization int8 runs on the CPU kernels; on a GPU load with "
                                   "--quantization none")
            n, total = self.model.quantize_int8()
            log.info("int8 weights: %d of %d linear layers (the others have K not a multiple of 32)", n, total)
        if not defer_kv:  # TP: the executor decides the number of blocks for all ranks (allocate_kv)
            self.num_blocks = self._num_kv_blocks()
            self._allocate_kv_cache()
        self.generators: dict[str, torch.Generator] = {}
        self.sampler = Sampler(torch.Generator(device=self.device).manual_seed(config.seed))
        self.on_step: Callable[[StepInputs], None] | None = None  # TP: hands each step to the workers

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

    def allocate_kv(self, num_blocks: int) -> None:
        """Allocate the KV cache with exactly num_blocks blocks (tensor parallelism: every rank the same)."""
        self.num_blocks = num_blocks
        self._allocate_kv_cache()

    def _allocate_kv_cache(self) -> None:
        attn0 = self.model.layers[0].self_attn.attn
        shape = (self.num_blocks, self.block_size, attn0.num_kv_heads, attn0.head_dim)
        for attn in self.model.attention_layers():
            attn.k_cache = torch.empty(shape, dtype=self.dtype, device=self.device)
            attn.v_cache = torch.empty(shape, dtype=self.dtype, device=self.device)

    # -- per-request sampling state -----------------------------------------------------------
    def add_request(self, req: Request) -> None:
        if req.params.seed is not None:
            self.generators[req.request_id] = torch.Generator(device=self.device).manual_seed(req.params.seed)

    def remove_request(self, request_id: str) -> None:
        self.generators.pop(request_id, None)

    # -- one step -------------------------------------------------------------------------
    def prepare(self, sched: SchedulerOutput, all_logits: bool = False) -> tuple[StepInputs, list[Request]]:
        """Plain-Python description of the step (what TP workers receive) and the requests that sample."""
        bs = self.block_size
        inp = StepInputs()
        sample_reqs: list[Request] = []
        for s in sched.scheduled:
            req, n = s.request, s.num_new_tokens
            start = req.num_computed_tokens
            q0 = len(inp.token_ids)
            inp.token_ids.extend(req.all_token_ids[start:start + n] if n > 1 else [req.token_at(start)])
            inp.positions.extend(range(start, start + n))
            table = req.block_ids
            inp.slots.extend(table[p // bs] * bs + p % bs for p in range(start, start + n))
            if n == 1:
                inp.decode_tables.append(table)
                inp.decode_lens.append(start + 1)
            else:
                ctx = start + n
                inp.prefills.append((q0, n, ctx, table[: -(-ctx // bs)]))
            if s.samples:
                inp.logit_rows.append(q0 + n - 1)
                sample_reqs.append(req)
        if all_logits:
            inp.logit_rows = None
        return inp, sample_reqs

    def _tensors(self, inp: StepInputs) -> tuple[torch.Tensor, AttentionMetadata]:
        dev = self.device
        nd = len(inp.decode_lens)
        meta = AttentionMetadata(
            positions=torch.tensor(inp.positions, dtype=torch.long, device=dev),
            slot_mapping=torch.tensor(inp.slots, dtype=torch.long, device=dev),
            num_decode_tokens=nd,
            prefills=[PrefillSegment(q0, n, ctx, torch.tensor(blocks, dtype=torch.long, device=dev))
                      for q0, n, ctx, blocks in inp.prefills],
        )
        if nd:
            width = max(len(t) for t in inp.decode_tables)
            meta.decode_block_tables = torch.tensor([t + [0] * (width - len(t)) for t in inp.decode_tables],
                                                    dtype=torch.int32, device=dev)
            meta.decode_context_lens = torch.tensor(inp.decode_lens, dtype=torch.int32, device=dev)
        return torch.tensor(inp.token_ids, dtype=torch.long, device=dev), meta

    @torch.inference_mode()
    def run(self, inp: StepInputs) -> torch.Tensor | None:
        """Forward pass of one step on this rank; float32 logits at inp.logit_rows (all rows if None).
        Every TP rank runs this with the same inputs."""
        if self.tp.size > 1:
            return self.tp.guard(self._run, inp)
        return self._run(inp)

    def _run(self, inp: StepInputs) -> torch.Tensor | None:
        input_ids, meta = self._tensors(inp)
        hidden = self.model(input_ids, meta) if self.tp.size == 1 else self.tp.forward(self.model, input_ids, meta)
        if inp.logit_rows is not None:
            if not inp.logit_rows:
                return None
            hidden = hidden[inp.logit_rows]
        return self.model.compute_logits(hidden).float()

    def execute(self, sched: SchedulerOutput) -> tuple[list[Request], list[int], list[TokenLogprobs | None]]:
        inp, reqs = self.prepare(sched)
        if self.on_step is not None:
            self.on_step(inp)
        logits = self.run(inp)
        if not reqs:
            return [], [], []
        gens = [self.generators.get(r.request_id) for r in reqs]
        tokens, lps = self.sampler(logits, reqs, gens)
        return reqs, tokens, lps

    def all_logits(self, sched: SchedulerOutput) -> torch.Tensor:
        """Float32 logits at every position the step computes (scoring, perplexity, tests)."""
        inp, _ = self.prepare(sched, all_logits=True)
        if self.on_step is not None:
            self.on_step(inp)
        return self.run(inp)
