"""The values the settings imply (the cluster's shape, images, names, prices, warnings), as a mixin of `Settings`.

Kept apart from kimi_cluster/settings/model.py so that the model file holds the keys and their validators only; every
value here is a property over the validated fields, worked out again on each read (the model is frozen).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from kimi_cluster.settings import caretaker_rules, catalog, sizing, tls_check
from kimi_cluster.settings.errors import SettingsError
from kimi_cluster.settings.keys import NAMESPACE
from kimi_cluster.settings.networks import IPV4_WARN_PREFIX, WIDE_PREFIX
from kimi_cluster.settings.node_timing import timing_of
from kimi_cluster.settings.timing import Timing

T = TypeVar("T")


def _custom(value: T | None, key: str) -> T:
    """A custom topology's own value: Settings refuses a custom topology without it, so None here is a bug."""
    if value is None:
        raise SettingsError(f"{NAMESPACE}:{key} is required for topology custom")
    return value


class DerivedValues:
    """What the settings imply. Settings inherits it; the fields it reads are Settings' own."""

    if TYPE_CHECKING:  # the fields these properties read, declared in Settings (kimi_cluster/settings/model.py)
        api_allowed_cidrs: list[str] | None
        api_input_price_usd_per_m: float | None
        api_output_price_usd_per_m: float | None
        budget_usd: float | None
        caretaker_timing: dict[str, float]
        idle_stop_minutes: int | None
        schedule: dict[str, Any] | None
        context_window: int
        engine: Literal["sglang", "vllm", "tokenspeed"] | None
        engine_layout: Literal["tp8", "dp8-ep", "tp8-dcp8"] | None
        environment_name: str | None
        flavor: str | None
        front_flavor: str
        front_hourly_price_usd: float | None
        front_os_image: str | None
        gpu_hourly_price_usd: float | None
        gpu_memory_gb: int | None
        gpus_per_node: int | None
        hf_token_set: bool
        image: str | None
        input_tokens_per_output_token: float | None
        max_model_len: int | None
        model: str
        node_count: int | None
        node_timing: dict[str, int | float]
        operator_cidr: str
        os_image: str | None
        plain_credentials: tuple[str, ...]
        proxy_image: str | None
        region: str
        regions: list[str] | None
        replicas: int
        resume_streams: bool
        served_model_name: str | None
        stack: str
        tls_certificate: str | None
        topology: Literal["h100x4-sglang", "b300x1-vllm", "b300x1-tokenspeed", "custom"]
        model_fields_set: set[str]

    def _own_certificate_expiry(self) -> dt.datetime | None:
        if self.tls_certificate is None:
            return None
        from cryptography import x509

        return x509.load_pem_x509_certificates(self.tls_certificate.encode())[0].not_valid_after_utc

    # ---- derived values -------------------------------------------------------------------------

    @property
    def preset(self) -> catalog.Topology | None:
        return catalog.TOPOLOGIES.get(self.topology)

    @property
    def flavor_name(self) -> str:
        return self.preset.flavor if self.preset else _custom(self.flavor, "flavor")

    @property
    def nodes(self) -> int:
        return self.preset.node_count if self.preset else _custom(self.node_count, "nodeCount")

    @property
    def gpus_per_node_count(self) -> int:
        return self.preset.gpus_per_node if self.preset else _custom(self.gpus_per_node, "gpusPerNode")

    @property
    def gpu(self) -> catalog.GpuSpec:
        name = self.preset.gpu if self.preset else catalog.GPU_BY_MEMORY_GB[_custom(self.gpu_memory_gb, "gpuMemoryGb")]
        return catalog.GPUS[name]

    @property
    def engine_name(self) -> str:
        return self.preset.engine if self.preset else _custom(self.engine, "engine")

    @property
    def total_gpus(self) -> int:
        return self.nodes * self.gpus_per_node_count

    @property
    def tensor_parallel(self) -> int:
        # SGLang shards one model over every GPU of every node; vLLM runs one TP group on its one node.
        return self.total_gpus

    @property
    def layout(self) -> catalog.EngineLayout | None:
        """vLLM's layout on its one node (tp8 unless engineLayout says otherwise); None for other engines."""
        if self.engine_layout is not None:
            return catalog.VLLM_LAYOUTS[self.engine_layout]
        default = catalog.VLLM_LAYOUTS[catalog.DEFAULT_VLLM_LAYOUT]
        if self.engine_name != "vllm" or self.nodes != 1 or self.gpus_per_node_count != default.gpus:
            return None  # another engine, or a custom vLLM node that is not 8 GPUs: tensor parallel over all
        return default

    @property
    def client_context_window(self) -> int:
        """The context client configs are told: contextWindow when set, else what the layout holds per session,
        never beyond maxModelLen."""
        if "context_window" in self.model_fields_set or self.layout is None:
            return self.context_window
        return min(self.layout.context_window, self.max_model_len or self.layout.context_window)

    @property
    def timing(self) -> Timing:
        """The node scripts' waits and retries: kimi-cluster:nodeTiming over Timing()'s defaults."""
        return timing_of(self.node_timing)

    @property
    def model_spec(self) -> catalog.ModelSpec:
        return catalog.MODELS[self.model]

    @property
    def fit(self) -> sizing.FitReport:
        return sizing.check_fit(self.model_spec, self.gpu, self.nodes, self.gpus_per_node_count, self.tensor_parallel)

    @property
    def container_image(self) -> str:
        if self.image:
            return self.image
        # TokenSpeed has no default image: settings refuse the stack until kimi-cluster:image is set.
        return self.preset.image if self.preset else catalog.DEFAULT_IMAGE_BY_ENGINE.get(self.engine_name, "")

    @property
    def image_pinned(self) -> bool:
        return "@sha256:" in self.container_image

    @property
    def api_cidrs(self) -> list[str]:
        """Who may reach the API port: apiAllowedCidrs, else operatorCidr alone."""
        return list(self.api_allowed_cidrs or [self.operator_cidr])

    @property
    def proxy_container_image(self) -> str:
        return self.proxy_image or catalog.PROXY_IMAGE

    @property
    def vm_image(self) -> str:
        if self.os_image:
            return self.os_image
        if self.preset:
            return self.preset.os_image
        return catalog.OS_IMAGE_CUDA_13_2 if self.gpu.name.startswith("B") else catalog.OS_IMAGE_CUDA_12_8

    @property
    def region_choices(self) -> list[str]:
        """The regions the placement may choose from, in order of preference."""
        return list(self.regions) if self.regions is not None else [self.region]

    @property
    def env_name(self) -> str:
        return self.environment_name or f"kimi-{self.stack}"

    @property
    def served_name(self) -> str:
        return self.served_model_name or self.model

    @property
    def price(self) -> catalog.Price | None:
        if self.gpu_hourly_price_usd is not None:
            return catalog.Price(self.gpu_hourly_price_usd, "from config gpuHourlyPriceUsd", "stack config", "now")
        return catalog.PRICES.get(self.gpu.name)

    def _gpu_usd_per_hour(self) -> float | None:
        """The GPU VMs' rate, every replica's (the caretaker's budget counts these, not the front)."""
        one = sizing.hourly_cost_usd(self.price, self.total_gpus)
        return None if one is None else one * self.replicas

    @property
    def hourly_cost_usd(self) -> float | None:
        one = sizing.hourly_cost_usd(self.price, self.total_gpus)
        if one is None or self.replicas == 1:
            return one
        front = self.front_usd_per_hour
        return None if front is None else round(one * self.replicas + front, 2)

    @property
    def api_price(self) -> catalog.ApiPrice:
        """The API's per-token price: the catalog's, with either side overridden from config."""
        base = catalog.MOONSHOT_API_PRICE
        if self.api_input_price_usd_per_m is None and self.api_output_price_usd_per_m is None:
            return base
        given = [k for k, v in (("apiInputPriceUsdPerM", self.api_input_price_usd_per_m),
                                ("apiOutputPriceUsdPerM", self.api_output_price_usd_per_m)) if v is not None]
        return catalog.ApiPrice(
            base.name,
            base.usd_per_m_input if self.api_input_price_usd_per_m is None else self.api_input_price_usd_per_m,
            base.usd_per_m_output if self.api_output_price_usd_per_m is None else self.api_output_price_usd_per_m,
            f"stack config {', '.join(NAMESPACE + ':' + k for k in given)} (otherwise: {base.source})", "now")

    @property
    def token_mix(self) -> catalog.TokenMix:
        if self.input_tokens_per_output_token is None:
            return catalog.AGENTIC_CODING_MIX
        return catalog.TokenMix(self.input_tokens_per_output_token,
                                f"stack config {NAMESPACE}:inputTokensPerOutputToken")

    def node_name(self, index: int) -> str:
        """Deterministic VM names let a re-run find a VM whose create answer was lost."""
        return f"{self.env_name}-node{index}"

    # ---- the caretaker (idleStopMinutes, budgetUsd) ------------------------------------------------------------

    @property
    def guarded(self) -> bool:
        """Whether the caretaker runs: a guard or working hours are set."""
        return self.idle_stop_minutes is not None or self.budget_usd is not None or self.schedule is not None

    @property
    def caretaker(self) -> caretaker_rules.CaretakerTiming:
        return caretaker_rules.timing_of(self.caretaker_timing)

    # ---- replicas and the front (replicas >= 2) ----------------------------------------------------------------

    def replica_node_name(self, replica: int, index: int) -> str:
        """Replica 0 keeps the names a one-replica stack has, so adding a replica never replaces a running VM."""
        return self.node_name(index) if replica == 0 else f"{self.env_name}-r{replica}-node{index}"

    @property
    def has_front(self) -> bool:
        return self.replicas > 1

    @property
    def resumes_streams(self) -> bool:
        """Whether the front carries a stream on to the twin when its replica is lost: behind a front, with vLLM or
        SGLang, unless resumeStreams is false. TokenSpeed's chat layer is compiled into its gateway, so its streams
        do not (kimi_cluster/plan/resume.py, streams)."""
        return self.has_front and self.engine_name in ("vllm", "sglang") and self.resume_streams

    @property
    def front_name(self) -> str:
        return f"{self.env_name}-front"

    @property
    def front_vm_image(self) -> str:
        return self.front_os_image or catalog.FRONT_OS_IMAGE

    @property
    def front_usd_per_hour(self) -> float | None:
        """The front's hourly price (0 without a front); None when its flavor has no known price."""
        if not self.has_front:
            return 0.0
        if self.front_hourly_price_usd is not None:
            return self.front_hourly_price_usd
        spec = catalog.CPU_FLAVORS.get(self.front_flavor)
        return spec.usd_per_hour if spec else None

    @property
    def all_gpus(self) -> int:
        """GPUs billed across every replica (total_gpus is one replica's: its tensor-parallel group)."""
        return self.total_gpus * self.replicas

    def warnings(self) -> list[str]:
        out = []
        if not self.image_pinned:
            out.append(
                f"image {self.container_image!r} is a tag without a digest: the engine version can change under "
                f"you; pin it with {NAMESPACE}:image NAME@sha256:DIGEST"
            )
        if "@sha256:" not in self.proxy_container_image:
            out.append(
                f"proxyImage {self.proxy_container_image!r} is a tag without a digest: the proxy version can change "
                f"under you; pin it with {NAMESPACE}:proxyImage NAME@sha256:DIGEST"
            )
        for cidr in self.api_cidrs:
            net = ipaddress.ip_network(cidr)
            if net.prefixlen < WIDE_PREFIX[net.version]:
                out.append(f"apiAllowedCidrs entry {cidr} is wider than /{WIDE_PREFIX[net.version]}: "
                           f"{net.num_addresses:,} addresses may try keys against the API port")
        if not self.hf_token_set:
            out.append("hfToken is not set: anonymous hub downloads get tighter rate limits")
        if self.price is None:
            out.append(f"no price known for {self.gpu.name}; set {NAMESPACE}:gpuHourlyPriceUsd for a cost figure")
        net = ipaddress.ip_network(self.operator_cidr)
        if net.version == 4 and net.prefixlen < IPV4_WARN_PREFIX:
            out.append(f"{NAMESPACE}:operatorCidr {self.operator_cidr} lets {net.num_addresses:,} addresses reach SSH "
                       "and the API; narrow it to your own address if you can")
        expiry = self._own_certificate_expiry()
        if expiry is not None and expiry - dt.datetime.now(dt.UTC) < dt.timedelta(days=tls_check.RENEW_WARN_DAYS):
            out.append(f"{NAMESPACE}:tlsCertificate's leaf expires on {expiry:%Y-%m-%d}: every client refuses it from "
                       "then on; renew it, set it again and run pulumi up")
        out.extend(caretaker_rules.warnings(self.idle_stop_minutes, self.budget_usd, self.hourly_cost_usd,
                                            self.caretaker.poll_seconds))
        for key in self.plain_credentials:
            out.append(f"{key} is set as a plain value: it sits unencrypted in Pulumi.{self.stack}.yaml and the "
                       f"state; set it again with: pulumi config set --secret {key} ...")
        return out
