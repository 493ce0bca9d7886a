"""A two-colour test image for the image check, encoded as PNG with the standard library only."""

from __future__ import annotations

import struct
import zlib


def make_split_png(
    left_rgb: tuple[int, int, int] = (255, 0, 0),
    right_rgb: tuple[int, int, int] = (0, 0, 255),
    width: int = 128,
    height: int = 128,
) -> bytes:
    """An 8-bit RGB PNG whose left half is one colour and right half another.

    Format: https://www.w3.org/TR/png/ (signature, IHDR, one zlib-compressed IDAT, IEND).
    """
    left, right = bytes(left_rgb), bytes(right_rgb)
    half = width // 2
    row = b"\x00" + left * half + right * (width - half)  # leading 0 = filter type "None"
    raw = row * height

    def chunk(tag: bytes, data: bytes) -> bytes:
        body = tag + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw, 9))
        + chunk(b"IEND", b"")
    )
