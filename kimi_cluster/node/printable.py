"""The one escape for text a node or its engine wrote, before an operator's terminal shows it.

`status` prints every string from a node or the endpoint through `printable`; the node scripts print an engine's log
tail and the kernel-cache save its file names through it too (shipped to the node beside them, run as a filter:
`python3 printable.py < text`), so no escape sequence (an OSC 52 clipboard write, a title change) reaches `status`
or `pulumi up`'s output. Standard library only.
"""

from __future__ import annotations

import sys
from typing import Any

LINE_LIMIT = 2000  # per log line, as a filter: an engine's longest lines (tracebacks, argument dumps) fit


def printable(value: Any, limit: int = 300) -> str:
    """`value` as text a terminal shows as it is: every non-printable character (C0/C1 controls such as ESC, format
    characters, U+2028/U+2029) written as a Python-style escape, cut to `limit` characters."""
    out = []
    for ch in str(value)[:limit]:
        if ch.isprintable():
            out.append(ch)
        else:
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000
                       else f"\\U{code:08x}")
    return "".join(out)


def main() -> None:
    """Each line of stdin (any bytes; invalid UTF-8 shown as U+FFFD), escaped, on stdout."""
    for raw in sys.stdin.buffer:
        sys.stdout.write(printable(raw.rstrip(b"\n").decode("utf-8", "replace"), LINE_LIMIT) + "\n")


if __name__ == "__main__":
    main()
