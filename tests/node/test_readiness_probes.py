"""The readiness wait also proves the proxy refuses an empty bearer over HTTP/2: what a missing or emptied key
file would let through if the proxy's matcher were the key's content alone."""

from __future__ import annotations

from tests.node.test_steps_on_fake_node import (  # noqa: F401 - proxy_server is a fixture: imported for pytest
    API_KEY,
    _Engine,
    _readiness,
    _running_container,
    _trust,
    failed,
    needs_curl,
    ok,
    proxy_server,
)


class _EmptyBearerOpens(_Engine):
    """A proxy that fails open: an `Authorization: Bearer` with nothing after it passes, as with an empty key file."""

    def do_GET(self):
        if self.path == "/v1/models" and self.headers.get("Authorization", "").strip() == "Bearer":
            self.headers.replace_header("Authorization", f"Bearer {self.key}")
        _Engine.do_GET(self)


@needs_curl
def test_readiness_fails_when_an_empty_bearer_is_let_through(node, proxy_server):  # noqa: F811 - the fixture
    _running_container(node)
    server, ca = proxy_server(do_GET=_EmptyBearerOpens.do_GET)
    _trust(node, ca)
    failed(node.run(_readiness(node, server.server_address[1]), stdin=API_KEY),
           "answers /v1/models with an empty bearer over HTTP/2 with HTTP 200, not 401")


@needs_curl
def test_readiness_passes_a_proxy_that_refuses_the_empty_bearer(node, proxy_server):  # noqa: F811 - the fixture
    _running_container(node)
    server, ca = proxy_server()
    _trust(node, ca)
    out = ok(node.run(_readiness(node, server.server_address[1]), stdin=API_KEY))
    assert "and to an empty bearer" in out
