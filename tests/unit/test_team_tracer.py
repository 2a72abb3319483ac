"""``create_team(tracer=...)``: the team's own tracer, in one process.

On team ``crew`` (tests/support/trace_scenarios.py): a query that passes no tracer is traced by the team's (one root, the lead's
and the member's runs under it); a query's own tracer wins; a drain uses the
team's; a tracer without ``on_event`` is refused.
"""

from __future__ import annotations

from typing import Any

import pytest

from lattice_worker import ConfigError
from lattice_worker.tracing import define_context_tracer
from tests.support.trace_scenarios import team as crew


def recorder() -> tuple[Any, list[dict[str, Any]]]:
    events: list[dict[str, Any]] = []
    return define_context_tracer(on_event=events.append), events


def starts(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(e["source"]["kind"], e["source"]["name"]) for e in events if e["type"] == "run_start"]


async def test_a_query_without_a_tracer_is_traced_by_the_teams_under_one_root():
    tracer, events = recorder()
    team = crew(tracer)
    assert team.tracer is tracer
    result = await team.prompt("How many files?")
    assert result.result == "42"
    assert starts(events) == [("team", "crew"), ("team_lead", "boss"), ("team_member", "worker")]
    [root] = [e for e in events if e["type"] == "run_start" and e["source"]["kind"] == "team"]
    runs = [e for e in events if e["type"] == "run_start" and e["source"]["kind"] != "team"]
    assert all(e["parent_run_id"] == root["run_id"] and e["session_id"] == root["session_id"] for e in runs)


async def test_a_querys_own_tracer_wins_over_the_teams():
    team_tracer, team_events = recorder()
    query_tracer, query_events = recorder()
    await crew(team_tracer).prompt("How many files?", tracer=query_tracer)
    assert team_events == []
    assert starts(query_events)[0] == ("team", "crew")


async def test_a_drain_uses_the_teams_tracer():
    tracer, events = recorder()
    team = crew(tracer)
    await team.mailbox.send("crew::lead", "crew::worker", "count the files", work_item_id="w1")
    drained = await team.drain()
    assert drained.processed == 1
    # without a root run context (a drain has none) the member run is a plain agent run
    assert starts(events) == [("agent", "worker")]
    assert {e["type"] for e in events} >= {"team_agent", "team_message", "result"}


def test_a_tracer_without_on_event_is_refused():
    with pytest.raises(ConfigError, match="tracer must be a ContextTracer"):
        crew(object())
