"""Model runner: owns the model and the KV cache on one device; turns a scheduler step into
input tensors, runs the forward pass and samples. It reads the step through the protocols of
engine/runner/step.py (the core's objects satisfy them), never the core's types."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine import heap, ops, progress
from engine.config import EngineConfig, ModelConfig
from engine.kernel_config import KernelConfig
from engine.kernel_config import resolve as resolve_kernels
from engine.layers.attention import AttentionMetadata, SeqSpan, select_backend
from engine.layers.linear import quantized_load
from engine.layers.penalties import PenaltyState, has_penalty
from engine.layers.sampler import Sampled, Sampler
from engine.models.registry import model_class
from engine.ops.transfer import to_device
from engine.wire import TokenLogprobs
from engine.parallel.context import SINGLE, TPContext
from engine.runner.cpu_tape import DecodeTapes
from engine.runner.cuda_graphs import DecodeGraphs, capture_sizes, reserve_bytes
from engine.runner.device import default_block_size, physical_cores, resolve_device, resolve_dtype
from engine.runner.inputs import PoolSpan, StepInputs, prepare_step, sampling_metadata, select_rows
from engine.runner.prompt_logprobs import PromptScores, score_rows
from engine.runner.prompt_logprobs import to_host as prompt_scores_to_host
from engine.runner.kv_sizing import fixed_kv_blocks, gpu_kv_blocks, kv_bytes
from engine.runner.load_checks import (check_deterministic, check_gguf_blocks, check_kv_cache_dtype_for_model,
                                       check_quantization, resolve_kv_cache_dtype, resolve_quantization)
from engine.runner.speculative import verify_step
from engine.runner.step import ScheduledStep, SequenceState

log = logging.getLogger(__name__)


CPU_TAPE_MAX = 16  # decode tapes for batches of up to 16 (larger ones: Python is a small share of their step)


class ModelRunner:
    def __init__(self, config: EngineConfig, model_config: ModelConfig, weights, max_model_len: int,
                 checkpoint_dtype: str | None = None, tp: TPContext = SINGLE, defer_kv: bool = False,
                 kernel_config: KernelConfig | None = None):
        self.config = config
        self.model_config = model_config
        self.device = resolve_device(config.device)
        # the kernel configuration (engine/kernel_config.py): rank 0's where the TP executor hands it to a worker,
        # else resolved here once from the device's facts and the config; applied to this process's native kernels
        self.kernel_config = ops.configure(kernel_config or resolve_kernels(ops.device_facts(self.device), config))
        self.dtype = resolve_dtype(config.dtype, self.device, checkpoint_dtype)
        # the KV cache's element type: the model's, or fp8 e4m3 (--kv-cache-dtype fp8, a GPU's; not under MLA)
        check_kv_cache_dtype_for_model(getattr(config, "kv_cache_dtype", "auto"), model_config)
        self.kv_cache_dtype = resolve_kv_cache_dtype(getattr(config, "kv_cache_dtype", "auto"), self.device,
                                                     self.dtype)
        self.tp = tp
        self.deterministic = config.deterministic
        if self.deterministic:
            check_deterministic(self.device, tp)
        if self.device.type == "cpu":
            threads = config.num_threads or physical_cores()
            if tp.size > 1:  # tensor parallelism on the CPU: the ranks share the cores
                threads = max(1, threads // tp.size)
            torch.set_num_threads(threads)
            ops.set_num_threads(threads)
        self.block_size = config.block_size or default_block_size(self.device)
        self.max_model_len = max_model_len
        self.activation_peak_bytes: int | None = None
        cls = model_class(model_config)
        # the mode this load runs: --quantization as given, auto resolved for this device and checkpoint
        self.quantization = resolve_quantization(config.quantization, self.device, weights)
        quantized = self.quantization in ("int8", "int4", "fp8")
        if quantized:
            check_quantization(self.device, self.quantization)
        # on a GPU, quantized weights load layer by layer: the float model is never allocated whole
        gpu_quant = self.device.type == "cuda" and (quantized or hasattr(weights, "quantized"))
        # the rotary table for the positions this engine serves: the KV cache's capacity where it is smaller and
        # known before the model (else allocate_kv resizes the table once the cache is there)
        positions = min(max_model_len, self._kv_tokens_before_model(model_config, defer_kv) or max_model_len)
        with torch.device(self.device), (quantized_load(self.quantization if quantized else None) if gpu_quant
                                         else contextlib.nullcontext()):
            self.model = cls(model_config, self.dtype, tp, positions)
        if self.quantization == "gguf":
            check_gguf_blocks(self.device, weights)
            weights.keep_quantized = True
        if hasattr(weights, "compute_dtype"):  # GPTQ / AWQ / FP8 weights the device dequantizes: once, into our dtype
            weights.compute_dtype = self.dtype
        self.model.load_weights(weights)
        self.model.eval()
        self.use_prefill_attention(self.kernel_config.prefill_attention)
        if quantized:
            self._quantize(self.quantization)
        # decode CUDA graphs: one GPU, not --enforce-eager (tensor parallelism waits for capturable all-reduces);
        # on the CPU, decode tapes of the native calls (engine/runner/cpu_tape.py), recorded by each bucket's first step
        replays = tp.size == 1 and not config.enforce_eager
        self.graph_sizes = capture_sizes(config.max_num_seqs) if self.device.type == "cuda" and replays else []
        self.graphs: DecodeGraphs | None = None
        self.tapes: DecodeTapes | None = None
        if self.device.type == "cpu" and replays and ops.native_available():
            self.tapes = self._decode_tapes(capture_sizes(config.max_num_seqs, CPU_TAPE_MAX))
        if not defer_kv:  # TP: the executor decides the number of blocks for all ranks (allocate_kv)
            self.allocate_kv(self.num_kv_blocks_that_fit())
            if self.graph_sizes:
                self.capture_decode_graphs()
        self.generators: dict[str, torch.Generator] = {}
        self.sampler = Sampler(torch.Generator(device=self.device).manual_seed(config.seed))
        self.penalties = PenaltyState(self.device)  # penalised requests' token counts (engine/layers/penalties.py)
        self.on_step: Callable[[StepInputs], None] | None = None  # TP: hands each step to the workers
        self.pooling_state: dict[str, torch.Tensor] = {}  # an embedding's pool over its chunks so far
        self.prompt_scores: PromptScores | None = None  # the last step's prompt logprobs (take_prompt_scores)

    def use_prefill_attention(self, choice: str) -> None:
        """Bind the model's attention backend (engine/layers/attention.py ``select_backend``: KernelConfig's
        prefill_attention on this device) to every attention layer; start-up does, and a benchmark comparing the
        backends on one loaded model (the decode graphs take the decode kernel whatever the backend)."""
        layers = self.model.attention_layers()
        if layers and getattr(layers[0], "prefill_attention", None):  # MLA (engine/layers/mla.py): its own routes
            choice = layers[0].prefill_attention
        self.attention = select_backend(choice, self.device, layers[0].head_dim if layers else 0)
        for attn in layers:
            attn.backend = self.attention

    def _quantize(self, mode: str) -> None:
        """--quantization int8 on the CPU (its int8 kernels: groups of 32) or int8 / int4 / fp8 on a GPU (the
        kernels of engine/ops/quant_linear.py: the linear layers quantized as they loaded, quantized_load; here the
        LM head), after the weights are loaded."""
        if self.device.type == "cpu":
            n, total = self.model.quantize_int8()
            log.info("int8 weights: %d of %d linear layers (the others have K not a multiple of 32)", n, total)
            return
        n, total = self.model.quantize_weights(mode)
        log.info("%s weights: %d of %d linear layers and the LM head (the others keep %s)", mode, n, total,
                 self.dtype)
        torch.cuda.empty_cache()

    # -- KV cache -------------------------------------------------------------------------
    def kv_bytes_per_block(self) -> int:
        layer = self.model.layers[0].self_attn.attn
        return self._kv_bytes(len(self.model.layers), layer.num_kv_heads, layer.head_dim, layer.cache_tensors)

    def _kv_bytes(self, layers: int, kv_heads: int, head_dim: int, tensors: int = 2) -> int:
        return kv_bytes(layers, kv_heads, head_dim, self.block_size, self.kv_cache_dtype, tensors)

    def _kv_tokens_before_model(self, mc: ModelConfig, defer_kv: bool) -> int | None:
        """The tokens the KV cache will hold (num_kv_blocks_that_fit's blocks), where that needs no model: one
        rank (its KV heads are the config's) and a fixed number of blocks or a fixed memory size (the CPU's,
        --kv-cache-memory-gib). None where it takes the model (a GPU's profiling forward) or the executor (TP)."""
        if defer_kv or self.tp.size > 1:
            return None
        tensors, heads, head_dim = mc.kv_cache_layout
        blocks = fixed_kv_blocks(self.config, self.device, lambda: self._kv_bytes(
            mc.num_hidden_layers, heads, head_dim, tensors))
        return None if blocks is None else blocks * self.block_size

    def num_kv_blocks_that_fit(self) -> int:
        """KV blocks this rank can hold: the configured number, a fixed memory size (CPU, or
        --kv-cache-memory-gib), or on a GPU what remains of gpu_memory_utilization x the GPU's memory after the
        weights and the activation peak of the largest step, measured by a profiling forward (TP=1; TP ranks
        cannot run a forward alone here, so they keep 10% of the budget for activations)."""
        fixed = fixed_kv_blocks(self.config, self.device, self.kv_bytes_per_block)
        if fixed is not None:
            return fixed
        peak = self.profile_activation_peak() if self.tp.size == 1 else None
        if peak is not None:
            self.activation_peak_bytes = peak
        return gpu_kv_blocks(self.config, self.device, self.kv_bytes_per_block(), peak, self.graph_reserve_bytes())

    def graph_reserve_bytes(self) -> int:
        """Memory the decode graphs' private pool will take (0 without graphs)."""
        if not self.graph_sizes:
            return 0
        mc = self.model_config
        return reserve_bytes(self.graph_sizes[-1], mc.vocab_size, mc.hidden_size, mc.intermediate_size,
                             torch.tensor([], dtype=self.dtype).element_size())

    # -- CUDA graphs ----------------------------------------------------------------------------
    def capture_decode_graphs(self, capture: bool = True) -> None:
        """Capture the decode graphs (engine/runner/cuda_graphs.py) over the allocated KV cache; start-up's last
        step, timed and reported. ``capture=False`` sets up the same bucketed path to run eagerly (tests)."""
        sizes = self.graph_sizes or capture_sizes(self.config.max_num_seqs)
        self.graphs = DecodeGraphs(self._decode_forward, self.device, sizes, *self._decode_table(), capture=capture)
        self.graphs.capture(lambda what: progress.report("capturing", what))

    def _decode_forward(self, input_ids: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        return self.model.compute_logits(self.model(input_ids, meta)).float()

    def _decode_table(self) -> tuple[int, int, int]:
        """The static decode buffers' block-table width (the longest context's blocks), block size and KV heads."""
        return (-(-self.max_model_len // self.block_size), self.block_size,
                self.model.layers[0].self_attn.attn.num_kv_heads)

    def _decode_tapes(self, sizes: list[int], capture: bool = True) -> DecodeTapes:
        tapes = DecodeTapes(self.model.embed_tokens,
                            lambda x, meta: self.model.compute_logits(self.model.hidden_states(x, meta)),
                            sizes, *self._decode_table(), self.model_config.hidden_size, self.dtype, capture=capture)
        tapes.capture()
        return tapes

    @torch.inference_mode()
    def profile_activation_peak(self) -> int:
        """Bytes above the weights that the largest step allocates at its peak: one forward of
        max_num_batched_tokens prompt tokens (written into a scratch KV cache just large enough), the logits
        of max_num_seqs rows in float32 and a softmax over them, as the sampler does."""
        tokens = max(1, min(self.config.max_num_batched_tokens, self.max_model_len))
        bs = self.block_size
        blocks = -(-tokens // bs)
        self.num_blocks = blocks
        self._allocate_kv_cache()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        base = torch.cuda.memory_allocated(self.device)
        inp = StepInputs(token_ids=[0] * tokens, seqs=[SeqSpan(0, tokens, tokens, tuple(range(blocks)))],
                         logit_rows=list(range(tokens - min(tokens, self.config.max_num_seqs), tokens)))
        logits = self._run(inp)
        torch.softmax(logits, dim=-1)
        del logits
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated(self.device) - base
        for attn in self.model.attention_layers():
            attn.k_cache = attn.v_cache = None
        return peak

    def allocate_kv(self, num_blocks: int) -> None:
        """Allocate the KV cache with exactly num_blocks blocks (tensor parallelism: every rank the same) and cap
        the context at what it holds: max_model_len (which the core and the decode graphs' tables read) and the
        rotary table, which then holds exactly positions 0 .. max_model_len - 1 (built for that many already where
        the capacity was known before the model: _kv_tokens_before_model)."""
        self.num_blocks = num_blocks
        self._allocate_kv_cache()
        capacity = num_blocks * self.block_size
        if capacity < self.max_model_len:
            self.max_model_len = capacity
        rotary = getattr(self.model, "rotary", None)
        if rotary is not None and rotary.max_position != self.max_model_len:
            rotary.resize(self.max_model_len)
            heap.trim()  # rows dropped (2 MiB of a table of 8,192 positions for SmolLM2) back to the system
        self.warm_up_kernels()

    def warm_up_kernels(self) -> None:
        """Build the prefill attention's Triton variants for the allocated caches now (Attention.warm_up_kernels;
        every layer shares them), so that no step of a run waits for a compile; timed in the log and shown in the
        Load panel's status."""
        layers = self.model.attention_layers()
        if self.device.type != "cuda" or not layers:
            return
        progress.report("compiling", "attention kernels")
        t0 = time.perf_counter()
        ran = layers[0].warm_up_kernels()
        torch.cuda.synchronize(self.device)
        if ran:
            log.info("prefill attention kernels ready in %.2f s (%s)", time.perf_counter() - t0, ", ".join(ran))

    def _allocate_kv_cache(self) -> None:
        if self.tapes is not None:
            self.tapes.reset()  # their recorded pointers are the old cache's
        attn0 = self.model.layers[0].self_attn.attn
        shape = (self.num_blocks, self.block_size, attn0.num_kv_heads, attn0.head_dim)
        fp8 = self.kv_cache_dtype != self.dtype
        for attn in self.model.attention_layers():
            attn.k_cache = torch.empty(shape, dtype=self.kv_cache_dtype, device=self.device)
            attn.v_cache = (torch.empty(shape, dtype=self.kv_cache_dtype, device=self.device)
                            if attn.cache_tensors == 2 else None)  # MLA: one latent cache (engine/layers/mla.py)
            if fp8:  # per-tensor scales: device tensors read by the kernels (no host sync; CUDA graphs capture
                # their addresses), kept across reallocations; 1.0 until the first step with a prefill sets them
                # from its keys and values (Attention._calibrate_scales), again after each allocation
                if attn.k_scale is None or attn.k_scale.device != self.device:
                    attn.k_scale = torch.ones(1, dtype=torch.float32, device=self.device)
                    attn.v_scale = torch.ones(1, dtype=torch.float32, device=self.device)
                else:
                    attn.k_scale.fill_(1.0)
                    attn.v_scale.fill_(1.0)
                attn.calibrate_scales = True
                attn.compute_dtype = self.dtype

    # -- per-request sampling state -----------------------------------------------------------
    def add_request(self, req: SequenceState) -> None:
        if req.params.seed is not None:
            self.generators[req.request_id] = torch.Generator(device=self.device).manual_seed(req.params.seed)

    def remove_request(self, request_id: str) -> None:
        self.generators.pop(request_id, None)
        self.penalties.release(request_id)
        self.pooling_state.pop(request_id, None)

    # -- one step -------------------------------------------------------------------------
    def prepare(self, sched: ScheduledStep, all_logits: bool = False
                ) -> tuple[StepInputs, list[SequenceState], list[PoolSpan]]:
        """The step's StepInputs (what TP workers receive), the requests that sample and the embedding requests'
        rows (engine/runner/inputs.py ``prepare_step``; per token in deterministic mode)."""
        return prepare_step(sched, self.block_size, self.deterministic, all_logits)

    def _tensors(self, inp: StepInputs) -> tuple[torch.Tensor, AttentionMetadata]:
        meta = self.attention.build(inp.seqs, self.block_size, self.device)
        return to_device(inp.token_ids, torch.long, self.device), meta

    @torch.inference_mode()
    def run(self, inp: StepInputs, on_hidden: Callable[[torch.Tensor], None] | None = None,
            fed: torch.Tensor | None = None) -> torch.Tensor | None:
        """Forward pass of one step on this rank; float32 logits at inp.logit_rows (all rows if None).
        Every TP rank runs this with the same inputs. ``on_hidden`` (rank 0) gets the final hidden states of
        every row (after the final norm), for pooling; such a step never replays a decode graph. ``fed`` (one
        process): the first input ids on the device, in place of inp.token_ids' placeholders (launch's feed)."""
        if self.tp.size > 1:
            return self.tp.guard(self._run, inp, on_hidden)
        return self._run(inp, on_hidden, fed)

    def _run(self, inp: StepInputs, on_hidden: Callable[[torch.Tensor], None] | None = None,
             fed: torch.Tensor | None = None) -> torch.Tensor | None:
        ops.set_batch_invariant(self.deterministic)  # process-wide: another engine here may differ
        if ((self.graphs is not None or self.tapes is not None) and inp.logit_rows and on_hidden is None
                and len(inp.seqs) == len(inp.token_ids) and not inp.prompt_rows):
            logits = self._run_graph(inp, fed)
            if logits is not None:
                return logits
        input_ids, meta = self._tensors(inp)
        if fed is not None:
            input_ids[:len(fed)] = fed
        hidden = self.model(input_ids, meta)
        if on_hidden is not None:
            on_hidden(hidden)
        if inp.prompt_rows:  # every rank: the LM head's all-gather is collective (rank 0's are taken)
            self.prompt_scores = score_rows(self.model, hidden, inp, self.model_config.vocab_size)
        if inp.logit_rows is not None:
            if not inp.logit_rows:
                return None
            hidden = select_rows(hidden, inp.logit_rows)
        return self.model.compute_logits(hidden).float()

    def _run_graph(self, inp: StepInputs, fed: torch.Tensor | None = None) -> torch.Tensor | None:
        """A decode step (one token per sequence) by graph replay; None for any other step, or a batch past the
        largest bucket."""
        seqs = inp.seqs
        if any(s.query_len != 1 for s in seqs):
            return None
        if self.graphs is not None:
            logits = self.graphs.run(inp.token_ids, seqs, fed)
        else:
            logits = self.tapes.run(inp.token_ids, seqs)  # the CPU: launch put the fed ids into the list
        if logits is None or len(inp.logit_rows) == len(seqs):
            return logits
        # a one-token prefill chunk short of its prompt's end samples nothing
        return select_rows(logits, inp.logit_rows)

    def execute(self, sched: ScheduledStep) -> tuple[list[SequenceState], list[int], list[TokenLogprobs | None],
                                                     list[tuple[SequenceState, torch.Tensor]]]:
        """Run one step and wait for it: ``collect(launch(sched))``."""
        return self.collect(self.launch(sched))

    def launch(self, sched: ScheduledStep, feed: "Launched | None" = None) -> "Launched":
        """Queue one step (forward and sampler) without waiting for it (no host synchronisation: the caller's host
        work beside the device starts when this returns); ``collect`` waits. Nothing here reads the step's
        ScheduledStep once this returns (the core then advances the requests' computed tokens).

        ``feed``: the step before, still in flight, whose sampled tokens are this step's input ids (a decode step
        launched ahead, engine/core/core.py): every sequence of ``sched`` sampled there, its token not yet on the
        host (``token_at`` has no such index, so prepare stages a 0 that the device copy then replaces), one more
        output token than its request lists."""
        if feed is not None and self.on_step is not None:
            raise RuntimeError("a step launched ahead needs every rank on this process (tensor parallelism is not)")
        inp, reqs, pools = self.prepare(sched)
        fed = None
        if feed is not None:
            row_of = {id(r): i for i, r in enumerate(feed.reqs)}
            rows = [row_of[id(s.request)] for s in sched.scheduled]
            if self.device.type == "cpu":  # the tokens are already computed: no device copy to stage
                inp.token_ids[:len(rows)] = feed.sampled.tokens[rows].tolist()
            else:
                fed = feed.sampled.tokens.index_select(0, to_device(rows, torch.long, self.device))
        if self.on_step is not None:
            self.on_step(inp)
        pooled: list[tuple[SequenceState, torch.Tensor]] = []
        logits = self.run(inp, (lambda hidden: pooled.extend(self._pool(hidden, pools))) if pools else None, fed)
        if not reqs:
            return Launched([], None, pooled)
        gens = [self.generators.get(r.request_id) for r in reqs]
        if inp.drafts:  # speculative decoding: some requests verify proposals (engine/runner/speculative.py)
            verified = verify_step(self.sampler, logits, reqs, inp.drafts, gens, lambda rows, idx: self._sample(
                rows, [reqs[i] for i in idx], [gens[i] for i in idx], 0))
            for r, d in zip(reqs, inp.drafts):
                if d and has_penalty(r.params):  # counted from its host lists again at its next plain step
                    self.penalties.release(r.request_id)
            return Launched(reqs, verified, pooled)
        return Launched(reqs, self._sample(logits, reqs, gens, 1 if feed is not None else 0), pooled)

    def _sample(self, logits: torch.Tensor, reqs: list[SequenceState], gens: list, pending: int) -> Sampled:
        """One token for each request (row i of the logits for reqs[i])."""
        md = sampling_metadata(reqs, gens, pending=pending)
        penalised = [i for i, r in enumerate(reqs) if has_penalty(r.params)]
        if penalised:  # their token counts live on the device: gathered here, the new tokens counted below
            state_rows = self.penalties.rows([reqs[i] for i in penalised], logits.shape[-1])
            md.penalty_counts, md.penalty_prompt = self.penalties.gather(state_rows)
        sampled = self.sampler.sample(logits, md)
        if penalised:
            self.penalties.record(state_rows, sampled.tokens.index_select(
                0, to_device(penalised, torch.long, self.device)))
        return sampled

    def take_prompt_scores(self) -> PromptScores | None:
        """The prompt logprobs of the step just launched (engine/runner/prompt_logprobs.py), on the device; None
        where it scored no prompt. Taken once, right after ``launch``."""
        scores, self.prompt_scores = self.prompt_scores, None
        return scores

    @staticmethod
    def prompt_logprobs(scores: PromptScores | None) -> list[tuple[str, int, list[TokenLogprobs]]]:
        """A launched step's prompt scores on the host (call after ``collect``): (request id, first position scored,
        TokenLogprobs per position) per request."""
        return [] if scores is None else prompt_scores_to_host(scores)

    @staticmethod
    def collect(launched: "Launched") -> tuple[list[SequenceState], list[int], list[TokenLogprobs | None],
                                               list[tuple[SequenceState, torch.Tensor]]]:
        """A launched step's requests that sampled (the step's own objects, in step order), their tokens and
        logprobs (waiting for their copy to the host), and the embedding requests whose prompt the step finished,
        with their pooled vectors (float32, on the CPU)."""
        if launched.sampled is None:
            return [], [], [], launched.pooled
        tokens, lps = launched.sampled.result()
        return launched.reqs, tokens, lps, launched.pooled

    def _pool(self, hidden: torch.Tensor, pools: list[PoolSpan]) -> list[tuple[SequenceState, torch.Tensor]]:
        """Pool each embedding request's rows of this step into its running state (float32: a mean summed
        over chunks keeps its precision); the requests whose last prompt chunk this was get their vector,
        mean-divided and L2-normalised as their Pooling says. A chunk from token 0 starts afresh (a request
        preempted and recomputed pools again)."""
        done = []
        for p in pools:
            req, mode = p.request, p.request.pooling.mode
            rows = hidden[p.row:p.row + p.rows].float()
            acc = self.pooling_state.pop(req.request_id, None) if p.start else None
            if mode == "mean":
                acc = rows.sum(0) if acc is None else acc + rows.sum(0)
            elif mode == "cls":
                acc = rows[0].clone() if acc is None else acc  # a copy: the step's hidden states are freed
            else:  # last: the final chunk's last row
                acc = rows[-1]
            if p.start + p.rows < req.num_tokens:
                if mode != "last":
                    self.pooling_state[req.request_id] = acc
                continue
            if mode == "mean":
                acc = acc / req.num_tokens
            if req.pooling.normalize:
                acc = torch.nn.functional.normalize(acc, dim=0)
            done.append((req, acc.cpu()))
        return done

    def all_logits(self, sched: ScheduledStep) -> torch.Tensor:
        """Float32 logits at every position the step computes (scoring, perplexity, tests)."""
        inp, _, _ = self.prepare(sched, all_logits=True)
        if self.on_step is not None:
            self.on_step(inp)
        return self.run(inp)


@dataclass
class Launched:
    """A step queued by ModelRunner.launch: the requests that sample, their Sampled tokens (None: nothing samples)
    and the embeddings the step finished."""

    reqs: list[SequenceState]
    sampled: "Sampled | None"
    pooled: list[tuple[SequenceState, torch.Tensor]]


