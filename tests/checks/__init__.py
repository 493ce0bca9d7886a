"""Tests of the post-deploy verification: checks, CLI, fake inference server, client configs and
the verification stack (issue 5)."""
