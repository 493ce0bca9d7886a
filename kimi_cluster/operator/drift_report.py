"""What `kimi-cluster plan` says of a deployed stack's VMs as the cloud holds them: the drift a `pulumi up` would put
right, each with what it costs (a SHUTOFF VM still bills its hourly price, and serves nothing).

The stack's VMs come from `pulumi stack export` (no secrets needed: ids and names are plain), their state from the
Hyperstack API; with no API key, or no CLI, there is nothing to say and the plan says nothing.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from kimi_cluster.hyperstack_api.api import HyperstackClient, HyperstackError
from kimi_cluster.operator.stack_state import NodeRecord, StackStateError, parse_state
from kimi_cluster.settings import Settings

STOPPED = ("STOPPING", "SHUTOFF")


def stack_nodes(stack: str, cwd: str | Path, timeout: float = 120.0) -> list[NodeRecord]:
    """The stack's VMs from `pulumi stack export` (its secrets stay encrypted), or none when it cannot be read."""
    try:
        done = subprocess.run(["pulumi", "stack", "export", "--stack", stack, "--non-interactive"], cwd=cwd,
                              capture_output=True, text=True, timeout=timeout)
        return parse_state(json.loads(done.stdout), stack).nodes if done.returncode == 0 else []
    except (OSError, subprocess.TimeoutExpired, ValueError, StackStateError):
        return []


def drift_lines(api: HyperstackClient, nodes: list[NodeRecord], settings: Settings,
                usd_per_node: float | None) -> list[str]:
    """One line per VM that is not as the stack made it, saying what `pulumi up` does about it."""
    cost = f"${usd_per_node:,.2f}/h" if usd_per_node is not None else "its hourly price"
    lines = []
    for node in nodes:
        try:
            vm = api.get_vm(int(node.vm_id))
        except HyperstackError as err:
            if err.not_found:
                lines.append(f"VM {node.name} is gone (deleted behind Pulumi's back): `pulumi up` makes it again")
            continue
        except ValueError:
            continue
        status = str(vm.get("status") or "")
        flavor = (vm.get("flavor") or {}).get("name")
        if status in STOPPED:
            lines.append(f"VM {node.name} is {status} (stopped behind Pulumi's back): it serves nothing and STILL "
                         f"BILLS {cost}; `pulumi up` replaces it")
        elif status == "ERROR":
            lines.append(f"VM {node.name} is in ERROR: `pulumi up` replaces it")
        elif flavor and flavor != settings.flavor_name and node.name != settings.front_name:
            lines.append(f"VM {node.name} has flavor {flavor!r}, the stack's is {settings.flavor_name!r}: drift, "
                         "never adopted; `pulumi up` replaces it")
    return lines
