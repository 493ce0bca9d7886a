"""Old door, kept for one release from the checkout: `python -m scripts.sandbox` is now `kimi-cluster sandbox`."""

import sys

from kimi_cluster.cli.main import old_door

if __name__ == "__main__":
    sys.exit(old_door("sandbox"))
