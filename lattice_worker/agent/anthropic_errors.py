"""The errors of :class:`~lattice_worker.agent.anthropic_client.AnthropicModelClient`:
``anthropic`` SDK exceptions as :class:`~lattice_worker.errors.APIError` /
:class:`~lattice_worker.errors.ModelTimeoutError`, and the SDK's bare
``TypeError`` for missing credentials as a :class:`~lattice_worker.errors.ConfigError`.
"""

from __future__ import annotations

import anthropic

from ..errors import APIError, ConfigError, LatticeError, ModelTimeoutError

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


def _credentials_error(exc: TypeError) -> Exception:
    """The SDK raises a bare ``TypeError`` when it has no credentials to send; say
    what to set instead. Any other ``TypeError`` is returned unchanged."""
    if "authentication" not in str(exc):
        return exc
    return ConfigError(
        "AnthropicModelClient: no API key. Pass api_key= (create_agent(api_key=...)), or set "
        "ANTHROPIC_API_KEY (or DEEPSEEK_API_KEY, which also selects DeepSeek's endpoint)."
    )


__all__ = ["convert_sdk_error"]
