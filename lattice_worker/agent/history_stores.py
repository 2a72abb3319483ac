"""Built-in :class:`~lattice_worker.agent.history.HistoryStore` implementations.

An agent takes one as its ``history_store`` option (docs/configure.md, "What is
configured in code"). Three stores:

* :func:`create_jsonl_history_store` — one JSON message per line in a local file.
* :func:`define_history_store` — wraps host callables (sync or async).
* :class:`RedisHistoryStore` — one Redis list per conversation (the distributed
  runtime keeps each lead run's history in one).

A message is an Anthropic wire-format dict (``{"role": ..., "content": ...}``).
Every store has a ``fail_on_error`` attribute, bound at creation: when false the
agent loop logs a store failure and carries on in memory; when true the failure
propagates out of ``query()``.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import os
import tempfile
import threading
import weakref
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from lattice_mailbox.connections import async_redis

from ..errors import ConfigError

logger = logging.getLogger("lattice_worker.history")

Message = dict[str, Any]


# -- shared helpers ---------------------------------------------------------------


def _encode_message(message: Any, *, where: str) -> bytes:
    """One message as a compact UTF-8 JSON document (no newline).

    Raises ``TypeError`` when ``message`` is not a dict or holds values JSON
    cannot represent.
    """
    if not isinstance(message, dict):
        raise TypeError(f"{where}: a history message must be a dict, got {type(message).__name__}")
    try:
        text = json.dumps(message, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{where}: history message is not JSON-serialisable: {exc}") from exc
    return text.encode("utf-8")


def _decode_message(raw: bytes | str) -> Message | None:
    """Parse one stored message; ``None`` when it is not a well-formed message.

    Well-formed means a JSON object with a string ``role`` and a ``content`` key.
    """
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(value, dict) or not isinstance(value.get("role"), str) or "content" not in value:
        return None
    return value


def _check_messages(messages: Any, *, where: str) -> list[Any]:
    if isinstance(messages, (str, bytes, dict)) or not isinstance(messages, Iterable):
        raise TypeError(f"{where}: messages must be a list of message dicts, got {type(messages).__name__}")
    return list(messages)


async def _maybe_await(value: Any) -> Any:
    if inspect.isawaitable(value):
        return await value
    return value


# -- JSONL file store -------------------------------------------------------------

_path_locks: dict[str, threading.Lock] = {}
_path_locks_guard = threading.Lock()


def _lock_for(path: Path) -> threading.Lock:
    """One lock per file in this process, shared by every store over that file."""
    key = os.path.abspath(path)
    with _path_locks_guard:
        lock = _path_locks.get(key)
        if lock is None:
            lock = _path_locks[key] = threading.Lock()
        return lock


class JsonlHistoryStore:
    """Conversation history in a JSON Lines file: one message per line, UTF-8.

    Built by :func:`create_jsonl_history_store`. Methods are coroutines; file
    I/O runs in a worker thread, serialised by a lock per file shared by every
    store of this process over the same path (so a ``replace`` never loses a
    concurrent ``append``). Across processes, each append is a single
    ``O_APPEND`` write.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, fail_on_error: bool = False, fsync: bool = False
    ) -> None:
        self.path = Path(path)
        self.fail_on_error = bool(fail_on_error)
        self.fsync = bool(fsync)
        self._lock = _lock_for(self.path)

    def __repr__(self) -> str:
        return f"JsonlHistoryStore(path={str(self.path)!r}, fail_on_error={self.fail_on_error})"

    async def load(self) -> list[Message]:
        """Every well-formed message in file order; ``[]`` when the file does not exist.

        Malformed lines (a torn final write, a corrupt line in the middle, a JSON
        value that is not a ``{"role", "content"}`` object) are skipped; one
        warning per call on the ``lattice_worker.history`` logger names the file
        and the 1-based line numbers skipped. Blank lines are ignored silently.
        Raises ``OSError`` when the file exists but cannot be read.
        """
        return await asyncio.to_thread(self._load_sync)

    async def append(self, message: Message) -> None:
        """Append ``message`` as one line and flush it to the OS (``fsync`` when
        the store was built with ``fsync=True``). Creates missing parent
        directories. If the file ends in a torn line, the new message starts on
        a fresh line so it stays readable. Raises ``TypeError`` for a
        non-dict or non-JSON-serialisable message (nothing is written) and
        ``OSError`` for I/O failures."""
        line = _encode_message(message, where="JsonlHistoryStore.append") + b"\n"
        await asyncio.to_thread(self._append_sync, line)

    async def replace(self, messages: list[Message]) -> None:
        """Rewrite the file to hold exactly ``messages``, atomically: a temporary
        file in the same directory is written, fsynced and moved over the old
        one with ``os.replace``, so a crash leaves either the old or the new
        history. Every message is encoded before anything is written: a bad
        message raises ``TypeError`` and leaves the file untouched."""
        items = _check_messages(messages, where="JsonlHistoryStore.replace")
        data = b"".join(_encode_message(m, where="JsonlHistoryStore.replace") + b"\n" for m in items)
        await asyncio.to_thread(self._replace_sync, data)

    # blocking parts, run in a worker thread

    def _load_sync(self) -> list[Message]:
        with self._lock:
            try:
                raw = self.path.read_bytes()
            except FileNotFoundError:
                return []
        messages: list[Message] = []
        skipped: list[int] = []
        # Split on "\n" only: str.splitlines() would also split inside a message
        # holding U+2028 and similar characters, which json.dumps leaves literal.
        for number, line in enumerate(raw.split(b"\n"), start=1):
            if not line.strip():
                continue
            message = _decode_message(line)
            if message is None:
                skipped.append(number)
            else:
                messages.append(message)
        if skipped:
            logger.warning(
                "history file %s: skipped %d malformed line(s) at line %s; loaded %d message(s)",
                self.path,
                len(skipped),
                ", ".join(str(n) for n in skipped),
                len(messages),
            )
        return messages

    def _append_sync(self, line: bytes) -> None:
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                size = os.fstat(fd).st_size
                if size > 0 and os.pread(fd, 1, size - 1) != b"\n":
                    line = b"\n" + line  # the previous write was torn: do not glue onto it
                _write_all(fd, line)
                if self.fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)

    def _replace_sync(self, data: bytes) -> None:
        with self._lock:
            parent = self.path.parent
            parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=parent)
            try:
                try:
                    _write_all(fd, data)
                    os.fsync(fd)
                finally:
                    os.close(fd)
                os.replace(tmp, self.path)
            except BaseException:
                try:
                    os.unlink(tmp)
                except FileNotFoundError:
                    pass
                raise
            _fsync_dir(parent)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on a directory; the rename is still done
    finally:
        os.close(fd)


def create_jsonl_history_store(
    *, path: str | os.PathLike[str], fail_on_error: bool = False, fsync: bool = False
) -> JsonlHistoryStore:
    """A history store writing one JSON message per line to ``path``.

    ``path`` need not exist; its missing parent directories are created on the
    first write. ``fsync=True`` forces each append to disk (slower; the default
    flushes to the OS only). Raises :class:`ConfigError` when ``path`` is empty
    or not a path.
    """
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
        raise ConfigError("create_jsonl_history_store: path must be a non-empty file path")
    return JsonlHistoryStore(path, fail_on_error=fail_on_error, fsync=fsync)


# -- host-defined store -----------------------------------------------------------


class DefinedHistoryStore:
    """A history store built by :func:`define_history_store` from host callables."""

    def __init__(
        self,
        load: Callable[[], Any],
        append: Callable[[Message], Any],
        replace: Callable[[list[Message]], Any],
        fail_on_error: bool = False,
    ) -> None:
        self._load = load
        self._append = append
        self._replace = replace
        self.fail_on_error = bool(fail_on_error)

    async def load(self) -> list[Message]:
        """Call the host ``load``; ``None`` counts as an empty history. Raises
        ``TypeError`` when it returns anything but an iterable of dicts."""
        value = await _maybe_await(self._load())
        if value is None:
            return []
        items = _check_messages(value, where="define_history_store load()")
        for index, item in enumerate(items):
            if not isinstance(item, dict):
                raise TypeError(
                    f"define_history_store load(): item {index} is {type(item).__name__}, expected a message dict"
                )
        return items

    async def append(self, message: Message) -> None:
        await _maybe_await(self._append(message))

    async def replace(self, messages: list[Message]) -> None:
        await _maybe_await(self._replace(messages))


def define_history_store(
    *,
    load: Callable[[], Any],
    append: Callable[[Message], Any],
    replace: Callable[[list[Message]], Any],
    fail_on_error: bool = False,
) -> DefinedHistoryStore:
    """A custom history store from three callables.

    ``load()`` returns the stored messages (a list of dicts, or ``None`` for
    none); ``append(message)`` and ``replace(messages)`` persist writes. Each
    may be sync or async. ``fail_on_error`` is bound here. Raises
    :class:`ConfigError` naming the first of ``load``/``append``/``replace``
    that is not callable.
    """
    for name, fn in (("load", load), ("append", append), ("replace", replace)):
        if not callable(fn):
            raise ConfigError(f"define_history_store: {name} must be callable, got {type(fn).__name__}")
    return DefinedHistoryStore(load, append, replace, fail_on_error)


# -- Redis list store -------------------------------------------------------------

RedisClientFactory = Callable[[], aioredis.Redis]


class RedisHistoryStore:
    """One conversation as a Redis list at ``key`` (one JSON message per element).

    ``redis_url_or_client`` is a ``redis://`` URL, a zero-argument factory
    returning a ``redis.asyncio.Redis``, or a ``redis.asyncio.Redis`` instance.
    With a URL or a factory, a client is created lazily inside the running
    event loop and kept per loop, so the store can be used from several event
    loops (e.g. successive Celery tasks) without the "attached to a different
    loop" failure. A client instance is used as given: only use it from the
    loop it belongs to.

    ``append`` is one ``RPUSH``; ``replace`` is ``DEL`` + ``RPUSH`` in one
    ``MULTI``/``EXEC`` transaction; ``load`` is ``LRANGE 0 -1``. With
    ``ttl_seconds`` every write also (re)sets the key's expiry, in the same
    transaction. ``fail_on_error`` defaults to True: a lost write of a
    distributed run's history is not something to continue past silently.
    """

    def __init__(
        self,
        redis_url_or_client: str | aioredis.Redis | RedisClientFactory,
        key: str,
        *,
        fail_on_error: bool = True,
        ttl_seconds: float | None = None,
    ) -> None:
        if not isinstance(key, str) or not key:
            raise ConfigError("RedisHistoryStore: key must be a non-empty string")
        if ttl_seconds is not None and (isinstance(ttl_seconds, bool) or not ttl_seconds > 0):
            raise ConfigError(
                f"RedisHistoryStore: ttl_seconds must be a positive number of seconds, got {ttl_seconds!r}"
            )
        self.key = key
        self.fail_on_error = bool(fail_on_error)
        self.ttl_seconds = ttl_seconds
        self._client: aioredis.Redis | None = None
        self._factory: RedisClientFactory | None = None
        self._url: str | None = None
        if isinstance(redis_url_or_client, str):
            if not redis_url_or_client:
                raise ConfigError("RedisHistoryStore: the Redis URL is empty")
            self._url = redis_url_or_client
        elif isinstance(redis_url_or_client, (aioredis.Redis, aioredis.RedisCluster)):
            self._client = redis_url_or_client  # type: ignore[assignment]
        elif callable(redis_url_or_client):
            self._factory = redis_url_or_client
        else:
            raise ConfigError(
                "RedisHistoryStore: expected a redis:// URL (or redis+cluster://), a redis.asyncio.Redis "
                "(or RedisCluster) client or a client factory, "
                f"got {type(redis_url_or_client).__name__}"
            )
        self._per_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, aioredis.Redis] = (
            weakref.WeakKeyDictionary()
        )

    def __repr__(self) -> str:
        return f"RedisHistoryStore(key={self.key!r}, fail_on_error={self.fail_on_error})"

    def _redis(self) -> aioredis.Redis:
        if self._client is not None:
            return self._client
        loop = asyncio.get_running_loop()
        client = self._per_loop.get(loop)
        if client is None:
            # A client refers to its loop, so entries of closed loops would never be
            # collected from the weak dict: drop them (their connections died with the loop).
            for old in [lp for lp in self._per_loop if lp.is_closed()]:
                del self._per_loop[old]
            if self._factory is not None:
                client = self._factory()
                if not (hasattr(client, "lrange") and hasattr(client, "pipeline")):
                    raise TypeError(
                        f"RedisHistoryStore: the client factory returned {type(client).__name__}, "
                        "expected a redis.asyncio client"
                    )
            else:
                assert self._url is not None
                client = async_redis(self._url)
            self._per_loop[loop] = client
        return client

    def _ttl_ms(self) -> int | None:
        return None if self.ttl_seconds is None else max(1, int(self.ttl_seconds * 1000))

    async def load(self) -> list[Message]:
        """All stored messages, oldest first; ``[]`` when the key does not exist.
        Elements that are not well-formed messages are skipped with one warning
        per call naming the key and the 0-based list indexes."""
        return self._decode_list(await self._redis().lrange(self.key, 0, -1))

    def _decode_list(self, raw: list[Any]) -> list[Message]:
        messages: list[Message] = []
        skipped: list[int] = []
        for index, item in enumerate(raw):
            message = _decode_message(item)
            if message is None:
                skipped.append(index)
            else:
                messages.append(message)
        if skipped:
            logger.warning(
                "history list %s: skipped %d malformed element(s) at index %s; loaded %d message(s)",
                self.key,
                len(skipped),
                ", ".join(str(i) for i in skipped),
                len(messages),
            )
        return messages

    async def append(self, message: Message) -> None:
        """``RPUSH`` one message. Raises ``TypeError`` for a non-dict or
        non-JSON-serialisable message (nothing is written) and
        ``redis.RedisError`` for server/connection failures."""
        value = _encode_message(message, where="RedisHistoryStore.append")
        ttl = self._ttl_ms()
        if ttl is None:
            await self._redis().rpush(self.key, value)
            return
        async with self._redis().pipeline(transaction=True) as pipe:
            pipe.rpush(self.key, value)
            pipe.pexpire(self.key, ttl)
            await pipe.execute()

    async def replace(self, messages: list[Message]) -> None:
        """Atomically make the list hold exactly ``messages`` (``DEL`` then
        ``RPUSH`` inside ``MULTI``/``EXEC``; an empty list just deletes the
        key). Every message is encoded first: a bad one raises ``TypeError``
        and the stored history is untouched."""
        items = _check_messages(messages, where="RedisHistoryStore.replace")
        values = [_encode_message(m, where="RedisHistoryStore.replace") for m in items]
        ttl = self._ttl_ms()
        async with self._redis().pipeline(transaction=True) as pipe:
            pipe.delete(self.key)
            if values:
                pipe.rpush(self.key, *values)
                if ttl is not None:
                    pipe.pexpire(self.key, ttl)
            await pipe.execute()

    async def delete(self) -> None:
        """Remove the stored history (``DEL key``)."""
        await self._redis().delete(self.key)

    async def aclose(self) -> None:
        """Close the client this store created for the running event loop.
        A client passed in by the caller is left open (the caller owns it)."""
        if self._client is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        client = self._per_loop.pop(loop, None)
        if client is not None:
            await client.aclose()


__all__ = [
    "DefinedHistoryStore",
    "JsonlHistoryStore",
    "RedisHistoryStore",
    "create_jsonl_history_store",
    "define_history_store",
]
