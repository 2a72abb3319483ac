"""The OpenTelemetry tracer on the real OpenTelemetry SDK (in-memory exporter).

Spans of real agent and team runs on a scripted model: names, parents, kinds,
the order spans end in, error status, and the GenAI semantic-convention
attributes (checked against the installed opentelemetry-semantic-conventions).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from lattice_worker import create_otel_context_tracer
from lattice_worker.errors import ConfigError, MissingExtraError
from lattice_worker.tracing import TraceContext, TraceEmitter, otel_tracer
from tests.support.trace_scenarios import (
    run_model_error_agent,
    run_split_across_processes,
    run_team,
    run_tool_agent,
)


def provider() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))  # exports as each span ends
    return tp, exporter


def tree(spans) -> dict[str, str | None]:
    """span name -> parent span name (names are unique in these scenarios)."""
    by_id = {s.context.span_id: s for s in spans}
    return {s.name: (by_id[s.parent.span_id].name if s.parent else None) for s in spans}


async def test_agent_with_tools_is_one_invoke_agent_span_with_chat_and_tool_children():
    tp, exporter = provider()
    tracer = create_otel_context_tracer(tracer_provider=tp)
    await run_tool_agent(tracer)
    spans = exporter.get_finished_spans()

    # end order: each chat span when its reply arrives, tools in call order, the agent last
    assert [s.name for s in spans] == [
        "chat m1",
        "execute_tool add",
        "execute_tool boom",
        "chat m1",
        "invoke_agent calc",
    ]
    agent = spans[-1]
    assert agent.parent is None
    assert all(s.parent.span_id == agent.context.span_id for s in spans[:-1])
    assert len({s.context.trace_id for s in spans}) == 1
    assert agent.kind is SpanKind.INTERNAL and spans[0].kind is SpanKind.CLIENT

    a = agent.attributes
    assert a["gen_ai.operation.name"] == "invoke_agent"
    assert a["gen_ai.agent.name"] == "calc"
    assert a["gen_ai.request.model"] == "m1"
    assert a["gen_ai.usage.input_tokens"] == 16 and a["gen_ai.usage.output_tokens"] == 4
    assert agent.status.status_code is StatusCode.UNSET

    chat = spans[0].attributes
    assert chat["gen_ai.operation.name"] == "chat"
    assert chat["gen_ai.provider.name"] == "anthropic"
    assert chat["gen_ai.request.model"] == "m1"
    assert chat["gen_ai.response.model"] == "m1-0501"
    assert chat["gen_ai.response.id"] == "msg-1"
    assert chat["gen_ai.response.finish_reasons"] == ("tool_use",)
    # input tokens include the cached ones; the split is kept
    assert chat["gen_ai.usage.input_tokens"] == 15
    assert chat["gen_ai.usage.cache_read.input_tokens"] == 5
    assert chat["gen_ai.usage.output_tokens"] == 3
    assert chat["gen_ai.conversation.id"] == a["gen_ai.conversation.id"]
    assert spans[3].attributes["gen_ai.response.finish_reasons"] == ("end_turn",)

    add, boom = spans[1], spans[2]
    assert add.attributes["gen_ai.operation.name"] == "execute_tool"
    assert add.attributes["gen_ai.tool.name"] == "add"
    assert add.attributes["gen_ai.tool.call.id"] == "call-add"
    assert add.attributes["gen_ai.tool.description"] == "Adds two numbers."
    assert add.status.status_code is StatusCode.UNSET
    assert boom.attributes["gen_ai.tool.call.id"] == "call-boom"
    assert boom.status.status_code is StatusCode.ERROR and "kaput" in boom.status.description
    assert boom.attributes["error.type"] == "tool_error"

    # content is opt-in: nothing of the conversation by default
    assert not [k for s in spans for k in s.attributes if k.startswith(("gen_ai.input", "gen_ai.output"))]
    assert not [k for s in spans for k in s.attributes if k.startswith("gen_ai.tool.call.ar")]


async def test_capture_content_records_messages_and_tool_arguments_as_json():
    tp, exporter = provider()
    await run_tool_agent(create_otel_context_tracer(tracer_provider=tp, capture_content=True))
    first_chat = exporter.get_finished_spans()[0]
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert '"Add 1 and 2, and try boom."' in spans["invoke_agent calc"].attributes["gen_ai.input.messages"]
    assert '"Add 1 and 2, and try boom."' in first_chat.attributes["gen_ai.input.messages"]
    assert '"call-add"' in first_chat.attributes["gen_ai.output.messages"]
    assert spans["execute_tool add"].attributes["gen_ai.tool.call.arguments"] == '{"a":1,"b":2}'
    assert spans["execute_tool add"].attributes["gen_ai.tool.call.result"] == '"3"'


async def test_a_model_error_marks_the_chat_span_and_the_agent_span():
    tp, exporter = provider()
    await run_model_error_agent(create_otel_context_tracer(tracer_provider=tp))
    chat, agent = exporter.get_finished_spans()
    assert (chat.name, agent.name) == ("chat m1", "invoke_agent flaky")
    assert chat.parent.span_id == agent.context.span_id
    for span in (chat, agent):
        assert span.status.status_code is StatusCode.ERROR
        assert "overloaded" in span.status.description
        assert span.attributes["error.type"] == "APIError"
    assert "gen_ai.usage.output_tokens" not in chat.attributes  # no reply, no usage


async def test_a_team_call_is_one_trace_under_one_workflow_root():
    tp, exporter = provider()
    await run_team(create_otel_context_tracer(tracer_provider=tp))
    spans = exporter.get_finished_spans()
    assert len({s.context.trace_id for s in spans}) == 1
    root = spans[-1]
    assert root.name == "invoke_workflow crew" and root.parent is None
    assert root.attributes["gen_ai.operation.name"] == "invoke_workflow"
    by_id = {s.context.span_id: s for s in spans}
    agents = [s for s in spans if s.name.startswith("invoke_agent")]
    assert sorted(s.name for s in agents) == ["invoke_agent boss", "invoke_agent worker"]
    assert all(by_id[s.parent.span_id] is root for s in agents)
    worker = next(s for s in agents if s.name == "invoke_agent worker")
    assert worker.attributes["lattice.source.kind"] == "team_member"
    assert worker.attributes["lattice.member"] == "worker"
    # the member runs inside the lead's run, and ends before it; the root ends last
    names = [s.name for s in spans]
    assert names.index("invoke_agent worker") < names.index("invoke_agent boss") < names.index(root.name)
    reply = next(s for s in spans if s.name == "execute_tool team_reply")
    assert by_id[reply.parent.span_id] is worker
    assert {"team_message", "team_agent"} <= {e.name for e in root.events}
    sent = next(e for e in root.events if e.name == "team_message")
    assert sent.attributes["lattice.subtype"] == "sent"
    # every span carries the one trace session
    assert len({s.attributes["lattice.session_id"] for s in spans}) == 1


async def test_a_root_run_nests_under_the_hosts_current_span():
    tp, exporter = provider()
    host = tp.get_tracer("host")
    with host.start_as_current_span("handle request") as request_span:
        await run_tool_agent(create_otel_context_tracer(tracer_provider=tp))
    agent = next(s for s in exporter.get_finished_spans() if s.name == "invoke_agent calc")
    assert agent.parent.span_id == request_span.get_span_context().span_id


async def test_a_run_continues_a_trace_from_another_process_through_traceparent():
    # two providers stand for two worker processes; only the carrier dict crosses
    tp_a, exp_a = provider()
    tp_b, exp_b = provider()
    a = create_otel_context_tracer(tracer_provider=tp_a)
    b = create_otel_context_tracer(tracer_provider=tp_b)
    carrier = await run_split_across_processes(a, b)
    assert set(carrier) == {"traceparent"}
    (root_span,) = exp_a.get_finished_spans()
    (member_span,) = exp_b.get_finished_spans()
    assert member_span.context.trace_id == root_span.context.trace_id
    assert member_span.parent.span_id == root_span.context.span_id
    assert member_span.parent.is_remote


async def test_a_result_while_a_tool_runs_ends_the_tool_first_with_the_runs_error():
    tp, exporter = provider()
    tracer = create_otel_context_tracer(tracer_provider=tp)
    run = TraceEmitter(tracer, TraceContext(session_id="s", source={"kind": "agent", "name": "a"}))
    await run.emit("run_start", {"name": "a"})
    await run.emit("tool_use", {"tool_use_id": "c1", "name": "slow", "input": {}})
    await run.emit(
        "result", {"subtype": "error_abort", "is_error": True, "error": "aborted", "error_type": "AbortError"}
    )
    tool, agent = exporter.get_finished_spans()
    assert (tool.name, agent.name) == ("execute_tool slow", "invoke_agent a")
    assert tool.status.status_code is StatusCode.ERROR and "error_abort" in tool.status.description
    assert agent.attributes["error.type"] == "AbortError"


async def test_flush_drains_a_batch_processor_and_close_ends_open_runs_as_errors():
    exporter = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=600_000))
    tracer = create_otel_context_tracer(tracer_provider=tp)
    await run_model_error_agent(tracer)
    assert exporter.get_finished_spans() == ()  # still in the batch queue
    await tracer.flush()
    assert len(exporter.get_finished_spans()) == 2

    run = TraceEmitter(tracer, TraceContext(session_id="s", source={"kind": "agent", "name": "open"}))
    await run.emit("run_start", {"name": "open"})
    await run.emit("model_request", {"turn": 1, "model": "m1", "messages": []})
    assert tracer.open_runs == 1
    await tracer.close()
    assert tracer.open_runs == 0
    chat, agent = exporter.get_finished_spans()[2:]
    assert (chat.name, agent.name) == ("chat m1", "invoke_agent open")
    assert all("closed before this run ended" in s.status.description for s in (chat, agent))
    tp.shutdown()


def test_without_a_provider_the_tracer_uses_the_global_one():
    script = textwrap.dedent(
        """
        import asyncio
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        from lattice_worker import create_otel_context_tracer
        from tests.support.trace_scenarios import run_tool_agent

        tracer = create_otel_context_tracer()  # before the host registers its provider
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        asyncio.run(run_tool_agent(tracer))
        print(",".join(s.name for s in exporter.get_finished_spans()))
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("chat m1,invoke_agent calc")


def test_attribute_names_are_the_installed_semantic_conventions():
    from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
    from opentelemetry.semconv.attributes import error_attributes

    ours = {
        name: value
        for name, value in vars(otel_tracer).items()
        if isinstance(value, str) and value.startswith("gen_ai.")
    }
    assert len(ours) >= 20
    for name, value in ours.items():
        assert getattr(gen_ai, f"GEN_AI_{name}") == value, name
    assert otel_tracer.ERROR_TYPE == error_attributes.ERROR_TYPE
    ops = {v.value for v in gen_ai.GenAiOperationNameValues}
    assert {"invoke_agent", "invoke_workflow", "chat", "execute_tool"} <= ops


def test_a_missing_opentelemetry_names_the_extra(monkeypatch):
    for module in ("opentelemetry", "opentelemetry.trace"):
        monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(MissingExtraError) as caught:
        create_otel_context_tracer()
    assert 'pip install "agent-lattice[otel]"' in str(caught.value)
    assert isinstance(caught.value, ImportError) and isinstance(caught.value, ConfigError)
    assert caught.value.extra == "otel"


def test_a_tracer_provider_that_is_not_one_is_a_config_error():
    with pytest.raises(ConfigError, match="TracerProvider"):
        create_otel_context_tracer(tracer_provider=object())
