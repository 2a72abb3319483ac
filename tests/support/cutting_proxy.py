"""A TCP proxy in front of a Redis (or a PostgreSQL) that loses the reply of one chosen command.

``CuttingProxy(port)`` listens on a free port of 127.0.0.1 (threads, so sync and
asyncio clients and other processes can use it) and forwards to the Redis on
``port``. After :meth:`CuttingProxy.cut_reply_of` ``(marker)``, the next chunk a
client sends that contains ``marker`` is forwarded to Redis (which runs it), and
that client's connection is then closed before the reply reaches it: the
command's outcome is unknown to the caller. Each cut happens once
(``cuts`` counts them). With ``early=True`` the client's connection is closed as
soon as the command is forwarded, while the server may still be running it
(a ``COMMIT`` still being written when the client gave up). Any TCP protocol works: a PostgreSQL client's
``COMMIT`` is cut with the marker ``b"COMMIT"``. Same approach as the asyncio proxy of
``tests/integration/test_mailbox_redis.py``.
"""

from __future__ import annotations

import socket
import threading


class CuttingProxy:
    """See the module doc. Use as a context manager (``stop`` closes everything)."""

    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1") -> None:
        self.upstream = (upstream_host, upstream_port)
        self.cuts = 0
        self._marker: bytes | None = None
        self._early = False
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._sockets: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<proxy port>/0``."""
        return f"redis://127.0.0.1:{self.port}/0"

    def cut_reply_of(self, marker: bytes, *, early: bool = False) -> None:
        """Lose the reply of the next command whose bytes contain ``marker``;
        ``early``: close the client's connection right after forwarding it,
        before the server has run it (see the module doc)."""
        with self._lock:
            self._marker, self._early = marker, early

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.upstream)
            self._sockets += [client, upstream]
            cut = threading.Event()
            threading.Thread(target=self._up, args=(client, upstream, cut), daemon=True).start()
            threading.Thread(target=self._down, args=(upstream, client, cut), daemon=True).start()

    def _up(self, client: socket.socket, upstream: socket.socket, cut: threading.Event) -> None:
        try:
            while data := client.recv(65536):
                with self._lock:
                    hit = self._marker is not None and self._marker in data
                    early = hit and self._early
                    if hit:
                        self._marker = None
                        self.cuts += 1
                        cut.set()
                upstream.sendall(data)
                if early:
                    _close(client)  # the server's side stays open until the reply comes (_down)
                    return
        except OSError:
            pass
        _close(client, upstream)

    def _down(self, upstream: socket.socket, client: socket.socket, cut: threading.Event) -> None:
        try:
            while data := upstream.recv(65536):
                if cut.is_set():
                    break  # the reply of the marked command never reaches the client
                client.sendall(data)
        except OSError:
            pass
        _close(client, upstream)

    def stop(self) -> None:
        """Close the listener and every proxied connection."""
        self._closed = True
        self._listener.close()
        _close(*self._sockets)

    def __enter__(self) -> CuttingProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _close(*sockets: socket.socket) -> None:
    for s in sockets:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        s.close()


__all__ = ["CuttingProxy"]
