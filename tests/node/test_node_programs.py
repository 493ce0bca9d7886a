"""The programs in kimi_cluster/node/ reach the nodes byte for byte: each step that ships one carries its file's exact
text, and the status probe sends node_status.py's exact text. So moving a program (and not changing it) cannot change
a step's command, and a step re-runs only when its program's bytes change."""

from __future__ import annotations

import ast
import base64
import gzip
import json
import re
from pathlib import Path

import pytest

from kimi_cluster.blueprint import render_node_scripts
from kimi_cluster.operator import status_gather
from kimi_cluster.operator.stack_state import Connection, NodeRecord
from kimi_cluster.plan import kernel_cache, resume, weights_download
from tests.node.conftest import make_settings

ROOT = Path(__file__).resolve().parents[2]
PROGRAMS = ROOT / "kimi_cluster" / "node"
CACHE = json.dumps({"bucket": "my-team-kimi-kernels", "region": "eu-central-1"})
CREDS = "AKIDEXAMPLE:wJalrXUtnFEMIexample"


def test_the_node_side_programs_are_read_from_node_programs():
    assert weights_download.CHECK_SOURCE == PROGRAMS / "check_download.py"
    assert status_gather.PROBE == PROGRAMS / "node_status.py"
    for program in (weights_download.WEIGHTS_PROGRAM, kernel_cache.KERNEL_CACHE_PROGRAM):
        assert program[0].startswith("kimi_cluster/node/") and all((ROOT / path).is_file() for path in program)
    # Every module of this repository a shipped module imports is shipped beside it.
    programs: list[tuple[str, ...]] = [weights_download.WEIGHTS_PROGRAM, kernel_cache.KERNEL_CACHE_PROGRAM,
                                       resume.PROGRAM]
    for files in programs:
        imported = [(path, module) for path in files for module in _repository_imports(path)]
        assert imported  # each is made of several modules
        for path, module in imported:
            assert module.replace(".", "/") + ".py" in files, f"{path} imports {module}, not shipped"


def _repository_imports(path: str) -> list[str]:
    """The modules of this repository that the file imports, absolute (kimi_cluster.x) or relative (from . import
    x, from .x import y), as dotted names."""
    package = path.rsplit("/", 1)[0].replace("/", ".")
    found = []
    for node in ast.walk(ast.parse((ROOT / path).read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
            if node.module:
                found.append(f"{base}.{node.module}")
            else:
                found += [f"{base}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("kimi_cluster."):
            found.append(str(node.module))
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith("kimi_cluster.")]
    return found


@pytest.mark.parametrize("topology", ["h100x4-sglang", "b300x1-vllm"])
def test_each_step_embeds_its_programs_exact_bytes(topology):
    settings = make_settings(topology, kernelCache=CACHE, kernelCacheCredentials=CREDS)
    check = (PROGRAMS / "check_download.py").read_text(encoding="utf-8")
    for rank in range(settings.nodes):
        scripts = render_node_scripts(settings, rank, "10.0.0.11", "10.0.0.10")
        # Each gzipped in base64, written where it sits in this repository.
        for path in weights_download.WEIGHTS_PROGRAM:
            written = rf" \| base64 -d \| gzip -dc > \"\$SHIP_TO/{re.escape(path)}\.new\""
            packed = re.search(rf"printf %s '([A-Za-z0-9+/=]+)'{written}", scripts["weights"])
            assert packed, path
            assert gzip.decompress(base64.b64decode(packed[1])).decode() == (ROOT / path).read_text(encoding="utf-8")
        assert check in scripts["check"]
        steps = ["cache-restore", *(["cache-save"] if rank == 0 else [])]
        for step in steps:
            for path in kernel_cache.KERNEL_CACHE_PROGRAM:
                assert (ROOT / path).read_text(encoding="utf-8") in scripts[step], (step, path)


def test_the_status_probe_sends_node_status_exactly():
    sent: list[str] = []

    class Recorder:
        def run(self, connection: Connection, command: str, stdin: str, timeout: float) -> tuple[int, str, str]:
            sent.append(stdin)
            return 0, "{}", ""

    record = NodeRecord(0, "kimi-dev-node0", "1", "203.0.113.10", "10.0.0.10", Connection("203.0.113.10", "ubuntu"))
    status_gather.probe_node(Recorder(), record, make_settings())
    assert sent == [(PROGRAMS / "node_status.py").read_text(encoding="utf-8")]
