"""The example team (lattice_worker/examples/team.py) end to end on MemoryMailbox and RedisMailbox.

A lead and two members working with the built-in Grep and Bash tools over a
directory the caller names. Offline: the scripted model drives the flow, the
tools really read the files. HOME is a temporary directory (tests/conftest.py),
so the members' default workspaces never touch the real ~/.agent.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from lattice_mailbox import MemoryMailbox, MessageStatus
from lattice_worker import ScriptedModelClient, create_builtin_tools
from lattice_worker.demo import run_demo
from lattice_worker.examples import team as example
from tests.support.tools import call, text


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("import os\nimport sys\nprint('hi')\n")  # 3 lines, 2 x import
    (tmp_path / "src" / "b.py").write_text("x = 1  # important, not a match\n")  # 1 line, 0 x import
    (tmp_path / "notes.md").write_text("Import the data.\n\nThen import more.\nEnd\n")  # 4 lines, 2 x import
    (tmp_path / "blob.bin").write_bytes(b"\0\1import\0")  # binary: skipped
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "config").write_text("import import import\n")  # hidden: skipped
    (tmp_path / "src" / "__init__.py").write_text("")  # empty: a text file of 0 lines, counted by both
    for skipped in ("demo.egg-info", "src/__pycache__", "node_modules/x"):  # packaging/cache: skipped
        (tmp_path / skipped).mkdir(parents=True)
        (tmp_path / skipped / "SOURCES.txt").write_text("import\nimport\n")
    return tmp_path


async def test_the_members_tool_calls_read_the_real_files(tree: Path, tmp_path: Path) -> None:
    # the exact calls the scripted members make, through the built-in tools
    tools = create_builtin_tools(
        cwd=tmp_path / "member-workspace", allowed_directories=[tmp_path / "member-workspace"]
    )
    (tmp_path / "member-workspace").mkdir()
    grep = await call(tools, "Grep", example.grep_input(str(tree), "import"))
    assert example.summarise_grep(text(grep), str(tree), "import") == (
        '"import" is on 4 lines in 2 of 4 text files; top files: notes.md (2), src/a.py (2)'
    )
    count = await call(tools, "Bash", {"command": example.count_command(str(tree))})
    assert not count.is_error
    assert example.summarise_counts(text(count), str(tree)) == (
        "8 lines in 4 text files; largest: notes.md (4), src/a.py (3), src/b.py (1)"
    )
    missing = await call(tools, "Bash", {"command": example.count_command(str(tree / "nope"))})
    assert missing.is_error and f"not a directory: {tree / 'nope'}" in text(missing)


async def test_demo_team_hands_off_to_both_members_and_reports_real_numbers(mailbox: Any, tree: Path) -> None:
    client = ScriptedModelClient(example.scripted_demo_model)
    demo = example.build_team(mailbox=mailbox, model_client=client)
    assert [m.name for m in demo.members] == ["searcher", "counter"]
    assert demo.lead_spec is not None and all(m.kind == "spec" for m in demo.members)
    events: list[Any] = []
    result = await example.run(str(tree), "import", team=demo, on_event=events.append)

    assert result.subtype == "success"
    assert '"import" is on 4 lines in 2 of 4 text files' in result.result
    assert "8 lines in 4 text files" in result.result
    assert result.result.index("searcher") < result.result.index("counter")  # handoff order

    tools_called = [
        block["name"]
        for e in events
        if e.type == "agent_message" and e.message["type"] == "assistant"
        for block in e.message["message"]["content"]
        if block["type"] == "tool_use"
    ]
    assert sorted(tools_called) == ["Bash", "Grep", "team_reply", "team_reply"]
    for member in ("searcher", "counter"):
        (task,) = await mailbox.inbox(f"demo::{member}", "all")
        assert task.status == MessageStatus.DONE and str(tree) in task.content
    lead_requests = [r for r in client.requests if "searcher" in {t["name"] for t in r.tools}]
    assert len(lead_requests) == 2  # one handoff batch, then the summary once both reports are in
    # the lead has no workspace tools; each member works in its own default workspace (HOME is a tmp dir)
    assert [t["name"] for t in lead_requests[0].tools] == ["searcher", "counter"]
    workspaces = Path(os.environ["HOME"]) / ".agent" / "workspaces"
    assert sorted(p.name for p in workspaces.iterdir()) == ["counter", "searcher"]
    assert not any((workspaces / "searcher").iterdir())  # read only: nothing written


async def test_demo_team_reports_a_bad_directory_as_a_member_error(mailbox: Any, tmp_path: Path) -> None:
    demo = example.build_team(mailbox=mailbox, model_client=ScriptedModelClient(example.scripted_demo_model))
    result = await demo.prompt(example.demo_prompt(str(tmp_path / "missing"), "x"), stream=False)
    assert result.subtype == "success"
    assert "Grep failed" in result.result and f"{tmp_path / 'missing'} does not exist" in result.result
    assert "Bash failed" in result.result and f"not a directory: {tmp_path / 'missing'}" in result.result


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Look through ./docs for the word lease", ("./docs", "lease")),
        ('search /tmp/x for word "foo"', ("/tmp/x", "foo")),
        ("check ~/code, word: x", ("~/code", "x")),
        ("hello", (None, None)),
    ],
)
def test_free_form_requests_are_understood_by_the_scripted_lead(text: str, expected: tuple[Any, Any]) -> None:
    assert example.parse_request(text) == expected
    assert example.parse_request(example.demo_prompt("/a b/c", "w")) == ("/a b/c", "w")


async def test_free_form_prompt_runs_the_whole_flow(mailbox: Any, tree: Path) -> None:
    demo = example.build_team(mailbox=mailbox, model_client=ScriptedModelClient(example.scripted_demo_model))
    result = await demo.prompt(f"Look through {tree} for the word import", stream=False)
    assert '"import" is on 4 lines' in result.result and "8 lines in 4 text files" in result.result


def test_module_level_team_and_cli(
    tree: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("DEEPSEEK_API_KEY", raising=False)
    assert example.team.name == "demo" and isinstance(example.team.mailbox, MemoryMailbox)
    assert example.main([str(tree), "--word", "import"]) == 0
    out = capsys.readouterr().out
    assert "scripted (offline)" in out and "8 lines in 4 text files" in out
    assert example.main([str(tree / "nope")]) == 2


async def test_the_same_team_answers_each_new_prompt_afresh(mailbox: Any, tree: Path) -> None:
    # The lead session keeps its history across prompts; the scripted lead must act on
    # the latest request, not replay the reports of the previous one.
    client = ScriptedModelClient(example.scripted_demo_model)
    demo = example.build_team(mailbox=mailbox, model_client=client)
    first = await demo.prompt(example.demo_prompt(str(tree), "import"), stream=False)
    second = await demo.prompt(example.demo_prompt(str(tree / "src"), "print"), stream=False)
    assert '"import" is on 4 lines' in first.result
    assert '"print" is on 1 lines in 1 of 3 text files' in second.result
    assert "4 lines in 3 text files" in second.result
    assert len(await mailbox.inbox("demo::searcher", "all")) == 2
    unclear = await demo.prompt("hello", stream=False)
    assert unclear.result.startswith("Please name a directory and a word")


def test_lattice_demo_runs_offline_on_the_built_in_tools(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("DEEPSEEK_API_KEY", raising=False)
    out = io.StringIO()
    run_demo(str(tree), "import", Console(file=out, width=300))
    printed = out.getvalue()
    assert "the scripted offline model" in printed
    assert "searcher: Grep(" in printed and "counter: Bash(" in printed
    assert '"import" is on 4 lines in 2 of 4 text files' in printed and "8 lines in 4 text files" in printed


def test_lattice_demo_says_an_unreachable_provider_once(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The run's error is the one ``error:`` line, not also a "the run failed" line above it."""
    from typer.testing import CliRunner

    from lattice_client.cli import EXIT_ERROR, app
    from tests.e2e.conftest import free_port

    monkeypatch.delenv("DEEPSEEK_API_KEY", raising=False)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", f"http://127.0.0.1:{free_port()}")
    result = CliRunner().invoke(app, ["demo", str(tree)], env={"COLUMNS": "300"})
    assert result.exit_code == EXIT_ERROR, result.output
    said = [line for line in result.output.splitlines() if "could not reach the model provider" in line]
    assert len(said) == 1 and said[0].startswith("error: the demo run failed: "), result.output
