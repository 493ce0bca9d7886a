"""How long each node step waits and retries: the `Timing` of the node scripts, the numbers every step's deadline
rule reads (the rules themselves are the step table's, kimi_cluster/plan/steps/table.py).

The defaults here are the one home of those numbers; a stack may override them with kimi-cluster:nodeTiming
(kimi_cluster/settings/node_timing.py), and the two long waits come from downloadTimeoutMinutes and
readinessTimeoutMinutes. The blueprint (kimi_cluster/blueprint/) resolves a stack's Timing once: those two waits,
its stepDeadlineMinutes and its kernel-cache transfer minutes filled in, so nothing below it reads the settings.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

# What a kernel-cache step may spend installing its S3 client before its own transfer deadline starts.
PIP_BUDGET_S = 600
# What custom_timeouts add to a step's node-side deadline: pulumi-command applies them to the dial only (a running
# command is never stopped by them), so they must outlast the ~10 minutes of refused dials that
# kimi_cluster/deploy/remote_step.py allows (DIAL_ERROR_LIMIT).
DIAL_ALLOWANCE_S = 15 * 60


@dataclass(frozen=True)
class Timing:
    """Waits and retries of the node scripts. nodeTiming sets any of them (Settings.timing); the blueprint fills in
    what other keys decide (kimi_cluster/blueprint/inputs.py `resolved_timing`); tests shorten everything."""

    poll_seconds: int = 30  # progress line interval: silent long commands get cut off
    fast_poll_seconds: float = 2
    cloud_init_timeout_s: int = 1200
    gpu_timeout_s: int = 300
    docker_timeout_s: int = 180
    pull_attempts: int = 4
    pull_timeout_s: int = 3600
    pull_backoff_s: int = 30
    settle_seconds: float = 15
    proxy_settle_seconds: float = 2
    log_tail: int = 100
    download_timeout_s: int | None = None  # default: settings.download_timeout_minutes
    peer_timeout_s: int = 300  # a peer unreachable this long (also at start-up) loses its share to the hub
    stall_seconds: int = 180  # a peer or a stream without progress this long counts as stalled
    readiness_timeout_s: int | None = None  # default: settings.readiness_timeout_minutes
    # Node-side deadlines of the steps without a long wait of their own (their rules: kimi_cluster/plan/steps/).
    storage_timeout_s: int = 1800  # a docker prune and restart on a fresh VM
    check_timeout_s: int = 3 * 3600  # reading (with verifySha256: hashing) 1.5 TB
    launch_timeout_s: int = 900  # removing the old container, starting the new one, the settle check
    proxy_timeout_s: int = 300  # writing a few files, starting the proxy container, its settle check
    # The kernel warm-up's own deadline (kimi-cluster:kernelWarmup), its wait for config.json included: twice the
    # 10-20 min of a cold compile (kimi_cluster/operator/bringup.py). Past it the launch starts cold.
    warmup_timeout_s: int = 2400
    # Beyond a step's own waits: installing tools, writing files, printing the log tail on failure.
    deadline_slack_s: int = 300
    # Filled in by the blueprint from kimi-cluster:stepDeadlineMinutes and kernelCache.*TimeoutMinutes (the cache
    # steps run only with kernelCache set, whose defaults are these minutes' home).
    step_deadline_minutes: Mapping[str, float] = field(default_factory=dict)
    cache_restore_minutes: int = 0
    cache_save_minutes: int = 0

    @property
    def download_s(self) -> int:
        return _resolved(self.download_timeout_s, "download_timeout_s (downloadTimeoutMinutes)")

    @property
    def readiness_s(self) -> int:
        return _resolved(self.readiness_timeout_s, "readiness_timeout_s (readinessTimeoutMinutes)")

    def kernel_cache_transfer_s(self, deadline_s: int) -> int:
        """The kernel-cache program's own deadline: what is left of its step's `deadline_s` after pip and the slack."""
        return max(30, deadline_s - PIP_BUDGET_S - self.deadline_slack_s)


def _resolved(value: int | None, name: str) -> int:
    if value is None:
        raise ValueError(f"Timing.{name} is not resolved: the blueprint fills it in (resolved_timing)")
    return value
