"""The JSONL trace sink: one JSON object per line, one line per trace event."""

from __future__ import annotations

import base64
import copy
import dataclasses
import inspect
import json
import logging
import os
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .base import SeqCounter

logger = logging.getLogger("lattice_worker.tracing")

TraceEvent = dict[str, Any]
RedactFn = Callable[[TraceEvent], Any]

_UNSAFE_FILENAME_CHARS = re.compile(r"[^A-Za-z0-9._-]")


def session_file_name(session_id: Any) -> str:
    """The file name ``dir`` mode uses for a session: ``<session_id>.jsonl``.

    Characters outside ``[A-Za-z0-9._-]`` become ``_`` and a leading dot gets an
    ``_`` prefix, so a session id can never escape the directory or hide a file.
    A missing session id maps to ``no-session.jsonl``.
    """
    if session_id is None or session_id == "":
        return "no-session.jsonl"
    name = _UNSAFE_FILENAME_CHARS.sub("_", str(session_id))
    if name.startswith("."):
        name = "_" + name
    return name + ".jsonl"


def _json_default(value: Any) -> Any:
    """Best-effort JSON form for values the standard encoder refuses."""
    model_dump = getattr(value, "model_dump", None)
    if callable(model_dump):  # pydantic models (SDK events, TeamMessage ...)
        return model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return repr(value)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


class JsonlContextTracer:
    """Appends trace events to JSON Lines files. Built by :func:`create_jsonl_context_tracer`.

    Each event is written as one line with a single ``write`` to a file opened
    in append mode, under a per-tracer lock, so concurrent emitters in one
    process (tasks or threads) never interleave lines. Lines reach the OS as
    each event is handled; nothing is buffered in the tracer.

    Counters for hosts and tests: ``events_written``, ``events_skipped``
    (``redact`` returned ``None``), ``redact_failures``, ``write_failures``.
    """

    def __init__(
        self,
        *,
        path: Path | None,
        dir: Path | None,
        redact: RedactFn | None,
        fail_on_error: bool,
    ) -> None:
        self.path = path
        self.dir = dir
        self.redact = redact
        self.fail_on_error = fail_on_error
        self.events_written = 0
        self.events_skipped = 0
        self.redact_failures = 0
        self.write_failures = 0
        self._seq = SeqCounter()
        self._lock = threading.Lock()
        self._ready_dirs: set[Path] = set()

    def __repr__(self) -> str:
        target = f"path={str(self.path)!r}" if self.path is not None else f"dir={str(self.dir)!r}"
        return f"JsonlContextTracer({target}, fail_on_error={self.fail_on_error})"

    def file_for(self, event: TraceEvent) -> Path:
        """Where ``event`` is written: ``path``, or ``<dir>/<session_id>.jsonl``."""
        if self.path is not None:
            return self.path
        assert self.dir is not None
        return self.dir / session_file_name(event.get("session_id"))

    async def on_event(self, event: TraceEvent) -> None:
        """Write one event (after ``redact``). ``seq`` is filled from this
        tracer's counter when missing or ``None`` and kept when present.

        Failures (a raising ``redact``, ``redact`` returning something other than
        a dict or ``None``, an I/O error) drop the event. They raise when the
        tracer was built with ``fail_on_error=True``; otherwise the first failure
        of each kind is logged as a warning on ``lattice_worker.tracing`` and
        later ones only counted, so a broken policy cannot flood the log.
        """
        if not isinstance(event, dict):
            self._failed("write", TypeError(f"trace event must be a dict, got {type(event).__name__}"), "?")
            return
        if event.get("seq") is None:
            event = {**event, "seq": self._seq.next()}
        type_ = str(event.get("type", "?"))

        if self.redact is not None:
            try:
                redacted = self.redact(copy.deepcopy(event))
                if inspect.isawaitable(redacted):
                    redacted = await redacted
                if redacted is not None and not isinstance(redacted, dict):
                    raise TypeError(f"redact must return a dict or None, got {type(redacted).__name__}")
            except Exception as exc:
                self._failed("redact", exc, type_)
                return
            if redacted is None:
                self.events_skipped += 1
                return
            event = redacted

        try:
            line = (json.dumps(event, ensure_ascii=False, default=_json_default) + "\n").encode("utf-8")
            self._append(self.file_for(event), line)
        except Exception as exc:
            self._failed("write", exc, type_)
            return
        self.events_written += 1

    def _append(self, target: Path, line: bytes) -> None:
        with self._lock:
            parent = target.parent
            if parent not in self._ready_dirs:
                parent.mkdir(parents=True, exist_ok=True)
                self._ready_dirs.add(parent)
            try:
                fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            except FileNotFoundError:  # the directory was removed since: recreate it once
                parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                _write_all(fd, line)
            finally:
                os.close(fd)

    def _failed(self, kind: str, exc: Exception, type_: str) -> None:
        if kind == "redact":
            self.redact_failures += 1
            first = self.redact_failures == 1
        else:
            self.write_failures += 1
            first = self.write_failures == 1
        if self.fail_on_error:
            raise exc
        if first:
            what = "redact callback failed" if kind == "redact" else "could not write"
            logger.warning(
                "JSONL tracer %s on a %s event; the event was dropped and the run goes on "
                "(further %s failures of this tracer are counted, not logged)",
                what,
                type_,
                kind,
                exc_info=exc,
            )

    async def flush(self) -> None:
        """Nothing to do: every event is handed to the OS as it is written."""

    async def close(self) -> None:
        """Nothing to release: files are not held open between events (the
        tracer keeps accepting events after ``close``)."""


def create_jsonl_context_tracer(
    *,
    path: str | os.PathLike[str] | None = None,
    dir: str | os.PathLike[str] | None = None,
    redact: RedactFn | None = None,
    fail_on_error: bool = False,
) -> JsonlContextTracer:
    """A trace sink writing one JSON object per line.

    Give exactly one of:

    * ``path`` — every event goes to this one file;
    * ``dir`` — one file per trace session, ``<dir>/<session_id>.jsonl``
      (see :func:`session_file_name`).

    Missing directories are created on the first write. ``redact(event)``
    (sync or async) receives a deep copy of each event, ``seq`` filled, and
    returns the event to write (the same copy or a changed one) or ``None`` to
    skip it; it changes only what is written, never what the model sees.
    ``fail_on_error=True`` makes write and redact failures raise (and so fail
    the run); by default they drop the event and are logged once.

    Raises :class:`ConfigError` when both or neither of ``path``/``dir`` are
    given, when either is empty, when ``path`` is an existing directory or
    ``dir`` an existing non-directory, or when ``redact`` is not callable.
    """
    if (path is None) == (dir is None):
        raise ConfigError("create_jsonl_context_tracer: give exactly one of path= or dir=")
    for name, value in (("path", path), ("dir", dir)):
        if value is not None and (not isinstance(value, (str, os.PathLike)) or not os.fspath(value)):
            raise ConfigError(f"create_jsonl_context_tracer: {name} must be a non-empty path")
    if path is not None and Path(path).is_dir():
        raise ConfigError(f"create_jsonl_context_tracer: path {os.fspath(path)!r} is a directory (use dir=)")
    if dir is not None and Path(dir).exists() and not Path(dir).is_dir():
        raise ConfigError(
            f"create_jsonl_context_tracer: dir {os.fspath(dir)!r} exists and is not a directory"
        )
    if redact is not None and not callable(redact):
        raise ConfigError("create_jsonl_context_tracer: redact must be callable or None")
    return JsonlContextTracer(
        path=Path(path) if path is not None else None,
        dir=Path(dir) if dir is not None else None,
        redact=redact,
        fail_on_error=bool(fail_on_error),
    )


__all__ = ["JsonlContextTracer", "create_jsonl_context_tracer", "session_file_name"]
