"""The verifier's outcomes: one CheckResult per check, a VerificationOutcome per run, and the two exceptions."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class CheckResult:
    """The outcome of one check: `detail` is the reason when it failed."""

    name: str
    passed: bool
    latency_s: float
    detail: str
    metrics: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        status = "PASS" if self.passed else "FAIL"
        return f"{status}  {self.name:<19} {self.latency_s:7.2f}s  {self.detail}"


@dataclass
class VerificationOutcome:
    """Every result of one run plus which checks were required to pass."""

    endpoint_url: str
    model: str
    results: list[CheckResult]
    required: tuple[str, ...]

    @property
    def failed(self) -> list[CheckResult]:
        return [r for r in self.results if not r.passed]

    @property
    def failed_required(self) -> list[CheckResult]:
        return [r for r in self.failed if r.name in self.required]

    @property
    def all_passed(self) -> bool:
        return not self.failed

    @property
    def verified(self) -> bool:
        return not self.failed_required

    def report(self) -> list[dict[str, Any]]:
        return [dict(r.to_dict(), required=r.name in self.required) for r in self.results]

    def failure_summary(self) -> str:
        return "; ".join(f"{r.name}: {r.detail}" for r in self.failed_required)


class CheckFailed(Exception):
    """Raised inside a check with a specific reason; the runner turns it into a failed result."""

    def __init__(self, reason: str, metrics: dict[str, Any] | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.metrics = metrics or {}


class VerificationFailed(Exception):
    """A required check failed; the message names each failed check and its reason."""

    def __init__(self, outcome: VerificationOutcome) -> None:
        self.outcome = outcome
        names = ", ".join(r.name for r in outcome.failed_required)
        super().__init__(
            f"verification of {outcome.endpoint_url} ({outcome.model}) failed; "
            f"required checks failed: {names}. {outcome.failure_summary()}"
        )
