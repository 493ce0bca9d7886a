"""Old door, kept for one release from the checkout: `python -m scripts.plan` is now `kimi-cluster plan`."""

import sys

from kimi_cluster.cli.main import old_door

if __name__ == "__main__":
    sys.exit(old_door("plan"))
