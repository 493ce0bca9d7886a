"""What every node step shares (pure): shipping this repository's node programs, and the values every template gets.

Each step's own values come from its feature's builder, named in the step table (kimi_cluster/plan/steps/table.py)
beside the frozen inputs it reads: the VM's preparation (vm_prep.py), the weights download (weights_download.py),
the kernel cache (kernel_cache.py), the engine's warm-up and launch (engine_steps.py), the endpoint's proxy and
readiness waits (endpoint.py), the resuming layer (resume.py) and the caretaker (caretaker.py).
kimi_cluster/plan/steps/scripts.py adds the values every step shares (`common_values`); nothing here makes a Pulumi
resource, and no secret is ever a template value.
"""

from __future__ import annotations

import base64
import gzip
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kimi_cluster.plan.jinja import Verbatim
from kimi_cluster.settings.timing import Timing

_ROOT = Path(__file__).resolve().parents[2]
PRINTABLE_SOURCE = _ROOT / "kimi_cluster" / "node" / "printable.py"  # status's escape, for what engines print


@dataclass(frozen=True)
class CommonInputs:
    """What every step's script gets of the settings: the node's root folder and the storage disk's path."""

    node_root: str
    storage_path: str


# ---- what the steps share ------------------------------------------------------------------------------------------


def storage_path(path_setting: str) -> str:
    """storagePath as the scripts take it: rooted, no trailing slash; "" for the root itself."""
    path = "/" + path_setting.strip("/")
    return path if path != "/" else ""


def repo_folder(model: str) -> str:
    """The model's folder in the Hugging Face cache."""
    return "models--" + model.replace("/", "--")


def source(path: Path) -> Verbatim:
    """A program of this repository, as the body of a quoted heredoc (its delimiter never appears in it)."""
    text = path.read_text(encoding="utf-8")
    return Verbatim(text if text.endswith("\n") else text + "\n")


@dataclass(frozen=True)
class ShippedFile:
    """A file of this repository a node program needs: where it lands under the program's folder (its path here),
    its bytes, and the quoted heredoc's delimiter that carries them (kimi_cluster/plan/templates/_ship.sh.j2)."""

    path: str
    body: Verbatim
    delimiter: str

    @property
    def packed(self) -> str:
        """Its bytes gzipped (no timestamp: the same file packs the same) in base64, for a step whose text would
        pass the 128 KiB a single argument may hold (Linux's MAX_ARG_STRLEN: the step travels as one, in base64)."""
        return base64.b64encode(gzip.compress(str(self.body).encode(), mtime=0)).decode()


def shipped(paths: Sequence[str]) -> list[ShippedFile]:
    """The files a node program is made of, laid out as in this repository, so that `python -m kimi_cluster.node.X`
    imports its siblings on the node as it does in the tests."""
    out = []
    for path in paths:
        body = source(_ROOT / path)
        delimiter = "KIMI_" + "".join(c if c.isalnum() else "_" for c in path.upper())
        if delimiter in body:
            raise ValueError(f"{path} contains its own heredoc delimiter {delimiter}")
        out.append(ShippedFile(path, body, delimiter))
    return out


def shipped_packages(paths: Sequence[str]) -> list[str]:
    """The package folders the shipped files sit in; each gets an empty __init__.py on the node, so no package's
    own imports run there."""
    folders: set[str] = set()
    for path in paths:
        parts = path.split("/")[:-1]
        folders.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))
    return sorted(folders)


def common_values(common: CommonInputs, rank: int, step: str, summary: str, timing: Timing) -> dict[str, Any]:
    """What every step's template gets: its name and summary, the node's rank and roots, the poll intervals."""
    return {
        "step": step,
        "summary": Verbatim(summary),  # a comment line
        "rank": rank,
        "node_root": common.node_root,
        "storage_path": storage_path(common.storage_path),
        "poll_seconds": timing.poll_seconds,
        "fast_poll_seconds": timing.fast_poll_seconds,
        "printable_source": source(PRINTABLE_SOURCE),  # for the steps that include _printable.sh.j2
    }


def settings_key(key: str) -> str:
    return f"kimi-cluster:{key}"
