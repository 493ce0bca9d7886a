"""0.1.0's `components.hyperstack` package: only the recorded provider modules live on (components/__init__.py)."""
