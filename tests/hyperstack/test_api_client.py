"""Tests of the requests client: error mapping, 429 backoff, which methods retry 5xx, credential handling.

Runs against the emulator, or a scripted loopback server for answers the emulator never gives.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from kimi_cluster.fakes.hyperstack_emulator.emulator import DEFAULT_API_KEY
from kimi_cluster.fakes.hyperstack_emulator.faults import RateLimit, ServerError
from kimi_cluster.hyperstack_api import api
from kimi_cluster.hyperstack_api.api import ApiSettings, HyperstackClient, HyperstackError

pytestmark = pytest.mark.timeout(20)


def make_client(url: str, key: str = DEFAULT_API_KEY, **kw) -> HyperstackClient:
    kw.setdefault("retry_base_seconds", 0.01)
    return HyperstackClient(url, key, **kw)


class Scripted:
    """A loopback server answering from a list of (status, body, delay) and counting requests."""

    def __init__(self, answers: list[tuple[int, object, float]]) -> None:
        self.answers = answers
        self.seen: list[tuple[str, str, dict]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                outer.seen.append((self.command, self.path, dict(self.headers)))
                status, body, delay = outer.answers[min(len(outer.seen), len(outer.answers)) - 1]
                time.sleep(delay)
                data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = do_PUT = _serve

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def scripted() -> Iterator[Callable[..., Scripted]]:
    servers: list[Scripted] = []

    def start(*answers: tuple[int, object, float]) -> Scripted:
        servers.append(Scripted(list(answers)))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def test_status_false_on_http_200_is_an_error(scripted):
    server = scripted((200, {"status": False, "message": "Insufficient balance to create the resource",
                             "error_reason": "bad_request"}, 0))
    with pytest.raises(HyperstackError) as info:
        make_client(server.url).create_environment("e", "CANADA-1")
    err = info.value
    assert (err.status, err.error_reason, err.method, err.path) == (200, "bad_request", "POST", "/core/environments")
    assert "Insufficient balance" in str(err) and "POST /core/environments" in str(err)


def test_missing_error_reason_is_read_as_bad_request(scripted):
    server = scripted((400, {"message": "name: field required"}, 0))
    with pytest.raises(HyperstackError) as info:
        make_client(server.url).create_environment("e", "CANADA-1")
    assert info.value.error_reason == "bad_request" and info.value.status == 400
    assert not info.value.outcome_unknown


def test_the_key_goes_in_the_api_key_header(scripted):
    server = scripted((200, {"status": True, "regions": []}, 0))
    make_client(server.url, key="k-123").list_regions()
    headers = {k.lower(): v for k, v in server.seen[0][2].items()}
    assert headers["api_key"] == "k-123" and "authorization" not in headers


def test_429_storm_backs_off_five_tries_then_fails_clearly(emu):
    emu.inject(RateLimit(count=100))
    sleeps: list[float] = []
    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        time.sleep(seconds)

    client = make_client(emu.base_url, retry_base_seconds=0.01, sleep=sleep)
    started = time.monotonic()
    with pytest.raises(HyperstackError) as info:
        client.list_regions()
    assert len(emu.calls("GET", "/core/regions")) == 5
    assert sleeps == pytest.approx([0.01, 0.02, 0.04, 0.08])
    assert time.monotonic() - started >= 0.15
    assert info.value.status == 429 and "after 5 tries" in str(info.value)


def test_429_burst_is_absorbed_for_posts_too(emu):
    emu.inject(RateLimit(count=2, method="POST"))
    env = make_client(emu.base_url).create_environment("burst", "CANADA-1")
    assert env["name"] == "burst"
    assert [r.status for r in emu.calls("POST")] == [429, 429, 200]


def test_5xx_is_retried_on_get_and_delete(emu):
    client = make_client(emu.base_url)
    env = client.create_environment("retry", "CANADA-1")
    emu.inject(ServerError(count=2, method="GET"), ServerError(count=1, status=503, method="DELETE"))
    assert [e["name"] for e in client.list_environments()] == ["retry"]
    client.delete_environment(env["id"])
    assert [r.status for r in emu.calls("GET")] == [500, 500, 200]
    assert [r.status for r in emu.calls("DELETE")] == [503, 200]


def test_5xx_is_not_retried_on_post(emu):
    emu.inject(ServerError(count=1, method="POST"))
    with pytest.raises(HyperstackError) as info:
        make_client(emu.base_url).create_environment("once", "CANADA-1")
    assert info.value.status == 500 and info.value.outcome_unknown
    assert len(emu.calls("POST")) == 1


def test_5xx_retries_are_bounded(emu):
    emu.inject(ServerError(count=50, method="GET"))
    with pytest.raises(HyperstackError) as info:
        make_client(emu.base_url, server_error_retries=2).list_regions()
    assert info.value.status == 500 and len(emu.calls("GET")) == 3


def test_post_timeout_is_reported_once_and_marked_unknown(scripted):
    server = scripted((200, {"status": True, "environment": {"id": 1}}, 1.0))
    with pytest.raises(HyperstackError) as info:
        make_client(server.url, timeout=(1.0, 0.2)).create_environment("slow", "CANADA-1")
    assert info.value.error_reason == "timeout" and info.value.outcome_unknown
    assert len(server.seen) == 1


def test_connection_refused_is_one_error_type():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(HyperstackError) as info:
        make_client(f"http://127.0.0.1:{port}/v1", server_error_retries=1).list_regions()
    assert info.value.status is None and info.value.error_reason == "connection_error"


def test_401_message_names_the_settings_but_never_the_key(emu):
    secret = "sk-live-should-never-be-printed"
    with pytest.raises(HyperstackError) as info:
        make_client(emu.base_url, key=secret).list_regions()
    err = info.value
    assert err.status == 401 and err.error_reason == "unauthorized"
    text = " ".join([str(err), repr(err), err.message, repr(err.args)])
    assert secret not in text
    assert "hyperstack:apiKey" in text and "HYPERSTACK_API_KEY" in text


def test_an_echoed_key_is_redacted(scripted):
    secret = "sk-echoed-by-a-proxy"
    server = scripted((403, {"status": False, "message": f"key {secret} lacks permission"}, 0))
    with pytest.raises(HyperstackError) as info:
        make_client(server.url, key=secret).list_regions()
    assert secret not in str(info.value) and "***" in str(info.value)


def test_missing_key_fails_before_any_request_naming_both_ways(monkeypatch):
    with pytest.raises(HyperstackError) as info:
        ApiSettings.resolve({api.API_URL_CONFIG: "http://127.0.0.1:9/v1"})
    assert "hyperstack:apiKey" in str(info.value) and "HYPERSTACK_API_KEY" in str(info.value)


def test_settings_key_from_environment_first_url_from_stack_config_first(monkeypatch):
    monkeypatch.setenv("HYPERSTACK_API_KEY", "from-env")
    monkeypatch.setenv("HYPERSTACK_API_URL", "http://127.0.0.1:1/v1/")
    from_env = ApiSettings.resolve({})
    assert (from_env.api_key, from_env.api_url) == ("from-env", "http://127.0.0.1:1/v1")
    assert "from-env" not in repr(from_env)
    both = ApiSettings.resolve({"hyperstack:apiKey": "from-config", "hyperstack:apiUrl": "http://127.0.0.1:2/v1"})
    assert (both.api_key, both.api_url) == ("from-env", "http://127.0.0.1:2/v1")
    monkeypatch.delenv("HYPERSTACK_API_KEY")
    assert ApiSettings.resolve({"hyperstack:apiKey": "from-config"}).api_key == "from-config"
    monkeypatch.delenv("HYPERSTACK_API_URL")
    assert ApiSettings.resolve({"hyperstack:apiKey": "k"}).api_url == api.DEFAULT_API_URL


def test_lists_follow_pages(emu, monkeypatch):
    monkeypatch.setattr(api, "_PAGE_SIZE", 3)
    client = make_client(emu.base_url)
    for i in range(7):
        client.create_environment(f"paged-{i}", "CANADA-1")
    assert sorted(e["name"] for e in client.list_environments()) == [f"paged-{i}" for i in range(7)]
    assert [r.query["page"] for r in emu.calls("GET", "/core/environments")] == [["1"], ["2"], ["3"]]


def test_vm_list_pages_past_the_api_default_of_ten(emu):
    client = make_client(emu.base_url)
    client.create_environment("many", "CANADA-1")
    from tests.hyperstack.conftest import FLAVOR, IMAGE, PUBLIC_KEY
    client.import_keypair("k", "many", PUBLIC_KEY)
    for i in range(12):
        client.create_vm(name=f"vm-{i}", environment_name="many", flavor_name=FLAVOR, image_name=IMAGE,
                         key_name="k")
    assert len(client.list_vms(environment="many")) == 12
