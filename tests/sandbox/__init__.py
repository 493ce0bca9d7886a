"""Tests of the local sandbox: scripts.sandbox up | verify | destroy end to end."""
