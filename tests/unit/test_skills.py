"""Skills: ``skill()``, ``load_skill()`` from SKILL.md (and its errors), matching
against the prompt, and injection into that query's model requests only."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel

from lattice_worker import (
    AgentHooks,
    ConfigError,
    ScriptedModelClient,
    SkillDefinition,
    create_agent,
    create_bare_agent,
    define_agent,
    load_skill,
    skill,
    text_turn,
    tool,
    tool_turn,
)
from lattice_worker.tools import skills as skills_module
from lattice_worker.tools.skills import match_skills, skill_matches

REVIEW = skill(
    name="code-review",
    description="Review code changes and pull requests",
    instructions="Always list bugs and risks before summaries.",
)
PDF = skill(name="pdf", description="Read and inspect PDF documents", instructions="Render pages first.")


# --------------------------------------------------------------------------- definitions


def test_skill_strips_and_validates() -> None:
    s = skill(name=" sql ", description=" Write SQL queries ", instructions="\nUse CTEs.\n")
    assert s == SkillDefinition(
        name="sql", description="Write SQL queries", instructions="Use CTEs.", path=None
    )
    for bad in ({"name": ""}, {"description": "  "}, {"instructions": None}, {"name": 3}):
        args = {"name": "n", "description": "d", "instructions": "i", **bad}
        with pytest.raises(ConfigError, match="must be a non-empty string"):
            skill(**args)


def write_skill(root: Path, text: str, name: str = "pdf") -> Path:
    directory = root / name
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "SKILL.md").write_text(text, encoding="utf-8")
    return directory


def test_load_skill_from_a_directory_or_the_file(tmp_path: Path) -> None:
    directory = write_skill(
        tmp_path,
        "---\nname: pdf\ndescription: Read and inspect PDF documents\n---\n\nRender pages before claiming layout is correct.\n",
    )
    loaded = load_skill(directory)
    assert loaded.name == "pdf" and loaded.description == "Read and inspect PDF documents"
    assert loaded.instructions == "Render pages before claiming layout is correct."
    assert loaded.path == str(directory / "SKILL.md")
    assert load_skill(str(directory / "SKILL.md")) == loaded


def test_load_skill_keeps_the_instructions_as_written(tmp_path: Path) -> None:
    """Only line feeds (and CRLF) end lines: a form feed or U+2028 in the body is text."""
    body = "Step 1\x0cStep 2 \u2028 then \x85 done.\n\n  Indented."
    directory = write_skill(tmp_path, f"---\nname: x\ndescription: y\n---\n{body}\n")
    assert load_skill(directory).instructions == body
    crlf = write_skill(tmp_path / "crlf", "---\r\nname: x\r\ndescription: y\r\n---\r\na\r\nb\r\n")
    assert load_skill(crlf).instructions == "a\nb"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("no front matter\n", "does not start with YAML front matter"),
        ("", "does not start with YAML front matter"),
        ("---\nname: x\ndescription: y\n", "has no closing '---' line"),
        ("---\nname: [unclosed\n---\nbody\n", "invalid YAML front matter"),
        ("---\n- a list\n---\nbody\n", "must be a mapping with name and description, got list"),
        ("---\ndescription: y\n---\nbody\n", '"name" must be a non-empty string'),
        ("---\nname: x\ndescription: ''\n---\nbody\n", '"description" must be a non-empty string'),
        ("---\nname: 7\ndescription: y\n---\nbody\n", '"name" must be a non-empty string, got 7'),
        ("---\nname: x\ndescription: y\n---\n\n  \n", "instructions"),
    ],
)
def test_load_skill_errors_name_the_file(tmp_path: Path, text: str, message: str) -> None:
    directory = write_skill(tmp_path, text)
    with pytest.raises(ConfigError, match=message) as info:
        load_skill(directory)
    assert str(directory / "SKILL.md") in str(info.value)


def test_load_skill_missing_paths(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_skill(tmp_path / "absent")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no SKILL.md in"):
        load_skill(tmp_path / "empty")
    with pytest.raises(ConfigError, match="must be a directory path"):
        load_skill(None)  # type: ignore[arg-type]


def test_the_skills_option_is_validated() -> None:
    with pytest.raises(ConfigError, match='option "skills" expects a list of skills'):
        create_agent(skills=["code-review"])
    with pytest.raises(ConfigError, match='two skills are named "pdf"'):
        create_agent(skills=[PDF, PDF])
    with pytest.raises(ConfigError, match='option "skills"'):
        define_agent(skills=PDF)


# --------------------------------------------------------------------------- matching


@pytest.mark.parametrize(
    ("prompt", "matched"),
    [
        ("Please do a code review of this patch", ["code-review"]),
        ("code-review: the login change", ["code-review"]),
        ("Review these pull requests", ["code-review"]),  # two description keywords (plural ok)
        ("Summarise report.PDF for me", ["pdf"]),  # the name, case-insensitive
        ("Inspect the scanned documents", ["pdf"]),
        ("What changes did you make?", []),  # one keyword only
        ("Review the code, then read the PDF", ["code-review", "pdf"]),
        ("hello", []),
    ],
)
def test_matching_compares_the_prompt_with_name_and_description(prompt: str, matched: list[str]) -> None:
    assert [s.name for s in match_skills([REVIEW, PDF], prompt)] == matched


def test_a_one_keyword_description_needs_that_keyword() -> None:
    s = skill(name="k8s-helper", description="Kubernetes", instructions="Use kubectl.")
    assert skill_matches(s, "my kubernetes pod crashed")
    assert not skill_matches(s, "my pod crashed")
    assert skill_matches(s, "ask the k8s helper")


def test_the_prompt_is_split_into_words_once_however_many_skills(monkeypatch: pytest.MonkeyPatch) -> None:
    """Matching runs on the event loop at the start of every query: 500 skills over a
    130 KB prompt took 15 s when each skill split the prompt again."""
    prompt = "Please review the pull request. " * 100
    calls: list[str] = []
    original = skills_module._words
    monkeypatch.setattr(skills_module, "_words", lambda text: calls.append(text) or original(text))
    many = [skill(name=f"s-{i}", description=f"topic{i} reports", instructions="x") for i in range(50)]
    assert match_skills([*many, REVIEW], prompt) == [REVIEW]
    assert calls.count(prompt) == 1


# --------------------------------------------------------------------------- injection


class N(BaseModel):
    n: int


noop = tool("noop", "Do nothing.", N, lambda args: "ok")


async def test_matched_instructions_go_into_that_querys_requests_only() -> None:
    client = ScriptedModelClient(
        [tool_turn(("noop", {"n": 1})), text_turn("reviewed"), text_turn("hi there")]
    )
    agent = create_agent(
        system_prompt="You are careful.",
        workspace=False,
        tools=[noop],
        skills=[REVIEW, PDF],
        model_client=client,
    )
    first = await agent.prompt("Please do a code review of this patch", stream=False)
    second = await agent.prompt("hello", stream=False)
    assert first.subtype == second.subtype == "success"
    one, two, three = client.requests
    for request in (one, two):  # every request of the matching query
        assert request.system is not None and request.system.startswith("You are careful.\n\n")
        assert "Always list bugs and risks before summaries." in request.system
        assert "## Skill: code-review" in request.system and "Render pages first." not in request.system
    assert three.system == "You are careful."  # the next query matched nothing
    history = await agent.get_history()
    assert "Always list bugs" not in str(history)  # never stored
    assert "Always list bugs" not in str(three.messages)


async def test_a_later_query_matches_afresh_and_bare_agents_get_skills_too() -> None:
    client = ScriptedModelClient([text_turn("a"), text_turn("b")])
    agent = create_bare_agent(skills=[REVIEW, PDF], model_client=client)
    await agent.prompt([{"type": "text", "text": "open the PDF"}], stream=False)
    await agent.prompt("now a code review", stream=False)
    first, second = client.requests
    assert (
        first.system is not None
        and "Render pages first." in first.system
        and "code-review" not in first.system
    )
    assert (
        second.system is not None
        and "Always list bugs" in second.system
        and "Render pages" not in second.system
    )


async def test_hooks_see_the_injected_instructions() -> None:
    seen: list[str | None] = []

    def on_request(ctx):
        seen.append(ctx.system_prompt)
        return None

    client = ScriptedModelClient([text_turn("ok")])
    agent = create_agent(
        name="hooked", skills=[PDF], hooks=AgentHooks(on_model_request=on_request), model_client=client
    )
    await agent.prompt("inspect this pdf", stream=False)
    assert seen[0] is not None and seen[0].endswith(
        "## Skill: pdf\nRead and inspect PDF documents\n\nRender pages first."
    )
    assert client.requests[0].system == seen[0]


async def test_query_none_matches_the_last_user_message() -> None:
    client = ScriptedModelClient([text_turn("ok")])
    agent = create_bare_agent(skills=[PDF], model_client=client)
    await agent.replace_history([{"role": "user", "content": "check the pdf"}])
    result = await agent.prompt(None, stream=False)
    assert result.subtype == "success"
    assert client.requests[0].system is not None and "Render pages first." in client.requests[0].system


async def test_spawned_sessions_use_the_specs_skills() -> None:
    client = ScriptedModelClient(lambda request: text_turn("ok")())
    spec = define_agent(workspace=False, skills=[REVIEW], model_client=client)
    await spec.spawn().prompt("a code review please", stream=False)
    assert "Always list bugs" in (client.requests[0].system or "")
