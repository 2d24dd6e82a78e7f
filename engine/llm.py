"""Offline API: LLM(model=...).generate(prompts, SamplingParams), batched, plus a streaming variant."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

from engine.config import EngineConfig
from engine.core.core import EngineCore
from engine.outputs import CompletionOutput, EmbeddingOutput, RequestOutput
from engine.wire import RequestDelta
from engine.sampling_params import SamplingParams, fan_out

_ids = itertools.count()


class LLM:
    def __init__(self, model: str | None = None, *, comm_config=None, **options):
        """``options``: EngineConfig's fields; ``comm_config``: a tensor-parallel engine's CommConfig defaults
        (engine/parallel/comm/config.py; default: the measured ones)."""
        self.config = EngineConfig(model=model, **options)
        self.core = EngineCore(self.config, comm_config=comm_config)
        self.tokenizer = self.core.tokenizer

    @classmethod
    def from_cli_args(cls, args) -> "LLM":
        """Load the model that parsed command-line flags name: ``args`` from a parser that
        EngineConfig.add_cli_args filled (``kestrel generate``, ``chat``, the benchmarks)."""
        cfg = EngineConfig.from_cli_args(args)
        opts = {k: v for k, v in vars(cfg).items() if k != "model"}
        return cls(cfg.model, **opts)

    def close(self) -> None:
        """Stop tensor-parallel workers now (otherwise at garbage collection or exit)."""
        self.core.shutdown()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _submit(self, prompt, params: SamplingParams, messages=None) -> RequestOutput:
        rid = f"llm-{next(_ids)}"
        ids = self.core.tokenize_prompt(prompt, messages)
        children = fan_out(params)
        out = RequestOutput(rid, prompt if isinstance(prompt, str) else None, ids,
                            [CompletionOutput(i) for i in range(len(children))])
        for i, p in enumerate(children):
            self.core.add_request(f"{rid}#{i}", prompt, p, prompt_token_ids=ids)
        return out

    def _run(self, outputs: list[RequestOutput]) -> list[RequestOutput]:
        by_id = {f"{o.request_id}#{c.index}": (o, c) for o in outputs for c in o.outputs}
        pending = set(by_id)
        try:
            while pending:
                for d in self.core.step():
                    o, c = by_id[d.request_id]
                    c.add(d)
                    o.num_cached_tokens = max(o.num_cached_tokens, d.num_cached_tokens)
                    if d.finished:
                        pending.discard(d.request_id)
        finally:
            if pending:
                self.core.abort(list(pending))
        for o in outputs:
            o.finished = True
        return outputs

    def generate(self, prompts: str | Sequence[str] | Sequence[list[int]],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None) -> list[RequestOutput]:
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = sampling_params or SamplingParams()
        plist = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
        if len(plist) != len(prompts):
            raise ValueError("one SamplingParams per prompt, or one for all")
        return self._run([self._submit(p, sp) for p, sp in zip(prompts, plist)])

    def chat(self, conversations, sampling_params: SamplingParams | None = None) -> list[RequestOutput]:
        """One conversation (a list of {"role", "content"} dicts) or a list of them."""
        if conversations and isinstance(conversations[0], dict):
            conversations = [conversations]
        params = sampling_params or SamplingParams()
        return self._run([self._submit(None, params, messages=m) for m in conversations])

    def embed(self, inputs: str | Sequence[str] | Sequence[list[int]]) -> list[list[float]]:
        """The embedding of each input (a text or token ids), batched through the engine like prompts: pooled
        and normalised as the model's sentence-transformers configuration (or ``pooling=``) says."""
        if isinstance(inputs, str) or (inputs and isinstance(inputs[0], int)):
            inputs = [inputs]
        rids = [f"emb-{next(_ids)}" for _ in inputs]
        found: dict[str, EmbeddingOutput] = {}
        try:
            for rid, x in zip(rids, inputs):
                ids = self.core.tokenize_prompt(x)
                self.core.add_request(rid, None, SamplingParams(max_tokens=1), prompt_token_ids=ids, embed=True)
            while len(found) < len(rids):
                for d in self.core.step():
                    if d.embedding is not None:
                        found[d.request_id] = EmbeddingOutput(d.embedding, d.num_prompt_tokens)
        finally:
            self.core.abort([r for r in rids if r in self.core.requests])
        return [found[r].floats() for r in rids]

    def stream(self, prompt=None, sampling_params: SamplingParams | None = None, *, messages=None
               ) -> Iterator[RequestDelta]:
        """Streaming variant for one prompt (n must be 1): yields each step's delta as it comes."""
        params = sampling_params or SamplingParams()
        if params.n != 1:
            raise ValueError("stream() takes n=1; use generate() for n > 1")
        out = self._submit(prompt, params, messages)
        rid = f"{out.request_id}#0"
        try:
            while True:
                for d in self.core.step():
                    if d.request_id == rid:
                        yield d
                        if d.finished:
                            return
        finally:
            if rid in self.core.requests:
                self.core.abort(rid)
