"""The kimi-cluster sandbox: `up`, `verify` and `destroy` of the real program on this machine, with no account or GPU.

It starts the fakes as detached services (services.py), drives the real Pulumi CLI through the README's sequence
(cli_stacks.py), and on destroy proves that nothing is left behind (leftovers.py).
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from kimi_cluster.fakes import sandbox_services as services
from kimi_cluster.settings import NAMESPACE

from . import leftovers
from .cli_stacks import CliStacks
from .nodes import STACK, NodeNetwork, render_server_problem, stack_settings
from .printing import format_outputs, format_report
from .services import (
    CARETAKER_TIMING,
    KERNEL_BUCKET,
    SandboxServices,
    _choose_ports,
)
from .workdir import (
    DEFAULT_WORKDIR,
    SandboxUsageError,
    Workdir,
    emulator_key,
    hf_token,
    new_ssh_private_key,
    ssh_public_key_of,
)

__all__ = ["DEFAULT_WORKDIR", "EXIT_USAGE", "TOPOLOGIES", "Sandbox", "SandboxUsageError"]

REPO_ROOT = Path(__file__).resolve().parents[2]
CLUSTER_REF = f"organization/kimi-cluster/{STACK}"
VERIFY_NS = "kimi-cluster-verification"
TOPOLOGIES = ("h100x4-sglang", "b300x1-vllm", "b300x1-tokenspeed", "custom")  # custom: shape keys with --config

# Deadlines of the CLI runs: every node step has its own, shorter ones from the stack config.
UP_DEADLINE_S = 1800.0
VERIFY_DEADLINE_S = 900.0
VERIFY_REQUEST_TIMEOUT_S = 60

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class Sandbox:
    """One sandbox in one workdir. Methods return an exit code and print what a user needs to see."""

    def __init__(self, workdir: str | Path = DEFAULT_WORKDIR, out: TextIO | None = None) -> None:
        self.dir = Workdir(Path(workdir).resolve())
        self.out = out or sys.stdout
        self.cli = CliStacks(self.dir.root, self.dir.secrets_dir, self.out)
        self.network = NodeNetwork(self.dir, self.say)
        self.services = SandboxServices(self.dir, self.network, self.say)

    def say(self, text: str = "") -> None:
        self.out.write(text + "\n")
        self.out.flush()

    # -- the stack, as the CLI keeps it --

    def resources(self) -> list[dict[str, Any]]:
        """What the cluster's checkpoint holds (the stack itself excluded)."""
        return self.cli.resources(self.cli.cluster)

    def outputs(self) -> tuple[dict[str, Any], frozenset[str]]:
        """(the cluster stack's outputs in plain text, the names of the secret ones)."""
        return self.cli.outputs(self.cli.cluster)

    def public_outputs(self) -> tuple[dict[str, Any], frozenset[str]]:
        """(the cluster stack's outputs with each secret one None, the names of those), read with no CLI start."""
        return self.cli.public_outputs(self.cli.cluster)

    @property
    def checkpoint_path(self) -> Path:
        """The file backend's checkpoint of the cluster stack, written after every resource operation: its
        `latest.resources` name each by URN."""
        return self.cli.checkpoint_path(self.cli.cluster)

    def hub_ca(self) -> Path | None:
        """The CA file that the fake hub's https certificate chains to (None before the first up)."""
        fabric = self.network.config()
        return self.network.hub_tls(fabric)[2] if fabric is not None else None

    def state_document(self) -> Any:
        """A context manager: a file holding the deployment with its secrets, as `pulumi stack export
        --show-secrets` gives it (0600, removed afterwards)."""
        return self.cli.export_file(self.cli.cluster)

    # -- the cluster stack's config --

    def _stack_config(self, record: Mapping[str, Any], key: str) -> tuple[dict[str, str], dict[str, str]]:
        """(plain config, secret config) of the cluster stack: what is only known at run time over
        Pulumi.sandbox.yaml, as `pulumi config set` (secrets with --secret) puts it in."""
        fabric = self.network.config()
        assert fabric is not None, "the fake nodes' network comes first"
        config = {
            **{f"{NAMESPACE}:{k}": v for k, v in (record.get("config") or {}).items()},
            f"{NAMESPACE}:topology": record["topology"],
            f"{NAMESPACE}:apiPort": str(record["api_port"]),
            f"{NAMESPACE}:enginePort": str(record["engine_port"]),
            f"{NAMESPACE}:peerPort": str(record["peer_port"]),
            f"{NAMESPACE}:hfEndpoint": record["hub_url"],
            "hyperstack:apiUrl": record["emulator_url"],
            # The operator is this machine, at its address on the bridge.
            f"{NAMESPACE}:operatorCidr": f"{fabric.host_address}/32",
        }
        # A real key, which every fake node's sshd takes (the emulator puts the keypair's public key in its
        # authorized_keys).
        ssh_key = self.dir.secret("ssh_private_key_ed25519", new_ssh_private_key)
        # `up --config sshPublicKey=...` keeps the keypair's key while sshPrivateKey rotates (the VMs were created
        # with it; the new key is added to their authorized_keys by hand, as on a real cluster).
        config.setdefault(f"{NAMESPACE}:sshPublicKey", ssh_public_key_of(ssh_key))
        # The caretaker (used only with idleStopMinutes or budgetUsd): the emulator on the bridge, the short clock.
        port = record["emulator_url"].rsplit(":", 1)[1].split("/", 1)[0]
        config[f"{NAMESPACE}:caretakerApiUrl"] = f"http://{fabric.host_address}:{port}/v1"  # always its own
        config.setdefault(f"{NAMESPACE}:caretakerTiming", CARETAKER_TIMING)
        secret_config = {
            f"{NAMESPACE}:sshPrivateKey": ssh_key,
            f"{NAMESPACE}:hfToken": self.dir.secret("hf_token", hf_token),
            "hyperstack:apiKey": key,
            # The emulator knows one key: the caretaker's is the same one here (on a real stack, make a second).
            f"{NAMESPACE}:caretakerApiKey": key,
        }
        # The sandbox's own bucket, unless `up --config kernelCache=...` named another store.
        if record.get("kernel_store_url") and self.dir.secret_path("kernel_cache_credentials").exists():
            config.setdefault(f"{NAMESPACE}:kernelCache", json.dumps({
                "bucket": KERNEL_BUCKET, "endpointUrl": record["kernel_store_url"], "addressingStyle": "path",
                "restoreTimeoutMinutes": 3, "saveTimeoutMinutes": 3}))
            secret_config[f"{NAMESPACE}:kernelCacheCredentials"] = \
                self.dir.secret_path("kernel_cache_credentials").read_text().strip()
        return config, secret_config

    def _ensure_idle(self) -> None:
        """Refuse while pulumi runs on this workdir: a destroy must not delete VMs an up is still creating."""
        running = self.dir.root / "pulumi.pid"
        pid = running.read_text().strip() if running.exists() else ""
        if pid.isdigit() and services.is_alive(int(pid)):
            raise SandboxUsageError(f"pulumi (pid {pid}) is running on {self.dir.root}; wait for it or stop it "
                                    "with Ctrl-C first")

    # -- up --

    def up(self, topology: str | None = None, echo: bool = True, config: Mapping[str, str] | None = None,
           hub_bytes_per_second: float | None = None, timeline: bool = True, kernel_cache: bool | None = None,
           expect_no_changes: bool = False, hub_slow_edges: float | None = None, preview: bool = True) -> int:
        """`config`: kimi-cluster keys (no namespace) over Pulumi.sandbox.yaml, kept for later runs of this workdir;
        `timeline`: draw timeline.png once the stack is up (matplotlib: about 1.5 CPU-seconds);
        `kernel_cache`: False deploys without the kernel-cache bucket and so without the cache steps, True with
        them; kept for later runs of this workdir (None: as recorded, with them in a new workdir);
        `expect_no_changes`: the same up of a deployed sandbox as `pulumi up --expect-no-changes`, every option
        honoured: what changed is applied, named, and ends in exit 1 (kimi_cluster/sandbox/refresh.py);
        `preview=False`: `pulumi up --skip-preview` (the program runs once instead of twice)."""
        self.dir.claim(create=not expect_no_changes)
        with self.dir.exclusive():
            return self._up(topology, echo, config, (hub_bytes_per_second, hub_slow_edges), timeline, kernel_cache,
                            expect_no_changes, preview)

    def _up(self, topology: str | None, echo: bool, config: Mapping[str, str] | None,
            hub_throttle: tuple[float | None, float | None], timeline: bool, kernel_cache: bool | None,
            expect_no_changes: bool = False, preview: bool = True) -> int:
        started = time.monotonic()
        self._ensure_idle()
        if expect_no_changes and not (self.checkpoint_path.exists() and self.dir.record()):
            raise SandboxUsageError(f"nothing deployed in {self.dir.root}: run kimi-cluster sandbox up first")
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
                f"(kimi-cluster sandbox destroy) or use another --workdir for {chosen}")
        if chosen not in TOPOLOGIES:
            raise SandboxUsageError(f"--topology must be one of {', '.join(TOPOLOGIES)}, not {chosen!r}")
        settings = stack_settings(chosen, record.get("config"))
        if (problem := render_server_problem(settings)) is not None:  # before any service, network or VM
            raise SandboxUsageError(f"{problem}, or deploy without resuming: --config resumeStreams=false")
        record["topology"] = chosen
        self.dir.root.mkdir(parents=True, exist_ok=True)
        self.say(f"sandbox up: {chosen} ({settings.nodes} fake node{'s' if settings.nodes > 1 else ''}, "
                 f"{settings.engine_name}) in {self.dir.root}, under the Pulumi CLI")
        fabric = self.network.ensure(settings)
        record["emulator_url"], key = self.services.emulator(record)
        record["hub_url"] = self.services.hub(record, settings, fabric.host_address, *hub_throttle)
        if record.get("kernel_cache", True):
            record["kernel_store_url"] = self.services.kernel_store(record, fabric.host_address)
        else:
            # No kimi-cluster:kernelCache (_stack_config), so no cache steps; a bucket an earlier up started keeps
            # its objects and stops with destroy.
            record.pop("kernel_store_url", None)
        _choose_ports(record)
        self.dir.save_record(record)
        stack_config, secret_config = self._stack_config(record, key)
        services_s = time.monotonic() - started

        stack = self.cli.cluster
        if self.cli.pending_operations(stack) or self.cli.locked(stack):
            self.say("the last up was interrupted (the checkpoint lists operations it did not finish): "
                     "pulumi cancel, pulumi refresh --clear-pending-creates, then up")
            self.cli.recover(stack)
        if expect_no_changes:
            from .changes import up_expecting_no_changes

            return up_expecting_no_changes(self.cli, self.say, REPO_ROOT / f"Pulumi.{STACK}.yaml", stack_config,
                                           secret_config)
        result = self.cli.up(stack, REPO_ROOT / f"Pulumi.{STACK}.yaml", stack_config, secret_config, echo=echo,
                             timeout=UP_DEADLINE_S, preview=preview)
        elapsed = time.monotonic() - started
        if result.get("interrupted"):
            self.say(f"sandbox up: stopped after {elapsed:.1f} s; what was done is in the stack's checkpoint: "
                     "run up again to resume, or destroy")
            return EXIT_INTERRUPTED
        if not result.get("ok"):
            for reason in result.get("failures") or []:
                self.say(f"FAILED: {reason}")
            self.say(f"sandbox up: failed after {elapsed:.1f} s; fix and run up again (it resumes), or destroy")
            return EXIT_FAILED
        outputs, secret_names = self.public_outputs()  # printed with each secret masked
        self.say("")
        self.say("Stack outputs:")
        self.say(format_outputs(outputs, secret_names))
        if timeline:
            self._draw_timeline(chosen)
        counts = result.get("counts") or {}
        self.say(f"sandbox up: {chosen} ready in {elapsed:.1f} s (services {services_s:.1f} s); "
                 f"{counts.get('create', 0)} created, {counts.get('same', 0)} unchanged. "
                 "Next: kimi-cluster sandbox verify")
        return EXIT_OK

    def _draw_timeline(self, topology: str) -> None:
        """The bring-up as a picture, from the step marks in the commands' stdout (as from a real stack's export)."""
        from kimi_cluster.operator.timeline_report import write_timeline

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
        """The verification stack: its StackReference reads the cluster stack's outputs."""
        started = time.monotonic()
        outputs, _ = self.public_outputs()
        if not outputs.get("endpoint_url"):
            raise SandboxUsageError(f"no endpoint in the sandbox in {self.dir.root}: run kimi-cluster sandbox "
                                    "up first")
        self.say(f"sandbox verify: the verification stack against {outputs['endpoint_url']} "
                 f"({outputs.get('served_model_name')})")
        config = {
            f"{VERIFY_NS}:clusterStack": CLUSTER_REF,
            # A new run id re-runs every check: verify answers for the endpoint as it is now.
            f"{VERIFY_NS}:runId": str(time.time_ns()),
            f"{VERIFY_NS}:timeoutSeconds": str(VERIFY_REQUEST_TIMEOUT_S),
        }
        # No preview: the new run id replaces the verification every time, and a preview would only say so first.
        result = self.cli.up(self.cli.verification, None, config, {}, echo=echo, timeout=VERIFY_DEADLINE_S,
                             preview=False)
        elapsed = time.monotonic() - started
        if result.get("interrupted"):
            self.say(f"sandbox verify: stopped after {elapsed:.1f} s")
            return EXIT_INTERRUPTED
        if not result.get("ok"):
            # The stack's resource failed, naming each failed required check and why: one line each.
            for reason in result.get("failures") or []:
                self.say("  " + "\n    ".join(reason.splitlines()[0].split("; ")))
            self.say(f"sandbox verify: FAILED after {elapsed:.1f} s (the whole log: verify --verbose)")
            return EXIT_FAILED
        verified = self.cli.public_outputs(self.cli.verification)[0]
        self.say(format_report(verified.get("verification_report") or []))
        ok = bool(verified.get("verified"))
        self.say(f"sandbox verify: {'PASSED' if ok else 'FAILED'} in {elapsed:.1f} s; verified_endpoint_url = "
                 f"{verified.get('verified_endpoint_url')}")
        return EXIT_OK if ok else EXIT_FAILED

    # -- status --

    def status(self, as_json: bool = False, watch: float | None = None) -> int:
        """`kimi-cluster status` against this sandbox, as for a real stack: its export, with secrets, and
        OpenSSH to each node with the pinned host key; the VMs from its emulator."""
        from kimi_cluster.operator.node_exec import SshRunner
        from kimi_cluster.operator.stack_state import load_state_file
        from kimi_cluster.operator.status_report import run

        record = self.dir.record()
        if not self.checkpoint_path.exists() or not record:
            raise SandboxUsageError(f"nothing deployed in {self.dir.root}: run kimi-cluster sandbox up first")
        overrides = {**(record.get("config") or {}), "apiPort": str(record.get("api_port") or 8000),
                     "enginePort": str(record.get("engine_port") or 30000)}
        settings = stack_settings(record.get("topology") or TOPOLOGIES[0], overrides)
        key = self.dir.secret("hyperstack_api_key", emulator_key)
        api = leftovers.api_client(record["emulator_url"], key) if record.get("emulator_url") else None

        def load() -> Any:
            with self.state_document() as state:
                return load_state_file(state, STACK)

        return run(load, settings, SshRunner(), api, as_json=as_json, watch=watch, out=self.out)

    # -- reclaim (kimi_cluster/sandbox/reclaim.py) --

    def reclaim(self, node: str, mode: str = "delete") -> int:
        """The cloud takes the VM named `node` (or with that address) away; the stack is not told. `mode`: the VM
        is deleted, left in ERROR (its node gone either way), or "unreachable": still ACTIVE in the API, every packet
        to and from it dropped, as a lost host usually behaves."""
        from kimi_cluster.fakes.node_fabric import Fabric, FabricError
        from kimi_cluster.sandbox import reclaim

        record = self.dir.record()
        outputs, _ = self.public_outputs()
        addresses = reclaim.node_addresses(outputs)
        name = next((n for n, a in addresses.items() if node in (n, a)), None)
        fabric = self.network.config()
        if name is None or not record.get("emulator_url") or fabric is None:
            raise SandboxUsageError(f"no VM {node!r} in the sandbox in {self.dir.root}; its VMs: "
                                    f"{', '.join(f'{n} ({a})' for n, a in addresses.items()) or 'none'}")
        if mode not in reclaim.MODES:
            raise SandboxUsageError(f"reclaim --mode must be one of {', '.join(reclaim.MODES)}, not {mode!r}")
        started = time.monotonic()
        try:
            if mode == "unreachable":
                Fabric(fabric).isolate(addresses[name])
                what = "drops every packet to and from it (the API still shows it ACTIVE)"
            else:
                answer = reclaim.ask_emulator(record["emulator_url"], name, mode)
                what = f"{reclaim.DONE[mode]} VM {answer.get('id')}; its node is gone"
        except (RuntimeError, OSError, FabricError) as exc:  # a VM already gone, an emulator that is not running
            raise SandboxUsageError(f"cannot reclaim {name}: {exc}") from None
        self.say(f"reclaimed {name} ({addresses[name]}): the cloud {what}, in {time.monotonic() - started:.2f} s")
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
            problems += self.network.end_leftover_nodes()
            return self._finish_destroy(problems, started)
        topology = record.get("topology") or TOPOLOGIES[0]
        settings = stack_settings(topology, record.get("config"))
        # Deleting needs the API (a fresh emulator if ours died: it holds nothing, so each delete finds nothing).
        record["emulator_url"], key = self.services.emulator(record)
        self.dir.save_record(record)
        api = leftovers.api_client(record["emulator_url"], key)

        problems += self._destroy_verification()
        # A VM whose create an interrupted up never recorded would block the environment's deletion: delete it first.
        recorded = {str(r.get("id")) for r in self.resources() if r.get("type", "").endswith(":VirtualMachine")}
        problems += leftovers.delete_unrecorded_vms(api, settings, recorded, self.say)
        if not problems:
            result = self.cli.destroy(self.cli.cluster, echo=echo, timeout=UP_DEADLINE_S)
            if result.get("ok") and self.resources():
                result = {"ok": False, "failures": [f"the stack still holds {len(self.resources())} resources"]}
            if result.get("interrupted"):
                self.say("sandbox destroy: stopped; what is left is still in the stack's checkpoint: run destroy "
                         "again")
                return EXIT_INTERRUPTED
            if not result.get("ok"):
                problems += list(result.get("failures") or []) or ["pulumi destroy failed"]
            else:
                problems += leftovers.delete_unrecorded_environment(api, settings, self.say)
        left = leftovers.emulator_leftovers(api)
        if left:
            problems.append("the emulator still holds: " + "; ".join(left))
        else:
            self.say("emulator: nothing left")
        problems += self.network.end_leftover_nodes()
        if not problems:
            problems += self.services.stop_all(record)
            if not problems:
                self._forget()
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

    def _destroy_verification(self) -> list[str]:
        done = self.cli.destroy(self.cli.verification, echo=False, timeout=VERIFY_DEADLINE_S)
        if not done.get("ok"):
            return ["the verification stack's destroy failed: " + "; ".join(done.get("failures") or [])]
        self.cli.forget(self.cli.verification)
        return []

    def _forget(self) -> None:
        """A destroyed VM's disks are gone: the next up starts from blank nodes, fresh secrets and new stacks."""
        self.cli.forget(self.cli.cluster)
        for problem in self.network.teardown():
            self.say(f"LEFT: {problem}")
        for name in ("state", "pulumi-home", "sshd"):
            shutil.rmtree(self.dir.root / name, ignore_errors=True)
        self.cli.logged_out()  # an up by this same Sandbox (the kernel-cache bench's second) logs in again
        shutil.rmtree(self.dir.nodes, ignore_errors=True)
        shutil.rmtree(self.dir.secrets_dir, ignore_errors=True)
        self.dir.record_path.unlink(missing_ok=True)

