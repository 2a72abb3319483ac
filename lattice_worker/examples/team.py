"""A small runnable team: a lead and two members working with the built-in tools.

* ``searcher`` searches the text files under a directory for a word with the
  built-in ``Grep`` tool;
* ``counter`` counts the lines of the text files under a directory with the
  built-in ``Bash`` tool (``grep -c`` over the tree);
* the lead hands the caller's directory to both members in one batch, waits
  for their reports and summarises them with the real numbers. It has no
  workspace of its own (``workspace=False``): it only delegates.

The members are ordinary ``define_agent`` agents: each session gets the
built-in workspace tools over its own workspace (``~/.agent/workspaces/searcher``
and ``~/.agent/workspaces/counter``, created on the first tool call). They only
read the caller's directory, which the tools allow anywhere; writes would be
bounded to their workspaces.

Every agent is a ``define_agent`` template, so the distributed runtime can run
the same definition (``lattice worker lattice_worker.examples.team:team``). Offline (no API
key) every agent plays :func:`scripted_demo_model`, a stateless scripted model
that drives the flow above with the real tool output; with
``ANTHROPIC_API_KEY`` or ``DEEPSEEK_API_KEY`` set the same team talks to the
real provider (DeepSeek: ``https://api.deepseek.com/anthropic``, model
``deepseek-chat`` or ``LATTICE_MODEL``).

Run it::

    python -m lattice_worker.examples.team [DIRECTORY] [--word WORD]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shlex
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from lattice_mailbox.base import TeamMailbox
from lattice_worker import (
    AssistantModelMessage,
    ModelRequest,
    ResultMessage,
    ScriptedModelClient,
    Team,
    create_team,
    define_agent,
    team_member,
    text_turn,
    tool_turn,
)
from lattice_worker.tools.builtin.search import GREP_SKIPPED_DIRS

TEAM_NAME = "demo"


def grep_input(directory: str, word: str) -> dict[str, str]:
    """The ``Grep`` call of the searcher: case-insensitive whole-word matches of ``word``."""
    return {"pattern": rf"(?i)\b{re.escape(word)}\b", "path": directory}


def count_command(directory: str) -> str:
    """The ``Bash`` command of the counter: the five largest text files under
    ``directory`` (``largest: PATH:LINES``) and a ``total: T lines in N text files``
    line. The files are those the searcher's ``Grep`` searches: every text file
    (empty ones too), without hidden files and directories, binary files (a
    NUL byte) and the directories ``Grep`` skips (:data:`GREP_SKIPPED_DIRS`:
    ``__pycache__``, ``node_modules``, ``*.egg-info``)."""
    d = shlex.quote(directory)
    skipped = " ".join(f"--exclude-dir={shlex.quote(p)}" for p in (".*", *GREP_SKIPPED_DIRS))
    pruned = " -o ".join(f"-name {shlex.quote(p)}" for p in GREP_SKIPPED_DIRS)
    # grep -c gives binary files 0 lines as it does empty ones: the empty files come from find
    return (
        f"test -d {d} || {{ echo not a directory: {d} >&2; exit 2; }}; "
        f"{{ LC_ALL=C grep -rIc {skipped} --exclude='.*' -e '' -- {d} | LC_ALL=C sort -t: -k2,2nr -k1,1; "
        f"find {d} -mindepth 1 \\( -name '.*' -o -type d \\( {pruned} \\) \\) -prune "
        "-o -type f -empty -printf 'empty:0\\n'; } | "
        'awk -F: \'$NF > 0 || $1 == "empty" {n++; t+=$NF; if (n <= 5 && $NF > 0) print "largest: " $0} '
        'END {print "total: " t+0 " lines in " n+0 " text files"}\''
    )


def _relative(path: str, directory: str) -> str:
    prefix = directory.rstrip("/") + "/"
    return path[len(prefix) :] if path.startswith(prefix) else path


def summarise_grep(output: str, directory: str, word: str) -> str:
    """The searcher's report from the ``Grep`` answer: lines, files, and the top files."""
    summary = re.search(r"(\d+) matching lines in (\d+) files \((\d+) files searched", output)
    if summary is None:
        return f"Grep gave no summary: {output[:300]}"
    lines, files, searched = (int(n) for n in summary.groups())
    per_file: Counter[str] = Counter()
    for line in output.splitlines():
        hit = re.match(r"^(.*?):(\d+):", line)
        if hit:
            per_file[_relative(hit.group(1), directory)] += 1
    top = ", ".join(
        f"{name} ({n})" for name, n in sorted(per_file.items(), key=lambda kv: (-kv[1], kv[0]))[:10]
    )
    return f'"{word}" is on {lines} lines in {files} of {searched} text files; top files: {top or "none"}'


def summarise_counts(output: str, directory: str) -> str:
    """The counter's report from the ``Bash`` answer of :func:`count_command`."""
    total = re.search(r"^total: (\d+) lines in (\d+) text files$", output, re.MULTILINE)
    if total is None:
        return f"the line count gave no total: {output[:300]}"
    largest = []
    for line in output.splitlines():
        if line.startswith("largest: ") and ":" in line[9:]:
            path, lines = line[9:].rsplit(":", 1)
            largest.append(f"{_relative(path, directory)} ({lines})")
    return f"{total.group(1)} lines in {total.group(2)} text files; largest: {', '.join(largest) or 'none'}"


# --------------------------------------------------------------------------- prompts


def demo_prompt(directory: str, word: str) -> str:
    """The canonical request for this team (the scripted lead reads the quoted values)."""
    return (
        f'Look at the directory "{directory}": find where the word "{word}" is used, and count the lines '
        "of its text files. Give me a short summary with the numbers."
    )


LEAD_PROMPT = (
    "You lead a two-member file-analysis team. Members: searcher (searches files for a word) and counter "
    "(counts lines). For a request about a directory, hand off to both members in ONE response using "
    'mode "handoff": give searcher the directory and the word, give counter the directory. Each task must be '
    "self-contained (quote the full, absolute directory path: members work in their own directories). When their reports arrive, answer the user with a short "
    "summary that keeps the exact numbers from the reports."
)
SEARCHER_PROMPT = (
    "You search files. Use the Grep tool on the directory from your task with a case-insensitive whole-word "
    "pattern for the word, then call team_reply with a short report that keeps Grep's numbers exactly: "
    "matching lines, files with matches, files searched, and the files with most matches."
)
COUNTER_PROMPT = (
    "You count lines. Use the Bash tool to count the lines of the text files under the directory from your "
    "task (leave out hidden and binary files), then call team_reply with the total number of lines, the "
    "number of files and the largest files (keep the numbers exactly)."
)


# --------------------------------------------------------------------------- the offline (scripted) models


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text")
    return ""


def _quoted(text: str, key: str) -> str | None:
    match = re.search(rf'{key} "([^"]+)"', text)
    return match.group(1) if match else None


_PATH = r"""["']?((?:~|\.{1,2}|/)[^\s"']*|[\w.-]+/[^\s"']*)["']?"""


def parse_request(text: str) -> tuple[str | None, str | None]:
    """``(directory, word)`` from a request: the quoted form of :func:`demo_prompt`,
    or free text such as ``Look through ./docs for the word lease``."""
    directory = _quoted(text, "directory")
    if directory is None:
        match = re.search(rf"\b(?:directory|folder|under|through|in)\s+{_PATH}", text, re.IGNORECASE)
        if match is None:  # any path-looking token: /abs, ~/x, ./rel, ../rel
            match = re.search(r"""(?:^|\s)["']?((?:~|\.{1,2})?/[^\s"']*)""", text)
        directory = match.group(1).rstrip(".,;:") if match else None
    word = _quoted(text, "word")
    if word is None:
        match = re.search(r"\bword[:\s]+[\"']?([\w-]+)", text, re.IGNORECASE)
        word = match.group(1) if match else None
    return directory, word


def _last_tool_result(request: ModelRequest) -> dict[str, Any] | None:
    content = request.messages[-1].get("content") if request.messages else None
    if isinstance(content, list):
        for block in content:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                return block
    return None


def _is_prompt(message: dict[str, Any]) -> bool:
    """A user message that is a caller's prompt (not tool results, not handoff reports)."""
    from lattice_worker.team import parse_report_message

    if message.get("role") != "user":
        return False
    content = message.get("content")
    if isinstance(content, str):
        return True
    if not isinstance(content, list) or parse_report_message(message):
        return False
    return not any(isinstance(b, dict) and b.get("type") == "tool_result" for b in content)


def _current_request(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages since the caller's latest prompt: a live lead keeps its history
    across ``team.prompt`` calls, and only the current request counts."""
    for i in range(len(messages) - 1, -1, -1):
        if _is_prompt(messages[i]):
            return messages[i:]
    return messages


def _reports(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    from lattice_worker.team import parse_report_message

    for message in reversed(messages):
        entries = parse_report_message(message)
        if entries:
            return entries
    return []


def lead_script(request: ModelRequest) -> AssistantModelMessage:
    """The scripted lead: hand off to both members, then summarise their reports
    (of the caller's latest prompt: earlier prompts in the history are done)."""
    current = _current_request(request.messages)
    reports = _reports(current)
    if reports:
        lines = []
        for report in reports:
            status = "" if report["status"] == "done" else f" ({report['status']})"
            lines.append(f"- {report['member']}{status}: {report['content']}")
        return text_turn("Summary of the team's findings:\n" + "\n".join(lines))
    prompt = _text(current[0]["content"]) if current else ""
    directory, word = parse_request(prompt)
    if directory is None or word is None:
        return text_turn(
            'Please name a directory and a word, e.g. Look at the directory "/path": find the word "x".'
        )
    # members resolve relative paths against their own workspaces: hand them absolute ones
    directory = os.path.abspath(os.path.expanduser(directory))
    return tool_turn(
        (
            "searcher",
            {"mode": "handoff", "task": f'Search the directory "{directory}" for the word "{word}".'},
        ),
        ("counter", {"mode": "handoff", "task": f'Count the lines in the directory "{directory}".'}),
    )


def _task(request: ModelRequest) -> str:
    return _text(request.messages[0]["content"]) if request.messages else ""


def member_script(request: ModelRequest) -> AssistantModelMessage:
    """The scripted members: the task says which one this is (searcher: a directory
    and a word; counter: a directory). Call the built-in tool, then ``team_reply``
    with a report made from its real output."""
    task = _task(request)
    directory, word = _quoted(task, "directory"), _quoted(task, "word")
    tool_name = "Grep" if word is not None else "Bash"
    result = _last_tool_result(request)
    if result is not None:
        content = result.get("content")
        output = content if isinstance(content, str) else _text(content)
        if result.get("is_error"):
            report = f"{tool_name} failed: {output.strip()}"
        elif word is not None:
            report = summarise_grep(output, directory or "", word)
        else:
            report = summarise_counts(output, directory or "")
        return tool_turn(("team_reply", {"content": report}))
    if directory is None:
        return tool_turn(("team_reply", {"content": "I could not find a quoted directory in my task."}))
    if word is not None:
        return tool_turn(("Grep", grep_input(directory, word)))
    return tool_turn(("Bash", {"command": count_command(directory)}))


def scripted_demo_model(request: ModelRequest) -> AssistantModelMessage:
    """One stateless model for all three agents: the lead is the agent with the
    member tools, a member is told apart by its task (stateless, so it also works
    when a run resumes in another process)."""
    names = {t["name"] for t in request.tools}
    if "searcher" in names:
        return lead_script(request)
    return member_script(request)


def _provider_options() -> dict[str, Any]:
    """Real-provider options from the environment, or ``{}`` when no key is set."""
    if os.environ.get("DEEPSEEK_API_KEY"):
        return {
            "api_key": os.environ["DEEPSEEK_API_KEY"],
            "base_url": "https://api.deepseek.com/anthropic",
            "model": os.environ.get("LATTICE_MODEL", "deepseek-chat"),
        }
    if os.environ.get("ANTHROPIC_API_KEY"):
        options: dict[str, Any] = {"api_key": os.environ["ANTHROPIC_API_KEY"]}
        if os.environ.get("LATTICE_MODEL"):
            options["model"] = os.environ["LATTICE_MODEL"]
        return options
    return {}


def uses_real_model() -> bool:
    """True when ``ANTHROPIC_API_KEY`` or ``DEEPSEEK_API_KEY`` is set."""
    return bool(_provider_options())


def build_team(mailbox: TeamMailbox | None = None, model_client: Any = None) -> Team:
    """The demo team ``"demo"`` (lead + ``searcher`` + ``counter``, all ``define_agent`` specs;
    the members with the built-in workspace tools, the lead with ``workspace=False``).

    ``mailbox``: any ``TeamMailbox`` (default a new ``MemoryMailbox``).
    ``model_client``: used by every agent when given; otherwise the real provider
    when an API key is set, else the scripted offline model.
    """
    if model_client is not None:
        common: dict[str, Any] = {"model_client": model_client}
    else:
        common = _provider_options() or {"model_client": ScriptedModelClient(scripted_demo_model)}
    # members: the default workspace and its built-in tools; the lead only delegates
    searcher = define_agent(name="searcher", system_prompt=SEARCHER_PROMPT, max_turns=6, **common)
    counter = define_agent(name="counter", system_prompt=COUNTER_PROMPT, max_turns=6, **common)
    lead_prompt = f"{LEAD_PROMPT} Relative directories in a request are relative to {os.getcwd()}."
    lead = define_agent(name="lead", system_prompt=lead_prompt, workspace=False, max_turns=8, **common)
    return create_team(
        name=TEAM_NAME,
        lead=lead,
        members=[
            team_member(name="searcher", role="executor", focus="Find where a word is used", agent=searcher),
            team_member(name="counter", role="executor", focus="Count lines of text files", agent=counter),
        ],
        mailbox=mailbox,
        runner={"max_concurrent_work_items": 2},
    )


team = build_team()
"""The demo team on a ``MemoryMailbox`` (what ``lattice worker lattice_worker.examples.team:team`` loads)."""


async def run(directory: str, word: str, *, team: Team | None = None, on_event: Any = None) -> ResultMessage:
    """Ask the team about ``directory`` (pass an absolute path: members may run in
    other processes) and ``word``; ``on_event(event)`` sees every event. Returns
    the lead's final ``ResultMessage``."""
    target = team if team is not None else build_team()
    result = None
    async for event in target.query(demo_prompt(directory, word)):
        if on_event is not None:
            on_event(event)
        if event.type == "result":
            result = event
    assert result is not None
    return result


def _describe(event: Any) -> str | None:
    if event.type == "team_message":
        message = event.message
        return f"  [{event.subtype:>8}] {message['from']} -> {message['to']}"
    if event.type == "team_agent":
        return f"  [{event.subtype:>8}] member {event.member}" + (
            f" ({event.result})" if event.result else ""
        )
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run the demo team on a directory.")
    parser.add_argument("directory", nargs="?", default=".", help="directory to analyse (default: .)")
    parser.add_argument("--word", default="import", help='word to search for (default: "import")')
    args = parser.parse_args(argv)
    if not Path(args.directory).is_dir():
        print(f"error: not a directory: {args.directory}", file=sys.stderr)
        return 2
    print(f"model: {'real provider' if uses_real_model() else 'scripted (offline)'}")

    def show(event: Any) -> None:
        line = _describe(event)
        if line:
            print(line)

    result = asyncio.run(run(str(Path(args.directory).resolve()), args.word, on_event=show))
    print()
    print(result.result if not result.is_error else f"error ({result.subtype}): {result.error}")
    return 0 if not result.is_error else 1


if __name__ == "__main__":
    sys.exit(main())
