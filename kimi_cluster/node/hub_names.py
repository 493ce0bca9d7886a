"""What a hub manifest may name: file names that stay inside the snapshot folder, and blob ids that are hashes.

The weights and check programs run as root on the nodes and join each `rfilename` to the snapshot folder and each
etag to the blobs folder. A hostile mirror, or a man in the middle of an `http://` hfEndpoint, chooses both, so a
name such as `../../../etc/cron.d/x` or an absolute path would make the weights step replace a file outside the
cache. Standard library only: shipped to the nodes beside scripts/fetch_weights.py and scripts/check_download.py.
"""

from __future__ import annotations

import posixpath
import re

# sha256 (LFS files, 64 hex) or a git blob id (40 hex for SHA-1 repositories, 64 for SHA-256 ones), as hashlib's
# hexdigest spells them: lower case. Anything else is not a hash these programs could ever match.
_ETAG = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
MAX_NAME_LEN = 1024


class UnsafeName(ValueError):
    """A manifest entry the node programs refuse; the message names it (repr'd, cut short) and why."""


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def checked_name(name: object) -> str:
    """`name` if it is a relative path that stays inside any folder it is joined to; else UnsafeName."""
    if not isinstance(name, str) or not name:
        raise UnsafeName(f"the hub's manifest names a file {_shown(name)}, which is not a file name")
    why = None
    if len(name) > MAX_NAME_LEN:
        why = f"longer than {MAX_NAME_LEN} characters"
    elif "\\" in name:
        why = "it holds a backslash"
    elif any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in name):
        why = "it holds a control character"
    elif name.startswith("/"):
        why = "it is an absolute path"
    elif any(part in ("", ".", "..") for part in name.split("/")):
        why = "it has an empty, '.' or '..' part"
    elif not posixpath.normpath(posixpath.join("/snapshot", name)).startswith("/snapshot/"):
        why = "it leaves the snapshot folder"
    if why:
        raise UnsafeName(f"the hub's manifest names the file {_shown(name)}: refused, {why}")
    return name


def checked_etag(name: str, etag: object) -> str:
    """`etag` if it is 40 or 64 lower-case hex digits (the only blob names the Hugging Face cache uses)."""
    if not isinstance(etag, str) or not _ETAG.fullmatch(etag):
        raise UnsafeName(f"the hub's manifest gives {_shown(name)} the hash {_shown(etag)}: refused, not 40 or 64 "
                         "lower-case hex digits")
    return etag
