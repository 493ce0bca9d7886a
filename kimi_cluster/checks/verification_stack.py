"""The verification stack's graph: config → StackReference to the cluster → EndpointVerification → outputs.
Apart from __main__.py so tests can build it under Pulumi's mocks with settings of their own.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pulumi

from kimi_cluster.checks import CHECK_NAMES, DEFAULT_TIMEOUT_S, select_checks, verification_resource

PROJECT = "kimi-cluster-verification"
# A fully qualified stack name: the verification stack is another project, so a bare stack name would not resolve.
_STACK_NAME = re.compile(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class StackSettings:
    """This stack's config, validated; every error names its key."""

    cluster_stack: str
    run_id: str = ""
    timeout_seconds: float = DEFAULT_TIMEOUT_S
    only: tuple[str, ...] = CHECK_NAMES
    required_checks: tuple[str, ...] = CHECK_NAMES


def _names(key: str, raw: str | None) -> tuple[str, ...] | None:
    if raw is None or not raw.strip():
        return None
    text = raw.strip()
    try:
        # `pulumi config set --path` and YAML lists arrive as JSON text
        value = json.loads(text) if text.startswith("[") else text
        return select_checks(value)
    except ValueError as exc:
        raise ValueError(f"{PROJECT}:{key}: {exc}") from None


def settings_from_config(get: Callable[[str], str | None]) -> StackSettings:
    """Build settings from a `get(key) -> str | None` lookup such as pulumi.Config().get."""
    cluster_stack = (get("clusterStack") or "").strip()
    if not _STACK_NAME.fullmatch(cluster_stack):
        given = f" (got {cluster_stack!r})" if cluster_stack else ""
        raise ValueError(
            f"{PROJECT}:clusterStack must name the cluster stack to verify as <org>/<project>/<stack>{given}: "
            "organization/kimi-cluster/dev on a local backend (pulumi login --local), <your-org>/kimi-cluster/dev on "
            f"Pulumi Cloud; set it with: pulumi config set {PROJECT}:clusterStack organization/kimi-cluster/dev"
        )
    raw_timeout = get("timeoutSeconds")
    timeout = DEFAULT_TIMEOUT_S
    if raw_timeout not in (None, ""):
        try:
            timeout = float(raw_timeout)
        except ValueError:
            timeout = -1.0
        if not 0 < timeout <= 3600:
            raise ValueError(f"{PROJECT}:timeoutSeconds must be a number of seconds in (0, 3600], got {raw_timeout!r}")
    only = _names("only", get("only")) or CHECK_NAMES
    required = _names("requiredChecks", get("requiredChecks")) or only
    not_run = [name for name in required if name not in only]
    if not_run:
        raise ValueError(f"{PROJECT}:requiredChecks names {not_run}, which {PROJECT}:only does not run")
    return StackSettings(
        cluster_stack=cluster_stack,
        run_id=str(get("runId") or ""),
        timeout_seconds=timeout,
        only=only,
        required_checks=required,
    )


def load_settings(config: pulumi.Config | None = None) -> StackSettings:
    return settings_from_config((config or pulumi.Config()).get)


def _present(name: str, stack: str) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if value in (None, ""):
            raise ValueError(f"cluster stack {stack} has no {name} output; is it deployed with this version?")
        return value

    return check


def _secret_present(name: str, stack: str) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if value in (None, ""):
            # A StackReference drops the secret outputs it cannot decrypt ("eliding undecryptable secrets"), so a
            # missing secret beside present plain outputs means another passphrase, not another version.
            raise ValueError(
                f"cluster stack {stack} gave no {name}: cannot decrypt the cluster stack's secrets: same passphrase? "
                "Run this stack with the PULUMI_CONFIG_PASSPHRASE (or _FILE) the cluster stack was created with"
            )
        return str(value)

    return check


def build(settings: StackSettings) -> dict[str, Any]:
    """Create the resources; returns the stack outputs by name."""
    cluster = pulumi.StackReference("cluster", stack_name=settings.cluster_stack)
    endpoint_url = cluster.get_output("endpoint_url").apply(_present("endpoint_url", settings.cluster_stack))
    model = cluster.get_output("served_model_name").apply(_present("served_model_name", settings.cluster_stack))
    revision = cluster.get_output("model_revision").apply(lambda value: value or "")
    # The CA clients must trust; a cluster from before TLS has none, and the tls check then says it is plain HTTP.
    ca_certificate = cluster.get_output("ca_certificate").apply(lambda value: value or "")
    # secret whatever the cluster stack declared, so it can never surface in plain state
    api_key: pulumi.Output[str] = pulumi.Output.secret(
        cluster.get_output("api_key").apply(_secret_present("api_key", settings.cluster_stack)))

    run = verification_resource.EndpointVerification(
        "endpoint",
        endpoint_url=endpoint_url,
        served_model_name=model,
        model_revision=revision,
        ca_certificate=ca_certificate,
        api_key=api_key,
        run_id=settings.run_id,
        only=settings.only,
        required_checks=settings.required_checks,
        timeout_seconds=settings.timeout_seconds,
    )
    return {
        "cluster_stack": settings.cluster_stack,
        "verification_report": run.report,
        "verified": run.verified,
        "all_checks_passed": run.all_passed,
        "failed_checks": run.failed_checks,
        "verified_endpoint_url": run.verified_endpoint_url,
        "verified_model": run.served_model_name,
        "verified_model_revision": run.model_revision,
        "checked_at": run.checked_at,
    }
