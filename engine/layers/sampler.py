"""Sampling the next token of every request in a batch, each with its own parameters, in whole-batch tensor
operations on the logits' device: no per-request host synchronisation; the step's one transfer back is the
chosen tokens (and logprobs when asked).

Order: structured output's allowed-token masks (their rows only; engine/tokenizer/grammar.py), logit bias,
min_tokens masking (eos and stop ids; not on a row with a grammar, which decides where EOS may come), repetition /
presence / frequency penalties; then greedy argmax, or temperature -> top-k -> softmax -> min-p -> top-p -> a draw.
The draw is an exponential race (argmax of p / E with E ~ Exp(1), which picks token i with probability p_i), so a
request with a seed draws its noise from its own generator and the others share the engine's. Logprobs are those
of the model's raw distribution, as OpenAI and vLLM report them.

Called as ``sampler(logits, metadata)``: row i of the logits with row i of a SamplingMetadata (what each row
samples with, in plain data; see engine/layers/sampling_metadata.py). ``sampler.sample(logits, metadata)`` returns
the same as a ``Sampled`` whose tokens stay on the device (a step launched ahead reads its input ids from them) and
whose ``result()`` waits only for their copy to the host."""

from __future__ import annotations

import torch

from dataclasses import dataclass

from engine.layers.penalties import has_penalty, penalty_tensors_from_lists
from engine.layers.sampling_metadata import SamplingMetadata
from engine.ops.transfer import to_device
from engine.wire import TokenLogprobs


def _finite(x: torch.Tensor) -> torch.Tensor:
    """Extreme but valid parameters (a temperature of 1e-5, a repetition penalty of 1e-30) overflow float32:
    NaN becomes impossible (-inf) and +inf the largest float, so softmax and argmax stay defined."""
    return torch.nan_to_num(x, nan=float("-inf"), posinf=torch.finfo(x.dtype).max)


def _rows_cols(pairs: list[tuple[int, list[int]]], vocab: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, [token ids]) pairs -> index tensors for x[rows, cols], ids outside the vocabulary dropped."""
    rows: list[int] = []
    cols: list[int] = []
    for r, ids in pairs:
        ids = [t for t in ids if 0 <= t < vocab]
        rows.extend([r] * len(ids))
        cols.extend(ids)
    return to_device(rows, torch.long, device), to_device(cols, torch.long, device)


def _column(values: list[float], device) -> torch.Tensor:
    return to_device(values, torch.float32, device).unsqueeze(1)


def apply_bitmask(x: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """A copy of x with the tokens that ``bitmask`` (int32 [len(rows), ceil(vocab / 32)], CPU) leaves out of each of
    its rows at -inf; the other rows untouched. On the CPU xgrammar's kernel does it in place (measured on 16 rows of
    a 49,152-token vocabulary: ~5 ms where unpacking the bits with torch ops took ~50-110 ms); elsewhere the bits
    are unpacked by torch on the device after a non-blocking copy (pinned on a GPU): no host sync."""
    dev, vocab = x.device, x.shape[-1]
    covered = min(vocab, bitmask.shape[1] * 32)
    if dev.type == "cpu":
        import xgrammar

        idx = torch.tensor(rows, dtype=torch.long)
        sub = x.index_select(0, idx)
        xgrammar.apply_token_bitmask_inplace(sub, bitmask, vocab_size=covered)
        if covered < vocab:  # tokens past the grammar's vocabulary are never allowed
            sub[:, covered:] = float("-inf")
        return x.index_copy(0, idx, sub)
    return apply_bitmask_torch(x, bitmask, rows)


def apply_bitmask_torch(x: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """apply_bitmask in torch ops on x's device (the GPU path)."""
    dev, vocab = x.device, x.shape[-1]
    if dev.type == "cuda":
        bitmask = bitmask.pin_memory()
    bits = bitmask.to(dev, non_blocking=True)
    shifts = torch.arange(32, dtype=torch.int32, device=dev)
    allowed = ((bits.unsqueeze(-1) >> shifts) & 1).flatten(1)[:, :vocab].bool()
    if allowed.shape[1] < vocab:
        allowed = torch.nn.functional.pad(allowed, (0, vocab - allowed.shape[1]), value=False)
    idx = to_device(rows, torch.long, dev)
    return x.index_copy(0, idx, x.index_select(0, idx).masked_fill(~allowed, float("-inf")))


def filtered_probs(x: torch.Tensor, params: list) -> torch.Tensor:
    """Rows of processed logits and their SamplingParams -> the distribution each draws from: temperature,
    top-k, softmax, min-p, top-p (the filtered tokens at 0)."""
    dev = x.device
    y = _finite(x / _column([p.temperature for p in params], dev))
    vocab = y.shape[-1]
    ks = [p.top_k if 0 < p.top_k < vocab else vocab for p in params]
    if min(ks) < vocab:
        kth = torch.topk(y, max(ks), dim=-1).values.gather(1, to_device(ks, torch.long, dev).unsqueeze(1) - 1)
        y = y.masked_fill(y < kth, float("-inf"))
    probs = torch.softmax(y, dim=-1)
    if any(p.min_p > 0 for p in params):
        floor = _column([p.min_p for p in params], dev) * probs.amax(dim=-1, keepdim=True)
        probs = probs.masked_fill(probs < floor, 0.0)
    if any(p.top_p < 1.0 for p in params):
        sorted_p, order = torch.sort(probs, dim=-1, descending=True)
        cum = torch.cumsum(sorted_p, dim=-1)
        drop = (cum - sorted_p) > _column([p.top_p for p in params], dev) * cum[:, -1:]
        probs = torch.zeros_like(probs).scatter_(1, order, sorted_p.masked_fill(drop, 0.0))
    return probs


@dataclass
class Sampled:
    """One batch's chosen tokens: ``tokens`` (int64 [rows], on the logits' device) and, on their way to the host in
    one non-blocking copy, the same tokens with the logprobs asked for; ``result()`` waits for that copy alone (on a
    GPU the stream may already run the next step)."""

    tokens: torch.Tensor
    host: torch.Tensor  # float64: tokens, then the chosen tokens' logprobs, the top values, the top ids
    ready: "torch.cuda.Event | None"  # the copy's end (None: on the CPU, already there)
    params: list
    want: list[int]  # the rows that asked for logprobs
    n_top: int

    def result(self) -> tuple[list[int], list[TokenLogprobs | None]]:
        if self.ready is not None:
            self.ready.synchronize()
        b, w, n_top = len(self.params), len(self.want), self.n_top
        host = self.host.tolist()
        token_list = [int(t) for t in host[:b]]
        out: list[TokenLogprobs | None] = [None] * b
        if not w:
            return token_list, out
        chosen_l = host[b:b + w]
        tv = host[b + w:b + w + w * n_top]
        ti = host[b + w + w * n_top:]
        for j, i in enumerate(self.want):
            n = self.params[i].logprobs
            top = [(int(ti[j * n_top + k]), tv[j * n_top + k]) for k in range(n)]
            out[i] = TokenLogprobs(token_list[i], chosen_l[j], top)
        return token_list, out


class Sampler:
    def __init__(self, default_generator: torch.Generator):
        self.default_generator = default_generator

    def __call__(self, logits: torch.Tensor, metadata: SamplingMetadata
                 ) -> tuple[list[int], list[TokenLogprobs | None]]:
        return self.sample(logits, metadata).result()

    def sample(self, logits: torch.Tensor, metadata: SamplingMetadata) -> Sampled:
        logits = logits.float()
        x = self._process(logits, metadata)
        tokens = torch.argmax(x, dim=-1)
        draw = [i for i, p in enumerate(metadata.params) if not p.greedy]
        if draw:
            tokens = self._draw(x, metadata, draw, tokens)
        return self._finish(logits, metadata, tokens)

    def processed(self, logits: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor:
        """The logits each row samples from before temperature and filtering (a grammar's mask, bias, min_tokens,
        penalties): speculative decoding's verification (engine/layers/rejection_sampler.py) starts from them."""
        return self._process(logits.float(), metadata)

    # -- logit processing ----------------------------------------------------------------------
    def _process(self, logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
        """Logits after bias, min_tokens masking and penalties (a finite copy when anything applies)."""
        dev, vocab = logits.device, logits.shape[-1]
        params = md.params
        bias = [(i, p.logit_bias) for i, p in enumerate(params) if p.logit_bias]
        constrained = set(md.bitmask_rows) if md.bitmask is not None else set()
        # a grammar decides where EOS may come: min_tokens does not mask a constrained row
        masked = [i for i, p in enumerate(params) if md.num_output_tokens[i] < p.min_tokens and i not in constrained]
        penalised = [i for i, p in enumerate(params) if has_penalty(p)]
        if not (bias or masked or penalised or constrained):
            return logits  # the model's own logits are finite; only the processing below can overflow
        x = apply_bitmask(logits, md.bitmask, md.bitmask_rows) if constrained else logits.clone()
        if bias:
            rows, cols = _rows_cols([(i, list(b)) for i, b in bias], vocab, dev)
            vals = [b[t] for _, b in bias for t in b if 0 <= t < vocab]
            x.index_put_((rows, cols), to_device(vals, x.dtype, dev), accumulate=True)
        if masked:
            stop = [(i, list(set(params[i].stop_token_ids)
                             | (set() if params[i].ignore_eos else md.eos_token_ids[i]))) for i in masked]
            rows, cols = _rows_cols(stop, vocab, dev)
            x.index_put_((rows, cols), x.new_full((), float("-inf")))  # a device scalar: no sync
        if penalised:
            x = self._penalise(x, md, penalised)
        return _finite(x)

    @staticmethod
    def _penalise(x: torch.Tensor, md: SamplingMetadata, rows: list[int]) -> torch.Tensor:
        """The repetition penalty on the tokens of the prompt and output, then presence and frequency on the
        output's counts, on the penalised rows only (a penalty of 1 or 0 leaves a row's logits exact)."""
        dev, vocab, params = x.device, x.shape[-1], md.params
        if md.penalty_counts is not None:
            counts, prompt = md.penalty_counts, md.penalty_prompt
        else:
            counts, prompt = penalty_tensors_from_lists([md.prompt_token_ids[i] for i in rows],
                                                        [md.output_token_ids[i] for i in rows], vocab, dev)
        idx = to_device(rows, torch.long, dev)
        sub = x.index_select(0, idx)
        generated = counts > 0
        penalty = _column([params[i].repetition_penalty for i in rows], dev)
        sub = torch.where(prompt | generated, torch.where(sub > 0, sub / penalty, sub * penalty), sub)
        counts = counts.to(sub.dtype)
        freq = _column([params[i].frequency_penalty for i in rows], dev)
        pres = _column([params[i].presence_penalty for i in rows], dev)
        sub = sub - freq * counts - pres * generated.to(sub.dtype)
        return x.index_copy(0, idx, sub)

    # -- drawing ---------------------------------------------------------------------------------
    def _draw(self, x: torch.Tensor, md: SamplingMetadata, draw: list[int], greedy_tokens: torch.Tensor
              ) -> torch.Tensor:
        """Tokens drawn for the rows in ``draw``; the other rows keep their greedy token."""
        rows = to_device(draw, torch.long, x.device)
        probs = filtered_probs(x.index_select(0, rows), [md.params[i] for i in draw])
        generators = md.generators
        noise = torch.empty_like(probs)
        own = [j for j, i in enumerate(draw) if generators[i] is not None]
        if len(own) < len(draw):
            noise.exponential_(generator=self.default_generator)
        for j in own:
            noise[j].exponential_(generator=generators[draw[j]])
        drawn = torch.argmax(probs / noise.clamp_min_(1e-30), dim=-1)
        # a row whose every token was filtered out (or had no finite logit) keeps its best token, not a crash
        usable = torch.isfinite(probs).all(dim=-1) & (probs.sum(dim=-1) > 0)
        greedy = greedy_tokens.index_select(0, rows)
        return greedy_tokens.index_copy(0, rows, torch.where(usable, drawn, greedy))

    # -- to the host -------------------------------------------------------------------------------
    @staticmethod
    def _finish(logits: torch.Tensor, md: SamplingMetadata, tokens: torch.Tensor) -> Sampled:
        params = md.params
        want = [i for i, p in enumerate(params) if p.logprobs is not None]
        n_top = 0
        if not want:
            payload = tokens.double()
        else:
            rows = to_device(want, torch.long, logits.device)  # a list index would be a synchronising upload
            lp = torch.log_softmax(logits.index_select(0, rows), dim=-1)
            chosen = lp.gather(1, tokens.index_select(0, rows).unsqueeze(1)).squeeze(1)
            n_top = max(params[i].logprobs for i in want)
            top_v, top_i = torch.topk(lp, n_top, dim=-1) if n_top else (lp[:, :0], lp[:, :0].long())
            payload = torch.cat([tokens.double(), chosen.double(), top_v.double().flatten(),
                                 top_i.double().flatten()])
        ready = None
        if payload.device.type == "cuda":  # one transfer into pinned memory, waited for by result() alone
            host = torch.empty(payload.shape, dtype=payload.dtype, pin_memory=True)
            host.copy_(payload, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record()
        else:
            host = payload.cpu()
        return Sampled(tokens, host, ready, params, want, n_top)
