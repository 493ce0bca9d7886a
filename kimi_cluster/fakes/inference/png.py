"""Just enough PNG to see an image: decode 8-bit RGB(A), and name the average colour of each half."""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence

_PALETTE = {
    "red": (255, 0, 0),
    "green": (0, 255, 0),
    "blue": (0, 0, 255),
    "yellow": (255, 255, 0),
    "cyan": (0, 255, 255),
    "magenta": (255, 0, 255),
    "orange": (255, 165, 0),
    "white": (255, 255, 255),
    "black": (0, 0, 0),
    "grey": (128, 128, 128),
}


def decode_png(data: bytes) -> tuple[int, int, int, list[bytes]]:
    """(width, height, bytes per pixel, unfiltered rows) of an 8-bit RGB or RGBA PNG."""
    if not data.startswith(b"\x89PNG\r\n\x1a\n"):
        raise ValueError("not a PNG (bad signature)")
    pos, header, idat = 8, None, []
    while pos + 8 <= len(data):
        length, tag = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if tag == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif tag == b"IDAT":
            idat.append(body)
        elif tag == b"IEND":
            break
    if header is None or not idat:
        raise ValueError("PNG without IHDR or IDAT")
    width, height, depth, colour_type, _, _, interlace = header
    if depth != 8 or colour_type not in (2, 6) or interlace:
        raise ValueError("only 8-bit, non-interlaced RGB or RGBA PNGs are understood")
    bpp = 3 if colour_type == 2 else 4
    stride = width * bpp
    raw = zlib.decompress(b"".join(idat))
    if len(raw) < height * (stride + 1):
        raise ValueError("PNG image data is shorter than its header says")
    rows, prev = [], bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1 : start + 1 + stride])
        if kind:
            _unfilter(kind, line, prev, bpp)
        rows.append(bytes(line))
        prev = line
    return width, height, bpp, rows


def _unfilter(kind: int, line: bytearray, prev: bytearray, bpp: int) -> None:
    for x in range(len(line)):
        a = line[x - bpp] if x >= bpp else 0
        b = prev[x]
        c = prev[x - bpp] if x >= bpp else 0
        if kind == 1:
            pred = a
        elif kind == 2:
            pred = b
        elif kind == 3:
            pred = (a + b) // 2
        elif kind == 4:
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
        else:
            raise ValueError(f"unknown PNG filter type {kind}")
        line[x] = (line[x] + pred) & 0xFF


def colour_name(rgb: Sequence[float]) -> str:
    return min(_PALETTE, key=lambda n: sum((a - b) ** 2 for a, b in zip(rgb, _PALETTE[n], strict=True)))


def half_colours(png: bytes) -> tuple[str, str]:
    """Names of the average colours of the left and right halves of a PNG."""
    width, height, bpp, rows = decode_png(png)
    half = width // 2
    sums = [[0, 0, 0], [0, 0, 0]]
    counts = [0, 0]
    for row in rows:
        for x in range(width):
            side = 0 if x < half else 1
            px = row[x * bpp : x * bpp + 3]
            for i in range(3):
                sums[side][i] += px[i]
            counts[side] += 1
    left, right = ([s / max(n, 1) for s in side] for side, n in zip(sums, counts, strict=True))
    return colour_name(left), colour_name(right)
