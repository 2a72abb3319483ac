"""The team of the tutorial (``docs/tutorial.md``): a lead, a ``librarian`` and an ``editor``.

* ``librarian`` answers questions about a few cities with its ``lookup`` tool;
* ``editor`` checks a draft with its ``count_words`` tool and sends it back;
* the lead first *asks* the librarian (the answer comes back as the tool
  result, in the same turn), then *hands off* the draft to the editor (a
  receipt comes back at once; the editor's report arrives before the lead's
  next model request) and answers the caller with the edited text.

``reviewed`` is the same team under another name whose editor also
``publish``-es the draft: an ``unguarded`` tool, and the editor runs with
``permission_mode="by_effect"``, so on workers every ``publish`` call waits for
a person to approve it (``lattice approvals`` / ``lattice approve``; see
``docs/operate.md``).

Every agent is a ``define_agent`` template, so the same team runs in one
process (``build_team().prompt_sync(...)``) and on workers
(``lattice worker lattice_worker.examples.tutorial:team``). Offline every agent
plays :func:`scripted_model`, a *stateless* scripted model: it decides each
turn from the request alone, so it answers correctly in whichever worker
process a step runs.
"""

from __future__ import annotations

import re
from typing import Any

from lattice_mailbox.base import TeamMailbox
from lattice_worker import (
    AssistantModelMessage,
    ModelRequest,
    ScriptedModelClient,
    Team,
    create_team,
    define_agent,
    parse_report_message,
    team_member,
    text_turn,
    tool,
    tool_turn,
)

TEAM_NAME = "tutorial"

FACTS = {
    "paris": "Paris is the capital of France; about 2.1 million people live in the city proper.",
    "berlin": "Berlin is the capital of Germany; about 3.7 million people live there.",
    "lisbon": "Lisbon is the capital of Portugal; about 550 thousand people live in the city proper.",
}


# --------------------------------------------------------------------------- tools


@tool(effect="read_only")
def lookup(city: str) -> str:
    """Look up a short fact about a city (Paris, Berlin or Lisbon)."""
    return FACTS.get(city.strip().lower(), f"no entry for {city!r}; known: {', '.join(sorted(FACTS))}")


@tool(effect="read_only")
def count_words(text: str) -> str:
    """Count the words of a text."""
    return str(len(text.split()))


@tool
def publish(text: str) -> str:
    """Publish a text (an unguarded tool: it changes the world, and may not be repeated blindly)."""
    return f"published {len(text.split())} words"


# --------------------------------------------------------------------------- the scripted (offline) model


def task_of(request: ModelRequest) -> str:
    """The task a member was given, cut out of its first message.

    A member's first user message is not the lead's task alone: the runtime
    wraps it (who the member is, the message and work item ids, and the rule
    that the member must call ``team_reply``). The task sits between
    ``from <team>::lead:`` and the closing instructions.
    """
    first = request.messages[0]["content"] if request.messages else ""
    text = (
        first
        if isinstance(first, str)
        else "".join(b.get("text", "") for b in first if b.get("type") == "text")
    )
    match = re.search(r"::lead:\n\n(.*?)\n\nWhen your work is finished", text, re.DOTALL)
    return match.group(1) if match else text


def last_tool_result(request: ModelRequest) -> str | None:
    """The text of the first ``tool_result`` block of the last message, or ``None``."""
    content = request.messages[-1].get("content") if request.messages else None
    for block in content if isinstance(content, list) else []:
        if isinstance(block, dict) and block.get("type") == "tool_result":
            value = block.get("content")
            return value if isinstance(value, str) else "".join(b.get("text", "") for b in value or [])
    return None


def librarian_turn(request: ModelRequest) -> AssistantModelMessage:
    """Look the city up, then reply with what the tool said."""
    found = last_tool_result(request)
    if found is not None:
        return tool_turn(("team_reply", {"content": found}))
    city = task_of(request).split(":", 1)[-1].strip().rstrip(".")
    return tool_turn(("lookup", {"city": city}))


def editor_turn(request: ModelRequest) -> AssistantModelMessage:
    """Count the draft's words (and, with the ``publish`` tool, publish it), then
    reply with the draft and what the tools said. The turn follows from how many
    messages the request holds: task, then one call and its result per step."""
    draft = task_of(request).split(":", 1)[-1].strip()
    publishes = any(t["name"] == "publish" for t in request.tools)
    steps = len(request.messages) // 2  # tool results so far
    if steps == 0:
        return tool_turn(("count_words", {"text": draft}))
    if steps == 1 and publishes:
        return tool_turn(("publish", {"text": draft}))
    words = request.messages[2]["content"][0].get("content")
    note = f"; {last_tool_result(request)}" if publishes else ""
    return tool_turn(("team_reply", {"content": f"{draft} ({words} words, checked{note})"}))


def lead_turn(request: ModelRequest) -> AssistantModelMessage:
    """Ask the librarian, hand the answer to the editor, then answer the caller."""
    last = request.messages[-1]
    reports = parse_report_message(last)
    if reports:  # the editor's report arrived (after the handoff batch)
        return text_turn(f"Here is your answer: {reports[0]['content']}")
    answer = last_tool_result(request)
    if answer is not None:  # the librarian's answer is the result of the ask call
        return tool_turn(("editor", {"mode": "handoff", "task": f"Check this draft: {answer}"}))
    prompt = last["content"] if isinstance(last["content"], str) else ""
    city = prompt.rstrip("?. ").split()[-1] if prompt.strip() else "Paris"
    return tool_turn(("librarian", {"mode": "ask", "task": f"Look up this city: {city}"}))


def scripted_model(request: ModelRequest) -> AssistantModelMessage:
    """One model for the three agents, told apart by the tools of the request:
    the lead has the member tools, each member its own tool."""
    names = {t["name"] for t in request.tools}
    if "librarian" in names:
        return lead_turn(request)
    if "lookup" in names:
        return librarian_turn(request)
    return editor_turn(request)


# --------------------------------------------------------------------------- the team


def build_team(
    mailbox: TeamMailbox | None = None,
    model_client: Any = None,
    *,
    name: str = TEAM_NAME,
    publishes: bool = False,
) -> Team:
    """The ``tutorial`` team. ``mailbox``: any ``TeamMailbox`` (default a new
    ``MemoryMailbox``); ``model_client``: every agent's model (default the
    stateless :func:`scripted_model`); ``name``: the team's name; ``publishes``:
    the editor also gets ``publish``, under ``permission_mode="by_effect"``."""
    model = {"model_client": model_client or ScriptedModelClient(scripted_model)}
    review: dict[str, Any] = {"permission_mode": "by_effect"} if publishes else {}
    librarian = define_agent(
        name="librarian",
        system_prompt="Answer questions about cities with the lookup tool, then call team_reply.",
        tools=[lookup],
        workspace=False,
        **model,
    )
    editor = define_agent(
        name="editor",
        system_prompt="Check the draft you are given with count_words, then call team_reply with it.",
        tools=[count_words, publish] if publishes else [count_words],
        workspace=False,
        **model,
        **review,
    )
    lead = define_agent(
        name="lead",
        system_prompt=(
            "You answer questions about cities. Ask the librarian for the facts (mode ask), then hand the "
            "draft answer to the editor (mode handoff) and answer with the edited text."
        ),
        workspace=False,
        **model,
    )
    return create_team(
        name=name,
        lead=lead,
        members=[
            team_member(name="librarian", role="researcher", focus="Facts about cities", agent=librarian),
            team_member(name="editor", role="reviewer", focus="Checks drafts", agent=editor),
        ],
        mailbox=mailbox,
    )


team = build_team()
"""What ``lattice worker lattice_worker.examples.tutorial:team`` loads."""

reviewed = build_team(name="reviewed", publishes=True)
"""The team ``reviewed`` (``lattice worker lattice_worker.examples.tutorial:reviewed``): its
editor's ``publish`` calls wait for an approval."""
