"""A draft model as proposer: a small model of the target's family (the same tokenizer, checked at load) run in the
engine process with its own ModelRunner and small KV cache (as many blocks as the target's, of its own small
size). Each step it catches up on the request's new tokens (its prompt the first time: a prefill) and then
proposes greedily, one decode step per proposed token for all requests together; its KV beyond the tokens the
target kept is overwritten on the next step (``_DraftSeq.sync``)."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field

import torch

from engine.errors import ModelLoadError
from engine.sampling_params import SamplingParams
from engine.spec.config import SpeculativeConfig

log = logging.getLogger(__name__)

TOKENIZER_SAMPLE = 256  # token ids compared between the two tokenizers (evenly spread, and the specials)
_GREEDY = SamplingParams(temperature=0, max_tokens=None)


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
    def __init__(self, runner, name: str):
        self.runner = runner
        self.name = name
        self.block_size = runner.block_size
        self.free: list[int] = list(range(runner.num_blocks - 1, -1, -1))
        self.seqs: dict[str, _DraftSeq] = {}

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
            s = self.seqs.get(r.request_id)
            if s is None:
                s = self.seqs[r.request_id] = _DraftSeq(r.request_id)
            s.sync(r.all_token_ids)
            if self._room(s, len(s.tokens) + k):  # else no proposal this step
                seqs.append(s)
                alive.append(k)
        out = {s.request_id: [] for s in seqs}
        if seqs:
            self._draft(seqs, alive, out)
        return [out.get(r.request_id, []) for r in reqs]

    def remove(self, request_id: str) -> None:
        s = self.seqs.pop(request_id, None)
        if s is not None:
            self.free.extend(reversed(s.block_ids))

    # -- drafting ---------------------------------------------------------------------------
    def _room(self, s: _DraftSeq, tokens: int) -> bool:
        need = -(-tokens // self.block_size) - len(s.block_ids)
        if need > len(self.free):
            return False
        for _ in range(max(0, need)):
            s.block_ids.append(self.free.pop())
        return True

    def _draft(self, seqs: list[_DraftSeq], limits: list[int], out: dict[str, list[int]]) -> None:
        """Catch up (every token not in the draft's KV, the last one included) and propose the first token, then
        one decode step per further token, each for the requests that want that many."""
        step = [(_Piece(s, len(s.tokens) - s.num_computed_tokens), k) for s, k in zip(seqs, limits)]
        while step:
            tokens = self._greedy(_Step([p for p, _ in step]))
            nxt = []
            for (p, k), t in zip(step, tokens):
                s = p.request
                s.num_computed_tokens += p.num_new_tokens
                out[s.request_id].append(t)
                s.tokens.append(t)
                if len(out[s.request_id]) < k:
                    nxt.append((_Piece(s, 1), k))
            step = nxt

    @torch.inference_mode()
    def _greedy(self, step: _Step) -> list[int]:
        inp, _, _ = self.runner.prepare(step)
        logits = self.runner.run(inp)
        return torch.argmax(logits, dim=-1).tolist()
