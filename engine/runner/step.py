"""What the model runner reads of a scheduled step, as protocols: the runner sits below the engine core, so it
names no core type. engine.core's Request, ScheduledRequest and SchedulerOutput satisfy these structurally
(tests/unit/test_scheduler.py checks it); the runner reads the scheduler's own objects, with no copy per step.

Data flows one way: the core builds the step, the runner reads it (never writes it) and hands back the
sequences that sampled (the same objects, in step order) with their tokens."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from engine.sampling_params import SamplingParams


@runtime_checkable
class SequenceState(Protocol):
    """One request's state as the runner reads it (engine.core.request.Request)."""

    @property
    def request_id(self) -> str: ...

    @property
    def params(self) -> SamplingParams: ...

    @property
    def eos_token_ids(self) -> frozenset[int]: ...

    @property
    def prompt_token_ids(self) -> list[int]: ...

    @property
    def output_token_ids(self) -> list[int]: ...

    @property
    def all_token_ids(self) -> list[int]: ...  # prompt + output

    @property
    def block_ids(self) -> list[int]: ...  # its KV-cache blocks, in order

    @property
    def num_computed_tokens(self) -> int: ...  # tokens whose KV is in the cache before this step

    @property
    def num_tokens(self) -> int: ...  # prompt + output tokens on the host

    def token_at(self, i: int) -> int: ...


@runtime_checkable
class ScheduledSequence(Protocol):
    """A sequence's share of one step (engine.core.scheduler.ScheduledRequest)."""

    @property
    def request(self) -> SequenceState: ...

    @property
    def num_new_tokens(self) -> int: ...  # tokens computed this step, from request.num_computed_tokens

    @property
    def samples(self) -> bool: ...  # the step reaches the end of the request's tokens: a token is sampled

    @property
    def spec(self) -> Sequence[int]: ...  # proposed tokens verified after its last token (speculative decoding)


@runtime_checkable
class ScheduledStep(Protocol):
    """One step (engine.core.scheduler.SchedulerOutput)."""

    @property
    def scheduled(self) -> Sequence[ScheduledSequence]: ...  # decodes first, then prefill chunks
