"""The operations page's pages (``GET``): runs, a run, mailboxes, a mailbox,
the calls waiting for a person, workers and queues, the action log; and a
run's live events (server-sent events).

Every page is HTML rendered on the server by Jinja2 with autoescaping: run
prompts, message contents, tool inputs and worker names are shown as text,
never as markup. The one script (``static/ui.js``) follows a run's events and
refreshes list pages; the page works without it (reload).
"""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from lattice_mailbox import MessageStatus

from ..models import RunStatus
from ..runstore import check_run_id
from .data import list_runs, mailboxes, run_page, waiting_calls, workers_and_queues
from .state import UiState, render
from .timeline import event_row

_MESSAGE_STATUSES = ["all", *(s.value for s in MessageStatus)]

SSE_BLOCK_MS = 4_000
"""How long one read of a run's live events blocks (ms; below redis-py's socket timeout)."""


def _query(request: Request, name: str) -> str:
    return (request.query_params.get(name) or "").strip()


def _limit(request: Request, default: int = 50) -> int:
    try:
        return max(1, min(500, int(_query(request, "limit") or default)))
    except ValueError:
        return default


async def not_found(request: Request, what: str, code: int = 404) -> Response:
    title = "not found" if code == 404 else "bad request"
    return await render(request, "error.html", {"title": title, "message": what}, status_code=code)


async def runs_page(request: Request) -> Response:
    """``/`` and ``/runs?team=&status=&limit=``: the most recent runs."""
    ui: UiState = request.app.state.ui
    team, status = _query(request, "team"), _query(request, "status")
    statuses = [s.value for s in RunStatus]
    if status and status not in statuses:
        return await not_found(request, f"no run status {status!r}; one of: {', '.join(statuses)}", 400)
    runs = await list_runs(ui.client, team or None, status or None, _limit(request))
    return await render(
        request,
        "runs.html",
        {
            "title": "runs",
            "runs": runs,
            "team": team,
            "status": status,
            "teams": await ui.client.known_teams(),
            "statuses": statuses,
            "refresh": 5,
        },
    )


async def run_detail(request: Request) -> Response:
    """``/runs/{run_id}``: a run's summary, segments, member steps, waits and events."""
    ui: UiState = request.app.state.ui
    run_id = request.path_params["run_id"]
    try:
        check_run_id(run_id)
    except ValueError as exc:
        return await not_found(request, str(exc))
    page = await run_page(ui.client, run_id)
    if page is None:
        return await not_found(
            request, f"no run {run_id!r} under key prefix {ui.client.settings.key_prefix!r}"
        )
    return await render(request, "run.html", {"title": f"run {run_id}", "page": page, "run_id": run_id})


async def run_events(request: Request) -> Response:
    """``/runs/{run_id}/events?after=ID``: the run's events after stream id
    ``ID`` (or ``Last-Event-ID``) as server-sent events, one JSON
    :class:`~lattice_client.ui.timeline.EventRow` each; ends after the
    ``run_result`` event (an ``end`` event follows). ``404`` for an unknown run,
    ``400`` for an ``after`` / ``Last-Event-ID`` that is not a stream id."""
    ui: UiState = request.app.state.ui
    run_id = request.path_params["run_id"]
    try:
        check_run_id(run_id)
    except ValueError as exc:
        return Response(str(exc), status_code=404)
    if await ui.client.get_run(run_id) is None:  # an unknown run's stream would never end
        return Response(f"no run {run_id!r}\n", status_code=404, media_type="text/plain")
    after = request.headers.get("last-event-id") or _query(request, "after") or "0-0"
    if not all(part.isdigit() for part in after.split("-", 1)):
        return Response(
            f"bad event id {after!r}: give a stream id like 1700000000000-0 (or 0-0 for all events)\n",
            status_code=400,
            media_type="text/plain",
        )
    runs = ui.client.runs

    async def stream() -> Any:
        last = after
        yield "retry: 2000\n\n"
        while not await request.is_disconnected():
            batch = await runs.events(run_id, last, block_ms=SSE_BLOCK_MS, count=100)
            if not batch:
                yield ": quiet\n\n"
                continue
            for entry_id, event in batch:
                last = entry_id
                row = event_row(entry_id, event)
                yield f"id: {entry_id}\ndata: {json.dumps(row.to_json(), ensure_ascii=False)}\n\n"
                if row.final:
                    yield "event: end\ndata: {}\n\n"
                    return

    return StreamingResponse(stream(), media_type="text/event-stream", headers={"Cache-Control": "no-store"})


async def mailboxes_page(request: Request) -> Response:
    """``/mailboxes?team=``: every mailbox's counts by status and oldest pending message."""
    ui: UiState = request.app.state.ui
    team = _query(request, "team")
    rows = await mailboxes(ui.client, team or None)
    return await render(
        request,
        "mailboxes.html",
        {
            "title": "mailboxes",
            "rows": rows,
            "team": team,
            "teams": await ui.client.known_teams(),
            "statuses": [s.value for s in MessageStatus],
            "refresh": 5,
        },
    )


async def mailbox_page(request: Request) -> Response:
    """``/mailbox?id=TEAM::MEMBER&status=``: one mailbox's messages, oldest first, and drain."""
    ui: UiState = request.app.state.ui
    mailbox_id = _query(request, "id")
    status = _query(request, "status") or "all"
    if status not in _MESSAGE_STATUSES:
        return await not_found(
            request, f"no message status {status!r}; one of: {', '.join(_MESSAGE_STATUSES)}", 400
        )
    if mailbox_id not in await ui.client.known_mailboxes():
        return await not_found(
            request,
            f"no mailbox {mailbox_id!r}: no message was ever sent to it and no live worker "
            "serves a team with that member",
        )
    messages = await ui.client.inbox(mailbox_id, status)
    counts = await ui.client.mailbox.counts(mailbox_id)
    return await render(
        request,
        "mailbox.html",
        {
            "title": f"mailbox {mailbox_id}",
            "mailbox_id": mailbox_id,
            "messages": messages,
            "counts": counts,
            "status": status,
            "statuses": _MESSAGE_STATUSES,
            "drain": ui.drain.for_mailbox(mailbox_id),
            "drain_reason": ui.drain.why_not(mailbox_id),
        },
    )


async def calls_page(request: Request) -> Response:
    """``/calls?team=``: the parked calls and pending approvals, with their
    decisions, and the work parked at its run's token budget."""
    ui: UiState = request.app.state.ui
    team = _query(request, "team")
    try:  # a team's reference no live worker published is a bad request, not a server error
        parked, approvals = await waiting_calls(ui.client, team or None)
        budget_waits = await ui.client.budget_waits(team or None)
    except ValueError as exc:
        return await not_found(request, str(exc), 400)
    return await render(
        request,
        "calls.html",
        {
            "title": "parked calls and approvals",
            "parked": parked,
            "approvals": approvals,
            "budget_waits": budget_waits,
            "team": team,
            "teams": await ui.client.known_teams(),
            "refresh": 5,
        },
    )


async def workers_page(request: Request) -> Response:
    """``/workers``: the live workers, every queue (those no live worker
    consumes in red) and the model calls waiting for their turn under the
    shared rate limits."""
    ui: UiState = request.app.state.ui
    workers, queues = await workers_and_queues(ui.client)
    rate_limited = await ui.client.rate_limited()
    return await render(
        request,
        "workers.html",
        {
            "title": "workers and queues",
            "workers": workers,
            "queues": queues,
            "rate_limited": rate_limited,
            "refresh": 5,
        },
    )


async def actions_page(request: Request) -> Response:
    """``/actions``: the actions taken on this page since it started (newest first)."""
    ui: UiState = request.app.state.ui
    return await render(request, "actions.html", {"title": "actions", "actions": list(reversed(ui.actions))})


__all__ = [
    "actions_page",
    "calls_page",
    "mailbox_page",
    "mailboxes_page",
    "run_detail",
    "run_events",
    "runs_page",
    "workers_page",
]
