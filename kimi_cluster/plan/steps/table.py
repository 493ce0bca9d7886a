"""THE table of node steps: every step a stack runs on a VM, declared once (kimi_cluster/plan/steps/model.py `Step`).

Each entry names the step and says what it does, the frozen inputs the blueprint fills for it and the value builder
that feeds them to its template (templates/<name>.sh.j2), its deadline rule over Timing's numbers, where it runs and
when it is on (over the stack's StackShape), what it waits on, the secrets it reads on stdin (by key;
kimi_cluster/deploy/chain.py STDIN says where each comes from), what of its VM's spot it reads, and how its resource
is named and parented. The order is the order of a VM's scripts. The blueprint compiles and resolves it
(kimi_cluster/blueprint/inputs.py, resolve.py), the program builds it (kimi_cluster/deploy/chain.py), `kimi-cluster
plan` and status print it; kimi_cluster/blueprint/admission.py checks stepDeadlineMinutes against its names.
"""

from __future__ import annotations

from kimi_cluster.plan import caretaker, endpoint, engine_steps, kernel_cache, resume, vm_prep, weights_download
from kimi_cluster.plan.proxy import EndpointInputs
from kimi_cluster.plan.steps.model import (
    ENDPOINT,
    FRONT,
    HEAD,
    KERNEL_CACHE_SAVE_TYPE,
    NODE,
    READINESS_TYPE,
    Floor,
    StackShape,
    Step,
    Wrap,
    always,
)
from kimi_cluster.settings.timing import PIP_BUDGET_S
from kimi_cluster.settings.work_model import engine_start_s, image_pull_s, render_server_s

CACHE_STEP_NAMES = ("cache-restore", "cache-save")  # their deadline must leave room for pip (admission.py)
# What a GPU node's own chain reads of its spot: its addresses, its peers, the endpoint's certificate if it holds
# it; on the front, the replica heads it balances over. `group_vm_ids`: the VMs of its engine group.
CHAIN = ("private_ip", "head_private_ip", "public_ip", "tls", "peer_ips", "front_upstreams", "group_vm_ids")


def _serving_floor(shape: StackShape) -> float:
    """The engine's own start (load, warm-up, first answers): kept or pre-compiled kernels warm up from caches."""
    return engine_start_s(shape.kernel_cache or shape.kernel_warmup)


PULL_FLOOR = Floor(lambda _s: image_pull_s(), "pulling the ~16 GB engine image at 55 MB/s")
RESUME_FLOOR = Floor(lambda _s: render_server_s(),
                     "pulling the ~16 GB engine image at 55 MB/s, then starting the engine's chat layer")
SERVING_FLOOR = Floor(_serving_floor, "loading the checkpoint to the GPUs, warming the kernels up, first answers")


TABLE: tuple[Step, ...] = (
    Step("ready", "wait for SSH and cloud-init, count the GPUs, find the private interface", vm_prep.ReadyInputs,
         vm_prep.ready_values, lambda t: t.cloud_init_timeout_s + t.gpu_timeout_s + t.deadline_slack_s, NODE, CHAIN,
         after=("@rules",), timing_keys="cloudInitTimeoutS, gpuTimeoutS"),
    Step("storage", "put the Hugging Face cache and docker's data-root on the storage disk; refuse if it is too "
                    "small", vm_prep.StorageInputs, vm_prep.storage_values,
         lambda t: t.storage_timeout_s + t.docker_timeout_s, NODE, CHAIN, after=("ready",),
         timing_keys="storageTimeoutS, dockerTimeoutS"),
    Step("image", "pull the pinned engine image, with bounded retries", vm_prep.ImageInputs, vm_prep.image_values,
         lambda t: t.pull_attempts * (t.pull_timeout_s + t.pull_backoff_s * t.pull_attempts) + t.deadline_slack_s,
         NODE, CHAIN, after=("storage",), timing_keys="pullAttempts x (pullTimeoutS + pullBackoffS x pullAttempts)",
         floor=PULL_FLOOR),
    # The pull and the download both need the storage disk, not each other: they run side by side. The download
    # reads the hub token, then (when the nodes share it) the peer token; it also installs huggingface_hub.
    Step("weights", "download the pinned checkpoint (this node's share from the hub, the rest from its peers), "
                    "hashed as it streams, in a systemd unit that survives a dropped SSH session, and follow it",
         weights_download.WeightsInputs, weights_download.weights_values,
         weights_download.weights_deadline_s, NODE, CHAIN,
         # After the storage step of every node it shares the download with (a twin replica's too): a node
         # re-created after a loss is about to ask its peers when they run this step again to serve it, so they
         # wait --peer-timeout for its first answer, not for its boot.
         after=("storage", "storage@every-peer"), stdin=("hf_token", "peer_token"),
         timing_keys="peerTimeoutS, deadlineSlackS"),
    # Beside the pull and the download; it never fails (its transfer deadline, kernelCache.*TimeoutMinutes, ends it
    # first with a warning, so this one must outlast it), so the launch only ever waits for it.
    Step("cache-restore", "fetch the compiled-kernel cache saved for this key, or say why the engine starts cold",
         kernel_cache.KernelCacheInputs, kernel_cache.kernel_cache_values,
         lambda t: t.cache_restore_minutes * 60 + PIP_BUDGET_S + t.deadline_slack_s,
         NODE, CHAIN, when=lambda s, _p: s.kernel_cache, after=("storage",),
         stdin=("kernel_cache_credentials",)),
    # Once the image is in, after any restore (whose kernels it then finds); it gives up at its own deadline with a
    # warning (the launch starts cold), so this one must outlast it.
    Step("warmup", "compile the engine's kernels from the model's shapes on random weights while the weights "
                   "download; on any failure the launch starts cold (only ever warns)",
         engine_steps.WarmupInputs, engine_steps.warmup_values,
         lambda t: t.warmup_timeout_s + t.docker_timeout_s + t.deadline_slack_s, NODE, CHAIN,
         when=lambda s, _p: s.kernel_warmup, after=("image", "cache-restore")),
    Step("check", "compare the local snapshot and its recorded hashes with the hub's manifest for the pinned "
                  "revision", weights_download.CheckInputs, weights_download.check_values,
         lambda t: t.check_timeout_s, NODE, CHAIN,
         after=("weights",), stdin=("hf_token",), timing_keys="checkTimeoutS"),
    # The engine gets no key. Rank 0 starts first (after the previous replica serves: a rolling restart); the others
    # join its rendezvous.
    Step("launch", "start the engine container for this rank", engine_steps.LaunchInputs,
         engine_steps.launch_values, lambda t: t.launch_timeout_s + round(t.settle_seconds), NODE, CHAIN,
         after=("check", "image", "cache-restore", "warmup", "launch@head", "engine-ready@previous-replica"),
         timing_keys="launchTimeoutS, settleSeconds"),
    Step("front-ready", "wait for cloud-init and Docker on the front", vm_prep.NoInputs,
         vm_prep.front_ready_values, lambda t: t.cloud_init_timeout_s + t.docker_timeout_s + t.deadline_slack_s,
         FRONT, CHAIN,
         after=("@rules",), timing_keys="cloudInitTimeoutS, dockerTimeoutS"),
    # The front's resuming layer (resumeStreams, vLLM or SGLang): the engine's own chat layer (vLLM's render server,
    # SGLang's chat route) reads the model's tokenizer with the hub token. Before the proxy, which hands it the chat
    # requests.
    Step("resume", "start the engine's own chat layer (vLLM's render server or SGLang's chat route) and the "
                   "resuming layer that carries a stream on to another replica when its own is lost",
         resume.ResumeInputs, resume.resume_values,
         lambda t: t.pull_attempts * (t.pull_timeout_s + t.pull_backoff_s * t.pull_attempts)
         + 2 * t.proxy_timeout_s + t.deadline_slack_s, FRONT, CHAIN, when=lambda s, _p: s.resumes_streams,
         after=("front-ready",), stdin=("hf_token",),
         timing_keys="pullAttempts x (pullTimeoutS + pullBackoffS x pullAttempts), proxyTimeoutS",
         floor=RESUME_FLOOR),
    # On the endpoint's VM. It needs only its image (on the head) and runs, answering 502 for anything but 401s,
    # while the weights arrive; the front's may start at once.
    Step("proxy", "start the authenticating TLS proxy in front of the engine, or hand it a new API key",
         EndpointInputs, endpoint.proxy_values, lambda t: t.proxy_timeout_s + round(t.proxy_settle_seconds),
         ENDPOINT, CHAIN,
         after=("image", "front-ready", "resume"), stdin=("api_key", "tls_private_key"),
         timing_keys="proxyTimeoutS, proxySettleSeconds"),
    # The head answers only once every rank has joined the rendezvous: it waits on every launch and the proxy (the
    # front: its proxy and every replica's engine-ready). Its text carries every launch's fingerprint.
    Step("readiness", "wait until the head serves the model on /v1/models through the proxy over TLS with the key, "
                      "or print the engine log and fail",
         endpoint.ReadinessInputs, endpoint.readiness_values, lambda t: t.readiness_s + t.deadline_slack_s,
         ENDPOINT, ("public_ip", "tls", "front_upstreams", "group_vm_ids"),
         after=("launch@every-node", "proxy", "engine-ready@every-replica"), stdin=("api_key",),
         parent={"node": "cluster", "front": "vm"}, wrap=Wrap(READINESS_TYPE, "{group}-ready", "{group}-ready-wait"),
         names_vm=False, timing_keys="deadlineSlackS",
         # Behind a front it waits for engines that already serve (engine-ready@every-replica): no floor of its own.
         floor=Floor(lambda s: 0.0 if s.has_front else _serving_floor(s), SERVING_FLOOR.work)),
    # replicas >= 2 (kimi_cluster/deploy/front.py): each replica's head answers the front, the front holds the
    # endpoint; the next replica's launch waits for this one.
    Step("engine-ready", "wait until this replica's engine serves the model on its private address, where the "
                         "front asks it, or print the engine log and fail",
         endpoint.ReadinessInputs, endpoint.engine_ready_values, lambda t: t.readiness_s + t.deadline_slack_s,
         HEAD, ("private_ip", "group_vm_ids"),
         when=lambda s, _p: s.has_front, after=("launch@every-node",), resource="{group}-engine-ready",
         parent={"node": "cluster"}, floor=SERVING_FLOOR),
    # Every replica compiles the same kernels for the same key: replica 0's head saves them once it serves. Nothing
    # depends on it; it never fails. Its text carries the launch identity, so it runs again after a relaunch.
    Step("cache-save", "pack the engine's compiled kernels and store them for the next bring-up (only ever warns)",
         kernel_cache.KernelCacheInputs, kernel_cache.kernel_cache_values,
         lambda t: t.cache_save_minutes * 60 + PIP_BUDGET_S + t.deadline_slack_s,
         HEAD, (), when=lambda s, p: s.kernel_cache and p.replica == 0,
         after=("engine-ready", "readiness"), stdin=("kernel_cache_credentials",), parent={"node": "cluster"},
         wrap=Wrap(KERNEL_CACHE_SAVE_TYPE, "{group}-kernel-cache", "{group}-kernel-cache-save"), names_vm=False,
         suffix=kernel_cache.save_suffix),
    # idleStopMinutes / budgetUsd (kimi_cluster/plan/caretaker.py): once the endpoint is ready; named after every
    # GPU VM, it arms again after an up that re-created one.
    Step("caretaker", "start the caretaker that deletes the GPU VMs when the endpoint idles or the budget is spent",
         caretaker.CaretakerInputs, caretaker.caretaker_values, lambda t: t.proxy_timeout_s, ENDPOINT,
         ("gpu_vm_ids",), when=lambda s, _p: s.guarded,
         after=("proxy", "readiness"),
         stdin=("caretaker_api_key",), resource="{stack}-caretaker", parent={"node": "cluster", "front": "cluster"}),
)

BY_NAME = {step.name: step for step in TABLE}
NAMES = tuple(BY_NAME)
SUMMARIES = {step.name: step.summary for step in TABLE}
# The steps of every GPU node's chain: with kernelCache and kernelWarmup (CHAIN_STEPS), and in every stack (STEPS).
CHAIN_STEPS = tuple(step.name for step in TABLE if step.where == NODE)
STEPS = tuple(step.name for step in TABLE if step.where == NODE and step.when is always)
