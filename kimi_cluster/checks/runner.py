"""Running checks: by name, in canonical order, and as one verification with required checks."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import requests

from kimi_cluster.checks.client import Api
from kimi_cluster.checks.deadline import Deadline, use_deadlines
from kimi_cluster.checks.endpoint_checks import CHECK_NAMES, CHECKS
from kimi_cluster.checks.results import CheckFailed, CheckResult, VerificationOutcome
from kimi_cluster.checks.target import DEFAULT_TIMEOUT_S, Target
from kimi_cluster.checks.text import redact, redact_obj, short


def select_checks(only: Iterable[str] | str | None) -> tuple[str, ...]:
    """Check names in canonical order; `only` may be a comma list. Unknown names are an error."""
    if only is None:
        return CHECK_NAMES
    if isinstance(only, str):
        only = only.split(",")
    wanted = [name.strip() for name in only if name and name.strip()]
    if not wanted:
        return CHECK_NAMES
    unknown = sorted(set(wanted) - set(CHECK_NAMES))
    if unknown:
        raise ValueError(
            f"unknown check name(s) {unknown}; known checks: {', '.join(CHECK_NAMES)}"
        )
    return tuple(name for name in CHECK_NAMES if name in wanted)


def run_check(name: str, target: Target, session: requests.Session | None = None) -> CheckResult:
    """Run one check by name within `target.timeout` in total. A check that raises is a failed
    result, never an exception. A given session gets the verifier's transport adapter mounted."""
    if name not in CHECKS:
        raise ValueError(f"unknown check {name!r}; known checks: {', '.join(CHECK_NAMES)}")
    own_session = session is None
    session = session or requests.Session()
    use_deadlines(session)
    start = time.monotonic()
    try:
        with Deadline(target.timeout) as deadline:
            detail, metrics = CHECKS[name](Api(target, session, deadline))
        passed = True
    except CheckFailed as exc:
        passed, detail, metrics = False, exc.reason, exc.metrics
    except Exception as exc:  # noqa: BLE001 - a bug or an unexpected shape must not stop the other checks
        message = short(redact(str(exc), target.api_key), 200)
        passed, detail, metrics = False, f"check raised {type(exc).__name__}: {message}", {}
    finally:
        if own_session:
            session.close()
    latency = round(time.monotonic() - start, 4)
    return CheckResult(
        name=name,
        passed=passed,
        latency_s=latency,
        detail=redact(detail, target.api_key),
        metrics=redact_obj(metrics, target.api_key),
    )


def run_checks(
    target: Target,
    only: Iterable[str] | str | None = None,
    session: requests.Session | None = None,
    on_result: Callable[[CheckResult], None] | None = None,
) -> list[CheckResult]:
    """Run the selected checks in canonical order; `on_result` sees each result as it lands."""
    names = select_checks(only)
    own_session = session is None
    session = session or requests.Session()
    results = []
    try:
        for name in names:
            result = run_check(name, target, session)
            results.append(result)
            if on_result:
                on_result(result)
    finally:
        if own_session:
            session.close()
    return results


def verify(
    endpoint_url: str,
    model: str,
    api_key: str | None,
    *,
    only: Iterable[str] | str | None = None,
    required: Iterable[str] | str | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    session: requests.Session | None = None,
    on_result: Callable[[CheckResult], None] | None = None,
    ca_certificate: str | None = None,
) -> VerificationOutcome:
    """Run the checks and say which required ones failed. Required defaults to every check run.

    A required check that is not selected by `only` is an error: it could never pass.
    """
    target = Target(endpoint_url, model, api_key, timeout, ca_certificate or None)
    selected = select_checks(only)
    needed = selected if required is None else select_checks(required)
    not_run = [name for name in needed if name not in selected]
    if not_run:
        raise ValueError(f"required checks {not_run} are not among the checks to run {list(selected)}")
    results = run_checks(target, selected, session=session, on_result=on_result)
    return VerificationOutcome(target.base_url, model, results, tuple(needed))
