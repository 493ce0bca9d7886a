"""What the sandbox's fake nodes look like (their disks, GPUs, addresses and the engine their docker stub starts),
the stack settings they are shaped by, and the network they sit on: a bridge and a /24 of this sandbox, each VM a
network namespace with sshd (kimi_cluster/fakes/node_fabric.py), and the https certificate of the fake hub on that
bridge.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from kimi_cluster.fakes.node.engine_hook import model_infos_folder
from kimi_cluster.fakes.node_fabric import CDN_NAME, Fabric, FabricConfig, FabricError, allocate
from kimi_cluster.settings import Settings
from kimi_cluster.settings.loader import load_settings, read_stack_file

from .workdir import SandboxUsageError, Workdir

REPO_ROOT = Path(__file__).resolve().parents[2]
NODE_BIN = REPO_ROOT / "kimi_cluster" / "fakes" / "node" / "bin"
ENGINE_HOOK = REPO_ROOT / "kimi_cluster" / "fakes" / "node" / "engine_hook.py"
STACK = "sandbox"
# How long the fake engine "compiles" when its kernel cache is empty.
FAKE_COMPILE_SECONDS = 30
# The option that sets that compile time: the fake engine's own variable, a FAKE_* knob, so the caller's
# environment wins over FAKE_COMPILE_SECONDS (node_env). `sandbox up` and the kernel-cache bench keep the 30 s
# (README "The sandbox", "Kernel cache"); the tests set 0 except in their kernel-cache flows (tests/sandbox/).
COMPILE_SECONDS_KNOB = "FAKE_ENGINE_COMPILE_SECONDS"
# Free space the fake disks report: the checkpoint (1.56 TB) plus the margin must fit, as on the real flavors.
FAKE_DISK_BYTES = 4 * 10**12


def stack_settings(topology: str, overrides: Mapping[str, str] | None = None) -> Settings:
    """The validated settings of the sandbox stack for this topology (as the program will see them)."""
    raw, _ = read_stack_file(str(REPO_ROOT / f"Pulumi.{STACK}.yaml"))
    # The sandbox always passes its bucket's key pair as kimi-cluster:kernelCacheCredentials (secrets count as set).
    raw = {**raw, "topology": topology, **(overrides or {}), "kernelCacheCredentials": True, "caretakerApiKey": True}
    return load_settings(raw, STACK)


def node_env(settings: Settings, host_address: str, faults: Mapping[str, str] | None = None) -> dict[str, str]:
    """How the fake nodes look: their disks, GPUs, addresses, free space, and the engine the docker stub starts.

    FAKE_* variables of the caller's environment (`faults`, default os.environ) are passed on last: they are the
    fake node's fault knobs (kimi_cluster/fakes/node/__init__.py), e.g. FAKE_HANG=nvidia-smi for a driver that never
    answers.
    """
    disk = settings.storage_path.strip("/")
    no_proxy = ",".join(["127.0.0.1", "localhost", host_address, CDN_NAME])
    knobs = {k: v for k, v in (os.environ if faults is None else faults).items() if k.startswith("FAKE_")}
    return {
        "FAKE_NODE_DISKS": disk,
        "FAKE_DISK_AVAIL_BYTES": str(FAKE_DISK_BYTES),
        "FAKE_GPU_COUNT": str(settings.gpus_per_node_count),
        "FAKE_GPU_NAME": f"NVIDIA {settings.gpu.name}",
        # Each node's private interface holds its own address on the fabric (the stub expands the variable per
        # node).
        "FAKE_IP_ADDRS": "lo=127.0.0.1/8,ens6=${SANDBOX_NODE_HOST}/24,docker0=172.17.0.1/16",
        "FAKE_DOCKER_RUN_HOOK": str(ENGINE_HOOK),
        # The real vLLM the front's render server runs (the resuming layer, replicas >= 2 with vLLM).
        "FAKE_VLLM": str(real_vllm()),
        # What that vLLM learnt of the model's class, kept across the sandbox's nodes (engine_hook.py's
        # share_model_infos): else each fresh node's render server imports torch once more to learn it again.
        "FAKE_VLLM_MODEL_INFOS": str(host_vllm_model_infos()),
        # The Python with SGLang 0.5.23 that runs the front's chat layer on SGLang replicas.
        "FAKE_SGLANG_PYTHON": str(real_sglang_python()),
        # The fake engine compiles this long when the kernels it needs are not in its cache folder.
        COMPILE_SECONDS_KNOB: str(FAKE_COMPILE_SECONDS),
        # The hub and the bucket are on the fabric's bridge: a proxy from the caller's environment must not get in
        # the way.
        "NO_PROXY": no_proxy,
        "no_proxy": no_proxy,
        **knobs,
    }


def parsers_vllm() -> Path:
    """The `vllm` of the engines' parsers venv (tests/engine_parsers/install.sh; KIMI_PARSERS_VENV names another)."""
    return Path(os.environ.get("KIMI_PARSERS_VENV") or REPO_ROOT / ".venv-parsers") / "bin" / "vllm"


# What installs that venv, and what it costs (docs/development.md, "The two commands, in detail": measured there).
VLLM_INSTALL = "bash tests/engine_parsers/install.sh"
VLLM_INSTALL_COST = "about 9.6 GB, 7 minutes from a cold pip cache on 2 cores"


def real_vllm() -> Path:
    """The `vllm` executable whose `vllm launch render` the fake docker runs as the front's render server
    (kimi_cluster/fakes/node/engine_hook.py reads it as FAKE_VLLM): FAKE_VLLM from the caller's environment, as
    every FAKE_* knob reaches the nodes, else the parsers venv's."""
    return Path(os.environ.get("FAKE_VLLM") or parsers_vllm())


def host_vllm_model_infos() -> Path:
    """The model-info folder of this machine's vLLM cache, found as the fake nodes' hook finds a node's."""
    return model_infos_folder(os.environ)


def real_sglang_python() -> Path:
    """The Python with SGLang 0.5.23 that the fake docker runs SGLang's chat layer with (FAKE_SGLANG_PYTHON, else
    the parsers venv's)."""
    return Path(os.environ.get("FAKE_SGLANG_PYTHON") or parsers_vllm().parent / "python")


def render_server_problem(settings: Settings) -> str | None:
    """Why these settings cannot come up in the sandbox, said before anything starts: a front that resumes streams
    (replicas >= 2 with vLLM or SGLang) runs the engine's own chat layer, which needs the parsers venv; else None."""
    if not settings.resumes_streams:
        return None
    if settings.engine_name == "sglang":
        python = real_sglang_python()
        if python.is_file() and os.access(python, os.X_OK):
            return None
        return (f"replicas={settings.replicas} with SGLang: the front resumes streams with SGLang's own chat layer, "
                f"which the sandbox runs with SGLang 0.5.23, and there is no Python at {python}. Install it with "
                f"`{VLLM_INSTALL}` ({VLLM_INSTALL_COST}; KIMI_PARSERS_VENV or FAKE_SGLANG_PYTHON names another)")
    vllm = real_vllm()
    if vllm.is_file() and os.access(vllm, os.X_OK):
        return None
    return (f"replicas={settings.replicas} with vLLM: the front resumes streams with vLLM's own render server, "
            f"which the sandbox runs from a real vLLM, and there is none at {vllm}. Install it with "
            f"`{VLLM_INSTALL}` (vLLM 0.33.0 with torch in .venv-parsers; {VLLM_INSTALL_COST}; KIMI_PARSERS_VENV "
            "or FAKE_VLLM names another)")


def node_path() -> tuple[str, ...]:
    # The stubs, then this interpreter's bin: the node scripts' python3 must be one with huggingface_hub installed.
    return (str(NODE_BIN), str(Path(sys.executable).parent))


class NodeNetwork:
    """The fabric of one workdir (fabric.json): made once, its nodes' environment rewritten on every up."""

    def __init__(self, workdir: Workdir, say: Callable[[str], None]) -> None:
        self.workdir = workdir
        self.say = say

    @property
    def path(self) -> Path:
        return self.workdir.root / "fabric.json"

    def config(self) -> FabricConfig | None:
        return FabricConfig.load(self.path) if self.path.exists() else None

    def ensure(self, settings: Settings) -> FabricConfig:
        """This sandbox's bridge and /24 (made if missing), with the nodes' environment for these settings."""
        config = self.config()
        if config is None or not Fabric(config).bridge_up():
            try:
                config = allocate(self.workdir.nodes, node_path(), {})
            except FabricError as exc:
                raise SandboxUsageError(str(exc)) from None
            self.path.write_text(json.dumps(config.to_json(), indent=2) + "\n")  # at once: a kill now leaves it known
            self.say(f"made the fake nodes' network: bridge {config.bridge}, {config.subnet} (this machine is "
                     f"{config.host_address}; each VM a namespace with sshd)")
        ca = self.hub_tls(config)[2]
        env = {**node_env(settings, config.host_address),
               # The hub is https on the bridge (a token never crosses a network in clear): the nodes trust its CA,
               # as a machine trusts a mirror's private CA (OpenSSL's and requests' variables).
               "SSL_CERT_FILE": str(ca), "REQUESTS_CA_BUNDLE": str(ca)}
        before = config
        config = FabricConfig(config.id, config.subnet, config.nodes_dir, node_path(), env)
        self.path.write_text(json.dumps(config.to_json(), indent=2) + "\n")
        if (before.env, tuple(before.path)) != (config.env, tuple(config.path)):
            # Nodes an earlier up started (another checkout's: an upgrade) run what this one's environment says.
            Fabric(config).refresh_env()
        return config

    def hub_tls(self, fabric: FabricConfig) -> tuple[Path, Path, Path]:
        """(certificate, key, CA) of the hub's https, for the bridge's address and the CDN name; made per fabric."""
        from kimi_cluster.deploy.tls import make_ca, make_server_certificate

        where = self.workdir.secrets_dir / "hub-tls"
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

    def end_leftover_nodes(self) -> list[str]:
        """Every VM's deletion ended its namespace; one left (an emulator that died) ends here, and so do the Pulumi
        plugins of a run that was killed (their PULUMI_HOME is this workdir's; nothing else ends them)."""
        from kimi_cluster.fakes import sandbox_services as services

        problems = []
        strays = services.processes_with_env("PULUMI_HOME", self.workdir.root)
        if strays:
            self.say(f"stopping {len(strays)} Pulumi process(es) an interrupted run left: "
                     + "; ".join(services.describe(p) for p in strays[:3]))
            problems += [f"{services.describe(p)} did not stop" for p in services.terminate(strays, timeout=5)]
        config = self.config()
        if config is None:
            return problems
        fabric = Fabric(config)
        for namespace in fabric.namespaces():
            self.say(f"stopping a fake node the emulator left running: {namespace}")
            problems += fabric.end_namespace(namespace)
        return problems

    def teardown(self) -> list[str]:
        config = self.config()
        if config is None:
            return []
        problems = Fabric(config).teardown()
        if not problems:
            self.path.unlink(missing_ok=True)
            self.say(f"removed the fake nodes' network ({config.bridge}, {config.subnet})")
        return problems
