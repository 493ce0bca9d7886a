"""The node steps: one table (table.py), resolved once per stack into plain per-VM plans (resolve.py), rendered by
one pure function (render.py). kimi_cluster/deploy/chain.py turns a plan into Pulumi resources."""
