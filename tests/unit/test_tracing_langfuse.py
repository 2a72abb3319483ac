"""The Langfuse tracer on Langfuse's own (OpenTelemetry-based) SDK.

A real ``Langfuse`` client whose span exporter is the OpenTelemetry SDK's
in-memory exporter stands in for the Langfuse server: the tests read the
observations it would have sent (types, names, parents, the order they end in,
levels, usage, trace attributes). One test injects a plain fake
``start_observation`` to show the seam needs nothing of the SDK's objects.
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from lattice_worker import create_langfuse_context_tracer
from lattice_worker.errors import ConfigError, MissingExtraError
from tests.support.trace_scenarios import (
    TOOL_PROMPT,
    run_model_error_agent,
    run_split_across_processes,
    run_team,
    run_tool_agent,
)

TYPE = "langfuse.observation.type"
LEVEL = "langfuse.observation.level"
STATUS = "langfuse.observation.status_message"


class LangfuseRig:
    """A Langfuse client exporting to memory (its own public key: the SDK keeps one client per key)."""

    def __init__(self) -> None:
        from langfuse import Langfuse

        self.exporter = InMemorySpanExporter()
        self.client = Langfuse(
            public_key=f"pk-lf-test-{uuid.uuid4().hex}",
            secret_key="sk-lf-test",
            base_url="http://127.0.0.1:9",
            span_exporter=self.exporter,
            tracer_provider=TracerProvider(),
        )

    def spans(self) -> list[Any]:
        self.client.flush()
        return list(self.exporter.get_finished_spans())


@pytest.fixture
def rig() -> Iterator[LangfuseRig]:
    rig = LangfuseRig()
    yield rig
    rig.client.shutdown()


def attr_json(span: Any, key: str) -> Any:
    return json.loads(span.attributes[key])


def parent_of(spans: list[Any], span: Any) -> Any:
    return next((s for s in spans if span.parent and s.context.span_id == span.parent.span_id), None)


async def test_agent_with_tools_is_a_chain_with_generation_and_tool_observations(rig):
    tracer = create_langfuse_context_tracer(start_observation=rig.client.start_observation, tags=["ci"])
    await run_tool_agent(tracer)
    spans = rig.spans()
    # the order observations end in: each generation, the tools in call order, the chain last
    assert [(s.name, s.attributes[TYPE]) for s in spans] == [
        ("m1", "generation"),
        ("add", "tool"),
        ("boom", "tool"),
        ("m1", "generation"),
        ("calc", "chain"),
    ]
    chain = spans[-1]
    assert chain.parent is None
    assert all(parent_of(spans, s) is chain for s in spans[:-1])
    assert len({s.context.trace_id for s in spans}) == 1

    # the trace root carries the trace name, the session and the tags
    session = chain.attributes["session.id"]
    assert chain.attributes["langfuse.trace.name"] == "calc"
    assert tuple(chain.attributes["langfuse.trace.tags"]) == ("ci",)
    assert all(s.attributes["session.id"] == session for s in spans)
    assert attr_json(chain, "langfuse.observation.input") == {"role": "user", "content": TOOL_PROMPT}
    assert attr_json(chain, "langfuse.observation.output")["result"] == "3"
    assert LEVEL not in chain.attributes

    generation = spans[0]
    assert generation.attributes["langfuse.observation.model.name"] == "m1"
    assert attr_json(generation, "langfuse.observation.model.parameters") == {"max_tokens": 4096}
    assert attr_json(generation, "langfuse.observation.usage_details") == {
        "input": 10,
        "output": 3,
        "cache_read_input_tokens": 5,
    }
    assert attr_json(generation, "langfuse.observation.input")["messages"] == [
        {"role": "user", "content": TOOL_PROMPT}
    ]
    assert attr_json(generation, "langfuse.observation.output")["stop_reason"] == "tool_use"

    add, boom = spans[1], spans[2]
    assert attr_json(add, "langfuse.observation.input") == {"a": 1, "b": 2}
    assert json.loads(add.attributes["langfuse.observation.metadata.tool_description"]) == "Adds two numbers."
    assert LEVEL not in add.attributes
    assert boom.attributes[LEVEL] == "ERROR" and "kaput" in boom.attributes[STATUS]


async def test_a_model_error_sets_level_error_on_the_generation_and_the_chain(rig):
    await run_model_error_agent(
        create_langfuse_context_tracer(start_observation=rig.client.start_observation)
    )
    generation, chain = rig.spans()
    assert generation.attributes[TYPE] == "generation" and chain.attributes[TYPE] == "chain"
    for span in (generation, chain):
        assert span.attributes[LEVEL] == "ERROR" and "overloaded" in span.attributes[STATUS]
    assert "langfuse.observation.usage_details" not in generation.attributes


async def test_a_team_call_is_one_trace_rooted_at_the_team(rig):
    await run_team(create_langfuse_context_tracer(start_observation=rig.client.start_observation))
    spans = rig.spans()
    assert len({s.context.trace_id for s in spans}) == 1
    chains = {s.name: s for s in spans if s.attributes[TYPE] == "chain"}
    assert set(chains) == {"crew", "boss", "worker"}
    root = chains["crew"]
    assert root.parent is None and root.attributes["langfuse.trace.name"] == "crew"
    assert parent_of(spans, chains["boss"]) is root and parent_of(spans, chains["worker"]) is root
    assert "langfuse.trace.name" not in chains["worker"].attributes
    events = [s for s in spans if s.attributes[TYPE] == "event"]
    assert {s.name for s in events} >= {"team_message", "team_agent"}
    assert all(parent_of(spans, e) is root for e in events if e.name.startswith("team_"))
    names = [s.name for s in spans if s.attributes[TYPE] == "chain"]
    assert names == ["worker", "boss", "crew"]  # the order they end in


async def test_a_chain_continues_a_trace_from_another_process(rig):
    other = LangfuseRig()  # a second process's client
    try:
        a = create_langfuse_context_tracer(start_observation=rig.client.start_observation)
        b = create_langfuse_context_tracer(start_observation=other.client.start_observation)
        carrier = await run_split_across_processes(a, b)
        assert set(carrier) == {"langfuse-traceparent"}
        (root_span,) = rig.spans()
        (member_span,) = other.spans()
        assert member_span.context.trace_id == root_span.context.trace_id
        assert member_span.parent.span_id == root_span.context.span_id
        assert member_span.attributes["session.id"] == "s"
        assert "langfuse.trace.name" not in member_span.attributes  # not the trace root
    finally:
        other.client.shutdown()


class FakeObservation:
    def __init__(self, log: list[tuple[str, Any]], kwargs: dict[str, Any]) -> None:
        self.log, self.kwargs, self.updates = log, kwargs, []
        self.trace_id, self.id = uuid.uuid4().hex, uuid.uuid4().hex[:16]
        self.children: list[FakeObservation] = []

    def start_observation(self, **kwargs: Any) -> FakeObservation:
        child = FakeObservation(self.log, kwargs)
        self.children.append(child)
        self.log.append(("start", kwargs["name"]))
        return child

    def update(self, **kwargs: Any) -> None:
        self.updates.append(kwargs)

    def end(self, end_time: int | None = None) -> None:
        self.log.append(("end", self.kwargs["name"]))


class FakeSpanProcessor:
    def __init__(self) -> None:
        self.flushes = 0

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        self.flushes += 1
        return True


async def test_an_injected_start_observation_and_span_processor_are_all_it_uses():
    log: list[tuple[str, Any]] = []
    roots: list[FakeObservation] = []

    def start_observation(**kwargs: Any) -> FakeObservation:
        roots.append(FakeObservation(log, kwargs))
        log.append(("start", kwargs["name"]))
        return roots[-1]

    processor = FakeSpanProcessor()
    tracer = create_langfuse_context_tracer(start_observation=start_observation, span_processor=processor)
    await run_model_error_agent(tracer)
    (root,) = roots
    assert root.kwargs["as_type"] == "chain"
    (generation,) = root.children
    assert generation.kwargs["as_type"] == "generation" and generation.kwargs["model"] == "m1"
    assert log == [("start", "flaky"), ("start", "m1"), ("end", "m1"), ("end", "flaky")]
    assert generation.updates[-1]["level"] == "ERROR" and root.updates[-1]["level"] == "ERROR"
    await tracer.flush()
    await tracer.close()
    assert processor.flushes == 2


def test_bad_seams_are_config_errors():
    with pytest.raises(ConfigError, match="start_observation"):
        create_langfuse_context_tracer(start_observation="nope")
    with pytest.raises(ConfigError, match="force_flush"):
        create_langfuse_context_tracer(start_observation=lambda **kw: None, span_processor=object())


def test_a_missing_langfuse_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "langfuse", None)
    with pytest.raises(MissingExtraError) as caught:
        create_langfuse_context_tracer()
    assert 'pip install "agent-lattice[langfuse]"' in str(caught.value)
    assert isinstance(caught.value, ImportError) and isinstance(caught.value, ConfigError)
