"""The plan as data and as text: what `pulumi up` would build for a stack, its sizing verdict and its cost.

`build_plan` gathers it from the stack's settings (offline, unless a Hyperstack API key is set: then the cost comes
from the live pricebook), `format_plan` prints it, `render_scripts` writes every VM's rendered step scripts.
`kimi-cluster plan` is the command that shows it.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

from kimi_cluster.blueprint import blueprint
from kimi_cluster.blueprint.inputs import endpoint_inputs, engine_inputs, firewall_inputs, resume_inputs
from kimi_cluster.blueprint.pricing import Quote, break_even, catalog_quote, quote
from kimi_cluster.hyperstack_api.api import API_KEY_CONFIG, API_URL_CONFIG
from kimi_cluster.operator.caretaker_report import format_guards, guards
from kimi_cluster.plan import resume
from kimi_cluster.plan.firewall import node_rules
from kimi_cluster.plan.kernel_cache import cache_key
from kimi_cluster.plan.steps.clocks import deadline_s
from kimi_cluster.plan.steps.model import VmSpot
from kimi_cluster.plan.steps.table import NAMES
from kimi_cluster.settings import SECRET_KEYS, Settings, catalog, sizing
from kimi_cluster.settings.loader import placeholders


def _head_ip_placeholder(rank: int) -> str:
    return f"<node{rank}-private-ip>"


def _quote(settings: Settings, other_config: dict[str, Any]) -> Quote:
    config = {k: other_config[k] for k in (API_KEY_CONFIG, API_URL_CONFIG) if isinstance(other_config.get(k), str)}
    if API_KEY_CONFIG in other_config and API_KEY_CONFIG not in config and not os.environ.get("HYPERSTACK_API_KEY"):
        return catalog_quote(settings, f"{API_KEY_CONFIG} is encrypted in the stack file; export "
                                       "HYPERSTACK_API_KEY for live prices")
    return quote(settings, config)


def build_plan(settings: Settings, other_config: dict[str, Any], source: str,
               price_quote: Quote | None = None) -> dict[str, Any]:
    """Everything the plan prints, as data (the --json form)."""
    from kimi_cluster.plan import launch, proxy

    price_quote = price_quote or _quote(settings, other_config)

    fit = settings.fit
    price = settings.price
    peers = [_head_ip_placeholder(r) for r in range(settings.nodes)]
    secret_state = {f"kimi-cluster:{k}": ("set" if getattr(settings, _secret_flag(k)) else "not set")
                    for k in SECRET_KEYS}
    api_key_set = "hyperstack:apiKey" in other_config or bool(os.environ.get("HYPERSTACK_API_KEY"))
    secret_state["hyperstack:apiKey"] = "set" if api_key_set else "not set (or export HYPERSTACK_API_KEY)"
    from kimi_cluster.operator.bringup import EDGES_ASSUMED, download_minutes
    plan: dict[str, Any] = {
        "stack": settings.stack,
        "source": source,
        "topology": settings.topology,
        "description": settings.preset.description if settings.preset else "custom",
        "region": settings.region,
        "regions": settings.region_choices,
        "environment": settings.env_name,
        "api_url": (other_config.get("hyperstack:apiUrl") or os.environ.get("HYPERSTACK_API_URL")
                    or catalog.DEFAULT_API_URL),
        "keypair": settings.keypair_name or f"{settings.env_name}-key (imported from sshPublicKey)",
        "nodes": [
            {
                "rank": r,
                "name": settings.node_name(r),
                "flavor": settings.flavor_name,
                "os_image": settings.vm_image,
                "role": "head" if r == 0 else "worker",
                "firewall": [rule.describe() for rule in node_rules(firewall_inputs(settings), r, peers)],
                "launch_command": launch.launch_command_text(engine_inputs(settings), r, _head_ip_placeholder(0)),
            }
            for r in range(settings.nodes)
        ],
        "engine": settings.engine_name,
        "container_image": settings.container_image,
        "proxy": {
            "image": settings.proxy_container_image,
            "listens": f"TLS on port {settings.api_port} of the head, from {', '.join(settings.api_cidrs)}",
            "upstream": proxy.upstream(endpoint_inputs(settings)),
            "certificate": f"your tlsCertificate, for {settings.api_hostname}" if settings.tls_certificate else
                           "the stack's own CA signs one for the head's public IP"
                           + (f" and {settings.api_hostname}" if settings.api_hostname else ""),
            "command": proxy.command_text(endpoint_inputs(settings)),
            "config": proxy.render_config(endpoint_inputs(settings)),
        },
        "model": settings.model,
        "model_revision": settings.model_revision,
        "served_model_name": settings.served_name,
        "sizing": {
            "fits": fit.fits,
            "summary": fit.summary(),
            "gpus": fit.total_gpus,
            "tensor_parallel": fit.tensor_parallel,
            "valid_tensor_parallel": list(fit.valid_tp),
            "checkpoint_bytes": fit.checkpoint_bytes,
            "capacity_bytes": fit.capacity_bytes,
            "headroom_bytes": fit.headroom_bytes,
            "headroom_per_gpu_bytes": fit.headroom_per_gpu_bytes,
            "usable_memory_basis": fit.gpu.usable_basis,
        },
        "hourly_cost_usd": price_quote.usd_per_hour,
        "cost": price_quote.to_json() | {"summary": price_quote.summary()},
        "price": None if price is None else {
            "usd_per_gpu_hour": price.usd_per_gpu_hour, "basis": price.basis, "source": price.source,
            "as_of": price.as_of,
        },
        "break_even": _break_even(settings, price_quote),
        "guards": guards(settings, _break_even(settings, price_quote)),
        "engine_layout": _layouts(settings),
        "download_minutes_per_node": download_minutes(settings),
        "download_minutes_every_node_all": list(sizing.download_minutes(settings.model_spec)),
        "download_assumes": EDGES_ASSUMED,
        # Each node step's deadline, enforced on the node (kimi_cluster.deploy.remote_step.remote_command_text).
        "streams": resume.streams(resume_inputs(settings)),
        "step_deadline_minutes": {step: round(deadline_s(step, blueprint(settings, "kimi").steps.timing) / 60, 1)
                                  for step in running_steps(settings)},
        "kernel_cache": _kernel_cache(settings),
        "time_to_endpoint": _bringup(settings),
        "secrets": secret_state,
        "license_notes": list(catalog.LICENSE_NOTES),
        "warnings": settings.warnings(),
        "placeholders": placeholders(settings),
    }
    if settings.has_front:
        plan["replicas"] = _replicas(settings)
        plan["proxy"].update(
            listens=f"TLS on port {settings.api_port} of the front {settings.front_name}, from "
                    f"{', '.join(settings.api_cidrs)}",
            upstream=", ".join(plan["replicas"]["front"]["upstreams"]), config=plan["replicas"]["front"]["config"],
            certificate="your tlsCertificate" if settings.tls_certificate else
                        "the stack's own CA signs one for the front's public IP")
        for n in plan["nodes"]:  # replica 0's rules: behind the front, its head opens the engine port, not the API
            n["firewall"] = plan["replicas"]["groups"][0]["nodes"][n["rank"]]["firewall"]
    return plan


def _replicas(settings: Settings) -> dict[str, Any]:
    """replicas >= 2: every replica's nodes and rules, the front (flavor, price, rules, Caddyfile)."""
    from kimi_cluster.plan import front_config
    from kimi_cluster.plan.firewall import replica_node_rules

    heads = [f"<replica{r}-head-private-ip>" for r in range(settings.replicas)]
    groups = []
    for r in range(settings.replicas):
        peers = [f"<replica{r}-node{n}-private-ip>" for n in range(settings.nodes)]
        groups.append({"replica": r, "nodes": [
            {"rank": n, "name": settings.replica_node_name(r, n),
             "firewall": [r.describe() for r in replica_node_rules(firewall_inputs(settings), n, peers,
                                                                  "<front-private-ip>")]}
            for n in range(settings.nodes)]})
    return {
        "count": settings.replicas,
        "groups": groups,
        "front": {"name": settings.front_name, "flavor": settings.front_flavor, "os_image": settings.front_vm_image,
                  "usd_per_hour": settings.front_usd_per_hour,
                  "firewall": [rule.describe() for rule in front_config.front_rules(firewall_inputs(settings))],
                  "upstreams": front_config.upstreams(endpoint_inputs(settings), heads),
                  "config": front_config.caddyfile(endpoint_inputs(settings), heads)},
        "rolling": "replica k+1 launches only after replica k's engine serves again (engine-ready)",
        # A lost replica comes back through the same chain as a first bring-up of one replica (the phases above);
        # its weights come from the hub again: the fan-out shares files only within a replica.
        "recovery": {"seconds": _bringup(settings)["this_stack"],
                     "phases": "as 'Time to a verified endpoint' below, for one replica",
                     "weights_from": "the hub (sharded within the replica; the surviving replica's disks are not used "
                                     "yet)",
                     "meanwhile": f"the front serves from the other {settings.replicas - 1} replica(s)"},
    }


def _layouts(settings: Settings) -> dict[str, Any] | None:
    """vLLM's layouts on one node (kimi-cluster:engineLayout): the chosen one, and what each trades, with sources."""
    if settings.layout is None:
        return None
    return {
        "chosen": settings.layout.name,
        "client_context_window": settings.client_context_window,
        "layouts": [{"name": lay.name, "description": lay.description, "trades": lay.trades, "source": lay.source,
                     "kv_cache_tokens": lay.kv_cache_tokens, "context_window": lay.context_window}
                    for lay in catalog.VLLM_LAYOUTS.values()],
    }


def _break_even(settings: Settings, price_quote: Quote) -> dict[str, Any] | None:
    """The sustained output rate at which this cluster costs what the API charges (kimi_cluster/plan/pricing.py)."""
    point = break_even(price_quote.usd_per_hour, settings.api_price, settings.token_mix)
    return None if point is None else point.to_json()


def _kernel_cache(settings: Settings) -> dict[str, Any] | None:
    """Where the compiled kernels are kept and under which key (kimi_cluster/plan/kernel_cache.py), if anywhere."""
    if settings.kernel_cache is None:
        return None
    key = cache_key(engine_inputs(settings))
    return {"location": settings.kernel_cache.location, "key": key.id, "fields": key.fields}


def _bringup(settings: Settings) -> dict[str, Any]:
    """The modelled time to a verified endpoint (kimi_cluster/operator/bringup.py): phases, rates, sources, totals."""
    from kimi_cluster.operator import bringup

    rows = bringup.phases(settings, sharded=True, kernel_cache=False)
    naive = bringup.phases(settings, sharded=False)[2]
    cached = bringup.phases(settings, sharded=True, kernel_cache=True)[5]
    # Which warm-up row is this stack's: restored only with kimi-cluster:kernelCache (and from the second bring-up
    # with the same key on); without it, every bring-up compiles from scratch.
    kept = settings.kernel_cache is not None
    rows[5] = replace(rows[5], on_path=not kept, assumes=rows[5].assumes + (
        " (this stack: only the first bring-up with a cache key)" if kept else " (this stack: every bring-up)"))
    cached = replace(cached, on_path=kept, assumes=cached.assumes + (
        f" (this stack: kept in {settings.kernel_cache.location})" if settings.kernel_cache is not None
        else " (needs kimi-cluster:kernelCache)"))
    table = [rows[0], rows[1]] + ([naive] if settings.nodes > 1 else []) + [rows[2], rows[3], rows[4], rows[5],
                                                                               cached, rows[6]]
    if settings.kernel_warmup:
        # kimi-cluster:kernelWarmup: the first bring-up's kernels come from the warm-up beside the download, and
        # the launch's own warm-up reads them; its row stands beside the plain pull.
        warmed = bringup.phases(settings, sharded=True, warmup_beside=True)
        table.insert(2, replace(warmed[1], assumes=warmed[1].assumes + " (this stack: the first bring-up)"))
        table[table.index(rows[5])] = replace(rows[5], on_path=False, assumes=rows[5].assumes.replace(
            "(this stack: every bring-up)", "(this stack: only without the warm-up, or if it failed)"))
        table[table.index(cached)] = replace(cached, on_path=True, assumes=cached.assumes.replace(
            "(needs kimi-cluster:kernelCache)", "(this stack: what the warm-up from shapes compiled)"))
        table[table.index(rows[1])] = replace(rows[1], on_path=False)
    return {
        "phases": [{"phase": p.name, "low_s": round(p.low_s), "high_s": round(p.high_s), "assumes": p.assumes,
                    "source": p.source, "on_critical_path": p.on_path} for p in table],
        "totals": {k: [round(lo), round(hi)] for k, (lo, hi) in bringup.scenarios(settings).items()},
        # What this stack gets, first and later bring-ups: sharded weights on several nodes; the first one's kernels
        # warmed beside the download with kimi-cluster:kernelWarmup; later ones' restored with kimi-cluster:kernelCache.
        "this_stack": [round(t) for t in bringup.total_s(bringup.phases(
            settings, sharded=True, warmup_beside=settings.kernel_warmup))],
        "this_stack_later": [round(t) for t in bringup.total_s(bringup.phases(
            settings, sharded=True, kernel_cache=settings.kernel_cache is not None,
            warmup_beside=settings.kernel_warmup))],
        "kernel_cache": settings.kernel_cache is not None,
        "kernel_warmup": settings.kernel_warmup,
        "formula": ("T_vm + max(T_image + T_warmup_from_shapes, T_weights) + T_check + T_load + T_warmup_cached + "
                    "T_ready" if settings.kernel_warmup
                    else "T_vm + max(T_image, T_weights) + T_check + T_load + T_warmup + T_ready"),
    }


def format_bringup(b: dict[str, Any]) -> list[str]:
    from kimi_cluster.operator.bringup import fmt_minutes

    lines = ["Time to a verified endpoint (modelled; " + b["formula"] + ")"]
    lines.append(f"  {'phase':<48} {'time':>14}  assumes")
    for p in b["phases"]:
        lines.append(f"  {p['phase']:<48} {fmt_minutes(p['low_s'], p['high_s']):>14}  {p['assumes']}")
        lines.append(f"  {'':<48} {'':>14}  source: {p['source']}")
    for name, (lo, hi) in b["totals"].items():
        lines.append(f"  {'total, ' + name:<48} {fmt_minutes(lo, hi):>14}")
    first = ("kernels warmed beside the download" if b.get("kernel_warmup")
             else "kernels cold: set kimi-cluster:kernelWarmup to compile them beside the download")
    later = ("kernels from the kept cache" if b["kernel_cache"]
             else first if b.get("kernel_warmup") else "kernels cold: set kimi-cluster:kernelCache to keep them")
    lines.append(f"  {'this stack, first bring-up':<48} {fmt_minutes(*b['this_stack']):>14}  ({first})")
    lines.append(f"  {'this stack, later bring-ups':<48} "
                 f"{fmt_minutes(*b.get('this_stack_later', b['this_stack'])):>14}  ({later})")
    return lines


def format_layouts(lay: dict[str, Any] | None) -> list[str]:
    if lay is None:
        return []
    lines = ["", f"Layout       {lay['chosen']} (kimi-cluster:engineLayout; client configs get a context window of "
                 f"{lay['client_context_window']:,} tokens unless kimi-cluster:contextWindow is set)"]
    for row in lay["layouts"]:
        mark = "*" if row["name"] == lay["chosen"] else " "
        lines.append(f"  {mark} {row['name']:<9} {row['description']}")
        lines.append(f"    {'':<9} trades: {row['trades']}")
        lines.append(f"    {'':<9} source: {row['source']}")
    return lines


def format_break_even(b: dict[str, Any] | None) -> list[str]:
    if b is None:
        return ["Break-even  unknown: the cluster's hourly cost is unknown (set kimi-cluster:gpuHourlyPriceUsd)"]
    api = b["api"]
    return [
        f"Break-even   {b['summary']}",
        f"             API: {api['name']}, ${api['usd_per_m_input']:.2f} per 1M input and "
        f"${api['usd_per_m_output']:.2f} per 1M output tokens ({api['source']}; as of {api['as_of']}; "
        "kimi-cluster:apiInputPriceUsdPerM, apiOutputPriceUsdPerM)",
        f"             assumes {b['input_tokens_per_output_token']:g} input tokens per output token "
        f"({b['mix_source']}; kimi-cluster:inputTokensPerOutputToken)",
    ]


def _secret_flag(key: str) -> str:
    return {"hfToken": "hf_token_set", "sshPrivateKey": "ssh_private_key_set",
            "kernelCacheCredentials": "kernel_cache_credentials_set",
            "tlsPrivateKey": "tls_private_key_set", "caretakerApiKey": "caretaker_api_key_set"}[key]


def format_plan(plan: dict[str, Any]) -> str:
    lines = [f"kimi-cluster plan for stack '{plan['stack']}' ({plan['source']})", ""]
    lines.append(f"Cluster      {plan['topology']}: {plan['description']}")
    if len(plan["regions"]) > 1:
        where = f"first with stock of {', '.join(plan['regions'])} (chosen at the first up, then kept)"
    else:
        where = plan["regions"][0]
    lines.append(f"Region       {where}, environment {plan['environment']}, API {plan['api_url']}")
    lines.append(f"Keypair      {plan['keypair']}")
    where = ("each replica head's private address, open to the front alone" if "replicas" in plan
             else "the head's loopback")
    lines.append(f"Engine       {plan['engine']} in {plan['container_image']}, on {where} "
                 f"({plan['proxy']['upstream']}), no API key")
    lines.append(f"Proxy        {plan['proxy']['image']}: {plan['proxy']['listens']}; certificate: "
                 f"{plan['proxy']['certificate']}")
    lines.append(f"Model        {plan['model']} @ {plan['model_revision']} (served as {plan['served_model_name']})")
    st = plan["streams"]
    lines.append(f"Streams      {'resume' if st['resume'] else 'do not resume'} when their replica is lost "
                 f"({st['engine']}): {st['why']}")
    lines.append("")
    lines.append(f"Nodes ({len(plan['nodes'])})")
    for n in plan["nodes"]:
        lines.append(f"  {n['name']}  {n['flavor']}  {n['role']}  image \"{n['os_image']}\"")
        for rule in n["firewall"]:
            lines.append(f"      firewall: {rule}")
    lines.append("")
    s = plan["sizing"]
    lines.append("Sizing")
    lines.append(f"  {s['summary']}")
    lines.append(f"  tensor parallel {s['tensor_parallel']} (valid: {', '.join(map(str, s['valid_tensor_parallel']))})")
    lines.append(f"  usable memory per GPU: {s['usable_memory_basis']}")
    lines.extend(format_layouts(plan["engine_layout"]))
    lines.append("")
    if "replicas" in plan:
        rp = plan["replicas"]
        lines.append(f"Replicas     {rp['count']}, each a whole engine group as above; {rp['rolling']}")
        lines.append(f"  front {rp['front']['name']}  {rp['front']['flavor']}  image \"{rp['front']['os_image']}\"  "
                     f"-> {', '.join(rp['front']['upstreams'])}")
        lines.extend(f"      firewall: {rule}" for rule in rp["front"]["firewall"])
        from kimi_cluster.operator.bringup import fmt_minutes

        rc = rp["recovery"]
        lines.append(f"  a lost replica is back in about {fmt_minutes(*rc['seconds'])} (next `pulumi up`; phases "
                     f"{rc['phases']}; weights from {rc['weights_from']}); meanwhile {rc['meanwhile']}")
        for g in rp["groups"][1:]:
            for n in g["nodes"]:
                lines.append(f"  {n['name']}  replica {g['replica']} rank {n['rank']}")
                lines.extend(f"      firewall: {rule}" for rule in n["firewall"])
        lines.append("")
    lines.append(f"Cost         {plan['cost']['summary']}")
    if plan["hourly_cost_usd"] is not None:
        lines.append("             billed per minute until `pulumi destroy`")
    lines.extend(format_break_even(plan["break_even"]))
    lines.extend(format_guards(plan["guards"]))
    lo, hi = plan["download_minutes_per_node"]
    all_lo, all_hi = plan["download_minutes_every_node_all"]
    if len(plan["nodes"]) > 1:
        lines.append(f"Download     about {lo}-{hi} min, every node at once: each takes 1/{len(plan['nodes'])} of the "
                     f"checkpoint from the hub at 1.1-1.8 GiB/s and the rest from its peers ({all_lo}-{all_hi} min "
                     "if each pulled it all)")
    else:
        lines.append(f"Download     about {lo}-{hi} min: the whole checkpoint from the hub at 1.1-1.8 GiB/s")
    lines.append(f"             assumes {plan['download_assumes']}")
    deadlines = ", ".join(f"{step} {minutes:g}" for step, minutes in plan["step_deadline_minutes"].items())
    lines.append(f"Deadlines    per node step, in minutes, enforced on the node: {deadlines} "
                 "(kimi-cluster:stepDeadlineMinutes)")
    kc = plan["kernel_cache"]
    if kc is None:
        lines.append("Kernels      compiled on every bring-up (set kimi-cluster:kernelCache to keep them across "
                     "destroy and up)")
    else:
        flags = " ".join(f"{k} {v}".strip() for k, v in kc["fields"]["kernel_flags"])
        lines.append(f"Kernels      kept in {kc['location']} as key {kc['key']} (image {kc['fields']['image']}, "
                     f"GPU {kc['fields']['gpu']}, {flags})")
    lines.extend(format_bringup(plan["time_to_endpoint"]))
    lines.append("")
    lines.append("Secrets")
    for k, v in plan["secrets"].items():
        lines.append(f"  {k}: {v}")
    lines.append("")
    lines.append("Launch command per rank")
    for n in plan["nodes"]:
        lines.append(f"  rank {n['rank']} ({n['name']}):")
        lines.append("    " + n["launch_command"].replace("\n", "\n    "))
    lines.append("  proxy (front):" if "replicas" in plan else "  proxy (head):")
    lines.append("    " + plan["proxy"]["command"].replace("\n", "\n    "))
    lines.append("")
    lines.append("License (Kimi K3.1-Pro License)")
    lines.extend(f"  - {note}" for note in plan["license_notes"])
    if plan["warnings"] or plan["placeholders"]:
        lines.append("")
        lines.append("Warnings")
        lines.extend(f"  ! {w}" for w in plan["warnings"])
        lines.extend(f"  ! {w} (pulumi up refuses this)" for w in plan["placeholders"])
    return "\n".join(lines)


def running_steps(settings: Settings) -> tuple[str, ...]:
    """Every step that runs on some VM of this stack, in the step table's order."""
    on = {s.step for vm in blueprint(settings, "kimi").vm_plans for s in vm.steps}
    return tuple(step for step in NAMES if step in on)


def placeholder_spots(settings: Settings) -> dict[str, VmSpot]:
    """What the offline plan shows for what only deploy time knows: each VM's addresses by name, the certificate's
    stand-in on the VM that holds the endpoint, every GPU node as a peer when the nodes share the download."""
    bp = blueprint(settings, "kimi")
    vms = bp.vm_plans
    gpu = [vm for vm in vms if vm.kind != "front"]

    def ip(vm_name: str) -> str:
        return f"<{vm_name}-private-ip>"

    peers = [ip(vm.name) for vm in gpu] if bp.fan_out > 1 else None
    # The front's upstreams reach its Caddyfile and the shell unquoted: names of letters, digits and dashes.
    heads = [f"{vm.name}-private-ip" for vm in gpu if vm.rank == 0]
    ids = " ".join(f"{vm.name}-id" for vm in gpu)  # the caretaker's: every GPU VM's id
    spots = {}
    for vm in vms:
        if vm.kind == "front":
            spots[vm.resource] = VmSpot(private_ip=ip(vm.name), public_ip="<front-public-ip>",
                                        front_upstreams=heads, gpu_vm_ids=ids)
            continue
        head = next(h for h in gpu if h.replica == vm.replica and h.rank == 0)
        holds = not settings.has_front and vm.replica == 0 and vm.rank == 0
        spots[vm.resource] = VmSpot(private_ip=ip(vm.name), head_private_ip=ip(head.name),
                                    public_ip="<head-public-ip>" if holds else f"<{vm.name}-public-ip>",
                                    peer_ips=peers, gpu_vm_ids=ids if holds else None,
                                    group_vm_ids=" ".join(f"{g.name}-id" for g in gpu if g.replica == vm.replica))
    return spots


def render_scripts(settings: Settings, out_dir: str, spots: dict[str, VmSpot] | None = None) -> list[str]:
    """Write every VM's scripts (each node of each replica, and the front), one folder per VM by its name, with
    `spots` (default: placeholder_spots); secrets arrive on stdin, so none are in them. These are the scripts the
    program runs for the same spots: both render one blueprint's steps (plan/steps/scripts.py `render_vm_scripts`)."""
    from kimi_cluster.plan.steps.scripts import render_vm_scripts

    spots = placeholder_spots(settings) if spots is None else spots
    written = []
    bp = blueprint(settings, "kimi")
    for vm in bp.vm_plans:
        vm_dir = os.path.join(out_dir, vm.name)
        os.makedirs(vm_dir, exist_ok=True)
        for step, text in render_vm_scripts(bp.steps, vm, spots[vm.resource]).items():
            path = os.path.join(vm_dir, f"{step}.sh")
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(text)
            written.append(path)
    return written
