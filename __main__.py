"""The Pulumi program (the CLI runs this file): kimi_cluster/deploy/program.py."""

from kimi_cluster.deploy.program import main

main()
