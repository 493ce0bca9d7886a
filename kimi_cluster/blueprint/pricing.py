"""What the cluster costs per hour (the live pricebook when an API key is set, else the catalog, and how they
differ), and what the same tokens would cost from the model's API: the break-even and the cost per token so far.

Used by `kimi_cluster.cli.plan` and by the program for the `hourly_cost_usd` output, and by `kimi_cluster.cli.status`. A
pricebook that
cannot be read never blocks a deployment: the quote falls back to the catalog and says why.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kimi_cluster.hyperstack_api.api import (
    API_KEY_CONFIG,
    API_URL_CONFIG,
    ApiSettings,
    HyperstackClient,
    HyperstackError,
)
from kimi_cluster.hyperstack_api.market import LivePrice, get_pricebook, list_all_flavors, price_for_flavor
from kimi_cluster.settings import NAMESPACE, Settings, catalog
from kimi_cluster.settings.catalog import ApiPrice, TokenMix

# A price lookup must not hold up a plan or a preview for long: one try, short deadlines.
PRICEBOOK_TIMEOUT = (5.0, 15.0)


@dataclass(frozen=True)
class Quote:
    """The hourly cost of the whole cluster and where the figure comes from."""

    usd_per_hour: float | None
    source: str            # "pricebook" or "catalog"
    as_of: str             # when the pricebook was read, or the catalog price's date
    detail: str            # one line: what was read, from where, when
    catalog_usd_per_hour: float | None
    note: str = ""         # why the catalog was used although a key is set, if it was

    @property
    def difference_usd(self) -> float | None:
        if self.source != "pricebook" or self.usd_per_hour is None or self.catalog_usd_per_hour is None:
            return None
        return round(self.usd_per_hour - self.catalog_usd_per_hour, 2)

    def summary(self) -> str:
        """One line for the plan and the program log."""
        if self.usd_per_hour is None:
            return f"unknown: no price for this GPU (set {NAMESPACE}:gpuHourlyPriceUsd){self._note()}"
        line = f"${self.usd_per_hour:,.2f} per hour, {self.detail}"
        diff = self.difference_usd
        if diff:
            line += (f"; the catalog says ${self.catalog_usd_per_hour:,.2f} "
                     f"({'+' if diff > 0 else '-'}${abs(diff):,.2f} per hour from the pricebook)")
        elif diff == 0:
            line += "; the catalog agrees"
        return line + self._note()

    def _note(self) -> str:
        return f" ({self.note})" if self.note else ""

    def to_json(self) -> dict[str, Any]:
        return {"usd_per_hour": self.usd_per_hour, "source": self.source, "as_of": self.as_of,
                "detail": self.detail, "catalog_usd_per_hour": self.catalog_usd_per_hour,
                "difference_usd": self.difference_usd, "note": self.note}


def catalog_quote(settings: Settings, note: str = "") -> Quote:
    price = settings.price
    cost = settings.hourly_cost_usd
    if price is None:
        return Quote(None, "catalog", "", "no catalog price", None, note)
    detail = (f"from the catalog: {settings.total_gpus} GPUs x ${price.usd_per_gpu_hour:.2f} per GPU-hour "
              f"{price.basis} ({price.source}, as of {price.as_of})")
    if settings.has_front:
        detail = f"{settings.replicas} replicas, each {detail.removeprefix('from the catalog: ')}"
        detail = f"from the catalog: {detail}{front_detail(settings)}"
    return Quote(cost, "catalog", price.as_of, detail, cost, note)


def front_detail(settings: Settings, live: LivePrice | None = None) -> str:
    """The front's part of a quote, ", plus the front ..." (empty without a front)."""
    if not settings.has_front:
        return ""
    if live is not None:
        return f", plus the front {settings.front_flavor} at ${live.usd_per_vm_hour:.2f} per VM-hour (pricebook)"
    if settings.front_hourly_price_usd is not None:
        return (f", plus the front {settings.front_flavor} at ${settings.front_hourly_price_usd:.2f} "
                "(frontHourlyPriceUsd)")
    spec = catalog.CPU_FLAVORS[settings.front_flavor]
    return f", plus the front {spec.name} at ${spec.usd_per_hour:.2f} per VM-hour ({spec.source})"


def quote(settings: Settings, config: Mapping[str, Any] | None = None, *,
          client: HyperstackClient | None = None) -> Quote:
    """The pricebook's figure when an API key is set (stack config `hyperstack:*` or the environment)."""
    if client is None:
        try:
            api_settings = ApiSettings.resolve(config or {})
        except HyperstackError as err:
            if err.error_reason == "missing_api_key":
                return catalog_quote(settings)  # no key: the catalog is the only source, and that is expected
            return catalog_quote(settings, f"pricebook not read: {err.message}")
        client = HyperstackClient.from_settings(api_settings, timeout=PRICEBOOK_TIMEOUT, rate_limit_tries=1,
                                                server_error_retries=0)
    try:
        with client as api:
            flavor = next((f for f in list_all_flavors(api) if f.get("name") == settings.flavor_name), None)
            gpu_model = str((flavor or {}).get("gpu") or "")
            gpus = int((flavor or {}).get("gpu_count") or settings.gpus_per_node_count)
            book = get_pricebook(api)
    except (HyperstackError, ValueError) as err:
        return catalog_quote(settings, f"pricebook not read: {err}")
    read_at = datetime.now(UTC).isoformat(timespec="seconds")
    live = price_for_flavor(book, settings.flavor_name, gpu_model, gpus)
    if live is None:
        return catalog_quote(settings, f"the pricebook read at {read_at} has no entry for {settings.flavor_name}"
                                       f"{' or ' + gpu_model if gpu_model else ''}")
    total = round(live.usd_per_vm_hour * settings.nodes, 2)
    unit = (f"${live.usd_per_vm_hour / max(gpus, 1):.2f} per GPU-hour x {gpus * settings.nodes} GPUs"
            if live.per_gpu else f"${live.usd_per_vm_hour:.2f} per VM-hour x {settings.nodes} VMs")
    discount = " (discount applied)" if live.discount_applied else ""
    detail = f"from the Hyperstack pricebook read at {read_at}: entry {live.entry!r}, {unit}{discount}"
    if settings.has_front:
        # Every replica bills the same; the front is priced from the pricebook's entry for its flavor when it has
        # one, else from the catalog (or frontHourlyPriceUsd).
        front_live = (price_for_flavor(book, settings.front_flavor, "", 0)
                      if settings.front_hourly_price_usd is None else None)
        front_usd = front_live.usd_per_vm_hour if front_live is not None else settings.front_usd_per_hour
        if front_usd is None:
            return catalog_quote(settings, f"no price for the front's flavor {settings.front_flavor}")
        total = round(total * settings.replicas + front_usd, 2)
        detail += f" x {settings.replicas} replicas{front_detail(settings, front_live)}"
    return Quote(total, "pricebook", read_at, detail, settings.hourly_cost_usd)


def program_quote(settings: Settings) -> Quote:
    """Inside the Pulumi program: the hyperstack:* stack config as the providers see it (plain, never exported)."""
    from pulumi.runtime import config as runtime_config

    config = {key: runtime_config.get_config(key) for key in (API_KEY_CONFIG, API_URL_CONFIG)}
    return quote(settings, {k: v for k, v in config.items() if v})


# ---- The cluster against the API ---------------------------------------------------------------------------------

MILLION = 1_000_000


def api_usd(api: ApiPrice, input_tokens: float, output_tokens: float) -> float:
    """What the API charges for these tokens."""
    return (input_tokens * api.usd_per_m_input + output_tokens * api.usd_per_m_output) / MILLION


@dataclass(frozen=True)
class BreakEven:
    """The sustained output rate at which the cluster's hour costs what the API charges for that hour's tokens.

    The API bills per token, the cluster per hour: below this rate the API is cheaper, above it the cluster. Input
    tokens come with every output token at the mix's ratio, so they count towards the API's bill too.
    """

    cluster_usd_per_hour: float
    api: ApiPrice
    mix: TokenMix

    @property
    def api_usd_per_m_output(self) -> float:
        """The API's dollars per 1M output tokens, with their input tokens at the mix's ratio."""
        return self.mix.input_per_output * self.api.usd_per_m_input + self.api.usd_per_m_output

    @property
    def output_tokens_per_hour(self) -> float:
        return self.cluster_usd_per_hour / self.api_usd_per_m_output * MILLION

    @property
    def input_tokens_per_hour(self) -> float:
        return self.output_tokens_per_hour * self.mix.input_per_output

    @property
    def output_tokens_per_second(self) -> float:
        return self.output_tokens_per_hour / 3600

    def summary(self) -> str:
        return (f"{self.output_tokens_per_hour:,.0f} output tokens per hour sustained "
                f"({self.output_tokens_per_second:,.1f}/s) with {self.input_tokens_per_hour:,.0f} input tokens: the "
                f"API would charge ${self.cluster_usd_per_hour:,.2f} for that hour (${self.api_usd_per_m_output:,.2f} "
                "per 1M output tokens, their input included), what the cluster costs; below it the API is cheaper")

    def to_json(self) -> dict[str, Any]:
        return {"output_tokens_per_hour": round(self.output_tokens_per_hour),
                "output_tokens_per_second": round(self.output_tokens_per_second, 2),
                "input_tokens_per_hour": round(self.input_tokens_per_hour),
                "cluster_usd_per_hour": self.cluster_usd_per_hour,
                "api_usd_per_m_output_with_input": round(self.api_usd_per_m_output, 4),
                "api": _api_json(self.api), "input_tokens_per_output_token": self.mix.input_per_output,
                "mix_source": self.mix.source, "summary": self.summary()}


def break_even(cluster_usd_per_hour: float | None, api: ApiPrice, mix: TokenMix) -> BreakEven | None:
    """None when the cluster's hourly cost is unknown (no price for its GPU)."""
    if cluster_usd_per_hour is None:
        return None
    return BreakEven(cluster_usd_per_hour, api, mix)


@dataclass(frozen=True)
class TokenCost:
    """What the tokens served so far cost on the cluster, and what the API would have charged for them."""

    input_tokens: int
    output_tokens: int
    spent_usd: float | None  # None when the VMs' creation times are unknown (no Hyperstack API key)
    api: ApiPrice

    @property
    def usd_per_m_output(self) -> float | None:
        """The cluster's dollars so far per 1M output tokens so far; None while it has served none."""
        if self.spent_usd is None or self.output_tokens <= 0:
            return None
        return self.spent_usd / self.output_tokens * MILLION

    @property
    def api_usd_same_tokens(self) -> float:
        return api_usd(self.api, self.input_tokens, self.output_tokens)

    @property
    def api_usd_per_m_output(self) -> float | None:
        """The API's price per 1M output tokens for this traffic, its input included."""
        if self.output_tokens <= 0:
            return None
        return self.api_usd_same_tokens / self.output_tokens * MILLION

    def summary(self) -> str:
        served = f"{self.input_tokens:,} input + {self.output_tokens:,} output tokens served"
        api = f"the API would have charged ${self.api_usd_same_tokens:,.2f}"
        if self.spent_usd is None:
            return f"{served}; {api} (the cluster's spend needs the VMs' creation times: set HYPERSTACK_API_KEY)"
        per_m = self.usd_per_m_output
        if per_m is None:
            return (f"{served}: ${self.spent_usd:,.2f} spent and no output token yet, so no cost per token; "
                    f"{api}")
        api_per_m = self.api_usd_per_m_output
        return (f"{served}: ${self.spent_usd:,.2f} spent, ${per_m:,.2f} per 1M output tokens so far; {api}, "
                f"${api_per_m:,.2f} per 1M output tokens with their input ({self.api.name}, {self.api.as_of})")

    def to_json(self) -> dict[str, Any]:
        per_m, api_per_m = self.usd_per_m_output, self.api_usd_per_m_output
        return {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
                "spent_usd": self.spent_usd,
                "usd_per_m_output": None if per_m is None else round(per_m, 4),
                "api_usd_same_tokens": round(self.api_usd_same_tokens, 4),
                "api_usd_per_m_output_with_input": None if api_per_m is None else round(api_per_m, 4),
                "api": _api_json(self.api), "summary": self.summary()}


def token_cost(spent_usd: float | None, input_tokens: int | None, output_tokens: int | None,
               api: ApiPrice) -> TokenCost:
    """Missing counters count as zero: an engine that has served nothing exports none."""
    return TokenCost(max(int(input_tokens or 0), 0), max(int(output_tokens or 0), 0), spent_usd, api)


def _api_json(api: ApiPrice) -> dict[str, Any]:
    return {"name": api.name, "usd_per_m_input": api.usd_per_m_input, "usd_per_m_output": api.usd_per_m_output,
            "source": api.source, "as_of": api.as_of}
