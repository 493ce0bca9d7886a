"""Old door, kept for one release from the checkout: `python -m scripts.status` is now `kimi-cluster status`."""

import sys

from kimi_cluster.cli.main import old_door

if __name__ == "__main__":
    sys.exit(old_door("status"))
