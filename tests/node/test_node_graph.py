"""The step table's chain under Pulumi's mocks (GpuNode, Readiness): the chain's order, what each step waits on, and
where secrets go."""

from __future__ import annotations

import base64

import pulumi

from kimi_cluster.blueprint.inputs import resolved_timing
from kimi_cluster.blueprint.stack import blueprint
from kimi_cluster.deploy.chain import Chain, StepGroup
from kimi_cluster.deploy.node_chain import GPU_NODE_TYPE
from kimi_cluster.deploy.remote_step import DIAL_ERROR_LIMIT, node_connection
from kimi_cluster.deploy.vm import host_key_cloud_config, host_key_user_data
from kimi_cluster.plan.steps.model import ProxyTls, VmSpot
from kimi_cluster.plan.steps.scripts import render_vm_scripts
from kimi_cluster.plan.steps.table import STEPS
from tests.node.conftest import make_settings
from tests.pulumi_harness import FAKE_HOST_PUBLIC_KEY, dumps, run

CANARY_SSH = "-----BEGIN OPENSSH PRIVATE KEY-----canary-ssh-7f3a"
CANARY_HF = "hf_canaryTOKEN9d2c"
CANARY_API = "endpoint-canary-key-b61d"
CANARY_PEER = "peer-canary-token-31c7"
CANARY_TLS = "-----BEGIN PRIVATE KEY-----canary-tls-5e0c"
CHAIN = "-----BEGIN CERTIFICATE-----server-----END CERTIFICATE-----\n"
CA = "-----BEGIN CERTIFICATE-----ca-----END CERTIFICATE-----\n"


def secret(value: str) -> pulumi.Output[str]:
    return pulumi.Output.secret(value)


SECRETS = {"hf_token": CANARY_HF, "peer_token": CANARY_PEER, "api_key": CANARY_API, "tls_private_key": CANARY_TLS}


def build_chain(settings, name: str, secrets: dict[str, str | None], gate: pulumi.Resource | None = None):
    """The step table's chain for a one-replica stack, made by kimi_cluster/deploy/chain.py as the cluster does,
    at fixed addresses (node r: public 198.51.100.<10 + r>, private 10.0.0.<10 + r>, VM id 1000 + r)."""
    cluster = StepGroup("kimi:cluster:InferenceCluster", name)
    bp = blueprint(settings, name)
    plans = bp.vm_plans
    homes: dict[str, pulumi.ComponentResource] = {p.resource: StepGroup(GPU_NODE_TYPE, p.resource) for p in plans}
    made: dict[str, list[pulumi.Resource]] = {f"{p.resource}/rules": [gate] if gate else [] for p in plans}
    peers = [f"10.0.0.{10 + r}" for r in range(settings.nodes)]
    scripts = {}
    for p in plans:
        spot = VmSpot(private_ip=f"10.0.0.{10 + p.rank}", head_private_ip="10.0.0.10",
                      public_ip=f"198.51.100.{10 + p.rank}", tls=ProxyTls(CHAIN, CA) if p.rank == 0 else None,
                      peer_ips=peers if settings.nodes > 1 else None)
        scripts.update({s.resource: pulumi.Output.from_input(text)
                        for s, text in zip(p.steps, render_vm_scripts(bp.steps, p, spot).values(), strict=True)})
    chain = Chain(cluster, groups=homes, made=made)
    chain.build(plans, scripts=scripts, vm_ids={p.resource: 1000 + p.rank for p in plans},
                connections={p.resource: node_connection(f"198.51.100.{10 + p.rank}", settings.ssh_user,
                                                         secret(CANARY_SSH), FAKE_HOST_PUBLIC_KEY) for p in plans},
                secrets={k: secret(v) if v is not None else None for k, v in secrets.items()})
    chain.register_outputs()
    return chain


def build_cluster(topology: str = "h100x4-sglang"):
    settings = make_settings(topology)

    def program():
        return build_chain(settings, "kimi", SECRETS).commands["kimi-ready-wait"].stdout

    return settings, run(program)


def script_of(res) -> str:
    return res.script()


def test_each_node_has_the_chain_in_order_under_its_component():
    settings, (res, result) = build_cluster()
    assert result == "ok"
    for rank in range(settings.nodes):
        comp = res[f"kimi-node{rank}"]
        assert comp.typ == "kimi:cluster:GpuNode"
        names = [n for n in res if n.startswith(f"kimi-node{rank}-")]
        # Registered in chain order. The image pull runs beside weights and check, so where it registers among
        # them is up to the event loop: only the order the chain defines is asserted.
        steps = [n.rsplit("-", 1)[1] for n in names]
        assert sorted(steps) == sorted(STEPS + (("proxy",) if rank == 0 else ()))
        steps = [s for s in steps if s != "proxy"]
        assert steps[:2] == ["ready", "storage"] and steps[-1] == "launch"
        assert steps.index("weights") < steps.index("check")
        for name in names:
            assert res[name].typ == "command:remote:Command" and res[name].parent == f"kimi-node{rank}"
        deps = {s: set(res[f"kimi-node{rank}-{s}"].deps) for s in STEPS}
        p = f"kimi-node{rank}-"
        assert deps["storage"] == {p + "ready"}
        assert deps["image"] == {p + "storage"}  # side by side with the download
        # The download starts once every node's disk is ready: a node re-created after a loss is then about to ask
        # the peers that serve it.
        assert deps["weights"] == {f"kimi-node{r}-storage" for r in range(4)}
        assert deps["check"] == {p + "weights"}
        expected_launch = {p + "check", p + "image"} | ({"kimi-node0-launch"} if rank else set())
        assert deps["launch"] == expected_launch
    # The proxy needs only its image (pulled with the engine's), not the weights.
    assert set(res["kimi-node0-proxy"].deps) == {"kimi-node0-image"}
    assert set(res["kimi-ready-wait"].deps) == {f"kimi-node{r}-launch" for r in range(4)} | {"kimi-node0-proxy"}
    assert res["kimi-ready"].typ == "kimi:cluster:Readiness"


def test_a_worker_launch_points_at_the_head_and_carries_its_own_rank_and_address():
    _, (res, _) = build_cluster()
    script = script_of(res["kimi-node2-launch"])
    assert "--dist-init-addr 10.0.0.10:20000" in script
    assert "--node-rank 2" in script and "SGLANG_HOST_IP=10.0.0.12" in script and "PRIVATE_IP=10.0.0.12" in script
    assert "PRIVATE_IP=10.0.0.12" in script_of(res["kimi-node2-ready"])


def test_every_command_names_its_vm_so_a_replaced_vm_runs_the_chain_again():
    _, (res, _) = build_cluster()
    for rank in range(4):
        for step in STEPS:
            assert res[f"kimi-node{rank}-{step}"].values()["create"].startswith(
                f"# kimi-cluster step {step} on VM {1000 + rank}:")


def test_secrets_reach_the_node_only_as_secret_stdin_and_secret_connection():
    _, (res, _) = build_cluster()
    for name, r in res.items():
        plain = dumps(r.plain())
        for canary in (CANARY_SSH, CANARY_HF, CANARY_API, CANARY_TLS, CANARY_PEER):
            assert canary not in plain, f"{canary} readable in the inputs of {name}"
        # Workers never get the endpoint's key or the TLS key, not even as a secret.
        if name.startswith(("kimi-node1", "kimi-node2", "kimi-node3")):
            assert CANARY_API not in dumps(r.values()) and CANARY_TLS not in dumps(r.values()), name
        if r.typ != "command:remote:Command":
            continue
        assert "connection" in r.secret_paths(), name
        step = name.rsplit("-", 1)[1]
        if step in ("weights", "check"):
            assert set(r.secret_paths()) == {"connection", "stdin"}
            # The weights step also gets the peer token, on the second line; the check needs only the hub's.
            assert r.values()["stdin"] == (f"{CANARY_HF}\n{CANARY_PEER}\n" if step == "weights" else CANARY_HF + "\n")
            assert "stdin" in r.secret_outputs
        elif step == "wait":
            assert set(r.secret_paths()) == {"connection", "stdin"} and r.values()["stdin"] == CANARY_API + "\n"
            assert "stdin" in r.secret_outputs
        elif step == "proxy":
            tls_line = base64.b64encode(CANARY_TLS.encode()).decode()
            assert set(r.secret_paths()) == {"connection", "stdin"}
            assert r.values()["stdin"] == f"{CANARY_API}\n{tls_line}\n" and "stdin" in r.secret_outputs
        else:
            assert "stdin" not in r.values() or r.values()["stdin"] in (None, "")
        for canary in (CANARY_SSH, CANARY_HF, CANARY_API, CANARY_TLS, CANARY_PEER):
            assert canary not in r.values()["create"] and canary not in script_of(r)
        assert "environment" not in r.values()


def test_connections_are_patient_and_pinned():
    _, (res, _) = build_cluster("b300x1-vllm")
    conn = res["kimi-node0-ready"].values()["connection"]
    assert conn["dialErrorLimit"] == DIAL_ERROR_LIMIT and conn["perDialTimeout"] == 30
    assert conn["hostKey"] == FAKE_HOST_PUBLIC_KEY and conn["user"] == "ubuntu" and conn["host"] == "198.51.100.10"
    assert conn["privateKey"] == CANARY_SSH


def test_long_steps_get_timeouts_longer_than_their_own_deadlines():
    settings, (res, _) = build_cluster("b300x1-vllm")
    weights = res["kimi-node0-weights"].timeouts["create"]
    assert int(weights.rstrip("m")) > settings.download_timeout_minutes
    assert int(res["kimi-ready-wait"].timeouts["create"].rstrip("m")) > settings.readiness_timeout_minutes


def test_commands_never_feed_their_output_back_in_and_log_only_what_scripts_print():
    _, (res, _) = build_cluster("b300x1-vllm")
    for r in res.values():
        if r.typ == "command:remote:Command":
            assert r.values()["addPreviousOutputInEnv"] is False
            assert r.values()["logging"] == "stdoutAndStderr"
            assert "delete" not in r.values()  # destroying a node never needs SSH


def test_component_depends_on_reaches_the_first_command():
    settings = make_settings("b300x1-vllm")

    def program():
        gate = pulumi.CustomResource("test:index:Gate", "firewall-ssh", {})
        chain = build_chain(settings, "n", {"api_key": CANARY_API, "tls_private_key": CANARY_TLS}, gate)
        return chain.commands["n-node0-launch"].stdout

    res, _ = run(program)
    assert "firewall-ssh" in res["n-node0-ready"].deps
    assert "stdin" not in res["n-node0-weights"].values()  # no token: anonymous, nothing on stdin


def test_host_key_helper_gives_secret_user_data_and_the_public_key_to_pin():
    def program():
        user_data, public = host_key_user_data("kimi-node0")
        return pulumi.Output.all(user_data, public, user_data.is_secret())

    res, (user_data, public, is_secret) = run(program)
    assert is_secret and public == FAKE_HOST_PUBLIC_KEY
    assert "ssh_keys:\n  ed25519_private: |\n    -----BEGIN OPENSSH PRIVATE KEY-----" in user_data
    assert "ssh_deletekeys: true\n" in user_data and f"ed25519_public: {FAKE_HOST_PUBLIC_KEY}" in user_data
    assert "ssh_genkeytypes" not in user_data  # never read when ssh_keys is given; `[]` fails the schema
    key = res["kimi-node0-host-key"]
    assert "private_key" in key.secret_outputs


def test_host_key_provider_makes_a_real_ed25519_key_pair():
    import shutil

    import pytest

    from kimi_cluster.deploy.vm import _HostKeyProvider

    if shutil.which("ssh-keygen") is None:
        pytest.skip("ssh-keygen is not installed")
    result = _HostKeyProvider().create({})
    assert result.outs["public_key"].startswith("ssh-ed25519 AAAA") and len(result.outs["public_key"].split()) == 2
    assert "OPENSSH PRIVATE KEY" in result.outs["private_key"]
    config = host_key_cloud_config(result.outs["private_key"], result.outs["public_key"])
    assert config.startswith("#cloud-config\n")
    assert _HostKeyProvider().diff("id", {}, {}).changes is False


def test_every_step_runs_under_its_node_side_deadline_and_its_timeouts_derive_from_it():
    import re

    from kimi_cluster.plan.steps.clocks import deadline_s
    from kimi_cluster.settings.timing import DIAL_ALLOWANCE_S, Timing

    settings, (res, _) = build_cluster()
    commands = [r for r in res.values() if r.typ == "command:remote:Command"]
    assert len(commands) == settings.nodes * len(STEPS) + 2  # and the head's proxy and readiness wait
    for command in commands:
        step = "readiness" if command.name == "kimi-ready-wait" else command.name.rsplit("-", 1)[1]
        deadline = deadline_s(step, resolved_timing(settings, Timing()))
        text = command.values()["create"]
        assert re.search(rf"sudo -n timeout --kill-after=\d+ {deadline} bash ~/\.kimi-cluster/{step}\.sh", text), text
        minutes = f"{-(-(deadline + DIAL_ALLOWANCE_S) // 60)}m"
        assert command.timeouts == {"create": minutes, "update": minutes}, command.name
    # The two long waits come from the stack's own settings.
    assert deadline_s("weights", resolved_timing(settings, Timing())) > settings.download_timeout_minutes * 60
    assert deadline_s("readiness", resolved_timing(settings, Timing())) > settings.readiness_timeout_minutes * 60
    assert deadline_s("image", resolved_timing(make_settings(stepDeadlineMinutes={"image": 90}), Timing())) == 90 * 60


def test_a_step_deadline_for_an_unknown_step_is_refused_before_anything_is_built():
    import pytest

    from kimi_cluster.blueprint.admission import admit
    from kimi_cluster.settings import SettingsError

    # The names are the step table's: the plan's admission (which the program, plan and status run) checks them.
    with pytest.raises(SettingsError, match=r"kimi-cluster:stepDeadlineMinutes: 'imgae' is not a node step"):
        admit(make_settings(stepDeadlineMinutes='{"imgae": 10}'))
    with pytest.raises(SettingsError, match=r"stepDeadlineMinutes: image: 0 is not a positive number"):
        make_settings(stepDeadlineMinutes={"image": 0})


def test_every_node_shares_the_download_with_all_nodes_in_rank_order():
    settings, (res, _) = build_cluster()
    peers = ",".join(f"10.0.0.{10 + r}:{settings.peer_port}" for r in range(settings.nodes))
    for rank in range(settings.nodes):
        script = script_of(res[f"kimi-node{rank}-weights"])
        assert f"--rank {rank} --peers {peers} " in script and "--peer-token-file" in script


def test_one_node_downloads_alone_and_reads_no_peer_token():
    _, (res, _) = build_cluster("b300x1-vllm")
    weights = res["kimi-node0-weights"]
    # The unit's command line, after the last shipped file.
    assert "--peers" not in script_of(weights).split("KIMI_KIMI_CLUSTER_NODE_HUB_NAMES_PY")[-1]
    assert weights.values()["stdin"] == CANARY_HF + "\n"
