"""The fake-node fixtures every folder of the suite may use (registered in tests/conftest.py's pytest_plugins):
`node`, one fake node in a temporary directory, and `node_factory`, as many as a test makes."""

from __future__ import annotations

from pathlib import Path

import pytest

from kimi_cluster.fakes.node import FakeNode, make_fake_node


@pytest.fixture
def node(tmp_path: Path):
    n = make_fake_node(tmp_path)
    yield n
    n.cleanup()


@pytest.fixture
def node_factory(tmp_path: Path):
    made: list[FakeNode] = []

    def make(**faults) -> FakeNode:
        n = make_fake_node(tmp_path / f"n{len(made)}", **faults)
        made.append(n)
        return n

    yield make
    for n in made:
        n.cleanup()
