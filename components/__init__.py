"""The library the kimi-cluster program is built from. `components.__version__` is this checkout's release
(components/release.py), read on first use only: most processes that import a component never ask."""

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from components.release import __version__

        return __version__
    raise AttributeError(f"module 'components' has no attribute {name!r}")
