"""What the batched sampler needs to know about each row of a step's logits, in plain data: no Request, no
scheduler. The model runner builds it from the step's requests (engine.runner.inputs.sampling_metadata).

Host-side lists on purpose: the eager sampler turns them into the few small device tensors it needs (pinned,
non-blocking copies). A later CUDA-graph path can keep persistent device tensors instead (per-row temperature,
top-k, top-p, min-p and penalty columns, bias / seen-token / stop-id masks of [max_batch, vocab]) and refill
them from this object before each replay; nothing in the sampler reads anything but this."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from engine.sampling_params import SamplingParams


@dataclass
class SamplingMetadata:
    """Row i of the logits samples with:

    - params[i]: its SamplingParams (temperature, top-k/p, min-p, penalties, logit bias, min_tokens,
      stop_token_ids, ignore_eos, logprobs count);
    - prompt_token_ids[i], output_token_ids[i]: its prompt and its output so far, read by the repetition,
      presence and frequency penalties (may be empty on a row without a penalty, and on every row when
      ``penalty_counts`` is given);
    - penalty_counts / penalty_prompt: the same as device tensors (int32 output counts, bool prompt mask,
      [number of penalised rows, vocab], in row order), gathered from the runner's per-request state
      (engine/layers/penalties.py); None: the sampler builds them from the lists;
    - num_output_tokens[i]: how many tokens it has generated so far (min_tokens);
    - eos_token_ids[i]: the ids masked with stop_token_ids while below min_tokens (unless ignore_eos);
    - generators[i]: its own generator (a seeded request) or None for the sampler's default one;
    - bitmask / bitmask_rows: structured output (engine/tokenizer/grammar.py): row j of the int32 [k,
      ceil(vocab / 32)] CPU tensor holds the allowed tokens of logits row bitmask_rows[j] (bit t % 32 of word
      t // 32); None when no row has a grammar.

    The token lists may be the requests' own lists (not copies): use the metadata within the step."""

    params: list[SamplingParams]
    prompt_token_ids: list[Sequence[int]]
    output_token_ids: list[Sequence[int]]
    num_output_tokens: list[int]
    eos_token_ids: list[frozenset[int]]
    generators: list[torch.Generator | None]
    bitmask: torch.Tensor | None = None
    bitmask_rows: list[int] = field(default_factory=list)
    penalty_counts: torch.Tensor | None = None
    penalty_prompt: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.params)
