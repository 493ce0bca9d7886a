"""The README's commands, read the way a newcomer pastes them: each block's order, the venv's Python, no missing tool.

The Pulumi CLI facts behind the order: `stack select` of a stack that does not exist fails (`stack init` creates it
and keeps an existing Pulumi.<stack>.yaml); a non-interactive secret command fails without PULUMI_CONFIG_PASSPHRASE.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
# The pages beside it: their commands are held to the same rules as the README's.
DOCS = {path.name: path.read_text(encoding="utf-8") for path in sorted((ROOT / "docs").glob("*.md"))}
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
    assert first(lines, r"\.venv/bin/pip install") < first(lines, r"\.venv/bin/kimi-cluster plan") < up
    assert first(lines, r"ssh-keygen -t ed25519 -N ''") < first(lines, r"sshPrivateKey <")


@pytest.mark.parametrize("name", ["README.md", *DOCS])
def test_every_block_creates_its_stack_before_configuring_it(name: str):
    for block in blocks(README if name == "README.md" else DOCS[name]):
        lines = commands(block)
        config = first(lines, r"^pulumi config set")
        if config < 0:
            continue
        assert 0 <= first(lines, r"^pulumi stack init") < config, block
        assert first(lines, r"^cp .*Pulumi\.\w+\.yaml") == -1, "copying over a stack file drops its encryptionsalt"
        if first(lines, r"^pulumi login") >= 0:
            assert 0 <= first(lines, r"^export PULUMI_CONFIG_PASSPHRASE") < first(lines, r"^pulumi stack init"), block


@pytest.mark.parametrize("name", ["README.md", *DOCS])
def test_no_bare_python_and_no_unlisted_tool(name: str):
    text = README if name == "README.md" else DOCS[name]
    code = [body for _, body in FENCE.findall(text)] + re.findall(r"`([^`\n]+)`", text)
    bare = [c for c in code if BARE_PYTHON.search(c)]
    assert not bare, f"use the venv's Python (.venv/bin/python): {bare}"
    assert not any(re.search(r"\bjq\b", c) for c in code), "jq is used but not a listed prerequisite"
    for c in code:
        if "ifconfig.me" in c:
            assert "curl -4" in c, "an IPv6 answer with /32 after it would be a wrong CIDR"


@pytest.mark.parametrize("name", ["README.md", *DOCS])
def test_every_block_is_valid_bash(name: str):
    for block in blocks(README if name == "README.md" else DOCS[name]):
        # `[--flag ...]` placeholders are documentation of options, not commands; everything else must parse.
        text = re.sub(r"\[--[^\]]*\]", "", block)
        result = subprocess.run(["bash", "-n"], input=text, text=True, capture_output=True)
        assert result.returncode == 0, f"{result.stderr}\n{block}"


def test_stack_reference_names_both_backends():
    operations = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    assert "organization/kimi-cluster/dev" in operations and "<your-org>/kimi-cluster/dev" in operations


def test_the_readme_is_a_front_door():
    lines = README.splitlines()
    assert len(lines) <= 250, f"the README has {len(lines)} lines; move the detail into docs/"
    for title in ("Two commands for a newcomer", "Real use", "Stack outputs (a contract: added to, never renamed)",
                  "The documentation", "Layout"):
        assert f"\n## {title}\n" in README, title
    linked = set(re.findall(r"\]\(docs/([\w.-]+\.md)", README))
    assert linked >= {"ARCHITECTURE.md", "configuration.md", "security.md", "operations.md", "CHANGELOG.md"}
    assert linked <= set(DOCS), linked - set(DOCS)


def test_every_link_between_the_pages_lands_on_a_heading():
    def anchors(text: str) -> set[str]:
        heads = re.findall(r"^#+ (.+)$", re.sub(r"^```.*?^```", "", text, flags=re.S | re.M), re.M)
        return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in heads}

    pages = {"README.md": README, **{f"docs/{n}": t for n, t in DOCS.items()}}
    broken = []
    for name, text in pages.items():
        base = Path(name).parent
        for target, anchor in re.findall(r"\]\(([\w./-]*\.md)?#([\w-]+)\)", text):
            page = name if not target else str((base / target).as_posix()).replace("docs/../", "")
            if page not in pages or anchor not in anchors(pages[page]):
                broken.append(f"{name}: {target}#{anchor}")
    assert not broken, broken
