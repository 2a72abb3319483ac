"""MCP ``CallToolResult`` -> :class:`~lattice_worker.tools.tool.ToolResult`.

Content blocks become Anthropic ``tool_result`` content blocks:

============================================  ==========================================
MCP                                           tool_result content
============================================  ==========================================
``text``                                      ``{"type": "text", "text": ...}``
``image`` (png / jpeg / gif / webp)           ``{"type": "image", "source": {"type": "base64", ...}}``
``image`` of another type, ``audio``          a text line saying what was left out
``resource`` with ``text``                    a text block headed by the resource's URI
``resource`` with a ``blob``                  an image block for the image types above,
                                              a ``document`` block for PDF, else a text line
``resource_link``                             a text line with the link's URI and name
============================================  ==========================================

``structuredContent`` becomes ``ToolResult.structured_result`` (and the text
content when the server sent no content blocks); ``isError`` becomes
``ToolResult.is_error``.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

import mcp.types as mcp_types

from ..tool import ToolResult

MODEL_IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
"""Image media types the Anthropic Messages API accepts in a tool result."""

EMPTY_RESULT_TEXT = "(the tool returned no content)"


def _size_of(data: str) -> str:
    try:
        return f"{len(base64.b64decode(data, validate=False))} bytes"
    except (binascii.Error, ValueError):
        return f"{len(data)} base64 characters"


def _image_block(data: str, media_type: str) -> dict[str, Any]:
    return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}


def _blob_block(uri: str, media_type: str | None, blob: str) -> dict[str, Any]:
    if media_type in MODEL_IMAGE_TYPES:
        return _image_block(blob, media_type)
    if media_type == "application/pdf":
        return {"type": "document", "source": {"type": "base64", "media_type": media_type, "data": blob}}
    return {
        "type": "text",
        "text": f"[resource {uri}: {media_type or 'binary data'}, {_size_of(blob)}; not shown]",
    }


def content_block(block: Any) -> dict[str, Any]:
    """One MCP content block (a pydantic model from ``mcp.types``) as a tool_result block."""
    if isinstance(block, mcp_types.TextContent):
        return {"type": "text", "text": block.text}
    if isinstance(block, mcp_types.ImageContent):
        if block.mime_type in MODEL_IMAGE_TYPES:
            return _image_block(block.data, block.mime_type)
        return {
            "type": "text",
            "text": f"[image of type {block.mime_type}, {_size_of(block.data)}: not a type the model accepts]",
        }
    if isinstance(block, mcp_types.AudioContent):
        return {
            "type": "text",
            "text": f"[audio of type {block.mime_type}, {_size_of(block.data)}: not shown]",
        }
    if isinstance(block, mcp_types.EmbeddedResource):
        resource = block.resource
        uri = str(resource.uri)
        if isinstance(resource, mcp_types.TextResourceContents):
            kind = f" ({resource.mime_type})" if resource.mime_type else ""
            return {"type": "text", "text": f"[resource {uri}{kind}]\n{resource.text}"}
        return _blob_block(uri, resource.mime_type, resource.blob)
    if isinstance(block, mcp_types.ResourceLink):
        parts = [f"[resource link {block.uri}", f"name: {block.name}"]
        if block.mime_type:
            parts.append(f"type: {block.mime_type}")
        if block.description:
            parts.append(f"description: {block.description}")
        return {"type": "text", "text": "; ".join(parts) + "]"}
    kind = getattr(block, "type", type(block).__name__)
    return {"type": "text", "text": f"[content of type {kind}: not shown]"}


def to_tool_result(result: mcp_types.CallToolResult) -> ToolResult:
    """Convert a server's ``CallToolResult`` (see the module doc)."""
    blocks = [content_block(b) for b in result.content]
    structured = result.structured_content
    if not blocks and structured is not None:
        blocks = [{"type": "text", "text": json.dumps(structured, ensure_ascii=False, default=str)}]
    if not blocks:
        blocks = [{"type": "text", "text": EMPTY_RESULT_TEXT}]
    return ToolResult(content=blocks, structured_result=structured, is_error=bool(result.is_error))


def error_result(text: str) -> ToolResult:
    """An ``is_error`` result with ``text`` (what the model sees)."""
    return ToolResult(content=text, is_error=True)


__all__ = ["EMPTY_RESULT_TEXT", "MODEL_IMAGE_TYPES", "content_block", "error_result", "to_tool_result"]
