"""A small requests client for the Hyperstack (NexGen Cloud Infrahub) REST API.

One exception type, bounded retries (429 backoff for every method; 5xx only for GET/DELETE), typed helpers.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import requests
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from kimi_cluster.hyperstack_api.records import (
    EnvironmentRecord,
    FlavorRecord,
    ImageRecord,
    KeypairRecord,
    SecurityRuleRecord,
    VmRecord,
)

DEFAULT_API_URL = "https://infrahub-api.nexgencloud.com/v1"
API_URL_CONFIG = "hyperstack:apiUrl"
API_KEY_CONFIG = "hyperstack:apiKey"
RETRY_BASE_CONFIG = "hyperstack:retryBaseSeconds"
API_URL_ENV = "HYPERSTACK_API_URL"
API_KEY_ENV = "HYPERSTACK_API_KEY"
RETRY_BASE_ENV = "HYPERSTACK_RETRY_BASE_SECONDS"

# The API documents a 500 requests/minute budget and asks clients to wait >= 1 s, double, and stop after 5.
RATE_LIMIT_TRIES = 5
DEFAULT_RETRY_BASE_SECONDS = 1.0
# The first 429 waits the base, then each try doubles it (RATE_LIMIT_TRIES - 1 waits, 15 bases in all): a minute of
# base is a quarter of an hour of backoff; 0 (no wait) is the tests'. Past it, a typo sleeps for years.
MAX_RETRY_BASE_SECONDS = 60.0
# (connect, read): creates can take a while to answer, but nothing should hang a deployment forever.
DEFAULT_TIMEOUT = (10.0, 120.0)
SERVER_ERROR_STATUSES = (500, 502, 503, 504)
_PAGE_SIZE = 100
_LOGGER = logging.getLogger(__name__)
_MAX_PAGES = 200


def retry_base_problem(value: Any) -> str | None:
    """Why `value` (hyperstack:retryBaseSeconds or HYPERSTACK_RETRY_BASE_SECONDS, text or a number) is no backoff
    base, or None."""
    try:
        seconds = float(str(value).strip())
    except ValueError:
        return f"must be a number of seconds, got {str(value)[:40]!r}"
    if not 0 <= seconds <= MAX_RETRY_BASE_SECONDS:  # also false for NaN
        return (f"{str(value)[:40]!r} is not a number of seconds from 0 to {MAX_RETRY_BASE_SECONDS:g} (the backoff "
                f"doubles it {RATE_LIMIT_TRIES - 2} times)")
    return None


class HyperstackError(Exception):
    """Every failure talking to Hyperstack: HTTP errors, `status: false` bodies, transport errors, bad settings.

    `status` is None when no HTTP answer arrived (connection error, timeout) or the request was never sent.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        error_reason: str = "bad_request",
        method: str = "",
        path: str = "",
    ) -> None:
        self.status = status
        self.error_reason = error_reason
        self.message = message
        self.method = method
        self.path = path
        where = f"{method} {path}: " if method else ""
        code = f"HTTP {status} " if status is not None else ""
        super().__init__(f"Hyperstack {where}{code}{error_reason}: {message}")

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def outcome_unknown(self) -> bool:
        """True when the server may have acted on the request although we got no success answer."""
        return self.error_reason in ("timeout", "connection_error") or (
            self.status is not None and self.status >= 500
        )


@dataclass(frozen=True)
class ApiSettings:
    """Where to reach the API and with which key; resolved per provider call (the client's settings, not the
    stack config of kimi_cluster.settings.Settings).

    The key is never a resource input or output. Set with `pulumi config set --secret hyperstack:apiKey`, it is
    still in the state: encrypted, among the inputs of the default `pulumi-python` provider, from which
    `pulumi destroy` configures the providers. So the environment's `HYPERSTACK_API_KEY` wins over
    `hyperstack:apiKey`: a key rotated after `up` reaches `destroy` as `HYPERSTACK_API_KEY=<new> pulumi destroy`.
    """

    api_url: str
    api_key: str = field(repr=False)
    retry_base_seconds: float = DEFAULT_RETRY_BASE_SECONDS

    @classmethod
    def resolve(cls, config: Mapping[str, Any] | None = None) -> ApiSettings:
        """The key: the environment first, then stack config; the URL and backoff: stack config first (a stack file
        that pins a loopback URL keeps a real key in the environment away from the real API). Fails before any
        request if no key is found."""
        config = config or {}

        def pick(config_key: str, env_key: str, env_first: bool = False) -> str | None:
            sources = (os.environ.get(env_key), config.get(config_key))
            for value in sources if env_first else reversed(sources):
                if value not in (None, ""):
                    return str(value).strip()
            return None

        key = pick(API_KEY_CONFIG, API_KEY_ENV, env_first=True)
        if not key:
            raise HyperstackError(
                f"no Hyperstack API key: set it with `pulumi config set --secret {API_KEY_CONFIG} <key>` "
                f"or export {API_KEY_ENV}",
                error_reason="missing_api_key",
            )
        url = (pick(API_URL_CONFIG, API_URL_ENV) or DEFAULT_API_URL).rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise HyperstackError(
                f"{API_URL_CONFIG} / {API_URL_ENV} must be an http(s) URL, got {url!r}",
                error_reason="bad_config",
            )
        base = pick(RETRY_BASE_CONFIG, RETRY_BASE_ENV)
        problem = retry_base_problem(base) if base is not None else None
        if problem:
            source = RETRY_BASE_CONFIG if config.get(RETRY_BASE_CONFIG) not in (None, "") else RETRY_BASE_ENV
            raise HyperstackError(f"{source} {problem}", error_reason="bad_config")
        retry_base = float(base) if base is not None else DEFAULT_RETRY_BASE_SECONDS
        return cls(api_url=url, api_key=key, retry_base_seconds=retry_base)


class HyperstackClient:
    """Thin typed access to the endpoints the providers use. Holds a session; build one per operation."""

    def __init__(
        self,
        api_url: str,
        api_key: str,
        *,
        timeout: tuple[float, float] = DEFAULT_TIMEOUT,
        retry_base_seconds: float = DEFAULT_RETRY_BASE_SECONDS,
        rate_limit_tries: int = RATE_LIMIT_TRIES,
        server_error_retries: int = 3,
        sleep: Callable[[float], None] = time.sleep,
        log: Callable[[str], None] | None = None,
    ) -> None:
        if not api_key:
            raise HyperstackError(
                f"no Hyperstack API key (set {API_KEY_CONFIG} or {API_KEY_ENV})", error_reason="missing_api_key"
            )
        self.api_url = api_url.rstrip("/")
        self._api_key = api_key
        self.timeout = timeout
        self.retry_base_seconds = retry_base_seconds
        self.rate_limit_tries = rate_limit_tries
        self._sleep = sleep
        # Where each 429 backoff is announced: the providers pass pulumi.log.info; standalone, the logging module.
        self._log = log or _LOGGER.info
        self._session = requests.Session()
        self._session.headers.update({"api_key": api_key, "Accept": "application/json"})
        # 5xx and dropped reads are retried only where repeating the call is harmless. urllib3 retries failed
        # connects for every method: the request never left, so even a POST is safe to send again.
        retry = Retry(
            total=server_error_retries,
            connect=server_error_retries,
            read=server_error_retries,
            status=server_error_retries,
            other=0,
            redirect=0,
            status_forcelist=SERVER_ERROR_STATUSES,
            allowed_methods=frozenset({"GET", "DELETE"}),
            backoff_factor=retry_base_seconds / 2,
            raise_on_status=False,
            respect_retry_after_header=False,
        )
        adapter = HTTPAdapter(max_retries=retry)
        self._session.mount("http://", adapter)
        self._session.mount("https://", adapter)

    @classmethod
    def from_settings(cls, settings: ApiSettings, **kwargs: Any) -> HyperstackClient:
        return cls(settings.api_url, settings.api_key, retry_base_seconds=settings.retry_base_seconds, **kwargs)

    def close(self) -> None:
        self._session.close()

    def __enter__(self) -> HyperstackClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"HyperstackClient({self.api_url!r})"

    # -- transport ---------------------------------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        json: Mapping[str, Any] | None = None,
    ) -> Any:
        """Send one call; returns the decoded JSON body or raises HyperstackError."""
        url = self.api_url + path
        delay = self.retry_base_seconds
        for attempt in range(1, self.rate_limit_tries + 1):
            try:
                response = self._session.request(method, url, params=params, json=json, timeout=self.timeout)
            except requests.Timeout as exc:
                raise self._error(f"no answer within {self.timeout[1]:g} s ({type(exc).__name__})",
                                  None, "timeout", method, path) from None
            except requests.RequestException as exc:
                raise self._error(f"could not reach {self.api_url} ({type(exc).__name__}: {exc})",
                                  None, "connection_error", method, path) from None
            # A 429 means the request was rejected before processing, so any method may be sent again.
            if response.status_code != 429:
                return self._decode(response, method, path)
            if attempt < self.rate_limit_tries:
                self._log(f"Hyperstack {method} {path}: HTTP 429 (rate limited), retrying in {delay:g} s "
                          f"(try {attempt + 1} of {self.rate_limit_tries})")
                self._sleep(delay)
                delay *= 2
        raise self._error(
            f"rate limited: still HTTP 429 after {self.rate_limit_tries} tries with exponential backoff from "
            f"{self.retry_base_seconds:g} s (Hyperstack allows 500 requests per minute per IP)",
            429, "rate_limited", method, path,
        )

    def _decode(self, response: requests.Response, method: str, path: str) -> Any:
        try:
            body = response.json() if response.content else {}
        except ValueError:
            body = None
        if isinstance(body, dict):
            failed = body.get("status") is False
            message = str(body.get("message") or "")
            reason = body.get("error_reason") or None
        else:
            failed, message, reason = False, "", None
        if response.status_code >= 400 or failed or body is None:
            if not message:
                message = (response.text or response.reason or "no message")[:300]
            if response.status_code == 401:
                message += f" (check the API key from {API_KEY_CONFIG} or {API_KEY_ENV}: missing, wrong or revoked)"
            # The docs: a body without error_reason is to be read as bad_request.
            raise self._error(message, response.status_code, reason or "bad_request", method, path)
        return body

    def _error(self, message: str, status: int | None, reason: str, method: str, path: str) -> HyperstackError:
        # The server (or a proxy) could echo the header back; the key must never reach a log or a state file.
        message = message.replace(self._api_key, "***")
        return HyperstackError(message, status=status, error_reason=reason, method=method, path=path)

    def _paged(self, path: str, key: str, params: Mapping[str, Any], size_param: str = "pageSize",
               flatten: Callable[[Any], list[Any]] | None = None) -> list[Any]:
        items: list[Any] = []  # JSON objects; each caller names the record type
        seen: set[Any] = set()
        for page in range(1, _MAX_PAGES + 1):
            body = self.request("GET", path, params={**params, "page": page, size_param: _PAGE_SIZE})
            raw = body.get(key) or []
            batch = flatten(raw) if flatten else raw
            fresh = [item for item in batch if item.get("id") not in seen]
            if not fresh:  # empty page, or a server that ignores paging and repeats itself
                break
            items.extend(fresh)
            seen.update(item.get("id") for item in fresh)
            if len(batch) < (body.get("page_size") or body.get("per_page") or _PAGE_SIZE):
                break
        return items

    # -- regions, flavors, images ------------------------------------------------------------------------------

    def list_regions(self) -> list[dict]:
        return list(self.request("GET", "/core/regions").get("regions") or [])

    def list_flavors(self, region: str) -> list[FlavorRecord]:
        groups = self.request("GET", "/core/flavors", params={"region": region}).get("data") or []
        return [f for g in groups for f in (g.get("flavors") or []) if f.get("region_name", region) == region]

    def list_images(self, region: str) -> list[ImageRecord]:
        def flatten(groups: Any) -> list[Any]:
            return [i for g in groups for i in (g.get("images") or [])]

        images = self._paged("/core/images", "images", {"region": region}, size_param="per_page", flatten=flatten)
        return [i for i in images if i.get("region_name", region) == region]

    # -- environments ------------------------------------------------------------------------------------------

    def create_environment(self, name: str, region: str) -> EnvironmentRecord:
        return self.request("POST", "/core/environments", json={"name": name, "region": region})["environment"]

    def list_environments(self, search: str | None = None) -> list[EnvironmentRecord]:
        return self._paged("/core/environments", "environments", {"search": search} if search else {})

    def get_environment(self, environment_id: int) -> EnvironmentRecord:
        return self.request("GET", f"/core/environments/{int(environment_id)}")["environment"]

    def delete_environment(self, environment_id: int) -> None:
        self.request("DELETE", f"/core/environments/{int(environment_id)}")

    # -- keypairs (import and list are plural paths, rename and delete singular) -------------------------------

    def import_keypair(self, name: str, environment_name: str, public_key: str) -> KeypairRecord:
        body = {"name": name, "environment_name": environment_name, "public_key": public_key}
        return self.request("POST", "/core/keypairs", json=body)["keypair"]

    def list_keypairs(self, search: str | None = None) -> list[KeypairRecord]:
        return self._paged("/core/keypairs", "keypairs", {"search": search} if search else {})

    def delete_keypair(self, keypair_id: int) -> None:
        self.request("DELETE", f"/core/keypair/{int(keypair_id)}")

    # -- virtual machines --------------------------------------------------------------------------------------

    def create_vm(
        self,
        *,
        name: str,
        environment_name: str,
        flavor_name: str,
        image_name: str,
        key_name: str,
        labels: Iterable[str] = (),
        user_data: str | None = None,
        assign_floating_ip: bool = True,
    ) -> VmRecord:
        """Create exactly one VM. Never retried here: on an unknown outcome the caller looks it up by name."""
        body: dict[str, Any] = {
            "name": name,
            "environment_name": environment_name,
            "flavor_name": flavor_name,
            "image_name": image_name,
            "key_name": key_name,
            "count": 1,
            "assign_floating_ip": assign_floating_ip,
            # The SDK default (true) moves SSH off port 22; the deployment connects to floating_ip:22.
            "enable_port_randomization": False,
            "labels": list(labels),
        }
        if user_data is not None:
            body["user_data"] = user_data
        instances = self.request("POST", "/core/virtual-machines", json=body).get("instances") or []
        if len(instances) != 1:
            raise HyperstackError(f"expected 1 instance in the create answer, got {len(instances)}",
                                  status=200, error_reason="unexpected_response",
                                  method="POST", path="/core/virtual-machines")
        return instances[0]

    def list_vms(self, search: str | None = None, environment: str | None = None) -> list[VmRecord]:
        params: dict[str, Any] = {}
        if search:
            params["search"] = search
        if environment:
            params["environment"] = environment
            params["exact_environment_match"] = "true"
        return self._paged("/core/virtual-machines", "instances", params)

    def get_vm(self, vm_id: int) -> VmRecord:
        return self.request("GET", f"/core/virtual-machines/{int(vm_id)}")["instance"]

    def delete_vm(self, vm_id: int) -> None:
        self.request("DELETE", f"/core/virtual-machines/{int(vm_id)}")

    def set_vm_labels(self, vm_id: int, labels: Iterable[str]) -> None:
        self.request("PUT", f"/core/virtual-machines/{int(vm_id)}/label", json={"labels": list(labels)})

    def vm_events(self, vm_id: int) -> list[dict]:
        return list(self.request("GET", f"/core/virtual-machines/{int(vm_id)}/events").get("instance_events") or [])

    def add_vm_security_rule(
        self,
        vm_id: int,
        *,
        direction: str,
        protocol: str,
        ethertype: str,
        remote_ip_prefix: str,
        port_range_min: int | None = None,
        port_range_max: int | None = None,
    ) -> SecurityRuleRecord:
        body: dict[str, Any] = {
            "direction": direction,
            "protocol": protocol,
            "ethertype": ethertype,
            "remote_ip_prefix": remote_ip_prefix,
        }
        if port_range_min is not None:
            body["port_range_min"] = int(port_range_min)
        if port_range_max is not None:
            body["port_range_max"] = int(port_range_max)
        return self.request("POST", f"/core/virtual-machines/{int(vm_id)}/sg-rules", json=body)["security_rule"]

    def delete_vm_security_rule(self, vm_id: int, rule_id: int) -> None:
        self.request("DELETE", f"/core/virtual-machines/{int(vm_id)}/sg-rules/{int(rule_id)}")
