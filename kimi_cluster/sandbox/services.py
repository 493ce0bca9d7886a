"""The sandbox's services: the fakes it starts as detached processes and keeps across runs of one workdir (the
Hyperstack emulator, whose VMs boot as network namespaces with sshd; the hub; the kernel-cache bucket), each on a
port kept in the workdir's record so the stack config stays the same from one `up` to the next."""

from __future__ import annotations

import json
import os
import shlex
import time
from collections.abc import Callable, Mapping
from typing import Any

from kimi_cluster.fakes import sandbox_services as services
from kimi_cluster.fakes.node_fabric import CDN_NAME
from kimi_cluster.settings import Settings, catalog

from .nodes import NodeNetwork
from .workdir import Workdir, emulator_key, hf_token

# The emulator's VM lifecycle, in tenths of a second: the sandbox proves the flow, not Hyperstack's boot times.
EMULATOR_LIFECYCLE = ("--creating-seconds", "0.2", "--build-seconds", "0.3", "--floating-ip-seconds", "0.1",
                      "--deleting-seconds", "0.2")
# The caretaker's clock and the emulator's bill alike: a minute is a second, and the caretaker looks every second
# (so idleStopMinutes 15 is 15 s, and a b300x1 bills about $1 a second).
SANDBOX_MINUTE_SECONDS = 1.0
CARETAKER_TIMING = json.dumps({"pollSeconds": 1, "minuteSeconds": SANDBOX_MINUTE_SECONDS})
# More arguments for the sandbox's own emulator, e.g. "--fault vm-error:kimi-sandbox-node0" (tests/sandbox/).
EMULATOR_ARGS_VARIABLE = "KIMI_SANDBOX_EMULATOR_ARGS"
# The same for the sandbox's own hub, e.g. "--hold" (kimi_cluster/fakes/hub_hold.py), from its start.
HUB_ARGS_VARIABLE = "KIMI_SANDBOX_HUB_ARGS"
# The kernel-cache bucket (an S3 API, moto).
KERNEL_BUCKET = "kimi-sandbox-kernels"
# The hub's flag that adds the tiny chat model's tokenizer and template, which a front's render server reads.
CHAT_MODEL_FLAG = "--chat-model"


def _service(record: Mapping[str, Any], name: str) -> services.Service | None:
    data = (record.get("services") or {}).get(name)
    return services.Service.from_json(data) if data else None


def _port_for(previous: services.Service | None, host: str = "127.0.0.1") -> int:
    # The same port as before keeps the stack config (hfEndpoint, the API URL) and so every step unchanged.
    if previous is not None and previous.host == host and services.port_free(previous.host, previous.port):
        return previous.port
    return services.free_port(host)


def _choose_ports(record: dict[str, Any]) -> None:
    """The stack's apiPort, enginePort and peerPort, each drawn once and kept in the record: apart from each other
    and from the ports TokenSpeed's launcher binds above enginePort, which the settings refuse to share. Drawn
    independently from some 12,700 ports, about one TokenSpeed up in 3,000 drew a clash (a CI run met one)."""
    engine_span = catalog.TOKENSPEED_METRICS_PORT_OFFSET + 1
    kept = {record[key] for key in ("api_port", "peer_port") if record.get(key)}
    if not record.get("engine_port"):
        record["engine_port"] = services.free_port(span=engine_span, avoid=kept)
    taken = kept | set(range(record["engine_port"], record["engine_port"] + engine_span))
    for key in ("api_port", "peer_port"):
        if not record.get(key):
            record[key] = services.free_port(avoid=taken)
            taken.add(record[key])


class SandboxServices:
    """The services of one workdir: started when missing, found again when running, stopped on destroy."""

    def __init__(self, workdir: Workdir, network: NodeNetwork, say: Callable[[str], None]) -> None:
        self.dir = workdir
        self.network = network
        self.say = say


    def emulator(self, record: dict[str, Any]) -> tuple[str, str]:
        """(API URL, key) of the sandbox's own emulator, started if not running, its VMs booting as fake nodes."""
        # It never reads HYPERSTACK_API_URL or HYPERSTACK_API_KEY, which may be a real account's (and scrubs both
        # from the CLI's environment, kimi_cluster/sandbox/pulumi_cli.py).
        if os.environ.get("HYPERSTACK_API_URL"):
            self.say("note: HYPERSTACK_API_URL is set; the sandbox ignores it (and HYPERSTACK_API_KEY) and runs its "
                     "own emulator")
        key = self.dir.secret("hyperstack_api_key", emulator_key)
        previous = _service(record, "emulator")
        if previous is None or not previous.running():
            if previous is not None:
                self.say(f"warning: the emulator of this sandbox (pid {previous.pid}) is not running any more; "
                         "starting a fresh one, which holds nothing of the earlier run")
            port = _port_for(previous)
            fabric = ("--node-fabric", str(self.network.path)) if self.network.path.exists() else ()
            # The caretaker on a fake node dials the API on the fabric's bridge (its own loopback is its namespace's).
            bridge = self.network.config()
            also = ("--also-host", bridge.host_address) if bridge is not None and fabric else ()
            # A test's faults and stock for this emulator (kimi_cluster.cli.emulator's --fault and --capacity), from the
            # start.
            extra = tuple(shlex.split(os.environ.get(EMULATOR_ARGS_VARIABLE, "")))
            service = services.start(
                # --admin: `reclaim` takes a VM away as the cloud would, through the emulator's admin route.
                "emulator", services.python_module("kimi_cluster.cli.emulator", "--port", str(port),
                                                   *EMULATOR_LIFECYCLE,
                                                   "--billing-minute-seconds", str(SANDBOX_MINUTE_SECONDS),
                                                   "--admin", *fabric, *also, *extra),
                host="127.0.0.1", port=port, marker="kimi_cluster.cli.emulator", log_dir=self.dir.logs,
                # The key goes by environment, not argv, which every user of the machine can read.
                env={"HYPERSTACK_API_KEY": key},
            )
            record.setdefault("services", {})["emulator"] = service.to_json()
            self.say(f"started the Hyperstack emulator on {service.url}/v1 (pid {service.pid}, log {service.log})")
        else:
            service = previous
        record["emulator_url"] = f"{service.url}/v1"
        return record["emulator_url"], key

    def hub(self, record: dict[str, Any], settings: Settings, host: str,
                    bytes_per_second: float | None = None, slow_edges: float | None = None) -> str:
        """The fake hub, https on the fabric's bridge with the CA the nodes trust."""
        self.dir.secret("hf_token", hf_token)
        fabric = self.network.config()
        assert fabric is not None, "the fake nodes' network comes first"
        cert, key, _ = self.network.hub_tls(fabric)
        previous = _service(record, "hub")
        # A hub started by an earlier release (an upgraded sandbox) serves no chat model: a new one does.
        if previous is not None and (previous.host != host or not previous.started_with(CHAT_MODEL_FLAG)):
            services.stop(previous)
            previous = previous if previous.host == host else None  # the same port, if on the same host
        if previous is None or not previous.running():
            port = _port_for(previous, host)
            # A throttled hub keeps the weights step busy long enough to watch it (`status` mid-download).
            throttle: tuple[str, ...] = ("--bytes-per-second", str(bytes_per_second)) if bytes_per_second else ()
            if bytes_per_second and slow_edges is not None:  # a CDN: that rate per connection on a fast edge
                throttle = ("--edge-bytes-per-second", str(bytes_per_second), "--slow-edges", str(slow_edges))
            service = services.start(
                "hub", services.python_module(
                    "kimi_cluster.fakes.hub", "--port", str(port), "--repo", settings.model, "--revision",
                    settings.model_revision,
                    # The hub answers only with this token: the checkpoint downloads prove it reached each node.
                    "--token-file", str(self.dir.secret_path("hf_token")), "--host", host,
                    "--cdn-host", CDN_NAME, "--tls-cert", str(cert), "--tls-key", str(key), *throttle,
                    # The tokenizer and chat template a front's render server reads (replicas with vLLM).
                    CHAT_MODEL_FLAG, *shlex.split(os.environ.get(HUB_ARGS_VARIABLE, ""))),
                host=host, port=port, marker="kimi_cluster.fakes.hub", log_dir=self.dir.logs,
            )
            record.setdefault("services", {})["hub"] = service.to_json()
            self.say(f"started the fake Hugging Face hub on https://{host}:{service.port} serving "
                     f"{settings.model}@{settings.model_revision[:12]} (pid {service.pid}, token required)")
        else:
            service = previous
        return f"https://{service.host}:{service.port}"

    def kernel_store(self, record: dict[str, Any], host: str) -> str:
        """The kernel-cache bucket: moto's S3 server, loaded from kernel-store/ (what the last destroy kept)."""
        creds = self.dir.secret_path("kernel_cache_credentials")
        previous = _service(record, "kernel-store")
        if previous is None or not previous.running() or not creds.exists() or previous.host != host:
            if previous is not None:
                services.stop(previous)
            self.dir.secrets_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            creds.unlink(missing_ok=True)  # the new server makes a new key
            port = _port_for(previous, host)
            service = services.start(
                "kernel-store", services.python_module(
                    "kimi_cluster.fakes.s3_store", "--port", str(port), "--bucket", KERNEL_BUCKET,
                    "--credentials-file", str(creds), "--data-dir", str(self.dir.kernel_store), "--host", host),
                host=host, port=port, marker="kimi_cluster.fakes.s3_store", log_dir=self.dir.logs, timeout=60,
            )
            deadline = time.monotonic() + 60
            while not creds.exists():  # written once the bucket exists and the kept objects are back in it
                if time.monotonic() > deadline or not service.running():
                    services.stop(service)
                    raise services.ServiceError(f"the kernel-cache bucket did not come up; see {service.log}")
                time.sleep(0.1)
            record.setdefault("services", {})["kernel-store"] = service.to_json()
            kept = sum(1 for p in self.dir.kernel_store.rglob("*") if p.is_file())
            self.say(f"started the kernel-cache bucket s3://{KERNEL_BUCKET} (moto's S3 server) on {service.url} "
                     f"with {kept} objects kept from earlier runs (pid {service.pid}, signed requests only)")
        else:
            service = previous
        return service.url

    def stop_all(self, record: dict[str, Any]) -> list[str]:
        problems = []
        for name, data in list((record.get("services") or {}).items()):
            service = services.Service.from_json(data)
            if services.stop(service):
                self.say(f"stopped the {name} (pid {service.pid})")
                record["services"].pop(name)
            else:
                problems.append(f"the {name} (pid {service.pid}) did not stop")
        return problems
