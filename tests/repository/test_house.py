"""The house rules, on this repository: no import circle, dependencies point down the rooms of kimi_cluster/ and the
folders beside it, no module of the package passes 450 lines (the fakes included), and the README's Layout table
names the tree as it is.

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
# kimi_cluster's rooms are placed one by one (tests/house.py ROOMED); `kimi_cluster` itself is its __init__.py.
LAYERS = {
    "kimi_cluster": 0, "kimi_cluster.node": 0,
    "kimi_cluster.hyperstack_api": 1,
    "kimi_cluster.settings": 2,
    "kimi_cluster.plan": 3,
    "kimi_cluster.blueprint": 4,
    "kimi_cluster.deploy": 5, "kimi_cluster.checks": 5,
    "kimi_cluster.operator": 6, "components": 6, "verification": 6,
    "kimi_cluster.fakes": 7,
    "kimi_cluster.sandbox": 8,
    "kimi_cluster.cli": 9,
    "scripts": 10,
    "benchmarks": 11, "__main__": 11,
}
MAX_LINES = 450


# ---- the rules on the planted tree ---------------------------------------------------------------------------------

def _plant(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_the_graph_finds_a_planted_cycle_through_local_relative_and_type_checking_imports(tmp_path: Path) -> None:
    root = _plant(tmp_path, {
        "kimi_cluster/__init__.py": "",
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
        "kimi_cluster/__init__.py": "",
        "kimi_cluster/plan/__init__.py": "",
        "kimi_cluster/plan/low.py": "def f():\n    import kimi_cluster.sandbox.high\n",
        "kimi_cluster/sandbox/__init__.py": "",
        "kimi_cluster/sandbox/high.py": "from kimi_cluster.plan import low\nimport checks_resource\n",
        "verification/checks_resource.py": "from kimi_cluster.plan.low import f\n",
        "verification/__main__.py": "import checks_resource\n",
        "newpkg/__init__.py": "",
        "__main__.py": "import kimi_cluster.sandbox.high\n",
    })
    graph = build_graph(root)
    assert graph.packages["checks_resource"] == "verification"
    assert graph.packages["verification.__main__"] == "verification"
    assert graph.packages["kimi_cluster.plan.low"] == "kimi_cluster.plan"  # a room of the package
    assert layer_breaks(graph, LAYERS) == [
        "package 'newpkg' is not in the layer table: place it",
        "kimi_cluster.plan.low (kimi_cluster.plan) imports kimi_cluster.sandbox.high (kimi_cluster.sandbox)",
    ]
    assert cycles(graph) == [["checks_resource", "kimi_cluster.plan.low", "kimi_cluster.sandbox.high"]]


def test_long_modules_are_reported(tmp_path: Path) -> None:
    _plant(tmp_path, {"components/big.py": "x = 1\n" * (MAX_LINES + 1),
                      "components/ok.py": "x = 1\n" * MAX_LINES})
    assert long_modules(tmp_path, "components", MAX_LINES) == [
        f"components/big.py: {MAX_LINES + 1} lines"]


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
    # The program's own room at a glance: what `pulumi up` runs never reaches kimi_cluster/operator/.
    found = _on_the_repo("sorted(m for m in __import__('tests.house', fromlist=['x']).reachable(graph, '__main__') "
                         "if m.startswith('kimi_cluster.operator'))")
    assert found == []


def test_dependencies_point_down_the_layers() -> None:
    assert _on_the_repo("layer_breaks(graph, layers)") == []


def test_no_module_of_the_package_over_450_lines() -> None:
    # A node program past it ships as several modules (kimi_cluster/plan/step_scripts.py, shipped()). The
    # benchmarks are held to it too.
    assert long_modules(REPO, "kimi_cluster", MAX_LINES) + long_modules(REPO, "benchmarks", MAX_LINES) == []


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
    """What the table must name: each top-level folder and module, and each room (sub-package) of kimi_cluster/."""
    entries = {f"{p.name}/" for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")
               and not p.name.startswith("venv") and p.name != "__pycache__"}
    entries |= {p.name for p in root.glob("*.py")}
    for p in (root / "kimi_cluster").iterdir():
        if p.is_dir() and (p / "__init__.py").exists():
            entries.add(f"kimi_cluster/{p.name}/")
        elif p.suffix == ".py" and p.name != "__init__.py":
            entries.add(f"kimi_cluster/{p.name}")
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
    _plant(tmp_path, {"kimi_cluster/__init__.py": "", "kimi_cluster/plan/__init__.py": "",
                      "kimi_cluster/plan/launch.py": "", "kimi_cluster/extra/__init__.py": "",
                      "kimi_cluster/sub/__init__.py": "", "__main__.py": ""})
    readme = ("# x\n\n## Layout\n\n| place | holds |\n|---|---|\n| `__main__.py` | m |\n"
              "| `kimi_cluster/plan/`, `launch.py`, `gone.py` | n |\n| `kimi_cluster/sub/` | s |\n"
              "\n## Next\n| `kimi_cluster/extra/` | not in the table |\n")
    assert layout_paths(readme) == ["__main__.py", "kimi_cluster/plan/", "kimi_cluster/launch.py",
                                    "kimi_cluster/gone.py", "kimi_cluster/sub/"]
    assert layout_problems(tmp_path, readme) == [
        "the Layout table names kimi_cluster/launch.py, which does not exist",
        "the Layout table names kimi_cluster/gone.py, which does not exist",
        "kimi_cluster/extra/ is in no row of the Layout table"]


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
