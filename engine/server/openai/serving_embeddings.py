"""POST /v1/embeddings: ``input`` as a string, a list of strings, token ids or a list of token-id lists, each
one prefill-only engine request (engine.frontend.client.EngineClient.embed) batched with whatever else runs.

The vectors come from the engine pooled and normalised as the model's sentence-transformers configuration (or
``--pooling``) says. ``dimensions`` keeps the first N and renormalises them to unit length (what OpenAI does for
its Matryoshka-trained models; for other models the shorter vector is a projection, still a unit vector);
``encoding_format: base64`` is the little-endian float32 bytes, as OpenAI's clients decode them.
"""

from __future__ import annotations

import base64
import math
import sys
from array import array

from starlette.requests import Request
from starlette.responses import Response

from engine.errors import InvalidRequestError, PromptTooLongError
from engine.server.openai import serving as S
from engine.server.openai.protocol import EmbeddingRequest, check_fields

MAX_EMBEDDING_INPUTS = 2048  # OpenAI's limit


def embedding_inputs(req: EmbeddingRequest) -> list[str | list[int]]:
    """The request's inputs, each a text or token ids; 400 naming ``input`` for an empty one, too many, or
    text that is not valid Unicode. (Token ids and lengths are checked by EngineClient.embed.)"""
    x = req.input
    if isinstance(x, str):
        items: list = [x]
    elif not x:
        raise InvalidRequestError("'input' is empty: give a string, a list of strings or token ids.",
                                  param="input")
    elif isinstance(x[0], int):
        items = [x]
    else:
        items = list(x)
    if len(items) > MAX_EMBEDDING_INPUTS:
        raise InvalidRequestError(f"Too many inputs: {len(items)}, at most {MAX_EMBEDDING_INPUTS}.", param="input")
    for i, item in enumerate(items):
        where = "input" if len(items) == 1 else f"input[{i}]"
        if not item:
            raise InvalidRequestError(f"'{where}' is empty: an embedding needs at least one token.", param="input")
        if isinstance(item, str):
            S.check_text(item, where)
    return items


def _vector(raw: bytes, dimensions: int | None) -> array:
    vec = array("f", raw)
    if sys.byteorder == "big":
        vec.byteswap()
    if dimensions is not None and dimensions < len(vec):
        vec = vec[:dimensions]
        norm = math.sqrt(math.fsum(v * v for v in vec))
        if norm > 0:
            vec = array("f", (v / norm for v in vec))
    return vec


def _encode(vec: array, fmt: str) -> list[float] | str:
    if fmt == "float":
        return vec.tolist()
    if sys.byteorder == "big":
        vec = array("f", vec)
        vec.byteswap()
    return base64.b64encode(vec.tobytes()).decode("ascii")


async def create_embedding(ctx: S.ServerContext, req: EmbeddingRequest, raw: Request) -> Response:
    ctx.check_model(req.model)
    check_fields(req)
    fmt = req.encoding_format or "float"
    if fmt not in ("float", "base64"):
        raise InvalidRequestError(f"Invalid value for 'encoding_format': {fmt!r}; use 'float' or 'base64'.",
                                  param="encoding_format")
    if req.dimensions is not None and req.dimensions < 1:
        raise InvalidRequestError(f"Invalid value for 'dimensions': {req.dimensions}; it must be at least 1.",
                                  param="dimensions")
    inputs = embedding_inputs(req)
    limit = ctx.info.max_model_len
    for i, item in enumerate(inputs):  # by its bytes, before any tokenizing: a 10 MiB input took 21-36 s to refuse
        at_least = ctx.client.prompt_lower_bound(item) if isinstance(item, str) else 0
        if at_least > limit:
            err = PromptTooLongError(at_least, limit, at_least=True)
            err.param = "input" if len(inputs) == 1 else f"input[{i}]"
            raise err
    return await S.until_disconnect(raw, _embed(ctx, req, inputs, fmt))


async def _embed(ctx: S.ServerContext, req: EmbeddingRequest, inputs: list, fmt: str) -> Response:
    outs = await ctx.client.embed(inputs)  # cancelled (client gone): its streams are aborted
    size = len(outs[0].embedding) // 4
    if req.dimensions is not None and req.dimensions > size:
        raise InvalidRequestError(f"Invalid value for 'dimensions': {req.dimensions}; this model's embeddings "
                                  f"have {size} dimensions.", param="dimensions")
    data = [{"object": "embedding", "index": i, "embedding": _encode(_vector(o.embedding, req.dimensions), fmt)}
            for i, o in enumerate(outs)]
    tokens = sum(o.num_prompt_tokens for o in outs)
    body = {"object": "list", "data": data, "model": ctx.response_model(req.model),
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
    return Response(S.encode_json(body), media_type="application/json")
