"""The submit path of :class:`~lattice_client.client.AsyncLatticeClient`: team
resolution through the live workers' registry, the checks of a submit, the run
record and the ``lattice.run_lead`` send.

:class:`SubmitMixin` gives the async client ``live_workers``,
``registered_teams``, ``resolve_team`` and the private steps ``submit`` (async
and blocking) is made of; the client itself gives ``runs``, ``settings`` and
``celery``. The client never imports a team's module: names and references are
resolved through :mod:`lattice_client.registry`.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from .celery_config import RUN_LEAD_TASK, queue_name
from .models import RunResult
from .registry import (
    LiveRegistry,
    WorkerInfo,
    check_submitted_run_id,
    check_team_name,
    check_team_ref,
    read_workers,
)
from .runstore import dumps

# The client's logger (its warnings kept this name when the submit path moved here).
logger = logging.getLogger("lattice_client.client")

# Retries of the run_lead send when the broker connection fails.
_SEND_RETRY = {"max_retries": 2, "interval_start": 0.2, "interval_step": 0.5, "interval_max": 1.0}
# How long resolve_team keeps a live worker's answer (seconds), and for how many teams.
_TEAM_CACHE_SECONDS = 5.0
_TEAM_CACHE_SIZE = 1_000


class SubmitMixin:
    """Team resolution and the submit path of :class:`~lattice_client.client.AsyncLatticeClient`
    (it gives ``runs``, ``settings``, ``celery`` and the ``_teams`` cache)."""

    runs: Any
    settings: Any
    celery: Any
    _teams: dict[str, tuple[str, str | None, float]]

    async def live_workers(self) -> list[WorkerInfo]:
        """The live workers of this key prefix (their heartbeat has not expired),
        with the teams and queues each serves; ``[]`` when none is running.
        See :mod:`lattice_client.registry`."""
        return await read_workers(await self.runs.redis(), self.settings.key_prefix)

    async def registered_teams(self) -> dict[str, str]:
        """``{team reference or name -> team name}`` as the live workers published
        them (``{}`` when no worker of this key prefix is running)."""
        return LiveRegistry(await self.live_workers()).mapping()

    async def resolve_team(self, team: str, *, require_registered: bool = True) -> tuple[str, str | None]:
        """``(team name, team ref or None)`` for a team name or a
        ``"package.module:attribute"`` reference, through the live registry:
        what the running workers published (:mod:`lattice_client.registry`).
        The client never imports a team's module.

        A team is served when a live worker published it and some live worker
        (the same or another) consumes its lead queue, so its runs can start. A live worker's answer is
        reused for a while (5 s), so most submits make no registry round trip.
        A name or reference no live worker serves is refused: its run would
        wait on a queue nobody consumes. With ``require_registered=False`` a
        plain *name* is accepted anyway (for services that submit before their
        workers start, or while they restart), and so is a reference some live
        worker published while none consumes its lead queue: a warning is
        logged (logger ``lattice_client.client``) and the run waits in Redis
        until a worker consumes its lead queue. A reference no live worker
        published is never accepted: only a worker started with it knows its
        team's name (submit by name instead).

        Raises ``ValueError`` (nothing is written) for a malformed name (not
        1-64 characters of ``[A-Za-z0-9_.-]``) or reference, a reference no
        live worker published, or a team no live worker serves (with
        ``require_registered=True``).
        """
        if not isinstance(team, str) or not team.strip():
            raise ValueError("team must be a non-empty team name or a 'package.module:attribute' reference")
        is_ref = ":" in team
        if is_ref:
            check_team_ref(team)
        else:
            check_team_name(team)
        cached = self._cached_team(team)
        if cached is not None:
            return cached
        live = LiveRegistry(await self.live_workers())
        # served means: some live worker consumes the team's lead queue (it starts the runs)
        name = live.resolve(team, self._lead_queue)
        if name is not None:
            # A live worker's answer is kept a little while: no registry round trip before
            # each submit. Other answers are not kept.
            answer = name, team if is_ref else None
            if len(self._teams) >= _TEAM_CACHE_SIZE:
                self._teams.clear()
            self._teams[team] = (*answer, time.monotonic() + _TEAM_CACHE_SECONDS)
            return answer
        published = live.resolve(team)  # a live worker serves it, but none consumes its lead queue
        if require_registered or (is_ref and published is None):
            raise ValueError(_unserved_message(team, self.settings.key_prefix, live, is_ref=is_ref))
        logger.warning(
            "no live worker serves team %r under key prefix %r; the run is queued and waits until a worker "
            "consuming its lead queue starts (lattice worker package.module:attribute)",
            team,
            self.settings.key_prefix,
        )
        return (published or team), (team if is_ref else None)

    def _lead_queue(self, team_name: str) -> str:
        return queue_name(self.settings.key_prefix, team_name, "lead")

    def _cached_team(self, team: str) -> tuple[str, str | None] | None:
        cached = self._teams.get(team)
        if cached is not None and cached[2] > time.monotonic():
            return cached[0], cached[1]
        return None

    async def _create_run(
        self,
        team: str,
        prompt: str,
        *,
        run_id: str | None,
        metadata: dict[str, Any] | None,
        require_registered: bool,
        budget_tokens: int | None = None,
    ) -> tuple[str, str]:
        # submit's checks and the run record: (run id, the lead queue to send run_lead to)
        run_id = self._check_submit(prompt, run_id, metadata)
        name, ref = await self.resolve_team(team, require_registered=require_registered)
        await self.runs.create(
            run_id, name, prompt, team_ref=ref, metadata=metadata, budget_tokens=budget_tokens
        )
        return run_id, queue_name(self.settings.key_prefix, name, "lead")

    def _check_submit(self, prompt: str, run_id: str | None, metadata: dict[str, Any] | None) -> str:
        # submit's checks of its input (ValueError); returns the run id to use
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError("prompt must be a non-empty string")
        bound = self.settings.max_message_bytes
        try:
            size = len(prompt.encode("utf-8"))
        except UnicodeEncodeError as exc:  # a lone surrogate: no UTF-8 text can hold it
            raise ValueError(f"prompt is not valid Unicode text: {exc.reason} at index {exc.start}") from None
        if size > bound:
            raise ValueError(
                f"prompt is {size} bytes, over the bound of {bound} bytes (LATTICE_MAX_MESSAGE_BYTES)"
            )
        if metadata is not None:
            if not isinstance(metadata, dict):
                raise ValueError(f"metadata must be a dict, got {type(metadata).__name__}")
            try:
                encoded = len(dumps(metadata, "metadata").encode("utf-8"))
            except UnicodeEncodeError as exc:
                raise ValueError(f"metadata is not valid Unicode text: {exc.reason}") from None
            if encoded > bound:
                raise ValueError(
                    f"metadata is {encoded} bytes as JSON, over the bound of {bound} bytes (LATTICE_MAX_MESSAGE_BYTES)"
                )
        return check_submitted_run_id(run_id) if run_id is not None else f"run_{uuid.uuid4().hex}"

    async def _send_failed(self, run_id: str, queue: str, exc: Exception) -> None:
        # the run_lead task could not be sent: the run fails with the error
        error = f"could not enqueue {RUN_LEAD_TASK} on {queue}: {exc}"
        try:
            await self.runs.finish(run_id, RunResult(run_id=run_id, status="failed", error=error))
        except Exception:  # the run store may be down too; the original error matters more
            pass

    def _send_run_lead(self, run_id: str, queue: str) -> None:
        # Blocking (a thread of its own or the blocking client's caller). The task
        # message (LPUSH) and its task-sent event (PUBLISH) go in one pipeline
        # through a kombu publish batch (kombu >= 5.7) instead of two round trips.
        # A batch is sent once, without kombu's retries: when it fails the message
        # is sent again the plain way, retried as _SEND_RETRY says. (Should the
        # failed batch have been delivered after all, run_lead is there twice:
        # only one of them starts the queued run, the other finds it started.)
        celery = self.celery
        options: dict[str, Any] = {
            "args": [run_id],
            "queue": queue,
            "task_id": f"{run_id}.run_lead",
            "retry": True,
            "retry_policy": _SEND_RETRY,
        }
        try:
            with celery.producer_or_acquire() as producer:
                batch = getattr(producer, "batch", None)
                if batch is not None:
                    with batch():
                        celery.send_task(RUN_LEAD_TASK, producer=producer, **options)
                    return
        except Exception:
            logger.warning(
                "run %s: batched send of %s failed; sending again", run_id, RUN_LEAD_TASK, exc_info=True
            )
        celery.send_task(RUN_LEAD_TASK, **options)


def _unserved_message(team: str, prefix: str, live: LiveRegistry, *, is_ref: bool) -> str:
    published = live.resolve(team)
    if published is not None:  # served, but no live worker consumes its lead queue
        lead = queue_name(prefix, published, "lead")
        return (
            f"no live worker starts team {published!r}'s runs under key prefix {prefix!r}: live workers serve "
            f"its members, but none consumes its lead queue {lead!r}. Start one (lattice worker "
            f"package.module:attribute --member lead, or without --member), or submit with "
            "require_registered=False (CLI: --allow-unregistered) to queue the run until one starts."
        )
    names = live.team_names()
    served = ", ".join(names[:20]) + (", ..." if len(names) > 20 else "") if names else "none"
    workers = (
        f"{len(live.workers)} live worker(s) serving: {served}" if live.workers else "there is no live worker"
    )
    if is_ref:
        return (
            f"unknown team reference {team!r}: no live worker under key prefix {prefix!r} was started with it "
            f"({workers}). The client never imports a team's module: start a worker for it first "
            f"(lattice worker {team}), or submit by the team's name with require_registered=False "
            "(CLI: --allow-unregistered) to queue the run for workers that start later."
        )
    hint = f" A reference needs ':attribute', e.g. '{team}:team'." if "." in team else ""
    return (
        f"no live worker serves team {team!r} under key prefix {prefix!r} ({workers}).{hint} "
        "Check the name, start a worker for the team (lattice worker package.module:attribute), "
        "or submit with require_registered=False (CLI: --allow-unregistered) to queue it for workers "
        "that start later."
    )


__all__ = ["SubmitMixin"]
