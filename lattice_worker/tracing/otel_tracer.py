"""The OpenTelemetry tracer: agent runs, model calls and tool calls as spans with
the GenAI semantic conventions, sent to whatever exporter the host configured.

Spans (see :mod:`.projection` for how events become runs):

========================  =====================  ==========================================
run                       span name              ``gen_ai.operation.name`` / kind
========================  =====================  ==========================================
a team's root run         ``invoke_workflow T``  ``invoke_workflow`` / INTERNAL
an agent run (lead,       ``invoke_agent A``     ``invoke_agent`` / INTERNAL
member, plain agent)
a model call              ``chat M``             ``chat`` / CLIENT
a tool call               ``execute_tool N``     ``execute_tool`` / INTERNAL
========================  =====================  ==========================================

Attributes: ``gen_ai.agent.name``, ``gen_ai.conversation.id`` (the trace
session), ``gen_ai.provider.name`` (``anthropic``: the loop speaks the Anthropic
Messages API), ``gen_ai.request.model`` / ``max_tokens``, ``gen_ai.response.model``
/ ``id`` / ``finish_reasons``, ``gen_ai.usage.input_tokens`` (all input tokens,
cached ones included) / ``output_tokens`` / ``cache_read.input_tokens`` /
``cache_creation.input_tokens``, ``gen_ai.tool.name`` / ``call.id`` /
``description`` / ``type``, plus ``lattice.run_id``, ``lattice.session_id``,
``lattice.source.kind`` (and ``lattice.team`` / ``lattice.member`` when known).
A failed run, model call or tool call has status ERROR with the message and an
``error.type``. Message contents, tool arguments and results are recorded only
with ``capture_content=True`` (``gen_ai.input.messages``,
``gen_ai.output.messages``, ``gen_ai.system_instructions``,
``gen_ai.tool.call.arguments`` / ``result``, JSON strings), as the conventions
make content opt-in. Team events and injected user messages are span events.

Distributed traces: :func:`~.base.trace_carrier` gives a run's W3C
``traceparent``; a run started with it in ``TraceContext.remote_parent`` is a
child of that span in the same trace.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ..errors import ConfigError
from .projection import ProjectedContextTracer, RunEnd, RunStart, import_extra, to_json, w3c_propagator

_FEATURE = "create_otel_context_tracer"
_EXTRA = "otel"

# GenAI semantic-convention attribute names (checked against the installed
# opentelemetry-semantic-conventions package by the tests).
OPERATION_NAME = "gen_ai.operation.name"
PROVIDER_NAME = "gen_ai.provider.name"
AGENT_NAME = "gen_ai.agent.name"
CONVERSATION_ID = "gen_ai.conversation.id"
WORKFLOW_NAME = "gen_ai.workflow.name"
REQUEST_MODEL = "gen_ai.request.model"
REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
REQUEST_STREAM = "gen_ai.request.stream"
RESPONSE_MODEL = "gen_ai.response.model"
RESPONSE_ID = "gen_ai.response.id"
RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
USAGE_CACHE_READ_INPUT_TOKENS = "gen_ai.usage.cache_read.input_tokens"
USAGE_CACHE_CREATION_INPUT_TOKENS = "gen_ai.usage.cache_creation.input_tokens"
TOOL_NAME = "gen_ai.tool.name"
TOOL_CALL_ID = "gen_ai.tool.call.id"
TOOL_DESCRIPTION = "gen_ai.tool.description"
TOOL_TYPE = "gen_ai.tool.type"
TOOL_CALL_ARGUMENTS = "gen_ai.tool.call.arguments"
TOOL_CALL_RESULT = "gen_ai.tool.call.result"
INPUT_MESSAGES = "gen_ai.input.messages"
OUTPUT_MESSAGES = "gen_ai.output.messages"
SYSTEM_INSTRUCTIONS = "gen_ai.system_instructions"
ERROR_TYPE = "error.type"

INSTRUMENTATION_NAME = "lattice_worker.tracing"


def _ns(when: datetime) -> int:
    return int(when.timestamp() * 1_000_000_000)


def _event_attributes(data: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, (str, bool, int, float)):
            out[f"lattice.{key}"] = value
        elif value is not None:
            out[f"lattice.{key}"] = to_json(value)
    return out


class OtelBackend:
    """Spans on an OpenTelemetry ``Tracer``; handles are the spans themselves."""

    def __init__(self, tracer: Any, *, capture_content: bool) -> None:
        self.trace = import_extra("opentelemetry.trace", feature=_FEATURE, extra=_EXTRA)
        self.propagator = w3c_propagator(feature=_FEATURE, extra=_EXTRA)
        self.tracer = tracer
        self.capture_content = capture_content
        self.provider: Any = None

    # -- starting ---------------------------------------------------------------------

    def _context(self, start: RunStart) -> Any:
        if start.parent is not None:
            return self.trace.set_span_in_context(start.parent)
        if start.remote_parent and start.remote_parent.get("traceparent"):
            return self.propagator.extract(
                {k: v for k, v in start.remote_parent.items() if k in ("traceparent", "tracestate")}
            )
        return None  # the host's current context: a root run nests under the host's active span

    def start_run(self, start: RunStart) -> Any:
        kind = self.trace.SpanKind
        attrs: dict[str, Any] = {
            "lattice.run_id": start.run_id,
            "lattice.source.kind": str(start.source.get("kind", "")),
        }
        if start.session_id:
            attrs["lattice.session_id"] = start.session_id
            attrs[CONVERSATION_ID] = start.session_id
        for key in ("team", "member"):
            if isinstance(start.source.get(key), str):
                attrs[f"lattice.{key}"] = start.source[key]
        if start.kind == "chain":
            if start.is_team_root:
                attrs[OPERATION_NAME] = "invoke_workflow"
                attrs[WORKFLOW_NAME] = start.name
                name, span_kind = f"invoke_workflow {start.name}", kind.INTERNAL
            else:
                attrs[OPERATION_NAME] = "invoke_agent"
                attrs[AGENT_NAME] = start.name
                name, span_kind = f"invoke_agent {start.name}", kind.INTERNAL
                if start.model:
                    attrs[REQUEST_MODEL] = start.model
        elif start.kind == "llm":
            attrs[OPERATION_NAME] = "chat"
            attrs[PROVIDER_NAME] = "anthropic"
            attrs[AGENT_NAME] = str(start.source.get("name") or "agent")
            if start.model:
                attrs[REQUEST_MODEL] = start.model
            if start.max_tokens is not None:
                attrs[REQUEST_MAX_TOKENS] = start.max_tokens
            if isinstance(start.inputs.get("stream"), bool):
                attrs[REQUEST_STREAM] = start.inputs["stream"]
            if self.capture_content:
                attrs[INPUT_MESSAGES] = to_json(start.inputs.get("messages") or [])
                if start.inputs.get("system") is not None:
                    attrs[SYSTEM_INSTRUCTIONS] = to_json(start.inputs["system"])
            name, span_kind = f"chat {start.model or 'model'}", kind.CLIENT
        else:
            attrs[OPERATION_NAME] = "execute_tool"
            attrs[TOOL_NAME] = start.name
            attrs[TOOL_TYPE] = "function"
            if start.tool_use_id:
                attrs[TOOL_CALL_ID] = start.tool_use_id
            if start.tool_description:
                attrs[TOOL_DESCRIPTION] = start.tool_description
            if self.capture_content:
                attrs[TOOL_CALL_ARGUMENTS] = to_json(start.inputs)
            name, span_kind = f"execute_tool {start.name}", kind.INTERNAL
        return self.tracer.start_span(
            name,
            context=self._context(start),
            kind=span_kind,
            attributes=attrs,
            start_time=_ns(start.start_time),
        )

    def set_chain_input(self, handle: Any, message: dict[str, Any]) -> None:
        if self.capture_content:
            handle.set_attribute(INPUT_MESSAGES, to_json([message]))

    # -- ending -----------------------------------------------------------------------

    def end_run(self, handle: Any, start: RunStart, end: RunEnd) -> None:
        if start.kind == "llm":
            if end.response_model:
                handle.set_attribute(RESPONSE_MODEL, end.response_model)
            if end.response_id:
                handle.set_attribute(RESPONSE_ID, end.response_id)
            if end.finish_reasons:
                handle.set_attribute(RESPONSE_FINISH_REASONS, list(end.finish_reasons))
            if end.usage is not None:
                u = end.usage
                cached = u["cache_read_input_tokens"] + u["cache_creation_input_tokens"]
                handle.set_attribute(USAGE_INPUT_TOKENS, u["input_tokens"] + cached)
                handle.set_attribute(USAGE_OUTPUT_TOKENS, u["output_tokens"])
                handle.set_attribute(USAGE_CACHE_READ_INPUT_TOKENS, u["cache_read_input_tokens"])
                handle.set_attribute(USAGE_CACHE_CREATION_INPUT_TOKENS, u["cache_creation_input_tokens"])
            if self.capture_content and end.outputs is not None:
                handle.set_attribute(OUTPUT_MESSAGES, to_json([end.outputs]))
        elif start.kind == "tool":
            if self.capture_content and end.outputs is not None:
                handle.set_attribute(TOOL_CALL_RESULT, to_json(end.outputs.get("content")))
        elif end.usage is not None and not start.is_team_root:
            u = end.usage
            cached = u["cache_read_input_tokens"] + u["cache_creation_input_tokens"]
            handle.set_attribute(USAGE_INPUT_TOKENS, u["input_tokens"] + cached)
            handle.set_attribute(USAGE_OUTPUT_TOKENS, u["output_tokens"])
        if end.error is not None:
            status = self.trace.Status(self.trace.StatusCode.ERROR, end.error)
            handle.set_status(status)
            handle.set_attribute(ERROR_TYPE, end.error_type or "error")
        handle.end(end_time=_ns(end.end_time))

    def add_event(self, handle: Any, name: str, data: dict[str, Any], time: datetime) -> None:
        handle.add_event(name, attributes=_event_attributes(data), timestamp=_ns(time))

    def carrier(self, handle: Any) -> dict[str, str]:
        headers: dict[str, str] = {}
        self.propagator.inject(headers, context=self.trace.set_span_in_context(handle))
        return headers

    def flush(self) -> None:
        provider = self.provider if self.provider is not None else self.trace.get_tracer_provider()
        force_flush = getattr(provider, "force_flush", None)
        if callable(force_flush):
            force_flush()


class OtelContextTracer(ProjectedContextTracer):
    """The OpenTelemetry tracer built by :func:`create_otel_context_tracer`.
    ``tracer_provider`` is the provider its spans go to."""

    tracer_provider: Any


def create_otel_context_tracer(
    *,
    tracer_provider: Any = None,
    capture_content: bool = False,
    fail_on_error: bool = False,
) -> OtelContextTracer:
    """A trace sink emitting OpenTelemetry spans with the GenAI semantic conventions.

    ``tracer_provider`` is an OpenTelemetry ``TracerProvider`` (the SDK's, or any
    implementation of the API); by default the global one
    (``opentelemetry.trace.get_tracer_provider()``), so spans reach whatever
    exporter the host registered. ``capture_content=True`` also records message
    contents, tool arguments and tool results (see the module docstring).
    ``flush()`` calls the provider's ``force_flush()`` when it has one; ``close()``
    ends the runs still open (as errors) and flushes; neither shuts the
    provider down (it belongs to the host). ``fail_on_error`` as for every tracer:
    by default a failing span call is logged once and never fails a run.

    Raises :class:`~lattice_worker.errors.MissingExtraError` (a ``ConfigError``
    and an ``ImportError``) when ``opentelemetry-api`` is not installed
    (``pip install "agent-lattice[otel]"``), and ``ConfigError`` when
    ``tracer_provider`` has no ``get_tracer``.
    """
    trace = import_extra("opentelemetry.trace", feature=_FEATURE, extra=_EXTRA)
    provider = tracer_provider if tracer_provider is not None else trace.get_tracer_provider()
    if not callable(getattr(provider, "get_tracer", None)):
        raise ConfigError(
            f"create_otel_context_tracer: tracer_provider must be an OpenTelemetry TracerProvider, "
            f"got {type(provider).__name__}"
        )
    backend = OtelBackend(provider.get_tracer(INSTRUMENTATION_NAME), capture_content=bool(capture_content))
    backend.provider = tracer_provider  # None: the global provider, looked up again at flush time
    tracer = OtelContextTracer(backend, name="OpenTelemetry", fail_on_error=fail_on_error)
    tracer.tracer_provider = provider
    return tracer


__all__ = ["OtelContextTracer", "create_otel_context_tracer"]
