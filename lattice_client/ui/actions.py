"""The operations page's actions (``POST``): cancel a run, resolve a parked
call (result, error or re-run), approve or deny a call, drain a member.

Each is two posts of a plain HTML form: the first shows what is about to be
done (the call's tool, input and effect; the run; the mailbox) and asks for a
confirmation; the second (``confirmed=yes``) does it through the client --
the same calls as ``lattice cancel / resolve / approve / deny / drain`` --
logs it with who did it (:meth:`~lattice_client.ui.state.UiState.record`)
and redirects back (303). A post without the right CSRF token gets 403 and
changes nothing; a refused decision (decided already, not waiting) shows the
client's one-line reason with 409.
"""

from __future__ import annotations

from typing import Any

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response

from ..decisions import DecisionError
from ..errors import RunNotFoundError
from ..runstore import check_run_id
from .auth import CSRF_COOKIE, CSRF_FIELD, same_origin
from .drain import DEFAULT_MAX_MESSAGES
from .state import UiState, pretty_json, render, user_of

RESOLVE_ACTIONS = {
    "result": "use this text as the call's result",
    "fail": "the call failed",
    "retry": "run it again",
}
"""The decisions of a parked call, as the resolve form names them."""


async def _checked_form(request: Request) -> FormData | Response:
    """The post's form when its CSRF token and origin are right, else a 403 response."""
    ui: UiState = request.app.state.ui
    form = await request.form()
    token = form.get(CSRF_FIELD)
    cookie = request.cookies.get(CSRF_COOKIE)
    if not same_origin(request.headers.get("origin"), request.headers.get("host")):
        return PlainTextResponse("403 Forbidden: a form of another site\n", status_code=403)
    if not ui.auth.csrf_ok(cookie, user_of(request), token if isinstance(token, str) else None):
        return PlainTextResponse(
            "403 Forbidden: the form's CSRF token is missing or stale; reload the page and try again\n",
            status_code=403,
        )
    return form


def _field(form: FormData, name: str) -> str:
    value = form.get(name)
    return value.strip() if isinstance(value, str) else ""


def _back(form: FormData, default: str) -> str:
    # only a path of this site (never //host or a scheme)
    target = _field(form, "next")
    return (
        target if target.startswith("/") and not target.startswith("//") and "\\" not in target else default
    )


async def _confirm(
    request: Request, form: FormData, title: str, what: str, details: list[tuple[str, Any]]
) -> Response:
    fields = {k: v for k, v in form.items() if k not in (CSRF_FIELD, "confirmed") and isinstance(v, str)}
    return await render(
        request,
        "confirm.html",
        {
            "title": title,
            "what": what,
            "details": details,
            "fields": fields,
            "action": request.url.path,
            "back": _back(form, "/"),
        },
    )


async def _refused(
    request: Request, ui: UiState, action: str, target: str, message: str, code: int = 409, back: str = "/"
) -> Response:
    ui.record(user_of(request), action, target, "refused", message)
    return await render(
        request,
        "error.html",
        {"title": f"{action} refused", "message": message, "back": back},
        status_code=code,
    )


async def cancel_run(request: Request) -> Response:
    """``POST /runs/{run_id}/cancel``: cancel the run (see :meth:`AsyncLatticeClient.cancel`)."""
    ui: UiState = request.app.state.ui
    form = await _checked_form(request)
    if isinstance(form, Response):
        return form
    run_id = request.path_params["run_id"]
    try:
        check_run_id(run_id)
        record = await ui.client.get_run(run_id)
        if record is None:
            raise RunNotFoundError(run_id)
    except (ValueError, RunNotFoundError) as exc:
        return await _refused(request, ui, "cancel", run_id, str(exc), 404)
    if _field(form, "confirmed") != "yes":
        return await _confirm(
            request,
            form,
            f"cancel run {run_id}?",
            "Its remaining mailbox work becomes cancelled; nothing of it runs later.",
            [
                ("run", run_id),
                ("team", record.team),
                ("status", record.status.value),
                ("prompt", record.prompt),
            ],
        )
    report = await ui.client.cancel(run_id)
    detail = (
        f"was {report.previous_status.value if report.previous_status else '?'}, now {report.status.value}; "
    )
    detail += f"{len(report.cancelled_messages)} message(s) cancelled"
    ui.record(user_of(request), "cancel", run_id, "ok", detail)
    return RedirectResponse(_back(form, f"/runs/{run_id}"), status_code=303)


async def _find_call(ui: UiState, kind: str, call_id: str) -> Any:
    calls = await (ui.client.parked() if kind == "parked" else ui.client.approvals())
    key = "message_id" if kind == "parked" else "call_id"
    return next((c for c in calls if getattr(c, key) == call_id), None)


def _call_details(call: Any) -> list[tuple[str, Any]]:
    return [
        ("run", call.run_id),
        ("team", call.team),
        ("member", call.member),
        ("tool", call.tool_name),
        ("effect", call.effect),
        ("input", pretty_json(call.input)),
        ("why it waits", call.reason),
    ]


async def resolve_call(request: Request) -> Response:
    """``POST /calls/resolve`` (``id``, ``decision`` = result | fail | retry, ``text``):
    decide a parked call (see :meth:`AsyncLatticeClient.resolve`)."""
    ui: UiState = request.app.state.ui
    form = await _checked_form(request)
    if isinstance(form, Response):
        return form
    call_id, decision, text = _field(form, "id"), _field(form, "decision"), form.get("text")
    text = text if isinstance(text, str) else ""
    if decision not in RESOLVE_ACTIONS:
        return await _refused(
            request, ui, "resolve", call_id, "choose a decision: result, fail or retry", 400
        )
    if decision == "fail" and not text.strip():
        return await _refused(
            request, ui, "resolve", call_id, "an error needs a reason (the model gets it)", 400
        )
    call = await _find_call(ui, "parked", call_id)
    if call is None:
        return await _refused(
            request, ui, "resolve", call_id, f"{call_id} is not a parked call now (decided already?)"
        )
    if _field(form, "confirmed") != "yes":
        chosen = RESOLVE_ACTIONS[decision] + (f": {text}" if decision != "retry" else "")
        return await _confirm(
            request,
            form,
            f"resolve {call_id}?",
            f"Decision: {chosen}",
            [("call", call_id), *_call_details(call)],
        )
    kwargs: dict[str, Any] = {"result": text} if decision == "result" else {}
    if decision == "fail":
        kwargs["fail"] = text
    try:
        await ui.client.resolve(call_id, retry=decision == "retry", **kwargs)
    except DecisionError as exc:
        return await _refused(request, ui, "resolve", call_id, str(exc))
    ui.record(user_of(request), "resolve", call_id, "ok", f"{call.tool_name}: {decision}")
    return RedirectResponse(_back(form, "/calls"), status_code=303)


async def approve_call(request: Request) -> Response:
    """``POST /calls/approve`` (``id``): approve a waiting call."""
    return await _approval(request, "approve")


async def deny_call(request: Request) -> Response:
    """``POST /calls/deny`` (``id``, ``reason``): deny a waiting call; the model gets the reason."""
    return await _approval(request, "deny")


async def _approval(request: Request, action: str) -> Response:
    ui: UiState = request.app.state.ui
    form = await _checked_form(request)
    if isinstance(form, Response):
        return form
    call_id, reason = _field(form, "id"), _field(form, "reason")
    if action == "deny" and not reason:
        return await _refused(
            request, ui, action, call_id, "a denial needs a reason (the model gets it)", 400
        )
    call = await _find_call(ui, "approval", call_id)
    if call is None:
        return await _refused(request, ui, action, call_id, f"{call_id} does not wait for an approval now")
    if _field(form, "confirmed") != "yes":
        what = "The call runs when its work resumes." if action == "approve" else f"The model gets: {reason}"
        return await _confirm(
            request, form, f"{action} {call_id}?", what, [("call", call_id), *_call_details(call)]
        )
    try:
        if action == "approve":
            await ui.client.approve(call_id)
        else:
            await ui.client.deny(call_id, reason)
    except DecisionError as exc:
        return await _refused(request, ui, action, call_id, str(exc))
    ui.record(user_of(request), action, call_id, "ok", call.tool_name + (f": {reason}" if reason else ""))
    return RedirectResponse(_back(form, "/calls"), status_code=303)


async def drain_mailbox(request: Request) -> Response:
    """``POST /mailbox/drain`` (``id``, ``max_messages``): drain one member in this process."""
    ui: UiState = request.app.state.ui
    form = await _checked_form(request)
    if isinstance(form, Response):
        return form
    mailbox_id = _field(form, "id")
    target = ui.drain.for_mailbox(mailbox_id)
    if target is None:
        return await _refused(request, ui, "drain", mailbox_id, ui.drain.why_not(mailbox_id), 400)
    try:
        max_messages = max(1, min(1000, int(_field(form, "max_messages") or DEFAULT_MAX_MESSAGES)))
    except ValueError:
        return await _refused(request, ui, "drain", mailbox_id, "max messages must be a whole number", 400)
    if _field(form, "confirmed") != "yes":
        pending = (await ui.client.mailbox.counts(mailbox_id)).get("pending", 0)
        return await _confirm(
            request,
            form,
            f"drain {mailbox_id}?",
            "The member's agent works on its pending messages in this page's process, as lattice drain does.",
            [("team", target[0]), ("member", target[1]), ("pending now", pending), ("at most", max_messages)],
        )
    try:
        result, output = await ui.drain.arun(target[0], target[1], max_messages)
    except Exception as exc:  # the member's own failure is reported, never a traceback page
        return await _refused(request, ui, "drain", mailbox_id, f"{type(exc).__name__}: {exc}", 500)
    detail = f"{result.processed} processed, {result.failed} failed"
    ui.record(user_of(request), "drain", mailbox_id, "ok", detail)
    return await render(
        request,
        "drained.html",
        {"title": f"drained {mailbox_id}", "mailbox_id": mailbox_id, "detail": detail, "output": output},
    )


__all__ = ["approve_call", "cancel_run", "deny_call", "drain_mailbox", "resolve_call"]
