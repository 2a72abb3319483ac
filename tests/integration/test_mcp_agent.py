"""Agents (ScriptedModelClient) calling MCP tools of a real stdio server end to end: over a
connection the test owns, and over the pooled connections of the ``mcp_servers=`` option."""

from __future__ import annotations

import pytest

from lattice_worker import (
    ConfigError,
    ScriptedModelClient,
    connect_mcp_stdio_server,
    create_agent,
    define_agent,
    text_turn,
    tool,
    tool_turn,
)
from lattice_worker.tools.mcp.pool import close_pooled_connections
from tests.support.mcp_servers import kill_and_wait, process_alive, stdio_config


def tool_results(request) -> list[dict]:
    """The tool_result blocks of the last user message the model was sent."""
    last = request.messages[-1]
    assert last["role"] == "user"
    return [b for b in last["content"] if b.get("type") == "tool_result"]


def result_text(block) -> str:
    content = block["content"]
    return content if isinstance(content, str) else "".join(b.get("text", "") for b in content)


async def test_an_agent_calls_an_mcp_tool_and_answers_with_its_result():
    seen: dict[str, object] = {}

    def answer(request):
        [block] = tool_results(request)
        seen["result"] = result_text(block)
        seen["tools"] = [t["name"] for t in request.tools]
        return text_turn(f"The weather: {result_text(block)}")

    async with connect_mcp_stdio_server(stdio_config(), name_prefix="docs") as mcp_server:
        model = ScriptedModelClient([tool_turn(("docs_get_weather", {"city": "Oslo"})), answer])
        agent = create_agent(model="scripted", tools=mcp_server.tools, model_client=model)
        result = await agent.prompt("What is the weather in Oslo?")

    assert result.subtype == "success"
    assert result.result == "The weather: sunny in Oslo"
    assert seen["result"] == "sunny in Oslo"
    assert "docs_get_weather" in seen["tools"] and "docs_docs_search" in seen["tools"]
    # the model saw the merged object schema of the top-level anyOf tool
    [pick] = [t for t in model.requests[0].tools if t["name"] == "docs_pick"]
    assert pick["input_schema"]["type"] == "object" and "anyOf" not in pick["input_schema"]


async def test_the_run_goes_on_after_the_server_dies_mid_call():
    outcomes: list[tuple[bool, str]] = []

    def record(request):
        [block] = tool_results(request)
        outcomes.append((bool(block.get("is_error")), result_text(block)))

    def after_die(request):
        record(request)
        return tool_turn(("docs_docs_search", {"query": "still there?"}))

    def after_search(request):
        record(request)
        return text_turn("done")

    async with connect_mcp_stdio_server(stdio_config(), name_prefix="docs") as mcp_server:
        model = ScriptedModelClient([tool_turn(("docs_die", {})), after_die, after_search])
        agent = create_agent(model="scripted", tools=mcp_server.tools, model_client=model)
        result = await agent.prompt("Try the tools.")
        assert mcp_server.reconnects == 1

    assert result.subtype == "success" and result.result == "done"
    assert outcomes[0][0] is True and "closed during the call" in outcomes[0][1]
    assert outcomes[1] == (False, "found: still there?")


# --------------------------------------------------------------------------- mcp_servers= (pooled)


def pid_script(request):
    """Call docs_pid, then answer with what it returned ("pid <n>", or "error: ...")."""
    last = request.messages[-1]
    results = (
        [b for b in last["content"] if b.get("type") == "tool_result"]
        if isinstance(last["content"], list)
        else []
    )
    if not results:
        return tool_turn(("docs_pid", {}))
    [block] = results
    return text_turn(("error: " if block.get("is_error") else "pid ") + result_text(block))


def pid_of(result) -> int:
    assert result.subtype == "success" and result.result.startswith("pid "), result.result
    return int(result.result.split()[1])


async def test_mcp_servers_connect_lazily_are_reused_across_runs_and_restart_after_the_server_died(tmp_path):
    counter = tmp_path / "calls"
    spec = define_agent(
        model="scripted",
        model_client=ScriptedModelClient(pid_script),
        mcp_servers={"docs": stdio_config(counter=str(counter))},
    )
    first = pid_of(await spec.spawn().prompt("which pid?"))
    second = pid_of(await spec.spawn().prompt("which pid?"))
    assert second == first  # one connection per loop, reused by the next run

    kill_and_wait(first)  # the server dies between two runs (the loop does not run meanwhile)
    third = pid_of(await spec.spawn().prompt("which pid?"))
    assert third != first
    assert counter.read_text().splitlines() == ["pid", "pid", "pid"]
    await close_pooled_connections()
    assert not process_alive(third)


def test_each_event_loop_gets_its_own_connection_stopped_with_its_loop():
    spec = define_agent(
        model="scripted", model_client=ScriptedModelClient(pid_script), mcp_servers={"docs": stdio_config()}
    )
    first = pid_of(spec.spawn().prompt_sync("which pid?"))  # asyncio.run: a loop of its own
    assert not process_alive(
        first
    )  # the loop's end cancelled the connection's task, which stopped the server
    second = pid_of(spec.spawn().prompt_sync("which pid?"))
    assert second != first and not process_alive(second)


async def test_an_unreachable_server_is_left_out_of_the_query_with_a_warning(caplog):
    seen = {}

    def answer(request):
        seen["tools"] = [t["name"] for t in request.tools]
        return text_turn("ok")

    spec = define_agent(
        model="scripted",
        model_client=ScriptedModelClient(answer),
        mcp_servers={
            "docs": stdio_config(),
            "broken": {"command": "/nonexistent/mcp-server", "connect_timeout": 5},
        },
    )
    result = await spec.spawn().prompt("hello")
    assert result.subtype == "success"
    assert "docs_pid" in seen["tools"] and not any(n.startswith("broken_") for n in seen["tools"])
    assert any('MCP server "broken" left out' in r.getMessage() for r in caplog.records)
    await close_pooled_connections()


async def test_mcp_servers_options_are_checked_at_definition_and_names_at_query():
    with pytest.raises(ConfigError, match=r"mcp_servers.*unknown server key"):
        define_agent(mcp_servers={"docs": {"command": "x", "argv": []}})
    with pytest.raises(ConfigError, match="must be 1-32 letters"):
        define_agent(mcp_servers={"my docs": {"command": "x"}})
    with pytest.raises(ConfigError, match="url must be an http"):
        define_agent(mcp_servers={"remote": {"type": "http", "url": "mcp.example.com"}})
    with pytest.raises(ConfigError, match="call_timeout"):
        define_agent(mcp_servers={"docs": {"command": "x", "call_timeout": -1}})

    @tool
    def docs_pid() -> str:
        """A static tool whose name an MCP tool also takes."""
        return "static"

    agent = create_agent(
        model="scripted",
        tools=[docs_pid],
        mcp_servers={"docs": stdio_config()},
        model_client=ScriptedModelClient([]),
    )
    with pytest.raises(ConfigError, match='duplicate tool name "docs_pid"'):
        await agent.prompt("hello")
    await close_pooled_connections()
