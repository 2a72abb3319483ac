"""MCP input schemas made acceptable to the model provider.

Two things go wrong with real servers' ``inputSchema``:

* **references**: ``$ref`` into ``$defs`` / ``definitions`` (pydantic and zod emit
  them). Some providers and validators drop or mis-resolve them, so
  :func:`inline_refs` replaces every local reference with the schema it points
  to. A recursive reference (a tree node holding nodes) cannot be inlined: it
  stays a ``$ref`` and the definitions it points into stay in the schema, so it
  is still resolvable. A reference that cannot be resolved (remote URL, missing
  pointer) becomes ``{}`` (any value; the server still validates).
* **a top-level union**: Anthropic requires ``"type": "object"`` at the root and
  refuses ``anyOf`` / ``oneOf`` / ``allOf`` there. :func:`convert_input_schema`
  merges the object branches into one object (every property of every branch;
  required = what every branch requires) and lists the alternatives in the
  schema's ``description``. The exact union is kept as the *strict* schema,
  which the tool adapter checks the model's input against before calling the
  server. A root that cannot describe an object raises :class:`MCPSchemaError`;
  the adapter then refuses that tool alone.
"""

from __future__ import annotations

import copy
from typing import Any
from urllib.parse import unquote

MAX_INLINE_DEPTH = 32
"""Nested reference expansions deeper than this keep their ``$ref`` (with the definitions)."""

MAX_INLINED_NODES = 20_000
"""Schema nodes produced by inlining before the rest keep their ``$ref`` (guards a blow-up)."""

_DEF_CONTAINERS = ("$defs", "definitions")
_UNION_KEYS = ("anyOf", "oneOf")
_DATA_KEYWORDS = frozenset({"enum", "const", "default", "examples"})
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})


class MCPSchemaError(ValueError):
    """An MCP tool's input schema cannot be given to the model (the tool is refused)."""


def _pointer_parts(ref: str) -> list[str] | None:
    """``#/a/b~1c`` -> ``["a", "b/c"]``; ``None`` for anything but a local JSON pointer."""
    if ref == "#":
        return []
    if not ref.startswith("#/"):
        return None
    return [unquote(p).replace("~1", "/").replace("~0", "~") for p in ref[2:].split("/")]


def _pointer(*parts: str) -> str:
    return "#/" + "/".join(p.replace("~", "~0").replace("/", "~1") for p in parts)


def _lookup(root: Any, parts: list[str]) -> tuple[bool, Any]:
    node = root
    for part in parts:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return False, None
    return True, node


class _Inliner:
    def __init__(self, root: dict[str, Any]) -> None:
        self.root = root
        self.nodes = 0
        self.kept_refs = False
        self.unresolved: list[str] = []

    def walk(self, node: Any, stack: tuple[str, ...]) -> Any:
        self.nodes += 1
        if isinstance(node, list):
            return [self.walk(item, stack) for item in node]
        if not isinstance(node, dict):
            return node
        ref = node.get("$ref")
        if isinstance(ref, str):
            return self._ref(node, ref, stack)
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key in _DATA_KEYWORDS:
                out[key] = copy.deepcopy(value)  # data that may merely look like a schema
            elif key in _SCHEMA_MAPS and isinstance(value, dict):
                out[key] = {name: self.walk(sub, stack) for name, sub in value.items()}
            else:
                out[key] = self.walk(value, stack)
        return out

    def _ref(self, node: dict[str, Any], ref: str, stack: tuple[str, ...]) -> Any:
        siblings = {k: v for k, v in node.items() if k != "$ref"}
        parts = _pointer_parts(ref)
        found, target = (False, None) if parts is None else _lookup(self.root, parts)
        if not found:
            self.unresolved.append(ref)
            return self.walk(siblings, stack)  # any value (plus whatever the siblings say)
        if ref in stack or len(stack) >= MAX_INLINE_DEPTH or self.nodes > MAX_INLINED_NODES:
            self.kept_refs = True
            return {"$ref": ref, **self.walk(siblings, stack)}
        expanded = self.walk(target, (*stack, ref))
        if not siblings:
            return expanded
        if isinstance(expanded, dict):
            # 2020-12: keywords beside $ref apply too; the sibling's annotations win
            return {**expanded, **self.walk(siblings, stack)}
        if expanded is True:
            return self.walk(siblings, stack)
        return {"allOf": [expanded, self.walk(siblings, stack)]}


def inline_refs(schema: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``schema`` with its local ``$ref`` s inlined (a new dict; the input is not changed).

    Returns ``(schema, unresolved)``: ``unresolved`` lists the references that
    could not be resolved (each replaced by ``{}``). Recursive references stay,
    and so do the root's ``$defs`` / ``definitions`` then; otherwise those are
    dropped.
    """
    inliner = _Inliner(schema)
    out = inliner.walk(schema, ())
    if not isinstance(out, dict):  # a root "$ref" to a boolean schema
        out = {} if out is True else {"not": {}}
    if not inliner.kept_refs:
        for key in _DEF_CONTAINERS:
            out.pop(key, None)
    else:
        # a kept $ref points into the root's definitions: keep the ones still referenced,
        # each inlined as far as possible
        walker = _Inliner(schema)
        defs: dict[str, dict[str, Any]] = {}
        for key in _DEF_CONTAINERS:
            out.pop(key, None)
            value = schema.get(key)
            if isinstance(value, dict):
                defs[key] = {name: walker.walk(sub, (_pointer(key, name),)) for name, sub in value.items()}
        wanted: set[str] = set()
        pending = _refs_in(out)
        while pending:
            ref = pending.pop()
            if ref in wanted:
                continue
            wanted.add(ref)
            for key, entries in defs.items():
                for name, sub in entries.items():
                    if _pointer(key, name) == ref:
                        pending |= _refs_in(sub)
        for key, entries in defs.items():
            kept = {name: sub for name, sub in entries.items() if _pointer(key, name) in wanted}
            if kept:
                out[key] = kept
    return out, inliner.unresolved


def _refs_in(node: Any) -> set[str]:
    found: set[str] = set()
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str):
            found.add(ref)
        for key, value in node.items():
            if key not in _DATA_KEYWORDS:
                found |= _refs_in(value)
    elif isinstance(node, list):
        for item in node:
            found |= _refs_in(item)
    return found


def _types_of(schema: Any) -> set[str] | None:
    """The JSON types ``schema`` allows by its ``type`` keyword (``None``: not restricted)."""
    if not isinstance(schema, dict):
        return None
    t = schema.get("type")
    if t is None:
        return None
    if isinstance(t, str):
        return {t}
    if isinstance(t, list):
        return {x for x in t if isinstance(x, str)}
    return set()


def _may_be_object(schema: Any) -> bool:
    if schema is True:
        return True
    if not isinstance(schema, dict):
        return False
    types = _types_of(schema)
    return types is None or "object" in types


def _merge_property(props: dict[str, Any], name: str, schema: Any) -> None:
    if name not in props or props[name] == schema:
        props[name] = schema
        return
    existing = props[name]
    variants = existing["anyOf"] if isinstance(existing, dict) and set(existing) == {"anyOf"} else [existing]
    if schema not in variants:
        variants = [*variants, schema]
    props[name] = {"anyOf": variants}


def _describe_branch(branch: dict[str, Any]) -> str:
    required = branch.get("required") or []
    props = list((branch.get("properties") or {}).keys())
    if required:
        return "with " + ", ".join(str(r) for r in required)
    if props:
        return "with any of " + ", ".join(props)
    return "any object"


def _merge_union(root: dict[str, Any], key: str) -> dict[str, Any]:
    branches = root[key]
    if not isinstance(branches, list) or not branches:
        raise MCPSchemaError(f'"{key}" at the root must be a non-empty list of schemas')
    objects = [b for b in branches if _may_be_object(b)]
    if not objects:
        raise MCPSchemaError(
            f'none of the {len(branches)} alternatives of the root "{key}" describes an object; '
            "tool arguments are always a JSON object"
        )
    merged = {k: v for k, v in root.items() if k != key}
    props: dict[str, Any] = dict(merged.get("properties") or {})
    required_sets: list[set[str]] = []
    for branch in objects:
        if branch is True:
            required_sets.append(set())
            continue
        for name, sub in (branch.get("properties") or {}).items():
            _merge_property(props, name, sub)
        required_sets.append({r for r in branch.get("required") or [] if isinstance(r, str)})
    common = set.intersection(*required_sets) if required_sets else set()
    base_required = [r for r in merged.get("required") or [] if isinstance(r, str)]
    required = base_required + sorted(common - set(base_required))
    merged["type"] = "object"
    merged["properties"] = props
    if required:
        merged["required"] = required
    else:
        merged.pop("required", None)
    shapes = "; ".join(
        f"({i}) {_describe_branch(b if isinstance(b, dict) else {})}" for i, b in enumerate(objects, 1)
    )
    word = "exactly one" if key == "oneOf" else "at least one"
    note = f"The input must match {word} of these shapes: {shapes}."
    merged["description"] = f"{merged['description']}\n\n{note}" if merged.get("description") else note
    return merged


def _merge_all_of(root: dict[str, Any]) -> dict[str, Any]:
    merged = {k: v for k, v in root.items() if k != "allOf"}
    props: dict[str, Any] = dict(merged.get("properties") or {})
    required = [r for r in merged.get("required") or [] if isinstance(r, str)]
    for branch in root["allOf"] if isinstance(root["allOf"], list) else []:
        if branch is True:
            continue
        if not _may_be_object(branch):
            raise MCPSchemaError('a branch of the root "allOf" does not describe an object')
        for name, sub in (branch.get("properties") or {}).items():
            if name in props and props[name] != sub:
                props[name] = {"allOf": [props[name], sub]}
            else:
                props[name] = sub
        required += [r for r in branch.get("required") or [] if isinstance(r, str) and r not in required]
    merged["type"] = "object"
    merged["properties"] = props
    if required:
        merged["required"] = required
    return merged


class ConvertedSchema:
    """The result of :func:`convert_input_schema`.

    Attributes:
        model_schema: what the model is sent (``"type": "object"`` at the root, no
            root ``anyOf`` / ``oneOf`` / ``allOf``).
        strict_schema: the exact (reference-inlined) schema to check input against
            when ``model_schema`` is looser than the server's schema, else ``None``.
        unresolved_refs: references that could not be resolved (each became ``{}``).
    """

    __slots__ = ("model_schema", "strict_schema", "unresolved_refs")

    def __init__(
        self, model_schema: dict[str, Any], strict_schema: dict[str, Any] | None, unresolved_refs: list[str]
    ) -> None:
        self.model_schema = model_schema
        self.strict_schema = strict_schema
        self.unresolved_refs = unresolved_refs


def convert_input_schema(schema: Any) -> ConvertedSchema:
    """Make an MCP tool's ``inputSchema`` acceptable to the model (see the module doc).

    ``None`` or ``{}`` means "no arguments" (``{"type": "object", "properties": {}}``).
    Raises :class:`MCPSchemaError` when the schema is not a dict or its root cannot
    describe a JSON object.
    """
    if schema is None:
        schema = {}
    if not isinstance(schema, dict):
        raise MCPSchemaError(f"the input schema is {type(schema).__name__}, not a JSON Schema object")
    resolved, unresolved = inline_refs(schema)
    root = dict(resolved)
    lossy = False
    if "allOf" in root:
        root = _merge_all_of(root)
    for key in _UNION_KEYS:
        if key in root:
            root = _merge_union(root, key)
            lossy = True
    types = _types_of(root)
    if types is None:
        root["type"] = "object"
    elif "object" not in types:
        shown = ", ".join(sorted(types)) or repr(root.get("type"))
        raise MCPSchemaError(
            f"the input schema's root has type {shown}; tool arguments are always a JSON object"
        )
    elif types != {"object"}:
        root["type"] = "object"
    if "properties" not in root:
        root["properties"] = {}
    strict = resolved if lossy else None
    return ConvertedSchema(root, strict, unresolved)


__all__ = ["ConvertedSchema", "MCPSchemaError", "convert_input_schema", "inline_refs"]
