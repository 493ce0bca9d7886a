"""The front's resuming layer in the plan (kimi_cluster/plan/resume.py): which stacks get it, what its step ships and
starts, and the front's Caddyfile handing it the chat completions."""

from __future__ import annotations

import ast
import base64
import gzip
import json
import re
import subprocess
from pathlib import Path

import pytest

from kimi_cluster.blueprint import blueprint
from kimi_cluster.blueprint.inputs import compile_steps, endpoint_inputs, engine_inputs, resume_inputs
from kimi_cluster.deploy.remote_step import remote_command_text
from kimi_cluster.plan import front_config, resume
from kimi_cluster.plan.jinja import Verbatim, shell_words
from kimi_cluster.plan.step_scripts import ShippedFile
from kimi_cluster.plan.steps.model import PLAN_TLS, VmSpot
from kimi_cluster.plan.steps.scripts import render_vm_scripts
from tests.node.conftest import make_settings

ROOT = Path(__file__).resolve().parents[2]
HEADS = ["10.0.0.21", "10.0.0.31"]


def front_steps(**config: str) -> list[str]:
    front = [vm for vm in blueprint(make_settings(**config), "kimi").vm_plans if vm.kind == "front"]
    return [s.step for s in front[0].steps] if front else []


def front_scripts(settings) -> dict[str, str]:
    front = next(vm for vm in blueprint(settings, "kimi").vm_plans if vm.kind == "front")
    return render_vm_scripts(compile_steps(settings), front, VmSpot(private_ip="10.0.0.2", public_ip="203.0.113.9",
                                                                    tls=PLAN_TLS,
                                                     front_upstreams=HEADS))


def test_vllm_and_sglang_replicas_behind_a_front_resume_and_the_key_turns_it_off():
    for topology in ("b300x1-vllm", "h100x4-sglang"):
        assert front_steps(topology=topology, replicas="2") == ["front-ready", "resume", "proxy", "readiness"]
        assert "resume" not in front_steps(topology=topology, replicas="2", resumeStreams="false")
        assert front_steps(topology=topology) == []  # one replica: no front, nothing changes
    # TokenSpeed renders and parses inside its compiled gateway: no chat layer on the front gives the same.
    image = f"lightseekorg/tokenspeed:0.1.1@sha256:{'a' * 64}"
    assert "resume" not in front_steps(topology="b300x1-tokenspeed", replicas="2", image=image)


def test_an_sglang_front_runs_sglangs_chat_layer_from_the_replicas_image_with_the_program_mounted(monkeypatch):
    settings = make_settings("h100x4-sglang", replicas="2")
    script = front_scripts(settings)["resume"]
    layer = resume_inputs(settings)
    # The chat layer's program, shipped byte for byte to its own folder before its container starts.
    packed = re.search(r"printf %s '([A-Za-z0-9+/=]+)' \| base64 -d \| gzip -dc > "
                       r"\"\$SHIP_TO/kimi_cluster/node/sglang_chat\.py\.new\"", script)
    assert packed and gzip.decompress(base64.b64decode(packed[1])).decode() == (
        ROOT / "kimi_cluster/node/sglang_chat.py").read_text(encoding="utf-8")
    assert script.index('SHIP_TO="${STATE}/sglang-chat-program"') < script.index("sglang_chat.py.new") \
        < script.index('SHIP_TO="$LAYER_SHIP_TO"') < script.index("kimi_cluster/node/resume/server.py.new")
    run = shell_words(resume.render_docker_argv(layer, "ENV", "HF"))
    assert (f"-v \"${{STATE}}/sglang-chat-program:/opt/kimi-cluster:ro\" --entrypoint python3 {layer.container_image} "
            f"-m kimi_cluster.node.sglang_chat {layer.model} --revision {layer.model_revision} --served-model-name "
            f"{layer.served_name} --trust-remote-code --host 127.0.0.1 --port \"${{RENDER_PORT}}\"") in run
    assert "-e PYTHONPATH=/opt/kimi-cluster" in run and "VLLM_TARGET_DEVICE" not in run
    assert "--engine sglang" in script and "starting SGLang's chat layer" in script and "vLLM" not in script
    # The program's text is part of the container's fingerprint: a new program starts a new container.
    fingerprint = resume.render_fingerprint(layer)
    changed = [ShippedFile("kimi_cluster/node/sglang_chat.py", Verbatim("changed\n"), "EOF")]
    monkeypatch.setattr(resume, "chat_program", lambda _layer: changed)  # a new program, the same flags
    assert resume.render_fingerprint(layer) != fingerprint
    # A vLLM front's layer keeps the flags of 0.3.x (vLLM is its default engine), so an upgrade restarts nothing.
    assert "--engine" not in resume.resumer_argv("vllm")


def test_the_step_ships_the_whole_program_byte_for_byte_and_passes_no_secret():
    settings = make_settings("b300x1-vllm", replicas="2", hfToken="hf_" + "s" * 34)
    script = front_scripts(settings)["resume"]
    for path in resume.PROGRAM:  # each gzipped in base64, written where it sits in this repository
        written = rf" \| base64 -d \| gzip -dc > \"\$SHIP_TO/{re.escape(path)}\.new\""
        packed = re.search(rf"printf %s '([A-Za-z0-9+/=]+)'{written}", script)
        assert packed, path
        assert gzip.decompress(base64.b64decode(packed[1])).decode() == (ROOT / path).read_text(encoding="utf-8")
    # The step travels as one argument, in base64 (kimi_cluster/deploy/remote_step.py): Linux takes 128 KiB at most.
    assert len(remote_command_text("resume", script, deadline_s=600)) < 128 * 1024
    assert "hf_sss" not in script
    # Every module of the program is shipped, and each import inside it is one of them.
    shipped = {Path(p).stem for p in resume.PROGRAM}
    folder = ROOT / "kimi_cluster/node/resume"
    assert {p.stem for p in folder.glob("*.py")} == shipped
    for module in folder.glob("*.py"):
        for node in ast.walk(ast.parse(module.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("kimi_cluster")):
                names = [node.module.rsplit(".", 1)[-1]] if node.module else [a.name for a in node.names]
                assert all(n in shipped for n in names), (module.name, names)
    # The replicas' engines, and the render server on the front's loopback.
    # The replicas' engines go to a file the running layer reads again, so an address change restarts nothing.
    assert "printf '%s\\n' http://10.0.0.21:30000" in script and "printf '%s\\n' http://10.0.0.31:30000" in script
    assert '--replicas-file "${STATE}/resume-replicas"' in script
    # Both render server slots: the layer calls the one that answers, so a new image's server takes over with no gap.
    assert "--render http://127.0.0.1:20081 --render http://127.0.0.1:20082" in script
    # The render server starts on its slot's port (the step picks the slot: `--port "${RENDER_PORT}"`).
    assert "SLOT_PORTS[0]=20081" in script and "SLOT_PORTS[1]=20082" in script


def test_the_render_server_has_the_replicas_chat_flags():
    settings = make_settings("b300x1-vllm", replicas="2", maxModelLen="262144")
    argv = shell_words(resume.render_server_argv(resume_inputs(settings)))
    for flag in ("--revision", "--served-model-name", "--trust-remote-code", "--enable-auto-tool-choice",
                 "--tool-call-parser kimi_k3", "--reasoning-parser kimi_k3", "--max-model-len 262144",
                 "--host 127.0.0.1", '--port "${RENDER_PORT}"'):
        assert flag in argv
    docker = shell_words(resume.render_docker_argv(resume_inputs(settings), "/etc/render.env", "/var/lib/render-hf"))
    assert "VLLM_TARGET_DEVICE=cpu" in docker and "--env-file /etc/render.env" in docker
    assert "HF_TOKEN" not in docker


def test_the_front_hands_chat_completions_with_the_key_to_the_resuming_layer(tmp_path: Path):
    on = front_config.caddyfile(endpoint_inputs(make_settings("b300x1-vllm", replicas="2")), HEADS)
    off = front_config.caddyfile(endpoint_inputs(make_settings("b300x1-vllm", replicas="2", resumeStreams="false")),
                                 HEADS)
    assert "reverse_proxy 127.0.0.1:20080" in on and "20080" not in off
    block = re.search(r"@resumable \{(.*?)\n\t\}", on, re.S)
    assert block and "path /v1/chat/completions /v1/messages" in block.group(1) and "{file../api-key}" in block.group(1)
    caddy = ROOT / ".venv/bin/caddy"
    if not caddy.exists():
        pytest.skip("no caddy binary in .venv (requirements.txt installs it)")
    (tmp_path / "Caddyfile").write_text(on)
    adapted = subprocess.run([str(caddy), "adapt", "--config", "Caddyfile", "--adapter", "caddyfile"],
                             cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert adapted.returncode == 0, adapted.stderr
    # The resumable route comes before the replicas' catch-all for keyed requests (the routes are tried in order).
    routes = json.loads(adapted.stdout)["apps"]["http"]["servers"]["srv0"]["routes"]
    def upstreams(node) -> set[str]:  # every dial under a route, however deep its subroutes nest
        if isinstance(node, dict):
            found = {u["dial"] for u in node.get("upstreams", [])}
            return found.union(*(upstreams(v) for k, v in node.items() if k != "upstreams"))
        return set().union(*(upstreams(v) for v in node)) if isinstance(node, list) else set()

    dials = [upstreams(r["handle"]) for r in routes]
    resumable = dials.index({"127.0.0.1:20080"})
    keyed = next(i for i, r in enumerate(routes) if "path" not in r.get("match", [{}])[0]
                 and "vars" in r.get("match", [{}])[0])
    assert resumable < keyed and dials[keyed] == {"10.0.0.21:30000", "10.0.0.31:30000"}


def test_the_replicas_chat_layer_flags_reach_the_render_server_and_the_rest_stay_on_the_replicas():
    from kimi_cluster.blueprint import admission
    from kimi_cluster.plan import chat_layer

    args = ["--enforce-eager", "--chat-template", "{{ x }}", "--max_logprobs=3", "--gpu-memory-utilization", "0.9",
            "--tokenizer-m", "slow", "--no-trust-request-chat-template", "--default-chat-template-kwargs",
            '{"thinking": false}', "--no-enable-prompt-tokens-details"]
    settings = make_settings("b300x1-vllm", replicas="2", extraEngineArgs=json.dumps(args))
    assert chat_layer.render_args(settings.extra_engine_args) == [
        "--chat-template", "{{ x }}", "--max_logprobs=3", "--tokenizer-m", "slow", "--no-trust-request-chat-template",
        "--default-chat-template-kwargs", '{"thinking": false}']
    argv = shell_words(resume.render_server_argv(resume_inputs(settings)))
    assert argv.endswith("""--chat-template '{{ x }}' --max_logprobs=3 --tokenizer-m slow """
                         """--no-trust-request-chat-template --default-chat-template-kwargs '{"thinking": false}'""")
    # A --no- spelling keeps vLLM's default, the render server's too: nothing to refuse.
    assert admission.problems(settings) == []
    for flag in chat_layer.UNRENDERABLE:
        refused = make_settings("b300x1-vllm", replicas="2", extraEngineArgs=json.dumps([flag, "x"]))
        [problem] = admission.problems(refused)
        assert problem.startswith(f"kimi-cluster:extraEngineArgs sets {flag} ('{flag} x'), which the front's render "
                                  "server cannot follow while streams resume"), problem
        # Where streams do not resume, the replicas' own `vllm serve` answers every request: they take it.
        kept = make_settings("b300x1-vllm", replicas="2", resumeStreams="false", extraEngineArgs=json.dumps([flag]))
        assert admission.problems(kept) == []


def test_an_allow_list_of_media_hosts_turns_redirects_off_on_the_replicas_and_the_render_server():
    from kimi_cluster.plan import launch

    def envs(**config: str) -> tuple[bool, bool]:
        settings = make_settings("b300x1-vllm", replicas="2", **config)
        render = shell_words(resume.render_docker_argv(resume_inputs(settings), "/etc/render.env",
                                                       "/var/lib/render-hf"))
        replica = shell_words(launch.docker_run_argv(engine_inputs(settings), 0, private_ip="10.0.0.21",
                                                     head_private_ip="10.0.0.21",
                                                     hf_dir="/hf", cache_dir="/cache"))
        return "VLLM_MEDIA_URL_ALLOW_REDIRECTS=0" in render, "VLLM_MEDIA_URL_ALLOW_REDIRECTS=0" in replica

    assert envs() == (False, False)  # vLLM's defaults: nothing to hold a redirect against
    listed = json.dumps(["--allowed_media_domains=upload.wikimedia.org"])
    assert envs(extraEngineArgs=listed) == (True, True)
    render = shell_words(resume.render_server_argv(resume_inputs(make_settings("b300x1-vllm", replicas="2",
                                                                               extraEngineArgs=listed))))
    assert render.endswith("--allowed_media_domains=upload.wikimedia.org")
