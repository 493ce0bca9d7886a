"""The fake inference server's old import path and its command, `python -m fakes.inference_server` (as a fake node's
`docker run` starts it): the fake lives in the package fakes/inference/, one concern a module (its __init__ lists
them)."""

from __future__ import annotations

import sys

from fakes.inference.cli import main, settings_from_args
from fakes.inference.compose import compose_reply
from fakes.inference.handler import VLLM_GUARDED_PREFIXES
from fakes.inference.png import colour_name, decode_png, half_colours
from fakes.inference.server import FakeInferenceServer
from fakes.inference.settings import DEFAULT_MODEL, EFFORTS, ENGINES, FAULTS, FakeSettings, HttpError, Reply
from fakes.inference.warmup import kernel_files, warm_up

__all__ = [
    "DEFAULT_MODEL", "EFFORTS", "ENGINES", "FAULTS", "VLLM_GUARDED_PREFIXES", "FakeInferenceServer", "FakeSettings",
    "HttpError", "Reply", "colour_name", "compose_reply", "decode_png", "half_colours", "kernel_files", "main",
    "settings_from_args", "warm_up",
]

if __name__ == "__main__":
    sys.exit(main())
