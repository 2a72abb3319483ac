"""SDK events yielded by ``Agent.query()``.

Every event is a pydantic model with a ``type`` field; ``event.model_dump()``
is its wire dict and :func:`parse_sdk_message` reads one back. Order within a
query: one ``system`` (``subtype="init"``), then per model turn any
``stream_event`` items (streaming only), one ``assistant``, and -- when the turn
called tools -- one ``user`` for the whole batch; finally exactly one
``result``. With ``auto_compact``, a ``system`` event with
``subtype="compaction"`` comes between turns when the history was compacted.
The prompt itself is never echoed as an event.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

ResultSubtype = Literal[
    "success",
    "interrupted",
    "error",
    "error_max_turns",
    "error_abort",
    "error_timeout",
    "error_missing_output",
    "suspended",
]
"""``suspended`` is only produced when a query ``runtime`` raises ``SuspendQuery``
(distributed runtime, docs/contracts.md); it is not an error."""


class _Event(BaseModel):
    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)


class SystemMessage(_Event):
    """A ``system`` event: ``subtype="init"`` (session initialisation, the first
    event of every query) or ``subtype="compaction"`` (the history was compacted).

    ``tools`` lists the tool names the model is offered (``submit_output`` included
    when ``output_schema`` is set); ``model`` is the configured model name or ``None``
    (client default).

    Compaction events also carry ``trigger`` (``"threshold"``: the last response
    reported more input tokens than ``threshold_tokens``; ``"overflow"``: a
    request did not fit the context window and the turn is retried),
    ``compacted_messages`` (older messages replaced by the summary),
    ``retained_messages`` (latest messages kept as they were) and ``usage`` (the
    summary request's own token counts, also included in the result's ``usage``).
    They are ``None`` on ``init`` events.
    """

    type: Literal["system"] = "system"
    subtype: Literal["init", "compaction"] = "init"
    session_id: str
    model: str | None = None
    name: str | None = None
    tools: list[str] = Field(default_factory=list)
    stream: bool = True
    trigger: Literal["threshold", "overflow"] | None = None
    compacted_messages: int | None = None
    retained_messages: int | None = None
    usage: dict[str, int] | None = None


class StreamEvent(_Event):
    """One raw provider stream event (an Anthropic SSE event as a dict), emitted
    while the model is still responding, only when ``stream=True``."""

    type: Literal["stream_event"] = "stream_event"
    session_id: str
    event: dict[str, Any]


class AssistantMessage(_Event):
    """One assembled model turn.

    ``message`` is ``AssistantModelMessage.to_dict()``: ``role``, ``content`` (text /
    tool_use / thinking blocks), and when the client reports them ``usage``,
    ``stop_reason``, ``provider_response_id`` and ``model``. ``turn`` is the 1-based
    model request number within the query.
    """

    type: Literal["assistant"] = "assistant"
    session_id: str
    turn: int
    message: dict[str, Any]


class UserMessage(_Event):
    """The results of one whole tool batch, as sent back to the model.

    ``message`` is ``{"role": "user", "content": [tool_result blocks in tool_use order]}``.
    ``tool_use_result`` is a convenience view: the single result's ``content``
    (str or list of blocks) when the batch had one call, else the list of result
    blocks. ``error`` is the first failed call's error message, or ``None``.
    """

    type: Literal["user"] = "user"
    session_id: str
    message: dict[str, Any]
    tool_use_result: Any = None
    error: str | None = None


class ResultMessage(_Event):
    """The terminal event, exactly one per query.

    Fields:
        subtype: see :data:`ResultSubtype`.
        is_error: true for the ``error*`` subtypes; false for ``success``,
            ``interrupted`` and ``suspended``.
        result: the final text -- the last assistant turn's text blocks joined; for
            a run ended by a tool's ``end_turn``, that tool's text; for a
            ``submit_output`` run, the payload as JSON text. On error subtypes it is
            the last assistant text of this query (often ``""``).
        structured_result: the validated ``submit_output`` payload (JSON-ready:
            pydantic models are dumped with ``model_dump(mode="json")``), or an
            ``end_turn`` tool's ``structured_result``; else ``None``.
        usage: token counts summed over this query's model requests (zeros when the
            client reports none): ``input_tokens``, ``output_tokens``,
            ``cache_creation_input_tokens``, ``cache_read_input_tokens``.
        stop_reason: the last model response's stop reason (check ``"max_tokens"``).
        num_turns: model requests made by this query.
        duration_ms: wall time of the query in **milliseconds**.
        error: the error message, or ``None``.
        error_type: the error's class name (``"APIError"``, ``"ModelTimeoutError"``,
            ``"MaxTurnsError"``, ``"AbortError"``, ``"MissingOutputError"``...), or ``None``.
        exception: the exception object itself (not serialised); see :meth:`raise_for_error`.
    """

    type: Literal["result"] = "result"
    subtype: ResultSubtype
    is_error: bool
    session_id: str
    result: str = ""
    structured_result: Any = None
    usage: dict[str, int] = Field(default_factory=dict)
    stop_reason: str | None = None
    num_turns: int = 0
    duration_ms: int = 0
    error: str | None = None
    error_type: str | None = None
    exception: BaseException | None = Field(default=None, exclude=True, repr=False)

    def raise_for_error(self) -> None:
        """Raise the result's error when ``is_error`` is true (a no-op otherwise).

        Raises the original exception when it is known, else a ``LatticeError``
        carrying ``error``.
        """
        if not self.is_error:
            return
        if self.exception is not None:
            raise self.exception
        from ..errors import LatticeError

        raise LatticeError(self.error or self.subtype)


SDKMessage = Annotated[
    SystemMessage | StreamEvent | AssistantMessage | UserMessage | ResultMessage,
    Field(discriminator="type"),
]
"""Union of every event ``Agent.query()`` yields, discriminated by ``type``."""

_ADAPTER: TypeAdapter[Any] = TypeAdapter(SDKMessage)


def parse_sdk_message(
    data: dict[str, Any],
) -> SystemMessage | StreamEvent | AssistantMessage | UserMessage | ResultMessage:
    """Read an event back from its wire dict (``event.model_dump()``).

    Raises ``pydantic.ValidationError`` on a dict that is not an SDK event.
    """
    return _ADAPTER.validate_python(data)


__all__ = [
    "AssistantMessage",
    "ResultMessage",
    "ResultSubtype",
    "SDKMessage",
    "StreamEvent",
    "SystemMessage",
    "UserMessage",
    "parse_sdk_message",
]
