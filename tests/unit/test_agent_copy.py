"""The agent loop's message copies (``lattice_worker.agent.loop._copy``): deep and independent."""

from __future__ import annotations

from collections import OrderedDict

from lattice_worker.agent.loop import _copy


class Box:
    def __init__(self, items: list[int]) -> None:
        self.items = items


def test_json_like_values_are_copied_all_the_way_down() -> None:
    original = {"role": "user", "content": [{"type": "text", "text": "é", "n": 1.5, "ok": True, "x": None}]}
    copied = _copy(original)
    assert copied == original
    copied["content"][0]["text"] = "changed"
    copied["content"].append({"type": "more"})
    assert original == {
        "role": "user",
        "content": [{"type": "text", "text": "é", "n": 1.5, "ok": True, "x": None}],
    }


def test_other_values_get_a_real_deep_copy() -> None:
    box = Box([1, 2])
    ordered = OrderedDict(a=[1])
    pair = (1, [2])
    copied = _copy({"t": pair, "box": box, "ordered": ordered})
    assert copied == {"t": pair, "box": copied["box"], "ordered": ordered}
    copied["t"][1].append(3)
    copied["box"].items.append(3)
    copied["ordered"]["a"].append(2)
    assert pair == (1, [2]) and box.items == [1, 2] and ordered == OrderedDict(a=[1])
    assert type(copied["ordered"]) is OrderedDict and copied["box"] is not box
