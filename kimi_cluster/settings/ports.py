"""The port map: the ports the program itself uses on the nodes, which no key may take.

The inference API, the engine and the peers' ports are keys (model.py checks them against this map, cross_rules.py an
engine's ports above its own); these are fixed, and the plan renders them into the engines' command lines and the
front's programs.
"""

# Ports the program itself uses on the nodes; the inference API may not take one of them.
SSH_PORT = 22
DIST_INIT_PORT = 20000  # SGLang's multi-node rendezvous (--dist-init-addr head:20000)
# The kernel warm-up's own (kimi_cluster/plan/warmup.py): its rendezvous, and its engine on the node's loopback with the
# two TokenSpeed's launcher takes above it. Apart from the launch's, so nothing reaches the warm-up by mistake.
WARMUP_DIST_INIT_PORT = 20050
WARMUP_ENGINE_PORT = 20060
# The front's resuming layer and vLLM's render server beside it (kimi_cluster/plan/resume.py), on its loopback: two
# ports for the render server, as a new one starts on the one the old one does not use.
RESUME_PORT = 20080
RENDER_PORTS = (20081, 20082)
RESERVED_PORTS = {SSH_PORT: "SSH", DIST_INIT_PORT: "SGLang's multi-node rendezvous (--dist-init-addr)",
                  WARMUP_DIST_INIT_PORT: "the kernel warm-up's rendezvous",
                  **{WARMUP_ENGINE_PORT + i: "the kernel warm-up's engine" for i in range(3)},
                  RESUME_PORT: "the front's resuming layer",
                  **{port: "the front's render server" for port in RENDER_PORTS}}
# Below it, only root may listen (Linux's default net.ipv4.ip_unprivileged_port_start).
UNPRIVILEGED_PORT_MIN = 1024
