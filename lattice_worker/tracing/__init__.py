"""Context tracing: the ``ContextTracer`` protocol and the built-in sinks.

See :mod:`.base` for the event envelope and :mod:`.projection` for how the
LangSmith, Langfuse and OpenTelemetry tracers turn events into runs. Their
packages are optional extras, imported only when such a tracer is created.
"""

from .base import ContextTracer, TraceContext, TraceEmitter, define_context_tracer, trace_carrier
from .composite import create_composite_context_tracer
from .jsonl import create_jsonl_context_tracer
from .langfuse_tracer import create_langfuse_context_tracer
from .langsmith_tracer import create_langsmith_context_tracer
from .otel_tracer import create_otel_context_tracer

__all__ = [
    "ContextTracer",
    "TraceContext",
    "TraceEmitter",
    "create_composite_context_tracer",
    "create_jsonl_context_tracer",
    "create_langfuse_context_tracer",
    "create_langsmith_context_tracer",
    "create_otel_context_tracer",
    "define_context_tracer",
    "trace_carrier",
]
