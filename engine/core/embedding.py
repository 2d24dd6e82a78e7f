"""The checks an embedding input passes before it becomes an engine request (torch-free: the client runs them
too, so that a batch's bad input is named by its index before anything reaches the engine)."""

from __future__ import annotations

from engine.errors import InvalidRequestError


def check_embedding_input(ids: list[int], vocab_size: int, max_model_len: int, where: str) -> None:
    """An embedding input must be non-empty token ids of the vocabulary that fit the context (all of it: no
    token is generated after them). The client checks each input of a batch under its own index,
    the core checks again for callers that reach it directly. ``where``: ``input`` or ``input[i]``, named in the
    message; the error's param is the field, ``input``, as OpenAI reports it."""
    param = where.split("[", 1)[0]
    if not ids:
        raise InvalidRequestError(f"'{where}' is empty: an embedding needs at least one token.", param=param)
    bad = next((t for t in ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise InvalidRequestError(f"Token id {bad} in '{where}' is out of the vocabulary (0..{vocab_size - 1}).",
                                  param=param)
    if len(ids) > max_model_len:
        raise InvalidRequestError(
            f"This model's maximum context length is {max_model_len} tokens, but '{where}' has {len(ids)} tokens. "
            "Shorten the input or load the model with a longer context.", param=param)
