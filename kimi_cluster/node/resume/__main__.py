"""`python3 -m kimi_cluster.node.resume`: the front's resuming layer (server.py)."""

import sys

from kimi_cluster.node.resume.server import main

sys.exit(main())
