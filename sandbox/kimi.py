"""The kimi-cluster sandbox: `up`, `verify` and `destroy` of the real program on this machine, with no account or GPU;
starts the fakes as detached services, drives the sandbox engine, and on destroy proves nothing is left behind.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import shlex
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from components import catalog
from components.settings import NAMESPACE, Settings
from components.settings.loader import load_settings, read_stack_file
from fakes import sandbox_services as services
from fakes.hyperstack_emulator import DEFAULT_API_KEY
from fakes.node_fabric import CDN_NAME, Fabric, FabricConfig, FabricError, allocate
from sandbox.cli_stacks import CliStacks
from sandbox.commands import NodeExecution
from sandbox.engine_client import EngineSettings, run_child
from sandbox.state import plain_outputs, read_outputs

REPO_ROOT = Path(__file__).resolve().parents[1]
VERIFICATION_DIR = REPO_ROOT / "verification"
NODE_BIN = REPO_ROOT / "fakes" / "node" / "bin"
ENGINE_HOOK = REPO_ROOT / "fakes" / "node" / "engine_hook.py"
STACK = "sandbox"
CLUSTER_REF = f"organization/kimi-cluster/{STACK}"
VERIFY_NS = "kimi-cluster-verification"
TOPOLOGIES = ("h100x4-sglang", "b300x1-vllm", "b300x1-tokenspeed", "custom")  # custom: shape keys with --config
DEFAULT_WORKDIR = ".sandbox"
# Written into a workdir the sandbox created; without it a non-empty directory is someone else's and is refused.
MARKER = ".kimi-sandbox"

# The emulator's VM lifecycle, in tenths of a second: the sandbox proves the flow, not Hyperstack's boot times.
EMULATOR_LIFECYCLE = ("--creating-seconds", "0.2", "--build-seconds", "0.3", "--floating-ip-seconds", "0.1",
                      "--deleting-seconds", "0.2")
# The kernel-cache bucket (an S3 API, moto) and how long the fake engine "compiles" when its cache is empty.
KERNEL_BUCKET = "kimi-sandbox-kernels"
FAKE_COMPILE_SECONDS = 30
# The option that sets that compile time: the fake engine's own variable, a FAKE_* knob, so the caller's
# environment wins over FAKE_COMPILE_SECONDS (node_env). `sandbox up` and the kernel-cache bench keep the 30 s
# (README "The sandbox", "Kernel cache"); the tests set 0 except in their kernel-cache flows (tests/sandbox/).
COMPILE_SECONDS_KNOB = "FAKE_ENGINE_COMPILE_SECONDS"
# Free space the fake disks report: the checkpoint (1.56 TB) plus the margin must fit, as on the real flavors.
FAKE_DISK_BYTES = 4 * 10**12
# Deadlines of the engine runs: every node step has its own, shorter ones from the stack config.
UP_DEADLINE_S = 1800.0
VERIFY_DEADLINE_S = 900.0
OPERATION_TIMEOUT_S = 900.0
VERIFY_REQUEST_TIMEOUT_S = 60

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
# What runs the stacks: the real Pulumi CLI (scripts/pulumi-toolchain), with each VM a namespace with sshd
# (fakes/node_fabric.py); or "home", the sandbox's own engine with node commands run in directories, kept until
# every flow runs under the real CLI. KIMI_SANDBOX_ENGINE chooses for a whole run (the test suite's flows).
ENGINES = ("pulumi", "home")
ENGINE_VARIABLE = "KIMI_SANDBOX_ENGINE"
# More arguments for the sandbox's own emulator, e.g. "--fault vm-error:kimi-sandbox-node0" (tests/sandbox/).
EMULATOR_ARGS_VARIABLE = "KIMI_SANDBOX_EMULATOR_ARGS"
# What a user does after an interrupted `pulumi up` (README "Recovering from an interrupted up").


class SandboxUsageError(Exception):
    """The command cannot run as asked (nothing deployed, a conflicting topology); the message says what to do."""


# ---- the workdir --------------------------------------------------------------------------------------------------


@dataclass
class Workdir:
    """`<workdir>/`: sandbox.json (services, topology, port), secrets/ (0700), state.json and nodes/ (the engine's),
    verification/ (the verification stack's engine workdir), logs/ (the services' output)."""

    root: Path

    @property
    def record_path(self) -> Path:
        return self.root / "sandbox.json"

    @property
    def secrets_dir(self) -> Path:
        return self.root / "secrets"

    @property
    def state_path(self) -> Path:
        return self.root / "state.json"

    @property
    def nodes(self) -> Path:
        return self.root / "nodes"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def verification(self) -> Path:
        return self.root / "verification"

    @property
    def kernel_store(self) -> Path:
        """The kernel-cache bucket's objects while its server is stopped; kept by destroy, like a team's bucket."""
        return self.root / "kernel-store"

    @property
    def marker(self) -> Path:
        return self.root / MARKER

    def claim(self, create: bool) -> None:
        """Own the workdir, or refuse it: a file, or a non-empty directory the sandbox did not create (whose
        secrets/ or nodes/ a destroy would delete). `create` makes it (an up); verify and destroy never do."""
        if self.root.exists() and not self.root.is_dir():
            raise SandboxUsageError(f"--workdir {self.root} is a file; give a directory the sandbox may own "
                                    f"(new or empty; default {DEFAULT_WORKDIR})")
        if self.marker.exists():
            return
        if self.root.exists() and any(self.root.iterdir()):
            if self.record_path.exists():  # made by a sandbox from before the marker: its own files
                self._mark()
                return
            foreign = " (its state.json is another engine's)" if self.state_path.exists() else ""
            raise SandboxUsageError(f"--workdir {self.root} holds files the sandbox did not create{foreign}; it "
                                    "would own and later delete parts of it: give a new or empty directory")
        if create:
            self.root.mkdir(parents=True, exist_ok=True)
            self._mark()

    def _mark(self) -> None:
        self.marker.write_text(
            "created by python -m scripts.sandbox; destroy deletes only what the sandbox made here\n")

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """One sandbox command at a time per workdir: a second `up` (or a destroy during an up) is refused."""
        if not self.root.is_dir():
            yield
            return
        with open(self.root / ".command.lock", "a+") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.seek(0)
                holder = handle.read().strip() or "another process"
                raise SandboxUsageError(f"another sandbox command ({holder}) is running in {self.root}; wait for "
                                        "it to finish, or use another --workdir") from None
            handle.seek(0)
            handle.truncate()
            handle.write(f"pid {os.getpid()}\n")
            handle.flush()
            yield

    def _json(self, path: Path) -> Any:
        try:
            return json.loads(path.read_text())
        except ValueError:
            raise SandboxUsageError(f"{path} is not valid JSON (edited or cut short?); move it away or use another "
                                    "--workdir") from None

    def record(self) -> dict[str, Any]:
        return self._json(self.record_path) if self.record_path.exists() else {}

    def save_record(self, record: Mapping[str, Any]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.record_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record, indent=2) + "\n")
        os.replace(tmp, self.record_path)

    def secret(self, name: str, make: Callable[[], str]) -> str:
        """A sandbox secret kept across commands (a later `up` must not change the hub token and re-run steps)."""
        self.secrets_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = self.secrets_dir / name
        if not path.exists():
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(make() + "\n")
        return path.read_text().strip()

    def secret_path(self, name: str) -> Path:
        return self.secrets_dir / name

    def resources(self) -> list[dict[str, Any]]:
        """What the cluster's state holds (the stack itself excluded)."""
        if not self.state_path.exists():
            return []
        doc = self._json(self.state_path)
        if not isinstance(doc, dict):
            raise SandboxUsageError(f"{self.state_path} is not a sandbox engine state file")
        return [r for r in doc.get("resources", []) if r.get("type") != "pulumi:pulumi:Stack"]

    def outputs(self) -> tuple[dict[str, Any], frozenset[str]]:
        if not self.state_path.exists():
            return {}, frozenset()
        return plain_outputs(read_outputs(self.state_path))


def _emulator_key() -> str:
    return "sandbox-" + secrets.token_urlsafe(24)


def _hf_token() -> str:
    return "hf_" + secrets.token_urlsafe(24)


def _dummy_ssh_key() -> str:
    # Node commands run on this machine, so no key is ever used; the program still requires one to be set.
    return "sandbox-dummy-ssh-key-" + secrets.token_hex(8)


def new_ssh_private_key() -> str:
    """A fresh ed25519 key in OpenSSH's format: the operator's key, which every fake node's sshd accepts."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    return Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()).decode()


def ssh_public_key_of(private_key: str) -> str:
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_ssh_private_key(private_key.encode(), password=None)
    return key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                         serialization.PublicFormat.OpenSSH).decode() + " kimi-sandbox"


# ---- settings the sandbox derives from the stack -------------------------------------------------------------------


def stack_settings(topology: str, overrides: Mapping[str, str] | None = None) -> Settings:
    """The validated settings of the sandbox stack for this topology (as the program will see them)."""
    raw, _ = read_stack_file(str(REPO_ROOT / f"Pulumi.{STACK}.yaml"))
    # The sandbox always passes its bucket's key pair as kimi-cluster:kernelCacheCredentials (secrets count as set).
    raw = {**raw, "topology": topology, **(overrides or {}), "kernelCacheCredentials": True}
    return load_settings(raw, STACK)


def node_env(settings: Settings, faults: Mapping[str, str] | None = None, host_address: str | None = None
             ) -> dict[str, str]:
    """How the fake nodes look: their disks, GPUs, addresses, free space, and the engine the docker stub starts.

    FAKE_* variables of the caller's environment (`faults`, default os.environ) are passed on last: they are the
    fake node's fault knobs (fakes/node/__init__.py), e.g. FAKE_HANG=nvidia-smi for a driver that never answers.
    """
    disk = settings.storage_path.strip("/")
    no_proxy = ",".join(["127.0.0.1", "localhost", *([host_address, CDN_NAME] if host_address else [])])
    knobs = {k: v for k, v in (os.environ if faults is None else faults).items() if k.startswith("FAKE_")}
    return {
        "FAKE_NODE_DISKS": disk,
        "FAKE_DISK_AVAIL_BYTES": str(FAKE_DISK_BYTES),
        "FAKE_GPU_COUNT": str(settings.gpus_per_node_count),
        "FAKE_GPU_NAME": f"NVIDIA {settings.gpu.name}",
        # Each node's private interface holds its own address (the emulator gives a VM one loopback address for
        # both its fixed and floating IP); the stub expands the variable per node.
        "FAKE_IP_ADDRS": "lo=127.0.0.1/8,ens6=${SANDBOX_NODE_HOST}/8,docker0=172.17.0.1/16",
        "FAKE_DOCKER_RUN_HOOK": str(ENGINE_HOOK),
        # The fake engine compiles this long when the kernels it needs are not in its cache folder.
        COMPILE_SECONDS_KNOB: str(FAKE_COMPILE_SECONDS),
        # The hub and the engine are on loopback or the fabric's bridge: a proxy from the caller's environment must
        # not get in the way.
        "NO_PROXY": no_proxy,
        "no_proxy": no_proxy,
        **knobs,
    }


def node_path() -> tuple[str, ...]:
    # The stubs, then this interpreter's bin: the node scripts' python3 must be one with huggingface_hub installed.
    return (str(NODE_BIN), str(Path(sys.executable).parent))


# ---- services ----------------------------------------------------------------------------------------------------


def _service(record: Mapping[str, Any], name: str) -> services.Service | None:
    data = (record.get("services") or {}).get(name)
    return services.Service.from_json(data) if data else None


def _port_for(previous: services.Service | None) -> int:
    # The same port as before keeps the stack config (hfEndpoint, the API URL) and so every step unchanged.
    if previous is not None and services.port_free(previous.host, previous.port):
        return previous.port
    return services.free_port()


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


class Sandbox:
    """One sandbox in one workdir. Methods return an exit code and print what a user needs to see."""

    def __init__(self, workdir: str | Path = DEFAULT_WORKDIR, out: TextIO | None = None,
                 engine: str | None = None) -> None:
        self.dir = Workdir(Path(workdir).resolve())
        self.out = out or sys.stdout
        self.engine = engine or os.environ.get(ENGINE_VARIABLE) or ENGINES[0]
        if self.engine not in ENGINES:
            raise SandboxUsageError(f"{ENGINE_VARIABLE}={self.engine!r}: the engine is one of {', '.join(ENGINES)}")
        self.cli = CliStacks(self.dir.root, self.dir.secrets_dir, self.out)

    @property
    def real(self) -> bool:
        return self.engine == "pulumi"

    # -- the stack as the engine keeps it --

    def resources(self) -> list[dict[str, Any]]:
        """What the cluster's state holds (the stack itself excluded)."""
        return self.cli.resources(self.cli.cluster) if self.real else self.dir.resources()

    def outputs(self) -> tuple[dict[str, Any], frozenset[str]]:
        """(the cluster stack's outputs in plain text, the names of the secret ones)."""
        return self.cli.outputs(self.cli.cluster) if self.real else self.dir.outputs()

    @property
    def checkpoint_path(self) -> Path:
        """The file the engine keeps the cluster stack's state in, written after every resource operation: the real
        CLI's checkpoint (its `latest.resources` name each by URN), or the sandbox engine's state.json."""
        return self.cli.checkpoint_path(self.cli.cluster) if self.real else self.dir.state_path

    def hub_ca(self) -> Path | None:
        """The CA file that the fake hub's https certificate chains to (None: the hub serves plain http)."""
        fabric = self.fabric() if self.real else None
        return self._hub_tls(fabric)[2] if fabric is not None else None

    @contextlib.contextmanager
    def state_document(self) -> Iterator[Path]:
        """A file holding the deployment with its secrets, as `pulumi stack export --show-secrets` gives it."""
        if not self.real:
            yield self.dir.state_path
            return
        with self.cli.export_file(self.cli.cluster) as path:
            yield path

    # -- the fake nodes' network (the real CLI reaches them over SSH) --

    @property
    def fabric_path(self) -> Path:
        return self.dir.root / "fabric.json"

    def fabric(self) -> FabricConfig | None:
        return FabricConfig.load(self.fabric_path) if self.fabric_path.exists() else None

    def _ensure_fabric(self, settings: Settings) -> FabricConfig:
        """This sandbox's bridge and /24, made once; the nodes' environment is rewritten on every up."""
        config = self.fabric()
        if config is None or not Fabric(config).bridge_up():
            try:
                config = allocate(self.dir.nodes, node_path(), {})
            except FabricError as exc:
                raise SandboxUsageError(str(exc)) from None
            self.say(f"made the fake nodes' network: bridge {config.bridge}, {config.subnet} (this machine is "
                     f"{config.host_address}; each VM a namespace with sshd)")
        ca = self._hub_tls(config)[2]
        env = {**node_env(settings, host_address=config.host_address),
               # The hub is https on the bridge (a token never crosses a network in clear): the nodes trust its CA,
               # as a machine trusts a mirror's private CA (OpenSSL's and requests' variables).
               "SSL_CERT_FILE": str(ca), "REQUESTS_CA_BUNDLE": str(ca)}
        config = FabricConfig(config.id, config.subnet, config.nodes_dir, node_path(), env)
        self.fabric_path.write_text(json.dumps(config.to_json(), indent=2) + "\n")
        return config

    def _hub_tls(self, fabric: FabricConfig) -> tuple[Path, Path, Path]:
        """(certificate, key, CA) of the hub's https, for the bridge's address and the CDN name; made per fabric."""
        from components.tls import make_ca, make_server_certificate

        where = self.dir.secrets_dir / "hub-tls"
        cert, key, ca = where / f"{fabric.id}.crt", where / f"{fabric.id}.key", where / f"{fabric.id}-ca.crt"
        if not (cert.exists() and key.exists() and ca.exists()):
            where.mkdir(parents=True, exist_ok=True, mode=0o700)
            ca_pem, ca_key = make_ca("kimi-sandbox hub CA", days=30)
            cert_pem, key_pem = make_server_certificate(ca_pem, ca_key, [fabric.host_address], [CDN_NAME], days=30)
            fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as handle:
                handle.write(key_pem)
            cert.write_text(cert_pem)
            ca.write_text(ca_pem)
        return cert, key, ca

    def _teardown_fabric(self) -> list[str]:
        config = self.fabric()
        if config is None:
            return []
        problems = Fabric(config).teardown()
        if not problems:
            self.fabric_path.unlink(missing_ok=True)
            self.say(f"removed the fake nodes' network ({config.bridge}, {config.subnet})")
        return problems

    def say(self, text: str = "") -> None:
        self.out.write(text + "\n")
        self.out.flush()

    # -- services --

    def _ensure_emulator(self, record: dict[str, Any]) -> tuple[str, str]:
        """(API URL, key) of the emulator: the one HYPERSTACK_API_URL names, else ours, started if not running."""
        # Under the real CLI the sandbox always runs its own emulator, whose VMs boot as fake nodes: it never reads
        # HYPERSTACK_API_URL or HYPERSTACK_API_KEY, which may be a real account's (and scrubs both from the CLI's
        # environment, sandbox/pulumi_cli.py).
        external = "" if self.real else (os.environ.get("HYPERSTACK_API_URL") or "").rstrip("/")
        if external and not _loopback_url(external):
            # The sandbox engine honours HYPERSTACK_API_URL for a test's own emulator only: a real account's URL
            # would get the key exported beside it, and VMs that bill.
            raise SandboxUsageError(f"HYPERSTACK_API_URL={external} is not an emulator on this machine's loopback; "
                                    "the sandbox never deploys to a real API: unset it (and HYPERSTACK_API_KEY)")
        if self.real and os.environ.get("HYPERSTACK_API_URL"):
            self.say("note: HYPERSTACK_API_URL is set; the sandbox ignores it (and HYPERSTACK_API_KEY) and runs its "
                     "own emulator")
        if self.resources() and "external_emulator" in record:
            # Deleting through another emulator than the one that holds the VMs would "succeed" and leave them.
            before = record["emulator_url"] if record["external_emulator"] else None
            if (before or None) != (external or None):
                where = f"the emulator at {before} (HYPERSTACK_API_URL)" if before else "its own emulator"
                now = f"HYPERSTACK_API_URL={external}" if external else "HYPERSTACK_API_URL unset"
                raise SandboxUsageError(f"the sandbox in {self.dir.root} was deployed against {where}, but now "
                                        f"{now}: point it back (with HYPERSTACK_API_KEY) or use another --workdir")
        if external:
            record["emulator_url"] = external
            record["external_emulator"] = True
            record.setdefault("services", {}).pop("emulator", None)
            return record["emulator_url"], os.environ.get("HYPERSTACK_API_KEY") or DEFAULT_API_KEY
        key = self.dir.secret("hyperstack_api_key", _emulator_key)
        previous = _service(record, "emulator")
        if previous is None or not previous.running():
            if previous is not None:
                self.say(f"warning: the emulator of this sandbox (pid {previous.pid}) is not running any more; "
                         "starting a fresh one, which holds nothing of the earlier run")
            port = _port_for(previous)
            fabric = ("--node-fabric", str(self.fabric_path)) if self.real and self.fabric_path.exists() else ()
            # A test's faults and stock for this emulator (scripts.emulator's --fault and --capacity), from the start.
            extra = tuple(shlex.split(os.environ.get(EMULATOR_ARGS_VARIABLE, "")))
            service = services.start(
                # --admin: `reclaim` takes a VM away as the cloud would, through the emulator's admin route.
                "emulator", services.python_module("scripts.emulator", "--port", str(port), *EMULATOR_LIFECYCLE,
                                                   "--admin", *fabric, *extra),
                host="127.0.0.1", port=port, marker="scripts.emulator", log_dir=self.dir.logs,
                # The key goes by environment, not argv, which every user of the machine can read.
                env={"HYPERSTACK_API_KEY": key},
            )
            record.setdefault("services", {})["emulator"] = service.to_json()
            self.say(f"started the Hyperstack emulator on {service.url}/v1 (pid {service.pid}, log {service.log})")
        else:
            service = previous
        record["emulator_url"] = f"{service.url}/v1"
        record["external_emulator"] = False
        return record["emulator_url"], key

    def _service_host(self) -> str:
        """Where the hub and the bucket listen: on the fabric's bridge, which the fake nodes reach, or on loopback."""
        fabric = self.fabric() if self.real else None
        return fabric.host_address if fabric is not None else "127.0.0.1"

    def _ensure_hub(self, record: dict[str, Any], settings: Settings, bytes_per_second: float | None = None) -> str:
        self.dir.secret("hf_token", _hf_token)
        previous = _service(record, "hub")
        host = self._service_host()
        fabric = self.fabric() if self.real else None
        tls = self._hub_tls(fabric) if fabric is not None else None
        scheme = "https" if tls else "http"
        if previous is not None and (previous.host != host or record.get("hub_url", "").split(":")[0] != scheme):
            services.stop(previous)
            previous = None
        if previous is None or not previous.running():
            port = _port_for(previous) if previous is not None else services.free_port(host)
            cdn = ("--cdn-host", CDN_NAME, "--tls-cert", str(tls[0]), "--tls-key", str(tls[1])) if tls else ()
            # A throttled hub keeps the weights step busy long enough to watch it (`status` mid-download).
            throttle = ("--bytes-per-second", str(bytes_per_second)) if bytes_per_second else ()
            service = services.start(
                "hub", services.python_module(
                    "fakes.hub", "--port", str(port), "--repo", settings.model, "--revision", settings.model_revision,
                    # The hub answers only with this token: the checkpoint downloads prove it reached each node.
                    "--token-file", str(self.dir.secret_path("hf_token")), "--host", host, *cdn, *throttle),
                host=host, port=port, marker="fakes.hub", log_dir=self.dir.logs,
            )
            record.setdefault("services", {})["hub"] = service.to_json()
            self.say(f"started the fake Hugging Face hub on {scheme}://{host}:{service.port} serving "
                     f"{settings.model}@{settings.model_revision[:12]} (pid {service.pid}, token required)")
        else:
            service = previous
        return f"{scheme}://{service.host}:{service.port}"

    def _ensure_kernel_store(self, record: dict[str, Any]) -> str:
        """The kernel-cache bucket: moto's S3 server, loaded from kernel-store/ (what the last destroy kept)."""
        creds = self.dir.secret_path("kernel_cache_credentials")
        previous = _service(record, "kernel-store")
        host = self._service_host()
        if previous is None or not previous.running() or not creds.exists() or previous.host != host:
            if previous is not None:
                services.stop(previous)
            self.dir.secrets_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            creds.unlink(missing_ok=True)  # the new server makes a new key
            port = _port_for(previous) if previous is not None and previous.host == host else services.free_port(host)
            service = services.start(
                "kernel-store", services.python_module(
                    "fakes.s3_store", "--port", str(port), "--bucket", KERNEL_BUCKET,
                    "--credentials-file", str(creds), "--data-dir", str(self.dir.kernel_store), "--host", host),
                host=host, port=port, marker="fakes.s3_store", log_dir=self.dir.logs, timeout=60,
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

    def _stop_services(self, record: dict[str, Any]) -> list[str]:
        problems = []
        for name, data in list((record.get("services") or {}).items()):
            service = services.Service.from_json(data)
            if services.stop(service):
                self.say(f"stopped the {name} (pid {service.pid})")
                record["services"].pop(name)
            else:
                problems.append(f"the {name} (pid {service.pid}) did not stop")
        return problems

    # -- engine runs --

    def _cluster_engine(self, record: Mapping[str, Any], settings: Settings) -> EngineSettings:
        config = {
            **{f"{NAMESPACE}:{key}": value for key, value in (record.get("config") or {}).items()},
            f"{NAMESPACE}:topology": record["topology"],
            f"{NAMESPACE}:apiPort": str(record["api_port"]),
            # Every sandbox's engines share this machine's loopback: each gets its own engine port.
            f"{NAMESPACE}:enginePort": str(record["engine_port"]),
            # Every fake node serves its weight files to the others on its own loopback address and this port;
            # a free one, so two sandboxes on one machine (whose VMs share 127.0.0.x) do not collide.
            f"{NAMESPACE}:peerPort": str(record["peer_port"]),
            f"{NAMESPACE}:hfEndpoint": record["hub_url"],
            "hyperstack:apiUrl": record["emulator_url"],
        }
        fabric = self.fabric() if self.real else None
        if fabric is not None:
            # The operator is this machine, at its address on the bridge; the key is a real one, which every fake
            # node's sshd takes (the emulator puts the keypair's public key in its authorized_keys).
            ssh_key = self.dir.secret("ssh_private_key_ed25519", new_ssh_private_key)
            config[f"{NAMESPACE}:operatorCidr"] = f"{fabric.host_address}/32"
            # `up --config sshPublicKey=...` keeps the keypair's key while sshPrivateKey rotates (the VMs were
            # created with it; the new key is added to their authorized_keys by hand, as on a real cluster).
            config.setdefault(f"{NAMESPACE}:sshPublicKey", ssh_public_key_of(ssh_key))
        else:
            ssh_key = self.dir.secret("ssh_private_key", _dummy_ssh_key)
        secret_config = {
            f"{NAMESPACE}:sshPrivateKey": ssh_key,
            f"{NAMESPACE}:hfToken": self.dir.secret("hf_token", _hf_token),
            "hyperstack:apiKey": record["emulator_key"],
        }
        # The sandbox's own bucket, unless `up --config kernelCache=...` named another store.
        if record.get("kernel_store_url") and self.dir.secret_path("kernel_cache_credentials").exists():
            config.setdefault(f"{NAMESPACE}:kernelCache", json.dumps({
                "bucket": KERNEL_BUCKET, "endpointUrl": record["kernel_store_url"], "addressingStyle": "path",
                "restoreTimeoutMinutes": 3, "saveTimeoutMinutes": 3}))
            secret_config[f"{NAMESPACE}:kernelCacheCredentials"] = \
                self.dir.secret_path("kernel_cache_credentials").read_text().strip()
        return EngineSettings(
            project_dir=REPO_ROOT, stack=STACK, workdir=self.dir.root, config_overrides=config,
            secret_overrides=secret_config, node_path_prefix=node_path(), node_env=node_env(settings),
            operation_timeout=OPERATION_TIMEOUT_S, deadline=UP_DEADLINE_S,
        )

    def _run(self, operation: str, settings: EngineSettings, echo: bool) -> tuple[dict[str, Any] | None, str]:
        """Run the engine; Ctrl-C/SIGTERM reach it too. Without a result, the log's last lines say what happened."""
        # HYPERSTACK_API_KEY wins over hyperstack:apiKey in the providers: a real key the caller exported must not
        # replace the emulator's key, so the engine child gets the emulator's.
        key = settings.secret_overrides.get("hyperstack:apiKey")
        with _environment_set("HYPERSTACK_API_KEY", key):
            return run_child(operation, settings, echo=echo, out=self.out, pid_file=settings.workdir / "engine.pid",
                             forward_signals=True)

    def _cli_up(self, engine: EngineSettings, echo: bool) -> dict[str, Any]:
        """`pulumi up` of the cluster stack, after the recovery a user runs when an earlier up was interrupted."""
        stack = self.cli.cluster
        if self.cli.pending_operations(stack) or self.cli.locked(stack):
            self.say("the last up was interrupted (the checkpoint lists operations it did not finish): "
                     "pulumi cancel, pulumi refresh --clear-pending-creates, then up")
            self.cli.recover(stack)
        config = {**engine.config_overrides}
        return self.cli.up(stack, REPO_ROOT / f"Pulumi.{STACK}.yaml", config, engine.secret_overrides, echo=echo,
                           timeout=UP_DEADLINE_S)

    def _tail(self, log: str, echoed: bool, lines: int = 20) -> None:
        shown = log.splitlines()[-1:] if echoed else log.splitlines()[-lines:]
        for line in shown:
            self.say(line)

    def _ensure_idle(self) -> None:
        """Refuse while an engine runs on this workdir: a destroy must not delete VMs an up is still creating."""
        running = self.dir.root / "pulumi.pid"
        if running.exists() and running.read_text().strip().isdigit() and \
                services.is_alive(int(running.read_text().strip())):
            raise SandboxUsageError(f"pulumi (pid {running.read_text().strip()}) is running on {self.dir.root}; "
                                    "wait for it or stop it with Ctrl-C first")
        lock = self.dir.root / ".lock"
        if not lock.exists():
            return
        with open(lock) as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise SandboxUsageError(f"a sandbox engine is running on {self.dir.root} (pid in engine.pid); "
                                        "wait for it or stop it with Ctrl-C first") from None
            fcntl.flock(handle, fcntl.LOCK_UN)

    # -- up --

    def up(self, topology: str | None = None, echo: bool = True, config: Mapping[str, str] | None = None,
           hub_bytes_per_second: float | None = None, timeline: bool = True, kernel_cache: bool | None = None) -> int:
        """`config`: kimi-cluster keys (no namespace) over Pulumi.sandbox.yaml, kept for later runs of this workdir;
        `timeline`: draw timeline.png once the stack is up (matplotlib: about 1.5 CPU-seconds);
        `kernel_cache`: False deploys without the kernel-cache bucket and so without the cache steps, True with
        them; kept for later runs of this workdir (None: as recorded, with them in a new workdir)."""
        self.dir.claim(create=True)
        with self.dir.exclusive():
            return self._up(topology, echo, config, hub_bytes_per_second, timeline, kernel_cache)

    def _up(self, topology: str | None, echo: bool, config: Mapping[str, str] | None,
            hub_bytes_per_second: float | None, timeline: bool, kernel_cache: bool | None) -> int:
        started = time.monotonic()
        self._ensure_idle()
        record = self.dir.record()
        if config:
            record["config"] = {**(record.get("config") or {}), **config}
        if kernel_cache is not None:
            record["kernel_cache"] = kernel_cache
        deployed = bool(self.resources())
        chosen = topology or record.get("topology") or TOPOLOGIES[0]
        if deployed and record.get("topology") and chosen != record["topology"]:
            raise SandboxUsageError(
                f"the sandbox in {self.dir.root} runs {record['topology']}; destroy it first "
                f"(python -m scripts.sandbox destroy) or use another --workdir for {chosen}")
        if chosen not in TOPOLOGIES:
            raise SandboxUsageError(f"--topology must be one of {', '.join(TOPOLOGIES)}, not {chosen!r}")
        settings = stack_settings(chosen, record.get("config"))
        record["topology"] = chosen
        # How this sandbox runs node commands, for tools that reach the nodes (scripts.status --node-exec).
        self.dir.root.mkdir(parents=True, exist_ok=True)
        (self.dir.root / "node-exec.json").write_text(json.dumps(self.node_execution(settings).to_json()) + "\n")
        self.say(f"sandbox up: {chosen} ({settings.nodes} fake node{'s' if settings.nodes > 1 else ''}, "
                 f"{settings.engine_name}) in {self.dir.root}, under "
                 f"{'the Pulumi CLI' if self.real else 'the sandbox engine'}")
        if self.real:
            self._ensure_fabric(settings)
        record["emulator_url"], record["emulator_key"] = self._ensure_emulator(record)
        record["hub_url"] = self._ensure_hub(record, settings, hub_bytes_per_second)
        if record.get("kernel_cache", True):
            record["kernel_store_url"] = self._ensure_kernel_store(record)
        else:
            # No kimi-cluster:kernelCache (_cluster_engine), so no cache steps; a bucket an earlier up started keeps
            # its objects and stops with destroy.
            record.pop("kernel_store_url", None)
        _choose_ports(record)
        # The key is in secrets/, not in the record; it is added back for the engine run only.
        key = record.pop("emulator_key")
        self.dir.save_record(record)
        engine = self._cluster_engine({**record, "emulator_key": key}, settings)
        services_s = time.monotonic() - started

        result: dict[str, Any] | None
        if self.real:
            result, log = self._cli_up(engine, echo), ""
        else:
            result, log = self._run("up", engine, echo)
        elapsed = time.monotonic() - started
        if result is None or result.get("interrupted"):
            self._tail(log, echo)
            where = "the stack's checkpoint" if self.real else str(self.dir.state_path)
            self.say(f"sandbox up: stopped after {elapsed:.1f} s; what was done is in {where}: "
                     "run up again to resume, or destroy")
            return EXIT_INTERRUPTED
        if not result.get("ok"):
            for reason in [*(result.get("failures") or []), result.get("error")]:
                if reason:
                    self.say(f"FAILED: {reason}")
            self.say(f"sandbox up: failed after {elapsed:.1f} s; fix and run up again (it resumes), or destroy")
            return EXIT_FAILED
        outputs, secret_names = self.outputs()
        self.say("")
        self.say("Stack outputs:")
        self.say(format_outputs(outputs, secret_names))
        if timeline:
            self._draw_timeline(chosen)
        counts = result.get("counts") or {}
        self.say(f"sandbox up: {chosen} ready in {elapsed:.1f} s (services {services_s:.1f} s); "
                 f"{counts.get('create', 0)} created, {counts.get('same', 0)} unchanged. "
                 "Next: python -m scripts.sandbox verify")
        return EXIT_OK

    def _draw_timeline(self, topology: str) -> None:
        """The bring-up as a picture, from the step marks in the commands' stdout (as from a real stack's export)."""
        from components.timeline import write_timeline

        out = self.dir.root / "timeline.png"
        try:
            with self.state_document() as state:
                bars = write_timeline(json.loads(state.read_text()), str(out), f"sandbox {topology} bring-up")
        except ImportError as exc:  # matplotlib is in requirements-timeline.txt, not requirements.txt
            self.say(f"timeline: not drawn ({exc.name or 'matplotlib'} is not installed: "
                     ".venv/bin/pip install -r requirements-timeline.txt, or up --no-timeline)")
            return
        except (OSError, ValueError) as exc:
            self.say(f"timeline: not drawn ({type(exc).__name__}: {exc})")
            return
        if bars:
            self.say(f"timeline: {out} ({len(bars)} steps on {len({b.row for b in bars})} nodes)")

    # -- verify --

    def verify(self, echo: bool = False) -> int:
        self.dir.claim(create=False)
        with self.dir.exclusive():
            return self._verify(echo)

    def _verify(self, echo: bool) -> int:
        started = time.monotonic()
        outputs, _ = self.outputs()
        if not outputs.get("endpoint_url"):
            raise SandboxUsageError(f"no endpoint in {self.dir.state_path}: run python -m scripts.sandbox up first")
        self.say(f"sandbox verify: the verification stack against {outputs['endpoint_url']} "
                 f"({outputs.get('served_model_name')})")
        if self.real:
            return self._cli_verify(started, echo)
        engine = EngineSettings(
            project_dir=VERIFICATION_DIR, stack=STACK, workdir=self.dir.verification,
            config_overrides={
                f"{VERIFY_NS}:clusterStack": CLUSTER_REF,
                # A new run id re-runs every check: verify answers for the endpoint as it is now.
                f"{VERIFY_NS}:runId": str(time.time_ns()),
                f"{VERIFY_NS}:timeoutSeconds": str(VERIFY_REQUEST_TIMEOUT_S),
            },
            stack_references={CLUSTER_REF: str(self.dir.root)},
            operation_timeout=OPERATION_TIMEOUT_S, deadline=VERIFY_DEADLINE_S,
        )
        result, log = self._run("up", engine, echo)
        elapsed = time.monotonic() - started
        if result is None:
            self._tail(log, echo)
            self.say(f"sandbox verify: stopped after {elapsed:.1f} s")
            return EXIT_INTERRUPTED
        if not result.get("ok"):
            # The stack's resource failed, naming each failed required check and why: one line each.
            for reason in [*(result.get("failures") or []), result.get("error")]:
                if reason:
                    self.say("  " + "\n    ".join(reason.splitlines()[0].split("; ")))
            self.say(f"sandbox verify: FAILED after {elapsed:.1f} s (the whole log: verify --verbose)")
            return EXIT_FAILED
        verified = plain_outputs(read_outputs(self.dir.verification / "state.json"))[0]
        self.say(format_report(verified.get("verification_report") or []))
        ok = bool(verified.get("verified"))
        self.say(f"sandbox verify: {'PASSED' if ok else 'FAILED'} in {elapsed:.1f} s; verified_endpoint_url = "
                 f"{verified.get('verified_endpoint_url')}")
        return EXIT_OK if ok else EXIT_FAILED

    def _cli_verify(self, started: float, echo: bool) -> int:
        """The verification stack under the real CLI: its StackReference reads the cluster stack's outputs."""
        config = {
            f"{VERIFY_NS}:clusterStack": CLUSTER_REF,
            # A new run id re-runs every check: verify answers for the endpoint as it is now.
            f"{VERIFY_NS}:runId": str(time.time_ns()),
            f"{VERIFY_NS}:timeoutSeconds": str(VERIFY_REQUEST_TIMEOUT_S),
        }
        result = self.cli.up(self.cli.verification, None, config, {}, echo=echo, timeout=VERIFY_DEADLINE_S)
        elapsed = time.monotonic() - started
        if result.get("interrupted"):
            self.say(f"sandbox verify: stopped after {elapsed:.1f} s")
            return EXIT_INTERRUPTED
        if not result.get("ok"):
            for reason in result.get("failures") or []:
                self.say("  " + "\n    ".join(reason.splitlines()[0].split("; ")))
            self.say(f"sandbox verify: FAILED after {elapsed:.1f} s (the whole log: verify --verbose)")
            return EXIT_FAILED
        verified = self.cli.outputs(self.cli.verification)[0]
        self.say(format_report(verified.get("verification_report") or []))
        ok = bool(verified.get("verified"))
        self.say(f"sandbox verify: {'PASSED' if ok else 'FAILED'} in {elapsed:.1f} s; verified_endpoint_url = "
                 f"{verified.get('verified_endpoint_url')}")
        return EXIT_OK if ok else EXIT_FAILED

    # -- status --

    def node_execution(self, settings: Settings) -> NodeExecution:
        """How this sandbox runs node commands: the setting its engine runs the node steps with."""
        return NodeExecution(self.dir.nodes, node_path(), node_env(settings))

    def status(self, as_json: bool = False, watch: float | None = None) -> int:
        """`python -m scripts.status` against this sandbox: its state file, its node setting, its emulator."""
        from components.stack_state import load_state_file
        from components.status_report import run

        record = self.dir.record()
        deployed = self.cli.checkpoint_path(self.cli.cluster).exists() if self.real else self.dir.state_path.exists()
        if not deployed or not record:
            raise SandboxUsageError(f"nothing deployed in {self.dir.root}: run python -m scripts.sandbox up first")
        overrides = {**(record.get("config") or {}), "apiPort": str(record.get("api_port") or 8000),
                     "enginePort": str(record.get("engine_port") or 30000)}
        settings = stack_settings(record.get("topology") or TOPOLOGIES[0], overrides)
        key = (os.environ.get("HYPERSTACK_API_KEY") or DEFAULT_API_KEY) if record.get("external_emulator") \
            else self.dir.secret("hyperstack_api_key", _emulator_key)
        api = _api(record["emulator_url"], key) if record.get("emulator_url") else None
        if self.real:
            # As for a real stack: its export, with secrets, and OpenSSH to each node with the pinned host key.
            from components.node_exec import SshRunner

            def load() -> Any:
                with self.state_document() as state:
                    return load_state_file(state, STACK)

            return run(load, settings, SshRunner(), api, as_json=as_json, watch=watch, out=self.out)
        return run(lambda: load_state_file(self.dir.state_path, STACK), settings, self.node_execution(settings), api,
                   as_json=as_json, watch=watch, out=self.out)

    # -- reclaim (sandbox/reclaim.py) --

    def reclaim(self, node: str, mode: str = "delete") -> int:
        """The cloud takes the VM named `node` (or with that address) away; the state is not told."""
        from sandbox import reclaim

        record = self.dir.record()
        outputs, _ = self.outputs()
        addresses = reclaim.node_addresses(outputs)
        name = next((n for n, a in addresses.items() if node in (n, a)), None)
        if name is None or not record.get("emulator_url"):
            raise SandboxUsageError(f"no VM {node!r} in the sandbox in {self.dir.root}; its VMs: "
                                    f"{', '.join(f'{n} ({a})' for n, a in addresses.items()) or 'none'}")
        started = time.monotonic()
        try:
            answer = reclaim.ask_emulator(record["emulator_url"], name, mode)
        except (RuntimeError, OSError) as exc:  # a VM already gone, an emulator that is not running
            raise SandboxUsageError(f"cannot reclaim {name}: {exc}") from None
        # Under the real CLI the emulator ends the VM's namespace itself; an ERROR VM keeps it, so end it here.
        killed = [] if self.real and mode == "delete" else reclaim.kill_node(self.dir.nodes / addresses[name])
        self.say(f"reclaimed {name} ({addresses[name]}, VM {answer.get('id')}): the emulator "
                 f"{'deletes it' if mode == 'delete' else 'shows it in ERROR'}, {len(killed)} node processes killed, "
                 f"in {time.monotonic() - started:.2f} s")
        return 0

    # -- destroy --

    def destroy(self, echo: bool = True) -> int:
        self.dir.claim(create=False)
        with self.dir.exclusive():
            return self._destroy(echo)

    def _destroy(self, echo: bool) -> int:
        started = time.monotonic()
        self._ensure_idle()
        record = self.dir.record()
        problems: list[str] = []
        if not record and not self.resources():
            self.say(f"sandbox destroy: nothing deployed in {self.dir.root}")
            problems += self._stop_node_processes()
            return self._finish_destroy(problems, started)
        topology = record.get("topology") or TOPOLOGIES[0]
        settings = stack_settings(topology, record.get("config"))
        # Deleting needs the API (a fresh emulator if ours died: it holds nothing, so each delete finds nothing).
        record["emulator_url"], key = self._ensure_emulator(record)
        record.setdefault("hub_url", "http://127.0.0.1:9")
        record.setdefault("api_port", 8000)
        record.setdefault("engine_port", 30000)
        record.setdefault("peer_port", 20100)
        self.dir.save_record(record)
        api = _api(record["emulator_url"], key)

        problems += self._destroy_verification(echo)
        # A VM whose create an interrupted up never recorded would block the environment's deletion: delete it first.
        problems += self._delete_unrecorded_vms(api, settings)
        if not problems:
            engine = self._cluster_engine({**record, "emulator_key": key}, settings)
            result: dict[str, Any] | None
            if self.real:
                result, log = self.cli.destroy(self.cli.cluster, echo=echo, timeout=UP_DEADLINE_S), ""
                if result.get("ok") and self.resources():
                    result = {"ok": False, "failures": [f"the stack still holds {len(self.resources())} resources"]}
            else:
                result, log = self._run("destroy", engine, echo)
            if result is None or result.get("interrupted"):
                self._tail(log, echo)
                self.say("sandbox destroy: stopped; what is left is still in the state file: run destroy again")
                return EXIT_INTERRUPTED
            if not result.get("ok"):
                problems += [f for f in result.get("failures") or []] or [result.get("error") or "the engine failed"]
            else:
                problems += self._delete_unrecorded_environment(api, settings)
        left = self._emulator_leftovers(api, settings, external=record.get("external_emulator", False))
        if left:
            problems.append("the emulator still holds: " + "; ".join(left))
        else:
            self.say("emulator: nothing left" + (f" of {settings.env_name}" if record.get("external_emulator") else ""))
        # On a real cloud the VMs' deletion ends what ran on them; fake nodes are this machine, so end it here.
        problems += self._stop_node_processes()
        if not problems:
            problems += self._stop_services(record)
            if not problems:
                self._forget(record)
                kept = sum(1 for p in self.dir.kernel_store.rglob("*") if p.is_file()) \
                    if self.dir.kernel_store.exists() else 0
                if kept:
                    self.say(f"kept the kernel-cache bucket's {kept} objects in {self.dir.kernel_store}: it stands "
                             "for your own bucket, which outlives the cluster; the next up restores from it "
                             "(delete that folder to start cold)")
        return self._finish_destroy(problems, started)

    def _finish_destroy(self, problems: list[str], started: float) -> int:
        elapsed = time.monotonic() - started
        for problem in problems:
            self.say(f"LEFT: {problem}")
        if problems:
            self.say(f"sandbox destroy: {len(problems)} problem(s) after {elapsed:.1f} s; run destroy again")
            return EXIT_FAILED
        self.say(f"sandbox destroy: everything is gone ({elapsed:.1f} s)")
        return EXIT_OK

    def _destroy_verification(self, echo: bool) -> list[str]:
        if self.real:
            done = self.cli.destroy(self.cli.verification, echo=False, timeout=VERIFY_DEADLINE_S)
            if not done.get("ok"):
                return ["the verification stack's destroy failed: " + "; ".join(done.get("failures") or [])]
            self.cli.forget(self.cli.verification)
            return []
        state = self.dir.verification / "state.json"
        if not state.exists():
            return []
        engine = EngineSettings(project_dir=VERIFICATION_DIR, stack=STACK, workdir=self.dir.verification,
                                config_overrides={f"{VERIFY_NS}:clusterStack": CLUSTER_REF},
                                operation_timeout=OPERATION_TIMEOUT_S, deadline=VERIFY_DEADLINE_S)
        result, log = self._run("destroy", engine, False)
        if result is None or not result.get("ok"):
            return [f"the verification stack's destroy failed:\n{log}"]
        return []

    def _delete_unrecorded_vms(self, api: Any, settings: Settings) -> list[str]:
        from components.hyperstack.vm_lifecycle import delete_vm_and_wait

        recorded = {str(r.get("id")) for r in self.resources() if r.get("type", "").endswith(":VirtualMachine")}
        ours = {settings.node_name(rank) for rank in range(settings.nodes)}
        problems = []
        try:
            vms = api.list_vms(environment=settings.env_name)
        except Exception as exc:  # noqa: BLE001 - an unreachable API is reported, not raised
            return [f"cannot list the VMs of {settings.env_name}: {exc}"]
        for vm in vms:
            labels = set(vm.get("labels") or [])
            if str(vm["id"]) in recorded or vm.get("name") not in ours or f"stack-{STACK}" not in labels:
                continue
            what = f"VM {vm['name']!r} (id {vm['id']})"
            self.say(f"deleting {what}: an interrupted up created it but never recorded it")
            try:
                delete_vm_and_wait(api, vm["id"], what, 120.0, 0.5)
            except Exception as exc:  # noqa: BLE001 - one VM that will not go must not keep the rest alive
                problems.append(f"{what} could not be deleted: {exc}")
        return problems

    def _delete_unrecorded_environment(self, api: Any, settings: Settings) -> list[str]:
        """After a clean destroy, our keypair and environment can only be ones an interrupted up never recorded."""
        problems = []
        try:
            for kp in api.list_keypairs():
                if kp.get("name") == f"{settings.env_name}-key" and \
                        (kp.get("environment") or {}).get("name") == settings.env_name:
                    self.say(f"deleting keypair {kp['name']!r}: an interrupted up created it but never recorded it")
                    api.delete_keypair(kp["id"])
            for env in api.list_environments():
                if env.get("name") == settings.env_name:
                    self.say(f"deleting environment {env['name']!r}: an interrupted up created it but never "
                             "recorded it")
                    api.delete_environment(env["id"])
        except Exception as exc:  # noqa: BLE001 - destroy reports what it could not clean up and goes on
            problems.append(f"cannot clean up {settings.env_name}: {exc}")
        return problems

    def _emulator_leftovers(self, api: Any, settings: Settings, external: bool) -> list[str]:
        """Everything in our emulator, or (in someone else's) everything of our environment."""
        try:
            envs = api.list_environments()
            keypairs = api.list_keypairs()
            vms = api.list_vms()
        except Exception as exc:  # noqa: BLE001 - an emulator that cannot answer is a finding, not a crash
            return [f"the emulator cannot be asked ({exc})"]
        if external:
            envs = [e for e in envs if e.get("name") == settings.env_name]
            keypairs = [k for k in keypairs if (k.get("environment") or {}).get("name") == settings.env_name]
            vms = [v for v in vms if (v.get("environment") or {}).get("name") == settings.env_name]
        left = [f"environment {e.get('name')}" for e in envs]
        left += [f"keypair {k.get('name')}" for k in keypairs]
        left += [f"VM {v.get('name')} ({v.get('status')})" for v in vms]
        return left

    def _stop_node_processes(self) -> list[str]:
        if self.real:
            # Every VM's deletion ended its namespace; a namespace left (an emulator that died) ends here.
            config = self.fabric()
            if config is not None:
                fabric = Fabric(config)
                for namespace in fabric.namespaces():
                    self.say(f"stopping a fake node the emulator left running: {namespace}")
                return [p for n in fabric.namespaces() for p in fabric.end_namespace(n)]
        if not self.dir.nodes.exists():
            return []
        pids = services.processes_under(self.dir.nodes)
        if not pids:
            return []
        for pid in pids:
            self.say(f"stopping what a fake node left running: {services.describe(pid)}")
        left = services.terminate(pids)
        return [f"node process {services.describe(pid)} did not stop" for pid in left]

    def _forget(self, record: Mapping[str, Any]) -> None:
        """A destroyed VM's disks are gone: the next up starts from blank nodes and fresh secrets."""
        import shutil

        if self.real:
            self.cli.forget(self.cli.cluster)
            for problem in self._teardown_fabric():
                self.say(f"LEFT: {problem}")
            for name in ("state", "pulumi-home", "sshd"):
                shutil.rmtree(self.dir.root / name, ignore_errors=True)
        shutil.rmtree(self.dir.nodes, ignore_errors=True)
        shutil.rmtree(self.dir.secrets_dir, ignore_errors=True)
        self.dir.record_path.unlink(missing_ok=True)


@contextlib.contextmanager
def _environment_set(name: str, value: str | None) -> Iterator[None]:
    """`name=value` in this process's environment (inherited by children) for the block; unchanged if value is None."""
    if value is None:
        yield
        return
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


def _loopback_url(url: str) -> bool:
    import ipaddress
    from urllib.parse import urlsplit

    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _api(url: str, key: str) -> Any:
    from components.hyperstack.api import HyperstackClient

    return HyperstackClient(url, key, retry_base_seconds=0.2)


# ---- printing ----------------------------------------------------------------------------------------------------


def format_outputs(outputs: Mapping[str, Any], secret_names: frozenset[str] | set[str]) -> str:
    width = max((len(k) for k in outputs), default=0)
    lines = []
    for key in sorted(outputs):
        value = outputs[key]
        if key in secret_names:
            text = "[secret]"
        elif isinstance(value, (dict, list)):
            text = json.dumps(value)
            if len(text) > 160:
                text = (f"{{{', '.join(value)}}}" if isinstance(value, dict) else f"[{len(value)} items]") + \
                    " (whole value: the stack's state.json)"
        elif isinstance(value, str) and "\n" in value.strip():
            # A PEM certificate: its first line says what it is; the whole value is one stack output away.
            text = f"{value.strip().splitlines()[0]} ... ({len(value.strip().splitlines())} lines; whole value: " \
                   "the stack's state.json)"
        else:
            text = str(value)
        lines.append(f"  {key:<{width}}  {text}")
    return "\n".join(lines)


def format_report(report: list[Mapping[str, Any]]) -> str:
    lines = [f"  {'check':<19} {'result':<6} {'latency':>8}  detail", f"  {'-' * 19} {'-' * 6} {'-' * 8}  {'-' * 40}"]
    for row in report:
        status = "PASS" if row.get("passed") else ("FAIL" if row.get("required", True) else "fail")
        lines.append(f"  {row.get('name', '?'):<19} {status:<6} {float(row.get('latency_s') or 0):7.2f}s  "
                     f"{row.get('detail', '')}")
    return "\n".join(lines)
