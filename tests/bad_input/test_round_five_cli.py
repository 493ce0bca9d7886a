"""Careless and hostile input, fifth round (issue 52), the CLIs: `status` on outputs of the wrong shape (0.2.0's
replica outputs among them) and a front's probe that answers garbage, `sandbox up --expect-no-changes` with up's
other options, `bench_destroy --release` naming no commit, and a sandbox with replicas on vLLM where no real vLLM is
installed for the front's render server. Each ends in one short line naming the output, argument or install
command, before anything starts, or runs to a clean end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from benchmarks import bench_destroy
from kimi_cluster.cli import sandbox as sandbox_cli
from kimi_cluster.cli import status
from kimi_cluster.operator.stack_state import OUTPUT_SHAPES, Connection, parse_state
from kimi_cluster.operator.status_replicas import format_replicas, front_view, replicas_view
from kimi_cluster.sandbox import nodes
from kimi_cluster.sandbox.kimi import Sandbox
from kimi_cluster.sandbox.nodes import node_env, real_vllm, render_server_problem, stack_settings

REPO = Path(__file__).resolve().parents[2]
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIexampleexampleexample operator@laptop"


def _state(outputs: dict[str, Any]) -> str:
    return json.dumps({"resources": [{"type": "pulumi:pulumi:Stack", "outputs": outputs}]})


# ---- status: every output it reads, of the wrong shape ------------------------------------------------------------

# A well-shaped replica stack's outputs (as kimi_cluster/deploy/cluster.py and plan/blueprint.py export them).
GOOD = {"replicas": 2, "front_public_ip": "198.51.100.9", "front_private_ip": "10.0.0.9",
        "replica_node_names": [["kimi-dev-node0"], ["kimi-dev-r1-node0"]],
        "replica_head_private_ips": ["10.0.0.10", "10.0.0.11"], "node_names": ["kimi-dev-node0", "kimi-dev-r1-node0"],
        "node_public_ips": ["198.51.100.10", None], "node_private_ips": ["10.0.0.10", "10.0.0.11"],
        "head_public_ip": "198.51.100.10", "environment_name": "kimi-dev", "kimi_cluster_version": "0.2.0",
        "topology": "b300x1-vllm", "hourly_cost_usd": 118.4}


def _wrong_values(shape: Any) -> list[Any]:
    """Values of another shape: a scalar for a list, a list for a scalar; a list whose item is wrong."""
    if isinstance(shape, list):
        inner = shape[0]
        return ["a-string", 7, {"k": "v"}, [{"k": "v"}], *([[["nested"]]] if not isinstance(inner, list) else
                                                            [["flat-name"], [[3]]])]
    return [["a", "list"], {"k": "v"}, True] + ([] if (int in shape if isinstance(shape, tuple) else shape is int)
                                                else [7])


WRONG = [(key, value) for key, shape in OUTPUT_SHAPES.items() for value in _wrong_values(shape)]


@pytest.fixture
def config(tmp_path: Path) -> str:
    path = tmp_path / "Pulumi.p.yaml"
    path.write_text(f"config:\n  kimi-cluster:operatorCidr: 198.18.0.7/32\n  kimi-cluster:sshPublicKey: {KEY}\n",
                    encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("key,value", WRONG, ids=[f"{k}={json.dumps(v)[:20]}" for k, v in WRONG])
def test_status_names_an_output_of_the_wrong_shape_in_one_line(tmp_path, capsys, config, key, value):
    """0.2.0's replica outputs of the wrong type ended in a TypeError inside the replicas' view."""
    state = tmp_path / "s.json"
    state.write_text(_state({**GOOD, key: value}))
    code = status.main(["--stack", "p", "--config", config, "--state", str(state)])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and err.count("\n") == 1, err
    assert err.startswith(f"error: the stack output {key} ") and "not a " in err, err


def test_well_shaped_replica_outputs_are_read_and_shown(tmp_path):
    state = parse_state(json.loads(_state(GOOD)), "p")
    view = replicas_view(state, [], _Runner("[]"), 8000)
    assert view is not None and [r["nodes"] for r in view["replicas"]] == [["kimi-dev-node0"], ["kimi-dev-r1-node0"]]
    assert "replica 1: kimi-dev-r1-node0" in "\n".join(format_replicas(view))


class _Runner:
    """A front whose probe prints `out` (whatever runs on a node may answer anything)."""

    def __init__(self, out: str, code: int = 0) -> None:
        self.out, self.code = out, code

    def run(self, connection: Connection, command: str, stdin: str, timeout: float) -> tuple[int, str, str]:
        return self.code, self.out, ""


@pytest.mark.parametrize("out", [
    "[1, 2]", '{"upstream": "x"}', '[{"/health": 5}, {"/health": [200]}]', '[{"/health": [200, 5]}, {}]',
    '[{"/health": ["200", ""]}, {"/metrics": [200, ["x"]]}]', "[" * 100_000, '"text"', "[]",
    '[{"upstream": ["a"], "/health": [200, ""]}, {"upstream": {}, "/health": [true, "\\u001b]52;c;x\\u0007"]}]',
])
def test_the_fronts_probe_answering_garbage_is_no_answer_never_a_traceback(out):
    upstreams = ["10.0.0.10:30000", "10.0.0.11:30000"]
    view = front_view(_Runner(out), Connection("198.51.100.9", "ubuntu"), upstreams)
    assert [row["upstream"] for row in view] == upstreams  # ours, never what the front echoed
    text = "\n".join(format_replicas({"front": "198.51.100.9", "replicas": [
        {"replica": i, "nodes": ["n"], "vms": ["ACTIVE"], "engine": "running", "front_view": row}
        for i, row in enumerate(view)]}))
    assert "\x1b" not in text and "\x07" not in text
    assert all(row["health"] == "ok" or row["health"].startswith(("unknown", "down")) for row in view), view


def test_a_sandbox_state_of_the_wrong_shape_is_one_line_too(tmp_path, capsys, monkeypatch):
    """`sandbox status` and `sandbox reclaim` read the same outputs through the sandbox's own door."""
    from kimi_cluster.sandbox import reclaim

    with pytest.raises(Exception, match="the stack output node_names is a str") as caught:
        reclaim.node_addresses({"node_names": "kimi-sandbox-node0", "node_public_ips": ["10.213.0.2"]})
    assert type(caught.value).__name__ == "StackStateError"
    work = tmp_path / "w"
    work.mkdir()
    (work / ".kimi-sandbox").write_text("x")
    monkeypatch.setattr(Sandbox, "public_outputs", lambda self: ({"front_public_ip": ["10.213.0.9"]}, frozenset()))
    assert sandbox_cli.main(["reclaim", "kimi-sandbox-front", "--workdir", str(work)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: the stack output front_public_ip is a list") and "Traceback" not in err, err


# ---- sandbox up --expect-no-changes: up's options are read, not dropped -------------------------------------------

def test_up_expect_no_changes_hands_every_option_of_up_to_the_up(tmp_path, monkeypatch):
    """They were dropped unread, so a changed setting still reported "no changes"."""
    seen: dict[str, Any] = {}

    def up(self: Sandbox, topology: str | None = None, **kwargs: Any) -> int:
        seen.update(kwargs, topology=topology)
        return 0

    monkeypatch.setattr(Sandbox, "up", up)
    argv = ["up", "--expect-no-changes", "--workdir", str(tmp_path / "w"), "--topology", "b300x1-vllm",
            "--config", "replicas=2", "--config", "kimi-cluster:apiKeyVersion=3", "--no-kernel-cache",
            "--hub-bytes-per-second", "5000"]
    assert sandbox_cli.main(argv) == 0
    assert seen == {"topology": "b300x1-vllm", "echo": True, "config": {"replicas": "2", "apiKeyVersion": "3"},
                    "hub_bytes_per_second": 5000.0, "hub_slow_edges": None, "timeline": True, "kernel_cache": False,
                    "expect_no_changes": True, "preview": True}


def test_up_expect_no_changes_on_nothing_deployed_is_one_line_and_makes_no_workdir(tmp_path, capsys):
    work = tmp_path / "w"
    assert sandbox_cli.main(["up", "--expect-no-changes", "--config", "apiKeyVersion=2", "--workdir", str(work)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: nothing deployed in") and err.count("\n") == 1, err
    assert not work.exists()


@pytest.mark.parametrize("command", ["refresh", "destroy", "status"])
def test_the_hub_throttle_is_an_option_of_up_alone(tmp_path, capsys, command):
    with pytest.raises(SystemExit) as caught:
        sandbox_cli.main([command, "--workdir", str(tmp_path / "w"), "--hub-bytes-per-second", "1000"])
    assert caught.value.code == 2 and "--hub-bytes-per-second apply to up only" in capsys.readouterr().err


def test_pulumi_up_gets_the_flag_and_json_only_when_asked(tmp_path, monkeypatch):
    from kimi_cluster.sandbox.pulumi_cli import PulumiCli, Stack

    ran: list[list[str]] = []

    def run(args: list[str], **_: Any) -> str:  # the argv it would run
        ran.append(list(args))
        return ""

    cli = PulumiCli(tmp_path, tmp_path, tmp_path / "pass")
    monkeypatch.setattr(cli, "run", run)
    stack = Stack(tmp_path, "sandbox", tmp_path)
    cli.up(stack, echo=False, timeout=1)
    cli.up(stack, echo=False, timeout=1, expect_no_changes=True)
    assert ran == [["up", "--yes", "--stack", "sandbox"],
                   ["up", "--yes", "--stack", "sandbox", "--expect-no-changes", "--json"]]


# ---- bench_destroy --release --------------------------------------------------------------------------------------

@pytest.mark.parametrize("release", ["0.9.9-no-such", "--help", "", "HEAD~100000", "a" * 300])
def test_bench_destroy_names_a_release_that_is_no_commit_before_preparing_it(capsys, release):
    started = time.monotonic()
    assert bench_destroy.main([f"--release={release}", "--workdir", "/nonexistent-bench-destroy"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --release {release!r} names no commit") and "Traceback" not in err, err
    assert "docs/CHANGELOG.md" in err and err.count("\n") == 1
    assert time.monotonic() - started < 30  # no worktree, no virtualenv


def test_bench_destroy_takes_any_commit_of_the_clone():
    assert bench_destroy.release_problem("HEAD") is None


# ---- replicas on vLLM need a real vLLM for the front's render server ----------------------------------------------

@pytest.fixture
def no_vllm(tmp_path, monkeypatch) -> Path:
    monkeypatch.delenv("FAKE_VLLM", raising=False)
    monkeypatch.setenv("KIMI_PARSERS_VENV", str(tmp_path / "no-parsers-venv"))
    return tmp_path / "no-parsers-venv" / "bin" / "vllm"


def test_the_render_servers_vllm_has_one_home_which_the_fake_docker_is_given(tmp_path, monkeypatch, no_vllm):
    settings = stack_settings("b300x1-vllm", {"replicas": "2"})
    assert real_vllm() == no_vllm == nodes.parsers_vllm()
    assert node_env(settings, "10.213.0.1", faults={})["FAKE_VLLM"] == str(no_vllm)
    own = tmp_path / "vllm"
    monkeypatch.setenv("FAKE_VLLM", str(own))
    assert real_vllm() == own and node_env(settings, "10.213.0.1", faults={})["FAKE_VLLM"] == str(own)


def test_only_a_stream_resuming_front_needs_an_executable_vllm(tmp_path, monkeypatch, no_vllm):
    vllm = stack_settings("b300x1-vllm", {"replicas": "2"})
    problem = render_server_problem(vllm)
    assert problem is not None and "bash tests/engine_parsers/install.sh" in problem and "9.6 GB" in problem
    assert str(no_vllm) in problem
    for needs_none in (stack_settings("b300x1-vllm", {"replicas": "2", "resumeStreams": "false"}),
                       stack_settings("b300x1-vllm"), stack_settings("h100x4-sglang"),
                       stack_settings("h100x4-sglang", {"replicas": "2", "resumeStreams": "false"})):
        assert render_server_problem(needs_none) is None
    # SGLang replicas resume through SGLang's own chat layer, which the sandbox runs with the parsers venv's Python.
    sglang = stack_settings("h100x4-sglang", {"replicas": "2"})
    problem = render_server_problem(sglang)
    assert problem is not None and "bash tests/engine_parsers/install.sh" in problem
    assert str(no_vllm.parent / "python") in problem
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    monkeypatch.setenv("FAKE_SGLANG_PYTHON", str(python))
    assert render_server_problem(sglang) is None and node_env(sglang, "10.213.0.1", faults={})[
        "FAKE_SGLANG_PYTHON"] == str(python)
    monkeypatch.delenv("FAKE_SGLANG_PYTHON")
    for what in ("a directory", "not executable"):
        path = tmp_path / what
        path.mkdir() if what == "a directory" else path.write_text("#!/bin/sh\n")
        monkeypatch.setenv("FAKE_VLLM", str(path))
        assert render_server_problem(vllm) is not None, what
    executable = tmp_path / "vllm"
    executable.write_text("#!/bin/sh\n")
    executable.chmod(0o755)
    monkeypatch.setenv("FAKE_VLLM", str(executable))
    assert render_server_problem(vllm) is None


@pytest.mark.parametrize("argv", [
    ["--topology", "b300x1-vllm", "--config", "replicas=2"],
    ["--topology", "custom", "--config", "flavor=n3-B300-SXM6x8", "--config", "nodeCount=1", "--config",
     "gpusPerNode=8", "--config", "gpuMemoryGb=288", "--config", "engine=vllm", "--config", "replicas=3"],
], ids=["b300x1-vllm", "custom vllm"])
def test_sandbox_up_with_vllm_replicas_and_no_vllm_refuses_in_seconds_starting_nothing(tmp_path, no_vllm, argv):
    """It failed after 343 s, the emulator, hub, fabric and VMs up: "vLLM's render server needs a real vLLM"."""
    work = tmp_path / "w"
    env = {k: v for k, v in os.environ.items() if k != "FAKE_VLLM"}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "kimi_cluster.cli.sandbox", "up", *argv, "--workdir", str(work)],
                          cwd=REPO, capture_output=True, text=True, timeout=120, env=env)
    elapsed = time.monotonic() - started
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1 and "render server" in done.stderr, done.stderr
    assert "`bash tests/engine_parsers/install.sh`" in done.stderr and "resumeStreams=false" in done.stderr
    assert elapsed < 60, elapsed  # the import of the package, no bring-up
    # No service, network, node or state: the refusal came before any.
    left = sorted(p.name for p in work.iterdir()) if work.exists() else []
    assert set(left) <= {".kimi-sandbox", ".command.lock"}, left
    assert "sandbox up:" not in done.stdout, done.stdout


# ---- the other doors: what the sweep found -----------------------------------------------------------------------

@pytest.mark.parametrize("url", ["http://[::1", "http://h:99999", "http://h:0", "http://h:port", "https://:8000"])
def test_verify_refuses_a_base_url_with_no_host_or_port_before_any_check(url):
    """Each of the eleven checks failed on its own with the URL parser's error (one raised InvalidURL)."""
    from kimi_cluster.checks.target import normalize_base_url

    with pytest.raises(ValueError, match="base URL must look like http://HOST:PORT"):
        normalize_base_url(url)
    assert normalize_base_url("http://[::1]:8000/v1/") == "http://[::1]:8000"


@pytest.mark.parametrize("watch", ["nan", "inf", "-1", "0.01"])
def test_sandbox_status_checks_watch_before_the_first_report(tmp_path, capsys, watch):
    """time.sleep(nan) raised after the first report: a traceback under a running sandbox."""
    with pytest.raises(SystemExit) as caught:
        sandbox_cli.main(["status", "--workdir", str(tmp_path / "w"), "--watch", watch])
    assert caught.value.code == 2 and "is not an interval of 1 to 86400 seconds" in capsys.readouterr().err
