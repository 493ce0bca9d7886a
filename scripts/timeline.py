"""Old door, kept for one release from the checkout: `python -m scripts.timeline` is now `kimi-cluster timeline`."""

import sys

from kimi_cluster.cli.main import old_door

if __name__ == "__main__":
    sys.exit(old_door("timeline"))
