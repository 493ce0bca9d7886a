"""Fixtures for the sandbox tests: `kimi-cluster sandbox` as a user runs it, under the real Pulumi CLI with each
VM a network namespace with sshd (kimi_cluster/fakes/node_fabric.py); the sandbox's own emulator through its test-only
admin
routes; and a teardown that ends every process, namespace and bridge a test started.
"""

from __future__ import annotations

import io
import json
import os
import secrets
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pytest

from kimi_cluster.fakes import sandbox_services as services
from kimi_cluster.fakes.node_fabric import Fabric, FabricConfig, missing
from kimi_cluster.sandbox.nodes import COMPILE_SECONDS_KNOB
from kimi_cluster.sandbox.pulumi_cli import TOOLCHAIN, PulumiCli, end_session, toolchain_bin
from kimi_cluster.sandbox.services import EMULATOR_ARGS_VARIABLE, HUB_ARGS_VARIABLE
from tests.wall_times import report

__all__ = ["report"]  # the flows import report from here; tests/conftest.py prints what it collected

REPO_ROOT = Path(__file__).resolve().parents[2]
# The real CLI's checkpoint of the cluster stack (its file backend, in the workdir).
CHECKPOINT = "state/.pulumi/stacks/kimi-cluster/sandbox.json"
# A bound on one sandbox command, not a wait: a 2-replica up behind a front took over 240 s at load average 14 (the
# suite beside two other sandboxes' flows), against 40 to 70 s on a quiet machine.
COMMAND_TIMEOUT_S = 480
# The fake engine compiles nothing in the flows (the sandbox's 30 s would only wait): the kernel-cache flows, which
# are about that compile, turn it on with COMPILING. They read whether it compiled, and what, from the engine's log
# and the cache steps' output, never how long it took: a few seconds stand for the sandbox's FAKE_COMPILE_SECONDS.
NOT_COMPILING = {COMPILE_SECONDS_KNOB: "0"}
COMPILING = {COMPILE_SECONDS_KNOB: "3"}


@pytest.fixture(autouse=True)
def _not_compiling(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same for the flows that drive a Sandbox (or a benchmark) in this process: the nodes' knobs come from
    os.environ there (kimi_cluster.sandbox.kimi.node_env)."""
    for knob, value in NOT_COMPILING.items():
        monkeypatch.setenv(knob, value)


@dataclass
class EmulatorAdmin:
    """The sandbox's own emulator, through its test-only admin routes (it runs with `--admin`)."""

    url: str

    def _get(self, what: str):
        base = self.url.removesuffix("/v1")
        with urllib.request.urlopen(f"{base}/_emulator/{what}", timeout=10) as answer:
            return json.loads(answer.read())

    def inventory(self) -> dict:
        return self._get("inventory")

    def requests(self) -> list[dict]:
        return self._get("requests")

    def set_capacity(self, region: str, flavor_name: str, vms: int) -> None:
        base = self.url.removesuffix("/v1")
        body = json.dumps({"region": region, "flavor_name": flavor_name, "vms": vms}).encode()
        request = urllib.request.Request(f"{base}/_emulator/capacity", data=body, method="POST")
        with urllib.request.urlopen(request, timeout=10) as answer:
            answer.read()

    def vm_posts(self) -> int:
        return sum(1 for r in self.requests() if r["method"] == "POST" and r["path"] == "/core/virtual-machines")

    def drift(self, name: str, action: str, **fields: Any) -> dict:
        """A change behind the stack's back (kimi_cluster/fakes/hyperstack_emulator/drift_injection.py): stop,
        delete-rule (port=), resize."""
        base = self.url.removesuffix("/v1")
        body = json.dumps({"name": name, "action": action, **fields}).encode()
        request = urllib.request.Request(f"{base}/_emulator/drift", data=body, method="POST")
        with urllib.request.urlopen(request, timeout=10) as answer:
            return dict(json.loads(answer.read()))

    def arm(self, kind: str, **fields: Any) -> None:
        """A fault from now on (the admin route's kinds: rate-limit, server-error, vm-error, stuck-in-build, ...)."""
        base = self.url.removesuffix("/v1")
        body = json.dumps({"kind": kind, **fields}).encode()
        request = urllib.request.Request(f"{base}/_emulator/faults", data=body, method="POST")
        with urllib.request.urlopen(request, timeout=10) as answer:
            answer.read()


def _toolchain_ready() -> str | None:
    """Why the toolchain cannot be used without a build, or None (a warm `scripts/pulumi-toolchain` takes < 1 s)."""
    done = subprocess.run(["bash", str(TOOLCHAIN), "--check"], capture_output=True, text=True, timeout=60)
    return None if done.returncode == 0 else (done.stderr.strip().splitlines() or ["no toolchain"])[-1]


@pytest.fixture(scope="session")
def real_engine_ready() -> None:
    """Root for the fake nodes' namespaces and the toolchain built: outside CI a machine without them skips the
    flows with the reason; in CI (CI=true, as .ci/run runs) they fail, since .ci/run installs everything."""
    problems = missing()
    if not problems and (why := _toolchain_ready()):
        problems.append(why)
    if problems:
        message = "the sandbox flows need " + "; ".join(problems) + " (bash scripts/pulumi-toolchain builds it)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


@dataclass
class Result:
    code: int
    output: str
    seconds: float


@dataclass
class SandboxRunner:
    """Runs `kimi-cluster sandbox ...` on one workdir, under the real Pulumi CLI."""

    workdir: Path
    env: dict[str, str] = field(default_factory=dict)
    # up draws timeline.png only where the test looks at it (test_flow.py's h100 flow): matplotlib costs about
    # 1.5 CPU-seconds an up, some 30 ups a suite.
    timeline: bool = False
    # The kernel-cache bucket and its steps only where the flow is about them or counts them (the README's flows,
    # the kernel-cache and re-run flows): elsewhere `up --no-kernel-cache` spares moto's server and, on every node,
    # the restore and its boto3 import (about 9 CPU-seconds an h100 up).
    kernel_cache: bool = False
    # `up --skip-preview` unless the flow reads the preview (the h100 flow): the preview runs the whole program and
    # every resource's diff a second time, for what the update's own output says again (about 3 CPU-seconds and,
    # on 2 loaded cores, 9 s an up).
    preview: bool = False

    def environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("HYPERSTACK_")}
        return {**env, **NOT_COMPILING, **self.env, "PYTHONUNBUFFERED": "1"}

    def argv(self, command: str, *args: str) -> list[str]:
        up_options = []
        if command == "up":
            up_options += [] if self.timeline else ["--no-timeline"]
            up_options += [] if self.kernel_cache else ["--no-kernel-cache"]
            up_options += [] if self.preview or "--expect-no-changes" in args else ["--skip-preview"]
        return [sys.executable, "-m", "kimi_cluster.cli.sandbox", command, "--workdir", str(self.workdir), *args,
                *up_options]

    def __call__(self, command: str, *args: str, timeout: float = COMMAND_TIMEOUT_S) -> Result:
        started = time.monotonic()
        proc = subprocess.run(self.argv(command, *args), cwd=REPO_ROOT, env=self.environment(), text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
        return Result(proc.returncode, proc.stdout, time.monotonic() - started)

    def start(self, command: str, *args: str, output: IO[str] | int = subprocess.PIPE) -> subprocess.Popen:
        """In the background, in its own session (as a user's terminal would hold it); its output to `output` (a
        file where the test reads nothing until it ends: a pipe no one reads stops a talkative command)."""
        return subprocess.Popen(self.argv(command, *args), cwd=REPO_ROOT, env=self.environment(), text=True,
                                stdout=output, stderr=subprocess.STDOUT, start_new_session=True)

    def record(self) -> dict:
        path = self.workdir / "sandbox.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def resources(self) -> list[dict[str, Any]]:
        """The cluster stack's resources (the stack included), from the real CLI's checkpoint in the workdir."""
        path = self.workdir / CHECKPOINT
        if not path.exists():
            return []
        return list(json.loads(path.read_text())["checkpoint"]["latest"].get("resources") or [])

    def resource(self, name: str) -> dict[str, Any]:
        """The resource of that name (its URN's last part), as the checkpoint holds it."""
        found = [r for r in self.resources() if r["urn"].rsplit("::", 1)[-1] == name]
        assert len(found) == 1, f"{len(found)} resources named {name} in the checkpoint"
        return found[0]

    def step_output(self, name: str) -> str:
        """What a remote command printed (its stdout, then its stderr), as the checkpoint holds it."""
        outputs = self.resource(name).get("outputs") or {}
        return f"{outputs.get('stdout', '')}{outputs.get('stderr', '')}"

    def exported_resources(self) -> list[dict[str, Any]]:
        """The cluster stack's resources with their secrets in plain text (`pulumi stack export --show-secrets`):
        the checkpoint's ciphertexts change on every write, plain values only when they do."""
        from kimi_cluster.sandbox.kimi import Sandbox

        with Sandbox(self.workdir, out=io.StringIO()).state_document() as path:
            return list(json.loads(path.read_text())["deployment"].get("resources") or [])

    def outputs(self) -> dict[str, Any]:
        """The cluster stack's outputs, secrets in plain text (`pulumi stack output --show-secrets`)."""
        from kimi_cluster.sandbox.kimi import Sandbox

        return Sandbox(self.workdir, out=io.StringIO()).outputs()[0]

    def emulator(self) -> EmulatorAdmin:
        """The sandbox's own emulator (started by its first up, with the admin routes)."""
        return EmulatorAdmin(self.record()["emulator_url"])

    def fabric(self) -> Fabric:
        """The fake nodes' network: each VM a namespace, reached by `ip netns exec`."""
        return Fabric(FabricConfig.load(self.workdir / "fabric.json"))

    def in_node(self, address: str, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess:
        """A command in the namespace of the VM at that address (its own loopback, its own firewall)."""
        namespace = self.fabric().config.namespace(address)
        return subprocess.run(["ip", "netns", "exec", namespace, *argv], capture_output=True, text=True,
                              timeout=timeout)


def hub_stats(workdir: Path, control: str | None = None) -> dict[str, Any]:
    """The fake hub's counters (kimi_cluster/fakes/hub.py STATS_PATH), over its https with the sandbox's hub CA; with
    `control` (HOLD_PATH, RELEASE_PATH), that control's answer."""
    import ssl

    from kimi_cluster.fakes.hub import STATS_PATH

    url = json.loads((workdir / "sandbox.json").read_text())["hub_url"]
    context = ssl.create_default_context(cafile=str(next((workdir / "secrets" / "hub-tls").glob("*-ca.crt"))))
    request = urllib.request.Request(url + control, data=b"", method="POST") if control else url + STATS_PATH
    with urllib.request.urlopen(request, timeout=10, context=context) as answer:
        return dict(json.loads(answer.read()))


def engine_log(workdir: Path) -> str:
    """What the fake engines printed, every node's."""
    return "".join(p.read_text() for p in workdir.glob("nodes/*/var/lib/fake-node/docker/containers/kimi-engine.log"))


def leftover_processes(workdir: Path) -> list[int]:
    """Processes of this sandbox still alive: node processes, services whose command line names the workdir, and
    Pulumi's plugins (their PULUMI_HOME is the workdir's)."""
    pids = set(services.processes_under(workdir / "nodes")) | set(services.processes_with_env("PULUMI_HOME", workdir))
    mine = services._ancestors()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) not in mine and services._alive(int(entry)):
            if any(str(workdir) in word for word in services._cmdline(int(entry))):
                pids.add(int(entry))
    return sorted(pids)


def kill_everything(workdir: Path, record: dict) -> None:
    """Teardown: pulumi's session (its plugins too), the recorded services, the fake nodes' namespaces and bridge."""
    pid_file = workdir / "pulumi.pid"
    if pid_file.exists() and pid_file.read_text().strip().isdigit():
        end_session(int(pid_file.read_text().strip()))
    for data in (record.get("services") or {}).values():
        services.stop(services.Service.from_json(data), timeout=5)
    services.terminate(leftover_processes(workdir), timeout=5)
    if (workdir / "fabric.json").exists():
        Fabric(FabricConfig.load(workdir / "fabric.json")).teardown()


@pytest.fixture
def sandbox(tmp_path: Path, real_engine_ready: None) -> Iterator:
    """sandbox(env=None, timeline=False, kernel_cache=False, emulator_args="", preview=False, hub_args="") ->
    SandboxRunner on a fresh workdir; everything it started is ended at teardown. `emulator_args`: more arguments for
    the sandbox's own emulator (kimi_cluster.cli.emulator's --fault, --capacity), from its start; `hub_args` the same
    for its hub (kimi_cluster.fakes.hub's --hold)."""
    made: list[SandboxRunner] = []

    def make(env: dict[str, str] | None = None, timeline: bool = False, kernel_cache: bool = False,
             emulator_args: str = "", preview: bool = False, hub_args: str = "") -> SandboxRunner:
        env = {**(env or {}), **({EMULATOR_ARGS_VARIABLE: emulator_args} if emulator_args else {}),
               **({HUB_ARGS_VARIABLE: hub_args} if hub_args else {})}
        runner = SandboxRunner(tmp_path / f"work{len(made)}", env, timeline, kernel_cache, preview)
        made.append(runner)
        return runner

    yield make
    for runner in made:
        kill_everything(runner.workdir, runner.record())


def ok(result: Result) -> str:
    assert result.code == 0, result.output
    return result.output


def wait_for(what: str, predicate, timeout: float, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"gave up after {timeout:g} s waiting for {what}"
        time.sleep(interval)


EMPTY: dict[str, list[Any]] = {"environments": [], "keypairs": [], "virtual_machines": [], "security_rules": []}


@pytest.fixture
def cli(tmp_path: Path) -> PulumiCli:
    """The real Pulumi CLI in a workdir of its own (the test's tmp_path), its passphrase new."""
    if why := _toolchain_ready():
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    passphrase = tmp_path / "secrets" / "pulumi_passphrase"
    passphrase.parent.mkdir(mode=0o700)
    passphrase.write_text(secrets.token_urlsafe(32) + "\n")
    return PulumiCli(tmp_path, toolchain_bin(), passphrase, out=io.StringIO())
