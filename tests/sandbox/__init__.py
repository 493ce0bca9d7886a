"""Tests of the local sandbox: kimi_cluster.cli.sandbox up | verify | destroy end to end."""
