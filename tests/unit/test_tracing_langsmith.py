"""The LangSmith tracer: langsmith's real ``RunTree`` over an injected client
that records every ``create_run`` / ``update_run`` it is handed.

The projected tree of real agent and team runs on a scripted model: run types,
names, parents, trace ids, the order runs are posted and patched in, inputs /
outputs / usage metadata, errors; plus flush / close, fail_on_error,
distributed parents and the missing-package error.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from lattice_worker import create_composite_context_tracer, create_langsmith_context_tracer
from lattice_worker.errors import ConfigError, MissingExtraError
from lattice_worker.tracing import TraceContext, TraceEmitter, trace_carrier
from tests.support.trace_scenarios import (
    TOOL_PROMPT,
    run_model_error_agent,
    run_split_across_processes,
    run_team,
    run_tool_agent,
)


class RecordingClient:
    """Stands in for ``langsmith.Client``: keeps the calls ``RunTree`` makes."""

    def __init__(self, fail_on: str | None = None) -> None:
        self.ops: list[tuple[str, dict[str, Any]]] = []
        self.flushes = 0
        self.fail_on = fail_on

    def create_run(self, **run: Any) -> None:
        if self.fail_on == "create":
            raise ConnectionError("langsmith is down")
        self.ops.append(("create", run))

    def update_run(self, run_id: Any, **run: Any) -> None:
        self.ops.append(("update", {"id": run_id, **run}))

    def flush(self) -> None:
        self.flushes += 1

    # -- views for the tests
    def created(self) -> list[dict[str, Any]]:
        return [run for op, run in self.ops if op == "create"]

    def updated(self) -> list[dict[str, Any]]:
        return [run for op, run in self.ops if op == "update"]

    def run(self, name: str, run_type: str | None = None, nth: int = 0) -> dict[str, Any]:
        """The created run named ``name``, merged with its update (the final state)."""
        matches = [r for r in self.created() if r["name"] == name and run_type in (None, r["run_type"])]
        created = matches[nth]
        update = next(u for u in self.updated() if u["id"] == created["id"])
        return {**created, **{k: v for k, v in update.items() if v is not None}}


def meta(run: dict[str, Any]) -> dict[str, Any]:
    return (run.get("extra") or {}).get("metadata") or {}


async def test_agent_with_tools_is_a_chain_with_llm_and_tool_children():
    client = RecordingClient()
    tracer = create_langsmith_context_tracer(client=client, project_name="lattice-tests")
    await run_tool_agent(tracer)

    created = [(r["name"], r["run_type"]) for r in client.created()]
    # the chain is posted with its first child (so its inputs hold the prompt), parents first
    assert created == [("calc", "chain"), ("m1", "llm"), ("add", "tool"), ("boom", "tool"), ("m1", "llm")]
    ended = [(u["name"], u["run_type"]) for u in client.updated()]
    assert ended == [("m1", "llm"), ("add", "tool"), ("boom", "tool"), ("m1", "llm"), ("calc", "chain")]

    chain = client.run("calc")
    assert chain.get("parent_run_id") is None
    assert chain["session_name"] == "lattice-tests"
    assert chain["inputs"] == {"messages": [{"role": "user", "content": TOOL_PROMPT}]}
    assert chain["outputs"]["result"] == "3" and chain["outputs"]["subtype"] == "success"
    assert chain.get("error") is None
    assert meta(chain)["tools"] == ["add", "boom"] and meta(chain)["source"]["kind"] == "agent"
    for run in client.created()[1:]:
        assert run["parent_run_id"] == chain["id"]
        assert run["trace_id"] == chain["trace_id"]
        assert run["dotted_order"].startswith(chain["dotted_order"] + ".")

    llm = client.run("m1", "llm")
    assert llm["inputs"]["messages"] == [{"role": "user", "content": TOOL_PROMPT}]
    assert llm["inputs"]["tools"] == ["add", "boom"]
    assert [b["id"] for b in llm["outputs"]["content"]] == ["call-add", "call-boom"]
    assert llm["outputs"]["stop_reason"] == "tool_use"
    usage = {
        "input_tokens": 15,
        "output_tokens": 3,
        "total_tokens": 18,
        "input_token_details": {"cache_read": 5},
    }
    assert llm["outputs"]["usage_metadata"] == usage
    assert meta(llm)["usage_metadata"] == usage
    assert meta(llm)["ls_model_name"] == "m1" and meta(llm)["ls_provider"] == "anthropic"
    assert llm["start_time"] <= llm["end_time"]

    add, boom = client.run("add"), client.run("boom")
    assert add["inputs"] == {"a": 1, "b": 2} and add["outputs"] == {"output": "3", "is_error": False}
    assert meta(add)["tool_description"] == "Adds two numbers." and meta(add)["tool_use_id"] == "call-add"
    assert add.get("error") is None
    assert "kaput" in boom["error"] and boom["outputs"]["is_error"] is True

    await tracer.flush()
    assert client.flushes == 1


async def test_sent_runs_are_not_kept_by_their_parents():
    from langsmith import RunTree

    roots: list[RunTree] = []

    def run_tree(**kwargs: Any) -> RunTree:
        roots.append(RunTree(**kwargs))
        return roots[-1]

    client = RecordingClient()
    await run_team(create_langsmith_context_tracer(client=client, run_tree=run_tree))
    (root,) = roots
    assert root.name == "crew" and root.child_runs == []  # a long-lived tracer holds no old turns
    assert len(client.updated()) == len(client.created()) > 5


async def test_a_model_error_is_an_llm_error_then_a_chain_error():
    client = RecordingClient()
    await run_model_error_agent(create_langsmith_context_tracer(client=client))
    assert [(u["name"], u["run_type"]) for u in client.updated()] == [("m1", "llm"), ("flaky", "chain")]
    llm, chain = client.run("m1"), client.run("flaky")
    assert "overloaded" in llm["error"] and "overloaded" in chain["error"]
    assert chain["error"].startswith("error:")
    assert "usage_metadata" not in meta(llm)


async def test_a_team_call_is_one_root_with_the_lead_and_the_member_as_children():
    client = RecordingClient()
    await run_team(create_langsmith_context_tracer(client=client))
    chains = [r for r in client.created() if r["run_type"] == "chain"]
    assert sorted(r["name"] for r in chains) == ["boss", "crew", "worker"]
    root = client.run("crew")
    assert root.get("parent_run_id") is None
    assert {r["trace_id"] for r in client.created()} == {root["trace_id"]}
    lead, member = client.run("boss", "chain"), client.run("worker", "chain")
    assert lead["parent_run_id"] == root["id"] and member["parent_run_id"] == root["id"]
    assert meta(member)["source"] == {
        "kind": "team_member",
        "name": "worker",
        "member": "worker",
        "mailbox": "crew::worker",
    }
    assert meta(lead)["source"]["kind"] == "team_lead"
    reply = client.run("team_reply", "tool")
    assert reply["parent_run_id"] == member["id"]
    # the member ends inside the lead's run; the root ends last
    ended = [u["name"] for u in client.updated() if u["run_type"] == "chain"]
    assert ended == ["worker", "boss", "crew"]
    assert client.updated()[-1]["name"] == "crew"
    # team events are run events on the root
    names = [e["name"] for e in root["events"]]
    assert names.count("team_agent") == 2 and "team_message" in names
    assert root["outputs"]["result"] == "42"


async def test_close_ends_open_runs_children_first_and_flushes():
    client = RecordingClient()
    tracer = create_langsmith_context_tracer(client=client)
    run = TraceEmitter(tracer, TraceContext(session_id="s", source={"kind": "agent", "name": "open"}))
    await run.emit("run_start", {"name": "open"})
    await run.emit("model_request", {"turn": 1, "model": "m1", "messages": []})
    await run.emit("tool_use", {"tool_use_id": "t", "name": "slow", "input": {}})
    await tracer.close()
    assert [u["name"] for u in client.updated()] == ["slow", "m1", "open"]
    assert all("closed before this run ended" in u["error"] for u in client.updated())
    assert client.flushes == 1
    assert tracer.open_runs == 0


async def test_a_failing_client_never_fails_the_run_unless_fail_on_error(caplog):
    client = RecordingClient(fail_on="create")
    tracer = create_langsmith_context_tracer(client=client)
    with caplog.at_level(logging.WARNING, logger="lattice_worker.tracing"):
        await run_tool_agent(tracer)
    warnings = [r for r in caplog.records if r.name == "lattice_worker.tracing"]
    assert len(warnings) == 1 and "LangSmith tracer failed" in warnings[0].getMessage()
    assert tracer.failures >= 2  # counted, logged once

    strict = create_langsmith_context_tracer(client=RecordingClient(fail_on="create"), fail_on_error=True)
    with pytest.raises(ConnectionError, match="langsmith is down"):
        await run_tool_agent(strict)


async def test_a_chain_continues_a_trace_from_another_process_through_its_headers():
    a_client, b_client = RecordingClient(), RecordingClient()
    a = create_langsmith_context_tracer(client=a_client, project_name="shared")
    b = create_langsmith_context_tracer(client=b_client)
    carrier = await run_split_across_processes(a, b)
    assert set(carrier) == {"langsmith-trace", "langsmith-baggage"}
    (root_run,) = a_client.created()
    (member_run,) = b_client.created()
    assert member_run["parent_run_id"] == root_run["id"]
    assert member_run["trace_id"] == root_run["trace_id"]
    assert member_run["dotted_order"].startswith(root_run["dotted_order"] + ".")
    assert member_run["session_name"] == "shared"  # the project travels in the baggage


async def test_a_composite_merges_the_carriers_of_its_children():
    from opentelemetry.sdk.trace import TracerProvider

    from lattice_worker import create_otel_context_tracer

    tracer = create_composite_context_tracer(
        [
            create_langsmith_context_tracer(client=RecordingClient()),
            create_otel_context_tracer(tracer_provider=TracerProvider()),
        ]
    )
    run = TraceEmitter(tracer, TraceContext(session_id="s", source={"kind": "agent", "name": "a"}))
    await run.emit("run_start", {"name": "a"})
    assert set(trace_carrier(tracer, run.run_id)) == {"langsmith-trace", "langsmith-baggage", "traceparent"}
    assert trace_carrier(tracer, str(uuid.uuid4())) == {}


class FakeLangSmithAPI:
    """A local HTTP server answering the LangSmith endpoints a ``langsmith.Client``
    calls while tracing (``GET /info``, ``POST /runs/multipart`` / ``/runs/batch``)
    and keeping what it was sent."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, dict[str, str], bytes]] = []
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _reply(self, body: bytes) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                api.requests.append(("GET", self.path, dict(self.headers), b""))
                self._reply(json.dumps({"version": "0.10.0"}).encode())

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                api.requests.append(("POST", self.path, dict(self.headers), body))
                self._reply(b"{}")

            do_PATCH = do_POST

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def runs(self) -> dict[str, dict[str, Any]]:
        """Every run sent (multipart ``post.<id>`` / ``patch.<id>`` parts, or batch
        JSON), merged per run id; ``inputs`` / ``outputs`` parts folded in."""
        runs: dict[str, dict[str, Any]] = {}
        for method, path, headers, body in self.requests:
            if method != "POST" or not path.startswith("/runs"):
                continue
            boundary = re.search(r"boundary=([^;]+)", headers.get("Content-Type", ""))
            if boundary is None:
                payload = json.loads(body)
                for run in payload.get("post", []) + payload.get("patch", []):
                    runs.setdefault(str(run["id"]), {}).update(run)
                continue
            for part in body.split(b"--" + boundary.group(1).encode()):
                head, _, content = part.partition(b"\r\n\r\n")
                name = re.search(rb'name="(post|patch)\.([0-9a-f-]+)(?:\.(\w+))?"', head)
                if name is None:
                    continue
                run = runs.setdefault(name.group(2).decode(), {})
                value = json.loads(content.rstrip(b"\r\n"))
                if name.group(3):
                    run[name.group(3).decode()] = value
                else:
                    run.update(value)
        return runs

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def langsmith_api() -> Iterator[FakeLangSmithAPI]:
    api = FakeLangSmithAPI()
    yield api
    api.close()


async def test_a_real_client_delivers_every_run_by_the_end_of_flush(langsmith_api):
    tracer = create_langsmith_context_tracer(
        api_url=langsmith_api.url, api_key="lsv2-test", workspace_id="ws-1", project_name="p"
    )
    assert tracer.client.api_url == langsmith_api.url
    assert tracer.client.api_key == "lsv2-test" and tracer.client.workspace_id == "ws-1"
    await run_tool_agent(tracer)
    await tracer.flush()

    runs = list(langsmith_api.runs().values())
    assert sorted((r["name"], r["run_type"]) for r in runs) == [
        ("add", "tool"),
        ("boom", "tool"),
        ("calc", "chain"),
        ("m1", "llm"),
        ("m1", "llm"),
    ]
    # the root's final state arrived: ended, its output, the project
    root = next(r for r in runs if r["name"] == "calc")
    assert root.get("end_time") and root["outputs"]["result"] == "3" and root["session_name"] == "p"
    assert all(r.get("end_time") for r in runs)
    posts = [headers for method, path, headers, _ in langsmith_api.requests if method == "POST"]
    assert posts and all(h.get("x-api-key") == "lsv2-test" for h in posts)


def test_bad_configuration_is_a_config_error():
    with pytest.raises(ConfigError, match="not both"):
        create_langsmith_context_tracer(client=RecordingClient(), api_key="k")
    with pytest.raises(ConfigError, match="run_tree"):
        create_langsmith_context_tracer(client=RecordingClient(), run_tree="RunTree")


def test_a_missing_langsmith_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "langsmith", None)
    with pytest.raises(MissingExtraError) as caught:
        create_langsmith_context_tracer(project_name="p")
    assert 'pip install "agent-lattice[langsmith]"' in str(caught.value)
    assert isinstance(caught.value, ImportError) and isinstance(caught.value, ConfigError)
