"""Standalone programs run on the nodes, embedded byte for byte in the node step commands.

kimi_cluster/plan/step_scripts.py renders fetch_weights.py (with weights_files.py and weights_peers.py),
check_download.py
and kernel_cache.py (with kernel_files.py and kernel_store.py) into their steps' quoted heredocs, at their paths in
this repository (shipped()), and kimi_cluster/operator/status_gather.py sends node_status.py on stdin over the stack's
SSH connection. So a changed byte in one of these files changes that step's command and re-runs the step on every
live stack: change them only with a real node-side change. They import nothing of this repository but the modules
shipped beside them (kimi_cluster/node/weights.py, hub_names.py, printable.py); the tests import them from here.
"""
