"""Tests of the verification stack: config, the program under Pulumi's mocks (mocked StackReference with
a secret api_key), the provider's create/diff against the fake, and its unpickling in a fresh process.
"""

import base64
import contextlib
import gc
import json
import logging
import os
import runpy
import subprocess
import sys
from typing import Any

import dill
import pulumi
import pytest
from pulumi.dynamic.dynamic import serialize_provider
from pulumi.runtime import rpc
from pulumi.runtime.settings import SETTINGS

from kimi_cluster.checks import CHECK_NAMES, VerificationFailed, verification_resource, verification_stack
from tests.checks.conftest import KEY, MODEL, VERIFICATION_DIR, tls_material

CLUSTER = "organization/kimi-cluster/dev"
DYNAMIC_TYPE = "pulumi-python:dynamic/kimi-verification:EndpointVerification"


class ClusterMocks(pulumi.runtime.Mocks):
    """Plays the engine: the cluster stack's outputs, and the dynamic provider host for our resource."""

    def __init__(self, outputs, secret_names=("api_key",)):
        self.outputs = outputs
        self.secret_names = list(secret_names)
        self.verification_inputs = None

    def new_resource(self, args):
        if args.typ == "pulumi:pulumi:StackReference":
            assert args.inputs["name"] == CLUSTER
            return [args.name, {"name": CLUSTER, "outputs": self.outputs, "secretOutputNames": self.secret_names}]
        assert args.typ == DYNAMIC_TYPE
        self.verification_inputs = dict(args.inputs)
        # the engine strips secrets before calling a dynamic provider, which accepts none
        plain = {k: rpc.unwrap_rpc_secret(v) for k, v in args.inputs.items()}
        provider = dill.loads(base64.b64decode(plain.pop("__provider")))
        result = provider.create(plain)
        return [result.id, result.outs]

    def call(self, args):
        return {}


def _cluster_outputs(url):
    return {"endpoint_url": url, "served_model_name": MODEL, "model_revision": "rev-1", "api_key": KEY,
            "openai_base_url": url + "/v1", "ca_certificate": tls_material()["ca"]}


@contextlib.contextmanager
def _expect_failed_deployment():
    """A failed resource leaves its output futures holding the error; drop them quietly so asyncio
    does not log every one of them as 'never retrieved' later in the run."""
    asyncio_log = logging.getLogger("asyncio")
    level = asyncio_log.level
    try:
        yield
    finally:
        asyncio_log.setLevel(logging.CRITICAL)
        try:
            SETTINGS.outputs.clear()
            SETTINGS.rpc_manager.clear()
            gc.collect()
        finally:
            asyncio_log.setLevel(level)


def _run_build(mocks, settings, sink):
    """Build the stack under `mocks` and put every resolved output into `sink`."""
    pulumi.runtime.set_mocks(mocks, project=verification_stack.PROJECT, stack="test")

    @pulumi.runtime.test
    def program():
        outputs = verification_stack.build(settings)
        names = sorted(outputs)
        values = pulumi.Output.all(*[pulumi.Output.from_input(outputs[n]) for n in names])
        return values.apply(lambda resolved: sink.update(zip(names, resolved, strict=True)))

    program()


def test_outputs_when_checks_pass(fake):
    sink: dict[str, Any] = {}
    with fake() as server:
        mocks = ClusterMocks(_cluster_outputs(server.url))
        _run_build(mocks, verification_stack.StackSettings(CLUSTER, run_id="1", timeout_seconds=5), sink)
    assert sink["verified"] is True and sink["all_checks_passed"] is True
    assert sink["verified_endpoint_url"] == server.url
    assert sink["verified_model"] == MODEL and sink["verified_model_revision"] == "rev-1"
    report = sink["verification_report"]
    assert [row["name"] for row in report] == list(CHECK_NAMES)
    assert all(row["passed"] and row["latency_s"] >= 0 and row["required"] for row in report)
    # the key reached the resource as a secret input and appears in no output
    assert rpc.is_rpc_secret(mocks.verification_inputs["api_key"])
    assert KEY not in json.dumps(sink, default=str)


def test_outputs_stay_plain_and_key_input_secret_even_if_cluster_forgot(fake):
    sink: dict[str, Any] = {}
    with fake() as server:
        mocks = ClusterMocks(_cluster_outputs(server.url), secret_names=())
        _run_build(mocks, verification_stack.StackSettings(CLUSTER, timeout_seconds=5, only=("models", "auth"),
                                                           required_checks=("models", "auth")), sink)
    assert rpc.is_rpc_secret(mocks.verification_inputs["api_key"])
    assert [row["name"] for row in sink["verification_report"]] == ["models", "auth"]


def test_up_fails_naming_the_failed_required_check(fake):
    with fake(faults=["no_image"]) as server:
        mocks = ClusterMocks(_cluster_outputs(server.url))
        with _expect_failed_deployment(), pytest.raises(VerificationFailed) as caught:
            _run_build(mocks, verification_stack.StackSettings(CLUSTER, timeout_seconds=5), {})
    assert "required checks failed: image" in str(caught.value)
    assert KEY not in str(caught.value)


def test_a_failed_optional_check_is_reported_not_fatal(fake):
    sink: dict[str, Any] = {}
    with fake(faults=["no_image"]) as server:
        mocks = ClusterMocks(_cluster_outputs(server.url))
        settings = verification_stack.StackSettings(
            CLUSTER, timeout_seconds=5, required_checks=tuple(n for n in CHECK_NAMES if n != "image"))
        _run_build(mocks, settings, sink)
    assert sink["verified"] is True and sink["all_checks_passed"] is False
    assert sink["failed_checks"] == ["image"]


def test_missing_cluster_output_is_named(fake):
    outputs = _cluster_outputs("http://127.0.0.1:9")
    del outputs["endpoint_url"]
    with _expect_failed_deployment(), pytest.raises(ValueError, match="has no endpoint_url output"):
        _run_build(ClusterMocks(outputs), verification_stack.StackSettings(CLUSTER, timeout_seconds=1), {})


def test_an_undecryptable_secret_output_asks_for_the_same_passphrase(fake):
    # With another passphrase the CLI's StackReference elides the secrets it cannot decrypt: api_key is simply
    # absent while the plain outputs are there.
    outputs = _cluster_outputs("http://127.0.0.1:9")
    del outputs["api_key"]
    with _expect_failed_deployment(), pytest.raises(ValueError) as caught:
        _run_build(ClusterMocks(outputs), verification_stack.StackSettings(CLUSTER, timeout_seconds=1), {})
    assert "cannot decrypt the cluster stack's secrets: same passphrase?" in str(caught.value)
    assert "PULUMI_CONFIG_PASSPHRASE" in str(caught.value)


def test_main_program_exports_under_mocks(fake, monkeypatch):
    with fake() as server:
        mocks = ClusterMocks(_cluster_outputs(server.url))
        pulumi.runtime.set_mocks(mocks, project=verification_stack.PROJECT, stack="test")
        pulumi.runtime.set_all_config({
            "kimi-cluster-verification:clusterStack": CLUSTER,
            "kimi-cluster-verification:only": "models,auth,chat",
            "kimi-cluster-verification:timeoutSeconds": "5",
        })
        exported: dict[str, Any] = {}
        monkeypatch.setattr(pulumi, "export", lambda name, value: exported.__setitem__(name, value))
        sink: dict[str, Any] = {}

        @pulumi.runtime.test
        def program():
            runpy.run_path(VERIFICATION_DIR, run_name="__main__")
            names = sorted(exported)
            return pulumi.Output.all(*[pulumi.Output.from_input(exported[n]) for n in names]).apply(
                lambda values: sink.update(zip(names, values, strict=True)))

        try:
            program()
        finally:
            pulumi.runtime.set_all_config({})
    assert sink["verified_endpoint_url"] == server.url and sink["cluster_stack"] == CLUSTER
    assert [row["name"] for row in sink["verification_report"]] == ["models", "auth", "chat"]


# ---------------------------------------------------------------- settings


def test_settings_from_config():
    config = {"clusterStack": CLUSTER, "runId": "3", "timeoutSeconds": "120", "only": "stream,models,auth",
              "requiredChecks": '["models", "auth"]'}
    settings = verification_stack.settings_from_config(config.get)
    assert settings == verification_stack.StackSettings(CLUSTER, "3", 120.0, ("models", "auth", "stream"),
                                                        ("models", "auth"))
    defaults = verification_stack.settings_from_config({"clusterStack": CLUSTER}.get)
    assert defaults.only == defaults.required_checks == CHECK_NAMES


@pytest.mark.parametrize("config,key", [
    ({}, "clusterStack"),
    ({"clusterStack": CLUSTER, "timeoutSeconds": "soon"}, "timeoutSeconds"),
    ({"clusterStack": CLUSTER, "timeoutSeconds": "0"}, "timeoutSeconds"),
    ({"clusterStack": CLUSTER, "only": "models,psychic"}, "only"),
    ({"clusterStack": CLUSTER, "only": "models", "requiredChecks": "auth"}, "requiredChecks"),
])
def test_settings_errors_name_their_key(config, key):
    with pytest.raises(ValueError, match=f"kimi-cluster-verification:{key}"):
        verification_stack.settings_from_config(config.get)


@pytest.mark.parametrize("name", ["", "dev", "kimi-cluster/dev", "a/b/c/d", "org/kimi-cluster/dev; rm -rf ~"])
def test_cluster_stack_must_be_qualified_and_the_error_names_both_backends(name):
    with pytest.raises(ValueError) as caught:
        verification_stack.settings_from_config({"clusterStack": name}.get)
    text = str(caught.value)
    assert "kimi-cluster-verification:clusterStack" in text
    assert "organization/kimi-cluster/dev on a local backend" in text
    assert "<your-org>/kimi-cluster/dev on Pulumi Cloud" in text


# ---------------------------------------------------------------- the dynamic provider


def _props(url, **extra):
    props = {"endpoint_url": url, "served_model_name": MODEL, "model_revision": "rev-1", "api_key": KEY,
             "ca_certificate": tls_material()["ca"], "run_id": "1", "only": list(CHECK_NAMES),
             "required_checks": list(CHECK_NAMES), "timeout_seconds": 5.0}
    props.update(extra)
    return props


def test_provider_create_against_the_fake(fake):
    with fake(engine="vllm", proxied=True) as server:
        result = verification_resource.VerificationProvider().create(
            _props(server.url, ca_certificate=server.ca_certificate))
    assert result.id.startswith("verification-")
    assert result.outs["verified"] is True and result.outs["verified_endpoint_url"] == server.url
    assert "api_key" not in result.outs and KEY not in json.dumps(result.outs)


def test_provider_create_raises_for_a_failed_required_check(fake):
    with fake(faults=["bad_tool_args"]) as server:
        with pytest.raises(VerificationFailed, match="required checks failed: tool_calls"):
            verification_resource.VerificationProvider().create(_props(server.url))


def test_provider_diff():
    provider = verification_resource.VerificationProvider()
    olds = _props("http://10.0.0.1:8000")
    del olds["api_key"]  # recorded outputs never hold it
    same = provider.diff("id", olds, _props("http://10.0.0.1:8000"))
    assert same.changes is False and same.replaces == []
    for key, value in [("endpoint_url", "http://10.0.0.2:8000"), ("served_model_name", "other"),
                       ("model_revision", "rev-2"), ("run_id", "2")]:
        diff = provider.diff("id", olds, _props("http://10.0.0.1:8000", **{key: value}))
        assert diff.changes is True and diff.replaces == [key] and diff.delete_before_replace is True
    in_place = provider.diff("id", olds, _props("http://10.0.0.1:8000", only=["models"], required_checks=["models"]))
    assert in_place.changes is True and in_place.replaces == []
    unknown = provider.diff("id", olds, _props(pulumi.output.Unknown()))
    assert unknown.replaces == ["endpoint_url"]
    assert provider.diff("id", olds, _props("http://10.0.0.1:8000", api_key="rotated")).changes is False


def test_provider_check_names_bad_inputs():
    result = verification_resource.VerificationProvider().check({}, _props("", only=["models", "astrology"]))
    assert sorted(f.property for f in result.failures) == ["endpoint_url", "only"]


def test_provider_unpickles_and_runs_in_a_fresh_provider_host_process(fake):
    # Pulumi starts the dynamic provider host in the project directory with no PYTHONPATH of ours.
    serialized = serialize_provider(verification_resource.VerificationProvider())
    script = (
        "import base64, json, sys, dill\n"
        "provider = dill.loads(base64.b64decode(sys.argv[1]))\n"
        "result = provider.create(json.loads(sys.stdin.read()))\n"
        "print(json.dumps({'module': type(provider).__module__, 'outs': result.outs}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    with fake() as server:
        proc = subprocess.run(
            [sys.executable, "-c", script, serialized],
            input=json.dumps(_props(server.url, only=["models", "auth"], required_checks=["models", "auth"])),
            cwd=VERIFICATION_DIR, env=env, capture_output=True, text=True, timeout=60,
        )
    assert proc.returncode == 0, proc.stderr
    answer = json.loads(proc.stdout)
    assert answer["module"] == "kimi_cluster.checks.verification_resource"
    assert answer["outs"]["verified"] is True and KEY not in proc.stdout
