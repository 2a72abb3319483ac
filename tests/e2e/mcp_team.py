"""A team whose member uses an MCP stdio server (tests/support/mcp_stdio_server.py),
for the distributed test in test_mcp_workers.py.

Team "e2e_mcp": the lead of tests/e2e/teams.py (it follows the plan in the
prompt) and the template member ``docs``, declared with ``mcp_servers`` so each
worker process opens its own connection lazily and reuses it across runs. The
member calls the server's ``pid`` tool once and replies ``pid <n>`` (or
``error <text>`` when the call failed). ``MCP_E2E_COUNTER``, when set, is the
file the server appends one line to per call.
"""

from __future__ import annotations

import os
from typing import Any

from lattice_worker import AssistantModelMessage, ScriptedModelClient, define_agent
from lattice_worker.team import create_team, team_member
from tests.e2e.teams import _first_text, _text, _tool_use, lead_model
from tests.support.mcp_servers import stdio_config


def docs_model(request: Any) -> AssistantModelMessage:
    """Stateless member: call ``docs_pid``, ``team_reply`` with what it returned, then stop."""
    messages = request.messages
    start = max(i for i, m in enumerate(messages) if m.get("role") == "user" and _first_text(m))
    item = messages[start:]
    if len(item) == 1:
        return AssistantModelMessage(content=[_tool_use("docs_pid", {}, "toolu_pid")], stop_reason="tool_use")
    if len(item) == 3:
        block = item[2]["content"][0]
        content = block.get("content")
        text = content if isinstance(content, str) else "".join(b.get("text", "") for b in content)
        reply = f"error {text}" if block.get("is_error") else f"pid {text}"
        return AssistantModelMessage(
            content=[_tool_use("team_reply", {"content": reply}, "toolu_reply")], stop_reason="tool_use"
        )
    return _text("replied")


def build_team() -> Any:
    counter = os.environ.get("MCP_E2E_COUNTER")
    docs = define_agent(
        name="docs",
        model_client=ScriptedModelClient(docs_model),
        mcp_servers={"docs": stdio_config(counter=counter)},
        max_turns=8,
    )
    return create_team(
        name="e2e_mcp",
        lead=define_agent(name="lead", model_client=ScriptedModelClient(lead_model), max_turns=8),
        members=[team_member(name="docs", agent=docs, role="librarian")],
    )


team = build_team()
