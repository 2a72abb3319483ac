"""End-to-end: a distributed lead compacts its history, suspends, and resumes on
another worker from the compacted history.

The "e2e_compact" lead (tests/e2e/teams.py) reports input tokens past its
``auto_compact`` threshold on every response. Its first segment runs on one
lead worker: the tool batch (a handoff and an ask) is recorded, the history is
compacted (the plan prompt summarised, the batch kept) and the run suspends.
That worker is stopped; the members run on a member worker; the resume runs
on a second lead worker, whose lead starts from the compacted history.
"""

from __future__ import annotations

import json

import pytest

from lattice_worker.agent.compaction import SUMMARY_PREFIX
from tests.e2e.teams import COMPACT_REPORTED_TOKENS, PLAN_MARK, SUMMARY_USAGE, plan

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.timeout(150)]

TEAM = "tests.e2e.teams:compact_team"


def test_a_lead_compacts_then_resumes_on_another_worker_from_the_compacted_history(deployment):
    d = deployment
    first_lead = d.worker(TEAM, "--member", "lead", "--concurrency", "1")
    prompt = plan(("worker", "handoff", "a"), ("other", "ask", "b"))
    handle = d.client.submit(TEAM, prompt)
    # the segment's task has ended (its writes done) before the worker is stopped: Proc.stop
    # signals the whole process group, pool children included
    first_lead.wait_log(r"Task lattice\.run_lead\[[^\]]+\] succeeded in [0-9.e-]+s: 'suspended'", timeout=45)
    assert d.client.get_run(handle.run_id).status.value == "suspended"
    first_lead.stop()
    # the history in Redis is the compacted one: the summary, then the kept tool batch
    history_key = f"{d.prefix}:run:{{run:{handle.run_id}}}:history"  # the lead's conversation
    history = [json.loads(x) for x in d.redis.lrange(history_key, 0, -1)]
    assert [m["role"] for m in history] == ["user", "assistant", "user"], history
    summary = history[0]["content"][0]["text"]
    assert summary == SUMMARY_PREFIX + PLAN_MARK + prompt
    assert [b["name"] for b in history[1]["content"]] == ["worker", "other"]

    d.worker(TEAM, "--member", "worker", "--member", "other", "--concurrency", "1")
    d.worker(TEAM, "--member", "lead", "--concurrency", "1")
    result = handle.wait(timeout=60)
    assert result.status == "completed", result
    assert result.result == "final: ask:worked[b] | done:worked[a]"
    assert d.executions("a") == 1 and d.executions("b") == 1
    # two lead turns, in two processes: the second one started from the summary (and its
    # request had the handoff report merged into the tool results turn: 3 messages, not 4)
    requests = [json.loads(x) for x in d.redis.lrange(f"{d.prefix}:test:lead_requests", 0, -1)]
    assert len(requests) == 2 and requests[0]["pid"] != requests[1]["pid"]
    assert requests[0]["messages"] == 1 and requests[0]["first"] == prompt[:60]
    assert requests[1]["messages"] == 3 and requests[1]["first"] == (SUMMARY_PREFIX + PLAN_MARK)[:60]
    # the compaction event is in the run's stream, and its tokens in the run's usage
    events = list(d.client.events(handle.run_id, timeout=10))
    [compaction] = [e for e in events if e.get("type") == "system" and e.get("subtype") == "compaction"]
    assert compaction["trigger"] == "threshold"
    assert compaction["compacted_messages"] == 1 and compaction["retained_messages"] == 2
    assert compaction["usage"]["input_tokens"] == SUMMARY_USAGE["input_tokens"]
    assert result.usage["input_tokens"] == 2 * COMPACT_REPORTED_TOKENS + SUMMARY_USAGE["input_tokens"]
