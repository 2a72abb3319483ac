"""Start the test MCP servers (``mcp_stdio_server.py``, ``mcp_http_server.py``).

stdio servers are started by the client under test; :func:`stdio_config` gives
the ``{"command", "args"}`` for one. :class:`HTTPServer` runs the HTTP server as
a subprocess on a free loopback port, in its own process group, and stops it
by that group (SIGTERM, then SIGKILL); :meth:`HTTPServer.restart` starts it
again on the same port (it then has forgotten its sessions).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

SUPPORT = Path(__file__).resolve().parent
STDIO_SERVER = str(SUPPORT / "mcp_stdio_server.py")
HTTP_SERVER = str(SUPPORT / "mcp_http_server.py")
START_TIMEOUT_SECONDS = 30.0


def stdio_config(*flags: str, counter: str | None = None) -> dict[str, object]:
    """The ``server`` dict for ``connect_mcp_stdio_server`` running the test stdio server."""
    args = [STDIO_SERVER, *flags]
    if counter is not None:
        args += ["--counter", counter]
    return {"command": sys.executable, "args": args}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _accepts(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` is running. A zombie (dead, not yet reaped) is not --
    once its last thread is gone: the leader of a multi-threaded process shows "Z"
    while its other threads still exit, and the pipes they share close only after
    the last of them."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        if state not in ("Z", "X"):
            return True
        return any(task != str(pid) for task in os.listdir(f"/proc/{pid}/task"))
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def kill_and_wait(pid: int, timeout: float = 10.0) -> None:
    """SIGKILL ``pid`` and wait (blocking, at most ``timeout`` s) until it is dead."""
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while process_alive(pid):
        if time.monotonic() > deadline:
            raise AssertionError(f"process {pid} still alive {timeout} s after SIGKILL")
        time.sleep(0.01)


class HTTPServer:
    """``mcp_http_server.py`` in a subprocess (see the module doc)."""

    def __init__(self, *flags: str, log_path: Path) -> None:
        self.flags = flags
        self.port = free_port()
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def start(self) -> None:
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child holds it
        try:
            self.proc = subprocess.Popen(
                [sys.executable, HTTP_SERVER, "--port", str(self.port), *self.flags],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        finally:
            log.close()
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while not _accepts(self.port):
            if self.proc.poll() is not None:
                raise RuntimeError(f"the MCP HTTP server exited: {self.log_path.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the MCP HTTP server did not listen within {START_TIMEOUT_SECONDS} s")
            time.sleep(0.05)

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    def restart(self) -> None:
        self.stop()
        self.start()


@contextlib.contextmanager
def http_server(*flags: str, log_path: Path) -> Iterator[HTTPServer]:
    server = HTTPServer(*flags, log_path=log_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


__all__ = [
    "HTTPServer",
    "STDIO_SERVER",
    "free_port",
    "http_server",
    "kill_and_wait",
    "process_alive",
    "stdio_config",
]
