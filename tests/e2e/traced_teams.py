"""A traced team for the distributed-tracing tests: the "e2e" team's lead and
members (tests/e2e/teams.py) under an OpenTelemetry tracer.

The tracer's provider is this module's own (not the global one). When the
environment variable :data:`SPANS_ENV` names a file, every span is appended to
it as one JSON line when it ends (the SDK's ``SimpleSpanProcessor`` with its
``ConsoleSpanExporter`` writing to that file), so a test can read what each
worker process exported. With :data:`BATCH_ENV` set to ``1`` a
``BatchSpanProcessor`` that exports only when flushed (or full) stands in
between: the spans reach the file when the process flushes its tracers.
Without the variable the spans go nowhere.

Line fields: ``name``, ``trace_id`` / ``span_id`` / ``parent_span_id`` (hex,
``None`` for a root), ``kind``, ``status``, ``attributes``, ``start`` / ``end``
(ns since the epoch) and ``pid`` (the process that ended the span).
"""

from __future__ import annotations

import json
import os
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor
from opentelemetry.trace import format_span_id, format_trace_id

from lattice_worker import ScriptedModelClient, define_agent
from lattice_worker.team import create_team
from lattice_worker.tracing import create_otel_context_tracer
from tests.e2e.teams import _executors, lead_model

SPANS_ENV = "TEST_SPANS_FILE"
"""The file each worker process appends its spans to (JSON lines)."""

BATCH_ENV = "TEST_SPANS_BATCH"
"""``1``: buffer the spans until a flush (a batch processor with a 10-minute delay)."""


def span_line(span: ReadableSpan) -> str:
    """One exported span as a JSON line (see the module doc)."""
    parent = span.parent
    return (
        json.dumps(
            {
                "name": span.name,
                "trace_id": format_trace_id(span.context.trace_id),
                "span_id": format_span_id(span.context.span_id),
                "parent_span_id": format_span_id(parent.span_id) if parent is not None else None,
                "kind": span.kind.name,
                "status": span.status.status_code.name,
                "attributes": dict(span.attributes or {}),
                "start": span.start_time,
                "end": span.end_time,
                "pid": os.getpid(),
            },
            default=str,
        )
        + "\n"
    )


def _provider() -> TracerProvider:
    provider = TracerProvider()
    path = os.environ.get(SPANS_ENV)
    if path:
        out = open(path, "a", encoding="utf-8")  # noqa: SIM115 - the process's span file, open until exit
        exporter = ConsoleSpanExporter(out=out, formatter=span_line)
        if os.environ.get(BATCH_ENV) == "1":
            provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=600_000))
        else:
            provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


def build_traced_team(tracer: Any) -> Any:
    """The "e2e_traced" team: the "e2e" lead (no own tool) and members ``worker``
    and ``other``, traced by ``tracer`` (the team's tracer)."""
    lead = define_agent(name="lead", model_client=ScriptedModelClient(lead_model), max_turns=8)
    return create_team(
        name="e2e_traced",
        lead=lead,
        members=_executors(),
        runner={"max_concurrent_work_items": 4},
        tracer=tracer,
    )


provider = _provider()
traced_team = build_traced_team(create_otel_context_tracer(tracer_provider=provider))
