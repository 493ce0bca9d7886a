"""Old door, kept for one release from the checkout: `python -m scripts.config_reference` is now
`kimi-cluster config-reference`."""

import sys

from kimi_cluster.cli.main import old_door

if __name__ == "__main__":
    sys.exit(old_door("config_reference"))
