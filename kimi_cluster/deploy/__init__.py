"""The deployment: the Pulumi graph (cluster, replicas, front, node chains, remote steps) and the Hyperstack
dynamic providers (hyperstack/), with the program that `pulumi up` runs (program.py).
"""
