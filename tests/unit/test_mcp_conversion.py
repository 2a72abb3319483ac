"""MCP tool names, input schemas and call results, converted without a server.

The same conversions run against real servers in tests/integration/test_mcp_*.py;
these pin the edge cases a server rarely shows.
"""

from __future__ import annotations

import subprocess
import sys

import jsonschema
import mcp.types as t
import pytest

from lattice_worker.tools.mcp.naming import assign_tool_names
from lattice_worker.tools.mcp.results import EMPTY_RESULT_TEXT, to_tool_result
from lattice_worker.tools.mcp.schema import MCPSchemaError, convert_input_schema, inline_refs
from lattice_worker.tools.tool import TOOL_NAME_PATTERN

# ----------------------------------------------------------------------- names


def test_names_are_sanitised_and_prefixed():
    names = assign_tool_names(["search", "docs.search", "get weather", "ünïcode/path"], prefix="docs")
    assert names == ["docs_search", "docs_docs_search", "docs_get_weather", "docs__n_code_path"]
    assert assign_tool_names(["search"]) == ["search"]


def test_long_names_are_cut_to_64_with_a_hash_and_stay_distinct():
    a, b = "x" * 70 + "a", "x" * 70 + "b"
    names = assign_tool_names([a, b], prefix="server")
    assert all(TOOL_NAME_PATTERN.match(n) for n in names)
    assert all(len(n) == 64 for n in names)
    assert names[0] != names[1]
    # deterministic: the same listing gives the same names
    assert assign_tool_names([a, b], prefix="server") == names


def test_colliding_names_are_told_apart_and_a_valid_name_keeps_its_name():
    # "a.b" and "a b" both sanitise to "a_b", which is also a tool of its own
    names = assign_tool_names(["a.b", "a b", "a_b"])
    assert names[2] == "a_b"  # needed no change: keeps it, even though listed last
    assert len(set(names)) == 3
    assert all(n.startswith("a_b_") and TOOL_NAME_PATTERN.match(n) for n in names[:2])


def test_a_name_listed_twice_and_an_empty_name_still_get_valid_unique_names():
    names = assign_tool_names(["dup", "dup", ""])
    assert len(set(names)) == 3
    assert all(TOOL_NAME_PATTERN.match(n) for n in names)


# ----------------------------------------------------------------------- schemas


def test_refs_into_defs_are_inlined_and_defs_dropped():
    schema = {
        "type": "object",
        "properties": {"place": {"$ref": "#/$defs/Place"}, "other": {"$ref": "#/definitions/Other"}},
        "$defs": {"Place": {"type": "object", "properties": {"city": {"type": "string"}}}},
        "definitions": {"Other": {"type": "integer", "description": "kept"}},
    }
    out, unresolved = inline_refs(schema)
    assert out == {
        "type": "object",
        "properties": {
            "place": {"type": "object", "properties": {"city": {"type": "string"}}},
            "other": {"type": "integer", "description": "kept"},
        },
    }
    assert unresolved == []
    assert "$defs" in schema  # the input is not changed


def test_sibling_keywords_of_a_ref_win():
    out, _ = inline_refs(
        {
            "properties": {"p": {"$ref": "#/$defs/P", "description": "mine"}},
            "$defs": {"P": {"description": "theirs"}},
        }
    )
    assert out["properties"]["p"] == {"description": "mine"}


def test_a_recursive_ref_stays_resolvable():
    schema = {
        "type": "object",
        "properties": {"root": {"$ref": "#/$defs/Node"}, "unused": {"type": "string"}},
        "$defs": {
            "Node": {
                "type": "object",
                "properties": {
                    "label": {"type": "string"},
                    "kids": {"type": "array", "items": {"$ref": "#/$defs/Node"}},
                },
            },
            "Unused": {"type": "string"},
        },
    }
    out = convert_input_schema(schema).model_schema
    assert out["properties"]["root"]["properties"]["kids"]["items"] == {"$ref": "#/$defs/Node"}
    assert set(out["$defs"]) == {"Node"}  # what is still referenced, nothing else
    validator = jsonschema.Draft202012Validator(out)
    validator.validate({"root": {"label": "a", "kids": [{"label": "b", "kids": []}]}})
    with pytest.raises(jsonschema.ValidationError):
        validator.validate({"root": {"label": "a", "kids": [{"label": 3}]}})


def test_unresolvable_refs_accept_anything_and_are_reported():
    out, unresolved = inline_refs(
        {"properties": {"a": {"$ref": "https://example.com/x.json"}, "b": {"$ref": "#/$defs/Missing"}}}
    )
    assert out["properties"] == {"a": {}, "b": {}}
    assert unresolved == ["https://example.com/x.json", "#/$defs/Missing"]


def test_enum_values_that_look_like_refs_are_data():
    out, _ = inline_refs({"properties": {"a": {"enum": [{"$ref": "#/x"}]}}})
    assert out["properties"]["a"]["enum"] == [{"$ref": "#/x"}]


def test_a_top_level_any_of_becomes_one_object_and_the_union_stays_strict():
    schema = {
        "type": "object",
        "properties": {"verbose": {"type": "boolean"}},
        "anyOf": [
            {"properties": {"id": {"type": "integer"}}, "required": ["id"]},
            {"properties": {"name": {"type": "string"}}, "required": ["name"]},
        ],
    }
    converted = convert_input_schema(schema)
    model = converted.model_schema
    assert model["type"] == "object"
    assert not {"anyOf", "oneOf", "allOf"} & set(model)
    assert set(model["properties"]) == {"verbose", "id", "name"}
    assert "required" not in model  # no property is required by every branch
    assert "(1) with id; (2) with name" in model["description"]
    strict = jsonschema.Draft202012Validator(converted.strict_schema)
    assert strict.is_valid({"id": 1}) and strict.is_valid({"name": "x"})
    assert not strict.is_valid({"verbose": True})


def test_a_top_level_one_of_whose_branches_conflict_merges_their_property_types():
    converted = convert_input_schema(
        {
            "oneOf": [
                {"type": "object", "properties": {"key": {"type": "integer"}}, "required": ["key", "mode"]},
                {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]},
            ]
        }
    )
    model = converted.model_schema
    assert model["properties"]["key"] == {"anyOf": [{"type": "integer"}, {"type": "string"}]}
    assert model["required"] == ["key"]  # what every branch requires
    assert "exactly one" in model["description"]


def test_a_top_level_all_of_is_merged():
    model = convert_input_schema(
        {
            "allOf": [
                {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
                {"properties": {"b": {"type": "integer"}}, "required": ["b"]},
            ]
        }
    ).model_schema
    assert model == {
        "type": "object",
        "properties": {"a": {"type": "string"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    }


@pytest.mark.parametrize(
    "schema, words",
    [
        ({"type": "object", "anyOf": [{"type": "string"}, {"type": "array"}]}, "none of the 2 alternatives"),
        ({"type": "string"}, "root has type string"),
        ("not a schema", "not a JSON Schema object"),
    ],
)
def test_a_schema_that_cannot_describe_an_object_is_refused(schema, words):
    with pytest.raises(MCPSchemaError, match=words):
        convert_input_schema(schema)


def test_no_schema_means_no_arguments_and_a_root_ref_is_resolved():
    assert convert_input_schema(None).model_schema == {"type": "object", "properties": {}}
    model = convert_input_schema(
        {"$ref": "#/$defs/In", "$defs": {"In": {"type": "object", "properties": {"q": {"type": "string"}}}}}
    ).model_schema
    assert model == {"type": "object", "properties": {"q": {"type": "string"}}}


# ----------------------------------------------------------------------- results


def test_results_map_every_content_kind():
    png = "iVBORw0KGgo="
    result = t.CallToolResult(
        content=[
            t.TextContent(type="text", text="hi"),
            t.ImageContent(type="image", data=png, mime_type="image/png"),
            t.ImageContent(type="image", data=png, mime_type="image/tiff"),
            t.AudioContent(type="audio", data="AAAA", mime_type="audio/wav"),
            t.EmbeddedResource(
                type="resource",
                resource=t.TextResourceContents(uri="file:///a.txt", mime_type="text/plain", text="A"),
            ),
            t.EmbeddedResource(
                type="resource",
                resource=t.BlobResourceContents(
                    uri="file:///d.pdf", mime_type="application/pdf", blob="JVBE"
                ),
            ),
            t.ResourceLink(type="resource_link", uri="file:///big.csv", name="big.csv", mime_type="text/csv"),
        ],
        structured_content={"n": 1},
    )
    out = to_tool_result(result)
    blocks = out.content
    assert blocks[0] == {"type": "text", "text": "hi"}
    assert blocks[1] == {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": png},
    }
    assert blocks[2]["type"] == "text" and "image/tiff" in blocks[2]["text"]
    assert blocks[3]["type"] == "text" and "audio/wav" in blocks[3]["text"]
    assert blocks[4] == {"type": "text", "text": "[resource file:///a.txt (text/plain)]\nA"}
    assert blocks[5] == {
        "type": "document",
        "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBE"},
    }
    assert "file:///big.csv" in blocks[6]["text"] and "big.csv" in blocks[6]["text"]
    assert out.structured_result == {"n": 1}
    assert out.is_error is False


def test_is_error_and_structured_only_and_empty_results():
    assert to_tool_result(t.CallToolResult(content=[], is_error=True)).is_error is True
    only = to_tool_result(t.CallToolResult(content=[], structured_content={"a": [1, 2]}))
    assert only.content == [{"type": "text", "text": '{"a": [1, 2]}'}]
    assert to_tool_result(t.CallToolResult(content=[])).content == [
        {"type": "text", "text": EMPTY_RESULT_TEXT}
    ]


def test_importing_lattice_worker_does_not_import_the_mcp_sdk():
    code = "import sys, lattice_worker; assert 'mcp' not in sys.modules; lattice_worker.create_mcp_tools; assert 'mcp' in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_pinned_mcp_names_are_exported_from_lattice_worker():
    import lattice_worker
    from lattice_worker.tools import mcp as package

    for name in (
        "connect_mcp_stdio_server",
        "connect_mcp_streamable_http_server",
        "create_mcp_tools",
        "MCPClient",
        "MCPStdioConnection",
        "MCPStreamableHTTPConnection",
        "MCPConnectionError",
        "MCPConnectTimeoutError",
    ):
        assert name in lattice_worker.__all__
        assert getattr(lattice_worker, name) is getattr(package, name)
