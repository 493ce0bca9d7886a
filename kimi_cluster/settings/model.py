"""The stack's configuration as one validated model: every key under `kimi-cluster:`, defaults per topology.

Validation runs before any resource is registered, so bad input costs nothing; every error names its key and
says how to set it. Secret values (hfToken, sshPrivateKey) never enter this model, only whether they are set.
The single keys' rules are rules.py's and ssh_key.py's, the rules across keys cross_rules.py's; raw config becomes
this model (or one SettingsError) in loader.py alone.
"""

from __future__ import annotations

import posixpath
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from kimi_cluster.node.weights import DOWNLOAD_WORKERS, HUB_FLOOR_SHARE, HUB_MIN_RATE, HUB_WINDOW_S
from kimi_cluster.settings import caretaker_rules, catalog, cross_rules, node_timing, rules, schedule_rules, sizing
from kimi_cluster.settings.derived import DerivedValues
from kimi_cluster.settings.errors import shown
from kimi_cluster.settings.kernel_cache_store import KernelCacheSettings
from kimi_cluster.settings.keys import NAMESPACE
from kimi_cluster.settings.ports import DIST_INIT_PORT, RESERVED_PORTS, SSH_PORT
from kimi_cluster.settings.rules import (
    FLAVOR_RE,
    IMAGE_RE,
    NAME_RE,
    PATH_CHARS_RE,
    PRINTABLE_RE,
    REGION_RE,
    SERVED_NAME_RE,
    SSH_USER_RE,
    duration_problem,
)
from kimi_cluster.settings.ssh_key import SSH_PUBLIC_KEY_RE


class Settings(DerivedValues, BaseModel):
    """Validated stack settings. Field aliases are the camelCase config keys."""

    model_config = ConfigDict(populate_by_name=True, extra="forbid", frozen=True)

    stack: str
    topology: Literal["h100x4-sglang", "b300x1-vllm", "b300x1-tokenspeed", "custom"] = catalog.DEFAULT_TOPOLOGY
    # custom topology only
    flavor: str | None = None
    node_count: int | None = Field(None, alias="nodeCount", ge=1, le=20)
    gpus_per_node: int | None = Field(None, alias="gpusPerNode", ge=1, le=16)
    gpu_memory_gb: int | None = Field(None, alias="gpuMemoryGb")
    engine: Literal["sglang", "vllm", "tokenspeed"] | None = None
    gpu_hourly_price_usd: float | None = Field(None, alias="gpuHourlyPriceUsd", gt=0, le=1000, allow_inf_nan=False)

    region: str = catalog.DEFAULT_REGION
    # Ordered preference; the placement resource picks the first with stock for the whole cluster, once.
    regions: list[str] | None = None
    environment_name: str | None = Field(None, alias="environmentName")
    operator_cidr: str = Field(alias="operatorCidr")
    # The operator reaches the VMs over a private network or loopback (a VPN into the cloud, the local sandbox).
    allow_private_operator_cidr: bool = Field(False, alias="allowPrivateOperatorCidr")
    ssh_public_key: str | None = Field(None, alias="sshPublicKey")
    keypair_name: str | None = Field(None, alias="keypairName")
    ssh_user: str = Field("ubuntu", alias="sshUser")

    model: str = catalog.KIMI_K31_PRO.repo
    model_revision: str = Field(catalog.KIMI_K31_PRO.default_revision, alias="modelRevision")
    served_model_name: str | None = Field(None, alias="servedModelName")
    image: str | None = None
    os_image: str | None = Field(None, alias="osImage")
    api_port: int = Field(8000, alias="apiPort", ge=1, le=65535)
    # Who may reach the API port (the TLS proxy on the head); default: operatorCidr only. SSH stays operatorCidr.
    api_allowed_cidrs: list[str] | None = Field(None, alias="apiAllowedCidrs")
    # Bumping it makes a new API key; the engine keeps running, only the proxy's key file changes.
    api_key_version: int = Field(1, alias="apiKeyVersion", ge=1, le=1_000_000)
    # The engine listens on the head's loopback only, on this port; the proxy forwards to it.
    engine_port: int = Field(30000, alias="enginePort", ge=1, le=65535)
    # Bring your own server certificate (PEM chain, leaf first, ending with the CA clients should trust); its key
    # is the secret tlsPrivateKey. Unset: the stack makes its own CA and a certificate for the head's address.
    tls_certificate: str | None = Field(None, alias="tlsCertificate")
    # The DNS name clients use for the API (you keep its record pointing at the head): the URLs, the client configs and
    # the readiness wait's TLS check use it; your own tlsCertificate must name it. Unset: the head's public IP.
    api_hostname: str | None = Field(None, alias="apiHostname")
    proxy_image: str | None = Field(None, alias="proxyImage")
    max_model_len: int | None = Field(None, alias="maxModelLen", ge=1024, le=2**24)
    context_window: int = Field(131072, alias="contextWindow", ge=1024, le=2**24)
    extra_engine_args: list[str] = Field(default_factory=list, alias="extraEngineArgs")
    # How vLLM places the model on its one node (catalog.VLLM_LAYOUTS); unset is tp8, today's layout.
    engine_layout: Literal["tp8", "dp8-ep", "tp8-dcp8"] | None = Field(None, alias="engineLayout")

    # node bring-up knobs
    node_root: str = Field("/", alias="nodeRoot")
    storage_path: str = Field("/ephemeral", alias="storagePath")
    # Bounded so the scripts' shell arithmetic (64-bit) never overflows: 1 PB of margin is far beyond any disk.
    disk_margin_gb: int = Field(100, alias="diskMarginGb", ge=0, le=10**6)
    download_workers: int = Field(DOWNLOAD_WORKERS, alias="downloadWorkers", ge=1, le=128)
    download_timeout_minutes: int = Field(240, alias="downloadTimeoutMinutes", ge=1, le=7 * 24 * 60)
    # The floor of each hub stream (kimi_cluster/node/weights_ranges.py); the defaults' home is node/weights.py.
    hub_stream_min_mbps: float = Field(HUB_MIN_RATE / 1e6, alias="hubStreamMinMBps", gt=0, le=100_000,
                                       allow_inf_nan=False)
    hub_stream_floor_share: float = Field(HUB_FLOOR_SHARE, alias="hubStreamFloorShare", gt=0, lt=1,
                                          allow_inf_nan=False)
    hub_stream_window_seconds: float = Field(HUB_WINDOW_S, alias="hubStreamWindowSeconds", ge=1, le=3600,
                                             allow_inf_nan=False)
    readiness_timeout_minutes: int = Field(60, alias="readinessTimeoutMinutes", ge=1, le=24 * 60)
    # Per-step override of the node-side deadline (kimi_cluster.plan.steps.clocks.deadline_s), e.g. {"image": 120}.
    step_deadline_minutes: dict[str, float] = Field(default_factory=dict, alias="stepDeadlineMinutes")
    # Advanced: the node scripts' waits and retries (kimi_cluster/settings/timing.py Timing), e.g. {"settleSeconds": 1}.
    node_timing: dict[str, int | float] = Field(default_factory=dict, alias="nodeTiming")
    # Free since every file is hashed while it is written (scripts/fetch_weights.py): the check compares records.
    verify_sha256: bool = Field(True, alias="verifySha256")
    # Compile the engine's kernels from the model's shapes while the weights download (kimi_cluster/plan/warmup.py).
    kernel_warmup: bool = Field(False, alias="kernelWarmup")
    # Where each node serves its finished weight files to its peers (private addresses only).
    peer_port: int = Field(20100, alias="peerPort", ge=1024, le=65535)
    hf_endpoint: str = Field("https://huggingface.co", alias="hfEndpoint")
    kernel_cache: KernelCacheSettings | None = Field(None, alias="kernelCache")
    # Replicas behind one front (kimi_cluster/deploy/replicas.py, kimi_cluster/deploy/front.py): whole engine groups,
    # each sized alone.
    replicas: int = Field(1, ge=1, le=catalog.MAX_REPLICAS)
    front_flavor: str = Field(catalog.FRONT_FLAVOR.name, alias="frontFlavor")
    front_os_image: str | None = Field(None, alias="frontOsImage")
    front_hourly_price_usd: float | None = Field(None, alias="frontHourlyPriceUsd", gt=0, le=1000,
                                                 allow_inf_nan=False)
    # Behind a front, a stream whose replica is lost carries on on the twin (kimi_cluster/plan/resume.py); vLLM only.
    resume_streams: bool = Field(True, alias="resumeStreams")

    # The API the cluster is compared with (plan: break-even; status: cost per token). Defaults: catalog.py.
    api_input_price_usd_per_m: float | None = Field(None, alias="apiInputPriceUsdPerM", ge=0, le=10_000,
                                                    allow_inf_nan=False)
    # At least $0.0001 per 1M: the break-even divides the cluster's hour by it (1e-300 overflows every float).
    api_output_price_usd_per_m: float | None = Field(None, alias="apiOutputPriceUsdPerM", ge=1e-4, le=10_000,
                                                     allow_inf_nan=False)
    input_tokens_per_output_token: float | None = Field(None, alias="inputTokensPerOutputToken", ge=0, le=100_000,
                                                        allow_inf_nan=False)

    # The caretaker (kimi_cluster/plan/caretaker.py, docs/caretaker.md): off unless a guard is set; its rules are
    # caretaker_rules.py's.
    idle_stop_minutes: int | None = Field(None, alias="idleStopMinutes")
    budget_usd: float | None = Field(None, alias="budgetUsd")
    caretaker_api_url: str = Field(caretaker_rules.DEFAULT_API_URL, alias="caretakerApiUrl")
    caretaker_timing: dict[str, float] = Field(default_factory=dict, alias="caretakerTiming")
    caretaker_api_key_set: bool = False
    # Working hours (docs/caretaker.md): windows outside which the caretaker deletes the GPU VMs; the compiled form of
    # schedule_rules.py, None when unset.
    schedule: dict[str, Any] | None = Field(None, alias="schedule")

    # secrets: presence only, the values stay in Pulumi's secret config
    hf_token_set: bool = False
    ssh_private_key_set: bool = False
    kernel_cache_credentials_set: bool = False
    tls_private_key_set: bool = False
    # credentials given as plain (unencrypted) config values: warned about
    plain_credentials: tuple[str, ...] = ()

    @field_validator("operator_cidr")
    @classmethod
    def _operator_cidr(cls, v: str) -> str:
        return rules.operator_cidr(v)

    @field_validator("api_allowed_cidrs", mode="before")
    @classmethod
    def _cidr_list(cls, v: Any) -> Any:
        return rules.cidr_list(v)

    @field_validator("tls_certificate")
    @classmethod
    def _certificate(cls, v: str | None) -> str | None:
        return rules.certificate(v)

    @field_validator("api_hostname")
    @classmethod
    def _api_hostname(cls, v: str | None) -> str | None:
        return rules.api_hostname(v)

    @field_validator("model_revision")
    @classmethod
    def _revision(cls, v: str) -> str:
        return rules.revision(v)

    @field_validator("ssh_public_key")
    @classmethod
    def _public_key(cls, v: str | None) -> str | None:
        if v is not None and not SSH_PUBLIC_KEY_RE.fullmatch(v.strip()):
            raise ValueError("not an OpenSSH public key (expected e.g. 'ssh-ed25519 AAAA... comment')")
        return v.strip() if v else v

    @field_validator("environment_name", "keypair_name")
    @classmethod
    def _names(cls, v: str | None) -> str | None:
        if v is not None and not NAME_RE.fullmatch(v):
            raise ValueError("use 1-50 letters, digits, '-' or '_' (Hyperstack's limit is 50 characters)")
        return v

    @field_validator("flavor")
    @classmethod
    def _flavor(cls, v: str | None) -> str | None:
        if v is not None and not FLAVOR_RE.fullmatch(v):
            raise ValueError(f"{shown(v)} is not a flavor name such as n3-H100x8-NVLink")
        return v

    @field_validator("os_image", "front_os_image")
    @classmethod
    def _os_image(cls, v: str | None) -> str | None:
        return rules.os_image(v)

    @field_validator("front_flavor")
    @classmethod
    def _front_flavor(cls, v: str) -> str:
        return rules.front_flavor(v)

    @field_validator("served_model_name")
    @classmethod
    def _served_name(cls, v: str | None) -> str | None:
        if v is not None and not SERVED_NAME_RE.fullmatch(v):
            raise ValueError(f"{shown(v)}: use 1-128 letters, digits and . _ : / @ + - (it lands in clients' shell, "
                             "TOML and JSON)")
        return v

    @field_validator("image", "proxy_image")
    @classmethod
    def _image(cls, v: str | None) -> str | None:
        if v is not None and (len(v) > 512 or not IMAGE_RE.fullmatch(v)):
            raise ValueError(f"{shown(v)} is not a container image reference such as "
                             "registry.example.com/org/name:tag@sha256:<64 hex>")
        return v

    @field_validator("ssh_user")
    @classmethod
    def _ssh_user(cls, v: str) -> str:
        if not SSH_USER_RE.fullmatch(v):
            raise ValueError(f"{shown(v)} is not a login name: lower-case letters, digits, '_' and '-', "
                             "at most 32, e.g. ubuntu")
        return v

    @field_validator("api_port")
    @classmethod
    def _api_port(cls, v: int) -> int:
        if v in RESERVED_PORTS:
            raise ValueError(f"port {v} is taken by {RESERVED_PORTS[v]}; choose another, e.g. 8000")
        return v

    @field_validator("hf_endpoint")
    @classmethod
    def _hf_endpoint(cls, v: str) -> str:
        return rules.hf_endpoint(v)

    @field_validator("extra_engine_args", mode="before")
    @classmethod
    def _json_list(cls, v: Any) -> Any:
        # `pulumi config set` stores a list as a JSON string unless --path is used
        return rules.engine_arg_list(v)

    @field_validator("regions", mode="before")
    @classmethod
    def _regions(cls, v: Any) -> Any:
        return rules.region_list(v)

    @field_validator("region")
    @classmethod
    def _region(cls, v: str) -> str:
        if not REGION_RE.fullmatch(v):
            raise ValueError(f"{shown(v)} is not a Hyperstack region name such as CANADA-1")
        return v

    @field_validator("download_timeout_minutes", "readiness_timeout_minutes", mode="before")
    @classmethod
    def _timeouts(cls, v: Any) -> Any:
        problem = duration_problem(v)
        if problem:
            raise ValueError(problem)
        return v

    @field_validator("step_deadline_minutes", mode="before")
    @classmethod
    def _step_deadlines(cls, v: Any) -> Any:
        return rules.step_deadlines(v)

    @field_validator("node_timing", mode="before")
    @classmethod
    def _node_timing(cls, v: Any) -> Any:
        return node_timing.node_timing(v)

    @field_validator("kernel_cache", mode="before")
    @classmethod
    def _json_object(cls, v: Any) -> Any:
        # `pulumi config set kimi-cluster:kernelCache '{...}'` stores a JSON string; `--path` stores an object
        return rules.json_object(v)

    @field_validator("extra_engine_args")
    @classmethod
    def _engine_args(cls, v: list[str]) -> list[str]:
        for arg in v:
            if not arg or len(arg) > 1000 or not PRINTABLE_RE.fullmatch(arg):
                raise ValueError(f"{shown(arg)}: each argument must be 1-1000 printable characters")
        return v

    @field_validator("idle_stop_minutes", mode="before")
    @classmethod
    def _idle(cls, v: Any) -> Any:
        return caretaker_rules.idle_minutes(v)

    @field_validator("budget_usd", mode="before")
    @classmethod
    def _budget(cls, v: Any) -> Any:
        return caretaker_rules.budget(v)

    @field_validator("caretaker_api_url")
    @classmethod
    def _caretaker_url(cls, v: str) -> str:
        return caretaker_rules.api_url(v)

    @field_validator("schedule", mode="before")
    @classmethod
    def _schedule(cls, v: Any) -> Any:
        return schedule_rules.schedule(v)

    @field_validator("caretaker_timing", mode="before")
    @classmethod
    def _caretaker_timing(cls, v: Any) -> Any:
        return caretaker_rules.timing(v)

    @field_validator("node_root")
    @classmethod
    def _node_root(cls, v: str) -> str:
        # A relative root (a test root, the sandbox's ".") is resolved from the SSH login directory on the node.
        if not PATH_CHARS_RE.fullmatch(v) or posixpath.normpath(v) != v:
            raise ValueError(f"{shown(v)} must be / (a real VM) or a normalized path of letters, digits and . _ - /")
        return v

    @field_validator("storage_path")
    @classmethod
    def _storage_path(cls, v: str) -> str:
        return rules.storage_path(v)

    @model_validator(mode="after")
    def _shape(self) -> Settings:
        custom_keys = {"flavor": self.flavor, "nodeCount": self.node_count, "gpusPerNode": self.gpus_per_node,
                       "gpuMemoryGb": self.gpu_memory_gb, "engine": self.engine}
        problem = cross_rules.topology_problem(self.topology, custom_keys, self.engine, self.node_count)
        if problem:
            raise ValueError(problem)
        if self.topology == "custom":
            # before sizing: a wrong GPU count would size the wrong cluster
            mismatch = cross_rules.flavor_problem(self.flavor, self.gpus_per_node, self.gpu_memory_gb, self.gpu.name)
            if mismatch:
                raise ValueError(mismatch)
        if self.regions is not None and "region" in self.model_fields_set:
            raise ValueError(f"set only one of {NAMESPACE}:region (one region) and {NAMESPACE}:regions (an ordered "
                             f"list); remove one with: pulumi config rm {NAMESPACE}:region")
        if self.peer_port in (self.api_port, self.engine_port, DIST_INIT_PORT):  # SGLang's rendezvous (launch.py)
            raise ValueError(f"{NAMESPACE}:peerPort {self.peer_port} collides with apiPort, enginePort or the "
                             f"rendezvous port {DIST_INIT_PORT}; pick another, e.g. {NAMESPACE}:peerPort 20100")
        if self.ssh_public_key is None and self.keypair_name is None:
            raise ValueError(f"set {NAMESPACE}:sshPublicKey (a keypair is imported) or {NAMESPACE}:keypairName (an "
                             "existing one is reused)")
        if self.ssh_public_key is not None and self.keypair_name is not None:
            raise ValueError(f"set only one of {NAMESPACE}:sshPublicKey and {NAMESPACE}:keypairName")
        if self.kernel_cache is not None and not self.kernel_cache_credentials_set:
            raise ValueError(
                f"{NAMESPACE}:kernelCacheCredentials is required with {NAMESPACE}:kernelCache (the bucket's access "
                f"key); set it with: pulumi config set --secret {NAMESPACE}:kernelCacheCredentials "
                "ACCESS_KEY_ID:SECRET_ACCESS_KEY")
        # The engines' multi-node rendezvous port (kimi_cluster/plan/launch.py): the engine's own port must not take it.
        if self.engine_port in (self.api_port, SSH_PORT, DIST_INIT_PORT):
            raise ValueError(f"{NAMESPACE}:enginePort {self.engine_port} collides with apiPort, SSH ({SSH_PORT}) or "
                             f"the rendezvous port {DIST_INIT_PORT}; pick another, e.g. {NAMESPACE}:enginePort 30000")
        for key, port in (("peerPort", self.peer_port), ("enginePort", self.engine_port)):
            if port in RESERVED_PORTS:  # the kernel warm-up's (the two above are checked with their own words)
                raise ValueError(f"{NAMESPACE}:{key} {port} is taken by {RESERVED_PORTS[port]}; pick another")
        if (self.tls_certificate is not None) != self.tls_private_key_set:
            raise ValueError(f"{NAMESPACE}:tlsCertificate and {NAMESPACE}:tlsPrivateKey go together: set both (your "
                             "own certificate) or neither (the stack makes its own CA)")
        if self.model not in catalog.MODELS:
            raise ValueError(f"{NAMESPACE}:model {shown(self.model)} has no sizing data; known: "
                             f"{', '.join(catalog.MODELS)}")
        fit = self.fit
        if not fit.fits:
            fitting = [t.name for t in catalog.TOPOLOGIES.values()
                       if sizing.check_fit(self.model_spec, catalog.GPUS[t.gpu], t.node_count, t.gpus_per_node,
                                           t.node_count * t.gpus_per_node).fits]
            raise ValueError(
                f"the cluster cannot serve {self.model}: {fit.summary()}. Change {NAMESPACE}:topology (presets that "
                f"fit: {', '.join(fitting)}) or, for topology custom, nodeCount, gpusPerNode and gpuMemoryGb"
            )
        return self

    @model_validator(mode="after")
    def _replica_rules(self) -> Settings:
        """replicas >= 2: the front's flavor and image are names the API sees, and every derived VM name fits."""
        if self.replicas == 1:
            return self
        longest = max((self.replica_node_name(self.replicas - 1, self.nodes - 1), self.front_name), key=len)
        problems = cross_rules.replica_problems(self.replicas, self.env_name, longest)
        if problems:
            raise ValueError("\n  ".join(problems))
        return self

    @model_validator(mode="after")
    def _rules(self) -> Settings:
        """Rules across keys; every problem found is reported at once, each naming its key. (The engine flags
        extraEngineArgs may not set are checked once this model is whole: kimi_cluster/plan/launch.py, by the
        loader.)"""
        one = [cross_rules.operator_scope_problem(self.operator_cidr, self.allow_private_operator_cidr),
               cross_rules.hf_endpoint_problem(self.hf_endpoint, self.hf_token_set),
               cross_rules.layout_problem(self.engine_layout, self.engine_name, self.nodes, self.gpus_per_node_count),
               cross_rules.tokenspeed_problem(self.engine_name, self.nodes, self.image, self.engine_port,
                                              self.api_port, self.peer_port)]
        last_node = self.node_name(self.nodes - 1)
        problems = [p for p in one if p] \
            + cross_rules.name_problems(self.env_name, self.environment_name, self.stack, last_node) \
            + cross_rules.api_cidr_problems(self.api_allowed_cidrs, self.allow_private_operator_cidr) \
            + cross_rules.api_hostname_problems(self.tls_certificate, self.api_hostname) \
            + cross_rules.context_problems(self.max_model_len, self.context_window, self.model,
                                           self.model_spec.context_window) \
            + caretaker_rules.problems(self.idle_stop_minutes, self.budget_usd, self.caretaker_api_key_set,
                                       api_url_value=self.caretaker_api_url,
                                       minute_seconds=self.caretaker.minute_seconds,
                                       usd_per_hour=self._gpu_usd_per_hour(), flavor=self.flavor_name) \
            + schedule_rules.problems(self.schedule, self.replicas, self.caretaker_api_key_set,
                                      self.caretaker.minute_seconds)
        if problems:
            raise ValueError("\n  ".join(problems))
        return self
