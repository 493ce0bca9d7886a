"""The scheduler's hands on the stack: Pulumi's Automation API (`pulumi.automation`, which runs the same engine as
the CLI, on the project's own Pulumi.yaml and Pulumi.<stack>.yaml, with the backend and secrets provider the host is
logged in to), and the endpoint's verification (kimi_cluster/checks, what `kimi-cluster verify` runs).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from typing import Any

from pulumi import automation as auto

from kimi_cluster.settings.keys import NAMESPACE


class AutomationDriver:
    def __init__(self, stack: str, work_dir: str, say: Callable[[str], None],
                 env: dict[str, str] | None = None) -> None:
        self.say = say
        workspace = auto.LocalWorkspace(work_dir=work_dir, env_vars=env or None)
        self.stack = auto.Stack.select(stack, workspace)

    def up(self, replicas: int) -> int:
        """`pulumi up` of the stack, with `replicas` the window's (set in the stack's config first when it differs);
        how many resources it created (none: the stack was up already, and the time is no bring-up's)."""
        key = f"{NAMESPACE}:replicas"
        config = self.stack.get_all_config()
        now = int(config[key].value) if key in config else 1
        if replicas != now:
            self.say(f"the window wants {replicas} replica(s), the stack has {now}: setting {key}")
            self.stack.set_config(key, auto.ConfigValue(str(replicas)))
        result = self.stack.up(on_output=self._output, color="never", suppress_progress=True)
        return int((result.summary.resource_changes or {}).get(auto.OpType.CREATE) or 0)

    def _output(self, line: str) -> None:
        text = line.rstrip()
        if text:
            self.say("  | " + text[:400])

    def verify(self) -> tuple[bool, str]:
        """Every check of `kimi-cluster verify` against the stack's endpoint, with its key and CA from the outputs."""
        from kimi_cluster.checks import verify

        outputs = {k: v.value for k, v in self.stack.outputs().items()}
        url = outputs.get("endpoint_url")
        if not url:
            return False, "the stack has no endpoint_url output"
        try:
            outcome = verify(url, str(outputs.get("served_model_name") or ""), outputs.get("api_key"),
                             ca_certificate=outputs.get("ca_certificate"))
        except (OSError, ValueError) as err:
            return False, f"verify could not run: {err}"
        failed = [r.name for r in outcome.failed]
        return not failed, (f"{len(outcome.results)} checks against {url}: "
                            + (f"{len(failed)} failed: {', '.join(failed)}" if failed else "all passed"))

    def early_ask(self) -> dict[str, Any] | None:
        """The early start pending on the front (schedule.earlyStart), read with the stack's key and CA."""
        from kimi_cluster.operator.early_start import read_ask

        outputs = {k: v.value for k, v in self.stack.outputs().items()}
        url = outputs.get("endpoint_url")
        if not url:
            raise ValueError("the stack has no endpoint_url output (no front up to take an ask)")
        return read_ask(str(url), outputs.get("api_key"), outputs.get("ca_certificate"))

    def recover(self, interrupted: dict[str, Any]) -> str:
        """After a scheduler killed mid-up: end the pulumi it left (its process group, when it led one), take away
        the stack lock that pulumi held (`pulumi cancel`, which a DIY backend answers by removing it), and refresh
        with the pending creates cleared."""
        said = []
        pgid = interrupted.get("pgid")
        if pgid and pgid == interrupted.get("pid") and pgid != os.getpgrp():
            said.append(_end_group(int(pgid)))
        try:
            self.stack.cancel()
            said.append("cleared the stack's lock")
        except auto.CommandError as err:
            said.append(f"no lock to clear ({str(err).strip().splitlines()[-1][:200]})")
        # As after any interrupted up (the sandbox's own recovery, kimi_cluster/sandbox/cli_stacks.py): each provider
        # is asked whether what the cut-off up began exists; the up that follows makes the rest.
        self.stack.refresh(clear_pending_creates=True, color="never", on_output=self._output, suppress_progress=True)
        said.append("refreshed the state (pending creates cleared)")
        return "; ".join(said) + "; running the up again (a VM whose create was cut off is found by its name)"


def _end_group(pgid: int, grace_s: float = 30.0) -> str:
    """SIGTERM to what the killed scheduler left (pulumi ends its update and lets go of the lock), SIGKILL after
    `grace_s`; waited for, so no second up starts beside it."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return "no process of it was left"
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return f"ended the pulumi left in process group {pgid}"
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    return f"killed the pulumi left in process group {pgid} ({grace_s:g} s after SIGTERM)"
