"""Speculative decoding made visible: the engine stats' counts on /metrics (vLLM's spec_decode names) and in the
Performance panel's summary line."""

from __future__ import annotations

import pytest

from engine.wire import EngineStats


def _stats(**kw):
    return EngineStats(spec_method="ngram k=4 lookup 2..4", spec_proposed_total=40, spec_accepted_total=30,
                       spec_verify_steps_total=10, spec_emitted_total=40, **kw)


def test_prometheus_shows_the_counts_and_rates():
    pytest.importorskip("prometheus_client")
    from prometheus_client import generate_latest

    from engine.metrics import PrometheusMetrics

    m = PrometheusMetrics("m")
    m.update(_stats())
    page = generate_latest(m.registry).decode()
    assert 'kestrel_spec_decode_num_draft_tokens_total{model_name="m"} 40.0' in page
    assert 'kestrel_spec_decode_num_accepted_tokens_total{model_name="m"} 30.0' in page
    assert 'kestrel_spec_decode_num_drafts_total{model_name="m"} 10.0' in page
    assert 'kestrel_spec_decode_acceptance_rate{model_name="m"} 0.75' in page
    assert 'kestrel_spec_decode_tokens_per_step{model_name="m"} 4.0' in page
    m.update(EngineStats())  # off (or a fresh engine): rates at 0, counters never go back
    page = generate_latest(m.registry).decode()
    assert 'kestrel_spec_decode_acceptance_rate{model_name="m"} 0.0' in page
    assert 'kestrel_spec_decode_num_draft_tokens_total{model_name="m"} 40.0' in page


def test_performance_summary_names_acceptance_and_tokens_per_step():
    pytest.importorskip("pyqtgraph")
    from app.panels.performance import speculative_text

    assert speculative_text(EngineStats()) == ""
    text = speculative_text(_stats())
    assert "75% accepted" in text and "4.00 tokens per step" in text and "ngram" in text
