"""How fast the front (replicas >= 2) gives up on a replica and takes it back: its Caddy health-check figures.

Its own module because two places need the same figures: the front's Caddyfile (kimi_cluster/plan/front_config.py)
and each replica's engine-ready step (kimi_cluster/plan/readiness.py), which holds a rolling restart until the front
can have taken the restarted replica back. The active health check's figures are the resuming layer's own defaults
(kimi_cluster/node/resume/server.py `parse`, which also checks the replicas' health on the front): their one home
is there, and Caddy's check is read from it, so the two never disagree on when a replica is down.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kimi_cluster.node.resume.server import parse

# The resuming layer's defaults, as its command line leaves them (it needs one render server and the replicas).
_LAYER = parse(["--render", "http://127.0.0.1:0", "--replica", "http://127.0.0.1:0"])


@dataclass(frozen=True)
class FrontTuning:
    """How fast the front gives up on a replica. Each figure bounds the time a lost replica still gets traffic.

    A reclaimed VM stops answering: a request to it fails at the dial (dial_timeout) and is retried elsewhere;
    max_fails such failures within fail_duration mark the replica down (passive), and the active check marks it
    down after health_fails missed intervals and back up after health_passes good ones.
    """

    health_interval: str = f"{_LAYER.health_interval_s:g}s"
    health_timeout: str = f"{_LAYER.health_timeout_s:g}s"
    health_fails: int = _LAYER.health_fails
    health_passes: int = _LAYER.health_passes
    fail_duration: str = "10s"
    max_fails: int = 3
    request_buffers: str = "16MiB"  # bodies up to this are replayed on a retry (an agent's long context fits)
    lb_retries: int = 3
    lb_try_duration: str = "10s"
    lb_try_interval: str = "100ms"
    dial_timeout: str = "2s"
    # The resuming layer on the front's loopback: while one hands over to the next (the resume step), or is restarted
    # by systemd after a crash (RestartSec=1), nothing listens for a moment. A request dialled then is dialled again
    # every resume_try_interval (a refused loopback dial costs nothing) until the new one listens: its start-up on
    # a loaded 2-core front (Python and the layer's modules) is well within resume_try_duration.
    resume_try_duration: str = "15s"
    resume_try_interval: str = "50ms"

    @property
    def readmit_checks(self) -> int:
        """Good /health answers in a row, one health_interval apart, that a restarted replica must give before the
        next one restarts. The front takes it back only once both of its checks agree: the active one after
        health_passes good answers (on a clock of its own, so one more covers the offset), and the passive one
        once the requests that failed against it while it was down are fail_duration old (the last of them failed
        just before it served again). Restarting the next replica sooner leaves the front no replica at all."""
        passive = math.ceil(_seconds(self.fail_duration) / _seconds(self.health_interval))
        return max(self.health_passes, passive) + 1

    @property
    def request_buffer_bytes(self) -> int:
        """request_buffers in bytes: the resuming layer behind this Caddy takes bodies up to the same size
        (`--max-body-bytes`), so a body Caddy buffers is never refused behind it, nor one larger parsed there."""
        size = self.request_buffers
        if not size.endswith("MiB"):
            raise ValueError(f"request_buffers {size!r} is not in MiB")
        return int(size.removesuffix("MiB")) * 1024 * 1024

    @property
    def health_interval_s(self) -> int:
        """health_interval in whole seconds (rounded up), for the engine-ready step's sleep."""
        return max(1, math.ceil(_seconds(self.health_interval)))


def _seconds(duration: str) -> float:
    """A Caddy duration of this module's forms ("100ms", "1s", "10s") in seconds."""
    if duration.endswith("ms"):
        return float(duration[:-2]) / 1000
    if duration.endswith("s"):
        return float(duration[:-1])
    raise ValueError(f"{duration!r} is not a duration in ms or s")


DEFAULT_TUNING = FrontTuning()  # what every front runs with; tests pass their own
