"""A throwaway ``redis-server`` of a test's own, on a free port.

``RedisServer(*extra_args)`` starts ``redis-server --port N --save "" --appendonly no
*extra_args`` (e.g. ``"--timeout", "1"`` to close idle clients after 1 s) in its
own process group; :meth:`RedisServer.stop` ends that group by its id (never by
name), :meth:`RedisServer.restart` stops it and starts a fresh, empty server on
the same port. :meth:`RedisServer.kill_clients` is ``CLIENT KILL TYPE normal``
from a connection of its own (every other plain client connection is closed).
Use it as a context manager or through the ``redis_server`` fixtures of the
test modules.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry


def probe(port: int, **options: Any) -> redis.Redis:
    """A plain client of ``127.0.0.1:port`` that tries once: redis-py's default retries a
    refused connection with backoff (about 3-4 s in all), so a start-up probe of a
    server not yet listening waited that long before its next try."""
    return redis.Redis(host="127.0.0.1", port=port, socket_timeout=1, retry=Retry(NoBackoff(), 0), **options)


def free_port() -> int:
    """A TCP port nothing listens on right now (127.0.0.1)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """One ``redis-server`` process group on 127.0.0.1 (see the module doc)."""

    def __init__(self, *extra_args: str, port: int | None = None) -> None:
        self.extra_args = extra_args
        self.port = port or free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0``."""
        return f"redis://127.0.0.1:{self.port}/0"

    def admin(self) -> redis.Redis:
        """A plain redis-py client of its own (not a policy client)."""
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5)

    def start(self, timeout: float = 10.0) -> RedisServer:
        """Start the server and wait (up to ``timeout`` s) until it answers ``PING``."""
        args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        args += ["--appendonly", "no", *self.extra_args]
        log = tempfile.TemporaryFile()
        self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while True:
            try:
                with probe(self.port) as client:
                    client.ping()
                return self
            except redis.AuthenticationError:  # up, with a password
                return self
            except redis.ConnectionError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    tail = log.read()[-800:].decode(errors="replace")
                    raise RuntimeError(f"redis-server on port {self.port} did not start:\n{tail}") from None
                time.sleep(0.02)

    def stop(self) -> None:
        """Stop the server's process group (SIGTERM, then SIGKILL after 5 s)."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=5)

    def restart(self, down_for: float = 0.0) -> None:
        """Stop the server, wait ``down_for`` seconds, start an empty one on the same port."""
        self.stop()
        time.sleep(down_for)
        self.start()

    def kill_clients(self, spare: str | None = None) -> int:
        """``CLIENT KILL TYPE normal SKIPME yes``: how many connections were closed.
        ``spare``: a client name whose connections are left open (the others are
        killed one by one, by id)."""
        with self.admin() as client:
            if spare is None:
                return int(client.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"))
            me = client.client_id()
            ids = [  # (a connection that ran no command yet may be a spared one before its SETNAME)
                c["id"]
                for c in client.client_list(_type="normal")
                if c.get("name") != spare and int(c["id"]) != me and c.get("cmd") != "NULL"
            ]
            return sum(int(client.client_kill_filter(_id=i)) for i in ids)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


__all__ = ["RedisServer", "free_port", "probe"]
