"""Deferred tools behind tool_search: what the model sees, exact and keyword
loads, loaded for the rest of the conversation (also after a resume from a
stored history in a new Agent), the search-first error, the name clash
(docs/tool-effects.md)."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel

from lattice_worker import (
    AutoCompactOptions,
    ConfigError,
    ScriptedModelClient,
    create_bare_agent,
    define_agent,
    define_history_store,
    text_turn,
    tool,
    tool_turn,
)
from lattice_worker.tools.tool_search import MAX_EXACT_NAMES, TOOL_SEARCH_NAME, loaded_in_history


class Q(BaseModel):
    q: str = ""


def make(name: str, description: str, **options):
    def handler(_inp: Q) -> str:
        return f"{name} ran"

    return tool(name, description, Q, handler, **options)


def catalog():
    return [
        make("lookup_order", "Find an order by id.", effect="read_only"),
        make("jira_create_issue", "Create an issue in the Jira tracker.", defer=True),
        make("jira_add_comment", "Add a comment to a Jira issue.", defer=True),
        make("refund", "Refund an order to the customer's card.", defer=True),
        make("weather", "Current weather for a city.", effect="read_only", defer=True),
    ]


def tool_names(request) -> list[str]:
    return [t["name"] for t in request.tools]


def results(history):
    return [
        b for m in history if m["role"] == "user" and isinstance(m["content"], list) for b in m["content"]
    ]


async def test_the_model_sees_only_names_until_it_loads_them():
    client = ScriptedModelClient(
        [
            tool_turn((TOOL_SEARCH_NAME, {"query": "jira_create_issue, refund"}, "s1")),
            tool_turn(("refund", {"q": "o-1"}, "r1")),
            text_turn("done"),
        ]
    )
    agent = create_bare_agent(model_client=client, tools=catalog())
    result = await agent.prompt("go", stream=False)
    assert result.subtype == "success"
    first, second, third = client.requests
    assert tool_names(first) == ["lookup_order", TOOL_SEARCH_NAME]
    search = next(t for t in first.tools if t["name"] == TOOL_SEARCH_NAME)
    for name in ("jira_create_issue", "jira_add_comment", "refund", "weather"):
        assert name in search["description"]
    assert "Refund an order" not in json.dumps(first.tools)  # a deferred description is not sent
    assert tool_names(second) == ["lookup_order", "jira_create_issue", "refund", TOOL_SEARCH_NAME]
    assert tool_names(third) == tool_names(second)  # loaded for good
    history = await agent.get_history()
    body = json.loads(results(history)[0]["content"])
    assert body["loaded"] == ["jira_create_issue", "refund"]
    assert results(history)[1] == {"type": "tool_result", "tool_use_id": "r1", "content": "refund ran"}


async def test_keyword_search_loads_the_best_matches_up_to_the_limit():
    client = ScriptedModelClient(
        [
            tool_turn((TOOL_SEARCH_NAME, {"query": "jira issue"}, "s1")),
            tool_turn((TOOL_SEARCH_NAME, {"query": "weather forecast city", "limit": 1}, "s2")),
            tool_turn((TOOL_SEARCH_NAME, {"query": "spaceship"}, "s3")),
            text_turn("done"),
        ]
    )
    agent = create_bare_agent(model_client=client, tools=catalog())
    await agent.prompt("go", stream=False)
    bodies = [json.loads(b["content"]) for b in results(await agent.get_history())]
    assert bodies[0]["loaded"] == ["jira_create_issue", "jira_add_comment"]
    assert bodies[1]["loaded"] == ["weather"]
    assert bodies[2]["loaded"] == [] and "No tool matched" in bodies[2]["message"]
    assert "refund" not in tool_names(client.requests[-1])


async def test_keyword_search_defaults_to_five_and_exact_names_to_ten():
    many = [make(f"report_{i:02d}", f"Sales report number {i}.", defer=True) for i in range(12)]
    names = ", ".join(f"report_{i:02d}" for i in range(MAX_EXACT_NAMES + 1))
    client = ScriptedModelClient(
        [
            tool_turn((TOOL_SEARCH_NAME, {"query": "sales report"}, "s1")),
            tool_turn((TOOL_SEARCH_NAME, {"query": names}, "s2")),
            tool_turn((TOOL_SEARCH_NAME, {"query": "report_11 report_10"}, "s3")),
            text_turn("done"),
        ]
    )
    agent = create_bare_agent(model_client=client, tools=many)
    await agent.prompt("go", stream=False)
    first, too_many, exact = results(await agent.get_history())
    assert len(json.loads(first["content"])["loaded"]) == 5
    assert too_many["is_error"] is True and "at most 10" in too_many["content"]
    assert json.loads(exact["content"])["loaded"] == ["report_11", "report_10"]


async def test_calling_a_deferred_tool_before_loading_it_says_to_search_first():
    ran = []
    refund = tool("refund", "Refund.", Q, lambda i: ran.append(1) or "ok", defer=True)
    client = ScriptedModelClient([tool_turn(("refund", {}, "r1")), text_turn("ok")])
    agent = create_bare_agent(model_client=client, tools=[refund])
    await agent.prompt("go", stream=False)
    [block] = results(await agent.get_history())
    assert block["is_error"] is True
    assert 'tool "refund" is not loaded yet' in block["content"]
    assert f'call {TOOL_SEARCH_NAME} with query "refund"' in block["content"]
    assert ran == []


async def test_loads_survive_a_history_store_round_trip_into_a_new_agent():
    stored: list[dict] = []

    def replace(messages):
        stored[:] = messages

    store = define_history_store(load=lambda: list(stored), append=stored.append, replace=replace)
    first_client = ScriptedModelClient(
        [tool_turn((TOOL_SEARCH_NAME, {"query": "weather"}, "s1")), text_turn("ok")]
    )
    first = create_bare_agent(model_client=first_client, tools=catalog(), history_store=store)
    await first.prompt("load the weather tool", stream=False)
    assert "weather" in tool_names(first_client.requests[-1])

    # another process: a new Agent rebuilt from the stored history
    second_client = ScriptedModelClient([tool_turn(("weather", {"q": "Paris"}, "w1")), text_turn("sunny")])
    second = create_bare_agent(model_client=second_client, tools=catalog(), history_store=store)
    result = await second.prompt("and now?", stream=False)
    assert result.subtype == "success"
    assert "weather" in tool_names(second_client.requests[0])
    assert "refund" not in tool_names(second_client.requests[0])
    assert results(await second.get_history())[-1]["content"] == "weather ran"

    # a fresh agent with no history has nothing loaded
    fresh = ScriptedModelClient([text_turn("hi")])
    await create_bare_agent(model_client=fresh, tools=catalog()).prompt("x", stream=False)
    assert "weather" not in tool_names(fresh.requests[0])


async def test_loads_survive_a_compaction_into_a_new_agent_elsewhere():
    """The tool_search call is summarised away; the summary message keeps a note of what it loaded."""
    stored: list[dict] = []

    def replace(messages):
        stored[:] = messages

    store = define_history_store(load=lambda: list(stored), append=stored.append, replace=replace)
    big = {"input_tokens": 150_000, "output_tokens": 10}
    first_client = ScriptedModelClient(
        [
            tool_turn((TOOL_SEARCH_NAME, {"query": "weather"}, "s1")),
            tool_turn(("weather", {"q": "Rome"}, "w0"), usage=big),  # past the threshold: compacts next
            text_turn("SUMMARY: the weather tool was loaded and used for Rome."),
            tool_turn(("lookup_order", {"q": "1"}, "l1")),
            text_turn("ok"),
        ]
    )
    first = create_bare_agent(
        model_client=first_client,
        tools=catalog(),
        history_store=store,
        auto_compact=AutoCompactOptions(threshold_tokens=100_000, keep_recent_messages=2),
    )
    await first.prompt("load the weather tool and use it", stream=False)
    assert not any(TOOL_SEARCH_NAME in json.dumps(m) for m in stored[1:])  # the search was summarised
    assert loaded_in_history(stored) == {"weather"}
    assert "weather" in tool_names(first_client.requests[-1])  # still loaded here

    # another worker: a new Agent rebuilt from the compacted history
    second_client = ScriptedModelClient([tool_turn(("weather", {"q": "Paris"}, "w1")), text_turn("sunny")])
    second = create_bare_agent(model_client=second_client, tools=catalog(), history_store=store)
    assert (await second.prompt("and Paris?", stream=False)).subtype == "success"
    assert "weather" in tool_names(second_client.requests[0]) and "refund" not in tool_names(
        second_client.requests[0]
    )
    assert results(await second.get_history())[-1]["content"] == "weather ran"


async def test_replace_history_replaces_what_is_loaded():
    client = ScriptedModelClient([tool_turn((TOOL_SEARCH_NAME, {"query": "refund"}, "s1")), text_turn("ok")])
    agent = create_bare_agent(model_client=client, tools=catalog())
    await agent.prompt("go", stream=False)
    history = await agent.get_history()
    assert agent.deferred_tools.loaded == {"refund"}
    await agent.replace_history(history[:1])
    assert agent.deferred_tools.loaded == set()
    await agent.replace_history(history)
    assert agent.deferred_tools.loaded == {"refund"}


def test_loaded_in_history_ignores_errors_foreign_results_and_garbage():
    history = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "a", "name": TOOL_SEARCH_NAME, "input": {}},
                {"type": "tool_use", "id": "b", "name": TOOL_SEARCH_NAME, "input": {}},
                {"type": "tool_use", "id": "c", "name": "other", "input": {}},
                {"type": "tool_use", "id": "d", "name": TOOL_SEARCH_NAME, "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "a",
                    "content": [{"type": "text", "text": '{"loaded": ["x"]}'}],
                },
                {"type": "tool_result", "tool_use_id": "b", "content": '{"loaded": ["y"]}', "is_error": True},
                {"type": "tool_result", "tool_use_id": "c", "content": '{"loaded": ["z"]}'},
                {"type": "tool_result", "tool_use_id": "d", "content": "not json"},
            ],
        },
    ]
    assert loaded_in_history(history) == {"x"}


def test_a_tool_named_tool_search_is_refused_while_anything_is_deferred():
    own = make(TOOL_SEARCH_NAME, "My own search.")
    create_bare_agent(tools=[own])  # fine while nothing is deferred
    with pytest.raises(ConfigError, match='"tool_search" is reserved while a tool is deferred'):
        create_bare_agent(tools=[own, make("refund", "Refund.", defer=True)])
    with pytest.raises(ConfigError, match="is reserved"):
        define_agent(tools=[make("refund", "Refund.", defer=True), own])
    agent = create_bare_agent(tools=[make("refund", "Refund.", defer=True)])
    with pytest.raises(ConfigError, match="add_tools: the tool name"):
        agent.add_tools([own])
    agent = create_bare_agent(tools=[own])
    with pytest.raises(ConfigError, match="is reserved"):
        agent.add_tools([make("refund", "Refund.", defer=True)])
    assert [t.name for t in agent.tools] == [TOOL_SEARCH_NAME]  # nothing was added


async def test_deferred_tools_added_later_get_a_search_tool():
    client = ScriptedModelClient([text_turn("hi")])
    agent = create_bare_agent(model_client=client, tools=[make("lookup_order", "Find.")])
    agent.add_tools([make("refund", "Refund.", defer=True)])
    await agent.prompt("x", stream=False)
    assert tool_names(client.requests[0]) == ["lookup_order", TOOL_SEARCH_NAME]
