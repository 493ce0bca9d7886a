"""Old door, kept for one release from the checkout: `python -m scripts.verify_endpoint` is now
`kimi-cluster verify`."""

import sys

from kimi_cluster.cli.main import old_door

if __name__ == "__main__":
    sys.exit(old_door("verify_endpoint"))
