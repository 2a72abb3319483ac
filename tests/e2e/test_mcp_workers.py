"""End-to-end: a team whose member uses an MCP stdio server, on real ``lattice worker``
processes; the server is killed between two runs (tests/e2e/mcp_team.py)."""

from __future__ import annotations

import os
import re

import pytest

from tests.e2e.teams import plan
from tests.support.mcp_servers import kill_and_wait, process_alive

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.timeout(180)]

TEAM = "tests.e2e.mcp_team:team"


def server_pid(result) -> int:
    assert result.status == "completed", result
    match = re.fullmatch(r"final: ask:pid (\d+)", result.result or "")
    assert match, result.result
    return int(match.group(1))


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def test_a_member_with_an_mcp_server_reuses_its_connection_and_survives_the_server_dying(
    deployment, tmp_path
):
    counter = tmp_path / "calls"
    d = deployment
    worker = d.worker(TEAM, "--concurrency", "1", env={"MCP_E2E_COUNTER": str(counter)})
    ask = plan(("docs", "ask", "which pid?"))

    first = server_pid(d.client.submit(TEAM, ask).wait(timeout=60))
    second = server_pid(d.client.submit(TEAM, ask).wait(timeout=60))
    assert second == first  # opened lazily by the first run, reused by the next one
    assert os.getpgid(parent_of(first)) == worker.pgid  # the worker process started it

    kill_and_wait(first)  # the server dies between two runs
    third = server_pid(d.client.submit(TEAM, ask).wait(timeout=60))
    assert third != first and process_alive(third)
    # one call per run reached a server; none failed and none was sent twice
    assert counter.read_text().splitlines() == ["pid", "pid", "pid"]
