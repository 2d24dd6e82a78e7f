"""What a chat turn sends when the conversation outgrows the model's context: the overflow policies (stop
and say so, drop the oldest turns, truncate the middle), and the reply's max tokens clamped to what fits.
No Qt and no engine here: tokens are counted by an awaitable ``count(messages) -> int`` (the loaded model's
tokenizer and chat template, generation prompt included), so the rules are unit-tested on their own.

The system prompt and the message being answered are always kept. Turns (a user message and the replies
after it) are left out whole, so the roles still alternate. The fewest turns are left out that let the
requested reply fit (found by bisection: a handful of counts even for long conversations); when even the
last message alone leaves less room than that, the reply is clamped; when it leaves less than
``min_reply`` tokens, the turn is refused with a message that says why."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

STOP, DROP_OLDEST, TRUNCATE_MIDDLE = "stop", "drop_oldest", "truncate_middle"
DEFAULT_POLICY = DROP_OLDEST
POLICIES = {
    DROP_OLDEST: "Drop the oldest turns",
    TRUNCATE_MIDDLE: "Truncate the middle",
    STOP: "Stop and say so",
}
MIN_REPLY = 16  # fewer tokens of room than this (or than max tokens, if smaller): refuse the turn

Count = Callable[[list[dict]], Awaitable[int]]


@dataclass
class Fit:
    messages: list[dict]  # what to send
    max_tokens: int  # the reply's limit (clamped to what fits)
    prompt_tokens: int  # tokens of ``messages``
    full_prompt_tokens: int  # tokens of the whole conversation
    max_len: int
    dropped: int = 0  # messages left out
    clamped: bool = False  # max tokens lowered to fit
    error: str | None = None  # refused: why, in words
    requested: int = 0  # the max tokens asked for
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.error is None

    def summary(self) -> str:
        """What the policy did, in words ('' when the conversation fits as it is)."""
        if self.error:
            return self.error
        parts = []
        if self.dropped:
            parts.append(f"{self.dropped} earlier message{'s' if self.dropped != 1 else ''} left out")
        if self.clamped:
            parts.append(f"reply limited to {self.max_tokens:,} tokens")
        return "To fit the model's context: " + ", ".join(parts) + "." if parts else ""


def _turns(messages: list[dict]) -> tuple[list[dict], list[list[dict]]]:
    """(the system messages at the start, the rest grouped into turns: each starts at a user message)."""
    i = 0
    while i < len(messages) and messages[i].get("role") == "system":
        i += 1
    head, turns = list(messages[:i]), []
    for m in messages[i:]:
        if not turns or m.get("role") == "user":
            turns.append([m])
        else:
            turns[-1].append(m)
    return head, turns


def _removal_order(n_turns: int, policy: str) -> list[int]:
    """Indices of the turns that may be left out (never the last), in the order they go."""
    droppable = list(range(n_turns - 1))
    if policy == TRUNCATE_MIDDLE and len(droppable) > 1:
        return droppable[1:] + droppable[:1]  # keep the first exchange as long as possible
    return droppable


async def fit_messages(messages: list[dict], count: Count, max_len: int, max_tokens: int,
                       policy: str = DEFAULT_POLICY, min_reply: int = MIN_REPLY) -> Fit:
    """The messages and max tokens of the next request under ``policy`` (see the module's doc)."""
    if policy not in POLICIES:
        policy = DEFAULT_POLICY
    max_tokens = max(1, int(max_tokens))
    least = max(1, min(min_reply, max_tokens))
    full = await count(messages)
    fit = Fit(list(messages), max_tokens, full, full, max_len, requested=max_tokens)
    if full + max_tokens <= max_len:
        return fit

    head, turns = _turns(messages)
    order = _removal_order(len(turns), policy) if policy != STOP else []

    def without(k: int) -> list[dict]:
        gone = set(order[:k])
        return head + [m for j, t in enumerate(turns) for m in t if j not in gone]

    counts = {0: full}

    async def tokens(k: int) -> int:
        if k not in counts:
            counts[k] = await count(without(k))
        return counts[k]

    k = 0
    if order:
        lo, hi = 1, len(order)  # the fewest turns to leave out so that the whole reply fits
        if await tokens(hi) + max_tokens <= max_len:
            while lo < hi:
                mid = (lo + hi) // 2
                if await tokens(mid) + max_tokens <= max_len:
                    hi = mid
                else:
                    lo = mid + 1
            k = lo
        else:
            k = len(order)  # even so the reply must be clamped
    n = await tokens(k)
    kept = without(k)
    fit.messages, fit.prompt_tokens, fit.dropped = kept, n, len(messages) - len(kept)
    room = max_len - n
    if room >= max_tokens:
        return fit
    if room >= least:
        fit.max_tokens, fit.clamped = room, True
        return fit
    if policy == STOP:
        fit.error = (f"The conversation has {full:,} tokens and the model's context holds {max_len:,}: no room is "
                     "left for a reply. Start a new chat, or choose an overflow policy that leaves out old turns.")
    else:
        fit.error = (f"The last message alone takes {n:,} of the model's {max_len:,} tokens of context: no room is "
                     "left for a reply. Shorten it, or load the model with a longer context.")
    return fit
