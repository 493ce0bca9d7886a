"""Tests of kimi_cluster.deploy.hyperstack_providers (client, providers, resources) and of the Hyperstack API emulator.

Everything runs against loopback servers the tests start; nothing reaches the real API.
"""
