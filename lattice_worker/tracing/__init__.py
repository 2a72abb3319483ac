"""Context tracing: the ``ContextTracer`` protocol and the built-in sinks.

Spec: AgentLattice "Context Tracing". See :mod:`.base` for the event envelope.
"""

from .base import ContextTracer, TraceContext, TraceEmitter, define_context_tracer
from .composite import create_composite_context_tracer
from .jsonl import create_jsonl_context_tracer

__all__ = [
    "ContextTracer",
    "TraceContext",
    "TraceEmitter",
    "create_composite_context_tracer",
    "create_jsonl_context_tracer",
    "define_context_tracer",
]
