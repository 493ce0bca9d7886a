"""Benchmarks: programs that measure the project on the sandbox and the fakes (`python -m benchmarks.bench_...`).

Each one prints its figures (or JSON with --json); none is part of the Pulumi program or of what runs on the nodes,
and no library module imports one.
"""
