"""How the verifier quotes what a server said: shortened to one line, and with the key hidden.

Redaction runs where text enters the verifier (an answer's body, an exception's message), before
anything shortens it, so a key cut in half by `short` cannot leak its first half; the runner
redacts every result once more on the way out.
"""

from __future__ import annotations

import base64
import json
import re
from typing import Any
from urllib.parse import quote, quote_plus

MASK = "***"


def short(text: str, limit: int = 240) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def numbers_in(text: str) -> set[str]:
    return set(re.findall(r"\d+", text))


def key_shapes(secret: str) -> list[str]:
    """The forms a key takes in text a server or a library writes: as is, JSON- or repr-escaped,
    with its whitespace collapsed (as `short` does), URL-encoded, base64. Longest first."""
    shapes = {
        secret,
        json.dumps(secret)[1:-1],
        json.dumps(secret, ensure_ascii=False)[1:-1],
        repr(secret)[1:-1],
        " ".join(secret.split()),
        quote(secret, safe=""),
        quote_plus(secret),
        base64.b64encode(secret.encode()).decode(),
        base64.b64encode(secret.encode()).decode().rstrip("="),
    }
    return sorted((s for s in shapes if s), key=len, reverse=True)


def redact(text: str, secret: str | None) -> str:
    """`text` with every shape of the key replaced by ***."""
    if not secret:
        return text
    for shape in key_shapes(secret):
        text = text.replace(shape, MASK)
    return text


def redact_obj(obj: Any, secret: str | None) -> Any:
    """A JSON-shaped value with the key hidden in every string, keys of mappings included."""
    if not secret:
        return obj
    if isinstance(obj, str):
        return redact(obj, secret)
    if isinstance(obj, dict):
        return {redact_obj(k, secret): redact_obj(v, secret) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [redact_obj(v, secret) for v in obj]
    return obj
