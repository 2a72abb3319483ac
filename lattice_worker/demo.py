"""``lattice demo [DIRECTORY] [--word W]``: the example team end to end, in this process.

README, set-up. Runs ``lattice_worker.examples.team`` (a lead plus ``searcher`` and
``counter``, working with the built-in ``Grep`` and ``Bash`` tools in their
workspaces under ``~/.agent/workspaces``) on the embedded default
``MemoryMailbox``: no Redis, no workers. Without an API key every agent plays the example's
stateless scripted model; with ``ANTHROPIC_API_KEY`` or ``DEEPSEEK_API_KEY``
set, the real provider answers. The team's events are printed one line each
as they happen, then the lead's final answer.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from .errors import ConfigError

DEFAULT_WORD = "import"
"""The word the searcher looks for when ``--word`` is not given."""


def describe_event(event: Any) -> str | None:
    """One compact line (rich markup) for a team or lead event, or ``None`` to skip it."""
    kind = getattr(event, "type", None)
    if kind == "team_message":
        m = event.message
        extra = f" [red]{escape(event.error['code'])}[/red]" if event.error else ""
        return f"[cyan]mail[/cyan]   {event.subtype:<9} {escape(m['from'])} -> {escape(m['to'])}{extra}"
    if kind == "team_agent":
        result = f" ({escape(event.result)})" if event.result else ""
        return f"[magenta]member[/magenta] {event.subtype:<9} {escape(event.member)}{result}"
    if kind == "agent_message":
        inner = event.message
        if inner.get("type") == "assistant":
            return _tool_calls(f"  {event.member}", inner)
        return None
    if kind == "assistant":
        return _tool_calls("lead", event.model_dump())
    return None


def _tool_calls(who: str, event: dict[str, Any]) -> str | None:
    blocks = (event.get("message") or {}).get("content") or []
    calls = [b for b in blocks if isinstance(b, dict) and b.get("type") == "tool_use"]
    if not calls:
        return None
    shown = ", ".join(f"{c.get('name')}({_short(c.get('input'))})" for c in calls)
    return f"[green]call[/green]   {escape(who)}: {escape(shown)}"


def _short(value: Any, limit: int = 70) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 1] + "…"


async def demo_async(directory: str, word: str, console: Console) -> Any:
    """Run the example team on ``directory`` / ``word``, printing events to
    ``console``; returns the lead's final ``ResultMessage``."""
    from lattice_worker.examples.team import build_team, demo_prompt

    team = build_team()
    result = None
    async for event in team.query(demo_prompt(directory, word)):
        line = describe_event(event)
        if line:
            console.print(line)
        if getattr(event, "type", None) == "result":
            result = event
    return result


def run_demo(directory: str, word: str | None, console: Console | None = None) -> None:
    """Body of ``lattice demo``.

    Args:
        directory: the directory the team looks through (must exist).
        word: the word to search for (``None`` = :data:`DEFAULT_WORD`).
        console: where to print (a rich ``Console``; default stdout).

    Raises :class:`ConfigError` when ``directory`` is not a directory, and
    ``RuntimeError`` (``"the demo run failed: <subtype>: <error>"``, not printed:
    ``lattice demo`` prints it once as its ``error:`` line) when the lead's run
    ends with an error.
    """
    from lattice_worker.examples.team import uses_real_model

    console = console or Console()
    path = Path(directory).expanduser()
    if not path.is_dir():
        raise ConfigError(f"not a directory: {directory}")
    word = word or DEFAULT_WORD
    model = "a real provider" if uses_real_model() else "the scripted offline model (no API key set)"
    console.print(
        f"[bold]lattice demo[/bold]: team 'demo' on {escape(str(path.resolve()))}, word {word!r}, using {model}"
    )
    result = asyncio.run(demo_async(str(path.resolve()), word, console))
    console.print()
    if result is None or result.is_error:
        error = "no result" if result is None else f"{result.subtype}: {result.error}"
        raise RuntimeError(f"the demo run failed: {error}")
    console.print("[bold]Answer[/bold]")
    console.print(escape(result.result))


__all__ = ["DEFAULT_WORD", "demo_async", "describe_event", "run_demo"]
