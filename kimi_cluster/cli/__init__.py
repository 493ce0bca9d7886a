"""The `kimi-cluster` command's doors: argparse and `main` over the library (kimi_cluster.cli.main dispatches)."""
