"""What the rate limiter reads of a provider's answer and a request (lattice_worker.runtime.limits.gate)."""

from __future__ import annotations

from lattice_worker.agent.model import ModelRequest
from lattice_worker.runtime.limits.gate import estimate_input_tokens, remaining_of, retry_after_seconds


def test_retry_after_prefers_milliseconds_and_ignores_an_http_date():
    assert retry_after_seconds({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    assert retry_after_seconds({"retry-after": "3"}) == 3.0
    assert retry_after_seconds({"retry-after": "Wed, 21 Oct 2026 07:28:00 GMT"}) is None
    assert retry_after_seconds({}) is None
    assert retry_after_seconds({"retry-after": "-2"}) == 0.0


def test_remaining_counts_are_read_from_the_anthropic_ratelimit_headers():
    headers = {
        "anthropic-ratelimit-requests-remaining": "41",
        "anthropic-ratelimit-input-tokens-remaining": "12000",
        "anthropic-ratelimit-output-tokens-remaining": "not a number",
        "anthropic-ratelimit-tokens-remaining": "5",  # the combined count is not one of the buckets
    }
    assert remaining_of(headers) == {"requests": 41, "input_tokens": 12000}
    assert remaining_of({}) == {}


def test_the_estimate_grows_with_the_request_and_is_never_zero():
    small = ModelRequest(model="m", system=None, messages=[{"role": "user", "content": "hi"}], max_tokens=8)
    big = ModelRequest(
        model="m", system="s" * 400, messages=[{"role": "user", "content": "x" * 4000}], max_tokens=8
    )
    assert 1 <= estimate_input_tokens(small) < 20
    assert 1100 <= estimate_input_tokens(big) <= 1200  # about characters / 4
