"""The wall times the sandbox flows measure, carried to the end-of-run summary even from pytest-xdist workers.

A flow calls `report(line)`; tests/conftest.py moves the pending lines into the test's report as user_properties
(which xdist sends from the worker to the controller) and prints them all in one terminal-summary section.
"""

from __future__ import annotations

PROPERTY = "sandbox wall time"
# Lines reported by the test now running in this process, not yet attached to its report.
PENDING: list[str] = []
# Lines collected from the reports (in the controller under xdist), printed at the end of the run.
COLLECTED: list[str] = []


def report(line: str) -> None:
    PENDING.append(line)
    print(line)
