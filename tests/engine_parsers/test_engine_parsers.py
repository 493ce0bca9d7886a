"""Every engine flag the program renders parses with the engine's own parser, from pinned wheels: vLLM's three
layouts with `vllm serve`'s parser and validator, TokenSpeed's command line with its splitter, its ServerArgs'
options and the smg gateway's parser, SGLang's four ranks with its ServerArgs; and the kernel warm-up's command
lines too (SGLang's through its compile tool's parser). The parsers live in their own virtualenv (install.sh); see
probe.py.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from kimi_cluster.blueprint.inputs import engine_inputs, resume_inputs
from kimi_cluster.plan import chat_layer, launch, resume, warmup
from kimi_cluster.settings.loader import load_settings

pytestmark = pytest.mark.integration  # starts fake nodes, servers or outside tools

ROOT = Path(__file__).resolve().parents[2]
PYTHON = Path(os.environ.get("KIMI_PARSERS_VENV") or ROOT / ".venv-parsers") / "bin" / "python"
PROBE = Path(__file__).with_name("probe.py")
BASE = {"operatorCidr": "203.0.113.7/32", "sshPublicKey": "ssh-ed25519 AAAAC3Nza test"}

if not PYTHON.exists():
    # CI installs them (.ci/run); elsewhere the suite runs without this module unless they are installed.
    reason = f"the engines' parsers are not installed at {PYTHON.parent.parent}: bash tests/engine_parsers/install.sh"
    if os.environ.get("CI"):
        raise RuntimeError(reason)
    pytest.skip(reason, allow_module_level=True)


def _node_words(items: list) -> list[str]:
    """Words as the node's shell hands them to the engine: launch.sh.j2 and warmup.sh.j2 set ${OMP_THREADS} (its
    cores over its GPUs) and ${LOADER_CONFIG} (SGLang's loader JSON, with that share) before `docker run`."""
    loader = '{"enable_multithread_load": true, "num_threads": 28}'
    return [str(w).replace(str(launch.PLACEHOLDER_THREADS), "28").replace(str(launch.PLACEHOLDER_LOADER_CONFIG),
                                                                            loader)
            for w in launch.flatten(items)]


def _rendered(raw: dict, rank: int = 0) -> list[str]:
    """The engine's flags as the launch step renders them, after `<engine> serve`."""
    settings = load_settings({**BASE, **raw}, "dev")
    words = _node_words(launch.engine_argv(engine_inputs(settings), rank, "10.0.0.1"))
    assert words[1] == "serve"
    return words[2:]


def _render_server(raw: dict) -> list[str]:
    """The front's `vllm launch render` as the resume step renders it (its slot's port: the first one's)."""
    settings = load_settings({**BASE, **raw}, "dev")
    port = str(resume.RENDER_SLOTS[0][1])
    return [str(w).replace(str(resume.SLOT_PORT),
                           port) for w in launch.flatten(resume.render_server_argv(resume_inputs(settings)))]


def _warmup(raw: dict, rank: int = 0) -> list[str]:
    """The kernel warm-up's flags as warmup.sh.j2 renders them: after `<engine> serve`, or after SGLang's tool."""
    settings = load_settings({**BASE, **raw, "kernelWarmup": True}, "dev")
    words = _node_words(warmup.engine_argv(engine_inputs(settings), rank, "10.0.0.1", 2400))
    skip = len(warmup.SGLANG_COMPILE_TOOL) if warmup.exits_by_itself(engine_inputs(settings)) else 2
    return words[skip:]


def _vllm_raw(layout: str | None) -> dict:
    return {"topology": "b300x1-vllm"} | ({"engineLayout": layout} if layout else {})


VLLM_LAYOUTS = [
    (None, {"tensor_parallel_size": 8, "data_parallel_size": 1, "decode_context_parallel_size": 1,
            "enable_expert_parallel": False, "max_model_len": None}),
    ("dp8-ep", {"tensor_parallel_size": 1, "data_parallel_size": 8, "decode_context_parallel_size": 1,
                "enable_expert_parallel": True, "max_model_len": None}),
    ("tp8-dcp8", {"tensor_parallel_size": 8, "data_parallel_size": 1, "decode_context_parallel_size": 8,
                  "enable_expert_parallel": False, "max_model_len": 1048576}),
]
# Behind a front: the head binds its private address, and serves the token API the front's resuming layer uses.
VLLM_REPLICAS = {"topology": "b300x1-vllm", "replicas": 2}
# The replicas' chat layer set through extraEngineArgs, in the spellings vLLM takes (= and underscores included): the
# front's render server gets the same (kimi_cluster/plan/chat_layer.py); --enforce-eager is not the chat layer's.
CHAT_LAYER_ARGS = ["--chat-template", "{{ messages[0]['content'] }}", "--default_chat_template_kwargs",
                   '{"thinking": false}', "--generation-config=vllm", "--override-generation-config",
                   '{"temperature": 0.6}', "--tokenizer-mode", "slow", "--tokenizer-revision", "main",
                   "--max-logprobs", "7", "--hf-overrides", '{"max_position_embeddings": 4096}', "--enforce-eager",
                   "--allowed-media-domains", "upload.wikimedia.org"]
VLLM_CHAT_LAYER = VLLM_REPLICAS | {"maxModelLen": 131072, "extraEngineArgs": json.dumps(CHAT_LAYER_ARGS)}
TOKENSPEED = {"topology": "b300x1-tokenspeed", "image": "lightseekorg/tokenspeed:0.1.1"}
SGLANG = {"topology": "h100x4-sglang"}
SGLANG_RANKS = range(4)
REFUSED = [
    ("tokenspeed", ["m", "--tool-call-parser", "not_a_parser"]),   # smg knows its parsers
    ("tokenspeed", ["m", "--enable-auto-tool-choice"]),            # vLLM's flag: smg refuses it
    ("tokenspeed", ["m", "--tp-size", "8"]),                        # SGLang's spelling
    ("tokenspeed", ["m", "--kv-cache-dtype", "fp9"]),              # ServerArgs' choices
    ("vllm", ["m", "--decode-context-parallel-size", "eight"]),
    ("vllm", ["m", "--tp-size", "8"]),
    ("sglang", ["--model-path", "m", "--load-format", "not_a_format"]),
    ("sglang", ["--model-path", "m", "--tp-size", "eight"]),
    ("sglang-compile-tool", ["--model-path", "m", "--timeout", "an hour"]),
]


def _probe(asked: list[tuple[str, list[str]]]) -> dict[str, dict]:
    done = subprocess.run([str(PYTHON), str(PROBE)],
                          input=json.dumps([{"engine": engine, "argv": argv} for engine, argv in asked]),
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    replies = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(replies) == len(asked), replies
    return {_key(engine, argv): reply | {"stderr": done.stderr[-1500:]}
            for (engine, argv), reply in zip(asked, replies, strict=True)}


@pytest.fixture(scope="module")
def answers(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> dict[str, dict]:
    """Every command line of this module parsed by one probe process, keyed by _key(engine, argv): each vLLM
    import costs some 15 CPU-seconds. Under xdist the first worker to get here parses them, the others read its
    answers (pytest-xdist's recipe for a fixture that runs once: a file and a lock in the run's shared temp dir)."""
    asked = [("vllm", _rendered(_vllm_raw(layout))) for layout, _ in VLLM_LAYOUTS]
    asked += [("tokenspeed", _rendered(TOKENSPEED)), *REFUSED]
    asked += [("sglang", _rendered(SGLANG, rank)) for rank in SGLANG_RANKS]
    asked += [("sglang-compile-tool", _warmup(SGLANG, rank)) for rank in SGLANG_RANKS]
    asked += [("vllm", _warmup(_vllm_raw(layout))) for layout, _ in VLLM_LAYOUTS]
    asked += [("tokenspeed", _warmup(TOKENSPEED)), ("vllm", _rendered(VLLM_REPLICAS))]
    asked += [("vllm", _rendered(VLLM_CHAT_LAYER)), ("vllm-render", _render_server(VLLM_CHAT_LAYER)),
              ("vllm-options", [])]
    base = tmp_path_factory.getbasetemp()
    shared = base if worker_id == "master" else base.parent  # this run's directory, never an earlier run's
    # Named by what was asked and with which probe, so no other request set can read these answers.
    digest = hashlib.sha256(json.dumps([asked, PROBE.read_text(), str(PYTHON)]).encode()).hexdigest()[:16]
    path = shared / f"engine-parser-answers-{digest}.json"
    with open(shared / "engine-parser-answers.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.exists():
            path.write_text(json.dumps(_probe(asked)))
        return json.loads(path.read_text())


def _key(engine: str, argv: list[str]) -> str:
    return json.dumps([engine, argv])


def test_a_replicas_vllm_serves_the_token_api_on_its_private_address(answers):
    answer = answers[_key("vllm", _rendered(VLLM_REPLICAS))]
    assert answer["ok"], answer
    assert answer["values"]["enable_scale_out"] is True and answer["values"]["host"] == "10.0.0.1"
    assert "--enable-scale-out" not in _rendered(_vllm_raw(None))  # one replica: no front, no token API


def test_the_render_server_gets_the_replicas_chat_layer_and_parses_it_as_vllm_launch_render(answers):
    assert answers[_key("vllm", _rendered(VLLM_CHAT_LAYER))]["ok"]  # the replicas take them
    answer = answers[_key("vllm-render", _render_server(VLLM_CHAT_LAYER))]
    assert answer["ok"], answer
    values = answer["values"]
    assert values["launch_command"] == "RenderSubcommand.cmd" and values["model_tag"] == "moonshotai/Kimi-K3.1-Pro"
    assert (values["host"], values["port"]) == ("127.0.0.1", resume.RENDER_SLOTS[0][1])
    assert values["chat_template"] == "{{ messages[0]['content'] }}"
    assert values["default_chat_template_kwargs"] == {"thinking": False}
    assert values["generation_config"] == "vllm" and values["override_generation_config"] == {"temperature": 0.6}
    assert (values["tokenizer_mode"], values["tokenizer_revision"], values["max_logprobs"]) == ("slow", "main", 7)
    assert values["hf_overrides"] == {"max_position_embeddings": 4096}
    assert values["allowed_media_domains"] == ["upload.wikimedia.org"]
    assert "--enforce-eager" not in _render_server(VLLM_CHAT_LAYER)


def test_every_chat_layer_flag_is_one_of_vllms_own(answers):
    options = set(answers[_key("vllm-options", [])]["values"]["options"])
    assert [f for f in (*chat_layer.RENDER_FLAGS, *chat_layer.UNRENDERABLE) if f not in options] == []


@pytest.mark.parametrize("layout,expected", VLLM_LAYOUTS)
def test_each_vllm_layout_parses_with_vllms_own_parser(answers, layout, expected):
    answer = answers[_key("vllm", _rendered(_vllm_raw(layout)))]
    assert answer["ok"], answer
    values = answer["values"]
    assert {k: values[k] for k in expected} == expected
    assert values["model_tag"] == "moonshotai/Kimi-K3.1-Pro" and values["host"] == "127.0.0.1"
    assert values["tool_call_parser"] == values["reasoning_parser"] == "kimi_k3"


def test_tokenspeeds_command_line_parses_with_its_splitter_serverargs_and_the_gateway(answers):
    answer = answers[_key("tokenspeed", _rendered(TOKENSPEED))]
    assert answer["ok"], answer
    engine, gateway = answer["values"]["engine"], answer["values"]["gateway"]
    assert engine["--tensor-parallel-size"] == "8" and engine["--mm-encoder-tp-mode"] == "data"
    assert engine["--kv-cache-dtype"] == "fp8" and engine["--reasoning-parser"] == "kimi_k3"
    assert engine["--weight-loader-prefetch-num-threads"] == "28"  # the loader's share of the node's cores
    assert "--host" not in engine and "--tool-call-parser" not in engine  # the gateway's, not the engine's
    assert (gateway["host"], gateway["port"]) == ("127.0.0.1", 30000)
    assert (gateway["prometheus_host"], gateway["prometheus_port"]) == ("127.0.0.1", 30002)
    assert gateway["reasoning_parser"] == gateway["tool_call_parser"] == "kimi_k3"
    assert gateway["api_key"] is None  # the proxy checks the key; the gateway never holds it


@pytest.mark.parametrize("engine,argv", REFUSED)
def test_the_parsers_refuse_what_the_engines_refuse(answers, engine, argv):
    assert not answers[_key(engine, argv)]["ok"]


@pytest.mark.parametrize("rank", SGLANG_RANKS)
def test_every_sglang_rank_parses_with_sglangs_own_parser_loader_threads_included(answers, rank):
    answer = answers[_key("sglang", _rendered(SGLANG, rank))]
    assert answer["ok"], answer
    values = answer["values"]
    assert (values["tp_size"], values["ep_size"], values["nnodes"], values["node_rank"]) == (32, 32, 4, rank)
    assert values["dist_init_addr"] == "10.0.0.1:20000" and values["load_format"] == "auto"
    # The loader's share of the node's cores, as SGLang's DefaultModelLoader reads it.
    assert json.loads(values["model_loader_extra_config"]) == {"enable_multithread_load": True, "num_threads": 28}
    assert values["moe_runner_backend"] == "marlin" and values["host"] == "127.0.0.1"


@pytest.mark.parametrize("rank", SGLANG_RANKS)
def test_every_sglang_ranks_warmup_parses_with_the_compile_tools_parser(answers, rank):
    answer = answers[_key("sglang-compile-tool", _warmup(SGLANG, rank))]
    assert answer["ok"], answer
    values = answer["values"]
    assert (values["tp_size"], values["nnodes"], values["node_rank"]) == (32, 4, rank)
    # Random weights, no loader config (the dummy loader refuses one), the warm-up's own ports, its own deadline.
    assert values["load_format"] == "dummy" and values["model_loader_extra_config"] == "{}"
    assert values["dist_init_addr"] == "10.0.0.1:20050" and (values["host"], values["port"]) == ("127.0.0.1", 20060)
    assert values["timeout"] == 2400


@pytest.mark.parametrize("layout,expected", VLLM_LAYOUTS)
def test_each_vllm_layouts_warmup_parses_with_vllms_own_parser(answers, layout, expected):
    answer = answers[_key("vllm", _warmup(_vllm_raw(layout)))]
    assert answer["ok"], answer
    values = answer["values"]
    assert {k: values[k] for k in expected} == expected  # the same layout as the launch compiles for
    assert values["load_format"] == "dummy" and (values["host"], values["port"]) == ("127.0.0.1", 20060)


def test_tokenspeeds_warmup_parses_with_its_splitter_serverargs_and_the_gateway(answers):
    answer = answers[_key("tokenspeed", _warmup(TOKENSPEED))]
    assert answer["ok"], answer
    engine, gateway = answer["values"]["engine"], answer["values"]["gateway"]
    assert engine["--load-format"] == "dummy" and engine["--tensor-parallel-size"] == "8"
    assert (gateway["host"], gateway["port"]) == ("127.0.0.1", 20060)
    assert (gateway["prometheus_host"], gateway["prometheus_port"]) == ("127.0.0.1", 20062)
