"""The node steps: every name a bring-up step goes by, in chain order, and what each one does.

One home for the names (settings check stepDeadlineMinutes against them, the node chain runs them, the timing gives
each a deadline, the offline plan and status print them): the list is written out here once. Import-free on purpose,
so any module can read it without joining an import circle.
"""

from __future__ import annotations

STEPS = ("ready", "storage", "image", "weights", "check", "launch")
HEAD_STEPS = ("proxy",)  # the head's own chain steps, besides every node's STEPS
CACHE_STEPS = ("cache-restore", "cache-save")  # only with kimi-cluster:kernelCache
WARMUP_STEP = "warmup"  # only with kimi-cluster:kernelWarmup, on every node after the image (and any restore)
ALL_STEPS = (*STEPS, *HEAD_STEPS, "readiness", *CACHE_STEPS, WARMUP_STEP,  # every step that runs on a node;
             "engine-ready", "front-ready",  # each has a deadline (Timing.deadline_s); these two: replicas >= 2
             "caretaker")  # only with kimi-cluster:idleStopMinutes or budgetUsd, where the endpoint is

SUMMARIES = {
    "ready": "wait for SSH and cloud-init, count the GPUs, find the private interface",
    "storage": "put the Hugging Face cache and docker's data-root on the storage disk; refuse if it is too small",
    "image": "pull the pinned engine image, with bounded retries",
    "weights": "download the pinned checkpoint (this node's share from the hub, the rest from its peers), hashed as "
               "it streams, in a systemd unit that survives a dropped SSH session, and follow it",
    "check": "compare the local snapshot and its recorded hashes with the hub's manifest for the pinned revision",
    "launch": "start the engine container for this rank",
    "proxy": "start the authenticating TLS proxy in front of the engine, or hand it a new API key",
    "readiness": "wait until the head serves the model on /v1/models through the proxy over TLS with the key, or "
                 "print the engine log and fail",
    "cache-restore": "fetch the compiled-kernel cache saved for this key, or say why the engine starts cold",
    "cache-save": "pack the engine's compiled kernels and store them for the next bring-up (only ever warns)",
    "warmup": "compile the engine's kernels from the model's shapes on random weights while the weights download; "
              "on any failure the launch starts cold (only ever warns)",
    # replicas >= 2 (kimi_cluster/deploy/front.py): each replica's head answers the front, the front holds the endpoint.
    "engine-ready": "wait until this replica's engine serves the model on its private address, where the front "
                    "asks it, or print the engine log and fail",
    "front-ready": "wait for cloud-init and Docker on the front",
    # idleStopMinutes / budgetUsd (kimi_cluster/plan/caretaker.py): on the VM that holds the endpoint.
    "caretaker": "start the caretaker that deletes the GPU VMs when the endpoint idles or the budget is spent",
}
