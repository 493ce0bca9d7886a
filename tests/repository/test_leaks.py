"""The suite's guard against server threads that outlive their server (tests/leaks.py), and the fake hub that once
left one behind in every test that started it twice."""

from __future__ import annotations

import http.server
import threading
import time

import pytest

from kimi_cluster.fakes.hub import FakeHub
from tests import leaks


def test_a_second_serve_forever_outlives_shutdown_and_the_guard_names_it():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threads = [threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
               for _ in range(2)]
    for thread in threads:
        thread.start()
    time.sleep(0.2)
    server.shutdown()
    server.server_close()
    try:
        assert len(leaks.spinning_servers()) == 1, "shutdown() ended both loops: the guard tests nothing"
    finally:
        # Ends the loop that is left: it checks the flag on its next (immediate) poll.
        vars(server)["_BaseServer__shutdown_request"] = True  # the stdlib's private flag, name-mangled
        for thread in threads:
            thread.join(5)
    assert leaks.spinning_servers() == []


def test_the_fake_hub_refuses_a_second_start():
    with FakeHub("org/model", "0" * 40) as hub:
        with pytest.raises(RuntimeError, match="already started"):
            hub.start()
    assert leaks.spinning_servers() == []
