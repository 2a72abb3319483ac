"""The shell tool ``Bash {command, timeout_ms?}``.

The command runs as ``bash -c COMMAND`` in the workspace's ``cwd``, in a new
session and process group of its own (``start_new_session``), stdin from
``/dev/null``, stdout and stderr merged into one output. It runs on the event
loop as an asyncio subprocess, never blocking it.

* **Timeout**: ``timeout_ms`` (milliseconds) bounds this call; it cannot exceed
  the workspace's ``bash_timeout_ms`` (default 120 000 ms), which is also the
  bound when it is not given. On timeout -- and when the query is aborted --
  the whole process group gets SIGTERM, then, after
  :data:`KILL_GRACE_SECONDS`, SIGKILL: children and background jobs
  included, also those that ignore SIGTERM, and (on Linux) processes that
  left the group (``setsid``) but still hold the output open.
* **Background jobs**: when the shell exits while processes it started still
  hold the output open, they are stopped the same way after
  :data:`EXIT_GRACE_SECONDS`. A job whose output goes elsewhere
  (``cmd > log 2>&1 &``) keeps running; after a timeout or an abort only if it
  also left the group (``setsid cmd > log 2>&1 &``).
* **Output**: at most :data:`OUTPUT_LIMIT_BYTES` bytes are kept -- the first
  and the last half -- with a note of how many bytes were cut in between;
  decoded as UTF-8 (invalid bytes replaced).
* **Result**: the output, then ``exit code: N``. A non-zero exit, a timeout or
  an abort is an error result (``is_error``).
* **Write bound**: before anything runs, the command is checked for obvious
  writes outside ``allowed_directories`` (:mod:`.shell_policy`); a refused
  command does not run at all.
* **Environment**: the command inherits this process's environment variables
  (API keys included) and user: scrub them in the host, or leave ``Bash`` out,
  where the model must not see them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from ..tool import ToolContext, ToolDefinition, ToolResult
from .policy import Workspace, define_tool
from .shell_policy import check_command

OUTPUT_LIMIT_BYTES = 30_000
"""Output bytes ``Bash`` returns: the first and the last ``OUTPUT_LIMIT_BYTES // 2``."""

KILL_GRACE_SECONDS = 1.0
"""Seconds between SIGTERM and SIGKILL to the process group."""

EXIT_GRACE_SECONDS = 0.5
"""Seconds the output may stay open after the shell exited before the group is stopped."""


REAP_WAIT_SECONDS = 5.0
"""After SIGKILL, how long to wait for the killed processes to be gone (their output closed)."""

_POLL_SECONDS = 0.05


class BashInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    command: str = Field(min_length=1, description="The shell command (run with bash -c).")
    timeout_ms: Annotated[int, Field(ge=1)] | None = Field(
        None,
        description="Timeout in milliseconds (at most the configured bash timeout, which is the default).",
    )


class _Output(asyncio.SubprocessProtocol):
    """Collects the merged output bounded to head + tail and signals exit / EOF."""

    def __init__(self, loop: asyncio.AbstractEventLoop, limit: int) -> None:
        self.half = limit // 2
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0
        self.exited: asyncio.Future[None] = loop.create_future()
        self.closed: asyncio.Future[None] = loop.create_future()

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        self.total += len(data)
        room = self.half - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            if len(self.tail) > self.half:
                del self.tail[: len(self.tail) - self.half]

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)

    def process_exited(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)

    def text(self) -> str:
        cut = self.total - len(self.head) - len(self.tail)
        if cut <= 0:
            return (bytes(self.head) + bytes(self.tail)).decode("utf-8", errors="replace")
        head = bytes(self.head).decode("utf-8", errors="replace")
        tail = bytes(self.tail).decode("utf-8", errors="replace")
        return f"{head}\n[... output cut: {cut} of {self.total} bytes left out ...]\n{tail}"


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover - a reused id owned by someone else
        return False
    return True


def _signal(send: Callable[[int, int], None], target: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        send(target, sig)


async def _terminate(
    send: Callable[[int, int], None], targets: list[int], alive: Callable[[int], bool], grace: float
) -> None:
    """SIGTERM every target, then SIGKILL them after ``grace`` seconds (or at once
    when they are gone before)."""
    for target in targets:
        _signal(send, target, signal.SIGTERM)
    for _ in range(max(1, round(grace / _POLL_SECONDS))):
        if not any(alive(target) for target in targets):
            break
        await asyncio.sleep(_POLL_SECONDS)
    # zombies also answer signal 0: SIGKILL regardless, it is harmless then
    for target in targets:
        _signal(send, target, signal.SIGKILL)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


async def stop_group(pgid: int, grace: float = KILL_GRACE_SECONDS) -> None:
    """SIGTERM the process group, then SIGKILL it after ``grace`` seconds (or at
    once when it is gone before)."""
    await _terminate(os.killpg, [pgid], _group_alive, grace)


def pipe_holders(pipe: Any) -> list[int]:
    """The processes other than this one that hold an end of ``pipe`` (a file
    object) open, from ``/proc`` (Linux; ``[]`` where it cannot be read).

    A process that left the command's group (``setsid``, a daemon) but still
    writes to its output is found this way: a group kill misses it."""
    try:
        link = f"pipe:[{os.fstat(pipe.fileno()).st_ino}]"
        pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except (OSError, ValueError):
        return []
    holders = []
    for pid in pids:
        if pid == os.getpid():
            continue
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{pid}/fd/{fd}") == link:
                    holders.append(pid)
                    break
    return holders


async def _stop_everything(pgid: int, pipe: Any) -> None:
    """Stop the process group, then whatever still holds the output open."""
    await stop_group(pgid)
    if pipe is not None:
        holders = await asyncio.to_thread(pipe_holders, pipe)
        if holders:
            await _terminate(os.kill, holders, _process_alive, KILL_GRACE_SECONDS)


async def run_bash(ws: Workspace, args: BashInput, ctx: ToolContext) -> ToolResult:
    check_command(ws, args.command)
    ws.ensure_cwd()
    timeout_ms = ws.bash_timeout_ms if args.timeout_ms is None else min(args.timeout_ms, ws.bash_timeout_ms)
    loop = asyncio.get_running_loop()
    starting = asyncio.ensure_future(
        loop.subprocess_exec(
            lambda: _Output(loop, OUTPUT_LIMIT_BYTES),
            "bash",
            "-c",
            args.command,
            cwd=ws.cwd,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
    )
    try:
        transport, output = await asyncio.shield(starting)
    except asyncio.CancelledError:
        # the command already runs while its pipes are connected: stop its whole group once it is up
        with contextlib.suppress(Exception):
            started, _ = await starting
            _signal(os.killpg, started.get_pid(), signal.SIGKILL)
            started.close()
        raise
    pgid = transport.get_pid()  # the session leader: its pid is the group id
    reader = transport.get_pipe_transport(1)
    pipe = reader.get_extra_info("pipe") if reader is not None else None
    ending: str | None = None
    try:
        waiters: list[asyncio.Future[Any]] = [output.exited]
        aborted: asyncio.Future[Any] | None = None
        remove = None
        if ctx.signal is not None:
            aborted = loop.create_future()
            remove = ctx.signal.add_listener(
                lambda _reason: loop.call_soon_threadsafe(lambda: aborted.done() or aborted.set_result(None))
            )
            waiters.append(aborted)
        try:
            await asyncio.wait(waiters, timeout=timeout_ms / 1000, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if remove is not None:
                remove()
        if not output.exited.done():
            ending = "aborted" if aborted is not None and aborted.done() else "timeout"
            await stop_group(pgid)
            await asyncio.wait([output.exited], timeout=REAP_WAIT_SECONDS)
        await asyncio.wait([output.closed], timeout=EXIT_GRACE_SECONDS)
        if not output.closed.done():
            # background jobs (or processes that left the group) still holding the output
            await _stop_everything(pgid, pipe)
            # the output closes once every process holding it is gone
            await asyncio.wait([output.closed], timeout=REAP_WAIT_SECONDS)
            if ending is None:
                ending = "background"
    except BaseException:
        # cancelled (the query is going away): leave nothing running behind
        _signal(os.killpg, pgid, signal.SIGKILL)
        for holder in pipe_holders(pipe) if pipe is not None else []:
            _signal(os.kill, holder, signal.SIGKILL)
        raise
    finally:
        transport.close()
    code = transport.get_returncode()
    text = output.text() or "(no output)"
    if not text.endswith("\n"):
        text += "\n"
    if ending == "timeout":
        text += f"Timed out after {timeout_ms} ms: the command and every process it started were killed."
        return ToolResult(content=text, is_error=True)
    if ending == "aborted":
        text += "The query was aborted: the command and every process it started were killed."
        return ToolResult(content=text, is_error=True)
    if ending == "background":
        text += "Background processes still writing to the output were stopped after the command exited.\n"
    text += f"exit code: {code}"
    return ToolResult(content=text, is_error=code != 0)


def shell_tools(ws: Workspace) -> list[ToolDefinition]:
    """``Bash`` over ``ws``."""
    return [
        define_tool(
            ws,
            "Bash",
            "Run a shell command (bash -c) in your working directory with a timeout; returns the combined "
            "stdout/stderr (long output is cut in the middle) and the exit code. Writes outside the allowed "
            "directories are refused.",
            BashInput,
            run_bash,
            read_only=False,
        )
    ]


__all__ = [
    "EXIT_GRACE_SECONDS",
    "KILL_GRACE_SECONDS",
    "OUTPUT_LIMIT_BYTES",
    "REAP_WAIT_SECONDS",
    "shell_tools",
    "stop_group",
]
