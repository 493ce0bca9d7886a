"""The endpoint's steps, plan side: the TLS proxy (`proxy`, a head's in front of its engine, or the front's over
every replica), the readiness wait through it (`readiness`), each replica's own wait behind a front
(`engine-ready`), and the launch identity that runs the waits again after a relaunch. Their inputs and value
builders; the proxy's configuration and `docker run` are proxy.py's, the front's Caddyfile front_config.py's.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kimi_cluster.plan import front_config, launch, proxy
from kimi_cluster.plan.front_tuning import DEFAULT_TUNING
from kimi_cluster.plan.launch import EngineInputs
from kimi_cluster.plan.proxy import EndpointInputs
from kimi_cluster.plan.steps.model import PLAN_TLS, ProxyTls, VmSpot
from kimi_cluster.settings.timing import Timing


@dataclass(frozen=True)
class ReadinessInputs:
    """What the readiness waits read: every rank's launch (its identity), the proxy, and the name clients dial."""

    engine: EngineInputs
    endpoint: EndpointInputs
    api_hostname: str | None


def readiness_identity(inputs: ReadinessInputs, tls: ProxyTls = PLAN_TLS) -> str:
    """Changes whenever any rank's launch configuration or the proxy's does, so the readiness wait runs again after a
    relaunch."""
    engine = inputs.engine
    prints = [launch.launch_fingerprint(engine, r, f"<node{r}>", "<node0>") for r in range(engine.nodes)]
    prints.append(proxy.proxy_fingerprint(inputs.endpoint, tls.cert_chain_pem, tls.ca_pem))
    return hashlib.sha256(" ".join(prints).encode()).hexdigest()[:16]


def group_identity(inputs: ReadinessInputs, spot: VmSpot, tls: ProxyTls = PLAN_TLS) -> str:
    """The readiness identity of a replica's head: with several nodes it changes too when a VM of its group is new,
    whose relaunch of every rank the wait must then see through."""
    identity = readiness_identity(inputs, tls)
    if inputs.engine.nodes < 2 or not spot.group_vm_ids:
        return identity
    return identity + "-" + hashlib.sha256(spot.group_vm_ids.encode()).hexdigest()[:16]


def front_identity(inputs: ReadinessInputs, head_private_ips: Sequence[str]) -> str:
    """The front's readiness identity: runs its wait again when a launch or a replica's address changes."""
    return readiness_identity(inputs) + "-" + hashlib.sha256(" ".join(head_private_ips).encode()).hexdigest()[:16]


def proxy_values(endpoint: EndpointInputs, spot: VmSpot, timing: Timing, _deadline_s: int,
                 _step: str) -> dict[str, Any]:
    heads = spot.front_upstreams
    if heads is None:  # the head's own proxy, in front of its engine
        return proxy.step_values(endpoint, spot.tls.cert_chain_pem, spot.tls.ca_pem, proxy.render_config(endpoint),
                                 proxy.upstream(endpoint), timing.proxy_settle_seconds)
    # The front's (replicas >= 2): load-balancing over every replica's engine, reloaded through its admin socket.
    return proxy.step_values(endpoint, spot.tls.cert_chain_pem, spot.tls.ca_pem,
                             front_config.caddyfile(endpoint, heads),
                             " ".join(front_config.upstreams(endpoint, heads)), timing.proxy_settle_seconds,
                             admin=True)


def readiness_values(inputs: ReadinessInputs, spot: VmSpot, timing: Timing, _deadline_s: int,
                     _step: str) -> dict[str, Any]:
    # On the front (replicas >= 2) the container it watches is the proxy itself: no engine runs there; its identity
    # runs the wait again when a launch or a replica's address changes.
    front = spot.front_upstreams is not None
    container = proxy.CONTAINER_NAME if front else launch.CONTAINER_NAME
    identity = front_identity(inputs, spot.front_upstreams or ()) if front else group_identity(inputs, spot, spot.tls)
    return {"container": container, "container_role": "proxy" if front else "engine",
            "served_name": inputs.engine.served_name, "api_port": inputs.endpoint.api_port,
            "readiness_timeout_s": timing.readiness_s, "log_tail": timing.log_tail,
            # The name clients dial: the certificate is checked for it (curl connects to the head's loopback).
            "public_host": inputs.api_hostname or spot.public_ip, "ca_file": proxy.CA_FILE,
            "launch_identity": identity}


def engine_ready_values(inputs: ReadinessInputs, spot: VmSpot, timing: Timing, _deadline_s: int,
                        _step: str) -> dict[str, Any]:
    # On the replica's head: its engine binds the head's private address, where the front asks it.
    return {"container": launch.CONTAINER_NAME, "served_name": inputs.engine.served_name,
            "engine_url": f"http://{spot.private_ip}:{inputs.engine.engine_port}",
            "readiness_timeout_s": timing.readiness_s, "log_tail": timing.log_tail,
            "launch_identity": group_identity(inputs, spot, spot.tls),
            "readmit_checks": DEFAULT_TUNING.readmit_checks, "readmit_interval_s": DEFAULT_TUNING.health_interval_s}
