"""A dead SSH_AUTH_SOCK is refused before anything is billed; a live agent or none at all passes."""

from __future__ import annotations

import socket
from pathlib import Path

import pulumi
import pytest

from kimi_cluster.deploy.ssh_agent import dead_agent_socket
from tests.deploy.test_program import config, outputs_for
from tests.pulumi_harness import Recording, run_program


def test_no_agent_socket_is_fine() -> None:
    assert dead_agent_socket({}) is None
    assert dead_agent_socket({"SSH_AUTH_SOCK": ""}) is None


def test_a_live_agent_socket_is_fine(tmp_path: Path) -> None:
    path = tmp_path / "agent.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(path))
        server.listen(1)
        assert dead_agent_socket({"SSH_AUTH_SOCK": str(path)}) is None


def test_a_socket_nobody_listens_on_is_dead(tmp_path: Path) -> None:
    gone = tmp_path / "ssh-XXXX" / "agent.123"  # the agent's directory went with its session
    problem = dead_agent_socket({"SSH_AUTH_SOCK": str(gone)})
    assert problem is not None and str(gone) in problem and "unset SSH_AUTH_SOCK" in problem
    stale = tmp_path / "stale.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(stale))  # the file is still there, but the agent has exited
    assert "Connection refused" in (dead_agent_socket({"SSH_AUTH_SOCK": str(stale)}) or "")


def test_the_program_refuses_a_dead_agent_before_registering_anything(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("SSH_AUTH_SOCK", str(tmp_path / "no-agent-here"))
    cfg, secret = config()
    recording = Recording()
    # pulumi.RunError: the language host prints its message alone, without a traceback.
    with pytest.raises(pulumi.RunError, match="SSH_AUTH_SOCK=.* is set but no SSH agent answers there"):
        run_program(cfg, secret, outputs_for, recording=recording)
    assert recording.resources == []
