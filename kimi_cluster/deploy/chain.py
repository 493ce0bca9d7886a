"""The one chain component: every VM's resolved steps (kimi_cluster/plan/steps/) made into remote commands.

Each step becomes one `remote.Command` (remote_step.py) under its parent: the VM's own component (GpuNode, Front),
a one-step component the table names (Readiness, KernelCacheSave), or the cluster. It is made once every resource
it waits on exists, whatever VM that is on, so the table's order within a VM is all the order there is. Its text
is its rendered script (`scripts`, one Output per step), its stdin the secrets its entry names, by key (`STDIN`).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from typing import cast

import pulumi
from pulumi_command import remote

from kimi_cluster.deploy.remote_step import remote_command_text, remote_step
from kimi_cluster.plan.steps.model import READINESS_TYPE, StepPlan, VmPlan

# The secret keys a step may read on stdin (kimi_cluster/plan/steps/table.py `stdin`), one line each in that order:
# the SSH-free secrets the cluster holds. The TLS private key spans lines: it travels as one base64 line.
STDIN = ("hf_token", "peer_token", "kernel_cache_credentials", "api_key", "tls_private_key", "caretaker_api_key")
_BASE64 = {"tls_private_key"}


class StepGroup(pulumi.ComponentResource):
    """A component that holds steps: a GPU node's chain, the front, or a one-step wait. Its type is the table's."""

    def __init__(self, typ: str, name: str, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(typ, name, None, opts)
        self.kind = typ


def stdin_text(keys: Sequence[str], secrets: Mapping[str, pulumi.Input[str] | None]) -> pulumi.Output[str] | None:
    """The step's stdin: its secrets, one per line, in the order its script reads them; none if it reads none."""
    unknown = [k for k in keys if k not in STDIN]
    if unknown:
        raise ValueError(f"no secret goes by {', '.join(unknown)}; stdin keys are {', '.join(STDIN)}")
    values = [secrets.get(k) for k in keys]
    if all(v is None for v in values):
        return None

    def lines(vs: list[str | None]) -> str:
        return "".join(f"{base64.b64encode((v or '').encode()).decode() if k in _BASE64 else v or ''}\n"
                       for k, v in zip(keys, vs, strict=True))

    return pulumi.Output.secret(pulumi.Output.all(*[v if v is not None else "" for v in values]).apply(lines))


class Chain:
    """Makes every step of `vms`, each after what it waits on. `made` holds what steps may wait on by name (a
    step's command, `<vm>/rules`) and gains every command; `groups` the VMs' own components by resource name."""

    def __init__(self, cluster: pulumi.Resource, *, groups: Mapping[str, pulumi.ComponentResource],
                 made: dict[str, list[pulumi.Resource]]) -> None:
        self._cluster = cluster
        self._groups = groups
        self.made = made
        self.commands: dict[str, remote.Command] = {}
        self.wrappers: dict[str, tuple[StepGroup, remote.Command]] = {}

    def build(self, vms: Sequence[VmPlan], *, scripts: Mapping[str, pulumi.Output[str]],
              vm_ids: Mapping[str, pulumi.Input[str | int]], connections: Mapping[str, remote.ConnectionArgs],
              secrets: Mapping[str, pulumi.Input[str] | None]) -> None:
        pending = [(vm, step) for vm in vms for step in vm.steps]
        while pending:
            ready = [(vm, s) for vm, s in pending if all(a in self.made for a in s.after)]
            if not ready:
                waits = {s.resource: [a for a in s.after if a not in self.made] for _, s in pending}
                raise ValueError(f"steps wait on what no step makes: {waits}")
            for vm, step in ready:
                self._step(step, scripts[step.resource], vm_ids[vm.resource], connections[vm.resource], secrets)
            pending = [p for p in pending if p not in ready]

    def _step(self, step: StepPlan, script: pulumi.Output[str],
              vm_id: pulumi.Input[str | int], connection: remote.ConnectionArgs,
              secrets: Mapping[str, pulumi.Input[str] | None]) -> None:
        depends_on = [r for a in step.after for r in self.made[a]]
        parent = self._groups[step.parent] if step.parent is not None else self._cluster
        if step.wrap is not None:
            typ, name = step.wrap
            # The component waits on what its command waits on (as its children do not inherit it).
            parent = StepGroup(typ, name, pulumi.ResourceOptions(parent=parent, depends_on=depends_on))
        clock = step.clock
        if step.names_vm:
            text = pulumi.Output.all(script, vm_id).apply(
                lambda a: remote_command_text(step.step, a[0], deadline_s=clock.deadline_s, vm_id=a[1]))
        else:
            text = script.apply(lambda t: remote_command_text(step.step, t, deadline_s=clock.deadline_s))
        command = remote_step(parent, step.resource, text, connection, depends_on, stdin_text(step.stdin, secrets),
                              clock.timeout)
        self.commands[step.resource] = command
        self.made[step.resource] = [command]
        if step.wrap is not None:
            self.wrappers[step.wrap[1]] = (cast(StepGroup, parent), command)

    def register_outputs(self) -> None:
        """What each component exports: a GPU node its launch, a readiness wait its output."""
        for name, group in self._groups.items():
            launched = self.commands.get(f"{name}-launch")
            group.register_outputs({"launched": launched.id, "launch_stdout": launched.stdout} if launched else {})
        for group, command in self.wrappers.values():
            group.register_outputs({"stdout": command.stdout} if group.kind == READINESS_TYPE else {})
