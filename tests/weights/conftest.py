"""Fixtures shared with the node tests: a fake node in a temporary directory."""

from tests.node.conftest import node  # noqa: F401 - a fixture: imported so pytest finds it for these tests
