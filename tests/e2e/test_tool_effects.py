"""End-to-end: crash-safe tool calls on real ``lattice worker`` processes
(docs/tool-effects.md).

One run per effect is started at once; each run's agent first calls ``prep``
(unguarded: it must never run twice), then its target tool, which records its
side effect in Redis and blocks on its first execution. Once every target
has started, the worker is killed (``kill -9`` of its process group). A new
worker's reaper finds the expired claims (or lead leases), and each call is
recovered by its tool's effect: ``read_only`` runs again; ``idempotent`` is
sent again with the same effect key (the provider stub sees one effect);
``reconcilable`` uses the value its lookup found, or runs again after a final
not-found; ``unguarded`` parks, and ``lattice resolve --result`` completes the
run with that value. The same for a session member (a live ``Agent``), whose
re-claimed item goes on in its conversation. Then approvals across a worker
restart, decided from the CLI.
"""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from tests.e2e.conftest import LATTICE, REPO, Deployment, wait_for
from tests.e2e.effect_teams import lead_plan, member_plan

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.timeout(240)]

TEAM = "tests.e2e.effect_teams:team"

CASES = [
    # tool, label, executions of the tool, the run's answer
    ("lookup_docs", "r-hang", 2, "found[r-hang]"),
    ("charge", "c-hang", 2, "charged[c-hang]"),
    ("charge_checked", "k-hang", 1, "looked-up[ch_k-hang]"),
    ("charge_checked", "n-hang-late", 2, "charged[n-hang-late]"),
]
UNGUARDED = ("send_email", "e-hang")


def count(d: Deployment, name: str, label: str) -> int:
    return int(d.redis.get(f"{d.prefix}:test:exec:{name}:{label}") or 0)


def cli(d: Deployment, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [LATTICE, *args], cwd=REPO, env=d.env, capture_output=True, text=True, timeout=60, check=False
    )


def run_scenario(d: Deployment, plan_of) -> tuple[dict[str, object], object, str]:
    """Start one run per case plus the unguarded one, kill the worker once every
    target started, start another; returns the handles by label, the new
    worker and the unguarded run's parked id."""
    doomed = d.worker(TEAM, "--concurrency", "6")
    handles = {label: d.client.submit(TEAM, plan_of(f"{tool} {label}")) for tool, label, _, _ in CASES}
    handles[UNGUARDED[1]] = d.client.submit(TEAM, plan_of(f"{UNGUARDED[0]} {UNGUARDED[1]}"))
    targets = [f"start:{t}:{lb}" for t, lb, _, _ in CASES] + [f"start:{UNGUARDED[0]}:{UNGUARDED[1]}"]
    wait_for(lambda: set(targets) <= set(d.work_log()), 60, "every target tool to start")
    doomed.kill9()
    survivor = d.worker(TEAM, "--concurrency", "6")
    for tool, label, runs, output in CASES:
        result = handles[label].wait(timeout=90)
        assert (result.status, result.result) == ("completed", f"final: {output}"), (label, result)
        assert count(d, tool, label) == runs, label
        assert count(d, "prep", label) == 1, label  # completed before the kill: never again
        if tool.startswith("charge"):
            assert d.redis.get(f"{d.prefix}:test:provider:count:{label}") == "1", label
    parked = wait_for(lambda: d.client.parked("fx"), 60, "the unguarded call to park")
    [call] = parked
    assert (call.tool_name, call.effect, call.input) == ("send_email", "unguarded", {"label": UNGUARDED[1]})
    return handles, survivor, call.message_id


def finish_unguarded(d: Deployment, handles: dict, parked_id: str) -> None:
    run = handles[UNGUARDED[1]]
    assert d.client.get_run(run.run_id).status.value == "suspended"  # no worker holds it
    listed = cli(d, "parked", "fx", "--json")
    assert listed.returncode == 0 and [p["message_id"] for p in json.loads(listed.stdout)] == [parked_id], (
        listed
    )
    table = cli(d, "parked")
    assert table.returncode == 0 and "send_email" in table.stdout and "parked calls" in table.stdout, table
    status = cli(d, "status", "fx", "--json")
    assert parked_id in [p["message_id"] for p in json.loads(status.stdout)["parked"]]
    bad = cli(d, "resolve", parked_id, "--retry", "--result", "x")
    assert bad.returncode == 1 and "exactly one" in bad.stderr
    done = cli(d, "resolve", parked_id, "--result", "sent by hand")
    assert done.returncode == 0, done
    again = cli(d, "resolve", parked_id, "--result", "sent by hand")
    assert again.returncode == 1 and "error:" in again.stderr
    result = run.wait(timeout=60)
    assert (result.status, result.result) == ("completed", "final: sent by hand")
    assert count(d, *UNGUARDED) == 1 and count(d, "prep", UNGUARDED[1]) == 1
    events = list(d.client.events(run.run_id, timeout=10))
    assert any(e.get("type") == "tool_parked" and e.get("id") == parked_id for e in events)


def test_kill9_during_member_tool_calls_recovers_each_by_its_effect(deployment_factory):
    d = deployment_factory(lease_seconds=2, max_attempts=5)
    handles, survivor, parked_id = run_scenario(d, member_plan)
    [message] = [m for m in d.client.inbox("fx::m", "all") if m.id == parked_id]
    assert message.status.value == "parked"
    # the task's return value (what Flower shows as its result)
    survivor.wait_log(r"lattice\.deliver\[[^\]]+\] succeeded in [^:]+: 'parked'")
    finish_unguarded(d, handles, parked_id)
    assert {m.status.value for m in d.client.inbox("fx::m", "all")} == {"done"}


def test_kill9_during_a_session_members_tool_call_parks_it_and_the_session_goes_on(deployment_factory):
    # session member "s" (a live Agent): one conversation across its work items, serial
    d = deployment_factory(lease_seconds=2, max_attempts=5)
    doomed = d.worker(TEAM, "--concurrency", "2")
    emailed = d.client.submit(TEAM, member_plan("send_email se-hang", via="s"))
    wait_for(
        lambda: "start:send_email:se-hang" in d.work_log(), 60, "the session member's send_email to start"
    )
    charged = d.client.submit(TEAM, member_plan("charge sc", via="s"))
    # its task waits behind the first in the session's mailbox (serial), its lead suspended
    wait_for(lambda: d.client.inbox("fx::s", "pending"), 60, "the second task to wait in the mailbox")
    doomed.kill9()
    d.worker(TEAM, "--concurrency", "2")
    [call] = wait_for(lambda: d.client.parked("fx"), 60, "the unguarded call to park")
    assert (call.member, call.tool_name, call.effect) == ("s", "send_email", "unguarded")
    # the re-claimed item went on from its last turn: prep (completed) and send_email never ran again
    assert count(d, "prep", "se-hang") == 1 and count(d, "send_email", "se-hang") == 1
    assert cli(d, "resolve", call.message_id, "--result", "sent by hand").returncode == 0
    result = emailed.wait(timeout=60)
    assert (result.status, result.result) == ("completed", "final: sent by hand")
    result = charged.wait(timeout=60)
    assert (result.status, result.result) == ("completed", "final: charged[sc]")
    assert count(d, "send_email", "se-hang") == 1 and count(d, "prep", "se-hang") == 1
    assert count(d, "charge", "sc") == 1 and count(d, "prep", "sc") == 1
    assert {m.status.value for m in d.client.inbox("fx::s", "all")} == {"done"}


def test_kill9_during_the_leads_own_tool_calls_recovers_each_by_its_effect(deployment_factory):
    d = deployment_factory(lease_seconds=2, max_attempts=5)
    handles, survivor, parked_id = run_scenario(d, lead_plan)
    assert re.fullmatch(rf"{handles[UNGUARDED[1]].run_id}/toolu_target", parked_id)
    survivor.wait_log(r"lattice\.resume_lead\[[^\]]+\] succeeded in [^:]+: 'parked'")
    finish_unguarded(d, handles, parked_id)


def test_an_approval_wait_survives_a_worker_restart_and_is_approved_from_the_cli(deployment_factory):
    d = deployment_factory(lease_seconds=2, max_attempts=5)
    first = d.worker(TEAM, "--concurrency", "2")
    handle = d.client.submit(TEAM, member_plan("send_email ok1", via="gate"))
    [pending] = wait_for(lambda: d.client.approvals("fx"), 60, "the first approval")
    assert pending.tool_name == "prep" and pending.member == "gate"
    first.wait_log(r"lattice\.deliver\[[^\]]+\] succeeded in [^:]+: 'awaiting_approval'")
    first.kill9()  # nothing is lost: no worker held the wait
    listed = cli(d, "approvals", "fx", "--json")
    assert [a["call_id"] for a in json.loads(listed.stdout)] == [pending.call_id]
    d.worker(TEAM, "--concurrency", "2")
    assert cli(d, "approve", pending.call_id).returncode == 0
    assert cli(d, "approve", pending.call_id).returncode == 1  # decided already: an error, nothing changes
    [second] = wait_for(
        lambda: [a for a in d.client.approvals("fx") if a.tool_name == "send_email"],
        60,
        "the second approval",
    )
    assert count(d, "prep", "ok1") == 1 and count(d, "send_email", "ok1") == 0
    assert cli(d, "approve", second.call_id).returncode == 0
    result = handle.wait(timeout=60)
    assert (result.status, result.result) == ("completed", "final: sent[ok1]")
    assert count(d, "send_email", "ok1") == 1
