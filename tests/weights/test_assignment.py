"""The split of the checkpoint between nodes: balanced by size, the same on every node, stable when a peer dies."""

from __future__ import annotations

import hashlib
import random

import pytest

from kimi_cluster.node.weights import PROGRESS_FILE, assign, imbalance, owners, progress_path, shares
from kimi_cluster.settings import catalog


def kimi_manifest() -> list[tuple[str, int]]:
    """96 shards adding up to the repository's 1,561,293,160,568 bytes, plus the small files beside them.

    The per-shard sizes are modelled: sharding at a size limit leaves shards of uneven size (whole tensors only,
    larger and smaller layers) and a small last one, so each shard gets a deterministic 80-120 % of the mean.
    """
    spec = catalog.KIMI_K31_PRO
    n = spec.shard_count
    weights = [0.8 + 0.4 * int(hashlib.sha256(str(i).encode()).hexdigest()[:8], 16) / 0xFFFFFFFF for i in range(n)]
    weights[-1] = 0.3
    scale = spec.checkpoint_bytes / sum(weights)
    sizes = [int(w * scale) for w in weights]
    sizes[0] += spec.checkpoint_bytes - sum(sizes)
    files = [(f"model-{i + 1:05d}-of-{n:05d}.safetensors", s) for i, s in enumerate(sizes)]
    files += [("config.json", 3_412), ("model.safetensors.index.json", 9_200_114), ("tokenizer.json", 11_400_000),
              ("tiktoken.model", 2_561_000), ("chat_template.jinja", 4_200)]
    return files


def test_the_modelled_manifest_is_the_real_checkpoint_size():
    shards = [s for name, s in kimi_manifest() if name.endswith(".safetensors")]
    assert len(shards) == 96 and sum(shards) == catalog.KIMI_K31_PRO.checkpoint_bytes


@pytest.mark.parametrize("nodes", [2, 3, 4, 6, 8])
def test_the_split_is_balanced_by_size(nodes):
    files = kimi_manifest()
    split = assign(files, nodes)
    assert set(split) == {name for name, _ in files} and set(split.values()) == set(range(nodes))
    ratio = imbalance(split, dict(files), nodes)
    assert ratio <= 1.1, f"largest share is {ratio:.3f} x the mean"
    if nodes == 4:
        assert ratio < 1.01  # 24 shards each, sizes evened out


def test_the_split_depends_only_on_the_manifest_not_its_order():
    files = kimi_manifest()
    shuffled = files[:]
    random.Random(7).shuffle(shuffled)
    assert assign(files, 4) == assign(shuffled, 4) == assign(list(reversed(files)), 4)


def test_one_node_owns_everything():
    assert set(assign(kimi_manifest(), 1).values()) == {0}


def test_a_dead_peers_files_move_to_the_survivors_and_nothing_else_moves():
    files = kimi_manifest()
    before = assign(files, 4)
    after = owners(files, 4, dead={2})
    assert 2 not in after.values()
    moved = {f for f in before if before[f] != after[f]}
    assert moved == {f for f, r in before.items() if r == 2}
    # the survivors share the orphans evenly too
    per_rank = shares(after, dict(files), 4)
    live = [per_rank[r] for r in (0, 1, 3)]
    assert max(live) / (sum(live) / 3) <= 1.1
    assert owners(files, 4, dead=set()) == before
    assert owners(files, 4, dead={0, 1, 2, 3}) == before  # nobody left to hand them to


def test_the_progress_file_lives_under_the_storage_path():
    assert progress_path("/ephemeral") == "/ephemeral/kimi/progress/weights.json"
    assert PROGRESS_FILE == "kimi/progress/weights.json"
