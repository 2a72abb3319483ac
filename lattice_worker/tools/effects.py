"""Tool effects: what a tool does to the outside world, and so what is safe
after a crash (``docs/tool-effects.md``).

Every tool declares one ``effect``:

``"read_only"``
    changes nothing anywhere (a lookup, a search); safe to run again.
``"idempotent"``
    the provider drops a repeated request carrying the same key for
    ``dedup_window_s`` **seconds**; the handler sends ``ToolContext.effect_key``
    as that key. After a crash the call is sent again with the same key while
    inside the window, and parks after it. ``math.inf`` means the call is
    idempotent over its own input (resending it has no further effect at any
    time), as writing a whole file is.
``"reconcilable"``
    a :class:`Reconcile` lookup answers "did the call with this key happen?"
    (:class:`LookupFound` / :class:`LookupNotFound` / :class:`LookupUnknown`).
``"unguarded"`` (the default)
    anything else (sending an email): after a crash the work parks and a
    person decides.

The same declaration sets who must approve a call under
``permission_mode="by_effect"``: ``read_only`` calls run, every other call
waits for an approval.

Built-in workspace tools and MCP tools get theirs from
:func:`builtin_tool_effect` and :func:`effect_from_mcp_annotations`.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ..errors import ConfigError

Effect = Literal["read_only", "idempotent", "reconcilable", "unguarded"]
EFFECTS: tuple[str, ...] = ("read_only", "idempotent", "reconcilable", "unguarded")
Finality = Literal["final", "nonfinal"]

#: ``dedup_window_s`` of a tool that is idempotent over its own input.
IDEMPOTENT_FOREVER = math.inf


# --------------------------------------------------------------------------- lookups


@dataclass(frozen=True, slots=True)
class LookupFound:
    """The call with this effect key happened; ``value`` is its result (what
    the handler would have returned: a str, content blocks, a ToolResult...)."""

    value: Any
    status: Literal["found"] = "found"


@dataclass(frozen=True, slots=True)
class LookupNotFound:
    """The provider has no record of the call. With ``finality="final"`` this
    proves it never happened; with ``"nonfinal"`` it means "not known yet"."""

    status: Literal["not_found"] = "not_found"


@dataclass(frozen=True, slots=True)
class LookupUnknown:
    """The lookup cannot tell; ``reason`` says why (shown to the person who decides)."""

    reason: str = "the lookup could not tell"
    status: Literal["unknown"] = "unknown"


LookupResult = LookupFound | LookupNotFound | LookupUnknown


@dataclass(frozen=True, slots=True)
class Reconcile:
    """How to ask the provider whether a ``reconcilable`` call happened.

    ``lookup(effect_key)`` (sync or async) returns a :class:`LookupFound`,
    :class:`LookupNotFound` or :class:`LookupUnknown` -- or the plain dicts
    ``{"status": "found", "value": ...}``, ``{"status": "not_found"}``,
    ``{"status": "unknown", "reason": ...}``. ``finality``: ``"final"`` when a
    not-found answer proves the call never happened (it may then run again),
    ``"nonfinal"`` when it only means "not known yet" (the work parks).

    Raises :class:`ConfigError` when ``lookup`` is not callable or ``finality``
    is neither value.
    """

    lookup: Callable[[str], Any]
    finality: Finality = "final"

    def __post_init__(self) -> None:
        if not callable(self.lookup):
            raise ConfigError(
                f"Reconcile: lookup must be a callable(effect_key), got {type(self.lookup).__name__}"
            )
        if self.finality not in ("final", "nonfinal"):
            raise ConfigError(f'Reconcile: finality must be "final" or "nonfinal", got {self.finality!r}')

    async def ask(self, effect_key: str) -> LookupResult:
        """Run the lookup and normalise its answer. Never raises: an exception,
        a timeout inside the lookup or an answer of another shape becomes a
        :class:`LookupUnknown` naming what went wrong."""
        try:
            answer = self.lookup(effect_key)
            if inspect.isawaitable(answer):
                answer = await answer
        except Exception as exc:
            return LookupUnknown(f"the lookup raised {type(exc).__name__}: {exc}")
        return coerce_lookup_result(answer)


def coerce_lookup_result(answer: Any) -> LookupResult:
    """A lookup's answer as a :class:`LookupFound` / :class:`LookupNotFound` /
    :class:`LookupUnknown`; a dict with ``status`` is accepted, anything else
    becomes a :class:`LookupUnknown` naming it."""
    if isinstance(answer, LookupFound | LookupNotFound | LookupUnknown):
        return answer
    if isinstance(answer, Mapping):
        status = answer.get("status")
        if status == "found" and "value" in answer:
            return LookupFound(answer["value"])
        if status == "not_found":
            return LookupNotFound()
        if status == "unknown":
            return LookupUnknown(str(answer.get("reason") or "the lookup could not tell"))
    return LookupUnknown(
        f"the lookup returned {answer!r:.120}, not LookupFound(value), LookupNotFound() or LookupUnknown(reason)"
    )


# --------------------------------------------------------------------------- setup checks


@dataclass(frozen=True, slots=True)
class EffectOptions:
    """The checked effect-related options of one tool (see :func:`check_effect_options`)."""

    effect: Effect = "unguarded"
    dedup_window_s: float | None = None
    reconcile: Reconcile | None = None
    ends_turn: bool = False
    concurrent: bool = False
    defer: bool = False


def _flag(where: str, name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: {name} must be True or False, got {value!r}")
    return value


def check_effect_options(
    where: str,
    *,
    effect: Any = "unguarded",
    dedup_window_s: Any = None,
    reconcile: Any = None,
    ends_turn: Any = False,
    concurrent: Any = False,
    defer: Any = False,
    runs: Any = "host",
    is_concurrency_safe: Any = None,
) -> EffectOptions:
    """Check a tool's effect options together and return them.

    Raises :class:`ConfigError` (prefixed ``where``) for: an unknown ``effect``;
    ``dedup_window_s`` without ``effect="idempotent"`` or the reverse, or a
    window that is not a positive number of seconds; ``reconcile`` without
    ``effect="reconcilable"`` or the reverse, or a ``reconcile`` that is not a
    :class:`Reconcile`; ``concurrent`` on a tool that is not ``read_only`` or
    that ends the turn, or together with ``is_concurrency_safe``; ``defer``
    together with ``ends_turn``; ``runs="sandbox"`` (not supported yet) or any
    other value than ``"host"``; a flag that is not a bool.
    """
    if effect not in EFFECTS:
        raise ConfigError(f"{where}: effect must be one of {', '.join(EFFECTS)}; got {effect!r}")
    ends_turn = _flag(where, "ends_turn", ends_turn)
    concurrent = _flag(where, "concurrent", concurrent)
    defer = _flag(where, "defer", defer)
    if runs == "sandbox":
        raise ConfigError(
            f'{where}: runs="sandbox" is not supported yet; tools run in this process (runs="host")'
        )
    if runs != "host":
        raise ConfigError(f'{where}: runs must be "host", got {runs!r}')
    if dedup_window_s is not None:
        if effect != "idempotent":
            raise ConfigError(
                f'{where}: dedup_window_s is only for effect="idempotent" (this tool is {effect!r}): '
                "it says how long the provider drops a repeated effect key"
            )
        if isinstance(dedup_window_s, bool) or not isinstance(dedup_window_s, int | float):
            raise ConfigError(f"{where}: dedup_window_s must be a number of seconds, got {dedup_window_s!r}")
        if not dedup_window_s > 0:  # also refuses NaN
            raise ConfigError(f"{where}: dedup_window_s must be positive (seconds), got {dedup_window_s!r}")
    elif effect == "idempotent":
        raise ConfigError(
            f'{where}: effect="idempotent" needs dedup_window_s: how many seconds the provider drops a '
            "repeated ToolContext.effect_key (math.inf when the call is idempotent over its own input)"
        )
    if reconcile is not None:
        if effect != "reconcilable":
            raise ConfigError(
                f'{where}: reconcile is only for effect="reconcilable" (this tool is {effect!r})'
            )
        if not isinstance(reconcile, Reconcile):
            raise ConfigError(
                f"{where}: reconcile must be Reconcile(lookup, finality=...), got {type(reconcile).__name__}"
            )
    elif effect == "reconcilable":
        raise ConfigError(
            f'{where}: effect="reconcilable" needs reconcile=Reconcile(lookup, finality="final" | "nonfinal")'
        )
    if concurrent:
        if effect != "read_only":
            raise ConfigError(
                f'{where}: concurrent=True needs effect="read_only" (this tool is {effect!r}); '
                "a tool with effects always runs alone"
            )
        if ends_turn:
            raise ConfigError(f"{where}: concurrent=True cannot be combined with ends_turn=True")
        if is_concurrency_safe is not None:
            raise ConfigError(
                f"{where}: give concurrent=True or is_concurrency_safe, not both "
                "(concurrent=True already makes every call of the tool overlap)"
            )
    if defer and ends_turn:
        raise ConfigError(f"{where}: defer=True cannot be combined with ends_turn=True")
    window = float(dedup_window_s) if dedup_window_s is not None else None
    return EffectOptions(effect, window, reconcile, ends_turn, concurrent, defer)


# --------------------------------------------------------------------------- built-in and MCP tools

#: Effects of the built-in workspace tools, by tool name.
BUILTIN_TOOL_EFFECTS: dict[str, tuple[Effect, float | None]] = {
    "Read": ("read_only", None),
    "LS": ("read_only", None),
    "Glob": ("read_only", None),
    "Grep": ("read_only", None),
    "Write": ("idempotent", IDEMPOTENT_FOREVER),  # writing the same content again changes nothing
    # not idempotent: a re-run edits the edited text again ("a" -> "ab" makes "abb");
    # an Edit interrupted mid-call parks for a person to decide
    "Edit": ("unguarded", None),
    "Bash": ("unguarded", None),
}


def builtin_tool_effect(name: str) -> tuple[Effect, float | None]:
    """``(effect, dedup_window_s)`` of a built-in workspace tool; ``("unguarded",
    None)`` for a name that is not one."""
    return BUILTIN_TOOL_EFFECTS.get(name, ("unguarded", None))


def effect_from_mcp_annotations(annotations: Any) -> tuple[Effect, float | None]:
    """``(effect, dedup_window_s)`` for an MCP tool from its server's annotations.

    ``annotations``: the tool's ``annotations`` (an ``mcp.types.ToolAnnotations``,
    a dict with the wire names, or ``None``; anything else counts as none). ``readOnlyHint: true`` ->
    ``read_only``; else ``idempotentHint: true`` -> ``idempotent`` over its
    input (window :data:`IDEMPOTENT_FOREVER`: MCP has no idempotency keys, the
    hint says a repeated call with the same arguments has no further effect);
    anything else, missing annotations included -> ``unguarded``.
    """
    if annotations is None:
        return ("unguarded", None)
    dump = getattr(annotations, "model_dump", None)
    if callable(dump):  # a pydantic model of the mcp SDK: read it by its wire names
        annotations = dump(by_alias=True, exclude_none=True)
    if not isinstance(annotations, Mapping):
        return ("unguarded", None)
    read_only = annotations.get("readOnlyHint")
    idempotent = annotations.get("idempotentHint")
    if read_only is True:
        return ("read_only", None)
    if idempotent is True:
        return ("idempotent", IDEMPOTENT_FOREVER)
    return ("unguarded", None)


# --------------------------------------------------------------------------- effect keys


def effect_key(scope: str, tool_use_id: str) -> str:
    """The idempotency key of one tool call: ``"<scope>:<tool_use_id>"``.

    ``scope`` names the conversation the call belongs to and never changes
    when the work is retried (the distributed runtime gives its work item or
    run; in one process it is the agent's session id); the ``tool_use_id`` is
    the model's id for the call, fixed once the assistant turn is recorded.
    So the key is the same for every attempt of one call and differs between
    calls."""
    return f"{scope}:{tool_use_id}"


__all__ = [
    "BUILTIN_TOOL_EFFECTS",
    "EFFECTS",
    "IDEMPOTENT_FOREVER",
    "Effect",
    "EffectOptions",
    "Finality",
    "LookupFound",
    "LookupNotFound",
    "LookupResult",
    "LookupUnknown",
    "Reconcile",
    "builtin_tool_effect",
    "check_effect_options",
    "coerce_lookup_result",
    "effect_from_mcp_annotations",
    "effect_key",
]
