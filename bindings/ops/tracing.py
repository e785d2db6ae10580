"""The engine's per-batch spans (:mod:`pyharvest.core.telemetry.spans`) recorded with OpenTelemetry.

Off unless OpenTelemetry is configured: with ``opentelemetry-api`` installed but no tracer
provider set (the API's default is a proxy that records nothing), no span is started. Once the
application sets one (``trace.set_tracer_provider(...)``, or ``opentelemetry-instrument``), the
next batch is traced, whenever that happens. :class:`pyharvest.Harvest` installs this recorder
when ``opentelemetry-api`` is importable; an engine built by hand needs :func:`install`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pyharvest.core.telemetry.spans import Description, Span, install_recorder, recorder

__all__ = ["OpenTelemetryRecorder", "install"]


class _OtelSpan:
    __slots__ = ("_span",)

    def __init__(self, span: Any) -> None:
        self._span = span

    def set(self, key: str, value: str | int | bool) -> None:
        self._span.set_attribute(key, value)

    def fail(self, error: BaseException) -> None:
        from opentelemetry.trace import Status, StatusCode

        self._span.record_exception(error)
        self._span.set_attribute("error.type", type(error).__qualname__)
        self._span.set_status(Status(StatusCode.ERROR, str(error)))

    def end(self) -> None:
        self._span.end()


class OpenTelemetryRecorder:
    """Starts spans through ``provider``, or the global tracer provider once one is configured."""

    def __init__(self, provider: Any = None) -> None:
        from opentelemetry import trace

        self._trace = trace
        self._provider = provider
        self._tracer: Any = None
        self._kinds = {"client": trace.SpanKind.CLIENT, "producer": trace.SpanKind.PRODUCER,
                       "internal": trace.SpanKind.INTERNAL}

    def _tracer_now(self) -> Any:
        tracer = self._tracer
        if tracer is not None:
            return tracer
        provider = self._provider or self._trace.get_tracer_provider()
        if isinstance(provider, self._trace.ProxyTracerProvider | self._trace.NoOpTracerProvider):
            return None  # nothing configured (yet): tracing stays off, at the cost of this check
        from importlib.metadata import PackageNotFoundError, version

        try:
            release = version("pyharvest")
        except PackageNotFoundError:
            release = None
        self._tracer = provider.get_tracer("pyharvest", release)
        return self._tracer

    def start(self, describe: Callable[[], Description]) -> Span | None:
        tracer = self._tracer_now()
        if tracer is None:
            return None
        name, kind, attributes = describe()
        return _OtelSpan(tracer.start_span(name, kind=self._kinds.get(kind, self._trace.SpanKind.INTERNAL),
                                           attributes=dict(attributes)))


def install(provider: Any = None) -> bool:
    """Record the engines' spans with OpenTelemetry (through ``provider``, or the global one
    once configured). False, and nothing installed, without ``opentelemetry-api``. A recorder
    already installed is kept unless ``provider`` is given."""
    if recorder() is not None and provider is None:
        return True
    try:
        install_recorder(OpenTelemetryRecorder(provider))
    except ImportError:
        return False
    return True
