"""The program's whole graph under Pulumi's mocks, as plain data a fixture can hold: every resource's URN, parent,
dependencies and custom timeouts, and every remote command's text (its script included) and secret stdin.

`python -m tests.plan.graph_record` writes tests/fixtures/step_graph/*.json from the code as it stands (run it only
to record a deliberate change); tests/plan/test_graph_unchanged.py compares the program against them. The
certificates are fixed (tls.json), so the proxy scripts that carry them stay byte-identical run to run.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

from tests.deploy.test_program import config
from tests.deploy.test_replicas import outputs_for as replica_outputs
from tests.pulumi_harness import Recording, run_program

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "step_graph"
TLS = json.loads((FIXTURES / "tls.json").read_text()) if (FIXTURES / "tls.json").exists() else None
CANARY_S3 = "AKIACANARY0000000000:s3-canary-secret-3b9d"
CANARY_CARETAKER = "caretaker-canary-key-3e9f"
CACHE = json.dumps({"bucket": "my-team-kimi-kernels", "region": "eu-central-1"})
EXTRA_SECRETS = ["kimi-cluster:kernelCacheCredentials", "kimi-cluster:caretakerApiKey"]

# The three stacks the fixtures hold: the plain one, one with every optional step, and replicas behind a front.
STACKS: dict[str, dict[str, str]] = {
    "h100x4-sglang": {"topology": "h100x4-sglang"},
    "b300x1-vllm-cache-warmup-idle": {
        "topology": "b300x1-vllm", "kernelCache": CACHE, "kernelCacheCredentials": CANARY_S3, "kernelWarmup": "true",
        "idleStopMinutes": "30", "caretakerApiKey": CANARY_CARETAKER},
    "h100x4-sglang-2-replicas-front": {
        "topology": "h100x4-sglang", "replicas": "2", "kernelCache": CACHE, "kernelCacheCredentials": CANARY_S3,
        "idleStopMinutes": "30", "caretakerApiKey": CANARY_CARETAKER},
}


def outputs_for(typ: str, name: str, inputs: dict) -> dict:
    """tests/deploy/test_replicas.py's addresses (one replica and many, the front), with the fixed certificates."""
    assert TLS is not None, "record tls.json first (python -m tests.plan.graph_record --tls)"
    if typ.endswith(":CertificateAuthority"):
        return {"cert_pem": TLS["ca_pem"], "key_pem": TLS["ca_key"]}
    if typ.endswith(":ServerCertificate"):
        return {"cert_pem": TLS["cert_pem"], "key_pem": "tls-canary-private-key-0c7e"}
    return replica_outputs(typ, name, inputs)


def run_stack(stack: str) -> Recording:
    cfg, secret = config(**STACKS[stack])
    return run_program(cfg, [*secret, *EXTRA_SECRETS], outputs_for)


def graph(rec: Recording) -> dict[str, Any]:
    """URN -> what must not change on an upgrade: type, parent, dependencies, timeouts; a command's text by hash."""
    out: dict[str, Any] = {}
    for r in rec.resources:
        entry: dict[str, Any] = {"parent": r.parent_urn, "deps": sorted(r.dep_urns), "timeouts": r.timeouts}
        if r.typ == "command:remote:Command":
            v = r.values()
            entry["create_sha256"] = hashlib.sha256(v["create"].encode()).hexdigest()
            entry["stdin_sha256"] = hashlib.sha256((v.get("stdin") or "").encode()).hexdigest()
            entry["secret_inputs"] = sorted(r.secret_paths())
        out[r.urn] = entry
    return out


def scripts(rec: Recording) -> dict[str, str]:
    """Every remote command's text by resource name (for reading a difference, not stored)."""
    return {r.name: r.values()["create"] for r in rec.resources if r.typ == "command:remote:Command"}


def main(argv: list[str]) -> None:
    FIXTURES.mkdir(parents=True, exist_ok=True)
    if "--tls" in argv:
        from kimi_cluster.deploy import tls
        ca_pem, ca_key = tls.make_ca("test CA")
        cert_pem, _ = tls.make_server_certificate(ca_pem, ca_key, ["198.51.100.10", "198.51.100.200"])
        (FIXTURES / "tls.json").write_text(json.dumps({"ca_pem": ca_pem, "ca_key": ca_key, "cert_pem": cert_pem},
                                                      indent=1) + "\n")
        return
    dump = Path(argv[argv.index("--texts") + 1]) if "--texts" in argv else None
    for stack in STACKS:
        rec = run_stack(stack)
        (FIXTURES / f"{stack}.json").write_text(json.dumps(graph(rec), indent=1, sort_keys=True) + "\n")
        if dump is not None:
            (dump / stack).mkdir(parents=True, exist_ok=True)
            for name, text in scripts(rec).items():
                (dump / stack / name).write_text(text)


if __name__ == "__main__":
    main(sys.argv[1:])
