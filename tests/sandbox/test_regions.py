"""Regions in the sandbox, as a user runs it: the first listed region is out of stock, so the cluster lands in the
second; a later `up` with the stock back and another list keeps it where it is and touches nothing.
"""

from __future__ import annotations

import json
import re
import time

import pytest

from .conftest import EMPTY, ok, report

pytestmark = [pytest.mark.flow, pytest.mark.timeout(420)]

FLAVOR = "n3-H100x8-NVLink"


def test_placed_in_the_second_region_and_kept_there_across_ups(sandbox, start_emulator) -> None:
    emulator = start_emulator(extra=("--capacity", f"CANADA-1:{FLAVOR}=3"))  # the cluster needs four
    run = sandbox(emulator.env())
    started = time.monotonic()
    out = ok(run("up", "--quiet", "--config", 'regions=["CANADA-1", "NORWAY-1"]'))
    assert re.search(r"^  region +NORWAY-1$", out, re.M), out
    inventory = emulator.inventory()
    assert {e["region"] for e in inventory["environments"]} == {"NORWAY-1"}
    assert len(inventory["virtual_machines"]) == 4 and emulator.vm_posts() == 4

    # Stock comes back in CANADA-1 and runs out in NORWAY-1; the list changes and no longer names NORWAY-1.
    emulator.set_capacity("CANADA-1", FLAVOR, 16)
    emulator.set_capacity("NORWAY-1", FLAVOR, 0)
    # This up passes no --[no-]kernel-cache: the workdir keeps the first up's --no-kernel-cache (else the cache
    # steps would be created now, and the bucket started).
    run.kernel_cache = True
    again = ok(run("up", "--quiet", "--config", 'regions=["US-1", "CANADA-1"]'))
    assert "0 created" in again, again
    assert "kernel-store" not in run.record()["services"]
    placement = next(r for r in json.loads((run.workdir / "state.json").read_text())["resources"]
                     if r["type"].endswith("hyperstack:Placement"))
    assert placement["inputs"]["regions"] == ["US-1", "CANADA-1"] and placement["outputs"]["region"] == "NORWAY-1"
    assert emulator.vm_posts() == 4
    assert {e["region"] for e in emulator.inventory()["environments"]} == {"NORWAY-1"}

    ok(run("destroy", "--quiet"))
    assert emulator.inventory() == EMPTY
    report(f"regions: placed in NORWAY-1 and kept across a second up, {time.monotonic() - started:.1f} s")
