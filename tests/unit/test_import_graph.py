"""The packages' import graph: no cycles, and the layering the README's Layout states.

Every import counts -- module level, ``TYPE_CHECKING``-only and function-local:
a cycle hidden in a function is still a cycle. ``lattice_mailbox`` knows
nothing of the other two packages; ``lattice_client`` imports
``lattice_worker`` nowhere at module level (the worker-side CLI commands
import it lazily, inside functions).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("lattice_mailbox", "lattice_client", "lattice_worker")


def _modules() -> dict[str, Path]:
    mods: dict[str, Path] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            mods[name] = path
    return mods


def _resolve(mods: dict[str, Path], current: str, level: int, module: str | None) -> str:
    """The absolute module name of ``from <level dots><module> import ...`` in ``current``."""
    if not level:
        return module or ""
    base = current.split(".")
    if mods[current].name != "__init__.py":
        base = base[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def _imports(mods: dict[str, Path], name: str) -> list[tuple[str, bool]]:
    """``(imported module, at module level)`` for every import in module ``name``
    (``from X import y`` counts X, and X.y when that is a module)."""
    tree = ast.parse(mods[name].read_text(encoding="utf-8"))
    top = {id(node) for node in tree.body if isinstance(node, ast.Import | ast.ImportFrom)}
    found: list[tuple[str, bool]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(mods, name, node.level, node.module)
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        found += [(target, id(node) in top) for target in targets]
    return found


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {
        name: {target for target, _ in _imports(mods, name) if target in mods and target != name}
        for name in mods
    }


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycles_among_the_packages_modules():
    assert _cycles(_graph()) == []


def test_the_cycle_finder_finds_a_cycle():
    # the check above must be able to fail
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _cycles(edges) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_sees_type_checking_and_function_local_imports():
    mods = _modules()
    # a TYPE_CHECKING-only import: agent.query_run names the tool type for its annotations only
    assert ("lattice_worker.tools.tool", False) in _imports(mods, "lattice_worker.agent.query_run")
    assert "lattice_worker.tools.tool" in _graph()["lattice_worker.agent.query_run"]
    # a function-local import: `lattice worker` loads the process state when it runs
    assert ("lattice_worker.runtime.worker.process", False) in _imports(
        mods, "lattice_worker.runtime.worker.main"
    )
    assert ("lattice_worker.runtime.worker.registry", True) in _imports(
        mods, "lattice_worker.runtime.worker.main"
    )


def test_lattice_mailbox_imports_neither_the_client_nor_the_worker():
    mods = _modules()
    for name in (m for m in mods if m.split(".")[0] == "lattice_mailbox"):
        wrong = [
            t for t, _ in _imports(mods, name) if t.split(".")[0] in ("lattice_client", "lattice_worker")
        ]
        assert wrong == [], (name, wrong)


def test_lattice_client_imports_lattice_worker_nowhere_at_module_level():
    mods = _modules()
    for name in (m for m in mods if m.split(".")[0] == "lattice_client"):
        wrong = [t for t, top in _imports(mods, name) if top and t.split(".")[0] == "lattice_worker"]
        assert wrong == [], (name, wrong)


def test_the_runtime_lives_in_one_package():
    top = sorted(p.name for p in (ROOT / "lattice_worker").iterdir() if not p.name.startswith(("_", ".")))
    assert top == [
        "agent",
        "demo.py",
        "errors.py",
        "examples",
        "py.typed",
        "runtime",
        "team",
        "tools",
        "tracing",
    ]


# the runtime's sub-packages, lowest first: each imports only from those before it
RUNTIME_LAYERS = ("run", "limits", "member", "lead", "reaper", "worker")


def test_the_runtime_is_one_folder_per_role_with_no_flat_modules():
    runtime = ROOT / "lattice_worker" / "runtime"
    flat = sorted(p.name for p in runtime.glob("*.py") if p.name != "__init__.py")
    assert flat == []
    packages = sorted(p.name for p in runtime.iterdir() if (p / "__init__.py").exists())
    assert packages == sorted(RUNTIME_LAYERS)


def _layer_violations(edges: dict[str, set[str]]) -> list[tuple[str, str]]:
    rank = {name: i for i, name in enumerate(RUNTIME_LAYERS)}
    wrong = []
    for module, targets in edges.items():
        parts = module.split(".")
        if parts[:2] != ["lattice_worker", "runtime"] or len(parts) < 4:
            continue
        for target in targets:
            tparts = target.split(".")
            if tparts[:2] == ["lattice_worker", "runtime"] and len(tparts) >= 3 and tparts[2] in rank:
                if rank[tparts[2]] > rank[parts[2]]:
                    wrong.append((module, target))
    return sorted(wrong)


def test_the_runtime_packages_import_only_lower_layers():
    # run <- limits <- member <- lead <- reaper <- worker: no package-level cycle either
    assert _layer_violations(_graph()) == []


def test_the_layer_check_finds_an_upward_import():
    edges = {"lattice_worker.runtime.run.context": {"lattice_worker.runtime.worker.process"}}
    assert _layer_violations(edges) == [
        ("lattice_worker.runtime.run.context", "lattice_worker.runtime.worker.process")
    ]
