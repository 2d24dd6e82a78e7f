"""The runner's half of speculative decoding: a step where some requests verify proposed tokens (their k+1 rows of
logits: engine/runner/inputs.py ``prepare_step`` says which rows get logits). Those requests' rows are processed
per position as a plain step would process them with the accepted tokens so far (penalties count the proposals
before the row, min_tokens their number, a grammar's bitmask is its matcher's after the proposals before the row),
then engine/layers/rejection_sampler.py keeps a prefix; the step's other sampling requests go through the plain
sampler (``sample_plain``), exactly as without speculation. The forward pass is the step's own (prepare_step makes
each verify row a decode row, so a step of decode and verify rows replays a decode tape or CUDA graph bucket); the
acceptance is decided on the host, so the step synchronises."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.layers.penalties import has_penalty
from engine.layers.rejection_sampler import rejection_sample
from engine.layers.sampler import Sampler
from engine.layers.sampling_metadata import SamplingMetadata
from engine.ops.transfer import to_device
from engine.runner.step import SequenceState
from engine.wire import TokenLogprobs


@dataclass
class Verified:
    """A verify step's result, already on the host: per sampling request its emitted tokens (a list, the accepted
    proposals then the correction or bonus token; one token for a request without proposals) and their logprobs
    (a list of TokenLogprobs, or None where not asked)."""

    tokens: list[list[int]]
    logprobs: list[list[TokenLogprobs] | None]

    def result(self) -> tuple[list[list[int]], list[list[TokenLogprobs] | None]]:
        return self.tokens, self.logprobs


def verify_step(sampler: Sampler, logits: torch.Tensor, reqs: list[SequenceState], drafts: list[tuple[int, ...]],
                generators: list, sample_plain: Callable[[torch.Tensor, list[int]], object]) -> Verified:
    """``logits``: the step's rows, request i's len(drafts[i]) + 1 of them in order; ``sample_plain(rows_logits,
    request indices)`` samples the requests without proposals as a plain step (returns a Sampled)."""
    starts, row = [], 0
    for d in drafts:
        starts.append(row)
        row += len(d) + 1
    tokens: list[list[int]] = [[] for _ in reqs]
    lps: list[list[TokenLogprobs] | None] = [None] * len(reqs)
    plain = [i for i, d in enumerate(drafts) if not d]
    if plain:
        rows = to_device([starts[i] for i in plain], torch.long, logits.device)
        ptoks, plps = sample_plain(logits.index_select(0, rows), plain).result()
        for j, i in enumerate(plain):
            tokens[i] = [ptoks[j]]
            lps[i] = [plps[j]] if plps[j] is not None else None
    spec = [i for i, d in enumerate(drafts) if d]
    if not spec:
        return Verified(tokens, lps)
    row_ids, spans, md_rows = [], [], _Rows()
    for i in spec:
        d = list(drafts[i])
        spans.append((len(row_ids), d))
        row_ids.extend(range(starts[i], starts[i] + len(d) + 1))
        md_rows.add(reqs[i], d, generators[i])
    raw = logits.index_select(0, to_device(row_ids, torch.long, logits.device)).float()
    x = sampler.processed(raw, md_rows.metadata())
    emitted = rejection_sample(x, spans, [reqs[i].params for i in spec], [generators[i] for i in spec],
                               sampler.default_generator)
    for (first, _), i, toks in zip(spans, spec, emitted):
        tokens[i] = toks
        n = reqs[i].params.logprobs
        if n is not None:
            lps[i] = _logprobs(raw[first:first + len(toks)], toks, n)
    return Verified(tokens, lps)


def _logprobs(raw: torch.Tensor, toks: list[int], n_top: int) -> list[TokenLogprobs]:
    """The target's logprobs (of its raw distribution, as a plain step reports them) of each emitted token."""
    lp = torch.log_softmax(raw, dim=-1)
    chosen = lp[torch.arange(len(toks)), torch.tensor(toks, dtype=torch.long, device=lp.device)].tolist()
    if n_top:
        top_v, top_i = torch.topk(lp, n_top, dim=-1)
        top_v, top_i = top_v.tolist(), top_i.tolist()
    out = []
    for j, t in enumerate(toks):
        top = list(zip(top_i[j], top_v[j])) if n_top else []
        out.append(TokenLogprobs(t, chosen[j], top))
    return out


class _Rows:
    """The per-row SamplingMetadata of the verifying requests: row j of a request with proposals d samples as if
    d[:j] were already its output."""

    def __init__(self):
        self.params, self.prompts, self.outputs, self.n_out = [], [], [], []
        self.eos, self.gens, self.grammar_rows, self.masks = [], [], [], []

    def add(self, req: SequenceState, drafts: list[int], generator) -> None:
        pen = has_penalty(req.params)
        first = len(self.params)
        for j in range(len(drafts) + 1):
            self.params.append(req.params)
            self.prompts.append(req.prompt_token_ids if pen else ())
            self.outputs.append(list(req.output_token_ids) + drafts[:j] if pen else ())
            self.n_out.append(len(req.output_token_ids) + j)
            self.eos.append(req.eos_token_ids)
            self.gens.append(generator)
        grammar = getattr(req, "grammar", None)
        if grammar is not None:
            self._grammar_rows(grammar, drafts, first)

    def _grammar_rows(self, grammar, drafts: list[int], first: int) -> None:
        """Row j's allowed tokens: the matcher's after drafts[:j] (advanced, filled, then rolled back; the core cut
        the proposals at the first token the grammar refuses)."""
        from engine.tokenizer.grammar import bitmask_width

        mask = torch.empty((len(drafts) + 1, bitmask_width(grammar.vocab_size)), dtype=torch.int32)
        taken = 0
        for j in range(len(drafts) + 1):
            grammar.fill(mask, j)
            if j < len(drafts):
                if not grammar.accept_token(drafts[j]):
                    raise RuntimeError("a proposal outside its grammar reached verification")
                taken += 1
        if taken:
            grammar.matcher.rollback(taken)
        self.masks.append(mask)
        self.grammar_rows.extend(range(first, first + len(drafts) + 1))

    def metadata(self) -> SamplingMetadata:
        return SamplingMetadata(params=self.params, prompt_token_ids=self.prompts, output_token_ids=self.outputs,
                                num_output_tokens=self.n_out, eos_token_ids=self.eos, generators=self.gens,
                                bitmask=torch.cat(self.masks) if self.masks else None,
                                bitmask_rows=self.grammar_rows)
