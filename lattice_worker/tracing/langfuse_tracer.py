"""The Langfuse tracer: agent runs, model calls and tool calls as Langfuse
observations, on Langfuse's OpenTelemetry-based Python SDK (v3 and later).

==========================================  ===================================
events                                      Langfuse observation
==========================================  ===================================
``run_start`` .. ``result``                 ``chain`` observation named after
                                            the agent (or team); the trace root
                                            unless ``parent_run_id`` names a
                                            chain this tracer saw
``model_request`` .. ``assistant_message``  child ``generation`` with ``model``,
                                            ``model_parameters`` (max_tokens),
                                            input messages, output message and
                                            ``usage_details`` (``input``,
                                            ``output``, cache reads / writes)
``tool_use`` .. ``tool_result``             child ``tool`` observation
                                            (``tool_description`` metadata)
``team_message``, ``team_agent``, injected  ``event`` observations (ended at
user messages                               once) on their chain
==========================================  ===================================

Every observation carries the trace session as ``session.id``; the trace root
also the trace name (the agent's or team's) and ``langfuse.trace.tags`` -- set
with Langfuse's ``propagate_attributes``, so traces group and filter in the
Langfuse UI. Failed runs, model calls and tool calls have level ``ERROR`` and a
``status_message``.

Distributed traces: :func:`~.base.trace_carrier` gives a run's
``langfuse-traceparent`` (W3C format); a chain started with it in
``TraceContext.remote_parent`` is that observation's child in the same trace.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from ..errors import ConfigError
from .projection import ProjectedContextTracer, RunEnd, RunStart, import_extra, w3c_propagator

_FEATURE = "create_langfuse_context_tracer"
_EXTRA = "langfuse"

TRACEPARENT_HEADER = "langfuse-traceparent"


def _ns(when: datetime) -> int:
    return int(when.timestamp() * 1_000_000_000)


class LangfuseBackend:
    """Observations made with ``start_observation`` (the Langfuse client's, or an
    injected function with its keyword arguments); children through each
    observation's own ``start_observation``."""

    def __init__(self, *, start_observation: Any, flush: Any, tags: list[str]) -> None:
        langfuse = import_extra("langfuse", feature=_FEATURE, extra=_EXTRA)
        self.propagate_attributes = langfuse.propagate_attributes
        self.otel_context = import_extra("opentelemetry.context", feature=_FEATURE, extra=_EXTRA)
        self.propagator = w3c_propagator(feature=_FEATURE, extra=_EXTRA)
        self.start_observation = start_observation
        self.flusher = flush
        self.tags = tags

    @contextlib.contextmanager
    def _creating(self, start: RunStart, *, trace_root: bool) -> Iterator[None]:
        """The context an observation is created in: the remote parent (when
        continuing another process's trace) and the propagated trace attributes."""
        token = None
        if start.parent is None and start.remote_parent and start.remote_parent.get(TRACEPARENT_HEADER):
            ctx = self.propagator.extract({"traceparent": start.remote_parent[TRACEPARENT_HEADER]})
            token = self.otel_context.attach(ctx)
        attributes: dict[str, Any] = {}
        if start.session_id:
            attributes["session_id"] = start.session_id
        if trace_root:
            attributes["trace_name"] = start.name
            if self.tags:
                attributes["tags"] = list(self.tags)
        try:
            with self.propagate_attributes(**attributes):
                yield
        finally:
            if token is not None:
                self.otel_context.detach(token)

    def start_run(self, start: RunStart) -> Any:
        parent = start.parent
        metadata = dict(start.metadata)
        if start.kind == "chain":
            metadata.update({k: v for k, v in start.inputs.items() if k not in metadata})
            kwargs: dict[str, Any] = {"name": start.name, "as_type": "chain", "metadata": metadata}
        elif start.kind == "llm":
            kwargs = {
                "name": start.name,
                "as_type": "generation",
                "model": start.model,
                "input": {k: v for k, v in start.inputs.items() if k in ("system", "messages", "tools")},
                "metadata": metadata,
            }
            if start.max_tokens is not None:
                kwargs["model_parameters"] = {"max_tokens": start.max_tokens}
        else:
            kwargs = {"name": start.name, "as_type": "tool", "input": start.inputs, "metadata": metadata}
        trace_root = parent is None and not start.remote_parent
        with self._creating(start, trace_root=trace_root):
            if parent is not None:
                return parent.start_observation(**kwargs)
            return self.start_observation(**kwargs)

    def set_chain_input(self, handle: Any, message: dict[str, Any]) -> None:
        handle.update(input=message)

    def end_run(self, handle: Any, start: RunStart, end: RunEnd) -> None:
        update: dict[str, Any] = {}
        if end.outputs is not None:
            update["output"] = end.outputs.get("content") if start.kind == "tool" else end.outputs
        if start.kind == "llm" and end.usage is not None:
            u = end.usage
            details = {"input": u["input_tokens"], "output": u["output_tokens"]}
            for key in ("cache_read_input_tokens", "cache_creation_input_tokens"):
                if u[key]:
                    details[key] = u[key]
            update["usage_details"] = details
        if end.error is not None:
            update["level"] = "ERROR"
            update["status_message"] = end.error
        if update:
            handle.update(**update)
        handle.end(end_time=_ns(end.end_time))

    def add_event(self, handle: Any, name: str, data: dict[str, Any], time: datetime) -> None:
        handle.start_observation(name=name, as_type="event", input=data)

    def carrier(self, handle: Any) -> dict[str, str]:
        trace_id, span_id = getattr(handle, "trace_id", None), getattr(handle, "id", None)
        if not (isinstance(trace_id, str) and isinstance(span_id, str)):
            return {}
        return {TRACEPARENT_HEADER: f"00-{trace_id}-{span_id}-01"}

    def flush(self) -> None:
        if self.flusher is not None:
            self.flusher()


class LangfuseContextTracer(ProjectedContextTracer):
    """The Langfuse tracer built by :func:`create_langfuse_context_tracer`."""


def create_langfuse_context_tracer(
    *,
    start_observation: Any = None,
    span_processor: Any = None,
    tags: list[str] | None = None,
    fail_on_error: bool = False,
) -> LangfuseContextTracer:
    """A trace sink projecting runs onto Langfuse (see the module docstring for the tree).

    Configure Langfuse as its SDK documents (``LANGFUSE_PUBLIC_KEY``,
    ``LANGFUSE_SECRET_KEY``, ``LANGFUSE_BASE_URL``, or a ``Langfuse(...)`` client
    built at start-up); by default observations are made with
    ``langfuse.get_client().start_observation``. ``start_observation`` replaces it
    (a client's bound method, or a test fake taking the same keyword arguments
    and returning observations with ``start_observation`` / ``update`` /
    ``end``). ``span_processor`` (e.g. the ``LangfuseSpanProcessor`` the host
    registered) is drained by ``flush()`` / ``close()`` with ``force_flush()``;
    without it they flush the client ``start_observation`` belongs to. ``tags``
    go on the trace root. ``close()`` first ends the runs still open (as errors).
    ``fail_on_error`` as for every tracer.

    Raises :class:`~lattice_worker.errors.MissingExtraError` (a ``ConfigError``
    and an ``ImportError``) when ``langfuse`` is not installed
    (``pip install "agent-lattice[langfuse]"``), and ``ConfigError`` when
    ``start_observation`` is not callable or ``span_processor`` has no
    ``force_flush``.
    """
    if start_observation is not None and not callable(start_observation):
        raise ConfigError("create_langfuse_context_tracer: start_observation must be callable")
    if span_processor is not None and not callable(getattr(span_processor, "force_flush", None)):
        raise ConfigError(
            "create_langfuse_context_tracer: span_processor must have force_flush() (a LangfuseSpanProcessor)"
        )
    langfuse = import_extra("langfuse", feature=_FEATURE, extra=_EXTRA)
    if start_observation is None:
        start_observation = langfuse.get_client().start_observation
    if span_processor is not None:
        flush = span_processor.force_flush
    else:
        owner = getattr(start_observation, "__self__", None)
        flush = getattr(owner, "flush", None) if callable(getattr(owner, "flush", None)) else None
    backend = LangfuseBackend(start_observation=start_observation, flush=flush, tags=list(tags or []))
    return LangfuseContextTracer(backend, name="Langfuse", fail_on_error=fail_on_error)


__all__ = ["LangfuseContextTracer", "create_langfuse_context_tracer"]
