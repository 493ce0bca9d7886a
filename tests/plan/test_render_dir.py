"""`kimi-cluster plan --render-dir` writes exactly the scripts `pulumi up` runs: for every VM of a one-replica and a
two-replica stack (each node of each replica, and the front), the offline renderer given the mock's addresses
writes byte for byte the script of every remote command the program registers, and nothing else."""

from __future__ import annotations

from pathlib import Path

import pytest

from kimi_cluster.blueprint import blueprint
from kimi_cluster.blueprint.admission import admit
from kimi_cluster.blueprint.inputs import fan_out_size
from kimi_cluster.operator.plan_report import placeholder_spots, render_scripts
from kimi_cluster.plan.steps.model import FRONT, ProxyTls, VmSpot
from kimi_cluster.settings import Settings
from kimi_cluster.settings.loader import load_settings
from tests.deploy.test_program import config
from tests.plan.graph_record import STACKS, TLS, outputs_for, run_stack


def stack_settings(stack: str) -> Settings:
    cfg, _ = config(**STACKS[stack])
    raw = {k.split(":", 1)[1]: v for k, v in cfg.items() if k.startswith("kimi-cluster:")}
    return admit(load_settings(raw, "dev"))


def mock_spots(settings: Settings) -> dict[str, VmSpot]:
    """What the program's VMs report under the mocks (tests/deploy/test_replicas.py outputs_for), as spots."""
    assert TLS is not None
    vms = blueprint(settings, "kimi").vm_plans
    at = {vm.resource: outputs_for("hyperstack:index:VirtualMachine", vm.resource, {}) for vm in vms}
    gpu = [vm for vm in vms if vm.kind != FRONT]
    tls = ProxyTls(TLS["cert_pem"], TLS["ca_pem"])
    ids = " ".join(str(at[vm.resource]["vm_id"]) for vm in gpu)
    peers = [at[vm.resource]["private_ip"] for vm in gpu] if fan_out_size(settings) > 1 else None
    heads = {vm.replica: at[vm.resource]["private_ip"] for vm in gpu if vm.rank == 0}
    spots = {}
    for vm in vms:
        mine = at[vm.resource]
        if vm.kind == FRONT:
            spots[vm.resource] = VmSpot(private_ip=mine["private_ip"], public_ip=mine["public_ip"], tls=tls,
                                        gpu_vm_ids=ids, front_upstreams=list(heads.values()))
            continue
        holds = not settings.has_front and vm.replica == 0 and vm.rank == 0
        spots[vm.resource] = VmSpot(private_ip=mine["private_ip"], head_private_ip=heads[vm.replica],
                                    public_ip=mine["public_ip"], tls=tls if holds else None,
                                    gpu_vm_ids=ids if holds else None, peer_ips=peers,
                                    group_vm_ids=" ".join(str(at[g.resource]["vm_id"]) for g in gpu
                                                          if g.replica == vm.replica))
    return spots


@pytest.mark.parametrize("stack", ["h100x4-sglang", "h100x4-sglang-2-replicas-front"])
def test_the_render_dir_holds_exactly_the_scripts_the_program_runs(stack: str, tmp_path: Path) -> None:
    settings = stack_settings(stack)
    ran = {r.name: r.script() for r in run_stack(stack).of_type("command:remote:Command")}
    written = render_scripts(settings, str(tmp_path), mock_spots(settings))
    vms = blueprint(settings, "kimi").vm_plans
    expected_dirs = {vm.name for vm in vms}
    assert {p.name for p in tmp_path.iterdir()} == expected_dirs
    assert len(expected_dirs) == settings.nodes * settings.replicas + (1 if settings.has_front else 0)
    by_file = {str(tmp_path / vm.name / f"{s.step}.sh"): s.resource for vm in vms for s in vm.steps}
    assert sorted(written) == sorted(by_file) and sorted(by_file.values()) == sorted(ran)
    for path, resource in by_file.items():
        assert Path(path).read_text(encoding="utf-8") == ran[resource], resource


def test_the_placeholder_render_dir_covers_every_vm_and_the_front(tmp_path: Path) -> None:
    settings = stack_settings("h100x4-sglang-2-replicas-front")
    render_scripts(settings, str(tmp_path))
    front = tmp_path / settings.front_name
    assert sorted(p.name for p in front.iterdir()) == ["caretaker.sh", "front-ready.sh", "proxy.sh", "readiness.sh",
                                                        "resume.sh"]  # SGLang replicas resume streams too
    assert (tmp_path / settings.replica_node_name(1, 3) / "launch.sh").is_file()
    assert "kimi-dev-node0-private-ip:30000" in (front / "proxy.sh").read_text()
    assert set(placeholder_spots(settings)) == {vm.resource for vm in blueprint(settings, "kimi").vm_plans}
