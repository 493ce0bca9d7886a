"""Tests of the fake inference server (kimi_cluster/fakes/inference/): its answers come from the request (pixels,
tool results, prior reasoning), it enforces the key like SGLang/vLLM, and it accepts the real engines' flags.
"""

import base64
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from kimi_cluster.checks import make_split_png
from kimi_cluster.fakes.inference.cli import settings_from_args
from kimi_cluster.fakes.inference.png import colour_name, half_colours
from kimi_cluster.fakes.inference.settings import FakeSettings
from tests.checks.conftest import KEY, MODEL, REPO

pytestmark = pytest.mark.integration  # starts fake nodes, servers or outside tools


def _post(session, server, path, body, key=KEY, headers=None):
    all_headers = {"Authorization": f"Bearer {key}"} if key else {}
    all_headers.update(headers or {})
    return session.post(server.url + path, json=body, headers=all_headers, timeout=5)


@pytest.mark.parametrize(
    "left,right",
    [((255, 0, 0), (0, 0, 255)), ((0, 255, 0), (255, 255, 0)), ((255, 255, 255), (0, 0, 0))],
)
def test_image_colours_come_from_the_pixels(fake, session, left, right):
    png = base64.b64encode(make_split_png(left, right, 32, 16)).decode()
    with fake() as server:
        resp = _post(session, server, "/v1/chat/completions", {
            "model": MODEL,
            "messages": [{"role": "user", "content": [
                {"type": "text", "text": "What do you see?"},
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}"}},
            ]}],
        })
    content = resp.json()["choices"][0]["message"]["content"]
    names = [colour_name(left), colour_name(right)]
    assert f"left half is {names[0]}" in content and f"right half is {names[1]}" in content


def _image_question(url):
    return {"model": MODEL, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "What do you see?"}, {"type": "image_url", "image_url": {"url": url}}]}]}


def test_an_image_url_is_fetched_from_loopback_and_answered_as_vllm_answers_a_failed_fetch(fake, session):
    """vLLM 0.33.0 (vllm/multimodal/media/connector.py): an origin's 404 is a 422 naming the URL's failure, a URL
    nothing answers a 500 (raised as it is, answered by the last-resort handler); a host off loopback is never asked."""
    png = make_split_png((255, 0, 0), (0, 0, 255), 32, 16)
    asked = []

    class Origin(BaseHTTPRequestHandler):
        def do_GET(self):
            asked.append(self.path)
            found = self.path == "/split.png"
            self.send_response(200 if found else 404)
            self.send_header("Content-Length", str(len(png) if found else 0))
            self.end_headers()
            self.wfile.write(png if found else b"")

        def log_message(self, *_):
            pass

    origin = ThreadingHTTPServer(("127.0.0.1", 0), Origin)
    threading.Thread(target=origin.serve_forever, daemon=True).start()
    refused = socket.socket()
    refused.bind(("127.0.0.1", 0))  # bound, never listening: a connection to it is refused
    base = f"http://127.0.0.1:{origin.server_address[1]}"
    try:
        with fake(engine="vllm") as server:
            seen = _post(session, server, "/v1/chat/completions", _image_question(f"{base}/split.png"))
            missing = _post(session, server, "/v1/chat/completions", _image_question(f"{base}/gone.png"))
            down = _post(session, server, "/v1/chat/completions",
                         _image_question(f"http://127.0.0.1:{refused.getsockname()[1]}/x.png"))
            outside = _post(session, server, "/v1/chat/completions", _image_question("http://192.0.2.1/x.png"))
    finally:
        origin.shutdown()
        refused.close()
    assert "left half is red" in seen.json()["choices"][0]["message"]["content"]
    assert missing.status_code == 422 and "HTTP 404 error" in missing.json()["message"]
    assert down.status_code == 500 and down.json()["type"] == "InternalServerError"
    assert "Cannot connect to host 127.0.0.1" in down.json()["message"]
    assert outside.status_code == 500 and "loopback only" in outside.json()["message"]
    assert asked == ["/split.png", "/gone.png"]


def test_png_decoder_handles_filtered_rows():
    # rows with the Sub filter (type 1): each byte stores the difference to the pixel on its left
    width, height = 4, 2
    row = bytearray([1])
    previous = (0, 0, 0)
    for x in range(width):
        pixel = (200, 10, 10) if x < 2 else (10, 10, 200)
        row += bytes((p - q) & 0xFF for p, q in zip(pixel, previous, strict=True))
        previous = pixel
    import struct
    import zlib

    def chunk(tag, data):
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(bytes(row) * height)) + chunk(b"IEND", b""))
    assert half_colours(png) == ("red", "blue")


def test_key_is_enforced_bearer_only(fake, session):
    with fake() as server:
        assert session.get(server.url + "/health", timeout=5).status_code == 200
        assert session.get(server.url + "/v1/models", timeout=5).status_code == 401
        ok = session.get(server.url + "/v1/models", headers={"Authorization": f"Bearer {KEY}"}, timeout=5)
        assert ok.status_code == 200
        body = {"model": MODEL, "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
        # like SGLang and vLLM, x-api-key alone is not enough
        assert _post(session, server, "/v1/messages", body, key=None, headers={"x-api-key": KEY}).status_code == 401
        answer = _post(session, server, "/v1/messages", body).json()
        assert [b["type"] for b in answer["content"]] == ["thinking", "text"]


def test_preserved_thinking_depends_on_the_reasoning_sent_back(fake, session):
    history = [
        {"role": "user", "content": "Pick numbers."},
        {"role": "assistant", "reasoning_content": "I think of 11, 12 and 13.", "content": "11"},
        {"role": "user", "content": "Which others?"},
    ]
    with fake() as server:
        with_reasoning = _post(session, server, "/v1/chat/completions", {"model": MODEL, "messages": history})
        stripped = [dict(m) for m in history]
        stripped[1].pop("reasoning_content")
        without = _post(session, server, "/v1/chat/completions", {"model": MODEL, "messages": stripped})
    assert with_reasoning.json()["choices"][0]["message"]["content"] == "The other numbers were 12 and 13."
    assert not re.search(r"\b1[23]\b", without.json()["choices"][0]["message"]["content"])


def test_tool_answer_uses_the_results_sent(fake, session):
    call = {"id": "functions.calculate:0", "type": "function",
            "function": {"name": "calculate", "arguments": json.dumps({"expression": "2*3"})}}
    messages = [
        {"role": "user", "content": "What is 2 * 3?"},
        {"role": "assistant", "content": "", "reasoning_content": "call it", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": json.dumps({"result": 7})},
    ]
    with fake() as server:
        resp = _post(session, server, "/v1/chat/completions", {"model": MODEL, "messages": messages})
        orphan = _post(session, server, "/v1/chat/completions",
                       {"model": MODEL, "messages": [messages[0], messages[2]]})
    assert "2*3 = 7" in resp.json()["choices"][0]["message"]["content"]
    assert orphan.status_code == 400


def test_unknown_effort_is_refused(fake, session):
    with fake() as server:
        resp = _post(session, server, "/v1/chat/completions", {
            "model": MODEL, "reasoning_effort": "extreme", "messages": [{"role": "user", "content": "hi"}]})
    assert resp.status_code == 400 and "reasoning_effort" in resp.json()["message"]


def test_vllm_stream_uses_reasoning_field(fake, session):
    with fake(engine="vllm") as server:
        resp = _post(session, server, "/v1/chat/completions", {
            "model": MODEL, "stream": True, "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "Count from 1 to 3"}]})
        lines = [line for line in resp.text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert any("reasoning" in d for d in deltas) and not any("reasoning_content" in d for d in deltas)
    assert "".join(d.get("content", "") for d in deltas) == "1 2 3"
    assert chunks[-1]["usage"]["completion_tokens"] > 0


def test_engine_flag_spellings(tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    sglang, _, ignored = settings_from_args([
        "--model-path", MODEL, "--served-model-name", MODEL, "--tp-size", "32", "--nnodes", "4",
        "--dist-init-addr", "10.0.0.1:5000", "--trust-remote-code", "--context-length", "262144",
        "--tool-call-parser", "kimi_k3", "--host", "0.0.0.0", "--port", "8000", "--api-key-file", str(key_file),
    ])
    assert (sglang.engine, sglang.served_model_names, sglang.max_model_len) == ("sglang", (MODEL,), 262144)
    assert sglang.api_key == KEY and "--trust-remote-code" in ignored and KEY not in repr(sglang)

    vllm, _, ignored = settings_from_args([
        MODEL, "--trust-remote-code", "--tensor-parallel-size", "8", "--load-format", "fastsafetensors",
        "--enable-auto-tool-choice", "--tool-call-parser", "kimi_k3", "--reasoning-parser", "kimi_k3",
        "--fault", "slow,no_image", "--fault", "no_auth",
    ])
    assert vllm.engine == "vllm" and vllm.served_model_names == (MODEL,)
    assert vllm.faults == {"slow", "no_image", "no_auth"}
    abbreviated, _, ignored = settings_from_args(["--max-model", "5", "--api", "x"])
    assert abbreviated.max_model_len == FakeSettings.max_model_len and abbreviated.api_key != "x"
    assert ignored == ["--max-model", "5", "--api", "x"]
    with pytest.raises(ValueError, match="unknown fault"):
        settings_from_args(["--fault", "gremlins"])


def test_runs_as_a_module_and_stops_on_sigterm(tmp_path, session):
    key_file = tmp_path / "key"
    key_file.write_text(KEY)
    env = dict(os.environ, PYTHONPATH=REPO)
    proc = subprocess.Popen(
        [sys.executable, "-m", "kimi_cluster.fakes.inference_server", "--engine", "vllm", "--port", "0",
         "--api-key-file", str(key_file), "--served-model-name", MODEL, "--some-future-flag", "x"],
        cwd=REPO, env=env, stderr=subprocess.PIPE, text=True,
    )
    try:
        banner = proc.stderr.readline()
        port = int(re.search(r":(\d+) serving", banner).group(1))
        assert KEY not in banner and "--some-future-flag" in banner
        resp = session.get(f"http://127.0.0.1:{port}/v1/models", headers={"Authorization": f"Bearer {KEY}"}, timeout=5)
        assert resp.json()["data"][0]["owned_by"] == "vllm"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        proc.stderr.close()
