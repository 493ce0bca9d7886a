"""Careless and hostile input, fourth round (issue 44): the caretaker's keys (its test clock, its API URL and key, a
budget without a rate), step deadlines and polls without a floor, a CPU flavor sized as GPUs, and the tracebacks and
memory blow-ups of the CLIs. Each is refused before anything bills, in a short message naming its key or argument,
or runs to a clean end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kimi_cluster.blueprint.admission import admit
from kimi_cluster.settings import SettingsError
from kimi_cluster.settings.loader import load_settings

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIexampleexampleexample operator@laptop"
REPO = Path(__file__).resolve().parents[2]
GUARD = {"idleStopMinutes": "15", "caretakerApiKey": "hyperstack-caretaker-key-0123"}


def load(**raw):
    raw.setdefault("operatorCidr", "198.18.0.7/32")
    raw.setdefault("sshPublicKey", KEY)
    return admit(load_settings(raw, "dev"))  # the settings' rules, then the plan's (the program runs both)


REFUSED = [
    # 1. a test clock only where the caretaker's API is an emulator beside the stack
    ({**GUARD, "caretakerTiming": '{"minuteSeconds": 0.1}'}, "kimi-cluster:caretakerTiming.minuteSeconds 0.1"),
    ({**GUARD, "caretakerTiming": '{"minuteSeconds": 59}', "caretakerApiUrl": "https://relay.example.com/v1"},
     "it is a test clock"),
    # 3. the key's shape, as kernelCacheCredentials'
    ({**GUARD, "caretakerApiKey": "   "}, "kimi-cluster:caretakerApiKey is blank"),
    ({**GUARD, "caretakerApiKey": "first-line-of-key\nsecond-line"}, "kimi-cluster:caretakerApiKey is not one line"),
    ({**GUARD, "caretakerApiKey": "key-with\x00-a-nul-byte"}, "kimi-cluster:caretakerApiKey is not one line"),
    ({**GUARD, "caretakerApiKey": ["a", "list"]}, "kimi-cluster:caretakerApiKey is not text"),
    # 4. an API URL that can never answer
    ({**GUARD, "caretakerApiUrl": "https://" + "a" * 64 + ".example.com/v1"}, "kimi-cluster:caretakerApiUrl"),
    ({**GUARD, "caretakerApiUrl": "https://" + "a" * 100_000 + ".com/v1"}, "longer than any API URL"),
    ({**GUARD, "caretakerApiUrl": "https://infrahub-api.nexgencloud.com"}, "does not end in /v1"),
    ({**GUARD, "caretakerApiUrl": "https://a..b.example.com/v1"}, "kimi-cluster:caretakerApiUrl"),
    # 5. the project's own private ranges: Teredo (2001::/23) is "private" to ipaddress, and crosses the internet
    ({**GUARD, "caretakerApiUrl": "http://[2001::5efe:1]:8700/v1"}, "plain http:// to a host outside loopback"),
    ({**GUARD, "caretakerApiUrl": "http://[2001:2::1]/v1"}, "plain http://"),
    ({**GUARD, "caretakerApiUrl": "http://169.254.169.254/v1"}, "plain http://"),
    # 6. a budget that cannot trip: no rate to count on with
    ({**GUARD, "budgetUsd": "100", "gpuHourlyPriceUsd": 1e-300}, "kimi-cluster:budgetUsd needs the GPU VMs' hourly"),
    ({**GUARD, "budgetUsd": "100", "topology": "custom", "flavor": "n3-H200x8", "gpusPerNode": 8, "gpuMemoryGb": 141,
      "nodeCount": 2, "engine": "sglang"}, "flavor n3-H200x8 has no price"),  # an unpriced custom flavor
    # 7. deadlines with a floor for every step
    *[({"stepDeadlineMinutes": json.dumps({step: 0.05})}, f"kimi-cluster:stepDeadlineMinutes: {step}: 0.05 minutes")
      for step in ("ready", "weights", "check", "launch", "readiness", "engine-ready", "caretaker")],
    ({"kernelWarmup": True, "topology": "b300x1-vllm", "stepDeadlineMinutes": '{"warmup": 2}'},
     "kimi-cluster:stepDeadlineMinutes: warmup: 2 minutes leaves the warm-up"),
    ({"topology": "custom", "flavor": "n1-cpu-small", "gpusPerNode": 8, "gpuMemoryGb": 288, "nodeCount": 1,
      "engine": "vllm"}, "kimi-cluster:flavor n1-cpu-small is a CPU flavor"),
    # 8. polls that spin
    ({"nodeTiming": '{"fastPollSeconds": 1e-300}'}, "kimi-cluster:nodeTiming: fastPollSeconds"),
    ({"nodeTiming": '{"fastPollSeconds": 0.001}'}, "would spin every polled wait"),
    # 9. tracebacks
    ({**GUARD, "budgetUsd": 10 ** 400}, "kimi-cluster:budgetUsd"),
    ({**GUARD, "budgetUsd": 10 ** 5000}, "kimi-cluster:budgetUsd"),
    ({**GUARD, "caretakerTiming": "[" * 100_000 + "]" * 100_000}, "kimi-cluster:caretakerTiming"),
    ({**GUARD, "caretakerTiming": '{"pollSeconds": ' * 50_000 + "1" + "}" * 50_000}, "kimi-cluster:caretakerTiming"),
]


@pytest.mark.parametrize(("raw", "needle"), REFUSED, ids=lambda v: str(v)[:60] if isinstance(v, str) else None)
def test_refused_naming_the_key(raw, needle):
    with pytest.raises(SettingsError) as caught:
        load(**raw)
    text = str(caught.value)
    assert needle in text and "Traceback" not in text and len(text) < 3000, text
    assert "hyperstack-caretaker-key" not in text and "first-line-of-key" not in text  # a secret is never quoted


ACCEPTED = [
    # the sandbox's own emulator on its bridge, and one on this machine's loopback
    {**GUARD, "caretakerTiming": '{"pollSeconds": 1, "minuteSeconds": 1}', "caretakerApiUrl": "http://10.213.4.1:8700/v1"},
    {**GUARD, "caretakerTiming": '{"minuteSeconds": 0.1}', "caretakerApiUrl": "http://127.0.0.1:8700/v1"},
    {**GUARD, "caretakerApiUrl": "https://relay.example.com/hyperstack/v1/"},
    {**GUARD, "caretakerApiUrl": "http://[fd00::5]:8700/v1"},
    {**GUARD, "budgetUsd": "100", "gpuHourlyPriceUsd": 0.5},
    {"stepDeadlineMinutes": '{"ready": 1, "caretaker": 1, "launch": 1.5}'},
    {"kernelWarmup": True, "topology": "b300x1-vllm", "stepDeadlineMinutes": '{"warmup": 4}'},
    {"nodeTiming": '{"fastPollSeconds": 0.1}'},
]


@pytest.mark.parametrize("raw", ACCEPTED)
def test_legitimate_values_are_accepted(raw):
    load(**raw)


# ---- the CLIs ----------------------------------------------------------------------------------------------------

def _run(*argv: str, stdout=subprocess.PIPE, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *argv], cwd=REPO, stdout=stdout, stderr=subprocess.PIPE, text=True,
                          timeout=timeout)


def _one_error(done: subprocess.CompletedProcess[str], needle: str, codes=(1, 2)) -> None:
    assert done.returncode in codes, done.stderr
    assert "Traceback" not in done.stderr and needle in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()[-1]) < 400, done.stderr


@pytest.mark.parametrize("flag", ["--api-key-file", "--ca-file"])
def test_verify_endpoint_reads_no_file_past_its_bound(flag):
    """/dev/zero was read until memory ran out."""
    extra: list[str] = []
    done = subprocess.run([sys.executable, "-m", "kimi_cluster.cli.verify", "--base-url", "https://127.0.0.1:9",
                           flag, "/dev/zero", *extra], cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "KIMI_API_KEY": "k" * 20})
    _one_error(done, flag)


def test_plan_on_a_full_disk_says_so_in_one_line():
    with open("/dev/full", "w") as full:
        done = _run("kimi_cluster.cli.plan", "--json", stdout=full)
    _one_error(done, "cannot write the plan to standard output: No space left on device")


@pytest.mark.parametrize("value", ["0", "nan", "-1", "inf"])
def test_the_emulators_minute_is_a_positive_number(value):
    done = _run("kimi_cluster.cli.emulator", "--billing-minute-seconds", value, "--port", "0")
    _one_error(done, "--billing-minute-seconds", codes=(2,))


@pytest.mark.parametrize("body", ["[" * 100_000, "[1]", '{"id": 1}', "x" * (2 * 1024 * 1024)])
def test_the_emulators_node_fabric_file_is_refused_when_it_is_not_one(tmp_path, body):
    path = tmp_path / "fabric.json"
    path.write_text(body)
    done = _run("kimi_cluster.cli.emulator", "--node-fabric", str(path), "--port", "0")
    _one_error(done, "--node-fabric", codes=(2,))


def test_bench_replicas_checks_the_rolling_image_before_any_bring_up(tmp_path):
    workdir = tmp_path / "bench"
    done = _run("benchmarks.bench_replicas", "--rolling", "not an image!", "--workdir", str(workdir))
    _one_error(done, "--rolling: kimi-cluster:image: 'not an image!'", codes=(2,))
    assert not workdir.exists() and "bench: 2 x" not in done.stdout  # no sandbox was started


def test_the_sandbox_refuses_any_caretaker_api_url_but_its_own(tmp_path):
    workdir = tmp_path / "sandbox"
    done = _run("kimi_cluster.cli.sandbox", "up", "--workdir", str(workdir), "--config",
                "caretakerApiUrl=https://infrahub-api.nexgencloud.com/v1", "--config", "idleStopMinutes=15")
    _one_error(done, "--config caretakerApiUrl: the sandbox's caretaker always calls the sandbox's own emulator",
               codes=(2,))
    assert not (workdir / "services").exists()


def test_a_benchmark_sent_sigterm_runs_its_finally_which_destroys_its_sandbox(tmp_path):
    """A bench_replicas stopped by `timeout` (SIGTERM) kept its emulator, hub, bucket, Caddy, sshd and provider host
    running for 45 minutes: SIGTERM ended the process before its `finally` could destroy the sandbox."""
    marker = tmp_path / "destroyed"
    child = ("import pathlib, sys, time\n"
             "from benchmarks._args import interrupt_on_sigterm\n"
             "interrupt_on_sigterm()\n"
             "try:\n"
             "    print('ready', flush=True)\n"
             "    time.sleep(60)\n"
             "finally:\n"
             f"    pathlib.Path({str(marker)!r}).write_text('yes')\n")
    proc = subprocess.Popen([sys.executable, "-c", child], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    proc.terminate()
    proc.wait(timeout=30)
    assert marker.read_text() == "yes"


@pytest.mark.parametrize(("key_text", "needle"), [
    ("   ", "kimi-cluster:caretakerApiKey is blank"),
    ("first-line-of-key\nsecond-line", "kimi-cluster:caretakerApiKey is not one line"),
], ids=["blank", "two lines"])
def test_the_program_checks_the_caretakers_key_before_registering_anything(key_text, needle):
    import pulumi

    from tests.deploy.test_program import config, outputs_for
    from tests.pulumi_harness import Recording, run_program

    cfg, secret = config(idleStopMinutes="15", caretakerApiKey=key_text)
    recording = Recording()
    with pytest.raises(pulumi.RunError, match=needle) as caught:
        run_program(cfg, [*secret, "kimi-cluster:caretakerApiKey"], outputs_for, recording=recording)
    assert not recording.resources and "first-line-of-key" not in str(caught.value)
