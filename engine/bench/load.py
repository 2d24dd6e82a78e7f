"""The load generator of `kestrel bench serve` / `sweep`, for any OpenAI-compatible endpoint: datasets, arrival
times, the asyncio runner (httpx, streaming) and the metrics, with the definitions of vLLM's `bench serve`:

- TTFT: request sent -> first chunk carrying generated text. E2E latency (e2el): request sent -> last byte.
- TPOT: (e2el - ttft) / (output tokens - 1), per request with more than one output token (the first token is
  excluded); ITL: the gaps between successive chunks carrying text, pooled over all requests.
- Output tokens: the server's ``usage`` (``stream_options: {include_usage: true}``) when it sends one, else the
  request's max tokens when it finished for length, else the number of chunks carrying text. Input tokens: ``usage.prompt_tokens``, else the dataset's target length.
- Throughput over the benchmark's duration (first request sent -> last request finished): completed requests,
  input, output and total tokens per second. Goodput: completed requests per second meeting every SLO given
  (``ttft``, ``tpot``, ``e2el`` in ms; a request with one output token counts TPOT 0).
- Statistics in ms: mean, median, std and the percentiles asked for (numpy's linear interpolation).

Arrivals: all at once (rate inf) or a gamma process of mean rate ``request_rate`` whose shape is the
``burstiness`` (1: Poisson; < 1 burstier, > 1 more regular), seeded; ``max_concurrency`` caps requests in
flight. Nothing here imports the engine: the bench runs against any server from any machine with httpx."""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import random
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

# words of one token each in most BPE vocabularies: the prompts when no tokenizer is reachable
WORDS = ("the", "of", "and", "to", "in", "is", "was", "for", "on", "that", "with", "as", "by", "at",
         "from", "his", "her", "an", "it", "be", "are", "this", "which", "or", "had", "not", "but", "have",
         "one", "were", "they", "all", "new", "two", "been", "their", "has", "first", "more", "after",
         "also", "who", "its", "time", "other", "into", "than", "some", "only", "over", "made", "may",
         "such", "most", "many", "these", "then", "them", "three", "years", "city", "world", "would", "up",
         "out", "about", "when", "there", "year", "work", "used", "number", "part", "state", "could",
         "can", "under", "war", "team", "life", "where", "while", "later", "known")


@dataclass
class SampleRequest:
    prompt: str
    prompt_len: int  # the dataset's target (the server's usage, when sent, is what the metrics count)
    max_tokens: int


@dataclass
class RequestResult:
    index: int
    success: bool = False
    error: str = ""
    prompt_len: int = 0  # tokens: usage.prompt_tokens, else the dataset's target
    output_tokens: int = 0
    usage_reported: bool = False
    ttft: float = 0.0  # seconds
    e2el: float = 0.0
    itl: list[float] = field(default_factory=list)
    chunks: int = 0
    start: float = 0.0  # seconds since the benchmark started
    finish_reason: str | None = None
    generated_text: str = ""


# ------------------------------------------------------------------------------------------------
# tokens


class Tokenizer:
    """Token counts and random-token prompts: a local tokenizer.json (``tokenizers``), else the server's
    /tokenize and /detokenize (Kestrel, vLLM), else words and a 4-characters-per-token estimate."""

    def __init__(self, kind: str = "estimate", tok=None, http=None, base_url: str = "", model: str | None = None,
                 vocab_size: int | None = None):
        self.kind, self._tok, self._http, self._base, self._model = kind, tok, http, base_url, model
        self.vocab_size = vocab_size or (tok.get_vocab_size() if tok is not None else 32000)

    @classmethod
    def from_file(cls, path: str) -> Tokenizer:
        from pathlib import Path

        from tokenizers import Tokenizer as HFTokenizer

        p = Path(path)
        return cls("local", HFTokenizer.from_file(str(p / "tokenizer.json" if p.is_dir() else p)))

    @classmethod
    def probe_server(cls, http, base_url: str, model: str | None, vocab_size: int | None) -> Tokenizer:
        """The server's /detokenize and /tokenize when both answer (synchronous httpx client), else estimates."""
        try:
            r = http.post(f"{base_url}/detokenize", json={"model": model, "tokens": [1000, 1001]}, timeout=30)
            r2 = http.post(f"{base_url}/tokenize", json={"model": model, "prompt": "hello world"}, timeout=30)
            ok = r.status_code == 200 and r2.status_code == 200 and "prompt" in r.json() and "tokens" in r2.json()
        except Exception:  # noqa: BLE001 - any failure: no server tokenizer
            ok = False
        if ok:
            return cls("server", http=http, base_url=base_url, model=model, vocab_size=vocab_size)
        return cls("estimate", vocab_size=vocab_size)

    def count(self, text: str) -> int:
        if self.kind == "local":
            return len(self._tok.encode(text, add_special_tokens=False).ids)
        if self.kind == "server":
            r = self._http.post(f"{self._base}/tokenize",
                                json={"model": self._model, "prompt": text, "add_special_tokens": False})
            r.raise_for_status()
            return len(r.json()["tokens"])
        return max(1, round(len(text) / 4))

    def random_text(self, rng: random.Random, n: int) -> str:
        if n <= 0:
            return ""
        if self.kind == "estimate":
            return " ".join(rng.choice(WORDS) for _ in range(n))
        lo = min(1000, self.vocab_size // 10)  # past the special and byte tokens of common vocabularies
        ids = [rng.randrange(lo, self.vocab_size) for _ in range(n)]
        if self.kind == "local":
            return self._tok.decode(ids, skip_special_tokens=True)
        r = self._http.post(f"{self._base}/detokenize", json={"model": self._model, "tokens": ids})
        r.raise_for_status()
        return r.json()["prompt"]


# ------------------------------------------------------------------------------------------------
# datasets


def _lengths(rng: random.Random, n: int, mean: int, ratio: float) -> list[int]:
    """vLLM's random lengths: uniform integers in [mean * (1 - ratio), mean * (1 + ratio)], at least 1."""
    if not 0 <= ratio < 1:
        raise ValueError("--random-range-ratio must be in [0, 1)")
    lo, hi = max(1, math.floor(mean * (1 - ratio))), max(1, math.ceil(mean * (1 + ratio)))
    return [rng.randint(lo, hi) for _ in range(n)]


def random_dataset(tok: Tokenizer, n: int, input_len: int, output_len: int, range_ratio: float = 0.0,
                   seed: int = 0) -> list[SampleRequest]:
    rng = random.Random(seed)
    ins, outs = _lengths(rng, n, input_len, range_ratio), _lengths(rng, n, output_len, range_ratio)
    return [SampleRequest(tok.random_text(rng, i), i, o) for i, o in zip(ins, outs)]


def prefix_dataset(tok: Tokenizer, n: int, prefix_len: int, suffix_len: int, num_prefixes: int, output_len: int,
                   seed: int = 0) -> list[SampleRequest]:
    """vLLM's prefix_repetition: ``num_prefixes`` shared prefixes, each followed by its own random suffix;
    requests cycle through the prefixes, then are shuffled (seeded)."""
    rng = random.Random(seed)
    prefixes = [tok.random_text(rng, prefix_len) for _ in range(max(1, num_prefixes))]
    reqs = [SampleRequest(prefixes[i % len(prefixes)] + " " + tok.random_text(rng, suffix_len),
                          prefix_len + suffix_len, output_len) for i in range(n)]
    rng.shuffle(reqs)
    return reqs


def sharegpt_dataset(tok: Tokenizer, path: str, n: int, output_len: int | None = None,
                     seed: int = 0) -> list[SampleRequest]:
    """The first human turn of each conversation with at least two turns; its output length is the reply's
    token count (or ``output_len``). vLLM's filter: prompt and reply of 4 tokens or more, a prompt of at most
    1024 and prompt + reply of at most 2048 tokens."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    convs = [d["conversations"] for d in data if len(d.get("conversations", [])) >= 2]
    random.Random(seed).shuffle(convs)
    out: list[SampleRequest] = []
    for conv in convs:
        if len(out) == n:
            break
        prompt, reply = conv[0]["value"], conv[1]["value"]
        p_len = tok.count(prompt)
        o_len = output_len if output_len is not None else tok.count(reply)
        if output_len is None and (p_len < 4 or o_len < 4 or p_len > 1024 or p_len + o_len > 2048):
            continue
        out.append(SampleRequest(prompt, p_len, o_len))
    if len(out) < n:
        raise ValueError(f"{path}: only {len(out)} usable conversations for --num-prompts {n}")
    return out


# ------------------------------------------------------------------------------------------------
# arrivals


def arrival_delays(n: int, request_rate: float = math.inf, burstiness: float = 1.0, seed: int = 0) -> list[float]:
    """Seconds between request i and i + 1 (vLLM's get_request): 0 at an infinite rate, else gamma intervals of
    shape ``burstiness`` and scale 1 / (rate * burstiness), so the mean interval is 1 / rate."""
    if burstiness <= 0:
        raise ValueError("--burstiness must be positive")
    if math.isinf(request_rate):
        return [0.0] * n
    if request_rate <= 0:
        raise ValueError("--request-rate must be positive")
    rng = random.Random(seed)
    theta = 1.0 / (request_rate * burstiness)
    return [rng.gammavariate(burstiness, theta) for _ in range(n)]


# ------------------------------------------------------------------------------------------------
# requests


def request_body(endpoint_type: str, model: str, req: SampleRequest, *, ignore_eos: bool = False,
                 temperature: float = 0.0, extra: dict | None = None) -> dict:
    body: dict = {"model": model, "stream": True, "stream_options": {"include_usage": True},
                  "temperature": temperature}
    if endpoint_type == "chat":
        body["messages"] = [{"role": "user", "content": req.prompt}]
        body["max_completion_tokens"] = req.max_tokens
    else:
        body["prompt"] = req.prompt
        body["max_tokens"] = req.max_tokens
    if ignore_eos:
        body["ignore_eos"] = True
    body.update(extra or {})
    return body


async def send_request(http, url: str, body: dict, index: int, t0: float, headers: dict | None = None) \
        -> RequestResult:
    """One streaming request; times from the moment it is sent (perf_counter)."""
    res = RequestResult(index=index)
    chat = "messages" in body
    texts: list[str] = []
    start = time.perf_counter()
    res.start = start - t0
    last = start
    try:
        async with http.stream("POST", url, json=body, headers=headers) as r:
            if r.status_code != 200:
                res.error = f"HTTP {r.status_code}: {(await r.aread()).decode('utf-8', 'replace')[:300]}"
                return res
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    continue
                chunk = json.loads(data)
                if "error" in chunk:
                    res.error = str(chunk["error"].get("message", chunk["error"]))
                    return res
                now = time.perf_counter()
                for c in chunk.get("choices") or []:
                    if c.get("finish_reason"):
                        res.finish_reason = c["finish_reason"]
                    text = (c.get("delta") or {}).get("content") if chat else c.get("text")
                    if text:
                        if not res.chunks:
                            res.ttft = now - start
                        else:
                            res.itl.append(now - last)
                        res.chunks += 1
                        last = now
                        texts.append(text)
                usage = chunk.get("usage")
                if usage:
                    res.output_tokens = int(usage.get("completion_tokens") or 0)
                    res.prompt_len = int(usage.get("prompt_tokens") or 0)
                    res.usage_reported = True
        res.e2el = time.perf_counter() - start
        if not res.usage_reported:
            limit = body.get("max_completion_tokens") or body.get("max_tokens")
            # no usage (llama.cpp's server): a reply that stopped at the length limit generated exactly the
            # limit (a chunk may carry several tokens: held-back bytes of a multi-byte character), else a chunk
            # per token
            res.output_tokens = int(limit) if res.finish_reason == "length" and limit else res.chunks
        res.generated_text = "".join(texts)
        if not res.chunks:  # no text at all (e.g. EOS first): the first token came with the end
            res.ttft = res.e2el
        res.success = True
    except Exception as e:  # noqa: BLE001 - a failed request is counted, the run goes on
        res.error = f"{type(e).__name__}: {e}"
    return res


class Progress:
    """tqdm when installed, else a line on stderr rewritten in place."""

    def __init__(self, total: int, disable: bool = False, desc: str = ""):
        self.total, self.n, self.disable, self.desc, self._bar = total, 0, disable, desc, None
        if disable:
            return
        try:
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=desc or None, file=sys.stderr, dynamic_ncols=True)
        except ImportError:
            self._bar = None

    def update(self) -> None:
        self.n += 1
        if self.disable:
            return
        if self._bar is not None:
            self._bar.update(1)
        else:
            width = 30
            done = width * self.n // max(1, self.total)
            sys.stderr.write(f"\r{self.desc} [{'#' * done}{'.' * (width - done)}] {self.n}/{self.total}")
            sys.stderr.flush()

    def close(self) -> None:
        if self.disable:
            return
        if self._bar is not None:
            self._bar.close()
        else:
            sys.stderr.write("\n")


async def run_load(url: str, bodies: list[dict], *, delays: list[float] | None = None,
                   max_concurrency: int | None = None, headers: dict | None = None, num_warmups: int = 0,
                   warmup_body: dict | None = None, disable_progress: bool = False, timeout: float = 6 * 3600,
                   desc: str = "", on_result: Callable[[RequestResult], None] | None = None
                   ) -> tuple[list[RequestResult], float]:
    """Send ``bodies`` to ``url``, request i + 1 ``delays[i]`` seconds after request i (on an absolute schedule,
    so sleeping late does not add up; at most ``max_concurrency`` in flight, the others wait their turn), after
    ``num_warmups`` untimed requests. Returns the results in request order and the duration. ``on_result`` sees
    each result as its request ends (the app's live plots). Cancelling the awaiting task cancels the requests in
    flight."""
    import httpx

    n_conn = max(8, (max_concurrency or len(bodies)) + 8)
    limits = httpx.Limits(max_connections=n_conn, max_keepalive_connections=n_conn)
    sem = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(timeout)) as http:
        if num_warmups:
            wb = warmup_body or bodies[0]
            warm = await asyncio.gather(*(send_request(http, url, wb, -1, time.perf_counter(), headers)
                                          for _ in range(num_warmups)))
            bad = next((w for w in warm if not w.success), None)
            if bad is not None:
                raise RuntimeError(f"warm-up request failed: {bad.error}")
        bar = Progress(len(bodies), disable_progress, desc)

        async def one(i: int, body: dict, t0: float) -> RequestResult:
            if sem is None:
                r = await send_request(http, url, body, i, t0, headers)
            else:
                async with sem:
                    r = await send_request(http, url, body, i, t0, headers)
            bar.update()
            if on_result is not None:
                on_result(r)
            return r

        tasks = []
        t0 = time.perf_counter()
        due = 0.0  # request i is due delays[0] + ... + delays[i - 1] seconds after the start (the first at once)
        try:
            for i, body in enumerate(bodies):
                if i and delays:
                    due += delays[i - 1]
                    wait = t0 + due - time.perf_counter()
                    if wait > 0:
                        await asyncio.sleep(wait)
                tasks.append(asyncio.create_task(one(i, body, t0)))
            results = await asyncio.gather(*tasks)
        except asyncio.CancelledError:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            bar.close()
            raise
        duration = time.perf_counter() - t0
        bar.close()
    return list(results), duration


# ------------------------------------------------------------------------------------------------
# metrics


def _stats(name: str, values_s: list[float], percentiles: list[float]) -> dict:
    import numpy as np

    ms = np.asarray(values_s, dtype=float) * 1000.0 if values_s else np.zeros(1)
    out = {f"mean_{name}_ms": float(ms.mean()), f"median_{name}_ms": float(np.median(ms)),
           f"std_{name}_ms": float(ms.std())}
    for p in percentiles:
        out[f"p{p:g}_{name}_ms"] = float(np.percentile(ms, p))
    return out


def compute_metrics(results: list[RequestResult], duration: float, *, goodput: dict[str, float] | None = None,
                    percentile_metrics: tuple[str, ...] = ("ttft", "tpot", "itl", "e2el"),
                    percentiles: tuple[float, ...] = (50, 90, 99)) -> dict:
    """vLLM's calculate_metrics on the results of one run (``goodput``: SLOs in ms by metric name)."""
    ok = [r for r in results if r.success]
    ttfts = [r.ttft for r in ok]
    e2els = [r.e2el for r in ok]
    tpots = [(r.e2el - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    itls = [g for r in ok for g in r.itl]
    total_in = sum(r.prompt_len for r in ok)
    total_out = sum(r.output_tokens for r in ok)
    dur = max(duration, 1e-9)
    m = {"duration": duration, "completed": len(ok), "failed": len(results) - len(ok),
         "total_input_tokens": total_in, "total_output_tokens": total_out,
         "request_throughput": len(ok) / dur, "output_throughput": total_out / dur,
         "total_token_throughput": (total_in + total_out) / dur}
    if goodput:
        bad = set(goodput) - {"ttft", "tpot", "e2el"}
        if bad:
            raise ValueError(f"goodput SLOs are ttft, tpot and e2el, not {', '.join(sorted(bad))}")
        good = 0
        for r in ok:
            tpot = (r.e2el - r.ttft) / (r.output_tokens - 1) if r.output_tokens > 1 else 0.0
            got = {"ttft": r.ttft * 1000, "tpot": tpot * 1000, "e2el": r.e2el * 1000}
            good += all(got[k] <= v for k, v in goodput.items())
        m["good_completed"] = good
        m["request_goodput"] = good / dur
    series = {"ttft": ttfts, "tpot": tpots, "itl": itls, "e2el": e2els}
    for name in percentile_metrics:
        m.update(_stats(name, series[name], list(percentiles)))
    return m


def parse_goodput(items: list[str] | None) -> dict[str, float]:
    """``["ttft:500", "tpot:50"]`` -> {"ttft": 500.0, "tpot": 50.0} (ms)."""
    out: dict[str, float] = {}
    for item in items or []:
        name, _, value = item.partition(":")
        if name not in ("ttft", "tpot", "e2el") or not value:
            raise ValueError(f"--goodput takes ttft:MS tpot:MS e2el:MS, not {item!r}")
        if float(value) < 0:
            raise ValueError(f"--goodput {item!r}: the SLO must not be negative")
        out[name] = float(value)
    return out


def request_digest(body: dict) -> str:
    """A short hash of what was asked (prompt or messages, max tokens): equal for equal requests."""
    key = {k: body.get(k) for k in ("prompt", "messages", "max_tokens", "max_completion_tokens")}
    return hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def per_request(results: list[RequestResult], bodies: list[dict], samples: list[SampleRequest],
                with_text: bool = False) -> list[dict]:
    out = []
    for r, b, s in zip(results, bodies, samples):
        d = {"digest": request_digest(b), "target_input_len": s.prompt_len, "max_tokens": s.max_tokens,
             **{k: v for k, v in asdict(r).items() if k not in ("generated_text", "index")}}
        if with_text:
            d["generated_text"] = r.generated_text
        out.append(d)
    return out
