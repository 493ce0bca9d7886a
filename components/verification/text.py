"""How the verifier quotes what a server said: shortened to one line, and with the key hidden."""

from __future__ import annotations

import json
import re
from typing import Any


def short(text: str, limit: int = 240) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def numbers_in(text: str) -> set[str]:
    return set(re.findall(r"\d+", text))


def redact(text: str, secret: str | None) -> str:
    """Hide the key if a server echoed it back into something we are about to print or store."""
    if secret and len(secret) >= 4 and secret in text:
        return text.replace(secret, "***")
    return text


def redact_obj(obj: Any, secret: str | None) -> Any:
    """`obj` (JSON-shaped) with the key hidden in every string, as JSON would escape it."""
    if not secret:
        return obj
    return json.loads(redact(json.dumps(obj), json.dumps(secret)[1:-1]))
