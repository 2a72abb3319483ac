"""The operations page's app (lattice_client/ui) over the real Redis, driven by
Starlette's test client: credentials, the CSRF check, escaping of untrusted
content, the confirmation step and the action log. No worker runs here (the
browser tests in tests/e2e/test_ui_browser.py drive real workers); runs and
messages are written with the same client the page reads through.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator

import pytest
from starlette.testclient import TestClient

from lattice_client import LatticeClient
from lattice_client.async_client import AsyncLatticeClient
from lattice_client.ui import Auth, create_app
from lattice_client.ui.auth import CSRF_COOKIE, parse_basic_auth
from tests.support.services import REDIS_URL

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]

EVIL = '<script>alert("x")</script><img src=x onerror=alert(1)>'


@pytest.fixture
def seeded(prefix: str) -> Iterator[LatticeClient]:
    """A run whose prompt is markup, and a message of it in ``t::m`` whose content is markup."""
    client = LatticeClient(broker_url=REDIS_URL, key_prefix=prefix)
    aio = client.aio
    client._call(aio.runs.create, "run-evil", "t", f"prompt {EVIL}")
    client._call(aio.mailbox.send, "t::lead", "t::m", f"task {EVIL}", metadata={"run_id": "run-evil"})
    yield client
    client.close()


@pytest.fixture
def page(prefix: str, seeded: LatticeClient) -> Iterator[TestClient]:
    auth = Auth(parse_basic_auth("ops:s3cret,viewer:pw2"))
    app = create_app(lambda: AsyncLatticeClient(broker_url=REDIS_URL, key_prefix=prefix), auth)
    with TestClient(app, base_url="http://testserver") as client:
        yield client


def _token(html: str) -> str:
    found = re.search(r'name="csrf_token" value="([0-9a-f]{64})"', html)
    assert found, html[:2000]
    return found.group(1)


def test_credentials_are_required_and_checked(page: TestClient):
    assert page.get("/").status_code == 401
    assert page.get("/").headers["www-authenticate"].startswith("Basic ")
    assert page.get("/", auth=("ops", "wrong")).status_code == 401
    assert page.get("/", auth=("nobody", "s3cret")).status_code == 401
    assert page.get("/static/ui.js", auth=("ops", "wrong")).status_code == 401
    ok = page.get("/", auth=("ops", "s3cret"))
    assert ok.status_code == 200 and "run-evil" in ok.text and "signed in as <strong>ops</strong>" in ok.text
    assert page.get("/", auth=("viewer", "pw2")).status_code == 200
    assert "script-src 'self'" in ok.headers["content-security-policy"]
    assert ok.headers["x-frame-options"] == "DENY"


def test_untrusted_content_is_shown_as_text(page: TestClient):
    auth = ("ops", "s3cret")
    for path in ("/", "/runs/run-evil", "/mailbox?id=t::m&status=all"):
        html = page.get(path, auth=auth).text
        assert "<script>alert" not in html and "<img src=x" not in html, path
        assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;" in html, path


def test_a_post_without_the_csrf_token_is_refused_and_changes_nothing(
    page: TestClient, seeded: LatticeClient
):
    auth = ("ops", "s3cret")
    page.get("/runs/run-evil", auth=auth)  # sets the CSRF cookie
    assert page.cookies.get(CSRF_COOKIE)
    for form in ({"confirmed": "yes"}, {"confirmed": "yes", "csrf_token": "0" * 64}):
        refused = page.post("/runs/run-evil/cancel", data=form, auth=auth)
        assert refused.status_code == 403 and "CSRF" in refused.text
    # another user's token does not do either
    viewer = page.get("/runs/run-evil", auth=("viewer", "pw2")).text
    cross = page.post(
        "/runs/run-evil/cancel", data={"confirmed": "yes", "csrf_token": _token(viewer)}, auth=auth
    )
    assert cross.status_code == 403
    # nor the right token from another site's form
    token = _token(page.get("/runs/run-evil", auth=auth).text)
    foreign = page.post(
        "/runs/run-evil/cancel",
        data={"confirmed": "yes", "csrf_token": token},
        auth=auth,
        headers={"Origin": "http://evil.example"},
    )
    assert foreign.status_code == 403
    assert seeded.get_run("run-evil").status.value == "queued"


def test_cancel_asks_first_then_cancels_and_logs_who_did_it(
    page: TestClient, seeded: LatticeClient, caplog: pytest.LogCaptureFixture
):
    auth = ("ops", "s3cret")
    token = _token(page.get("/runs/run-evil", auth=auth).text)
    asked = page.post(
        "/runs/run-evil/cancel", data={"csrf_token": token, "next": "/runs/run-evil"}, auth=auth
    )
    assert asked.status_code == 200 and "Confirm: cancel run run-evil?" in asked.text
    assert "&lt;script&gt;" in asked.text and "<script>alert" not in asked.text  # the prompt, escaped
    assert seeded.get_run("run-evil").status.value == "queued"  # asking changed nothing
    with caplog.at_level(logging.INFO, logger="lattice_client.ui"):
        done = page.post(
            "/runs/run-evil/cancel",
            data={"csrf_token": _token(asked.text), "next": "/runs/run-evil", "confirmed": "yes"},
            auth=auth,
            follow_redirects=False,
        )
    assert done.status_code == 303 and done.headers["location"] == "/runs/run-evil"
    assert seeded.get_run("run-evil").status.value == "cancelled"
    assert any("ui action by ops: cancel run-evil -> ok" in r.getMessage() for r in caplog.records)
    log = page.get("/actions", auth=auth).text
    assert re.search(r"<td>ops</td><td>cancel</td><td>run-evil</td><td>ok</td>", log), log


def test_a_redirect_target_of_another_site_is_not_followed(page: TestClient, seeded: LatticeClient):
    auth = ("ops", "s3cret")
    token = _token(page.get("/runs/run-evil", auth=auth).text)
    form = {"csrf_token": token, "next": "//evil.example/x", "confirmed": "yes"}
    done = page.post("/runs/run-evil/cancel", data=form, auth=auth, follow_redirects=False)
    assert done.status_code == 303 and done.headers["location"] == "/runs/run-evil"


def test_decisions_on_calls_that_do_not_wait_are_refused_with_the_reason(page: TestClient):
    auth = ("ops", "s3cret")
    token = _token(page.get("/runs/run-evil", auth=auth).text)
    refused = page.post("/calls/approve", data={"csrf_token": token, "id": "run-evil/toolu_x"}, auth=auth)
    assert refused.status_code == 409 and "does not wait for an approval now" in refused.text
    no_reason = page.post("/calls/deny", data={"csrf_token": token, "id": "run-evil/toolu_x"}, auth=auth)
    assert no_reason.status_code == 400 and "needs a reason" in no_reason.text
    for form, why in (
        ({"id": "m1", "decision": "fail", "text": " "}, "an error needs a reason"),
        ({"id": "m1", "decision": "guess"}, "choose a decision: result, fail or retry"),
    ):
        bad = page.post("/calls/resolve", data={"csrf_token": token, **form}, auth=auth)
        assert bad.status_code == 400 and why in bad.text
    gone = page.post("/calls/resolve", data={"csrf_token": token, "id": "m1", "decision": "retry"}, auth=auth)
    assert gone.status_code == 409 and "is not a parked call now" in gone.text
    log = page.get("/actions", auth=auth).text
    assert "refused" in log and "approve" in log and "resolve" in log


def test_mailboxes_show_counts_and_the_oldest_pending_message(page: TestClient):
    html = page.get("/mailboxes", auth=("ops", "s3cret")).text
    row = re.search(r"<tr>\s*<td><a href=\"/mailbox\?id=t%3A%3Am\">t::m</a></td>(.*?)</tr>", html, re.S)
    assert row, html
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row.group(1), re.S)
    assert cells[0] == "1"  # pending
    assert re.search(r"\d+s", cells[-1])  # the oldest pending message's age
    mailbox = page.get("/mailbox?id=t::m", auth=("ops", "s3cret")).text
    assert "start the page with lattice ui --drain TEAM_REF" in mailbox  # no team given: no drain
    assert page.get("/mailbox?id=t::nobody", auth=("ops", "s3cret")).status_code == 404


def test_a_runs_events_stream_ends_after_its_result(page: TestClient, seeded: LatticeClient):
    seeded.cancel("run-evil")
    with page.stream("GET", "/runs/run-evil/events?after=0-0", auth=("ops", "s3cret")) as response:
        body = "".join(response.iter_text())
    assert response.headers["content-type"].startswith("text/event-stream")
    assert '"kind": "run_result"' in body and body.rstrip().endswith("event: end\ndata: {}")


def test_a_runs_events_stream_refuses_an_after_that_is_not_a_stream_id(
    page: TestClient, seeded: LatticeClient
):
    auth = ("ops", "s3cret")
    for after in ("garbage", "12-x", "-1"):
        response = page.get(f"/runs/run-evil/events?after={after}", auth=auth)
        assert response.status_code == 400, (after, response.status_code)
        assert "stream id" in response.text and repr(after) in response.text
    refused = page.get("/runs/run-evil/events", headers={"Last-Event-ID": "nope"}, auth=auth)
    assert refused.status_code == 400


POSTS = ("/runs/run-evil/cancel", "/calls/resolve", "/calls/approve", "/calls/deny", "/mailbox/drain")


def test_every_form_checks_its_csrf_token(page: TestClient, seeded: LatticeClient):
    auth = ("ops", "s3cret")
    page.get("/", auth=auth)  # sets the CSRF cookie
    for path in POSTS:
        for token in ({}, {"csrf_token": "f" * 64}):
            data = {"confirmed": "yes", "id": "t::m", "decision": "retry", "reason": "r", **token}
            refused = page.post(path, data=data, auth=auth)
            assert refused.status_code == 403 and "CSRF" in refused.text, path
    assert seeded.get_run("run-evil").status.value == "queued"
    assert seeded._call(seeded.aio.mailbox.counts, "t::m").get("pending") == 1


def test_bad_input_gets_a_clear_4xx_page_and_changes_nothing(page: TestClient, seeded: LatticeClient):
    auth = ("ops", "s3cret")
    for path in (
        "/runs/run-nope",
        "/runs/bad%20id%3Cx%3E",
        "/runs/run-nope/events",
        "/mailbox",
        "/mailbox?id=nocolons",
        "/runs?status=bogus",
        "/mailbox?id=t::m&status=bogus",
    ):
        response = page.get(path, auth=auth)
        assert 400 <= response.status_code < 500, (path, response.status_code, response.text[:300])
        assert "<x>" not in response.text, path
    token = _token(page.get("/runs/run-evil", auth=auth).text)
    for path, data in (
        ("/runs/run-nope/cancel", {"confirmed": "yes"}),
        ("/runs/bad%20id/cancel", {"confirmed": "yes"}),
        ("/calls/resolve", {"id": "", "decision": "retry", "confirmed": "yes"}),
        ("/calls/approve", {"id": "nope", "confirmed": "yes"}),
        ("/mailbox/drain", {"id": "t::m", "confirmed": "yes"}),
        ("/mailbox/drain", {"id": "", "confirmed": "yes"}),
    ):
        response = page.post(path, data={"csrf_token": token, **data}, auth=auth)
        assert 400 <= response.status_code < 500, (path, response.status_code, response.text[:300])
    garbage = page.post(
        "/runs/run-evil/cancel",
        content=b"\xff\xfe not a form",
        headers={"content-type": "multipart/form-data; boundary=x"},
        auth=auth,
    )
    assert 400 <= garbage.status_code < 500, garbage.text[:300]
    assert seeded.get_run("run-evil").status.value == "queued"


def test_a_run_page_shows_its_tokens_spent_against_its_budget(page: TestClient, seeded: LatticeClient):
    seeded._call(seeded.aio.runs.create, "run-budget", "t", "p", budget_tokens=2_000)
    html = page.get("/runs/run-budget", auth=("ops", "s3cret")).text
    assert "tokens spent / budget" in html and "0 / 2000" in html
    assert "tokens spent / budget" not in page.get("/runs/run-evil", auth=("ops", "s3cret")).text
    assert "lattice budget" not in html  # not parked: nothing to raise yet


def test_a_run_parked_at_its_budget_says_how_to_raise_it_on_its_page(page: TestClient, seeded: LatticeClient):
    seeded._call(seeded.aio.runs.create, "run-parked", "t", "p", budget_tokens=2_000)
    assert seeded._call(seeded.aio.runs.set_status, "run-parked", "budget_reached")
    html = page.get("/runs/run-parked", auth=("ops", "s3cret")).text
    assert "0 / 2000 (parked until raised: lattice budget run-parked --tokens N, the new total)" in html


def test_the_calls_page_of_a_team_reference_no_worker_serves_is_a_bad_request(page: TestClient):
    refused = page.get("/calls", params={"team": "pkg.teams:nope"}, auth=("ops", "s3cret"))
    assert refused.status_code == 400 and "no live worker" in refused.text, refused.text[:500]
    assert page.get("/calls", params={"team": "t"}, auth=("ops", "s3cret")).status_code == 200
