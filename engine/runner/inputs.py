"""A scheduled step as the runner's inputs, in plain Python: the tokens and sequence spans of the forward pass
(what TP workers receive), the rows that sample and their sampling metadata, and the embedding requests' rows."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.layers.attention import SeqSpan
from engine.layers.penalties import has_penalty
from engine.layers.sampling_metadata import SamplingMetadata
from engine.ops.transfer import to_device
from engine.runner.step import ScheduledStep, SequenceState


@dataclass
class StepInputs:
    """One step, in plain Python so it pickles cheaply to tensor-parallel workers. The tokens' positions and cache
    slots follow from the sequences (AttentionMetadata.build computes them on the device)."""

    token_ids: list[int] = field(default_factory=list)
    seqs: list[SeqSpan] = field(default_factory=list)  # decodes first, then prefill chunks
    logit_rows: list[int] | None = field(default_factory=list)  # None: logits at every position
    # speculative decoding: each sampling request's proposed tokens (aligned with prepare_step's requests; its
    # len + 1 logit rows are consecutive); empty where no request of the step verifies proposals
    drafts: list = field(default_factory=list)
    # prompt logprobs (score_prompt): the rows whose logits score the next prompt token, those tokens, the most top
    # logprobs a request of the step asks for, and per request (id, first position scored, positions, its top count)
    prompt_rows: list[int] = field(default_factory=list)
    prompt_targets: list[int] = field(default_factory=list)
    prompt_top: int = 0
    prompt_spans: list[tuple[str, int, int, int]] = field(default_factory=list)


@dataclass
class PoolSpan:
    """An embedding request's rows in one step: ``rows`` hidden states from row ``row``, its tokens from
    ``start`` (rank 0 pools them; the workers never see this)."""

    request: SequenceState
    row: int
    rows: int
    start: int


def prepare_step(sched: ScheduledStep, block_size: int, per_token: bool = False, all_logits: bool = False
                 ) -> tuple[StepInputs, list[SequenceState], list[PoolSpan]]:
    """Plain-Python description of the step (what TP workers receive), the requests that sample and the
    rows of the embedding requests (which never sample).

    ``per_token`` (deterministic mode): every token of a prefill chunk becomes a span of its own (query length 1, its own
    context), so attention computes each query row with the paged decode kernel, as a decode would: the
    same bits whatever the chunking, the prefix-cache hits and the other sequences of the step. The spans
    of a chunk share one block tuple (the chunk's; a span reads only its context's blocks)."""
    bs = block_size
    inp = StepInputs()
    sample_reqs: list[SequenceState] = []
    pools: list[PoolSpan] = []
    token_ids, seqs, logit_rows = inp.token_ids, inp.seqs, inp.logit_rows
    drafts: list = []
    for s in sched.scheduled:  # once per running request and step: kept lean
        req, n = s.request, s.num_new_tokens
        start = req.num_computed_tokens
        q0 = len(token_ids)
        spec = s.spec
        if n == 1:  # past the list's end: a token still on the device (launch's feed), staged as 0
            token_ids.append(req.token_at(start) if start < req.num_tokens else 0)
        elif spec:  # its last token and its proposals
            token_ids.append(req.token_at(start))
            token_ids.extend(spec)
        else:
            token_ids.extend(req.all_token_ids[start:start + n])
        ctx = start + n
        ids = req.block_ids
        nb = -(-ctx // bs)
        blocks = tuple(ids) if nb == len(ids) else tuple(ids[:nb])
        if (per_token or spec) and n > 1:  # a verify span too: each row a decode's (the paged decode kernel,
            # and a step of verify and decode rows only replays a decode tape / CUDA graph bucket). The rows are
            # consecutive with one block tuple, so the CPU kernel reads their cache once (csrc/cpu/dispatch.cpp spans)
            seqs.extend(SeqSpan(q0 + i, 1, start + i + 1, blocks) for i in range(n))
        else:
            seqs.append(SeqSpan(q0, n, ctx, blocks))
        if req.params.prompt_logprobs is not None:
            score_prompt(inp, req, q0, start, n)
        if getattr(req, "pooling", None) is not None:
            pools.append(PoolSpan(req, q0, n, start))
        elif s.samples:
            if spec:  # every proposal's row and the one after them: the verifier's
                logit_rows.extend(range(q0 + n - 1 - len(spec), q0 + n))
            else:
                logit_rows.append(q0 + n - 1)
            sample_reqs.append(req)
            drafts.append(spec)
    if any(drafts):
        inp.drafts = drafts
    if all_logits:
        inp.logit_rows = None
    return inp, sample_reqs, pools


def score_prompt(inp: StepInputs, req: SequenceState, q0: int, start: int, n: int) -> None:
    """A chunk's rows (from row ``q0``, positions ``start`` .. ``start + n``) whose logits score the prompt's next
    token, into ``inp``: every position before the prompt's last (whose logits sample the first output token)."""
    prompt = req.prompt_token_ids
    end = min(start + n, len(prompt) - 1)
    if end <= start:
        return
    inp.prompt_rows.extend(range(q0, q0 + end - start))
    inp.prompt_targets.extend(prompt[start + 1:end + 1])
    k = req.params.prompt_logprobs
    inp.prompt_spans.append((req.request_id, start + 1, end - start, k))
    inp.prompt_top = max(inp.prompt_top, k)


def select_rows(hidden: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """hidden[rows] without a host synchronisation: a slice where the rows are consecutive, else an index that
    goes up asynchronously (indexing with a Python list would copy it from pageable memory and wait for the GPU)."""
    first = rows[0]
    if rows[-1] - first == len(rows) - 1 and all(r == first + i for i, r in enumerate(rows)):
        return hidden[first:first + len(rows)]
    return hidden.index_select(0, to_device(rows, torch.long, hidden.device))


def sampling_metadata(reqs: list[SequenceState], generators: list[torch.Generator | None] | None = None,
                      pending: int = 0) -> SamplingMetadata:
    """What the sampler needs of each sampling request, row i for reqs[i]: its params, the token histories its
    penalties read (only where a penalty applies; the requests' own lists, so use it within the step; the runner
    replaces them by its device counts), its
    output count, its eos ids, its generator (None: the sampler's default) and, for the requests with a grammar
    (structured output), their allowed-token bitmask. ``pending``: output tokens each request has beyond its list
    (a step launched ahead of the one that samples them; such requests have no penalty or grammar)."""
    grammars = [(i, g) for i, g in enumerate(getattr(r, "grammar", None) for r in reqs) if g is not None]
    bitmask = None
    if grammars:
        from engine.tokenizer.grammar import fill_bitmask

        bitmask = fill_bitmask([g for _, g in grammars])
    return SamplingMetadata(
        params=[r.params for r in reqs],
        prompt_token_ids=[r.prompt_token_ids if has_penalty(r.params) else () for r in reqs],
        output_token_ids=[r.output_token_ids if has_penalty(r.params) else () for r in reqs],
        num_output_tokens=[len(r.output_token_ids) + pending for r in reqs],
        eos_token_ids=[r.eos_token_ids for r in reqs],
        generators=list(generators) if generators is not None else [None] * len(reqs),
        bitmask=bitmask, bitmask_rows=[i for i, _ in grammars],
    )
