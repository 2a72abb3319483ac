"""A small runnable team: a lead and two members with real tools.

* ``searcher`` searches the text files under a directory for a word
  (``search_files``);
* ``counter`` counts the lines of the text files under a directory
  (``count_lines``);
* the lead hands the caller's directory to both members in one batch, waits
  for their reports and summarises them with the real numbers.

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
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

from lattice_mailbox.base import TeamMailbox
from lattice_worker import (
    AssistantModelMessage,
    ModelRequest,
    ResultMessage,
    ScriptedModelClient,
    Team,
    ToolExecutionError,
    create_team,
    define_agent,
    team_member,
    text_turn,
    tool,
    tool_turn,
)

TEAM_NAME = "demo"
MAX_FILES = 2000
MAX_FILE_BYTES = 1_000_000
SKIP_DIRS = {
    ".git",
    ".hg",
    ".svn",
    "__pycache__",
    "node_modules",
    ".venv",
    "venv",
    ".mypy_cache",
    ".ruff_cache",
}


# --------------------------------------------------------------------------- the real tools


def _text_files(directory: str) -> list[Path]:
    root = Path(directory).expanduser()
    if not root.is_dir():
        raise ToolExecutionError(f"not a directory: {directory}")
    files: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("."))
        for name in sorted(filenames):
            path = Path(dirpath) / name
            try:
                if path.is_file() and path.stat().st_size <= MAX_FILE_BYTES:
                    files.append(path)
            except OSError:
                continue
            if len(files) >= MAX_FILES:
                return files
    return files


def _read_text(path: Path) -> str | None:
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if b"\0" in data[:4096]:
        return None  # binary
    return data.decode("utf-8", errors="replace")


def search_directory(directory: str, word: str) -> dict[str, Any]:
    """Case-insensitive whole-word matches of ``word`` in the text files under
    ``directory``: ``{"files_searched", "total_matches", "matches": {relative path: count}}``."""
    if not word.strip():
        raise ToolExecutionError("the word to search for is empty")
    pattern = re.compile(rf"\b{re.escape(word.strip())}\b", re.IGNORECASE)
    root = Path(directory).expanduser()
    matches: dict[str, int] = {}
    searched = 0
    for path in _text_files(directory):
        text = _read_text(path)
        if text is None:
            continue
        searched += 1
        count = len(pattern.findall(text))
        if count:
            matches[str(path.relative_to(root))] = count
    return {"files_searched": searched, "total_matches": sum(matches.values()), "matches": matches}


def count_directory_lines(directory: str) -> dict[str, Any]:
    """Line counts of the text files under ``directory``:
    ``{"files_counted", "total_lines", "largest": [[relative path, lines], ...] (top 5)}``."""
    root = Path(directory).expanduser()
    counts: dict[str, int] = {}
    for path in _text_files(directory):
        text = _read_text(path)
        if text is None:
            continue
        counts[str(path.relative_to(root))] = text.count("\n") + (
            1 if text and not text.endswith("\n") else 0
        )
    largest = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:5]
    return {
        "files_counted": len(counts),
        "total_lines": sum(counts.values()),
        "largest": [list(x) for x in largest],
    }


@tool(
    name="search_files",
    description="Search the text files under a directory for a whole word (case-insensitive).",
)
async def search_files(directory: str, word: str) -> str:
    """Returns JSON: files_searched, total_matches, matches {file: count}."""
    result = await asyncio.to_thread(search_directory, directory, word)
    top = dict(sorted(result["matches"].items(), key=lambda kv: (-kv[1], kv[0]))[:10])
    return (
        f'"{word}" occurs {result["total_matches"]} times in {len(result["matches"])} of '
        f"{result['files_searched']} text files; top files: {json.dumps(top)}"
    )


@tool(name="count_lines", description="Count the lines of the text files under a directory.")
async def count_lines(directory: str) -> str:
    """Returns the total line count, the number of files and the largest files."""
    result = await asyncio.to_thread(count_directory_lines, directory)
    largest = ", ".join(f"{name} ({lines})" for name, lines in result["largest"])
    return (
        f"{result['total_lines']} lines in {result['files_counted']} text files; largest: {largest or 'none'}"
    )


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
    "self-contained (quote the full directory path). When their reports arrive, answer the user with a short "
    "summary that keeps the exact numbers from the reports."
)
SEARCHER_PROMPT = (
    "You search files. Call search_files with the directory and word from your task, then call team_reply "
    "with the tool's output (keep the numbers exactly)."
)
COUNTER_PROMPT = (
    "You count lines. Call count_lines with the directory from your task, then call team_reply with the "
    "tool's output (keep the numbers exactly)."
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
    return tool_turn(
        (
            "searcher",
            {"mode": "handoff", "task": f'Search the directory "{directory}" for the word "{word}".'},
        ),
        ("counter", {"mode": "handoff", "task": f'Count the lines in the directory "{directory}".'}),
    )


def _member_script(tool_name: str, keys: tuple[str, ...]) -> Any:
    def play(request: ModelRequest) -> AssistantModelMessage:
        result = _last_tool_result(request)
        if result is not None:
            text = (
                _text(result.get("content"))
                if not isinstance(result.get("content"), str)
                else result["content"]
            )
            if result.get("is_error"):
                text = f"{tool_name} failed: {text}"
            return tool_turn(("team_reply", {"content": text}))
        prompt = _text(request.messages[0]["content"])
        args = {key: _quoted(prompt, key) for key in keys}
        if any(v is None for v in args.values()):
            return tool_turn(("team_reply", {"content": f"I could not find {', '.join(keys)} in my task."}))
        return tool_turn((tool_name, args))

    return play


searcher_script = _member_script("search_files", ("directory", "word"))
searcher_script.__doc__ = "The scripted searcher: call search_files, then team_reply with its output."
counter_script = _member_script("count_lines", ("directory",))
counter_script.__doc__ = "The scripted counter: call count_lines, then team_reply with its output."


def scripted_demo_model(request: ModelRequest) -> AssistantModelMessage:
    """One stateless model for all three agents: it recognises the agent by the
    tools in the request (DESIGN section 9: stateless, so it also works when a
    run resumes in another process)."""
    names = {t["name"] for t in request.tools}
    if "search_files" in names:
        return searcher_script(request)
    if "count_lines" in names:
        return counter_script(request)
    return lead_script(request)


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
    """The demo team ``"demo"`` (lead + ``searcher`` + ``counter``, all ``define_agent`` specs).

    ``mailbox``: any ``TeamMailbox`` (default a new ``MemoryMailbox``).
    ``model_client``: used by every agent when given; otherwise the real provider
    when an API key is set, else the scripted offline model.
    """
    if model_client is not None:
        common: dict[str, Any] = {"model_client": model_client}
    else:
        common = _provider_options() or {"model_client": ScriptedModelClient(scripted_demo_model)}
    searcher = define_agent(
        name="searcher", system_prompt=SEARCHER_PROMPT, tools=[search_files], max_turns=6, **common
    )
    counter = define_agent(
        name="counter", system_prompt=COUNTER_PROMPT, tools=[count_lines], max_turns=6, **common
    )
    lead = define_agent(name="lead", system_prompt=LEAD_PROMPT, max_turns=8, **common)
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
