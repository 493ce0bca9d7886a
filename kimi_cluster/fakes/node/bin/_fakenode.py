"""The entry point behind the fake node's stub commands (docker, systemctl, systemd-run, nvidia-smi, ip, cloud-init).

State lives under $FAKE_NODE_ROOT/var/lib/fake-node; every call is appended to calls.jsonl there. Faults come from
FAKE_* environment variables (see kimi_cluster/fakes/node/__init__.py), never from anything the product scripts could
know about.
In the sandbox the node's directory ($SANDBOX_NODE_DIR) is the root, FAKE_NODE_DISKS are created on the first
call (the VM image's disks) and FAKE_IP_ADDRS may name $SANDBOX_NODE_HOST, so one environment serves every node.
The stubs run as `python3 -S` (their shebang): they need only the standard library, and skipping site-packages saves
a few milliseconds of each of some 1,400 calls a suite.
"""

from __future__ import annotations

import os
import sys
import time

from _fakestate import UNITS, boot, counter, fail, record

# Every stub call is a new interpreter (some 1,400 a suite), so what only some calls need is imported where it is
# used: subprocess (about 8 ms) by the calls that start a process, typing (about 4 ms) by the type checker alone.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable


# ---- the small tools -------------------------------------------------------------------------------------------------

def nvidia_smi(argv: list[str]) -> None:
    n = int(os.environ.get("FAKE_GPU_COUNT", "8"))
    if n <= 0:
        fail("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.", 9)
    name = os.environ.get("FAKE_GPU_NAME", "NVIDIA H100 80GB HBM3")
    for i in range(n):
        print(f"{i}, {name}, 81559 MiB")


def ip(argv: list[str]) -> None:
    if [a for a in argv if a not in ("-o", "-4")][:2] not in (["addr", "show"], ["address", "show"], ["a", "show"]):
        fail(f"fake ip: unsupported {argv!r}", 2)
    spec = ip_addrs()
    for idx, item in enumerate(spec.split(","), start=1):
        nic, _, cidr = item.partition("=")
        print(f"{idx}: {nic}    inet {cidr} scope global {nic}\\       valid_lft forever preferred_lft forever")


def ip_addrs() -> str:
    """`nic=addr/len,...`; $VARS expand, so one value can give each sandbox node its own ($SANDBOX_NODE_HOST)."""
    return os.path.expandvars(os.environ.get("FAKE_IP_ADDRS", "lo=127.0.0.1/8,ens6=10.0.0.5/24"))


def cloud_init(argv: list[str]) -> None:
    if argv[:1] != ["status"]:
        fail(f"fake cloud-init: unsupported {argv!r}", 2)
    n = counter("cloud-init-status")
    if n <= int(os.environ.get("FAKE_CLOUD_INIT_RUNNING_POLLS", "0")):
        print("status: running")
        return
    status = os.environ.get("FAKE_CLOUD_INIT", "done")
    print(f"status: {status}")
    sys.exit({"done": 0, "error": 1, "degraded": 2}.get(status, 0))


def journalctl(argv: list[str]) -> None:
    unit = next((argv[i + 1] for i, a in enumerate(argv) if a in ("-u", "--unit")), None)
    log = UNITS / f"{unit}.log" if unit else None
    if log and log.exists():
        sys.stdout.write(log.read_text())


TOOLS = {"nvidia-smi": nvidia_smi, "ip": ip, "cloud-init": cloud_init, "journalctl": journalctl}


def tool_function(tool: str) -> Callable[[list[str]], None]:
    """The stub's behaviour; docker's and systemd's modules are imported only by their own calls."""
    if tool == "docker":
        from _fakedocker import docker

        return docker
    if tool in ("systemctl", "systemd-run"):
        from _fakesystemd import systemctl, systemd_run

        return systemctl if tool == "systemctl" else systemd_run
    return TOOLS[tool]


def hangs(tool: str, argv: list[str]) -> bool:
    """FAKE_HANG="nvidia-smi" or "docker info": that call never returns, as a wedged driver or daemon does."""
    for spec in filter(None, (s.strip() for s in os.environ.get("FAKE_HANG", "").split(","))):
        words = spec.split()
        if words[0] == tool and argv[:len(words) - 1] == words[1:]:
            return True
    return False


def main(tool: str) -> None:
    boot()
    record(tool, sys.argv[1:])
    if hangs(tool, sys.argv[1:]):
        while True:
            time.sleep(3600)
    tool_function(tool)(sys.argv[1:])
