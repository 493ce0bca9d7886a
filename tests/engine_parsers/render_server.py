"""vLLM's real render server (`vllm launch render`, vLLM 0.33.0) on this machine's CPU, for the tests of the front's
resuming layer: the engines' parsers venv (install.sh) runs it on a loopback port, serving the tiny model
(kimi_cluster/fakes/tiny_model.py) with the chat flags the front gives it (kimi_cluster/plan/resume.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from kimi_cluster.fakes import tiny_model
from kimi_cluster.fakes.inference.settings import DEFAULT_MODEL
from kimi_cluster.fakes.sandbox_services import free_port

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("KIMI_PARSERS_VENV") or ROOT / ".venv-parsers")
START_DEADLINE_S = 600  # vLLM's import and start on a loaded 2-core machine; measured 18 s on a quiet one


def _free_port() -> int:
    # Below the kernel's ephemeral range (kimi_cluster/fakes/sandbox_services.py says why): a port from bind(port 0)
    # stays free for the server's whole start, 10 to 60 s, and another test's server that binds port 0 took one in
    # that time on a loaded CI machine; its /health answered, and the render server failed to bind.
    return free_port()


@contextmanager
def render_server(folder: Path) -> Iterator[str]:
    """The render server's base URL, serving the tiny model written into `folder`; stopped on exit."""
    model = tiny_model.write_model(folder / "model")
    port = _free_port()
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1"}
    argv = [str(VENV / "bin" / "vllm"), "launch", "render", str(model), "--host", "127.0.0.1", "--port", str(port),
            "--served-model-name", DEFAULT_MODEL, "--enable-auto-tool-choice", "--tool-call-parser", "kimi_k3",
            "--reasoning-parser", "kimi_k3"]
    with _serving(folder, argv, env, port) as url:
        yield url


# SGLang's chat route, which the front's chat layer (kimi_cluster/node/sglang_chat.py) imports.
SGLANG_CHAT_ROUTE = "sglang/srt/entrypoints/openai/serving_chat.py"


def require_sglang() -> None:
    """Skips the calling test module when the parsers venv holds no SGLang chat route (on CI: fails it). Its file is
    looked for, as the vLLM modules look for `vllm`: importing it to ask costs 12 CPU-seconds, and every xdist
    worker collects every module that asks. A route that is there and does not import fails the test that starts
    the chat layer, with the layer's log."""
    if not list((VENV / "lib").glob(f"python3*/site-packages/{SGLANG_CHAT_ROUTE}")):
        reason = f"SGLang's chat route is not installed in {VENV}: bash tests/engine_parsers/install.sh"
        if os.environ.get("CI"):
            raise RuntimeError(reason)
        pytest.skip(reason, allow_module_level=True)


@contextmanager
def sglang_chat_server(folder: Path, *flags: str) -> Iterator[str]:
    """SGLang's chat layer on the front (kimi_cluster/node/sglang_chat.py) with the parsers venv's SGLang 0.5.23,
    serving the tiny model written into `folder` (with `flags` besides); stopped on exit."""
    model = tiny_model.write_model(folder / "model")
    port = _free_port()
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": path}
    argv = [str(VENV / "bin" / "python"), "-m", "kimi_cluster.node.sglang_chat", str(model), "--host", "127.0.0.1",
            "--port", str(port), "--served-model-name", DEFAULT_MODEL, *flags]
    with _serving(folder, argv, env, port) as url:
        yield url


@contextmanager
def _serving(folder: Path, argv: list[str], env: dict[str, str], port: int) -> Iterator[str]:
    log = open(folder / "render.log", "wb")  # closed below, after the process
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_DEADLINE_S
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the render server exited ({proc.returncode}): "
                                   f"{(folder / 'render.log').read_text(errors='replace')[-3000:]}")
            try:
                with urllib.request.urlopen(url + "/health", timeout=5) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the render server did not answer within {START_DEADLINE_S} s")
            time.sleep(0.5)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        log.close()
