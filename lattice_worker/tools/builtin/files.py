"""The file tools ``Read``, ``Write``, ``Edit`` and ``LS``.

Inputs (paths relative to the workspace's ``cwd`` unless absolute, ``~`` expanded):

* ``Read {file_path, offset?, limit?}`` -- a text file as numbered lines
  (``cat -n`` style). ``offset`` is the 1-based first line (default 1), ``limit``
  the number of lines (default :data:`READ_DEFAULT_LINES`); a line longer than
  :data:`READ_MAX_LINE_CHARS` characters is cut, and the answer stops at
  ``MAX_OUTPUT_CHARS`` characters with a note saying where to read on. Binary
  files (a NUL byte in the first 8 KiB) are refused. Reads anything the
  process may read.
* ``Write {file_path, content}`` -- writes UTF-8 ``content`` (no newline
  translation), creating parent directories; only inside ``allowed_directories``.
* ``Edit {file_path, old_string, new_string, replace_all?}`` -- replaces the
  exact text ``old_string`` of an existing UTF-8 file; without ``replace_all``
  it must occur exactly once. In a file with CRLF line endings, line feeds in
  ``old_string`` and ``new_string`` stand for CRLF when the text is not found
  as given (``Read`` shows the lines without the CR). Only inside ``allowed_directories``; files over
  :data:`EDIT_MAX_BYTES` bytes are refused.
* ``LS {path?}`` -- the entries of a directory (default the ``cwd``), sorted,
  directories with a trailing ``/``, links as ``name -> target``; at most
  :data:`LS_MAX_ENTRIES` entries.

Every refusal is an error result naming the path and the rule (see
:mod:`.policy`).
"""

from __future__ import annotations

import io
import os
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from ..tool import ToolContext, ToolDefinition
from .policy import (
    BINARY_SNIFF_BYTES,
    MAX_OUTPUT_CHARS,
    Refusal,
    Workspace,
    bounded_lines,
    define_tool,
    is_binary,
    open_for_reading,
    read_head,
)

READ_DEFAULT_LINES = 2000
"""Lines ``Read`` returns when ``limit`` is not given."""

READ_MAX_LINE_CHARS = 2000
"""Characters of one line ``Read`` shows; the rest of a longer line is cut."""

EDIT_MAX_BYTES = 10_000_000
"""Largest file, in bytes, that ``Edit`` rewrites."""

LS_MAX_ENTRIES = 1000
"""Entries ``LS`` lists; a note says how many more there are."""

PositiveLine = Annotated[int, Field(ge=1)]


class ReadInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    file_path: str = Field(
        description="Path of the file to read (relative to your working directory, or absolute)."
    )
    offset: PositiveLine | None = Field(
        None, description="1-based line number to start reading at (default 1)."
    )
    limit: PositiveLine | None = Field(
        None, description=f"Number of lines to read (default {READ_DEFAULT_LINES})."
    )


class WriteInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    file_path: str = Field(description="Path of the file to write; parent directories are created.")
    content: str = Field(description="The whole new content of the file.")


class EditInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    file_path: str = Field(description="Path of the existing file to change.")
    old_string: str = Field(description="The exact text to replace (whitespace included).")
    new_string: str = Field(description="The text to put in its place.")
    replace_all: bool = Field(False, description="Replace every occurrence instead of exactly one.")


class LSInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str | None = Field(None, description="Directory to list (default: your working directory).")


def _existing_file(path: str) -> None:
    if os.path.isdir(path):
        raise Refusal(f"{path} is a directory, not a file (use LS to list it)")
    if not os.path.exists(path):
        raise Refusal(f"{path} does not exist")
    _regular(path)


def _regular(path: str) -> None:
    # a FIFO or a device could block the worker thread for good
    if not os.path.isfile(path):
        raise Refusal(f"{path} is not a regular file (a device, FIFO or socket)")


def _utf8(text: str, field: str, target: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise Refusal(
            f"{field} cannot be written as UTF-8: {exc.reason} (character {text[exc.start]!r} at position "
            f"{exc.start}); {target} was not changed"
        ) from None


def read_file(ws: Workspace, args: ReadInput, ctx: ToolContext) -> str:
    path = ws.absolute(args.file_path)
    _existing_file(path)
    offset = args.offset or 1
    limit = args.limit or READ_DEFAULT_LINES
    with open_for_reading(path) as raw:
        if is_binary(read_head(raw)):
            raise Refusal(f"{path} is a binary file; Read returns text files only")
        raw.seek(0)
        text = io.TextIOWrapper(raw, encoding="utf-8", errors="replace")
        lines: list[str] = []
        size = 0
        last = 0
        more = False
        for number, line, left_out in bounded_lines(text, READ_MAX_LINE_CHARS):
            last = number
            if number < offset:
                continue
            if len(lines) >= limit or size >= MAX_OUTPUT_CHARS:
                more = True
                break
            if left_out:
                line += f" [... line cut: {left_out} characters]"
            shown = f"{number:>6}\t{line}"
            lines.append(shown)
            size += len(shown) + 1
    if last == 0:
        return f"(the file {path} is empty)"
    if not lines:
        raise Refusal(f"offset {offset} is past the end of {path}, which has {last} lines")
    body = "\n".join(lines)
    if more:
        body += f"\n[... more lines follow; read on with offset={offset + len(lines)}]"
    return body


def write_file(ws: Workspace, args: WriteInput, ctx: ToolContext) -> str:
    target = ws.writable(args.file_path, what="writing")
    if os.path.isdir(target):
        raise Refusal(f"{target} is a directory; Write writes files")
    existed = os.path.exists(target)
    if existed:
        _regular(target)
    data = _utf8(args.content, "content", target)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with open(target, "wb") as out:
        out.write(data)
    return f"{'Overwrote' if existed else 'Created'} {target} ({len(data)} bytes)"


def edit_file(ws: Workspace, args: EditInput, ctx: ToolContext) -> str:
    target = ws.writable(args.file_path, what="editing")
    _existing_file(target)
    if args.old_string == "":
        raise Refusal(f"old_string is empty; use Write to create or overwrite {target} as a whole")
    if args.old_string == args.new_string:
        raise Refusal(f"old_string and new_string are the same; nothing in {target} would change")
    _utf8(args.new_string, "new_string", target)  # before the file is opened for writing
    size = os.path.getsize(target)
    if size > EDIT_MAX_BYTES:
        raise Refusal(f"{target} has {size} bytes; Edit changes files up to {EDIT_MAX_BYTES} bytes")
    with open(target, "rb") as raw:
        data = raw.read()
    if is_binary(data[:BINARY_SNIFF_BYTES]):
        raise Refusal(f"{target} is a binary file; Edit changes text files only")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Refusal(f"{target} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    old, new = args.old_string, args.new_string
    count = text.count(old)
    if count == 0 and "\r\n" in text and "\n" in old and "\r\n" not in old:
        # Read shows a CRLF file's lines without the CR: match the model's LF text against them
        old, new = old.replace("\n", "\r\n"), new.replace("\n", "\r\n")
        count = text.count(old)
    if count == 0:
        raise Refusal(
            f"old_string was not found in {target}; Read the file and copy the exact text, whitespace included"
        )
    if count > 1 and not args.replace_all:
        raise Refusal(
            f"old_string occurs {count} times in {target}; include more surrounding text to make it "
            "unique, or set replace_all to replace every occurrence"
        )
    data = text.replace(old, new).encode("utf-8")
    with open(target, "wb") as out:
        out.write(data)
    return f"Edited {target}: replaced {count} occurrence{'s' if count != 1 else ''}"


def list_directory(ws: Workspace, args: LSInput, ctx: ToolContext) -> str:
    path = ws.absolute(args.path) if args.path else ws.cwd
    if not os.path.exists(path):
        raise Refusal(f"{path} does not exist")
    if not os.path.isdir(path):
        raise Refusal(f"{path} is a file, not a directory (use Read to read it)")
    with os.scandir(path) as it:
        entries = sorted(it, key=lambda e: e.name)
    shown: list[str] = []
    for entry in entries[:LS_MAX_ENTRIES]:
        if entry.is_symlink():
            try:
                shown.append(f"{entry.name} -> {os.readlink(entry.path)}")
            except OSError:
                shown.append(entry.name)
        elif entry.is_dir():
            shown.append(entry.name + "/")
        else:
            shown.append(entry.name)
    if not shown:
        return f"{path}: (empty directory)"
    body = f"{path}:\n" + "\n".join(shown)
    if len(entries) > LS_MAX_ENTRIES:
        body += f"\n[... {len(entries) - LS_MAX_ENTRIES} more entries not shown]"
    return body


def file_tools(ws: Workspace) -> list[ToolDefinition]:
    """``Read``, ``Write``, ``Edit`` and ``LS`` over ``ws``."""
    return [
        define_tool(
            ws,
            "Read",
            "Read a text file as numbered lines, optionally from a 1-based line offset and with a line limit. "
            "Reads any file you can access.",
            ReadInput,
            read_file,
            read_only=True,
        ),
        define_tool(
            ws,
            "Write",
            "Write a whole file (UTF-8), creating parent directories. Only inside the allowed directories.",
            WriteInput,
            write_file,
            read_only=False,
        ),
        define_tool(
            ws,
            "Edit",
            "Replace exact text in an existing file: old_string must occur exactly once unless replace_all "
            "is set. Only inside the allowed directories.",
            EditInput,
            edit_file,
            read_only=False,
        ),
        define_tool(
            ws,
            "LS",
            "List a directory (default: your working directory); directories end with '/'.",
            LSInput,
            list_directory,
            read_only=True,
        ),
    ]


__all__ = [
    "EDIT_MAX_BYTES",
    "LS_MAX_ENTRIES",
    "READ_DEFAULT_LINES",
    "READ_MAX_LINE_CHARS",
    "file_tools",
]
