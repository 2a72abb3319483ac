"""Helpers that put another party's move in the gap of a read-then-write race."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any


def stale_get(
    mailbox: Any, message_id: str, meanwhile: Callable[[], Awaitable[Any]]
) -> tuple[Any, list[Any]]:
    """``(get, done)``: a ``mailbox.get`` (patch it in) that, the first time it
    reads ``message_id``, runs ``meanwhile()`` after the read and returns what it
    read before -- so the caller acts on a stale message. ``done`` gets what
    ``meanwhile()`` returned."""
    real_get = mailbox.get
    done: list[Any] = []

    async def get(mid: str) -> Any:
        seen = await real_get(mid)
        if mid == message_id and not done:
            done.append(await meanwhile())
        return seen

    return get, done
