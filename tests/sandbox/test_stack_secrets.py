"""A sandbox stack's secrets are set once and kept while unchanged (kimi_cluster/sandbox/stack_secrets.py), and the
workdir logs in to its backend once: under the real Pulumi CLI, a kept ciphertext still decrypts to its value after
the config file is written anew, a changed value is set again, and nothing the record holds shows a value."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from kimi_cluster.sandbox.pulumi_cli import PulumiCli, Stack
from kimi_cluster.sandbox.stack_secrets import RECORD_NAME, KeptSecrets, ciphertexts, restore

pytestmark = pytest.mark.integration  # the real Pulumi CLI


def test_a_kept_secret_decrypts_a_changed_one_is_set_again_and_login_is_once(
        cli: PulumiCli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[list[str]] = []  # the CLI's starts
    run = cli.run

    def counted(args: list[str], **kw: Any) -> str:
        ran.append(list(args))
        return run(args, **kw)

    monkeypatch.setattr(cli, "run", counted)
    cli.prepare()
    cli.prepare()
    assert [args[0] for args in ran] == ["login"] and cli.logged_in()

    project = tmp_path / "projects" / "p"
    project.mkdir(parents=True)
    (project / "Pulumi.yaml").write_text("name: p\nruntime: python\n")
    stack = Stack(project, "sandbox", project)
    cli.ensure_stack(stack)
    values = {"p:token": "first-token", "p:key": "first-key"}
    cli.set_config(stack, {"p:plain": "1"}, values)
    kept = KeptSecrets(tmp_path / "secrets", cli.passphrase_file)
    kept.remember("p", values, stack.config_file)
    previous = ciphertexts(stack.config_file)
    assert set(previous) == set(values)

    # The next up writes the file anew (its salt kept), then puts back what did not change.
    salt = yaml.safe_load(stack.config_file.read_text())["encryptionsalt"]
    stack.config_file.write_text(f"config: {{}}\nencryptionsalt: {salt}\n")
    wanted = {"p:token": "first-token", "p:key": "second-key"}
    unchanged = kept.unchanged("p", previous, wanted)
    assert unchanged == {"p:token": previous["p:token"]}
    restore(stack.config_file, unchanged)
    ran.clear()
    cli.set_config(stack, {"p:plain": "1"}, {k: v for k, v in wanted.items() if k not in unchanged})
    assert [args[:3] for args in ran] == [["config", "set-all", "--stack"], ["config", "set", "p:key"]]
    for key, value in wanted.items():
        assert cli.run(["config", "get", key, "--stack", "sandbox"], cwd=project).strip() == value

    record = tmp_path / "secrets" / RECORD_NAME
    assert oct(record.stat().st_mode & 0o777) == "0o600"
    assert not any(v in record.read_text() for v in (*values.values(), *wanted.values()))
    # Another passphrase (a new workdir's) never takes a digest for the same value, and a ciphertext someone else
    # wrote (another release, a user's `pulumi config set`) is never kept, even for the value last set.
    other = tmp_path / "other-passphrase"
    other.write_text("another\n")
    assert KeptSecrets(tmp_path / "secrets", other).unchanged("p", previous, values) == {}
    kept.remember("p", wanted, stack.config_file)
    rewritten = {**ciphertexts(stack.config_file), "p:token": previous["p:token"] + "0"}
    assert kept.unchanged("p", rewritten, wanted) == {"p:key": rewritten["p:key"]}


def test_the_secret_outputs_are_named_from_the_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`outputs` asks the CLI once (with --show-secrets) and reads which outputs are secrets from the checkpoint,
    where the CLI keeps each as a value signed as a secret (sdk/go/common/resource/sig/sig.go)."""
    from kimi_cluster.sandbox.cli_stacks import SECRET_SIGNATURE, SIGNATURE_KEY, STACK_TYPE, CliStacks

    stacks = CliStacks(tmp_path, tmp_path / "secrets", io.StringIO())
    path = stacks.checkpoint_path(stacks.cluster)
    path.parent.mkdir(parents=True)
    outputs = {"api_key": {SIGNATURE_KEY: SECRET_SIGNATURE, "ciphertext": "v1:abc"}, "endpoint_url": "https://x",
               "client_configs": {"api_key": "[secret]"}, "replicas": 1}
    path.write_text(json.dumps({"checkpoint": {"latest": {"resources": [
        {"type": STACK_TYPE, "urn": "urn:pulumi:sandbox::kimi-cluster::pulumi:pulumi:Stack::x", "outputs": outputs},
        {"type": "command:remote:Command", "urn": "urn:x", "outputs": {"stdout": {SIGNATURE_KEY: SECRET_SIGNATURE}}},
    ]}}}))
    shown = {"api_key": "sk-plain", "endpoint_url": "https://x", "client_configs": {"api_key": "sk-plain"},
             "replicas": 1}
    asked: list[list[str]] = []

    class OneAnswer:
        def run(self, args: list[str], **_: Any) -> str:
            asked.append(args)
            return json.dumps(shown)

    monkeypatch.setattr(stacks, "_cli", OneAnswer())  # a stand-in CLI: this test is about the checkpoint
    assert stacks.outputs(stacks.cluster) == (shown, frozenset({"api_key"}))
    assert len(asked) == 1 and "--show-secrets" in asked[0]


def test_the_public_outputs_come_from_the_checkpoint_with_no_cli_and_no_secret(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """`public_outputs` (what up prints, what verify and reclaim read) starts no CLI: a plain output as the checkpoint
    holds it, an output that is or holds a secret named and None."""
    from kimi_cluster.sandbox.cli_stacks import SECRET_SIGNATURE, SIGNATURE_KEY, STACK_TYPE, CliStacks

    stacks = CliStacks(tmp_path, tmp_path / "secrets", io.StringIO())
    assert stacks.public_outputs(stacks.cluster) == ({}, frozenset())  # before the first up
    path = stacks.checkpoint_path(stacks.cluster)
    path.parent.mkdir(parents=True)
    secret = {SIGNATURE_KEY: SECRET_SIGNATURE, "ciphertext": "v1:abc"}
    outputs = {"api_key": secret, "endpoint_url": "https://x", "client_configs": {"curl": ["x", secret]},
               "node_names": ["a", "b"], "replicas": 1}
    path.write_text(json.dumps({"checkpoint": {"latest": {"resources": [
        {"type": STACK_TYPE, "urn": "urn:pulumi:sandbox::kimi-cluster::pulumi:pulumi:Stack::x", "outputs": outputs},
    ]}}}))

    class NoCli:
        def run(self, args: list[str], **_: Any) -> str:
            raise AssertionError(f"the CLI was started: {args}")

    monkeypatch.setattr(stacks, "_cli", NoCli())  # a stand-in that fails the test if asked
    shown, secret_names = stacks.public_outputs(stacks.cluster)
    assert secret_names == {"api_key", "client_configs"}
    assert shown == {"api_key": None, "endpoint_url": "https://x", "client_configs": None,
                     "node_names": ["a", "b"], "replicas": 1}
