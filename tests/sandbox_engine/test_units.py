"""Unit tests of the sandbox engine's parts: URNs, durations, config loading, property helpers, the state file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sandbox import props
from sandbox.config import ConfigError, load_project, load_stack_config
from sandbox.monitor import make_urn, parse_duration
from sandbox.state import ResourceState, StateError, StateFile, plain_outputs, read_outputs

pytestmark = pytest.mark.timeout(30)


def test_urns_keep_the_parent_type_chain_but_not_the_root_stack() -> None:
    stack = make_urn("dev", "proj", "", "pulumi:pulumi:Stack", "proj-dev")
    assert stack == "urn:pulumi:dev::proj::pulumi:pulumi:Stack::proj-dev"
    top = make_urn("dev", "proj", stack, "kimi:cluster:GpuNode", "node-0")
    assert top == "urn:pulumi:dev::proj::kimi:cluster:GpuNode::node-0"
    child = make_urn("dev", "proj", top, "command:remote:Command", "node-0-ready")
    assert child == "urn:pulumi:dev::proj::kimi:cluster:GpuNode$command:remote:Command::node-0-ready"
    grandchild = make_urn("dev", "proj", child, "x:y:Z", "z")
    assert grandchild == "urn:pulumi:dev::proj::kimi:cluster:GpuNode$command:remote:Command$x:y:Z::z"


def test_custom_timeouts_parse_as_go_durations() -> None:
    assert parse_duration("") is None
    assert parse_duration("90s") == 90
    assert parse_duration("1h30m") == 5400
    assert parse_duration("1.5m") == 90
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration("ten minutes")


def _project(tmp_path: Path, stack_yaml: str, project_config: str = "") -> Path:
    (tmp_path / "Pulumi.yaml").write_text(f"name: demo\nruntime: python\n{project_config}")
    (tmp_path / "__main__.py").write_text("")
    (tmp_path / "Pulumi.dev.yaml").write_text(stack_yaml)
    return tmp_path


def test_config_layers_defaults_stack_file_and_overrides(tmp_path: Path) -> None:
    project = load_project(_project(
        tmp_path,
        "config:\n  demo:count: 3\n  demo:flag: true\n  demo:tags:\n    a: b\n  aws:region: eu-west-1\n",
        "config:\n  demo:size:\n    default: small\n  demo:count:\n    default: 1\n",
    ))
    config = load_stack_config(project, "dev", {"size": "large"}, {"token": "t0ps3cret"})
    assert config.values == {
        "demo:size": "large", "demo:count": "3", "demo:flag": "true", "demo:tags": '{"a": "b"}',
        "aws:region": "eu-west-1", "demo:token": "t0ps3cret",
    }
    assert config.secret_keys == {"demo:token"}
    assert props.is_secret(config.wire()["demo:token"])


def test_secure_config_values_need_an_override_naming_the_key(tmp_path: Path) -> None:
    project = load_project(_project(tmp_path, "config:\n  demo:apiKey:\n    secure: v1:abc\n"))
    with pytest.raises(ConfigError, match="demo:apiKey"):
        load_stack_config(project, "dev")
    config = load_stack_config(project, "dev", overrides={"apiKey": "plain-override"})
    # Overriding a secure key keeps it secret.
    assert config.values["demo:apiKey"] == "plain-override" and "demo:apiKey" in config.secret_keys


def test_a_directory_without_pulumi_yaml_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no Pulumi.yaml"):
        load_project(tmp_path)


def test_secret_helpers_follow_the_engine_rules() -> None:
    secret = props.make_secret("s3cr3t-value")
    inputs = {"password": secret, "nested": {"k": secret}, "plain": "x"}
    outputs = {"password": "s3cr3t-value", "nested": {"k": "s3cr3t-value"}, "plain": "x", "extra": 1}
    marked = props.annotate_secrets(outputs, inputs)
    assert props.is_secret(marked["password"]) and props.is_secret(marked["nested"])
    assert marked["plain"] == "x" and marked["extra"] == 1
    assert props.is_secret(props.mark_secret_keys(outputs, ["extra"])["extra"])
    assert props.strip_secrets(inputs) == {"password": "s3cr3t-value", "nested": {"k": "s3cr3t-value"}, "plain": "x"}
    assert list(props.secret_strings(inputs)) == ["s3cr3t-value", "s3cr3t-value"]
    assert props.render({"a": secret, "b": [1, "two"]}) == '{"a": [secret], "b": [1, "two"]}'
    assert props.struct_to_json(props.json_to_struct({"n": 3, "f": 2.5, "l": [True, None]})) == {
        "n": 3, "f": 2.5, "l": [True, None],
    }


def test_state_is_written_atomically_and_bound_to_its_stack(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    state = StateFile.open(path, "demo", "dev")
    stack = ResourceState(urn="urn:pulumi:dev::demo::pulumi:pulumi:Stack::demo-dev", type="pulumi:pulumi:Stack",
                          name="demo-dev", custom=False, outputs={"url": "http://x", "key": props.make_secret("k")})
    state.put(stack)
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]
    assert read_outputs(path) == stack.outputs
    assert plain_outputs(read_outputs(path)) == ({"url": "http://x", "key": "k"}, frozenset({"key"}))
    reopened = StateFile.open(path, "demo", "dev")
    assert reopened.live(stack.urn) == stack
    with pytest.raises(StateError, match="belongs to project 'demo' stack 'dev'"):
        StateFile.open(path, "demo", "prod")
    doc = json.loads(path.read_text())
    assert doc["version"] == 1 and doc["pending_operations"] == []
    # A resource a line (json's C encoder, no indent=), text with newlines and quotes kept exactly.
    script = ResourceState(urn="urn:pulumi:dev::demo::command:remote:Command::s", type="command:remote:Command",
                           name="s", custom=True, inputs={"create": 'echo "a"\nexit 0\n'})
    state.put(script)
    state.begin(script.urn, script.type, "update")
    lines = path.read_text().splitlines()
    assert [line for line in lines if line.startswith("  {")] == [f"  {json.dumps(r.to_json())}," for r in [stack]] \
        + [f"  {json.dumps(script.to_json())}"]
    assert StateFile.open(path, "demo", "dev").live(script.urn) == script
    assert json.loads(path.read_text())["pending_operations"][0]["op"] == "update"


def test_a_saved_resource_is_encoded_again_only_when_a_field_is_set(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    state = StateFile.open(path, "demo", "dev")
    res = ResourceState(urn="urn:pulumi:dev::demo::pulumi:pulumi:Stack::demo-dev", type="pulumi:pulumi:Stack",
                        name="demo-dev", custom=False, outputs={"url": "http://x"})
    state.put(res)
    first = res.line()
    assert res.line() is first  # the next save reuses it
    res.outputs = {"url": "http://y"}  # RegisterResourceOutputs replaces the dict
    state.save()
    assert read_outputs(path) == {"url": "http://y"}
    state.complete(res.urn, "update", retire=res)  # a replaced resource marked for deletion
    assert json.loads(path.read_text())["resources"][0]["delete"] is True
    assert StateFile.open(path, "demo", "dev").resources == [res]


def test_a_resource_depends_on_its_dependencies_parent_and_provider() -> None:
    res = ResourceState(urn="urn:c", type="t", name="c", custom=True, parent="urn:p", dependencies=["urn:d"],
                        provider="urn:pulumi:dev::demo::pulumi:providers:command::cmd::1234-abcd")
    assert res.depends_on() == {"urn:p", "urn:d", "urn:pulumi:dev::demo::pulumi:providers:command::cmd"}
