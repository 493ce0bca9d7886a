"""Tests of kimi_cluster.deploy.hyperstack (client, providers, resources) and of the Hyperstack API emulator.

Everything runs against loopback servers the tests start; nothing reaches the real API.
"""
