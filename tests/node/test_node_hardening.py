"""What a compromised engine can reach: no engine container runs --privileged, and the weights are mounted
read-only into every engine (the proxy's side of the hardening is in test_steps_on_fake_node.py)."""

from __future__ import annotations

from kimi_cluster.blueprint.inputs import engine_inputs


def test_no_engine_container_runs_privileged():
    """A compromised engine must not be root on the host: neither engine's `docker run` has --privileged."""
    from kimi_cluster.plan.jinja import shell_words
    from kimi_cluster.plan.launch import docker_run_argv
    from tests.node.conftest import make_settings

    for topology in ("h100x4-sglang", "b300x1-vllm"):
        settings = make_settings(topology)
        text = shell_words(docker_run_argv(engine_inputs(settings), 0, private_ip="10.0.0.5",
                                           head_private_ip="10.0.0.5",
                                           hf_dir="/ephemeral/hf", cache_dir="/ephemeral/cache"))
        assert "--privileged" not in text and "--cap-add" not in text and "--ipc=host" in text, topology


def test_every_engine_gets_the_weights_read_only_and_a_writable_place_for_remote_code():
    """Issue 34, security 1: an engine that could write the Hugging Face cache could swap a verified blob for a link
    to a host secret, which the peer server then sent to the next node. The cache is mounted read-only into every
    engine; transformers' --trust-remote-code modules go to the writable kernel-cache folder instead."""
    from kimi_cluster.plan.launch import container_cache, container_hf_home, docker_run_argv, flatten
    from tests.node.conftest import make_settings

    image = "lightseekorg/tokenspeed:0.1.1@sha256:" + "ab" * 32
    for topology, extra in (("h100x4-sglang", {}), ("b300x1-vllm", {}), ("b300x1-tokenspeed", {"image": image})):
        settings = make_settings(topology, **extra)
        argv = [str(w) for w in flatten(docker_run_argv(engine_inputs(settings), 0, private_ip="10.0.0.5",
                                                        head_private_ip="10.0.0.5", hf_dir="/ephemeral/hf",
                                                        cache_dir="/ephemeral/cache"))]
        mounts = [argv[i + 1] for i, w in enumerate(argv) if w == "-v"]
        assert f"/ephemeral/hf:{container_hf_home(engine_inputs(settings))}:ro" in mounts, (topology, mounts)
        assert f"/ephemeral/cache:{container_cache(engine_inputs(settings))}" in mounts, (topology, mounts)
        modules = [w for w in argv if w.startswith("HF_MODULES_CACHE=")]
        assert modules == [f"HF_MODULES_CACHE={container_cache(engine_inputs(settings))}/hf-modules"], (topology,
                                                                                                        modules)
