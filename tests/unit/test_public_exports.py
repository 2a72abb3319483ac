"""docs/architecture.md ("Public API") pins public names to packages; these tests import them from there."""

from __future__ import annotations

import subprocess
import sys

import pytest

WORKER_NAMES = [
    "create_agent",
    "create_bare_agent",
    "define_agent",
    "is_agent_spec",
    "AbortController",
    "AbortSignal",
    "tool",
    "ToolResult",
    "ToolContext",
    "SUBMIT_OUTPUT_TOOL_NAME",
    "AgentHooks",
    "create_composite_agent_hooks",
    "create_jsonl_history_store",
    "define_history_store",
    "create_jsonl_context_tracer",
    "create_composite_context_tracer",
    "define_context_tracer",
    "create_langsmith_context_tracer",
    "create_langfuse_context_tracer",
    "create_otel_context_tracer",
    "ScriptedModelClient",
    "AnthropicModelClient",
    "agent_tool",
    "create_team",
    "team_member",
    "RunnerOptions",
    "ModelClient",
    "ModelRequest",
    "AssistantModelMessage",
    # round 2: built-in workspace tools and skills
    "create_builtin_tools",
    "create_agent_workspace_tools",
    "skill",
    "load_skill",
    "SkillDefinition",
]


def test_every_pinned_worker_name_imports_from_lattice_worker():
    import lattice_worker

    missing = [name for name in WORKER_NAMES if not hasattr(lattice_worker, name)]
    assert missing == []
    assert set(WORKER_NAMES) <= set(lattice_worker.__all__)


def test_anthropic_model_client_is_the_same_class_from_every_package():
    from lattice_worker import AnthropicModelClient
    from lattice_worker.agent import AnthropicModelClient as from_agent
    from lattice_worker.agent.anthropic_client import AnthropicModelClient as original

    assert AnthropicModelClient is from_agent is original
    client = AnthropicModelClient(api_key="sk-test", base_url="http://127.0.0.1:1", max_retries=0)
    assert type(client).__name__ == "AnthropicModelClient"


@pytest.mark.parametrize("module", ["lattice_worker", "lattice_worker.agent"])
def test_unknown_names_still_raise_attribute_error(module):
    imported = __import__(module, fromlist=["_"])
    with pytest.raises(AttributeError, match="no_such_name"):
        imported.no_such_name  # noqa: B018
    with pytest.raises(ImportError):
        exec(f"from {module} import no_such_name", {})


def test_importing_lattice_worker_does_not_import_the_anthropic_sdk_until_the_client_is_used():
    code = (
        "import sys, lattice_worker, lattice_worker.agent\n"
        "print('anthropic' in sys.modules)\n"
        "from lattice_worker import AnthropicModelClient\n"
        "print('anthropic' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["False", "True"]
