"""History stores on their own: the JSONL file store and host-defined stores.

``create_jsonl_history_store`` and ``define_history_store``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os

import pytest

from lattice_worker.agent.history import HistoryStore
from lattice_worker.agent.history_stores import (
    JsonlHistoryStore,
    create_jsonl_history_store,
    define_history_store,
)
from lattice_worker.errors import ConfigError

USER = {"role": "user", "content": "hello"}
ASSISTANT = {"role": "assistant", "content": [{"type": "text", "text": "hi there"}]}
TOOL_USE = {
    "role": "assistant",
    "content": [{"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 1, "b": 2}}],
}
TOOL_RESULT = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "3"}]}


def history_warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "lattice_worker.history" and r.levelno == logging.WARNING]


# -- JSONL store ---------------------------------------------------------------------


async def test_missing_file_loads_empty_and_first_append_creates_parent_dirs(tmp_path):
    path = tmp_path / "a" / "b" / "session.jsonl"
    store = create_jsonl_history_store(path=path)
    assert isinstance(store, HistoryStore)
    assert store.fail_on_error is False
    assert await store.load() == []
    assert not path.parent.exists()

    await store.append(USER)
    assert path.read_text(encoding="utf-8") == json.dumps(USER, separators=(",", ":")) + "\n"


async def test_append_then_load_round_trips_in_order(tmp_path):
    store = create_jsonl_history_store(path=tmp_path / "h.jsonl")
    for message in (USER, TOOL_USE, TOOL_RESULT, ASSISTANT):
        await store.append(message)
    lines = (tmp_path / "h.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(lines) == 4
    # A second store over the same file (a new Agent, or another process) sees the same history.
    assert await create_jsonl_history_store(path=tmp_path / "h.jsonl").load() == [
        USER,
        TOOL_USE,
        TOOL_RESULT,
        ASSISTANT,
    ]


async def test_messages_with_line_separator_characters_survive(tmp_path):
    # json.dumps(ensure_ascii=False) keeps U+2028 literal; str.splitlines() would cut there.
    tricky = {"role": "user", "content": "line one\u2028line two\u0085three\r\nfour — ✓"}
    store = create_jsonl_history_store(path=tmp_path / "h.jsonl")
    await store.append(tricky)
    await store.append(USER)
    assert await store.load() == [tricky, USER]


async def test_load_skips_torn_last_line_and_corrupt_middle_line_with_one_warning(tmp_path, caplog):
    path = tmp_path / "h.jsonl"
    path.write_text(
        "\n".join(
            [
                json.dumps(USER),
                "{this is not json",
                json.dumps(ASSISTANT),
                "42",  # JSON, but not a message
                json.dumps({"role": "user"}),  # no content
                "",  # blank lines are not errors
                json.dumps(USER),
                '{"role": "assistant", "content": [{"type": "te',  # torn final write
            ]
        ),
        encoding="utf-8",
    )
    store = create_jsonl_history_store(path=path)
    with caplog.at_level(logging.WARNING, logger="lattice_worker.history"):
        messages = await store.load()

    assert messages == [USER, ASSISTANT, USER]
    warnings = history_warnings(caplog)
    assert len(warnings) == 1
    text = warnings[0].getMessage()
    assert str(path) in text
    assert "2, 4, 5, 8" in text
    # Loading does not rewrite the file: nothing is lost.
    assert path.read_text(encoding="utf-8").count("\n") == 7


async def test_load_skips_a_line_cut_inside_a_multibyte_character(tmp_path, caplog):
    path = tmp_path / "h.jsonl"
    good = json.dumps(USER).encode() + b"\n"
    torn = json.dumps({"role": "user", "content": "naïve ✓"}, ensure_ascii=False).encode("utf-8")[:-4]
    path.write_bytes(good + torn)
    with caplog.at_level(logging.WARNING, logger="lattice_worker.history"):
        assert await create_jsonl_history_store(path=path).load() == [USER]
    assert "line 2" in history_warnings(caplog)[0].getMessage()


async def test_append_after_a_torn_line_starts_a_new_line(tmp_path, caplog):
    path = tmp_path / "h.jsonl"
    path.write_text(json.dumps(USER) + "\n" + '{"role": "assis', encoding="utf-8")
    store = create_jsonl_history_store(path=path)
    await store.append(ASSISTANT)
    with caplog.at_level(logging.WARNING, logger="lattice_worker.history"):
        assert await store.load() == [USER, ASSISTANT]
    assert len(history_warnings(caplog)) == 1


async def test_a_clean_load_logs_nothing(tmp_path, caplog):
    store = create_jsonl_history_store(path=tmp_path / "h.jsonl")
    await store.append(USER)
    with caplog.at_level(logging.WARNING, logger="lattice_worker.history"):
        assert await store.load() == [USER]
    assert history_warnings(caplog) == []


async def test_append_rejects_bad_messages_and_writes_nothing(tmp_path):
    path = tmp_path / "h.jsonl"
    store = create_jsonl_history_store(path=path)
    await store.append(USER)
    with pytest.raises(TypeError, match="must be a dict"):
        await store.append("hello")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not JSON-serialisable"):
        await store.append({"role": "user", "content": object()})
    with pytest.raises(TypeError, match="not JSON-serialisable"):
        await store.append({"role": "user", "content": float("nan")})
    assert await store.load() == [USER]


async def test_replace_rewrites_whole_history_and_leaves_no_temp_files(tmp_path):
    path = tmp_path / "h.jsonl"
    store = create_jsonl_history_store(path=path)
    for message in (USER, ASSISTANT, USER, ASSISTANT):
        await store.append(message)

    summary = {"role": "user", "content": "summary of the earlier conversation"}
    await store.replace([summary, ASSISTANT])
    assert await store.load() == [summary, ASSISTANT]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h.jsonl"]

    await store.append(USER)
    assert await store.load() == [summary, ASSISTANT, USER]

    await store.replace([])
    assert await store.load() == []
    assert path.read_bytes() == b""


async def test_replace_creates_missing_parent_directories(tmp_path):
    path = tmp_path / "new" / "dir" / "h.jsonl"
    store = create_jsonl_history_store(path=path)
    await store.replace([USER])
    assert await store.load() == [USER]


async def test_replace_with_a_bad_message_leaves_the_file_untouched(tmp_path):
    path = tmp_path / "h.jsonl"
    store = create_jsonl_history_store(path=path)
    await store.append(USER)
    before = path.read_bytes()
    with pytest.raises(TypeError, match="not JSON-serialisable"):
        await store.replace([ASSISTANT, {"role": "user", "content": {1, 2}}])
    with pytest.raises(TypeError, match="list of message dicts"):
        await store.replace(USER)  # type: ignore[arg-type]
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h.jsonl"]


async def test_replace_failing_at_the_rename_keeps_the_old_history(tmp_path, monkeypatch):
    path = tmp_path / "h.jsonl"
    store = create_jsonl_history_store(path=path)
    await store.append(USER)
    await store.append(ASSISTANT)

    def broken_replace(src, dst):
        raise OSError("disk went away")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk went away"):
        await store.replace([{"role": "user", "content": "new"}])
    monkeypatch.undo()

    assert await store.load() == [USER, ASSISTANT]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h.jsonl"]


async def test_concurrent_appends_keep_every_line_whole(tmp_path):
    store = create_jsonl_history_store(path=tmp_path / "h.jsonl", fsync=True)
    big = "x" * 200_000  # larger than any pipe/page buffer
    messages = [{"role": "user", "content": f"{i}:{big if i % 10 == 0 else ''}"} for i in range(60)]
    await asyncio.gather(*(store.append(m) for m in messages))
    loaded = await store.load()
    assert len(loaded) == 60
    assert sorted(loaded, key=lambda m: int(m["content"].split(":")[0])) == messages


async def test_fail_on_error_is_bound_at_creation(tmp_path):
    store = create_jsonl_history_store(path=tmp_path / "h.jsonl", fail_on_error=True)
    assert isinstance(store, JsonlHistoryStore)
    assert store.fail_on_error is True


@pytest.mark.parametrize("bad", ["", None, 12])
def test_create_jsonl_history_store_rejects_a_bad_path(bad):
    with pytest.raises(ConfigError, match="path"):
        create_jsonl_history_store(path=bad)  # type: ignore[arg-type]


async def test_load_of_an_unreadable_path_raises(tmp_path):
    # The path is a directory: the store cannot read it and says so instead of returning [].
    store = create_jsonl_history_store(path=tmp_path)
    with pytest.raises(OSError):
        await store.load()


# -- define_history_store -------------------------------------------------------------


async def test_define_history_store_with_sync_callables():
    saved: list[dict] = [USER]
    calls: list[str] = []

    def load():
        calls.append("load")
        return list(saved)

    def append(message):
        calls.append("append")
        saved.append(message)

    def replace(messages):
        calls.append("replace")
        saved[:] = messages

    store = define_history_store(load=load, append=append, replace=replace)
    assert isinstance(store, HistoryStore)
    assert store.fail_on_error is False
    assert await store.load() == [USER]
    await store.append(ASSISTANT)
    await store.replace([ASSISTANT])
    assert saved == [ASSISTANT]
    assert calls == ["load", "append", "replace"]


async def test_define_history_store_with_async_callables_and_fail_on_error():
    saved: list[dict] = []

    async def load():
        await asyncio.sleep(0)
        return None  # "nothing stored"

    async def append(message):
        saved.append(message)

    async def replace(messages):
        saved[:] = messages

    store = define_history_store(load=load, append=append, replace=replace, fail_on_error=True)
    assert store.fail_on_error is True
    assert await store.load() == []
    await store.append(USER)
    await store.replace([USER, ASSISTANT])
    assert saved == [USER, ASSISTANT]


async def test_define_history_store_load_returning_garbage_is_a_clear_error():
    store = define_history_store(load=lambda: "oops", append=lambda m: None, replace=lambda ms: None)
    with pytest.raises(TypeError, match="list of message dicts"):
        await store.load()
    store = define_history_store(load=lambda: [USER, 3], append=lambda m: None, replace=lambda ms: None)
    with pytest.raises(TypeError, match="item 1"):
        await store.load()


async def test_define_history_store_propagates_errors_of_the_host_callables():
    def append(message):
        raise RuntimeError("database down")

    store = define_history_store(load=lambda: [], append=append, replace=lambda ms: None)
    with pytest.raises(RuntimeError, match="database down"):
        await store.append(USER)


@pytest.mark.parametrize("missing", ["load", "append", "replace"])
def test_define_history_store_requires_callables(missing):
    impl = {"load": lambda: [], "append": lambda m: None, "replace": lambda ms: None}
    impl[missing] = "not a function"
    with pytest.raises(ConfigError, match=f"{missing} must be callable"):
        define_history_store(**impl)
