"""Per-request and per-engine statistics, and their Prometheus exposition.

``RequestRecord`` is what EngineClient hands its listeners once for every sequence, however it ended (plain
Python, for the GUI's plots too): the engine's finish reason, "abort" for one stopped (by the user, or an
HTTP client gone) and "error" for one that failed (refused, the engine's death), with the timings it had. ``PrometheusMetrics`` turns records and EngineStats snapshots into the /metrics page:

- histograms: time to first token, inter-token latency, end-to-end latency, queue time (seconds);
  prompt / generation tokens per request
- counters: prompt and generation tokens, finished requests by finish reason (as vLLM's request_success:
  aborted ones under finished_reason="abort", failed ones under "error"), prefix-cache queries and hits
  (tokens), preemptions
- gauges: running and waiting requests, KV-cache use (0..1), free and total KV blocks, prefix-cache hit
  rate, prompt and generation tokens/s (the engine's ``TokenRate`` over the last RATE_WINDOW_S seconds), engine
  health, engine restarting; counter of engine restarts

For rates in Prometheus use the counters, as with vLLM: ``rate(kestrel_generation_tokens_total[1m])``.

Latencies are measured as a user of the EngineClient sees them: from the moment the request was handed to
the client to the engine step that produced the token (so they include the trip to the engine process and
the wait in its queue). The queue time is the engine's own.
prometheus_client is imported only when PrometheusMetrics is built: the GUI does not need it.
"""

from __future__ import annotations

import time
from array import array
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

RATE_WINDOW_S = 5.0  # the tokens/s figures: tokens counted over the last 5 s


class TokenRate:
    """Tokens per second over a sliding window, from token counts and the times they were produced.

    ``add(n, t, start)`` counts ``n`` tokens produced by work that began at ``start`` and ended at ``t`` (an
    engine step). ``rate(now)`` is the tokens produced in the last ``window`` seconds over the window; when the
    engine sat idle for a whole window before, the window is cut to the time since the first tokens after the
    idle spell (those first tokens themselves mark the start and are not counted; with nothing after them yet,
    they count over the time of the step that made them). So a stream that starts after an idle spell reads
    its true rate from its first tokens on (not its tokens spread over the idle time, nor over its prefill),
    concurrent streams add up (every token counts), and an engine that stops producing reads 0 once
    ``window`` seconds have passed, whether or not anyone asks in between. Not thread-safe (one owner: the
    engine loop)."""

    def __init__(self, window: float = RATE_WINDOW_S, clock: Callable[[], float] = time.monotonic):
        self.window = float(window)
        self.clock = clock
        self.total = 0
        self._events: deque[tuple[float, int]] = deque()  # (time, tokens), oldest first
        self._in_window = 0  # sum of the tokens in _events
        self._opening: tuple[float, float, int] | None = None  # (start, time, tokens) of the first work after idle

    def add(self, n: int, t: float | None = None, start: float | None = None) -> None:
        if n <= 0:
            return
        t = self.clock() if t is None else t
        self._prune(t)
        if not self._events:  # idle for a whole window before: the count starts with this work
            self._opening = (t if start is None else min(start, t), t, n)
        self._events.append((t, n))
        self._in_window += n
        self.total += n

    def _prune(self, now: float) -> None:
        ev, cut = self._events, now - self.window
        while ev and ev[0][0] <= cut:
            self._in_window -= ev.popleft()[1]
        if not ev:
            self._opening = None

    def rate(self, now: float | None = None) -> float:
        now = self.clock() if now is None else now
        self._prune(now)
        if not self._events:
            return 0.0
        start, t_open, n_open = self._opening
        if t_open <= now - self.window:  # the window is full of work: the plain sliding window
            return self._in_window / self.window
        if len(self._events) > 1 and now > t_open:  # since the first tokens after idle
            return (self._in_window - n_open) / (now - t_open)
        return n_open / max(now - start, 1e-3)  # only the first tokens yet: over their own step


# latency buckets, seconds (CPU decode steps are slow, GPU ones fast: wide range)
_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                    10.0, 20.0, 40.0, 80.0, 160.0, 640.0)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
                0.4, 0.5, 0.75, 1.0, 2.5, 5.0)
_TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)


@dataclass
class RequestRecord:
    """One finished sequence (one of a request's n samples), stopped and failed ones too. Times are
    time.monotonic() seconds; ``first_token`` / ``last_token`` are None when no token came."""

    request_id: str
    index: int = 0
    arrival: float = 0.0  # handed to the EngineClient
    first_token: float | None = None  # engine step time of the first token
    last_token: float | None = None
    finished: float | None = None
    itl: array = field(default_factory=lambda: array("d"))  # inter-token latencies (seconds), in order
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    num_output_tokens: int = 0
    finish_reason: str | None = None
    queue_time: float | None = None  # engine: arrival -> first scheduled
    engine_ttft: float | None = None  # engine: arrival in the engine -> first token
    engine_e2e: float | None = None

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.arrival

    @property
    def e2e(self) -> float | None:
        return None if self.finished is None else self.finished - self.arrival

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first."""
        if self.first_token is None or self.last_token is None or self.num_output_tokens < 2:
            return None
        return (self.last_token - self.first_token) / (self.num_output_tokens - 1)


class PrometheusMetrics:
    """A registry of its own (several servers can live in one process, as in tests)."""

    def __init__(self, model_name: str = "", registry=None):
        # the server extra's (~0.1 s to import): only a server builds its metrics
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = registry or CollectorRegistry(auto_describe=True)
        labels = ["model_name"]
        self._labels = {"model_name": model_name}
        r = self.registry

        def hist(name, doc, buckets):
            return Histogram(name, doc, labels, buckets=buckets, registry=r).labels(**self._labels)

        self.ttft = hist("kestrel_time_to_first_token_seconds", "Time to first token", _LATENCY_BUCKETS)
        self.itl = hist("kestrel_inter_token_latency_seconds", "Inter-token latency", _ITL_BUCKETS)
        self.e2e = hist("kestrel_e2e_request_latency_seconds", "End-to-end request latency", _LATENCY_BUCKETS)
        self.queue = hist("kestrel_request_queue_time_seconds", "Time waiting in the engine's queue",
                          _LATENCY_BUCKETS)
        self.tpot = hist("kestrel_time_per_output_token_seconds", "Mean time per output token of a request",
                         _ITL_BUCKETS)
        self.req_prompt = hist("kestrel_request_prompt_tokens", "Prompt tokens per request", _TOKEN_BUCKETS)
        self.req_gen = hist("kestrel_request_generation_tokens", "Generated tokens per request", _TOKEN_BUCKETS)
        self._success = Counter("kestrel_request_success", "Finished requests", ["model_name", "finished_reason"],
                                registry=r)
        self.prompt_tokens = Counter("kestrel_prompt_tokens", "Prompt tokens computed by the engine (prefill)",
                                     labels, registry=r).labels(**self._labels)
        self.generation_tokens = Counter("kestrel_generation_tokens", "Tokens generated by the engine",
                                         labels, registry=r).labels(**self._labels)
        self.prefix_queries = Counter("kestrel_prefix_cache_queries", "Prompt tokens looked up in the prefix cache",
                                      labels, registry=r).labels(**self._labels)
        self.prefix_hits = Counter("kestrel_prefix_cache_hits", "Prompt tokens found in the prefix cache",
                                   labels, registry=r).labels(**self._labels)
        self.preemptions = Counter("kestrel_num_preemptions", "Requests preempted", labels,
                                   registry=r).labels(**self._labels)

        def gauge(name, doc):
            return Gauge(name, doc, labels, registry=r).labels(**self._labels)

        self.running = gauge("kestrel_num_requests_running", "Requests running in the engine")
        self.waiting = gauge("kestrel_num_requests_waiting", "Requests waiting in the engine's queue")
        self.kv_usage = gauge("kestrel_kv_cache_usage_perc", "KV-cache use (1 = full)")
        self.kv_free = gauge("kestrel_kv_cache_free_blocks", "Free KV-cache blocks")
        self.kv_total = gauge("kestrel_kv_cache_blocks", "KV-cache blocks")
        self.hit_rate = gauge("kestrel_prefix_cache_hit_rate", "Prefix-cache hit rate (tokens, since start)")
        self.prompt_rate = gauge("kestrel_prompt_tokens_per_second",
                                 f"Prompt tokens/s over the last {RATE_WINDOW_S:g} s (rate() of the counter is better)")
        self.gen_rate = gauge("kestrel_generation_tokens_per_second",
                              f"Generated tokens/s over the last {RATE_WINDOW_S:g} s (rate() of the counter is better)")
        self.healthy = gauge("kestrel_engine_healthy", "1 while the engine process runs")
        self.restarting = gauge("kestrel_engine_restarting", "1 while a dead engine process is being restarted")
        self.restarts = Counter("kestrel_engine_restarts", "Times the engine process was restarted after it died",
                                labels, registry=r).labels(**self._labels)
        self.hangs = Counter("kestrel_engine_hangs", "Times the engine process stopped answering (no heartbeat, or "
                             "a stuck loop) and was killed by the watchdog", labels, registry=r).labels(**self._labels)
        self.heartbeat_age = gauge("kestrel_engine_heartbeat_age_seconds",
                                   "Seconds since the engine process's last heartbeat (about 1 s apart)")
        # speculative decoding (vLLM's spec_decode counters): proposed, accepted, verify passes, their tokens
        self.spec_proposed = Counter("kestrel_spec_decode_num_draft_tokens", "Proposed tokens verified (speculative "
                                     "decoding)", labels, registry=r).labels(**self._labels)
        self.spec_accepted = Counter("kestrel_spec_decode_num_accepted_tokens", "Proposed tokens accepted",
                                     labels, registry=r).labels(**self._labels)
        self.spec_steps = Counter("kestrel_spec_decode_num_drafts", "Verify passes (request-steps with proposals)",
                                  labels, registry=r).labels(**self._labels)
        self.spec_acceptance = gauge("kestrel_spec_decode_acceptance_rate",
                                     "Accepted / proposed tokens since start (0 without speculative decoding)")
        self.spec_tokens_per_step = gauge("kestrel_spec_decode_tokens_per_step",
                                          "Tokens a verify pass emits on average (1 + accepted proposals)")
        self._totals: dict[str, float] = {}

    # fed by EngineClient.add_listener
    def observe(self, rec: RequestRecord) -> None:
        if rec.ttft is not None:
            self.ttft.observe(max(rec.ttft, 0.0))
        if rec.e2e is not None:
            self.e2e.observe(max(rec.e2e, 0.0))
        if rec.queue_time is not None:
            self.queue.observe(rec.queue_time)
        if rec.tpot is not None:
            self.tpot.observe(rec.tpot)
        obs = self.itl.observe
        for gap in rec.itl:
            obs(gap)
        self.req_prompt.observe(rec.num_prompt_tokens)
        self.req_gen.observe(rec.num_output_tokens)
        self._success.labels(finished_reason=rec.finish_reason or "unknown", **self._labels).inc()

    def _advance(self, counter, key: str, total: float) -> None:
        prev = self._totals.get(key, 0.0)
        if total > prev:
            counter.inc(total - prev)
        self._totals[key] = max(prev, total)

    CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

    @staticmethod
    def public_page(healthy: bool) -> bytes:
        """What /metrics shows a caller without the API key (when there is one): whether the engine is up,
        no model name, no traffic."""
        return (b"# HELP kestrel_engine_healthy 1 while the engine process runs (the other metrics need the API "
                b"key)\n# TYPE kestrel_engine_healthy gauge\nkestrel_engine_healthy "
                + (b"1.0" if healthy else b"0.0") + b"\n")

    def update(self, stats, healthy: bool = True, restarts: int = 0, restarting: bool = False, hangs: int = 0,
               heartbeat_age: float | None = None) -> None:
        """Refresh the engine-wide figures from an EngineStats snapshot (or None when the engine is gone)."""
        self.healthy.set(1 if healthy else 0)
        self.restarting.set(1 if restarting else 0)
        self.heartbeat_age.set(heartbeat_age or 0.0)
        if restarts > self._totals.get("restarts", 0.0):  # a new engine process counts from zero again
            self._totals = {k: self._totals.get(k, 0.0) for k in ("restarts", "hangs")}
        self._advance(self.restarts, "restarts", restarts)
        self._advance(self.hangs, "hangs", hangs)
        if stats is None:
            return
        self.running.set(stats.num_running)
        self.waiting.set(stats.num_waiting)
        self.kv_usage.set(stats.kv_usage)
        self.kv_free.set(stats.num_free_blocks)
        self.kv_total.set(stats.num_kv_blocks)
        self.hit_rate.set(stats.prefix_cache_hit_rate)
        self.prompt_rate.set(stats.prompt_tokens_per_s)
        self.gen_rate.set(stats.generation_tokens_per_s)
        self._advance(self.prompt_tokens, "prompt", stats.prompt_tokens_total)
        self._advance(self.generation_tokens, "gen", stats.generation_tokens_total)
        self._advance(self.prefix_queries, "pq", stats.prefix_cache_queries)
        self._advance(self.prefix_hits, "ph", stats.prefix_cache_hits)
        proposed, accepted = getattr(stats, "spec_proposed_total", 0), getattr(stats, "spec_accepted_total", 0)
        steps, emitted = getattr(stats, "spec_verify_steps_total", 0), getattr(stats, "spec_emitted_total", 0)
        self._advance(self.spec_proposed, "spec_proposed", proposed)
        self._advance(self.spec_accepted, "spec_accepted", accepted)
        self._advance(self.spec_steps, "spec_steps", steps)
        self.spec_acceptance.set(accepted / proposed if proposed else 0.0)
        self.spec_tokens_per_step.set(emitted / steps if steps else 0.0)
        self._advance(self.preemptions, "pre", stats.num_preemptions)

    def render(self) -> tuple[bytes, str]:
        # the server extra's, as above
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST
