"""Cancellation signals, the Python counterpart of the web ``AbortController``.

``AbortController().signal`` is aborted by ``controller.abort(reason)``;
``AbortSignal.timeout(seconds)`` aborts itself after ``seconds`` (a float, in
seconds -- not milliseconds). A signal can be awaited (``await signal.wait()``),
polled (``signal.aborted``) or observed with ``add_listener``. Signals are safe
to abort from another thread: listeners and waiters are woken on the event loop
that is waiting.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any


class AbortSignal:
    """A one-shot cancellation flag. Create it with :class:`AbortController` or
    :meth:`AbortSignal.timeout`; do not abort it directly."""

    def __init__(self) -> None:
        self._aborted = False
        self._reason: Any = None
        self._lock = threading.Lock()
        self._listeners: list[Callable[[Any], None]] = []
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    @property
    def aborted(self) -> bool:
        """True once the signal has been aborted."""
        return self._aborted

    @property
    def reason(self) -> Any:
        """What ``abort()`` was given (``None`` when nothing was)."""
        return self._reason

    def add_listener(self, callback: Callable[[Any], None]) -> Callable[[], None]:
        """Call ``callback(reason)`` on abort (at once if already aborted).
        Returns a function that removes the listener."""
        with self._lock:
            if not self._aborted:
                self._listeners.append(callback)

                def remove() -> None:
                    with self._lock:
                        if callback in self._listeners:
                            self._listeners.remove(callback)

                return remove
        callback(self._reason)
        return lambda: None

    async def wait(self) -> Any:
        """Wait until the signal is aborted; returns the reason."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._aborted:
                return self._reason
            fut: asyncio.Future[None] = loop.create_future()
            self._waiters.append((loop, fut))
        try:
            await fut
        finally:
            with self._lock:
                self._waiters = [(lp, f) for lp, f in self._waiters if f is not fut]
        return self._reason

    def throw_if_aborted(self) -> None:
        """Raise :class:`~lattice_worker.errors.AbortError` if aborted."""
        if self._aborted:
            from ..errors import AbortError

            raise AbortError(str(self._reason) if self._reason is not None else "aborted")

    def _abort(self, reason: Any = None) -> None:
        with self._lock:
            if self._aborted:
                return
            self._aborted = True
            self._reason = reason if reason is not None else "aborted"
            listeners, self._listeners = self._listeners, []
            waiters, self._waiters = self._waiters, []
        for lp, fut in waiters:

            def _set(f: asyncio.Future[None] = fut) -> None:
                if not f.done():
                    f.set_result(None)

            try:
                lp.call_soon_threadsafe(_set)
            except RuntimeError:  # loop closed
                pass
        for cb in listeners:
            cb(self._reason)

    @classmethod
    def timeout(cls, seconds: float) -> AbortSignal:
        """A signal that aborts itself after ``seconds`` (float seconds) with a
        ``TimeoutError`` reason. Uses a daemon timer thread, so it works with or
        without a running event loop.

        Raises ``ValueError`` unless ``seconds`` is a finite number between 0 and
        ``threading.TIMEOUT_MAX`` (a bool, NaN or infinity included)."""
        if (
            not isinstance(seconds, int | float)
            or isinstance(seconds, bool)
            or not 0 <= seconds <= threading.TIMEOUT_MAX  # False for NaN; infinity is above it
        ):
            raise ValueError(
                "AbortSignal.timeout: seconds must be a finite, non-negative number of seconds "
                f"(at most threading.TIMEOUT_MAX), got {seconds!r}"
            )
        sig = cls()
        timer = threading.Timer(
            seconds, sig._abort, args=(TimeoutError(f"signal timed out after {seconds}s"),)
        )
        timer.daemon = True
        timer.start()
        return sig

    @classmethod
    def abort(cls, reason: Any = None) -> AbortSignal:
        """An already-aborted signal."""
        sig = cls()
        sig._abort(reason)
        return sig


class AbortController:
    """Owns an :class:`AbortSignal`; ``abort(reason)`` aborts it once."""

    def __init__(self) -> None:
        self.signal = AbortSignal()

    def abort(self, reason: Any = None) -> None:
        """Abort the signal. Later calls do nothing."""
        self.signal._abort(reason)


__all__ = ["AbortController", "AbortSignal"]
