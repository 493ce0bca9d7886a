"""The weights program's files (run with kimi_cluster/node/fetch_weights.py on every node): the hub's manifest of the
pinned revision, the Hugging Face cache with its record of verified files, and one file streamed from the hub or a
peer, hashed while it is written.

Every file is hashed as it streams (sha256 for LFS files, the git blob id for small ones) and compared with the
hub's manifest; verified files are recorded (size, hash, mtime), so a re-run keeps them without reading them again.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx2
from huggingface_hub import HfApi

from kimi_cluster.node.hub_names import UnsafeName, checked_etag, checked_name

CHUNK = 1024 * 1024
HUB_ATTEMPTS = 5  # per file, for dropped connections and 5xx/429; each retry resumes where the last one stopped


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S', time.gmtime())}] {msg}", flush=True)


class Fatal(Exception):
    """Stops the whole download: a file the hub refuses, or a file that failed its hash twice."""


class Corrupt(Exception):
    """A file whose bytes do not hash to the manifest's value."""


class PeerFault(Exception):
    """A peer that answered out of shape or too slowly: treated as dead, its files taken from the hub."""


class Unservable(Exception):
    """A verified file whose blob is no longer the file that was committed: never sent to a peer."""


@dataclass(frozen=True)
class Entry:
    name: str
    size: int
    sha256: str | None  # LFS files
    git_sha1: str | None  # small files kept in git

    @property
    def etag(self) -> str:
        """The blob name in the Hugging Face cache: the sha256 for LFS files, the git blob id for the others."""
        return self.sha256 or self.git_sha1 or ""

    def hasher(self) -> Any:
        if self.sha256:
            return hashlib.sha256()
        h = hashlib.sha1()
        h.update(b"blob %d\0" % self.size)  # git hashes a header, then the content
        return h



def read_secret(path: str | None) -> str | None:
    if not path or not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as fh:
        return fh.read().strip() or None


def write_json(path: str, obj: Any) -> None:
    """Write, then rename: a reader (the check step, the status command) never sees half a file."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(obj, fh)
    os.replace(tmp, path)


def hub_manifest(args: argparse.Namespace, token: str | None) -> list[Entry]:
    """Every file of the pinned revision with its size and recorded hash, from the hub's API (retried)."""
    api = HfApi(endpoint=args.endpoint)
    for attempt in range(1, HUB_ATTEMPTS + 1):
        try:
            info = api.model_info(args.repo, revision=args.revision, files_metadata=True, token=token)
            break
        except (httpx2.TransportError, httpx2.HTTPStatusError) as exc:
            status = getattr(getattr(exc, "response", None), "status_code", None)
            if attempt == HUB_ATTEMPTS or (status is not None and status < 500 and status != 429):
                raise
            time.sleep(min(2**attempt, 30))
    if info.sha and info.sha != args.revision:
        raise Fatal(f"the hub resolved {args.revision} to {info.sha}; pin the full commit hash")
    out = []
    for s in info.siblings or []:
        try:
            # Every name is joined to the snapshot folder and every hash to the blobs folder, as root.
            name = checked_name(s.rfilename)
            if isinstance(s.size, bool) or not isinstance(s.size, int) or s.size < 0:
                raise Fatal(f"the hub's manifest gives no size for {name}")
            etag = checked_etag(name, s.lfs.sha256 if s.lfs else s.blob_id)
        except UnsafeName as exc:
            raise Fatal(str(exc)) from None
        out.append(Entry(name, s.size, etag if s.lfs else None, None if s.lfs else etag))
    return out


# ---- the local cache -----------------------------------------------------------------------------------------------


class Cache:
    """The Hugging Face cache layout (blobs/<etag>, snapshots/<revision>/<name> -> ../../blobs/<etag>), so the
    engine and huggingface_hub read the files as if snapshot_download had put them there, plus the record."""

    def __init__(self, cache_dir: str, repo: str, revision: str, record_path: str) -> None:
        self.repo_dir = os.path.join(cache_dir, "models--" + repo.replace("/", "--"))
        self.blobs = os.path.join(self.repo_dir, "blobs")
        self.snapshot = os.path.join(self.repo_dir, "snapshots", revision)
        self.revision = revision
        self.record_path = record_path
        self.lock = threading.Lock()
        self.record: dict[str, Any] = {"revision": revision, "complete": False, "files": {}}
        try:
            with open(record_path, encoding="utf-8") as fh:
                loaded = json.load(fh)
            if loaded.get("revision") == revision:
                self.record = loaded
        except (OSError, ValueError):
            pass
        os.makedirs(self.blobs, exist_ok=True)
        os.makedirs(self.snapshot, exist_ok=True)

    def blob(self, e: Entry) -> str:
        return os.path.join(self.blobs, e.etag)

    def link(self, e: Entry) -> str:
        return os.path.join(self.snapshot, e.name)

    def is_verified(self, e: Entry) -> bool:
        """True if this file was hashed on an earlier run and has not changed since (same size and mtime)."""
        rec = self.record["files"].get(e.name)
        if not rec or rec.get("etag") != e.etag or rec.get("size") != e.size:
            return False
        try:
            st = os.stat(self.link(e))  # follows the link to the blob
            blob = os.lstat(self.blob(e))
        except OSError:
            return False
        if not stat.S_ISREG(blob.st_mode) or (blob.st_dev, blob.st_ino) != (st.st_dev, st.st_ino):
            return False  # the snapshot link leads elsewhere, or the blob itself is a link
        if "ino" not in rec:
            # A record from before inodes were kept: this check is its commit's, so the peer server may serve it.
            rec.update(dev=st.st_dev, ino=st.st_ino)
        return (st.st_size == e.size and st.st_mtime_ns == rec.get("mtime_ns")
                and (st.st_dev, st.st_ino) == (rec.get("dev"), rec.get("ino")))

    def commit(self, e: Entry, tmp: str) -> None:
        """A verified download becomes the blob, the snapshot link and a line in the record."""
        os.replace(tmp, self.blob(e))
        link = self.link(e)
        os.makedirs(os.path.dirname(link), exist_ok=True)
        target = os.path.relpath(self.blob(e), os.path.dirname(link))
        if os.path.lexists(link):
            os.unlink(link)
        os.symlink(target, link)
        st = os.lstat(self.blob(e))
        with self.lock:
            # The device and inode name the very file that was verified: the peer server serves that file only.
            self.record["files"][e.name] = {"etag": e.etag, "size": e.size, "mtime_ns": st.st_mtime_ns,
                                            "dev": st.st_dev, "ino": st.st_ino,
                                            "sha256" if e.sha256 else "git_sha1": e.etag}
            write_json(self.record_path, self.record)

    def open_verified(self, e: Entry) -> int:
        """A read descriptor on e's blob, if it is still the regular file of e's size committed for it (same device
        and inode); Unservable otherwise. The path is opened with O_PATH and O_NOFOLLOW, which neither follows a
        link in its last part nor opens a device or FIFO; a link earlier in the path leads to another inode, which
        the record refuses. Reading reopens that descriptor (/proc/self/fd, Linux), never the path again, so the
        file read is the file checked."""
        with self.lock:
            rec = dict(self.record["files"].get(e.name) or {})
        try:
            pfd = os.open(self.blob(e), os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise Unservable(f"{e.name}: its blob cannot be opened ({os.strerror(exc.errno or 0)})") from None
        try:
            st = os.fstat(pfd)
            if not stat.S_ISREG(st.st_mode):
                raise Unservable(f"{e.name}: its blob is no longer a regular file")
            if (st.st_size, st.st_dev, st.st_ino) != (e.size, rec.get("dev"), rec.get("ino")) \
                    or rec.get("etag") != e.etag:
                raise Unservable(f"{e.name}: its blob is not the file verified for it")
            return os.open(f"/proc/self/fd/{pfd}", os.O_RDONLY | os.O_CLOEXEC)
        finally:
            os.close(pfd)

    def finish(self, manifest: list[Entry]) -> None:
        with self.lock:
            self.record["complete"] = True
            self.record["manifest"] = [e.__dict__ for e in manifest]
            write_json(self.record_path, self.record)

    def recorded_manifest(self) -> list[Entry] | None:
        """The manifest of a download that finished earlier, so a re-run can vouch for it without the hub."""
        if not self.record.get("complete"):
            return None
        try:
            return [Entry(**m) for m in self.record["manifest"]]
        except (KeyError, TypeError):
            return None


# ---- streams: the hub and the peers --------------------------------------------------------------------------------


class Counters:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.hub = 0
        self.peer = 0
        self.inflight: dict[str, int] = {}

    def add(self, name: str, n: int, from_hub: bool) -> None:
        with self.lock:
            self.inflight[name] = self.inflight.get(name, 0) + n
            if from_hub:
                self.hub += n
            else:
                self.peer += n

    def drop(self, name: str) -> None:
        with self.lock:
            self.inflight.pop(name, None)


def stream_to(client: httpx2.Client, url: str, headers: dict[str, str], e: Entry, tmp: str, counters: Counters,
              from_hub: bool, attempts: int, deadline: float | None = None,
              sign: Callable[[], dict[str, str]] | None = None) -> None:
    """GET url into tmp, hashing every chunk as it is written; a dropped stream resumes with a Range request.

    With `deadline` (time.monotonic()), the whole transfer must end by then: chunks are taken as they arrive, so a
    sender that trickles a byte at a time, which a per-read timeout never catches, is cut off (PeerFault).
    `sign` adds headers made afresh for every attempt (a peer request's nonce is good for one request only).
    """
    chunk_size = CHUNK if deadline is None else None
    h = e.hasher()
    done = 0
    with open(tmp, "wb") as fh:
        for attempt in range(1, attempts + 1):
            hdrs = dict(headers)
            if sign is not None:
                hdrs.update(sign())
            if done:
                hdrs["Range"] = f"bytes={done}-"
            try:
                with client.stream("GET", url, headers=hdrs) as r:
                    if r.status_code in (401, 403, 404):
                        # The hub refusing a file stops the download; a peer refusing one only costs that peer.
                        raise (Fatal if from_hub else PeerFault)(f"{e.name}: HTTP {r.status_code} from "
                                                                 f"{url.split('?')[0]}")
                    if r.status_code == 200 and done:  # the server ignored the Range: start over
                        fh.seek(0)
                        fh.truncate()
                        h, done = e.hasher(), 0
                    elif r.status_code not in (200, 206):
                        raise httpx2.HTTPStatusError(f"HTTP {r.status_code}", request=r.request, response=r)
                    for chunk in r.iter_bytes(chunk_size):
                        if deadline is not None and time.monotonic() > deadline:
                            raise PeerFault(f"{e.name}: {done:,} of {e.size:,} bytes by the transfer's deadline")
                        fh.write(chunk)
                        h.update(chunk)
                        done += len(chunk)
                        counters.add(e.name, len(chunk), from_hub)
                        if done > e.size:
                            raise Corrupt(f"{e.name}: more than the {e.size:,} bytes the hub records")
                if done == e.size:
                    break
                raise httpx2.RemoteProtocolError(f"{e.name}: stream ended at {done:,} of {e.size:,} bytes")
            except (httpx2.TransportError, httpx2.HTTPStatusError) as exc:
                if attempt == attempts:
                    raise
                log(f"{e.name}: {type(exc).__name__} at {done:,} bytes; resuming (attempt {attempt + 1})")
                time.sleep(min(2**attempt, 30) if from_hub else 0.2)
    if h.hexdigest() != e.etag:
        raise Corrupt(f"{e.name}: hashes to {h.hexdigest()[:16]}... but the hub records {e.etag[:16]}...")


