"""The engine core: requests in, one scheduler step at a time, deltas out.

add_request (template, tokenize, validate) -> step() [scheduler plan -> runner.launch -> scheduler.launched ->
runner.collect -> append tokens, detokenize, stop checks, scheduler.finish] -> RequestDelta list. The scheduler
owns the request state (queues, blocks, computed tokens, the step launched ahead); the core is the step loop and
the output processing.

Embedding requests (``add_request(..., embed=True)``) take the same path as prompts: scheduled in prefill
chunks beside generation, their final hidden states pooled by the runner (engine.loader.pooling says how), then
finished at once with the vector on their only delta; their blocks are freed like any finished request's."""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from dataclasses import dataclass

from engine.config import EngineConfig
from engine.core.kv_cache import BlockManager
from engine.core.output import Tracked, check_stop, finished_delta, take_text
from engine.core.request import Request
from engine.core.scheduler import Scheduler, SchedulerOutput
from engine.errors import InvalidRequestError, PromptTooLongError
from engine.core.embedding import check_embedding_input
from engine.wire import CommStepStats, EngineStats, RequestDelta, StepStats, TokenLogprobs
from engine.sampling_params import SamplingParams

log = logging.getLogger(__name__)

DEFAULT_MAX_MODEL_LEN = 8192


@dataclass
class _InFlight:
    """A step launched and not yet completed: its plan and the runner's handle (model_runner.Launched)."""

    sched: SchedulerOutput
    launched: object
    t0: float  # when it was scheduled
    prompt_scores: object = None  # its prompt logprobs on the device (ModelRunner.take_prompt_scores)


class EngineCore:
    def __init__(self, config: EngineConfig, checkpoint=None, tp=None, comm_config=None):
        from engine.loader import load_checkpoint
        from engine.loader.pooling import pooling_for
        from engine.parallel.context import SINGLE
        from engine.runner.model_runner import ModelRunner
        from engine.tokenizer import IncrementalDetokenizer

        self.config = config
        self.checkpoint = checkpoint or load_checkpoint(config.model)
        mc = self.checkpoint.config
        self.model_config = mc
        self.tokenizer = self.checkpoint.tokenizer
        self._detok_cls = IncrementalDetokenizer
        max_len = config.max_model_len or min(mc.max_position_embeddings, DEFAULT_MAX_MODEL_LEN)
        if mc.sliding_window and max_len > mc.sliding_window:
            # attention here is full; within the window that is exactly what the model computes
            log.warning("context length capped at the sliding window of %d tokens", mc.sliding_window)
            max_len = mc.sliding_window
        self.executor = None  # tensor parallelism: rank 0 lives here, the workers in their processes
        if tp is None and config.tensor_parallel_size > 1:
            from engine.executor.tp_executor import TPExecutor

            self.executor = TPExecutor(config, self.checkpoint, max_len, comm_config=comm_config)
            tp = self.executor.tp
        try:
            self.runner = ModelRunner(config, mc, self.checkpoint.weights, max_len,
                                      self.checkpoint.config.torch_dtype, tp or SINGLE,
                                      defer_kv=self.executor is not None)
            if self.executor is not None:
                self.executor.attach(self.runner)
        except BaseException:
            if self.executor is not None:
                self.executor.shutdown()
            raise
        if self.runner.max_model_len < max_len:  # the runner capped it at what its KV cache holds
            log.warning("KV cache holds %d tokens: context length capped from %d", self.runner.max_model_len,
                        max_len)
        self.max_model_len = self.runner.max_model_len
        self.blocks = BlockManager(self.runner.num_blocks, self.runner.block_size, config.enable_prefix_caching,
                                   salt=str(self.checkpoint.path))
        self.scheduler = Scheduler(self.blocks, config.max_num_seqs, config.max_num_batched_tokens,
                                   self.max_model_len, exact_hits=config.deterministic)
        self.eos_token_ids = frozenset(self.tokenizer.eos_token_ids) | frozenset(mc.eos_token_ids)
        self.requests: dict[str, Tracked] = {}
        self._prompt_logprobs: dict[str, list] = {}  # per request asking: its prompt's logprobs until its first delta
        self._grammars = None  # GrammarCache, built on the first structured request
        ckpt_path = getattr(self.checkpoint, "path", None)
        self.pooling = pooling_for(ckpt_path if ckpt_path is not None and ckpt_path.is_dir() else None,
                                   config.pooling)
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.recent_steps: deque[StepStats] = deque(maxlen=256)
        self.recent_comm_steps: deque[CommStepStats] = deque(maxlen=256)
        # speculative decoding (--speculative-config, engine/spec): proposals verified in the normal batch; its
        # steps wait for their acceptance on the host, so no step is launched ahead
        self._in_flight: _InFlight | None = None  # the step launched ahead (the scheduler's ``ahead``), on the device
        self.spec = None
        self.set_speculative(getattr(config, "speculative_config", None))
        self._last_step_end = 0.0

    def set_speculative(self, text: str | None) -> None:
        """Speculative decoding on (--speculative-config's JSON) or off (None), while no request runs: start-up,
        and ``kestrel bench offline --speculative`` comparing both on one loaded model."""
        from engine.spec.decoder import build_speculative

        if self.has_unfinished():
            raise RuntimeError("speculative decoding is switched between requests, not while they run")
        self.spec = build_speculative(text, target=self) if text else None
        self.async_scheduling = (async_scheduling_enabled(self.config.async_scheduling, self.runner)
                                 and self.spec is None)

    @property
    def num_steps_ahead(self) -> int:
        """Steps launched before the one that samples their input tokens completed."""
        return self.scheduler.num_steps_ahead

    # -- requests -----------------------------------------------------------------------
    def tokenize_prompt(self, prompt=None, messages=None, add_special_tokens: bool = True) -> list[int]:
        if messages is not None:
            return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt, add_special_tokens=add_special_tokens)
        if isinstance(prompt, (list, tuple)) and all(isinstance(t, int) for t in prompt):
            return list(prompt)
        raise InvalidRequestError("The prompt must be a string, a list of token ids, or chat messages.",
                                  param="prompt")

    def add_request(self, request_id: str, prompt=None, params: SamplingParams | None = None, *,
                    messages=None, prompt_token_ids: list[int] | None = None, embed: bool = False) -> Request:
        """Queue a generation request, or with ``embed`` an embedding request (``params`` unused)."""
        params = params or SamplingParams()
        if request_id in self.requests:
            raise InvalidRequestError(f"A request with id {request_id!r} is already running.", param="request_id")
        ids = prompt_token_ids if prompt_token_ids is not None else self.tokenize_prompt(prompt, messages)
        if embed:
            return self._add_embedding(request_id, list(ids), params)
        self.validate_prompt(ids, params)
        grammar = self._grammar(params) if params.structured is not None else None
        req = Request(request_id, list(ids), params, eos_token_ids=self.eos_token_ids,
                      prompt=prompt if isinstance(prompt, str) else None, grammar=grammar)
        detok = self._detok_cls(self.tokenizer, req.prompt_token_ids, skip_special_tokens=params.skip_special_tokens)
        self.requests[request_id] = Tracked(req, detok, stop_max=max((len(s) for s in params.stop), default=0))
        self.runner.add_request(req)
        self.scheduler.add(req)
        return req

    def _add_embedding(self, request_id: str, ids: list[int], params: SamplingParams) -> Request:
        if self.pooling.unsupported:
            raise InvalidRequestError(f"This model cannot serve embeddings: {self.pooling.unsupported}.",
                                      param="input")
        check_embedding_input(ids, self.model_config.vocab_size, self.max_model_len, "input")
        req = Request(request_id, ids, params, pooling=self.pooling)
        self.requests[request_id] = Tracked(req, None)
        self.runner.add_request(req)
        self.scheduler.add(req)
        return req

    def _grammar(self, params: SamplingParams):
        """A fresh matcher of the request's grammar (compiled once per grammar text); InvalidRequestError for a
        schema, regex or choice list the compiler refuses."""
        if self._grammars is None:
            from engine.tokenizer.grammar import GrammarCache

            self._grammars = GrammarCache(self.tokenizer, self.model_config.vocab_size, self.eos_token_ids)
        return self._grammars.matcher(params.structured)

    def validate_prompt(self, ids: list[int], params: SamplingParams) -> None:
        if not ids:
            raise InvalidRequestError("The prompt is empty.", param="prompt")
        vocab = self.model_config.vocab_size
        if min(ids) < 0 or max(ids) >= vocab:  # C-speed scans; the loop below only names the culprit
            bad = next(t for t in ids if not 0 <= t < vocab)
            raise InvalidRequestError(f"Token id {bad} is out of the vocabulary (0..{vocab - 1}).", param="prompt")
        if len(ids) >= self.max_model_len:
            raise PromptTooLongError(len(ids), self.max_model_len)
        if params.max_tokens is not None and len(ids) + params.max_tokens > self.max_model_len:
            raise PromptTooLongError(len(ids), self.max_model_len, params.max_tokens)

    def abort(self, request_ids) -> list[RequestDelta]:
        out = []
        for rid in ([request_ids] if isinstance(request_ids, str) else request_ids):
            tr = self.requests.get(rid)
            if tr is not None and not tr.request.is_finished:
                out.append(self._finish(tr, "abort", None, []))
        self._drop_finished_flight()
        return out

    def has_unfinished(self) -> bool:
        return self._in_flight is not None or self.scheduler.has_unfinished()

    # -- the step -----------------------------------------------------------------------
    def step(self) -> list[RequestDelta]:
        """One step's deltas. With a step launched ahead (async scheduling), the step that returns is the one
        before the step left in flight: see ``_launch_ahead``."""
        prev = self._in_flight
        if prev is None:
            if not self.scheduler.has_unfinished():
                return []
            t0 = time.monotonic()
            if self.spec is not None:
                self.spec.propose(self.scheduler.running, self.max_model_len)
            sched = self.scheduler.schedule()
            if not sched.scheduled:
                return []
            if self.spec is not None:  # a draft model processes the step's prompt chunks with the target
                self.spec.prefill(sched.scheduled)
            prev = self._launch(sched, t0)
        self._in_flight = self._launch_ahead(prev) if self.async_scheduling else None
        deltas = self._complete(prev)
        self._drop_finished_flight()
        return deltas

    def _launch(self, sched: SchedulerOutput, t0: float, feed=None) -> _InFlight:
        """Queue a plan on the device (``feed``: the step in flight whose sampled tokens are its input ids) and
        tell the scheduler, while the device runs it."""
        fl = _InFlight(sched, self.runner.launch(sched, feed), t0)
        fl.prompt_scores = self.runner.take_prompt_scores()
        self.scheduler.launched(sched)
        return fl

    def _launch_ahead(self, prev: _InFlight) -> _InFlight | None:
        """Async scheduling: while step N (``prev``) runs on the device, queue the scheduler's plan of N+1
        (``Scheduler.schedule_ahead``: a decode of the token N samples, fed on the device), and only then wait for
        N's tokens, so that their detokenisation, stop checks and deltas, and the next schedule, run beside N+1.
        None where N+1 cannot go ahead (N then completes and the next step is scheduled as usual)."""
        sched = self.scheduler.schedule_ahead(prev.launched.reqs, bool(prev.launched.pooled))
        return None if sched is None else self._launch(sched, time.monotonic(), prev.launched)

    def _drop_finished_flight(self) -> None:
        """Forget a step in flight none of whose requests is still running (all stopped or aborted since its
        launch): nothing of it would be kept, so nothing waits for it (its device work finishes on its own,
        before any later step's on the same stream)."""
        if self._in_flight is not None and self.scheduler.drop_finished_ahead():
            self._in_flight = None

    def _complete(self, fl: "_InFlight") -> list[RequestDelta]:
        """Wait for a launched step's tokens and turn them into deltas (the requests it advanced; the tokens of
        requests finished or aborted since its launch are dropped)."""
        sched = fl.sched
        reqs, tokens, lps, pooled = self.runner.collect(fl.launched)
        if fl.prompt_scores is not None:
            self._score_prompts(fl.prompt_scores)
        n_prefill = n_decode = 0
        for s in sched.scheduled:
            if (s.num_new_tokens == 1 or s.spec) and (s.pending or s.request.output_token_ids):
                n_decode += 1
            else:
                n_prefill += s.num_new_tokens
        self.prompt_tokens_total += n_prefill
        now = time.monotonic()
        deltas = []
        live = self.requests
        for req, tok, lp in zip(reqs, tokens, lps):
            tr = live.get(req.request_id)
            if tr is None or tr.request is not req or req.is_finished:
                continue  # finished or aborted while this step ran
            if isinstance(tok, list):  # a verify step (speculative decoding): its emitted tokens
                deltas.append(self._append(tr, tok, lp, now))
            else:
                deltas.append(self._append(tr, [tok], [lp] if lp is not None else None, now))
        if self.spec is not None:
            self._settle_speculative(sched, reqs, tokens)
        self.scheduler.update_from_output(reqs)
        for req, vec in pooled:
            delta = self._finish(self.requests[req.request_id], "stop", None, [])
            delta.embedding = vec.numpy().astype("<f4").tobytes()
            deltas.append(delta)
        start = max(fl.t0, self._last_step_end)  # steps in flight together: each counts from the one before
        self._last_step_end = now
        sc = self.scheduler
        self.recent_steps.append(StepStats(now, now - start, sc.num_running, sc.num_waiting, n_prefill, n_decode,
                                           sc.blocks.usage))
        if self.spec is not None:  # the cost gate times whole steps (engine/spec/decoder.py)
            self.spec.step_done(n_prefill, n_decode)
        if self.executor is not None:
            d = self.executor.comm.stats.step_delta()
            self.recent_comm_steps.append(CommStepStats(now, d.calls, d.link_bytes, d.payload_bytes, d.seconds))
        deltas = [d for d in deltas if d is not None]
        if self._prompt_logprobs:
            self._attach_prompt_logprobs(deltas)
        return deltas

    def _score_prompts(self, scores) -> None:
        """A step's prompt logprobs into each request's list (one entry per prompt token, the first with no
        logprob: NaN), by position, so a prompt recomputed after a preemption overwrites rather than repeats."""
        for rid, first, lps in self.runner.prompt_logprobs(scores):
            tr = self.requests.get(rid)
            if tr is None or tr.request.output_token_ids:
                continue  # finished, or already delivered
            ids = tr.request.prompt_token_ids
            held = self._prompt_logprobs.get(rid)
            if held is None:
                held = self._prompt_logprobs[rid] = [TokenLogprobs(ids[0], float("nan"))] + [None] * (len(ids) - 1)
            held[first:first + len(lps)] = lps

    def _attach_prompt_logprobs(self, deltas: list[RequestDelta]) -> None:
        """A request's prompt logprobs ride on its first delta with tokens."""
        for d in deltas:
            if d.token_ids and d.request_id in self._prompt_logprobs:
                d.prompt_logprobs = self._prompt_logprobs.pop(d.request_id)

    def _append(self, tr: Tracked, toks: list[int], lps: list | None, now: float) -> RequestDelta | None:
        """Output processing of a step's tokens of one request (one, or a verify step's accepted ones; engine/core/
        output.py): their text, the stop checks after each, one delta; a token that finishes the request drops
        the ones after it, and the request leaves the scheduler and the runner."""
        req = tr.request
        if req.timings.first_token is None:
            req.timings.first_token = now
        req.timings.last_token = now
        for n, tok in enumerate(toks, 1):
            req.output_token_ids.append(tok)
            self.generation_tokens_total += 1
            tr.text += tr.detok.add(tok)
            reason, stop = check_stop(tr, tok, self.max_model_len)
            if reason is not None:
                if not isinstance(stop, str):  # text cut at a stop string keeps no held-back tail
                    tr.text += tr.detok.flush()
                return self._finish(tr, reason, stop, toks[:n], lps[:n] if lps is not None else None)
        return RequestDelta(req.request_id, toks, take_text(tr), lps, num_prompt_tokens=req.num_prompt_tokens,
                            num_cached_tokens=req.num_cached_tokens, num_output_tokens=len(req.output_token_ids))

    def _settle_speculative(self, sched: SchedulerOutput, reqs, tokens) -> None:
        """After a step's tokens are appended: each verifying request's computed tokens back to its accepted ones
        (Scheduler.settle_speculative) and the proposer's counts and back-off."""
        emitted = {id(r): len(t) if isinstance(t, list) else 1 for r, t in zip(reqs, tokens)}
        for s in sched.scheduled:
            n = emitted.get(id(s.request), 0) if s.spec else 0
            if not n:
                continue
            live = not s.request.is_finished  # one that this step finished gave its blocks back, and still counts
            if live:
                self.scheduler.settle_speculative(s, n)
            self.spec.settle(s.request.request_id, len(s.spec), n, track=live)

    def _finish(self, tr: Tracked, reason: str, stop, toks: list[int], lps=None) -> RequestDelta:
        req = tr.request
        now = time.monotonic()
        req.timings.finished = now
        req.finish_reason, req.stop_reason = reason, stop
        self.scheduler.finish(req)
        self.runner.remove_request(req.request_id)
        if reason == "abort":
            self._prompt_logprobs.pop(req.request_id, None)
        if self.spec is not None:
            self.spec.remove(req.request_id)
        del self.requests[req.request_id]
        return finished_delta(tr, toks, lps, now)

    def score(self, token_ids: list[int]) -> "torch.Tensor":
        """Float32 logits [len(token_ids), vocab] of a whole sequence (prompt scoring, perplexity).
        Runs in prefill chunks on blocks borrowed from the cache; call it between steps."""
        import torch

        self.validate_prompt(token_ids, SamplingParams(max_tokens=None))
        req = Request(f"score-{time.monotonic_ns()}", list(token_ids), SamplingParams(max_tokens=1))
        with contextlib.closing(self.scheduler.scoring_steps(req, self.config.max_num_batched_tokens)) as steps:
            return torch.cat([self.runner.all_logits(sched) for sched in steps])

    def shutdown(self) -> None:
        """Stop the tensor-parallel workers (no-op at TP=1). Also done at garbage collection and exit."""
        self._in_flight = None
        if self.executor is not None:
            self.executor.shutdown()

    # -- stats --------------------------------------------------------------------------
    def stats(self, recent: int = 32) -> EngineStats:
        sc = self.scheduler
        b = sc.blocks
        st = EngineStats(
            num_running=sc.num_running, num_waiting=sc.num_waiting,
            kv_usage=b.usage, num_kv_blocks=b.num_blocks, num_free_blocks=b.num_free_blocks,
            prefix_cache_hit_rate=(b.prefix_hits / b.prefix_queries) if b.prefix_queries else 0.0,
            prompt_tokens_total=self.prompt_tokens_total, generation_tokens_total=self.generation_tokens_total,
            num_preemptions=sc.num_preemptions, recent_steps=list(self.recent_steps)[-recent:])
        if self.spec is not None:
            c = self.spec.counts
            st.spec_method = self.spec.config.describe()
            st.spec_proposed_total, st.spec_accepted_total = c.proposed, c.accepted
            st.spec_verify_steps_total, st.spec_emitted_total = c.verify_steps, c.emitted
        if self.executor is not None:
            c = self.executor.comm_stats()
            st.tp_size, st.comm_strategy = c["tp_size"], c["comm_strategy"]
            st.comm_calls_total, st.comm_bytes_total = c["calls"], c["link_bytes"]
            st.comm_payload_bytes_total, st.comm_time_total = c["payload_bytes"], c["seconds"]
            st.comm_by_strategy, st.comm_table = c["by_strategy"], c["table"]
            st.recent_comm_steps = list(self.recent_comm_steps)[-recent:]
        return st



def async_scheduling_enabled(mode: str, runner) -> bool:
    """--async-scheduling: auto launches decode steps ahead on a GPU (where the host's work per step would
    otherwise leave the device idle), on anywhere a single process runs the model, off never."""
    if mode == "off" or runner.tp.size > 1:
        return False
    return mode == "on" or runner.device.type == "cuda"
