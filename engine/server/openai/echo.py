"""/v1/completions' ``echo``: the prompt's text before each choice's completion and, with ``logprobs``, the prompt
tokens' logprobs before the completion's, in OpenAI's legacy completions format (``tokens``, ``token_logprobs``
with None for the first token, ``top_logprobs`` with None there too, ``text_offset`` into the echoed text). This is
how evaluation harnesses (lm-evaluation-harness, HELM) score a text: ``echo=True, logprobs=k, max_tokens=0`` (or 1).

The engine computes the prompt logprobs (``SamplingParams.prompt_logprobs``, engine/runner/prompt_logprobs.py) and
sends them on each choice's first delta (``RequestDelta.prompt_logprobs``: one entry per prompt token). The engine
always generates at least one token: ``max_tokens=0`` runs one and leaves it out of the answer (its text, logprobs
and usage), as vLLM does."""

from __future__ import annotations

from engine.server.openai import serving as S


async def echo_texts(ctx: S.ServerContext, prompts: list[dict]) -> list[str]:
    """The text echoed before each prompt's choices: the prompt string, or a token-id prompt decoded."""
    out = []
    for p in prompts:
        out.append(p["prompt"] if "prompt" in p else await ctx.client.detokenize(p["prompt_token_ids"],
                                                                              skip_special_tokens=False))
    return out


def prompt_logprobs(ctx: S.ServerContext, strs: list[str], plps: list, top_n: int) -> tuple[dict, int]:
    """The prompt's part of a choice's ``logprobs`` (first token: no logprob, no top) and the text offset after it
    (``strs``: ctx.token_tables()'s token strings)."""
    first = strs[plps[0].token_id]
    rest, offset = S.completion_logprobs(ctx, plps[1:], top_n, len(first))
    return {"tokens": [first] + rest["tokens"], "token_logprobs": [None] + rest["token_logprobs"],
            "top_logprobs": [None] + rest["top_logprobs"], "text_offset": [0] + rest["text_offset"]}, offset


def joined(head: dict | None, tail: dict | None) -> dict | None:
    """Two parts of a choice's ``logprobs`` one after the other."""
    if head is None or tail is None:
        return head or tail
    return {k: head[k] + tail[k] for k in ("tokens", "token_logprobs", "top_logprobs", "text_offset")}
