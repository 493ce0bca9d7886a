"""One GPU node's bring-up as a chain of remote commands, from an empty VM to a running engine container.

ready -> storage -> (image pull || weights || kernel-cache restore) -> check -> launch, each a pulumi-command
`remote.Command` running a script rendered from templates/; the head also runs the authenticating TLS proxy (after
its image pull, beside the download), and the head's readiness wait and the kernel-cache save after it are their own
components. Secrets reach the node only on stdin, and only the head gets the API key: the engines run without one,
behind the proxy.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulumi
import pulumi.dynamic as dyn
from pulumi_command import remote

from components import kernel_cache_key, launch, proxy, weights
from components.front_tuning import DEFAULT_TUNING
from components.render import ShellExpr, Verbatim, render
from components.settings import Settings
from components.steps import HEAD_STEPS, STEPS, SUMMARIES
from components.timing import PIP_BUDGET_S, Timing

GPU_NODE_TYPE = "kimi:cluster:GpuNode"
READINESS_TYPE = "kimi:cluster:Readiness"
HF_HUB_VERSION = "2.4.0"  # the node runs the same huggingface_hub the project pins
WEIGHTS_UNIT = "kimi-weights"
CHECK_SOURCE = Path(__file__).resolve().parents[1] / "node_programs" / "check_download.py"
KERNEL_CACHE_SOURCE = Path(__file__).resolve().parents[1] / "node_programs" / "kernel_cache.py"
BOTO3_VERSION = "1.44.5"  # the S3 client the kernel-cache program runs with; the project pins the same
KERNEL_CACHE_SAVE_TYPE = "kimi:cluster:KernelCacheSave"
FETCH_SOURCE = Path(__file__).resolve().parents[1] / "node_programs" / "fetch_weights.py"
SPLIT_SOURCE = Path(__file__).resolve().parent / "weights.py"  # the split, shipped beside the program
NAMES_SOURCE = Path(__file__).resolve().parent / "hub_names.py"  # the manifest's name rules, shipped beside both
PRINTABLE_SOURCE = Path(__file__).resolve().parent / "printable.py"  # status's escape, for what engines print
SCRIPT_DIR = "~/.kimi-cluster"  # each step's script stays on the node, for reading and re-running by hand

# A fresh VM refuses SSH for minutes after it reports ACTIVE; pulumi-command's defaults (10 dials, 15 s each) give up
# after about 11 s of refused connections. 120 dials with its capped backoff wait about 10 minutes.
DIAL_ERROR_LIMIT = 120
PER_DIAL_TIMEOUT_S = 30
# Exit codes of coreutils `timeout`: the deadline passed (TERM), or the step ignored TERM and was KILLed.
TIMEOUT_EXIT, KILLED_EXIT = 124, 137
# How long a step has to exit after TERM before `timeout` KILLs it.
KILL_AFTER_S = 30


@dataclass(frozen=True)
class ProxyTls:
    """The public half of the head's TLS material: the server certificate chain and the CA clients trust."""

    cert_chain_pem: str
    ca_pem: str


# What the offline plan and the tests render when no certificate exists yet.
PLAN_TLS = ProxyTls("<the server certificate chain, made at deploy time>\n", "<the stack's CA certificate>\n")
PLAN_PUBLIC_IP = "<head-public-ip>"


# ---- rendering (pure) ----------------------------------------------------------------------------------------------


def _storage_path(settings: Settings) -> str:
    path = "/" + settings.storage_path.strip("/")
    return path if path != "/" else ""


def _repo_folder(settings: Settings) -> str:
    return "models--" + settings.model.replace("/", "--")


def _source(path: Path) -> Verbatim:
    """A program of this repository, as the body of a quoted heredoc (its delimiter never appears in it)."""
    text = path.read_text(encoding="utf-8")
    return Verbatim(text if text.endswith("\n") else text + "\n")


def _kernel_cache_values(settings: Settings, step: str, timing: Timing) -> dict[str, Any]:
    cfg = settings.kernel_cache
    if cfg is None:
        raise ValueError(f"step {step} needs {settings_key('kernelCache')} to be set")
    key = kernel_cache_key.cache_key(settings)
    restoring = step == "cache-restore"
    return {
        "engine": settings.engine_name, "key": key.id, "key_fields": key.fields_json, "location": cfg.location,
        "bucket": cfg.bucket, "prefix": cfg.prefix, "endpoint_url": cfg.endpoint_url or "", "region": cfg.region,
        "addressing_style": cfg.addressing_style, "boto3_version": BOTO3_VERSION,
        "program_source": Verbatim(_source(KERNEL_CACHE_SOURCE)),  # the body of a quoted heredoc
        "give_up": "starting cold" if restoring else "WARNING: not saved",
        "timeout_s": timing.kernel_cache_transfer_s(step, settings), "pip_timeout_s": PIP_BUDGET_S // 2,
        "timeout_key": "restoreTimeoutMinutes" if restoring else "saveTimeoutMinutes",
    }


def serves_api(settings: Settings, rank: int) -> bool:
    """Whether this node runs the TLS proxy: the head, unless a front (replicas >= 2) holds the endpoint."""
    return rank == 0 and not settings.has_front


def settings_key(key: str) -> str:
    return f"kimi-cluster:{key}"


def steps_for(settings: Settings) -> tuple[str, ...]:
    """The chain's steps on every node; the kernel-cache restore only when kernelCache is set."""
    if settings.kernel_cache is None:
        return STEPS
    at = STEPS.index("weights") + 1
    return (*STEPS[:at], "cache-restore", *STEPS[at:])


def running_steps(settings: Settings) -> tuple[str, ...]:
    """Every step that runs on some node of this stack, in chain order (the kernel-cache ones only when set)."""
    return (*steps_for(settings), *HEAD_STEPS, "readiness",
            *(("cache-save",) if settings.kernel_cache is not None else ()))


def readiness_identity(settings: Settings, tls: ProxyTls = PLAN_TLS) -> str:
    """Changes whenever any rank's launch configuration or the proxy's does, so the readiness wait runs again after a
    relaunch."""
    prints = [launch.launch_fingerprint(settings, r, f"<node{r}>", "<node0>") for r in range(settings.nodes)]
    prints.append(proxy.proxy_fingerprint(settings, tls.cert_chain_pem, tls.ca_pem))
    return hashlib.sha256(" ".join(prints).encode()).hexdigest()[:16]


def _values(settings: Settings, rank: int, step: str, timing: Timing) -> dict[str, Any]:
    return {
        "step": step,
        "summary": Verbatim(SUMMARIES[step]),  # a comment line
        "rank": rank,
        "node_root": settings.node_root,
        "storage_path": _storage_path(settings),
        "poll_seconds": timing.poll_seconds,
        "fast_poll_seconds": timing.fast_poll_seconds,
        "printable_source": _source(PRINTABLE_SOURCE),  # for the steps that include _printable.sh.j2
    }


def fan_out_size(settings: Settings) -> int:
    """How many nodes share one download: the replica's, or behind a front every GPU node of every replica (a
    re-created replica then fetches from its twin's disks, and a first bring-up takes each file from the hub once)."""
    return settings.nodes * settings.replicas if settings.has_front else settings.nodes


def peer_list(settings: Settings, peer_ips: Sequence[str] | None) -> str:
    """Every node's private address and peer port, in rank order; empty when this node fetches alone."""
    if fan_out_size(settings) < 2 or not peer_ips:
        return ""
    if len(peer_ips) != fan_out_size(settings):
        raise ValueError(f"{len(peer_ips)} peer addresses for {fan_out_size(settings)} nodes")
    return ",".join(f"{ip}:{settings.peer_port}" for ip in peer_ips)


def render_step(settings: Settings, step: str, rank: int, private_ip: str, head_private_ip: str,
                timing: Timing | None = None, tls: ProxyTls = PLAN_TLS, public_ip: str = PLAN_PUBLIC_IP,
                peer_ips: Sequence[str] | None = None, *, container: str | None = None,
                identity: str | None = None, peer_rank: int | None = None) -> str:
    """One step's script for one node. Addresses and certificates are plain strings; no secret is ever a template
    value.

    `peer_ips` (every node's private address, in rank order) makes the weights step share the download; without
    them the node downloads every file from the hub.
    """
    timing = settings.timing if timing is None else timing  # kimi-cluster:nodeTiming, else Timing()'s defaults
    v = _values(settings, rank, step, timing)
    ckpt = settings.model_spec.checkpoint_bytes
    if step == "ready":
        v.update(private_ip=private_ip, gpus_per_node=settings.gpus_per_node_count,
                 cloud_init_timeout_s=timing.cloud_init_timeout_s, gpu_timeout_s=timing.gpu_timeout_s)
    elif step == "storage":
        v.update(engine=settings.engine_name, need_bytes=ckpt + settings.disk_margin_gb * 10**9,
                 checkpoint_gb=f"{ckpt / 1e9:,.1f} GB", margin_gb=f"{settings.disk_margin_gb} GB",
                 docker_timeout_s=timing.docker_timeout_s)
    elif step == "image":
        # The head also runs the proxy; its image comes down with the engine's, before the long weight download ends.
        images = [settings.container_image] + ([settings.proxy_container_image] if serves_api(settings, rank) else [])
        v.update(images=images, pull_attempts=timing.pull_attempts,
                 pull_timeout_s=timing.pull_timeout_s, pull_backoff_s=timing.pull_backoff_s)
    elif step == "weights":
        v.update(repo=settings.model, revision=settings.model_revision, unit=WEIGHTS_UNIT,
                 repo_folder=_repo_folder(settings), checkpoint_bytes=ckpt, hf_hub_version=HF_HUB_VERSION,
                 download_workers=settings.download_workers, hf_endpoint=settings.hf_endpoint,
                 download_timeout_s=timing.download_s(settings), peers=peer_list(settings, peer_ips),
                 peer_rank=rank if peer_rank is None else peer_rank, serve_complete=settings.has_front,
                 peer_timeout_s=timing.peer_timeout_s, stall_seconds=timing.stall_seconds,
                 progress_file=weights.PROGRESS_FILE, verified_dir=weights.VERIFIED_DIR,
                 plan_source=_source(SPLIT_SOURCE), program_source=_source(FETCH_SOURCE),
                 names_source=_source(NAMES_SOURCE))
    elif step == "check":
        v.update(repo=settings.model, revision=settings.model_revision, hf_endpoint=settings.hf_endpoint,
                 verify_sha256=settings.verify_sha256, check_source=_source(CHECK_SOURCE),
                 names_source=_source(NAMES_SOURCE), verified_dir=weights.VERIFIED_DIR)
    elif step == "launch":
        argv = launch.docker_run_argv(
            settings, rank, private_ip=private_ip, head_private_ip=head_private_ip,
            hf_dir=ShellExpr("${HF}"), cache_dir=ShellExpr("${CACHE}"),
        )
        v.update(container=launch.CONTAINER_NAME, private_ip=private_ip, engine=settings.engine_name,
                 nodes=settings.nodes, repo_folder=_repo_folder(settings), revision=settings.model_revision,
                 needs_nic=settings.engine_name == "sglang" and settings.nodes > 1,
                 gpus_per_node=settings.gpus_per_node_count, cache_mode=launch.cache_dir_mode(settings),
                 fingerprint=launch.launch_fingerprint(settings, rank, private_ip, head_private_ip),
                 fingerprint_label=launch.FINGERPRINT_LABEL, docker_argv=argv, settle_seconds=timing.settle_seconds)
    elif step in ("cache-restore", "cache-save"):
        v.update(_kernel_cache_values(settings, step, timing))
    elif step == "proxy":
        v.update(proxy.step_values(settings, tls.cert_chain_pem, tls.ca_pem, proxy.render_config(settings),
                                   proxy.upstream(settings), timing.proxy_settle_seconds))
    elif step == "readiness":
        # On the front (replicas >= 2) the container it watches is the proxy itself: no engine runs there.
        role = "proxy" if container == proxy.CONTAINER_NAME else "engine"
        v.update(container=container or launch.CONTAINER_NAME, container_role=role,
                 served_name=settings.served_name, api_port=settings.api_port,
                 readiness_timeout_s=timing.readiness_s(settings), log_tail=timing.log_tail,
                 # The name clients dial: the certificate is checked for it (curl connects to the head's loopback).
                 public_host=settings.api_hostname or public_ip, ca_file=proxy.CA_FILE,
                 launch_identity=identity or readiness_identity(settings, tls))
    elif step == "engine-ready":
        v.update(container=launch.CONTAINER_NAME, served_name=settings.served_name,
                 engine_url=f"http://{head_private_ip}:{settings.engine_port}",
                 readiness_timeout_s=timing.readiness_s(settings), log_tail=timing.log_tail,
                 launch_identity=readiness_identity(settings, tls),
                 readmit_checks=DEFAULT_TUNING.readmit_checks, readmit_interval_s=DEFAULT_TUNING.health_interval_s)
    else:
        raise ValueError(f"unknown step {step!r}; steps are {', '.join(STEPS + HEAD_STEPS)} and readiness")
    return render(f"{step}.sh.j2", **v)


def render_node_scripts(settings: Settings, rank: int, private_ip: str, head_private_ip: str,
                        timing: Timing | None = None, tls: ProxyTls = PLAN_TLS,
                        public_ip: str = PLAN_PUBLIC_IP, peer_ips: Sequence[str] | None = None,
                        peer_rank: int | None = None) -> dict[str, str]:
    """Every script node `rank` runs, by step, in order (the head also gets the proxy, readiness and, with
    kernelCache, cache-save). Safe to write to disk. `peer_rank`: this node's place in `peer_ips` (behind a front
    the fan-out spans every replica), else its rank."""
    def one(step: str) -> str:
        return render_step(settings, step, rank, private_ip, head_private_ip, timing, tls, public_ip, peer_ips,
                           peer_rank=peer_rank)

    scripts = {step: one(step) for step in steps_for(settings)}
    if rank == 0 and settings.has_front:
        scripts["engine-ready"] = one("engine-ready")  # the proxy and the readiness wait run on the front
    elif rank == 0:
        for step in (*HEAD_STEPS, "readiness"):
            scripts[step] = one(step)
        if settings.kernel_cache is not None:
            scripts["cache-save"] = one("cache-save")
    return scripts


def remote_command_text(step: str, script: str, *, deadline_s: int, vm_id: str | int | None = None) -> str:
    """What pulumi-command runs over SSH: keep the script in ~/.kimi-cluster, then run it as root within its deadline.

    The script travels base64-encoded so no quoting can break it; it holds no secret (those arrive on stdin, which
    sudo and `timeout` hand to the script untouched), so printing this text on failure reveals nothing. Naming the
    VM makes a replaced VM run the whole chain again, even if it comes back with the same address.

    The deadline is enforced on the node, by coreutils `timeout`: pulumi-command never stops a running command, so
    this is the only thing that ends a hung step. `timeout` runs the script in its own process group and signals
    the whole group (TERM, then KILL after KILL_AFTER_S), so whatever the step started in the background goes too.
    """
    blob = base64.b64encode(script.encode()).decode()
    path = f"{SCRIPT_DIR}/{step}.sh"
    on_vm = f" on VM {vm_id}" if vm_id is not None else ""
    deadline = int(deadline_s)
    if deadline < 1:
        raise ValueError(f"step {step}: deadline {deadline_s!r} s must be at least 1 s")
    expired = (f"kimi-cluster step {step} ran out of its {deadline} s deadline on the node and was stopped "
               f"(raise it with kimi-cluster:stepDeadlineMinutes)")
    return (
        f"# kimi-cluster step {step}{on_vm}: {SUMMARIES[step]} (script kept at {path}, deadline {deadline} s)\n"
        f"set -e; mkdir -p {SCRIPT_DIR}; printf %s '{blob}' | base64 -d > {path}; set +e; t0=$(date +%s)\n"
        f"sudo -n timeout --kill-after={KILL_AFTER_S} {deadline} bash {path}; rc=$?\n"
        # POSIX sh: the login shell pulumi-command runs this in need not be bash.
        f"if [ $rc -eq {TIMEOUT_EXIT} ] || "
        f"{{ [ $rc -eq {KILLED_EXIT} ] && [ $(( $(date +%s) - t0 )) -ge {deadline} ]; }}; then\n"
        f"  echo '{expired}' >&2\n"
        f"fi\n"
        f"exit $rc"
    )


# ---- Pulumi resources ----------------------------------------------------------------------------------------------


def node_connection(host: pulumi.Input[str], user: str, private_key: pulumi.Input[str],
                    host_key: pulumi.Input[str] | None = None, port: pulumi.Input[int] = 22) -> remote.ConnectionArgs:
    """SSH to a node: patient enough for a VM that is still booting, pinned to its host key when one is known."""
    return remote.ConnectionArgs(
        host=host,
        user=user,
        port=port,
        private_key=pulumi.Output.secret(private_key),
        host_key=host_key,
        dial_error_limit=DIAL_ERROR_LIMIT,
        per_dial_timeout=PER_DIAL_TIMEOUT_S,
    )


class GpuNode(pulumi.ComponentResource):
    """The bring-up chain of one node. `launched` is the launch command, for whatever must come after it; on the head
    `proxy` is the proxy step.

    What re-runs what: pulumi-command replaces a command only when its `triggers` change (none are set here); any
    other changed input is an update, and an update re-runs `create`. That is its text or stdin, and also its
    `connection`: a rotated SSH key, a new sshUser or a new address re-runs every step of the chain. So each step is
    idempotent and cheap on a healthy node: storage changes nothing, the pull finds the image, the download finds
    every file, the launch leaves an engine with the same configuration running (same container, same process).
    A new image or engine flag changes the pull and the launch; a new revision changes weights, check and launch;
    a new API key changes only the proxy step (and the readiness wait); nothing here replaces a VM.
    """

    launched: remote.Command
    proxy: remote.Command | None
    commands: dict[str, remote.Command]

    def __init__(
        self,
        name: str,
        *,
        settings: Settings,
        rank: int,
        public_ip: pulumi.Input[str],
        private_ip: pulumi.Input[str],
        head_private_ip: pulumi.Input[str],
        ssh_private_key: pulumi.Input[str],
        api_key: pulumi.Input[str] | None = None,
        tls_cert_chain: pulumi.Input[str] | None = None,
        tls_ca: pulumi.Input[str] | None = None,
        tls_private_key: pulumi.Input[str] | None = None,
        hf_token: pulumi.Input[str] | None = None,
        kernel_cache_credentials: pulumi.Input[str] | None = None,
        peer_private_ips: Sequence[pulumi.Input[str]] = (),
        peer_token: pulumi.Input[str] | None = None,
        host_key: pulumi.Input[str] | None = None,
        ssh_port: pulumi.Input[int] = 22,
        vm_id: pulumi.Input[str | int] | None = None,
        launch_after: Sequence[pulumi.Resource] = (),
        timing: Timing | None = None,
        peer_rank: int | None = None,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__(GPU_NODE_TYPE, name, None, opts)
        proxied = serves_api(settings, rank)
        if proxied and (api_key is None or tls_cert_chain is None or tls_ca is None or tls_private_key is None):
            raise ValueError("the head (rank 0) runs the proxy: it needs the API key and the TLS certificate and key")
        if not proxied and api_key is not None:
            raise ValueError("only the head gets the API key, and no replica behind a front; workers serve no HTTP")
        self._name = name
        self._settings = settings
        self._timing = settings.timing if timing is None else timing
        self._vm_id = pulumi.Output.from_input(vm_id)
        self._connection = node_connection(public_ip, settings.ssh_user, ssh_private_key, host_key, ssh_port)
        public_tls = (pulumi.Output.all(tls_cert_chain, tls_ca).apply(lambda t: ProxyTls(t[0], t[1]))
                      if proxied else PLAN_TLS)
        sharing = (fan_out_size(settings) > 1 and len(peer_private_ips) == fan_out_size(settings)
                   and peer_token is not None)
        scripts = pulumi.Output.all(private_ip, head_private_ip, public_ip, public_tls, *peer_private_ips).apply(
            lambda a: render_node_scripts(settings, rank, a[0], a[1], self._timing, a[3], a[2],
                                          peer_ips=a[4:] if sharing else None, peer_rank=peer_rank)
        )
        token = _stdin_secret(hf_token) if hf_token is not None else None
        # The weights step reads the hub token, then (when the nodes share the download) the peer token.
        weights_stdin = _stdin_secrets(hf_token, peer_token) if sharing else token
        # Children do not inherit the component's depends_on (e.g. the firewall rule that lets SSH in).
        caller_deps = opts.depends_on if opts is not None else None

        ready = self._step("ready", scripts, caller_deps)
        storage = self._step("storage", scripts, [ready])
        # The pull and the download both need the storage disk, not each other: they run side by side.
        image = self._step("image", scripts, [storage])
        weights = self._step("weights", scripts, [storage], stdin=weights_stdin)
        check = self._step("check", scripts, [weights], stdin=token)
        before_launch: list[pulumi.Resource] = [check, image]
        self.commands = {"ready": ready, "storage": storage, "image": image, "weights": weights, "check": check}
        if settings.kernel_cache is not None:
            # Alongside the pull and the download; it never fails, so the launch only ever waits for it.
            restore = self._step("cache-restore", scripts, [storage], stdin=_stdin_secret(kernel_cache_credentials))
            before_launch.append(restore)
            self.commands["cache-restore"] = restore
        # The engine gets no key: no stdin at all.
        self.launched = self._step("launch", scripts, [*before_launch, *launch_after])
        self.commands["launch"] = self.launched
        self.proxy = None
        if proxied:
            # The proxy needs only its image: it runs (answering 502 for anything but 401s) while the weights arrive.
            self.proxy = self._step("proxy", scripts, [image], stdin=_proxy_stdin(api_key, tls_private_key))
            self.commands["proxy"] = self.proxy
        self.register_outputs({"launched": self.launched.id, "launch_stdout": self.launched.stdout})

    def _step(self, step: str, scripts: pulumi.Output[dict[str, str]], depends_on: Any,
              stdin: pulumi.Output[str] | None = None) -> remote.Command:
        deadline = self._timing.deadline_s(step, self._settings)
        create = pulumi.Output.all(scripts, self._vm_id).apply(
            lambda a: remote_command_text(step, a[0][step], deadline_s=deadline, vm_id=a[1]))
        return _command(self, f"{self._name}-{step}", create, self._connection, depends_on, stdin,
                        self._timing.custom_timeout(step, self._settings))


def _proxy_stdin(api_key: pulumi.Input[str] | None, tls_private_key: pulumi.Input[str] | None) -> pulumi.Output[str]:
    """Two lines: the API key, then the TLS private key as one base64 line (so `read` takes each whole)."""
    return pulumi.Output.secret(pulumi.Output.all(api_key, tls_private_key).apply(
        lambda a: f"{a[0] or ''}\n{base64.b64encode((a[1] or '').encode()).decode()}\n"))


def _stdin_secret(value: pulumi.Input[str] | None) -> pulumi.Output[str]:
    """A secret as one line of stdin: the newline lets the script's `read` return without waiting for EOF."""
    return pulumi.Output.secret(pulumi.Output.from_input(value).apply(lambda v: (v or "") + "\n"))


def _stdin_secrets(*values: pulumi.Input[str] | None) -> pulumi.Output[str]:
    """Several secrets, one per line of stdin, in the order the script reads them (a missing one is an empty line)."""
    lines = pulumi.Output.all(*[v if v is not None else "" for v in values])
    return pulumi.Output.secret(lines.apply(lambda vs: "".join(f"{v or ''}\n" for v in vs)))


def _command(parent: pulumi.Resource, name: str, create: pulumi.Input[str],
             connection: remote.ConnectionArgs, depends_on: Any, stdin: pulumi.Output[str] | None,
             timeout: str) -> remote.Command:
    return remote.Command(
        name,
        connection=connection,
        create=create,
        stdin=stdin,
        # The scripts never print a secret (engine logs go through a redaction filter), so the output may be logged.
        logging=remote.Logging.STDOUT_AND_STDERR,
        # A long download's progress output would otherwise be passed back in as an environment variable.
        add_previous_output_in_env=False,
        opts=pulumi.ResourceOptions(
            parent=parent,
            depends_on=depends_on,
            # pulumi-command echoes its inputs into its state; keep the secret stdin encrypted there too.
            additional_secret_outputs=["stdin"] if stdin is not None else None,
            # They only bound the dial (see DIAL_ALLOWANCE_S); the deadline that ends a hung step is on the node.
            custom_timeouts=pulumi.CustomTimeouts(create=timeout, update=timeout),
        ),
    )


class Readiness(pulumi.ComponentResource):
    """Waits on the head until /v1/models lists the served model, asked through the proxy over TLS with the key (the
    certificate checked against the CA for the public address); on failure prints the engine log and fails.

    Give it the launches to wait for as depends_on. Its text carries a fingerprint of every rank's launch
    configuration, so it runs again whenever a relaunch could have changed the answer.
    """

    stdout: pulumi.Output[str]
    command: remote.Command

    def __init__(
        self,
        name: str,
        *,
        settings: Settings,
        public_ip: pulumi.Input[str],
        ssh_private_key: pulumi.Input[str],
        api_key: pulumi.Input[str],
        tls_cert_chain: pulumi.Input[str],
        tls_ca: pulumi.Input[str],
        host_key: pulumi.Input[str] | None = None,
        ssh_port: pulumi.Input[int] = 22,
        timing: Timing | None = None,
        container: str | None = None,
        identity: pulumi.Input[str] | None = None,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__(READINESS_TYPE, name, None, opts)
        timing = settings.timing if timing is None else timing
        deadline = timing.deadline_s("readiness", settings)
        text = pulumi.Output.all(public_ip, tls_cert_chain, tls_ca, identity).apply(lambda a: remote_command_text(
            "readiness", render_step(settings, "readiness", 0, "<unused>", "<unused>", timing, ProxyTls(a[1], a[2]),
                                     a[0], container=container, identity=a[3]), deadline_s=deadline))
        self.command = _command(
            self, f"{name}-wait", text,
            node_connection(public_ip, settings.ssh_user, ssh_private_key, host_key, ssh_port),
            opts.depends_on if opts is not None else None, _stdin_secret(api_key),
            timing.custom_timeout("readiness", settings),
        )
        self.stdout = self.command.stdout
        self.register_outputs({"stdout": self.stdout})


class KernelCacheSave(pulumi.ComponentResource):
    """After the readiness wait, packs the head's compiled kernels into the configured store (kernelCache).

    Nothing reads its output: the endpoint is exported from the readiness wait alone, and the script exits 0 whatever
    happens (a failure is one WARNING line), so a slow or broken store never fails `pulumi up` or the endpoint.
    Its text carries the cache key and the launch identity, so it runs again after a relaunch with a new key.
    """

    command: remote.Command

    def __init__(
        self,
        name: str,
        *,
        settings: Settings,
        public_ip: pulumi.Input[str],
        ssh_private_key: pulumi.Input[str],
        credentials: pulumi.Input[str],
        host_key: pulumi.Input[str] | None = None,
        ssh_port: pulumi.Input[int] = 22,
        timing: Timing | None = None,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__(KERNEL_CACHE_SAVE_TYPE, name, None, opts)
        timing = settings.timing if timing is None else timing
        if settings.kernel_cache is None:
            raise ValueError("KernelCacheSave needs kimi-cluster:kernelCache")
        script = render_step(settings, "cache-save", 0, "<unused>", "<unused>", timing)
        script += f"# after launch configuration {readiness_identity(settings)}\n"
        self.command = _command(
            self, f"{name}-save",
            remote_command_text("cache-save", script, deadline_s=timing.deadline_s("cache-save", settings)),
            node_connection(public_ip, settings.ssh_user, ssh_private_key, host_key, ssh_port),
            opts.depends_on if opts is not None else None, _stdin_secret(credentials),
            timing.custom_timeout("cache-save", settings),
        )
        self.register_outputs({})


# ---- the node's SSH host key ----------------------------------------------------------------------------------------


# Stable names: state records this provider as `components.node._HostKeyProvider` (pickled by reference) and
# `destroy` of an existing stack unpickles it from there. Never rename or move it.
class _HostKeyProvider(dyn.ResourceProvider):
    """Makes one ed25519 host key at create time; stateless, and everything it needs is imported inside."""

    def create(self, props: dict[str, Any]) -> dyn.CreateResult:
        import os
        import shutil
        import subprocess
        import tempfile

        if shutil.which("ssh-keygen") is None:
            raise RuntimeError("ssh-keygen (OpenSSH) is needed on this machine to make the nodes' SSH host keys")
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "host_key")
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "kimi-cluster-node", "-f", path],
                           check=True, capture_output=True)
            with open(path, encoding="utf-8") as fh:
                private = fh.read()
            with open(path + ".pub", encoding="utf-8") as fh:
                public = " ".join(fh.read().split()[:2])
        fingerprint = hashlib.sha256(public.encode()).hexdigest()[:16]
        return dyn.CreateResult(id_=f"hostkey-{fingerprint}", outs={"private_key": private, "public_key": public})

    def diff(self, _id: str, _olds: dict[str, Any], _news: dict[str, Any]) -> dyn.DiffResult:
        # The key must outlive every run: a new one would replace the VM that carries it in user_data.
        return dyn.DiffResult(changes=False)


class NodeHostKey(dyn.Resource, module="kimi", name="NodeHostKey"):
    """An ed25519 SSH host key pair; `private_key` is a secret output and never a plain input anywhere."""

    private_key: pulumi.Output[str]
    public_key: pulumi.Output[str]

    def __init__(self, name: str, opts: pulumi.ResourceOptions | None = None) -> None:
        opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(additional_secret_outputs=["private_key"]))
        super().__init__(_HostKeyProvider(), name, {"private_key": None, "public_key": None}, opts)


def host_key_cloud_config(private_key: str, public_key: str) -> str:
    """cloud-init user_data installing this host key as the VM's only one, so the pinned key is the one offered.

    `ssh_deletekeys` removes the image's host keys; with `ssh_keys` given, cloud-init's cc_ssh writes only that
    pair and never reads `ssh_genkeytypes` (which must not be `[]` anyway: its schema has minItems 1, and an
    invalid user_data leaves `cloud-init status` at "degraded"). tests/node/test_user_data.py runs cloud-init's
    own validator on what the program produces for every node.
    """
    indented = "\n".join("    " + line for line in private_key.strip().splitlines())
    return (
        "#cloud-config\n"
        "ssh_deletekeys: true\n"
        "ssh_keys:\n"
        "  ed25519_private: |\n"
        f"{indented}\n"
        f"  ed25519_public: {public_key.strip()}\n"
    )


def host_key_user_data(name: str, opts: pulumi.ResourceOptions | None = None
                       ) -> tuple[pulumi.Output[str], pulumi.Output[str]]:
    """(user_data for the VM, a secret; the public host key to pin in every SSH connection to it)."""
    key = NodeHostKey(f"{name}-host-key", opts)
    user_data = pulumi.Output.all(key.private_key, key.public_key).apply(
        lambda kv: host_key_cloud_config(kv[0], kv[1]) if kv[0] and kv[1] else ""
    )
    return pulumi.Output.secret(user_data), key.public_key
