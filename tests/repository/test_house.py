"""The house rules, on this repository: no import circle, dependencies point down the layers, components/,
node_programs/ and fakes/ modules stay short (450 lines), and the README's Layout table names the tree as it is.

The graph functions live in tests/house.py; the planted-tree tests below prove they catch what they look for.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from tests.house import build_graph, cycles, layer_breaks, long_modules

REPO = Path(__file__).resolve().parents[2]

# Lowest first: a package may import its own layer and the ones below it, never one above. Every top-level package
# (and top-level module, such as __main__.py) must have a row, so that a new one gets placed.
LAYERS = {
    "components": 0,
    "node_programs": 1, "fakes": 1, "verification": 1,
    "sandbox": 2,
    "scripts": 3,
    "benchmarks": 4, "__main__": 4,
}
COMPONENTS_MAX_LINES = 450


# ---- the rules on the planted tree ---------------------------------------------------------------------------------

def _plant(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_the_graph_finds_a_planted_cycle_through_local_relative_and_type_checking_imports(tmp_path: Path) -> None:
    root = _plant(tmp_path, {
        "components/__init__.py": "",
        "components/a.py": "def f():\n    from components import b\n",          # function-local, `from pkg import m`
        "components/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .c import X\n",
        "components/c.py": "import components.a\nX = 1\n",                        # closes a -> b -> c -> a
        "components/d.py": "from . import a\n",                                   # into the circle, not part of it
        "components/sub/__init__.py": "",
        "components/sub/e.py": "from .. import d\nfrom ..sub import f\n",
        "components/sub/f.py": "import json\n",
        "tests/test_x.py": "import components.a\nimport sandbox\n",              # tests are skipped
        ".venv/lib/x.py": "import components.a\n",
    })
    graph = build_graph(root)
    assert graph.edges["components.a"] == {"components.b"}
    assert graph.edges["components.b"] == {"components.c"}
    assert graph.edges["components.sub.e"] == {"components.d", "components.sub.f"}  # no edge to the package
    assert cycles(graph) == [["components.a", "components.b", "components.c"]]
    assert "tests.test_x" not in graph.edges and not any("venv" in m for m in graph.edges)


def test_the_graph_finds_a_planted_layer_break_and_an_unplaced_package(tmp_path: Path) -> None:
    root = _plant(tmp_path, {
        "components/__init__.py": "",
        "components/low.py": "def f():\n    import sandbox.high\n",
        "sandbox/__init__.py": "",
        "sandbox/high.py": "from components import low\nimport checks_resource\n",
        "verification/checks_resource.py": "from components.low import f\n",
        "verification/__main__.py": "import checks_resource\n",
        "newpkg/__init__.py": "",
        "__main__.py": "import sandbox.high\n",
    })
    graph = build_graph(root)
    assert graph.packages["checks_resource"] == "verification"
    assert graph.packages["verification.__main__"] == "verification"
    assert layer_breaks(graph, LAYERS) == [
        "package 'newpkg' is not in the layer table: place it",
        "components.low (components) imports sandbox.high (sandbox)",
    ]
    assert cycles(graph) == [["checks_resource", "components.low", "sandbox.high"]]


def test_long_modules_are_reported(tmp_path: Path) -> None:
    _plant(tmp_path, {"components/big.py": "x = 1\n" * (COMPONENTS_MAX_LINES + 1),
                      "components/ok.py": "x = 1\n" * COMPONENTS_MAX_LINES})
    assert long_modules(tmp_path, "components", COMPONENTS_MAX_LINES) == [
        f"components/big.py: {COMPONENTS_MAX_LINES + 1} lines"]


# ---- the rules on this repository ----------------------------------------------------------------------------------

def _on_the_repo(expression: str) -> object:
    """`expression` over the repository's import graph, computed in a fresh interpreter: CPython 3.11's ast.parse
    can fail with "SystemError: AST constructor recursion depth mismatch" in a process where an earlier test hit a
    RecursionError while building an AST, and under pytest-xdist any test may have run before this one."""
    code = ("import json, sys; from pathlib import Path; from tests.house import build_graph, cycles, layer_breaks; "
            "graph = build_graph(Path(sys.argv[1])); layers = json.loads(sys.argv[2]); "
            f"print(json.dumps({expression}))")
    done = subprocess.run([sys.executable, "-c", code, str(REPO), json.dumps(LAYERS)], cwd=REPO, capture_output=True,
                          text=True, timeout=120, check=True)
    return json.loads(done.stdout)


def test_no_import_circle() -> None:
    assert _on_the_repo("cycles(graph)") == []


def test_pulumi_up_imports_none_of_the_operators_tools() -> None:
    # The program's own room at a glance: what `pulumi up` runs never reaches components/operator/.
    found = _on_the_repo("sorted(m for m in __import__('tests.house', fromlist=['x']).reachable(graph, '__main__') "
                         "if m.startswith('components.operator'))")
    assert found == []


def test_dependencies_point_down_the_layers() -> None:
    assert _on_the_repo("layer_breaks(graph, layers)") == []


def test_no_components_module_over_450_lines() -> None:
    assert long_modules(REPO, "components", COMPONENTS_MAX_LINES) == []


def test_no_node_program_over_450_lines() -> None:
    # A program past it ships as several modules (components/step_scripts.py, shipped()).
    assert long_modules(REPO, "node_programs", COMPONENTS_MAX_LINES) == []


def test_no_fake_over_450_lines() -> None:
    # The fakes are held to the product's rooms: the emulator is the package fakes/hyperstack/, the inference server
    # fakes/inference/, the fake node's stubs one module per tool family (fakes/node/bin/_fake*.py).
    assert long_modules(REPO, "fakes", COMPONENTS_MAX_LINES) == []


# ---- the README's Layout table --------------------------------------------------------------------------------------

def layout_paths(readme: str) -> list[str]:
    """The paths the Layout table's first column names; a bare name is relative to the row's first path's folder."""
    section = readme.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    named = []
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        cell = line.split("|")[1]
        tokens = re.findall(r"`([^`]+)`", cell)
        folder = str(Path(tokens[0].rstrip("/")).parent) if tokens else "."
        for token in tokens:
            named.append(token if "/" in token or folder == "." else f"{folder}/{token}")
    return named


def tree_entries(root: Path) -> set[str]:
    """What the table must name: each top-level folder and module, each components/ module and subpackage."""
    entries = {f"{p.name}/" for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")
               and not p.name.startswith("venv") and p.name != "__pycache__"}
    entries |= {p.name for p in root.glob("*.py")}
    for p in (root / "components").iterdir():
        if p.is_dir() and (p / "__init__.py").exists():
            entries.add(f"components/{p.name}/")
        elif p.suffix == ".py" and p.name != "__init__.py":
            entries.add(f"components/{p.name}")
    return entries


def layout_problems(root: Path, readme: str) -> list[str]:
    named = layout_paths(readme)
    problems = [f"the Layout table names {p}, which does not exist" for p in named if not (root / p).exists()]
    normal = {p.rstrip("/") for p in named}

    def is_named(entry: str) -> bool:
        # A top-level folder is named by a row for it or for anything in it; a module or subpackage by its own.
        top_folder = entry.endswith("/") and entry.count("/") == 1
        return entry.rstrip("/") in normal or (top_folder and any(p.startswith(entry) for p in named))
    problems += [f"{entry} is in no row of the Layout table" for entry in sorted(tree_entries(root))
                 if not is_named(entry)]
    return problems


def test_the_layout_check_catches_a_missing_path_and_an_unnamed_module(tmp_path: Path) -> None:
    _plant(tmp_path, {"components/__init__.py": "", "components/node.py": "", "components/launch.py": "",
                      "components/extra.py": "", "components/sub/__init__.py": "", "__main__.py": ""})
    readme = ("# x\n\n## Layout\n\n| place | holds |\n|---|---|\n| `__main__.py` | m |\n"
              "| `components/node.py`, `launch.py`, `gone.py` | n |\n| `components/sub/` | s |\n"
              "| `components/` | c |\n\n## Next\n| `components/extra.py` | not in the table |\n")
    assert layout_paths(readme) == ["__main__.py", "components/node.py", "components/launch.py",
                                    "components/gone.py", "components/sub/", "components/"]
    assert layout_problems(tmp_path, readme) == ["the Layout table names components/gone.py, which does not exist",
                                                 "components/extra.py is in no row of the Layout table"]


def test_the_readme_layout_table_names_the_tree() -> None:
    assert layout_problems(REPO, (REPO / "README.md").read_text()) == []


# ---- the requirements files ----------------------------------------------------------------------------------------

def test_each_package_is_pinned_in_exactly_one_requirements_file_and_dev_includes_the_others() -> None:
    homes: dict[str, list[str]] = {}
    for path in sorted(REPO.glob("requirements*.txt")):
        for line in path.read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if line and not line.startswith("-"):
                assert re.fullmatch(r"[A-Za-z0-9_.\-]+(\[[a-z,]+\])?==[^=\s]+", line), f"{path.name}: unpinned {line}"
                homes.setdefault(re.split(r"[\[=]", line, maxsplit=1)[0].lower(), []).append(path.name)
    assert {name: files for name, files in homes.items() if len(files) != 1} == {}
    included = set(re.findall(r"^-r (\S+)$", (REPO / "requirements-dev.txt").read_text(), re.MULTILINE))
    assert included == {p.name for p in REPO.glob("requirements*.txt")} - {"requirements-dev.txt"}
