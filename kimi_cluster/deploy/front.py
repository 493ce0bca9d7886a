"""The front (replicas >= 2): one small CPU VM whose Caddy holds the endpoint and load-balances over every replica.

It runs the same pinned Caddy and the same bearer check as a head's proxy (kimi_cluster/plan/proxy.py), with the
replicas' engines as upstreams on the private network: active /health checks, passive failover, and a retry on
another replica for any request that failed before its response started (POST included: an inference request has
no side effect on the server). It holds the API key; no replica does. Its public address is the endpoint, so losing
or replacing a replica never changes the URL. Its Caddyfile and scripts: kimi_cluster/plan/front_config.py; its
steps (front-ready, proxy, the readiness wait through it) are the step table's, made under this component by
kimi_cluster/deploy/chain.py.
"""

from __future__ import annotations

import pulumi

from kimi_cluster.deploy.chain import StepGroup
from kimi_cluster.deploy.hyperstack_providers.resources import SecurityRule, VirtualMachine
from kimi_cluster.deploy.rules import security_rules
from kimi_cluster.plan.firewall import RuleSpec
from kimi_cluster.plan.steps.model import FRONT_TYPE


def front_group(parent: pulumi.Resource, name: str, *, vm: VirtualMachine,
                rules: list[RuleSpec]) -> tuple[StepGroup, list[SecurityRule]]:
    """The front's component and its rules, under it; its steps come after the rules."""
    front = StepGroup(FRONT_TYPE, name, pulumi.ResourceOptions(parent=parent))
    return front, security_rules(front, name, vm, rules)
