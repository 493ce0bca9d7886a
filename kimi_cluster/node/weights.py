"""Which node fetches which checkpoint file from the hub, and where the node reports its download progress.

Pure and standard-library only: the same module runs on the controller (plan, tests, benchmark) and on every node,
which ships it next to `scripts/fetch_weights.py`. Every node computes the same split from the same hub manifest, so
no coordinator is needed: each downloads only its share from the hub and fetches the rest from the peer that owns it.

A node whose peer died or stalled calls `owners` again with that peer in `dead`: the dead peer's files are spread
over the survivors, while every file a survivor already owns stays where it is, so the survivors agree on the new
owners without talking to each other.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence

# The progress file the weights program keeps up to date on every node, relative to the storage path (STORAGE in the
# node scripts, `storagePath` under `nodeRoot`), e.g. /ephemeral/kimi/progress/weights.json. One JSON object:
#   {"bytes_done": int, "bytes_total": int, "files_done": int, "files_total": int,
#    "updated_at": unix seconds (float), "hub_bytes": int, "peer_bytes": int, "revision": str,
#    "metadata_done": bool, "hub_reopens": int, "hash_reread_bytes": int}
# bytes_done counts verified files plus the bytes of files in flight; hub_bytes and peer_bytes count what this run
# received from the hub and from peers; metadata_done says every file but the shards (is_shard) of `revision` is
# verified, which the kernel warm-up waits for; hub_reopens counts hub streams re-opened below their floor and
# hash_reread_bytes the bytes of split-off ranges the in-order hash read back from the page cache
# (kimi_cluster/node/weights_ranges.py). Replaced atomically (write, then rename), so a reader never sees half
# of it.
PROGRESS_FILE = "kimi/progress/weights.json"
# What the weights program recorded about every file it verified (size, sha256, mtime), per revision: the check step
# compares these with the hub's manifest instead of reading 1.56 TB a second time.
VERIFIED_DIR = "kimi/verified"

# Peers serve finished files on their private address only, on this port. The peer firewall rules already let every
# node's private /32 reach every port of the others, and no rule opens it to the operator or the internet.
PEER_PORT = 20100  # the default of kimi-cluster:peerPort

# The floor of each hub stream (kimi_cluster/node/weights_ranges.py), the defaults of kimi-cluster:hubStreamFloor:
# a stream below HUB_FLOOR_SHARE of its fastest sibling's rate, or below HUB_MIN_RATE, for a window is re-opened on
# a new connection. The hub's CDN edges gave ~68 MB/s per connection, or 8.7 MB/s on the 65-75% that were capped
# (huggingface/xet-core#821): 0.3 of the fastest sibling (20 MB/s) sits well between the two (a capped edge gives
# 0.13 of a fast one) and clear of how much streams sharing one link differ, and 10 MB/s is just above the cap when
# a stream has no sibling to compare with. The window is measured, not set: 4% of the time the stream's range has
# left at its siblings' rate (weights_ranges.WINDOW_SHARE; 9.6 s for a whole 16.3 GB shard at 68 MB/s), never under
# HUB_WINDOW_S: a new connection's slow start and a busy node's scheduling settle well within 3 s, and a split-off
# tail of 1 GB is judged after 3 s instead of the 10 a whole shard waits.
HUB_MIN_RATE = 10e6
HUB_FLOOR_SHARE = 0.3
HUB_WINDOW_S = 3.0
# Parallel hub downloads a node runs (as many again from its peers): kimi-cluster:downloadWorkers' default.
DOWNLOAD_WORKERS = 16


def is_shard(name: str) -> bool:
    """A weight shard, the bulk of the checkpoint. Every other file (config.json, the tokenizer, the model's code) is
    metadata: a few MB that the kernel warm-up needs (kimi_cluster/plan/warmup.py), so the weights program fetches it
    first."""
    return name.endswith(".safetensors")


def progress_path(storage_dir: str) -> str:
    """The progress file under a node's storage directory (the rendered `${STORAGE}`)."""
    return os.path.join(storage_dir, PROGRESS_FILE)


def verified_path(storage_dir: str, revision: str) -> str:
    """The record of verified files for one revision under a node's storage directory."""
    return os.path.join(storage_dir, VERIFIED_DIR, f"{revision}.json")


def _lpt(files: Iterable[tuple[str, int]], loads: dict[int, int]) -> dict[str, int]:
    """Longest processing time first: the biggest file goes to the least-loaded rank (ties: the lowest rank).

    Sorting by (size, name) and breaking ties by rank makes the result depend only on the manifest, never on the
    order the hub listed it in. For equal-sized shards this is round robin; the largest share exceeds the mean by
    at most one file.
    """
    out: dict[str, int] = {}
    for name, size in sorted(files, key=lambda f: (-f[1], f[0])):
        rank = min(loads, key=lambda r: (loads[r], r))
        out[name] = rank
        loads[rank] += size
    return out


def assign(files: Iterable[tuple[str, int]], nodes: int) -> dict[str, int]:
    """file name -> the rank that downloads it from the hub, balanced by size over `nodes` ranks."""
    if nodes < 1:
        raise ValueError(f"nodes must be at least 1, got {nodes}")
    return _lpt(files, {r: 0 for r in range(nodes)})


def owners(files: Sequence[tuple[str, int]], nodes: int, dead: Iterable[int] = ()) -> dict[str, int]:
    """file name -> its owner once the ranks in `dead` are given up on.

    A live rank keeps every file `assign` gave it; the dead ranks' files are spread over the live ones, starting
    from the loads they already carry. With every rank dead nothing is reassigned (the caller has nobody to ask).
    """
    base = assign(files, nodes)
    gone = {r for r in dead if 0 <= r < nodes}
    alive = [r for r in range(nodes) if r not in gone]
    if not gone or not alive:
        return base
    sizes = dict(files)
    loads = {r: 0 for r in alive}
    orphans = []
    for name, rank in base.items():
        if rank in gone:
            orphans.append((name, sizes[name]))
        else:
            loads[rank] += sizes[name]
    return {**base, **_lpt(orphans, loads)}


def shares(assignment: Mapping[str, int], sizes: Mapping[str, int], nodes: int) -> list[int]:
    """Bytes per rank under an assignment."""
    out = [0] * nodes
    for name, rank in assignment.items():
        out[rank] += sizes[name]
    return out


def imbalance(assignment: Mapping[str, int], sizes: Mapping[str, int], nodes: int) -> float:
    """Largest share over the mean share: 1.0 is a perfect split, and the sharded download takes this much longer
    than a perfect one when the hub is the bottleneck."""
    per_rank = shares(assignment, sizes, nodes)
    mean = sum(per_rank) / nodes
    return max(per_rank) / mean if mean else 1.0
