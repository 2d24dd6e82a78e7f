"""The chat's words: a reply's stats line, a conversation's line in the list, why a reply was interrupted, the
request's messages from stored ones (app.panels.chat shows them; no widgets here)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from app.sampling import OutputFormat, SamplingSettings
from app.store import INTERRUPTED, Message
from app.widgets.tool_calls import readable_tool_calls

if TYPE_CHECKING:
    from app.workers.engine_worker import ReplyStats


def format_stats(stats: ReplyStats) -> str:
    parts = []
    if stats.ttft is not None:
        parts.append(f"TTFT {stats.ttft:.2f} s")
    if stats.tokens_per_s is not None:
        parts.append(f"{stats.tokens_per_s:.1f} tok/s")
    parts.append(f"{stats.num_tokens} tokens")
    note = {"abort": "stopped", "length": "max tokens reached", INTERRUPTED: "interrupted"}.get(
        stats.finish_reason or "")
    if note:
        parts.append(note)
    return " · ".join(parts)


def stored_stats(m: Message) -> str:
    """A stored reply's stats line (tokens only when counted: an interrupted reply may have none)."""
    parts = []
    if m.ttft is not None:
        parts.append(f"TTFT {m.ttft:.2f} s")
    if m.tokens_per_s is not None:
        parts.append(f"{m.tokens_per_s:.1f} tok/s")
    if m.num_tokens is not None:
        parts.append(f"{m.num_tokens} tokens")
    note = {"abort": "stopped", "length": "max tokens reached", INTERRUPTED: "interrupted"}.get(m.finish_reason or "")
    if note:
        parts.append(note)
    return " · ".join(parts)


def request_messages(msgs: list[Message], extra: list[dict] = ()) -> list[dict]:
    """Stored messages (and ``extra``) as a request's messages: replies without text left out, user messages
    that end up next to each other joined as one (the roles alternate, as chat templates require)."""
    out: list[dict] = []
    for m in [*({"role": m.role, "content": m.content} for m in msgs), *extra]:
        if m["role"] == "assistant" and not m["content"]:
            continue
        if out and m["role"] == "user" and out[-1]["role"] == "user":
            out[-1] = {"role": "user", "content": f"{out[-1]['content']}\n\n{m['content']}"}
        else:
            out.append(dict(m))
    return out


def failure_reason(message: str) -> str:
    """A failed request's message as the reason a reply was interrupted (without the engine's "retry shortly":
    the notice follows the restart)."""
    text = message.strip()
    for tail in (" It is being restarted; retry shortly.", "It is being restarted; retry shortly."):
        if text.endswith(tail):
            text = text[: -len(tail)].rstrip()
    return text if text.endswith((".", "!", "?")) else text + "."


def interrupted_text(reason: str | None) -> str:
    return f"Interrupted: {reason or 'the reply did not finish.'}  Regenerate tries again."


def gave_up_text(reason: str) -> str:
    reason = (reason or "").strip()
    if not reason:
        return "The engine stopped. Reload the model to chat again."
    if not reason.endswith((".", "!", "?")):
        reason += "."
    return f"The engine stopped and was not restarted. {reason}" + (
        "" if "reload" in reason.lower() else " Reload the model to chat again.")


def list_time(t: float) -> str:
    """A time as a list shows it: "Dec 7, 09:14"."""
    lt = time.localtime(t)  # the day without a leading zero, portably ("%-d" is glibc's: Windows refuses it)
    return f"{time.strftime('%b', lt)} {lt.tm_mday}, {time.strftime('%H:%M', lt)}"


def conversation_label(c, convs) -> str:
    """A conversation's line in the list: its title; where other conversations have the same title (several
    chats started with one prompt), a second line says when it was started, and "(2)", "(3)" where even
    that is the same (numbered oldest first)."""
    same = [o for o in convs if o.title.strip().casefold() == c.title.strip().casefold()]
    if len(same) < 2:
        return c.title
    when = list_time(c.created)
    twins = sorted((o for o in same if list_time(o.created) == when), key=lambda o: (o.created, o.id))
    if len(twins) > 1:
        when += f" ({[o.id for o in twins].index(c.id) + 1})"
    return f"{c.title}\nstarted {when}"


def params_problem(settings: SamplingSettings, output: OutputFormat) -> str:
    """Why these settings cannot make a request ('' when they can)."""
    try:
        settings.to_params(output)
    except ValueError as e:  # InvalidRequestError names the setting; a schema's problem says what it is
        return f"Output format: {e}" if output.problem() else str(e)
    return ""


def title_from(text: str) -> str:
    first = text.strip().splitlines()[0]
    return first if len(first) <= 48 else first[:47].rstrip() + "…"


def shown(role: str, text: str) -> str:
    """A message's text as the message view shows it: an assistant's tool calls as readable blocks."""
    return readable_tool_calls(text) if role == "assistant" else text
