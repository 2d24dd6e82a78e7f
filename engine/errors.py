"""Typed, actionable errors. Each says what went wrong and what to do; the server maps them to
OpenAI error objects (``status_code``/``error_type``), the GUI shows ``str(err)`` in place."""

from __future__ import annotations


class KestrelError(Exception):
    """Base of every error the engine raises on purpose."""

    status_code = 500
    error_type = "internal_error"


class InvalidRequestError(KestrelError, ValueError):
    """A request parameter or prompt the engine cannot honour."""

    status_code = 400
    error_type = "invalid_request_error"

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


class PromptTooLongError(InvalidRequestError):
    """``at_least``: the prompt was refused by its length in bytes before tokenizing it (engine.frontend.client), so
    ``prompt_len`` is a lower bound of its token count."""

    def __init__(self, prompt_len: int, max_len: int, max_tokens: int | None = None, at_least: bool = False):
        extra = f" plus {max_tokens} requested completion tokens" if max_tokens else ""
        has = "at least " if at_least else ""
        super().__init__(
            f"This model's maximum context length is {max_len} tokens, but the prompt has "
            f"{has}{prompt_len} tokens{extra}. Shorten the prompt or load the model with a longer context.",
            param="prompt",
        )
        self.prompt_len = prompt_len
        self.max_len = max_len


class ModelLoadError(KestrelError):
    """The model could not be loaded; the message names the file and the problem."""

    status_code = 400
    error_type = "model_load_error"


class ModelNotFoundError(ModelLoadError):
    status_code = 404
    error_type = "model_not_found"


class CheckpointError(ModelLoadError):
    """Corrupt or truncated file, missing shard, missing tensor, wrong shape."""

    def __init__(self, path, problem: str):
        super().__init__(f"{path}: {problem}")
        self.path = str(path)
        self.problem = problem


class UnsupportedArchitectureError(ModelLoadError):
    def __init__(self, architecture: str, supported: list[str]):
        super().__init__(
            f"Architecture {architecture!r} is not supported. Supported architectures: "
            + ", ".join(sorted(supported))
        )
        self.architecture = architecture


class KVCacheFullError(KestrelError):
    """A single request can never fit in the KV cache, even alone."""

    status_code = 400
    error_type = "invalid_request_error"


class EngineDeadError(KestrelError):
    status_code = 503
    error_type = "engine_dead"


class EngineShuttingDownError(EngineDeadError):
    error_type = "engine_shutting_down"


class EngineRestartingError(EngineDeadError):
    """The engine process died and is being restarted (engine.frontend.client.RestartPolicy): retry shortly."""

    error_type = "engine_restarting"
    retry_after = 5  # seconds, for HTTP's Retry-After


def as_request_error(e: Exception, internal: str = "Internal engine error") -> KestrelError:
    """Any exception raised while taking a request, as the typed error for the caller: a KestrelError as it is,
    bad input the checks missed as the client's fault (400), anything else as ours (500), prefixed ``internal``."""
    if isinstance(e, KestrelError):
        return e
    if isinstance(e, (ValueError, TypeError, KeyError, IndexError, UnicodeError, OverflowError)):
        return InvalidRequestError(f"Invalid request ({type(e).__name__}: {e}).")
    return KestrelError(f"{internal} ({type(e).__name__}: {e}).")
