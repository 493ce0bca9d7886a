"""Regions in the sandbox, as a user runs it: the first listed region is out of stock, so the cluster lands in the
second, through a storm of 429s on the VM creates that the providers' retries ride out; a later `up` with the stock
back and another list keeps it where it is and touches nothing.
"""

from __future__ import annotations

import re
import time

import pytest

from .conftest import ok, report

pytestmark = [pytest.mark.flow, pytest.mark.timeout(420)]

FLAVOR = "n3-H100x8-NVLink"
STORM = 6  # the next six VM creates answer 429 (Hyperstack: 500 requests per minute per IP)


def test_placed_in_the_second_region_through_a_429_storm_and_kept_there(sandbox) -> None:
    run = sandbox(emulator_args=f"--capacity CANADA-1:{FLAVOR}=3 "  # the cluster needs four
                                f"--fault rate-limit:{STORM}:POST:/core/virtual-machines")
    started = time.monotonic()
    first = run("up", "--config", 'regions=["CANADA-1", "NORWAY-1"]')
    out = ok(first)
    assert re.search(r"^  region +NORWAY-1$", out, re.M), out
    emulator = run.emulator()
    inventory = emulator.inventory()
    assert {e["region"] for e in inventory["environments"]} == {"NORWAY-1"}
    assert len(inventory["virtual_machines"]) == 4
    posts = [r for r in emulator.requests() if r["method"] == "POST" and r["path"] == "/core/virtual-machines"]
    assert [r["status"] for r in posts].count(429) == STORM and [r["status"] for r in posts].count(200) == 4, posts
    assert "HTTP 429 (rate limited), retrying in" in out, out

    # Stock comes back in CANADA-1 and runs out in NORWAY-1; the list changes and no longer names NORWAY-1.
    emulator.set_capacity("CANADA-1", FLAVOR, 16)
    emulator.set_capacity("NORWAY-1", FLAVOR, 0)
    # This up passes no --[no-]kernel-cache: the workdir keeps the first up's --no-kernel-cache (else the cache
    # steps would be created now, and the bucket started).
    run.kernel_cache = True
    again = ok(run("up", "--quiet", "--config", 'regions=["US-1", "CANADA-1"]'))
    assert re.search(r"; 0 created, \d+ unchanged", again), again
    assert "kernel-store" not in run.record()["services"]
    placement = run.resource("kimi-placement")
    assert placement["inputs"]["regions"] == ["US-1", "CANADA-1"] and placement["outputs"]["region"] == "NORWAY-1"
    assert emulator.vm_posts() == 4 + STORM
    assert {e["region"] for e in emulator.inventory()["environments"]} == {"NORWAY-1"}

    destroy = ok(run("destroy", "--quiet"))
    assert "emulator: nothing left" in destroy, destroy
    report(f"regions: placed in NORWAY-1 through {STORM} 429s, kept across a second up, up {first.seconds:.1f} s, "
           f"whole test {time.monotonic() - started:.1f} s")
