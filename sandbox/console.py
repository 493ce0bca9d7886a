"""The sandbox engine's screen output: progress lines and diagnostics, every known secret value masked.

Like the Pulumi CLI, plaintext of any value the engine has seen marked secret is replaced by [secret] on output.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterable
from typing import Any, TextIO

from . import props

# Very short secrets ("1", "yes") would mask unrelated text; Pulumi draws a similar line.
_MIN_MASKED_LENGTH = 4
# Serialized dynamic providers are secret blobs of many kilobytes; they never appear in text and would slow masking.
_MAX_MASKED_LENGTH = 4096


def indent_rest(text: str, prefix: str) -> str:
    """Multi-line text (a command's output tail) under a one-line heading: indent every line after the first."""
    first, *rest = text.splitlines() or [""]
    return "\n".join([first, *(prefix + line for line in rest)])


class Console:
    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream if stream is not None else sys.stdout
        self._lock = threading.Lock()
        self._secrets: set[str] = set()

    def add_secret(self, value: str) -> None:
        if _MIN_MASKED_LENGTH <= len(value) <= _MAX_MASKED_LENGTH:
            with self._lock:
                self._secrets.add(value)
                # Multi-line secrets (keys, scripts) are printed line by line, so mask each line too.
                for line in value.splitlines():
                    if len(line.strip()) >= _MIN_MASKED_LENGTH:
                        self._secrets.add(line.strip())

    def learn(self, value: Any) -> None:
        """Remember the plaintext of every secret inside a wire-format value."""
        for text in props.secret_strings(value):
            self.add_secret(text)

    def learn_all(self, values: Iterable[Any]) -> None:
        for value in values:
            self.learn(value)

    def mask(self, text: str) -> str:
        with self._lock:
            secrets = sorted(self._secrets, key=len, reverse=True)
        for secret in secrets:
            if secret in text:
                text = text.replace(secret, props.SECRET_MARK)
        return text

    def line(self, text: str = "") -> None:
        masked = self.mask(text)
        with self._lock:
            self._stream.write(masked + "\n")
            self._stream.flush()

    def info(self, text: str) -> None:
        self.line(text)

    def warn(self, text: str) -> None:
        self.line(f"warning: {text}")

    def error(self, text: str) -> None:
        self.line(f"error: {text}")
