"""Trace sinks on their own: the JSONL tracer and the composite tracer.

The JSONL tracer (redaction, ``fail_on_error``), custom sinks and
``create_composite_context_tracer``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading

import pytest
from pydantic import BaseModel

from lattice_worker.errors import ConfigError
from lattice_worker.tracing import (
    ContextTracer,
    TraceContext,
    TraceEmitter,
    create_composite_context_tracer,
    create_jsonl_context_tracer,
    define_context_tracer,
)
from lattice_worker.tracing.jsonl import session_file_name


def event(type_: str = "user_message", session_id: str = "s1", seq: int | None = None, **data) -> dict:
    return {
        "version": 1,
        "timestamp": "2026-06-28T12:00:00.000Z",
        "session_id": session_id,
        "run_id": "r1",
        "seq": seq,
        "source": {"kind": "agent", "name": "agent"},
        "type": type_,
        "data": data or {"message": {"role": "user", "content": "hi"}},
    }


def read_jsonl(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def tracing_warnings(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "lattice_worker.tracing" and r.levelno == logging.WARNING]


# -- configuration ---------------------------------------------------------------------


def test_exactly_one_of_path_or_dir(tmp_path):
    with pytest.raises(ConfigError, match="exactly one of path= or dir="):
        create_jsonl_context_tracer()
    with pytest.raises(ConfigError, match="exactly one of path= or dir="):
        create_jsonl_context_tracer(path=tmp_path / "a.jsonl", dir=tmp_path)


def test_bad_paths_and_redact_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="path must be a non-empty path"):
        create_jsonl_context_tracer(path="")
    with pytest.raises(ConfigError, match="is a directory"):
        create_jsonl_context_tracer(path=tmp_path)
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    with pytest.raises(ConfigError, match="not a directory"):
        create_jsonl_context_tracer(dir=a_file)
    with pytest.raises(ConfigError, match="redact must be callable"):
        create_jsonl_context_tracer(path=tmp_path / "t.jsonl", redact="no")  # type: ignore[arg-type]


# -- JSONL tracer ----------------------------------------------------------------------


async def test_path_in_missing_directory_is_created_and_seq_filled(tmp_path):
    path = tmp_path / "deep" / "er" / "trace.jsonl"
    tracer = create_jsonl_context_tracer(path=path)
    assert isinstance(tracer, ContextTracer)
    assert tracer.fail_on_error is False
    for type_ in ("run_start", "user_message", "result"):
        await tracer.on_event(event(type_))
    rows = read_jsonl(path)
    assert [r["type"] for r in rows] == ["run_start", "user_message", "result"]
    assert [r["seq"] for r in rows] == [1, 2, 3]
    assert rows[1]["data"] == {"message": {"role": "user", "content": "hi"}}
    assert tracer.events_written == 3


async def test_a_given_seq_is_kept_and_the_callers_event_is_not_mutated(tmp_path):
    tracer = create_jsonl_context_tracer(path=tmp_path / "t.jsonl")
    given = event(seq=41)
    await tracer.on_event(given)
    missing = event()
    await tracer.on_event(missing)
    assert [r["seq"] for r in read_jsonl(tmp_path / "t.jsonl")] == [41, 1]
    assert missing["seq"] is None


async def test_dir_writes_one_file_per_session(tmp_path):
    out = tmp_path / "runs"
    tracer = create_jsonl_context_tracer(dir=out)
    await tracer.on_event(event("run_start", session_id="alpha"))
    await tracer.on_event(event("run_start", session_id="beta"))
    await tracer.on_event(event("result", session_id="alpha"))
    assert sorted(p.name for p in out.iterdir()) == ["alpha.jsonl", "beta.jsonl"]
    alpha = read_jsonl(out / "alpha.jsonl")
    assert [(r["type"], r["seq"]) for r in alpha] == [("run_start", 1), ("result", 3)]
    assert [(r["type"], r["seq"]) for r in read_jsonl(out / "beta.jsonl")] == [("run_start", 2)]


async def test_dir_mode_never_escapes_the_directory(tmp_path):
    out = tmp_path / "runs"
    tracer = create_jsonl_context_tracer(dir=out)
    await tracer.on_event(event(session_id="../../etc/passwd"))
    await tracer.on_event(event(session_id=".hidden"))
    await tracer.on_event(event(session_id=None))
    assert sorted(p.name for p in out.iterdir()) == [
        "_.._.._etc_passwd.jsonl",
        "_.hidden.jsonl",
        "no-session.jsonl",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]
    assert session_file_name("9b2c-uuid_1.x") == "9b2c-uuid_1.x.jsonl"


async def test_values_json_cannot_encode_are_written_in_a_readable_form(tmp_path):
    class Payload(BaseModel):
        answer: int

    tracer = create_jsonl_context_tracer(path=tmp_path / "t.jsonl")
    await tracer.on_event(event("tool_result", payload=Payload(answer=42), raw=b"\x00\x01", tags={"a"}))
    row = read_jsonl(tmp_path / "t.jsonl")[0]
    assert row["data"] == {"payload": {"answer": 42}, "raw": "AAE=", "tags": ["a"]}


async def test_redact_changes_what_is_written_and_gets_a_deep_copy(tmp_path):
    seen: list[dict] = []

    def redact(ev):
        seen.append(ev)
        if ev["type"] == "model_request":
            ev["data"]["messages"] = "[redacted]"  # mutating the copy is allowed
            return ev
        if ev["type"] == "tool_result":
            return None
        return ev

    tracer = create_jsonl_context_tracer(path=tmp_path / "t.jsonl", redact=redact)
    request = event("model_request", messages=[{"role": "user", "content": "secret"}])
    await tracer.on_event(request)
    await tracer.on_event(event("tool_result", content="skip me"))
    await tracer.on_event(event("result", result="done"))

    rows = read_jsonl(tmp_path / "t.jsonl")
    assert [r["type"] for r in rows] == ["model_request", "result"]
    assert rows[0]["data"]["messages"] == "[redacted]"
    assert [r["seq"] for r in rows] == [1, 3]  # redact saw seq already filled; the skipped one used 2
    assert [ev["seq"] for ev in seen] == [1, 2, 3]
    # the caller's event (what the model saw) is untouched
    assert request["data"]["messages"] == [{"role": "user", "content": "secret"}]
    assert tracer.events_skipped == 1


async def test_async_redact_is_awaited(tmp_path):
    async def redact(ev):
        await asyncio.sleep(0)
        return {**ev, "data": {"redacted": True}}

    tracer = create_jsonl_context_tracer(path=tmp_path / "t.jsonl", redact=redact)
    await tracer.on_event(event())
    assert read_jsonl(tmp_path / "t.jsonl")[0]["data"] == {"redacted": True}


async def test_raising_redact_drops_the_event_and_is_logged_once(tmp_path, caplog):
    def redact(ev):
        if ev["type"] != "result":
            raise ValueError("policy bug")
        return ev

    tracer = create_jsonl_context_tracer(path=tmp_path / "t.jsonl", redact=redact)
    with caplog.at_level(logging.WARNING, logger="lattice_worker.tracing"):
        for type_ in ("run_start", "user_message", "model_request", "result"):
            await tracer.on_event(event(type_))

    assert [r["type"] for r in read_jsonl(tmp_path / "t.jsonl")] == ["result"]
    assert tracer.redact_failures == 3
    warnings = tracing_warnings(caplog)
    assert len(warnings) == 1
    assert "redact" in warnings[0].getMessage()
    assert isinstance(warnings[0].exc_info[1], ValueError)


async def test_redact_returning_a_non_dict_counts_as_a_failure(tmp_path, caplog):
    tracer = create_jsonl_context_tracer(path=tmp_path / "t.jsonl", redact=lambda ev: "oops")
    with caplog.at_level(logging.WARNING, logger="lattice_worker.tracing"):
        await tracer.on_event(event())
    assert not (tmp_path / "t.jsonl").exists()
    assert tracer.redact_failures == 1
    assert "must return a dict or None" in str(tracing_warnings(caplog)[0].exc_info[1])


async def test_raising_redact_with_fail_on_error_raises(tmp_path):
    def redact(ev):
        raise ValueError("policy bug")

    tracer = create_jsonl_context_tracer(path=tmp_path / "t.jsonl", redact=redact, fail_on_error=True)
    assert tracer.fail_on_error is True
    with pytest.raises(ValueError, match="policy bug"):
        await tracer.on_event(event())
    assert not (tmp_path / "t.jsonl").exists()


async def test_write_failures_are_swallowed_and_logged_once_unless_fail_on_error(tmp_path, caplog):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    quiet = create_jsonl_context_tracer(path=blocker / "t.jsonl")
    with caplog.at_level(logging.WARNING, logger="lattice_worker.tracing"):
        await quiet.on_event(event())
        await quiet.on_event(event())
    assert quiet.write_failures == 2
    assert len(tracing_warnings(caplog)) == 1

    loud = create_jsonl_context_tracer(path=blocker / "t.jsonl", fail_on_error=True)
    with pytest.raises(OSError):
        await loud.on_event(event())


async def test_concurrent_emitters_in_threads_and_tasks_never_interleave(tmp_path):
    path = tmp_path / "t.jsonl"
    tracer = create_jsonl_context_tracer(path=path)
    big = "y" * 100_000

    def worker(n: int) -> None:
        async def run() -> None:
            await asyncio.gather(*(tracer.on_event(event(text=f"{n}-{i}-{big}")) for i in range(25)))

        asyncio.run(run())

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    rows = read_jsonl(path)
    assert len(rows) == 100
    assert sorted(r["seq"] for r in rows) == list(range(1, 101))
    assert {r["data"]["text"].rsplit("-", 1)[0] for r in rows} == {
        f"{n}-{i}" for n in range(4) for i in range(25)
    }


async def test_flush_and_close_are_safe_and_events_are_readable_before_them(tmp_path):
    tracer = create_jsonl_context_tracer(path=tmp_path / "t.jsonl")
    await tracer.on_event(event())
    assert len(read_jsonl(tmp_path / "t.jsonl")) == 1  # already on disk, no flush needed
    await tracer.flush()
    await tracer.close()
    await tracer.on_event(event())
    assert len(read_jsonl(tmp_path / "t.jsonl")) == 2


async def test_trace_emitter_writes_full_envelopes_through_the_jsonl_tracer(tmp_path):
    tracer = create_jsonl_context_tracer(path=tmp_path / "t.jsonl")
    ctx = TraceContext(session_id="sess", source={"kind": "agent", "name": "ada"}, parent_run_id="parent")
    emitter = TraceEmitter(tracer, ctx)
    await emitter.emit("run_start", {"model": "m", "tools": ["add"]})
    await emitter.emit("result", {"subtype": "success"})
    rows = read_jsonl(tmp_path / "t.jsonl")
    assert [(r["type"], r["seq"]) for r in rows] == [("run_start", 1), ("result", 2)]
    for row in rows:
        assert row["version"] == 1
        assert row["session_id"] == "sess"
        assert row["run_id"] == ctx.run_id
        assert row["parent_run_id"] == "parent"
        assert row["source"] == {"kind": "agent", "name": "ada"}
        assert row["timestamp"].endswith("Z")


# -- composite -------------------------------------------------------------------------


class Recorder:
    """A hand-written sink (no factory), recording what it receives."""

    def __init__(self, name: str, log: list, *, fail: bool = False, fail_on_error: bool = False) -> None:
        self.name = name
        self.log = log
        self.fail = fail
        self.fail_on_error = fail_on_error
        self.events: list[dict] = []

    async def on_event(self, ev: dict) -> None:
        self.log.append((self.name, "event", ev["seq"]))
        self.events.append(ev)
        if self.fail:
            raise RuntimeError(f"{self.name} broke")

    def flush(self) -> None:  # sync on purpose: both kinds must work
        self.log.append((self.name, "flush"))
        if self.fail:
            raise RuntimeError(f"{self.name} flush broke")

    async def close(self) -> None:
        self.log.append((self.name, "close"))


async def test_composite_numbers_once_and_forwards_in_order(tmp_path):
    log: list = []
    a, b = Recorder("a", log), Recorder("b", log)
    jsonl = create_jsonl_context_tracer(path=tmp_path / "t.jsonl")
    composite = create_composite_context_tracer([a, None, jsonl, b])
    assert composite.tracers == (a, jsonl, b)
    assert composite.fail_on_error is False

    await composite.on_event(event("run_start"))
    await composite.on_event(event("result"))
    assert log == [("a", "event", 1), ("b", "event", 1), ("a", "event", 2), ("b", "event", 2)]
    assert [r["seq"] for r in read_jsonl(tmp_path / "t.jsonl")] == [1, 2]
    # each child gets its own envelope: one child's top-level edits do not leak into the next
    assert a.events[0] is not b.events[0]


async def test_composite_keeps_a_seq_already_set_and_nests(tmp_path):
    log: list = []
    inner = create_composite_context_tracer([Recorder("inner", log)])
    outer = create_composite_context_tracer([Recorder("outer", log), inner])
    await outer.on_event(event())
    await outer.on_event(event(seq=99))
    assert log == [
        ("outer", "event", 1),
        ("inner", "event", 1),
        ("outer", "event", 99),
        ("inner", "event", 99),
    ]


async def test_a_failing_child_does_not_stop_the_others_and_is_swallowed(caplog):
    log: list = []
    broken = Recorder("broken", log, fail=True)
    after = Recorder("after", log)
    composite = create_composite_context_tracer([broken, after])
    with caplog.at_level(logging.WARNING, logger="lattice_worker.tracing"):
        await composite.on_event(event())
        await composite.on_event(event())
        await composite.flush()
    assert log == [
        ("broken", "event", 1),
        ("after", "event", 1),
        ("broken", "event", 2),
        ("after", "event", 2),
        ("broken", "flush"),
        ("after", "flush"),
    ]
    messages = [r.getMessage() for r in tracing_warnings(caplog)]
    assert len(messages) == 2  # once for on_event, once for flush
    assert "on_event" in messages[0] and "flush" in messages[1]


async def test_a_fail_on_error_child_raises_after_every_child_got_the_event():
    log: list = []
    strict = Recorder("strict", log, fail=True, fail_on_error=True)
    lenient = Recorder("lenient", log, fail=True)
    last = Recorder("last", log)
    composite = create_composite_context_tracer([lenient, strict, last])
    assert composite.fail_on_error is True
    with pytest.raises(RuntimeError, match="strict broke"):
        await composite.on_event(event())
    assert log == [("lenient", "event", 1), ("strict", "event", 1), ("last", "event", 1)]


async def test_composite_failure_fails_the_run_through_the_emitter_only_when_strict():
    log: list = []
    ctx = TraceContext(session_id="s", source={"kind": "agent", "name": "a"})
    lenient = TraceEmitter(create_composite_context_tracer([Recorder("x", log, fail=True)]), ctx)
    await lenient.emit("run_start", {})  # swallowed
    strict = TraceEmitter(
        create_composite_context_tracer([Recorder("y", log, fail=True, fail_on_error=True)]), ctx
    )
    with pytest.raises(RuntimeError, match="y broke"):
        await strict.emit("run_start", {})


async def test_composite_forwards_flush_and_close_to_every_child(tmp_path):
    log: list = []
    flushed: list[str] = []
    defined = define_context_tracer(on_event=lambda ev: None, flush=lambda: flushed.append("defined"))
    composite = create_composite_context_tracer(
        [
            Recorder("a", log),
            defined,
            create_jsonl_context_tracer(path=tmp_path / "t.jsonl"),
            Recorder("b", log),
        ]
    )
    await composite.flush()
    await composite.close()
    assert log == [("a", "flush"), ("b", "flush"), ("a", "close"), ("b", "close")]
    assert flushed == ["defined"]


def test_composite_rejects_bad_entries():
    with pytest.raises(ConfigError, match="expected a list of tracers"):
        create_composite_context_tracer(create_jsonl_context_tracer(path="x.jsonl"))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="entry 1 .* no callable on_event"):
        create_composite_context_tracer([define_context_tracer(on_event=print), object()])


async def test_empty_composite_is_a_valid_no_op():
    composite = create_composite_context_tracer([None])
    await composite.on_event(event())
    await composite.flush()
    await composite.close()
    assert composite.tracers == ()
