"""The fake hub's repository: its files (config, index and safetensors shards), tiny or of any size, with the
hashes the hub reports for each (kimi_cluster/fakes/hub.py serves them)."""

from __future__ import annotations

import hashlib
import json
import random
import struct
from dataclasses import dataclass
from functools import cached_property

from kimi_cluster.fakes import tiny_model

LFS_POINTER_SIZE = 134  # the size of a git-lfs pointer file, which the hub reports alongside the real size


@dataclass(frozen=True)
class HubFile:
    """One file of the repository. LFS files are what the hub serves through its CDN with a sha256 ETag."""

    path: str
    data: bytes
    lfs: bool

    # Hashed once per file: the CDN route finds a blob by its sha256 on every request, and a range fetcher asks for
    # a file a block at a time (hashing every shard per request cost the 4-node benchmark most of its hub's CPU).
    @cached_property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @cached_property
    def git_sha1(self) -> str:
        return hashlib.sha1(b"blob %d\0" % len(self.data) + self.data).hexdigest()

    @property
    def etag(self) -> str:
        return self.sha256 if self.lfs else self.git_sha1


def safetensors_bytes(tensors: dict[str, list[float]]) -> bytes:
    """A real safetensors file: little-endian u64 header length, JSON header, then the raw F32 data."""
    header: dict = {"__metadata__": {"format": "pt"}}
    data = b""
    for name, values in tensors.items():
        raw = struct.pack(f"<{len(values)}f", *values)
        header[name] = {"dtype": "F32", "shape": [len(values)], "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the format pads the header to 8 bytes
    return struct.pack("<Q", len(text)) + text + data


def chat_model_files() -> list[HubFile]:
    """The tiny chat model's config, tokenizer and chat template (tiny_model.py), which vLLM's render server on a
    front reads from the hub as it would the real checkpoint's (the config replaces the repository's own)."""
    return [HubFile(name, data, lfs=False) for name, data in tiny_model.files().items()]


def tiny_repo(shards: int = 3, floats_per_shard: int = 4096) -> list[HubFile]:
    """config.json, an index and `shards` small safetensors shards named the way large checkpoints name them."""
    config = {"model_type": "kimi_k3", "architectures": ["KimiK3ForConditionalGeneration"]}
    files = [HubFile("config.json", json.dumps(config, indent=2).encode(), lfs=False)]
    weight_map = {}
    for i in range(1, shards + 1):
        name = f"model-{i:05d}-of-{shards:05d}.safetensors"
        tensor = f"layers.{i}.weight"
        values = [float(i + k % 97) for k in range(floats_per_shard)]
        files.append(HubFile(name, safetensors_bytes({tensor: values}), lfs=True))
        weight_map[tensor] = name
    index = json.dumps({"weight_map": weight_map}, indent=2).encode()
    files.append(HubFile("model.safetensors.index.json", index, lfs=False))
    return files


def synthetic_repo(shards: int, shard_bytes: int) -> list[HubFile]:
    """Like tiny_repo, with `shards` shards of about `shard_bytes` each (one U8 tensor of seeded random bytes, so
    nothing compresses and every shard hashes differently)."""
    config = {"model_type": "kimi_k3", "architectures": ["KimiK3ForConditionalGeneration"]}
    files = [HubFile("config.json", json.dumps(config, indent=2).encode(), lfs=False)]
    weight_map = {}
    for i in range(1, shards + 1):
        name = f"model-{i:05d}-of-{shards:05d}.safetensors"
        tensor = f"layers.{i}.weight"
        raw = random.Random(i).randbytes(shard_bytes)
        header = {"__metadata__": {"format": "pt"},
                  tensor: {"dtype": "U8", "shape": [len(raw)], "data_offsets": [0, len(raw)]}}
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)
        files.append(HubFile(name, struct.pack("<Q", len(text)) + text + raw, lfs=True))
        weight_map[tensor] = name
    files.append(HubFile("model.safetensors.index.json", json.dumps({"weight_map": weight_map}).encode(), lfs=False))
    return files
