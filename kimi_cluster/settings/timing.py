"""How long each node step waits, retries and may run: the `Timing` of the node scripts and every step's deadline.

The defaults here are the one home of those numbers; a stack may override them with kimi-cluster:nodeTiming
(kimi_cluster/settings/node_timing.py), and the two long waits come from downloadTimeoutMinutes and
readinessTimeoutMinutes. This module reads settings through `TimedSettings` only, so it never imports them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

# What a kernel-cache step may spend installing its S3 client before its own transfer deadline starts.
PIP_BUDGET_S = 600
# What custom_timeouts add to a step's node-side deadline: pulumi-command applies them to the dial only (a running
# command is never stopped by them), so they must outlast the ~10 minutes of refused dials that
# kimi_cluster/deploy/remote_step.py allows (DIAL_ERROR_LIMIT).
DIAL_ALLOWANCE_S = 15 * 60


class CacheTimeouts(Protocol):
    """The kernel-cache transfer deadlines Timing reads (kimi_cluster.settings.KernelCacheSettings)."""

    @property
    def restore_timeout_minutes(self) -> int: ...

    @property
    def save_timeout_minutes(self) -> int: ...


class TimedSettings(Protocol):
    """The settings Timing reads (kimi_cluster.settings.Settings has them all)."""

    @property
    def download_timeout_minutes(self) -> int: ...

    @property
    def readiness_timeout_minutes(self) -> int: ...

    @property
    def step_deadline_minutes(self) -> Mapping[str, float]: ...

    @property
    def kernel_cache(self) -> CacheTimeouts | None: ...


@dataclass(frozen=True)
class Timing:
    """Waits and retries of the node scripts. Settings give the two long deadlines and, through nodeTiming, any of
    the others (Settings.timing); tests shorten everything."""

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
    # Node-side deadlines of the steps without a long wait of their own (see deadline_s).
    storage_timeout_s: int = 1800  # a docker prune and restart on a fresh VM
    check_timeout_s: int = 3 * 3600  # reading (with verifySha256: hashing) 1.5 TB
    launch_timeout_s: int = 900  # removing the old container, starting the new one, the settle check
    proxy_timeout_s: int = 300  # writing a few files, starting the proxy container, its settle check
    # The kernel warm-up's own deadline (kimi-cluster:kernelWarmup), its wait for config.json included: twice the
    # 10-20 min of a cold compile (kimi_cluster/operator/bringup.py). Past it the launch starts cold.
    warmup_timeout_s: int = 2400
    # Beyond a step's own waits: installing tools, writing files, printing the log tail on failure.
    deadline_slack_s: int = 300

    def download_s(self, settings: TimedSettings) -> int:
        return self.download_timeout_s or settings.download_timeout_minutes * 60

    def readiness_s(self, settings: TimedSettings) -> int:
        return self.readiness_timeout_s or settings.readiness_timeout_minutes * 60

    def deadline_s(self, step: str, settings: TimedSettings) -> int:
        """How long `step` may run on the node before it is stopped there; its custom_timeouts derive from this.

        pulumi-command never stops a running command (custom_timeouts cut short only the dial), so a hung script
        would hang `pulumi up` for good: every step runs under `timeout` with this deadline (remote_command_text).
        Each default outlasts the step's own waits; kimi-cluster:stepDeadlineMinutes overrides it per step.
        """
        override = settings.step_deadline_minutes.get(step)
        if override:
            return max(1, round(override * 60))
        slack = self.deadline_slack_s
        defaults = {
            "ready": self.cloud_init_timeout_s + self.gpu_timeout_s + slack,
            "storage": self.storage_timeout_s + self.docker_timeout_s,
            "image": self.pull_attempts * (self.pull_timeout_s + self.pull_backoff_s * self.pull_attempts) + slack,
            "weights": self.download_s(settings) + 6 * slack,  # also installs huggingface_hub on the node
            "check": self.check_timeout_s,
            "launch": self.launch_timeout_s + round(self.settle_seconds),
            "proxy": self.proxy_timeout_s + round(self.proxy_settle_seconds),
            "readiness": self.readiness_s(settings) + slack,
            # The transfer's own deadline (kernelCache.*TimeoutMinutes) ends it first, with a warning: these steps
            # never fail, so theirs must stay inside this one (kernel_cache_transfer_s).
            "cache-restore": self._cache_minutes(settings, "restore") * 60 + PIP_BUDGET_S + slack,
            "cache-save": self._cache_minutes(settings, "save") * 60 + PIP_BUDGET_S + slack,
            "engine-ready": self.readiness_s(settings) + slack,
            "front-ready": self.cloud_init_timeout_s + self.docker_timeout_s + slack,
            # The warm-up gives up at its own deadline, with a warning: it never fails, so this one must outlast it.
            "warmup": self.warmup_timeout_s + self.docker_timeout_s + slack,
            "caretaker": self.proxy_timeout_s,  # writes a few files and starts (or leaves) one systemd unit
        }
        if step not in defaults:
            raise ValueError(f"step {step!r} has no deadline; every node step needs one in Timing.deadline_s")
        return defaults[step]

    @staticmethod
    def _cache_minutes(settings: TimedSettings, which: str) -> int:
        cfg = settings.kernel_cache
        if cfg is None:
            return 20
        return cfg.restore_timeout_minutes if which == "restore" else cfg.save_timeout_minutes

    def kernel_cache_transfer_s(self, step: str, settings: TimedSettings) -> int:
        """The kernel-cache program's own deadline: what is left of the step's after pip and the slack."""
        return max(30, self.deadline_s(step, settings) - PIP_BUDGET_S - self.deadline_slack_s)

    def custom_timeout(self, step: str, settings: TimedSettings) -> str:
        """The step's custom_timeouts (create and update), as a Go duration: its deadline plus the dial allowance."""
        return f"{-(-(self.deadline_s(step, settings) + DIAL_ALLOWANCE_S) // 60)}m"
