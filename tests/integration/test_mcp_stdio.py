"""MCP over stdio against a real server the tests start (tests/support/mcp_stdio_server.py,
written with the mcp SDK's low-level server): names, schemas, annotations, results,
and what happens when the server misbehaves."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import mcp
import pytest

from lattice_worker import (
    ConfigError,
    MCPConnectionError,
    MCPConnectTimeoutError,
    connect_mcp_stdio_server,
    create_mcp_tools,
)
from lattice_worker.tools.tool import TOOL_NAME_PATTERN, ToolContext, ToolInputError
from tests.support.mcp_servers import STDIO_SERVER, kill_and_wait, process_alive, stdio_config

CTX = ToolContext(tool_use_id="toolu_test", tool_name="test")


def by_server_name(tools):
    return {t.metadata["mcp"]["name"]: t for t in tools}


async def call(tool, arguments):
    return await tool.invoke(tool.parse_input(arguments), CTX)


def text_of(result) -> str:
    if isinstance(result.content, str):
        return result.content
    return "".join(b.get("text", "") for b in result.content)


def calls_in(counter: Path) -> list[str]:
    return counter.read_text().splitlines() if counter.exists() else []


async def test_names_schemas_and_annotations(tmp_path):
    async with connect_mcp_stdio_server(stdio_config(), name_prefix="docs") as conn:
        names = {t.metadata["mcp"]["name"]: t.name for t in conn.tools}
        assert names["docs.search"] == "docs_docs_search"
        assert names["get weather"] == "docs_get_weather"
        assert names["make_event"] == "docs_make_event"
        long = [n for server, n in names.items() if server.startswith("fetch_")][0]
        assert len(long) == 64 and long.startswith("docs_fetch_xxx")
        assert all(TOOL_NAME_PATTERN.match(t.name) for t in conn.tools)
        assert len({t.name for t in conn.tools}) == len(conn.tools)

        # the tool whose schema allows no object is refused alone; the others loaded
        assert [name for name, _ in conn.refused_tools] == ["impossible"]
        assert "impossible" not in names and len(conn.tools) == 10

        tools = by_server_name(conn.tools)
        search = tools["docs.search"]
        assert search.metadata["mcp"] == {
            "server": "docs",
            "name": "docs.search",
            "annotations": {"readOnlyHint": True, "idempotentHint": True, "openWorldHint": False},
        }
        assert search.is_concurrency_safe is True
        assert tools["die"].metadata["mcp"]["annotations"] == {"destructiveHint": True}
        assert tools["die"].is_concurrency_safe is None
        # effects from the annotations (docs/tool-effects.md)
        assert (search.effect, search.dedup_window_s) == ("read_only", None)
        assert (tools["die"].effect, tools["die"].dedup_window_s) == ("unguarded", None)
        unannotated = [t for t in conn.tools if not t.metadata["mcp"]["annotations"]]
        assert unannotated and {t.effect for t in unannotated} == {"unguarded"}

        # $defs: Place inlined everywhere, the recursive Item kept as a resolvable $ref
        event = tools["make_event"].input_schema
        assert event["properties"]["place"]["properties"]["city"] == {"title": "City", "type": "string"}
        assert set(event["$defs"]) == {"Item"}
        assert event["properties"]["agenda"]["properties"]["children"]["items"] == {"$ref": "#/$defs/Item"}

        # the top-level anyOf: an object schema the provider accepts
        pick = tools["pick"].to_model_tool()["input_schema"]
        assert pick["type"] == "object" and "anyOf" not in pick
        assert set(pick["properties"]) == {"id", "name"}


async def test_calls_reach_the_server_by_its_own_name_and_results_map(tmp_path):
    counter = tmp_path / "calls"
    async with connect_mcp_stdio_server(stdio_config(counter=str(counter)), name_prefix="docs") as conn:
        tools = by_server_name(conn.tools)
        weather = await call(tools["get weather"], {"city": "Oslo"})
        assert text_of(weather) == "sunny in Oslo"
        assert weather.structured_result == {"city": "Oslo", "sky": "sunny"}
        assert weather.is_error is False

        event = await call(
            tools["make_event"],
            {
                "title": "launch",
                "place": {"city": "Delft"},
                "agenda": {"label": "a", "children": [{"label": "b"}]},
            },
        )
        assert '"place": {"city": "Delft"}' in text_of(event)

        rich = await call(tools["rich"], {})
        kinds = [b["type"] for b in rich.content]
        assert kinds == ["text", "image", "text", "image", "text"]
        assert rich.content[1]["source"]["media_type"] == "image/png"
        assert rich.content[2]["text"] == "[resource file:///notes.txt (text/plain)]\nhello notes"
        assert "application/octet-stream" in rich.content[4]["text"]
        assert rich.structured_result == {"count": 3}

        failed = await call(tools["fail"], {})
        assert failed.is_error is True and text_of(failed) == "the disk is full"

        picked = await call(tools["pick"], {"name": "x"})
        assert '"arguments": {"name": "x"}' in text_of(picked)
        with pytest.raises(ToolInputError, match="not valid under any of the given schemas"):
            await call(tools["pick"], {})  # checked against the real union before the call

        assert calls_in(counter) == ["get weather", "make_event", "rich", "fail", "pick"]


async def test_a_server_that_dies_mid_call_gives_an_error_result_and_the_next_call_restarts_it(tmp_path):
    counter = tmp_path / "calls"
    async with connect_mcp_stdio_server(stdio_config(counter=str(counter)), call_timeout=60) as conn:
        tools = by_server_name(conn.tools)
        first_pid = int(text_of(await call(tools["pid"], {})))

        died = await call(tools["die"], {})
        assert died.is_error is True
        assert "closed during the call" in text_of(died) and '"die"' in text_of(died)
        assert not conn.connected

        second_pid = int(text_of(await call(tools["pid"], {})))
        assert second_pid != first_pid
        assert conn.reconnects == 1
        assert not process_alive(first_pid)
        # the call in flight when the server died was not sent again
        assert calls_in(counter) == ["pid", "die", "pid"]


async def test_a_server_killed_between_calls_is_restarted_before_the_next_call(tmp_path):
    counter = tmp_path / "calls"
    async with connect_mcp_stdio_server(stdio_config(counter=str(counter))) as conn:
        tools = by_server_name(conn.tools)
        pid = int(text_of(await call(tools["pid"], {})))
        kill_and_wait(pid)  # dead before the next call, the loop not running meanwhile
        assert conn.connected  # not noticed yet: nothing ran on the loop

        again = await call(tools["pid"], {})
        assert again.is_error is False and int(text_of(again)) != pid
        assert calls_in(counter) == ["pid", "pid"]


async def test_a_call_that_exceeds_the_call_timeout_is_an_error_result_and_the_connection_stays():
    async with connect_mcp_stdio_server(stdio_config(), call_timeout=1) as conn:
        tools = by_server_name(conn.tools)
        slow = await call(tools["slow"], {"seconds": 60})
        assert slow.is_error is True
        assert (
            text_of(slow)
            == 'MCP tool "slow" on server "test-stdio" did not answer within the call timeout of 1 s'
        )
        assert text_of(await call(tools["docs.search"], {"query": "q"})) == "found: q"
        assert conn.reconnects == 0


async def test_non_protocol_stdout_is_skipped_and_reported(caplog):
    caplog.set_level(logging.WARNING, logger="lattice_worker.mcp")
    async with connect_mcp_stdio_server(stdio_config("--banner")) as conn:
        assert len(conn.tools) == 10
        assert len(conn.stdout_noise) == 1 and "(not JSON-RPC)" in conn.stdout_noise[0]
        assert text_of(await call(by_server_name(conn.tools)["docs.search"], {"query": "q"})) == "found: q"
    warnings = [r.getMessage() for r in caplog.records if r.name == "lattice_worker.mcp"]
    assert any("not MCP JSON-RPC; skipped" in w and "(not JSON-RPC)" in w for w in warnings)


async def test_a_server_that_never_answers_the_handshake_fails_the_connect_naming_it():
    with pytest.raises(MCPConnectTimeoutError) as caught:
        await connect_mcp_stdio_server(stdio_config("--silent"), connect_timeout=1)
    message = str(caught.value)
    assert "mcp_stdio_server.py --silent" in message and "connect_timeout=1 s" in message
    assert isinstance(caught.value, TimeoutError)
    assert "mcp_stdio_server.py --silent" in caught.value.server


async def test_bad_arguments_are_refused_at_once_and_a_missing_command_is_a_clear_error():
    with pytest.raises(ConfigError, match=r'server\["command"\]'):
        connect_mcp_stdio_server({"args": []})
    with pytest.raises(ConfigError, match="unknown server key"):
        connect_mcp_stdio_server({"command": "x", "arg": []})
    with pytest.raises(ConfigError, match="call_timeout"):
        connect_mcp_stdio_server({"command": "x"}, call_timeout=0)
    with pytest.raises(MCPConnectionError, match="could not be started"):
        await connect_mcp_stdio_server({"command": "/nonexistent/mcp-server"})
    with pytest.raises(MCPConnectionError, match="closed the connection during the handshake"):
        await connect_mcp_stdio_server({"command": sys.executable, "args": ["-c", "import sys; sys.exit(3)"]})


async def test_close_stops_the_server_and_the_tools_then_answer_errors():
    conn = await connect_mcp_stdio_server(stdio_config())
    tools = by_server_name(conn.tools)
    pid = int(text_of(await call(tools["pid"], {})))
    await conn.close()
    await conn.close()  # idempotent
    assert not process_alive(pid)
    after = await call(tools["pid"], {})
    assert after.is_error is True and "is closed" in text_of(after)


async def test_create_mcp_tools_over_an_sdk_client_and_its_session():
    parameters = mcp.StdioServerParameters(command=sys.executable, args=[STDIO_SERVER])
    async with mcp.Client(parameters) as client:
        tools = await create_mcp_tools(client, name_prefix="repo")
        search = {t.name: t for t in tools}["repo_docs_search"]
        assert text_of(await call(search, {"query": "a"})) == "found: a"
        assert search.metadata["mcp"]["server"] == "test-stdio"

        session_tools = await create_mcp_tools(client.session, name_prefix="s", call_timeout=1)
        slow = {t.name: t for t in session_tools}["s_slow"]
        result = await call(slow, {"seconds": 60})
        assert result.is_error and "call timeout of 1 s" in text_of(result)

    with pytest.raises(ConfigError, match="list_tools"):
        await create_mcp_tools(object())


async def test_the_connection_client_gives_more_tools_over_the_same_connection():
    async with connect_mcp_stdio_server(stdio_config(), name_prefix="a") as conn:
        again = await create_mcp_tools(conn.client, name_prefix="b")
        assert {t.name for t in again} == {t.name.replace("a_", "b_", 1) for t in conn.tools}
        search = {t.name: t for t in again}["b_docs_search"]
        assert text_of(await call(search, {"query": "z"})) == "found: z"
