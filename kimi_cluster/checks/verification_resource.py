"""The verification stack's dynamic resource: create (and any change of endpoint, model, revision or runId)
runs the endpoint checks; a failed required check raises, so `pulumi up` fails naming it.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import pulumi
import pulumi.dynamic as dynamic
from pulumi.output import Unknown

# dill pickles the provider by reference to this module's top-level name, `checks_resource`, and the dynamic
# provider host imports it cold; `pip install -e .` (pyproject.toml) puts verification/ and the repository root,
# where `components` lives, on the venv's sys.path, whatever directory the host starts in.
from kimi_cluster.checks import (
    CHECK_NAMES,
    DEFAULT_TIMEOUT_S,
    STACK_REPLACE_KEYS,
    STACK_UPDATE_KEYS,
    run_stack_checks,
    select_checks,
)

_UNKNOWN_SENTINEL = "04da6b54-80e4-46f7-96ec-b56ff0331ba9"  # pulumi's wire value for "not known yet"


def _unknown(value: Any) -> bool:
    return isinstance(value, Unknown) or value == _UNKNOWN_SENTINEL


def _normal(key: str, value: Any) -> Any:
    """Compare inputs and recorded outputs the same way: lists as check names, blanks as ''."""
    if key in ("only", "required_checks"):
        return list(select_checks(value)) if value else list(CHECK_NAMES)
    if key == "timeout_seconds":
        return float(value or DEFAULT_TIMEOUT_S)
    return value or ""


def _run(props: Mapping[str, Any]) -> dict[str, Any]:
    return run_stack_checks(
        props["endpoint_url"],
        props["served_model_name"],
        props.get("api_key"),
        model_revision=props.get("model_revision"),
        run_id=props.get("run_id"),
        only=props.get("only"),
        required_checks=props.get("required_checks"),
        timeout_seconds=props.get("timeout_seconds") or DEFAULT_TIMEOUT_S,
        ca_certificate=props.get("ca_certificate") or None,
    )


# Module and class names are part of the state: the pickled provider names
# `kimi_cluster.checks.verification_resource.VerificationProvider`,
# and `destroy` of an existing stack unpickles it. Renaming or moving either breaks that destroy.
class VerificationProvider(dynamic.ResourceProvider):
    """Stateless: the key arrives with each call's inputs and is not kept or returned."""

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> dynamic.CheckResult:
        failures = []
        for key in ("endpoint_url", "served_model_name"):
            if not _unknown(news.get(key)) and not news.get(key):
                failures.append(dynamic.CheckFailure(key, f"{key} is empty; is the cluster stack deployed?"))
        for key in ("only", "required_checks"):
            value = news.get(key)
            if value and not _unknown(value):
                try:
                    select_checks(value)
                except ValueError as exc:
                    failures.append(dynamic.CheckFailure(key, str(exc)))
        return dynamic.CheckResult(news, failures)

    def create(self, props: dict[str, Any]) -> dynamic.CreateResult:
        return dynamic.CreateResult(id_=f"verification-{uuid.uuid4().hex[:12]}", outs=_run(props))

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.DiffResult:
        def changed(key: str) -> bool:
            if _unknown(news.get(key)):
                return True
            return _normal(key, olds.get(key)) != _normal(key, news.get(key))

        replaces = [key for key in STACK_REPLACE_KEYS if changed(key)]
        updates = [key for key in STACK_UPDATE_KEYS if changed(key)]
        # delete first: a record of the old endpoint must not outlive a failed check of the new one
        return dynamic.DiffResult(
            changes=bool(replaces or updates), replaces=replaces, delete_before_replace=True
        )

    def update(self, _id: str, _olds: dict[str, Any], news: dict[str, Any]) -> dynamic.UpdateResult:
        return dynamic.UpdateResult(outs=_run(news))

    def delete(self, _id: str, _props: dict[str, Any]) -> None:
        """A verification record has nothing outside Pulumi's state to tear down."""


class EndpointVerification(dynamic.Resource, module="kimi-verification", name="EndpointVerification"):
    """One verification run of an endpoint; its outputs are the report and the verified URL."""

    served_model_name: pulumi.Output[str]
    model_revision: pulumi.Output[str]
    report: pulumi.Output[list]
    verified: pulumi.Output[bool]
    all_passed: pulumi.Output[bool]
    failed_checks: pulumi.Output[list]
    verified_endpoint_url: pulumi.Output[str | None]
    checked_at: pulumi.Output[str]

    def __init__(
        self,
        name: str,
        *,
        endpoint_url: pulumi.Input[str],
        served_model_name: pulumi.Input[str],
        api_key: pulumi.Input[str],
        model_revision: pulumi.Input[str] = "",
        ca_certificate: pulumi.Input[str] = "",
        run_id: str = "",
        only: Sequence[str] = CHECK_NAMES,
        required_checks: Sequence[str] = CHECK_NAMES,
        timeout_seconds: float = DEFAULT_TIMEOUT_S,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        props = {
            "endpoint_url": endpoint_url,
            "served_model_name": served_model_name,
            "model_revision": model_revision,
            # public: the CA the endpoint's certificate must chain to
            "ca_certificate": ca_certificate,
            # secret on the way in, so the state holds it encrypted; the provider never returns it
            "api_key": pulumi.Output.secret(api_key),
            "run_id": run_id,
            "only": list(only),
            "required_checks": list(required_checks),
            "timeout_seconds": float(timeout_seconds),
            "report": None,
            "verified": None,
            "all_passed": None,
            "failed_checks": None,
            "verified_endpoint_url": None,
            "checked_at": None,
        }
        opts = pulumi.ResourceOptions.merge(
            opts,
            pulumi.ResourceOptions(additional_secret_outputs=["api_key"]),
        )
        super().__init__(VerificationProvider(), name, props, opts)
