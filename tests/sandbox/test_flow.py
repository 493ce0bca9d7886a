"""The whole sandbox flow per topology, as a user runs it: up, verify, destroy, and nothing left anywhere.

h100x4-sglang runs against an emulator the test started (HYPERSTACK_API_URL), so the test reads its inventory and
request log; b300x1-vllm runs exactly the README's commands, with the services the sandbox starts itself.
"""

from __future__ import annotations

import json
import re
import time

import pytest

from fakes import sandbox_services as services

from .conftest import EMPTY, leftover_processes, ok, report

pytestmark = [pytest.mark.flow, pytest.mark.timeout(420)]

CHECKS = ("tls", "models", "auth", "chat", "effort", "preserved_thinking", "tool_calls", "image", "anthropic",
          "stream", "clients")


def _verified(output: str) -> None:
    for check in CHECKS:
        assert any(line.split()[:2] == [check, "PASS"] for line in output.splitlines()), output
    assert "sandbox verify: PASSED" in output


def test_h100_flow_against_an_external_emulator(sandbox, start_emulator) -> None:
    emulator = start_emulator()
    run = sandbox(emulator.env(), timeline=True, kernel_cache=True)
    started = time.monotonic()

    up = run("up", "--topology", "h100x4-sglang")
    out = ok(up)
    assert "started the Hyperstack emulator" not in out  # HYPERSTACK_API_URL names the one to use
    assert re.search(r"^  api_key +\[secret\]$", out, re.M), out
    head = re.search(r"^  head_public_ip +(127\.0\.0\.\d+)$", out, re.M).group(1)
    assert re.search(rf"^  endpoint_url +https://{re.escape(head)}:\d+$", out, re.M), out
    inventory = emulator.inventory()
    assert sorted(vm["name"] for vm in inventory["virtual_machines"]) == [f"kimi-sandbox-node{r}" for r in range(4)]
    assert {vm["status"] for vm in inventory["virtual_machines"]} == {"ACTIVE"}
    assert emulator.vm_posts() == 4
    # Every rank runs an engine; only the head serves HTTP, behind the real proxy, and readiness passed through it.
    engines = list(run.workdir.glob("nodes/*/var/lib/fake-node/engines/kimi-engine.pid"))
    assert len(engines) == 4
    assert [p.parts[-6] for p in run.workdir.glob("nodes/*/var/lib/fake-node/engines/kimi-proxy.pid")] == [head]
    # The nodes shared the download over their (loopback) private addresses, and up drew the bring-up.
    weights_log = run.workdir.joinpath(f"nodes/{head}/var/log/kimi-cluster/weights.log").read_text()
    assert "sharing with 3 peers" in weights_log and "nothing is listening any more" in weights_log
    assert run.workdir.joinpath("timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert re.search(r"^timeline: .*timeline\.png \(\d+ steps on 4 nodes\)$", out, re.M), out

    verify = run("verify")
    _verified(ok(verify))

    # The head's engine dies: verify says so and exits non-zero.
    head_engine = int(run.workdir.joinpath(f"nodes/{head}/var/lib/fake-node/engines/kimi-engine.pid").read_text())
    assert services.terminate([head_engine], timeout=10) == []
    broken = run("verify")
    assert broken.code == 1, broken.output
    assert "sandbox verify: FAILED" in broken.output and "models" in broken.output

    destroy = run("destroy")
    out = ok(destroy)
    assert "emulator: nothing left of kimi-sandbox" in out
    assert "stopping what a fake node left running" in out  # the three SGLang workers
    elapsed = time.monotonic() - started
    assert emulator.inventory() == EMPTY
    assert leftover_processes(run.workdir) == []
    report(f"h100x4-sglang (external emulator): up {up.seconds:.1f} s, verify {verify.seconds:.1f} s, "
           f"destroy {destroy.seconds:.1f} s, whole flow {elapsed:.1f} s")


def test_b300_flow_with_its_own_services_and_reruns(sandbox) -> None:
    run = sandbox(kernel_cache=True)
    started = time.monotonic()

    up = run("up", "--topology", "b300x1-vllm")
    out = ok(up)
    assert "started the Hyperstack emulator" in out and "started the fake Hugging Face hub" in out
    assert "timeline:" not in out and not run.workdir.joinpath("timeline.png").exists()  # --no-timeline
    record = run.record()
    service_pids = {name: data["pid"] for name, data in record["services"].items()}
    assert set(service_pids) == {"emulator", "hub", "kernel-store"}
    # The hub answers only with the stack's hfToken: a finished download proves the token reached the node on stdin.
    token_file = run.workdir / "secrets" / "hf_token"
    assert str(token_file) in " ".join(services._cmdline(service_pids["hub"]))
    assert token_file.read_text().strip() not in " ".join(services._cmdline(service_pids["hub"]))

    again = run("up")  # the recorded topology; everything is already there
    assert re.search(r"ready in [\d.]+ s .*; 0 created, \d+ unchanged", ok(again)), again.output

    verify = run("verify")
    _verified(ok(verify))

    destroy = run("destroy")
    out = ok(destroy)
    assert "emulator: nothing left" in out
    assert "stopping what a fake node left running" in out  # the vLLM engine the docker stub started
    elapsed = time.monotonic() - started
    assert not any(services._alive(pid) for pid in service_pids.values())
    assert leftover_processes(run.workdir) == []
    assert not (run.workdir / "sandbox.json").exists()

    assert "nothing deployed" in ok(run("destroy"))
    report(f"b300x1-vllm (own services): up {up.seconds:.1f} s, second up {again.seconds:.1f} s, "
           f"verify {verify.seconds:.1f} s, destroy {destroy.seconds:.1f} s, whole flow {elapsed:.1f} s")


def test_tokenspeed_flow_needs_the_users_image_then_serves_behind_its_gateways_shape(sandbox) -> None:
    run = sandbox()
    refused = run("up", "--topology", "b300x1-tokenspeed")
    assert refused.code != 0 and "kimi-cluster:image is required with TokenSpeed" in refused.output, refused.output
    assert not run.workdir.joinpath("state.json").exists() or "VirtualMachine" not in \
        run.workdir.joinpath("state.json").read_text()  # refused before anything was created

    up = run("up", "--topology", "b300x1-tokenspeed", "--config", "image=lightseekorg/tokenspeed:0.1.1")
    out = ok(up)
    assert re.search(r"^  engine +tokenspeed$", out, re.M), out

    verify = run("verify")
    _verified(ok(verify))
    assert "owned_by tokenspeed" in verify.output and "reasoning_content" in verify.output

    # /metrics is the gateway's own listener, reached through the proxy: status prices the streamed tokens.
    text = ok(run("status", "--json"))
    report_json = json.loads(text[text.index("{"):])
    assert report_json["endpoint"]["requests"] > 0 and report_json["token_cost"]["output_tokens"] > 0

    destroy = run("destroy")
    assert "emulator: nothing left" in ok(destroy)
    assert leftover_processes(run.workdir) == []
    report(f"b300x1-tokenspeed: up {up.seconds:.1f} s, verify {verify.seconds:.1f} s, destroy {destroy.seconds:.1f} s")
