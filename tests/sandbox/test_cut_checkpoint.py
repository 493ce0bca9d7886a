"""A `pulumi` killed while the file backend writes the checkpoint: gocloud.dev's fileblob writes the blob's `.attrs`
in place before it renames the new checkpoint in, so a kill between the two leaves the old checkpoint whole and its
`.attrs` empty, and every later command fails "failed to load checkpoint: EOF" (a sandbox `up` after a SIGKILL, on a
loaded machine). The sandbox mends it before its `pulumi cancel`, as a user would, and the real CLI reads the stack
again."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from kimi_cluster.sandbox.cli_stacks import CliStacks
from kimi_cluster.sandbox.pulumi_cli import PulumiCli, PulumiError, Stack

pytestmark = pytest.mark.integration  # the real Pulumi CLI


def test_a_checkpoint_metadata_file_cut_by_a_kill_is_mended_and_the_stack_reads_again(
        cli: PulumiCli, tmp_path: Path) -> None:
    cli.prepare()
    project = tmp_path / "projects" / "p"
    project.mkdir(parents=True)
    (project / "Pulumi.yaml").write_text("name: p\nruntime: python\n")
    stack = Stack(project, "sandbox", project)
    cli.ensure_stack(stack)
    stacks_dir = tmp_path / "state" / ".pulumi" / "stacks" / "p"
    cut, whole = stacks_dir / "sandbox.json.attrs", tmp_path / "state" / ".pulumi" / "meta.yaml.attrs"
    assert json.loads(cut.read_text()) and json.loads(whole.read_text())
    before = whole.read_bytes()
    cut.write_bytes(b"")
    with pytest.raises(PulumiError) as refused:
        cli.run(["stack", "export", "--stack", "sandbox"], cwd=project)
    assert "failed to load checkpoint: EOF" in refused.value.output

    out = io.StringIO()
    CliStacks(tmp_path, tmp_path / "secrets", out).mend_cut_sidecars()
    assert not cut.exists() and whole.read_bytes() == before
    assert out.getvalue() == ("removed state/.pulumi/stacks/p/sandbox.json.attrs: cut short by a killed pulumi (the "
                              "blob beside it is whole)\n")
    assert json.loads(cli.run(["stack", "export", "--stack", "sandbox"], cwd=project))["version"] == 3
