"""A stdio MCP server for the tests, written with the ``mcp`` SDK's low-level server.

Run: ``python tests/support/mcp_stdio_server.py [--banner] [--silent] [--counter FILE]``.

* ``--banner``: print a line of plain text to stdout before serving (what some
  servers do), which the client must skip;
* ``--silent``: read stdin and never answer anything (a server that never
  completes the handshake);
* ``--counter FILE``: append one line to FILE per ``tools/call`` handled (the
  tests count how often a call reached a server).

Its tools (the low-level server lets them carry any schema and result):
``docs.search`` (a dot, read-only), ``get weather`` (a space), ``make_event``
(a schema with ``$defs``/``$ref``, including a recursive one), ``pick`` (a
top-level ``anyOf``), ``impossible`` (no alternative is an object: refused),
``rich`` (text, image, embedded resources, ``structuredContent``), ``fail``
(``isError``), ``die`` (kills its own server mid-call), ``slow`` (sleeps),
``pid`` (the server's process id) and one named with 80 characters.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import time

import anyio
import mcp.types as t
from mcp.server import Server
from mcp.server.stdio import stdio_server
from pydantic import BaseModel

# a 1x1 transparent PNG
PNG = base64.b64encode(
    bytes.fromhex(
        "89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c489"
        "0000000d49444154789c6360000002000001e221bc330000000049454e44ae426082"
    )
).decode()

LONG_NAME = "fetch_" + "x" * 74


class Place(BaseModel):
    city: str
    country: str = "NL"


class Event(BaseModel):
    title: str
    place: Place
    backup: Place | None = None


EVENT_SCHEMA = {
    **Event.model_json_schema(),
    "properties": {
        **Event.model_json_schema()["properties"],
        "agenda": {"$ref": "#/$defs/Item"},
    },
}
EVENT_SCHEMA["$defs"] = {
    **EVENT_SCHEMA["$defs"],
    "Item": {
        "type": "object",
        "properties": {
            "label": {"type": "string"},
            "children": {"type": "array", "items": {"$ref": "#/$defs/Item"}},
        },
        "required": ["label"],
    },
}

TOOLS = [
    t.Tool(
        name="docs.search",
        description="Search the docs.",
        input_schema={"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
        annotations=t.ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False),
    ),
    t.Tool(
        name="get weather",
        description="The weather in a city.",
        input_schema={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        annotations=t.ToolAnnotations(destructive_hint=False),
    ),
    t.Tool(name="make_event", description="Create an event.", input_schema=EVENT_SCHEMA),
    t.Tool(
        name="pick",
        description="Pick an item by id or by name.",
        input_schema={
            "type": "object",
            "anyOf": [
                {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]},
                {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
            ],
        },
    ),
    t.Tool(
        name="impossible",
        description="Its schema allows no object.",
        input_schema={"type": "object", "anyOf": [{"type": "string"}, {"type": "integer"}]},
    ),
    t.Tool(name="rich", description="Every kind of content.", input_schema={"type": "object"}),
    t.Tool(name="fail", description="Always fails.", input_schema={"type": "object"}),
    t.Tool(
        name="die",
        description="Kills its own server.",
        input_schema={"type": "object"},
        annotations=t.ToolAnnotations(destructive_hint=True),
    ),
    t.Tool(
        name="slow",
        description="Sleeps.",
        input_schema={"type": "object", "properties": {"seconds": {"type": "number"}}},
    ),
    t.Tool(name="pid", description="The server's process id.", input_schema={"type": "object"}),
    t.Tool(name=LONG_NAME, description="A long name.", input_schema={"type": "object"}),
]


def text(value: str) -> list[t.ContentBlock]:
    return [t.TextContent(type="text", text=value)]


def count_call(path: str, name: str) -> None:
    with open(path, "a") as f:
        f.write(f"{name}\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--banner", action="store_true")
    parser.add_argument("--silent", action="store_true")
    parser.add_argument("--counter")
    args = parser.parse_args()

    if args.silent:
        for _line in sys.stdin:  # never answers
            pass
        return

    async def list_tools(ctx, params):
        return t.ListToolsResult(tools=TOOLS)

    async def call_tool(ctx, params):
        if args.counter:
            count_call(args.counter, params.name)
        arguments = params.arguments or {}
        name = params.name
        if name == "docs.search":
            return t.CallToolResult(content=text(f"found: {arguments.get('query')}"))
        if name == "get weather":
            return t.CallToolResult(
                content=text(f"sunny in {arguments['city']}"),
                structured_content={"city": arguments["city"], "sky": "sunny"},
            )
        if name in ("make_event", "pick", LONG_NAME):
            return t.CallToolResult(
                content=text(json.dumps({"tool": name, "arguments": arguments}, sort_keys=True))
            )
        if name == "rich":
            return t.CallToolResult(
                content=[
                    t.TextContent(type="text", text="a picture:"),
                    t.ImageContent(type="image", data=PNG, mime_type="image/png"),
                    t.EmbeddedResource(
                        type="resource",
                        resource=t.TextResourceContents(
                            uri="file:///notes.txt", mime_type="text/plain", text="hello notes"
                        ),
                    ),
                    t.EmbeddedResource(
                        type="resource",
                        resource=t.BlobResourceContents(
                            uri="file:///pixel.png", mime_type="image/png", blob=PNG
                        ),
                    ),
                    t.EmbeddedResource(
                        type="resource",
                        resource=t.BlobResourceContents(
                            uri="file:///data.bin", mime_type="application/octet-stream", blob="AAEC"
                        ),
                    ),
                ],
                structured_content={"count": 3},
            )
        if name == "fail":
            return t.CallToolResult(content=text("the disk is full"), is_error=True)
        if name == "die":
            sys.stderr.write("mcp_stdio_server: dying on purpose\n")
            os._exit(17)
        if name == "slow":
            await anyio.sleep(float(arguments.get("seconds", 5)))
            return t.CallToolResult(content=text("slept"))
        if name == "pid":
            return t.CallToolResult(content=text(str(os.getpid())))
        raise ValueError(f"unknown tool {name}")

    server = Server("test-stdio", on_list_tools=list_tools, on_call_tool=call_tool)

    if args.banner:
        print(f"test-stdio server starting at {time.time():.0f} (not JSON-RPC)", flush=True)

    async def serve() -> None:
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())

    anyio.run(serve)


if __name__ == "__main__":
    main()
