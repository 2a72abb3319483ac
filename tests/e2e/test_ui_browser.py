"""End-to-end: the operations page (``lattice ui``) in headless Chromium against
real ``lattice worker`` processes (tests/e2e/browser.py says how Chromium is found).

Each scenario checks what the page's text says while the workers do the work:

* a run is listed and completes, its timeline shows each member step on the
  worker that ran it (a queue no worker consumes is red, and its member is
  drained from the page); the run page follows the run live;
* a parked call (a worker killed during an unguarded tool call) is resolved
  from the page and the run completes with that result;
* approvals are denied from the page and the model gets the reasons;
* a wrong password gets 401, the right one the page.

Screenshots of each page are saved (tests/e2e/browser.py, ``Screenshots``).
"""

from __future__ import annotations

import json
import re

import pytest

from tests.e2e.browser import PASSWORD, Screenshots, chromium, new_page, start_ui
from tests.e2e.conftest import Deployment, wait_for
from tests.e2e.effect_teams import member_plan

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.timeout(240)]

TEAM = "tests.e2e.teams:team"
FX = "tests.e2e.effect_teams:team"
RED = "rgb(194, 45, 45)"  # the stylesheet's --red


def _expect() -> object:
    from playwright.sync_api import expect

    return expect


def count(d: Deployment, name: str, label: str) -> int:
    return int(d.redis.get(f"{d.prefix}:test:exec:{name}:{label}") or 0)


def test_a_run_is_listed_and_completes_with_each_member_step_on_its_worker(deployment, tmp_path):
    expect = _expect()
    d = deployment
    shots = Screenshots(tmp_path)
    d.worker(TEAM, "--member", "lead", "--member", "worker")  # nobody consumes the queue of member "other"
    node = wait_for(lambda: d.client.status().workers, 20, "the worker to register")[0].node
    ui = start_ui(d, "--drain", TEAM)
    plan = {
        "calls": [
            {"member": "worker", "mode": "ask", "task": "alpha"},
            {"member": "other", "mode": "ask", "task": "beta"},
        ]
    }
    handle = d.client.submit("e2e", json.dumps(plan))
    with chromium() as browser:
        page = new_page(browser)
        page.goto(ui.url("/runs"))
        row = page.locator("#runs tbody tr", has_text=handle.run_id)
        expect(row).to_contain_text("e2e")
        expect(row).to_contain_text("suspended")  # the list refreshes itself: "other" has no worker

        live = new_page(browser)  # the run's page, open while the run waits: it follows the run
        live.goto(ui.url(f"/runs/{handle.run_id}"))
        expect(live.locator("#run-status")).to_have_text("suspended")
        expect(live.locator("#live")).to_have_text("following live…")

        page.goto(ui.url("/workers"))
        other = page.locator("#queues tr", has_text=f"{d.prefix}.e2e.other")
        expect(other).to_have_class("unserved")
        expect(other).to_contain_text("no live worker")
        assert other.locator("td").first.evaluate("e => getComputedStyle(e).color") == RED
        served = page.locator("#queues tr", has_text=f"{d.prefix}.e2e.worker")
        expect(served).to_contain_text(node)
        expect(page.locator("#workers")).to_contain_text(node)
        shots.save(page, "workers")

        page.goto(ui.url("/mailboxes"))
        box = page.locator("#mailboxes tbody tr", has_text="e2e::other")
        expect(box.locator("td").nth(1)).to_have_text("1")  # pending
        expect(box.locator("td").last).to_have_text(
            re.compile(r"^\d+(s|m \d+s)$")
        )  # the oldest pending's age
        shots.save(page, "mailboxes")

        box.locator("a").click()
        expect(page.locator("#messages")).to_contain_text("beta")
        shots.save(page, "mailbox")
        page.locator("#drain").click()
        expect(page.locator("h1")).to_have_text("Confirm: drain e2e::other?")
        page.locator("#confirm").click()
        expect(page.locator("#drained")).to_have_text("1 processed, 0 failed", timeout=60_000)

        # the page that was open while the run waited saw it finish (its events arrive as they happen)
        expect(live.locator("#run-status")).to_have_text("completed", timeout=60_000)
        expect(live.locator("#live")).to_have_text("the run has finished")
        expect(live.locator("#result")).to_have_text("final: ask:worked[alpha] | ask:worked[beta]")
        expect(live.locator("#events")).to_contain_text("run_result")
        on_worker = live.locator(".step", has_text="e2e::worker")
        expect(on_worker.locator("td.worker")).to_have_text(node)
        expect(on_worker).to_contain_text("success")
        expect(live.locator(".step", has_text="e2e::other").locator("td.worker")).to_contain_text(
            "lattice drain on"
        )
        expect(live.locator("#segments tbody tr")).to_have_count(2)
        for segment in live.locator("#segments tbody tr").all():  # both lead segments ran on the one worker
            expect(segment.locator("td.worker")).to_have_text(node)
        live.reload()
        expect(live.locator(".step", has_text="e2e::worker").locator("td.worker")).to_have_text(node)
        shots.save(live, "run")

        page.goto(ui.url("/runs"))
        expect(page.locator("#runs tbody tr", has_text=handle.run_id)).to_contain_text("completed")
        shots.save(page, "runs")
        page.goto(ui.url("/actions"))
        expect(page.locator("#actions tbody tr").first).to_contain_text("ops")
        expect(page.locator("#actions tbody tr").first).to_contain_text("drain")
        shots.save(page, "actions")
    assert handle.wait(timeout=10).result == "final: ask:worked[alpha] | ask:worked[beta]"
    assert "ui action by ops: drain e2e::other -> ok" in ui.proc.log()


def test_a_parked_call_is_resolved_from_the_page_and_the_run_completes(deployment_factory, tmp_path):
    expect = _expect()
    d = deployment_factory(lease_seconds=2, max_attempts=5)
    shots = Screenshots(tmp_path)
    doomed = d.worker(FX, "--concurrency", "3")
    ui = start_ui(d)
    labels = ("e-hang", "f-hang", "g-hang")  # resolved with a result, as an error, by a re-run
    handles = {label: d.client.submit(FX, member_plan(f"send_email {label}")) for label in labels}
    handle = handles["e-hang"]
    wait_for(
        lambda: all(f"start:send_email:{label}" in d.work_log() for label in labels),
        60,
        "the unguarded calls to start",
    )
    doomed.kill9()  # during the calls: their effect is unknown, so they park
    d.worker(FX, "--concurrency", "2")
    parked = wait_for(
        lambda: len(d.client.parked("fx")) == 3 and d.client.parked("fx"), 60, "the calls to park"
    )
    by_label = {c.input["label"]: c for c in parked}
    call = by_label["e-hang"]
    with chromium() as browser:
        page = new_page(browser)
        page.goto(ui.url("/calls"))
        for label, decision, text, confirm_text in (
            ("f-hang", "fail", "the mail server said no", "the call failed: the mail server said no"),
            ("g-hang", "retry", "", "run it again"),
        ):
            other = page.locator(".call", has_text=by_label[label].message_id)
            other.locator(f"input[name=decision][value={decision}]").check()
            if text:
                other.locator("textarea").fill(text)
            other.locator("button.resolve").click()
            expect(page.locator("h1")).to_have_text(f"Confirm: resolve {by_label[label].message_id}?")
            expect(page.locator("main")).to_contain_text(confirm_text)
            assert (
                d.client.get_run(handles[label].run_id).status.value == "suspended"
            )  # asking changed nothing
            page.locator("#confirm").click()
            expect(page).to_have_url(ui.url("/calls"))
            expect(page.locator(".call", has_text=by_label[label].message_id)).to_have_count(0)
        card = page.locator(".call", has_text=call.message_id)
        expect(card).to_contain_text("send_email")
        expect(card).to_contain_text("unguarded")
        expect(card).to_contain_text('"label": "e-hang"')
        expect(card).to_contain_text("no result was recorded")
        shots.save(page, "parked")
        card.locator("textarea").fill("sent by hand")
        page.wait_for_timeout(6_500)  # past the list's refresh: a form being filled in is left alone
        expect(card.locator("textarea")).to_have_value("sent by hand")
        card.locator("button.resolve").click()
        expect(page.locator("h1")).to_have_text(f"Confirm: resolve {call.message_id}?")
        expect(page.locator("main")).to_contain_text("use this text as the call's result: sent by hand")
        expect(page.locator("main")).to_contain_text("e-hang")
        shots.save(page, "confirm")
        assert d.client.get_run(handle.run_id).status.value == "suspended"  # asking changed nothing
        page.locator("#confirm").click()
        expect(page).to_have_url(ui.url("/calls"))
        expect(page.locator("main")).to_contain_text("No parked calls")

        page.goto(ui.url(f"/runs/{handle.run_id}"))
        expect(page.locator("#run-status")).to_have_text("completed", timeout=60_000)
        expect(page.locator("#result")).to_have_text("final: sent by hand")
        expect(page.locator("#waits")).to_contain_text(call.message_id)
        expect(page.locator("#waits")).to_contain_text("decided; its work went on")
    assert handle.wait(timeout=10).result == "final: sent by hand"
    assert count(d, "send_email", "e-hang") == 1  # never run again
    failed = handles["f-hang"].wait(timeout=60)
    assert "the mail server said no" in failed.result and count(d, "send_email", "f-hang") == 1
    assert handles["g-hang"].wait(timeout=60).result == "final: sent[g-hang]"
    assert count(d, "send_email", "g-hang") == 2  # run again once
    log = ui.proc.log()
    for label, decision in (("e-hang", "result"), ("f-hang", "fail"), ("g-hang", "retry")):
        assert f"ui action by ops: resolve {by_label[label].message_id} -> ok (send_email: {decision})" in log


def test_approvals_are_denied_from_the_page_and_the_model_gets_the_reasons(deployment, tmp_path):
    expect = _expect()
    d = deployment
    shots = Screenshots(tmp_path)
    d.worker(FX, "--concurrency", "2")
    ui = start_ui(d)
    handle = d.client.submit(FX, member_plan("send_email ok1", via="gate"))
    with chromium() as browser:
        page = new_page(browser)
        page.goto(ui.url("/calls"))
        for tool, reason in (("prep", "not today"), ("send_email", "no mail")):
            card = page.locator(".call", has_text=f"{tool} (effect")
            expect(card).to_contain_text("awaiting approval", timeout=60_000)  # the list refreshes itself
            expect(card).to_contain_text("gate")
            if tool == "prep":
                shots.save(page, "approvals")
            card.locator("input[name=reason]").fill(reason)
            card.locator("button.deny").click()
            expect(page.locator("h1")).to_have_text(re.compile(r"^Confirm: deny .+\?$"))
            expect(page.locator("main")).to_contain_text(f"The model gets: {reason}")
            page.locator("#confirm").click()
            expect(page).to_have_url(ui.url("/calls"))
        page.goto(ui.url(f"/runs/{handle.run_id}"))
        expect(page.locator("#run-status")).to_have_text("completed", timeout=60_000)
        expect(page.locator("#result")).to_contain_text("no mail")
        expect(page.locator("#waits tbody tr")).to_have_count(2)  # both approvals, decided
    result = handle.wait(timeout=10)
    assert result.ok and "no mail" in result.result
    assert count(d, "prep", "ok1") == 0 and count(d, "send_email", "ok1") == 0  # denied: never ran
    log = ui.proc.log()
    assert log.count("ui action by ops: deny ") == 2


def test_a_wrong_password_gets_401_and_a_run_is_cancelled_from_its_page(deployment):
    expect = _expect()
    d = deployment
    d.worker(TEAM, "--member", "lead")  # nobody serves member "worker": the run waits for it
    ui = start_ui(d)
    handle = d.client.submit(
        "e2e", json.dumps({"calls": [{"member": "worker", "mode": "ask", "task": "gamma"}]})
    )
    with chromium() as browser:
        wrong = new_page(browser, password=PASSWORD + "x")
        response = wrong.goto(ui.url("/"))
        assert response is not None and response.status == 401
        expect(wrong.locator("body")).to_contain_text("401 Unauthorized")
        # without credentials (Chromium itself would ask for them in a dialog)
        assert browser.new_context().request.get(ui.url("/workers")).status == 401
        right = new_page(browser)
        response = right.goto(ui.url("/"))
        assert response is not None and response.status == 200
        expect(right.locator("header")).to_contain_text("signed in as ops")
        right.goto(ui.url("/workers"))
        expect(right.locator("#queues tr", has_text=f"{d.prefix}.e2e.lead")).to_have_class("served")
        right.goto(ui.url(f"/runs/{handle.run_id}"))
        expect(right.locator("#run-status")).to_have_text("suspended", timeout=60_000)
        right.locator("#cancel").click()
        expect(right.locator("h1")).to_have_text(f"Confirm: cancel run {handle.run_id}?")
        expect(right.locator("main")).to_contain_text("gamma")  # the prompt
        assert d.client.get_run(handle.run_id).status.value == "suspended"  # asking changed nothing
        right.locator("#confirm").click()
        expect(right).to_have_url(ui.url(f"/runs/{handle.run_id}"))
        expect(right.locator("#run-status")).to_have_text("cancelled")
        expect(right.locator("#cancel")).to_have_count(0)  # a finished run offers no cancel
        right.goto(ui.url("/actions"))
        expect(right.locator("#actions tbody tr").first).to_contain_text("cancel")
        expect(right.locator("#actions tbody tr").first).to_contain_text(handle.run_id)
    assert d.client.get_run(handle.run_id).status.value == "cancelled"
    assert f"ui action by ops: cancel {handle.run_id} -> ok" in ui.proc.log()
