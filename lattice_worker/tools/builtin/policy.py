"""The workspace the built-in tools act in, and the write bound they enforce.

A :class:`Workspace` is a value: ``cwd`` (the directory relative paths are
resolved against, absolute), ``allowed_directories`` (the write roots,
absolute) and ``bash_timeout_ms`` (milliseconds). Nothing here touches the
file system at construction time; :meth:`Workspace.ensure_cwd` creates the
agent's own workspace directory on first use.

The bound: ``Write``, ``Edit`` and the shell writes that ``Bash`` recognises
may only change paths inside ``allowed_directories``. A path is checked after
it is resolved the way the operating system will resolve it -- relative to
``cwd``, ``~`` expanded, every symbolic link of its existing part followed
(``os.path.realpath``), ``..`` applied after the links -- so neither ``..`` nor
a link inside the workspace that points outside gets past the check. An
existing file with more than one hard link is not written either: it may be
the same file as one outside. The
read-only tools (``Read``, ``LS``, ``Glob``, ``Grep``) may read anything the
process may read. The bound guards against mistakes; it is not a sandbox (a
link created between the check and the write, or a program that writes files
itself, is not caught).

Every refusal is raised as :class:`Refusal`; the tools turn it into an error
``tool_result`` (``is_error: true``) that names the path and the rule.
"""

from __future__ import annotations

import inspect
import io
import os
import stat
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from pydantic import BaseModel

from ...errors import ConfigError
from ..effects import builtin_tool_effect
from ..tool import ToolContext, ToolDefinition, ToolResult
from ..tool_definition import in_handler_thread

DEFAULT_BASH_TIMEOUT_MS = 120_000
"""Default upper bound of one ``Bash`` call, in milliseconds (two minutes)."""

MAX_OUTPUT_CHARS = 50_000
"""Upper bound, in characters, of what ``Read``, ``LS``, ``Glob`` and ``Grep`` return;
a longer answer is cut with a note saying how much was left out."""

BINARY_SNIFF_BYTES = 8192
"""A file whose first this-many bytes hold a NUL byte counts as binary."""


class Refusal(Exception):  # noqa: N818 - a refusal is an answer to the model, not a crash
    """A tool call that the tool declines: the message names the path and the rule."""


def _absolute(path: str | os.PathLike[str], base: str) -> str:
    text = os.path.expanduser(os.fspath(path))
    return text if os.path.isabs(text) else os.path.join(base, text)


def real(path: str) -> str:
    """``path`` with every symbolic link of its existing part followed (absolute)."""
    return os.path.realpath(path)


def is_inside(path: str, root: str) -> bool:
    """True when ``path`` is ``root`` or below it (both already resolved)."""
    try:
        return os.path.commonpath([path, root]) == root
    except ValueError:  # different drives
        return False


def open_for_reading(path: str) -> BinaryIO:
    """``path`` opened for reading in binary without ever waiting for data
    (``O_NONBLOCK``): a pseudo-file that would block until data comes (a FIFO,
    ``/proc/kmsg``) reads as empty instead of hanging the tool. Raises ``OSError``."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    return os.fdopen(fd, "rb")


def read_head(raw: BinaryIO) -> bytes:
    """The first :data:`BINARY_SNIFF_BYTES` of ``raw`` (``b""`` when nothing is there yet)."""
    return raw.read(BINARY_SNIFF_BYTES) or b""


def is_binary(head: bytes) -> bool:
    """True for data that holds a NUL byte (how ``grep`` and ``git`` tell binary files)."""
    return b"\0" in head


@dataclass(frozen=True)
class Workspace:
    """Where the built-in tools work (see the module doc).

    Attributes:
        cwd: absolute directory relative paths are resolved against.
        allowed_directories: absolute write roots (``Write``, ``Edit``, shell writes).
        bash_timeout_ms: upper bound of one ``Bash`` call, in milliseconds.
        create: create ``cwd`` (and parents) on the first tool call; true for an
            agent's own workspace, false for :func:`create_builtin_tools`.
    """

    cwd: str
    allowed_directories: tuple[str, ...]
    bash_timeout_ms: int = DEFAULT_BASH_TIMEOUT_MS
    create: bool = False

    @classmethod
    def build(
        cls,
        where: str,
        *,
        cwd: Any,
        allowed_directories: Any = None,
        bash_timeout_ms: Any = DEFAULT_BASH_TIMEOUT_MS,
        create: bool = False,
    ) -> Workspace:
        """Validate and normalise the options of the tool factories.

        ``cwd``: a str or ``os.PathLike``; a relative one is taken relative to the
        process's current directory now. ``allowed_directories``: a list of those
        (relative entries are relative to ``cwd``); ``None`` means ``[cwd]``.
        ``bash_timeout_ms``: a positive int of milliseconds. Raises
        :class:`ConfigError` naming the option otherwise.
        """
        if not isinstance(cwd, str | os.PathLike) or not os.fspath(cwd):
            raise ConfigError(f'{where}: option "cwd" expects a directory path; got {cwd!r}')
        if "\0" in os.fspath(cwd):
            raise ConfigError(
                f'{where}: option "cwd" expects a directory path without NUL characters; got {cwd!r}'
            )
        base = os.path.abspath(os.path.expanduser(os.fspath(cwd)))
        if allowed_directories is None:
            roots: tuple[str, ...] = (base,)
        else:
            if isinstance(allowed_directories, str | os.PathLike) or not isinstance(
                allowed_directories, Iterable
            ):
                raise ConfigError(
                    f'{where}: option "allowed_directories" expects a list of directory paths; '
                    f"got {allowed_directories!r}"
                )
            items = list(allowed_directories)
            for item in items:
                if not isinstance(item, str | os.PathLike) or not os.fspath(item) or "\0" in os.fspath(item):
                    raise ConfigError(
                        f'{where}: option "allowed_directories" expects a list of directory paths '
                        f"without NUL characters; item {item!r} is not one"
                    )
            roots = tuple(os.path.normpath(_absolute(item, base)) for item in items)
        if not isinstance(bash_timeout_ms, int) or isinstance(bash_timeout_ms, bool) or bash_timeout_ms <= 0:
            raise ConfigError(
                f'{where}: option "bash_timeout_ms" expects a positive integer number of milliseconds; '
                f"got {bash_timeout_ms!r}"
            )
        return cls(cwd=base, allowed_directories=roots, bash_timeout_ms=bash_timeout_ms, create=create)

    # ------------------------------------------------------------------ paths

    def absolute(self, path: str) -> str:
        """``path`` made absolute against ``cwd`` (``~`` expanded, links kept)."""
        return _absolute(path, self.cwd)

    def ensure_cwd(self) -> None:
        """Make sure ``cwd`` exists: create it when ``create`` is set, else refuse."""
        if os.path.isdir(self.cwd):
            return
        if self.create and not os.path.exists(self.cwd):
            os.makedirs(self.cwd, exist_ok=True)
            return
        raise Refusal(f"the working directory {self.cwd} does not exist or is not a directory")

    def real_roots(self) -> list[str]:
        return [real(root) for root in self.allowed_directories]

    def writable(self, path: str, *, what: str, keep_last_link: bool = False) -> str:
        """The resolved path of a write to ``path``, or :class:`Refusal` when it
        falls outside ``allowed_directories``.

        ``what`` names the write for the message (``"writing"``, ``'the ">" redirection'``).
        ``keep_last_link``: resolve the parent only and keep the last component
        as it is (removing or moving a link changes the link, not its target),
        unless ``path`` ends with ``/`` or ``/.`` (then the link is followed too).
        """
        absolute = self.absolute(path)
        # "link/" and "link/." name what the link points to: the system follows the link then
        if keep_last_link and not absolute.endswith((os.sep, os.sep + ".")):
            head, tail = os.path.split(os.path.normpath(absolute))
            resolved = os.path.join(real(head), tail) if tail else real(head)
        else:
            resolved = real(absolute)
        roots = self.real_roots()
        if any(is_inside(resolved, root) for root in roots):
            if not keep_last_link:
                _refuse_hard_links(resolved, what)
            return resolved
        shown = path if resolved == absolute else f"{path} (resolves to {resolved})"
        raise Refusal(
            f"{shown} is outside the allowed directories ({', '.join(roots)}): {what} is refused; "
            "only paths inside allowed_directories may be written"
        )

    def display(self, path: str) -> str:
        """How a found path is shown to the model: relative to ``cwd`` when below it, else absolute."""
        if is_inside(path, self.cwd) and path != self.cwd:
            return os.path.relpath(path, self.cwd)
        return path

    def describe(self, tools: Iterable[str] = ("Read", "Write", "Edit", "LS", "Glob", "Grep", "Bash")) -> str:
        """One paragraph for the agent's system prompt: where it works (for the
        built-in ``tools`` it has) and what it may write."""
        roots = ", ".join(self.allowed_directories)
        writes = f"You may change files only inside {roots}" if roots else "You may not change any files"
        return (
            f"Your workspace is {self.cwd}. It is the working directory of your built-in file and shell "
            f"tools ({', '.join(tools)}): relative paths are resolved against it. "
            f"{writes}; you may read any file you can access. "
            "Keep durable work there (code, reports, logs, test evidence), and in your final answer name "
            "the important paths and say how you verified the result."
        )


def _refuse_hard_links(path: str, what: str) -> None:
    """A file with more than one name (hard links) is one file: writing it here changes it
    under its other names too, which may be anywhere on the same file system."""
    try:
        info = os.stat(path)
    except (OSError, ValueError):
        return  # does not exist (yet): the write creates a file of its own
    if stat.S_ISREG(info.st_mode) and info.st_nlink > 1:
        raise Refusal(
            f"{path} has {info.st_nlink} hard links: {what} would change the file under its other names "
            "too, which may be outside the allowed directories, and is refused; remove it (rm) and write "
            "a file of its own"
        )


def line_pieces(text: io.TextIOBase, size: int) -> Iterator[tuple[int, str]]:
    """The lines of ``text`` as ``(line number, piece)``, line endings removed: a
    line longer than ``size`` characters comes as several pieces with the same
    number. Reads ``size`` characters at a time and holds at most twice that,
    however long a line is."""
    number = 1
    carry = ""
    continued = False  # carry continues a line already yielded in part
    while chunk := text.read(size):
        *lines, carry = (carry + chunk).split("\n")
        for line in lines:
            if line or not continued:
                yield number, line
            number += 1
            continued = False
        if len(carry) >= size:
            yield number, carry
            carry = ""
            continued = True
    if carry:
        yield number, carry


def bounded_lines(text: io.TextIOBase, keep: int, *, size: int = 1 << 16) -> Iterator[tuple[int, str, int]]:
    """The lines of ``text`` as ``(line number, first keep characters, characters
    left out)``, line endings removed, read in pieces of ``size >= keep``
    characters (:func:`line_pieces`)."""
    number, head, left_out = 0, None, 0
    for at, piece in line_pieces(text, size):
        if at == number:  # more of a long line
            left_out += len(piece)
            continue
        if head is not None:
            yield number, head, left_out
        number, head, left_out = at, piece[:keep], (len(piece) - keep if len(piece) > keep else 0)
    if head is not None:
        yield number, head, left_out


def cut(text: str, limit: int = MAX_OUTPUT_CHARS, *, hint: str = "") -> str:
    """``text`` bounded to ``limit`` characters, with a note of how much was cut."""
    if len(text) <= limit:
        return text
    note = f"\n[... output cut: {len(text) - limit} of {len(text)} characters left out{hint}]"
    return text[:limit] + note


def home_workspaces() -> Path:
    """The default root of agent workspaces: ``~/.agent/workspaces`` (resolved at call time)."""
    return Path.home() / ".agent" / "workspaces"


def default_workspace_dir(where: str, name: str) -> str:
    """``~/.agent/workspaces/<name>``. Raises :class:`ConfigError` when ``name``
    cannot be one directory name (empty, ``.``/``..``, or holding a path separator)."""
    if (
        not name
        or name in (".", "..")
        or "/" in name
        or "\\" in name
        or "\0" in name
        or (os.altsep and os.altsep in name)
    ):
        raise ConfigError(
            f"{where}: the name {name!r} cannot name a workspace directory under {home_workspaces()}; "
            "pass workspace=... (a directory) or workspace=False"
        )
    key = (os.environ.get("HOME"), name)
    found = _DEFAULT_DIRS.get(key)
    if found is None:
        if len(_DEFAULT_DIRS) >= 1024:
            _DEFAULT_DIRS.clear()
        found = _DEFAULT_DIRS[key] = str(home_workspaces() / name)
    return found


_DEFAULT_DIRS: dict[tuple[str | None, str], str] = {}
""":func:`default_workspace_dir` by ``(HOME, name)``: every agent spawned (one per
step on a worker) asks for it twice, and the ``pathlib`` work took about as much CPU
as the rest of the agent's construction."""


def define_tool(
    workspace: Workspace,
    name: str,
    description: str,
    input_model: type[BaseModel],
    run: Callable[[Workspace, Any, ToolContext], Any],
    *,
    read_only: bool,
) -> ToolDefinition:
    """A built-in tool over ``workspace``.

    ``run(workspace, args, ctx)`` returns the result text (or a :class:`ToolResult`);
    a plain function runs in a worker thread (file work never blocks the event
    loop), a coroutine function on the loop. :class:`Refusal` and ``OSError``
    become an error result ``"<name>: <message>"``. Read-only tools are
    concurrency-safe. ``metadata`` is ``{"builtin": True, "workspace": workspace}``
    (host-owned, never shown to the model). The effect is the built-in tool's
    (:func:`~lattice_worker.tools.effects.builtin_tool_effect`: ``Read``/``LS``/
    ``Glob``/``Grep`` read_only, ``Write``/``Edit`` idempotent over their input,
    ``Bash`` unguarded).
    """
    is_async = inspect.iscoroutinefunction(run)

    async def handler(args: Any, ctx: ToolContext) -> Any:
        try:
            if workspace.create:
                workspace.ensure_cwd()
            if is_async:
                return await run(workspace, args, ctx)
            return await in_handler_thread(run, workspace, args, ctx)
        except Refusal as exc:
            return ToolResult(content=f"{name}: {exc}", is_error=True)
        except OSError as exc:
            return ToolResult(content=f"{name}: {describe_os_error(exc)}", is_error=True)

    effect, dedup_window_s = builtin_tool_effect(name)
    return ToolDefinition(
        name=name,
        description=description,
        input_model=input_model,
        handler=handler,
        is_concurrency_safe=True if read_only else None,
        metadata={"builtin": True, "workspace": workspace},
        effect=effect,
        dedup_window_s=dedup_window_s,
    )


def describe_os_error(exc: OSError) -> str:
    """``"<path>: <reason>"`` for an ``OSError`` (the path when it has one)."""
    reason = exc.strerror or str(exc) or type(exc).__name__
    if exc.filename is not None:
        return f"{os.fsdecode(exc.filename)}: {reason}"
    return reason


__all__ = [
    "BINARY_SNIFF_BYTES",
    "DEFAULT_BASH_TIMEOUT_MS",
    "MAX_OUTPUT_CHARS",
    "Refusal",
    "Workspace",
    "bounded_lines",
    "cut",
    "default_workspace_dir",
    "define_tool",
    "describe_os_error",
    "home_workspaces",
    "is_binary",
    "is_inside",
    "line_pieces",
    "open_for_reading",
    "read_head",
    "real",
]
