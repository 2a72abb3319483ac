"""``AnthropicModelClient``: the built-in :class:`ModelClient` on the official ``anthropic`` SDK.

It speaks the Anthropic Messages API to Anthropic itself or to any compatible
endpoint (DeepSeek, Kimi, a local fake server) chosen with ``base_url``.

Spec sections: "Provider Compatibility" (wire format of ``thinking``,
``reasoning_effort`` and ``output_config``), "Configuration" (thinking and
reasoning options), "Agent Loop" -> "Token usage and truncation" (``usage``,
``stop_reason``, ``provider_response_id``, ``model``) and "Streaming Events"
(raw provider events forwarded while they arrive).

Wire format produced from a :class:`~lattice_worker.agent.model.ModelRequest`:

=========================================  ==============================================================
request field                              sent as
=========================================  ==============================================================
``thinking={"type": "adaptive"}``          ``"thinking": {"type": "adaptive"}``
``thinking={"type": "enabled",``           ``"thinking": {"type": "enabled", "budget_tokens": min(N, max_tokens - 1)}``
``"budget_tokens": N}``                    (``budgetTokens`` is accepted as a spelling of ``budget_tokens``;
                                           below 1,024 after the cap -> ``ConfigError``)
``thinking={"type": "disabled"}``          ``"thinking": {"type": "disabled"}`` -- sent explicitly, because some
                                           providers (DeepSeek) think by default
``thinking=None``                          nothing
``reasoning_effort="low"|"high"|"max"``    top-level ``"reasoning_effort": "<value>"`` (Kimi convention)
``output_format={"type": "json_schema",``  ``"output_config": {"format": {"type": "json_schema", "schema": S}}``
``"schema": S}``
``output_format="json"``                   ``"output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}}``
                                           -- the Messages API has only the ``json_schema`` format type, so plain
                                           JSON is requested as "any JSON object"
``timeout_ms=N``                           the SDK's per-request ``timeout`` of ``N / 1000`` **seconds**, plus an
                                           overall deadline of ``N`` ms over the whole call (retries included)
=========================================  ==============================================================

``thinking``, ``reasoning_effort`` and ``output_config`` travel in the SDK's
``extra_body`` so they reach the wire unchanged whatever the installed SDK
version knows about them.

Retries are the SDK's own (``max_retries``; 408/409/429/5xx/529 and connection
errors, honouring ``retry-after-ms`` / ``retry-after``). Every SDK failure is
re-raised as :class:`~lattice_worker.errors.APIError` (``status_code``,
``body``), except timeouts, which become
:class:`~lattice_worker.errors.ModelTimeoutError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import inspect
import json
import os
import threading
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import anthropic

from ..errors import AbortError, APIError, ConfigError, LatticeError, ModelTimeoutError
from .model import AssistantModelMessage, ModelRequest, TokenUsage, capped_thinking_budget

try:  # the SDK's HTTP library: ``httpx`` in most releases, ``httpx2`` in some
    import httpx2 as _httpx
except ImportError:  # pragma: no cover - depends on the installed SDK
    import httpx as _httpx  # type: ignore[no-redef]

if TYPE_CHECKING:
    from .abort import AbortSignal

DEFAULT_MODEL = "claude-sonnet-4-6"
"""The model a request gets when neither the Agent (``model=``) nor the request names one.
(``claude-sonnet-4-5`` reached end-of-life on 2026-11-30 per the ``anthropic`` SDK's deprecation list.)"""

DEEPSEEK_ANTHROPIC_BASE_URL = "https://api.deepseek.com/anthropic"
"""Used as ``base_url`` when the key comes from ``DEEPSEEK_API_KEY`` and no base URL is configured."""

REASONING_EFFORTS = ("low", "high", "max")
THINKING_TYPES = ("enabled", "adaptive", "disabled")

# Error types of the Anthropic error body -> the HTTP status that normally carries them.
# Used for an ``error`` event inside an SSE stream, which arrives on an HTTP 200 response.
_ERROR_TYPE_STATUS = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}

_TOOL_BLOCK_TYPES = frozenset({"tool_use", "server_tool_use", "mcp_tool_use"})

StreamEventCallback = Callable[[dict[str, Any]], Awaitable[None] | None]


class _LoopHttpClient(anthropic.DefaultAsyncHttpxClient):
    """The SDK's default HTTP client, bound to the event loop that created it.

    When it is garbage-collected unclosed it only schedules its own close on that
    loop, never on another one: the SDK's default client would try to close
    connections of a finished loop on whichever loop is running then, which
    fails with "Event loop is closed".
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._lattice_loop = weakref.ref(loop)

    def __del__(self) -> None:
        try:
            if self.is_closed:
                return
            loop = self._lattice_loop()
            if loop is not None and not loop.is_closed() and asyncio.get_running_loop() is loop:
                loop.create_task(self.aclose())
        except Exception:  # noqa: BLE001 - nothing to do at garbage collection
            pass


async def _close_at_loop_shutdown(sdk: Any) -> AsyncIterator[None]:
    """Suspended after one step, it is closed by ``loop.shutdown_asyncgens()`` (which
    ``asyncio.run`` calls while the loop still runs), and then closes ``sdk``'s
    connections on their own loop."""
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            await sdk.close()


class AnthropicModelClient:
    """A :class:`~lattice_worker.agent.model.ModelClient` over ``anthropic.AsyncAnthropic``.

    Args:
        api_key: the provider key. Falls back to ``ANTHROPIC_API_KEY``, then
            ``DEEPSEEK_API_KEY``.
        base_url: the Messages API root (e.g. ``https://api.deepseek.com/anthropic``).
            Falls back to ``ANTHROPIC_BASE_URL``; when the key came from
            ``DEEPSEEK_API_KEY`` and no base URL is set anywhere, DeepSeek's
            Anthropic endpoint is used.
        max_retries: retries the SDK makes on 408/409/429/5xx/529 and connection
            errors (a non-negative int; 0 disables retrying).
        default_model: the model used when a request names none
            (default :data:`DEFAULT_MODEL`, ``"claude-sonnet-4-6"``).
        client: a ready ``AsyncAnthropic`` (or compatible) instance to use for every
            request instead of creating one. The caller then owns it and must only
            use this model client on the event loop that client belongs to.

    Without ``client``, one ``AsyncAnthropic`` is created lazily **per event loop**
    (an HTTP connection pool cannot be shared between loops), so one instance is
    safe to use from ``prompt_sync``, Celery tasks and async code alike.

    Raises:
        ConfigError: an argument of the wrong type or value.
    """

    def __init__(
        self,
        api_key: str | None = None,
        base_url: str | None = None,
        max_retries: int = 2,
        default_model: str = DEFAULT_MODEL,
        client: Any = None,
    ) -> None:
        if api_key is not None and not isinstance(api_key, str):
            raise ConfigError(f"AnthropicModelClient: api_key must be a string, got {type(api_key).__name__}")
        if base_url is not None and (not isinstance(base_url, str) or not base_url.strip()):
            raise ConfigError(f"AnthropicModelClient: base_url must be a non-empty string, got {base_url!r}")
        if not isinstance(max_retries, int) or isinstance(max_retries, bool) or max_retries < 0:
            raise ConfigError(f"AnthropicModelClient: max_retries must be an int >= 0, got {max_retries!r}")
        if not isinstance(default_model, str) or not default_model.strip():
            raise ConfigError(
                f"AnthropicModelClient: default_model must be a non-empty string, got {default_model!r}"
            )
        if client is not None and not hasattr(client, "messages"):
            raise ConfigError("AnthropicModelClient: client must be an anthropic.AsyncAnthropic instance")

        key_from_deepseek = False
        if api_key is None:
            api_key = os.environ.get("ANTHROPIC_API_KEY") or None
            if api_key is None:
                api_key = os.environ.get("DEEPSEEK_API_KEY") or None
                key_from_deepseek = api_key is not None
        if base_url is None:
            base_url = os.environ.get("ANTHROPIC_BASE_URL") or None
            if base_url is None and key_from_deepseek:
                base_url = DEEPSEEK_ANTHROPIC_BASE_URL

        self.api_key = api_key
        self.base_url = base_url
        self.max_retries = max_retries
        self.default_model = default_model
        self._shared_client = client
        self._lock = threading.Lock()
        self._clients: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, tuple[Any, AsyncIterator[None]]
        ] = weakref.WeakKeyDictionary()

    def __repr__(self) -> str:
        return (
            f"AnthropicModelClient(base_url={self.base_url!r}, max_retries={self.max_retries}, "
            f"default_model={self.default_model!r})"
        )

    # -- SDK client per event loop -------------------------------------------------------------

    async def _sdk_client(self) -> Any:
        if self._shared_client is not None:
            return self._shared_client
        loop = asyncio.get_running_loop()
        with self._lock:
            entry = self._clients.get(loop)
            if entry is None:
                sdk = anthropic.AsyncAnthropic(
                    api_key=self.api_key,
                    base_url=self.base_url,
                    max_retries=self.max_retries,
                    http_client=_LoopHttpClient(loop),
                )
                closer = _close_at_loop_shutdown(sdk)
                entry = self._clients[loop] = (sdk, closer)
            else:
                closer = None
        if closer is not None:
            await closer.__anext__()  # registers it with the loop's async-generator shutdown
        return entry[0]

    async def aclose(self) -> None:
        """Close the SDK client created for the running event loop (a given ``client`` is left open).

        Optional: a per-loop client is also closed when its loop shuts down through
        ``asyncio.run`` (or any runner that calls ``loop.shutdown_asyncgens()``).
        """
        loop = asyncio.get_running_loop()
        with self._lock:
            entry = self._clients.pop(loop, None)
        if entry is not None:
            await entry[1].aclose()

    # -- ModelClient -------------------------------------------------------------------------

    async def create_message(self, request: ModelRequest) -> AssistantModelMessage:
        """Send one Messages API request and return the assembled assistant turn.

        With ``request.stream`` the request is streamed: each raw provider event is
        passed, as a wire-format dict (``{"type": "content_block_delta", ...}``), to
        ``request.on_stream_event`` as soon as it arrives, and the message is
        assembled from the events (tool input fragments are joined and parsed once
        per block; an empty input is ``{}``, one that is not valid JSON stays the
        joined text for the loop to answer with an error result). Without it one
        JSON response is read.

        The result's ``content`` holds wire-format block dicts; ``thinking`` blocks
        keep their ``signature`` and ``redacted_thinking`` blocks their ``data``, so
        they can be sent back unchanged. ``usage``, ``stop_reason``,
        ``provider_response_id`` (the message id) and ``model`` (the model that
        served the reply) are filled on both paths.

        Raises:
            ConfigError: a malformed request field (``thinking``, ``reasoning_effort``,
                ``output_format``, ``timeout_ms``, ``max_tokens``), or no API key at all.
            APIError: the provider answered with an error (after the SDK's retries),
                could not be reached, or sent a malformed reply.
            ModelTimeoutError: ``timeout_ms`` passed (also a ``TimeoutError``).
            AbortError: ``request.signal`` was aborted while the request ran.
        """
        params = build_request_params(request, default_model=self.default_model)
        sdk = await self._sdk_client()
        if request.stream:
            work = self._streamed(sdk, params, request.on_stream_event)
        else:
            work = self._single(sdk, params)
        timeout_ms = request.timeout_ms
        try:
            if timeout_ms is None:
                return await _run_with_signal(work, request.signal)
            try:
                async with asyncio.timeout(timeout_ms / 1000):
                    return await _run_with_signal(work, request.signal)
            except TimeoutError as exc:
                if isinstance(exc, LatticeError):
                    raise
                raise ModelTimeoutError(f"model request exceeded timeout_ms={timeout_ms} ms") from exc
        finally:
            if inspect.getcoroutinestate(work) == inspect.CORO_CREATED:
                work.close()  # aborted before it ran: no "never awaited" warning

    async def _single(self, sdk: Any, params: dict[str, Any]) -> AssistantModelMessage:
        try:
            message = await sdk.messages.create(**params)
        except anthropic.AnthropicError as exc:
            raise convert_sdk_error(exc) from exc
        except ValueError as exc:  # the SDK refuses long non-streaming requests up front
            raise ConfigError(f"AnthropicModelClient: {exc}") from exc
        except TypeError as exc:
            raise _credentials_error(exc) from exc
        # warnings=False: a provider may send a tool input that is not an object (the loop answers it)
        data = message.to_dict(mode="json", warnings=False) if hasattr(message, "to_dict") else dict(message)
        content = [_clean_block(block) for block in data.get("content") or []]
        for block in content:
            if block.get("type") in _TOOL_BLOCK_TYPES and block.get("input") in (None, ""):
                block["input"] = {}
        return AssistantModelMessage(
            content=content,
            usage=TokenUsage.from_any(data.get("usage") or {}),
            stop_reason=data.get("stop_reason"),
            provider_response_id=data.get("id"),
            model=data.get("model"),
        )

    async def _streamed(
        self, sdk: Any, params: dict[str, Any], on_event: StreamEventCallback | None
    ) -> AssistantModelMessage:
        assembler = StreamAssembler()
        try:
            stream = await sdk.messages.create(**params, stream=True)
        except anthropic.AnthropicError as exc:
            raise convert_sdk_error(exc) from exc
        except TypeError as exc:
            raise _credentials_error(exc) from exc
        try:
            async for event in stream:
                raw = event.to_dict(mode="json") if hasattr(event, "to_dict") else dict(event)
                if on_event is not None:
                    outcome = on_event(raw)
                    if inspect.isawaitable(outcome):
                        await outcome
                assembler.feed(raw)
        except anthropic.AnthropicError as exc:
            raise convert_sdk_error(exc) from exc
        except _httpx.TimeoutException as exc:
            raise ModelTimeoutError(f"model stream timed out: {exc}") from exc
        except _httpx.HTTPError as exc:
            raise APIError(f"model stream broke off: {type(exc).__name__}: {exc}") from exc
        except json.JSONDecodeError as exc:
            raise APIError(f"provider sent a stream event that is not JSON: {exc}") from exc
        finally:
            with contextlib.suppress(Exception):
                await stream.close()
        return assembler.result()


def _credentials_error(exc: TypeError) -> Exception:
    """The SDK raises a bare ``TypeError`` when it has no credentials to send; say
    what to set instead. Any other ``TypeError`` is returned unchanged."""
    if "authentication" not in str(exc):
        return exc
    return ConfigError(
        "AnthropicModelClient: no API key. Pass api_key= (create_agent(api_key=...)), or set "
        "ANTHROPIC_API_KEY (or DEEPSEEK_API_KEY, which also selects DeepSeek's endpoint)."
    )


# -- request serialisation -----------------------------------------------------------------------


def build_request_params(request: ModelRequest, *, default_model: str) -> dict[str, Any]:
    """The keyword arguments for ``AsyncAnthropic.messages.create`` (without ``stream``).

    Raises:
        ConfigError: a request field of the wrong type or value.
    """
    max_tokens = request.max_tokens
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise ConfigError(f"max_tokens must be a positive int, got {max_tokens!r}")
    if not isinstance(request.messages, list):
        raise ConfigError(f"messages must be a list, got {type(request.messages).__name__}")
    params: dict[str, Any] = {
        "model": request.model or default_model,
        "max_tokens": max_tokens,
        "messages": [_wire_message(m, i) for i, m in enumerate(request.messages)],
    }
    if request.system:
        params["system"] = request.system
    if request.tools:
        params["tools"] = list(request.tools)

    extra: dict[str, Any] = {}
    thinking = serialize_thinking(request.thinking, max_tokens)
    if thinking is not None:
        extra["thinking"] = thinking
    effort = serialize_reasoning_effort(request.reasoning_effort)
    if effort is not None:
        extra["reasoning_effort"] = effort
    output_config = serialize_output_format(request.output_format)
    if output_config is not None:
        extra["output_config"] = output_config
    if extra:
        params["extra_body"] = extra

    timeout_ms = request.timeout_ms
    if timeout_ms is not None:
        if not isinstance(timeout_ms, int | float) or isinstance(timeout_ms, bool) or timeout_ms <= 0:
            raise ConfigError(f"timeout_ms must be a positive number of milliseconds, got {timeout_ms!r}")
        params["timeout"] = timeout_ms / 1000
    return params


def _wire_message(message: Any, index: int) -> dict[str, Any]:
    """Only ``role`` and ``content`` go on the wire (history entries may carry usage or ids)."""
    if not isinstance(message, dict) or "role" not in message or "content" not in message:
        raise ConfigError(f"messages[{index}] must be a dict with 'role' and 'content', got {message!r:.200}")
    return {"role": message["role"], "content": message["content"]}


def serialize_thinking(config: Any, max_tokens: int) -> dict[str, Any] | None:
    """Map a thinking config to the wire ``thinking`` object (spec "Provider Compatibility").

    ``{"type": "enabled", "budget_tokens": N}`` (or ``budgetTokens``) becomes
    ``{"type": "enabled", "budget_tokens": min(N, max_tokens - 1)}``;
    ``{"type": "adaptive"}`` and ``{"type": "disabled"}`` are sent as they are;
    ``None`` sends nothing. Other keys of the config pass through unchanged.

    Raises:
        ConfigError: not a dict, an unknown ``type``, a missing / non-positive
            budget, or a capped budget below the provider's minimum of 1,024 tokens.
    """
    if config is None:
        return None
    if hasattr(config, "model_dump"):
        config = config.model_dump(exclude_none=True)
    if not isinstance(config, dict):
        raise ConfigError(f"thinking_config must be a dict like {{'type': 'adaptive'}}, got {config!r}")
    kind = config.get("type")
    if kind not in THINKING_TYPES:
        raise ConfigError(f"thinking_config type must be one of {THINKING_TYPES}, got {kind!r}")
    out = {k: v for k, v in config.items() if k not in ("budget_tokens", "budgetTokens")}
    if kind == "enabled":
        budget = config.get("budget_tokens", config.get("budgetTokens"))
        if not isinstance(budget, int) or isinstance(budget, bool) or budget < 1:
            raise ConfigError(
                f"thinking_config {{'type': 'enabled'}} needs budget_tokens as a positive int, got {budget!r}"
            )
        out["budget_tokens"] = capped_thinking_budget(budget, max_tokens)
    return out


def serialize_reasoning_effort(effort: Any) -> str | None:
    """Validate ``reasoning_effort`` (sent as the top-level ``reasoning_effort`` field).

    Raises:
        ConfigError: not one of ``"low"``, ``"high"``, ``"max"``.
    """
    if effort is None:
        return None
    if effort not in REASONING_EFFORTS:
        raise ConfigError(f"reasoning_effort must be one of {REASONING_EFFORTS}, got {effort!r}")
    return str(effort)


def serialize_output_format(output_format: Any) -> dict[str, Any] | None:
    """Map ``output_format`` to the wire ``output_config`` object.

    ``"json"`` -> ``{"format": {"type": "json_schema", "schema": {"type": "object"}}}``;
    ``{"type": "json_schema", "schema": S}`` -> ``{"format": {"type": "json_schema", "schema": S}}``.

    Raises:
        ConfigError: anything else, or a schema that is not a dict.
    """
    if output_format is None:
        return None
    if output_format == "json":
        return {"format": {"type": "json_schema", "schema": {"type": "object"}}}
    if isinstance(output_format, dict) and output_format.get("type") == "json_schema":
        schema = output_format.get("schema")
        if not isinstance(schema, dict):
            raise ConfigError(f"output_format json_schema needs 'schema' as a dict, got {schema!r}")
        return {"format": dict(output_format)}
    raise ConfigError(
        f"output_format must be 'json' or {{'type': 'json_schema', 'schema': {{...}}}}, got {output_format!r}"
    )


# -- response assembly ---------------------------------------------------------------------------


def _clean_block(block: Any) -> dict[str, Any]:
    """A content block as a wire dict: a deep copy without ``None``-valued top-level keys
    (the copy keeps the assembled message independent of the events handed to callers)."""
    if hasattr(block, "to_dict"):
        block = block.to_dict(mode="json")
    return {k: copy.deepcopy(v) for k, v in dict(block).items() if v is not None}


class StreamAssembler:
    """Builds the final assistant message from raw Messages API stream events (dicts).

    ``text_delta``, ``thinking_delta``, ``signature_delta`` and ``citations_delta``
    extend their block; ``input_json_delta`` fragments are collected and joined and
    parsed **once**, at the block's ``content_block_stop`` (or at the end of the
    stream for a block that was never closed). A tool block with no fragments keeps
    the input it started with, or ``{}``. Tool input that is not valid JSON is
    left as the joined text (a string): the agent loop stores ``{}`` for that
    call and answers it with an error result the model can fix (or, when the
    response stopped at ``max_tokens``, with the truncation error).
    """

    def __init__(self) -> None:
        self._message: dict[str, Any] | None = None
        self._usage: dict[str, Any] = {}
        self._blocks: dict[int, dict[str, Any]] = {}
        self._fragments: dict[int, list[str]] = {}
        self._ended = False

    def feed(self, event: dict[str, Any]) -> None:
        """Apply one raw stream event.

        Raises:
            APIError: an event out of order (a delta for a block that never started).
        """
        kind = event.get("type")
        if kind == "message_start":
            message = dict(event.get("message") or {})
            self._message = message
            self._usage = {k: v for k, v in (message.get("usage") or {}).items() if v is not None}
            for index, block in enumerate(message.get("content") or []):
                self._blocks[index] = _clean_block(block)
        elif kind == "content_block_start":
            index = self._index(event)
            block = _clean_block(event.get("content_block") or {})
            self._blocks[index] = block
            if block.get("type") in _TOOL_BLOCK_TYPES:
                self._fragments[index] = []
        elif kind == "content_block_delta":
            self._apply_delta(self._index(event), event.get("delta") or {})
        elif kind == "content_block_stop":
            self._close_block(self._index(event))
        elif kind == "message_delta":
            delta = event.get("delta") or {}
            self._require_message()
            for key in ("stop_reason", "stop_sequence"):
                if key in delta:
                    self._message[key] = delta[key]  # type: ignore[index]
            for key, value in (event.get("usage") or {}).items():
                if value is not None:
                    self._usage[key] = value
        elif kind == "message_stop":
            self._ended = True
        # ``ping`` and unknown event types carry nothing to assemble.

    def _index(self, event: dict[str, Any]) -> int:
        index = event.get("index")
        if not isinstance(index, int):
            raise APIError(f"malformed stream event without an integer index: {event!r:.200}")
        return index

    def _require_message(self) -> None:
        if self._message is None:
            raise APIError("malformed stream: an event arrived before message_start")

    def _apply_delta(self, index: int, delta: dict[str, Any]) -> None:
        block = self._blocks.get(index)
        if block is None:
            raise APIError(f"malformed stream: a delta for content block {index}, which never started")
        kind = delta.get("type")
        if kind == "text_delta":
            block["text"] = block.get("text", "") + (delta.get("text") or "")
        elif kind == "input_json_delta":
            self._fragments.setdefault(index, []).append(delta.get("partial_json") or "")
        elif kind == "thinking_delta":
            block["thinking"] = block.get("thinking", "") + (delta.get("thinking") or "")
        elif kind == "signature_delta":
            block["signature"] = block.get("signature", "") + (delta.get("signature") or "")
        elif kind == "citations_delta":
            block.setdefault("citations", []).append(delta.get("citation"))

    def _close_block(self, index: int) -> None:
        fragments = self._fragments.pop(index, None)
        if fragments is None:
            return
        block = self._blocks[index]
        raw = "".join(fragments)
        if not raw.strip():
            start_input = block.get("input")
            block["input"] = start_input if isinstance(start_input, dict) else {}
            return
        try:
            block["input"] = json.loads(raw)
        except json.JSONDecodeError:
            # kept as the raw text: the agent loop stores ``{}`` and answers the call with an
            # error result quoting it, so the model can reissue the call
            block["input"] = raw

    def result(self) -> AssistantModelMessage:
        """The assembled message.

        Raises:
            APIError: the stream had no ``message_start``, or ended before the
                message was finished.
        """
        self._require_message()
        message = self._message or {}
        stop_reason = message.get("stop_reason")
        if not self._ended and stop_reason is None:
            raise APIError("model stream ended before the message was complete (no message_stop)")
        for index in list(self._fragments):
            self._close_block(index)
        return AssistantModelMessage(
            content=[self._blocks[i] for i in sorted(self._blocks)],
            usage=TokenUsage.from_any(self._usage),
            stop_reason=stop_reason,
            provider_response_id=message.get("id"),
            model=message.get("model"),
        )


# -- errors and cancellation ---------------------------------------------------------------------


def convert_sdk_error(exc: BaseException) -> LatticeError:
    """Map an ``anthropic`` SDK exception to :class:`APIError` / :class:`ModelTimeoutError`.

    A status error keeps its HTTP ``status_code`` and decoded ``body``; an ``error``
    event inside a stream (sent on an HTTP 200) gets the status its error type
    normally has (``overloaded_error`` -> 529). Connection errors have no status.
    """
    if isinstance(exc, anthropic.APITimeoutError):
        return ModelTimeoutError(f"model request timed out: {exc}")
    if isinstance(exc, anthropic.APIStatusError):
        body = exc.body
        error = body.get("error") if isinstance(body, dict) else None
        error_type = error.get("type") if isinstance(error, dict) else None
        error_message = error.get("message") if isinstance(error, dict) else None
        status = exc.status_code
        if status < 400:
            status = _ERROR_TYPE_STATUS.get(str(error_type), 500)
        detail = error_message or (body if isinstance(body, str) else None) or str(exc)
        label = f" {error_type}" if error_type else ""
        return APIError(f"provider error {status}{label}: {detail}", status_code=status, body=body)
    if isinstance(exc, anthropic.APIResponseValidationError):
        return APIError(
            f"provider sent a malformed response: {exc}", status_code=exc.status_code, body=exc.body
        )
    if isinstance(exc, anthropic.APIConnectionError):
        return APIError(f"could not reach the model provider: {exc}", status_code=None, body=None)
    body = getattr(exc, "body", None)
    return APIError(f"model request failed: {type(exc).__name__}: {exc}", body=body)


async def _run_with_signal(work: Awaitable[AssistantModelMessage], signal: AbortSignal | None) -> Any:
    """Await ``work``; if ``signal`` aborts first, cancel it and raise :class:`AbortError`."""
    if signal is None:
        return await work
    signal.throw_if_aborted()
    task = asyncio.ensure_future(work)
    waiter = asyncio.ensure_future(signal.wait())
    try:
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        waiter.cancel()
        raise
    if task.done():
        waiter.cancel()
        return task.result()
    task.cancel()
    with contextlib.suppress(BaseException):
        await task
    reason = signal.reason
    raise AbortError(str(reason) if reason is not None else "aborted")


__all__ = [
    "DEFAULT_MODEL",
    "AnthropicModelClient",
    "StreamAssembler",
    "build_request_params",
    "convert_sdk_error",
    "serialize_output_format",
    "serialize_reasoning_effort",
    "serialize_thinking",
]
