"""Request normalisation (lattice_worker.agent.normalize): one test per rule, and
that it never mutates its input nor touches thinking blocks."""

from __future__ import annotations

import copy
import json

import pytest

from lattice_worker.agent.normalize import coerce_tool_input, normalize_messages

THINKING = {"type": "thinking", "thinking": "  careful  \n", "signature": "c2lnbmF0dXJl+/=="}
REDACTED = {"type": "redacted_thinking", "data": "ZW5jcnlwdGVk\n"}


def check(messages, expected):
    before = copy.deepcopy(messages)
    out = normalize_messages(messages)
    assert out == expected
    assert messages == before  # the input (the stored history) is never changed
    return out


def test_a_clean_history_comes_back_as_the_same_message_objects():
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [{"type": "text", "text": "hello"}]},
        {"role": "user", "content": [{"type": "text", "text": "more"}]},
    ]
    out = normalize_messages(messages)
    assert out == messages and out is not messages
    assert all(a is b for a, b in zip(out, messages, strict=True))


@pytest.mark.parametrize("blank", ["", " ", "\n\t  "])
def test_empty_and_whitespace_text_blocks_are_dropped(blank):
    check(
        [
            {"role": "user", "content": "go"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": blank},
                    {"type": "tool_use", "id": "t", "name": "n", "input": {}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text", "text": blank}]},
                    {"type": "text", "text": blank},
                ],
            },
        ],
        [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "n", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]},
        ],
    )


def test_a_message_left_empty_is_dropped_and_its_neighbours_merge():
    check(
        [
            {"role": "user", "content": "one"},
            {"role": "assistant", "content": [{"type": "text", "text": "   "}]},
            {"role": "user", "content": "two"},
            {"role": "assistant", "content": "  "},
        ],
        [{"role": "user", "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]}],
    )


def test_consecutive_messages_of_one_role_are_merged():
    check(
        [
            {"role": "user", "content": "a"},
            {"role": "user", "content": [{"type": "text", "text": "b"}]},
            {"role": "assistant", "content": "c"},
            {"role": "assistant", "content": [{"type": "text", "text": "d"}]},
            {"role": "user", "content": "e"},
        ],
        [
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "c"}, {"type": "text", "text": "d"}]},
            {"role": "user", "content": "e"},
        ],
    )


def test_a_report_after_the_tool_results_joins_their_user_turn():
    results = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "ok"}]}
    report = {"role": "user", "content": [{"type": "text", "text": "Team handoff reports"}]}
    check(
        [
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "n", "input": {}}]},
            results,
            report,
        ],
        [
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "n", "input": {}}]},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t", "content": "ok"},
                    {"type": "text", "text": "Team handoff reports"},
                ],
            },
        ],
    )


def test_tool_results_go_before_every_other_block_of_a_user_turn_in_order():
    check(
        [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "hook note"},
                    {"type": "tool_result", "tool_use_id": "a", "content": "1"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA"}},
                    {"type": "tool_result", "tool_use_id": "b", "content": "2"},
                ],
            }
        ],
        [
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "a", "content": "1"},
                    {"type": "tool_result", "tool_use_id": "b", "content": "2"},
                    {"type": "text", "text": "hook note"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA"}},
                ],
            }
        ],
    )


@pytest.mark.parametrize(
    ("given", "sent"),
    [
        (None, {}),
        ("", {}),
        ('{"a": 1}', {"a": 1}),
        ("{not json", {}),
        ([1, 2], {}),
        ("[1, 2]", {}),
        (7, {}),
    ],
)
def test_every_tool_use_input_is_sent_as_an_object(given, sent):
    check(
        [{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "n", "input": given}]}],
        [{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "n", "input": sent}]}],
    )


def test_thinking_blocks_pass_as_the_very_same_objects():
    assistant = {
        "role": "assistant",
        "content": [
            THINKING,
            REDACTED,
            {"type": "text", "text": ""},
            {"type": "tool_use", "id": "t", "name": "n"},
        ],
    }
    out = normalize_messages([{"role": "user", "content": "go"}, assistant])
    content = out[1]["content"]
    assert content[0] is THINKING and content[1] is REDACTED
    assert json.dumps(content[:2]) == json.dumps([THINKING, REDACTED])  # byte for byte
    assert content[2] == {"type": "tool_use", "id": "t", "name": "n", "input": {}}


def test_entries_that_are_not_messages_are_left_for_the_client_to_reject():
    odd = ["not a message", {"content": "no role"}]
    assert normalize_messages(odd) == odd


@pytest.mark.parametrize(
    ("value", "expected", "problem"),
    [
        ({"a": 1}, {"a": 1}, None),
        (None, {}, None),
        ("", {}, None),
        ('{"a": [1]}', {"a": [1]}, None),
        ('{"text": "abc', {}, "not valid JSON"),
        ("[1]", {}, "got array"),
        (3.5, {}, "got number"),
        (True, {}, "got boolean"),
    ],
)
def test_coerce_tool_input(value, expected, problem):
    fixed, why = coerce_tool_input(value)
    assert fixed == expected
    if problem is None:
        assert why is None
    else:
        assert problem in why
