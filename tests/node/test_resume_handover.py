"""The resume step changes the resuming layer with no gap and no cut (kimi_cluster/plan/templates/resume.sh.j2): run
again on a fake front with a changed layer flag while a long stream runs through the front's real Caddy (its own
Caddyfile) and requests keep arriving, the stream finishes whole, no request is refused, and the old unit drains,
then exits, while the new one serves.

The layer's port (RESUME_PORT) and the render server's are fixed, so the scenario runs in a network namespace of its
own (`unshare -n`, root): nothing on this machine's loopback is touched, and nothing there disturbs it.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from kimi_cluster.blueprint import blueprint
from kimi_cluster.blueprint.inputs import compile_steps, endpoint_inputs

ROOT = Path(__file__).resolve().parents[2]
KEY = "sk-handover-test-0123456789abcdef"
STREAM_TOKENS = 300


def test_a_changed_layer_takes_over_with_no_request_refused_and_the_stream_whole(tmp_path: Path) -> None:
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ss"):
        pytest.skip("needs root, unshare and ss (a network namespace of its own)")
    run = subprocess.run(["unshare", "-n", "sh", "-c", f'ip link set lo up && exec "{sys.executable}" -m '
                          f'tests.node.test_resume_handover "{tmp_path}"'],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert "handing over from kimi-resume: it finishes the requests it took" in got["step"], got["step"]
    assert got["stream_tokens"] == STREAM_TOKENS and got["stream_done"], got
    assert got["old_draining_after_step"], "the step waited for the old layer's stream, or the old layer was killed"
    assert got["statuses"] and set(got["statuses"]) == {200}, got["statuses"]
    assert got["requests_during_step"] > 0, "no request was answered while the step ran: the test proves nothing"
    assert got["old_unit_after"] is None and got["new_unit_state"] == "active", got
    assert "every request taken was answered: exiting" in got["log"], got["log"]
    print(f"handover: no layer listened for {got['gap_ms']:.0f} ms; {len(got['statuses'])} requests, "
          f"{got['requests_during_step']} while the step ran, all answered 200")


# ---- the scenario, run inside the namespace -----------------------------------------------------------------------


def _wait(condition: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def scenario(tmp: Path) -> dict[str, Any]:
    import requests

    from kimi_cluster.fakes.head import ProxiedEngine
    from kimi_cluster.fakes.inference.settings import FakeSettings
    from kimi_cluster.fakes.node import make_fake_node
    from kimi_cluster.plan import proxy, resume
    from kimi_cluster.plan.front_config import caddyfile
    from kimi_cluster.plan.steps.model import VmSpot
    from kimi_cluster.plan.steps.scripts import render_vm_scripts
    from kimi_cluster.settings import RENDER_PORTS, RESUME_PORT
    from tests.node.conftest import FAST, make_settings
    from tests.node.resume_stand_ins import render_server, token_server

    node = make_fake_node(tmp / "front")
    settings = make_settings("b300x1-vllm", replicas="2", nodeRoot=str(node.root))
    heads = ["127.0.0.2", "127.0.0.3"]
    front = next(vm for vm in blueprint(settings, "kimi").vm_plans if vm.kind == "front")

    def step() -> str:
        script = render_vm_scripts(compile_steps(settings), front, VmSpot(private_ip="127.0.0.1",
                                                                          front_upstreams=heads),
                                   ["resume"], replace(FAST, proxy_timeout_s=60))["resume"]
        done = node.run(script, stdin="\n", timeout=120)
        if done.returncode:
            raise AssertionError(f"the resume step failed: {done.stdout[-3000:]}{done.stderr[-3000:]}")
        return done.stdout + done.stderr

    def config(folder: Path, api_port: int, _engine_port: int) -> str:
        served = make_settings("b300x1-vllm", replicas="2", apiPort=str(api_port))
        return caddyfile(endpoint_inputs(served), ["127.0.0.1"]).replace(proxy.ADMIN_SOCKET, str(folder / "admin.sock"))

    first_argv = resume.resumer_argv
    try:
        with token_server(heads[0], settings.engine_port) as one, token_server(heads[1], settings.engine_port) \
                as two, render_server(RENDER_PORTS[0]), \
                ProxiedEngine(FakeSettings(engine="vllm"), api_key=KEY, config=config) as caddy:
            for replica in (one, two):
                replica.token_s = 0.02  # the long stream runs some 6 s, and holds still while the step runs
            step()
            url, auth = f"{caddy.url}/v1/chat/completions", {"Authorization": f"Bearer {KEY}"}

            stream: dict[str, Any] = {}

            def long_stream() -> None:
                body = {"model": "m", "stream": True, "max_tokens": STREAM_TOKENS,
                        "messages": [{"role": "user", "content": "long"}]}
                with requests.post(url, json=body, headers=auth, verify=caddy.ca_file, stream=True,
                                   timeout=120) as answer:
                    text = b"".join(answer.iter_content(None))
                stream.update(status=answer.status_code, text=text)

            statuses: list[int] = []
            stop = threading.Event()

            def keep_asking() -> None:
                with requests.Session() as session:
                    while not stop.is_set():
                        answer = session.post(url, json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
                                              headers=auth, verify=caddy.ca_file, timeout=60)
                        statuses.append(answer.status_code)

            refused: list[tuple[float, float]] = []  # (first, last) refusal of each run of refused connects

            def watch_port() -> None:
                while not stop.is_set():
                    try:
                        socket.create_connection(("127.0.0.1", RESUME_PORT), timeout=1).close()
                    except ConnectionRefusedError:
                        now = time.monotonic()
                        if refused and now - refused[-1][1] < 0.05:
                            refused[-1] = (refused[-1][0], now)
                        else:
                            refused.append((now, now))
                    time.sleep(0.002)

            streamer = threading.Thread(target=long_stream)
            asker = threading.Thread(target=keep_asking)
            watcher = threading.Thread(target=watch_port)
            sent_before = (one.sent, two.sent)
            streamer.start()
            _wait(lambda: one.sent + two.sent >= sum(sent_before) + 5, 30, "the long stream to start")
            asker.start()
            watcher.start()
            _wait(lambda: len(statuses) >= 5, 30, "requests to flow through the front")
            asked_before = len(statuses)
            # A changed flag: a new layer.
            resume.resumer_argv = lambda engine_name="vllm": [*first_argv(engine_name), "--tick-s", "0.5"]
            # The stream holds still (its replica's health checks answering) until the step has returned: a step that
            # waited for it runs into its own timeout, and a step slowed by a loaded machine can no longer outlast the
            # stream's 6 s (beside a second suite, once it did).
            for replica in (one, two):
                replica.flowing.clear()
            try:
                out = step()
                old = node.unit("kimi-resume")
                draining = old is not None and old["state"] == "deactivating" and "text" not in stream
            finally:
                for replica in (one, two):
                    replica.flowing.set()
            asked_during = len(statuses) - asked_before
            _wait(lambda: len(statuses) >= asked_before + asked_during + 5, 30, "requests to the new layer")
            streamer.join(timeout=120)
            stop.set()
            asker.join(timeout=60)
            watcher.join(timeout=10)
            _wait(lambda: node.unit("kimi-resume") is None, 30, "the old unit to exit once drained")
            new = node.unit("kimi-resume-spare")
            text = stream.get("text", b"")
            tokens = sum(len(json.loads(e[6:])["choices"][0]["delta"].get("content", "").split("<")) - 1
                         for e in text.split(b"\n\n") if e.startswith(b"data: {") and json.loads(e[6:])["choices"])
            gap = max((last - first for first, last in refused), default=0.0)
            return {"step": out, "stream_tokens": tokens, "stream_done": text.rstrip().endswith(b"data: [DONE]"),
                    "stream_status": stream.get("status"), "old_draining_after_step": draining,
                    "statuses": statuses, "requests_during_step": asked_during, "gap_ms": gap * 1000,
                    "old_unit_after": node.unit("kimi-resume"), "new_unit_state": new and new["state"],
                    "log": _log(node.root)}
    finally:
        resume.resumer_argv = first_argv
        node.cleanup()


def _log(root: Path) -> str:
    found = list(root.rglob("resume.log"))
    return found[0].read_text(errors="replace") if found else ""


if __name__ == "__main__":
    print(json.dumps(scenario(Path(sys.argv[1])), default=str))
