"""The rules across keys of the stack config: pure functions of plain values, each returning its problems.

The model's validators (kimi_cluster/settings/model.py) call them with the values they read; each problem names its
keys and how to fix them. The engine flags extraEngineArgs may not set are kimi_cluster/plan/launch.py's rule.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping, Sequence

from kimi_cluster.settings import catalog, tls_check
from kimi_cluster.settings.errors import shown
from kimi_cluster.settings.keys import NAMESPACE
from kimi_cluster.settings.networks import IPV4_MIN_PREFIX, IPV6_MIN_PREFIX, V4_MAPPED, loopback_host, non_public
from kimi_cluster.settings.ports import RESERVED_PORTS, UNPRIVILEGED_PORT_MIN
from kimi_cluster.settings.rules import FLAVOR_GPUS_RE, HF_ENDPOINT_RE, NAME_MAX, NAME_RE


def operator_scope_problem(operator_cidr: str, allow_private: bool) -> str | None:
    net = ipaddress.ip_network(operator_cidr)
    if isinstance(net, ipaddress.IPv6Network) and net.subnet_of(V4_MAPPED):
        return (f"{NAMESPACE}:operatorCidr {operator_cidr} is an IPv4-mapped IPv6 range, which no rule "
                "matches; give the IPv4 address itself, e.g. \"$(curl -4 -s https://ifconfig.me)/32\"")
    kind = non_public(net)
    if kind is None or allow_private:
        return None
    return (f"{NAMESPACE}:operatorCidr {operator_cidr} is {kind}: the VMs see your public address, so this "
            "locks you out while they bill; use \"$(curl -4 -s https://ifconfig.me)/32\", or set "
            f"{NAMESPACE}:allowPrivateOperatorCidr true if you reach the VMs over a private network (a VPN)")


def api_cidr_problems(api_allowed_cidrs: Sequence[str] | None, allow_private: bool) -> list[str]:
    """operatorCidr's address classes for each apiAllowedCidrs entry, and a bound on what the list opens in all:
    two /1s are each refused by no per-entry rule, yet together they are the whole internet."""
    if api_allowed_cidrs is None:
        return []
    key = f"{NAMESPACE}:apiAllowedCidrs"
    problems = []
    nets = [ipaddress.ip_network(c) for c in api_allowed_cidrs]
    for net in nets:
        if isinstance(net, ipaddress.IPv6Network) and net.subnet_of(V4_MAPPED):
            problems.append(f"{key} entry {net} is an IPv4-mapped IPv6 range, which no rule matches: it locks "
                            "every client out; give the IPv4 range itself")
        elif net.prefixlen < (IPV4_MIN_PREFIX if net.version == 4 else IPV6_MIN_PREFIX):
            widest = IPV4_MIN_PREFIX if net.version == 4 else IPV6_MIN_PREFIX
            problems.append(f"{key} entry {net} is wider than /{widest}, as operatorCidr may not be: it opens the "
                            f"API to {net.num_addresses:,} addresses of other networks")
        elif (kind := non_public(net)) and not allow_private:
            problems.append(f"{key} entry {net} is {kind}: clients reach the head from public addresses, so it "
                            f"lets no one in (set {NAMESPACE}:allowPrivateOperatorCidr true for a VPN)")
    # typeshed types collapse_addresses per address family: each family is collapsed apart.
    v4 = [n for n in nets if isinstance(n, ipaddress.IPv4Network)]
    v6 = [n for n in nets if isinstance(n, ipaddress.IPv6Network)]
    collapsed = {4: sum(n.num_addresses for n in ipaddress.collapse_addresses(v4)),
                 6: sum(n.num_addresses for n in ipaddress.collapse_addresses(v6))}
    for version, widest in ((4, IPV4_MIN_PREFIX), (6, IPV6_MIN_PREFIX)):
        opened = collapsed[version]
        # Twice the widest single entry: room for one such network and a few addresses besides.
        limit = 2 * 2 ** ((32 if version == 4 else 128) - widest)
        if opened > limit:
            problems.append(f"{key} opens the API to {opened:,} IPv{version} addresses in all, more than two "
                            f"/{widest}s ({limit:,}): list the networks that need it, not the internet piecewise")
    return problems


def api_hostname_problems(tls_certificate: str | None, api_hostname: str | None) -> list[str]:
    if tls_certificate is None:
        return []
    if api_hostname is None:
        return [f"{NAMESPACE}:tlsCertificate needs {NAMESPACE}:apiHostname, the DNS name it was issued for: the "
                "head's public IP is unknown before the first `up`, so clients and the readiness wait could "
                f"check it against nothing else; set it with: pulumi config set {NAMESPACE}:apiHostname "
                "api.example.com"]
    problem = tls_check.chain_problem(tls_certificate, api_hostname)
    return [f"{NAMESPACE}:tlsCertificate {problem}"] if problem else []


def tokenspeed_problem(engine_name: str, nodes: int, image: str | None, engine_port: int, api_port: int,
                       peer_port: int) -> str | None:
    """TokenSpeed: one node (its multi-node launch is not wired here), an image the user names, and the two
    loopback ports its launcher takes beside enginePort (control server, metrics)."""
    if engine_name != "tokenspeed":
        return None
    if nodes != 1:
        return (f"{NAMESPACE}:engine tokenspeed is supported on one node only ({NAMESPACE}:nodeCount 1); use "
                "sglang across nodes")
    if not image:
        return (f"{NAMESPACE}:image is required with TokenSpeed: its release image "
                f"{catalog.TOKENSPEED_IMAGE_REPO}:{catalog.TOKENSPEED_VERSION} is published without a digest this "
                "project could check, so pin the one you trust (docker buildx imagetools inspect "
                f"{catalog.TOKENSPEED_IMAGE_REPO}:{catalog.TOKENSPEED_VERSION}); set it with: pulumi config set "
                f"{NAMESPACE}:image {catalog.TOKENSPEED_IMAGE_REPO}:{catalog.TOKENSPEED_VERSION}@sha256:<digest>")
    control, metrics = catalog.TOKENSPEED_CONTROL_PORT_OFFSET, catalog.TOKENSPEED_METRICS_PORT_OFFSET
    taken = {engine_port + control: f"TokenSpeed's control server (enginePort + {control})",
             engine_port + metrics: f"TokenSpeed's metrics listener (enginePort + {metrics})"}
    for port in (api_port, peer_port):
        if port in taken:
            return (f"{NAMESPACE}:apiPort or peerPort {port} collides with {taken[port]}; pick another, e.g. "
                    f"{NAMESPACE}:enginePort 30000 with apiPort 8000")
    if engine_port + metrics > 65535:
        return f"{NAMESPACE}:enginePort {engine_port} leaves no room for TokenSpeed's two ports above it"
    # The image's user is not root: it cannot bind below 1024, so the launch would fail after the GPUs bill.
    if engine_port < UNPRIVILEGED_PORT_MIN:
        return (f"{NAMESPACE}:enginePort {engine_port}: TokenSpeed's image runs as a user that is not root, which "
                f"cannot listen below {UNPRIVILEGED_PORT_MIN} (nor its two ports above it); e.g. "
                f"{NAMESPACE}:enginePort 30000")
    for port, what in taken.items():
        if port in RESERVED_PORTS:
            return (f"{NAMESPACE}:enginePort {engine_port} puts {what} on port {port}, {RESERVED_PORTS[port]}'s; "
                    f"pick another, e.g. {NAMESPACE}:enginePort 30000")
    return None


def context_problems(max_model_len: int | None, context_window: int, model: str, positions: int) -> list[str]:
    """maxModelLen (what the engine admits) and contextWindow (what clients are told) within the model's positions
    (catalog.ModelSpec.context_window): past them the engine refuses to start, or clients send what it cuts."""
    out = []
    for key, value in (("maxModelLen", max_model_len), ("contextWindow", context_window)):
        if value is not None and value > positions:
            out.append(f"{NAMESPACE}:{key} {value:,} is more than {model}'s {positions:,} positions; set at most "
                       f"{positions}, e.g. pulumi config set {NAMESPACE}:{key} {positions}")
    return out


def layout_problem(engine_layout: str | None, engine_name: str, nodes: int, gpus_per_node: int) -> str | None:
    if engine_layout is None:
        return None
    layout = catalog.VLLM_LAYOUTS[engine_layout]
    if engine_name != layout.engine or nodes != 1 or gpus_per_node != layout.gpus:
        return (f"{NAMESPACE}:engineLayout {engine_layout} is a layout of vLLM on one node of {layout.gpus} "
                f"GPUs, and this stack runs {engine_name} on {nodes} x {gpus_per_node} "
                f"GPUs; use {NAMESPACE}:topology b300x1-vllm, or remove it with: pulumi config rm "
                f"{NAMESPACE}:engineLayout")
    return None


def flavor_problem(flavor: str | None, gpus_per_node: int | None, gpu_memory_gb: int | None,
                   gpu_name: str) -> str | None:
    """A custom topology's flavor against its GPU keys: the count and model in its name must agree with them."""
    if flavor is None:
        return None
    if flavor in catalog.CPU_FLAVORS or re.search(r"(?:^|-)cpu(?:-|$)", flavor, re.IGNORECASE):
        return (f"{NAMESPACE}:flavor {flavor} is a CPU flavor, with no GPU, but {NAMESPACE}:gpusPerNode is "
                f"{gpus_per_node}: use a GPU flavor such as n3-H100x8 (the sizing guard would size a cluster that is "
                "not there)")
    match = FLAVOR_GPUS_RE.search(flavor)
    if not match:
        return None
    gpu, count = match["gpu"], int(match["count"])
    problems = []
    if count != gpus_per_node:
        problems.append(f"{NAMESPACE}:gpusPerNode is {gpus_per_node}")
    if not gpu_name.startswith(gpu + "-"):
        problems.append(f"{NAMESPACE}:gpuMemoryGb {gpu_memory_gb} means {gpu_name}")
    if not problems:
        return None
    return (f"{NAMESPACE}:flavor {flavor} has {count}x {gpu} per VM, but " + " and ".join(problems) +
            "; make them agree (the sizing guard would size the wrong cluster)")


def hf_endpoint_problem(hf_endpoint: str, hf_token_set: bool) -> str | None:
    match = HF_ENDPOINT_RE.fullmatch(hf_endpoint)
    if match is None or match["scheme"] != "http" or not hf_token_set:
        return None
    host = match["host"].strip("[]")
    if host == "localhost" or loopback_host(host):
        return None  # the node's own loopback: the token never leaves the machine
    return (f"{NAMESPACE}:hfEndpoint {hf_endpoint} would receive hfToken in clear text over http://; use an "
            f"https:// mirror, or unset {NAMESPACE}:hfToken for a mirror that needs none")


def name_problems(env: str, environment_name: str | None, stack: str, longest_node_name: str) -> list[str]:
    """The environment's name and the longest name derived from it (the last node's, or the keypair's)."""
    if not NAME_RE.fullmatch(env):
        return [f"the default environment name {shown(env)} (kimi-<stack>) is not a Hyperstack name; set "
                f"{NAMESPACE}:environmentName to 1-50 letters, digits, '-' or '_'"]
    longest = max((longest_node_name, f"{env}-key"), key=len)
    if len(longest) <= NAME_MAX:
        return []
    room = NAME_MAX - (len(longest) - len(env))
    where = f"{NAMESPACE}:environmentName" if environment_name else f"the stack name {stack!r}"
    return [f"{where} makes the name {longest!r} {len(longest)} characters; Hyperstack allows {NAME_MAX} (cut "
            f"short, every VM name would collide): set {NAMESPACE}:environmentName to at most {room} characters"]


def replica_problems(replicas: int, env: str, longest_vm_name: str) -> list[str]:
    """replicas >= 2: every derived VM name fits (the front's flavor and image have rules of their own: rules.py)."""
    problems = []
    if NAME_RE.fullmatch(env) and len(longest_vm_name) > NAME_MAX:
        room = NAME_MAX - (len(longest_vm_name) - len(env))
        problems.append(f"{NAMESPACE}:replicas {replicas} makes the VM name {longest_vm_name!r} "
                        f"{len(longest_vm_name)} characters; Hyperstack allows {NAME_MAX}: set "
                        f"{NAMESPACE}:environmentName to at most {room} characters")
    return problems


def topology_problem(topology: str, custom_keys: Mapping[str, object], engine: str | None,
                     node_count: int | None) -> str | None:
    """The custom topology's keys (`custom_keys`: config key -> value): all of them for custom, none otherwise."""
    if topology == "custom":
        missing = [k for k, v in custom_keys.items() if v is None]
        if missing:
            return f"{NAMESPACE}:topology custom needs {', '.join(NAMESPACE + ':' + k for k in missing)} as well"
        gpu_memory_gb = custom_keys["gpuMemoryGb"]
        if gpu_memory_gb not in catalog.GPU_BY_MEMORY_GB:
            known = ", ".join(str(k) for k in sorted(catalog.GPU_BY_MEMORY_GB))
            return f"{NAMESPACE}:gpuMemoryGb {gpu_memory_gb} is not a known GPU size; known: {known}"
        if engine == "vllm" and node_count != 1:
            return (f"{NAMESPACE}:engine vllm is supported on one node only ({NAMESPACE}:nodeCount 1); "
                    "use sglang across nodes")
        return None
    given = [k for k, v in custom_keys.items() if v is not None]
    if given:
        return (f"{', '.join(NAMESPACE + ':' + k for k in given)} only apply to topology custom "
                f"({NAMESPACE}:topology is {topology})")
    return None
