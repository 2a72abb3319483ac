"""The reaper's lock: one sweep at a time per deployment, and only while its holder lives.

Key ``<prefix>:reaper:lock`` (a string: the holder's token,
``"<worker id>:<random hex>"``, new for every acquisition). A sweep takes it
with ``SET NX PX hold`` (:meth:`ReaperLock.acquire`); the hold is about half a
lease (:func:`lock_hold_seconds`), so a holder killed mid-sweep stops the
deployment's reaper duties for at most that long. While the sweep runs
(``async with lock:``) the lock is renewed every third of the hold
(``lua/reaper_lock_renew.lua``); when the sweep ends it is kept for the rest of
one reaper interval (``lua/reaper_lock_release.lua``), so the deployment sweeps
about once per interval however many workers run. Both scripts act only for
the holder's token.

A renewal that finds another token (or none) means the lock was lost: the
sweep must stop writing (:meth:`ReaperLock.check` raises
:class:`ReaperLockLostError`). The holder also counts the lock lost once the
hold has run out since its last successful renewal by its own clock (a renewal
that could not reach Redis, a stalled event loop), without asking Redis.
"""

from __future__ import annotations

import logging
import time
import uuid
from importlib import resources
from typing import Any

from ..run.renewal import RenewalLoop

logger = logging.getLogger("lattice_worker.runtime.reaper.sweep")

_LUA = resources.files("lattice_worker.runtime.reaper").joinpath("lua")
RENEW_LUA = _LUA.joinpath("reaper_lock_renew.lua").read_text(encoding="utf-8")
"""Source of the holder-only renewal (KEYS/ARGV/returns in its header)."""
RELEASE_LUA = _LUA.joinpath("reaper_lock_release.lua").read_text(encoding="utf-8")
"""Source of the holder-only release (KEYS/ARGV/returns in its header)."""


class ReaperLockLostError(Exception):
    """The sweep no longer holds the reaper lock (it expired or another reaper took it)."""


class NoLock:
    """The guard of a forced sweep (``lattice drain``, tests): no lock, always held."""

    async def __aenter__(self) -> NoLock:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    def check(self) -> None:
        """Never raises."""
        return None


def lock_key(prefix: str) -> str:
    """The reaper lock's key: ``<prefix>:reaper:lock``."""
    return f"{prefix}:reaper:lock"


def lock_hold_seconds(lease_seconds: float) -> float:
    """How long (seconds) the reaper lock is held without a renewal: half of
    ``lease_seconds`` (the claim lease, seconds), at least 10 ms."""
    return max(0.01, float(lease_seconds) / 2.0)


class ReaperLock(RenewalLoop):
    """One acquisition of the reaper lock (see the module doc).

    Args:
        client: a ``redis.asyncio.Redis`` client.
        prefix: the deployment's key prefix.
        holder: who takes it (the worker id: the start of the token).
        hold_s: hold in **seconds** (> 0; ``ValueError`` otherwise): how long
            the lock lives without a renewal; renewed every ``hold_s / 3``.

    Use: ``if await lock.acquire(): async with lock: ...; await lock.release(keep_s)``.
    """

    def __init__(self, client: Any, prefix: str, holder: str, hold_s: float) -> None:
        super().__init__(hold_s, task_name="reaper-lock")
        self.client = client
        self.key = lock_key(prefix)
        self.token = f"{holder}:{uuid.uuid4().hex}"
        self.hold_ms = max(1, int(self.lease_s * 1000))
        self.lost = False
        self._deadline = 0.0  # time.monotonic() past which the lock may have expired
        self._renew = client.register_script(RENEW_LUA)
        self._release = client.register_script(RELEASE_LUA)

    @property
    def held(self) -> bool:
        """Whether this acquisition still holds the lock, as far as the holder
        knows: acquired, no refused renewal, and the hold not run out since
        the last successful renewal."""
        return not self.lost and time.monotonic() < self._deadline

    def check(self) -> None:
        """Raise :class:`ReaperLockLostError` unless :attr:`held`."""
        if not self.held:
            self.lost = True
            raise ReaperLockLostError(f"the reaper lock {self.key} is no longer held by {self.token}")

    async def acquire(self) -> bool:
        """``SET key token NX PX hold``: True when this call took the lock."""
        started = time.monotonic()
        if not await self.client.set(self.key, self.token, nx=True, px=self.hold_ms):
            return False
        self._deadline = started + self.lease_s
        return True

    async def renew_once(self) -> bool:
        """Renew the hold (holder only). Returns False -- the renewals stop --
        once the lock is lost; a Redis failure is logged and retried on the
        next tick (meanwhile :attr:`held` turns False when the hold runs out)."""
        started = time.monotonic()
        try:
            renewed = await self._renew(keys=[self.key], args=[self.token, self.hold_ms])
        except Exception:
            logger.warning("could not renew the reaper lock; retrying", exc_info=True)
            return True
        if not renewed:
            self.lost = True
            logger.warning("the reaper lock expired or was taken over; this sweep stops writing")
            return False
        self.renewals += 1
        if not self.lost:
            self._deadline = started + self.lease_s
        return True

    async def release(self, keep_s: float = 0.0) -> bool:
        """End the hold (holder only): keep the lock ``keep_s`` seconds more
        (``0``: delete it now). Returns False when it was no longer held."""
        keep_ms = max(0, int(keep_s * 1000))
        released = bool(await self._release(keys=[self.key], args=[self.token, keep_ms]))
        self.lost = True  # this acquisition is over either way
        return released


SweepGuard = ReaperLock | NoLock
"""What a sweep's steps call ``check()`` on before each write."""

__all__ = [
    "NoLock",
    "RELEASE_LUA",
    "RENEW_LUA",
    "ReaperLock",
    "ReaperLockLostError",
    "SweepGuard",
    "lock_hold_seconds",
    "lock_key",
]
