"""Fan one stream of trace events out to several sinks."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Iterable
from typing import Any

from ..errors import ConfigError
from .base import ContextTracer, SeqCounter, trace_carrier

logger = logging.getLogger("lattice_worker.tracing")


async def _maybe_await(value: Any) -> Any:
    if inspect.isawaitable(value):
        return await value
    return value


class CompositeContextTracer:
    """Forwards every event, and ``flush``/``close``, to each child tracer in order.

    Built by :func:`create_composite_context_tracer`. ``tracers`` is the tuple of
    children. ``fail_on_error`` is true when any child has it, so that a failure
    the composite raises also fails the run (see :class:`~.base.TraceEmitter`).
    """

    def __init__(self, tracers: tuple[ContextTracer, ...]) -> None:
        self.tracers = tracers
        self.fail_on_error = any(bool(getattr(t, "fail_on_error", False)) for t in tracers)
        self._seq = SeqCounter()
        self._logged: set[tuple[int, str]] = set()

    def __repr__(self) -> str:
        return f"CompositeContextTracer({list(self.tracers)!r})"

    async def on_event(self, event: dict[str, Any]) -> None:
        """Number ``event`` once (``seq`` from this composite's counter when
        missing or ``None``), then hand each child its own shallow copy of the
        envelope, in order. A child that raises does not stop the others; once
        every child got the event, the first failure of a child built with
        ``fail_on_error=True`` is raised. Failures of other children are logged
        (first one per child) and swallowed."""
        if event.get("seq") is None:
            event = {**event, "seq": self._seq.next()}
        await self._fan_out("on_event", (event,))

    def trace_carrier(self, run_id: str) -> dict[str, str]:
        """The propagation headers of run ``run_id`` from every child that gives
        them (see :func:`~.base.trace_carrier`), merged in child order; the
        built-in tracers use distinct header names, so nothing is overwritten."""
        merged: dict[str, str] = {}
        for tracer in self.tracers:
            merged.update(trace_carrier(tracer, run_id))
        return merged

    async def flush(self) -> None:
        """Call ``flush()`` on every child that has one; errors as in :meth:`on_event`."""
        await self._fan_out("flush", ())

    async def close(self) -> None:
        """Call ``close()`` on every child that has one; errors as in :meth:`on_event`."""
        await self._fan_out("close", ())

    async def _fan_out(self, method: str, args: tuple[Any, ...]) -> None:
        to_raise: BaseException | None = None
        for index, tracer in enumerate(self.tracers):
            fn = getattr(tracer, method, None)
            if fn is None:
                continue
            call_args = (dict(args[0]),) if args else ()
            try:
                await _maybe_await(fn(*call_args))
            except Exception as exc:
                if getattr(tracer, "fail_on_error", False):
                    if to_raise is None:
                        to_raise = exc
                    continue
                if (index, method) not in self._logged:
                    self._logged.add((index, method))
                    logger.warning(
                        "composite tracer: child %d (%r) failed in %s; the other children still ran "
                        "(further failures of this child are not logged)",
                        index,
                        tracer,
                        method,
                        exc_info=exc,
                    )
        if to_raise is not None:
            raise to_raise


def create_composite_context_tracer(
    tracers: Iterable[ContextTracer | None],
) -> CompositeContextTracer:
    """One tracer that forwards to every tracer in ``tracers``, in order.

    ``None`` entries are skipped (handy for optional sinks). Raises
    :class:`ConfigError` when ``tracers`` is not an iterable (a single tracer
    passed bare, say) or when an entry has no callable ``on_event``.
    """
    if isinstance(tracers, (str, bytes, dict)) or not isinstance(tracers, Iterable):
        raise ConfigError(
            f"create_composite_context_tracer: expected a list of tracers, got {type(tracers).__name__}"
        )
    children: list[ContextTracer] = []
    for index, tracer in enumerate(tracers):
        if tracer is None:
            continue
        if not callable(getattr(tracer, "on_event", None)):
            raise ConfigError(
                f"create_composite_context_tracer: entry {index} ({type(tracer).__name__}) has no callable on_event"
            )
        for optional in ("flush", "close"):
            fn = getattr(tracer, optional, None)
            if fn is not None and not callable(fn):
                raise ConfigError(
                    f"create_composite_context_tracer: entry {index} has a {optional} attribute that is not callable"
                )
        children.append(tracer)
    return CompositeContextTracer(tuple(children))


__all__ = ["CompositeContextTracer", "create_composite_context_tracer"]
