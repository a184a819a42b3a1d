"""The package's shape, as the README's Architecture section draws it.

Read from the source with ``ast`` (nothing is imported), so a function-local import
counts like a top-level one: an import circle hidden inside a function is still a circle.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "airflow_provider_dblog"
MAX_LINES = 400


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted((ROOT / PACKAGE).rglob("*.py"))}


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The package modules ``name`` imports, anywhere in its body (TYPE_CHECKING blocks
    aside: they never run)."""
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(), str(path))
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip |= {id(n) for child in node.body for n in ast.walk(child)}
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = name.split(".") if is_package else name.split(".")[:-1]
            if node.level:
                base = base[:len(base) - node.level + 1] if node.level > 1 else base
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            targets = [module] + [f"{module}.{a.name}" for a in node.names]
        else:
            continue
        for t in targets:
            # the deepest known module the name is in ("pkg.mod.func" -> "pkg.mod")
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name and t.startswith(PACKAGE):
                found.add(t)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    graph = {name: _imports(name, path, known) for name, path in modules.items()}
    # importing a.b.c runs a/__init__ and a/b/__init__ first: a package's own
    # __init__ re-exporting its children is not a circle, so parent edges are left out
    return {n: {d for d in deps if not n.startswith(d + ".")} for n, deps in graph.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_the_import_reader_sees_function_local_imports(tmp_path):
    mod = tmp_path / "m.py"
    mod.write_text("def f():\n    from .state import RedisState\n")
    assert _imports(f"{PACKAGE}.engine.m", mod, {f"{PACKAGE}.engine.state"}) == {f"{PACKAGE}.engine.state"}


def test_no_import_cycles():
    assert _cycles(_graph()) == []


def test_the_engine_does_not_import_airflow():
    offenders = []
    for name, path in _modules().items():
        if not name.startswith(f"{PACKAGE}.engine"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            mods = ([a.name for a in node.names] if isinstance(node, ast.Import)
                    else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            offenders += [f"{name}: {m}" for m in mods if m == "airflow" or m.startswith("airflow.")]
    assert offenders == []


@pytest.mark.parametrize("layer", ["engine.targets", "engine.sources"])
def test_sources_and_targets_do_not_reach_up(layer):
    """Sources and targets sit under the dump/apply/tail drivers, never above them."""
    above = {f"{PACKAGE}.engine.{m}" for m in ("apply", "apply_plan", "apply_batch", "dump", "tail", "wiring",
                                                "jobs", "sweep", "lag", "verify")}
    graph = _graph()
    reach = {f"{n} -> {d}" for n, deps in graph.items() if n.startswith(f"{PACKAGE}.{layer}")
             for d in deps if d in above}
    assert reach == set()


# the modules that may still read a PostgreSQL target's tables directly: verification
# (issue 29 moves it onto the contract) and the dev demo's own reset
_TARGET_KIND_READERS = {f"{PACKAGE}.engine.verify", f"{PACKAGE}.devenv.demo"}


def test_the_apply_quarantine_and_sweep_use_the_target_contract_only():
    """Issue 28: nothing outside engine/targets imports an implementation (postgres.py,
    pg_*.py); the apply, the quarantine, the sweep and recovery see targets/base.py's
    contract through ``open_target``, so a lake target is one more implementation."""
    graph = _graph()
    targets = f"{PACKAGE}.engine.targets"
    allowed = {targets, f"{targets}.base"}
    reach = {f"{n} -> {d}" for n, deps in graph.items()
             if not n.startswith(targets) and n not in _TARGET_KIND_READERS
             for d in deps if d.startswith(targets) and d not in allowed}
    assert reach == set()


def test_no_module_is_too_long():
    long = {name: n for name, path in _modules().items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert long == {}
