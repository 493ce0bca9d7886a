"""The kernel cache's files (run with kimi_cluster/node/kernel_cache.py on a node): which files under the engine's cache
folder are kernels that may travel, the secrets none of them may hold, and the opening of every path beneath the
folder without following a link (the engine's container writes there as root).
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import stat
from dataclasses import dataclass, field

ARCHIVE_NAME = "cache.tar.gz"
MANIFEST_NAME = "manifest.json"
FORMAT_VERSION = 1
CHUNK = 8 * 1024 * 1024

# The kernel caches under the container's /root/.cache (kimi_cluster/plan/launch.py sets the first three; SGLang puts
# DeepGEMM's under sglang/deep_gemm whatever DG_JIT_CACHE_DIR says, vLLM its torch.compile artifacts under
# VLLM_CACHE_ROOT; TokenSpeed's kernel package its autotune results and MSA FMHA builds where launch.py points
# TOKENSPEED_FLASHINFER_AUTOTUNE_CACHE_DIR and MINFER_FMHA_CACHE_DIR). Nothing else in that folder travels: not the
# Hugging Face folder, not pip's cache.
ALLOWED_ROOTS = ("triton", "torchinductor", "deep_gemm", "sglang/deep_gemm", "vllm/torch_compile_cache",
                 "vllm/torch_aot_compile", "flashinfer", "torch_extensions", "autotune/flashinfer",
                 "minfer/fmha_sm100")
# Names that are never a kernel, wherever they are: tokens, env files, keys, credentials.
DENIED_NAMES = ("token", "stored_tokens", "*.env", ".env", ".env.*", "*.netrc", ".netrc", "netrc", "credentials",
                "credentials.*", "*.pem", "*.key", "id_rsa*", "id_ed25519*", "id_ecdsa*", "*.header", "*secret*",
                "*token*", ".git-credentials", "*.p12")
MIN_SECRET_LEN = 8
# What a restore may unpack, whatever the manifest says: the archive lands on the disk that holds the weights and
# Docker's data, and a bucket writer (or anyone with the bucket's key) chooses its content.
MAX_ARCHIVE_BYTES = 64 * 10**9
MAX_UNPACKED_BYTES = 128 * 10**9
MAX_MEMBERS = 200_000
# Open flags for every path under the cache folder: the engine container writes there as root, so any component
# may have been swapped for a link (or a FIFO) since it was last looked at.
_NOFOLLOW_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
# A file is first opened with O_PATH, which runs no open of its own: a device node planted there (its driver's open
# may act, a tape rewinds, a watchdog starts) or a FIFO (its writer wakes) is refused by type before anything opens
# it. The regular file is then read through that descriptor, never by its name again.
_PATH_ONLY = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
_REOPEN = os.O_RDONLY | os.O_CLOEXEC



class CacheError(Exception):
    """Why a restore starts cold or a save is skipped; one line."""


# ---- paths the container can reach -----------------------------------------------------------------------------------


def open_root(cache_dir: str) -> int:
    """The cache folder itself, refused if it is a link (the host made it; the container can only write inside)."""
    try:
        return os.open(cache_dir, _NOFOLLOW_DIR)
    except OSError as exc:
        raise CacheError(f"cannot open the cache folder {cache_dir} without following links: {exc}") from None


def open_dirs(root_fd: int, parts: list[str], create: bool) -> int:
    """The folder `parts` below root_fd, one component at a time with O_NOFOLLOW, so no component is ever a link.

    Returns a new descriptor (the caller closes it). Each component is opened relative to the one before, so a link
    swapped in after a check cannot redirect a later step: the descriptors stay on the folders that were checked.
    """
    fd = os.dup(root_fd)
    try:
        for part in parts:
            if part in ("", ".", "..") or "/" in part:
                raise CacheError(f"refusing the path component {part!r}")
            if create:
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
            try:
                nxt = os.open(part, _NOFOLLOW_DIR, dir_fd=fd)
            except OSError as exc:
                raise CacheError(f"refusing {'/'.join(parts)}: the component {part!r} is not a plain folder "
                                 f"({os.strerror(exc.errno or 0)}), perhaps a link planted in the cache") from None
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise


def inside(fd: int, root: str) -> bool:
    """Where the kernel says this descriptor's folder is (Linux's /proc), checked to lie inside `root`."""
    where = f"/proc/self/fd/{fd}"
    if not os.path.exists(where):
        return True  # no /proc: the O_NOFOLLOW walk alone has to do
    real = os.path.realpath(where)
    return real == root or real.startswith(root.rstrip("/") + "/")


def open_file_beneath(root_fd: int, rel: str) -> int:
    """A file below root_fd opened once, with no link followed in any component; refused unless a regular file."""
    *dirs, name = rel.split("/")
    dfd = open_dirs(root_fd, dirs, create=False)
    try:
        pfd = os.open(name, _PATH_ONLY, dir_fd=dfd)
    except OSError as exc:
        raise CacheError(f"{rel} cannot be opened without following a link ({os.strerror(exc.errno or 0)})") from None
    finally:
        os.close(dfd)
    try:
        mode = os.fstat(pfd).st_mode
        if stat.S_ISLNK(mode):
            raise CacheError(f"{rel} cannot be opened without following a link (it is one)")
        if not stat.S_ISREG(mode):
            raise CacheError(f"{rel} is not a regular file")
        return os.open(f"/proc/self/fd/{pfd}", _REOPEN)  # the very file just checked (Linux's /proc)
    finally:
        os.close(pfd)


# ---- what may travel -----------------------------------------------------------------------------------------------


def allowed_path(rel: str) -> bool:
    """A path inside the cache folder that is under one of the kernel caches and has no denied name."""
    parts = rel.split("/")
    if not rel or rel.startswith("/") or any(p in ("", ".", "..") for p in parts):
        return False
    if not any(rel == root or rel.startswith(root + "/") for root in ALLOWED_ROOTS):
        return False
    return not any(fnmatch.fnmatch(p.lower(), pat) for p in parts for pat in DENIED_NAMES)


def secret_values(paths: list[str]) -> list[bytes]:
    """The secrets in the node's root-only files (an env file's values, a header's token, an ID:SECRET pair)."""
    found: set[str] = set()
    for path in paths:
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                lines = fh.read().splitlines()
        except OSError:
            continue
        for line in lines:
            line = line.strip()
            candidates = {line, line.partition("=")[2], line.rpartition("Bearer ")[2], *line.split(":")}
            found.update(c.strip() for c in candidates if len(c.strip()) >= MIN_SECRET_LEN)
    return sorted((s.encode() for s in found), key=len, reverse=True)


class SecretScanner:
    """Looks for any of the node's secrets in a stream of blocks, also across block boundaries."""

    def __init__(self, secrets: list[bytes]) -> None:
        self.secrets = secrets
        self.overlap = max((len(s) for s in secrets), default=0)
        self.tail = b""

    def feed(self, block: bytes) -> bool:
        if not self.secrets:
            return False
        window = self.tail + block
        self.tail = window[-self.overlap:]
        return any(s in window for s in self.secrets)


def holds_secret(fd: int, secrets: list[bytes]) -> bool:
    scanner = SecretScanner(secrets)
    if not secrets:
        return False
    os.lseek(fd, 0, os.SEEK_SET)
    for block in iter(lambda: os.read(fd, CHUNK), b""):
        if scanner.feed(block):
            return True
    return False


@dataclass
class Selection:
    """The files a save packs, and what it left behind and why."""

    files: list[tuple[str, os.stat_result]] = field(default_factory=list)
    stripped: list[str] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        return sum(st.st_size for _, st in self.files)

    def tree_digest(self) -> str:
        """Names, sizes and whole-second mtimes (what tar keeps): equal after a restore that nothing changed."""
        h = hashlib.sha256()
        for rel, st in self.files:
            h.update(f"{rel}\0{st.st_size}\0{int(st.st_mtime)}\n".encode())
        return h.hexdigest()


def select(cache_dir: str, secrets: list[bytes]) -> Selection:
    """Walk the cache folder without following links; keep regular files that may travel.

    Each file is opened once with no link followed (open_file_beneath) and its secret scan reads that descriptor;
    the stat kept is the descriptor's, so `pack` can tell if the path names another file by the time it packs.
    """
    sel = Selection()
    if not os.path.lexists(cache_dir):
        return sel  # the engine has not started yet: nothing compiled
    root_fd = open_root(cache_dir)
    try:
        for dirpath, dirnames, filenames in os.walk(cache_dir):
            dirnames.sort()
            for name in sorted(filenames):
                full = os.path.join(dirpath, name)
                rel = os.path.relpath(full, cache_dir).replace(os.sep, "/")
                if not allowed_path(rel):
                    if any(rel.startswith(root + "/") for root in ALLOWED_ROOTS):
                        sel.stripped.append(f"{rel} (a name kernels never have)")
                    continue
                try:
                    fd = open_file_beneath(root_fd, rel)
                except CacheError:
                    sel.stripped.append(f"{rel} (not a regular file)")
                    continue
                try:
                    if holds_secret(fd, secrets):
                        sel.stripped.append(f"{rel} (holds a secret of this node)")
                        continue
                    sel.files.append((rel, os.fstat(fd)))
                finally:
                    os.close(fd)
    finally:
        os.close(root_fd)
    return sel


def kernel_file_count(cache_dir: str) -> int:
    if not os.path.isdir(cache_dir):
        return 0
    count = 0
    for dirpath, _, filenames in os.walk(cache_dir):
        for name in filenames:
            rel = os.path.relpath(os.path.join(dirpath, name), cache_dir).replace(os.sep, "/")
            count += allowed_path(rel)
    return count
