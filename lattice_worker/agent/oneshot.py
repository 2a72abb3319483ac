"""``query(prompt, **options)``: one question, one fresh agent, one event stream.

For a script or a request handler that needs one answer and no conversation:
``async for event in query("Summarise README.md", model=..., max_turns=5): ...``.
It builds an agent with :func:`~lattice_worker.agent.agent.create_agent` from
the agent options among ``options``, runs one query on ``prompt`` with the
query options among them, and yields that query's events.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from ..errors import ConfigError
from .agent import create_agent
from .events import SDKMessage
from .options import UNKNOWN_OPTION_HINT, AgentOptions, QueryOptions

#: Query options a one-shot query takes as query options (the rest of the
#: query options are agent options too, and go to the agent).
_QUERY_ONLY = frozenset(QueryOptions.model_fields) - frozenset(AgentOptions.model_fields)


def query(prompt: Any, /, **options: Any) -> AsyncIterator[SDKMessage]:
    """Run ``prompt`` on a new agent and return its events (an async iterator:
    ``system``, ``stream_event``..., ``assistant``, ``user``, one ``result``).

    ``prompt``: a str or a list of content blocks. ``options``: any agent option
    of ``create_agent`` (``model``, ``system_prompt``, ``tools``, ``max_turns``,
    ``auto_compact``, ``model_client``...) and any query option (``stream``,
    ``output_format``, ``signal``...). The options both accept
    (``thinking_config``, ``reasoning_effort``, ``request_timeout_ms``,
    ``tracer``) are given to the agent, to the same effect.

    Raises :class:`ConfigError` at once for an unknown option, a bad value or
    an empty prompt (``None`` is refused too: a fresh agent has no history to
    continue). Errors of the run itself end the stream with an error ``result``,
    as for ``Agent.query``.
    """
    if prompt is None:
        raise ConfigError("query: the prompt is required (a new agent has no history to continue)")
    agent_options: dict[str, Any] = {}
    query_options: dict[str, Any] = {}
    for key, value in options.items():
        if key in _QUERY_ONLY:
            query_options[key] = value
        elif key in AgentOptions.model_fields:
            agent_options[key] = value
        else:
            raise ConfigError(f'query: unknown option "{key}". {UNKNOWN_OPTION_HINT}')
    try:
        agent = create_agent(**agent_options)
    except ConfigError as exc:
        raise ConfigError(str(exc).replace("create_agent:", "query:", 1)) from None
    return agent.query(prompt, **query_options)


__all__ = ["query"]
