"""A real `pulumi preview` hands the providers unknown inputs as `pulumi.output.Unknown` objects: `check` must let
them pass and `diff` must count them as possible changes, never raise (the first real preview of this program
failed with "region must be a non-empty string"; a second up's preview with "'Unknown' object is not iterable")."""

from __future__ import annotations

import pytest
from pulumi.output import Unknown

from kimi_cluster.deploy.generated_secret import _GeneratedSecretProvider
from kimi_cluster.deploy.hyperstack_providers.placement import PlacementProvider
from kimi_cluster.deploy.hyperstack_providers.providers import (
    EnvironmentProvider,
    KeypairProvider,
    SecurityRuleProvider,
    VirtualMachineProvider,
)
from kimi_cluster.deploy.tls import _ServerCertProvider
from kimi_cluster.deploy.unknowns import is_unknown

CHECKED = {
    "environment": (EnvironmentProvider, ("name", "region")),
    "keypair": (KeypairProvider, ("name", "environment_name", "public_key")),
    "vm": (VirtualMachineProvider, ("name", "environment_name", "region", "flavor_name", "image_name", "key_name",
                                    "labels", "user_data")),
    "rule": (SecurityRuleProvider, ("vm_id", "direction", "ethertype", "protocol", "remote_ip_prefix",
                                    "port_range_min", "port_range_max")),
    "placement": (PlacementProvider, ("regions", "flavor_name", "count", "environment_name")),
}


def test_is_unknown_knows_both_forms_and_nothing_else() -> None:
    assert is_unknown(Unknown()) and is_unknown("04da6b54-80e4-46f7-96ec-b56ff0331ba9")
    plain: tuple[object, ...] = (None, "", "CANADA-1", 0, [], {})
    assert not any(is_unknown(v) for v in plain)


@pytest.mark.parametrize("kind", sorted(CHECKED))
def test_check_lets_every_unknown_input_pass(kind: str) -> None:
    provider, keys = CHECKED[kind]
    result = provider().check({}, {key: Unknown() for key in keys})
    assert result.failures == [], [(f.property, f.reason) for f in result.failures]


def test_check_still_refuses_a_known_bad_value_beside_unknowns() -> None:
    result = EnvironmentProvider().check({}, {"name": "", "region": Unknown()})
    assert [f.property for f in result.failures] == ["name"]


def test_diff_counts_an_unknown_address_or_version_as_a_replacement() -> None:
    cert = _ServerCertProvider().diff("cert-1", {"ip_addresses": ["10.0.0.2"], "dns_names": [], "ca_cert_pem": "x"},
                                      {"ip_addresses": Unknown(), "dns_names": [], "ca_cert_pem": "x"})
    assert cert.replaces == ["ip_addresses"]
    secret = _GeneratedSecretProvider().diff("s-1", {"length": 32, "version": 1}, {"length": 32, "version": Unknown()})
    assert secret.replaces == ["version"]
