"""`FakeInferenceServer`: the fake on background threads, over http or https, with TokenSpeed's metrics
listener beside it."""

from __future__ import annotations

import ssl
import threading
from typing import Any

from .handler import Handler, Server
from .settings import FakeSettings


class FakeInferenceServer:
    """The fake on a background thread: `with FakeInferenceServer(settings) as fake: fake.url`."""

    def __init__(self, settings: FakeSettings, host: str = "127.0.0.1", port: int = 0, verbose: bool = False,
                 tls: tuple[str, str] | None = None, ca_certificate: str | None = None,
                 metrics_address: tuple[str, int] | None = None) -> None:
        """`tls` (certificate chain file, key file) serves https; `ca_certificate` is the PEM a client should trust;
        `metrics_address` is TokenSpeed's Prometheus listener (its shape only: the engines serve /metrics inline)."""
        self.settings = settings
        self.ca_certificate = ca_certificate
        self.httpd = Server((host, port), Handler)
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            self.httpd.tls = context
        self.httpd.settings = settings
        self.httpd.stop_event = threading.Event()
        self.httpd.served = {"requests": 0, "prompt_tokens": 0, "generation_tokens": 0}
        self.httpd.served_lock = threading.Lock()
        self.httpd.verbose = verbose
        self._thread: threading.Thread | None = None
        self.metrics_httpd: Server | None = None
        if settings.engine == "tokenspeed":
            # smg binds a Prometheus listener of its own (a free port unless --prometheus-port pins one).
            self.metrics_httpd = Server(metrics_address or (host, 0), Handler)
            for name in ("settings", "stop_event", "served", "served_lock", "verbose"):
                setattr(self.metrics_httpd, name, getattr(self.httpd, name))
            self.metrics_httpd.metrics_only = True
        self._metrics_thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self.httpd.server_address[1]

    @property
    def metrics_url(self) -> str | None:
        if self.metrics_httpd is None:
            return None
        return f"http://127.0.0.1:{self.metrics_httpd.server_address[1]}"

    @property
    def url(self) -> str:
        host = str(self.httpd.server_address[0])
        scheme = "https" if self.httpd.tls is not None else "http"
        return f"{scheme}://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{self.port}"

    def start(self) -> FakeInferenceServer:
        # a short poll keeps stop() quick, which matters when tests start dozens of servers
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="fake-inference", daemon=True
        )
        self._thread.start()
        if self.metrics_httpd is not None:
            self._metrics_thread = threading.Thread(target=self.metrics_httpd.serve_forever,
                                                    kwargs={"poll_interval": 0.05}, name="fake-metrics", daemon=True)
            self._metrics_thread.start()
        return self

    def stop(self) -> None:
        self.httpd.stop_event.set()  # wakes handlers sleeping in the "slow" fault
        self.httpd.shutdown()
        self.httpd.server_close()
        if self._thread:
            self._thread.join(timeout=5)
        if self.metrics_httpd is not None:
            if self._metrics_thread:
                self.metrics_httpd.shutdown()
                self._metrics_thread.join(timeout=5)
            self.metrics_httpd.server_close()

    def __enter__(self) -> FakeInferenceServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
