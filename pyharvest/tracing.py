"""Trace propagation through the outbox: W3C Trace Context headers for stashed records.

A record stashed inside a traced request can carry that request's trace to its consumers:
the stasher (``propagate_trace=True``) adds ``traceparent`` and, when there is one,
``tracestate`` to the record's headers, and the harvester publishes them as Kafka headers
unchanged. Consumers instrumented with OpenTelemetry continue the trace.

OpenTelemetry is optional (``pip install 'pyharvest[otel]'``, which is
``opentelemetry-api``): without it, or outside a recorded span, nothing is added.

>>> from pyharvest.tracing import trace_headers
>>> trace_headers()          # outside any span
[]
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from pyharvest.core.outbox.records import Header

__all__ = ["TRACE_HEADERS", "available", "trace_headers", "with_trace_headers"]

#: The header names of W3C Trace Context.
TRACE_HEADERS: tuple[str, str] = ("traceparent", "tracestate")

_UNSET: Any = object()
_propagator: Any = _UNSET  # the W3C propagator, or None when OpenTelemetry is missing
_lock = threading.Lock()


def _w3c_propagator() -> Any:
    global _propagator
    p = _propagator
    if p is _UNSET:
        with _lock:
            if _propagator is _UNSET:
                try:
                    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
                except ImportError:
                    _propagator = None
                else:
                    _propagator = TraceContextTextMapPropagator()
            p = _propagator
    return p


def available() -> bool:
    """Whether ``opentelemetry-api`` is importable."""
    return _w3c_propagator() is not None


def trace_headers(context: Any = None, *, use_global_propagator: bool = False) -> list[tuple[str, str]]:
    """Headers that carry the current trace (or that of ``context``, an OpenTelemetry
    ``Context``): ``[("traceparent", ...), ("tracestate", ...)]``, the second only if the span
    has trace state. Empty when OpenTelemetry is not installed or no valid span is current.

    ``use_global_propagator=True`` injects with the application's configured propagator
    instead (``opentelemetry.propagate``: W3C by default, plus baggage, B3... as configured).
    """
    propagator = _w3c_propagator()
    if propagator is None:
        return []
    if use_global_propagator:
        from opentelemetry import propagate

        propagator = propagate.get_global_textmap()
    carrier: dict[str, str] = {}
    propagator.inject(carrier, context=context)
    # Fixed order for the W3C pair, then whatever else a global propagator added.
    ordered = [name for name in TRACE_HEADERS if name in carrier]
    ordered += sorted(name for name in carrier if name not in TRACE_HEADERS)
    return [(name, carrier[name]) for name in ordered]


def with_trace_headers(headers: Sequence[Header], context: Any = None, **kwargs: Any) -> list[Header]:
    """``headers`` plus :func:`trace_headers`, unless they already carry a ``traceparent``
    (the caller's explicit choice wins); always a new list."""
    out = list(headers)
    if any(name.lower() == "traceparent" for name, _ in out):
        return out
    out.extend(trace_headers(context, **kwargs))
    return out
