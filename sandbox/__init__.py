"""The local sandbox engine: runs a Pulumi Python program's `up` and `destroy` on one machine without the Pulumi CLI.

Public API: run_up, run_destroy, UpResult, DestroyResult, DeploymentFailed, SandboxError (see sandbox.engine).
"""

from __future__ import annotations

from typing import Any

__all__ = ["DeploymentFailed", "DestroyResult", "SandboxError", "UpResult", "run_destroy", "run_up"]


def __getattr__(name: str) -> Any:
    # Imported lazily so `python -m sandbox.engine` does not find sandbox.engine already imported by the package.
    if name in __all__:
        from . import engine

        return getattr(engine, name)
    raise AttributeError(f"module 'sandbox' has no attribute {name!r}")
