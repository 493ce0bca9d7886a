"""A local engine for Pulumi programs, which the name `sandbox` hides: it runs a Pulumi Python program's `up` and
`destroy` on one machine, without the Pulumi CLI or a backend, keeping its state in a `state.json` of its own.
`scripts/sandbox.py` uses it to deploy this project against the fakes.

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
