"""Chat-template rendering, as transformers' ``apply_chat_template(tokenize=False)`` does it.

Messages are normalized (plain dicts without None values, text parts joined, reasoning aliases filled) and
rendered with a sandboxed jinja2 environment set up like transformers': trim_blocks/lstrip_blocks,
``raise_exception``, ``strftime_now``, a plain-json ``tojson``, guarded namespaces and the ``generation``
tag. Template and conversation errors become ``InvalidRequestError``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any, ClassVar

from engine.errors import InvalidRequestError

__all__ = ["render_chat_template"]


class _TemplateDict:
    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


@lru_cache(maxsize=32)
def _compile_template(template: str):
    # ~50 ms: the GUI process imports the tokenizer package, jinja2 loads with the first template
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # jinja's own tojson escapes HTML characters; chat templates expect plain json.dumps (as transformers)
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    class _Namespace(jinja2.utils.Namespace):
        # namespaces reject dunder/underscore attributes (a sandbox escape route), as transformers does
        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                _Namespace._check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            _Namespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"chat templates cannot set attribute {name!r} on a namespace")

    class _Generation(jinja2.ext.Extension):
        # `{% generation %}...{% endgeneration %}` (assistant-mask markers): render the body unchanged
        tags: ClassVar[set[str]] = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _Namespace
    return env.from_string(template)


_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def _normalize_messages(messages: Sequence[Any]) -> list[dict[str, Any]]:
    """Plain dicts without None values (as transformers), text parts joined, reasoning aliases filled."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise InvalidRequestError("'messages' must be a list of {role, content} objects", param="messages")
    if len(messages) == 0:
        raise InvalidRequestError("'messages' must contain at least one message", param="messages")
    out = []
    for i, message in enumerate(messages):
        if hasattr(message, "model_dump"):
            message = message.model_dump()
        if not isinstance(message, Mapping):
            raise InvalidRequestError(f"messages[{i}] must be an object with 'role' and 'content'", param="messages")
        message = {k: v for k, v in message.items() if v is not None}
        if not isinstance(message.get("role"), str):
            raise InvalidRequestError(f"messages[{i}] has no 'role'", param="messages")
        content = message.get("content")
        if isinstance(content, (list, tuple)):
            message["content"] = "\n".join(_text_parts(content, i))
        elif content is not None and not isinstance(content, str):
            raise InvalidRequestError(
                f"messages[{i}].content must be a string or a list of text parts", param="messages"
            )
        reasoning = next((message[k] for k in _REASONING_FIELDS if message.get(k) is not None), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        out.append(message)
    return out


def _text_parts(parts: Iterable[Any], i: int) -> list[str]:
    texts = []
    for j, part in enumerate(parts):
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, Mapping) and part.get("type", "text") == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        else:
            kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
            raise InvalidRequestError(
                f"messages[{i}].content[{j}] is of type {kind!r}; this model accepts only text parts",
                param="messages",
            )
    return texts


def render_chat_template(template: str, messages: Sequence[Any], *, add_generation_prompt: bool = True,
                         tools: list | None = None, documents: list | None = None, **variables: Any) -> str:
    """Render a chat template as transformers' ``apply_chat_template(tokenize=False)`` does."""
    import jinja2

    chat = _normalize_messages(messages)
    try:
        compiled = _compile_template(template)
    except jinja2.TemplateSyntaxError as e:
        raise InvalidRequestError(f"The model's chat template is invalid: {e}", param="messages") from None
    try:
        return compiled.render(messages=chat, tools=tools, documents=documents,
                               add_generation_prompt=add_generation_prompt, **variables)
    except jinja2.TemplateError as e:  # raise_exception(...) in the template, undefined attributes, sandbox
        raise InvalidRequestError(f"Chat template error: {e}", param="messages") from None
    except (TypeError, ValueError, KeyError, IndexError, AttributeError) as e:
        raise InvalidRequestError(
            f"The conversation does not fit the model's chat template ({type(e).__name__}: {e})", param="messages"
        ) from None
