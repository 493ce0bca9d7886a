#!/usr/bin/env python3
"""Runs on a node: restores the engine's compiled-kernel cache from an S3-compatible bucket, or saves it there.

`restore` runs before the launch and never fails it: a missing archive, one saved for another key, a corrupt or
unsafe one, an unreachable store or refused credentials all end in one line saying why, and the engine starts cold.
`save` runs after the readiness wait and only warns. Archives are tar.gz under <prefix><key>/ with a manifest that
records the archive's sha256 and the key's fields; the manifest is written last, so it only ever names a whole
archive. Only kernel artifacts travel: an allow-list of cache folders, no token, env or key file, and no file that
holds any secret this node knows. Needs boto3 (https://boto3.amazonaws.com/v1/documentation/api/latest/).

Two parties may be hostile. The engine's container writes the cache folder as root, so no path under it is ever
followed through a link (every component is opened with O_NOFOLLOW, relative to the folder before it), and a save
packs the very file it checked and scans the bytes it packs. A bucket writer chooses the archive, so a restore takes
no more than the manifest records (archive size, unpacked bytes, entries) and never more than fixed maxima.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from kimi_cluster.node.kernel_files import (
    ALLOWED_ROOTS,
    ARCHIVE_NAME,
    FORMAT_VERSION,
    MAX_ARCHIVE_BYTES,
    MAX_MEMBERS,
    MAX_UNPACKED_BYTES,
    CacheError,
    SecretScanner,
    Selection,
    allowed_path,
    inside,
    kernel_file_count,
    open_dirs,
    open_file_beneath,
    open_root,
    secret_values,
    select,
)
from kimi_cluster.node.kernel_store import Progress, Store, mb, say, sha256_file

# status's escape: shipped beside this program on the node (kimi_cluster/plan/templates/_printable.sh.j2); the names it
# prints are
# the engine's to choose.
from kimi_cluster.node.printable import printable

# ---- node state (what this VM already did, for zero-cost re-runs) -----------------------------------------------


def read_state(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def write_state(path: str, **updates: Any) -> None:
    data = {**read_state(path), **updates}
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path + ".tmp", "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=2, sort_keys=True)
    os.replace(path + ".tmp", path)


# ---- restore -------------------------------------------------------------------------------------------------------


def key_difference(expected: dict[str, Any], found: Any) -> list[str]:
    if not isinstance(found, dict):
        return ["the manifest records no key fields"]
    return [f"{k} {found.get(k)!r} (archive) != {expected.get(k)!r} (this stack)"
            for k in sorted(set(expected) | set(found)) if expected.get(k) != found.get(k)]


def safe_members(tar: tarfile.TarFile, max_bytes: int = MAX_UNPACKED_BYTES,
                 max_members: int = MAX_MEMBERS) -> Iterator[tarfile.TarInfo]:
    """Every member, refused whole if any is outside the kernel caches or not a plain file or folder, or if the
    members are more than `max_members` or add up to more than `max_bytes` (read header by header, so a bomb of
    entries is refused when the cap is passed, not after all of them are in memory)."""
    members: list[tarfile.TarInfo] = []
    total = 0
    for m in tar:
        if len(members) >= max_members:
            raise CacheError(f"the archive holds more than {max_members:,} entries; refusing it")
        total += max(m.size, 0)
        if total > max_bytes:
            raise CacheError(f"the archive unpacks to more than {mb(max_bytes)}; refusing it")
        members.append(m)
        name = m.name.removeprefix("./")
        if not (m.isfile() or m.isdir()):
            raise CacheError(f"the archive holds {m.name!r}, which is not a plain file or folder; refusing it")
        if m.isdir():
            parts = name.rstrip("/").split("/")
            if name.startswith("/") or ".." in parts or not any(
                    r == name.rstrip("/") or r.startswith(name.rstrip("/") + "/") or name.startswith(r + "/")
                    for r in ALLOWED_ROOTS):
                raise CacheError(f"the archive holds the folder {m.name!r} outside the kernel caches; refusing it")
        elif not allowed_path(name):
            raise CacheError(f"the archive holds {m.name!r}, which is not a kernel artifact; refusing it")
        m.name = name
        m.mode &= 0o755
        m.uid = m.gid = 0
        m.uname = m.gname = ""
    return iter(members)


def _manifest_int(manifest: dict[str, Any], name: str) -> int | None:
    value = manifest.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise CacheError(f"the manifest's {name} is {value!r}, not a byte or file count")
    return value


def unpack_limits(manifest: dict[str, Any]) -> tuple[int, int, int]:
    """(archive bytes, unpacked bytes, entries) a restore accepts: what the manifest recorded, within fixed caps."""
    size = _manifest_int(manifest, "size")
    if not size:
        raise CacheError("the manifest records no size for the archive")
    if size > MAX_ARCHIVE_BYTES:
        raise CacheError(f"the manifest records an archive of {mb(size)}, more than the {mb(MAX_ARCHIVE_BYTES)} "
                         "a restore accepts")
    unpacked = _manifest_int(manifest, "bytes")
    files = _manifest_int(manifest, "files")
    max_bytes = MAX_UNPACKED_BYTES if unpacked is None else min(unpacked, MAX_UNPACKED_BYTES)
    # Folders are entries too: allow one per file on top of the files themselves.
    max_members = MAX_MEMBERS if files is None else min(2 * files + len(ALLOWED_ROOTS) + 8, MAX_MEMBERS)
    return size, max_bytes, max_members


def restore(args: argparse.Namespace) -> str:
    """Fetch and unpack; on any CacheError the engine compiles for this key, which the VM remembers."""
    try:
        return _restore(args)
    except CacheError:
        if not kernel_file_count(args.cache_dir):
            write_state(os.path.join(args.state_dir, "kernel-cache.json"), compiled=args.key)
        raise


def _restore(args: argparse.Namespace) -> str:
    expected = json.loads(args.key_fields)
    state_file = os.path.join(args.state_dir, "kernel-cache.json")
    have = kernel_file_count(args.cache_dir)
    state = read_state(state_file)
    if have and state.get("restored") == args.key:
        return f"already restored for key {args.key} on this VM ({have} kernel files); nothing fetched"
    if state.get("compiled") == args.key:
        # This VM's engine was started to compile this key itself. Its files may not all be written yet (the head
        # can be ready while a worker still writes its cache), and fetching an archive under a running engine
        # would only cost bytes: leave the engine's own compile alone.
        return f"this VM compiled the kernels of key {args.key} itself ({have} files); nothing fetched"
    if have:
        # Kernels of another configuration (an earlier image, say): the engines key their own caches, so those
        # stay, and the archive's files are added beside them, never over one.
        say(f"{have} kernel files of an earlier configuration are here; adding the archive's beside them")
    store = make_store(args)
    store.connect()
    manifest = store.get_manifest(args.key)
    if manifest is None:
        raise CacheError(f"no archive for key {args.key} in {store.where} yet (the first bring-up with this "
                         "configuration saves one after the readiness wait)")
    diff = key_difference(expected, manifest.get("fields"))
    if manifest.get("key") != args.key or diff:
        raise CacheError(f"the archive under key {args.key} was saved for another configuration: "
                         + ("; ".join(diff) or f"key {manifest.get('key')!r}"))
    recorded = str(manifest.get("sha256") or "")
    if len(recorded) != 64:
        raise CacheError("the manifest records no sha256 for the archive")
    size, max_bytes, max_members = unpack_limits(manifest)
    work = tempfile.mkdtemp(prefix=".kernel-cache-restore-", dir=args.work_dir)
    try:
        archive = os.path.join(work, ARCHIVE_NAME)
        started = time.monotonic()
        say(f"downloading {mb(size)} from {store.place(args.key)}")
        store.download(args.key, archive, Progress("downloaded", size, args.progress_seconds, limit=size), size)
        got = os.path.getsize(archive)
        if got != size:
            raise CacheError(f"the archive is {got:,} bytes, the manifest recorded {size:,}")
        actual = sha256_file(archive)
        if actual != recorded:
            raise CacheError(f"the archive is corrupt: its sha256 is {actual[:16]}..., the manifest recorded "
                             f"{recorded[:16]}...")
        staging = os.path.join(work, "unpacked")
        os.makedirs(staging)
        try:
            with tarfile.open(archive, "r:gz") as tar:
                members = list(safe_members(tar, max_bytes, max_members))
                kwargs: dict[str, Any] = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
                tar.extractall(staging, members=members, **kwargs)
        except (tarfile.TarError, EOFError, OSError, ValueError) as exc:
            raise CacheError(f"the archive cannot be unpacked: {type(exc).__name__}: {exc}") from None
        os.makedirs(args.cache_dir, exist_ok=True)
        count = _merge(staging, args.cache_dir)
        write_state(state_file, restored=args.key)
        return (f"restored {count} kernel files ({mb(size)}) for key {args.key} from {store.where} in "
                f"{time.monotonic() - started:.1f} s")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _merge(src: str, dest: str) -> int:
    """Move unpacked files into the cache folder, never over a file already there and never through a link.

    The engine's container writes in the cache folder as root, so it could plant `triton -> /etc/cron.d` before a
    restore. Every folder on the way is opened with O_NOFOLLOW relative to the one before (a link anywhere is
    refused), checked to lie inside the cache folder, and each file is hard-linked into place, which fails rather
    than replace anything already at that name, link or not.
    """
    count = 0
    real_dest = os.path.realpath(dest)
    root_fd = open_root(dest)
    try:
        for dirpath, _, filenames in os.walk(src):
            rel_dir = os.path.relpath(dirpath, src).replace(os.sep, "/")
            parts = [] if rel_dir == "." else rel_dir.split("/")
            dfd = open_dirs(root_fd, parts, create=True)
            try:
                if not inside(dfd, real_dest):
                    raise CacheError(f"refusing {rel_dir}: it resolves outside the cache folder")
                for name in filenames:
                    try:
                        os.link(os.path.join(dirpath, name), name, dst_dir_fd=dfd, follow_symlinks=False)
                    except FileExistsError:
                        continue
                    count += 1
            finally:
                os.close(dfd)
    finally:
        os.close(root_fd)
    return count


# ---- save ----------------------------------------------------------------------------------------------------------


def pack(cache_dir: str, sel: Selection, dest: str, secrets: list[bytes] | None = None) -> Selection:
    """A gzip'd tar of the selected files only; level 1, since kernels compress little and time matters more.

    Each file is opened once, with no link followed, and must still be the file `select` checked (same device and
    inode): one swapped for a link or another file since is left out. The bytes that go into the archive are the
    bytes scanned for the node's secrets; one that appears there (a file rewritten since `select`) stops the save.
    Returns what was packed.
    """
    packed = Selection(stripped=list(sel.stripped))
    root_fd = open_root(cache_dir)
    try:
        with open(dest, "wb") as raw, tarfile.open(fileobj=raw, mode="w:gz", compresslevel=1) as tar:
            for rel, st in sel.files:
                try:
                    fd = open_file_beneath(root_fd, rel)
                except CacheError as exc:
                    packed.stripped.append(f"{rel} (changed during the save: {exc})")
                    continue
                with os.fdopen(fd, "rb") as fh:
                    now = os.fstat(fh.fileno())
                    if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
                        packed.stripped.append(f"{rel} (replaced by another file during the save)")
                        continue
                    info = tarfile.TarInfo(rel)
                    info.size, info.mtime, info.mode = st.st_size, int(st.st_mtime), 0o644
                    tar.addfile(info, _Exact(fh, st.st_size, rel, SecretScanner(secrets or [])))
                packed.files.append((rel, st))
    finally:
        os.close(root_fd)
    return packed


class _Exact(io.RawIOBase):
    """Reads exactly `size` bytes of a file, so a file still growing cannot break the tar; scans what it hands out."""

    def __init__(self, fh: Any, size: int, rel: str = "", scanner: SecretScanner | None = None) -> None:
        self.fh, self.left, self.rel, self.scanner = fh, size, rel, scanner

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        n = self.left if n is None or n < 0 else min(n, self.left)
        data = self.fh.read(n)
        data += b"\0" * (n - len(data))
        self.left -= n
        if self.scanner is not None and self.scanner.feed(data):
            raise CacheError(f"{self.rel} came to hold a secret of this node while it was packed; nothing uploaded")
        return data


def save(args: argparse.Namespace) -> str:
    fields = json.loads(args.key_fields)
    state_file = os.path.join(args.state_dir, "kernel-cache.json")
    files = list(args.secret_file)
    for folder in args.secret_dir:
        for dirpath, _, names in os.walk(folder):
            files += [os.path.join(dirpath, n) for n in names]
    secrets = secret_values(files)
    sel = select(args.cache_dir, secrets)
    for line in sel.stripped[:20]:
        say(f"left out {printable(line, 1200)}")
    if len(sel.stripped) > 20:
        say(f"left out {len(sel.stripped) - 20} more files")
    if not sel.files:
        raise CacheError(f"{args.cache_dir} holds no kernel files yet; nothing to save")
    digest = sel.tree_digest()
    if read_state(state_file).get("restored") != args.key:
        write_state(state_file, compiled=args.key)  # what this VM holds it compiled itself, for this key
    if read_state(state_file).get("saved") == {"key": args.key, "tree": digest}:
        return f"unchanged since this VM saved key {args.key}; nothing uploaded"
    store = make_store(args)
    store.connect()
    current = store.get_manifest(args.key)
    if current is not None and current.get("tree_digest") == digest and current.get("fields") == fields:
        write_state(state_file, saved={"key": args.key, "tree": digest})
        return f"{store.place(args.key)} already holds these {len(sel.files)} kernel files; nothing uploaded"
    work = tempfile.mkdtemp(prefix=".kernel-cache-save-", dir=args.work_dir)
    try:
        archive = os.path.join(work, ARCHIVE_NAME)
        started = time.monotonic()
        say(f"packing {len(sel.files)} kernel files ({mb(sel.total_bytes)})")
        sel = pack(args.cache_dir, sel, archive, secrets)
        if not sel.files:
            raise CacheError("every kernel file changed during the save; nothing uploaded")
        size = os.path.getsize(archive)
        manifest = {
            "format": FORMAT_VERSION, "key": args.key, "fields": fields, "sha256": sha256_file(archive),
            "size": size, "files": len(sel.files), "bytes": sel.total_bytes, "tree_digest": digest,
            "left_out": len(sel.stripped), "saved_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        say(f"uploading {mb(size)} to {store.place(args.key)}")
        store.upload(args.key, archive, manifest, Progress("uploaded", size, args.progress_seconds))
        write_state(state_file, saved={"key": args.key, "tree": digest})
        return (f"saved {len(sel.files)} kernel files ({mb(size)} packed, sha256 {manifest['sha256'][:16]}...) "
                f"as key {args.key} in {store.where} in {time.monotonic() - started:.1f} s")
    finally:
        shutil.rmtree(work, ignore_errors=True)


# ---- command line --------------------------------------------------------------------------------------------------


def make_store(args: argparse.Namespace) -> Store:
    return Store(args.bucket, args.prefix, args.endpoint_url or None, args.region, args.addressing_style,
                 args.credentials_file)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=("restore", "save"))
    ap.add_argument("--cache-dir", required=True, help="the engine's cache folder (the container's /root/.cache)")
    ap.add_argument("--key", required=True, help="the archive's key (components/kernel_cache.py)")
    ap.add_argument("--key-fields", required=True, help="the key's fields as JSON, recorded in the manifest")
    ap.add_argument("--bucket", required=True)
    ap.add_argument("--prefix", default="")
    ap.add_argument("--endpoint-url", default="", help="an S3-compatible endpoint; empty for AWS")
    ap.add_argument("--region", default="us-east-1")
    ap.add_argument("--addressing-style", choices=("auto", "path", "virtual"), default="auto")
    ap.add_argument("--credentials-file", required=True, help="a root-only file holding ACCESS_KEY_ID:SECRET")
    ap.add_argument("--state-dir", required=True, help="where this VM records what it restored and saved")
    ap.add_argument("--work-dir", required=True, help="scratch space on the storage disk for the archive")
    ap.add_argument("--secret-file", action="append", default=[],
                    help="a file of secrets no packed file may contain (repeatable)")
    ap.add_argument("--secret-dir", action="append", default=[],
                    help="a folder whose every file holds secrets no packed file may contain (repeatable)")
    ap.add_argument("--progress-seconds", type=float, default=30.0)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.makedirs(args.work_dir, exist_ok=True)
    try:
        say(restore(args) if args.action == "restore" else save(args))
        return 0
    except CacheError as exc:
        if args.action == "restore":
            say(f"starting cold: {exc}")
        else:
            say(f"WARNING: not saved: {exc}")
        return 3
    except Exception as exc:  # noqa: BLE001 - the cache must never take the launch down; say what happened
        reason = f"{type(exc).__name__}: {exc}".replace("\n", " ")[:500]
        say(f"starting cold: unexpected error: {reason}" if args.action == "restore"
            else f"WARNING: not saved: unexpected error: {reason}")
        return 3


if __name__ == "__main__":
    sys.exit(main())
