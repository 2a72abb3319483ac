"""The built-in file tools Read / Write / Edit / LS on a real file system (tmp dirs):
happy paths, every refusal as an is_error result, and the write bound (``..``,
absolute paths, symlinks inside the workspace pointing outside) with nothing
written outside."""

from __future__ import annotations

import os
import tracemalloc
from pathlib import Path

import pytest

from lattice_worker import ConfigError, create_builtin_tools
from lattice_worker.tools.builtin.files import READ_DEFAULT_LINES, READ_MAX_LINE_CHARS
from lattice_worker.tools.builtin.policy import open_for_reading, read_head
from tests.support.tools import by_name, call, snapshot, text


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    return root


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    root = tmp_path / "outside"
    root.mkdir()
    (root / "keep.txt").write_text("outside data\n")
    return root


@pytest.fixture
def tools(ws: Path):
    return create_builtin_tools(cwd=ws)


# --------------------------------------------------------------------------- definitions


def test_tools_names_inputs_concurrency_and_metadata(ws: Path) -> None:
    tools = create_builtin_tools(cwd=ws, allowed_directories=[ws], bash_timeout_ms=5000)
    assert [t.name for t in tools] == ["Read", "Write", "Edit", "LS", "Glob", "Grep", "Bash"]
    schema = {t.name: t.input_schema for t in tools}
    assert set(schema["Read"]["properties"]) == {"file_path", "offset", "limit"}
    assert schema["Read"]["required"] == ["file_path"]
    assert schema["Write"]["required"] == ["file_path", "content"]
    assert set(schema["Edit"]["properties"]) == {"file_path", "old_string", "new_string", "replace_all"}
    assert set(schema["LS"]["properties"]) == {"path"} and "required" not in schema["LS"]
    assert set(schema["Glob"]["properties"]) == {"pattern", "path"}
    assert set(schema["Grep"]["properties"]) == {"pattern", "path", "glob"}
    assert set(schema["Bash"]["properties"]) == {"command", "timeout_ms"}
    safe = {t.name for t in tools if t.check_concurrency_safe(None)}
    assert safe == {"Read", "LS", "Glob", "Grep"}
    for t in tools:
        assert t.metadata is not None and t.metadata["builtin"] is True
        workspace = t.metadata["workspace"]
        assert workspace.cwd == str(ws) and workspace.allowed_directories == (str(ws),)
        assert workspace.bash_timeout_ms == 5000
    assert not any(ws.iterdir())  # nothing touched on disk


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"cwd": 3}, 'option "cwd" expects a directory path'),
        ({"cwd": "x", "allowed_directories": "x"}, 'option "allowed_directories" expects a list'),
        ({"cwd": "x", "allowed_directories": [None]}, "item None is not one"),
        ({"cwd": "x", "bash_timeout_ms": 0}, 'option "bash_timeout_ms" expects a positive integer'),
        ({"cwd": "x", "bash_timeout_ms": 1.5}, "milliseconds"),
    ],
)
def test_bad_options_are_config_errors(options: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        create_builtin_tools(**options)


def test_relative_cwd_and_allowed_directories(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tool,) = [
        t for t in create_builtin_tools(cwd="proj", allowed_directories=["out", "/abs"]) if t.name == "Read"
    ]
    workspace = tool.metadata["workspace"]
    assert workspace.cwd == str(tmp_path / "proj")
    assert workspace.allowed_directories == (str(tmp_path / "proj" / "out"), "/abs")


# --------------------------------------------------------------------------- Read


async def test_read_numbers_lines_and_honours_offset_and_limit(ws: Path, tools) -> None:
    (ws / "f.txt").write_text("".join(f"line {i}\n" for i in range(1, 11)))
    whole = text(await call(tools, "Read", {"file_path": "f.txt"}))
    assert whole.splitlines()[0] == "     1\tline 1" and whole.splitlines()[-1] == "    10\tline 10"
    part = await call(tools, "Read", {"file_path": str(ws / "f.txt"), "offset": 3, "limit": 2})
    assert not part.is_error
    assert text(part) == "     3\tline 3\n     4\tline 4\n[... more lines follow; read on with offset=5]"
    tail = text(await call(tools, "Read", {"file_path": "f.txt", "offset": 9}))
    assert tail == "     9\tline 9\n    10\tline 10"


async def test_read_bounds_long_files_and_long_lines(ws: Path, tools) -> None:
    (ws / "long.txt").write_text("x\n" * (READ_DEFAULT_LINES + 5))
    out = text(await call(tools, "Read", {"file_path": "long.txt"}))
    assert out.count("\n") == READ_DEFAULT_LINES  # the lines plus the note line
    assert out.endswith(f"read on with offset={READ_DEFAULT_LINES + 1}]")
    (ws / "wide.txt").write_text("y" * (READ_MAX_LINE_CHARS + 123) + "\n")
    wide = text(await call(tools, "Read", {"file_path": "wide.txt"}))
    assert wide.endswith("[... line cut: 123 characters]") and wide.count("y") == READ_MAX_LINE_CHARS


async def test_read_of_a_huge_line_holds_only_a_bounded_piece_in_memory(ws: Path, tools) -> None:
    (ws / "one.txt").write_bytes(b"x" * 20_000_000 + b"\nsecond\n")  # a dump without line breaks
    tracemalloc.start()
    try:
        result = await call(tools, "Read", {"file_path": "one.txt"})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert text(result).splitlines() == [
        f"     1\t{'x' * READ_MAX_LINE_CHARS} [... line cut: {20_000_000 - READ_MAX_LINE_CHARS} characters]",
        "     2\tsecond",
    ]
    assert peak < 2_000_000, peak  # not the 20 MB line (let alone its decoded copy)


async def test_read_reads_outside_the_allowed_directories(outside: Path, tools) -> None:
    result = await call(tools, "Read", {"file_path": str(outside / "keep.txt")})
    assert not result.is_error and "outside data" in text(result)


@pytest.mark.parametrize(
    ("setup", "args", "message"),
    [
        (None, {"file_path": "missing.txt"}, "missing.txt does not exist"),
        ("dir", {"file_path": "sub"}, "sub is a directory, not a file"),
        ("binary", {"file_path": "blob.bin"}, "blob.bin is a binary file"),
        ("small", {"file_path": "small.txt", "offset": 5}, "offset 5 is past the end of"),
    ],
)
async def test_read_refusals(ws: Path, tools, setup: str | None, args: dict, message: str) -> None:
    (ws / "sub").mkdir()
    (ws / "blob.bin").write_bytes(b"PK\0\3abc")
    (ws / "small.txt").write_text("a\nb\n")
    result = await call(tools, "Read", args)
    assert result.is_error and text(result).startswith("Read: ") and message in text(result)
    assert str(ws) in text(result)  # the path is named


async def test_read_empty_file(ws: Path, tools) -> None:
    (ws / "empty").write_text("")
    result = await call(tools, "Read", {"file_path": "empty"})
    assert not result.is_error and "is empty" in text(result)


async def test_read_input_is_validated_before_the_handler(tools) -> None:
    definition = by_name(tools)["Read"]
    with pytest.raises(Exception, match="offset: Input should be greater than or equal to 1"):
        definition.parse_input({"file_path": "x", "offset": 0})
    with pytest.raises(Exception, match="path: Extra inputs are not permitted"):
        definition.parse_input({"file_path": "x", "path": "y"})


# --------------------------------------------------------------------------- Write / Edit


async def test_write_creates_parents_and_overwrites(ws: Path, tools) -> None:
    created = await call(tools, "Write", {"file_path": "a/b/c.txt", "content": "héllo\r\n"})
    assert not created.is_error and text(created).startswith("Created ")
    assert (ws / "a/b/c.txt").read_bytes() == "héllo\r\n".encode()  # no newline translation
    again = await call(tools, "Write", {"file_path": str(ws / "a/b/c.txt"), "content": "new"})
    assert text(again).startswith("Overwrote ") and (ws / "a/b/c.txt").read_text() == "new"


async def test_write_of_text_utf8_cannot_encode_is_refused_and_keeps_the_file(ws: Path, tools) -> None:
    (ws / "keep.txt").write_text("precious\n")
    result = await call(tools, "Write", {"file_path": "keep.txt", "content": "a\ud800b"})
    assert result.is_error and "cannot be written as UTF-8" in text(result) and "position 1" in text(result)
    assert (ws / "keep.txt").read_text() == "precious\n"


async def test_write_to_a_directory_is_refused(ws: Path, tools) -> None:
    (ws / "d").mkdir()
    result = await call(tools, "Write", {"file_path": "d", "content": "x"})
    assert result.is_error and "is a directory" in text(result)


async def test_edit_replaces_exactly_once_or_all(ws: Path, tools) -> None:
    target = ws / "code.py"
    target.write_text("a = 1\nb = 1\n")
    once = await call(tools, "Edit", {"file_path": "code.py", "old_string": "a = 1", "new_string": "a = 2"})
    assert not once.is_error and "replaced 1 occurrence" in text(once)
    assert target.read_text() == "a = 2\nb = 1\n"
    every = await call(
        tools, "Edit", {"file_path": "code.py", "old_string": "= ", "new_string": "== ", "replace_all": True}
    )
    assert "replaced 2 occurrences" in text(every) and target.read_text() == "a == 2\nb == 1\n"


async def test_edit_run_again_edits_again_so_it_is_not_declared_idempotent(ws: Path, tools) -> None:
    """What a re-run after a crash would do: the same input changes the file a second time."""
    target = ws / "name.txt"
    target.write_text("a\n")
    edit = {"file_path": "name.txt", "old_string": "a", "new_string": "ab"}
    assert not (await call(tools, "Edit", edit)).is_error and target.read_text() == "ab\n"
    assert not (await call(tools, "Edit", edit)).is_error and target.read_text() == "abb\n"
    assert by_name(tools)["Edit"].effect == "unguarded"  # interrupted: parks, never re-run blindly
    write = {"file_path": "name.txt", "content": "x\n"}
    for _ in range(2):  # Write is: the same content again changes nothing
        assert not (await call(tools, "Write", write)).is_error and target.read_text() == "x\n"
    assert by_name(tools)["Write"].effect == "idempotent"


async def test_edit_of_a_crlf_file_with_the_lines_read_shows(ws: Path, tools) -> None:
    """Read shows a CRLF file's lines without the CR, so the model copies LF text:
    Edit matches it against the CRLF lines and keeps the file's line endings."""
    target = ws / "dos.txt"
    target.write_bytes(b"one\r\ntwo\r\nthree\r\n")
    assert "\r" not in text(await call(tools, "Read", {"file_path": "dos.txt"}))
    result = await call(
        tools, "Edit", {"file_path": "dos.txt", "old_string": "one\ntwo", "new_string": "1\n2"}
    )
    assert not result.is_error, text(result)
    assert target.read_bytes() == b"1\r\n2\r\nthree\r\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"file_path": "nope.py", "old_string": "a", "new_string": "b"}, "nope.py does not exist"),
        ({"file_path": "code.py", "old_string": "zzz", "new_string": "b"}, "old_string was not found in"),
        ({"file_path": "code.py", "old_string": "x", "new_string": "y"}, "old_string occurs 2 times in"),
        ({"file_path": "code.py", "old_string": "", "new_string": "y"}, "old_string is empty"),
        ({"file_path": "code.py", "old_string": "x", "new_string": "x"}, "are the same"),
        ({"file_path": "blob.bin", "old_string": "a", "new_string": "b"}, "is a binary file"),
        ({"file_path": "latin1.txt", "old_string": "a", "new_string": "b"}, "is not UTF-8 text"),
        # a lone surrogate (valid JSON: "\ud800") cannot be encoded: the file must survive
        (
            {"file_path": "code.py", "old_string": "x = 1", "new_string": "\ud800"},
            "cannot be written as UTF-8",
        ),
    ],
)
async def test_edit_refusals_change_nothing(ws: Path, tools, args: dict, message: str) -> None:
    (ws / "code.py").write_text("x = 1\nx = 2\n")
    (ws / "blob.bin").write_bytes(b"a\0b")
    (ws / "latin1.txt").write_bytes("caf\xe9 a".encode("latin-1"))
    before = snapshot(ws)
    result = await call(tools, "Edit", args)
    assert result.is_error and text(result).startswith("Edit: ") and message in text(result)
    assert str(ws) in text(result)
    assert snapshot(ws) == before


# --------------------------------------------------------------------------- the write bound


def escape_paths(ws: Path, outside: Path) -> list[str]:
    os.symlink(outside, ws / "link_dir")  # a directory link inside pointing outside
    os.symlink(outside / "keep.txt", ws / "link_file")  # a file link inside pointing outside
    return [
        "../outside/new.txt",
        "sub/../../outside/new.txt",
        str(outside / "new.txt"),
        str(outside / "keep.txt"),
        "link_dir/new.txt",
        "link_file",
        "~/new.txt",  # the (temporary) home directory is not allowed either
    ]


async def test_write_outside_allowed_directories_is_refused(ws: Path, outside: Path, tools) -> None:
    home = Path(os.environ["HOME"])
    for path in escape_paths(ws, outside):
        result = await call(tools, "Write", {"file_path": path, "content": "pwned"})
        assert result.is_error, path
        message = text(result)
        assert message.startswith(f"Write: {path}") and "outside the allowed directories" in message, message
        assert f"({ws})" in message
    assert snapshot(outside) == {"keep.txt": b"outside data\n"}
    assert not (home / "new.txt").exists()


async def test_edit_outside_allowed_directories_is_refused(ws: Path, outside: Path, tools) -> None:
    for path in escape_paths(ws, outside):
        result = await call(
            tools, "Edit", {"file_path": path, "old_string": "outside", "new_string": "pwned"}
        )
        assert result.is_error and "outside the allowed directories" in text(result), path
    assert snapshot(outside) == {"keep.txt": b"outside data\n"}


async def test_a_hard_link_to_a_file_outside_is_not_written_through(ws: Path, outside: Path, tools) -> None:
    os.link(
        outside / "keep.txt", ws / "hard"
    )  # e.g. made by an earlier Bash call: ln ../outside/keep.txt hard
    for name, args in [
        ("Write", {"file_path": "hard", "content": "pwned"}),
        ("Edit", {"file_path": "hard", "old_string": "outside", "new_string": "pwned"}),
    ]:
        result = await call(tools, name, args)
        assert result.is_error, name
        message = text(result)
        assert message.startswith(f"{name}: {ws / 'hard'} has 2 hard links") and "is refused" in message, (
            message
        )
    assert snapshot(outside) == {"keep.txt": b"outside data\n"}
    os.unlink(ws / "hard")  # the way out the message names: a file of its own
    assert not (await call(tools, "Write", {"file_path": "hard", "content": "mine"})).is_error
    assert snapshot(outside) == {"keep.txt": b"outside data\n"}


async def test_a_symlink_resolving_inside_is_allowed(ws: Path, tools) -> None:
    (ws / "real").mkdir()
    os.symlink(ws / "real", ws / "alias")
    result = await call(tools, "Write", {"file_path": "alias/f.txt", "content": "ok"})
    assert not result.is_error and (ws / "real" / "f.txt").read_text() == "ok"


async def test_a_symlinked_workspace_root_still_allows_its_own_files(tmp_path: Path) -> None:
    (tmp_path / "actual").mkdir()
    os.symlink(tmp_path / "actual", tmp_path / "ws_link")
    tools = create_builtin_tools(cwd=tmp_path / "ws_link")
    result = await call(tools, "Write", {"file_path": "f.txt", "content": "ok"})
    assert not result.is_error and (tmp_path / "actual" / "f.txt").read_text() == "ok"


async def test_extra_allowed_directories(ws: Path, outside: Path) -> None:
    tools = create_builtin_tools(cwd=ws, allowed_directories=[ws, outside])
    result = await call(tools, "Write", {"file_path": str(outside / "new.txt"), "content": "fine"})
    assert not result.is_error and (outside / "new.txt").read_text() == "fine"
    only_out = create_builtin_tools(cwd=ws, allowed_directories=[outside])
    refused = await call(only_out, "Write", {"file_path": "in-cwd.txt", "content": "x"})
    assert refused.is_error and not (ws / "in-cwd.txt").exists()


# --------------------------------------------------------------------------- LS


async def test_ls_lists_sorted_with_kinds(ws: Path, tools) -> None:
    (ws / "b.txt").write_text("")
    (ws / "a").mkdir()
    (ws / ".hidden").write_text("")
    os.symlink("b.txt", ws / "c")
    out = text(await call(tools, "LS", {}))
    assert out.splitlines() == [f"{ws}:", ".hidden", "a/", "b.txt", "c -> b.txt"]
    assert text(await call(tools, "LS", {"path": "a"})) == f"{ws / 'a'}: (empty directory)"


@pytest.mark.parametrize(
    ("path", "message"), [("nope", "does not exist"), ("f.txt", "is a file, not a directory")]
)
async def test_ls_refusals(ws: Path, tools, path: str, message: str) -> None:
    (ws / "f.txt").write_text("")
    result = await call(tools, "LS", {"path": path})
    assert result.is_error and message in text(result) and str(ws / path) in text(result)


async def test_a_missing_cwd_is_an_error_not_created(tmp_path: Path) -> None:
    tools = create_builtin_tools(cwd=tmp_path / "absent")
    result = await call(tools, "LS", {})
    assert result.is_error and "absent" in text(result)
    assert not (tmp_path / "absent").exists()


def test_files_are_opened_without_waiting_for_data(ws: Path) -> None:
    """Some pseudo-files are regular files that block a read until data comes
    (/proc/kmsg as root): Read and Grep open with O_NONBLOCK. A FIFO without a
    writer shows it: a plain open for reading would wait for one for good."""
    os.mkfifo(ws / "pipe")
    with open_for_reading(str(ws / "pipe")) as raw:
        assert read_head(raw) == b""


async def test_devices_and_fifos_are_refused_not_waited_on(ws: Path, tools) -> None:
    os.mkfifo(ws / "pipe")
    for name, args in [
        ("Read", {"file_path": "pipe"}),
        ("Write", {"file_path": "pipe", "content": "x"}),
        ("Edit", {"file_path": "pipe", "old_string": "a", "new_string": "b"}),
        ("Grep", {"pattern": "x", "path": "pipe"}),
        ("Read", {"file_path": "/dev/null"}),
    ]:
        result = await call(tools, name, args)
        assert result.is_error and "is not a regular file" in text(result), (name, text(result))
