"""`kestrel bench offline --speculative '<json>'`: decode with and without speculative decoding on one loaded model,
in one run, the two arms interleaved (plain, speculative, plain, ...) so that a busy machine slows both alike.

Two prompt kinds, greedy at batch 1 (both arms emit the same tokens; the report says whether they did):
- ``code``: repeat a 300-line Python file with one rename (what prompt lookup is for: the answer copies the prompt);
- ``chat``: a plain question (proposals rarely match: the back-off must keep it as fast as plain decoding).
Per kind and arm: decode tok/s (first token to last), and for the speculative arm the acceptance rate and the
tokens per verify pass."""

from __future__ import annotations

import statistics
import time

CODE_LINES = 300
RENAME = ("compute_total", "compute_sum")


WORDS = ("order invoice customer ledger balance account payment refund tax discount shipment parcel route "
         "warehouse stock item price label report summary batch record entry journal period budget forecast "
         "supplier vendor contract region branch").split()


def code_file(lines: int = CODE_LINES, seed: int = 7) -> str:
    """A deterministic Python file of ``lines`` lines: a bookkeeping module of varied small functions and
    dataclasses (names and constants drawn from ``seed``, so that a model must copy it rather than guess it)."""
    import random

    rng = random.Random(seed)
    out = ['"""Bookkeeping helpers for the warehouse ledger."""', "", "import math",
           "from dataclasses import dataclass", ""]
    while len(out) < lines - 8:
        a, b, c = rng.sample(WORDS, 3)
        k = rng.randint(2, 97)
        kind = rng.randrange(4)
        if kind == 0:
            body = [f"def {a}_{b}_total({a}s, {c}_rate={k / 10}):",
                    f'    """Sum the {a}s of a {b}, scaled by the {c} rate."""', "    total = 0.0",
                    f"    for {a} in {a}s:", f"        total += {a}.amount * {c}_rate",
                    f"    return round(total, {k % 4 + 1})"]
        elif kind == 1:
            body = [f"def find_{a}_by_{b}({a}s, {b}_id):", f"    for {a} in {a}s:", f"        if {a}.{b}_id == {b}_id:",
                    f"            return {a}", f'    raise KeyError(f"no {a} for {b} {{{b}_id}}")']
        elif kind == 2:
            body = ["@dataclass", f"class {a.title()}{b.title()}:", f"    {a}_id: int",
                    f'    {c}: str = "{rng.choice(WORDS)}"', f"    limit: int = {k * 10}"]
        else:
            body = [f"def {a}_{c}_ratio({a}, {c}):", f"    if not {c}:", "        return 0.0",
                    f"    return math.floor({a} * {k} / {c}) / {k}"]
        out += body + [""]
    out += [f"def {RENAME[0]}(values):", "    total = 0", "    for v in values:", "        total += v",
            "    return total", "", f"print({RENAME[0]}([1, 2, 3]))"]
    return "\n".join(out[:lines]) + "\n"


def prompts(tokenizer, lines: int = CODE_LINES) -> dict[str, list[int]]:
    """The two prompts' token ids. The code prompt's answer is started for the model (the assistant turn opens
    with the code fence and the file's first 4 lines, as a "continue" would): the embedded 135M model otherwise
    writes a short function of its own instead of the file."""
    code = code_file(lines)
    ask = (f"Repeat this Python file exactly, but rename the function {RENAME[0]} to {RENAME[1]}. Output only "
           f"the code.\n\n{code}")
    chat = "Write a short friendly paragraph about why people enjoy walking in the park on a sunny morning."

    def ids(text):
        return tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                             tokenize=True)

    started = "```python\n" + "\n".join(code.splitlines()[:4]) + "\n"
    return {"code": ids(ask) + tokenizer.encode(started, add_special_tokens=False), "chat": ids(chat)}


def decode_run(llm, ids: list[int], gen_len: int) -> dict:
    """One greedy request: decode tok/s from its first token to its last, its tokens, and the speculative counts
    of this run (zeros without)."""
    from engine.sampling_params import SamplingParams

    core = llm.core  # (the prefix cache keeps the prompt between runs: decode is what is measured)
    before = _counts(core)
    core.add_request(f"spec-bench-{time.monotonic_ns()}", None, SamplingParams(max_tokens=gen_len, temperature=0.0),
                     prompt_token_ids=ids)
    tokens: list[int] = []
    first = None
    while core.has_unfinished():
        for d in core.step():
            if first is None and d.token_ids:
                first, first_n = time.perf_counter(), len(d.token_ids)
            tokens += d.token_ids
    t = time.perf_counter() - first
    after = _counts(core)
    proposed, accepted, steps, emitted = (a - b for a, b in zip(after, before))
    return {"decode_tok_s": (len(tokens) - first_n) / t if t > 0 else 0.0, "tokens": tokens,
            "acceptance": accepted / proposed if proposed else 0.0,
            "tokens_per_step": emitted / steps if steps else 1.0, "verify_steps": steps}


def _counts(core) -> tuple[int, int, int, int]:
    if core.spec is None:
        return (0, 0, 0, 0)
    c = core.spec.counts
    return (c.proposed, c.accepted, c.verify_steps, c.emitted)


def run(llm, spec_json: str, gen_len: int, repeats: int) -> list[dict]:
    """Per prompt kind: both arms' median decode tok/s, the speedup, the acceptance and tokens per step."""
    rows = []
    core = llm.core
    lines = CODE_LINES
    while True:  # a model with a short context gets a shorter file (the row says how long)
        kinds = prompts(llm.tokenizer, lines)
        if len(kinds["code"]) + gen_len < core.max_model_len or lines <= 20:
            break
        lines -= 20
    for kind, ids in kinds.items():
        arms: dict[str, list[dict]] = {"plain": [], "speculative": []}
        decode_run(llm, ids[:64], 4)  # warm-up (the decode tape's first step records it)
        for _ in range(repeats):
            for arm in ("plain", "speculative"):
                core.set_speculative(spec_json if arm == "speculative" else None)
                arms[arm].append(decode_run(llm, ids, gen_len))
        core.set_speculative(None)
        med = {a: statistics.median(r["decode_tok_s"] for r in runs) for a, runs in arms.items()}
        s = arms["speculative"]
        rows.append({
            "prompt": kind, "prompt_tokens": len(ids), "generated": len(s[0]["tokens"]),
            "code_lines": lines if kind == "code" else None,
            "plain_decode_tok_s": med["plain"], "speculative_decode_tok_s": med["speculative"],
            "speedup": med["speculative"] / med["plain"] if med["plain"] else 0.0,
            "plain_runs": [round(r["decode_tok_s"], 2) for r in arms["plain"]],
            "speculative_runs": [round(r["decode_tok_s"], 2) for r in s],
            "acceptance": statistics.median(r["acceptance"] for r in s),
            "tokens_per_step": statistics.median(r["tokens_per_step"] for r in s),
            "same_tokens": all(r["tokens"] == arms["plain"][0]["tokens"] for r in s + arms["plain"]),
        })
        print_row(rows[-1])
    return rows


def print_row(r: dict) -> None:
    print(f"{r['prompt']:5s} prompt {r['prompt_tokens']:5d} tok, {r['generated']:4d} generated: decode "
          f"{r['plain_decode_tok_s']:7.2f} tok/s plain, {r['speculative_decode_tok_s']:7.2f} speculative "
          f"(x{r['speedup']:.2f}); acceptance {r['acceptance']:.2f}, {r['tokens_per_step']:.2f} tokens per verify "
          f"pass; same tokens: {r['same_tokens']}", flush=True)
