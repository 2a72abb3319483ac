"""Tool effects: the new tool() options, every setup error, Reconcile lookups,
effects of built-in and MCP tools, ToolContext.effect_key, ends_turn
(docs/tool-effects.md)."""

from __future__ import annotations

import math

import pytest
from pydantic import BaseModel

from lattice_worker import (
    ConfigError,
    LookupFound,
    LookupNotFound,
    LookupUnknown,
    Reconcile,
    ScriptedModelClient,
    ToolContext,
    ToolResult,
    create_agent,
    create_bare_agent,
    effect_from_mcp_annotations,
    text_turn,
    tool,
    tool_turn,
)
from lattice_worker.tools.effects import BUILTIN_TOOL_EFFECTS, builtin_tool_effect, coerce_lookup_result


class Amount(BaseModel):
    amount: int


def handler(inp: Amount) -> str:
    return f"charged {inp.amount}"


def lookup(_key: str) -> LookupNotFound:
    return LookupNotFound()


RECONCILE = Reconcile(lookup)


# --------------------------------------------------------------------------- definitions


def test_effect_defaults_to_unguarded_and_every_option_is_stored():
    plain = tool("charge", "Charge", Amount, handler)
    assert (plain.effect, plain.dedup_window_s, plain.reconcile) == ("unguarded", None, None)
    assert (plain.ends_turn, plain.concurrent, plain.defer) == (False, False, False)

    idem = tool("charge", "Charge", Amount, handler, effect="idempotent", dedup_window_s=86_400)
    assert idem.effect == "idempotent" and idem.dedup_window_s == 86_400.0

    rec = tool("charge", "Charge", Amount, handler, effect="reconcilable", reconcile=RECONCILE)
    assert rec.reconcile is RECONCILE and rec.reconcile.finality == "final"

    read = tool("look", "Look", Amount, handler, effect="read_only", concurrent=True, defer=True)
    assert (read.effect, read.concurrent, read.defer) == ("read_only", True, True)
    assert read.check_concurrency_safe(None) is True

    done = tool("finish", "Finish", Amount, handler, effect="read_only", ends_turn=True, runs="host")
    assert done.ends_turn is True


def test_the_decorator_forms_take_the_effect_options():
    @tool(effect="idempotent", dedup_window_s=60)
    def charge(amount: int, ctx: ToolContext) -> str:
        """Charge the card."""
        return f"{amount}:{ctx.effect_key}"

    assert charge.effect == "idempotent" and charge.dedup_window_s == 60.0

    with pytest.raises(ConfigError, match="dedup_window_s"):

        @tool(effect="idempotent")
        def bad(amount: int) -> str:
            """No window."""
            return ""


SETUP_ERRORS = [
    # dedup window without idempotent, and the reverse
    ({"dedup_window_s": 60}, r'dedup_window_s is only for effect="idempotent"'),
    ({"effect": "read_only", "dedup_window_s": 60}, r'dedup_window_s is only for effect="idempotent"'),
    ({"effect": "reconcilable", "reconcile": RECONCILE, "dedup_window_s": 60}, "dedup_window_s is only"),
    ({"effect": "idempotent"}, r'effect="idempotent" needs dedup_window_s'),
    ({"effect": "idempotent", "dedup_window_s": 0}, "must be positive"),
    ({"effect": "idempotent", "dedup_window_s": -5}, "must be positive"),
    ({"effect": "idempotent", "dedup_window_s": math.nan}, "must be positive"),
    ({"effect": "idempotent", "dedup_window_s": "60"}, "number of seconds"),
    ({"effect": "idempotent", "dedup_window_s": True}, "number of seconds"),
    # reconcile without reconcilable, and the reverse
    ({"reconcile": RECONCILE}, r'reconcile is only for effect="reconcilable"'),
    ({"effect": "idempotent", "dedup_window_s": 9, "reconcile": RECONCILE}, "reconcile is only"),
    ({"effect": "reconcilable"}, r'effect="reconcilable" needs reconcile'),
    ({"effect": "reconcilable", "reconcile": lookup}, r"reconcile must be Reconcile\(lookup"),
    # concurrent on a tool that is not read_only, or that ends the turn
    ({"concurrent": True}, r'concurrent=True needs effect="read_only"'),
    ({"effect": "idempotent", "dedup_window_s": 9, "concurrent": True}, "concurrent=True needs"),
    ({"effect": "reconcilable", "reconcile": RECONCILE, "concurrent": True}, "concurrent=True needs"),
    ({"effect": "read_only", "concurrent": True, "ends_turn": True}, "cannot be combined with ends_turn"),
    ({"effect": "read_only", "concurrent": True, "is_concurrency_safe": True}, "not both"),
    # defer with ends_turn
    ({"defer": True, "ends_turn": True}, r"defer=True cannot be combined with ends_turn=True"),
    ({"effect": "read_only", "defer": True, "ends_turn": True}, "defer=True cannot"),
    # runs="sandbox" is reserved
    ({"runs": "sandbox"}, r'runs="sandbox" is not supported yet'),
    ({"runs": "cloud"}, 'runs must be "host"'),
    # bad values
    ({"effect": "readonly"}, "effect must be one of read_only, idempotent, reconcilable, unguarded"),
    ({"ends_turn": "yes"}, "ends_turn must be True or False"),
    ({"concurrent": 1}, "concurrent must be True or False"),
    ({"defer": None}, "defer must be True or False"),
]


@pytest.mark.parametrize(("options", "message"), SETUP_ERRORS)
def test_every_setup_error_is_a_config_error_at_definition(options, message):
    with pytest.raises(ConfigError, match=message) as err:
        tool("charge", "Charge", Amount, handler, **options)
    assert str(err.value).startswith('tool("charge"): ')

    def fn(amount: int) -> str:
        """Charge."""
        return ""

    with pytest.raises(ConfigError, match=message):
        tool(**options)(fn)


def test_reconcile_checks_its_own_arguments():
    with pytest.raises(ConfigError, match="lookup must be a callable"):
        Reconcile("not callable")
    with pytest.raises(ConfigError, match='finality must be "final" or "nonfinal"'):
        Reconcile(lookup, finality="maybe")
    assert Reconcile(lookup, finality="nonfinal").finality == "nonfinal"


async def test_reconcile_ask_normalises_every_answer_and_never_raises():
    async def found(key):
        return LookupFound(f"ch_{key}")

    assert await Reconcile(found).ask("k1") == LookupFound("ch_k1")
    assert await Reconcile(lambda k: {"status": "found", "value": 3}).ask("k") == LookupFound(3)
    assert await Reconcile(lambda k: {"status": "not_found"}).ask("k") == LookupNotFound()
    unknown = await Reconcile(lambda k: {"status": "unknown", "reason": "provider down"}).ask("k")
    assert unknown == LookupUnknown("provider down")

    def broken(_key):
        raise TimeoutError("no answer")

    answer = await Reconcile(broken).ask("k")
    assert isinstance(answer, LookupUnknown) and "TimeoutError: no answer" in answer.reason
    odd = coerce_lookup_result(42)
    assert isinstance(odd, LookupUnknown) and "42" in odd.reason
    assert isinstance(coerce_lookup_result({"status": "found"}), LookupUnknown)  # found needs a value


# --------------------------------------------------------------------------- built-in and MCP tools


def test_builtin_tools_have_the_documented_effects():
    for name in ("Read", "LS", "Glob", "Grep"):
        assert builtin_tool_effect(name) == ("read_only", None)
    assert builtin_tool_effect("Write") == ("idempotent", math.inf)
    assert builtin_tool_effect("Edit") == ("unguarded", None)  # see the test below
    assert builtin_tool_effect("Bash") == ("unguarded", None)
    assert builtin_tool_effect("Other") == ("unguarded", None)
    assert set(BUILTIN_TOOL_EFFECTS) == {"Read", "LS", "Glob", "Grep", "Write", "Edit", "Bash"}
    # the mapping builds valid tools
    for name, (effect, window) in BUILTIN_TOOL_EFFECTS.items():
        assert tool(name, "d", Amount, handler, effect=effect, dedup_window_s=window).effect == effect


def test_mcp_annotations_map_to_effects():
    from mcp.types import ToolAnnotations

    assert effect_from_mcp_annotations(None) == ("unguarded", None)
    assert effect_from_mcp_annotations({}) == ("unguarded", None)
    assert effect_from_mcp_annotations({"readOnlyHint": True}) == ("read_only", None)
    assert effect_from_mcp_annotations({"readOnlyHint": True, "idempotentHint": True}) == ("read_only", None)
    assert effect_from_mcp_annotations({"idempotentHint": True}) == ("idempotent", math.inf)
    assert effect_from_mcp_annotations({"readOnlyHint": False, "destructiveHint": True}) == (
        "unguarded",
        None,
    )
    assert effect_from_mcp_annotations({"readOnlyHint": "true"}) == ("unguarded", None)  # hints are booleans
    assert effect_from_mcp_annotations(ToolAnnotations(readOnlyHint=True)) == ("read_only", None)
    assert effect_from_mcp_annotations(ToolAnnotations(idempotentHint=True)) == ("idempotent", math.inf)


# --------------------------------------------------------------------------- effect_key


async def test_effect_key_is_stable_per_call_and_distinct_between_calls():
    seen: list[tuple[str, str | None]] = []

    def charge(inp: Amount, ctx: ToolContext) -> str:
        seen.append((ctx.tool_use_id, ctx.effect_key))
        return "ok"

    charge_tool = tool("charge", "Charge", Amount, charge, effect="idempotent", dedup_window_s=60)
    client = ScriptedModelClient(
        [
            tool_turn(("charge", {"amount": 1}, "t1"), ("charge", {"amount": 2}, "t2")),
            tool_turn(("charge", {"amount": 3}, "t3")),
            text_turn("done"),
        ]
    )
    agent = create_bare_agent(model_client=client, tools=[charge_tool])
    await agent.prompt("go", stream=False)
    keys = [key for _, key in seen]
    assert [tid for tid, _ in seen] == ["t1", "t2", "t3"]
    assert len(set(keys)) == 3
    assert keys == [f"{agent.session_id}:t1", f"{agent.session_id}:t2", f"{agent.session_id}:t3"]

    class Runtime:
        effect_scope = "work-item-7"

    seen.clear()
    again = create_bare_agent(
        model_client=ScriptedModelClient([tool_turn(("charge", {"amount": 1}, "t1")), text_turn("x")]),
        tools=[charge_tool],
    )
    await again.prompt("go", stream=False, runtime=Runtime())
    assert seen == [("t1", "work-item-7:t1")]  # the runtime's scope: the same on every attempt


# --------------------------------------------------------------------------- ends_turn


async def test_ends_turn_tool_ends_the_run_with_the_models_last_text():
    ran = []
    finish = tool(
        "finish",
        "Done",
        Amount,
        lambda i: ran.append(i.amount) or "summary",
        effect="read_only",
        ends_turn=True,
    )
    client = ScriptedModelClient([tool_turn(("finish", {"amount": 1}, "f1"), text="wrapping up")])
    agent = create_bare_agent(model_client=client, tools=[finish])
    result = await agent.prompt("go", stream=False)
    assert result.subtype == "success" and result.result == "wrapping up"
    assert ran == [1] and len(client.requests) == 1
    history = await agent.get_history()
    assert history[-1]["content"] == [{"type": "tool_result", "tool_use_id": "f1", "content": "summary"}]

    # no text in the turn: the output is empty
    client = ScriptedModelClient([tool_turn(("finish", {"amount": 2}))])
    result = await create_bare_agent(model_client=client, tools=[finish]).prompt("go", stream=False)
    assert result.subtype == "success" and result.result == ""


async def test_a_failing_ends_turn_call_does_not_end_the_turn_and_end_turn_results_still_work():
    def fail(_inp):
        raise RuntimeError("not yet")

    finish = tool("finish", "Done", Amount, fail, ends_turn=True)
    client = ScriptedModelClient([tool_turn(("finish", {"amount": 1})), text_turn("gave up")])
    result = await create_bare_agent(model_client=client, tools=[finish]).prompt("go", stream=False)
    assert result.result == "gave up" and len(client.requests) == 2

    # ToolResult(end_turn=True) keeps its meaning: the tool's content is the result text
    stop = tool("stop", "Stop", Amount, lambda i: ToolResult("tool text", end_turn=True))
    client = ScriptedModelClient([tool_turn(("stop", {"amount": 1}), text="model text")])
    result = await create_bare_agent(model_client=client, tools=[stop]).prompt("go", stream=False)
    assert result.result == "tool text"

    # an ends_turn tool whose result also says end_turn: the result's text wins
    both = tool("both", "Both", Amount, lambda i: ToolResult("from tool", end_turn=True), ends_turn=True)
    client = ScriptedModelClient([tool_turn(("both", {"amount": 1}), text="from model")])
    result = await create_bare_agent(model_client=client, tools=[both]).prompt("go", stream=False)
    assert result.result == "from tool"


async def test_ends_turn_before_submit_output_is_missing_output():
    class Out(BaseModel):
        x: int

    finish = tool("finish", "Done", Amount, lambda i: "ok", effect="read_only", ends_turn=True)
    client = ScriptedModelClient([tool_turn(("finish", {"amount": 1}))])
    agent = create_agent(model_client=client, tools=[finish], output_schema=Out, workspace=False)
    result = await agent.prompt("go", stream=False)
    assert result.subtype == "error_missing_output"


def test_the_built_in_workspace_tools_carry_their_effects(tmp_path):
    from lattice_worker import create_builtin_tools

    effects = {t.name: (t.effect, t.dedup_window_s) for t in create_builtin_tools(cwd=str(tmp_path))}
    assert effects == {name: BUILTIN_TOOL_EFFECTS[name] for name in effects}
    assert set(effects) == set(BUILTIN_TOOL_EFFECTS)
