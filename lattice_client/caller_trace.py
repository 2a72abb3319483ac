"""The caller's trace context on a submitted run (``submit(..., trace_parent=)``).

A service that submits a run inside its own trace (an HTTP request's span,
say) passes that trace's propagation headers, and the run's trace root
becomes a child of the caller's span, in the caller's trace. Without
``trace_parent`` the active OpenTelemetry context is used when
``opentelemetry`` is installed and a valid span is current; otherwise the run
starts a trace of its own.

The carrier (``dict[str, str]``: W3C ``traceparent`` / ``tracestate``,
``langsmith-trace`` / ``langsmith-baggage``, ``langfuse-traceparent``) is
kept in the run's metadata under :data:`CALLER_KEY` as
``{"trace_carrier": {...}}``; the lead's first traced segment reads it
(``lattice_worker/runtime/run/trace.py``). The client never imports a tracer
of its own: OpenTelemetry only when it is installed.
"""

from __future__ import annotations

import re
from typing import Any

CALLER_KEY = "lattice_caller"
"""The run-metadata key holding ``{"trace_carrier": <the caller's carrier>}``."""

TRACEPARENT = re.compile(r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")
"""A W3C ``traceparent`` header value (version-trace id-parent id-flags, lowercase hex)."""

_MAX_HEADER_CHARS = 4096


def caller_carrier(trace_parent: Any = None) -> dict[str, str] | None:
    """The carrier for ``trace_parent``: a ``traceparent`` string, a
    ``dict[str, str]`` of propagation headers (returned as given), or ``None``
    for the active OpenTelemetry context (``None`` again when OpenTelemetry is
    not installed or no valid span is current).

    Raises ``ValueError`` for a malformed ``traceparent``, a dict that is not
    of strings (or over 4096 characters a value), or any other type."""
    if trace_parent is None:
        return _active_otel_carrier()
    if isinstance(trace_parent, str):
        if not TRACEPARENT.fullmatch(trace_parent):
            raise ValueError(
                f"trace_parent {trace_parent[:80]!r} is not a W3C traceparent "
                "('00-<32 hex trace id>-<16 hex span id>-<2 hex flags>'); pass the headers as a dict otherwise"
            )
        return {"traceparent": trace_parent}
    if isinstance(trace_parent, dict):
        carrier: dict[str, str] = {}
        for key, value in trace_parent.items():
            if not isinstance(key, str) or not isinstance(value, str) or len(value) > _MAX_HEADER_CHARS:
                raise ValueError(
                    "trace_parent must map header names to strings of at most "
                    f"{_MAX_HEADER_CHARS} characters, got {key!r}: {type(value).__name__}"
                )
            carrier[key.lower()] = value
        if "traceparent" in carrier and not TRACEPARENT.fullmatch(carrier["traceparent"]):
            raise ValueError(
                f"trace_parent['traceparent'] {carrier['traceparent'][:80]!r} is not a W3C traceparent"
            )
        return carrier or None
    raise ValueError(
        f"trace_parent must be a traceparent string or a dict of headers, got {type(trace_parent).__name__}"
    )


def _active_otel_carrier() -> dict[str, str] | None:
    try:
        from opentelemetry import propagate, trace
    except ImportError:
        return None
    if not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier or None


def with_caller_trace(metadata: dict[str, Any] | None, trace_parent: Any = None) -> dict[str, Any] | None:
    """``metadata`` with the caller's carrier (:func:`caller_carrier`) under
    :data:`CALLER_KEY` -- a copy; ``metadata`` itself when there is none.
    Raises ``ValueError`` like :func:`caller_carrier`."""
    carrier = caller_carrier(trace_parent)
    if carrier is None:
        return metadata
    if metadata is not None and not isinstance(metadata, dict):
        return metadata  # refused by submit's own check, with its message
    return {**(metadata or {}), CALLER_KEY: {"trace_carrier": carrier}}


__all__ = ["CALLER_KEY", "TRACEPARENT", "caller_carrier", "with_caller_trace"]
