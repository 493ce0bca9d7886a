"""Malformed input to each command-line tool ends in exactly one `error:` line and exit code 2, never a traceback:
kimi_cluster.cli.status, kimi_cluster.cli.timeline, kimi_cluster.cli.verify, benchmarks.bench_weights and
benchmarks.bench_proxy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import bench_proxy, bench_weights
from kimi_cluster.cli import status, timeline
from kimi_cluster.cli import verify as verify_endpoint

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIexampleexampleexample operator@laptop"
T0 = "2026-01-01T00:00:00Z"


def one_error(capsys: pytest.CaptureFixture[str], code: int) -> str:
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert code == 2, err
    assert len(errors) == 1 and err.startswith("error:") and "Traceback" not in err, err
    return errors[0]


@pytest.fixture
def config(tmp_path: Path) -> str:
    path = tmp_path / "Pulumi.p.yaml"
    path.write_text(f"config:\n  kimi-cluster:operatorCidr: 198.18.0.7/32\n  kimi-cluster:sshPublicKey: {KEY}\n",
                    encoding="utf-8")
    return str(path)


def _file(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def _stack(outputs: object) -> str:
    return json.dumps({"resources": [{"type": "pulumi:pulumi:Stack", "outputs": outputs}]})


def _command(conn: object) -> str:
    return json.dumps({"resources": [{"type": "command:remote:Command", "inputs": {"connection": conn}}]})


STATES = [
    ("[]", "not an object"),
    ('"a string"', "not an object"),
    ("42", "not an object"),
    ('{"deployment": []}', "deployment is a list"),
    ('{"resources": "x"}', "not a list of objects"),
    ('{"resources": [1, 2]}', "not a list of objects"),
    (_stack([]), "the stack's outputs is a list"),
    (_stack({"endpoint_url": 5}), "endpoint_url is a int"),
    (_stack({"hourly_cost_usd": "83.2"}), "hourly_cost_usd is a str"),
    (_stack({"api_key": ["k"]}), "api_key is a list"),
    (_command({"host": "198.51.100.10", "port": "ssh"}), "not a TCP port"),
    (_command({"host": "198.51.100.10", "port": 70000}), "not a TCP port"),
    (_command([1]), "connection of"),
    ("[" * 100_000 + "]" * 100_000, "cannot read"),
    ("{not json", "cannot read"),
]


@pytest.mark.parametrize("text,needle", STATES, ids=[n + repr(t)[:30] for t, n in STATES])
def test_status_refuses_a_state_of_the_wrong_shape(tmp_path, capsys, config, text, needle):
    code = status.main(["--stack", "p", "--config", config, "--state", _file(tmp_path, "s.json", text)])
    assert needle in one_error(capsys, code)


@pytest.mark.parametrize("extra,needle", [
    (["--watch", "-1"], "--watch -1 is not an interval"),
    (["--watch", "nan"], "--watch nan"),
    (["--watch", "inf"], "--watch inf"),
    (["--watch", "0"], "--watch 0"),
])
def test_status_refuses_bad_options(tmp_path, capsys, config, extra, needle):
    state = _file(tmp_path, "ok.json", '{"resources": []}')
    argv = ["--stack", "p", "--config", config, "--state", state, *extra]
    assert needle in one_error(capsys, status.main(argv))


def _marks(*lines: str) -> str:
    return json.dumps({"resources": [{"type": "command:remote:Command", "outputs": {"stdout": "\n".join(lines)}}]})


TIMELINES = [
    ("[]", "the document is a list"),
    ('"x"', "the document is a str"),
    ('{"resources": 5}', "not a list of objects"),
    ('{"resources": [5]}', "not a list of objects"),
    ('{"deployment": {"resources": {"a": 1}}}', "not a list of objects"),
    ('{"deployment": "x"}', "deployment is a str"),
    (_marks("KIMI-STEP rank=0 step=ready start 2026-13-45T99:99:99Z"), "impossible time"),
    (_marks(f"KIMI-STEP rank=0 step=ready start {T0}", f"KIMI-STEP rank=0 step=ready end {T0} rc=" + "9" * 5000),
     "holds a number past 255"),
    (_marks(f"KIMI-STEP rank=0 step=ready start {T0}", f"KIMI-STEP rank=0 step=ready end {T0} rc=256"),
     "holds a number past 255"),
    (_marks("KIMI-STEP rank=" + "9" * 5000 + f" step=ready start {T0}"), "holds a number past 10,000"),
    ("{broken", "cannot read"),
]


@pytest.mark.parametrize("text,needle", TIMELINES, ids=[n for _, n in TIMELINES])
def test_timeline_refuses_a_document_it_cannot_draw(tmp_path, capsys, text, needle):
    code = timeline.main([_file(tmp_path, "t.json", text), "--out", str(tmp_path / "t.svg")])
    assert needle in one_error(capsys, code)
    assert not (tmp_path / "t.svg").exists()


@pytest.mark.parametrize("out,needle", [
    ("missing/t.png", "does not exist"), ("t.xyz", "ending in .png or .svg"), ("t", "ending in"),
    (".", "ending in"), ("adir.svg", "is a directory"),
])
def test_timeline_refuses_an_out_it_cannot_write(tmp_path, capsys, out, needle):
    (tmp_path / "adir.svg").mkdir()
    good = _file(tmp_path, "g.json", _marks(f"KIMI-STEP rank=0 step=ready start {T0}",
                                            f"KIMI-STEP rank=0 step=ready end {T0} rc=0"))
    assert needle in one_error(capsys, timeline.main([good, "--out", str(tmp_path / out)]))


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "-1", "0", "1e309", "100000"])
def test_verify_endpoint_refuses_a_timeout_that_is_no_budget(capsys, value):
    code = verify_endpoint.main(["--base-url", "https://127.0.0.1:9", f"--timeout={value}", "--api-key-env", "NONE"])
    assert "--timeout" in one_error(capsys, code)


@pytest.mark.parametrize("argv,needle", [
    (["--nodes", "0"], "--nodes 0"), (["--nodes", "-2"], "--nodes -2"), (["--nodes", "1000"], "--nodes 1000"),
    (["--shards", "0"], "--shards 0"), (["--shard-bytes", "0"], "--shard-bytes 0"),
    (["--shard-bytes", "-5"], "--shard-bytes -5"), (["--cap", "0"], "--cap 0"), (["--cap", "nan"], "--cap nan"),
    (["--keep", "{file}"], "is a file"),
])
def test_bench_weights_refuses_what_measures_nothing(tmp_path, capsys, argv, needle):
    afile = _file(tmp_path, "f", "mine")
    code = bench_weights.main([a.format(file=afile) for a in argv])
    assert needle in one_error(capsys, code)
    assert Path(afile).read_text() == "mine"




@pytest.mark.parametrize("argv,needle", [
    (["--requests", "0"], "--requests 0"), (["--streams", "-1"], "--streams -1"),
    (["--workdir", "{missing}"], "no usable sandbox in"), (["--workdir", "{file}"], "no usable sandbox in"),
])
def test_proxy_bench_refuses_counts_of_nothing_and_a_missing_sandbox(tmp_path, capsys, argv, needle):
    files = {"missing": str(tmp_path / "none"), "file": _file(tmp_path, "f", "mine")}
    assert needle in one_error(capsys, bench_proxy.main([a.format(**files) for a in argv]))
