"""Issue 44: bridges of earlier fabrics stayed on the machine with no namespace and no workdir left (a workdir removed
by hand, a test's temporary directory cleaned). Every fabric is registered when it is made; the next allocate() tears
down each one whose nodes' directory is gone, and only those."""

from __future__ import annotations

import shutil

import pytest

from kimi_cluster.fakes.node_fabric import Fabric, allocate, missing

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(bool(missing()), reason="the fake nodes' network needs root and ip/nft")]


def test_a_fabric_whose_workdir_is_gone_is_torn_down_by_the_next_allocate(tmp_path):
    gone, kept = tmp_path / "gone" / "nodes", tmp_path / "kept" / "nodes"
    gone.mkdir(parents=True)
    kept.mkdir(parents=True)
    orphan = allocate(gone)
    other = allocate(kept)
    try:
        assert Fabric(orphan).bridge_up() and Fabric(other).bridge_up()
        shutil.rmtree(tmp_path / "gone")
        third = allocate(kept)
        try:
            assert not Fabric(orphan).bridge_up(), f"the orphaned bridge {orphan.bridge} is still up"
            assert Fabric(other).bridge_up(), "a fabric whose workdir exists was torn down"
        finally:
            Fabric(third).teardown()
    finally:
        Fabric(other).teardown()
        Fabric(orphan).teardown()


def test_a_fabric_made_before_its_nodes_directory_is_no_orphan(tmp_path):
    # The sandbox makes its network before any node boots: another process's allocate() in between (a parallel flow)
    # once took it for an orphan and tore its bridge down mid-up.
    fresh = tmp_path / "work" / "nodes"
    made = allocate(fresh)
    try:
        assert fresh.is_dir()
        other = allocate(tmp_path / "other" / "nodes")
        Fabric(other).teardown()
        assert Fabric(made).bridge_up(), f"the bridge {made.bridge} of a fabric being set up was torn down"
    finally:
        Fabric(made).teardown()
