"""An agent (ScriptedModelClient) calling MCP tools of a real stdio server end to end."""

from __future__ import annotations

from lattice_worker import ScriptedModelClient, connect_mcp_stdio_server, create_agent, text_turn, tool_turn
from tests.support.mcp_servers import stdio_config


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
