"""A fake GPU node in a directory: stub docker, systemd, nvidia-smi, ip and cloud-init on PATH, with fault knobs.

The product's scripts run against it unchanged, told only what a real user could set: the node root (nodeRoot), the
hub endpoint (hfEndpoint) and the PATH on the node. `make_fake_node` builds one for a test.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

BIN = Path(__file__).resolve().parent / "bin"


@dataclass
class FakeNode:
    """A node root plus the environment that puts the stubs first on PATH."""

    root: Path
    env: dict[str, str]
    _procs: list[subprocess.Popen] = field(default_factory=list)

    @property
    def state(self) -> Path:
        return self.root / "var/lib/fake-node"

    def run(self, script: str, stdin: str = "", timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
        """Run a rendered script under real bash, as the node would (stdin carries the secret)."""
        return subprocess.run(["bash", self._write(script)], input=stdin, capture_output=True, text=True,
                              env={**self.env, **env}, timeout=timeout, cwd=self.root)

    def start(self, script: str, stdin: str = "", **env: str) -> subprocess.Popen:
        """Run a script in the background in its own process group (so a test can cut it off like a dropped SSH)."""
        proc = subprocess.Popen(["bash", self._write(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, env={**self.env, **env}, cwd=self.root,
                                start_new_session=True)
        assert proc.stdin is not None  # stdin=PIPE
        proc.stdin.write(stdin)
        proc.stdin.close()
        proc.stdin = None  # so communicate() only reads
        self._procs.append(proc)
        return proc

    def shell(self, command: str, stdin: str = "", timeout: float = 120) -> subprocess.CompletedProcess:
        """Run a one-line command the way the SSH session would (`bash -c`), from the login directory."""
        return subprocess.run(["bash", "-c", command], input=stdin, capture_output=True, text=True, env=self.env,
                              timeout=timeout, cwd=self.env["HOME"])

    def cleanup_process(self, proc: subprocess.Popen) -> None:
        """Kill a script started with `start`, as a dropped SSH session would (its children go with it)."""
        _killpg(proc.pid)
        proc.wait(timeout=10)

    def _write(self, script: str) -> str:
        d = self.root.parent / "scripts"
        d.mkdir(exist_ok=True)
        path = d / f"script-{len(list(d.iterdir()))}.sh"
        path.write_text(script)
        return str(path)

    def calls(self, tool: str | None = None) -> list[list[str]]:
        p = self.state / "calls.jsonl"
        if not p.exists():
            return []
        rows = [json.loads(line) for line in p.read_text().splitlines()]
        return [r["argv"] for r in rows if tool is None or r["tool"] == tool]

    def docker_state(self) -> dict:
        p = self.state / "docker/state.json"
        return json.loads(p.read_text()) if p.exists() else {"running": True, "root": "/var/lib/docker", "images": []}

    def container(self, name: str) -> dict | None:
        p = self.state / f"docker/containers/{name}.json"
        return json.loads(p.read_text()) if p.exists() else None

    def unit(self, name: str) -> dict | None:
        p = self.state / f"units/{name}.json"
        return json.loads(p.read_text()) if p.exists() else None

    def cleanup(self) -> None:
        """Stop everything the node started: background scripts, unit processes, hooked containers."""
        for proc in self._procs:
            _killpg(proc.pid)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        for kind in ("units", "docker/containers"):
            for p in (self.state / kind).glob("*.json") if (self.state / kind).exists() else []:
                data = json.loads(p.read_text())
                for key in ("pid", "monitor", "hook_pid"):
                    if data.get(key):
                        _killpg(data[key])


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass


def make_fake_node(
    tmp_path: Path,
    *,
    gpus: int = 8,
    private_ip: str = "10.0.0.5",
    nic: str = "ens6",
    disk_avail_bytes: int | None = 4 * 10**12,
    pull_fails: int = 0,
    cloud_init: str = "done",
    cloud_init_running_polls: int = 0,
    run_exits: bool = False,
    run_hook: str | None = None,
    daemon_json: dict | None = None,
    hang: str | None = None,
    extra_env: dict[str, str] | None = None,
) -> FakeNode:
    """A fresh node: docker on the root disk, an NVIDIA runtime in daemon.json, a stale file in /dev/shm.

    Faults: `gpus` (0 = driver not answering), `disk_avail_bytes`, `pull_fails` (-1 = always), `cloud_init`
    ("done", "error", ...), `cloud_init_running_polls`, `run_exits` (the engine dies at start-up, its log ending
    with extra_env's FAKE_RUN_LOG), `run_hook`,
    `hang` (a stub call that never returns, e.g. "nvidia-smi" or "docker info"; FAKE_HANG).
    """
    root = Path(tmp_path) / "node"
    for d in ("etc/docker", "ephemeral", "dev/shm", "home/ubuntu", "var/lib", "tmp"):
        (root / d).mkdir(parents=True, exist_ok=True)
    config = daemon_json if daemon_json is not None else {
        "runtimes": {"nvidia": {"path": "nvidia-container-runtime", "args": []}}}
    (root / "etc/docker/daemon.json").write_text(json.dumps(config))
    (root / "dev/shm/nccl-stale-segment").write_text("left over by a crashed run")
    env = {
        "PATH": f"{BIN}:{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
        "HOME": str(root / "home/ubuntu"),
        "LANG": "C.UTF-8",
        "TMPDIR": str(root / "tmp"),
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
        "FAKE_NODE_ROOT": str(root),
        "FAKE_GPU_COUNT": str(gpus),
        "FAKE_IP_ADDRS": f"lo=127.0.0.1/8,{nic}={private_ip}/24,docker0=172.17.0.1/16",
        "FAKE_PULL_FAILS": str(pull_fails),
        "FAKE_CLOUD_INIT": cloud_init,
        "FAKE_CLOUD_INIT_RUNNING_POLLS": str(cloud_init_running_polls),
    }
    if disk_avail_bytes is not None:
        env["FAKE_DISK_AVAIL_BYTES"] = str(disk_avail_bytes)
    if run_exits:
        env["FAKE_RUN_EXITS"] = "1"
    if run_hook:
        env["FAKE_DOCKER_RUN_HOOK"] = run_hook
    if hang:
        env["FAKE_HANG"] = hang
    env.update(extra_env or {})
    return FakeNode(root=root, env=env)
