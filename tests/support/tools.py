"""Calling a tool the way the agent loop does: parse the model's input, then invoke."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lattice_worker import ToolContext, ToolDefinition, ToolResult


def by_name(tools: list[ToolDefinition]) -> dict[str, ToolDefinition]:
    return {t.name: t for t in tools}


async def call(
    tools: list[ToolDefinition], name: str, args: dict[str, Any], *, signal: Any = None
) -> ToolResult:
    """Run ``name`` from ``tools`` on ``args`` (validated like model input)."""
    definition = by_name(tools)[name]
    ctx = ToolContext(tool_use_id=f"toolu_{name}", tool_name=name, signal=signal)
    return await definition.invoke(definition.parse_input(args), ctx)


def text(result: ToolResult) -> str:
    assert isinstance(result.content, str)
    return result.content


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file below ``root`` (relative path -> bytes): to assert nothing changed."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
