"""Tests of `kimi-cluster verify` as a subprocess: exit codes, output lines, --json,
key sources, and that the key never appears in anything it prints.
"""

import json
import os
import subprocess
import sys

import pytest

from kimi_cluster.checks import CHECK_NAMES
from tests.checks.conftest import KEY, MODEL, REPO, tls_material

pytestmark = pytest.mark.integration  # starts fake nodes, servers or outside tools


def _run(args, env_key=KEY, stdin=None, timeout=60):
    # Every fake serves https with the test CA, which the verifier gets as the cluster's ca_certificate.
    args = [*args, "--ca-file", tls_material()["ca_file"]]
    env = {k: v for k, v in os.environ.items() if k != "KIMI_API_KEY"}
    env.update(PYTHONPATH=REPO, NO_PROXY="127.0.0.1,localhost")
    if env_key is not None:
        env["KIMI_API_KEY"] = env_key
    proc = subprocess.run(
        [sys.executable, "-m", "kimi_cluster.cli.verify", *args],
        cwd=REPO, env=env, input=stdin, capture_output=True, text=True, timeout=timeout,
    )
    assert KEY not in proc.stdout and KEY not in proc.stderr, "the key was printed"
    return proc


def test_good_endpoint_exits_zero_with_a_line_per_check(fake):
    with fake() as server:
        proc = _run(["--base-url", server.url + "/v1", "--model", MODEL, "--timeout", "5"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert [line.split()[:2] for line in lines[:-1]] == [["PASS", name] for name in CHECK_NAMES]
    assert lines[-1].endswith("all checks passed")


def test_broken_endpoint_exits_one_naming_the_check(fake):
    with fake(faults=["no_auth"]) as server:
        proc = _run(["--base-url", server.url, "--timeout", "5", "--only", "models,auth,chat"])
    assert proc.returncode == 1
    fail_lines = [line for line in proc.stdout.splitlines() if line.startswith("FAIL")]
    assert len(fail_lines) == 1 and fail_lines[0].split()[1] == "auth" and "not protected" in fail_lines[0]
    assert "1 failed: auth" in proc.stdout


def test_json_output_and_key_from_stdin(fake):
    with fake(engine="vllm") as server:
        proc = _run(["--base-url", server.url, "--json", "--only", "models,stream", "--api-key-file", "-",
                     "--timeout", "5"], env_key=None, stdin=KEY + "\n")
    assert proc.returncode == 0, proc.stderr
    document = json.loads(proc.stdout)
    assert document["verified"] is True and document["model"] == MODEL
    assert [c["name"] for c in document["checks"]] == ["models", "stream"]
    assert document["checks"][1]["metrics"]["tokens_per_s"] > 0


def test_key_file_and_argv_key(fake, tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    with fake() as server:
        from_file = _run(["--base-url", server.url, "--only", "auth", "--api-key-file", str(key_file)], env_key=None)
        from_argv = _run(["--base-url", server.url, "--only", "auth", "--api-key", KEY], env_key=None)
        wrong = _run(["--base-url", server.url, "--only", "models"], env_key="not-the-key")
    assert from_file.returncode == 0
    assert from_argv.returncode == 0 and "visible to other users" in from_argv.stderr
    assert wrong.returncode == 1 and "HTTP 401" in wrong.stdout


def test_usage_errors_exit_two(fake):
    with fake() as server:
        unknown = _run(["--base-url", server.url, "--only", "models,vibes"])
        missing_file = _run(["--base-url", server.url, "--api-key-file", "/nonexistent/key"], env_key=None)
    assert unknown.returncode == 2 and "unknown check" in unknown.stderr
    assert missing_file.returncode == 2
    assert _run(["--model", MODEL]).returncode == 2  # --base-url is required


def test_no_key_warns_and_fails(fake):
    with fake() as server:
        proc = _run(["--base-url", server.url, "--only", "models,auth", "--timeout", "5"], env_key=None)
    assert proc.returncode == 1 and "no API key" in proc.stderr
