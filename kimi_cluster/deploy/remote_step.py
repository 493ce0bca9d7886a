"""The remote-command wrapper: how one rendered step script reaches a node and runs there within its deadline.

Every node step, the readiness wait, the kernel-cache save and the front's steps go through `remote_step`: one
pulumi-command `remote.Command` over a patient SSH connection pinned to the VM's host key, its script carried
base64-encoded in the command text and every secret on stdin (`stdin_lines`, `proxy_stdin`), never in the text.
"""

from __future__ import annotations

import base64
from typing import Any

import pulumi
from pulumi_command import remote

from kimi_cluster.plan.steps.table import SUMMARIES

SCRIPT_DIR = "~/.kimi-cluster"  # each step's script stays on the node, for reading and re-running by hand

# A fresh VM refuses SSH for minutes after it reports ACTIVE; pulumi-command's defaults (10 dials, 15 s each) give up
# after about 11 s of refused connections. 120 dials with its capped backoff wait about 10 minutes.
DIAL_ERROR_LIMIT = 120
PER_DIAL_TIMEOUT_S = 30
# Exit codes of coreutils `timeout`: the deadline passed (TERM), or the step ignored TERM and was KILLed.
TIMEOUT_EXIT, KILLED_EXIT = 124, 137
# How long a step has to exit after TERM before `timeout` KILLs it.
KILL_AFTER_S = 30


def remote_command_text(step: str, script: str, *, deadline_s: int, vm_id: str | int | None = None) -> str:
    """What pulumi-command runs over SSH: keep the script in ~/.kimi-cluster, then run it as root within its deadline.

    The script travels base64-encoded so no quoting can break it; it holds no secret (those arrive on stdin, which
    sudo and `timeout` hand to the script untouched), so printing this text on failure reveals nothing. Naming the
    VM makes a replaced VM run the whole chain again, even if it comes back with the same address.

    The deadline is enforced on the node, by coreutils `timeout`: pulumi-command never stops a running command, so
    this is the only thing that ends a hung step. `timeout` runs the script in its own process group and signals
    the whole group (TERM, then KILL after KILL_AFTER_S), so whatever the step started in the background goes too.
    """
    blob = base64.b64encode(script.encode()).decode()
    path = f"{SCRIPT_DIR}/{step}.sh"
    on_vm = f" on VM {vm_id}" if vm_id is not None else ""
    deadline = int(deadline_s)
    if deadline < 1:
        raise ValueError(f"step {step}: deadline {deadline_s!r} s must be at least 1 s")
    expired = (f"kimi-cluster step {step} ran out of its {deadline} s deadline on the node and was stopped "
               f"(raise it with kimi-cluster:stepDeadlineMinutes)")
    return (
        f"# kimi-cluster step {step}{on_vm}: {SUMMARIES[step]} (script kept at {path}, deadline {deadline} s)\n"
        f"set -e; mkdir -p {SCRIPT_DIR}; printf %s '{blob}' | base64 -d > {path}; set +e; t0=$(date +%s)\n"
        f"sudo -n timeout --kill-after={KILL_AFTER_S} {deadline} bash {path}; rc=$?\n"
        # POSIX sh: the login shell pulumi-command runs this in need not be bash.
        f"if [ $rc -eq {TIMEOUT_EXIT} ] || "
        f"{{ [ $rc -eq {KILLED_EXIT} ] && [ $(( $(date +%s) - t0 )) -ge {deadline} ]; }}; then\n"
        f"  echo '{expired}' >&2\n"
        f"fi\n"
        f"exit $rc"
    )


def node_connection(host: pulumi.Input[str], user: str, private_key: pulumi.Input[str],
                    host_key: pulumi.Input[str] | None = None, port: pulumi.Input[int] = 22) -> remote.ConnectionArgs:
    """SSH to a node: patient enough for a VM that is still booting, pinned to its host key when one is known."""
    return remote.ConnectionArgs(
        host=host,
        user=user,
        port=port,
        private_key=pulumi.Output.secret(private_key),
        host_key=host_key,
        dial_error_limit=DIAL_ERROR_LIMIT,
        per_dial_timeout=PER_DIAL_TIMEOUT_S,
    )


def proxy_stdin(api_key: pulumi.Input[str] | None, tls_private_key: pulumi.Input[str] | None) -> pulumi.Output[str]:
    """Two lines: the API key, then the TLS private key as one base64 line (so `read` takes each whole)."""
    return pulumi.Output.secret(pulumi.Output.all(api_key, tls_private_key).apply(
        lambda a: f"{a[0] or ''}\n{base64.b64encode((a[1] or '').encode()).decode()}\n"))


def stdin_lines(*values: pulumi.Input[str] | None) -> pulumi.Output[str]:
    """Secrets, one per line of stdin, in the order the script reads them (a missing one is an empty line).

    The newline after each lets the script's `read` return without waiting for EOF.
    """
    lines = pulumi.Output.all(*[v if v is not None else "" for v in values])
    return pulumi.Output.secret(lines.apply(lambda vs: "".join(f"{v or ''}\n" for v in vs)))


def remote_step(parent: pulumi.Resource, name: str, create: pulumi.Input[str], connection: remote.ConnectionArgs,
                depends_on: Any, stdin: pulumi.Output[str] | None, timeout: str) -> remote.Command:
    """One step as a remote command; `timeout` bounds its dial only (the node-side deadline is in `create`)."""
    return remote.Command(
        name,
        connection=connection,
        create=create,
        stdin=stdin,
        # The scripts never print a secret (engine logs go through a redaction filter), so the output may be logged.
        logging=remote.Logging.STDOUT_AND_STDERR,
        # A long download's progress output would otherwise be passed back in as an environment variable.
        add_previous_output_in_env=False,
        opts=pulumi.ResourceOptions(
            parent=parent,
            depends_on=depends_on,
            # pulumi-command echoes its inputs into its state; keep the secret stdin encrypted there too.
            additional_secret_outputs=["stdin"] if stdin is not None else None,
            # They only bound the dial (see DIAL_ALLOWANCE_S); the deadline that ends a hung step is on the node.
            custom_timeouts=pulumi.CustomTimeouts(create=timeout, update=timeout),
        ),
    )
