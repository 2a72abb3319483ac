"""Agent workspaces: what ``create_agent`` / ``create_bare_agent`` / ``define_agent``
install, where the workspace lives (a temporary HOME: tests never touch the real
``~/.agent``), the system-prompt section, and refusals reaching the model as
error results through the real loop."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel

from lattice_worker import (
    Agent,
    ConfigError,
    ScriptedModelClient,
    create_agent,
    create_agent_workspace_tools,
    create_bare_agent,
    create_builtin_tools,
    define_agent,
    text_turn,
    tool,
    tool_turn,
)

BUILTIN = ["Read", "Write", "Edit", "LS", "Glob", "Grep", "Bash"]


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


def workspaces(home: Path) -> Path:
    return home / ".agent" / "workspaces"


class Echo(BaseModel):
    text: str


echo = tool("echo", "Echo the text.", Echo, lambda args: args.text)


def test_create_agent_installs_the_tools_in_its_named_workspace(home: Path) -> None:
    agent = create_agent(name="backend", tools=[echo], model_client=ScriptedModelClient([]))
    assert [t.name for t in agent.tools] == ["echo", *BUILTIN]
    assert agent.workspace is not None
    assert agent.workspace.cwd == str(workspaces(home) / "backend")
    assert agent.workspace.allowed_directories == (str(workspaces(home) / "backend"),)
    assert agent.workspace.bash_timeout_ms == 120_000
    assert not (home / ".agent").exists()  # created on first use, not at creation


def test_an_unnamed_agent_uses_its_session_id(home: Path) -> None:
    agent = create_agent(model_client=ScriptedModelClient([]))
    assert agent.workspace is not None
    assert agent.workspace.cwd == str(workspaces(home) / f"agent-{agent.session_id}")
    other = create_agent(model_client=ScriptedModelClient([]))
    assert other.workspace is not None and other.workspace.cwd != agent.workspace.cwd


async def test_the_workspace_is_created_on_the_first_tool_call(home: Path) -> None:
    client = ScriptedModelClient(
        [tool_turn(("Write", {"file_path": "notes/report.md", "content": "done"})), text_turn("wrote it")]
    )
    agent = create_agent(name="writer", model_client=client)
    result = await agent.prompt("write a report", stream=False)
    assert result.subtype == "success"
    assert (workspaces(home) / "writer" / "notes" / "report.md").read_text() == "done"


def test_workspace_as_a_path_and_as_options(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    by_path = create_agent(name="x", workspace=".agent-workspaces/x", model_client=ScriptedModelClient([]))
    assert by_path.workspace is not None
    assert by_path.workspace.cwd == str(tmp_path / ".agent-workspaces" / "x")
    by_pathlike = create_agent(workspace=tmp_path / "p", model_client=ScriptedModelClient([]))
    assert by_pathlike.workspace is not None and by_pathlike.workspace.cwd == str(tmp_path / "p")
    options = {
        "cwd": str(tmp_path / "proj"),
        "allowed_directories": [str(tmp_path / "out")],
        "bash_timeout_ms": 5000,
    }
    by_options = create_agent(workspace=options, model_client=ScriptedModelClient([]))
    assert by_options.workspace is not None
    assert by_options.workspace.cwd == str(tmp_path / "proj")
    assert by_options.workspace.allowed_directories == (str(tmp_path / "out"),)
    assert by_options.workspace.bash_timeout_ms == 5000
    with_paths = create_agent(  # Path objects inside the dict too, as at the top level
        workspace={"cwd": tmp_path / "proj", "allowed_directories": [tmp_path / "out"]},
        model_client=ScriptedModelClient([]),
    )
    assert with_paths.workspace is not None
    assert with_paths.workspace.cwd == str(tmp_path / "proj")
    assert with_paths.workspace.allowed_directories == (str(tmp_path / "out"),)
    assert not (home / ".agent").exists() and not (tmp_path / "proj").exists()


def test_workspace_false_and_bare_agents_have_no_workspace(home: Path) -> None:
    for agent in (
        create_agent(
            workspace=False, system_prompt="exact", tools=[echo], model_client=ScriptedModelClient([])
        ),
        create_bare_agent(system_prompt="exact", tools=[echo], model_client=ScriptedModelClient([])),
    ):
        assert [t.name for t in agent.tools] == ["echo"]
        assert agent.workspace is None and agent._system_prompt() == "exact"
    with pytest.raises(ConfigError, match='unknown option "workspace"'):
        create_bare_agent(workspace="/tmp/x")


def test_the_system_prompt_says_where_the_workspace_is(home: Path, tmp_path: Path) -> None:
    agent = create_agent(
        system_prompt="You are the backend agent.",
        workspace={
            "cwd": str(tmp_path / "w"),
            "allowed_directories": [str(tmp_path / "w"), str(tmp_path / "shared")],
        },
        model_client=ScriptedModelClient([]),
    )
    prompt = agent._system_prompt()
    assert prompt is not None and prompt.startswith("You are the backend agent.\n\nYour workspace is ")
    assert f"Your workspace is {tmp_path / 'w'}." in prompt
    assert f"only inside {tmp_path / 'w'}, {tmp_path / 'shared'}" in prompt
    assert "name the important paths" in prompt
    read_only = create_agent(
        workspace={"cwd": str(tmp_path / "w"), "allowed_directories": []},
        model_client=ScriptedModelClient([]),
    )._system_prompt()
    assert read_only is not None and "You may not change any files; you may read any file" in read_only


async def test_the_model_request_carries_the_tools_and_the_workspace_section(home: Path) -> None:
    client = ScriptedModelClient([text_turn("hi")])
    agent = create_agent(name="ops", model_client=client)
    await agent.prompt("hello", stream=False)
    (request,) = client.requests
    assert [t["name"] for t in request.tools] == BUILTIN
    assert request.system is not None and str(workspaces(home) / "ops") in request.system


def test_built_in_tools_passed_by_hand_replace_the_default_set(home: Path, tmp_path: Path) -> None:
    mine = create_builtin_tools(cwd=tmp_path)
    agent = create_agent(name="x", tools=mine, model_client=ScriptedModelClient([]))
    assert [t.name for t in agent.tools] == BUILTIN
    assert agent.workspace is not None and agent.workspace.cwd == str(tmp_path)
    bare = create_bare_agent(tools=mine, model_client=ScriptedModelClient([]))
    assert [t.name for t in bare.tools] == BUILTIN and bare.workspace is None


def test_the_prompt_names_only_the_built_in_tools_the_agent_has(home: Path, tmp_path: Path) -> None:
    read_only = [t for t in create_builtin_tools(cwd=tmp_path) if t.name in ("Read", "Grep")]
    agent = create_agent(tools=read_only, model_client=ScriptedModelClient([]))
    prompt = agent._system_prompt()
    assert prompt is not None and "built-in file and shell tools (Read, Grep):" in prompt


def test_a_session_rebuilt_from_an_agents_tools_keeps_its_workspace(home: Path) -> None:
    # what the distributed runtime does for session members (member_run.session_agent)
    base = create_agent(model_client=ScriptedModelClient([]))
    again = Agent(base.options.model_copy(update={"tools": base.tools}))
    assert again.workspace == base.workspace and again.session_id != base.session_id
    assert [t.name for t in again.tools] == BUILTIN


def test_define_agent_gives_each_spawned_session_its_own_workspace_tools(home: Path) -> None:
    spec = define_agent(name="reviewer", model_client=ScriptedModelClient([]))
    first, second = spec.spawn(), spec.spawn()
    assert first.workspace is not None and second.workspace is not None
    assert first.workspace.cwd == second.workspace.cwd == str(workspaces(home) / "reviewer")
    # one workspace, one set of (stateless) tool definitions over it
    assert first.tools[0].metadata["workspace"] == first.workspace == second.workspace
    unnamed = define_agent(model_client=ScriptedModelClient([]))
    a, b = unnamed.spawn(), unnamed.spawn()
    assert a.workspace is not None and b.workspace is not None
    assert a.workspace.cwd == str(workspaces(home) / f"agent-{a.session_id}") != b.workspace.cwd
    assert [t.metadata["workspace"].cwd for t in (a.tools[0], b.tools[0])] == [
        a.workspace.cwd,
        b.workspace.cwd,
    ]
    bare = define_agent(workspace=False, model_client=ScriptedModelClient([])).spawn()
    assert bare.bare and bare.workspace is None and bare.tools == []
    assert not (home / ".agent").exists()


@pytest.mark.parametrize("factory", [create_agent, define_agent])
def test_a_user_tool_named_like_a_built_in_is_refused(home: Path, factory) -> None:
    clash = tool("Read", "My own reader.", Echo, lambda args: args.text)
    with pytest.raises(ConfigError, match='the tool name "Read" is taken by the built-in workspace tools'):
        factory(tools=[clash], model_client=ScriptedModelClient([]))
    assert [t.name for t in create_agent(workspace=False, tools=[clash]).tools] == ["Read"]


@pytest.mark.parametrize("name", ["a/b", "..", "."])
@pytest.mark.parametrize("factory", [create_agent, define_agent])
def test_a_name_that_cannot_be_a_directory_is_refused(home: Path, factory, name: str) -> None:
    with pytest.raises(ConfigError, match="cannot name a workspace directory"):
        factory(name=name, model_client=ScriptedModelClient([]))
    factory(
        name=name, workspace=str(home / "ok"), model_client=ScriptedModelClient([])
    )  # an explicit one is fine


@pytest.mark.parametrize(
    ("workspace", "message"),
    [
        (True, 'option "workspace" expects'),
        (0, 'option "workspace" expects.*a number is not a workspace'),  # not a bare agent: 0 == False
        (0.0, "a number is not a workspace"),
        # the error names what is wrong inside the dict
        ({"cwd": "x", "bash_timeout_ms": 0}, r"\(bash_timeout_ms: Input should be greater than 0\)"),
        ({"cwd": "x", "extra": 1}, r"\(extra: Extra inputs are not permitted\)"),
        ({"allowed_directories": []}, r"\(cwd: Field required\)"),
        (
            {"cwd": "x", "allowed_directories": "/tmp"},
            r"\(allowed_directories: Input should be a valid list\)",
        ),
        ("/tmp/a\0b", 'option "cwd" expects a directory path without NUL characters'),
        ({"cwd": "x", "allowed_directories": ["/tmp/\0"]}, "without NUL characters"),
    ],
)
def test_bad_workspace_options(home: Path, workspace, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        create_agent(workspace=workspace)


def test_create_agent_workspace_tools_defaults(home: Path, tmp_path: Path) -> None:
    named = create_agent_workspace_tools(name="ana")
    assert [t.name for t in named] == BUILTIN
    ws = named[0].metadata["workspace"]
    assert ws.cwd == str(workspaces(home) / "ana") and ws.create
    anonymous = create_agent_workspace_tools()[0].metadata["workspace"]
    assert Path(anonymous.cwd).parent == workspaces(home) and Path(anonymous.cwd).name.startswith("agent-")
    explicit = create_agent_workspace_tools(
        cwd=tmp_path / "c", allowed_directories=[tmp_path], bash_timeout_ms=10
    )
    ws = explicit[0].metadata["workspace"]
    assert (ws.cwd, ws.allowed_directories, ws.bash_timeout_ms) == (str(tmp_path / "c"), (str(tmp_path),), 10)
    with pytest.raises(ConfigError, match="cannot name a workspace directory"):
        create_agent_workspace_tools(name="../up")
    assert not (home / ".agent").exists()


async def test_a_refusal_reaches_the_model_as_an_error_result(home: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    client = ScriptedModelClient(
        [
            tool_turn(
                ("Write", {"file_path": str(outside / "x.txt"), "content": "no"}),
                ("Bash", {"command": f"echo no > {outside}/y.txt"}),
                ("Read", {"file_path": "missing.txt"}),
            ),
            text_turn("could not"),
        ]
    )
    agent = create_agent(name="guarded", model_client=client)
    events = [e async for e in agent.query("try it", stream=False)]
    assert events[-1].subtype == "success" and events[-1].result == "could not"
    results = client.requests[1].messages[-1]["content"]
    assert [r["is_error"] for r in results] == [True, True, True]
    assert "outside the allowed directories" in results[0]["content"]
    assert "outside the allowed directories" in results[1]["content"]
    assert "missing.txt does not exist" in results[2]["content"]
    assert list(outside.iterdir()) == []


async def test_a_batch_of_read_only_tools_answers_every_call(home: Path) -> None:
    ws = workspaces(home) / "reader"
    client = ScriptedModelClient(
        [
            tool_turn(("Write", {"file_path": "a.txt", "content": "alpha\n"})),
            tool_turn(
                ("Read", {"file_path": "a.txt"}),
                ("Grep", {"pattern": "alpha"}),
                ("LS", {}),
                ("Glob", {"pattern": "*"}),
            ),
            text_turn("ok"),
        ]
    )
    agent = create_agent(name="reader", model_client=client)
    result = await agent.prompt("go", stream=False)
    assert result.subtype == "success" and (ws / "a.txt").exists()
    blocks = client.requests[2].messages[-1]["content"]
    assert [b.get("is_error", False) for b in blocks] == [False] * 4
    assert "alpha" in blocks[0]["content"] and "a.txt:1:alpha" in blocks[1]["content"]
