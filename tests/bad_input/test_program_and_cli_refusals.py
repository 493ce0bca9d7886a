"""Careless and hostile input, third round (issue 34, bad input): misspelt namespaces, the front's keys, TokenSpeed's
ports, your own TLS, nodeTiming as a whole, engine limits, numbers that overflow and the CLIs. Every case must end in
a refusal naming its key or argument (a SettingsError, or one `error:` line and exit code 1 or 2), quickly.

`python -m tests.bad_input.test_program_and_cli_refusals` runs each case in a child process (2 GB of address space,
30 s) and counts, per class, the refusals, the dangerous accepts, the tracebacks and the hangs.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pulumi
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from kimi_cluster.blueprint.admission import admit
from kimi_cluster.hyperstack_api.api import ApiSettings, HyperstackError
from kimi_cluster.settings import SettingsError
from kimi_cluster.settings.loader import load_settings, read_stack_file
from tests.bad_input.test_settings_refusals import taken

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIexampleexampleexample operator@laptop"
HOST = "api.example.com"
TOKENSPEED = {"topology": "b300x1-tokenspeed", "image": "lightseekorg/tokenspeed:0.1.1@sha256:" + "ab" * 32}
VLLM = {"topology": "b300x1-vllm"}


class Accepted(AssertionError):
    """The input went through: nothing refused it."""


def load(**raw):
    raw.setdefault("operatorCidr", "198.18.0.7/32")
    raw.setdefault("sshPublicKey", KEY)
    return admit(load_settings(raw, "dev"))  # the settings' rules, then the plan's (the program runs both)


def refused(raw: dict, needle: str) -> Callable[[], None]:
    def case() -> None:
        try:
            load(**raw)
        except SettingsError as err:
            text = str(err)
            assert needle in text and "Traceback" not in text and len(text) < 3000, text
            return
        raise Accepted(raw)
    return case


# Where _tmp() makes its directories (the 50 MB stack file among them): the running test's tmp_path, or the folder
# the counting parent gave its child (the parent removes it).
_SCRATCH: list[Path] = []


@pytest.fixture
def scratch(tmp_path: Path) -> Iterator[Path]:
    _SCRATCH.append(tmp_path)
    try:
        yield tmp_path
    finally:
        _SCRATCH.remove(tmp_path)


def _tmp() -> Path:
    """A fresh scratch directory for one case."""
    return Path(tempfile.mkdtemp(dir=_SCRATCH[-1]))


def stack_file_refused(lines: dict[str, str], needle: str) -> Callable[[], None]:
    """A Pulumi.<stack>.yaml holding `lines` (full key -> value) besides a good operatorCidr and sshPublicKey."""
    def case() -> None:
        path = _tmp() / "Pulumi.p.yaml"
        config = {"kimi-cluster:operatorCidr": "198.18.0.7/32", "kimi-cluster:sshPublicKey": KEY, **lines}
        path.write_text(json.dumps({"config": config}), encoding="utf-8")  # JSON is YAML
        try:
            raw, _ = read_stack_file(str(path))
            load(**raw)
        except SettingsError as err:
            assert needle in str(err), str(err)
            return
        raise Accepted(lines)
    return case


def cli_refused(main: Callable[[list[str]], int], argv: list[str], needle: str) -> Callable[[], None]:
    """`main(argv)` ends in one `error:` line naming `needle`, with exit code 1 or 2 (argparse's exit 2 counts)."""
    def case() -> None:
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                code = main(argv)
            except SystemExit as stop:
                code = stop.code if isinstance(stop.code, int) else 2
                if isinstance(stop.code, str):
                    err.write(f"error: {stop.code}\n")
        text = err.getvalue()
        if code == 0:
            raise Accepted(argv)
        assert code in (1, 2) and "error:" in text and needle in text and "Traceback" not in text, (code, text)
    return case


class BringUpStarted(Accepted):
    """A benchmark started a sandbox bring-up before its arguments were checked."""


class _NoSandbox:
    def __init__(self, *args, **kwargs):
        raise BringUpStarted("a sandbox was built before the arguments were checked")


def bench_refused(module_name: str, argv: list[str], needle: str) -> Callable[[], None]:
    """A benchmark whose sandbox (and emulator) is replaced by one that refuses to start: its arguments and its
    workdir must be refused before a bring-up would begin."""
    def case() -> None:
        import importlib

        module = importlib.import_module(module_name)
        saved = {name: getattr(module, name) for name in ("Sandbox", "_emulator") if hasattr(module, name)}
        for name in saved:
            setattr(module, name, _NoSandbox)
        try:
            cli_refused(module.main, argv, needle)()
        finally:
            for name, value in saved.items():
                setattr(module, name, value)
    return case


# ---- your own TLS ---------------------------------------------------------------------------------------------------

NOW = dt.datetime.now(dt.UTC)


def _cert(subject, key, issuer=None, issuer_key=None, ca=False, extensions=()):
    b = (x509.CertificateBuilder()
         .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
         .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer or subject)]))
         .public_key(key.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(NOW - dt.timedelta(days=1)).not_valid_after(NOW + dt.timedelta(days=90))
         .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if not ca:
        b = b.add_extension(x509.SubjectAlternativeName([x509.DNSName(HOST)]), critical=False)
    for ext in extensions:
        b = b.add_extension(ext, critical=False)
    return b.sign(issuer_key or key, hashes.SHA256())


def _pem(cert) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def _key_pem(key) -> str:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


def _usage(digital_signature=False, key_encipherment=False, cert_sign=False):
    return x509.KeyUsage(digital_signature=digital_signature, content_commitment=False,
                         key_encipherment=key_encipherment, data_encipherment=False, key_agreement=False,
                         key_cert_sign=cert_sign, crl_sign=False, encipher_only=False, decipher_only=False)


def _resigned_sha1(cert: x509.Certificate, issuer_key: rsa.RSAPrivateKey) -> x509.Certificate:
    """`cert` (signed sha256WithRSAEncryption) signed again with SHA-1, which cryptography no longer signs with: the
    two OIDs have the same length and so do the signatures, so the DER is patched in place."""
    der = cert.public_bytes(serialization.Encoding.DER)
    sha256_rsa, sha1_rsa = bytes.fromhex("2a864886f70d01010b"), bytes.fromhex("2a864886f70d010105")
    tbs = cert.tbs_certificate_bytes.replace(sha256_rsa, sha1_rsa)
    signature = issuer_key.sign(tbs, padding.PKCS1v15(), hashes.SHA1())  # the weakness under test
    return x509.load_der_x509_certificate(der.replace(sha256_rsa, sha1_rsa)[:-len(signature)] + signature)


def tls_refused(leaf_key_factory, needle: str, extensions=(), sha1=False) -> Callable[[], None]:
    def case() -> None:
        ca_key = rsa.generate_private_key(65537, 2048) if sha1 else ec.generate_private_key(ec.SECP256R1())
        ca = _cert("Team CA", ca_key, ca=True)
        leaf_key = leaf_key_factory()
        leaf = _cert(HOST, leaf_key, "Team CA", ca_key, extensions=extensions)
        if isinstance(ca_key, rsa.RSAPrivateKey):  # the SHA-1 case: only RSA's signature keeps its length
            leaf = _resigned_sha1(leaf, ca_key)
        refused({"tlsCertificate": _pem(leaf) + _pem(ca), "tlsPrivateKey": _key_pem(leaf_key),
                 "apiHostname": HOST}, needle)()
    return case


def _p256():
    return ec.generate_private_key(ec.SECP256R1())


# ---- the CLIs -------------------------------------------------------------------------------------------------------


def _big_stack_file() -> str:
    path = _tmp() / "Pulumi.big.yaml"
    line = "# " + "x" * 1000 + "\n"
    path.write_text(f"config:\n  kimi-cluster:operatorCidr: 198.18.0.7/32\n  kimi-cluster:sshPublicKey: {KEY}\n"
                    + line * 50_000, encoding="utf-8")
    return str(path)


def _config() -> str:
    path = _tmp() / "Pulumi.p.yaml"
    path.write_text(f"config:\n  kimi-cluster:operatorCidr: 198.18.0.7/32\n  kimi-cluster:sshPublicKey: {KEY}\n",
                    encoding="utf-8")
    return str(path)


def _workdir(state: str | None = None, kind: str = "dir") -> str:
    root = _tmp()
    if kind == "file":
        (root / "w").write_text("not a directory", encoding="utf-8")
        return str(root / "w")
    (root / "w").mkdir()
    if state is not None:
        (root / "w" / "state.json").write_text(state, encoding="utf-8")
    return str(root / "w")


def _status(argv):
    from kimi_cluster.cli import status

    return status.main(argv)


def _timeline(argv):
    from kimi_cluster.cli import timeline

    return timeline.main(argv)


def _plan(argv):
    from kimi_cluster.cli import plan

    return plan.main(argv)


def _emulator(argv):
    from kimi_cluster.cli import emulator

    return emulator.main(argv)


def _bench_weights(argv):
    from benchmarks import bench_weights

    return bench_weights.main(argv)


def retry_base_refused(value: str) -> Callable[[], None]:
    def case() -> None:
        saved = os.environ.get("HYPERSTACK_RETRY_BASE_SECONDS")
        os.environ["HYPERSTACK_RETRY_BASE_SECONDS"] = value
        try:
            settings = ApiSettings.resolve({"hyperstack:apiKey": "k"})
        except HyperstackError as err:
            assert "HYPERSTACK_RETRY_BASE_SECONDS" in str(err), str(err)
            return
        finally:
            if saved is None:
                os.environ.pop("HYPERSTACK_RETRY_BASE_SECONDS", None)
            else:
                os.environ["HYPERSTACK_RETRY_BASE_SECONDS"] = saved
        raise Accepted(f"retry base {settings.retry_base_seconds}")
    return case


def break_even_refused() -> None:
    from kimi_cluster.operator.plan_report import build_plan

    try:
        settings = load(apiOutputPriceUsdPerM=1e-300, apiInputPriceUsdPerM=0)
    except SettingsError as err:
        assert "kimi-cluster:apiOutputPriceUsdPerM" in str(err), str(err)
        return
    build_plan(settings, {}, "probe")
    raise Accepted("the plan priced a break-even at 1e-300 $/1M")


CASES: list[tuple[int, str, Callable[[], None]]] = [
    # 2. a misspelt namespace
    *[(2, f"namespace {ns!r}", stack_file_refused({f"{ns}:topology": "b300x1-vllm"}, "did you mean kimi-cluster"))
      for ns in ("kim\u0456-cluster", "kimi-clsuter", "kimi_cluster", "Kimi-Cluster", " kimi-cluster",
                 "\u200bkimi-cluster")],
    (2, "no namespace", stack_file_refused({"topology": "b300x1-vllm"}, "kimi-cluster:topology")),
    (2, "hyperstack:apikey", stack_file_refused({"hyperstack:apikey": "k"}, "did you mean hyperstack:apiKey")),
    (2, "hyperstak:apiKey", stack_file_refused({"hyperstak:apiKey": "k"}, "did you mean hyperstack")),
    # 3. the front's keys
    (3, "frontOsImage spaces", refused({"replicas": 2, "frontOsImage": " Ubuntu 24.04 "}, "kimi-cluster:frontOsImage")),
    (3, "frontOsImage long", refused({"replicas": 2, "frontOsImage": "U" * 5000}, "kimi-cluster:frontOsImage")),
    (3, "frontOsImage U+2028", refused({"replicas": 2, "frontOsImage": "Ubuntu\u2028x"}, "kimi-cluster:frontOsImage")),
    (3, "frontFlavor GPU", refused({"replicas": 2, "frontFlavor": "n3-H100x8-NVLink"}, "kimi-cluster:frontFlavor")),
    (3, "frontFlavor GPU priced", refused({"replicas": 2, "frontFlavor": "n3-H100x8-NVLink",
                                           "frontHourlyPriceUsd": 0.35}, "kimi-cluster:frontFlavor")),
    (3, "frontFlavor unknown", refused({"replicas": 2, "frontFlavor": "n1-cpu-huge", "frontHourlyPriceUsd": 1},
                                       "kimi-cluster:frontFlavor")),
    # 4. TokenSpeed's ports, operatorCidr's zone id
    (4, "tokenspeed +2 on SSH", refused({**TOKENSPEED, "enginePort": 20}, "kimi-cluster:enginePort")),
    (4, "tokenspeed +1 on SSH", refused({**TOKENSPEED, "enginePort": 21}, "kimi-cluster:enginePort")),
    (4, "tokenspeed under 1024", refused({**TOKENSPEED, "enginePort": 1000}, "kimi-cluster:enginePort")),
    (4, "tokenspeed +2 under 1024", refused({**TOKENSPEED, "enginePort": 1021}, "kimi-cluster:enginePort")),
    (4, "tokenspeed +1 rendezvous", refused({**TOKENSPEED, "enginePort": 19999}, "kimi-cluster:enginePort")),
    (4, "operatorCidr zone id", refused({"operatorCidr": "fe80::1%eth0/128", "allowPrivateOperatorCidr": True},
                                        "kimi-cluster:operatorCidr")),
    (4, "operatorCidr public zone id", refused({"operatorCidr": "2001:4860::1%eth0/128"}, "kimi-cluster:operatorCidr")),
    # 5. your own TLS
    (5, "leaf key usage", tls_refused(_p256, "key usage", [_usage(key_encipherment=True)])),
    (5, "leaf EKU clientAuth", tls_refused(_p256, "serverAuth",
                                           [x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH])])),
    (5, "RSA 1024", tls_refused(lambda: rsa.generate_private_key(65537, 1024), "2048")),
    (5, "EC P-192", tls_refused(lambda: ec.generate_private_key(ec.SECP192R1()), "P-256")),
    (5, "SHA-1 signature", tls_refused(_p256, "SHA-1", sha1=True)),
    # 6. nodeTiming as a whole
    (6, "a 1-day settle", refused({"nodeTiming": '{"settleSeconds": 86400}'}, "settleSeconds")),
    (6, "a 1-day proxy settle", refused({"nodeTiming": '{"proxySettleSeconds": 86400}'}, "proxySettleSeconds")),
    (6, "pull budget past a week", refused({"nodeTiming": '{"pullAttempts": 100, "pullTimeoutS": 86400}'},
                                           "kimi-cluster:nodeTiming")),
    (6, "slack past a week", refused({"nodeTiming": '{"deadlineSlackS": 86400}', "downloadTimeoutMinutes": 10080},
                                     "kimi-cluster:nodeTiming")),
    (6, "launch timeout 1 s", refused({"nodeTiming": '{"launchTimeoutS": 1}'}, "launchTimeoutS")),
    (6, "cloud-init timeout 1 s", refused({"nodeTiming": '{"cloudInitTimeoutS": 1}'}, "cloudInitTimeoutS")),
    (6, "docker timeout under a poll", refused({"nodeTiming": '{"dockerTimeoutS": 60, "fastPollSeconds": 600}'},
                                               "fastPollSeconds")),
    # 7. engine limits
    (7, "maxModelLen 2**24", refused({"maxModelLen": 2**24}, "kimi-cluster:maxModelLen")),
    (7, "maxModelLen 1048577", refused({"maxModelLen": 1_048_577}, "kimi-cluster:maxModelLen")),
    *[(7, f"{engine} {arg}", refused({**base, "extraEngineArgs": json.dumps(arg.split(" "))},
                                     "kimi-cluster:extraEngineArgs"))
      for engine, base, arg in (
          ("vllm", VLLM, "--pipeline-parallel-size 2"), ("vllm", VLLM, "-pp 2"), ("vllm", VLLM, "-pp=2"),
          ("vllm", VLLM, "--data-parallel-size-local 8"), ("vllm", VLLM, "--data-parallel-start-rank=0"),
          ("sglang", {}, "--dp-size 2"), ("sglang", {}, "--pp-size=2"), ("sglang", {}, "--pipeline-parallel-size 2"),
          ("tokenspeed", TOKENSPEED, "--data-parallel-size 2"), ("tokenspeed", TOKENSPEED, "--data-parallel-size=2"))],
    # 8. numbers that overflow
    (8, "break-even 1e-300", break_even_refused),
    *[(8, f"HYPERSTACK_RETRY_BASE_SECONDS={v}", retry_base_refused(v)) for v in ("-1", "nan", "inf", "1e9")],
    *[(8, f"hyperstack:retryBaseSeconds={v}",
       stack_file_refused({"hyperstack:retryBaseSeconds": v}, "hyperstack:retryBaseSeconds"))
      for v in ("-1", "nan", "inf", "1e9")],
    # 9. the CLIs
    (9, "emulator --first-ip", cli_refused(_emulator, ["--port", "0", "--first-ip", "not-an-ip"], "--first-ip")),
    (9, "emulator --first-floating-ip", cli_refused(_emulator, ["--port", "0", "--first-floating-ip", "x"],
                                                    "--first-floating-ip")),
    (9, "status --state /dev/zero", lambda: cli_refused(
        _status, ["--stack", "p", "--config", _config(), "--state", "/dev/zero"], "/dev/zero")()),
    (9, "timeline /dev/zero", cli_refused(_timeline, ["/dev/zero", "--out", "/tmp/input34-t.svg"], "/dev/zero")),
    (9, "plan: a 50 MB stack file", lambda: cli_refused(_plan, ["--config", _big_stack_file()], "MB")()),
    (9, "bench_weights --cap 1e-300", cli_refused(_bench_weights, ["--cap", "1e-300"], "--cap")),
    (9, "bench_replicas --chats 0", lambda: bench_refused("benchmarks.bench_replicas",
                                                          ["--chats", "0", "--workdir", _workdir()], "--chats")()),
    (9, "bench_replicas --before nan", lambda: bench_refused("benchmarks.bench_replicas",
                                                             ["--before", "nan", "--workdir", _workdir()],
                                                             "--before")()),
    (9, "bench_replicas --token-seconds -1", lambda: bench_refused(
        "benchmarks.bench_replicas", ["--token-seconds", "-1", "--workdir", _workdir()], "--token-seconds")()),
    (9, "bench_replicas corrupt state", lambda: bench_refused(
        "benchmarks.bench_replicas", ["--workdir", _workdir("{not json")], "--workdir")()),
    (9, "bench_replicas workdir a file", lambda: bench_refused(
        "benchmarks.bench_replicas", ["--workdir", _workdir(kind="file")], "--workdir")()),
    (9, "bench_kernel_cache corrupt state", lambda: bench_refused(
        "benchmarks.bench_kernel_cache", ["--workdir", _workdir("[1, 2]")], "--workdir")()),
    (9, "bench_kernel_cache workdir a file", lambda: bench_refused(
        "benchmarks.bench_kernel_cache", ["--workdir", _workdir(kind="file")], "--workdir")()),
    (9, "bench_sandbox workdir a file", lambda: bench_refused(
        "benchmarks.bench_sandbox", ["--workdir", _workdir(kind="file")], "--workdir")()),
    (9, "bench_sandbox --build-seconds -1", lambda: bench_refused(
        "benchmarks.bench_sandbox", ["--build-seconds", "-1", "--workdir", _workdir()], "--build-seconds")()),
]

IDS = [f"{cls}-{name}" for cls, name, _ in CASES]
assert len(set(IDS)) == len(IDS), "every case needs its own name"


@pytest.mark.parametrize("case", [c for _, _, c in CASES], ids=IDS)
def test_refused_naming_the_key_or_argument(case, scratch):
    case()


ACCEPTED = [
    {"nodeTiming": '{"settleSeconds": 2, "proxySettleSeconds": 1}'},
    {"nodeTiming": '{"pullAttempts": 6, "pullTimeoutS": 7200}'},
    {"maxModelLen": 1_048_576, **VLLM},
    {**TOKENSPEED, "enginePort": 31000},
    {"replicas": 2, "frontOsImage": "Ubuntu Server 24.04 LTS R570 CUDA 12.8 with Docker"},
    {"operatorCidr": "2001:4860::1/128"},
    {"extraEngineArgs": '["--enable-metrics", "--dp-attention-foo"]'},
    {"apiOutputPriceUsdPerM": 0.01, "apiInputPriceUsdPerM": 0},
]


@pytest.mark.parametrize("raw", ACCEPTED, ids=[repr(r)[:60] for r in ACCEPTED])
def test_legitimate_values_are_accepted(raw):
    taken(load(**raw), raw)


def test_legitimate_namespaces_are_accepted(tmp_path):
    path = tmp_path / "Pulumi.p.yaml"
    path.write_text(json.dumps({"config": {
        "kimi-cluster:operatorCidr": "198.18.0.7/32", "kimi-cluster:sshPublicKey": KEY,
        "hyperstack:apiUrl": "http://127.0.0.1:8700/v1", "hyperstack:retryBaseSeconds": "0.005",
        "pulumi:tags": {"team": "ml"}, "pulumi:disable-default-providers": ["*"]}}), encoding="utf-8")
    raw, other = read_stack_file(str(path))
    assert raw["operatorCidr"] == "198.18.0.7/32" and other["hyperstack:retryBaseSeconds"] == "0.005"


@pytest.mark.parametrize("extra,needle", [
    ({"kimi_cluster:topology": "b300x1-vllm"}, "did you mean kimi-cluster:topology?"),
    ({"hyperstack:retryBaseSeconds": "1e9"}, "hyperstack:retryBaseSeconds '1e9' is not a number of seconds"),
], ids=["namespace", "retry base"])
def test_the_program_refuses_before_registering_anything(extra, needle):
    from tests.deploy.test_program import config, outputs_for
    from tests.pulumi_harness import Recording, run_program

    cfg, secret = config()
    recording = Recording()
    with pytest.raises(pulumi.RunError, match=needle):
        run_program({**cfg, **extra}, secret, outputs_for, recording=recording)
    assert not recording.resources


def test_the_program_refuses_a_retry_base_variable(monkeypatch):
    from tests.deploy.test_program import config, outputs_for
    from tests.pulumi_harness import run_program

    monkeypatch.setenv("HYPERSTACK_RETRY_BASE_SECONDS", "inf")
    with pytest.raises(pulumi.RunError, match="HYPERSTACK_RETRY_BASE_SECONDS 'inf' is not a number of seconds"):
        run_program(*config(), outputs_for)


# ---- the count ------------------------------------------------------------------------------------------------------


def _run_one(index: int, scratch: str) -> None:
    """In a child: run case `index` with its scratch directories in `scratch`, print its outcome as the last line."""
    import resource
    import traceback

    _SCRATCH.append(Path(scratch))
    resource.setrlimit(resource.RLIMIT_AS, (2 * 1024**3, 2 * 1024**3))  # /dev/zero read whole ends in MemoryError
    try:
        CASES[index][2]()
    except Accepted as err:
        print(f"\nOUTCOME accepted {str(err)[:200]}")
    except MemoryError:
        print("\nOUTCOME hang (memory ran out)")
    except AssertionError as err:  # refused, but not naming the key or the reason the case expects
        print("\nOUTCOME misreported " + str(err)[:200].replace("\n", " "))
    except BaseException as err:  # noqa: BLE001 - a probe counts every other way a case can end
        traceback.print_exc()
        print(f"\nOUTCOME traceback {type(err).__name__}: {str(err)[:200]}")
    else:
        print("\nOUTCOME refused")


def _count() -> int:
    import subprocess
    from collections import Counter

    by_class: dict[int, Counter[str]] = {}
    for index, (cls, name, _) in enumerate(CASES):
        try:
            # The case's scratch, removed here: a child killed at 30 s could not.
            with tempfile.TemporaryDirectory(prefix="bad-input-3-") as scratch:
                done = subprocess.run([sys.executable, "-m", "tests.bad_input.test_program_and_cli_refusals", "--one",
                                       str(index), scratch], capture_output=True, text=True, timeout=30,
                                      start_new_session=True)
            last = (done.stdout.strip().splitlines() or ["OUTCOME traceback (no output)"])[-1]
            outcome = last.split()[1] if last.startswith("OUTCOME") else "traceback"
        except subprocess.TimeoutExpired:
            outcome, last = "hang", "OUTCOME hang (30 s)"
        by_class.setdefault(cls, Counter())[outcome] += 1
        if outcome != "refused":
            print(f"  class {cls} {name}: {last.removeprefix('OUTCOME ')}", flush=True)
    print(f"{'class':>5} {'tried':>6} {'refused':>8} {'accepted':>9} {'misreported':>12} {'traceback':>10} "
          f"{'hang':>5}")
    for cls, counts in sorted(by_class.items()):
        print(f"{cls:>5} {sum(counts.values()):>6} {counts['refused']:>8} {counts['accepted']:>9} "
              f"{counts['misreported']:>12} {counts['traceback']:>10} {counts['hang']:>5}")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--one"]:
        _run_one(int(sys.argv[2]), sys.argv[3])
    else:
        sys.exit(_count())
