"""kimi-cluster: Kimi K3.1 Pro on Hyperstack GPU VMs with one `pulumi up`.

Rooms, from the ground up (each imports only from the rooms below it): node (the programs shipped to the VMs),
hyperstack (the API client), settings, plan (pure), deploy (the Pulumi graph and the Hyperstack providers), checks
(the endpoint checks and the verification stack), operator (plan, status and timeline as a library), fakes and
sandbox (the local stand-ins), cli (the `kimi-cluster` command).

Kept free of imports: the node programs ship with an empty copy of this file, and every door imports only what it
needs.
"""

from typing import Any


def __getattr__(name: str) -> Any:
    """`kimi_cluster.__version__`, this checkout's release (kimi_cluster/release.py), read on first use only."""
    if name == "__version__":
        from kimi_cluster.release import __version__

        return __version__
    raise AttributeError(f"module 'kimi_cluster' has no attribute {name!r}")
