"""``LATTICE_MODEL_LIMITS``: its JSON shape, and a clear error for every bad value (issue 22)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from lattice_client.model_limits import ModelLimit, api_key_id, limit_for
from lattice_client.settings import get_settings, setting_variables

GOOD = (
    '{"claude-sonnet-4-6": {"requests_per_minute": 300, "input_tokens_per_minute": 60000,'
    ' "output_tokens_per_minute": 16000}, "*": {"requests_per_minute": 50}}'
)


def test_the_variable_is_read_as_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LATTICE_MODEL_LIMITS", GOOD)
    limits = get_settings().model_limits
    assert limits["claude-sonnet-4-6"].capacities() == (300, 60000, 16000)
    assert limits["claude-sonnet-4-6"].period_seconds == 60.0
    assert limit_for(limits, "claude-haiku-4-5") is limits["*"]
    assert limits["*"].capacities() == (50, 0, 0)
    assert "LATTICE_MODEL_LIMITS" in setting_variables()


def test_no_variable_means_no_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    assert get_settings().model_limits == {}
    monkeypatch.setenv("LATTICE_MODEL_LIMITS", " ")
    assert get_settings().model_limits == {}


def test_a_keyword_override_takes_dicts() -> None:
    settings = get_settings(model_limits={"m": {"requests_per_minute": 5}})
    assert settings.model_limits["m"] == ModelLimit(requests_per_minute=5)
    assert settings.with_overrides(key_prefix="other").model_limits == settings.model_limits


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ('{"m": {"requests_per_minute": 3', r"LATTICE_MODEL_LIMITS is not JSON \(Expecting ',' delimiter"),
        ("[300]", "must be a JSON object of model name -> limits, got list"),
        (
            '{"m": {"requests_per_minute": 0}}',
            r"model_limits\.m\.requests_per_minute\n.*greater than or equal to 1",
        ),
        ('{"m": {"requests_per_minute": "lots"}}', r"model_limits\.m\.requests_per_minute\n.*valid integer"),
        ('{"m": {"requests_per_minte": 3}}', r"model_limits\.m\.requests_per_minte\n.*Extra inputs"),
        ('{"m": {}}', "needs at least one of requests_per_minute"),
        ('{"": {"requests_per_minute": 3}}', "a model name must be a non-empty string"),
        ('{"m": 300}', r"model_limits\.m\n.*valid dictionary"),
    ],
)
def test_a_bad_value_gets_a_clear_error(monkeypatch: pytest.MonkeyPatch, value: str, says: str) -> None:
    monkeypatch.setenv("LATTICE_MODEL_LIMITS", value)
    with pytest.raises(ValidationError, match=says):
        get_settings()


def test_per_key_limits_name_the_key_by_its_hash_never_in_clear(monkeypatch: pytest.MonkeyPatch) -> None:
    key_id = api_key_id("sk-ant-secret")
    assert key_id.startswith("sha256:") and "secret" not in key_id
    monkeypatch.setenv(
        "LATTICE_MODEL_LIMITS",
        f'{{"m": {{"requests_per_minute": 300, "api_keys": {{"{key_id}": {{"requests_per_minute": 10}}}}}}}}',
    )
    limit = get_settings().model_limits["m"]
    assert limit.for_key(key_id).capacities() == (10, 0, 0)
    assert limit.for_key(api_key_id("another")).capacities() == (300, 0, 0)
    monkeypatch.setenv(
        "LATTICE_MODEL_LIMITS",
        '{"m": {"requests_per_minute": 3, "api_keys": {"sk-ant-oops": {"requests_per_minute": 1}}}}',
    )
    with pytest.raises(ValidationError, match="never by the key itself") as caught:
        get_settings()
    assert "sk-ant-oops" not in str(caught.value)
