"""Tools: ``tool()`` / ``@tool``, ``ToolDefinition``, ``ToolResult``, ``ToolContext``
(:mod:`.tool`); effects (:mod:`.effects`), recovery by effect (:mod:`.recovery`)
and deferred tools (:mod:`.tool_search`); the built-in workspace tools
(:mod:`.builtin`); skills (:mod:`.skills`).

Guide: ``docs/tool-effects.md``. See :mod:`.tool`.
"""

from .effects import (
    EFFECTS,
    Effect,
    LookupFound,
    LookupNotFound,
    LookupResult,
    LookupUnknown,
    Reconcile,
    builtin_tool_effect,
    effect_from_mcp_annotations,
)
from .tool import (
    TOOL_NAME_PATTERN,
    ToolContext,
    ToolDefinition,
    ToolInputError,
    ToolResult,
    tool,
)

__all__ = [
    "EFFECTS",
    "Effect",
    "LookupFound",
    "LookupNotFound",
    "LookupResult",
    "LookupUnknown",
    "Reconcile",
    "builtin_tool_effect",
    "effect_from_mcp_annotations",
    "TOOL_NAME_PATTERN",
    "ToolContext",
    "ToolDefinition",
    "ToolInputError",
    "ToolResult",
    "tool",
]
