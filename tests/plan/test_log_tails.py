"""Every log tail a step prints reaches `pulumi up`'s output through status's escape (kimi_cluster/node/printable.py,
templates/_printable.sh.j2): an engine's, the render server's, the resuming layer's (which holds clients' request
ids), a registry's answer to a pull, the weights download's and the caretaker's."""

from __future__ import annotations

import re
from pathlib import Path

TEMPLATES = Path(__file__).resolve().parents[2] / "kimi_cluster" / "plan" / "templates"
# A command that prints what another program wrote: `docker logs` (not the `sudo docker logs` a message tells the
# operator to run), or `tail`/`head` of a log file.
LOG_READ = re.compile(r"(?<!sudo )\bdocker logs\b|\b(tail|head) -n [^|]*\"\$[A-Z_]*LOG\"")
ESCAPED = re.compile(r"\|\s*(printable_lines|redact)\b")


def log_reads() -> list[tuple[str, int, str]]:
    """(template, line number, line) of every log read in the step templates."""
    return [(path.name, number, line.strip())
            for path in sorted(TEMPLATES.glob("*.j2"))
            for number, line in enumerate(path.read_text().splitlines(), 1)
            if LOG_READ.search(line) and not line.lstrip().startswith("#")]


def test_the_scan_sees_every_kind_of_log_tail():
    names = {name for name, _, _ in log_reads()}
    assert {"resume.sh.j2", "_pull.sh.j2", "launch.sh.j2", "weights.sh.j2", "caretaker.sh.j2", "warmup.sh.j2",
            "engine-ready.sh.j2", "readiness.sh.j2", "proxy.sh.j2"} <= names
    assert sum(name == "resume.sh.j2" for name, _, _ in log_reads()) == 3  # the render server's, resume.log twice


def test_every_log_tail_goes_through_the_escape():
    assert [f"{name}:{number}: {line}" for name, number, line in log_reads() if not ESCAPED.search(line)] == []


def test_each_template_that_escapes_ships_the_escape():
    for path in sorted(TEMPLATES.glob("*.sh.j2")):
        text = path.read_text()
        if "printable_lines" in text and not path.name.startswith("_"):
            uses = re.findall(r'{% include "(_[a-z_]+\.sh\.j2)" %}', text)
            assert "_printable.sh.j2" in uses or "_redact.sh.j2" in uses or "_kernel_cache.sh.j2" in uses, path.name
        if path.name != "_pull.sh.j2" and '{% include "_pull.sh.j2" %}' in text:
            assert text.index('{% include "_printable.sh.j2" %}') < text.index('{% include "_pull.sh.j2" %}'), \
                path.name
