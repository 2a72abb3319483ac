"""Distributed: a member that ends without ``team_reply`` is named in the run's result
(``RunResult.failed_work_items``), and ``lattice wait`` prints a warning line for it,
while the run itself completes (its lead decided). Real ``lattice worker`` processes."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from lattice_client.cli import app
from tests.e2e.conftest import Deployment
from tests.e2e.teams import plan
from tests.support.services import REDIS_URL

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.timeout(150)]


def test_failed_work_items_reach_the_caller(deployment: Deployment):
    d = deployment
    d.worker("tests.e2e.teams:team", "--member", "lead", "--concurrency", "1")
    d.worker("tests.e2e.teams:team", "--member", "worker", "--member", "other", "--concurrency", "2")
    handle = d.client.submit(
        "e2e",
        plan(("worker", "handoff", "x fail"), ("other", "ask", "y fail"), ("other", "handoff", "fine")),
    )
    result = handle.wait(timeout=60)
    assert result.status == "completed", result
    failed = sorted(result.failed_work_items, key=lambda e: e["member"])
    assert [(e["member"], e["status"], e["error"]["code"]) for e in failed] == [
        ("other", "failed", "no_reply"),  # the ask
        ("worker", "failed", "no_reply"),  # the handoff
    ]
    boxes = {box: d.client.inbox(box, "failed") for box in ("e2e::worker", "e2e::other")}
    assert {e["work_item_id"] for e in failed} == {m.work_item_id for ms in boxes.values() for m in ms}
    assert d.client.get_run(handle.run_id).result.failed_work_items == result.failed_work_items

    shown = CliRunner().invoke(
        app,
        ["--broker-url", REDIS_URL, "--key-prefix", d.prefix, "wait", handle.run_id],
        env={"COLUMNS": "300"},
    )
    assert shown.exit_code == 0, shown.output
    warnings = [line for line in shown.stdout.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 2, shown.stdout
    for entry in failed:
        assert any(
            f'work item {entry["work_item_id"]} of member "{entry["member"]}" failed (no_reply)' in w
            for w in warnings
        ), warnings
