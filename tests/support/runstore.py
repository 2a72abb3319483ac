"""Helpers for tests of the run store's Lua scripts."""

from __future__ import annotations

from typing import Any

from lattice_client.runstore import RunStore


async def run_call(store: RunStore, call: tuple[tuple[Any, ...], str], run_id: str = "r1") -> Any:
    """Run a ``(command, source)`` script call of ``store`` (``EVAL`` of its
    source); an error reply is raised as the store maps it for ``run_id``."""
    (_, _, numkeys, *rest), source = call
    client = await store.redis()
    try:
        return await client.eval(source, numkeys, *rest)
    except Exception as exc:
        raise store.script_error(exc, run_id, "test") from None
