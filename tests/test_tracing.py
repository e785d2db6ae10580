"""W3C Trace Context headers for stashed records, with OpenTelemetry installed and without."""

from __future__ import annotations

import re
import sys

import pytest

from pyharvest import tracing

TRACEPARENT = re.compile(r"00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")


@pytest.fixture
def fresh_tracing(monkeypatch):
    """Forget whether OpenTelemetry was found, so a test can hide it."""
    monkeypatch.setattr(tracing, "_propagator", tracing._UNSET)
    return tracing


@pytest.fixture
def tracer():
    pytest.importorskip("opentelemetry.sdk.trace")
    from opentelemetry.sdk.trace import TracerProvider

    # A provider of our own: the global one can be set only once per process.
    return TracerProvider().get_tracer("pyharvest-tests")


def test_no_headers_outside_a_span():
    pytest.importorskip("opentelemetry")
    assert tracing.available()
    assert tracing.trace_headers() == []
    assert tracing.with_trace_headers([("a", "b")]) == [("a", "b")]


def test_headers_carry_the_current_span(tracer):
    with tracer.start_as_current_span("request") as span:
        headers = tracing.trace_headers()
        ctx = span.get_span_context()
    assert [name for name, _ in headers] == ["traceparent"]
    value = headers[0][1]
    assert TRACEPARENT.fullmatch(value)
    assert value == f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def test_tracestate_comes_along_when_the_span_has_one(tracer):
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

    parent = SpanContext(
        trace_id=0x4BF92F3577B34DA6A3CE929D0E0E4736, span_id=0x00F067AA0BA902B7, is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED), trace_state=TraceState([("vendor", "value")]),
    )
    context = trace.set_span_in_context(NonRecordingSpan(parent))
    assert tracing.trace_headers(context) == [
        ("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
        ("tracestate", "vendor=value"),
    ]
    # A child span continues the trace (same trace id, its own span id).
    with tracer.start_as_current_span("child", context=context):
        (_, value), (_, state) = tracing.trace_headers()
    assert value.startswith("00-4bf92f3577b34da6a3ce929d0e0e4736-") and not value.endswith("00f067aa0ba902b7-01")
    assert state == "vendor=value"


def test_existing_traceparent_is_kept(tracer):
    mine = [("TraceParent", "00-11111111111111111111111111111111-2222222222222222-01"), ("x", b"y")]
    with tracer.start_as_current_span("request"):
        assert tracing.with_trace_headers(mine) == mine
        added = tracing.with_trace_headers([("x", b"y")])
    assert added[0] == ("x", b"y") and added[1][0] == "traceparent"


def test_global_propagator_can_be_used(tracer):
    from opentelemetry import baggage, context

    token = context.attach(baggage.set_baggage("tenant", "acme"))
    try:
        with tracer.start_as_current_span("request"):
            w3c = dict(tracing.trace_headers())
            configured = dict(tracing.trace_headers(use_global_propagator=True))
    finally:
        context.detach(token)
    assert "baggage" not in w3c
    assert configured["baggage"] == "tenant=acme" and "traceparent" in configured


def test_without_opentelemetry_nothing_is_added(fresh_tracing, monkeypatch):
    for name in [m for m in sys.modules if m == "opentelemetry" or m.startswith("opentelemetry.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # makes `import opentelemetry...` fail
    assert not fresh_tracing.available()
    assert fresh_tracing.trace_headers() == []
    assert fresh_tracing.with_trace_headers([("a", "b")]) == [("a", "b")]
