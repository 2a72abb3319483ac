"""The ``ContextTracer`` protocol, the event envelope, and the emitter the
agent loop uses.

A trace event is a plain dict::

    {"version": 1, "timestamp": "2026-06-28T12:00:00.000Z", "session_id": ...,
     "run_id": ..., "seq": 1, "source": {"kind": "agent", "name": ...},
     "type": "user_message", "data": {...}}

``seq`` is assigned by the tracer instance (monotonically increasing per
tracer); every tracer this package builds fills ``seq`` when it is missing and
keeps it when present (so a composite numbers an event once for all children).
Tracing is observational: a failing tracer never fails a run unless the
tracer was created with ``fail_on_error=True``.
"""

from __future__ import annotations

import inspect
import itertools
import logging
import threading
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol, runtime_checkable

from ..errors import ConfigError

logger = logging.getLogger("lattice_worker.tracing")

TRACE_VERSION = 1

EVENT_TYPES = (
    "run_start",
    "user_message",
    "model_request",
    "assistant_message",
    "tool_use",
    "tool_result",
    "result",
    "compaction",
    "team_message",
    "team_agent",
)


@runtime_checkable
class ContextTracer(Protocol):
    """A trace sink. ``on_event`` may be sync or async; ``flush`` and ``close``
    are optional. ``fail_on_error`` (attribute, default False) is bound by the
    factory that built the tracer."""

    def on_event(self, event: dict[str, Any]) -> Awaitable[None] | None: ...


def now_iso() -> str:
    """UTC timestamp with milliseconds, ``2026-06-28T12:00:00.000Z``."""
    now = datetime.now(UTC)
    return now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z"


class SeqCounter:
    """Thread-safe monotonically increasing counter, one per tracer instance."""

    def __init__(self) -> None:
        self._it = itertools.count(1)
        self._lock = threading.Lock()

    def next(self) -> int:
        with self._lock:
            return next(self._it)


async def _maybe_await(value: Any) -> Any:
    if inspect.isawaitable(value):
        return await value
    return value


class DefinedContextTracer:
    """A tracer built by :func:`define_context_tracer`."""

    def __init__(
        self,
        on_event: Callable[[dict[str, Any]], Any],
        flush: Callable[[], Any] | None = None,
        close: Callable[[], Any] | None = None,
        fail_on_error: bool = False,
    ) -> None:
        self._on_event = on_event
        self._flush = flush
        self._close = close
        self.fail_on_error = fail_on_error
        self._seq = SeqCounter()

    async def on_event(self, event: dict[str, Any]) -> None:
        if event.get("seq") is None:
            event = {**event, "seq": self._seq.next()}
        await _maybe_await(self._on_event(event))

    async def flush(self) -> None:
        if self._flush is not None:
            await _maybe_await(self._flush())

    async def close(self) -> None:
        if self._close is not None:
            await _maybe_await(self._close())


def define_context_tracer(
    *,
    on_event: Callable[[dict[str, Any]], Any],
    flush: Callable[[], Any] | None = None,
    close: Callable[[], Any] | None = None,
    fail_on_error: bool = False,
) -> DefinedContextTracer:
    """Build a custom trace sink.

    ``on_event(event)`` receives each envelope dict with ``seq`` filled; it may
    be sync or async. Raises :class:`ConfigError` when ``on_event`` is not
    callable or ``flush``/``close`` are given and not callable.
    """
    if not callable(on_event):
        raise ConfigError("define_context_tracer: on_event must be callable")
    for name, fn in (("flush", flush), ("close", close)):
        if fn is not None and not callable(fn):
            raise ConfigError(f"define_context_tracer: {name} must be callable when given")
    return DefinedContextTracer(on_event, flush, close, bool(fail_on_error))


@dataclass
class TraceContext:
    """Who is emitting, and under which trace session.

    ``session_id`` is the trace session (a team root shares one across agents);
    ``agent_session_id`` keeps the agent's own SDK session id when they differ.
    ``source`` is ``{"kind": "agent" | "team" | "team_member", "name": ..., ...}``.
    ``parent_run_id`` links a child run (a member's) to the run that started it.
    ``remote_parent`` carries the parent's propagation headers (``dict[str, str]``,
    see :func:`trace_carrier`) when the parent run was traced in another process:
    a tracer that does not know ``parent_run_id`` continues the trace from them.
    """

    session_id: str
    source: dict[str, Any]
    agent_session_id: str | None = None
    parent_run_id: str | None = None
    run_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    remote_parent: dict[str, str] | None = None


class TraceEmitter:
    """Builds envelopes for one run and hands them to a tracer.

    ``emit`` never raises for a tracer failure unless the tracer's
    ``fail_on_error`` is true; failures are logged on the
    ``lattice_worker.tracing`` logger.
    """

    def __init__(self, tracer: ContextTracer | None, context: TraceContext) -> None:
        self.tracer = tracer
        self.context = context

    @property
    def enabled(self) -> bool:
        return self.tracer is not None

    @property
    def run_id(self) -> str:
        return self.context.run_id

    def envelope(self, type_: str, data: dict[str, Any]) -> dict[str, Any]:
        ctx = self.context
        event: dict[str, Any] = {
            "version": TRACE_VERSION,
            "timestamp": now_iso(),
            "session_id": ctx.session_id,
            "run_id": ctx.run_id,
            "seq": None,
            "source": dict(ctx.source),
            "type": type_,
            "data": data,
        }
        if ctx.parent_run_id is not None:
            event["parent_run_id"] = ctx.parent_run_id
        if ctx.agent_session_id is not None and ctx.agent_session_id != ctx.session_id:
            event["agent_session_id"] = ctx.agent_session_id
        if ctx.remote_parent and type_ == "run_start":
            event["remote_parent"] = dict(ctx.remote_parent)
        return event

    async def emit(self, type_: str, data: dict[str, Any]) -> None:
        """Send one event of ``type_`` with payload ``data``."""
        if self.tracer is None:
            return
        event = self.envelope(type_, data)
        try:
            await _maybe_await(self.tracer.on_event(event))
        except Exception:
            if getattr(self.tracer, "fail_on_error", False):
                raise
            logger.warning("context tracer failed on %s event; continuing", type_, exc_info=True)


def trace_carrier(tracer: ContextTracer | None, run_id: str) -> dict[str, str]:
    """The propagation headers of the open (or just ended) run ``run_id`` in
    ``tracer``: a JSON-ready ``dict[str, str]`` (W3C ``traceparent`` for
    OpenTelemetry, ``langsmith-trace`` for LangSmith, ``langfuse-traceparent``
    for Langfuse...), to put in :attr:`TraceContext.remote_parent` of a child
    run traced in another process. ``{}`` when the tracer does not propagate
    (JSONL, custom sinks) or does not know the run. Never raises: a failing
    tracer is logged and gives ``{}``.
    """
    carrier = getattr(tracer, "trace_carrier", None) if tracer is not None else None
    if not callable(carrier):
        return {}
    try:
        headers = carrier(run_id)
    except Exception:
        logger.warning("context tracer failed to give the trace carrier of run %s", run_id, exc_info=True)
        return {}
    return {str(k): str(v) for k, v in (headers or {}).items()}


__all__ = [
    "EVENT_TYPES",
    "TRACE_VERSION",
    "ContextTracer",
    "DefinedContextTracer",
    "SeqCounter",
    "TraceContext",
    "TraceEmitter",
    "define_context_tracer",
    "now_iso",
    "trace_carrier",
]
