"""The packages the nodes pip-install run the versions this project pins: the plan's constants match

The weights step installs huggingface_hub==HF_HUB_VERSION, the kernel-cache steps boto3==BOTO3_VERSION
(kimi_cluster/plan/templates/weights.sh.j2, kimi_cluster/plan/templates/_kernel_cache.sh.j2); the project's own pins are
in requirements.txt or a
sibling requirements-*.txt. Either side changing alone fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kimi_cluster.plan import kernel_cache, weights_download

ROOT = Path(__file__).resolve().parents[2]
# Node-side package (as pip names it) -> the plan module and its constant that the templates install.
NODE_PINS = {"huggingface-hub": (weights_download, "HF_HUB_VERSION"), "boto3": (kernel_cache, "BOTO3_VERSION")}


def _normalized(name: str) -> str:
    """PEP 503's normalized project name: runs of '-', '_' and '.' are one '-', lower case."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(paths: list[Path]) -> dict[str, str]:
    """name -> version of every `name==version` (extras and markers aside) in these requirement files."""
    out: dict[str, str] = {}
    for path in paths:
        for line in path.read_text(encoding="utf-8").splitlines():
            match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?\s*==\s*([^\s;#]+)", line)
            if match:
                out[_normalized(match[1])] = match[3]
    return out


def requirement_files(root: Path = ROOT) -> list[Path]:
    """requirements.txt and its siblings (requirements-*.txt): a pin may move between them."""
    return [p for p in [root / "requirements.txt", *sorted(root.glob("requirements-*.txt"))] if p.is_file()]


def mismatches(project: dict[str, str], versions: dict[str, str]) -> list[str]:
    """Each node-side package whose version differs from the project's pin, or that the project does not pin."""
    return [f"{name}: nodes install {version}, the project pins {project.get(name, 'nothing')}"
            for name, version in versions.items() if project.get(name) != version]


def node_versions() -> dict[str, str]:
    return {name: getattr(module, constant) for name, (module, constant) in NODE_PINS.items()}


def test_the_nodes_install_the_versions_the_project_pins():
    assert mismatches(pins(requirement_files()), node_versions()) == []


def test_the_templates_install_the_constants_they_are_given():
    # The version reaches the node through these template values, not a literal of their own.
    weights = (ROOT / "kimi_cluster" / "plan" / "templates" / "weights.sh.j2").read_text(encoding="utf-8")
    cache = (ROOT / "kimi_cluster" / "plan" / "templates" / "_kernel_cache.sh.j2").read_text(encoding="utf-8")
    assert '"huggingface_hub=={{ hf_hub_version }}"' in weights
    assert '"boto3=={{ boto3_version }}"' in cache


@pytest.mark.parametrize("name", sorted(NODE_PINS))
def test_a_node_constant_changed_alone_fails(monkeypatch, name):
    monkeypatch.setattr(*NODE_PINS[name], "0.0.1")
    assert [m for m in mismatches(pins(requirement_files()), node_versions()) if m.startswith(name + ":")]


@pytest.mark.parametrize("name", sorted(NODE_PINS))
def test_a_requirement_pin_changed_alone_fails(tmp_path, name):
    # A copy of the requirement files with this one pin moved on, wherever it is pinned (and under pip's other
    # spelling of the name, which must still count as the same package).
    for path in requirement_files():
        text = path.read_text(encoding="utf-8")
        spelled = "[-_.]".join(re.escape(part) for part in name.split("-"))
        text = re.sub(rf"(?im)^{spelled}==\S+", f"{name.replace('-', '_')}==99.0", text)
        (tmp_path / path.name).write_text(text, encoding="utf-8")
    copied = pins(requirement_files(tmp_path))
    assert copied[name] == "99.0"
    assert [m for m in mismatches(copied, node_versions()) if m.startswith(name + ":")]
    # Unchanged, the copy agrees: only the moved pin made the difference.
    for path in requirement_files():
        (tmp_path / path.name).write_text(path.read_text(encoding="utf-8"), encoding="utf-8")
    assert mismatches(pins(requirement_files(tmp_path)), node_versions()) == []


def test_a_pin_missing_from_every_file_fails(tmp_path):
    (tmp_path / "requirements.txt").write_text("pyyaml==6.0.3\n", encoding="utf-8")
    assert len(mismatches(pins(requirement_files(tmp_path)), node_versions())) == len(NODE_PINS)
