"""A draft model as proposer: a small model of the target's family (the same tokenizer, checked at load) run in the
engine process with its own ModelRunner and small KV cache (as many blocks as the target's, of its own small
size). The draft computes each token's KV once:
- its prompt in the step where the target computes it (``prefill``: the scheduled prefill chunks, or the whole
  prompt where the target's prefix cache had it), so that no proposal step carries a prompt's prefill;
- each step it catches up on the request's tokens it has not computed (those the target kept: usually the last
  proposal and the target's bonus token) and proposes greedily, one decode step per proposed token for all
  requests together. A short catch-up runs as decode rows (one row per token, each over its own context: the
  runner's decode tape / CUDA graph, not the eager prefill path, whose per-layer set-up costs a short chunk ten
  times a decode); its KV beyond the tokens the target kept is overwritten on the next step
  (``_DraftSeq.sync``);
- a finished request's KV is kept (``retained``) for the next prompt that starts with the same tokens (a chat's
  next turn), given back oldest first when blocks run short."""

from __future__ import annotations

import dataclasses
import logging
from collections import OrderedDict
from dataclasses import dataclass, field

import torch

from engine.errors import ModelLoadError
from engine.runner.inputs import prepare_step
from engine.sampling_params import SamplingParams
from engine.spec.config import SpeculativeConfig

log = logging.getLogger(__name__)

TOKENIZER_SAMPLE = 256  # token ids compared between the two tokenizers (evenly spread, and the specials)
_GREEDY = SamplingParams(temperature=0, max_tokens=None)
# a step's sequences of at most this many new tokens each are run as decode rows, at most DECODE_ROWS rows a call (the
# CPU's largest decode tape: engine/runner/model_runner.py CPU_TAPE_MAX); longer ones (a prompt) as a prefill
DECODE_ROWS = 16
# finished requests whose KV the draft keeps for a later prompt that starts with the same tokens (a chat's next turn
# re-sends the conversation), least recently finished first given back when blocks run short
RETAINED_MAX = 8


def check_same_tokenizer(target_tok, draft_tok, target_vocab: int, draft_vocab: int, draft_name: str) -> None:
    """ModelLoadError unless the draft reads the target's token ids: the same vocabulary size (the models' and the
    tokenizers') and the same strings for a sample of ids and for the special tokens."""
    if target_vocab != draft_vocab or len(target_tok) != len(draft_tok):
        raise ModelLoadError(f"The draft model {draft_name} has another vocabulary ({draft_vocab} logits, "
                             f"{len(draft_tok)} tokens) than the target ({target_vocab} logits, {len(target_tok)} "
                             "tokens): speculative decoding needs the same tokenizer.")
    n = len(target_tok)
    ids = sorted(set(range(0, n, max(1, n // TOKENIZER_SAMPLE))) | set(target_tok.eos_token_ids))
    a, b = target_tok.convert_ids_to_tokens(ids), draft_tok.convert_ids_to_tokens(ids)
    for i, x, y in zip(ids, a, b):
        if x != y:
            raise ModelLoadError(f"The draft model {draft_name} has another tokenizer than the target: token {i} "
                                 f"is {y!r} there, {x!r} here; speculative decoding needs the same tokenizer.")


def _draft_quantization(target_config) -> str:
    """The draft's weights as cheap as its own file allows ("auto": a GGUF draft keeps its blocks even under a float
    target, a quantized checkpoint its scheme); a target quantized at load (int8 / int4 / fp8) has its draft
    quantized the same way. Proposals only need to be likely, not bit-exact: the target decides every token."""
    q = target_config.quantization
    return q if q in ("int8", "int4", "fp8") else "auto"


@dataclass
class _DraftSeq:
    """One request as the draft sees it (the runner's SequenceState): the tokens whose KV the draft computed,
    extended by the ones it computes now, and its blocks."""

    request_id: str
    block_ids: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)  # what its KV holds (num_computed_tokens of them) and more
    num_computed_tokens: int = 0
    prompt_token_ids: list[int] = field(default_factory=list)
    output_token_ids: tuple = ()
    params: SamplingParams = field(default_factory=lambda: _GREEDY)
    eos_token_ids: frozenset = frozenset()
    verified: int = 0  # tokens known to be the request's (sync)

    @property
    def all_token_ids(self) -> list[int]:
        return self.tokens

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    def token_at(self, i: int) -> int:
        return self.tokens[i]

    def sync(self, real: list[int]) -> None:
        """Keep the computed KV of the longest common prefix of what it computed and the request's tokens now
        (the tokens before ``verified`` were the request's at the last sync: a request's tokens only grow)."""
        n = min(self.num_computed_tokens, len(real))
        same = min(self.verified, n)
        while same < n and self.tokens[same] == real[same]:
            same += 1
        self.num_computed_tokens = same
        self.tokens = list(real)
        self.verified = len(real)


@dataclass
class _Piece:
    """One sequence's share of a draft step (the runner's ScheduledSequence)."""

    request: _DraftSeq
    num_new_tokens: int
    spec: tuple = ()
    samples: bool = True


@dataclass
class _Step:
    scheduled: list[_Piece]


class DraftProposer:
    free = False  # its proposals cost draft steps: the decoder's back-off skips asking (engine/spec/decoder.py)

    def __init__(self, runner, name: str):
        self.runner = runner
        self.name = name
        self.block_size = runner.block_size
        self.free_blocks: list[int] = list(range(runner.num_blocks - 1, -1, -1))
        self.seqs: dict[str, _DraftSeq] = {}
        self.retained: OrderedDict[str, _DraftSeq] = OrderedDict()  # finished requests' computed KV (``_seq``)
        # tokens the draft's runner has processed (a token's KV once; and the proposals the target rejects), and
        # of them those it processed as prefill spans rather than decode rows (only the prompts)
        self.tokens_computed = 0
        self.prefill_tokens = 0

    @classmethod
    def load(cls, cfg: SpeculativeConfig, target) -> "DraftProposer":
        """The draft of ``cfg.model`` beside ``target`` (an EngineCore): same device, dtype and threads, as many
        KV blocks as the target's."""
        from engine.loader import load_checkpoint
        from engine.runner.model_runner import ModelRunner

        ck = load_checkpoint(cfg.model)
        check_same_tokenizer(target.tokenizer, ck.tokenizer, target.model_config.vocab_size, ck.config.vocab_size,
                             cfg.model)
        tr = target.runner
        config = dataclasses.replace(target.config, model=cfg.model, speculative_config=None,
                                     num_kv_blocks=tr.num_blocks, block_size=tr.block_size,
                                     tensor_parallel_size=1, quantization=_draft_quantization(target.config))
        runner = ModelRunner(config, ck.config, ck.weights, target.max_model_len, ck.config.torch_dtype)
        log.info("draft model %s: %d KV blocks", cfg.model, runner.num_blocks)
        return cls(runner, cfg.model)

    # -- the proposer protocol ------------------------------------------------------------
    def propose(self, reqs: list, limits: list[int]) -> list[list[int]]:
        seqs, alive = [], []
        for r, k in zip(reqs, limits):
            s = self._seq(r)
            # at least the last token is fed (its logits propose): the draft may have computed it already, where
            # the target decoded plainly the token the draft had proposed (proposals dropped after it proposed)
            s.num_computed_tokens = min(s.num_computed_tokens, len(s.tokens) - 1)
            if self._room(s, len(s.tokens) + k):  # else no proposal this step
                seqs.append(s)
                alive.append(k)
        out = {s.request_id: [] for s in seqs}
        if seqs:
            self._draft(seqs, alive, out)
        return [out.get(r.request_id, []) for r in reqs]

    def prefill(self, scheduled: list) -> None:
        """The draft's KV of the tokens the target's step computes (``scheduled``: the step's ScheduledSequences,
        before it runs) for the prompts' chunks (requests with no output yet): every token up to the chunk's end
        that the draft has not computed (with a prefix-cache hit, the whole prompt, less what a finished request's
        KV gives), without logits. Decodes and verify spans are left to ``propose``."""
        pieces = []
        for p in scheduled:
            r = p.request
            end = r.num_computed_tokens + p.num_new_tokens
            if p.spec or getattr(r, "pooling", None) is not None or r.output_token_ids:
                continue  # a decode (or a recomputation after preemption): propose catches up
            s = self._seq(r)
            if end > s.num_computed_tokens and self._room(s, end):
                pieces.append(_Piece(s, end - s.num_computed_tokens, samples=False))
        chunk = max(1, getattr(self.runner.config, "max_num_batched_tokens", None) or 2048)
        while pieces:  # cut to the step's token budget, as the target's chunks are
            step, budget, rest = [], chunk, []
            for p in pieces:
                n = min(p.num_new_tokens, budget)
                if n > 0:
                    step.append(_Piece(p.request, n, samples=False))
                    budget -= n
                if n < p.num_new_tokens:
                    rest.append(_Piece(p.request, p.num_new_tokens - n, samples=False))
            self._forward(step)
            for q in step:
                q.request.num_computed_tokens += q.num_new_tokens
            pieces = rest

    def remove(self, request_id: str) -> None:
        """A finished request: its computed KV kept (``retained``, the blocks past it given back) for a later
        prompt that starts alike, the least recently finished past RETAINED_MAX given back."""
        s = self.seqs.pop(request_id, None)
        if s is None:
            return
        stale = self.retained.pop(request_id, None)  # an id used again
        if stale is not None:
            self.free_blocks.extend(reversed(stale.block_ids))
        keep = -(-s.num_computed_tokens // self.block_size)
        self.free_blocks.extend(reversed(s.block_ids[keep:]))
        del s.block_ids[keep:], s.tokens[s.num_computed_tokens:]
        if s.block_ids:
            self.retained[request_id] = s
        while len(self.retained) > RETAINED_MAX:
            self._give_back_oldest()

    # -- drafting ---------------------------------------------------------------------------
    def _seq(self, r) -> _DraftSeq:
        """The draft's state of request ``r``, synced with its tokens; a new one starts from the finished
        request's KV (taken whole: its blocks become this one's) that shares the longest prefix with its tokens,
        short of its last token (one is always computed: the step that proposes needs its logits)."""
        s = self.seqs.get(r.request_id)
        real = r.all_token_ids
        if s is None:
            s = self.seqs[r.request_id] = _DraftSeq(r.request_id)
            best, common = None, 0
            for old in self.retained.values():
                n = _common_prefix(old.tokens, real, len(real) - 1)
                if n > common:
                    best, common = old, n
            if best is not None:
                del self.retained[best.request_id]
                keep = -(-common // self.block_size)
                self.free_blocks.extend(reversed(best.block_ids[keep:]))
                s.block_ids, s.tokens, s.num_computed_tokens = best.block_ids[:keep], best.tokens[:common], common
                s.verified = common
        s.sync(real)
        return s

    def _give_back_oldest(self) -> bool:
        if not self.retained:
            return False
        _, old = self.retained.popitem(last=False)
        self.free_blocks.extend(reversed(old.block_ids))
        return True

    def _room(self, s: _DraftSeq, tokens: int) -> bool:
        need = -(-tokens // self.block_size) - len(s.block_ids)
        while need > len(self.free_blocks) and self._give_back_oldest():
            pass
        if need > len(self.free_blocks):
            return False
        for _ in range(max(0, need)):
            s.block_ids.append(self.free_blocks.pop())
        return True

    def _draft(self, seqs: list[_DraftSeq], limits: list[int], out: dict[str, list[int]]) -> None:
        """Catch up (every token not in the draft's KV, the last one included) and propose the first token, then
        one decode step per further token, each for the requests that want that many."""
        step = [(_Piece(s, len(s.tokens) - s.num_computed_tokens), k) for s, k in zip(seqs, limits)]
        while step:
            tokens = self._greedy([p for p, _ in step])
            nxt = []
            for (p, k), t in zip(step, tokens):
                s = p.request
                s.num_computed_tokens += p.num_new_tokens
                out[s.request_id].append(t)
                s.tokens.append(t)
                if len(out[s.request_id]) < k:
                    nxt.append((_Piece(s, 1), k))
            step = nxt

    def _greedy(self, pieces: list[_Piece]) -> list[int]:
        """Each piece's greedy next token: the short pieces as decode rows (calls of at most DECODE_ROWS rows),
        the long ones (a prompt the draft had not seen) as one prefill step."""
        got: dict[int, int] = {}
        short = [i for i, p in enumerate(pieces) if p.num_new_tokens <= DECODE_ROWS]
        long = [i for i, p in enumerate(pieces) if p.num_new_tokens > DECODE_ROWS]
        batch: list[int] = []
        rows = 0
        for i in short + [None]:
            n = 0 if i is None else pieces[i].num_new_tokens
            if batch and (i is None or rows + n > DECODE_ROWS):
                got.update(zip(batch, self._forward([pieces[j] for j in batch], decode_rows=True)))
                batch, rows = [], 0
            if i is not None:
                batch.append(i)
                rows += n
        if long:
            got.update(zip(long, self._forward([pieces[j] for j in long])))
        return [got[i] for i in range(len(pieces))]

    @torch.inference_mode()
    def _forward(self, pieces: list[_Piece], decode_rows: bool = False) -> list[int]:
        """One runner step of ``pieces``: the argmax of the last row of each that samples. ``decode_rows``: every
        token a row of its own over its context (engine/runner/inputs.py ``prepare_step``'s per-token spans), so
        that the step replays a decode tape / CUDA graph bucket."""
        inp, _, _ = prepare_step(_Step(pieces), self.block_size, decode_rows or self.runner.deterministic)
        self.tokens_computed += len(inp.token_ids)
        if not decode_rows:
            self.prefill_tokens += len(inp.token_ids)
        logits = self.runner.run(inp)
        return [] if logits is None else torch.argmax(logits, dim=-1).tolist()


def _common_prefix(a: list[int], b: list[int], limit: int) -> int:
    """The length of the longest common prefix of ``a`` and ``b``, at most ``limit``."""
    n = min(len(a), len(b), limit)
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
