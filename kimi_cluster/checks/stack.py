"""What the verification stack's resource records, computed without Pulumi so it can be tested alone."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import requests

from kimi_cluster.checks.results import VerificationFailed
from kimi_cluster.checks.runner import verify
from kimi_cluster.checks.target import DEFAULT_TIMEOUT_S

# Inputs of the verification stack's resource; the first four re-run the checks with a fresh
# resource when they change, the rest re-run them in place.
STACK_REPLACE_KEYS: tuple[str, ...] = ("endpoint_url", "served_model_name", "model_revision", "run_id")
STACK_UPDATE_KEYS: tuple[str, ...] = ("only", "required_checks", "timeout_seconds", "ca_certificate")


def run_stack_checks(
    endpoint_url: str,
    served_model_name: str,
    api_key: str | None,
    *,
    model_revision: str | None = "",
    run_id: str | None = "",
    only: Iterable[str] | str | None = None,
    required_checks: Iterable[str] | str | None = None,
    timeout_seconds: float = DEFAULT_TIMEOUT_S,
    session: requests.Session | None = None,
    ca_certificate: str | None = None,
) -> dict[str, Any]:
    """The outputs when every required check passed, or VerificationFailed naming each failed
    required check and its reason.

    The key is used for the requests only; nothing returned contains it.
    """
    timeout = float(timeout_seconds or DEFAULT_TIMEOUT_S)
    outcome = verify(
        endpoint_url,
        served_model_name,
        api_key,
        only=only,
        required=required_checks,
        timeout=timeout,
        session=session,
        ca_certificate=ca_certificate,
    )
    if not outcome.verified:
        raise VerificationFailed(outcome)
    return {
        "endpoint_url": endpoint_url,
        "served_model_name": served_model_name,
        "model_revision": model_revision or "",
        "run_id": run_id or "",
        "only": [r.name for r in outcome.results],
        "required_checks": list(outcome.required),
        "timeout_seconds": timeout,
        "ca_certificate": ca_certificate or "",
        "report": outcome.report(),
        "verified": outcome.verified,
        "all_passed": outcome.all_passed,
        "failed_checks": [r.name for r in outcome.failed],
        "verified_endpoint_url": endpoint_url if outcome.verified else None,
        "checked_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
