#!/usr/bin/env python3
"""Checks, on a node, that the local Hugging Face snapshot of one pinned revision is complete and intact.

Compares every file with the hub's manifest for that revision (present, same size, no partial downloads left) and,
with --sha256, checks every file's hash against the manifest: from the record the download kept of the hashes it
computed while writing (scripts/fetch_weights.py), when the file is unchanged since (same size and mtime), and by
reading the file otherwise. Needs only huggingface_hub (and kimi_cluster/node/hub_names.py, shipped beside it).
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from huggingface_hub import HfApi

from kimi_cluster.node.hub_names import UnsafeName, checked_etag, checked_name

CHUNK = 8 * 1024 * 1024


@dataclass
class Expected:
    name: str
    size: int | None
    sha256: str | None  # LFS files
    git_sha1: str | None  # small files stored in git


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", required=True, help="e.g. moonshotai/Kimi-K3.1-Pro")
    ap.add_argument("--revision", required=True, help="the pinned 40-hex commit")
    ap.add_argument("--cache-dir", required=True, help="the hub cache, e.g. /ephemeral/hf/hub")
    ap.add_argument("--token-file", help="file holding the hub token (optional; anonymous if missing or empty)")
    ap.add_argument("--endpoint", help="hub endpoint; defaults to HF_ENDPOINT or huggingface.co")
    ap.add_argument("--sha256", action="store_true", help="also check every file's hash against the manifest")
    ap.add_argument("--verified-record", help="the download's record of the hashes it computed while writing")
    ap.add_argument("--workers", type=int, default=min(16, (os.cpu_count() or 4)), help="parallel hashing threads")
    ap.add_argument("--progress-seconds", type=float, default=30.0, help="how often to report hashing progress")
    return ap.parse_args(argv)


def read_token(path: str | None) -> str | None:
    if not path or not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as fh:
        return fh.read().strip() or None


def manifest(args: argparse.Namespace) -> list[Expected]:
    info = HfApi(endpoint=args.endpoint).model_info(
        args.repo, revision=args.revision, files_metadata=True, token=read_token(args.token_file)
    )
    if info.sha and info.sha != args.revision:
        raise SystemExit(f"the hub resolved {args.revision} to {info.sha}; pin the full commit hash")
    out = []
    for s in info.siblings or []:
        # Each name is joined to the snapshot folder and read as root: one that leaves it is refused.
        name = checked_name(s.rfilename)
        etag = checked_etag(name, s.lfs.sha256 if s.lfs else s.blob_id)
        out.append(Expected(name, s.size, etag if s.lfs else None, None if s.lfs else etag))
    return out


def load_record(path: str | None, revision: str) -> dict:
    """name -> what the download recorded when it verified that file; empty if there is no usable record."""
    if not path or not os.path.exists(path):
        return {}
    try:
        with open(path, encoding="utf-8") as fh:
            record = json.load(fh)
    except (OSError, ValueError):
        return {}
    return record.get("files", {}) if record.get("revision") == revision else {}


def recorded_ok(exp: Expected, path: str, record: dict) -> bool:
    """True if the download hashed this very file to the manifest's value and it has not changed since."""
    rec = record.get(exp.name)
    want = exp.sha256 or exp.git_sha1
    if not rec or not want or rec.get("etag") != want:
        return False
    st = os.stat(path)
    return st.st_size == rec.get("size") and st.st_mtime_ns == rec.get("mtime_ns")


def git_blob_sha1(path: str) -> str:
    """The id git gives a file's content: what the hub reports as blobId for files not stored in LFS."""
    h = hashlib.sha1(f"blob {os.path.getsize(path)}\0".encode())
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest()


class Hasher:
    """Hashes files on a thread pool (hashlib releases the GIL) and reports the bytes done at a steady pace."""

    def __init__(self, workers: int, every: float) -> None:
        self.workers, self.every = max(1, workers), every
        self.done = 0
        self.lock = threading.Lock()

    def sha256(self, path: str) -> str:
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(CHUNK), b""):
                h.update(block)
                with self.lock:
                    self.done += len(block)
        return h.hexdigest()

    def run(self, jobs: list[tuple[Expected, str]]) -> list[str]:
        total = sum(os.path.getsize(p) for e, p in jobs if e.sha256)
        stop = threading.Event()

        def report() -> None:
            start = time.monotonic()
            while not stop.wait(self.every):
                rate = self.done / max(time.monotonic() - start, 1e-9) / 1e9
                print(f"hashing: {self.done / 1e9:,.1f} of {total / 1e9:,.1f} GB ({rate:.2f} GB/s)", flush=True)

        reporter = threading.Thread(target=report, daemon=True)
        reporter.start()
        try:
            with ThreadPoolExecutor(self.workers) as pool:
                return [p for p in pool.map(lambda job: self._verify(*job), jobs) if p]
        finally:
            stop.set()

    def _verify(self, exp: Expected, path: str) -> str | None:
        if exp.sha256:
            got = self.sha256(path)
            if got != exp.sha256:
                return f"CORRUPT    {exp.name}: sha256 {got[:16]}... but the hub records {exp.sha256[:16]}..."
        elif exp.git_sha1:
            got = git_blob_sha1(path)
            if got != exp.git_sha1:
                return f"CORRUPT    {exp.name}: git blob {got[:12]}... but the hub records {exp.git_sha1[:12]}..."
        return None


def check(args: argparse.Namespace) -> int:
    repo_dir = os.path.join(args.cache_dir, "models--" + args.repo.replace("/", "--"))
    snap = os.path.join(repo_dir, "snapshots", args.revision)
    try:
        expected = manifest(args)
    except SystemExit:
        raise
    except UnsafeName as exc:
        print(f"ERROR: {exc}; the hub (or whatever answered for it) is not to be trusted with this snapshot")
        return 2
    except Exception as exc:  # noqa: BLE001 - any hub failure means the check cannot vouch for the snapshot
        print(f"ERROR: cannot read the hub's manifest for {args.repo}@{args.revision}: {type(exc).__name__}: {exc}")
        return 2

    problems: list[str] = []
    present: list[tuple[Expected, str]] = []
    total = 0
    if not os.path.isdir(snap):
        problems.append(f"MISSING    the snapshot directory {snap}")
    else:
        for exp in expected:
            path = os.path.join(snap, exp.name)
            if not os.path.exists(path):  # also catches a link whose blob is gone
                problems.append(f"MISSING    {exp.name}")
                continue
            size = os.path.getsize(os.path.realpath(path))
            total += size
            if exp.size is not None and size < exp.size:
                problems.append(f"SHORT      {exp.name}: {size:,} of {exp.size:,} bytes")
            elif exp.size is not None and size != exp.size:
                problems.append(f"WRONG SIZE {exp.name}: {size:,} bytes but the hub records {exp.size:,}")
            else:
                present.append((exp, path))
    # Partial downloads left by an interrupted run: the engine would not read them, but they mean it was cut short.
    leftovers = sorted(glob.glob(os.path.join(repo_dir, "**", "*.incomplete"), recursive=True))
    problems += [f"PARTIAL    {os.path.relpath(p, repo_dir)} (an interrupted download)" for p in leftovers]

    recorded = 0
    if args.sha256 and present:
        record = load_record(args.verified_record, args.revision)
        to_read = [(e, p) for e, p in present if not recorded_ok(e, p, record)]
        recorded = len(present) - len(to_read)
        if to_read:
            problems += Hasher(args.workers, args.progress_seconds).run(to_read)

    shards = [e for e in expected if e.name.endswith(".safetensors")]
    shards_ok = sum(1 for e, _ in present if e.name.endswith(".safetensors"))
    print(f"repo             : {args.repo}")
    print(f"snapshot dir     : {snap}")
    print(f"files            : {len(present)}/{len(expected)} present with the right size")
    print(f"safetensors      : {shards_ok}/{len(shards)}")
    print(f"total bytes      : {total:,} ({total / 1e9:.2f} GB)")
    if args.sha256:
        how = f"checked ({recorded} from the hashes recorded while downloading, {len(present) - recorded} read now)"
    else:
        how = "not checked (pass --sha256)"
    print(f"sha256           : {how}")
    print(f".incomplete files: {len(leftovers)}")
    for line in problems:
        print(line)
    ok = not problems
    print("RESULT:", "COMPLETE" if ok else f"INCOMPLETE ({len(problems)} problem{'s' if len(problems) != 1 else ''})")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    return check(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
