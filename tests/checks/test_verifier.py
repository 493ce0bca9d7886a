"""Tests of kimi_cluster/checks/ against the fake server: both good shapes pass, each broken
variant fails and names the check that caught it, and nothing ever prints or stores the key.
"""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from kimi_cluster import checks as v
from tests.checks.conftest import KEY, MODEL

pytestmark = pytest.mark.integration  # starts fake nodes, servers or outside tools

ALL = set(v.CHECK_NAMES)
GENERATION = ALL - {"models", "auth", "tls"}

# The checks each fault must fail, and no others.
EXPECTED_FAILURES = {
    "no_auth": {"auth"},
    "no_reasoning": {"chat"},
    "bad_tool_args": {"tool_calls", "clients"},
    "wrong_model": ALL - {"auth", "tls"},
    "drop_reasoning": {"preserved_thinking", "tool_calls", "clients"},
    "no_image": {"image"},
    "server_error": GENERATION,
}


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_both_good_shapes_pass_every_check(fake, session, engine):
    # The engines leave /metrics (and vLLM /invocations and /tokenize) open: a good endpoint is one behind the proxy.
    with fake(engine=engine) as server:
        outcome = v.verify(server.url, MODEL, KEY, ca_certificate=server.ca_certificate, timeout=5, session=session)
    assert [r.name for r in outcome.results] == list(v.CHECK_NAMES)
    assert outcome.verified and outcome.all_passed, [r.line() for r in outcome.failed]
    by_name = {r.name: r for r in outcome.results}
    assert by_name["models"].metrics["max_model_len"] == 1048576
    assert by_name["models"].metrics["owned_by"] == engine
    expected_field = "reasoning_content" if engine == "sglang" else "reasoning"
    assert by_name["chat"].metrics["reasoning_field"] == expected_field
    effort = by_name["effort"].metrics
    assert effort["max_completion_tokens"] > effort["low_completion_tokens"] > 0
    stream = by_name["stream"].metrics
    assert stream["ttft_s"] >= 0 and stream["tokens_per_s"] > 0 and stream["chunks"] > 3
    assert by_name["tool_calls"].metrics["tool_calls"] == ["calculate", "get_weather"]


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
@pytest.mark.parametrize("fault", sorted(EXPECTED_FAILURES))
def test_each_broken_variant_fails_naming_its_check(fake, session, engine, fault):
    with fake(engine=engine, faults=[fault]) as server:
        outcome = v.verify(server.url, MODEL, KEY, ca_certificate=server.ca_certificate, timeout=5, session=session)
    failed = {r.name for r in outcome.failed}
    assert failed == EXPECTED_FAILURES[fault], [r.line() for r in outcome.results]
    assert not outcome.verified
    for result in outcome.failed:
        assert result.detail and KEY not in result.detail


def test_slow_server_fails_within_the_timeout(fake, session):
    # The server sleeps a minute before every generation answer (woken when it stops): a check that waited for one
    # would take that minute. The generation checks get 0.3 s and must all fail at it; the checks that ask nothing of
    # generation get the 5 s the other tests here give (at 0.3 s, a loaded machine's TLS handshake failed 'auth').
    sleep_s = 60
    with fake(faults=["slow"], slow_seconds=sleep_s) as server:
        started = time.monotonic()
        outcome = v.verify(server.url, MODEL, KEY, only=GENERATION, ca_certificate=server.ca_certificate,
                           timeout=0.3, session=session)
        elapsed = time.monotonic() - started
        rest = v.verify(server.url, MODEL, KEY, only=ALL - GENERATION, ca_certificate=server.ca_certificate,
                        timeout=5, session=session)
    assert {r.name for r in outcome.failed} == GENERATION and rest.all_passed, [r.line() for r in rest.failed]
    assert elapsed < sleep_s, f"the verifier waited {elapsed:.1f}s on a server that sleeps {sleep_s}s"
    # Each ended at its own deadline (the client library's read timeout, for the clients check), not at an answer.
    assert all(r.latency_s < sleep_s and ("within the 0.3s timeout" in r.detail or "timed out" in r.detail)
               for r in outcome.results), [r.line() for r in outcome.results]
    chat = next(r for r in outcome.results if r.name == "chat")
    assert "within the 0.3s timeout" in chat.detail


def test_specific_reasons(fake, session):
    with fake(faults=["no_reasoning", "bad_tool_args", "no_auth"]) as server:
        target = v.Target(server.url, MODEL, KEY, 5, server.ca_certificate)
        results = {r.name: r for r in v.run_checks(target, session=session)}
    assert "--reasoning-parser" in results["chat"].detail
    assert "not JSON" in results["tool_calls"].detail and "calculate" in results["tool_calls"].detail
    assert "not protected" in results["auth"].detail
    assert results["auth"].metrics["statuses"]["GET /v1/models without a key"] == 200


def test_auth_needs_a_key_to_prove_anything(fake, session):
    with fake() as server:
        result = v.run_check("auth", v.Target(server.url, MODEL, None, 5, server.ca_certificate), session)
    assert not result.passed and "no API key" in result.detail


def test_unreachable_endpoint_fails_every_check_without_raising(session):
    # port 9 (discard) on loopback: nothing listens there in the test environment
    results = v.run_checks(v.Target("https://127.0.0.1:9", MODEL, KEY, 1), session=session)
    assert [r.passed for r in results] == [False] * len(v.CHECK_NAMES)
    assert all("could not connect" in r.detail for r in results)


def test_a_check_that_raises_is_a_failure_not_a_crash(monkeypatch, fake, session):
    def boom(api):
        raise RuntimeError("unexpected shape")

    monkeypatch.setitem(v.CHECKS, "chat", boom)
    with fake() as server:
        target = v.Target(server.url, MODEL, KEY, 5, server.ca_certificate)
        results = v.run_checks(target, only="models,chat", session=session)
    assert [(r.name, r.passed) for r in results] == [("models", True), ("chat", False)]
    assert results[1].detail == "check raised RuntimeError: unexpected shape"


class _EchoKeyHandler(BaseHTTPRequestHandler):
    """A careless server that echoes the Authorization header into its errors."""

    def do_GET(self):
        body = json.dumps({"error": "bad request from " + self.headers.get("Authorization", "")}).encode()
        self.send_response(400)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_key_echoed_by_a_server_is_redacted(session):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _EchoKeyHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        result = v.run_check("models", v.Target(f"http://127.0.0.1:{server.server_address[1]}", MODEL, KEY, 5), session)
    finally:
        server.shutdown()
        server.server_close()
    assert not result.passed
    assert KEY not in result.detail and "***" in result.detail


def test_models_lists_exactly_the_expected_id(fake, session):
    with fake(served_model_names=(MODEL, "other/model")) as server:
        result = v.run_check("models", v.Target(server.url, MODEL, KEY, 5, server.ca_certificate), session)
    assert not result.passed and "expected exactly" in result.detail


def test_required_subset_decides_verified(fake, session):
    with fake(faults=["no_image"]) as server:
        outcome = v.verify(server.url, MODEL, KEY, ca_certificate=server.ca_certificate, required="models,auth,chat",
                           timeout=5, session=session)
    assert outcome.verified and not outcome.all_passed
    assert [r.name for r in outcome.failed] == ["image"]
    assert {row["name"]: row["required"] for row in outcome.report()}["image"] is False


def test_run_stack_checks_raises_naming_failed_required_checks(fake, session):
    with fake(faults=["no_auth"]) as server:
        with pytest.raises(v.VerificationFailed) as caught:
            v.run_stack_checks(server.url, MODEL, KEY, ca_certificate=server.ca_certificate, only="models,auth",
                               timeout_seconds=5, session=session)
    message = str(caught.value)
    assert "required checks failed: auth" in message and "not protected" in message
    assert KEY not in message


def test_run_stack_checks_outputs(fake, session):
    with fake(engine="vllm", proxied=True) as server:
        outs = v.run_stack_checks(server.url + "/v1", MODEL, KEY, ca_certificate=server.ca_certificate,
                                  model_revision="r1", run_id="7", only=["auth", "models"], timeout_seconds=5,
                                  session=session)
    assert outs["verified"] is True and outs["verified_endpoint_url"] == server.url + "/v1"
    assert outs["only"] == ["models", "auth"] and outs["required_checks"] == ["models", "auth"]
    assert [row["name"] for row in outs["report"]] == ["models", "auth"]
    assert KEY not in json.dumps(outs)


def test_select_checks_and_targets():
    assert v.select_checks(None) == v.CHECK_NAMES
    assert v.select_checks("stream, models") == ("models", "stream")
    with pytest.raises(ValueError, match="unknown check"):
        v.select_checks("models,telepathy")
    with pytest.raises(ValueError, match="required checks"):
        v.verify("http://127.0.0.1:9", MODEL, KEY, only="models", required="auth")
    assert v.normalize_base_url("http://1.2.3.4:8000/v1/") == "http://1.2.3.4:8000"
    with pytest.raises(ValueError):
        v.normalize_base_url("1.2.3.4:8000")
    assert KEY not in repr(v.Target("http://h:1", MODEL, KEY))


def test_safe_arithmetic_evaluates_numbers_only():
    assert v.safe_arithmetic("47*89") == 4183
    assert v.safe_arithmetic("-(2+3)**2 / 5") == -5.0
    for hostile in ("__import__('os').system('true')", "open('/etc/passwd')", "9**9**9", "a+1", "True+1"):
        with pytest.raises(ValueError):
            v.safe_arithmetic(hostile)


def test_assistant_turn_keeps_reasoning_and_tool_calls():
    message = {"content": None, "reasoning": "plan", "tool_calls": [{"id": "x"}], "finish_reason": "tool_calls"}
    assert v.assistant_turn(message) == {"role": "assistant", "content": "", "reasoning": "plan",
                                         "tool_calls": [{"id": "x"}]}
