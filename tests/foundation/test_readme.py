"""The README's commands, read the way a newcomer pastes them: each block's order, the venv's Python, no missing tool.

The Pulumi CLI facts behind the order: `stack select` of a stack that does not exist fails (`stack init` creates it
and keeps an existing Pulumi.<stack>.yaml); a non-interactive secret command fails without PULUMI_CONFIG_PASSPHRASE.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

README = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
BARE_PYTHON = re.compile(r"(?<![\w/.-])python3? -m (?!venv\b)")


def section(title: str) -> str:
    start = README.index(f"\n## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start:end if end > 0 else len(README)]


def blocks(text: str = README) -> list[str]:
    return [body for lang, body in FENCE.findall(text) if lang == "bash"]


def commands(block: str) -> list[str]:
    return [line.split("#", 1)[0].strip() if not line.lstrip().startswith("#") else ""
            for line in block.splitlines()]


def first(lines: list[str], pattern: str) -> int:
    return next((i for i, line in enumerate(lines) if re.search(pattern, line)), -1)


def test_real_use_is_one_fenced_sequence_in_a_pasteable_order():
    ours = blocks(section("Real use"))
    assert len(ours) == 1, "the real-use path must be one block a newcomer pastes top to bottom"
    lines = commands(ours[0])
    passphrase, login = first(lines, r"^export PULUMI_CONFIG_PASSPHRASE="), first(lines, r"^pulumi login")
    init, config = first(lines, r"^pulumi stack init dev\b"), first(lines, r"^pulumi config set")
    up, destroy = first(lines, r"^pulumi up\b"), first(lines, r"^pulumi destroy\b")
    assert 0 <= passphrase < init, "the passphrase is set before the stack exists"
    assert 0 <= login < init < config < up < destroy
    assert first(lines, r"pulumi stack select") == -1
    assert first(lines, r"\.venv/bin/pip install") < first(lines, r"\.venv/bin/python -m scripts\.plan") < up
    assert first(lines, r"ssh-keygen -t ed25519 -N ''") < first(lines, r"sshPrivateKey <")


def test_every_block_creates_its_stack_before_configuring_it():
    for block in blocks():
        lines = commands(block)
        config = first(lines, r"^pulumi config set")
        if config < 0:
            continue
        assert 0 <= first(lines, r"^pulumi stack init") < config, block
        assert first(lines, r"^cp .*Pulumi\.\w+\.yaml") == -1, "copying over a stack file drops its encryptionsalt"
        if first(lines, r"^pulumi login") >= 0:
            assert 0 <= first(lines, r"^export PULUMI_CONFIG_PASSPHRASE") < first(lines, r"^pulumi stack init"), block


def test_no_bare_python_and_no_unlisted_tool():
    code = [body for _, body in FENCE.findall(README)] + re.findall(r"`([^`\n]+)`", README)
    bare = [c for c in code if BARE_PYTHON.search(c)]
    assert not bare, f"use the venv's Python (.venv/bin/python): {bare}"
    assert not any(re.search(r"\bjq\b", c) for c in code), "jq is used but not a listed prerequisite"
    for c in code:
        if "ifconfig.me" in c:
            assert "curl -4" in c, "an IPv6 answer with /32 after it would be a wrong CIDR"


def test_every_block_is_valid_bash():
    for block in blocks():
        # `[--flag ...]` placeholders are documentation of options, not commands; everything else must parse.
        text = re.sub(r"\[--[^\]]*\]", "", block)
        result = subprocess.run(["bash", "-n"], input=text, text=True, capture_output=True)
        assert result.returncode == 0, f"{result.stderr}\n{block}"


def test_stack_reference_names_both_backends():
    assert "organization/kimi-cluster/dev" in README and "<your-org>/kimi-cluster/dev" in README
