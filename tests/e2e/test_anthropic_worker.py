"""End-to-end with the real ``anthropic`` SDK inside a worker process.

The example team runs on a ``lattice worker`` with ``ANTHROPIC_API_KEY`` and
``ANTHROPIC_BASE_URL`` pointing at the fake Messages API server in this test
process (tests/support/fake_anthropic.py, SSE streaming included). The server
answers every request with the example's own stateless scripted logic, so
the run goes through the SDK's HTTP + streaming path for all agents: lead
handoffs, member tool calls and replies, and the lead's resumed turn in
another task.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from lattice_worker.examples.team import demo_prompt, scripted_demo_model
from tests.e2e.conftest import Deployment
from tests.support.fake_anthropic import FakeAnthropicServer, MessageReply, RecordedRequest

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.timeout(150)]


def _respond(request: RecordedRequest) -> MessageReply:
    body = request.body
    turn = scripted_demo_model(SimpleNamespace(messages=body["messages"], tools=body.get("tools") or []))
    return MessageReply(
        list(turn.content), stop_reason=turn.stop_reason, usage={"input_tokens": 7, "output_tokens": 3}
    )


def test_example_team_through_the_anthropic_sdk_in_a_worker(deployment: Deployment, tmp_path: Path):
    corpus = tmp_path / "docs"
    corpus.mkdir()
    (corpus / "one.txt").write_text("alpha beta\nbeta gamma beta\n")
    (corpus / "two.txt").write_text("no match\n")
    with FakeAnthropicServer(_respond) as server:
        deployment.worker(
            "lattice_worker.examples.team:team",
            "--concurrency",
            "1",
            env={"ANTHROPIC_API_KEY": "sk-test", "ANTHROPIC_BASE_URL": server.url},
        )
        result = deployment.client.submit(
            "lattice_worker.examples.team:team", demo_prompt(str(corpus), "beta")
        ).wait(timeout=60)
        requests = server.requests
    assert result.status == "completed", result
    # one.txt: both lines hold "beta"; two.txt: none
    assert '"beta" is on 2 lines in 1 of 2 text files' in result.result
    assert "3 lines in 2 text files" in result.result
    # lead (x2: handoff turn, resumed turn) + searcher (x2) + counter (x2), all over HTTP, streamed
    assert len(requests) == 6 and server.unexpected == []
    assert all(r.path == "/v1/messages" and r.stream for r in requests)
    assert {r.headers.get("x-api-key") or r.headers.get("authorization") for r in requests} <= {
        "sk-test",
        "Bearer sk-test",
    }
    # the resumed lead turn carried the handoff reports as the next user message
    last_lead = [r for r in requests if "searcher" in {t["name"] for t in r.body.get("tools", [])}][-1]
    assert "Team handoff reports (2)" in str(last_lead.messages[-1]["content"])
    # usage reported by the provider is summed over the run's lead turns
    assert result.usage["input_tokens"] == 14 and result.usage["output_tokens"] == 6
