"""``AnthropicModelClient``: the built-in :class:`ModelClient` on the official ``anthropic`` SDK.

It speaks the Anthropic Messages API to Anthropic itself or to any compatible
endpoint (DeepSeek, Kimi, a local fake server) chosen with ``base_url``.

It sends the thinking and reasoning options on the wire (``thinking``,
``reasoning_effort`` and ``output_config``), reports each response's ``usage``,
``stop_reason``, ``provider_response_id`` and ``model``, and forwards the raw
provider events while they arrive.

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
errors, honouring ``retry-after-ms`` / ``retry-after``), except under an
observer that retries itself (:mod:`.response_observer`: the distributed
runtime's rate limiter), which gets every response's status and headers
(``with_raw_response``, ``APIStatusError.response``). Every SDK failure is
re-raised as :class:`~lattice_worker.errors.APIError` (``status_code``,
``body``), except timeouts, which become
:class:`~lattice_worker.errors.ModelTimeoutError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import threading
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import anthropic

from ..errors import AbortError, APIError, ConfigError, LatticeError, ModelTimeoutError
from .anthropic_errors import _credentials_error, convert_sdk_error
from .anthropic_request import (  # noqa: F401 - re-exported: their old import path
    REASONING_EFFORTS,
    THINKING_TYPES,
    build_request_params,
    serialize_output_format,
    serialize_reasoning_effort,
    serialize_thinking,
)
from .anthropic_response import _TOOL_BLOCK_TYPES, StreamAssembler, _clean_block
from .model import AssistantModelMessage, ModelRequest, TokenUsage
from .response_observer import ResponseObserver, current_observer

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
        observer = current_observer.get()
        try:
            if observer is None:
                message = await sdk.messages.create(**params)
            else:
                raw = await _observed(sdk, observer).messages.with_raw_response.create(**params)
                observer.heard(raw.status_code, raw.headers)
                message = await raw.parse()
        except anthropic.AnthropicError as exc:
            _heard_error(observer, exc)
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
        observer = current_observer.get()
        try:
            if observer is None:
                stream = await sdk.messages.create(**params, stream=True)
            else:
                raw = await _observed(sdk, observer).messages.with_raw_response.create(**params, stream=True)
                observer.heard(raw.status_code, raw.headers)
                stream = await raw.parse()
        except anthropic.AnthropicError as exc:
            _heard_error(observer, exc)
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


def _observed(sdk: Any, observer: ResponseObserver) -> Any:
    """``sdk`` as the call under ``observer`` uses it: without the SDK's retries
    when the observer retries itself (``with_options`` is the SDK's public way)."""
    if observer.own_retries and hasattr(sdk, "with_options"):
        return sdk.with_options(max_retries=0)
    return sdk


def _heard_error(observer: ResponseObserver | None, exc: BaseException) -> None:
    """Tell ``observer`` the status and headers of an error response (``APIStatusError.response``)."""
    response = getattr(exc, "response", None) if isinstance(exc, anthropic.APIStatusError) else None
    if observer is not None and response is not None:
        observer.heard(exc.status_code, response.headers)  # type: ignore[attr-defined]


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
