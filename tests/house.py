"""The house rules as functions over a source tree: its import graph, its cycles and its layer breaks.

tests/repository/test_house.py applies them to this repository and, on a planted tree, proves they catch a cycle
and a layer break. Every import counts (module level, function-local and under TYPE_CHECKING): Python runs a
function-local one too, so it closes a circle just the same.
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass, field
from pathlib import Path

# Folders that hold no project module: tests are allowed to import anything, virtualenvs are not ours.
SKIP_DIRS = {"tests", "templates"}

# Modules of verification/ are imported by their top-level names, as Pulumi imports that directory.
FLAT_PACKAGES = {"verification"}
# The one package whose rooms are its sub-packages: each room is a "package" of the layer table.
ROOMED = "kimi_cluster"


@dataclass
class Graph:
    """Project modules (dotted name -> path, package) and the project-internal import edges between them."""

    paths: dict[str, Path] = field(default_factory=dict)
    packages: dict[str, str] = field(default_factory=dict)
    edges: dict[str, set[str]] = field(default_factory=dict)


def _module_name(rel: Path) -> tuple[str, str]:
    """(dotted module name, top-level package) of a .py file given relative to the root."""
    parts = rel.with_suffix("").parts
    if len(parts) == 1:
        return parts[0], parts[0]  # a top-level file: __main__.py is its own "package"
    package = parts[0]
    if package == ROOMED and len(parts) > 2:
        package = f"{parts[0]}.{parts[1]}"
    if package in FLAT_PACKAGES and parts[-1] != "__main__":
        return ".".join(parts[1:]), package
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts), package


def _skipped_dir(rel: Path) -> bool:
    first = rel.parts[0]
    return first in SKIP_DIRS or first.startswith(".") or first.startswith("venv") or rel.name == "__pycache__"


def _python_files(root: Path) -> list[Path]:
    """The .py files outside skipped folders, which are never entered: the virtualenvs hold some 90,000 files, and
    walking them first cost each graph about 3 CPU-seconds."""
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not _skipped_dir(Path(folder, d).relative_to(root))]
        found += [Path(folder, f) for f in files if f.endswith(".py")]
    return sorted(found)


def build_graph(root: Path) -> Graph:
    graph = Graph()
    files: dict[str, tuple[Path, bool]] = {}
    for path in _python_files(root):
        rel = path.relative_to(root)
        name, package = _module_name(rel)
        graph.paths[name] = path
        graph.packages[name] = package
        files[name] = (path, path.name == "__init__.py")
    for name, (path, is_package) in files.items():
        graph.edges[name] = set()
        for target in _imports(ast.parse(path.read_text(), str(path)), name, is_package):
            resolved = _resolve(target, graph.paths)
            if resolved and resolved != name:
                graph.edges[name].add(resolved)
    return graph


def _imports(tree: ast.Module, module: str, is_package: bool) -> list[tuple[str, ...]]:
    """Per imported name, anywhere in the module: the absolute names it may be, the most specific first."""
    found: list[tuple[str, ...]] = []
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((alias.name,) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".") if package else []
                parts = parts[:len(parts) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            # `from pkg import module` imports pkg.module (pkg is then already imported, so no edge to it);
            # `from pkg import name` imports pkg.
            found.extend((f"{base}.{alias.name}", base) if base else (alias.name,) for alias in node.names)
    return found


def _resolve(names: tuple[str, ...], modules: dict[str, Path]) -> str | None:
    """The project module an import lands in: a module named exactly, else the longest known prefix of the last."""
    for name in names[:-1]:
        if name in modules:
            return name
    parts = names[-1].split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def cycles(graph: Graph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted; none in a healthy tree."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(start: str) -> None:
        nonlocal counter
        # Iterative, so a deep import chain cannot hit the recursion limit.
        work = [(start, iter(sorted(graph.edges.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.edges.get(child, ())))))
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

    for module in sorted(graph.edges):
        if module not in index:
            visit(module)
    return sorted(found)


def layer_breaks(graph: Graph, layers: dict[str, int]) -> list[str]:
    """Each import from a lower layer up to a higher one, and each package the layer table does not place."""
    problems = [f"package {p!r} is not in the layer table: place it" for p in sorted(set(graph.packages.values()))
                if p not in layers]
    for source, targets in sorted(graph.edges.items()):
        for target in sorted(targets):
            low, high = graph.packages[source], graph.packages[target]
            if low in layers and high in layers and layers[low] < layers[high]:
                problems.append(f"{source} ({low}) imports {target} ({high})")
    return problems


def long_modules(root: Path, folder: str, limit: int) -> list[str]:
    return [f"{p.relative_to(root)}: {n} lines" for p in sorted((root / folder).rglob("*.py"))
            if "__pycache__" not in p.parts and (n := len(p.read_text().splitlines())) > limit]


def reachable(graph: Graph, start: str) -> set[str]:
    """Every module `start` imports, directly or through others (itself included)."""
    seen: set[str] = set()
    stack = [start]
    while stack:
        module = stack.pop()
        if module not in seen:
            seen.add(module)
            stack.extend(graph.edges.get(module, ()))
    return seen
