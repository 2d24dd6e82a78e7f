"""Output processing: a request's sampled tokens into text and deltas. Incremental detokenisation, the stop checks
(grammar, EOS, stop tokens, stop strings, length) and the text each delta carries (what may still become a stop
string is held back). The engine core runs it on each step's tokens; finishing a request is the core's."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from engine.core.request import Request
from engine.wire import RequestDelta, RequestMetrics

log = logging.getLogger(__name__)


@dataclass
class Tracked:
    """A request with its output state: the detokenizer and the text so far."""

    request: Request
    detok: object
    text: str = ""
    emitted: int = 0  # characters of text already sent
    stop_max: int = 0  # the longest stop string (the text held back)


def check_stop(tr: Tracked, tok: int, max_model_len: int) -> tuple[str | None, int | str | None]:
    """(finish reason, stop reason) after ``tok`` was appended and detokenized: (None, None) where the request goes
    on. A stop string found truncates the text there (``find_stop``)."""
    req, p = tr.request, tr.request.params
    n_out = len(req.output_token_ids)
    reason = stop = None
    if req.grammar is not None and not req.grammar.accept_token(tok):
        log.warning("request %s: token %d is outside its grammar; finishing it", req.request_id, tok)
        reason = "stop"  # never expected: the sampler only draws allowed tokens
    elif req.grammar is not None and req.grammar.is_terminated():
        reason = "stop"  # the grammar took its stop token: the output is complete
    elif tok in req.eos_token_ids and not p.ignore_eos and n_out >= p.min_tokens:
        reason = "stop"
    elif tok in p.stop_token_ids and n_out >= p.min_tokens:
        reason, stop = "stop", tok
    elif p.stop and n_out >= p.min_tokens:
        hit = find_stop(tr)
        if hit is not None:
            reason, stop = "stop", hit
    if reason is None and (n_out >= (p.max_tokens or max_model_len) or req.num_tokens >= max_model_len):
        reason = "length"
    return reason, stop


def find_stop(tr: Tracked) -> str | None:
    """Find the earliest stop string in the unsent tail; truncate the text there."""
    p = tr.request.params
    start = max(0, tr.emitted - tr.stop_max)
    best = None
    for s in p.stop:
        i = tr.text.find(s, start)
        if i != -1 and (best is None or i < best[0]):
            best = (i, s)
    if best is None:
        return None
    i, s = best
    tr.text = tr.text[: i + len(s) if p.include_stop_str_in_output else i]
    return s


def take_text(tr: Tracked) -> str:
    """The text a running request's delta carries: what is new, less what may become a stop string."""
    end = len(tr.text) - max(0, tr.stop_max - 1)  # hold back what may become a stop string
    delta_text = ""
    if end > tr.emitted:
        delta_text, tr.emitted = tr.text[tr.emitted:end], end
    return delta_text


def finished_delta(tr: Tracked, toks: list[int], lps, now: float) -> RequestDelta:
    """The last delta of a finished request (its finish_reason and stop_reason set): the rest of its text and its
    metrics."""
    req = tr.request
    text = tr.text[tr.emitted:] if len(tr.text) > tr.emitted else ""
    t = req.timings
    metrics = RequestMetrics(
        arrival_time=t.arrival, queue_time=t.queue_time, ttft=t.ttft, e2e=now - t.arrival,
        decode_time=(t.last_token - t.first_token) if t.first_token else None,
        num_preemptions=req.num_preemptions)
    return RequestDelta(req.request_id, toks, text, lps, True, req.finish_reason, req.stop_reason,
                        req.num_prompt_tokens, req.num_cached_tokens, len(req.output_token_ids), metrics)
