"""Server threads that outlive their server.

`socketserver.BaseServer.shutdown()` ends one `serve_forever` loop. A second loop on the same server (a server
started twice) goes on after `server_close()`, polling a closed socket that is always "ready": it spins at full
speed for the rest of the process, which under xdist is the rest of the suite on that worker.
"""

from __future__ import annotations

import threading


def spinning_servers() -> list[str]:
    """Names of live threads running serve_forever on a server whose listening socket is closed."""
    found = []
    for thread in threading.enumerate():
        target = getattr(thread, "_target", None)  # Thread keeps its target until the target returns
        server = getattr(target, "__self__", None)
        if getattr(target, "__name__", "") != "serve_forever" or server is None:
            continue
        sock = getattr(server, "socket", None)
        if sock is not None and sock.fileno() == -1:
            found.append(f"{thread.name} ({type(server).__name__})")
    return found
