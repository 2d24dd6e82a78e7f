"""The overflow policies of a chat turn (app.chat_context), with a counter of one token per character."""

from __future__ import annotations

import asyncio

from app.chat_context import DROP_OLDEST, STOP, TRUNCATE_MIDDLE, fit_messages


async def _count(messages):
    return sum(len(m["content"]) + 2 for m in messages)  # 2 tokens of template per message


def _conv(n_turns: int, size: int = 10, system: str | None = "S" * 8) -> list[dict]:
    msgs = [{"role": "system", "content": system}] if system else []
    for i in range(n_turns):
        msgs.append({"role": "user", "content": f"{i}" * size})
        msgs.append({"role": "assistant", "content": f"{i}" * size})
    return msgs + [{"role": "user", "content": "q" * size}]


def fit(msgs, max_len, max_tokens, policy):
    return asyncio.run(fit_messages(msgs, _count, max_len, max_tokens, policy))


def test_fits_as_it_is():
    msgs = _conv(2)
    f = fit(msgs, 200, 50, DROP_OLDEST)
    assert f.ok and f.messages == msgs and f.max_tokens == 50 and not f.dropped and not f.clamped
    assert f.prompt_tokens == f.full_prompt_tokens == 10 + 5 * 12 and f.summary() == ""


def test_drop_oldest_keeps_the_system_prompt_and_leaves_out_whole_turns():
    msgs = _conv(5)  # 10 + 11 * 12 = 142 tokens
    f = fit(msgs, 160, 50, DROP_OLDEST)  # the prompt must shrink to 110: two turns (24 tokens each) go
    assert f.ok and f.max_tokens == 50 and not f.clamped
    assert f.messages[0]["role"] == "system" and f.messages[-1] == msgs[-1]
    assert [m["role"] for m in f.messages[1:]] == ["user", "assistant"] * ((len(f.messages) - 2) // 2) + ["user"]
    assert f.prompt_tokens + 50 <= 160 and f.prompt_tokens + 50 + 24 > 160  # the fewest turns left out
    assert f.messages[1]["content"].startswith("2") and f.dropped == 4
    assert "4 earlier messages left out" in f.summary()


def test_truncate_middle_keeps_the_first_exchange():
    msgs = _conv(5)
    f = fit(msgs, 160, 50, TRUNCATE_MIDDLE)
    assert f.ok and f.messages[:3] == msgs[:3] and f.messages[-1] == msgs[-1]
    assert f.messages[3]["content"].startswith("3") and f.prompt_tokens + 50 <= 160


def test_reply_is_clamped_when_dropping_is_not_enough():
    msgs = _conv(3)
    f = fit(msgs, 60, 1024, DROP_OLDEST)  # system + last question: 10 + 12 = 22 tokens
    assert f.ok and f.messages == [msgs[0], msgs[-1]] and f.clamped and f.max_tokens == 38
    assert "reply limited to 38 tokens" in f.summary()


def test_stop_policy_clamps_then_refuses():
    msgs = _conv(3)  # 10 + 7 * 12 = 94 tokens
    f = fit(msgs, 120, 50, STOP)
    assert f.ok and f.messages == msgs and f.clamped and f.max_tokens == 26
    f = fit(msgs, 100, 50, STOP)
    assert not f.ok and "94 tokens" in f.error and f.messages == msgs


def test_a_last_message_too_long_alone_is_refused():
    msgs = _conv(1, size=100)
    f = fit(msgs, 100, 50, DROP_OLDEST)
    assert not f.ok and "last message" in f.error


def test_the_issue_case_2048_context_1024_reply():
    msgs = _conv(20, size=40, system=None)  # 41 * 42 = 1722 tokens: 1722 + 1024 > 2048
    f = fit(msgs, 2048, 1024, DROP_OLDEST)
    assert f.ok and f.max_tokens == 1024 and f.prompt_tokens + 1024 <= 2048 and f.messages[-1] == msgs[-1]
