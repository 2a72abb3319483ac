"""The run store's Lua scripts (``lua/<name>.lua``, one per operation; each lists
its KEYS, ARGV, return values and errors), their SHA1s and script calls for pipelines."""

from __future__ import annotations

import hashlib
from importlib import resources
from typing import Any

SCRIPT_NAMES = (
    "create",
    "set_status",
    "add_items",
    "complete_item",
    "suspend",
    "clear_items",
    "append_event",
    "append_events",
    "append_events_fenced",
    "finish",
    "cancel",
    "begin_segment",
    "extend_lead_lease",
    "recover_lead",
    "journal_call",
    "write_history",
    "begin_item",
    "write_item",
    "park_item",
    "journal_tool",
    "park_lead",
    "resolve_wait",
    "set_trace_carrier",
    "revoke_item_claim",
    "reserve_budget",
    "renew_budget",
    "spend_budget",
    "park_budget_lead",
    "park_budget_item",
    "raise_budget",
    "default_budget",
)


def _load_scripts() -> dict[str, str]:
    base = resources.files("lattice_client.runstore").joinpath("lua")
    return {name: base.joinpath(f"{name}.lua").read_text(encoding="utf-8") for name in SCRIPT_NAMES}


SCRIPTS: dict[str, str] = _load_scripts()
"""Script sources by name (the dict the store reads at every use: tests swap entries)."""

SHAS: dict[str, str] = {name: hashlib.sha1(src.encode("utf-8")).hexdigest() for name, src in SCRIPTS.items()}
"""SHA1 of each script by name."""


def script_call(name: str, keys: list[str], args: list[Any]) -> tuple[tuple[Any, ...], str]:
    """``(("evalsha", sha, numkeys, *keys, *args), source)`` of script ``name``: a
    command for a caller's own pipeline, and the source to send it with (``EVAL``)
    or to load on NOSCRIPT."""
    return ("evalsha", SHAS[name], len(keys), *keys, *args), SCRIPTS[name]


__all__ = ["SCRIPTS", "SCRIPT_NAMES", "SHAS", "script_call"]
