"""The search tools ``Glob`` and ``Grep`` (read-only, concurrency-safe).

* ``Glob {pattern, path?}`` -- the files (not directories) under ``path``
  (default the ``cwd``) matching a glob pattern, ``wcmatch`` syntax with
  ``**`` (any depth) and ``{a,b}``; hidden files and directories (names
  starting with ``.``) match only when the pattern names them; links to
  directories are not followed. Sorted by path; at most
  :data:`GLOB_MAX_RESULTS` are listed, with a note of how many more matched.
* ``Grep {pattern, path?, glob?}`` -- the lines matching a Python regular
  expression (``re``; ``(?i)`` for case-insensitive) in the text files under
  ``path`` (a directory, default the ``cwd``, or one file), as
  ``path:line:text``, sorted by path then line. ``glob`` keeps only the files
  whose path below ``path`` matches it (a pattern without ``/`` matches the
  file name, e.g. ``*.py``). Hidden files and directories below ``path``,
  the build and cache directories git and packaging leave out
  (:data:`GREP_SKIPPED_DIRS`: ``__pycache__``, ``node_modules``,
  ``*.egg-info``) and links to directories are skipped, binary files (a NUL
  byte in the first 8 KiB) too. A line longer than :data:`GREP_SCAN_CHARS` characters is
  searched in pieces of that size (the matching piece is shown). At most
  :data:`GREP_MAX_LINES` lines are shown (each cut at
  :data:`GREP_MAX_LINE_CHARS` characters, ``MAX_OUTPUT_CHARS`` characters in
  all, with a note of how many more matched); the last line always counts every
  match: ``N matching lines in F files (S files searched)``.

Paths in answers are relative to the ``cwd`` when below it, else absolute.
Both stop early (with a note) when the query is aborted; ``Grep`` also after
:data:`GREP_TIME_LIMIT_SECONDS` (a search of ``/`` reads gigabytes). A regular
expression that backtracks catastrophically (``(a|aa)+$`` on a long run of
``a``) can still run for a very long time on one line: Python's ``re`` cannot
be interrupted.
"""

from __future__ import annotations

import fnmatch
import io
import os
import re
import time
from collections.abc import Iterator

from pydantic import BaseModel, ConfigDict, Field
from wcmatch import glob as wglob

from ..tool import ToolContext, ToolDefinition
from .policy import (
    MAX_OUTPUT_CHARS,
    Refusal,
    Workspace,
    cut,
    define_tool,
    is_binary,
    line_pieces,
    open_for_reading,
    read_head,
)

GLOB_MAX_RESULTS = 1000
"""Paths ``Glob`` lists."""

GREP_MAX_LINES = 500
"""Matching lines ``Grep`` shows (all are counted)."""

GREP_MAX_LINE_CHARS = 300
"""Characters of one matching line ``Grep`` shows."""

GREP_TIME_LIMIT_SECONDS = 60
"""Seconds one ``Grep`` call may search; then it answers what it found so far, with a note."""

GREP_SCAN_CHARS = 1_000_000
"""A longer line is searched in pieces of this many characters (a match across
two pieces is not found); bounds the memory one huge line takes."""

GREP_SKIPPED_DIRS = ("__pycache__", "node_modules", "*.egg-info")
"""Directory names (``fnmatch`` patterns) ``Grep`` does not descend into below its
``path``, as it skips hidden ones: build output and caches, never sources."""

_GLOB_FLAGS = wglob.GLOBSTAR | wglob.BRACE | wglob.NODIR
_FILTER_FLAGS = wglob.GLOBSTAR | wglob.BRACE | wglob.MATCHBASE


class GlobInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    pattern: str = Field(min_length=1, description='Glob pattern, e.g. "**/*.py" or "src/*.{js,ts}".')
    path: str | None = Field(None, description="Directory to search from (default: your working directory).")


class GrepInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    pattern: str = Field(
        min_length=1, description='Python regular expression, e.g. "def \\w+" or "(?i)todo".'
    )
    path: str | None = Field(
        None,
        description="Directory (searched recursively) or file to search (default: your working directory).",
    )
    glob: str | None = Field(None, description='Only search files matching this glob, e.g. "*.py".')


def _aborted(ctx: ToolContext) -> bool:
    return ctx.signal is not None and ctx.signal.aborted


def find_files(ws: Workspace, args: GlobInput, ctx: ToolContext) -> str:
    base = ws.absolute(args.path) if args.path else ws.cwd
    if not os.path.isdir(base):
        raise Refusal(f"{base} is not a directory")
    found: list[str] = []
    stopped = False
    for match in wglob.iglob(args.pattern, root_dir=base, flags=_GLOB_FLAGS):
        found.append(os.path.normpath(os.path.join(base, match)))
        if len(found) % 1000 == 0 and _aborted(ctx):
            stopped = True
            break
    if not found:
        return f"No files match {args.pattern!r} under {base}"
    found.sort()
    shown = [ws.display(p) for p in found[:GLOB_MAX_RESULTS]]
    body = "\n".join(shown)
    if len(found) > GLOB_MAX_RESULTS:
        body += f"\n[... {len(found) - GLOB_MAX_RESULTS} more matching files not shown; narrow the pattern]"
    if stopped:
        body += "\n[stopped early: the query was aborted]"
    return cut(body)


def _walk(root: str) -> Iterator[str]:
    """Files below ``root`` in path order; hidden names, :data:`GREP_SKIPPED_DIRS`
    and links to directories skipped."""
    try:
        with os.scandir(root) as it:
            entries = sorted(it, key=lambda e: e.name)
    except OSError:
        return
    for entry in entries:
        if entry.name.startswith("."):
            continue
        try:
            if entry.is_dir(follow_symlinks=False):
                if not any(fnmatch.fnmatchcase(entry.name, skip) for skip in GREP_SKIPPED_DIRS):
                    yield from _walk(entry.path)
            elif entry.is_file():
                yield entry.path
        except OSError:
            continue


def _search(path: str, rx: re.Pattern[str], deadline: float) -> tuple[list[tuple[int, str]], bool] | None:
    """The matching ``(line number, line)`` pairs of one file and whether the whole
    file was searched before ``deadline`` (``time.monotonic()``), or ``None`` for a
    binary file."""
    with open_for_reading(path) as raw:
        if is_binary(read_head(raw)):
            return None
        raw.seek(0)
        hits: list[tuple[int, str]] = []
        text = io.TextIOWrapper(raw, encoding="utf-8", errors="replace")
        for count, (number, piece) in enumerate(line_pieces(text, GREP_SCAN_CHARS)):
            if count % 4096 == 0 and time.monotonic() >= deadline:
                return hits, False
            if (not hits or hits[-1][0] != number) and rx.search(piece):
                hits.append((number, piece))
        return hits, True


def grep_files(ws: Workspace, args: GrepInput, ctx: ToolContext) -> str:
    try:
        rx = re.compile(args.pattern)
    except re.error as exc:
        raise Refusal(f"invalid regular expression {args.pattern!r}: {exc}") from None
    root = ws.absolute(args.path) if args.path else ws.cwd
    if not os.path.exists(root):
        raise Refusal(f"{root} does not exist")
    single = not os.path.isdir(root)
    if single and not os.path.isfile(root):
        raise Refusal(f"{root} is not a regular file (a device, FIFO or socket)")
    files = iter([root]) if single else _walk(root)
    lines: list[str] = []
    size = 0
    matched_lines = matched_files = searched = binary = unreadable = 0
    stopped = timed_out = False
    deadline = time.monotonic() + GREP_TIME_LIMIT_SECONDS
    for path in files:
        if args.glob and not single:
            relative = os.path.relpath(path, root).replace(os.sep, "/")
            if not wglob.globmatch(relative, args.glob, flags=_FILTER_FLAGS):
                continue
        if _aborted(ctx):
            stopped = True
            break
        try:
            found = _search(path, rx, deadline)
        except OSError:
            if single:
                raise
            unreadable += 1
            continue
        if found is None:
            if single:
                raise Refusal(f"{path} is a binary file; Grep searches text files only")
            binary += 1
            continue
        hits, complete = found
        searched += complete
        timed_out = not complete
        if not hits:
            if timed_out:
                break
            continue
        matched_files += 1
        matched_lines += len(hits)
        shown = ws.display(path)
        for number, text in hits:
            if len(lines) >= GREP_MAX_LINES or size >= MAX_OUTPUT_CHARS:
                break
            if len(text) > GREP_MAX_LINE_CHARS:
                text = text[:GREP_MAX_LINE_CHARS] + "…"
            line = f"{shown}:{number}:{text}"
            lines.append(line)
            size += len(line) + 1
        if timed_out:
            break
    notes = [f"{searched} files searched"]
    if binary:
        notes.append(f"{binary} binary files skipped")
    if unreadable:
        notes.append(f"{unreadable} files could not be read")
    summary = f"{matched_lines} matching lines in {matched_files} files ({'; '.join(notes)})"
    if stopped:
        summary += " [stopped early: the query was aborted]"
    if timed_out:
        summary += (
            f" [stopped after the time limit of {GREP_TIME_LIMIT_SECONDS} s; narrow the path or the glob]"
        )
    if not lines:
        return f"No matches for {args.pattern!r} under {root}: {summary}"
    body = "\n".join(lines)
    if matched_lines > len(lines):
        body += f"\n[... {matched_lines - len(lines)} more matching lines not shown; narrow the search]"
    return f"{body}\n{summary}"


def search_tools(ws: Workspace) -> list[ToolDefinition]:
    """``Glob`` and ``Grep`` over ``ws``."""
    return [
        define_tool(
            ws,
            "Glob",
            "Find files by glob pattern (** matches any depth), sorted by path.",
            GlobInput,
            find_files,
            read_only=True,
        ),
        define_tool(
            ws,
            "Grep",
            "Search file contents by regular expression (Python syntax); answers path:line:text lines and a "
            "count of all matches. Optionally only files matching a glob.",
            GrepInput,
            grep_files,
            read_only=True,
        ),
    ]


__all__ = [
    "GLOB_MAX_RESULTS",
    "GREP_MAX_LINES",
    "GREP_MAX_LINE_CHARS",
    "GREP_SCAN_CHARS",
    "GREP_SKIPPED_DIRS",
    "GREP_TIME_LIMIT_SECONDS",
    "search_tools",
]
