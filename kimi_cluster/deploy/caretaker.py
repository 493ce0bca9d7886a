"""The caretaker's step (idleStopMinutes, budgetUsd): the remote command that starts it on the endpoint's VM. What it
is told is the plan's (kimi_cluster/plan/caretaker.py); its Hyperstack key arrives on the step's stdin only."""

from __future__ import annotations

from collections.abc import Sequence

import pulumi
from pulumi_command import remote

from kimi_cluster.deploy.remote_step import node_connection, remote_command_text, remote_step, stdin_lines


def caretaker_step(parent: pulumi.Resource, name: str, *, render: pulumi.Output[str], deadline_s: int, timeout: str,
                   public_ip: pulumi.Input[str], ssh_user: str, ssh_private_key: pulumi.Input[str],
                   host_key: pulumi.Input[str], api_key: pulumi.Input[str], vm_id: pulumi.Input[str | int],
                   depends_on: Sequence[pulumi.Resource]) -> remote.Command:
    """The step on the endpoint's VM; `render` is its script, already naming the GPU VMs' ids."""
    text = pulumi.Output.all(render, vm_id).apply(
        lambda a: remote_command_text("caretaker", a[0], deadline_s=deadline_s, vm_id=a[1]))
    return remote_step(parent, f"{name}-caretaker", text,
                       node_connection(public_ip, ssh_user, ssh_private_key, host_key),
                       list(depends_on), stdin_lines(api_key), timeout)
