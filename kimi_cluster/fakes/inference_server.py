"""The fake inference server's command, `python -m kimi_cluster.fakes.inference_server` (a fake node's `docker run`
starts it), and the names its callers use: the fake lives in the package kimi_cluster/fakes/inference/, one concern
a module (its __init__ lists them)."""

from __future__ import annotations

import sys

from kimi_cluster.fakes.inference.cli import main, settings_from_args
from kimi_cluster.fakes.inference.compose import compose_reply
from kimi_cluster.fakes.inference.handler import VLLM_GUARDED_PREFIXES
from kimi_cluster.fakes.inference.png import colour_name, decode_png, half_colours
from kimi_cluster.fakes.inference.server import FakeInferenceServer
from kimi_cluster.fakes.inference.settings import (
    DEFAULT_MODEL,
    EFFORTS,
    ENGINES,
    FAULTS,
    FakeSettings,
    HttpError,
    Reply,
)
from kimi_cluster.fakes.inference.warmup import kernel_files, warm_up

__all__ = [
    "DEFAULT_MODEL", "EFFORTS", "ENGINES", "FAULTS", "VLLM_GUARDED_PREFIXES", "FakeInferenceServer", "FakeSettings",
    "HttpError", "Reply", "colour_name", "compose_reply", "decode_png", "half_colours", "kernel_files", "main",
    "settings_from_args", "warm_up",
]

if __name__ == "__main__":
    sys.exit(main())
