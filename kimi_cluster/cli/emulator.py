"""Run the Hyperstack API emulator on loopback: `kimi-cluster emulator --port 8700`.

Point the program at it with HYPERSTACK_API_URL=http://127.0.0.1:8700/v1 and HYPERSTACK_API_KEY=<an --api-key>.
"""

from __future__ import annotations

import argparse
import ipaddress
import math
import os
import signal
import sys

from kimi_cluster.fakes.hyperstack_emulator.emulator import DEFAULT_API_KEY, Emulator
from kimi_cluster.fakes.hyperstack_emulator.faults import Fault, RateLimit, StuckInBuild, VmError
from kimi_cluster.fakes.hyperstack_emulator.state import Lifecycle
from kimi_cluster.fakes.node_fabric import Fabric, FabricConfig, missing

FIRST_IP = "127.0.0.2"
# Test-only faults, armed at start because the emulator then runs in another process than the test.
FAULTS = {"vm-error": VmError, "stuck-in-build": StuckInBuild}


def parse_fault(spec: str) -> Fault:
    """`vm-error` (the next VM created) or `vm-error:NAME` (the VM of that name); likewise `stuck-in-build`;
    `rate-limit:COUNT[:METHOD:PATH]`: the next COUNT requests (matching METHOD and the PATH glob after /v1) get 429.
    """
    kind, _, name = spec.partition(":")
    if kind == "rate-limit":
        count, _, where = name.partition(":")
        method, _, path = where.partition(":")
        if not count.isdigit() or int(count) < 1 or (where and not (method and path)):
            raise argparse.ArgumentTypeError(f"--fault {spec!r}: rate-limit:COUNT[:METHOD:PATH], COUNT a whole "
                                             "number of requests, e.g. rate-limit:6:POST:/core/virtual-machines")
        return RateLimit(int(count), method.upper() or None, path or None)
    if kind not in FAULTS:
        raise argparse.ArgumentTypeError(f"unknown fault {kind!r}; known: {', '.join(FAULTS)} (optionally :VM_NAME)")
    return FAULTS[kind](name=name or None)


def _port(text: str) -> int:
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port (0-65535)")
    return int(text)


def _seconds(text: str, positive: bool = False) -> float:
    """A finite number of seconds, 0 or more (above 0 for a minute's length, which the bill divides by), a day at
    most."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and (value > 0 if positive else value >= 0) and value <= 86400):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds {'above' if positive else 'from'} 0 "
                                         "and at most a day (86400)")
    return value


def _ipv4(text: str) -> str:
    """The emulator hands out addresses counting up from this one (IPv4, as Hyperstack's are)."""
    try:
        return str(ipaddress.IPv4Address(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an IPv4 address such as 127.0.0.2") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kimi-cluster emulator", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=_port, default=8700, help="TCP port, 0 for any free one (default 8700)")
    parser.add_argument("--api-key", action="append", dest="api_keys",
                        help=f"accepted key (repeatable; default: $HYPERSTACK_API_KEY or {DEFAULT_API_KEY})")
    parser.add_argument("--creating-seconds", type=_seconds, default=1.0, help="time in CREATING")
    parser.add_argument("--build-seconds", type=_seconds, default=3.0, help="time in BUILD")
    parser.add_argument("--floating-ip-seconds", type=_seconds, default=1.0, help="time the floating IP is ATTACHING")
    parser.add_argument("--deleting-seconds", type=_seconds, default=1.0, help="time a deleted VM stays DELETING")
    parser.add_argument("--also-host", action="append", default=[], metavar="ADDRESS",
                        help="answer on this address of the machine too, on the same port (repeatable; the sandbox: "
                             "its fabric's bridge, where a caretaker on a fake node dials the API)")
    parser.add_argument("--billing-minute-seconds", type=lambda t: _seconds(t, positive=True), default=60.0,
                        help="length of the billed minute in seconds (default 60; the sandbox bills faster)")
    parser.add_argument("--first-ip", type=_ipv4, default=FIRST_IP, help="first address handed to VMs")
    parser.add_argument("--first-floating-ip", type=_ipv4, default=None,
                        help="separate pool for floating IPs (default: a VM's fixed_ip is also its floating_ip)")
    parser.add_argument("--vm-names-unique", action="store_true", help="answer 409 to a duplicate VM name")
    parser.add_argument("--fault", action="append", default=[], type=parse_fault, metavar="KIND[:VM_NAME]",
                        help="TEST ONLY: arm a fault at start (repeatable): " + ", ".join(FAULTS) +
                             "; rate-limit:COUNT[:METHOD:PATH]")
    parser.add_argument("--capacity", action="append", default=[], metavar="REGION:FLAVOR=VMS",
                        help="VMs of FLAVOR that REGION holds in all (repeatable; default 16 per GPU flavor)")
    parser.add_argument("--node-fabric", metavar="CONFIG",
                        help="boot each VM as a fake node with sshd in a network namespace, at the addresses of "
                             "this fabric (kimi_cluster/fakes/node_fabric.py; its JSON file; needs root). "
                             "Default: no nodes")
    parser.add_argument("--admin", action="store_true",
                        help="TEST ONLY: serve GET /_emulator/inventory and /_emulator/requests (outside /v1)")
    args = parser.parse_args(argv)

    keys = tuple(args.api_keys or [os.environ.get("HYPERSTACK_API_KEY") or DEFAULT_API_KEY])
    nodes = None
    if args.node_fabric:
        try:
            nodes = Fabric(FabricConfig.load(args.node_fabric))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            parser.error(f"--node-fabric {args.node_fabric}: {str(err)[:300] or type(err).__name__}")
        except RecursionError:
            parser.error(f"--node-fabric {args.node_fabric}: nested deeper than any fabric's JSON")
        if needs := missing():
            parser.error("--node-fabric needs " + "; ".join(needs))
        if args.first_ip == FIRST_IP:  # the fabric's addresses, unless asked otherwise
            args.first_ip = nodes.config.first_node_address
    emulator = Emulator(
        host=args.host, port=args.port, api_keys=keys,
        lifecycle=Lifecycle(args.creating_seconds, args.build_seconds, args.floating_ip_seconds,
                            args.deleting_seconds),
        first_ip=args.first_ip, first_floating_ip=args.first_floating_ip, vm_names_unique=args.vm_names_unique,
        admin=args.admin, nodes=nodes, billing_minute_seconds=args.billing_minute_seconds,
        extra_hosts=tuple(args.also_host),
    )
    emulator.inject(*args.fault)
    for spec in args.capacity:
        where, _, vms = spec.partition("=")
        region, _, flavor = where.partition(":")
        if not (region and flavor and vms.isdigit()):
            parser.error(f"--capacity expects REGION:FLAVOR=VMS, got {spec!r}")
        emulator.set_capacity(flavor, int(vms), region=region)
    # A process started in the background by a non-interactive shell inherits SIGINT ignored, and Python then keeps
    # it ignored: Ctrl-C and `kill -INT` (how the sandbox's services and the tests stop it) must still end it.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        emulator.start()
    except OSError as err:  # busy port, an address not on this machine, a privileged port
        print(f"error: cannot listen on {args.host}:{args.port}: {err.strerror or err}", file=sys.stderr)
        return 2
    # Never print the key itself: say where it came from.
    source = "--api-key" if args.api_keys else ("$HYPERSTACK_API_KEY" if os.environ.get("HYPERSTACK_API_KEY")
                                                 else f"the default key {DEFAULT_API_KEY!r}")
    try:  # a Ctrl-C right after the banner, before serving began, still ends with exit 0
        print(f"Hyperstack emulator on {emulator.base_url} (accepting {source}); Ctrl-C stops it", flush=True)
        emulator.run_until_interrupted()
    except KeyboardInterrupt:
        emulator.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
