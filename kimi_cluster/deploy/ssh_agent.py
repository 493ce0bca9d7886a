"""The operator's SSH agent socket: a dead SSH_AUTH_SOCK fails every node step, so it is refused up front.

pulumi-command dials the agent named by SSH_AUTH_SOCK on the machine that runs `pulumi up` when it is set, and a
socket nobody listens on fails every remote command at once, before its dial retries (provider/pkg/provider/remote/
connection_unix.go in pulumi/pulumi-command). That happens after the VMs exist and bill, so the program refuses to
start instead (see the README, "Real use").
"""

from __future__ import annotations

import socket
from collections.abc import Mapping

_CONNECT_TIMEOUT_S = 2.0


def dead_agent_socket(environ: Mapping[str, str]) -> str | None:
    """Why SSH_AUTH_SOCK is unusable (set, but nothing accepts a connection on it), or None if unset or alive."""
    path = environ.get("SSH_AUTH_SOCK")
    if not path:
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(_CONNECT_TIMEOUT_S)
    try:
        sock.connect(path)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        return (f"SSH_AUTH_SOCK={path} is set but no SSH agent answers there ({reason}); pulumi-command would fail "
                "every node step at once, after the VMs are billed. Unset it (unset SSH_AUTH_SOCK: the key comes "
                "from kimi-cluster:sshPrivateKey) or start the agent again (eval \"$(ssh-agent)\")")
    finally:
        sock.close()
    return None
