"""POST /v1/completions: a prompt as a string, a list of strings, token ids or a list of token-id lists;
choice index = prompt number x n + sample, as OpenAI numbers them."""

from __future__ import annotations

import time
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response

from engine.errors import InvalidRequestError, PromptTooLongError
from engine.server.openai import serving as S
from engine.server.openai.echo import echo_texts, joined, prompt_logprobs
from engine.server.openai.protocol import CompletionRequest, check_fields


def prompts_of(req: CompletionRequest, vocab: int, max_len: int | None = None) -> list[dict]:
    """add_request keyword arguments, one per prompt. Cheap bounds first (the number of prompts, the length
    of token-id prompts), so a huge body is refused before it is walked."""
    p = req.prompt
    if isinstance(p, str):
        items: list = [p]
    elif not p:
        raise InvalidRequestError("The prompt is empty.", param="prompt")
    elif isinstance(p[0], int):
        items = [p]
    else:
        items = list(p)
    if len(items) > S.MAX_CHOICES:
        raise InvalidRequestError(f"Too many prompts: {len(items)}, at most {S.MAX_CHOICES}.", param="prompt")
    if max_len is not None:
        for item in items:
            if not isinstance(item, str) and len(item) >= max_len:
                raise PromptTooLongError(len(item), max_len)
    out = []
    for i, item in enumerate(items):
        where = "prompt" if len(items) == 1 else f"prompt[{i}]"
        if isinstance(item, str):
            if not item:
                raise InvalidRequestError(f"'{where}' is empty.", param="prompt")
            S.check_text(item, where)
            out.append({"prompt": item})
        else:
            if not item:
                raise InvalidRequestError(f"'{where}' is empty.", param="prompt")
            bad = next((t for t in item if not 0 <= t < vocab), None)
            if bad is not None:
                raise InvalidRequestError(f"Token id {bad} in '{where}' is out of the vocabulary (0..{vocab - 1}).",
                                          param="prompt")
            out.append({"prompt_token_ids": list(item)})
    return out


async def create_completion(ctx: S.ServerContext, req: CompletionRequest, raw: Request) -> Response:
    ctx.check_model(req.model)
    check_fields(req)
    prompts = prompts_of(req, ctx.info.vocab_size, ctx.info.max_model_len)
    top_n = req.logprobs
    if top_n is not None and not 0 <= top_n <= 20:
        raise InvalidRequestError("Invalid value for 'logprobs': must be in [0, 20].", param="logprobs")
    prompt_only = bool(req.echo) and req.max_tokens == 0  # echo's scoring form: the prompt, no completion
    params = S.sampling_params(ctx, req, max_tokens=1 if prompt_only else req.max_tokens,
                               max_tokens_name="max_tokens", logprobs=top_n)
    if req.echo and top_n is not None:
        params.prompt_logprobs = top_n
    if len(prompts) * params.n > S.MAX_CHOICES:
        raise InvalidRequestError(f"Too many choices: {len(prompts)} prompts x n={params.n} is more than "
                                  f"{S.MAX_CHOICES}.", param="n")
    if top_n is not None:
        await ctx.token_tables()
    echo = Echo(await echo_texts(ctx, prompts), prompt_only, params.n,
                (await ctx.token_tables())[0] if top_n is not None else []) if req.echo else None
    streams = await S.start_streams(ctx.client, prompts, params, raw)
    rid = S.new_id("cmpl")
    model = ctx.response_model(req.model)
    n_choices = len(prompts) * params.n
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return S.SSEResponse(_stream(ctx, streams, params.n, n_choices, rid, model, top_n, include_usage, echo),
                             on_close=lambda: S.abort_all(streams))
    return await S.until_disconnect(raw, _full(ctx, streams, params.n, n_choices, rid, model, top_n, echo))


@dataclass
class Echo:
    """``echo``: the text echoed per prompt, whether the completion is left out (max_tokens=0), n, and the token
    strings (with logprobs)."""

    texts: list[str]
    prompt_only: bool
    n: int
    strs: list[str]

    def head(self, ctx, i: int, plps, top_n: int | None) -> tuple[str, dict | None, int]:
        """Choice i's echoed text, its prompt logprobs (with ``top_n``) and the offset after them."""
        text = self.texts[i // self.n]
        if top_n is None or not plps:
            return text, None, len(text)
        lps, _ = prompt_logprobs(ctx, self.strs, plps, top_n)
        return text, lps, len(text)


async def _full(ctx, streams, n, n_choices, rid, model, top_n: int | None, echo: Echo | None = None) -> Response:
    gathered, cached = await S.collect(streams, n, n_choices)
    choices = []
    for i, c in enumerate(gathered):
        text, head, offset = echo.head(ctx, i, c.prompt_logprobs, top_n) if echo else ("", None, 0)
        own = not (echo and echo.prompt_only)
        tail = S.completion_logprobs(ctx, c.logprobs, top_n, offset)[0] if top_n is not None and own else None
        choices.append({"index": i, "text": text + ("".join(c.text) if own else ""),
                        "logprobs": joined(head, tail), "finish_reason": c.finish_reason,
                        "stop_reason": c.stop_reason})
    completion_tokens = 0 if echo and echo.prompt_only else sum(c.output_tokens for c in gathered)
    body = {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": choices, "usage": S.usage(streams, completion_tokens, cached)}
    return Response(S.encode_json(body), media_type="application/json")


async def _stream(ctx, streams, n, n_choices, rid, model, top_n: int | None, include_usage: bool,
                  echo: Echo | None = None):
    created = int(time.time())
    enc = S.encode_json
    head = {"id": rid, "object": "text_completion", "created": created, "model": model}
    if include_usage:
        head["usage"] = None
    offsets = [0] * n_choices
    echoed = [False] * n_choices
    completion_tokens = 0
    cached = 0
    try:
        async for batch in S.batches(streams, n):
            out = []
            firsts = {d.index: d.prompt_logprobs for d in batch if d.prompt_logprobs} if echo else {}
            for i, m in S.merge_by_choice(batch).items():
                text, lps, last = m.text, m.logprobs, m.last
                if echo and echo.prompt_only:
                    text, lps = "", None
                echo_lps = None
                if echo and not echoed[i]:  # the choice's first event: the prompt before it
                    echoed[i] = True
                    echo_text, echo_lps, offsets[i] = echo.head(ctx, i, firsts.get(i), top_n)
                    text = echo_text + text
                if not last.finished and not text and not (top_n is not None and (lps or echo_lps)):
                    continue
                logprobs = None
                if top_n is not None:
                    logprobs, offsets[i] = S.completion_logprobs(ctx, lps or [], top_n, offsets[i])
                    logprobs = joined(echo_lps, logprobs)
                choice = {"index": i, "text": text, "logprobs": logprobs,
                          "finish_reason": last.finish_reason if last.finished else None}
                if last.finished:
                    choice["stop_reason"] = last.stop_reason
                    completion_tokens += 0 if echo and echo.prompt_only else last.num_output_tokens
                    cached = max(cached, last.num_cached_tokens)
                out.append(b"data: " + enc({**head, "choices": [choice]}) + b"\n\n")
            if out:
                yield b"".join(out)
        if include_usage:
            yield b"data: " + enc({**head, "choices": [], "usage": S.usage(streams, completion_tokens, cached)}) \
                + b"\n\n"
        yield b"data: [DONE]\n\n"
    except Exception as e:
        yield S.sse_error(e)
    finally:
        S.abort_all(streams)
