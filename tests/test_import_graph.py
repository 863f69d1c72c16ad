"""The module import graph, read statically (every ``import``, also inside functions): no cycles,
and ``core`` imports nothing above it."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _packages() -> dict[str, Path]:
    """Top-level package name → folder, from pyproject's ``package-dir`` table."""
    text = (ROOT / "pyproject.toml").read_text()
    table = re.search(r"package-dir = \{([^}]*)\}", text)
    assert table is not None
    return {name: ROOT / folder for name, folder in re.findall(r'"([\w.]+)" = "([\w/]+)"', table.group(1))}


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for package, folder in _packages().items():
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([package, *parts])] = path
    return out


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The known modules ``name`` imports anywhere in its body (``from x import y`` counts x,
    and x.y when that is a module)."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return {m for m in found if m in known and m != name}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, set(modules)) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[v] = min(low[v], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def test_the_cycle_finder_finds_a_known_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _cycles(graph) == [["a", "b", "c"]]


def test_the_reader_sees_imports_inside_functions():
    graph = _graph()
    assert "balanceroute.analysis.experiments" in graph["balanceroute.analysis.reproduce"]  # in a function


def test_no_module_imports_itself_back_even_inside_functions():
    assert _cycles(_graph()) == []


def test_core_imports_nothing_above_it():
    upward = {name: sorted(m for m in deps if not m.startswith("balanceroute.core"))
              for name, deps in _graph().items() if name.startswith("balanceroute.core")}
    assert {name: deps for name, deps in upward.items() if deps} == {}
