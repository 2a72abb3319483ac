"""History stores and trace sinks wired into real Agents (scripted model).

Persistent history and resume, and tracing (JSONL tracer, event types,
redaction): the two-tool trace, the
resume in a fresh process, a corrupt history line, a tracer path in a missing
directory, a raising redact, and store errors with and without fail_on_error.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap

import pytest
from pydantic import BaseModel

from lattice_worker import (
    AssistantModelMessage,
    ModelRequest,
    ScriptedModelClient,
    create_bare_agent,
    create_composite_context_tracer,
    create_jsonl_context_tracer,
    create_jsonl_history_store,
    define_history_store,
    tool,
)


def make_agent(**options):
    """A bare agent: no workspace, no default tools."""
    return create_bare_agent(**options)


def text_turn(text: str) -> AssistantModelMessage:
    return AssistantModelMessage(
        content=[{"type": "text", "text": text}],
        stop_reason="end_turn",
        usage={"input_tokens": 10, "output_tokens": 5},
    )


def tool_turn(*calls: tuple[str, str, dict]) -> AssistantModelMessage:
    return AssistantModelMessage(
        content=[{"type": "tool_use", "id": cid, "name": name, "input": args} for cid, name, args in calls],
        stop_reason="tool_use",
        usage={"input_tokens": 10, "output_tokens": 5},
    )


class Recording:
    """Scripted turns that also record each request's messages (a deep JSON copy)."""

    def __init__(self, *turns: AssistantModelMessage) -> None:
        self.turns = list(turns)
        self.requests: list[list[dict]] = []

    def client(self) -> ScriptedModelClient:
        def play(index: int):
            def respond(request: ModelRequest) -> AssistantModelMessage:
                self.requests.append(json.loads(json.dumps(request.messages)))
                return self.turns[index]

            return respond

        return ScriptedModelClient([play(i) for i in range(len(self.turns))])


class AddInput(BaseModel):
    a: int
    b: int


class EchoInput(BaseModel):
    text: str


def add_tool():
    return tool("add", "Add two integers.", AddInput, lambda args: str(args.a + args.b))


def echo_tool():
    return tool("echo", "Echo the text back.", EchoInput, lambda args: args.text)


def two_tool_script() -> Recording:
    return Recording(
        tool_turn(("toolu_1", "add", {"a": 2, "b": 3}), ("toolu_2", "echo", {"text": "hey"})),
        text_turn("2 + 3 = 5 and the echo said hey"),
    )


def read_jsonl(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


# -- tracing ---------------------------------------------------------------------------


async def test_jsonl_trace_of_a_two_tool_run(tmp_path):
    path = tmp_path / "trace.jsonl"
    script = two_tool_script()
    agent = make_agent(model_client=script.client(), tools=[add_tool(), echo_tool()], name="calc")
    agent_tracer = create_jsonl_context_tracer(path=path)

    result = await agent.prompt("Add 2 and 3, then echo hey.", tracer=agent_tracer)
    assert result.subtype == "success"
    assert result.result == "2 + 3 = 5 and the echo said hey"

    rows = read_jsonl(path)
    assert [r["type"] for r in rows] == [
        "run_start",
        "user_message",
        "model_request",
        "assistant_message",
        "tool_use",
        "tool_use",
        "tool_result",
        "tool_result",
        "user_message",
        "model_request",
        "assistant_message",
        "result",
    ]
    seqs = [r["seq"] for r in rows]
    assert all(b > a for a, b in zip(seqs, seqs[1:], strict=False)), seqs
    assert len({r["run_id"] for r in rows}) == 1
    assert len({r["session_id"] for r in rows}) == 1
    for row in rows:
        assert row["version"] == 1
        assert row["source"]["kind"] == "agent"
        assert row["source"]["name"] == "calc"

    tool_uses = [r["data"] for r in rows if r["type"] == "tool_use"]
    assert [t.get("description") for t in tool_uses] == ["Add two integers.", "Echo the text back."]
    assert [(t["tool_use_id"], t["name"], t["input"]) for t in tool_uses] == [
        ("toolu_1", "add", {"a": 2, "b": 3}),
        ("toolu_2", "echo", {"text": "hey"}),
    ]
    tool_results = [r["data"] for r in rows if r["type"] == "tool_result"]
    assert [(t["tool_use_id"], t["result"]["content"], t["is_error"]) for t in tool_results] == [
        ("toolu_1", "5", False),
        ("toolu_2", "hey", False),
    ]
    user_messages = [r["data"]["message"] for r in rows if r["type"] == "user_message"]
    assert json.dumps(user_messages[0]["content"]).count("Add 2 and 3, then echo hey.") == 1
    assert [b["tool_use_id"] for b in user_messages[1]["content"]] == ["toolu_1", "toolu_2"]
    assert rows[-1]["data"]["subtype"] == "success"


async def test_tracer_path_in_a_missing_directory_is_created(tmp_path):
    path = tmp_path / "not" / "yet" / "there" / "trace.jsonl"
    agent = make_agent(
        model_client=Recording(text_turn("hello")).client(),
        tracer=create_jsonl_context_tracer(path=path),
    )
    result = await agent.prompt("hi")
    assert result.subtype == "success"
    types = [r["type"] for r in read_jsonl(path)]
    assert types[0] == "run_start" and types[-1] == "result"


async def test_dir_tracer_writes_the_run_into_its_session_file(tmp_path):
    out = tmp_path / "runs"
    agent = make_agent(model_client=Recording(text_turn("hello")).client())
    await agent.prompt("hi", tracer=create_jsonl_context_tracer(dir=out))
    files = list(out.iterdir())
    assert len(files) == 1
    rows = read_jsonl(files[0])
    assert files[0].name == f"{rows[0]['session_id']}.jsonl"
    assert rows[-1]["type"] == "result"


async def test_a_raising_redact_drops_events_reports_once_and_the_run_succeeds(tmp_path, caplog):
    path = tmp_path / "trace.jsonl"

    def redact(event):
        if event["type"] == "model_request":
            raise RuntimeError("redaction policy crashed")
        return event

    script = two_tool_script()
    agent = make_agent(
        model_client=script.client(),
        tools=[add_tool(), echo_tool()],
        tracer=create_jsonl_context_tracer(path=path, redact=redact),
    )
    with caplog.at_level(logging.WARNING):
        result = await agent.prompt("Add 2 and 3, then echo hey.")

    assert result.subtype == "success"
    assert result.is_error is False
    types = [r["type"] for r in read_jsonl(path)]
    assert "model_request" not in types
    assert types.count("assistant_message") == 2  # everything else was written
    assert types[-1] == "result"
    reports = [r for r in caplog.records if "redact" in r.getMessage()]
    assert len(reports) == 1  # two model_request events failed; reported once
    assert reports[0].levelno == logging.WARNING


async def test_redact_shapes_only_the_file_never_the_model_request(tmp_path):
    path = tmp_path / "trace.jsonl"

    def redact(event):
        if event["type"] == "model_request":
            return {**event, "data": {**event["data"], "messages": "[redacted]"}}
        if event["type"] == "tool_result":
            return None
        return event

    script = two_tool_script()
    agent = make_agent(
        model_client=script.client(),
        tools=[add_tool(), echo_tool()],
        tracer=create_jsonl_context_tracer(path=path, redact=redact),
    )
    assert (await agent.prompt("Add 2 and 3, then echo hey.")).subtype == "success"
    rows = read_jsonl(path)
    assert [r["data"]["messages"] for r in rows if r["type"] == "model_request"] == ["[redacted]"] * 2
    assert "tool_result" not in [r["type"] for r in rows]
    assert script.requests[0][0]["content"] in (
        "Add 2 and 3, then echo hey.",
        [{"type": "text", "text": "Add 2 and 3, then echo hey."}],
    )


async def test_composite_gives_every_sink_the_same_numbered_events(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b" / "b.jsonl"
    tracer = create_composite_context_tracer(
        [create_jsonl_context_tracer(path=a), None, create_jsonl_context_tracer(path=b)]
    )
    agent = make_agent(
        model_client=two_tool_script().client(), tools=[add_tool(), echo_tool()], tracer=tracer
    )
    assert (await agent.prompt("go")).subtype == "success"
    await tracer.close()
    rows_a, rows_b = read_jsonl(a), read_jsonl(b)
    assert rows_a == rows_b
    assert [r["seq"] for r in rows_a] == list(range(1, len(rows_a) + 1))


# -- history ---------------------------------------------------------------------------


async def test_a_second_agent_over_the_same_jsonl_store_continues(tmp_path):
    path = tmp_path / "sessions" / "ada.jsonl"
    first = make_agent(
        model_client=Recording(text_turn("Nice to meet you, Ada.")).client(),
        history_store=create_jsonl_history_store(path=path),
    )
    assert (await first.prompt("My name is Ada.")).subtype == "success"
    stored = await create_jsonl_history_store(path=path).load()
    assert stored == await first.get_history()
    assert [m["role"] for m in stored] == ["user", "assistant"]

    script = Recording(text_turn("Your name is Ada."))
    second = make_agent(model_client=script.client(), history_store=create_jsonl_history_store(path=path))
    assert (await second.prompt("What is my name?")).result == "Your name is Ada."
    assert script.requests[0][:2] == stored
    assert len(await create_jsonl_history_store(path=path).load()) == 4


async def test_replace_history_rewrites_the_jsonl_file(tmp_path):
    path = tmp_path / "h.jsonl"
    store = create_jsonl_history_store(path=path)
    agent = make_agent(model_client=Recording(text_turn("one")).client(), history_store=store)
    await agent.prompt("first")
    replacement = [{"role": "user", "content": "only this"}, {"role": "assistant", "content": "ok"}]
    await agent.replace_history(replacement)
    assert await create_jsonl_history_store(path=path).load() == replacement


async def test_a_corrupt_history_line_is_skipped(tmp_path, caplog):
    path = tmp_path / "h.jsonl"
    good = [
        {"role": "user", "content": "My name is Ada."},
        {"role": "assistant", "content": [{"type": "text", "text": "Hello Ada."}]},
    ]
    path.write_text(
        json.dumps(good[0]) + "\n" + "{garbage\n" + json.dumps(good[1]) + "\n" + '{"role": "us',
        encoding="utf-8",
    )
    script = Recording(text_turn("You are Ada."))
    agent = make_agent(model_client=script.client(), history_store=create_jsonl_history_store(path=path))
    with caplog.at_level(logging.WARNING, logger="lattice_worker.history"):
        result = await agent.prompt("Who am I?")
    assert result.subtype == "success"
    assert script.requests[0][:2] == good
    assert len(script.requests[0]) == 3
    warnings = [r.getMessage() for r in caplog.records if r.name == "lattice_worker.history"]
    assert len(warnings) == 1 and "2, 4" in warnings[0] and str(path) in warnings[0]
    # the new messages landed on readable lines after the torn one
    assert [m["role"] for m in await create_jsonl_history_store(path=path).load()] == [
        "user",
        "assistant",
        "user",
        "assistant",
    ]


def failing_store(*, fail_on_error: bool, calls: list[str]):
    def load():
        calls.append("load")
        return []

    def append(message):
        calls.append("append")
        raise RuntimeError("history database is down")

    def replace(messages):
        calls.append("replace")
        raise RuntimeError("history database is down")

    return define_history_store(load=load, append=append, replace=replace, fail_on_error=fail_on_error)


async def test_store_errors_are_swallowed_by_default():
    calls: list[str] = []
    agent = make_agent(
        model_client=Recording(text_turn("still here")).client(),
        history_store=failing_store(fail_on_error=False, calls=calls),
    )
    result = await agent.prompt("hello")
    assert result.subtype == "success"
    assert result.result == "still here"
    assert [m["role"] for m in await agent.get_history()] == ["user", "assistant"]  # kept in memory
    assert calls[0] == "load" and "append" in calls


async def test_store_errors_fail_the_query_with_fail_on_error():
    calls: list[str] = []
    agent = make_agent(
        model_client=Recording(text_turn("never")).client(),
        history_store=failing_store(fail_on_error=True, calls=calls),
    )
    with pytest.raises(RuntimeError, match="history database is down"):
        async for _ in agent.query("hello"):
            pass
    assert calls[:2] == ["load", "append"]


async def test_load_runs_once_per_agent():
    calls: list[str] = []
    saved: list[dict] = []
    store = define_history_store(
        load=lambda: calls.append("load") or list(saved),
        append=saved.append,
        replace=lambda ms: saved.__setitem__(slice(None), ms),
    )
    agent = make_agent(model_client=Recording(text_turn("a"), text_turn("b")).client(), history_store=store)
    await agent.prompt("one")
    await agent.prompt("two")
    assert calls == ["load"]
    assert [m["role"] for m in saved] == ["user", "assistant", "user", "assistant"]


# -- resume in a fresh process ---------------------------------------------------------

CHILD = textwrap.dedent(
    """
    import asyncio, json, sys

    from lattice_worker import (
        AssistantModelMessage, ScriptedModelClient, create_bare_agent, create_jsonl_history_store,
    )

    path, prompt, reply = sys.argv[1], sys.argv[2], sys.argv[3]
    requests = []

    def respond(request):
        requests.append(json.loads(json.dumps(request.messages)))
        return AssistantModelMessage(content=[{"type": "text", "text": reply}], stop_reason="end_turn")

    async def main():
        agent = create_bare_agent(model_client=ScriptedModelClient([respond]),
                        history_store=create_jsonl_history_store(path=path, fail_on_error=True))
        result = await agent.prompt(prompt)
        print(json.dumps({"subtype": result.subtype, "result": result.result, "requests": requests,
                          "history": await agent.get_history()}))

    asyncio.run(main())
    """
)


def run_child(script, *args: str) -> dict:
    proc = subprocess.Popen(
        [sys.executable, str(script), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # own process group, stopped by its id on timeout
    )
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.timeout(120)
def test_history_written_in_one_process_is_continued_in_another(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(CHILD, encoding="utf-8")
    history = tmp_path / "state" / "lead.jsonl"

    a = run_child(script, str(history), "Remember: the launch code is 7421.", "Noted: 7421.")
    assert a["subtype"] == "success"
    assert len(a["history"]) == 2

    b = run_child(script, str(history), "What is the launch code?", "It is 7421.")
    assert b["subtype"] == "success" and b["result"] == "It is 7421."
    request = b["requests"][0]
    assert request[:2] == a["history"]  # process A's whole conversation reached the model in B
    assert request[2]["role"] == "user"
    assert "What is the launch code?" in json.dumps(request[2])
    assert b["history"][:2] == a["history"] and len(b["history"]) == 4
