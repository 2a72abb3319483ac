"""Which tracer traces a distributed run, and the flush a worker does at shutdown
(``lattice_worker.runtime.run.trace``)."""

from __future__ import annotations

import logging
from typing import Any

from lattice_worker import ScriptedModelClient, define_agent, text_turn
from lattice_worker.runtime.run.trace import flush_tracers, registry_tracers, run_tracer
from lattice_worker.team import create_team, team_member
from lattice_worker.tracing import define_context_tracer


def counting(fail: bool = False) -> tuple[Any, list[str]]:
    calls: list[str] = []

    def flush() -> None:
        calls.append("flush")
        if fail:
            raise RuntimeError("exporter down")

    return define_context_tracer(on_event=lambda e: None, flush=flush), calls


def spec(name: str, tracer: Any = None) -> Any:
    return define_agent(name=name, model_client=ScriptedModelClient([text_turn("ok")]), tracer=tracer)


def test_the_runs_tracer_is_the_teams_else_the_leads_else_none():
    team_tracer, _ = counting()
    lead_tracer, _ = counting()
    assert run_tracer(create_team(name="t1", lead=spec("lead"))) is None
    assert run_tracer(create_team(name="t2", lead=spec("lead", lead_tracer))) is lead_tracer
    both = create_team(name="t3", lead=spec("lead", lead_tracer), tracer=team_tracer)
    assert run_tracer(both) is team_tracer


async def test_a_worker_flushes_every_distinct_tracer_of_its_teams_and_survives_a_failing_one(caplog):
    shared, shared_calls = counting()
    member_tracer, member_calls = counting()
    broken, broken_calls = counting(fail=True)
    teams = [
        create_team(
            name="a",
            lead=spec("lead", shared),
            members=[
                team_member(name="m", agent=spec("m", member_tracer)),
                team_member(name="n", agent=spec("n")),
            ],
            tracer=shared,
        ),
        create_team(name="b", lead=spec("lead", broken)),
    ]
    assert {id(t) for t in registry_tracers(teams)} == {id(shared), id(member_tracer), id(broken)}
    with caplog.at_level(logging.WARNING, logger="lattice_worker.runtime"):
        await flush_tracers(teams)
    assert (shared_calls, member_calls, broken_calls) == (["flush"], ["flush"], ["flush"])
    assert "failed to flush at shutdown" in caplog.text
