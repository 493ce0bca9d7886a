"""Issue 44's attacks on the caretaker, each run on loopback or in a temp dir: strangers rolling the proxy's access log
so that no request is counted, a malformed, endless or huge Hyperstack answer that kept every poll from deciding,
and a redirect that would carry the whole account's key elsewhere."""

from __future__ import annotations

import json
import socket
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kimi_cluster.blueprint.inputs import endpoint_inputs
from kimi_cluster.node import caretaker, caretaker_api
from kimi_cluster.node.caretaker_api import Api, ApiError
from kimi_cluster.settings.loader import load_settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGtpbWktY2x1c3Rlci10ZXN0LWtleS1ub3QtcmVhbCEh t"
SECRET = "kimi-endpoint-key-for-the-log-test"


def _post(line: str = "/v1/chat/completions", status: int = 200) -> str:
    return json.dumps({"request": {"method": "POST", "uri": line}, "status": status}) + "\n"


# ---- security 1: the access log -----------------------------------------------------------------------------------

def test_the_rest_of_a_rolled_log_is_counted(tmp_path):
    """Caddy rolls access.log into access-<time>.log (roll_uncompressed) and starts a new one: the requests written
    to the old file since the caretaker's last look used to be lost, as if nobody had used the cluster."""
    log = tmp_path / "access.log"
    log.write_text(_post())
    mark: dict[str, Any] = {}
    assert caretaker.new_requests(log, mark) == 1
    with open(log, "a") as fh:
        fh.write(_post() * 3 + _post(status=401))
    log.rename(tmp_path / "access-2026-12-04T18-50-00.000.log")
    log.write_text(_post())
    assert caretaker.new_requests(log, mark) == 4  # the old file's three, and the new one's
    assert caretaker.new_requests(log, mark) == 0


def test_a_log_rolled_twice_or_truncated_still_counts_what_it_can(tmp_path):
    log = tmp_path / "access.log"
    log.write_text(_post() * 2)
    mark: dict[str, Any] = {}
    assert caretaker.new_requests(log, mark) == 2
    log.unlink()  # gone, rolled and removed (roll_keep) before the next look
    log.write_text(_post())
    assert caretaker.new_requests(log, mark) == 1
    log.write_text("")  # truncated in place, then a shorter line than before
    with open(log, "a") as fh:
        fh.write(_post("/v1/x"))
    assert caretaker.new_requests(log, mark) == 1


def _caddyfile(directory: Path, api_port: int, engine_port: int) -> str:
    from kimi_cluster.plan import proxy

    (directory / "caretaker").mkdir(exist_ok=True)
    settings = load_settings({"operatorCidr": "81.2.69.1/32", "sshPublicKey": KEY, "topology": "b300x1-vllm",
                              "caretakerApiKey": "x" * 20, "idleStopMinutes": "30", "apiPort": str(api_port),
                              "enginePort": str(engine_port)}, "dev")
    return proxy.render_config(endpoint_inputs(settings)).replace(f"127.0.0.1:{settings.engine_port}",
                                                                  f"127.0.0.1:{engine_port}")


def test_strangers_cannot_fill_or_roll_the_log_the_caretaker_counts_in():
    """About 1,300 refused requests with 8 KB URIs rolled the 10 MiB log; done once a poll, no real request was
    ever counted and the idle stop deleted a cluster in use. The real proxy now logs only requests with the key."""
    from kimi_cluster.fakes.head import ProxiedEngine
    from kimi_cluster.fakes.inference_server import FakeSettings

    with ProxiedEngine(FakeSettings(engine="vllm"), api_key=SECRET, config=_caddyfile) as head:
        context = ssl.create_default_context(cafile=head.ca_file)
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}),
                                             urllib.request.HTTPSHandler(context=context))

        def send(path: str, key: str | None, method: str = "POST") -> int:
            headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
            body = json.dumps({"model": "moonshotai/Kimi-K3.1-Pro", "messages": [{"role": "user", "content": "hi"}],
                               "max_tokens": 4}).encode() if method == "POST" else None
            request = urllib.request.Request(head.url + path, data=body, headers=headers, method=method)
            try:
                with opener.open(request, timeout=20) as answer:
                    return int(answer.status)
            except urllib.error.HTTPError as err:
                return err.code

        long_uri = "/v1/chat/completions?" + "a" * 8000
        codes = {send(long_uri, None) for _ in range(60)} | {send(long_uri, "wrong-key-but-long-enough")}
        codes |= {send("/health", None, "GET")}
        assert codes == {401, 200}
        log = head.dir / "caretaker" / "access.log"
        assert not log.exists() or log.stat().st_size == 0, log.read_text()[:500]
        assert send("/v1/chat/completions", SECRET) == 200
        deadline = time.monotonic() + 20
        while not (log.exists() and log.stat().st_size) and time.monotonic() < deadline:
            time.sleep(0.05)  # Caddy writes the line once the answer is out
        assert caretaker.new_requests(log, {}) == 1


def test_a_log_the_real_proxy_rolled_is_counted_whole():
    """The real Caddy rolls at roll_size (1 MiB here, its smallest) into access-<time>.log beside the log, uncompressed;
    the caretaker, which looked once before the roll, counts every keyed request on both sides of it."""
    from kimi_cluster.fakes.head import ProxiedEngine
    from kimi_cluster.fakes.inference_server import FakeSettings

    def small_rolls(directory: Path, api_port: int, engine_port: int) -> str:
        text = _caddyfile(directory, api_port, engine_port)
        assert "roll_size 10MiB" in text
        return text.replace("roll_size 10MiB", "roll_size 1MiB")

    with ProxiedEngine(FakeSettings(engine="vllm"), api_key=SECRET, config=small_rolls) as head:
        context = ssl.create_default_context(cafile=head.ca_file)
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}),
                                             urllib.request.HTTPSHandler(context=context))
        body = json.dumps({"model": "moonshotai/Kimi-K3.1-Pro", "messages": [{"role": "user", "content": "hi"}],
                           "max_tokens": 1}).encode()

        def send(n: int) -> None:
            for _ in range(n):
                request = urllib.request.Request(head.url + "/v1/chat/completions?pad=" + "p" * 8000, data=body,
                                                 headers={"Content-Type": "application/json",
                                                          "Authorization": f"Bearer {SECRET}"})
                with opener.open(request, timeout=20) as answer:
                    assert answer.status == 200

        directory = head.dir / "caretaker"
        log = directory / "access.log"
        mark: dict[str, Any] = {}
        send(5)
        deadline = time.monotonic() + 20
        counted = 0
        while counted < 5 and time.monotonic() < deadline:
            counted += caretaker.new_requests(log, mark)
            time.sleep(0.05)
        assert counted == 5
        send(200)  # about 1.7 MB of log lines: past one roll
        deadline = time.monotonic() + 30
        while counted < 205 and time.monotonic() < deadline:
            counted += caretaker.new_requests(log, mark)
            time.sleep(0.1)
        rolled = sorted(p.name for p in directory.glob("access-*.log"))
        assert rolled, sorted(p.name for p in directory.iterdir())
        assert counted == 205, (counted, rolled)


# ---- security 2 and 4: the API calls ------------------------------------------------------------------------------

@pytest.fixture
def raw_server() -> Iterator[Callable[[Callable[[socket.socket, bytes], None]], str]]:
    """raw_server(answer) -> base URL of a loopback server that hands each connection and its request to `answer`."""
    servers: list[socket.socket] = []

    def start(answer: Callable[[socket.socket, bytes], None]) -> str:
        listener = socket.create_server(("127.0.0.1", 0))
        servers.append(listener)

        def serve() -> None:
            while True:
                try:
                    conn, _ = listener.accept()
                except OSError:
                    return
                request = b""
                while b"\r\n\r\n" not in request:
                    part = conn.recv(65536)
                    if not part:
                        break
                    request += part
                threading.Thread(target=_answer_and_close, args=(answer, conn, request), daemon=True).start()
        threading.Thread(target=serve, daemon=True).start()
        return f"http://127.0.0.1:{listener.getsockname()[1]}"

    yield start
    for listener in servers:
        listener.close()


def _answer_and_close(answer: Callable[[socket.socket, bytes], None], conn: socket.socket, request: bytes) -> None:
    try:
        answer(conn, request)
    except OSError:
        pass
    finally:
        conn.close()


MALFORMED = {
    "BadStatusLine": b"HTTP/1.1 two hundred OK\r\n\r\n",
    "IncompleteRead": b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n{\"a\":",
    "LineTooLong": b"HTTP/1.1 200 OK\r\nX-Long: " + b"x" * 70000 + b"\r\n\r\n{}",
}


@pytest.mark.parametrize("kind", sorted(MALFORMED))
def test_a_malformed_answer_neither_kills_the_poll_nor_keeps_the_idle_stop_from_being_decided(tmp_path, raw_server,
                                                                                             kind):
    """http.client's own errors were none of the three the spend read caught: every poll died before it decided,
    and the fallback meant for a failing billing read never ran."""
    url = raw_server(lambda conn, _: conn.sendall(MALFORMED[kind]))
    flags = tmp_path / "flags"
    flags.mkdir()
    (tmp_path / "key").write_text("k" * 20)
    cfg = {"env_name": "kimi-dev", "api_url": url, "gpu_vms": ["kimi-dev-node0"], "self_name": "kimi-dev-node0",
           "idle_seconds": 15 * 0.01, "budget_usd": 1000.0, "usd_per_hour": 59.2, "poll_seconds": 1,
           "minute_seconds": 0.01, "health_url": "http://127.0.0.1:9/health", "state_file": str(tmp_path / "s.json"),
           "key_file": str(tmp_path / "key"), "flag_dir": str(flags), "ca_file": str(tmp_path / "none")}
    config = tmp_path / "config.json"
    config.write_text(json.dumps(cfg))
    past = time.time() - 60
    (tmp_path / "s.json").write_text(json.dumps({"armed_at": past, "last_request_at": past, "served_since": past,
                                                 "requests": 0, "log": {}, "spend_usd": 1.0, "spend_at": past,
                                                 "spend_source": "billing history", "action": None,
                                                 "history": []}))
    assert caretaker.main(["--config", str(config), "--once"]) == 0
    state = json.loads((tmp_path / "s.json").read_text())
    assert state["spend_source"].startswith("estimated") and state["spend_usd"] > 1.0  # the fallback ran
    assert state["action"]["reason"] == "idle" and (flags / caretaker.STOPPED_FILE).exists()
    assert state["action"]["errors"] and "listing the VMs" in state["action"]["errors"][0]


def test_an_answer_that_trickles_in_ends_at_the_calls_deadline(raw_server, monkeypatch):
    """timeout=30 bounded each socket read, not the call: a byte every few seconds held a poll forever."""
    stop = threading.Event()

    def trickle(conn: socket.socket, _: bytes) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n[")
        while not stop.wait(0.05):
            conn.sendall(b"1,")

    url = raw_server(trickle)
    monkeypatch.setattr(caretaker_api, "API_DEADLINE_S", 1.0)
    started = time.monotonic()
    try:
        with pytest.raises(ApiError, match="no whole answer within 1 s"):
            Api(url, "k" * 20).call("GET", "/core/virtual-machines")
    finally:
        stop.set()
    assert time.monotonic() - started < 10


def test_an_answer_past_the_cap_is_refused_before_it_is_all_read(raw_server, monkeypatch):
    body = json.dumps({"instances": ["x" * 100] * 1000}).encode()
    url = raw_server(lambda conn, _: conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body))
    monkeypatch.setattr(caretaker_api, "API_READ_MAX", 10_000)
    with pytest.raises(ApiError, match="longer than 10,000 bytes"):
        Api(url, "k" * 20).call("GET", "/core/virtual-machines")


def test_a_redirect_is_an_api_error_and_the_key_goes_nowhere_else(raw_server):
    """urllib copied every header, api_key included, to the redirect's target, from https to plain http too."""
    seen: list[bytes] = []

    def elsewhere(conn: socket.socket, request: bytes) -> None:
        seen.append(request)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")

    target = raw_server(elsewhere)
    for code in (301, 302, 307, 308):
        url = raw_server(lambda conn, _, code=code: conn.sendall(
            b"HTTP/1.1 %d Moved\r\nLocation: %s/steal\r\nContent-Length: 0\r\n\r\n" % (code, target.encode())))
        with pytest.raises(ApiError, match="never follows") as caught:
            Api(url, "the-whole-accounts-key").call("GET", "/core/virtual-machines")
        assert caught.value.status == code
    assert seen == []
