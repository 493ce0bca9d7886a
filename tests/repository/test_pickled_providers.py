"""Providers pickled by the code live stacks were created with still unpickle: `pulumi destroy` keeps working.

A dynamic resource's state holds `__provider`, the provider pickled by reference (module path and class name) by
`pulumi.dynamic.dynamic.serialize_provider`. The provider host (`pulumi/dynamic/__main__.py`, `get_provider`)
unpickles it with `dill.loads(base64.b64decode(...))` inside `pulumi.runtime._serialization._deserialize` before
every call, destroy included. tests/fixtures/pickled_providers.json (0.1.0's paths) and pickled_providers_0.2.0.json
(0.2.0 to 0.3.1's) hold one such string per provider class, each made once by tests/fixtures/make_pickled_providers.py
at the commit it names and never regenerated: a tidy-up that moves
or renames one of these modules or classes fails here instead of stranding a live stack's resources.
"""

from __future__ import annotations

import base64
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import dill
import pytest
from pulumi.dynamic import CheckResult, Config, ConfigureRequest, ResourceProvider
from pulumi.runtime._serialization import _deserialize

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
# One fixture per set of recorded paths: 0.1.0's (components/, checks_resource) and 0.2.0 to 0.3.1's
# (kimi_cluster.deploy.hyperstack, kept as aliases since 0.3.2 moved it to kimi_cluster.deploy.hyperstack_providers).
FIXTURE_SETS = {name: json.loads((FIXTURES / name).read_text())
                for name in ("pickled_providers.json", "pickled_providers_0.2.0.json")}
ENTRIES = [entry for fixture in FIXTURE_SETS.values() for entry in fixture["providers"]]
IDS = [f"{e['module']}.{e['class']}" for e in ENTRIES]

# The modules and their classes, as the live stacks recorded them: the fixtures must cover each one.
_HYPERSTACK = {"EnvironmentProvider", "KeypairProvider", "VirtualMachineProvider", "SecurityRuleProvider"}
RECORDED = {
    "components.hyperstack.providers": _HYPERSTACK,
    "components.hyperstack.placement": {"PlacementProvider"},
    "components.node": {"_HostKeyProvider"},
    "components.tls": {"_CaProvider", "_ServerCertProvider"},
    "components.generated_secret": {"_GeneratedSecretProvider"},
    "checks_resource": {"VerificationProvider"},
    "kimi_cluster.deploy.hyperstack.providers": _HYPERSTACK,
    "kimi_cluster.deploy.hyperstack.placement": {"PlacementProvider"},
    "kimi_cluster.deploy.vm": {"_HostKeyProvider"},
    "kimi_cluster.deploy.tls": {"_CaProvider", "_ServerCertProvider"},
    "kimi_cluster.deploy.generated_secret": {"_GeneratedSecretProvider"},
    "kimi_cluster.checks.verification_resource": {"VerificationProvider"},
}


def _host_deserialize(serialized: str) -> Any:
    """The provider host's own steps (get_provider in pulumi/dynamic/__main__.py), without starting its server."""
    return _deserialize(lambda: dill.loads(base64.b64decode(serialized)))


def test_the_fixture_covers_every_recorded_provider_class() -> None:
    found: dict[str, set[str]] = {}
    for entry in ENTRIES:
        found.setdefault(entry["module"], set()).add(entry["class"])
    assert found == RECORDED
    assert all(len(fixture["commit"]) == 40 for fixture in FIXTURE_SETS.values())


@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
def test_a_recorded_provider_unpickles_to_its_class_and_is_usable(entry: dict[str, str]) -> None:
    provider = _host_deserialize(entry["serialized"])
    assert isinstance(provider, ResourceProvider)
    # The recorded path is an alias of the class's new home (components/__init__.py): the same class object.
    assert type(provider) is getattr(importlib.import_module(entry["module"]), entry["class"])
    assert type(provider).__qualname__ == entry["class"]
    for method in ("check", "create", "delete", "diff", "update", "read", "configure"):
        assert callable(getattr(provider, method)), method
    # The host configures each provider once, with the stack config (none here), before the first call.
    provider.configure(ConfigureRequest(Config({}, "kimi-cluster")))
    # `check` on empty inputs answers with a result (failures naming the missing inputs allowed), as each
    # provider did when the fixture was made.
    result = provider.check({}, {})
    assert isinstance(result, CheckResult)
    assert all(failure.property for failure in result.failures or []), result.failures

@pytest.mark.timeout(120)
def test_each_recorded_provider_unpickles_in_a_fresh_interpreter_from_another_directory(tmp_path: Path) -> None:
    # What the provider host process has: no cwd on sys.path (PYTHONSAFEPATH), no PYTHONPATH, so only the project's
    # install (pip install -e .) can import the modules; the host's own steps, as _host_deserialize above.
    probe = (
        "import base64, json, sys\n"
        "import dill\n"
        "from pulumi.runtime._serialization import _deserialize\n"
        "for entry in json.load(sys.stdin):\n"
        "    provider = _deserialize(lambda: dill.loads(base64.b64decode(entry['serialized'])))\n"
        "    home = type(provider).__module__\n"
        "    print(entry['module'], type(provider).__qualname__, home.startswith('kimi_cluster.'))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", probe], input=json.dumps(ENTRIES), capture_output=True, text=True,
                          cwd=tmp_path, env={**env, "PYTHONSAFEPATH": "1"}, timeout=100)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:-1] == [f"{e['module']} {e['class']} True" for e in ENTRIES]
