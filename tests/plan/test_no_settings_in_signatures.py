"""Below the blueprint nothing takes the settings: no module of plan/, deploy/ (its entry, program.py, excepted),
node/ or checks/ imports `Settings` or `TimedSettings`, and no function there has a parameter or a return annotated
with either. Read from the source (AST), so a function no test calls is held too; the runtime check of what the
program's resources receive is tests/plan/test_no_settings_below.py."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BELOW = ("kimi_cluster/plan", "kimi_cluster/deploy", "kimi_cluster/node", "kimi_cluster/checks")
ENTRY = {"kimi_cluster/deploy/program.py"}  # loads the settings, admits them, hands the blueprint down
NAMES = {"Settings", "TimedSettings"}


def _modules() -> list[Path]:
    return sorted(p for room in BELOW for p in (ROOT / room).rglob("*.py")
                  if str(p.relative_to(ROOT)) not in ENTRY)


def _mentions(annotation: ast.expr | None) -> bool:
    if annotation is None:
        return False
    text = ast.unparse(annotation)
    return any(name in NAMES for name in text.replace("[", " ").replace("]", " ").replace("|", " ")
               .replace(".", " ").replace("'", " ").replace('"', " ").split())


def settings_below(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and any(a.name in NAMES for a in node.names):
            found.append(f"line {node.lineno}: imports {', '.join(a.name for a in node.names if a.name in NAMES)}")
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            args = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs,
                    *(a for a in (node.args.vararg, node.args.kwarg) if a is not None)]
            for arg in args:
                if _mentions(arg.annotation):
                    found.append(f"line {node.lineno}: {node.name}({arg.arg}: {ast.unparse(arg.annotation)})")
            if _mentions(node.returns):
                found.append(f"line {node.lineno}: {node.name} returns {ast.unparse(node.returns)}")
    return found


def test_the_rule_finds_a_planted_settings_parameter_import_and_return(tmp_path: Path) -> None:
    planted = tmp_path / "m.py"
    planted.write_text("from kimi_cluster.settings import Settings\n"
                       "def f(x: int, s: 'Settings | None') -> None: ...\n"
                       "def g() -> list[TimedSettings]: ...\n")
    assert settings_below(planted) == ["line 1: imports Settings", "line 2: f(s: 'Settings | None')",
                                       "line 3: g returns list[TimedSettings]"]


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_nothing_below_the_blueprint_takes_settings(path: Path) -> None:
    assert settings_below(path) == []
